//! (Tests as data: these read the fixture files, which the engine itself never does.)
#![allow(
    clippy::disallowed_methods,
    clippy::disallowed_types,
    clippy::disallowed_macros
)]

use super::*;
use crate::phaze;
use archplace_plugin_sdk::testing::Rng;

fn fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/placement")
        .join(name)
}

fn rel(a: f64, b: f64) -> f64 {
    ((a - b) / b).abs()
}

/// Every reference case: time per batch (1e-9), widths, number of stages and the fixed
/// strategy's time match the reference's output.
#[test]
fn matches_the_reference_on_every_fixture() {
    let mut cases = 0;
    for entry in std::fs::read_dir(fixture("")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if !name.ends_with(".json") || name.ends_with(".out.json") {
            continue;
        }
        let input = phaze::parse(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let problem = phaze::problem(&input).unwrap();
        let out = phaze::solve(&problem).unwrap();
        let want: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(path.with_extension("out.json")).unwrap(),
        )
        .unwrap();
        let got = out.final_time_per_batch.unwrap();
        assert!(
            rel(got, want["finalTimePerBatch"].as_f64().unwrap()) < 1e-9,
            "{name}: {got} vs {}",
            want["finalTimePerBatch"]
        );
        assert_eq!(
            out.tensor_parallel_degree,
            want["tensorParallelDegree"].as_u64(),
            "{name}"
        );
        assert_eq!(
            out.data_parallel_degree,
            want["dataParallelDegree"].as_u64(),
            "{name}"
        );
        assert_eq!(
            out.stages.len(),
            want["stages"].as_array().unwrap().len(),
            "{name}"
        );
        let fixed = out.fixed_strategy_time_per_batch.unwrap();
        assert!(
            rel(fixed, want["fixedStrategyTimePerBatch"].as_f64().unwrap()) < 1e-9,
            "{name}: fixed {fixed}"
        );
        // Every layer placed exactly once, in order.
        let ids: Vec<i64> = out.stages.iter().flat_map(|s| s.nodes.clone()).collect();
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        assert_eq!(ids, sorted, "{name}");
        cases += 1;
    }
    assert_eq!(cases, 3);
}

fn random_instance(rng: &mut Rng) -> (Vec<Chain>, Settings) {
    let n = 2 + rng.below(6) as usize;
    let skip = rng.below(2) == 1;
    let mixed = rng.below(4) == 0;
    let mut chains = Vec::new();
    for &t in &[1u64, 2, 4][..1 + rng.below(3) as usize] {
        let layers = (0..n)
            .map(|i| Layer {
                id: i as i64 - 1,
                parameter_bytes: (1 + rng.below(100)) as f64 * 1e6 / t as f64,
                activation_bytes: (1 + rng.below(100)) as f64 * 1e6 / t as f64,
                workspace_bytes: 0.0,
                forward: (0.1 + rng.unit()) / t as f64,
                backward: (0.2 + 2.0 * rng.unit()) / t as f64,
                tensor_parallel: t > 1 && !(mixed && i == 0),
            })
            .collect();
        let mut edges: Vec<Edge> = (1..n)
            .map(|v| Edge {
                from: v - 1,
                to: v,
                bytes: (1 + rng.below(50)) as f64 * 1e5,
            })
            .collect();
        if skip {
            edges.extend((2..n).map(|v| Edge {
                from: 0,
                to: v,
                bytes: (1 + rng.below(50)) as f64 * 1e4,
            }));
        }
        chains.push(Chain {
            width: t,
            layers,
            edges,
        });
    }
    let max_devices = if rng.below(2) == 1 { 16 } else { 64 };
    let max_micro_batches = if rng.below(2) == 1 { 64 } else { 256 };
    let settings = Settings {
        memory_bytes: (50 + rng.below(800)) as f64 * 1e6,
        devices: 1 + rng.below(max_devices),
        bandwidth: if rng.below(2) == 1 {
            1e8
        } else {
            4.0 * (1u64 << 30) as f64
        },
        micro_batches: 1 + rng.below(max_micro_batches),
        recompute: rng.below(2) == 1,
        memory: MemoryRule::Reference {
            optimizer_copies: rng.below(2) as f64,
        },
        resync: if rng.below(2) == 1 {
            Resync::LargestStage
        } else {
            Resync::FirstStage
        },
        // A third of the cases ask for plans a framework runs (every device, an even
        // split of the batch), checked against the oracle under the same constraints.
        bubble_per_stage: 1.0,
        runnable: match rng.below(6) {
            0 => Runnable {
                all_devices: true,
                even_batches: true,
            },
            1 => Runnable {
                all_devices: true,
                even_batches: false,
            },
            _ => Runnable::default(),
        },
    };
    // A third of the cases count memory as Megatron-LM does, half of those with the
    // distributed optimizer.
    let settings = match rng.below(6) {
        0..=3 => settings,
        k => Settings {
            recompute: false,
            memory: MemoryRule::Megatron(MegatronMemory {
                replicated_per_parameter_byte: 3.0,
                optimizer_per_parameter_byte: 6.0,
                distributed: k == 5,
                transient_bytes: rng.below(3) as f64 * 1e6,
                sync_per_parameter_byte: 4.0,
            }),
            ..settings
        },
    };
    (chains, settings)
}

