//! A spec with its calibration applied (`[cost_model] calibration`, or a file the command
//! line or the daemon names), as result files record it, and the step's interval from
//! the parameters' uncertainty.

use archplace_calibrate::interval::{self, Interval};
use archplace_cost_port::{CostModelSource, CostModels, ParameterRef};
use archplace_engine::step::estimate_step;
use archplace_spec::Spec;
use archplace_spec::calibration::{self, CalibratedPlugin, Calibration, CalibrationError};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// A calibration as applied to a spec: where it came from and the values it gave (as
/// `estimate --json` and `result.json` record it).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Applied {
    pub path: String,
    /// blake3 of the file.
    pub blake3: String,
    pub plugin: CalibratedPlugin,
    pub parameters: Vec<AppliedParameter>,
    /// Bootstrap draws it carries (the source of its intervals).
    pub draws: usize,
    /// What its own errors say against trusting it ([`Calibration::verdicts`]): it does
    /// not help, the model cannot explain its measurements, a parameter undetermined.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// The calibration itself (not recorded: its hash is).
    #[serde(skip)]
    pub calibration: Option<Calibration>,
}

/// One calibrated parameter: its factor and the value it gave in this spec.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AppliedParameter {
    pub parameter: ParameterRef,
    pub factor: f64,
    pub value: f64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub unit: String,
}

/// The calibration file `spec` applies: `given` (the command line's, or the daemon's),
/// else `[cost_model] calibration` relative to the spec's folder.
pub fn file_of(spec: &Spec, given: Option<&Path>) -> Option<PathBuf> {
    given.map(Path::to_path_buf).or_else(|| {
        spec.cost_model.calibration.as_ref().map(|c| {
            Path::new(&spec.source_file)
                .parent()
                .unwrap_or(Path::new("."))
                .join(c)
        })
    })
}

/// Whether `spec` has a calibration to apply: [`file_of`]'s, else the shipped one its
/// software stack names for its GPUs (`Spec::stack_calibration`).
pub fn has_calibration(spec: &Spec, given: Option<&Path>) -> bool {
    file_of(spec, given).is_some() || spec.stack_calibration.is_some()
}

/// `spec` and `models` with the calibration of [`file_of`] applied, else the shipped one
/// the spec's stack names (unchanged without either): a file made for another latency
/// plugin or version is refused; a stack's calibration then does not apply (the stack's
/// other defaults still do).
pub fn apply(
    spec: Spec,
    models: CostModels,
    given: Option<&Path>,
    source: &dyn CostModelSource,
) -> Result<(Spec, CostModels, Option<Applied>), CalibrationError> {
    let (shown, text, from_stack) = match file_of(&spec, given) {
        Some(path) => {
            let shown = path.display().to_string();
            let bytes =
                archplace_util::files::read_regular(&path, calibration::MAX_CALIBRATION_BYTES)
                    .map_err(|e| CalibrationError::Read {
                        path: shown.clone(),
                        message: e.to_string(),
                    })?;
            let text = String::from_utf8(bytes).map_err(|_| CalibrationError::Read {
                path: shown.clone(),
                message: "not UTF-8 text".into(),
            })?;
            (shown, text, false)
        }
        None => {
            let Some(name) = spec.stack_calibration.as_deref() else {
                return Ok((spec, models, None));
            };
            let text = archplace_spec::stack::shipped_calibration(name).ok_or_else(|| {
                CalibrationError::Read {
                    path: name.into(),
                    message: "no shipped calibration of that name".into(),
                }
            })?;
            let stack = spec.stack.as_deref().unwrap_or_default();
            (format!("{name} (stack {stack})"), text.to_string(), true)
        }
    };
    let cal = Calibration::parse(&text).map_err(|message| CalibrationError::Read {
        path: shown.clone(),
        message,
    })?;
    if from_stack && let Err(why) = cal.check(&shown, &models) {
        tracing::info!(calibration = %shown, %why, "the stack's calibration does not apply");
        return Ok((spec, models, None));
    }
    let base = calibration::configured(&spec, models.latency.as_ref());
    let (calibrated, calibrated_models) =
        calibration::apply(&spec, &models, &cal, &shown, None, source)?;
    let values = cal.values(&base, &cal.factors())?;
    let parameters = cal
        .parameters
        .iter()
        .zip(values)
        .map(|(p, (_, value))| AppliedParameter {
            parameter: p.parameter.clone(),
            factor: p.factor,
            value,
            unit: p.unit.clone(),
        })
        .collect();
    tracing::info!(calibration = %shown, "applied the calibration");
    let warnings = cal.verdicts();
    for w in &warnings {
        tracing::warn!(calibration = %shown, "{w}");
    }
    let applied = Applied {
        warnings,
        path: shown,
        blake3: blake3::hash(text.as_bytes()).to_hex().to_string(),
        plugin: cal.plugin.clone(),
        parameters,
        draws: cal.draws.len(),
        calibration: Some(cal),
    };
    Ok((calibrated, calibrated_models, Some(applied)))
}

