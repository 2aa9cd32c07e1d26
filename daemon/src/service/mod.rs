//! The daemon: a watched folder of specs, a queue of searches, results and states on disk.
//!
//! * [`config`] — the daemon's settings;
//! * [`folder`] — which files are specs and when they are whole;
//! * [`jobs`] — one persisted record per spec content (queued → running → done | failed |
//!   cancelled).
//!
//! The main loop scans the folder (every `poll_interval_seconds`, and wholly every
//! `rescan_interval_seconds`), turns new content into queued jobs, cancels the jobs of
//! edited or deleted specs, and hands jobs to `max_concurrent_searches` worker threads,
//! each running the search on its own thread pool. On shutdown (SIGTERM, SIGINT) running
//! searches are cancelled at their next candidate and put back in the queue state, so a
//! restart searches them again; the same happens after kill -9, because a job is only
//! `done` once its result files are written.

pub mod config;
pub mod folder;
pub mod http;
pub mod jobs;
pub mod metrics;

use crate::engine::search::{Observer, Progress, ScheduleEvent};
use crate::plugin::Host;
use crate::runner::{self, RunError};
use config::DaemonConfig;
use folder::Seen;
use jobs::{Job, JobState, JobStore};
use metrics::{Metrics, SpecLabels};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Why the daemon could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("cannot use {}: {source}", path.display())]
    Folder {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Plugin(#[from] crate::plugin::PluginError),
    #[error("metrics endpoint: {0}")]
    Http(String),
}

/// A job waiting for a worker, with the bytes it was read as.
struct Queued {
    hash: String,
    path: PathBuf,
    bytes: Vec<u8>,
}

/// A running search's cancel flag, and why it was set (none: shutdown).
struct Running {
    flag: Arc<AtomicBool>,
    reason: Option<String>,
}

struct Shared {
    /// The settings; SIGHUP replaces those that can change while running.
    config: std::sync::RwLock<DaemonConfig>,
    host: Host,
    store: Mutex<JobStore>,
    queue: Mutex<VecDeque<Queued>>,
    wake: Condvar,
    /// Running jobs by hash.
    running: Mutex<HashMap<String, Running>>,
    /// Progress of running searches (name, evaluated, total), for systemd's STATUS.
    progress: Mutex<HashMap<String, (String, usize, usize)>>,
    /// Searches to try again (their results could not be written), with when.
    retries: Mutex<Vec<(Instant, Queued)>>,
    shutdown: Arc<AtomicBool>,
    metrics: Arc<Metrics>,
}

/// Signals the daemon reacts to, as flags set by the binary's signal handlers.
pub struct Signals {
    /// SIGTERM, SIGINT: stop.
    pub shutdown: Arc<AtomicBool>,
    /// SIGHUP: reload the config (with `load`), rescan plugins and specs.
    pub reload: Arc<AtomicBool>,
    pub load: Box<dyn Fn() -> Result<DaemonConfig, String> + Send>,
}

/// Runs the daemon until `signals.shutdown` is set, then cancels running searches,
/// persists their state and returns.
pub fn run(config: DaemonConfig, signals: Signals) -> Result<(), ServiceError> {
    let Signals {
        shutdown,
        reload,
        load,
    } = signals;
    let folder_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ServiceError::Folder { path, source }
    };
    if !config.spec_dir.exists() {
        std::fs::create_dir_all(&config.spec_dir).map_err(folder_err(&config.spec_dir))?;
        let p = config.spec_dir.join("default.toml");
        crate::atomic::write(&p, crate::spec::DEFAULT_SPEC.as_bytes()).map_err(folder_err(&p))?;
        tracing::info!(path = %p.display(), "created the spec folder with the default spec in it");
    }
    std::fs::create_dir_all(&config.results_dir).map_err(folder_err(&config.results_dir))?;
    // Temporary files of writes that a kill -9 interrupted (never renamed into place).
    crate::atomic::remove_stale(&config.state_dir, 1);
    crate::atomic::remove_stale(&config.results_dir, 2);
    let mut store = JobStore::open(&config.state_dir).map_err(folder_err(&config.state_dir))?;
    // Jobs that were queued or running when the daemon stopped are queued again; the
    // first scan finds their files (or cancels them if the files are gone).
    let interrupted: Vec<String> = store
        .jobs
        .values()
        .filter(|j| matches!(j.state, JobState::Queued | JobState::Running))
        .map(|j| j.hash.clone())
        .collect();
    for h in &interrupted {
        store.set(h, JobState::Queued, Some("requeued after a restart".into()));
    }
    let metrics = Arc::new(Metrics::new().map_err(|e| ServiceError::Http(e.to_string()))?);
    let host = Host::new(config.host_options())?.with_telemetry(metrics.clone());
    for e in &host.catalog().entries {
        metrics.plugin_known(&e.manifest.name);
    }
    let ready = Arc::new(AtomicBool::new(false));
    let http_stop = Arc::new(AtomicBool::new(false));
    let addr = http::serve(
        &config.listen,
        metrics.clone(),
        ready.clone(),
        http_stop.clone(),
    )
    .map_err(ServiceError::Http)?;
    tracing::info!(
        specs = %config.spec_dir.display(),
        results = %config.results_dir.display(),
        state = %config.state_dir.display(),
        "archplace daemon watching {} and writing {}; metrics at http://{addr}/metrics",
        config.spec_dir.display(),
        config.results_dir.display()
    );
    let shared = Arc::new(Shared {
        config: std::sync::RwLock::new(config),
        host,
        store: Mutex::new(store),
        queue: Mutex::new(VecDeque::new()),
        wake: Condvar::new(),
        running: Mutex::new(HashMap::new()),
        retries: Mutex::new(Vec::new()),
        progress: Mutex::new(HashMap::new()),
        shutdown,
        metrics: metrics.clone(),
    });
    let workers: Vec<_> = (0..shared.cfg().max_concurrent_searches)
        .map(|i| {
            let s = shared.clone();
            std::thread::Builder::new()
                .name(format!("archplace-search-{i}"))
                .spawn(move || worker(&s))
        })
        .collect::<Result<_, _>>()
        .map_err(|e| ServiceError::Folder {
            path: PathBuf::from("<threads>"),
            source: e,
        })?;
    // Changes arrive from the watcher (debounced), or from polling; a whole rescan also
    // runs at start, periodically, and whenever the watcher reports an error.
    let (tx, rx) = std::sync::mpsc::channel::<Wake>();
    let _watcher = if shared.cfg().poll {
        tracing::info!(
            "polling the spec folder every {} s",
            shared.cfg().poll_interval_seconds
        );
        None
    } else {
        watch(&shared.cfg().spec_dir, tx.clone(), metrics.clone())
    };
    let polling = _watcher.is_none();
    let mut files: BTreeMap<PathBuf, (Seen, String)> = BTreeMap::new();
    let mut first = true;
    let mut last_full = Instant::now();
    let mut reason = "start";
    let mut announced = false;
    let mut last_update = Instant::now();
    while !shared.shutdown.load(Ordering::Relaxed) {
        if reload.swap(false, Ordering::Relaxed) {
            shared.reload(load.as_ref());
            reason = "reload";
        }
        tracing::debug!(reason, "scanning the spec folder");
        metrics.rescan(reason);
        let settling = scan(&shared, &mut files, first);
        retry_due(&shared);
        if first_done(&mut announced) {
            ready.store(true, Ordering::Relaxed);
            notify_systemd(&[sd_notify::NotifyState::Ready]);
        }
        update_metrics(&shared, &metrics);
        let cfg = shared.cfg();
        let poll = Duration::from_secs_f64(cfg.poll_interval_seconds);
        let rescan_every = Duration::from_secs_f64(cfg.rescan_interval_seconds);
        first = false;
        // Wait for a change, the next poll, a settling file's recheck or the periodic
        // rescan, checking for shutdown in between.
        let wait = if polling || settling {
            poll
        } else {
            rescan_every.saturating_sub(last_full.elapsed())
        };
        let until = Instant::now() + wait;
        reason = "poll";
        while !shared.shutdown.load(Ordering::Relaxed) {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            if reload.load(Ordering::Relaxed) {
                break;
            }
            if last_update.elapsed() >= Duration::from_secs(1) {
                // Also the systemd watchdog's heartbeat: this loop is alive.
                update_metrics(&shared, &metrics);
                last_update = Instant::now();
            }
            match rx.recv_timeout(left.min(Duration::from_millis(100))) {
                Ok(Wake::Changed) => {
                    reason = "change";
                    break;
                }
                Ok(Wake::WatcherError) => {
                    reason = "watcher_error";
                    break;
                }
                Err(_) => {}
            }
            retry_due(&shared);
        }
        if last_full.elapsed() >= Duration::from_secs_f64(shared.cfg().rescan_interval_seconds) {
            reason = "periodic";
            last_full = Instant::now();
        }
    }
    ready.store(false, Ordering::Relaxed);
    notify_systemd(&[sd_notify::NotifyState::Stopping]);
    tracing::info!("shutting down: cancelling running searches");
    if let Ok(r) = shared.running.lock() {
        for run in r.values() {
            run.flag.store(true, Ordering::Relaxed);
        }
    }
    shared.wake.notify_all();
    for w in workers {
        let _ = w.join();
    }
    http_stop.store(true, Ordering::Relaxed);
    tracing::info!("stopped");
    Ok(())
}

