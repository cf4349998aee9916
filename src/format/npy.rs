//! The npy format: reading and writing the header that precedes the array.
//!
//! An npy file is a magic string, a version, a header length and a Python
//! dict literal (`{'descr': '<u2', 'fortran_order': False, 'shape': (3, 4), }`),
//! then the raw array. rechunkfs reads headers of versions 1.0, 2.0 and 3.0 as
//! any writer may have produced them (keys in any order, either quote, extra
//! spaces, trailing commas, Python 2 `L` integers) and writes them as numpy
//! does: version 1.0 when it fits, padded with spaces to a newline so that the
//! data start at a multiple of 64 bytes.

use std::os::unix::fs::FileExt;
use std::path::Path;

use super::block::{read_head, shape_problem, shape_text, BlockInfo, BlockTemplate, Storage};
use super::traits::FormatTraits;
use crate::array::dtype::{DType, Endian, Kind};
use crate::array::space::Space;
use crate::error::{Error, Result};

/// The six bytes every npy file starts with.
pub const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// numpy aligns the data to this many bytes so that memory maps of the file
/// are aligned for every dtype; we keep its convention.
const DATA_ALIGNMENT: usize = 64;

/// Header lengths are 2 bytes in version 1.0 and 4 bytes in 2.0 and 3.0.
const PREAMBLE_LEN_V1: usize = MAGIC.len() + 2 + 2;
const PREAMBLE_LEN_V2: usize = MAGIC.len() + 2 + 4;

/// Enough for every header numpy writes for up to 8 dimensions, so probing
/// usually costs one read.
const FIRST_READ_LEN: u64 = 4096;

const HDF5_SIGNATURE: &[u8; 8] = b"\x89HDF\r\n\x1a\n";

/// What an npy header says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NpyHeader {
    pub shape: Vec<u64>,
    pub dtype: DType,
    pub fortran_order: bool,
    /// Where the array data start: the length of magic, preamble and header.
    pub data_offset: u64,
}

/// Why bytes do not decode to a usable npy header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HeaderProblem {
    /// The bytes end before the header does; the first `needed` bytes of the
    /// file would hold it.
    Incomplete { needed: usize },
    /// Not an npy header, or a malformed one.
    Malformed(String),
    /// A well-formed header whose element type rechunkfs cannot carry.
    UnsupportedDtype(String),
}

/// The bytes of an npy file before its data: magic, version, header length,
/// and the header dict padded so the data start at a multiple of
/// `alignment` bytes (a multiple of 64, numpy's own alignment): padding is
/// what npy's format provides for, and readers skip it.
pub fn encode_header_aligned(shape: &[u64], dtype: DType, alignment: usize) -> Vec<u8> {
    let alignment = alignment
        .max(DATA_ALIGNMENT)
        .next_multiple_of(DATA_ALIGNMENT);
    let shape_literal = match shape {
        [extent] => format!("({extent},)"),
        _ => shape_text(shape),
    };
    let dict = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {shape_literal}, }}",
        dtype.numpy_descr()
    );
    // Version 1.0 is what every reader understands; 2.0 only lifts the
    // 64 KiB header limit, which only absurd shapes need.
    let (version, preamble_len) = {
        let v1_header_len =
            (PREAMBLE_LEN_V1 + dict.len() + 1).next_multiple_of(alignment) - PREAMBLE_LEN_V1;
        if v1_header_len <= usize::from(u16::MAX) {
            (1u8, PREAMBLE_LEN_V1)
        } else {
            (2u8, PREAMBLE_LEN_V2)
        }
    };
    let total_len = (preamble_len + dict.len() + 1).next_multiple_of(alignment);
    let header_len = total_len - preamble_len;

    let mut bytes = Vec::with_capacity(total_len);
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&[version, 0]);
    if version == 1 {
        // Checked above: the version 1.0 length fits in two bytes.
        bytes.extend_from_slice(&(header_len as u16).to_le_bytes());
    } else {
        bytes.extend_from_slice(&(header_len as u32).to_le_bytes());
    }
    bytes.extend_from_slice(dict.as_bytes());
    bytes.resize(total_len - 1, b' ');
    bytes.push(b'\n');
    bytes
}

