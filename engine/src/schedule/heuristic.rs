//! A serial schedule-generation scheme: operators in priority order (longest path to the
//! end first), each at the earliest time its predecessors, its mode and the cores allow,
//! in the mode that finishes it first; then hill-climbing over the modes.

// Operators are indices into several parallel arrays; index loops read best here.
#![allow(clippy::needless_range_loop)]

use super::{Mode, Prep, Resource};

/// One placed operator: start, finish, index, mode.
type Slot = (f64, f64, usize, Mode);

/// Longest path from each operator to the end, with `duration(i)` for operator `i`.
fn bottom_levels_by(p: &Prep, duration: impl Fn(usize) -> f64) -> Vec<f64> {
    let m = p.len();
    let mut bl: Vec<f64> = (0..m).map(&duration).collect();
    for i in (0..m).rev() {
        let tail = p
            .edges
            .iter()
            .filter(|e| e.0 == i)
            .map(|e| bl[e.1])
            .fold(0.0, f64::max);
        bl[i] = duration(i) + tail;
    }
    bl
}

/// Longest path from each operator to the end, shortest durations.
fn bottom_levels(p: &Prep) -> Vec<f64> {
    bottom_levels_by(p, |i| p.min_duration(i))
}

/// Longest path from each operator to the end, single-core durations: the work still
/// ahead of an operator if nothing ran on all cores.
fn bottom_levels_single(p: &Prep) -> Vec<f64> {
    bottom_levels_by(p, |i| p.single[i])
}

/// Largest number of intervals in `slots` (those `relevant`) that overlap at one instant
/// inside `[t, t + d)`.
fn peak(slots: &[Slot], t: f64, d: f64, eps: f64, relevant: impl Fn(&Slot) -> bool) -> usize {
    let mut events: Vec<(f64, i32)> = Vec::new();
    for s in slots.iter().filter(|s| relevant(s)) {
        let (a, b) = (s.0.max(t), s.1.min(t + d));
        if a + eps < b {
            events.push((a, 1));
            events.push((b, -1));
        }
    }
    events.sort_by(|x, y| x.0.total_cmp(&y.0).then(x.1.cmp(&y.1)));
    let (mut now, mut best) = (0i32, 0i32);
    for (_, delta) in events {
        now += delta;
        best = best.max(now);
    }
    best as usize
}

/// An operator being placed: its index, mode and duration in that mode.
#[derive(Clone, Copy)]
struct Placing {
    k: usize,
    mode: Mode,
    d: f64,
}

/// Whether `op` can start at `t` beside the operators already in `slots`.
fn fits(p: &Prep, slots: &[Slot], op: Placing, t: f64, eps: f64) -> bool {
    let Placing { k, mode, d } = op;
    if d <= eps {
        return true;
    }
    let rk = p.res[k];
    for &(s, e, j, mj) in slots {
        if !(s + eps < t + d && t + eps < e) || e - s <= eps {
            continue;
        }
        let rj = p.res[j];
        if rk.is_core() && rj.is_core() && (mode == Mode::Parallel || mj == Mode::Parallel) {
            return false;
        }
        if rk == Resource::Link && rj == Resource::Link {
            return false;
        }
    }
    if mode == Mode::Single {
        let single = |s: &Slot| s.3 == Mode::Single;
        if rk.uses_tensor()
            && peak(slots, t, d, eps, |s| single(s) && p.res[s.2].uses_tensor()) >= p.tc as usize
        {
            return false;
        }
        if rk.uses_vector()
            && peak(slots, t, d, eps, |s| single(s) && p.res[s.2].uses_vector()) >= p.vc as usize
        {
            return false;
        }
    }
    true
}

/// The earliest start of `op` from `ready` on: now, or when something placed ends.
fn earliest(p: &Prep, slots: &[Slot], op: Placing, ready: f64, eps: f64) -> f64 {
    let mut candidates: Vec<f64> = std::iter::once(ready)
        .chain(slots.iter().map(|s| s.1).filter(|&e| e > ready))
        .collect();
    candidates.sort_by(f64::total_cmp);
    candidates.dedup();
    for t in candidates {
        if fits(p, slots, op, t, eps) {
            return t;
        }
    }
    // After everything placed, nothing conflicts.
    slots.iter().map(|s| s.1).fold(ready, f64::max)
}

/// One pass of the scheme; `fixed` forces the modes.
fn sgs(p: &Prep, priority: &[f64], fixed: Option<&[Mode]>, eps: f64) -> (f64, Vec<f64>, Vec<Mode>) {
    let m = p.len();
    let mut waiting = vec![0usize; m];
    for &(_, b) in &p.edges {
        waiting[b] += 1;
    }
    let mut ready = vec![0.0f64; m];
    let mut scheduled = vec![false; m];
    let mut starts = vec![0.0; m];
    let mut modes = vec![Mode::Single; m];
    let mut slots: Vec<Slot> = Vec::with_capacity(m);
    for _ in 0..m {
        let Some(k) = (0..m)
            .filter(|&i| !scheduled[i] && waiting[i] == 0)
            .max_by(|&a, &b| priority[a].total_cmp(&priority[b]).then(b.cmp(&a)))
        else {
            break;
        };
        let options: &[Mode] = match fixed {
            Some(f) => std::slice::from_ref(&f[k]),
            None if p.can_parallel[k] => &[Mode::Single, Mode::Parallel],
            None => &[Mode::Single],
        };
        let mut best: Option<(f64, f64, Mode)> = None;
        for &mode in options {
            let mode = if p.can_parallel[k] {
                mode
            } else {
                Mode::Single
            };
            let d = p.duration(k, mode);
            let t = earliest(p, &slots, Placing { k, mode, d }, ready[k], eps);
            if best.is_none_or(|b| t + d < b.1 - eps) {
                best = Some((t, t + d, mode));
            }
        }
        let Some((t, f, mode)) = best else { break };
        scheduled[k] = true;
        starts[k] = t;
        modes[k] = mode;
        slots.push((t, f, k, mode));
        for &(a, b) in &p.edges {
            if a == k {
                waiting[b] -= 1;
                ready[b] = ready[b].max(f);
            }
        }
    }
    let span = slots.iter().map(|s| s.1).fold(0.0, f64::max);
    (span, starts, modes)
}

