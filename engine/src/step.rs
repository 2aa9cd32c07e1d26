//! One training step of a fixed chip and a fixed plan, explained: its time and where it
//! goes, its memory per device and what fills it, throughput, FLOP rates and energy.
//!
//! The plan is trained as Megatron-LM trains it (Narayanan et al. 2021, Korthikanti et al.
//! 2022): ranks are ordered tensor-parallel first, then context-parallel (each sequence
//! split over CP ranks, docs/training-model.md), then data-parallel, then pipeline; the
//! blocks are split evenly over `pipeline × interleaving` model chunks, the embedding on
//! the first stage and the head on the last; micro-batches run in the 1F1B schedule, or
//! the interleaved one with `interleaving > 1` virtual stages per device.
//!
//! * **Layer times** come from the layer schedules on the chip (the same latency model and
//!   scheduler as the search); a layer's tensor-parallel collectives are operators of its
//!   graph, costed by the latency model at the bandwidth of the tier the group lives on, so
//!   they occupy the network inside the layer and are not overlapped with it beyond what
//!   the operator graph allows.
//! * **Pipeline**: a device's time per micro-batch is its chunks' forward, backward and
//!   recomputation plus the point-to-point transfers (an activation forward and a gradient
//!   backward per chunk, `latency + bytes / bandwidth` each, `b·s·h/t` elements thanks to
//!   Megatron's scatter/gather; not overlapped, or with `pipeline_parallel_overlap` and
//!   interleaving only what the stage's work leaves uncovered). The step runs
//!   `(m + (p − 1)/v) × T` for `m` micro-batches per replica and the slowest device's `T`:
//!   the bubble is `(p − 1)/v × T`, with every transfer exposed in it.
//! * **Data parallel**: the gradient buffer is all-reduced (ring: `2(d − 1)/d` of it per
//!   device, `2(d − 1)` latencies), or with the distributed optimizer reduce-scattered and
//!   the updated weights all-gathered; when the group spans nodes, hierarchically (inside
//!   the node, then `1/k` of it between nodes, `k` ranks of the group per node). Tied
//!   embeddings on different stages add the all-reduce of the embedding's gradient between
//!   the first and the last stage. Not overlapped with the backward pass (Megatron-LM 2021).
//! * **Optimizer step**: memory-bound, over the parameters the device updates (its shard
//!   with the distributed optimizer): every byte of their state read and written once
//!   (weights, gradient buffer, master weights, moments) and the gradient read twice more
//!   (unscale, norm for clipping) — `2 (w + g + o) + 2 g` bytes per parameter with the
//!   unsharded [`StateBytes`] — timed by the latency model as one element-wise operation.
//! * **Memory** of the most loaded stage: state bytes per parameter
//!   ([`StateBytes::megatron`]) × its parameters; activations per micro-batch as kept by
//!   the recomputation ([`crate::model::Layer::kept_bytes`]), for `min(p − k, m)`
//!   micro-batches in flight on stage `k`, times `1 + (p − 1)/(p·v)` on the first stage
//!   with interleaving (Korthikanti et al. 2022, §4.2.3); plus, when recomputing, one
//!   block's rematerialised activations.
//! * **Energy** is the latency model's joules of every operator the step runs, on every
//!   device (compute only: no static power, no network energy).

use crate::execution::Fp8Library;
use crate::model::{
    AttentionKernel, BuildOptions, DISTINCT_LAYERS, ExpertLayout, Layer, ModelConfig, ModelGraph,
    OpGraph, Work, build,
};
use crate::network::Network;
use crate::operators::estimate;
use crate::operators::instance_with;
use crate::options::ScheduleOptions;
use crate::pipeline::{ModelStage, PipelineSchedule, ScheduleError, Slots};
use crate::schedule::{self, Instance, Resource};
pub use crate::training::{ContextExchange, ContextMethod};
use crate::training::{Fp8Scaling, Recomputation, StateBytes};
use archplace_plugin_sdk::{
    AcceleratorConfig, Cast, CoreConfig, Direction, EstimateError, LatencyModel, Op, OpCost,
    OpKind, VectorKind,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

use crate::plan::is_zero;
pub use crate::plan::{RankGroup, ShardGroups, Sharding, StepPlan};

/// Everything a step estimate needs besides the latency model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepInput {
    pub model: ModelConfig,
    pub plan: StepPlan,
    pub accelerator: AcceleratorConfig,
    pub hbm_bytes: u64,
    pub devices: u64,
    pub global_batch: u64,
    pub network: Network,
    /// Peak dense matrix FLOP/s of one device, for the model FLOPs utilisation.
    pub peak_flops_per_second: Option<f64>,
    /// How layer schedules are solved.
    pub schedule: ScheduleOptions,
    /// Which of a layer's operators may overlap on the chip.
    pub execution: crate::execution::Execution,
}

/// Where a step's time goes on the slowest device, in seconds; the parts add up to the
/// step time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct TimeBreakdown {
    pub forward_seconds: f64,
    pub backward_seconds: f64,
    pub recomputation_seconds: f64,
    /// The tensor-parallel collectives' time that computation does not hide (all of it
    /// unless `tensor_parallel_overlap`); forward and backward are the cores' busy time.
    pub tensor_parallel_communication_seconds: f64,
    /// The Mixture-of-Experts all-to-all exchanges (dispatch and combine, forward,
    /// backward and recomputed) over the expert-parallel group: all of them, or with
    /// `all_to_all_overlap` what computation does not hide.
    #[serde(default)]
    pub all_to_all_seconds: f64,
    /// The context-parallel exchanges of keys and values (and their gradients) that
    /// attention does not hide: forward, backward and recomputed.
    #[serde(default)]
    pub context_parallel_communication_seconds: f64,
    /// Activation offloading (`activation_offload_layers`): what the copies to and from
    /// the host take beyond the passes they run beside.
    #[serde(default)]
    pub activation_offload_seconds: f64,
    pub pipeline_point_to_point_seconds: f64,
    pub pipeline_bubble_seconds: f64,
    /// Once per step: the gradients' all-reduce (or reduce-scatter) and the updated
    /// weights' all-gather, what overlap does not hide.
    pub data_parallel_communication_seconds: f64,
    /// Every micro-batch at ZeRO-2/3: the layers' weights all-gathered (ZeRO-3) and their
    /// gradients reduce-scattered over the data-parallel group, what overlap does not hide.
    #[serde(default)]
    pub fsdp_communication_seconds: f64,
    /// FP8 and MXFP8 recipes: the quantised GEMMs' weights cast once per step (at ZeRO-3
    /// every time they are gathered); the casts of activations and gradients are operators
    /// of the layers, in forward and backward.
    #[serde(default)]
    pub weight_cast_seconds: f64,
    pub optimizer_step_seconds: f64,
}

/// The parts of [`TimeBreakdown::parts`] that only some plans have (a Mixture-of-Experts
/// model's exchanges, context parallelism's, ZeRO-2/3's traffic): shown only when not
/// zero.
pub const OPTIONAL_PARTS: [&str; 5] = [
    "expert-parallel all-to-all",
    "context-parallel communication",
    "activation offload",
    "FSDP all-gather / reduce-scatter",
    "FP8 weight casts",
];

impl TimeBreakdown {
    pub fn total(&self) -> f64 {
        self.parts().iter().map(|p| p.1).sum()
    }

    /// The parts with their names, in the order above.
    pub fn parts(&self) -> [(&'static str, f64); 13] {
        [
            ("forward", self.forward_seconds),
            ("backward", self.backward_seconds),
            ("recomputation", self.recomputation_seconds),
            (
                "tensor-parallel communication",
                self.tensor_parallel_communication_seconds,
            ),
            ("expert-parallel all-to-all", self.all_to_all_seconds),
            (
                "context-parallel communication",
                self.context_parallel_communication_seconds,
            ),
            ("activation offload", self.activation_offload_seconds),
            (
                "pipeline point-to-point",
                self.pipeline_point_to_point_seconds,
            ),
            ("pipeline bubble", self.pipeline_bubble_seconds),
            (
                "data-parallel communication",
                self.data_parallel_communication_seconds,
            ),
            (
                "FSDP all-gather / reduce-scatter",
                self.fsdp_communication_seconds,
            ),
            ("FP8 weight casts", self.weight_cast_seconds),
            ("optimizer step", self.optimizer_step_seconds),
        ]
    }

    /// The largest part's name.
    pub fn limiting(&self) -> &'static str {
        self.parts()
            .into_iter()
            .fold(("forward", f64::MIN), |a, b| if b.1 > a.1 { b } else { a })
            .0
    }
}

/// Where the slowest device's time goes by kind of operator, in seconds per step: each
/// operator's duration (on all cores of its kind) summed over forward, backward and
/// recomputation, and the all-to-all exchanges. Operators of a layer may overlap (a
/// collective with a GEMM, a tensor-core GEMM with a vector-core kernel), so the parts do
/// not add up to the step; the step's own breakdown is [`TimeBreakdown`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct OperatorSeconds {
    /// The attention core (scores, softmax, context) or the fused attention kernel.
    pub attention: f64,
    /// Mixture-of-Experts routers (GEMM, softmax, top-k).
    pub router: f64,
    /// Tokens permuted to their experts and back.
    pub permutation: f64,
    /// The experts' grouped GEMMs.
    pub expert_gemm: f64,
    /// Every other GEMM (projections, dense MLPs, shared experts, logits).
    pub other_gemm: f64,
    /// Every other element-wise or row-wise kernel (norms, activations, residuals, ...).
    pub vector: f64,
    /// Tensor- and expert-tensor-parallel collectives, their whole duration.
    pub tensor_parallel: f64,
    /// The expert-parallel all-to-all exchanges, their whole duration (with
    /// `all_to_all_overlap` computation hides some).
    pub all_to_all: f64,
    /// The context-parallel exchanges of keys and values, their whole duration (ring
    /// attention overlaps them with the attention kernels).
    #[serde(default)]
    pub context_parallel: f64,
    /// Quantising casts to FP8/MXFP8 run as kernels of their own: the activations' and
    /// gradients' (those fused into a norm, an activation or a GEMM's epilogue are in that
    /// kernel's part) and the weights' once per step.
    #[serde(default)]
    pub casts: f64,
}

impl OperatorSeconds {
    fn of(
        work: &[f64; Work::COUNT],
        (all_to_all, context_parallel, weight_casts): (f64, f64, f64),
    ) -> OperatorSeconds {
        let at = |w: Work| work[w as usize];
        OperatorSeconds {
            attention: at(Work::Attention),
            router: at(Work::Router),
            permutation: at(Work::Permutation),
            expert_gemm: at(Work::ExpertGemm),
            other_gemm: at(Work::Gemm),
            vector: at(Work::Vector),
            tensor_parallel: at(Work::Collective),
            all_to_all,
            context_parallel,
            casts: at(Work::Cast) + weight_casts,
        }
    }

    /// The parts with their names, in the order above.
    pub fn parts(&self) -> [(&'static str, f64); 10] {
        [
            ("attention", self.attention),
            ("router", self.router),
            ("permutation", self.permutation),
            ("expert GEMMs", self.expert_gemm),
            ("other GEMMs", self.other_gemm),
            ("vector kernels", self.vector),
            ("tensor-parallel collectives", self.tensor_parallel),
            ("all-to-all", self.all_to_all),
            ("context-parallel exchanges", self.context_parallel),
            ("FP8 casts", self.casts),
        ]
    }
}

/// Memory of one device, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct MemoryBreakdown {
    pub weights: f64,
    pub gradients: f64,
    pub optimizer: f64,
    pub activations: f64,
    pub total: f64,
}

/// One pipeline stage (a device's chunks).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageSummary {
    pub stage: u64,
    pub blocks: u64,
    pub embedding: bool,
    pub head: bool,
    pub parameters: u64,
    /// Of `parameters`, the experts' (their state sharded over the expert-data-parallel
    /// group).
    #[serde(default)]
    pub expert_parameters: u64,
    /// Of `parameters`, the weights of FP8/MXFP8 GEMMs, whose quantised copies it keeps
    /// (in `memory_bytes.weights`) and casts every step.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub quantised_parameters: u64,
    /// Forward + backward + recomputation + point-to-point of one micro-batch.
    pub seconds_per_micro_batch: f64,
    /// Micro-batches whose activations it holds at its peak.
    pub micro_batches_in_flight: f64,
    pub memory_bytes: MemoryBreakdown,
}

