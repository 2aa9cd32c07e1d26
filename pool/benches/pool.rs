//! The pool coordinator's capacity (criterion): `cargo bench -p archplace-pool --bench pool`.
//!
//! * `coordinator/instant-workers/<n>-candidates` — one synthetic search of `n` candidates
//!   (items of 4, in buckets of 20; exhaustive, the synthetic worker posing as 64
//!   workers, so 128 items are published ahead) through a real `nats-server -js` on a
//!   free loopback port, answered by a synthetic worker that replies to every item at once
//!   with a copy of a real evaluation (`archplace_pool::synthetic`): what is measured is
//!   the coordinator publishing items, the server storing them and the answers, and the
//!   coordinator merging the answers in the walk's order. Items per second = n / 4 / time;
//!   a coordinator keeps busy as many worker threads as its candidates per second times
//!   the CPU seconds one candidate takes (README, "A pool of daemons").
//!
//! Needs `nats-server` (Debian package; `scripts/setup --dev` installs it); without it the
//! benchmark says so and measures nothing.

// A benchmark reports what it could not measure on stderr.
#![allow(clippy::print_stderr)]

use archplace_cost_port::{CostModelSource, NativeModels};
use archplace_engine::search::{Evaluator, Supplier};
use archplace_engine::space::{Candidate, REFERENCE_CONFIG, Space};
use archplace_job::result::PoolStatus;
use archplace_job::run::Ending;
use archplace_pool::coordinator::{Coordinator, Search};
use archplace_pool::metrics::PoolMetrics;
use archplace_pool::protocol::{ComponentRef, Item, PROTOCOL_VERSION};
use archplace_pool::{Pool, PoolConfig};
use criterion::{Criterion, criterion_group, criterion_main};
use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const CANDIDATES: usize = 2_000;
/// Workers the synthetic one poses as: the coordinator publishes twice as many items ahead.
const WORKERS: usize = 64;

fn space(n: usize) -> Space {
    Space {
        candidates: (0..n)
            .map(|k| Candidate {
                config: REFERENCE_CONFIG,
                area_um2: (n - k) as f64,
                bucket: ((n - k) / 20) as u64,
            })
            .collect(),
        budget_um2: n as f64,
        min_area_um2: 0.0,
        tensor_core_configs: Vec::new(),
        vector_core_configs: Vec::new(),
        buckets: n / 20,
        bucket_um2: 20.0,
        out_of_domain: 0,
        max_priced_um2: 0.0,
        enumerated: n,
    }
}

fn coordinator(c: &mut Criterion) {
    if Command::new("nats-server")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("coordinator: nats-server not found (scripts/setup --dev installs it); skipped");
        return;
    }
    let dir = tempfile::tempdir().expect("a temporary folder");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let mut server = Command::new("nats-server")
        .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("nats-server starts");
    let settings = PoolConfig {
        nats: Some(format!("nats://127.0.0.1:{port}")),
        work: false,
        item_candidates: 4,
        connect_timeout_seconds: 20.0,
        ..PoolConfig::default()
    };
    let registry = prometheus::Registry::new();
    let metrics = Arc::new(PoolMetrics::new(&registry).expect("metrics"));
    let work = Arc::new(());
    let pool = Pool::connect(settings.clone(), metrics.clone(), work.clone())
        .expect("the coordinator joins");
    let worker = Pool::connect(settings, metrics, work).expect("the synthetic worker joins");
    // A real evaluation (the CLI tests' tiny spec), summarised: what answers carry.
    let spec = archplace_spec::parse(include_str!("../../tests/fixtures/tiny.toml"), "tiny.toml")
        .expect("the tiny spec");
    let models = NativeModels
        .resolve(&spec.cost_model, Arc::new(AtomicBool::new(false)))
        .map_err(|_| "native models")
        .expect("native models");
    let input = spec.search_input();
    let one = space(1);
    let mut record = Evaluator::new(&input, models.latency.as_ref(), &())
        .evaluate(0, &one.candidates[0])
        .expect("an evaluation");
    record.summarise();
    let space = space(CANDIDATES);
    let stop = AtomicBool::new(false);
    let round = AtomicU64::new(0);
    std::thread::scope(|s| {
        s.spawn(|| archplace_pool::synthetic::respond(&worker, &record, &stop, WORKERS));
        let mut g = c.benchmark_group("coordinator/instant-workers");
        g.sample_size(10);
        g.bench_function(format!("{CANDIDATES}-candidates"), |b| {
            b.iter(|| {
                let n = round.fetch_add(1, Ordering::Relaxed);
                let template = Item {
                    protocol: PROTOCOL_VERSION,
                    archplace_version: env!("CARGO_PKG_VERSION").to_string(),
                    search: format!("bench{n:027}"),
                    item: 0,
                    spec_hash: "0".repeat(64),
                    spec_file: "bench.toml".into(),
                    latency: ComponentRef {
                        plugin: "synthetic".into(),
                        version: "0".into(),
                        blake3: "0".repeat(64),
                    },
                    candidates: Vec::new(),
                };
                let status = Mutex::new(PoolStatus::default());
                let search = Search {
                    template,
                    spec_name: "bench".into(),
                    space: &space,
                    exhaustive: true,
                    ordered: false,
                    journaled: BTreeSet::new(),
                    area_blake3: None,
                    carrying: false,
                };
                let mut coordinator =
                    Coordinator::open(&pool, search, Arc::new(AtomicBool::new(false)), &status)
                        .expect("a coordinator");
                for (k, cand) in space.candidates.iter().enumerate() {
                    let e = coordinator.supply(k, cand).expect("an answer");
                    assert!(e.is_some_and(|e| e.index == k));
                }
                coordinator.finish(Ending::Done);
            })
        });
        g.finish();
        stop.store(true, Ordering::Relaxed);
    });
    let _ = server.kill();
    let _ = server.wait();
    std::thread::sleep(Duration::from_millis(10));
}

criterion_group!(benches, coordinator);
criterion_main!(benches);