/// Decode the header at the start of `bytes` (the first bytes of a file).
pub fn decode_header(bytes: &[u8]) -> std::result::Result<NpyHeader, HeaderProblem> {
    let (major, preamble_len) = read_version(bytes)?;
    let header_len = read_header_len(bytes, major)?;
    let data_offset = preamble_len + header_len;
    let Some(header_bytes) = bytes.get(preamble_len..data_offset) else {
        return Err(HeaderProblem::Incomplete {
            needed: data_offset,
        });
    };
    // Versions 1.0 and 2.0 are latin-1, 3.0 is UTF-8; the dict numpy
    // writes is ASCII either way, so only field names could differ.
    let header_text: String = if major == 3 {
        std::str::from_utf8(header_bytes)
            .map_err(|_| {
                HeaderProblem::Malformed("its version 3.0 header is not valid UTF-8".into())
            })?
            .to_owned()
    } else {
        header_bytes.iter().map(|&b| char::from(b)).collect()
    };
    read_dict(&header_text, data_offset as u64).map_err(|problem| {
        if runs_into_data(&header_text) {
            HeaderProblem::Malformed(format!(
                "its header length field says {header_len} bytes, which runs past the header's \
                 end into the data: the length is damaged"
            ))
        } else {
            problem
        }
    })
}

/// Whether a header that does not parse runs on past the line that ends
/// its dict: numpy ends a header with a newline, so text after it is data
/// read as header, through a damaged length.
fn runs_into_data(header_text: &str) -> bool {
    header_text
        .find('}')
        .and_then(|close| header_text[close..].find('\n').map(|n| close + n))
        .is_some_and(|newline| !header_text[newline + 1..].trim().is_empty())
}

/// The major version after the magic, and the length of the preamble it
/// implies (magic, version, header length); the bytes must hold it.
fn read_version(bytes: &[u8]) -> std::result::Result<(u8, usize), HeaderProblem> {
    if bytes.len() < MAGIC.len() + 2 {
        if bytes.len() <= MAGIC.len() && MAGIC.starts_with(bytes) || bytes.starts_with(MAGIC) {
            return Err(HeaderProblem::Incomplete {
                needed: PREAMBLE_LEN_V1,
            });
        }
        return Err(bad_magic(bytes));
    }
    if !bytes.starts_with(MAGIC) {
        return Err(bad_magic(bytes));
    }
    let (major, minor) = (bytes[6], bytes[7]);
    let preamble_len = match major {
        1 => PREAMBLE_LEN_V1,
        2 | 3 => PREAMBLE_LEN_V2,
        _ => {
            return Err(HeaderProblem::Malformed(format!(
                "npy format version {major}.{minor}; rechunkfs reads versions 1.0, 2.0 and 3.0"
            )))
        }
    };
    if bytes.len() < preamble_len {
        return Err(HeaderProblem::Incomplete {
            needed: preamble_len,
        });
    }
    Ok((major, preamble_len))
}

/// The header length the preamble of a version `major` file gives.
fn read_header_len(bytes: &[u8], major: u8) -> std::result::Result<usize, HeaderProblem> {
    if major == 1 {
        Ok(usize::from(u16::from_le_bytes([bytes[8], bytes[9]])))
    } else {
        let length = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
        usize::try_from(length)
            .map_err(|_| HeaderProblem::Malformed(format!("header length {length} is absurd")))
    }
}

/// What the header dict `header_text` says, for data at `data_offset`.
fn read_dict(header_text: &str, data_offset: u64) -> std::result::Result<NpyHeader, HeaderProblem> {
    let dict = match parse_literal(header_text) {
        Ok(Literal::Dict(entries)) => entries,
        Ok(_) => return Err(malformed_header("it is not a dict", header_text)),
        Err(problem) => return Err(malformed_header(&problem, header_text)),
    };
    let field = |name: &str| {
        dict.iter()
            .find(|(key, _)| matches!(key, Literal::Str(k) if k == name))
            .map(|(_, value)| value)
            .ok_or_else(|| malformed_header(&format!("it has no '{name}' key"), header_text))
    };
    let dtype = descr_to_dtype(field("descr")?)?;
    let fortran_order = match field("fortran_order")? {
        Literal::Bool(flag) => *flag,
        _ => {
            return Err(malformed_header(
                "'fortran_order' is not True or False",
                header_text,
            ))
        }
    };
    let shape = match field("shape")? {
        Literal::Tuple(items) | Literal::List(items) => items
            .iter()
            .map(|item| match item {
                Literal::Int(n) => u64::try_from(*n).ok(),
                _ => None,
            })
            .collect::<Option<Vec<u64>>>()
            .ok_or_else(|| {
                malformed_header("'shape' holds something other than sizes", header_text)
            })?,
        _ => return Err(malformed_header("'shape' is not a tuple", header_text)),
    };
    Ok(NpyHeader {
        shape,
        dtype,
        fortran_order,
        data_offset,
    })
}