/// True the first time it is called with `false` (then sets it).
fn first_done(announced: &mut bool) -> bool {
    !std::mem::replace(announced, true)
}

/// Tells systemd (when it started us with `Type=notify`) how we are.
fn notify_systemd(states: &[sd_notify::NotifyState<'_>]) {
    if std::env::var_os("NOTIFY_SOCKET").is_some() {
        let _ = sd_notify::notify(states);
    }
}

/// Job counts to the metrics, and a STATUS line and watchdog ping to systemd.
fn update_metrics(s: &Shared, m: &Metrics) {
    let Ok(store) = s.store.lock() else { return };
    let states = [
        JobState::Queued,
        JobState::Running,
        JobState::Done,
        JobState::Failed,
        JobState::Cancelled,
    ];
    let counts: Vec<(JobState, usize)> = states.iter().map(|&st| (st, store.count(st))).collect();
    drop(store);
    for (st, n) in &counts {
        m.set_specs(st.name(), *n);
    }
    if let Ok(q) = s.queue.lock() {
        m.set_queue_depth(q.len());
    }
    let mut status = format!(
        "{} running, {} queued, {} done, {} failed",
        counts[1].1, counts[0].1, counts[2].1, counts[3].1
    );
    if let (Ok(p), Ok(r)) = (s.progress.lock(), s.running.lock()) {
        for (hash, (name, done, total)) in p.iter() {
            if r.contains_key(hash) {
                status.push_str(&format!("; {name}: {done}/{total} candidates"));
            }
        }
    }
    notify_systemd(&[
        sd_notify::NotifyState::Status(&status),
        sd_notify::NotifyState::Watchdog,
    ]);
}

/// Queues the searches whose retry time has come (if their spec is still wanted).
fn retry_due(s: &Shared) {
    let due: Vec<Queued> = {
        let Ok(mut r) = s.retries.lock() else { return };
        let now = Instant::now();
        let (due, later): (Vec<_>, Vec<_>) = r.drain(..).partition(|(t, _)| *t <= now);
        *r = later;
        due.into_iter().map(|(_, q)| q).collect()
    };
    for q in due {
        let Ok(mut store) = s.store.lock() else {
            return;
        };
        if store
            .get(&q.hash)
            .is_none_or(|j| j.state != JobState::Failed)
        {
            continue;
        }
        store.set(&q.hash, JobState::Queued, Some("retrying".into()));
        tracing::info!(hash = %q.hash, "retrying a search whose results could not be written");
        if let Ok(mut queue) = s.queue.lock() {
            queue.push_back(q);
        }
        s.wake.notify_one();
    }
}

impl Shared {
    /// A copy of the current settings.
    fn cfg(&self) -> DaemonConfig {
        self.config
            .read()
            .map(|c| c.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    /// SIGHUP: rereads the config (settings that need a restart are reported, the others
    /// take effect now), rescans the plugin folders; the caller rescans the specs.
    fn reload(&self, load: &dyn Fn() -> Result<DaemonConfig, String>) {
        self.host.rescan();
        for e in &self.host.catalog().entries {
            self.metrics.plugin_known(&e.manifest.name);
        }
        let new = match load() {
            Ok(c) => c,
            Err(e) => {
                self.metrics.config_reloaded(false);
                tracing::error!("config reload failed, keeping the current settings: {e}");
                return;
            }
        };
        self.metrics.config_reloaded(true);
        let old = self.cfg();
        let fixed = [
            ("spec_dir", old.spec_dir != new.spec_dir),
            ("results_dir", old.results_dir != new.results_dir),
            ("state_dir", old.state_dir != new.state_dir),
            ("listen", old.listen != new.listen),
            (
                "max_concurrent_searches",
                old.max_concurrent_searches != new.max_concurrent_searches,
            ),
            ("plugin_dirs", old.plugin_dirs != new.plugin_dirs),
            ("cache_dir", old.cache_dir != new.cache_dir),
            (
                "plugin_limits",
                old.plugin_limits != new.plugin_limits || old.plugins != new.plugins,
            ),
            ("poll", old.poll != new.poll),
        ];
        for (key, changed) in fixed {
            if changed {
                tracing::warn!("config reload: `{key}` changed; it takes effect at the next start");
            }
        }
        let mut live = old.clone();
        live.max_queue = new.max_queue;
        live.threads_per_search = new.threads_per_search;
        live.rescan_interval_seconds = new.rescan_interval_seconds;
        live.poll_interval_seconds = new.poll_interval_seconds;
        live.settle_seconds = new.settle_seconds;
        live.retry_seconds = new.retry_seconds;
        live.log_level = new.log_level;
        if let Ok(mut c) = self.config.write() {
            *c = live;
        }
        tracing::info!("config reloaded; plugin folders rescanned");
    }
}

/// Why the main loop wakes up.
enum Wake {
    Changed,
    WatcherError,
}

/// Watches `dir` (debounced); `None` (and polling) if the watcher cannot start.
fn watch(
    dir: &Path,
    tx: std::sync::mpsc::Sender<Wake>,
    metrics: Arc<Metrics>,
) -> Option<notify_debouncer_mini::Debouncer<notify_debouncer_mini::notify::RecommendedWatcher>> {
    use notify_debouncer_mini::notify::RecursiveMode;
    let handler = move |r: notify_debouncer_mini::DebounceEventResult| {
        let wake = match r {
            Ok(events) => {
                metrics.watcher_events(events.len());
                Wake::Changed
            }
            Err(e) => {
                metrics.watcher_error();
                tracing::warn!(error = %e, "the folder watcher reported an error; rescanning");
                Wake::WatcherError
            }
        };
        let _ = tx.send(wake);
    };
    match notify_debouncer_mini::new_debouncer(Duration::from_millis(100), handler) {
        Ok(mut d) => match d.watcher().watch(dir, RecursiveMode::NonRecursive) {
            Ok(()) => Some(d),
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch the spec folder; polling it instead");
                None
            }
        },
        Err(e) => {
            tracing::warn!(error = %e, "cannot start the folder watcher; polling instead");
            None
        }
    }
}

/// One pass over the spec folder. True while some file is still being written (so the
/// caller looks again soon).
fn scan(s: &Shared, files: &mut BTreeMap<PathBuf, (Seen, String)>, first: bool) -> bool {
    let settle = Duration::from_secs_f64(s.cfg().settle_seconds);
    let (settled, changing) = match folder::scan(&s.cfg().spec_dir, settle) {
        Ok(x) => x,
        Err(e) => {
            s.metrics.watcher_error();
            tracing::error!(folder = %s.cfg().spec_dir.display(), error = %e, "cannot read the spec folder");
            return false;
        }
    };
    for (path, seen) in &settled {
        if files.get(path).is_some_and(|(old, _)| old == seen) {
            continue;
        }
        let Ok(bytes) = std::fs::read(path) else {
            continue;
        };
        let hash = blake3::hash(&bytes).to_hex().to_string();
        let previous = files.get(path).map(|(_, h)| h.clone());
        if previous.as_deref() == Some(hash.as_str()) {
            files.insert(path.clone(), (seen.clone(), hash));
            continue;
        }
        if !submit(s, path, &hash, bytes) {
            continue; // the queue is full: look again next time
        }
        files.insert(path.clone(), (seen.clone(), hash));
        if let Some(old) = previous {
            s.metrics.forget_result(&file_name(path));
            release(s, files, &old, "its spec was edited");
        }
    }
    let gone: Vec<PathBuf> = files
        .keys()
        .filter(|p| !settled.contains_key(*p) && !changing.contains(p))
        .cloned()
        .collect();
    for p in gone {
        if let Some((_, hash)) = files.remove(&p) {
            s.metrics.forget_result(&file_name(&p));
            release(s, files, &hash, "its spec was deleted");
        }
    }
    if first {
        // Jobs requeued after a restart whose spec is no longer in the folder.
        let known: Vec<String> = files.values().map(|(_, h)| h.clone()).collect();
        if let Ok(mut store) = s.store.lock() {
            let orphans: Vec<String> = store
                .jobs
                .values()
                .filter(|j| j.state == JobState::Queued && !known.contains(&j.hash))
                .map(|j| j.hash.clone())
                .collect();
            for h in orphans {
                store.set(
                    &h,
                    JobState::Cancelled,
                    Some("its spec was removed while the daemon was down".into()),
                );
            }
        }
    }
    !changing.is_empty()
}

/// Makes sure the content `hash` (read from `path`) is searched once. False when the
/// queue is full.
fn submit(s: &Shared, path: &Path, hash: &str, bytes: Vec<u8>) -> bool {
    let Ok(mut store) = s.store.lock() else {
        return false;
    };
    let mut existing = store.get(hash).cloned();
    if existing.is_none()
        && let Some(dir) = finished_result(&s.cfg().results_dir, hash)
    {
        // Its record was lost (a corrupt state file): the results say it is done.
        tracing::warn!(file = %path.display(), hash, "no job record, but results exist: recorded as done");
        let job = Job {
            hash: hash.to_string(),
            file: path.to_path_buf(),
            name: dir
                .parent()
                .and_then(|p| p.file_name())
                .and_then(|n| n.to_str())
                .unwrap_or("spec")
                .to_string(),
            state: JobState::Done,
            attempts: 0,
            message: Some("rebuilt from its results".into()),
            result_dir: dir,
            updated_unix_seconds: 0.0,
        };
        store.put(job.clone());
        existing = Some(job);
    }
    match existing.as_ref().map(|j| j.state) {
        Some(state) if state.is_final() => {
            tracing::info!(file = %path.display(), hash, state = state.name(), "already searched; not searching the same content again");
            if let Some(job) = existing.as_ref().filter(|j| j.state == JobState::Done)
                && let Some((throughput, area_um2)) = best_of(&job.result_dir)
            {
                let labels = SpecLabels {
                    spec: job.name.clone(),
                    file: file_name(path),
                };
                s.metrics.set_result(&labels, throughput, area_um2);
            }
            return true;
        }
        Some(JobState::Running) => return true,
        _ => {}
    }
    let Ok(mut queue) = s.queue.lock() else {
        return false;
    };
    if queue.iter().any(|q| q.hash == hash) {
        return true;
    }
    if queue.len() >= s.cfg().max_queue {
        tracing::warn!(file = %path.display(), "the queue is full ({}); the spec waits in the folder", s.cfg().max_queue);
        return false;
    }
    let name = path
        .file_stem()
        .and_then(|n| n.to_str())
        .unwrap_or("spec")
        .to_string();
    let result_dir = s.cfg().results_dir.join(&name).join(&hash[..16]);
    store.put(Job {
        hash: hash.to_string(),
        file: path.to_path_buf(),
        name,
        state: JobState::Queued,
        attempts: existing.map(|j| j.attempts).unwrap_or(0),
        message: None,
        result_dir,
        updated_unix_seconds: 0.0,
    });
    tracing::info!(file = %path.display(), hash, "queued");
    s.metrics.spec_discovered();
    queue.push_back(Queued {
        hash: hash.to_string(),
        path: path.to_path_buf(),
        bytes,
    });
    s.wake.notify_one();
    true
}

/// A file's name in the spec folder, as the metrics label it.
fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The best configuration's throughput and area (µm²) in the `result.json` of `dir`.
fn best_of(dir: &Path) -> Option<(f64, f64)> {
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("result.json")).ok()?).ok()?;
    let best = doc.get("best")?;
    Some((
        best.get("mean_throughput_samples_per_second")?.as_f64()?,
        best.get("configuration")?.get("area_mm2")?.as_f64()? * 1e6,
    ))
}

