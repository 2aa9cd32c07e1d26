//! On-disk cache of compiled components.
//!
//! Compiling a component with Cranelift takes tens of milliseconds; loading a compiled one
//! takes about one. But a compiled component is machine code that wasmtime maps and runs
//! without checking it (`Component::deserialize` is `unsafe`), so a cache file must only
//! be loaded if this program wrote it:
//!
//! * the cache folder and its key file must belong to the user we run as and be writable
//!   by nobody else (else the cache is not used and a warning says why);
//! * every entry carries a keyed blake3 MAC of its bytes under a 256-bit random key kept
//!   in the folder (`key`, mode 0600): a file written by anyone without the key, a
//!   truncated file or a file for another engine configuration fails the check and is
//!   compiled afresh and overwritten.
//!
//! Entries are named by the blake3 hash of the `.wasm` and a hash of the engine's
//! compilation settings and wasmtime version, and written atomically.

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"APCWASM1";
const MAC_LEN: usize = 32;

/// Why the compiled-plugin cache cannot be used (the host then compiles every time).
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// The folder cannot be made private to the user, read or written.
    #[error("cannot use the compiled-plugin cache {}: {reason}", dir.display())]
    Unusable {
        /// The cache folder.
        dir: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

/// The largest cache entry read: a compiled component is a few times its `.wasm`, which is
/// at most [`crate::MAX_COMPONENT_BYTES`].
const MAX_ENTRY_BYTES: u64 = 4 * crate::MAX_COMPONENT_BYTES;

/// A verified cache folder.
#[derive(Debug)]
pub struct DiskCache {
    dir: PathBuf,
    key: [u8; 32],
    engine_tag: String,
}

impl DiskCache {
    /// Opens (creating if needed) the cache at `dir` for `engine`.
    pub fn open(dir: &Path, engine: &wasmtime::Engine) -> Result<DiskCache, CacheError> {
        let unusable = |reason: String| CacheError::Unusable {
            dir: dir.to_path_buf(),
            reason,
        };
        std::fs::create_dir_all(dir).map_err(|e| unusable(format!("cannot create it: {e}")))?;
        let meta = std::fs::metadata(dir).map_err(|e| unusable(e.to_string()))?;
        let key_path = dir.join("key");
        let key = match std::fs::File::open(&key_path) {
            Ok(mut f) => {
                let kmeta = f.metadata().map_err(|e| unusable(e.to_string()))?;
                check_private(&kmeta, meta.uid(), "its key file").map_err(unusable)?;
                let mut key = [0u8; 32];
                f.read_exact(&mut key)
                    .map_err(|e| unusable(format!("cannot read its key file: {e}")))?;
                key
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut key = [0u8; 32];
                getrandom::fill(&mut key)
                    .map_err(|e| unusable(format!("no random source for its key: {e}")))?;
                write_private(&key_path, &key)
                    .map_err(|e| unusable(format!("cannot write its key file: {e}")))?;
                key
            }
            Err(e) => return Err(unusable(format!("cannot read its key file: {e}"))),
        };
        // The key file was created by (or checked to belong to) us: the folder must be
        // ours too and closed to others, or someone else could swap both.
        let me = std::fs::metadata(&key_path)
            .map_err(|e| unusable(e.to_string()))?
            .uid();
        check_private(&meta, me, "the folder").map_err(unusable)?;
        Ok(DiskCache {
            dir: dir.to_path_buf(),
            key,
            engine_tag: engine_tag(engine),
        })
    }

    /// The cache folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, wasm_hash: &blake3::Hash) -> PathBuf {
        self.dir
            .join(format!("{}-{}.cwasm", wasm_hash.to_hex(), self.engine_tag))
    }

    fn mac(&self, payload: &[u8]) -> [u8; MAC_LEN] {
        let mut h = blake3::Hasher::new_keyed(&self.key);
        h.update(self.engine_tag.as_bytes());
        h.update(payload);
        *h.finalize().as_bytes()
    }

    /// The compiled bytes for `wasm_hash`, if present and written by us; `None` otherwise
    /// (a bad entry is logged and will be overwritten).
    pub fn load(&self, wasm_hash: &blake3::Hash) -> Option<Vec<u8>> {
        let path = self.path(wasm_hash);
        let bytes = archplace_util::files::read_regular(&path, MAX_ENTRY_BYTES).ok()?;
        let header = MAGIC.len() + MAC_LEN;
        let ok = bytes.len() > header
            && &bytes[..MAGIC.len()] == MAGIC
            && bytes[MAGIC.len()..header] == self.mac(&bytes[header..]);
        if !ok {
            tracing::warn!(path = %path.display(), "ignoring a compiled-plugin cache entry this program did not write (or that is damaged)");
            return None;
        }
        let mut bytes = bytes;
        bytes.drain(..header);
        Some(bytes)
    }

    /// Stores compiled bytes for `wasm_hash`. Failures (e.g. a full disk) only cost the
    /// next load a compilation, so they are logged, not returned.
    pub fn store(&self, wasm_hash: &blake3::Hash, compiled: &[u8]) {
        let mut out = Vec::with_capacity(MAGIC.len() + MAC_LEN + compiled.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.mac(compiled));
        out.extend_from_slice(compiled);
        let path = self.path(wasm_hash);
        if let Err(e) = write_private(&path, &out) {
            tracing::warn!(path = %path.display(), error = %e, "cannot write a compiled-plugin cache entry");
        }
    }
}

