//! What the engine takes from a validated spec: the co-search's input, and the step
//! model's for `archplace estimate`. One place converts, so the search and the estimate
//! read a spec the same way.

use crate::Spec;
use archplace_engine::search::{ModelInput, SearchInput};
use archplace_engine::step::StepInput;

/// Why a spec cannot be estimated (before any estimate is made).
#[derive(Debug, thiserror::Error)]
pub enum EstimateSpecError {
    #[error(
        "the spec has no [accelerator] and [plan] tables: `archplace estimate` evaluates one fixed chip and plan (see config/specs/estimate-a100.toml)"
    )]
    NoPlan,
    #[error("the spec has {0} [[models]] tables: `archplace estimate` takes a spec with one model")]
    Models(usize),
}

/// How `archplace estimate` schedules a layer's operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scheduling {
    /// The list schedule, with its gap to the lower bound reported: deterministic and fast
    /// (the default).
    #[default]
    ListSchedule,
    /// The search's: the MIP when the list schedule is not within the spec's
    /// `schedule_gap` of the bound, up to its wall-clock `schedule_time_limit_seconds`.
    Mip,
}

impl Spec {
    /// The layer-schedule options of `[search]`; `heuristic_only` for the list schedule alone.
    fn schedule_options(&self, heuristic_only: bool) -> archplace_engine::options::ScheduleOptions {
        archplace_engine::options::ScheduleOptions {
            node_limit: self.space.schedule_node_limit,
            time_limit_seconds: self.space.schedule_time_limit_seconds,
            heuristic_only,
            relative_gap: self.space.schedule_gap,
        }
    }

    /// The co-search's input.
    pub fn search_input(&self) -> SearchInput {
        SearchInput {
            objective: self.space.objective,
            models: self
                .models
                .iter()
                .map(|m| ModelInput {
                    weight: m.weight,
                    config: m.config.clone(),
                    baseline: m.baseline,
                })
                .collect(),
            training: self.training.clone(),
            cluster: self.cluster.clone(),
            convergence_window: self.space.convergence_window,
            strategy: self.space.strategy,
            use_all_devices: self.space.use_all_devices,
            schedule: self.schedule_options(false),
        }
    }

    /// The step model's input for the fixed chip and plan of `[accelerator]` and `[plan]`,
    /// its layers scheduled as `scheduling` says.
    pub fn step_input(&self, scheduling: Scheduling) -> Result<StepInput, EstimateSpecError> {
        let e = self.estimate.as_ref().ok_or(EstimateSpecError::NoPlan)?;
        let [model] = self.models.as_slice() else {
            return Err(EstimateSpecError::Models(self.models.len()));
        };
        Ok(StepInput {
            model: model.config.clone(),
            plan: e.plan.clone(),
            accelerator: e.accelerator,
            hbm_bytes: e.hbm_bytes,
            devices: self.cluster.devices,
            global_batch: self.training.global_batch,
            network: self.cluster.network,
            peak_flops_per_second: e.peak_flops_per_second,
            schedule: self.schedule_options(scheduling == Scheduling::ListSchedule),
            execution: self.training.execution,
        })
    }
}
