use super::*;
use crate::model::preset;
use crate::model::{BuildOptions, LayerKind, ModelConfig, OpGraph, build};
use crate::operators as layer;
use crate::options::ScheduleOptions;
use crate::pipeline::PipelineSchedule;
use crate::placement::{self, Chain, Edge, Layer as ChainLayer, Resync, Settings};
use crate::schedule;
use crate::space::Candidate;
use crate::space::{AreaBudget, SpaceSpec, enumerate};
use crate::training::Optimizer;
use crate::training::{Baseline, Cluster, MemoryModel, Precision, Recomputation, Training};
use archplace_reference_cost::ReferenceModel;
use std::sync::Mutex;

fn tiny_model() -> ModelConfig {
    ModelConfig {
        name: "tiny".into(),
        layers: 4,
        hidden: 256,
        heads: 4,
        kv_heads: 4,
        ffn: 1024,
        vocab: 1000,
        vocab_pad_multiple: 1,
        seq_len: 128,
        max_positions: 128,
        max_tensor_parallel: 2,
        ..preset("gpt2-xl").unwrap()
    }
}

fn tiny() -> (SearchInput, Space) {
    let input = SearchInput {
        objective: Default::default(),
        models: vec![ModelInput {
            weight: 1.0,
            config: tiny_model(),
            baseline: Some(Baseline {
                pipeline: 2,
                data: 4,
                tensor: 2,
            }),
        }],
        training: Training {
            recompute_modules: Default::default(),
            global_batch: 64,
            micro_batch_sizes: vec![1, 2],
            activation_recomputation: vec![Recomputation::None, Recomputation::Full],
            optimizer: Optimizer::Adam,
            precisions: vec![Precision::Bf16Mixed],
            fp8_scaling: Default::default(),
            fp8_param_gather: false,
            distributed_optimizer: vec![false],
            zero_stages: vec![],
            reshard_after_forward: vec![true],
            data_parallel_overlap: false,
            sequence_parallel: vec![false],
            pipeline_interleaving: vec![1],
            pipeline_schedules: Vec::new(),
            expert_parallel: vec![1],
            context_parallel: vec![1],
            context_exchange: Default::default(),
            all_to_all_overlap: false,
            pipeline_parallel_overlap: false,
            // The brute force below counts memory as the reference does.
            memory_model: MemoryModel::Reference,
            bytes_per_element: 2,
            execution: crate::execution::Execution::default(),
        },
        cluster: Cluster {
            devices: 16,
            link_bytes_per_second: 4.0 * (1u64 << 30) as f64,
            hbm_bytes: vec![12 << 20, 64 << 20],
            network: crate::network::Network::flat(4.0 * (1u64 << 30) as f64),
            domains: Vec::new(),
        },
        convergence_window: 5,
        strategy: Strategy::Exhaustive,
        use_all_devices: true,
        // The same deterministic scheduler on both sides; the MIP has its own tests.
        schedule: ScheduleOptions {
            heuristic_only: true,
            ..ScheduleOptions::default()
        },
    };
    let spec = SpaceSpec {
        tensor_cores: vec![1, 2, 4],
        vector_cores: vec![1, 2],
        width: vec![16],
        depth: vec![8, 16],
        vector_width: None,
        buffer_bytes: vec![2 << 20, 8 << 20],
        area_budget: AreaBudget::Um2(1e12),
        min_area_fraction: 0.0,
        ..SpaceSpec::default()
    };
    let space = enumerate(&spec, &ReferenceModel::default()).unwrap();
    assert!(
        (18..=30).contains(&space.candidates.len()),
        "{}",
        space.candidates.len()
    );
    (input, space)
}

/// An exhaustive or converging search whose explored list holds every candidate whole (as
/// the observer hears them), not the summaries the search keeps of all but the best.
fn whole(input: &SearchInput, space: &Space) -> Outcome {
    struct Records(Mutex<Vec<Evaluated>>);
    impl Observer for Records {
        fn evaluated(&self, e: &Evaluated) {
            self.0.lock().unwrap().push(e.clone());
        }
    }
    let records = Records(Mutex::new(Vec::new()));
    let mut outcome = search(input, space, &ReferenceModel::default(), &records, None).unwrap();
    let records = records.0.into_inner().unwrap();
    assert_eq!(records.len(), outcome.explored.len());
    for (summary, e) in outcome.explored.iter().zip(&records) {
        assert_eq!(summary.index, e.index);
        let mut s = e.clone();
        s.summarise();
        let mut t = summary.clone();
        t.summarise();
        assert_eq!(
            s, t,
            "a summary is the record without its stages and layers"
        );
    }
    outcome.explored = records;
    outcome
}

/// Throughput of the best plan of every candidate, computed without the search's code
/// paths: estimation straight from the model, every placement enumerated.
/// (throughput, micro-batch, t, d, recomputation) of a candidate's best plan.
type Found = (f64, u64, u64, u64, Recomputation);

fn brute_force(input: &SearchInput, space: &Space) -> Vec<Option<Found>> {
    let model = ReferenceModel::default();
    let cfg = &input.models[0].config;
    space
        .candidates
        .iter()
        .map(|cand| {
            let mut best: Option<Found> = None;
            for &b in &input.training.micro_batch_sizes {
                let mut chains = Vec::new();
                {
                    for t in cfg.tensor_parallel_widths() {
                        let g = build(
                            cfg,
                            &BuildOptions {
                                recompute_modules: Default::default(),
                                micro_batch: b,
                                tensor_parallel: t,
                                numerics: Default::default(),
                                link_bytes_per_second: 4 << 30,
                                sequence_parallel: false,
                                experts: Default::default(),
                                context_parallel: 1,
                                kernels: Default::default(),
                                fp8_library: Default::default(),
                                cross_entropy: Default::default(),
                            },
                        );
                        let time = |graph: &OpGraph| {
                            let inst = layer::instance(
                                graph,
                                &cand.config,
                                input.training.execution,
                                &model,
                            )
                            .unwrap();
                            schedule::solve(&inst, &input.schedule).unwrap().makespan
                        };
                        let per_kind: Vec<(f64, f64)> = g
                            .distinct()
                            .iter()
                            .map(|l| (time(&l.forward), time(&l.backward)))
                            .collect();
                        let layers: Vec<ChainLayer> = g
                            .layers()
                            .enumerate()
                            .map(|(i, l)| {
                                let k = l.kind.slot();
                                ChainLayer {
                                    id: i as i64,
                                    parameter_bytes: l.parameter_bytes as f64,
                                    activation_bytes: l.stash_bytes as f64,
                                    workspace_bytes: l.workspace_bytes as f64,
                                    forward: per_kind[k].0,
                                    backward: per_kind[k].1,
                                    tensor_parallel: t > 1,
                                }
                            })
                            .collect();
                        let out: Vec<u64> = g.layers().map(|l| l.output_bytes).collect();
                        let edges = (1..layers.len())
                            .map(|v| Edge {
                                from: v - 1,
                                to: v,
                                bytes: out[v - 1] as f64,
                            })
                            .collect();
                        chains.push(Chain {
                            width: t,
                            layers,
                            edges,
                        });
                    }
                }
                for &hbm in &input.cluster.hbm_bytes {
                    for &r in &input.training.activation_recomputation {
                        let settings = Settings {
                            memory_bytes: hbm as f64,
                            devices: input.cluster.devices,
                            bandwidth: input.cluster.link_bytes_per_second,
                            micro_batches: input.training.global_batch / b,
                            recompute: r != Recomputation::None,
                            memory: placement::MemoryRule::Reference {
                                optimizer_copies: 1.0,
                            },
                            resync: Resync::LargestStage,
                            // The plans the search proposes: every device, an even
                            // split of the batch.
                            bubble_per_stage: 1.0,
                            runnable: placement::Runnable {
                                all_devices: input.use_all_devices,
                                even_batches: true,
                            },
                        };
                        if let Some(p) = placement::best_plan_exact(&chains, &settings).unwrap() {
                            let thr = input.training.global_batch as f64 / p.time_per_batch;
                            if best.is_none_or(|x| thr > x.0) {
                                best = Some((thr, b, p.tensor_parallel, p.data_parallel, r));
                            }
                        }
                    }
                }
            }
            best
        })
        .collect()
}

