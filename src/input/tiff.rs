//! TIFF input: a stack of 2-D slices (a directory of `.tif` files, or a
//! glob naming them, in natural order) or one multi-page file, as one
//! array (Z, Y, X); for pixels of S samples, (Z, Y, X, S), or (Z, S, Y, X)
//! when the samples are stored in planes. A single-page file drops Z, as
//! tifffile reads it.
//!
//! Input blocks follow what the files store, so every read is one the
//! planner predicts:
//! - pages that are uncompressed, in strips lying one after another, are
//!   blocks of a whole page (1, Y, X), read in place at their offset;
//! - otherwise each strip (1, rows, X) or tile (1, length, width), of one
//!   plane when samples are in planes, is a block: read in place when
//!   uncompressed (tiles padded at the edges, as TIFF stores them), else
//!   read whole and decoded ([`crate::format::tiff::ChunkDecode`]). A
//!   strip or tile of no bytes is absent and reads as zeros, as tifffile
//!   reads it.
//!
//! Several blocks share a file; each is read as if it were a file of its own.

use std::cmp::Ordering;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::array::InputArray;
use super::block::InputBlock;
use crate::array::dtype::{DType, Endian};
use crate::array::geometry::{self, FileShape};
use crate::error::{Error, Result};
use crate::format::tiff::{self, Chunking, Page, TiffFile};
use crate::format::{BlockFormat, Storage};

/// The most input blocks a TIFF input may have (as for a Zarr array's
/// chunks: each is an entry in memory).
const MAX_BLOCKS: u64 = 1 << 24;

/// One page of the input, with the file it is in.
struct Slice<'a> {
    path: &'a Path,
    file: &'a TiffFile,
    page: &'a Page,
}

impl Slice<'_> {
    /// The page as messages name it.
    fn name(&self) -> String {
        if self.file.pages.len() == 1 {
            self.path.display().to_string()
        } else {
            format!("{} (page {})", self.path.display(), self.page.number)
        }
    }
}

/// One TIFF file: its pages along Z, or a single page as a 2-D array.
pub(super) fn scan_file(path: &Path) -> Result<InputArray> {
    let file = tiff::read_file(path)?;
    let single_page = file.pages.len() == 1;
    assemble(path, &[(path.to_path_buf(), file)], single_page)
}

/// A stack of TIFF files, one page each, in this order along Z.
pub(super) fn scan_stack(source: &Path, paths: Vec<PathBuf>) -> Result<InputArray> {
    let mut files = Vec::with_capacity(paths.len());
    for path in paths {
        let file = tiff::read_file(&path)?;
        if file.pages.len() != 1 {
            return Err(Error::bad_input(
                &path,
                format!(
                    "has {} pages, but a stack's slices are one page each; pass a multi-page \
                     file on its own as IN",
                    file.pages.len()
                ),
            ));
        }
        files.push((path, file));
    }
    assemble(source, &files, false)
}

/// The TIFF files of directory `dir`, in natural order (`z2` before `z10`),
/// or `None` if it holds none. Hidden files are skipped; a directory that
/// also holds block files of another format is refused.
pub(super) fn stack_in(dir: &Path) -> Result<Option<Vec<PathBuf>>> {
    let mut tiffs = Vec::new();
    let mut other = None;
    let entries = fs::read_dir(dir).map_err(|e| Error::io(dir, "listing", e))?;
    for entry in entries {
        let path = entry.map_err(|e| Error::io(dir, "listing", e))?.path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        if name.as_deref().is_none_or(|n| n.starts_with('.')) {
            continue;
        }
        if tiff::is_tiff_name(&path) {
            tiffs.push(path);
        } else if path
            .extension()
            .and_then(|e| e.to_str())
            .and_then(BlockFormat::from_extension)
            .is_some()
        {
            other = Some(path);
        }
    }
    if tiffs.is_empty() {
        return Ok(None);
    }
    if let Some(other) = other {
        return Err(Error::bad_input(
            dir,
            format!(
                "holds TIFF slices ({}) and other block files ({}); keep one kind per directory",
                tiffs[0].display(),
                other.display()
            ),
        ));
    }
    tiffs.sort_by(|a, b| natural_order(&a.to_string_lossy(), &b.to_string_lossy()));
    Ok(Some(tiffs))
}

