//! (Tests as data: these read the fixture files, which the engine itself never does.)
#![allow(
    clippy::disallowed_methods,
    clippy::disallowed_types,
    clippy::disallowed_macros
)]

use super::*;
use crate::phaze::schedule as format;
use archplace_plugin_sdk::testing::Rng;

fn fixtures() -> Vec<(String, Instance, f64)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/schedule");
    let mut out = Vec::new();
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    for path in names {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if name.ends_with(".expected.json") || !name.ends_with(".json") {
            continue;
        }
        let input = format::parse(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let expected: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(path.with_extension("expected.json")).unwrap(),
        )
        .unwrap();
        out.push((
            name,
            format::instance(&input).unwrap(),
            expected["makespan"].as_f64().unwrap(),
        ));
    }
    out
}

/// Every reference case within the README's tolerance: `0.99·expected ≤ m ≤ expected·(1 + 1e-6)`,
/// each schedule valid and proven optimal.
#[test]
fn matches_the_reference_fixtures() {
    let cases = fixtures();
    assert_eq!(cases.len(), 12);
    let mut total = 0.0;
    for (name, inst, expected) in &cases {
        let s = solve(inst, &ScheduleOptions::default()).unwrap();
        check(inst, &s.placements).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(s.optimal, "{name}: not proven optimal ({s:?})");
        assert!(
            s.makespan >= 0.99 * expected && s.makespan <= expected * (1.0 + 1e-6),
            "{name}: makespan {} vs reference {expected}",
            s.makespan
        );
        eprintln!(
            "{name}: {:.6} (reference {expected:.6}) by {:?} in {:.2} ms",
            s.makespan,
            s.method,
            s.solve_seconds * 1e3
        );
        total += s.solve_seconds;
    }
    eprintln!(
        "total solve time over the 12 cases: {:.1} ms (debug build)",
        total * 1e3
    );
}

/// A node limit is a work limit: whatever the machine, the MIP stops at the same schedule.
/// One node cannot prove the harder reference cases optimal; each stops there, valid, with
/// the same answer every time: results must not depend on load.
#[test]
fn a_node_limit_stops_the_mip_at_the_same_schedule_every_time() {
    let options = ScheduleOptions {
        node_limit: 1,
        time_limit_seconds: 1e3,
        ..ScheduleOptions::default()
    };
    let mut stopped = 0;
    for (name, inst, _) in fixtures() {
        let first = solve(&inst, &options).unwrap();
        check(&inst, &first.placements).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(!first.hit_time_limit, "{name}");
        assert!(first.optimal || first.hit_node_limit, "{name}: {first:?}");
        stopped += usize::from(first.hit_node_limit);
        for _ in 0..3 {
            let again = solve(&inst, &options).unwrap();
            assert_eq!(
                (again.makespan, &again.placements, again.gap),
                (first.makespan, &first.placements, first.gap),
                "{name}"
            );
        }
    }
    assert!(
        stopped > 0,
        "no fixture reached the node limit: the test shows nothing"
    );
}

fn random_instance(rng: &mut Rng, n: usize) -> Instance {
    random_instance_with(rng, n, 3)
}

/// A random instance with 1 to `max_cores` cores of each type.
fn random_instance_with(rng: &mut Rng, n: usize, max_cores: u64) -> Instance {
    let resources = [
        Resource::Tensor,
        Resource::Vector,
        Resource::Fused,
        Resource::None,
        Resource::Link,
    ];
    let tasks = (0..n)
        .map(|_| {
            let resource = resources[rng.below(5) as usize];
            let single = (1 + rng.below(20)) as f64 / 4.0;
            let parallel = single * (2 + rng.below(12)) as f64 / 10.0;
            Task::new(resource, single, parallel)
        })
        .collect();
    let mut edges = Vec::new();
    for b in 1..n {
        for a in 0..b {
            if rng.below(4) == 0 {
                edges.push((a, b));
            }
        }
    }
    Instance {
        tensor_cores: 1 + rng.below(max_cores) as u32,
        vector_cores: 1 + rng.below(max_cores) as u32,
        tasks,
        edges,
    }
}

