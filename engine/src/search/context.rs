//! What a search holds while it evaluates candidates ([`Ctx`]): its input, the layer graphs
//! of every (micro-batch, width, element size), the memos of estimates and schedules, the
//! counters; and the placement runs a candidate needs.

use super::estimator::Estimator;
use super::input::SearchInput;
use super::memo::{ScheduleMemo, SharedSchedules};
use super::observe::{Observer, Stats};
use crate::model::{
    BuildOptions, DISTINCT_LAYERS, ExpertLayout, ModelConfig, ModelGraph, Numerics, build,
};
use crate::training::{ContextMethod, MemoryModel, Precision, Recomputation, Training};
use archplace_plugin_sdk::{EstimateError, LatencyModel};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, OnceLock, RwLock};

pub(super) struct Ctx<'a> {
    pub(super) input: &'a SearchInput,
    pub(super) memo: ScheduleMemo,
    /// graphs[model][(micro_batch, width, numerics, sequence parallelism, EP, CP, domain)]
    pub(super) graphs: Vec<HashMap<GraphKey, ModelGraph>>,
    pub(super) estimator: Estimator<'a>,
    pub(super) stats: Mutex<Stats>,
    pub(super) observer: &'a dyn Observer,
    pub(super) shared: Option<&'a dyn SharedSchedules>,
    /// The plan shapes' step floors a proven search bounds by, computed at its first
    /// bound.
    pub(super) floors: OnceLock<super::floor::Floors<GraphKey>>,
    /// The layer graphs' skeletons a proven search bounds with, worked out at its first
    /// bound.
    pub(super) skeletons: OnceLock<super::floor::Skeletons>,
    /// Per model, each layer graph's first twin in the keys' order (an equal graph: at
    /// two scale-up domains whose tiers its collectives feel alike), which a proven
    /// search's bound reads for it.
    pub(super) twins: OnceLock<Vec<BTreeMap<GraphKey, GraphKey>>>,
}

impl<'a> Ctx<'a> {
    pub(super) fn new(
        input: &'a SearchInput,
        latency: &'a dyn LatencyModel,
        observer: &'a dyn Observer,
    ) -> Self {
        Ctx {
            input,
            graphs: layer_graphs(input),
            estimator: Estimator {
                model: latency,
                execution: input.training.execution,
                cache: RwLock::new(Default::default()),
                graph_ids: RwLock::new(Default::default()),
                computed: AtomicU64::new(0),
                hits: AtomicU64::new(0),
            },
            stats: Mutex::new(Stats::default()),
            observer,
            memo: ScheduleMemo::default(),
            shared: None,
            floors: OnceLock::new(),
            skeletons: OnceLock::new(),
            twins: OnceLock::new(),
        }
    }
}

/// A model's graph is built per (micro-batch, tensor-parallel width, numerics (element
/// bytes and types), sequence parallelism — only ever true with a width above 1 —,
/// expert-parallel width, context-parallel size and scale-up domain (index into
/// [`crate::training::Cluster::networks`]: its collectives' tiers)).
pub(crate) type GraphKey = (u64, u64, Numerics, bool, u64, u64, usize);

/// Each of a model's layer graphs' first twin in the keys' order: the first key whose
/// graph equals it (itself, mostly; at two scale-up domains whose tiers a graph's
/// collectives feel alike, the other's). A proven search's bound reads one graph for all
/// its twins, and the estimate of its cost counts it once.
pub(super) fn twins(graphs: &HashMap<GraphKey, ModelGraph>) -> BTreeMap<GraphKey, GraphKey> {
    let mut keys: Vec<&GraphKey> = graphs.keys().collect();
    keys.sort_unstable();
    let mut out = BTreeMap::new();
    for (i, key) in keys.iter().enumerate() {
        let first = keys[..i]
            .iter()
            .find(|k| k.1 == key.1 && graphs[**k] == graphs[*key])
            .map_or(**key, |k| **k);
        out.insert(**key, first);
    }
    out
}

/// One placement problem of a candidate: HBM size, model, micro-batch, recomputation,
/// precision (index into the training's list), ZeRO stage, sequence parallelism,
/// expert-parallel width and context-parallel size.
#[derive(Debug, Clone, Copy)]
pub(super) struct Run {
    pub(super) hbm: usize,
    pub(super) model: usize,
    pub(super) micro_batch: u64,
    pub(super) recompute: Recomputation,
    pub(super) precision: usize,
    /// The ZeRO stage (1: the distributed optimizer).
    pub(super) zero: u64,
    /// Sequence parallelism for the widths above 1.
    pub(super) sequence_parallel: bool,
    /// The experts' expert-parallel width (1 for a dense model).
    pub(super) expert_parallel: u64,
    /// CP: ranks each sequence is split over; the placement program places the model over
    /// `devices / CP` (a stage's ranks are `t × CP × d`).
    pub(super) context_parallel: u64,
    /// The scale-up domain (index into [`crate::training::Cluster::networks`]).
    pub(super) domain: usize,
    /// ZeRO-3 frees each layer's gathered weights after forward (true at other stages).
    pub(super) reshard: bool,
}

