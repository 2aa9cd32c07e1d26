use super::*;
use PipelineSchedule as S;

fn slots(f: f64, b: f64, w: f64, o: f64) -> Slots {
    Slots {
        forward: f,
        backward_input: b,
        weight: w,
        overlapped: o,
    }
}

/// Each device's idle time in the simulated pipeline.
fn idle(sim: &Simulated, p: u64) -> Vec<f64> {
    (0..p as u32)
        .map(|d| {
            let busy: f64 = sim
                .passes
                .iter()
                .filter(|x| x.device == d)
                .map(|x| x.end - x.start)
                .sum();
            sim.makespan - busy
        })
        .collect()
}

const SHAPES: [(f64, f64, f64); 4] = [
    (1.0, 1.0, 1.0),
    (1.0, 1.2, 0.8),
    (1.0, 1.5, 0.5),
    (0.7, 1.6, 0.9),
];

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

#[test]
fn one_f_one_b_and_interleaved_simulate_their_closed_forms() {
    for p in [1u64, 2, 3, 4, 8, 16] {
        for v in [1u64, 2, 3, 4] {
            for mult in [1u64, 2, 5] {
                let m = p * mult;
                let (f, b) = (0.8, 1.9);
                let s = S::implied(v);
                let sim = simulate(s, p, v, m, slots(f / v as f64, b / v as f64, 0.0, 0.0));
                // (m + (p − 1)/v) T: Narayanan et al. 2021's bubble.
                let expected = (m as f64 + (p - 1) as f64 / v as f64) * (f + b);
                assert!(
                    close(sim.makespan, expected),
                    "p {p} v {v} m {m}: {} vs {expected}",
                    sim.makespan
                );
            }
        }
    }
}

#[test]
fn zero_bubble_h1_bubble_is_at_most_the_papers_and_equal_with_equal_passes() {
    for p in [2u64, 4, 8, 16] {
        for m in [2 * p, 3 * p + 1, 8 * p] {
            for (f, b, w) in SHAPES {
                let sim = simulate(S::ZeroBubble, p, 1, m, slots(f, b, w, 0.0));
                let bubble = sim.makespan - m as f64 * (f + b + w);
                // Qi et al. 2024, ZB-H1: (p − 1)(T_F + T_B − T_W).
                let paper = (p - 1) as f64 * (f + b - w);
                if f == b && b == w {
                    assert!(close(bubble, paper), "p {p} m {m}: {bubble} vs {paper}");
                }
                let one = simulate(S::OneFOneB, p, 1, m, slots(f, b + w, 0.0, 0.0));
                assert!(sim.makespan <= one.makespan + 1e-9);
            }
        }
    }
}

#[test]
fn zbv_bubble_is_below_zb_h1_with_equal_passes() {
    for p in [2u64, 4, 8] {
        let m = 2 * p;
        let sim = simulate(S::Zbv, p, 1, m, slots(0.5, 0.5, 0.5, 0.0));
        // Two chunks of three passes of 0.5 per micro-batch.
        let bubble = sim.makespan - m as f64 * 3.0;
        let h1 = (p - 1) as f64;
        assert!(bubble < h1, "p {p}: {bubble}");
        assert!(bubble >= 0.0);
    }
}