/// The program finds the same time per batch as trying every placement.
#[test]
fn agrees_with_brute_force_on_random_instances() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut feasible, mut infeasible, mut sharded) = (0, 0, 0);
    for case in 0..1500 {
        let (chains, settings) = random_instance(&mut rng);
        let fast = best_plan(&chains, &settings).unwrap();
        let slow = best_plan_exact(&chains, &settings).unwrap();
        if settings.memory.sharded() {
            // The program bounds the memory of degrees [2^k, 2^(k+1)) by that of 2^k: never
            // a plan that does not fit, never faster than trying everything.
            match (&fast, &slow) {
                (Some(f), Some(s)) => {
                    assert!(
                        f.time_per_batch >= s.time_per_batch * (1.0 - 1e-12),
                        "case {case}"
                    );
                    for x in &f.stages {
                        assert!(x.memory_bytes <= settings.memory_bytes, "case {case}");
                    }
                    sharded += 1;
                }
                (None, _) => {}
                (Some(f), None) => panic!("case {case}: program {f:?}, brute force nothing"),
            }
            continue;
        }
        match (fast, slow) {
            (Some(f), Some(s)) => {
                assert!(
                    rel(f.time_per_batch, s.time_per_batch) < 1e-12,
                    "case {case}: {} vs brute force {} ({settings:?})",
                    f.time_per_batch,
                    s.time_per_batch
                );
                let used: u64 = f.stages.iter().map(|x| x.devices).sum::<u64>() * f.data_parallel;
                assert!(used <= settings.devices, "case {case}");
                assert!(
                    f.stages
                        .iter()
                        .all(|x| x.memory_bytes <= settings.memory_bytes),
                    "case {case}"
                );
                feasible += 1;
            }
            (None, None) => infeasible += 1,
            (f, s) => panic!("case {case}: program {f:?} vs brute force {s:?}"),
        }
    }
    assert!(
        feasible > 300 && infeasible > 10 && sharded > 50,
        "{feasible} feasible, {infeasible} infeasible, {sharded} with the distributed optimizer"
    );
}

/// One run for several memory sizes gives, at each size, exactly the plan of a run for
/// that size alone — the same stages, degrees and time — and the plans only get faster as
/// memory grows.
#[test]
fn one_run_for_several_memory_sizes_equals_a_run_per_size() {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let (mut differing, mut compared) = (0, 0);
    for case in 0..1000 {
        let (chains, settings) = random_instance(&mut rng);
        let mut sizes: Vec<f64> = (0..1 + rng.below(4))
            .map(|_| (20 + rng.below(900)) as f64 * 1e6)
            .collect();
        if rng.below(2) == 1 {
            sizes.reverse();
        }
        let together = best_plans(&chains, &settings, &sizes).unwrap();
        assert_eq!(together.len(), sizes.len());
        let alone: Vec<Option<Plan>> = sizes
            .iter()
            .map(|&memory_bytes| {
                let one = Settings {
                    memory_bytes,
                    ..settings.clone()
                };
                best_plan(&chains, &one).unwrap()
            })
            .collect();
        assert_eq!(
            together, alone,
            "case {case}: sizes {sizes:?}, {settings:?}"
        );
        let times: Vec<f64> = together
            .iter()
            .map(|p| p.as_ref().map_or(f64::INFINITY, |p| p.time_per_batch))
            .collect();
        for (a, b) in sizes.iter().zip(&times) {
            for (c, d) in sizes.iter().zip(&times) {
                if a <= c {
                    assert!(d <= b, "case {case}: {c} bytes slower than {a}");
                }
            }
        }
        compared += sizes.len();
        differing += usize::from(times.windows(2).any(|w| w[0] != w[1]));
    }
    assert!(
        compared > 2000 && differing > 100,
        "{compared} compared, {differing} differing"
    );
}