fn bad_magic(bytes: &[u8]) -> HeaderProblem {
    if bytes.starts_with(HDF5_SIGNATURE) {
        return HeaderProblem::Malformed(
            "it starts with the HDF5 signature, so it is an HDF5 file, not npy".into(),
        );
    }
    let shown: Vec<String> = bytes.iter().take(8).map(|b| format!("{b:02x}")).collect();
    HeaderProblem::Malformed(format!(
        "it does not start with the npy magic \\x93NUMPY (its first bytes: {})",
        shown.join(" ")
    ))
}

/// A header quoted in a message: its first line, printable ASCII only, at
/// most 200 characters, so a damaged header never floods the terminal.
fn malformed_header(problem: &str, header_text: &str) -> HeaderProblem {
    let line = header_text.split('\n').next().unwrap_or("").trim_end();
    let mut shown: String = line
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '?'
            }
        })
        .take(200)
        .collect();
    if line.chars().count() > 200 {
        shown.push_str("...");
    }
    let problem: String = problem
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '?'
            }
        })
        .collect();
    HeaderProblem::Malformed(format!("its header {shown:?} is not usable: {problem}"))
}

/// The dtype a numpy `descr` names, or why rechunkfs cannot carry it.
fn descr_to_dtype(descr: &Literal) -> std::result::Result<DType, HeaderProblem> {
    let text = match descr {
        Literal::Str(text) => text,
        Literal::List(_) => {
            return Err(HeaderProblem::UnsupportedDtype(
                "its dtype is structured (a record with named fields); \
                 rechunkfs carries only plain numeric types"
                    .into(),
            ))
        }
        _ => {
            return Err(HeaderProblem::Malformed(
                "its 'descr' is neither a type string nor a field list".into(),
            ))
        }
    };
    let unsupported = |what: &str| {
        HeaderProblem::UnsupportedDtype(format!(
            "its dtype is '{text}' ({what}); rechunkfs carries only u1..u8, i1..i8, f2, f4 and f8 \
             in either byte order"
        ))
    };
    let (order, rest) = match text.chars().next() {
        Some(c @ ('<' | '>' | '|' | '=')) => (Some(c), &text[1..]),
        _ => (None, text.as_str()),
    };
    let mut chars = rest.chars();
    let kind = kind_of_char(chars.next().unwrap_or(' ')).map_err(unsupported)?;
    let size: usize = chars
        .as_str()
        .parse()
        .map_err(|_| unsupported("a type numpy itself would not write"))?;
    let endian = match order {
        Some('>') => Endian::Big,
        Some('<') => Endian::Little,
        Some('|') if size > 1 => return Err(unsupported("multi-byte with no byte order")),
        // '=' and a bare type mean the writer's native order, which numpy
        // never leaves in a file; assume the writer was like this machine.
        _ if cfg!(target_endian = "big") => Endian::Big,
        _ => Endian::Little,
    };
    DType::new(kind, size, endian).map_err(|_| {
        let kind_name = match kind {
            Kind::Unsigned => "unsigned integer",
            Kind::Signed => "signed integer",
            Kind::Float => "float",
        };
        unsupported(&format!("{kind_name} of {size} bytes"))
    })
}

/// The kind a numpy type character names, or what it names instead.
fn kind_of_char(kind_char: char) -> std::result::Result<Kind, &'static str> {
    match kind_char {
        'u' => Ok(Kind::Unsigned),
        'i' => Ok(Kind::Signed),
        'f' => Ok(Kind::Float),
        'b' | '?' => Err("boolean"),
        'c' => Err("complex"),
        'm' => Err("time delta"),
        'M' => Err("date and time"),
        'O' => Err("Python objects"),
        'S' | 'a' => Err("byte strings"),
        'U' => Err("unicode strings"),
        'V' => Err("raw void records"),
        _ => Err("a type numpy itself would not write"),
    }
}

