//! The plugin host against real components: the reference plugin (bit-identical to the
//! native model), the GPU-like example, and every hostile fixture.
//!
//! The components are built by `scripts/build-plugins` (the README's test command runs it
//! first); a test fails, naming that script, if they are missing.

use super::*;
use crate::engine::space;
use crate::testutil::Rng;
use archplace_plugin_sdk::{
    AcceleratorConfig, AreaModel, CoreConfig, Direction, EstimateError, FusedOp, Gemm,
    LatencyModel, Op, OpKind, VectorKind,
};
use archplace_reference_cost::ReferenceModel;
use std::path::PathBuf;

fn target() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target")
}

/// A built component: `plugins/<name>/<name>.wasm` or `plugin-fixtures/<name>.wasm`.
pub fn component(name: &str) -> PathBuf {
    let installed = target().join(format!("plugins/{name}/{name}.wasm"));
    let fixture = target().join(format!("plugin-fixtures/{name}.wasm"));
    for p in [installed, fixture] {
        if p.is_file() {
            return p;
        }
    }
    panic!("the `{name}` component is not built: run scripts/build-plugins (scripts/test does)");
}

fn host_with(limits: Limits, cache_dir: Option<PathBuf>) -> Host {
    Host::new(HostOptions {
        plugin_dirs: vec![target().join("plugins")],
        cache_dir,
        limits,
        plugin_limits: Default::default(),
    })
    .unwrap()
}

fn host() -> Host {
    host_with(Limits::default(), None)
}

fn session(host: &Host, name: &str) -> Arc<session::Session> {
    let loaded = host.load_file(&component(name)).unwrap();
    host.open(&loaded, vec![], Arc::new(AtomicBool::new(false)))
        .unwrap()
}

fn reference_session(host: &Host) -> Arc<session::Session> {
    session(host, "reference")
}

/// Random operators of every kind, on the shapes the engine produces.
fn random_ops(rng: &mut Rng, n: usize) -> Vec<Op> {
    let dims = [1u64, 8, 64, 96, 128, 512, 1024, 2048, 4096, 12288, 50257];
    let pick = |rng: &mut Rng| dims[rng.below(dims.len() as u64) as usize];
    (0..n)
        .map(|_| {
            let direction = if rng.below(2) == 0 {
                Direction::Forward
            } else {
                Direction::Backward
            };
            let kind = match rng.below(3) {
                0 => OpKind::Gemm(Gemm {
                    batch: pick(rng),
                    m: pick(rng),
                    n: pick(rng),
                    k: pick(rng),
                }),
                1 => OpKind::Vector {
                    kind: VectorKind::ALL[rng.below(VectorKind::ALL.len() as u64) as usize],
                    elements: pick(rng) * pick(rng),
                    row: pick(rng),
                },
                _ => OpKind::AllReduce {
                    bytes: pick(rng) * pick(rng) * 2,
                    group: 1 + rng.below(8) as u32,
                    link_bytes_per_second: 1 + rng.below(1 << 36),
                },
            };
            let fused = if matches!(kind, OpKind::Gemm(_)) && rng.below(3) == 0 {
                vec![FusedOp {
                    kind: VectorKind::Gelu,
                    elements: pick(rng) * pick(rng),
                }]
            } else {
                vec![]
            };
            Op {
                kind,
                direction,
                fused,
            }
        })
        .collect()
}

#[test]
fn the_reference_component_is_bit_identical_to_the_native_model() {
    let host = host();
    let wasm = reference_session(&host);
    let native = ReferenceModel::default();
    // Area: every configuration of the default space, in one batch.
    let spec = crate::spec::default_spec().unwrap();
    let configs: Vec<AcceleratorConfig> = space::product(&spec.space);
    assert_eq!(configs.len(), 25_920, "the default spec's whole product");
    let a = wasm.area_uncached(&configs).unwrap();
    let b = AreaModel::area_um2(&native, &configs).unwrap();
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        match (x, y) {
            (Ok(x), Ok(y)) => assert_eq!(x.to_bits(), y.to_bits(), "config {i}: {:?}", configs[i]),
            (Err(EstimateError::OutOfDomain(_)), Err(EstimateError::OutOfDomain(_))) => {}
            _ => panic!("config {i}: {x:?} vs {y:?}"),
        }
    }
    // Latency: 4,000 random operators on 12 core configurations (48,000 estimates).
    let mut rng = Rng(7);
    let ops = random_ops(&mut rng, 4000);
    let mut compared = 0;
    for c in crate::plugin::check::golden_configs().iter().take(6) {
        for core in [c.tensor_core(c.tensor_cores), c.tensor_core(1)] {
            let tensor_ops: Vec<Op> = ops
                .iter()
                .filter(|o| !matches!(o.kind, OpKind::Vector { .. }))
                .cloned()
                .collect();
            compare_latency(&wasm, &native, &core, &tensor_ops);
            compared += tensor_ops.len();
        }
        for core in [c.vector_core(c.vector_cores), c.vector_core(1)] {
            let vector_ops: Vec<Op> = ops
                .iter()
                .filter(|o| matches!(o.kind, OpKind::Vector { .. }))
                .cloned()
                .collect();
            compare_latency(&wasm, &native, &core, &vector_ops);
            compared += vector_ops.len();
        }
    }
    assert!(compared >= 40_000, "{compared}");
}

