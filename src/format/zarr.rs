//! Zarr arrays (v2 and v3): reading an array's metadata so its chunks can
//! be input blocks, and writing the metadata that makes a directory of
//! rechunked chunks (uncompressed, compressed or sharded) a Zarr array.
//!
//! An uncompressed Zarr chunk is the raw C-order array of one full chunk,
//! with no header: edge chunks are padded to the whole chunk shape. The
//! dtype, with its byte order, lives in the metadata (v2 `dtype` like
//! `">u2"`; v3 `data_type` plus the `bytes` codec's `endian`), so bytes are
//! moved as they are and never swapped. Compressed and sharded chunks are
//! decoded whole by [`BlockDecoder`] into those same bytes. Refused, naming
//! the metadata file and the problem: codecs and filters that are not
//! decoded, Fortran order, chunk grids other than the regular one, and
//! groups (which hold arrays but are not one).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::block::{shape_problem, shape_text, BlockFormat};
use super::encoding::{Compression, Compressor, Encoding};
use super::traits::{data_only_template, BlockNames, FormatTraits, PyramidKind};
use super::zarr_codecs::BlockDecoder;
use crate::array::dtype::{DType, Endian, Kind};
use crate::array::names::ChunkKey;
use crate::error::{Error, Result};

/// Zarr v2's array metadata file.
pub const ZARRAY: &str = ".zarray";
/// Zarr v2's group metadata file.
const ZGROUP: &str = ".zgroup";
/// Zarr v3's metadata file (arrays and groups).
pub const ZARR_JSON: &str = "zarr.json";

const CARRIED: &str = "rechunkfs carries u1..u8, i1..i8, f2, f4 and f8 in either byte order";

/// What an array's metadata says, as far as rechunkfs needs it.
#[derive(Clone, Debug, PartialEq)]
pub struct ZarrArrayMeta {
    pub format: BlockFormat,
    /// The metadata file it was read from.
    pub path: PathBuf,
    pub shape: Vec<u64>,
    pub chunks: Vec<u64>,
    pub dtype: DType,
    /// One element of the fill value, in the array's byte order: what an
    /// absent chunk holds.
    pub fill: Vec<u8>,
    pub key: ChunkKey,
    /// How to decode a chunk, for compressed or sharded arrays; `None`
    /// when chunks are raw bytes, read in place.
    pub decoder: Option<Arc<BlockDecoder>>,
}

/// Whether `dir` is a Zarr array or group: its metadata file, if any.
fn metadata_file(dir: &Path) -> Option<PathBuf> {
    [ZARR_JSON, ZARRAY, ZGROUP]
        .iter()
        .map(|name| dir.join(name))
        .find(|path| path.is_file())
}

/// Reads the metadata of the Zarr array in `dir`; `None` when `dir` holds
/// no Zarr metadata at all. A group, or an array rechunkfs cannot read
/// byte for byte, is refused with the reason.
pub fn read_metadata(dir: &Path) -> Result<Option<ZarrArrayMeta>> {
    let Some(path) = metadata_file(dir) else {
        return Ok(None);
    };
    let bytes = fs::read(&path).map_err(|e| Error::io(&path, "reading", e))?;
    let value: Value = serde_json::from_slice(&bytes)
        .map_err(|e| Error::bad_input(&path, format!("is not valid JSON: {e}")))?;
    let Value::Object(meta) = value else {
        return Err(Error::bad_input(&path, "is not a JSON object"));
    };
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let is_group = name == ZGROUP
        || (name == ZARR_JSON && meta.get("node_type").and_then(Value::as_str) == Some("group"));
    if is_group {
        return Err(Error::bad_input(dir, group_refusal(dir)));
    }
    let (mut parsed, codecs) = if name == ZARR_JSON {
        parse_v3(&path, &meta)?
    } else {
        parse_v2(&path, &meta)?
    };
    if let Some(names) = codecs {
        let decoder = BlockDecoder::new(
            &path,
            &bytes,
            &parsed.chunks,
            parsed.dtype,
            &parsed.fill,
            names,
        )?;
        parsed.decoder = Some(Arc::new(decoder));
    }
    Ok(Some(parsed))
}

/// Why a group cannot be rechunked, listing the arrays it holds.
fn group_refusal(dir: &Path) -> String {
    let mut arrays = Vec::new();
    arrays_below(dir, "", &mut arrays);
    arrays.sort();
    let holds = if arrays.is_empty() {
        "it holds no arrays".to_string()
    } else {
        let more = if arrays.len() > 20 { ", ..." } else { "" };
        format!(
            "pick one of its arrays with --array: {}{more}",
            arrays[..arrays.len().min(20)].join(", ")
        )
    };
    format!("is a Zarr group, not an array; rechunkfs rechunks one array at a time ({holds})")
}

