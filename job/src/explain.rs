//! Why the winner wins, from what a search wrote: the winner against the next best chips
//! and the largest chip that trained every model, the resource that limits each, what each
//! near-tie differs in, and the winner's one-axis sensitivities (its neighbours along each
//! axis of the space that the search evaluated). Read from `result.json` and
//! `explored.jsonl` alone, so `archplace explain DIR` says the same of an old result as the
//! run's summary said when it ended.

use crate::chip;
use crate::lines::{Best, Configuration, ExploredLine, NEAR_TIE};
use archplace_engine::network::{Network, Tier};
use archplace_engine::pipeline::PipelineSchedule;
use archplace_engine::search::{Evaluated, ModelPlan};
use archplace_plugin_sdk::AcceleratorConfig;
use archplace_plugin_sdk::units::format_bytes;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// Chips other than the winner compared with it, by role.
const NEXT_BEST: usize = 3;
/// The layers' share of a step when the latency model does not say how much of it is
/// memory traffic (interface 1.0): their operators on the chip, at its compute rate or its
/// HBM bandwidth as the model prices each.
const CHIP: &str = "the chip's compute and HBM traffic";
/// The layers' share of a step when the HBM is busy for at least half of it (the sum of
/// the operators' memory times, interface 1.1): a faster memory shortens it most.
const CHIP_HBM: &str = "the chip's HBM bandwidth";
/// The layers' share of a step when the HBM is busy for less than half of it.
const CHIP_COMPUTE: &str = "the chip's compute";
/// A stage this full of HBM (by the step model's count) is limited by its capacity.
const HBM_FULL: f64 = 0.9;
/// The HBM's busy share of a chip's (or an operator's) time from which its bandwidth, not
/// the compute, is what limits it: at least half (a model adds fixed costs, e.g. a kernel
/// launch, to either bound, so the memory time rarely equals the whole).
pub(crate) const HBM_LIMITS_FROM: f64 = 0.5;

/// Of `chip` seconds of the chip's time (forward, backward, recomputation), the fraction its
/// HBM is busy for `busy` seconds (the operators' memory times); `None` when the latency
/// model gives no memory times, or the chip has no time.
pub(crate) fn hbm_busy_fraction(busy: Option<f64>, chip: f64) -> Option<f64> {
    busy.filter(|_| chip > 0.0)
        .map(|busy| (busy / chip).clamp(0.0, 1.0))
}

/// The explanation of a search's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Explanation {
    /// What limits the winner, per model.
    pub best: Vec<Limit>,
    /// The next best chips and the largest chip that trained every model, each with what
    /// limits it and what it differs in from the winner.
    pub rivals: Vec<Rival>,
    /// The winner's neighbours along each axis of the space, as far as they were evaluated.
    pub sensitivities: Vec<Sensitivity>,
    /// With pipeline schedules searched: per model, the schedule that won and what it
    /// gains over the best 1F1B plan on the winner (a fraction of that plan's throughput).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub schedules: Vec<(String, PipelineSchedule, f64)>,
}

/// What limits one model's plan on a chip.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Limit {
    pub model: String,
    /// The largest share of the step: the chip (the layers' operators: compute and HBM
    /// bandwidth, as the latency model prices them), `tensor-parallel network`,
    /// `expert-parallel network`, `pipeline network`, `data-parallel network`,
    /// `pipeline bubble` or `optimizer step`.
    pub resource: String,
    /// Its share of the step time.
    pub share: f64,
    /// The most loaded stage's memory over the HBM size.
    pub hbm_fraction: f64,
    /// Whether HBM capacity binds (at least 90% full): a smaller HBM, or a plan that keeps
    /// more, does not fit.
    pub hbm_bound: bool,
    /// Of the chip's time (forward, backward, recomputation), the fraction its HBM is busy
    /// moving the layers' bytes; absent when the latency model does not report memory
    /// times. At least one half names the chip's HBM bandwidth as what limits it, less
    /// names its compute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hbm_busy_fraction: Option<f64>,
}

/// A chip the winner beat.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rival {
    /// `near-tie` (within 1% of the winner), `next best` or `largest`.
    pub role: String,
    pub configuration: Configuration,
    pub hbm_bytes: u64,
    pub relative_to_best: f64,
    pub limits: Vec<Limit>,
    /// What differs from the winner: chip axes, plan choices, and the time parts that
    /// moved most.
    pub differences: Vec<String>,
}

