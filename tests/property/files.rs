//! Naive writers and readers of each block-file format, from the formats'
//! own specifications (numpy's npy 1.0, NIfTI-1, Zarr v2 and v3) or
//! through libhdf5 itself, sharing nothing with rechunkfs's format code.
//! Readers return what the file declares (shape, type, byte order) beside
//! its data, so the caller checks the declaration as well as the bytes.

use std::fs;
use std::path::Path;

use hdf5_sys::h5d::{H5Dread, H5Dwrite};
use hdf5_sys::h5p::H5P_DEFAULT;
use hdf5_sys::h5s::H5S_ALL;
use hdf5_sys::h5t::{
    H5Tcopy, H5Tget_ebias, H5Tget_fields, H5Tset_ebias, H5Tset_fields, H5Tset_size,
};
use serde_json::json;

use super::naive::Elem;

// ---------------------------------------------------------------- npy

/// An npy file, version 1.0, as numpy writes it: magic, version, a
/// little-endian u16 header length, the header dict padded with spaces
/// and a newline so the data start at a multiple of 64 bytes.
pub fn write_npy(path: &Path, shape: &[u64], elem: Elem, data: &[u8]) {
    let sides: Vec<String> = shape.iter().map(u64::to_string).collect();
    let shape_text = if shape.len() == 1 {
        format!("({},)", sides[0])
    } else {
        format!("({})", sides.join(", "))
    };
    let mut dict = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {shape_text}, }}",
        elem.descr()
    );
    let preamble = 10;
    while (preamble + dict.len() + 1) % 64 != 0 {
        dict.push(' ');
    }
    dict.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    bytes.extend_from_slice(dict.as_bytes());
    bytes.extend_from_slice(data);
    fs::write(path, bytes).unwrap();
}

/// What an npy file declares, and its data.
#[derive(Debug)]
pub struct Npy {
    pub descr: String,
    pub fortran_order: bool,
    pub shape: Vec<u64>,
    pub data: Vec<u8>,
}

/// Reads an npy file of version 1.0, 2.0 or 3.0 by the format's rules.
pub fn read_npy(path: &Path) -> Npy {
    let bytes = fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&bytes[..6], b"\x93NUMPY", "{}: npy magic", path.display());
    let (header_len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        v => panic!("{}: npy version {v}", path.display()),
    };
    let header = std::str::from_utf8(&bytes[start..start + header_len]).unwrap();
    assert!(
        header.ends_with('\n'),
        "{}: header {header:?}",
        path.display()
    );
    let after = |key: &str| -> &str {
        let at = header
            .find(&format!("'{key}'"))
            .unwrap_or_else(|| panic!("{}: no {key} in {header:?}", path.display()));
        let rest = &header[at + key.len() + 2..];
        rest.trim_start().strip_prefix(':').unwrap().trim_start()
    };
    let descr_text = after("descr");
    let quote = descr_text.chars().next().unwrap();
    let descr = descr_text[1..descr_text[1..].find(quote).unwrap() + 1].to_string();
    let fortran_order = after("fortran_order").starts_with("True");
    let shape_text = after("shape");
    let inner = &shape_text[1..shape_text.find(')').unwrap()];
    let shape = inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect();
    Npy {
        descr,
        fortran_order,
        shape,
        data: bytes[start + header_len..].to_vec(),
    }
}

// ---------------------------------------------------------------- NIfTI-1

/// NIfTI-1 datatype codes (nifti1.h).
pub fn nifti_datatype(elem: Elem) -> Option<i16> {
    Some(match (elem.kind, elem.size) {
        ('u', 1) => 2,
        ('i', 2) => 4,
        ('i', 4) => 8,
        ('f', 4) => 16,
        ('f', 8) => 64,
        ('i', 1) => 256,
        ('u', 2) => 512,
        ('u', 4) => 768,
        ('i', 8) => 1024,
        ('u', 8) => 1280,
        // NIfTI-1 defines no 16-bit float.
        _ => return None,
    })
}

