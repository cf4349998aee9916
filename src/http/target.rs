//! A request's target (`/c/0/1?x=y`) as the names of a path inside the
//! served root. Names are percent-decoded one by one, after the target is
//! split at its slashes, so that an encoded slash (`%2f`) cannot join two
//! names; `.` and `..`, written plainly or encoded (`%2e%2e`), are refused
//! outright rather than resolved, so no target names anything above the
//! root. Empty names (`a//b`, a trailing slash) are skipped. A target in
//! absolute form (`http://host/c/0`) names its path the same way; which
//! host it names is the caller's to judge ([`absolute_form`]).

/// Why a target names no path inside the root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BadTarget {
    /// Not a path (`*`, `ftp://host/...`), a bad `%` escape, a name
    /// that is not UTF-8 or holds a NUL: 400.
    Malformed(&'static str),
    /// A `.` or `..` name, or an encoded slash inside a name: 403.
    Outside(&'static str),
}

/// The names of the path `target` asks for, from the root down.
pub fn path_names(target: &str) -> Result<Vec<String>, BadTarget> {
    let (target, absolute) = match absolute_form(target) {
        Some((_, path)) => (path, true),
        None => (target, false),
    };
    let path = target.split(['?', '#']).next().unwrap_or("");
    let path = match path.strip_prefix('/') {
        Some(path) => path,
        // `http://host` and `http://host?x` name the root (RFC 9112 §3.2.2).
        None if absolute && path.is_empty() => "",
        None => return Err(BadTarget::Malformed("the target is not a path")),
    };
    let mut names = Vec::new();
    for raw in path.split('/').filter(|raw| !raw.is_empty()) {
        let name = decoded(raw)?;
        if name == "." || name == ".." {
            return Err(BadTarget::Outside("a `.` or `..` name"));
        }
        if name.contains('/') {
            return Err(BadTarget::Outside("an encoded slash"));
        }
        if name.contains('\0') {
            return Err(BadTarget::Malformed("a NUL in a name"));
        }
        names.push(name);
    }
    Ok(names)
}

/// A target in absolute form (`http://host:port/path?query`) as its
/// authority (`host:port`) and the rest (`/path?query`, maybe empty);
/// `None` for any other form.
pub fn absolute_form(target: &str) -> Option<(&str, &str)> {
    let (scheme, rest) = target.split_once("://")?;
    if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
        return None;
    }
    Some(rest.split_at(rest.find(['/', '?', '#']).unwrap_or(rest.len())))
}

/// `raw` with its `%XX` escapes decoded.
fn decoded(raw: &str) -> Result<String, BadTarget> {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == b'%' {
            let hex = bytes
                .get(at + 1..at + 3)
                .and_then(|pair| std::str::from_utf8(pair).ok())
                .and_then(|pair| u8::from_str_radix(pair, 16).ok())
                .ok_or(BadTarget::Malformed("a bad % escape"))?;
            out.push(hex);
            at += 3;
        } else {
            out.push(bytes[at]);
            at += 1;
        }
    }
    String::from_utf8(out).map_err(|_| BadTarget::Malformed("a name that is not UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(target: &str) -> Vec<String> {
        path_names(target).unwrap_or_else(|e| panic!("{target}: {e:?}"))
    }

    #[test]
    fn targets_become_names_decoded_one_by_one() {
        assert_eq!(names("/"), Vec::<String>::new());
        assert_eq!(names("/.zarray"), [".zarray"]);
        assert_eq!(names("/c/0/1"), ["c", "0", "1"]);
        assert_eq!(names("//c//0/"), ["c", "0"]);
        assert_eq!(names("/a%20b/%41?x=/../#frag"), ["a b", "A"]);
        assert_eq!(names("/0.1.2"), ["0.1.2"]);
        assert_eq!(names("/...."), ["...."]);
        assert_eq!(names("http://localhost:8000/c/0"), ["c", "0"]);
        assert_eq!(names("HTTP://localhost"), Vec::<String>::new());
        assert_eq!(
            absolute_form("http://a.example:80/x?y"),
            Some(("a.example:80", "/x?y"))
        );
        assert_eq!(absolute_form("/http://a/x"), None);
    }

    #[test]
    fn dot_dot_plain_or_encoded_and_encoded_slashes_are_refused() {
        for target in [
            "/..",
            "/../etc/passwd",
            "/a/../../b",
            "/%2e%2e/secret",
            "/%2E%2E/secret",
            "/.%2e/secret",
            "/a/.",
            "/a%2fb",
            "http://localhost/../secret",
            "/..%2fsecret",
            "/%2e%2e%2fsecret",
        ] {
            assert!(
                matches!(path_names(target), Err(BadTarget::Outside(_))),
                "{target}"
            );
        }
    }

    #[test]
    fn malformed_targets_are_bad_requests() {
        for target in [
            "*",
            "ftp://host/a",
            "http:/a",
            "",
            "/a%",
            "/a%2",
            "/a%zz",
            "/%ff",
            "/a%00b",
        ] {
            assert!(
                matches!(path_names(target), Err(BadTarget::Malformed(_))),
                "{target}"
            );
        }
    }
}
