//! `placement.svg`: the best training plan of each model.
//!
//! Per model, three rows: the pipeline as blocks (width ∝ layers, labelled with the
//! stage's first and last layer and its devices), then each stage's time per micro-batch
//! step and each stage's memory against the HBM size.

use super::PlotError;
use archplace_engine::search::ModelPlan;
use archplace_plugin_sdk::units::format_bytes;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

const GIB: f64 = (1u64 << 30) as f64;
/// Height of one model's part of the picture.
const MODEL_HEIGHT: u32 = 660;
const WIDTH: u32 = 1100;

/// Stage colours, cycled.
const COLOURS: [RGBColor; 6] = [
    RGBColor(76, 114, 176),
    RGBColor(221, 132, 82),
    RGBColor(85, 168, 104),
    RGBColor(196, 78, 82),
    RGBColor(129, 114, 179),
    RGBColor(147, 120, 96),
];

/// `placement.svg` of the best candidate's plans; `hbm_bytes` is the HBM size it was
/// placed with, `chip` describes the chip.
pub fn placement_svg(
    title: &str,
    chip: &str,
    plans: &[ModelPlan],
    hbm_bytes: u64,
) -> Result<String, PlotError> {
    let err = |e: &dyn std::fmt::Display| PlotError::new("placement.svg", e);
    let rows = plans.len().max(1) as u32;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, 50 + MODEL_HEIGHT * rows))
            .into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let (head, body) = root.split_vertically(50);
        head.draw(&Text::new(
            format!(
                "{title} — best training plan on {chip}, HBM {}",
                format_bytes(hbm_bytes)
            ),
            (WIDTH as i32 / 2, 18),
            ("sans-serif", 20)
                .into_font()
                .color(&BLACK)
                .pos(Pos::new(HPos::Center, VPos::Center)),
        ))
        .map_err(|e| err(&e))?;
        if plans.is_empty() {
            body.draw(&Text::new(
                "no plan: no candidate could train every model",
                (40, 40),
                ("sans-serif", 16).into_font(),
            ))
            .map_err(|e| err(&e))?;
        }
        for (plan, area) in plans.iter().zip(body.split_evenly((plans.len().max(1), 1))) {
            draw_model(&area, plan, hbm_bytes).map_err(|e| err(&e))?;
        }
        root.present().map_err(|e| err(&e))?;
    }
    Ok(svg)
}

type DrawResult =
    Result<(), DrawingAreaErrorKind<<SVGBackend<'static> as DrawingBackend>::ErrorType>>;

/// Area of the picture for one model's plan.
type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

fn draw_model(area: &Area<'_>, plan: &ModelPlan, hbm_bytes: u64) -> DrawResult {
    let (top, rest) = area.split_vertically(270);
    let (caption, blocks) = top.split_vertically(100);
    draw_caption(&caption, plan)?;
    draw_stages(&blocks, plan)?;
    // Per-stage time and memory, side by side.
    let (time_area, memory_area) = rest.split_horizontally(WIDTH / 2);
    let times_ms: Vec<f64> = plan.stages.iter().map(|s| s.load_seconds * 1e3).collect();
    bars(
        &time_area,
        "time per stage (ms per micro-batch, forward + backward)",
        "time (ms)",
        &times_ms,
        None,
    )?;
    let memory_gib: Vec<f64> = plan.stages.iter().map(|s| s.memory_bytes / GIB).collect();
    bars(
        &memory_area,
        "memory per device of each stage (GiB)",
        "memory (GiB)",
        &memory_gib,
        Some(hbm_bytes as f64 / GIB),
    )?;
    Ok(())
}

