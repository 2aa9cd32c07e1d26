//! A pool worker: takes items from the shared consumer one at a time, evaluates them with
//! a memo of its own per search, stores the answer, then acknowledges the item.

use super::protocol::*;
use super::{Pool, PoolError, nats_err, objects};
use crate::metrics::PoolMetrics;
use archplace_cost_port::PluginRef;
use archplace_engine::search::{Evaluated, Evaluator, Stats};
use archplace_engine::space::Candidate;
use archplace_plugin_host::Host;
use async_nats::jetstream::{self, AckKind, consumer};
use futures_util::StreamExt;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

/// What the worker's evaluation thread answers for an item.
enum Reply {
    Evaluated(Vec<Evaluated>, Stats),
    Failed(String),
    /// The search was cancelled (or the daemon is stopping) while the item was evaluated.
    Stopped,
}

/// One search a worker serves: a thread holding the spec, the latency model's session and
/// the engine's evaluator (with its memos), fed items through a channel.
struct Session {
    tx: mpsc::Sender<(Vec<ItemCandidate>, mpsc::Sender<Reply>)>,
    cancel: Arc<AtomicBool>,
    used: Instant,
}

/// Sessions kept at once (a worker serves the searches of the pool in turn).
const MAX_SESSIONS: usize = 4;

/// What a worker needs from its daemon.
pub struct WorkerContext<'a> {
    pub host: &'a Host,
    pub state_dir: &'a Path,
    pub shutdown: &'a AtomicBool,
}

/// Works for the pool until shutdown.
pub fn run(pool: &Arc<Pool>, cx: &WorkerContext) {
    let threads = match pool.settings.worker_threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let stop = || super::set(cx.shutdown);
    let Some(mut consumer) = pool.retry("joining the workers' queue", &stop, || async {
        pool.items
            .get_consumer::<consumer::pull::Config>(WORKERS_CONSUMER)
            .await
            .map_err(nats_err)
    }) else {
        return;
    };
    // Progress is signalled at a third of the consumer's ack wait — the first daemon's
    // setting, which may be shorter than this one's (a pool made by a newer daemon) — or of
    // this daemon's, whichever is shorter: never so rarely that a working item is given
    // away.
    let consumer_ack_wait = pool
        .block_on(async { consumer.info().await.map(|i| i.config.ack_wait) })
        .map(|d| d.as_secs_f64())
        .unwrap_or(pool.settings.ack_wait_seconds);
    let progress_every =
        super::config::ack_progress_interval(consumer_ack_wait.min(pool.settings.ack_wait_seconds));
    let cancels: Arc<Mutex<HashMap<String, Arc<AtomicBool>>>> = Arc::default();
    let busy = Arc::new(AtomicBool::new(false));
    let completed = Arc::new(AtomicU64::new(0));
    let watcher = pool.spawn(watch_searches(pool.searches.clone(), cancels.clone()));
    let beat = pool.spawn(heartbeat(
        pool.workers.clone(),
        pool.items.clone(),
        pool.metrics.clone(),
        WorkerBeat {
            worker: pool.name.clone(),
            archplace_version: env!("CARGO_PKG_VERSION").to_string(),
            threads,
            busy: false,
            items_completed: 0,
        },
        busy.clone(),
        completed.clone(),
    ));
    let mut held = Held {
        threads,
        progress_every,
        sessions: BTreeMap::new(),
        cancels,
        completed,
    };
    tracing::info!(threads, "working for the pool");
    while !cx.shutdown.load(Ordering::Relaxed) {
        let next = pool.block_on(async {
            let mut batch = consumer
                .fetch()
                .max_messages(1)
                .expires(Duration::from_secs(1))
                .messages()
                .await
                .map_err(nats_err)?;
            match batch.next().await {
                Some(m) => m.map(Some).map_err(nats_err),
                None => Ok(None),
            }
        });
        let message = match next {
            Ok(Some(m)) => m,
            Ok(None) => continue,
            Err(e) => {
                tracing::debug!(error = %e, "no item (NATS away?)");
                std::thread::sleep(Duration::from_millis(500));
                continue;
            }
        };
        busy.store(true, Ordering::Relaxed);
        pool.metrics.worker_busy.set(1);
        handle(pool, cx, &mut held, message);
        busy.store(false, Ordering::Relaxed);
        pool.metrics.worker_busy.set(0);
    }
    for s in held.sessions.values() {
        s.cancel.store(true, Ordering::Relaxed);
    }
    watcher.abort();
    beat.abort();
    let _ = pool.block_on(pool.workers.delete(&pool.name));
}

