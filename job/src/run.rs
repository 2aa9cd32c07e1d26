//! One search from a validated spec to its outcome: the glue between the spec, the cost
//! models and the engine. The one-shot CLI and the daemon both use it, in two steps:
//! [`prepare`] resolves the cost models and checks the memory budget (so that their
//! problems are reported, located in the spec, before anything starts), then
//! [`Prepared::run`] searches — on this machine, or with the candidates evaluated by a
//! [`Distributor`] (the pool) — resuming from and appending to the search's journal.
//! [`crate::folder`] writes the outcome's files.

use crate::journal::{self, Journal};
use crate::memory;
use crate::result::{
    Best, Configuration, CostModels as Identity, ExploredLine, PoolStatus, RESULT_FORMAT_VERSION,
    ResultDoc, SearchSummary, SpecRef, Timings, Work, near_ties,
};
use archplace_cost_port::{CostModelSource, CostModels};
use archplace_engine::search::{
    self, Evaluated, Local, Observer, Outcome, Search, Stats, Strategy, Supplier,
};
use archplace_engine::space::{self, Space};
use archplace_engine::step::timeline::Timeline;
use archplace_plugin_sdk::AcceleratorConfig;
use archplace_spec::{Diagnostic, Spec};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The spec's cost models could not be made; located in the spec.
    #[error("cost model: {}", .0.iter().map(|d| d.message.clone()).collect::<Vec<_>>().join("; "))]
    CostModel(Vec<Diagnostic>),
    /// The search may need more memory than its budget; located in the spec.
    #[error("memory: {}", .0.iter().map(|d| d.message.clone()).collect::<Vec<_>>().join("; "))]
    Memory(Vec<Diagnostic>),
    /// The area budget is beyond what the area model sizes; located in the spec.
    #[error("area: {}", .0.iter().map(|d| d.message.clone()).collect::<Vec<_>>().join("; "))]
    Area(Vec<Diagnostic>),
    /// The calibration could not be applied (unreadable, or made for another plugin).
    #[error("calibration: {0}")]
    Calibration(archplace_spec::calibration::CalibrationError),
    #[error("architecture space: {0}")]
    Space(space::SpaceError),
    #[error("search: {0}")]
    Search(search::SearchError),
    /// The distributor (the pool) could not start the search.
    #[error("pool: {0}")]
    Pool(Box<dyn std::error::Error + Send + Sync>),
    #[error("cannot write {path}: {error}")]
    Write {
        path: PathBuf,
        error: std::io::Error,
    },
}

// The causes are in the messages, not sources as well: printed as a chain (`{:#}`) they
// would repeat.
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
    /// The best plan's step as a timeline (its first model's; `timeline.svg`), when the
    /// step model prices it (not with the reference's memory model).
    pub timeline: Option<Timeline>,
}

/// How a distributed search ended, for the distributor's records.
#[derive(Debug, Clone, PartialEq)]
pub enum Ending {
    Done,
    /// Its spec left or changed: workers stop, items are purged.
    Cancelled,
    Failed(String),
    /// The daemon is shutting down: the search stays in the pool as it is, and is resumed
    /// at the next start.
    Interrupted,
}

/// Evaluates a search's candidates elsewhere: the pool of daemons (`archplace-pool`). The
/// walk, its convergence rule and the result are this crate's and the engine's; the
/// distributor only supplies evaluations ([`Supplier`]), so a distributed result is the
/// single-machine one.
pub trait Distributor: Sync {
    /// Starts supplying the search of `spec` over `space`; `journaled` are the candidates
    /// its journal already holds (not to be evaluated again).
    fn start<'s>(
        &'s self,
        spec: &Spec,
        models: &CostModels,
        space: &'s Space,
        journaled: BTreeSet<usize>,
        cancel: Arc<AtomicBool>,
    ) -> Result<Box<dyn Distribution + 's>, Box<dyn std::error::Error + Send + Sync>>;

    /// Whether a cancellation is for good (the spec left or changed: the distributor drops
    /// the search) rather than the daemon's shutdown (it keeps it for the next start).
    fn cancelled_for_good(&self) -> bool;

    /// How the search's work is spread, for `status.json` and `result.json`.
    fn status(&self) -> Option<PoolStatus>;
}

/// A distributed search under way: the walk's [`Supplier`], told how the search ended.
pub trait Distribution: Supplier {
    fn finish(self: Box<Self>, ending: Ending);
}

