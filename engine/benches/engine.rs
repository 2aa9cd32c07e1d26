//! Engine benchmarks (criterion): `cargo bench -p archplace-engine --bench engine [-- FILTER]`.
//!
//! Fixed workloads on the natively linked reference cost model, so that they measure the
//! engine alone: the architecture space, cost estimates of a GPT-3 block, model graphs,
//! layer schedules (the reference's twelve fixtures, summed, and GPT-3 / Llama-2 blocks,
//! solved and only bounded, as a proven search's bound pass does) and
//! the placement of the reference's gpt3-like fixture.
// Benchmarks read the fixture files (tests as data); the engine itself never does.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use archplace_engine::model::{BuildOptions, PRESETS, build, preset};
use archplace_engine::operators::{OpSet, estimate_all};
use archplace_engine::options::ScheduleOptions;
use archplace_engine::phaze;
use archplace_engine::schedule::{Instance, Method, makespan_lower_bound, solve};
use archplace_engine::space::{REFERENCE_CONFIG, SpaceSpec, enumerate};
use archplace_reference_cost::ReferenceModel;
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use std::hint::black_box;
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

fn options(micro_batch: u64, tensor_parallel: u64) -> BuildOptions {
    BuildOptions {
        recompute_modules: Default::default(),
        micro_batch,
        tensor_parallel,
        numerics: Default::default(),
        link_bytes_per_second: 4 << 30,
        sequence_parallel: false,
        experts: Default::default(),
        context_parallel: 1,
        kernels: Default::default(),
        fp8_library: Default::default(),
        cross_entropy: Default::default(),
    }
}

fn space(c: &mut Criterion) {
    let model = ReferenceModel::default();
    c.bench_function("space/default", |b| {
        b.iter(|| enumerate(black_box(&SpaceSpec::default()), &model).expect("the default space"))
    });
}

/// Every operator of a GPT-3 175B block (t = 8, micro-batch 1, forward and backward) on every
/// tensor- and vector-core configuration of the default space, with all cores and with one.
fn estimate(c: &mut Criterion) {
    let model = ReferenceModel::default();
    let space = enumerate(&SpaceSpec::default(), &model).expect("the default space");
    let g = build(&preset("gpt3-175b").expect("preset"), &options(1, 8));
    let ops = OpSet::of([&g.block.forward, &g.block.backward]);
    c.bench_function("estimate/gpt3-block-default-space", |b| {
        b.iter(|| {
            let t = estimate_all(&model, &space.tensor_core_configs, &ops.tensor).expect("tensor");
            let v = estimate_all(&model, &space.vector_core_configs, &ops.vector).expect("vector");
            (t.len(), v.len())
        })
    });
}

/// The graphs of every preset at every tensor-parallel width.
fn model(c: &mut Criterion) {
    c.bench_function("model/every-preset-every-width", |b| {
        b.iter(|| {
            let mut n = 0;
            for name in PRESETS {
                let cfg = preset(name).expect("preset");
                for t in cfg.tensor_parallel_widths() {
                    n += build(&cfg, &options(1, t)).block.forward.nodes.len();
                }
            }
            n
        })
    });
}

fn fixture_instances() -> Vec<Instance> {
    let dir = fixtures().join("schedule");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/fixtures/schedule")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|x| x == "json")
                && !p.to_string_lossy().ends_with(".expected.json")
        })
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).expect("a fixture");
            phaze::schedule::instance(&phaze::schedule::parse(&text).expect("parses"))
                .expect("an instance")
        })
        .collect()
}

/// The twelve reference layer-schedule fixtures, solved in turn (the reference's commercial
/// solver takes 0.91 s for the sum); each must be proven optimal. Then the forward and
/// backward schedules of a GPT-3 175B block (t = 8) and a Llama-2-7B block on the
/// reference configuration.
fn schedule(c: &mut Criterion) {
    let instances = fixture_instances();
    assert_eq!(instances.len(), 12, "the twelve reference fixtures");
    let opts = ScheduleOptions::default();
    let mut g = c.benchmark_group("schedule");
    g.sample_size(20);
    g.bench_function("fixtures-sum", |b| {
        b.iter(|| {
            let mut mips = 0;
            for inst in &instances {
                let s = solve(inst, &opts).expect("solves");
                assert!(s.optimal, "a fixture was not proven optimal");
                mips += usize::from(s.method == Method::Mip);
            }
            mips
        })
    });
    let model = ReferenceModel::default();
    for (name, t) in [("gpt3-175b", 8), ("llama2-7b", 1)] {
        let graphs = build(&preset(name).expect("preset"), &options(1, t));
        for (pass, graph) in [
            ("forward", &graphs.block.forward),
            ("backward", &graphs.block.backward),
        ] {
            // The reference's semantics: this measures the solver on its own instances.
            let inst = archplace_engine::operators::instance(
                graph,
                &REFERENCE_CONFIG,
                archplace_engine::execution::Execution::DATAFLOW,
                &model,
            )
            .expect("an instance");
            g.bench_function(format!("{name}-t{t}-{pass}"), |b| {
                b.iter(|| solve(black_box(&inst), &opts).expect("solves"))
            });
            // What a proven search's bound pass pays per layer instance instead.
            g.bench_function(format!("{name}-t{t}-{pass}-bound"), |b| {
                b.iter(|| makespan_lower_bound(black_box(&inst)).expect("bounds"))
            });
        }
    }
    g.finish();
}