/// The objective: two models (the tiny one and itself at four times the sequence), each
/// candidate's score the mean of weight × samples/s with the weights averaging 1 — equal
/// by default, `[[models]] weight`s as given, and with the tokens objective each model's
/// weight times its sequence length — and the proven bound still above every score.
#[test]
fn the_objective_weighs_the_models() {
    let (mut input, space) = tiny();
    let long = crate::model::ModelConfig {
        name: "tiny-long".into(),
        seq_len: 512,
        max_positions: 512,
        ..tiny_model()
    };
    input.models.push(ModelInput {
        config: long,
        baseline: None,
        weight: 1.0,
    });
    assert_eq!(input.objective_weights(), vec![1.0, 1.0]);
    input.models[1].weight = 3.0;
    assert_eq!(input.objective_weights(), vec![0.5, 1.5]);
    input.objective = crate::space::Objective::TokensPerSecond;
    let w = input.objective_weights();
    let raw = [128.0, 3.0 * 512.0];
    for (got, r) in w.iter().zip(raw) {
        assert!((got - 2.0 * r / (raw[0] + raw[1])).abs() < 1e-12, "{w:?}");
    }
    let outcome = whole(&input, &space);
    let reference = ReferenceModel::default();
    let ctx = Ctx::new(&input, &reference, &());
    let mut scored = 0;
    for e in &outcome.explored {
        let Some(score) = e.mean_throughput_samples_per_second else {
            continue;
        };
        let bound = ctx.bound(&e.config).unwrap();
        assert!(score <= bound * (1.0 + BOUND_SLACK), "{score} {bound}");
        let want = e
            .plans
            .iter()
            .zip(&w)
            .map(|(p, w)| w * p.throughput_samples_per_second)
            .sum::<f64>()
            / 2.0;
        assert!((score - want).abs() <= 1e-9 * want, "{score} {want}");
        scored += 1;
    }
    assert!(scored > 0);
    // Weighted the other way, the same chips score otherwise.
    input.objective = crate::space::Objective::SamplesPerSecond;
    input.models[1].weight = 1.0;
    let plain = whole(&input, &space);
    assert_ne!(
        plain.best.unwrap().mean_throughput_samples_per_second,
        outcome.best.unwrap().mean_throughput_samples_per_second
    );
}

/// Of two candidates that tie, the smaller chip wins wherever it is visited; a faster one
/// wins whatever its size.
#[test]
fn a_tie_goes_to_the_smaller_chip() {
    let (input, space) = tiny();
    let outcome = whole(&input, &space);
    let best = outcome.best.unwrap();
    let t = best.mean_throughput_samples_per_second.unwrap();
    assert!(beats(t * (1.0 + 1e-7), best.area_um2 - 1.0, &best));
    assert!(!beats(t * (1.0 + 1e-7), best.area_um2 + 1.0, &best));
    assert!(
        !beats(t, best.area_um2, &best),
        "equal: the first visited stays"
    );
    assert!(beats(t * 1.01, best.area_um2 * 10.0, &best));
    assert!(!beats(t * 0.99, best.area_um2 / 10.0, &best));
    // In the walk: the tiny space has chips that tie with the best (a larger buffer that
    // changes nothing), visited before it; the best is the smallest of them.
    let mut smallest = outcome
        .explored
        .iter()
        .filter(|e| {
            e.mean_throughput_samples_per_second
                .is_some_and(|x| ((x - t) / t).abs() < TIE_RELATIVE / 2.0)
        })
        .map(|e| e.area_um2)
        .fold(f64::INFINITY, f64::min);
    if smallest.is_infinite() {
        smallest = best.area_um2;
    }
    assert_eq!(best.area_um2, smallest);
    let ties = outcome
        .explored
        .iter()
        .filter(|e| {
            e.mean_throughput_samples_per_second
                .is_some_and(|x| ((x - t) / t).abs() < TIE_RELATIVE)
        })
        .count();
    assert!(ties > 1, "the tiny space has ties to break");
}

#[test]
fn exhaustive_search_agrees_with_brute_force() {
    let (input, space) = tiny();
    let outcome = whole(&input, &space);
    assert_eq!(outcome.explored.len(), space.candidates.len());
    let bf = brute_force(&input, &space);
    let mut want: Option<(usize, f64)> = None;
    for (i, b) in bf.iter().enumerate() {
        if let Some(b) = b
            && want.is_none_or(|w| b.0 > w.1)
        {
            want = Some((i, b.0));
        }
    }
    let (_, wthr) = want.expect("the tiny space has a feasible candidate");
    let best = outcome.best.clone().expect("the search found a candidate");
    let got = best.mean_throughput_samples_per_second.unwrap();
    assert!(
        ((got - wthr) / wthr).abs() < 1e-9,
        "{got} vs brute force {wthr}"
    );
    // Candidates can tie exactly (e.g. a larger buffer that changes nothing), and the two
    // computations agree to 1e-12, not bit for bit: the search's choice must be one of the
    // brute force's best, and its strategy the brute force's strategy for that chip.
    let chosen = bf[best.index].expect("the chosen candidate is feasible");
    assert!(
        ((chosen.0 - wthr) / wthr).abs() < 1e-9,
        "the chosen chip is not among the best"
    );
    // Of the chips that tie with the best, the smallest is chosen.
    let tied: Vec<usize> = (0..bf.len())
        .filter(|&i| bf[i].is_some_and(|b| ((b.0 - wthr) / wthr).abs() < TIE_RELATIVE / 2.0))
        .collect();
    let smallest = tied
        .iter()
        .map(|&i| space.candidates[i].area_um2)
        .fold(f64::INFINITY, f64::min);
    assert_eq!(
        best.area_um2,
        smallest,
        "{} chips tie; the smallest is {smallest} µm², the chosen {} µm²",
        tied.len(),
        best.area_um2
    );
    assert_eq!(best.config, space.candidates[best.index].config);
    let plan = &best.plans[0];
    assert_eq!(
        (
            plan.plan.step.micro_batch,
            plan.plan.step.tensor_parallel,
            plan.plan.step.data_parallel,
            plan.plan.step.recomputation
        ),
        (chosen.1, chosen.2, chosen.3, chosen.4)
    );
    // Every candidate's own score agrees too.
    for (e, b) in outcome.explored.iter().zip(&bf) {
        match (e.mean_throughput_samples_per_second, b) {
            (Some(x), Some(y)) => assert!(
                ((x - y.0) / y.0).abs() < 1e-9,
                "candidate {}: {x} vs {}",
                e.index,
                y.0
            ),
            (None, None) => {}
            (x, y) => panic!("candidate {}: search {x:?} vs brute force {y:?}", e.index),
        }
    }
    // The report is complete.
    let plan = &best.plans[0];
    assert_eq!(plan.layers.len(), 3);
    assert_eq!(plan.stages.iter().map(|s| s.layers).sum::<usize>(), 6);
    assert!(plan.baseline.is_some());
    assert_breakdowns_add_up(&outcome);
    assert!(outcome.stats.estimate_cache_hits > 0);
    let st = &outcome.stats;
    assert_eq!(
        st.schedules_by_bounds
            + st.schedules_by_mip
            + st.schedules_by_mip_reused
            + st.schedules_reused,
        st.schedules_solved
    );
}

#[test]
fn the_result_does_not_depend_on_the_thread_count() {
    let (input, space) = tiny();
    let run = |threads| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| whole(&input, &space))
    };
    let (one, two) = (run(1), run(2));
    assert_eq!(one.best, two.best);
    assert_eq!(one.explored, two.explored);
    // So is the work: the memo of layer schedules is filled in a fixed order.
    let work = |o: &Outcome| {
        let s = &o.stats;
        (
            s.schedules_solved,
            s.schedules_by_bounds,
            s.schedules_by_mip,
            s.schedules_by_mip_reused,
            s.schedules_reused,
            s.schedules_not_proven_optimal,
        )
    };
    assert_eq!(work(&one), work(&two));
    assert!(one.stats.schedules_reused > 0, "{:?}", one.stats);
}

