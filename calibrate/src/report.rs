//! The calibration file: what a spec needs to apply it (`archplace_spec::calibration::
//! Calibration`: plugin, factors, bootstrap draws) and what a user needs to trust it —
//! each parameter's fitted value on each setting it was fitted on and its uncertainty,
//! every measurement's residual uncalibrated, fitted, left out and predicted from the
//! other sources, the errors per source, what the data could not determine, and the
//! provenance.

use crate::fit::Fit;
use crate::problem::Problem;
use archplace_spec::calibration::{CalibratedPlugin, FORMAT, FORMAT_VERSION, FittedParameter};
use serde::Serialize;
use std::path::Path;

/// A calibration file as `archplace calibrate` writes it (TOML).
#[derive(Debug, Clone, Serialize)]
pub struct CalibrationFile {
    pub format: String,
    pub format_version: u32,
    pub plugin: CalibratedPlugin,
    pub parameters: Vec<FittedParameter>,
    /// Factors of the bootstrap refits, one list per refit in `parameters`' order.
    pub draws: Vec<Vec<f64>>,
    pub uncertainty: Vec<Uncertainty>,
    pub fit: FitSummary,
    pub errors: Errors,
    pub source: Vec<SourceErrors>,
    pub measurement: Vec<Residual>,
    pub provenance: Provenance,
}

/// A parameter's fitted value(s) and uncertainty.
#[derive(Debug, Clone, Serialize)]
pub struct Uncertainty {
    pub parameter: String,
    /// The bootstrap's standard deviation of the factor.
    pub factor_sd: f64,
    /// The bootstrap's 5th and 95th percentiles of the factor.
    pub factor_interval: [f64; 2],
    /// The value before and after, for each distinct value the measurements' specs had
    /// (one per GPU preset, say), in the parameter's unit.
    pub values: Vec<[f64; 2]>,
    pub unit: String,
}

/// How the fit went.
#[derive(Debug, Clone, Serialize)]
pub struct FitSummary {
    pub robust_scale: f64,
    pub loss: f64,
    pub iterations: u32,
    /// Exact evaluations of one measurement (fit, folds and their predictions).
    pub evaluations: u64,
    pub bootstrap: u32,
    pub seed: u64,
    /// What the measurements could not determine.
    pub warnings: Vec<String>,
}

/// Mean and largest absolute relative error, in percent.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Error {
    pub mean_percent: f64,
    pub max_percent: f64,
}

/// Errors over a set of measurements (all, or one source's): each of the four ways of
/// predicting them.
#[derive(Debug, Clone, Serialize)]
pub struct Errors {
    pub measurements: usize,
    pub uncalibrated: Error,
    pub in_sample: Error,
    pub leave_one_out: Error,
    /// Each measurement left out and predicted from its own source's others (absent when
    /// every source has one measurement).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leave_one_out_within_source: Option<Error>,
    /// Each source predicted from the others only (absent with one source).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub other_sources: Option<Error>,
}

/// Errors of one source's measurements.
#[derive(Debug, Clone, Serialize)]
pub struct SourceErrors {
    pub name: String,
    #[serde(flatten)]
    pub errors: Errors,
}

/// One measurement's predictions, as relative errors in percent (predicted over measured,
/// minus one).
#[derive(Debug, Clone, Serialize)]
pub struct Residual {
    pub source: String,
    pub label: String,
    pub measured_seconds: f64,
    pub uncalibrated_percent: f64,
    pub in_sample_percent: f64,
    pub leave_one_out_percent: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leave_one_out_within_source_percent: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub other_sources_percent: Option<f64>,
}

/// Where the calibration came from.
#[derive(Debug, Clone, Serialize)]
pub struct Provenance {
    /// blake3 of the measurements file and every spec it names.
    pub measurements_blake3: String,
    pub measurements_file: String,
    pub archplace_version: String,
    /// When it was made (UTC, RFC 3339), as the caller says.
    pub date: String,
}

/// Relative error in percent of a log ratio.
fn percent(r: f64) -> f64 {
    100.0 * (r.exp() - 1.0)
}

