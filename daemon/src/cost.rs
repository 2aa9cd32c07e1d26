//! Cost models known to this build, found by name.
//!
//! Today the reference model is linked in natively; loading vendors' models as sandboxed
//! WebAssembly components comes with the plugin host. Either way the engine sees only the
//! SDK's [`AreaModel`] and [`LatencyModel`] traits.

use archplace_plugin_sdk::{AreaModel, LatencyModel};
use archplace_reference_cost::ReferenceModel;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Names of the cost models this build provides.
pub const KNOWN_MODELS: [&str; 1] = ["reference"];

/// Why a cost model could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CostModelError {
    #[error("unknown cost model `{name}`; available: {}", KNOWN_MODELS.join(", "))]
    Unknown { name: String },
    #[error("cost model `{model}`, parameter `{parameter}`: {message}")]
    Parameter {
        model: String,
        parameter: String,
        message: String,
    },
}

/// The area and latency models of one search.
#[derive(Clone)]
pub struct CostModels {
    pub area: Arc<dyn AreaModel>,
    pub latency: Arc<dyn LatencyModel>,
}

/// Makes the named model with its parameters (values as the spec wrote them).
fn reference(
    name: &str,
    params: &BTreeMap<String, String>,
) -> Result<ReferenceModel, Vec<CostModelError>> {
    if name != "reference" {
        return Err(vec![CostModelError::Unknown {
            name: name.to_string(),
        }]);
    }
    ReferenceModel::with_parameters(params.iter().map(|(k, v)| (k.as_str(), v.as_str()))).map_err(
        |errs| {
            errs.into_iter()
                .map(|e| CostModelError::Parameter {
                    model: name.to_string(),
                    parameter: e.name,
                    message: e.message,
                })
                .collect()
        },
    )
}

/// Resolves the models a spec names. `parameters` maps a model name to its parameters.
pub fn resolve(
    area: &str,
    latency: &str,
    parameters: &BTreeMap<String, BTreeMap<String, String>>,
) -> Result<CostModels, Vec<CostModelError>> {
    let empty = BTreeMap::new();
    let a = reference(area, parameters.get(area).unwrap_or(&empty));
    let l = reference(latency, parameters.get(latency).unwrap_or(&empty));
    match (a, l) {
        (Ok(a), Ok(l)) => Ok(CostModels {
            area: Arc::new(a),
            latency: Arc::new(l),
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
