//! What a search holds in memory, known before it starts, so that a spec whose search
//! would need more than the operator's budget is refused with the numbers instead of
//! aborting (or swapping) the process that runs it.
//!
//! The estimate is an upper bound of the engine's heap, part by part, from the spec alone:
//! it assumes every configuration of the axes is a candidate and every candidate is
//! evaluated (an exhaustive search; a converging one stops earlier), and that every worker
//! thread holds its largest placement program and layer-schedule solver at once. What
//! grows with the space is small per candidate: the search keeps a summary of each
//! evaluated candidate ([`Evaluated::summarise`]) and the whole record of the best only.
//! `engine/tests/search_memory.rs` checks the bound against the bytes a search allocates.
//!
//! Not counted here: the cost-model plugins' instances (their memory cap is the plugin
//! host's setting, which the caller adds) and the result files the caller writes.

use super::context::{GraphKey, layer_graphs, twins};
use super::{Evaluated, ModelPlan, SearchInput, StageReport, Strategy};
use crate::model::{Layer, ModelGraph, OpNode};
use crate::operators::OpSet;
use crate::placement::{self, ProgramSize};
use crate::schedule::Instance;
use crate::space::{Candidate, SpaceSpec};
use archplace_plugin_sdk::{AcceleratorConfig, CoreConfig, EstimateError, FusedOp, Op, OpCost};
use serde::Serialize;
use std::collections::HashMap;
use std::mem::size_of;

/// Bytes one thread's layer-schedule solver may hold: the HiGHS MIP of one layer and its
/// list schedule. Measured with `/usr/bin/time -f %M`: the largest of the reference's
/// twelve layer fixtures peaks at ~6 MB above the process's own 13 MB (`archplace
/// schedule`), and a whole GPT-3 search on one thread at 60 MB resident after 3,365 MIPs
/// (`archplace run --threads 1 config/specs/gpt3-175b.toml`, debug build, memo included).
pub const SOLVER_BYTES_PER_THREAD: u64 = 32 << 20;

/// The longest reason a failed candidate records: the engine's own sentences, which name
/// a model (its name's length is added) and an HBM size.
const FAILURE_BYTES: u64 = 256;

/// The longest `limiting` label of a plan ("gradient all-reduce" and the like).
const LIMITING_BYTES: u64 = 32;

/// The longest layer label of a stage ("block 123456").
const LAYER_LABEL_BYTES: u64 = 16;

/// A hash table's bytes for `entries` of `entry` bytes: hashbrown keeps at most 7/8 of its
/// buckets full and doubles them (so up to 16/7 buckets per entry, each with a control
/// byte), and holds the old and the new table while it grows.
fn table_bytes(entries: u64, entry: u64) -> u64 {
    let buckets = entries.saturating_mul(16) / 7 + 16;
    buckets.saturating_mul(entry + 1).saturating_mul(3) / 2
}

/// A vector of `n` elements of `each` bytes grown by pushing: up to twice its length.
fn vec_bytes(n: u64, each: u64) -> u64 {
    n.saturating_mul(each).saturating_mul(2)
}

fn size<T>() -> u64 {
    size_of::<T>() as u64
}

/// A search's memory, part by part (bytes; every part an upper bound).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MemoryEstimate {
    /// Configurations of the axes: the most candidates the space can have.
    pub configurations: u64,
    /// Candidates counted for the per-candidate parts (summaries, bounds): the space's, when
    /// it was enumerated before the estimate; else every configuration.
    #[serde(default)]
    pub candidates: u64,
    /// Worker threads counted for the per-thread parts.
    pub threads: u64,
    /// The enumerated space: every configuration, its area and its candidate record.
    pub space_bytes: u64,
    /// One summary per evaluated candidate (all of them), the best one whole, and the
    /// journal's records when a search resumes.
    pub explored_bytes: u64,
    /// The memo of operator estimates: every distinct operator on every distinct core
    /// configuration of the space.
    pub memo_bytes: u64,
    /// The layer graphs (per model, micro-batch, width, precision).
    pub graphs_bytes: u64,
    /// One candidate's schedules, chains and plans, which it holds while it is evaluated.
    pub candidate_bytes: u64,
    /// The placement program's tables, once per HBM size and thread.
    pub placement_bytes: u64,
    /// The layer-schedule solver, once per thread ([`SOLVER_BYTES_PER_THREAD`]).
    pub solver_bytes: u64,
    /// The memo of layer schedules: its two generations of instances, each as large as the
    /// largest layer graph's, and as many cores' traces (each series part's bounds, list
    /// schedule and solution); no more entries than the candidates can solve.
    #[serde(default)]
    pub schedule_memo_bytes: u64,
    /// A proven search's bounds: one per candidate and the order they sort into (nothing
    /// for the other strategies).
    #[serde(default)]
    pub bounds_bytes: u64,
    /// The sum of the parts.
    pub total_bytes: u64,
}