/// The explained step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepReport {
    pub step_seconds: f64,
    pub time: TimeBreakdown,
    /// ZeRO-2/3's per-micro-batch traffic on the slowest device over the step, before
    /// `data_parallel_overlap` hides part of it (`time.fsdp_communication_seconds` is what
    /// stays exposed); 0 below ZeRO-2.
    #[serde(default)]
    pub fsdp_traffic_seconds: f64,
    /// Activation offloading's copies to the host and back on the slowest device over the
    /// step, before the passes beside them hide part of it
    /// (`time.activation_offload_seconds` is what stays exposed); 0 without offloading.
    #[serde(default)]
    pub activation_offload_traffic_seconds: f64,
    /// The slowest device's time by kind of operator (overlapping; see
    /// [`OperatorSeconds`]).
    #[serde(default)]
    pub operator_seconds: OperatorSeconds,
    /// Of forward, backward and recomputation (the chip's time), how long the chip's
    /// off-chip memory is busy moving the layers' bytes (the sum of their operators' memory
    /// times); the rest is its cores'. `None` when the latency model does not report memory
    /// times (interface 1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hbm_busy_seconds: Option<f64>,
    /// The most loaded stage's memory per device.
    pub memory_bytes: MemoryBreakdown,
    pub memory_stage: u64,
    pub hbm_bytes: u64,
    pub stages: Vec<StageSummary>,
    pub micro_batches_per_replica: u64,
    pub samples_per_second: f64,
    pub tokens_per_second: f64,
    /// `tokens_per_second` over the devices.
    #[serde(default)]
    pub tokens_per_second_per_device: f64,
    /// Matrix FLOPs of the model per step (forward and backward, no recomputation).
    pub model_flops_per_step: f64,
    /// Matrix FLOPs the devices run per step, recomputation included.
    pub hardware_flops_per_step: f64,
    pub model_flops_per_second_per_device: f64,
    pub hardware_flops_per_second_per_device: f64,
    /// Model FLOP/s per device over the peak, when the peak is known.
    pub model_flops_utilisation: Option<f64>,
    pub energy_per_step_joules: f64,
    /// The largest part of the step time.
    pub limiting: String,
    /// Schedules of the layers not proven optimal (their makespan is an upper bound).
    pub schedules_not_proven_optimal: u64,
    /// The layer schedules the step rests on: forward and backward of each distinct layer
    /// (6, or 8 with dense blocks beside MoE blocks).
    #[serde(default)]
    pub layer_schedules: u64,
    /// The largest relative gap of a layer schedule to its lower bound (0: all optimal).
    pub schedules_max_gap: f64,
}

/// Why a plan cannot run, with the numbers.
#[derive(Debug, Clone, PartialEq, thiserror::Error, Serialize)]
pub enum StepError {
    #[error(
        "tensor-parallel width {t} must be a power of two dividing the heads ({heads}), key/value heads ({kv_heads}), hidden size ({hidden}) and MLP width ({ffn}), at most the model's max_tensor_parallel ({max})"
    )]
    TensorParallel {
        t: u64,
        heads: u64,
        kv_heads: u64,
        hidden: u64,
        ffn: u64,
        max: u64,
    },
    #[error(
        "the {layers} blocks do not split evenly into {pipeline} pipeline stage(s) × {interleaving} virtual stage(s) = {chunks} model chunks"
    )]
    Pipeline {
        pipeline: u64,
        interleaving: u64,
        layers: u64,
        chunks: u64,
    },
    #[error(
        "stage_layers {stages:?} must give the blocks of each of the {pipeline} pipeline stage(s), summing to the model's {layers}, every stage but the first and the last holding at least one"
    )]
    StageLayers {
        stages: Vec<u64>,
        pipeline: u64,
        layers: u64,
    },
    #[error("{0}")]
    PipelineSchedule(ScheduleError),
    #[error(
        "zero_stage = {stage}: ZeRO has stages 0 (replicated), 1 (optimizer sharded), 2 (and gradients), 3 (and weights: FSDP)"
    )]
    ZeroStage { stage: u64 },
    #[error(
        "sharding_group = {group} shards the state over groups of data-parallel ranks: it must divide the {d} ranks holding the same weights (data_parallel × context_parallel), with a ZeRO stage of 1 to 3 (it is {zero})"
    )]
    ShardingGroup { group: u64, d: u64, zero: u64 },
    #[error(
        "expert_parallel = {ep} and expert_tensor_parallel = {etp} split a Mixture-of-Experts model's experts; {model} is dense"
    )]
    ExpertsWithoutMoe { model: String, ep: u64, etp: u64 },
    #[error("expert-parallel width {ep} must divide the {experts} experts")]
    ExpertParallel { ep: u64, experts: u64 },
    #[error(
        "expert-tensor-parallel width {etp} must be a power of two dividing each expert's FFN width ({expert_ffn})"
    )]
    ExpertTensorParallel { etp: u64, expert_ffn: u64 },
    #[error(
        "the expert groups, EP × ETP = {ep} × {etp}, must divide the t × CP × d = {t} × {cp} × {d} = {ranks} ranks of a pipeline stage they fold into"
    )]
    ExpertFolding {
        ep: u64,
        etp: u64,
        t: u64,
        cp: u64,
        d: u64,
        ranks: u64,
    },
    #[error(
        "a Mixture-of-Experts model with tensor parallelism (t = {t}) needs sequence parallelism, as Megatron-Core requires: its routers take each rank's shard of the tokens"
    )]
    MoeSequenceParallel { t: u64 },
    #[error(
        "context-parallel width {cp} must be at least 1 and split the sequence ({seq} tokens) into {chunks} equal chunks (2 per rank for causal attention, whose chunks are paired for balance)"
    )]
    ContextParallel { cp: u64, seq: u64, chunks: u64 },
    #[error(
        "context parallelism (CP = {cp}) needs a fused attention kernel (attention = \"flash\" or \"mla\"), as Megatron-Core's does; {model} has attention = \"{attention}\""
    )]
    ContextParallelAttention {
        cp: u64,
        model: String,
        attention: String,
    },
    #[error(
        "context_parallel_exchange = \"all_to_all\" (Ulysses) gives each of the t × CP = {t} × {cp} ranks its own heads: {heads} heads and {kv_heads} key-value heads do not divide among them"
    )]
    ContextAllToAll {
        heads: u64,
        kv_heads: u64,
        t: u64,
        cp: u64,
    },
    #[error(
        "t = {t} × CP = {cp} × p = {p} × d = {d} is {needed} devices; the cluster has {devices}"
    )]
    Devices {
        t: u64,
        cp: u64,
        p: u64,
        d: u64,
        needed: u64,
        devices: u64,
    },
    #[error(
        "the global batch ({global_batch}) must be a multiple of micro-batch × data-parallel = {micro_batch} × {d}"
    )]
    Batch {
        global_batch: u64,
        micro_batch: u64,
        d: u64,
    },
    #[error(
        "the interleaved schedule needs at least 2 pipeline stages and micro-batches per replica ({micro_batches}) divisible by the stages ({pipeline})"
    )]
    Interleaving { micro_batches: u64, pipeline: u64 },
    #[error(
        "needs {} per device on pipeline stage {stage} (weights {}, gradients {}, optimizer {}, activations {}); HBM is {}",
        gib(.memory.total), gib(.memory.weights), gib(.memory.gradients),
        gib(.memory.optimizer), gib(.memory.activations), gib(*.hbm_bytes as f64)
    )]
    OutOfMemory {
        stage: u64,
        memory: MemoryBreakdown,
        hbm_bytes: u64,
    },
    #[error("the latency model failed: {0}")]
    CostModel(String),
    #[error("layer schedule: {0}")]
    Schedule(String),
}

fn gib(bytes: f64) -> String {
    format!("{:.1} GiB", bytes / (1u64 << 30) as f64)
}

impl From<EstimateError> for StepError {
    fn from(e: EstimateError) -> Self {
        StepError::CostModel(e.to_string())
    }
}

/// A layer's times for one micro-batch on one device: what the step takes of its forward
/// and backward schedules.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LayerTiming {
    pub forward: f64,
    pub backward: f64,
    /// The link operators' time inside `forward` and `backward`.
    pub forward_communication: f64,
    pub backward_communication: f64,
    /// What selective recomputation runs again: the plan's modules
    /// ([`crate::model::OpNode::selective`]; the attention core by default).
    pub selective: Rerun,
    /// What per-operator selective checkpointing runs again: the operators' work whose
    /// outputs its policy does not keep ([`crate::model::OpNode::checkpoint_saved`]).
    pub op_checkpoint: Rerun,
    pub forward_joules: f64,
    pub backward_joules: f64,
    /// Of the two schedules, those not proven optimal.
    pub not_proven: u64,
    pub max_gap: f64,
    /// The time the chip's memory is busy moving each pass's bytes (the sum of its
    /// operators' memory times, at most the pass's time); `None` when the latency model
    /// does not say.
    pub forward_memory: Option<f64>,
    pub backward_memory: Option<f64>,
    /// Each pass's operators' durations by kind of work ([`Work`]).
    pub forward_work: [f64; Work::COUNT],
    pub backward_work: [f64; Work::COUNT],
    /// Of `backward`, the weight gradients' time ([`GraphTiming::weight_gradient`]).
    pub backward_weight: f64,
}

impl LayerTiming {
    /// The layer's timing from its forward and backward schedules.
    pub fn of(forward: &GraphTiming, backward: &GraphTiming) -> LayerTiming {
        LayerTiming {
            forward: forward.makespan,
            backward: backward.makespan,
            forward_communication: forward.link,
            backward_communication: backward.link,
            selective: forward.selective,
            op_checkpoint: forward.op_checkpoint,
            forward_joules: forward.joules,
            backward_joules: backward.joules,
            not_proven: u64::from(!forward.optimal) + u64::from(!backward.optimal),
            max_gap: forward.gap.max(backward.gap),
            forward_memory: forward.memory,
            backward_memory: backward.memory,
            forward_work: forward.work,
            backward_work: backward.work,
            backward_weight: backward.weight_gradient,
        }
    }

    /// What recomputation `r` runs again of this layer (a block) per micro-batch.
    pub fn rerun(&self, r: Recomputation) -> Rerun {
        match r {
            Recomputation::None => Rerun {
                memory: Some(0.0),
                ..Rerun::default()
            },
            Recomputation::Selective => self.selective,
            Recomputation::SelectiveOp => self.op_checkpoint,
            Recomputation::Full => Rerun {
                seconds: self.forward - self.forward_communication,
                communication: self.forward_communication,
                joules: self.forward_joules,
                memory: self.forward_memory,
                work: self.forward_work,
            },
        }
    }
}

/// What a recomputation policy runs again of one layer's forward pass, per micro-batch.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Rerun {
    /// The compute operators' durations (each on all the cores of its kind).
    pub seconds: f64,
    /// The link operators' (tensor-parallel collectives'), what the schedule exposes of
    /// them.
    pub communication: f64,
    pub joules: f64,
    /// The compute operators' memory time; `None` when the latency model does not say.
    pub memory: Option<f64>,
    /// The operators' durations by kind of work ([`Work`]).
    pub work: [f64; Work::COUNT],
}

/// One layer graph's schedule on the chip, as a step uses it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GraphTiming {
    pub makespan: f64,
    /// Link operators' time.
    pub link: f64,
    /// Of a forward graph, what selective recomputation runs again (the plan's modules)
    /// and what per-operator selective checkpointing does ([`LayerTiming::rerun`]).
    pub selective: Rerun,
    pub op_checkpoint: Rerun,
    pub joules: f64,
    pub optimal: bool,
    pub gap: f64,
    /// The sum of the core operators' memory times (the schedule's memory floor);
    /// `None` when the latency model gives none of them.
    pub memory: Option<f64>,
    /// The operators' durations (on all cores of their kind) by kind of work.
    pub work: [f64; Work::COUNT],
    /// The weight-gradient operators' durations (a backward graph's `…grad_weight`
    /// GEMMs): what the zero-bubble schedules run as a pass of their own.
    pub weight_gradient: f64,
}

/// What the step takes of a layer's schedule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScheduleOutcome {
    pub makespan: f64,
    pub optimal: bool,
    pub gap: f64,
    /// With tensor-parallel collectives that may overlap computation, the time they leave
    /// exposed ([`crate::schedule::Schedule::exposed_link_seconds`]); `None` when they run
    /// alone, all of their time exposed (their sum, exactly).
    pub exposed_link: Option<f64>,
}

/// The timing of graph `g` whose scheduling instance on `c` is `inst` and whose schedule
/// came out as `outcome`: its exposed link time, its attention core's, and the joules of
/// every operator run on all cores of its kind, `cost` answering for one operator. The
/// search and [`estimate_step`] both time layers through this function, so a plan the
/// search reports is priced as `archplace estimate` prices it.
pub fn graph_timing(
    g: &OpGraph,
    inst: &Instance,
    c: &AcceleratorConfig,
    outcome: ScheduleOutcome,
    mut cost: impl FnMut(&CoreConfig, &Op) -> Result<OpCost, EstimateError>,
) -> Result<GraphTiming, EstimateError> {
    let ScheduleOutcome {
        makespan,
        optimal,
        gap,
        exposed_link,
    } = outcome;
    let (mut link, mut joules) = (0.0, 0.0);
    let (mut memory, mut memory_known) = (0.0, false);
    let (mut selective, mut checkpoint) = (Rerun::default(), Rerun::default());
    let mut work = [0.0; Work::COUNT];
    let mut weight_gradient = 0.0;
    for (node, task) in g.nodes.iter().zip(&inst.tasks) {
        let all = match node.core {
            crate::model::Core::Vector => c.vector_core(c.vector_cores),
            crate::model::Core::Link => c.vector_core(1),
            _ => c.tensor_core(c.tensor_cores),
        };
        let answer = cost(&all, &node.op)?;
        let j = answer.joules;
        joules += j;
        // A collective's whole time, also when the instance keeps only what pipelining
        // with its GEMM leaves exposed (`crate::operators::pipelined_exposure`).
        let seconds = if task.resource == Resource::Link {
            answer.seconds
        } else {
            task.parallel
        };
        work[node.work() as usize] += seconds;
        if node.name.contains(".grad_weight") && task.resource.is_core() {
            weight_gradient += seconds;
        }
        if task.resource == Resource::Link {
            link += seconds;
        } else if task.resource.is_core() {
            memory_known |= answer.memory_seconds.is_some();
            memory += task.memory;
        }
        // What each partial recomputation runs again of the operator.
        for (rerun, policy) in [
            (&mut selective, Recomputation::Selective),
            (&mut checkpoint, Recomputation::SelectiveOp),
        ] {
            let share = node.rerun_share(policy);
            if share == 0.0 {
                continue;
            }
            if task.resource == Resource::Link {
                rerun.communication += share * seconds;
            } else if task.resource.is_core() {
                rerun.seconds += share * task.parallel;
                *rerun.memory.get_or_insert(0.0) += share * task.memory;
            }
            rerun.joules += share * j;
            rerun.work[node.work() as usize] += share * seconds;
        }
    }
    let exposed = exposed_link.unwrap_or(link);
    for rerun in [&mut selective, &mut checkpoint] {
        // The collectives run again as exposed as they were, and the memory time is known
        // when the pass's is.
        if link > 0.0 {
            rerun.communication *= exposed / link;
        }
        rerun.memory = memory_known.then(|| rerun.memory.unwrap_or(0.0));
    }
    Ok(GraphTiming {
        makespan,
        link: exposed,
        selective,
        op_checkpoint: checkpoint,
        joules,
        optimal,
        gap,
        memory: memory_known.then_some(memory.min(makespan)),
        work,
        weight_gradient: weight_gradient.min(makespan),
    })
}