/// A row's ranges fit in fewer stages as they grow, so the ranges that fit somewhere are a
/// prefix of it: what `fitting_row` computes, and the program's early stop relies on.
#[test]
fn the_ranges_that_fit_are_a_prefix_of_each_row() {
    let mut rng = Rng(0x1405_7b7e_f767_814f);
    let (mut cut, mut rows) = (0, 0);
    for _ in 0..500 {
        let (chains, settings) = random_instance(&mut rng);
        for chain in &chains {
            let st = Stages::new(chain, &settings, 1).unwrap();
            let n = chain.layers.len();
            let (mut row, mut fitting) = (Vec::new(), Vec::new());
            for i in 0..n {
                st.row(i, n, &mut row);
                st.fitting_row(i, &mut fitting);
                assert!(row.windows(2).all(|w| w[1].max_s <= w[0].max_s), "{row:?}");
                let k = row.iter().take_while(|r| r.max_s > 0).count();
                assert_eq!(fitting.len(), k);
                assert!(row[k..].iter().all(|r| r.max_s == 0));
                for (a, b) in row.iter().zip(&fitting) {
                    assert_eq!(a.load_plain.to_bits(), b.load_plain.to_bits());
                    assert_eq!(a.max_s, b.max_s);
                }
                cut += usize::from(k < row.len());
                rows += 1;
            }
        }
    }
    assert!(cut > 100 && cut < rows, "{cut} of {rows} rows cut short");
}

/// A stage holds, beside what it keeps, the larger of one block's rematerialised
/// activations and its layers' workspaces (the head's loss), never both: they do not run
/// at once. Four blocks and a head of workspace 30 with a transient of 5: every range that
/// ends at the head adds 30, every other 5.
#[test]
fn a_stage_holds_its_largest_transient_once() {
    let (mut chains, mut settings) = uniform(4, 8, 4, 1e12);
    let chain = &mut chains[0];
    let head = chain.layers.len() - 1;
    chain.layers[head].workspace_bytes = 30.0;
    if let MemoryRule::Megatron(m) = &mut settings.memory {
        m.transient_bytes = 5.0;
    }
    let st = Stages::new(chain, &settings, 1).unwrap();
    let n = chain.layers.len();
    let mut row = Vec::new();
    let mut checked = 0;
    for i in 0..n {
        st.row(i, n, &mut row);
        for (j, r) in (i + 1..=n).zip(&row) {
            let kept: f64 = chain.layers[i..j]
                .iter()
                .map(|l| l.parameter_bytes + l.activation_bytes)
                .sum();
            let transient = if j == n { 30.0 } else { 5.0 };
            assert!(
                (r.constant - (kept + transient)).abs() < 1e-9,
                "[{i}, {j}): {} vs {}",
                r.constant,
                kept + transient
            );
            checked += 1;
        }
    }
    assert_eq!(checked, n * (n + 1) / 2);
}

#[test]
fn branching_graphs_are_refused() {
    let layer = |id| Layer {
        id,
        parameter_bytes: 1.0,
        activation_bytes: 1.0,
        workspace_bytes: 0.0,
        forward: 1.0,
        backward: 1.0,
        tensor_parallel: false,
    };
    let chain = Chain {
        width: 1,
        layers: vec![layer(0), layer(1), layer(2)],
        edges: vec![
            Edge {
                from: 0,
                to: 1,
                bytes: 1.0,
            },
            Edge {
                from: 0,
                to: 2,
                bytes: 1.0,
            },
        ],
    };
    let settings = Settings {
        memory_bytes: 1e9,
        devices: 4,
        bandwidth: 1.0,
        micro_batches: 4,
        recompute: false,
        memory: MemoryRule::Reference {
            optimizer_copies: 0.0,
        },
        resync: Resync::FirstStage,
        bubble_per_stage: 1.0,
        runnable: Default::default(),
    };
    assert_eq!(
        best_plan(&[chain], &settings),
        Err(PlacementError::NotAChain { width: 1, at: 2 })
    );
}

