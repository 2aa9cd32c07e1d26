//! One candidate evaluated: its layers scheduled, every placement run of every model,
//! micro-batch, recomputation, precision and optimizer choice at every HBM size, the best
//! plans chosen and reported with their breakdowns.

use super::SearchError;
use super::context::{Ctx, GraphKey, JobError, Run, layer_name};
use super::record::{BaselineReport, Evaluated, LayerReport, ModelPlan, StageReport};
use super::schedules::Timed;
use crate::model::{LayerKind, ModelGraph, OpGraph};
use crate::placement::{
    self, Chain, Edge, Fixed, Layer as ChainLayer, MegatronMemory, MemoryRule, Plan, Resync,
    Settings,
};
use crate::space::Candidate;
use crate::step::{MemoryBreakdown, TimeBreakdown};
use crate::training::{MemoryModel, Recomputation, StateBytes};
use archplace_plugin_sdk::AcceleratorConfig;
use rayon::prelude::*;
use std::collections::HashMap;
use std::time::Instant;

/// The layer times of a candidate, by (model, graph key): embedding, block and head.
type Times = HashMap<(usize, GraphKey), [Timed; 3]>;

/// A placement group's chains (one per width) and its best plan at each HBM size.
type Placed = (Vec<Chain>, Vec<Option<Plan>>);

/// The best HBM size's mean throughput, index and per model: (run index, plan, its chains).
type Choice<'p> = (f64, usize, Vec<(usize, &'p Plan, &'p [Chain])>);