/// Memoised latency-model answers, fetched in one batch per core configuration.
struct Costs<'a> {
    model: &'a dyn LatencyModel,
    execution: crate::execution::Execution,
    memo: HashMap<(CoreConfig, Op), OpCost>,
}

impl Costs<'_> {
    fn prefetch(&mut self, graphs: &[&OpGraph], c: &AcceleratorConfig) -> Result<(), StepError> {
        let mut missing: BTreeMap<CoreConfig, Vec<Op>> = BTreeMap::new();
        let zero = OpCost::new(0.0, 0.0);
        for g in graphs {
            let _ = instance_with(g, c, self.execution, |core, op| {
                if !self.memo.contains_key(&(*core, op.clone())) {
                    missing.entry(*core).or_default().push(op.clone());
                }
                Ok(zero)
            });
        }
        for (core, mut ops) in missing {
            ops.sort();
            ops.dedup();
            let costs = estimate(self.model, &core, &ops)?;
            for (op, cost) in ops.into_iter().zip(costs) {
                self.memo.insert((core, op), cost);
            }
        }
        Ok(())
    }

    fn get(&self, core: &CoreConfig, op: &Op) -> Result<OpCost, EstimateError> {
        self.memo
            .get(&(*core, op.clone()))
            .copied()
            .ok_or_else(|| EstimateError::Internal("operator missing from the memo".into()))
    }

    /// Times one layer graph: its schedule's makespan, its link time, the attention core,
    /// and the joules of every operator (run on all cores of its kind).
    fn time(
        &self,
        g: &OpGraph,
        c: &AcceleratorConfig,
        options: &ScheduleOptions,
    ) -> Result<GraphTiming, StepError> {
        let inst = instance_with(g, c, self.execution, |core, op| self.get(core, op))?;
        let s = schedule::solve(&inst, options).map_err(|e| StepError::Schedule(e.to_string()))?;
        let outcome = ScheduleOutcome {
            makespan: s.makespan,
            optimal: s.optimal,
            gap: s.gap,
            exposed_link: self
                .execution
                .tensor_parallel_overlap
                .overlaps()
                .then(|| s.exposed_link_seconds(&inst)),
        };
        Ok(graph_timing(g, &inst, c, outcome, |core, op| {
            self.get(core, op)
        })?)
    }
}

/// Checks the plan against the model and the cluster, before any work: the first of
/// [`problems`].
pub fn check(input: &StepInput) -> Result<(), StepError> {
    match problems(input).into_iter().next() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Every problem of the plan against the model and the cluster, each checked whatever the
/// others (but the interleaving, which needs a whole number of micro-batches): a spec
/// reports them all in one run.
pub fn problems(input: &StepInput) -> Vec<StepError> {
    let (m, pl) = (&input.model, &input.plan);
    let mut found = Vec::new();
    let t = pl.tensor_parallel;
    if t == 0 || !m.supports_tensor_parallel(t) || t > m.max_tensor_parallel.max(1) {
        found.push(StepError::TensorParallel {
            t,
            heads: m.heads,
            kv_heads: m.kv_heads,
            hidden: m.hidden,
            ffn: m.ffn,
            max: m.max_tensor_parallel,
        });
    }
    let p = pl.pipeline_parallel;
    let v = pl.even_chunks();
    let chunks = p.saturating_mul(v);
    if let Some(list) = &pl.stage_layers {
        let inner_empty = list.len() > 2 && list[1..list.len() - 1].contains(&0);
        let sum = list.iter().try_fold(0u64, |a, &b| a.checked_add(b));
        if p == 0 || list.len() as u64 != p || sum != Some(m.layers) || inner_empty {
            found.push(StepError::StageLayers {
                stages: list.clone(),
                pipeline: p,
                layers: m.layers,
            });
        }
    } else if p == 0 || v == 0 || chunks > m.layers || !m.layers.is_multiple_of(chunks) {
        found.push(StepError::Pipeline {
            pipeline: p,
            interleaving: v,
            layers: m.layers,
            chunks,
        });
    }
    let d = pl.data_parallel;
    found.extend(expert_problems(m, pl));
    found.extend(context_problems(m, pl.context_parallel));
    if pl.context_exchange.method == ContextMethod::AllToAll {
        found.extend(all_to_all_problem(
            m,
            pl.tensor_parallel,
            pl.context_parallel,
        ));
    }
    if pl.sharding.zero_stage > 3 {
        found.push(StepError::ZeroStage {
            stage: pl.sharding.zero_stage,
        });
    }
    if let Some(group) = pl.sharding.sharding_group
        && (group == 0 || !pl.gradient_group().is_multiple_of(group) || pl.zero_stage() == 0)
    {
        found.push(StepError::ShardingGroup {
            group,
            d: pl.gradient_group(),
            zero: pl.zero_stage(),
        });
    }
    let needed = pl.devices();
    if d == 0 || needed != input.devices {
        found.push(StepError::Devices {
            t,
            cp: pl.context_parallel,
            p,
            d,
            needed,
            devices: input.devices,
        });
    }
    let per_step = pl.micro_batch.saturating_mul(d);
    if per_step == 0 || !input.global_batch.is_multiple_of(per_step) {
        found.push(StepError::Batch {
            global_batch: input.global_batch,
            micro_batch: pl.micro_batch,
            d,
        });
        return found;
    }
    let micro_batches = input.global_batch / per_step;
    let schedule = pl.schedule();
    if schedule == PipelineSchedule::Interleaved
        && pl.interleaving > 1
        && (p < 2 || !micro_batches.is_multiple_of(p))
    {
        found.push(StepError::Interleaving {
            micro_batches,
            pipeline: p,
        });
    }
    found.extend(
        schedule
            .problems(p, pl.interleaving, micro_batches)
            .into_iter()
            .map(StepError::PipelineSchedule),
    );
    found
}

/// The plan's expert layout against the model: only a Mixture-of-Experts model splits
/// experts, EP divides them, ETP their width, both fold into a stage's `t × d` ranks, and
/// tensor parallelism comes with sequence parallelism.
fn expert_problems(m: &ModelConfig, pl: &StepPlan) -> Vec<StepError> {
    let (t, d) = (pl.tensor_parallel, pl.data_parallel);
    let (ep, etp) = (pl.expert_parallel, pl.expert_tensor_parallel);
    let mut found = Vec::new();
    let Some(moe) = m.moe else {
        if ep != 1 || etp != 1 {
            found.push(StepError::ExpertsWithoutMoe {
                model: m.name.clone(),
                ep,
                etp,
            });
        }
        return found;
    };
    if ep == 0 || !moe.experts.is_multiple_of(ep) {
        found.push(StepError::ExpertParallel {
            ep,
            experts: moe.experts,
        });
    }
    if etp == 0 || !etp.is_power_of_two() || !moe.expert_ffn.is_multiple_of(etp) {
        found.push(StepError::ExpertTensorParallel {
            etp,
            expert_ffn: moe.expert_ffn,
        });
    }
    let ranks = pl.stage_ranks();
    let groups = ep.saturating_mul(etp);
    if groups == 0 || ranks == 0 || !ranks.is_multiple_of(groups) {
        found.push(StepError::ExpertFolding {
            ep,
            etp,
            t,
            cp: pl.context_parallel,
            d,
            ranks,
        });
    }
    if t > 1 && !pl.sequence_parallel {
        found.push(StepError::MoeSequenceParallel { t });
    }
    found
}

/// Ulysses' all-to-all (`ContextMethod::AllToAll`) at tensor-parallel width `t` and
/// context-parallel size `cp`: each CP rank attends to `1/CP` of its tensor-parallel
/// rank's heads, so those heads and the key-value heads must divide among the CP ranks
/// (Transformer Engine's `a2a` asserts both; the latent attention's keys and values are
/// per head). The step's check and the search's choice of widths.
pub(crate) fn all_to_all_problem(m: &ModelConfig, t: u64, cp: u64) -> Option<StepError> {
    let kv_heads = if m.attention == AttentionKernel::Mla {
        m.heads
    } else {
        m.kv_heads
    };
    let ranks = t.max(1).saturating_mul(cp.max(1));
    (cp > 1 && !(m.heads.is_multiple_of(ranks) && kv_heads.is_multiple_of(ranks))).then_some(
        StepError::ContextAllToAll {
            heads: m.heads,
            kv_heads,
            t,
            cp,
        },
    )
}

/// Context parallelism of `cp` ranks against the model: CP splits the sequence into `2·CP`
/// equal chunks (causal) or `CP` (bidirectional), and needs a fused attention kernel. The
/// step's check and the search's choice of sizes (`search::context_parallel_fits`).
pub(crate) fn context_problems(m: &ModelConfig, cp: u64) -> Vec<StepError> {
    let mut found = Vec::new();
    let chunks = cp.saturating_mul(if m.causal { 2 } else { 1 });
    if cp == 0 || !m.seq_len.is_multiple_of(chunks) {
        found.push(StepError::ContextParallel {
            cp,
            seq: m.seq_len,
            chunks,
        });
    }
    if cp > 1 && m.attention == AttentionKernel::Unfused {
        found.push(StepError::ContextParallelAttention {
            cp,
            model: m.name.clone(),
            attention: m.attention.name().into(),
        });
    }
    found
}

/// The layer graphs of `input`'s model for its plan: one rank's embedding, block and
/// head at its micro-batch, width, precision and sequence parallelism, the
/// tensor-parallel collectives on the tier the group lives on.
pub fn graph(input: &StepInput) -> ModelGraph {
    let pl = &input.plan;
    let t = pl.tensor_parallel;
    build(
        &input.model,
        &BuildOptions {
            micro_batch: pl.micro_batch,
            tensor_parallel: t,
            numerics: pl.precision.numerics(pl.fp8_scaling),
            link_bytes_per_second: input.network.tier(t).bytes_per_second as u64,
            sequence_parallel: pl.sequence_parallel,
            experts: ExpertLayout {
                parallel: pl.expert_parallel.max(1),
                tensor_parallel: pl.expert_tensor_parallel.max(1),
                link_bytes_per_second: input
                    .network
                    .tier(pl.expert_tensor_parallel.max(1))
                    .bytes_per_second as u64,
            },
            context_parallel: pl.context_parallel.max(1),
            recompute_modules: pl.recompute_modules,
            kernels: input.execution.kernels,
            fp8_library: input.execution.fp8_library,
            cross_entropy: input.execution.cross_entropy,
        },
    )
}

/// Estimates one training step of `input` with `latency`.
pub fn estimate_step(
    input: &StepInput,
    latency: &dyn LatencyModel,
) -> Result<StepReport, StepError> {
    let (g, stages, timing) = prepared(input, latency)?;
    priced(input, &g, stages, &timing, &mut one_cost(latency))
}

/// What pricing a plan starts from: the plan checked, its graph, its stages (memory first:
/// a plan that does not fit is answered without any cost-model work) and its layers'
/// timing on the chip.
type Prepared = (
    ModelGraph,
    (Vec<StageSummary>, Worst),
    [LayerTiming; DISTINCT_LAYERS],
);

fn prepared(input: &StepInput, latency: &dyn LatencyModel) -> Result<Prepared, StepError> {
    check(input)?;
    let g = graph(input);
    let stages = fitting_stages(input, &g)?;
    let timing = layer_timings(input, &g, latency)?;
    Ok((g, stages, timing))
}

/// One operator's cost from `latency` (the optimizer step's, the weight casts').
fn one_cost(
    latency: &dyn LatencyModel,
) -> impl FnMut(&CoreConfig, &Op) -> Result<OpCost, EstimateError> + '_ {
    move |core: &CoreConfig, op: &Op| {
        Ok(estimate(latency, core, std::slice::from_ref(op))?
            .first()
            .copied()
            .unwrap_or(OpCost::new(0.0, 0.0)))
    }
}

/// [`estimate_step`] of a plan whose layers are already timed: `g` is [`graph`]`(input)`,
/// `timing` its distinct layers' [`LayerTiming`] on the chip ([`ModelGraph::distinct`]:
/// embedding, block, head, dense block, multi-token prediction), and `cost`
/// answers for one operator (the optimizer step's). The search prices the plans it
/// reports through this function, with its own memo of schedules and operator costs.
pub fn estimate_timed_step(
    input: &StepInput,
    g: &ModelGraph,
    timing: &[LayerTiming; DISTINCT_LAYERS],
    cost: &mut dyn FnMut(&CoreConfig, &Op) -> Result<OpCost, EstimateError>,
) -> Result<StepReport, StepError> {
    check(input)?;
    let stages = fitting_stages(input, g)?;
    priced(input, g, stages, timing, cost)
}

