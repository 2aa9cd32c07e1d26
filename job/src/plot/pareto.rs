//! `pareto.svg`: what each evaluated chip would train at, against its area.

use super::{PlotError, padded};
use crate::chip::short as describe;
use archplace_engine::search::Evaluated;
use archplace_engine::space::ChipAxis;
use archplace_plugin_sdk::AcceleratorConfig;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

/// What the picture shows.
pub struct ParetoInput<'a> {
    pub title: &'a str,
    pub explored: &'a [Evaluated],
    /// Index into `explored` of the best candidate.
    pub best: Option<usize>,
    /// The reference configuration, and its area when known (it is the area budget when
    /// the budget is given as that configuration).
    pub reference: Option<(AcceleratorConfig, Option<f64>)>,
    pub budget_um2: f64,
    /// The axis whose value colours the points (`None`: one colour).
    pub colour_by: Option<ChipAxis>,
}

/// The candidates on the Pareto frontier (no other candidate is both smaller and
/// faster), as (area mm², throughput), by increasing area.
pub fn frontier(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let mut sorted = points.to_vec();
    // By area; at equal area the fastest first.
    sorted.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
    let mut out: Vec<(f64, f64)> = Vec::new();
    for p in sorted {
        if out.last().is_none_or(|l| p.1 > l.1) {
            out.push(p);
        }
    }
    out
}

/// Cells of the dot grid across and up the plot: about 3 pixels each, a dot's radius.
const DOT_CELLS_X: f64 = 300.0;
const DOT_CELLS_Y: f64 = 200.0;

/// The chart the series are drawn on.
type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

fn err(e: &dyn std::fmt::Display) -> PlotError {
    PlotError::new("pareto.svg", e)
}

/// What the picture shows, in its units: the points (area mm², throughput), the frontier,
/// the reference configuration (its area and throughput when known) and the axes.
struct Figure<'a> {
    points: Vec<(f64, f64)>,
    /// Each point's value on the colouring axis (0 without one).
    values: Vec<u64>,
    colour_by: Option<ChipAxis>,
    failed: usize,
    front: Vec<(f64, f64)>,
    /// With several scale-up domain sizes: each size's frontier (the candidates at that
    /// size), by size in the spec's order.
    domain_fronts: Vec<(u64, Vec<(f64, f64)>)>,
    reference: Option<(&'a AcceleratorConfig, Option<f64>, Option<f64>)>,
    budget_mm2: f64,
    x_range: std::ops::Range<f64>,
    y_range: std::ops::Range<f64>,
}

impl<'a> Figure<'a> {
    fn of(input: &'a ParetoInput<'_>) -> Figure<'a> {
        let points: Vec<(f64, f64)> = input
            .explored
            .iter()
            .filter_map(|e| Some((e.area_um2 / 1e6, e.mean_throughput_samples_per_second?)))
            .collect();
        let values: Vec<u64> = input
            .explored
            .iter()
            .filter(|e| e.mean_throughput_samples_per_second.is_some())
            .map(|e| input.colour_by.map_or(0, |a| a.of(&e.config)))
            .collect();
        let failed = input.explored.len() - points.len();
        let front = frontier(&points);
        let sizes = input
            .explored
            .iter()
            .map(|e| e.domains.len())
            .max()
            .unwrap_or(0);
        let domain_fronts = (0..sizes)
            .filter_map(|k| {
                let node_size = input
                    .explored
                    .iter()
                    .find_map(|e| e.domains.get(k))?
                    .node_size;
                let at: Vec<(f64, f64)> = input
                    .explored
                    .iter()
                    .filter_map(|e| {
                        let t = e.domains.get(k)?.mean_throughput_samples_per_second?;
                        Some((e.area_um2 / 1e6, t))
                    })
                    .collect();
                Some((node_size, frontier(&at)))
            })
            .collect();
        let reference = input.reference.as_ref().map(|(c, area)| {
            let found = input.explored.iter().find(|e| e.config == *c);
            let area_mm2 = found.map(|e| e.area_um2 / 1e6).or(area.map(|a| a / 1e6));
            (
                c,
                area_mm2,
                found.and_then(|e| e.mean_throughput_samples_per_second),
            )
        });
        let budget_mm2 = input.budget_um2 / 1e6;
        let (mut x_lo, mut x_hi) = (f64::INFINITY, f64::NEG_INFINITY);
        for x in points
            .iter()
            .map(|p| p.0)
            .chain(std::iter::once(budget_mm2))
            .chain(reference.iter().filter_map(|r| r.1))
        {
            x_lo = x_lo.min(x);
            x_hi = x_hi.max(x);
        }
        let y_hi = points.iter().map(|p| p.1).fold(0.0, f64::max).max(1e-9);
        Figure {
            x_range: padded(x_lo.max(0.0), x_hi, 0.05),
            // Room above the highest point for the legend.
            y_range: 0.0..y_hi * 1.5,
            points,
            values,
            colour_by: input.colour_by,
            failed,
            front,
            domain_fronts,
            reference,
            budget_mm2,
        }
    }
}

