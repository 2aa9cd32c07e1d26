//! One candidate evaluated: its layers scheduled, every placement run of every model,
//! micro-batch, recomputation, precision and optimizer choice at every HBM size, the best
//! plans chosen and reported with their breakdowns.

use super::SearchError;
use super::context::{Ctx, GraphKey, JobError, Run, layer_counts, layer_name};
use super::memo::Timed;
use super::record::{BaselineReport, DomainScore, Evaluated, LayerReport, ModelPlan, StageReport};
use crate::model::{DISTINCT_LAYERS, Layer, LayerKind, ModelGraph, OpGraph};
use crate::pipeline::{PipelineSchedule, Slots};
use crate::placement::{
    self, Chain, Edge, Fixed, Layer as ChainLayer, MegatronMemory, MemoryRule, Plan, Resync,
    Runnable, Settings, StagePlan,
};
use crate::plan::RecordedPlan;
use crate::space::Candidate;
use crate::step::{
    self, LayerTiming, MemoryBreakdown, StepError, StepInput, StepPlan, StepReport, TimeBreakdown,
};
use crate::training::{MemoryModel, Recomputation, StateBytes};
use archplace_plugin_sdk::{AcceleratorConfig, CoreConfig, EstimateError, Op, OpCost};
use rayon::prelude::*;
use std::collections::HashMap;
use std::time::Instant;

/// The layer times of a candidate, by (model, graph key), in the order of
/// [`ModelGraph::distinct`].
type Times = HashMap<(usize, GraphKey), [Timed; DISTINCT_LAYERS]>;

/// A placement group's chains (one per width) and its best plan at each HBM size.
type Placed = (Vec<Chain>, Vec<Option<Priced>>);

/// The best HBM size's mean throughput, index and per model: (run index, plan, its chains).
type Choice<'p> = (f64, usize, Vec<(usize, &'p Priced, &'p [Chain])>);

/// A plan of the placement program, priced. With the Megatron-LM memory model the price is
/// the step model's (`archplace estimate`'s: the program's objective only proposes), and
/// `step` is the plan as `[plan]` gives it with its step; with the reference's memory
/// model it is the program's own time per batch, as the reference system prices it.
#[derive(Debug, Clone)]
pub(super) struct Priced {
    plan: Plan,
    step: Option<(StepPlan, StepReport)>,
    seconds: f64,
    /// With `[training] pipeline_schedule` given, the best 1F1B plan's step at the same
    /// HBM size (what the chosen schedule gains over it).
    one_f_one_b_seconds: Option<f64>,
}

impl Timed {
    /// The layer's timing as the step model takes it.
    fn layer_timing(&self) -> LayerTiming {
        LayerTiming::of(&self.fwd.timing, &self.bwd.timing)
    }
}

/// A plan's parallel layout: widths, stages, replicas, model chunks per device.
#[derive(Debug, Clone, Copy)]
pub(super) struct Shape {
    pub(super) tensor_parallel: u64,
    pub(super) pipeline_parallel: u64,
    pub(super) data_parallel: u64,
    pub(super) interleaving: u64,
    /// The schedule it runs (the one its chunks imply, unless the training lists others).
    pub(super) schedule: PipelineSchedule,
}

/// Where a plan is priced: the chip, the HBM size (index) and the devices it runs on.
#[derive(Debug, Clone, Copy)]
struct At<'c> {
    chip: &'c AcceleratorConfig,
    hbm: usize,
    devices: u64,
}

/// One micro-batch's passes through the whole model on one device, from its layer
/// schedules: forward, input gradient, weight gradient (and the pair's time, unoverlapped)
/// — the split a schedule's bubble per stage depends on.
fn passes(g: &ModelGraph, timed: &[Timed; DISTINCT_LAYERS]) -> Slots {
    let counts = layer_counts(g);
    let (mut f, mut b, mut w) = (0.0, 0.0, 0.0);
    for (c, t) in counts.iter().zip(timed) {
        let c = *c as f64;
        f += c * t.fwd.timing.makespan;
        b += c * t.bwd.timing.makespan;
        w += c * t.bwd.timing.weight_gradient;
    }
    let w = w.min(b);
    Slots {
        forward: f,
        backward_input: b - w,
        weight: w,
        overlapped: f + b,
    }
}

/// Blocks per pipeline stage of a placement's stages over a chain `embedding, block ×
/// blocks, head`: the chain positions `1..=blocks` each stage holds.
fn stage_blocks(stages: &[StagePlan], blocks: u64) -> Vec<u64> {
    stages
        .iter()
        .map(|s| {
            let from = (s.start as u64).max(1);
            let to = (s.end as u64).min(blocks + 1);
            to.saturating_sub(from)
        })
        .collect()
}

/// The layers at each position of a placement's chain over `g`: one each, but the
/// multi-token-prediction modules share the head's (Megatron-Core keeps them in its stage).
fn chain_positions(g: &ModelGraph) -> Vec<Vec<&Layer>> {
    let mut positions: Vec<Vec<&Layer>> = Vec::new();
    let mut pending = None;
    for l in g.layers() {
        if l.kind == LayerKind::Mtp {
            pending = Some(l);
            continue;
        }
        positions.push(pending.take().into_iter().chain([l]).collect());
    }
    positions
}

