//! Service benchmarks (criterion): `cargo bench -p archplace-service --bench service
//! [-- FILTER]`.
//!
//! * `metrics/*` — what the daemon's metrics add on hot paths (a layer schedule, a plugin
//!   call, a search's progress) and the cost of rendering `/metrics` for a folder of 200
//!   finished specs.

use archplace_engine::schedule::Method;
use archplace_engine::search::{Progress, ScheduleEvent};
use archplace_plugin_host::Telemetry;
use archplace_service::metrics::{Metrics, SpecLabels};
use criterion::{Criterion, criterion_group, criterion_main};
use std::hint::black_box;

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
            m.progress(&labels, &p, (i as u64 - 1, i as u64 - 1))
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

criterion_group!(benches, metrics);
criterion_main!(benches);
