//! MINC2 inputs (`.mnc`): HDF5 files whose image is the dataset
//! `/minc-2.0/image/0/image`, the format BigBrain's blocks ship in.
//!
//! The voxels are read like any HDF5 dataset (see [`super::hdf5`]); this
//! module learns what NIfTI outputs need besides: the image's dimension
//! order (its `dimorder` attribute, e.g. `zspace,yspace,xspace`), each
//! dimension variable's `step`, `start` and `direction_cosines` under
//! `/minc-2.0/dimensions/`, and the `image-min`/`image-max` scaling. The
//! affine is computed as nibabel's MINC2 reader computes it, then reordered
//! to NIfTI's voxel order, so nibabel sees every voxel at the same world
//! position in the MINC2 input and in the NIfTI blocks made from it.
//! By default rechunkfs moves the stored voxels: a single global scaling
//! becomes NIfTI's `scl_slope`/`scl_inter`; a scaling that varies per slice
//! cannot be said in NIfTI, and is recorded as a reason to refuse NIfTI
//! output. The `scaled` module computes the physical values instead (`--values
//! scaled`), as an encoded input.

use std::path::Path;

use ::hdf5::sync::sync;

mod attrs;
mod scaled;

pub use attrs::IMAGE;
use attrs::{library_error, numbers_attr, string_attr};
pub use scaled::{scaled_decoder, scaled_dtype, value_scaling, ValueScaling};

use super::block::{read_head, BlockInfo};
use super::traits::{Dataset, FormatTraits};
use crate::array::dtype::{DType, Kind};
use crate::array::space::{Space, UNITS_MM};
use crate::error::{Error, Result};

const DIMENSIONS: &str = "/minc-2.0/dimensions";

/// Learn a MINC2 file's image shape (C order, as its `dimorder` lists the
/// dimensions), dtype and storage.
pub fn probe(path: &Path) -> Result<BlockInfo> {
    refuse_minc1(path)?;
    super::hdf5::probe(path, IMAGE)
}

/// MINC1 files are netCDF (`CDF\x01` or `CDF\x02`), not HDF5: say what
/// they are and how to convert them, rather than that they are not HDF5.
fn refuse_minc1(path: &Path) -> Result<()> {
    let (_, _, head) = read_head(path, "MINC2", 4)?;
    if head.starts_with(b"CDF\x01") || head.starts_with(b"CDF\x02") {
        return Err(Error::bad_input(
            path,
            "is a MINC1 (netCDF) file; rechunkfs reads MINC2, which is HDF5: convert it with \
             minc-tools' `mincconvert -2 IN.mnc OUT.mnc`",
        ));
    }
    Ok(())
}

/// What one MINC2 dimension variable says.
struct Dimension {
    name: String,
    step: f64,
    start: f64,
    cosines: [f64; 3],
    irregular: bool,
}

fn default_cosines(name: &str) -> [f64; 3] {
    match name {
        "xspace" => [1.0, 0.0, 0.0],
        "yspace" => [0.0, 1.0, 0.0],
        _ => [0.0, 0.0, 1.0],
    }
}

fn read_dimension(file: &::hdf5::File, name: &str) -> ::hdf5::Result<Dimension> {
    let path = format!("{DIMENSIONS}/{name}");
    let mut dimension = Dimension {
        name: name.to_owned(),
        step: 1.0,
        start: 0.0,
        cosines: default_cosines(name),
        irregular: false,
    };
    // Dimension variables are datasets in files libminc writes, but a
    // group carries attributes just as well; absent, nibabel's defaults hold.
    if let Ok(dataset) = file.dataset(&path) {
        fill_dimension(&dataset, &mut dimension)?;
    } else if let Ok(group) = file.group(&path) {
        fill_dimension(&group, &mut dimension)?;
    }
    Ok(dimension)
}

fn fill_dimension(location: &::hdf5::Location, dimension: &mut Dimension) -> ::hdf5::Result<()> {
    if let Some(step) = numbers_attr(location, "step")?.and_then(|v| v.first().copied()) {
        dimension.step = step;
    }
    if let Some(start) = numbers_attr(location, "start")?.and_then(|v| v.first().copied()) {
        dimension.start = start;
    }
    if let Some(cosines) = numbers_attr(location, "direction_cosines")? {
        if let [x, y, z] = cosines[..] {
            dimension.cosines = [x, y, z];
        }
    }
    dimension.irregular = string_attr(location, "spacing")?.as_deref() == Some("irregular");
    Ok(())
}

/// Learn the world space of the MINC2 file at `path`, whose image has
/// `ndim` dimensions of `dtype`, with the scaling its `image-min` and
/// `image-max` imply. Anything NIfTI cannot say is recorded in
/// [`Space::nifti_refusal`], not refused here: HDF5 output needs none of it.
pub fn probe_space(path: &Path, ndim: usize, dtype: DType) -> Result<Space> {
    sync(|| {
        let file = ::hdf5::File::with_options()
            .with_fapl(|fapl| fapl.sieve_buf_size(0))
            .open(path)
            .map_err(|e| library_error(path, "the file", e))?;
        let image = file
            .dataset(IMAGE)
            .map_err(|e| library_error(path, IMAGE, e))?;
        let dimorder = string_attr(&image, "dimorder")
            .map_err(|e| library_error(path, "the image's dimorder", e))?;
        let mut space = Space::identity(ndim);
        space.xyzt_units = UNITS_MM;
        let Some(dimorder) = dimorder else {
            space.nifti_refusal = Some(format!(
                "{}: its image has no dimorder attribute, so where its voxels are in the world \
                 is unknown",
                path.display()
            ));
            return Ok(space);
        };
        let names: Vec<&str> = dimorder.split(',').map(str::trim).take(ndim).collect();
        let mut dimensions = Vec::with_capacity(names.len());
        for name in &names {
            dimensions.push(
                read_dimension(&file, name)
                    .map_err(|e| library_error(path, &format!("dimension {name}"), e))?,
            );
        }
        let mut refusal = place_axes(&mut space, &dimensions, &dimorder, ndim);
        if dtype.kind != Kind::Float {
            if let Some(problem) = read_scaling(&mut space, &file, path, dtype)? {
                refusal = Some(problem);
            }
        }
        space.nifti_refusal = refusal.map(|problem| format!("{}: {problem}", path.display()));
        Ok(space)
    })
}

