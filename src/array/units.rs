//! Byte sizes as people write them (`4G`, `512M`, `1.5GiB`, `1000000`) and
//! as they read them back.
//!
//! `K`, `M`, `G`, `T` and their `KiB`/`KB`/`k` variants all mean powers of
//! 1024: memory is what `--mem` sizes, and memory is counted in binary.
//!
//! Also the units of axes: OME-Zarr's names (UDUNITS-2, `millimeter`) as
//! Neuroglancer's SI base units (`m`, `s`) and factors.

use crate::error::{Error, Result};

/// Parses a size such as `4G`, `512M`, `1.5GiB`, `64k` or `1000000`.
pub fn parse_bytes(text: &str) -> Result<u64> {
    let bad = || {
        Error::BadArgument(format!(
            "'{text}' is not a size; write e.g. 4G, 512M, 1.5GiB, 64K or a number of bytes"
        ))
    };
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let value: f64 = number.parse().map_err(|_| bad())?;
    let unit = unit.trim().to_ascii_lowercase();
    let unit = unit.trim_end_matches('b').trim_end_matches('i');
    let multiplier: u64 = match unit {
        "" => 1,
        "k" => 1 << 10,
        "m" => 1 << 20,
        "g" => 1 << 30,
        "t" => 1 << 40,
        _ => return Err(bad()),
    };
    let bytes = value * multiplier as f64;
    if !bytes.is_finite() || bytes < 1.0 || bytes > u64::MAX as f64 {
        return Err(bad());
    }
    Ok(bytes.round() as u64)
}

/// `1.5 GiB`, `512 MiB`, `100 B`: three significant figures.
pub fn show_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else if value >= 100.0 {
        format!("{value:.0} {}", UNITS[unit])
    } else if value >= 10.0 {
        format!("{value:.1} {}", UNITS[unit])
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}

/// Parses a comma-separated shape: `256,256,256`.
pub fn parse_shape(text: &str) -> Result<Vec<u64>> {
    let parts: Result<Vec<u64>> = text
        .split(',')
        .map(|part| {
            let part = part.trim();
            match part.parse::<u64>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(Error::BadArgument(format!(
                    "'{text}' is not a shape: each of its comma-separated sides must be a \
                     positive whole number (e.g. 256,256,256); '{part}' is not"
                ))),
            }
        })
        .collect();
    parts
}

/// An OME-Zarr axis unit as Neuroglancer writes it: the factor to an SI
/// base unit, and that unit (`millimeter` is 1e-3 `m`); `None` if unknown.
pub fn si_unit(name: &str) -> Option<(f64, &'static str)> {
    let length = |factor| Some((factor, "m"));
    let time = |factor| Some((factor, "s"));
    match name {
        "meter" => length(1.0),
        "centimeter" => length(1e-2),
        "millimeter" => length(1e-3),
        "micrometer" => length(1e-6),
        "nanometer" => length(1e-9),
        "angstrom" => length(1e-10),
        "second" => time(1.0),
        "millisecond" => time(1e-3),
        "microsecond" => time(1e-6),
        "minute" => time(60.0),
        "hour" => time(3600.0),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("4G").unwrap(), 4 << 30);
        assert_eq!(parse_bytes("512M").unwrap(), 512 << 20);
        assert_eq!(parse_bytes("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_bytes("1000000").unwrap(), 1_000_000);
        assert_eq!(parse_bytes("64kB").unwrap(), 65536);
        for bad in ["", "G", "4X", "-1", "0", "1.2.3M"] {
            assert!(
                parse_bytes(bad)
                    .unwrap_err()
                    .to_string()
                    .contains("not a size"),
                "{bad}"
            );
        }
        assert_eq!(show_bytes(3 << 29), "1.50 GiB");
        assert_eq!(show_bytes(100), "100 B");
    }

    #[test]
    fn axis_units_in_si() {
        assert_eq!(si_unit("millimeter"), Some((1e-3, "m")));
        assert_eq!(si_unit("millisecond"), Some((1e-3, "s")));
        assert_eq!(si_unit("parsec"), None);
    }

    #[test]
    fn shapes() {
        assert_eq!(parse_shape("256, 256,256").unwrap(), vec![256, 256, 256]);
        assert!(parse_shape("256,0")
            .unwrap_err()
            .to_string()
            .contains("'0' is not"));
        assert!(parse_shape("a,b").is_err());
    }
}