/// The plan in four lines: its shape, its throughput, where the time goes (the slowest
/// stage) and what fills memory (the fullest stage).
fn draw_caption(caption: &Area<'_>, plan: &ModelPlan) -> DrawResult {
    // A stage's devices are per data-parallel replica (t × CP).
    let d = plan.plan.step.data_parallel;
    let devices: u64 = plan.stages.iter().map(|s| s.devices).sum::<u64>() * d;
    let font = ("sans-serif", 16).into_font().color(&BLACK);
    caption.draw(&Text::new(
        format!(
            "{}: {} pipeline stages{}, t = {} (tensor){}{}, d = {} (data) — {} devices; micro-batch {}, recomputation {}",
            plan.model,
            plan.plan.step.pipeline_parallel,
            if plan.plan.step.interleaving > 1 {
                format!(" ({} chunks each, interleaved)", plan.plan.step.interleaving)
            } else {
                String::new()
            },
            plan.plan.step.tensor_parallel,
            if plan.plan.step.expert_parallel > 1 || plan.plan.step.expert_tensor_parallel > 1 {
                format!(
                    ", experts over EP = {} × ETP = {}",
                    plan.plan.step.expert_parallel, plan.plan.step.expert_tensor_parallel
                )
            } else {
                String::new()
            },
            if plan.plan.step.context_parallel > 1 {
                format!(", CP = {} (context)", plan.plan.step.context_parallel)
            } else {
                String::new()
            },
            plan.plan.step.data_parallel,
            devices,
            plan.plan.step.micro_batch,
            plan.plan.step.recomputation.name(),
        ),
        (20, 14),
        font.clone(),
    ))?;
    caption.draw(&Text::new(
        format!(
            "{:.4} samples/s, {:.3} s per batch (gradient all-reduce {:.3} s)",
            plan.throughput_samples_per_second,
            plan.time_per_batch_seconds,
            plan.gradient_all_reduce_seconds
        ),
        (20, 38),
        ("sans-serif", 14).into_font().color(&BLACK.mix(0.75)),
    ))?;
    // Where the time goes (the slowest stage) and what fills memory (the fullest stage).
    let t = &plan.time;
    let pct = |x: f64| 100.0 * x / plan.time_per_batch_seconds.max(f64::MIN_POSITIVE);
    caption.draw(&Text::new(
        format!(
            "time: forward {:.0}%, backward {:.0}%, recomputation {:.0}%, tensor-parallel {:.0}%,{} point-to-point {:.0}%, bubble {:.0}%, data-parallel {:.0}% — limited by {}",
            pct(t.forward_seconds),
            pct(t.backward_seconds),
            pct(t.recomputation_seconds),
            pct(t.tensor_parallel_communication_seconds),
            if t.all_to_all_seconds > 0.0 {
                format!(" all-to-all {:.0}%,", pct(t.all_to_all_seconds))
            } else {
                String::new()
            },
            pct(t.pipeline_point_to_point_seconds),
            pct(t.pipeline_bubble_seconds),
            pct(t.data_parallel_communication_seconds),
            plan.limiting,
        ),
        (20, 60),
        ("sans-serif", 14).into_font().color(&BLACK.mix(0.75)),
    ))?;
    let m = &plan.memory_bytes;
    caption.draw(&Text::new(
        format!(
            "memory of the fullest stage: {:.1} GiB = weights {:.1} + gradients {:.1} + optimizer {:.1} + activations {:.1}",
            m.total / GIB,
            m.weights / GIB,
            m.gradients / GIB,
            m.optimizer / GIB,
            m.activations / GIB,
        ),
        (20, 82),
        ("sans-serif", 14).into_font().color(&BLACK.mix(0.75)),
    ))?;
    Ok(())
}

