//! `archplace bench`: fixed workloads, timed, medians reported. Build with `--release`:
//! a debug build is about 25× slower.

use anyhow::{Context, Result};
use archplace::engine::estimate::{OpSet, estimate_all};
use archplace::engine::model::{BuildOptions, build, preset};
use archplace::engine::space::{SpaceSpec, enumerate};
use archplace_reference_cost::ReferenceModel;
use serde::Serialize;
use std::process::ExitCode;
use std::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    /// Enumerate the default architecture space with the reference area model.
    Space,
    /// Estimate every operator of a GPT-3 175B block (t = 8, micro-batch 1, forward and
    /// backward) on every tensor- and vector-core configuration of the default space, with
    /// all cores and with one core.
    Estimate,
    /// Build the graphs of every preset at every tensor-parallel width.
    Model,
    /// Solve the twelve reference layer-schedule fixtures (sum of solve times), and the
    /// forward and backward schedules of a GPT-3 175B block (t = 8, micro-batch 1) and a
    /// Llama-2-7B block on the largest default configuration.
    Schedule,
    /// Place the reference's gpt3-like-t1248-hbm80 fixture (in process).
    Placement,
    All,
}

#[derive(Serialize)]
struct Report {
    benchmark: &'static str,
    repeat: usize,
    median_seconds: f64,
    min_seconds: f64,
    max_seconds: f64,
    detail: String,
}

fn time<T>(repeat: usize, mut f: impl FnMut() -> Result<T>) -> Result<(Vec<f64>, T)> {
    let mut times = Vec::with_capacity(repeat);
    let mut last = None;
    for _ in 0..repeat.max(1) {
        let start = Instant::now();
        let v = f()?;
        times.push(start.elapsed().as_secs_f64());
        last = Some(v);
    }
    times.sort_by(f64::total_cmp);
    last.map(|v| (times, v)).context("no repetition ran")
}

fn report(benchmark: &'static str, times: &[f64], detail: String) -> Report {
    Report {
        benchmark,
        repeat: times.len(),
        median_seconds: times[times.len() / 2],
        min_seconds: times[0],
        max_seconds: times[times.len() - 1],
        detail,
    }
}

fn emit(r: &Report) -> Result<()> {
    eprintln!(
        "{:<10} median {:>10.3} ms  (min {:.3}, max {:.3}, n = {})  {}",
        r.benchmark,
        r.median_seconds * 1e3,
        r.min_seconds * 1e3,
        r.max_seconds * 1e3,
        r.repeat,
        r.detail
    );
    println!("{}", serde_json::to_string(r)?);
    Ok(())
}