/// The bound by the modes is a lower bound: never above the optimum, on random
/// instances with few cores (where work limits) and many (where paths do); and it is often
/// stronger than the other bounds, so the test shows something.
#[test]
fn the_mode_bound_never_exceeds_the_optimum() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut stronger = 0;
    for case in 0..400 {
        let n = 2 + rng.below(5) as usize;
        let cores = if case % 2 == 0 { 3 } else { 16 };
        let inst = random_instance_with(&mut rng, n, cores);
        let p = Prep::new(&inst).unwrap();
        let want = exhaustive(&inst);
        // Every choice enumerated, and (a relaxation) only the longest two.
        for most in [Prep::MODE_BOUND_MAX_CHOICES, 2] {
            let Some(b) = p.mode_bound_with(most) else {
                continue;
            };
            assert!(
                b <= want + 1e-9 * want.max(1.0),
                "case {case}: mode bound {b} (at most {most} choices) above the optimum {want}\n{inst:?}"
            );
            if most > 2 {
                stronger += usize::from(b > p.lower_bound() + 1e-9);
            }
        }
    }
    assert!(
        stronger > 20,
        "only {stronger} cases: the bound adds nothing here"
    );
}

/// An instance made of two in series (every operator of the first precedes every one of the
/// second) is cut into its parts, each solved alone, and the sum is the optimum.
#[test]
fn series_parts_are_solved_apart_and_the_sum_is_the_optimum() {
    let mut rng = Rng(0x6a09_e667_f3bc_c908);
    let mut cut = 0;
    for case in 0..150 {
        let (na, nb) = (1 + rng.below(3) as usize, 1 + rng.below(3) as usize);
        let a = random_instance_with(&mut rng, na, 16);
        let b = random_instance_with(&mut rng, nb, 16);
        let mut tasks = a.tasks.clone();
        tasks.extend(b.tasks.iter().copied());
        let mut edges = a.edges.clone();
        edges.extend(b.edges.iter().map(|&(x, y)| (x + na, y + na)));
        for x in 0..na {
            for y in 0..nb {
                edges.push((x, na + y));
            }
        }
        let inst = Instance {
            tensor_cores: a.tensor_cores,
            vector_cores: a.vector_cores,
            tasks,
            edges,
        };
        let p = Prep::new(&inst).unwrap();
        let real = |t: &[Task]| t.iter().any(|t| t.resource != Resource::None);
        if real(&a.tasks) && real(&b.tasks) {
            assert!(p.series_parts().len() >= 2, "case {case}");
            cut += 1;
        }
        solves_optimally(case, &inst);
    }
    assert!(cut > 50, "only {cut} cases were cut");
}

/// Exhaustive: every mode assignment × every priority order of the schedule-generation
/// scheme (which together reach every active schedule, among which is an optimal one).
fn exhaustive(inst: &Instance) -> f64 {
    let p = Prep::new(inst).unwrap();
    let m = p.len();
    if m == 0 {
        return 0.0;
    }
    let flippable: Vec<usize> = (0..m).filter(|&i| p.can_parallel[i]).collect();
    let mut perms = vec![vec![]];
    for k in 0..m {
        let mut next = Vec::new();
        for perm in &perms {
            for pos in 0..=perm.len() {
                let mut q: Vec<usize> = perm.clone();
                q.insert(pos, k);
                next.push(q);
            }
        }
        perms = next;
    }
    let mut best = f64::INFINITY;
    for mask in 0u32..(1 << flippable.len()) {
        let mut modes = vec![Mode::Single; m];
        for (b, &i) in flippable.iter().enumerate() {
            if mask >> b & 1 == 1 {
                modes[i] = Mode::Parallel;
            }
        }
        for perm in &perms {
            let priority: Vec<f64> = (0..m)
                .map(|i| -(perm.iter().position(|&x| x == i).unwrap() as f64))
                .collect();
            let (span, _, _) = heuristic::sgs_for_tests(&p, &priority, &modes);
            best = best.min(span);
        }
    }
    best
}