/// The step's interval: its time and throughput per device under the draws.
#[derive(Debug, Clone, Serialize)]
pub struct StepInterval {
    pub step_seconds: Interval,
    pub tokens_per_second_per_device: Interval,
    /// Draws taken (through the linearised step, `archplace_calibrate::interval`).
    pub draws: usize,
    /// Exact estimates made besides the point estimate: one per parameter that varies
    /// over the draws, and the two ends.
    pub evaluations: usize,
    /// The interval's coverage: 0.9 (5th to 95th percentile).
    pub level: f64,
    /// Where the uncertainty comes from: `calibration` (its parameters' bootstrap),
    /// `ranges` (the spec's), `model error` (the calibration's leave-one-out residuals,
    /// [`interval::model_errors`]).
    pub from: Vec<&'static str>,
}

/// The step of `spec` and its interval: `point` (the step itself, from `spec` as
/// calibrated) runs on the calling thread while the interval's exact points are evaluated
/// on others, and gives with its result the step's seconds and tokens per second per
/// device (none: the plan cannot run, and there is no interval). The interval is that of the step of
/// `spec` (as written; `models` its cost models) under the calibration's draws and the
/// spec's declared ranges; `None` when nothing is uncertain. A declared range the latency
/// model cannot take is an error only when the step can be made.
pub fn step_with_interval<R>(
    spec: &Spec,
    models: &CostModels,
    applied: Option<&Applied>,
    source: &dyn CostModelSource,
    scheduling: archplace_spec::Scheduling,
    point: impl FnOnce() -> (R, Option<(f64, f64)>),
) -> Result<(R, Option<StepInterval>), CalibrationError> {
    let cal = applied.and_then(|a| a.calibration.as_ref());
    let prepared = interval::draws(spec, models, cal, interval::DRAWS).and_then(|draws| {
        let center = match draws.first() {
            Some(first) => center_of(spec, models, cal, first)?,
            None => Vec::new(),
        };
        Ok((draws, center))
    });
    let (draws, center) = match prepared {
        Ok(p) => p,
        Err(e) => {
            let (r, step) = point();
            return match step {
                Some(_) => Err(e),
                None => Ok((r, None)),
            };
        }
    };
    if draws.is_empty() {
        // Nothing is uncertain: the step alone.
        return Ok((point().0, None));
    }
    let seconds = interval::with_answer(spec, models, source, |s, m| {
        let input = s.step_input(scheduling).ok()?;
        estimate_step(&input, m.latency.as_ref())
            .ok()
            .map(|r| r.step_seconds)
    });
    let ((r, step, model_error), propagated) =
        interval::propagate(&center, &draws, &seconds, || {
            let (r, step) = point();
            let at_center = step.map(|(seconds, _)| seconds);
            let errors = match (cal, at_center) {
                (Some(c), Some(_)) => interval::model_errors(c, draws.len()),
                _ => Vec::new(),
            };
            ((r, step, !errors.is_empty()), at_center, errors)
        });
    let (Some(p), Some((step_seconds, tokens_per_second))) = (propagated, step) else {
        return Ok((r, None));
    };
    // Tokens per step do not depend on the parameters: throughput is inverse to time.
    let tokens_per_device = tokens_per_second * step_seconds;
    let interval = StepInterval {
        step_seconds: p.interval,
        tokens_per_second_per_device: Interval {
            lower: tokens_per_device / p.interval.upper,
            upper: tokens_per_device / p.interval.lower,
        },
        draws: p.draws,
        evaluations: p.evaluations,
        level: 0.9,
        from: {
            let mut from = uncertain_from(spec, cal);
            if model_error {
                from.push("model error");
            }
            from
        },
    };
    Ok((r, Some(interval)))
}

/// Where a spec's uncertainty comes from: its calibration's draws, its declared ranges.
fn uncertain_from(spec: &Spec, cal: Option<&Calibration>) -> Vec<&'static str> {
    let mut from = Vec::new();
    if cal.is_some_and(|c| !c.draws.is_empty()) {
        from.push("calibration");
    }
    if !spec.cost_model.uncertainty.is_empty() {
        from.push("ranges");
    }
    from
}

/// The point estimate's values of the parameters that `first` (a draw) names: the
/// calibration's fitted values, else the spec's own.
fn center_of(
    spec: &Spec,
    models: &CostModels,
    cal: Option<&Calibration>,
    first: &[(ParameterRef, f64)],
) -> Result<Vec<(ParameterRef, f64)>, CalibrationError> {
    let base = calibration::configured(spec, models.latency.as_ref());
    let fitted: Vec<(ParameterRef, f64)> = match cal {
        Some(c) => c.values(&base, &c.factors())?,
        None => Vec::new(),
    };
    Ok(first
        .iter()
        .map(|(p, _)| {
            let v = interval::value_of(&fitted, p)
                .or_else(|| base.get(p).copied())
                .unwrap_or(1.0);
            (p.clone(), v)
        })
        .collect())
}

