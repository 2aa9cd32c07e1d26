//! The co-search (design doc §1.2, §4.5): which accelerator, and which training plan on it.
//!
//! Candidates are visited in the space's order (area buckets, largest first). Each
//! candidate is evaluated at every micro-batch size, tensor-parallel width, HBM size and
//! recomputation choice: its distinct layers (embedding, block, head; forward and
//! backward) are scheduled once per (micro-batch, width) — a schedule depends only on the
//! layer and the core configurations, so it serves every HBM size and recomputation
//! choice — and placed over the devices for each recomputation choice, every HBM size in
//! one run of the placement program (a stage's load does not depend on the HBM size). A
//! candidate's score is, over HBM sizes, the best mean over models of each model's best
//! throughput; a model that fits nowhere fails the candidate at that HBM size.
//!
//! The walk stops by the reference's rule — the best scores of the last
//! `convergence_window` buckets did not increase — except that a bucket in which every
//! candidate failed is not evidence of convergence (it is skipped); `exhaustive` visits
//! everything. Work inside a candidate runs on all threads (rayon) and is combined in a
//! fixed order, so the result does not depend on the thread count. Two candidates of the
//! same throughput (within [`TIE_RELATIVE`]) go to the smaller chip, then to the one
//! visited first.

use super::estimate::estimate;
use super::model::{BuildOptions, LayerKind, ModelConfig, ModelGraph, OpGraph, build};
use super::placement::{
    self, Chain, Edge, Fixed, Layer as ChainLayer, MegatronMemory, MemoryRule, Plan, Resync,
    Settings,
};
use super::schedule::{self, Instance, Method};
use super::space::{Candidate, Space};
use super::step::{MemoryBreakdown, TimeBreakdown};
use super::training::{
    Baseline, Cluster, MemoryModel, Precision, Recomputation, StateBytes, Training,
};
use archplace_plugin_sdk::{
    AcceleratorConfig, CoreConfig, EstimateError, LatencyModel, Op, OpCost,
};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

pub mod memory;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::Instant;

fn one() -> u64 {
    1
}

/// A model to train and its optional baseline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelInput {
    pub config: ModelConfig,
    pub baseline: Option<Baseline>,
}

/// Everything the search needs, validated.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SearchInput {
    pub models: Vec<ModelInput>,
    pub training: Training,
    pub cluster: Cluster,
    pub convergence_window: u32,
    pub exhaustive: bool,
    /// How layer schedules are solved (MIP time limit, accepted gap).
    pub schedule: schedule::Options,
}

/// The stages of a plan, with the layers they hold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageReport {
    /// First and last layer, e.g. "embedding", "block 11", "head".
    pub first_layer: String,
    pub last_layer: String,
    pub layers: usize,
    pub devices: u64,
    pub load_seconds: f64,
    pub memory_bytes: f64,
}

/// Timing of one distinct layer on the chosen chip.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayerReport {
    pub layer: LayerKind,
    pub count: u64,
    pub forward_seconds: f64,
    pub backward_seconds: f64,
    pub forward_tensor_utilisation: f64,
    pub forward_vector_utilisation: f64,
    pub backward_tensor_utilisation: f64,
    pub backward_vector_utilisation: f64,
    /// Whether each schedule is proven optimal, and its relative gap to the best bound
    /// (0 when proven).
    pub forward_proven_optimal: bool,
    pub forward_gap: f64,
    pub backward_proven_optimal: bool,
    pub backward_gap: f64,
}

/// One model's best plan on a candidate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelPlan {
    pub model: String,
    pub micro_batch: u64,
    /// Whether anything is recomputed (`recomputation` says what).
    pub activation_recomputation: bool,
    #[serde(default)]
    pub recomputation: Recomputation,
    /// The numeric format (the Megatron memory model; `None` with the reference's).
    #[serde(default)]
    pub precision: Option<Precision>,
    #[serde(default)]
    pub distributed_optimizer: bool,
    /// Sequence parallelism (only with a tensor-parallel width above 1).
    #[serde(default)]
    pub sequence_parallel: bool,
    pub tensor_parallel: u64,
    pub data_parallel: u64,
    pub pipeline_stages: usize,
    /// Model chunks per device: 1 for plain 1F1B, more for interleaved 1F1B (its stages
    /// then list each device's layers as one range; they run as that many equal chunks).
    #[serde(default = "one")]
    pub pipeline_interleaving: u64,
    pub time_per_batch_seconds: f64,
    pub gradient_all_reduce_seconds: f64,
    pub throughput_samples_per_second: f64,
    pub throughput_tokens_per_second: f64,
    pub stages: Vec<StageReport>,
    /// Where the time per batch goes on the slowest stage (the parts add up to
    /// `time_per_batch_seconds`; the search has no optimizer-step term).
    #[serde(default)]
    pub time: TimeBreakdown,
    /// Memory per device of the most loaded stage.
    #[serde(default)]
    pub memory_bytes: MemoryBreakdown,
    /// The largest part of the time.
    #[serde(default)]
    pub limiting: String,
    pub layers: Vec<LayerReport>,
    /// The baseline strategy on the same chip, HBM, micro-batch and recomputation.
    pub baseline: Option<BaselineReport>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BaselineReport {
    pub pipeline: u64,
    pub data: u64,
    pub tensor: u64,
    /// `None` when the baseline does not fit; `infeasible` says why.
    pub throughput_samples_per_second: Option<f64>,
    pub time_per_batch_seconds: Option<f64>,
    pub infeasible: Option<String>,
}

/// What became of one candidate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Evaluated {
    pub index: usize,
    pub config: AcceleratorConfig,
    pub area_um2: f64,
    pub bucket: u64,
    /// Mean throughput over the models at the best HBM size; `None` if it failed.
    pub mean_throughput_samples_per_second: Option<f64>,
    pub hbm_bytes: Option<u64>,
    pub plans: Vec<ModelPlan>,
    pub failure: Option<String>,
}

impl Evaluated {
    /// Drops what only the best candidate's report needs (each plan's stages and layers),
    /// keeping what `explored.jsonl`, the plots and the walk use: a search keeps every
    /// candidate's record, so this is its memory per candidate.
    pub fn summarise(&mut self) {
        for p in &mut self.plans {
            p.stages = Vec::new();
            p.layers = Vec::new();
        }
    }

    /// Whether the record was summarised (a plan always has a stage).
    pub fn is_summary(&self) -> bool {
        self.plans.iter().any(|p| p.stages.is_empty())
    }
}

/// Counters of the work done.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Stats {
    pub candidates_evaluated: usize,
    pub candidates_failed: usize,
    pub buckets_visited: usize,
    pub converged: bool,
    pub cancelled: bool,
    pub estimates_computed: u64,
    pub estimate_cache_hits: u64,
    /// Layer schedules the search used: settled by bounds, by a MIP, or reused.
    pub schedules_solved: u64,
    pub schedules_by_bounds: u64,
    /// Layer schedules whose instance (operator durations, cores, dependencies) had been
    /// solved before, on this candidate or a recent one: the earlier solution, reused.
    #[serde(default)]
    pub schedules_reused: u64,
    pub schedules_by_mip: u64,
    /// Layer schedules not proven within the accepted gap (`schedule::Options::relative_gap`,
    /// the spec's `schedule_gap`): those the MIP's node limit stopped further from the bound.
    pub schedules_not_proven_optimal: u64,
    pub mip_time_limit_hits: u64,
    pub placements_solved: u64,
    pub estimation_seconds: f64,
    pub scheduling_seconds: f64,
    pub placement_seconds: f64,
    pub total_seconds: f64,
}