/// The search keeps a summary of each candidate and the best whole (its memory per
/// candidate is a summary's); resumed from summaries of every candidate — the journal's
/// records, summarised as the daemon loads them — it evaluates only the best again and
/// gives the same outcome.
#[test]
fn only_the_best_is_kept_whole_and_a_resume_from_summaries_gives_the_same_outcome() {
    let (input, space) = tiny();
    let full = search(&input, &space, &ReferenceModel::default(), &(), None).unwrap();
    let best = full.best.clone().unwrap();
    assert!(!best.is_summary() && best.plans.iter().all(|p| !p.layers.is_empty()));
    for e in &full.explored {
        if e.index == best.index {
            assert_eq!(*e, best, "the best, whole, in the explored list");
        } else {
            assert!(
                e.plans
                    .iter()
                    .all(|p| p.stages.is_empty() && p.layers.is_empty())
            );
        }
    }
    let done: BTreeMap<usize, Evaluated> = full
        .explored
        .iter()
        .map(|e| {
            let mut e = e.clone();
            e.summarise();
            (e.index, e)
        })
        .collect();
    // Counts the candidates evaluated again.
    struct Count(std::sync::atomic::AtomicUsize);
    impl Observer for Count {
        fn evaluated(&self, _: &Evaluated) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
    let count = Count(Default::default());
    let resumed = Search {
        input: &input,
        space: &space,
        latency: &ReferenceModel::default(),
        observer: &count,
        cancel: None,
    }
    .run(done, &mut Local)
    .unwrap();
    assert_eq!(resumed.best, full.best);
    assert_eq!(resumed.explored, full.explored);
    assert_eq!(count.0.load(Ordering::Relaxed), 0, "not journalled again");
    assert!(
        resumed.stats.schedules_solved > 0,
        "the best was evaluated again"
    );
}

#[test]
fn convergence_stops_early_and_cancel_stops_at_once() {
    let (mut input, space) = tiny();
    input.strategy = Strategy::Converge;
    input.convergence_window = 2;
    let outcome = whole(&input, &space);
    assert!(outcome.stats.converged);
    assert!(outcome.explored.len() < space.candidates.len());
    let cancel = AtomicBool::new(true);
    let outcome = search(
        &input,
        &space,
        &ReferenceModel::default(),
        &(),
        Some(&cancel),
    )
    .unwrap();
    assert!(outcome.stats.cancelled);
    assert!(outcome.explored.is_empty());
}

/// A candidate whose latency call fails because the search is being cancelled (Ctrl-C
/// stops a plugin call in flight) is not evaluated: not reported to the observer (the
/// journal), so a resumed search evaluates it instead of believing it failed (a resumed
/// run once reported one candidate failed that the whole run had not).
#[test]
fn a_candidate_stopped_by_the_cancellation_is_not_reported_failed() {
    struct CancelsInTheOptimizerStep<'a> {
        cancel: &'a AtomicBool,
        inner: ReferenceModel,
    }
    impl LatencyModel for CancelsInTheOptimizerStep<'_> {
        fn info(&self) -> archplace_plugin_sdk::ModelInfo {
            LatencyModel::info(&self.inner)
        }
        /// The layers' operators are priced; the optimizer step's update (the one large
        /// `add`, priced while the plans are) is where the cancellation stops the call.
        fn latency(
            &self,
            core: &archplace_plugin_sdk::CoreConfig,
            ops: &[archplace_plugin_sdk::Op],
        ) -> Result<Vec<archplace_plugin_sdk::OpCost>, EstimateError> {
            let update = ops.iter().any(|o| {
                matches!(
                    o.kind,
                    archplace_plugin_sdk::OpKind::Vector {
                        kind: archplace_plugin_sdk::VectorKind::Add,
                        elements,
                        ..
                    } if elements > 1_000_000
                )
            });
            if update {
                self.cancel.store(true, Ordering::Relaxed);
                return Err(EstimateError::Internal(
                    "stopped: the search was cancelled".into(),
                ));
            }
            LatencyModel::latency(&self.inner, core, ops)
        }
    }
    struct Count(std::sync::atomic::AtomicUsize);
    impl Observer for Count {
        fn evaluated(&self, _: &Evaluated) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
    let (mut input, space) = tiny();
    // Plans priced by the step model, whose optimizer step asks the latency model.
    input.training.memory_model = MemoryModel::Megatron;
    let cancel = AtomicBool::new(false);
    let model = CancelsInTheOptimizerStep {
        cancel: &cancel,
        inner: ReferenceModel::default(),
    };
    let count = Count(Default::default());
    let outcome = search(&input, &space, &model, &count, Some(&cancel)).unwrap();
    assert!(outcome.stats.cancelled);
    assert_eq!(outcome.stats.candidates_failed, 0, "{:?}", outcome.stats);
    assert!(outcome.explored.is_empty());
    assert_eq!(count.0.load(Ordering::Relaxed), 0, "nothing journalled");
}

#[test]
fn failed_buckets_are_not_evidence_of_convergence() {
    let (mut input, space) = tiny();
    input.strategy = Strategy::Converge;
    input.convergence_window = 2;
    // Far too little HBM: every candidate fails, and the search must not stop early.
    input.cluster.hbm_bytes = vec![1 << 10];
    let outcome = whole(&input, &space);
    assert!(outcome.best.is_none());
    assert_eq!(outcome.explored.len(), space.candidates.len());
    assert!(outcome.explored.iter().all(|e| {
        e.failure
            .as_deref()
            .is_some_and(|f| f.contains("does not fit"))
    }));
}

/// Every plan's time parts add up to its time per batch, and its memory parts to its most
/// loaded stage's memory.
fn assert_breakdowns_add_up(outcome: &Outcome) {
    for e in &outcome.explored {
        for p in &e.plans {
            let t = p.time.total();
            assert!(
                ((t - p.time_per_batch_seconds) / p.time_per_batch_seconds).abs() < 1e-9,
                "candidate {}: {t} vs {}",
                e.index,
                p.time_per_batch_seconds
            );
            let m = &p.memory_bytes;
            let most = p.stages.iter().map(|s| s.memory_bytes).fold(0.0, f64::max);
            assert_eq!(m.total, most);
            let parts = m.weights + m.gradients + m.optimizer + m.activations;
            assert!(((parts - m.total) / m.total).abs() < 1e-9, "{m:?}");
            assert!(m.activations > 0.0 && m.optimizer > 0.0, "{m:?}");
            assert!(!p.limiting.is_empty());
        }
    }
}

/// With the Megatron-LM memory model (the default of specs), every recomputation,
/// precision and distributed-optimizer choice is tried, every reported stage fits in its
/// HBM, and the breakdowns add up.
#[test]
fn megatron_memory_search_reports_only_plans_that_fit() {
    let (mut input, space) = tiny();
    input.training.memory_model = MemoryModel::Megatron;
    input.training.activation_recomputation = vec![
        Recomputation::None,
        Recomputation::Selective,
        Recomputation::SelectiveOp,
        Recomputation::Full,
    ];
    input.training.precisions = vec![Precision::Bf16Mixed, Precision::Fp32];
    input.training.distributed_optimizer = vec![false, true];
    input.training.sequence_parallel = vec![false, true];
    let outcome = whole(&input, &space);
    let mut feasible = 0;
    for e in &outcome.explored {
        let Some(hbm) = e.hbm_bytes else { continue };
        feasible += 1;
        for p in &e.plans {
            assert!(p.plan.precision().is_some());
            for s in &p.stages {
                assert!(s.memory_bytes <= hbm as f64, "candidate {}: {s:?}", e.index);
            }
        }
    }
    assert!(feasible > 0);
    assert_breakdowns_add_up(&outcome);
    // 18 bytes per parameter instead of the reference's 6: never more feasible candidates.
    let mut reference = input.clone();
    reference.training.memory_model = MemoryModel::Reference;
    reference.training.activation_recomputation = vec![Recomputation::None, Recomputation::Full];
    reference.training.sequence_parallel = vec![false];
    let r = whole(&reference, &space);
    let count = |o: &Outcome| o.explored.iter().filter(|e| e.hbm_bytes.is_some()).count();
    assert!(count(&outcome) <= count(&r));
}

/// Interleaved 1F1B is a search dimension: with it listed, no candidate's best plan gets
/// slower, every interleaved plan fits, has equal-sized middle stages and its breakdowns
/// add up; at least one candidate of the tiny space prefers it.
#[test]
fn interleaving_is_searched() {
    let (mut input, space) = tiny();
    input.training.memory_model = MemoryModel::Megatron;
    input.training.activation_recomputation = vec![Recomputation::Full];
    let plain = whole(&input, &space);
    input.training.pipeline_interleaving = vec![1, 2];
    let both = whole(&input, &space);
    assert_breakdowns_add_up(&both);
    let mut interleaved = 0;
    for (a, b) in plain.explored.iter().zip(&both.explored) {
        assert_eq!(a.index, b.index);
        for (pa, pb) in a.plans.iter().zip(&b.plans) {
            assert!(
                pb.time_per_batch_seconds <= pa.time_per_batch_seconds * (1.0 + 1e-12),
                "candidate {}: {} > {}",
                a.index,
                pb.time_per_batch_seconds,
                pa.time_per_batch_seconds
            );
            if pb.plan.step.interleaving == 2 {
                interleaved += 1;
                let hbm = b.hbm_bytes.unwrap() as f64;
                assert!(pb.stages.iter().all(|s| s.memory_bytes <= hbm));
                assert!(pb.plan.step.pipeline_parallel >= 2);
            }
        }
    }
    assert!(
        interleaved > 0,
        "no candidate chose the interleaved schedule"
    );
}

/// `archplace estimate` of a plan the search reported for candidate `b` (its chip and
/// HBM), in the search's model, training and cluster.
fn estimate_of(
    input: &SearchInput,
    b: &crate::search::Evaluated,
    plan: &crate::step::StepPlan,
) -> crate::step::StepReport {
    let step_input = crate::step::StepInput {
        model: input.models[0].config.clone(),
        plan: plan.clone(),
        accelerator: b.config,
        hbm_bytes: b.hbm_bytes.unwrap(),
        devices: input.cluster.devices,
        global_batch: input.training.global_batch,
        network: input.cluster.network,
        peak_flops_per_second: None,
        schedule: input.schedule,
        execution: input.training.execution,
    };
    crate::step::estimate_step(&step_input, &ReferenceModel::default()).unwrap()
}

