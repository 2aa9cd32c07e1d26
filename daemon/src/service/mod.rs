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
pub mod jobs;

use crate::engine::search::{Observer, Progress};
use crate::plugin::Host;
use crate::runner::{self, RunError};
use config::DaemonConfig;
use folder::Seen;
use jobs::{Job, JobState, JobStore};
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
    config: DaemonConfig,
    host: Host,
    store: Mutex<JobStore>,
    queue: Mutex<VecDeque<Queued>>,
    wake: Condvar,
    /// Running jobs by hash.
    running: Mutex<HashMap<String, Running>>,
    shutdown: Arc<AtomicBool>,
}

/// Runs the daemon until `shutdown` is set, then cancels running searches, persists
/// their state and returns.
pub fn run(config: DaemonConfig, shutdown: Arc<AtomicBool>) -> Result<(), ServiceError> {
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
    let host = Host::new(config.host_options())?;
    tracing::info!(
        specs = %config.spec_dir.display(),
        results = %config.results_dir.display(),
        state = %config.state_dir.display(),
        "archplace daemon watching {} and writing {}",
        config.spec_dir.display(),
        config.results_dir.display()
    );
    let shared = Arc::new(Shared {
        config,
        host,
        store: Mutex::new(store),
        queue: Mutex::new(VecDeque::new()),
        wake: Condvar::new(),
        running: Mutex::new(HashMap::new()),
        shutdown,
    });
    let workers: Vec<_> = (0..shared.config.max_concurrent_searches)
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
    let mut files: BTreeMap<PathBuf, (Seen, String)> = BTreeMap::new();
    let mut first = true;
    let poll = Duration::from_secs_f64(shared.config.poll_interval_seconds);
    while !shared.shutdown.load(Ordering::Relaxed) {
        scan(&shared, &mut files, first);
        first = false;
        let until = Instant::now() + poll;
        while Instant::now() < until && !shared.shutdown.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(20).min(poll));
        }
    }
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
    tracing::info!("stopped");
    Ok(())
}

/// One pass over the spec folder.
fn scan(s: &Shared, files: &mut BTreeMap<PathBuf, (Seen, String)>, first: bool) {
    let settle = Duration::from_secs_f64(s.config.settle_seconds);
    let (settled, changing) = match folder::scan(&s.config.spec_dir, settle) {
        Ok(x) => x,
        Err(e) => {
            tracing::error!(folder = %s.config.spec_dir.display(), error = %e, "cannot read the spec folder");
            return;
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
}

/// Makes sure the content `hash` (read from `path`) is searched once. False when the
/// queue is full.
fn submit(s: &Shared, path: &Path, hash: &str, bytes: Vec<u8>) -> bool {
    let Ok(mut store) = s.store.lock() else {
        return false;
    };
    let existing = store.get(hash).cloned();
    match existing.as_ref().map(|j| j.state) {
        Some(state) if state.is_final() => {
            tracing::info!(file = %path.display(), hash, state = state.name(), "already searched; not searching the same content again");
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
    if queue.len() >= s.config.max_queue {
        tracing::warn!(file = %path.display(), "the queue is full ({}); the spec waits in the folder", s.config.max_queue);
        return false;
    }
    let name = path
        .file_stem()
        .and_then(|n| n.to_str())
        .unwrap_or("spec")
        .to_string();
    let result_dir = s.config.results_dir.join(&name).join(&hash[..16]);
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
    queue.push_back(Queued {
        hash: hash.to_string(),
        path: path.to_path_buf(),
        bytes,
    });
    s.wake.notify_one();
    true
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
        let span = tracing::info_span!("search", spec = %job.name, hash = %&job.hash[..16]);
        let _enter = span.enter();
        tracing::info!(file = %next.path.display(), "search started");
        let outcome = search(s, &next, &job, &flag);
        let reason = s
            .running
            .lock()
            .ok()
            .and_then(|mut r| r.remove(&next.hash))
            .and_then(|run| run.reason);
        let (state, message) = match outcome {
            Outcome::Done => (JobState::Done, None),
            Outcome::Failed(m) => (JobState::Failed, Some(m)),
            Outcome::Cancelled if reason.is_none() && s.shutdown.load(Ordering::Relaxed) => (
                JobState::Queued,
                Some("interrupted by shutdown; searched again at the next start".into()),
            ),
            Outcome::Cancelled => (JobState::Cancelled, reason),
        };
        tracing::info!(
            state = state.name(),
            message = message.as_deref().unwrap_or(""),
            "search ended"
        );
        if let Ok(mut store) = s.store.lock() {
            store.set(&next.hash, state, message);
        }
    }
}

enum Outcome {
    Done,
    Failed(String),
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
    fn progress(&self, p: &Progress) {
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
fn search(s: &Shared, q: &Queued, job: &Job, cancel: &Arc<AtomicBool>) -> Outcome {
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
    let dir = runner::result_dir(&s.config.results_dir, &spec);
    if let Ok(mut store) = s.store.lock()
        && let Some(mut j) = store.get(&job.hash).cloned()
    {
        j.name = spec.name.clone();
        j.result_dir = dir.clone();
        store.put(j);
    }
    let status = StatusWriter {
        dir: dir.clone(),
        job,
        started: Instant::now(),
        last: Mutex::new(None),
    };
    status.write("running", None);
    let pool = match rayon::ThreadPoolBuilder::new()
        .num_threads(s.config.threads_per_search)
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
                Outcome::Done
            }
            Err(e) => Outcome::Failed(e.to_string()),
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
