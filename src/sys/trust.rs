//! Directories and files no other local user can change: a place rechunkfs
//! writes to (a staging area) must be beyond another user's reach, or that
//! user could swap what it holds, or plant a symlink that makes root write
//! through it.
//!
//! The rule is ssh's for a home directory. A directory is trusted when it
//! is owned by this user or root and no one else may write to it. A parent
//! that others may write to is trusted only if it is sticky and owned by
//! root or this user (`/tmp`): there, others can neither remove nor rename
//! what this user made. The area itself must be this user's and writable
//! by no one else. A symlink on the way is followed only if it is owned by
//! this user or root and sits in a trusted directory, so no one else can
//! point it elsewhere. Files inside are then opened without following
//! links, and must be regular files of this user's.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use crate::error::{Error, Result};

/// Symlinks followed at most while checking one path (the kernel's limit).
const MOST_LINKS: usize = 40;

/// Owner only: what a private directory's mode becomes.
const PRIVATE_DIR: u32 = 0o700;

/// Makes `dir` (and missing parents, owner-only) after checking that no
/// other user can change its existing parents, then checks `dir` itself is
/// this user's alone and makes it `0700`. `what` names it in messages
/// ("the staging area").
pub fn make_private_dir(dir: &Path, what: &str) -> Result<()> {
    let dir = std::path::absolute(dir).map_err(|e| Error::io(dir, "resolving", e))?;
    // Whatever is made is made inside a directory no one else can change.
    let existing = dir
        .ancestors()
        .find(|a| fs::symlink_metadata(a).is_ok())
        .unwrap_or(Path::new("/"));
    if existing != dir {
        check_dir(existing, false, what)?;
        fs::DirBuilder::new()
            .recursive(true)
            .mode(PRIVATE_DIR)
            .create(&dir)
            .map_err(|e| Error::io(&dir, "creating", e))?;
    }
    check_dir(&dir, true, what)?;
    let meta = fs::metadata(&dir).map_err(|e| Error::io(&dir, "stat", e))?;
    if meta.permissions().mode() & 0o7777 != PRIVATE_DIR {
        fs::set_permissions(&dir, fs::Permissions::from_mode(PRIVATE_DIR))
            .map_err(|e| Error::io(&dir, "making it private (chmod 0700)", e))?;
    }
    Ok(())
}

/// Checks that no other user can change what `dir` names: every directory
/// on its way and every symlink followed. With `own`, `dir` itself must be
/// this user's and writable by no one else (the area); otherwise it is
/// held to the parents' rule.
pub fn check_dir(dir: &Path, own: bool, what: &str) -> Result<()> {
    let me = nix::unistd::geteuid().as_raw();
    let absolute = std::path::absolute(dir).map_err(|e| Error::io(dir, "resolving", e))?;
    let mut pending: Vec<OsString> = Vec::new();
    push_components(&mut pending, &absolute);
    let mut current = PathBuf::from("/");
    let root = fs::metadata(&current).map_err(|e| Error::io(&current, "stat", e))?;
    check_one(&current, &root, me, own && pending.is_empty(), what)?;
    let mut links = 0;
    while let Some(name) = pending.pop() {
        if name == ".." {
            current.pop();
            continue;
        }
        let next = current.join(&name);
        let meta = fs::symlink_metadata(&next).map_err(|e| Error::io(&next, "checking", e))?;
        if meta.file_type().is_symlink() {
            links += 1;
            if links > MOST_LINKS {
                return Err(untrusted(
                    dir,
                    what,
                    &next,
                    "has too many symlinks on its way",
                ));
            }
            if meta.uid() != me && meta.uid() != 0 {
                return Err(untrusted(
                    dir,
                    what,
                    &next,
                    &format!(
                        "is a symlink owned by {}, who could point it elsewhere",
                        user(meta.uid())
                    ),
                ));
            }
            let target = fs::read_link(&next).map_err(|e| Error::io(&next, "reading", e))?;
            if target.is_absolute() {
                current = PathBuf::from("/");
            }
            push_components(&mut pending, &target);
            continue;
        }
        if !meta.is_dir() {
            return Err(Error::BadOutput {
                path: next,
                problem: format!("is not a directory, and {what} must be one"),
            });
        }
        check_one(&next, &meta, me, own && pending.is_empty(), what)?;
        current = next;
    }
    Ok(())
}

/// Pushes the components of `path` onto `pending` (a stack: the first
/// component ends on top). `.` and the root are dropped.
fn push_components(pending: &mut Vec<OsString>, path: &Path) {
    let names: Vec<OsString> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(name) => Some(name.to_os_string()),
            Component::ParentDir => Some("..".into()),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect();
    pending.extend(names.into_iter().rev());
}