/// A plan the search reported for candidate `b` fits its HBM, and `archplace estimate` of
/// it gives the search's step, time and memory breakdowns bit for bit; the estimate.
fn assert_priced_as_estimate(
    input: &SearchInput,
    b: &crate::search::Evaluated,
    pb: &crate::search::ModelPlan,
) -> crate::step::StepReport {
    let plan = pb.plan.estimable().expect("a [plan]");
    let hbm = b.hbm_bytes.expect("an HBM size");
    assert!(pb.memory_bytes.total <= hbm as f64, "candidate {}", b.index);
    let e = estimate_of(input, b, plan);
    assert_eq!(
        e.step_seconds, pb.time_per_batch_seconds,
        "candidate {}",
        b.index
    );
    assert_eq!(e.time, pb.time, "candidate {}", b.index);
    assert_eq!(e.memory_bytes, pb.memory_bytes, "candidate {}", b.index);
    e
}

/// The tiny model as a Mixture-of-Experts one (8 experts of 1,024, top-2), changed by
/// `edit`, searched with Megatron's memory, full recomputation, sequence parallelism and
/// the distributed optimizer.
fn tiny_moe(edit: impl FnOnce(&mut ModelConfig)) -> (SearchInput, Space) {
    let (mut input, space) = tiny();
    let mut cfg = tiny_model();
    cfg.moe = Some(crate::model::Moe {
        experts: 8,
        experts_per_token: 2,
        expert_ffn: 1024,
        shared_experts: 0,
        routing_imbalance: 1.0,
        capacity_factor: None,
    });
    edit(&mut cfg);
    input.models[0].config = cfg;
    input.models[0].baseline = None;
    input.training.memory_model = MemoryModel::Megatron;
    input.training.activation_recomputation = vec![Recomputation::Full];
    input.training.sequence_parallel = vec![true];
    input.training.distributed_optimizer = vec![true];
    (input, space)
}

/// Expert parallelism is a search dimension: with widths listed, no candidate's best plan
/// of a tiny Mixture-of-Experts model gets slower, every plan splitting experts folds them
/// into its stages' `t × d` ranks, is priced by the step model exactly as `estimate` prices
/// it, and fits; at least one candidate prefers split experts.
#[test]
fn expert_parallelism_is_searched() {
    let (mut input, space) = tiny_moe(|_| {});
    let whole_experts = whole(&input, &space);
    input.training.expert_parallel = vec![1, 2, 4, 8];
    let split = whole(&input, &space);
    assert_breakdowns_add_up(&split);
    let mut chose = 0;
    for (a, b) in whole_experts.explored.iter().zip(&split.explored) {
        assert_eq!(a.index, b.index);
        if b.hbm_bytes.is_none() {
            assert!(a.hbm_bytes.is_none(), "candidate {}", a.index);
        }
        for (pa, pb) in a.plans.iter().zip(&b.plans) {
            assert!(
                pb.time_per_batch_seconds <= pa.time_per_batch_seconds * (1.0 + 1e-12),
                "candidate {}: {} > {}",
                a.index,
                pb.time_per_batch_seconds,
                pa.time_per_batch_seconds
            );
            let plan = pb.plan.estimable().unwrap();
            assert_eq!(plan.expert_parallel, pb.plan.step.expert_parallel);
            assert_eq!(plan.expert_tensor_parallel, pb.plan.step.tensor_parallel);
            let ranks = pb.plan.step.tensor_parallel * pb.plan.step.data_parallel;
            assert_eq!(
                ranks % (pb.plan.step.expert_parallel * pb.plan.step.expert_tensor_parallel),
                0
            );
            if pb.plan.step.expert_parallel > 1 {
                chose += 1;
                assert!(pb.time.all_to_all_seconds > 0.0);
                assert_priced_as_estimate(&input, b, pb);
            }
        }
    }
    assert!(chose > 0, "no candidate split its experts");
}

/// Multi-token prediction in the search: the modules' layer shares the head's place in the
/// placement's chain (it stays in the last stage, as the step model puts it), each plan lists
/// it among its layers, and every plan is priced as `estimate` prices it.
#[test]
fn multi_token_prediction_is_searched_with_the_head() {
    let (mut input, space) = tiny_moe(|cfg| {
        cfg.mtp_depth = 1;
        cfg.tied_embeddings = false;
    });
    input.training.expert_parallel = vec![1, 2];
    let r = whole(&input, &space);
    assert_breakdowns_add_up(&r);
    let mut plans = 0;
    for b in &r.explored {
        for pb in &b.plans {
            plans += 1;
            let mtp = pb.layers.iter().find(|l| l.layer == LayerKind::Mtp);
            assert_eq!(mtp.map(|l| l.count), Some(1), "candidate {}", b.index);
            let last = pb.stages.last().unwrap();
            assert_eq!(last.last_layer, "head");
            assert_priced_as_estimate(&input, b, pb);
        }
    }
    assert!(plans > 0);
}

/// ZeRO stages are a search dimension: with stages 2 and 3 listed beside 0 and 1 no
/// candidate's best plan gets slower, and a search of ZeRO-3 alone (FSDP) reports only
/// ZeRO-3 plans, each priced by the step model exactly as `estimate` prices it, fitting its
/// memory.
#[test]
fn zero_stages_are_searched() {
    let (mut input, space) = tiny();
    input.models[0].baseline = None;
    input.training.memory_model = MemoryModel::Megatron;
    input.training.zero_stages = vec![0, 1];
    let low = whole(&input, &space);
    input.training.zero_stages = vec![0, 1, 2, 3];
    let all = whole(&input, &space);
    assert_breakdowns_add_up(&all);
    for (a, b) in low.explored.iter().zip(&all.explored) {
        for (pa, pb) in a.plans.iter().zip(&b.plans) {
            assert!(
                pb.time_per_batch_seconds <= pa.time_per_batch_seconds * (1.0 + 1e-12),
                "candidate {}",
                b.index
            );
            assert_eq!(
                pb.plan.estimable().unwrap().zero_stage(),
                pb.plan.step.zero_stage()
            );
        }
    }
    input.training.zero_stages = vec![3];
    let fsdp = whole(&input, &space);
    assert_breakdowns_add_up(&fsdp);
    let mut plans = 0;
    for b in &fsdp.explored {
        for pb in &b.plans {
            plans += 1;
            assert_eq!(pb.plan.step.zero_stage(), 3);
            assert!(pb.plan.step.distributed_optimizer);
            assert_priced_as_estimate(&input, b, pb);
            if pb.plan.step.data_parallel > 1 {
                assert!(pb.time.fsdp_communication_seconds > 0.0);
            }
        }
    }
    assert!(plans > 0);
}

/// ZeRO-3's resharding is a search dimension: with `[true, false]` listed no candidate's
/// best plan is slower than with resharding alone, every plan is priced exactly as
/// `estimate` prices it and fits, and its `[plan]` says which it chose.
#[test]
fn resharding_is_searched() {
    let (mut input, space) = tiny();
    input.models[0].baseline = None;
    input.training.memory_model = MemoryModel::Megatron;
    input.training.zero_stages = vec![3];
    let reshard = whole(&input, &space);
    input.training.reshard_after_forward = vec![true, false];
    let both = whole(&input, &space);
    assert_breakdowns_add_up(&both);
    let mut kept = 0;
    for (a, b) in reshard.explored.iter().zip(&both.explored) {
        let before = a.mean_throughput_samples_per_second.unwrap_or(0.0);
        let after = b.mean_throughput_samples_per_second.unwrap_or(0.0);
        assert!(after >= before * (1.0 - 1e-12), "candidate {}", a.index);
        for pb in &b.plans {
            let plan = pb.plan.estimable().unwrap();
            kept += u64::from(!plan.sharding.reshard_after_forward);
            assert_priced_as_estimate(&input, b, pb);
        }
    }
    assert!(kept > 0, "no plan kept its gathered weights");
}

