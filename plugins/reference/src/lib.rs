//! The reference cost model of archplace.
//!
//! * **Area** ([`area`]): the closed form that reproduces the reference system's 22 nm
//!   Accelergy/CACTI areas to 1e-11 (design doc §5.2).
//! * **Latency** ([`latency`]): an analytic roofline of the tensor/vector-core template
//!   (§6.2–6.4) in seconds at a configurable clock (default 1.05 GHz), replacing the
//!   reference's Sunstone mapper, which costs minutes per configuration.
//!
//! This is a plain Rust library; it implements the SDK's [`AreaModel`] and [`LatencyModel`]
//! so the engine and its tests can use it directly.

pub mod area;
pub mod latency;

use archplace_plugin_sdk::units::parse_hertz;
use archplace_plugin_sdk::{
    AcceleratorConfig, AreaModel, CoreConfig, EstimateError, INTERFACE_VERSION, LatencyModel,
    ModelInfo, Op, OpCost, ParameterInfo, Provides,
};

/// Default clock of the reference template: 1.05 GHz.
pub const DEFAULT_CLOCK_HZ: f64 = 1.05e9;

/// The reference cost model with its parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct ReferenceModel {
    pub clock_hz: f64,
}

impl Default for ReferenceModel {
    fn default() -> Self {
        ReferenceModel {
            clock_hz: DEFAULT_CLOCK_HZ,
        }
    }
}

/// A parameter the reference model was given but cannot use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParameterError {
    pub name: String,
    pub message: String,
}

impl ReferenceModel {
    /// Builds the model from `(name, value)` parameters as a spec writes them. Every
    /// problem is reported, not just the first.
    pub fn with_parameters<'a>(
        params: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, Vec<ParameterError>> {
        let mut model = ReferenceModel::default();
        let mut errors = Vec::new();
        for (name, value) in params {
            match name {
                "clock" => match parse_hertz(value) {
                    Ok(hz) if hz > 0.0 => model.clock_hz = hz,
                    Ok(_) => errors.push(ParameterError {
                        name: name.into(),
                        message: "the clock must be above 0 Hz".into(),
                    }),
                    Err(e) => errors.push(ParameterError {
                        name: name.into(),
                        message: e.message,
                    }),
                },
                other => errors.push(ParameterError {
                    name: other.into(),
                    message: format!(
                        "the reference model has no parameter `{other}`; it has: clock"
                    ),
                }),
            }
        }
        if errors.is_empty() {
            Ok(model)
        } else {
            Err(errors)
        }
    }

    fn model_info(&self) -> ModelInfo {
        ModelInfo {
            name: "reference".into(),
            vendor: "archplace".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            interface_version: INTERFACE_VERSION,
            deterministic: true,
            provides: Provides {
                area: true,
                latency: true,
            },
            parameters: vec![ParameterInfo {
                name: "clock".into(),
                description: "clock frequency of the cores".into(),
                default: "1.05 GHz".into(),
            }],
        }
    }
}

impl AreaModel for ReferenceModel {
    fn info(&self) -> ModelInfo {
        self.model_info()
    }

    fn area_um2(
        &self,
        configs: &[AcceleratorConfig],
    ) -> Result<Vec<Result<f64, EstimateError>>, EstimateError> {
        Ok(configs.iter().map(area::area_um2).collect())
    }
}

impl LatencyModel for ReferenceModel {
    fn info(&self) -> ModelInfo {
        self.model_info()
    }

    fn latency(&self, core: &CoreConfig, ops: &[Op]) -> Result<Vec<OpCost>, EstimateError> {
        ops.iter()
            .map(|op| latency::op_cost(core, op, self.clock_hz))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_validated() {
        let m = ReferenceModel::with_parameters([("clock", "2 GHz")]).unwrap();
        assert_eq!(m.clock_hz, 2e9);
        let errs =
            ReferenceModel::with_parameters([("clock", "2 GB"), ("node", "7nm")]).unwrap_err();
        assert_eq!(errs.len(), 2);
        assert_eq!(errs[0].name, "clock");
        assert!(errs[1].message.contains("no parameter `node`"));
    }
}
