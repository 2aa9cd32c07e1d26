//! The daemon: a watched folder of specs, a queue of searches, results and states on disk.
//!
//! * [`config`] — the daemon's settings;
//! * [`folder`] — which files are specs and when they are whole;
//! * [`jobs`] — one persisted record per spec content (queued → running → done | failed |
//!   cancelled);
//! * `state` — what the threads share, behind one lock; `intake` — folder scans, submit,
//!   release, retries; `worker` — searches and their files; [`metrics`], [`http`].
//!
//! The main loop scans the folder (every `poll_interval_seconds`, and wholly every
//! `rescan_interval_seconds`), turns new content into queued jobs, cancels the jobs of
//! edited or deleted specs, and hands jobs to `max_concurrent_searches` worker threads,
//! each running the search on its own thread pool. On shutdown (SIGTERM, SIGINT) running
//! searches are cancelled at their next candidate and put back in the queue state, so a
//! restart searches them again; the same happens after kill -9, because a job is only
//! `done` once its result files are written.

// In their order: each imports only those before it (ARCHITECTURE.md, invariant 19; a
// tidy test checks it). One per group: rustfmt would sort consecutive declarations.
pub mod config;

pub mod folder;

mod lock;

pub mod jobs;

pub mod metrics;

pub mod http;

mod state;

mod jobs_view;

mod intake;

mod worker;

use archplace_plugin_host::Host;
use config::{DaemonConfig, StartSettings};
use jobs::{JobState, JobStore};
use metrics::Metrics;
use state::{Shared, State};
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Why the daemon could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("cannot use {}: {error}", path.display())]
    Folder {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error(transparent)]
    Plugin(#[from] archplace_plugin_host::PluginError),
    #[error("metrics endpoint: {0}")]
    Http(String),
    #[error(transparent)]
    Pool(#[from] archplace_pool::PoolError),
    #[error(
        "another archplace daemon (PID {pid}) uses the state folder {}: two would search the same jobs and overwrite each other's records; stop it, or give this one its own state folder (--state-dir)",
        path.display()
    )]
    StateInUse { path: PathBuf, pid: String },
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
    let (start, live) = config.split();
    // Held until the daemon returns: the OS lets it go when the process ends, kill -9 too.
    let _state_lock = lock_state(&start.state_dir)?;
    let store = prepare_folders(&start)?;
    let metrics = Arc::new(Metrics::new().map_err(|e| ServiceError::Http(e.to_string()))?);
    let host = Host::new(start.host_options())?.with_telemetry(metrics.clone());
    for e in &host.catalog().entries {
        metrics.plugin_known(&e.manifest.name);
    }
    let ready = Arc::new(AtomicBool::new(false));
    let http_stop = Arc::new(AtomicBool::new(false));
    // `/jobs` answers from the shared state, made below: until then it has no jobs.
    let jobs: http::Jobs = Arc::new(std::sync::OnceLock::new());
    let addr = http::serve(
        &start.listen,
        http::Sources {
            metrics: metrics.clone(),
            ready: ready.clone(),
            stop: http_stop.clone(),
            jobs: jobs.clone(),
        },
    )
    .map_err(ServiceError::Http)?;
    tracing::info!(
        specs = %start.spec_dir.display(),
        results = %start.results_dir.display(),
        state = %start.state_dir.display(),
        "archplace daemon watching {} and writing {}; metrics at http://{addr}/metrics",
        start.spec_dir.display(),
        start.results_dir.display()
    );
    let state = State {
        live,
        store,
        queue: VecDeque::new(),
        running: HashMap::new(),
        progress: HashMap::new(),
        retries: Vec::new(),
        skipped: Default::default(),
    };
    let pool = match &start.pool.nats {
        Some(_) => Some(Arc::new(archplace_pool::Pool::connect(
            start.pool.clone(),
            metrics.pool.clone(),
            metrics.clone(),
        )?)),
        None => None,
    };
    let shared = Arc::new(Shared::new(start, state, host, metrics, shutdown, pool));
    let weak = Arc::downgrade(&shared);
    let _ = jobs.set(Box::new(move |hash| jobs_view::json(&weak, hash)));
    // The pool's worker evaluates items of every daemon's searches (this one's included);
    // its carrier carries on the searches whose coordinator is away.
    let pool_worker = match &shared.pool {
        Some(_) if shared.start.pool.work => Some(pool_thread(
            &shared,
            "archplace-pool-worker",
            archplace_pool::worker::run,
        )?),
        _ => None,
    };
    let pool_carrier = match &shared.pool {
        Some(_) => Some(pool_thread(
            &shared,
            "archplace-pool-carrier",
            archplace_pool::takeover::run,
        )?),
        None => None,
    };
    let workers: Vec<_> = (0..shared.start.max_concurrent_searches)
        .map(|i| {
            let s = shared.clone();
            std::thread::Builder::new()
                .name(format!("archplace-search-{i}"))
                .spawn(move || worker::run(&s))
        })
        .collect::<Result<_, _>>()
        .map_err(|e| ServiceError::Folder {
            path: PathBuf::from("<threads>"),
            error: e,
        })?;
    main_loop(&shared, &reload, load.as_ref(), &ready);
    ready.store(false, Ordering::Relaxed);
    notify_systemd(&[sd_notify::NotifyState::Stopping]);
    tracing::info!("shutting down: cancelling running searches");
    for run in shared.state().running.values() {
        run.flag.store(true, Ordering::Relaxed);
    }
    shared.wake.notify_all();
    for w in workers {
        let _ = w.join();
    }
    for w in [pool_worker, pool_carrier].into_iter().flatten() {
        let _ = w.join();
    }
    http_stop.store(true, Ordering::Relaxed);
    tracing::info!("stopped");
    Ok(())
}