/// The reference's gpt3-like-t1248-hbm80 fixture: parse and place.
fn placement(c: &mut Criterion) {
    let text = std::fs::read_to_string(fixtures().join("placement/gpt3-like-t1248-hbm80.json"))
        .expect("the placement fixture");
    c.bench_function("placement/gpt3-like-t1248-hbm80", |b| {
        b.iter_batched(
            || text.clone(),
            |text| {
                let input = phaze::parse(&text).expect("parses");
                let problem = phaze::problem(&input).expect("a problem");
                phaze::solve(&problem).expect("solves").final_time_per_batch
            },
            BatchSize::SmallInput,
        )
    });
}

/// The search's placement of GPT-3 175B (t = 8, micro-batch 1, no recomputation, Megatron
/// memory, Adam) over 1,024 devices at the example spec's three HBM sizes: one run for all
/// three (what the search does) against one run per size. Layer sizes from the model graph;
/// layer times fixed (forward 10 ms a block, backward twice that).
fn placement_hbm(c: &mut Criterion) {
    use archplace_engine::placement::{
        Chain, Edge, Layer, MegatronMemory, MemoryRule, Resync, Settings, best_plan, best_plans,
    };
    let g = build(&preset("gpt3-175b").expect("preset"), &options(1, 8));
    let layers: Vec<Layer> = g
        .layers()
        .enumerate()
        .map(|(i, l)| {
            let block = i > 0 && i as u64 <= g.blocks;
            Layer {
                id: i as i64,
                parameter_bytes: l.parameter_bytes as f64,
                activation_bytes: l.stash_bytes as f64,
                workspace_bytes: l.workspace_bytes as f64,
                forward: if block { 0.010 } else { 0.002 },
                backward: if block { 0.020 } else { 0.004 },
                tensor_parallel: l.tensor_parallel,
            }
        })
        .collect();
    let edges = g
        .layers()
        .enumerate()
        .skip(1)
        .map(|(v, _)| Edge {
            from: v - 1,
            to: v,
            bytes: g.block.output_bytes as f64,
        })
        .collect();
    let chains = [Chain {
        width: 8,
        layers,
        edges,
    }];
    let settings = Settings {
        memory_bytes: 0.0,
        devices: 1024,
        bandwidth: (4u64 << 30) as f64,
        micro_batches: 4096,
        recompute: false,
        memory: MemoryRule::Megatron(MegatronMemory {
            replicated_per_parameter_byte: 3.0,
            optimizer_per_parameter_byte: 6.0,
            distributed: false,
            transient_bytes: 0.0,
            sync_per_parameter_byte: 2.0,
        }),
        resync: Resync::LargestStage,
        bubble_per_stage: 1.0,
        runnable: Default::default(),
    };
    let sizes = [32.0, 64.0, 80.0].map(|g: f64| g * (1u64 << 30) as f64);
    let mut group = c.benchmark_group("placement/gpt3-t8-3hbm");
    group.bench_function("together", |b| {
        b.iter(|| best_plans(black_box(&chains), &settings, &sizes).expect("places"))
    });
    group.bench_function("one-per-size", |b| {
        b.iter(|| {
            sizes
                .iter()
                .map(|&memory_bytes| {
                    let one = Settings {
                        memory_bytes,
                        ..settings.clone()
                    };
                    best_plan(black_box(&chains), &one).expect("places")
                })
                .collect::<Vec<_>>()
        })
    });
    group.finish();
}

