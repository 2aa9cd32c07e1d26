//! The daemon's state: everything the main loop, the intake and the workers share, behind
//! one lock. Every function takes [`Shared::state`], does its work and lets go, taking no
//! other lock meanwhile ([`crate::lock`] checks it). Nothing slow happens under it
//! (searches run outside it; job records are small files written atomically).

use super::config::{self, DaemonConfig, LiveSettings, StartSettings};
use super::jobs::JobStore;
use super::metrics::Metrics;
use crate::lock::{Guard, Lock};
use archplace_plugin_host::Host;
use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Condvar};
use std::time::Instant;

/// A job waiting for a worker, with the bytes it was read as.
pub struct Queued {
    pub hash: String,
    pub path: PathBuf,
    pub bytes: Vec<u8>,
    /// A search that finished but whose results could not be written (a full disk): the
    /// retry writes them, and does not search again.
    pub finished: Option<Arc<archplace_job::Finished>>,
    /// An invalid spec whose `error.json` could not be written: its errors, which the
    /// retry writes (without reading or validating the spec again).
    pub problems: Option<Vec<archplace_spec::Diagnostic>>,
}

/// A running search's cancel flag, and why it was set (none: shutdown).
pub struct Running {
    pub flag: Arc<AtomicBool>,
    pub reason: Option<String>,
}

/// A running search's progress, for systemd's STATUS line and `/jobs`.
pub struct Progress {
    pub name: String,
    pub evaluated: usize,
    pub total: usize,
    /// When the search started (for `/jobs`' elapsed time and estimate of what is left).
    pub started: std::time::Instant,
}

/// What changes while the daemon runs.
pub struct State {
    /// The settings a SIGHUP can change.
    pub live: LiveSettings,
    pub store: JobStore,
    pub queue: VecDeque<Queued>,
    /// Running jobs by hash.
    pub running: HashMap<String, Running>,
    /// Progress of running searches by hash.
    pub progress: HashMap<String, Progress>,
    /// Jobs `waiting_for_disk`: results or errors to write again, with when.
    pub retries: Vec<(Instant, Queued)>,
    /// Folder entries reported as skipped (each is logged once, not at every scan).
    pub skipped: std::collections::BTreeSet<std::path::PathBuf>,
}

/// What the daemon's threads share.
pub struct Shared {
    /// The settings read at start (a change needs a restart).
    pub start: StartSettings,
    state: Lock<State>,
    /// Wakes a worker when a job is queued (or everyone at shutdown).
    pub wake: Condvar,
    pub host: Host,
    pub metrics: Arc<Metrics>,
    pub shutdown: Arc<AtomicBool>,
    /// The pool this daemon joined (`--nats`), if any.
    pub pool: Option<Arc<archplace_pool::Pool>>,
}

impl Shared {
    pub fn new(
        start: StartSettings,
        state: State,
        host: Host,
        metrics: Arc<Metrics>,
        shutdown: Arc<AtomicBool>,
        pool: Option<Arc<archplace_pool::Pool>>,
    ) -> Shared {
        Shared {
            start,
            state: Lock::new("state", state),
            wake: Condvar::new(),
            host,
            metrics,
            shutdown,
            pool,
        }
    }

    /// The state, locked (see [`crate::lock`]).
    pub fn state(&self) -> Guard<'_, State> {
        self.state.lock()
    }

    /// Waits on [`Shared::wake`] for at most `timeout`.
    pub fn wait<'a>(
        &'a self,
        guard: Guard<'a, State>,
        timeout: std::time::Duration,
    ) -> Guard<'a, State> {
        self.state.wait(&self.wake, guard, timeout)
    }

    /// A copy of the live settings.
    pub fn live(&self) -> LiveSettings {
        self.state().live.clone()
    }

    /// SIGHUP: rereads the config (settings that need a restart are reported, the others
    /// take effect now), rescans the plugin folders; the caller rescans the specs.
    pub fn reload(&self, load: &dyn Fn() -> Result<DaemonConfig, String>) {
        self.host.rescan();
        for e in &self.host.catalog().entries {
            self.metrics.plugin_known(&e.manifest.name);
        }
        let (start, live) = match load() {
            Ok(c) => c.split(),
            Err(e) => {
                self.metrics.config_reloaded(false);
                tracing::error!(errors = %e, "config reload failed, keeping the current settings");
                return;
            }
        };
        self.metrics.config_reloaded(true);
        for key in config::changed_keys(&self.start, &start) {
            tracing::warn!("config reload: `{key}` changed; it takes effect at the next start");
        }
        let mut state = self.state();
        for key in config::changed_keys(&state.live, &live) {
            tracing::info!("config reload: `{key}` changed");
        }
        state.live = live;
        drop(state);
        tracing::info!("config reloaded; plugin folders rescanned");
    }
}
