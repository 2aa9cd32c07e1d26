//! `archplace run`: one search, with progress, to result files.

use super::{Exit, load_spec, print_json, thousands};
use anyhow::{Context, Result, bail};
use archplace_engine::search::{Observer, Progress, Strategy};
use archplace_job::folder;
use archplace_job::result::ResultDoc;
use archplace_job::{RunError, Steering};
use archplace_plugin_sdk::text::significant;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// `archplace run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Spec file; the embedded default spec when omitted.
    pub spec: Option<PathBuf>,
    /// Result folder (default: RESULTS/<spec name>/<content hash>).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Root of result folders.
    #[arg(long, default_value = "results")]
    pub results: PathBuf,
    /// Print `result.json` on stdout instead of a summary.
    #[arg(long)]
    pub json: bool,
    /// A calibration file (made by `archplace calibrate`) to apply, instead of the spec's
    /// `[cost_model] calibration`; refused when made for another plugin or version.
    #[arg(long, value_name = "FILE")]
    pub calibration: Option<PathBuf>,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// The most memory the search may need, by the estimate made before it starts
    /// (e.g. "8 GiB"; default: half of this machine's memory): a larger search is
    /// refused with the numbers.
    #[arg(long, value_name = "SIZE", value_parser = super::parse_size)]
    pub memory_budget: Option<u64>,
}

/// A progress bar on a terminal, plain lines every few seconds otherwise.
struct Reporter {
    bar: Option<ProgressBar>,
    started: Instant,
    last_line: Mutex<Instant>,
}

/// The best so far; with `area`, also the area of the chips being visited (the walk goes
/// from large chips to small).
fn describe(p: &Progress, area: bool) -> String {
    let best = match (p.best_throughput_samples_per_second, p.best_area_um2) {
        (Some(t), Some(a)) => format!(
            "best {} samples/s, {} mm²",
            significant(t, 4),
            significant(a / 1e6, 4)
        ),
        _ => "nothing fits yet".to_string(),
    };
    if area {
        format!(
            "chips of {} mm² and up, {best}",
            significant(p.bucket_area_um2 / 1e6, 4)
        )
    } else {
        best
    }
}

impl Observer for Reporter {
    fn bounded(&self, done: usize, total: usize) {
        if let Some(bar) = &self.bar {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
            bar.set_message("bounding candidates");
            return;
        }
        let Ok(mut last) = self.last_line.lock() else {
            return;
        };
        if last.elapsed() >= Duration::from_secs(5) || done == total {
            *last = Instant::now();
            errln!(
                "bounding: {}/{} candidates, {:.1} s",
                thousands(done as u64),
                thousands(total as u64),
                self.started.elapsed().as_secs_f64()
            );
        }
    }

    fn progress(&self, p: &Progress) {
        if let Some(bar) = &self.bar {
            bar.set_length(p.total as u64);
            bar.set_position(p.evaluated as u64);
            bar.set_message(describe(p, false));
            return;
        }
        let Ok(mut last) = self.last_line.lock() else {
            return;
        };
        if last.elapsed() >= Duration::from_secs(5) || p.evaluated == 1 {
            *last = Instant::now();
            errln!(
                "progress: {}/{} candidates, {}, {:.1} s",
                thousands(p.evaluated as u64),
                thousands(p.total as u64),
                describe(p, true),
                self.started.elapsed().as_secs_f64()
            );
        }
    }
}

