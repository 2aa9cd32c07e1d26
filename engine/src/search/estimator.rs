//! The durations of a layer graph's operators on a candidate: the latency model's answers,
//! asked in batches and kept for the search.

use crate::execution::Execution;
use crate::model::OpGraph;
use crate::operators::{estimate, instance_with};
use crate::schedule::Instance;
use archplace_plugin_sdk::{
    AcceleratorConfig, CoreConfig, EstimateError, LatencyModel, Op, OpCost,
};
use std::collections::{BTreeMap, HashMap};
use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// Durations of a layer graph's operators on a candidate, from the latency model through
/// the shared memo.
pub(super) struct Estimator<'a> {
    pub(super) model: &'a dyn LatencyModel,
    pub(super) execution: Execution,
    pub(super) cache: RwLock<HashMap<(CoreConfig, Op), OpCost>>,
    /// Operators asked of the latency model, and those the memo answered.
    pub(super) computed: AtomicU64,
    pub(super) hits: AtomicU64,
}

impl Estimator<'_> {
    pub(super) fn cost(&self, core: &CoreConfig, op: &Op) -> Result<OpCost, EstimateError> {
        let key = (*core, op.clone());
        if let Some(c) = self
            .cache
            .read()
            .map_err(|_| EstimateError::Internal("estimate cache poisoned".into()))?
            .get(&key)
        {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(*c);
        }
        let c = estimate(self.model, core, std::slice::from_ref(op))?[0];
        self.computed.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut w) = self.cache.write() {
            w.insert(key, c);
        }
        Ok(c)
    }

    /// An operator's cost that [`Estimator::instance`] already fetched (the step model's
    /// joules of a scheduled layer), without counting it as a hit of the memo; asked of the
    /// model through [`Estimator::cost`] when it is not there.
    pub(super) fn known(&self, core: &CoreConfig, op: &Op) -> Result<OpCost, EstimateError> {
        let found = self
            .cache
            .read()
            .map_err(|_| EstimateError::Internal("estimate cache poisoned".into()))?
            .get(&(*core, op.clone()))
            .copied();
        match found {
            Some(c) => Ok(c),
            None => self.cost(core, op),
        }
    }

    /// The layer's schedule instance on `c`. Operators not yet memoised are estimated
    /// first, in one batched call per core configuration: a plugin call costs far more
    /// than an operator in a batch.
    pub(super) fn instance(
        &self,
        graph: &OpGraph,
        c: &AcceleratorConfig,
    ) -> Result<Instance, EstimateError> {
        let mut missing: BTreeMap<CoreConfig, Vec<Op>> = BTreeMap::new();
        {
            let cache = self
                .cache
                .read()
                .map_err(|_| EstimateError::Internal("estimate cache poisoned".into()))?;
            let zero = OpCost::new(0.0, 0.0);
            let _ = instance_with(graph, c, self.execution, |core, op| {
                if !cache.contains_key(&(*core, op.clone())) {
                    missing.entry(*core).or_default().push(op.clone());
                }
                Ok(zero)
            });
        }
        let mut fetched = 0;
        for (core, mut ops) in missing {
            ops.sort();
            ops.dedup();
            let costs = estimate(self.model, &core, &ops)?;
            fetched += ops.len() as u64;
            if let Ok(mut w) = self.cache.write() {
                for (op, cost) in ops.into_iter().zip(costs) {
                    w.insert((core, op), cost);
                }
            }
        }
        self.computed.fetch_add(fetched, Ordering::Relaxed);
        let inst = instance_with(graph, c, self.execution, |core, op| self.cost(core, op));
        // The second pass found the prefetched operators in the memo: not hits.
        self.hits.fetch_sub(
            fetched.min(self.hits.load(Ordering::Relaxed)),
            Ordering::Relaxed,
        );
        inst
    }
}