/// What the worker holds from one item to the next.
struct Held {
    /// Threads of each search session's evaluations.
    threads: usize,
    /// How often the worker tells JetStream it still works on an item.
    progress_every: Duration,
    sessions: BTreeMap<String, Session>,
    /// The cancel flags of the sessions, by search (the searches' watcher sets them).
    cancels: Arc<Mutex<HashMap<String, Arc<AtomicBool>>>>,
    /// Items answered (the heartbeat reports it).
    completed: Arc<AtomicU64>,
}

/// The environment variable of a test hook: a worker holds every item it takes this many
/// seconds (at most an hour) before it evaluates it, so that a test can stop a worker that
/// certainly holds an item (what becomes of an item no worker finishes). Unset, nothing.
pub const HOLD_ITEM_VAR: &str = "ARCHPLACE_TEST_HOLD_ITEM_SECONDS";

/// [`HOLD_ITEM_VAR`]'s hold, if set.
fn hold_item() {
    static HOLD: std::sync::OnceLock<Option<f64>> = std::sync::OnceLock::new();
    if let Some(s) = *HOLD.get_or_init(|| std::env::var(HOLD_ITEM_VAR).ok()?.parse().ok()) {
        std::thread::sleep(archplace_util::duration::clamped(s, 0.0, 3600.0));
    }
}

