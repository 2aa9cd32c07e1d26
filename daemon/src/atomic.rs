//! Files are written whole or not at all: to a temporary file in the same folder, synced,
//! then renamed over the target (and the folder synced), so a crash or a full disk never
//! leaves a half-written file behind.

use std::io::Write;
use std::path::Path;

/// Writes `bytes` to `path` atomically.
pub fn write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".archplace-")
        .suffix(".tmp")
        .tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    if let Ok(d) = std::fs::File::open(dir) {
        // Not every platform can sync a folder; the rename itself is what must not tear.
        let _ = d.sync_all();
    }
    Ok(())
}

/// Removes the temporary files [`write()`] leaves when the process is killed mid-write
/// (`.archplace-*.tmp`) in `dir` and its subfolders down to `depth` levels. They were never
/// renamed into place, so no reader has seen them.
pub fn remove_stale(dir: &Path, depth: usize) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let path = e.path();
        let name = e.file_name();
        let name = name.to_string_lossy();
        if path.is_dir() {
            if depth > 0 {
                remove_stale(&path, depth - 1);
            }
        } else if name.starts_with(".archplace-") && name.ends_with(".tmp") {
            let _ = std::fs::remove_file(&path);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn replaces_whole_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.json");
        super::write(&p, b"one").unwrap();
        super::write(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temporary file left"
        );
    }
}