/// Most levels of groups searched for arrays to list.
const GROUP_DEPTH: usize = 8;

/// The paths (below `dir`, as `prefix`/name) of the arrays in group `dir`
/// and its subgroups, appended to `arrays`.
fn arrays_below(dir: &Path, prefix: &str, arrays: &mut Vec<String>) {
    if prefix.matches('/').count() >= GROUP_DEPTH {
        return;
    }
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for child in entries.filter_map(|entry| entry.ok().map(|e| e.path())) {
        let Some(name) = child.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let path = format!("{prefix}{name}");
        match node_kind(&child) {
            Some(Node::Array) => arrays.push(path),
            Some(Node::Group) => arrays_below(&child, &format!("{path}/"), arrays),
            None => {}
        }
    }
}

/// What a Zarr node is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Node {
    Array,
    Group,
}

/// Whether `dir` is a Zarr array or group, by its metadata file.
fn node_kind(dir: &Path) -> Option<Node> {
    let path = metadata_file(dir)?;
    match path.file_name().and_then(|n| n.to_str()) {
        Some(ZARRAY) => Some(Node::Array),
        Some(ZGROUP) => Some(Node::Group),
        _ => {
            let value: Value = serde_json::from_slice(&fs::read(&path).ok()?).ok()?;
            match value["node_type"].as_str() {
                Some("array") => Some(Node::Array),
                Some("group") => Some(Node::Group),
                _ => None,
            }
        }
    }
}

/// The directory of the array at `array` (a path like `raw/s0`) inside the
/// Zarr group `group`, for `--array`. Refused: a `group` that is not a
/// Zarr group, a path that leaves it, and a path that is not an array
/// (the message lists the group's arrays).
pub fn array_in_group(group: &Path, array: &str) -> Result<PathBuf> {
    if node_kind(group) != Some(Node::Group) {
        return Err(Error::bad_input(
            group,
            format!(
                "--array {array} picks an array inside a Zarr group, but this is not a Zarr \
                 group; give the array's own directory as IN instead"
            ),
        ));
    }
    let relative = Path::new(array);
    let inside = relative
        .components()
        .all(|part| matches!(part, std::path::Component::Normal(_)));
    if !inside || array.is_empty() {
        return Err(Error::BadArgument(format!(
            "--array {array}: give a path inside the group, such as data or raw/s0"
        )));
    }
    let path = group.join(relative);
    if node_kind(&path) == Some(Node::Array) {
        return Ok(path);
    }
    let mut arrays = Vec::new();
    arrays_below(group, "", &mut arrays);
    arrays.sort();
    Err(Error::bad_input(
        group,
        format!(
            "holds no Zarr array at {array}; its arrays: {}",
            if arrays.is_empty() {
                "none".to_string()
            } else {
                arrays.join(", ")
            }
        ),
    ))
}

fn field<'m>(meta: &'m Map<String, Value>, path: &Path, key: &str) -> Result<&'m Value> {
    meta.get(key)
        .ok_or_else(|| Error::bad_input(path, format!("has no \"{key}\"")))
}

fn shape_field(meta: &Map<String, Value>, path: &Path, key: &str) -> Result<Vec<u64>> {
    let bad = || Error::bad_input(path, format!("\"{key}\" is not a list of whole numbers"));
    field(meta, path, key)?
        .as_array()
        .ok_or_else(bad)?
        .iter()
        .map(|v| v.as_u64().ok_or_else(bad))
        .collect()
}

/// Shape and chunk shape agree and are usable.
fn check_shapes(path: &Path, shape: &[u64], chunks: &[u64], dtype: DType) -> Result<()> {
    if shape.len() != chunks.len() {
        return Err(Error::bad_input(
            path,
            format!(
                "the shape {} and the chunk shape {} differ in dimensions",
                shape_text(shape),
                shape_text(chunks)
            ),
        ));
    }
    shape_problem(shape, dtype).map_err(|problem| Error::bad_input(path, problem))?;
    shape_problem(chunks, dtype)
        .map_err(|problem| Error::bad_input(path, format!("chunks: {problem}")))?;
    Ok(())
}

