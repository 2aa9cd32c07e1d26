//! The training job and the cluster it runs on.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Optimizer {
    /// No optimizer state.
    Sgd,
    /// One extra copy of the parameters of optimizer state (design doc §8.3).
    Adam,
}

/// The training plan's fixed inputs and the choices the search makes among.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Training {
    /// Samples per optimizer step.
    pub global_batch: u64,
    /// Micro-batch sizes to try; each divides the global batch.
    pub micro_batch_sizes: Vec<u64>,
    /// Activation-recomputation choices to try.
    pub activation_recomputation: Vec<bool>,
    pub optimizer: Optimizer,
    pub bytes_per_element: u64,
}

/// The devices and their links.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Cluster {
    pub devices: u64,
    pub link_bytes_per_second: f64,
    /// HBM sizes to try.
    pub hbm_bytes: Vec<u64>,
}

/// A fixed parallelisation to compare against (design doc §1.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Baseline {
    pub pipeline: u64,
    pub data: u64,
    pub tensor: u64,
}
