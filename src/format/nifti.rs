//! NIfTI-1 single files (`.nii`): reading the 348-byte header of an input,
//! and writing the header of an output block that places it in the whole
//! image's world space.
//!
//! NIfTI stores x fastest, so a NIfTI image nibabel reports as (nx, ny, nz)
//! is, in rechunkfs's internal C order, an array of shape (nz, ny, nx): the
//! bytes are the same, only the list of sides is reversed. Files may be of
//! either byte order (the header's `sizeof_hdr` of 348, read in the file's
//! order, tells which); outputs are written in the order of their dtype, so
//! voxels are moved and never swapped. An output header carries the dims,
//! datatype, voxel sizes, value scaling and an affine (sform, and a matching
//! qform when the affine is a rotation times the voxel sizes) translated so
//! that voxel (0, 0, 0) of the block maps to where that voxel lies in the
//! whole image.

use std::path::Path;

use super::{shape_problem, shape_text, BlockInfo, BlockTemplate, Storage};
use crate::array::dtype::{DType, Endian, Kind};
use crate::array::space::{affine_of_qform, qform_of, Qform, Space};
use crate::error::{Error, Result};

/// `sizeof_hdr`: the header's own length.
pub const HEADER_LEN: usize = 348;
/// The header plus the 4-byte extension flag: the least `vox_offset` of a
/// single-file NIfTI-1, and where rechunkfs's real output files put the data.
pub const MIN_VOX_OFFSET: u64 = 352;
/// NIfTI-1 `dim[0]` is at most 7.
pub const MAX_DIMS: usize = 7;
/// Each side is an `int16`.
pub const MAX_SIDE: u64 = i16::MAX as u64;
/// How a header's unsupported datatype is reported, so probing can type the error.
const DATATYPE_PROBLEM: &str = "its datatype is";
/// NIFTI_XFORM_SCANNER_ANAT: the code rechunkfs writes for its sform and qform.
const XFORM_SCANNER_ANAT: i16 = 1;

/// What a NIfTI-1 header says, in NIfTI's axis order.
#[derive(Clone, Debug, PartialEq)]
pub struct NiftiHeader {
    /// Sides as nibabel reports them: (x, y, z, ...), x fastest.
    pub dims: Vec<u64>,
    pub dtype: DType,
    pub vox_offset: u64,
    /// The whole file's affine (as nibabel chooses it: sform, else qform,
    /// else its default), voxel sizes, units and scaling.
    pub space: Space,
}

/// The NIfTI-1 datatype code of a dtype, or why NIfTI-1 has none.
fn datatype_code(dtype: DType) -> std::result::Result<i16, String> {
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
                "NIfTI-1 has no datatype for {} (f2, float16); write h5, npy or raw blocks \
                 instead",
                dtype.numpy_descr()
            ))
        }
        _ => return Err(format!("NIfTI-1 has no datatype for {dtype}")),
    })
}

