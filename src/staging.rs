//! The staging area: where the materialiser writes each output block exactly
//! as the view serves it, and a journal that records, durably, which blocks
//! are complete.
//!
//! A block is complete only once its data are synced and its record is
//! synced after them; a crash at any point leaves either a recorded block
//! with all its data or an unrecorded one that is redone. The manifest pins
//! what the area holds (input files with their sizes and mtimes, shape,
//! format), so a remount resumes only what it can trust.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::format::BlockFormat;
use crate::geometry::show_shape;
use crate::input::{FileIdentity, InputArray};

const MANIFEST: &str = "manifest.json";
const JOURNAL: &str = "done.journal";
const BLOCKS: &str = "blocks";
const MANIFEST_VERSION: u32 = 1;
/// Guards each journal record: a torn or stray record fails the check.
const RECORD_CHECK: u64 = 0x5245_4348_554E_4B46;

/// What a staging area holds, recorded when it is made.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub version: u32,
    pub input: PathBuf,
    pub dataset: String,
    pub array: Vec<u64>,
    pub dtype: DType,
    pub output_block: Vec<u64>,
    pub format: BlockFormat,
    /// Input files relative to `input`, with their identity when planned.
    pub input_files: Vec<(String, FileIdentity)>,
}

impl Manifest {
    pub fn new(input: &InputArray, output_block: &[u64], format: BlockFormat) -> Result<Manifest> {
        let base = if input.source.is_dir() {
            input.source.clone()
        } else {
            input
                .source
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_default()
        };
        Ok(Manifest {
            version: MANIFEST_VERSION,
            input: input.source.clone(),
            dataset: input.dataset.clone(),
            array: input.shape.clone(),
            dtype: input.dtype,
            output_block: output_block.to_vec(),
            format,
            input_files: input
                .blocks
                .iter()
                .map(|b| {
                    let name = b.path.strip_prefix(&base).unwrap_or(&b.path);
                    Ok((name.to_string_lossy().into_owned(), b.identity()?))
                })
                .collect::<Result<_>>()?,
        })
    }

    /// Why `self` (found on disk) cannot be resumed as `wanted`, if it cannot.
    fn mismatch(&self, wanted: &Manifest) -> Option<String> {
        if self.version != wanted.version {
            return Some(format!(
                "it was made by another version of rechunkfs (format {})",
                self.version
            ));
        }
        if self.input != wanted.input || self.dataset != wanted.dataset {
            return Some(format!(
                "it holds a view of {} (dataset {})",
                self.input.display(),
                self.dataset
            ));
        }
        if self.output_block != wanted.output_block || self.format != wanted.format {
            return Some(format!(
                "it holds {} blocks of {}",
                self.format.name(),
                show_shape(&self.output_block)
            ));
        }
        if self.array != wanted.array || self.dtype != wanted.dtype {
            return Some(format!(
                "the input was a {} {} array when it was made and is now {} {}",
                show_shape(&self.array),
                self.dtype,
                show_shape(&wanted.array),
                wanted.dtype
            ));
        }
        if self.input_files.len() != wanted.input_files.len() {
            return Some(format!(
                "the input had {} files when it was made and has {} now",
                self.input_files.len(),
                wanted.input_files.len()
            ));
        }
        for ((name, then), (now_name, now)) in self.input_files.iter().zip(&wanted.input_files) {
            if name != now_name {
                return Some(format!("input file {name} is now {now_name}"));
            }
            if then.size != now.size {
                return Some(format!(
                    "input file {name} changed size ({} → {} bytes)",
                    then.size, now.size
                ));
            }
            if then.mtime_ns != now.mtime_ns {
                return Some(format!("input file {name} was modified"));
            }
        }
        None
    }
}

/// The staging directory, open for a view.
#[derive(Debug)]
pub struct Staging {
    dir: PathBuf,
    journal: Mutex<File>,
}

