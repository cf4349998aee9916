//! NIfTI single files (`.nii`, and gzipped `.nii.gz`), NIfTI-1 or NIfTI-2:
//! reading the header of an input, and writing the header of an output
//! block that places it in the whole image's world space.
//!
//! NIfTI stores x fastest, so a NIfTI image nibabel reports as (nx, ny, nz)
//! is, in rechunkfs's internal C order, an array of shape (nz, ny, nx): the
//! bytes are the same, only the list of sides is reversed. Files may be of
//! either byte order (the header's `sizeof_hdr`, 348 or 540, read in the
//! file's order, tells which and the version); outputs are written in the
//! order of their dtype, so voxels are moved and never swapped. An output
//! header carries the dims, datatype, voxel sizes, value scaling and an
//! affine (sform, and a matching qform when the affine is a rotation times
//! the voxel sizes) translated so that voxel (0, 0, 0) of the block maps to
//! where that voxel lies in the whole image.
//!
//! NIfTI-2 is NIfTI-1 with 64-bit sides, offsets and floats, its fields
//! reordered: one [`Layout`] per version says where each field is and how
//! wide, and the same code reads and writes both. A gzipped file is read
//! whole and inflated ([`gzip`]).

mod gzip;

use std::path::Path;

use super::block::{
    read_head, shape_problem, shape_text, BlockFormat, BlockInfo, BlockTemplate, Storage,
};
use super::traits::FormatTraits;
use crate::array::axes::AxisOrder;
use crate::array::dtype::{DType, Endian, Kind};
use crate::array::space::{affine_of_qform, qform_of, Qform, Space};
use crate::error::{Error, Result};

/// NIfTI (1 and 2) `dim[0]` is at most 7.
pub const MAX_DIMS: usize = 7;
/// NIfTI-1 stores each side as an `int16`.
pub const MAX_SIDE: u64 = i16::MAX as u64;
/// How a header's unsupported datatype is reported, so probing can type the error.
const DATATYPE_PROBLEM: &str = "its datatype is";
/// NIFTI_XFORM_SCANNER_ANAT: the code rechunkfs writes for its sform and qform.
const XFORM_SCANNER_ANAT: i64 = 1;
/// Bytes read from the start of a file to learn its header: a NIfTI-2
/// header and its extension flag.
const HEAD_LEN: u64 = NIFTI2.header_len as u64 + 4;

/// The two versions of the NIfTI header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    One,
    Two,
}

impl Version {
    fn layout(self) -> &'static Layout {
        match self {
            Version::One => &NIFTI1,
            Version::Two => &NIFTI2,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Version::One => "NIfTI-1",
            Version::Two => "NIfTI-2",
        }
    }

    /// The header plus the 4-byte extension flag: the least `vox_offset`
    /// of a single file, and where rechunkfs's real output files put the data.
    pub fn min_vox_offset(self) -> u64 {
        self.layout().header_len as u64 + 4
    }

    /// The version a block of `shape` (internal C order) needs at least:
    /// NIfTI-2 once a side is past NIfTI-1's 16 bits.
    pub fn needed_for(shape: &[u64]) -> Version {
        if shape.iter().any(|&side| side > MAX_SIDE) {
            Version::Two
        } else {
            Version::One
        }
    }
}

/// Where a version's header keeps each field (byte offsets) and how wide
/// its integers and floats are (bytes).
struct Layout {
    header_len: usize,
    magic_at: usize,
    magic: &'static [u8],
    datatype: usize,
    bitpix: usize,
    /// `dim[0..8]`, each `dim_size` wide.
    dim: usize,
    dim_size: usize,
    /// `pixdim[0..8]`, each `float_size` wide, as are every other float.
    pixdim: usize,
    float_size: usize,
    /// A float in NIfTI-1, an `int64` in NIfTI-2.
    vox_offset: usize,
    scl_slope: usize,
    scl_inter: usize,
    descrip: usize,
    /// `qform_code` and `sform_code`, each `code_size` wide.
    qform_code: usize,
    sform_code: usize,
    code_size: usize,
    /// `quatern_b`, `_c`, `_d`, `qoffset_x`, `_y`, `_z`, one after another.
    quatern_b: usize,
    /// `srow_x`, `srow_y`, `srow_z`: four floats each.
    srow: usize,
    xyzt_units: usize,
    units_size: usize,
}

