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
/// temporary (`~`, `.tmp`, `.part`, `.swp` endings are not `.toml` anyway).
pub fn is_spec_name(name: &str) -> bool {
    !name.starts_with('.') && !name.starts_with('#') && name.ends_with(".toml") && name.len() > 5
}

/// What a scan saw of one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub len: u64,
    pub modified: Option<SystemTime>,
}

/// The spec files in `dir` that are settled (unchanged for `settle`), with what was seen.
/// Files still changing are returned in the second list (to be looked at again).
pub fn scan(
    dir: &Path,
    settle: Duration,
) -> std::io::Result<(BTreeMap<PathBuf, Seen>, Vec<PathBuf>)> {
    let mut settled = BTreeMap::new();
    let mut changing = Vec::new();
    let now = SystemTime::now();
    for e in std::fs::read_dir(dir)? {
        let Ok(e) = e else { continue };
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if !is_spec_name(name) {
            continue;
        }
        let Ok(meta) = e.metadata() else { continue };
        if !meta.is_file() {
            continue;
        }
        let modified = meta.modified().ok();
        let age = modified
            .and_then(|m| now.duration_since(m).ok())
            .unwrap_or(Duration::MAX);
        let path = e.path();
        if age < settle {
            changing.push(path);
        } else {
            settled.insert(
                path,
                Seen {
                    len: meta.len(),
                    modified,
                },
            );
        }
    }
    Ok((settled, changing))
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
        let (settled, changing) = scan(dir.path(), Duration::from_secs(60)).unwrap();
        assert!(settled.is_empty());
        assert_eq!(changing.len(), 1);
        let (settled, _) = scan(dir.path(), Duration::ZERO).unwrap();
        assert_eq!(settled.len(), 1);
    }
}
