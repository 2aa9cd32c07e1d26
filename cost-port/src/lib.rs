//! The cost-model port: what a search asks of a cost-model source, and what it gets back.
//!
//! A [`CostModelSpec`] names an area and a latency plugin with their parameters; a
//! [`CostModelSource`] turns it into [`CostModels`]: the SDK's [`AreaModel`] and
//! [`LatencyModel`] trait objects, which are all the engine ever sees, and where each came
//! from. The plugin host (`archplace-plugin-host`) is the source everywhere archplace runs
//! for real; tests and benchmarks may use another (`NativeModels`, feature `native`: the
//! reference model linked natively). The spec language and the runner name only this
//! crate, so neither needs wasmtime.

use archplace_plugin_sdk::{AreaModel, LatencyModel, Parameter};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// A plugin as a spec names it: `area = "reference"`, or
/// `area = { plugin = "reference", version = "^0.1", blake3 = "…" }`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PluginRef {
    pub name: String,
    /// A semver requirement (`"1.2"` means `^1.2`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The component's blake3 hash, hex.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blake3: Option<String>,
}

impl PluginRef {
    pub fn named(name: &str) -> Self {
        PluginRef {
            name: name.to_string(),
            version: None,
            blake3: None,
        }
    }
}

/// Why the cost models of a spec could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CostModelError {
    #[error("unknown cost model `{name}`; available: {available}")]
    Unknown { name: String, available: String },
    #[error("cost model `{model}`, parameter `{parameter}`: {message}")]
    Parameter {
        model: String,
        parameter: String,
        message: String,
    },
    #[error("{role} model `{plugin}`: {message}")]
    Plugin {
        role: &'static str,
        plugin: String,
        message: String,
    },
}

/// Where a model came from, for the result files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelSource {
    pub plugin: String,
    pub version: String,
    /// blake3 of the component (absent for a natively linked model).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blake3: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// The area and latency models of one search.
#[derive(Clone)]
pub struct CostModels {
    pub area: Arc<dyn AreaModel>,
    pub latency: Arc<dyn LatencyModel>,
    pub area_source: ModelSource,
    pub latency_source: ModelSource,
}

/// The cost models a spec names: `[cost_model]` after validation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CostModelSpec {
    pub area: PluginRef,
    pub latency: PluginRef,
    /// Parameters per plugin name, as the spec writes them (the plugin parses them).
    pub parameters: BTreeMap<String, BTreeMap<String, String>>,
    /// `[cost_model] calibration`: a calibration file as the spec names it (relative to
    /// the spec's folder).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<String>,
    /// `[cost_model.uncertainty.*]`: ranges of parameters whose effect on the answer is
    /// reported as an interval, in name order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub uncertainty: Vec<ParameterRange>,
}

/// The owner of archplace's own calibratable parameters (the cluster's collective
/// efficiencies), next to the plugins' names.
pub const CLUSTER: &str = "cluster";

/// A calibratable parameter: `gpu-like.matrix_efficiency` (a plugin's, as it declares it
/// under interface 1.3) or `cluster.inter_node_efficiency` (archplace's own).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ParameterRef {
    /// A plugin's name, or [`CLUSTER`].
    pub owner: String,
    pub name: String,
}

impl ParameterRef {
    pub fn new(owner: &str, name: &str) -> Self {
        ParameterRef {
            owner: owner.into(),
            name: name.into(),
        }
    }

    /// One of the cluster's parameters (not a plugin's).
    pub fn is_cluster(&self) -> bool {
        self.owner == CLUSTER
    }
}

impl std::fmt::Display for ParameterRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.owner, self.name)
    }
}

impl From<ParameterRef> for String {
    fn from(p: ParameterRef) -> String {
        p.to_string()
    }
}

impl TryFrom<String> for ParameterRef {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        match s.split_once('.') {
            Some((owner, name)) if !owner.is_empty() && !name.is_empty() => {
                Ok(ParameterRef::new(owner, name))
            }
            _ => Err(format!(
                "`{s}` is not a parameter: write PLUGIN.NAME (e.g. gpu-like.matrix_efficiency) or cluster.NAME"
            )),
        }
    }
}

/// A parameter's range of plausible values, in the unit it is declared in (`unit`, as
/// the spec wrote it after the numbers; empty for a plain number).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ParameterRange {
    pub parameter: ParameterRef,
    pub lower: f64,
    pub upper: f64,
    pub unit: String,
}

impl CostModelSpec {
    /// The parameters the spec sets for plugin `name`, in name order.
    pub fn parameters_of(&self, name: &str) -> Vec<Parameter> {
        self.parameters
            .get(name)
            .map(|m| {
                m.iter()
                    .map(|(k, v)| Parameter {
                        name: k.clone(),
                        value: v.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Makes the cost models a spec names. `cancel` stops a running plugin call when the
/// search is cancelled.
pub trait CostModelSource: Send + Sync {
    fn resolve(
        &self,
        spec: &CostModelSpec,
        cancel: Arc<AtomicBool>,
    ) -> Result<CostModels, Vec<CostModelError>>;

    /// The cost models of `spec` once more, with other parameters than `like`'s (a
    /// calibration's fit and an interval's draws open many): what [`resolve`] gives,
    /// reusing the components `like` was made from where the source can. By default,
    /// resolved afresh.
    ///
    /// [`resolve`]: CostModelSource::resolve
    fn reconfigure(
        &self,
        spec: &CostModelSpec,
        like: &CostModels,
        cancel: Arc<AtomicBool>,
    ) -> Result<CostModels, Vec<CostModelError>> {
        let _ = like;
        self.resolve(spec, cancel)
    }

    /// The most memory the instances of `plugin` may hold at once in one search: what a
    /// search's memory estimate adds for a cost model. 0 for models linked natively, whose
    /// memory is the process's own.
    fn instance_memory_bytes(&self, _plugin: &str) -> u64 {
        0
    }

    /// The most memory the source's memo of one plugin's estimates holds (shared by the
    /// searches that use it). 0 when there is none.
    fn memo_memory_bytes(&self) -> u64 {
        0
    }
}

#[cfg(feature = "native")]
mod native;
#[cfg(feature = "native")]
pub use native::NativeModels;