/// Sets the affine and voxel sizes of `space` from the `dimensions` the
/// image's `dimorder` names; returns what NIfTI could not say of them.
fn place_axes(
    space: &mut Space,
    dimensions: &[Dimension],
    dimorder: &str,
    ndim: usize,
) -> Option<String> {
    let mut refusal = None;
    if dimensions.len() != ndim {
        refusal = Some(format!(
            "its dimorder '{dimorder}' names {} dimensions but the image has {ndim}",
            dimensions.len()
        ));
    }
    for nifti_axis in 0..3 {
        let Some(c_axis) = ndim.checked_sub(nifti_axis + 1) else {
            refusal.get_or_insert_with(|| {
                format!(
                    "its image has {ndim} dimensions; NIfTI output of MINC2 needs the three \
                     spatial dimensions"
                )
            });
            break;
        };
        let Some(dimension) = dimensions.get(c_axis) else {
            continue;
        };
        if let Some(problem) = place_column(space, nifti_axis, dimension, dimorder) {
            refusal.get_or_insert(problem);
        }
    }
    let origin = world_origin(dimensions);
    for (row, values) in space.affine.iter_mut().enumerate() {
        values[3] = origin[row];
    }
    for (nifti_axis, zoom) in space.zooms.iter_mut().enumerate() {
        if let Some(dimension) = dimensions.get(ndim - 1 - nifti_axis) {
            *zoom = dimension.step.abs();
        }
    }
    refusal
}

/// nibabel's MINC affine: the column of each spatial dimension is its
/// direction cosines times its step. Sets that column of `space` for NIfTI
/// axis `nifti_axis`, unless `dimension` is not spatial; returns what NIfTI
/// cannot say of it.
fn place_column(
    space: &mut Space,
    nifti_axis: usize,
    dimension: &Dimension,
    dimorder: &str,
) -> Option<String> {
    if !dimension.name.ends_with("space") {
        return Some(format!(
            "its dimension order '{dimorder}' does not end in three spatial dimensions, which \
             NIfTI needs as its fastest three axes"
        ));
    }
    for (row, values) in space.affine.iter_mut().enumerate() {
        values[nifti_axis] = dimension.cosines[row] * dimension.step;
    }
    dimension.irregular.then(|| {
        format!(
            "its dimension {} has irregular spacing, which an affine cannot express",
            dimension.name
        )
    })
}

/// The world position of the first voxel: the direction cosines of the
/// spatial dimensions applied to their starts.
fn world_origin(dimensions: &[Dimension]) -> [f64; 3] {
    let mut origin = [0.0; 3];
    for dimension in dimensions.iter().filter(|d| d.name.ends_with("space")) {
        for (row, value) in origin.iter_mut().enumerate() {
            *value += dimension.cosines[row] * dimension.start;
        }
    }
    origin
}

/// Sets the scaling of `space` from the image's `image-min` and
/// `image-max` (see the `scaled` module). Returns why NIfTI cannot carry it when the
/// scaling varies per slice.
fn read_scaling(
    space: &mut Space,
    file: &::hdf5::File,
    path: &Path,
    dtype: DType,
) -> Result<Option<String>> {
    let Some(table) = scaled::read_table(file, path, dtype)? else {
        return Ok(None);
    };
    match table.scaling(dtype) {
        ValueScaling::Identity => space.scaling = Some((1.0, 0.0)),
        ValueScaling::Global { slope, inter } => space.scaling = Some((slope, inter)),
        ValueScaling::PerSlice { entries } => {
            return Ok(Some(format!(
                "its image-min/image-max scaling varies per slice ({entries} values), and a \
                 NIfTI file has one scl_slope/scl_inter; pass --values scaled to write its \
                 physical values (float32, as nibabel computes them)"
            )))
        }
        ValueScaling::Float | ValueScaling::Absent => {}
    }
    Ok(None)
}

/// MINC2's row of the format table: read only, its image at a fixed
/// dataset, its stored values scaled by each file's image-min/image-max.
pub(in crate::format) const TRAITS: FormatTraits = FormatTraits {
    name: "MINC2",
    extension: "mnc",
    input_extensions: &["mnc"],
    probe: Ok(probe_block),
    template: Err(
        "rechunkfs reads MINC2 but does not write it; choose --format nii (NIfTI-1, with \
         the MINC2 affine), h5, npy or raw",
    ),
    space: Some(space_of),
    dataset: Dataset::Fixed(IMAGE),
    stored_scaling: true,
    leading_axis_is_time: true,
    ..FormatTraits::NONE
};

/// [`probe`] as the format table calls it (the dataset is always [`IMAGE`]).
fn probe_block(path: &Path, _dataset: &str) -> Result<BlockInfo> {
    probe(path)
}

/// [`probe_space`] as the format table calls it.
fn space_of(path: &Path, info: &BlockInfo) -> Result<Space> {
    probe_space(path, info.shape.len(), info.dtype)
}
