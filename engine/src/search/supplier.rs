//! Evaluations made elsewhere ([`Supplier`]: a pool's workers) and the evaluator that makes
//! them, with the search's memos ([`Evaluator`]).

use super::context::Ctx;
use super::memo::SharedSchedules;
use super::observe::{Observer, Stats};
use super::record::Evaluated;
use super::{SearchError, SearchInput};
use crate::space::Candidate;
use archplace_plugin_sdk::LatencyModel;
use std::sync::atomic::Ordering;

/// Where the walk gets evaluations computed elsewhere: a pool of workers (the daemon's
/// `pool`). The walk asks for candidates in its order, one at a time, and stops by its
/// own rule; a supplier that evaluates ahead (look-ahead) learns where the walk is from
/// the indices it is asked for. Because an evaluation depends only on the candidate, the
/// spec and the cost models, a supplied one is the one the walk would have computed, so
/// the outcome is the same as a search on one machine.
pub trait Supplier {
    /// The evaluation of candidate `index` (`candidate`), waiting for it if it is being
    /// computed; `None` to evaluate it here. An error fails the search — unless the search
    /// was cancelled meanwhile, in which case it is the cancellation's.
    fn supply(
        &mut self,
        index: usize,
        candidate: &Candidate,
    ) -> Result<Option<Evaluated>, SearchError>;

    /// The walk visits the candidates in `order` (candidate indices), not in the space's
    /// order: a proven walk says so once, before its first [`supply`](Self::supply), so
    /// that a supplier evaluating ahead follows it. Candidates missing from the order
    /// (their bounds failed) are never asked for. An error fails the search.
    fn follow(&mut self, _order: &[usize]) -> Result<(), SearchError> {
        Ok(())
    }

    /// Whether the supplier evaluates ahead in the walk's order, and so needs the whole
    /// of it before the first [`supply`](Self::supply): a proven walk then bounds every
    /// candidate exactly first (one that needs no order gets its candidates in the same
    /// order, bounded lazily).
    fn needs_order(&self) -> bool {
        false
    }

    /// The walk will ask for none of the candidates from position `end` of its order on
    /// (their bounds cannot beat the best): nothing past it needs evaluating. `end` only
    /// decreases.
    fn stop_at(&mut self, _end: usize) {}

    /// The work done elsewhere so far, added to the outcome's counters.
    fn work(&self) -> Stats {
        Stats::default()
    }
}

/// The supplier of a search on one machine: every candidate is evaluated here.
pub struct Local;

impl Supplier for Local {
    fn supply(&mut self, _: usize, _: &Candidate) -> Result<Option<Evaluated>, SearchError> {
        Ok(None)
    }
}

/// Evaluates candidates of one search, keeping the search's memos (estimates, layer
/// schedules) from one call to the next: what a pool's worker holds for each search it
/// serves. [`Search::run`](super::Search::run) uses one inside; the evaluation of a candidate is the same whichever
/// evaluator makes it and whatever it evaluated before.
pub struct Evaluator<'a> {
    ctx: Ctx<'a>,
}

impl<'a> Evaluator<'a> {
    pub fn new(
        input: &'a SearchInput,
        latency: &'a dyn LatencyModel,
        observer: &'a dyn Observer,
    ) -> Evaluator<'a> {
        Evaluator {
            ctx: Ctx::new(input, latency, observer),
        }
    }

    /// An evaluator that also asks `shared` for layer schedules its own memo lacks, and
    /// tells it of those it solves: a pool's workers share their schedules this way, as
    /// one machine's search shares them between candidates.
    pub fn with_shared(
        input: &'a SearchInput,
        latency: &'a dyn LatencyModel,
        observer: &'a dyn Observer,
        shared: &'a dyn SharedSchedules,
    ) -> Evaluator<'a> {
        let mut ctx = Ctx::new(input, latency, observer);
        ctx.shared = Some(shared);
        Evaluator { ctx }
    }

    /// Evaluates candidate `index` of the space. A candidate outside the latency model's
    /// domain is a failed evaluation (`failure`), not an error; an error is the model's.
    pub fn evaluate(&self, index: usize, candidate: &Candidate) -> Result<Evaluated, SearchError> {
        self.ctx.evaluate(index, candidate)
    }

    /// The work counters and timings so far (the walk's counts are zero).
    pub fn work(&self) -> Stats {
        let mut stats = self.ctx.stats.lock().map(|s| s.clone()).unwrap_or_default();
        stats.estimates_computed = self.ctx.estimator.computed.load(Ordering::Relaxed);
        stats.estimate_cache_hits = self.ctx.estimator.hits.load(Ordering::Relaxed);
        stats
    }
}
