//! The pool: one search spread over many daemons through NATS JetStream (`--nats`).
//!
//! Every daemon connected to the same NATS server is a worker of one pool. The daemon a
//! spec is dropped into coordinates its search ([`coordinator`]): it cuts the space's area
//! buckets into items of a few candidates, publishes them in the walk's order a bounded
//! number ahead of the candidate the walk waits for, and hands the walk the workers'
//! evaluations in candidate order through the engine's `Supplier` — the walk, its
//! convergence rule, the re-evaluation of the best and the result files are the ones of a
//! search on one machine, so the result is the same. Workers ([`worker`]) take items from
//! a shared durable consumer, evaluate them with a memo of their own per search, store the
//! answer and only then acknowledge the item: a worker killed mid-item leaves it
//! unacknowledged, and JetStream gives it to another after the ack wait.
//!
//! What survives what:
//! * a worker killed: its item is redelivered (the answer is the same: it depends only on
//!   the candidates, the spec and the cost model);
//! * the coordinator killed: its lease ([`lease`]) lapses, and another daemon carries the
//!   search on ([`takeover`]): it walks it as the coordinator would, publishing the items
//!   the walk needs, and leaves the answers for the coordinator. At the coordinator's
//!   restart the search is queued again, its journal gives back the candidates it had
//!   merged, the results stream every answer stored since, and the searches bucket how
//!   many items were published — none is published or evaluated again;
//! * the NATS server restarted: streams and buckets are file-backed; clients reconnect and
//!   every operation is retried until it succeeds or the search is cancelled;
//! * a worker's cost model failing: the item's answer is the failure, and the coordinator
//!   fails the search with it (an item no worker finishes after `max_deliveries` fails it
//!   too);
//! * the spec deleted: the coordinator marks the search cancelled in the bucket, which
//!   every worker watches, and purges its items.
//!
//! The messages and names are in [`protocol`].

// Results must not depend on a hash map's order (ARCHITECTURE.md, "Determinism").
#![warn(clippy::iter_over_hash_type)]

// In their order: each imports only those before it (ARCHITECTURE.md, invariant 19; a
// tidy test checks it). One per group: rustfmt would sort consecutive declarations.
pub mod config;

pub mod protocol;

pub mod objects;

pub mod lease;

pub mod coordinator;

pub mod distributor;

pub mod metrics;

pub mod schedules;

pub mod synthetic;

pub mod worker;

pub mod takeover;

pub use config::PoolConfig;

use archplace_engine::search::Observer;
use async_nats::jetstream::{self, consumer, kv, object_store, stream};
use metrics::PoolMetrics;
use protocol::*;
use std::collections::BTreeSet;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("cannot start the NATS client's runtime: {0}")]
    Runtime(std::io::Error),
    #[error("NATS server {url}: {message}")]
    Connect { url: String, message: String },
    #[error("NATS: {0}")]
    Nats(String),
    #[error("no NATS server configured")]
    NoServer,
    #[error("cancelled")]
    Cancelled,
    #[error("stopping")]
    Stopping,
    #[error("cannot start {what}: {source}")]
    Threads {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("cannot encode the search's state: {0}")]
    Encode(#[from] serde_json::Error),
    #[error(
        "the latency model `{plugin}` is linked natively; a pooled search needs a WebAssembly component"
    )]
    NativeModel { plugin: String },
    #[error("object {name} has {size_bytes} bytes; at most {cap_bytes} are accepted")]
    ObjectTooLarge {
        name: String,
        size_bytes: u64,
        cap_bytes: u64,
    },
    #[error("object {name} has blake3 {actual}, not {expected}: refused")]
    ObjectHash {
        name: String,
        actual: String,
        expected: String,
    },
    #[error("{}: {source}", path.display())]
    ComponentRead {
        path: std::path::PathBuf,
        source: archplace_util::files::ReadError,
    },
    #[error("{} changed since it was loaded (blake3 {actual}, loaded {expected})", path.display())]
    ComponentChanged {
        path: std::path::PathBuf,
        actual: String,
        expected: String,
    },
    /// `says` and `wanted` are each "`name` version".
    #[error("the component {blake3} says it is {says}, not {wanted}")]
    ComponentMismatch {
        blake3: String,
        says: String,
        wanted: String,
    },
    #[error("{0}")]
    Plugin(#[from] archplace_plugin_host::PluginError),
    #[error("latency model `{plugin}`: {source}")]
    LatencyModel {
        plugin: String,
        source: archplace_plugin_host::PluginError,
    },
    #[error("the spec is not UTF-8 text")]
    SpecNotUtf8,
    #[error("the spec does not validate on this worker: {0}")]
    SpecInvalid(String),
    #[error("search {0} is not running in the pool")]
    NotRunning(String),
    /// A search this daemon cannot carry on: why.
    #[error("cannot carry search {search} on: {why}")]
    NotCarried { search: String, why: String },
    /// Another daemon took the lease of a search first (both saw it lapse).
    #[error("search {0} is carried on by another daemon already")]
    CarriedElsewhere(String),
}