/// The result folder of content `hash` if its `result.json` exists
/// (`<results>/<any spec name>/<first 16 hex digits>/result.json`).
fn finished_result(results: &Path, hash: &str) -> Option<PathBuf> {
    let short = hash.get(..16)?;
    std::fs::read_dir(results)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path().join(short))
        .find(|d| d.join("result.json").is_file())
}

/// The content `hash` is no longer in the folder under any name: cancel its search.
fn release(s: &Shared, files: &BTreeMap<PathBuf, (Seen, String)>, hash: &str, why: &str) {
    if files.values().any(|(_, h)| h == hash) {
        return;
    }
    if let Ok(mut q) = s.queue.lock() {
        q.retain(|x| x.hash != hash);
    }
    if let Ok(mut r) = s.running.lock()
        && let Some(run) = r.get_mut(hash)
    {
        run.reason = Some(why.to_string());
        run.flag.store(true, Ordering::Relaxed);
        tracing::info!(hash, "cancelling: {why}");
        return;
    }
    if let Ok(mut store) = s.store.lock()
        && store.get(hash).is_some_and(|j| j.state == JobState::Queued)
    {
        store.set(hash, JobState::Cancelled, Some(why.to_string()));
    }
}

fn worker(s: &Shared) {
    loop {
        let next = {
            let Ok(mut q) = s.queue.lock() else { return };
            loop {
                if s.shutdown.load(Ordering::Relaxed) {
                    return;
                }
                if let Some(j) = q.pop_front() {
                    break j;
                }
                q = match s.wake.wait_timeout(q, Duration::from_millis(200)) {
                    Ok((q, _)) => q,
                    Err(_) => return,
                };
            }
        };
        let flag = Arc::new(AtomicBool::new(false));
        if let Ok(mut r) = s.running.lock() {
            r.insert(
                next.hash.clone(),
                Running {
                    flag: flag.clone(),
                    reason: None,
                },
            );
        }
        let job = {
            let Ok(mut store) = s.store.lock() else {
                return;
            };
            let Some(mut job) = store.get(&next.hash).cloned() else {
                continue;
            };
            job.state = JobState::Running;
            job.attempts += 1;
            job.message = None;
            store.put(job.clone());
            job
        };
        // The spec's name is recorded once the spec is parsed.
        let span = tracing::info_span!(
            "search",
            spec = tracing::field::Empty,
            hash = %&job.hash[..16],
            file = %file_name(&next.path),
        );
        let _enter = span.enter();
        tracing::info!(path = %next.path.display(), "search started");
        let started = Instant::now();
        let mut labels = SpecLabels {
            spec: job.name.clone(),
            file: file_name(&next.path),
        };
        let outcome = search(s, &next, &job, &flag, &mut labels);
        if let Ok(mut p) = s.progress.lock() {
            p.remove(&job.hash);
        }
        let reason = s
            .running
            .lock()
            .ok()
            .and_then(|mut r| r.remove(&job.hash))
            .and_then(|run| run.reason);
        let (state, message) = match outcome {
            Outcome::Done(best) => {
                if let Some((throughput, area_um2)) = best {
                    s.metrics.set_result(&labels, throughput, area_um2);
                }
                (JobState::Done, None)
            }
            Outcome::Failed(m) => (JobState::Failed, Some(m)),
            Outcome::RetryLater(m) => {
                let after = Duration::from_secs_f64(s.cfg().retry_seconds);
                if let Ok(mut r) = s.retries.lock() {
                    r.push((Instant::now() + after, next));
                }
                (
                    JobState::Failed,
                    Some(format!("{m}; trying again in {} s", s.cfg().retry_seconds)),
                )
            }
            Outcome::Cancelled if reason.is_none() && s.shutdown.load(Ordering::Relaxed) => (
                JobState::Queued,
                Some("interrupted by shutdown; searched again at the next start".into()),
            ),
            Outcome::Cancelled => (JobState::Cancelled, reason),
        };
        // Back to queued means interrupted by the shutdown.
        let outcome = match state {
            JobState::Queued => "interrupted",
            other => other.name(),
        };
        s.metrics
            .search_ended(&labels, outcome, started.elapsed().as_secs_f64());
        tracing::info!(
            state = state.name(),
            message = message.as_deref().unwrap_or(""),
            "search ended"
        );
        if let Ok(mut store) = s.store.lock() {
            store.set(&job.hash, state, message);
        }
    }
}