/// nifti1.h.
const NIFTI1: Layout = Layout {
    header_len: 348,
    magic_at: 344,
    magic: b"n+1\0",
    datatype: 70,
    bitpix: 72,
    dim: 40,
    dim_size: 2,
    pixdim: 76,
    float_size: 4,
    vox_offset: 108,
    scl_slope: 112,
    scl_inter: 116,
    descrip: 148,
    qform_code: 252,
    sform_code: 254,
    code_size: 2,
    quatern_b: 256,
    srow: 280,
    xyzt_units: 123,
    units_size: 1,
};

/// nifti2.h.
const NIFTI2: Layout = Layout {
    header_len: 540,
    magic_at: 4,
    magic: b"n+2\0\r\n\x1a\n",
    datatype: 12,
    bitpix: 14,
    dim: 16,
    dim_size: 8,
    pixdim: 104,
    float_size: 8,
    vox_offset: 168,
    scl_slope: 176,
    scl_inter: 184,
    descrip: 240,
    qform_code: 344,
    sform_code: 348,
    code_size: 4,
    quatern_b: 352,
    srow: 400,
    xyzt_units: 500,
    units_size: 4,
};

/// What a NIfTI header says, in NIfTI's axis order.
#[derive(Clone, Debug, PartialEq)]
pub struct NiftiHeader {
    pub version: Version,
    /// Sides as nibabel reports them: (x, y, z, ...), x fastest.
    pub dims: Vec<u64>,
    pub dtype: DType,
    pub vox_offset: u64,
    /// The whole file's affine (as nibabel chooses it: sform, else qform,
    /// else its default), voxel sizes, units and scaling.
    pub space: Space,
}

impl NiftiHeader {
    /// The shape in internal C order: the dims reversed.
    fn shape(&self) -> Vec<u64> {
        self.dims.iter().rev().copied().collect()
    }
}

/// The NIfTI datatype code of a dtype, or why `version` has none.
fn datatype_code(dtype: DType, version: Version) -> std::result::Result<i64, String> {
    let name = version.name();
    Ok(match (dtype.kind, dtype.size) {
        (Kind::Unsigned, 1) => 2,
        (Kind::Signed, 2) => 4,
        (Kind::Signed, 4) => 8,
        (Kind::Float, 4) => 16,
        (Kind::Float, 8) => 64,
        (Kind::Signed, 1) => 256,
        (Kind::Unsigned, 2) => 512,
        (Kind::Unsigned, 4) => 768,
        (Kind::Signed, 8) => 1024,
        (Kind::Unsigned, 8) => 1280,
        (Kind::Float, 2) => {
            return Err(format!(
                "{name} has no datatype for {} (f2, float16); write h5, npy or raw blocks \
                 instead",
                dtype.numpy_descr()
            ))
        }
        _ => return Err(format!("{name} has no datatype for {dtype}")),
    })
}

/// The dtype of a NIfTI datatype code in a file of byte order `endian`,
/// or what the code is instead.
fn dtype_of_code(code: i64, endian: Endian) -> std::result::Result<DType, String> {
    let (kind, size) = match code {
        2 => (Kind::Unsigned, 1),
        4 => (Kind::Signed, 2),
        8 => (Kind::Signed, 4),
        16 => (Kind::Float, 4),
        64 => (Kind::Float, 8),
        256 => (Kind::Signed, 1),
        512 => (Kind::Unsigned, 2),
        768 => (Kind::Unsigned, 4),
        1024 => (Kind::Signed, 8),
        1280 => (Kind::Unsigned, 8),
        1 => return Err("binary (1 bit per voxel, datatype 1)".into()),
        32 => return Err("complex64 (datatype 32)".into()),
        128 => return Err("RGB triples (datatype 128)".into()),
        1536 => return Err("float128 (datatype 1536)".into()),
        1792 => return Err("complex128 (datatype 1792)".into()),
        2048 => return Err("complex256 (datatype 2048)".into()),
        2304 => return Err("RGBA quadruples (datatype 2304)".into()),
        other => {
            return Err(format!(
                "datatype code {other}, which NIfTI does not define"
            ))
        }
    };
    DType::new(kind, size, endian).map_err(|e| e.to_string())
}

/// Writes fields in one byte order.
struct Writer<'a> {
    bytes: &'a mut [u8],
    big: bool,
}

