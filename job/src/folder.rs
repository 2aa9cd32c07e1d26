//! A search's result folder, `<results>/<spec name>/<first 16 hex digits of its hash>/`,
//! and every file in it — this module is their one writer:
//! * `status.json` — live progress while the search runs, its end state after;
//! * `result.json` — the spec's name and content hash, archplace's version, the cost
//!   models, the best configuration and each model's training plan, timings and work
//!   counters ([`crate::result`]); written last, so its presence means the folder is whole;
//! * `explored.jsonl` — one line per evaluated candidate;
//! * `spec.json` — the spec as validated, every default filled in (SI units);
//! * `pareto.svg`, `placement.svg` — pictures of the two ([`crate::plot`]), and
//!   `timeline.svg`, the best plan's step ([`crate::timeline`]);
//! * `error.json` — the located errors of an invalid spec, or why a search failed;
//! * `journal.jsonl` — the checkpoint of a search under way ([`crate::journal`]).
//!
//! Each is written atomically ([`archplace_util::atomic`]).

use crate::plot::{self, PlotError};
use crate::result::{ExploredLine, PoolStatus, ResultDoc};
use crate::run::{Finished, RunError};
use archplace_engine::search::Progress;
use archplace_spec::Spec;
use archplace_util::atomic;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// The file whose presence means the folder is whole.
pub const RESULT: &str = "result.json";

/// The largest `result.json` read back: it holds the best plans and a few near-ties (tens
/// of kilobytes); anything larger is not one archplace wrote.
const MAX_RESULT_BYTES: u64 = 64 << 20;

/// The file of every evaluated candidate, a line each.
pub const EXPLORED: &str = "explored.jsonl";

/// The largest `explored.jsonl` read back: about 1.5 kB a candidate, so room for the
/// largest spaces a search may enumerate.
const MAX_EXPLORED_BYTES: u64 = 8 << 30;

/// Why a result folder could not be read back.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: archplace_util::files::ReadError,
    },
    #[error("{path}, line {line}: not a result archplace wrote: {source}")]
    Format {
        path: PathBuf,
        line: usize,
        source: serde_json::Error,
    },
}

/// The `result.json` and `explored.jsonl` of a finished search's folder.
pub fn read_results(dir: &Path) -> Result<(ResultDoc, Vec<ExploredLine>), ReadError> {
    let read = |name: &str, cap: u64| {
        let path = dir.join(name);
        archplace_util::files::read_regular(&path, cap)
            .map_err(|source| ReadError::Io { path, source })
    };
    let format = |name: &str, line: usize, source| ReadError::Format {
        path: dir.join(name),
        line,
        source,
    };
    let doc: ResultDoc = serde_json::from_slice(&read(RESULT, MAX_RESULT_BYTES)?)
        .map_err(|e| format(RESULT, e.line(), e))?;
    let bytes = read(EXPLORED, MAX_EXPLORED_BYTES)?;
    let explored = bytes
        .split(|&b| b == b'\n')
        .enumerate()
        .filter(|(_, l)| !l.is_empty())
        .map(|(k, l)| serde_json::from_slice(l).map_err(|e| format(EXPLORED, k + 1, e)))
        .collect::<Result<Vec<ExploredLine>, _>>()?;
    Ok((doc, explored))
}

/// The default result folder of a spec: `<root>/<name>/<first 16 hex digits of its hash>`.
pub fn result_dir(root: &Path, spec: &Spec) -> PathBuf {
    root.join(&spec.name)
        .join(&spec.content_hash[..16.min(spec.content_hash.len())])
}

/// The pictures of a finished search: `pareto.svg`, `placement.svg` and, when the step
/// model prices its best plan, `timeline.svg` (that plan's step, one lane per stage).
pub fn plots(finished: &Finished) -> Result<Vec<(&'static str, String)>, PlotError> {
    let o = &finished.outcome;
    let title = &finished.doc.spec.name;
    let pareto = plot::pareto_svg(&plot::ParetoInput {
        title,
        explored: &o.explored,
        best: o
            .best
            .as_ref()
            .and_then(|b| o.explored.iter().position(|e| e.index == b.index)),
        reference: Some(finished.reference),
        budget_um2: finished.space.budget_um2,
        colour_by: finished.spec.space.plot_colour_by,
    })?;
    let placement = match &finished.doc.best {
        Some(b) => plot::placement_svg(
            title,
            &crate::chip::short(&b.configuration.chip),
            &b.models,
            b.hbm_bytes,
        )?,
        None => plot::placement_svg(title, "no chip", &[], 0)?,
    };
    let mut out = vec![("pareto.svg", pareto), ("placement.svg", placement)];
    if let Some(t) = &finished.timeline {
        out.push(("timeline.svg", crate::timeline::svg(t)));
    }
    Ok(out)
}

/// The `result.json` of `dir` if it holds the complete results of the spec content `hash`:
/// it (written last) names that content and is not the partial result of an interrupted run.
pub fn complete_result(dir: &Path, hash: &str) -> Option<ResultDoc> {
    let bytes = archplace_util::files::read_regular(&dir.join(RESULT), MAX_RESULT_BYTES).ok()?;
    let doc: ResultDoc = serde_json::from_slice(&bytes)
        .inspect_err(|e| tracing::warn!(dir = %dir.display(), error = %e, "unreadable result.json"))
        .ok()?;
    (doc.spec.content_hash == hash && !doc.search.cancelled).then_some(doc)
}

/// Whether `dir` holds the complete results of the spec content `hash`.
pub fn is_complete(dir: &Path, hash: &str) -> bool {
    complete_result(dir, hash).is_some()
}

