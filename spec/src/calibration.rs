//! Calibrated and uncertain parameters: which parameters calibration may fit, their values
//! in a spec, a spec with other values, and the calibration file `archplace calibrate`
//! writes and `[cost_model] calibration` (or `--calibration`) applies.
//!
//! A calibration stores one *factor* per parameter, not a value: the parameter's value in
//! the spec it is applied to (given, or its default — a GPU preset's measured GEMM
//! ceiling, say) times the factor, within the parameter's declared bounds. So one
//! calibration of a software stack carries over between GPUs whose presets differ, and on
//! the GPU it was fitted on gives exactly the fitted value.

use crate::{Diagnostic, Spec};
use archplace_cost_port::{CLUSTER, CostModels, ParameterRef};
use archplace_plugin_sdk::{Calibratable, LatencyModel, ModelInfo};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// archplace's own calibratable parameters: the collective efficiency of each network
/// tier (the fraction of the link bandwidth a collective reaches) and what a collective
/// keeps of its rate beside computation (`overlap_efficiency`: fitted when a file asks),
/// which the step model applies — a latency plugin does not price the step's collectives.
/// Name, lower and upper bound, fitted by default.
pub const CLUSTER_PARAMETERS: [(&str, f64, f64, bool); 3] = [
    ("intra_node_efficiency", 0.05, 1.0, true),
    ("inter_node_efficiency", 0.05, 1.0, true),
    ("overlap_efficiency", 0.1, 1.0, false),
];

/// The calibration file's `format` key.
pub const FORMAT: &str = "archplace-calibration";
/// The calibration file format's version this archplace reads and writes.
pub const FORMAT_VERSION: u32 = 1;
/// The largest calibration file read.
pub const MAX_CALIBRATION_BYTES: u64 = 8 << 20;

/// Every parameter calibration may fit with the latency model `info`: the plugin's
/// declarations (interface 1.3; none before), then the cluster's.
pub fn declared(info: &ModelInfo) -> Vec<(ParameterRef, Calibratable)> {
    let plugin = info
        .calibratable
        .iter()
        .map(|c| (ParameterRef::new(&info.name, &c.name), c.clone()));
    let cluster = CLUSTER_PARAMETERS.iter().map(|&(name, lower, upper, fit)| {
        (
            ParameterRef::new(CLUSTER, name),
            Calibratable {
                name: name.into(),
                unit: String::new(),
                lower,
                upper,
                fit,
            },
        )
    });
    plugin.chain(cluster).collect()
}

/// The value of every calibratable parameter in `spec`, in its declared unit: the
/// plugin's as the latency model `latency` (configured by the spec) says, the cluster's
/// collective efficiencies as given or as the cluster preset sets them (1 without).
pub fn configured(spec: &Spec, latency: &dyn LatencyModel) -> BTreeMap<ParameterRef, f64> {
    let name = latency.info().name;
    let mut values: BTreeMap<ParameterRef, f64> = latency
        .configured()
        .into_iter()
        .map(|(p, v)| (ParameterRef::new(&name, &p), v))
        .collect();
    let (raw, _) = crate::read_toml::<crate::raw::RawSpec>(&spec.source_text, &spec.source_file);
    let cluster = raw.map(|r| r.cluster).unwrap_or_default();
    let preset = cluster
        .preset
        .as_deref()
        .and_then(archplace_plugin_sdk::gpus::system);
    values.insert(
        ParameterRef::new(CLUSTER, "intra_node_efficiency"),
        cluster
            .intra_node_efficiency
            .unwrap_or(preset.map_or(1.0, |g| g.nvlink_collective_fraction)),
    );
    values.insert(
        ParameterRef::new(CLUSTER, "inter_node_efficiency"),
        cluster.inter_node_efficiency.unwrap_or(1.0),
    );
    values.insert(
        ParameterRef::new(CLUSTER, "overlap_efficiency"),
        cluster.overlap_efficiency.unwrap_or(1.0),
    );
    values
}

