//! The memo of a deterministic plugin's estimates: bounded caches (quick_cache, S3-FIFO)
//! shared by every search that uses the same plugin and parameters.

use archplace_plugin_sdk::{AcceleratorConfig, CoreConfig, EstimateError, Op, OpCost};
use std::sync::atomic::{AtomicU64, Ordering};

/// Most memoised estimates kept per plugin and parameters, per kind (area, latency); past
/// it the cache evicts the least useful entries (S3-FIFO, quick_cache).
pub const MEMO_CAPACITY: usize = 1 << 20;

/// The most memory one [`Memo`] holds: its capacity of each kind, with the cache's own
/// bookkeeping (about as much again as an entry, counted generously).
pub fn memory_bytes() -> u64 {
    let latency = std::mem::size_of::<((CoreConfig, Op), OpCost)>() as u64;
    let area = std::mem::size_of::<(AcceleratorConfig, Result<f64, EstimateError>)>() as u64;
    MEMO_CAPACITY as u64 * 2 * (latency + area)
}

/// Memoised estimates of a deterministic plugin with fixed parameters: bounded caches
/// shared by every search that uses the same plugin and parameters.
pub struct Memo {
    pub(crate) latency: quick_cache::sync::Cache<(CoreConfig, Op), OpCost>,
    pub(crate) area: quick_cache::sync::Cache<AcceleratorConfig, Result<f64, EstimateError>>,
}

impl Default for Memo {
    fn default() -> Self {
        Memo {
            latency: quick_cache::sync::Cache::new(MEMO_CAPACITY),
            area: quick_cache::sync::Cache::new(MEMO_CAPACITY),
        }
    }
}

/// Answers from `memo` where it has them; asks `fetch` for the rest (given their
/// indices into `keys`) in one batch and remembers its answers.
pub(crate) fn memoised<K: Eq + std::hash::Hash + Clone, V: Clone>(
    hits: &AtomicU64,
    memo: &quick_cache::sync::Cache<K, V>,
    keys: Vec<K>,
    fetch: impl FnOnce(&[usize]) -> Result<Vec<V>, EstimateError>,
) -> Result<Vec<V>, EstimateError> {
    let mut out: Vec<Option<V>> = vec![None; keys.len()];
    let mut missing = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        match memo.get(k) {
            Some(v) => out[i] = Some(v),
            None => missing.push(i),
        }
    }
    hits.fetch_add((keys.len() - missing.len()) as u64, Ordering::Relaxed);
    if !missing.is_empty() {
        let got = fetch(&missing)?;
        for (&i, v) in missing.iter().zip(&got) {
            memo.insert(keys[i].clone(), v.clone());
        }
        for (i, v) in missing.into_iter().zip(got) {
            out[i] = Some(v);
        }
    }
    out.into_iter()
        .map(|v| v.ok_or_else(|| EstimateError::Internal("memo hole".into())))
        .collect()
}
