//! Block files read back without rechunkfs's code: npy and NIfTI-1 headers
//! parsed here by hand from their specifications, HDF5 through libhdf5
//! (the `hdf5` crate). Each reader returns the array's C-order shape, its
//! numpy type string, where the data start, and the data's bytes, so a
//! test compares them with the oracle and a header the reader rejects
//! fails the test.

use std::path::Path;

/// A block file as its format's reader sees it.
#[derive(Debug)]
pub struct ReadBlock {
    /// C order: the last side is the fastest-moving axis in the file.
    pub shape: Vec<u64>,
    /// numpy's type string: `<u2`, `>f4`, `|u1`.
    pub descr: String,
    pub data_offset: u64,
    pub data: Vec<u8>,
    pub file_len: u64,
}

/// Reads `path` as a block file of `extension` (`npy`, `nii`, `h5`);
/// panics, naming the file, when the reader refuses it.
pub fn read_block(path: &Path, extension: &str, dataset: &str) -> ReadBlock {
    try_read_block(path, extension, dataset)
        .unwrap_or_else(|problem| panic!("{}: {problem}", path.display()))
}

/// [`read_block`], with the reader's refusal returned instead of a panic
/// (a fuzzed file may well be refused).
pub fn try_read_block(path: &Path, extension: &str, dataset: &str) -> Result<ReadBlock, String> {
    match extension {
        "npy" => read_npy(path),
        "nii" => read_nifti(path),
        "h5" => read_hdf5(path, dataset),
        other => Err(format!("no reader for .{other} files")),
    }
}

fn read_file(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("reading: {e}"))
}

/// numpy's format, versions 1.0 to 3.0: magic, version, header length
/// (2 bytes in 1.0, 4 after), a dict literal, then the data.
fn read_npy(path: &Path) -> Result<ReadBlock, String> {
    let bytes = read_file(path)?;
    let header = npy_header(&bytes)?;
    let data_offset = header.data_offset as usize;
    Ok(ReadBlock {
        data: bytes[data_offset..].to_vec(),
        file_len: bytes.len() as u64,
        shape: header.shape,
        descr: header.descr,
        data_offset: header.data_offset,
    })
}

/// What an npy header says.
pub struct NpyHeader {
    pub shape: Vec<u64>,
    pub descr: String,
    pub data_offset: u64,
}

/// Parses the npy header at the start of `bytes` (which may end anywhere
/// after the header: the data need not be there).
pub fn npy_header(bytes: &[u8]) -> Result<NpyHeader, String> {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err("no npy magic".into());
    }
    let (header_start, header_len) = match bytes[6] {
        1 => (10, u16::from_le_bytes([bytes[8], bytes[9]]) as usize),
        2 | 3 if bytes.len() >= 12 => (
            12,
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
        ),
        v => return Err(format!("npy version {v}")),
    };
    let data_offset = header_start + header_len;
    let header = std::str::from_utf8(bytes.get(header_start..data_offset).ok_or("short header")?)
        .map_err(|e| format!("header: {e}"))?;
    if data_offset % 64 != 0 || !header.ends_with('\n') {
        return Err(format!(
            "header ends at {data_offset}, not a multiple of 64 ending in a newline"
        ));
    }
    let descr = quoted_value(header, "descr").ok_or("no descr")?;
    if !header.contains("'fortran_order': False") {
        return Err(format!("not C order: {header}"));
    }
    let shape_text = header
        .split("'shape': (")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .ok_or("no shape")?;
    let shape = shape_text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<u64>().map_err(|e| format!("shape {s}: {e}")))
        .collect::<Result<Vec<u64>, String>>()?;
    Ok(NpyHeader {
        shape,
        descr,
        data_offset: data_offset as u64,
    })
}

fn quoted_value(header: &str, key: &str) -> Option<String> {
    let rest = header.split(&format!("'{key}': '")).nth(1)?;
    Some(rest.split('\'').next()?.to_string())
}