#[test]
fn dualpipe_idle_is_at_most_the_published_bubble_and_equal_with_equal_passes() {
    for p in [2u64, 4, 6, 8, 16] {
        for m in [2 * p, 2 * p + 2, 5 * p] {
            for (f, b, w) in SHAPES {
                for o in [f + b + w, f + b + w - 0.5 * f] {
                    // DeepSeek's table: (PP/2 − 1)(F&B + B − 3W), B the whole backward.
                    let paper = |pp: u64, scale: f64| {
                        (pp / 2).saturating_sub(1) as f64 * (o + (b + w) - 3.0 * w) / scale
                    };
                    let dual = simulate(S::DualPipe, p, 1, m, slots(f, b, w, o));
                    let worst = idle(&dual, p).into_iter().fold(0.0, f64::max);
                    assert!(
                        worst <= paper(p, 1.0) + 1e-9,
                        "dualpipe p {p} m {m}: {worst} > {}",
                        paper(p, 1.0)
                    );
                    // DualPipeV: 2p stages of half a device's layers each.
                    let v = simulate(
                        S::DualPipeV,
                        p,
                        1,
                        m,
                        slots(f / 2.0, b / 2.0, w / 2.0, o / 2.0),
                    );
                    let worst_v = idle(&v, p).into_iter().fold(0.0, f64::max);
                    assert!(
                        worst_v <= paper(2 * p, 2.0) + 1e-9,
                        "dualpipev p {p} m {m}: {worst_v} > {}",
                        paper(2 * p, 2.0)
                    );
                    if f == b && b == w {
                        assert!(close(worst, paper(p, 1.0)), "dualpipe p {p} m {m}: {worst}");
                        assert!(
                            close(worst_v, paper(2 * p, 2.0)),
                            "dualpipev p {p} m {m}: {worst_v}"
                        );
                    }
                }
            }
        }
    }
}

/// Every pass once, each after its inputs, one at a time per device.
fn check_passes(s: S, p: u64, v: u64, m: u64, sim: &Simulated) {
    let stages = s.model_stages(p, v) as u32;
    let dirs = if s == S::DualPipe { 2 } else { 1 };
    let mut forward = std::collections::BTreeMap::new();
    let mut backward = std::collections::BTreeMap::new();
    let mut weights = 0;
    let mut split = 0;
    for x in &sim.passes {
        match x.pass {
            Pass::Forward => assert!(forward.insert((x.micro_batch, x.stage), *x).is_none()),
            Pass::Backward => assert!(backward.insert((x.micro_batch, x.stage), *x).is_none()),
            Pass::BackwardInput => {
                split += 1;
                assert!(backward.insert((x.micro_batch, x.stage), *x).is_none());
            }
            Pass::WeightGradient => weights += 1,
            Pass::ForwardBackward => {
                assert!(forward.insert((x.micro_batch, x.stage), *x).is_none());
                let (mb, st) = x.paired.expect("a pair names its backward");
                assert!(backward.insert((mb, st), *x).is_none());
            }
        }
    }
    assert_eq!(forward.len() as u64, m * stages as u64 * dirs / dirs.max(1));
    assert_eq!(backward.len(), forward.len());
    assert_eq!(
        weights, split,
        "{s:?}: a weight gradient per split backward"
    );
    // DualPipe's directions: the second's micro-batches run the stages in reverse device
    // order, but each direction's stage order is the model's.
    for (&(mb, st), f) in &forward {
        if st > 0 {
            assert!(
                f.start >= forward[&(mb, st - 1)].end - 1e-12,
                "{s:?} F {mb}/{st}"
            );
        }
        let bwd = backward[&(mb, st)];
        assert!(bwd.start >= f.end - 1e-12 || bwd == *f);
        if st + 1 < stages {
            assert!(
                bwd.start >= backward[&(mb, st + 1)].end - 1e-12,
                "{s:?} B {mb}/{st}"
            );
        }
    }
    for d in 0..p as u32 {
        let mut mine: Vec<&Placed> = sim.passes.iter().filter(|x| x.device == d).collect();
        mine.sort_by(|a, b| a.start.total_cmp(&b.start));
        for w in mine.windows(2) {
            assert!(w[1].start >= w[0].end - 1e-12, "{s:?} device {d} overlaps");
        }
    }
}

