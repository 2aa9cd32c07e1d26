//! The fit, its cross-validation and its uncertainty.
//!
//! The factors are fitted in log space within their bounds, minimising the robust loss of
//! the log ratios of predicted to measured ([`crate::linear::rho`]): a trust-region
//! Gauss–Newton iteration whose steps minimise the model linearised at the current point
//! (finite differences of the exact model) and are accepted only when the exact model's
//! loss falls. Leave-one-out folds and bootstrap refits start from the full fit and refit
//! the model linearised there — one Gauss–Newton refit each, which is what makes a fold
//! cost one exact evaluation of what it leaves out rather than a whole fit; a source left
//! out moves the fit too far for that, so each leave-one-source-out fold is an exact
//! descent from the full fit. Every held-out prediction is made by the exact model at the
//! fold's factors.

use crate::linear::{Linear, loss};
use crate::problem::{CalibrateError, Problem};

/// How the fit runs.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub robust_scale: f64,
    pub bootstrap: u32,
    pub seed: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            robust_scale: 0.05,
            bootstrap: 200,
            seed: 1,
        }
    }
}

/// What the fit found, per measurement in the problem's order.
#[derive(Debug, Clone)]
pub struct Fit {
    /// The fitted factors.
    pub factors: Vec<f64>,
    /// Log ratios of predicted to measured: with the specs' own values, fitted, left out
    /// (leave-one-out: refitted on all the others), and predicted from the other sources'
    /// measurements only.
    pub uncalibrated: Vec<f64>,
    pub in_sample: Vec<f64>,
    pub leave_one_out: Vec<f64>,
    /// Left out and predicted from its own source's other measurements (NaN when it is
    /// its source's only one).
    pub within_source: Vec<f64>,
    pub other_sources: Vec<f64>,
    /// Bootstrap refits' factors (one list per refit).
    pub draws: Vec<Vec<f64>>,
    /// Each factor's bootstrap standard deviation and 5th and 95th percentiles.
    pub spread: Vec<(f64, [f64; 2])>,
    /// What the data could not determine.
    pub warnings: Vec<String>,
    pub iterations: u32,
    /// Exact evaluations of one measurement made.
    pub evaluations: u64,
    pub loss: f64,
}

/// Reports progress (a line for stderr).
pub type Progress<'a> = &'a dyn Fn(&str);

/// Step of the finite differences, in log factor.
const STEP: f64 = 0.01;

/// Below this norm of its column of the linearised model (a 1% change of the factor
/// moving no residual by more than 0.0001%), no measurement depends on a parameter.
const INERT: f64 = 1e-4;

fn column_norm(l: &Linear, j: usize) -> f64 {
    l.jacobian
        .iter()
        .map(|row| row[j] * row[j])
        .sum::<f64>()
        .sqrt()
}

