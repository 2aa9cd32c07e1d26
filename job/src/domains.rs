//! `result.json`'s `scale_up_domains`: with several scale-up domain sizes in the spec
//! (`[cluster] node_size = [8, 72]`), the best chip at each size, which size wins and by how
//! much, and why — what the winner's step spends less time on at the winning size.
//!
//! Every candidate is evaluated at every size (its record's `domains`), so the best chip at
//! a size is the best of the explored candidates there; ties go to the smaller chip, then
//! to the one visited first, as in the search.

use crate::lines::Configuration;
use archplace_engine::search::{
    Evaluated, ModelPlan, Outcome, TIE_RELATIVE, faster_or_smaller, ties,
};
use serde::{Deserialize, Serialize};

/// The comparison of the scale-up domain sizes a search tried.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DomainComparison {
    /// Each size, in the spec's order.
    pub sizes: Vec<DomainBest>,
    /// The size of the fastest system (ties to the smaller domain).
    pub winner_node_size: u64,
    /// The winner's mean throughput over the runner-up size's (≥ 1; `null` when only one
    /// size trains every model).
    pub margin: Option<f64>,
    /// Why the size wins, per model: the best chip's plan at the winning size against its
    /// plan at each other size — the plan's shape and the parts of the step that change
    /// most.
    pub why: Vec<String>,
}

/// The best chip when every system has one scale-up domain size.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DomainBest {
    /// Devices on one scale-up (NVLink-class) domain.
    pub node_size: u64,
    /// `null` when no chip trains every model at this size.
    pub configuration: Option<Configuration>,
    pub hbm_bytes: Option<u64>,
    pub mean_throughput_samples_per_second: Option<f64>,
    /// Its throughput relative to the winning size's best (≤ 1).
    pub relative_to_winner: Option<f64>,
    /// Each model's plan on that chip at this size.
    pub plans: Vec<ModelPlan>,
}

/// The comparison, when the search tried several sizes (its candidates carry `domains`).
pub fn compare(outcome: &Outcome) -> Option<DomainComparison> {
    // Every candidate has a record at every size (the sizes in the spec's order).
    let first = outcome.explored.iter().find(|e| !e.domains.is_empty())?;
    let node_sizes: Vec<u64> = first.domains.iter().map(|d| d.node_size).collect();
    let sizes = node_sizes.len();
    let bests: Vec<Option<Evaluated>> = (0..sizes).map(|k| best_at(outcome, k)).collect();
    let throughput = |e: &Option<Evaluated>| {
        e.as_ref()
            .and_then(|e| e.mean_throughput_samples_per_second)
    };
    // The winning size: the fastest best, ties to the smaller domain.
    let mut winner: Option<usize> = None;
    for k in 0..sizes {
        let Some(t) = throughput(&bests[k]) else {
            continue;
        };
        let size = node_sizes[k] as f64;
        if winner.is_none_or(|w| {
            let b = throughput(&bests[w]).unwrap_or(0.0);
            faster_or_smaller((t, size), (b, node_sizes[w] as f64))
        }) {
            winner = Some(k);
        }
    }
    let top = winner.and_then(|w| throughput(&bests[w]));
    let runner_up = (0..sizes)
        .filter(|&k| Some(k) != winner)
        .filter_map(|k| throughput(&bests[k]))
        .fold(None, |a: Option<f64>, t| Some(a.map_or(t, |a| a.max(t))));
    let entries = bests
        .iter()
        .zip(&node_sizes)
        .map(|(b, &node_size)| DomainBest {
            node_size,
            configuration: b
                .as_ref()
                .map(|e| Configuration::new(&e.config, e.area_um2)),
            hbm_bytes: b.as_ref().and_then(|e| e.hbm_bytes),
            mean_throughput_samples_per_second: throughput(b),
            relative_to_winner: throughput(b).zip(top).map(|(t, top)| t / top),
            plans: b
                .as_ref()
                .map(|e| e.plans.iter().map(ModelPlan::summary).collect())
                .unwrap_or_default(),
        })
        .collect();
    let why = match (winner, &outcome.best) {
        (Some(w), Some(best)) => reasons(best, w),
        _ => Vec::new(),
    };
    Some(DomainComparison {
        sizes: entries,
        winner_node_size: winner.map_or(node_sizes[0], |w| node_sizes[w]),
        margin: top.zip(runner_up).map(|(t, r)| t / r),
        why,
    })
}