pub fn run(args: &RunArgs, plugins: &super::plugin::PluginArgs) -> Result<Exit> {
    let (threads, json) = (args.threads, args.json);
    let memory_budget_bytes = args
        .memory_budget
        .unwrap_or_else(archplace_job::memory::machine_budget_bytes);
    if threads == Some(0) {
        bail!("--threads must be at least 1");
    }
    let given = args.spec.is_some();
    let spec = load_spec(args.spec.as_deref(), Some(plugins))?;
    if given {
        for note in spec.defaulted_sections() {
            errln!("note: {note}");
        }
    }
    let host = plugins.host()?;
    let cancel = Arc::new(AtomicBool::new(false));
    let dir = args
        .out
        .clone()
        .unwrap_or_else(|| folder::result_dir(&args.results, &spec));
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.unwrap_or(0))
        .build()
        .context("starting worker threads")?;
    // Plugin and parameter problems, and a search larger than the budget, are reported here,
    // located in the spec, before the progress bar starts.
    let prepared = match archplace_job::prepare(
        &spec,
        &host,
        pool.current_num_threads(),
        Some(memory_budget_bytes),
        &cancel,
        args.calibration.as_deref(),
    ) {
        Ok(p) => p,
        Err(RunError::CostModel(diags)) => {
            for d in &diags {
                err!("{}", d.render(&spec.source_text));
            }
            bail!("{} error(s) in the spec's cost models", diags.len());
        }
        Err(RunError::Memory(diags) | RunError::Area(diags)) => {
            for d in &diags {
                err!("{}", d.render(&spec.source_text));
            }
            bail!("the search was not started");
        }
        Err(e) => return Err(e).context("the search failed"),
    };
    let terminal = std::io::stderr().is_terminal();
    let bar = terminal.then(|| {
        let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template(
            // 80 columns: 8 + 22 + 11 + the message's 33 (`best 12.44 samples/s, 278.7 mm²`).
            "{elapsed_precise} [{bar:20}] {pos}/{len} {wide_msg}",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.enable_steady_tick(Duration::from_millis(200));
        bar
    });
    let reporter = Reporter {
        bar,
        started: Instant::now(),
        last_line: Mutex::new(Instant::now()),
    };
    errln!(
        "searching `{}` with {} thread(s); results in {}",
        spec.name,
        pool.current_num_threads(),
        dir.display()
    );
    // Ctrl-C (or SIGTERM) stops the search at its next candidate and writes the best so far,
    // marked partial; a second one ends the process at once. The journal in `dir` keeps
    // every finished candidate, so running the same spec again continues the search.
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register_conditional_shutdown(
            sig,
            Exit::Interrupted.code().into(),
            cancel.clone(),
        )
        .context("installing signal handlers")?;
        signal_hook::flag::register(sig, cancel.clone()).context("installing signal handlers")?;
    }
    let finished = pool
        .install(|| {
            prepared.run(Steering {
                observer: &reporter,
                cancel: &cancel,
                checkpoint: Some(&dir),
                distributor: None,
            })
        })
        .context("the search failed")?;
    if let Some(bar) = &reporter.bar {
        bar.finish_and_clear();
    }
    folder::write(&dir, &finished).context("writing the results")?;
    let doc = &finished.doc;
    if json {
        print_json(doc)?;
    } else {
        print_summary(doc, &dir)?;
    }
    if doc.search.cancelled {
        errln!(
            "interrupted: the result is partial ({} of {} candidates); run the same spec again to continue",
            doc.search.candidates_evaluated,
            doc.search.candidates_in_space
        );
        return Ok(Exit::Interrupted);
    }
    Ok(if doc.best.is_some() {
        Exit::Success
    } else {
        Exit::Infeasible
    })
}

