//! The model linearised at a point: each measurement's log residual as a linear function
//! of the log factors, from finite differences of the exact model. Its robust fit is
//! cheap, so the trust-region steps of the main fit, every cross-validation fold and every
//! bootstrap refit minimise it; what is reported is always evaluated with the exact model.

use argmin::core::{CostFunction, Executor};
use argmin::solver::neldermead::NelderMead;

/// The robust loss of one log residual: pseudo-Huber with scale `s` — quadratic within
/// about `s`, linear beyond, so one odd measurement cannot drag the fit.
pub fn rho(r: f64, s: f64) -> f64 {
    s * s * ((1.0 + (r / s).powi(2)).sqrt() - 1.0)
}

/// The total robust loss of residuals.
pub fn loss(residuals: &[f64], s: f64) -> f64 {
    residuals.iter().map(|&r| rho(r, s)).sum()
}

/// Residuals `r0` at log factors `x0` and their derivatives `jacobian[i][j]` = ∂rᵢ/∂xⱼ.
#[derive(Debug, Clone)]
pub struct Linear {
    pub x0: Vec<f64>,
    pub r0: Vec<f64>,
    pub jacobian: Vec<Vec<f64>>,
}

impl Linear {
    /// Residual `i` at log factors `x`.
    pub fn residual(&self, i: usize, x: &[f64]) -> f64 {
        self.r0[i]
            + self.jacobian[i]
                .iter()
                .zip(x.iter().zip(&self.x0))
                .map(|(d, (a, b))| d * (a - b))
                .sum::<f64>()
    }

    /// The log factors within `bounds` (log space) minimising the robust loss of the rows
    /// `rows` (a row may repeat: a bootstrap sample), starting from `x0`: Nelder–Mead
    /// (argmin) on the loss with every point clamped into the box, restarted from its
    /// best point with a fresh simplex until a restart gains nothing (a simplex collapses
    /// along flat or bounded directions and stalls short of the optimum, which the loss —
    /// convex, its residuals linear — has just one of); deterministic.
    pub fn minimise(&self, rows: &[usize], bounds: &[(f64, f64)], scale: f64) -> Vec<f64> {
        let clamp = |x: &[f64]| -> Vec<f64> {
            x.iter()
                .zip(bounds)
                .map(|(v, (lo, hi))| v.clamp(*lo, *hi))
                .collect()
        };
        let problem = Loss {
            linear: self,
            rows,
            bounds,
            scale,
        };
        let mut best = clamp(&self.x0);
        let mut best_cost = problem.cost(&best).unwrap_or(f64::INFINITY);
        for _ in 0..RESTARTS {
            let Some((x, cost)) = nelder_mead(&problem, &best, bounds) else {
                break;
            };
            let x = clamp(&x);
            let gained = best_cost - cost;
            if gained.is_nan() || gained <= 1e-12 * best_cost.abs().max(1e-300) {
                if cost < best_cost {
                    best = x;
                }
                break;
            }
            best = x;
            best_cost = cost;
        }
        best
    }
}

/// How many times [`Linear::minimise`] may restart its simplex.
const RESTARTS: usize = 8;

/// One Nelder–Mead run on `problem` from `start`: its best point and loss.
fn nelder_mead(
    problem: &Loss<'_>,
    start: &[f64],
    bounds: &[(f64, f64)],
) -> Option<(Vec<f64>, f64)> {
    // The initial simplex: the start and one step along each axis (inward at a bound).
    let mut simplex = vec![start.to_vec()];
    for (j, (lo, hi)) in bounds.iter().enumerate() {
        let mut v = start.to_vec();
        let step = 0.05_f64.min((hi - lo).max(1e-9));
        v[j] = if v[j] + step <= *hi {
            v[j] + step
        } else {
            v[j] - step
        };
        simplex.push(v);
    }
    let solver = NelderMead::new(simplex).with_sd_tolerance(1e-12).ok()?;
    let max_iters = 400 + 200 * bounds.len() as u64;
    let r = Executor::new(problem.clone(), solver)
        .configure(|s| s.max_iters(max_iters))
        .run()
        .ok()?;
    let x = r.state.best_param?;
    Some((x, r.state.best_cost))
}

/// The weight of the pull towards the linearisation point, per squared log factor, in
/// units of the robust scale squared (a residual of one scale costs about 0.41 of it).
const ANCHOR: f64 = 1e-3;

