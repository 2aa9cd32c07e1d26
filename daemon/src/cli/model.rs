//! `archplace model`: the layers of each model, per tensor-parallel width.

use super::{Exit, load_spec, print_json, thousands};
use anyhow::{Result, bail};
use archplace_engine::model::{
    BuildOptions, Core, Layer, ModelConfig, ModelGraph, PRESETS, build, preset,
};
use archplace_plugin_sdk::units::format_bytes;
use serde::Serialize;
use std::path::PathBuf;

#[derive(Serialize)]
struct LayerRow {
    layer: &'static str,
    count: u64,
    parameters_per_rank: u64,
    parameter_bytes: u64,
    stash_bytes: u64,
    output_bytes: u64,
    forward_matmul_flops: f64,
    forward_ops: OpCounts,
    backward_ops: OpCounts,
}

#[derive(Serialize)]
struct OpCounts {
    tensor: usize,
    fused: usize,
    vector: usize,
    link: usize,
}

#[derive(Serialize)]
struct Totals {
    layers: u64,
    parameters_per_rank: u64,
    parameter_bytes: u64,
    stash_bytes: u64,
    forward_matmul_flops: f64,
    /// Forward + backward matrix-multiply FLOPs of one micro-batch on one rank.
    training_matmul_flops: f64,
}

#[derive(Serialize)]
struct ModelReport {
    model: String,
    micro_batch: u64,
    tensor_parallel: u64,
    /// The whole model's parameters (on one rank without tensor parallelism), tied copies
    /// counted once.
    parameters_total: u64,
    /// Those each token passes through: all of a dense model's.
    parameters_active: u64,
    /// The multi-token-prediction modules', trained with the model but not in
    /// `parameters_total` (0 without them).
    parameters_mtp: u64,
    layers: Vec<LayerRow>,
    totals: Totals,
}

fn counts(g: &archplace_engine::model::OpGraph) -> OpCounts {
    OpCounts {
        tensor: g.count(Core::Tensor),
        fused: g.count(Core::Fused),
        vector: g.count(Core::Vector),
        link: g.count(Core::Link),
    }
}

fn row(l: &Layer, count: u64) -> LayerRow {
    LayerRow {
        layer: l.kind.name(),
        count,
        parameters_per_rank: l.parameters,
        parameter_bytes: l.parameter_bytes,
        stash_bytes: l.stash_bytes,
        output_bytes: l.output_bytes,
        forward_matmul_flops: l.forward.matmul_flops(),
        forward_ops: counts(&l.forward),
        backward_ops: counts(&l.backward),
    }
}

fn report(g: &ModelGraph, Counts { whole, active, mtp }: Counts) -> ModelReport {
    let mut layers = vec![row(&g.embedding, 1)];
    if let Some(dense) = &g.dense_block {
        layers.push(row(dense, g.dense_blocks));
    }
    layers.push(row(&g.block, g.main_blocks()));
    if let Some(m) = &g.mtp {
        layers.push(row(m, 1));
    }
    layers.push(row(&g.head, 1));
    let totals = Totals {
        layers: g.layers().count() as u64,
        parameters_per_rank: g.parameters_per_rank(),
        parameter_bytes: g.layers().map(|l| l.parameter_bytes).sum(),
        stash_bytes: g.layers().map(|l| l.stash_bytes).sum(),
        forward_matmul_flops: g.layers().map(|l| l.forward.matmul_flops()).sum(),
        training_matmul_flops: g.matmul_flops_per_micro_batch(false),
    };
    ModelReport {
        model: g.model.clone(),
        micro_batch: g.micro_batch,
        tensor_parallel: g.tensor_parallel,
        parameters_total: whole,
        parameters_active: active,
        parameters_mtp: mtp,
        layers,
        totals,
    }
}

fn ops_text(c: &OpCounts) -> String {
    format!("{}/{}/{}/{}", c.tensor, c.fused, c.vector, c.link)
}