/// Writes `result.json`, `explored.jsonl` and the plots into `dir` (created if needed),
/// each atomically; `result.json` last, so that its presence means the folder is whole.
pub fn write(dir: &Path, finished: &Finished) -> Result<(), RunError> {
    let err = |path: &Path| {
        let path = path.to_path_buf();
        move |error| RunError::Write { path, error }
    };
    std::fs::create_dir_all(dir).map_err(err(dir))?;
    // Streamed: a line per candidate, never the whole file in memory.
    let path = dir.join(EXPLORED);
    atomic::write_with(&path, |w| {
        for e in &finished.outcome.explored {
            serde_json::to_writer(&mut *w, &ExploredLine::from(e))
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            w.write_all(b"\n")?;
        }
        Ok(())
    })
    .map_err(err(&path))?;
    // The spec as the search read it: every default filled in, every quantity in SI units.
    let path = dir.join("spec.json");
    let spec = serde_json::to_vec_pretty(&finished.spec)
        .map_err(|e| std::io::Error::other(e.to_string()))
        .map_err(err(&path))?;
    atomic::write(&path, &spec).map_err(err(&path))?;
    match plots(finished) {
        Ok(plots) => {
            for (name, svg) in plots {
                let path = dir.join(name);
                atomic::write(&path, svg.as_bytes()).map_err(err(&path))?;
            }
        }
        // A picture that cannot be drawn is a bug, not a reason to lose the results.
        Err(e) => tracing::error!("{e}"),
    }
    let mut doc = serde_json::to_vec_pretty(&finished.doc)
        .map_err(|e| std::io::Error::other(e.to_string()))
        .map_err(err(dir))?;
    doc.push(b'\n');
    let path = dir.join("result.json");
    atomic::write(&path, &doc).map_err(err(&path))?;
    // Complete: the checkpoint has served. A partial result keeps it, to be continued.
    if !finished.doc.search.cancelled {
        crate::journal::remove(dir);
    }
    Ok(())
}

/// The time a search has left if its remaining candidates take as long as the `evaluated`
/// of `total` did in `elapsed_seconds` (an upper bound for a converging or proven search,
/// which stops before the last); `None` before the first.
pub fn eta_seconds(elapsed_seconds: f64, evaluated: usize, total: usize) -> Option<f64> {
    (evaluated > 0)
        .then(|| elapsed_seconds * total.saturating_sub(evaluated) as f64 / evaluated as f64)
}

/// `status.json`: where a search is, while it runs and after.
#[derive(Debug, Serialize)]
pub struct Status<'a> {
    pub state: &'a str,
    pub spec: &'a str,
    pub hash: &'a str,
    pub file: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub candidates_evaluated: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub candidates_total: Option<usize>,
    /// The area bucket the search is in (buckets are `[search] area_bucket` wide, the
    /// largest chips first) and the smallest chip area it holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub area_bucket_index: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub area_bucket_floor_mm2: Option<f64>,
    /// The time left while it runs ([`eta_seconds`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eta_seconds: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub best_throughput_samples_per_second: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub best_area_mm2: Option<f64>,
    /// A pooled search's workers and items (`daemon --nats`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<PoolStatus>,
    pub elapsed_seconds: f64,
}

impl Status<'_> {
    /// Fills in the progress fields from the engine's progress report.
    pub fn with_progress(mut self, p: Option<&Progress>) -> Self {
        self.candidates_evaluated = p.map(|p| p.evaluated);
        self.candidates_total = p.map(|p| p.total);
        self.area_bucket_index = p.map(|p| p.bucket);
        self.area_bucket_floor_mm2 = p.map(|p| p.bucket_area_um2 / 1e6);
        self.eta_seconds = p.and_then(|p| eta_seconds(self.elapsed_seconds, p.evaluated, p.total));
        self.best_throughput_samples_per_second =
            p.and_then(|p| p.best_throughput_samples_per_second);
        self.best_area_mm2 = p.and_then(|p| p.best_area_um2).map(|a| a / 1e6);
        self
    }
}

/// Writes `dir/status.json` (creating `dir`).
pub fn write_status(dir: &Path, status: &Status<'_>) -> std::io::Result<()> {
    let mut bytes = serde_json::to_vec_pretty(status).map_err(std::io::Error::other)?;
    bytes.push(b'\n');
    std::fs::create_dir_all(dir).and_then(|()| atomic::write(&dir.join("status.json"), &bytes))
}

/// Writes `dir/error.json` (creating `dir`): the spec file and its errors (located
/// diagnostics, or one message).
pub fn write_error(dir: &Path, file: &Path, errors: serde_json::Value) -> Result<(), WriteError> {
    let path = dir.join("error.json");
    let doc = serde_json::json!({ "file": file.display().to_string(), "errors": errors });
    let mut bytes = serde_json::to_vec_pretty(&doc).map_err(std::io::Error::other);
    if let Ok(b) = &mut bytes {
        b.push(b'\n');
    }
    bytes
        .and_then(|bytes| std::fs::create_dir_all(dir).and_then(|()| atomic::write(&path, &bytes)))
        .map_err(|source| {
            // Not left behind empty (a full disk): the folder goes again if nothing else is
            // in it.
            let _ = std::fs::remove_dir(dir);
            WriteError { path, source }
        })
}

/// A result-folder file that could not be written.
#[derive(Debug, thiserror::Error)]
#[error("cannot write {}: {source}", path.display())]
pub struct WriteError {
    /// The file.
    pub path: std::path::PathBuf,
    /// Why.
    #[source]
    pub source: std::io::Error,
}