/// Why a spec could not take a calibration or a parameter's value.
#[derive(Debug, thiserror::Error)]
pub enum CalibrationError {
    #[error("cannot read calibration {path}: {message}")]
    Read { path: String, message: String },
    #[error(
        "calibration {path} was made for latency model `{made_for}`; this spec's is `{actual}`: make one for it with `archplace calibrate`"
    )]
    OtherPlugin {
        path: String,
        made_for: String,
        actual: String,
    },
    #[error("the spec with calibrated parameter values is not valid: {0}")]
    Invalid(String),
    #[error("{0}")]
    Parameter(String),
}

/// The spec with parameters set to `values` (each in its declared unit, `units` giving
/// it for plugin parameters): plugin parameters written as `"<value> <unit>"` into
/// `[cost_model.parameters.<plugin>]`, cluster efficiencies as numbers into `[cluster]`;
/// validated again. Its text is the one with the values (what a pool's workers are sent);
/// it keeps the original's file name and content hash, so results name the file the
/// user wrote.
pub fn with_values(
    spec: &Spec,
    values: &[(ParameterRef, f64)],
    units: &BTreeMap<ParameterRef, String>,
) -> Result<Spec, CalibrationError> {
    let mut doc: toml::Table =
        toml::from_str(&spec.source_text).map_err(|e| CalibrationError::Invalid(e.to_string()))?;
    for (p, v) in values {
        if !v.is_finite() {
            return Err(CalibrationError::Parameter(format!(
                "{p}: {v} is not finite"
            )));
        }
        if p.is_cluster() {
            table(&mut doc, &["cluster"]).insert(p.name.clone(), toml::Value::Float(*v));
        } else {
            let unit = units.get(p).map_or("", String::as_str);
            let text = if unit.is_empty() {
                format!("{v}")
            } else {
                format!("{v} {unit}")
            };
            table(&mut doc, &["cost_model", "parameters", &p.owner])
                .insert(p.name.clone(), toml::Value::String(text));
        }
    }
    // The values are set: the calibration that gave them is not applied again.
    if let Some(toml::Value::Table(c)) = doc.get_mut("cost_model") {
        c.remove("calibration");
    }
    let text = toml::to_string(&doc).map_err(|e| CalibrationError::Invalid(e.to_string()))?;
    let mut out = crate::parse(&text, &spec.source_file).map_err(|d| {
        CalibrationError::Invalid(
            d.iter()
                .map(|d: &Diagnostic| format!("{}: {}", d.field, d.message))
                .collect::<Vec<_>>()
                .join("; "),
        )
    })?;
    out.content_hash.clone_from(&spec.content_hash);
    Ok(out)
}

/// The table at `path` in `doc`, made when missing (a non-table in the way is replaced:
/// the spec was valid, so that does not happen).
fn table<'a>(doc: &'a mut toml::Table, path: &[&str]) -> &'a mut toml::Table {
    let mut t = doc;
    for key in path {
        let entry = t
            .entry(key.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if !entry.is_table() {
            *entry = toml::Value::Table(toml::Table::new());
        }
        t = match entry {
            toml::Value::Table(t) => t,
            _ => unreachable!("made a table above"),
        };
    }
    t
}

/// The plugin a calibration was made with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CalibratedPlugin {
    pub name: String,
    pub version: String,
    /// blake3 of its component, when it was loaded from one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blake3: Option<String>,
}

/// One fitted parameter of a calibration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FittedParameter {
    pub parameter: ParameterRef,
    /// The unit values are written in (empty: a plain number).
    #[serde(default)]
    pub unit: String,
    /// What the parameter's value in a spec is multiplied by.
    pub factor: f64,
    /// The declared physical bounds of the value.
    pub lower: f64,
    pub upper: f64,
}

/// What a spec needs of a calibration file (the file `archplace calibrate` writes has
/// more: residuals, cross-validation, provenance; see docs/calibration.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    pub format: String,
    pub format_version: u32,
    pub plugin: CalibratedPlugin,
    pub parameters: Vec<FittedParameter>,
    /// Factors of bootstrap refits, one list per draw in `parameters`' order: the
    /// parameters' joint uncertainty, which estimates and searches turn into intervals.
    #[serde(default)]
    pub draws: Vec<Vec<f64>>,
    /// Its errors over its measurements as `archplace calibrate` measured them (absent
    /// from a file made by hand): whether it helps, and how well the model explains what
    /// it was fitted on ([`Calibration::verdicts`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub errors: Option<CalibrationErrors>,
    /// Each parameter's bootstrap spread, in `parameters`' order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub uncertainty: Vec<FactorSpread>,
    /// Each measurement's residuals.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub measurement: Vec<MeasurementResidual>,
}