pub fn run(what: Workload, repeat: usize) -> Result<ExitCode> {
    if cfg!(debug_assertions) {
        eprintln!("warning: this is a debug build; measure with `cargo run --release -- bench`");
    }
    let model = ReferenceModel::default();
    let all = what == Workload::All;
    if all || what == Workload::Space {
        let (times, space) = time(repeat, || Ok(enumerate(&SpaceSpec::default(), &model)?))?;
        emit(&report(
            "space",
            &times,
            format!(
                "{} candidates, {} buckets",
                space.candidates.len(),
                space.buckets
            ),
        ))?;
    }
    if all || what == Workload::Estimate {
        let space = enumerate(&SpaceSpec::default(), &model)?;
        let cfg = preset("gpt3-175b").context("the gpt3-175b preset")?;
        let g = build(
            &cfg,
            &BuildOptions {
                micro_batch: 1,
                tensor_parallel: 8,
                bytes_per_element: 2,
                link_bytes_per_second: 4 << 30,
            },
        );
        let ops = OpSet::of([&g.block.forward, &g.block.backward]);
        let (times, n) = time(repeat, || {
            let t = estimate_all(&model, &space.tensor_core_configs, &ops.tensor)?;
            let v = estimate_all(&model, &space.vector_core_configs, &ops.vector)?;
            Ok(t.len() * 2 * ops.tensor.len() + v.len() * 2 * ops.vector.len())
        })?;
        emit(&report(
            "estimate",
            &times,
            format!(
                "{n} estimates: {} tensor ops × {} TC configs and {} vector ops × {} VC configs, × 2 core counts",
                ops.tensor.len(),
                space.tensor_core_configs.len(),
                ops.vector.len(),
                space.vector_core_configs.len()
            ),
        ))?;
    }
    if all || what == Workload::Model {
        let (times, n) = time(repeat, || {
            let mut n = 0;
            for name in archplace::engine::model::PRESETS {
                let cfg = preset(name).context("preset")?;
                for t in cfg.tensor_parallel_widths() {
                    let opts = BuildOptions {
                        micro_batch: 1,
                        tensor_parallel: t,
                        bytes_per_element: 2,
                        link_bytes_per_second: 4 << 30,
                    };
                    n += build(&cfg, &opts).block.forward.nodes.len();
                }
            }
            Ok(n)
        })?;
        emit(&report(
            "model",
            &times,
            format!("every preset at every width ({n} block ops)"),
        ))?;
    }
    if all || what == Workload::Schedule {
        bench_schedule(repeat)?;
    }
    if all || what == Workload::Placement {
        let path = fixtures().join("placement/gpt3-like-t1248-hbm80.json");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let (times, tpb) = time(repeat, || {
            let input = archplace::phaze::parse(&text)?;
            let problem = archplace::phaze::problem(&input)?;
            let out = archplace::phaze::solve(&problem)?;
            Ok(out.final_time_per_batch.unwrap_or(f64::NAN))
        })?;
        emit(&report(
            "placement",
            &times,
            format!("gpt3-like-t1248-hbm80, parse + solve, time per batch {tpb}"),
        ))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The fixtures folder of the repository (the benchmark reads the reference's cases).
fn fixtures() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

fn bench_schedule(repeat: usize) -> Result<()> {
    use archplace::engine::schedule::{Options, solve};
    use archplace::phaze::schedule as format;
    let dir = fixtures().join("schedule");
    let mut instances = Vec::new();
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|x| x == "json")
                && !p.to_string_lossy().ends_with(".expected.json")
        })
        .collect();
    names.sort();
    for p in &names {
        let input = format::parse(&std::fs::read_to_string(p)?)?;
        instances.push(format::instance(&input)?);
    }
    let options = Options::default();
    let (times, mips) = time(repeat, || {
        let mut mips = 0;
        for inst in &instances {
            let s = solve(inst, &options)?;
            anyhow::ensure!(s.optimal, "a fixture was not proven optimal");
            mips += usize::from(s.method == archplace::engine::schedule::Method::Mip);
        }
        Ok(mips)
    })?;
    emit(&report(
        "schedule-fixtures",
        &times,
        format!(
            "sum over {} cases ({mips} needed a MIP); the reference's sum of peer_seconds is 0.91 s",
            instances.len()
        ),
    ))?;

    let model = ReferenceModel::default();
    let config = archplace::engine::space::REFERENCE_CONFIG;
    for (name, t) in [("gpt3-175b", 8), ("llama2-7b", 1)] {
        let cfg = preset(name).context("preset")?;
        let g = build(
            &cfg,
            &BuildOptions {
                micro_batch: 1,
                tensor_parallel: t,
                bytes_per_element: 2,
                link_bytes_per_second: 4 << 30,
            },
        );
        for (pass, graph) in [
            ("forward", &g.block.forward),
            ("backward", &g.block.backward),
        ] {
            let inst = archplace::engine::layer::instance(graph, &config, &model)?;
            let (times, s) = time(repeat, || Ok(solve(&inst, &options)?))?;
            anyhow::ensure!(s.optimal, "{name} {pass} was not proven optimal");
            emit(&report(
                "schedule-block",
                &times,
                format!(
                    "{name} t={t} {pass}: {} ops, makespan {:.3} µs, proven optimal by {:?}",
                    inst.tasks.len(),
                    s.makespan * 1e6,
                    s.method
                ),
            ))?;
        }
    }
    Ok(())
}