#[test]
fn nothing_fits_gives_no_plan_and_a_fixed_strategy_out_of_memory() {
    let text = std::fs::read_to_string(fixture("small-adam-head.json")).unwrap();
    let mut input = phaze::parse(&text).unwrap();
    input.max_memory_per_device = 1e6;
    let problem = phaze::problem(&input).unwrap();
    let out = phaze::solve(&problem).unwrap();
    assert!(out.stages.is_empty());
    assert_eq!(out.final_time_per_batch, None);
    assert_eq!(out.fixed_strategy_time_per_batch, None);
    assert!(
        out.messages.iter().any(|m| m.contains("no placement fits")),
        "{:?}",
        out.messages
    );
    assert!(
        out.messages
            .iter()
            .any(|m| m.contains("does not fit in memory")),
        "{:?}",
        out.messages
    );
}

#[test]
fn malformed_input_is_located() {
    let e = phaze::parse("{\"maxMemoryPerDevice\": \"lots\"}").unwrap_err();
    assert!(e.location.contains("line 1, column"), "{e}");
    assert!(e.location.contains("maxMemoryPerDevice"), "{e}");
    let text = std::fs::read_to_string(fixture("small-adam-head.json")).unwrap();
    let mut input = phaze::parse(&text).unwrap();
    input.nodes.get_mut("2").unwrap()[3].parameter_size = -1.0;
    let e = phaze::problem(&input).err().unwrap();
    assert_eq!(e.location, "nodes.2[3].parameterSize");
}

/// A uniform chain for the interleaving tests: an embedding, `blocks` equal blocks and a
/// head, every layer tensor-parallel, Megatron memory.
fn uniform(
    blocks: usize,
    micro_batches: u64,
    devices: u64,
    memory_bytes: f64,
) -> (Vec<Chain>, Settings) {
    // The embedding and the head: no time, no parameters, no activations.
    let layer = |id: i64, forward: f64, parameter_bytes: f64| Layer {
        id,
        parameter_bytes,
        activation_bytes: parameter_bytes / 10.0,
        workspace_bytes: 0.0,
        forward,
        backward: 2.0 * forward,
        tensor_parallel: true,
    };
    let mut layers = vec![layer(0, 0.0, 0.0)];
    layers.extend((1..=blocks).map(|i| layer(i as i64, 1.0, 100.0)));
    layers.push(layer(blocks as i64 + 1, 0.0, 0.0));
    let edges = (1..layers.len())
        .map(|v| Edge {
            from: v - 1,
            to: v,
            bytes: 0.0,
        })
        .collect();
    let chain = Chain {
        width: 1,
        layers,
        edges,
    };
    let settings = Settings {
        memory_bytes,
        devices,
        bandwidth: 1.0,
        micro_batches,
        recompute: false,
        memory: MemoryRule::Megatron(MegatronMemory {
            replicated_per_parameter_byte: 1.0,
            optimizer_per_parameter_byte: 0.0,
            distributed: false,
            transient_bytes: 0.0,
            sync_per_parameter_byte: 0.0,
        }),
        resync: Resync::LargestStage,
        bubble_per_stage: 1.0,
        runnable: Default::default(),
    };
    (vec![chain], settings)
}

/// Eight blocks of load 3 (forward 1, backward 2; 100 parameter bytes and 10 activation
/// bytes each) on 4 devices with room for two blocks per device only: plain 1F1B's best is
/// 4 stages of 2 blocks, `6 × (8 + 3) = 66` for 8 micro-batches; two chunks per device cut
/// the bubble to `3/2` loads, `6 × 9.5 = 57`; four chunks would need 16 chunks of 8
/// blocks, or stages of 4 blocks that do not fit.
#[test]
fn interleaving_cuts_the_bubble() {
    let (chains, settings) = uniform(8, 8, 4, 320.0);
    let plain = best_plan(&chains, &settings).unwrap().unwrap();
    assert_eq!(plain.time_per_batch, 66.0);
    assert_eq!(plain.interleaving, 1);
    let two = best_interleaved(&chains, &settings, 2, 8).unwrap().unwrap();
    assert_eq!((two.time_per_batch, two.interleaving), (57.0, 2));
    assert_eq!(two.stages.len(), 4);
    assert!(
        best_interleaved(&chains, &settings, 4, 8)
            .unwrap()
            .is_none()
    );
    // One chunk per device is plain 1F1B with equal stages.
    let one = best_interleaved(&chains, &settings, 1, 8).unwrap().unwrap();
    assert_eq!(one.time_per_batch, 66.0);
    // Chunks must divide the blocks: 3 per device over 8 blocks never do.
    assert!(
        best_interleaved(&chains, &settings, 3, 8)
            .unwrap()
            .is_none()
    );
}