/// The search's answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    pub best: Option<Evaluated>,
    pub explored: Vec<Evaluated>,
    pub stats: Stats,
}

/// Progress as the search goes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Progress {
    pub evaluated: usize,
    /// Candidates in the space (the search may stop before).
    pub total: usize,
    pub bucket: u64,
    /// Smallest area of the current bucket (the bucket's index × the bucket size).
    pub bucket_area_um2: f64,
    pub best_throughput_samples_per_second: Option<f64>,
    pub best_area_um2: Option<f64>,
    /// Operator estimates asked of the latency model so far, and those the memo answered.
    pub estimates_computed: u64,
    pub estimate_cache_hits: u64,
}

/// One layer schedule, as the search settled it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ScheduleEvent {
    pub method: Method,
    /// Bounds, list schedule and (for [`Method::Mip`]) the MIP.
    pub solve_seconds: f64,
    pub hit_time_limit: bool,
    pub proven_optimal: bool,
}

/// Hears how the search goes, for progress displays and metrics. `progress` is called
/// from the searching thread after each candidate; the work events from the worker
/// threads as each piece of work ends (so they must be cheap).
pub trait Observer: Sync {
    fn progress(&self, _p: &Progress) {}
    /// A layer schedule was settled.
    fn schedule(&self, _e: &ScheduleEvent) {}
    /// One run of the placement program (one model, micro-batch and recomputation
    /// setting; every HBM size and width) took `seconds`.
    fn placement(&self, _seconds: f64) {}
    /// A candidate was evaluated (not called for those a resumed search reuses): what a
    /// checkpoint of the search records.
    fn evaluated(&self, _e: &Evaluated) {}
}

impl Observer for () {}

#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    #[error("the latency model failed: {0}")]
    CostModel(EstimateError),
    #[error("the space is empty: no candidate fits the area budget")]
    EmptySpace,
    /// A [`Supplier`] could not supply a candidate (a pool worker's cost model failed, or
    /// the pool answered something else than the candidate asked for).
    #[error("{0}")]
    Supplier(String),
}

impl Stats {
    /// Adds the work counters and timings of `other` (work done elsewhere for this
    /// search: by a pool's workers). The walk's own counts (candidates, buckets,
    /// convergence) are not work and are left alone.
    pub fn add_work(&mut self, other: &Stats) {
        self.estimates_computed += other.estimates_computed;
        self.estimate_cache_hits += other.estimate_cache_hits;
        self.schedules_solved += other.schedules_solved;
        self.schedules_by_bounds += other.schedules_by_bounds;
        self.schedules_reused += other.schedules_reused;
        self.schedules_by_mip += other.schedules_by_mip;
        self.schedules_not_proven_optimal += other.schedules_not_proven_optimal;
        self.mip_time_limit_hits += other.mip_time_limit_hits;
        self.placements_solved += other.placements_solved;
        self.estimation_seconds += other.estimation_seconds;
        self.scheduling_seconds += other.scheduling_seconds;
        self.placement_seconds += other.placement_seconds;
    }

    /// The work counters and timings done since `before`, an earlier snapshot of the same
    /// counters (what a pool's worker reports per item): the inverse of [`Stats::add_work`],
    /// over the same fields; the walk's counts are zero.
    pub fn work_since(&self, before: &Stats) -> Stats {
        Stats {
            estimates_computed: self.estimates_computed - before.estimates_computed,
            estimate_cache_hits: self.estimate_cache_hits - before.estimate_cache_hits,
            schedules_solved: self.schedules_solved - before.schedules_solved,
            schedules_by_bounds: self.schedules_by_bounds - before.schedules_by_bounds,
            schedules_reused: self.schedules_reused - before.schedules_reused,
            schedules_by_mip: self.schedules_by_mip - before.schedules_by_mip,
            schedules_not_proven_optimal: self.schedules_not_proven_optimal
                - before.schedules_not_proven_optimal,
            mip_time_limit_hits: self.mip_time_limit_hits - before.mip_time_limit_hits,
            placements_solved: self.placements_solved - before.placements_solved,
            estimation_seconds: self.estimation_seconds - before.estimation_seconds,
            scheduling_seconds: self.scheduling_seconds - before.scheduling_seconds,
            placement_seconds: self.placement_seconds - before.placement_seconds,
            ..Stats::default()
        }
    }
}

/// Where the walk gets evaluations computed elsewhere: a pool of workers (the daemon's
/// `pool`). The walk asks for candidates in its order, one at a time, and stops by its
/// own rule; a supplier that evaluates ahead (look-ahead) learns where the walk is from
/// the indices it is asked for. Because an evaluation depends only on the candidate, the
/// spec and the cost models, a supplied one is the one the walk would have computed, so
/// the outcome is the same as a search on one machine.
pub trait Supplier {
    /// The evaluation of candidate `index` (`candidate`), waiting for it if it is being
    /// computed; `None` to evaluate it here. An error fails the search — unless the search
    /// was cancelled meanwhile, in which case it is the cancellation's.
    fn supply(
        &mut self,
        index: usize,
        candidate: &Candidate,
    ) -> Result<Option<Evaluated>, SearchError>;

    /// The work done elsewhere so far, added to the outcome's counters.
    fn work(&self) -> Stats {
        Stats::default()
    }
}

/// The supplier of a search on one machine: every candidate is evaluated here.
pub struct Local;

impl Supplier for Local {
    fn supply(&mut self, _: usize, _: &Candidate) -> Result<Option<Evaluated>, SearchError> {
        Ok(None)
    }
}

/// Evaluates candidates of one search, keeping the search's memos (estimates, layer
/// schedules) from one call to the next: what a pool's worker holds for each search it
/// serves. [`search`] uses one inside; the evaluation of a candidate is the same whichever
/// evaluator makes it and whatever it evaluated before.
pub struct Evaluator<'a> {
    ctx: Ctx<'a>,
}

impl<'a> Evaluator<'a> {
    pub fn new(
        input: &'a SearchInput,
        latency: &'a dyn LatencyModel,
        observer: &'a dyn Observer,
    ) -> Evaluator<'a> {
        Evaluator {
            ctx: Ctx::new(input, latency, observer),
        }
    }

    /// An evaluator that also asks `shared` for layer schedules its own memo lacks, and
    /// tells it of those it solves: a pool's workers share their schedules this way, as
    /// one machine's search shares them between candidates.
    pub fn with_shared(
        input: &'a SearchInput,
        latency: &'a dyn LatencyModel,
        observer: &'a dyn Observer,
        shared: &'a dyn SharedSchedules,
    ) -> Evaluator<'a> {
        let mut ctx = Ctx::new(input, latency, observer);
        ctx.shared = Some(shared);
        Evaluator { ctx }
    }

    /// Evaluates candidate `index` of the space. A candidate outside the latency model's
    /// domain is a failed evaluation (`failure`), not an error; an error is the model's.
    pub fn evaluate(&self, index: usize, candidate: &Candidate) -> Result<Evaluated, SearchError> {
        self.ctx.evaluate(index, candidate)
    }

    /// The work counters and timings so far (the walk's counts are zero).
    pub fn work(&self) -> Stats {
        let mut stats = self.ctx.stats.lock().map(|s| s.clone()).unwrap_or_default();
        stats.estimates_computed = self.ctx.estimator.computed.load(Ordering::Relaxed);
        stats.estimate_cache_hits = self.ctx.estimator.hits.load(Ordering::Relaxed);
        stats
    }
}