/// A stable name for the engine's compilation settings and wasmtime version: the first 16
/// hex digits of blake3 over wasmtime's compatibility hash. (std's `DefaultHasher` may
/// change between Rust releases, which would orphan every entry after an upgrade.)
fn engine_tag(engine: &wasmtime::Engine) -> String {
    use std::hash::Hash;
    struct Blake3Hasher(blake3::Hasher);
    impl std::hash::Hasher for Blake3Hasher {
        fn write(&mut self, bytes: &[u8]) {
            self.0.update(bytes);
        }
        fn finish(&self) -> u64 {
            let mut first = [0u8; 8];
            first.copy_from_slice(&self.0.finalize().as_bytes()[..8]);
            u64::from_le_bytes(first)
        }
    }
    let mut h = Blake3Hasher(blake3::Hasher::new_derive_key(
        "archplace compiled-plugin cache v1",
    ));
    engine.precompile_compatibility_hash().hash(&mut h);
    h.0.finalize().to_hex()[..16].to_string()
}

/// Writes `bytes` to `path` whole or not at all, readable by the owner only from the first
/// byte on: a temporary file (created 0600) in the same folder, synced, renamed into place.
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::Builder::new()
        .prefix(".archplace-")
        .suffix(".tmp")
        .permissions(std::fs::Permissions::from_mode(0o600))
        .tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

fn check_private(meta: &std::fs::Metadata, owner: u32, what: &str) -> Result<(), String> {
    if meta.uid() != owner {
        return Err(format!(
            "{what} belongs to user {}, not to us ({owner})",
            meta.uid()
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(format!(
            "{what} is writable by others (mode {:o}); chmod go-w it",
            meta.mode() & 0o777
        ));
    }
    Ok(())
}

/// The compiled-plugin folder inside a cache folder `base`.
pub fn dir_in(base: &Path) -> PathBuf {
    base.join("compiled-plugins")
}

/// The default cache folder: `$ARCHPLACE_CACHE_DIR`, else `$XDG_CACHE_HOME/archplace`,
/// else `~/.cache/archplace`, each followed by `compiled-plugins`.
pub fn default_dir() -> Option<PathBuf> {
    let base = std::env::var_os("ARCHPLACE_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("archplace")))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/archplace")))?;
    Some(dir_in(&base))
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)]
mod tests {
    use super::*;

    fn engine() -> wasmtime::Engine {
        wasmtime::Engine::default()
    }

    #[test]
    fn round_trips_and_rejects_foreign_or_damaged_entries() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let cache = DiskCache::open(dir.path(), &engine()).unwrap();
        let h = blake3::hash(b"wasm");
        assert!(cache.load(&h).is_none());
        cache.store(&h, b"compiled bytes");
        assert_eq!(cache.load(&h).as_deref(), Some(&b"compiled bytes"[..]));

        // Same key, another process: still valid.
        let again = DiskCache::open(dir.path(), &engine()).unwrap();
        assert_eq!(again.load(&h).as_deref(), Some(&b"compiled bytes"[..]));

        // A file written without the key is not loaded.
        let path = cache.path(&h);
        let mut forged = std::fs::read(&path).unwrap();
        let n = forged.len();
        forged[n - 1] ^= 1;
        std::fs::write(&path, &forged).unwrap();
        assert!(cache.load(&h).is_none());
        std::fs::write(&path, b"APCWASM1").unwrap();
        assert!(cache.load(&h).is_none());
    }

    #[test]
    fn refuses_a_folder_others_can_write() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = DiskCache::open(dir.path(), &engine()).unwrap_err();
        assert!(err.to_string().contains("writable by others"), "{err}");
    }
}
