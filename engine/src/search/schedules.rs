//! A candidate's layer schedules: every distinct layer graph's instance solved once, through
//! the search's memo of schedules (`memo.rs`; and a pool's, [`SharedSchedules`]).

use super::context::{Ctx, JobError};
use super::memo::{ScheduleMemo, Scheduled, Solved};
use super::observe::ScheduleEvent;
use crate::model::OpGraph;
use crate::schedule::{self, CoresTrace, Instance, Method};
use crate::step;
use archplace_plugin_sdk::AcceleratorConfig;
use rayon::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

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
                    .overlaps()
                    .then_some(solved.exposed_link),
            },
            |core, op| self.estimator.known(core, op),
        )?;
        Ok(Scheduled {
            seconds: solved.makespan,
            link_seconds: timing.link,
            util: solved.util,
            optimal: solved.optimal,
            gap: solved.gap,
            timing,
        })
    }
}