/// What the parameters' uncertainty does to a search's answer (`result.json`'s
/// `uncertainty`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SearchUncertainty {
    /// Where it comes from: `calibration`, `ranges` or both.
    pub from: Vec<String>,
    /// Parameter draws (through each chip's linearised throughput).
    pub draws: usize,
    /// The intervals' coverage: 0.9 (5th to 95th percentile).
    pub level: f64,
    /// The search's best chips, best first: each one's mean throughput, its interval and
    /// the share of draws in which it is the best of them.
    pub chips: Vec<ChipOdds>,
    /// The chip best in the most draws, when it is not the search's best.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub most_often_best: Option<crate::lines::Configuration>,
    /// Candidate evaluations made for it (each chip's placement under other values).
    pub evaluations: usize,
    pub seconds: f64,
}

/// One of the best chips under the parameters' uncertainty.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChipOdds {
    pub configuration: crate::lines::Configuration,
    pub mean_throughput_samples_per_second: f64,
    /// 5th and 95th percentile of its mean throughput over the draws (exact evaluations
    /// at the draws that sit there).
    pub throughput_interval: [f64; 2],
    /// The share of draws in which it has the highest mean throughput of these chips
    /// (ties to the smaller chip, as the search's).
    pub best_probability: f64,
}

/// How many of the search's best chips the uncertainty is reported for.
pub const CHIPS: usize = 5;

/// The uncertainty of a finished search of `spec` (as written; `models` its cost models):
/// for its best few chips, their throughput intervals and the probability that each is
/// the best, under the calibration's draws and the spec's ranges. Each chip's mean
/// throughput is linearised in the parameters that vary (one evaluation of the chips per
/// parameter — schedules and placements the chip's own, made again under the values), the
/// draws run through that, and each chip's interval ends are evaluated exactly. `None`
/// when nothing is uncertain or no chip could train.
pub fn search_uncertainty(
    spec: &Spec,
    models: &CostModels,
    applied: Option<&Applied>,
    source: &dyn CostModelSource,
    outcome: &archplace_engine::search::Outcome,
    space: &archplace_engine::space::Space,
) -> Result<Option<SearchUncertainty>, CalibrationError> {
    let started = std::time::Instant::now();
    let cal = applied.and_then(|a| a.calibration.as_ref());
    let draws = interval::draws(spec, models, cal, interval::DRAWS)?;
    let Some(first) = draws.first() else {
        return Ok(None);
    };
    let center = center_of(spec, models, cal, first)?;
    let top = best_chips(outcome);
    if top.is_empty() {
        return Ok(None);
    }
    let units = interval::units(models);
    // Each of `chips`' mean throughput with the parameters at `values`.
    let evaluate = |values: &[(ParameterRef, f64)], chips: &[usize]| -> Vec<Option<f64>> {
        let Ok(s) = calibration::with_values(spec, values, &units) else {
            return vec![None; chips.len()];
        };
        let Ok(m) = archplace_spec::reresolve_cost_models(&s, source, models, Default::default())
        else {
            return vec![None; chips.len()];
        };
        let input = s.search_input();
        let evaluator = archplace_engine::search::Evaluator::new(&input, m.latency.as_ref(), &());
        chips
            .iter()
            .map(|&k| {
                let e = top[k];
                let candidate = space.candidates.get(e.index)?;
                evaluator
                    .evaluate(e.index, candidate)
                    .ok()?
                    .mean_throughput_samples_per_second
            })
            .collect()
    };
    let all: Vec<usize> = (0..top.len()).collect();
    let varying = interval::varying(&center, &draws);
    let moved = interval::moved(&center, &varying);
    let per_parameter = archplace_calibrate::parallel::map(&moved, |v| evaluate(v, &all));
    let mut evaluations = moved.len() * top.len();
    // Each chip's log throughput, linearised at the search's own.
    let base: Vec<f64> = top
        .iter()
        .map(|e| e.mean_throughput_samples_per_second.unwrap_or(0.0))
        .collect();
    let linear: Vec<interval::Linearised> = (0..top.len())
        .map(|k| {
            let at_moved: Vec<Option<f64>> = per_parameter.iter().map(|thr| thr[k]).collect();
            interval::Linearised::new(&center, &varying, base[k], &at_moved)
        })
        .collect();
    let (wins, mut per_chip) = tally(draws.len(), top.len(), |n, k| linear[k].log_at(&draws[n]));
    // Each chip's interval: the draws at its 5th and 95th percentile, evaluated exactly.
    let ends: Vec<(usize, Vec<(ParameterRef, f64)>)> = per_chip
        .iter_mut()
        .enumerate()
        .flat_map(|(k, v)| {
            v.sort_by(|a, b| a.0.total_cmp(&b.0));
            let at = |q: f64| v[interval::quantile_position(v.len(), q)].1;
            [(k, draws[at(0.05)].clone()), (k, draws[at(0.95)].clone())]
        })
        .collect();
    let exact = archplace_calibrate::parallel::map(&ends, |(k, v)| evaluate(v, &[*k])[0]);
    evaluations += ends.len();
    let chips: Vec<ChipOdds> = top
        .iter()
        .enumerate()
        .map(|(k, e)| {
            let (a, b) = (exact[2 * k], exact[2 * k + 1]);
            let (a, b) = (a.unwrap_or(base[k]), b.unwrap_or(base[k]));
            ChipOdds {
                configuration: crate::lines::Configuration::new(&e.config, e.area_um2),
                mean_throughput_samples_per_second: base[k],
                throughput_interval: [a.min(b), a.max(b)],
                best_probability: wins[k] as f64 / draws.len() as f64,
            }
        })
        .collect();
    let most = (0..top.len())
        .max_by(|&a, &b| wins[a].cmp(&wins[b]).then(b.cmp(&a)))
        .unwrap_or(0);
    Ok(Some(SearchUncertainty {
        from: uncertain_from(spec, cal)
            .into_iter()
            .map(String::from)
            .collect(),
        draws: draws.len(),
        level: 0.9,
        most_often_best: (most != 0).then(|| chips[most].configuration.clone()),
        chips,
        evaluations,
        seconds: started.elapsed().as_secs_f64(),
    }))
}