/// A thread of the pool's (`shared.pool` is set) running `run` until shutdown.
fn pool_thread(
    shared: &Arc<Shared>,
    name: &str,
    run: fn(&Arc<archplace_pool::Pool>, &archplace_pool::worker::WorkerContext),
) -> Result<std::thread::JoinHandle<()>, ServiceError> {
    let s = shared.clone();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let Some(pool) = s.pool.clone() else {
                return;
            };
            let cx = archplace_pool::worker::WorkerContext {
                host: &s.host,
                state_dir: &s.start.state_dir,
                shutdown: &s.shutdown,
            };
            run(&pool, &cx)
        })
        .map_err(|e| ServiceError::Folder {
            path: PathBuf::from("<threads>"),
            error: e,
        })
}

/// The state folder's lock (`<state_dir>/daemon.lock`, holding the daemon's PID), taken
/// before anything in the folder is read or changed: a second daemon on the same state
/// folder is refused, naming the first's PID.
fn lock_state(dir: &Path) -> Result<std::fs::File, ServiceError> {
    use std::io::{Read, Seek, Write};
    let path = dir.join("daemon.lock");
    let failed = |error| ServiceError::Folder {
        path: path.clone(),
        error,
    };
    std::fs::create_dir_all(dir).map_err(failed)?;
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(failed)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut pid = String::new();
            let _ = file.read_to_string(&mut pid);
            let pid = pid.trim();
            return Err(ServiceError::StateInUse {
                path: dir.to_path_buf(),
                pid: if pid.is_empty() {
                    "unknown".into()
                } else {
                    pid.to_string()
                },
            });
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(failed(e)),
    }
    file.set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| writeln!(file, "{}", std::process::id()))
        .and_then(|()| file.flush())
        .map_err(failed)?;
    Ok(file)
}

/// Creates the spec folder (with the default spec in it) and the results folder, removes
/// temporaries of writes a kill -9 interrupted, and opens the job store, queueing again the
/// jobs that were queued or running when the daemon stopped (the first scan finds their
/// files, or cancels them if the files are gone).
fn prepare_folders(start: &StartSettings) -> Result<JobStore, ServiceError> {
    let folder_err = |path: &Path| {
        let path = path.to_path_buf();
        move |error| ServiceError::Folder { path, error }
    };
    if !start.spec_dir.exists() {
        std::fs::create_dir_all(&start.spec_dir).map_err(folder_err(&start.spec_dir))?;
        let p = start.spec_dir.join("default.toml");
        archplace_util::atomic::write(&p, archplace_spec::DEFAULT_SPEC.as_bytes())
            .map_err(folder_err(&p))?;
        tracing::info!(path = %p.display(), "created the spec folder with the default spec in it");
    }
    std::fs::create_dir_all(&start.results_dir).map_err(folder_err(&start.results_dir))?;
    archplace_util::atomic::remove_stale(&start.state_dir, 1);
    archplace_util::atomic::remove_stale(&start.results_dir, 2);
    let mut store = JobStore::open(&start.state_dir).map_err(folder_err(&start.state_dir))?;
    recover(&mut store);
    Ok(store)
}

/// Times in a row the daemon may stop during one search (crash, kill -9, power loss)
/// without the search making progress before it is given up: a spec that kills the daemon
/// must not restart it forever, and a healthy search interrupted by unrelated kills must
/// not be given up.
pub const MAX_INTERRUPTED_STARTS: u32 = 3;