/// The first device keeps `p + (p − 1)/v` micro-batches in flight (Korthikanti et al.
/// 2022, §4.2.3), the others `p − k`; a memory that holds plain 1F1B's first stage but not
/// that refuses the interleaved plan.
#[test]
fn interleaving_keeps_more_activations_on_the_first_device() {
    // 4 stages of 2 blocks: 200 parameter bytes, 20 activation bytes per micro-batch.
    let (chains, settings) = uniform(8, 8, 4, 320.0);
    let two = best_interleaved(&chains, &settings, 2, 8).unwrap().unwrap();
    assert_eq!(two.stages[0].memory_bytes, 200.0 + 20.0 * (4.0 + 3.0 / 2.0));
    assert_eq!(two.stages[1].memory_bytes, 200.0 + 20.0 * 3.0);
    // Room for plain 1F1B's first stage (200 + 4 × 20 = 280) but not the interleaved one.
    let (chains, tight) = uniform(8, 8, 4, 285.0);
    let plain = best_plan(&chains, &tight).unwrap().unwrap();
    assert_eq!(plain.time_per_batch, 66.0);
    assert!(best_interleaved(&chains, &tight, 2, 8).unwrap().is_none());
    // The reference memory rule has no interleaving.
    let mut reference = settings.clone();
    reference.memory = MemoryRule::Reference {
        optimizer_copies: 0.0,
    };
    assert!(
        best_interleaved(&chains, &reference, 2, 8)
            .unwrap()
            .is_none()
    );
}

/// A range's loads simulated directly, node by node, as the reference defines them: the
/// forward pass in order, the backward pass from the last node, each node waiting for its
/// successors inside the range and for the edges that leave it (and, with recomputation, for
/// the range's forward run again).
fn direct_loads(chain: &Chain, settings: &Settings, i: usize, j: usize) -> (f64, f64) {
    let n = chain.layers.len();
    let l = &chain.layers;
    let cost = |e: &Edge| e.bytes / settings.bandwidth;
    let mut fin = vec![0.0f64; n];
    for v in i..j {
        let start = chain
            .edges
            .iter()
            .filter(|e| e.to == v)
            .map(|e| if e.from >= i { fin[e.from] } else { cost(e) })
            .fold(0.0, f64::max);
        fin[v] = start + l[v].forward;
    }
    let forward = fin[j - 1];
    let fw_part: f64 = l[i..j].iter().map(|x| x.forward).sum();
    let backward = |floor: f64| {
        let mut b = vec![0.0f64; n];
        for v in (i..j).rev() {
            let start = chain
                .edges
                .iter()
                .filter(|e| e.from == v)
                .map(|e| if e.to < j { b[e.to] } else { cost(e) })
                .fold(floor, f64::max);
            b[v] = start + l[v].backward;
        }
        b[i]
    };
    (forward + backward(0.0), forward + backward(fw_part))
}

