//! A calibration problem: the measurements, the parameters to fit and each measurement's
//! prediction under a vector of factors — the exact model (the spec with the parameters'
//! values set, its cost models resolved afresh, `estimate`'s step model), which every
//! reported residual comes from.

use crate::measurements::{FlopConvention, Measurement, Metric, Target};
use archplace_cost_port::{CostModelSource, CostModels, ParameterRef};
use archplace_engine::step::estimate_step;
use archplace_spec::Spec;
use archplace_spec::calibration::{configured, declared, with_values};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// Why a calibration cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum CalibrateError {
    #[error("measurement `{label}`: {message}")]
    Measurement { label: String, message: String },
    #[error("{0}")]
    Parameters(String),
    #[error("the fit failed: {0}")]
    Fit(String),
}

/// A parameter being fitted: what its value is written in and its physical bounds.
#[derive(Debug, Clone, PartialEq)]
pub struct Fitted {
    pub parameter: ParameterRef,
    pub unit: String,
    pub lower: f64,
    pub upper: f64,
}

/// The measurements, the parameters and what each measurement's prediction needs.
pub struct Problem<'a> {
    source: &'a dyn CostModelSource,
    pub measurements: &'a [Measurement],
    pub parameters: Vec<Fitted>,
    /// Each measurement's parameter values as its spec configures them.
    pub base: Vec<BTreeMap<ParameterRef, f64>>,
    /// What was measured, as seconds (a step's or an operator's).
    pub measured_seconds: Vec<f64>,
    /// The prediction with the specs' own values (factors of 1).
    pub uncalibrated_seconds: Vec<f64>,
    /// The latency plugin's name, version and component hash.
    pub plugin: (String, String, Option<String>),
    units: BTreeMap<ParameterRef, String>,
    /// Each measurement's cost models as its spec makes them (what predictions reuse).
    models: Vec<CostModels>,
}

impl<'a> Problem<'a> {
    /// Resolves every measurement's cost models (all must use the same latency plugin and
    /// version), chooses the parameters (`fit`, or those declared as fitted by default)
    /// and predicts each measurement uncalibrated.
    pub fn new(
        source: &'a dyn CostModelSource,
        measurements: &'a [Measurement],
        fit: Option<&[String]>,
    ) -> Result<Problem<'a>, CalibrateError> {
        let mut base = Vec::new();
        let mut plugin: Option<(String, String, Option<String>)> = None;
        let mut info = None;
        let mut uncalibrated = Vec::new();
        let mut measured = Vec::new();
        let mut all_models = Vec::new();
        for m in measurements {
            let fail = |message: String| CalibrateError::Measurement {
                label: m.label.clone(),
                message,
            };
            let models = resolve(&m.spec, source).map_err(fail)?;
            let i = models.latency.info();
            let this = (
                i.name.clone(),
                i.version.clone(),
                models.latency_source.blake3.clone(),
            );
            match &plugin {
                None => plugin = Some(this),
                Some(p) if (&p.0, &p.1) != (&this.0, &this.1) => {
                    return Err(fail(format!(
                        "its latency model is `{}` {}, another measurement's `{}` {}: a calibration is of one plugin and version",
                        this.0, this.1, p.0, p.1
                    )));
                }
                Some(_) => {}
            }
            base.push(configured(&m.spec, models.latency.as_ref()));
            let (seconds, measured_seconds) = observe(m, &m.spec, &models).map_err(fail)?;
            uncalibrated.push(seconds);
            measured.push(measured_seconds);
            all_models.push(models);
            info.get_or_insert(i);
        }
        let (Some(plugin), Some(info)) = (plugin, info) else {
            return Err(CalibrateError::Parameters("no measurements".into()));
        };
        let all = declared(&info);
        let parameters: Vec<Fitted> = match fit {
            None => all.iter().filter(|(_, c)| c.fit).collect::<Vec<_>>(),
            Some(names) => names
                .iter()
                .map(|n| {
                    all.iter()
                        .find(|(p, _)| &p.to_string() == n)
                        .ok_or_else(|| {
                            CalibrateError::Parameters(format!(
                                "`{n}` is not a calibratable parameter; with `{}` {}: {}",
                                info.name,
                                info.version,
                                all.iter()
                                    .map(|(p, _)| p.to_string())
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            ))
                        })
                })
                .collect::<Result<Vec<_>, _>>()?,
        }
        .into_iter()
        .map(|(p, c)| Fitted {
            parameter: p.clone(),
            unit: c.unit.clone(),
            lower: c.lower,
            upper: c.upper,
        })
        .collect();
        if parameters.is_empty() {
            return Err(CalibrateError::Parameters(format!(
                "nothing to fit: `{}` {} declares no calibratable parameters (interface 1.3) and none of the cluster's were asked for",
                info.name, info.version
            )));
        }
        for (m, b) in measurements.iter().zip(&base) {
            if let Some(p) = parameters.iter().find(|p| !b.contains_key(&p.parameter)) {
                return Err(CalibrateError::Measurement {
                    label: m.label.clone(),
                    message: format!(
                        "its latency model does not say the value of {}",
                        p.parameter
                    ),
                });
            }
        }
        let units = parameters
            .iter()
            .map(|p| (p.parameter.clone(), p.unit.clone()))
            .collect();
        Ok(Problem {
            source,
            measurements,
            parameters,
            base,
            measured_seconds: measured,
            uncalibrated_seconds: uncalibrated,
            plugin,
            units,
            models: all_models,
        })
    }

    /// Bounds on each factor that keep every measurement's value within the parameter's
    /// physical bounds (a factor beyond them would be clamped for some measurement).
    pub fn factor_bounds(&self) -> Vec<(f64, f64)> {
        self.parameters
            .iter()
            .map(|p| {
                self.base
                    .iter()
                    .filter_map(|b| b.get(&p.parameter))
                    .filter(|b| **b > 0.0)
                    .fold((0.0_f64, f64::INFINITY), |(lo, hi), b| {
                        (lo.max(p.lower / b), hi.min(p.upper / b))
                    })
            })
            .map(|(lo, hi)| if lo <= hi { (lo, hi) } else { (hi, hi) })
            .collect()
    }

    /// Measurement `i`'s predicted seconds with each parameter's value its spec's times
    /// `factors`.
    pub fn predict(&self, i: usize, factors: &[f64]) -> Result<f64, CalibrateError> {
        let m = &self.measurements[i];
        let fail = |message: String| CalibrateError::Measurement {
            label: m.label.clone(),
            message,
        };
        let values: Vec<(ParameterRef, f64)> = self
            .parameters
            .iter()
            .zip(factors)
            .map(|(p, f)| {
                let b = self.base[i].get(&p.parameter).copied().unwrap_or(1.0);
                (p.parameter.clone(), (b * f).clamp(p.lower, p.upper))
            })
            .collect();
        let spec = with_values(&m.spec, &values, &self.units).map_err(|e| fail(e.to_string()))?;
        let models = archplace_spec::reresolve_cost_models(
            &spec,
            self.source,
            &self.models[i],
            Arc::new(AtomicBool::new(false)),
        )
        .map_err(|d| {
            fail(
                d.iter()
                    .map(|d| d.message.clone())
                    .collect::<Vec<_>>()
                    .join("; "),
            )
        })?;
        observe(m, &spec, &models).map(|(s, _)| s).map_err(fail)
    }

    /// Predictions of the measurements `which` (in that order), several at once.
    pub fn predict_many(
        &self,
        which: &[usize],
        factors: &[f64],
    ) -> Result<Vec<f64>, CalibrateError> {
        crate::parallel::map(which, |&i| Some(self.predict(i, factors)))
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| Err(CalibrateError::Fit("a prediction thread panicked".into())))
            })
            .collect()
    }

    /// Log ratios of predicted to measured for `which` at `factors`.
    pub fn residuals(&self, which: &[usize], factors: &[f64]) -> Result<Vec<f64>, CalibrateError> {
        Ok(self
            .predict_many(which, factors)?
            .iter()
            .zip(which)
            .map(|(p, &i)| (p / self.measured_seconds[i]).ln())
            .collect())
    }
}

