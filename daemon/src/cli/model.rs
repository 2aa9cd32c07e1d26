//! `archplace model`: the layers of each model, per tensor-parallel width.

use super::{Exit, load_spec, print_json, thousands};
use anyhow::{Result, bail};
use archplace_engine::model::{BuildOptions, Core, Layer, ModelGraph, build};
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

fn report(g: &ModelGraph) -> ModelReport {
    let layers = vec![
        row(&g.embedding, 1),
        row(&g.block, g.blocks),
        row(&g.head, 1),
    ];
    let totals = Totals {
        layers: g.blocks + 2,
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
        layers,
        totals,
    }
}

fn ops_text(c: &OpCounts) -> String {
    format!("{}/{}/{}/{}", c.tensor, c.fused, c.vector, c.link)
}

fn print_table(r: &ModelReport) -> std::io::Result<()> {
    outln!(
        "{} — micro-batch {}, tensor-parallel width {} (per rank)",
        r.model,
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
    /// Micro-batch size (default: the spec's smallest).
    #[arg(long)]
    pub micro_batch: Option<u64>,
    /// Machine-readable output: one JSON object per model and width.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &ModelArgs) -> Result<Exit> {
    let (micro_batch, json) = (args.micro_batch, args.json);
    let spec = load_spec(args.spec.as_deref())?;
    let b = match micro_batch {
        Some(0) => bail!("--micro-batch must be at least 1"),
        Some(b) => b,
        None => spec
            .training
            .micro_batch_sizes
            .iter()
            .copied()
            .min()
            .unwrap_or(1),
    };
    let mut reports = Vec::new();
    for m in &spec.models {
        for t in m.config.tensor_parallel_widths() {
            let opts = BuildOptions {
                micro_batch: b,
                tensor_parallel: t,
                bytes_per_element: spec.training.bytes_per_element,
                link_bytes_per_second: spec.cluster.link_bytes_per_second as u64,
                sequence_parallel: false,
            };
            reports.push(report(&build(&m.config, &opts)));
        }
    }
    if json {
        print_json(&reports)?;
    } else {
        for r in &reports {
            print_table(r)?;
        }
    }
    Ok(Exit::Success)
}