fn print_table(r: &ModelReport) -> std::io::Result<()> {
    let mtp = if r.parameters_mtp > 0 {
        format!(
            " (multi-token prediction: {} more)",
            thousands(r.parameters_mtp)
        )
    } else {
        String::new()
    };
    outln!(
        "{} — {} parameters in all, {} active per token{mtp}; micro-batch {}, tensor-parallel width {} (per rank)",
        r.model,
        thousands(r.parameters_total),
        thousands(r.parameters_active),
        r.micro_batch,
        r.tensor_parallel
    )?;
    outln!(
        "  {:<10} {:>6} {:>16} {:>12} {:>12} {:>12} {:>12} {:>12}",
        "layer",
        "count",
        "parameters",
        "param bytes",
        "stash",
        "fwd GFLOP",
        "fwd ops",
        "bwd ops"
    )?;
    for l in &r.layers {
        outln!(
            "  {:<10} {:>6} {:>16} {:>12} {:>12} {:>12.2} {:>12} {:>12}",
            l.layer,
            l.count,
            thousands(l.parameters_per_rank),
            format_bytes(l.parameter_bytes),
            format_bytes(l.stash_bytes),
            l.forward_matmul_flops / 1e9,
            ops_text(&l.forward_ops),
            ops_text(&l.backward_ops),
        )?;
    }
    let t = &r.totals;
    outln!(
        "  {:<10} {:>6} {:>16} {:>12} {:>12} {:>12.2}",
        "total",
        t.layers,
        thousands(t.parameters_per_rank),
        format_bytes(t.parameter_bytes),
        format_bytes(t.stash_bytes),
        t.forward_matmul_flops / 1e9,
    )?;
    outln!(
        "  forward + backward matmul: {:.3} TFLOP per micro-batch per rank; ops are tensor/fused/vector/link",
        t.training_matmul_flops / 1e12
    )?;
    outln!()?;
    Ok(())
}

/// `archplace model`.
#[derive(Debug, clap::Args)]
pub struct ModelArgs {
    /// Spec file; the embedded default spec when omitted.
    pub spec: Option<PathBuf>,
    /// A model preset instead of a spec's models (e.g. `llama3-70b`), with 2-byte
    /// elements; `archplace model --preset list` lists them.
    #[arg(long, conflicts_with = "spec")]
    pub preset: Option<String>,
    /// Micro-batch size (default: the spec's smallest).
    #[arg(long)]
    pub micro_batch: Option<u64>,
    /// Machine-readable output: one JSON object per model and width.
    #[arg(long)]
    pub json: bool,
    /// List a block's operators (forward, in order): what each computes in words, its
    /// core, FLOPs and the bytes it reads and writes; then the tensors the forward pass
    /// keeps for the backward pass, with what reads them.
    #[arg(long)]
    pub ops: bool,
}

/// One operator of a block's forward graph, for `--ops`.
#[derive(Serialize)]
struct OpRow {
    name: String,
    core: String,
    op: String,
    flops: f64,
    /// Operands read and results written, at the spec's element size.
    bytes: u64,
}

/// A block's operators and kept tensors at one width, for `--ops`.
#[derive(Serialize)]
struct BlockOps<'a> {
    model: &'a str,
    micro_batch: u64,
    tensor_parallel: u64,
    operators: Vec<OpRow>,
    kept_for_backward: &'a [archplace_engine::model::KeptTensor],
    kept_bytes: u64,
}

/// Bytes an operator reads and writes with `element_bytes` per element: a GEMM's two
/// operands (in its own element type) and its result; a vector operation's input and
/// output; an all-reduce's buffer; a fused attention kernel's Q, K, V and output, and its
/// fp32 log-sum-exp; a cast's input and its two quantised layouts.
fn op_bytes(op: &archplace_plugin_sdk::Op, element_bytes: u64) -> u64 {
    use archplace_plugin_sdk::OpKind;
    match &op.kind {
        OpKind::Gemm(g) => {
            let inputs = (g.batch * (g.m * g.k + g.k * g.n)) as f64 * op.element.bytes();
            inputs.ceil() as u64 + g.batch * g.m * g.n * element_bytes
        }
        OpKind::Cast(c) => c.memory_bytes(op.element).ceil() as u64,
        OpKind::Vector { elements, .. } => 2 * elements * element_bytes,
        OpKind::AllReduce { bytes, .. } => *bytes,
        OpKind::Attention(a) => {
            a.memory_elements(op.direction) as u64 * element_bytes + 4 * a.statistics()
        }
    }
}

