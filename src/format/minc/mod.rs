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

use std::ffi::c_void;
use std::path::Path;

use ::hdf5::sync::sync;
use ::hdf5::types::{TypeDescriptor, VarLenAscii, VarLenUnicode};
use hdf5_sys::h5a::H5Aread;

mod scaled;

pub use scaled::{scaled_decoder, scaled_dtype, value_scaling, ValueScaling};

use super::BlockInfo;
use crate::array::dtype::{DType, Kind};
use crate::array::space::{Space, UNITS_MM};
use crate::error::{Error, Result};

/// Where a MINC2 file keeps its image.
pub const IMAGE: &str = "/minc-2.0/image/0/image";
const IMAGE_GROUP: &str = "/minc-2.0/image/0";
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
    let (_, _, head) = super::read_head(path, "MINC2", 4)?;
    if head.starts_with(b"CDF\x01") || head.starts_with(b"CDF\x02") {
        return Err(Error::bad_input(
            path,
            "is a MINC1 (netCDF) file; rechunkfs reads MINC2, which is HDF5: convert it with \
             minc-tools' `mincconvert -2 IN.mnc OUT.mnc`",
        ));
    }
    Ok(())
}

fn library_error(path: &Path, what: &str, error: ::hdf5::Error) -> Error {
    Error::Hdf5 {
        path: path.to_path_buf(),
        message: format!("cannot read {what}: {error}"),
    }
}

/// The most bytes a string attribute may hold.
const MAX_STRING_ATTR: usize = 1 << 20;

/// A string attribute, fixed-length (as libminc writes them) or
/// variable-length (as h5py writes Python strings); `None` if absent.
fn string_attr(location: &::hdf5::Location, name: &str) -> ::hdf5::Result<Option<String>> {
    if !location.attr_names()?.iter().any(|n| n == name) {
        return Ok(None);
    }
    let attr = location.attr(name)?;
    let file_type = attr.dtype()?;
    let text = match file_type.to_descriptor()? {
        TypeDescriptor::VarLenAscii => attr.read_scalar::<VarLenAscii>()?.as_str().to_owned(),
        TypeDescriptor::VarLenUnicode => attr.read_scalar::<VarLenUnicode>()?.as_str().to_owned(),
        TypeDescriptor::FixedAscii(len) | TypeDescriptor::FixedUnicode(len) => {
            let points = attr.space()?.size().max(1);
            // An attribute lives in its object's header (at most 64 KiB)
            // unless stored densely; a string past this is a lie.
            let size = len.checked_mul(points).filter(|&n| n <= MAX_STRING_ATTR);
            let Some(size) = size else {
                return Err(format!(
                    "attribute {name} claims {points} strings of {len} bytes, more than the \
                     {MAX_STRING_ATTR} bytes rechunkfs reads"
                )
                .into());
            };
            let mut bytes = vec![0u8; size];
            // SAFETY: the attribute is open, its memory type is its own file
            // type (fixed strings of `len` bytes), and the buffer holds
            // `len` bytes for each of its `points` elements. The caller
            // holds the library lock.
            ::hdf5::h5check(unsafe {
                H5Aread(attr.id(), file_type.id(), bytes.as_mut_ptr() as *mut c_void)
            })?;
            bytes.truncate(len);
            String::from_utf8_lossy(&bytes)
                .trim_end_matches(['\0', ' '])
                .to_owned()
        }
        other => return Err(format!("attribute {name} is {other}, not a string").into()),
    };
    Ok(Some(text))
}

/// A numeric attribute's values, converted to f64; `None` if absent.
fn numbers_attr(location: &::hdf5::Location, name: &str) -> ::hdf5::Result<Option<Vec<f64>>> {
    if !location.attr_names()?.iter().any(|n| n == name) {
        return Ok(None);
    }
    location.attr(name)?.read_raw::<f64>().map(Some)
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

/// The least and greatest values of an integer dtype, nibabel's default
/// valid range.
fn dtype_range(dtype: DType) -> (f64, f64) {
    let bits = (dtype.size * 8) as i32;
    match dtype.kind {
        Kind::Unsigned => (0.0, 2f64.powi(bits) - 1.0),
        _ => (-(2f64.powi(bits - 1)), 2f64.powi(bits - 1) - 1.0),
    }
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