impl Writer<'_> {
    fn put(&mut self, at: usize, le: &[u8], be: &[u8]) {
        let source = if self.big { be } else { le };
        self.bytes[at..at + source.len()].copy_from_slice(source);
    }

    /// An integer `size` bytes wide (1, 2, 4 or 8); the caller has
    /// checked it fits.
    fn int(&mut self, at: usize, size: usize, value: i64) {
        match size {
            1 => self.bytes[at] = value as u8,
            2 => self.put(
                at,
                &(value as i16).to_le_bytes(),
                &(value as i16).to_be_bytes(),
            ),
            4 => self.put(
                at,
                &(value as i32).to_le_bytes(),
                &(value as i32).to_be_bytes(),
            ),
            _ => self.put(at, &value.to_le_bytes(), &value.to_be_bytes()),
        }
    }

    /// A float `size` bytes wide (4 or 8).
    fn float(&mut self, at: usize, size: usize, value: f64) {
        if size == 4 {
            let value = value as f32;
            self.put(at, &value.to_le_bytes(), &value.to_be_bytes());
        } else {
            self.put(at, &value.to_le_bytes(), &value.to_be_bytes());
        }
    }
}

/// Reads fields in one byte order.
struct Reader<'a> {
    bytes: &'a [u8],
    big: bool,
}

impl Reader<'_> {
    fn array<const N: usize>(&self, at: usize) -> [u8; N] {
        let mut out = [0u8; N];
        out.copy_from_slice(&self.bytes[at..at + N]);
        out
    }

    /// A signed integer `size` bytes wide (1, 2, 4 or 8).
    fn int(&self, at: usize, size: usize) -> i64 {
        match (size, self.big) {
            (1, _) => i64::from(self.bytes[at]),
            (2, false) => i64::from(i16::from_le_bytes(self.array(at))),
            (2, true) => i64::from(i16::from_be_bytes(self.array(at))),
            (4, false) => i64::from(i32::from_le_bytes(self.array(at))),
            (4, true) => i64::from(i32::from_be_bytes(self.array(at))),
            (_, false) => i64::from_le_bytes(self.array(at)),
            (_, true) => i64::from_be_bytes(self.array(at)),
        }
    }

    /// A float `size` bytes wide (4 or 8).
    fn float(&self, at: usize, size: usize) -> f64 {
        match (size, self.big) {
            (4, false) => f64::from(f32::from_le_bytes(self.array(at))),
            (4, true) => f64::from(f32::from_be_bytes(self.array(at))),
            (_, false) => f64::from_le_bytes(self.array(at)),
            (_, true) => f64::from_be_bytes(self.array(at)),
        }
    }
}

/// Why a block of `shape` (internal C order) and `dtype` cannot be a
/// NIfTI file of `version`, if it cannot.
pub fn output_problem(
    shape: &[u64],
    dtype: DType,
    space: &Space,
    version: Version,
) -> Option<String> {
    if let Err(problem) = datatype_code(dtype, version) {
        return Some(problem);
    }
    let name = version.name();
    if shape.len() > MAX_DIMS {
        return Some(format!(
            "{name} holds at most {MAX_DIMS} dimensions, and this array has {}; write h5, npy \
             or raw blocks instead",
            shape.len()
        ));
    }
    let dims: Vec<u64> = shape.iter().rev().copied().collect();
    let too_long = |&(_, &side): &(usize, &u64)| match version {
        Version::One => side > MAX_SIDE,
        Version::Two => side > i64::MAX as u64,
    };
    if let Some((axis, side)) = dims.iter().enumerate().find(too_long) {
        return Some(format!(
            "NIfTI-1 stores each side in 16 bits, at most {MAX_SIDE} voxels, but a block of \
             {} (NIfTI order) is {side} voxels along NIfTI axis {axis}; choose a smaller \
             --shape, or --format nii2 (NIfTI-2)",
            shape_text(&dims)
        ));
    }
    space.nifti_refusal.clone()
}