fn compare_latency(
    wasm: &session::Session,
    native: &ReferenceModel,
    core: &CoreConfig,
    ops: &[Op],
) {
    let a = wasm.latency_uncached(core, ops);
    let b = LatencyModel::latency(native, core, ops);
    match (a, b) {
        (Ok(a), Ok(b)) => {
            for (i, (x, y)) in a.iter().zip(&b).enumerate() {
                assert_eq!(
                    (x.seconds.to_bits(), x.joules.to_bits()),
                    (y.seconds.to_bits(), y.joules.to_bits()),
                    "{core:?} {:?}",
                    ops[i]
                );
            }
        }
        (Err(a), Err(b)) => assert_eq!(
            std::mem::discriminant(&a),
            std::mem::discriminant(&b),
            "{a} vs {b}"
        ),
        (a, b) => panic!("{core:?}: {a:?} vs {b:?}"),
    }
}

/// Loads `fixture`, runs one latency call, returns the fault's kind and the error text.
fn fault_of(host: &Host, fixture: &str) -> (Option<FaultKind>, String) {
    let s = session(host, fixture);
    let core = AcceleratorConfig {
        tensor_cores: 2,
        vector_cores: 2,
        width: 64,
        depth: 64,
        vector_width: 64,
        buffer_bytes: 8 << 20,
    }
    .tensor_core(2);
    let ops = random_ops(&mut Rng(1), 8);
    let err = s.latency_uncached(&core, &ops).unwrap_err().to_string();
    (s.faults().last().map(|f| f.kind), err)
}

#[test]
fn every_hostile_fixture_gets_its_own_error_and_the_host_survives() {
    let host = host();
    let cases: [(&str, FaultKind, &str); 7] = [
        ("hostile-infinite-loop", FaultKind::Fuel, "ran out of fuel"),
        (
            "hostile-memory-bomb",
            FaultKind::Memory,
            "exceeded its memory limit of 64 MiB",
        ),
        (
            "hostile-trap",
            FaultKind::Trap,
            "deliberate panic in latency",
        ),
        ("hostile-nan-output", FaultKind::BadOutput, "returned NaN s"),
        (
            "hostile-negative-output",
            FaultKind::BadOutput,
            "returned -1 s",
        ),
        (
            "hostile-wrong-count",
            FaultKind::BadOutput,
            "returned 9 results for 8 operators",
        ),
        (
            "hostile-enormous-output",
            FaultKind::BadOutput,
            "error message of 33554432 bytes",
        ),
    ];
    let good = reference_session(&host);
    let config = crate::plugin::check::golden_configs()[2];
    for (fixture, kind, text) in cases {
        let (k, err) = fault_of(&host, fixture);
        assert_eq!(k, Some(kind), "{fixture}: {err}");
        assert!(err.contains(text), "{fixture}: {err}");
        assert!(err.contains(&format!("plugin `{fixture}`")), "{err}");
        assert!(err.contains("3 faults in this search"), "{err}");
        // The process and the good plugin carry on.
        assert!(good.area_uncached(&[config]).unwrap()[0].is_ok());
    }
    // Faults at load time, each with its own message.
    let e = host
        .load_file(&component("hostile-wrong-interface-version"))
        .unwrap_err();
    assert!(matches!(e, PluginError::InterfaceVersion { .. }), "{e}");
    assert!(e.to_string().contains("archplace:cost-model@2.0.0"), "{e}");
    let e = host
        .load_file(&component("hostile-missing-export"))
        .unwrap_err();
    assert!(matches!(e, PluginError::Interface { .. }), "{e}");
    assert!(e.to_string().contains("does not have export `info`"), "{e}");
    let junk = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(junk.path(), b"\0asm not really").unwrap();
    let e = host.load_file(junk.path()).unwrap_err();
    assert!(matches!(e, PluginError::Compile { .. }), "{e}");
    assert!(good.area_uncached(&[config]).unwrap()[0].is_ok());
}