/// Whether `path` is a pattern (holds `*` or `?`) rather than a name.
pub(super) fn is_pattern(path: &Path) -> bool {
    path.to_string_lossy().contains(['*', '?'])
}

/// The stack of TIFF files a glob `pattern` names (wildcards `*` and `?` in
/// its last component), in natural order.
pub(super) fn scan_pattern(pattern: &Path) -> Result<InputArray> {
    let dir = match pattern.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if is_pattern(&dir) {
        return Err(Error::bad_input(
            pattern,
            "wildcards (* and ?) work in the file name only, not in the directories above it",
        ));
    }
    let wanted = pattern
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let entries = fs::read_dir(&dir).map_err(|e| Error::io(&dir, "listing", e))?;
    let mut paths = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(&dir, "listing", e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !glob_match(wanted.as_bytes(), name.as_bytes()) {
            continue;
        }
        let path = entry.path();
        if !tiff::is_tiff_name(&path) {
            return Err(Error::bad_input(
                &path,
                format!(
                    "matches {} but is not a TIFF file (.tif or .tiff); narrow the pattern",
                    pattern.display()
                ),
            ));
        }
        paths.push(path);
    }
    if paths.is_empty() {
        return Err(Error::bad_input(
            pattern,
            "matches no files; check the pattern (quote it, so that rechunkfs, not the shell, \
             expands it)",
        ));
    }
    paths.sort_by(|a, b| natural_order(&a.to_string_lossy(), &b.to_string_lossy()));
    scan_stack(pattern, paths)
}

/// Whether `name` matches the glob `pattern` (`*`: any run, `?`: any one byte).
fn glob_match(pattern: &[u8], name: &[u8]) -> bool {
    match pattern.split_first() {
        None => name.is_empty(),
        Some((b'*', rest)) => (0..=name.len()).any(|skip| glob_match(rest, &name[skip..])),
        Some((&p, rest)) => name
            .split_first()
            .is_some_and(|(&n, tail)| (p == b'?' || p == n) && glob_match(rest, tail)),
    }
}

/// Names in natural order: runs of digits compare by their value.
fn natural_order(a: &str, b: &str) -> Ordering {
    let (mut a, mut b) = (a.as_bytes(), b.as_bytes());
    loop {
        match (a.first(), b.first()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(x), Some(y)) if x.is_ascii_digit() && y.is_ascii_digit() => {
                let run = |s: &[u8]| s.iter().take_while(|c| c.is_ascii_digit()).count();
                let (na, nb) = (run(a), run(b));
                let strip = |s: &[u8]| -> usize { s.iter().take_while(|&&c| c == b'0').count() };
                let (da, db) = (
                    &a[strip(&a[..na]).min(na)..na],
                    &b[strip(&b[..nb]).min(nb)..nb],
                );
                let order = da.len().cmp(&db.len()).then(da.cmp(db)).then(na.cmp(&nb));
                if order != Ordering::Equal {
                    return order;
                }
                (a, b) = (&a[na..], &b[nb..]);
            }
            (Some(x), Some(y)) => {
                if x != y {
                    return x.cmp(y);
                }
                (a, b) = (&a[1..], &b[1..]);
            }
        }
    }
}

/// The array the pages of `files` make, one after another along Z;
/// `squeeze` drops Z (a single page's 2-D array).
fn assemble(source: &Path, files: &[(PathBuf, TiffFile)], squeeze: bool) -> Result<InputArray> {
    let slices: Vec<Slice> = files
        .iter()
        .flat_map(|(path, file)| {
            file.pages
                .iter()
                .map(move |page| Slice { path, file, page })
        })
        .collect();
    let Some(first) = slices.first() else {
        return Err(Error::bad_input(source, "holds no TIFF pages"));
    };
    for slice in &slices[1..] {
        check_like(slice, first)?;
    }
    let whole_pages = slices.iter().all(|s| s.page.contiguous_offset().is_some());
    let page = first.page;
    let depth = slices.len() as u64;
    let mut shape = vec![depth];
    shape.extend(page.shape());
    crate::format::shape_problem(&shape, page.dtype)
        .map_err(|problem| Error::bad_input(source, format!("as one array, {problem}")))?;
    let (mut block_shape, mut files_shape, blocks) = if whole_pages {
        let mut block = vec![1];
        block.extend(page.shape());
        (block, FileShape::Exact, page_blocks(&slices)?)
    } else {
        chunk_blocks(first, &slices)?
    };
    if squeeze {
        shape.remove(0);
        block_shape.remove(0);
        files_shape = match files_shape {
            FileShape::Exact => FileShape::Exact,
            FileShape::Padded(mut chunk) => {
                chunk.remove(0);
                FileShape::Padded(chunk)
            }
            FileShape::Encoded { padded_to } => FileShape::Encoded {
                padded_to: padded_to.map(|mut chunk| {
                    chunk.remove(0);
                    chunk
                }),
            },
        };
    }
    Ok(InputArray {
        source: source.to_path_buf(),
        format: BlockFormat::Tiff,
        dataset: String::new(),
        dtype: page.dtype,
        shape,
        block_shape,
        files: files_shape,
        blocks,
    })
}

