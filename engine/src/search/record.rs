//! What a search says of a candidate ([`Evaluated`]): each model's best plan on it with
//! its stages, layers, time and memory breakdowns and baseline; and of the whole search
//! ([`Outcome`]), with the counters of its work ([`Stats`]).

use crate::model::LayerKind;
use crate::pipeline::PipelineSchedule;
use crate::plan::RecordedPlan;
use crate::space::Strategy;
use crate::step::{MemoryBreakdown, TimeBreakdown};
use archplace_plugin_sdk::AcceleratorConfig;
use serde::{Deserialize, Serialize};

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
    /// The plan: written as the flat keys records have always had (`micro_batch`,
    /// `tensor_parallel`, `pipeline_stages`, `stage_layers`, `devices_used`, ...) and the
    /// whole plan under `plan`, as `archplace estimate`'s `[plan]` takes it (`null` with
    /// the reference's memory model, whose plans the placement program prices as the
    /// reference system does).
    #[serde(flatten)]
    pub plan: RecordedPlan,
    pub time_per_batch_seconds: f64,
    pub gradient_all_reduce_seconds: f64,
    pub throughput_samples_per_second: f64,
    pub throughput_tokens_per_second: f64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<StageReport>,
    /// Where the time per batch goes on the slowest stage (the parts add up to
    /// `time_per_batch_seconds`).
    #[serde(default)]
    pub time: TimeBreakdown,
    /// Of the chip's time, how long its HBM is busy ([`crate::step::StepReport::hbm_busy_seconds`];
    /// `None` with the reference's memory model or a latency model of interface 1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hbm_busy_seconds: Option<f64>,
    /// Memory per device of the most loaded stage.
    #[serde(default)]
    pub memory_bytes: MemoryBreakdown,
    /// The largest part of the time.
    #[serde(default)]
    pub limiting: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<LayerReport>,
    /// The baseline strategy on the same chip, HBM, micro-batch and recomputation.
    pub baseline: Option<BaselineReport>,
    /// With `[training] pipeline_schedule` given, the schedule the plan runs and the best
    /// 1F1B plan's throughput at the same HBM size (`None` when no 1F1B plan fits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline_schedule: Option<PipelineSchedule>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub one_f_one_b_throughput_samples_per_second: Option<f64>,
}

impl ModelPlan {
    /// Drops what only the best candidate's report needs: the stages, layers and
    /// baseline (`explored.jsonl` and the summaries a search keeps per candidate).
    pub fn summarise(&mut self) {
        self.stages = Vec::new();
        self.layers = Vec::new();
        self.baseline = None;
    }

    /// The plan without what [`ModelPlan::summarise`] drops.
    pub fn summary(&self) -> ModelPlan {
        ModelPlan {
            stages: Vec::new(),
            layers: Vec::new(),
            baseline: None,
            plan: self.plan.clone(),
            model: self.model.clone(),
            limiting: self.limiting.clone(),
            ..*self
        }
    }
    /// With schedules searched: what the winning schedule gains over the best 1F1B plan,
    /// as a fraction of that plan's throughput (`None` without schedules or a 1F1B plan).
    pub fn gain_over_one_f_one_b(&self) -> Option<(PipelineSchedule, f64)> {
        let schedule = self.pipeline_schedule?;
        let base = self.one_f_one_b_throughput_samples_per_second?;
        (base > 0.0).then(|| (schedule, self.throughput_samples_per_second / base - 1.0))
    }
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
    /// With several scale-up domain sizes (`[cluster] node_size` a list): the size of the
    /// best (`plans` are its), ties to the smaller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_size: Option<u64>,
    /// With several scale-up domain sizes: the candidate at each, in the spec's order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub domains: Vec<DomainScore>,
}

/// A candidate at one scale-up domain size: its best mean throughput there, the HBM size
/// and each model's best plan (or why none fits).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DomainScore {
    /// Devices on one scale-up (NVLink-class) domain.
    pub node_size: u64,
    pub mean_throughput_samples_per_second: Option<f64>,
    pub hbm_bytes: Option<u64>,
    pub plans: Vec<ModelPlan>,
    pub failure: Option<String>,
}