/// `pareto.svg` of a search.
pub fn pareto_svg(input: &ParetoInput<'_>) -> Result<String, PlotError> {
    let fig = Figure::of(input);
    let x_decimals = if fig.x_range.end - fig.x_range.start >= 20.0 {
        0
    } else {
        1
    };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1000, 680)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!("{} — throughput against chip area", input.title),
                ("sans-serif", 22),
            )
            .margin(20)
            .x_label_area_size(50)
            .y_label_area_size(80)
            .build_cartesian_2d(fig.x_range.clone(), fig.y_range.clone())
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc("chip area (mm²)")
            .y_desc("throughput, mean over the models (samples/s)")
            .axis_desc_style(("sans-serif", 16))
            .light_line_style(WHITE.mix(0.0))
            .x_label_formatter(&|x| format!("{x:.x_decimals$}"))
            .y_label_formatter(&|y| format_number(*y))
            .draw()
            .map_err(|e| err(&e))?;
        draw_candidates(&mut chart, &fig)?;
        draw_frontier(&mut chart, &fig)?;
        draw_domain_frontiers(&mut chart, &fig)?;
        draw_budget(&mut chart, &fig)?;
        draw_marks(&mut chart, &fig, input)?;
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.4))
            .label_font(("sans-serif", 14))
            .draw()
            .map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
    }
    Ok(svg)
}

/// Colours of the values of the colouring axis, smallest first (a sequential palette,
/// light to dark, so an ordered axis reads as an order).
const PALETTE: [RGBColor; 8] = [
    RGBColor(253, 190, 60),
    RGBColor(240, 130, 40),
    RGBColor(220, 80, 60),
    RGBColor(190, 40, 90),
    RGBColor(140, 30, 120),
    RGBColor(90, 30, 140),
    RGBColor(50, 40, 130),
    RGBColor(20, 30, 80),
];

/// The evaluated candidates: one dot per cell of about the dots' size, so a million
/// candidates draw no more dots than the picture has room for (the legend counts them all);
/// with a colouring axis, one series per value, thinned the same way within each.
fn draw_candidates(chart: &mut Chart<'_, '_>, fig: &Figure<'_>) -> Result<(), PlotError> {
    let (x_range, y_range) = (&fig.x_range, &fig.y_range);
    let (xw, yw) = (x_range.end - x_range.start, y_range.end - y_range.start);
    let cell = |p: &(f64, f64)| {
        (
            ((p.0 - x_range.start) / xw * DOT_CELLS_X).floor() as i64,
            ((p.1 - y_range.start) / yw * DOT_CELLS_Y).floor() as i64,
        )
    };
    let failed = if fig.failed > 0 {
        format!("; {} that fit no plan are not shown", fig.failed)
    } else {
        String::new()
    };
    let Some(axis) = fig.colour_by else {
        let grey = RGBColor(90, 110, 160);
        let mut cells = std::collections::HashSet::new();
        let shown = fig.points.iter().filter(|p| cells.insert(cell(p)));
        chart
            .draw_series(shown.map(|&p| Circle::new(p, 3, grey.mix(0.45).filled())))
            .map_err(|e| err(&e))?
            .label(format!(
                "evaluated candidates ({}{failed})",
                fig.points.len()
            ))
            .legend(move |(x, y)| Circle::new((x + 10, y), 4, grey.filled()));
        return Ok(());
    };
    let mut values: Vec<u64> = fig.values.clone();
    values.sort_unstable();
    values.dedup();
    for (k, &v) in values.iter().enumerate() {
        // The palette spread over the values, the darkest for the largest.
        let at = if values.len() > 1 {
            k * (PALETTE.len() - 1) / (values.len() - 1)
        } else {
            PALETTE.len() / 2
        };
        let colour = PALETTE[at];
        let mine: Vec<(f64, f64)> = fig
            .points
            .iter()
            .zip(&fig.values)
            .filter(|(_, x)| **x == v)
            .map(|(p, _)| *p)
            .collect();
        let mut cells = std::collections::HashSet::new();
        let shown: Vec<(f64, f64)> = mine
            .iter()
            .copied()
            .filter(|p| cells.insert(cell(p)))
            .collect();
        let value = if axis == ChipAxis::Buffer {
            archplace_plugin_sdk::units::format_bytes(v)
        } else {
            v.to_string()
        };
        let last = k + 1 == values.len();
        chart
            .draw_series(
                shown
                    .into_iter()
                    .map(|p| Circle::new(p, 3, colour.mix(0.6).filled())),
            )
            .map_err(|e| err(&e))?
            .label(format!(
                "{} {value} ({} candidates{})",
                axis.name(),
                mine.len(),
                if last { failed.as_str() } else { "" }
            ))
            .legend(move |(x, y)| Circle::new((x + 10, y), 4, colour.filled()));
    }
    Ok(())
}