fn handle(pool: &Arc<Pool>, cx: &WorkerContext, held: &mut Held, message: jetstream::Message) {
    let m = &pool.metrics;
    m.items_pulled.inc();
    hold_item();
    let delivered = message.info().map_or(1, |i| i.delivered);
    if delivered > 1 {
        m.items_redelivered.inc();
    }
    let item: Item = match serde_json::from_slice(&message.payload) {
        Ok(i) => i,
        Err(e) => {
            tracing::warn!(error = %e, subject = %message.subject, "an item that is not one; dropped");
            let _ = pool.block_on(message.ack_with(AckKind::Term));
            return;
        }
    };
    let span = tracing::info_span!("item", search = %&item.search[..item.search.len().min(12)], item = item.item);
    let _enter = span.enter();
    if delivered > 1 {
        // Its earlier taker did not answer within the ack wait: a worker lost (killed,
        // stalled, cut off) — said here, with the search's id, and not only counted.
        tracing::warn!(
            delivered,
            "an item delivered again: the worker that took it before did not answer in time (lost, stalled or cut off)"
        );
    }
    let stop = || super::set(cx.shutdown);
    // A search that ended (converged, cancelled, failed) or that the bucket does not know:
    // its item is dropped.
    let state = pool.retry("reading the search's state", &stop, || {
        pool.state(&item.search)
    });
    match state {
        None => {
            let _ = pool.block_on(message.ack_with(AckKind::Nak(None)));
            return;
        }
        Some(Some(s)) if s.phase == Phase::Running => {}
        Some(_) => {
            m.items_skipped.inc();
            let _ = pool.block_on(message.ack());
            return;
        }
    }
    let reply = if item.protocol != PROTOCOL_VERSION
        || item.archplace_version != env!("CARGO_PKG_VERSION")
    {
        Reply::Failed(format!(
            "worker {} runs archplace {} (pool protocol {PROTOCOL_VERSION}); the item is of archplace {} (protocol {}): a pool runs one version",
            pool.name,
            env!("CARGO_PKG_VERSION"),
            item.archplace_version,
            item.protocol
        ))
    } else {
        evaluate(pool, cx, held, &item, &message)
    };
    let answer = match reply {
        Reply::Evaluated(evaluated, work) => Answer::Evaluated { evaluated, work },
        Reply::Failed(reason) => {
            tracing::warn!(reason = %reason, "item failed");
            Answer::Failed { reason }
        }
        Reply::Stopped => {
            if cx.shutdown.load(Ordering::Relaxed) {
                // Another worker takes it now rather than after the ack wait.
                let _ = pool.block_on(message.ack_with(AckKind::Nak(None)));
            } else {
                m.items_skipped.inc();
                let _ = pool.block_on(message.ack());
            }
            return;
        }
    };
    let failed = matches!(answer, Answer::Failed { .. });
    let result = ItemResult {
        search: item.search.clone(),
        item: item.item,
        worker: pool.name.clone(),
        answer,
    };
    let payload = match serde_json::to_vec(&result) {
        Ok(p) => p,
        Err(e) => {
            tracing::error!(error = %e, "cannot encode an answer");
            return;
        }
    };
    let subject = results_subject(&item.search);
    let js = &pool.js;
    // The answer is stored before the item is acknowledged: a worker killed in between
    // leaves the item to be evaluated again, and the coordinator ignores the second answer.
    let stored = pool.retry("storing an answer", &stop, || {
        let payload = payload.clone();
        let subject = subject.clone();
        async move {
            js.publish(subject, payload.into())
                .await
                .map_err(nats_err)?
                .await
                .map_err(nats_err)
        }
    });
    if stored.is_none() {
        let _ = pool.block_on(message.ack_with(AckKind::Nak(None)));
        return;
    }
    let _ = pool.retry("acknowledging an item", &stop, || message.double_ack());
    if failed {
        m.items_failed.inc();
    } else {
        m.items_completed.inc();
        held.completed.fetch_add(1, Ordering::Relaxed);
    }
}

/// Evaluates `item` on its search's session (made if needed), telling JetStream the item
/// is in progress while it runs.
fn evaluate(
    pool: &Arc<Pool>,
    cx: &WorkerContext,
    held: &mut Held,
    item: &Item,
    message: &jetstream::Message,
) -> Reply {
    let Held {
        threads,
        progress_every,
        sessions,
        cancels,
        ..
    } = held;
    let threads = *threads;
    let message = Arc::new(message.clone());
    let progress = {
        let message = message.clone();
        let every = *progress_every;
        pool.spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let _ = message.ack_with(AckKind::Progress).await;
            }
        })
    };
    let reply = (|| {
        if !sessions.contains_key(&item.search) {
            // Sessions of ended searches, and the least recently used beyond the limit, go.
            sessions.retain(|_, s| !s.cancel.load(Ordering::Relaxed));
            if sessions.len() >= MAX_SESSIONS
                && let Some(oldest) = sessions
                    .iter()
                    .min_by_key(|(_, s)| s.used)
                    .map(|(k, _)| k.clone())
            {
                sessions.remove(&oldest);
            }
            match open(pool, cx, threads, item) {
                Ok(s) => {
                    if let Ok(mut c) = cancels.lock() {
                        c.insert(item.search.clone(), s.cancel.clone());
                    }
                    sessions.insert(item.search.clone(), s);
                }
                Err(e) => return Reply::Failed(e.to_string()),
            }
        }
        let Some(session) = sessions.get_mut(&item.search) else {
            return Reply::Failed("no session".into());
        };
        session.used = Instant::now();
        let (tx, rx) = mpsc::channel();
        if session.tx.send((item.candidates.clone(), tx)).is_err() {
            sessions.remove(&item.search);
            return Reply::Failed("the evaluation thread ended".into());
        }
        rx.recv()
            .unwrap_or_else(|_| Reply::Failed("the evaluation thread ended".into()))
    })();
    progress.abort();
    if let Reply::Stopped = reply {
        sessions.remove(&item.search);
    }
    reply
}