enum Outcome {
    /// With the best configuration's throughput and area (µm²), if any fits.
    Done(Option<(f64, f64)>),
    Failed(String),
    /// The search ran but its results could not be written: failed now, tried again later.
    RetryLater(String),
    Cancelled,
}

#[derive(Serialize)]
struct Status<'a> {
    state: &'a str,
    spec: &'a str,
    hash: &'a str,
    file: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    candidates_evaluated: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    candidates_total: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    area_bucket: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    best_throughput_samples_per_second: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    best_area_mm2: Option<f64>,
    elapsed_seconds: f64,
}

/// Writes `status.json` while a search runs (at most once a second).
struct StatusWriter<'a> {
    dir: PathBuf,
    job: &'a Job,
    started: Instant,
    last: Mutex<Option<Instant>>,
    /// Where the daemon's STATUS line reads progress from.
    progress: &'a Mutex<HashMap<String, (String, usize, usize)>>,
    metrics: &'a Metrics,
    labels: SpecLabels,
    /// Estimate counters already added to the metrics.
    estimates_seen: Mutex<(u64, u64)>,
}

impl StatusWriter<'_> {
    fn write(&self, state: &str, p: Option<&Progress>) {
        let status = Status {
            state,
            spec: &self.job.name,
            hash: &self.job.hash,
            file: self.job.file.display().to_string(),
            candidates_evaluated: p.map(|p| p.evaluated),
            candidates_total: p.map(|p| p.total),
            area_bucket: p.map(|p| p.bucket),
            best_throughput_samples_per_second: p
                .and_then(|p| p.best_throughput_samples_per_second),
            best_area_mm2: p.and_then(|p| p.best_area_um2).map(|a| a / 1e6),
            elapsed_seconds: self.started.elapsed().as_secs_f64(),
        };
        if let Ok(mut bytes) = serde_json::to_vec_pretty(&status) {
            bytes.push(b'\n');
            if let Err(e) = std::fs::create_dir_all(&self.dir)
                .and_then(|()| crate::atomic::write(&self.dir.join("status.json"), &bytes))
            {
                tracing::warn!(error = %e, "cannot write status.json");
            }
        }
    }
}