/// Learn an npy file's shape and dtype, and check it holds all its data.
pub fn probe(path: &Path) -> Result<BlockInfo> {
    let bad_file = |problem: String| Error::BadBlockFile {
        path: path.to_path_buf(),
        format: "npy",
        problem,
    };
    let (file, file_len, mut head) = read_head(path, "npy", FIRST_READ_LEN)?;
    let header = loop {
        match decode_header(&head) {
            Ok(header) => break header,
            Err(HeaderProblem::Incomplete { needed })
                if needed as u64 <= file_len && needed > head.len() =>
            {
                head.resize(needed, 0);
                file.read_exact_at(&mut head, 0)
                    .map_err(|e| Error::io(path, "read header of", e))?;
            }
            Err(HeaderProblem::Incomplete { needed }) => {
                return Err(bad_file(format!(
                    "truncated: its header needs {needed} bytes but the file has only {file_len}"
                )))
            }
            Err(HeaderProblem::Malformed(problem)) => return Err(bad_file(problem)),
            Err(HeaderProblem::UnsupportedDtype(problem)) => {
                return Err(Error::UnsupportedDtype(format!(
                    "{}: {problem}",
                    path.display()
                )))
            }
        }
    };

    if header.fortran_order {
        return Err(Error::bad_input(
            path,
            "it is stored in Fortran (column-major) order; rechunkfs reads C-order npy files \
             (save np.ascontiguousarray(a) instead)",
        ));
    }
    let data_len = shape_problem(&header.shape, header.dtype)
        .map_err(|problem| Error::bad_input(path, problem))?;
    let needed_len = header.data_offset + data_len;
    if file_len < needed_len {
        return Err(bad_file(format!(
            "truncated: its header promises {} of {} = {data_len} data bytes from offset {}, \
             so {needed_len} bytes in all, but the file has only {file_len}",
            shape_text(&header.shape),
            header.dtype.numpy_descr(),
            header.data_offset,
        )));
    }
    Ok(BlockInfo {
        shape: header.shape,
        dtype: header.dtype,
        storage: Storage::Contiguous {
            data_offset: header.data_offset,
        },
    })
}

/// The Python literals an npy header can contain.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Literal {
    Str(String),
    Int(i128),
    Bool(bool),
    None,
    Tuple(Vec<Literal>),
    List(Vec<Literal>),
    Dict(Vec<(Literal, Literal)>),
}

/// Appends what `\{escaped}` stands for in a Python string literal, as
/// numpy's `ast.literal_eval` reads it: an escape Python does not know
/// keeps its backslash (`'d\escr'` is not `'descr'`), and those that name
/// characters by number are refused rather than guessed.
fn python_escape(escaped: char, text: &mut String) -> std::result::Result<(), String> {
    match escaped {
        '\\' | '\'' | '"' => text.push(escaped),
        'n' => text.push('\n'),
        't' => text.push('\t'),
        'r' => text.push('\r'),
        'a' | 'b' | 'f' | 'v' | 'x' | 'N' | 'u' | 'U' | '0'..='7' | '\n' => {
            return Err(format!(
                "a string holds the escape \\{escaped}, which rechunkfs does not read"
            ))
        }
        other => {
            text.push('\\');
            text.push(other);
        }
    }
    Ok(())
}

/// Parse one Python literal filling `text` (surrounding whitespace allowed).
fn parse_literal(text: &str) -> std::result::Result<Literal, String> {
    let mut parser = LiteralParser {
        chars: text.chars().collect(),
        pos: 0,
    };
    let value = parser.value()?;
    parser.skip_space();
    match parser.peek() {
        None => Ok(value),
        Some(c) => Err(format!("unexpected {c:?} after the dict")),
    }
}

/// A recursive-descent reader of the Python literal subset npy headers use
/// (numpy itself reads them with `ast.literal_eval`).
struct LiteralParser {
    chars: Vec<char>,
    pos: usize,
}

