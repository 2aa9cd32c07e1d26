//! A candidate's layer schedules: every distinct layer graph's instance solved once, through
//! the search's memo of schedules (and a pool's, [`SharedSchedules`]).

use super::context::{Ctx, JobError};
use super::observe::ScheduleEvent;
use crate::model::OpGraph;
use crate::schedule::{self, CoresTrace, Instance, Method};
use crate::step::{self, GraphTiming};
use archplace_plugin_sdk::AcceleratorConfig;
use rayon::prelude::*;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

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
    /// Of the operators' durations (all cores), the attention core's: what selective
    /// recomputation runs again.
    pub(super) core_seconds: f64,
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
    /// ([`schedule::Schedule::exposed_link_seconds`]).
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

impl Ctx<'_> {
    /// `graph`'s schedule instance on `c`, timed as estimation.
    fn instance(&self, graph: &OpGraph, c: &AcceleratorConfig) -> Result<Instance, JobError> {
        let t0 = Instant::now();
        let inst = self.estimator.instance(graph, c)?;
        if let Ok(mut st) = self.stats.lock() {
            st.estimation_seconds += t0.elapsed().as_secs_f64();
        }
        Ok(inst)
    }

    /// Solves one layer schedule through its cores' trace; whether the wall-clock safety
    /// net stopped it.
    fn solve(&self, inst: &Instance, trace: &CoresTrace) -> Result<(Solved, bool), JobError> {
        let t1 = Instant::now();
        let s = schedule::solve_with(inst, &self.input.schedule, trace)
            .map_err(|e| JobError::Infeasible(format!("layer schedule: {e}")))?;
        let t2 = Instant::now();
        if (t2 - t1).as_secs_f64() > 0.25 {
            tracing::debug!(
                seconds = (t2 - t1).as_secs_f64(),
                optimal = s.optimal,
                gap = s.gap,
                instance = %serde_json::to_string(inst).unwrap_or_default(),
                "slow layer schedule"
            );
        }
        if let Ok(mut st) = self.stats.lock() {
            st.scheduling_seconds += (t2 - t1).as_secs_f64();
            match s.method {
                Method::Bounds => st.schedules_by_bounds += 1,
                Method::Mip if s.mips_run > 0 => st.schedules_by_mip += 1,
                Method::Mip => st.schedules_by_mip_reused += 1,
            }
            st.mip_time_limit_hits += u64::from(s.hit_time_limit);
        }
        // A MIP's solution taken from another buffer's schedule is not a solve, as a memo
        // hit is not: the metrics hear of the solves.
        if s.method == Method::Bounds || s.mips_run > 0 {
            self.observer.schedule(&ScheduleEvent {
                method: s.method,
                solve_seconds: s.solve_seconds,
                hit_time_limit: s.hit_time_limit,
                proven_optimal: s.optimal,
            });
        }
        let solved = Solved {
            makespan: s.makespan,
            util: s.utilisation(inst),
            optimal: s.optimal,
            gap: s.gap,
            exposed_link: s.exposed_link_seconds(inst),
        };
        Ok((solved, s.hit_time_limit))
    }

    /// Every layer schedule of a candidate: `graphs` on `c`, in order. Instances first (in
    /// parallel), then each distinct one not in the memo solved once (in parallel), and
    /// the memo updated in order — so what is reused, and the counts, do not depend on
    /// the threads.
    pub(super) fn schedules(
        &self,
        graphs: &[&OpGraph],
        c: &AcceleratorConfig,
    ) -> Result<Vec<Scheduled>, JobError> {
        let instances: Vec<Instance> = graphs
            .par_iter()
            .map(|g| self.instance(g, c))
            .collect::<Vec<_>>()
            .into_iter()
            .collect::<Result<_, _>>()?;
        let keys: Vec<Vec<u64>> = instances.iter().map(ScheduleMemo::key).collect();
        // Per layer: its solution from the memo, or the index of the layer that solves it.
        let mut known: Vec<Result<Solved, usize>> = Vec::with_capacity(keys.len());
        let mut todo: Vec<usize> = Vec::new();
        let mut first: HashMap<&[u64], usize> = HashMap::new();
        for (k, key) in keys.iter().enumerate() {
            if let Some(solved) = self.memo.get(key) {
                known.push(Ok(solved));
            } else if let Some(&by) = first.get(key.as_slice()) {
                known.push(Err(by));
            } else {
                first.insert(key, k);
                todo.push(k);
                known.push(Err(k));
            }
        }
        let mut by_layer: HashMap<usize, Solved> = HashMap::new();
        // What the search's memo lacks, asked of the pool's (in the same fixed order).
        if let Some(shared) = self.shared
            && !todo.is_empty()
        {
            let asked: Vec<&[u64]> = todo.iter().map(|&k| keys[k].as_slice()).collect();
            let found = shared.get(&asked);
            let mut still = Vec::with_capacity(todo.len());
            for (&k, f) in todo
                .iter()
                .zip(found.into_iter().chain(std::iter::repeat(None)))
            {
                match f {
                    Some(s) => {
                        by_layer.insert(k, s);
                        self.memo.insert(keys[k].clone(), s);
                    }
                    None => still.push(k),
                }
            }
            todo = still;
        }
        // What is left, by its cores' trace: instances that differ only in their memory
        // times, one after another in their order (so that which of them runs a MIP does
        // not depend on the threads); the groups in parallel.
        let mut groups: Vec<(Arc<CoresTrace>, Vec<usize>)> = Vec::new();
        let mut group_of: HashMap<Vec<u64>, usize> = HashMap::new();
        for &k in &todo {
            let cores_key = ScheduleMemo::cores_key(&instances[k]);
            if let Some(&g) = group_of.get(&cores_key) {
                groups[g].1.push(k);
            } else {
                group_of.insert(cores_key.clone(), groups.len());
                groups.push((self.memo.trace(cores_key), vec![k]));
            }
        }
        let mut solved: Vec<(usize, (Solved, bool))> = groups
            .par_iter()
            .map(|(trace, ks)| {
                ks.iter()
                    .map(|&k| Ok((k, self.solve(&instances[k], trace)?)))
                    .collect::<Result<Vec<_>, JobError>>()
            })
            .collect::<Vec<_>>()
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .flatten()
            .collect();
        solved.sort_unstable_by_key(|&(k, _)| k);
        let mut new: Vec<(&[u64], Solved)> = Vec::new();
        for &(k, (s, hit_time_limit)) in &solved {
            by_layer.insert(k, s);
            // A schedule the wall-clock safety net stopped depends on the machine: solved
            // again, not reused.
            if !hit_time_limit {
                self.memo.insert(keys[k].clone(), s);
                new.push((keys[k].as_slice(), s));
            }
        }
        if let Some(shared) = self.shared
            && !new.is_empty()
        {
            shared.put(&new);
        }
        let mut out = Vec::with_capacity(graphs.len());
        let (mut not_proven, gap) = (0, self.input.schedule.relative_gap);
        for ((g, inst), known) in graphs.iter().zip(&instances).zip(known) {
            let s = match known {
                Ok(s) => s,
                Err(k) => by_layer[&k],
            };
            not_proven += u64::from(!s.optimal && s.gap > gap);
            out.push(self.scheduled(g, inst, c, s)?);
        }
        if let Ok(mut st) = self.stats.lock() {
            st.schedules_solved += graphs.len() as u64;
            st.schedules_reused += (graphs.len() - todo.len()) as u64;
            st.schedules_not_proven_optimal += not_proven;
        }
        Ok(out)
    }

    /// What the search keeps of the schedule `solved` of `graph`'s instance `inst` on `c`:
    /// timed by the step model's own function, so that a plan the search reports is
    /// priced as `archplace estimate` prices it.
    fn scheduled(
        &self,
        graph: &OpGraph,
        inst: &Instance,
        c: &AcceleratorConfig,
        solved: Solved,
    ) -> Result<Scheduled, JobError> {
        let timing = step::graph_timing(
            graph,
            inst,
            c,
            step::ScheduleOutcome {
                makespan: solved.makespan,
                optimal: solved.optimal,
                gap: solved.gap,
                exposed_link: self
                    .input
                    .training
                    .execution
                    .tensor_parallel_overlap
                    .then_some(solved.exposed_link),
            },
            |core, op| self.estimator.known(core, op),
        )?;
        Ok(Scheduled {
            seconds: solved.makespan,
            core_seconds: timing.attention_core,
            link_seconds: timing.link,
            util: solved.util,
            optimal: solved.optimal,
            gap: solved.gap,
            timing,
        })
    }
}