/// Context parallelism is a search dimension: a tiny long-sequence model (FlashAttention,
/// 1,024 tokens) whose activations crowd a 128 MiB HBM, searched with CP 1, 2 and 4: no
/// candidate's best plan gets slower than with CP 1 alone, no candidate fails that
/// fitted, every plan's ranks are `t × CP × p × d` of the cluster, every plan is priced by
/// the step model exactly as `estimate` prices it (its key-value exchanges included) and
/// fits; and candidates prefer the sequence split.
#[test]
fn context_parallelism_is_searched() {
    let (mut input, space) = tiny();
    let cfg = &mut input.models[0].config;
    cfg.seq_len = 1024;
    cfg.max_positions = 1024;
    cfg.attention = crate::model::AttentionKernel::Flash;
    input.models[0].baseline = None;
    input.training.memory_model = MemoryModel::Megatron;
    input.training.activation_recomputation = vec![Recomputation::None];
    input.training.micro_batch_sizes = vec![4];
    input.cluster.hbm_bytes = vec![128 << 20];
    let whole_sequences = whole(&input, &space);
    input.training.context_parallel = vec![1, 2, 4];
    let split = whole(&input, &space);
    assert_breakdowns_add_up(&split);
    let mut chose = 0;
    for (a, b) in whole_sequences.explored.iter().zip(&split.explored) {
        assert_eq!(a.index, b.index);
        if a.hbm_bytes.is_some() {
            assert!(b.hbm_bytes.is_some(), "candidate {}", a.index);
        }
        let before = a.mean_throughput_samples_per_second.unwrap_or(0.0);
        let after = b.mean_throughput_samples_per_second.unwrap_or(0.0);
        assert!(after >= before * (1.0 - 1e-12), "candidate {}", a.index);
        for pb in &b.plans {
            let plan = pb.plan.estimable().unwrap();
            assert_eq!(plan.context_parallel, pb.plan.step.context_parallel);
            assert_eq!(
                pb.plan.step.tensor_parallel
                    * pb.plan.step.context_parallel
                    * pb.plan.step.data_parallel
                    * pb.plan.step.pipeline_parallel,
                input.cluster.devices
            );
            assert_eq!(pb.plan.devices_used(), input.cluster.devices);
            let e = assert_priced_as_estimate(&input, b, pb);
            if pb.plan.step.context_parallel > 1 {
                chose += 1;
                assert!(pb.time.context_parallel_communication_seconds >= 0.0);
                assert!(e.operator_seconds.context_parallel > 0.0);
            }
        }
    }
    assert!(chose > 0, "no candidate split its sequences");

    // Ulysses' all-to-all: every plan that splits sequences gives each of its t × CP ranks
    // whole heads, and is priced as `estimate` prices it.
    input.training.context_exchange.method = crate::training::ContextMethod::AllToAll;
    let ulysses = whole(&input, &space);
    let mut split = 0;
    for e in &ulysses.explored {
        for pb in &e.plans {
            let step = &pb.plan.step;
            let heads = input.models[0].config.heads;
            assert!(heads.is_multiple_of(step.tensor_parallel * step.context_parallel));
            let r = assert_priced_as_estimate(&input, e, pb);
            if step.context_parallel > 1 {
                split += 1;
                assert!(r.operator_seconds.context_parallel > 0.0);
            }
        }
    }
    assert!(
        split > 0,
        "no candidate split its sequences with the all-to-all"
    );
}

/// The scale-up domain's size is a search dimension: a tiny Mixture-of-Experts model on 16
/// devices with a slow tier between domains, searched with domains of 2 and 16 devices.
/// Each candidate's record at each size is exactly the record of a search of that size
/// alone (the same throughput, HBM and plans); its best is the faster size, ties to the
/// smaller; and the larger domain wins somewhere (the expert and tensor-parallel groups
/// stay on the fast tier).
#[test]
fn scale_up_domains_are_searched() {
    let (mut input, space) = tiny_moe(|_| {});
    input.training.expert_parallel = vec![1, 2, 4, 8];
    input.training.distributed_optimizer = vec![true];
    let tier = |gbps: f64| crate::network::Tier {
        bytes_per_second: gbps * 1e9,
        latency_seconds: 5e-6,
    };
    let domain = |node_size: u64| crate::network::Network {
        node_size,
        host_bytes_per_second: None,
        overlap_efficiency: 1.0,
        intra_node: tier(100.0),
        inter_node: tier(0.5),
    };
    input.cluster.link_bytes_per_second = 0.5e9;
    let alone: Vec<Outcome> = [2, 16]
        .iter()
        .map(|&n| {
            let mut one = input.clone();
            one.cluster.network = domain(n);
            whole(&one, &space)
        })
        .collect();
    input.cluster.network = domain(2);
    input.cluster.domains = vec![domain(2), domain(16)];
    let both = whole(&input, &space);
    assert_breakdowns_add_up(&both);
    let mut larger_wins = 0;
    for (k, e) in both.explored.iter().enumerate() {
        assert_eq!(e.domains.len(), 2, "candidate {}", e.index);
        for (d, outcome) in alone.iter().enumerate() {
            let a = &outcome.explored[k];
            let at = e.at_domain(d);
            assert_eq!(at.node_size, Some([2, 16][d]));
            assert_eq!(
                at.mean_throughput_samples_per_second, a.mean_throughput_samples_per_second,
                "candidate {} at domain {d}",
                e.index
            );
            assert_eq!(at.hbm_bytes, a.hbm_bytes);
            assert_eq!(at.plans, a.plans, "candidate {} at domain {d}", e.index);
        }
        let [small, large] = [0, 1].map(|d| e.domains[d].mean_throughput_samples_per_second);
        let best = small
            .into_iter()
            .chain(large)
            .fold(None, |a: Option<f64>, t| Some(a.map_or(t, |a| a.max(t))));
        assert_eq!(e.mean_throughput_samples_per_second, best);
        if let (Some(s), Some(l)) = (small, large)
            && l > s * (1.0 + TIE_RELATIVE)
        {
            larger_wins += 1;
            assert_eq!(e.node_size, Some(16));
            assert_eq!(e.plans, e.domain_plans(1));
        } else if small.is_some() && small >= large {
            assert_eq!(e.node_size, Some(2), "candidate {}", e.index);
        }
    }
    assert!(larger_wins > 0, "the larger domain never won");
    // A summary keeps the plans at its own size once (its `plans`); the best is whole.
    for e in both.explored.iter().filter(|e| e.is_summary()) {
        if let Some(k) = e
            .domains
            .iter()
            .position(|d| Some(d.node_size) == e.node_size)
            && e.mean_throughput_samples_per_second.is_some()
        {
            assert!(e.domains[k].plans.is_empty(), "candidate {}", e.index);
            assert!(!e.domain_plans(k).is_empty());
        }
    }
    let best = both.best.as_ref().unwrap();
    assert!(
        best.domains
            .iter()
            .all(|d| d.mean_throughput_samples_per_second.is_none() || !d.plans.is_empty())
    );
}

/// A supplier that evaluates with evaluators of its own (one per "worker", taking
/// candidates in turn, summarised as a pool's workers send them): the walk's outcome is the
/// one of a search that evaluates everything itself — converging or exhaustive — the
/// supplied candidates are journalled like computed ones, and their work is added.
#[test]
fn supplied_evaluations_give_the_same_outcome_as_local_ones() {
    struct Workers<'a> {
        evaluators: Vec<Evaluator<'a>>,
        asked: Vec<usize>,
    }
    impl Supplier for Workers<'_> {
        fn supply(
            &mut self,
            index: usize,
            candidate: &Candidate,
        ) -> Result<Option<Evaluated>, SearchError> {
            self.asked.push(index);
            let n = self.evaluators.len();
            let mut e = self.evaluators[index % n].evaluate(index, candidate)?;
            e.summarise();
            Ok(Some(e))
        }
        fn work(&self) -> Stats {
            let mut w = Stats::default();
            for e in &self.evaluators {
                w.add_work(&e.work());
            }
            w
        }
    }
    struct Count(std::sync::atomic::AtomicUsize);
    impl Observer for Count {
        fn evaluated(&self, _: &Evaluated) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
    let model = ReferenceModel::default();
    for strategy in [Strategy::Exhaustive, Strategy::Converge] {
        let (mut input, space) = tiny();
        input.strategy = strategy;
        input.convergence_window = 2;
        let local = search(&input, &space, &model, &(), None).unwrap();
        let mut workers = Workers {
            evaluators: vec![
                Evaluator::new(&input, &model, &()),
                Evaluator::new(&input, &model, &()),
            ],
            asked: Vec::new(),
        };
        let count = Count(Default::default());
        let pooled = Search {
            input: &input,
            space: &space,
            latency: &model,
            observer: &count,
            cancel: None,
        }
        .run(BTreeMap::new(), &mut workers)
        .unwrap();
        assert_eq!(pooled.best, local.best);
        assert_eq!(pooled.explored, local.explored);
        assert_eq!(pooled.stats.converged, local.stats.converged);
        assert_eq!(
            workers.asked,
            (0..local.explored.len()).collect::<Vec<_>>(),
            "asked in the walk's order, each once"
        );
        assert_eq!(count.0.load(Ordering::Relaxed), local.explored.len());
        assert!(
            pooled.stats.placements_solved >= local.stats.placements_solved,
            "the workers' work is counted"
        );
    }
}

