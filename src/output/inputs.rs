//! The input's files, which no command writing an output may remove or
//! write, whatever the paths: an input inside OUT (one file given as IN
//! that sits in OUT under a block's name, Zarr chunks under OUT, a
//! pyramid level's directory) is refused before OUT is touched, and
//! `--overwrite` removes no file that is an input's by another name (a
//! hard link). Files are told apart by identity (device, inode), never by
//! path strings, which symlinks, `..` and bind mounts make ambiguous.

use std::collections::HashMap;
use std::fs::{self, Metadata};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::engine::workers::map_on_threads;
use crate::error::{Error, Result};
use crate::input::{FileIdentity, InputArray};

/// A file's identity: its device and inode.
type Identity = (u64, u64);

fn identity(meta: &Metadata) -> Identity {
    (meta.dev(), meta.ino())
}

/// The input files to keep from harm. Every stat is made when the set is
/// made, so that checking an OUT against it is quick.
#[derive(Debug, Default)]
pub struct InputFiles {
    /// The directories holding the input paths' names, and those holding
    /// the files their symlinks name, each once, with an input path there.
    dirs: HashMap<PathBuf, PathBuf>,
    /// The identity of each input path's own entry (a symlink's) and of
    /// the file it names, with the input path.
    identities: HashMap<Identity, PathBuf>,
}

impl InputFiles {
    /// Every file of `input` (absent Zarr chunks have none), and the
    /// path it was scanned from.
    pub fn of(input: &InputArray) -> InputFiles {
        let paths = input.blocks.iter().map(|block| block.path.as_path());
        InputFiles::of_paths(std::iter::once(input.source.as_path()).chain(paths))
    }

    /// What a run that reads only the blocks of `input` at `ranks` (C
    /// order) needs to keep from harm, for OUT's check
    /// ([`InputFiles::refuse_inside`]) and not `--overwrite`'s: those
    /// files, the path scanned, and the directory holding every block's
    /// name, which takes no stat.
    pub fn of_read(input: &InputArray, ranks: &[usize]) -> InputFiles {
        let read = ranks
            .iter()
            .filter_map(|&rank| input.blocks.get(rank))
            .map(|block| block.path.as_path());
        let mut files = InputFiles::of_paths(std::iter::once(input.source.as_path()).chain(read));
        // Blocks in C order share their directory with their neighbours:
        // one entry per run of them, not a hash of every block's path.
        let mut last: Option<&Path> = None;
        for block in &input.blocks {
            let dir = block.path.parent();
            if dir.is_some() && dir == last {
                continue;
            }
            last = dir;
            files
                .dirs
                .entry(parent_dir(&block.path))
                .or_insert_with(|| block.path.clone());
        }
        files
    }

    /// The files at `paths` (those that exist), stat'ed on every thread
    /// the run may use.
    pub fn of_paths<'p>(paths: impl IntoIterator<Item = &'p Path>) -> InputFiles {
        let paths: Vec<&Path> = paths.into_iter().collect();
        let stats = map_on_threads(&paths, |path| PathStat::of(path));
        InputFiles::of_stats(&paths, &stats)
    }

    /// [`InputFiles::of`], and the identity of each of `input`'s block
    /// files now ([`FileIdentity::ABSENT`] for one that does not exist),
    /// from the same stats: on a cluster filesystem each is a round trip.
    pub fn of_with_identities(input: &InputArray) -> Result<(InputFiles, Vec<FileIdentity>)> {
        let paths: Vec<&Path> = std::iter::once(input.source.as_path())
            .chain(input.blocks.iter().map(|block| block.path.as_path()))
            .collect();
        let stats = map_on_threads(&paths, |path| PathStat::of(path));
        let identities = paths
            .iter()
            .zip(&stats)
            .skip(1)
            .map(|(path, stat)| stat.identity(path))
            .collect::<Result<_>>()?;
        Ok((InputFiles::of_stats(&paths, &stats), identities))
    }

    /// The files at `paths`, as `stats` found them.
    fn of_stats(paths: &[&Path], stats: &[PathStat]) -> InputFiles {
        let mut files = InputFiles::default();
        for (path, stat) in paths.iter().zip(stats) {
            let own = stat.own.as_ref().ok();
            let named = stat.named.as_ref().and_then(|named| named.as_ref().ok());
            for meta in own.into_iter().chain(named) {
                files
                    .identities
                    .entry(identity(meta))
                    .or_insert_with(|| path.to_path_buf());
            }
            for dir in std::iter::once(parent_dir(path)).chain(stat.target.clone()) {
                files.dirs.entry(dir).or_insert_with(|| path.to_path_buf());
            }
        }
        files
    }

    /// Refuses `out` if any input file lies in it, at any depth: its name
    /// (a symlink's too) or the file it names. Nothing is refused when
    /// `out` does not exist.
    pub fn refuse_inside(&self, out: &Path) -> Result<()> {
        let Ok(out_meta) = fs::metadata(out) else {
            return Ok(());
        };
        let out_id = identity(&out_meta);
        let inside = |dir: &Path| {
            dir.canonicalize().is_ok_and(|real| {
                real.ancestors()
                    .any(|at| fs::metadata(at).is_ok_and(|meta| identity(&meta) == out_id))
            })
        };
        // The input directory itself (a Zarr array given as IN), or a
        // directory holding an input's name or file.
        let held = self.identities.get(&out_id).or_else(|| {
            self.dirs
                .iter()
                .find(|(dir, _)| inside(dir))
                .map(|(_, path)| path)
        });
        match held {
            None => Ok(()),
            Some(path) => Err(Error::BadOutput {
                path: out.to_path_buf(),
                problem: format!(
                    "holds the input {}: writing the output there would replace or remove input \
                     files; write it to a directory outside the input",
                    path.display()
                ),
            }),
        }
    }

    /// Refuses to remove `path` (an entry of OUT) if it is an input file,
    /// by any name.
    pub fn refuse_removing(&self, path: &Path) -> Result<()> {
        let Ok(meta) = fs::symlink_metadata(path) else {
            return Ok(());
        };
        match self.identities.get(&identity(&meta)) {
            None => Ok(()),
            Some(input) => Err(Error::BadOutput {
                path: path.to_path_buf(),
                problem: format!(
                    "is the input file {} under another name (a hard link): --overwrite would \
                     remove it; move it out of OUT, or write the output elsewhere",
                    input.display()
                ),
            }),
        }
    }
}