/// Fits, cross-validates and bootstraps `problem`.
pub fn fit(
    problem: &Problem<'_>,
    options: Options,
    progress: Progress<'_>,
) -> Result<Fit, CalibrateError> {
    let n = problem.measurements.len();
    let p = problem.parameters.len();
    let all: Vec<usize> = (0..n).collect();
    let bounds: Vec<(f64, f64)> = problem
        .factor_bounds()
        .into_iter()
        .map(|(lo, hi)| (lo.max(1e-6).ln(), hi.max(1e-6).ln()))
        .collect();
    let s = options.robust_scale;
    let mut evaluations = 0u64;
    let uncalibrated: Vec<f64> = problem
        .uncalibrated_seconds
        .iter()
        .zip(&problem.measured_seconds)
        .map(|(p, m)| (p / m).ln())
        .collect();
    // Start inside the box (factors of 1 unless a bound excludes them).
    let x: Vec<f64> = bounds
        .iter()
        .map(|(lo, hi)| 0.0_f64.clamp(*lo, *hi))
        .collect();
    let r = if x.iter().all(|v| *v == 0.0) {
        uncalibrated.clone()
    } else {
        evaluations += n as u64;
        problem.residuals(&all, &factors_of(&x))?
    };
    let linear = jacobian(problem, &all, &x, &r, &bounds, &mut evaluations)?;
    // A parameter no measurement depends on stays where it is: the loss is flat along it
    // and a minimiser would wander. Whether one does at its lower bound is worth saying:
    // what it prices may hide behind other costs at the specs' value and show below it
    // (a collective beside computation), where a fit started lower would find it.
    let mut bounds = bounds;
    let mut shows_below: Vec<Option<f64>> = vec![None; p];
    for j in 0..p {
        if column_norm(&linear, j) < INERT {
            if bounds[j].0 < x[j] {
                let mut low = x.clone();
                low[j] = bounds[j].0;
                evaluations += n as u64;
                let at_low = problem.residuals(&all, &factors_of(&low))?;
                if at_low.iter().zip(&r).any(|(a, b)| (a - b).abs() > INERT) {
                    shows_below[j] = Some(bounds[j].0.exp());
                }
            }
            bounds[j] = (x[j], x[j]);
        }
    }
    progress(&format!(
        "calibrate: {n} measurements, {p} parameters; uncalibrated loss {:.3e}",
        loss(&r, s)
    ));
    let start = linear;
    let mut held: Vec<String> = Vec::new();
    loop {
        let Descent {
            x,
            r,
            loss: current,
            linear,
            iterations,
        } = descend(
            problem,
            &all,
            start.clone(),
            &bounds,
            s,
            &mut evaluations,
            Some(progress),
        )?;
        let (draws, spread) = bootstrap(&linear, &bounds, options, progress);
        // A parameter the measurements do not determine is held at the specs' value and
        // the rest fitted again: its fitted value would be one of many that fit as well.
        let loose: Vec<usize> = (0..p)
            .filter(|&j| bounds[j].0 < bounds[j].1)
            .filter(|&j| archplace_spec::calibration::undetermined(spread[j].1))
            .collect();
        if !loose.is_empty() {
            for &j in &loose {
                let [lo, hi] = spread[j].1;
                let name = &problem.parameters[j].parameter;
                let message = format!(
                    "{name}: the measurements do not determine it (its bootstrap 90% range was {lo:.2}–{hi:.2} times the specs' value); held at the specs' value"
                );
                progress(&format!("calibrate: warning: {message}"));
                held.push(message);
                let at = 0.0_f64.clamp(bounds[j].0, bounds[j].1);
                bounds[j] = (at, at);
            }
            continue;
        }
        let factors = factors_of(&x);
        let found = identifiability(problem, &linear, &x, &bounds, &shows_below);
        for w in &found {
            progress(&format!("calibrate: warning: {w}"));
        }
        let mut warnings = held;
        warnings.extend(found);
        let [leave_one_out, within_source, other_sources] =
            cross_validate(problem, &linear, &bounds, s, progress, &mut evaluations)?;
        return Ok(Fit {
            factors,
            uncalibrated,
            in_sample: r,
            leave_one_out,
            within_source,
            other_sources,
            draws,
            spread,
            warnings,
            iterations,
            evaluations,
            loss: current,
        });
    }
}

