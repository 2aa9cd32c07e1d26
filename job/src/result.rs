//! `result.json` and `explored.jsonl`: the records of a finished search, as written and read
//! back (the daemon reads a folder's `result.json` to know it is complete). Every field is
//! described in the README; the format is versioned by [`RESULT_FORMAT_VERSION`].

use archplace_cost_port::ModelSource;
use archplace_engine::search::{Evaluated, ModelPlan, Outcome, Strategy};
use archplace_plugin_sdk::ModelInfo;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub use crate::lines::{Best, Configuration, DomainLine, ExploredLine, NEAR_TIE};

/// Version of the result format.
pub const RESULT_FORMAT_VERSION: u32 = 1;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SpecRef {
    pub name: String,
    pub content_hash: String,
    /// The software stack whose profile filled the spec's `[training]` defaults
    /// (`[training] stack`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack: Option<String>,
    /// The cluster's devices (`[cluster] devices`).
    #[serde(default)]
    pub devices: u64,
    /// The cluster's network: its tiers (`node_size` null for one tier) with what a device
    /// achieves on each. Absent in results of earlier versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<archplace_engine::network::Network>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CostModels {
    pub area: ModelInfo,
    pub latency: ModelInfo,
    pub area_source: ModelSource,
    pub latency_source: ModelSource,
    /// The calibration applied (`[cost_model] calibration`, `--calibration`): its file,
    /// hash and the values it gave.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<crate::calibrated::Applied>,
}

/// A chip whose mean throughput is within 1% of the best.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NearTie {
    pub configuration: Configuration,
    pub hbm_bytes: u64,
    /// With several scale-up domain sizes: the size its plans are for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_size: Option<u64>,
    pub mean_throughput_samples_per_second: f64,
    /// Its throughput relative to the best's (≤ 1).
    pub relative_to_best: f64,
    /// Each model's plan on it.
    #[serde(default)]
    pub plans: Vec<ModelPlan>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SearchSummary {
    pub candidates_in_space: usize,
    pub candidates_evaluated: usize,
    pub candidates_failed: usize,
    pub buckets_visited: usize,
    /// How the space was walked: "converge", "exhaustive" or "proven".
    #[serde(default)]
    pub strategy: Strategy,
    pub exhaustive: bool,
    pub converged: bool,
    /// The best is the best chip of the whole space under the model: a proven search
    /// ran to its end (an exhaustive one also proves it).
    #[serde(default)]
    pub proven: bool,
    /// A proven search: candidates bounded, those the latency model could not estimate
    /// while bounding (never evaluated: they fail), those pruned (bounded below the best,
    /// never evaluated), the largest bound among the pruned (the bound pass's seconds are
    /// in [`Timings`]: a result is the same whatever the machine's speed, but for timings).
    #[serde(default)]
    pub candidates_bounded: usize,
    /// Of those, bounded exactly: the rest had only the quick bound, which already ranked
    /// them below the best (`search::Stats::candidates_bounded_exactly`).
    #[serde(default)]
    pub candidates_bounded_exactly: usize,
    #[serde(default)]
    pub candidates_failed_bound: usize,
    #[serde(default)]
    pub candidates_pruned: usize,
    #[serde(default)]
    pub largest_remaining_bound_samples_per_second: Option<f64>,
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
    /// A proven search's bound pass (zero for the other strategies).
    #[serde(default)]
    pub bound_seconds: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Work {
    pub estimates_computed: u64,
    pub estimate_cache_hits: u64,
    pub layer_schedules: u64,
    /// Settled by bounds: the list schedule met the lower bound.
    pub mips_avoided: u64,
    pub mips_solved: u64,
    /// A MIP's solution for another instance with the same cores' durations and
    /// dependencies (a chip that differs only in its buffer), held to this instance's
    /// memory floor: what solving it would give, without solving it again.
    #[serde(default)]
    pub mips_reused: u64,
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
    pub pool: Option<PoolStatus>,
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
    /// Why the winner wins (`null` when no chip trained every model).
    #[serde(default)]
    pub explanation: Option<crate::explain::Explanation>,
    /// With several scale-up domain sizes (`[cluster] node_size` a list): the best chip at
    /// each, the winning size, by how much and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_up_domains: Option<crate::domains::DomainComparison>,
    /// With a calibration's uncertainty or ranges a spec declares: the best chips'
    /// throughput intervals and the probability that each is the best.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uncertainty: Option<crate::calibrated::SearchUncertainty>,
    pub timings: Timings,
    pub work: Work,
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
                node_size: e.node_size,
                mean_throughput_samples_per_second: t,
                relative_to_best: if top > 0.0 { t / top } else { 0.0 },
                plans: e.plans.iter().map(ModelPlan::summary).collect(),
            }
        })
        .collect()
}

/// A pooled search's progress and how its work was spread (`daemon --nats`): in
/// `status.json` while it runs and `result.json`'s `work.pool`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PoolStatus {
    /// The search's id in the pool: what the daemons' logs call it (`search=`).
    #[serde(default)]
    pub search: String,
    /// The daemon that carried the search on while its coordinator was away, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub carried_by: Option<String>,
    /// Workers with a live heartbeat in the pool.
    pub workers: usize,
    pub items_total: usize,
    pub items_published: usize,
    pub items_answered: usize,
    /// Published and not answered yet: the queue's lag behind the walk.
    pub items_outstanding: usize,
    /// Items published past the point where a converging walk stopped.
    pub items_speculative: usize,
}