#[test]
fn the_deadline_stops_a_loop_that_has_fuel_to_burn() {
    let limits = Limits {
        fuel_per_call: u64::MAX / 4,
        fuel_per_item: 0,
        deadline_seconds: 0.2,
        max_faults: 1,
        ..Limits::default()
    };
    let host = host_with(limits, None);
    let t = std::time::Instant::now();
    let (kind, err) = fault_of(&host, "hostile-infinite-loop");
    assert_eq!(kind, Some(FaultKind::Deadline), "{err}");
    assert!(err.contains("deadline"), "{err}");
    assert!(t.elapsed().as_secs_f64() < 5.0, "{:?}", t.elapsed());
}

#[test]
fn cancelling_the_search_stops_a_running_plugin_call() {
    let limits = Limits {
        fuel_per_call: u64::MAX / 4,
        fuel_per_item: 0,
        deadline_seconds: 600.0,
        ..Limits::default()
    };
    let host = host_with(limits, None);
    let loaded = host.load_file(&component("hostile-infinite-loop")).unwrap();
    let cancel = Arc::new(AtomicBool::new(false));
    let s = host.open(&loaded, vec![], cancel.clone()).unwrap();
    let flag = cancel.clone();
    let stopper = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(150));
        flag.store(true, Ordering::Relaxed);
        Instant::now()
    });
    let core = crate::plugin::check::golden_configs()[0].tensor_core(1);
    let err = s
        .latency_uncached(&core, &random_ops(&mut Rng(2), 4))
        .unwrap_err()
        .to_string();
    let stopped = Instant::now();
    let cancelled_at = stopper.join().unwrap();
    assert!(err.contains("cancelled"), "{err}");
    let lag = stopped.saturating_duration_since(cancelled_at);
    assert!(lag < Duration::from_millis(500), "{lag:?}");
    assert!(s.faults().is_empty(), "a cancellation is not a fault");
}

#[test]
fn compiled_components_are_cached_on_disk_and_reused() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("compiled");
    let first = host_with(Limits::default(), Some(cache.clone()));
    let a = first.load_file(&component("reference")).unwrap();
    assert!(!a.from_cache);
    let second = host_with(Limits::default(), Some(cache.clone()));
    let b = second.load_file(&component("reference")).unwrap();
    assert!(b.from_cache, "the second host loads the compiled component");
    assert_eq!(a.hash, b.hash);
    // A tampered entry is not loaded: compiled afresh (and the answers stay right).
    for e in std::fs::read_dir(&cache).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "cwasm") {
            let mut bytes = std::fs::read(&p).unwrap();
            let n = bytes.len() / 2;
            bytes[n] ^= 0xff;
            std::fs::write(&p, bytes).unwrap();
        }
    }
    let third = host_with(Limits::default(), Some(cache));
    let c = third.load_file(&component("reference")).unwrap();
    assert!(!c.from_cache);
    let s = third.open(&c, vec![], Default::default()).unwrap();
    let config = crate::plugin::check::golden_configs()[3];
    assert_eq!(
        s.area_uncached(&[config]).unwrap()[0]
            .as_ref()
            .unwrap()
            .to_bits(),
        archplace_reference_cost::area::area_um2(&config)
            .unwrap()
            .to_bits()
    );
}