/// Mean and largest absolute relative error, in percent.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PercentError {
    pub mean_percent: f64,
    pub max_percent: f64,
}

/// A calibration's errors over all its measurements: the uncalibrated model's, fitted,
/// and each left out of the fit.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CalibrationErrors {
    pub uncalibrated: PercentError,
    pub in_sample: PercentError,
    pub leave_one_out: PercentError,
}

/// A parameter's bootstrap 5th and 95th percentiles, as factors of the specs' value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FactorSpread {
    pub parameter: String,
    pub factor_interval: [f64; 2],
}

/// One measurement's relative errors (predicted over measured, minus one), in percent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeasurementResidual {
    pub label: String,
    pub in_sample_percent: f64,
    pub leave_one_out_percent: f64,
}

/// Fitted, measurements still missed by more than this on average (in percent): the model
/// cannot explain them ([`Calibration::verdicts`]).
pub const UNEXPLAINED_PERCENT: f64 = 10.0;

/// A bootstrap 90% range wider than this factor (its 95th percentile over its 5th): the
/// measurements do not determine the parameter.
pub const UNDETERMINED_SPREAD: f64 = 2.0;

/// Whether a parameter's bootstrap 5th–95th percentiles (`[lo, hi]`, factors) span more
/// than [`UNDETERMINED_SPREAD`].
pub fn undetermined([lo, hi]: [f64; 2]) -> bool {
    lo > 0.0 && hi / lo > UNDETERMINED_SPREAD
}

impl Calibration {
    /// Reads and checks a calibration file (at most [`MAX_CALIBRATION_BYTES`]).
    pub fn read(path: &std::path::Path) -> Result<Calibration, CalibrationError> {
        let shown = path.display().to_string();
        let fail = |message: String| CalibrationError::Read {
            path: shown.clone(),
            message,
        };
        let bytes = archplace_util::files::read_regular(path, MAX_CALIBRATION_BYTES)
            .map_err(|e| fail(e.to_string()))?;
        let text = String::from_utf8(bytes).map_err(|_| fail("not UTF-8 text".into()))?;
        Calibration::parse(&text).map_err(fail)
    }

    /// A calibration from its TOML text, checked: this format, finite factors, every
    /// draw as long as the parameter list.
    pub fn parse(text: &str) -> Result<Calibration, String> {
        let c: Calibration = toml::from_str(text).map_err(|e| e.to_string())?;
        if c.format != FORMAT || c.format_version != FORMAT_VERSION {
            return Err(format!(
                "format `{}` version {}; this archplace reads `{FORMAT}` version {FORMAT_VERSION}",
                c.format, c.format_version
            ));
        }
        for p in &c.parameters {
            if !(p.factor.is_finite() && p.factor > 0.0) {
                return Err(format!(
                    "{}: factor {} is not positive",
                    p.parameter, p.factor
                ));
            }
        }
        if let Some(d) = c.draws.iter().find(|d| d.len() != c.parameters.len()) {
            return Err(format!(
                "a draw has {} factors for {} parameters",
                d.len(),
                c.parameters.len()
            ));
        }
        if c.draws
            .iter()
            .flatten()
            .any(|f| !(f.is_finite() && *f > 0.0))
        {
            return Err("a draw's factor is not positive".into());
        }
        Ok(c)
    }

    /// Refuses a calibration made for another latency plugin or version than `models`'.
    pub fn check(&self, path: &str, models: &CostModels) -> Result<(), CalibrationError> {
        let info = models.latency.info();
        if info.name != self.plugin.name || info.version != self.plugin.version {
            return Err(CalibrationError::OtherPlugin {
                path: path.into(),
                made_for: format!("{} {}", self.plugin.name, self.plugin.version),
                actual: format!("{} {}", info.name, info.version),
            });
        }
        Ok(())
    }