impl Observer for StatusWriter<'_> {
    fn schedule(&self, e: &ScheduleEvent) {
        self.metrics.schedule(e);
    }

    fn placement(&self, seconds: f64) {
        self.metrics.placement(seconds);
    }

    fn progress(&self, p: &Progress) {
        if let Ok(mut seen) = self.estimates_seen.lock() {
            self.metrics.progress(&self.labels, p, &mut seen);
        }
        if let Ok(mut m) = self.progress.lock() {
            m.insert(
                self.job.hash.clone(),
                (self.job.name.clone(), p.evaluated, p.total),
            );
        }
        let Ok(mut last) = self.last.lock() else {
            return;
        };
        if last.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
            return;
        }
        *last = Some(Instant::now());
        self.write("running", Some(p));
    }
}

fn write_error(dir: &Path, file: &Path, errors: serde_json::Value) -> Result<(), String> {
    let doc = serde_json::json!({ "file": file.display().to_string(), "errors": errors });
    let mut bytes = serde_json::to_vec_pretty(&doc).map_err(|e| e.to_string())?;
    bytes.push(b'\n');
    std::fs::create_dir_all(dir)
        .and_then(|()| crate::atomic::write(&dir.join("error.json"), &bytes))
        .map_err(|e| format!("cannot write {}: {e}", dir.join("error.json").display()))
}