fn nats_err(e: impl std::fmt::Display) -> PoolError {
    PoolError::Nats(e.to_string())
}

/// A daemon's connection to the pool: the client, the streams and buckets, and what it is
/// called there.
pub struct Pool {
    runtime: tokio::runtime::Runtime,
    js: jetstream::Context,
    items: stream::Stream,
    results: stream::Stream,
    searches: kv::Store,
    workers: kv::Store,
    schedules: kv::Store,
    leases: kv::Store,
    objects: object_store::ObjectStore,
    pub settings: PoolConfig,
    /// This daemon's name in the pool.
    pub name: String,
    pub metrics: Arc<PoolMetrics>,
    /// Where the worker's engine events (layer schedules, placements) go: the daemon's
    /// metrics.
    pub work: Arc<dyn Observer + Send + Sync>,
    /// How many times the client has (re)connected to the server: a consumer the server
    /// kept only in memory (an ordered one) is gone after a restart, and its reader learns
    /// of it here at once rather than after two missed heartbeats (30 s).
    connections: Arc<AtomicU64>,
}

/// How often a worker puts its heartbeat in the workers bucket, and how long one stays
/// there: a worker gone is seen within a few seconds — before its item is redelivered
/// (the ack wait, 6 s by default) — and a beat late by up to three seconds is not taken
/// for a departure.
const BEAT_SECONDS: u64 = 1;
const BEAT_EXPIRY_SECONDS: u64 = 4 * BEAT_SECONDS;
/// How long the results of a search are kept (an interrupted search can resume within it).
const RESULTS_MAX_AGE: Duration = Duration::from_secs(7 * 86_400);

