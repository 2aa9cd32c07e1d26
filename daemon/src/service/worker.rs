//! Workers: each takes the next queued job, runs its search on a thread pool of its own,
//! writes `status.json` as it goes and the result files (or `error.json`) at the end, and
//! records how the job ended.

use super::intake::file_name;
use super::jobs::{Job, JobState};
use super::metrics::SpecLabels;
use super::state::{Progress, Queued, Running, Shared};
use crate::runner::{self, RunError};
use archplace_engine::search::{Observer, ScheduleEvent};
use archplace_plugin_sdk::text::{significant, thousands};
use archplace_plugin_sdk::units::format_bytes;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Runs jobs until shutdown.
pub fn run(s: &Shared) {
    loop {
        let Some((next, job, flag)) = take(s) else {
            return;
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
        let reason = {
            let mut state = s.state();
            state.progress.remove(&job.hash);
            state.running.remove(&job.hash).and_then(|run| run.reason)
        };
        let invalid = matches!(outcome, Outcome::Invalid(_));
        let (state, message) = match outcome {
            Outcome::Done(best, summary) => {
                if let Some((throughput, area_um2)) = best {
                    s.metrics.set_result(&labels, throughput, area_um2);
                }
                (JobState::Done, Some(summary))
            }
            Outcome::Failed(m) | Outcome::Invalid(m) => (JobState::Failed, Some(m)),
            Outcome::RetryLater(m) => {
                let retry_seconds = s.live().retry_seconds;
                let after = crate::service::config::interval(retry_seconds);
                s.state().retries.push((Instant::now() + after, next));
                (
                    JobState::Failed,
                    Some(format!("{m}; trying again in {retry_seconds} s")),
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
            _ if invalid => "invalid",
            other => other.name(),
        };
        let seconds = started.elapsed().as_secs_f64();
        s.metrics.search_ended(&labels, outcome, seconds);
        tracing::info!(
            state = state.name(),
            outcome,
            seconds = format!("{seconds:.1}"),
            reason = message.as_deref().unwrap_or(""),
            "search ended: {}",
            message.as_deref().unwrap_or("")
        );
        // A finished search's record keeps no message (the summary is the log's).
        let message = if state == JobState::Done {
            None
        } else {
            message
        };
        s.state().store.set(&job.hash, state, message);
    }
}

/// The next queued job, marked running (with its cancel flag); `None` at shutdown.
fn take(s: &Shared) -> Option<(Queued, Job, Arc<AtomicBool>)> {
    let mut state = s.state();
    loop {
        if s.shutdown.load(Ordering::Relaxed) {
            return None;
        }
        let Some(next) = state.queue.pop_front() else {
            state = s.wait(state, Duration::from_millis(200));
            continue;
        };
        // A job whose record is gone was cancelled in between: skip it.
        let Some(mut job) = state.store.get(&next.hash).cloned() else {
            continue;
        };
        job.state = JobState::Running;
        job.attempts += 1;
        job.message = None;
        state.store.put(job.clone());
        let flag = Arc::new(AtomicBool::new(false));
        state.running.insert(
            next.hash.clone(),
            Running {
                flag: flag.clone(),
                reason: None,
            },
        );
        return Some((next, job, flag));
    }
}

enum Outcome {
    /// With the best configuration's throughput and area (µm²), if any fits, and what the
    /// log's "search ended" says of it.
    Done(Option<(f64, f64)>, String),
    Failed(String),
    /// The spec never started: it is invalid (located errors in `error.json`) — the
    /// submitter's to fix, not the operator's, so counted apart from failed searches.
    Invalid(String),
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
    /// A pooled search's workers and items (`daemon --nats`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pool: Option<crate::pool::coordinator::PoolStatus>,
    elapsed_seconds: f64,
}

/// Writes `status.json` while a search runs (at most once a second).
struct StatusWriter<'a> {
    dir: PathBuf,
    job: &'a Job,
    started: Instant,
    last: Mutex<Option<Instant>>,
    /// Where the daemon's STATUS line reads progress from, and the metrics.
    shared: &'a Shared,
    /// The metrics labels, which follow a rename of the spec while it is searched.
    labels: Mutex<SpecLabels>,
    /// Estimate counters already added to the metrics.
    estimates_seen: Mutex<(u64, u64)>,
    /// The pool's side of the search, when it is pooled.
    pool: Option<&'a Mutex<crate::pool::coordinator::PoolStatus>>,
}

impl StatusWriter<'_> {
    /// The spec file's path now (the job record follows renames).
    fn current_file(&self) -> PathBuf {
        self.shared
            .state()
            .store
            .get(&self.job.hash)
            .map_or_else(|| self.job.file.clone(), |j| j.file.clone())
    }

    /// The labels for the spec's current name; the series of an old name are removed.
    fn current_labels(&self) -> SpecLabels {
        let file = file_name(&self.current_file());
        let Ok(mut labels) = self.labels.lock() else {
            return SpecLabels {
                spec: self.job.name.clone(),
                file,
            };
        };
        if labels.file != file {
            self.shared.metrics.search_ended_series(&labels);
            labels.file = file;
        }
        labels.clone()
    }

    fn write(&self, state: &str, p: Option<&archplace_engine::search::Progress>) {
        let status = Status {
            state,
            spec: &self.job.name,
            hash: &self.job.hash,
            file: self.current_file().display().to_string(),
            candidates_evaluated: p.map(|p| p.evaluated),
            candidates_total: p.map(|p| p.total),
            area_bucket: p.map(|p| p.bucket),
            best_throughput_samples_per_second: p
                .and_then(|p| p.best_throughput_samples_per_second),
            best_area_mm2: p.and_then(|p| p.best_area_um2).map(|a| a / 1e6),
            pool: self.pool.and_then(|m| m.lock().ok().map(|s| s.clone())),
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
        self.shared.metrics.schedule(e);
    }

    fn placement(&self, seconds: f64) {
        self.shared.metrics.placement(seconds);
    }

    fn progress(&self, p: &archplace_engine::search::Progress) {
        if let Ok(mut seen) = self.estimates_seen.lock() {
            let labels = self.current_labels();
            self.shared.metrics.progress(&labels, p, &mut seen);
        }
        self.shared.state().progress.insert(
            self.job.hash.clone(),
            Progress {
                name: self.job.name.clone(),
                evaluated: p.evaluated,
                total: p.total,
            },
        );
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
            Ok(()) => Outcome::Invalid(format!("{n} error(s) in the spec; first: {first}")),
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
    let dir = runner::result_dir(&s.start.results_dir, &spec);
    {
        let mut state = s.state();
        if let Some(mut j) = state.store.get(&job.hash).cloned() {
            j.name = spec.name.clone();
            j.result_dir = dir.clone();
            state.store.put(j);
        }
    }
    let pool_status = Mutex::new(crate::pool::coordinator::PoolStatus::default());
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
        shared: s,
        labels: Mutex::new(labels.clone()),
        estimates_seen: Mutex::new((0, 0)),
        pool: s.pool.as_ref().map(|_| &pool_status),
    };
    status.write("running", None);
    let pool = match rayon::ThreadPoolBuilder::new()
        .num_threads(s.live().threads_per_search)
        .build()
    {
        Ok(p) => p,
        Err(e) => return Outcome::Failed(format!("cannot start search threads: {e}")),
    };
    let budget = s.live().search_memory_bytes;
    // Cancelled for good: the spec left or changed (a reason was given), not the shutdown.
    let for_good = || {
        s.state()
            .running
            .get(&job.hash)
            .is_some_and(|r| r.reason.is_some())
    };
    let pooled = s.pool.as_ref().map(|p| runner::Pooled {
        pool: p,
        status: &pool_status,
        cancelled_for_good: &for_good,
    });
    let result = pool.install(|| {
        runner::run_pooled(
            &spec,
            &s.host,
            &status,
            cancel,
            Some(&dir),
            Some(budget),
            pooled.as_ref(),
        )
    });
    // The search ends under the spec's current name (it may have been renamed meanwhile).
    *labels = status.current_labels();
    if cancel.load(Ordering::Relaxed) {
        // A shutdown puts the job back in the queue (searched again at the next start);
        // only a cancellation for a reason (its spec deleted or changed) ends it.
        let requeued = s.shutdown.load(Ordering::Relaxed)
            && s.state()
                .running
                .get(&job.hash)
                .is_none_or(|r| r.reason.is_none());
        status.write(if requeued { "queued" } else { "cancelled" }, None);
        return Outcome::Cancelled;
    }
    match result {
        Ok(finished) => match runner::write(&dir, &finished) {
            Ok(()) => {
                status.write("done", None);
                let doc = &finished.doc;
                let evaluated = thousands(doc.search.candidates_evaluated as u64);
                let summary = match &doc.best {
                    Some(b) => {
                        let k = &b.configuration.chip;
                        format!(
                            "best {} samples/s on {} tensor cores of {}×{}, {} vector cores, {} buffer, {:.2} mm², HBM {}; {evaluated} candidates",
                            significant(b.mean_throughput_samples_per_second, 4),
                            k.tensor_cores,
                            k.width,
                            k.depth,
                            k.vector_cores,
                            format_bytes(k.buffer_bytes),
                            b.configuration.area_mm2,
                            format_bytes(b.hbm_bytes),
                        )
                    }
                    None => format!("no candidate fits; {evaluated} candidates"),
                };
                Outcome::Done(
                    doc.best.as_ref().map(|b| {
                        (
                            b.mean_throughput_samples_per_second,
                            b.configuration.area_mm2 * 1e6,
                        )
                    }),
                    summary,
                )
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot write the results");
                Outcome::RetryLater(e.to_string())
            }
        },
        Err(RunError::CostModel(diags) | RunError::Memory(diags)) => invalid(diags, &dir),
        Err(e) => {
            let message = e.to_string();
            let _ = write_error(&dir, &q.path, serde_json::json!([{ "message": message }]));
            status.write("failed", None);
            Outcome::Failed(message)
        }
    }
}
