//! The reference model linked natively, as a [`CostModelSource`]: everywhere archplace runs
//! for real the models are WebAssembly plugins loaded by the plugin host, ours included;
//! tests and benchmarks that compare the two, or need no plugin build, use this one.

use crate::{CostModelError, CostModelSource, CostModelSpec, CostModels, ModelSource};
use archplace_plugin_sdk::Parameter;
use archplace_reference_cost::ReferenceModel;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

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