/// The session of `item`'s search: its spec and latency component from the object store
/// (the component from the local cache or catalog when there), checked by hash.
fn open(
    pool: &Arc<Pool>,
    cx: &WorkerContext,
    threads: usize,
    item: &Item,
) -> Result<Session, PoolError> {
    let stop = || super::set(cx.shutdown);
    let name = spec_object(&item.spec_hash);
    let text = pool
        .retry("fetching the spec", &stop, || {
            pool.get_object(&name, objects::MAX_SPEC_BYTES, &item.spec_hash)
        })
        .ok_or(PoolError::Stopping)?;
    let text = String::from_utf8(text).map_err(|_| PoolError::SpecNotUtf8)?;
    let spec = archplace_spec::parse(&text, &item.spec_file).map_err(|d| {
        PoolError::SpecInvalid(d.first().map(|d| d.message.clone()).unwrap_or_default())
    })?;
    let loaded = component(pool, cx, &item.latency)?;
    let cancel = Arc::new(AtomicBool::new(false));
    let latency = cx
        .host
        .open(
            &loaded,
            spec.cost_model.parameters_of(&item.latency.plugin),
            cancel.clone(),
        )
        .map_err(|source| PoolError::LatencyModel {
            plugin: item.latency.plugin.clone(),
            source,
        })?;
    let (tx, rx) = mpsc::channel::<(Vec<ItemCandidate>, mpsc::Sender<Reply>)>();
    let flag = cancel.clone();
    let work = pool.work.clone();
    let worker = pool.name.clone();
    let shared_pool = pool.clone();
    let threads_pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("archplace-pool-{i}"))
        .build()
        .map_err(|e| PoolError::Threads {
            what: "worker threads",
            source: std::io::Error::other(e),
        })?;
    std::thread::Builder::new()
        .name("archplace-pool-session".into())
        .spawn(move || {
            let input = spec.search_input();
            let observer = work;
            let shared = super::schedules::PoolSchedules::new(shared_pool, &input.schedule);
            threads_pool.install(|| {
                let evaluator =
                    Evaluator::with_shared(&input, latency.as_ref(), observer.as_ref(), &shared);
                let mut before = evaluator.work();
                for (candidates, reply) in rx {
                    let mut out = Vec::with_capacity(candidates.len());
                    let mut answer = None;
                    for c in candidates {
                        let cand = Candidate {
                            config: c.config,
                            area_um2: c.area_um2,
                            bucket: c.bucket,
                        };
                        match evaluator.evaluate(c.index, &cand) {
                            Ok(mut e) => {
                                e.summarise();
                                out.push(e);
                            }
                            Err(_) if flag.load(Ordering::Relaxed) => {
                                answer = Some(Reply::Stopped);
                                break;
                            }
                            Err(e) => {
                                answer = Some(Reply::Failed(format!("candidate {}: {e}", c.index)));
                                break;
                            }
                        }
                        if flag.load(Ordering::Relaxed) {
                            answer = Some(Reply::Stopped);
                            break;
                        }
                    }
                    let now = evaluator.work();
                    let answer =
                        answer.unwrap_or_else(|| Reply::Evaluated(out, now.work_since(&before)));
                    before = now;
                    let _ = reply.send(answer);
                }
            });
            tracing::debug!(worker = %worker, "session ended");
        })
        .map_err(|source| PoolError::Threads {
            what: "a session thread",
            source,
        })?;
    Ok(Session {
        tx,
        cancel,
        used: Instant::now(),
    })
}