/// Blocks per pipeline stage, first to last, runs of equal stages shortened: `3 (×8)`,
/// `0, 1 (×6), 3 (×24), 2`.
fn stage_split(blocks: &[u64]) -> String {
    let mut runs: Vec<(u64, usize)> = Vec::new();
    for &b in blocks {
        match runs.last_mut() {
            Some((v, n)) if *v == b => *n += 1,
            _ => runs.push((b, 1)),
        }
    }
    runs.iter()
        .map(|&(v, n)| {
            if n == 1 {
                v.to_string()
            } else {
                format!("{v} (×{n})")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// One model's plan on the best chip: throughput, choices, devices and stages, where the
/// time goes, memory, and the baseline.
fn print_plan(
    m: &archplace_engine::search::ModelPlan,
    cluster_devices: u64,
) -> std::io::Result<()> {
    outln!(
        "  {}: {} samples/s ({} tokens/s), {} s per batch; micro-batch {}, recomputation {}{}, t = {}, d = {}, {}{}",
        m.model,
        significant(m.throughput_samples_per_second, 4),
        significant(m.throughput_tokens_per_second, 4),
        significant(m.time_per_batch_seconds, 3),
        m.plan.step.micro_batch,
        m.plan.step.recomputation.name(),
        match m.plan.precision() {
            Some(p) => format!(
                ", {}{}{}",
                p.name(),
                match m.plan.step.zero_stage() {
                    2 => ", ZeRO-2",
                    3 => ", ZeRO-3 (FSDP)",
                    _ if m.plan.step.distributed_optimizer => ", distributed optimizer",
                    _ => "",
                },
                if m.plan.step.sequence_parallel {
                    ", sequence parallel"
                } else {
                    ""
                }
            ),
            None => String::new(),
        },
        m.plan.step.tensor_parallel,
        m.plan.step.data_parallel,
        if m.plan.step.pipeline_parallel == 1 {
            "1 pipeline stage".to_string()
        } else {
            format!("{} pipeline stages", m.plan.step.pipeline_parallel)
        },
        match (m.pipeline_schedule, m.plan.step.interleaving) {
            (Some(s), v) if s.chunks(v) > 1 =>
                format!(", {} ({} chunks each)", s.name(), s.chunks(v)),
            (Some(s), _) => format!(", {}", s.name()),
            (None, v) if v > 1 => format!(", interleaved ({v} chunks each)"),
            (None, _) => String::new(),
        }
    )?;
    if let (Some(s), Some(base)) = (
        m.pipeline_schedule,
        m.one_f_one_b_throughput_samples_per_second,
    ) && base > 0.0
    {
        outln!(
            "    pipeline schedule: {} ({:+.1}% throughput over the best 1F1B plan)",
            s.describe(),
            100.0 * (m.throughput_samples_per_second / base - 1.0)
        )?;
    }
    if m.plan.step.expert_parallel > 1 || m.plan.step.expert_tensor_parallel > 1 {
        outln!(
            "    experts: EP = {} × ETP = {} (folded into the t × d ranks of each stage)",
            m.plan.step.expert_parallel,
            m.plan.step.expert_tensor_parallel
        )?;
    }
    if m.plan.step.context_parallel > 1 {
        outln!(
            "    context parallelism: CP = {} (each sequence split over CP ranks)",
            m.plan.step.context_parallel
        )?;
    }
    outln!(
        "    devices: t × {}p × d = {} × {}{} × {} = {}{}; blocks per stage: {}{}",
        if m.plan.step.context_parallel > 1 {
            "CP × "
        } else {
            ""
        },
        m.plan.step.tensor_parallel,
        if m.plan.step.context_parallel > 1 {
            format!("{} × ", m.plan.step.context_parallel)
        } else {
            String::new()
        },
        m.plan.step.pipeline_parallel,
        m.plan.step.data_parallel,
        thousands(m.plan.devices_used()),
        if m.plan.devices_used() == cluster_devices {
            " (all)".to_string()
        } else {
            format!(" of {}", thousands(cluster_devices))
        },
        stage_split(&m.plan.stage_layers()),
        if m.layers
            .iter()
            .any(|l| l.layer == archplace_engine::model::LayerKind::Mtp)
        {
            " (the last with the multi-token-prediction modules)"
        } else {
            ""
        },
    )?;
    let share = |x: f64| 100.0 * x / m.time_per_batch_seconds;
    // Every part of the step (TimeBreakdown::parts), the optional ones only when present.
    let parts: Vec<String> = m
        .time
        .parts()
        .iter()
        .filter(|(name, s)| !archplace_engine::step::OPTIONAL_PARTS.contains(name) || *s > 0.0)
        .map(|(name, s)| format!("{name} {:.0}%", share(*s)))
        .collect();
    outln!("    limited by {}: {}", m.limiting, parts.join(", "))?;
    let mem = &m.memory_bytes;
    let gib = |b: f64| b / (1u64 << 30) as f64;
    outln!(
        "    memory of the most loaded stage: {:.1} GiB (weights {:.1}, gradients {:.1}, optimizer {:.1}, activations {:.1})",
        gib(mem.total),
        gib(mem.weights),
        gib(mem.gradients),
        gib(mem.optimizer),
        gib(mem.activations),
    )?;
    if let Some(b) = &m.baseline {
        match b.throughput_samples_per_second {
            Some(t) => outln!(
                "    baseline p={} d={} t={}: {} samples/s ({:.2}× slower than the plan found)",
                b.pipeline,
                b.data,
                b.tensor,
                significant(t, 4),
                m.throughput_samples_per_second / t
            )?,
            None => outln!(
                "    baseline p={} d={} t={}: infeasible ({})",
                b.pipeline,
                b.data,
                b.tensor,
                b.infeasible.as_deref().unwrap_or("")
            )?,
        }
    }
    Ok(())
}

fn print_summary(doc: &ResultDoc, dir: &Path) -> std::io::Result<()> {
    let s = &doc.search;
    outln!(
        "search `{}`: {} of {} candidates evaluated ({} failed) in {} area buckets, {}; {:.1} s",
        doc.spec.name,
        thousands(s.candidates_evaluated as u64),
        thousands(s.candidates_in_space as u64),
        thousands(s.candidates_failed as u64),
        thousands(s.buckets_visited as u64),
        if s.cancelled {
            "interrupted (partial result)"
        } else if s.strategy == Strategy::Proven {
            "proven"
        } else if s.exhaustive {
            "exhaustive"
        } else if s.converged {
            "converged"
        } else {
            "space exhausted"
        },
        doc.timings.total_seconds
    )?;
    if s.strategy == Strategy::Proven && !s.cancelled {
        let remaining = s
            .largest_remaining_bound_samples_per_second
            .map_or(String::new(), |b| {
                format!(", none of which can reach {} samples/s", significant(b, 4))
            });
        outln!(
            "proven best of all {} candidates: {} bounded in {:.1} s ({} of them exactly), {} pruned{remaining}",
            thousands(s.candidates_in_space as u64),
            thousands(s.candidates_bounded as u64),
            doc.timings.bound_seconds,
            thousands(s.candidates_bounded_exactly as u64),
            thousands(s.candidates_pruned as u64),
        )?;
    } else if s.strategy == Strategy::Converge && !s.cancelled && s.converged {
        outln!(
            "not proven: chips the walk did not visit may be better; `[search] strategy = \"proven\"` proves the best of the whole space"
        )?;
    }
    if doc.work.mip_time_limit_hits > 0 {
        outln!(
            "not reproducible: {} layer-schedule MIPs stopped at the wall-clock safety net (schedule_time_limit_seconds), where what they find depends on the machine's speed and load",
            doc.work.mip_time_limit_hits
        )?;
    }
    if s.resumed_candidates > 0 {
        outln!(
            "{} candidates resumed from the journal of an interrupted run",
            s.resumed_candidates
        )?;
    }
    let Some(best) = &doc.best else {
        outln!(
            "no candidate can train every model within the HBM sizes given; see {}/explored.jsonl",
            dir.display()
        )?;
        return Ok(());
    };
    outln!(
        "best chip: {}",
        archplace_job::chip::long(&best.configuration, best.hbm_bytes)
    )?;
    for m in &best.models {
        print_plan(m, doc.spec.devices)?;
    }
    // The chip and each plan, as `archplace estimate` takes them.
    let peak = archplace_job::chip::peak_flops_per_second(
        &best.configuration.chip,
        &doc.cost_models.latency.name,
        &doc.cost_model_parameters,
    );
    for m in &best.models {
        if let Some(plan) = m.plan.estimable() {
            outln!(
                "  {} for `archplace estimate --mip` (the same numbers), in a spec with this model, [training] and [cluster]{}:",
                m.model,
                best.node_size
                    .map_or(String::new(), |n| format!(" (node_size = {n})"))
            )?;
            for line in
                archplace_spec::estimate_toml(&best.configuration.chip, best.hbm_bytes, peak, plan)
                    .lines()
                    .filter(|l| !l.is_empty())
            {
                outln!("    {line}")?;
            }
        }
    }
    if let Some(domains) = &doc.scale_up_domains {
        for line in archplace_job::domains::render(domains).lines() {
            outln!("{line}")?;
        }
    }
    // Why the winner wins: the chips it beat (near-ties first) and what each differs in.
    match &doc.explanation {
        Some(e) => {
            for line in archplace_job::explain::render(e).lines() {
                outln!("{line}")?;
            }
        }
        None => {
            for tie in &doc.near_ties {
                outln!(
                    "near-tie ({:.2}% slower): {}",
                    100.0 * (1.0 - tie.relative_to_best),
                    archplace_job::chip::long(&tie.configuration, tie.hbm_bytes)
                )?;
            }
        }
    }
    if let Some(u) = &doc.uncertainty {
        for line in archplace_job::calibrated::render_search(u).lines() {
            outln!("{line}")?;
        }
    }
    let w = &doc.work;
    outln!(
        "layer schedules: {} ({} settled by bounds, {} MIPs, {} from another buffer's MIP, {} reused); results in {}",
        thousands(w.layer_schedules),
        thousands(w.mips_avoided),
        thousands(w.mips_solved),
        thousands(w.mips_reused),
        thousands(w.schedules_reused),
        dir.display()
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::stage_split;

    #[test]
    fn stage_splits_shorten_runs_of_equal_stages() {
        assert_eq!(stage_split(&[3; 8]), "3 (×8)");
        assert_eq!(stage_split(&[0, 1, 1, 3, 3, 3, 2]), "0, 1 (×2), 3 (×3), 2");
        assert_eq!(stage_split(&[80]), "80");
        assert_eq!(stage_split(&[]), "");
    }
}
