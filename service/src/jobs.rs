//! Job records: one per spec content (its blake3 hash), persisted atomically in
//! `<state_dir>/jobs/<hash>.json` so that a restart — after SIGTERM, kill -9 or power
//! loss — knows what was queued, running or done. A record that cannot be read is
//! reported and rebuilt from the results folder (a `result.json` means done).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Queued,
    Running,
    Done,
    Failed,
    /// The spec is invalid (its located errors are in `error.json`): never searched, not
    /// retried; apart from `Failed`, which is a search that started and could not finish.
    Invalid,
    Cancelled,
    /// Its results (or an invalid spec's `error.json`) could not be written — a full disk,
    /// something in the way: written again every `retry_seconds` without searching again
    /// (the finished search is kept in memory, or resumed from its journal after a
    /// restart), then `done` (or `invalid`).
    WaitingForDisk,
}

impl JobState {
    pub fn name(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Done => "done",
            JobState::Failed => "failed",
            JobState::Invalid => "invalid",
            JobState::Cancelled => "cancelled",
            JobState::WaitingForDisk => "waiting_for_disk",
        }
    }

    /// Whether the content has been dealt with for good (not searched again).
    pub fn is_final(self) -> bool {
        matches!(self, JobState::Done | JobState::Failed | JobState::Invalid)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// blake3 of the spec's bytes, hex.
    pub hash: String,
    /// The spec file it was last seen as.
    pub file: PathBuf,
    /// The spec's name (the file's stem while it is not known to be valid).
    pub name: String,
    pub state: JobState,
    /// Times the search was started.
    pub attempts: u32,
    /// Times in a row the daemon stopped while the search ran (found `running` at a start)
    /// without the search having made progress since it started: what the crash-loop guard
    /// counts.
    #[serde(default)]
    pub interrupted: u32,
    /// The candidates the search's journal held when it last started, or when a shutdown
    /// interrupted it: a restart that finds more in a search it finds `running` (killed,
    /// not stopped) knows it made progress.
    #[serde(default)]
    pub journal_candidates: u64,
    /// Why it failed or was cancelled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    pub result_dir: PathBuf,
    /// Seconds since the Unix epoch of the last change.
    pub updated_unix_seconds: f64,
}

/// Seconds since the Unix epoch (0 if the clock is before it).
pub(crate) fn unix_seconds() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Every job, in memory and on disk.
#[derive(Debug)]
pub struct JobStore {
    dir: PathBuf,
    pub jobs: BTreeMap<String, Job>,
}

/// The largest job record read: a record holds a hash, two paths, a name and a message.
pub const MAX_RECORD_BYTES: u64 = 1 << 20;

impl JobStore {
    /// Loads the records in `state_dir/jobs` (a record of more than [`MAX_RECORD_BYTES`] is
    /// not one the daemon wrote, and is rebuilt like a corrupt one). Unreadable records are reported (and
    /// removed: the next scan rebuilds them from the spec folder and the results).
    pub fn open(state_dir: &Path) -> std::io::Result<JobStore> {
        let dir = state_dir.join("jobs");
        std::fs::create_dir_all(&dir)?;
        let mut jobs = BTreeMap::new();
        for e in std::fs::read_dir(&dir)? {
            let path = e?.path();
            if path.extension().is_none_or(|x| x != "json") {
                continue;
            }
            match archplace_util::files::read_regular(&path, MAX_RECORD_BYTES)
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice::<Job>(&b).map_err(|e| e.to_string()))
            {
                Ok(job) => {
                    jobs.insert(job.hash.clone(), job);
                }
                Err(e) => {
                    tracing::error!(path = %path.display(), error = %e, "corrupt job record; it will be rebuilt from the spec folder and the results");
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        Ok(JobStore { dir, jobs })
    }

    pub fn get(&self, hash: &str) -> Option<&Job> {
        self.jobs.get(hash)
    }

    /// Stores `job` (in memory and atomically on disk).
    pub fn put(&mut self, mut job: Job) {
        job.updated_unix_seconds = unix_seconds();
        let path = self.dir.join(format!("{}.json", job.hash));
        match serde_json::to_vec_pretty(&job) {
            Ok(bytes) => {
                if let Err(e) = archplace_util::atomic::write(&path, &bytes) {
                    tracing::error!(path = %path.display(), error = %e, "cannot persist a job record");
                }
            }
            Err(e) => tracing::error!(error = %e, "cannot serialize a job record"),
        }
        self.jobs.insert(job.hash.clone(), job);
    }

    /// Changes the state of `hash` (with a message), if it exists.
    pub fn set(&mut self, hash: &str, state: JobState, message: Option<String>) {
        if let Some(mut job) = self.jobs.get(hash).cloned() {
            job.state = state;
            job.message = message;
            self.put(job);
        }
    }

    /// Jobs by state.
    pub fn count(&self, state: JobState) -> usize {
        self.jobs.values().filter(|j| j.state == state).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(hash: &str, state: JobState) -> Job {
        Job {
            hash: hash.into(),
            file: "specs/a.toml".into(),
            name: "a".into(),
            state,
            attempts: 0,
            interrupted: 0,
            journal_candidates: 0,
            message: None,
            result_dir: "results/a/x".into(),
            updated_unix_seconds: 0.0,
        }
    }

    #[test]
    fn records_survive_a_restart_and_corrupt_ones_are_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = JobStore::open(dir.path()).unwrap();
        s.put(job("aa", JobState::Running));
        s.put(job("bb", JobState::Done));
        s.set("aa", JobState::Failed, Some("why".into()));
        std::fs::write(dir.path().join("jobs/cc.json"), b"{ not json").unwrap();
        let s = JobStore::open(dir.path()).unwrap();
        assert_eq!(s.jobs.len(), 2);
        assert_eq!(s.get("aa").unwrap().state, JobState::Failed);
        assert_eq!(s.get("aa").unwrap().message.as_deref(), Some("why"));
        assert!(!dir.path().join("jobs/cc.json").exists());
    }
}