/// A search ready to run: its spec, its cost models resolved and its memory estimated
/// within the budget.
pub struct Prepared<'a> {
    /// The spec, with its calibration's values when it has one.
    pub spec: std::borrow::Cow<'a, Spec>,
    pub models: CostModels,
    pub memory: memory::Estimate,
    /// The calibration applied.
    pub calibration: Option<crate::calibrated::Applied>,
    /// The spec as written, its cost models and their source: what the parameters' draws
    /// start from.
    written: (&'a Spec, CostModels, &'a dyn CostModelSource),
    /// The space, when the memory check enumerated it, and the seconds that took.
    space: Option<(Space, f64)>,
}

/// Resolves the cost models of `spec` through `source` (plugin and parameter problems are
/// located in the spec), applies its calibration (`calibration`, else the spec's
/// `[cost_model] calibration`; refused for another plugin or version) and estimates the memory of its search on `threads` threads;
/// with `memory_budget_bytes`, a search above it is refused with the numbers. The one
/// place both checks happen, for `run`, `validate` and the daemon alike.
pub fn prepare<'a>(
    spec: &'a Spec,
    source: &'a dyn CostModelSource,
    threads: usize,
    memory_budget_bytes: Option<u64>,
    cancel: &Arc<AtomicBool>,
    calibration: Option<&Path>,
) -> Result<Prepared<'a>, RunError> {
    let models = archplace_spec::resolve_cost_models(spec, source, cancel.clone())
        .map_err(RunError::CostModel)?;
    let written = (spec, models.clone(), source);
    let (spec, models, calibration) = if crate::calibrated::has_calibration(spec, calibration) {
        let (s, m, a) = crate::calibrated::apply(spec.clone(), models, calibration, source)
            .map_err(RunError::Calibration)?;
        (std::borrow::Cow::Owned(s), m, a)
    } else {
        (std::borrow::Cow::Borrowed(spec), models, None)
    };
    let spec_ref: &Spec = &spec;
    let mut estimate = memory::estimate(spec_ref, source, threads);
    // Whether enumerating the space (the search needs it anyway) fits the budget.
    let enumeration_fits = memory_budget_bytes.is_none_or(|b| {
        estimate
            .engine
            .space_bytes
            .saturating_add(estimate.cost_models_bytes)
            <= b
    });
    let mut space = None;
    if let Some(budget) = memory_budget_bytes {
        // The first estimate counts every configuration of the axes a candidate; the area
        // filter usually leaves far fewer. Above the budget, and if enumerating fits it,
        // the space is enumerated and its candidates counted.
        if estimate.total_bytes > budget && enumeration_fits {
            let (s, seconds) = located(spec_ref, enumerated(spec_ref, &models))?;
            estimate =
                memory::estimate_for(spec_ref, source, threads, Some(s.candidates.len() as u64));
            space = Some((s, seconds));
        }
        memory::check(spec_ref, &estimate, budget).map_err(RunError::Memory)?;
    }
    // An area budget in mm² may lie beyond what the area model sizes: the space is
    // enumerated to know, when that fits the budget.
    if matches!(spec_ref.space.area_budget, space::AreaBudget::Um2(_)) {
        if space.is_none() && enumeration_fits {
            space = Some(located(spec_ref, enumerated(spec_ref, &models))?);
        }
        if let Some((s, _)) = &space {
            area_in_range(spec_ref, &models, s).map_err(RunError::Area)?;
        }
    } else if let Err(e @ space::SpaceError::BudgetOutOfDomain(_)) =
        space::budget_um2(&spec_ref.space, models.area.as_ref())
    {
        // The budget's own chip, sized at once (one call): a chip the model cannot size
        // is the spec's mistake, located, not the search's failure later.
        located(spec_ref, Err(RunError::Space(e)))?;
    }
    tracing::debug!(estimate = %memory::describe(&estimate), "memory estimate");
    Ok(Prepared {
        spec,
        models,
        memory: estimate,
        calibration,
        written,
        space,
    })
}

/// The space's problems that are the area budget's, located at it: a reference
/// configuration the area model cannot size.
fn located<T>(spec: &Spec, r: Result<T, RunError>) -> Result<T, RunError> {
    match r {
        Err(RunError::Space(e @ space::SpaceError::BudgetOutOfDomain(_))) => {
            Err(RunError::Area(vec![spec.diagnostic_at(
                &["search", "area_budget"],
                e.to_string(),
                Some("give a reference configuration the area model sizes, or an area".into()),
            )]))
        }
        other => other,
    }
}