/// The tolerance of the list schedules' comparisons: relative to the operators' shortest
/// durations in sum — a serial schedule's makespan, which bounds the best one — so that one
/// operator's huge single-core time (which the schedule avoids) does not blur the rest.
fn tolerance(p: &Prep) -> f64 {
    let scale: f64 = (0..p.len()).map(|i| p.min_duration(i)).sum();
    1e-12 * scale.max(1e-300)
}

/// The best list schedule found: `(makespan, starts, modes)` of the real operators.
pub(super) fn best(p: &Prep) -> (f64, Vec<f64>, Vec<Mode>) {
    let priority = bottom_levels(p);
    let eps = tolerance(p);
    let mut best = sgs(p, &priority, None, eps);
    let shortest: Vec<Mode> = (0..p.len())
        .map(|i| {
            if p.can_parallel[i] {
                Mode::Parallel
            } else {
                Mode::Single
            }
        })
        .collect();
    for start in [shortest, vec![Mode::Single; p.len()]] {
        let r = sgs(p, &priority, Some(&start), eps);
        if r.0 < best.0 - eps {
            best = r;
        }
    }
    // Parallel for the operators with the most work still ahead of them, single for the
    // rest: the critical chain runs alone on all cores while what hangs off it (a
    // backward pass's weight gradients) waits to run side by side on single cores. One
    // threshold per distinct bottom level (single durations).
    let ahead = bottom_levels_single(p);
    let mut thresholds: Vec<f64> = (0..p.len())
        .filter(|&i| p.can_parallel[i])
        .map(|i| ahead[i])
        .collect();
    thresholds.sort_by(f64::total_cmp);
    thresholds.dedup();
    for &theta in &thresholds {
        let modes: Vec<Mode> = (0..p.len())
            .map(|i| {
                if p.can_parallel[i] && ahead[i] >= theta {
                    Mode::Parallel
                } else {
                    Mode::Single
                }
            })
            .collect();
        let r = sgs(p, &priority, Some(&modes), eps);
        if r.0 < best.0 - eps {
            best = r;
        }
    }
    // Hill-climbing over modes: flip one operator's mode at a time.
    let flippable: Vec<usize> = (0..p.len()).filter(|&i| p.can_parallel[i]).collect();
    for _pass in 0..3 {
        let mut improved = false;
        for &i in &flippable {
            let mut modes = best.2.clone();
            modes[i] = match modes[i] {
                Mode::Single => Mode::Parallel,
                Mode::Parallel => Mode::Single,
            };
            let r = sgs(p, &priority, Some(&modes), eps);
            if r.0 < best.0 - eps {
                best = r;
                improved = true;
            }
        }
        if !improved {
            break;
        }
    }
    best
}

/// A deeper search from `start` (a list schedule `best` returned), for a schedule the
/// bounds have not settled, before a MIP is built: every pair of mode flips, each with the
/// bottom levels of its own durations as priorities as well as the usual ones.
pub(super) fn deeper(p: &Prep, start: (f64, Vec<f64>, Vec<Mode>)) -> (f64, Vec<f64>, Vec<Mode>) {
    let priority = bottom_levels(p);
    let eps = tolerance(p);
    let mut best = start;
    let flippable: Vec<usize> = (0..p.len()).filter(|&i| p.can_parallel[i]).collect();
    let flip = |m: Mode| match m {
        Mode::Single => Mode::Parallel,
        Mode::Parallel => Mode::Single,
    };
    let mut improved = true;
    while improved {
        improved = false;
        let base = best.2.clone();
        for (x, &i) in flippable.iter().enumerate() {
            for &j in &flippable[x..] {
                let mut modes = base.clone();
                modes[i] = flip(modes[i]);
                if j != i {
                    modes[j] = flip(modes[j]);
                }
                let own = bottom_levels_of(p, &modes);
                for pr in [&priority, &own] {
                    let r = sgs(p, pr, Some(&modes), eps);
                    if r.0 < best.0 - eps {
                        best = r;
                        improved = true;
                    }
                }
            }
        }
    }
    best
}

/// Longest path from each operator to the end with the durations of `modes`.
fn bottom_levels_of(p: &Prep, modes: &[Mode]) -> Vec<f64> {
    bottom_levels_by(p, |i| p.duration(i, modes[i]))
}

/// The scheme with fixed modes and priorities, for exhaustive tests.
#[cfg(test)]
pub(super) fn sgs_for_tests(
    p: &Prep,
    priority: &[f64],
    modes: &[Mode],
) -> (f64, Vec<f64>, Vec<Mode>) {
    sgs(p, priority, Some(modes), 1e-12)
}