impl Ctx<'_> {
    /// The chain of `g`. With the Megatron memory model each layer keeps what
    /// recomputation `r` keeps and its backward includes the recomputation; with the
    /// reference's, the placement program handles (full) recomputation itself.
    fn chain(&self, g: &ModelGraph, times: &[Timed; 3], r: Recomputation) -> Chain {
        let t = g.tensor_parallel;
        let megatron = self.input.training.memory_model == MemoryModel::Megatron;
        let mut layers = Vec::new();
        for (i, l) in g.layers().enumerate() {
            let timed = match l.kind {
                LayerKind::Embedding => times[0],
                LayerKind::Block => times[1],
                LayerKind::Head => times[2],
            };
            let (activation_bytes, again) = if megatron && l.kind == LayerKind::Block {
                let again = match r {
                    Recomputation::None => 0.0,
                    Recomputation::Selective => timed.fwd.core_seconds,
                    Recomputation::Full => timed.fwd.seconds,
                };
                (l.kept_bytes(r), again)
            } else {
                (l.stash_bytes, 0.0)
            };
            layers.push(ChainLayer {
                id: i as i64,
                parameter_bytes: l.parameter_bytes as f64,
                activation_bytes: activation_bytes as f64,
                forward: timed.fwd.seconds,
                backward: timed.bwd.seconds + again,
                tensor_parallel: l.tensor_parallel && t > 1,
            });
        }
        let outputs: Vec<u64> = g.layers().map(|l| l.output_bytes).collect();
        let edges = (1..layers.len())
            .map(|v| Edge {
                from: v - 1,
                to: v,
                bytes: outputs[v - 1] as f64,
            })
            .collect();
        Chain {
            width: t,
            layers,
            edges,
        }
    }

    fn settings(&self, run: &Run, g: &ModelGraph) -> Settings {
        let tr = &self.input.training;
        let (recompute, memory) = match tr.memory_model {
            MemoryModel::Reference => (
                run.recompute != Recomputation::None,
                MemoryRule::Reference {
                    optimizer_copies: tr.optimizer.reference_copies(),
                },
            ),
            MemoryModel::Megatron => {
                let precision = tr.precision(run.precision);
                let e = precision.element_bytes() as f64;
                let state = StateBytes::megatron(precision, tr.optimizer, false, 1);
                let sync = if run.distributed {
                    state.gradients + state.weights
                } else {
                    2.0 * state.gradients
                };
                let transient = if run.recompute == Recomputation::None {
                    0.0
                } else {
                    (g.block.stash_bytes - g.block.kept_bytes(run.recompute)) as f64
                };
                (
                    false,
                    MemoryRule::Megatron(MegatronMemory {
                        replicated_per_parameter_byte: (state.weights + state.gradients) / e,
                        optimizer_per_parameter_byte: state.optimizer / e,
                        distributed: run.distributed,
                        transient_bytes: transient,
                        sync_per_parameter_byte: sync / e,
                    }),
                )
            }
        };
        Settings {
            memory_bytes: self.input.cluster.hbm_bytes[run.hbm] as f64,
            devices: self.input.cluster.devices,
            bandwidth: self.input.cluster.link_bytes_per_second,
            micro_batches: tr.global_batch / run.micro_batch,
            recompute,
            memory,
            resync: Resync::LargestStage,
        }
    }

    /// Evaluates one candidate: its layers scheduled, every placement run, the best plans.
    pub(super) fn evaluate(
        &self,
        index: usize,
        cand: &Candidate,
    ) -> Result<Evaluated, SearchError> {
        let fail = |why: String| Evaluated {
            index,
            config: cand.config,
            area_um2: cand.area_um2,
            bucket: cand.bucket,
            mean_throughput_samples_per_second: None,
            hbm_bytes: None,
            plans: Vec::new(),
            failure: Some(why),
        };
        let times = match self.layer_times(&cand.config) {
            Ok(t) => t,
            Err(JobError::Infeasible(why)) => return Ok(fail(why)),
            Err(JobError::Model(e)) => return Err(SearchError::CostModel(e)),
        };
        let groups = self.groups();
        let t0 = Instant::now();
        let placed: Vec<Placed> = groups
            .par_iter()
            .map(|run| self.place(run, &times))
            .collect();
        // Every (HBM size, group) as a run of its own, HBM size first (the order in which
        // ties go to the first).
        let mut runs: Vec<Run> = Vec::new();
        let mut plans: Vec<Option<(&Plan, &[Chain])>> = Vec::new();
        for h in 0..self.input.cluster.hbm_bytes.len() {
            for (run, (chains, each)) in groups.iter().zip(&placed) {
                runs.push(Run { hbm: h, ..*run });
                plans.push(each[h].as_ref().map(|p| (p, chains.as_slice())));
            }
        }
        if let Ok(mut st) = self.stats.lock() {
            st.placement_seconds += t0.elapsed().as_secs_f64();
            st.placements_solved += runs.len() as u64;
        }
        let (mean, h, chosen) = match self.choose(&runs, &plans) {
            Ok(best) => best,
            Err(why_not) => return Ok(fail(why_not)),
        };
        let reports = chosen
            .into_iter()
            .map(|(k, plan, chains)| self.report(&runs[k], plan, chains, &times))
            .collect();
        Ok(Evaluated {
            index,
            config: cand.config,
            area_um2: cand.area_um2,
            bucket: cand.bucket,
            mean_throughput_samples_per_second: Some(mean),
            hbm_bytes: Some(self.input.cluster.hbm_bytes[h]),
            plans: reports,
            failure: None,
        })
    }

    /// Every distinct layer of every model scheduled on `c`, at every (micro-batch, width,
    /// element size, sequence parallelism): embedding, block and head, forward and backward.
    fn layer_times(&self, c: &AcceleratorConfig) -> Result<Times, JobError> {
        let mut jobs: Vec<(usize, GraphKey)> = Vec::new();
        for (m, graphs) in self.graphs.iter().enumerate() {
            let mut keys: Vec<&GraphKey> = graphs.keys().collect();
            keys.sort();
            jobs.extend(keys.into_iter().map(|&key| (m, key)));
        }
        let layer_graphs: Vec<&OpGraph> = jobs
            .iter()
            .flat_map(|(m, key)| {
                let g = &self.graphs[*m][key];
                [&g.embedding, &g.block, &g.head]
            })
            .flat_map(|l| [&l.forward, &l.backward])
            .collect();
        let scheduled = self.schedules(&layer_graphs, c)?;
        let mut times = Times::new();
        for (job, s) in jobs.iter().zip(scheduled.chunks_exact(6)) {
            let timed = |l: usize| Timed {
                fwd: s[2 * l],
                bwd: s[2 * l + 1],
            };
            times.insert(*job, [timed(0), timed(1), timed(2)]);
        }
        Ok(times)
    }

    /// The placement runs of a candidate, at the first HBM size: every (model,
    /// micro-batch, recomputation, precision, distributed optimizer, sequence parallelism).
    /// One run of the placement program serves every width and HBM size.
    fn groups(&self) -> Vec<Run> {
        let tr = &self.input.training;
        let mut groups = Vec::new();
        for model in 0..self.graphs.len() {
            for &micro_batch in &tr.micro_batch_sizes {
                for &recompute in &tr.activation_recomputation {
                    for precision in tr.precision_indices() {
                        for distributed in tr.distributed_choices() {
                            for sequence_parallel in tr.sequence_parallel_choices() {
                                groups.push(Run {
                                    hbm: 0,
                                    model,
                                    micro_batch,
                                    recompute,
                                    precision,
                                    distributed,
                                    sequence_parallel,
                                });
                            }
                        }
                    }
                }
            }
        }
        groups
    }

    /// One group placed: its chains (one per width) and its best plan at each HBM size —
    /// over widths, ties to the narrowest; 1F1B by the placement program, interleaved 1F1B
    /// (equal chunks) by its own evaluation.
    fn place(&self, run: &Run, times: &Times) -> Placed {
        let tr = &self.input.training;
        let memory_bytes: Vec<f64> = self
            .input
            .cluster
            .hbm_bytes
            .iter()
            .map(|&b| b as f64)
            .collect();
        let (m, b, e) = (run.model, run.micro_batch, tr.element_bytes(run.precision));
        let mut keys: Vec<GraphKey> = self.graphs[m]
            .keys()
            .filter(|k| k.0 == b && k.2 == e && k.3 == (run.sequence_parallel && k.1 > 1))
            .copied()
            .collect();
        keys.sort_unstable();
        let chains: Vec<Chain> = keys
            .iter()
            .map(|key| self.chain(&self.graphs[m][key], &times[&(m, *key)], run.recompute))
            .collect();
        // Each width has its own settings (what recomputation rematerialises depends on it).
        let t = Instant::now();
        let mut plans: Vec<Option<Plan>> = vec![None; memory_bytes.len()];
        let mut keep = |h: usize, p: Plan| {
            if plans[h]
                .as_ref()
                .is_none_or(|b| p.time_per_batch < b.time_per_batch)
            {
                plans[h] = Some(p);
            }
        };
        for (key, chain) in keys.iter().zip(&chains) {
            let graph = &self.graphs[m][key];
            let settings = self.settings(run, graph);
            let one = std::slice::from_ref(chain);
            if let Ok(each) = placement::best_plans(one, &settings, &memory_bytes) {
                for (h, p) in each.into_iter().enumerate() {
                    if let Some(p) = p {
                        keep(h, p);
                    }
                }
            }
            for &v in tr.pipeline_interleaving.iter().filter(|&&v| v > 1) {
                for (h, &memory) in memory_bytes.iter().enumerate() {
                    let at = Settings {
                        memory_bytes: memory,
                        ..settings.clone()
                    };
                    if let Ok(Some(p)) =
                        placement::best_interleaved(one, &at, v, graph.blocks as usize)
                    {
                        keep(h, p);
                    }
                }
            }
        }
        self.observer.placement(t.elapsed().as_secs_f64());
        (chains, plans)
    }

    /// Per HBM size, each model's best plan and their mean throughput; the HBM size with
    /// the best mean (the first of equal ones). `Err`: why no HBM size fits every model.
    fn choose<'p>(
        &self,
        runs: &[Run],
        plans: &[Option<(&'p Plan, &'p [Chain])>],
    ) -> Result<Choice<'p>, String> {
        let global_batch = self.input.training.global_batch as f64;
        let mut best: Option<Choice> = None;
        let mut why_not = String::new();
        for h in 0..self.input.cluster.hbm_bytes.len() {
            let mut chosen = Vec::new();
            let mut sum = 0.0;
            for m in 0..self.graphs.len() {
                let pick = runs
                    .iter()
                    .zip(plans)
                    .enumerate()
                    .filter(|(_, (run, _))| run.hbm == h && run.model == m)
                    .filter_map(|(k, (_, p))| p.map(|(plan, chains)| (k, plan, chains)))
                    .min_by(|a, b| {
                        a.1.time_per_batch
                            .total_cmp(&b.1.time_per_batch)
                            .then(a.0.cmp(&b.0))
                    });
                match pick {
                    Some(p) => {
                        sum += global_batch / p.1.time_per_batch;
                        chosen.push(p);
                    }
                    None => {
                        why_not = format!(
                            "{} does not fit in {} of HBM with any micro-batch, width or placement",
                            self.input.models[m].config.name,
                            archplace_plugin_sdk::units::format_bytes(
                                self.input.cluster.hbm_bytes[h]
                            )
                        );
                        chosen.clear();
                        break;
                    }
                }
            }
            if chosen.len() == self.graphs.len() {
                let mean = sum / self.graphs.len() as f64;
                if best.as_ref().is_none_or(|b| mean > b.0) {
                    best = Some((mean, h, chosen));
                }
            }
        }
        best.ok_or(why_not)
    }

    fn report(&self, run: &Run, plan: &Plan, chains: &[Chain], times: &Times) -> ModelPlan {
        let (m, b) = (run.model, run.micro_batch);
        let model = &self.input.models[m];
        let t = plan.tensor_parallel;
        let tr = &self.input.training;
        let key = (
            b,
            t,
            tr.element_bytes(run.precision),
            run.sequence_parallel && t > 1,
        );
        let g = &self.graphs[m][&key];
        let throughput = tr.global_batch as f64 / plan.time_per_batch;
        let stages = plan
            .stages
            .iter()
            .map(|s| StageReport {
                first_layer: layer_name(s.start, g.blocks),
                last_layer: layer_name(s.end - 1, g.blocks),
                layers: s.end - s.start,
                devices: s.devices,
                load_seconds: s.load,
                memory_bytes: s.memory_bytes,
            })
            .collect();
        let tm = &times[&(m, key)];
        let layers = [
            (LayerKind::Embedding, 1),
            (LayerKind::Block, g.blocks),
            (LayerKind::Head, 1),
        ]
        .iter()
        .enumerate()
        .map(|(k, &(layer, count))| LayerReport {
            layer,
            count,
            forward_seconds: tm[k].fwd.seconds,
            backward_seconds: tm[k].bwd.seconds,
            forward_tensor_utilisation: tm[k].fwd.util.0,
            forward_vector_utilisation: tm[k].fwd.util.1,
            backward_tensor_utilisation: tm[k].bwd.util.0,
            backward_vector_utilisation: tm[k].bwd.util.1,
            forward_proven_optimal: tm[k].fwd.optimal,
            forward_gap: tm[k].fwd.gap,
            backward_proven_optimal: tm[k].bwd.optimal,
            backward_gap: tm[k].bwd.gap,
        })
        .collect();
        let baseline = model.baseline.map(|bl| {
            // Settings of the baseline's width (if the model has it; otherwise the fixed
            // evaluation reports the missing width).
            let width_graph = self.graphs[m]
                .get(&(b, bl.tensor, key.2, run.sequence_parallel && bl.tensor > 1))
                .unwrap_or(g);
            let settings = self.settings(run, width_graph);
            let fixed = Fixed {
                pipeline: bl.pipeline,
                tensor: bl.tensor,
                data: bl.data,
                transformer_layers: model.config.layers,
            };
            match placement::evaluate_fixed(chains, &settings, &fixed) {
                Ok(p) => BaselineReport {
                    pipeline: bl.pipeline,
                    data: bl.data,
                    tensor: bl.tensor,
                    throughput_samples_per_second: Some(tr.global_batch as f64 / p.time_per_batch),
                    time_per_batch_seconds: Some(p.time_per_batch),
                    infeasible: None,
                },
                Err(e) => BaselineReport {
                    pipeline: bl.pipeline,
                    data: bl.data,
                    tensor: bl.tensor,
                    throughput_samples_per_second: None,
                    time_per_batch_seconds: None,
                    infeasible: Some(e.to_string()),
                },
            }
        });
        let (time, memory_bytes) = self.breakdown(run, plan, g, &times[&(m, key)]);
        ModelPlan {
            model: model.config.name.clone(),
            micro_batch: b,
            activation_recomputation: run.recompute != Recomputation::None,
            recomputation: run.recompute,
            precision: match tr.memory_model {
                MemoryModel::Megatron => Some(tr.precision(run.precision)),
                MemoryModel::Reference => None,
            },
            distributed_optimizer: run.distributed,
            sequence_parallel: run.sequence_parallel && t > 1,
            tensor_parallel: t,
            data_parallel: plan.data_parallel,
            pipeline_stages: plan.stages.len(),
            pipeline_interleaving: plan.interleaving,
            time_per_batch_seconds: plan.time_per_batch,
            gradient_all_reduce_seconds: plan.resync_time,
            throughput_samples_per_second: throughput,
            throughput_tokens_per_second: throughput * model.config.seq_len as f64,
            stages,
            limiting: time.limiting().to_string(),
            time,
            memory_bytes,
            layers,
            baseline,
        }
    }

    /// The time and memory breakdowns of a placed plan: the slowest stage's load split into
    /// its layers' compute, tensor-parallel link time and recomputation, the rest of it
    /// (boundary transfers and waits) as point-to-point; the most loaded stage's memory
    /// split by the memory rule.
    fn breakdown(
        &self,
        run: &Run,
        plan: &Plan,
        g: &ModelGraph,
        tm: &[Timed; 3],
    ) -> (TimeBreakdown, MemoryBreakdown) {
        let tr = &self.input.training;
        let megatron = tr.memory_model == MemoryModel::Megatron;
        let d = plan.data_parallel.max(1);
        let m = (tr.global_batch / run.micro_batch).div_ceil(d) as f64;
        let count = plan.stages.len();
        let mut time = TimeBreakdown {
            data_parallel_communication_seconds: plan.resync_time,
            ..TimeBreakdown::default()
        };
        if let Some((k, slow)) = plan
            .stages
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.load.total_cmp(&b.1.load))
        {
            let from_end = count - k;
            let (mut f, mut bw, mut r, mut tp) = (0.0, 0.0, 0.0, 0.0);
            for i in slow.start..slow.end {
                let (kind, timed) = if i == 0 {
                    (LayerKind::Embedding, tm[0])
                } else if i as u64 <= g.blocks {
                    (LayerKind::Block, tm[1])
                } else {
                    (LayerKind::Head, tm[2])
                };
                f += timed.fwd.seconds - timed.fwd.link_seconds;
                bw += timed.bwd.seconds - timed.bwd.link_seconds;
                tp += timed.fwd.link_seconds + timed.bwd.link_seconds;
                let block = kind == LayerKind::Block;
                match (megatron, run.recompute) {
                    (_, Recomputation::None) => {}
                    (true, Recomputation::Selective) if block => r += timed.fwd.core_seconds,
                    (true, Recomputation::Full) if block => {
                        r += timed.fwd.seconds - timed.fwd.link_seconds;
                        tp += timed.fwd.link_seconds;
                    }
                    // The reference recomputes every layer but on the last stage.
                    (false, _) if from_end > 1 => {
                        r += timed.fwd.seconds - timed.fwd.link_seconds;
                        tp += timed.fwd.link_seconds;
                    }
                    _ => {}
                }
            }
            let p2p = (slow.load - f - bw - r - tp).max(0.0);
            time.forward_seconds = m * f;
            time.backward_seconds = m * bw;
            time.recomputation_seconds = m * r;
            time.tensor_parallel_communication_seconds = m * tp;
            time.pipeline_point_to_point_seconds = m * p2p;
            time.pipeline_bubble_seconds =
                (count - 1) as f64 / plan.interleaving.max(1) as f64 * slow.load;
        }
        let mut memory = MemoryBreakdown::default();
        if let Some(s) = plan
            .stages
            .iter()
            .max_by(|a, b| a.memory_bytes.total_cmp(&b.memory_bytes))
        {
            let (weights, gradients, optimizer) = if megatron {
                let precision = tr.precision(run.precision);
                let n = s.parameter_bytes / precision.element_bytes() as f64;
                let state = StateBytes::megatron(precision, tr.optimizer, run.distributed, d);
                (n * state.weights, n * state.gradients, n * state.optimizer)
            } else {
                let p = s.parameter_bytes;
                (p, p, tr.optimizer.reference_copies() * p)
            };
            memory = MemoryBreakdown {
                weights,
                gradients,
                optimizer,
                activations: (s.memory_bytes - weights - gradients - optimizer).max(0.0),
                total: s.memory_bytes,
            };
        }
        (time, memory)
    }
}
