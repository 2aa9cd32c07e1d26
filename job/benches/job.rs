//! Job benchmarks (criterion): `cargo bench -p archplace-job --bench job [-- FILTER]`.
//!
//! * `search/default-spec/{wasm,native}` — the embedded default search with the WebAssembly
//!   reference plugin (built by `scripts/build-plugins`) and with the natively linked one;
//!   the ratio of the two is the cost of sandboxing (target ≤ 1.2).
//! * `estimate/a100-example/wasm` — `archplace estimate`'s work in-process for
//!   `config/specs/estimate-a100.toml` (the gpu-like plugin, loaded once): build the model,
//!   estimate and schedule its layers, the step model. Target ≤ 5 ms.
//! * `estimate/deepseek-v3/SCHEDULE` — the DeepSeek-V3 example under each pipeline
//!   schedule. Target ≤ 3 ms.

// A benchmark reports what it could not measure on stderr.
#![allow(clippy::print_stderr)]

use archplace_cost_port::{CostModelSource, NativeModels};
use archplace_engine::step::StepInput;
use archplace_plugin_host::{Host, HostOptions};
use archplace_plugin_sdk::LatencyModel;
use criterion::{Criterion, criterion_group, criterion_main};
use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

fn search(c: &mut Criterion) {
    let spec = archplace_spec::default_spec().expect("the embedded default spec");
    let host = Host::new(HostOptions {
        plugin_dirs: vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/plugins")],
        ..HostOptions::default()
    })
    .expect("a host");
    let cancel = Arc::new(AtomicBool::new(false));
    let run = |source: &dyn CostModelSource| {
        archplace_job::prepare(
            &spec,
            source,
            rayon::current_num_threads(),
            None,
            &cancel,
            None,
        )
        .and_then(|p| {
            p.run(archplace_job::Steering {
                observer: &(),
                cancel: &cancel,
                checkpoint: None,
                distributor: None,
            })
        })
        .expect("the default search: run scripts/build-plugins first")
        .doc
        .best
        .map(|b| b.mean_throughput_samples_per_second)
    };
    // The same answer either way, up to the layer schedules' wall-clock MIP limit (a MIP cut
    // short under load can settle a slightly different schedule); reported, not asserted.
    let (wasm, native) = (run(&host), run(&NativeModels));
    if wasm != native {
        eprintln!("note: best throughput {wasm:?} with the plugin, {native:?} natively");
    }
    let mut g = c.benchmark_group("search/default-spec");
    g.sample_size(10);
    g.bench_function("wasm", |b| b.iter(|| run(&host)));
    g.bench_function("native", |b| b.iter(|| run(&NativeModels)));
    g.finish();
}

/// An example estimate spec's step input and its latency model (the gpu-like plugin,
/// loaded once, its answers memoised by the host as in the daemon).
fn example(name: &str) -> (StepInput, Arc<dyn LatencyModel>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let spec = archplace_spec::load(&root.join("config/specs").join(name))
        .expect("the example estimate spec");
    let host = Host::new(HostOptions {
        plugin_dirs: vec![root.join("target/plugins")],
        ..HostOptions::default()
    })
    .expect("a host");
    let models =
        archplace_spec::resolve_cost_models(&spec, &host, Arc::new(AtomicBool::new(false)))
            .expect("the gpu-like plugin: run scripts/build-plugins first");
    let input = spec
        .step_input(archplace_spec::Scheduling::default())
        .expect("a fixed chip and plan");
    (input, models.latency.clone())
}

fn estimate(c: &mut Criterion) {
    let (input, latency) = example("estimate-a100.toml");
    // After the first iteration this is the engine's work with warm answers (the engine's
    // own bench, `step/…`, has no memo and runs the MIP).
    c.bench_function("estimate/a100-example/wasm", |b| {
        b.iter(|| {
            archplace_engine::step::estimate_step(black_box(&input), latency.as_ref())
                .expect("the example plan fits")
                .step_seconds
        })
    });
}

/// `estimate/deepseek-v3/SCHEDULE` — the DeepSeek-V3 example
/// (`config/specs/estimate-deepseek-v3-h800.toml`, 16 stages, 120 micro-batches) under
/// each pipeline schedule that runs its plan: the step model with the schedule's
/// simulation. Target ≤ 3 ms.
fn estimate_schedules(c: &mut Criterion) {
    let (base, latency) = example("estimate-deepseek-v3-h800.toml");
    let mut g = c.benchmark_group("estimate/deepseek-v3");
    for schedule in archplace_engine::pipeline::PipelineSchedule::ALL {
        if schedule == archplace_engine::pipeline::PipelineSchedule::Interleaved {
            continue; // 61 blocks over 16 stages of equal chunks: not this plan's shape.
        }
        let mut input = base.clone();
        input.plan.pipeline_schedule = schedule;
        g.bench_function(schedule.name(), |b| {
            b.iter(|| {
                archplace_engine::step::estimate_step(black_box(&input), latency.as_ref())
                    .expect("the example plan fits")
                    .step_seconds
            })
        });
    }
    g.finish();
}

criterion_group!(benches, search, estimate, estimate_schedules);
criterion_main!(benches);