/// The byte offsets of the NIfTI-1 header fields used here (nifti1.h).
mod field {
    pub const SIZEOF_HDR: usize = 0;
    pub const REGULAR: usize = 38;
    pub const DIM: usize = 40;
    pub const DATATYPE: usize = 70;
    pub const BITPIX: usize = 72;
    pub const PIXDIM: usize = 76;
    pub const VOX_OFFSET: usize = 108;
    pub const SFORM_CODE: usize = 254;
    pub const SROW: usize = 280;
    pub const MAGIC: usize = 344;
}

/// A single-file NIfTI-1 image (`.nii`) of a block of C-order `shape`
/// whose first element is at C-order `origin` of the whole array: the
/// 348-byte header in the element's byte order, the 4-byte extension flag
/// (zero), then the data at 352. NIfTI lists the sides x first, x being
/// the fastest axis, so `dim[]` is the C shape reversed; the sform places
/// the block in a whole array of unit voxels at the world origin.
pub fn write_nifti(path: &Path, shape: &[u64], origin: &[u64], elem: Elem, data: &[u8]) {
    let mut h = vec![0u8; 352];
    let big = elem.big;
    let put16 = |h: &mut Vec<u8>, at: usize, v: i16| {
        let b = if big {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        };
        h[at..at + 2].copy_from_slice(&b);
    };
    let put32 = |h: &mut Vec<u8>, at: usize, b: [u8; 4]| h[at..at + 4].copy_from_slice(&b);
    let int32 = |v: i32| {
        if big {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        }
    };
    let float32 = |v: f32| {
        if big {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        }
    };
    let ndim = shape.len();
    put32(&mut h, field::SIZEOF_HDR, int32(348));
    h[field::REGULAR] = b'r';
    put16(&mut h, field::DIM, ndim as i16);
    for axis in 0..7 {
        let side = if axis < ndim {
            shape[ndim - 1 - axis]
        } else {
            1
        };
        put16(&mut h, field::DIM + 2 + 2 * axis, side as i16);
    }
    put16(&mut h, field::DATATYPE, nifti_datatype(elem).unwrap());
    put16(&mut h, field::BITPIX, (elem.size * 8) as i16);
    for i in 0..8 {
        put32(&mut h, field::PIXDIM + 4 * i, float32(1.0));
    }
    put32(&mut h, field::VOX_OFFSET, float32(352.0));
    put16(&mut h, field::SFORM_CODE, 1);
    for row in 0..3 {
        for col in 0..4 {
            let value = if col == row {
                1.0
            } else if col == 3 && row < ndim {
                origin[ndim - 1 - row] as f32
            } else {
                0.0
            };
            put32(&mut h, field::SROW + 16 * row + 4 * col, float32(value));
        }
    }
    h[field::MAGIC..field::MAGIC + 4].copy_from_slice(b"n+1\0");
    h.extend_from_slice(data);
    fs::write(path, h).unwrap();
}

/// Gzips the file at `path` in place as two gzip members one after the
/// other (as `cat a.gz b.gz` makes), split in the middle of its bytes.
pub fn gzip_in_two_members(path: &Path) {
    use std::io::Write;
    let bytes = fs::read(path).unwrap();
    let (first, second) = bytes.split_at(bytes.len() / 2);
    let mut gzipped = Vec::new();
    for part in [first, second] {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(part).unwrap();
        gzipped.extend(encoder.finish().unwrap());
    }
    fs::write(path, gzipped).unwrap();
}

/// What a NIfTI-1 header declares, and the data at its `vox_offset`.
#[derive(Debug)]
pub struct Nifti {
    /// The header is big-endian (its `sizeof_hdr` reads 348 that way).
    pub big: bool,
    /// `dim[1..=dim[0]]`: x first.
    pub dims: Vec<u64>,
    pub datatype: i16,
    pub bitpix: i16,
    pub vox_offset: f32,
    pub sform_code: i16,
    pub srow: [[f32; 4]; 3],
    pub data: Vec<u8>,
}