/// NIfTI-1: a 348-byte header (in either byte order, which `sizeof_hdr`
/// tells), dims x-fastest, the data at `vox_offset`.
fn read_nifti(path: &Path) -> Result<ReadBlock, String> {
    let bytes = read_file(path)?;
    if bytes.len() < 352 {
        return Err(format!(
            "{} bytes: shorter than a NIfTI-1 header",
            bytes.len()
        ));
    }
    let little = i32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes")) == 348;
    let big = i32::from_be_bytes(bytes[0..4].try_into().expect("4 bytes")) == 348;
    if !little && !big {
        return Err("sizeof_hdr is not 348".into());
    }
    let i16_at = |at: usize| {
        let pair = [bytes[at], bytes[at + 1]];
        if little {
            i16::from_le_bytes(pair)
        } else {
            i16::from_be_bytes(pair)
        }
    };
    let four: [u8; 4] = bytes[108..112].try_into().expect("4 bytes");
    let vox_offset = if little {
        f32::from_le_bytes(four)
    } else {
        f32::from_be_bytes(four)
    };
    if &bytes[344..348] != b"n+1\0" {
        return Err("magic is not n+1".into());
    }
    let ndim = i16_at(40);
    if !(1..=7).contains(&ndim) {
        return Err(format!("dim[0] = {ndim}"));
    }
    let mut shape: Vec<u64> = (1..=ndim as usize)
        .map(|a| i16_at(40 + 2 * a) as u64)
        .collect();
    shape.reverse();
    let (kind, size) = match i16_at(70) {
        2 => ("u", 1),
        256 => ("i", 1),
        4 => ("i", 2),
        512 => ("u", 2),
        8 => ("i", 4),
        768 => ("u", 4),
        1024 => ("i", 8),
        1280 => ("u", 8),
        16 => ("f", 4),
        64 => ("f", 8),
        code => return Err(format!("datatype {code}")),
    };
    if i16_at(72) != size * 8 {
        return Err(format!("bitpix {} for a {size}-byte type", i16_at(72)));
    }
    let order = match (size, little) {
        (1, _) => "|",
        (_, true) => "<",
        (_, false) => ">",
    };
    let data_offset = vox_offset as usize;
    if vox_offset.fract() != 0.0 || data_offset < 352 || data_offset > bytes.len() {
        return Err(format!("vox_offset {vox_offset}"));
    }
    Ok(ReadBlock {
        data: bytes[data_offset..].to_vec(),
        file_len: bytes.len() as u64,
        shape,
        descr: format!("{order}{kind}{size}"),
        data_offset: data_offset as u64,
    })
}

/// HDF5 through libhdf5: the dataset's shape and type as the library
/// reports them, and its bytes where the library says a contiguous
/// dataset's data lie.
fn read_hdf5(path: &Path, dataset: &str) -> Result<ReadBlock, String> {
    let file = hdf5::File::open(path).map_err(|e| format!("libhdf5 open: {e}"))?;
    let data = file
        .dataset(dataset)
        .map_err(|e| format!("libhdf5 dataset {dataset}: {e}"))?;
    let shape: Vec<u64> = data.shape().iter().map(|&n| n as u64).collect();
    let dtype = data.dtype().map_err(|e| format!("libhdf5 type: {e}"))?;
    let size = dtype.size();
    let kind = match dtype
        .to_descriptor()
        .map_err(|e| format!("libhdf5 type: {e}"))?
    {
        hdf5::types::TypeDescriptor::Integer(_) => "i",
        hdf5::types::TypeDescriptor::Unsigned(_) => "u",
        hdf5::types::TypeDescriptor::Float(_) => "f",
        other => return Err(format!("type {other:?}")),
    };
    let order = match (size, dtype.byte_order()) {
        (1, _) => "|",
        (_, hdf5::datatype::ByteOrder::LittleEndian) => "<",
        (_, hdf5::datatype::ByteOrder::BigEndian) => ">",
        (_, other) => return Err(format!("byte order {other:?}")),
    };
    let offset = data
        .offset()
        .ok_or("not a contiguous dataset with its data allocated")?;
    let len = shape.iter().product::<u64>() as usize * size;
    drop(data);
    drop(file);
    let bytes = read_file(path)?;
    let end = offset as usize + len;
    if end > bytes.len() {
        return Err(format!(
            "data end at {end}, past the file's {} bytes",
            bytes.len()
        ));
    }
    Ok(ReadBlock {
        data: bytes[offset as usize..end].to_vec(),
        file_len: bytes.len() as u64,
        shape,
        descr: format!("{order}{kind}{size}"),
        data_offset: offset,
    })
}
