//! A training plan: how one step of one model is laid out over the devices and run —
//! tensor, context, data, pipeline and expert parallelism, the pipeline's schedule and
//! its stages, the micro-batch, recomputation, precision, the optimizer and how data
//! parallelism shards the state. It is the one plan type: `[plan]` gives it
//! (`archplace-spec`), the search proposes and records it (`search::ModelPlan::plan`, a
//! [`RecordedPlan`]), `result.json` and `archplace estimate` carry it, and the step model prices it
//! (`step`). What a plan means for the pipeline is its schedule's
//! ([`crate::pipeline`]).

use crate::pipeline::{Layout, PipelineSchedule};
use crate::training::{
    ContextExchange, Fp8Scaling, Optimizer, Precision, Recomputation, RecomputeModules,
};
use serde::{Deserialize, Serialize};

mod recorded;

pub use recorded::RecordedPlan;

/// A fixed training plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepPlan {
    pub tensor_parallel: u64,
    pub pipeline_parallel: u64,
    pub data_parallel: u64,
    pub micro_batch: u64,
    /// Virtual pipeline stages per device (1: plain 1F1B).
    pub interleaving: u64,
    /// How the pipeline runs its micro-batches ([`PipelineSchedule`]); a plan that leaves
    /// it unsaid runs 1F1B, or the interleaved schedule with `interleaving > 1`
    /// ([`StepPlan::schedule`]).
    #[serde(default, skip_serializing_if = "PipelineSchedule::is_default")]
    pub pipeline_schedule: PipelineSchedule,
    pub recomputation: Recomputation,
    /// What selective recomputation runs again (the attention core unless said).
    #[serde(default, skip_serializing_if = "is_default")]
    pub recompute_modules: RecomputeModules,
    /// Of each model chunk's blocks, only the first this many run `recomputation` (full);
    /// the others keep every activation: Megatron-LM's `--recompute-method block
    /// --recompute-num-layers N`. `None`: every block.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recompute_layers: Option<u64>,
    /// The activations the first this many blocks keep are moved to the host's memory
    /// after their forward pass and brought back before their backward pass, on copy
    /// streams beside the computation (Megatron-Core's `cpu_offloading_num_layers` with
    /// Transformer Engine's offloading; one pipeline stage, no recomputation): HBM for
    /// host-link time, of which a step exposes what the next block's pass does not cover.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub activation_offload_layers: u64,
    pub sequence_parallel: bool,
    pub precision: Precision,
    /// How an FP8 recipe's per-tensor scales are chosen (ignored without FP8).
    #[serde(default, skip_serializing_if = "is_default")]
    pub fp8_scaling: Fp8Scaling,
    /// FP8 parameters (Megatron-LM's `--fp8-param-gather`, which NVIDIA's FP8 recipes
    /// set): the quantised GEMMs' weights are kept only in the recipe's type (no bf16
    /// copy) and the distributed optimizer or FSDP all-gathers them in it.
    #[serde(default, skip_serializing_if = "is_false")]
    pub fp8_param_gather: bool,
    pub optimizer: Optimizer,
    /// The optimizer's state sharded over the data-parallel group (Megatron-LM's
    /// distributed optimizer, ZeRO-1); implied by `sharding.zero_stage ≥ 1`.
    pub distributed_optimizer: bool,
    /// How far data parallelism shards the state (ZeRO-2, ZeRO-3/FSDP) and whether its
    /// traffic overlaps computation.
    #[serde(flatten, default)]
    pub sharding: Sharding,
    /// EP: ranks a Mixture-of-Experts model's experts are divided over (1 for a dense
    /// model). The expert groups fold into the `t × d` ranks of a pipeline stage
    /// (Megatron-Core's parallel folding): EP × ETP divides `t × d`, and the experts'
    /// gradients are reduced over the rest, the expert-data-parallel group.
    #[serde(default = "one")]
    pub expert_parallel: u64,
    /// ETP: ranks each expert's FFN is split over.
    #[serde(default = "one")]
    pub expert_tensor_parallel: u64,
    /// The expert-parallel all-to-all exchanges overlap computation: one micro-batch's
    /// dispatch and combine run while another's forward or backward computes (DeepSeek's
    /// DualPipe; Megatron-Core's `--overlap-moe-expert-parallel-comm`), so only what a
    /// stage's computation per micro-batch does not cover is exposed.
    #[serde(default, skip_serializing_if = "is_false")]
    pub all_to_all_overlap: bool,
    /// With interleaving, the pipeline's point-to-point transfers overlap the computation
    /// of the 1F1B steady state (Megatron-LM's `overlap_p2p_comm`, its default with
    /// virtual stages, which NeMo's and Megatron-Bridge's recipes set too): a micro-batch
    /// exposes only what the stage's work does not cover, while the pipeline's fill and
    /// flush wait for every transfer. Plain 1F1B's transfers are always exposed
    /// (Megatron-LM turns the overlap off without interleaving).
    #[serde(default, skip_serializing_if = "is_false")]
    pub pipeline_parallel_overlap: bool,
    /// CP: ranks each sequence is split over (context parallelism; Megatron-Core's
    /// `--context-parallel-size`), between the tensor-parallel and the data-parallel ranks:
    /// a stage has `t × CP × d` ranks. Each holds `2·CP` load-balanced chunks' two (chunk
    /// `i` and `2·CP − 1 − i`), so causal attention costs every rank the same; weights are
    /// replicated over CP and their gradients reduced over the `CP × d` ranks together.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub context_parallel: u64,
    /// How the context-parallel ranks exchange keys and values.
    #[serde(flatten, default)]
    pub context_exchange: ContextExchange,
    /// Transformer blocks per pipeline stage, first to last (the embedding goes with the
    /// first stage, the head with the last), as Megatron-LM's uneven pipelines give them;
    /// `None`: an even split over `pipeline × interleaving` chunks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage_layers: Option<Vec<u64>>,
}

