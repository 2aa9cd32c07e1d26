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
    /// The reference WebAssembly plugin: host→plugin overhead per operator in a batched
    /// latency call (against the native model), the fixed cost of one call, and loading
    /// the compiled plugin from the disk cache in a fresh host.
    Plugin,
    /// The embedded default search with the WebAssembly reference plugin and with the
    /// native one, alternately: the ratio of their times.
    Search,
    /// The daemon's metrics: the cost of recording a layer schedule, a plugin call and a
    /// search's progress (each on a hot path), and of rendering `/metrics` for a folder of
    /// 200 finished specs and a running search.
    Metrics,
    /// Everything above.
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
    let (scale, unit) = if r.median_seconds < 1e-3 {
        (1e6, "µs")
    } else {
        (1e3, "ms")
    };
    eprintln!(
        "{:<11} median {:>10.3} {unit}  (min {:.3}, max {:.3}, n = {})  {}",
        r.benchmark,
        r.median_seconds * scale,
        r.min_seconds * scale,
        r.max_seconds * scale,
        r.repeat,
        r.detail
    );
    println!("{}", serde_json::to_string(r)?);
    Ok(())
}

pub fn run(what: Workload, repeat: usize, plugins: &super::plugin::PluginArgs) -> Result<ExitCode> {
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
    if all || what == Workload::Plugin {
        bench_plugin(repeat, plugins)?;
    }
    if all || what == Workload::Metrics {
        bench_metrics(repeat)?;
    }
    if all || what == Workload::Search {
        bench_search(repeat.min(5), plugins)?;
    }
    Ok(ExitCode::SUCCESS)
}

fn bench_metrics(repeat: usize) -> Result<()> {
    use archplace::engine::schedule::Method;
    use archplace::engine::search::{Progress, ScheduleEvent};
    use archplace::plugin::Telemetry;
    use archplace::service::metrics::{Metrics, SpecLabels};
    let m = Metrics::new().context("the metrics registry")?;
    m.plugin_known("reference");
    let n = 100_000;
    // `n` calls of `f`; the median time per call.
    let per_call = |what: &str, f: &mut dyn FnMut(usize)| -> Result<()> {
        let (times, ()) = time(repeat, || {
            (0..n).for_each(&mut *f);
            Ok(())
        })?;
        let ns = times[times.len() / 2] / n as f64 * 1e9;
        emit(&report(
            "metrics",
            &times,
            format!("{n} {what}: {ns:.0} ns each"),
        ))
    };
    let event = ScheduleEvent {
        method: Method::Mip,
        solve_seconds: 0.004,
        hit_time_limit: false,
        proven_optimal: true,
    };
    per_call(
        "layer-schedule events (MIP: counter + histogram)",
        &mut |_| m.schedule(std::hint::black_box(&event)),
    )?;
    per_call(
        "plugin calls (2 labelled counters + histogram; a 1-op call takes ~1,600 ns)",
        &mut |_| m.call("reference", std::hint::black_box(2.5e-6), 17),
    )?;
    let labels = SpecLabels {
        spec: "bench".into(),
        file: "bench.toml".into(),
    };
    let mut seen = (0, 0);
    per_call("progress updates (one per candidate)", &mut |i| {
        let p = Progress {
            evaluated: i,
            total: n,
            bucket: 3,
            bucket_area_um2: 3e4,
            best_throughput_samples_per_second: Some(1.0),
            best_area_um2: Some(2e8),
            estimates_computed: i as u64,
            estimate_cache_hits: i as u64,
        };
        m.progress(&labels, &p, &mut seen)
    })?;
    for i in 0..200 {
        let l = SpecLabels {
            spec: format!("spec-{i}"),
            file: format!("spec-{i}.toml"),
        };
        m.set_result(&l, 100.0 + i as f64, 2e8);
    }
    let (times, bytes) = time(repeat, || Ok(m.render().len()))?;
    emit(&report(
        "metrics",
        &times,
        format!("render /metrics with 200 finished specs and a running search: {bytes} bytes"),
    ))
}

/// 1,000 distinct tensor-core operators of the shapes the engine produces.
fn thousand_ops() -> Vec<archplace_plugin_sdk::Op> {
    use archplace_plugin_sdk::{Direction, Gemm, Op, OpKind};
    let dims = [64u64, 128, 512, 1024, 2048, 4096, 12288, 50304];
    let mut ops = Vec::new();
    'outer: for &m in &dims {
        for &n in &dims {
            for &k in &dims {
                for batch in [1u64, 96] {
                    ops.push(Op {
                        kind: OpKind::Gemm(Gemm { batch, m, n, k }),
                        direction: if ops.len() % 2 == 0 {
                            Direction::Forward
                        } else {
                            Direction::Backward
                        },
                        fused: vec![],
                    });
                    if ops.len() == 1000 {
                        break 'outer;
                    }
                }
            }
        }
    }
    ops
}