/// Durations of a layer graph's operators on a candidate, from the latency model through
/// the shared memo.
struct Estimator<'a> {
    model: &'a dyn LatencyModel,
    execution: crate::execution::Execution,
    cache: RwLock<HashMap<(CoreConfig, Op), OpCost>>,
    computed: AtomicU64,
    hits: AtomicU64,
}

impl Estimator<'_> {
    fn cost(&self, core: &CoreConfig, op: &Op) -> Result<OpCost, EstimateError> {
        let key = (*core, op.clone());
        if let Some(c) = self
            .cache
            .read()
            .map_err(|_| EstimateError::Internal("estimate cache poisoned".into()))?
            .get(&key)
        {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(*c);
        }
        let c = estimate(self.model, core, std::slice::from_ref(op))?[0];
        self.computed.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut w) = self.cache.write() {
            w.insert(key, c);
        }
        Ok(c)
    }

    /// The layer's schedule instance on `c`. Operators not yet memoised are estimated
    /// first, in one batched call per core configuration: a plugin call costs far more
    /// than an operator in a batch.
    fn instance(&self, graph: &OpGraph, c: &AcceleratorConfig) -> Result<Instance, EstimateError> {
        let mut missing: BTreeMap<CoreConfig, Vec<Op>> = BTreeMap::new();
        {
            let cache = self
                .cache
                .read()
                .map_err(|_| EstimateError::Internal("estimate cache poisoned".into()))?;
            let zero = OpCost {
                seconds: 0.0,
                joules: 0.0,
            };
            let _ = super::layer::instance_with(graph, c, self.execution, |core, op| {
                if !cache.contains_key(&(*core, op.clone())) {
                    missing.entry(*core).or_default().push(op.clone());
                }
                Ok(zero)
            });
        }
        let mut fetched = 0;
        for (core, mut ops) in missing {
            ops.sort();
            ops.dedup();
            let costs = estimate(self.model, &core, &ops)?;
            fetched += ops.len() as u64;
            if let Ok(mut w) = self.cache.write() {
                for (op, cost) in ops.into_iter().zip(costs) {
                    w.insert((core, op), cost);
                }
            }
        }
        self.computed.fetch_add(fetched, Ordering::Relaxed);
        let inst =
            super::layer::instance_with(graph, c, self.execution, |core, op| self.cost(core, op));
        // The second pass found the prefetched operators in the memo: not hits.
        self.hits.fetch_sub(
            fetched.min(self.hits.load(Ordering::Relaxed)),
            Ordering::Relaxed,
        );
        inst
    }
}

/// A scheduled layer: forward and backward seconds and utilisations.
#[derive(Debug, Clone, Copy)]
struct Timed {
    fwd: Scheduled,
    bwd: Scheduled,
}

/// What the search keeps of one layer schedule.
#[derive(Debug, Clone, Copy)]
struct Scheduled {
    seconds: f64,
    /// Of the operators' durations (all cores), the attention core's: what selective
    /// recomputation runs again.
    core_seconds: f64,
    /// Of the makespan, the link operators' durations (tensor-parallel collectives).
    link_seconds: f64,
    /// Tensor- and vector-core utilisation.
    util: (f64, f64),
    optimal: bool,
    gap: f64,
}

/// A layer schedule's solution, as far as the search uses it: what a memo of schedules
/// (the search's own, or a pool's [`SharedSchedules`]) keeps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Solved {
    pub makespan: f64,
    /// Busy fractions of the tensor and vector cores.
    pub util: (f64, f64),
    pub optimal: bool,
    pub gap: f64,
}

/// Layer schedules solved elsewhere for the same search (a pool's other workers), asked
/// after the search's own memo misses and told of every schedule solved here. A key is an
/// instance's exact content (see `ScheduleMemo`); the solver options are the search's, so
/// an implementation shared between searches must tell them apart. The solver is
/// deterministic (node limits), so an answer from elsewhere is the one solving would
/// give; schedules the wall-clock safety net stopped are never put.
pub trait SharedSchedules: Sync {
    /// The known solutions of `keys`, in order (`None`: not known, or not reachable).
    fn get(&self, keys: &[&[u64]]) -> Vec<Option<Solved>>;
    /// Schedules just solved here.
    fn put(&self, solved: &[(&[u64], Solved)]);
}

/// Layer schedules already solved, by their instance's exact content (cores, each
/// operator's resource and durations, the dependencies): candidates that differ in what a
/// layer's operators do not feel — chips of one area whose MAC arrays are `256 × 64` and
/// `128 × 128`, say — and the layers of one candidate that come out the same at several
/// widths share a schedule (17% of the GPT-3 example search's). Bounded: two generations
/// of [`ScheduleMemo::GENERATION`] instances, the older dropped when the newer fills — the
/// search visits chips of one area together, so the reuse is among recent ones. The solver
/// is deterministic (node limits), so a reused schedule is the one solving again would
/// give.
#[derive(Default)]
pub(crate) struct ScheduleMemo {
    generations: Mutex<[HashMap<Vec<u64>, Solved>; 2]>,
}

impl ScheduleMemo {
    /// Instances per generation.
    pub(crate) const GENERATION: usize = 2048;

    /// The instance's exact content as words.
    fn key(inst: &Instance) -> Vec<u64> {
        let mut key = Vec::with_capacity(3 + 3 * inst.tasks.len() + inst.edges.len());
        key.extend([
            u64::from(inst.tensor_cores),
            u64::from(inst.vector_cores),
            inst.tasks.len() as u64,
        ]);
        for t in &inst.tasks {
            key.extend([t.resource as u64, t.single.to_bits(), t.parallel.to_bits()]);
        }
        key.extend(
            inst.edges
                .iter()
                .map(|&(a, b)| ((a as u64) << 32) | b as u64),
        );
        key
    }

    fn get(&self, key: &[u64]) -> Option<Solved> {
        let g = self.generations.lock().ok()?;
        g[0].get(key).or_else(|| g[1].get(key)).copied()
    }

    fn insert(&self, key: Vec<u64>, solved: Solved) {
        if let Ok(mut g) = self.generations.lock() {
            if g[0].len() >= Self::GENERATION {
                g[1] = std::mem::take(&mut g[0]);
            }
            g[0].insert(key, solved);
        }
    }
}

struct Ctx<'a> {
    input: &'a SearchInput,
    memo: ScheduleMemo,
    /// graphs[model][(micro_batch, width, element bytes)]
    graphs: Vec<HashMap<GraphKey, ModelGraph>>,
    estimator: Estimator<'a>,
    stats: Mutex<Stats>,
    observer: &'a dyn Observer,
    shared: Option<&'a dyn SharedSchedules>,
}

impl<'a> Ctx<'a> {
    fn new(
        input: &'a SearchInput,
        latency: &'a dyn LatencyModel,
        observer: &'a dyn Observer,
    ) -> Self {
        Ctx {
            input,
            graphs: layer_graphs(input),
            estimator: Estimator {
                model: latency,
                execution: input.training.execution,
                cache: RwLock::new(HashMap::new()),
                computed: AtomicU64::new(0),
                hits: AtomicU64::new(0),
            },
            stats: Mutex::new(Stats::default()),
            observer,
            memo: ScheduleMemo::default(),
            shared: None,
        }
    }
}