/// Solves `inst` and checks the schedule against exhaustive search: valid, proven
/// optimal, the optimum's makespan, a lower bound not above it.
fn solves_optimally(case: usize, inst: &Instance) -> Schedule {
    let s = solve(inst, &ScheduleOptions::default()).unwrap();
    check(inst, &s.placements).unwrap_or_else(|e| panic!("case {case}: {e}\n{inst:?}\n{s:?}"));
    let want = exhaustive(inst);
    assert!(s.optimal, "case {case}");
    assert!(
        (s.makespan - want).abs() <= 1e-6 * want.max(1.0),
        "case {case}: {} vs exhaustive {want}\n{inst:?}",
        s.makespan
    );
    assert!(
        s.lower_bound <= want + 1e-9,
        "case {case}: bound {} above optimum {want}",
        s.lower_bound
    );
    // The bound a proven search uses without solving.
    let unsolved = makespan_lower_bound(inst).unwrap();
    assert!(
        unsolved <= want + 1e-9 && unsolved <= s.makespan + 1e-9,
        "case {case}: bound {unsolved} above optimum {want}"
    );
    s
}

#[test]
fn agrees_with_exhaustive_search_on_small_random_instances() {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut by_mip = 0;
    for case in 0..250 {
        let n = 2 + rng.below(5) as usize;
        let inst = random_instance(&mut rng, n);
        let s = solves_optimally(case, &inst);
        by_mip += usize::from(s.method == Method::Mip);
    }
    assert!(
        by_mip > 10,
        "only {by_mip} cases needed the MIP: the test does not exercise it"
    );
}

#[test]
fn a_chain_needs_no_mip() {
    let tasks = vec![Task::new(Resource::Tensor, 4.0, 1.0); 5];
    let edges = (1..5).map(|i| (i - 1, i)).collect();
    let s = solve(
        &Instance {
            tensor_cores: 4,
            vector_cores: 1,
            tasks,
            edges,
        },
        &ScheduleOptions::default(),
    )
    .unwrap();
    assert_eq!(s.method, Method::Bounds);
    assert!(s.optimal);
    assert_eq!(s.makespan, 5.0);
}

#[test]
fn bad_instances_are_errors() {
    let t = |single| Task::new(Resource::Vector, single, 1.0);
    let cyc = Instance {
        tensor_cores: 1,
        vector_cores: 1,
        tasks: vec![t(1.0), t(1.0)],
        edges: vec![(0, 1), (1, 0)],
    };
    assert_eq!(
        solve(&cyc, &ScheduleOptions::default()),
        Err(ScheduleError::Cycle)
    );
    let nan = Instance {
        tensor_cores: 1,
        vector_cores: 1,
        tasks: vec![t(f64::NAN)],
        edges: vec![],
    };
    assert!(matches!(
        solve(&nan, &ScheduleOptions::default()),
        Err(ScheduleError::BadLatency(0, _, _))
    ));
    let none = Instance {
        tensor_cores: 1,
        vector_cores: 0,
        tasks: vec![t(1.0)],
        edges: vec![],
    };
    assert!(matches!(
        solve(&none, &ScheduleOptions::default()),
        Err(ScheduleError::NoCores(1, 0))
    ));
}

/// One operator whose single-core time is enormous (and whose all-cores time is not) once
/// made the list schedule's tolerance enormous too, and the schedule it returned put
/// operators on the same core at the same time. Found by `tests/fuzz.rs`.
#[test]
fn an_enormous_single_core_time_does_not_blur_the_list_schedule() {
    let mut inst = fixtures().swap_remove(3).1;
    let i = inst
        .tasks
        .iter()
        .position(|t| t.resource.is_core() && t.parallel < t.single)
        .unwrap();
    inst.tasks[i].single = 1e308;
    let options = ScheduleOptions {
        heuristic_only: true,
        ..ScheduleOptions::default()
    };
    let s = solve(&inst, &options).unwrap();
    check(&inst, &s.placements).unwrap();
    assert!(s.makespan.is_finite() && s.lower_bound <= s.makespan * (1.0 + 1e-9));
}

/// Latencies whose sum has no finite float are refused with a typed error, not scheduled.
#[test]
fn latencies_that_overflow_in_sum_are_refused() {
    let mut inst = fixtures().swap_remove(0).1;
    for t in inst.tasks.iter_mut().filter(|t| t.resource.is_core()) {
        t.single = 1e308;
    }
    assert!(matches!(
        solve(&inst, &ScheduleOptions::default()),
        Err(ScheduleError::Overflow)
    ));
}