/// A frontier's points as a staircase to `x_end`: the best throughput for any area up to
/// x.
fn staircase(front: &[(f64, f64)], x_end: f64) -> Vec<(f64, f64)> {
    let mut stairs = Vec::new();
    for (i, p) in front.iter().enumerate() {
        if i > 0 {
            stairs.push((p.0, front[i - 1].1));
        }
        stairs.push(*p);
    }
    if let Some(last) = front.last() {
        stairs.push((x_end, last.1));
    }
    stairs
}

/// The frontier as a staircase: the best throughput for any area up to x.
fn draw_frontier(chart: &mut Chart<'_, '_>, fig: &Figure<'_>) -> Result<(), PlotError> {
    let front = &fig.front;
    let stairs = staircase(front, fig.x_range.end);
    let frontier_colour = RGBColor(214, 96, 0);
    chart
        .draw_series(LineSeries::new(stairs, frontier_colour.stroke_width(2)))
        .map_err(|e| err(&e))?
        .label(format!("Pareto frontier ({} candidates)", front.len()))
        .legend(move |(x, y)| {
            PathElement::new(vec![(x, y), (x + 20, y)], frontier_colour.stroke_width(2))
        });
    chart
        .draw_series(
            front
                .iter()
                .map(|&p| Circle::new(p, 4, frontier_colour.filled())),
        )
        .map_err(|e| err(&e))?;
    Ok(())
}

/// With several scale-up domain sizes: each size's frontier, dashed, so the picture shows
/// where a larger domain pays (the overall frontier is the upper envelope).
fn draw_domain_frontiers(chart: &mut Chart<'_, '_>, fig: &Figure<'_>) -> Result<(), PlotError> {
    const COLOURS: [RGBColor; 4] = [
        RGBColor(40, 120, 180),
        RGBColor(60, 160, 80),
        RGBColor(150, 60, 170),
        RGBColor(120, 90, 40),
    ];
    for (k, (node_size, front)) in fig.domain_fronts.iter().enumerate() {
        let colour = COLOURS[k % COLOURS.len()];
        let stairs = staircase(front, fig.x_range.end);
        chart
            .draw_series(DashedLineSeries::new(stairs, 8, 4, colour.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(format!(
                "frontier with {node_size} devices per scale-up domain"
            ))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
            });
    }
    Ok(())
}

/// The area budget.
fn draw_budget(chart: &mut Chart<'_, '_>, fig: &Figure<'_>) -> Result<(), PlotError> {
    let budget_mm2 = fig.budget_mm2;
    let budget_colour = RGBColor(120, 120, 120);
    chart
        .draw_series(DashedLineSeries::new(
            vec![(budget_mm2, 0.0), (budget_mm2, fig.y_range.end)],
            6,
            4,
            budget_colour.stroke_width(1),
        ))
        .map_err(|e| err(&e))?
        .label(format!("area budget ({budget_mm2:.1} mm²)"))
        .legend(move |(x, y)| {
            PathElement::new(vec![(x, y), (x + 20, y)], budget_colour.stroke_width(1))
        });
    Ok(())
}

/// The reference configuration (a triangle) and the best one (circled).
fn draw_marks(
    chart: &mut Chart<'_, '_>,
    fig: &Figure<'_>,
    input: &ParetoInput<'_>,
) -> Result<(), PlotError> {
    if let Some((c, Some(area), throughput)) = fig.reference {
        let colour = RGBColor(0, 140, 70);
        let label = match throughput {
            Some(t) => format!(
                "reference configuration: {} — {area:.1} mm², {t:.4} samples/s",
                describe(c)
            ),
            None => format!(
                "reference configuration: {} — {area:.1} mm² (fits no plan or not evaluated)",
                describe(c)
            ),
        };
        let at = (area, throughput.unwrap_or(0.0));
        chart
            .draw_series(std::iter::once(TriangleMarker::new(at, 9, colour.filled())))
            .map_err(|e| err(&e))?
            .label(label)
            .legend(move |(x, y)| TriangleMarker::new((x + 10, y), 6, colour.filled()));
    }
    if let Some(b) = input.best.and_then(|i| input.explored.get(i))
        && let Some(t) = b.mean_throughput_samples_per_second
    {
        let colour = RGBColor(200, 0, 40);
        let at = (b.area_um2 / 1e6, t);
        chart
            .draw_series([
                Circle::new(at, 8, colour.stroke_width(3)),
                Circle::new(at, 3, colour.filled()),
            ])
            .map_err(|e| err(&e))?
            .label(format!(
                "best: {} — {:.1} mm², {t:.4} samples/s",
                describe(&b.config),
                b.area_um2 / 1e6
            ))
            .legend(move |(x, y)| Circle::new((x + 10, y), 6, colour.stroke_width(3)));
    }
    Ok(())
}

/// A throughput for an axis: `12000`, `12.5`, `0.0123`.
fn format_number(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}