/// A supplier that answers another candidate than the one asked fails the search: the
/// walk never takes an evaluation it did not ask for.
#[test]
fn a_supplier_answering_another_candidate_fails_the_search() {
    struct Wrong<'a>(Evaluator<'a>);
    impl Supplier for Wrong<'_> {
        fn supply(
            &mut self,
            index: usize,
            candidate: &Candidate,
        ) -> Result<Option<Evaluated>, SearchError> {
            let mut e = self.0.evaluate(index, candidate)?;
            e.index += 1;
            Ok(Some(e))
        }
    }
    let model = ReferenceModel::default();
    let (input, space) = tiny();
    let mut wrong = Wrong(Evaluator::new(&input, &model, &()));
    let err = Search {
        input: &input,
        space: &space,
        latency: &model,
        observer: &(),
        cancel: None,
    }
    .run(BTreeMap::new(), &mut wrong)
    .unwrap_err();
    assert!(err.to_string().contains("for candidate 0"), "{err}");
}

/// `work_since` undoes `add_work`: what a worker reports per item adds up again.
#[test]
fn work_since_is_the_inverse_of_add_work() {
    let before = Stats {
        estimates_computed: 3,
        schedules_solved: 5,
        schedules_reused: 2,
        placements_solved: 7,
        scheduling_seconds: 0.5,
        ..Stats::default()
    };
    let item = Stats {
        estimates_computed: 11,
        estimate_cache_hits: 4,
        schedules_solved: 13,
        schedules_by_bounds: 6,
        schedules_reused: 1,
        schedules_by_mip: 2,
        schedules_by_mip_reused: 3,
        schedules_not_proven_optimal: 1,
        mip_time_limit_hits: 1,
        placements_solved: 9,
        estimation_seconds: 0.25,
        scheduling_seconds: 1.5,
        placement_seconds: 0.75,
        ..Stats::default()
    };
    let mut now = before.clone();
    now.add_work(&item);
    assert_eq!(now.work_since(&before), item);
}

/// A small deterministic generator (SplitMix64) for the random problems below.
struct Draw(u64);

impl Draw {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn pick<T: Clone>(&mut self, from: &[T]) -> T {
        from[(self.next() % from.len() as u64) as usize].clone()
    }

    fn coin(&mut self) -> bool {
        self.next().is_multiple_of(2)
    }
}

/// A random small problem: a model (dense or Mixture-of-Experts, with or without its own
/// dense blocks and multi-token prediction), a training plan space (micro-batches,
/// recomputation, precisions, the distributed optimizer, sequence and context
/// parallelism, interleaving, expert parallelism), a cluster and a space of chips, priced
/// with either memory model.
fn random_problem(seed: u64) -> (SearchInput, Space) {
    let mut d = Draw(seed);
    let hidden = d.pick(&[64, 128, 256]);
    let heads = d.pick(&[2, 4]);
    let moe = d.coin() && d.coin();
    let layers = d.pick(&[2, 3, 4, 6]);
    let mut config = ModelConfig {
        name: format!("random-{seed}"),
        layers,
        hidden,
        heads,
        kv_heads: heads,
        ffn: hidden * d.pick(&[2, 4]),
        vocab: d.pick(&[300, 2000]),
        seq_len: d.pick(&[32, 64, 128]),
        max_tensor_parallel: d.pick(&[1, 2]),
        ..tiny_model()
    };
    config.max_positions = config.seq_len;
    if moe {
        config.moe = Some(crate::model::Moe {
            experts: 4,
            experts_per_token: 2,
            expert_ffn: hidden,
            shared_experts: d.pick(&[0, 1]),
            routing_imbalance: d.pick(&[1.0, 1.2]),
            capacity_factor: None,
        });
        config.dense_layers = d.pick(&[0, 1]);
    }
    if d.coin() && d.coin() {
        config.mtp_depth = 1;
    }
    let megatron = d.coin();
    let subset = |d: &mut Draw, all: &[u64]| -> Vec<u64> {
        let v: Vec<u64> = all.iter().copied().filter(|_| d.coin()).collect();
        if v.is_empty() { vec![all[0]] } else { v }
    };
    let mut recomputation = vec![Recomputation::None, Recomputation::Full];
    if megatron && d.coin() {
        recomputation.push(d.pick(&[Recomputation::Selective, Recomputation::SelectiveOp]));
    }
    let devices = d.pick(&[4, 8, 16]);
    let hbm: u64 = d.pick(&[4u64 << 20, 16 << 20, 64 << 20]);
    let interleavings = if megatron && d.coin() {
        vec![1, 2]
    } else {
        vec![1]
    };
    let mut input = SearchInput {
        objective: Default::default(),
        models: vec![ModelInput {
            weight: 1.0,
            config: config.clone(),
            baseline: None,
        }],
        training: Training {
            recompute_modules: Default::default(),
            global_batch: d.pick(&[32, 64]),
            micro_batch_sizes: subset(&mut d, &[1, 2, 4]),
            activation_recomputation: if d.coin() {
                recomputation
            } else {
                vec![d.pick(&recomputation)]
            },
            optimizer: Optimizer::Adam,
            // One precision: the reference latency model has no FP8 datapath.
            precisions: vec![Precision::Bf16Mixed],
            fp8_scaling: Default::default(),
            fp8_param_gather: megatron && d.coin(),
            distributed_optimizer: if megatron && d.coin() {
                vec![false, true]
            } else {
                vec![false]
            },
            zero_stages: if megatron && d.coin() {
                subset(&mut d, &[0, 1, 2, 3])
            } else {
                vec![]
            },
            reshard_after_forward: if d.coin() {
                vec![true, false]
            } else {
                vec![true]
            },
            data_parallel_overlap: megatron && d.coin(),
            sequence_parallel: if megatron && d.coin() {
                vec![false, true]
            } else {
                vec![false]
            },
            pipeline_interleaving: interleavings.clone(),
            // Every schedule now and then, the interleaved one with its chunks.
            pipeline_schedules: if megatron && d.coin() {
                let mut listed: Vec<PipelineSchedule> = PipelineSchedule::ALL
                    .into_iter()
                    .filter(|s| {
                        (*s == PipelineSchedule::Interleaved) == interleavings.contains(&2)
                            && (*s == PipelineSchedule::Interleaved || d.coin())
                    })
                    .collect();
                if !listed.iter().any(|s| *s != PipelineSchedule::Interleaved) {
                    listed.push(PipelineSchedule::ZeroBubble);
                    listed.sort();
                }
                listed
            } else {
                Vec::new()
            },
            expert_parallel: if moe { vec![1, 2] } else { vec![1] },
            context_parallel: if megatron && d.coin() {
                vec![1, 2]
            } else {
                vec![1]
            },
            context_exchange: Default::default(),
            all_to_all_overlap: moe && d.coin(),
            pipeline_parallel_overlap: megatron && d.coin(),
            memory_model: if megatron {
                MemoryModel::Megatron
            } else {
                MemoryModel::Reference
            },
            bytes_per_element: 2,
            execution: crate::execution::Execution::default(),
        },
        cluster: Cluster {
            devices,
            link_bytes_per_second: d.pick(&[1.0, 4.0]) * (1u64 << 30) as f64,
            hbm_bytes: vec![hbm, 4 * hbm],
            network: crate::network::Network::flat(4.0 * (1u64 << 30) as f64),
            // Sometimes two scale-up domains: nodes of 2 and 4 devices on a fast tier
            // with latencies, the rest on a slower one.
            domains: if d.coin() {
                [2, 4]
                    .map(|node_size| crate::network::Network {
                        node_size,
                        host_bytes_per_second: None,
                        overlap_efficiency: 1.0,
                        intra_node: crate::network::Tier {
                            bytes_per_second: 16.0 * (1u64 << 30) as f64,
                            latency_seconds: 1e-6,
                        },
                        inter_node: crate::network::Tier {
                            bytes_per_second: 2.0 * (1u64 << 30) as f64,
                            latency_seconds: 1e-5,
                        },
                    })
                    .to_vec()
            } else {
                Vec::new()
            },
        },
        convergence_window: 2,
        strategy: Strategy::Exhaustive,
        use_all_devices: d.coin(),
        // The list scheduler: MIPs take seconds here, and the bound holds for any
        // schedule of an instance (`schedule::makespan_lower_bound`, tested against the
        // optimum in the scheduler's tests).
        schedule: ScheduleOptions {
            heuristic_only: true,
            ..ScheduleOptions::default()
        },
    };
    let axis = |d: &mut Draw, all: &[u64]| -> Vec<u32> {
        let mut v: Vec<u32> = all
            .iter()
            .map(|&x| x as u32)
            .filter(|_| !d.next().is_multiple_of(4))
            .collect();
        if v.is_empty() {
            v.push(all[0] as u32);
        }
        v
    };
    let spec = SpaceSpec {
        tensor_cores: axis(&mut d, &[1, 2, 4, 8]),
        vector_cores: axis(&mut d, &[1, 2, 4]),
        width: vec![16],
        depth: axis(&mut d, &[8, 16, 32]),
        vector_width: None,
        buffer_bytes: axis(&mut d, &[2, 8, 32])
            .into_iter()
            .map(|m| u64::from(m) << 20)
            .collect(),
        area_budget: AreaBudget::Um2(1e12),
        min_area_fraction: 0.0,
        ..SpaceSpec::default()
    };
    let space = enumerate(&spec, &ReferenceModel::default()).unwrap();
    assert!(!space.candidates.is_empty(), "seed {seed}: an empty space");
    // Drawn last, so that the draws above stay those of every earlier version: a third of
    // the problems run one kernel at a time with each way of overlapping collectives.
    if d.next().is_multiple_of(3) {
        input.training.execution = crate::execution::Execution {
            operators: crate::execution::OperatorExecution::Sequential,
            tensor_parallel_overlap: crate::execution::TensorParallelOverlap::ALL
                [(d.next() % 3) as usize],
            kernels: Default::default(),
            fp8_library: Default::default(),
            cross_entropy: Default::default(),
            overlap_efficiency: Default::default(),
        };
    }
    (input, space)
}