/// The header (and the 4-byte extension flag, all zero) of a NIfTI file
/// of `version` holding a block of `shape` (internal C order) whose first
/// voxel is at `origin` of the whole array described by `space`, with its
/// data at `vox_offset`. The caller has checked [`output_problem`].
pub fn encode_header(
    version: Version,
    shape: &[u64],
    dtype: DType,
    space: &Space,
    origin: &[u64],
    vox_offset: u64,
) -> Vec<u8> {
    let layout = version.layout();
    let mut bytes = vec![0u8; version.min_vox_offset() as usize];
    let affine = space.block_affine(origin);
    let zoom = |axis: usize| space.zooms.get(axis).copied().unwrap_or(1.0).abs();
    let qform = qform_of(&affine, [zoom(0), zoom(1), zoom(2)]);
    let mut w = Writer {
        bytes: &mut bytes,
        big: dtype.endian == Endian::Big && dtype.size > 1,
    };
    let (float, int) = (layout.float_size, layout.dim_size);
    w.int(0, 4, layout.header_len as i64);
    if version == Version::One {
        // `regular`: Analyze's flag that nibabel and others still set.
        w.bytes[38] = b'r';
    }
    w.write_dims(layout, shape);
    // `output_problem` has refused datatypes NIfTI lacks; 0 (unknown)
    // would only be reached by a caller that skipped it.
    w.int(
        layout.datatype,
        2,
        datatype_code(dtype, version).unwrap_or(0),
    );
    w.int(layout.bitpix, 2, (dtype.size * 8) as i64);
    w.float(layout.pixdim, float, qform.map_or(1.0, |q| q.qfac));
    for axis in 0..7 {
        let value = if axis < shape.len() { zoom(axis) } else { 1.0 };
        w.float(layout.pixdim + float * (axis + 1), float, value);
    }
    match version {
        Version::One => w.float(layout.vox_offset, float, vox_offset as f64),
        Version::Two => w.int(layout.vox_offset, int, vox_offset as i64),
    }
    let (slope, inter) = space.scaling.unwrap_or((0.0, 0.0));
    w.float(layout.scl_slope, float, slope);
    w.float(layout.scl_inter, float, inter);
    w.int(
        layout.xyzt_units,
        layout.units_size,
        i64::from(space.xyzt_units),
    );
    let description = b"rechunkfs block";
    w.bytes[layout.descrip..layout.descrip + description.len()].copy_from_slice(description);
    w.write_transforms(layout, qform.as_ref(), &affine);
    w.bytes[layout.magic_at..layout.magic_at + layout.magic.len()].copy_from_slice(layout.magic);
    bytes
}

impl Writer<'_> {
    /// `dim`: the rank, then the sides of `shape` (internal C order) in
    /// NIfTI's order.
    fn write_dims(&mut self, layout: &Layout, shape: &[u64]) {
        let (at, size) = (layout.dim, layout.dim_size);
        let ndim = shape.len();
        self.int(at, size, ndim as i64);
        for axis in 0..7 {
            // Sides past dim[0] are 1, as nibabel writes them.
            let side = if axis < ndim {
                shape[ndim - 1 - axis]
            } else {
                1
            };
            self.int(at + size * (axis + 1), size, side as i64);
        }
    }

    /// The qform (if the affine has one) and the sform.
    fn write_transforms(&mut self, layout: &Layout, qform: Option<&Qform>, affine: &[[f64; 4]; 3]) {
        let (float, code) = (layout.float_size, layout.code_size);
        if let Some(q) = qform {
            self.int(layout.qform_code, code, XFORM_SCANNER_ANAT);
            let values = [q.b, q.c, q.d, q.offset[0], q.offset[1], q.offset[2]];
            for (i, value) in values.into_iter().enumerate() {
                self.float(layout.quatern_b + float * i, float, value);
            }
        }
        self.int(layout.sform_code, code, XFORM_SCANNER_ANAT);
        for (row, values) in affine.iter().enumerate() {
            for (col, &value) in values.iter().enumerate() {
                self.float(layout.srow + float * (4 * row + col), float, value);
            }
        }
    }
}

/// Where the data of a NIfTI block start: right after the header for real
/// files, or on the next multiple of `alignment` (the view's page).
pub fn vox_offset(version: Version, alignment: u64) -> u64 {
    version.min_vox_offset().next_multiple_of(alignment.max(1))
}

/// The template of a NIfTI block of `version` and `shape` at origin zero
/// of `space`.
pub(super) fn template(
    version: Version,
    shape: &[u64],
    dtype: DType,
    space: &Space,
    data_len: u64,
    alignment: u64,
) -> Result<BlockTemplate> {
    if let Some(problem) = output_problem(shape, dtype, space, version) {
        return Err(Error::BadArgument(format!(
            "cannot write {} blocks: {problem}",
            version.name()
        )));
    }
    let data_offset = vox_offset(version, alignment);
    let mut prefix = encode_header(
        version,
        shape,
        dtype,
        space,
        &vec![0; shape.len()],
        data_offset,
    );
    prefix.resize(data_offset as usize, 0);
    Ok(BlockTemplate {
        prefix,
        data_offset,
        data_len,
        suffix: Vec::new(),
    })
}