impl Run {
    /// The layer graphs' key of this run at tensor-parallel width `t`: micro-batch, width,
    /// numerics of its precision, sequence parallelism (only above width 1).
    pub(super) fn graph_key(&self, t: u64, training: &Training) -> GraphKey {
        (
            self.micro_batch,
            t,
            training.numerics(self.precision),
            self.sequence_parallel && t > 1,
            self.expert_parallel,
            self.context_parallel,
            self.domain,
        )
    }
}

impl Training {
    /// The expert-parallel widths a run of `cfg` tries: those of the list dividing its
    /// experts (the validator makes sure there is one), 1 for a dense model.
    pub(super) fn expert_parallel_choices(&self, cfg: &ModelConfig) -> Vec<u64> {
        match cfg.moe {
            Some(m) => {
                let widths: Vec<u64> = self
                    .expert_parallel
                    .iter()
                    .copied()
                    .filter(|&ep| ep >= 1 && m.experts.is_multiple_of(ep))
                    .collect();
                if widths.is_empty() { vec![1] } else { widths }
            }
            None => vec![1],
        }
    }

    /// The context-parallel sizes a run of `cfg` on `devices` tries: those of the list
    /// [`context_parallel_fits`] (the validator makes sure one does), 1 when none does.
    pub fn context_parallel_choices(&self, cfg: &ModelConfig, devices: u64) -> Vec<u64> {
        let sizes: Vec<u64> = self
            .context_parallel
            .iter()
            .copied()
            .filter(|&cp| {
                context_parallel_fits(cfg, cp, devices, self.context_exchange.method).is_ok()
            })
            .collect();
        if sizes.is_empty() { vec![1] } else { sizes }
    }

    /// Sequence-parallelism choices worth a separate run.
    pub(super) fn sequence_parallel_choices(&self) -> Vec<bool> {
        if self.sequence_parallel.is_empty() {
            vec![false]
        } else {
            self.sequence_parallel.clone()
        }
    }

    /// The precision at `index` of the list (bf16 mixed if the list is empty).
    pub(super) fn precision(&self, index: usize) -> Precision {
        self.precisions
            .get(index)
            .copied()
            .unwrap_or(Precision::Bf16Mixed)
    }

    /// How the graphs of the precision at `index` of the list type their data (the
    /// reference memory model: its `bytes_per_element`, in one type).
    pub(super) fn numerics(&self, precision: usize) -> Numerics {
        match self.memory_model {
            MemoryModel::Reference => Numerics::plain(self.bytes_per_element),
            MemoryModel::Megatron => self.precision(precision).numerics(self.fp8_scaling),
        }
    }

    /// Indices into `precisions` worth a separate run: all with the Megatron model, one
    /// with the reference's (which ignores precision).
    pub(super) fn precision_indices(&self) -> std::ops::Range<usize> {
        match self.memory_model {
            MemoryModel::Reference => 0..1,
            MemoryModel::Megatron => 0..self.precisions.len().max(1),
        }
    }

    /// ZeRO stages worth a separate run: `zero_stages`, or the distributed-optimizer
    /// choices as stages 0 and 1.
    pub(super) fn zero_choices(&self) -> Vec<u64> {
        match self.memory_model {
            MemoryModel::Reference => vec![0],
            MemoryModel::Megatron if !self.zero_stages.is_empty() => self.zero_stages.clone(),
            MemoryModel::Megatron if self.distributed_optimizer.is_empty() => vec![0],
            MemoryModel::Megatron => self
                .distributed_optimizer
                .iter()
                .map(|&d| u64::from(d))
                .collect(),
        }
    }

    /// The resharding choices worth a separate run at ZeRO stage `zero`: the list at
    /// ZeRO-3 (true when empty), true elsewhere (nothing is gathered to free).
    pub(super) fn reshard_choices(&self, zero: u64) -> Vec<bool> {
        if zero == 3 && !self.reshard_after_forward.is_empty() {
            self.reshard_after_forward.clone()
        } else {
            vec![true]
        }
    }

    /// The sharding a plan of ZeRO stage `zero` has (stage 1 is said by
    /// `distributed_optimizer` alone, so that plans without ZeRO-2/3 read as before),
    /// resharding after forward or not.
    pub(super) fn sharding(&self, zero: u64, reshard: bool) -> crate::step::Sharding {
        crate::step::Sharding {
            zero_stage: if zero >= 2 { zero } else { 0 },
            reshard_after_forward: reshard,
            data_parallel_overlap: self.data_parallel_overlap,
            sharding_group: None,
        }
    }
}