/// Leave-one-out and leave-one-source-out residuals: each fold refits the model
/// linearised at the full fit without what it leaves out, and predicts that exactly.
fn cross_validate(
    problem: &Problem<'_>,
    linear: &Linear,
    bounds: &[(f64, f64)],
    s: f64,
    progress: Progress<'_>,
    evaluations: &mut u64,
) -> Result<[Vec<f64>; 3], CalibrateError> {
    let n = problem.measurements.len();
    let all: Vec<usize> = (0..n).collect();
    let singles: Vec<Vec<usize>> = (0..n).map(|i| vec![i]).collect();
    let source_of = |i: usize| problem.measurements[i].source.as_str();
    // Leave one out: refit without i (on all the others; on its own source's others),
    // predict i exactly.
    progress("calibrate: leave-one-out");
    let mut folds: Vec<Vec<f64>> = Vec::with_capacity(n);
    let mut within: Vec<Vec<f64>> = Vec::with_capacity(n);
    for i in 0..n {
        let rows: Vec<usize> = all.iter().copied().filter(|&j| j != i).collect();
        folds.push(linear.minimise(&rows, bounds, s));
        let same: Vec<usize> = rows
            .into_iter()
            .filter(|&j| source_of(j) == source_of(i))
            .collect();
        within.push(if same.is_empty() {
            vec![f64::NAN]
        } else {
            linear.minimise(&same, bounds, s)
        });
    }
    let leave_one_out = fold_residuals(problem, &folds, &singles, evaluations)?;
    // A measurement alone in its source has no within-source fold.
    let (have, alone): (Vec<usize>, Vec<usize>) = (0..n).partition(|&i| within[i][0].is_finite());
    let mut within_source = fold_residuals(
        problem,
        &have.iter().map(|&i| within[i].clone()).collect::<Vec<_>>(),
        &have.iter().map(|&i| vec![i]).collect::<Vec<_>>(),
        evaluations,
    )?;
    for i in alone {
        within_source[i] = f64::NAN;
    }

    // Leave one source out: refit on the other sources, predict this one's exactly.
    let mut sources: Vec<&str> = problem
        .measurements
        .iter()
        .map(|m| m.source.as_str())
        .collect();
    sources.sort_unstable();
    sources.dedup();
    progress(&format!(
        "calibrate: leave-one-source-out ({} sources)",
        sources.len()
    ));
    let mut other_sources = vec![f64::NAN; n];
    if sources.len() > 1 {
        let groups: Vec<Vec<usize>> = sources
            .iter()
            .map(|s| {
                all.iter()
                    .copied()
                    .filter(|&i| problem.measurements[i].source == *s)
                    .collect()
            })
            .collect();
        // A source left out can take most of what determines a parameter with it, and the
        // refit then moves far from the full fit, where its linearisation no longer holds
        // (an overlap's max() switches on): each source's fold is an exact descent from
        // the full fit, as the fit itself is.
        let mut fits: Vec<Vec<f64>> = Vec::with_capacity(groups.len());
        for g in &groups {
            let rows: Vec<usize> = all.iter().copied().filter(|i| !g.contains(i)).collect();
            let from = linear.clone();
            fits.push(descend(problem, &rows, from, bounds, s, evaluations, None)?.x);
        }
        let r = fold_residuals(problem, &fits, &groups, evaluations)?;
        other_sources = r;
    }

    Ok([leave_one_out, within_source, other_sources])
}

/// Bootstrap refits of the linearised model on measurements drawn with replacement: the
/// factors of each, and each factor's standard deviation and 5th–95th percentiles.
#[allow(clippy::type_complexity)]
fn bootstrap(
    linear: &Linear,
    bounds: &[(f64, f64)],
    options: Options,
    progress: Progress<'_>,
) -> (Vec<Vec<f64>>, Vec<(f64, [f64; 2])>) {
    let (s, n, p) = (options.robust_scale, linear.r0.len(), bounds.len());
    // Bootstrap: refits on measurements drawn with replacement.
    progress(&format!(
        "calibrate: {} bootstrap refits",
        options.bootstrap
    ));
    let mut rng = SplitMix(options.seed);
    let draws: Vec<Vec<f64>> = (0..options.bootstrap)
        .map(|_| {
            let rows: Vec<usize> = (0..n)
                .map(|_| (rng.next_u64() % n as u64) as usize)
                .collect();
            factors_of(&linear.minimise(&rows, bounds, s))
        })
        .collect();
    let spread: Vec<(f64, [f64; 2])> = (0..p)
        .map(|j| {
            let mut v: Vec<f64> = draws.iter().map(|d| d[j]).collect();
            v.sort_by(f64::total_cmp);
            let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
            let sd = (v.iter().map(|a| (a - mean).powi(2)).sum::<f64>()
                / v.len().max(2).saturating_sub(1) as f64)
                .sqrt();
            (sd, [quantile(&v, 0.05), quantile(&v, 0.95)])
        })
        .collect();
    (draws, spread)
}