/// Decode the header at the start of `bytes` (the first bytes of a file:
/// its header and extension flag, or all of a shorter file).
pub fn decode_header(bytes: &[u8]) -> std::result::Result<NiftiHeader, String> {
    let (version, big) = version_and_order(bytes)?;
    let layout = version.layout();
    let r = Reader { bytes, big };
    check_magic(bytes, version)?;
    let dims = read_dims(&r, layout)?;
    let ndim = dims.len();
    let dtype = read_dtype(&r, layout)?;
    let vox_offset = read_vox_offset(&r, version)?;
    let float = layout.float_size;
    let pixdim: Vec<f64> = (0..8)
        .map(|i| r.float(layout.pixdim + float * i, float))
        .collect();
    let zooms: Vec<f64> = (0..ndim).map(|axis| pixdim[axis + 1].abs()).collect();
    let slope = r.float(layout.scl_slope, float);
    let inter = r.float(layout.scl_inter, float);
    let scaling = (slope != 0.0 && slope.is_finite())
        .then(|| (slope, if inter.is_finite() { inter } else { 0.0 }));
    let affine = best_affine(&r, layout, &dims, &pixdim);
    Ok(NiftiHeader {
        version,
        dims,
        dtype,
        vox_offset,
        space: Space {
            affine,
            zooms,
            // Units fit in a byte: NIfTI-2 only widens the field.
            xyzt_units: r.int(layout.xyzt_units, layout.units_size) as u8,
            scaling,
            nifti_refusal: None,
        },
    })
}

/// `vox_offset`, checked to be a whole number of bytes past the header.
fn read_vox_offset(r: &Reader<'_>, version: Version) -> std::result::Result<u64, String> {
    let layout = version.layout();
    let least = version.min_vox_offset();
    let value = match version {
        Version::One => r.float(layout.vox_offset, layout.float_size),
        Version::Two => r.int(layout.vox_offset, layout.dim_size) as f64,
    };
    if value.fract() != 0.0 || value < least as f64 || value > u64::MAX as f64 {
        return Err(format!(
            "its vox_offset {value} is not a whole number of bytes past the {least}-byte header"
        ));
    }
    Ok(value as u64)
}

/// The version and whether the header is big-endian, as its `sizeof_hdr`
/// (348 or 540) tells; refuses what is not a NIfTI header.
fn version_and_order(bytes: &[u8]) -> std::result::Result<(Version, bool), String> {
    if bytes.len() < 4 {
        return Err(format!(
            "truncated: it has only {} bytes, too few for a NIfTI header",
            bytes.len()
        ));
    }
    let le = i32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    let be = i32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    let (version, big) = match (le, be) {
        (348, _) => (Version::One, false),
        (_, 348) => (Version::One, true),
        (540, _) => (Version::Two, false),
        (_, 540) => (Version::Two, true),
        _ => {
            let shown: Vec<String> = bytes.iter().take(8).map(|b| format!("{b:02x}")).collect();
            return Err(format!(
                "it does not start with NIfTI's sizeof_hdr (348 for NIfTI-1, 540 for NIfTI-2) in \
                 either byte order (its first bytes: {})",
                shown.join(" ")
            ));
        }
    };
    let least = version.min_vox_offset();
    if (bytes.len() as u64) < least {
        return Err(format!(
            "truncated: a {} header needs {least} bytes but the file has only {}",
            version.name(),
            bytes.len()
        ));
    }
    Ok((version, big))
}

/// Refuses a header whose magic is not that of a single file.
fn check_magic(bytes: &[u8], version: Version) -> std::result::Result<(), String> {
    let layout = version.layout();
    let magic = &bytes[layout.magic_at..layout.magic_at + layout.magic.len()];
    if magic == layout.magic {
        return Ok(());
    }
    if magic[..3] == [b'n', b'i', layout.magic[2]] {
        return Err(format!(
            "it is the header of a {} pair (.hdr/.img); rechunkfs reads single-file .nii images",
            version.name()
        ));
    }
    Err(format!(
        "its magic is {magic:?}, not {:?}: it is not a single-file {} image (an Analyze 7.5 \
         header?)",
        String::from_utf8_lossy(layout.magic),
        version.name()
    ))
}

/// The sides `dim` gives, (x, y, z, ...).
fn read_dims(r: &Reader<'_>, layout: &Layout) -> std::result::Result<Vec<u64>, String> {
    let (at, size) = (layout.dim, layout.dim_size);
    let ndim = r.int(at, size);
    if !(1..=MAX_DIMS as i64).contains(&ndim) {
        return Err(format!(
            "its dim[0] is {ndim}; NIfTI allows 1 to 7 dimensions"
        ));
    }
    let ndim = ndim as usize;
    let mut dims = Vec::with_capacity(ndim);
    for axis in 0..ndim {
        let side = r.int(at + size * (axis + 1), size);
        if side < 1 {
            return Err(format!("its dim[{}] is {side}", axis + 1));
        }
        dims.push(side as u64);
    }
    Ok(dims)
}