impl Evaluated {
    /// Drops what only the best candidate's report needs (each plan's stages, layers and
    /// baseline),
    /// keeping what `explored.jsonl`, the plots and the walk use: a search keeps every
    /// candidate's record, so this is its memory per candidate.
    ///
    /// With several scale-up domain sizes, the plans at the record's own size are its
    /// `plans`: the summary keeps them once, the domain's list left empty
    /// ([`Evaluated::at_domain`] and [`Evaluated::domain_plans`] give them back) — a
    /// third of a summary with two sizes, and a million-candidate proven search bounds its
    /// memory by a summary per candidate.
    pub fn summarise(&mut self) {
        let domains = self.domains.iter_mut().flat_map(|d| &mut d.plans);
        for p in self.plans.iter_mut().chain(domains) {
            p.summarise();
        }
        if let Some(size) = self.node_size
            && self.mean_throughput_samples_per_second.is_some()
            && let Some(d) = self.domains.iter_mut().find(|d| {
                d.node_size == size
                    && d.mean_throughput_samples_per_second
                        == self.mean_throughput_samples_per_second
                    && d.plans == self.plans
            })
        {
            d.plans = Vec::new();
        }
    }

    /// Each model's best plan at scale-up domain `k` (the record's own `plans` where a
    /// summary keeps them once: a domain with a throughput always has plans).
    pub fn domain_plans(&self, k: usize) -> &[ModelPlan] {
        match self.domains.get(k) {
            Some(d) if d.plans.is_empty() && d.mean_throughput_samples_per_second.is_some() => {
                &self.plans
            }
            Some(d) => &d.plans,
            None => &[],
        }
    }

    /// The candidate at scale-up domain `k` ([`crate::training::Cluster::networks`]) as a
    /// record of its own (itself when the search has one domain).
    pub fn at_domain(&self, k: usize) -> Evaluated {
        let Some(d) = self.domains.get(k) else {
            return self.clone();
        };
        Evaluated {
            mean_throughput_samples_per_second: d.mean_throughput_samples_per_second,
            hbm_bytes: d.hbm_bytes,
            plans: self.domain_plans(k).to_vec(),
            failure: d.failure.clone(),
            node_size: Some(d.node_size),
            domains: Vec::new(),
            ..self.clone()
        }
    }

    /// Whether the record was summarised (a plan always has a stage).
    pub fn is_summary(&self) -> bool {
        self.plans.iter().any(|p| p.stages.is_empty())
    }
}

/// The search's answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    pub best: Option<Evaluated>,
    pub explored: Vec<Evaluated>,
    pub stats: Stats,
}

/// Counters of the work done.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Stats {
    /// How the space was walked.
    pub strategy: Strategy,
    pub candidates_evaluated: usize,
    pub candidates_failed: usize,
    pub buckets_visited: usize,
    pub converged: bool,
    pub cancelled: bool,
    /// A proven search: candidates bounded (every one, unless cancelled), those the
    /// latency model could not estimate while bounding (they fail evaluation too: never
    /// the best), and those pruned — bounded below the best, never evaluated.
    pub candidates_bounded: usize,
    /// Of those, the candidates bounded exactly: a walk on one machine bounds every one
    /// quickly and only those near the top exactly (`Supplier::needs_order`).
    pub candidates_bounded_exactly: usize,
    pub candidates_failed_bound: usize,
    pub candidates_pruned: usize,
    /// The largest bound of a candidate not evaluated (pruned): no chip left out of the
    /// evaluation can reach it. `None` when every bounded candidate was evaluated.
    pub largest_remaining_bound_samples_per_second: Option<f64>,
    /// The best is the best chip of the whole space under the model: a proven search
    /// that ran to its end.
    pub proven: bool,
    /// Wall-clock seconds of the bound pass.
    pub bound_seconds: f64,
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
    /// Layer schedules a MIP solved for another instance with the same cores' durations
    /// and dependencies (a chip that differs only in its buffer): that MIP's solution,
    /// held to this instance's memory floor — the schedule solving it would give.
    #[serde(default)]
    pub schedules_by_mip_reused: u64,
    /// Layer schedules not proven within the accepted gap (`ScheduleOptions::relative_gap`,
    /// the spec's `schedule_gap`): those the MIP's node limit stopped further from the bound.
    pub schedules_not_proven_optimal: u64,
    pub mip_time_limit_hits: u64,
    pub placements_solved: u64,
    pub estimation_seconds: f64,
    pub scheduling_seconds: f64,
    pub placement_seconds: f64,
    pub total_seconds: f64,
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
        self.schedules_by_mip_reused += other.schedules_by_mip_reused;
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
            schedules_by_mip_reused: self.schedules_by_mip_reused - before.schedules_by_mip_reused,
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