#[test]
fn every_schedule_runs_every_pass_once_after_its_inputs_within_its_memory() {
    for s in S::ALL {
        for p in [2u64, 4, 8] {
            for m in [2 * p, 4 * p] {
                let v = if s == S::Interleaved { 2 } else { 1 };
                assert!(s.problems(p, v, m).is_empty(), "{s:?} p {p} m {m}");
                let sim = simulate(s, p, v, m, slots(1.0, 1.1, 0.7, 2.3));
                check_passes(s, p, v, m, &sim);
                let chunks = s.chunks_visited(v) as f64;
                for (k, &peak) in sim.peak_chunks_in_flight.iter().enumerate() {
                    // Korthikanti et al.'s factor is the first device's; Megatron's warm-up
                    // holds more on the others than `p − k` (the first stays the largest).
                    if s == S::Interleaved && k > 0 {
                        assert!(peak <= sim.peak_chunks_in_flight[0]);
                        continue;
                    }
                    let limit = s.in_flight(k as u64, p, v, m) * chunks;
                    assert!(
                        peak as f64 <= limit + 1e-9,
                        "{s:?} p {p} m {m} device {k}: {peak} > {limit}"
                    );
                }
                if matches!(s, S::OneFOneB | S::Interleaved) {
                    let first = s.in_flight(0, p, v, m) * chunks;
                    assert_eq!(sim.peak_chunks_in_flight[0] as f64, first, "{s:?}");
                }
            }
        }
    }
}

#[test]
fn the_schedules_rules_name_what_they_need() {
    assert!(S::OneFOneB.problems(4, 1, 3).is_empty());
    assert_eq!(
        S::OneFOneB.problems(4, 2, 8),
        [ScheduleError::Chunks {
            schedule: "1f1b",
            chunks: 1,
            interleaving: 2
        }]
    );
    assert_eq!(
        S::Interleaved.problems(4, 1, 8),
        [ScheduleError::InterleavedChunks { interleaving: 1 }]
    );
    assert_eq!(S::DualPipe.problems(3, 1, 12).len(), 1);
    assert_eq!(S::DualPipe.problems(4, 1, 7).len(), 1);
    assert!(S::DualPipe.problems(4, 1, 8).is_empty());
    assert!(S::DualPipeV.problems(3, 1, 7).is_empty());
    assert_eq!(S::DualPipeV.problems(4, 1, 7).len(), 1);
    assert!(S::Zbv.problems(4, 2, 1).is_empty());
    assert_eq!(S::Zbv.problems(4, 3, 8).len(), 1);
    for s in S::ALL {
        assert_eq!(S::from_name(s.name()), Some(s));
        let json = serde_json::to_string(&s).expect("serialises");
        assert_eq!(json, format!("\"{}\"", s.name()));
    }
}

#[test]
fn layouts_place_uneven_stages_and_both_directions() {
    // Llama 3 405B's: 126 blocks, 16 devices, 2 chunks, 7 on the first and the last.
    let mut per = vec![8u64; 16];
    per[0] = 7;
    per[15] = 7;
    let l = Layout::of(S::Interleaved, 2, &per);
    assert_eq!(l.stages.len(), 32);
    assert_eq!(l.devices[0], [0, 16]);
    assert_eq!(l.stages[0].blocks + l.stages[16].blocks, 7);
    assert_eq!(l.stages.iter().map(|s| s.blocks).sum::<u64>(), 126);
    assert_eq!(l.stages[31].first_block + l.stages[31].blocks, 126);
    // DualPipe: device k holds stage k of each direction's copy: k and p − 1 − k.
    let d = Layout::of(S::DualPipe, 1, &[3, 4, 4, 2]);
    assert_eq!(d.devices, [vec![0, 3], vec![1, 2], vec![2, 1], vec![3, 0]]);
    assert_eq!(
        d.stages.iter().map(|s| s.blocks).collect::<Vec<_>>(),
        [3, 4, 4, 2]
    );
    // A V: device 0 holds the first and the last stage.
    let v = Layout::of(S::Zbv, 1, &[5, 4]);
    assert_eq!(v.devices, [vec![0, 3], vec![1, 2]]);
    assert_eq!(
        v.stages.iter().map(|s| s.blocks).collect::<Vec<_>>(),
        [3, 2, 2, 2]
    );
    assert_eq!(split_evenly(7, 2), [4, 3]);
}