/// The winner's neighbours along one axis.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sensitivity {
    pub axis: String,
    /// The winner's value.
    pub value: u64,
    /// The nearest smaller and larger values the search evaluated, with the throughput
    /// relative to the winner (`None`: the chip trains no model at any HBM size).
    pub neighbours: Vec<(u64, Option<f64>)>,
}

/// The axes of a chip, with their values.
fn axes(k: &AcceleratorConfig) -> [(&'static str, u64); 6] {
    [
        ("tensor_cores", k.tensor_cores.into()),
        ("vector_cores", k.vector_cores.into()),
        ("width", k.width.into()),
        ("depth", k.depth.into()),
        ("vector_width", k.vector_width.into()),
        ("buffer_bytes", k.buffer_bytes),
    ]
}

/// Of a search's candidates, those an explanation can use: the fittest few, the largest
/// that fit, and every chip that differs from the winner `best` in at most two axes (its
/// neighbours along one axis, a tied vector width included). `explain` of these alone is
/// `explain` of them all; a search converts only these to lines, not every candidate (its
/// memory bound counts one summary per candidate, not a second copy).
pub fn needed(best: &AcceleratorConfig, explored: &[Evaluated]) -> Vec<usize> {
    let mut fitting: Vec<usize> = (0..explored.len())
        .filter(|&k| explored[k].mean_throughput_samples_per_second.is_some())
        .collect();
    let t = |k: usize| {
        explored[k]
            .mean_throughput_samples_per_second
            .unwrap_or(0.0)
    };
    fitting.sort_by(|&a, &b| {
        t(b).total_cmp(&t(a))
            .then(explored[a].area_um2.total_cmp(&explored[b].area_um2))
            .then(explored[a].index.cmp(&explored[b].index))
    });
    let mut keep: Vec<usize> = fitting.iter().take(NEXT_BEST + 1).copied().collect();
    if let Some(&largest) = fitting.iter().max_by(|&&a, &&b| {
        explored[a]
            .area_um2
            .total_cmp(&explored[b].area_um2)
            .then(explored[b].index.cmp(&explored[a].index))
    }) {
        keep.push(largest);
    }
    let mine = axes(best);
    for (k, e) in explored.iter().enumerate() {
        let theirs = axes(&e.config);
        if mine.iter().zip(&theirs).filter(|(a, b)| a != b).count() <= 2 {
            keep.push(k);
        }
    }
    keep.sort_unstable();
    keep.dedup();
    keep
}

/// The explanation of `doc`'s answer from the candidates of `explored`; `None` when no chip
/// trained every model.
pub fn explain(
    best: &Best,
    network: Option<&Network>,
    explored: &[ExploredLine],
) -> Option<Explanation> {
    let top = best.mean_throughput_samples_per_second;
    let is_best =
        |e: &ExploredLine| e.configuration.chip == best.configuration.chip && e.hbm_bytes.is_some();
    let best_plans = &best.models;
    let mut fitting: Vec<&ExploredLine> = explored
        .iter()
        .filter(|e| e.mean_throughput_samples_per_second.is_some() && !is_best(e))
        .collect();
    // Best first; equal throughput: the smaller chip, then visit order.
    fitting.sort_by(|a, b| {
        throughput(b)
            .total_cmp(&throughput(a))
            .then(
                a.configuration
                    .area_mm2
                    .total_cmp(&b.configuration.area_mm2),
            )
            .then(a.index.cmp(&b.index))
    });
    let rival = |role: &str, e: &ExploredLine| Rival {
        role: role.into(),
        configuration: e.configuration.clone(),
        hbm_bytes: e.hbm_bytes.unwrap_or(0),
        relative_to_best: if top > 0.0 { throughput(e) / top } else { 0.0 },
        limits: e
            .plans
            .iter()
            .map(|p| limit(p, e.hbm_bytes.unwrap_or(0), network))
            .collect(),
        differences: differences(
            (&best.configuration, best.hbm_bytes, best_plans),
            (&e.configuration, e.hbm_bytes.unwrap_or(0), &e.plans),
        ),
    };
    let mut rivals: Vec<Rival> = fitting
        .iter()
        .take(NEXT_BEST)
        .map(|e| {
            let tie = throughput(e) >= top * (1.0 - NEAR_TIE);
            rival(if tie { "near-tie" } else { "next best" }, e)
        })
        .collect();
    let largest = fitting.iter().max_by(|a, b| {
        a.configuration
            .area_mm2
            .total_cmp(&b.configuration.area_mm2)
            .then(b.index.cmp(&a.index))
    });
    if let Some(l) = largest
        && l.configuration.area_mm2 > best.configuration.area_mm2
    {
        rivals.push(rival("largest", l));
    }
    Some(Explanation {
        schedules: best_plans
            .iter()
            .filter_map(|p| {
                p.gain_over_one_f_one_b()
                    .map(|(s, gain)| (p.model.clone(), s, gain))
            })
            .collect(),
        best: best_plans
            .iter()
            .map(|p| limit(p, best.hbm_bytes, network))
            .collect(),
        rivals,
        sensitivities: sensitivities(&best.configuration, top, explored),
    })
}

fn throughput(e: &ExploredLine) -> f64 {
    e.mean_throughput_samples_per_second.unwrap_or(0.0)
}

/// What limits `p` on a chip with `hbm_bytes` of HBM, on `network` (the tier each
/// group's traffic crosses named when known).
pub fn limit(p: &ModelPlan, hbm_bytes: u64, network: Option<&Network>) -> Limit {
    let t = &p.time;
    // Ranks are ordered tensor-parallel first, then context-parallel, then data-parallel,
    // then pipeline: a group spans that many consecutive ranks.
    let (tp, dp) = (p.plan.step.tensor_parallel, p.plan.step.data_parallel);
    let tcp = tp.saturating_mul(p.plan.step.context_parallel);
    let all = tcp
        .saturating_mul(dp)
        .saturating_mul(p.plan.step.pipeline_parallel);
    let chip = t.forward_seconds + t.backward_seconds + t.recomputation_seconds;
    let hbm_busy_fraction = hbm_busy_fraction(p.hbm_busy_seconds, chip);
    let chip_name = match hbm_busy_fraction {
        None => CHIP,
        Some(f) if f >= HBM_LIMITS_FROM => CHIP_HBM,
        Some(_) => CHIP_COMPUTE,
    };
    let parts = [
        (chip_name.to_string(), chip),
        (
            format!("tensor-parallel network{}", tier_words(network, tp)),
            t.tensor_parallel_communication_seconds,
        ),
        (
            // The expert-parallel group spans EP × ETP consecutive ranks.
            format!(
                "expert-parallel network{}",
                tier_words(
                    network,
                    p.plan
                        .step
                        .expert_parallel
                        .saturating_mul(p.plan.step.expert_tensor_parallel)
                )
            ),
            t.all_to_all_seconds,
        ),
        (
            format!("context-parallel network{}", tier_words(network, tcp)),
            t.context_parallel_communication_seconds,
        ),
        (
            "host link (activation offload)".into(),
            t.activation_offload_seconds,
        ),
        (
            format!("pipeline network{}", tier_words(network, all)),
            t.pipeline_point_to_point_seconds,
        ),
        (
            format!(
                "data-parallel network{}",
                tier_words(network, tcp.saturating_mul(dp))
            ),
            t.data_parallel_communication_seconds,
        ),
        ("pipeline bubble".into(), t.pipeline_bubble_seconds),
        ("optimizer step".into(), t.optimizer_step_seconds),
    ];
    let (resource, seconds) = parts
        .into_iter()
        .fold((chip_name.to_string(), f64::MIN), |a, b| {
            if b.1 > a.1 { b } else { a }
        });
    let total = p.time_per_batch_seconds.max(f64::MIN_POSITIVE);
    let hbm_fraction = if hbm_bytes > 0 {
        p.memory_bytes.total / hbm_bytes as f64
    } else {
        0.0
    };
    Limit {
        model: p.model.clone(),
        resource,
        share: seconds / total,
        hbm_fraction,
        hbm_bound: hbm_fraction >= HBM_FULL,
        hbm_busy_fraction,
    }
}

/// The tier a group of `span` consecutive ranks communicates on, in words with what a
/// device achieves there: ` (inside a node, 270 GB/s)`; empty when the network is unknown.
fn tier_words(network: Option<&Network>, span: u64) -> String {
    let Some(n) = network else {
        return String::new();
    };
    // Decimal, as links are rated (NVLink 300 GB/s, a 200 Gb/s NIC 25 GB/s).
    let rate = |t: Tier| format!("{} GB/s", round3(t.bytes_per_second / 1e9));
    if n.node_size == u64::MAX {
        format!(" (one tier, {})", rate(n.intra_node))
    } else if span <= n.node_size {
        format!(" (inside a node, {})", rate(n.intra_node))
    } else {
        format!(" (between nodes, {})", rate(n.inter_node))
    }
}

/// `x` to three significant digits, without trailing zeros (270, 25, 1.5, 0.125).
fn round3(x: f64) -> String {
    if x <= 0.0 || !x.is_finite() {
        return "0".into();
    }
    let digits = (2 - x.log10().floor() as i32).max(0) as usize;
    let s = format!("{x:.digits$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// What differs between the winner `a` and `b`: chip axes, HBM, each model's plan
/// choices, and the two time parts that moved most.
fn differences(
    a: (&Configuration, u64, &[ModelPlan]),
    b: (&Configuration, u64, &[ModelPlan]),
) -> Vec<String> {
    let mut out = Vec::new();
    for ((name, x), (_, y)) in axes(&a.0.chip).into_iter().zip(axes(&b.0.chip)) {
        if x != y {
            out.push(if name == "buffer_bytes" {
                format!("buffer {} → {}", format_bytes(x), format_bytes(y))
            } else {
                format!("{name} {x} → {y}")
            });
        }
    }
    if a.1 != b.1 {
        out.push(format!("HBM {} → {}", format_bytes(a.1), format_bytes(b.1)));
    }
    for (p, q) in a.2.iter().zip(b.2) {
        let choices = |p: &ModelPlan| {
            [
                ("t", p.plan.step.tensor_parallel.to_string()),
                ("p", p.plan.step.pipeline_parallel.to_string()),
                ("d", p.plan.step.data_parallel.to_string()),
                ("micro-batch", p.plan.step.micro_batch.to_string()),
                (
                    "recomputation",
                    p.plan.step.recomputation.name().to_string(),
                ),
                ("interleaving", p.plan.step.interleaving.to_string()),
                (
                    "pipeline schedule",
                    p.plan
                        .estimable()
                        .map_or("-".into(), |x| x.schedule().name().to_string()),
                ),
                (
                    "precision",
                    p.plan
                        .precision()
                        .map_or("-".into(), |x| x.name().to_string()),
                ),
                (
                    "distributed optimizer",
                    p.plan.step.distributed_optimizer.to_string(),
                ),
                ("ZeRO stage", p.plan.step.zero_stage().to_string()),
                (
                    "sequence parallel",
                    p.plan.step.sequence_parallel.to_string(),
                ),
            ]
        };
        let changed: Vec<String> = choices(p)
            .into_iter()
            .zip(choices(q))
            .filter(|(x, y)| x.1 != y.1)
            .map(|(x, y)| format!("{} {} → {}", x.0, x.1, y.1))
            .collect();
        if !changed.is_empty() {
            out.push(format!("{}: {}", p.model, changed.join(", ")));
        }
        let mut moved: Vec<(&str, f64)> = p
            .time
            .parts()
            .into_iter()
            .zip(q.time.parts())
            .map(|((name, x), (_, y))| (name, y - x))
            .filter(|(_, d)| *d != 0.0)
            .collect();
        moved.sort_by(|x, y| y.1.abs().total_cmp(&x.1.abs()));
        let moved: Vec<String> = moved
            .iter()
            .take(2)
            .map(|(name, d)| format!("{name} {}", signed_seconds(*d)))
            .collect();
        if !moved.is_empty() {
            out.push(format!("{} per batch: {}", p.model, moved.join(", ")));
        }
    }
    out
}

fn signed_seconds(s: f64) -> String {
    let sign = if s < 0.0 { "−" } else { "+" };
    let a = s.abs();
    if a >= 1.0 {
        format!("{sign}{a:.3} s")
    } else if a >= 1e-3 {
        format!("{sign}{:.1} ms", a * 1e3)
    } else {
        format!("{sign}{:.1} µs", a * 1e6)
    }
}

/// Per axis, the nearest smaller and larger value among the evaluated chips equal to the
/// winner on every other axis (along `width`, a vector width tied to it moves with it).
fn sensitivities(best: &Configuration, top: f64, explored: &[ExploredLine]) -> Vec<Sensitivity> {
    let mine = axes(&best.chip);
    let mut out = Vec::new();
    for (k, &(axis, value)) in mine.iter().enumerate() {
        let along: Vec<(u64, Option<f64>)> = explored
            .iter()
            .filter_map(|e| {
                let theirs = axes(&e.configuration.chip);
                // A space without its own vector widths ties them to the width: moving
                // along `width` moves both.
                let tied = |a: &[(&str, u64); 6]| a[4].1 == a[2].1;
                let follows = |j: usize| axis == "width" && j == 4 && tied(&mine) && tied(&theirs);
                let same_elsewhere =
                    (0..mine.len()).all(|j| j == k || follows(j) || mine[j].1 == theirs[j].1);
                (same_elsewhere && theirs[k].1 != value).then(|| {
                    let relative = e
                        .mean_throughput_samples_per_second
                        .map(|t| if top > 0.0 { t / top } else { 0.0 });
                    (theirs[k].1, relative)
                })
            })
            .collect();
        let below = along.iter().filter(|n| n.0 < value).max_by_key(|n| n.0);
        let above = along.iter().filter(|n| n.0 > value).min_by_key(|n| n.0);
        let neighbours: Vec<(u64, Option<f64>)> = below.into_iter().chain(above).copied().collect();
        if !neighbours.is_empty() {
            out.push(Sensitivity {
                axis: axis.into(),
                value,
                neighbours,
            });
        }
    }
    out
}

/// The explanation in words, for the run's summary and `archplace explain`.
pub fn render(e: &Explanation) -> String {
    let mut o = String::new();
    for l in &e.best {
        let _ = writeln!(o, "why: {} is limited by {}", l.model, words(l));
    }
    for (model, schedule, gain) in &e.schedules {
        let _ = writeln!(
            o,
            "schedule: {model} runs {} ({}), {:+.1}% throughput over its best 1F1B plan",
            schedule.name(),
            schedule.describe(),
            100.0 * gain
        );
    }
    for r in &e.rivals {
        let _ = writeln!(
            o,
            "{} ({:.2}% slower): {}",
            r.role,
            100.0 * (1.0 - r.relative_to_best),
            chip::long(&r.configuration, r.hbm_bytes)
        );
        for l in &r.limits {
            let _ = writeln!(o, "    {} limited by {}", l.model, words(l));
        }
        if !r.differences.is_empty() {
            let _ = writeln!(o, "    differs in: {}", r.differences.join("; "));
        }
    }
    if !e.sensitivities.is_empty() {
        let parts: Vec<String> = e
            .sensitivities
            .iter()
            .map(|s| {
                let show = |v: u64| {
                    if s.axis == "buffer_bytes" {
                        format_bytes(v)
                    } else {
                        v.to_string()
                    }
                };
                let around: Vec<String> = s
                    .neighbours
                    .iter()
                    .map(|(v, r)| match r {
                        Some(r) => format!("{} {:+.1}%", show(*v), 100.0 * (r - 1.0)),
                        None => format!("{} does not fit", show(*v)),
                    })
                    .collect();
                let name = if s.axis == "buffer_bytes" {
                    "buffer"
                } else {
                    &s.axis
                };
                format!("{name} {}: {}", show(s.value), around.join(", "))
            })
            .collect();
        let _ = writeln!(
            o,
            "sensitivity (neighbours of the winner, throughput against it): {}",
            parts.join("; ")
        );
    }
    o
}

fn words(l: &Limit) -> String {
    let mut s = format!("{} ({:.0}% of the step)", l.resource, 100.0 * l.share);
    if let Some(f) = l.hbm_busy_fraction {
        let _ = write!(s, "; HBM busy {:.0}% of the chip's time", 100.0 * f);
    }
    if l.hbm_bound {
        let _ = write!(s, " and HBM capacity ({:.0}% full)", 100.0 * l.hbm_fraction);
    } else {
        let _ = write!(s, "; HBM {:.0}% full", 100.0 * l.hbm_fraction);
    }
    s
}

#[cfg(test)]
mod tests;
