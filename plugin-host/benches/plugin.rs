//! Plugin-host benchmarks (criterion): `cargo bench -p archplace-plugin-host --bench plugin`.
//!
//! The reference cost model as a WebAssembly component (built by `scripts/build-plugins`)
//! against the same model linked natively: a batched latency call of 1,000 operators
//! (the difference per operator is the host→plugin overhead; target ≤ 0.5 µs), a call with
//! one operator (the fixed cost of a call), and loading the compiled component from the
//! disk cache in a fresh host (target ≤ 5 ms).

use archplace_cost_port::PluginRef;
use archplace_plugin_host::{Host, HostOptions, cache};
use archplace_plugin_sdk::{AcceleratorConfig, Direction, Gemm, LatencyModel, Op, OpKind};
use archplace_reference_cost::ReferenceModel;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;
use std::path::Path;

/// 1,000 distinct tensor-core operators of the shapes the engine produces.
fn thousand_ops() -> Vec<Op> {
    let dims = [64u64, 128, 512, 1024, 2048, 4096, 12288, 50304];
    let mut ops = Vec::new();
    for &m in &dims {
        for &n in &dims {
            for &k in &dims {
                for batch in [1u64, 96] {
                    if ops.len() < 1000 {
                        let direction = if ops.len() % 2 == 0 {
                            Direction::Forward
                        } else {
                            Direction::Backward
                        };
                        ops.push(Op {
                            kind: OpKind::Gemm(Gemm { batch, m, n, k }),
                            direction,
                            fused: vec![],
                            element: archplace_plugin_sdk::ElementType::Bf16,
                        });
                    }
                }
            }
        }
    }
    ops
}

fn options(cache_dir: &Path) -> HostOptions {
    HostOptions {
        plugin_dirs: vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/plugins")],
        cache_dir: Some(cache::dir_in(cache_dir)),
        ..HostOptions::default()
    }
}

fn plugin(c: &mut Criterion) {
    let cache_dir = tempfile::tempdir().expect("a temporary cache folder");
    let host = Host::new(options(cache_dir.path())).expect("a host");
    let loaded = host
        .load(&PluginRef::named("reference"))
        .expect("the reference plugin: run scripts/build-plugins first");
    let session = host
        .open(&loaded, vec![], Default::default())
        .expect("a session");
    let native = ReferenceModel::default();
    let ops = thousand_ops();
    let core = AcceleratorConfig {
        tensor_cores: 4,
        vector_cores: 4,
        width: 128,
        depth: 128,
        vector_width: 128,
        buffer_bytes: 64 << 20,
    }
    .tensor_core(4);

    let mut g = c.benchmark_group("latency-batch");
    g.throughput(Throughput::Elements(ops.len() as u64));
    g.bench_function("wasm", |b| {
        b.iter(|| {
            session
                .latency_uncached(&core, black_box(&ops))
                .expect("answers")
        })
    });
    g.bench_function("native", |b| {
        b.iter(|| native.latency(&core, black_box(&ops)).expect("answers"))
    });
    g.finish();

    c.bench_function("call/one-op", |b| {
        b.iter(|| {
            session
                .latency_uncached(&core, black_box(&ops[..1]))
                .expect("answers")
        })
    });

    // A fresh host each time, so that nothing is kept in memory: read, verify the MAC,
    // deserialize, instantiate and ask for the plugin's info.
    let opts = options(cache_dir.path());
    c.bench_function("load/from-disk-cache", |b| {
        b.iter(|| {
            let fresh = Host::new(opts.clone()).expect("a host");
            let l = fresh.load(&PluginRef::named("reference")).expect("loads");
            assert!(l.from_cache, "loaded from the disk cache");
        })
    });
}

criterion_group!(benches, plugin);
criterion_main!(benches);