/// Checks one directory: the area itself (`own`) or one on its way.
fn check_one(path: &Path, meta: &fs::Metadata, me: u32, own: bool, what: &str) -> Result<()> {
    let (owner, mode) = (meta.uid(), meta.mode());
    let others_write = mode & 0o022 != 0;
    let problem = if own && owner != me {
        Some(format!("is owned by {}, not by you", user(owner)))
    } else if owner != me && owner != 0 {
        Some(format!("is owned by {}", user(owner)))
    } else if others_write && (own || mode & libc::S_ISVTX == 0) {
        Some(format!(
            "may be written by other users (mode {:04o}{})",
            mode & 0o7777,
            if own { "" } else { ", not sticky" }
        ))
    } else {
        None
    };
    match problem {
        Some(problem) => Err(untrusted(path, what, path, &problem)),
        None => Ok(()),
    }
}

fn untrusted(dir: &Path, what: &str, culprit: &Path, problem: &str) -> Error {
    let whose = if culprit == dir {
        String::new()
    } else {
        format!(" (on the way to {})", dir.display())
    };
    Error::BadOutput {
        path: culprit.to_path_buf(),
        problem: format!(
            "{problem}{whose}: another user could change what {what} holds, so it is refused. \
             Use a directory only you can write to (and whose parents only you or root can \
             write to, or that are sticky like /tmp)"
        ),
    }
}

/// A user's name and uid, for messages.
fn user(uid: u32) -> String {
    match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
        Ok(Some(user)) => format!("user {} (uid {uid})", user.name),
        _ => format!("uid {uid}"),
    }
}

/// Opens `path` with `options` without following a symlink in its last
/// component, and refuses anything but a regular file of this user's. For
/// files in a directory [`check_dir`] trusts: a link or a file another user
/// left there (before it was trusted) is never written through.
pub fn open_own(path: &Path, options: &mut OpenOptions) -> std::io::Result<File> {
    let file = options
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => std::io::Error::other(
                "it is a symlink, and no link is followed here (another user may have planted \
                 it); remove it",
            ),
            _ => e,
        })?;
    let meta = file.metadata()?;
    let me = nix::unistd::geteuid().as_raw();
    if !meta.is_file() {
        return Err(std::io::Error::other("it is not a regular file; remove it"));
    }
    if meta.uid() != me {
        return Err(std::io::Error::other(format!(
            "it is owned by {}, not by you; remove it",
            user(meta.uid())
        )));
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn mode(path: &Path, mode: u32) {
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn writable_parents_are_refused_unless_sticky_and_symlinks_are_checked() {
        let root = tempfile::tempdir().unwrap();
        let shared = root.path().join("shared");
        fs::create_dir(&shared).unwrap();
        mode(&shared, 0o777);
        let err = make_private_dir(&shared.join("area"), "the staging area")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("may be written by other users (mode 0777, not sticky)"),
            "{err}"
        );
        assert!(
            !shared.join("area").exists(),
            "made inside an untrusted parent"
        );
        mode(&shared, 0o1777);
        make_private_dir(&shared.join("area/deeper"), "the staging area").unwrap();
        let meta = fs::metadata(shared.join("area/deeper")).unwrap();
        assert_eq!(meta.mode() & 0o7777, 0o700);
        // The area itself must not be writable by others, sticky or not.
        mode(&shared.join("area"), 0o1777);
        let err = check_dir(&shared.join("area"), true, "the staging area")
            .unwrap_err()
            .to_string();
        assert!(err.contains("mode 1777"), "{err}");
        mode(&shared.join("area"), 0o700);
        // A symlink of ours in a trusted directory is followed.
        let link = root.path().join("link");
        symlink(shared.join("area"), &link).unwrap();
        check_dir(&link.join("deeper"), true, "the staging area").unwrap();
        let looped = root.path().join("loop");
        symlink(&looped, &looped).unwrap();
        assert!(check_dir(&looped, true, "x").is_err());
    }

    #[test]
    fn a_planted_symlink_is_not_opened() {
        let root = tempfile::tempdir().unwrap();
        let target = root.path().join("target");
        fs::write(&target, b"keep").unwrap();
        let lock = root.path().join("lock");
        symlink(&target, &lock).unwrap();
        let err = open_own(
            &lock,
            OpenOptions::new().write(true).create(true).truncate(true),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("symlink"), "{err}");
        assert_eq!(fs::read(&target).unwrap(), b"keep");
        let err = open_own(root.path(), OpenOptions::new().read(true))
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a regular file"), "{err}");
        assert!(open_own(&target, OpenOptions::new().read(true)).is_ok());
    }
}