/// The dtype `datatype` gives, in the header's byte order, checked
/// against `bitpix`.
fn read_dtype(r: &Reader<'_>, layout: &Layout) -> std::result::Result<DType, String> {
    let endian = if r.big { Endian::Big } else { Endian::Little };
    let code = r.int(layout.datatype, 2);
    let dtype = dtype_of_code(code, endian).map_err(|found| {
        format!(
            "{DATATYPE_PROBLEM} {found}; rechunkfs carries u1..u8, i1..i8, f4 and f8 from NIfTI"
        )
    })?;
    let bitpix = r.int(layout.bitpix, 2);
    if bitpix as usize != dtype.size * 8 {
        return Err(format!(
            "its bitpix {bitpix} disagrees with its datatype {code} ({} bits)",
            dtype.size * 8
        ));
    }
    Ok(dtype)
}

/// The affine nibabel gives an image: the sform if its code is set, else
/// the qform if its code is set, else nibabel's default (voxel sizes on the
/// diagonal, x flipped, centred on the middle voxel).
fn best_affine(r: &Reader<'_>, layout: &Layout, dims: &[u64], pixdim: &[f64]) -> [[f64; 4]; 3] {
    let float = layout.float_size;
    let zoom = |axis: usize| {
        if axis < dims.len() {
            pixdim[axis + 1]
        } else {
            1.0
        }
    };
    if r.int(layout.sform_code, layout.code_size) > 0 {
        let mut affine = [[0.0; 4]; 3];
        for (row, values) in affine.iter_mut().enumerate() {
            for (col, value) in values.iter_mut().enumerate() {
                *value = r.float(layout.srow + float * (4 * row + col), float);
            }
        }
        return affine;
    }
    if r.int(layout.qform_code, layout.code_size) > 0 {
        let quatern = |i: usize| r.float(layout.quatern_b + float * i, float);
        let qfac = if pixdim[0] < 0.0 { -1.0 } else { 1.0 };
        let qform = Qform {
            b: quatern(0),
            c: quatern(1),
            d: quatern(2),
            qfac,
            offset: [quatern(3), quatern(4), quatern(5)],
        };
        return affine_of_qform(&qform, [zoom(0), zoom(1), zoom(2)]);
    }
    let mut affine = [[0.0; 4]; 3];
    for (axis, row) in affine.iter_mut().enumerate() {
        let side = dims.get(axis).copied().unwrap_or(1) as f64;
        let step = if axis == 0 { -zoom(axis) } else { zoom(axis) };
        row[axis] = step;
        row[3] = -(side - 1.0) / 2.0 * step;
    }
    affine
}

/// The header at the start of `head` (the first bytes of `path`), with
/// the data length its shape and dtype give; errors name `path`.
fn header_of(path: &Path, head: &[u8], format: &'static str) -> Result<(NiftiHeader, u64)> {
    let header = decode_header(head).map_err(|problem| {
        if problem.starts_with(DATATYPE_PROBLEM) {
            Error::UnsupportedDtype(format!("{}: {problem}", path.display()))
        } else {
            Error::BadBlockFile {
                path: path.to_path_buf(),
                format,
                problem,
            }
        }
    })?;
    let data_len = shape_problem(&header.shape(), header.dtype)
        .map_err(|problem| Error::bad_input(path, problem))?;
    Ok((header, data_len))
}

/// Read and check the header of the NIfTI file at `path` (gzipped or
/// not), and for an uncompressed one that the file holds all the data it
/// promises (a gzipped one is checked as it is inflated).
pub fn read_header(path: &Path) -> Result<NiftiHeader> {
    Ok(read_file_header(path)?.0)
}

/// The header of `path`, its data length, and how the file stores it.
fn read_file_header(path: &Path) -> Result<(NiftiHeader, u64, Storage)> {
    let (file, file_len, head) = read_head(path, "NIfTI", HEAD_LEN)?;
    if gzip::is_gzip(&head) {
        let head = gzip::inflate_head(path, file, HEAD_LEN)?;
        let (header, data_len) = header_of(path, &head, gzip::FORMAT)?;
        let storage = gzip::storage(
            path,
            file_len,
            header.vox_offset,
            data_len,
            header.dims.clone(),
        )?;
        return Ok((header, data_len, storage));
    }
    let (header, data_len) = header_of(path, &head, "NIfTI")?;
    let needed_len = header.vox_offset.saturating_add(data_len);
    if file_len < needed_len {
        return Err(Error::BadBlockFile {
            path: path.to_path_buf(),
            format: header.version.name(),
            problem: format!(
                "truncated: its header promises {} (x, y, z order) of {} = {data_len} data \
                 bytes from offset {}, so {needed_len} bytes in all, but the file has only \
                 {file_len}",
                shape_text(&header.dims),
                header.dtype.numpy_descr(),
                header.vox_offset,
            ),
        });
    }
    let storage = Storage::Contiguous {
        data_offset: header.vox_offset,
    };
    Ok((header, data_len, storage))
}