/// The number of configurations the axes of `space` make (its candidates before the area
/// filter), saturating.
pub fn configurations(space: &SpaceSpec) -> u64 {
    [
        space.tensor_cores.len(),
        space.vector_cores.len(),
        space.width.len(),
        space.depth.len(),
        space.vector_width.as_ref().map_or(1, Vec::len),
        space.buffer_bytes.len(),
    ]
    .iter()
    .fold(1u64, |a, &n| a.saturating_mul(n as u64))
}

/// Distinct values of an axis, with 1 added (the single-core configurations every
/// candidate is also estimated on).
fn with_one(axis: &[u32]) -> u64 {
    let mut v = axis.to_vec();
    v.push(1);
    v.sort_unstable();
    v.dedup();
    v.len() as u64
}

fn distinct<T: Ord + Clone>(axis: &[T]) -> u64 {
    let mut v = axis.to_vec();
    v.sort_unstable();
    v.dedup();
    v.len() as u64
}

fn fused_bytes(op: &Op) -> u64 {
    op.fused.len() as u64 * size::<FusedOp>()
}

/// The memory a search of `input` over `space` holds at most, with `threads` workers,
/// before the space is enumerated: every configuration of the axes counted a candidate.
pub fn estimate(input: &SearchInput, space: &SpaceSpec, threads: usize) -> MemoryEstimate {
    estimate_for(input, space, threads, None)
}

