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
