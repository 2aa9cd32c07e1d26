//! A measuring tool, not a test: where the layer-schedule solver's time and unproven
//! schedules come from on the GPT-3 example search's instances — the first candidates the
//! search visits, every layer graph it schedules on them (minutes in a debug build):
//!
//! ```sh
//! cargo run --release -p archplace-engine --example schedule_probe             # the probe
//! PROBE_CANDIDATES=40 PROBE_NODES=1000 cargo run --release -p archplace-engine --example schedule_probe
//! cargo run --release -p archplace-engine --example schedule_probe -- FILE     # one instance
//! ```
//!
//! With a FILE (an instance the probe dumped), it is solved with the node limits 100 and
//! 10⁶, and what each finds and proves is printed.

#![allow(
    clippy::print_stderr,
    clippy::disallowed_macros,
    clippy::disallowed_methods,
    clippy::disallowed_types,
    clippy::unwrap_used,
    clippy::expect_used
)]

use archplace_engine::execution::Execution;
use archplace_engine::model::{BuildOptions, build, preset};
use archplace_engine::operators as layer;
use archplace_engine::options::ScheduleOptions;
use archplace_engine::schedule::{Method, solve};
use archplace_engine::space::{SpaceSpec, enumerate};
use archplace_reference_cost::ReferenceModel;
use std::collections::BTreeMap;
use std::time::Instant;

fn main() {
    match std::env::args().nth(1) {
        Some(file) => probe_one_instance(&file),
        None => probe_gpt3_layer_schedules(),
    }
}

