//! The `Range` header of a request (RFC 9110 §14): which bytes of a file of
//! known length to send. One range of bytes is answered with those bytes;
//! a header with several ranges, an unknown unit or a syntax error is
//! ignored (the whole file, as the RFC allows), so a client never gets a
//! multipart body it must split.

/// What to send of a file, after its `Range` header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wanted {
    /// The whole file (no range, or one the server ignores).
    Whole,
    /// Bytes `start..end` of it (end exclusive, never empty).
    Part { start: u64, end: u64 },
    /// A range that selects none of the file's bytes: 416.
    Unsatisfiable,
}

/// The bytes `header` asks for of a file of `len` bytes.
pub fn wanted(header: Option<&str>, len: u64) -> Wanted {
    let Some(header) = header else {
        return Wanted::Whole;
    };
    let Some((unit, specs)) = header.trim().split_once('=') else {
        return Wanted::Whole;
    };
    if !unit.trim().eq_ignore_ascii_case("bytes") {
        return Wanted::Whole;
    }
    let specs: Vec<&str> = specs.split(',').map(str::trim).collect();
    match specs.as_slice() {
        [one] => one_range(one, len).unwrap_or(Wanted::Whole),
        _ => Wanted::Whole,
    }
}

/// One `first-last`, `first-` or `-suffix`; `None` when malformed.
fn one_range(spec: &str, len: u64) -> Option<Wanted> {
    let (first, last) = spec.split_once('-')?;
    let (first, last) = (first.trim(), last.trim());
    if first.is_empty() {
        let suffix = number(last)?;
        if suffix == 0 || len == 0 {
            return Some(Wanted::Unsatisfiable);
        }
        return Some(Wanted::Part {
            start: len - suffix.min(len),
            end: len,
        });
    }
    let start = number(first)?;
    let end = if last.is_empty() {
        len
    } else {
        let last = number(last)?;
        if last < start {
            return None;
        }
        last.saturating_add(1).min(len)
    };
    if start >= len {
        return Some(Wanted::Unsatisfiable);
    }
    Some(Wanted::Part { start, end })
}

/// A run of decimal digits; one too large for 64 bits is past any file.
fn number(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(text.parse().unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(start: u64, end: u64) -> Wanted {
        Wanted::Part { start, end }
    }

    #[test]
    fn first_last_open_ended_and_suffix_ranges() {
        assert_eq!(wanted(Some("bytes=0-99"), 1000), part(0, 100));
        assert_eq!(wanted(Some("bytes=990-2000"), 1000), part(990, 1000));
        assert_eq!(wanted(Some("bytes=5-5"), 1000), part(5, 6));
        assert_eq!(wanted(Some("bytes=100-"), 1000), part(100, 1000));
        assert_eq!(wanted(Some("bytes=-10"), 1000), part(990, 1000));
        assert_eq!(wanted(Some("bytes=-5000"), 1000), part(0, 1000));
        assert_eq!(wanted(Some(" Bytes = 1-2 "), 1000), part(1, 3));
        assert_eq!(
            wanted(Some("bytes=3-99999999999999999999999"), 10),
            part(3, 10)
        );
    }

    #[test]
    fn ranges_past_the_end_are_unsatisfiable() {
        assert_eq!(wanted(Some("bytes=1000-"), 1000), Wanted::Unsatisfiable);
        assert_eq!(wanted(Some("bytes=1000-1001"), 1000), Wanted::Unsatisfiable);
        assert_eq!(wanted(Some("bytes=-0"), 1000), Wanted::Unsatisfiable);
        assert_eq!(wanted(Some("bytes=0-"), 0), Wanted::Unsatisfiable);
        assert_eq!(wanted(Some("bytes=-1"), 0), Wanted::Unsatisfiable);
        assert_eq!(
            wanted(Some("bytes=99999999999999999999999-"), 10),
            Wanted::Unsatisfiable
        );
    }

    #[test]
    fn what_is_not_one_valid_byte_range_asks_for_the_whole_file() {
        for header in [
            "bytes=0-1,5-6",
            "bytes=5-1",
            "bytes=a-b",
            "bytes=-",
            "bytes=1",
            "items=0-1",
            "0-1",
            "bytes=+1-2",
            "bytes=1 2-3",
            "",
        ] {
            assert_eq!(wanted(Some(header), 1000), Wanted::Whole, "{header:?}");
        }
        assert_eq!(wanted(None, 1000), Wanted::Whole);
    }
}
