//! The co-search: which accelerator, and which training plan on it.
//!
//! Candidates are visited in the space's order (area buckets, largest first). Each
//! candidate is evaluated at every micro-batch size, tensor-parallel width, HBM size and
//! recomputation choice: its distinct layers (embedding, block, head; forward and
//! backward) are scheduled once per (micro-batch, width) — a schedule depends only on the
//! layer and the core configurations, so it serves every HBM size and recomputation
//! choice — and placed over the devices for each recomputation choice, every HBM size in
//! one run of the placement program (a stage's load does not depend on the HBM size). A
//! candidate's score is, over HBM sizes, the best mean over models of each model's best
//! throughput; a model that fits nowhere fails the candidate at that HBM size.
//!
//! The walk ([`Strategy`]) stops by the reference's rule — the best scores of the last
//! `convergence_window` buckets did not increase — except that a bucket in which every
//! candidate failed is not evidence of convergence (it is skipped); `exhaustive` visits
//! everything; `proven` bounds every candidate (`bound`: an upper bound on its score
//! valid for every plan) and evaluates them in the order of their bounds until no bound
//! can beat the best — the best of the whole space, evaluating what the bounds cannot
//! rule out. Work inside a candidate runs on all threads (rayon) and is combined in a
//! fixed order, so the result does not depend on the thread count. Two candidates of the
//! same throughput (within [`TIE_RELATIVE`]) go to the smaller chip, then to the one
//! visited first.

//!
//! * [`input`] — what a search takes; [`record`] — what it says of a candidate and of
//!   itself; [`observe`] — how it reports as it goes;
//! * `context`, `estimator`, `schedules`, `evaluate` — one candidate's evaluation: the
//!   search's memos, its layer schedules, its placements and best plans;
//! * [`supplier`] — evaluations made elsewhere (a pool) and the evaluator that makes them;
//! * [`memory`] — the memory a search may need, from its spec alone;
//! * this module — the walk over the space.

// In their order: each file imports only the files declared before it (ARCHITECTURE.md,
// "The engine's modules"; a tidy test checks it). One per group: rustfmt would sort them.
pub mod input;

mod estimator;

pub mod record;

pub mod observe;

mod memo;

mod floor;

mod context;

mod schedules;

mod evaluate;

mod bound;

pub mod memory;

pub mod supplier;

pub use crate::space::Strategy;
pub use context::context_parallel_fits;
pub use input::{ModelInput, SearchInput};
pub use memo::{SharedSchedules, Solved};
pub use observe::{Observer, Progress, ScheduleEvent};
pub use record::Stats;
pub use record::{
    BaselineReport, DomainScore, Evaluated, LayerReport, ModelPlan, Outcome, StageReport,
};
pub use supplier::{Evaluator, Local, Supplier};

use crate::space::Space;
use archplace_plugin_sdk::{EstimateError, LatencyModel};
use context::{Ctx, JobError};
use rayon::prelude::*;
use std::cmp::Ordering as Rank;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    #[error("the latency model failed: {0}")]
    CostModel(EstimateError),
    #[error("the space is empty: no candidate fits the area budget")]
    EmptySpace,
    /// A [`Supplier`] could not supply a candidate (a pool worker's cost model failed, or
    /// the pool answered something else than the candidate asked for).
    #[error("{0}")]
    Supplier(String),
}

/// Two candidates' mean throughputs tie when they differ by less than this fraction of the
/// larger: one part in a million, finer than any report prints them (six significant
/// digits at most) and coarser than the rounding of the sums behind them.
pub const TIE_RELATIVE: f64 = 1e-6;

/// Whether a candidate of throughput `t` and area `area_um2` replaces `best`: it is faster,
/// or it ties ([`TIE_RELATIVE`]) and is smaller — the chip to build is the cheaper of two
/// that train as fast. (An equal area keeps the one visited first.)
pub fn beats(t: f64, area_um2: f64, best: &Evaluated) -> bool {
    let b = best.mean_throughput_samples_per_second.unwrap_or(0.0);
    faster_or_smaller((t, area_um2), (b, best.area_um2))
}

