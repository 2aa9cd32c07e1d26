//! What the proven search's bound keeps per search (`bound.rs` computes it): each layer
//! graph's skeleton and each plan shape's floor on the step. Below the search's context,
//! which holds them.

use crate::schedule::Skeleton;
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;

/// Each layer graph's [`Skeleton`] (`None` for a graph whose instances the solver refuses:
/// its bound builds the instance, and fails as the evaluation would), by the graph's
/// address — the search's graphs stay where they are for its life, and the bound asks
/// for the graph it holds, so no key is built per candidate.
pub(super) type Skeletons = FxHashMap<usize, Option<Skeleton>>;

/// Per model, per layer graph, the step floors of the plan shapes the search may price
/// with that graph ([`Floor`]), the dominated ones left out.
pub(super) type Floors<K> = Vec<BTreeMap<K, Vec<Floor>>>;

/// A lower bound on the step of every plan of one shape (width `t`, `p` stages of `v`
/// chunks, `d` replicas, a run's choices), as a function of `L`, the sum over the model's
/// layers of their forward and backward makespans — the larger of two lines,
/// `slope · L + intercept` and `hidden_slope · L + hidden_intercept`.
///
/// Why it holds (the step model, `step::priced`): the step is the sum of non-negative
/// parts, among them `n · T` (the slowest stage's time per micro-batch `T`, which counts
/// its layers' makespans, times `n = B / (m · d)` micro-batches), the bubble `b · T` at
/// least (`b` the schedule's floor, `PipelineSchedule::bubble_floor`: `(p − 1)/v` for
/// 1F1B and interleaved 1F1B, whose transfers it re-exposes only add; 0 for the
/// zero-bubble schedules and DualPipe) and the data-parallel
/// synchronisation: `S` exposed, plus `X` that the overlap may hide behind the slowest
/// stage's forward and backward passes, which take at most `T − q` together (`q`: the
/// point-to-point transfers a stage exposes per micro-batch, which `T` counts and the
/// bubble too) — so at least `max(0, X − (T − q))` of it shows. `T − q` is at least the
/// mean stage's `L / p`, and `(n + b)(T' + q) + max(0, X − T') + S`
/// only grows with `T'` (`n ≥ 1`), so `step ≥ max((n + b)(L/p + q) + S,
/// (n + b)(L/p + q) − L/p + X + S)`. `S`, `X` and `q` are those of the
/// stages' mean parameters, and a shape whose state alone (by the stages' mean) exceeds
/// the largest HBM size cannot be priced ([`step::plan_floor`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Floor {
    pub(super) slope: f64,
    pub(super) intercept: f64,
    pub(super) hidden_slope: f64,
    pub(super) hidden_intercept: f64,
}

impl Floor {
    /// The floor on the step, in seconds, at `l` seconds of layer makespans.
    pub(super) fn at(&self, l: f64) -> f64 {
        (self.slope * l + self.intercept).max(self.hidden_slope * l + self.hidden_intercept)
    }

    /// Whether `self` is at most `other` at every `L ≥ 0` line by line: `other` then never
    /// gives the larger throughput bound.
    fn dominates(&self, other: &Floor) -> bool {
        self.slope <= other.slope
            && self.intercept <= other.intercept
            && self.hidden_slope <= other.hidden_slope
            && self.hidden_intercept <= other.hidden_intercept
    }
}

/// Floors with the dominated ones left out (not all of them: a sufficient filter), in a
/// deterministic order.
pub(super) fn undominated(mut floors: Vec<Floor>) -> Vec<Floor> {
    floors.sort_by(|a, b| {
        a.slope
            .total_cmp(&b.slope)
            .then(a.intercept.total_cmp(&b.intercept))
            .then(a.hidden_slope.total_cmp(&b.hidden_slope))
            .then(a.hidden_intercept.total_cmp(&b.hidden_intercept))
    });
    let mut kept: Vec<Floor> = Vec::new();
    for f in floors {
        if !kept.iter().any(|k| k.dominates(&f)) {
            kept.push(f);
        }
    }
    kept
}