/// Random problems each of the two tests below draws.
const SEEDS: u64 = 120;

/// The bound a proven search orders and prunes by is at least the evaluated score of
/// every candidate, on random problems (both memory models, dense and MoE models, every
/// plan dimension the search has) — thousands of candidates.
#[test]
fn bounds_are_at_least_every_evaluated_score() {
    let model = ReferenceModel::default();
    let (mut candidates, mut feasible, mut tightest) = (0, 0, 0.0f64);
    let mut ratios = Vec::new();
    for seed in 0..SEEDS {
        let (input, space) = random_problem(seed);
        let outcome = whole(&input, &space);
        let ctx = Ctx::new(&input, &model, &());
        for e in &outcome.explored {
            candidates += 1;
            let bound = match ctx.bound(&e.config) {
                Ok(b) => b,
                Err(JobError::Infeasible(why)) => {
                    assert!(
                        e.failure.is_some(),
                        "seed {seed}: bounding failed ({why}) where evaluation did not"
                    );
                    continue;
                }
                Err(JobError::Model(err)) => panic!("seed {seed}: {err}"),
            };
            if let Some(t) = e.mean_throughput_samples_per_second {
                feasible += 1;
                assert!(
                    t <= bound * (1.0 + BOUND_SLACK),
                    "seed {seed}, candidate {} ({:?}): evaluated {t} samples/s above its bound {bound}",
                    e.index,
                    e.config
                );
                tightest = tightest.max(t / bound);
                ratios.push(t / bound);
            }
        }
    }
    assert!(candidates >= 1000, "{candidates} candidates");
    assert!(
        feasible >= candidates / 4,
        "{feasible} of {candidates} feasible"
    );
    ratios.sort_by(f64::total_cmp);
    let median = ratios[ratios.len() / 2];
    // Not vacuous: some bounds come close to the evaluation, and the plan shapes' floors
    // tighten the typical one (the devices bound alone: a median of 0.58 here).
    assert!(
        tightest > 0.9,
        "the tightest bound is {tightest} of its score"
    );
    assert!(
        median > 0.62,
        "the median score is {median} of its bound ({feasible} of {candidates} feasible)"
    );
}

/// The bounds hold where memory decides the plan: random problems of the step model whose
/// only HBM size is what their best plan needs, so that most plan shapes cannot fit and
/// the bound's memory floors (`step::plan_floor`'s splits) rule them out — tighter bounds
/// than with every shape, and still at least every evaluated score.
#[test]
fn bounds_hold_where_memory_decides_the_plan() {
    let model = ReferenceModel::default();
    let (mut feasible, mut problems) = (0, 0);
    let mut ratios = Vec::new();
    for seed in 0..SEEDS {
        let (mut input, space) = random_problem(seed);
        if input.training.memory_model != MemoryModel::Megatron {
            continue;
        }
        let outcome = whole(&input, &space);
        let Some(needed) = outcome.best.as_ref().and_then(|b| {
            b.plans
                .iter()
                .map(|p| p.memory_bytes.total)
                .reduce(f64::max)
        }) else {
            continue;
        };
        input.cluster.hbm_bytes = vec![needed.ceil() as u64];
        problems += 1;
        let outcome = whole(&input, &space);
        let ctx = Ctx::new(&input, &model, &());
        for e in &outcome.explored {
            let Ok(bound) = ctx.bound(&e.config) else {
                assert!(
                    e.failure.is_some(),
                    "seed {seed}: bounding failed, evaluation did not"
                );
                continue;
            };
            if let Some(t) = e.mean_throughput_samples_per_second {
                feasible += 1;
                assert!(
                    t <= bound * (1.0 + BOUND_SLACK),
                    "seed {seed}, candidate {}: evaluated {t} samples/s above its bound {bound}",
                    e.index
                );
                ratios.push(t / bound);
            }
        }
    }
    assert!(
        problems >= 20 && feasible >= 500,
        "{problems} problems, {feasible} scores"
    );
    ratios.sort_by(f64::total_cmp);
    let median = ratios[ratios.len() / 2];
    assert!(median > 0.6, "the median score is {median} of its bound");
}

/// The bound pass bounds each layer through its graph's skeleton (the structure worked
/// out once per search, `schedule::Skeleton`) and the operators' durations alone; that
/// gives, bit for bit, the bound through each layer's whole instance — under every
/// operator execution, where the restrictions add the dependencies the skeleton must hold.
/// A record holds its plan once and writes from it the flat keys the result files have
/// always had: every record of random searches (both memory models, every schedule)
/// reads back equal, its flat keys say the plan's axes and its stages hold the model's
/// blocks, and only the step model's plans carry `plan` and `precision`.
#[test]
fn every_record_writes_its_plan_as_the_flat_keys_and_reads_back_equal() {
    let mut checked = [0, 0];
    for seed in 0..16 {
        let (input, space) = random_problem(seed);
        let megatron = input.training.memory_model == MemoryModel::Megatron;
        let outcome = whole(&input, &space);
        for p in outcome.explored.iter().flat_map(|e| &e.plans) {
            let v = serde_json::to_value(p).expect("a record serialises");
            let back: ModelPlan = serde_json::from_value(v.clone()).expect("and reads back");
            assert_eq!(&back, p, "seed {seed}");
            let step = &p.plan.step;
            let (t, d) = (step.tensor_parallel, step.data_parallel);
            let (pp, cp) = (step.pipeline_parallel, step.context_parallel);
            assert_eq!(v["tensor_parallel"], t);
            assert_eq!(v["data_parallel"], d);
            assert_eq!(v["pipeline_stages"], pp);
            assert_eq!(v["context_parallel"], cp);
            assert_eq!(v["micro_batch"], step.micro_batch);
            assert_eq!(v["pipeline_interleaving"], step.interleaving);
            assert_eq!(v["zero_stage"], step.zero_stage());
            assert_eq!(v["devices_used"], t * cp * pp * d);
            let layers: Vec<u64> =
                serde_json::from_value(v["stage_layers"].clone()).expect("a list of blocks");
            assert_eq!(layers.len() as u64, pp, "seed {seed}");
            assert_eq!(layers.iter().sum::<u64>(), input.models[0].config.layers);
            assert_eq!(v["plan"].is_null(), !megatron);
            assert_eq!(v["precision"].is_null(), !megatron);
            checked[usize::from(megatron)] += 1;
        }
    }
    assert!(
        checked.iter().all(|&n| n > 0),
        "both memory models: {checked:?}"
    );
}

#[test]
fn the_bound_through_skeletons_is_the_bound_through_instances() {
    use crate::execution::{Execution, OperatorExecution, TensorParallelOverlap};
    let model = ReferenceModel::default();
    // Every operator execution with each way of overlapping collectives.
    let executions: Vec<Execution> = OperatorExecution::ALL
        .into_iter()
        .flat_map(|operators| {
            TensorParallelOverlap::ALL.map(|tensor_parallel_overlap| Execution {
                operators,
                tensor_parallel_overlap,
                kernels: Default::default(),
                fp8_library: Default::default(),
                cross_entropy: Default::default(),
                overlap_efficiency: Default::default(),
            })
        })
        .collect();
    let mut compared = 0;
    for seed in 0..SEEDS / 4 {
        let (mut input, space) = random_problem(seed);
        input.training.execution = executions[seed as usize % executions.len()];
        let through_skeletons = Ctx::new(&input, &model, &());
        let through_instances = Ctx::new(&input, &model, &());
        // No skeletons: every layer is bounded through its instance.
        assert!(through_instances.skeletons.set(Default::default()).is_ok());
        for c in space.candidates.iter().take(40) {
            match (
                through_skeletons.bound(&c.config),
                through_instances.bound(&c.config),
            ) {
                (Ok(a), Ok(b)) => {
                    assert_eq!(a.to_bits(), b.to_bits(), "seed {seed}: {a} vs {b}");
                    compared += 1;
                }
                (Err(a), Err(b)) => assert_eq!(format!("{a:?}"), format!("{b:?}")),
                (a, b) => panic!("seed {seed}: {a:?} vs {b:?}"),
            }
        }
        assert!(
            through_skeletons
                .skeletons
                .get()
                .is_some_and(|s| s.values().all(Option::is_some)),
            "seed {seed}: a layer graph without a skeleton"
        );
    }
    assert!(compared > 500, "{compared} bounds compared");
}

