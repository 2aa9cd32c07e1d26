//! The records a search's files are made of, below the documents that gather them: a
//! chip ([`Configuration`]), the best one with its plans ([`Best`]) and a line of
//! `explored.jsonl` ([`ExploredLine`]), whose plans are the search's records
//! ([`ModelPlan`]: their stages, layers and baseline left out). `chip`, `explain`,
//! `domains` and `calibrated` read these; `result` (`result.json`) embeds what they make.

use archplace_engine::search::{Evaluated, ModelPlan};
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
    pub plans: Vec<ModelPlan>,
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

impl From<&Evaluated> for ExploredLine {
    fn from(e: &Evaluated) -> Self {
        ExploredLine {
            index: e.index,
            configuration: Configuration::new(&e.config, e.area_um2),
            bucket: e.bucket,
            mean_throughput_samples_per_second: e.mean_throughput_samples_per_second,
            hbm_bytes: e.hbm_bytes,
            plans: e.plans.iter().map(ModelPlan::summary).collect(),
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
