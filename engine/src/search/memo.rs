//! The search's memo of layer schedules: what a candidate's layer schedule is
//! ([`Timed`], [`Scheduled`], [`Solved`]), the bounded memo by each instance's exact content
//! ([`ScheduleMemo`], with the cores' traces beside it) and a pool's shared one
//! ([`SharedSchedules`]). Below the search's context, which holds them; the solving is
//! `schedules.rs`.

use crate::schedule::{CoresTrace, Instance};
use crate::step::GraphTiming;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A scheduled layer: forward and backward seconds and utilisations.
#[derive(Debug, Clone, Copy)]
pub(super) struct Timed {
    pub(super) fwd: Scheduled,
    pub(super) bwd: Scheduled,
}

/// What the search keeps of one layer schedule.
#[derive(Debug, Clone, Copy)]
pub(super) struct Scheduled {
    pub(super) seconds: f64,
    /// Of the makespan, the link operators' durations (tensor-parallel collectives).
    pub(super) link_seconds: f64,
    /// Tensor- and vector-core utilisation.
    pub(super) util: (f64, f64),
    pub(super) optimal: bool,
    pub(super) gap: f64,
    /// The schedule as the step model takes it (the same numbers, and the joules).
    pub(super) timing: GraphTiming,
}

/// A layer schedule's solution, as far as the search uses it: what a memo of schedules
/// (the search's own, or a pool's [`SharedSchedules`]) keeps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Solved {
    pub makespan: f64,
    /// Busy fractions of the tensor and vector cores.
    pub util: (f64, f64),
    pub optimal: bool,
    pub gap: f64,
    /// The communication the schedule leaves exposed
    /// ([`crate::schedule::Schedule::exposed_link_seconds`]).
    pub exposed_link: f64,
}

/// Layer schedules solved elsewhere for the same search (a pool's other workers), asked
/// after the search's own memo misses and told of every schedule solved here. A key is an
/// instance's exact content (see `ScheduleMemo`); the solver options are the search's, so
/// an implementation shared between searches must tell them apart. The solver is
/// deterministic (node limits), so an answer from elsewhere is the one solving would
/// give; schedules the wall-clock safety net stopped are never put.
pub trait SharedSchedules: Sync {
    /// The known solutions of `keys`, in order (`None`: not known, or not reachable).
    fn get(&self, keys: &[&[u64]]) -> Vec<Option<Solved>>;
    /// Schedules just solved here.
    fn put(&self, solved: &[(&[u64], Solved)]);
}

/// Layer schedules already solved, by their instance's exact content (cores, each
/// operator's resource, durations and memory time, the dependencies): candidates that differ in what a
/// layer's operators do not feel — chips of one area whose MAC arrays are `256 × 64` and
/// `128 × 128`, say — and the layers of one candidate that come out the same at several
/// widths share a schedule (17% of the GPT-3 example search's). Bounded: two generations
/// of [`ScheduleMemo::GENERATION`] instances, the older dropped when the newer fills — the
/// search visits chips of one area together, so the reuse is among recent ones. The solver
/// is deterministic (node limits), so a reused schedule is the one solving again would
/// give.
///
/// Beside it, the cores' solutions ([`CoresTrace`]) by the instance's content less its
/// memory times, as many: chips that differ only in their buffer solve each layer's cores
/// once (the memory times floor each part's makespan and decide whether its list schedule
/// settles it, nothing else), and each gets the schedule solving it alone would give.
#[derive(Default)]
pub(crate) struct ScheduleMemo {
    generations: Mutex<[HashMap<Vec<u64>, Solved>; 2]>,
    traces: Mutex<[HashMap<Vec<u64>, Arc<CoresTrace>>; 2]>,
}

impl ScheduleMemo {
    /// Instances per generation of solutions.
    pub(crate) const GENERATION: usize = 2048;

    /// Cores' traces per generation: fewer than solutions, each larger. Chips that differ
    /// only in their buffer come close together in a proven walk (their bounds are close):
    /// with 1,024 the GPT-3 example's proven search takes 448 schedules from another
    /// buffer's MIP (687 with 2,048, 1.5 s faster, at twice the memory the estimate counts
    /// for traces).
    pub(crate) const TRACE_GENERATION: usize = 1024;

    /// The instance's exact content as words: every field the solver reads — the memory
    /// times too, which floor each part's makespan (chips that differ only in their
    /// buffer have the same core times and different memory times; keyed without them,
    /// one chip's schedule was reused for the other).
    pub(super) fn key(inst: &Instance) -> Vec<u64> {
        Self::words(inst, true)
    }

    /// The instance's content less its memory times: what its [`CoresTrace`] depends on.
    pub(super) fn cores_key(inst: &Instance) -> Vec<u64> {
        Self::words(inst, false)
    }

    fn words(inst: &Instance, memory: bool) -> Vec<u64> {
        let per_task = if memory { 4 } else { 3 };
        let mut key = Vec::with_capacity(3 + per_task * inst.tasks.len() + inst.edges.len());
        key.extend([
            u64::from(inst.tensor_cores),
            u64::from(inst.vector_cores),
            inst.tasks.len() as u64,
        ]);
        for t in &inst.tasks {
            key.extend([t.resource as u64, t.single.to_bits(), t.parallel.to_bits()]);
            if memory {
                key.push(t.memory.to_bits());
            }
        }
        key.extend(
            inst.edges
                .iter()
                .map(|&(a, b)| ((a as u64) << 32) | b as u64),
        );
        key
    }

    pub(super) fn get(&self, key: &[u64]) -> Option<Solved> {
        let g = self.generations.lock().ok()?;
        g[0].get(key).or_else(|| g[1].get(key)).copied()
    }

    pub(super) fn insert(&self, key: Vec<u64>, solved: Solved) {
        if let Ok(mut g) = self.generations.lock() {
            if g[0].len() >= Self::GENERATION {
                g[1] = std::mem::take(&mut g[0]);
            }
            g[0].insert(key, solved);
        }
    }

    /// The cores' trace of instances of content `cores_key`, a new one (remembered) if none
    /// is known.
    pub(super) fn trace(&self, cores_key: Vec<u64>) -> Arc<CoresTrace> {
        let Ok(mut g) = self.traces.lock() else {
            return Arc::default();
        };
        if let Some(t) = g[0].get(&cores_key).or_else(|| g[1].get(&cores_key)) {
            return Arc::clone(t);
        }
        if g[0].len() >= Self::TRACE_GENERATION {
            g[1] = std::mem::take(&mut g[0]);
        }
        let t = Arc::<CoresTrace>::default();
        g[0].insert(cores_key, Arc::clone(&t));
        t
    }
}