impl Pool {
    /// Connects to `settings.nats` and makes sure the streams, the consumer and the buckets
    /// exist, waiting for the server up to `connect_timeout_seconds`.
    /// `metrics` are the pool's series; `work` hears of the layer schedules and placements
    /// this daemon's worker computes.
    pub fn connect(
        settings: PoolConfig,
        metrics: Arc<PoolMetrics>,
        work: Arc<dyn Observer + Send + Sync>,
    ) -> Result<Pool, PoolError> {
        let url = settings.nats.clone().ok_or(PoolError::NoServer)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("archplace-nats")
            .enable_all()
            .build()
            .map_err(PoolError::Runtime)?;
        let name = settings.name.clone().unwrap_or_else(default_name);
        metrics.configured.set(1);
        let connect_err = |message: String| PoolError::Connect {
            url: url.clone(),
            message,
        };
        let deadline =
            Instant::now() + archplace_util::duration::interval(settings.connect_timeout_seconds);
        let m = metrics.clone();
        let connections = Arc::new(AtomicU64::new(0));
        let connected = connections.clone();
        let client = runtime.block_on(async {
            let mut o = async_nats::ConnectOptions::new()
                .name(format!("archplace {name}"))
                .retry_on_initial_connect()
                .connection_timeout(Duration::from_secs(5))
                .event_callback(move |event| {
                    let m = m.clone();
                    let connected = connected.clone();
                    async move {
                        match event {
                            async_nats::Event::Connected => {
                                connected.fetch_add(1, Ordering::Relaxed);
                                m.connected.set(1);
                                tracing::info!("connected to NATS");
                            }
                            async_nats::Event::Disconnected => {
                                m.connected.set(0);
                                tracing::warn!("disconnected from NATS; reconnecting");
                            }
                            other => tracing::debug!(event = %other, "NATS"),
                        }
                    }
                });
            if let Some(c) = &settings.credentials_file {
                o = o
                    .credentials_file(c)
                    .await
                    .map_err(|e| connect_err(format!("credentials file {}: {e}", c.display())))?;
            }
            if let Some(ca) = &settings.tls_ca_file {
                o = o.add_root_certificates(ca.clone());
            }
            if let (Some(cert), Some(key)) = (&settings.tls_cert_file, &settings.tls_key_file) {
                o = o.add_client_certificate(cert.clone(), key.clone());
            }
            if settings.require_tls {
                o = o.require_tls(true);
            }
            o.connect(url.as_str())
                .await
                .map_err(|e| connect_err(e.to_string()))
        })?;
        // The JetStream context spawns its tasks on the current runtime.
        let js = {
            let _runtime = runtime.enter();
            jetstream::new(client)
        };
        // With `retry_on_initial_connect`, the client exists before the server answers:
        // the first JetStream calls are what waits for it.
        let set_up = loop {
            let last = match runtime.block_on(async {
                tokio::time::timeout(Duration::from_secs(10), set_up(&js, &settings)).await
            }) {
                Ok(Ok(r)) => break r,
                Ok(Err(e)) => e.to_string(),
                Err(_) => "no answer within 10 s".to_string(),
            };
            if Instant::now() >= deadline {
                return Err(connect_err(format!(
                    "not ready within {} s (last: {last})",
                    settings.connect_timeout_seconds
                )));
            }
            tracing::info!(url = %url, error = %last, "waiting for the NATS server");
            std::thread::sleep(Duration::from_millis(500));
        };
        let Resources {
            items,
            results,
            searches,
            workers,
            schedules,
            leases,
            objects,
        } = set_up;
        metrics.connected.set(1);
        tracing::info!(url = %url, name = %name, "joined the pool");
        Ok(Pool {
            runtime,
            js,
            items,
            results,
            searches,
            workers,
            schedules,
            leases,
            objects,
            settings,
            name,
            metrics,
            work,
            connections,
        })
    }

    /// How many times the client has (re)connected so far: a change means the server may
    /// have restarted since.
    pub(crate) fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }

    /// Runs `f` on the pool's runtime and waits for it.
    pub(crate) fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.runtime.block_on(f)
    }

    pub(crate) fn spawn<F>(&self, f: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.runtime.spawn(f)
    }

    /// Retries `op` (each try bounded by 10 s) until it succeeds or `stop` is set, waiting
    /// longer between tries up to 2 s: what every pool operation does while the server is
    /// away (a restart, a network cut).
    pub(crate) fn retry<T, E, F, Fut>(
        &self,
        what: &str,
        stop: &dyn Fn() -> bool,
        mut op: F,
    ) -> Option<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: std::fmt::Display,
    {
        let mut wait = Duration::from_millis(50);
        let mut warned = false;
        loop {
            match self.block_on(async { tokio::time::timeout(Duration::from_secs(10), op()).await })
            {
                Ok(Ok(v)) => {
                    if warned {
                        tracing::info!("{what}: succeeded again");
                    }
                    return Some(v);
                }
                Ok(Err(e)) => {
                    if !warned {
                        tracing::warn!(error = %e, "{what} failed; retrying");
                        warned = true;
                    }
                }
                Err(_) => {
                    if !warned {
                        tracing::warn!("{what}: no answer within 10 s; retrying");
                        warned = true;
                    }
                }
            }
            if stop() {
                return None;
            }
            std::thread::sleep(wait);
            wait = (wait * 2).min(Duration::from_secs(2));
        }
    }

    /// The state of search `id`, if the bucket has one.
    pub(crate) async fn state(&self, id: &str) -> Result<Option<SearchState>, PoolError> {
        let entry = self.searches.get(id).await.map_err(nats_err)?;
        Ok(entry.and_then(|b| serde_json::from_slice(&b).ok()))
    }

    /// The state of search `id` if the bucket says it is over (read within 2 s; `None`
    /// also when the server does not answer).
    pub(crate) fn ended(&self, id: &str) -> Option<SearchState> {
        let read = self
            .block_on(async { tokio::time::timeout(Duration::from_secs(2), self.state(id)).await });
        match read {
            Ok(Ok(Some(s))) if s.phase.is_over() => Some(s),
            _ => None,
        }
    }

    pub(crate) async fn put_state(&self, id: &str, s: &SearchState) -> Result<(), PoolError> {
        let bytes = serde_json::to_vec(s)?;
        self.searches
            .put(id, bytes.into())
            .await
            .map_err(nats_err)?;
        Ok(())
    }

    /// The workers whose heartbeat has not expired, by name.
    pub(crate) async fn live_workers(&self) -> Result<BTreeSet<String>, PoolError> {
        keys(&self.workers).await
    }
}

