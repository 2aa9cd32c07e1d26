//! Specs and cost-model components in the pool's object store, by content hash: the
//! coordinator puts what its search needs; a worker that lacks a component fetches it and
//! checks its blake3 hash before the plugin host sees a byte of it.

use super::{Pool, PoolError, nats_err};
use archplace_plugin_host::MAX_COMPONENT_BYTES;
use std::path::{Path, PathBuf};
use tokio::io::AsyncReadExt;

/// The most bytes a spec object may have (specs are read with the same cap).
pub const MAX_SPEC_BYTES: u64 = 1 << 20;

impl Pool {
    /// Stores `bytes` under `name` unless an object of that name exists (names are content
    /// hashes, so an existing one holds the same bytes).
    pub(crate) async fn put_object(&self, name: &str, bytes: &[u8]) -> Result<(), PoolError> {
        if let Ok(info) = self.objects.info(name).await
            && !info.deleted
        {
            return Ok(());
        }
        let mut reader = bytes;
        self.objects
            .put(name, &mut reader)
            .await
            .map_err(nats_err)?;
        Ok(())
    }

    /// The object `name`, at most `cap` bytes, whose blake3 hash must be `blake3` (hex).
    pub(crate) async fn get_object(
        &self,
        name: &str,
        cap: u64,
        blake3: &str,
    ) -> Result<Vec<u8>, PoolError> {
        let mut object = self
            .objects
            .get(name)
            .await
            .map_err(|e| PoolError::Nats(format!("object {name}: {e}")))?;
        let size = object.info().size as u64;
        if size > cap {
            return Err(PoolError::ObjectTooLarge {
                name: name.to_string(),
                size_bytes: size,
                cap_bytes: cap,
            });
        }
        let mut bytes = Vec::with_capacity(size as usize);
        (&mut object)
            .take(cap + 1)
            .read_to_end(&mut bytes)
            .await
            .map_err(|e| PoolError::Nats(format!("object {name}: {e}")))?;
        let actual = blake3::hash(&bytes).to_hex().to_string();
        if !actual.eq_ignore_ascii_case(blake3) || bytes.len() as u64 > cap {
            return Err(PoolError::ObjectHash {
                name: name.to_string(),
                actual,
                expected: blake3.to_string(),
            });
        }
        Ok(bytes)
    }
}

/// The component of a plugin at `path` if its blake3 is `blake3` (the file the coordinator's
/// plugin host loaded).
pub fn read_component(path: &Path, blake3: &str) -> Result<Vec<u8>, PoolError> {
    let bytes =
        archplace_util::files::read_regular(path, MAX_COMPONENT_BYTES).map_err(|source| {
            PoolError::ComponentRead {
                path: path.to_path_buf(),
                source,
            }
        })?;
    let actual = blake3::hash(&bytes).to_hex().to_string();
    if !actual.eq_ignore_ascii_case(blake3) {
        return Err(PoolError::ComponentChanged {
            path: path.to_path_buf(),
            actual,
            expected: blake3.to_string(),
        });
    }
    Ok(bytes)
}

/// Where a worker keeps components it fetched: `<state_dir>/pool-components/<blake3>.wasm`.
pub fn cached_component(state_dir: &Path, blake3: &str) -> PathBuf {
    state_dir
        .join("pool-components")
        .join(format!("{blake3}.wasm"))
}
