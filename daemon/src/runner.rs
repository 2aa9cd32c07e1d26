//! One search from a validated spec to its result files: the glue between the spec, the
//! cost models, the engine and the disk. The one-shot CLI and the daemon both use it.
//!
//! Result folder (see the README for every field):
//! * `result.json` — the spec's name and content hash, archplace's version, the cost
//!   models, the best configuration and each model's training plan, timings and work
//!   counters;
//! * `explored.jsonl` — one line per evaluated candidate: its configuration, area, best
//!   throughput and plan (with its time and memory breakdowns), or why it failed;
//! * `spec.json` — the spec as validated, every default filled in (SI units);
//! * `pareto.svg`, `placement.svg` — pictures of the two (see [`crate::plot`]).
//!
//! Each is written atomically.

use crate::cost::{self, CostModelSource, ModelSource};
use crate::journal::{self, Journal};
use crate::pool::Pool;
use crate::pool::coordinator::{Coordinator, Ending, PoolStatus};
use crate::spec::Diagnostic;
use crate::spec::Spec;
use archplace_engine::search::{
    self, Evaluated, ModelInput, ModelPlan, Observer, Outcome, SearchInput, Stats,
};
use archplace_engine::space::{self, Space};
use archplace_engine::step::{MemoryBreakdown, TimeBreakdown};
use archplace_engine::training::{Precision, Recomputation};
use archplace_plugin_sdk::{AcceleratorConfig, ModelInfo};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

/// Version of the result format.
pub const RESULT_FORMAT_VERSION: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The spec's cost models could not be made; located in the spec.
    #[error("cost model: {}", .0.iter().map(|d| d.message.clone()).collect::<Vec<_>>().join("; "))]
    CostModel(Vec<Diagnostic>),
    /// The search may need more memory than its budget; located in the spec.
    #[error("memory: {}", .0.iter().map(|d| d.message.clone()).collect::<Vec<_>>().join("; "))]
    Memory(Vec<Diagnostic>),
    #[error("architecture space: {0}")]
    Space(space::SpaceError),
    #[error("search: {0}")]
    Search(search::SearchError),
    #[error("pool: {0}")]
    Pool(crate::pool::PoolError),
    #[error("cannot write {path}: {error}")]
    Write {
        path: PathBuf,
        error: std::io::Error,
    },
}

// The causes are in the messages, not sources as well: printed as a chain (`{:#}`) they
// would repeat (issue 16).
impl From<space::SpaceError> for RunError {
    fn from(e: space::SpaceError) -> Self {
        RunError::Space(e)
    }
}