/// One training step of GPT-3 175B (t = 8, p = 16, d = 8, full recomputation) on the
/// reference chip, explained: the work of `archplace estimate` in-process.
fn step(c: &mut Criterion) {
    use archplace_engine::network::{Network, Tier};
    use archplace_engine::step::{StepInput, StepPlan, estimate_step};
    use archplace_engine::training::{Optimizer, Precision, Recomputation};
    let input = StepInput {
        model: preset("gpt3-175b").expect("preset"),
        plan: StepPlan {
            recompute_modules: Default::default(),
            recompute_layers: None,
            activation_offload_layers: 0,
            tensor_parallel: 8,
            pipeline_parallel: 16,
            data_parallel: 8,
            micro_batch: 1,
            interleaving: 1,
            pipeline_schedule: Default::default(),
            recomputation: Recomputation::Full,
            sequence_parallel: false,
            precision: Precision::Bf16Mixed,
            fp8_scaling: Default::default(),
            fp8_param_gather: false,
            optimizer: Optimizer::Adam,
            distributed_optimizer: false,
            sharding: Default::default(),
            expert_parallel: 1,
            expert_tensor_parallel: 1,
            all_to_all_overlap: false,
            pipeline_parallel_overlap: false,
            context_parallel: 1,
            context_exchange: Default::default(),
            stage_layers: None,
        },
        accelerator: REFERENCE_CONFIG,
        hbm_bytes: 80 << 30,
        devices: 1024,
        global_batch: 1536,
        network: Network {
            node_size: 8,
            host_bytes_per_second: None,
            overlap_efficiency: 1.0,
            intra_node: Tier {
                bytes_per_second: 300e9,
                latency_seconds: 5e-6,
            },
            inter_node: Tier {
                bytes_per_second: 25e9,
                latency_seconds: 10e-6,
            },
        },
        peak_flops_per_second: None,
        schedule: ScheduleOptions {
            node_limit: archplace_engine::options::DEFAULT_NODE_LIMIT,
            time_limit_seconds: archplace_engine::options::DEFAULT_SCHEDULE_TIME_LIMIT_SECONDS,
            heuristic_only: false,
            relative_gap: 0.01,
        },
        execution: archplace_engine::execution::Execution::default(),
    };
    let model = ReferenceModel::default();
    c.bench_function("step/gpt3-t8-p16-d8", |b| {
        b.iter(|| {
            estimate_step(black_box(&input), &model)
                .expect("fits")
                .step_seconds
        })
    });
}

/// One training step of DeepSeek-V3 on 2,048 devices (t = 2, p = 16 with 3, 4 × 14 and 2
/// blocks per stage, d = 64, EP = 64, ETP = 1, sequence parallelism, the distributed
/// optimizer, full recomputation) on the reference chip, list-scheduled as `archplace
/// estimate` (without `--mip`) schedules it: a Mixture-of-Experts estimate in-process.
fn step_moe(c: &mut Criterion) {
    use archplace_engine::network::{Network, Tier};
    use archplace_engine::step::{StepInput, StepPlan, estimate_step};
    use archplace_engine::training::{Optimizer, Precision, Recomputation};
    let mut stage_layers = vec![4; 16];
    (stage_layers[0], stage_layers[15]) = (3, 2);
    let input = StepInput {
        model: preset("deepseek-v3").expect("preset"),
        plan: StepPlan {
            recompute_modules: Default::default(),
            recompute_layers: None,
            activation_offload_layers: 0,
            tensor_parallel: 2,
            pipeline_parallel: 16,
            data_parallel: 64,
            micro_batch: 1,
            interleaving: 1,
            pipeline_schedule: Default::default(),
            recomputation: Recomputation::Full,
            sequence_parallel: true,
            precision: Precision::Bf16Mixed,
            fp8_scaling: Default::default(),
            fp8_param_gather: false,
            optimizer: Optimizer::Adam,
            distributed_optimizer: true,
            sharding: Default::default(),
            expert_parallel: 64,
            expert_tensor_parallel: 1,
            all_to_all_overlap: false,
            pipeline_parallel_overlap: false,
            context_parallel: 1,
            context_exchange: Default::default(),
            stage_layers: Some(stage_layers),
        },
        accelerator: REFERENCE_CONFIG,
        hbm_bytes: 80 << 30,
        devices: 2048,
        global_batch: 8192,
        network: Network {
            node_size: 8,
            host_bytes_per_second: None,
            overlap_efficiency: 1.0,
            intra_node: Tier {
                bytes_per_second: 450e9,
                latency_seconds: 5e-6,
            },
            inter_node: Tier {
                bytes_per_second: 50e9,
                latency_seconds: 10e-6,
            },
        },
        peak_flops_per_second: None,
        schedule: ScheduleOptions {
            heuristic_only: true,
            ..ScheduleOptions::default()
        },
        execution: archplace_engine::execution::Execution::default(),
    };
    let latency = ReferenceModel::default();
    c.bench_function("step/deepseek-v3-2048-devices-ep64", |b| {
        b.iter(|| {
            estimate_step(black_box(&input), &latency)
                .expect("fits")
                .step_seconds
        })
    });
}

criterion_group!(
    benches,
    space,
    estimate,
    model,
    schedule,
    placement,
    placement_hbm,
    step,
    step_moe
);
criterion_main!(benches);