/// The factors of log factors `x`.
fn factors_of(x: &[f64]) -> Vec<f64> {
    x.iter().map(|v| v.exp()).collect()
}

/// The exact residuals of each group of measurements at its fold's log factors,
/// scattered back to the measurements' order (NaN where no group covers one).
fn fold_residuals(
    problem: &Problem<'_>,
    folds: &[Vec<f64>],
    groups: &[Vec<usize>],
    evaluations: &mut u64,
) -> Result<Vec<f64>, CalibrateError> {
    let mut out = vec![f64::NAN; problem.measurements.len()];
    for (x, g) in folds.iter().zip(groups) {
        let r = problem.residuals(g, &factors_of(x))?;
        *evaluations += g.len() as u64;
        for (&i, v) in g.iter().zip(r) {
            out[i] = v;
        }
    }
    Ok(out)
}

/// Where a trust-region descent ended: the log factors, every measurement's residual there
/// (those outside the rows it fits are stale), the rows' loss, the model linearised there
/// (for those rows) and the iterations made.
struct Descent {
    x: Vec<f64>,
    r: Vec<f64>,
    loss: f64,
    linear: Linear,
    iterations: u32,
}

/// The trust-region Gauss–Newton descent on `rows` from where `at` is linearised (its
/// `x0`, with residuals `r0`, valid for those rows): each step minimises the linearised
/// loss within the trust radius and the bounds, and is taken only when the exact model's
/// loss of the rows falls.
#[allow(clippy::too_many_arguments)]
fn descend(
    problem: &Problem<'_>,
    rows: &[usize],
    at: Linear,
    bounds: &[(f64, f64)],
    s: f64,
    evaluations: &mut u64,
    progress: Option<Progress<'_>>,
) -> Result<Descent, CalibrateError> {
    let (mut x, mut r) = (at.x0.clone(), at.r0.clone());
    let mut linear = at;
    let of_rows = |r: &[f64]| rows.iter().map(|&i| r[i]).collect::<Vec<f64>>();
    let mut current = loss(&of_rows(&r), s);
    let mut radius = 0.5_f64;
    let mut iterations = 0;
    while iterations < 30 && radius > 1e-4 {
        iterations += 1;
        let box_: Vec<(f64, f64)> = bounds
            .iter()
            .zip(&x)
            .map(|((lo, hi), v)| ((v - radius).max(*lo), (v + radius).min(*hi)))
            .collect();
        let proposal = linear.minimise(rows, &box_, s);
        let moved = proposal
            .iter()
            .zip(&x)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        if moved < 1e-7 {
            break;
        }
        let r_rows = problem.residuals(rows, &factors_of(&proposal))?;
        *evaluations += rows.len() as u64;
        let new = loss(&r_rows, s);
        if let Some(progress) = progress {
            progress(&format!(
                "calibrate: iteration {iterations}: loss {new:.3e} (was {current:.3e}), step {moved:.4}"
            ));
        }
        if new < current {
            let gain = (current - new) / current.max(1e-300);
            x = proposal;
            for (k, &i) in rows.iter().enumerate() {
                r[i] = r_rows[k];
            }
            current = new;
            radius = (radius * 2.0).min(2.0);
            linear = jacobian(problem, rows, &x, &r, bounds, evaluations)?;
            if gain < 1e-9 {
                break;
            }
        } else {
            radius = moved / 4.0;
        }
    }
    Ok(Descent {
        x,
        r,
        loss: current,
        linear,
        iterations,
    })
}

/// The model linearised at `x` (residuals `r`): a forward difference per parameter
/// (backward at its upper bound).
fn jacobian(
    problem: &Problem<'_>,
    rows: &[usize],
    x: &[f64],
    r: &[f64],
    bounds: &[(f64, f64)],
    evaluations: &mut u64,
) -> Result<Linear, CalibrateError> {
    let mut jacobian = vec![vec![0.0; x.len()]; r.len()];
    for j in 0..x.len() {
        let h = if x[j] + STEP <= bounds[j].1 {
            STEP
        } else {
            -STEP
        };
        let mut moved = x.to_vec();
        moved[j] += h;
        let rj = problem.residuals(rows, &factors_of(&moved))?;
        *evaluations += rows.len() as u64;
        for (k, &i) in rows.iter().enumerate() {
            jacobian[i][j] = (rj[k] - r[i]) / h;
        }
    }
    Ok(Linear {
        x0: x.to_vec(),
        r0: r.to_vec(),
        jacobian,
    })
}