/// The rows of docs/validation.md's "Pipeline schedules" table: the published bubble and
/// memory formulas (Sea AI Lab's table for 1F1B, ZB1P and ZBV at `F = B = W`; DeepSeek's
/// for DualPipe and DualPipeV) against the simulation, at `p = 8`, `m = 32`. The page
/// quotes these numbers; this test fails when they change.
#[test]
// The rows are printed for the page (`-- --nocapture`).
#[allow(clippy::disallowed_macros)]
fn the_published_schedule_tables_against_the_simulation() {
    let (p, m) = (8u64, 32u64);
    let rate = |sim: &Simulated, busy: f64| (sim.makespan - busy) / sim.makespan;
    // Sea AI Lab: bubble rate B = (p − 1)/(m + p − 1) for 1F1B, B/3 for ZB1P, 0 for ZBV.
    let b = (p - 1) as f64 / (m + p - 1) as f64;
    let one = simulate(S::OneFOneB, p, 1, m, slots(1.0, 2.0, 0.0, 0.0));
    let zb = simulate(S::ZeroBubble, p, 1, m, slots(1.0, 1.0, 1.0, 0.0));
    let zbv = simulate(S::Zbv, p, 1, m, slots(0.5, 0.5, 0.5, 0.0));
    let busy = 3.0 * m as f64;
    let rows = [
        ("1f1b", b, rate(&one, busy)),
        ("zero-bubble", b / 3.0, rate(&zb, busy)),
        ("zbv", 0.0, rate(&zbv, busy)),
    ];
    let quoted = [(0.1795, 0.1795), (0.0598, 0.0680), (0.0, 0.0352)];
    for ((name, published, simulated), (p4, s4)) in rows.iter().zip(quoted) {
        println!("{name}: published {published:.4}, simulated {simulated:.4}");
        assert!(
            (published - p4).abs() < 5e-5 && (simulated - s4).abs() < 5e-5,
            "{name}"
        );
    }
    // Activation memory against 1F1B's (1x for ZB1P and ZBV): the simulated peaks.
    assert_eq!(zb.peak_chunks_in_flight[0], one.peak_chunks_in_flight[0]);
    assert_eq!(
        zbv.peak_chunks_in_flight.iter().max(),
        Some(&(2 * p as u32))
    );
    // DeepSeek: DualPipe's bubble (PP/2 − 1)(F&B + B − 3W) and PP + 1 activations, at
    // F = B = W = 1 and an overlapped pair F&B = 2.5.
    let dual = simulate(S::DualPipe, p, 1, m, slots(1.0, 1.0, 1.0, 2.5));
    let worst = idle(&dual, p).into_iter().fold(0.0, f64::max);
    let published = (p / 2 - 1) as f64 * (2.5 + 2.0 - 3.0);
    println!(
        "dualpipe: published bubble {published}, simulated {worst}; peak {:?}",
        dual.peak_chunks_in_flight
    );
    assert!((worst - published).abs() < 1e-9);
    assert_eq!(
        dual.peak_chunks_in_flight.iter().max(),
        Some(&(p as u32 + 1))
    );
    let v = simulate(S::DualPipeV, p, 1, m, slots(0.5, 0.5, 0.5, 1.25));
    let idle_v = idle(&v, p).into_iter().fold(0.0, f64::max);
    let published_v = (2 * p / 2 - 1) as f64 * (1.25 + 1.0 - 1.5);
    println!(
        "dualpipev: published bubble {published_v}, simulated {idle_v}; peak {:?}",
        v.peak_chunks_in_flight
    );
    assert!((idle_v - published_v).abs() < 1e-9);
    assert_eq!(
        v.peak_chunks_in_flight.iter().max(),
        Some(&(2 * p as u32 + 1))
    );
}