fn block_ops<'a>(g: &'a ModelGraph, element_bytes: u64) -> BlockOps<'a> {
    let operators = g
        .block
        .forward
        .nodes
        .iter()
        .map(|n| OpRow {
            name: n.name.clone(),
            core: format!("{:?}", n.core).to_lowercase(),
            op: archplace_job::estimate::op_words(&n.op),
            flops: n.matmul_flops(),
            bytes: op_bytes(&n.op, element_bytes),
        })
        .collect();
    BlockOps {
        model: &g.model,
        micro_batch: g.micro_batch,
        tensor_parallel: g.tensor_parallel,
        operators,
        kept_for_backward: &g.block.kept,
        kept_bytes: g.block.stash_bytes,
    }
}

fn print_ops(b: &BlockOps<'_>) -> std::io::Result<()> {
    outln!(
        "{} — one block's forward operators, micro-batch {}, tensor-parallel width {} (per rank)",
        b.model,
        b.micro_batch,
        b.tensor_parallel
    )?;
    outln!(
        "  {:<22} {:<7} {:>10} {:>11}  operation",
        "operator",
        "core",
        "GFLOP",
        "bytes"
    )?;
    for o in &b.operators {
        outln!(
            "  {:<22} {:<7} {:>10.3} {:>11}  {}",
            o.name,
            o.core,
            o.flops / 1e9,
            format_bytes(o.bytes),
            o.op
        )?;
    }
    outln!(
        "  kept for the backward pass: {} per micro-batch",
        format_bytes(b.kept_bytes)
    )?;
    for k in b.kept_for_backward {
        outln!(
            "    {:>11}  {} of {}{}, read by {}",
            format_bytes(k.bytes),
            k.part,
            k.producer,
            if k.recomputed {
                " (recomputed under selective recomputation)"
            } else {
                ""
            },
            k.needed_by.join(", ")
        )?;
    }
    outln!()?;
    Ok(())
}

/// The models `args` names — a preset, or a spec's — with the micro-batch (the spec's
/// smallest unless given), the element size and the link bandwidth to build them with.
fn models(args: &ModelArgs) -> Result<(Vec<ModelConfig>, u64, u64, u64)> {
    let b = match args.micro_batch {
        Some(0) => bail!("--micro-batch must be at least 1"),
        b => b,
    };
    if let Some(name) = &args.preset {
        let Some(cfg) = preset(name) else {
            bail!("no model preset `{name}`; presets: {}", PRESETS.join(", "));
        };
        return Ok((vec![cfg], b.unwrap_or(1), 2, 4 << 30));
    }
    let spec = load_spec(args.spec.as_deref(), None)?;
    let b = b.unwrap_or_else(|| {
        spec.training
            .micro_batch_sizes
            .iter()
            .copied()
            .min()
            .unwrap_or(1)
    });
    Ok((
        spec.models.iter().map(|m| m.config.clone()).collect(),
        b,
        spec.training.bytes_per_element,
        spec.cluster.link_bytes_per_second as u64,
    ))
}

/// A model's parameter counts: its own (the published convention), those a token goes
/// through, its multi-token-prediction modules'.
#[derive(Clone, Copy)]
struct Counts {
    whole: u64,
    active: u64,
    mtp: u64,
}

impl Counts {
    /// From the model's graph without tensor parallelism.
    fn of(cfg: &ModelConfig, g: &ModelGraph) -> Counts {
        let whole = g.model_parameters_per_rank();
        Counts {
            whole,
            active: whole - cfg.inactive_parameters().unwrap_or(0),
            mtp: g.mtp_parameters_per_rank(),
        }
    }
}