/// [`estimate`] with the space's candidates counted (`candidates`: how many the area
/// filter left, known once the space is enumerated; at most the configurations), which
/// bounds what is held per candidate — the area filter often leaves a third of the
/// configurations, and a summary per candidate is the largest part of a large space.
pub fn estimate_for(
    input: &SearchInput,
    space: &SpaceSpec,
    threads: usize,
    candidates: Option<u64>,
) -> MemoryEstimate {
    let threads = threads.max(1) as u64;
    let p = configurations(space);
    let n = candidates.map_or(p, |c| c.min(p));
    let graphs = layer_graphs(input);
    let shape = GraphsShape::of(&graphs);
    let longest = input
        .models
        .iter()
        .map(|m| m.config.pipeline_layers())
        .max()
        .unwrap_or(0);
    let space_bytes = space_bytes(p);
    let explored_bytes = explored_bytes(input, n, longest);
    let memo_bytes = memo_bytes(&graphs, space, p);
    let candidate_bytes = candidate_bytes(input, &shape);
    // A run of the placement program holds one program per HBM size.
    let placement_bytes = threads
        .saturating_mul(input.cluster.hbm_bytes.len().max(1) as u64)
        .saturating_mul(
            u64::try_from(ProgramSize::of(longest as usize, input.cluster.devices, false).bytes)
                .unwrap_or(u64::MAX),
        );
    let solver_bytes = threads.saturating_mul(SOLVER_BYTES_PER_THREAD);
    // A key of 3 + 4 words per operator and a word per dependency (twice the graph's,
    // for safety), a solution, and the map's slot. Beside each, a cores' trace: its key (a
    // word less per operator), 16 bytes per series part (at most one per operator), and
    // per part of several operators (at most one per two) its bounds, list schedule and
    // solution — a start (8 bytes) and a mode (1) per operator in each, some 170 bytes in
    // a box and five allocations of at least 32 bytes. Entries: two generations, or fewer
    // where the candidates cannot solve that many (each solves at most a forward and a
    // backward instance of each distinct layer of each graph).
    let trace_bytes = shape.largest_key_words.saturating_mul(8)
        + shape.largest_graph.saturating_mul(2 * 9 + 16)
        + shape.largest_graph.div_ceil(2).saturating_mul(170 + 5 * 32)
        + 128;
    let most = n
        .saturating_add(1)
        .saturating_mul(shape.widths)
        .saturating_mul(2 * crate::model::DISTINCT_LAYERS as u64);
    let entries = |generation: usize| (2 * generation as u64).min(most);
    let schedule_memo_bytes = entries(super::memo::ScheduleMemo::GENERATION)
        .saturating_mul(shape.largest_key_words.saturating_mul(8) + 128)
        .saturating_add(
            entries(super::memo::ScheduleMemo::TRACE_GENERATION).saturating_mul(trace_bytes),
        );
    // Per candidate an optional bound (16 bytes), its place in the order (16), and either
    // its place in the heap of exact bounds (24, on one machine) or the order handed to a
    // pool's coordinator with its positions (16).
    let bounds_bytes = if input.strategy == Strategy::Proven {
        n.saturating_mul(56)
    } else {
        0
    };
    let total_bytes = [
        space_bytes,
        explored_bytes,
        memo_bytes,
        shape.bytes,
        candidate_bytes,
        placement_bytes,
        solver_bytes,
        schedule_memo_bytes,
        bounds_bytes,
    ]
    .iter()
    .fold(0u64, |a, &b| a.saturating_add(b));
    MemoryEstimate {
        configurations: p,
        candidates: n,
        threads,
        space_bytes,
        explored_bytes,
        memo_bytes,
        graphs_bytes: shape.bytes,
        candidate_bytes,
        placement_bytes,
        solver_bytes,
        schedule_memo_bytes,
        bounds_bytes,
        total_bytes,
    }
}

/// CPU seconds the bound pass spends per operator a candidate's quick bound reads (its
/// blocks' layer graphs, each once among its twins: `Ctx::quick_bound`, taking the
/// operators' durations from the memo of estimates and bounding each layer through its
/// graph's skeleton), measured with the release build on this project's 2-core reference
/// machine on 2026-12-05: the GPT-3 example space (29,360 candidates of 576 such
/// operators, 2.1 s on 2 threads: 0.25 µs per operator), BERT-large (438 operators, 1.7 s:
/// 0.26 µs) and the 1.2-million-candidate benchmark space (576 operators, 60.5 s: 0.17 µs,
/// its many candidates sharing more of the memo). The few candidates then bounded exactly
/// are not counted; plugin calls (a memo miss) come on top: one per distinct core
/// configuration and operator.
pub const BOUND_CPU_SECONDS_PER_OPERATOR: f64 = 0.25e-6;

/// What a proven search's bound pass will cost, estimated from the spec before it starts.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct BoundCost {
    /// Candidates to bound.
    pub candidates: u64,
    /// Operators of the layer graphs one candidate's quick bound reads.
    pub operators_per_candidate: u64,
    /// Threads counted.
    pub threads: u64,
    /// Wall seconds of the bound pass at [`BOUND_CPU_SECONDS_PER_OPERATOR`].
    pub seconds: f64,
}

/// The bound pass of a proven search of `input` over `candidates` candidates on
/// `threads` threads.
pub fn bound_cost(input: &SearchInput, candidates: u64, threads: usize) -> BoundCost {
    let threads = threads.max(1) as u64;
    let graphs = layer_graphs(input);
    let operators_per_candidate = GraphsShape::of(&graphs).quick_operators;
    let cpu = candidates as f64 * operators_per_candidate as f64 * BOUND_CPU_SECONDS_PER_OPERATOR;
    BoundCost {
        candidates,
        operators_per_candidate,
        threads,
        seconds: cpu / threads as f64,
    }
}

