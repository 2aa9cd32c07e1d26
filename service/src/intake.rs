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
                tracing::warn!(file = %path.display(), reason = folder::skip_reason(why), "skipped: {why}");
                s.metrics.spec_skipped(folder::skip_reason(why));
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
        let bytes = match archplace_util::files::read_regular(path, s.live().max_spec_bytes) {
            Ok(b) => b,
            Err(e) => {
                unreadable(s, files, path, seen, &e);
                continue;
            }
        };
        let hash = blake3::hash(&bytes).to_hex().to_string();
        let previous = files.get(path).map(|(_, h)| h.clone());
        if previous.as_deref() == Some(hash.as_str()) {
            files.insert(path.clone(), (seen.clone(), hash));
            continue;
        }
        // Checked at once, whatever is searching: an invalid spec's errors do not wait for
        // a search slot.
        if rejected(s, path, &hash, &bytes) {
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

/// A settled spec file that cannot be read (above `max_spec_bytes`, or an I/O error): a
/// job in state `invalid` for this state of the file, with the reason in its `error.json`,
/// a log line and `archplace_specs_skipped_total` — once, until the file changes.
fn unreadable(
    s: &Shared,
    files: &mut Files,
    path: &Path,
    seen: &Seen,
    e: &archplace_util::files::ReadError,
) {
    use archplace_util::files::ReadError;
    let reason = match e {
        ReadError::TooLarge { .. } => "too_large",
        ReadError::NotRegular(_) => "not_a_file",
        ReadError::Io(_) => "unreadable",
    };
    // No content to hash: the job is this state of this file.
    let hash = blake3::hash(
        format!(
            "unreadable\0{}\0{}\0{:?}",
            path.display(),
            seen.len,
            seen.modified
        )
        .as_bytes(),
    )
    .to_hex()
    .to_string();
    files.insert(path.to_path_buf(), (seen.clone(), hash.clone()));
    tracing::warn!(file = %path.display(), reason, bytes = seen.len, "not read as a spec: it {e}");
    s.metrics.spec_skipped(reason);
    let help = match e {
        ReadError::TooLarge { cap } => Some(format!(
            "a spec is a page of TOML; the daemon reads at most {cap} bytes (`max_spec_bytes`)"
        )),
        _ => None,
    };
    let d = archplace_spec::Diagnostic::new(
        &path.display().to_string(),
        "",
        None,
        String::new(),
        format!(
            "the file is not read as a spec: it {e} ({} bytes)",
            seen.len
        ),
    )
    .with_help(help);
    record_invalid(s, path, &hash, vec![d]);
}

/// Whether the spec `bytes` (content `hash`, read from `path`), new to the daemon, has
/// problems a search need not wait for: then it is recorded `invalid` at once, with its
/// located errors (those of the plugins it names too) in `error.json`.
fn rejected(s: &Shared, path: &Path, hash: &str, bytes: &[u8]) -> bool {
    if s.state().store.get(hash).is_some() {
        return false; // Known content: `submit` says what becomes of it.
    }
    let shown = path.display().to_string();
    let (text, utf8) = archplace_spec::decode(bytes.to_vec(), &shown);
    let problems = match utf8 {
        Err(d) => vec![d],
        Ok(()) => {
            match archplace_spec::parse_with_plugins(&text, &shown, &s.host, Default::default()) {
                Ok(_) => return false,
                Err(d) => d,
            }
        }
    };
    record_invalid(s, path, hash, problems);
    true
}

/// Writes the `problems` of the spec at `path` to `dir/error.json`; the job's message: how
/// many and the first — `Err` with why `error.json` is missing when it could not be
/// written (a full disk: the job waits for disk with its errors kept, and writes them
/// when it can).
pub(super) fn write_invalid(
    dir: &Path,
    path: &Path,
    problems: &[archplace_spec::Diagnostic],
) -> Result<String, String> {
    let n = problems.len();
    let first = problems
        .first()
        .map(ToString::to_string)
        .unwrap_or_default();
    let message = format!("{n} error(s) in the spec; first: {first}");
    match archplace_job::folder::write_error(
        dir,
        path,
        serde_json::to_value(problems).unwrap_or_default(),
    ) {
        Ok(()) => Ok(message),
        Err(e) => Err(format!("{message} ({e})")),
    }
}

/// A job's name and result folder before its spec is read: the file's stem, and
/// `<results_dir>/<stem>/<first 16 hex digits of hash>`.
fn provisional(s: &Shared, path: &Path, hash: &str) -> (String, PathBuf) {
    let name = path
        .file_stem()
        .and_then(|n| n.to_str())
        .unwrap_or("spec")
        .to_string();
    let result_dir = s.start.results_dir.join(&name).join(&hash[..16]);
    (name, result_dir)
}

/// Records the content `hash` of `path` as `invalid` with `problems`: `error.json` in its
/// result folder, a log line, and the finished-searches counter's `invalid`. When the file
/// cannot be written the job is `waiting_for_disk`, its message the first problem and why,
/// and the problems are kept to be written when the disk lets them ([`retry_due`]).
fn record_invalid(s: &Shared, path: &Path, hash: &str, problems: Vec<archplace_spec::Diagnostic>) {
    let (name, result_dir) = provisional(s, path, hash);
    let written = write_invalid(&result_dir, path, &problems);
    let mut job = Job {
        hash: hash.to_string(),
        file: path.to_path_buf(),
        name: name.clone(),
        state: JobState::Invalid,
        attempts: 0,
        interrupted: 0,
        journal_candidates: 0,
        message: None,
        result_dir,
        updated_unix_seconds: 0.0,
    };
    match written {
        Ok(message) => {
            tracing::info!(file = %path.display(), hash, state = "invalid", "spec refused: {message}");
            job.message = Some(message);
            s.state().store.put(job);
            let labels = SpecLabels {
                spec: name,
                file: file_name(path),
            };
            s.metrics.search_ended(&labels, "invalid", 0.0);
        }
        Err(message) => {
            let queued = Queued {
                hash: hash.to_string(),
                path: path.to_path_buf(),
                bytes: Vec::new(),
                finished: None,
                problems: Some(problems),
            };
            wait_for_disk(s, job, queued, &message);
        }
    }
}

/// Puts `job` in state `waiting_for_disk` with `why` (what could not be written), to be
/// tried again as `queued` (its finished search or its problems kept) after
/// `retry_seconds`; a log line says so.
pub(super) fn wait_for_disk(s: &Shared, mut job: Job, queued: Queued, why: &str) {
    let retry_seconds = s.live().retry_seconds;
    let after = archplace_util::duration::interval(retry_seconds);
    tracing::warn!(file = %job.file.display(), hash = %job.hash, state = "waiting_for_disk", retry_seconds, "cannot write its files; waiting for disk space: {why}");
    job.state = JobState::WaitingForDisk;
    job.message = Some(format!("{why}; trying again in {retry_seconds} s"));
    let mut state = s.state();
    state.store.put(job);
    state.retries.push((Instant::now() + after, queued));
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
    // The same content under the job's own file, still there: `path` is a copy, not the
    // file renamed (read outside the state's lock).
    let recorded = s
        .state()
        .store
        .get(hash)
        .filter(|j| matches!(j.state, JobState::Queued | JobState::Running))
        .map(|j| j.file.clone());
    if let Some(first) = recorded.filter(|f| f != path && holds(f, hash)) {
        tracing::info!(file = %path.display(), duplicate_of = %first.display(), hash, "the same content as another spec in the folder: searched once, under its name");
        return true;
    }
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
            journal_candidates: 0,
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
            if st == JobState::Invalid {
                tracing::info!(file = %path.display(), hash, state = st.name(), "the same content was found invalid before (its error.json says why); not checked again");
            } else {
                tracing::info!(file = %path.display(), hash, state = st.name(), "already searched; not searching the same content again");
            }
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
        Some(JobState::Running | JobState::WaitingForDisk) => {
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
    let (name, result_dir) = provisional(s, path, hash);
    state.store.put(Job {
        hash: hash.to_string(),
        file: path.to_path_buf(),
        name,
        state: JobState::Queued,
        attempts: existing.as_ref().map_or(0, |j| j.attempts),
        interrupted: existing.as_ref().map_or(0, |j| j.interrupted),
        journal_candidates: existing.as_ref().map_or(0, |j| j.journal_candidates),
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
        finished: None,
        problems: None,
    });
    s.wake.notify_one();
    true
}

/// Whether the file at `path` holds the content `hash`.
fn holds(path: &Path, hash: &str) -> bool {
    archplace_spec::read_input(path).is_ok_and(|b| blake3::hash(&b).to_hex().as_str() == hash)
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
    state.retries.retain(|(_, x)| x.hash != hash);
    if let Some(run) = state.running.get_mut(hash) {
        run.reason = Some(why.to_string());
        run.flag.store(true, Ordering::Relaxed);
        tracing::info!(hash, "cancelling: {why}");
        return;
    }
    if state
        .store
        .get(hash)
        .is_some_and(|j| matches!(j.state, JobState::Queued | JobState::WaitingForDisk))
    {
        state
            .store
            .set(hash, JobState::Cancelled, Some(why.to_string()));
    }
}

/// The jobs `waiting_for_disk` whose time has come (if their spec is still wanted): an
/// invalid spec's errors are written here, at once; a search's results are queued for a
/// worker, which writes them without searching again.
pub fn retry_due(s: &Shared) {
    let due: Vec<Queued> = {
        let mut state = s.state();
        let now = Instant::now();
        let (due, later): (Vec<_>, Vec<_>) = state.retries.drain(..).partition(|(t, _)| *t <= now);
        state.retries = later;
        due.into_iter()
            .map(|(_, q)| q)
            .filter(|q| {
                state
                    .store
                    .get(&q.hash)
                    .is_some_and(|j| j.state == JobState::WaitingForDisk)
            })
            .collect()
    };
    for q in due {
        if let Some(problems) = &q.problems {
            let Some(job) = s.state().store.get(&q.hash).cloned() else {
                continue;
            };
            // Outside the state's lock: the file is written, then the job recorded.
            match write_invalid(&job.result_dir, &q.path, problems) {
                Ok(message) => {
                    tracing::info!(file = %q.path.display(), hash = %q.hash, state = "invalid", "its error.json is written now: {message}");
                    let labels = SpecLabels {
                        spec: job.name.clone(),
                        file: file_name(&q.path),
                    };
                    s.state()
                        .store
                        .set(&q.hash, JobState::Invalid, Some(message));
                    s.metrics.search_ended(&labels, "invalid", 0.0);
                }
                Err(why) => wait_for_disk(s, job, q, &why),
            }
            continue;
        }
        let mut state = s.state();
        state
            .store
            .set(&q.hash, JobState::Queued, Some("retrying".into()));
        tracing::info!(hash = %q.hash, "writing the results of a search again");
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
