//! A plan as a search records it ([`RecordedPlan`]): the one [`StepPlan`], written in
//! `result.json` and `explored.jsonl` the way those files have always shown a plan — its
//! axes as flat keys (`micro_batch`, `tensor_parallel`, `pipeline_stages`, ...) beside the
//! whole plan under `plan` — so the files keep their shape while the records hold the
//! plan once. The flat keys are derived from the plan when written and only read back
//! for a plan the step model did not price (the reference memory model's, whose `plan`
//! key is `null`).

use super::StepPlan;
use crate::pipeline::PipelineSchedule;
use crate::training::{ContextExchange, Fp8Scaling, Optimizer, Precision, Recomputation};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::borrow::Cow;

/// A searched plan and whether `archplace estimate` prices it as the search did.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedPlan {
    pub step: StepPlan,
    /// The step model priced the plan (the Megatron-LM memory model): `[plan]` given
    /// `step` estimates the same. `false` with the reference's memory model, whose plans
    /// the placement program prices as the reference system does; `step` then holds only
    /// the axes the flat keys say (bf16, Adam, nothing sharded beyond ZeRO's stage).
    pub estimable: bool,
    /// The model's transformer blocks, which the plan's stages hold (an even split's
    /// stages, `step.stage_layers` being `None`, are this over the devices).
    pub blocks: u64,
}

impl RecordedPlan {
    /// A plan of a model of `blocks` transformer blocks that the step model priced.
    pub fn priced(step: StepPlan, blocks: u64) -> Self {
        RecordedPlan {
            step,
            estimable: true,
            blocks,
        }
    }

    /// A plan the reference's memory model priced: only its axes are kept, exactly as
    /// reading its record back gives them.
    pub fn reference(step: &StepPlan, blocks: u64) -> Self {
        let stages = step.blocks_per_stage(blocks);
        Flat::of(step, &stages, false).into_plan()
    }

    /// The plan when `[plan]` given it estimates the same (see `estimable`).
    pub fn estimable(&self) -> Option<&StepPlan> {
        self.estimable.then_some(&self.step)
    }

    /// The blocks of each pipeline stage (a device's chunks together), first to last.
    pub fn stage_layers(&self) -> Vec<u64> {
        self.step.blocks_per_stage(self.blocks)
    }

    /// Whether anything is recomputed (`step.recomputation` says what).
    pub fn recomputes(&self) -> bool {
        self.step.recomputation != Recomputation::None
    }

    /// The numeric format (`None` with the reference's memory model, which has none).
    pub fn precision(&self) -> Option<Precision> {
        self.estimable.then_some(self.step.precision)
    }

    /// Devices the plan uses: `t × CP × p × d`.
    pub fn devices_used(&self) -> u64 {
        self.step.devices()
    }
}

/// The keys a record has always written for its plan, in their order.
#[derive(Serialize, Deserialize)]
struct Flat<'a> {
    micro_batch: u64,
    /// Whether anything is recomputed (`recomputation` says what).
    activation_recomputation: bool,
    #[serde(default)]
    recomputation: Recomputation,
    /// `None` with the reference's memory model, which has no numeric format.
    #[serde(default)]
    precision: Option<Precision>,
    #[serde(default)]
    distributed_optimizer: bool,
    #[serde(default)]
    zero_stage: u64,
    #[serde(default)]
    sequence_parallel: bool,
    #[serde(default = "one")]
    expert_parallel: u64,
    #[serde(default = "one")]
    expert_tensor_parallel: u64,
    #[serde(default = "one")]
    context_parallel: u64,
    tensor_parallel: u64,
    data_parallel: u64,
    pipeline_stages: u64,
    #[serde(default = "one")]
    pipeline_interleaving: u64,
    #[serde(default)]
    stage_layers: Cow<'a, [u64]>,
    #[serde(default)]
    devices_used: u64,
    #[serde(default)]
    plan: Option<Cow<'a, StepPlan>>,
}

fn one() -> u64 {
    1
}

impl<'a> Flat<'a> {
    fn of(p: &'a StepPlan, stage_layers: &'a [u64], estimable: bool) -> Self {
        Flat {
            micro_batch: p.micro_batch,
            activation_recomputation: p.recomputation != Recomputation::None,
            recomputation: p.recomputation,
            precision: estimable.then_some(p.precision),
            distributed_optimizer: p.distributed_optimizer,
            zero_stage: p.zero_stage(),
            sequence_parallel: p.sequence_parallel,
            expert_parallel: p.expert_parallel,
            expert_tensor_parallel: p.expert_tensor_parallel,
            context_parallel: p.context_parallel,
            tensor_parallel: p.tensor_parallel,
            data_parallel: p.data_parallel,
            pipeline_stages: p.pipeline_parallel,
            pipeline_interleaving: p.interleaving,
            stage_layers: Cow::Borrowed(stage_layers),
            devices_used: p.devices(),
            plan: estimable.then_some(Cow::Borrowed(p)),
        }
    }

    /// The record's plan: its `plan` when it has one, else the plan its flat keys say.
    fn into_plan(self) -> RecordedPlan {
        let blocks = self.stage_layers.iter().sum();
        if let Some(plan) = self.plan {
            return RecordedPlan::priced(plan.into_owned(), blocks);
        }
        let zero_stage = self.zero_stage.max(u64::from(self.distributed_optimizer));
        let step = StepPlan {
            tensor_parallel: self.tensor_parallel,
            pipeline_parallel: self.pipeline_stages,
            data_parallel: self.data_parallel,
            micro_batch: self.micro_batch,
            interleaving: self.pipeline_interleaving,
            pipeline_schedule: PipelineSchedule::default(),
            recomputation: self.recomputation,
            recompute_modules: Default::default(),
            recompute_layers: None,
            activation_offload_layers: 0,
            sequence_parallel: self.sequence_parallel,
            precision: self.precision.unwrap_or(Precision::Bf16Mixed),
            fp8_scaling: Fp8Scaling::default(),
            fp8_param_gather: false,
            optimizer: Optimizer::Adam,
            distributed_optimizer: zero_stage >= 1,
            sharding: super::Sharding {
                zero_stage,
                ..super::Sharding::default()
            },
            expert_parallel: self.expert_parallel,
            expert_tensor_parallel: self.expert_tensor_parallel,
            all_to_all_overlap: false,
            pipeline_parallel_overlap: false,
            context_parallel: self.context_parallel,
            context_exchange: ContextExchange::default(),
            stage_layers: (!self.stage_layers.is_empty()).then(|| self.stage_layers.into_owned()),
        };
        RecordedPlan {
            step,
            estimable: false,
            blocks,
        }
    }
}

impl Serialize for RecordedPlan {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let stages = self.stage_layers();
        Flat::of(&self.step, &stages, self.estimable).serialize(s)
    }
}

impl<'de> Deserialize<'de> for RecordedPlan {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Flat::deserialize(d).map(Flat::into_plan)
    }
}