impl From<search::SearchError> for RunError {
    fn from(e: search::SearchError) -> Self {
        RunError::Search(e)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SpecRef {
    pub name: String,
    pub content_hash: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CostModels {
    pub area: ModelInfo,
    pub latency: ModelInfo,
    pub area_source: ModelSource,
    pub latency_source: ModelSource,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Configuration {
    /// The chip's axes, as the SDK's record (flattened: `tensor_cores`, `width`, ...).
    #[serde(flatten)]
    pub chip: AcceleratorConfig,
    pub area_mm2: f64,
}

impl Configuration {
    fn new(c: &AcceleratorConfig, area_um2: f64) -> Self {
        Configuration {
            chip: *c,
            area_mm2: area_um2 / 1e6,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Best {
    pub configuration: Configuration,
    pub hbm_bytes: u64,
    /// Mean over the models of their throughput.
    pub mean_throughput_samples_per_second: f64,
    pub models: Vec<ModelPlan>,
}

/// A chip whose mean throughput is within 1% of the best.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NearTie {
    pub configuration: Configuration,
    pub hbm_bytes: u64,
    pub mean_throughput_samples_per_second: f64,
    /// Its throughput relative to the best's (≤ 1).
    pub relative_to_best: f64,
}

/// Relative distance to the best within which a chip is a near-tie.
pub const NEAR_TIE: f64 = 0.01;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SearchSummary {
    pub candidates_in_space: usize,
    pub candidates_evaluated: usize,
    pub candidates_failed: usize,
    pub buckets_visited: usize,
    pub exhaustive: bool,
    pub converged: bool,
    /// Stopped before the end (Ctrl-C in `archplace run`): the result is partial — the best
    /// of the candidates evaluated — and running the same spec again continues it.
    pub cancelled: bool,
    /// Candidates taken from the checkpoint of an interrupted run of the same search (their
    /// results are those of the interrupted run; the work counters count only this run).
    #[serde(default)]
    pub resumed_candidates: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Timings {
    pub total_seconds: f64,
    /// Summed over threads.
    pub estimation_seconds: f64,
    /// Summed over threads.
    pub scheduling_seconds: f64,
    /// Summed over threads.
    pub placement_seconds: f64,
    pub space_enumeration_seconds: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Work {
    pub estimates_computed: u64,
    pub estimate_cache_hits: u64,
    pub layer_schedules: u64,
    /// Settled by bounds: the list schedule met the lower bound.
    pub mips_avoided: u64,
    pub mips_solved: u64,
    /// Answered by the memo of layer schedules: the same instance solved before.
    #[serde(default)]
    pub schedules_reused: u64,
    /// Layer schedules not proven within the spec's `schedule_gap` (their gap is in the
    /// best plan's `layers[]`).
    pub schedules_not_proven_optimal: u64,
    pub mip_time_limit_hits: u64,
    pub placements_solved: u64,
    /// How a pooled search's work was spread (`daemon --nats`); absent on one machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<crate::pool::coordinator::PoolStatus>,
}

/// `result.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ResultDoc {
    pub format_version: u32,
    pub archplace_version: String,
    pub spec: SpecRef,
    pub cost_models: CostModels,
    /// Every parameter of each cost model as it was used: the spec's value, or the model's
    /// default.
    #[serde(default)]
    pub cost_model_parameters: BTreeMap<String, BTreeMap<String, String>>,
    /// `null` when no candidate could train every model.
    pub best: Option<Best>,
    /// Other chips within 1% of the best mean throughput (at most 5, best first): near-ties
    /// are common, and a smaller or simpler one may be preferable.
    #[serde(default)]
    pub near_ties: Vec<NearTie>,
    pub search: SearchSummary,
    pub timings: Timings,
    pub work: Work,
}

/// One line of `explored.jsonl`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExploredLine {
    pub index: usize,
    pub configuration: Configuration,
    pub bucket: u64,
    pub mean_throughput_samples_per_second: Option<f64>,
    pub hbm_bytes: Option<u64>,
    pub plans: Vec<PlanLine>,
    pub failure: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PlanLine {
    pub model: String,
    pub micro_batch: u64,
    pub activation_recomputation: bool,
    #[serde(default)]
    pub recomputation: Recomputation,
    #[serde(default)]
    pub precision: Option<Precision>,
    #[serde(default)]
    pub distributed_optimizer: bool,
    #[serde(default)]
    pub sequence_parallel: bool,
    pub tensor_parallel: u64,
    pub data_parallel: u64,
    pub pipeline_stages: usize,
    #[serde(default = "one")]
    pub pipeline_interleaving: u64,
    pub throughput_samples_per_second: f64,
    pub time_per_batch_seconds: f64,
    #[serde(default)]
    pub time: TimeBreakdown,
    #[serde(default)]
    pub memory_bytes: MemoryBreakdown,
    #[serde(default)]
    pub limiting: String,
}

fn one() -> u64 {
    1
}

impl From<&Evaluated> for ExploredLine {
    fn from(e: &Evaluated) -> Self {
        ExploredLine {
            index: e.index,
            configuration: Configuration::new(&e.config, e.area_um2),
            bucket: e.bucket,
            mean_throughput_samples_per_second: e.mean_throughput_samples_per_second,
            hbm_bytes: e.hbm_bytes,
            plans: e
                .plans
                .iter()
                .map(|p| PlanLine {
                    model: p.model.clone(),
                    micro_batch: p.micro_batch,
                    activation_recomputation: p.activation_recomputation,
                    recomputation: p.recomputation,
                    precision: p.precision,
                    distributed_optimizer: p.distributed_optimizer,
                    sequence_parallel: p.sequence_parallel,
                    tensor_parallel: p.tensor_parallel,
                    data_parallel: p.data_parallel,
                    pipeline_stages: p.pipeline_stages,
                    pipeline_interleaving: p.pipeline_interleaving,
                    throughput_samples_per_second: p.throughput_samples_per_second,
                    time_per_batch_seconds: p.time_per_batch_seconds,
                    time: p.time,
                    memory_bytes: p.memory_bytes,
                    limiting: p.limiting.clone(),
                })
                .collect(),
            failure: e.failure.clone(),
        }
    }
}

/// A finished search.
pub struct Finished {
    pub doc: ResultDoc,
    /// The spec searched (written as `spec.json`).
    pub spec: Spec,
    pub outcome: Outcome,
    pub space: Space,
    /// The reference configuration marked in `pareto.svg`: the area budget's, or the
    /// reference system's largest chip; with its area when it is the budget.
    pub reference: (AcceleratorConfig, Option<f64>),
}

/// The engine's input from a spec.
pub fn search_input(spec: &Spec) -> SearchInput {
    SearchInput {
        models: spec
            .models
            .iter()
            .map(|m| ModelInput {
                config: m.config.clone(),
                baseline: m.baseline,
            })
            .collect(),
        training: spec.training.clone(),
        cluster: spec.cluster.clone(),
        convergence_window: spec.space.convergence_window,
        exhaustive: spec.space.exhaustive,
        schedule: archplace_engine::schedule::Options {
            node_limit: spec.space.schedule_node_limit,
            time_limit_seconds: spec.space.schedule_time_limit_seconds,
            heuristic_only: false,
            relative_gap: spec.space.schedule_gap,
        },
    }
}

/// The space a spec searches, sized with its area model.
pub fn space_of(
    spec: &Spec,
    source: &dyn CostModelSource,
    cancel: &Arc<AtomicBool>,
) -> Result<(Space, cost::CostModels, f64), RunError> {
    let models = crate::spec::resolve_cost_models(spec, source, cancel.clone())
        .map_err(RunError::CostModel)?;
    let t = std::time::Instant::now();
    let space = space::enumerate(&spec.space, models.area.as_ref())?;
    Ok((space, models, t.elapsed().as_secs_f64()))
}

/// An observer that also appends every evaluated candidate to the search's journal.
struct Checkpointed<'a> {
    inner: &'a dyn Observer,
    journal: Mutex<Option<Journal>>,
    /// Candidates evaluated by this run (the rest of the explored ones were resumed).
    evaluated: std::sync::atomic::AtomicUsize,
}

impl Observer for Checkpointed<'_> {
    fn progress(&self, p: &search::Progress) {
        self.inner.progress(p);
    }

    fn schedule(&self, e: &search::ScheduleEvent) {
        self.inner.schedule(e);
    }

    fn placement(&self, seconds: f64) {
        self.inner.placement(seconds);
    }

    fn evaluated(&self, e: &search::Evaluated) {
        self.inner.evaluated(e);
        self.evaluated
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let Ok(mut journal) = self.journal.lock() else {
            return;
        };
        if let Some(j) = journal.as_mut()
            && let Err(err) = j.record(e)
        {
            // The search goes on; only its checkpoint is lost.
            tracing::warn!(error = %err, "cannot append to the search's journal; it will not be resumable");
            *journal = None;
        }
    }
}

/// Runs the search of `spec` with the cost models `source` makes. `observer` hears of
/// every candidate; `cancel` stops it at the next candidate (and a plugin call in flight).
/// With `checkpoint`, the search's journal in that folder is resumed from and appended to
/// (see [`crate::journal`]). With `memory_budget_bytes`, a search whose memory estimate
/// (on the current rayon pool's threads) is above it is refused before it starts.
pub fn run(
    spec: &Spec,
    source: &dyn CostModelSource,
    observer: &dyn Observer,
    cancel: &Arc<AtomicBool>,
    checkpoint: Option<&Path>,
    memory_budget_bytes: Option<u64>,
) -> Result<Finished, RunError> {
    run_pooled(
        spec,
        source,
        observer,
        cancel,
        checkpoint,
        memory_budget_bytes,
        None,
    )
}

/// A search spread over a pool of daemons (see [`crate::pool`]).
pub struct Pooled<'a> {
    pub pool: &'a Pool,
    /// Where the coordinator reports the pool's progress (`status.json`).
    pub status: &'a Mutex<PoolStatus>,
    /// Whether a cancellation is for good (the spec left or changed: the pool drops the
    /// search) rather than the daemon's shutdown (the pool keeps it for the next start).
    pub cancelled_for_good: &'a (dyn Fn() -> bool + Sync),
}

/// [`run`], with the candidates evaluated by a pool's workers when `pooled` is given: the
/// same walk, result and files.
pub fn run_pooled(
    spec: &Spec,
    source: &dyn CostModelSource,
    observer: &dyn Observer,
    cancel: &Arc<AtomicBool>,
    checkpoint: Option<&Path>,
    memory_budget_bytes: Option<u64>,
    pooled: Option<&Pooled>,
) -> Result<Finished, RunError> {
    if let Some(budget) = memory_budget_bytes {
        let e = crate::memory::estimate(spec, source, rayon::current_num_threads());
        crate::memory::check(spec, &e, budget).map_err(RunError::Memory)?;
        tracing::debug!(estimate = %crate::memory::describe(&e), "memory estimate");
    }
    let (space, models, enumeration) = space_of(spec, source, cancel)?;
    let input = search_input(spec);
    let identity = CostModels {
        area: models.area.info(),
        latency: models.latency.info(),
        area_source: models.area_source.clone(),
        latency_source: models.latency_source.clone(),
    };
    let header = journal::Header {
        journal_format: 1,
        content_hash: spec.content_hash.clone(),
        archplace_version: env!("CARGO_PKG_VERSION").to_string(),
        cost_models: serde_json::to_value(&identity).unwrap_or_default(),
    };
    let (journal, done) = match checkpoint.map(|dir| Journal::open(dir, &header)) {
        Some(Ok((j, done))) => (Some(j), done),
        Some(Err(e)) => {
            tracing::warn!(error = %e, "cannot open the search's journal; it will not be resumable");
            (None, BTreeMap::new())
        }
        None => (None, BTreeMap::new()),
    };
    let observer = Checkpointed {
        inner: observer,
        journal: Mutex::new(journal),
        evaluated: Default::default(),
    };
    let outcome = match pooled {
        None => search::search_resuming(
            &input,
            &space,
            models.latency.as_ref(),
            &observer,
            Some(cancel.as_ref()),
            done,
        ),
        Some(p) => {
            let journaled = done.keys().copied().collect();
            let mut coordinator = Coordinator::start(
                p.pool,
                spec,
                &models,
                &space,
                journaled,
                cancel.clone(),
                p.status,
            )
            .map_err(RunError::Pool)?;
            let r = search::search_supplied(
                &input,
                &space,
                models.latency.as_ref(),
                &observer,
                Some(cancel.as_ref()),
                done,
                &mut coordinator,
            );
            coordinator.finish(match &r {
                Ok(o) if o.stats.cancelled && (p.cancelled_for_good)() => Ending::Cancelled,
                Ok(o) if o.stats.cancelled => Ending::Interrupted,
                Ok(_) => Ending::Done,
                Err(_) if cancel.load(std::sync::atomic::Ordering::Relaxed) => {
                    if (p.cancelled_for_good)() {
                        Ending::Cancelled
                    } else {
                        Ending::Interrupted
                    }
                }
                Err(e) => Ending::Failed(e.to_string()),
            });
            r
        }
    }?;
    let resumed_candidates = outcome.explored.len().saturating_sub(
        observer
            .evaluated
            .load(std::sync::atomic::Ordering::Relaxed),
    );
    let s: &Stats = &outcome.stats;
    let doc = ResultDoc {
        format_version: RESULT_FORMAT_VERSION,
        archplace_version: env!("CARGO_PKG_VERSION").to_string(),
        spec: SpecRef {
            name: spec.name.clone(),
            content_hash: spec.content_hash.clone(),
        },
        cost_models: CostModels {
            area: models.area.info(),
            latency: models.latency.info(),
            area_source: models.area_source.clone(),
            latency_source: models.latency_source.clone(),
        },
        cost_model_parameters: parameters_used(spec, &models),
        near_ties: near_ties(&outcome),
        best: outcome.best.as_ref().map(|b| Best {
            configuration: Configuration::new(&b.config, b.area_um2),
            hbm_bytes: b.hbm_bytes.unwrap_or(0),
            mean_throughput_samples_per_second: b.mean_throughput_samples_per_second.unwrap_or(0.0),
            models: b.plans.clone(),
        }),
        search: SearchSummary {
            candidates_in_space: space.candidates.len(),
            candidates_evaluated: s.candidates_evaluated,
            candidates_failed: s.candidates_failed,
            buckets_visited: s.buckets_visited,
            exhaustive: input.exhaustive,
            converged: s.converged,
            cancelled: s.cancelled,
            resumed_candidates,
        },
        timings: Timings {
            total_seconds: s.total_seconds + enumeration,
            estimation_seconds: s.estimation_seconds,
            scheduling_seconds: s.scheduling_seconds,
            placement_seconds: s.placement_seconds,
            space_enumeration_seconds: enumeration,
        },
        work: Work {
            estimates_computed: s.estimates_computed,
            estimate_cache_hits: s.estimate_cache_hits,
            layer_schedules: s.schedules_solved,
            mips_avoided: s.schedules_by_bounds,
            mips_solved: s.schedules_by_mip,
            schedules_reused: s.schedules_reused,
            schedules_not_proven_optimal: s.schedules_not_proven_optimal,
            mip_time_limit_hits: s.mip_time_limit_hits,
            placements_solved: s.placements_solved,
            pool: pooled.and_then(|p| p.status.lock().ok().map(|s| s.clone())),
        },
    };
    if s.mip_time_limit_hits > 0 {
        tracing::warn!(
            hits = s.mip_time_limit_hits,
            "layer-schedule MIPs stopped at the wall-clock safety net: this result depends on the machine's speed and load"
        );
    }
    let reference = match &spec.space.area_budget {
        space::AreaBudget::ReferenceConfig(c) => (*c, Some(space.budget_um2)),
        space::AreaBudget::Um2(_) => (space::REFERENCE_CONFIG, None),
    };
    Ok(Finished {
        doc,
        spec: spec.clone(),
        outcome,
        space,
        reference,
    })
}

/// Each cost model's parameters as used: the spec's values over the model's defaults.
fn parameters_used(
    spec: &Spec,
    models: &cost::CostModels,
) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for info in [models.area.info(), models.latency.info()] {
        let set = spec.cost_model.parameters.get(&info.name);
        let values = info
            .parameters
            .iter()
            .map(|p| {
                let v = set.and_then(|s| s.get(&p.name)).unwrap_or(&p.default);
                (p.name.clone(), v.clone())
            })
            .collect();
        out.insert(info.name.clone(), values);
    }
    out
}

/// The chips other than the best within [`NEAR_TIE`] of its mean throughput, best first.
pub fn near_ties(outcome: &Outcome) -> Vec<NearTie> {
    let Some(best) = &outcome.best else {
        return Vec::new();
    };
    let top = best.mean_throughput_samples_per_second.unwrap_or(0.0);
    let mut ties: Vec<&Evaluated> = outcome
        .explored
        .iter()
        .filter(|e| e.index != best.index)
        .filter(|e| {
            e.mean_throughput_samples_per_second
                .is_some_and(|t| t >= top * (1.0 - NEAR_TIE))
        })
        .collect();
    // Best first; equal throughput: the smaller chip first, then visit order.
    ties.sort_by(|a, b| {
        b.mean_throughput_samples_per_second
            .unwrap_or(0.0)
            .total_cmp(&a.mean_throughput_samples_per_second.unwrap_or(0.0))
            .then(a.area_um2.total_cmp(&b.area_um2))
            .then(a.index.cmp(&b.index))
    });
    ties.into_iter()
        .take(5)
        .map(|e| {
            let t = e.mean_throughput_samples_per_second.unwrap_or(0.0);
            NearTie {
                configuration: Configuration::new(&e.config, e.area_um2),
                hbm_bytes: e.hbm_bytes.unwrap_or(0),
                mean_throughput_samples_per_second: t,
                relative_to_best: if top > 0.0 { t / top } else { 0.0 },
            }
        })
        .collect()
}

/// The default result folder of a spec: `<root>/<name>/<first 16 hex digits of its hash>`.
pub fn result_dir(root: &Path, spec: &Spec) -> PathBuf {
    root.join(&spec.name)
        .join(&spec.content_hash[..16.min(spec.content_hash.len())])
}

/// The two pictures of a finished search: `pareto.svg` and `placement.svg`.
pub fn plots(finished: &Finished) -> Result<[(&'static str, String); 2], crate::plot::PlotError> {
    let o = &finished.outcome;
    let title = &finished.doc.spec.name;
    let pareto = crate::plot::pareto_svg(&crate::plot::ParetoInput {
        title,
        explored: &o.explored,
        best: o
            .best
            .as_ref()
            .and_then(|b| o.explored.iter().position(|e| e.index == b.index)),
        reference: Some(finished.reference),
        budget_um2: finished.space.budget_um2,
    })?;
    let placement = match &finished.doc.best {
        Some(b) => crate::plot::placement_svg(
            title,
            &crate::plot::describe(&b.configuration.chip),
            &b.models,
            b.hbm_bytes,
        )?,
        None => crate::plot::placement_svg(title, "no chip", &[], 0)?,
    };
    Ok([("pareto.svg", pareto), ("placement.svg", placement)])
}

/// The `result.json` of `dir` if it holds the complete results of the spec content `hash`:
/// it (written last) names that content and is not the partial result of an interrupted run.
pub fn complete_result(dir: &Path, hash: &str) -> Option<ResultDoc> {
    let bytes = std::fs::read(dir.join("result.json")).ok()?;
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
    let path = dir.join("explored.jsonl");
    crate::atomic::write_with(&path, |w| {
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
    crate::atomic::write(&path, &spec).map_err(err(&path))?;
    match plots(finished) {
        Ok(plots) => {
            for (name, svg) in plots {
                let path = dir.join(name);
                crate::atomic::write(&path, svg.as_bytes()).map_err(err(&path))?;
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
    crate::atomic::write(&path, &doc).map_err(err(&path))?;
    // Complete: the checkpoint has served. A partial result keeps it, to be continued.
    if !finished.doc.search.cancelled {
        crate::journal::remove(dir);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use archplace_plugin_sdk::EstimateError;

    /// A plugin's error is told once, however the error is printed (issue 16: an area
    /// model's error appeared three times in `error.json` and the log).
    #[test]
    fn a_cost_model_error_is_told_once_in_the_chain() {
        let errors = [
            RunError::from(space::SpaceError::from(EstimateError::Internal(
                "out of memory".into(),
            ))),
            RunError::from(search::SearchError::CostModel(EstimateError::Internal(
                "out of memory".into(),
            ))),
            RunError::Write {
                path: "x".into(),
                error: std::io::Error::other("out of memory"),
            },
        ];
        for e in errors {
            let chain = format!("{:#}", anyhow::Error::from(e).context("the search failed"));
            assert_eq!(chain.matches("out of memory").count(), 1, "{chain}");
        }
    }
}