/// The largest chip the area model says it sizes: its `max_area` parameter (an area), as
/// the spec sets it or by default — the convention by which an area model declares its
/// range (`gpu-like`'s reticle); `None` for a model without one.
fn declared_max_area_um2(spec: &Spec, models: &CostModels) -> Option<f64> {
    let info = models.area.info();
    let default = info.parameters.iter().find(|p| p.name == "max_area")?;
    let value = spec
        .cost_model
        .parameters
        .get(&info.name)
        .and_then(|set| set.get("max_area"))
        .unwrap_or(&default.default);
    archplace_plugin_sdk::units::parse_area_um2(value).ok()
}

/// An area budget beyond the area model's range, with configurations of the space the
/// model could not size, is refused with both numbers: the search would silently leave
/// them out and find nothing between the largest chip the model sizes and the budget
/// (half of `pareto.svg` empty). The range is the one the model declares (`max_area`),
/// else the largest chip it sized in this space. (A budget above every configuration, all
/// sized, only does not bind: accepted.)
fn area_in_range(spec: &Spec, models: &CostModels, s: &Space) -> Result<(), Vec<Diagnostic>> {
    if s.out_of_domain == 0 {
        return Ok(());
    }
    let mm2 = |um2: f64| {
        format!(
            "{} mm²",
            archplace_plugin_sdk::text::significant(um2 / 1e6, 4)
        )
    };
    let plugin = &models.area_source.plugin;
    let (limit, why) = match declared_max_area_um2(spec, models) {
        Some(max) => (
            max,
            format!("it sizes chips up to {} (its `max_area`)", mm2(max)),
        ),
        None => (
            s.max_priced_um2,
            format!(
                "the largest chip it sizes in this space is {}, and {} of the {} configurations are outside its domain",
                mm2(s.max_priced_um2),
                archplace_plugin_sdk::text::thousands(s.out_of_domain as u64),
                archplace_plugin_sdk::text::thousands(s.enumerated as u64),
            ),
        ),
    };
    if s.budget_um2 <= limit {
        return Ok(());
    }
    let message = format!(
        "the area budget, {}, is beyond the range of the area model `{plugin}`: {why} — nothing between {} and the budget can be searched",
        mm2(s.budget_um2),
        mm2(limit),
    );
    let help = format!(
        "lower `area_budget` to at most {}, or use an area model that sizes larger chips",
        mm2(limit)
    );
    Err(vec![spec.diagnostic_at(
        &["search", "area_budget"],
        message,
        Some(help),
    )])
}

/// What a run reports to and is steered by.
pub struct Steering<'a> {
    /// Hears of every candidate.
    pub observer: &'a dyn Observer,
    /// Stops the search at its next candidate (and a plugin call in flight).
    pub cancel: &'a Arc<AtomicBool>,
    /// The result folder whose journal is resumed from and appended to (see
    /// [`crate::journal`]).
    pub checkpoint: Option<&'a Path>,
    /// Evaluates the candidates elsewhere (the pool); `None` on this machine.
    pub distributor: Option<&'a dyn Distributor>,
}