/// One search, start to result files.
fn search(
    s: &Shared,
    q: &Queued,
    job: &Job,
    cancel: &Arc<AtomicBool>,
    labels: &mut SpecLabels,
) -> Outcome {
    let shown = q.path.display().to_string();
    let invalid = |diags: Vec<crate::spec::Diagnostic>, dir: &Path| {
        let n = diags.len();
        let first = diags
            .first()
            .map(|d| format!("{}:{}:{}: {}", d.file, d.line, d.column, d.message))
            .unwrap_or_default();
        match write_error(
            dir,
            &q.path,
            serde_json::to_value(&diags).unwrap_or_default(),
        ) {
            Ok(()) => Outcome::Failed(format!("{n} error(s) in the spec; first: {first}")),
            Err(e) => Outcome::Failed(e),
        }
    };
    let text = match String::from_utf8(q.bytes.clone()) {
        Ok(t) => t,
        Err(_) => {
            let d = crate::spec::Diagnostic::new(
                &shown,
                "",
                None,
                String::new(),
                "the file is not valid UTF-8".into(),
            );
            return invalid(vec![d], &job.result_dir);
        }
    };
    let spec = match crate::spec::parse(&text, &shown) {
        Ok(spec) => spec,
        Err(diags) => return invalid(diags, &job.result_dir),
    };
    tracing::Span::current().record("spec", spec.name.as_str());
    labels.spec = spec.name.clone();
    let dir = runner::result_dir(&s.cfg().results_dir, &spec);
    if let Ok(mut store) = s.store.lock()
        && let Some(mut j) = store.get(&job.hash).cloned()
    {
        j.name = spec.name.clone();
        j.result_dir = dir.clone();
        store.put(j);
    }
    let named = Job {
        name: spec.name.clone(),
        result_dir: dir.clone(),
        ..job.clone()
    };
    let status = StatusWriter {
        dir: dir.clone(),
        job: &named,
        started: Instant::now(),
        last: Mutex::new(None),
        progress: &s.progress,
        metrics: &s.metrics,
        labels: labels.clone(),
        estimates_seen: Mutex::new((0, 0)),
    };
    status.write("running", None);
    let pool = match rayon::ThreadPoolBuilder::new()
        .num_threads(s.cfg().threads_per_search)
        .build()
    {
        Ok(p) => p,
        Err(e) => return Outcome::Failed(format!("cannot start search threads: {e}")),
    };
    let result = pool.install(|| runner::run(&spec, &s.host, &status, cancel));
    if cancel.load(Ordering::Relaxed) {
        status.write("cancelled", None);
        return Outcome::Cancelled;
    }
    match result {
        Ok(finished) => match runner::write(&dir, &finished) {
            Ok(()) => {
                status.write("done", None);
                Outcome::Done(finished.doc.best.as_ref().map(|b| {
                    (
                        b.mean_throughput_samples_per_second,
                        b.configuration.area_mm2 * 1e6,
                    )
                }))
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot write the results");
                Outcome::RetryLater(e.to_string())
            }
        },
        Err(RunError::CostModel(diags)) => invalid(diags, &dir),
        Err(e) => {
            let message = e.to_string();
            let _ = write_error(&dir, &q.path, serde_json::json!([{ "message": message }]));
            status.write("failed", None);
            Outcome::Failed(message)
        }
    }
}