/// Learn a NIfTI file's shape (internal C order: its dims reversed),
/// dtype and storage: its data in place, or a gzipped file to inflate.
pub fn probe(path: &Path) -> Result<BlockInfo> {
    let (header, _, storage) = read_file_header(path)?;
    Ok(BlockInfo {
        shape: header.shape(),
        dtype: header.dtype,
        storage,
    })
}

/// NIfTI-1's row of the format table: read as NIfTI-1 or -2 (`.nii`,
/// `.nii.gz`), written as NIfTI-1 unless a block needs NIfTI-2; each
/// header places its block in the world.
pub(super) const TRAITS: FormatTraits = FormatTraits {
    name: "NIfTI",
    extension: "nii",
    input_extensions: &["nii"],
    axis_order: AxisOrder::Nifti,
    probe: Ok(probe_block),
    template: Ok(template_one),
    space: Some(space_of),
    place: Some(place_one),
    global_scaling: true,
    leading_axis_is_time: true,
    wider: Some(wider),
    ..FormatTraits::NONE
};

/// NIfTI-2's row: written only (inputs of either version are NIfTI's).
pub(super) const TRAITS_2: FormatTraits = FormatTraits {
    name: "NIfTI-2",
    aliases: &["nii2", "nifti2"],
    input_extensions: &[],
    template: Ok(template_two),
    place: Some(place_two),
    leading_axis_is_time: false,
    wider: None,
    ..TRAITS
};

/// [`probe`] as the format table calls it (NIfTI has no datasets).
fn probe_block(path: &Path, _dataset: &str) -> Result<BlockInfo> {
    probe(path)
}

/// The world space a NIfTI file's header gives.
fn space_of(path: &Path, _info: &BlockInfo) -> Result<Space> {
    Ok(read_header(path)?.space)
}

/// NIfTI-2 for blocks with a side past NIfTI-1's.
fn wider(block_shape: &[u64]) -> Option<BlockFormat> {
    (Version::needed_for(block_shape) == Version::Two).then_some(BlockFormat::Nifti2)
}

fn template_one(
    shape: &[u64],
    dtype: DType,
    _dataset: &str,
    data_len: u64,
    alignment: u64,
    space: &Space,
) -> Result<BlockTemplate> {
    template(Version::One, shape, dtype, space, data_len, alignment)
}

fn template_two(
    shape: &[u64],
    dtype: DType,
    _dataset: &str,
    data_len: u64,
    alignment: u64,
    space: &Space,
) -> Result<BlockTemplate> {
    template(Version::Two, shape, dtype, space, data_len, alignment)
}

fn place_one(
    template: &BlockTemplate,
    shape: &[u64],
    dtype: DType,
    space: &Space,
    origin: &[u64],
) -> BlockTemplate {
    place(Version::One, template, shape, dtype, space, origin)
}

fn place_two(
    template: &BlockTemplate,
    shape: &[u64],
    dtype: DType,
    space: &Space,
    origin: &[u64],
) -> BlockTemplate {
    place(Version::Two, template, shape, dtype, space, origin)
}

