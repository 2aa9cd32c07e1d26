//! Reading a file that someone else named: only a regular file, and never more than a cap.
//!
//! Plugin manifests, components and specs are named by people the daemon does not trust
//! with its liveness. A FIFO would block the reader until a writer came (and a worker
//! blocked in `read` cannot be stopped); a device such as `/dev/zero` never ends, and its
//! reported length (0) says nothing. So the kind of file is checked before it is opened,
//! checked again on the open handle, and the read stops one byte past the cap whatever
//! the file claims.

use std::io::Read;
use std::path::Path;

/// Why a file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("is not a regular file (a {0}); only regular files are read")]
    NotRegular(&'static str),
    #[error("is larger than {cap} bytes, the most that is read")]
    TooLarge { cap: u64 },
}

fn kind(meta: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_dir() {
        "folder"
    } else if t.is_fifo() {
        "FIFO"
    } else if t.is_char_device() || t.is_block_device() {
        "device"
    } else if t.is_socket() {
        "socket"
    } else {
        "special file"
    }
}

/// The bytes of the regular file at `path` (symbolic links followed), at most `cap` of
/// them: a larger file is an error, not a truncated read.
pub fn read_regular(path: &Path, cap: u64) -> Result<Vec<u8>, ReadError> {
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(ReadError::NotRegular(kind(&meta)));
    }
    if meta.len() > cap {
        return Err(ReadError::TooLarge { cap });
    }
    let file = std::fs::File::open(path)?;
    // The path may have been replaced between the two calls: check what was opened.
    let opened = file.metadata()?;
    if !opened.is_file() {
        return Err(ReadError::NotRegular(kind(&opened)));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(opened.len().min(cap)).unwrap_or(0));
    file.take(cap.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > cap {
        return Err(ReadError::TooLarge { cap });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_within_the_cap_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("a.toml");
        std::fs::write(&f, b"0123456789").unwrap();
        assert_eq!(read_regular(&f, 10).unwrap(), b"0123456789");
        assert!(matches!(
            read_regular(&f, 9),
            Err(ReadError::TooLarge { cap: 9 })
        ));
        assert!(matches!(
            read_regular(dir.path(), 10),
            Err(ReadError::NotRegular("folder"))
        ));
        // The zero device claims length 0 and never ends; it is refused without a read.
        assert!(matches!(
            read_regular(Path::new("/dev/zero"), 10),
            Err(ReadError::NotRegular("device"))
        ));
        // A FIFO with no writer would block `open` forever; it is refused before it.
        let fifo = dir.path().join("fifo.toml");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.is_ok_and(|s| s.success()) {
            assert!(matches!(
                read_regular(&fifo, 10),
                Err(ReadError::NotRegular("FIFO"))
            ));
        }
        // A symbolic link to a regular file is read (ConfigMap mounts are links).
        let link = dir.path().join("link.toml");
        std::os::unix::fs::symlink(&f, &link).unwrap();
        assert_eq!(read_regular(&link, 10).unwrap(), b"0123456789");
    }
}