impl Staging {
    /// The default staging directory for a view: under the user's cache
    /// directory, keyed by the input's path, the dataset, the shape and the format.
    pub fn default_dir(
        input: &Path,
        dataset: &str,
        output_block: &[u64],
        format: BlockFormat,
    ) -> Result<PathBuf> {
        let cache = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .ok_or_else(|| {
                Error::BadArgument(
                    "neither XDG_CACHE_HOME nor HOME is set; pass --staging DIR".into(),
                )
            })?;
        let canonical = input
            .canonicalize()
            .map_err(|e| Error::io(input, "resolving", e))?;
        let key = format!(
            "{}|{}|{}|{}",
            canonical.display(),
            dataset,
            show_shape(output_block),
            format.extension()
        );
        let leaf = canonical
            .file_name()
            .map_or("input".into(), |n| n.to_string_lossy().into_owned());
        Ok(cache.join("rechunkfs").join(format!(
            "{leaf}-{}-{:016x}",
            show_shape(output_block).replace('×', "x"),
            fnv1a(key.as_bytes())
        )))
    }

    /// Opens (or makes) the staging area in `dir` for `manifest`. Returns
    /// the ranks of the blocks already complete. With `rebuild`, whatever is
    /// there is discarded first; otherwise an area made for anything else,
    /// or for input files that have changed since, is refused.
    pub fn open(dir: &Path, manifest: &Manifest, rebuild: bool) -> Result<(Staging, Vec<u64>)> {
        let manifest_path = dir.join(MANIFEST);
        if rebuild {
            for name in [MANIFEST, JOURNAL] {
                let path = dir.join(name);
                if path.exists() {
                    fs::remove_file(&path).map_err(|e| Error::io(&path, "removing", e))?;
                }
            }
            let blocks = dir.join(BLOCKS);
            if blocks.exists() {
                fs::remove_dir_all(&blocks).map_err(|e| Error::io(&blocks, "removing", e))?;
            }
        }
        fs::create_dir_all(dir.join(BLOCKS))
            .map_err(|e| Error::io(dir, "creating the staging area", e))?;
        let fresh = !manifest_path.exists();
        if fresh {
            let bytes = serde_json::to_vec_pretty(manifest)
                .map_err(|e| Error::BadArgument(format!("encoding the manifest: {e}")))?;
            write_durably(&manifest_path, &bytes)?;
            // A journal left without its manifest belongs to nothing.
            let journal = dir.join(JOURNAL);
            if journal.exists() {
                fs::remove_file(&journal).map_err(|e| Error::io(&journal, "removing", e))?;
            }
        } else {
            let bytes =
                fs::read(&manifest_path).map_err(|e| Error::io(&manifest_path, "reading", e))?;
            let found: Manifest = serde_json::from_slice(&bytes).map_err(|e| Error::BadOutput {
                path: manifest_path.clone(),
                problem: format!(
                    "is not a readable staging manifest ({e}); pass --rebuild to start over"
                ),
            })?;
            if let Some(why) = found.mismatch(manifest) {
                return Err(Error::BadOutput {
                    path: dir.to_path_buf(),
                    problem: format!(
                        "this staging area cannot be resumed: {why}. Pass --rebuild to discard it and \
                         start over, or --staging to use another directory"
                    ),
                });
            }
        }
        let journal_path = dir.join(JOURNAL);
        let done = if fresh {
            Vec::new()
        } else {
            read_journal(&journal_path)?
        };
        let journal = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&journal_path)
            .map_err(|e| Error::io(&journal_path, "opening the journal", e))?;
        Ok((
            Staging {
                dir: dir.to_path_buf(),
                journal: Mutex::new(journal),
            },
            done,
        ))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the staging copy of block file `name` lives.
    pub fn block_path(&self, name: &str) -> PathBuf {
        self.dir.join(BLOCKS).join(name)
    }

