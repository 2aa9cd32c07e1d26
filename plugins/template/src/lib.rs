//! A template cost model for archplace. Copy this crate, rename it, and replace the two
//! estimates with your own. Everything the host sends and expects is documented on the
//! SDK's types: SI units, µm² for area, one answer per input, in order.

use archplace_plugin_sdk::units::parse_hertz;
use archplace_plugin_sdk::{
    AcceleratorConfig, CoreConfig, CoreKind, EstimateError, ModelInfo, Op, OpCost, OpKind,
    Parameter, ParameterError, Plugin,
};

// Generates the component's exports from the `Plugin` implementation below (only when
// building for WebAssembly; native builds and unit tests are unaffected).
archplace_plugin_sdk::export_plugin!(MyModel);

/// Your model and its parameters.
pub struct MyModel {
    clock_hz: f64,
}

impl Plugin for MyModel {
    fn info() -> ModelInfo {
        // The name specs use (`latency = "my-cost-model"`) and the manifest repeats: the
        // package's, so renaming the package renames the plugin. By default a model is
        // deterministic (same inputs, same outputs: archplace memoises your answers) and
        // provides both area and latency; change the fields if not.
        ModelInfo::new(
            env!("CARGO_PKG_NAME"),
            "Example Corp",
            env!("CARGO_PKG_VERSION"),
        )
        .parameter("clock", "core clock", "1 GHz")
    }

    /// Called with the spec's `[cost_model.parameters.my-cost-model]`; report every bad
    /// parameter, the spec's author sees each at its line.
    fn new(parameters: &[Parameter]) -> Result<Self, Vec<ParameterError>> {
        let mut model = MyModel { clock_hz: 1e9 };
        let mut errors = Vec::new();
        for p in parameters {
            match p.name.as_str() {
                "clock" => match parse_hertz(&p.value) {
                    Ok(hz) if hz > 0.0 => model.clock_hz = hz,
                    Ok(_) => errors.push(ParameterError::new(&p.name, "must be above 0 Hz")),
                    Err(e) => errors.push(ParameterError::new(&p.name, e.message)),
                },
                other => errors.push(ParameterError::unknown(other, &Self::info())),
            }
        }
        if errors.is_empty() {
            Ok(model)
        } else {
            Err(errors)
        }
    }

    /// Area in µm². Return `OutOfDomain` for chips your model does not describe: those
    /// candidates are skipped, the search goes on.
    fn area_um2(
        &self,
        configs: &[AcceleratorConfig],
    ) -> Result<Vec<Result<f64, EstimateError>>, EstimateError> {
        Ok(configs
            .iter()
            .map(|c| {
                let macs = f64::from(c.tensor_cores) * f64::from(c.width) * f64::from(c.depth);
                let lanes = f64::from(c.vector_cores) * f64::from(c.vector_width);
                Ok(10e6 + 500.0 * macs + 1000.0 * lanes + 0.5 * c.buffer_bytes as f64)
            })
            .collect())
    }

    /// Seconds and joules per operator on `core` (its `cores` cores of one kind).
    fn latency(&self, core: &CoreConfig, ops: &[Op]) -> Result<Vec<OpCost>, EstimateError> {
        let lanes = f64::from(core.cores) * f64::from(core.width) * f64::from(core.depth);
        ops.iter()
            .map(|op| {
                let work = match (op.kind, core.kind) {
                    (OpKind::Gemm(g), CoreKind::Tensor) => g.macs() as f64,
                    (OpKind::Vector { elements, .. }, CoreKind::Vector) => elements as f64,
                    (
                        OpKind::AllReduce {
                            bytes,
                            group,
                            link_bytes_per_second,
                        },
                        _,
                    ) => {
                        let g = f64::from(group.max(1));
                        let seconds = 2.0 * (g - 1.0) / g * bytes as f64
                            / link_bytes_per_second.max(1) as f64;
                        return Ok(OpCost::new(seconds, 0.0));
                    }
                    _ => {
                        return Err(EstimateError::Unsupported(format!(
                            "{:?} on {:?} cores",
                            op.kind, core.kind
                        )));
                    }
                };
                let fused: f64 = op.fused.iter().map(|f| f.elements as f64).sum();
                let seconds =
                    (work / lanes.max(1.0) + fused / f64::from(core.width.max(1))) / self.clock_hz;
                // Optional (interface 1.1): the seconds of the operator's off-chip
                // memory traffic, here one read of two bytes per unit of work at 1 TB/s.
                // The host holds a layer to at least the sum of its operators' memory
                // times, which the chip's cores share. Leave it out if you do not know it.
                let memory_seconds = (2.0 * work / 1e12).min(seconds);
                Ok(OpCost::new(seconds, work * 1e-12).with_memory_seconds(memory_seconds))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_unknown_parameters() {
        let errs = MyModel::new(&[Parameter {
            name: "nodes".into(),
            value: "7".into(),
        }])
        .err()
        .unwrap();
        assert!(errs[0].message.contains("no parameter `nodes`"));
    }
}