fn one() -> u64 {
    1
}

fn yes() -> bool {
    true
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

fn is_one(n: &u64) -> bool {
    *n == 1
}

pub(crate) fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_true(b: &bool) -> bool {
    *b
}

/// How data parallelism shards the training state beyond the optimizer's (ZeRO,
/// Rajbhandari et al. 2020; PyTorch FSDP) and whether its traffic overlaps computation.
/// Serialised flat into the plan, each key only when it is not its default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sharding {
    /// 0: every state replicated; 1: the optimizer's sharded (as `distributed_optimizer`
    /// says); 2: the gradients too, each layer's reduce-scattered in every micro-batch's
    /// backward pass; 3 (FSDP): the weights too, each layer's all-gathered before its
    /// forward and backward passes.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub zero_stage: u64,
    /// ZeRO-3: each layer's gathered weights are freed after its forward pass and gathered
    /// again for backward (FSDP's `reshard_after_forward`, the default); `false` keeps a
    /// stage's weights gathered from forward to backward: one gather less, the stage's
    /// whole weights held.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub reshard_after_forward: bool,
    /// The data-parallel traffic overlaps computation (Megatron-LM's
    /// `--overlap-grad-reduce` and `--overlap-param-gather`, FSDP's prefetching): only what
    /// the computation it can hide behind does not cover is exposed.
    #[serde(default, skip_serializing_if = "is_false")]
    pub data_parallel_overlap: bool,
    /// Hybrid sharding (HSDP; Megatron-LM's distributed-optimizer instances): the state is
    /// sharded over groups of this many data-parallel ranks and replicated across the
    /// `d / group` groups, whose shards' gradients are all-reduced once per step; `None`:
    /// sharded over the whole data-parallel group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharding_group: Option<u64>,
}

/// A group of ranks a collective runs over: how many, and how many ranks apart.
pub type RankGroup = (u64, u64);

/// Where a plan's state is sharded and replicated: the dense parameters' shard group and
/// the groups holding copies of each shard, the same for the experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardGroups {
    pub dense: RankGroup,
    pub dense_replicas: RankGroup,
    pub experts: RankGroup,
    pub expert_replicas: RankGroup,
}

impl Default for Sharding {
    /// Megatron-LM's defaults: nothing sharded beyond the optimizer's choice, no overlap.
    fn default() -> Self {
        Sharding {
            zero_stage: 0,
            reshard_after_forward: true,
            data_parallel_overlap: false,
            sharding_group: None,
        }
    }
}

impl StepPlan {
    /// Whether the quantised GEMMs' weights are kept in the recipe's type only (FP8
    /// parameters with an FP8 or MXFP8 precision).
    pub fn fp8_weights(&self) -> bool {
        self.fp8_param_gather && self.precision.is_quantised()
    }

    /// The ZeRO stage in effect: `sharding.zero_stage`, at least 1 with the distributed
    /// optimizer.
    pub fn zero_stage(&self) -> u64 {
        self.sharding
            .zero_stage
            .max(u64::from(self.distributed_optimizer))
    }

