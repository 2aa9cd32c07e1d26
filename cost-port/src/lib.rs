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
