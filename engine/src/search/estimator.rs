//! The durations of a layer graph's operators on a candidate: the latency model's answers,
//! asked in batches and kept for the search.

use crate::execution::Execution;
use crate::model::OpGraph;
use crate::operators::{estimate, instance_with, tasks_with};
use crate::schedule::{Instance, Task};
use archplace_plugin_sdk::{
    AcceleratorConfig, CoreConfig, EstimateError, LatencyModel, Op, OpCost,
};
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// Durations of a layer graph's operators on a candidate, from the latency model through
/// the shared memo.
pub(super) struct Estimator<'a> {
    pub(super) model: &'a dyn LatencyModel,
    pub(super) execution: Execution,
    /// By core configuration, then operator: a lookup borrows its operator (a flat key
    /// would clone it, allocation and all), and hashes with FxHash — a lookup per operator
    /// per layer instance, tens of millions in a proven search's bound pass, where cloning
    /// and SipHash took a third of its time.
    pub(super) cache: RwLock<Memo>,
    /// Each search graph's operators' numbers in the memo, by the graph's address (see
    /// [`Estimator::graph_tasks`]).
    pub(super) graph_ids: RwLock<FxHashMap<usize, Arc<[usize]>>>,
    /// Operators asked of the latency model, and those the memo answered.
    pub(super) computed: AtomicU64,
    pub(super) hits: AtomicU64,
}

/// The latency model's answers, by core configuration and operator. Operators are
/// numbered once (`ids`) and the answers keyed by number: a proven search's bound pass
/// memoises every operator on every core configuration of the space, and a cloned
/// operator per entry (its fused list a heap allocation of its own) was most of the memo.
#[derive(Default)]
pub(super) struct Memo {
    /// Every operator the memo has an answer for, numbered in the order first seen (the
    /// numbers never leave the memo, so that order does not matter).
    ids: FxHashMap<Op, usize>,
    /// By core configuration, then operator number.
    costs: FxHashMap<CoreConfig, FxHashMap<usize, OpCost>>,
}

impl Memo {
    /// The memoised answer for `op` on `core`.
    fn lookup(&self, core: &CoreConfig, op: &Op) -> Option<OpCost> {
        let id = self.ids.get(op)?;
        self.costs.get(core)?.get(id).copied()
    }

    /// Keeps `cost` as the answer for `op` on `core`.
    fn insert(&mut self, core: CoreConfig, op: &Op, cost: OpCost) {
        let next = self.ids.len();
        let id = match self.ids.get(op) {
            Some(&id) => id,
            None => {
                self.ids.insert(op.clone(), next);
                next
            }
        };
        self.costs.entry(core).or_default().insert(id, cost);
    }
}

