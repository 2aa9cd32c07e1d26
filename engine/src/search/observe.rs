//! How a search reports as it goes: its progress after each candidate, each layer
//! schedule and placement run ([`Observer`]), and the counters of its work ([`Stats`]).

use super::record::Evaluated;
use crate::schedule::Method;
use crate::space::Strategy;
use serde::{Deserialize, Serialize};

/// Counters of the work done.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Stats {
    /// How the space was walked.
    pub strategy: Strategy,
    pub candidates_evaluated: usize,
    pub candidates_failed: usize,
    pub buckets_visited: usize,
    pub converged: bool,
    pub cancelled: bool,
    /// A proven search: candidates bounded (every one, unless cancelled), those the
    /// latency model could not estimate while bounding (they fail evaluation too: never
    /// the best), and those pruned — bounded below the best, never evaluated.
    pub candidates_bounded: usize,
    pub candidates_failed_bound: usize,
    pub candidates_pruned: usize,
    /// The largest bound of a candidate not evaluated (pruned): no chip left out of the
    /// evaluation can reach it. `None` when every bounded candidate was evaluated.
    pub largest_remaining_bound_samples_per_second: Option<f64>,
    /// The best is the best chip of the whole space under the model: a proven search
    /// that ran to its end.
    pub proven: bool,
    /// Wall-clock seconds of the bound pass.
    pub bound_seconds: f64,
    pub estimates_computed: u64,
    pub estimate_cache_hits: u64,
    /// Layer schedules the search used: settled by bounds, by a MIP, or reused.
    pub schedules_solved: u64,
    pub schedules_by_bounds: u64,
    /// Layer schedules whose instance (operator durations, cores, dependencies) had been
    /// solved before, on this candidate or a recent one: the earlier solution, reused.
    #[serde(default)]
    pub schedules_reused: u64,
    pub schedules_by_mip: u64,
    /// Layer schedules a MIP solved for another instance with the same cores' durations
    /// and dependencies (a chip that differs only in its buffer): that MIP's solution,
    /// held to this instance's memory floor — the schedule solving it would give.
    #[serde(default)]
    pub schedules_by_mip_reused: u64,
    /// Layer schedules not proven within the accepted gap (`ScheduleOptions::relative_gap`,
    /// the spec's `schedule_gap`): those the MIP's node limit stopped further from the bound.
    pub schedules_not_proven_optimal: u64,
    pub mip_time_limit_hits: u64,
    pub placements_solved: u64,
    pub estimation_seconds: f64,
    pub scheduling_seconds: f64,
    pub placement_seconds: f64,
    pub total_seconds: f64,
}

impl Stats {
    /// Adds the work counters and timings of `other` (work done elsewhere for this
    /// search: by a pool's workers). The walk's own counts (candidates, buckets,
    /// convergence) are not work and are left alone.
    pub fn add_work(&mut self, other: &Stats) {
        self.estimates_computed += other.estimates_computed;
        self.estimate_cache_hits += other.estimate_cache_hits;
        self.schedules_solved += other.schedules_solved;
        self.schedules_by_bounds += other.schedules_by_bounds;
        self.schedules_reused += other.schedules_reused;
        self.schedules_by_mip += other.schedules_by_mip;
        self.schedules_by_mip_reused += other.schedules_by_mip_reused;
        self.schedules_not_proven_optimal += other.schedules_not_proven_optimal;
        self.mip_time_limit_hits += other.mip_time_limit_hits;
        self.placements_solved += other.placements_solved;
        self.estimation_seconds += other.estimation_seconds;
        self.scheduling_seconds += other.scheduling_seconds;
        self.placement_seconds += other.placement_seconds;
    }

    /// The work counters and timings done since `before`, an earlier snapshot of the same
    /// counters (what a pool's worker reports per item): the inverse of [`Stats::add_work`],
    /// over the same fields; the walk's counts are zero.
    pub fn work_since(&self, before: &Stats) -> Stats {
        Stats {
            estimates_computed: self.estimates_computed - before.estimates_computed,
            estimate_cache_hits: self.estimate_cache_hits - before.estimate_cache_hits,
            schedules_solved: self.schedules_solved - before.schedules_solved,
            schedules_by_bounds: self.schedules_by_bounds - before.schedules_by_bounds,
            schedules_reused: self.schedules_reused - before.schedules_reused,
            schedules_by_mip: self.schedules_by_mip - before.schedules_by_mip,
            schedules_by_mip_reused: self.schedules_by_mip_reused - before.schedules_by_mip_reused,
            schedules_not_proven_optimal: self.schedules_not_proven_optimal
                - before.schedules_not_proven_optimal,
            mip_time_limit_hits: self.mip_time_limit_hits - before.mip_time_limit_hits,
            placements_solved: self.placements_solved - before.placements_solved,
            estimation_seconds: self.estimation_seconds - before.estimation_seconds,
            scheduling_seconds: self.scheduling_seconds - before.scheduling_seconds,
            placement_seconds: self.placement_seconds - before.placement_seconds,
            ..Stats::default()
        }
    }
}

/// Progress as the search goes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Progress {
    pub evaluated: usize,
    /// Candidates in the space (the search may stop before).
    pub total: usize,
    pub bucket: u64,
    /// Smallest area of the current bucket (the bucket's index × the bucket size).
    pub bucket_area_um2: f64,
    pub best_throughput_samples_per_second: Option<f64>,
    pub best_area_um2: Option<f64>,
    /// Operator estimates asked of the latency model so far, and those the memo answered.
    pub estimates_computed: u64,
    pub estimate_cache_hits: u64,
}

/// One layer schedule, as the search settled it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ScheduleEvent {
    pub method: Method,
    /// Bounds, list schedule and (for [`Method::Mip`]) the MIP.
    pub solve_seconds: f64,
    pub hit_time_limit: bool,
    pub proven_optimal: bool,
}

/// Hears how the search goes, for progress displays and metrics. `progress` is called
/// from the searching thread after each candidate; the work events from the worker
/// threads as each piece of work ends (so they must be cheap).
pub trait Observer: Sync {
    fn progress(&self, _p: &Progress) {}
    /// A layer schedule was settled.
    fn schedule(&self, _e: &ScheduleEvent) {}
    /// One run of the placement program (one model, micro-batch and recomputation
    /// setting; every HBM size and width) took `seconds`.
    fn placement(&self, _seconds: f64) {}
    /// A candidate was evaluated (not called for those a resumed search reuses): what a
    /// checkpoint of the search records.
    fn evaluated(&self, _e: &Evaluated) {}
    /// A proven search's bound pass: `done` of `total` candidates bounded (called from
    /// the searching thread, every few hundred candidates and at the end).
    fn bounded(&self, _done: usize, _total: usize) {}
}

impl Observer for () {}