/// A model's graph is built per (micro-batch, tensor-parallel width, element bytes,
/// sequence parallelism — only ever true with a width above 1).
pub(crate) type GraphKey = (u64, u64, u64, bool);

/// One placement problem of a candidate: HBM size, model, micro-batch, recomputation,
/// precision (index into the training's list) and distributed optimizer.
#[derive(Debug, Clone, Copy)]
struct Run {
    hbm: usize,
    model: usize,
    micro_batch: u64,
    recompute: Recomputation,
    precision: usize,
    distributed: bool,
    /// Sequence parallelism for the widths above 1.
    sequence_parallel: bool,
}

impl Training {
    /// Sequence-parallelism choices worth a separate run.
    fn sequence_parallel_choices(&self) -> Vec<bool> {
        if self.sequence_parallel.is_empty() {
            vec![false]
        } else {
            self.sequence_parallel.clone()
        }
    }

    /// The precision at `index` of the list (bf16 mixed if the list is empty).
    fn precision(&self, index: usize) -> Precision {
        self.precisions
            .get(index)
            .copied()
            .unwrap_or(Precision::Bf16Mixed)
    }

    /// Element bytes of the graphs for the precision at `index` of the list.
    fn element_bytes(&self, precision: usize) -> u64 {
        match self.memory_model {
            MemoryModel::Reference => self.bytes_per_element,
            MemoryModel::Megatron => self.precision(precision).element_bytes(),
        }
    }

    /// Indices into `precisions` worth a separate run: all with the Megatron model, one
    /// with the reference's (which ignores precision).
    fn precision_indices(&self) -> std::ops::Range<usize> {
        match self.memory_model {
            MemoryModel::Reference => 0..1,
            MemoryModel::Megatron => 0..self.precisions.len().max(1),
        }
    }

    /// Distributed-optimizer choices worth a separate run.
    fn distributed_choices(&self) -> Vec<bool> {
        match self.memory_model {
            MemoryModel::Reference => vec![false],
            MemoryModel::Megatron if self.distributed_optimizer.is_empty() => vec![false],
            MemoryModel::Megatron => self.distributed_optimizer.clone(),
        }
    }
}

fn layer_name(index: usize, blocks: u64) -> String {
    if index == 0 {
        "embedding".into()
    } else if index as u64 <= blocks {
        format!("block {}", index - 1)
    } else {
        "head".into()
    }
}

/// Why a layer could not be scheduled on a candidate.
enum JobError {
    /// The candidate is outside the latency model's domain: it fails, the search goes on.
    Infeasible(String),
    /// The latency model itself failed: the search fails.
    Model(EstimateError),
}

impl From<EstimateError> for JobError {
    fn from(e: EstimateError) -> Self {
        match e {
            EstimateError::OutOfDomain(why) => {
                JobError::Infeasible(format!("latency model: {why}"))
            }
            other => JobError::Model(other),
        }
    }
}

