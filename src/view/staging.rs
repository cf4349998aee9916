//! The staging area: where the materialiser writes each output block exactly
//! as the view serves it, and a journal that records, durably, which blocks
//! are complete.
//!
//! A block is complete only once its data are synced and its record is
//! synced after them; a crash at any point leaves either a recorded block
//! with all its data or an unrecorded one that is redone. The manifest pins
//! what the area holds (the input and its files' names, shape, format).
//! Each input file's identity (size, mtime, ctime, inode: see
//! [`FileIdentity`]) goes into the journal as the file is first read, ahead of the records of any block made from it, so a
//! remount resumes only what it can trust: it refuses an area whose inputs
//! changed after they were read, and reads the ones not read yet as they
//! are now. Taking them as they are read, not all at mount, saves a view's
//! start one stat per input file (cold: 9 ms for 1,000, 0.07 s for 8,000).
//!
//! The area is its owner's alone: its directories are 0700 and its files
//! 0600, since the blocks hold the inputs' data whatever the inputs' own
//! modes. One process at a time uses it: a lock file, held with `flock`
//! for the daemon's whole life and naming its pid, refuses a second mount
//! of the same area before anything in it is touched.
//!
//! No other user can change the area: it and its parents are checked as
//! [`crate::sys::trust`] says before anything in it is read or made, and
//! every file in it is opened without following a link and must be this
//! user's. Another user's area, or a link planted in one, would let that
//! user choose the bytes the view serves, or what root writes to.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::array::dtype::DType;
use crate::array::geometry::show_shape;
use crate::engine::InputWitness;
use crate::error::{Error, Result};
use crate::format::ome::Window;
use crate::format::{BlockFormat, BlockTemplate};
use crate::input::{FileIdentity, InputArray, InputBlock, Values};
use crate::sys::pagecache;
use crate::sys::trust;

const MANIFEST: &str = "manifest.json";
const JOURNAL: &str = "done.journal";
const BLOCKS: &str = "blocks";
/// Held with `flock` by the process using the area; holds its pid.
const LOCK: &str = "lock";
/// 2: input files' identities moved from the manifest into the journal.
/// 3: an input's identity also holds its ctime and inode (64-byte records).
const MANIFEST_VERSION: u32 = 3;
/// Guards each journal record: a torn or stray record fails the check.
const RECORD_CHECK: u64 = 0x5245_4348_554E_4B46;
/// Words of a journal record: little-endian u64s, the kind first, then
/// [`RECORD_WORDS`] of payload, the check last.
const RECORD_WORDS: usize = 6;
const RECORD_BYTES: usize = (RECORD_WORDS + 2) * 8;
/// Output block `a` is complete.
const DONE_RECORD: u64 = 1;
/// Input file `a` was read with the identity in the other words
/// ([`identity_words`]).
const INPUT_RECORD: u64 = 2;
/// Level 0's range of values so far, as level 1's blocks read it back
/// ([`WindowRecord`]): `a` and `b` the bits of its least and greatest
/// value (f64), `c` [`WINDOW_SEEN`] and [`WINDOW_COMPLETE`]. The last one
/// holds; it goes ahead of the done records of the level-1 blocks it
/// covers, in the same write.
const WINDOW_RECORD: u64 = 3;
const WINDOW_SEEN: u64 = 1;
const WINDOW_COMPLETE: u64 = 2;
/// Owner only: the staged blocks hold the inputs' data.
const FILE_MODE: u32 = 0o600;
/// Names the staging area in refusals of its directories.
const AREA: &str = "the staging area";

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
    /// The directory the input files' names are relative to.
    pub files_in: PathBuf,
    /// Input files, by rank in the input grid, relative to `files_in`.
    pub input_files: Vec<String>,
    /// Sharded (Zarr v3): each output block is a shard of chunks of this
    /// shape, which lays out its file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard_chunks: Option<Vec<u64>>,
    /// The pyramid the view serves beside level 0 (empty: none): its
    /// blocks' ranks follow level 0's in the journal.
    #[serde(default)]
    pub pyramid: String,
}

