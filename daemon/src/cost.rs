//! Cost models for a search, resolved from what the spec names.
//!
//! Everywhere archplace runs for real — `archplace run`, the daemon — the models are
//! WebAssembly plugins loaded by the [`plugin`](crate::plugin) host, ours included. The
//! engine sees only the SDK's [`AreaModel`] and [`LatencyModel`] traits, so tests and
//! benchmarks can also use [`NativeModels`]: the reference model linked natively.

use crate::spec::CostModelSpec;
use archplace_plugin_sdk::{AreaModel, LatencyModel, Parameter};
use archplace_reference_cost::ReferenceModel;
use serde::Serialize;
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
#[derive(Debug, Clone, PartialEq, Serialize)]
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

/// Makes the cost models a spec names. `cancel` stops a running plugin call when the
/// search is cancelled.
pub trait CostModelSource: Send + Sync {
    fn resolve(
        &self,
        spec: &CostModelSpec,
        cancel: Arc<AtomicBool>,
    ) -> Result<CostModels, Vec<CostModelError>>;
}

/// The reference model linked natively: for tests and for benchmarks that compare it with
/// its WebAssembly build. Knows only `reference`.
#[derive(Debug, Clone, Copy, Default)]
pub struct NativeModels;

impl NativeModels {
    fn model(name: &str, params: &[Parameter]) -> Result<ReferenceModel, Vec<CostModelError>> {
        if name != "reference" {
            return Err(vec![CostModelError::Unknown {
                name: name.to_string(),
                available: "reference (natively linked)".into(),
            }]);
        }
        ReferenceModel::with_parameters(params.iter().map(|p| (p.name.as_str(), p.value.as_str())))
            .map_err(|errs| {
                errs.into_iter()
                    .map(|e| CostModelError::Parameter {
                        model: name.to_string(),
                        parameter: e.name,
                        message: e.message,
                    })
                    .collect()
            })
    }
}

impl CostModelSource for NativeModels {
    fn resolve(
        &self,
        spec: &CostModelSpec,
        _cancel: Arc<AtomicBool>,
    ) -> Result<CostModels, Vec<CostModelError>> {
        let a = Self::model(&spec.area.name, &spec.parameters_of(&spec.area.name));
        let l = Self::model(&spec.latency.name, &spec.parameters_of(&spec.latency.name));
        let source = |name: &str| ModelSource {
            plugin: name.to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            blake3: None,
            path: None,
        };
        match (a, l) {
            (Ok(a), Ok(l)) => Ok(CostModels {
                area: Arc::new(a),
                latency: Arc::new(l),
                area_source: source(&spec.area.name),
                latency_source: source(&spec.latency.name),
            }),
            (a, l) => {
                let mut errs = a.err().unwrap_or_default();
                for e in l.err().unwrap_or_default() {
                    if !errs.contains(&e) {
                        errs.push(e);
                    }
                }
                Err(errs)
            }
        }
    }
}
