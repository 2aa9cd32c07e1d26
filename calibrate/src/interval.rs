//! Error bars: the parameters' uncertainty carried to an answer by Monte Carlo. A draw is
//! one bootstrap refit of the calibration (its factors, so the parameters' correlations
//! are kept) with, for each range the spec declares (`[cost_model.uncertainty.*]`), a
//! value drawn uniformly from it. Draws come from a fixed seed: the same spec and
//! calibration give the same interval.
//!
//! An answer is a whole estimate, milliseconds each, so [`propagate`] does not recompute
//! it under every draw: it linearises the answer's logarithm in the parameters' logarithms
//! at the point estimate (one exact evaluation per parameter that varies), runs the many
//! draws through that, and evaluates exactly the two draws at the 5th and 95th percentile
//! of the linearised answer — the interval's ends are exact answers, and only which draws
//! sit at the percentiles comes from the linearisation.

use crate::fit::{SplitMix, quantile};
use archplace_cost_port::{CostModelSource, CostModels, ParameterRef};
use archplace_spec::Spec;
use archplace_spec::calibration::{
    Calibration, CalibrationError, configured, declared, with_values,
};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// How many draws an interval takes (through the linearised answer: they cost
/// microseconds).
pub const DRAWS: usize = 1000;
/// The seed of the draws.
pub const SEED: u64 = 0x5eed;