impl Manifest {
    pub fn new(input: &InputArray, output_block: &[u64], format: BlockFormat) -> Manifest {
        let base = if input.source.is_dir() {
            input.source.clone()
        } else {
            input
                .source
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_default()
        };
        Manifest {
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
                    name.to_string_lossy().into_owned()
                })
                .collect(),
            files_in: base,
            shard_chunks: None,
            pyramid: String::new(),
        }
    }

    /// The manifest of an area that also holds the pyramid `described`.
    pub fn with_pyramid(mut self, described: String) -> Manifest {
        self.pyramid = described;
        self
    }

    /// Why the area cannot be resumed if an input it read has changed
    /// since: `read` holds each input file's identity when first read.
    fn changed_input(&self, read: &[(u64, FileIdentity)]) -> Result<Option<String>> {
        for &(rank, then) in read {
            let Some(name) = self.input_files.get(rank as usize) else {
                return Ok(Some(format!(
                    "its journal names input file {rank}, and the input has {}",
                    self.input_files.len()
                )));
            };
            let now = FileIdentity::now(&self.files_in.join(name))?;
            if now == then {
                continue;
            }
            return Ok(Some(if now == FileIdentity::ABSENT {
                format!("input file {name} is gone")
            } else if then.size != now.size {
                format!(
                    "input file {name} changed size ({} → {} bytes) after it was read",
                    then.size, now.size
                )
            } else if then.mtime_ns != now.mtime_ns {
                format!("input file {name} was modified after it was read")
            } else {
                // Size and mtime as recorded: a rewrite whose times were
                // set back (touch -r), or another file renamed over it.
                format!(
                    "input file {name} was modified after it was read (its size and mtime are \
                     as they were, but it was rewritten or replaced since: its change time or \
                     inode differs)"
                )
            }));
        }
        Ok(None)
    }

    /// Why `self` (found on disk) cannot be resumed as `wanted`, if it cannot.
    fn mismatch(&self, wanted: &Manifest) -> Option<String> {
        if self.version != wanted.version {
            return Some(format!(
                "it was made by another version of rechunkfs (staging format {}, and this \
                 version uses format {}), whose journal this one cannot trust",
                self.version, wanted.version
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
        if self.pyramid != wanted.pyramid {
            return Some(format!(
                "it holds a view with pyramid '{}', not '{}'",
                self.pyramid, wanted.pyramid
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
        for (name, now_name) in self.input_files.iter().zip(&wanted.input_files) {
            if name != now_name {
                return Some(format!("input file {name} is now {now_name}"));
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
    inputs_read: Mutex<InputsRead>,
    /// The window recorded when the area was opened, and one to record
    /// with the next completed blocks.
    window: Mutex<(Option<WindowRecord>, Option<WindowRecord>)>,
    /// The area's lock file, locked: closed (never unlocked explicitly, as
    /// a forked daemon shares the lock) when the last process holding it
    /// ends.
    lock: File,
}

/// Which input files have their identity recorded, and the records not
/// yet written (they go into the journal with the next completed blocks).
#[derive(Debug)]
struct InputsRead {
    recorded: Vec<bool>,
    unwritten: Vec<u8>,
}

/// The range of level 0's values gathered so far (a pyramid's display
/// window), and whether it covers all of level 0.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WindowRecord {
    /// `None`: no finite value seen.
    pub seen: Option<Window>,
    pub complete: bool,
}

impl WindowRecord {
    fn words(&self) -> [u64; RECORD_WORDS] {
        let (min, max, seen) = match self.seen {
            Some(w) => (w.min.to_bits(), w.max.to_bits(), WINDOW_SEEN),
            None => (0, 0, 0),
        };
        let complete = if self.complete { WINDOW_COMPLETE } else { 0 };
        [min, max, seen | complete, 0, 0, 0]
    }

    fn from_words(min: u64, max: u64, flags: u64) -> WindowRecord {
        let (min, max) = (f64::from_bits(min), f64::from_bits(max));
        WindowRecord {
            // A range that is not one (a bad record) is none.
            seen: (flags & WINDOW_SEEN != 0 && min <= max && min.is_finite() && max.is_finite())
                .then_some(Window { min, max }),
            complete: flags & WINDOW_COMPLETE != 0,
        }
    }
}

/// What a staging area's journal holds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Journal {
    /// Output blocks complete, in the order recorded.
    pub done: Vec<u64>,
    /// Input files read, by rank, with their identity when first read.
    pub inputs_read: Vec<(u64, FileIdentity)>,
    /// The last window recorded, if any (a pyramid's).
    pub window: Option<WindowRecord>,
    /// Records read, valid ones up to the first damaged.
    records: usize,
}

impl Journal {
    /// Reads the journal of the staging area in `dir` (empty if there is
    /// none), up to its first damaged record.
    pub fn read(dir: &Path) -> Result<Journal> {
        let path = dir.join(JOURNAL);
        let bytes = match read_own(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Journal::default()),
            Err(e) => return Err(Error::io(&path, "reading the journal", e)),
        };
        let mut journal = Journal::default();
        for record in bytes.chunks(RECORD_BYTES) {
            let words: Vec<u64> = record
                .chunks_exact(8)
                .map(|word| u64::from_le_bytes(word.try_into().unwrap_or([0; 8])))
                .collect();
            let [kind, a, b, c, d, e, f, check] = words[..] else {
                log::warn!("{}: stopping at a torn record", path.display());
                break;
            };
            if record_check(&words[..RECORD_WORDS + 1]) != check {
                log::warn!("{}: stopping at a damaged record", path.display());
                break;
            }
            match kind {
                DONE_RECORD => journal.done.push(a),
                WINDOW_RECORD => journal.window = Some(WindowRecord::from_words(a, b, c)),
                INPUT_RECORD => journal
                    .inputs_read
                    .push((a, identity_from_words([b, c, d, e, f]))),
                _ => {
                    log::warn!(
                        "{}: stopping at a record of unknown kind {kind}",
                        path.display()
                    );
                    break;
                }
            }
            journal.records += 1;
        }
        Ok(journal)
    }
}

fn record_check(words: &[u64]) -> u64 {
    fnv1a(words.iter().flat_map(|w| w.to_le_bytes())) ^ RECORD_CHECK
}

fn push_record(bytes: &mut Vec<u8>, kind: u64, payload: [u64; RECORD_WORDS]) {
    let mut words = [0u64; RECORD_WORDS + 1];
    words[0] = kind;
    words[1..].copy_from_slice(&payload);
    for word in words.iter().chain([record_check(&words)].iter()) {
        bytes.extend_from_slice(&word.to_le_bytes());
    }
}

/// `input` with its links and dots resolved; a glob (a stack of TIFF
/// slices), which names no file, by its directory.
fn resolved_input(input: &Path) -> Result<PathBuf> {
    match input.canonicalize() {
        Ok(path) => Ok(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let dir = match input.parent() {
                Some(dir) if !dir.as_os_str().is_empty() => dir,
                _ => Path::new("."),
            };
            let dir = dir
                .canonicalize()
                .map_err(|e| Error::io(dir, "resolving", e))?;
            Ok(dir.join(input.file_name().unwrap_or_default()))
        }
        Err(e) => Err(Error::io(input, "resolving", e)),
    }
}

impl Staging {
    /// The default staging directory for a view: under the user's cache
    /// directory, keyed by the input's path, the dataset, the shape and the
    /// format, and by `values` when they are not the stored ones.
    pub fn default_dir(
        input: &Path,
        dataset: &str,
        output_block: &[u64],
        format: BlockFormat,
        values: Option<Values>,
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
        let canonical = resolved_input(input)?;
        let mut key = format!(
            "{}|{}|{}|{}",
            canonical.display(),
            dataset,
            show_shape(output_block),
            format.extension()
        );
        if values == Some(Values::Scaled) {
            key += "|scaled";
        }
        // A glob's wildcards would make a name the shell expands.
        let leaf = canonical.file_name().map_or("input".into(), |n| {
            n.to_string_lossy().replace(['*', '?'], "_")
        });
        Ok(cache.join("rechunkfs").join(format!(
            "{leaf}-{}-{:016x}",
            show_shape(output_block).replace('×', "x"),
            fnv1a(key.bytes())
        )))
    }

    /// Opens (or makes) the staging area in `dir` for `manifest`. Returns
    /// the ranks of the blocks already complete. With `rebuild`, whatever is
    /// there is discarded first; otherwise an area made for anything else,
    /// or for input files that have changed since, is refused.
    pub fn open(dir: &Path, manifest: &Manifest, rebuild: bool) -> Result<(Staging, Vec<u64>)> {
        make_private_dir(dir)?;
        make_private_dir(&dir.join(BLOCKS))?;
        // Before anything in the area is touched: another daemon may be
        // using it.
        let lock = lock_area(dir)?;
        if rebuild {
            discard(dir)?;
            make_private_dir(&dir.join(BLOCKS))?;
        }
        let journal_path = dir.join(JOURNAL);
        let fresh = !holds(dir, manifest, &journal_path)?;
        if fresh {
            start_afresh(dir, manifest, &journal_path)?;
        }
        let journal = if fresh {
            Journal::default()
        } else {
            Journal::read(dir)?
        };
        if let Some(why) = manifest.changed_input(&journal.inputs_read)? {
            return Err(cannot_resume(dir, &why));
        }
        let mut recorded = vec![false; manifest.input_files.len()];
        for &(rank, _) in &journal.inputs_read {
            if let Some(slot) = recorded.get_mut(rank as usize) {
                *slot = true;
            }
        }
        let file = open_journal(&journal_path, &journal)?;
        Ok((
            Staging {
                dir: dir.to_path_buf(),
                journal: Mutex::new(file),
                inputs_read: Mutex::new(InputsRead {
                    recorded,
                    unwritten: Vec::new(),
                }),
                window: Mutex::new((journal.window, None)),
                lock,
            },
            journal.done,
        ))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Names this process in the lock file as the one using the area: a
    /// daemon forked after [`Staging::open`] holds the lock from then on.
    pub fn claim(&self) {
        write_pid(&self.lock, &self.dir.join(LOCK));
    }

    /// Removes what an earlier run left in the blocks directory that `keep`
    /// does not name: files of blocks never recorded done (a crash or a
    /// full disk stopped them), which hold space a run may need. Returns
    /// the files and bytes removed.
    pub fn reclaim(&self, keep: impl Fn(&str) -> bool) -> Result<(u64, u64)> {
        let blocks = self.dir.join(BLOCKS);
        let entries = fs::read_dir(&blocks).map_err(|e| Error::io(&blocks, "listing", e))?;
        let (mut files, mut bytes) = (0, 0);
        for entry in entries {
            let entry = entry.map_err(|e| Error::io(&blocks, "listing", e))?;
            let name = entry.file_name();
            if name.to_str().is_some_and(&keep) {
                continue;
            }
            let path = entry.path();
            let len = entry.metadata().map(|m| m.len()).unwrap_or(0);
            match fs::remove_file(&path) {
                Ok(()) => {
                    files += 1;
                    bytes += len;
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io(&path, "removing a partial block", e)),
            }
        }
        Ok((files, bytes))
    }

    /// Makes a staged file the owner's alone (it was made with the
    /// process's umask).
    fn make_private(file: &File, path: &Path) -> Result<()> {
        file.set_permissions(fs::Permissions::from_mode(FILE_MODE))
            .map_err(|e| Error::io(path, "making it private (chmod 0600)", e))
    }

    /// Creates (or truncates) the staged block file at `path`, laid out as
    /// `template`, owner-only, never through a link.
    pub fn create_block(template: &BlockTemplate, path: &Path) -> Result<File> {
        let file = open_private(
            path,
            OpenOptions::new().read(true).write(true).truncate(true),
        )?;
        template.write_into(&file, path)?;
        Ok(file)
    }

    /// Opens the staged block file at `path` (read-only unless `write`),
    /// never through a link, and only if it is this user's.
    pub fn open_block(path: &Path, write: bool) -> Result<File> {
        trust::open_own(path, OpenOptions::new().read(true).write(write))
            .map_err(|e| Error::io(path, "opening a staged block", e))
    }

    /// Where the staging copy of block file `name` lives.
    pub fn block_path(&self, name: &str) -> PathBuf {
        self.dir.join(BLOCKS).join(name)
    }

    /// The last window recorded (a pyramid's), if any.
    pub fn recorded_window(&self) -> Option<WindowRecord> {
        self.window.lock().0
    }

    /// Records `window` with the next completed blocks, ahead of them
    /// (it covers them: their values were read before they completed).
    pub fn note_window(&self, window: WindowRecord) {
        self.window.lock().1 = Some(window);
    }

    /// Records blocks as complete, once everything written to the staging
    /// area's filesystem is synced (one syncfs: the blocks' data, the
    /// manifest, the directories; an fdatasync per block cost a journal
    /// commit each). The identities of the input files read so far go
    /// first, in the same write and sync: every input a block was made from
    /// is recorded before the block, since it was read before the block
    /// completed.
    ///
    /// If the journal cannot take the records (a full disk), what was
    /// appended of them is cut off again, so a later call appends them
    /// whole on a record boundary. A failed sync of the blocks' data is
    /// not retried: the kernel reports a writeback error once, so a second
    /// sync would succeed with data lost.
    pub fn record_done(&self, ranks: &[u64]) -> Result<()> {
        let dir = File::open(&self.dir).map_err(|e| Error::io(&self.dir, "opening", e))?;
        pagecache::sync_filesystem(&dir, &self.dir).map_err(|e| Error::BadOutput {
            path: self.dir.clone(),
            problem: format!(
                "the staged blocks could not be made durable ({e}); blocks written since the \
                 last sync may be incomplete on disk, so they are not recorded done"
            ),
        })?;
        let journal = self.journal.lock();
        let input_records = std::mem::take(&mut self.inputs_read.lock().unwritten);
        let mut bytes = input_records.clone();
        let window = self.window.lock().1.take();
        if let Some(window) = &window {
            push_record(&mut bytes, WINDOW_RECORD, window.words());
        }
        bytes.reserve(ranks.len() * RECORD_BYTES);
        for &rank in ranks {
            push_record(&mut bytes, DONE_RECORD, [rank, 0, 0, 0, 0, 0]);
        }
        let path = self.dir.join(JOURNAL);
        let appended = append_synced(&journal, &path, &bytes);
        if appended.is_err() {
            // Written again with the next records, ahead of them.
            let mut inputs_read = self.inputs_read.lock();
            let later = std::mem::replace(&mut inputs_read.unwritten, input_records);
            inputs_read.unwritten.extend(later);
            // Unless a newer one was noted meanwhile.
            if let Some(window) = window {
                self.window.lock().1.get_or_insert(window);
            }
        } else if window.is_some() {
            self.window.lock().0 = window;
        }
        appended
    }
}

impl InputWitness for Staging {
    /// Notes input file `rank`'s identity (from `meta`, the reader's stat of
    /// the open file, else a stat of its path) the first time it is read in
    /// this staging area's life.
    fn reading(&self, rank: u64, block: &InputBlock, meta: Option<&fs::Metadata>) -> Result<()> {
        let mut inputs_read = self.inputs_read.lock();
        match inputs_read.recorded.get(rank as usize) {
            Some(false) => {}
            // Recorded already, or not an input of this area (a bug; the
            // manifest's file list was checked against the input at open).
            _ => return Ok(()),
        }
        let identity = match meta {
            Some(meta) => FileIdentity::of_metadata(meta),
            None => block.identity()?,
        };
        let [size, inode, mtime, ctime, nanos] = identity_words(&identity);
        push_record(
            &mut inputs_read.unwritten,
            INPUT_RECORD,
            [rank, size, inode, mtime, ctime, nanos],
        );
        inputs_read.recorded[rank as usize] = true;
        Ok(())
    }
}

/// An input's identity as the last five words of its [`INPUT_RECORD`]:
/// size, inode, the mtime's and the ctime's seconds (signed), then both
/// times' nanoseconds (mtime's in the low half).
fn identity_words(identity: &FileIdentity) -> [u64; 5] {
    let (mtime, mtime_nanos) = split_ns(identity.mtime_ns);
    let (ctime, ctime_nanos) = split_ns(identity.ctime_ns);
    [
        identity.size,
        identity.inode,
        mtime as u64,
        ctime as u64,
        mtime_nanos as u64 | (ctime_nanos as u64) << 32,
    ]
}

fn identity_from_words([size, inode, mtime, ctime, nanos]: [u64; 5]) -> FileIdentity {
    let join =
        |seconds: u64, nanos: u64| seconds as i64 as i128 * NS + (nanos & 0xffff_ffff) as i128;
    FileIdentity {
        size,
        mtime_ns: join(mtime, nanos),
        ctime_ns: join(ctime, nanos >> 32),
        inode,
    }
}

const NS: i128 = 1_000_000_000;

/// Whole seconds (rounded down, so before 1970 too) and the nanoseconds
/// after them. Seconds beyond 64 bits (no file has such a time) saturate.
fn split_ns(ns: i128) -> (i64, u32) {
    let seconds = ns.div_euclid(NS);
    let seconds = seconds.clamp(i64::MIN as i128, i64::MAX as i128) as i64;
    (seconds, ns.rem_euclid(NS) as u32)
}

/// Creates `dir` (and missing parents) owner-only, after checking that no
/// other user can change its parents; refuses it if another user owns it
/// or may write to it, and makes it owner-only if it was there already
/// with wider read permissions (made by an earlier version).
pub(crate) fn make_private_dir(dir: &Path) -> Result<()> {
    trust::make_private_dir(dir, AREA)
}

/// Opens (or makes) `path` owner-only, never through a link and only if
/// it is this user's, and makes an existing one owner-only too.
fn open_private(path: &Path, options: &mut OpenOptions) -> Result<File> {
    let file = trust::open_own(path, options.create(true).mode(FILE_MODE))
        .map_err(|e| Error::io(path, "opening", e))?;
    let mode = file
        .metadata()
        .map_err(|e| Error::io(path, "stat", e))?
        .permissions()
        .mode();
    if mode & 0o777 != FILE_MODE {
        Staging::make_private(&file, path)?;
    }
    Ok(file)
}

/// Takes the area's lock, or says which process holds it.
fn lock_area(dir: &Path) -> Result<File> {
    let path = dir.join(LOCK);
    let file = open_private(&path, OpenOptions::new().read(true).write(true))?;
    // SAFETY: flock on a descriptor this function owns.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let error = std::io::Error::last_os_error();
        if error.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(Error::io(&path, "locking the staging area", error));
        }
        let mut holder = String::new();
        let _ = (&file).read_to_string(&mut holder);
        let holder = match holder.trim().parse::<u32>() {
            Ok(pid) => format!("the daemon of another view (pid {pid})"),
            Err(_) => "another process".to_string(),
        };
        return Err(Error::BadOutput {
            path: dir.to_path_buf(),
            problem: format!(
                "this staging area is in use by {holder}: two views cannot share one. Unmount \
                 the other view first (rechunkfs umount VIEW), or pass --staging to use another \
                 directory"
            ),
        });
    }
    write_pid(&file, &path);
    Ok(file)
}

/// Writes this process's pid into the lock file, for the message of a
/// mount refused by the lock. Written in place and not truncated first,
/// so that on a full filesystem it reuses the space the file holds.
fn write_pid(file: &File, path: &Path) {
    let pid = format!("{:<10}\n", std::process::id());
    if let Err(e) = file
        .write_all_at(pid.as_bytes(), 0)
        .and_then(|()| file.set_len(pid.len() as u64))
    {
        log::warn!("{}: cannot record this process's pid: {e}", path.display());
    }
}

/// Appends `bytes` to the journal and syncs it; on failure, cuts off
/// whatever part of them was appended.
fn append_synced(journal: &File, path: &Path, bytes: &[u8]) -> Result<()> {
    let before = journal
        .metadata()
        .map_err(|e| Error::io(path, "stat", e))?
        .len();
    let result = (&*journal)
        .write_all(bytes)
        .map_err(|e| Error::io(path, "appending to the journal", e))
        .and_then(|()| {
            journal
                .sync_data()
                .map_err(|e| Error::io(path, "syncing the journal", e))
        });
    if result.is_err() {
        if let Err(e) = journal.set_len(before) {
            log::error!("{}: cutting off a failed append: {e}", path.display());
        }
    }
    result
}

/// Removes what a staging area holds: its manifest, journal and blocks.
fn discard(dir: &Path) -> Result<()> {
    for name in [MANIFEST, JOURNAL] {
        let path = dir.join(name);
        if fs::symlink_metadata(&path).is_ok() {
            fs::remove_file(&path).map_err(|e| Error::io(&path, "removing", e))?;
        }
    }
    let blocks = dir.join(BLOCKS);
    if fs::symlink_metadata(&blocks).is_ok() {
        fs::remove_dir_all(&blocks).map_err(|e| Error::io(&blocks, "removing", e))?;
    }
    Ok(())
}

/// Whether the area in `dir` was made for `manifest`, and so may be
/// resumed; false when it has no manifest yet. Refuses an area made for
/// anything else.
fn holds(dir: &Path, manifest: &Manifest, journal_path: &Path) -> Result<bool> {
    let manifest_path = dir.join(MANIFEST);
    match read_own(&manifest_path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(Error::io(&manifest_path, "reading", e)),
        Ok(bytes) => match serde_json::from_slice::<Manifest>(&bytes) {
            Ok(found) => match found.mismatch(manifest) {
                Some(why) => Err(cannot_resume(dir, &why)),
                None => Ok(true),
            },
            // A crash before the first record can leave the manifest
            // unwritten (it is made durable by that record's sync), and
            // then nothing was recorded: the area starts afresh.
            Err(_) if journal_is_empty(journal_path)? => Ok(false),
            Err(e) => Err(Error::BadOutput {
                path: manifest_path.clone(),
                problem: format!(
                    "is not a readable staging manifest ({e}); pass --rebuild to start over"
                ),
            }),
        },
    }
}

/// Writes `manifest` into a new area in `dir`, and removes any journal
/// left without one.
fn start_afresh(dir: &Path, manifest: &Manifest, journal_path: &Path) -> Result<()> {
    let bytes = serde_json::to_vec_pretty(manifest)
        .map_err(|e| Error::Internal(format!("encoding the manifest: {e}")))?;
    // Not synced here: record_done syncs the filesystem before it
    // appends the first record, and only a record makes the area
    // worth resuming. That keeps two syncs off a view's start.
    write_replacing(&dir.join(MANIFEST), &bytes)?;
    // A journal left without its manifest belongs to nothing.
    if fs::symlink_metadata(journal_path).is_ok() {
        fs::remove_file(journal_path).map_err(|e| Error::io(journal_path, "removing", e))?;
    }
    Ok(())
}

/// The journal at `path`, open for appending after the records of
/// `journal` (what was read of it).
fn open_journal(path: &Path, journal: &Journal) -> Result<File> {
    let file = open_private(path, OpenOptions::new().append(true))?;
    // A torn or damaged tail (a crash while appending) is cut off, so
    // the records appended now start on a record boundary.
    let valid = (journal.records * RECORD_BYTES) as u64;
    if file.metadata().map(|m| m.len()).unwrap_or(valid) > valid {
        file.set_len(valid)
            .map_err(|e| Error::io(path, "cutting a damaged tail from the journal", e))?;
    }
    Ok(file)
}

fn cannot_resume(dir: &Path, why: &str) -> Error {
    Error::BadOutput {
        path: dir.to_path_buf(),
        problem: format!(
            "this staging area cannot be resumed: {why}. Pass --rebuild to discard it and \
             start over, or --staging to use another directory"
        ),
    }
}

/// Writes `path` whole under another name, then renames it into place:
/// a reader never sees it half written.
fn write_replacing(path: &Path, bytes: &[u8]) -> Result<()> {
    let partial = path.with_extension("partial");
    let mut file = open_private(&partial, OpenOptions::new().write(true).truncate(true))?;
    file.write_all(bytes)
        .map_err(|e| Error::io(&partial, "writing", e))?;
    fs::rename(&partial, path).map_err(|e| Error::io(path, "renaming into place", e))
}

/// The bytes of the file at `path` in the area, read as [`trust::open_own`]
/// opens it.
fn read_own(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    trust::open_own(path, OpenOptions::new().read(true))?.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Whether the journal at `path` holds no record (or does not exist).
fn journal_is_empty(path: &Path) -> Result<bool> {
    match fs::symlink_metadata(path) {
        Ok(meta) => Ok(meta.len() < RECORD_BYTES as u64),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(e) => Err(Error::io(path, "checking the journal", e)),
    }
}

/// FNV-1a: a stable 64-bit hash for directory keys (std's hasher may
/// change between Rust releases, and keys must survive upgrades).
fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes.into_iter().fold(0xcbf2_9ce4_8422_2325u64, |hash, b| {
        (hash ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::Storage;

    /// An input directory with files `0_0.npy` and `0_1.npy` (their bytes
    /// do not matter here), and a manifest for it.
    fn input_and_manifest() -> (tempfile::TempDir, Manifest) {
        let root = tempfile::tempdir().unwrap();
        let input = root.path().join("in");
        fs::create_dir(&input).unwrap();
        for name in ["0_0.npy", "0_1.npy"] {
            fs::write(input.join(name), [1u8; 100]).unwrap();
        }
        let manifest = Manifest {
            version: MANIFEST_VERSION,
            input: input.clone(),
            dataset: "/data".into(),
            array: vec![5, 10],
            dtype: "u2".parse().unwrap(),
            output_block: vec![5, 5],
            format: BlockFormat::Npy,
            files_in: input,
            input_files: vec!["0_0.npy".into(), "0_1.npy".into()],
            shard_chunks: None,
            pyramid: String::new(),
        };
        (root, manifest)
    }

    fn block(manifest: &Manifest, rank: usize) -> InputBlock {
        InputBlock {
            path: manifest.files_in.join(&manifest.input_files[rank]),
            storage: Storage::Contiguous { data_offset: 0 },
            check: None,
        }
    }

    fn staging_dir(root: &tempfile::TempDir) -> PathBuf {
        root.path().join("staging")
    }

    #[test]
    fn journal_survives_reopen_and_a_torn_record_is_cut_off() {
        let (root, manifest) = input_and_manifest();
        let dir = staging_dir(&root);
        let (staging, done) = Staging::open(&dir, &manifest, false).unwrap();
        assert!(done.is_empty());
        staging.reading(1, &block(&manifest, 1), None).unwrap();
        // A second read of the same file is not recorded again.
        staging.reading(1, &block(&manifest, 1), None).unwrap();
        staging.record_done(&[3, 1]).unwrap();
        drop(staging);
        let journal = Journal::read(&dir).unwrap();
        assert_eq!(journal.done, vec![3, 1]);
        let identity = FileIdentity::of(&block(&manifest, 1).path).unwrap();
        assert_eq!(journal.inputs_read, vec![(1, identity)]);
        // A crash mid-append leaves part of a record.
        let mut file = OpenOptions::new()
            .append(true)
            .open(dir.join(JOURNAL))
            .unwrap();
        file.write_all(&[9, 0, 0]).unwrap();
        drop(file);
        let (staging, done) = Staging::open(&dir, &manifest, false).unwrap();
        assert_eq!(done, vec![3, 1]);
        // Records appended after the cut are read back whole.
        staging.reading(0, &block(&manifest, 0), None).unwrap();
        staging.record_done(&[2]).unwrap();
        let journal = Journal::read(&dir).unwrap();
        assert_eq!(journal.done, vec![3, 1, 2]);
        assert_eq!(journal.inputs_read.len(), 2);
        // A flipped bit ends the journal there.
        let mut bytes = fs::read(dir.join(JOURNAL)).unwrap();
        bytes[RECORD_BYTES + 9] ^= 4;
        fs::write(dir.join(JOURNAL), bytes).unwrap();
        assert_eq!(Journal::read(&dir).unwrap().done, Vec::<u64>::new());
    }

    #[test]
    fn an_input_changed_after_it_was_read_is_refused_until_rebuild() {
        let (root, manifest) = input_and_manifest();
        let dir = staging_dir(&root);
        let (staging, _) = Staging::open(&dir, &manifest, false).unwrap();
        staging.reading(0, &block(&manifest, 0), None).unwrap();
        staging.record_done(&[0]).unwrap();
        drop(staging);
        // File 1 was never read: its change does not matter.
        fs::write(block(&manifest, 1).path, [2u8; 120]).unwrap();
        let (_, done) = Staging::open(&dir, &manifest, false).unwrap();
        assert_eq!(done, vec![0]);
        // File 0 was: the area cannot be trusted any more.
        fs::write(block(&manifest, 0).path, [2u8; 101]).unwrap();
        let err = Staging::open(&dir, &manifest, false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("input file 0_0.npy changed size (100 → 101 bytes) after it was read"),
            "{err}"
        );
        assert!(err.contains("--rebuild"), "{err}");
        fs::remove_file(block(&manifest, 0).path).unwrap();
        let err = Staging::open(&dir, &manifest, false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("input file 0_0.npy is gone"), "{err}");
        let (_, done) = Staging::open(&dir, &manifest, true).unwrap();
        assert!(done.is_empty());
        assert_eq!(Journal::read(&dir).unwrap(), Journal::default());
    }

    #[test]
    fn an_area_made_for_something_else_is_refused() {
        let (root, manifest) = input_and_manifest();
        let dir = staging_dir(&root);
        drop(Staging::open(&dir, &manifest, false).unwrap());
        let mut other_shape = manifest.clone();
        other_shape.output_block = vec![2, 2];
        let err = Staging::open(&dir, &other_shape, false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("holds npy blocks of 5×5"), "{err}");
        let mut renamed = manifest.clone();
        renamed.input_files[1] = "0_2.npy".into();
        let err = Staging::open(&dir, &renamed, false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("input file 0_1.npy is now 0_2.npy"), "{err}");
    }

    #[test]
    fn a_manifest_lost_before_any_record_starts_the_area_afresh() {
        let (root, manifest) = input_and_manifest();
        let dir = staging_dir(&root);
        drop(Staging::open(&dir, &manifest, false).unwrap());
        // What a crash can leave of a manifest written but not yet synced.
        fs::write(dir.join(MANIFEST), b"").unwrap();
        let (staging, done) = Staging::open(&dir, &manifest, false).unwrap();
        assert!(done.is_empty());
        let written: Manifest =
            serde_json::from_slice(&fs::read(dir.join(MANIFEST)).unwrap()).unwrap();
        assert_eq!(written.mismatch(&manifest), None);
        // Once a record is written the manifest was synced before it, so
        // an unreadable one then is damage, not a crash: refused.
        staging.record_done(&[1]).unwrap();
        drop(staging);
        fs::write(dir.join(MANIFEST), b"{").unwrap();
        let err = Staging::open(&dir, &manifest, false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("is not a readable staging manifest"), "{err}");
        assert!(err.contains("--rebuild"), "{err}");
    }

    #[test]
    fn a_rewrite_with_size_and_mtime_restored_is_refused() {
        let (root, manifest) = input_and_manifest();
        let dir = staging_dir(&root);
        let (staging, _) = Staging::open(&dir, &manifest, false).unwrap();
        staging.reading(0, &block(&manifest, 0), None).unwrap();
        staging.record_done(&[0]).unwrap();
        drop(staging);
        let path = block(&manifest, 0).path;
        let mtime = fs::metadata(&path).unwrap().modified().unwrap();
        // Other bytes, same size, the mtime set back (as touch -r does).
        std::thread::sleep(std::time::Duration::from_millis(10));
        fs::write(&path, [7u8; 100]).unwrap();
        File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        assert_eq!(fs::metadata(&path).unwrap().modified().unwrap(), mtime);
        let err = Staging::open(&dir, &manifest, false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("input file 0_0.npy was modified after it was read")
                && err.contains("change time or inode differs"),
            "{err}"
        );
    }

    #[test]
    fn a_second_user_of_an_area_is_refused_naming_the_first() {
        let (root, manifest) = input_and_manifest();
        let dir = staging_dir(&root);
        let (first, _) = Staging::open(&dir, &manifest, false).unwrap();
        let err = Staging::open(&dir, &manifest, true)
            .unwrap_err()
            .to_string();
        let pid = format!("pid {}", std::process::id());
        assert!(err.contains("in use by") && err.contains(&pid), "{err}");
        // Refused before anything was touched: --rebuild discarded nothing.
        assert!(dir.join(MANIFEST).exists());
        drop(first);
        drop(Staging::open(&dir, &manifest, false).unwrap());
    }

    #[test]
    fn the_area_is_its_owners_alone_and_partial_blocks_are_reclaimed() {
        let (root, manifest) = input_and_manifest();
        let dir = staging_dir(&root);
        // An area an earlier version left readable by all.
        fs::create_dir_all(dir.join(BLOCKS)).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        let (staging, _) = Staging::open(&dir, &manifest, false).unwrap();
        staging.record_done(&[0]).unwrap();
        let mode = |path: &Path| fs::metadata(path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join(BLOCKS)), 0o700);
        for name in [MANIFEST, JOURNAL, LOCK] {
            assert_eq!(mode(&dir.join(name)), 0o600, "{name}");
        }
        for name in ["0_0.npy", "0_1.npy"] {
            fs::write(staging.block_path(name), [0u8; 1000]).unwrap();
        }
        let reclaimed = staging.reclaim(|name| name == "0_0.npy").unwrap();
        assert_eq!(reclaimed, (1, 1000));
        assert!(staging.block_path("0_0.npy").exists());
        assert!(!staging.block_path("0_1.npy").exists());
    }

    #[test]
    fn an_input_identity_survives_its_journal_words() {
        // Before 1970 (negative), now, and past 2554 (beyond 64 bits of ns).
        for (mtime_ns, ctime_ns) in [
            (-1_500_000_000_123_456_789, -1),
            (1_795_000_000_987_654_321, 1_795_000_001_000_000_000),
            (1 << 70, (1 << 70) + 999_999_999),
        ] {
            let identity = FileIdentity {
                size: 85_752_048,
                mtime_ns,
                ctime_ns,
                inode: u64::MAX - 7,
            };
            assert_eq!(identity_from_words(identity_words(&identity)), identity);
        }
    }
}
