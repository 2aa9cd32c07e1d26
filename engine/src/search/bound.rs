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
//! at its best HBM size and domain, the mean over models of their throughputs, each times
//! its objective weight ([`crate::search::SearchInput::objective_weights`]), so the same
//! weighted mean of the models' bounds bounds it. This devices bound ignores memory: a
//! plan that does not fit has no throughput, which the bound does not undercut.
//!
//! With the step model (the Megatron-LM memory model), each plan shape also bounds its
//! plans' steps ([`Floor`]): the micro-batches times the slowest stage's time — at least
//! the mean stage's share of `L`, and at least the blocks of the device holding the most
//! of them —, the bubble, the pipeline's transfers, full recomputation's second forward
//! pass and the data-parallel synchronisation of the largest stage's parameters, all but
//! the layers' makespans independent of the chip — computed once per search
//! ([`Ctx::plan_floors`]), so the bound of a candidate costs one pass over the
//! undominated floors per layer graph. Memory decides which shapes have floors and how
//! their blocks may be split (`step::plan_floor`): a shape none of whose splits fits the
//! largest HBM size has none (a plan that does not fit has no throughput); one whose
//! activations keep blocks off its first devices has its slowest stage's blocks, and
//! its largest stage's parameters, bounded by every split that fits, one floor per
//! number of blocks on the most loaded device. A model's bound is the smaller of the two
//! (the floors see what the devices bound cannot: a replica spread over fewer stages
//! syncs more gradients; a deeper pipeline idles in its bubble; a wide shape that cannot
//! fit without recomputation runs its forward passes twice).
//!
//! The layer instances are the evaluation's own (built through the same memo of the
//! latency model's answers, which the evaluation then finds there), so a candidate whose
//! layers the latency model cannot estimate fails here as it would there.

use super::context::{Ctx, GraphKey, JobError, Run, layer_counts, twins};
use super::evaluate::Shape;
use super::floor::{Floor, Floors, Layers, Skeletons, undominated};
use crate::model::ModelGraph;
use crate::model::OpGraph;
use crate::operators;
use crate::pipeline::PipelineSchedule;
use crate::schedule;
use crate::step::{self, StepInput};
use crate::training::{MemoryModel, Recomputation};
use archplace_plugin_sdk::AcceleratorConfig;
use rayon::prelude::*;
use std::collections::BTreeMap;

/// A stage list of `layers` blocks over `p` stages the step model accepts (inner stages
/// not empty; the ends may be, up to `p = layers + 2`): one split among those its floors
/// bound.
fn spread(layers: u64, p: u64) -> Vec<u64> {
    if p <= layers {
        return (0..p)
            .map(|k| layers / p + u64::from(k < layers % p))
            .collect();
    }
    let mut list = vec![1; p as usize];
    list[0] = 0;
    if p == layers + 2 {
        list[p as usize - 1] = 0;
    }
    list
}

