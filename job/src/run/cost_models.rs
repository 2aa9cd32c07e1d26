//! The plugin host as the daemon uses it: the reference component against the native
//! model over a spec's whole space, plugins named by specs, searches with hostile plugins.
//! The components are built by `scripts/build-plugins` (the README's test command runs it).

use archplace_engine::space;
use archplace_plugin_host::Session;
use archplace_plugin_host::catalog;
use archplace_plugin_host::testing::{component, host, random_ops, target};
use archplace_plugin_host::{Host, HostOptions};
use archplace_plugin_sdk::testing::Rng;
use archplace_plugin_sdk::{
    AcceleratorConfig, AreaModel, CoreConfig, EstimateError, LatencyModel, Op, OpKind,
};
use archplace_reference_cost::ReferenceModel;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

fn reference_session(host: &Host) -> Arc<Session> {
    let loaded = host.load_file(&component("reference")).unwrap();
    host.open(&loaded, vec![], Arc::new(AtomicBool::new(false)))
        .unwrap()
}

fn compare_latency(wasm: &Session, native: &ReferenceModel, core: &CoreConfig, ops: &[Op]) {
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

#[test]
fn the_reference_component_is_bit_identical_to_the_native_model() {
    let host = host();
    let wasm = reference_session(&host);
    let native = ReferenceModel::default();
    // Area: every configuration of the default space, in one batch.
    let spec = archplace_spec::default_spec().unwrap();
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
    for c in archplace_plugin_host::check::golden_configs()
        .iter()
        .take(6)
    {
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

#[test]
fn specs_name_plugins_through_the_catalog_with_located_errors() {
    let host = host();
    let base = archplace_spec::DEFAULT_SPEC;
    let spec_with = |cost: &str| {
        let text = base.replace(
            "[cost_model]\narea = \"reference\"\nlatency = \"reference\"",
            cost,
        );
        assert!(text.contains(cost));
        archplace_spec::parse(&text, "t.toml").unwrap()
    };
    // The default: both models from the reference component.
    let spec = spec_with("[cost_model]\narea = \"reference\"\nlatency = \"reference\"");
    let m = archplace_spec::resolve_cost_models(&spec, &host, Default::default()).unwrap();
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
    let m = archplace_spec::resolve_cost_models(&spec, &host, Default::default()).unwrap();
    assert_eq!(m.latency.info().name, "gpu-like");
    // Errors, each at its place.
    let spec = spec_with(
        "[cost_model]\narea = \"nonesuch\"\nlatency = { plugin = \"gpu-like\", version = \"7\" }\n[cost_model.parameters.gpu-like]\nclock = \"slow\"",
    );
    let d = archplace_spec::resolve_cost_models(&spec, &host, Default::default())
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
    let d = archplace_spec::resolve_cost_models(&spec, &host, Default::default())
        .err()
        .unwrap();
    assert!(d[0].message.contains("but the spec pins 0000"), "{d:?}");
    // A plugin that provides no latency model... and a hostile one is only a spec error.
    let spec = spec_with(
        "[cost_model]\narea = \"reference\"\nlatency = { plugin = \"gpu-like\" }\n[cost_model.parameters.gpu-like]\nnodes = 3",
    );
    let d = archplace_spec::resolve_cost_models(&spec, &host, Default::default())
        .err()
        .unwrap();
    let p = d
        .iter()
        .find(|d| d.field == "cost_model.parameters.gpu-like.nodes")
        .unwrap();
    assert!(p.message.contains("no parameter `nodes`"), "{p:?}");
}

/// The search of `spec` with the plugins of `host`, no journal, no budget.
fn search(
    spec: &archplace_spec::Spec,
    host: &Host,
    cancel: &Arc<AtomicBool>,
) -> Result<crate::Finished, crate::RunError> {
    crate::prepare(spec, host, 1, None, cancel, None)?.run(crate::Steering {
        observer: &(),
        cancel,
        checkpoint: None,
        distributor: None,
    })
}

/// A tiny exhaustive search (two candidates) whose latency model is `latency`.
fn tiny_spec(latency: &str) -> archplace_spec::Spec {
    let text = format!(
        "{}\n[cost_model]\narea = \"reference\"\nlatency = \"{latency}\"\n",
        include_str!("../../../tests/fixtures/tiny.toml")
    );
    archplace_spec::parse(&text, "tiny.toml").unwrap()
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
        let err = search(&tiny_spec(f), &host, &cancel)
            .err()
            .unwrap_or_else(|| panic!("{f}: the search succeeded"))
            .to_string();
        assert!(err.contains(&format!("plugin `{f}`")), "{f}: {err}");
        let good = search(&tiny_spec("reference"), &host, &cancel).unwrap();
        assert!(good.doc.best.is_some(), "after {f}");
    }
}
