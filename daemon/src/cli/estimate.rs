//! `archplace estimate`: the step of one chip and one plan, explained; `estimate op`: one
//! operator on that chip.

use super::{Exit, load_spec, print_json};
use anyhow::{Context, Result, anyhow};
use archplace_job::estimate::{self, OpRequest};
use archplace_job::estimated::{self, EstimateError, EstimateOptions};
use archplace_plugin_sdk::{Direction, ElementType, VectorKind};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct EstimateArgs {
    #[command(subcommand)]
    pub command: Option<EstimateCommand>,
    /// Spec with one model, an [accelerator] table (the chip) and a [plan] table.
    #[arg(required = true)]
    pub spec: Option<PathBuf>,
    /// Print one JSON object (step_seconds, time, memory_bytes, ...) on stdout.
    #[arg(long)]
    pub json: bool,
    /// Schedule layers as the search does (a MIP when the list schedule is not within the
    /// spec's schedule_gap, bounded by a node limit: the same spec gives the same answer,
    /// unless the wall-clock limit behind it, a safety net, fires on a loaded machine).
    /// Default: the list schedule, its gap reported.
    #[arg(long)]
    pub mip: bool,
    /// A calibration file (made by `archplace calibrate`) to apply, instead of the spec's
    /// `[cost_model] calibration`; refused when made for another plugin or version.
    #[arg(long, value_name = "FILE")]
    pub calibration: Option<PathBuf>,
    /// Write the step's timeline in Chrome's Trace Event Format (open it in Perfetto or
    /// chrome://tracing): one track per pipeline stage and chunk, each micro-batch's
    /// passes, the exposed communication, the synchronisation and the optimizer.
    #[arg(long, value_name = "FILE")]
    pub timeline: Option<PathBuf>,
    /// Draw the step's timeline as an SVG, one lane per pipeline stage.
    #[arg(long, value_name = "FILE")]
    pub timeline_svg: Option<PathBuf>,
}

#[derive(Debug, clap::Subcommand)]
pub enum EstimateCommand {
    /// One operator on the spec's [accelerator] with its latency model: seconds, joules,
    /// cycles (when the model has a clock).
    Op(OpArgs),
}

#[derive(Debug, clap::Args)]
pub struct OpArgs {
    /// Spec with an [accelerator] table and the [cost_model] to use.
    pub spec: PathBuf,
    /// A GEMM, MxNxK or BATCHxMxNxK (on the tensor cores).
    #[arg(long, conflicts_with = "vector", required_unless_present = "vector")]
    pub gemm: Option<String>,
    /// A vector operation (on the vector cores): layer_norm, rms_norm, add, mul, bias_add,
    /// scale, gelu, relu, silu, tanh, dropout, softmax, cross_entropy, rotary, embedding.
    #[arg(long, requires = "elements")]
    pub vector: Option<String>,
    /// Elements of the vector operation.
    #[arg(long)]
    pub elements: Option<u64>,
    /// Row length of a row-wise vector operation (softmax, norms); default 1.
    #[arg(long)]
    pub row: Option<u64>,
    /// The GEMM's input element type: fp32, bf16, fp16, fp8, mxfp8 or nvfp4 (a latency
    /// model of interface 1.2 prices it at that type's rate; an older one cannot be told).
    #[arg(long, default_value = "bf16")]
    pub element: String,
    /// Cores to use (default: all of the kind).
    #[arg(long)]
    pub cores: Option<u32>,
    /// Cost the operator's backward kernel.
    #[arg(long)]
    pub backward: bool,
    /// Print JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &EstimateArgs, plugins: &super::plugin::PluginArgs) -> Result<Exit> {
    match &args.command {
        Some(EstimateCommand::Op(op)) => run_op(op, plugins),
        None => {
            let spec = args
                .spec
                .as_deref()
                .ok_or_else(|| anyhow!("give a spec file"))?;
            let scheduling = if args.mip {
                archplace_spec::Scheduling::Mip
            } else {
                archplace_spec::Scheduling::ListSchedule
            };
            run_step(spec, args, scheduling, plugins)
        }
    }
}