impl Ctx<'_> {
    /// An upper bound on the mean throughput (samples per second) any plan of the search
    /// reaches on chip `c` (see the module's documentation): per model, the smaller of
    /// the devices bound and, with the step model, the best plan shape's ([`Floor`]).
    pub(super) fn bound(&self, c: &AcceleratorConfig) -> Result<f64, JobError> {
        self.bound_of(c, true)
    }

    /// A quicker bound, at least [`bound`](Self::bound): the same without the embedding's
    /// and the head's makespans (each only adds to a step, so leaving them out only
    /// lowers the floors) — a third of the layer bounds to compute. What a proven walk
    /// orders the candidates by before it bounds them exactly, lazily.
    pub(super) fn quick_bound(&self, c: &AcceleratorConfig) -> Result<f64, JobError> {
        self.bound_of(c, false)
    }

    /// [`bound`](Self::bound), with the embedding's and the head's makespans (`ends`) or
    /// without.
    fn bound_of(&self, c: &AcceleratorConfig, ends: bool) -> Result<f64, JobError> {
        let devices = self.input.cluster.devices as f64;
        let batch = self.input.training.global_batch as f64;
        let floors = self.floors.get_or_init(|| self.plan_floors(c));
        let weights = self.input.objective_weights();
        let mut sum = 0.0;
        let shaped_only = self.input.training.memory_model != MemoryModel::Reference;
        let twins = self
            .twins
            .get_or_init(|| self.graphs.iter().map(twins).collect());
        for (m, graphs) in self.graphs.iter().enumerate() {
            // Each graph's layers, bounded once for it and its twins.
            let mut bounded: BTreeMap<GraphKey, (f64, Layers)> = BTreeMap::new();
            // The layer graphs some plan shape can use first (sorted): when their devices
            // bound is already above the best shape's, the model's bound is the shape's
            // and the graphs no shape can use (their plans cannot fit) need no bounding.
            let mut keys: Vec<_> = graphs.keys().collect();
            keys.sort_by_key(|k| (floors[m].get(*k).is_none_or(|f| f.is_empty()), **k));
            // Samples per device-second, the most any of the model's layer graphs allows;
            // samples per second, the most any plan shape allows.
            let (mut rate, mut shaped) = (0.0f64, 0.0f64);
            for key in keys {
                let shapes = floors[m].get(key).map_or(&[][..], Vec::as_slice);
                if shaped_only && shapes.is_empty() && devices * rate >= shaped {
                    break;
                }
                let g = &graphs[key];
                let (micro_batch, width, .., context_parallel, _) = *key;
                let twin = twins[m].get(key).copied().unwrap_or(*key);
                let (device_seconds, layers) = match bounded.get(&twin) {
                    Some(&known) => known,
                    None => {
                        let found = self.layer_seconds(g, width, c, ends)?;
                        bounded.insert(twin, found);
                        found
                    }
                };
                let per_sample =
                    context_parallel.max(1) as f64 * device_seconds / micro_batch as f64;
                rate = rate.max(if per_sample > 0.0 {
                    1.0 / per_sample
                } else {
                    f64::INFINITY
                });
                for f in shapes {
                    let step = f.at(&layers);
                    shaped = shaped.max(if step > 0.0 {
                        batch / step
                    } else {
                        f64::INFINITY
                    });
                }
            }
            let mut model = devices * rate;
            if shaped_only {
                model = model.min(shaped);
            }
            sum += weights.get(m).copied().unwrap_or(1.0) * model;
        }
        Ok(sum / self.graphs.len().max(1) as f64)
    }

    /// One micro-batch of `g` on chip `c`, at least: the device-seconds (each layer's
    /// forward and backward makespan bound times the devices its stage spans: `width` for
    /// a tensor-parallel layer, one otherwise) and the [`Layers`] the floors read (`L`, the
    /// bounds' sum; `R`, the blocks' forward bounds, which full recomputation runs again —
    /// the step model reruns a block's whole forward pass, `LayerTiming::rerun`; one
    /// block's, the least of the block kinds').
    fn layer_seconds(
        &self,
        g: &ModelGraph,
        width: u64,
        c: &AcceleratorConfig,
        ends: bool,
    ) -> Result<(f64, Layers), JobError> {
        let counts = layer_counts(g);
        let skeletons = self.skeletons.get_or_init(|| self.skeletons());
        let mut device_seconds = 0.0;
        let mut layers = Layers::default();
        // The least block kind's (forward and backward, forward).
        let mut block: Option<(f64, f64)> = None;
        for (slot, layer) in g.distinct().into_iter().enumerate() {
            if counts[slot] == 0 || (!ends && matches!(slot, EMBEDDING_SLOT | HEAD_SLOT)) {
                continue;
            }
            let mut pass = [0.0; 2];
            for (k, graph) in [&layer.forward, &layer.backward].into_iter().enumerate() {
                let bound = match skeletons.get(&address(graph)) {
                    Some(Some(skeleton)) => {
                        let tasks = self.estimator.graph_tasks(graph, c)?;
                        skeleton.makespan_lower_bound(&tasks, c.tensor_cores, c.vector_cores)
                    }
                    _ => schedule::makespan_lower_bound(&self.estimator.instance(graph, c)?),
                };
                pass[k] =
                    bound.map_err(|e| JobError::Infeasible(format!("layer schedule: {e}")))?;
            }
            let both = pass[0] + pass[1];
            // The block and the dense block: the layers full recomputation runs again.
            if matches!(slot, BLOCK_SLOT | DENSE_BLOCK_SLOT) {
                layers.rerun += counts[slot] as f64 * pass[0];
                block = Some(block.map_or((both, pass[0]), |(b, f)| (b.min(both), f.min(pass[0]))));
            }
            let devices = if layer.tensor_parallel { width } else { 1 };
            device_seconds += counts[slot] as f64 * devices as f64 * both;
            layers.seconds += counts[slot] as f64 * both;
        }
        (layers.block, layers.block_forward) = block.unwrap_or_default();
        Ok((device_seconds, layers))
    }

    /// The skeleton of every forward and backward graph of every distinct layer of every
    /// layer graph of the search.
    fn skeletons(&self) -> Skeletons {
        let mut out = Skeletons::default();
        for graphs in &self.graphs {
            let mut keys: Vec<&GraphKey> = graphs.keys().collect();
            keys.sort_unstable();
            for g in keys.into_iter().map(|k| &graphs[k]) {
                for layer in g.distinct() {
                    for graph in [&layer.forward, &layer.backward] {
                        out.entry(address(graph)).or_insert_with(|| {
                            operators::skeleton(graph, self.input.training.execution).ok()
                        });
                    }
                }
            }
        }
        out
    }

    /// Every plan shape's floor of every placement run at every scale-up domain, by model
    /// and layer graph (empty with the reference's memory model, whose pricing is not the
    /// step model's). Chip-independent, computed once per search: `c` fills the step
    /// input's chip, which no floor reads.
    fn plan_floors(&self, c: &AcceleratorConfig) -> Floors<GraphKey> {
        let mut out: Floors<GraphKey> = vec![BTreeMap::new(); self.graphs.len()];
        if self.input.training.memory_model == MemoryModel::Reference {
            return out;
        }
        let mut jobs: Vec<(Run, GraphKey)> = Vec::new();
        for run in self.groups() {
            for domain in 0..self.input.cluster.networks().len() {
                let run = Run { domain, ..run };
                jobs.extend(self.run_keys(&run).into_iter().map(|k| (run, k)));
            }
        }
        let found: Vec<Vec<Floor>> = jobs
            .par_iter()
            .map(|(run, key)| self.shape_floors(run, key, c))
            .collect();
        for ((run, key), floors) in jobs.into_iter().zip(found) {
            out[run.model].entry(key).or_default().extend(floors);
        }
        for graphs in &mut out {
            for floors in graphs.values_mut() {
                *floors = undominated(std::mem::take(floors));
            }
        }
        out
    }

    /// The floors of `run`'s plan shapes at width `key.1`: every `p` stages of `v` chunks
    /// (1 and the training's interleavings) under each schedule the search prices them
    /// with (its bubble's floor, `PipelineSchedule::bubble_floor`) and `d` replicas on at most the cluster's
    /// devices that the step model accepts and whose state fits the largest HBM size.
    fn shape_floors(&self, run: &Run, key: &GraphKey, c: &AcceleratorConfig) -> Vec<Floor> {
        let tr = &self.input.training;
        let cluster = &self.input.cluster;
        let g = &self.graphs[run.model][key];
        let config = &self.input.models[run.model].config;
        let hbm = cluster.hbm_bytes.iter().copied().max().unwrap_or(0);
        let (t, layers) = (key.1, config.layers);
        let replica = t.saturating_mul(run.context_parallel.max(1)).max(1);
        let mut interleavings = vec![1];
        interleavings.extend(tr.pipeline_interleaving.iter().filter(|&&v| v > 1));
        interleavings.sort_unstable();
        interleavings.dedup();
        let shape = Shape {
            tensor_parallel: t,
            pipeline_parallel: 1,
            data_parallel: 1,
            interleaving: 1,
            schedule: PipelineSchedule::OneFOneB,
        };
        let mut input = StepInput {
            model: config.clone(),
            plan: self.shape_plan(run, shape, None),
            accelerator: *c,
            hbm_bytes: hbm,
            devices: cluster.devices,
            global_batch: tr.global_batch,
            network: *self.network(run),
            peak_flops_per_second: None,
            schedule: self.input.schedule,
            execution: tr.execution,
        };
        let mut floors = Vec::new();
        let most_stages = (cluster.devices / replica).min(layers.saturating_add(2));
        let shapes: Vec<(u64, PipelineSchedule)> = interleavings
            .iter()
            .flat_map(|&v| self.schedules_for(v).into_iter().map(move |s| (v, s)))
            .collect();
        for &(v, schedule) in &shapes {
            for p in 1..=most_stages {
                for d in 1..=cluster.devices / (replica * p) {
                    // `step::problems` rejects these too, but only after the plan is
                    // built; and `n` below needs the division exact.
                    let per_step = run.micro_batch.saturating_mul(d);
                    if per_step == 0 || !tr.global_batch.is_multiple_of(per_step) {
                        continue;
                    }
                    let shape = Shape {
                        tensor_parallel: t,
                        pipeline_parallel: p,
                        data_parallel: d,
                        interleaving: v,
                        schedule,
                    };
                    let stage_layers = (v == 1).then(|| spread(layers, p));
                    input.plan = self.shape_plan(run, shape, stage_layers);
                    input.devices = self.devices_for(&input.plan);
                    if !step::problems(&input).is_empty() {
                        continue;
                    }
                    let floor = step::plan_floor(&input, g);
                    if floor.state_bytes > hbm as f64 {
                        continue;
                    }
                    let n = (tr.global_batch / per_step) as f64;
                    // Micro-batch slots of the pipeline: `n` plus the bubble's least.
                    let slots = n + schedule.bubble_floor(p, v);
                    floors.extend(floor.splits.iter().map(|split| Floor {
                        slots,
                        stages: p as f64,
                        most_blocks: schedule.visited_share(v) * split.most_blocks as f64,
                        fixed: slots * floor.transfer_seconds + split.exposed_sync_seconds,
                        hideable: split.hideable_sync_seconds,
                        reruns: run.recompute == Recomputation::Full,
                    }));
                }
            }
        }
        floors
    }
}

/// [`ModelGraph::distinct`]'s slots: the embedding, the repeated block, the head, the
/// dense block.
const EMBEDDING_SLOT: usize = 0;
const BLOCK_SLOT: usize = 1;
const HEAD_SLOT: usize = 2;
const DENSE_BLOCK_SLOT: usize = 3;

/// Where `graph` is: its key among [`Skeletons`].
fn address(graph: &OpGraph) -> usize {
    std::ptr::from_ref(graph) as usize
}