/// The dtype of a NIfTI-1 datatype code in a file of byte order `endian`,
/// or what the code is instead.
fn dtype_of_code(code: i16, endian: Endian) -> std::result::Result<DType, String> {
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
                "datatype code {other}, which NIfTI-1 does not define"
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
    fn i16(&mut self, at: usize, value: i16) {
        self.put(at, &value.to_le_bytes(), &value.to_be_bytes());
    }
    fn i32(&mut self, at: usize, value: i32) {
        self.put(at, &value.to_le_bytes(), &value.to_be_bytes());
    }
    fn f32(&mut self, at: usize, value: f64) {
        let value = value as f32;
        self.put(at, &value.to_le_bytes(), &value.to_be_bytes());
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
    fn i16(&self, at: usize) -> i16 {
        let raw = self.array::<2>(at);
        if self.big {
            i16::from_be_bytes(raw)
        } else {
            i16::from_le_bytes(raw)
        }
    }
    fn f32(&self, at: usize) -> f64 {
        let raw = self.array::<4>(at);
        f64::from(if self.big {
            f32::from_be_bytes(raw)
        } else {
            f32::from_le_bytes(raw)
        })
    }
}

/// Why a block of `shape` (internal C order) and `dtype` cannot be a
/// NIfTI-1 file, if it cannot.
pub fn output_problem(shape: &[u64], dtype: DType, space: &Space) -> Option<String> {
    if let Err(problem) = datatype_code(dtype) {
        return Some(problem);
    }
    if shape.len() > MAX_DIMS {
        return Some(format!(
            "NIfTI-1 holds at most {MAX_DIMS} dimensions, and this array has {}; write h5, npy \
             or raw blocks instead",
            shape.len()
        ));
    }
    let dims: Vec<u64> = shape.iter().rev().copied().collect();
    if let Some((axis, side)) = dims.iter().enumerate().find(|(_, &side)| side > MAX_SIDE) {
        return Some(format!(
            "NIfTI-1 stores each side in 16 bits, at most {MAX_SIDE} voxels, but a block of \
             {} (NIfTI order) is {side} voxels along NIfTI axis {axis}; choose a smaller --shape",
            shape_text(&dims)
        ));
    }
    space.nifti_refusal.clone()
}

/// The header (348 bytes and the 4-byte extension flag, all zero) of a
/// NIfTI-1 file holding a block of `shape` (internal C order) whose first
/// voxel is at `origin` of the whole array described by `space`, with its
/// data at `vox_offset`. The caller has checked [`output_problem`].
pub fn encode_header(
    shape: &[u64],
    dtype: DType,
    space: &Space,
    origin: &[u64],
    vox_offset: u64,
) -> Vec<u8> {
    let mut bytes = vec![0u8; MIN_VOX_OFFSET as usize];
    let affine = space.block_affine(origin);
    let zoom = |axis: usize| space.zooms.get(axis).copied().unwrap_or(1.0).abs();
    let qform = qform_of(&affine, [zoom(0), zoom(1), zoom(2)]);
    let mut w = Writer {
        bytes: &mut bytes,
        big: dtype.endian == Endian::Big && dtype.size > 1,
    };
    w.i32(0, HEADER_LEN as i32);
    // `regular`: Analyze's flag that nibabel and others still set.
    w.bytes[38] = b'r';
    w.write_dims(shape);
    // `output_problem` has refused datatypes NIfTI-1 lacks; 0 (unknown)
    // would only be reached by a caller that skipped it.
    w.i16(70, datatype_code(dtype).unwrap_or(0));
    w.i16(72, (dtype.size * 8) as i16);
    w.f32(76, qform.map_or(1.0, |q| q.qfac));
    for axis in 0..7 {
        let value = if axis < shape.len() { zoom(axis) } else { 1.0 };
        w.f32(80 + 4 * axis, value);
    }
    w.f32(108, vox_offset as f64);
    let (slope, inter) = space.scaling.unwrap_or((0.0, 0.0));
    w.f32(112, slope);
    w.f32(116, inter);
    w.bytes[123] = space.xyzt_units;
    let description = b"rechunkfs block";
    w.bytes[148..148 + description.len()].copy_from_slice(description);
    w.write_transforms(qform.as_ref(), &affine);
    w.bytes[344..348].copy_from_slice(b"n+1\0");
    bytes
}

impl Writer<'_> {
    /// `dim`: the rank, then the sides of `shape` (internal C order) in
    /// NIfTI's order.
    fn write_dims(&mut self, shape: &[u64]) {
        let ndim = shape.len();
        self.i16(40, ndim as i16);
        for axis in 0..7 {
            // Sides past dim[0] are 1, as nibabel writes them.
            let side = if axis < ndim {
                shape[ndim - 1 - axis]
            } else {
                1
            };
            self.i16(42 + 2 * axis, side as i16);
        }
    }

    /// The qform (if the affine has one) and the sform.
    fn write_transforms(&mut self, qform: Option<&Qform>, affine: &[[f64; 4]; 3]) {
        if let Some(q) = qform {
            self.i16(252, XFORM_SCANNER_ANAT);
            self.f32(256, q.b);
            self.f32(260, q.c);
            self.f32(264, q.d);
            self.f32(268, q.offset[0]);
            self.f32(272, q.offset[1]);
            self.f32(276, q.offset[2]);
        }
        self.i16(254, XFORM_SCANNER_ANAT);
        for (row, values) in affine.iter().enumerate() {
            for (col, &value) in values.iter().enumerate() {
                self.f32(280 + 16 * row + 4 * col, value);
            }
        }
    }
}