pub fn read_nifti(path: &Path) -> Nifti {
    let bytes = fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let head: [u8; 4] = bytes[0..4].try_into().unwrap();
    let big = match (i32::from_le_bytes(head), i32::from_be_bytes(head)) {
        (348, _) => false,
        (_, 348) => true,
        _ => panic!("{}: sizeof_hdr is not 348", path.display()),
    };
    let i16_at = |at: usize| {
        let b = [bytes[at], bytes[at + 1]];
        if big {
            i16::from_be_bytes(b)
        } else {
            i16::from_le_bytes(b)
        }
    };
    let f32_at = |at: usize| {
        let b: [u8; 4] = bytes[at..at + 4].try_into().unwrap();
        if big {
            f32::from_be_bytes(b)
        } else {
            f32::from_le_bytes(b)
        }
    };
    assert_eq!(
        &bytes[field::MAGIC..field::MAGIC + 4],
        b"n+1\0",
        "{}",
        path.display()
    );
    let ndim = i16_at(field::DIM) as usize;
    assert!((1..=7).contains(&ndim), "{}: dim[0] {ndim}", path.display());
    let dims = (0..ndim)
        .map(|axis| i16_at(field::DIM + 2 + 2 * axis) as u64)
        .collect();
    let vox_offset = f32_at(field::VOX_OFFSET);
    let mut srow = [[0f32; 4]; 3];
    for (row, values) in srow.iter_mut().enumerate() {
        for (col, value) in values.iter_mut().enumerate() {
            *value = f32_at(field::SROW + 16 * row + 4 * col);
        }
    }
    Nifti {
        big,
        dims,
        datatype: i16_at(field::DATATYPE),
        bitpix: i16_at(field::BITPIX),
        vox_offset,
        sform_code: i16_at(field::SFORM_CODE),
        srow,
        data: bytes[vox_offset as usize..].to_vec(),
    }
}

// ---------------------------------------------------------------- Zarr