/// The host's name and the process id: unique among the daemons of a pool.
fn default_name() -> String {
    let host = archplace_util::files::read_regular(Path::new("/proc/sys/kernel/hostname"), 256)
        .map(|h| String::from_utf8_lossy(&h).trim().to_string())
        .unwrap_or_default();
    let host = if host.is_empty() {
        "archplace".into()
    } else {
        host
    };
    format!("{host}-{}", std::process::id())
}

/// The streams, buckets and object store of the pool ([`protocol`] says what each holds).
struct Resources {
    items: stream::Stream,
    results: stream::Stream,
    searches: kv::Store,
    workers: kv::Store,
    schedules: kv::Store,
    leases: kv::Store,
    objects: object_store::ObjectStore,
}

/// Creates (or finds) the streams, the workers' consumer and the buckets. The first daemon
/// creates them; the ack wait and delivery limit are then the first daemon's.
async fn set_up(js: &jetstream::Context, s: &PoolConfig) -> Result<Resources, PoolError> {
    let items = js
        .get_or_create_stream(stream::Config {
            name: ITEMS_STREAM.into(),
            subjects: vec!["archplace.items.*".into()],
            retention: stream::RetentionPolicy::WorkQueue,
            storage: stream::StorageType::File,
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await
        .map_err(|e| PoolError::Nats(format!("items stream: {e}")))?;
    let results = js
        .get_or_create_stream(stream::Config {
            name: RESULTS_STREAM.into(),
            subjects: vec!["archplace.results.*".into()],
            retention: stream::RetentionPolicy::Limits,
            storage: stream::StorageType::File,
            max_age: RESULTS_MAX_AGE,
            ..Default::default()
        })
        .await
        .map_err(|e| PoolError::Nats(format!("results stream: {e}")))?;
    let _: consumer::PullConsumer = items
        .get_or_create_consumer(
            WORKERS_CONSUMER,
            consumer::pull::Config {
                durable_name: Some(WORKERS_CONSUMER.into()),
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: archplace_util::duration::interval(s.ack_wait_seconds),
                max_deliver: s.max_deliveries,
                ..Default::default()
            },
        )
        .await
        .map_err(|e| PoolError::Nats(format!("workers consumer: {e}")))?;
    let searches = bucket(js, SEARCHES_BUCKET, None, 0, stream::StorageType::File).await?;
    let workers = bucket(
        js,
        WORKERS_BUCKET,
        Some(Duration::from_secs(BEAT_EXPIRY_SECONDS)),
        0,
        stream::StorageType::Memory,
    )
    .await?;
    // Schedules expire after a week and the bucket holds at most 1 GiB (then new ones are
    // not kept: only reuse is lost).
    let schedules = bucket(
        js,
        SCHEDULES_BUCKET,
        Some(RESULTS_MAX_AGE),
        1 << 30,
        stream::StorageType::File,
    )
    .await?;
    // File-backed: a restarted server keeps the leases (and their ages), so that it does
    // not look as if every coordinator had gone.
    let leases = bucket(
        js,
        LEASES_BUCKET,
        Some(Duration::from_secs(LEASE_SECONDS)),
        0,
        stream::StorageType::File,
    )
    .await?;
    let objects = match js.get_object_store(OBJECT_BUCKET).await {
        Ok(o) => o,
        Err(_) => js
            .create_object_store(object_store::Config {
                bucket: OBJECT_BUCKET.into(),
                storage: stream::StorageType::File,
                ..Default::default()
            })
            .await
            .map_err(|e| PoolError::Nats(format!("object store: {e}")))?,
    };
    Ok(Resources {
        items,
        results,
        searches,
        workers,
        schedules,
        leases,
        objects,
    })
}

/// The key-value bucket `name`, created if needed. Created as its stream, by the
/// key-value conventions (`KV_<name>`, subjects `$KV.<name>.>`, one value per key, roll-ups
/// allowed, deletes denied, direct gets): the client's own `create_key_value` first asks for
/// the account's details in a form the Debian server (2.9) does not send.
async fn bucket(
    js: &jetstream::Context,
    name: &str,
    max_age: Option<Duration>,
    max_bytes: i64,
    storage: stream::StorageType,
) -> Result<kv::Store, PoolError> {
    if let Ok(b) = js.get_key_value(name).await {
        return Ok(b);
    }
    js.get_or_create_stream(stream::Config {
        name: format!("KV_{name}"),
        subjects: vec![format!("$KV.{name}.>")],
        max_messages_per_subject: 1,
        max_age: max_age.unwrap_or_default(),
        max_bytes: if max_bytes > 0 { max_bytes } else { -1 },
        storage,
        allow_rollup: true,
        deny_delete: true,
        allow_direct: true,
        discard: stream::DiscardPolicy::New,
        ..Default::default()
    })
    .await
    .map_err(|e| PoolError::Nats(format!("bucket {name}: {e}")))?;
    js.get_key_value(name)
        .await
        .map_err(|e| PoolError::Nats(format!("bucket {name}: {e}")))
}

/// The keys of `bucket` (in order: what is done with them must not depend on the
/// server's).
async fn keys(bucket: &kv::Store) -> Result<BTreeSet<String>, PoolError> {
    use futures_util::StreamExt;
    let mut keys = bucket.keys().await.map_err(nats_err)?;
    let mut all = BTreeSet::new();
    while let Some(k) = keys.next().await {
        all.insert(k.map_err(nats_err)?);
    }
    Ok(all)
}

/// A change of one search in the searches bucket.
pub(crate) enum Change {
    State(Box<SearchState>),
    /// A value this version cannot read.
    Unreadable,
    Deleted,
}

/// Follows the searches bucket — from each search's last state with `history`, else from
/// now on — calling `on` with each search's id and change, watching again after a lost
/// watch, until `on` says to stop. What the workers (cancelling) and the carriers
/// (following the running searches) both watch.
pub(crate) async fn follow_searches(
    bucket: kv::Store,
    history: bool,
    mut on: impl FnMut(String, Change) -> bool,
) {
    use futures_util::StreamExt;
    loop {
        let watch = if history {
            bucket.watch_with_history(">").await
        } else {
            bucket.watch_all().await
        };
        let mut watch = match watch {
            Ok(w) => w,
            Err(e) => {
                tracing::debug!(error = %e, "cannot watch the searches; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        while let Some(Ok(entry)) = watch.next().await {
            let change = match entry.operation {
                kv::Operation::Put => {
                    serde_json::from_slice(&entry.value).map_or(Change::Unreadable, Change::State)
                }
                _ => Change::Deleted,
            };
            if !on(entry.key, change) {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether `flag` is set (for [`Pool::retry`]'s `stop`).
pub(crate) fn set(flag: &AtomicBool) -> bool {
    flag.load(Ordering::Relaxed)
}

/// Removes the messages of `subject` from `stream`.
pub(crate) async fn purge(stream: &stream::Stream, subject: String) -> Result<(), PoolError> {
    stream.purge().filter(subject).await.map_err(nats_err)?;
    Ok(())
}