/// The parameter values of `draws` draws for `spec` (whose models are `models`, with
/// `calibration` applied if any): empty when there is nothing uncertain (no calibration
/// draws, no declared ranges).
pub fn draws(
    spec: &Spec,
    models: &CostModels,
    calibration: Option<&Calibration>,
    draws: usize,
) -> Result<Vec<Vec<(ParameterRef, f64)>>, CalibrationError> {
    let ranges = &spec.cost_model.uncertainty;
    let cal_draws = calibration.map_or(&[][..], |c| c.draws.as_slice());
    if ranges.is_empty() && cal_draws.is_empty() {
        return Ok(Vec::new());
    }
    let info = models.latency.info();
    let declared = declared(&info);
    for r in ranges {
        let Some((_, d)) = declared.iter().find(|(p, _)| *p == r.parameter) else {
            return Err(CalibrationError::Parameter(format!(
                "[cost_model.uncertainty] {}: `{}` {} declares no calibratable parameter `{}` (its ranges can be given for: {})",
                r.parameter,
                info.name,
                info.version,
                r.parameter.name,
                declared
                    .iter()
                    .map(|(p, _)| p.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        };
        if r.unit != d.unit || r.lower < d.lower || r.upper > d.upper {
            return Err(CalibrationError::Parameter(format!(
                "[cost_model.uncertainty] {}: give the range in {} within [{}, {}] (got {} to {} {})",
                r.parameter,
                if d.unit.is_empty() {
                    "plain numbers".to_string()
                } else {
                    format!("`{}`", d.unit)
                },
                d.lower,
                d.upper,
                r.lower,
                r.upper,
                r.unit
            )));
        }
    }
    let base = configured(spec, models.latency.as_ref());
    // Draw `k` takes the calibration's draw `k mod n` (its fitted factors when it kept
    // none): each of those `n` turned into values once, not once per draw — `estimate`
    // makes an interval on every call, and its whole process is held to milliseconds.
    let from_calibration: Vec<BTreeMap<ParameterRef, f64>> = match calibration {
        Some(c) if c.draws.is_empty() => vec![c.values(&base, &c.factors())?.into_iter().collect()],
        Some(c) => c
            .draws
            .iter()
            .map(|factors| Ok(c.values(&base, factors)?.into_iter().collect()))
            .collect::<Result<_, CalibrationError>>()?,
        None => vec![BTreeMap::new()],
    };
    let mut rng = SplitMix(SEED);
    Ok((0..draws)
        .map(|k| {
            let mut values = from_calibration[k % from_calibration.len()].clone();
            for r in ranges {
                values.insert(
                    r.parameter.clone(),
                    r.lower + rng.unit() * (r.upper - r.lower),
                );
            }
            values.into_iter().collect()
        })
        .collect())
}

/// The units of every declared parameter of `models`' latency plugin and the cluster.
pub fn units(models: &CostModels) -> BTreeMap<ParameterRef, String> {
    declared(&models.latency.info())
        .into_iter()
        .map(|(p, c)| (p, c.unit))
        .collect()
}

/// An interval of an answer: the 5th and 95th percentiles over the draws.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Interval {
    pub lower: f64,
    pub upper: f64,
}

impl Interval {
    /// The 5th to 95th percentile of `values` (NaNs left out); `None` when empty.
    pub fn of(values: &[f64]) -> Option<Interval> {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        Some(Interval {
            lower: quantile(&v, 0.05),
            upper: quantile(&v, 0.95),
        })
    }
}

/// A positive answer (a step's seconds) at a list of parameter values; `None` when it
/// cannot be made.
pub type Answer<'a> = dyn Fn(&[(ParameterRef, f64)]) -> Option<f64> + Sync + 'a;

/// An interval of an answer, with what it cost.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Propagated {
    pub interval: Interval,
    /// Exact evaluations made.
    pub evaluations: usize,
    /// Draws run through the linearised answer.
    pub draws: usize,
}

/// How far (in log) each varying parameter is moved to measure an answer's slope.
pub const STEP: f64 = 0.05;

/// The value `values` gives parameter `p`.
pub fn value_of(values: &[(ParameterRef, f64)], p: &ParameterRef) -> Option<f64> {
    values.iter().find(|(q, _)| q == p).map(|(_, x)| *x)
}

/// The positions in `center` of the parameters that vary over `draws` (a calibration's
/// inert ones do not; a parameter at 0 cannot be moved in log).
pub fn varying(center: &[(ParameterRef, f64)], draws: &[Vec<(ParameterRef, f64)>]) -> Vec<usize> {
    (0..center.len())
        .filter(|&i| {
            let (p, c) = &center[i];
            *c > 0.0
                && draws
                    .iter()
                    .any(|d| value_of(d, p).is_some_and(|x| (x / c - 1.0).abs() > 1e-9))
        })
        .collect()
}

/// `center` with each of the `varying` parameters in turn moved by [`STEP`]: where an
/// answer is evaluated to linearise it.
pub fn moved(center: &[(ParameterRef, f64)], varying: &[usize]) -> Vec<Vec<(ParameterRef, f64)>> {
    varying
        .iter()
        .map(|&i| {
            let mut v = center.to_vec();
            v[i].1 *= STEP.exp();
            v
        })
        .collect()
}

/// The logarithm of a positive answer linearised in the logarithms of the parameters that
/// vary, at the point estimate: what many draws run through instead of the whole model.
#[derive(Debug, Clone)]
pub struct Linearised {
    /// Each varying parameter with its point-estimate value.
    at: Vec<(ParameterRef, f64)>,
    slopes: Vec<f64>,
    log_center: f64,
}

impl Linearised {
    /// The answer `at_center` at `center`, and `at_moved` at each of [`moved`]'s points
    /// (in order; a failed one counts as no slope).
    pub fn new(
        center: &[(ParameterRef, f64)],
        varying: &[usize],
        at_center: f64,
        at_moved: &[Option<f64>],
    ) -> Linearised {
        Linearised {
            at: varying.iter().map(|&i| center[i].clone()).collect(),
            slopes: at_moved
                .iter()
                .map(|t| t.map_or(0.0, |t| (t.max(1e-300) / at_center).ln() / STEP))
                .collect(),
            log_center: at_center.ln(),
        }
    }

    /// The linearised log answer at `draw`.
    pub fn log_at(&self, draw: &[(ParameterRef, f64)]) -> f64 {
        self.log_center
            + self
                .at
                .iter()
                .zip(&self.slopes)
                .map(|((p, c), s)| s * (value_of(draw, p).unwrap_or(*c).max(1e-300) / c).ln())
                .sum::<f64>()
    }
}

/// The position of the `q` quantile in a sorted list of `n` entries (nearest rank).
pub fn quantile_position(n: usize, q: f64) -> usize {
    ((q * n.saturating_sub(1) as f64).round() as usize).min(n.saturating_sub(1))
}

/// The model's own error, as a calibration measured it: for each of `n` draws, the log of
/// what the truth is over what the model predicts. The calibration's leave-one-out
/// residuals say how the fitted model misses a measurement it was not fitted on; their
/// mean and spread, from few of them, give a Student-t prediction: a draw is
/// `mean + sd·√(1 + 1/k)·T` with `T` of `k − 1` degrees of freedom (`k` residuals) — wider
/// than the residuals themselves, as a handful of them must be to cover the next one. An
/// interval with it is a prediction interval: where the step will be measured, not only
/// where the model's parameters put it. Empty with fewer than two residuals.
pub fn model_errors(calibration: &Calibration, n: usize) -> Vec<f64> {
    let residuals: Vec<f64> = calibration
        .measurement
        .iter()
        .map(|m| m.leave_one_out_percent)
        .filter(|p| p.is_finite() && *p > -100.0)
        .map(|p| -(1.0 + p / 100.0).ln())
        .collect();
    let k = residuals.len();
    if k < 2 {
        return Vec::new();
    }
    let mean = residuals.iter().sum::<f64>() / k as f64;
    let sd = (residuals.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (k - 1) as f64).sqrt();
    let scale = sd * (1.0 + 1.0 / k as f64).sqrt();
    let freedom = k - 1;
    let mut rng = SplitMix(SEED ^ 0x006d_6f64_656c);
    let mut normal = move || {
        // Box–Muller: one standard normal from two uniforms.
        let (u, v) = (rng.unit().max(1e-300), rng.unit());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    };
    (0..n)
        .map(|_| {
            let z = normal();
            let chi2: f64 = (0..freedom).map(|_| normal().powi(2)).sum();
            mean + scale * z / (chi2 / freedom as f64).sqrt()
        })
        .collect()
}

/// The 5th–95th percentile interval of a positive `answer` under `draws` (each a full
/// list of parameter values), linearised at `center` (the point estimate's values of the
/// same parameters). `beside` runs on the calling thread while the exact points that
/// linearise the answer are evaluated on others (their results do not depend on it): it
/// gives the caller's own result (the point estimate itself), the answer at `center`, and
/// for each draw the log of a factor on its answer (the model's error, [`model_errors`];
/// none: no factor). The interval is `None` when there are no draws, no answer at
/// `center`, or an exact evaluation fails.
pub fn propagate<S>(
    center: &[(ParameterRef, f64)],
    draws: &[Vec<(ParameterRef, f64)>],
    answer: &Answer<'_>,
    beside: impl FnOnce() -> (S, Option<f64>, Vec<f64>),
) -> (S, Option<Propagated>) {
    if draws.is_empty() {
        return (beside().0, None);
    }
    let varying = varying(center, draws);
    let points = moved(center, &varying);
    let (at_moved, (own, at_center, offsets)) =
        crate::parallel::map_beside(&points, |p| answer(p), beside);
    let Some(t0) = at_center.filter(|t| *t > 0.0) else {
        return (own, None);
    };
    let linear = Linearised::new(center, &varying, t0, &at_moved);
    let offset = |k: usize| offsets.get(k).copied().unwrap_or(0.0);
    let logs: Vec<f64> = draws
        .iter()
        .enumerate()
        .map(|(k, d)| linear.log_at(d) + offset(k))
        .collect();
    let mut order: Vec<usize> = (0..draws.len()).collect();
    order.sort_by(|&a, &b| logs[a].total_cmp(&logs[b]));
    let at = |q: f64| order[quantile_position(draws.len(), q)];
    let (low, high) = (at(0.05), at(0.95));
    let ends = [draws[low].clone(), draws[high].clone()];
    let ends = crate::parallel::map(&ends, |p| answer(p));
    let (Some(a), Some(b)) = (ends[0], ends[1]) else {
        return (own, None);
    };
    let (a, b) = (a * offset(low).exp(), b * offset(high).exp());
    let propagated = Propagated {
        interval: Interval {
            lower: a.min(b),
            upper: a.max(b),
        },
        evaluations: points.len() + 2,
        draws: draws.len(),
    };
    (own, Some(propagated))
}

/// The answer of `spec` with the parameters at `values`: the spec with those values, its
/// cost models configured again on `models`' components. `None` when it cannot be made.
pub fn with_answer<'a, T>(
    spec: &'a Spec,
    models: &'a CostModels,
    source: &'a dyn CostModelSource,
    answer: impl Fn(&Spec, &CostModels) -> Option<T> + Sync + 'a,
) -> impl Fn(&[(ParameterRef, f64)]) -> Option<T> + Sync + 'a {
    let units = units(models);
    move |values: &[(ParameterRef, f64)]| {
        let s = with_values(spec, values, &units).ok()?;
        let m = archplace_spec::reresolve_cost_models(
            &s,
            source,
            models,
            Arc::new(AtomicBool::new(false)),
        )
        .ok()?;
        answer(&s, &m)
    }
}
