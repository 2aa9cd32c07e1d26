//! A schedule's placements: checked against the instance's semantics, and made from the
//! solver's starts and modes (cores by interval colouring).

use super::prep::Prep;
use super::{Instance, Mode, Placement, Resource};

/// Checks that `placements` is a valid schedule of `inst` (with a relative tolerance).
pub fn check(inst: &Instance, placements: &[Placement]) -> Result<(), String> {
    let n = inst.tasks.len();
    if placements.len() != n {
        return Err(format!("{} placements for {n} operators", placements.len()));
    }
    let span = placements.iter().map(|p| p.finish).fold(0.0, f64::max);
    let eps = 1e-6 * span.max(1e-12);
    for (i, (t, p)) in inst.tasks.iter().zip(placements).enumerate() {
        let want = match (t.resource, p.mode) {
            (Resource::None, _) => 0.0,
            (Resource::Link, _) => t.single,
            (_, Mode::Single) => t.single,
            (_, Mode::Parallel) => t.parallel,
        };
        if ((p.finish - p.start) - want).abs() > eps || p.start < -eps {
            return Err(format!(
                "operator {i} runs {} instead of {want}",
                p.finish - p.start
            ));
        }
    }
    for &(a, b) in &inst.edges {
        if placements[a].finish > placements[b].start + eps {
            return Err(format!(
                "operator {b} starts at {} before {a} finishes at {}",
                placements[b].start, placements[a].finish
            ));
        }
    }
    let overlap = |i: usize, j: usize| {
        let (p, q) = (&placements[i], &placements[j]);
        p.start + eps < q.finish
            && q.start + eps < p.finish
            && p.finish - p.start > eps
            && q.finish - q.start > eps
    };
    for i in 0..n {
        let ri = inst.tasks[i].resource;
        for j in i + 1..n {
            let rj = inst.tasks[j].resource;
            if !overlap(i, j) {
                continue;
            }
            let parallel = (ri.is_core() && placements[i].mode == Mode::Parallel && rj.is_core())
                || (rj.is_core() && placements[j].mode == Mode::Parallel && ri.is_core());
            if parallel {
                return Err(format!(
                    "operators {i} and {j} overlap although one runs in parallel mode"
                ));
            }
            if ri == Resource::Link && rj == Resource::Link {
                return Err(format!("all-reduces {i} and {j} overlap"));
            }
            let same_tc = ri.uses_tensor()
                && rj.uses_tensor()
                && placements[i].tensor_core == placements[j].tensor_core;
            let same_vc = ri.uses_vector()
                && rj.uses_vector()
                && placements[i].vector_core == placements[j].vector_core;
            if same_tc || same_vc {
                return Err(format!("operators {i} and {j} overlap on the same core"));
            }
        }
    }
    for (i, (t, p)) in inst.tasks.iter().zip(placements).enumerate() {
        if p.mode == Mode::Single {
            if t.resource.uses_tensor() && p.tensor_core.is_none_or(|c| c >= inst.tensor_cores) {
                return Err(format!("operator {i} has no valid tensor core"));
            }
            if t.resource.uses_vector() && p.vector_core.is_none_or(|c| c >= inst.vector_cores) {
                return Err(format!("operator {i} has no valid vector core"));
            }
        }
    }
    Ok(())
}

/// Turns real-operator starts and modes into placements of every operator: cores by
/// interval colouring, `none` operators at the finish of their last predecessor.
pub(super) fn place(
    inst: &Instance,
    prep: &Prep,
    starts: &[f64],
    modes: &[Mode],
) -> Vec<Placement> {
    let n = inst.tasks.len();
    let mut out: Vec<Placement> = vec![
        Placement {
            mode: Mode::Single,
            start: 0.0,
            finish: 0.0,
            tensor_core: None,
            vector_core: None
        };
        n
    ];
    for (k, &i) in prep.real.iter().enumerate() {
        out[i].mode = if prep.res[k].is_core() {
            modes[k]
        } else {
            Mode::Single
        };
        out[i].start = starts[k];
        out[i].finish = starts[k] + prep.duration(k, out[i].mode);
    }
    // Cores: lowest free core at each start, in order of start.
    let mut by_start: Vec<usize> = (0..prep.len())
        .filter(|&k| prep.res[k].is_core() && modes[k] == Mode::Single)
        .collect();
    by_start.sort_by(|&a, &b| starts[a].total_cmp(&starts[b]).then(a.cmp(&b)));
    let mut tc_free = vec![f64::NEG_INFINITY; prep.tc as usize];
    let mut vc_free = vec![f64::NEG_INFINITY; prep.vc as usize];
    let span = starts
        .iter()
        .zip(0..)
        .map(|(s, k)| s + prep.duration(k, modes[k]))
        .fold(0.0, f64::max);
    let eps = 1e-9 * span.max(1e-12);
    for k in by_start {
        let i = prep.real[k];
        let (s, f) = (out[i].start, out[i].finish);
        let take = |free: &mut Vec<f64>| {
            let c = free.iter().position(|&x| x <= s + eps).unwrap_or(0);
            free[c] = f;
            c as u32
        };
        if prep.res[k].uses_tensor() {
            out[i].tensor_core = Some(take(&mut tc_free));
        }
        if prep.res[k].uses_vector() {
            out[i].vector_core = Some(take(&mut vc_free));
        }
    }
    // `none` operators: at the latest finish of their predecessors, in topological order.
    let mut preds = vec![Vec::new(); n];
    for &(a, b) in &inst.edges {
        preds[b].push(a);
    }
    let mut done = vec![false; n];
    for &i in &prep.real {
        done[i] = true;
    }
    let mut changed = true;
    while changed {
        changed = false;
        for i in 0..n {
            if !done[i] && preds[i].iter().all(|&p| done[p]) {
                let t = preds[i].iter().map(|&p| out[p].finish).fold(0.0, f64::max);
                out[i] = Placement {
                    mode: Mode::Single,
                    start: t,
                    finish: t,
                    tensor_core: None,
                    vector_core: None,
                };
                done[i] = true;
                changed = true;
            }
        }
    }
    out
}