/// A v2 array's metadata, and its compressor's name if it has one.
fn parse_v2(path: &Path, meta: &Map<String, Value>) -> Result<(ZarrArrayMeta, Option<String>)> {
    if field(meta, path, "zarr_format")?.as_u64() != Some(2) {
        return Err(Error::bad_input(
            path,
            "says a zarr_format other than 2; a .zarray file is Zarr v2",
        ));
    }
    let dtype = v2_dtype(path, field(meta, path, "dtype")?)?;
    let compressor = check_v2_codecs(path, meta)?;
    let separator = v2_separator(path, meta)?;
    let shape = shape_field(meta, path, "shape")?;
    let chunks = shape_field(meta, path, "chunks")?;
    check_shapes(path, &shape, &chunks, dtype)?;
    let fill = fill_field(path, meta.get("fill_value").unwrap_or(&Value::Null), dtype)?;
    let parsed = ZarrArrayMeta {
        format: BlockFormat::Zarr,
        path: path.to_path_buf(),
        shape,
        chunks,
        dtype,
        fill,
        key: ChunkKey {
            order: crate::array::axes::AxisOrder::C,
            prefix: None,
            separator,
            suffix: String::new(),
        },
        decoder: None,
    };
    Ok((parsed, compressor))
}

/// The dtype a v2 `dtype` names, in numpy's own spelling only: rechunkfs's
/// looser parser would read numpy's unicode "<U4" as an unsigned integer.
fn v2_dtype(path: &Path, dtype_text: &Value) -> Result<DType> {
    dtype_text
        .as_str()
        .and_then(|text| {
            let dtype = text.parse::<DType>().ok()?;
            let descr = dtype.numpy_descr();
            (text.len() == descr.len()
                && text.starts_with(['<', '>', '|', '='])
                && text[1..] == descr[1..])
                .then_some(dtype)
        })
        .ok_or_else(|| {
            Error::bad_input(
                path,
                format!(
                    "its dtype {dtype_text} is not one rechunkfs can move byte for byte; {CARRIED}"
                ),
            )
        })
}

/// The v2 compressors rechunkfs decodes (through zarrs).
const V2_COMPRESSORS: [&str; 4] = ["blosc", "zstd", "gzip", "zlib"];

/// The v3 bytes-to-bytes codecs rechunkfs decodes (through zarrs).
const V3_BYTES_CODECS: [&str; 4] = ["blosc", "zstd", "gzip", "crc32c"];

/// Checks that a v2 array's chunks are C-order bytes, compressed at most
/// by one of [`V2_COMPRESSORS`]: its compressor's name when it has one.
/// Filters transform values before compression; none is decoded, so
/// arrays with filters are refused.
fn check_v2_codecs(path: &Path, meta: &Map<String, Value>) -> Result<Option<String>> {
    let compressor = match meta.get("compressor") {
        None | Some(Value::Null) => None,
        Some(compressor) => {
            let id = codec_id(compressor);
            if !V2_COMPRESSORS.contains(&id.as_str()) {
                return Err(Error::bad_input(
                    path,
                    format!(
                        "the array's compressor is {id}; rechunkfs decodes {}. Rewrite it with \
                         one of those, e.g. with zarr-python's default compressor",
                        V2_COMPRESSORS.join(", ")
                    ),
                ));
            }
            Some(id)
        }
    };
    match meta.get("filters") {
        None | Some(Value::Null) => {}
        Some(Value::Array(list)) if list.is_empty() => {}
        Some(filters) => {
            return Err(Error::bad_input(
                path,
                format!(
                    "the array has filters ({}); rechunkfs decodes compressors but no filters \
                     (\"filters\": null)",
                    codec_id(filters)
                ),
            ))
        }
    }
    match meta.get("order").and_then(Value::as_str) {
        Some("C") => Ok(compressor),
        Some("F") => Err(Error::bad_input(
            path,
            "the array's chunks are in Fortran order (\"order\": \"F\"); rechunkfs reads C order only",
        )),
        _ => Err(Error::bad_input(path, "\"order\" is neither \"C\" nor \"F\"")),
    }
}

/// The character between a v2 chunk key's indices.
fn v2_separator(path: &Path, meta: &Map<String, Value>) -> Result<char> {
    match meta.get("dimension_separator") {
        None | Some(Value::Null) => Ok('.'),
        Some(Value::String(text)) if text == "." => Ok('.'),
        Some(Value::String(text)) if text == "/" => Ok('/'),
        Some(other) => Err(Error::bad_input(
            path,
            format!("\"dimension_separator\" is {other}; Zarr allows \".\" or \"/\""),
        )),
    }
}

/// The bytes of one element of fill value `value`, or why it is none.
fn fill_field(path: &Path, value: &Value, dtype: DType) -> Result<Vec<u8>> {
    fill_bytes(value, dtype)
        .map_err(|problem| Error::bad_input(path, format!("\"fill_value\": {problem}")))
}

