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

/// A chip's layers, at least, as the floors read them: `L`, the sum over the model's
/// layers of their forward and backward makespan bounds; `R`, what full recomputation
/// runs again (the blocks' forward bounds); and one block's forward and backward bound
/// and forward bound (the least of the model's block kinds).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct Layers {
    pub(super) seconds: f64,
    pub(super) rerun: f64,
    pub(super) block: f64,
    pub(super) block_forward: f64,
}

/// A lower bound on the step of every plan of one shape (width `t`, `p` stages of `v`
/// chunks, `d` replicas, a run's choices), as a function of the chip's [`Layers`].
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
/// bubble too) — so at least `max(0, X − (T − q))` of it shows. With `T' = T − q`,
/// `(n + b)(T' + q) + max(0, X − T') + S` only grows with `T'` (`n ≥ 1`), so any lower
/// bound on `T'` gives one on the step: `step ≥ max((n + b)(T' + q) + S,
/// (n + b)(T' + q) − T' + X + S)`. `q` is the stages' mean parameters'; `S` and `X` those
/// of a floor on the largest stage's parameters for the splits whose most loaded device
/// holds `X` blocks (`step::SplitFloor`: one floor per such `X`). A shape whose state
/// alone (by the stages' mean) exceeds the largest HBM size cannot be priced
/// ([`step::plan_floor`]); nor can one none of whose splits fits it with its activations
/// (`PlanFloor::splits` empty).
///
/// Two bounds on `T'`: the mean stage's, `L / p` (every layer runs on some stage each
/// micro-batch), and the most loaded device's blocks: some device holds at least `X` of
/// them (at least `⌈blocks / p⌉`, more when memory keeps blocks off the first devices)
/// and runs `share` of those per micro-batch (all of them, but DualPipe's one of two
/// stages), each at least a block's bound (`most_blocks`). Full
/// recomputation (`reruns`) runs each block's forward pass again within `T` (the hiding
/// window — the forward and backward passes — does not count it, and is at most `T'`):
/// `(L + R) / p`, and a block's forward bound added to each block.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Floor {
    /// Micro-batch slots of the pipeline: `n + b`.
    pub(super) slots: f64,
    /// `p`.
    pub(super) stages: f64,
    /// Blocks the most loaded device runs per micro-batch, at least.
    pub(super) most_blocks: f64,
    /// `(n + b) · q + S`.
    pub(super) fixed: f64,
    /// `X`.
    pub(super) hideable: f64,
    /// Full recomputation: the step counts `R` too.
    pub(super) reruns: bool,
}

impl Floor {
    /// The floor on the step, in seconds, with the chip's `layers`.
    pub(super) fn at(&self, layers: &Layers) -> f64 {
        let (w, block) = if self.reruns {
            (
                layers.seconds + layers.rerun,
                layers.block + layers.block_forward,
            )
        } else {
            (layers.seconds, layers.block)
        };
        let t = (w / self.stages).max(self.most_blocks * block);
        let busy = self.slots * t + self.fixed;
        busy.max(busy - t + self.hideable)
    }

    /// Whether `self` is at most `other` for every chip: its `T'` bound is never larger
    /// (as many stages or more, no more blocks on the most loaded device; a floor that
    /// reruns is not below one that does not) and its two lines, which grow with `T'`,
    /// are not above `other`'s — `other` then never gives the larger throughput bound.
    fn dominates(&self, other: &Floor) -> bool {
        (!self.reruns || other.reruns)
            && self.stages >= other.stages
            && self.most_blocks <= other.most_blocks
            && self.slots <= other.slots
            && self.fixed <= other.fixed
            && self.fixed + self.hideable <= other.fixed + other.hideable
    }
}

/// Floors with the dominated ones left out (not all of them: a sufficient filter), in a
/// deterministic order.
pub(super) fn undominated(mut floors: Vec<Floor>) -> Vec<Floor> {
    floors.sort_by(|a, b| {
        b.stages
            .total_cmp(&a.stages)
            .then(a.most_blocks.total_cmp(&b.most_blocks))
            .then(a.reruns.cmp(&b.reruns))
            .then(a.slots.total_cmp(&b.slots))
            .then(a.fixed.total_cmp(&b.fixed))
            .then(a.hideable.total_cmp(&b.hideable))
    });
    let mut kept: Vec<Floor> = Vec::new();
    for f in floors {
        if !kept.iter().any(|k| k.dominates(&f)) {
            kept.push(f);
        }
    }
    kept
}