/// Whether two throughputs tie: they differ by at most [`TIE_RELATIVE`] of the larger.
pub fn ties(a: f64, b: f64) -> bool {
    (a - b).abs() <= TIE_RELATIVE * a.abs().max(b.abs())
}

/// Whether `(throughput, size)` replaces `best`: faster, or as fast ([`TIE_RELATIVE`]) and
/// smaller — the tie rule between chips (area), and between scale-up domain sizes
/// (devices) for one chip or for the best chips.
pub fn faster_or_smaller((t, size): (f64, f64), (best_t, best_size): (f64, f64)) -> bool {
    if ties(t, best_t) {
        size < best_size
    } else {
        t > best_t
    }
}

/// One search: what it searches, with which latency model, reporting to whom, stopped by
/// what.
#[derive(Clone, Copy)]
pub struct Search<'a> {
    pub input: &'a SearchInput,
    pub space: &'a Space,
    pub latency: &'a dyn LatencyModel,
    pub observer: &'a dyn Observer,
    /// Stops the walk at the next candidate (and a latency-model call in flight).
    pub cancel: Option<&'a AtomicBool>,
}

/// Runs the search over `space`, every candidate evaluated here.
pub fn search(
    input: &SearchInput,
    space: &Space,
    latency: &dyn LatencyModel,
    observer: &dyn Observer,
    cancel: Option<&AtomicBool>,
) -> Result<Outcome, SearchError> {
    Search {
        input,
        space,
        latency,
        observer,
        cancel,
    }
    .run(BTreeMap::new(), &mut Local)
}

impl Search<'_> {
    /// Whether the search was asked to stop.
    fn cancelled(&self) -> bool {
        self.cancel.is_some_and(|c| c.load(Ordering::Relaxed))
    }

    /// Runs the search, reusing the candidates an interrupted run of the same search
    /// finished (`done`, by index; one whose configuration or area differs from the
    /// space's is evaluated again). Because a candidate's evaluation depends only on the
    /// candidate, the spec and the cost models, and the walk only on the evaluations, the
    /// outcome is the uninterrupted run's; only the work counters and timings count this
    /// run. `done` may hold summaries ([`Evaluated::summarise`]): if the best is one, it is
    /// evaluated again for its stages and layers.
    ///
    /// Only the best candidate's record is kept whole: the others are summarised as they
    /// are passed, so the memory a search holds per candidate is a summary's (see
    /// [`memory`]).
    ///
    /// Candidates not in `done` are asked of `supplier` first ([`Supplier`]; [`Local`] to
    /// evaluate every one here): a supplied evaluation must be of the candidate asked for
    /// (index, configuration, area, bucket), or the search fails; it is reported to
    /// `observer.evaluated` like one computed here.
    pub fn run(
        self,
        done: BTreeMap<usize, Evaluated>,
        supplier: &mut dyn Supplier,
    ) -> Result<Outcome, SearchError> {
        let started = Instant::now();
        if self.space.candidates.is_empty() {
            return Err(SearchError::EmptySpace);
        }
        let mut walk = Walk {
            search: self,
            ctx: Ctx::new(self.input, self.latency, self.observer),
            done,
            explored: Vec::new(),
            best: None,
            cancelled: false,
            pruning: Pruning::default(),
        };
        let strategy = self.input.strategy;
        let (buckets_visited, converged) = match strategy {
            Strategy::Proven => {
                walk.proven(supplier)?;
                let buckets: BTreeSet<u64> = walk.explored.iter().map(|e| e.bucket).collect();
                (buckets.len(), false)
            }
            Strategy::Converge | Strategy::Exhaustive => walk.buckets(supplier)?,
        };
        walk.best_whole()?;
        let Walk {
            ctx,
            explored,
            best,
            cancelled,
            pruning,
            ..
        } = walk;
        let mut stats = ctx.stats.into_inner().unwrap_or_default();
        stats.strategy = strategy;
        stats.candidates_evaluated = explored.len();
        stats.candidates_failed = explored.iter().filter(|e| e.failure.is_some()).count();
        stats.buckets_visited = buckets_visited;
        stats.converged = converged;
        stats.cancelled = cancelled;
        stats.candidates_bounded = pruning.bounded;
        stats.candidates_bounded_exactly = pruning.bounded_exactly;
        stats.candidates_failed_bound = pruning.failed;
        stats.candidates_pruned = pruning.pruned;
        stats.largest_remaining_bound_samples_per_second = pruning.largest_remaining;
        stats.proven = strategy == Strategy::Proven && !cancelled;
        stats.bound_seconds = pruning.seconds;
        stats.estimates_computed = ctx.estimator.computed.load(Ordering::Relaxed);
        stats.estimate_cache_hits = ctx.estimator.hits.load(Ordering::Relaxed);
        stats.add_work(&supplier.work());
        stats.total_seconds = started.elapsed().as_secs_f64();
        Ok(Outcome {
            best: best.map(|b| explored[b].clone()),
            explored,
            stats,
        })
    }
}