/// The exposed communication is the links' busy time that no core's work covers: a
/// collective entirely under computation costs nothing, one alone all of its time, one half
/// covered half; zero-length and `None` tasks count for neither.
#[test]
fn exposed_link_time_is_what_computation_does_not_cover() {
    let task = |resource| Task::new(resource, 1.0, 1.0);
    let inst = Instance {
        tensor_cores: 1,
        vector_cores: 1,
        tasks: vec![
            task(Resource::Tensor),
            task(Resource::Link),
            task(Resource::Vector),
            task(Resource::Link),
            task(Resource::Link),
            task(Resource::None),
        ],
        edges: vec![],
    };
    let at = |start: f64, finish: f64| Placement {
        mode: Mode::Parallel,
        start,
        finish,
        tensor_core: None,
        vector_core: None,
    };
    let schedule = |placements: Vec<Placement>| Schedule {
        makespan: 10.0,
        memory_seconds: 0.0,
        memory_bound_seconds: 0.0,
        lower_bound: 0.0,
        optimal: true,
        gap: 0.0,
        method: Method::Bounds,
        hit_time_limit: false,
        hit_node_limit: false,
        mips_run: 0,
        solve_seconds: 0.0,
        placements,
    };
    // Tensor 0–4, vector 3–6; links 1–2 (hidden), 5–8 (1 s covered), 8–10 (alone).
    let s = schedule(vec![
        at(0.0, 4.0),
        at(1.0, 2.0),
        at(3.0, 6.0),
        at(5.0, 8.0),
        at(8.0, 10.0),
        at(6.0, 9.0),
    ]);
    assert_eq!(s.exposed_link_seconds(&inst), 4.0);
    // Two links at once count once; nothing computing, all of their union.
    let s = schedule(vec![
        at(0.0, 0.0),
        at(1.0, 3.0),
        at(0.0, 0.0),
        at(2.0, 4.0),
        at(4.0, 4.0),
        at(0.0, 10.0),
    ]);
    assert_eq!(s.exposed_link_seconds(&inst), 3.0);
}

/// Two memory-bound operators side by side on two cores share the chip's memory: together
/// they take the time of both, not of one (the reference prices each as if alone). The
/// floor settles the schedule as optimal without a MIP, and the placements stay valid.
#[test]
fn operators_that_overlap_share_the_memory_bandwidth() {
    let busy = Task {
        memory: 1.0,
        ..Task::new(Resource::Tensor, 1.0, 1.0)
    };
    let inst = Instance {
        tensor_cores: 2,
        vector_cores: 1,
        tasks: vec![busy, busy],
        edges: vec![],
    };
    let s = solve(&inst, &ScheduleOptions::default()).unwrap();
    check(&inst, &s.placements).unwrap();
    assert_eq!(s.makespan, 2.0);
    assert_eq!(s.memory_seconds, 2.0);
    assert_eq!(s.memory_bound_seconds, 1.0);
    assert!(s.optimal && s.method == Method::Bounds);
    assert_eq!(s.lower_bound, 2.0);
    // Compute-bound operators (memory half their time) keep the cores' schedule.
    let half = Task {
        memory: 0.5,
        ..busy
    };
    let inst = Instance {
        tasks: vec![half, half],
        ..inst
    };
    let s = solve(&inst, &ScheduleOptions::default()).unwrap();
    assert_eq!((s.makespan, s.memory_bound_seconds), (1.0, 0.0));
}