    /// The groups the state is sharded over and replicated across: the data-parallel group
    /// with the context-parallel ranks (`CP × d` ranks, `t` apart) split into `sharding_group`-rank groups, the replicas of a shard
    /// `t × sharding_group` apart; the experts over their expert-data-parallel group
    /// (`EP × ETP` apart) split the same number of ways when it divides it.
    pub fn shard_groups(&self) -> ShardGroups {
        let (t, d) = (self.tensor_parallel.max(1), self.gradient_group());
        let group = self.sharding.sharding_group.unwrap_or(d).clamp(1, d);
        let replicas = (d / group).max(1);
        let edp = self.expert_data_parallel();
        let stride = self.expert_parallel.max(1) * self.expert_tensor_parallel.max(1);
        let expert_replicas = if edp.is_multiple_of(replicas) {
            replicas
        } else {
            1
        };
        let expert_group = edp / expert_replicas;
        ShardGroups {
            dense: (group, t),
            dense_replicas: (replicas, t * group),
            experts: (expert_group, stride),
            expert_replicas: (expert_replicas, stride * expert_group),
        }
    }

    /// The expert-data-parallel width: the ranks of a pipeline stage over EP × ETP.
    pub fn expert_data_parallel(&self) -> u64 {
        let groups = self
            .expert_parallel
            .max(1)
            .saturating_mul(self.expert_tensor_parallel.max(1));
        (self.stage_ranks() / groups).max(1)
    }

    /// The ranks of one pipeline stage: `t × CP × d`.
    pub fn stage_ranks(&self) -> u64 {
        self.tensor_parallel
            .saturating_mul(self.context_parallel)
            .saturating_mul(self.data_parallel)
    }

    /// The devices the plan runs on: `t × CP × d` ranks per stage over `p` stages.
    pub fn devices(&self) -> u64 {
        self.stage_ranks().saturating_mul(self.pipeline_parallel)
    }

    /// The ranks holding the same weights, over which their gradients are reduced (and the
    /// state sharded): the data-parallel ranks and, for each, its context-parallel ranks
    /// (`CP × d`, `t` apart), as Megatron-Core folds CP into data parallelism for the
    /// gradients.
    pub fn gradient_group(&self) -> u64 {
        self.context_parallel
            .max(1)
            .saturating_mul(self.data_parallel.max(1))
    }

    /// The schedule the plan runs: `pipeline_schedule`, or with it unsaid (1F1B) and more
    /// than one chunk per device, the interleaved schedule (as plans said it before
    /// schedules had names).
    pub fn schedule(&self) -> PipelineSchedule {
        if self.pipeline_schedule.is_default() {
            PipelineSchedule::implied(self.interleaving)
        } else {
            self.pipeline_schedule
        }
    }

    /// Blocks per pipeline stage (a device's chunks), for a model of `layers` blocks.
    pub fn blocks_per_stage(&self, layers: u64) -> Vec<u64> {
        match &self.stage_layers {
            Some(list) => list.clone(),
            None => {
                let p = self.pipeline_parallel.max(1);
                let v = self.even_chunks();
                vec![layers / (p * v) * v; p as usize]
            }
        }
    }

    /// The chunks an even split divides the blocks into per device: the interleaved
    /// schedule's `interleaving` (Megatron-LM's equal chunks); the other schedules split
    /// each device's blocks themselves ([`crate::pipeline::Layout`]).
    pub(crate) fn even_chunks(&self) -> u64 {
        if self.schedule() == PipelineSchedule::Interleaved {
            self.interleaving.max(1)
        } else {
            1
        }
    }

    /// Whether the pipeline's point-to-point transfers may hide behind the steady state's
    /// work: the interleaved schedule with `pipeline_parallel_overlap` (Megatron-LM's
    /// `overlap_p2p_comm`), or DualPipe's overlapped chunks.
    pub fn hides_transfers(&self) -> bool {
        let schedule = self.schedule();
        (self.pipeline_parallel_overlap && schedule == PipelineSchedule::Interleaved)
            || schedule.overlaps_chunks()
    }

    /// How the plan's schedule lays the model's blocks over its devices.
    pub fn layout(&self, layers: u64) -> Layout {
        Layout::of(
            self.schedule(),
            self.interleaving,
            &self.blocks_per_stage(layers),
        )
    }
}