/// Why context-parallel size `cp` cannot split `cfg` over `devices` with the exchange
/// `method`: it must divide the devices, and meet the step model's rules
/// (`step::context_problems`: the sequence in `2·CP` equal chunks, a fused attention
/// kernel; with Ulysses' all-to-all, `step::all_to_all_problem` at one tensor-parallel
/// width at least: the heads divide among `t × CP` ranks).
pub fn context_parallel_fits(
    cfg: &ModelConfig,
    cp: u64,
    devices: u64,
    method: ContextMethod,
) -> Result<(), String> {
    if cp == 0 || !devices.is_multiple_of(cp) {
        return Err(format!(
            "context-parallel size {cp} does not divide the {devices} devices"
        ));
    }
    if let Some(why) = crate::step::context_problems(cfg, cp).first() {
        return Err(format!("{}: {why}", cfg.name));
    }
    if method == ContextMethod::AllToAll {
        let problems: Vec<_> = cfg
            .tensor_parallel_widths()
            .into_iter()
            .filter(|&t| t.saturating_mul(cp) <= devices)
            .map(|t| crate::step::all_to_all_problem(cfg, t, cp))
            .collect();
        if let Some(Some(why)) = problems.first()
            && problems.iter().all(Option::is_some)
        {
            return Err(format!("{}: {why}", cfg.name));
        }
    }
    Ok(())
}

pub(super) fn layer_name(index: usize, blocks: u64) -> String {
    if index == 0 {
        "embedding".into()
    } else if index as u64 <= blocks {
        format!("block {}", index - 1)
    } else {
        "head".into()
    }
}

/// Why a layer could not be scheduled on a candidate.
#[derive(Debug)]
pub(super) enum JobError {
    /// The candidate is outside the latency model's domain: it fails, the search goes on.
    Infeasible(String),
    /// The latency model itself failed: the search fails.
    Model(EstimateError),
}

impl From<EstimateError> for JobError {
    fn from(e: EstimateError) -> Self {
        match e {
            EstimateError::OutOfDomain(why) => {
                JobError::Infeasible(format!("latency model: {why}"))
            }
            other => JobError::Model(other),
        }
    }
}

/// The layer graphs a search schedules: per model, one per (micro-batch, tensor-parallel
/// width, numerics, sequence parallelism, expert-parallel width, context-parallel size,
/// scale-up domain) the training plan allows on the cluster.
pub(crate) fn layer_graphs(input: &SearchInput) -> Vec<HashMap<GraphKey, ModelGraph>> {
    let mut graphs = Vec::new();
    for m in &input.models {
        let mut map = HashMap::new();
        let contexts = input
            .training
            .context_parallel_choices(&m.config, input.cluster.devices);
        let mut numerics: Vec<Numerics> = input
            .training
            .precision_indices()
            .map(|p| input.training.numerics(p))
            .collect();
        numerics.sort_unstable();
        numerics.dedup();
        for &b in &input.training.micro_batch_sizes {
            for t in m.config.tensor_parallel_widths() {
                if t > input.cluster.devices {
                    continue;
                }
                for (&e, ep) in numerics.iter().flat_map(|e| {
                    input
                        .training
                        .expert_parallel_choices(&m.config)
                        .into_iter()
                        .map(move |ep| (e, ep))
                }) {
                    for (sp, cp) in input
                        .training
                        .sequence_parallel_choices()
                        .into_iter()
                        .flat_map(|sp| contexts.iter().map(move |&cp| (sp, cp)))
                    {
                        if t.saturating_mul(cp) > input.cluster.devices
                            || (input.training.context_exchange.method == ContextMethod::AllToAll
                                && crate::step::all_to_all_problem(&m.config, t, cp).is_some())
                        {
                            continue;
                        }
                        for (domain, network) in input.cluster.networks().iter().enumerate() {
                            let sp = sp && t > 1;
                            // Tensor-parallel collectives on the tier the group lives on.
                            let link = network.tier(t).bytes_per_second as u64;
                            let opts = BuildOptions {
                                micro_batch: b,
                                tensor_parallel: t,
                                numerics: e,
                                link_bytes_per_second: link,
                                sequence_parallel: sp,
                                experts: ExpertLayout {
                                    parallel: ep,
                                    tensor_parallel: m.config.expert_tensor_parallel(t),
                                    link_bytes_per_second: link,
                                },
                                context_parallel: cp,
                                recompute_modules: input.training.recompute_modules,
                                kernels: input.training.execution.kernels,
                                fp8_library: input.training.execution.fp8_library,
                                cross_entropy: input.training.execution.cross_entropy,
                            };
                            map.entry((b, t, e, sp, ep, cp, domain))
                                .or_insert_with(|| build(&m.config, &opts));
                        }
                    }
                }
            }
        }
        graphs.push(map);
    }
    graphs
}

/// How many of each distinct layer ([`ModelGraph::distinct`]'s order) the model has: one
/// embedding and one head, the repeated blocks, the dense blocks, the
/// multi-token-prediction modules (one layer) — zero for a slot the model lacks.
pub(super) fn layer_counts(g: &ModelGraph) -> [u64; DISTINCT_LAYERS] {
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
