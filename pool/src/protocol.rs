//! What the daemons of a pool say to each other through NATS: the messages (JSON), the
//! subjects, the streams and buckets they live in. One place, so that a coordinator and a
//! worker of the same archplace version agree by construction.
//!
//! * `ARCHPLACE_ITEMS` (work-queue stream, file storage), subject `archplace.items.<search>`:
//!   [`Item`]s, taken by the durable pull consumer [`WORKERS_CONSUMER`] that every worker
//!   shares — a message is acknowledged once its answer is stored, and redelivered to
//!   another worker if it is not acknowledged within the ack wait (a worker killed).
//! * `ARCHPLACE_RESULTS` (limits stream, file storage), subject `archplace.results.<search>`:
//!   [`ItemResult`]s, read back in full by the coordinator (also after its restart).
//! * key-value bucket `archplace-searches`: a [`SearchState`] per search — what a restarted
//!   coordinator resumes from, and what workers watch to cancel.
//! * key-value bucket `archplace-workers`: a [`WorkerBeat`] per worker, expiring — the pool
//!   as the coordinator sees it.
//! * key-value bucket `archplace-leases` (file storage, values expire after
//!   [`LEASE_SECONDS`]): per running search, the name of the daemon coordinating it now,
//!   renewed every [`LEASE_RENEW_SECONDS`] — a search whose lease lapsed has lost its
//!   coordinator, and another daemon carries it on (`super::takeover`).
//! * key-value bucket `archplace-schedules`: layer schedules the workers solved
//!   (`super::schedules`).
//! * object store `archplace`: specs (`spec-<blake3>`) and cost-model components
//!   (`component-<blake3>`), by content hash.

use archplace_engine::search::{Evaluated, Stats};
use archplace_plugin_sdk::AcceleratorConfig;
use serde::{Deserialize, Serialize};

/// Version of these messages; a worker refuses items of another.
pub const PROTOCOL_VERSION: u32 = 1;

pub const ITEMS_STREAM: &str = "ARCHPLACE_ITEMS";
pub const RESULTS_STREAM: &str = "ARCHPLACE_RESULTS";
pub const WORKERS_CONSUMER: &str = "archplace-workers";
pub const SEARCHES_BUCKET: &str = "archplace-searches";
pub const WORKERS_BUCKET: &str = "archplace-workers";
pub const SCHEDULES_BUCKET: &str = "archplace-schedules";
pub const LEASES_BUCKET: &str = "archplace-leases";

/// How long a coordinator's lease outlives its last renewal: a coordinator silent that long
/// is taken for gone.
pub const LEASE_SECONDS: u64 = 10;
/// How often a coordinator renews its lease.
pub const LEASE_RENEW_SECONDS: u64 = 2;
pub const OBJECT_BUCKET: &str = "archplace";

pub fn items_subject(search: &str) -> String {
    format!("archplace.items.{search}")
}

pub fn results_subject(search: &str) -> String {
    format!("archplace.results.{search}")
}

pub fn spec_object(content_hash: &str) -> String {
    format!("spec-{content_hash}")
}

pub fn component_object(blake3: &str) -> String {
    format!("component-{blake3}")
}

/// A cost-model component, by content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ComponentRef {
    pub plugin: String,
    pub version: String,
    pub blake3: String,
}

/// One candidate of an item: what the worker evaluates, exactly as the coordinator's space
/// has it (the area as the coordinator's area model gave it: workers need no area model).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ItemCandidate {
    pub index: usize,
    pub config: AcceleratorConfig,
    pub area_um2: f64,
    pub bucket: u64,
}

/// A few consecutive candidates of one area bucket of one search.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Item {
    pub protocol: u32,
    pub archplace_version: String,
    pub search: String,
    /// The item's number in the search (items are numbered in candidate order).
    pub item: usize,
    /// The spec's content hash (its object is [`spec_object`]) and file name.
    pub spec_hash: String,
    pub spec_file: String,
    pub latency: ComponentRef,
    pub candidates: Vec<ItemCandidate>,
}

/// A worker's answer to an item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "answer")]
pub enum Answer {
    /// Every candidate of the item, summarised ([`Evaluated::summarise`]), in order, and
    /// the work it took.
    Evaluated {
        evaluated: Vec<Evaluated>,
        work: Stats,
    },
    /// The item cannot be evaluated (the cost model failed, the spec or component could not
    /// be had): the search fails with `reason`.
    Failed { reason: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ItemResult {
    pub search: String,
    pub item: usize,
    pub worker: String,
    #[serde(flatten)]
    pub answer: Answer,
}

/// Where a search is, in the searches bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Running,
    Done,
    Cancelled,
    Failed,
}

impl Phase {
    /// Whether workers should stop working on the search.
    pub fn is_over(self) -> bool {
        self != Phase::Running
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchState {
    pub phase: Phase,
    pub spec: String,
    pub spec_hash: String,
    /// The spec's file name (as the items name it).
    #[serde(default)]
    pub spec_file: String,
    /// The daemon whose spec folder holds the spec: the one that writes its results.
    pub coordinator: String,
    /// The cost models' components (blake3; `None`: linked natively): a daemon carries the
    /// search on only with the same ones.
    #[serde(default)]
    pub area_blake3: Option<String>,
    #[serde(default)]
    pub latency_blake3: Option<String>,
    /// The daemon that carried the search on while its coordinator was away, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub carried_by: Option<String>,
    /// Whether the walk reached its end while the coordinator was away: every answer the
    /// result needs is stored, and the coordinator (or any daemon serving the spec's
    /// folder) collects them without evaluating anything. Nobody carries it on again.
    #[serde(default)]
    pub walked: bool,
    /// Items published so far (items are published in order, so: items `0..published`).
    pub items_published: usize,
    pub items_total: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A worker's heartbeat in the workers bucket (expires with the bucket's max age).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerBeat {
    pub worker: String,
    pub archplace_version: String,
    pub threads: usize,
    pub busy: bool,
    pub items_completed: u64,
}