/// The synchronisation of every split of a plan's blocks whose most loaded device holds
/// `most_blocks` of them, at least ([`PlanFloor::splits`]): that of the largest stage's
/// parameters, which are at least the mean stage's, the `X` blocks' of the most loaded
/// device, and the embedding's device's — the embedding and the blocks the other `p − 1`
/// devices, `X` each at most, leave it — the synchronisation growing with the parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SplitFloor {
    pub most_blocks: u64,
    /// The data-parallel synchronisation the backward and forward passes may hide
    /// (`data_parallel_overlap`: the gradients' and weights' part), in seconds.
    pub hideable_sync_seconds: f64,
    /// The synchronisation nothing hides (all of it without the overlap; the tied
    /// embedding's all-reduce), in seconds.
    pub exposed_sync_seconds: f64,
}

/// What the step model counts for a plan, at least, however its stages split the layers:
/// what a proven search bounds a plan shape by (`search::bound`).
#[derive(Debug, Clone, PartialEq)]
pub struct PlanFloor {
    /// The most loaded stage's state (weights, gradients, optimizer state and FP8 weight
    /// copies) in bytes per device: at least the mean over the stages, whose sums no split
    /// changes (the copies' at ZeRO-3, the largest layer's, only grow when split).
    pub state_bytes: f64,
    /// For each number of blocks `X` the most loaded device may hold, from the fewest any
    /// split that fits the plan's HBM allows (`most_blocks`) to where the embedding's
    /// device may hold none, the synchronisation of every split with that `X`, at least;
    /// empty when no split fits: the plan shape's activations and state cannot, however
    /// it is placed.
    pub splits: Vec<SplitFloor>,
    /// The point-to-point transfers every stage exposes per micro-batch (none with the
    /// pipeline overlap, which may hide them), in seconds.
    pub transfer_seconds: f64,
}

/// [`PlanFloor`] of a plan that passes [`check`] (its stage list, if any, is one split
/// among those it bounds; its `hbm_bytes` the largest a search tries). The
/// synchronisation is that of a floor on the largest stage's parameters, which the step
/// model syncs ([`SplitFloor`]), its time growing with the bytes.
pub fn plan_floor(input: &StepInput, g: &ModelGraph) -> PlanFloor {
    let pl = &input.plan;
    let p = pl.pipeline_parallel.max(1) as f64;
    let micro_batches = input.global_batch / pl.micro_batch.saturating_mul(pl.data_parallel).max(1);
    let state = StageState::of(pl);
    let stages = stage_memory(input, g, &state, micro_batches);
    let sum = |f: fn(&StageSummary) -> u64| stages.iter().map(f).sum::<u64>();
    let (params, experts) = (sum(|s| s.parameters), sum(|s| s.expert_parameters));
    let quantised = sum(|s| s.quantised_parameters);
    let total = state.bytes(params, experts)[3] + quantised_copies(input, g, quantised)
        - bf16_dropped(pl, quantised);
    let most = most_blocks(input, g, &state, micro_batches);
    // The largest stage's parameters (what the synchronisation moves), at least, for each
    // most loaded device's blocks `X` worth bounding (see `PlanFloor::splits`).
    let blocks = input.model.layers;
    let stages = pl.pipeline_parallel.max(1);
    let (block_dense, block_experts) = block_kinds(g, blocks)
        .map(|l| (l.parameters - l.expert_parameters, l.expert_parameters))
        .reduce(|(d0, e0), (d1, e1)| (d0.min(d1), e0.min(e1)))
        .unwrap_or((0, 0));
    let embedding = (g.embedding.parameters - g.embedding.expert_parameters) as f64;
    let mean = ((params - experts) as f64 / p, experts as f64 / p);
    let sync = |x: u64| {
        // The embedding's device holds what the others cannot.
        let with_embedding = blocks.saturating_sub((stages - 1).saturating_mul(x));
        let largest = (
            mean.0
                .max(x as f64 * block_dense as f64)
                .max(embedding + with_embedding as f64 * block_dense as f64),
            mean.1.max(x as f64 * block_experts as f64),
        );
        let all = data_parallel_seconds(input, g, largest, (0.0, 0.0));
        let exposed = if pl.sharding.data_parallel_overlap {
            data_parallel_seconds(input, g, largest, (f64::INFINITY, f64::INFINITY))
        } else {
            all
        };
        SplitFloor {
            most_blocks: x,
            hideable_sync_seconds: (all - exposed).max(0.0),
            exposed_sync_seconds: exposed,
        }
    };
    // From the least `X` on, until the embedding's device may hold no block (beyond, a
    // larger `X` only adds).
    let splits = most.map_or_else(Vec::new, |least| {
        let last = least.max(blocks.div_ceil((stages - 1).max(1)));
        (least..=last.min(blocks)).map(sync).collect()
    });
    PlanFloor {
        state_bytes: total / p,
        splits,
        transfer_seconds: if pl.hides_transfers() {
            0.0
        } else {
            point_to_point_seconds(input)
        },
    }
}

/// The kinds of block a model of `blocks` blocks has: the repeated block, and the dense
/// block when some of its first blocks are dense (each present only if some block is of it).
fn block_kinds(g: &ModelGraph, blocks: u64) -> impl Iterator<Item = &Layer> {
    let dense = g.dense_blocks.min(blocks);
    let dense_block = g.dense_block.as_ref().unwrap_or(&g.block);
    [(&g.block, blocks > dense), (dense_block, dense > 0)]
        .into_iter()
        .filter(|(_, present)| *present)
        .map(|(l, _)| l)
}