fn run_step(
    path: &Path,
    args: &EstimateArgs,
    scheduling: archplace_spec::Scheduling,
    plugins: &super::plugin::PluginArgs,
) -> Result<Exit> {
    let written = load_spec(Some(path), Some(plugins))?;
    let host = plugins.host()?;
    let options = EstimateOptions {
        calibration: args.calibration.as_deref(),
        scheduling,
        timeline: args.timeline.is_some() || args.timeline_svg.is_some(),
    };
    let estimated = match estimated::estimate(&written, &host, options) {
        Ok(e) => e,
        Err(EstimateError::CostModel(diags)) => {
            for d in &diags {
                err!("{}", d.render(&written.source_text));
            }
            return Err(anyhow!(
                "{} error(s) in the spec's cost models",
                diags.len()
            ));
        }
        Err(e) => return Err(e.into()),
    };
    if let Some(t) = &estimated.timeline {
        if let Some(file) = &args.timeline {
            let text = serde_json::to_vec(&archplace_job::timeline::chrome_trace(t))?;
            archplace_util::atomic::write(file, &text)
                .with_context(|| format!("writing the timeline to {}", file.display()))?;
        }
        if let Some(file) = &args.timeline_svg {
            archplace_util::atomic::write(file, archplace_job::timeline::svg(t).as_bytes())
                .with_context(|| format!("writing the timeline to {}", file.display()))?;
        }
    }
    if args.json {
        print_json(&estimated.document())?;
    } else {
        outln!("{}", estimated.render())?;
    }
    // A plan that cannot run on the chip (it does not fit, or cannot be laid out) is an
    // answer, which says why.
    Ok(if estimated.feasible() {
        Exit::Success
    } else {
        Exit::Infeasible
    })
}

fn run_op(args: &OpArgs, plugins: &super::plugin::PluginArgs) -> Result<Exit> {
    let spec = load_spec(Some(&args.spec), Some(plugins))?;
    let accelerator = spec
        .estimate
        .as_ref()
        .map(|e| e.accelerator)
        .ok_or(archplace_spec::EstimateSpecError::NoPlan)?;
    let request = match (&args.gemm, &args.vector) {
        (Some(g), _) => {
            let element = ElementType::named(&args.element).ok_or_else(|| {
                anyhow!(
                    "--element `{}`: use one of {}",
                    args.element,
                    ElementType::names()
                )
            })?;
            OpRequest::Gemm(estimate::parse_gemm(g)?, element)
        }
        (None, Some(kind)) => {
            let kind: VectorKind = serde_json::from_value(serde_json::Value::String(kind.clone()))
                .map_err(|_| {
                    anyhow!(
                        "`{kind}` is not a vector operation; use one of: {}",
                        VectorKind::ALL
                            .iter()
                            .filter_map(|k| serde_json::to_value(k).ok())
                            .filter_map(|v| v.as_str().map(str::to_string))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                })?;
            let elements = args.elements.context("--vector needs --elements")?;
            if elements == 0 || elements > 1 << 53 {
                return Err(anyhow!("--elements must be 1 to 2^53"));
            }
            OpRequest::Vector {
                kind,
                elements,
                row: args.row.unwrap_or(1).max(1),
            }
        }
        (None, None) => return Err(anyhow!("give --gemm or --vector")),
    };
    if let Some(c) = args.cores {
        let max = match request {
            OpRequest::Gemm(..) => accelerator.tensor_cores,
            OpRequest::Vector { .. } => accelerator.vector_cores,
        };
        if c == 0 || c > max {
            return Err(anyhow!(
                "--cores {c}: the chip has {max} cores of that kind"
            ));
        }
    }
    let host = plugins.host()?;
    let models = super::cost_models(&spec, &host, Arc::new(AtomicBool::new(false)))?;
    let info = models.latency.info();
    let clock = estimate::clock_hz(&spec, &info);
    let direction = if args.backward {
        Direction::Backward
    } else {
        Direction::Forward
    };
    let e = estimate::estimate_op(
        &accelerator,
        request,
        args.cores,
        direction,
        models.latency.as_ref(),
        clock,
    )
    .map_err(|e| anyhow!("the latency model failed: {e}"))?;
    if args.json {
        print_json(&e)?;
    } else {
        let model = format!("{} {}", info.name, info.version);
        outln!("{}", estimate::render_op(&e, &model).trim_end())?;
    }
    Ok(Exit::Success)
}