/// A codec's name as a v2 or v3 codec object gives it.
fn codec_id(codec: &Value) -> String {
    match codec {
        Value::Array(list) => list.iter().map(codec_id).collect::<Vec<_>>().join(", "),
        Value::Object(object) => object
            .get("id")
            .or_else(|| object.get("name"))
            .and_then(Value::as_str)
            .unwrap_or("an unnamed codec")
            .to_string(),
        Value::String(name) => name.clone(),
        other => other.to_string(),
    }
}

/// A v3 array's metadata, and its codecs' names when they do more than
/// lay out bytes.
fn parse_v3(path: &Path, meta: &Map<String, Value>) -> Result<(ZarrArrayMeta, Option<String>)> {
    if field(meta, path, "zarr_format")?.as_u64() != Some(3) {
        return Err(Error::bad_input(
            path,
            "says a zarr_format other than 3; a zarr.json file is Zarr v3",
        ));
    }
    if meta.get("node_type").and_then(Value::as_str) != Some("array") {
        return Err(Error::bad_input(
            path,
            "\"node_type\" is neither \"array\" nor \"group\"",
        ));
    }
    let data_type = field(meta, path, "data_type")?;
    let (kind, size) = data_type
        .as_str()
        .and_then(v3_kind_and_size)
        .ok_or_else(|| {
            Error::bad_input(
                path,
                format!("its data_type {data_type} is not one rechunkfs can move byte for byte; {CARRIED}"),
            )
        })?;
    refuse_storage_transformers(path, meta)?;
    let chunks = v3_regular_chunks(path, meta)?;
    let codecs = field(meta, path, "codecs")?
        .as_array()
        .ok_or_else(|| Error::bad_input(path, "\"codecs\" is not a list"))?;
    let (endian, encoded) = v3_codecs(path, codecs)?;
    let names = encoded.then(|| codec_id(&Value::Array(codecs.clone())));
    let dtype = DType::new(kind, size, endian)?;
    let key = v3_chunk_key(path, meta)?;
    let shape = shape_field(meta, path, "shape")?;
    check_shapes(path, &shape, &chunks, dtype)?;
    let fill = fill_field(path, field(meta, path, "fill_value")?, dtype)?;
    let parsed = ZarrArrayMeta {
        format: BlockFormat::Zarr3,
        path: path.to_path_buf(),
        shape,
        chunks,
        dtype,
        fill,
        key,
        decoder: None,
    };
    Ok((parsed, names))
}

/// Refuses storage transformers, and a field that is not a list of them
/// (which would otherwise pass for none).
fn refuse_storage_transformers(path: &Path, meta: &Map<String, Value>) -> Result<()> {
    match meta.get("storage_transformers") {
        None => Ok(()),
        Some(Value::Array(transformers)) if transformers.is_empty() => Ok(()),
        Some(Value::Array(transformers)) => Err(Error::bad_input(
            path,
            format!(
                "the array has storage transformers ({}); rechunkfs reads only plain chunks",
                codec_id(&Value::Array(transformers.clone()))
            ),
        )),
        Some(other) => Err(Error::bad_input(
            path,
            format!("\"storage_transformers\" is {other}, not a list"),
        )),
    }
}

/// The chunk shape of a v3 array's chunk grid, which must be regular.
fn v3_regular_chunks(path: &Path, meta: &Map<String, Value>) -> Result<Vec<u64>> {
    let grid = field(meta, path, "chunk_grid")?;
    if grid["name"] != "regular" {
        return Err(Error::bad_input(
            path,
            format!(
                "its chunk grid is {}; rechunkfs reads regular chunk grids only",
                grid["name"]
            ),
        ));
    }
    grid["configuration"]
        .as_object()
        .ok_or_else(|| Error::bad_input(path, "the chunk grid has no configuration"))
        .and_then(|configuration| shape_field(configuration, path, "chunk_shape"))
}

