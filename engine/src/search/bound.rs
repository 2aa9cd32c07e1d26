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
//! weighted mean of the models' bounds bounds it. Memory is ignored: a plan that does not
//! fit has no throughput, which the bound does not undercut.
//!
//! With the step model (the Megatron-LM memory model), each plan shape also bounds its
//! plans' steps ([`Floor`]): the micro-batches times the mean stage's share of `L`, the
//! bubble, the pipeline's transfers and the data-parallel synchronisation, all but `L`
//! independent of the chip — computed once per search ([`Ctx::plan_floors`]), so the
//! bound of a candidate costs one pass over the undominated floors per layer graph. A
//! shape whose state alone overflows the largest HBM size has none. A model's bound is
//! the smaller of the two (the floors see what the devices bound cannot: a replica spread
//! over fewer stages syncs more gradients; a deeper pipeline idles in its bubble).
//!
//! The layer instances are the evaluation's own (built through the same memo of the
//! latency model's answers, which the evaluation then finds there), so a candidate whose
//! layers the latency model cannot estimate fails here as it would there.

use super::context::{Ctx, GraphKey, JobError, Run, layer_counts};
use super::evaluate::Shape;
use super::floor::{Floor, Floors, Skeletons, undominated};
use crate::model::ModelGraph;
use crate::model::OpGraph;
use crate::operators;
use crate::pipeline::PipelineSchedule;
use crate::schedule;
use crate::step::{self, StepInput};
use crate::training::MemoryModel;
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
        let devices = self.input.cluster.devices as f64;
        let batch = self.input.training.global_batch as f64;
        let floors = self.floors.get_or_init(|| self.plan_floors(c));
        let weights = self.input.objective_weights();
        let mut sum = 0.0;
        for (m, graphs) in self.graphs.iter().enumerate() {
            let mut keys: Vec<_> = graphs.keys().collect();
            keys.sort();
            // Samples per device-second, the most any of the model's layer graphs allows;
            // samples per second, the most any plan shape allows.
            let (mut rate, mut shaped) = (0.0f64, 0.0f64);
            for key in keys {
                let g = &graphs[key];
                let (micro_batch, width, .., context_parallel, _) = *key;
                let (device_seconds, seconds) = self.layer_seconds(g, width, c)?;
                let per_sample =
                    context_parallel.max(1) as f64 * device_seconds / micro_batch as f64;
                rate = rate.max(if per_sample > 0.0 {
                    1.0 / per_sample
                } else {
                    f64::INFINITY
                });
                for f in floors[m].get(key).into_iter().flatten() {
                    let step = f.at(seconds);
                    shaped = shaped.max(if step > 0.0 {
                        batch / step
                    } else {
                        f64::INFINITY
                    });
                }
            }
            let mut model = devices * rate;
            if self.input.training.memory_model != MemoryModel::Reference {
                model = model.min(shaped);
            }
            sum += weights.get(m).copied().unwrap_or(1.0) * model;
        }
        Ok(sum / self.graphs.len().max(1) as f64)
    }

    /// One micro-batch of `g` on chip `c`, at least: the device-seconds (each layer's
    /// forward and backward makespan bound times the devices its stage spans: `width` for
    /// a tensor-parallel layer, one otherwise) and the seconds (the bounds' sum, `L`).
    fn layer_seconds(
        &self,
        g: &ModelGraph,
        width: u64,
        c: &AcceleratorConfig,
    ) -> Result<(f64, f64), JobError> {
        let counts = layer_counts(g);
        let skeletons = self.skeletons.get_or_init(|| self.skeletons());
        let (mut device_seconds, mut seconds) = (0.0, 0.0);
        for (slot, layer) in g.distinct().into_iter().enumerate() {
            if counts[slot] == 0 {
                continue;
            }
            let mut both = 0.0;
            for graph in [&layer.forward, &layer.backward] {
                let bound = match skeletons.get(&address(graph)) {
                    Some(Some(skeleton)) => {
                        let tasks = self.estimator.tasks(graph, c)?;
                        skeleton.makespan_lower_bound(&tasks, c.tensor_cores, c.vector_cores)
                    }
                    _ => schedule::makespan_lower_bound(&self.estimator.instance(graph, c)?),
                };
                both += bound.map_err(|e| JobError::Infeasible(format!("layer schedule: {e}")))?;
            }
            let devices = if layer.tensor_parallel { width } else { 1 };
            device_seconds += counts[slot] as f64 * devices as f64 * both;
            seconds += counts[slot] as f64 * both;
        }
        Ok((device_seconds, seconds))
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
                    let pipeline = slots / p as f64;
                    let fixed = slots * floor.transfer_seconds + floor.exposed_sync_seconds;
                    floors.push(Floor {
                        slope: pipeline,
                        intercept: fixed,
                        hidden_slope: pipeline - 1.0 / p as f64,
                        hidden_intercept: fixed + floor.hideable_sync_seconds,
                    });
                }
            }
        }
        floors
    }
}

/// Where `graph` is: its key among [`Skeletons`].
fn address(graph: &OpGraph) -> usize {
    std::ptr::from_ref(graph) as usize
}
