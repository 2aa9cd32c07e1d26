//! The drop folder: which files are specs, and when a file is whole.
//!
//! Producers should write a temporary name (a dotfile, or a name not ending in `.toml`)
//! and rename it into place; renames are atomic, so the daemon never sees half a file.
//! For producers that write in place, a file is only read once its size and modification
//! time have not changed for `settle` (and it is read again if they change later).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// Whether a name is a spec: `*.toml`, not hidden, not an editor's or a producer's
/// temporary (`~`, `.tmp`, `.part`, `.swp` endings are not `.toml` anyway), not a
/// calibration a spec beside it applies (`*.calibration.toml`, as `archplace calibrate`
/// names them).
pub fn is_spec_name(name: &str) -> bool {
    !name.starts_with('.')
        && !name.starts_with('#')
        && name.ends_with(".toml")
        && !name.ends_with(".calibration.toml")
        && name.len() > 5
}

/// What a scan saw of one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub len: u64,
    pub modified: Option<SystemTime>,
}

/// One scan of the folder: the settled spec files with what was seen of them, the files
/// still changing (to be looked at again), and the entries skipped, with why.
#[derive(Debug, Default)]
pub struct Scan {
    pub settled: BTreeMap<PathBuf, Seen>,
    pub changing: Vec<PathBuf>,
    pub skipped: Vec<(PathBuf, &'static str)>,
}

/// The `reason` label of `archplace_specs_skipped_total` for an entry skipped `why`.
pub fn skip_reason(why: &str) -> &'static str {
    match why {
        "its name is not valid UTF-8" => "name_not_utf8",
        "a symbolic link to a file outside the spec folder" => "link_outside",
        "a broken symbolic link" => "broken_link",
        _ => "not_a_file",
    }
}

/// The spec files in `dir` that are settled (unchanged for `settle`).
///
/// A symbolic link is followed when it resolves to a regular file inside the folder — how a
/// Kubernetes ConfigMap mounts its files (`a.toml -> ..data/a.toml`); what it reads then
/// changes when the link is repointed. A link leading outside the folder, a directory, a
/// FIFO, a device or a name that is not UTF-8 is skipped and reported.
pub fn scan(dir: &Path, settle: Duration) -> std::io::Result<Scan> {
    let mut out = Scan::default();
    let now = SystemTime::now();
    let root = dir.canonicalize()?;
    for e in std::fs::read_dir(dir)? {
        let Ok(e) = e else { continue };
        let path = e.path();
        let name = e.file_name();
        let Some(name) = name.to_str() else {
            if name.to_string_lossy().ends_with(".toml") {
                out.skipped.push((path, "its name is not valid UTF-8"));
            }
            continue;
        };
        if !is_spec_name(name) {
            continue;
        }
        let Ok(link) = e.metadata() else { continue };
        let meta = if link.file_type().is_symlink() {
            match path.canonicalize() {
                Ok(target) if !target.starts_with(&root) => {
                    out.skipped
                        .push((path, "a symbolic link to a file outside the spec folder"));
                    continue;
                }
                Ok(target) => match std::fs::metadata(&target) {
                    Ok(m) => m,
                    Err(_) => continue,
                },
                Err(_) => {
                    out.skipped.push((path, "a broken symbolic link"));
                    continue;
                }
            }
        } else {
            link
        };
        if !meta.is_file() {
            let why = if meta.is_dir() {
                "a directory"
            } else {
                "not a regular file (a FIFO, socket or device)"
            };
            out.skipped.push((path, why));
            continue;
        }
        let modified = meta.modified().ok();
        let age = modified
            .and_then(|m| now.duration_since(m).ok())
            .unwrap_or(Duration::MAX);
        if age < settle {
            out.changing.push(path);
        } else {
            out.settled.insert(
                path,
                Seen {
                    len: meta.len(),
                    modified,
                },
            );
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["a.toml", "gpt3 175b.toml"] {
            assert!(is_spec_name(ok), "{ok}");
        }
        for no in [
            ".a.toml",
            "a.calibration.toml",
            "a.toml.tmp",
            "a.toml~",
            "#a.toml#",
            ".toml",
            "a.json",
            "a.toml.part",
        ] {
            assert!(!is_spec_name(no), "{no}");
        }
    }

    #[test]
    fn a_file_being_written_is_not_settled() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.toml"), "x").unwrap();
        std::fs::write(dir.path().join(".b.toml"), "x").unwrap();
        let s = scan(dir.path(), Duration::from_secs(60)).unwrap();
        assert!(s.settled.is_empty());
        assert_eq!(s.changing.len(), 1);
        let s = scan(dir.path(), Duration::ZERO).unwrap();
        assert_eq!(s.settled.len(), 1);
    }

    /// Links inside the folder are followed (a ConfigMap's layout); links out of it,
    /// directories, FIFOs and undecodable names are skipped with a reason (they were
    /// once skipped silently).
    #[test]
    fn links_inside_are_followed_and_the_rest_is_skipped_with_a_reason() {
        use std::os::unix::ffi::OsStrExt;
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("..data")).unwrap();
        std::fs::write(d.join("..data/mounted.toml"), "x").unwrap();
        std::os::unix::fs::symlink("..data/mounted.toml", d.join("mounted.toml")).unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret.toml"), "x").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret.toml"), d.join("out.toml")).unwrap();
        std::os::unix::fs::symlink("missing.toml", d.join("broken.toml")).unwrap();
        std::fs::create_dir(d.join("dir.toml")).unwrap();
        let fifo = d.join("fifo.toml");
        assert!(
            std::process::Command::new("mkfifo")
                .arg(&fifo)
                .status()
                .unwrap()
                .success()
        );
        std::fs::write(d.join(std::ffi::OsStr::from_bytes(b"bad\xff.toml")), "x").unwrap();
        let s = scan(d, Duration::ZERO).unwrap();
        let settled: Vec<_> = s.settled.keys().map(|p| p.file_name().unwrap()).collect();
        assert_eq!(settled, ["mounted.toml"]);
        let mut skipped: Vec<(String, &str)> = s
            .skipped
            .iter()
            .map(|(p, why)| (p.file_name().unwrap().to_string_lossy().into_owned(), *why))
            .collect();
        skipped.sort();
        assert_eq!(
            skipped,
            [
                (
                    "bad\u{fffd}.toml".to_string(),
                    "its name is not valid UTF-8"
                ),
                ("broken.toml".to_string(), "a broken symbolic link"),
                ("dir.toml".to_string(), "a directory"),
                (
                    "fifo.toml".to_string(),
                    "not a regular file (a FIFO, socket or device)"
                ),
                (
                    "out.toml".to_string(),
                    "a symbolic link to a file outside the spec folder"
                ),
            ]
        );
    }
}