/// After a restart: a job whose results were completely written is done (the daemon died
/// between writing them and recording it); one that was running when the daemon died is
/// queued again, and counts the interruption if its journal gained no candidate since the
/// search started (no candidate evaluated: what a spec that kills the daemon looks like) —
/// given up, with its `error.json` and a final `status.json`, after
/// [`MAX_INTERRUPTED_STARTS`] such in a row; the rest are queued again.
fn recover(store: &mut JobStore) {
    let interrupted: Vec<jobs::Job> = store
        .jobs
        .values()
        .filter(|j| {
            matches!(
                j.state,
                JobState::Queued | JobState::Running | JobState::WaitingForDisk
            )
        })
        .cloned()
        .collect();
    for mut job in interrupted {
        if archplace_job::folder::is_complete(&job.result_dir, &job.hash) {
            tracing::info!(hash = %job.hash, dir = %job.result_dir.display(), "its results were complete before the restart: recorded as done");
            job.state = JobState::Done;
            job.message = Some("its results were written before the restart".into());
        } else if job.state == JobState::Running {
            let now = archplace_job::journal::candidates(&job.result_dir);
            if now > job.journal_candidates {
                // It made progress: an interruption from outside, not a spec that kills
                // the daemon.
                tracing::info!(hash = %job.hash, candidates = now, "interrupted after progress; resumed from its journal");
                job.interrupted = 0;
            } else {
                job.interrupted += 1;
            }
            if job.interrupted >= MAX_INTERRUPTED_STARTS {
                tracing::error!(hash = %job.hash, file = %job.file.display(), times = job.interrupted, "the daemon stopped during this search every time; giving it up");
                job.state = JobState::Failed;
                job.message = Some(format!(
                    "the daemon stopped {} times in a row while searching this spec, each time before a candidate was evaluated (a crash, kill or power loss); it is not searched again: change the spec to retry",
                    job.interrupted
                ));
                given_up(&job);
            } else {
                job.state = JobState::Queued;
                job.message = Some("requeued after a restart".into());
            }
        } else {
            // Queued, or waiting for disk: what was kept in memory is gone; the search
            // resumes from its journal (its candidates are not evaluated again) and an
            // invalid spec is read again, then their files are written.
            job.state = JobState::Queued;
            job.message = Some("requeued after a restart".into());
        }
        store.put(job);
    }
}

/// The result folder of `job`, given up by the crash-loop guard: `error.json` with why, and
/// `status.json` in its final state (a failed job's folder says so, as every failed one's).
fn given_up(job: &jobs::Job) {
    let message = job.message.clone().unwrap_or_default();
    let d = archplace_spec::Diagnostic::new(
        &job.file.display().to_string(),
        "",
        None,
        String::new(),
        message,
    );
    if let Err(e) = archplace_job::folder::write_error(
        &job.result_dir,
        &job.file,
        serde_json::to_value([d]).unwrap_or_default(),
    ) {
        tracing::warn!(error = %e, "cannot write error.json");
    }
    let status = archplace_job::folder::Status {
        state: JobState::Failed.name(),
        spec: &job.name,
        hash: &job.hash,
        file: job.file.display().to_string(),
        candidates_evaluated: None,
        candidates_total: None,
        area_bucket_index: None,
        area_bucket_floor_mm2: None,
        eta_seconds: None,
        best_throughput_samples_per_second: None,
        best_area_mm2: None,
        pool: None,
        elapsed_seconds: 0.0,
    };
    if let Err(e) = archplace_job::folder::write_status(&job.result_dir, &status) {
        tracing::warn!(error = %e, "cannot write status.json");
    }
}