/// The metadata of a Zarr array (v2 `.zarray` or v3 `zarr.json`) with
/// chunks named with `separator`, uncompressed or `compressed` (v2: Blosc
/// lz4 with shuffle; v3: zstd then crc32c); returns the metadata file's
/// name.
pub fn zarr_metadata(
    v3: bool,
    shape: &[u64],
    chunks: &[u64],
    elem: Elem,
    separator: char,
    compressed: bool,
) -> (&'static str, String) {
    let value = if v3 {
        let mut bytes_codec = json!({ "name": "bytes" });
        if elem.size > 1 {
            bytes_codec["configuration"] =
                json!({ "endian": if elem.big { "big" } else { "little" } });
        }
        let mut codecs = vec![bytes_codec];
        if compressed {
            codecs.push(
                json!({ "name": "zstd", "configuration": { "level": 1, "checksum": false } }),
            );
            codecs.push(json!({ "name": "crc32c" }));
        }
        json!({
            "zarr_format": 3,
            "node_type": "array",
            "shape": shape,
            "data_type": elem.zarr3_name(),
            "chunk_grid": { "name": "regular", "configuration": { "chunk_shape": chunks } },
            "chunk_key_encoding": {
                "name": "default",
                "configuration": { "separator": separator.to_string() }
            },
            "fill_value": 0,
            "codecs": codecs,
            "attributes": {},
        })
    } else {
        json!({
            "zarr_format": 2,
            "shape": shape,
            "chunks": chunks,
            "dtype": elem.descr(),
            "compressor": if compressed {
                json!({ "id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1, "blocksize": 0 })
            } else {
                serde_json::Value::Null
            },
            "fill_value": 0,
            "order": "C",
            "filters": null,
            "dimension_separator": separator.to_string(),
        })
    };
    let name = if v3 { "zarr.json" } else { ".zarray" };
    (name, serde_json::to_string_pretty(&value).unwrap())
}

/// A full chunk's bytes `raw` (C order, in the array's byte order),
/// encoded with the codecs of the array whose metadata is `metadata`:
/// what zarr-python would store, by zarrs's encoders (which take native
/// elements, so big-endian ones are swapped to native first).
pub fn zarr_encode(metadata: &str, raw: &[u8], elem: Elem) -> Vec<u8> {
    use zarrs::array::codec::{ArrayToBytesCodecTraits, CodecOptions};
    use zarrs::array::{Array, ArrayBytes, ArrayMetadata};
    let metadata: ArrayMetadata = serde_json::from_str(metadata).unwrap();
    let store = std::sync::Arc::new(zarrs::storage::store::MemoryStore::new());
    let array = Array::new_with_metadata(store, "/", metadata).unwrap();
    let origin = vec![0; array.dimensionality()];
    let representation = array.chunk_array_representation(&origin).unwrap();
    let mut native = raw.to_vec();
    if elem.big && elem.size > 1 {
        native.chunks_exact_mut(elem.size).for_each(<[u8]>::reverse);
    }
    array
        .codecs()
        .encode(
            ArrayBytes::new_flen(native),
            &representation,
            &CodecOptions::default(),
        )
        .unwrap()
        .into_owned()
}

/// Where a chunk of grid `index` lives in a Zarr array: v2 `i.j.k`, v3
/// with the default encoding `c/i/j/k` (the separator may be `.` or `/`
/// in either).
pub fn zarr_chunk_key(v3: bool, index: &[u64], separator: char) -> String {
    let parts: Vec<String> = index.iter().map(u64::to_string).collect();
    let joined = parts.join(&separator.to_string());
    if v3 {
        format!("c{separator}{joined}")
    } else {
        joined
    }
}

// ---------------------------------------------------------------- HDF5

/// The HDF5 datatype of exactly `elem`, byte order included. A 16-bit
/// float is IEEE binary16 derived from binary32, as h5py makes it.
fn h5_type(elem: Elem) -> hdf5::Datatype {
    use hdf5::globals::*;
    let base = |little: &H5GlobalConstant, big: &H5GlobalConstant| {
        if elem.big {
            **big
        } else {
            **little
        }
    };
    hdf5::sync::sync(|| {
        // SAFETY: the library lock is held; each call gets a valid type id.
        let id = unsafe {
            match (elem.kind, elem.size) {
                ('u', 1) => H5Tcopy(*H5T_STD_U8LE),
                ('i', 1) => H5Tcopy(*H5T_STD_I8LE),
                ('u', 2) => H5Tcopy(base(&H5T_STD_U16LE, &H5T_STD_U16BE)),
                ('i', 2) => H5Tcopy(base(&H5T_STD_I16LE, &H5T_STD_I16BE)),
                ('u', 4) => H5Tcopy(base(&H5T_STD_U32LE, &H5T_STD_U32BE)),
                ('i', 4) => H5Tcopy(base(&H5T_STD_I32LE, &H5T_STD_I32BE)),
                ('u', 8) => H5Tcopy(base(&H5T_STD_U64LE, &H5T_STD_U64BE)),
                ('i', 8) => H5Tcopy(base(&H5T_STD_I64LE, &H5T_STD_I64BE)),
                ('f', 4) => H5Tcopy(base(&H5T_IEEE_F32LE, &H5T_IEEE_F32BE)),
                ('f', 8) => H5Tcopy(base(&H5T_IEEE_F64LE, &H5T_IEEE_F64BE)),
                ('f', 2) => {
                    let id = H5Tcopy(base(&H5T_IEEE_F32LE, &H5T_IEEE_F32BE));
                    assert!(H5Tset_fields(id, 15, 10, 5, 0, 10) >= 0);
                    assert!(H5Tset_size(id, 2) >= 0);
                    assert!(H5Tset_ebias(id, 15) >= 0);
                    id
                }
                other => panic!("no HDF5 type for {other:?}"),
            }
        };
        assert!(id >= 0, "H5Tcopy");
        // SAFETY: `id` is a fresh datatype whose only handle this becomes.
        unsafe { hdf5::from_id::<hdf5::Datatype>(id) }.unwrap()
    })
}

/// An HDF5 file holding `/data` of `shape` and exactly type `elem`,
/// contiguous, or chunked in `chunk` (optionally deflated). The bytes are
/// written with the file's own type as the memory type, so libhdf5 stores
/// them unconverted.
pub fn write_h5(
    path: &Path,
    shape: &[u64],
    elem: Elem,
    data: &[u8],
    chunk: Option<&[u64]>,
    deflate: bool,
) {
    let file = hdf5::File::create(path).unwrap();
    let dtype = h5_type(elem);
    let sides: Vec<usize> = shape.iter().map(|&s| s as usize).collect();
    let mut builder = file.new_dataset_builder().empty_as(&dtype).shape(sides);
    if let Some(chunk) = chunk {
        builder = builder.chunk(chunk.iter().map(|&c| c as usize).collect::<Vec<_>>());
        if deflate {
            builder = builder.deflate(4);
        }
    }
    let dataset = builder.create("data").unwrap();
    hdf5::sync::sync(|| {
        // SAFETY: the library lock is held; `data` holds the whole dataset
        // in the memory type given, which is the file's own.
        let status = unsafe {
            H5Dwrite(
                dataset.id(),
                dtype.id(),
                H5S_ALL,
                H5S_ALL,
                H5P_DEFAULT,
                data.as_ptr().cast(),
            )
        };
        assert!(status >= 0, "H5Dwrite {}", path.display());
    });
}

/// What an HDF5 file's `/data` declares, and its bytes as stored.
#[derive(Debug)]
pub struct H5 {
    pub shape: Vec<u64>,
    /// `u`, `i` or `f`, and the size, from libhdf5's description of the type.
    pub kind: char,
    pub size: usize,
    pub big: bool,
    /// For a 16-bit float: (sign, exponent position and size, mantissa
    /// position and size, exponent bias).
    pub half_fields: Option<[usize; 6]>,
    /// Read through libhdf5 in the file's own type (no conversion).
    pub data: Vec<u8>,
    /// Where the data lie in the file when stored contiguously.
    pub offset: Option<u64>,
}

pub fn read_h5(path: &Path) -> H5 {
    use hdf5::types::{FloatSize, IntSize, TypeDescriptor};
    let file = hdf5::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let dataset = file.dataset("data").unwrap();
    let dtype = dataset.dtype().unwrap();
    let int_size = |s: IntSize| s as usize;
    let (kind, size) = match dtype.to_descriptor().unwrap() {
        TypeDescriptor::Unsigned(s) => ('u', int_size(s)),
        TypeDescriptor::Integer(s) => ('i', int_size(s)),
        TypeDescriptor::Float(FloatSize::U2) => ('f', 2),
        TypeDescriptor::Float(FloatSize::U4) => ('f', 4),
        TypeDescriptor::Float(FloatSize::U8) => ('f', 8),
        other => panic!("{}: type {other:?}", path.display()),
    };
    let big = match dtype.byte_order() {
        hdf5::datatype::ByteOrder::BigEndian => true,
        hdf5::datatype::ByteOrder::LittleEndian => false,
        // libhdf5 gives one-byte types no order.
        hdf5::datatype::ByteOrder::None if size == 1 => false,
        other => panic!("{}: byte order {other:?}", path.display()),
    };
    let half_fields = (kind == 'f' && size == 2).then(|| {
        hdf5::sync::sync(|| {
            let (mut s, mut e, mut es, mut m, mut ms) = (0, 0, 0, 0, 0);
            // SAFETY: the library lock is held, the type is open, and the
            // out-pointers are live locals.
            unsafe {
                assert!(H5Tget_fields(dtype.id(), &mut s, &mut e, &mut es, &mut m, &mut ms) >= 0);
                [s, e, es, m, ms, H5Tget_ebias(dtype.id())]
            }
        })
    });
    let shape: Vec<u64> = dataset.shape().iter().map(|&s| s as u64).collect();
    let mut data = vec![0u8; shape.iter().product::<u64>() as usize * size];
    hdf5::sync::sync(|| {
        // SAFETY: the library lock is held; `data` holds the whole dataset
        // in its own type.
        let status = unsafe {
            H5Dread(
                dataset.id(),
                dtype.id(),
                H5S_ALL,
                H5S_ALL,
                H5P_DEFAULT,
                data.as_mut_ptr().cast(),
            )
        };
        assert!(status >= 0, "H5Dread {}", path.display());
    });
    H5 {
        shape,
        kind,
        size,
        big,
        half_fields,
        data,
        offset: dataset.offset(),
    }
}