/// The fewest blocks the most loaded of the pipeline's `p` devices holds, over every split
/// of the model's blocks among them in which each device's memory (`stage_memory`'s
/// total) fits `input.hbm_bytes`; `None` when none does.
///
/// Why it holds. Device `k` holds `x_k` blocks (a whole number: its chunks'); each costs
/// it at least `s` bytes of state (weights, gradients, optimizer state, the FP8 copies less
/// the 16-bit weights they replace, ZeRO-2/3's buffers that grow with the stage's
/// parameters; the least of the block kinds') and, for each of the
/// `f_k` micro-batches in flight at its peak (`PipelineSchedule::in_flight`, in units of
/// the device's share of its chunks), `a` bytes of kept activations (the least kind's
/// under the plan's recomputation): `memory_k ≥ c_k · x_k` with
/// `c_k = s + a · share · f_k`, everything else it holds (the embedding, the head,
/// buffers, one rematerialised block) only adding. A split that fits has
/// `x_k ≤ ⌊hbm / c_k⌋` on every device, and every block sits on some device
/// (`Σ x_k ≥ blocks`): its most loaded device holds at least the least `X` with
/// `Σ_k min(X, ⌊hbm / c_k⌋) ≥ blocks`, and there is none when even the caps fall short.
fn most_blocks(
    input: &StepInput,
    g: &ModelGraph,
    state: &StageState,
    micro_batches: u64,
) -> Option<u64> {
    let pl = &input.plan;
    let (p, v) = (pl.pipeline_parallel.max(1), pl.interleaving.max(1));
    let schedule = pl.schedule();
    let share = schedule.visited_share(v);
    let blocks = input.model.layers;
    let per_block = |l: &Layer| {
        let copies = if pl.zero_stage() >= 3 {
            // ZeRO-3's copies are the largest layer's, not per block: left out.
            0.0
        } else {
            quantised_copies(input, g, l.quantised_parameters)
        };
        // ZeRO-2/3's buffers that grow with the stage's parameters (its gathered weights,
        // its unsharded gradients), not those of its largest layer alone.
        let (gathered, unsharded) = zero_buffers(pl, 0, l.parameters);
        let state_bytes =
            state.bytes(l.parameters, l.expert_parameters)[3] + copies + gathered + unsharded
                - bf16_dropped(pl, l.quantised_parameters);
        (state_bytes.max(0.0), l.kept_bytes(pl.recomputation) as f64)
    };
    let least_most = blocks.div_ceil(p);
    let Some((s, a)) = block_kinds(g, blocks)
        .map(per_block)
        .reduce(|(s0, a0), (s1, a1)| (s0.min(s1), a0.min(a1)))
    else {
        return Some(least_most);
    };
    let hbm = input.hbm_bytes as f64;
    // Each device's cap on its blocks (`blocks` when nothing binds).
    let caps: Vec<u64> = (0..p)
        .map(|k| {
            let c = s + a * share * schedule.in_flight(k, p, v, micro_batches);
            if c <= 0.0 {
                blocks
            } else {
                ((hbm / c).floor().min(blocks as f64)) as u64
            }
        })
        .collect();
    let held = |x: u64| caps.iter().map(|&cap| cap.min(x)).sum::<u64>();
    if held(blocks) < blocks {
        return None;
    }
    // The least `X` whose capped sum holds every block (`held` grows with `X`).
    let (mut lo, mut hi) = (least_most, blocks);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if held(mid) >= blocks {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    Some(lo)
}

/// The most loaded stage and its memory per device.
type Worst = (u64, MemoryBreakdown);

/// State bytes per parameter of a plan: the dense parameters' (optimizer sharded over the
/// data-parallel group with the distributed optimizer) and the experts' (over the
/// expert-data-parallel group).
struct StageState {
    dense: StateBytes,
    experts: StateBytes,
}

impl StageState {
    fn of(pl: &StepPlan) -> StageState {
        let state = |group| StateBytes::sharded(pl.precision, pl.optimizer, pl.zero_stage(), group);
        let groups = pl.shard_groups();
        StageState {
            dense: state(groups.dense.0),
            experts: state(groups.experts.0),
        }
    }

    /// Weights, gradients, optimizer state and their total, in bytes, of `parameters` of
    /// which `experts` are expert parameters.
    fn bytes(&self, parameters: u64, experts: u64) -> [f64; 4] {
        let (e, dense) = (experts as f64, parameters.saturating_sub(experts) as f64);
        let part = |f: fn(&StateBytes) -> f64| dense * f(&self.dense) + e * f(&self.experts);
        [
            part(|s| s.weights),
            part(|s| s.gradients),
            part(|s| s.optimizer),
            part(StateBytes::total),
        ]
    }
}

/// Each stage's parameters and memory with the most loaded one, or that stage's error when
/// it does not fit.
fn fitting_stages(
    input: &StepInput,
    g: &ModelGraph,
) -> Result<(Vec<StageSummary>, Worst), StepError> {
    let pl = &input.plan;
    let d = pl.data_parallel;
    let micro_batches = input.global_batch / (pl.micro_batch * d);
    let stages = stage_memory(input, g, &StageState::of(pl), micro_batches);
    let worst = stages
        .iter()
        .max_by(|a, b| a.memory_bytes.total.total_cmp(&b.memory_bytes.total))
        .map(|s| (s.stage, s.memory_bytes))
        .unwrap_or_default();
    if worst.1.total > input.hbm_bytes as f64 {
        return Err(StepError::OutOfMemory {
            stage: worst.0,
            memory: worst.1,
            hbm_bytes: input.hbm_bytes,
        });
    }
    Ok((stages, worst))
}

/// The step of a checked plan that fits, from its layers' timing: pipeline, data-parallel
/// synchronisation, optimizer step, FLOPs and energy.
fn priced(
    input: &StepInput,
    g: &ModelGraph,
    (mut stages, worst): (Vec<StageSummary>, Worst),
    timing: &[LayerTiming; DISTINCT_LAYERS],
    cost: &mut dyn FnMut(&CoreConfig, &Op) -> Result<OpCost, EstimateError>,
) -> Result<StepReport, StepError> {
    let pl = &input.plan;
    let (t, d, b) = (pl.tensor_parallel, pl.data_parallel, pl.micro_batch);
    let micro_batches = input.global_batch / (b * d);
    let pipeline = pipeline_times(input, g, timing, &mut stages);
    // Data-parallel synchronisation of the largest stage's gradients (every stage syncs
    // at once; the largest bounds the step): the dense parameters' over the data-parallel
    // group, the experts' over the expert-data-parallel group.
    let largest = |f: fn(&StageSummary) -> u64| stages.iter().map(f).max().unwrap_or(0) as f64;
    let experts_max = largest(|s| s.expert_parameters);
    let dense_max = largest(|s| s.parameters - s.expert_parameters);
    let dp = data_parallel_seconds(
        input,
        g,
        (dense_max, experts_max),
        (pipeline.forward, pipeline.backward),
    );
    // What ZeRO-2/3 moves once a step under pipeline parallelism, the largest stage's:
    // hidden behind one micro-batch's forward pass and one's backward (with its
    // recomputation) when overlapped.
    let once = fsdp_traffic(
        input,
        g,
        (dense_max as u64, experts_max as u64),
        micro_batches,
    );
    let once_traffic = once.before_first_forward + once.after_last_backward;
    let once_exposed = if pl.sharding.data_parallel_overlap {
        let net = &input.network;
        net.exposed_beside(once.before_first_forward, pipeline.forward)
            + net.exposed_beside(
                once.after_last_backward,
                pipeline.backward + pipeline.recomputation,
            )
    } else {
        once_traffic
    };
    let opt_cost = optimizer_step(input, cost, (dense_max, experts_max))?;
    let quantised_max = largest(|s| s.quantised_parameters);
    let casts = weight_casts(input, cost, quantised_max as u64, micro_batches)?;
    let m = micro_batches as f64;
    let time = TimeBreakdown {
        forward_seconds: m * pipeline.forward,
        backward_seconds: m * pipeline.backward,
        recomputation_seconds: m * pipeline.recomputation,
        tensor_parallel_communication_seconds: m * pipeline.communication,
        all_to_all_seconds: m * pipeline.all_to_all,
        context_parallel_communication_seconds: m * pipeline.context,
        activation_offload_seconds: m * pipeline.activation_offload,
        fsdp_communication_seconds: m * pipeline.fsdp + once_exposed,
        pipeline_point_to_point_seconds: m * pipeline.point_to_point,
        pipeline_bubble_seconds: pipeline.bubble,
        data_parallel_communication_seconds: dp,
        weight_cast_seconds: casts.seconds,
        optimizer_step_seconds: opt_cost.seconds,
    };
    let step = time.total();
    let operators = OperatorSeconds::of(
        &pipeline.work.map(|w| m * w),
        (
            m * pipeline.all_to_all_traffic,
            m * pipeline.context_traffic,
            casts.seconds,
        ),
    );
    let (model_flops, hardware_flops) = step_flops(input, g, pipeline.rerun_share);
    let devices = input.devices as f64;
    let model_rate = model_flops / step / devices;
    // Energy: every operator of every layer on every device, per micro-batch.
    let [emb, blk, head, dns, mtp] = *timing;
    // The layers the model has, timed once each (the others' slots repeat the block).
    let distinct: Vec<&LayerTiming> = (0..DISTINCT_LAYERS)
        .filter(|&k| g.has_slot(k))
        .map(|k| &timing[k])
        .collect();
    let [again_main, again_dense, again_mtp] =
        [0, 1, 2].map(|i| pipeline.recompute_joules[i] * pipeline.rerun_share[i]);
    let per_replica_micro_batch = emb.forward_joules
        + emb.backward_joules
        + g.main_blocks() as f64 * (blk.forward_joules + blk.backward_joules + again_main)
        + g.dense_blocks as f64 * (dns.forward_joules + dns.backward_joules + again_dense)
        + u64::from(g.mtp.is_some()) as f64
            * (mtp.forward_joules + mtp.backward_joules + again_mtp)
        + head.forward_joules
        + head.backward_joules;
    // A replica is t × CP × p devices; its micro-batch joules are per rank of one layer.
    let total_micro_batches = (input.global_batch / b) as f64;
    let ranks = (t * pl.context_parallel) as f64;
    let energy = per_replica_micro_batch * ranks * total_micro_batches
        + (opt_cost.joules + casts.joules) * devices;
    let samples = input.global_batch as f64 / step;
    Ok(StepReport {
        step_seconds: step,
        time,
        fsdp_traffic_seconds: m * pipeline.fsdp_traffic + once_traffic,
        activation_offload_traffic_seconds: m * pipeline.activation_offload_traffic,
        operator_seconds: operators,
        hbm_busy_seconds: pipeline.memory.map(|busy| m * busy),
        memory_bytes: worst.1,
        memory_stage: worst.0,
        hbm_bytes: input.hbm_bytes,
        stages,
        micro_batches_per_replica: micro_batches,
        samples_per_second: samples,
        tokens_per_second: samples * input.model.seq_len as f64,
        tokens_per_second_per_device: samples * input.model.seq_len as f64 / devices,
        model_flops_per_step: model_flops,
        hardware_flops_per_step: hardware_flops,
        model_flops_per_second_per_device: model_rate,
        hardware_flops_per_second_per_device: hardware_flops / step / devices,
        model_flops_utilisation: input
            .peak_flops_per_second
            .filter(|p| *p > 0.0)
            .map(|p| model_rate / p),
        energy_per_step_joules: energy,
        limiting: time.limiting().to_string(),
        schedules_not_proven_optimal: distinct.iter().map(|l| l.not_proven).sum(),
        layer_schedules: 2 * distinct.len() as u64,
        schedules_max_gap: distinct.iter().map(|l| l.max_gap).fold(0.0, f64::max),
    })
}

/// Each pipeline stage's parameters and memory per device: state bytes per parameter
/// times its parameters, and the activations of the micro-batches in flight on it.
fn stage_memory(
    input: &StepInput,
    g: &ModelGraph,
    state: &StageState,
    micro_batches: u64,
) -> Vec<StageSummary> {
    let pl = &input.plan;
    let (p, v) = (pl.pipeline_parallel, pl.interleaving);
    let schedule = pl.schedule();
    let loads = device_loads(pl, input.model.layers, g);
    let dense_block = g.dense_block.as_ref().unwrap_or(&g.block);
    let mut stages = Vec::with_capacity(p as usize);
    for (k, load) in loads.iter().enumerate() {
        let (held, run) = (load.held, load.run);
        let whole = |x: f64| x as u64;
        // Per block kind the device holds: (layer, how many).
        let kinds = [
            (&g.block, whole(held.main)),
            (dense_block, whole(held.dense)),
        ];
        let mut params: u64 = kinds.iter().map(|(l, c)| c * l.parameters).sum();
        params += whole(held.embedding) * g.embedding.parameters;
        let mut experts = whole(held.main) * g.block.expert_parameters;
        let mut quantised: u64 = kinds.iter().map(|(l, c)| c * l.quantised_parameters).sum();
        // The multi-token-prediction modules sit with the head.
        let mtp = g.mtp.as_ref().filter(|_| held.mtp > 0.0);
        params += whole(held.head) * g.head.parameters;
        if load.shared_ends {
            // One device holds both ends of one copy of the model: a tied output embedding
            // (or the copy of the input embedding multi-token prediction looks up) is the
            // input's.
            params -= g.head.shared_parameters;
        }
        if let Some(l) = mtp {
            params += whole(held.mtp) * l.parameters;
            experts += whole(held.mtp) * l.expert_parameters;
            quantised += whole(held.mtp) * l.quantised_parameters;
        }
        let in_flight = schedule.in_flight(k as u64, p, v, micro_batches);
        // One micro-batch's kept activations on the device (DualPipe's: the mean of its two
        // stages', which the schedule's count is in): the recomputed blocks keep what the
        // plan's recomputation keeps, the others everything, the offloaded ones nothing.
        let (rerun, offloaded) = (load.rerun, load.offloaded);
        let kept = |l: &crate::model::Layer, n: f64, again: f64, away: f64| {
            again * l.kept_bytes(pl.recomputation) as f64
                + (n - again - away).max(0.0) * l.kept_bytes(Recomputation::None) as f64
        };
        let per_micro_batch = kept(&g.block, run.main, rerun.main, offloaded.main)
            + kept(dense_block, run.dense, rerun.dense, offloaded.dense)
            + run.embedding * g.embedding.stash_bytes as f64;
        let mut activations = in_flight * per_micro_batch;
        if offloaded.main + offloaded.dense > 0.0 {
            // The block being brought back while the one after it runs backward (the
            // larger kind's).
            activations += [(&g.block, offloaded.main), (dense_block, offloaded.dense)]
                .iter()
                .filter(|(_, n)| *n > 0.0)
                .map(|(l, _)| l.kept_bytes(Recomputation::None) as f64)
                .fold(0.0, f64::max);
        }
        // The head's activations live from its forward to its backward, which follows; so
        // do the multi-token-prediction modules' that precede it.
        activations += held.head * g.head.stash_bytes as f64;
        activations += mtp.map_or(0, |l| l.kept_bytes(pl.recomputation)) as f64;
        // At most one transient at a time besides what is kept: one block's rematerialised
        // activations (the larger kind's on the device) while its backward runs, or the
        // loss's logits and gradients while the head's runs.
        let rematerialised = if pl.recomputation != Recomputation::None
            && rerun.main + rerun.dense + rerun.mtp > 0.0
        {
            kinds
                .iter()
                .filter(|(_, c)| *c > 0)
                .map(|(l, _)| *l)
                .chain(mtp)
                .map(|l| (l.stash_bytes - l.kept_bytes(pl.recomputation)) as f64)
                .fold(0.0, f64::max)
        } else {
            0.0
        };
        let loss = if held.head > 0.0 {
            g.head.workspace_bytes as f64
        } else {
            0.0
        };
        activations += rematerialised.max(loss);
        let [weights, gradients, optimizer, state_total] = state.bytes(params, experts);
        // The largest layer on the device, for what ZeRO-2/3 hold unsharded while it runs.
        let largest = kinds
            .iter()
            .filter(|(_, c)| *c > 0)
            .map(|(l, _)| l.parameters)
            .chain((held.embedding > 0.0).then_some(g.embedding.parameters))
            .chain((held.head > 0.0).then_some(g.head.parameters))
            .chain(mtp.map(|l| l.parameters))
            .max()
            .unwrap_or(0);
        let (gathered, unsharded) = zero_buffers(pl, largest, params);
        let copies = quantised_copies(input, g, quantised) - bf16_dropped(pl, quantised);
        let memory = MemoryBreakdown {
            weights: weights + gathered + copies,
            gradients: gradients + unsharded,
            optimizer,
            activations,
            total: state_total + gathered + copies + unsharded + activations,
        };
        stages.push(StageSummary {
            stage: k as u64,
            blocks: whole(held.main + held.dense),
            embedding: held.embedding > 0.0,
            head: held.head > 0.0,
            parameters: params,
            expert_parameters: experts,
            quantised_parameters: quantised,
            seconds_per_micro_batch: 0.0,
            micro_batches_in_flight: in_flight,
            memory_bytes: memory,
        });
    }
    stages
}

/// Bytes per parameter a data-parallel all-gather of weights moves: their 16-bit bytes,
/// or with FP8 parameters (`fp8_param_gather`) the quantised GEMMs' weights in the
/// recipe's type — the blocks' share of quantised weights, applied to every parameter (the
/// embedding and the head, which are not, are a few percent of a stage's).
fn gathered_weight_bytes(pl: &StepPlan, g: &ModelGraph) -> f64 {
    let (weight_bytes, _) = StateBytes::unsharded(pl.precision);
    if !pl.fp8_weights() {
        return weight_bytes;
    }
    weight_bytes - g.block.quantised_share() * (weight_bytes - pl.precision.gemm_element().bytes())
}

/// Bytes of the quantised weight copies an FP8 recipe keeps on a stage with `quantised`
/// such weights ([`Precision::weight_copy_bytes`]): all of them for the step, or at
/// ZeRO-3, whose weights are gathered layer by layer — or with torchao, which casts a
/// weight at each use and keeps no copy ([`Fp8Library::Torchao`]) — the largest layer's
/// while it runs.
fn quantised_copies(input: &StepInput, g: &ModelGraph, quantised: u64) -> f64 {
    let pl = &input.plan;
    let per_weight = pl.precision.weight_copy_bytes();
    if pl.zero_stage() >= 3 || fp8_library(input) == Fp8Library::Torchao {
        let largest = g
            .layers()
            .map(|l| l.quantised_parameters)
            .max()
            .unwrap_or(0)
            .min(quantised);
        largest as f64 * per_weight
    } else {
        quantised as f64 * per_weight
    }
}

/// The bytes FP8 parameters save on a stage with `quantised` quantised weights: their
/// 16-bit copy (of the device's shard at ZeRO-3), which the quantised copies replace.
fn bf16_dropped(pl: &StepPlan, quantised: u64) -> f64 {
    if !pl.fp8_weights() {
        return 0.0;
    }
    let (weight_bytes, _) = StateBytes::unsharded(pl.precision);
    if pl.zero_stage() >= 3 {
        // The shard keeps them in the recipe's type; the layer at work has its copies.
        let shard = pl.shard_groups().dense.0.max(1) as f64;
        quantised as f64 * (weight_bytes - pl.precision.gemm_element().bytes()) / shard
    } else {
        quantised as f64 * weight_bytes
    }
}

/// The library that runs the plan's FP8 recipe ([`Fp8Scaling::run_by`]).
fn fp8_library(input: &StepInput) -> Fp8Library {
    input.plan.fp8_scaling.run_by(input.execution.fp8_library)
}

/// The FP8 recipes' weight casts on the busiest stage, `quantised` weights: once per step
/// (Transformer Engine casts a weight at the first micro-batch and keeps the copies), at
/// ZeRO-3 every time a layer's weights are gathered ([`fsdp_syncs`]); with torchao at
/// every use (forward and backward, each micro-batch); with FP8 parameters once per step,
/// of the optimizer's shard only.
/// Seconds and joules per device; nothing without FP8.
fn weight_casts(
    input: &StepInput,
    cost: &mut dyn FnMut(&CoreConfig, &Op) -> Result<OpCost, EstimateError>,
    quantised: u64,
    micro_batches: u64,
) -> Result<OpCost, StepError> {
    let pl = &input.plan;
    if quantised == 0 || !pl.precision.is_quantised() {
        return Ok(OpCost::new(0.0, 0.0));
    }
    let numerics = pl.precision.numerics(pl.fp8_scaling);
    // FP8 parameters: the optimizer casts the shard it updated, once per step, and the
    // weights travel in FP8 from there.
    let (quantised, per_step) = if pl.fp8_weights() && pl.zero_stage() >= 1 {
        (quantised.div_ceil(pl.shard_groups().dense.0.max(1)), true)
    } else {
        (quantised, false)
    };
    let op = Op::new(
        OpKind::Cast(Cast {
            elements: quantised,
            to: numerics.gemms,
            amax_pass: numerics.scaling.casts_read_twice(),
        }),
        Direction::Forward,
    )
    .with_element(numerics.activations);
    let c = &input.accelerator;
    let one = cost(&c.vector_core(c.vector_cores), &op)?;
    let times = if per_step {
        1.0
    } else if fp8_library(input) == Fp8Library::Torchao {
        // torchao keeps no FP8 copy of a weight: it casts it at every use, forward and
        // again backward — the row-wise recipe's one priced cast writes both copies (the
        // cast's two reads), row-wise forward and column-wise backward.
        let uses = if numerics.scaling == Fp8Scaling::Rowwise {
            1
        } else {
            2
        };
        (uses * micro_batches) as f64
    } else if pl.zero_stage() >= 3 {
        fsdp_syncs(pl, micro_batches).0
    } else {
        1.0
    };
    Ok(OpCost::new(times * one.seconds, times * one.joules))
}

/// The embedding's, a block's, the head's and a dense block's times on the chip
/// ([`ModelGraph::distinct`]), from their layer schedules.
fn layer_timings(
    input: &StepInput,
    g: &ModelGraph,
    latency: &dyn LatencyModel,
) -> Result<[LayerTiming; DISTINCT_LAYERS], StepError> {
    let c = &input.accelerator;
    let mut costs = Costs {
        model: latency,
        execution: input.execution,
        memo: HashMap::new(),
    };
    let layers = g.distinct();
    let graphs: Vec<&OpGraph> = layers
        .iter()
        .flat_map(|l| [&l.forward, &l.backward])
        .collect();
    costs.prefetch(&graphs, c)?;
    let mut timing = [LayerTiming::default(); DISTINCT_LAYERS];
    for (k, layer) in layers.into_iter().enumerate() {
        if !g.has_slot(k) {
            // The model has no such layer: the slot repeats the block and nothing reads it.
            timing[k] = timing[1];
            continue;
        }
        let f = costs.time(&layer.forward, c, &input.schedule)?;
        let bw = costs.time(&layer.backward, c, &input.schedule)?;
        timing[k] = LayerTiming::of(&f, &bw);
    }
    Ok(timing)
}

/// The slowest stage's time per micro-batch, split, and the bubble.
struct PipelineTimes {
    forward: f64,
    backward: f64,
    recomputation: f64,
    /// What moving activations to and from the host exposes, and all of it.
    activation_offload: f64,
    activation_offload_traffic: f64,
    /// Tensor-parallel communication.
    communication: f64,
    /// The expert-parallel all-to-all exchanges computation does not hide, and all of them.
    all_to_all: f64,
    all_to_all_traffic: f64,
    /// The context-parallel exchanges attention does not hide, and all of them.
    context: f64,
    context_traffic: f64,
    /// ZeRO-2/3's gathers and reduce-scatters that computation does not hide, and all of
    /// them.
    fsdp: f64,
    fsdp_traffic: f64,
    point_to_point: f64,
    bubble: f64,
    /// The joules of recomputing one block: the repeated kind's, the dense kind's, the
    /// multi-token-prediction modules'.
    recompute_joules: [f64; 3],
    /// Of the model's blocks of each of those kinds, the share recomputation runs again
    /// ([`rerun_shares`]).
    rerun_share: [f64; 3],
    /// The slowest stage's memory-busy time per micro-batch (see
    /// [`StepReport::hbm_busy_seconds`]).
    memory: Option<f64>,
    /// The slowest stage's operators' durations per micro-batch by kind of work.
    work: [f64; Work::COUNT],
    /// Each device's time per micro-batch ([`Steady`]: the timeline's passes); the
    /// slowest's is `steady`, as the bubble took it.
    devices: Vec<Steady>,
    steady: Steady,
}

/// Each stage's time per micro-batch (set in `stages`): its layers' compute, tensor-parallel
/// communication and recomputation, and the point-to-point transfers of its chunks; the
/// slowest stage's parts and the bubble ([`pipeline_bubble`]).
fn pipeline_times(
    input: &StepInput,
    g: &ModelGraph,
    timing: &[LayerTiming; DISTINCT_LAYERS],
    stages: &mut [StageSummary],
) -> PipelineTimes {
    let pl = &input.plan;
    let schedule = pl.schedule();
    let [emb, _, head, _, _] = *timing;
    let p2p = point_to_point_seconds(input);
    let loads = device_loads(pl, input.model.layers, g);
    let per_device = stage_kinds(input, g, timing, &loads);
    let kinds = |k: u64| per_device[k as usize];
    let ends = |k: u64| {
        let run = loads[k as usize].run;
        [(run.embedding, emb), (run.head, head)]
    };
    let exchanged = |k: u64| kinds(k).iter().map(StageKind::all_to_all).sum::<f64>();
    // The context-parallel exchanges per stage and micro-batch: (exposed, all).
    let contexts = |k: u64| pair_sum(kinds(k).iter().map(StageKind::context));
    // What offloading exposes per stage and micro-batch, and all of its copies.
    let host = input.network.host_bytes_per_second;
    let offload = |k: u64| {
        let copies = |kind: &StageKind| (kind.offload_exposed(host), kind.offload_traffic(host));
        pair_sum(kinds(k).iter().map(copies))
    };
    // Per stage and micro-batch: (forward, backward, recompute, tp communication, weight
    // gradients within backward).
    let parts = |k: u64| -> [f64; 5] {
        let [mut f, mut bw, mut r, mut comm, mut w] = [0.0; 5];
        for kind in kinds(k) {
            let (l, n) = (kind.timing, kind.count);
            f += n * (l.forward - l.forward_communication);
            bw += n * (l.backward - l.backward_communication);
            r += kind.rerun * kind.again.0;
            comm += n * (l.forward_communication + l.backward_communication)
                + kind.rerun * kind.again.1;
            w += n * l.backward_weight;
        }
        for (n, l) in ends(k) {
            f += n * (l.forward - l.forward_communication);
            bw += n * (l.backward - l.backward_communication);
            comm += n * (l.forward_communication + l.backward_communication);
            w += n * l.backward_weight;
        }
        [f, bw, r, comm, w.min(bw)]
    };
    // ZeRO-2/3's traffic of every micro-batch: all of it, what the stage's computation
    // does not hide (what moves once a step is the step's: `priced`).
    let micro_batches = input.global_batch / (pl.micro_batch * pl.data_parallel).max(1);
    let fsdp = |s: &StageSummary, busy: f64| {
        let traffic = fsdp_traffic(
            input,
            g,
            (s.parameters - s.expert_parameters, s.expert_parameters),
            micro_batches,
        )
        .every_micro_batch;
        if pl.sharding.data_parallel_overlap {
            (traffic, input.network.exposed_beside(traffic, busy))
        } else {
            (traffic, traffic)
        }
    };
    // The all-to-all per micro-batch a stage exposes: all of it, or with the overlap (or
    // DualPipe's overlapped chunks) what its computation does not cover.
    let a2a_hidden = pl.all_to_all_overlap || schedule.overlaps_chunks();
    let exposed = |k: u64, busy: f64, hidden: bool| {
        let all = exchanged(k);
        if hidden { (all - busy).max(0.0) } else { all }
    };
    // The point-to-point time per micro-batch a stage exposes in the steady state: all of
    // it, or when the schedule hides transfers what the stage's work does not cover.
    let p2p_hidden = pl.hides_transfers();
    let transfers = |work: f64, hidden: bool| {
        if hidden { (p2p - work).max(0.0) } else { p2p }
    };
    // A device's time per micro-batch from its parts, with the steady state's overlaps,
    // and with every transfer exposed (DualPipe's passes that run alone): (time, fsdp,
    // sent).
    let per_micro_batch =
        |s: &StageSummary, [f, bw, r, comm, _]: [f64; 5], hidden: (bool, bool)| {
            let sharded = fsdp(s, f + bw + r);
            let work = f
                + bw
                + r
                + comm
                + exposed(s.stage, f + bw + r, hidden.0)
                + contexts(s.stage).0
                + offload(s.stage).0;
            let sent = transfers(work, hidden.1);
            (work + sharded.1 + sent, sharded, sent)
        };
    let mut slowest = (0, 0.0, (0.0, 0.0), p2p);
    let mut devices = Vec::with_capacity(stages.len());
    for s in stages.iter_mut() {
        let part = parts(s.stage);
        let (seconds, sharded, sent) = per_micro_batch(s, part, (a2a_hidden, p2p_hidden));
        // Only DualPipe's passes run alone (`pass_slots`).
        let alone = if schedule.overlaps_chunks() {
            per_micro_batch(s, part, (pl.all_to_all_overlap, false)).0
        } else {
            seconds
        };
        let [f, bw, r, _, w] = part;
        devices.push(Steady {
            seconds,
            alone,
            // The fill and the flush wait for every transfer, overlapped or not.
            exposed_transfers: seconds - sent + p2p,
            compute: [f, bw, r, w],
        });
        s.seconds_per_micro_batch = seconds;
        if s.seconds_per_micro_batch > slowest.1 {
            slowest = (s.stage, s.seconds_per_micro_batch, sharded, sent);
        }
    }
    let [f, bw, r, comm, _] = parts(slowest.0);
    let steady = devices.get(slowest.0 as usize).copied().unwrap_or_default();
    let bubble = pipeline_bubble(pl, micro_batches, steady);
    let work = stage_work(pl.recomputation, &kinds(slowest.0), ends(slowest.0));
    PipelineTimes {
        work,
        forward: f,
        backward: bw,
        recomputation: r,
        activation_offload: offload(slowest.0).0,
        activation_offload_traffic: offload(slowest.0).1,
        communication: comm,
        all_to_all: exposed(slowest.0, f + bw + r, a2a_hidden),
        all_to_all_traffic: exchanged(slowest.0),
        context: contexts(slowest.0).0,
        context_traffic: contexts(slowest.0).1,
        fsdp: slowest.2.1,
        fsdp_traffic: slowest.2.0,
        point_to_point: slowest.3,
        bubble,
        recompute_joules: kinds(0).map(|kind| kind.again.2),
        rerun_share: rerun_shares(&loads),
        memory: memory_busy(pl.recomputation, &kinds(slowest.0), ends(slowest.0)),
        devices,
        steady,
    }
}

/// Each device's blocks by kind ([`StageKind`]): the repeated block, the dense block, the
/// multi-token-prediction modules — each with its timing, what recomputing and exchanging
/// it costs, and how many of it a micro-batch runs, recomputes and offloads there.
fn stage_kinds(
    input: &StepInput,
    g: &ModelGraph,
    timing: &[LayerTiming; DISTINCT_LAYERS],
    loads: &[Load],
) -> Vec<[StageKind; 3]> {
    let pl = &input.plan;
    let [_, blk, _, dns, mtp] = *timing;
    let again = [blk, dns, mtp].map(|l| recompute_of(pl.recomputation, &l));
    let exchanges = all_to_all_seconds(input, g);
    let kv = [
        kv_exchange_seconds(input, Some(&g.block), &blk),
        kv_exchange_seconds(input, g.dense_block.as_ref(), &dns),
        kv_exchange_seconds(input, g.mtp.as_ref(), &mtp),
    ];
    // What one block of each kind keeps, as offloading moves it (offloaded blocks are not
    // recomputed: they keep everything).
    let kept = [Some(&g.block), g.dense_block.as_ref(), g.mtp.as_ref()]
        .map(|l| l.map_or(0.0, |l| l.kept_bytes(Recomputation::None) as f64));
    let kinds = |load: &Load| {
        let of =
            |i: usize, timing: LayerTiming, count: f64, rerun: f64, offloaded: f64| StageKind {
                timing,
                again: again[i],
                count,
                rerun,
                offloaded,
                block_all_to_all: exchanges[i],
                block_kv: kv[i],
                kept_bytes: kept[i],
            };
        [
            of(0, blk, load.run.main, load.rerun.main, load.offloaded.main),
            of(
                1,
                dns,
                load.run.dense,
                load.rerun.dense,
                load.offloaded.dense,
            ),
            of(2, mtp, load.run.mtp, load.rerun.mtp, 0.0),
        ]
    };
    loads.iter().map(kinds).collect()
}

/// Pairs of seconds (what is exposed, all of it) summed.
fn pair_sum(pairs: impl Iterator<Item = (f64, f64)>) -> (f64, f64) {
    pairs.fold((0.0, 0.0), |(e, a), (x, y)| (e + x, a + y))
}

/// A device's time per micro-batch as the pipeline's bubble and timeline need it.
#[derive(Debug, Clone, Copy, Default)]
struct Steady {
    /// In the steady state, with its overlaps.
    seconds: f64,
    /// A pass running alone, every all-to-all and transfer exposed (but the all-to-all
    /// overlap the plan sets).
    alone: f64,
    /// With every transfer exposed, as the fill and the flush wait for them.
    exposed_transfers: f64,
    /// Forward, backward, recomputation and, within backward, the weight gradients: how
    /// a pass's time is split into the schedule's passes.
    compute: [f64; 4],
}

/// The pipeline's time beyond `m` steady micro-batches. 1F1B and interleaved 1F1B in
/// closed form: `(p − 1)/v` micro-batches with every transfer exposed (Narayanan et al.
/// 2021; the simulation gives it exactly, `pipeline::tests`). The other schedules by
/// simulating them ([`crate::pipeline::simulate`]) with every device at the slowest one's
/// pace: a pass's time split into forward, input gradient and weight gradient in
/// proportion to their computation (communication with them), each chunk a share of it,
/// and for DualPipe a forward and a backward chunk overlapped taking the steady state's
/// time: the makespan less `m` steady micro-batches — idle time, and for DualPipe the
/// transfers its passes that run alone expose.
fn pipeline_bubble(pl: &StepPlan, m: u64, steady: Steady) -> f64 {
    let schedule = pl.schedule();
    let (p, v) = (pl.pipeline_parallel, pl.interleaving);
    if matches!(
        schedule,
        PipelineSchedule::OneFOneB | PipelineSchedule::Interleaved
    ) {
        // The fill and the flush wait for every transfer, overlapped or not.
        return (p - 1) as f64 / v.max(1) as f64 * steady.exposed_transfers;
    }
    let makespan = crate::pipeline::simulated_makespan(schedule, p, v, m, pass_slots(pl, steady));
    (makespan - m as f64 * steady.seconds).max(0.0)
}

/// A device's passes per chunk from its time per micro-batch (`steady`): forward, input
/// gradient (with recomputation) and weight gradient in proportion to their computation,
/// each a chunk's share; for DualPipe the overlapped pair takes the steady state's time and
/// a pass alone its share of the time with every transfer exposed. 1F1B's and interleaved
/// 1F1B's backward is whole (the weight gradient inside the input gradient's slot).
fn pass_slots(pl: &StepPlan, steady: Steady) -> Slots {
    let schedule = pl.schedule();
    let [f, bw, r, w] = steady.compute;
    let compute = f + bw + r;
    let alone = if schedule.overlaps_chunks() {
        steady.alone
    } else {
        steady.seconds
    };
    let share = |x: f64| {
        if compute > 0.0 {
            alone * x / compute
        } else {
            alone / 3.0
        }
    };
    let chunks = schedule.chunks_visited(pl.interleaving) as f64;
    let w = if schedule.splits_backward() { w } else { 0.0 };
    Slots {
        forward: share(f) / chunks,
        backward_input: share(bw - w + r) / chunks,
        weight: share(w) / chunks,
        overlapped: steady.seconds / chunks,
    }
}

/// A stage's time per micro-batch that the memory is busy, when every layer says.
fn memory_busy(
    r: Recomputation,
    kinds: &[StageKind; 3],
    ends: [(f64, LayerTiming); 2],
) -> Option<f64> {
    let mut busy = 0.0;
    for kind in kinds {
        let l = &kind.timing;
        if kind.count > 0.0 {
            busy += kind.count * (l.forward_memory? + l.backward_memory?);
        }
        if kind.rerun > 0.0 {
            busy += kind.rerun * l.rerun(r).memory?;
        }
    }
    for (n, l) in ends {
        if n > 0.0 {
            busy += n * (l.forward_memory? + l.backward_memory?);
        }
    }
    Some(busy)
}

/// A kind of block on a stage (the repeated block, the dense block, the
/// multi-token-prediction modules) and what one micro-batch runs of it there.
#[derive(Debug, Clone, Copy)]
struct StageKind {
    timing: LayerTiming,
    /// What recomputing one costs: compute, communication, joules.
    again: (f64, f64, f64),
    /// How many each micro-batch runs on the stage, how many of those are recomputed and
    /// how many offloaded.
    count: f64,
    rerun: f64,
    offloaded: f64,
    /// One block's all-to-all seconds: forward and backward, and recomputed.
    block_all_to_all: (f64, f64),
    /// One block's context-parallel exchanges, (exposed, all): forward and backward, and
    /// recomputed.
    block_kv: ((f64, f64), (f64, f64)),
    /// What one block keeps for its backward pass without recomputation.
    kept_bytes: f64,
}

impl StageKind {
    /// The stage's all-to-all seconds per micro-batch of this kind.
    fn all_to_all(&self) -> f64 {
        self.count * self.block_all_to_all.0 + self.rerun * self.block_all_to_all.1
    }

    /// The stage's context-parallel exchanges per micro-batch of this kind: (exposed, all).
    fn context(&self) -> (f64, f64) {
        let ((e, a), (re, ra)) = self.block_kv;
        (
            self.count * e + self.rerun * re,
            self.count * a + self.rerun * ra,
        )
    }

    /// What offloading this kind's blocks exposes per micro-batch: each block's
    /// activations go to the host while the next block runs forward and come back while
    /// it runs backward (Transformer Engine's double-buffered offload: a block's copy
    /// waits for the one before it), so a block exposes what its copy takes beyond the
    /// next block's pass, each way.
    fn offload_exposed(&self, host_bytes_per_second: Option<f64>) -> f64 {
        let Some(copy) = self.offload_copy(host_bytes_per_second) else {
            return 0.0;
        };
        let l = &self.timing;
        self.offloaded * ((copy - l.forward).max(0.0) + (copy - l.backward).max(0.0))
    }

    /// The copies of this kind's offloaded blocks per micro-batch, out and back, whole.
    fn offload_traffic(&self, host_bytes_per_second: Option<f64>) -> f64 {
        self.offload_copy(host_bytes_per_second)
            .map_or(0.0, |copy| 2.0 * self.offloaded * copy)
    }

    /// One offloaded block's copy one way, when the stage offloads any.
    fn offload_copy(&self, host_bytes_per_second: Option<f64>) -> Option<f64> {
        let host = host_bytes_per_second.filter(|h| *h > 0.0)?;
        (self.offloaded > 0.0).then(|| self.kept_bytes / host)
    }
}

/// A stage's work per micro-batch by kind: its blocks of each kind forward, backward and
/// what `r` recomputes of those it recomputes, and the ends' it holds (embedding, head).
fn stage_work(
    r: Recomputation,
    kinds: &[StageKind; 3],
    ends: [(f64, LayerTiming); 2],
) -> [f64; Work::COUNT] {
    std::array::from_fn(|w| {
        let mut busy = 0.0;
        for kind in kinds {
            let l = &kind.timing;
            busy += kind.count * (l.forward_work[w] + l.backward_work[w])
                + kind.rerun * l.rerun(r).work[w];
        }
        for (n, l) in ends {
            busy += n * (l.forward_work[w] + l.backward_work[w]);
        }
        busy
    })
}

/// What recomputing one layer of timing `l` costs under `r`: (compute, communication,
/// joules).
fn recompute_of(r: Recomputation, l: &LayerTiming) -> (f64, f64, f64) {
    let again = l.rerun(r);
    (again.seconds, again.communication, again.joules)
}

/// A device's pipeline point-to-point time per micro-batch: per model chunk, an activation
/// forward and a gradient backward, on the tier the pipeline spans.
fn point_to_point_seconds(input: &StepInput) -> f64 {
    let pl = &input.plan;
    let (t, p) = (pl.tensor_parallel, pl.pipeline_parallel);
    if p <= 1 {
        return 0.0;
    }
    let e = pl.precision.element_bytes();
    let tier = input.network.tier(pl.devices());
    let bytes = (pl.micro_batch * input.model.seq_len * input.model.hidden * e) as f64
        / (t * pl.context_parallel) as f64;
    let chunks = pl.schedule().chunks_visited(pl.interleaving) as f64;
    2.0 * chunks * (tier.latency_seconds + bytes / tier.bytes_per_second)
}

/// The all-to-all seconds per micro-batch of one layer of each recomputed kind (the
/// repeated block, the dense block, the multi-token-prediction modules): dispatch and
/// combine forward and their gradients backward, and what recomputing it exchanges again
/// (forward again under full recomputation).
fn all_to_all_seconds(input: &StepInput, g: &ModelGraph) -> [(f64, f64); 3] {
    let again = if input
        .plan
        .recomputation
        .reruns_all_to_all(input.plan.recompute_modules)
    {
        2.0
    } else {
        0.0
    };
    let exchange = |l: Option<&crate::model::Layer>| {
        l.and_then(|l| l.all_to_all).map_or((0.0, 0.0), |a| {
            (
                a.seconds(&input.network, 4.0),
                a.seconds(&input.network, again),
            )
        })
    };
    [
        exchange(Some(&g.block)),
        exchange(g.dense_block.as_ref()),
        exchange(g.mtp.as_ref()),
    ]
}

/// The context-parallel exchanges of one `layer` (timed `l`) per micro-batch: what the
/// attention kernels do not hide of its forward and backward passes, summed, and of its
/// recomputed pass: each (exposed, whole) seconds.
fn kv_exchange_seconds(
    input: &StepInput,
    layer: Option<&crate::model::Layer>,
    l: &LayerTiming,
) -> ((f64, f64), (f64, f64)) {
    let pl = &input.plan;
    let [forward, backward, again] = kv_exchange_passes(
        &input.network,
        pl.context_exchange,
        pl.recomputation.reruns_attention(pl.recompute_modules),
        layer,
        l,
    );
    ((forward.0 + backward.0, forward.1 + backward.1), again)
}

/// The context-parallel exchanges of one `layer` (timed `l`) per micro-batch, per pass —
/// forward, backward, recomputed forward — each (exposed, whole) seconds; the search's
/// placement charges a layer's passes with them as the step model does. Ring attention
/// (`CP − 1` steps per attention) passes a rank's keys and values on in each step —
/// backward with their gradients, twice the bytes — while the kernel attends to the chunk
/// at hand, `1/CP` of the attention's time: each step exposes what its transfer takes
/// beyond that (all of it without overlap). The all-gather collects every rank's keys and
/// values before attention (backward again, and the gradients reduce-scattered), not
/// overlapped. Ulysses' all-to-all (`ContextMethod::AllToAll`) moves `(CP − 1)/CP` of the
/// rank's queries, keys and values before attention and of its output after it, backward
/// the output's gradient and then the others' — the same bytes both ways, whatever `CP` —
/// not overlapped. Recomputation that reruns the attention (`reruns_attention`: full;
/// selective, which recomputes the core) exchanges again; per-operator checkpointing keeps
/// the attention kernel's output, which the exchange is part of (PyTorch's context
/// parallelism runs it inside the SDPA operator), and does not
/// ([`Recomputation::reruns_attention`]).
pub(crate) fn kv_exchange_passes(
    net: &Network,
    exchange: ContextExchange,
    reruns_attention: bool,
    layer: Option<&crate::model::Layer>,
    l: &LayerTiming,
) -> [(f64, f64); 3] {
    let Some(x) = layer.and_then(|l| l.kv_exchange) else {
        return [(0.0, 0.0); 3];
    };
    let (cp, count) = (x.group, x.count.max(1) as f64);
    let steps = cp.saturating_sub(1) as f64;
    let bytes = x.bytes as f64;
    // Per attention and pass: (exposed, all).
    let pass = |attention: f64, bytes: f64| match exchange.method {
        ContextMethod::Ring => {
            let step = net.ring_step_seconds(bytes, cp, x.stride);
            let hidden = if exchange.overlap {
                attention / count / cp as f64
            } else {
                0.0
            };
            (steps * (step - hidden).max(0.0), steps * step)
        }
        ContextMethod::AllGather => {
            let gather = net.ring_seconds(cp as f64 * bytes, 1.0, cp, x.stride);
            (gather, gather)
        }
        ContextMethod::AllToAll => {
            // Two all-to-alls, the same bytes forward and backward.
            let both = net.all_to_all_seconds((x.bytes + x.query_bytes) as f64, cp, x.stride)
                + net.all_to_all_seconds(x.output_bytes as f64, cp, x.stride);
            (both, both)
        }
    };
    let attention = Work::Attention as usize;
    let forward = pass(l.forward_work[attention], bytes);
    let backward = pass(l.backward_work[attention], 2.0 * bytes);
    let again = if reruns_attention {
        forward
    } else {
        (0.0, 0.0)
    };
    [forward, backward, again].map(|(exposed, all)| (count * exposed, count * all))
}

/// Dense blocks per pipeline stage (device): the model's first `dense` blocks, where the
/// plan's schedule places them ([`StepPlan::layout`]) — stages hold consecutive blocks,
/// with the interleaved schedule device `k` holds chunks `k, k + p, k + 2p, …`, on a V
/// chunks `k` and `2p − 1 − k`, with DualPipe stages `k` and `p − 1 − k`.
pub fn dense_per_stage(pl: &StepPlan, layers: u64, dense: u64) -> Vec<u64> {
    let layout = pl.layout(layers);
    layout
        .devices
        .iter()
        .map(|chunks| {
            chunks
                .iter()
                .map(|&c| dense_in(layout.stages[c], dense))
                .sum()
        })
        .collect()
}

/// The first `dense` blocks of the model that `stage` holds.
fn dense_in(stage: ModelStage, dense: u64) -> u64 {
    let (from, to) = (stage.first_block, stage.first_block + stage.blocks);
    to.min(dense).saturating_sub(from.min(dense))
}

/// What one pipeline device holds of each kind of layer, or runs of it per micro-batch:
/// repeated blocks, dense blocks, the multi-token-prediction modules, the embedding, the
/// head. Held counts are whole; run counts weigh each chunk by the share of micro-batches
/// that pass through it (DualPipe's two stages: half each).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Counts {
    main: f64,
    dense: f64,
    mtp: f64,
    embedding: f64,
    head: f64,
}