fn resolve(spec: &Spec, source: &dyn CostModelSource) -> Result<CostModels, String> {
    archplace_spec::resolve_cost_models(spec, source, Arc::new(AtomicBool::new(false))).map_err(
        |d| {
            d.iter()
                .map(|d| d.message.clone())
                .collect::<Vec<_>>()
                .join("; ")
        },
    )
}

/// The predicted seconds of `m` with `spec` and `models`, and the measured figure as
/// seconds (a throughput measurement becomes a step time through the prediction's own
/// tokens and FLOPs per step, which the parameters do not change).
fn observe(m: &Measurement, spec: &Spec, models: &CostModels) -> Result<(f64, f64), String> {
    match &m.target {
        Target::Op { op, tensor, cores } => {
            let chip = spec
                .estimate
                .as_ref()
                .map(|e| e.accelerator)
                .ok_or("no [accelerator]")?;
            let core = if *tensor {
                chip.tensor_core(cores.unwrap_or(chip.tensor_cores))
            } else {
                chip.vector_core(cores.unwrap_or(chip.vector_cores))
            };
            let cost = archplace_engine::operators::estimate(
                models.latency.as_ref(),
                &core,
                std::slice::from_ref(op),
            )
            .map_err(|e| e.to_string())?;
            let seconds = cost.first().map(|c| c.seconds).ok_or("no answer")?;
            Ok((seconds, m.value))
        }
        Target::Step { metric, convention } => {
            let input = spec
                .step_input(archplace_spec::Scheduling::ListSchedule)
                .map_err(|e| e.to_string())?;
            let r = estimate_step(&input, models.latency.as_ref())
                .map_err(|e| format!("the estimate cannot run: {e}"))?;
            let t = r.step_seconds;
            let measured = match (metric, convention) {
                (Metric::StepSeconds, _) => m.value,
                (Metric::TokensPerSecondPerDevice, _) => {
                    t * r.tokens_per_second_per_device / m.value
                }
                (Metric::TflopsPerDevice, Some(FlopConvention::Model)) => {
                    t * r.model_flops_per_second_per_device / 1e12 / m.value
                }
                (Metric::TflopsPerDevice, _) => {
                    t * r.hardware_flops_per_second_per_device / 1e12 / m.value
                }
                (Metric::OpSeconds, _) => return Err("an operator measurement without `op`".into()),
            };
            Ok((t, measured))
        }
    }
}