/// The floor holds for each series part on its own (parts run one after another): a
/// memory-bound part before a compute-bound one adds only its own excess.
#[test]
fn each_series_part_is_held_to_its_own_memory_floor() {
    let op = |memory| Task {
        memory,
        ..Task::new(Resource::Tensor, 1.0, 1.0)
    };
    // Part 1: ops 0 and 1 side by side (memory 1 each), then op 2 after both, then
    // part 2: ops 3 and 4 side by side, compute-bound.
    let inst = Instance {
        tensor_cores: 2,
        vector_cores: 1,
        tasks: vec![op(1.0), op(1.0), op(0.2), op(0.1), op(0.1)],
        edges: vec![(0, 2), (1, 2), (2, 3), (2, 4)],
    };
    let s = solve(&inst, &ScheduleOptions::default()).unwrap();
    check(&inst, &s.placements).unwrap();
    // Parts: {0, 1} floor 2 over cores 1; {2} 1; {3, 4} 1.
    assert!((s.makespan - 4.0).abs() < 1e-12, "{s:?}");
    assert!((s.memory_bound_seconds - 1.0).abs() < 1e-12);
    assert!((s.memory_seconds - 2.4).abs() < 1e-12);
    assert!(
        s.placements[2].start >= 2.0 - 1e-12,
        "op 2 waits for the memory"
    );
}

/// On random instances with memory times: the schedule is valid, proven optimal, never
/// shorter than the cores' optimum or the memory floor, never longer than both added;
/// where the instance is one series part (no edges) it is exactly the larger of the two.
#[test]
fn the_memory_floor_agrees_with_exhaustive_search() {
    let mut rng = Rng(0x51_7cc1_b727_220a);
    let mut bound = 0;
    for case in 0..200 {
        let n = 2 + rng.below(4) as usize;
        let mut inst = random_instance(&mut rng, n);
        if case % 2 == 0 {
            inst.edges.clear();
        }
        let without = solve(&inst, &ScheduleOptions::default()).unwrap();
        for t in &mut inst.tasks {
            let d = t.single.min(t.parallel);
            t.memory = d * (4 + rng.below(7)) as f64 / 10.0;
        }
        let s = solve(&inst, &ScheduleOptions::default()).unwrap();
        check(&inst, &s.placements).unwrap_or_else(|e| panic!("case {case}: {e}"));
        let floor: f64 = inst
            .tasks
            .iter()
            .filter(|t| t.resource.is_core())
            .map(|t| t.memory)
            .sum();
        let eps = 1e-9 * s.makespan.max(1.0);
        assert!(s.optimal, "case {case}");
        assert!((s.memory_seconds - floor).abs() <= eps, "case {case}");
        assert!(
            s.makespan + eps >= without.makespan.max(floor),
            "case {case}"
        );
        assert!(s.makespan <= without.makespan + floor + eps, "case {case}");
        assert!(s.lower_bound <= s.makespan + eps, "case {case}");
        if inst.edges.is_empty() {
            let want = exhaustive(&inst).max(floor);
            assert!(
                (s.makespan - want).abs() <= 1e-6 * want.max(1.0),
                "case {case}"
            );
        }
        bound += usize::from(s.memory_bound_seconds > 0.0);
    }
    assert!(
        bound > 20,
        "the floor bound only {bound} cases: the test shows little"
    );
}