/// The byte order of a v3 array's elements (its `bytes` codec's, inside
/// `sharding_indexed` for a sharded array), and whether chunks are encoded
/// (compressed, checksummed or sharded) rather than raw bytes. Accepted:
/// `bytes` or `sharding_indexed` (whose inner codecs follow the same
/// rule), then any of [`V3_BYTES_CODECS`]; anything else is refused.
fn v3_codecs(path: &Path, codecs: &[Value]) -> Result<(Endian, bool)> {
    let refuse = |what: String| {
        Error::bad_input(
            path,
            format!(
                "the array's codecs are [{}]; {what}. rechunkfs decodes bytes or \
                 sharding_indexed, then any of {} (no transpose or other codecs)",
                codec_id(&Value::Array(codecs.to_vec())),
                V3_BYTES_CODECS.join(", ")
            ),
        )
    };
    let Some((first, rest)) = codecs.split_first() else {
        return Err(refuse("there is none".into()));
    };
    let named = |codec: &Value| codec["name"].as_str().unwrap_or("").to_string();
    let (endian, encoded) = match named(first).as_str() {
        "bytes" => (bytes_endian(path, first)?, !rest.is_empty()),
        "sharding_indexed" => {
            let inner = first["configuration"]["codecs"]
                .as_array()
                .ok_or_else(|| refuse("sharding_indexed has no list of codecs".into()))?;
            (v3_codecs(path, inner)?.0, true)
        }
        _ => return Err(refuse(format!("{} is not decoded", codec_id(first)))),
    };
    match rest
        .iter()
        .find(|codec| !V3_BYTES_CODECS.contains(&named(codec).as_str()))
    {
        Some(other) => Err(refuse(format!("{} is not decoded", codec_id(other)))),
        None => Ok((endian, encoded)),
    }
}

/// The byte order a `bytes` codec gives.
fn bytes_endian(path: &Path, codec: &Value) -> Result<Endian> {
    match codec["configuration"]["endian"].as_str() {
        Some("big") => Ok(Endian::Big),
        Some("little") | None => Ok(Endian::Little),
        Some(other) => Err(Error::bad_input(
            path,
            format!("the bytes codec's endian is \"{other}\", neither little nor big"),
        )),
    }
}

/// How a v3 array names its chunks (`chunk_key_encoding`).
fn v3_chunk_key(path: &Path, meta: &Map<String, Value>) -> Result<ChunkKey> {
    let Some(encoding) = meta.get("chunk_key_encoding") else {
        return Ok(ChunkKey::zarr_v3());
    };
    let separator = encoding["configuration"]["separator"].as_str();
    match (encoding["name"].as_str(), separator) {
        (Some("default"), None | Some("/")) => Ok(ChunkKey::zarr_v3()),
        (Some("default"), Some(".")) => Ok(ChunkKey {
            separator: '.',
            ..ChunkKey::zarr_v3()
        }),
        (Some("v2"), None | Some(".")) => Ok(ChunkKey::zarr_v2()),
        (Some("v2"), Some("/")) => Ok(ChunkKey {
            separator: '/',
            ..ChunkKey::zarr_v2()
        }),
        _ => Err(Error::bad_input(
            path,
            format!("its chunk key encoding {encoding} is not one Zarr v3 defines"),
        )),
    }
}

fn v3_kind_and_size(name: &str) -> Option<(Kind, usize)> {
    Some(match name {
        "int8" => (Kind::Signed, 1),
        "int16" => (Kind::Signed, 2),
        "int32" => (Kind::Signed, 4),
        "int64" => (Kind::Signed, 8),
        "uint8" => (Kind::Unsigned, 1),
        "uint16" => (Kind::Unsigned, 2),
        "uint32" => (Kind::Unsigned, 4),
        "uint64" => (Kind::Unsigned, 8),
        "float16" => (Kind::Float, 2),
        "float32" => (Kind::Float, 4),
        "float64" => (Kind::Float, 8),
        _ => return None,
    })
}

/// Zarr v3's name of a dtype (byte order goes in the bytes codec).
fn v3_data_type(dtype: DType) -> String {
    let kind = match dtype.kind {
        Kind::Unsigned => "uint",
        Kind::Signed => "int",
        Kind::Float => "float",
    };
    format!("{kind}{}", dtype.size * 8)
}

