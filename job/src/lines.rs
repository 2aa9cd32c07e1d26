//! The records a search's files are made of, below the documents that gather them: a
//! chip ([`Configuration`]), the best one with its plans ([`Best`]), a model's plan
//! ([`PlanLine`]) and a line of `explored.jsonl` ([`ExploredLine`]). `chip`, `explain`,
//! `domains` and `calibrated` read these; `result` (`result.json`) embeds what they make.

use archplace_engine::pipeline::PipelineSchedule;
use archplace_engine::search::{Evaluated, ModelPlan};
use archplace_engine::step::{MemoryBreakdown, StepPlan, TimeBreakdown};
use archplace_engine::training::{Precision, Recomputation};
use archplace_plugin_sdk::AcceleratorConfig;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Configuration {
    /// The chip's axes, as the SDK's record (flattened: `tensor_cores`, `width`, ...).
    #[serde(flatten)]
    pub chip: AcceleratorConfig,
    pub area_mm2: f64,
}

impl Configuration {
    pub(crate) fn new(c: &AcceleratorConfig, area_um2: f64) -> Self {
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
    /// With several scale-up domain sizes: the winner's (`scale_up_domains` compares them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_size: Option<u64>,
    /// Mean over the models of their throughput.
    pub mean_throughput_samples_per_second: f64,
    pub models: Vec<ModelPlan>,
}

/// Relative distance to the best within which a chip is a near-tie.
pub const NEAR_TIE: f64 = 0.01;

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
    /// With several scale-up domain sizes: the size of the best (`plans` are its).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_size: Option<u64>,
    /// With several scale-up domain sizes: the candidate's best at each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub domains: Vec<DomainLine>,
}

/// A candidate at one scale-up domain size, in `explored.jsonl`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DomainLine {
    pub node_size: u64,
    pub mean_throughput_samples_per_second: Option<f64>,
    pub hbm_bytes: Option<u64>,
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
    /// The ZeRO stage (1: the distributed optimizer).
    #[serde(default)]
    pub zero_stage: u64,
    #[serde(default)]
    pub sequence_parallel: bool,
    #[serde(default = "one")]
    pub expert_parallel: u64,
    #[serde(default = "one")]
    pub expert_tensor_parallel: u64,
    #[serde(default = "one")]
    pub context_parallel: u64,
    pub tensor_parallel: u64,
    pub data_parallel: u64,
    pub pipeline_stages: usize,
    #[serde(default = "one")]
    pub pipeline_interleaving: u64,
    /// Transformer blocks per pipeline stage, first to last.
    #[serde(default)]
    pub stage_layers: Vec<u64>,
    #[serde(default)]
    pub devices_used: u64,
    pub throughput_samples_per_second: f64,
    pub time_per_batch_seconds: f64,
    #[serde(default)]
    pub time: TimeBreakdown,
    /// Of the chip's time, how long its HBM is busy (see `ModelPlan::hbm_busy_seconds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hbm_busy_seconds: Option<f64>,
    #[serde(default)]
    pub memory_bytes: MemoryBreakdown,
    #[serde(default)]
    pub limiting: String,
    /// With `[training] pipeline_schedule`: the schedule that won and the best 1F1B
    /// plan's throughput beside it (see `ModelPlan::pipeline_schedule`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline_schedule: Option<PipelineSchedule>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub one_f_one_b_throughput_samples_per_second: Option<f64>,
    /// The plan as `archplace estimate`'s `[plan]` takes it (see `ModelPlan::plan`).
    #[serde(default)]
    pub plan: Option<StepPlan>,
}

impl PlanLine {
    /// With schedules searched: what the winning schedule gains over the best 1F1B plan,
    /// as a fraction of that plan's throughput (`None` without schedules or a 1F1B plan).
    pub fn gain_over_one_f_one_b(&self) -> Option<(PipelineSchedule, f64)> {
        let schedule = self.pipeline_schedule?;
        let base = self.one_f_one_b_throughput_samples_per_second?;
        (base > 0.0).then(|| (schedule, self.throughput_samples_per_second / base - 1.0))
    }
}

impl From<&ModelPlan> for PlanLine {
    fn from(p: &ModelPlan) -> Self {
        PlanLine {
            model: p.model.clone(),
            micro_batch: p.micro_batch,
            activation_recomputation: p.activation_recomputation,
            recomputation: p.recomputation,
            precision: p.precision,
            distributed_optimizer: p.distributed_optimizer,
            zero_stage: p.zero_stage,
            sequence_parallel: p.sequence_parallel,
            expert_parallel: p.expert_parallel,
            expert_tensor_parallel: p.expert_tensor_parallel,
            context_parallel: p.context_parallel,
            tensor_parallel: p.tensor_parallel,
            data_parallel: p.data_parallel,
            pipeline_stages: p.pipeline_stages,
            pipeline_interleaving: p.pipeline_interleaving,
            stage_layers: p.stage_layers.clone(),
            devices_used: p.devices_used,
            throughput_samples_per_second: p.throughput_samples_per_second,
            time_per_batch_seconds: p.time_per_batch_seconds,
            time: p.time,
            hbm_busy_seconds: p.hbm_busy_seconds,
            memory_bytes: p.memory_bytes,
            limiting: p.limiting.clone(),
            pipeline_schedule: p.pipeline_schedule,
            one_f_one_b_throughput_samples_per_second: p.one_f_one_b_throughput_samples_per_second,
            plan: p.plan.clone(),
        }
    }
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
            plans: e.plans.iter().map(PlanLine::from).collect(),
            failure: e.failure.clone(),
            node_size: e.node_size,
            domains: e
                .domains
                .iter()
                .map(|d| DomainLine {
                    node_size: d.node_size,
                    mean_throughput_samples_per_second: d.mean_throughput_samples_per_second,
                    hbm_bytes: d.hbm_bytes,
                    failure: d.failure.clone(),
                })
                .collect(),
        }
    }
}