/// Every range's loads, computed a row at a time in closed form, agree with the direct
/// simulation on random chains with skip edges (to the last bits of rounding).
#[test]
fn rows_agree_with_simulating_each_range() {
    let mut rng = Rng(0x5851_f42d_4c95_7f2d);
    let mut checked = 0;
    for _ in 0..300 {
        let (chains, settings) = random_instance(&mut rng);
        let settings = Settings {
            recompute: true,
            ..settings
        };
        for chain in &chains {
            let st = Stages::new(chain, &settings, 1).unwrap();
            let n = chain.layers.len();
            let mut row = Vec::new();
            for i in 0..n {
                st.row(i, n, &mut row);
                assert_eq!(row.len(), n - i);
                for (j, r) in (i + 1..=n).zip(&row) {
                    let (plain, again) = direct_loads(chain, &settings, i, j);
                    assert!(
                        rel(r.load_plain, plain) < 1e-12,
                        "[{i}, {j}) {r:?} vs {plain}"
                    );
                    assert!(
                        rel(r.load_recompute, again) < 1e-12,
                        "[{i}, {j}) {r:?} vs {again}"
                    );
                    let one = st.range(i, j);
                    assert_eq!(one.load_plain.to_bits(), r.load_plain.to_bits());
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 3000, "{checked}");
}

/// Counts the bytes the current thread has allocated at its peak, while asked to.
mod peak {
    #![allow(unsafe_code)]
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    thread_local! {
        static TRACKING: Cell<bool> = const { Cell::new(false) };
        static NOW: Cell<usize> = const { Cell::new(0) };
        static PEAK: Cell<usize> = const { Cell::new(0) };
    }

    pub struct Counting;

    // SAFETY: every call is forwarded to the system allocator unchanged; the counters are
    // const-initialised thread-locals, which never allocate.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            if TRACKING.with(Cell::get) {
                let now = NOW.with(|n| {
                    n.set(n.get() + layout.size());
                    n.get()
                });
                PEAK.with(|p| p.set(p.get().max(now)));
            }
            // SAFETY: the caller's layout, passed on.
            unsafe { System.alloc(layout) }
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            if TRACKING.with(Cell::get) {
                NOW.with(|n| n.set(n.get().saturating_sub(layout.size())));
            }
            // SAFETY: allocated by `alloc` above with this layout.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    #[global_allocator]
    static COUNTING: Counting = Counting;

    /// The peak bytes `f` held on this thread beyond what it started with.
    pub fn of<T>(f: impl FnOnce() -> T) -> (T, usize) {
        NOW.with(|n| n.set(0));
        PEAK.with(|p| p.set(0));
        TRACKING.with(|t| t.set(true));
        let out = f();
        TRACKING.with(|t| t.set(false));
        (out, PEAK.with(Cell::get))
    }
}

fn long_chain(n: usize) -> Chain {
    let layers: Vec<Layer> = (0..n)
        .map(|i| Layer {
            id: i as i64,
            parameter_bytes: 1e6,
            activation_bytes: 1e6,
            workspace_bytes: 0.0,
            forward: 1.0,
            backward: 2.0,
            tensor_parallel: false,
        })
        .collect();
    let edges = (1..n)
        .map(|v| Edge {
            from: v - 1,
            to: v,
            bytes: 1e3,
        })
        .collect();
    Chain {
        width: 1,
        layers,
        edges,
    }
}

/// A long model's placement needs memory linear in its layers, not quadratic (the
/// per-range tables once took 88 bytes × (layers + 1)², 1.4 GB at 4,000 layers, and aborted the
/// daemon at 100,000): four times the layers, about four times the peak memory.
#[test]
fn placement_memory_grows_linearly_with_layers() {
    let settings = Settings {
        memory_bytes: 1e12,
        devices: 4,
        bandwidth: 1e9,
        micro_batches: 8,
        recompute: false,
        memory: MemoryRule::Reference {
            optimizer_copies: 1.0,
        },
        resync: Resync::LargestStage,
        bubble_per_stage: 1.0,
        runnable: Default::default(),
    };
    let mut peaks = Vec::new();
    for n in [1_000, 4_000] {
        let chain = long_chain(n);
        let (plan, bytes) = peak::of(|| best_plan(std::slice::from_ref(&chain), &settings));
        let plan = plan.unwrap().unwrap();
        assert_eq!(plan.stages.len() as u64 * plan.data_parallel, 4);
        assert_eq!(
            plan.stages.iter().map(|s| s.end - s.start).sum::<usize>(),
            n
        );
        peaks.push(bytes);
    }
    eprintln!("peak bytes at 1,000 and 4,000 layers: {peaks:?}");
    assert!(peaks[1] < 8 << 20, "{peaks:?}");
    assert!(peaks[1] < 6 * peaks[0], "{peaks:?}");
}

/// A chain beyond the program's step limit is refused with its numbers, before anything
/// the size of the program is allocated; the longest chain `max_layers` allows is placed.
#[test]
fn a_chain_beyond_the_step_limit_is_refused_with_numbers() {
    let settings = Settings {
        memory_bytes: 1e12,
        devices: 8,
        bandwidth: 1e9,
        micro_batches: 8,
        recompute: false,
        memory: MemoryRule::Reference {
            optimizer_copies: 1.0,
        },
        resync: Resync::FirstStage,
        bubble_per_stage: 1.0,
        runnable: Default::default(),
    };
    let most = max_layers(8, false);
    assert!(ProgramSize::of(most, 8, false).fits());
    assert!(!ProgramSize::of(most + 1, 8, false).fits());
    assert!((10_000..20_000).contains(&most), "{most}");
    let err = best_plan(&[long_chain(100_002)], &settings).unwrap_err();
    assert!(
        matches!(
            err,
            PlacementError::TooLarge {
                layers: 100_002,
                devices: 8,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("100002 layers over 8 devices"),
        "{err}"
    );
    // Wider clusters allow shorter chains: the program is cubic in layers up to the devices.
    assert!(max_layers(1024, false) < 2_000);
    assert!(max_layers(1024, true) < max_layers(1024, false));
}