/// The space of `p` configurations: the product's configurations and the area model's
/// answers (both dropped after enumeration), the candidates, and the distinct core
/// configurations.
fn space_bytes(p: u64) -> u64 {
    vec_bytes(p, size::<AcceleratorConfig>())
        .saturating_add(vec_bytes(p, size::<Result<f64, EstimateError>>()))
        .saturating_add(vec_bytes(p, size::<Candidate>()))
        .saturating_add(2 * vec_bytes(p, size::<CoreConfig>()))
        .saturating_add(2 * table_bytes(p, size::<CoreConfig>()))
}

/// Candidates: a summary each (held in the explored list, or in the journal's map while a
/// resumed search has not reached it), and the best whole (its plans' stages of models of
/// at most `longest` layers, and layers).
fn explored_bytes(input: &SearchInput, p: u64, longest: u64) -> u64 {
    let models = input.models.len() as u64;
    let names: u64 = input
        .models
        .iter()
        .map(|m| m.config.name.len() as u64)
        .max()
        .unwrap_or(0);
    let stages = longest.min(input.cluster.devices.max(1));
    // A summary keeps each plan's blocks per stage once, in its `[plan]` when the split is
    // uneven (the record's `stage_layers` key is derived when written); counted twice, as
    // before records held the plan once: an upper bound.
    let plan_summary =
        size::<ModelPlan>() + names + LIMITING_BYTES + 2 * stages.saturating_mul(size::<u64>());
    // With several scale-up domain sizes a record holds each size's plans, its best's
    // once (`Evaluated::summarise`).
    let domains = input.cluster.domains.len() as u64;
    let plans = (models * plan_summary).max(FAILURE_BYTES + names);
    let record = (3 * size::<Evaluated>())
        .saturating_add(plans.saturating_mul(domains.max(1)))
        .saturating_add(domains.saturating_mul(size::<super::record::DomainScore>()))
        .saturating_add(size::<usize>());
    let best = (1 + domains).saturating_mul(models).saturating_mul(
        stages.saturating_mul(size::<StageReport>() + 2 * LAYER_LABEL_BYTES)
            + 3 * size::<super::LayerReport>(),
    );
    p.saturating_mul(record).saturating_add(2 * best)
}

/// What the layer graphs of a search hold and imply.
struct GraphsShape {
    /// The graphs themselves.
    bytes: u64,
    /// Layers of every chain (one per graph).
    chain_layers: u64,
    /// Graphs: (model, micro-batch, width, element size, sequence parallelism).
    widths: u64,
    /// Operators of the largest layer graph.
    largest_graph: u64,
    /// Words of the largest layer schedule's memo key.
    largest_key_words: u64,
    /// Operators of every distinct layer's forward and backward graph, every graph.
    operators: u64,
    /// Operators a quick bound reads (`Ctx::quick_bound`): the blocks' forward and
    /// backward graphs, of each graph once among its twins (equal graphs at two scale-up
    /// domains).
    quick_operators: u64,
}

impl GraphsShape {
    fn of(graphs: &[HashMap<GraphKey, ModelGraph>]) -> GraphsShape {
        let mut shape = GraphsShape {
            bytes: 0,
            chain_layers: 0,
            widths: 0,
            largest_graph: 0,
            largest_key_words: 0,
            operators: 0,
            quick_operators: 0,
        };
        for map in graphs {
            shape.bytes += table_bytes(map.len() as u64, 64);
            let mut keys: Vec<&GraphKey> = map.keys().collect();
            keys.sort_unstable();
            for (key, twin) in twins(map) {
                if key == twin {
                    let g = &map[&key];
                    shape.quick_operators += [Some(&g.block), g.dense_block.as_ref()]
                        .into_iter()
                        .flatten()
                        .map(|l| (l.forward.nodes.len() + l.backward.nodes.len()) as u64)
                        .sum::<u64>();
                }
            }
            for g in keys.into_iter().map(|k| &map[k]) {
                shape.widths += 1;
                shape.chain_layers += g.blocks + 2;
                let layers = [&g.embedding, &g.block, &g.head];
                for layer in layers
                    .into_iter()
                    .chain(g.dense_block.as_ref())
                    .chain(g.mtp.as_ref())
                {
                    shape.bytes += size::<Layer>() + g.model.len() as u64;
                    for og in [&layer.forward, &layer.backward] {
                        shape.bytes += og.nodes.len() as u64 * size::<OpNode>()
                            + og.nodes.iter().map(|n| fused_bytes(&n.op)).sum::<u64>()
                            + og.edges.len() as u64 * size::<(usize, usize)>();
                        shape.largest_graph = shape.largest_graph.max(og.nodes.len() as u64);
                        shape.operators += og.nodes.len() as u64;
                        shape.largest_key_words = shape
                            .largest_key_words
                            .max(3 + 4 * og.nodes.len() as u64 + 2 * og.edges.len() as u64);
                    }
                }
            }
        }
        shape
    }
}

