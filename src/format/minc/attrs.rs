//! Reading MINC2's HDF5 attributes and naming its fixed paths: shared by
//! the image's description (`minc/mod.rs`) and its scaled values
//! (`minc/scaled.rs`).

use std::ffi::c_void;
use std::path::Path;

use ::hdf5::types::{TypeDescriptor, VarLenAscii, VarLenUnicode};
use hdf5_sys::h5a::H5Aread;

use crate::array::dtype::{DType, Kind};
use crate::error::Error;

/// Where a MINC2 file keeps its image.
pub const IMAGE: &str = "/minc-2.0/image/0/image";
pub(super) const IMAGE_GROUP: &str = "/minc-2.0/image/0";

/// The error of a libhdf5 call reading `what` of the file at `path`.
pub(super) fn library_error(path: &Path, what: &str, error: ::hdf5::Error) -> Error {
    Error::Hdf5 {
        path: path.to_path_buf(),
        message: format!("cannot read {what}: {error}"),
    }
}

/// The most bytes a string attribute may hold.
const MAX_STRING_ATTR: usize = 1 << 20;

/// A string attribute, fixed-length (as libminc writes them) or
/// variable-length (as h5py writes Python strings); `None` if absent.
pub(super) fn string_attr(
    location: &::hdf5::Location,
    name: &str,
) -> ::hdf5::Result<Option<String>> {
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
pub(super) fn numbers_attr(
    location: &::hdf5::Location,
    name: &str,
) -> ::hdf5::Result<Option<Vec<f64>>> {
    if !location.attr_names()?.iter().any(|n| n == name) {
        return Ok(None);
    }
    location.attr(name)?.read_raw::<f64>().map(Some)
}

/// The least and greatest values of an integer dtype, nibabel's default
/// valid range.
pub(super) fn dtype_range(dtype: DType) -> (f64, f64) {
    let bits = (dtype.size * 8) as i32;
    match dtype.kind {
        Kind::Unsigned => (0.0, 2f64.powi(bits) - 1.0),
        _ => (-(2f64.powi(bits - 1)), 2f64.powi(bits - 1) - 1.0),
    }
}
