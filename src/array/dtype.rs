//! Element types: what one voxel is (integer or float, width, byte order).
//!
//! rechunkfs never converts values; it moves bytes. The dtype matters only to
//! size every offset and to describe the data faithfully in each output
//! format's header, so the byte order travels with the type.

use std::fmt;
use std::str::FromStr;

use crate::error::Error;

/// Integer or float, the numeric kinds numpy and HDF5 share.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Unsigned,
    Signed,
    Float,
}

/// Byte order of a multi-byte element; one-byte elements are always `Little`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Endian {
    Little,
    Big,
}

/// One voxel's type: kind, width in bytes (1, 2, 4 or 8; floats 2, 4 or 8), byte order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DType {
    pub kind: Kind,
    pub size: usize,
    pub endian: Endian,
}

impl DType {
    /// A dtype, normalising the byte order of one-byte types to little.
    pub fn new(kind: Kind, size: usize, endian: Endian) -> Result<DType, Error> {
        let valid = match kind {
            Kind::Unsigned | Kind::Signed => matches!(size, 1 | 2 | 4 | 8),
            Kind::Float => matches!(size, 2 | 4 | 8),
        };
        if !valid {
            return Err(Error::UnsupportedDtype(format!(
                "{kind:?} of {size} bytes is not a numeric type rechunkfs supports"
            )));
        }
        let endian = if size == 1 { Endian::Little } else { endian };
        Ok(DType { kind, size, endian })
    }

    /// numpy's `descr` string: `<u2`, `>f4`, `|u1`.
    pub fn numpy_descr(&self) -> String {
        let order = match (self.size, self.endian) {
            (1, _) => '|',
            (_, Endian::Little) => '<',
            (_, Endian::Big) => '>',
        };
        format!("{order}{}{}", self.kind_char(), self.size)
    }

    fn kind_char(&self) -> char {
        match self.kind {
            Kind::Unsigned => 'u',
            Kind::Signed => 'i',
            Kind::Float => 'f',
        }
    }

    /// Rust-style name without byte order: `u16`, `f32`.
    pub fn rust_name(&self) -> String {
        format!("{}{}", self.kind_char(), self.size * 8)
    }
}

impl fmt::Display for DType {
    /// `u16`, or `u16 (big-endian)`: what a person reads in messages.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.size, self.endian) {
            (1, _) | (_, Endian::Little) => write!(f, "{}", self.rust_name()),
            (_, Endian::Big) => write!(f, "{} (big-endian)", self.rust_name()),
        }
    }
}

impl serde::Serialize for DType {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.numpy_descr())
    }
}

impl<'de> serde::Deserialize<'de> for DType {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl FromStr for DType {
    type Err = Error;

    /// Accepts what numpy users and Rust users write: `uint16`, `u2`, `<u2`,
    /// `>f4`, `float16`, `f2`, `u16`, `f16`, `int8`, `i1`, `|u1`, `=i4`.
    /// A bare name means little-endian (the native order on every machine
    /// this runs on).
    fn from_str(text: &str) -> Result<DType, Error> {
        let bad = || {
            Error::UnsupportedDtype(format!(
                "'{text}' is not a dtype; write it as numpy does (uint16, u2, <u2, >f4, float16) \
                 or as Rust does (u16, i32, f16, f64)"
            ))
        };
        let trimmed = text.trim();
        let (endian, rest, prefixed) = match trimmed.chars().next() {
            Some('<') | Some('=') | Some('|') => (Endian::Little, &trimmed[1..], true),
            Some('>') => (Endian::Big, &trimmed[1..], true),
            _ => (Endian::Little, trimmed, false),
        };
        let lower = rest.to_ascii_lowercase();
        let (kind, digits, bits) = if let Some(d) = lower.strip_prefix("uint") {
            (Kind::Unsigned, d, true)
        } else if let Some(d) = lower.strip_prefix("int") {
            (Kind::Signed, d, true)
        } else if let Some(d) = lower.strip_prefix("float") {
            (Kind::Float, d, true)
        } else if let Some(d) = lower.strip_prefix('u') {
            (Kind::Unsigned, d, false)
        } else if let Some(d) = lower.strip_prefix('i') {
            (Kind::Signed, d, false)
        } else if let Some(d) = lower.strip_prefix('f') {
            (Kind::Float, d, false)
        } else {
            return Err(bad());
        };
        let number: usize = digits.parse().map_err(|_| bad())?;
        // numpy counts bytes (`u2`, `<i8` = int64), Rust counts bits (`u16`,
        // `i8` = one byte). A byte-order prefix marks numpy's spelling; bare,
        // only `u8`/`i8` collide, and they mean Rust's one-byte types (numpy
        // users write `<u8` or `uint64` for eight bytes). `f8` has no Rust
        // reading, so it is numpy's float64.
        let counts_bytes =
            !bits && (prefixed || number < 8 || (number == 8 && kind == Kind::Float));
        let size = if counts_bytes {
            number
        } else {
            if number % 8 != 0 {
                return Err(bad());
            }
            number / 8
        };
        DType::new(kind, size, endian).map_err(|_| bad())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_agree() {
        let u16le = DType::new(Kind::Unsigned, 2, Endian::Little).unwrap();
        for s in ["uint16", "u2", "<u2", "u16", "=u2", "UINT16"] {
            assert_eq!(s.parse::<DType>().unwrap(), u16le, "{s}");
        }
        let f4be = DType::new(Kind::Float, 4, Endian::Big).unwrap();
        assert_eq!(">f4".parse::<DType>().unwrap(), f4be);
        assert_eq!(">float32".parse::<DType>().unwrap(), f4be);
        let f16 = DType::new(Kind::Float, 2, Endian::Little).unwrap();
        for s in ["float16", "f2", "f16", "<f2"] {
            assert_eq!(s.parse::<DType>().unwrap(), f16, "{s}");
        }
        assert_eq!("|u1".parse::<DType>().unwrap().numpy_descr(), "|u1");
        assert_eq!("int8".parse::<DType>().unwrap().numpy_descr(), "|i1");
        assert_eq!(
            "i8".parse::<DType>().unwrap().size,
            1,
            "bare i8 is Rust's one-byte type"
        );
        assert_eq!(
            "<i8".parse::<DType>().unwrap().size,
            8,
            "prefixed i8 is numpy's int64"
        );
        assert_eq!(
            "f8".parse::<DType>().unwrap().size,
            8,
            "f8 is numpy's float64"
        );
        assert_eq!("u64".parse::<DType>().unwrap().size, 8);
    }

    #[test]
    fn refusals_explain() {
        for s in ["u3", "complex64", "f1", "uint12", "", "x4"] {
            let err = s.parse::<DType>().unwrap_err().to_string();
            assert!(err.contains("not a dtype"), "{s}: {err}");
        }
    }
}