/// The latency component `r`: the plugin of that name and version in this daemon's catalog
/// if its hash is `r.blake3`; else the copy fetched earlier; else fetched from the object
/// store now, its hash checked, and kept for next time.
fn component(
    pool: &Arc<Pool>,
    cx: &WorkerContext,
    r: &ComponentRef,
) -> Result<Arc<archplace_plugin_host::Loaded>, PoolError> {
    let pinned = PluginRef {
        name: r.plugin.clone(),
        version: Some(format!("={}", r.version)),
        blake3: Some(r.blake3.clone()),
    };
    if let Ok(l) = cx.host.load(&pinned) {
        return Ok(l);
    }
    let cached: PathBuf = objects::cached_component(cx.state_dir, &r.blake3);
    if let Ok(bytes) = objects::read_component(&cached, &r.blake3) {
        return Ok(cx.host.load_bytes(&cached, &bytes)?);
    }
    let stop = || super::set(cx.shutdown);
    let name = component_object(&r.blake3);
    let bytes = pool
        .retry("fetching the cost model", &stop, || {
            pool.get_object(&name, archplace_plugin_host::MAX_COMPONENT_BYTES, &r.blake3)
        })
        .ok_or(PoolError::Stopping)?;
    tracing::info!(plugin = %r.plugin, version = %r.version, blake3 = %r.blake3, "fetched a cost model from the pool");
    if let Some(dir) = cached.parent()
        && let Err(e) = std::fs::create_dir_all(dir)
            .and_then(|()| archplace_util::atomic::write(&cached, &bytes))
    {
        tracing::warn!(error = %e, "cannot keep the fetched cost model");
    }
    let loaded = cx.host.load_bytes(&cached, &bytes)?;
    if loaded.info.name != r.plugin || loaded.info.version != r.version {
        return Err(PoolError::ComponentMismatch {
            blake3: r.blake3.clone(),
            says: format!("`{}` {}", loaded.info.name, loaded.info.version),
            wanted: format!("`{}` {}", r.plugin, r.version),
        });
    }
    Ok(loaded)
}

/// Sets the cancel flag of every session whose search the bucket says is over.
async fn watch_searches(
    bucket: async_nats::jetstream::kv::Store,
    cancels: Arc<Mutex<HashMap<String, Arc<AtomicBool>>>>,
) {
    super::follow_searches(bucket, false, |search, change| {
        let over = match change {
            super::Change::State(s) => s.phase.is_over(),
            super::Change::Unreadable => false,
            super::Change::Deleted => true,
        };
        if over
            && let Ok(mut c) = cancels.lock()
            && let Some(flag) = c.remove(&search)
        {
            tracing::info!(search = %search, "search ended in the pool; stopping its work here");
            flag.store(true, Ordering::Relaxed);
        }
        true
    })
    .await
}

/// Puts the worker's heartbeat in the workers bucket every few seconds, and the queue's
/// size in the metrics.
async fn heartbeat(
    bucket: async_nats::jetstream::kv::Store,
    items: async_nats::jetstream::stream::Stream,
    metrics: Arc<PoolMetrics>,
    mut beat: WorkerBeat,
    busy: Arc<AtomicBool>,
    completed: Arc<AtomicU64>,
) {
    loop {
        beat.busy = busy.load(Ordering::Relaxed);
        beat.items_completed = completed.load(Ordering::Relaxed);
        if let Ok(bytes) = serde_json::to_vec(&beat) {
            let _ = bucket.put(&beat.worker, bytes.into()).await;
        }
        if let Ok(mut c) = items
            .get_consumer::<consumer::pull::Config>(WORKERS_CONSUMER)
            .await
            && let Ok(info) = c.info().await
        {
            metrics
                .queue_items
                .with_label_values(&["pending"])
                .set(info.num_pending as i64);
            metrics
                .queue_items
                .with_label_values(&["in_progress"])
                .set(info.num_ack_pending as i64);
        }
        tokio::time::sleep(Duration::from_secs(super::BEAT_SECONDS)).await;
    }
}
