//! A step's timeline ([`archplace_engine::step::timeline::Timeline`]) as files: Chrome's
//! Trace Event Format (`{"traceEvents": [...]}`, complete events in microseconds, one
//! track per pipeline stage and chunk; Perfetto and chrome://tracing open it) and an SVG
//! with one lane per stage.

use crate::result::ResultDoc;
use archplace_engine::step::StepInput;
use archplace_engine::step::timeline::{Span, Timeline, estimate_step_timeline};
use archplace_plugin_sdk::LatencyModel;
use archplace_spec::Spec;
use serde_json::{Value, json};
use std::fmt::Write as _;

/// The timeline of the best plan of a search's `doc` (its first model's), re-estimated by
/// the step model with the search's layer schedules; `None` when the search has no best,
/// prices with the reference's memory model, or the re-estimate does not give the plan's
/// step time (then a warning says so: the picture would not be the answer's).
pub fn of_best(spec: &Spec, doc: &ResultDoc, latency: &dyn LatencyModel) -> Option<Timeline> {
    let best = doc.best.as_ref()?;
    let plan = best.models.first()?;
    let step_plan = plan.plan.estimable()?.clone();
    let model = spec.models.iter().find(|m| m.config.name == plan.model)?;
    let networks = spec.cluster.networks();
    let network = match best.node_size {
        Some(n) => *networks.iter().find(|x| x.node_size == n)?,
        None => spec.cluster.network,
    };
    let devices = if spec.space.use_all_devices {
        spec.cluster.devices
    } else {
        plan.plan.devices_used()
    };
    let input = StepInput {
        model: model.config.clone(),
        plan: step_plan,
        accelerator: best.configuration.chip,
        hbm_bytes: best.hbm_bytes,
        devices,
        global_batch: spec.training.global_batch,
        network,
        peak_flops_per_second: None,
        schedule: spec.search_input().schedule,
        execution: spec.training.execution,
    };
    match estimate_step_timeline(&input, latency) {
        Ok((report, timeline)) => {
            let want = plan.time_per_batch_seconds;
            if (report.step_seconds - want).abs() <= 1e-9 * want.abs().max(1e-30) {
                Some(timeline)
            } else {
                tracing::warn!(
                    step_seconds = report.step_seconds,
                    plan_seconds = want,
                    "the best plan's timeline was not drawn: its re-estimate differs from the search's"
                );
                None
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "the best plan's timeline was not drawn");
            None
        }
    }
}

/// The track of a span: one per stage and chunk, the step-wide parts on the stage's first.
fn track(t: &Timeline, s: &Span) -> u64 {
    s.stage * t.chunks + s.chunk
}

/// The timeline in Chrome's Trace Event Format.
pub fn chrome_trace(t: &Timeline) -> Value {
    let mut events = Vec::with_capacity(t.spans.len() + (t.stages * t.chunks) as usize);
    for stage in 0..t.stages {
        for chunk in 0..t.chunks {
            let name = if t.chunks > 1 {
                format!("stage {stage}, chunk {chunk}")
            } else {
                format!("stage {stage}")
            };
            events.push(json!({
                "name": "thread_name", "ph": "M", "pid": 0,
                "tid": stage * t.chunks + chunk, "args": { "name": name },
            }));
        }
    }
    for s in &t.spans {
        let name = match s.micro_batch {
            Some(mb) => format!("{} {mb}", s.kind),
            None => s.kind.to_string(),
        };
        events.push(json!({
            "name": name,
            "cat": s.kind,
            "ph": "X",
            "pid": 0,
            "tid": track(t, s),
            "ts": s.start_seconds * 1e6,
            "dur": s.duration_seconds * 1e6,
            "args": { "micro_batch": s.micro_batch, "model_stage": s.model_stage },
        }));
    }
    json!({
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "pipeline_schedule": t.schedule.name(),
            "step_seconds": t.step_seconds,
        },
    })
}