/// The best explored candidate at domain `k`, as a record of its own.
fn best_at(outcome: &Outcome, k: usize) -> Option<Evaluated> {
    let mut best: Option<&Evaluated> = None;
    for e in &outcome.explored {
        let Some(t) = e
            .domains
            .get(k)
            .and_then(|d| d.mean_throughput_samples_per_second)
        else {
            continue;
        };
        if best.is_none_or(|b| {
            let bt = b.domains[k]
                .mean_throughput_samples_per_second
                .unwrap_or(0.0);
            faster_or_smaller((t, e.area_um2), (bt, b.area_um2))
        }) {
            best = Some(e);
        }
    }
    best.map(|e| e.at_domain(k))
}

/// Per model and per other size: the best chip's plan at the winning size `w` against its
/// plan at that size, in words.
fn reasons(best: &Evaluated, w: usize) -> Vec<String> {
    let Some(at_winner) = best.domains.get(w) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let others = best.domains.iter().enumerate().filter(|(k, _)| *k != w);
    for (k, other) in others {
        let Some(t_other) = other.mean_throughput_samples_per_second else {
            out.push(format!(
                "on the best chip, no plan trains every model with {} devices per domain ({}); with {} they train",
                other.node_size,
                other.failure.as_deref().unwrap_or("none fits"),
                at_winner.node_size
            ));
            continue;
        };
        let t_win = at_winner.mean_throughput_samples_per_second.unwrap_or(0.0);
        if ties(t_win, t_other) {
            let smaller = at_winner.node_size.min(other.node_size);
            for a in best.domain_plans(w) {
                out.push(format!(
                    "{} on the best chip: the same step with {} and {} devices per domain ({}): its tensor-, context- and expert-parallel groups span {} devices, within a domain of {smaller}; the smaller domain is kept",
                    a.model,
                    at_winner.node_size.min(other.node_size),
                    at_winner.node_size.max(other.node_size),
                    shape(a),
                    group_span(a)
                ));
            }
            continue;
        }
        for (a, b) in best.domain_plans(w).iter().zip(best.domain_plans(k)) {
            out.push(format!(
                "{} on the best chip: {} devices per domain train {} the speed of {} ({} vs {}){}",
                a.model,
                at_winner.node_size,
                ratio(t_win / t_other),
                other.node_size,
                shape(a),
                shape(b),
                changes(a, b)
            ));
        }
    }
    out
}

/// The consecutive ranks a plan's fast groups span: the tensor- and context-parallel
/// ranks of a sequence (`t × CP`), or an expert-parallel group (`EP × ETP`) if wider.
fn group_span(p: &ModelPlan) -> u64 {
    (p.plan.step.tensor_parallel * p.plan.step.context_parallel)
        .max(p.plan.step.expert_parallel * p.plan.step.expert_tensor_parallel)
}

/// `1.31×`.
fn ratio(r: f64) -> String {
    format!("{r:.2}×")
}

/// A plan's shape: `t 8 × EP 64 × CP 2 × p 4 × d 16`.
fn shape(p: &ModelPlan) -> String {
    let mut s = format!("t {}", p.plan.step.tensor_parallel);
    if p.plan.step.expert_parallel > 1 {
        s += &format!(", EP {}", p.plan.step.expert_parallel);
    }
    if p.plan.step.context_parallel > 1 {
        s += &format!(", CP {}", p.plan.step.context_parallel);
    }
    s + &format!(
        ", p {}, d {}",
        p.plan.step.pipeline_parallel, p.plan.step.data_parallel
    )
}