/// One preset for `--preset list`.
#[derive(Serialize)]
struct PresetRow {
    preset: &'static str,
    parameters_total: u64,
    parameters_active: u64,
    parameters_mtp: u64,
    layers: u64,
    hidden: u64,
    heads: u64,
    kv_heads: u64,
    seq_len: u64,
}

/// `archplace model --preset list`: every preset with its parameter counts and shape.
fn list_presets(json: bool) -> Result<Exit> {
    let rows: Vec<PresetRow> = PRESETS
        .iter()
        .filter_map(|&name| {
            let cfg = preset(name)?;
            let opts = BuildOptions {
                recompute_modules: Default::default(),
                micro_batch: 1,
                tensor_parallel: 1,
                numerics: Default::default(),
                link_bytes_per_second: 4 << 30,
                sequence_parallel: false,
                experts: Default::default(),
                context_parallel: 1,
                kernels: Default::default(),
                fp8_library: Default::default(),
                cross_entropy: Default::default(),
            };
            let c = Counts::of(&cfg, &build(&cfg, &opts));
            Some(PresetRow {
                preset: name,
                parameters_total: c.whole,
                parameters_active: c.active,
                parameters_mtp: c.mtp,
                layers: cfg.layers,
                hidden: cfg.hidden,
                heads: cfg.heads,
                kv_heads: cfg.kv_heads,
                seq_len: cfg.seq_len,
            })
        })
        .collect();
    if json {
        print_json(&rows)?;
        return Ok(Exit::Success);
    }
    outln!(
        "  {:<20} {:>19} {:>19} {:>16} {:>6} {:>7} {:>11} {:>7}",
        "preset",
        "parameters",
        "active per token",
        "+ MTP modules",
        "layers",
        "hidden",
        "heads (kv)",
        "tokens"
    )?;
    for r in &rows {
        outln!(
            "  {:<20} {:>19} {:>19} {:>16} {:>6} {:>7} {:>11} {:>7}",
            r.preset,
            thousands(r.parameters_total),
            thousands(r.parameters_active),
            if r.parameters_mtp > 0 {
                thousands(r.parameters_mtp)
            } else {
                "-".to_string()
            },
            r.layers,
            r.hidden,
            format!("{} ({})", r.heads, r.kv_heads),
            r.seq_len
        )?;
    }
    Ok(Exit::Success)
}

pub fn run(args: &ModelArgs) -> Result<Exit> {
    let json = args.json;
    if args.preset.as_deref() == Some("list") {
        return list_presets(json);
    }
    let (configs, b, e, link) = models(args)?;
    let mut graphs = Vec::new();
    let mut whole = Vec::new();
    for cfg in &configs {
        let opts = |t: u64| BuildOptions {
            recompute_modules: Default::default(),
            micro_batch: b,
            tensor_parallel: t,
            numerics: archplace_engine::model::Numerics::plain(e),
            link_bytes_per_second: link,
            sequence_parallel: false,
            experts: Default::default(),
            context_parallel: 1,
            kernels: Default::default(),
            fp8_library: Default::default(),
            cross_entropy: Default::default(),
        };
        let counts = Counts::of(cfg, &build(cfg, &opts(1)));
        for t in cfg.tensor_parallel_widths() {
            graphs.push(build(cfg, &opts(t)));
            whole.push(counts);
        }
    }
    if args.ops {
        let blocks: Vec<BlockOps<'_>> = graphs.iter().map(|g| block_ops(g, e)).collect();
        if json {
            print_json(&blocks)?;
        } else {
            for b in &blocks {
                print_ops(b)?;
            }
        }
        return Ok(Exit::Success);
    }
    let reports: Vec<ModelReport> = graphs
        .iter()
        .zip(whole)
        .map(|(g, counts)| report(g, counts))
        .collect();
    if json {
        print_json(&reports)?;
    } else {
        for r in &reports {
            print_table(r)?;
        }
    }
    Ok(Exit::Success)
}