/// What the measurements cannot determine: a parameter no measurement depends on, two
/// whose effects the measurements cannot tell apart (their columns of the linearised model
/// nearly parallel), a parameter held at a bound. `shows_below`: for a parameter held
/// from the start, the lower-bound factor at which a measurement depends on it, if one
/// does.
fn identifiability(
    problem: &Problem<'_>,
    l: &Linear,
    x: &[f64],
    bounds: &[(f64, f64)],
    shows_below: &[Option<f64>],
) -> Vec<String> {
    let p = problem.parameters.len();
    let column = |j: usize| l.jacobian.iter().map(|row| row[j]).collect::<Vec<f64>>();
    let norm = |v: &[f64]| v.iter().map(|a| a * a).sum::<f64>().sqrt();
    let mut out = Vec::new();
    for j in 0..p {
        let name = &problem.parameters[j].parameter;
        let cj = column(j);
        if norm(&cj) < INERT {
            // Held from the start (no measurement depended on it at the specs' values), or
            // moved until none did: a cost that hides behind another (a collective behind
            // computation) stops mattering part-way, and its factor is then only a limit.
            if bounds[j].0 == bounds[j].1 {
                out.push(match shows_below[j] {
                    Some(low) => format!(
                        "{name}: no measurement depends on it at the specs' values, but some do at its lower bound ({low:.2} times them): what it prices hides behind other costs down to some value below the specs'; it stays at them (to fit it, give the specs a value where it shows)"
                    ),
                    None => format!(
                        "{name}: no measurement depends on it at the specs' values (what it prices is absent from these runs, hidden behind other costs, or held there by another of the model's limits); it stays at them (give measurements it affects, or leave it out of `fit`)"
                    ),
                });
            } else {
                out.push(format!(
                    "{name}: no measurement depends on it at its fitted factor ({:.3}): it moved there, then what it prices hid behind other costs in every run, so the factor is a limit the measurements set, not a value they determine",
                    x[j].exp()
                ));
            }
            continue;
        }
        for k in 0..j {
            let ck = column(k);
            let (a, b) = (norm(&cj), norm(&ck));
            if b < INERT {
                continue;
            }
            let cos = cj.iter().zip(&ck).map(|(u, v)| u * v).sum::<f64>() / (a * b);
            if cos.abs() > 0.995 {
                out.push(format!(
                    "{name} and {}: the measurements cannot tell them apart (their effects are {:.1}% alike); fit one of them, or add measurements that separate them",
                    problem.parameters[k].parameter,
                    100.0 * cos.abs()
                ));
            }
        }
        let (lo, hi) = bounds[j];
        // Within 0.1% of a bound counts as held there.
        if lo < hi && ((x[j] - lo).abs() < 1e-3 || (x[j] - hi).abs() < 1e-3) {
            out.push(format!(
                "{name}: held at a bound of its physical range; the measurements ask for more than the parameter can explain"
            ));
        }
    }
    out
}

/// The `q` quantile of sorted values (linear between neighbours); NaN when empty.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let at = q.clamp(0.0, 1.0) * (sorted.len() - 1) as f64;
    let (i, f) = (at.floor() as usize, at - at.floor());
    let next = sorted[(i + 1).min(sorted.len() - 1)];
    sorted[i] + f * (next - sorted[i])
}

/// SplitMix64: a small, seeded, portable generator for the bootstrap's resampling and
/// the intervals' draws (the same seed gives the same draws everywhere).
#[derive(Debug, Clone)]
pub struct SplitMix(pub u64);

impl SplitMix {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}