/// The pipeline: one block per stage, as wide as its layers, labelled as room allows.
fn draw_stages(blocks: &Area<'_>, plan: &ModelPlan) -> DrawResult {
    let d = plan.plan.step.data_parallel;
    let layers: usize = plan.stages.iter().map(|s| s.layers).sum::<usize>().max(1);
    let (w, h) = blocks.dim_in_pixel();
    let (x0, usable) = (20i32, w as i32 - 40);
    let mut x = x0;
    let n = plan.stages.len();
    let label_every = n.div_ceil(24).max(1);
    for (i, s) in plan.stages.iter().enumerate() {
        let width = ((s.layers as f64 / layers as f64) * usable as f64).round() as i32;
        let colour = COLOURS[i % COLOURS.len()];
        blocks.draw(&Rectangle::new(
            [(x, 10), (x + width.max(2), h as i32 - 50)],
            colour.mix(0.8).filled(),
        ))?;
        blocks.draw(&Rectangle::new(
            [(x, 10), (x + width.max(2), h as i32 - 50)],
            WHITE.stroke_width(1),
        ))?;
        let mid = x + width / 2;
        let centred = |size: u32| {
            ("sans-serif", size)
                .into_font()
                .color(&WHITE)
                .pos(Pos::new(HPos::Center, VPos::Center))
        };
        if width >= 60 {
            // Room for the stage's layers and devices inside its block.
            blocks.draw(&Text::new(
                format!("stage {}", i + 1),
                (mid, 40),
                centred(14),
            ))?;
            let span = if s.first_layer == s.last_layer {
                s.first_layer.clone()
            } else {
                format!("{} – {}", s.first_layer, s.last_layer)
            };
            // About 7 px per character at 12 px; shorter names when the block is narrow.
            let span = if span.chars().count() * 7 + 6 > width as usize {
                span.replace("embedding", "emb").replace("block ", "b")
            } else {
                span
            };
            blocks.draw(&Text::new(span, (mid, 70), centred(12)))?;
            blocks.draw(&Text::new(
                format!("{} layer{}", s.layers, if s.layers == 1 { "" } else { "s" }),
                (mid, 92),
                centred(12),
            ))?;
            blocks.draw(&Text::new(
                if width >= 130 {
                    format!("{} × {d} = {} devices", s.devices, s.devices * d)
                } else {
                    format!("{} devices", s.devices * d)
                },
                (mid, 114),
                centred(12),
            ))?;
        } else if i % label_every == 0 {
            blocks.draw(&Text::new(format!("{}", i + 1), (mid, 40), centred(11)))?;
        }
        x += width;
    }
    let first = plan.stages.first();
    let last = plan.stages.last();
    if let (Some(f), Some(l)) = (first, last) {
        blocks.draw(&Text::new(
            format!(
                "{n} stages from {} to {}; a block's width is its share of the layers; its devices are (1 or t) × d{}",
                f.first_layer,
                l.last_layer,
                if n > 0 && (usable / n as i32) < 60 {
                    "; stage numbers on the blocks, layers and devices per stage in result.json"
                } else {
                    ""
                }
            ),
            (x0, h as i32 - 32),
            ("sans-serif", 13).into_font().color(&BLACK.mix(0.75)),
        ))?;
    }
    Ok(())
}

/// One bar per stage; `limit` draws a dashed line (the HBM size).
fn bars(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    caption: &str,
    y_desc: &str,
    values: &[f64],
    limit: Option<f64>,
) -> DrawResult {
    let n = values.len().max(1);
    let top = values
        .iter()
        .copied()
        .chain(limit)
        .fold(0.0, f64::max)
        .max(1e-9)
        * 1.15;
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 15))
        .margin(14)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..n as f64, 0.0..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .light_line_style(WHITE.mix(0.0))
        .x_desc("pipeline stage")
        .y_desc(y_desc)
        .x_labels(n.min(16))
        .x_label_formatter(&|x| format!("{}", x.floor() as i64 + 1))
        .draw()?;
    chart.draw_series(values.iter().enumerate().map(|(i, &v)| {
        Rectangle::new(
            [(i as f64 + 0.12, 0.0), (i as f64 + 0.88, v)],
            COLOURS[i % COLOURS.len()].mix(0.85).filled(),
        )
    }))?;
    if let Some(l) = limit {
        let red = RGBColor(200, 0, 40);
        chart
            .draw_series(DashedLineSeries::new(
                vec![(0.0, l), (n as f64, l)],
                8,
                5,
                red.stroke_width(2),
            ))?
            .label(format!("HBM limit {l:.0} GiB"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], red.stroke_width(2)));
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.4))
            .draw()?;
    }
    Ok(())
}
