//! HDF5 block files: probing inputs, reading boxes of chunked ones through
//! libhdf5, the byte template of contiguous output files, and whole
//! gzip-compressed output files ([`DeflateEncoder`]).
//!
//! rechunkfs moves bytes, never values, so every path here keeps libhdf5 from
//! converting: the probe maps the file's own datatype (byte order included)
//! to a [`DType`], [`Hdf5BlockReader`] reads with the file's type as the
//! memory type, and templates are built with the exact type the data carry.
//! Files are opened without a sieve buffer, which would otherwise serve stale
//! bytes after another writer changes the file. libhdf5 is not thread-safe;
//! every raw call here runs under hdf5-metno's process-wide lock, the one
//! its own high-level calls take.

use std::ffi::{c_void, CStr, CString};
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};

use ::hdf5::sync::sync;
use hdf5_sys::h5::{herr_t, hsize_t, HADDR_UNDEF};
use hdf5_sys::h5d::{
    H5D_alloc_time_t, H5D_fill_time_t, H5D_layout_t, H5Dclose, H5Dcreate2, H5Dget_offset,
    H5Dget_space, H5Dread, H5Dwrite,
};
use hdf5_sys::h5f::{
    H5F_scope_t, H5Fclose, H5Fcreate, H5Fflush, H5Fget_file_image, H5F_ACC_EXCL, H5F_ACC_TRUNC,
};
use hdf5_sys::h5i::hid_t;
use hdf5_sys::h5p::{
    H5Pclose, H5Pcreate, H5Pset_alignment, H5Pset_alloc_time, H5Pset_chunk,
    H5Pset_create_intermediate_group, H5Pset_deflate, H5Pset_fapl_core, H5Pset_fill_time,
    H5Pset_layout, H5Pset_obj_track_times, H5P_DEFAULT,
};
use hdf5_sys::h5s::{H5S_seloper_t, H5Sclose, H5Screate_simple, H5Sselect_hyperslab, H5S_ALL};
use hdf5_sys::h5t::{
    H5T_class_t, H5T_norm_t, H5T_order_t, H5T_sign_t, H5Tclose, H5Tcopy, H5Tget_class,
    H5Tget_ebias, H5Tget_fields, H5Tget_norm, H5Tget_offset, H5Tget_order, H5Tget_precision,
    H5Tget_sign, H5Tget_size, H5Tset_ebias, H5Tset_fields, H5Tset_size,
};

use super::block::{shape_problem, shape_text, BlockInfo, BlockTemplate, Storage};
use super::encoding::{BlockEncode, Compression};
use super::traits::{Dataset, FormatTraits};
use crate::array::dtype::{DType, Endian, Kind};
use crate::array::space::Space;
use crate::error::{Error, Result};

/// The element types rechunkfs carries, for refusals.
const CARRIED_TYPES: &str =
    "rechunkfs carries only u1..u8, i1..i8, f2, f4 and f8 in either byte order";

/// Learn an HDF5 file's dataset shape, dtype and where its bytes are.
pub(super) fn probe(path: &Path, dataset: &str) -> Result<BlockInfo> {
    sync(|| {
        let OpenedDataset {
            data,
            shape,
            dtype,
            data_len,
            file_len,
            ..
        } = open_checked(path, dataset)?;
        let storage = match data.offset() {
            Some(data_offset) => {
                let needed_len = data_offset.saturating_add(data_len);
                if file_len < needed_len {
                    return Err(Error::BadBlockFile {
                        path: path.to_path_buf(),
                        format: "HDF5",
                        problem: format!(
                            "truncated: dataset '{dataset}' is {} of {} = {data_len} bytes stored \
                             contiguously from offset {data_offset}, so the file needs {needed_len} bytes, \
                             but it has only {file_len}",
                            shape_text(&shape),
                            dtype.numpy_descr()
                        ),
                    });
                }
                Storage::Contiguous { data_offset }
            }
            None => Storage::Hdf5Dataset {
                dataset: dataset.to_owned(),
            },
        };
        Ok(BlockInfo {
            shape,
            dtype,
            storage,
        })
    })
}

/// A dataset opened and checked: a supported dtype and a sane shape.
struct OpenedDataset {
    data: ::hdf5::Dataset,
    file_type: ::hdf5::Datatype,
    shape: Vec<u64>,
    dtype: DType,
    data_len: u64,
    file_len: u64,
}

/// Opens `dataset` in `path` and checks what `probe` and the reader both
/// rely on. Call with the library lock held. The dataset keeps its file
/// open after the file handle is dropped.
fn open_checked(path: &Path, dataset: &str) -> Result<OpenedDataset> {
    let file_len = std::fs::metadata(path)
        .map_err(|e| Error::io(path, "stat", e))?
        .len();
    let file = open_file(path, file_len)?;
    let data = open_dataset(&file, path, dataset)?;
    let shape = dataset_shape(&data, path, dataset)?;
    let file_type = data
        .dtype()
        .map_err(|e| library_error(path, "get the datatype of", dataset, e))?;
    let dtype =
        dtype_of(file_type.id()).map_err(|found| unsupported_type(path, dataset, &found))?;
    let data_len = shape_problem(&shape, dtype)
        .map_err(|problem| Error::bad_input(path, format!("dataset '{dataset}': {problem}")))?;
    Ok(OpenedDataset {
        data,
        file_type,
        shape,
        dtype,
        data_len,
        file_len,
    })
}

/// Open read-only, without the sieve buffer, explaining failures in terms of
/// the file rather than libhdf5's call stack.
fn open_file(path: &Path, file_len: u64) -> Result<::hdf5::File> {
    ::hdf5::File::with_options()
        .with_fapl(|fapl| fapl.sieve_buf_size(0))
        .open(path)
        .map_err(|error| {
            let bad_file = |problem: String| Error::BadBlockFile {
                path: path.to_path_buf(),
                format: "HDF5",
                problem,
            };
            let message = error.to_string();
            if file_len == 0 {
                bad_file("the file is empty".into())
            } else if error.contains_minor(::hdf5::MinorErrorCode::NotHdf5) {
                bad_file("libhdf5 finds no HDF5 signature in it".into())
            } else if let Some(detail) = truncation_detail(&error) {
                bad_file(detail)
            } else {
                Error::Hdf5 {
                    path: path.to_path_buf(),
                    message: format!("cannot open the file: {message}"),
                }
            }
        })
}