/// A device's layers: what it holds and what each micro-batch runs on it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Load {
    held: Counts,
    run: Counts,
    /// Of `run`'s blocks, those the plan's recomputation runs again: every one, or with
    /// `recompute_layers` the first that many of each chunk (dense blocks first: they are
    /// the model's first).
    rerun: Counts,
    /// Of `run`'s blocks, those whose activations are offloaded to the host (the model's
    /// first `activation_offload_layers`).
    offloaded: Counts,
    /// One copy of a tied output embedding serves both ends on the device (it holds the
    /// first and the last stage of one copy of the model).
    shared_ends: bool,
}

/// Of the model's blocks of each kind (the repeated block, the dense block, the
/// multi-token-prediction modules), the share that recomputation runs again: 1 unless
/// `recompute_layers` limits it.
fn rerun_shares(loads: &[Load]) -> [f64; 3] {
    let total = |f: fn(&Load) -> f64| loads.iter().map(f).sum::<f64>();
    let share = |rerun: f64, all: f64| if all > 0.0 { rerun / all } else { 1.0 };
    [
        share(total(|l| l.rerun.main), total(|l| l.run.main)),
        share(total(|l| l.rerun.dense), total(|l| l.run.dense)),
        1.0,
    ]
}

/// Each device's [`Load`] under the plan's schedule.
fn device_loads(pl: &StepPlan, layers: u64, g: &ModelGraph) -> Vec<Load> {
    let schedule = pl.schedule();
    let layout = pl.layout(layers);
    let share = schedule.visited_share(pl.interleaving);
    let last = layout.stages.len().saturating_sub(1);
    // A part of a chunk's blocks by kind: the model's first `dense` are the dense ones.
    let blocks_of = |part: ModelStage, mtp: f64| {
        let dense = dense_in(part, g.dense_blocks) as f64;
        Counts {
            main: part.blocks as f64 - dense,
            dense,
            mtp,
            ..Counts::default()
        }
    };
    // The blocks of each chunk recomputation runs again: its first `recompute_layers`
    // (none without recomputation).
    let limit = match pl.recomputation {
        Recomputation::None => 0,
        _ => pl.recompute_layers.unwrap_or(u64::MAX),
    };
    layout
        .devices
        .iter()
        .map(|chunks| {
            let mut load = Load::default();
            for &c in chunks {
                let stage = layout.stages[c];
                let mtp = f64::from(u8::from(c == last && g.mtp.is_some()));
                let counts = Counts {
                    embedding: f64::from(u8::from(c == 0)),
                    head: f64::from(u8::from(c == last)),
                    ..blocks_of(stage, mtp)
                };
                load.held = load.held.plus(counts, 1.0);
                load.run = load.run.plus(counts, share);
                let rerun = ModelStage {
                    blocks: stage.blocks.min(limit),
                    ..stage
                };
                // The chunk's blocks among the model's first `activation_offload_layers`.
                let offloaded = ModelStage {
                    blocks: (stage.first_block + stage.blocks)
                        .min(pl.activation_offload_layers)
                        .saturating_sub(stage.first_block),
                    ..stage
                };
                // The multi-token-prediction modules follow the plan's recomputation.
                let mtp_rerun = if limit > 0 { mtp } else { 0.0 };
                load.rerun = load.rerun.plus(blocks_of(rerun, mtp_rerun), share);
                load.offloaded = load.offloaded.plus(blocks_of(offloaded, 0.0), share);
            }
            load.shared_ends = chunks.contains(&0)
                && chunks.contains(&last)
                && schedule != PipelineSchedule::DualPipe;
            load
        })
        .collect()
}