/// Where the data of a NIfTI block start: right after the header for real
/// files, or on the next multiple of `alignment` (the view's page).
pub fn vox_offset(alignment: u64) -> u64 {
    MIN_VOX_OFFSET.next_multiple_of(alignment.max(1))
}

/// The template of a NIfTI-1 block of `shape` at origin zero of `space`.
pub(super) fn template(
    shape: &[u64],
    dtype: DType,
    space: &Space,
    data_len: u64,
    alignment: u64,
) -> Result<BlockTemplate> {
    if let Some(problem) = output_problem(shape, dtype, space) {
        return Err(Error::BadArgument(format!(
            "cannot write NIfTI-1 blocks: {problem}"
        )));
    }
    let data_offset = vox_offset(alignment);
    let mut prefix = encode_header(shape, dtype, space, &vec![0; shape.len()], data_offset);
    prefix.resize(data_offset as usize, 0);
    Ok(BlockTemplate {
        prefix,
        data_offset,
        data_len,
        suffix: Vec::new(),
    })
}

/// Decode the header at the start of `bytes` (at least 352 bytes of a file).
pub fn decode_header(bytes: &[u8]) -> std::result::Result<NiftiHeader, String> {
    let big = byte_order(bytes)?;
    let r = Reader { bytes, big };
    check_magic(bytes)?;
    let dims = read_dims(&r)?;
    let ndim = dims.len();
    let dtype = read_dtype(&r)?;
    let vox_offset_value = r.f32(108);
    if vox_offset_value.fract() != 0.0 || vox_offset_value < MIN_VOX_OFFSET as f64 {
        return Err(format!(
            "its vox_offset {vox_offset_value} is not a whole number of bytes past the \
             {MIN_VOX_OFFSET}-byte header"
        ));
    }
    let pixdim: Vec<f64> = (0..8).map(|i| r.f32(76 + 4 * i)).collect();
    let zooms: Vec<f64> = (0..ndim).map(|axis| pixdim[axis + 1].abs()).collect();
    let slope = r.f32(112);
    let inter = r.f32(116);
    let scaling = (slope != 0.0 && slope.is_finite())
        .then(|| (slope, if inter.is_finite() { inter } else { 0.0 }));
    let affine = best_affine(&r, &dims, &pixdim);
    Ok(NiftiHeader {
        dims,
        dtype,
        vox_offset: vox_offset_value as u64,
        space: Space {
            affine,
            zooms,
            xyzt_units: bytes[123],
            scaling,
            nifti_refusal: None,
        },
    })
}

/// Whether the header is big-endian, as its `sizeof_hdr` of 348 tells;
/// refuses what is not an uncompressed NIfTI-1 header.
fn byte_order(bytes: &[u8]) -> std::result::Result<bool, String> {
    if bytes.starts_with(&[0x1f, 0x8b]) {
        return Err(
            "it is gzip-compressed (a .nii.gz renamed?); rechunkfs reads uncompressed \
                    .nii files: gunzip it first"
                .into(),
        );
    }
    if bytes.len() < MIN_VOX_OFFSET as usize {
        return Err(format!(
            "truncated: a NIfTI-1 header needs {MIN_VOX_OFFSET} bytes but the file has only {}",
            bytes.len()
        ));
    }
    let le = i32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    let be = i32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    match (le, be) {
        (348, _) => Ok(false),
        (_, 348) => Ok(true),
        (540, _) | (_, 540) => {
            Err("it is NIfTI-2 (sizeof_hdr 540); rechunkfs reads NIfTI-1".into())
        }
        _ => {
            let shown: Vec<String> = bytes.iter().take(8).map(|b| format!("{b:02x}")).collect();
            Err(format!(
                "it does not start with NIfTI-1's sizeof_hdr 348 in either byte order (its \
                 first bytes: {})",
                shown.join(" ")
            ))
        }
    }
}