/// Scans the folder on watcher events, polls and timers, applies SIGHUP, reports to
/// systemd, until shutdown. Changes arrive from the watcher (debounced) or from polling; a
/// whole rescan also runs at start, periodically, and whenever the watcher reports an error.
fn main_loop(
    shared: &Shared,
    reload: &AtomicBool,
    load: &dyn Fn() -> Result<DaemonConfig, String>,
    ready: &AtomicBool,
) {
    let metrics = &shared.metrics;
    let (tx, rx) = std::sync::mpsc::channel::<Wake>();
    let _watcher = if shared.start.poll {
        tracing::info!(
            "polling the spec folder every {} s",
            shared.live().poll_interval_seconds
        );
        None
    } else {
        watch(&shared.start.spec_dir, tx.clone(), metrics.clone())
    };
    let polling = _watcher.is_none();
    let mut files = intake::Files::new();
    let mut first = true;
    let mut last_full = Instant::now();
    let mut reason = "start";
    let mut last_update = Instant::now();
    while !shared.shutdown.load(Ordering::Relaxed) {
        if reload.swap(false, Ordering::Relaxed) {
            shared.reload(load);
            reason = "reload";
        }
        tracing::debug!(reason, "scanning the spec folder");
        metrics.rescan(reason);
        let settling = intake::scan(shared, &mut files, first);
        intake::retry_due(shared);
        if first {
            ready.store(true, Ordering::Relaxed);
            notify_systemd(&[sd_notify::NotifyState::Ready]);
        }
        update_metrics(shared, metrics);
        let live = shared.live();
        let poll = archplace_util::duration::interval(live.poll_interval_seconds);
        let rescan_every = archplace_util::duration::interval(live.rescan_interval_seconds);
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
            if left.is_zero() || reload.load(Ordering::Relaxed) {
                break;
            }
            if last_update.elapsed() >= Duration::from_secs(1) {
                // Also the systemd watchdog's heartbeat: this loop is alive.
                update_metrics(shared, metrics);
                last_update = Instant::now();
            }
            match rx.recv_timeout(left.min(Duration::from_millis(100))) {
                Ok(Wake::Changed) => {
                    // A burst of changes (a copy, a rename, many specs at once) is one
                    // scan: wait for it to pass, keeping a watcher error if one came.
                    reason = "change";
                    std::thread::sleep(Duration::from_millis(100));
                    while let Ok(w) = rx.try_recv() {
                        if w == Wake::WatcherError {
                            reason = "watcher_error";
                        }
                    }
                    break;
                }
                Ok(Wake::WatcherError) => {
                    reason = "watcher_error";
                    break;
                }
                Err(_) => {}
            }
            intake::retry_due(shared);
        }
        if last_full.elapsed() >= rescan_every {
            reason = "periodic";
            last_full = Instant::now();
        }
    }
}

/// Tells systemd (when it started us with `Type=notify`) how we are.
fn notify_systemd(states: &[sd_notify::NotifyState<'_>]) {
    if std::env::var_os("NOTIFY_SOCKET").is_some() {
        let _ = sd_notify::notify(states);
    }
}

/// Job counts to the metrics, and a STATUS line and watchdog ping to systemd.
fn update_metrics(s: &Shared, m: &Metrics) {
    let state = s.state();
    let states = [
        JobState::Queued,
        JobState::Running,
        JobState::Done,
        JobState::Failed,
        JobState::Invalid,
        JobState::Cancelled,
        JobState::WaitingForDisk,
    ];
    let counts: Vec<(JobState, usize)> = states
        .iter()
        .map(|&st| (st, state.store.count(st)))
        .collect();
    for (st, n) in &counts {
        m.set_specs(st.name(), *n);
    }
    m.set_queue_depth(state.queue.len());
    let mut status = format!(
        "{} running, {} queued, {} done, {} failed",
        counts[1].1, counts[0].1, counts[2].1, counts[3].1
    );
    if counts[6].1 > 0 {
        status.push_str(&format!(", {} waiting for disk", counts[6].1));
    }
    for (hash, p) in &state.progress {
        if state.running.contains_key(hash) {
            status.push_str(&format!(
                "; {}: {}/{} candidates",
                p.name, p.evaluated, p.total
            ));
        }
    }
    drop(state);
    notify_systemd(&[
        sd_notify::NotifyState::Status(&status),
        sd_notify::NotifyState::Watchdog,
    ]);
}

/// Why the main loop wakes up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wake {
    Changed,
    WatcherError,
}

/// Watches `dir`; `None` (and polling) if the watcher cannot start. Only changes wake the
/// main loop: inotify also reports every open, read and close of the folder and its files
/// — the daemon's own scans among them — and counting those made every scan trigger the
/// next (an idle daemon rescanned ten times a second).
fn watch(
    dir: &Path,
    tx: std::sync::mpsc::Sender<Wake>,
    metrics: Arc<Metrics>,
) -> Option<notify::RecommendedWatcher> {
    use notify::{EventKind, RecursiveMode, Watcher};
    let handler = move |r: notify::Result<notify::Event>| {
        let wake = match r {
            Ok(event) if !matches!(event.kind, EventKind::Access(_)) => {
                metrics.watcher_events(1);
                Wake::Changed
            }
            Ok(_) => return,
            Err(e) => {
                metrics.watcher_error();
                tracing::warn!(error = %e, "the folder watcher reported an error; rescanning");
                Wake::WatcherError
            }
        };
        let _ = tx.send(wake);
    };
    match notify::recommended_watcher(handler) {
        Ok(mut w) => match w.watch(dir, RecursiveMode::NonRecursive) {
            Ok(()) => Some(w),
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