/// The memo of operator estimates: each distinct operator on each distinct core
/// configuration, but no more than each candidate's own (two of each core kind).
fn memo_bytes(graphs: &[HashMap<GraphKey, ModelGraph>], space: &SpaceSpec, p: u64) -> u64 {
    let ops = OpSet::of(graphs.iter().flat_map(|map| {
        map.values().flat_map(|g| {
            [&g.embedding, &g.block, &g.head]
                .into_iter()
                .chain(g.dense_block.as_ref())
                .chain(g.mtp.as_ref())
                .flat_map(|l| [&l.forward, &l.backward])
        })
    }));
    let fused = ops
        .tensor
        .iter()
        .chain(&ops.vector)
        .chain(&ops.link)
        .map(fused_bytes)
        .max()
        .unwrap_or(0);
    let buffers = distinct(&space.buffer_bytes);
    let tensor_keys = (with_one(&space.tensor_cores)
        .saturating_mul(distinct(&space.width))
        .saturating_mul(distinct(&space.depth))
        .saturating_mul(buffers))
    .min(p.saturating_mul(2));
    let vector_widths = space
        .vector_width
        .as_deref()
        .map_or_else(|| distinct(&space.width), distinct);
    let vector_keys = (with_one(&space.vector_cores)
        .saturating_mul(vector_widths)
        .saturating_mul(buffers))
    .min(p.saturating_mul(2));
    let entries = tensor_keys
        .saturating_mul(ops.tensor.len() as u64)
        .saturating_add(vector_keys.saturating_mul((ops.vector.len() + ops.link.len()) as u64));
    // Each operator once, numbered; an answer per (core configuration, number), in a
    // table per core configuration (each with up to 16 buckets of slack).
    let distinct_ops = (ops.tensor.len() + ops.vector.len() + ops.link.len()) as u64;
    let numbered = table_bytes(distinct_ops, size::<(Op, usize)>())
        .saturating_add(distinct_ops.saturating_mul(fused));
    let cores = tensor_keys.saturating_add(vector_keys);
    let per_core = table_bytes(cores, size::<(CoreConfig, HashMap<usize, OpCost>)>())
        .saturating_add(cores.saturating_mul(16 * (size::<(usize, OpCost)>() + 1)));
    numbered
        .saturating_add(per_core)
        .saturating_add(table_bytes(entries, size::<(usize, OpCost)>()))
}

/// One candidate in flight: its schedule instances, and every placement run's chains and
/// plan (runs: HBM sizes × models × micro-batches × the training choices).
fn candidate_bytes(input: &SearchInput, shape: &GraphsShape) -> u64 {
    let tr = &input.training;
    let choices = (input.cluster.hbm_bytes.len()
        * tr.activation_recomputation.len().max(1)
        * tr.precision_indices().len().max(1)
        * tr.zero_choices().len().max(1)
        * tr.reshard_after_forward.len().max(1)
        * tr.sequence_parallel_choices().len().max(1)) as u64;
    let chain_bytes = size::<placement::Layer>() + size::<placement::Edge>();
    choices
        .saturating_mul(shape.chain_layers.saturating_mul(chain_bytes) + shape.widths * 256)
        .saturating_add(
            shape
                .widths
                .saturating_mul(6)
                .saturating_mul(size::<Instance>() + shape.largest_graph * 64),
        )
}