/// One element of `value` (a Zarr fill value) as `dtype`'s bytes. `null`
/// (v2's "no fill value") is taken as zero, as zarr-python reads it.
fn fill_bytes(value: &Value, dtype: DType) -> std::result::Result<Vec<u8>, String> {
    let size = dtype.size;
    let little: Vec<u8> = match (value, dtype.kind) {
        (Value::Null, _) => vec![0; size],
        (Value::String(text), _) if text.starts_with("0x") => {
            // v3: the value's bits, as hex.
            let bits = u64::from_str_radix(&text[2..], 16)
                .map_err(|_| format!("{text} is not a hex number"))?;
            if size < 8 && bits >> (size * 8) != 0 {
                return Err(format!("{text} has more bits than a {dtype}"));
            }
            bits.to_le_bytes()[..size].to_vec()
        }
        (Value::String(text), Kind::Float) => {
            let float = match text.as_str() {
                "NaN" => f64::NAN,
                "Infinity" => f64::INFINITY,
                "-Infinity" => f64::NEG_INFINITY,
                _ => return Err(format!("\"{text}\" is not a number")),
            };
            float_bytes(float, size)
        }
        (Value::Number(number), Kind::Float) => {
            float_bytes(number.as_f64().ok_or("not a number")?, size)
        }
        (Value::Number(number), Kind::Signed | Kind::Unsigned) => {
            let whole = number
                .as_i64()
                .map(i128::from)
                .or_else(|| number.as_u64().map(i128::from))
                .or_else(|| {
                    number
                        .as_f64()
                        .filter(|f| f.fract() == 0.0 && f.abs() < 2f64.powi(63))
                        .map(|f| f as i128)
                })
                .ok_or_else(|| format!("{number} is not a whole number"))?;
            let bits = size as u32 * 8;
            let (low, high) = match dtype.kind {
                Kind::Signed => (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1),
                _ => (0, (1i128 << bits) - 1),
            };
            if whole < low || whole > high {
                return Err(format!("{number} does not fit in a {dtype}"));
            }
            whole.to_le_bytes()[..size].to_vec()
        }
        (other, _) => return Err(format!("{other} is not a fill value for {dtype}")),
    };
    Ok(match dtype.endian {
        Endian::Little => little,
        Endian::Big => little.into_iter().rev().collect(),
    })
}

/// Little-endian bytes of `value` as a float of `size` bytes.
fn float_bytes(value: f64, size: usize) -> Vec<u8> {
    match size {
        2 => f16_bits(value).to_le_bytes().to_vec(),
        4 => (value as f32).to_le_bytes().to_vec(),
        _ => value.to_le_bytes().to_vec(),
    }
}

/// IEEE half-precision bits of `value`, rounded to nearest even (through
/// f32, which is exact for every value a fill value is likely to be).
fn f16_bits(value: f64) -> u16 {
    let bits = (value as f32).to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exponent = ((bits >> 23) & 0xff) as i32;
    let mantissa = bits & 0x7f_ffff;
    if exponent == 0xff {
        return sign | 0x7c00 | if mantissa != 0 { 0x200 } else { 0 };
    }
    let half_exponent = exponent - 127 + 15;
    if half_exponent >= 0x1f {
        return sign | 0x7c00;
    }
    let round = |kept: u32, dropped: u32, shift: u32| -> u32 {
        let halfway = 1u32 << (shift - 1);
        if dropped > halfway || (dropped == halfway && kept & 1 == 1) {
            kept + 1
        } else {
            kept
        }
    };
    if half_exponent <= 0 {
        if half_exponent < -10 {
            return sign;
        }
        let full = mantissa | 0x80_0000;
        let shift = (14 - half_exponent) as u32;
        let kept = full >> shift;
        return sign | round(kept, full & ((1 << shift) - 1), shift) as u16;
    }
    let kept = ((half_exponent as u32) << 10) | (mantissa >> 13);
    // A carry out of the mantissa rounds up into the exponent, as it should.
    sign | round(kept, mantissa & 0x1fff, 13) as u16
}

/// The metadata files that make a directory of chunks a Zarr array of
/// `shape` in chunks of `chunks`: `(name, bytes)`. C order, fill value 0,
/// chunks named as `format` names them by default, encoded as `encoding`
/// says (uncompressed without it). Sharded (v3 only), each chunk of the
/// grid is a shard of inner chunks, indexed as zarr-python indexes them:
/// at the end, little-endian, with a CRC32C.
pub(super) fn array_metadata(
    format: BlockFormat,
    shape: &[u64],
    chunks: &[u64],
    dtype: DType,
    encoding: &Encoding,
) -> Vec<(&'static str, Vec<u8>)> {
    let fill = if dtype.kind == Kind::Float {
        json!(0.0)
    } else {
        json!(0)
    };
    let (name, value) = if format == BlockFormat::Zarr3 {
        (
            ZARR_JSON,
            json!({
                "zarr_format": 3,
                "node_type": "array",
                "shape": shape,
                "data_type": v3_data_type(dtype),
                "chunk_grid": { "name": "regular", "configuration": { "chunk_shape": chunks } },
                "chunk_key_encoding": { "name": "default", "configuration": { "separator": "/" } },
                "fill_value": fill,
                "codecs": v3_codecs_written(dtype, encoding),
                "attributes": {},
            }),
        )
    } else {
        let compressor = encoding
            .compressor
            .as_ref()
            .map_or(Value::Null, Compressor::zarr_v2);
        (
            ZARRAY,
            json!({
                "zarr_format": 2,
                "shape": shape,
                "chunks": chunks,
                "dtype": dtype.numpy_descr(),
                "compressor": compressor,
                "fill_value": fill,
                "order": "C",
                "filters": null,
                "dimension_separator": ".",
            }),
        )
    };
    let mut bytes = serde_json::to_vec_pretty(&value).unwrap_or_default();
    bytes.push(b'\n');
    vec![(name, bytes)]
}