/// `Some(list)` unless the list is Megatron-LM's even split (then `None`).
fn uneven(list: Vec<u64>, blocks: u64) -> Option<Vec<u64>> {
    let p = list.len() as u64;
    let even = p > 0 && blocks.is_multiple_of(p) && list.iter().all(|&b| b == blocks / p);
    (!even).then_some(list)
}

impl Ctx<'_> {
    /// The chain of `g`. With the Megatron memory model each layer keeps what
    /// recomputation `r` keeps and its backward includes the recomputation; with the
    /// reference's, the placement program handles (full) recomputation itself.
    fn chain(&self, g: &ModelGraph, times: &[Timed; DISTINCT_LAYERS], run: &Run) -> Chain {
        let r = run.recompute;
        let t = g.tensor_parallel;
        let megatron = self.input.training.memory_model == MemoryModel::Megatron;
        let fsdp = self.fsdp_layer_seconds(run);
        let network = self.network(run);
        // A Mixture-of-Experts block's all-to-all exchanges (not operators of the chip):
        // dispatch and combine in each pass, as the step model counts them.
        // Hidden (zero) with `all_to_all_overlap`, where the step model hides what
        // computation covers: a proposal.
        let overlap = self.input.training.all_to_all_overlap;
        let exchange = |l: &Layer| {
            l.all_to_all
                .filter(|_| !overlap)
                .map_or(0.0, |a| a.seconds(network, 2.0))
        };
        let positions = chain_positions(g);
        let mut layers = Vec::new();
        for (i, here) in positions.iter().enumerate() {
            let mut node = ChainLayer {
                id: i as i64,
                parameter_bytes: 0.0,
                activation_bytes: 0.0,
                workspace_bytes: 0.0,
                forward: 0.0,
                backward: 0.0,
                tensor_parallel: t > 1,
            };
            for l in here {
                let timed = times[l.kind.slot()];
                let exchanged = exchange(l);
                // Context parallelism's key-value exchanges, what attention does not hide.
                let [kv_forward, kv_backward, kv_again] = step::kv_exchange_passes(
                    network,
                    self.input.training.context_exchange,
                    r.reruns_attention(self.input.training.recompute_modules),
                    Some(l),
                    &timed.layer_timing(),
                );
                let (activation_bytes, again) = if megatron && l.kind.is_block() {
                    let x = timed.layer_timing().rerun(r);
                    let again = x.seconds
                        + x.communication
                        + if r.reruns_all_to_all(self.input.training.recompute_modules) {
                            exchanged
                        } else {
                            0.0
                        };
                    (l.kept_bytes(r), again)
                } else {
                    (l.stash_bytes, 0.0)
                };
                node.parameter_bytes += l.parameter_bytes as f64;
                node.activation_bytes += activation_bytes as f64;
                node.workspace_bytes = node.workspace_bytes.max(l.workspace_bytes as f64);
                let (gather, scatter) = fsdp(l.parameters);
                node.forward += timed.fwd.seconds + exchanged + gather.0 + kv_forward.0;
                node.backward += timed.bwd.seconds + exchanged + again + gather.1 + scatter;
                node.backward += kv_backward.0 + kv_again.0;
                node.tensor_parallel &= l.tensor_parallel;
            }
            layers.push(node);
        }
        let outputs: Vec<u64> = positions
            .iter()
            .map(|here| here.last().map_or(0, |l| l.output_bytes))
            .collect();
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

    /// The network of `run`'s scale-up domain.
    pub(super) fn network(&self, run: &Run) -> &crate::network::Network {
        &self.input.cluster.networks()[run.domain]
    }

    /// ZeRO-2/3's traffic of a layer of `parameters` per micro-batch as the placement
    /// program sees it: ((gather before forward, gather before backward), reduce-scatter
    /// after backward), each `bytes / bandwidth` of the inter-node tier — at least the
    /// ring's `(d − 1)/d` share whatever `d` the program picks, so a proposal; the plans
    /// are priced by the step model. Hidden (zero) with `data_parallel_overlap`.
    fn fsdp_layer_seconds(&self, run: &Run) -> impl Fn(u64) -> ((f64, f64), f64) + use<> {
        let tr = &self.input.training;
        let bandwidth = self.input.cluster.network.inter_node.bytes_per_second;
        let (w, g) = StateBytes::unsharded(tr.precision(run.precision));
        let zero = if tr.data_parallel_overlap || tr.memory_model == MemoryModel::Reference {
            0
        } else {
            run.zero
        };
        let reshard = run.reshard;
        move |parameters: u64| {
            let bytes = |per: f64| parameters as f64 * per / bandwidth;
            let gather = if zero == 3 { bytes(w) } else { 0.0 };
            let again = if reshard { gather } else { 0.0 };
            let scatter = if zero >= 2 { bytes(g) } else { 0.0 };
            ((gather, again), scatter)
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
                let full = StateBytes::sharded(precision, tr.optimizer, 0, 1);
                let zero = run.zero;
                // Per parameter: the states ZeRO shards (over the data-parallel group) and
                // those every replica holds whole; ZeRO-3 without resharding holds its
                // stage's weights gathered besides their shards.
                let part = |on: bool, bytes: f64| if on { bytes } else { 0.0 };
                let reshard = run.reshard;
                let sharded = part(zero >= 3, full.weights)
                    + part(zero >= 2, full.gradients)
                    + part(zero >= 1, full.optimizer);
                // FP8 recipes keep quantised copies of the blocks' GEMM weights (per
                // parameter of a block, the share those weights are of it); at ZeRO-3 only
                // the layer at work has them.
                let quantised_share = g.block.quantised_share();
                // With FP8 parameters the copies replace the 16-bit weights.
                let copies = precision.weight_copy_bytes() * quantised_share
                    - if tr.fp8_param_gather && zero >= 1 && precision.is_quantised() {
                        full.weights * quantised_share
                    } else {
                        0.0
                    };
                let replicated = part(zero < 3 || !reshard, full.weights)
                    + part(zero < 3, copies)
                    + part(zero < 2, full.gradients)
                    + part(zero < 1, full.optimizer);
                let sync = match zero {
                    0 => 2.0 * full.gradients,
                    1 => full.gradients + full.weights,
                    2 => full.weights,
                    _ => 0.0,
                };
                // One block's rematerialised activations, the larger kind's.
                let transient = if run.recompute == Recomputation::None {
                    0.0
                } else {
                    g.distinct()[1..]
                        .iter()
                        .filter(|l| l.kind.is_block())
                        .map(|l| (l.stash_bytes - l.kept_bytes(run.recompute)) as f64)
                        .fold(0.0, f64::max)
                };
                // ZeRO-2/3: the largest layer's unsharded gradient and (resharding ZeRO-3)
                // two layers' gathered weights, held besides the shards.
                let largest = g.distinct().iter().map(|l| l.parameters).max().unwrap_or(0) as f64;
                let buffers = largest
                    * (part(zero >= 2, full.gradients)
                        + part(zero >= 3 && reshard, 2.0 * full.weights)
                        + part(zero >= 3, precision.weight_copy_bytes()));
                // The shards are over the `CP × d` ranks holding the same weights; the
                // program divides by `d`.
                let cp = run.context_parallel.max(1) as f64;
                (
                    false,
                    MemoryRule::Megatron(MegatronMemory {
                        replicated_per_parameter_byte: replicated / e,
                        optimizer_per_parameter_byte: sharded / e / cp,
                        distributed: zero >= 1,
                        transient_bytes: transient + buffers,
                        sync_per_parameter_byte: sync / e,
                    }),
                )
            }
        };
        Settings {
            memory_bytes: self.input.cluster.hbm_bytes[run.hbm] as f64,
            // Each context-parallel group of CP ranks runs what one rank would without it:
            // the program places the model over `devices / CP` such ranks.
            devices: self.input.cluster.devices / run.context_parallel.max(1),
            bandwidth: self.input.cluster.link_bytes_per_second,
            micro_batches: tr.global_batch / run.micro_batch,
            recompute,
            memory,
            resync: Resync::LargestStage,
            // Only plans a framework runs: an even split of the batch over the replicas,
            // and every device unless the spec says otherwise.
            bubble_per_stage: 1.0,
            runnable: Runnable {
                all_devices: self.input.use_all_devices,
                even_batches: true,
            },
        }
    }

    /// Evaluates one candidate: its layers scheduled, every placement run, the best plans
    /// — at each scale-up domain size, the best of them chosen (ties to the smaller).
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
            node_size: None,
            domains: Vec::new(),
        };
        let times = match self.layer_times(&cand.config) {
            Ok(t) => t,
            Err(JobError::Infeasible(why)) => return Ok(fail(why)),
            Err(JobError::Model(e)) => return Err(SearchError::CostModel(e)),
        };
        let groups = self.groups();
        let t0 = Instant::now();
        let placed: Vec<Vec<Placed>> = groups
            .par_iter()
            .map(|run| self.place(run, &times, &cand.config))
            .collect();
        // Every (HBM size, group, domain) as a run of its own, HBM size first (the order in
        // which ties go to the first).
        let mut runs: Vec<Run> = Vec::new();
        let mut plans: Vec<Option<(&Priced, &[Chain])>> = Vec::new();
        for h in 0..self.input.cluster.hbm_bytes.len() {
            for (run, domains) in groups.iter().zip(&placed) {
                for (domain, (chains, each)) in domains.iter().enumerate() {
                    runs.push(Run {
                        hbm: h,
                        domain,
                        ..*run
                    });
                    plans.push(each[h].as_ref().map(|p| (p, chains.as_slice())));
                }
            }
        }
        if let Ok(mut st) = self.stats.lock() {
            st.placement_seconds += t0.elapsed().as_secs_f64();
            st.placements_solved += runs.len() as u64;
        }
        let networks = self.input.cluster.networks();
        let domains: Vec<DomainScore> = networks
            .iter()
            .enumerate()
            .map(|(domain, network)| {
                let score = |mean, hbm_bytes, plans, failure| DomainScore {
                    node_size: network.node_size,
                    mean_throughput_samples_per_second: mean,
                    hbm_bytes,
                    plans,
                    failure,
                };
                match self.choose(&runs, &plans, domain) {
                    Ok((mean, h, chosen)) => {
                        let reports = chosen
                            .into_iter()
                            .map(|(k, priced, chains)| {
                                self.report(&runs[k], priced, chains, &times, &cand.config)
                            })
                            .collect();
                        let hbm = self.input.cluster.hbm_bytes[h];
                        score(Some(mean), Some(hbm), reports, None)
                    }
                    Err(why_not) => score(None, None, Vec::new(), Some(why_not)),
                }
            })
            .collect();
        // The best domain: the fastest, ties (as between candidates) to the smaller one.
        let mut best: Option<&DomainScore> = None;
        for d in &domains {
            let Some(t) = d.mean_throughput_samples_per_second else {
                continue;
            };
            let size = d.node_size as f64;
            if best.is_none_or(|b| {
                let bt = b.mean_throughput_samples_per_second.unwrap_or(0.0);
                super::faster_or_smaller((t, size), (bt, b.node_size as f64))
            }) {
                best = Some(d);
            }
        }
        let best = best.cloned();
        // One domain: the record is the candidate's alone, without `domains`.
        let several = networks.len() > 1;
        let kept = |domains: Vec<DomainScore>| if several { domains } else { Vec::new() };
        let Some(best) = best else {
            let why = domains.iter().find_map(|d| d.failure.clone());
            return Ok(Evaluated {
                domains: kept(domains),
                ..fail(why.unwrap_or_default())
            });
        };
        Ok(Evaluated {
            index,
            config: cand.config,
            area_um2: cand.area_um2,
            bucket: cand.bucket,
            mean_throughput_samples_per_second: best.mean_throughput_samples_per_second,
            hbm_bytes: best.hbm_bytes,
            plans: best.plans,
            failure: None,
            node_size: several.then_some(best.node_size),
            domains: kept(domains),
        })
    }

    /// Every distinct layer of every model scheduled on `c`, at every (micro-batch, width,
    /// element size, sequence parallelism, expert-parallel width): embedding, block, head and
    /// dense block (the block again when there is none: its schedules are reused), forward
    /// and backward.
    fn layer_times(&self, c: &AcceleratorConfig) -> Result<Times, JobError> {
        let mut jobs: Vec<(usize, GraphKey)> = Vec::new();
        for (m, graphs) in self.graphs.iter().enumerate() {
            let mut keys: Vec<&GraphKey> = graphs.keys().collect();
            keys.sort();
            jobs.extend(keys.into_iter().map(|&key| (m, key)));
        }
        let layer_graphs: Vec<&OpGraph> = jobs
            .iter()
            .flat_map(|(m, key)| self.graphs[*m][key].distinct())
            .flat_map(|l| [&l.forward, &l.backward])
            .collect();
        let scheduled = self.schedules(&layer_graphs, c)?;
        let mut times = Times::new();
        for (job, s) in jobs.iter().zip(scheduled.chunks_exact(2 * DISTINCT_LAYERS)) {
            let timed = |l: usize| Timed {
                fwd: s[2 * l],
                bwd: s[2 * l + 1],
            };
            times.insert(*job, std::array::from_fn(timed));
        }
        Ok(times)
    }

    /// The placement runs of a candidate, at the first HBM size: every (model,
    /// micro-batch, recomputation, precision, ZeRO stage, sequence parallelism,
    /// expert-parallel width, context-parallel size), at the first scale-up domain (each
    /// is placed at every domain). One run of the placement program serves every width
    /// and HBM size.
    pub(super) fn groups(&self) -> Vec<Run> {
        let tr = &self.input.training;
        let mut groups = Vec::new();
        for model in 0..self.graphs.len() {
            let config = &self.input.models[model].config;
            let experts = tr.expert_parallel_choices(config);
            let contexts = tr.context_parallel_choices(config, self.input.cluster.devices);
            for (&micro_batch, &expert_parallel) in tr
                .micro_batch_sizes
                .iter()
                .flat_map(|b| experts.iter().map(move |ep| (b, ep)))
            {
                for &recompute in &tr.activation_recomputation {
                    for precision in tr.precision_indices() {
                        for (zero, reshard) in tr
                            .zero_choices()
                            .into_iter()
                            .flat_map(|z| tr.reshard_choices(z).into_iter().map(move |r| (z, r)))
                        {
                            for (sequence_parallel, context_parallel) in tr
                                .sequence_parallel_choices()
                                .into_iter()
                                .flat_map(|sp| contexts.iter().map(move |&cp| (sp, cp)))
                            {
                                groups.push(Run {
                                    hbm: 0,
                                    model,
                                    micro_batch,
                                    recompute,
                                    precision,
                                    zero,
                                    sequence_parallel,
                                    expert_parallel,
                                    context_parallel,
                                    domain: 0,
                                    reshard,
                                });
                            }
                        }
                    }
                }
            }
        }
        groups
    }

    /// One group placed at every scale-up domain: per domain, its chains (one per width)
    /// and its best plan at each HBM size. The placement program proposes, per width, its
    /// best 1F1B plan (free stage boundaries) and its best interleaved ones (equal
    /// chunks); each proposal is priced (see [`Priced`]) on the domain's network and the
    /// fastest kept — ties to the narrowest width, then 1F1B. A width whose chain and
    /// settings are the same at two domains (every group its chain feels fits both, or
    /// crosses both alike) shares the program's proposals: it runs once for them.
    fn place(&self, run: &Run, times: &Times, c: &AcceleratorConfig) -> Vec<Placed> {
        let memory_bytes: Vec<f64> = self
            .input
            .cluster
            .hbm_bytes
            .iter()
            .map(|&b| b as f64)
            .collect();
        // The program's proposals per (chain, settings) of a width, computed once.
        let mut programs: Vec<(Chain, Settings, Vec<Vec<Plan>>)> = Vec::new();
        let mut out = Vec::new();
        for domain in 0..self.input.cluster.networks().len() {
            let run = &Run { domain, ..*run };
            let (keys, chains) = self.chains(run, times);
            let mut proposed: Vec<Vec<Plan>> = vec![Vec::new(); memory_bytes.len()];
            for (key, chain) in keys.iter().zip(&chains) {
                // Each width has its own settings (what recomputation rematerialises
                // depends on it).
                let settings = self.settings(run, &self.graphs[run.model][key]);
                let known = programs
                    .iter()
                    .position(|(ch, st, _)| ch == chain && *st == settings);
                let k = match known {
                    Some(k) => k,
                    None => {
                        let width =
                            self.propose(run, (key, chain), &settings, &memory_bytes, times);
                        programs.push((chain.clone(), settings, width));
                        programs.len() - 1
                    }
                };
                for (h, plans) in programs[k].2.iter().enumerate() {
                    proposed[h].extend(plans.iter().cloned());
                }
            }
            let plans = proposed
                .into_iter()
                .enumerate()
                .map(|(h, plans)| self.best_priced(run, plans, h, c, times))
                .collect();
            out.push((chains, plans));
        }
        out
    }

    /// The graph keys of `run`'s model that `run` prices (one per width, in order): the
    /// bound's floors and the evaluation's chains must walk the same ones.
    pub(super) fn run_keys(&self, run: &Run) -> Vec<GraphKey> {
        let tr = &self.input.training;
        let mut keys: Vec<GraphKey> = self.graphs[run.model]
            .keys()
            .filter(|k| **k == run.graph_key(k.1, tr))
            .copied()
            .collect();
        keys.sort_unstable();
        keys
    }

    /// The graph keys of `run` (one per width, in order) and their chains.
    fn chains(&self, run: &Run, times: &Times) -> (Vec<GraphKey>, Vec<Chain>) {
        let m = run.model;
        let keys = self.run_keys(run);
        let chains = keys
            .iter()
            .map(|key| self.chain(&self.graphs[m][key], &times[&(m, *key)], run))
            .collect();
        (keys, chains)
    }

    /// The placement program's proposals for `run` at width `key` (its chain and
    /// settings) at each HBM size: the best 1F1B plan and the best interleaved ones.
    fn propose(
        &self,
        run: &Run,
        (key, chain): (&GraphKey, &Chain),
        settings: &Settings,
        memory_bytes: &[f64],
        times: &Times,
    ) -> Vec<Vec<Plan>> {
        let tr = &self.input.training;
        let t = Instant::now();
        let mut proposed: Vec<Vec<Plan>> = vec![Vec::new(); memory_bytes.len()];
        let graph = &self.graphs[run.model][key];
        let one = std::slice::from_ref(chain);
        // 1F1B's boundaries, and those of each schedule listed whose bubble per stage
        // differs (the zero-bubble schedules fill theirs: deeper pipelines pay less).
        let mut bubbles = vec![1.0];
        if let Some(timed) = times.get(&(run.model, *key)) {
            let passes = passes(graph, timed);
            for s in self.schedules_for(1) {
                let b = s.bubble_per_stage(1, passes);
                if !bubbles.contains(&b) {
                    bubbles.push(b);
                }
            }
        }
        for bubble_per_stage in bubbles {
            let at = Settings {
                bubble_per_stage,
                ..settings.clone()
            };
            if let Ok(each) = placement::best_plans(one, &at, memory_bytes) {
                for (h, plan) in each.into_iter().enumerate() {
                    if let Some(p) = plan {
                        // The same layout found again is priced once.
                        let same = |q: &Plan| {
                            (
                                q.tensor_parallel,
                                q.data_parallel,
                                q.interleaving,
                                &q.stages,
                            ) == (
                                p.tensor_parallel,
                                p.data_parallel,
                                p.interleaving,
                                &p.stages,
                            )
                        };
                        if !proposed[h].iter().any(same) {
                            proposed[h].push(p);
                        }
                    }
                }
            }
        }
        for &v in tr.pipeline_interleaving.iter().filter(|&&v| v > 1) {
            for (h, &memory) in memory_bytes.iter().enumerate() {
                let at = Settings {
                    memory_bytes: memory,
                    ..settings.clone()
                };
                if let Ok(Some(p)) = placement::best_interleaved(one, &at, v, graph.blocks as usize)
                {
                    proposed[h].push(p);
                }
            }
        }
        self.observer.placement(t.elapsed().as_secs_f64());
        proposed
    }

    /// The step plan of a placement of `run`: the program's stages, widths and replicas
    /// with the run's choices, as `[plan]` would give them.
    fn step_plan(&self, run: &Run, plan: &Plan, schedule: PipelineSchedule) -> StepPlan {
        let blocks = self.input.models[run.model].config.layers;
        let stage_layers = if plan.interleaving > 1 {
            None
        } else {
            uneven(stage_blocks(&plan.stages, blocks), blocks)
        };
        let shape = Shape {
            tensor_parallel: plan.tensor_parallel,
            pipeline_parallel: plan.stages.len() as u64,
            data_parallel: plan.data_parallel,
            interleaving: plan.interleaving.max(1),
            schedule,
        };
        self.shape_plan(run, shape, stage_layers)
    }

    /// The step plan of `run` in `shape` with `stage_layers` (`None`: the even split).
    pub(super) fn shape_plan(
        &self,
        run: &Run,
        shape: Shape,
        stage_layers: Option<Vec<u64>>,
    ) -> StepPlan {
        let tr = &self.input.training;
        let t = shape.tensor_parallel;
        StepPlan {
            tensor_parallel: t,
            pipeline_parallel: shape.pipeline_parallel,
            data_parallel: shape.data_parallel,
            micro_batch: run.micro_batch,
            interleaving: shape.interleaving,
            // Unsaid when the chunks imply it (1F1B, or interleaved with more than one).
            pipeline_schedule: if shape.schedule == PipelineSchedule::implied(shape.interleaving) {
                PipelineSchedule::default()
            } else {
                shape.schedule
            },
            recomputation: run.recompute,
            sequence_parallel: run.sequence_parallel && t > 1,
            precision: tr.precision(run.precision),
            fp8_scaling: tr.fp8_scaling,
            // FP8 parameters are gathered from the optimizer's shards: plans with them.
            fp8_param_gather: tr.fp8_param_gather && run.zero >= 1,
            optimizer: tr.optimizer,
            distributed_optimizer: run.zero >= 1,
            sharding: tr.sharding(run.zero, run.reshard),
            expert_parallel: run.expert_parallel,
            expert_tensor_parallel: self.input.models[run.model]
                .config
                .expert_tensor_parallel(t),
            all_to_all_overlap: tr.all_to_all_overlap,
            // Interleaved plans only, as Megatron-LM runs it.
            pipeline_parallel_overlap: tr.pipeline_parallel_overlap
                && shape.schedule == PipelineSchedule::Interleaved,
            context_parallel: run.context_parallel,
            context_exchange: tr.context_exchange,
            recompute_modules: tr.recompute_modules,
            recompute_layers: None,
            activation_offload_layers: 0,
            stage_layers,
        }
    }

    /// The devices a plan runs on: every device of the cluster, or with
    /// `use_all_devices = false` the ones it uses.
    pub(super) fn devices_for(&self, plan: &StepPlan) -> u64 {
        if self.input.use_all_devices {
            return self.input.cluster.devices;
        }
        plan.devices()
    }

    /// The step of `plan` (of `run`, priced `at`) by the step model, from the candidate's
    /// layer schedules.
    fn step(
        &self,
        run: &Run,
        plan: StepPlan,
        at: At<'_>,
        times: &Times,
    ) -> Result<(StepPlan, StepReport), StepError> {
        let tr = &self.input.training;
        let t = plan.tensor_parallel;
        let key = run.graph_key(t, tr);
        let (Some(g), Some(timed)) = (
            self.graphs[run.model].get(&key),
            times.get(&(run.model, key)),
        ) else {
            return Err(StepError::Schedule(format!(
                "tensor-parallel width {t} is not among the layer graphs"
            )));
        };
        let timing = timed.map(|t| t.layer_timing());
        let input = StepInput {
            model: self.input.models[run.model].config.clone(),
            plan,
            accelerator: *at.chip,
            hbm_bytes: self.input.cluster.hbm_bytes[at.hbm],
            devices: at.devices,
            global_batch: tr.global_batch,
            network: *self.network(run),
            peak_flops_per_second: None,
            schedule: self.input.schedule,
            execution: tr.execution,
        };
        let mut cost = |core: &CoreConfig, op: &Op| -> Result<OpCost, EstimateError> {
            self.estimator.cost(core, op)
        };
        let report = step::estimate_timed_step(&input, g, &timing, &mut cost)?;
        Ok((input.plan, report))
    }

    /// `plan` run under `schedule`, priced (see [`Priced`]); `None` when the step model
    /// refuses it (it needs more memory by the step model's count than by the program's
    /// bound, or the schedule's rules do not hold).
    fn price(
        &self,
        run: &Run,
        (plan, schedule): (Plan, PipelineSchedule),
        h: usize,
        c: &AcceleratorConfig,
        times: &Times,
    ) -> Option<Priced> {
        if self.input.training.memory_model == MemoryModel::Reference {
            let seconds = plan.time_per_batch;
            return Some(Priced {
                plan,
                step: None,
                seconds,
                one_f_one_b_seconds: None,
            });
        }
        let step_plan = self.step_plan(run, &plan, schedule);
        let at = At {
            chip: c,
            hbm: h,
            devices: self.devices_for(&step_plan),
        };
        let (step_plan, report) = self.step(run, step_plan, at, times).ok()?;
        Some(Priced {
            seconds: report.step_seconds,
            plan,
            step: Some((step_plan, report)),
            one_f_one_b_seconds: None,
        })
    }

    /// The fastest of the program's `proposals` at HBM size `h`, each priced under every
    /// schedule the training tries for its chunks ([`Ctx::schedules_for`]; ties to
    /// the earlier proposal, then schedule); with schedules given, the best 1F1B plan's
    /// step beside it.
    fn best_priced(
        &self,
        run: &Run,
        proposals: Vec<Plan>,
        h: usize,
        c: &AcceleratorConfig,
        times: &Times,
    ) -> Option<Priced> {
        let listed = !self.input.training.pipeline_schedules.is_empty();
        let (mut best, mut one_f_one_b): (Option<Priced>, Option<f64>) = (None, None);
        for plan in proposals {
            let mut schedules = self.schedules_for(plan.interleaving);
            if listed && plan.interleaving <= 1 && !schedules.contains(&PipelineSchedule::OneFOneB)
            {
                schedules.insert(0, PipelineSchedule::OneFOneB);
            }
            for schedule in schedules {
                let Some(p) = self.price(run, (plan.clone(), schedule), h, c, times) else {
                    continue;
                };
                if listed && schedule == PipelineSchedule::OneFOneB {
                    one_f_one_b = Some(one_f_one_b.map_or(p.seconds, |s| s.min(p.seconds)));
                    if !self.input.training.pipeline_schedules.contains(&schedule) {
                        continue;
                    }
                }
                best = match best {
                    Some(b) if b.seconds <= p.seconds => Some(b),
                    _ => Some(p),
                };
            }
        }
        best.map(|b| Priced {
            one_f_one_b_seconds: one_f_one_b,
            ..b
        })
    }

    /// The schedules a proposal of `interleaving` chunks is priced under: the training's
    /// (`[training] pipeline_schedule`) that run such a layout — the interleaved schedule
    /// for chunks above 1, the others for one — or without a list the implied one.
    pub(super) fn schedules_for(&self, interleaving: u64) -> Vec<PipelineSchedule> {
        let listed = &self.input.training.pipeline_schedules;
        if listed.is_empty() {
            return vec![PipelineSchedule::implied(interleaving)];
        }
        listed
            .iter()
            .copied()
            .filter(|s| (*s == PipelineSchedule::Interleaved) == (interleaving > 1))
            .collect()
    }

    /// Per HBM size, each model's best plan on scale-up domain `domain` and their mean
    /// throughput; the HBM size with the best mean (the first of equal ones). `Err`: why
    /// no HBM size fits every model.
    fn choose<'p>(
        &self,
        runs: &[Run],
        plans: &[Option<(&'p Priced, &'p [Chain])>],
        domain: usize,
    ) -> Result<Choice<'p>, String> {
        let global_batch = self.input.training.global_batch as f64;
        let weights = self.input.objective_weights();
        let mut best: Option<Choice> = None;
        let mut why_not = String::new();
        for h in 0..self.input.cluster.hbm_bytes.len() {
            let mut chosen = Vec::new();
            let mut sum = 0.0;
            for (m, weight) in weights.iter().enumerate() {
                let pick = runs
                    .iter()
                    .zip(plans)
                    .enumerate()
                    .filter(|(_, (run, _))| run.hbm == h && run.model == m)
                    .filter(|(_, (run, _))| run.domain == domain)
                    .filter_map(|(k, (_, p))| p.map(|(plan, chains)| (k, plan, chains)))
                    .min_by(|a, b| a.1.seconds.total_cmp(&b.1.seconds).then(a.0.cmp(&b.0)));
                match pick {
                    Some(p) => {
                        sum += weight * global_batch / p.1.seconds;
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

    fn report(
        &self,
        run: &Run,
        priced: &Priced,
        chains: &[Chain],
        times: &Times,
        c: &AcceleratorConfig,
    ) -> ModelPlan {
        let plan = &priced.plan;
        let m = run.model;
        let model = &self.input.models[m];
        let t = plan.tensor_parallel;
        let tr = &self.input.training;
        let key = run.graph_key(t, tr);
        let g = &self.graphs[m][&key];
        let throughput = tr.global_batch as f64 / priced.seconds;
        let step = priced.step.as_ref().map(|(_, report)| report);
        let stages = plan
            .stages
            .iter()
            .enumerate()
            .map(|(k, s)| {
                // The step model's stage when it priced the plan (the same stages).
                let by_step = step.and_then(|r| r.stages.get(k));
                StageReport {
                    first_layer: layer_name(s.start, g.blocks),
                    last_layer: layer_name(s.end - 1, g.blocks),
                    layers: s.end - s.start,
                    devices: s.devices * run.context_parallel,
                    load_seconds: by_step.map_or(s.load, |x| x.seconds_per_micro_batch),
                    memory_bytes: by_step.map_or(s.memory_bytes, |x| x.memory_bytes.total),
                }
            })
            .collect();
        let tm = &times[&(m, key)];
        let layers = [
            (LayerKind::Embedding, 1),
            (LayerKind::DenseBlock, g.dense_blocks),
            (LayerKind::Block, g.main_blocks()),
            (LayerKind::Mtp, u64::from(g.mtp.is_some())),
            (LayerKind::Head, 1),
        ]
        .iter()
        .filter(|(_, count)| *count > 0)
        .map(|&(layer, count)| (layer.slot(), layer, count))
        .map(|(k, layer, count)| LayerReport {
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
        let baseline = model
            .baseline
            .map(|bl| self.baseline(run, &bl, chains, c, times));
        let (time, memory_bytes) = match step {
            Some(r) => (r.time, r.memory_bytes),
            None => self.breakdown(run, plan, g, &times[&(m, key)]),
        };
        let hbm_busy_seconds = step.and_then(|r| r.hbm_busy_seconds);
        let recorded = match &priced.step {
            Some((p, _)) => RecordedPlan::priced(p.clone(), g.blocks),
            None => RecordedPlan::reference(
                &self.shape_plan(
                    run,
                    Shape {
                        tensor_parallel: t,
                        pipeline_parallel: plan.stages.len() as u64,
                        data_parallel: plan.data_parallel,
                        interleaving: plan.interleaving,
                        schedule: PipelineSchedule::implied(plan.interleaving),
                    },
                    Some(stage_blocks(&plan.stages, g.blocks)),
                ),
                g.blocks,
            ),
        };
        ModelPlan {
            model: model.config.name.clone(),
            time_per_batch_seconds: priced.seconds,
            gradient_all_reduce_seconds: time.data_parallel_communication_seconds,
            throughput_samples_per_second: throughput,
            throughput_tokens_per_second: throughput * model.config.seq_len as f64,
            stages,
            limiting: time.limiting().to_string(),
            time,
            hbm_busy_seconds,
            memory_bytes,
            layers,
            baseline,
            pipeline_schedule: (!tr.pipeline_schedules.is_empty() && recorded.estimable)
                .then(|| recorded.step.schedule()),
            one_f_one_b_throughput_samples_per_second: priced
                .one_f_one_b_seconds
                .map(|s| tr.global_batch as f64 / s),
            plan: recorded,
        }
    }

    /// The baseline strategy on the same chip, HBM size and choices as `run`: with the
    /// Megatron-LM memory model priced by the step model (its `p` stages of `⌈L/p⌉` blocks,
    /// the last holding the rest; its own `t·p·d` devices), with the reference's by the
    /// placement program's fixed evaluation, as the reference system does.
    fn baseline(
        &self,
        run: &Run,
        bl: &crate::training::Baseline,
        chains: &[Chain],
        c: &AcceleratorConfig,
        times: &Times,
    ) -> BaselineReport {
        let tr = &self.input.training;
        let report = |seconds: Result<f64, String>| BaselineReport {
            pipeline: bl.pipeline,
            data: bl.data,
            tensor: bl.tensor,
            throughput_samples_per_second: seconds
                .as_ref()
                .ok()
                .map(|s| tr.global_batch as f64 / s),
            time_per_batch_seconds: seconds.as_ref().ok().copied(),
            infeasible: seconds.err(),
        };
        let model = &self.input.models[run.model];
        if tr.memory_model == MemoryModel::Megatron {
            let blocks = model.config.layers;
            let (p, t) = (bl.pipeline.max(1), bl.tensor);
            let per = blocks.div_ceil(p);
            let list: Vec<u64> = (0..p)
                .map(|k| {
                    if k + 1 == p {
                        blocks.saturating_sub(per * (p - 1))
                    } else {
                        per
                    }
                })
                .collect();
            // The run's plan in the baseline's shape (plain 1F1B, its stage list), every
            // expert on every rank of a stage.
            let shape = Shape {
                tensor_parallel: t,
                pipeline_parallel: bl.pipeline,
                data_parallel: bl.data,
                interleaving: 1,
                schedule: PipelineSchedule::OneFOneB,
            };
            let mut plan = self.shape_plan(run, shape, uneven(list, blocks));
            plan.expert_parallel = 1;
            let cp = run.context_parallel;
            let needed = t
                .saturating_mul(cp)
                .saturating_mul(bl.pipeline)
                .saturating_mul(bl.data);
            if needed > self.input.cluster.devices {
                let with_cp = if cp > 1 {
                    format!(" × CP = {cp}")
                } else {
                    String::new()
                };
                return report(Err(format!(
                    "t = {t}{with_cp} × p = {} × d = {} is {needed} devices; the cluster has {}",
                    bl.pipeline, bl.data, self.input.cluster.devices
                )));
            }
            let at = At {
                chip: c,
                hbm: run.hbm,
                devices: needed,
            };
            return report(
                self.step(run, plan, at, times)
                    .map(|(_, r)| r.step_seconds)
                    .map_err(|e| e.to_string()),
            );
        }
        // Settings of the baseline's width.
        let Some(width_graph) = self.graphs[run.model].get(&run.graph_key(bl.tensor, tr)) else {
            return report(Err(
                placement::FixedError::NoSuchWidth(bl.tensor).to_string()
            ));
        };
        let settings = self.settings(run, width_graph);
        let fixed = Fixed {
            pipeline: bl.pipeline,
            tensor: bl.tensor,
            data: bl.data,
            transformer_layers: model.config.layers,
        };
        report(
            placement::evaluate_fixed(chains, &settings, &fixed)
                .map(|p| p.time_per_batch)
                .map_err(|e| e.to_string()),
        )
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
        tm: &[Timed; DISTINCT_LAYERS],
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
            let positions = chain_positions(g);
            let here = positions.get(slow.start..slow.end).unwrap_or_default();
            for kind in here.iter().flatten().map(|l| l.kind) {
                let timed = tm[kind.slot()];
                f += timed.fwd.seconds - timed.fwd.link_seconds;
                bw += timed.bwd.seconds - timed.bwd.link_seconds;
                tp += timed.fwd.link_seconds + timed.bwd.link_seconds;
                let block = kind.is_block();
                // The reference recomputes every layer but on the last stage, the
                // megatron model the policy's part of every block.
                let again = match (megatron, run.recompute) {
                    (_, Recomputation::None) => None,
                    (true, policy) if block => Some(policy),
                    (false, _) if from_end > 1 => Some(Recomputation::Full),
                    _ => None,
                };
                if let Some(policy) = again {
                    let x = timed.layer_timing().rerun(policy);
                    r += x.seconds;
                    tp += x.communication;
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
                let state = StateBytes::sharded(precision, tr.optimizer, run.zero, d);
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
