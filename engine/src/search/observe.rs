//! How a search reports as it goes: its progress after each candidate, each layer
//! schedule and placement run ([`Observer`]), and the counters of its work ([`Stats`]).

use super::record::Evaluated;
pub use super::record::Stats;
use crate::schedule::Method;
use serde::Serialize;

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