fn error_of(residuals: impl Iterator<Item = f64>) -> Option<Error> {
    let e: Vec<f64> = residuals
        .filter(|r| r.is_finite())
        .map(|r| percent(r).abs())
        .collect();
    (!e.is_empty()).then(|| Error {
        mean_percent: e.iter().sum::<f64>() / e.len() as f64,
        max_percent: e.iter().copied().fold(0.0, f64::max),
    })
}

const NONE: Error = Error {
    mean_percent: f64::NAN,
    max_percent: f64::NAN,
};

impl CalibrationFile {
    /// The file for `fit` of `problem`.
    pub fn new(
        problem: &Problem<'_>,
        fit: &Fit,
        options: crate::fit::Options,
        provenance: Provenance,
    ) -> Self {
        let parameters: Vec<FittedParameter> = problem
            .parameters
            .iter()
            .zip(&fit.factors)
            .map(|(p, f)| FittedParameter {
                parameter: p.parameter.clone(),
                unit: p.unit.clone(),
                factor: *f,
                lower: p.lower,
                upper: p.upper,
            })
            .collect();
        let uncertainty = problem
            .parameters
            .iter()
            .zip(&fit.factors)
            .zip(&fit.spread)
            .map(|((p, f), (sd, interval))| {
                let mut bases: Vec<f64> = problem
                    .base
                    .iter()
                    .filter_map(|b| b.get(&p.parameter).copied())
                    .collect();
                bases.sort_by(f64::total_cmp);
                bases.dedup_by(|a, b| (*a - *b).abs() <= 1e-12 * b.abs().max(1.0));
                Uncertainty {
                    parameter: p.parameter.to_string(),
                    factor_sd: *sd,
                    factor_interval: *interval,
                    values: bases
                        .iter()
                        .map(|b| [*b, (b * f).clamp(p.lower, p.upper)])
                        .collect(),
                    unit: p.unit.clone(),
                }
            })
            .collect();
        let ms = problem.measurements;
        let rows = |keep: &dyn Fn(usize) -> bool| -> Vec<usize> {
            (0..ms.len()).filter(|&i| keep(i)).collect()
        };
        let errors_of = |idx: &[usize]| {
            let pick = |v: &Vec<f64>| idx.iter().map(|&i| v[i]).collect::<Vec<f64>>();
            Errors {
                measurements: idx.len(),
                uncalibrated: error_of(pick(&fit.uncalibrated).into_iter()).unwrap_or(NONE),
                in_sample: error_of(pick(&fit.in_sample).into_iter()).unwrap_or(NONE),
                leave_one_out: error_of(pick(&fit.leave_one_out).into_iter()).unwrap_or(NONE),
                leave_one_out_within_source: error_of(pick(&fit.within_source).into_iter()),
                other_sources: error_of(pick(&fit.other_sources).into_iter()),
            }
        };
        let all = rows(&|_| true);
        let mut names: Vec<&str> = ms.iter().map(|m| m.source.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        let source = names
            .iter()
            .map(|name| SourceErrors {
                name: name.to_string(),
                errors: errors_of(&rows(&|i| ms[i].source == *name)),
            })
            .collect();
        let measurement = ms
            .iter()
            .enumerate()
            .map(|(k, m)| Residual {
                source: m.source.clone(),
                label: m.label.clone(),
                measured_seconds: problem.measured_seconds[k],
                uncalibrated_percent: percent(fit.uncalibrated[k]),
                in_sample_percent: percent(fit.in_sample[k]),
                leave_one_out_percent: percent(fit.leave_one_out[k]),
                leave_one_out_within_source_percent: fit.within_source[k]
                    .is_finite()
                    .then(|| percent(fit.within_source[k])),
                other_sources_percent: fit.other_sources[k]
                    .is_finite()
                    .then(|| percent(fit.other_sources[k])),
            })
            .collect();
        CalibrationFile {
            format: FORMAT.into(),
            format_version: FORMAT_VERSION,
            plugin: CalibratedPlugin {
                name: problem.plugin.0.clone(),
                version: problem.plugin.1.clone(),
                blake3: problem.plugin.2.clone(),
            },
            parameters,
            draws: fit.draws.clone(),
            uncertainty,
            fit: FitSummary {
                robust_scale: options.robust_scale,
                loss: fit.loss,
                iterations: fit.iterations,
                evaluations: fit.evaluations,
                bootstrap: options.bootstrap,
                seed: options.seed,
                warnings: fit.warnings.clone(),
            },
            errors: errors_of(&all),
            source,
            measurement,
            provenance,
        }
    }

    /// The file's TOML text, with a header saying what it is.
    pub fn to_toml(&self) -> Result<String, toml::ser::Error> {
        let body = toml::to_string(self)?;
        Ok(format!(
            "# A calibration made by `archplace calibrate` ({}): the factors that multiply\n# the parameters of `{}` {} (and of the cluster) in the specs it is applied to.\n# Apply it with `[cost_model] calibration = \"FILE\"` or `--calibration FILE`.\n{body}",
            self.provenance.measurements_file, self.plugin.name, self.plugin.version
        ))
    }
}

/// The calibration in words and as a summary (the CLI prints them; the Python package
/// returns them).
impl CalibrationFile {
    /// `calibrate --json`'s summary of the calibration written to `out`: the plugin, each
    /// factor and its interval, the errors overall and per source, the fit's warnings.
    pub fn summary(&self, out: &Path) -> serde_json::Value {
        let f = self;
        serde_json::json!({
            "calibration": out.display().to_string(),
            "plugin": f.plugin,
            "parameters": f.parameters,
            "uncertainty": f.uncertainty,
            "errors": f.errors,
            "source": f.source,
            "warnings": f.fit.warnings,
        })
    }