/// A v3 array's `codecs`: `bytes` (with the byte order, so big-endian data
/// are stored as they are, never swapped), then the compressor if any;
/// inside `sharding_indexed` when sharded.
fn v3_codecs_written(dtype: DType, encoding: &Encoding) -> Value {
    let mut bytes_codec = json!({ "name": "bytes" });
    if dtype.size > 1 {
        bytes_codec["configuration"] = json!({
            "endian": if dtype.endian == Endian::Big { "big" } else { "little" }
        });
    }
    let mut codecs = vec![bytes_codec];
    codecs.extend(encoding.compressor.as_ref().map(|c| c.zarr_v3(dtype.size)));
    match &encoding.shard_chunks {
        None => Value::Array(codecs),
        Some(inner) => json!([{
            "name": "sharding_indexed",
            "configuration": {
                "chunk_shape": inner,
                "codecs": codecs,
                "index_codecs": [
                    { "name": "bytes", "configuration": { "endian": "little" } },
                    { "name": "crc32c" }
                ],
                "index_location": "end"
            }
        }]),
    }
}

/// Zarr v2's row of the format table: an array directory of whole chunks
/// beside its `.zarray`, written (and read through its directory).
pub(super) const TRAITS: FormatTraits = FormatTraits {
    name: "Zarr v2",
    extension: "zarr",
    aliases: &["zarr", "zarr2"],
    pads_edge_blocks: true,
    names: BlockNames::ZarrV2,
    probe: Err("a Zarr chunk has no header to probe: open the array's directory instead"),
    template: Ok(data_only_template),
    array_metadata: Some(metadata_v2),
    pyramid: PyramidKind::OmeZarr { zarr3: false },
    compression: Compression::Any,
    ..FormatTraits::NONE
};

/// Zarr v3's row: as v2's, with `zarr.json`, `c/`-keyed chunks and shards.
pub(super) const TRAITS_3: FormatTraits = FormatTraits {
    name: "Zarr v3",
    extension: "zarr3",
    aliases: &["zarr3"],
    names: BlockNames::ZarrV3,
    array_metadata: Some(metadata_v3),
    pyramid: PyramidKind::OmeZarr { zarr3: true },
    shards: true,
    ..TRAITS
};

fn metadata_v2(
    shape: &[u64],
    chunks: &[u64],
    dtype: DType,
    encoding: &Encoding,
) -> Vec<(&'static str, Vec<u8>)> {
    array_metadata(BlockFormat::Zarr, shape, chunks, dtype, encoding)
}

