//! The pool's memo of layer schedules: what one worker solves, the others reuse. On one
//! machine a search reuses a schedule whenever another candidate's layer comes out the
//! same (two thirds of the schedules of a small search, a sixth of GPT-3's); spread over
//! workers, each would see only its own share of the candidates and solve the rest again.
//! Workers therefore put every schedule they solve in a key-value bucket and ask it for the
//! ones their own memo lacks, one batch per candidate layer group.
//!
//! A key is the blake3 of the solver options and the instance's exact content, so searches
//! with different options never share; the value is the solution's bits. The solver is
//! deterministic (node limits) and schedules stopped by the wall-clock safety net are never
//! put (the engine's rule), so a schedule from the bucket is the one solving would give and
//! the results do not change. An unreachable bucket only means solving again.

use super::{Pool, nats_err};
use archplace_engine::options::ScheduleOptions;
use archplace_engine::search::{SharedSchedules, Solved};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub struct PoolSchedules {
    pool: Arc<Pool>,
    /// The solver options' part of every key.
    options: [u8; 32],
    pub hits: AtomicU64,
    pub misses: AtomicU64,
}

/// Bytes of a stored solution: makespan, the two utilisations, the gap, the exposed
/// communication, proven optimal. (A value of another length — an older daemon's — reads
/// as unknown, and the schedule is solved again.)
const VALUE_BYTES: usize = 41;

impl PoolSchedules {
    pub fn new(pool: Arc<Pool>, options: &ScheduleOptions) -> PoolSchedules {
        let text = serde_json::to_string(options).unwrap_or_default();
        PoolSchedules {
            pool,
            options: *blake3::hash(text.as_bytes()).as_bytes(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    fn key(&self, words: &[u64]) -> String {
        let mut h = blake3::Hasher::new();
        h.update(&self.options);
        for w in words {
            h.update(&w.to_le_bytes());
        }
        h.finalize().to_hex()[..40].to_string()
    }
}

fn encode(s: &Solved) -> Vec<u8> {
    let mut v = Vec::with_capacity(VALUE_BYTES);
    for x in [s.makespan, s.util.0, s.util.1, s.gap, s.exposed_link] {
        v.extend_from_slice(&x.to_bits().to_le_bytes());
    }
    v.push(u8::from(s.optimal));
    v
}

fn decode(b: &[u8]) -> Option<Solved> {
    if b.len() != VALUE_BYTES {
        return None;
    }
    let f = |i: usize| -> Option<f64> {
        Some(f64::from_bits(u64::from_le_bytes(
            b.get(8 * i..8 * i + 8)?.try_into().ok()?,
        )))
    };
    Some(Solved {
        makespan: f(0)?,
        util: (f(1)?, f(2)?),
        gap: f(3)?,
        exposed_link: f(4)?,
        optimal: b[40] == 1,
    })
}

impl SharedSchedules for PoolSchedules {
    fn get(&self, keys: &[&[u64]]) -> Vec<Option<Solved>> {
        let names: Vec<String> = keys.iter().map(|k| self.key(k)).collect();
        let bucket = &self.pool.schedules;
        let found = self.pool.block_on(async {
            tokio::time::timeout(
                Duration::from_secs(2),
                futures_util::future::join_all(names.iter().map(|n| bucket.get(n.as_str()))),
            )
            .await
        });
        let out: Vec<Option<Solved>> = match found {
            Ok(values) => values
                .into_iter()
                .map(|v| v.ok().flatten().and_then(|b| decode(&b)))
                .collect(),
            Err(_) => vec![None; keys.len()],
        };
        let hits = out.iter().filter(|s| s.is_some()).count() as u64;
        self.hits.fetch_add(hits, Ordering::Relaxed);
        self.misses
            .fetch_add(keys.len() as u64 - hits, Ordering::Relaxed);
        self.pool.metrics.schedules_shared.inc_by(hits);
        out
    }

    fn put(&self, solved: &[(&[u64], Solved)]) {
        let bucket = self.pool.schedules.clone();
        let entries: Vec<(String, Vec<u8>)> = solved
            .iter()
            .map(|(k, s)| (self.key(k), encode(s)))
            .collect();
        // Not waited for: the next candidate need not wait for the store.
        self.pool.spawn(async move {
            for (k, v) in entries {
                if let Err(e) = bucket.put(k, v.into()).await {
                    tracing::debug!(error = %nats_err(e), "cannot share a layer schedule");
                    return;
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_solution_round_trips_bit_for_bit() {
        let s = Solved {
            makespan: 1.234_567_890_123e-3,
            util: (0.1 + 0.2, f64::MIN_POSITIVE),
            optimal: true,
            gap: 0.0,
            exposed_link: 2.5e-4,
        };
        assert_eq!(decode(&encode(&s)), Some(s));
        let t = Solved {
            optimal: false,
            ..s
        };
        assert_eq!(decode(&encode(&t)), Some(t));
        assert_eq!(decode(&[0; 5]), None);
    }
}