/// An observer that also appends every evaluated candidate to the search's journal.
struct Checkpointed<'a> {
    inner: &'a dyn Observer,
    journal: Mutex<Option<Journal>>,
    /// Candidates evaluated by this run (the rest of the explored ones were resumed).
    evaluated: AtomicUsize,
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

    fn bounded(&self, done: usize, total: usize) {
        self.inner.bounded(done, total);
    }

    fn evaluated(&self, e: &search::Evaluated) {
        self.inner.evaluated(e);
        self.evaluated.fetch_add(1, Ordering::Relaxed);
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

impl Prepared<'_> {
    /// The space's candidates, when the memory check enumerated it.
    pub fn enumerated_candidates(&self) -> Option<usize> {
        self.space.as_ref().map(|(s, _)| s.candidates.len())
    }

    /// The cost models' identity, as `result.json` and the journal record it.
    fn identity(&self) -> Identity {
        Identity {
            area: self.models.area.info(),
            latency: self.models.latency.info(),
            area_source: self.models.area_source.clone(),
            latency_source: self.models.latency_source.clone(),
            calibration: self.calibration.clone(),
        }
    }

    /// The journal of `checkpoint` (if any) and the candidates it already holds.
    fn open_journal(
        &self,
        checkpoint: Option<&Path>,
        identity: &Identity,
    ) -> (Option<Journal>, BTreeMap<usize, Evaluated>) {
        let header = journal::Header {
            journal_format: 1,
            content_hash: self.spec.content_hash.clone(),
            archplace_version: env!("CARGO_PKG_VERSION").to_string(),
            cost_models: serde_json::to_value(identity).unwrap_or_default(),
        };
        match checkpoint.map(|dir| Journal::open(dir, &header)) {
            Some(Ok((j, done))) => (Some(j), done),
            Some(Err(e)) => {
                tracing::warn!(error = %e, "cannot open the search's journal; it will not be resumable");
                (None, BTreeMap::new())
            }
            None => (None, BTreeMap::new()),
        }
    }

    /// Searches: the space enumerated with the area model, the walk on this machine or
    /// through `steering.distributor`, the outcome as `result.json`'s record.
    pub fn run(mut self, steering: Steering<'_>) -> Result<Finished, RunError> {
        let (space, enumeration) = match self.space.take() {
            Some(s) => s,
            None => enumerated(&self.spec, &self.models)?,
        };
        let spec: &Spec = &self.spec;
        let identity = self.identity();
        let (journal, done) = self.open_journal(steering.checkpoint, &identity);
        let observer = Checkpointed {
            inner: steering.observer,
            journal: Mutex::new(journal),
            evaluated: AtomicUsize::new(0),
        };
        let outcome = self.walk(&space, &observer, &steering, done)?;
        let resumed = outcome
            .explored
            .len()
            .saturating_sub(observer.evaluated.load(Ordering::Relaxed));
        let facts = RunFacts {
            enumeration_seconds: enumeration,
            resumed_candidates: resumed,
            pool: steering.distributor.and_then(|d| d.status()),
        };
        let mut doc = self.document(identity, &space, &outcome, facts);
        if !outcome.stats.cancelled {
            let (written, models, source) = &self.written;
            match crate::calibrated::search_uncertainty(
                written,
                models,
                self.calibration.as_ref(),
                *source,
                &outcome,
                &space,
            ) {
                Ok(u) => doc.uncertainty = u,
                Err(e) => {
                    tracing::warn!(error = %e, "the search's uncertainty could not be estimated")
                }
            }
        }
        if outcome.stats.mip_time_limit_hits > 0 {
            tracing::warn!(
                hits = outcome.stats.mip_time_limit_hits,
                "layer-schedule MIPs stopped at the wall-clock safety net: this result depends on the machine's speed and load"
            );
        }
        let reference = match &spec.space.area_budget {
            space::AreaBudget::ReferenceConfig(c) => (*c, Some(space.budget_um2)),
            space::AreaBudget::Um2(_) => (space::REFERENCE_CONFIG, None),
        };
        let timeline = if outcome.stats.cancelled {
            None
        } else {
            crate::timeline::of_best(spec, &doc, self.models.latency.as_ref())
        };
        Ok(Finished {
            doc,
            spec: spec.clone(),
            outcome,
            space,
            reference,
            timeline,
        })
    }

    /// The walk alone, through `steering.distributor`, without a journal or a result: what
    /// a daemon carrying on another's pooled search runs (its coordinator writes the result
    /// from the answers the walk leaves in the pool).
    pub fn walk_only(mut self, steering: Steering<'_>) -> Result<Outcome, RunError> {
        let (space, _) = match self.space.take() {
            Some(s) => s,
            None => enumerated(&self.spec, &self.models)?,
        };
        self.walk(&space, steering.observer, &steering, BTreeMap::new())
    }

    /// The area-ordered walk, here or supplied by the distributor.
    fn walk(
        &self,
        space: &Space,
        observer: &dyn Observer,
        steering: &Steering<'_>,
        done: BTreeMap<usize, Evaluated>,
    ) -> Result<Outcome, RunError> {
        let input = self.spec.search_input();
        let cancel = steering.cancel;
        let search = Search {
            input: &input,
            space,
            latency: self.models.latency.as_ref(),
            observer,
            cancel: Some(cancel),
        };
        let Some(d) = steering.distributor else {
            return Ok(search.run(done, &mut Local)?);
        };
        let journaled = done.keys().copied().collect();
        let mut supplier = d
            .start(&self.spec, &self.models, space, journaled, cancel.clone())
            .map_err(RunError::Pool)?;
        let r = search.run(done, supplier.as_mut());
        supplier.finish(match &r {
            Ok(o) if o.stats.cancelled && d.cancelled_for_good() => Ending::Cancelled,
            Ok(o) if o.stats.cancelled => Ending::Interrupted,
            Ok(_) => Ending::Done,
            Err(_) if cancel.load(Ordering::Relaxed) => {
                if d.cancelled_for_good() {
                    Ending::Cancelled
                } else {
                    Ending::Interrupted
                }
            }
            Err(e) => Ending::Failed(e.to_string()),
        });
        Ok(r?)
    }

    /// `result.json`'s record of `outcome`.
    fn document(
        &self,
        identity: Identity,
        space: &Space,
        outcome: &Outcome,
        facts: RunFacts,
    ) -> ResultDoc {
        let RunFacts {
            enumeration_seconds,
            resumed_candidates,
            pool,
        } = facts;
        let spec: &Spec = &self.spec;
        let s: &Stats = &outcome.stats;
        let mut doc = ResultDoc {
            format_version: RESULT_FORMAT_VERSION,
            archplace_version: env!("CARGO_PKG_VERSION").to_string(),
            spec: SpecRef {
                name: spec.name.clone(),
                content_hash: spec.content_hash.clone(),
                stack: spec.stack.clone(),
                devices: spec.cluster.devices,
                network: Some(spec.cluster.network),
            },
            cost_models: identity,
            cost_model_parameters: parameters_used(spec, &self.models),
            near_ties: near_ties(outcome),
            best: outcome.best.as_ref().map(|b| Best {
                configuration: Configuration::new(&b.config, b.area_um2),
                hbm_bytes: b.hbm_bytes.unwrap_or(0),
                node_size: b.node_size,
                mean_throughput_samples_per_second: b
                    .mean_throughput_samples_per_second
                    .unwrap_or(0.0),
                models: b.plans.clone(),
            }),
            search: SearchSummary {
                candidates_in_space: space.candidates.len(),
                candidates_evaluated: s.candidates_evaluated,
                candidates_failed: s.candidates_failed,
                buckets_visited: s.buckets_visited,
                strategy: spec.space.strategy,
                exhaustive: spec.space.strategy == Strategy::Exhaustive,
                converged: s.converged,
                proven: s.proven || (spec.space.strategy == Strategy::Exhaustive && !s.cancelled),
                candidates_bounded: s.candidates_bounded,
                candidates_bounded_exactly: s.candidates_bounded_exactly,
                candidates_failed_bound: s.candidates_failed_bound,
                candidates_pruned: s.candidates_pruned,
                largest_remaining_bound_samples_per_second: s
                    .largest_remaining_bound_samples_per_second,
                cancelled: s.cancelled,
                resumed_candidates,
            },
            timings: Timings {
                total_seconds: s.total_seconds + enumeration_seconds,
                estimation_seconds: s.estimation_seconds,
                scheduling_seconds: s.scheduling_seconds,
                placement_seconds: s.placement_seconds,
                space_enumeration_seconds: enumeration_seconds,
                bound_seconds: s.bound_seconds,
            },
            work: Work {
                estimates_computed: s.estimates_computed,
                estimate_cache_hits: s.estimate_cache_hits,
                layer_schedules: s.schedules_solved,
                mips_avoided: s.schedules_by_bounds,
                mips_solved: s.schedules_by_mip,
                mips_reused: s.schedules_by_mip_reused,
                schedules_reused: s.schedules_reused,
                schedules_not_proven_optimal: s.schedules_not_proven_optimal,
                mip_time_limit_hits: s.mip_time_limit_hits,
                placements_solved: s.placements_solved,
                pool,
            },
            explanation: None,
            scale_up_domains: crate::domains::compare(outcome),
            uncertainty: None,
        };
        if let Some(best) = &outcome.best {
            let lines: Vec<ExploredLine> = crate::explain::needed(&best.config, &outcome.explored)
                .into_iter()
                .map(|k| ExploredLine::from(&outcome.explored[k]))
                .collect();
            doc.explanation = doc
                .best
                .as_ref()
                .and_then(|b| crate::explain::explain(b, doc.spec.network.as_ref(), &lines));
        }
        doc
    }
}

/// What a run adds to `result.json` besides its outcome.
struct RunFacts {
    enumeration_seconds: f64,
    /// Candidates taken from the journal of an interrupted run.
    resumed_candidates: usize,
    /// How the pool spread the work (a distributed search).
    pool: Option<PoolStatus>,
}

/// Each cost model's parameters as used: the spec's values over the model's defaults.
/// `spec`'s space enumerated with the area model, and the seconds that took.
fn enumerated(spec: &Spec, models: &CostModels) -> Result<(Space, f64), RunError> {
    let t = std::time::Instant::now();
    let s = space::enumerate(&spec.space, models.area.as_ref())?;
    Ok((s, t.elapsed().as_secs_f64()))
}

fn parameters_used(spec: &Spec, models: &CostModels) -> BTreeMap<String, BTreeMap<String, String>> {
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

#[cfg(test)]
mod cost_models;

#[cfg(test)]
mod tests {
    use super::*;
    use archplace_plugin_sdk::EstimateError;

    /// A plugin's error is told once, however the error is printed (an area model's error
    /// once appeared three times in `error.json` and the log).
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
