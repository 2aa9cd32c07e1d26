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
    /// (argmin) on the loss with every point clamped into the box, deterministic.
    pub fn minimise(&self, rows: &[usize], bounds: &[(f64, f64)], scale: f64) -> Vec<f64> {
        let clamp = |x: &[f64]| -> Vec<f64> {
            x.iter()
                .zip(bounds)
                .map(|(v, (lo, hi))| v.clamp(*lo, *hi))
                .collect()
        };
        let start = clamp(&self.x0);
        let problem = Loss {
            linear: self,
            rows,
            bounds,
            scale,
        };
        // The initial simplex: the start and one step along each axis (inward at a bound).
        let mut simplex = vec![start.clone()];
        for (j, (lo, hi)) in bounds.iter().enumerate() {
            let mut v = start.clone();
            let step = 0.05_f64.min((hi - lo).max(1e-9));
            v[j] = if v[j] + step <= *hi {
                v[j] + step
            } else {
                v[j] - step
            };
            simplex.push(v);
        }
        let solver = match NelderMead::new(simplex).with_sd_tolerance(1e-12) {
            Ok(s) => s,
            Err(_) => return start,
        };
        let max_iters = 400 + 200 * bounds.len() as u64;
        match Executor::new(problem, solver)
            .configure(|s| s.max_iters(max_iters))
            .run()
        {
            Ok(r) => r
                .state
                .best_param
                .map_or(start.clone(), |p: Vec<f64>| clamp(&p)),
            Err(_) => start,
        }
    }
}

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
        Ok(self
            .rows
            .iter()
            .map(|&i| rho(self.linear.residual(i, &inside), self.scale))
            .sum::<f64>()
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
}