fn probe_gpt3_layer_schedules() {
    let candidates: usize = std::env::var("PROBE_CANDIDATES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let model = ReferenceModel::default();
    let space = enumerate(&SpaceSpec::default(), &model).unwrap();
    let mut cfg = preset("gpt3-175b").unwrap();
    cfg.seq_len = 2048;
    cfg.max_tensor_parallel = 8;
    let mut graphs = Vec::new();
    for b in [1, 2, 4, 8] {
        for t in cfg.tensor_parallel_widths() {
            graphs.push((
                b,
                t,
                build(
                    &cfg,
                    &BuildOptions {
                        recompute_modules: Default::default(),
                        micro_batch: b,
                        tensor_parallel: t,
                        numerics: Default::default(),
                        link_bytes_per_second: 4 << 30,
                        sequence_parallel: false,
                        experts: Default::default(),
                        context_parallel: 1,
                        kernels: Default::default(),
                        fp8_library: Default::default(),
                        cross_entropy: Default::default(),
                    },
                ),
            ));
        }
    }
    let opts = ScheduleOptions {
        node_limit: std::env::var("PROBE_NODES")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(100),
        time_limit_seconds: 10.0,
        heuristic_only: false,
        relative_gap: 0.01,
    };
    // (layer, direction) → (count, by bounds, by MIP, unproven, seconds, worst gap)
    let mut rows: BTreeMap<String, (u64, u64, u64, u64, f64, f64)> = BTreeMap::new();
    let mut gaps_before_mip = Vec::new();
    let started = Instant::now();
    let mut worst: Option<(f64, String)> = None;
    for cand in space.candidates.iter().take(candidates) {
        for (b, t, g) in &graphs {
            for (name, l) in [
                ("embedding", &g.embedding),
                ("block", &g.block),
                ("head", &g.head),
            ] {
                for (dir, og) in [("fwd", &l.forward), ("bwd", &l.backward)] {
                    let inst =
                        layer::instance(og, &cand.config, Execution::default(), &model).unwrap();
                    let h = solve(
                        &inst,
                        &ScheduleOptions {
                            heuristic_only: true,
                            ..opts
                        },
                    )
                    .unwrap();
                    let s = solve(&inst, &opts).unwrap();
                    if s.method == Method::Mip {
                        gaps_before_mip.push((
                            h.gap,
                            s.gap,
                            s.solve_seconds,
                            format!(
                                "{name}-{dir} b{b} t{t}: list {:.4e}, bound {:.4e}, MIP {:.4e} with bound {:.4e}; {} ops",
                                h.makespan,
                                h.lower_bound,
                                s.makespan,
                                s.makespan * (1.0 - s.gap),
                                inst.tasks.len()
                            ),
                        ));
                        if std::env::var("PROBE_DUMP")
                            .is_ok_and(|d| d == format!("{name}-{dir}-b{b}-t{t}"))
                        {
                            std::fs::write(
                                "/tmp/probe-instance.json",
                                serde_json::to_string_pretty(&inst).unwrap(),
                            )
                            .unwrap();
                        }
                    }
                    if worst.as_ref().is_none_or(|w| s.gap > w.0) {
                        worst = Some((s.gap, serde_json::to_string_pretty(&inst).unwrap()));
                    }
                    let r = rows
                        .entry(format!("{name}-{dir} t{t}"))
                        .or_insert((0, 0, 0, 0, 0.0, 0.0));
                    r.0 += 1;
                    r.1 += u64::from(s.method == Method::Bounds);
                    r.2 += u64::from(s.method == Method::Mip);
                    r.3 += u64::from(s.gap > opts.relative_gap);
                    r.4 += s.solve_seconds;
                    r.5 = r.5.max(s.gap);
                }
            }
        }
    }
    eprintln!(
        "{candidates} candidates, {:.1} s in all",
        started.elapsed().as_secs_f64()
    );
    eprintln!("layer      count bounds mip unproven seconds worst-gap");
    for (k, r) in &rows {
        eprintln!(
            "{k:18} {:5} {:6} {:3} {:8} {:7.3} {:.4}",
            r.0, r.1, r.2, r.3, r.4, r.5
        );
    }
    if let (Ok(path), Some((gap, json))) = (std::env::var("PROBE_WORST"), &worst) {
        eprintln!("the instance with the largest gap ({gap:.4}) is in {path}");
        std::fs::write(path, json).unwrap();
    }
    gaps_before_mip.sort_by(|a, b| b.2.total_cmp(&a.2));
    eprintln!("slowest MIPs: (list-schedule gap, final gap, seconds, layer)");
    for g in gaps_before_mip.iter().take(15) {
        eprintln!("  {:.4} {:.4} {:.3} {}", g.0, g.1, g.2, g.3);
    }
}

/// Solves the instance in `path` (as `probe_gpt3_layer_schedules` dumps it) with the node
/// limits 100 and 10⁶, and prints what each finds and proves.
fn probe_one_instance(path: &str) {
    use archplace_engine::schedule::{Instance, Resource, Task};
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let res = |s: &str| match s {
        "tensor" => Resource::Tensor,
        "vector" => Resource::Vector,
        "fused" => Resource::Fused,
        "link" => Resource::Link,
        _ => Resource::None,
    };
    let inst = Instance {
        tensor_cores: v["tensor_cores"].as_u64().unwrap() as u32,
        vector_cores: v["vector_cores"].as_u64().unwrap() as u32,
        tasks: v["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                Task::new(
                    res(t["resource"].as_str().unwrap()),
                    t["single"].as_f64().unwrap(),
                    t["parallel"].as_f64().unwrap(),
                )
            })
            .collect(),
        edges: v["edges"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e[0].as_u64().unwrap() as usize,
                    e[1].as_u64().unwrap() as usize,
                )
            })
            .collect(),
    };
    for nodes in [100, 1_000_000] {
        let s = solve(
            &inst,
            &ScheduleOptions {
                node_limit: nodes,
                time_limit_seconds: 60.0,
                heuristic_only: false,
                relative_gap: 0.0,
            },
        )
        .unwrap();
        eprintln!(
            "{nodes} nodes: makespan {:.5}, lower bound {:.5}, gap {:.4}, optimal {}, {:.2} s",
            s.makespan, s.lower_bound, s.gap, s.optimal, s.solve_seconds
        );
        for (i, p) in s.placements.iter().enumerate() {
            eprintln!("  {i:2} {:?} {:.4}–{:.4}", p.mode, p.start, p.finish);
        }
    }
}