/// Refuses a header whose magic is not that of a single-file NIfTI-1.
fn check_magic(bytes: &[u8]) -> std::result::Result<(), String> {
    match &bytes[344..348] {
        b"n+1\0" => Ok(()),
        b"ni1\0" => Err(
            "it is the header of a NIfTI-1 pair (.hdr/.img); rechunkfs reads \
                        single-file .nii images"
                .into(),
        ),
        other => Err(format!(
            "its magic is {other:?}, not \"n+1\": it is not a single-file NIfTI-1 image \
             (an Analyze 7.5 header?)"
        )),
    }
}

/// The sides `dim` gives, (x, y, z, ...).
fn read_dims(r: &Reader<'_>) -> std::result::Result<Vec<u64>, String> {
    let ndim = r.i16(40);
    if !(1..=MAX_DIMS as i16).contains(&ndim) {
        return Err(format!(
            "its dim[0] is {ndim}; NIfTI-1 allows 1 to 7 dimensions"
        ));
    }
    let ndim = ndim as usize;
    let mut dims = Vec::with_capacity(ndim);
    for axis in 0..ndim {
        let side = r.i16(42 + 2 * axis);
        if side < 1 {
            return Err(format!("its dim[{}] is {side}", axis + 1));
        }
        dims.push(side as u64);
    }
    Ok(dims)
}

