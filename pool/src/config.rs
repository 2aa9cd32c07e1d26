//! The `[pool]` section of the daemon's config: which NATS server, how to authenticate, and
//! how searches are cut and spread.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Joining a pool of daemons through NATS JetStream. Without `nats`, the daemon searches
/// alone, exactly as without this section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoolConfig {
    /// NATS server URL(s), comma-separated (`nats://10.0.0.5:4222`, `tls://…`). Every daemon
    /// that joins the same server (and account) is a worker of one pool.
    pub nats: Option<String>,
    /// A NATS credentials file (`.creds`: JWT and nkey seed), for servers that require it.
    pub credentials_file: Option<PathBuf>,
    /// CA certificate(s) (PEM) to verify the server's TLS certificate with.
    pub tls_ca_file: Option<PathBuf>,
    /// Client certificate and key (PEM), for servers that verify clients (mutual TLS).
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    /// Refuse a connection without TLS.
    pub require_tls: bool,
    /// This daemon's name in the pool (default: host name and process id).
    pub name: Option<String>,
    /// Evaluate the pool's work items (false: this daemon only coordinates its own specs).
    pub work: bool,
    /// Threads a worker evaluates an item on (0: all cores).
    pub worker_threads: usize,
    /// Candidates per work item (items never span two area buckets).
    pub item_candidates: usize,
    /// Most items a coordinator publishes ahead of the candidate its walk waits for in a
    /// search that may converge: what it may evaluate past its convergence point. (The
    /// look-ahead is four items per worker up to this; exhaustive searches, where nothing
    /// is wasted, publish at least this many ahead and up to 4,096.)
    pub look_ahead_items: usize,
    /// Seconds a worker may hold an item without a sign of life before it is given to
    /// another (workers signal progress every third of it while they evaluate). Short, so
    /// that a lost worker costs seconds: the GPT-3 example on three daemons, one killed -9
    /// three seconds in, finishes in 10.4 s with 6 s, 14.3 s with 10 s, 64.9 s with 60 s
    /// (5.0 s with none killed; `scripts/measure-pool-kill`). Redelivering a dead worker's
    /// items when its heartbeat expires would wait for the heartbeat's 15 s expiry.
    pub ack_wait_seconds: f64,
    /// Deliveries of one item before the search is failed (a worker that dies on it each
    /// time).
    pub max_deliveries: i64,
    /// Seconds to wait for the NATS server at start before giving up.
    pub connect_timeout_seconds: f64,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            nats: None,
            credentials_file: None,
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            require_tls: false,
            name: None,
            work: true,
            worker_threads: 0,
            item_candidates: 4,
            look_ahead_items: 64,
            ack_wait_seconds: 6.0,
            max_deliveries: 5,
            connect_timeout_seconds: 60.0,
        }
    }
}

/// Most candidates per item: an item's answer must fit one NATS message (1 MiB by default).
pub const MAX_ITEM_CANDIDATES: usize = 64;
/// Most items ahead.
pub const MAX_LOOK_AHEAD_ITEMS: usize = 4096;

impl PoolConfig {
    /// Rules between values: (key under `pool.`, problem).
    pub fn check(&self) -> Vec<(String, String)> {
        let mut e: Vec<(&str, String)> = Vec::new();
        if let Some(url) = &self.nats
            && url.trim().is_empty()
        {
            e.push((
                "nats",
                "is empty; give a URL such as nats://127.0.0.1:4222".into(),
            ));
        }
        if !(1..=MAX_ITEM_CANDIDATES).contains(&self.item_candidates) {
            e.push((
                "item_candidates",
                format!(
                    "is {}; must be from 1 to {MAX_ITEM_CANDIDATES}",
                    self.item_candidates
                ),
            ));
        }
        if !(1..=MAX_LOOK_AHEAD_ITEMS).contains(&self.look_ahead_items) {
            e.push((
                "look_ahead_items",
                format!(
                    "is {}; must be from 1 to {MAX_LOOK_AHEAD_ITEMS}",
                    self.look_ahead_items
                ),
            ));
        }
        for (key, v, min) in [
            ("ack_wait_seconds", self.ack_wait_seconds, 1.0),
            ("connect_timeout_seconds", self.connect_timeout_seconds, 0.0),
        ] {
            if !(v.is_finite() && v >= min && v <= 86_400.0) {
                e.push((
                    key,
                    format!("is {v}; must be from {min} to 86400 seconds (a day)"),
                ));
            }
        }
        if !(1..=1000).contains(&self.max_deliveries) {
            e.push((
                "max_deliveries",
                format!("is {}; must be from 1 to 1000", self.max_deliveries),
            ));
        }
        if self.tls_cert_file.is_some() != self.tls_key_file.is_some() {
            e.push((
                "tls_cert_file",
                "and tls_key_file go together (a client certificate needs its key)".into(),
            ));
        }
        e.into_iter()
            .map(|(k, m)| (format!("pool.{k}"), m))
            .collect()
    }

    /// Relative paths against `base` (the config file's folder).
    pub fn anchor(&mut self, base: &Path) {
        for p in [
            &mut self.credentials_file,
            &mut self.tls_ca_file,
            &mut self.tls_cert_file,
            &mut self.tls_key_file,
        ]
        .into_iter()
        .flatten()
        {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        }
    }
}

/// How often a worker tells JetStream it still works on an item: a third of the ack wait.
pub fn ack_progress_interval(ack_wait_seconds: f64) -> std::time::Duration {
    archplace_util::duration::interval(ack_wait_seconds / 3.0)
        .max(std::time::Duration::from_millis(100))
}