    /// The calibration in words, as `archplace calibrate` prints it: each factor with its
    /// interval and the values it gives, then the errors per source and overall
    /// (uncalibrated, in-sample, leave-one-out, within and across sources), then warnings.
    pub fn render(&self) -> String {
        let f = self;
        let mut s = format!(
            "calibration of `{}` {} on {} measurements\n\nparameter                               factor   5–95%            values (before → after)\n",
            f.plugin.name, f.plugin.version, f.errors.measurements
        );
        for (p, u) in f.parameters.iter().zip(&f.uncertainty) {
            let values: Vec<String> = u
                .values
                .iter()
                .map(|[a, b]| format!("{a:.4} → {b:.4}"))
                .collect();
            s.push_str(&format!(
                "{:<38} {:7.4}  {:.3}–{:.3}    {}{}\n",
                p.parameter.to_string(),
                p.factor,
                u.factor_interval[0],
                u.factor_interval[1],
                values.join(", "),
                if u.unit.is_empty() {
                    String::new()
                } else {
                    format!(" {}", u.unit)
                }
            ));
        }
        s.push_str(
        "\nmean (largest) absolute error               runs  uncalibrated    in-sample       leave-one-out   within source   other sources\n",
    );
        let row = |name: &str, n: usize, u, i, l, w: Option<Error>, o: Option<Error>| {
            format!(
                "{:<44} {:>3}  {}  {}  {}  {}  {}\n",
                name.chars().take(44).collect::<String>(),
                n,
                pct(u),
                pct(i),
                pct(l),
                w.as_ref().map_or("     —       ".into(), pct),
                o.as_ref().map_or("     —       ".into(), pct)
            )
        };
        for (name, e) in f
            .source
            .iter()
            .map(|s| (s.name.as_str(), &s.errors))
            .chain([("all", &f.errors)])
        {
            s.push_str(&row(
                name,
                e.measurements,
                &e.uncalibrated,
                &e.in_sample,
                &e.leave_one_out,
                e.leave_one_out_within_source,
                e.other_sources,
            ));
        }
        for w in &f.fit.warnings {
            s.push_str(&format!("warning: {w}\n"));
        }
        s
    }
}

/// An error as `mean (largest)` percent, a dash when there is none.
fn pct(e: &Error) -> String {
    if e.mean_percent.is_finite() {
        format!("{:5.1}% ({:4.1}%)", e.mean_percent, e.max_percent)
    } else {
        "     —       ".into()
    }
}