/// The colour of a kind of span.
fn colour(kind: &str) -> &'static str {
    match kind {
        "forward" => "#4c78a8",
        "backward" => "#f58518",
        "weight gradient" => "#e45756",
        "recomputation" => "#72b7b2",
        "forward + backward (overlapped)" => "#9d755d",
        "communication" | "pipeline transfers (fill and flush)" => "#bab0ac",
        "optimizer step" => "#54a24b",
        "data-parallel communication" => "#b279a2",
        _ => "#ff9da6",
    }
}

/// The timeline as an SVG: one lane per pipeline stage, time left to right.
pub fn svg(t: &Timeline) -> String {
    let (width, lane, left, top) = (1400.0, 22.0, 80.0, 30.0);
    let scale = if t.step_seconds > 0.0 {
        (width - left - 10.0) / t.step_seconds
    } else {
        0.0
    };
    let height = top + lane * t.stages as f64 + 40.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(
        out,
        r#"<text x="{left}" y="18">{} — step {:.3} s, pipeline {:.3} s</text>"#,
        t.schedule.describe(),
        t.step_seconds,
        t.pipeline_seconds
    );
    for stage in 0..t.stages {
        let y = top + lane * stage as f64;
        let _ = writeln!(
            out,
            r#"<g class="lane" data-stage="{stage}"><text x="4" y="{}">stage {stage}</text>"#,
            y + lane * 0.7
        );
        for s in t.spans.iter().filter(|s| s.stage == stage) {
            let _ = writeln!(
                out,
                r#"<rect x="{:.2}" y="{:.1}" width="{:.3}" height="{:.1}" fill="{}"><title>{}</title></rect>"#,
                left + s.start_seconds * scale,
                y + 2.0,
                (s.duration_seconds * scale).max(0.05),
                lane - 4.0,
                colour(s.kind),
                s.kind
            );
        }
        let _ = writeln!(out, "</g>");
    }
    let legend_y = top + lane * t.stages as f64 + 20.0;
    let kinds = [
        "forward",
        "backward",
        "weight gradient",
        "recomputation",
        "forward + backward (overlapped)",
        "communication",
        "data-parallel communication",
        "optimizer step",
    ];
    // Each label's width at about 6.2 px a character (11 px sans-serif).
    let mut x = left;
    for kind in kinds {
        let _ = writeln!(
            out,
            r#"<rect x="{x:.1}" y="{}" width="10" height="10" fill="{}"/><text x="{:.1}" y="{}">{kind}</text>"#,
            legend_y - 9.0,
            colour(kind),
            x + 14.0,
            legend_y
        );
        x += 14.0 + 6.2 * kind.len() as f64 + 16.0;
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use archplace_engine::pipeline::PipelineSchedule;

    fn timeline() -> Timeline {
        let span = |stage, start, kind| Span {
            stage,
            chunk: 0,
            kind,
            micro_batch: Some(0),
            model_stage: Some(stage as u32),
            start_seconds: start,
            duration_seconds: 1.0,
        };
        Timeline {
            schedule: PipelineSchedule::OneFOneB,
            stages: 2,
            chunks: 1,
            step_seconds: 4.0,
            pipeline_seconds: 4.0,
            spans: vec![
                span(0, 0.0, "forward"),
                span(1, 1.0, "forward"),
                span(1, 2.0, "backward"),
                span(0, 3.0, "backward"),
            ],
        }
    }

    #[test]
    fn the_trace_has_complete_events_in_microseconds_and_a_track_per_stage() {
        let v = chrome_trace(&timeline());
        let events = v["traceEvents"].as_array().expect("a list");
        let complete: Vec<&Value> = events.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(complete.len(), 4);
        let end = complete
            .iter()
            .map(|e| e["ts"].as_f64().unwrap_or(0.0) + e["dur"].as_f64().unwrap_or(0.0))
            .fold(0.0, f64::max);
        assert_eq!(end, 4e6);
        assert_eq!(events.iter().filter(|e| e["ph"] == "M").count(), 2);
    }

    #[test]
    fn the_svg_parses_with_one_lane_per_stage() {
        let text = svg(&timeline());
        let doc = roxmltree::Document::parse(&text).expect("well-formed SVG");
        let lanes = doc
            .descendants()
            .filter(|n| n.attribute("class") == Some("lane"))
            .count();
        assert_eq!(lanes, 2);
    }
}
