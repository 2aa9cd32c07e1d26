//! A search's result in words: what `archplace run` prints when the search ends — how the
//! search went, the best chip and each model's plan on it (throughput, choices, devices and
//! stages, where the time goes, memory, the baseline), the plan as `archplace estimate`
//! takes it, why the winner wins and how sure it is. The CLI prints it; the Python
//! package's `explain()` returns it.

use crate::result::ResultDoc;
use archplace_engine::search::{ModelPlan, Strategy};
use archplace_plugin_sdk::text::{significant, thousands};
use std::path::Path;

/// `writeln!` into a `String`, which cannot fail.
macro_rules! put {
    ($out:expr, $($arg:tt)*) => {{
        $out.push_str(&format!($($arg)*));
        $out.push('\n');
    }};
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
pub fn render_plan(m: &ModelPlan, cluster_devices: u64) -> String {
    let mut out = String::new();
    put!(
        out,
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
    );
    if let (Some(s), Some(base)) = (
        m.pipeline_schedule,
        m.one_f_one_b_throughput_samples_per_second,
    ) && base > 0.0
    {
        put!(
            out,
            "    pipeline schedule: {} ({:+.1}% throughput over the best 1F1B plan)",
            s.describe(),
            100.0 * (m.throughput_samples_per_second / base - 1.0)
        );
    }
    if m.plan.step.expert_parallel > 1 || m.plan.step.expert_tensor_parallel > 1 {
        put!(
            out,
            "    experts: EP = {} × ETP = {} (folded into the t × d ranks of each stage)",
            m.plan.step.expert_parallel,
            m.plan.step.expert_tensor_parallel
        );
    }
    if m.plan.step.context_parallel > 1 {
        put!(
            out,
            "    context parallelism: CP = {} (each sequence split over CP ranks)",
            m.plan.step.context_parallel
        );
    }
    put!(
        out,
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
    );
    let share = |x: f64| 100.0 * x / m.time_per_batch_seconds;
    // Every part of the step (TimeBreakdown::parts), the optional ones only when present.
    let parts: Vec<String> = m
        .time
        .parts()
        .iter()
        .filter(|(name, s)| !archplace_engine::step::OPTIONAL_PARTS.contains(name) || *s > 0.0)
        .map(|(name, s)| format!("{name} {:.0}%", share(*s)))
        .collect();
    put!(out, "    limited by {}: {}", m.limiting, parts.join(", "));
    let mem = &m.memory_bytes;
    let gib = |b: f64| b / (1u64 << 30) as f64;
    put!(
        out,
        "    memory of the most loaded stage: {:.1} GiB (weights {:.1}, gradients {:.1}, optimizer {:.1}, activations {:.1})",
        gib(mem.total),
        gib(mem.weights),
        gib(mem.gradients),
        gib(mem.optimizer),
        gib(mem.activations),
    );
    if let Some(b) = &m.baseline {
        match b.throughput_samples_per_second {
            Some(t) => put!(
                out,
                "    baseline p={} d={} t={}: {} samples/s ({:.2}× slower than the plan found)",
                b.pipeline,
                b.data,
                b.tensor,
                significant(t, 4),
                m.throughput_samples_per_second / t
            ),
            None => put!(
                out,
                "    baseline p={} d={} t={}: infeasible ({})",
                b.pipeline,
                b.data,
                b.tensor,
                b.infeasible.as_deref().unwrap_or("")
            ),
        }
    }
    out
}

pub fn render(doc: &ResultDoc, dir: &Path) -> String {
    let mut out = String::new();
    let s = &doc.search;
    put!(
        out,
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
    );
    if s.strategy == Strategy::Proven && !s.cancelled {
        let remaining = s
            .largest_remaining_bound_samples_per_second
            .map_or(String::new(), |b| {
                format!(", none of which can reach {} samples/s", significant(b, 4))
            });
        put!(
            out,
            "proven best of all {} candidates: {} bounded in {:.1} s ({} of them exactly), {} pruned{remaining}",
            thousands(s.candidates_in_space as u64),
            thousands(s.candidates_bounded as u64),
            doc.timings.bound_seconds,
            thousands(s.candidates_bounded_exactly as u64),
            thousands(s.candidates_pruned as u64),
        );
    } else if s.strategy == Strategy::Converge && !s.cancelled && s.converged {
        put!(
            out,
            "not proven: chips the walk did not visit may be better; `[search] strategy = \"proven\"` proves the best of the whole space"
        );
    }
    if doc.work.mip_time_limit_hits > 0 {
        put!(
            out,
            "not reproducible: {} layer-schedule MIPs stopped at the wall-clock safety net (schedule_time_limit_seconds), where what they find depends on the machine's speed and load",
            doc.work.mip_time_limit_hits
        );
    }
    if s.resumed_candidates > 0 {
        put!(
            out,
            "{} candidates resumed from the journal of an interrupted run",
            s.resumed_candidates
        );
    }
    let Some(best) = &doc.best else {
        put!(
            out,
            "no candidate can train every model within the HBM sizes given; see {}/explored.jsonl",
            dir.display()
        );
        return out;
    };
    put!(
        out,
        "best chip: {}",
        crate::chip::long(&best.configuration, best.hbm_bytes)
    );
    for m in &best.models {
        out.push_str(&render_plan(m, doc.spec.devices));
    }
    // The chip and each plan, as `archplace estimate` takes them.
    let peak = crate::chip::peak_flops_per_second(
        &best.configuration.chip,
        &doc.cost_models.latency.name,
        &doc.cost_model_parameters,
    );
    for m in &best.models {
        if let Some(plan) = m.plan.estimable() {
            put!(
                out,
                "  {} for `archplace estimate --mip` (the same numbers), in a spec with this model, [training] and [cluster]{}:",
                m.model,
                best.node_size
                    .map_or(String::new(), |n| format!(" (node_size = {n})"))
            );
            for line in
                archplace_spec::estimate_toml(&best.configuration.chip, best.hbm_bytes, peak, plan)
                    .lines()
                    .filter(|l| !l.is_empty())
            {
                put!(out, "    {line}");
            }
        }
    }
    if let Some(domains) = &doc.scale_up_domains {
        for line in crate::domains::render(domains).lines() {
            put!(out, "{line}");
        }
    }
    // Why the winner wins: the chips it beat (near-ties first) and what each differs in.
    match &doc.explanation {
        Some(e) => {
            for line in crate::explain::render(e).lines() {
                put!(out, "{line}");
            }
        }
        None => {
            for tie in &doc.near_ties {
                put!(
                    out,
                    "near-tie ({:.2}% slower): {}",
                    100.0 * (1.0 - tie.relative_to_best),
                    crate::chip::long(&tie.configuration, tie.hbm_bytes)
                );
            }
        }
    }
    if let Some(u) = &doc.uncertainty {
        for line in crate::calibrated::render_search(u).lines() {
            put!(out, "{line}");
        }
    }
    let w = &doc.work;
    put!(
        out,
        "layer schedules: {} ({} settled by bounds, {} MIPs, {} from another buffer's MIP, {} reused); results in {}",
        thousands(w.layer_schedules),
        thousands(w.mips_avoided),
        thousands(w.mips_solved),
        thousands(w.mips_reused),
        thousands(w.schedules_reused),
        dir.display()
    );
    out
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
