//! What a search takes: the models to train and the validated training, cluster and
//! solver choices.

use crate::model::ModelConfig;
use crate::options::ScheduleOptions;
use crate::space::Strategy;
use crate::training::{Baseline, Cluster, Training};
use serde::Serialize;

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
    /// How the search walks the space and when it stops.
    pub strategy: Strategy,
    /// Plans use every device of the cluster (`[search] use_all_devices`); otherwise some
    /// may stay idle, and a plan says how many it uses.
    pub use_all_devices: bool,
    /// How layer schedules are solved (MIP time limit, accepted gap).
    pub schedule: ScheduleOptions,
}