fn bench_plugin(repeat: usize, plugins: &super::plugin::PluginArgs) -> Result<()> {
    use archplace::cost::PluginRef;
    use archplace_plugin_sdk::LatencyModel;
    let cache = tempfile::tempdir().context("a temporary cache folder")?;
    let mut options = plugins.options();
    options.cache_dir = Some(archplace::plugin::cache::dir_in(cache.path()));
    let host = archplace::plugin::Host::new(options.clone())?;
    let loaded = host.load(&PluginRef::named("reference"))?;
    let session = host.open(&loaded, vec![], Default::default())?;
    let native = ReferenceModel::default();
    let ops = thousand_ops();
    let core = archplace_plugin_sdk::AcceleratorConfig {
        tensor_cores: 4,
        vector_cores: 4,
        width: 128,
        depth: 128,
        vector_width: 128,
        buffer_bytes: 64 << 20,
    }
    .tensor_core(4);
    let n = ops.len() as f64;
    // Interleaved, so that both see the same machine; many calls per sample.
    let reps = 50;
    let (mut wasm_t, mut native_t) = (Vec::new(), Vec::new());
    for _ in 0..repeat.max(1) {
        let t = Instant::now();
        for _ in 0..reps {
            session.latency_uncached(&core, &ops)?;
        }
        wasm_t.push(t.elapsed().as_secs_f64() / reps as f64);
        let t = Instant::now();
        for _ in 0..reps {
            std::hint::black_box(native.latency(&core, &ops)?);
        }
        native_t.push(t.elapsed().as_secs_f64() / reps as f64);
    }
    let overhead: Vec<f64> = {
        let mut v: Vec<f64> = wasm_t
            .iter()
            .zip(&native_t)
            .map(|(w, n_)| (w - n_) / n)
            .collect();
        v.sort_by(f64::total_cmp);
        v
    };
    wasm_t.sort_by(f64::total_cmp);
    native_t.sort_by(f64::total_cmp);
    emit(&report(
        "plugin-op",
        &overhead,
        format!(
            "host→plugin overhead per operator in a batch of {n}: median {:.3} µs (target ≤ 0.5 µs); a batch takes {:.1} µs in WebAssembly, {:.1} µs natively",
            overhead[overhead.len() / 2] * 1e6,
            wasm_t[wasm_t.len() / 2] * 1e6,
            native_t[native_t.len() / 2] * 1e6
        ),
    ))?;
    let one = &ops[..1];
    let (times, _) = time(repeat, || {
        for _ in 0..1000 {
            session.latency_uncached(&core, one)?;
        }
        Ok(())
    })?;
    let per_call: Vec<f64> = times.iter().map(|t| t / 1000.0).collect();
    emit(&report(
        "plugin-call",
        &per_call,
        "one latency call with one operator (the fixed cost of a call)".into(),
    ))?;
    // Loading from the disk cache: a fresh host each time (no in-memory copy).
    let mut load_t = Vec::new();
    let mut from_cache = true;
    for _ in 0..repeat.max(1) {
        let fresh = archplace::plugin::Host::new(options.clone())?;
        let t = Instant::now();
        let l = fresh.load(&PluginRef::named("reference"))?;
        load_t.push(t.elapsed().as_secs_f64());
        from_cache &= l.from_cache;
    }
    load_t.sort_by(f64::total_cmp);
    emit(&report(
        "plugin-load",
        &load_t,
        format!(
            "cached compiled reference plugin: read, verify, deserialize, instantiate, info (from cache: {from_cache}; target ≤ 5 ms; compiling took {:.1} ms)",
            loaded.compile_seconds * 1e3
        ),
    ))?;
    Ok(())
}

fn bench_search(repeat: usize, plugins: &super::plugin::PluginArgs) -> Result<()> {
    use archplace::cost::{CostModelSource, NativeModels};
    let spec = archplace::spec::default_spec()
        .map_err(|_| anyhow::anyhow!("the embedded default spec is invalid"))?;
    let host = plugins.host()?;
    let cancel = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut ratios = Vec::new();
    let (mut wasm_t, mut native_t) = (Vec::new(), Vec::new());
    let mut best = (f64::NAN, f64::NAN);
    for _ in 0..repeat.max(1) {
        let one = |source: &dyn CostModelSource| -> Result<(f64, f64)> {
            let t = Instant::now();
            let f = archplace::runner::run(&spec, source, &(), &cancel)?;
            Ok((
                t.elapsed().as_secs_f64(),
                f.doc
                    .best
                    .as_ref()
                    .map(|b| b.mean_throughput_samples_per_second)
                    .unwrap_or(f64::NAN),
            ))
        };
        let (w, bw) = one(&host)?;
        let (nt, bn) = one(&NativeModels)?;
        best = (bw, bn);
        ratios.push(w / nt);
        wasm_t.push(w);
        native_t.push(nt);
    }
    ratios.sort_by(f64::total_cmp);
    wasm_t.sort_by(f64::total_cmp);
    native_t.sort_by(f64::total_cmp);
    emit(&report(
        "search",
        &wasm_t,
        format!(
            "default spec with the WebAssembly reference plugin: median {:.2} s vs {:.2} s native, ratio {:.3} (median of per-pair ratios; target ≤ 1.2); same best: {} ({} vs {} samples/s)",
            wasm_t[wasm_t.len() / 2],
            native_t[native_t.len() / 2],
            ratios[ratios.len() / 2],
            best.0 == best.1,
            best.0,
            best.1
        ),
    ))?;
    Ok(())
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
