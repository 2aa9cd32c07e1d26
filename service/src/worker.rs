//! Workers: each takes the next queued job, runs its search on a thread pool of its own,
//! writes `status.json` as it goes and the result files (or `error.json`) at the end, and
//! records how the job ended.

use super::intake::file_name;
use super::jobs::{Job, JobState};
use super::metrics::SpecLabels;
use super::state::{Progress, Queued, Running, Shared};
use crate::lock::Lock;
use archplace_engine::search::{Observer, ScheduleEvent};
use archplace_job::folder::{self, Status};
use archplace_job::run::Distributor;
use archplace_job::{RunError, Steering};
use archplace_plugin_sdk::text::{significant, thousands};
use archplace_pool::distributor::Pooled;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
        let (state, message) = match outcome {
            Outcome::Done(best, summary) => {
                if let Some((throughput, area_um2)) = best {
                    s.metrics.set_result(&labels, throughput, area_um2);
                }
                (JobState::Done, Some(summary))
            }
            Outcome::Failed(m) => (JobState::Failed, Some(m)),
            Outcome::Invalid(m) => (JobState::Invalid, Some(m)),
            Outcome::RetryLater(m, kept) => {
                let retry_seconds = s.live().retry_seconds;
                let after = archplace_util::duration::interval(retry_seconds);
                tracing::warn!(
                    state = "waiting_for_disk",
                    retry_seconds,
                    "cannot write its files; waiting for disk space: {m}"
                );
                // The retry writes what was found; it does not search again.
                let next = match kept {
                    Kept::Finished(f) => Queued {
                        finished: Some(f),
                        ..next
                    },
                    Kept::Problems(p) => Queued {
                        problems: Some(p),
                        ..next
                    },
                };
                s.state().retries.push((Instant::now() + after, next));
                (
                    JobState::WaitingForDisk,
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
        // Interrupted by the shutdown: the record says how far the search got (the
        // journal's candidates, which the next start resumes from).
        let journal = (state == JobState::Queued)
            .then(|| s.state().store.get(&job.hash).map(|j| j.result_dir.clone()))
            .flatten()
            .map(|dir| archplace_job::journal::candidates(&dir));
        let mut st = s.state();
        st.store.set(&job.hash, state, message);
        if let Some(n) = journal
            && let Some(mut j) = st.store.get(&job.hash).cloned()
        {
            j.journal_candidates = n;
            st.store.put(j);
        }
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
    /// The search ran (or the spec was found invalid) but its files could not be written:
    /// waiting for disk, written later from what is kept.
    RetryLater(String, Kept),
    Cancelled,
}

/// Writes `status.json` while a search runs (at most once a second), and feeds the
/// metrics and the daemon's STATUS line. Its own locks are leaves: none is held while
/// another lock is taken (see [`crate::lock`]).
struct StatusWriter<'a> {
    dir: PathBuf,
    job: &'a Job,
    started: Instant,
    /// When `status.json` was last written while running.
    last_write: Lock<Option<Instant>>,
    /// The last progress reported: what `status.json` keeps when the search is stopped.
    last_progress: Lock<Option<archplace_engine::search::Progress>>,
    /// Where the daemon's STATUS line reads progress from, and the metrics.
    shared: &'a Shared,
    /// The metrics labels, which follow a rename of the spec while it is searched.
    labels: Lock<SpecLabels>,
    /// The estimate counters already added to the metrics (the engine reports totals).
    estimates_counted: AtomicU64,
    cache_hits_counted: AtomicU64,
    /// The pool's side of the search, when it is pooled.
    pooled: Option<&'a Pooled<'a>>,
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
        let (now, old) = {
            let mut labels = self.labels.lock();
            if labels.file == file {
                (labels.clone(), None)
            } else {
                let old = labels.clone();
                labels.file = file;
                (labels.clone(), Some(old))
            }
        };
        if let Some(old) = old {
            self.shared.metrics.search_ended_series(&old);
        }
        now
    }

    fn write(&self, state: &str, p: Option<&archplace_engine::search::Progress>) {
        let status = Status {
            state,
            spec: &self.job.name,
            hash: &self.job.hash,
            file: self.current_file().display().to_string(),
            candidates_evaluated: None,
            candidates_total: None,
            area_bucket_index: None,
            area_bucket_floor_mm2: None,
            eta_seconds: None,
            best_throughput_samples_per_second: None,
            best_area_mm2: None,
            pool: self.pooled.and_then(Distributor::status),
            elapsed_seconds: self.started.elapsed().as_secs_f64(),
        }
        .with_progress(p);
        // How long is left says something only while it runs.
        let status = Status {
            eta_seconds: status.eta_seconds.filter(|_| state == "running"),
            ..status
        };
        if let Err(e) = folder::write_status(&self.dir, &status) {
            tracing::warn!(error = %e, "cannot write status.json");
        }
    }

    /// Whether `status.json` is due again (once a second while running).
    fn due(&self) -> bool {
        let mut last = self.last_write.lock();
        if last.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
            return false;
        }
        *last = Some(Instant::now());
        true
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
        let labels = self.current_labels();
        let counted = (
            self.estimates_counted
                .fetch_max(p.estimates_computed, Ordering::Relaxed),
            self.cache_hits_counted
                .fetch_max(p.estimate_cache_hits, Ordering::Relaxed),
        );
        self.shared.metrics.progress(&labels, p, counted);
        *self.last_progress.lock() = Some(*p);
        self.shared.state().progress.insert(
            self.job.hash.clone(),
            Progress {
                name: self.job.name.clone(),
                evaluated: p.evaluated,
                total: p.total,
                started: self.started,
            },
        );
        if self.due() {
            self.write("running", Some(p));
        }
    }
}