/// libhdf5 refuses to open a file shorter than its superblock says, with a
/// message like `truncated file: eof = 2048, sblock->base_addr = 0,
/// stored_eof = 526336`; say that in words.
fn truncation_detail(error: &::hdf5::Error) -> Option<String> {
    let stack = error.stack()?;
    let frame = stack
        .iter()
        .find(|frame| frame.desc().starts_with("truncated file"))?;
    let number_after = |key: &str| -> Option<u64> {
        let start = frame.desc().find(key)? + key.len();
        let digits: String = frame.desc()[start..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    };
    Some(
        match (number_after("eof = "), number_after("stored_eof = ")) {
            (Some(actual), Some(expected)) => {
                format!("truncated: its superblock says it is {expected} bytes long, but it has only {actual}")
            }
            _ => format!("truncated: {}", frame.desc()),
        },
    )
}

/// Open `dataset`, or explain what the file holds instead.
fn open_dataset(file: &::hdf5::File, path: &Path, dataset: &str) -> Result<::hdf5::Dataset> {
    file.dataset(dataset)
        .map_err(|error| Error::bad_input(path, describe_missing_dataset(file, dataset, &error)))
}

/// Why `dataset` cannot be opened, listing the members of the deepest group
/// on its path that does exist, so a mistyped name is easy to correct.
fn describe_missing_dataset(file: &::hdf5::File, dataset: &str, error: &::hdf5::Error) -> String {
    let mut group: ::hdf5::Group = (**file).clone();
    let mut reached = String::from("/");
    for component in dataset.split('/').filter(|c| !c.is_empty()) {
        if !group.link_exists(component) {
            break;
        }
        match group.group(component) {
            Ok(inner) => {
                group = inner;
                reached.push_str(component);
                reached.push('/');
            }
            // The link exists and is no group: a dataset libhdf5 cannot
            // open, a dangling link, or another kind of object.
            Err(_) => return format!("libhdf5 cannot open '{dataset}' as a dataset: {error}"),
        }
    }
    let members = group.member_names().unwrap_or_default();
    let listed: Vec<String> = members
        .iter()
        .take(20)
        .map(|name| {
            if group.group(name).is_ok() {
                format!("{name}/")
            } else {
                name.clone()
            }
        })
        .collect();
    let more = if members.len() > listed.len() {
        format!(" and {} more", members.len() - listed.len())
    } else {
        String::new()
    };
    let holds = if listed.is_empty() {
        "nothing".to_owned()
    } else {
        format!("{}{more}", listed.join(", "))
    };
    if reached.trim_end_matches('/')
        == format!("/{}", dataset.trim_matches('/')).trim_end_matches('/')
    {
        format!("'{dataset}' is a group, not a dataset; it holds {holds} (name the dataset with --dataset)")
    } else {
        format!("it has no dataset '{dataset}'; {reached} holds {holds} (name the dataset with --dataset)")
    }
}

fn dataset_shape(data: &::hdf5::Dataset, path: &Path, dataset: &str) -> Result<Vec<u64>> {
    let space = data
        .space()
        .map_err(|e| library_error(path, "get the dataspace of", dataset, e))?;
    Ok(space
        .shape()
        .into_iter()
        .map(|extent| extent as u64)
        .collect())
}

fn library_error(path: &Path, action: &str, dataset: &str, error: ::hdf5::Error) -> Error {
    Error::Hdf5 {
        path: path.to_path_buf(),
        message: format!("cannot {action} dataset '{dataset}': {error}"),
    }
}

fn unsupported_type(path: &Path, dataset: &str, found: &str) -> Error {
    Error::UnsupportedDtype(format!(
        "{}: dataset '{dataset}' holds {found}; {CARRIED_TYPES}",
        path.display()
    ))
}

/// The DType whose bytes an HDF5 datatype stores, or what the type is
/// instead, in words. Anything but plain IEEE floats and full-width
/// integers is refused: their bytes would not mean what the DType says.
fn dtype_of(type_id: hid_t) -> std::result::Result<DType, String> {
    // SAFETY: `type_id` is an open datatype (the caller holds its handle),
    // these calls only inspect it, and the caller holds the library lock.
    let (class, size, order, precision, bit_offset) = unsafe {
        (
            H5Tget_class(type_id),
            H5Tget_size(type_id),
            H5Tget_order(type_id),
            H5Tget_precision(type_id),
            H5Tget_offset(type_id),
        )
    };
    let kind = kind_of_class(type_id, class)?;
    let kind_name = match kind {
        Kind::Unsigned => "unsigned integers",
        Kind::Signed => "signed integers",
        Kind::Float => "floats",
    };
    let endian = match order {
        H5T_order_t::H5T_ORDER_LE => Endian::Little,
        H5T_order_t::H5T_ORDER_BE => Endian::Big,
        H5T_order_t::H5T_ORDER_NONE if size == 1 => Endian::Little,
        H5T_order_t::H5T_ORDER_VAX => {
            return Err(format!("{size}-byte {kind_name} in VAX byte order"))
        }
        _ => {
            return Err(format!(
                "{size}-byte {kind_name} in mixed or unknown byte order"
            ))
        }
    };
    let dtype =
        DType::new(kind, size, endian).map_err(|_| format!("{kind_name} of {size} bytes"))?;
    if precision != size * 8 || bit_offset != 0 {
        return Err(format!(
            "{precision}-bit {kind_name} padded to {size} bytes (at bit offset {bit_offset})"
        ));
    }
    if kind == Kind::Float {
        check_ieee_float(type_id, size)?;
    }
    Ok(dtype)
}

/// The kind of number a datatype of `class` holds, or what it holds
/// instead, in words.
fn kind_of_class(type_id: hid_t, class: H5T_class_t) -> std::result::Result<Kind, String> {
    match class {
        H5T_class_t::H5T_INTEGER => {
            // SAFETY: as in `dtype_of`.
            match unsafe { H5Tget_sign(type_id) } {
                H5T_sign_t::H5T_SGN_NONE => Ok(Kind::Unsigned),
                _ => Ok(Kind::Signed),
            }
        }
        H5T_class_t::H5T_FLOAT => Ok(Kind::Float),
        H5T_class_t::H5T_ENUM => Err("an enum type (h5py stores booleans as one)".into()),
        H5T_class_t::H5T_COMPOUND => {
            Err("a compound type (records; h5py stores complex numbers as one)".into())
        }
        H5T_class_t::H5T_STRING => Err("strings".into()),
        H5T_class_t::H5T_BITFIELD => Err("a bitfield type".into()),
        H5T_class_t::H5T_OPAQUE => Err("an opaque type".into()),
        H5T_class_t::H5T_REFERENCE => Err("object references".into()),
        H5T_class_t::H5T_VLEN => Err("variable-length sequences".into()),
        H5T_class_t::H5T_ARRAY => Err("an array type (several values per element)".into()),
        H5T_class_t::H5T_TIME => Err("a time type".into()),
        _ => Err("a datatype of a class libhdf5 did not name".into()),
    }
}

/// Refuses a float datatype of `size` bytes whose fields are not IEEE
/// binary16, binary32 or binary64's.
fn check_ieee_float(type_id: hid_t, size: usize) -> std::result::Result<(), String> {
    let (mut sign_pos, mut exp_pos, mut exp_bits, mut mant_pos, mut mant_bits) = (0, 0, 0, 0, 0);
    // SAFETY: as in `dtype_of`; the out-pointers are to live locals.
    let (fields_status, exp_bias, norm) = unsafe {
        (
            H5Tget_fields(
                type_id,
                &mut sign_pos,
                &mut exp_pos,
                &mut exp_bits,
                &mut mant_pos,
                &mut mant_bits,
            ),
            H5Tget_ebias(type_id),
            H5Tget_norm(type_id),
        )
    };
    let ieee = match size {
        2 => (15, 10, 5, 0, 10, 15),
        4 => (31, 23, 8, 0, 23, 127),
        _ => (63, 52, 11, 0, 52, 1023),
    };
    if fields_status < 0
        || (sign_pos, exp_pos, exp_bits, mant_pos, mant_bits, exp_bias) != ieee
        || norm != H5T_norm_t::H5T_NORM_IMPLIED
    {
        return Err(format!(
            "non-IEEE {}-bit floats (sign bit {sign_pos}, {exp_bits} exponent bits at {exp_pos} \
             biased by {exp_bias}, {mant_bits} mantissa bits at {mant_pos})",
            size * 8
        ));
    }
    Ok(())
}

/// An identifier from a raw libhdf5 call, closed when dropped.
struct OwnedId {
    id: hid_t,
    close: unsafe extern "C" fn(hid_t) -> herr_t,
}

impl OwnedId {
    /// Take ownership of what a libhdf5 constructor returned, or report its
    /// failure (a negative identifier) with the library's own message.
    fn new(id: hid_t, close: unsafe extern "C" fn(hid_t) -> herr_t) -> ::hdf5::Result<OwnedId> {
        ::hdf5::h5check(id).map(|id| OwnedId { id, close })
    }

    /// Close now, reporting failure, where closing finishes work (a file).
    fn close(self) -> ::hdf5::Result<()> {
        let (id, close) = (self.id, self.close);
        std::mem::forget(self);
        // SAFETY: `id` is open and owned by us; forgetting `self` stops a second close.
        sync(|| ::hdf5::h5check(unsafe { close(id) })).map(drop)
    }
}

/// A dataspace of `shape` (fixed size).
///
/// # Safety
/// The library lock must be held.
unsafe fn simple_space(shape: &[u64]) -> ::hdf5::Result<OwnedId> {
    OwnedId::new(
        H5Screate_simple(
            shape.len() as i32,
            shape.as_ptr() as *const hsize_t,
            ptr::null(),
        ),
        H5Sclose,
    )
}

impl Drop for OwnedId {
    fn drop(&mut self) {
        // SAFETY: `id` is open and owned by us. A failed close here has no
        // one to report to and leaks only a library handle.
        sync(|| unsafe { (self.close)(self.id) });
    }
}

/// Reads boxes of one HDF5 dataset into larger C-order buffers, one H5Dread
/// per box, bytes exactly as stored. For datasets the probe could not hand to
/// `pread` (chunked, compressed, compact, not yet allocated).
pub struct Hdf5BlockReader {
    path: PathBuf,
    dataset_name: String,
    dataset: ::hdf5::Dataset,
    /// The dataset's own datatype, used as the memory type so libhdf5 copies
    /// bytes without converting them.
    file_type: ::hdf5::Datatype,
    shape: Vec<u64>,
    dtype: DType,
    /// The most bytes one of its chunks may inflate to (chunked datasets).
    chunk_limit: Option<u64>,
}

impl Hdf5BlockReader {
    pub fn open(path: &Path, dataset: &str) -> Result<Self> {
        sync(|| {
            let OpenedDataset {
                data,
                file_type,
                shape,
                dtype,
                ..
            } = open_checked(path, dataset)?;
            let chunk_limit = data.chunk().map(|chunk| {
                let elements = chunk.iter().map(|&n| n as u64).product::<u64>();
                super::hdf5_deflate::chunk_limit(elements.saturating_mul(dtype.size as u64))
            });
            Ok(Hdf5BlockReader {
                path: path.to_path_buf(),
                dataset_name: dataset.to_owned(),
                dataset: data,
                file_type,
                shape,
                dtype,
                chunk_limit,
            })
        })
    }

    pub fn shape(&self) -> &[u64] {
        &self.shape
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Copy the box `[file_origin, file_origin + box_shape)` of the dataset
    /// into `dest`, a C-order array of shape `dest_shape`, at
    /// `[dest_origin, dest_origin + box_shape)`, with one H5Dread.
    pub fn read_box(
        &self,
        file_origin: &[u64],
        box_shape: &[u64],
        dest: &mut [u8],
        dest_shape: &[u64],
        dest_origin: &[u64],
    ) -> Result<()> {
        self.check_box(file_origin, box_shape, dest.len(), dest_shape, dest_origin)?;
        if box_shape.contains(&0) {
            return Ok(());
        }
        let to_library = |error: ::hdf5::Error| Error::Hdf5 {
            path: self.path.clone(),
            message: format!(
                "cannot read box {} at {} of dataset '{}': {error}",
                shape_text(box_shape),
                shape_text(file_origin),
                self.dataset_name
            ),
        };
        let limit = self.chunk_limit.unwrap_or(u64::MAX);
        let (result, overran) = sync(|| {
            // A chunk is inflated into at most its own size.
            super::hdf5_deflate::bounded(limit, || -> ::hdf5::Result<()> {
                // SAFETY: the dataset is open; every array passed has `rank`
                // elements; check_box has proved both selections lie inside
                // their extents and that `dest` holds exactly `dest_shape`
                // elements of the file type's size, so H5Dread writes only
                // inside `dest`. The lock is held.
                unsafe {
                    let file_space = OwnedId::new(H5Dget_space(self.dataset.id()), H5Sclose)?;
                    select_box(&file_space, file_origin, box_shape)?;
                    let memory_space = simple_space(dest_shape)?;
                    select_box(&memory_space, dest_origin, box_shape)?;
                    ::hdf5::h5check(H5Dread(
                        self.dataset.id(),
                        self.file_type.id(),
                        memory_space.id,
                        file_space.id,
                        H5P_DEFAULT,
                        dest.as_mut_ptr() as *mut c_void,
                    ))?;
                }
                Ok(())
            })
        });
        if overran {
            return Err(Error::BadBlockFile {
                path: self.path.clone(),
                format: "HDF5",
                problem: format!(
                    "a deflated chunk of dataset '{}' inflates to more than the {limit} bytes \
                     a chunk can hold (read at {}); the file is damaged",
                    self.dataset_name,
                    shape_text(file_origin)
                ),
            });
        }
        result.map_err(to_library)
    }

    /// Refuse a box that does not fit the dataset or the destination, or a
    /// destination whose length disagrees with its shape: H5Dread trusts them.
    fn check_box(
        &self,
        file_origin: &[u64],
        box_shape: &[u64],
        dest_len: usize,
        dest_shape: &[u64],
        dest_origin: &[u64],
    ) -> Result<()> {
        let refuse = |problem: String| {
            Err(Error::BadArgument(format!(
                "{}: cannot read box {} at {} of dataset '{}' into {} at {}: {problem}",
                self.path.display(),
                shape_text(box_shape),
                shape_text(file_origin),
                self.dataset_name,
                shape_text(dest_shape),
                shape_text(dest_origin),
            )))
        };
        let rank = self.shape.len();
        if [
            file_origin.len(),
            box_shape.len(),
            dest_shape.len(),
            dest_origin.len(),
        ] != [rank; 4]
        {
            return refuse(format!(
                "the dataset has {rank} dimensions and every argument needs as many"
            ));
        }
        for axis in 0..rank {
            let file_end = file_origin[axis].checked_add(box_shape[axis]);
            if file_end.is_none_or(|end| end > self.shape[axis]) {
                return refuse(format!(
                    "it leaves the dataset's shape {} on axis {axis}",
                    shape_text(&self.shape)
                ));
            }
            let dest_end = dest_origin[axis].checked_add(box_shape[axis]);
            if dest_end.is_none_or(|end| end > dest_shape[axis]) {
                return refuse(format!("it leaves the destination on axis {axis}"));
            }
        }
        let expected_len = dest_shape
            .iter()
            .try_fold(self.dtype.size as u64, |bytes, &extent| {
                bytes.checked_mul(extent)
            });
        if expected_len != Some(dest_len as u64) {
            return refuse(format!(
                "the destination buffer is {dest_len} bytes, but that shape of {} needs {}",
                self.dtype,
                expected_len.map_or("more than 2^64".to_owned(), |len| len.to_string())
            ));
        }
        Ok(())
    }
}

/// Selects the box `[origin, origin + shape)` of dataspace `space`.
///
/// # Safety
/// `space` is a dataspace of rank `origin.len() == shape.len()`, and the
/// library lock is held.
unsafe fn select_box(space: &OwnedId, origin: &[u64], shape: &[u64]) -> ::hdf5::Result<()> {
    ::hdf5::h5check(H5Sselect_hyperslab(
        space.id,
        H5S_seloper_t::H5S_SELECT_SET,
        origin.as_ptr() as *const hsize_t,
        ptr::null(),
        shape.as_ptr() as *const hsize_t,
        ptr::null(),
    ))
    .map(drop)
}

/// A scratch path for building a template, removed when dropped.
struct ScratchPath(PathBuf);

impl ScratchPath {
    fn new() -> ScratchPath {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.subsec_nanos());
        ScratchPath(std::env::temp_dir().join(format!(
            "rechunkfs-template-{}-{}-{nanos}.h5",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        )))
    }
}

impl Drop for ScratchPath {
    fn drop(&mut self) {
        // Nothing to do if it was never created; a leftover in the temp
        // directory is harmless.
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Have libhdf5 write an HDF5 file holding one contiguous dataset whose space
/// is allocated at once and never filled, and take its bytes around the data.
///
/// The data region stays a hole in the scratch file, so even a block of many
/// gigabytes costs only the metadata bytes to build.
pub(super) fn template(
    shape: &[u64],
    dtype: DType,
    dataset: &str,
    data_len: u64,
    alignment: u64,
) -> Result<BlockTemplate> {
    let scratch = ScratchPath::new();
    let data_offset = create_template_file(&scratch.0, shape, dtype, dataset, alignment)?;
    let built = File::open(&scratch.0).map_err(|e| Error::io(&scratch.0, "open", e))?;
    let file_len = built
        .metadata()
        .map_err(|e| Error::io(&scratch.0, "stat", e))?
        .len();
    let data_end = data_offset + data_len;
    if file_len < data_end {
        return Err(Error::Hdf5 {
            path: scratch.0.clone(),
            message: format!(
                "libhdf5 wrote a {file_len}-byte file, but the data of dataset '{dataset}' should end at {data_end}"
            ),
        });
    }
    let read_range = |start: u64, end: u64| -> Result<Vec<u8>> {
        let mut bytes = vec![0u8; (end - start) as usize];
        built
            .read_exact_at(&mut bytes, start)
            .map_err(|e| Error::io(&scratch.0, "read", e))?;
        Ok(bytes)
    };
    Ok(BlockTemplate {
        prefix: read_range(0, data_offset)?,
        data_offset,
        data_len,
        suffix: read_range(data_end, file_len)?,
    })
}

/// Create the file at `path` and return its data offset.
fn create_template_file(
    path: &Path,
    shape: &[u64],
    dtype: DType,
    dataset: &str,
    alignment: u64,
) -> Result<u64> {
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| Error::BadArgument(format!("{}: a path with a NUL byte", path.display())))?;
    let c_dataset = CString::new(dataset)
        .map_err(|_| Error::BadArgument(format!("dataset name {dataset:?} contains a NUL byte")))?;
    let to_library = |error: ::hdf5::Error| Error::Hdf5 {
        path: path.to_path_buf(),
        message: format!(
            "cannot create a template with dataset '{dataset}' of {} {dtype}: {error}",
            shape_text(shape)
        ),
    };
    // SAFETY: the strings are NUL-terminated, `shape` is the dataset's
    // shape, and the lock is held.
    sync(|| unsafe { write_template_file(&c_path, &c_dataset, shape, dtype, alignment) })
        .map_err(to_library)
}

/// Has libhdf5 write the template file at `path` holding `dataset`, and
/// returns the dataset's data offset.
///
/// # Safety
/// The library lock must be held.
unsafe fn write_template_file(
    path: &CStr,
    dataset: &CStr,
    shape: &[u64],
    dtype: DType,
    alignment: u64,
) -> ::hdf5::Result<u64> {
    // Every identifier passed is open (OwnedId closes it only when
    // dropped), and every pointer is to a live NUL-terminated string or a
    // slice of `shape.len()` u64s.
    let (file_create, file_access) = file_properties(alignment)?;
    let file = OwnedId::new(
        H5Fcreate(path.as_ptr(), H5F_ACC_EXCL, file_create.id, file_access.id),
        H5Fclose,
    )?;
    let file_type = OwnedId::new(create_datatype(dtype)?, H5Tclose)?;
    let space = simple_space(shape)?;
    let (dataset_create, link_create) = dataset_properties()?;
    let data = OwnedId::new(
        H5Dcreate2(
            file.id,
            dataset.as_ptr(),
            file_type.id,
            space.id,
            link_create.id,
            dataset_create.id,
            H5P_DEFAULT,
        ),
        H5Dclose,
    )?;
    let data_offset = H5Dget_offset(data.id);
    drop(data);
    file.close()?;
    if data_offset == HADDR_UNDEF {
        return Err("libhdf5 gave the dataset no contiguous storage".into());
    }
    Ok(data_offset)
}

/// The file-creation and file-access property lists of a template.
///
/// # Safety
/// The library lock must be held.
unsafe fn file_properties(alignment: u64) -> ::hdf5::Result<(OwnedId, OwnedId)> {
    // Modification times would make each template, and so each
    // served file, differ from the last.
    let file_create = OwnedId::new(H5Pcreate(*::hdf5::globals::H5P_FILE_CREATE), H5Pclose)?;
    ::hdf5::h5check(H5Pset_obj_track_times(file_create.id, 0))?;
    // Objects of at least `alignment` bytes (the data) start on a
    // multiple of it; smaller metadata stays packed before them.
    let file_access = OwnedId::new(H5Pcreate(*::hdf5::globals::H5P_FILE_ACCESS), H5Pclose)?;
    if alignment > 1 {
        ::hdf5::h5check(H5Pset_alignment(file_access.id, alignment, alignment))?;
    }
    Ok((file_create, file_access))
}

/// The dataset-creation and link-creation property lists of a template.
///
/// # Safety
/// The library lock must be held.
unsafe fn dataset_properties() -> ::hdf5::Result<(OwnedId, OwnedId)> {
    // Contiguous, allocated at creation and never filled: the file
    // has its final size and layout at once, and the data region is
    // one run of bytes that positioned writes can fill.
    let dataset_create = OwnedId::new(H5Pcreate(*::hdf5::globals::H5P_DATASET_CREATE), H5Pclose)?;
    ::hdf5::h5check(H5Pset_layout(
        dataset_create.id,
        H5D_layout_t::H5D_CONTIGUOUS,
    ))?;
    ::hdf5::h5check(H5Pset_alloc_time(
        dataset_create.id,
        H5D_alloc_time_t::H5D_ALLOC_TIME_EARLY,
    ))?;
    ::hdf5::h5check(H5Pset_fill_time(
        dataset_create.id,
        H5D_fill_time_t::H5D_FILL_TIME_NEVER,
    ))?;
    ::hdf5::h5check(H5Pset_obj_track_times(dataset_create.id, 0))?;
    // MINC2-style paths (/minc-2.0/image/0/image) need their groups.
    let link_create = OwnedId::new(H5Pcreate(*::hdf5::globals::H5P_LINK_CREATE), H5Pclose)?;
    ::hdf5::h5check(H5Pset_create_intermediate_group(link_create.id, 1))?;
    Ok((dataset_create, link_create))
}

/// Encodes output blocks as whole HDF5 files whose dataset is chunked, one
/// chunk per block, with the deflate (gzip) filter: libhdf5 builds each
/// file in memory (its core driver, no backing store) and hands back the
/// file's image, which the caller writes in one call.
#[derive(Debug)]
pub struct DeflateEncoder {
    dtype: DType,
    dataset: CString,
    level: u32,
}

/// libhdf5 refuses chunks of 4 GiB or more.
const MAX_CHUNK_BYTES: u64 = (4 << 30) - 1;

impl DeflateEncoder {
    /// Blocks holding `dtype` in `dataset`, deflated at `level` (1-9).
    pub fn new(dtype: DType, dataset: &str, level: u32) -> Result<DeflateEncoder> {
        let dataset = CString::new(dataset).map_err(|_| {
            Error::BadArgument(format!("dataset name {dataset:?} contains a NUL byte"))
        })?;
        Ok(DeflateEncoder {
            dtype,
            dataset,
            level,
        })
    }

    /// Refuses blocks of `shape` that one HDF5 chunk cannot hold.
    pub fn check_block(shape: &[u64], dtype: DType) -> Result<()> {
        let bytes = shape
            .iter()
            .product::<u64>()
            .saturating_mul(dtype.size as u64);
        if bytes > MAX_CHUNK_BYTES {
            return Err(Error::BadArgument(format!(
                "a gzip-compressed HDF5 block is one HDF5 chunk, which libhdf5 limits to 4 GiB, \
                 but a block of {} {dtype} holds {bytes} bytes; choose a smaller --shape",
                shape_text(shape)
            )));
        }
        Ok(())
    }
}

impl BlockEncode for DeflateEncoder {
    fn encode(&self, path: &Path, shape: &[u64], raw: Vec<u8>) -> Result<Vec<u8>> {
        Self::check_block(shape, self.dtype)?;
        let expected = shape.iter().product::<u64>() * self.dtype.size as u64;
        if raw.len() as u64 != expected {
            return Err(Error::BadOutput {
                path: path.to_path_buf(),
                problem: format!("{} bytes for a block of {expected}", raw.len()),
            });
        }
        // SAFETY: the dataset name is NUL-terminated, `raw` holds exactly
        // the dataset's bytes, and the lock is held.
        sync(|| unsafe { deflated_image(&self.dataset, shape, self.dtype, self.level, &raw) })
            .map_err(|error| Error::Hdf5 {
                path: path.to_path_buf(),
                message: format!(
                    "cannot write a gzip-compressed dataset of {} {}: {error}",
                    shape_text(shape),
                    self.dtype
                ),
            })
    }

    fn describe(&self) -> String {
        format!("HDF5 deflate level {}", self.level)
    }
}

/// The image of an HDF5 file holding `dataset` of `shape` and `dtype`,
/// one chunk deflated at `level`, with `data` as its bytes (written with
/// the file's own type, so libhdf5 copies and never converts).
///
/// # Safety
/// The library lock must be held, and `data` must hold the whole dataset.
unsafe fn deflated_image(
    dataset: &CStr,
    shape: &[u64],
    dtype: DType,
    level: u32,
    data: &[u8],
) -> ::hdf5::Result<Vec<u8>> {
    let (file_create, file_access) = file_properties(1)?;
    // In memory only: the image is taken before closing, never written.
    ::hdf5::h5check(H5Pset_fapl_core(file_access.id, 1 << 20, 0))?;
    let name = CString::new("block.h5").map_err(|e| e.to_string())?;
    let file = OwnedId::new(
        H5Fcreate(name.as_ptr(), H5F_ACC_TRUNC, file_create.id, file_access.id),
        H5Fclose,
    )?;
    let file_type = OwnedId::new(create_datatype(dtype)?, H5Tclose)?;
    let space = simple_space(shape)?;
    let (dataset_create, link_create) = deflate_properties(shape, level)?;
    let written = OwnedId::new(
        H5Dcreate2(
            file.id,
            dataset.as_ptr(),
            file_type.id,
            space.id,
            link_create.id,
            dataset_create.id,
            H5P_DEFAULT,
        ),
        H5Dclose,
    )?;
    ::hdf5::h5check(H5Dwrite(
        written.id,
        file_type.id,
        H5S_ALL,
        H5S_ALL,
        H5P_DEFAULT,
        data.as_ptr().cast(),
    ))?;
    drop(written);
    ::hdf5::h5check(H5Fflush(file.id, H5F_scope_t::H5F_SCOPE_GLOBAL))?;
    let len = ::hdf5::h5check(H5Fget_file_image(file.id, ptr::null_mut(), 0))?;
    let mut image = vec![0u8; len as usize];
    let got = ::hdf5::h5check(H5Fget_file_image(
        file.id,
        image.as_mut_ptr().cast(),
        image.len(),
    ))?;
    image.truncate(got as usize);
    file.close()?;
    Ok(image)
}

/// The dataset-creation and link-creation property lists of a deflated
/// dataset of `shape`: one chunk, the whole dataset.
///
/// # Safety
/// The library lock must be held.
unsafe fn deflate_properties(shape: &[u64], level: u32) -> ::hdf5::Result<(OwnedId, OwnedId)> {
    let dataset_create = OwnedId::new(H5Pcreate(*::hdf5::globals::H5P_DATASET_CREATE), H5Pclose)?;
    ::hdf5::h5check(H5Pset_chunk(
        dataset_create.id,
        shape.len() as i32,
        shape.as_ptr() as *const hsize_t,
    ))?;
    ::hdf5::h5check(H5Pset_deflate(dataset_create.id, level))?;
    ::hdf5::h5check(H5Pset_obj_track_times(dataset_create.id, 0))?;
    let link_create = OwnedId::new(H5Pcreate(*::hdf5::globals::H5P_LINK_CREATE), H5Pclose)?;
    ::hdf5::h5check(H5Pset_create_intermediate_group(link_create.id, 1))?;
    Ok((dataset_create, link_create))
}

/// A new datatype identifier for exactly `dtype`, byte order included.
///
/// # Safety
/// The library lock must be held.
unsafe fn create_datatype(dtype: DType) -> ::hdf5::Result<hid_t> {
    use ::hdf5::globals::*;
    let big = dtype.endian == Endian::Big;
    let pick = |little: &::hdf5::globals::H5GlobalConstant,
                big_endian: &::hdf5::globals::H5GlobalConstant| {
        if big {
            **big_endian
        } else {
            **little
        }
    };
    let standard = match (dtype.kind, dtype.size) {
        (Kind::Unsigned, 1) => pick(&H5T_STD_U8LE, &H5T_STD_U8BE),
        (Kind::Unsigned, 2) => pick(&H5T_STD_U16LE, &H5T_STD_U16BE),
        (Kind::Unsigned, 4) => pick(&H5T_STD_U32LE, &H5T_STD_U32BE),
        (Kind::Unsigned, 8) => pick(&H5T_STD_U64LE, &H5T_STD_U64BE),
        (Kind::Signed, 1) => pick(&H5T_STD_I8LE, &H5T_STD_I8BE),
        (Kind::Signed, 2) => pick(&H5T_STD_I16LE, &H5T_STD_I16BE),
        (Kind::Signed, 4) => pick(&H5T_STD_I32LE, &H5T_STD_I32BE),
        (Kind::Signed, 8) => pick(&H5T_STD_I64LE, &H5T_STD_I64BE),
        // libhdf5 1.10 predefines no half float; derive IEEE binary16 from
        // binary32 the way h5py does, so h5py and numpy read it as float16.
        (Kind::Float, 2) => {
            let half = ::hdf5::h5check(H5Tcopy(pick(&H5T_IEEE_F32LE, &H5T_IEEE_F32BE)))?;
            let shaped = ::hdf5::h5check(H5Tset_fields(half, 15, 10, 5, 0, 10))
                .and_then(|_| ::hdf5::h5check(H5Tset_size(half, 2)))
                .and_then(|_| ::hdf5::h5check(H5Tset_ebias(half, 15)));
            if let Err(error) = shaped {
                H5Tclose(half);
                return Err(error);
            }
            return Ok(half);
        }
        (Kind::Float, 4) => pick(&H5T_IEEE_F32LE, &H5T_IEEE_F32BE),
        (Kind::Float, 8) => pick(&H5T_IEEE_F64LE, &H5T_IEEE_F64BE),
        _ => return Err(format!("no HDF5 type for {dtype}").into()),
    };
    ::hdf5::h5check(H5Tcopy(standard))
}

/// HDF5's row of the format table: read and written, its array in the
/// dataset `--dataset` names, gzip its one compressor.
pub(super) const TRAITS: FormatTraits = FormatTraits {
    name: "HDF5",
    extension: "h5",
    input_extensions: &["h5", "hdf5"],
    probe: Ok(probe),
    template: Ok(template_of),
    dataset: Dataset::Named,
    comparable_headers: true,
    cache_probes: true,
    compression: Compression::Gzip,
    ..FormatTraits::NONE
};

/// [`template`] as the format table calls it (HDF5 records no space).
fn template_of(
    shape: &[u64],
    dtype: DType,
    dataset: &str,
    data_len: u64,
    alignment: u64,
    _space: &Space,
) -> Result<BlockTemplate> {
    template(shape, dtype, dataset, data_len, alignment)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::test_python::{python_with, run_python};
    use crate::format::{probe as probe_any, template as template_any, BlockFormat};

    fn dtype(text: &str) -> DType {
        text.parse().unwrap()
    }

    /// Bytes that differ from element to element and from byte to byte.
    fn pattern(len: u64) -> Vec<u8> {
        (0..len).map(|i| (i * 31 + i / 251) as u8).collect()
    }

    fn write_block(
        path: &Path,
        shape: &[u64],
        descr: &str,
        dataset: &str,
    ) -> (BlockTemplate, Vec<u8>) {
        let template = template_any(BlockFormat::Hdf5, shape, dtype(descr), dataset).unwrap();
        let data = pattern(template.data_len);
        let file = template.create_file(path).unwrap();
        file.write_all_at(&data, template.data_offset).unwrap();
        (template, data)
    }

    const SHAPES: [&[u64]; 5] = [&[7], &[7, 5], &[7, 5, 3], &[2, 3, 4, 5], &[64, 64, 64]];
    const DESCRS: [&str; 10] = [
        "|u1", "|i1", "<u2", ">u2", "<i4", ">u8", "<f2", ">f2", ">f4", "<f8",
    ];

    #[test]
    fn template_is_deterministic_and_sized_as_designed() {
        let cube = template_any(BlockFormat::Hdf5, &[64, 64, 64], dtype("<u2"), "/data").unwrap();
        assert_eq!(cube.data_offset, 2048);
        assert_eq!(cube.data_len, 64 * 64 * 64 * 2);
        assert!(cube.suffix.is_empty());
        assert_eq!(cube.file_len(), 2048 + 524_288);
        assert_eq!(&cube.prefix[..8], b"\x89HDF\r\n\x1a\n");
        for shape in SHAPES {
            for descr in DESCRS {
                let first = template_any(BlockFormat::Hdf5, shape, dtype(descr), "data").unwrap();
                let second = template_any(BlockFormat::Hdf5, shape, dtype(descr), "data").unwrap();
                assert_eq!(first, second, "{shape:?} {descr}");
            }
        }
        let slash = template_any(BlockFormat::Hdf5, &[7, 5, 3], dtype("<u2"), "/data").unwrap();
        let plain = template_any(BlockFormat::Hdf5, &[7, 5, 3], dtype("<u2"), "data").unwrap();
        assert_eq!(slash, plain);

        // Groups on a MINC2 path: libhdf5 1.10 wrote them after the data
        // (the template's suffix carries such bytes); 1.14, linked in now,
        // writes them before. Either way the template is deterministic.
        let minc_path = "/minc-2.0/image/0/image";
        let minc = template_any(BlockFormat::Hdf5, &[7, 5, 3], dtype("<u2"), minc_path).unwrap();
        assert_eq!(
            minc,
            template_any(BlockFormat::Hdf5, &[7, 5, 3], dtype("<u2"), minc_path).unwrap()
        );
    }

    #[test]
    fn filled_templates_read_back_exactly_through_libhdf5() {
        let dir = tempfile::tempdir().unwrap();
        for (index, shape) in SHAPES.iter().enumerate() {
            for (descr_index, descr) in DESCRS.iter().copied().enumerate() {
                let path = dir.path().join(format!("{index}_{descr_index}.h5"));
                let (template, data) = write_block(&path, shape, descr, "data");

                let info = probe_any(&path, BlockFormat::Hdf5, "data").unwrap();
                assert_eq!(info.shape, *shape);
                assert_eq!(info.dtype, dtype(descr));
                assert_eq!(
                    info.storage,
                    Storage::Contiguous {
                        data_offset: template.data_offset
                    }
                );

                let reader = Hdf5BlockReader::open(&path, "data").unwrap();
                let mut whole = vec![0u8; data.len()];
                let origin = vec![0; shape.len()];
                reader
                    .read_box(&origin, shape, &mut whole, shape, &origin)
                    .unwrap();
                assert!(whole == data, "{path:?}: read_box differs");

                // libhdf5's own reading, converting to native order.
                let file = ::hdf5::File::open(&path).unwrap();
                let stored = file.dataset("data").unwrap();
                assert_eq!(
                    stored.shape(),
                    shape.iter().map(|&e| e as usize).collect::<Vec<_>>()
                );
                if descr == ">u2" {
                    let values: Vec<u16> = stored.read_raw().unwrap();
                    let expected: Vec<u16> = data
                        .chunks(2)
                        .map(|b| u16::from_be_bytes([b[0], b[1]]))
                        .collect();
                    assert_eq!(values, expected);
                }
                if descr == ">f4" {
                    let values: Vec<f32> = stored.read_raw().unwrap();
                    let expected: Vec<u32> = data
                        .chunks(4)
                        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
                        .collect();
                    assert_eq!(
                        values.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        expected
                    );
                }
                if descr == "<f2" {
                    let values: Vec<f32> = stored.read_raw().unwrap();
                    for (value, bytes) in values.iter().zip(data.chunks(2)) {
                        let expected = f16_to_f32(u16::from_le_bytes([bytes[0], bytes[1]]));
                        assert!(
                            *value == expected || value.is_nan() && expected.is_nan(),
                            "{value} vs {expected}"
                        );
                    }
                }
            }
        }
    }

    /// IEEE binary16 to binary32, to check libhdf5 reads our half floats as such.
    fn f16_to_f32(bits: u16) -> f32 {
        let sign = if bits & 0x8000 != 0 { -1.0 } else { 1.0 };
        let exponent = i32::from((bits >> 10) & 0x1f);
        let mantissa = f32::from(bits & 0x3ff);
        sign * match exponent {
            0 => mantissa * 2f32.powi(-24),
            31 if mantissa == 0.0 => f32::INFINITY,
            31 => f32::NAN,
            _ => (1.0 + mantissa / 1024.0) * 2f32.powi(exponent - 15),
        }
    }

    #[test]
    fn read_box_places_a_box_inside_a_larger_buffer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("box.h5");
        let shape = [7u64, 5, 3];
        let (_, data) = write_block(&path, &shape, ">u2", "/data");
        let reader = Hdf5BlockReader::open(&path, "/data").unwrap();
        assert_eq!(reader.shape(), shape);
        assert_eq!(reader.dtype(), dtype(">u2"));

        let (file_origin, box_shape) = ([2u64, 1, 1], [3u64, 4, 2]);
        let (dest_shape, dest_origin) = ([4u64, 6, 5], [1u64, 2, 3]);
        let mut dest = vec![0xEEu8; 4 * 6 * 5 * 2];
        reader
            .read_box(
                &file_origin,
                &box_shape,
                &mut dest,
                &dest_shape,
                &dest_origin,
            )
            .unwrap();
        let element = |index: [u64; 3], dims: [u64; 3]| {
            ((index[0] * dims[1] + index[1]) * dims[2] + index[2]) as usize * 2
        };
        for i in 0..dest_shape[0] {
            for j in 0..dest_shape[1] {
                for k in 0..dest_shape[2] {
                    let at = element([i, j, k], dest_shape);
                    let inside = [(i, 0), (j, 1), (k, 2)].iter().all(|&(x, axis)| {
                        x >= dest_origin[axis] && x < dest_origin[axis] + box_shape[axis]
                    });
                    let expected = if inside {
                        let source = [
                            i - dest_origin[0] + file_origin[0],
                            j - dest_origin[1] + file_origin[1],
                            k - dest_origin[2] + file_origin[2],
                        ];
                        let from = element(source, shape);
                        [data[from], data[from + 1]]
                    } else {
                        [0xEE, 0xEE]
                    };
                    assert_eq!(dest[at..at + 2], expected, "at {i},{j},{k}");
                }
            }
        }

        let mut short = vec![0u8; 10];
        let err = reader
            .read_box(
                &file_origin,
                &box_shape,
                &mut short,
                &dest_shape,
                &dest_origin,
            )
            .unwrap_err()
            .to_string();
        assert!(err.contains("10 bytes") && err.contains("240"), "{err}");
        let err = reader
            .read_box(&[5, 0, 0], &box_shape, &mut dest, &dest_shape, &dest_origin)
            .unwrap_err()
            .to_string();
        assert!(err.contains("leaves the dataset"), "{err}");
        let err = reader
            .read_box(&file_origin, &box_shape, &mut dest, &dest_shape, &[2, 2, 3])
            .unwrap_err()
            .to_string();
        assert!(err.contains("leaves the destination"), "{err}");
        let err = reader
            .read_box(&[0, 0], &[1, 1], &mut dest, &dest_shape, &dest_origin)
            .unwrap_err()
            .to_string();
        assert!(err.contains("3 dimensions"), "{err}");
        reader
            .read_box(&[0, 0, 0], &[0, 4, 2], &mut dest, &dest_shape, &dest_origin)
            .unwrap();
    }

    #[test]
    fn h5py_reads_templates_byte_exact() {
        if !python_with("h5py") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let mut cases = Vec::new();
        for (index, shape) in SHAPES.iter().enumerate() {
            for (descr_index, descr) in DESCRS.iter().copied().enumerate() {
                let path = dir.path().join(format!("{index}_{descr_index}.h5"));
                let (_, data) = write_block(&path, shape, descr, "data");
                cases.push((path, "data", descr, shape.to_vec(), data));
            }
        }
        let nested = dir.path().join("minc.h5");
        let (_, data) = write_block(&nested, &[7, 5, 3], ">i2", "/minc-2.0/image/0/image");
        cases.push((
            nested,
            "/minc-2.0/image/0/image",
            ">i2",
            vec![7, 5, 3],
            data,
        ));

        let mut arguments = Vec::new();
        for (path, dataset, ..) in &cases {
            arguments.push(path.as_os_str());
            arguments.push(std::ffi::OsStr::new(dataset));
        }
        // h5py writes what it reads next to each file; stdout says how it typed it.
        let output = run_python(
            "import h5py, sys\n\
             for path, dataset in zip(sys.argv[1::2], sys.argv[2::2]):\n\
             \x20   with h5py.File(path, 'r') as f: a = f[dataset][...]\n\
             \x20   open(path + '.bytes', 'wb').write(a.tobytes())\n\
             \x20   print(a.dtype.str, list(a.shape))\n",
            &arguments,
        );
        let lines: Vec<&str> = std::str::from_utf8(&output).unwrap().lines().collect();
        assert_eq!(lines.len(), cases.len());
        for (line, (path, _, descr, shape, data)) in lines.iter().zip(&cases) {
            assert_eq!(*line, format!("{descr} {shape:?}"), "{path:?}");
            let read = std::fs::read(format!("{}.bytes", path.display())).unwrap();
            assert!(read == *data, "{path:?}: h5py read different bytes");
        }
    }

    #[test]
    fn probe_tells_contiguous_from_library_storage() {
        if !python_with("h5py") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        run_python(
            "import h5py, numpy as np, sys, os\n\
             d = sys.argv[1]\n\
             a = np.arange(7 * 5 * 3, dtype='>u2').reshape(7, 5, 3)\n\
             with h5py.File(os.path.join(d, 'contiguous.h5'), 'w') as f: f['data'] = a\n\
             with h5py.File(os.path.join(d, 'userblock.h5'), 'w', userblock_size=512) as f: f['data'] = a\n\
             with h5py.File(os.path.join(d, 'chunked.h5'), 'w') as f: f.create_dataset('data', data=a, chunks=(2, 2, 2), compression='gzip')\n\
             with h5py.File(os.path.join(d, 'unallocated.h5'), 'w') as f: f.create_dataset('data', shape=(7, 5, 3), dtype='<f4')\n\
             with h5py.File(os.path.join(d, 'minc.h5'), 'w') as f: f['/minc-2.0/image/0/image'] = a\n",
            &[dir.path()],
        );
        let u16be = dtype(">u2");
        let contiguous = probe(&dir.path().join("contiguous.h5"), "data").unwrap();
        assert_eq!(
            (contiguous.shape.as_slice(), contiguous.dtype),
            (&[7, 5, 3][..], u16be)
        );
        let Storage::Contiguous { data_offset } = contiguous.storage else {
            panic!("{contiguous:?}")
        };
        let bytes = std::fs::read(dir.path().join("contiguous.h5")).unwrap();
        let expected: Vec<u8> = (0..105u16).flat_map(u16::to_be_bytes).collect();
        assert_eq!(
            bytes[data_offset as usize..data_offset as usize + 210],
            expected[..]
        );

        let userblock = probe(&dir.path().join("userblock.h5"), "/data").unwrap();
        let Storage::Contiguous { data_offset } = userblock.storage else {
            panic!("{userblock:?}")
        };
        let bytes = std::fs::read(dir.path().join("userblock.h5")).unwrap();
        assert_eq!(
            bytes[data_offset as usize..data_offset as usize + 210],
            expected[..]
        );

        for (name, dataset, descr) in [
            ("chunked.h5", "data", ">u2"),
            ("unallocated.h5", "data", "<f4"),
        ] {
            let info = probe(&dir.path().join(name), dataset).unwrap();
            assert_eq!(info.dtype, dtype(descr));
            assert_eq!(
                info.storage,
                Storage::Hdf5Dataset {
                    dataset: dataset.to_owned()
                },
                "{name}"
            );
        }
        let minc = probe(&dir.path().join("minc.h5"), "/minc-2.0/image/0/image").unwrap();
        assert!(matches!(minc.storage, Storage::Contiguous { .. }));

        // Chunked and compressed data arrive through libhdf5 unconverted.
        let reader = Hdf5BlockReader::open(&dir.path().join("chunked.h5"), "data").unwrap();
        let mut dest = vec![0u8; 210];
        reader
            .read_box(&[0, 0, 0], &[7, 5, 3], &mut dest, &[7, 5, 3], &[0, 0, 0])
            .unwrap();
        assert_eq!(dest, expected);
        let mut part = vec![0u8; 2 * 2 * 2 * 2];
        reader
            .read_box(&[1, 2, 1], &[2, 2, 2], &mut part, &[2, 2, 2], &[0, 0, 0])
            .unwrap();
        let values: Vec<u16> = part
            .chunks(2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]))
            .collect();
        assert_eq!(values, [22, 23, 25, 26, 37, 38, 40, 41]);
    }

    #[test]
    fn probe_refusals_name_the_file_and_the_problem() {
        let dir = tempfile::tempdir().unwrap();
        let whole = dir.path().join("whole.h5");
        let (template, _) = write_block(&whole, &[64, 64, 64], "<u2", "data");
        let bytes = std::fs::read(&whole).unwrap();
        let cut = dir.path().join("cut.h5");
        std::fs::write(&cut, &bytes[..template.data_offset as usize + 1000]).unwrap();
        let text = dir.path().join("text.h5");
        std::fs::write(&text, b"this is not an HDF5 file at all, just some text").unwrap();
        let empty = dir.path().join("empty.h5");
        std::fs::write(&empty, b"").unwrap();

        let cases = [
            (
                &cut,
                "data",
                "truncated: its superblock says it is 526336 bytes long, but it has only 3048",
            ),
            (&text, "data", "no HDF5 signature"),
            (&empty, "data", "empty"),
            (&whole, "image", "no dataset 'image'; / holds data"),
            (&whole, "/a/b", "no dataset '/a/b'; / holds data"),
            (&whole, "/", "'/' is a group, not a dataset; it holds data"),
        ];
        for (path, dataset, expected) in cases {
            let message = probe(path, dataset).unwrap_err().to_string();
            assert!(message.starts_with(path.to_str().unwrap()), "{message}");
            assert!(message.contains(expected), "{dataset}: {message}");
        }
        let missing = dir.path().join("missing.h5");
        assert!(matches!(probe(&missing, "data"), Err(Error::Io { .. })));

        if !python_with("h5py") {
            return;
        }
        run_python(
            "import h5py, numpy as np, sys, os\n\
             d = sys.argv[1]\n\
             with h5py.File(os.path.join(d, 'kinds.h5'), 'w') as f:\n\
             \x20   f['complex'] = np.zeros(4, 'c8')\n\
             \x20   f['bool'] = np.zeros(4, bool)\n\
             \x20   f['text'] = np.array([b'ab', b'cd'])\n\
             \x20   f['scalar'] = np.float32(1)\n\
             \x20   f['longdouble'] = np.zeros(3, np.longdouble)\n\
             \x20   f.create_group('grp')['inner'] = np.zeros(3, 'u1')\n",
            &[dir.path()],
        );
        let kinds = dir.path().join("kinds.h5");
        for (dataset, expected) in [
            ("complex", "compound type"),
            ("bool", "enum type"),
            ("text", "strings"),
            ("scalar", "0-dimensional"),
            ("longdouble", "floats of 16 bytes"),
            ("grp", "'grp' is a group, not a dataset; it holds inner"),
            ("grp/nope", "no dataset 'grp/nope'; /grp/ holds inner"),
            (
                "nope",
                "/ holds bool, complex, grp/, longdouble, scalar, text",
            ),
        ] {
            let message = probe(&kinds, dataset).unwrap_err().to_string();
            assert!(message.starts_with(kinds.to_str().unwrap()), "{message}");
            assert!(message.contains(expected), "{dataset}: {message}");
        }
        assert_eq!(probe(&kinds, "grp/inner").unwrap().shape, [3]);
    }
}

#[cfg(test)]
mod alignment_tests {
    use super::super::{template_aligned, BlockFormat, VIEW_DATA_ALIGNMENT};

    #[test]
    fn view_templates_put_data_on_its_own_page() {
        for format in [BlockFormat::Hdf5, BlockFormat::Npy] {
            for shape in [[64u64, 64, 64], [7, 50, 13]] {
                let t = template_aligned(
                    format,
                    &shape,
                    "<u2".parse().unwrap(),
                    "/data",
                    VIEW_DATA_ALIGNMENT,
                )
                .unwrap();
                assert_eq!(
                    t.data_offset % VIEW_DATA_ALIGNMENT,
                    0,
                    "{format:?} {shape:?}"
                );
                assert!(t.data_offset >= VIEW_DATA_ALIGNMENT);
            }
        }
    }
}