    /// The values `factors` (the fitted ones, or a draw's) give the parameters whose
    /// values in a spec are `base`: each base times its factor, within its bounds.
    pub fn values(
        &self,
        base: &BTreeMap<ParameterRef, f64>,
        factors: &[f64],
    ) -> Result<Vec<(ParameterRef, f64)>, CalibrationError> {
        self.parameters
            .iter()
            .zip(factors)
            .map(|(p, f)| {
                let b = base.get(&p.parameter).ok_or_else(|| {
                    CalibrationError::Parameter(format!(
                        "the calibration fits {}, which this spec's latency model does not declare",
                        p.parameter
                    ))
                })?;
                Ok((p.parameter.clone(), (b * f).clamp(p.lower, p.upper)))
            })
            .collect()
    }

    /// The units of its parameters, for [`with_values`].
    pub fn units(&self) -> BTreeMap<ParameterRef, String> {
        self.parameters
            .iter()
            .map(|p| (p.parameter.clone(), p.unit.clone()))
            .collect()
    }

    /// The factors fitted.
    pub fn factors(&self) -> Vec<f64> {
        self.parameters.iter().map(|p| p.factor).collect()
    }

    /// What a user of the calibration must know before trusting it, from the errors and
    /// spreads `archplace calibrate` recorded: that it does not help (left out of the fit,
    /// measurements are predicted no better than by the uncalibrated model); that the
    /// model cannot explain its measurements (fitted, they still miss by more than
    /// [`UNEXPLAINED_PERCENT`] on average; the worst named); each parameter the
    /// measurements do not determine ([`undetermined`]). Empty for a file without them.
    pub fn verdicts(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(e) = self.errors {
            let (l, u) = (e.leave_one_out, e.uncalibrated);
            if l.mean_percent >= u.mean_percent {
                out.push(format!(
                    "the calibration does not help: left out of the fit, its measurements are predicted within {:.1}% on average ({:.1}% at most), by the uncalibrated model within {:.1}% ({:.1}%); estimates with it are no better than without",
                    l.mean_percent, l.max_percent, u.mean_percent, u.max_percent
                ));
            }
            if e.in_sample.mean_percent > UNEXPLAINED_PERCENT {
                let mut worst: Vec<&MeasurementResidual> = self.measurement.iter().collect();
                worst.sort_by(|a, b| {
                    b.in_sample_percent
                        .abs()
                        .total_cmp(&a.in_sample_percent.abs())
                });
                let named: Vec<String> = worst
                    .iter()
                    .take(3)
                    .map(|m| format!("{} ({:+.1}%)", m.label, m.in_sample_percent))
                    .collect();
                out.push(format!(
                    "the model cannot explain these measurements: fitted, they are still missed by {:.1}% on average (over {UNEXPLAINED_PERCENT}%){}{}",
                    e.in_sample.mean_percent,
                    if named.is_empty() { "" } else { "; the worst: " },
                    named.join(", ")
                ));
            }
        }
        for s in self
            .uncertainty
            .iter()
            .filter(|s| undetermined(s.factor_interval))
        {
            out.push(format!(
                "{}: the measurements do not determine it (its bootstrap 90% range is {:.2}–{:.2} times the specs' value)",
                s.parameter, s.factor_interval[0], s.factor_interval[1]
            ));
        }
        out
    }
}

/// The spec and cost models with `calibration` applied (its fitted factors, or `factors`
/// when given): refused for another plugin or version.
pub fn apply(
    spec: &Spec,
    models: &CostModels,
    calibration: &Calibration,
    path: &str,
    factors: Option<&[f64]>,
    source: &dyn archplace_cost_port::CostModelSource,
) -> Result<(Spec, CostModels), CalibrationError> {
    calibration.check(path, models)?;
    let base = configured(spec, models.latency.as_ref());
    let fitted = calibration.factors();
    let values = calibration.values(&base, factors.unwrap_or(&fitted))?;
    let calibrated = with_values(spec, &values, &calibration.units())?;
    let models = crate::reresolve_cost_models(
        &calibrated,
        source,
        models,
        std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
    )
    .map_err(|d| {
        CalibrationError::Invalid(
            d.iter()
                .map(|d| d.message.clone())
                .collect::<Vec<_>>()
                .join("; "),
        )
    })?;
    Ok((calibrated, models))
}