/// Instances that differ only in their memory times share a [`CoresTrace`]: each solved
/// through it, in any order, gets the schedule solving it alone gives — every field, the
/// placements, the flags — while the MIPs run once per part. Random instances large
/// enough to need MIPs, each at memory times from none to floors above the list schedule
/// (which settle parts without a MIP, before or after a variant that needs one), and a
/// node limit low enough that some MIPs stop at it.
#[test]
fn a_shared_cores_trace_gives_the_schedule_solving_alone_gives() {
    let mut rng = Rng(0x7a11_5eed_c0de_0042);
    let (mut reused, mut settled_first, mut stopped) = (0, 0, 0);
    for case in 0..150 {
        let options = ScheduleOptions {
            node_limit: if case % 3 == 0 { 1 } else { 200 },
            time_limit_seconds: 1e3,
            ..ScheduleOptions::default()
        };
        let n = 7 + rng.below(6) as usize;
        let base = random_instance_with(&mut rng, n, 3);
        let mut scales = [0.0, 0.2, 0.6, 1.5, 4.0];
        // A random order: the trace fills from whichever variant comes first.
        for i in (1..scales.len()).rev() {
            scales.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let trace = CoresTrace::default();
        let mut mips = 0;
        for (k, &scale) in scales.iter().enumerate() {
            let mut inst = base.clone();
            for t in &mut inst.tasks {
                t.memory = scale * t.single.min(t.parallel) * (1 + rng.below(4)) as f64 / 4.0;
            }
            let alone = solve(&inst, &options).unwrap();
            let shared = solve_with(&inst, &options, &trace).unwrap();
            let plain = |s: &Schedule| Schedule {
                solve_seconds: 0.0,
                mips_run: 0,
                ..s.clone()
            };
            assert_eq!(plain(&shared), plain(&alone), "case {case}, scale {scale}");
            check(&inst, &shared.placements).unwrap_or_else(|e| panic!("case {case}: {e}"));
            assert!(shared.mips_run <= alone.mips_run, "case {case}");
            if shared.method == Method::Mip && shared.mips_run < alone.mips_run {
                reused += 1;
            }
            if shared.mips_run > 0 && k > 0 && mips == 0 {
                // The variants before needed no MIP (their floors settled the parts).
                settled_first += 1;
            }
            mips += shared.mips_run;
            stopped += usize::from(shared.hit_node_limit);
        }
    }
    assert!(
        reused > 50,
        "only {reused} MIPs reused: the test shows little"
    );
    assert!(
        settled_first > 3,
        "only {settled_first} MIPs after settled variants"
    );
    assert!(stopped > 3, "only {stopped} schedules at the node limit");
}

/// A [`Skeleton`] bounds an instance as [`makespan_lower_bound`] does, bit for bit and error
/// for error: random structures (every resource, `none` operators, links), each with
/// several random sets of durations and memory times on random cores, some of them
/// invalid; and a cyclic or malformed structure has no skeleton, as its instances have no
/// bound.
#[test]
fn a_skeleton_bounds_as_the_instance_does() {
    let mut rng = Rng(0x5ce1_e70e_b0de_0001);
    let (mut compared, mut errors, mut multipart) = (0, 0, 0);
    for case in 0..300 {
        let n = 1 + rng.below(14) as usize;
        let base = random_instance_with(&mut rng, n, 4);
        let resources: Vec<Resource> = base.tasks.iter().map(|t| t.resource).collect();
        let skeleton = Skeleton::new(&resources, &base.edges).unwrap();
        for _ in 0..5 {
            let mut inst = random_instance_with(&mut rng, n, 4);
            inst.edges.clone_from(&base.edges);
            for (t, &r) in inst.tasks.iter_mut().zip(&resources) {
                t.resource = r;
                t.memory = t.single * rng.below(5) as f64 / 3.0;
                if rng.below(40) == 0 {
                    t.single = f64::NAN;
                }
            }
            if rng.below(30) == 0 {
                inst.tensor_cores = 0;
            }
            let want = makespan_lower_bound(&inst);
            let got =
                skeleton.makespan_lower_bound(&inst.tasks, inst.tensor_cores, inst.vector_cores);
            match (&want, &got) {
                (Ok(w), Ok(g)) => assert_eq!(w.to_bits(), g.to_bits(), "case {case}: {w} vs {g}"),
                (Err(w), Err(g)) => {
                    assert_eq!(format!("{w}"), format!("{g}"), "case {case}");
                    errors += 1;
                }
                _ => panic!("case {case}: {want:?} vs {got:?}"),
            }
            compared += 1;
            let prep = Prep::new(&inst);
            multipart += usize::from(prep.is_ok_and(|p| p.len() > 0 && p.series_parts().len() > 1));
        }
    }
    assert!(
        errors > 10 && errors < compared / 2,
        "{errors} errors of {compared}"
    );
    assert!(
        multipart > 100,
        "only {multipart} instances of several series parts"
    );
    // No skeleton for a cycle or an edge to nowhere, as no bound for their instances.
    let r = [Resource::Tensor, Resource::Vector];
    for edges in [vec![(0, 1), (1, 0)], vec![(0, 2)]] {
        let inst = Instance {
            tensor_cores: 1,
            vector_cores: 1,
            tasks: r.iter().map(|&r| Task::new(r, 1.0, 1.0)).collect(),
            edges: edges.clone(),
        };
        assert_eq!(
            Skeleton::new(&r, &edges).unwrap_err(),
            makespan_lower_bound(&inst).unwrap_err()
        );
    }
}