/// Under each of `draws` draws, which of `chips` chips has the highest `score(draw,
/// chip)` (equal scores: the earlier, the smaller chip), and each chip's scores with their
/// draws.
#[allow(clippy::type_complexity)]
fn tally(
    draws: usize,
    chips: usize,
    score: impl Fn(usize, usize) -> f64,
) -> (Vec<usize>, Vec<Vec<(f64, usize)>>) {
    let mut wins = vec![0usize; chips];
    let mut per_chip: Vec<Vec<(f64, usize)>> = vec![Vec::with_capacity(draws); chips];
    for n in 0..draws {
        let scores: Vec<f64> = (0..chips).map(|k| score(n, k)).collect();
        let best = (0..chips)
            .max_by(|&a, &b| scores[a].total_cmp(&scores[b]).then(b.cmp(&a)))
            .unwrap_or(0);
        wins[best] += 1;
        for (k, s) in scores.iter().enumerate() {
            per_chip[k].push((*s, n));
        }
    }
    (wins, per_chip)
}

/// The search's best chips that could train, best first (equal throughput: the smaller,
/// then visit order), at most [`CHIPS`].
fn best_chips(
    outcome: &archplace_engine::search::Outcome,
) -> Vec<&archplace_engine::search::Evaluated> {
    let mut top: Vec<&archplace_engine::search::Evaluated> = outcome
        .explored
        .iter()
        .filter(|e| {
            e.mean_throughput_samples_per_second
                .is_some_and(|t| t > 0.0)
        })
        .collect();
    top.sort_by(|a, b| {
        b.mean_throughput_samples_per_second
            .unwrap_or(0.0)
            .total_cmp(&a.mean_throughput_samples_per_second.unwrap_or(0.0))
            .then(a.area_um2.total_cmp(&b.area_um2))
            .then(a.index.cmp(&b.index))
    });
    top.truncate(CHIPS);
    top
}

/// The search's uncertainty in a few lines: each best chip's throughput, interval and
/// probability of being the best, and the chip best most often when it is not the
/// search's.
pub fn render_search(u: &SearchUncertainty) -> String {
    let mut out = format!(
        "uncertainty ({:.0}% intervals, {} draws from {}; {} evaluations, {:.1} s):\n",
        100.0 * u.level,
        u.draws,
        u.from.join(" and "),
        u.evaluations,
        u.seconds
    );
    for c in &u.chips {
        out.push_str(&format!(
            "  {:<44} {:.4} samples/s ({:.4} to {:.4}), best in {:.0}% of draws\n",
            crate::chip::short(&c.configuration.chip),
            c.mean_throughput_samples_per_second,
            c.throughput_interval[0],
            c.throughput_interval[1],
            100.0 * c.best_probability
        ));
    }
    if let Some(m) = &u.most_often_best {
        out.push_str(&format!(
            "  best in the most draws: {} — not the search's best at the point estimate\n",
            crate::chip::short(&m.chip)
        ));
    }
    out
}