/// `template` with its header's affine translated to the voxel `origin`.
fn place(
    version: Version,
    template: &BlockTemplate,
    shape: &[u64],
    dtype: DType,
    space: &Space,
    origin: &[u64],
) -> BlockTemplate {
    let header = encode_header(version, shape, dtype, space, origin, template.data_offset);
    let mut placed = template.clone();
    placed.prefix[..header.len()].copy_from_slice(&header);
    placed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dtype(text: &str) -> DType {
        text.parse().unwrap()
    }

    #[test]
    fn headers_round_trip_in_both_byte_orders_and_versions() {
        let mut space = Space::identity(3);
        space.affine = [
            [-0.5, 0.0, 0.0, 10.0],
            [0.0, 0.25, 0.0, -20.0],
            [0.0, 0.0, 2.0, 30.0],
        ];
        space.zooms = vec![0.5, 0.25, 2.0];
        space.scaling = Some((2.0, -1.0));
        space.xyzt_units = 10;
        for version in [Version::One, Version::Two] {
            let least = version.min_vox_offset();
            for descr in ["|u1", "<i2", ">i2", ">f4", "<f8", ">u8"] {
                let bytes =
                    encode_header(version, &[5, 6, 7], dtype(descr), &space, &[1, 2, 3], least);
                assert_eq!(bytes.len() as u64, least);
                assert_eq!(&bytes[bytes.len() - 4..], &[0, 0, 0, 0]);
                let header = decode_header(&bytes).unwrap();
                assert_eq!(header.version, version);
                assert_eq!(header.dims, [7, 6, 5]);
                assert_eq!(header.dtype, dtype(descr));
                assert_eq!(header.vox_offset, least);
                assert_eq!(header.space.zooms, [0.5, 0.25, 2.0]);
                assert_eq!(header.space.scaling, Some((2.0, -1.0)));
                assert_eq!(header.space.xyzt_units, 10);
                // Voxel (0,0,0) of the block is NIfTI voxel (3, 2, 1) of the whole.
                let moved = header.space.affine;
                assert_eq!(moved[0][3], 10.0 - 1.5);
                assert_eq!(moved[1][3], -20.0 + 0.5);
                assert_eq!(moved[2][3], 30.0 + 2.0);
            }
        }
        let big = encode_header(
            Version::One,
            &[2, 2],
            dtype(">u2"),
            &Space::identity(2),
            &[0, 0],
            352,
        );
        assert_eq!(&big[0..4], &348i32.to_be_bytes());
        let big = encode_header(
            Version::Two,
            &[2, 2],
            dtype(">u2"),
            &Space::identity(2),
            &[0, 0],
            544,
        );
        assert_eq!(&big[0..4], &540i32.to_be_bytes());
        assert_eq!(&big[4..12], b"n+2\0\r\n\x1a\n");
    }

    #[test]
    fn nifti2_holds_sides_nifti1_cannot() {
        let shape = [2, 3, 70_000];
        assert_eq!(Version::needed_for(&shape), Version::Two);
        assert_eq!(Version::needed_for(&[2, 3, 32_767]), Version::One);
        let space = Space::identity(3);
        assert_eq!(
            output_problem(&shape, dtype("<i2"), &space, Version::Two),
            None
        );
        let bytes = encode_header(Version::Two, &shape, dtype("<i2"), &space, &[0, 0, 0], 544);
        assert_eq!(decode_header(&bytes).unwrap().dims, [70_000, 3, 2]);
    }

    #[test]
    fn refusals_say_what_nifti_cannot_hold() {
        let space = Space::identity(3);
        let one = Version::One;
        let problem = output_problem(&[4, 4, 4], dtype("<f2"), &space, one).unwrap();
        assert!(
            problem.contains("f2") && problem.contains("float16"),
            "{problem}"
        );
        let problem = output_problem(&[1; 8], dtype("u1"), &Space::identity(8), one).unwrap();
        assert!(problem.contains("at most 7 dimensions"), "{problem}");
        let problem = output_problem(&[4, 4, 40_000], dtype("u1"), &space, one).unwrap();
        assert!(
            problem.contains("32767") && problem.contains("40000") && problem.contains("nii2"),
            "{problem}"
        );
        assert_eq!(
            output_problem(&[4, 4, 32_767], dtype("u1"), &space, one),
            None
        );
    }

    #[test]
    fn decode_refuses_what_is_not_single_file_nifti() {
        let good = encode_header(
            Version::One,
            &[2, 2, 2],
            dtype("u1"),
            &Space::identity(3),
            &[0, 0, 0],
            352,
        );
        let mut pair = good.clone();
        pair[344..348].copy_from_slice(b"ni1\0");
        assert!(decode_header(&pair).unwrap_err().contains("pair"));
        let mut two = good.clone();
        two[0..4].copy_from_slice(&540i32.to_le_bytes());
        assert!(decode_header(&two)
            .unwrap_err()
            .contains("NIfTI-2 header needs 544"));
        let mut half = good.clone();
        half[70..72].copy_from_slice(&1536i16.to_le_bytes());
        assert!(decode_header(&half).unwrap_err().contains("float128"));
        let mut offset = good;
        offset[108..112].copy_from_slice(&100f32.to_le_bytes());
        assert!(decode_header(&offset).unwrap_err().contains("vox_offset"));
        let two = encode_header(
            Version::Two,
            &[2, 2],
            dtype("u1"),
            &Space::identity(2),
            &[0, 0],
            544,
        );
        let mut pair = two.clone();
        pair[4..8].copy_from_slice(b"ni2\0");
        assert!(decode_header(&pair).unwrap_err().contains("NIfTI-2 pair"));
        let mut offset = two;
        offset[168..176].copy_from_slice(&500i64.to_le_bytes());
        assert!(decode_header(&offset)
            .unwrap_err()
            .contains("544-byte header"));
    }
}