/// What stat'ing an input path finds: its own entry (`lstat`) and, for a
/// symlink, the file it names and the directory that file is in.
struct PathStat {
    own: std::io::Result<Metadata>,
    /// A symlink's target (only a symlink names a file other than its own
    /// entry).
    named: Option<std::io::Result<Metadata>>,
    target: Option<PathBuf>,
}

impl PathStat {
    fn of(path: &Path) -> PathStat {
        let own = fs::symlink_metadata(path);
        let is_link = own.as_ref().is_ok_and(|meta| meta.file_type().is_symlink());
        PathStat {
            own,
            named: is_link.then(|| fs::metadata(path)),
            target: is_link
                .then(|| path.canonicalize().ok())
                .flatten()
                .map(|real| parent_dir(&real)),
        }
    }

    /// The identity of the file `path` names, as `stat` (following a
    /// symlink) gives it: [`FileIdentity::ABSENT`] if there is none.
    fn identity(&self, path: &Path) -> Result<FileIdentity> {
        FileIdentity::of_stat(path, self.named.as_ref().unwrap_or(&self.own).as_ref())
    }
}

/// The directory holding `path`'s name (`.` for a bare name).
fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hard_link_of_an_input_is_the_input() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in.npy");
        std::fs::write(&input, b"x").unwrap();
        let out = dir.path().join("out");
        std::fs::create_dir(&out).unwrap();
        let link = out.join("0_0_0.npy");
        std::fs::hard_link(&input, &link).unwrap();
        let files = InputFiles::of_paths([input.as_path()]);
        assert!(files.refuse_inside(&out).is_ok());
        assert!(files.refuse_removing(&link).is_err());
        // Inside OUT, given by its name there.
        let files = InputFiles::of_paths([link.as_path()]);
        assert!(files.refuse_inside(&out).is_err());
        assert!(files.refuse_inside(dir.path()).is_err());
        assert!(files.refuse_inside(&dir.path().join("missing")).is_ok());
    }

    /// One stat pass gives each path the identity a `stat` of it does: a
    /// symlink's is its target's, a missing file's and a dangling link's
    /// are absent.
    #[test]
    fn a_path_stat_gives_the_identity_stat_gives() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("in.npy");
        std::fs::write(&file, b"x").unwrap();
        let link = dir.path().join("link.npy");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let dangling = dir.path().join("dangling.npy");
        std::os::unix::fs::symlink(dir.path().join("gone"), &dangling).unwrap();
        let missing = dir.path().join("missing.npy");
        for path in [&file, &link, &dangling, &missing] {
            assert_eq!(
                PathStat::of(path).identity(path).unwrap(),
                FileIdentity::now(path).unwrap(),
                "{}",
                path.display()
            );
        }
        assert_eq!(
            PathStat::of(&link).identity(&link).unwrap(),
            FileIdentity::now(&file).unwrap()
        );
        assert_eq!(
            PathStat::of(&missing).identity(&missing).unwrap(),
            FileIdentity::ABSENT
        );
    }
}