/// The dtype `datatype` gives, in the header's byte order, checked
/// against `bitpix`.
fn read_dtype(r: &Reader<'_>) -> std::result::Result<DType, String> {
    let endian = if r.big { Endian::Big } else { Endian::Little };
    let code = r.i16(70);
    let dtype = dtype_of_code(code, endian).map_err(|found| {
        format!(
            "{DATATYPE_PROBLEM} {found}; rechunkfs carries u1..u8, i1..i8, f4 and f8 from NIfTI-1"
        )
    })?;
    let bitpix = r.i16(72);
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
fn best_affine(r: &Reader<'_>, dims: &[u64], pixdim: &[f64]) -> [[f64; 4]; 3] {
    let zoom = |axis: usize| {
        if axis < dims.len() {
            pixdim[axis + 1]
        } else {
            1.0
        }
    };
    if r.i16(254) > 0 {
        let mut affine = [[0.0; 4]; 3];
        for (row, values) in affine.iter_mut().enumerate() {
            for (col, value) in values.iter_mut().enumerate() {
                *value = r.f32(280 + 16 * row + 4 * col);
            }
        }
        return affine;
    }
    if r.i16(252) > 0 {
        let qfac = if pixdim[0] < 0.0 { -1.0 } else { 1.0 };
        let qform = Qform {
            b: r.f32(256),
            c: r.f32(260),
            d: r.f32(264),
            qfac,
            offset: [r.f32(268), r.f32(272), r.f32(276)],
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

/// Read and check the header of the NIfTI-1 file at `path`, including that
/// the file holds all the data it promises.
pub fn read_header(path: &Path) -> Result<NiftiHeader> {
    let bad_file = |problem: String| Error::BadBlockFile {
        path: path.to_path_buf(),
        format: "NIfTI-1",
        problem,
    };
    let (_, file_len, head) = super::read_head(path, "NIfTI-1", MIN_VOX_OFFSET)?;
    let header = decode_header(&head).map_err(|problem| {
        if problem.starts_with(DATATYPE_PROBLEM) {
            Error::UnsupportedDtype(format!("{}: {problem}", path.display()))
        } else {
            bad_file(problem)
        }
    })?;
    let shape: Vec<u64> = header.dims.iter().rev().copied().collect();
    let data_len =
        shape_problem(&shape, header.dtype).map_err(|problem| Error::bad_input(path, problem))?;
    let needed_len = header.vox_offset.saturating_add(data_len);
    if file_len < needed_len {
        return Err(bad_file(format!(
            "truncated: its header promises {} (x, y, z order) of {} = {data_len} data bytes \
             from offset {}, so {needed_len} bytes in all, but the file has only {file_len}",
            shape_text(&header.dims),
            header.dtype.numpy_descr(),
            header.vox_offset,
        )));
    }
    Ok(header)
}

/// Learn a NIfTI-1 file's shape (internal C order: its dims reversed),
/// dtype and data offset.
pub fn probe(path: &Path) -> Result<BlockInfo> {
    let header = read_header(path)?;
    Ok(BlockInfo {
        shape: header.dims.iter().rev().copied().collect(),
        dtype: header.dtype,
        storage: Storage::Contiguous {
            data_offset: header.vox_offset,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dtype(text: &str) -> DType {
        text.parse().unwrap()
    }

    #[test]
    fn headers_round_trip_in_both_byte_orders() {
        let mut space = Space::identity(3);
        space.affine = [
            [-0.5, 0.0, 0.0, 10.0],
            [0.0, 0.25, 0.0, -20.0],
            [0.0, 0.0, 2.0, 30.0],
        ];
        space.zooms = vec![0.5, 0.25, 2.0];
        space.scaling = Some((2.0, -1.0));
        for descr in ["|u1", "<i2", ">i2", ">f4", "<f8", ">u8"] {
            let bytes = encode_header(&[5, 6, 7], dtype(descr), &space, &[1, 2, 3], 352);
            assert_eq!(bytes.len(), 352);
            assert_eq!(&bytes[348..352], &[0, 0, 0, 0]);
            let header = decode_header(&bytes).unwrap();
            assert_eq!(header.dims, [7, 6, 5]);
            assert_eq!(header.dtype, dtype(descr));
            assert_eq!(header.vox_offset, 352);
            assert_eq!(header.space.zooms, [0.5, 0.25, 2.0]);
            assert_eq!(header.space.scaling, Some((2.0, -1.0)));
            // Voxel (0,0,0) of the block is NIfTI voxel (3, 2, 1) of the whole.
            let moved = header.space.affine;
            assert_eq!(moved[0][3], 10.0 - 1.5);
            assert_eq!(moved[1][3], -20.0 + 0.5);
            assert_eq!(moved[2][3], 30.0 + 2.0);
        }
        let big = encode_header(&[2, 2], dtype(">u2"), &Space::identity(2), &[0, 0], 352);
        assert_eq!(&big[0..4], &348i32.to_be_bytes());
    }

    #[test]
    fn refusals_say_what_nifti_cannot_hold() {
        let space = Space::identity(3);
        let problem = output_problem(&[4, 4, 4], dtype("<f2"), &space).unwrap();
        assert!(
            problem.contains("f2") && problem.contains("float16"),
            "{problem}"
        );
        let problem = output_problem(&[1; 8], dtype("u1"), &Space::identity(8)).unwrap();
        assert!(problem.contains("at most 7 dimensions"), "{problem}");
        let problem = output_problem(&[4, 4, 40_000], dtype("u1"), &space).unwrap();
        assert!(
            problem.contains("32767") && problem.contains("40000"),
            "{problem}"
        );
        assert_eq!(output_problem(&[4, 4, 32_767], dtype("u1"), &space), None);
    }

    #[test]
    fn decode_refuses_what_is_not_single_file_nifti1() {
        let good = encode_header(
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
        assert!(decode_header(&two).unwrap_err().contains("NIfTI-2"));
        assert!(decode_header(&[0x1f, 0x8b, 8, 0])
            .unwrap_err()
            .contains("gunzip"));
        let mut half = good.clone();
        half[70..72].copy_from_slice(&1536i16.to_le_bytes());
        assert!(decode_header(&half).unwrap_err().contains("float128"));
        let mut offset = good;
        offset[108..112].copy_from_slice(&100f32.to_le_bytes());
        assert!(decode_header(&offset).unwrap_err().contains("vox_offset"));
    }
}