fn metadata_v3(
    shape: &[u64],
    chunks: &[u64],
    dtype: DType,
    encoding: &Encoding,
) -> Vec<(&'static str, Vec<u8>)> {
    array_metadata(BlockFormat::Zarr3, shape, chunks, dtype, encoding)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dtype(text: &str) -> DType {
        text.parse().unwrap()
    }

    #[test]
    fn fill_values_become_element_bytes() {
        let cases: [(Value, &str, &[u8]); 12] = [
            (json!(0), "<u2", &[0, 0]),
            (Value::Null, ">f8", &[0; 8]),
            (json!(258), "<u2", &[2, 1]),
            (json!(258), ">u2", &[1, 2]),
            (json!(-1), "<i4", &[0xff; 4]),
            (json!(1.0), "<f2", &[0x00, 0x3c]),
            (json!(-2.0), ">f2", &[0xc0, 0x00]),
            (json!(65504.0), "<f2", &[0xff, 0x7b]),
            (json!("NaN"), "<f4", &[0, 0, 0xc0, 0x7f]),
            (json!("-Infinity"), ">f2", &[0xfc, 0x00]),
            (json!("0x7fc00001"), "<f4", &[1, 0, 0xc0, 0x7f]),
            (json!(3.0), "|u1", &[3]),
        ];
        for (value, descr, expected) in cases {
            assert_eq!(
                fill_bytes(&value, dtype(descr)).unwrap(),
                expected,
                "{value} as {descr}"
            );
        }
        assert_eq!(f16_bits(5.960_464_477_539_063e-8), 1);
        assert_eq!(f16_bits(1e6), 0x7c00);
        for (value, descr) in [
            (json!(256), "|u1"),
            (json!(-1), "<u4"),
            (json!(0.5), "<i2"),
            (json!("x"), "<f4"),
            (json!("0x10000"), "<u2"),
            (json!([1]), "<u2"),
        ] {
            assert!(fill_bytes(&value, dtype(descr)).is_err(), "{value} {descr}");
        }
    }

    #[test]
    fn metadata_written_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        for (format, descr) in [
            (BlockFormat::Zarr, ">f4"),
            (BlockFormat::Zarr3, ">u2"),
            (BlockFormat::Zarr3, "|i1"),
            (BlockFormat::Zarr, "<f2"),
        ] {
            let array = dir
                .path()
                .join(format!("{}{}", format.extension(), descr.len()));
            fs::create_dir_all(&array).unwrap();
            for (name, bytes) in array_metadata(
                format,
                &[10, 7],
                &[4, 7],
                dtype(descr),
                &Encoding::default(),
            ) {
                fs::write(array.join(name), bytes).unwrap();
            }
            let meta = read_metadata(&array).unwrap().unwrap();
            assert_eq!(meta.format, format);
            assert_eq!(meta.shape, [10, 7]);
            assert_eq!(meta.chunks, [4, 7]);
            assert_eq!(meta.dtype, dtype(descr));
            assert_eq!(meta.fill, vec![0; meta.dtype.size]);
            assert_eq!(meta.key, format.chunk_key());
        }
        assert_eq!(read_metadata(dir.path()).unwrap(), None);
    }

    #[test]
    fn refusals_name_the_file_and_the_problem() {
        let dir = tempfile::tempdir().unwrap();
        let base = json!({
            "zarr_format": 2, "shape": [10], "chunks": [4], "dtype": "<u2",
            "compressor": null, "fill_value": 0, "order": "C", "filters": null,
        });
        let v3 = json!({
            "zarr_format": 3, "node_type": "array", "shape": [10], "data_type": "uint16",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4]}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": 0, "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
        });
        let with = |base: &Value, key: &str, value: Value| {
            let mut v = base.clone();
            v[key] = value;
            v
        };
        let cases = [
            (
                ZARRAY,
                with(&base, "compressor", json!({"id": "lzma"})),
                "compressor is lzma",
            ),
            (
                ZARRAY,
                with(&base, "filters", json!([{"id": "delta"}])),
                "filters (delta)",
            ),
            (ZARRAY, with(&base, "order", json!("F")), "Fortran order"),
            (
                ZARRAY,
                with(&base, "dtype", json!("|b1")),
                "\"|b1\" is not one",
            ),
            (
                ZARRAY,
                with(&base, "dtype", json!("<U4")),
                "\"<U4\" is not one",
            ),
            (
                ZARRAY,
                with(&base, "chunks", json!([4, 4])),
                "differ in dimensions",
            ),
            (
                ZARRAY,
                with(&with(&base, "shape", json!([])), "chunks", json!([])),
                "0-dimensional",
            ),
            (
                ZARR_JSON,
                with(
                    &v3,
                    "codecs",
                    json!([{"name": "transpose"}, {"name": "bytes"}]),
                ),
                "transpose is not decoded",
            ),
            (
                ZARR_JSON,
                with(&v3, "data_type", json!("complex64")),
                "\"complex64\"",
            ),
            (
                ZARR_JSON,
                with(&v3, "fill_value", json!("x")),
                "\"fill_value\"",
            ),
            // Found by tests/fuzz_headers.rs: once read as no transformers.
            (
                ZARR_JSON,
                with(&v3, "storage_transformers", json!("C")),
                "\"storage_transformers\" is \"C\", not a list",
            ),
            (
                ZARR_JSON,
                json!({"zarr_format": 3, "node_type": "group"}),
                "Zarr group, not an array",
            ),
            (
                ZGROUP,
                json!({"zarr_format": 2}),
                "Zarr group, not an array",
            ),
        ];
        for (i, (name, meta, expected)) in cases.into_iter().enumerate() {
            let array = dir.path().join(format!("a{i}"));
            fs::create_dir_all(&array).unwrap();
            fs::write(array.join(name), serde_json::to_vec(&meta).unwrap()).unwrap();
            let message = read_metadata(&array).unwrap_err().to_string();
            assert!(message.contains(expected), "{name} {meta}: {message}");
            assert!(message.contains(&format!("a{i}")), "{message}");
        }
    }
}
