//! A measuring tool, not a test: on which chips of the custom-tiny example's space a
//! block's backward pass is faster than its forward pass under the reference latency
//! model, with and without the memory floor (the chip's cores sharing its DRAM), and how
//! many of those cases the softmax explains, which the reference's cycle table prices at
//! 10 cycles per element forward (with its exponentials) and 2 backward:
//!
//! ```sh
//! cargo run --release -p archplace-engine --example backward_probe
//! ```

#![allow(
    clippy::print_stderr,
    clippy::disallowed_macros,
    clippy::unwrap_used,
    clippy::expect_used
)]

use archplace_engine::execution::Execution;
use archplace_engine::model::{AttentionKernel, BuildOptions, OpGraph, build, preset};
use archplace_engine::operators as layer;
use archplace_engine::options::ScheduleOptions;
use archplace_engine::schedule::{Instance, solve};
use archplace_plugin_sdk::{AcceleratorConfig, OpKind, VectorKind};
use archplace_reference_cost::ReferenceModel;

fn main() {
    let model = ReferenceModel::default();
    // config/specs/custom-tiny.toml's tiny-llama, micro-batch 2, no tensor parallelism.
    let mut cfg = preset("llama2-7b").unwrap();
    (cfg.layers, cfg.hidden, cfg.heads, cfg.kv_heads) = (4, 512, 8, 2);
    (cfg.ffn, cfg.vocab, cfg.seq_len) = (1408, 32000, 1024);
    // A custom model: attention unfused, as config/specs/custom-tiny.toml's is.
    cfg.attention = AttentionKernel::Unfused;
    let g = build(
        &cfg,
        &BuildOptions {
            recompute_modules: Default::default(),
            micro_batch: 2,
            tensor_parallel: 1,
            numerics: Default::default(),
            link_bytes_per_second: 4 << 30,
            sequence_parallel: false,
            experts: Default::default(),
            context_parallel: 1,
            kernels: Default::default(),
            fp8_library: Default::default(),
            cross_entropy: Default::default(),
        },
    );
    let opts = ScheduleOptions {
        heuristic_only: true,
        ..ScheduleOptions::default()
    };
    let makespan = |inst: &Instance| solve(inst, &opts).unwrap().makespan;
    // The least time of the softmax operators.
    let transcendental = |og: &OpGraph, inst: &Instance| -> f64 {
        og.nodes
            .iter()
            .zip(&inst.tasks)
            .filter(|(n, _)| {
                matches!(
                    n.op.kind,
                    OpKind::Vector {
                        kind: VectorKind::Softmax,
                        ..
                    }
                )
            })
            .map(|(_, t)| t.single.min(t.parallel))
            .sum()
    };
    let (mut chips, mut before, mut after, mut explained) = (0, 0, 0, 0);
    let mut ratios = Vec::new();
    for tensor_cores in [1, 2, 4, 8] {
        for vector_cores in [1, 2, 4] {
            for width in [16, 32, 64, 128] {
                for depth in [16, 32, 64, 128] {
                    for mib in [8, 32] {
                        let c = AcceleratorConfig {
                            tensor_cores,
                            vector_cores,
                            width,
                            depth,
                            vector_width: width,
                            buffer_bytes: mib << 20,
                        };
                        // [with the floor, without] × [forward, backward]; transcendental.
                        let (mut t, mut v) = ([[0.0; 2]; 2], [0.0; 2]);
                        for (k, og) in [&g.block.forward, &g.block.backward].iter().enumerate() {
                            let inst =
                                layer::instance(og, &c, Execution::default(), &model).unwrap();
                            t[0][k] = makespan(&inst);
                            v[k] = transcendental(og, &inst);
                            let mut unshared = inst.clone();
                            unshared.tasks.iter_mut().for_each(|x| x.memory = 0.0);
                            t[1][k] = makespan(&unshared);
                        }
                        chips += 1;
                        before += usize::from(t[1][1] < t[1][0]);
                        if t[0][1] < t[0][0] {
                            after += 1;
                            explained += usize::from(t[0][0] - v[0] <= t[0][1] - v[1]);
                        }
                        ratios.push(t[0][1] / t[0][0]);
                    }
                }
            }
        }
    }
    ratios.sort_by(f64::total_cmp);
    eprintln!("{chips} chips; a block's backward faster than its forward:");
    eprintln!("  each operator with the whole DRAM bandwidth: {before}");
    eprintln!("  the cores sharing it (the memory floor):     {after}");
    eprintln!("  of those, not faster without the softmax: {explained}");
    eprintln!(
        "backward / forward: min {:.3}, median {:.3}, max {:.3}",
        ratios[0],
        ratios[chips / 2],
        ratios[chips - 1]
    );
}