impl Ctx<'_> {
    /// `graph`'s schedule instance on `c`, timed as estimation.
    fn instance(&self, graph: &OpGraph, c: &AcceleratorConfig) -> Result<Instance, JobError> {
        let t0 = Instant::now();
        let inst = self.estimator.instance(graph, c)?;
        if let Ok(mut st) = self.stats.lock() {
            st.estimation_seconds += t0.elapsed().as_secs_f64();
        }
        Ok(inst)
    }

    /// Solves one layer schedule; whether the wall-clock safety net stopped it.
    fn solve(&self, inst: &Instance) -> Result<(Solved, bool), JobError> {
        let t1 = Instant::now();
        let s = schedule::solve(inst, &self.input.schedule)
            .map_err(|e| JobError::Infeasible(format!("layer schedule: {e}")))?;
        let t2 = Instant::now();
        if (t2 - t1).as_secs_f64() > 0.25 {
            tracing::debug!(
                seconds = (t2 - t1).as_secs_f64(),
                optimal = s.optimal,
                gap = s.gap,
                instance = %serde_json::to_string(inst).unwrap_or_default(),
                "slow layer schedule"
            );
        }
        if let Ok(mut st) = self.stats.lock() {
            st.scheduling_seconds += (t2 - t1).as_secs_f64();
            match s.method {
                Method::Bounds => st.schedules_by_bounds += 1,
                Method::Mip => st.schedules_by_mip += 1,
            }
            st.mip_time_limit_hits += u64::from(s.hit_time_limit);
        }
        self.observer.schedule(&ScheduleEvent {
            method: s.method,
            solve_seconds: s.solve_seconds,
            hit_time_limit: s.hit_time_limit,
            proven_optimal: s.optimal,
        });
        let solved = Solved {
            makespan: s.makespan,
            util: s.utilisation(inst),
            optimal: s.optimal,
            gap: s.gap,
        };
        Ok((solved, s.hit_time_limit))
    }

    /// Every layer schedule of a candidate: `graphs` on `c`, in order. Instances first (in
    /// parallel), then each distinct one not in the memo solved once (in parallel), and
    /// the memo updated in order — so what is reused, and the counts, do not depend on
    /// the threads.
    fn schedules(
        &self,
        graphs: &[&OpGraph],
        c: &AcceleratorConfig,
    ) -> Result<Vec<Scheduled>, JobError> {
        let instances: Vec<Instance> = graphs
            .par_iter()
            .map(|g| self.instance(g, c))
            .collect::<Vec<_>>()
            .into_iter()
            .collect::<Result<_, _>>()?;
        let keys: Vec<Vec<u64>> = instances.iter().map(ScheduleMemo::key).collect();
        // Per layer: its solution from the memo, or the index of the layer that solves it.
        let mut known: Vec<Result<Solved, usize>> = Vec::with_capacity(keys.len());
        let mut todo: Vec<usize> = Vec::new();
        let mut first: HashMap<&[u64], usize> = HashMap::new();
        for (k, key) in keys.iter().enumerate() {
            if let Some(solved) = self.memo.get(key) {
                known.push(Ok(solved));
            } else if let Some(&by) = first.get(key.as_slice()) {
                known.push(Err(by));
            } else {
                first.insert(key, k);
                todo.push(k);
                known.push(Err(k));
            }
        }
        let mut by_layer: HashMap<usize, Solved> = HashMap::new();
        // What the search's memo lacks, asked of the pool's (in the same fixed order).
        if let Some(shared) = self.shared
            && !todo.is_empty()
        {
            let asked: Vec<&[u64]> = todo.iter().map(|&k| keys[k].as_slice()).collect();
            let found = shared.get(&asked);
            let mut still = Vec::with_capacity(todo.len());
            for (&k, f) in todo
                .iter()
                .zip(found.into_iter().chain(std::iter::repeat(None)))
            {
                match f {
                    Some(s) => {
                        by_layer.insert(k, s);
                        self.memo.insert(keys[k].clone(), s);
                    }
                    None => still.push(k),
                }
            }
            todo = still;
        }
        let solved: Vec<(Solved, bool)> = todo
            .par_iter()
            .map(|&k| self.solve(&instances[k]))
            .collect::<Vec<_>>()
            .into_iter()
            .collect::<Result<_, _>>()?;
        let mut new: Vec<(&[u64], Solved)> = Vec::new();
        for (&k, &(s, hit_time_limit)) in todo.iter().zip(&solved) {
            by_layer.insert(k, s);
            // A schedule the wall-clock safety net stopped depends on the machine: solved
            // again, not reused.
            if !hit_time_limit {
                self.memo.insert(keys[k].clone(), s);
                new.push((keys[k].as_slice(), s));
            }
        }
        if let Some(shared) = self.shared
            && !new.is_empty()
        {
            shared.put(&new);
        }
        let mut out = Vec::with_capacity(graphs.len());
        let (mut not_proven, gap) = (0, self.input.schedule.relative_gap);
        for ((g, inst), known) in graphs.iter().zip(&instances).zip(known) {
            let s = match known {
                Ok(s) => s,
                Err(k) => by_layer[&k],
            };
            not_proven += u64::from(!s.optimal && s.gap > gap);
            out.push(self.scheduled(g, inst, s));
        }
        if let Ok(mut st) = self.stats.lock() {
            st.schedules_solved += graphs.len() as u64;
            st.schedules_reused += (graphs.len() - todo.len()) as u64;
            st.schedules_not_proven_optimal += not_proven;
        }
        Ok(out)
    }

    /// What the search keeps of the schedule `solved` of `graph`'s instance `inst`.
    fn scheduled(&self, graph: &OpGraph, inst: &Instance, solved: Solved) -> Scheduled {
        let core_seconds = graph
            .nodes
            .iter()
            .zip(&inst.tasks)
            .filter(|(n, _)| n.is_attention_core())
            .map(|(_, t)| t.parallel)
            .sum();
        let link_seconds = inst
            .tasks
            .iter()
            .filter(|t| t.resource == schedule::Resource::Link)
            .map(|t| t.parallel)
            .sum();
        Scheduled {
            seconds: solved.makespan,
            core_seconds,
            link_seconds,
            util: solved.util,
            optimal: solved.optimal,
            gap: solved.gap,
        }
    }

    /// The chain of `g`. With the Megatron memory model each layer keeps what
    /// recomputation `r` keeps and its backward includes the recomputation; with the
    /// reference's, the placement program handles (full) recomputation itself.
    fn chain(&self, g: &ModelGraph, times: &[Timed; 3], r: Recomputation) -> Chain {
        let t = g.tensor_parallel;
        let megatron = self.input.training.memory_model == MemoryModel::Megatron;
        let mut layers = Vec::new();
        for (i, l) in g.layers().enumerate() {
            let timed = match l.kind {
                LayerKind::Embedding => times[0],
                LayerKind::Block => times[1],
                LayerKind::Head => times[2],
            };
            let (activation_bytes, again) = if megatron && l.kind == LayerKind::Block {
                let again = match r {
                    Recomputation::None => 0.0,
                    Recomputation::Selective => timed.fwd.core_seconds,
                    Recomputation::Full => timed.fwd.seconds,
                };
                (l.kept_bytes(r), again)
            } else {
                (l.stash_bytes, 0.0)
            };
            layers.push(ChainLayer {
                id: i as i64,
                parameter_bytes: l.parameter_bytes as f64,
                activation_bytes: activation_bytes as f64,
                forward: timed.fwd.seconds,
                backward: timed.bwd.seconds + again,
                tensor_parallel: l.tensor_parallel && t > 1,
            });
        }
        let outputs: Vec<u64> = g.layers().map(|l| l.output_bytes).collect();
        let edges = (1..layers.len())
            .map(|v| Edge {
                from: v - 1,
                to: v,
                bytes: outputs[v - 1] as f64,
            })
            .collect();
        Chain {
            width: t,
            layers,
            edges,
        }
    }

    fn settings(&self, run: &Run, g: &ModelGraph) -> Settings {
        let tr = &self.input.training;
        let (recompute, memory) = match tr.memory_model {
            MemoryModel::Reference => (
                run.recompute != Recomputation::None,
                MemoryRule::Reference {
                    optimizer_copies: tr.optimizer.reference_copies(),
                },
            ),
            MemoryModel::Megatron => {
                let precision = tr.precision(run.precision);
                let e = precision.element_bytes() as f64;
                let state = StateBytes::megatron(precision, tr.optimizer, false, 1);
                let sync = if run.distributed {
                    state.gradients + state.weights
                } else {
                    2.0 * state.gradients
                };
                let transient = if run.recompute == Recomputation::None {
                    0.0
                } else {
                    (g.block.stash_bytes - g.block.kept_bytes(run.recompute)) as f64
                };
                (
                    false,
                    MemoryRule::Megatron(MegatronMemory {
                        replicated_per_parameter_byte: (state.weights + state.gradients) / e,
                        optimizer_per_parameter_byte: state.optimizer / e,
                        distributed: run.distributed,
                        transient_bytes: transient,
                        sync_per_parameter_byte: sync / e,
                    }),
                )
            }
        };
        Settings {
            memory_bytes: self.input.cluster.hbm_bytes[run.hbm] as f64,
            devices: self.input.cluster.devices,
            bandwidth: self.input.cluster.link_bytes_per_second,
            micro_batches: tr.global_batch / run.micro_batch,
            recompute,
            memory,
            resync: Resync::LargestStage,
        }
    }

    /// Evaluates one candidate.
    fn evaluate(&self, index: usize, cand: &Candidate) -> Result<Evaluated, SearchError> {
        let c = &cand.config;
        let fail = |why: String| Evaluated {
            index,
            config: *c,
            area_um2: cand.area_um2,
            bucket: cand.bucket,
            mean_throughput_samples_per_second: None,
            hbm_bytes: None,
            plans: Vec::new(),
            failure: Some(why),
        };
        // 1. Schedule every distinct layer at every (micro-batch, width).
        let mut jobs: Vec<(usize, GraphKey)> = Vec::new();
        for (m, graphs) in self.graphs.iter().enumerate() {
            let mut keys: Vec<&GraphKey> = graphs.keys().collect();
            keys.sort();
            jobs.extend(keys.into_iter().map(|&key| (m, key)));
        }
        let layer_graphs: Vec<&OpGraph> = jobs
            .iter()
            .flat_map(|(m, key)| {
                let g = &self.graphs[*m][key];
                [&g.embedding, &g.block, &g.head]
            })
            .flat_map(|l| [&l.forward, &l.backward])
            .collect();
        let scheduled = match self.schedules(&layer_graphs, c) {
            Ok(s) => s,
            Err(JobError::Infeasible(why)) => return Ok(fail(why)),
            Err(JobError::Model(e)) => return Err(SearchError::CostModel(e)),
        };
        let mut times: HashMap<(usize, GraphKey), [Timed; 3]> = HashMap::new();
        for (job, s) in jobs.iter().zip(scheduled.chunks_exact(6)) {
            let timed = |l: usize| Timed {
                fwd: s[2 * l],
                bwd: s[2 * l + 1],
            };
            times.insert(*job, [timed(0), timed(1), timed(2)]);
        }
        // 2. Place: every (model, micro-batch, recomputation, precision, distributed
        // optimizer, sequence parallelism), all widths and HBM sizes at once.
        let tr = &self.input.training;
        let hbm_sizes = &self.input.cluster.hbm_bytes;
        let memory_bytes: Vec<f64> = hbm_sizes.iter().map(|&b| b as f64).collect();
        let mut groups: Vec<Run> = Vec::new();
        for model in 0..self.graphs.len() {
            for &micro_batch in &tr.micro_batch_sizes {
                for &recompute in &tr.activation_recomputation {
                    for precision in tr.precision_indices() {
                        for distributed in tr.distributed_choices() {
                            for sequence_parallel in tr.sequence_parallel_choices() {
                                groups.push(Run {
                                    hbm: 0,
                                    model,
                                    micro_batch,
                                    recompute,
                                    precision,
                                    distributed,
                                    sequence_parallel,
                                });
                            }
                        }
                    }
                }
            }
        }
        let t0 = Instant::now();
        // Per group: its chains (one per width) and its best plan at each HBM size.
        type Placed = (Vec<Chain>, Vec<Option<Plan>>);
        let placed: Vec<Placed> = groups
            .par_iter()
            .map(|run| {
                let (m, b, e) = (run.model, run.micro_batch, tr.element_bytes(run.precision));
                let mut keys: Vec<GraphKey> = self.graphs[m]
                    .keys()
                    .filter(|k| k.0 == b && k.2 == e && k.3 == (run.sequence_parallel && k.1 > 1))
                    .copied()
                    .collect();
                keys.sort_unstable();
                let chains: Vec<Chain> = keys
                    .iter()
                    .map(|key| self.chain(&self.graphs[m][key], &times[&(m, *key)], run.recompute))
                    .collect();
                // Each width has its own settings (what recomputation rematerialises
                // depends on it); the best plan over widths, ties to the narrowest.
                let t = Instant::now();
                let mut plans: Vec<Option<Plan>> = vec![None; hbm_sizes.len()];
                let mut keep = |h: usize, p: Plan| {
                    if plans[h]
                        .as_ref()
                        .is_none_or(|b| p.time_per_batch < b.time_per_batch)
                    {
                        plans[h] = Some(p);
                    }
                };
                for (key, chain) in keys.iter().zip(&chains) {
                    let graph = &self.graphs[m][key];
                    let settings = self.settings(run, graph);
                    let one = std::slice::from_ref(chain);
                    if let Ok(each) = placement::best_plans(one, &settings, &memory_bytes) {
                        for (h, p) in each.into_iter().enumerate() {
                            if let Some(p) = p {
                                keep(h, p);
                            }
                        }
                    }
                    // Interleaved 1F1B: equal chunks, its own evaluation.
                    for &v in tr.pipeline_interleaving.iter().filter(|&&v| v > 1) {
                        for (h, &memory) in memory_bytes.iter().enumerate() {
                            let at = Settings {
                                memory_bytes: memory,
                                ..settings.clone()
                            };
                            if let Ok(Some(p)) =
                                placement::best_interleaved(one, &at, v, graph.blocks as usize)
                            {
                                keep(h, p);
                            }
                        }
                    }
                }
                self.observer.placement(t.elapsed().as_secs_f64());
                (chains, plans)
            })
            .collect();
        // Every (HBM size, group) as a run of its own, HBM size first (the order in which
        // ties go to the first).
        let mut runs: Vec<Run> = Vec::new();
        let mut plans: Vec<Option<(&Plan, &[Chain])>> = Vec::new();
        for h in 0..hbm_sizes.len() {
            for (run, (chains, each)) in groups.iter().zip(&placed) {
                runs.push(Run { hbm: h, ..*run });
                plans.push(each[h].as_ref().map(|p| (p, chains.as_slice())));
            }
        }
        if let Ok(mut st) = self.stats.lock() {
            st.placement_seconds += t0.elapsed().as_secs_f64();
            st.placements_solved += runs.len() as u64;
        }
        // 3. Per HBM size: each model's best plan; the mean over models.
        // (mean throughput, HBM index, per model: (run index, plan, its chains))
        type Choice<'p> = (f64, usize, Vec<(usize, &'p Plan, &'p [Chain])>);
        let mut best: Option<Choice> = None;
        let mut why_not = String::new();
        for h in 0..self.input.cluster.hbm_bytes.len() {
            let mut chosen = Vec::new();
            let mut sum = 0.0;
            for m in 0..self.graphs.len() {
                let pick = runs
                    .iter()
                    .zip(&plans)
                    .enumerate()
                    .filter(|(_, (run, _))| run.hbm == h && run.model == m)
                    .filter_map(|(k, (_, p))| p.map(|(plan, chains)| (k, plan, chains)))
                    .min_by(|a, b| {
                        a.1.time_per_batch
                            .total_cmp(&b.1.time_per_batch)
                            .then(a.0.cmp(&b.0))
                    });
                match pick {
                    Some(p) => {
                        sum += tr.global_batch as f64 / p.1.time_per_batch;
                        chosen.push(p);
                    }
                    None => {
                        why_not = format!(
                            "{} does not fit in {} of HBM with any micro-batch, width or placement",
                            self.input.models[m].config.name,
                            archplace_plugin_sdk::units::format_bytes(
                                self.input.cluster.hbm_bytes[h]
                            )
                        );
                        chosen.clear();
                        break;
                    }
                }
            }
            if chosen.len() == self.graphs.len() {
                let mean = sum / self.graphs.len() as f64;
                if best.as_ref().is_none_or(|b| mean > b.0) {
                    best = Some((mean, h, chosen));
                }
            }
        }
        let Some((mean, h, chosen)) = best else {
            return Ok(fail(why_not));
        };
        let reports = chosen
            .into_iter()
            .map(|(k, plan, chains)| self.report(&runs[k], plan, chains, &times))
            .collect();
        Ok(Evaluated {
            index,
            config: *c,
            area_um2: cand.area_um2,
            bucket: cand.bucket,
            mean_throughput_samples_per_second: Some(mean),
            hbm_bytes: Some(self.input.cluster.hbm_bytes[h]),
            plans: reports,
            failure: None,
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn report(
        &self,
        run: &Run,
        plan: &Plan,
        chains: &[Chain],
        times: &HashMap<(usize, GraphKey), [Timed; 3]>,
    ) -> ModelPlan {
        let (m, b) = (run.model, run.micro_batch);
        let model = &self.input.models[m];
        let t = plan.tensor_parallel;
        let tr = &self.input.training;
        let key = (
            b,
            t,
            tr.element_bytes(run.precision),
            run.sequence_parallel && t > 1,
        );
        let g = &self.graphs[m][&key];
        let throughput = tr.global_batch as f64 / plan.time_per_batch;
        let stages = plan
            .stages
            .iter()
            .map(|s| StageReport {
                first_layer: layer_name(s.start, g.blocks),
                last_layer: layer_name(s.end - 1, g.blocks),
                layers: s.end - s.start,
                devices: s.devices,
                load_seconds: s.load,
                memory_bytes: s.memory_bytes,
            })
            .collect();
        let tm = &times[&(m, key)];
        let layers = [
            (LayerKind::Embedding, 1),
            (LayerKind::Block, g.blocks),
            (LayerKind::Head, 1),
        ]
        .iter()
        .enumerate()
        .map(|(k, &(layer, count))| LayerReport {
            layer,
            count,
            forward_seconds: tm[k].fwd.seconds,
            backward_seconds: tm[k].bwd.seconds,
            forward_tensor_utilisation: tm[k].fwd.util.0,
            forward_vector_utilisation: tm[k].fwd.util.1,
            backward_tensor_utilisation: tm[k].bwd.util.0,
            backward_vector_utilisation: tm[k].bwd.util.1,
            forward_proven_optimal: tm[k].fwd.optimal,
            forward_gap: tm[k].fwd.gap,
            backward_proven_optimal: tm[k].bwd.optimal,
            backward_gap: tm[k].bwd.gap,
        })
        .collect();
        let baseline = model.baseline.map(|bl| {
            // Settings of the baseline's width (if the model has it; otherwise the fixed
            // evaluation reports the missing width).
            let width_graph = self.graphs[m]
                .get(&(b, bl.tensor, key.2, run.sequence_parallel && bl.tensor > 1))
                .unwrap_or(g);
            let settings = self.settings(run, width_graph);
            let fixed = Fixed {
                pipeline: bl.pipeline,
                tensor: bl.tensor,
                data: bl.data,
                transformer_layers: model.config.layers,
            };
            match placement::evaluate_fixed(chains, &settings, &fixed) {
                Ok(p) => BaselineReport {
                    pipeline: bl.pipeline,
                    data: bl.data,
                    tensor: bl.tensor,
                    throughput_samples_per_second: Some(tr.global_batch as f64 / p.time_per_batch),
                    time_per_batch_seconds: Some(p.time_per_batch),
                    infeasible: None,
                },
                Err(e) => BaselineReport {
                    pipeline: bl.pipeline,
                    data: bl.data,
                    tensor: bl.tensor,
                    throughput_samples_per_second: None,
                    time_per_batch_seconds: None,
                    infeasible: Some(e.to_string()),
                },
            }
        });
        let (time, memory_bytes) = self.breakdown(run, plan, g, &times[&(m, key)]);
        ModelPlan {
            model: model.config.name.clone(),
            micro_batch: b,
            activation_recomputation: run.recompute != Recomputation::None,
            recomputation: run.recompute,
            precision: match tr.memory_model {
                MemoryModel::Megatron => Some(tr.precision(run.precision)),
                MemoryModel::Reference => None,
            },
            distributed_optimizer: run.distributed,
            sequence_parallel: run.sequence_parallel && t > 1,
            tensor_parallel: t,
            data_parallel: plan.data_parallel,
            pipeline_stages: plan.stages.len(),
            pipeline_interleaving: plan.interleaving,
            time_per_batch_seconds: plan.time_per_batch,
            gradient_all_reduce_seconds: plan.resync_time,
            throughput_samples_per_second: throughput,
            throughput_tokens_per_second: throughput * model.config.seq_len as f64,
            stages,
            limiting: time.limiting().to_string(),
            time,
            memory_bytes,
            layers,
            baseline,
        }
    }

    /// The time and memory breakdowns of a placed plan: the slowest stage's load split into
    /// its layers' compute, tensor-parallel link time and recomputation, the rest of it
    /// (boundary transfers and waits) as point-to-point; the most loaded stage's memory
    /// split by the memory rule.
    fn breakdown(
        &self,
        run: &Run,
        plan: &Plan,
        g: &ModelGraph,
        tm: &[Timed; 3],
    ) -> (TimeBreakdown, MemoryBreakdown) {
        let tr = &self.input.training;
        let megatron = tr.memory_model == MemoryModel::Megatron;
        let d = plan.data_parallel.max(1);
        let m = (tr.global_batch / run.micro_batch).div_ceil(d) as f64;
        let count = plan.stages.len();
        let mut time = TimeBreakdown {
            data_parallel_communication_seconds: plan.resync_time,
            ..TimeBreakdown::default()
        };
        if let Some((k, slow)) = plan
            .stages
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.load.total_cmp(&b.1.load))
        {
            let from_end = count - k;
            let (mut f, mut bw, mut r, mut tp) = (0.0, 0.0, 0.0, 0.0);
            for i in slow.start..slow.end {
                let (kind, timed) = if i == 0 {
                    (LayerKind::Embedding, tm[0])
                } else if i as u64 <= g.blocks {
                    (LayerKind::Block, tm[1])
                } else {
                    (LayerKind::Head, tm[2])
                };
                f += timed.fwd.seconds - timed.fwd.link_seconds;
                bw += timed.bwd.seconds - timed.bwd.link_seconds;
                tp += timed.fwd.link_seconds + timed.bwd.link_seconds;
                let block = kind == LayerKind::Block;
                match (megatron, run.recompute) {
                    (_, Recomputation::None) => {}
                    (true, Recomputation::Selective) if block => r += timed.fwd.core_seconds,
                    (true, Recomputation::Full) if block => {
                        r += timed.fwd.seconds - timed.fwd.link_seconds;
                        tp += timed.fwd.link_seconds;
                    }
                    // The reference recomputes every layer but on the last stage.
                    (false, _) if from_end > 1 => {
                        r += timed.fwd.seconds - timed.fwd.link_seconds;
                        tp += timed.fwd.link_seconds;
                    }
                    _ => {}
                }
            }
            let p2p = (slow.load - f - bw - r - tp).max(0.0);
            time.forward_seconds = m * f;
            time.backward_seconds = m * bw;
            time.recomputation_seconds = m * r;
            time.tensor_parallel_communication_seconds = m * tp;
            time.pipeline_point_to_point_seconds = m * p2p;
            time.pipeline_bubble_seconds =
                (count - 1) as f64 / plan.interleaving.max(1) as f64 * slow.load;
        }
        let mut memory = MemoryBreakdown::default();
        if let Some(s) = plan
            .stages
            .iter()
            .max_by(|a, b| a.memory_bytes.total_cmp(&b.memory_bytes))
        {
            let (weights, gradients, optimizer) = if megatron {
                let precision = tr.precision(run.precision);
                let n = s.parameter_bytes / precision.element_bytes() as f64;
                let state = StateBytes::megatron(precision, tr.optimizer, run.distributed, d);
                (n * state.weights, n * state.gradients, n * state.optimizer)
            } else {
                let p = s.parameter_bytes;
                (p, p, tr.optimizer.reference_copies() * p)
            };
            memory = MemoryBreakdown {
                weights,
                gradients,
                optimizer,
                activations: (s.memory_bytes - weights - gradients - optimizer).max(0.0),
                total: s.memory_bytes,
            };
        }
        (time, memory)
    }
}

/// The layer graphs a search schedules: per model, one per (micro-batch, tensor-parallel
/// width, element bytes, sequence parallelism) the training plan allows on the cluster.
pub(crate) fn layer_graphs(input: &SearchInput) -> Vec<HashMap<GraphKey, ModelGraph>> {
    let mut graphs = Vec::new();
    for m in &input.models {
        let mut map = HashMap::new();
        let mut element_bytes: Vec<u64> = input
            .training
            .precision_indices()
            .map(|p| input.training.element_bytes(p))
            .collect();
        element_bytes.sort_unstable();
        element_bytes.dedup();
        for &b in &input.training.micro_batch_sizes {
            for t in m.config.tensor_parallel_widths() {
                if t > input.cluster.devices {
                    continue;
                }
                for &e in &element_bytes {
                    for sp in input.training.sequence_parallel_choices() {
                        let sp = sp && t > 1;
                        let opts = BuildOptions {
                            micro_batch: b,
                            tensor_parallel: t,
                            bytes_per_element: e,
                            // Tensor-parallel collectives on the tier the group lives on.
                            link_bytes_per_second: input.cluster.network.tier(t).bytes_per_second
                                as u64,
                            sequence_parallel: sp,
                        };
                        map.entry((b, t, e, sp))
                            .or_insert_with(|| build(&m.config, &opts));
                    }
                }
            }
        }
        graphs.push(map);
    }
    graphs
}

/// Two candidates' mean throughputs tie when they differ by less than this fraction of the
/// larger: one part in a million, finer than any report prints them (six significant
/// digits at most) and coarser than the rounding of the sums behind them.
pub const TIE_RELATIVE: f64 = 1e-6;

/// Whether a candidate of throughput `t` and area `area_um2` replaces `best`: it is faster,
/// or it ties ([`TIE_RELATIVE`]) and is smaller — the chip to build is the cheaper of two
/// that train as fast. (An equal area keeps the one visited first.)
pub fn beats(t: f64, area_um2: f64, best: &Evaluated) -> bool {
    let b = best.mean_throughput_samples_per_second.unwrap_or(0.0);
    if (t - b).abs() <= TIE_RELATIVE * t.abs().max(b.abs()) {
        area_um2 < best.area_um2
    } else {
        t > b
    }
}

/// Runs the search over `space`.
pub fn search(
    input: &SearchInput,
    space: &Space,
    latency: &dyn LatencyModel,
    observer: &dyn Observer,
    cancel: Option<&AtomicBool>,
) -> Result<Outcome, SearchError> {
    search_resuming(input, space, latency, observer, cancel, BTreeMap::new())
}

/// [`search_supplied`] with every candidate evaluated here.
pub fn search_resuming(
    input: &SearchInput,
    space: &Space,
    latency: &dyn LatencyModel,
    observer: &dyn Observer,
    cancel: Option<&AtomicBool>,
    done: BTreeMap<usize, Evaluated>,
) -> Result<Outcome, SearchError> {
    search_supplied(input, space, latency, observer, cancel, done, &mut Local)
}

/// Runs the search over `space`, reusing the candidates an interrupted run of the same
/// search finished (`done`, by index; one whose configuration or area differs from the
/// space's is evaluated again). Because a candidate's evaluation depends only on the
/// candidate, the spec and the cost models, and the walk only on the evaluations, the
/// outcome is the uninterrupted run's; only the work counters and timings count this run.
/// `done` may hold summaries ([`Evaluated::summarise`]): if the best is one, it is
/// evaluated again for its stages and layers.
///
/// Only the best candidate's record is kept whole: the others are summarised as they are
/// passed, so the memory a search holds per candidate is a summary's (see [`memory`]).
///
/// Candidates not in `done` are asked of `supplier` first ([`Supplier`]): a supplied
/// evaluation must be of the candidate asked for (index, configuration, area, bucket), or
/// the search fails; it is reported to `observer.evaluated` like one computed here.
pub fn search_supplied(
    input: &SearchInput,
    space: &Space,
    latency: &dyn LatencyModel,
    observer: &dyn Observer,
    cancel: Option<&AtomicBool>,
    mut done: BTreeMap<usize, Evaluated>,
    supplier: &mut dyn Supplier,
) -> Result<Outcome, SearchError> {
    let started = Instant::now();
    if space.candidates.is_empty() {
        return Err(SearchError::EmptySpace);
    }
    let ctx = Ctx::new(input, latency, observer);
    let same = |e: &Evaluated, k: usize, cand: &Candidate| {
        e.index == k
            && e.config == cand.config
            && e.bucket == cand.bucket
            && e.area_um2.to_bits() == cand.area_um2.to_bits()
    };
    let mut explored: Vec<Evaluated> = Vec::new();
    let mut best: Option<usize> = None;
    let mut history: Vec<f64> = Vec::new();
    let window = input.convergence_window.max(1) as usize;
    let (mut converged, mut cancelled) = (false, false);
    let mut buckets_visited = 0;
    let mut i = 0;
    let n = space.candidates.len();
    while i < n {
        let bucket = space.candidates[i].bucket;
        let end = (i..n)
            .find(|&k| space.candidates[k].bucket != bucket)
            .unwrap_or(n);
        buckets_visited += 1;
        let mut bucket_best: Option<f64> = None;
        for k in i..end {
            if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
                cancelled = true;
                break;
            }
            let cand = &space.candidates[k];
            let e = match done.remove(&k) {
                Some(e) if same(&e, k, cand) => e,
                _ => match supplier
                    .supply(k, cand)
                    .and_then(|supplied| match supplied {
                        Some(e) if same(&e, k, cand) => Ok(e),
                        Some(e) => Err(SearchError::Supplier(format!(
                            "the pool answered candidate {} ({:?}) for candidate {k} ({:?})",
                            e.index, e.config, cand.config
                        ))),
                        None => ctx.evaluate(k, cand),
                    }) {
                    Ok(e) => {
                        observer.evaluated(&e);
                        e
                    }
                    // Cancelling also stops a plugin call in flight, which then fails: the
                    // search was cancelled, the candidate is not evaluated.
                    Err(_) if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) => {
                        cancelled = true;
                        break;
                    }
                    Err(e) => return Err(e),
                },
            };
            let mut e = e;
            let mut new_best = false;
            if let Some(t) = e.mean_throughput_samples_per_second {
                bucket_best = Some(bucket_best.map_or(t, |b: f64| b.max(t)));
                if best.is_none_or(|b| beats(t, e.area_um2, &explored[b])) {
                    if let Some(b) = best {
                        explored[b].summarise();
                    }
                    best = Some(explored.len());
                    new_best = true;
                }
            }
            if !new_best {
                e.summarise();
            }
            explored.push(e);
            let b = best.map(|b| &explored[b]);
            observer.progress(&Progress {
                evaluated: explored.len(),
                total: n,
                bucket,
                bucket_area_um2: bucket as f64 * space.bucket_um2,
                best_throughput_samples_per_second: b
                    .and_then(|e| e.mean_throughput_samples_per_second),
                best_area_um2: b.map(|e| e.area_um2),
                estimates_computed: ctx.estimator.computed.load(Ordering::Relaxed),
                estimate_cache_hits: ctx.estimator.hits.load(Ordering::Relaxed),
            });
        }
        if cancelled {
            break;
        }
        if let Some(v) = bucket_best {
            history.push(v);
        }
        if !input.exhaustive
            && history.len() >= window
            && history[history.len() - window..]
                .windows(2)
                .all(|w| w[0] >= w[1])
        {
            converged = true;
            break;
        }
        i = end;
    }
    // A best resumed from a summary: its stages and layers, evaluated again (the same
    // evaluation, so the same record).
    if let Some(b) = best
        && explored[b].is_summary()
        && let Some(cand) = space.candidates.get(explored[b].index)
    {
        explored[b] = ctx.evaluate(explored[b].index, cand)?;
    }
    let mut stats = ctx.stats.into_inner().unwrap_or_default();
    stats.candidates_evaluated = explored.len();
    stats.candidates_failed = explored.iter().filter(|e| e.failure.is_some()).count();
    stats.buckets_visited = buckets_visited;
    stats.converged = converged;
    stats.cancelled = cancelled;
    stats.estimates_computed = ctx.estimator.computed.load(Ordering::Relaxed);
    stats.estimate_cache_hits = ctx.estimator.hits.load(Ordering::Relaxed);
    stats.add_work(&supplier.work());
    stats.total_seconds = started.elapsed().as_secs_f64();
    Ok(Outcome {
        best: best.map(|b| explored[b].clone()),
        explored,
        stats,
    })
}

#[cfg(test)]
mod tests;