impl Counts {
    fn plus(self, o: Counts, w: f64) -> Counts {
        Counts {
            main: self.main + w * o.main,
            dense: self.dense + w * o.dense,
            mtp: self.mtp + w * o.mtp,
            embedding: self.embedding + w * o.embedding,
            head: self.head + w * o.head,
        }
    }
}

/// The data-parallel synchronisation once per step of the largest stage's `dense` and
/// `experts` parameters: by ZeRO stage, the gradients all-reduced (0), reduce-scattered and
/// the updated weights all-gathered (1), the weights only all-gathered (2: the gradients
/// were reduce-scattered every micro-batch), nothing (3: the optimizer updates its shard and
/// every pass gathers); with `data_parallel_overlap` the gradients' part hides behind one
/// micro-batch's backward pass and the weights' behind one forward pass (`hide`: those of
/// the slowest stage). Then the tied (or multi-token-prediction) embedding copy's
/// all-reduce between the first and the last stage, never hidden.
fn data_parallel_seconds(
    input: &StepInput,
    g: &ModelGraph,
    (dense, experts): (f64, f64),
    hide: (f64, f64),
) -> f64 {
    let pl = &input.plan;
    let p = pl.pipeline_parallel;
    let net = &input.network;
    let (_, gradient_bytes) = StateBytes::unsharded(pl.precision);
    let weight_bytes = gathered_weight_bytes(pl, g);
    let zero = pl.zero_stage();
    // (gradients, weights) of `params` sharded over `group` and replicated over
    // `replicas`: each shard's gradients all-reduced across its replicas (hybrid sharding).
    let sync = |params: f64, (n, stride): RankGroup, (r, apart): RankGroup| {
        let ring = |bytes: f64, passes: f64| net.ring_seconds(params * bytes, passes, n, stride);
        let shards = net.ring_seconds(params * gradient_bytes / n as f64, 2.0, r, apart);
        match zero {
            0 => (ring(gradient_bytes, 2.0), 0.0),
            1 => (ring(gradient_bytes, 1.0) + shards, ring(weight_bytes, 1.0)),
            2 => (shards, ring(weight_bytes, 1.0)),
            _ => (shards, 0.0),
        }
    };
    // The experts' groups: the ranks holding the same experts, EP × ETP apart.
    let groups = pl.shard_groups();
    let (gd, wd) = sync(dense, groups.dense, groups.dense_replicas);
    let (ge, we) = sync(experts, groups.experts, groups.expert_replicas);
    let (mut gradients, mut weights) = (gd + ge, wd + we);
    if pl.sharding.data_parallel_overlap {
        let (forward, backward) = hide;
        gradients = net.exposed_beside(gradients, backward);
        weights = net.exposed_beside(weights, forward);
    }
    let mut dp = gradients + weights;
    // The head's copy of the input embedding (tied, or looked up by multi-token
    // prediction) has its gradient summed with the first stage's.
    if p > 1 && g.head.shared_parameters > 0 {
        let bytes = g.head.shared_parameters as f64 * gradient_bytes;
        dp += net.ring_seconds(bytes, 2.0, 2, pl.stage_ranks() * (p - 1));
    }
    dp
}