#[test]
fn estimates_are_memoised_across_sessions_of_a_deterministic_plugin() {
    let host = host();
    let core = crate::plugin::check::golden_configs()[4].tensor_core(8);
    let ops = crate::plugin::check::golden_tensor_ops();
    let a = reference_session(&host);
    let first = LatencyModel::latency(a.as_ref(), &core, &ops).unwrap();
    assert_eq!(a.counters.memo_hits.load(Ordering::Relaxed), 0);
    let b = reference_session(&host);
    let second = LatencyModel::latency(b.as_ref(), &core, &ops).unwrap();
    assert_eq!(
        b.counters.memo_hits.load(Ordering::Relaxed),
        ops.len() as u64
    );
    assert_eq!(
        b.counters.calls.load(Ordering::Relaxed),
        0,
        "no call into the plugin"
    );
    assert_eq!(first, second);
    // Other parameters: another memo.
    let loaded = host.load_file(&component("reference")).unwrap();
    let fast = host
        .open(
            &loaded,
            vec![Parameter {
                name: "clock".into(),
                value: "2.1 GHz".into(),
            }],
            Default::default(),
        )
        .unwrap();
    let third = LatencyModel::latency(fast.as_ref(), &core, &ops).unwrap();
    assert_eq!(fast.counters.memo_hits.load(Ordering::Relaxed), 0);
    assert!(third[0].seconds < first[0].seconds);
}

#[test]
fn parameters_are_validated_by_the_plugin() {
    let host = host();
    let loaded = host.load_file(&component("gpu-like")).unwrap();
    let p = |n: &str, v: &str| Parameter {
        name: n.into(),
        value: v.into(),
    };
    let e = host
        .open(
            &loaded,
            vec![
                p("clock", "fast"),
                p("hbm_bandwidth", "3 TB/s"),
                p("node", "5nm"),
            ],
            Default::default(),
        )
        .unwrap_err();
    let PluginError::Parameters { plugin, errors } = &e else {
        panic!("{e}");
    };
    assert_eq!(plugin, "gpu-like");
    let names: Vec<&str> = errors.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["clock", "node"], "{e}");
    assert!(errors[1].message.contains("has no parameter `node`"), "{e}");
    assert!(
        host.open(
            &loaded,
            vec![p("hbm_bandwidth", "3 TB/s")],
            Default::default()
        )
        .is_ok()
    );
}

#[test]
fn specs_name_plugins_through_the_catalog_with_located_errors() {
    let host = host();
    let base = crate::spec::DEFAULT_SPEC;
    let spec_with = |cost: &str| {
        let text = base.replace(
            "[cost_model]\narea = \"reference\"\nlatency = \"reference\"",
            cost,
        );
        assert!(text.contains(cost));
        crate::spec::parse(&text, "t.toml").unwrap()
    };
    // The default: both models from the reference component.
    let spec = spec_with("[cost_model]\narea = \"reference\"\nlatency = \"reference\"");
    let m = crate::spec::resolve_cost_models(&spec, &host, Default::default()).unwrap();
    assert_eq!(m.area.info().name, "reference");
    assert!(
        m.latency_source
            .blake3
            .as_deref()
            .is_some_and(|h| h.len() == 64)
    );
    // A vendor plugin with parameters.
    let spec = spec_with(
        "[cost_model]\narea = \"reference\"\nlatency = { plugin = \"gpu-like\", version = \"0.1\" }\n[cost_model.parameters.gpu-like]\nclock = \"1.8 GHz\"",
    );
    let m = crate::spec::resolve_cost_models(&spec, &host, Default::default()).unwrap();
    assert_eq!(m.latency.info().name, "gpu-like");
    // Errors, each at its place.
    let spec = spec_with(
        "[cost_model]\narea = \"nonesuch\"\nlatency = { plugin = \"gpu-like\", version = \"7\" }\n[cost_model.parameters.gpu-like]\nclock = \"slow\"",
    );
    let d = crate::spec::resolve_cost_models(&spec, &host, Default::default())
        .err()
        .unwrap();
    let area = d.iter().find(|d| d.field == "cost_model.area").unwrap();
    assert!(
        area.message.contains("no plugin named `nonesuch`"),
        "{area:?}"
    );
    assert!(
        area.message.contains("installed: gpu-like, reference"),
        "{area:?}"
    );
    let lat = d.iter().find(|d| d.field == "cost_model.latency").unwrap();
    assert!(lat.message.contains("no version matches `7`"), "{lat:?}");
    assert!(lat.line > 0 && lat.column > 0);
    // A pinned hash that differs.
    let spec = spec_with(&format!(
        "[cost_model]\narea = {{ plugin = \"reference\", blake3 = \"{}\" }}\nlatency = \"reference\"",
        "0".repeat(64)
    ));
    let d = crate::spec::resolve_cost_models(&spec, &host, Default::default())
        .err()
        .unwrap();
    assert!(d[0].message.contains("but the spec pins 0000"), "{d:?}");
    // A plugin that provides no latency model... and a hostile one is only a spec error.
    let spec = spec_with(
        "[cost_model]\narea = \"reference\"\nlatency = { plugin = \"gpu-like\" }\n[cost_model.parameters.gpu-like]\nnodes = 3",
    );
    let d = crate::spec::resolve_cost_models(&spec, &host, Default::default())
        .err()
        .unwrap();
    let p = d
        .iter()
        .find(|d| d.field == "cost_model.parameters.gpu-like.nodes")
        .unwrap();
    assert!(p.message.contains("no parameter `nodes`"), "{p:?}");
}