impl LiteralParser {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn skip_space(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.pos += 1;
        }
    }

    fn value(&mut self) -> std::result::Result<Literal, String> {
        self.skip_space();
        match self.peek() {
            None => Err("it ends where a value should be".into()),
            Some('{') => self.dict(),
            Some('(') => self.sequence(')').map(|(mut items, trailing_comma)| {
                // `(3)` is just 3 in Python; `(3,)` and `()` are tuples.
                if items.len() == 1 && !trailing_comma {
                    items.remove(0)
                } else {
                    Literal::Tuple(items)
                }
            }),
            Some('[') => self.sequence(']').map(|(items, _)| Literal::List(items)),
            Some(quote @ ('\'' | '"')) => self.string(quote),
            Some(c) if c.is_ascii_digit() || c == '-' || c == '+' => self.int(),
            Some(c) if c.is_alphabetic() => self.word(),
            Some(c) => Err(format!("unexpected {c:?}")),
        }
    }

    /// Items up to `close`, and whether a comma followed the last one.
    fn sequence(&mut self, close: char) -> std::result::Result<(Vec<Literal>, bool), String> {
        self.pos += 1;
        let mut items = Vec::new();
        loop {
            self.skip_space();
            if self.peek() == Some(close) {
                self.pos += 1;
                return Ok((items, true));
            }
            items.push(self.value()?);
            self.skip_space();
            match self.peek() {
                Some(',') => self.pos += 1,
                Some(c) if c == close => {
                    self.pos += 1;
                    return Ok((items, false));
                }
                _ => return Err(format!("a sequence is missing its ',' or '{close}'")),
            }
        }
    }

    fn dict(&mut self) -> std::result::Result<Literal, String> {
        self.pos += 1;
        let mut entries = Vec::new();
        loop {
            self.skip_space();
            if self.peek() == Some('}') {
                self.pos += 1;
                return Ok(Literal::Dict(entries));
            }
            let key = self.value()?;
            self.skip_space();
            if self.peek() != Some(':') {
                return Err("a dict key is not followed by ':'".into());
            }
            self.pos += 1;
            let value = self.value()?;
            entries.push((key, value));
            self.skip_space();
            match self.peek() {
                Some(',') => self.pos += 1,
                Some('}') => {
                    self.pos += 1;
                    return Ok(Literal::Dict(entries));
                }
                _ => return Err("the dict is missing a ',' or '}'".into()),
            }
        }
    }

    fn string(&mut self, quote: char) -> std::result::Result<Literal, String> {
        self.pos += 1;
        let mut text = String::new();
        loop {
            match self.peek() {
                None => return Err("a string is not closed".into()),
                Some(c) if c == quote => {
                    self.pos += 1;
                    return Ok(Literal::Str(text));
                }
                Some('\\') => {
                    self.pos += 1;
                    let escaped = self.peek().ok_or("a string ends in a backslash")?;
                    self.pos += 1;
                    python_escape(escaped, &mut text)?;
                }
                Some(c) => {
                    self.pos += 1;
                    text.push(c);
                }
            }
        }
    }

    fn int(&mut self) -> std::result::Result<Literal, String> {
        let start = self.pos;
        if matches!(self.peek(), Some('-' | '+')) {
            self.pos += 1;
        }
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        let digits: String = self.chars[start..self.pos].iter().collect();
        // Python 2 wrote long integers with an L suffix.
        if matches!(self.peek(), Some('L' | 'l')) {
            self.pos += 1;
        }
        digits
            .parse()
            .map(Literal::Int)
            .map_err(|_| format!("{digits:?} is not an integer rechunkfs can read"))
    }

    fn word(&mut self) -> std::result::Result<Literal, String> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_alphanumeric() || c == '_') {
            self.pos += 1;
        }
        let word: String = self.chars[start..self.pos].iter().collect();
        match word.as_str() {
            "True" => Ok(Literal::Bool(true)),
            "False" => Ok(Literal::Bool(false)),
            "None" => Ok(Literal::None),
            _ => Err(format!("{word:?} is not a literal")),
        }
    }
}

/// npy's row of the format table: read and written, header then data.
pub(super) const TRAITS: FormatTraits = FormatTraits {
    name: "npy",
    extension: "npy",
    input_extensions: &["npy"],
    probe: Ok(probe_block),
    template: Ok(template),
    comparable_headers: true,
    ..FormatTraits::NONE
};

/// [`probe`] as the format table calls it (npy has no datasets).
fn probe_block(path: &Path, _dataset: &str) -> Result<BlockInfo> {
    probe(path)
}