#[derive(Clone)]
struct Loss<'a> {
    linear: &'a Linear,
    rows: &'a [usize],
    bounds: &'a [(f64, f64)],
    scale: f64,
}

impl CostFunction for Loss<'_> {
    type Param = Vec<f64>;
    type Output = f64;

    fn cost(&self, x: &Vec<f64>) -> Result<f64, argmin::core::Error> {
        let inside: Vec<f64> = x
            .iter()
            .zip(self.bounds)
            .map(|(v, (lo, hi))| v.clamp(*lo, *hi))
            .collect();
        // Outside the box, the loss at the nearest point plus the distance, so the
        // simplex comes back in.
        let outside: f64 = x.iter().zip(&inside).map(|(a, b)| (a - b).abs()).sum();
        // A weak pull towards the linearisation point, so that a direction the rows cannot
        // determine (a fold or a bootstrap sample of one source, which says nothing of a
        // parameter only the others depend on) stays where the full fit put it instead of
        // wandering to a bound with the simplex; a determined direction's curvature is
        // orders of magnitude above it.
        let anchor: f64 = ANCHOR
            * self.scale
            * self.scale
            * inside
                .iter()
                .zip(&self.linear.x0)
                .map(|(a, b)| (a - b).powi(2))
                .sum::<f64>();
        Ok(self
            .rows
            .iter()
            .map(|&i| rho(self.linear.residual(i, &inside), self.scale))
            .sum::<f64>()
            + anchor
            + outside)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On an exactly linear problem the minimiser finds the known optimum, respects the
    /// box, and a bootstrap-style repeated row weighs twice.
    #[test]
    fn the_linear_model_is_minimised_within_its_bounds() {
        // r0 = -0.1 + x, r1 = -0.1 + x, r2 = 0.3 + 0.5 y, r3 = 0.3 + 0.5 y: x = 0.1, y = -0.6.
        let l = Linear {
            x0: vec![0.0, 0.0],
            r0: vec![-0.1, -0.1, 0.3, 0.3],
            jacobian: vec![
                vec![1.0, 0.0],
                vec![1.0, 0.0],
                vec![0.0, 0.5],
                vec![0.0, 0.5],
            ],
        };
        let wide = [(-1.0, 1.0), (-1.0, 1.0)];
        let x = l.minimise(&[0, 1, 2, 3], &wide, 0.05);
        assert!(
            (x[0] - 0.1).abs() < 1e-4 && (x[1] + 0.6).abs() < 1e-4,
            "{x:?}"
        );
        let narrow = [(-1.0, 1.0), (-0.2, 1.0)];
        let x = l.minimise(&[0, 1, 2, 3], &narrow, 0.05);
        assert!((x[1] + 0.2).abs() < 1e-9, "held at its bound: {x:?}");
        assert!(loss(&[0.0, 0.0], 0.05) == 0.0);
        assert!(rho(1.0, 0.05) < 0.5 * 1.0, "linear, not squared, far out");
    }

    /// Six factors, twelve rows that vanish at a known point: the restarted simplex finds
    /// it (one run of Nelder–Mead stalls short of it in six dimensions); a factor no row
    /// depends on stays at the linearisation point instead of wandering.
    #[test]
    fn six_factors_reach_the_optimum_and_an_undetermined_one_stays() {
        let want = [0.3, -0.2, 0.15, -0.4, 0.25, 0.1];
        let mut rng = crate::fit::SplitMix(7);
        let jacobian: Vec<Vec<f64>> = (0..12)
            .map(|_| (0..6).map(|_| rng.unit() * 2.0 - 1.0).collect())
            .collect();
        let r0 = jacobian
            .iter()
            .map(|row: &Vec<f64>| -row.iter().zip(&want).map(|(a, b)| a * b).sum::<f64>())
            .collect();
        let l = Linear {
            x0: vec![0.0; 6],
            r0,
            jacobian,
        };
        let rows: Vec<usize> = (0..12).collect();
        let x = l.minimise(&rows, &[(-1.0, 1.0); 6], 0.05);
        for (got, want) in x.iter().zip(want) {
            assert!((got - want).abs() < 2e-3, "{x:?}");
        }
        // The last factor moves no row: it stays where the linearisation put it.
        let mut flat = l.clone();
        flat.x0[5] = 0.4;
        for row in &mut flat.jacobian {
            row[5] = 0.0;
        }
        let x = flat.minimise(&rows, &[(-1.0, 1.0); 6], 0.05);
        assert!((x[5] - 0.4).abs() < 1e-3, "{x:?}");
    }
}