/// The walk under way: the candidates explored so far and the best of them.
struct Walk<'a> {
    search: Search<'a>,
    ctx: Ctx<'a>,
    /// Candidates of an interrupted run, to be reused.
    done: BTreeMap<usize, Evaluated>,
    explored: Vec<Evaluated>,
    /// Index into `explored`.
    best: Option<usize>,
    cancelled: bool,
    /// What a proven search's bounds did.
    pruning: Pruning,
}

/// A proven search's bound pass and pruning, counted.
#[derive(Debug, Default)]
struct Pruning {
    bounded: usize,
    bounded_exactly: usize,
    failed: usize,
    pruned: usize,
    largest_remaining: Option<f64>,
    seconds: f64,
}

/// A bound is computed with other sums than the evaluation it bounds: it is taken this
/// much (relatively) larger before it is compared, so that rounding never prunes a
/// candidate whose bound is tight.
const BOUND_SLACK: f64 = 1e-9;

/// Candidates bounded per batch of the bound pass (in parallel), between which the pass
/// reports its progress and looks at the cancel flag.
const BOUND_BATCH: usize = 512;

/// Whether a candidate bounded by `bound` (samples per second) of area `area_um2` and
/// index `index` can replace `best`: some throughput up to its bound is faster than the
/// best's (not a tie), or ties it on a smaller chip (or an equal one visited first by the
/// space's order, as [`Walk::record`] breaks ties).
fn may_beat(bound: f64, area_um2: f64, index: usize, best: &Evaluated) -> bool {
    let b = bound * (1.0 + BOUND_SLACK);
    let t = best.mean_throughput_samples_per_second.unwrap_or(0.0);
    let faster = b > t / (1.0 - TIE_RELATIVE);
    let tie = b >= t * (1.0 - TIE_RELATIVE);
    let first = area_um2 < best.area_um2 || (area_um2 == best.area_um2 && index < best.index);
    faster || (tie && first)
}

/// A candidate and its bound (quick or exact) in the proven walk: greatest is first in
/// the walk's order (the largest bound, then the smaller chip, then the first in the
/// space's order).
#[derive(Debug, Clone, Copy)]
struct Ranked {
    index: usize,
    bound: f64,
    area_um2: f64,
}

impl Ord for Ranked {
    fn cmp(&self, other: &Self) -> Rank {
        self.bound
            .total_cmp(&other.bound)
            .then(other.area_um2.total_cmp(&self.area_um2))
            .then(other.index.cmp(&self.index))
    }
}

impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<Rank> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Ranked {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Rank::Equal
    }
}

impl Eq for Ranked {}

