//! An upper bound on a candidate's score, valid for every plan the search would try on
//! it: what a proven search orders and prunes candidates by.
//!
//! Why it holds. Take any plan of a model that the search prices: micro-batch `m`,
//! tensor-parallel width `t`, context-parallel size `CP`, data-parallel degree `d`, `p`
//! pipeline stages (each of `v` chunks), on `t · CP · d · p ≤ N` devices. Every layer sits
//! in one stage, and each stage runs, per micro-batch, the forward and backward schedule
//! of each of its layers: however the step model overlaps communication, it hides none of
//! a schedule's makespan (a layer's compute and its tensor-parallel collectives are both
//! counted, `step::pipeline_times`), and recomputation, the bubble, the pipeline's
//! transfers and the data-parallel synchronisation only add. So with `n = B / (m · d)`
//! micro-batches per replica, the step takes at least `n` times the slowest stage's load,
//! which is at least the mean over the `p` stages of the sum of every layer's two
//! makespans:
//!
//! `step ≥ B / (m·d·p) · Σ_layers (fwd + bwd) ≥ B · t · CP · Σ_layers (fwd + bwd) / (m · N)`,
//!
//! and the model's throughput `B / step` is at most `N · m / (t · CP · Σ (fwd + bwd))`.
//! The reference system's pricing (time per batch = the bottleneck stage's load times
//! `micro-batches + stages − 1`, plus the all-reduce; a stage 1 or `t` devices wide) obeys
//! the same inequality when a layer that is not tensor-parallel counts one device, not
//! `t`. Each makespan is at least [`schedule::makespan_lower_bound`] of its instance (the
//! schedule the search solves is one of the instance's schedules). The bound of a model is
//! the largest over the layer graphs the search builds for it (every micro-batch, width,
//! precision, context-parallel size, expert-parallel width, domain); a candidate's score is,
//! at its best HBM size and domain, the mean over models of their throughputs, so the mean
//! of the models' bounds bounds it. Memory is ignored: a plan that does not fit has no
//! throughput, which the bound does not undercut.
//!
//! The layer instances are the evaluation's own (built through the same memo of the
//! latency model's answers, which the evaluation then finds there), so a candidate whose
//! layers the latency model cannot estimate fails here as it would there.

use super::context::{Ctx, JobError};
use crate::model::{DISTINCT_LAYERS, ModelGraph};
use crate::schedule;
use archplace_plugin_sdk::AcceleratorConfig;

impl Ctx<'_> {
    /// An upper bound on the mean throughput (samples per second) any plan of the search
    /// reaches on chip `c` (see the module's documentation).
    pub(super) fn bound(&self, c: &AcceleratorConfig) -> Result<f64, JobError> {
        let devices = self.input.cluster.devices as f64;
        let mut sum = 0.0;
        for graphs in &self.graphs {
            let mut keys: Vec<_> = graphs.keys().collect();
            keys.sort();
            // Samples per device-second, the most any of the model's layer graphs allows.
            let mut rate = 0.0f64;
            for key in keys {
                let g = &graphs[key];
                let (micro_batch, width, .., context_parallel, _) = *key;
                let seconds = self.device_seconds(g, width, c)?;
                let per_sample = context_parallel.max(1) as f64 * seconds / micro_batch as f64;
                rate = rate.max(if per_sample > 0.0 {
                    1.0 / per_sample
                } else {
                    f64::INFINITY
                });
            }
            sum += devices * rate;
        }
        Ok(sum / self.graphs.len().max(1) as f64)
    }

    /// The device-seconds one micro-batch of `g` takes at least on chip `c` (each layer's
    /// forward and backward makespan bound, times the devices its stage spans: `width`
    /// for a tensor-parallel layer, one otherwise).
    fn device_seconds(
        &self,
        g: &ModelGraph,
        width: u64,
        c: &AcceleratorConfig,
    ) -> Result<f64, JobError> {
        let counts = layer_counts(g);
        let mut seconds = 0.0;
        for (slot, layer) in g.distinct().into_iter().enumerate() {
            if counts[slot] == 0 {
                continue;
            }
            let mut both = 0.0;
            for graph in [&layer.forward, &layer.backward] {
                let inst = self.estimator.instance(graph, c)?;
                both += schedule::makespan_lower_bound(&inst)
                    .map_err(|e| JobError::Infeasible(format!("layer schedule: {e}")))?;
            }
            let devices = if layer.tensor_parallel { width } else { 1 };
            seconds += counts[slot] as f64 * devices as f64 * both;
        }
        Ok(seconds)
    }
}

/// How many of each distinct layer ([`ModelGraph::distinct`]'s order) the model has: one
/// embedding and one head, the repeated blocks, the dense blocks, the
/// multi-token-prediction modules (one layer) — zero for a slot the model lacks.
fn layer_counts(g: &ModelGraph) -> [u64; DISTINCT_LAYERS] {
    let dense = if g.dense_block.is_some() {
        g.dense_blocks
    } else {
        0
    };
    [
        1,
        g.blocks.saturating_sub(dense),
        1,
        dense,
        u64::from(g.mtp.is_some()),
    ]
}
