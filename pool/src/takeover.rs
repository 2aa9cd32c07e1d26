//! Carrying on a search whose coordinator is away, so that the pool does not idle without
//! it. Every daemon of the pool watches the running searches; one whose lease
//! ([`super::lease`]) has lapsed — its coordinator killed or cut off — and stayed free a
//! little longer is taken on by the first daemon to take its lease: it fetches the spec
//! the coordinator stored, checks that its own cost models are the search's, and walks
//! the search as the coordinator would ([`archplace_job::Prepared::walk_only`] through a
//! carrying [`Pooled`]): the same order, the same convergence or pruning, so the same items
//! published, each once. The work ledger is the pool's, not a coordinator's memory: the
//! items published (the searches bucket) and the answers stored (the results stream),
//! from which the walk's incumbent follows deterministically.
//!
//! Walked to its end, the search is recorded as such and its answers are left in the pool:
//! the coordinator — restarted, or any daemon serving the spec's folder — collects them
//! without evaluating anything, and writes the result. A coordinator that comes back while
//! the search is carried follows the answers and takes the lease back when the carrier
//! frees it. A carrier killed in turn lets its lease lapse too: another carries on.

use super::distributor::Pooled;
use super::lease;
use super::objects::MAX_SPEC_BYTES;
use super::protocol::*;
use super::worker::WorkerContext;
use super::{Pool, PoolError};
use archplace_job::run::Steering;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a search's lease must stay free, once seen lapsed, before this daemon carries
/// the search on: a coordinator reconnecting after the server restarted renews within it.
const GRACE: Duration = Duration::from_secs(2 * LEASE_RENEW_SECONDS);

/// Running searches, by id, as the searches bucket has them.
type Running = Arc<Mutex<BTreeMap<String, SearchState>>>;

/// Watches the pool for searches without a coordinator and carries them on, one at a time,
/// until shutdown.
pub fn run(pool: &Arc<Pool>, cx: &WorkerContext) {
    let running: Running = Arc::default();
    let watcher = pool.spawn(watch_running(pool.searches.clone(), running.clone()));
    // When each search was first seen without a lease.
    let mut free_since: BTreeMap<String, Instant> = BTreeMap::new();
    // Searches this daemon cannot carry on (said once).
    let mut refused: BTreeSet<String> = BTreeSet::new();
    while !cx.shutdown.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(500));
        let orphans: Vec<(String, SearchState)> = match running.lock() {
            Ok(r) => r
                .iter()
                .filter(|(id, s)| !s.walked && s.coordinator != pool.name && !refused.contains(*id))
                .map(|(id, s)| (id.clone(), s.clone()))
                .collect(),
            Err(_) => break,
        };
        free_since.retain(|id, _| orphans.iter().any(|(o, _)| o == id));
        for (id, state) in orphans {
            let holder = pool.block_on(async {
                tokio::time::timeout(Duration::from_secs(2), lease::holder(pool, &id)).await
            });
            match holder {
                Ok(Ok(None)) => {}
                Ok(Ok(Some(_))) => {
                    free_since.remove(&id);
                    continue;
                }
                // The server is away: nothing to be known.
                _ => continue,
            }
            let since = *free_since.entry(id.clone()).or_insert_with(Instant::now);
            if since.elapsed() < GRACE {
                continue;
            }
            free_since.remove(&id);
            if let Err(e) = carry(pool, cx, &id, &state) {
                if pool.ended(&id).is_some() {
                    tracing::info!(search = %id, "the search ended in the pool while carried (its coordinator came back and finished it)");
                    continue;
                }
                if matches!(e, PoolError::CarriedElsewhere(_)) {
                    tracing::info!(search = %id, "another daemon took the search on first");
                    continue;
                }
                tracing::warn!(search = %id, spec = %state.spec, error = %e, "cannot carry the search on for its coordinator");
                if matches!(e, PoolError::NotCarried { .. } | PoolError::SpecInvalid(_)) {
                    refused.insert(id);
                }
            }
        }
    }
    watcher.abort();
}

/// Keeps `running` up to date with the searches bucket.
async fn watch_running(bucket: async_nats::jetstream::kv::Store, running: Running) {
    super::follow_searches(bucket, true, |search, change| {
        let Ok(mut r) = running.lock() else {
            return false;
        };
        match change {
            super::Change::State(s) if s.phase == Phase::Running => {
                r.insert(search, *s);
            }
            _ => {
                r.remove(&search);
            }
        }
        true
    })
    .await
}

/// Carries search `id` on: its spec from the pool, this daemon's cost models (which must
/// be the search's), the walk to its end through the pool.
fn carry(pool: &Pool, cx: &WorkerContext, id: &str, state: &SearchState) -> Result<(), PoolError> {
    let not_carried = |why: String| PoolError::NotCarried {
        search: id.to_string(),
        why,
    };
    let cancel = Arc::new(AtomicBool::new(false));
    let stop = || cx.shutdown.load(Ordering::Relaxed);
    let name = spec_object(&state.spec_hash);
    let bytes = pool
        .retry("fetching the spec to carry on", &stop, || {
            pool.get_object(&name, MAX_SPEC_BYTES, &state.spec_hash)
        })
        .ok_or(PoolError::Stopping)?;
    let text = String::from_utf8(bytes).map_err(|_| PoolError::SpecNotUtf8)?;
    let mut spec = archplace_spec::parse(&text, &state.spec_file).map_err(|d| {
        PoolError::SpecInvalid(d.first().map(|d| d.message.clone()).unwrap_or_default())
    })?;
    // The stored text has a calibration's values written in: not to be applied again.
    spec.stack_calibration = None;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let prepared = archplace_job::prepare(&spec, cx.host, threads, None, &cancel, None)
        .map_err(|e| not_carried(e.to_string()))?;
    let models = &prepared.models;
    let mine = (
        models.area_source.blake3.clone(),
        models.latency_source.blake3.clone(),
    );
    if mine.0.is_none() || mine.1.is_none() {
        return Err(not_carried(
            "this daemon's cost models are linked natively".into(),
        ));
    }
    if (&mine.0, &mine.1) != (&state.area_blake3, &state.latency_blake3) {
        return Err(not_carried(format!(
            "this daemon's cost models ({}, {}) are not the search's",
            mine.0.as_deref().unwrap_or("native"),
            mine.1.as_deref().unwrap_or("native")
        )));
    }
    tracing::info!(search = %id, spec = %state.spec, coordinator = %state.coordinator, "the search's coordinator is away (its lease lapsed): carrying the search on");
    let never = || false;
    let pooled = Pooled {
        carrying: Some(id.to_string()),
        ..Pooled::new(pool, &never)
    };
    // The daemon's shutdown stops the walk (the lease is freed for another).
    let done = AtomicBool::new(false);
    let walked = std::thread::scope(|scope| {
        scope.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                if cx.shutdown.load(Ordering::Relaxed) {
                    cancel.store(true, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        });
        let r = prepared.walk_only(Steering {
            observer: &(),
            cancel: &cancel,
            checkpoint: None,
            distributor: Some(&pooled),
        });
        done.store(true, Ordering::Relaxed);
        r
    });
    match walked {
        Ok(o) if !o.stats.cancelled => Ok(()),
        Ok(_) => Err(PoolError::Stopping),
        // The pool's own error (another took the lease first, the search is over) as is.
        Err(archplace_job::RunError::Pool(e)) => match e.downcast::<PoolError>() {
            Ok(e) => Err(*e),
            Err(e) => Err(not_carried(e.to_string())),
        },
        Err(e) => Err(not_carried(e.to_string())),
    }
}
