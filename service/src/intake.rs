//! Intake: what the spec folder holds becomes jobs. A scan finds settled files; new content
//! is submitted (queued once per content hash), content that left the folder is released
//! (its search cancelled), and searches whose results could not be written are retried.

use super::folder::{self, Seen};
use super::jobs::{Job, JobState};
use super::metrics::SpecLabels;
use super::state::{Queued, Shared};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Instant;

/// The files of the spec folder as last seen, with their content hashes.
pub type Files = BTreeMap<PathBuf, (Seen, String)>;

/// One pass over the spec folder. True while some file is still being written (so the
/// caller looks again soon).
pub fn scan(s: &Shared, files: &mut Files, first: bool) -> bool {
    let settle = archplace_util::duration::interval(s.live().settle_seconds);
    let folder::Scan {
        settled,
        changing,
        skipped,
    } = match folder::scan(&s.start.spec_dir, settle) {
        Ok(x) => x,
        Err(e) => {
            s.metrics.watcher_error();
            tracing::error!(folder = %s.start.spec_dir.display(), error = %e, "cannot read the spec folder");
            return false;
        }
    };
    {
        let mut state = s.state();
        for (path, why) in &skipped {
            if state.skipped.insert(path.clone()) {
                tracing::warn!(file = %path.display(), "skipped: {why}");
            }
        }
        // Forget what is fixed or gone, so that it is reported again if it comes back.
        state
            .skipped
            .retain(|p| skipped.iter().any(|(q, _)| q == p));
    }
    for (path, seen) in &settled {
        if files.get(path).is_some_and(|(old, _)| old == seen) {
            continue;
        }
        let Ok(bytes) = archplace_spec::read_input(path) else {
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
        cancel_orphans(s, files);
    }
    !changing.is_empty()
}

/// Jobs requeued after a restart whose spec is no longer in the folder are cancelled.
fn cancel_orphans(s: &Shared, files: &Files) {
    let known: Vec<&String> = files.values().map(|(_, h)| h).collect();
    let mut state = s.state();
    let orphans: Vec<String> = state
        .store
        .jobs
        .values()
        .filter(|j| j.state == JobState::Queued && !known.contains(&&j.hash))
        .map(|j| j.hash.clone())
        .collect();
    for h in orphans {
        state.store.set(
            &h,
            JobState::Cancelled,
            Some("its spec was removed while the daemon was down".into()),
        );
    }
}

/// Makes sure the content `hash` (read from `path`) is searched once. False when the
/// queue is full.
pub fn submit(s: &Shared, path: &Path, hash: &str, bytes: Vec<u8>) -> bool {
    let mut state = s.state();
    let mut existing = state.store.get(hash).cloned();
    if existing.is_none()
        && let Some(dir) = finished_result(&s.start.results_dir, hash)
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
            interrupted: 0,
            message: Some("rebuilt from its results".into()),
            result_dir: dir,
            updated_unix_seconds: 0.0,
        };
        state.store.put(job.clone());
        existing = Some(job);
    }
    // A done job's results, read once: whether they are still whole, and its best for the
    // metrics.
    let done = existing
        .as_ref()
        .filter(|j| j.state == JobState::Done)
        .map(|j| archplace_job::folder::complete_result(&j.result_dir, hash));
    if let Some(None) = done {
        // Done, but its results are gone (deleted by hand): searched again, not ignored.
        if let Some(job) = &existing {
            tracing::warn!(file = %path.display(), hash, dir = %job.result_dir.display(), "its results are gone; searching it again");
        }
        existing = None;
    }
    match existing.as_ref().map(|j| j.state) {
        Some(st) if st.is_final() => {
            tracing::info!(file = %path.display(), hash, state = st.name(), "already searched; not searching the same content again");
            // The metrics take their own lock: the state's is let go first.
            drop(state);
            if let Some(job) = &existing
                && let Some(Some(doc)) = &done
                && let Some(best) = &doc.best
            {
                let labels = SpecLabels {
                    spec: job.name.clone(),
                    file: file_name(path),
                };
                s.metrics.set_result(
                    &labels,
                    best.mean_throughput_samples_per_second,
                    best.configuration.area_mm2 * 1e6,
                );
            }
            return true;
        }
        Some(JobState::Running) => {
            renamed(&mut state, existing.as_ref(), path);
            return true;
        }
        _ => {}
    }
    if state.queue.iter().any(|q| q.hash == hash) {
        renamed(&mut state, existing.as_ref(), path);
        if let Some(q) = state.queue.iter_mut().find(|q| q.hash == hash) {
            q.path = path.to_path_buf();
        }
        return true;
    }
    if state.queue.len() >= state.live.max_queue {
        tracing::warn!(file = %path.display(), "the queue is full ({}); the spec waits in the folder", state.live.max_queue);
        return false;
    }
    let name = path
        .file_stem()
        .and_then(|n| n.to_str())
        .unwrap_or("spec")
        .to_string();
    let result_dir = s.start.results_dir.join(&name).join(&hash[..16]);
    state.store.put(Job {
        hash: hash.to_string(),
        file: path.to_path_buf(),
        name,
        state: JobState::Queued,
        attempts: existing.as_ref().map_or(0, |j| j.attempts),
        interrupted: existing.as_ref().map_or(0, |j| j.interrupted),
        message: None,
        result_dir,
        updated_unix_seconds: 0.0,
    });
    tracing::info!(file = %path.display(), hash, "queued");
    s.metrics.spec_discovered();
    state.queue.push_back(Queued {
        hash: hash.to_string(),
        path: path.to_path_buf(),
        bytes,
    });
    s.wake.notify_one();
    true
}

/// The content of a queued or running job now lives under another name (the spec was
/// renamed): its record, its `status.json` and its metrics follow the new name.
fn renamed(state: &mut super::state::State, job: Option<&Job>, path: &Path) {
    let Some(job) = job.filter(|j| j.file != path) else {
        return;
    };
    tracing::info!(from = %job.file.display(), to = %path.display(), hash = %job.hash, "the spec was renamed");
    let mut job = job.clone();
    job.file = path.to_path_buf();
    state.store.put(job);
}

/// The content `hash` is no longer in the folder under any name: cancel its search.
pub fn release(s: &Shared, files: &Files, hash: &str, why: &str) {
    if files.values().any(|(_, h)| h == hash) {
        return;
    }
    let mut state = s.state();
    state.queue.retain(|x| x.hash != hash);
    if let Some(run) = state.running.get_mut(hash) {
        run.reason = Some(why.to_string());
        run.flag.store(true, Ordering::Relaxed);
        tracing::info!(hash, "cancelling: {why}");
        return;
    }
    if state
        .store
        .get(hash)
        .is_some_and(|j| j.state == JobState::Queued)
    {
        state
            .store
            .set(hash, JobState::Cancelled, Some(why.to_string()));
    }
}

/// Queues the searches whose retry time has come (if their spec is still wanted).
pub fn retry_due(s: &Shared) {
    let mut state = s.state();
    let now = Instant::now();
    let (due, later): (Vec<_>, Vec<_>) = state.retries.drain(..).partition(|(t, _)| *t <= now);
    state.retries = later;
    for (_, q) in due {
        if state
            .store
            .get(&q.hash)
            .is_none_or(|j| j.state != JobState::Failed)
        {
            continue;
        }
        state
            .store
            .set(&q.hash, JobState::Queued, Some("retrying".into()));
        tracing::info!(hash = %q.hash, "retrying a search whose results could not be written");
        state.queue.push_back(q);
        s.wake.notify_one();
    }
}

/// A file's name in the spec folder, as the metrics label it.
pub fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
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
