//! Daemon-level benchmarks (criterion): `cargo bench -p archplace --bench daemon [-- FILTER]`.
//!
//! * `search/default-spec/{wasm,native}` — the embedded default search with the WebAssembly
//!   reference plugin (built by `scripts/build-plugins`) and with the natively linked one;
//!   the ratio of the two is the cost of sandboxing (target ≤ 1.2).
//! * `estimate/a100-example/wasm` — `archplace estimate`'s work in-process for
//!   `config/specs/estimate-a100.toml` (the gpu-like plugin, loaded once): build the model,
//!   estimate and schedule its layers, the step model. Target ≤ 5 ms.
//! * `metrics/*` — what the daemon's metrics add on hot paths (a layer schedule, a plugin
//!   call, a search's progress) and the cost of rendering `/metrics` for a folder of 200
//!   finished specs.

use archplace::cost::{CostModelSource, NativeModels};
use archplace::service::metrics::{Metrics, SpecLabels};
use archplace_engine::schedule::Method;
use archplace_engine::search::{Progress, ScheduleEvent};
use archplace_plugin_host::{Host, HostOptions, Telemetry};
use criterion::{Criterion, criterion_group, criterion_main};
use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

fn search(c: &mut Criterion) {
    let spec = archplace::spec::default_spec().expect("the embedded default spec");
    let host = Host::new(HostOptions {
        plugin_dirs: vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/plugins")],
        ..HostOptions::default()
    })
    .expect("a host");
    let cancel = Arc::new(AtomicBool::new(false));
    let run = |source: &dyn CostModelSource| {
        archplace::runner::run(&spec, source, &(), &cancel, None, None)
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

fn estimate(c: &mut Criterion) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let spec = archplace::spec::load(&root.join("config/specs/estimate-a100.toml"))
        .expect("the example estimate spec");
    let host = Host::new(HostOptions {
        plugin_dirs: vec![root.join("target/plugins")],
        ..HostOptions::default()
    })
    .expect("a host");
    let models =
        archplace::spec::resolve_cost_models(&spec, &host, Arc::new(AtomicBool::new(false)))
            .expect("the gpu-like plugin: run scripts/build-plugins first");
    let input = archplace::estimate::step_input(&spec).expect("a fixed chip and plan");
    // As in the daemon, the host memoises the (deterministic) plugin's answers: after the
    // first iteration this is the engine's work with warm answers (the engine's own bench,
    // `step/…`, has no memo and runs the MIP).
    let latency = models.latency.clone();
    c.bench_function("estimate/a100-example/wasm", |b| {
        b.iter(|| {
            archplace_engine::step::estimate_step(black_box(&input), latency.as_ref())
                .expect("the example plan fits")
                .step_seconds
        })
    });
}

fn metrics(c: &mut Criterion) {
    let m = Metrics::new().expect("the metrics registry");
    m.plugin_known("reference");
    let event = ScheduleEvent {
        method: Method::Mip,
        solve_seconds: 0.004,
        hit_time_limit: false,
        proven_optimal: true,
    };
    c.bench_function("metrics/layer-schedule-event", |b| {
        b.iter(|| m.schedule(black_box(&event)))
    });
    // A 1-operator plugin call itself takes ~1.6 µs (plugin benchmark `call/one-op`).
    c.bench_function("metrics/plugin-call", |b| {
        b.iter(|| m.call("reference", black_box(2.5e-6), 17))
    });
    let labels = SpecLabels {
        spec: "bench".into(),
        file: "bench.toml".into(),
    };
    let mut seen = (0, 0);
    let mut i = 0usize;
    c.bench_function("metrics/progress-update", |b| {
        b.iter(|| {
            i += 1;
            let p = Progress {
                evaluated: i,
                total: usize::MAX,
                bucket: 3,
                bucket_area_um2: 3e4,
                best_throughput_samples_per_second: Some(1.0),
                best_area_um2: Some(2e8),
                estimates_computed: i as u64,
                estimate_cache_hits: i as u64,
            };
            m.progress(&labels, &p, &mut seen)
        })
    });
    for i in 0..200 {
        let l = SpecLabels {
            spec: format!("spec-{i}"),
            file: format!("spec-{i}.toml"),
        };
        m.set_result(&l, 100.0 + i as f64, 2e8);
    }
    c.bench_function("metrics/render-200-specs", |b| b.iter(|| m.render().len()));
}

criterion_group!(benches, search, estimate, metrics);
criterion_main!(benches);