/// Whether no candidate bounded by `bound` or less can replace `best`, whatever its size.
fn below_any_tie(bound: f64, best: &Evaluated) -> bool {
    let t = best.mean_throughput_samples_per_second.unwrap_or(0.0);
    bound * (1.0 + BOUND_SLACK) < t * (1.0 - TIE_RELATIVE)
}

impl Walk<'_> {
    /// Visits the area buckets in order until the walk converges (the best scores of the
    /// last `convergence_window` buckets did not increase; a bucket in which every
    /// candidate failed is no evidence), the space ends or the search is cancelled. The
    /// buckets visited, and whether it converged.
    fn buckets(&mut self, supplier: &mut dyn Supplier) -> Result<(usize, bool), SearchError> {
        let input = self.search.input;
        let candidates = &self.search.space.candidates;
        let window = input.convergence_window.max(1) as usize;
        let mut history: Vec<f64> = Vec::new();
        let (mut visited, mut i, n) = (0, 0, candidates.len());
        while i < n {
            let bucket = candidates[i].bucket;
            let end = (i..n)
                .find(|&k| candidates[k].bucket != bucket)
                .unwrap_or(n);
            visited += 1;
            let mut bucket_best: Option<f64> = None;
            for k in i..end {
                let Some(e) = self.candidate(k, supplier)? else {
                    self.cancelled = true;
                    return Ok((visited, false));
                };
                if let Some(t) = e.mean_throughput_samples_per_second {
                    bucket_best = Some(bucket_best.map_or(t, |b: f64| b.max(t)));
                }
                self.record(e, bucket);
            }
            if let Some(v) = bucket_best {
                history.push(v);
            }
            if input.strategy == Strategy::Converge
                && history.len() >= window
                && history[history.len() - window..]
                    .windows(2)
                    .all(|w| w[0] >= w[1])
            {
                return Ok((visited, true));
            }
            i = end;
        }
        Ok((visited, false))
    }

    /// The proven walk: every candidate bounded ([`bound`], in parallel, in batches), then
    /// evaluated in the order of the bounds — largest first, ties to the smaller chip,
    /// then to the space's order — while its bound may beat the best so far
    /// ([`may_beat`]); it ends when no remaining bound can. Because every candidate's
    /// score is at most its bound, the best found is the best of the whole space, with the
    /// tie rule of a walk over all of it. A candidate the latency model cannot estimate
    /// fails bounding as it would fail evaluation: it is counted, never evaluated.
    ///
    /// Bounding lazily: every candidate gets the quick bound first (`Ctx::quick_bound`, at
    /// least its bound), and is bounded exactly only when its quick bound ranks before
    /// (or with) the largest exact bound not yet walked — so the walk visits the
    /// candidates in the order of their exact bounds, as if every one had been bounded,
    /// and bounds exactly only those near the top. A supplier that evaluates ahead in
    /// the walk's order ([`Supplier::needs_order`], a pool) gets every exact bound first,
    /// and the same walk.
    fn proven(&mut self, supplier: &mut dyn Supplier) -> Result<(), SearchError> {
        let started = Instant::now();
        let candidates = &self.search.space.candidates;
        let n = candidates.len();
        let exact = supplier.needs_order();
        let Some(first) = self.bound_all(exact)? else {
            self.cancelled = true;
            return Ok(());
        };
        self.pruning.bounded = n;
        self.pruning.failed = first.iter().filter(|b| b.is_none()).count();
        self.pruning.seconds = started.elapsed().as_secs_f64();
        // The walk's order: greatest first (`Ranked`'s order).
        let mut order: Vec<Ranked> = first
            .iter()
            .enumerate()
            .filter_map(|(index, b)| {
                b.map(|bound| Ranked {
                    index,
                    bound,
                    area_um2: candidates[index].area_um2,
                })
            })
            .collect();
        order.sort_by(|a, b| b.cmp(a));
        if exact {
            self.pruning.bounded_exactly = n;
            supplier.follow(&order.iter().map(|r| r.index).collect::<Vec<_>>())?;
        }
        // Exact bounds not yet walked (its greatest first) and the next candidate of
        // `order` not bounded exactly (all of them, when `order` holds exact bounds).
        let mut heap: BinaryHeap<Ranked> = BinaryHeap::new();
        let mut next = 0;
        loop {
            let top = if exact {
                order.get(next).copied().inspect(|_| next += 1)
            } else {
                // Bound exactly every candidate whose quick bound may rank before the
                // greatest exact one, then walk that.
                while let Some(&quick) = order.get(next)
                    && heap.peek().is_none_or(|top| quick >= *top)
                {
                    next += 1;
                    if self.search.cancelled() {
                        self.cancelled = true;
                        return Ok(());
                    }
                    self.pruning.bounded_exactly += 1;
                    match self.ctx.bound(&candidates[quick.index].config) {
                        Ok(bound) => heap.push(Ranked { bound, ..quick }),
                        Err(JobError::Infeasible(_)) => self.pruning.failed += 1,
                        Err(_) if self.search.cancelled() => {
                            self.cancelled = true;
                            return Ok(());
                        }
                        Err(JobError::Model(e)) => return Err(SearchError::CostModel(e)),
                    }
                }
                heap.pop()
            };
            let Some(Ranked {
                index: k, bound, ..
            }) = top
            else {
                break;
            };
            if let Some(best) = self.best.map(|b| &self.explored[b]) {
                if exact {
                    // Where the pruning will stop the walk, as far as the best so far
                    // says (the bounds decrease along the order).
                    supplier.stop_at(order.partition_point(|r| !below_any_tie(r.bound, best)));
                }
                if below_any_tie(bound, best) {
                    // Every candidate left: the rest of the heap and of the order, whose
                    // bounds (exact, or quick and at least exact) are at most this one.
                    let rest = 1 + heap.len() + (order.len() - next);
                    self.pruning.pruned += rest;
                    self.pruning.largest_remaining =
                        Some(self.pruning.largest_remaining.unwrap_or(0.0).max(bound));
                    break;
                }
                if !may_beat(bound, candidates[k].area_um2, k, best) {
                    self.pruning.pruned += 1;
                    self.pruning.largest_remaining =
                        Some(self.pruning.largest_remaining.unwrap_or(0.0).max(bound));
                    continue;
                }
            }
            let Some(e) = self.candidate(k, supplier)? else {
                self.cancelled = true;
                return Ok(());
            };
            let bucket = e.bucket;
            self.record(e, bucket);
        }
        Ok(())
    }

    /// Every candidate's bound — exact ([`Ctx::bound`]) or quick ([`Ctx::quick_bound`]) —
    /// in parallel, in batches between which the pass reports its progress and looks at
    /// the cancel flag; `None` for a candidate the latency model cannot estimate, and no
    /// list at all when the search was cancelled.
    fn bound_all(&mut self, exact: bool) -> Result<Option<Vec<Option<f64>>>, SearchError> {
        let candidates = &self.search.space.candidates;
        let n = candidates.len();
        let mut bounds: Vec<Option<f64>> = Vec::with_capacity(n);
        for from in (0..n).step_by(BOUND_BATCH) {
            if self.search.cancelled() {
                return Ok(None);
            }
            let to = (from + BOUND_BATCH).min(n);
            let batch: Vec<Result<Option<f64>, EstimateError>> = (from..to)
                .into_par_iter()
                .map(|k| {
                    let c = &candidates[k].config;
                    let bound = if exact {
                        self.ctx.bound(c)
                    } else {
                        self.ctx.quick_bound(c)
                    };
                    match bound {
                        Ok(b) => Ok(Some(b)),
                        Err(JobError::Infeasible(_)) => Ok(None),
                        Err(JobError::Model(e)) => Err(e),
                    }
                })
                .collect();
            for b in batch {
                match b {
                    Ok(b) => bounds.push(b),
                    // Cancelling stops a plugin call in flight, which then fails.
                    Err(_) if self.search.cancelled() => return Ok(None),
                    Err(e) => return Err(SearchError::CostModel(e)),
                }
            }
            self.search.observer.bounded(bounds.len(), n);
        }
        Ok(Some(bounds))
    }

    /// Candidate `k`'s evaluation: resumed, supplied or computed here; `None` when the
    /// search was cancelled before it (or while it was evaluated).
    fn candidate(
        &mut self,
        k: usize,
        supplier: &mut dyn Supplier,
    ) -> Result<Option<Evaluated>, SearchError> {
        let search = self.search;
        if search.cancelled() {
            return Ok(None);
        }
        let cand = &self.search.space.candidates[k];
        let same = |e: &Evaluated| {
            e.index == k
                && e.config == cand.config
                && e.bucket == cand.bucket
                && e.area_um2.to_bits() == cand.area_um2.to_bits()
        };
        if let Some(e) = self.done.remove(&k)
            && same(&e)
        {
            return Ok(Some(e));
        }
        let evaluated = supplier
            .supply(k, cand)
            .and_then(|supplied| match supplied {
                Some(e) if same(&e) => Ok(e),
                Some(e) => Err(SearchError::Supplier(format!(
                    "the pool answered candidate {} ({:?}) for candidate {k} ({:?})",
                    e.index, e.config, cand.config
                ))),
                None => self.ctx.evaluate(k, cand),
            });
        match evaluated {
            // Cancelling also stops a plugin call in flight, which then fails — the whole
            // evaluation or the candidate: the search was cancelled, the candidate is not
            // evaluated (nor journalled as failed, which a resumed search would believe).
            Ok(e) if e.failure.is_some() && search.cancelled() => Ok(None),
            Ok(e) => {
                self.search.observer.evaluated(&e);
                Ok(Some(e))
            }
            Err(_) if search.cancelled() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Adds `e` to the explored candidates — whole if it is the new best (the former best
    /// summarised), summarised otherwise — and reports the progress.
    fn record(&mut self, mut e: Evaluated, bucket: u64) {
        // Ties on equal chips go to the one first in the space's order: the one a walk in
        // that order visits first, whatever order this walk visits them in.
        let new_best = e.mean_throughput_samples_per_second.is_some_and(|t| {
            self.best.is_none_or(|b| {
                let best = &self.explored[b];
                beats(t, e.area_um2, best)
                    || (e.area_um2 == best.area_um2
                        && e.index < best.index
                        && ties(t, best.mean_throughput_samples_per_second.unwrap_or(0.0)))
            })
        });
        if new_best {
            if let Some(b) = self.best {
                self.explored[b].summarise();
            }
            self.best = Some(self.explored.len());
        } else {
            e.summarise();
        }
        self.explored.push(e);
        let b = self.best.map(|b| &self.explored[b]);
        self.search.observer.progress(&Progress {
            evaluated: self.explored.len(),
            total: self.search.space.candidates.len(),
            bucket,
            bucket_area_um2: bucket as f64 * self.search.space.bucket_um2,
            best_throughput_samples_per_second: b
                .and_then(|e| e.mean_throughput_samples_per_second),
            best_area_um2: b.map(|e| e.area_um2),
            estimates_computed: self.ctx.estimator.computed.load(Ordering::Relaxed),
            estimate_cache_hits: self.ctx.estimator.hits.load(Ordering::Relaxed),
        });
    }

    /// A best resumed from a summary: its stages and layers, evaluated again (the same
    /// evaluation, so the same record).
    fn best_whole(&mut self) -> Result<(), SearchError> {
        if let Some(b) = self.best
            && self.explored[b].is_summary()
            && let Some(cand) = self.search.space.candidates.get(self.explored[b].index)
        {
            self.explored[b] = self.ctx.evaluate(self.explored[b].index, cand)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
