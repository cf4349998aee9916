//! Reading the headers of an input's block files, which on a cold cache is
//! most of a scan's time: headers are read ahead of the probe, identical
//! ones are parsed once, and with deferred checks only a few blocks of each
//! kind are probed while the others are matched later against their header.

use std::collections::btree_map::Entry;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::block::HeaderCheck;
use crate::error::{Error, Result};
use crate::format::{self, BlockFormat, Storage};
use crate::sys::pagecache;

/// What probing a directory's blocks learned.
pub(super) struct Probed {
    /// Each block's probe, in C order; `None` for a block not probed.
    pub infos: Vec<Option<format::BlockInfo>>,
    /// By kind, the storage and header of the probed block that stands for
    /// the blocks of that kind not probed.
    pub stand_ins: BTreeMap<usize, (Storage, Arc<HeaderCheck>)>,
}

/// Probes the blocks of `entries` (C order, each of kind `kinds[rank]`):
/// all of them, or with `defer` two of each kind (a kind: the dimensions
/// along which a block is the last, which decide its shape), enough to fix
/// the grid. Each kind's first probed block then stands for the rest of its
/// kind, if its header can be compared; the kinds whose cannot are probed
/// in full.
pub(super) fn probe_representatives(
    entries: &[(Vec<usize>, PathBuf)],
    kinds: &[usize],
    defer: bool,
    format: BlockFormat,
    dataset: &str,
) -> Result<Probed> {
    let mut probe_now = vec![!defer; entries.len()];
    if defer {
        for rank in first_and_last_of_each_kind(kinds) {
            probe_now[rank] = true;
        }
    }
    let mut probed = ProbeCache::default();
    let mut infos = probe_blocks(entries, &probe_now, &mut probed, format, dataset)?;
    let mut stand_ins = BTreeMap::new();
    if defer {
        stand_ins = stand_ins_of(entries, kinds, &infos)?;
        let rest: Vec<bool> = kinds
            .iter()
            .zip(&infos)
            .map(|(kind, info)| info.is_none() && !stand_ins.contains_key(kind))
            .collect();
        for (rank, info) in probe_blocks(entries, &rest, &mut probed, format, dataset)?
            .into_iter()
            .enumerate()
        {
            if info.is_some() {
                infos[rank] = info;
            }
        }
    }
    Ok(Probed { infos, stand_ins })
}

/// The ranks of the first and the last block of each kind.
fn first_and_last_of_each_kind(kinds: &[usize]) -> Vec<usize> {
    let mut first_of_kind: BTreeMap<usize, usize> = BTreeMap::new();
    let mut last_of_kind: BTreeMap<usize, usize> = BTreeMap::new();
    for (rank, &kind) in kinds.iter().enumerate() {
        first_of_kind.entry(kind).or_insert(rank);
        last_of_kind.insert(kind, rank);
    }
    first_of_kind
        .values()
        .chain(last_of_kind.values())
        .copied()
        .collect()
}

/// By kind, the first probed block whose header can stand for the others'.
fn stand_ins_of(
    entries: &[(Vec<usize>, PathBuf)],
    kinds: &[usize],
    infos: &[Option<format::BlockInfo>],
) -> Result<BTreeMap<usize, (Storage, Arc<HeaderCheck>)>> {
    let mut stand_ins = BTreeMap::new();
    for (((_, path), &kind), info) in entries.iter().zip(kinds).zip(infos) {
        if let Some(info) = info {
            if let Entry::Vacant(slot) = stand_ins.entry(kind) {
                if let Some(check) = header_check(path, info)? {
                    slot.insert((info.storage.clone(), Arc::new(check)));
                }
            }
        }
    }
    Ok(stand_ins)
}

/// Probes the blocks of `entries` marked in `which`, in C order, reading
/// their headers ahead (see [`HeaderReadahead`]).
fn probe_blocks(
    entries: &[(Vec<usize>, PathBuf)],
    which: &[bool],
    probed: &mut ProbeCache,
    format: BlockFormat,
    dataset: &str,
) -> Result<Vec<Option<format::BlockInfo>>> {
    let paths: Vec<&Path> = entries
        .iter()
        .zip(which)
        .filter(|(_, &now)| now)
        .map(|((_, path), _)| path.as_path())
        .collect();
    let mut readahead = HeaderReadahead::new(&paths);
    let mut done = 0;
    let mut infos = Vec::with_capacity(entries.len());
    for ((_, path), &now) in entries.iter().zip(which) {
        if !now {
            infos.push(None);
            continue;
        }
        readahead.reach(done);
        done += 1;
        infos.push(Some(probed.probe(
            path,
            format,
            format.input_dataset(dataset),
        )?));
    }
    Ok(infos)
}

