//! One training step drawn as a timeline: each pipeline device's passes as its schedule
//! runs them ([`crate::pipeline::simulate`]), then the step's synchronisation and the
//! optimizer. It is the step model's own account, not a second model: the passes start
//! where the simulation at the slowest device's pace places them, each lasts what the
//! device's own work takes, and the last event ends at the report's `step_seconds`.

use super::{
    PipelineTimes, StepError, StepInput, StepReport, one_cost, pass_slots, pipeline_times,
    prepared, priced,
};
use crate::pipeline::{Pass, PipelineSchedule, Slots, simulate};
use archplace_plugin_sdk::LatencyModel;
use serde::Serialize;

/// One span of a device's time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Span {
    /// The pipeline device (stage) whose time it is.
    pub stage: u64,
    /// The device's chunk (model stage) it runs, for passes.
    pub chunk: u64,
    /// What runs: "forward", "backward", "weight gradient", "recomputation",
    /// "forward + backward (overlapped)", "communication", or a step-wide part.
    pub kind: &'static str,
    pub micro_batch: Option<u32>,
    /// The model stage the pass runs.
    pub model_stage: Option<u32>,
    pub start_seconds: f64,
    pub duration_seconds: f64,
}

/// A step's timeline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Timeline {
    pub schedule: PipelineSchedule,
    pub stages: u64,
    /// Chunks per device (a track each).
    pub chunks: u64,
    pub step_seconds: f64,
    /// When the pipeline's last pass ends (the synchronisation and the optimizer follow).
    pub pipeline_seconds: f64,
    pub spans: Vec<Span>,
}

impl Timeline {
    /// Each stage's busy time in the pipeline (its passes).
    pub fn busy_seconds(&self, stage: u64) -> f64 {
        self.spans
            .iter()
            .filter(|s| s.stage == stage && s.micro_batch.is_some())
            .map(|s| s.duration_seconds)
            .sum()
    }
}

/// [`super::estimate_step`] with the step's timeline.
pub fn estimate_step_timeline(
    input: &StepInput,
    latency: &dyn LatencyModel,
) -> Result<(StepReport, Timeline), StepError> {
    let (g, stages, timing) = prepared(input, latency)?;
    let mut summaries = stages.0.clone();
    let times = pipeline_times(input, &g, &timing, &mut summaries);
    let report = priced(input, &g, stages, &timing, &mut one_cost(latency))?;
    let timeline = draw(input, &report, &times);
    Ok((report, timeline))
}

/// The timeline of `report` from its pipeline's times.
fn draw(input: &StepInput, report: &StepReport, times: &PipelineTimes) -> Timeline {
    let pl = &input.plan;
    let schedule = pl.schedule();
    let (p, v) = (pl.pipeline_parallel, pl.interleaving);
    let m = report.micro_batches_per_replica;
    let sim = simulate(schedule, p, v, m, pass_slots(pl, times.steady));
    let chunks = schedule.chunks(v);
    // Each device's own passes: drawn with its durations at the slowest device's pace.
    let own: Vec<(Slots, [f64; 4])> = times
        .devices
        .iter()
        .map(|d| (pass_slots(pl, *d), d.compute))
        .collect();
    let mut spans = Vec::with_capacity(sim.passes.len() * 3 + 4 * p as usize);
    for pass in &sim.passes {
        let k = pass.device as usize;
        let (slots, compute) = own.get(k).copied().unwrap_or_default();
        let chunk = (0..chunks)
            .find(|&j| schedule.stage_of(k as u64, j, p) == u64::from(pass.stage))
            .unwrap_or(0);
        let pieces = pieces(pass.pass, slots, compute, schedule.chunks_visited(v) as f64);
        let mut at = pass.start;
        for (kind, duration) in pieces {
            if duration <= 0.0 {
                continue;
            }
            spans.push(Span {
                stage: k as u64,
                chunk,
                kind,
                micro_batch: Some(pass.micro_batch),
                model_stage: Some(pass.stage),
                start_seconds: at,
                duration_seconds: duration,
            });
            at += duration;
        }
    }
    // The pipeline's end as the step model counts it: `m` steady micro-batches and the
    // bubble (with the interleaved overlap, the fill and the flush expose the transfers the
    // simulation's steady passes hid: drawn at the end).
    let t = &report.time;
    let pipeline = report.step_seconds
        - t.data_parallel_communication_seconds
        - t.weight_cast_seconds
        - t.optimizer_step_seconds;
    let mut tail = vec![(
        "pipeline transfers (fill and flush)",
        (pipeline - sim.makespan).max(0.0),
    )];
    tail.extend([
        (
            "data-parallel communication",
            t.data_parallel_communication_seconds,
        ),
        ("FP8 weight casts", t.weight_cast_seconds),
        ("optimizer step", t.optimizer_step_seconds),
    ]);
    for k in 0..p {
        let mut at = sim.makespan;
        for (kind, duration) in &tail {
            if *duration > 0.0 {
                spans.push(Span {
                    stage: k,
                    chunk: 0,
                    kind,
                    micro_batch: None,
                    model_stage: None,
                    start_seconds: at,
                    duration_seconds: *duration,
                });
            }
            at += duration;
        }
    }
    Timeline {
        schedule,
        stages: p,
        chunks,
        step_seconds: report.step_seconds,
        pipeline_seconds: sim.makespan,
        spans,
    }
}

/// What a pass of a device is made of, in order: its computation and, after it, its share
/// of the device's exposed communication (the time per micro-batch beyond forward,
/// backward and recomputation, shared in proportion to them).
fn pieces(pass: Pass, slots: Slots, compute: [f64; 4], chunks: f64) -> Vec<(&'static str, f64)> {
    let [f, bw, r, w] = compute;
    let split = |total: f64, parts: &[(&'static str, f64)]| {
        let compute: f64 = parts.iter().map(|p| p.1).sum();
        let mut out: Vec<(&'static str, f64)> = parts
            .iter()
            .map(|&(kind, x)| (kind, x.min(total)))
            .collect();
        out.push(("communication", (total - compute).max(0.0)));
        out
    };
    let c = chunks.max(1.0);
    match pass {
        Pass::Forward => split(slots.forward, &[("forward", f / c)]),
        Pass::Backward => split(
            slots.backward_input + slots.weight,
            &[("recomputation", r / c), ("backward", bw / c)],
        ),
        Pass::BackwardInput => split(
            slots.backward_input,
            &[("recomputation", r / c), ("backward", (bw - w) / c)],
        ),
        Pass::WeightGradient => split(slots.weight, &[("weight gradient", w / c)]),
        Pass::ForwardBackward => vec![("forward + backward (overlapped)", slots.overlapped)],
    }
}
