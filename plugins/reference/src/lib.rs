//! The reference cost model of archplace.
//!
//! * **Area** ([`area`]): the closed form that reproduces the reference system's 22 nm
//!   Accelergy/CACTI areas to 1e-11 (`docs/reference.md` §1.2).
//! * **Latency** ([`latency`]): an analytic roofline of the tensor/vector-core template
//!   (§6.2–6.4) in seconds at a configurable clock (default 1.05 GHz), replacing the
//!   reference's Sunstone mapper, which costs minutes per configuration.
//!
//! The same code is two things: a plain Rust library implementing the SDK's [`AreaModel`]
//! and [`LatencyModel`] (the engine's unit tests use it directly), and, built with
//! `--target wasm32-wasip2`, the WebAssembly component that archplace loads by default.
//! Both give bit-identical answers: the only transcendental functions (area
//! interpolation) come from the pure-Rust `libm`, not from the platform's C library.

pub mod area;
pub mod latency;

use archplace_plugin_sdk::units::parse_hertz;
use archplace_plugin_sdk::{
    AcceleratorConfig, AreaModel, CoreConfig, EstimateError, LatencyModel, ModelInfo, Op, OpCost,
    Parameter, ParameterError, Plugin,
};

archplace_plugin_sdk::export_plugin!(ReferenceModel);

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
                other => errors.push(ParameterError::unknown(other, &Self::model_info())),
            }
        }
        if errors.is_empty() {
            Ok(model)
        } else {
            Err(errors)
        }
    }

    fn model_info() -> ModelInfo {
        ModelInfo::new("reference", "archplace", env!("CARGO_PKG_VERSION"))
            .parameter("clock", "clock frequency of the cores", "1.05 GHz")
            // Every operator's time is its cycles over the clock: the one parameter
            // measurements of this model can fit.
            .calibratable("clock", "GHz", 0.1, 5.0, true)
    }

    /// The calibratable parameters' values as configured (interface 1.3).
    fn configured_values(&self) -> Vec<(String, f64)> {
        vec![("clock".into(), self.clock_hz / 1e9)]
    }
}

impl AreaModel for ReferenceModel {
    fn info(&self) -> ModelInfo {
        Self::model_info()
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
        Self::model_info()
    }

    fn latency(&self, core: &CoreConfig, ops: &[Op]) -> Result<Vec<OpCost>, EstimateError> {
        ops.iter()
            .map(|op| latency::op_cost(core, op, self.clock_hz))
            .collect()
    }

    fn configured(&self) -> Vec<(String, f64)> {
        self.configured_values()
    }
}

impl Plugin for ReferenceModel {
    fn info() -> ModelInfo {
        Self::model_info()
    }

    fn new(parameters: &[Parameter]) -> Result<Self, Vec<ParameterError>> {
        Self::with_parameters(
            parameters
                .iter()
                .map(|p| (p.name.as_str(), p.value.as_str())),
        )
    }

    fn area_um2(
        &self,
        configs: &[AcceleratorConfig],
    ) -> Result<Vec<Result<f64, EstimateError>>, EstimateError> {
        AreaModel::area_um2(self, configs)
    }

    fn latency(&self, core: &CoreConfig, ops: &[Op]) -> Result<Vec<OpCost>, EstimateError> {
        LatencyModel::latency(self, core, ops)
    }

    fn configured(&self) -> Vec<(String, f64)> {
        self.configured_values()
    }

    /// Fused attention at the template's own bounds (`latency::op_cost`), not as its
    /// unfused operators.
    fn attention(&self, core: &CoreConfig, ops: &[Op]) -> Result<Vec<OpCost>, EstimateError> {
        LatencyModel::latency(self, core, ops)
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
        assert!(errs[1].message.contains("no parameter `node`"), "{errs:?}");
    }
}