impl HeaderCheck {
    /// What blocks like `path` (open as `file`, `len` bytes, probed as
    /// `info`) must start with, if its header can stand for theirs: its
    /// data raw at the end of the file, after a header short enough to
    /// compare.
    fn of_probed(
        path: &Path,
        file: &fs::File,
        len: u64,
        info: &format::BlockInfo,
    ) -> Result<Option<HeaderCheck>> {
        let Storage::Contiguous { data_offset } = info.storage else {
            return Ok(None);
        };
        if data_offset > CACHED_HEADER_BYTES || data_offset + info.data_len() != len {
            return Ok(None);
        }
        let mut header = vec![0u8; data_offset as usize];
        std::os::unix::fs::FileExt::read_exact_at(file, &mut header, 0)
            .map_err(|e| Error::io(path, "reading its header", e))?;
        Ok(Some(HeaderCheck {
            like: path.to_path_buf(),
            len,
            header,
        }))
    }

    /// Whether `file`, `len` bytes long, has the length and header bytes
    /// of the block this check was made from.
    pub(super) fn passes(&self, file: &fs::File, len: u64) -> bool {
        if len != self.len {
            return false;
        }
        let mut header = vec![0u8; self.header.len()];
        std::os::unix::fs::FileExt::read_exact_at(file, &mut header, 0).is_ok()
            && header == self.header
    }
}

/// [`HeaderCheck::of_probed`] for the probed block at `path`.
fn header_check(path: &Path, info: &format::BlockInfo) -> Result<Option<HeaderCheck>> {
    let (file, len) = open_with_len(path)?;
    HeaderCheck::of_probed(path, &file, len, info)
}

/// The file at `path`, open, and its length.
fn open_with_len(path: &Path) -> Result<(fs::File, u64)> {
    let file = crate::sys::files::open_regular(path)?;
    let len = file
        .metadata()
        .map_err(|e| Error::io(path, "stat", e))?
        .len();
    Ok((file, len))
}

/// Asks the kernel for the first bytes of the files a little ahead of the
/// probe. Probing reads one header at a time, and on a cold cache each
/// waits a full disk round trip: 8,000 blocks took 1.4 s that way. With
/// the next headers already queued the disk serves them together.
struct HeaderReadahead<'a> {
    paths: &'a [&'a Path],
    /// Files below this rank have been advised.
    advised: usize,
}

/// How many files ahead of the probe are advised.
const HEADER_READAHEAD_FILES: usize = 256;

/// How much of each file is advised: block headers are a few KiB (HDF5
/// blocks written by h5py: 2 KiB). Not more: on a small cache, data read
/// now would be evicted before the plan reads it.
const HEADER_READAHEAD_BYTES: u64 = 8 << 10;

impl<'a> HeaderReadahead<'a> {
    fn new(paths: &'a [&'a Path]) -> Self {
        HeaderReadahead { paths, advised: 0 }
    }

    /// Advises every file up to `rank + HEADER_READAHEAD_FILES`. Advice
    /// only: a file that cannot be opened is left for the probe to report.
    fn reach(&mut self, rank: usize) {
        let end = (rank + HEADER_READAHEAD_FILES).min(self.paths.len());
        while self.advised < end {
            if let Ok(file) = fs::File::open(self.paths[self.advised]) {
                pagecache::read_ahead(&file, 0, HEADER_READAHEAD_BYTES);
            }
            self.advised += 1;
        }
    }
}

/// Probing HDF5 files through libhdf5 costs ~60 µs each (serialised by
/// its global lock): 0.5 s for 8,000 blocks. The blocks of one grid are
/// usually byte-identical outside their data, so a file whose length and
/// bytes before its data equal those of a file already probed has the same
/// layout (libhdf5 parses identical bytes identically), and is not probed
/// again.
#[derive(Default)]
struct ProbeCache {
    known: Vec<(HeaderCheck, format::BlockInfo)>,
}

/// Files with headers longer than this are always probed in full.
const CACHED_HEADER_BYTES: u64 = 64 << 10;

impl ProbeCache {
    fn probe(
        &mut self,
        path: &Path,
        format: BlockFormat,
        dataset: &str,
    ) -> Result<format::BlockInfo> {
        if !format.traits().cache_probes {
            return format::probe(path, format, dataset);
        }
        let (file, len) = open_with_len(path)?;
        if let Some((_, info)) = self
            .known
            .iter()
            .find(|(check, _)| check.passes(&file, len))
        {
            return Ok(info.clone());
        }
        let info = format::probe(path, format, dataset)?;
        // Only files that are header + data: nothing after the data could
        // differ unseen. A header that cannot be read is just not kept.
        if self.known.len() < 64 {
            if let Ok(Some(check)) = HeaderCheck::of_probed(path, &file, len, &info) {
                self.known.push((check, info.clone()));
            }
        }
        Ok(info)
    }
}