impl Estimator<'_> {
    /// The memo's answer for `op` on `core`, if it has one.
    fn memoised(&self, core: &CoreConfig, op: &Op) -> Result<Option<OpCost>, EstimateError> {
        let memo = self
            .cache
            .read()
            .map_err(|_| EstimateError::Internal("estimate cache poisoned".into()))?;
        Ok(memo.lookup(core, op))
    }

    pub(super) fn cost(&self, core: &CoreConfig, op: &Op) -> Result<OpCost, EstimateError> {
        let found = self.memoised(core, op)?;
        if let Some(c) = found {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(c);
        }
        let c = estimate(self.model, core, std::slice::from_ref(op))?[0];
        self.computed.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut w) = self.cache.write() {
            w.insert(*core, op, c);
        }
        Ok(c)
    }

    /// An operator's cost that [`Estimator::instance`] already fetched (the step model's
    /// joules of a scheduled layer), without counting it as a hit of the memo; asked of the
    /// model through [`Estimator::cost`] when it is not there.
    pub(super) fn known(&self, core: &CoreConfig, op: &Op) -> Result<OpCost, EstimateError> {
        let found = self.memoised(core, op)?;
        match found {
            Some(c) => Ok(c),
            None => self.cost(core, op),
        }
    }

    /// The layer's schedule instance on `c`. Operators not yet memoised are estimated
    /// first, in one batched call per core configuration: a plugin call costs far more
    /// than an operator in a batch. When the memo has them all — nearly always once a
    /// search is under way, and a proven search's bound pass builds an instance of every
    /// layer graph of every candidate — the instance is built in one pass under one read
    /// lock.
    pub(super) fn instance(
        &self,
        graph: &OpGraph,
        c: &AcceleratorConfig,
    ) -> Result<Instance, EstimateError> {
        self.built(|cost| instance_with(graph, c, self.execution, cost))
    }

    /// The operators of [`Estimator::instance`]'s instance without its dependencies
    /// ([`tasks_with`]), from the memo alike: what a proven search's bound pass needs of
    /// a layer whose structure it has already ([`crate::schedule::Skeleton`]).
    pub(super) fn tasks(
        &self,
        graph: &OpGraph,
        c: &AcceleratorConfig,
    ) -> Result<Vec<Task>, EstimateError> {
        self.built(|cost| tasks_with(graph, c, self.execution, cost))
    }

    /// [`tasks`](Self::tasks) of one of the search's own layer graphs — which stay where
    /// they are for the search's life, so their address names them, as the bound's
    /// skeletons are named — with the operators' numbers in the memo looked up once per
    /// graph rather than hashed per operator and candidate: the bound pass asks for every
    /// graph on every candidate, and hashing operators was a sixth of it. The same tasks,
    /// bit for bit (the memo's answers); an operator the memo lacks goes the slow way.
    pub(super) fn graph_tasks(
        &self,
        graph: &OpGraph,
        c: &AcceleratorConfig,
    ) -> Result<Vec<Task>, EstimateError> {
        let address = std::ptr::from_ref(graph) as usize;
        let known = self
            .graph_ids
            .read()
            .ok()
            .and_then(|ids| ids.get(&address).cloned());
        let Some(ids) = known else {
            let tasks = self.tasks(graph, c)?;
            if let Ok(memo) = self.cache.read() {
                let ids: Arc<[usize]> = graph
                    .nodes
                    .iter()
                    .map(|n| memo.ids.get(&n.op).copied().unwrap_or(usize::MAX))
                    .collect();
                if let Ok(mut w) = self.graph_ids.write() {
                    w.insert(address, ids);
                }
            }
            return Ok(tasks);
        };
        {
            let memo = self
                .cache
                .read()
                .map_err(|_| EstimateError::Internal("estimate cache poisoned".into()))?;
            // The cost closure is asked in node order (each node once or twice): a cursor
            // follows it by the operators' addresses; the few core configurations a
            // candidate has are looked up once each.
            let mut cursor = 0;
            let mut cores: Vec<(CoreConfig, Option<&FxHashMap<usize, OpCost>>)> =
                Vec::with_capacity(4);
            let mut complete = true;
            let mut hits = 0;
            let out = tasks_with(graph, c, self.execution, |core: &CoreConfig, op: &Op| {
                while cursor < graph.nodes.len() && !std::ptr::eq(op, &graph.nodes[cursor].op) {
                    cursor += 1;
                }
                let id = ids.get(cursor).copied().unwrap_or(usize::MAX);
                let costs = match cores.iter().find(|(k, _)| k == core) {
                    Some(&(_, costs)) => costs,
                    None => {
                        let costs = memo.costs.get(core);
                        cores.push((*core, costs));
                        costs
                    }
                };
                let found = costs.and_then(|m| m.get(&id)).copied();
                match found.or_else(|| memo.lookup(core, op)) {
                    Some(cost) => {
                        hits += 1;
                        Ok(cost)
                    }
                    None => {
                        complete = false;
                        Ok(OpCost::new(0.0, 0.0))
                    }
                }
            });
            if complete {
                self.hits.fetch_add(hits, Ordering::Relaxed);
                return out;
            }
        }
        self.tasks(graph, c)
    }

    /// What `build` makes of a layer's operators with their costs: from the memo in
    /// one pass under one read lock when it has them all; otherwise the missing ones are
    /// estimated first (one batched call per core configuration) and `build` runs again.
    fn built<T>(
        &self,
        build: impl Fn(
            &mut dyn FnMut(&CoreConfig, &Op) -> Result<OpCost, EstimateError>,
        ) -> Result<T, EstimateError>,
    ) -> Result<T, EstimateError> {
        let mut missing: BTreeMap<CoreConfig, Vec<Op>> = BTreeMap::new();
        {
            let cache = self
                .cache
                .read()
                .map_err(|_| EstimateError::Internal("estimate cache poisoned".into()))?;
            let zero = OpCost::new(0.0, 0.0);
            let mut hits = 0;
            let out = build(&mut |core, op| match cache.lookup(core, op) {
                Some(cost) => {
                    hits += 1;
                    Ok(cost)
                }
                None => {
                    missing.entry(*core).or_default().push(op.clone());
                    Ok(zero)
                }
            });
            if missing.is_empty() {
                self.hits.fetch_add(hits, Ordering::Relaxed);
                return out;
            }
        }
        let mut fetched = 0;
        for (core, mut ops) in missing {
            ops.sort();
            ops.dedup();
            let costs = estimate(self.model, &core, &ops)?;
            fetched += ops.len() as u64;
            if let Ok(mut w) = self.cache.write() {
                for (op, cost) in ops.iter().zip(costs) {
                    w.insert(core, op, cost);
                }
            }
        }
        self.computed.fetch_add(fetched, Ordering::Relaxed);
        let out = build(&mut |core, op| self.cost(core, op));
        // The second pass found the prefetched operators in the memo: not hits.
        self.hits.fetch_sub(
            fetched.min(self.hits.load(Ordering::Relaxed)),
            Ordering::Relaxed,
        );
        out
    }
}