/// An npy block's template: its header, padded so the data start at a
/// multiple of `alignment`.
fn template(
    shape: &[u64],
    dtype: DType,
    _dataset: &str,
    data_len: u64,
    alignment: u64,
    _space: &Space,
) -> Result<BlockTemplate> {
    let prefix = encode_header_aligned(shape, dtype, alignment as usize);
    Ok(BlockTemplate {
        data_offset: prefix.len() as u64,
        prefix,
        data_len,
        suffix: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::test_python::{python_with, run_python};
    use crate::format::{template, BlockFormat};

    /// The header numpy writes: data at a multiple of 64 bytes.
    fn encode_header(shape: &[u64], dtype: DType) -> Vec<u8> {
        encode_header_aligned(shape, dtype, DATA_ALIGNMENT)
    }

    fn dtype(text: &str) -> DType {
        text.parse().unwrap()
    }

    /// An npy preamble (magic, version, length) around `dict`, unpadded.
    fn raw_header(major: u8, dict: &str) -> Vec<u8> {
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&[major, 0]);
        if major == 1 {
            bytes.extend_from_slice(&(dict.len() as u16).to_le_bytes());
        } else {
            bytes.extend_from_slice(&(dict.len() as u32).to_le_bytes());
        }
        bytes.extend_from_slice(dict.as_bytes());
        bytes
    }

    #[test]
    fn encoded_headers_are_numpy_style_and_decode_back() {
        let header = encode_header(&[3, 4, 5], dtype("<u2"));
        assert_eq!(header.len(), 128);
        assert_eq!(&header[..8], b"\x93NUMPY\x01\x00");
        assert_eq!(u16::from_le_bytes([header[8], header[9]]), 118);
        let text = std::str::from_utf8(&header[10..]).unwrap();
        assert!(
            text.starts_with("{'descr': '<u2', 'fortran_order': False, 'shape': (3, 4, 5), }  "),
            "{text}"
        );
        assert!(text.ends_with(" \n"));
        assert!(encode_header(&[7], dtype("f8"))
            .windows(4)
            .any(|w| w == b"(7,)"));

        for shape in [
            vec![7],
            vec![7, 5],
            vec![7, 5, 3],
            vec![1; 8],
            vec![u64::MAX / 64; 8],
        ] {
            for descr in [
                "|u1", "<u2", ">u2", "<i4", ">i8", "<f2", ">f4", "<f8", "|i1",
            ] {
                let header = encode_header(&shape, dtype(descr));
                assert_eq!(header.len() % DATA_ALIGNMENT, 0, "{shape:?} {descr}");
                assert_eq!(header.last(), Some(&b'\n'));
                let decoded = decode_header(&header).unwrap();
                assert_eq!(decoded.shape, shape);
                assert_eq!(decoded.dtype.numpy_descr(), descr);
                assert!(!decoded.fortran_order);
                assert_eq!(decoded.data_offset, header.len() as u64);
            }
        }
    }

    /// Found by tests/fuzz_headers.rs: a byte inserted into a key made
    /// `'d\escr'`, which was read as `'descr'` (Python keeps the backslash
    /// of an escape it does not know), and the data from inside the header.
    #[test]
    fn string_escapes_are_read_as_python_reads_them() {
        let misspelt = raw_header(
            1,
            "{'d\\escr': '<u2', 'fortran_order': False, 'shape': (3,)}\n",
        );
        let HeaderProblem::Malformed(problem) = decode_header(&misspelt).unwrap_err() else {
            panic!("not malformed");
        };
        assert!(problem.contains("it has no 'descr' key"), "{problem}");
        let numbered = raw_header(
            1,
            "{'descr': '<u2', 'fortran_order': False, 'sh\\x61pe': (3,)}\n",
        );
        assert!(decode_header(&numbered).is_err());
        let quoted = raw_header(
            1,
            "{'descr': '<u2', 'fortran_order': False, 'shape': (3,), 'note': 'it\\'s \\\\ \\d'}\n",
        );
        assert_eq!(decode_header(&quoted).unwrap().shape, [3]);
    }

    #[test]
    fn decodes_headers_other_writers_make() {
        let cases = [
            // numpy 2 leaves room to grow the first axis in place.
            "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }                          \n",
            "{'shape': (2, 3), 'fortran_order': False, 'descr': '<f4'}\n",
            "{ \"descr\" : \"<f4\" ,\n 'fortran_order':False,'shape':(2,3,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 3L), }\n",
            "{'descr': '<f4', 'fortran_order': False, 'shape': [2, 3]}",
        ];
        for dict in cases {
            for major in [1, 2, 3] {
                let bytes = raw_header(major, dict);
                let header = decode_header(&bytes).unwrap_or_else(|e| panic!("{dict}: {e:?}"));
                assert_eq!(header.shape, [2, 3], "{dict}");
                assert_eq!(header.dtype, dtype("<f4"));
                assert_eq!(header.data_offset, bytes.len() as u64);
            }
        }
        let fortran = raw_header(1, "{'descr': '>u2', 'fortran_order': True, 'shape': (4,)}");
        let header = decode_header(&fortran).unwrap();
        assert!(header.fortran_order);
        assert_eq!(header.dtype, dtype(">u2"));
    }

    #[test]
    fn incomplete_header_asks_for_more() {
        let header = encode_header(&[3, 4], dtype("u1"));
        for cut in [0, 3, 6, 9, 20, header.len() - 1] {
            assert_eq!(
                decode_header(&header[..cut]),
                Err(HeaderProblem::Incomplete {
                    needed: if cut < 10 { 10 } else { header.len() }
                }),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn malformed_and_unsupported_headers_say_why() {
        let problem = |dict: &str| decode_header(&raw_header(1, dict)).unwrap_err();
        for (dict, expected) in [
            ("{'descr': '<f4', 'shape': (2,)}", "no 'fortran_order'"),
            (
                "{'descr': '<f4', 'fortran_order': 0, 'shape': (2,)}",
                "True or False",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (-2,)}",
                "sizes",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': 2}",
                "not a tuple",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (2,)",
                "missing",
            ),
            ("[1, 2]", "not a dict"),
        ] {
            match problem(dict) {
                HeaderProblem::Malformed(message) => {
                    assert!(message.contains(expected), "{dict}: {message}")
                }
                other => panic!("{dict}: {other:?}"),
            }
        }
        for (descr, expected) in [
            ("'<c8'", "complex"),
            ("'|b1'", "boolean"),
            ("'<f16'", "float of 16 bytes"),
            ("'<M8[ns]'", "date"),
            ("'|S4'", "byte strings"),
            ("[('a', '<i4')]", "structured"),
            ("'|u2'", "no byte order"),
        ] {
            let dict = format!("{{'descr': {descr}, 'fortran_order': False, 'shape': (2,)}}");
            match problem(&dict) {
                HeaderProblem::UnsupportedDtype(message) => {
                    assert!(message.contains(expected), "{descr}: {message}")
                }
                other => panic!("{descr}: {other:?}"),
            }
        }
        for bytes in [
            &b"PK\x03\x04 not npy"[..],
            b"\x89HDF\r\n\x1a\n\0\0\0\0",
            b"\x93NUMPX\x01\x00\x00\x00",
        ] {
            assert!(
                matches!(decode_header(bytes), Err(HeaderProblem::Malformed(_))),
                "{bytes:?}"
            );
        }
        let future = [&MAGIC[..], b"\x04\x00\x10\x00\x00\x00"].concat();
        match decode_header(&future) {
            Err(HeaderProblem::Malformed(message)) => {
                assert!(message.contains("version 4.0"), "{message}")
            }
            other => panic!("{other:?}"),
        }
    }

    fn write_block(
        dir: &Path,
        name: &str,
        shape: &[u64],
        descr: &str,
    ) -> (std::path::PathBuf, Vec<u8>) {
        let template = template(BlockFormat::Npy, shape, dtype(descr), "").unwrap();
        let data: Vec<u8> = (0..template.data_len).map(|i| (i * 7 + 3) as u8).collect();
        let path = dir.join(name);
        let file = template.create_file(&path).unwrap();
        file.write_all_at(&data, template.data_offset).unwrap();
        (path, data)
    }

    #[test]
    fn probe_reads_back_templates() {
        let dir = tempfile::tempdir().unwrap();
        let (path, _) = write_block(dir.path(), "a.npy", &[7, 5, 3], ">u2");
        let info = probe(&path).unwrap();
        assert_eq!(info.shape, [7, 5, 3]);
        assert_eq!(info.dtype, dtype(">u2"));
        assert_eq!(info.storage, Storage::Contiguous { data_offset: 128 });
        assert_eq!(info.data_len(), 7 * 5 * 3 * 2);
    }

    #[test]
    fn numpy_loads_templates_byte_exact() {
        if !python_with("numpy") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let shapes: [&[u64]; 5] = [
            &[7],
            &[7, 5],
            &[7, 5, 3],
            &[2, 3, 4, 5],
            &[1, 1, 1, 1, 1, 1, 1, 2],
        ];
        let descrs = [
            "|u1", "|i1", "<u2", ">u2", "<i4", ">u8", "<f2", ">f2", ">f4", "<f8",
        ];
        let mut cases = Vec::new();
        for (index, shape) in shapes.iter().enumerate() {
            for (descr_index, descr) in descrs.iter().enumerate() {
                let (path, data) = write_block(
                    dir.path(),
                    &format!("{index}_{descr_index}.npy"),
                    shape,
                    descr,
                );
                cases.push((path, descr, shape, data));
            }
        }
        // numpy writes what it loads next to each file; stdout says how it typed it.
        let output = run_python(
            "import numpy as np, sys\n\
             for path in sys.argv[1:]:\n\
             \x20   a = np.load(path)\n\
             \x20   open(path + '.bytes', 'wb').write(a.tobytes())\n\
             \x20   print(a.dtype.str, list(a.shape))\n",
            &cases.iter().map(|(path, ..)| path).collect::<Vec<_>>(),
        );
        let lines: Vec<&str> = std::str::from_utf8(&output).unwrap().lines().collect();
        assert_eq!(lines.len(), cases.len());
        for (line, (path, descr, shape, data)) in lines.iter().zip(&cases) {
            assert_eq!(*line, format!("{descr} {shape:?}"), "{path:?}");
            let loaded = std::fs::read(format!("{}.bytes", path.display())).unwrap();
            assert!(loaded == *data, "{path:?}: numpy loaded different bytes");
        }
    }

    #[test]
    fn probe_reads_numpy_files_and_refuses_what_it_cannot_carry() {
        if !python_with("numpy") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        run_python(
            "import numpy as np, sys, os\n\
             d = sys.argv[1]\n\
             np.save(os.path.join(d, 'ok.npy'), np.arange(60, dtype='>i2').reshape(3, 4, 5))\n\
             np.save(os.path.join(d, 'f2.npy'), np.arange(6, dtype='<f2'))\n\
             np.save(os.path.join(d, 'fortran.npy'), np.asfortranarray(np.zeros((3, 4), 'u2')))\n\
             np.save(os.path.join(d, 'complex.npy'), np.zeros(4, 'c8'))\n\
             np.save(os.path.join(d, 'bool.npy'), np.zeros(4, bool))\n\
             np.save(os.path.join(d, 'scalar.npy'), np.float32(3))\n\
             np.save(os.path.join(d, 'empty.npy'), np.zeros((0, 3), 'u1'))\n\
             np.save(os.path.join(d, 'nine.npy'), np.zeros((1,) * 9, 'u1'))\n\
             np.save(os.path.join(d, 'record.npy'), np.zeros(3, [('a', '<i4'), ('b', '<f8')]))\n",
            &[dir.path()],
        );
        let info = probe(&dir.path().join("ok.npy")).unwrap();
        assert_eq!(
            (info.shape.as_slice(), info.dtype),
            (&[3, 4, 5][..], dtype(">i2"))
        );
        assert_eq!(info.storage, Storage::Contiguous { data_offset: 128 });
        assert_eq!(
            probe(&dir.path().join("f2.npy")).unwrap().dtype,
            dtype("<f2")
        );

        for (name, expected) in [
            ("fortran.npy", "Fortran"),
            ("complex.npy", "'<c8' (complex)"),
            ("bool.npy", "'|b1' (boolean)"),
            ("scalar.npy", "0-dimensional"),
            ("empty.npy", "empty dimension"),
            ("nine.npy", "9 dimensions"),
            ("record.npy", "structured"),
        ] {
            let path = dir.path().join(name);
            let message = probe(&path).unwrap_err().to_string();
            assert!(message.contains(path.to_str().unwrap()), "{message}");
            assert!(message.contains(expected), "{name}: {message}");
        }
    }

    #[test]
    fn probe_refuses_broken_files_naming_them() {
        let dir = tempfile::tempdir().unwrap();
        let (whole, _) = write_block(dir.path(), "whole.npy", &[10, 10], "<u2");
        let bytes = std::fs::read(&whole).unwrap();
        let cases: [(&str, &[u8], &str); 5] = [
            ("short_data.npy", &bytes[..300], "truncated: its header promises (10, 10) of <u2 = 200 data bytes from offset 128, so 328 bytes in all, but the file has only 300"),
            ("short_header.npy", &bytes[..60], "truncated: its header needs 128 bytes but the file has only 60"),
            ("tiny.npy", &bytes[..4], "truncated"),
            ("empty.npy", b"", "the file is empty"),
            ("text.npy", b"hello, world, this is not an array", "does not start with the npy magic"),
        ];
        for (name, content, expected) in cases {
            let path = dir.path().join(name);
            std::fs::write(&path, content).unwrap();
            let err = probe(&path).unwrap_err();
            assert!(matches!(err, Error::BadBlockFile { .. }), "{name}: {err:?}");
            let message = err.to_string();
            assert!(message.starts_with(path.to_str().unwrap()), "{message}");
            assert!(message.contains(expected), "{name}: {message}");
        }
        let missing = dir.path().join("missing.npy");
        assert!(matches!(probe(&missing), Err(Error::Io { .. })));
    }
}
