//! How block files are named: a grid index as `3_0_12` (block files), or
//! as a chunk key (`3.0.12`, `c/3/0/12`) joined by a separator, with an
//! optional prefix and suffix. One mechanism names block files, Zarr v2
//! chunks and Zarr v3 nested chunks; which key a format uses is the
//! format's business.

use super::axes::AxisOrder;

/// Parses `3_0_12` into `[3, 0, 12]`.
pub fn parse_grid_index(stem: &str) -> Option<Vec<usize>> {
    stem.split('_')
        .map(|part| {
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                None
            } else {
                part.parse().ok()
            }
        })
        .collect()
}

/// Formats a grid index the way block files are named: `3_0_12`.
pub fn grid_name(index: &[usize]) -> String {
    index
        .iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join("_")
}

/// The file name of block `index` with `extension`: `3_0_12.h5`.
pub fn block_file_name(index: &[usize], extension: &str) -> String {
    format!("{}.{extension}", grid_name(index))
}

/// How an output block's grid index becomes a path: `prefix`, then the
/// indices joined by `separator`, then `suffix`. With `/` as separator each
/// index but the last names a directory (Zarr's nested keys).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkKey {
    /// A first path component (`c` for Zarr v3 default keys), if any.
    pub prefix: Option<String>,
    pub separator: char,
    /// Appended to the last component (`.h5`), often empty.
    pub suffix: String,
    /// The order indices are written in: the user's for block files (see
    /// [`crate::array::axes`]); Zarr keys are always in the array's C order.
    pub order: AxisOrder,
}

impl ChunkKey {
    /// Block files: `{i}_{j}_{k}.{ext}`.
    pub fn block_files(extension: &str) -> ChunkKey {
        ChunkKey {
            prefix: None,
            separator: '_',
            suffix: format!(".{extension}"),
            order: AxisOrder::C,
        }
    }

    /// Zarr v2's default: `{i}.{j}.{k}` (dimension_separator ".").
    pub fn zarr_v2() -> ChunkKey {
        ChunkKey {
            prefix: None,
            separator: '.',
            suffix: String::new(),
            order: AxisOrder::C,
        }
    }

    /// Zarr v3's default chunk key encoding: `c/{i}/{j}/{k}`.
    pub fn zarr_v3() -> ChunkKey {
        ChunkKey {
            prefix: Some("c".into()),
            separator: '/',
            suffix: String::new(),
            order: AxisOrder::C,
        }
    }

    /// The same key, writing indices in `order`.
    pub fn in_order(mut self, order: AxisOrder) -> ChunkKey {
        self.order = order;
        self
    }

    pub fn is_nested(&self) -> bool {
        self.separator == '/'
    }

    /// The path of block `index`, components joined by `/`.
    pub fn path(&self, index: &[usize]) -> String {
        let index = &self.order.to_user(index);
        let joined = if self.separator == '_' {
            grid_name(index)
        } else {
            index
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(&self.separator.to_string())
        };
        match &self.prefix {
            Some(prefix) => format!("{prefix}{}{joined}{}", self.separator, self.suffix),
            None => format!("{joined}{}", self.suffix),
        }
    }

    /// The grid index a flat name stands for, if it is one of `grid`'s
    /// (no leading zeros, each index inside the grid).
    pub fn parse_flat(&self, name: &str, grid: &[usize]) -> Option<Vec<usize>> {
        let mut rest = name.strip_suffix(self.suffix.as_str())?;
        if let Some(prefix) = &self.prefix {
            rest = rest
                .strip_prefix(prefix.as_str())?
                .strip_prefix(self.separator)?;
        }
        let parts: Vec<&str> = rest.split(self.separator).collect();
        if parts.len() != grid.len() {
            return None;
        }
        let user_grid = self.order.to_user(grid);
        let user_index: Option<Vec<usize>> = parts
            .iter()
            .zip(&user_grid)
            .map(|(part, &n)| parse_component(part, n))
            .collect();
        Some(self.order.to_internal(&user_index?))
    }
}

/// A decimal index below `n`, written without leading zeros.
pub fn parse_component(text: &str, n: usize) -> Option<usize> {
    if text.is_empty()
        || !text.bytes().all(|b| b.is_ascii_digit())
        || (text.len() > 1 && text.starts_with('0'))
    {
        return None;
    }
    text.parse().ok().filter(|&i| i < n)
}
