//! `GET /jobs` and `GET /jobs/<hash>`: the operator's view of the daemon's jobs as JSON —
//! every job the daemon knows (its record: state, attempts, message, result folder) and,
//! for a running search, its progress with an estimate of the time left. Made from the
//! shared state on each request (the records are in memory; nothing is read from disk).

use crate::jobs::Job;
use crate::state::Shared;
use serde::Serialize;
use std::sync::Weak;

/// A running search's progress.
#[derive(Debug, Serialize)]
struct Progress {
    candidates_evaluated: usize,
    candidates_total: usize,
    elapsed_seconds: f64,
    /// The time left (`archplace_job::folder::eta_seconds`); `null` before the first
    /// candidate.
    eta_seconds: Option<f64>,
}

/// One job, as `/jobs` shows it.
#[derive(Debug, Serialize)]
struct JobView<'a> {
    hash: &'a str,
    name: &'a str,
    file: String,
    state: &'static str,
    attempts: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<&'a str>,
    result_dir: String,
    updated_unix_seconds: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    progress: Option<Progress>,
}

/// A job as `/jobs` shows it, with its search's progress when it runs.
fn view<'a>(job: &'a Job, running: Option<&crate::state::Progress>) -> JobView<'a> {
    let progress = running.map(|p| {
        let elapsed = p.started.elapsed().as_secs_f64();
        Progress {
            candidates_evaluated: p.evaluated,
            candidates_total: p.total,
            elapsed_seconds: elapsed,
            eta_seconds: archplace_job::folder::eta_seconds(elapsed, p.evaluated, p.total),
        }
    });
    JobView {
        hash: &job.hash,
        name: &job.name,
        file: job.file.display().to_string(),
        state: job.state.name(),
        attempts: job.attempts,
        message: job.message.as_deref(),
        result_dir: job.result_dir.display().to_string(),
        updated_unix_seconds: job.updated_unix_seconds,
        progress,
    }
}

/// The JSON of every job (`hash` `None`: `{"jobs": [...]}`, by hash) or of one job; `None`
/// when there is no such job or the daemon is gone.
pub fn json(shared: &Weak<Shared>, hash: Option<&str>) -> Option<Vec<u8>> {
    let shared = shared.upgrade()?;
    let state = shared.state();
    let body = match hash {
        None => {
            let jobs: Vec<JobView<'_>> = state
                .store
                .jobs
                .values()
                .map(|j| view(j, state.progress.get(&j.hash)))
                .collect();
            serde_json::to_vec_pretty(&serde_json::json!({ "jobs": jobs }))
        }
        Some(h) => {
            let job = state.store.jobs.get(h)?;
            serde_json::to_vec_pretty(&view(job, state.progress.get(h)))
        }
    };
    body.ok().map(|mut b| {
        b.push(b'\n');
        b
    })
}