    /// Records blocks as complete. Their data must already be synced.
    pub fn record_done(&self, ranks: &[u64]) -> Result<()> {
        let mut bytes = Vec::with_capacity(ranks.len() * 16);
        for rank in ranks {
            bytes.extend_from_slice(&rank.to_le_bytes());
            bytes.extend_from_slice(&(rank ^ RECORD_CHECK).to_le_bytes());
        }
        let mut journal = self.journal.lock();
        let path = self.dir.join(JOURNAL);
        journal
            .write_all(&bytes)
            .map_err(|e| Error::io(&path, "appending to the journal", e))?;
        journal
            .sync_data()
            .map_err(|e| Error::io(&path, "syncing the journal", e))
    }
}

/// Complete ranks recorded in the journal; a torn last record (a crash
/// while appending) is ignored.
fn read_journal(path: &Path) -> Result<Vec<u64>> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(path, "reading the journal", e)),
    };
    let mut done = Vec::with_capacity(bytes.len() / 16);
    for record in bytes.chunks_exact(16) {
        let rank = u64::from_le_bytes(record[..8].try_into().unwrap_or([0; 8]));
        let check = u64::from_le_bytes(record[8..].try_into().unwrap_or([0; 8]));
        if rank ^ RECORD_CHECK != check {
            log::warn!("{}: stopping at a damaged record", path.display());
            break;
        }
        done.push(rank);
    }
    Ok(done)
}

fn write_durably(path: &Path, bytes: &[u8]) -> Result<()> {
    let partial = path.with_extension("partial");
    let mut file = File::create(&partial).map_err(|e| Error::io(&partial, "creating", e))?;
    file.write_all(bytes)
        .map_err(|e| Error::io(&partial, "writing", e))?;
    file.sync_all()
        .map_err(|e| Error::io(&partial, "syncing", e))?;
    fs::rename(&partial, path).map_err(|e| Error::io(path, "renaming into place", e))?;
    if let Some(parent) = path.parent() {
        File::open(parent)
            .and_then(|d| d.sync_all())
            .map_err(|e| Error::io(parent, "syncing", e))?;
    }
    Ok(())
}

/// FNV-1a: a stable 64-bit hash for directory keys (std's hasher may
/// change between Rust releases, and keys must survive upgrades).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |hash, &b| {
        (hash ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest() -> Manifest {
        Manifest {
            version: MANIFEST_VERSION,
            input: "/data/in".into(),
            dataset: "/data".into(),
            array: vec![10, 10],
            dtype: "u2".parse().unwrap(),
            output_block: vec![5, 5],
            format: BlockFormat::Npy,
            input_files: vec![(
                "0_0.npy".into(),
                FileIdentity {
                    size: 100,
                    mtime_ns: 7,
                },
            )],
        }
    }

    #[test]
    fn journal_survives_reopen_and_ignores_a_torn_record() {
        let dir = tempfile::tempdir().unwrap();
        let (staging, done) = Staging::open(dir.path(), &manifest(), false).unwrap();
        assert!(done.is_empty());
        staging.record_done(&[3, 1]).unwrap();
        drop(staging);
        // A crash mid-append leaves half a record.
        let mut journal = OpenOptions::new()
            .append(true)
            .open(dir.path().join(JOURNAL))
            .unwrap();
        journal.write_all(&[9, 0, 0]).unwrap();
        let (_, done) = Staging::open(dir.path(), &manifest(), false).unwrap();
        assert_eq!(done, vec![3, 1]);
    }

    #[test]
    fn changed_input_is_refused_until_rebuild() {
        let dir = tempfile::tempdir().unwrap();
        let (staging, _) = Staging::open(dir.path(), &manifest(), false).unwrap();
        staging.record_done(&[0]).unwrap();
        drop(staging);
        let mut changed = manifest();
        changed.input_files[0].1.size = 101;
        let err = Staging::open(dir.path(), &changed, false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("input file 0_0.npy changed size (100 → 101 bytes)"),
            "{err}"
        );
        assert!(err.contains("--rebuild"), "{err}");
        let (_, done) = Staging::open(dir.path(), &changed, true).unwrap();
        assert!(done.is_empty());
        let mut other_shape = changed.clone();
        other_shape.output_block = vec![2, 2];
        let err = Staging::open(dir.path(), &other_shape, false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("holds npy blocks of 5×5"), "{err}");
    }
}