/// Refuses `slice` unless its page has `first`'s size, samples and type.
fn check_like(slice: &Slice, first: &Slice) -> Result<()> {
    let (a, b) = (slice.page, first.page);
    let problem = if a.shape() != b.shape() {
        format!(
            "is {} ({}) but {} is {} ({})",
            geometry::show_shape(&a.shape()),
            a.axes_text(),
            first.name(),
            geometry::show_shape(&b.shape()),
            b.axes_text()
        )
    } else if a.dtype != b.dtype && a.dtype.kind == b.dtype.kind && a.dtype.size == b.dtype.size {
        format!(
            "stores its samples {} but {} {}: rechunkfs keeps the stored byte order, so the \
             slices must share one; rewrite them in one (tifffile: byteorder='<')",
            byte_order_text(a.dtype),
            first.name(),
            byte_order_text(b.dtype)
        )
    } else if a.dtype != b.dtype {
        format!(
            "holds {} samples but {} holds {}",
            a.dtype,
            first.name(),
            b.dtype
        )
    } else {
        return Ok(());
    };
    Err(Error::bad_input(
        slice.path,
        format!(
            "{}{problem}: the slices of one array must agree in size and type",
            page_prefix(slice)
        ),
    ))
}

fn byte_order_text(dtype: DType) -> &'static str {
    match dtype.endian {
        Endian::Big => "big-endian",
        Endian::Little => "little-endian",
    }
}

/// "page N " for a page of a multi-page file, nothing for a slice file.
fn page_prefix(slice: &Slice) -> String {
    if slice.file.pages.len() == 1 {
        String::new()
    } else {
        format!("page {} ", slice.page.number)
    }
}

/// One block per page, read in place at the page's first strip.
fn page_blocks(slices: &[Slice]) -> Result<Vec<InputBlock>> {
    slices
        .iter()
        .map(|slice| {
            let page = slice.page;
            let offset = page.contiguous_offset().unwrap_or(0);
            let len = page.page_bytes();
            check_within(slice, offset, len, "its data")?;
            Ok(InputBlock {
                path: slice.path.to_path_buf(),
                storage: Storage::Contiguous {
                    data_offset: offset,
                },
                check: None,
            })
        })
        .collect()
}

/// Refuses a byte range past the end of the slice's file.
fn check_within(slice: &Slice, offset: u64, len: u64, what: &str) -> Result<()> {
    let end = offset.checked_add(len);
    if end.is_none_or(|end| end > slice.file.len) {
        return Err(Error::bad_input(
            slice.path,
            format!(
                "{}{what} ({len} bytes at byte {offset}) end past the file's {} bytes: the file \
                 is truncated; copy it again from its source",
                page_prefix(slice),
                slice.file.len
            ),
        ));
    }
    Ok(())
}