/// A proven search gives exactly what an exhaustive one gives — the same chip, plans and
/// throughput — on random problems, evaluating fewer candidates; what it reports of its
/// pruning adds up.
/// A proven walk on one machine bounds every candidate quickly and only those near the
/// top exactly; one whose supplier needs the whole order up front (a pool) bounds every
/// one exactly first. Both walk the same candidates in the same order to the same
/// outcome, on random problems, and the lazy one bounds exactly fewer.
#[test]
fn the_lazy_proven_walk_is_the_walk_over_every_exact_bound() {
    struct Ahead;
    impl Supplier for Ahead {
        fn supply(&mut self, _: usize, _: &Candidate) -> Result<Option<Evaluated>, SearchError> {
            Ok(None)
        }
        fn needs_order(&self) -> bool {
            true
        }
    }
    let model = ReferenceModel::default();
    let (mut exactly, mut total) = (0, 0);
    for seed in 0..SEEDS / 2 {
        let (mut input, space) = random_problem(seed);
        input.strategy = Strategy::Proven;
        let run = |supplier: &mut dyn Supplier| {
            Search {
                input: &input,
                space: &space,
                latency: &model,
                observer: &(),
                cancel: None,
            }
            .run(BTreeMap::new(), supplier)
            .unwrap()
        };
        let lazy = run(&mut Local);
        let ahead = run(&mut Ahead);
        assert_eq!(lazy.explored, ahead.explored, "seed {seed}");
        assert_eq!(lazy.best, ahead.best, "seed {seed}");
        let (l, a) = (&lazy.stats, &ahead.stats);
        assert_eq!(
            (
                l.candidates_pruned,
                l.candidates_failed_bound,
                l.candidates_bounded
            ),
            (
                a.candidates_pruned,
                a.candidates_failed_bound,
                a.candidates_bounded
            ),
            "seed {seed}"
        );
        assert_eq!(a.candidates_bounded_exactly, space.candidates.len());
        assert!(l.candidates_bounded_exactly <= space.candidates.len());
        exactly += l.candidates_bounded_exactly;
        total += space.candidates.len();
    }
    assert!(exactly < total, "{exactly} of {total} bounded exactly");
}

#[test]
fn proven_search_finds_the_exhaustive_best() {
    let model = ReferenceModel::default();
    let (mut evaluated, mut total) = (0, 0);
    for seed in 0..SEEDS {
        let (mut input, space) = random_problem(seed);
        let exhaustive = search(&input, &space, &model, &(), None).unwrap();
        input.strategy = Strategy::Proven;
        let proven = search(&input, &space, &model, &(), None).unwrap();
        assert_eq!(proven.best, exhaustive.best, "seed {seed}");
        // Each candidate the proven walk evaluated is evaluated as the exhaustive walk
        // evaluated it, though the two visit in different orders: an evaluation depends on
        // the candidate alone, not on what the memos hold from the ones before.
        let summary = |e: &Evaluated| {
            let mut e = e.clone();
            e.summarise();
            e
        };
        for e in &proven.explored {
            let same = exhaustive.explored.iter().find(|x| x.index == e.index);
            assert_eq!(
                same.map(summary),
                Some(summary(e)),
                "seed {seed}: candidate {} ({:?}) evaluated differently in another order",
                e.index,
                e.config
            );
        }
        let s = &proven.stats;
        assert!(s.proven && s.strategy == Strategy::Proven);
        assert_eq!(s.candidates_bounded, space.candidates.len());
        assert_eq!(
            s.candidates_evaluated + s.candidates_pruned + s.candidates_failed_bound,
            space.candidates.len(),
            "seed {seed}"
        );
        if let (Some(remaining), Some(best)) =
            (s.largest_remaining_bound_samples_per_second, &proven.best)
        {
            let t = best.mean_throughput_samples_per_second.unwrap();
            assert!(
                remaining * (1.0 + BOUND_SLACK) <= t / (1.0 - TIE_RELATIVE),
                "seed {seed}"
            );
        }
        evaluated += s.candidates_evaluated;
        total += space.candidates.len();
    }
    assert!(
        evaluated < total,
        "the bounds pruned nothing: {evaluated} of {total} evaluated"
    );
}

/// Ties between equal chips go to the first in the space's order, whichever order the
/// walk visits them in: a proven search over a space of copies of one chip chooses the
/// first copy, as an exhaustive one does.
#[test]
fn proven_ties_go_to_the_first_in_the_space() {
    let model = ReferenceModel::default();
    let (mut input, mut space) = tiny();
    let first = space.candidates[0];
    space.candidates = vec![first; 4];
    let exhaustive = search(&input, &space, &model, &(), None).unwrap();
    input.strategy = Strategy::Proven;
    let proven = search(&input, &space, &model, &(), None).unwrap();
    assert_eq!(exhaustive.best.as_ref().map(|b| b.index), Some(0));
    assert_eq!(proven.best.as_ref().map(|b| b.index), Some(0));
    // Each copy's bound is above the first's score (a bound is not the score): each is
    // evaluated, ties it, and loses the tie.
    assert_eq!(proven.stats.candidates_evaluated, 4);
}

/// The reference latency model with the chip's buffer felt only in the memory times: core
/// times as with a 32 MiB buffer whatever the buffer, memory times that grow as it shrinks
/// (none at 32 MiB, twice the duration at 2 MiB — above what a real model reports, an
/// operator's duration, so that the floor binds on a model this small). Two chips that
/// differ only in their buffer then have layers with the same core times whose memory
/// floors differ.
struct MemoryOnlyBuffer(ReferenceModel);

impl LatencyModel for MemoryOnlyBuffer {
    fn info(&self) -> archplace_plugin_sdk::ModelInfo {
        self.0.info()
    }

    fn latency(
        &self,
        core: &archplace_plugin_sdk::CoreConfig,
        ops: &[archplace_plugin_sdk::Op],
    ) -> Result<Vec<archplace_plugin_sdk::OpCost>, EstimateError> {
        let large = archplace_plugin_sdk::CoreConfig {
            buffer_bytes: 32 << 20,
            ..*core
        };
        let mib = core.buffer_bytes as f64 / (1u64 << 20) as f64;
        let share = 2.0 * ((32.0 - mib) / 30.0).clamp(0.0, 1.0);
        Ok(self
            .0
            .latency(&large, ops)?
            .into_iter()
            .map(|c| c.with_memory_seconds(c.seconds * share))
            .collect())
    }
}

/// A chip's evaluation does not depend on the chips evaluated before it: a chip whose
/// layers have the same core times as the one before but longer memory times (a smaller
/// buffer) scores as it scores alone — the memo of layer schedules keys the memory times
/// too (it once reused the larger buffer's schedules, and a proven search, which visits
/// such chips together, chose a small-buffer chip at the large one's throughput).
#[test]
fn a_chip_scores_the_same_after_a_chip_with_other_memory_times() {
    let model = MemoryOnlyBuffer(ReferenceModel::default());
    let (mut input, _) = tiny();
    // Operators side by side on the cores (the reference's dataflow), so that a layer's
    // memory times, which the cores share, can outlast its schedule.
    input.training.execution = crate::execution::Execution::DATAFLOW;
    let chip = |buffer_bytes: u64| archplace_plugin_sdk::AcceleratorConfig {
        tensor_cores: 4,
        vector_cores: 2,
        width: 16,
        depth: 16,
        vector_width: 16,
        buffer_bytes,
    };
    let candidate = |config: archplace_plugin_sdk::AcceleratorConfig, area_um2: f64| Candidate {
        config,
        area_um2,
        bucket: 0,
    };
    let (large, small) = (chip(32 << 20), chip(2 << 20));
    let both = Space {
        candidates: vec![candidate(large, 2e6), candidate(small, 1e6)],
        ..tiny().1
    };
    let alone = Space {
        candidates: vec![candidate(small, 1e6)],
        ..tiny().1
    };
    let score = |space: &Space, k: usize| {
        let o = search(&input, space, &model, &(), None).unwrap();
        o.explored[k].mean_throughput_samples_per_second.unwrap()
    };
    let (after, by_itself, of_large) = (score(&both, 1), score(&alone, 0), score(&both, 0));
    assert!(
        by_itself < of_large * (1.0 - 1e-3),
        "not a test: the memory times do not slow the small buffer ({by_itself} against {of_large})"
    );
    assert_eq!(
        after, by_itself,
        "scored {after} after the large buffer, {by_itself} alone"
    );
}
