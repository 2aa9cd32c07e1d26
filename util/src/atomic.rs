//! Files are written whole or not at all: to a temporary file in the same folder, synced,
//! then renamed over the target (and the folder synced), so a crash or a full disk never
//! leaves a half-written file behind.

use std::io::Write;
use std::path::Path;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// The environment variable of the fault-injection hook: with `=n`, the process aborts
/// (no destructors, no flushing: as `kill -9`) at the `n`-th step of its atomic writes.
/// `tests/daemon.rs` kills the daemon at every step of a job's life this way.
pub const ABORT_AT_STEP_VAR: &str = "ARCHPLACE_TEST_ABORT_AT_STEP";

/// One file-system step: the temporary file created, its bytes written, synced, renamed.
/// Counts the steps and aborts at the one [`ABORT_AT_STEP_VAR`] names, if any.
fn step(what: &str, path: &Path) {
    static AT: OnceLock<Option<u64>> = OnceLock::new();
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let Some(at) = *AT.get_or_init(|| std::env::var(ABORT_AT_STEP_VAR).ok()?.parse().ok()) else {
        return;
    };
    let n = COUNT.fetch_add(1, Ordering::Relaxed) + 1;
    if n == at {
        tracing::error!(step = at, what, path = %path.display(), "fault injection: aborting");
        std::process::abort();
    }
    // The test that kills at every step reads these to know the steps of a job's life.
    tracing::info!(step = n, what, path = %path.display(), "fault injection: step");
}

/// Writes `bytes` to `path` atomically.
pub fn write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_with(path, |w| w.write_all(bytes))
}

/// Writes what `fill` writes to `path` atomically, through a buffer: for files too large to
/// build in memory first (`explored.jsonl` has a line per candidate).
pub fn write_with(
    path: &Path,
    fill: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> std::io::Result<()> {
    // A device, pipe or socket (`-o /dev/null`, `-o /dev/stdout`) is written in place: a
    // file renamed over it would replace the device node itself — run as root, `calibrate
    // -o /dev/null` turned /dev/null into a regular file, which every later reader of
    // /dev/null then read back. Only a regular file (or none) is replaced whole.
    if let Ok(meta) = std::fs::metadata(path)
        && !meta.is_file()
        && !meta.is_dir()
    {
        let f = std::fs::OpenOptions::new().write(true).open(path)?;
        let mut w = std::io::BufWriter::with_capacity(1 << 16, f);
        fill(&mut w)?;
        return w.flush();
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    // Created as any new file is (0666 less the umask), not tempfile's 0600: result files
    // and installed plugins are for the people and services the umask lets read them.
    let mut builder = tempfile::Builder::new();
    builder.prefix(".archplace-").suffix(".tmp");
    #[cfg(unix)]
    builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
    let tmp = builder.tempfile_in(dir)?;
    step("created the temporary file", path);
    let mut w = std::io::BufWriter::with_capacity(1 << 16, tmp);
    fill(&mut w)?;
    let tmp = w.into_inner().map_err(|e| e.into_error())?;
    step("wrote the temporary file", path);
    tmp.as_file().sync_all()?;
    step("synced the temporary file", path);
    tmp.persist(path).map_err(|e| e.error)?;
    step("renamed it into place", path);
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
#[allow(clippy::disallowed_methods)]
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

    /// A device is written in place, never replaced by a file renamed over it: here through
    /// a link to /dev/null in a temporary folder (a regression replaces the link, not the
    /// device), which must stay a link to a character device.
    #[cfg(unix)]
    #[test]
    fn a_device_is_written_in_place() {
        use std::os::unix::fs::FileTypeExt;
        let null = std::path::Path::new("/dev/null");
        if !std::fs::metadata(null).is_ok_and(|m| m.file_type().is_char_device()) {
            return; // no device to write to here
        }
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("out.toml");
        std::os::unix::fs::symlink(null, &link).unwrap();
        super::write(&link, b"calibration").unwrap();
        assert!(
            std::fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert!(
            std::fs::metadata(&link)
                .unwrap()
                .file_type()
                .is_char_device()
        );
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temporary file left"
        );
    }

    /// Files get 0666 less the process's umask, as `open(2)` gives any new file.
    #[cfg(unix)]
    #[test]
    fn files_honour_the_umask() {
        use std::os::unix::fs::PermissionsExt;
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let umask = status
            .lines()
            .find_map(|l| l.strip_prefix("Umask:"))
            .map(|u| u32::from_str_radix(u.trim(), 8).unwrap())
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("result.json");
        super::write(&p, b"{}").unwrap();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o666 & !umask, "mode {mode:o}, umask {umask:o}");
    }
}
