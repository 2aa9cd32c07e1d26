//! The plugin host against real components: the reference plugin (bit-identical to the
//! native model), the GPU-like example, and every hostile fixture.
//!
//! The components are built by `scripts/build-plugins` (the README's test command runs it
//! first); a test fails, naming that script, if they are missing.

// Tests read the components and files they work on.
#![allow(clippy::disallowed_methods)]

use super::*;
use archplace_plugin_sdk::testing::Rng;
use archplace_plugin_sdk::{AcceleratorConfig, CoreConfig, EstimateError, LatencyModel, Op};
use std::path::PathBuf;

use crate::testing::{component, random_ops, target};

fn host_with(limits: Limits, cache_dir: Option<PathBuf>) -> Host {
    Host::new(HostOptions {
        plugin_dirs: vec![target().join("plugins")],
        cache_dir,
        limits,
        plugin_limits: Default::default(),
        no_memo: false,
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

/// Loads `fixture`, runs one latency call, returns the fault's kind and the error text.
/// Two tensor cores of a small chip and eight random operators: what the fault tests ask.
fn a_call() -> (CoreConfig, Vec<Op>) {
    let core = AcceleratorConfig {
        tensor_cores: 2,
        vector_cores: 2,
        width: 64,
        depth: 64,
        vector_width: 64,
        buffer_bytes: 8 << 20,
    }
    .tensor_core(2);
    (core, random_ops(&mut Rng(1), 8))
}

fn fault_of(host: &Host, fixture: &str) -> (Option<FaultKind>, String) {
    let s = session(host, fixture);
    let (core, ops) = a_call();
    let err = s.latency_uncached(&core, &ops).unwrap_err().to_string();
    (s.faults().last().map(|f| f.kind), err)
}

#[test]
fn every_hostile_fixture_gets_its_own_error_and_the_host_survives() {
    let host = host();
    let cases: [(&str, FaultKind, &str); 8] = [
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
        (
            "hostile-memory-over-latency",
            FaultKind::BadOutput,
            "returned a memory time of 0.000002 s for operator 0, longer than the 0.000001 s",
        ),
    ];
    let good = reference_session(&host);
    let config = crate::check::golden_configs()[2];
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

/// The fault limit holds exactly with concurrent calls, for every hostile fixture: eight
/// threads call a plugin that faults on every call, and the session counts (in its fault
/// log and to the metrics) `max_faults` faults — 1 and 3 — not one per call in flight;
/// every call fails with the fault that reached the limit, and none starts after it.
#[test]
fn the_fault_limit_holds_exactly_across_concurrent_calls() {
    /// Counts the faults reported to the metrics, by plugin.
    #[derive(Default)]
    struct Faults(Mutex<BTreeMap<String, u32>>);
    impl Telemetry for Faults {
        fn call(&self, _: &str, _: f64, _: usize) {}
        fn fault(&self, plugin: &str, _: FaultKind) {
            if let Ok(mut m) = self.0.lock() {
                *m.entry(plugin.to_string()).or_default() += 1;
            }
        }
    }
    let fixtures = [
        ("hostile-trap", "deliberate panic"),
        ("hostile-nan-output", "returned NaN s"),
        ("hostile-negative-output", "returned -1 s"),
        ("hostile-wrong-count", "returned 9 results for 8 operators"),
        ("hostile-enormous-output", "error message of 33554432 bytes"),
        ("hostile-memory-over-latency", "returned a memory time of"),
        ("hostile-infinite-loop", "ran out of fuel"),
        ("hostile-memory-bomb", "exceeded its memory limit"),
    ];
    for (fixture, reason) in fixtures {
        for max_faults in [1, 3] {
            let limits = Limits {
                max_faults,
                ..Limits::default()
            };
            let counted = Arc::new(Faults::default());
            let host = host_with(limits, None).with_telemetry(counted.clone());
            let s = session(&host, fixture);
            let (core, ops) = a_call();
            let errors: Vec<String> = std::thread::scope(|scope| {
                let calls: Vec<_> = (0..8)
                    .map(|_| scope.spawn(|| s.latency_uncached(&core, &ops)))
                    .collect();
                calls
                    .into_iter()
                    .map(|c| c.join().unwrap().unwrap_err().to_string())
                    .collect()
            });
            let case = format!("{fixture}, max_faults {max_faults}");
            assert_eq!(s.faults().len(), max_faults as usize, "{case}: {errors:#?}");
            let metric = |c: &Faults| c.0.lock().unwrap().get(fixture).copied();
            assert_eq!(metric(&counted), Some(max_faults), "{case}");
            assert!(
                errors
                    .iter()
                    .any(|e| e.contains(&format!("{max_faults} fault"))),
                "{case}: {errors:#?}"
            );
            // Every call reports the same reason: the fault that reached the limit.
            for e in &errors {
                assert!(e.contains(reason), "{case}: {e}");
                assert!(e.contains("in this search, the limit"), "{case}: {e}");
            }
            // Later calls are not made at all.
            let e = s.latency_uncached(&core, &ops).unwrap_err().to_string();
            assert!(e.contains(reason), "{case}: {e}");
            assert_eq!(s.faults().len(), max_faults as usize, "{case}");
            assert_eq!(metric(&counted), Some(max_faults), "{case}");
        }
    }
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
    let core = crate::check::golden_configs()[0].tensor_core(1);
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
    let config = crate::check::golden_configs()[3];
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
    let core = crate::check::golden_configs()[4].tensor_core(8);
    let ops = crate::check::golden_tensor_ops();
    let a = reference_session(&host);
    let first = LatencyModel::latency(a.as_ref(), &core, &ops).unwrap();
    assert_eq!(a.counters.memo_hits.load(Ordering::Relaxed), 0);
    let b = reference_session(&host);
    // Opening asked the plugin its tensor element types (interface 1.2), once.
    let opened = b.counters.calls.load(Ordering::Relaxed);
    let second = LatencyModel::latency(b.as_ref(), &core, &ops).unwrap();
    assert_eq!(
        b.counters.memo_hits.load(Ordering::Relaxed),
        ops.len() as u64
    );
    assert_eq!(
        b.counters.calls.load(Ordering::Relaxed),
        opened,
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
fn the_log_import_is_capped_in_rate_and_size() {
    let mut bucket = store::LogBucket::new();
    for _ in 0..100 {
        bucket.emit("p", bindings::Level::Debug, "x".repeat(10_000));
    }
    assert_eq!(bucket.dropped(), 100 - store::LOG_BURST as u64);
}

#[test]
fn a_plugin_built_for_a_later_minor_version_loads() {
    let host = host();
    let loaded = host.load_file(&component("future-minor")).unwrap();
    assert_eq!(loaded.interface, semver::Version::new(1, 4, 0));
    assert_eq!(loaded.info.interface_version, (1, 4));
    let s = host.open(&loaded, vec![], Default::default()).unwrap();
    let c = crate::check::golden_configs()[0];
    assert_eq!(s.area_uncached(&[c]).unwrap()[0], Ok(2e6));
    let ops = crate::check::golden_tensor_ops();
    let costs = s.latency_uncached(&c.tensor_core(1), &ops).unwrap();
    for (op, c) in ops.iter().zip(&costs) {
        // The fixture's fused attention answers 2 µs, everything else 1 µs.
        let want = match op.kind {
            archplace_plugin_sdk::OpKind::Attention(_) => 2e-6,
            _ => 1e-6,
        };
        assert_eq!(c.seconds, want, "{op:?}");
    }
}

/// A plugin built for interface 1.0 (before `detail`) loads in this host and answers; its
/// operators' memory times are unknown. One of 1.1 or later (the reference, 1.3) reports
/// them: each GEMM's and vector operator's DRAM time, at most its time, the collective's
/// none.
#[test]
fn a_plugin_of_interface_1_0_loads_and_one_of_1_1_reports_memory_times() {
    let host = host();
    let old = host.load_file(&component("interface-1-0")).unwrap();
    assert_eq!(old.interface, semver::Version::new(1, 0, 0));
    let s = host.open(&old, vec![], Default::default()).unwrap();
    let (core, ops) = a_call();
    let costs = s.latency_uncached(&core, &ops).unwrap();
    assert!(
        costs
            .iter()
            .all(|c| c.seconds == 1e-6 && c.memory_seconds.is_none())
    );

    let reference = reference_session(&host);
    assert_eq!(reference.loaded().interface, semver::Version::new(1, 3, 0));
    let c = crate::check::golden_configs()[0];
    let native = archplace_reference_cost::ReferenceModel::default();
    for core in [c.tensor_core(c.tensor_cores), c.vector_core(1)] {
        let ops: Vec<Op> = match core.kind {
            archplace_plugin_sdk::CoreKind::Tensor => crate::check::golden_tensor_ops(),
            archplace_plugin_sdk::CoreKind::Vector => crate::check::golden_vector_ops(),
        };
        let got = reference.latency_uncached(&core, &ops).unwrap();
        assert_eq!(got, native.latency(&core, &ops).unwrap());
        for (op, cost) in ops.iter().zip(&got) {
            let m = cost.memory_seconds;
            match op.kind {
                archplace_plugin_sdk::OpKind::AllReduce { .. } => assert_eq!(m, None),
                _ => assert!(
                    m.is_some_and(|m| m > 0.0 && m <= cost.seconds),
                    "{op:?}: {cost:?}"
                ),
            }
        }
    }
}

/// Fused attention goes to `attention-detail` where the plugin has it — the reference's
/// component answers bit for bit as the native model, mixed with other operators in one
/// batch, in order — and a plugin of interface 1.0 prices it as its unfused operators.
#[test]
fn fused_attention_is_priced_by_the_plugin_or_as_its_unfused_operators() {
    use archplace_plugin_sdk::{Attention, Direction, OpKind};
    let host = host();
    let attention = |direction| Op {
        kind: OpKind::Attention(Attention {
            batch: 2,
            heads: 8,
            kv_heads: 2,
            seq: 1024,
            head_dim: 64,
            value_dim: 64,
            causal: true,
        }),
        direction,
        fused: vec![],
        element: archplace_plugin_sdk::ElementType::Bf16,
    };
    let c = crate::check::golden_configs()[0];
    let core = c.tensor_core(c.tensor_cores);
    let mut ops = vec![attention(Direction::Forward)];
    ops.extend(crate::check::golden_tensor_ops().into_iter().take(3));
    ops.push(attention(Direction::Backward));
    let reference = reference_session(&host);
    let got = reference.latency_uncached(&core, &ops).unwrap();
    let native = archplace_reference_cost::ReferenceModel::default();
    assert_eq!(got, native.latency(&core, &ops).unwrap());
    assert!(got[0].memory_seconds.is_some() && got[4].seconds > got[0].seconds);
    // Interface 1.0: forward is two GEMMs (the softmax the first one's epilogue), backward
    // four, each 1 µs in this fixture.
    let old = session(&host, "interface-1-0");
    let got = old.latency_uncached(&core, &ops).unwrap();
    assert!((got[0].seconds - 2e-6).abs() < 1e-18, "{got:?}");
    assert!((got[4].seconds - 4e-6).abs() < 1e-18, "{got:?}");
    // The reference model prices the unfused GEMMs on the same cores.
    let unfused =
        archplace_plugin_sdk::unfused_attention(&ops[..1], |parts| native.latency(&core, parts))
            .unwrap();
    assert!(unfused[0].seconds > reference.latency_uncached(&core, &ops[..1]).unwrap()[0].seconds);
    assert!(got.iter().all(|c| c.memory_seconds.is_none()));
    // A later minor version's plugin answers for itself.
    let future = session(&host, "future-minor");
    let got = future.latency_uncached(&core, &ops).unwrap();
    assert_eq!(got[0].seconds, 2e-6);
    assert_eq!(got[1].seconds, 1e-6);
}

/// Interface 1.2 tells a plugin each operator's element type: the reference (16-bit
/// words) lists fp32, bf16 and fp16 and refuses an FP8 GEMM as unsupported; a later minor
/// version's plugin lists what it lists and answers per type; a plugin of 1.1 lists the
/// untyped three and an FP8 operator or a cast is refused before it reaches the plugin,
/// naming the interface version, while its 16-bit operators are priced as before.
#[test]
fn element_types_reach_a_plugin_of_interface_1_2_and_are_refused_before_it() {
    use archplace_plugin_sdk::{Cast, Direction, ElementType, OpKind};
    let host = host();
    let c = crate::check::golden_configs()[0];
    let core = c.tensor_core(c.tensor_cores);
    let gemm = crate::check::golden_tensor_ops()[0].clone();
    let fp8 = gemm.clone().with_element(ElementType::Fp8);
    let reference = reference_session(&host);
    assert_eq!(
        LatencyModel::tensor_element_types(reference.as_ref()),
        ElementType::UNTYPED.to_vec()
    );
    let e = reference
        .latency_uncached(&core, std::slice::from_ref(&fp8))
        .unwrap_err();
    assert!(
        matches!(&e, EstimateError::Unsupported(m) if m.contains("fp8")),
        "{e}"
    );

    let future = session(&host, "future-minor");
    assert_eq!(
        LatencyModel::tensor_element_types(future.as_ref()),
        vec![ElementType::Bf16, ElementType::Fp8]
    );
    let cast = Op::new(
        OpKind::Cast(Cast {
            elements: 1 << 20,
            to: ElementType::Fp8,
            amax_pass: false,
        }),
        Direction::Backward,
    );
    let got = future
        .latency_uncached(&core, &[gemm.clone(), fp8.clone(), cast.clone()])
        .unwrap();
    assert_eq!(
        got.iter().map(|c| c.seconds).collect::<Vec<_>>(),
        [1e-6, 0.5e-6, 1e-6]
    );

    let old = session(&host, "interface-1-1");
    assert_eq!(old.loaded().interface, semver::Version::new(1, 1, 0));
    assert_eq!(
        LatencyModel::tensor_element_types(old.as_ref()),
        ElementType::UNTYPED.to_vec()
    );
    assert_eq!(
        old.latency_uncached(&core, &[gemm]).unwrap()[0].seconds,
        1e-6
    );
    for op in [fp8, cast] {
        let e = old.latency_uncached(&core, &[op]).unwrap_err();
        assert!(
            matches!(&e, EstimateError::Unsupported(m) if m.contains("interface 1.1") && m.contains("interface 1.2")),
            "{e}"
        );
    }
    assert!(
        old.faults().is_empty(),
        "a refusal is not the plugin's fault"
    );
}

/// The 1.4 fixture's WIT is the SDK's with only the version and one added function, so the
/// test above really is about a minor version.
#[test]
fn the_future_minor_fixture_only_adds_to_the_interface() {
    let sdk = archplace_plugin_sdk::WIT;
    let future = include_str!("../../plugins/hostile/wit/future-minor/cost-model.wit");
    let body: String = future
        .lines()
        .skip_while(|l| l.starts_with("// "))
        .collect::<Vec<_>>()
        .join("\n");
    let expected = sdk
        .replace("@1.3.0;", "@1.4.0;")
        .replace(
            "result<list<op-cost>, estimate-error>;\n",
            "result<list<op-cost>, estimate-error>;\n\n    /// Added in 1.4 (a test fixture: what a later minor version may add).\n    describe-units: func() -> string;\n",
        );
    assert_eq!(body.trim_end(), expected.trim_end());
}

/// A space of a million chips is costed within the reference plugin's default memory cap
/// (one `area` call for the whole space once ran out of the plugin's memory at search
/// time, was reported as an internal error and counted as the plugin's fault).
#[test]
fn a_million_configurations_are_costed_within_the_memory_cap() {
    let host = host();
    let s = reference_session(&host);
    let configs: Vec<AcceleratorConfig> = (0..1_000_000u32)
        .map(|i| AcceleratorConfig {
            tensor_cores: 1 + i % 64,
            vector_cores: 1 + (i / 64) % 64,
            width: 8 << (i / 4096 % 5),
            depth: 8 << (i / 20480 % 5),
            vector_width: 64,
            buffer_bytes: (2 + u64::from(i / 102_400)) << 20,
        })
        .collect();
    let areas = s.area_uncached(&configs).unwrap();
    assert_eq!(areas.len(), configs.len());
    let bad = areas
        .iter()
        .position(|a| !a.as_ref().is_ok_and(|a| *a > 0.0));
    assert!(
        bad.is_none(),
        "{:?}: {:?}",
        bad.map(|i| &configs[i]),
        bad.map(|i| &areas[i])
    );
    assert!(s.faults().is_empty(), "{:?}", s.faults());
    // In order: each answer is its own configuration's.
    let one = s.area_uncached(&configs[777_777..777_778]).unwrap();
    assert_eq!(one[0], areas[777_777]);
}

/// Interface 1.3 lets a plugin declare which parameters calibration may fit and say
/// their configured values: `gpu-like` declares its efficiencies, attention's per-tile
/// work, launch overhead, clock and ring latency, and reports a preset's values and a given one's; a plugin of 1.2
/// loads as before and declares none.
#[test]
fn calibratable_parameters_and_their_configured_values_cross_interface_1_3() {
    use archplace_plugin_sdk::Parameter;
    let host = host();
    let loaded = host.load_file(&component("gpu-like")).unwrap();
    let names: Vec<&str> = loaded
        .info
        .calibratable
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(
        names,
        [
            "matrix_efficiency",
            "attention_efficiency",
            "attention_tile_overhead",
            "memory_efficiency",
            "launch_overhead",
            "clock",
            "link_latency"
        ]
    );
    // Fitted only when asked: whole steps do not determine a per-kernel cost, and the
    // attention kernel's per-tile work is read from its published rates.
    let launch = &loaded.info.calibratable[4];
    assert_eq!((launch.unit.as_str(), launch.fit), ("us", false));
    assert!(!loaded.info.calibratable[2].fit);
    let p = |name: &str, value: &str| Parameter {
        name: name.into(),
        value: value.into(),
    };
    let s = host
        .open(
            &loaded,
            vec![p("preset", "a100-sxm-80gb"), p("launch_overhead", "7 us")],
            Arc::new(AtomicBool::new(false)),
        )
        .unwrap();
    let configured = LatencyModel::configured(s.as_ref());
    let value = |name: &str| configured.iter().find(|(n, _)| n == name).unwrap().1;
    // The A100 preset's measured GEMM ceiling (267.9 of 312 TFLOP/s), its boost clock,
    // and the launch overhead as given, in the declared units.
    assert!((value("matrix_efficiency") - 267.9 / 312.0).abs() < 1e-12);
    assert!((value("clock") - 1.41).abs() < 1e-12);
    assert!((value("launch_overhead") - 7.0).abs() < 1e-9);
    assert!((value("attention_tile_overhead") - 1.9).abs() < 1e-12);

    let old = session(&host, "interface-1-2");
    assert_eq!(old.loaded().interface, semver::Version::new(1, 2, 0));
    assert!(old.loaded().info.calibratable.is_empty());
    assert!(LatencyModel::configured(old.as_ref()).is_empty());
}