/// One block per strip or tile of every page, which must all be cut like
/// the `first`'s: the block shape, how files hold blocks, and the blocks in
/// C order.
fn chunk_blocks(first: &Slice, slices: &[Slice]) -> Result<(Vec<u64>, FileShape, Vec<InputBlock>)> {
    let page = first.page;
    let (rows, width) = page.chunk_extent();
    for slice in slices {
        if slice.page.chunk_extent() != (rows, width)
            || std::mem::discriminant(&slice.page.chunking)
                != std::mem::discriminant(&page.chunking)
        {
            return Err(Error::bad_input(
                slice.path,
                format!(
                    "{}is cut into {} but {} into {}: rechunkfs reads pages cut alike (unless \
                     they are uncompressed with their strips in order); rewrite the slices with \
                     one layout (tifffile: the same rowsperstrip or tile)",
                    page_prefix(slice),
                    slice.page.layout_text(),
                    first.name(),
                    page.layout_text()
                ),
            ));
        }
    }
    let encoded = slices.iter().any(|s| s.page.is_encoded());
    let count = slices.len() as u64 * page.offsets.len() as u64;
    if count > MAX_BLOCKS {
        return Err(Error::bad_input(
            first.path,
            format!(
                "its pages make {count} strips or tiles, more than the {MAX_BLOCKS} rechunkfs \
                 lists; rewrite them with larger strips or tiles"
            ),
        ));
    }
    let mut blocks = Vec::with_capacity(count as usize);
    for slice in slices {
        for chunk in 0..slice.page.offsets.len() {
            blocks.push(chunk_block(slice, chunk, encoded)?);
        }
    }
    let (mut chunk, mut block_shape) = (vec![1], vec![1]);
    if page.planar {
        chunk.push(1);
        block_shape.push(1);
    }
    chunk.extend([rows, width]);
    block_shape.extend([rows.min(page.height), width.min(page.width)]);
    if page.samples > 1 && !page.planar {
        chunk.push(page.samples);
        block_shape.push(page.samples);
    }
    let files = match (encoded, page.chunking) {
        (true, _) => FileShape::Encoded {
            padded_to: Some(chunk),
        },
        (false, Chunking::Tiles { .. }) => FileShape::Padded(chunk),
        (false, Chunking::Strips { .. }) => FileShape::Exact,
    };
    Ok((block_shape, files, blocks))
}

/// The block of strip or tile `chunk` of `slice`'s page: decoded when
/// `encoded` (any page of the array is), else read in place.
fn chunk_block(slice: &Slice, chunk: usize, encoded: bool) -> Result<InputBlock> {
    let page = slice.page;
    let offset = page.offsets[chunk];
    let len = page.byte_counts[chunk];
    let path = slice.path.to_path_buf();
    let what = format!("{} {chunk}", chunk_kind(page));
    if len == 0 {
        // Never written: tifffile reads such a chunk as zeros.
        return Ok(InputBlock {
            path,
            storage: Storage::Absent {
                fill: vec![0; page.dtype.size],
            },
            check: None,
        });
    }
    if encoded {
        check_within(slice, offset, len, &what)?;
        let decoder = page.chunk_decoder(chunk, slice.file.byte_order);
        crate::format::decode::check_holds(&decoder, &path, len)?;
        return Ok(InputBlock {
            path,
            storage: Storage::Encoded {
                decoder: Arc::new(decoder),
                offset,
                len,
            },
            check: None,
        });
    }
    let (_, width) = page.chunk_extent();
    let needed = page.chunk_rows(chunk) * width * page.pixel_bytes();
    if len < needed {
        return Err(Error::bad_input(
            &path,
            format!(
                "{}{what} holds {len} bytes where its pixels need {needed}: the file is damaged",
                page_prefix(slice)
            ),
        ));
    }
    check_within(slice, offset, needed, &what)?;
    Ok(InputBlock {
        path,
        storage: Storage::Contiguous {
            data_offset: offset,
        },
        check: None,
    })
}

fn chunk_kind(page: &Page) -> &'static str {
    match page.chunking {
        Chunking::Strips { .. } => "strip",
        Chunking::Tiles { .. } => "tile",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_sort_naturally() {
        let mut names = vec!["z10.tif", "z2.tif", "z1.tif", "z02.tif", "a.tif"];
        names.sort_by(|a, b| natural_order(a, b));
        assert_eq!(names, ["a.tif", "z1.tif", "z2.tif", "z02.tif", "z10.tif"]);
    }

    #[test]
    fn globs_match_names() {
        assert!(glob_match(b"slice_*.tif", b"slice_0001.tif"));
        assert!(glob_match(b"slice_?.tif", b"slice_1.tif"));
        assert!(!glob_match(b"slice_?.tif", b"slice_12.tif"));
        assert!(!glob_match(b"*.tif", b"a.tiff"));
        assert!(glob_match(b"*", b""));
    }
}