/// How many times in a step of `micro_batches` ZeRO-2/3 moves a stage's state: (all-gathers
/// of its weights, reduce-scatters of its gradients). Without pipeline parallelism, every
/// micro-batch: at ZeRO-3 each layer's weights gathered before its forward pass and,
/// resharded after it, again before its backward pass; at ZeRO-2 and 3 its gradients
/// reduce-scattered after its backward pass. With pipeline parallelism, as PyTorch's
/// pipelining runs an FSDP stage (`torch/distributed/pipelining/stage.py`,
/// `backward_maybe_with_nosync`: every backward pass but the last with
/// `set_reshard_after_backward(False)` and `set_requires_gradient_sync(False)`), the
/// gradients are reduce-scattered once a step, after the last micro-batch, and the weights
/// stay gathered after each backward pass: gathered once a step when not resharded after
/// forward (torchtitan's default with pipeline parallelism), else again for each
/// micro-batch's backward pass.
pub fn fsdp_syncs(pl: &StepPlan, micro_batches: u64) -> (f64, f64) {
    let zero = pl.zero_stage();
    let m = micro_batches.max(1) as f64;
    if zero < 2 {
        return (0.0, 0.0);
    }
    let pipelined = pl.pipeline_parallel > 1;
    let gathers = match (zero, pl.sharding.reshard_after_forward, pipelined) {
        (3, true, false) => 2.0 * m,
        (3, false, false) | (3, true, true) => m,
        (3, false, true) => 1.0,
        _ => 0.0,
    };
    (gathers, if pipelined { 1.0 } else { m })
}

/// ZeRO-2/3's traffic of a stage, each part its time alone: what moves for every
/// micro-batch, and what moves once a step under pipeline parallelism ([`fsdp_syncs`]) —
/// the weights gathered when the stage's first micro-batch needs them (not resharded after
/// forward) and the gradients reduce-scattered as its last micro-batch's backward pass
/// makes them final. Those can hide only behind that one forward and that one backward
/// pass, as Megatron-Core's gather and reduction of the distributed optimizer's shards
/// do (`data_parallel_seconds`), not behind every micro-batch's.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FsdpTraffic {
    pub every_micro_batch: f64,
    pub before_first_forward: f64,
    pub after_last_backward: f64,
}

/// ZeRO-2/3's traffic ([`FsdpTraffic`]) of a stage holding `dense` and `experts`
/// parameters in a step of `micro_batches` — over the data-parallel group (`t` ranks
/// apart) and, the experts', over the expert-data-parallel group (`EP × ETP` apart).
pub fn fsdp_traffic(
    input: &StepInput,
    g: &ModelGraph,
    (dense, experts): (u64, u64),
    micro_batches: u64,
) -> FsdpTraffic {
    let pl = &input.plan;
    let (gathers, reductions) = fsdp_syncs(pl, micro_batches);
    if gathers + reductions == 0.0 {
        return FsdpTraffic::default();
    }
    let (_, gradient_bytes) = StateBytes::unsharded(pl.precision);
    let weight_bytes = gathered_weight_bytes(pl, g);
    let net = &input.network;
    let groups = pl.shard_groups();
    let once = |bytes: f64| {
        let (n, stride) = groups.dense;
        let (ne, expert_stride) = groups.experts;
        net.ring_seconds(dense as f64 * bytes, 1.0, n, stride)
            + net.ring_seconds(experts as f64 * bytes, 1.0, ne, expert_stride)
    };
    let (weights, gradients) = (
        gathers * once(weight_bytes),
        reductions * once(gradient_bytes),
    );
    let m = micro_batches.max(1) as f64;
    if pl.pipeline_parallel == 1 {
        return FsdpTraffic {
            every_micro_batch: (weights + gradients) / m,
            ..FsdpTraffic::default()
        };
    }
    // Pipelined, the gradients once a step; the weights gathered again for every
    // micro-batch when resharded after forward, else once.
    let resharded = pl.sharding.reshard_after_forward;
    FsdpTraffic {
        every_micro_batch: if resharded { weights / m } else { 0.0 },
        before_first_forward: if resharded { 0.0 } else { weights },
        after_last_backward: gradients,
    }
}

/// What a device holds beyond its state's shards while it works at ZeRO-2/3, in bytes of
/// (weights, gradients): one layer's unsharded gradient before its reduce-scatter and, at
/// ZeRO-3, two layers' gathered weights (the one running and the next, prefetched) — or,
/// not resharded after forward, all of the stage's `parameters` gathered from forward to
/// backward. With pipeline parallelism ([`fsdp_syncs`]) the stage's gradients wait
/// unsharded for the step's last micro-batch, and its weights stay gathered after each
/// backward pass: all of them, both. `largest` is the stage's largest layer on this rank.
fn zero_buffers(pl: &StepPlan, largest: u64, parameters: u64) -> (f64, f64) {
    let (weight_bytes, gradient_bytes) = StateBytes::unsharded(pl.precision);
    let zero = pl.zero_stage();
    let pipelined = pl.pipeline_parallel > 1;
    let gradients = match (zero >= 2, pipelined) {
        (true, false) => largest as f64 * gradient_bytes,
        (true, true) => parameters as f64 * gradient_bytes,
        (false, _) => 0.0,
    };
    let weights = match (zero, pl.sharding.reshard_after_forward || pipelined) {
        (3, true) if !pipelined => 2.0 * largest as f64 * weight_bytes,
        (3, _) => parameters as f64 * weight_bytes,
        _ => 0.0,
    };
    (weights, gradients)
}

/// The optimizer step: memory-bound element-wise work over the parameters this device
/// updates — the gradient read to unscale it and take its norm, every state byte read and
/// written by the update (weights, gradient, master weights and moments), the gradient
/// buffer zeroed — given to the latency model as an element-wise operation of that many
/// bytes (it reads and writes `element_bytes` per element).
fn optimizer_step(
    input: &StepInput,
    cost: &mut dyn FnMut(&CoreConfig, &Op) -> Result<OpCost, EstimateError>,
    (dense, experts): (f64, f64),
) -> Result<OpCost, StepError> {
    let pl = &input.plan;
    let c = &input.accelerator;
    let groups = pl.shard_groups();
    let updated = if pl.zero_stage() >= 1 {
        dense / groups.dense.0 as f64 + experts / groups.experts.0 as f64
    } else {
        dense + experts
    };
    let full = StateBytes::megatron(pl.precision, pl.optimizer, false, 1);
    let traffic_per_parameter =
        2.0 * (full.weights + full.gradients + full.optimizer) + 2.0 * full.gradients;
    let element_bytes = pl.precision.element_bytes() as f64;
    let elements = updated * traffic_per_parameter / (2.0 * element_bytes);
    let op = Op {
        kind: OpKind::Vector {
            kind: VectorKind::Add,
            elements: elements.ceil() as u64,
            row: 1,
        },
        direction: Direction::Forward,
        fused: Vec::new(),
        element: pl.precision.activation_element(),
    };
    Ok(cost(&c.vector_core(c.vector_cores), &op)?)
}

/// The step's matrix FLOPs: the model's, and the hardware's (with what recomputation runs
/// again: `rerun_share` of each kind's blocks). The graph's are one rank's, a t-th of the
/// model's.
fn step_flops(input: &StepInput, g: &ModelGraph, rerun_share: [f64; 3]) -> (f64, f64) {
    let pl = &input.plan;
    // The graph is one rank's of the t × CP ranks that share a micro-batch.
    let ranks = (pl.tensor_parallel * pl.context_parallel) as f64;
    let total_micro_batches = (input.global_batch / pl.micro_batch) as f64;
    let per_micro_batch = ranks * total_micro_batches;
    let model_flops = g.model_flops_per_micro_batch() * per_micro_batch;
    let run_flops = g.matmul_flops_per_micro_batch(false) * per_micro_batch;
    // What recomputation runs again, per block of each kind, times how many there are.
    // The experts' GEMMs (where the busiest rank's imbalance is) run again exactly when
    // their tokens are exchanged again.
    let r = pl.recomputation;
    let again = |l: &crate::model::Layer| {
        let rerun: f64 = l
            .forward
            .nodes
            .iter()
            .map(|n| n.rerun_share(r) * n.matmul_flops())
            .sum();
        rerun
            - if r.reruns_all_to_all(pl.recompute_modules) {
                l.imbalance_matmul_flops
            } else {
                0.0
            }
    };
    let dense = g.dense_block.as_ref().map_or(0.0, &again);
    let mtp = g.mtp.as_ref().map_or(0.0, &again);
    let [main_share, dense_share, _] = rerun_share;
    let recomputed = again(&g.block) * g.main_blocks() as f64 * main_share
        + dense * g.dense_blocks as f64 * dense_share
        + mtp;
    let hardware_flops = run_flops + recomputed * per_micro_batch;
    (model_flops, hardware_flops)
}

pub mod timeline;

#[cfg(test)]
mod tests;