/// One search, start to result files.
fn search(
    s: &Shared,
    q: &Queued,
    job: &Job,
    cancel: &Arc<AtomicBool>,
    labels: &mut SpecLabels,
) -> Outcome {
    // An invalid spec's errors waiting for disk: written, not read again.
    if let Some(problems) = &q.problems {
        return invalid(q, problems.clone(), &job.result_dir);
    }
    let spec = match parse(q, &job.result_dir, &s.host, cancel) {
        Ok(spec) => spec,
        Err(outcome) => return outcome,
    };
    tracing::Span::current().record("spec", spec.name.as_str());
    labels.spec = spec.name.clone();
    let dir = folder::result_dir(&s.start.results_dir, &spec);
    {
        let mut state = s.state();
        if let Some(mut j) = state.store.get(&job.hash).cloned() {
            j.name = spec.name.clone();
            j.result_dir = dir.clone();
            // Where the search starts from: a restart that finds more candidates in the
            // journal knows it made progress (the crash-loop guard counts only interruptions without).
            j.journal_candidates = archplace_job::journal::candidates(&dir);
            state.store.put(j);
        }
    }
    let named = Job {
        name: spec.name.clone(),
        result_dir: dir.clone(),
        ..job.clone()
    };
    // Cancelled for good: the spec left or changed (a reason was given), not the shutdown.
    let for_good = || {
        s.state()
            .running
            .get(&job.hash)
            .is_some_and(|r| r.reason.is_some())
    };
    let pooled = s.pool.as_deref().map(|p| Pooled::new(p, &for_good));
    let status = StatusWriter {
        dir: dir.clone(),
        job: &named,
        started: Instant::now(),
        last_write: Lock::new("status.json time", None),
        last_progress: Lock::new("status.json progress", None),
        shared: s,
        labels: Lock::new("metrics labels", labels.clone()),
        estimates_counted: AtomicU64::new(0),
        cache_hits_counted: AtomicU64::new(0),
        pooled: pooled.as_ref(),
    };
    if let Some(finished) = &q.finished {
        tracing::info!(dir = %dir.display(), "writing the results of the finished search again (not searching again)");
        return written(&dir, status_of(&status), finished.clone());
    }
    status.write("running", None);
    let threads = match rayon::ThreadPoolBuilder::new()
        .num_threads(s.live().threads_per_search)
        .build()
    {
        Ok(p) => p,
        Err(e) => {
            return failed(
                &dir,
                q,
                &status,
                format!("cannot start search threads: {e}"),
            );
        }
    };
    let budget = s.live().search_memory_bytes;
    // A calibration the spec names, beside it or else in the calibrations folder.
    let calibration = spec.cost_model.calibration.as_ref().and_then(|name| {
        let beside = archplace_job::calibrated::file_of(&spec, None)?;
        let shared = s.live().calibrations_dir.clone()?.join(name);
        (!beside.exists() && shared.exists()).then_some(shared)
    });
    let result = threads.install(|| {
        let prepared = archplace_job::prepare(
            &spec,
            &s.host,
            rayon::current_num_threads(),
            Some(budget),
            cancel,
            calibration.as_deref(),
        )?;
        prepared.run(Steering {
            observer: &status,
            cancel,
            checkpoint: Some(&dir),
            distributor: pooled
                .as_ref()
                .map(|p| p as &dyn archplace_job::run::Distributor),
        })
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
        // Where it stopped stays in `status.json` (its journal resumes it from there).
        let last = *status.last_progress.lock();
        status.write(if requeued { "queued" } else { "cancelled" }, last.as_ref());
        return Outcome::Cancelled;
    }
    ended(&dir, q, &status, result)
}

/// The queued spec's text, validated; an invalid one's errors (with those of the plugins it
/// names) written to `dir/error.json`.
fn parse(
    q: &Queued,
    dir: &Path,
    host: &archplace_plugin_host::Host,
    cancel: &Arc<AtomicBool>,
) -> Result<archplace_spec::Spec, Outcome> {
    let shown = q.path.display().to_string();
    let (text, utf8) = archplace_spec::decode(q.bytes.clone(), &shown);
    if let Err(d) = utf8 {
        return Err(invalid(q, vec![d], dir));
    }
    archplace_spec::parse_with_plugins(&text, &shown, host, cancel.clone())
        .map_err(|diags| invalid(q, diags, dir))
}

/// What a job waiting for disk keeps, to write when it can.
enum Kept {
    /// The finished search (its results).
    Finished(Arc<archplace_job::Finished>),
    /// An invalid spec's located errors.
    Problems(Vec<archplace_spec::Diagnostic>),
}

/// The invalid spec `q`'s located errors, written to `dir/error.json`; when the file cannot
/// be written (a full disk) the job waits for disk with the errors kept, its message the
/// first error and why `error.json` is missing.
fn invalid(q: &Queued, diags: Vec<archplace_spec::Diagnostic>, dir: &Path) -> Outcome {
    match super::intake::write_invalid(dir, &q.path, &diags) {
        Ok(message) => Outcome::Invalid(message),
        Err(message) => Outcome::RetryLater(message, Kept::Problems(diags)),
    }
}

/// Writes the result files of `finished` into `dir` (`status` told when they are): done,
/// or to be written again later (a full disk), the finished search kept for that.
fn written(dir: &Path, status: impl Fn(&str), finished: Arc<archplace_job::Finished>) -> Outcome {
    match folder::write(dir, &finished) {
        Ok(()) => {
            status("done");
            let doc = &finished.doc;
            let evaluated = thousands(doc.search.candidates_evaluated as u64);
            let summary = match &doc.best {
                Some(b) => format!(
                    "best {} samples/s on {}; {evaluated} candidates",
                    significant(b.mean_throughput_samples_per_second, 4),
                    archplace_job::chip::long(&b.configuration, b.hbm_bytes),
                ),
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
            Outcome::RetryLater(e.to_string(), Kept::Finished(finished))
        }
    }
}

/// `status`'s end-state writer, as [`written`] takes it.
fn status_of<'a>(status: &'a StatusWriter<'_>) -> impl Fn(&str) + 'a {
    move |state| status.write(state, None)
}

/// How a search that was not cancelled ended: its result files written (or to be tried
/// again), its located errors, or why it failed.
fn ended(
    dir: &Path,
    q: &Queued,
    status: &StatusWriter<'_>,
    result: Result<archplace_job::Finished, RunError>,
) -> Outcome {
    match result {
        Ok(finished) => written(dir, status_of(status), Arc::new(finished)),
        Err(RunError::CostModel(diags) | RunError::Memory(diags) | RunError::Area(diags)) => {
            invalid(q, diags, dir)
        }
        Err(e) => failed(dir, q, status, e.to_string()),
    }
}

/// A search that failed for `message`: its `error.json` and final `status.json` say so, as
/// every failed job's folder does.
fn failed(dir: &Path, q: &Queued, status: &StatusWriter<'_>, message: String) -> Outcome {
    if let Err(e) = folder::write_error(dir, &q.path, serde_json::json!([{ "message": message }])) {
        tracing::warn!(error = %e, "cannot write error.json");
    }
    status.write("failed", None);
    Outcome::Failed(message)
}
