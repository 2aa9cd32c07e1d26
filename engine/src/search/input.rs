//! What a search takes: the models to train and the validated training, cluster and
//! solver choices.

use crate::model::ModelConfig;
use crate::options::ScheduleOptions;
use crate::space::{Objective, Strategy};
use crate::training::{Baseline, Cluster, Training};
use serde::Serialize;

/// A model to train and its optional baseline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelInput {
    pub config: ModelConfig,
    pub baseline: Option<Baseline>,
    /// How many times the model counts in the search's objective (`[[models]] weight`,
    /// 1 unless said; [`SearchInput::objective_weights`]).
    pub weight: f64,
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
    /// What it maximises over the models.
    pub objective: Objective,
    /// Plans use every device of the cluster (`[search] use_all_devices`); otherwise some
    /// may stay idle, and a plan says how many it uses.
    pub use_all_devices: bool,
    /// How layer schedules are solved (MIP time limit, accepted gap).
    pub schedule: ScheduleOptions,
}

impl SearchInput {
    /// Each model's factor in the search's score, the mean over models of factor ×
    /// samples per second: its weight, times its sequence length when the objective is
    /// tokens per second, scaled so that the factors average 1 (with equal weights and the
    /// samples objective, every factor is 1 and the score the plain mean of the models'
    /// samples/s). Bounds scale alike: a weighted mean of the models' bounds bounds the
    /// weighted mean of their throughputs.
    pub fn objective_weights(&self) -> Vec<f64> {
        let raw: Vec<f64> = self
            .models
            .iter()
            .map(|m| {
                m.weight
                    * match self.objective {
                        Objective::SamplesPerSecond => 1.0,
                        Objective::TokensPerSecond => m.config.seq_len as f64,
                    }
            })
            .collect();
        let total: f64 = raw.iter().sum();
        if !(total.is_finite() && total > 0.0) {
            return vec![1.0; raw.len()];
        }
        raw.iter().map(|w| w * raw.len() as f64 / total).collect()
    }
}