/// The two parts of the step that change most from `b` to `a`: `; expert-parallel
/// all-to-all 2.10 s → 0.61 s, …`.
fn changes(a: &ModelPlan, b: &ModelPlan) -> String {
    let mut deltas: Vec<(&str, f64, f64)> = a
        .time
        .parts()
        .iter()
        .zip(b.time.parts())
        .map(|(&(name, x), (_, y))| (name, x, y))
        .filter(|(_, x, y)| (x - y).abs() > 0.0)
        .collect();
    deltas.sort_by(|p, q| (q.2 - q.1).abs().total_cmp(&(p.2 - p.1).abs()));
    let said: Vec<String> = deltas
        .iter()
        .take(2)
        .map(|(name, x, y)| format!("{name} {} → {}", seconds(*y), seconds(*x)))
        .collect();
    if said.is_empty() {
        String::new()
    } else {
        format!("; per step: {}", said.join(", "))
    }
}

/// Seconds to three significant digits.
fn seconds(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.2} s")
    } else {
        format!("{:.3} s", s)
    }
}

/// The comparison in a few lines, as `archplace run` prints it.
pub fn render(c: &DomainComparison) -> String {
    let mut out = match c.margin {
        Some(m) if m <= 1.0 + TIE_RELATIVE => format!(
            "scale-up domain: the sizes tie; {} devices per node, the smallest of the fastest, are enough\n",
            c.winner_node_size
        ),
        Some(m) => format!(
            "scale-up domain: {} devices per node win, {} the throughput of the next size\n",
            c.winner_node_size,
            ratio(m)
        ),
        None => format!(
            "scale-up domain: only {} devices per node train every model\n",
            c.winner_node_size
        ),
    };
    for s in &c.sizes {
        let line = match (&s.configuration, s.mean_throughput_samples_per_second) {
            (Some(chip), Some(t)) => format!(
                "  {:>4} per node: {:.4} samples/s ({}) on {}\n",
                s.node_size,
                t,
                s.relative_to_winner
                    .map_or(String::new(), |r| format!("{r:.3} of the winner")),
                crate::chip::long(chip, s.hbm_bytes.unwrap_or(0))
            ),
            _ => format!(
                "  {:>4} per node: no chip trains every model\n",
                s.node_size
            ),
        };
        out += &line;
    }
    for why in &c.why {
        out += &format!("  why: {why}\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use archplace_engine::search::{DomainScore, Stats};
    use archplace_plugin_sdk::AcceleratorConfig;

    /// A plan of `model` at `samples_per_second`, `t`-wide, its all-to-all `a2a` seconds.
    fn plan(samples_per_second: f64, t: u64, a2a: f64) -> ModelPlan {
        serde_json::from_value(serde_json::json!({
            "model": "moe",
            "micro_batch": 1,
            "activation_recomputation": false,
            "tensor_parallel": t,
            "expert_parallel": 8,
            "data_parallel": 16 / t,
            "pipeline_stages": 1,
            "time_per_batch_seconds": 64.0 / samples_per_second,
            "gradient_all_reduce_seconds": 0.0,
            "throughput_samples_per_second": samples_per_second,
            "throughput_tokens_per_second": samples_per_second * 4096.0,
            "stages": [],
            "layers": [],
            "baseline": null,
            "time": { "forward_seconds": 1.0, "backward_seconds": 2.0,
                      "recomputation_seconds": 0.0,
                      "tensor_parallel_communication_seconds": 0.0,
                      "all_to_all_seconds": a2a,
                      "pipeline_point_to_point_seconds": 0.0,
                      "pipeline_bubble_seconds": 0.0,
                      "data_parallel_communication_seconds": 0.0,
                      "optimizer_step_seconds": 0.0 }
        }))
        .unwrap()
    }

    /// A candidate of `area_mm2` at two domain sizes, 8 and 72 (throughput `None`: fails).
    fn candidate(index: usize, area_mm2: f64, at: [Option<f64>; 2]) -> Evaluated {
        let domains: Vec<DomainScore> = at
            .iter()
            .zip([8, 72])
            .map(|(t, node_size)| DomainScore {
                node_size,
                mean_throughput_samples_per_second: *t,
                hbm_bytes: t.map(|_| 80 << 30),
                plans: t
                    .map(|t| vec![plan(t, 1, if node_size == 8 { 1.5 } else { 0.25 })])
                    .unwrap_or_default(),
                failure: t.is_none().then(|| "does not fit".to_string()),
            })
            .collect();
        let best = if at[1] > at[0] { 1 } else { 0 };
        Evaluated {
            index,
            config: AcceleratorConfig {
                tensor_cores: index as u32 + 1,
                vector_cores: 1,
                width: 16,
                depth: 16,
                vector_width: 16,
                buffer_bytes: 1 << 20,
            },
            area_um2: area_mm2 * 1e6,
            bucket: 0,
            mean_throughput_samples_per_second: at[best],
            hbm_bytes: at[best].map(|_| 80 << 30),
            plans: domains[best].plans.clone(),
            failure: None,
            node_size: Some(domains[best].node_size),
            domains,
        }
    }

    /// The best chip at each size, the winning size by its margin over the other, and why:
    /// the all-to-all that shrinks on the larger domain.
    #[test]
    fn each_size_has_its_best_and_the_winner_says_why() {
        let explored = vec![
            candidate(0, 400.0, [Some(10.0), Some(13.0)]),
            candidate(1, 300.0, [Some(11.0), Some(12.0)]),
            candidate(2, 200.0, [None, Some(5.0)]),
        ];
        let outcome = Outcome {
            best: Some(explored[0].clone()),
            explored,
            stats: Stats::default(),
        };
        let c = compare(&outcome).unwrap();
        assert_eq!(c.winner_node_size, 72);
        assert_eq!(
            c.sizes[0].configuration.as_ref().unwrap().chip.tensor_cores,
            2
        );
        assert_eq!(c.sizes[0].mean_throughput_samples_per_second, Some(11.0));
        assert_eq!(
            c.sizes[1].configuration.as_ref().unwrap().chip.tensor_cores,
            1
        );
        assert!((c.margin.unwrap() - 13.0 / 11.0).abs() < 1e-12);
        assert!((c.sizes[0].relative_to_winner.unwrap() - 11.0 / 13.0).abs() < 1e-12);
        assert_eq!(c.why.len(), 1);
        assert!(
            c.why[0].contains("72 devices per domain train 1.30× the speed of 8"),
            "{}",
            c.why[0]
        );
        assert!(
            c.why[0].contains("expert-parallel all-to-all 1.50 s → 0.250 s"),
            "{}",
            c.why[0]
        );
        assert!(
            render(&c).contains("72 devices per node win, 1.18×"),
            "{}",
            render(&c)
        );
    }

    /// Equal throughput at both sizes: a tie, kept at the smaller domain, said so.
    #[test]
    fn a_tie_keeps_the_smaller_domain() {
        let mut e = candidate(0, 400.0, [Some(10.0), Some(10.0)]);
        e.domains[1].plans = e.domains[0].plans.clone();
        let outcome = Outcome {
            best: Some(e.clone()),
            explored: vec![e],
            stats: Stats::default(),
        };
        let c = compare(&outcome).unwrap();
        assert_eq!(c.winner_node_size, 8);
        assert_eq!(c.margin, Some(1.0));
        assert!(
            c.why[0].contains("the same step with 8 and 72"),
            "{}",
            c.why[0]
        );
        assert!(render(&c).contains("the sizes tie"));
    }

    /// One domain size: no comparison.
    #[test]
    fn one_size_has_no_comparison() {
        let mut e = candidate(0, 400.0, [Some(10.0), Some(10.0)]);
        e.domains.clear();
        let outcome = Outcome {
            best: Some(e.clone()),
            explored: vec![e],
            stats: Stats::default(),
        };
        assert!(compare(&outcome).is_none());
    }
}
