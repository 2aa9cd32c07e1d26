//! `archplace run`: one search, with progress, to result files.

use super::{Exit, load_spec, print_json, thousands};
use anyhow::{Context, Result, bail};
use archplace_engine::search::{Observer, Progress};
use archplace_job::folder;
use archplace_job::{RunError, Steering};
use archplace_plugin_sdk::text::significant;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::path::PathBuf;
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
        outln!("{}", archplace_job::summary::render(doc, &dir).trim_end())?;
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