#[test]
fn the_log_import_is_capped_in_rate_and_size() {
    let mut bucket = session::LogBucket::new();
    for _ in 0..100 {
        bucket.emit("p", bindings::Level::Debug, "x".repeat(10_000));
    }
    assert_eq!(bucket.dropped(), 100 - session::LOG_BURST as u64);
}

/// A tiny exhaustive search (two candidates) whose latency model is `latency`.
fn tiny_spec(latency: &str) -> crate::spec::Spec {
    let text = format!(
        "{}\n[cost_model]\narea = \"reference\"\nlatency = \"{latency}\"\n",
        include_str!("../../../tests/fixtures/tiny.toml")
    );
    crate::spec::parse(&text, "tiny.toml").unwrap()
}

#[test]
fn a_search_with_a_hostile_plugin_fails_and_the_next_one_succeeds_in_the_same_process() {
    let dir = tempfile::tempdir().unwrap();
    let fixtures = [
        "hostile-trap",
        "hostile-infinite-loop",
        "hostile-memory-bomb",
        "hostile-nan-output",
        "hostile-wrong-count",
    ];
    for f in fixtures {
        let d = dir.path().join(f);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::copy(component(f), d.join(format!("{f}.wasm"))).unwrap();
        std::fs::write(
            d.join(catalog::MANIFEST),
            format!("name = \"{f}\"\nversion = \"0.1.0\"\ninterface = \"1.0\"\n"),
        )
        .unwrap();
    }
    let host = Host::new(HostOptions {
        plugin_dirs: vec![dir.path().to_path_buf(), target().join("plugins")],
        ..HostOptions::default()
    })
    .unwrap();
    let cancel = Arc::new(AtomicBool::new(false));
    for f in fixtures {
        let err = crate::runner::run(&tiny_spec(f), &host, &(), &cancel)
            .err()
            .unwrap_or_else(|| panic!("{f}: the search succeeded"))
            .to_string();
        assert!(err.contains(&format!("plugin `{f}`")), "{f}: {err}");
        let good = crate::runner::run(&tiny_spec("reference"), &host, &(), &cancel).unwrap();
        assert!(good.doc.best.is_some(), "after {f}");
    }
}

#[test]
fn a_plugin_built_for_a_later_minor_version_loads() {
    let host = host();
    let loaded = host.load_file(&component("future-minor")).unwrap();
    assert_eq!(loaded.interface, semver::Version::new(1, 1, 0));
    assert_eq!(loaded.info.interface_version, (1, 1));
    let s = host.open(&loaded, vec![], Default::default()).unwrap();
    let c = crate::plugin::check::golden_configs()[0];
    assert_eq!(s.area_uncached(&[c]).unwrap()[0], Ok(2e6));
    let costs = s
        .latency_uncached(
            &c.tensor_core(1),
            &crate::plugin::check::golden_tensor_ops(),
        )
        .unwrap();
    assert!(costs.iter().all(|c| c.seconds == 1e-6));
}

/// The 1.1 fixture's WIT is the SDK's with only the version and one added function, so the
/// test above really is about a minor version.
#[test]
fn the_future_minor_fixture_only_adds_to_the_interface() {
    let sdk = archplace_plugin_sdk::WIT;
    let future = include_str!("../../../plugins/hostile/wit/future-minor/cost-model.wit");
    let body: String = future
        .lines()
        .skip_while(|l| l.starts_with("// "))
        .collect::<Vec<_>>()
        .join("\n");
    let expected = sdk
        .replace("@1.0.0;", "@1.1.0;")
        .replace(
            "result<list<op-cost>, estimate-error>;\n",
            "result<list<op-cost>, estimate-error>;\n\n    /// Added in 1.1 (a test fixture: what a later minor version may add).\n    describe-units: func() -> string;\n",
        );
    assert_eq!(body.trim_end(), expected.trim_end());
}
