use super::*;
use crate::execution::CrossEntropy;
use crate::model::preset;
use crate::network::Tier;
use crate::space::REFERENCE_CONFIG;
use crate::training::{Fp8Scaling, Optimizer, Precision};
use archplace_reference_cost::ReferenceModel;

fn plan(t: u64, p: u64, d: u64) -> StepPlan {
    StepPlan {
        recompute_modules: Default::default(),
        recompute_layers: None,
        activation_offload_layers: 0,
        tensor_parallel: t,
        pipeline_parallel: p,
        data_parallel: d,
        micro_batch: 1,
        interleaving: 1,
        pipeline_schedule: Default::default(),
        recomputation: Recomputation::Full,
        sequence_parallel: false,
        precision: Precision::Bf16Mixed,
        fp8_scaling: Default::default(),
        fp8_param_gather: false,
        optimizer: Optimizer::Adam,
        distributed_optimizer: false,
        sharding: Sharding::default(),
        expert_parallel: 1,
        expert_tensor_parallel: 1,
        all_to_all_overlap: false,
        pipeline_parallel_overlap: false,
        context_parallel: 1,
        context_exchange: Default::default(),
        stage_layers: None,
    }
}

fn gpt3(plan: StepPlan, hbm_gib: u64) -> StepInput {
    StepInput {
        model: preset("gpt3-175b").unwrap(),
        devices: plan.tensor_parallel * plan.pipeline_parallel * plan.data_parallel,
        plan,
        accelerator: REFERENCE_CONFIG,
        hbm_bytes: hbm_gib << 30,
        global_batch: 1536,
        network: Network {
            node_size: 8,
            host_bytes_per_second: None,
            overlap_efficiency: 1.0,
            intra_node: Tier {
                bytes_per_second: 300e9,
                latency_seconds: 5e-6,
            },
            inter_node: Tier {
                bytes_per_second: 25e9,
                latency_seconds: 10e-6,
            },
        },
        peak_flops_per_second: Some(312e12),
        schedule: ScheduleOptions {
            heuristic_only: true,
            ..ScheduleOptions::default()
        },
        execution: crate::execution::Execution::default(),
    }
}

/// The reference model, typed: an FP8 or MXFP8 GEMM at half its 16-bit time, a cast at
/// the price of the element-wise scaling it does (the reference template has no 8-bit
/// datapath, so it refuses both itself).
struct Typed(ReferenceModel);

impl LatencyModel for Typed {
    fn info(&self) -> archplace_plugin_sdk::ModelInfo {
        self.0.info()
    }
    fn latency(&self, core: &CoreConfig, ops: &[Op]) -> Result<Vec<OpCost>, EstimateError> {
        let plain: Vec<Op> = ops
            .iter()
            .map(|o| {
                let kind = match o.kind {
                    // A cast with an amax pass reads its input once more: priced here as
                    // twice the elements.
                    OpKind::Cast(c) => OpKind::Vector {
                        kind: VectorKind::Scale,
                        elements: c.elements * if c.amax_pass { 2 } else { 1 },
                        row: 1,
                    },
                    k => k,
                };
                Op {
                    kind,
                    element: archplace_plugin_sdk::ElementType::Bf16,
                    ..o.clone()
                }
            })
            .collect();
        let costs = self.0.latency(core, &plain)?;
        Ok(ops
            .iter()
            .zip(costs)
            .map(|(o, c)| {
                let f = if o.element.is_quantised() && matches!(o.kind, OpKind::Gemm(_)) {
                    0.5
                } else {
                    1.0
                };
                OpCost {
                    seconds: f * c.seconds,
                    joules: f * c.joules,
                    memory_seconds: c.memory_seconds.map(|m| f * m),
                }
            })
            .collect())
    }
    fn tensor_element_types(&self) -> Vec<archplace_plugin_sdk::ElementType> {
        archplace_plugin_sdk::ElementType::ALL.to_vec()
    }
}

fn rel(a: f64, b: f64) -> f64 {
    ((a - b) / b).abs()
}

/// Weights + gradients + optimizer state of every stage are the documented bytes per
/// parameter times the stage's parameters, exactly, for every precision, optimizer and
/// distributed-optimizer choice.
#[test]
fn state_memory_is_bytes_per_parameter_times_parameters() {
    for precision in Precision::ALL {
        for optimizer in [Optimizer::Adam, Optimizer::SgdMomentum, Optimizer::Sgd] {
            for distributed in [false, true] {
                let mut pl = plan(8, 16, 8);
                pl.precision = precision;
                pl.optimizer = optimizer;
                pl.distributed_optimizer = distributed;
                let input = gpt3(pl, 1 << 20);
                let r = estimate_step(&input, &Typed(ReferenceModel::default())).unwrap();
                let per = StateBytes::megatron(precision, optimizer, distributed, 8);
                for s in &r.stages {
                    let m = s.memory_bytes;
                    let p = s.parameters as f64;
                    // FP8 recipes: plus both layouts of the GEMM weights' quantised copies.
                    let copies = s.quantised_parameters as f64 * precision.weight_copy_bytes();
                    assert_eq!(
                        m.weights + m.gradients + m.optimizer,
                        per.total() * p + copies
                    );
                    assert_eq!(m.total, per.total() * p + copies + m.activations);
                }
            }
        }
    }
}

/// The parameters of all stages are the model's, the tied embedding counted on both ends
/// (Megatron keeps a copy on the last stage).
#[test]
fn stages_hold_the_model() {
    let input = gpt3(plan(8, 16, 8), 80);
    let r = estimate_step(&input, &ReferenceModel::default()).unwrap();
    let g = build(
        &input.model,
        &BuildOptions {
            recompute_modules: Default::default(),
            micro_batch: 1,
            tensor_parallel: 8,
            numerics: Default::default(),
            link_bytes_per_second: 1,
            sequence_parallel: false,
            experts: Default::default(),
            context_parallel: 1,
            kernels: Default::default(),
            fp8_library: Default::default(),
            cross_entropy: Default::default(),
        },
    );
    let total: u64 = r.stages.iter().map(|s| s.parameters).sum();
    assert_eq!(
        total,
        g.parameters_per_rank() + g.head.shared_parameters,
        "per tensor-parallel rank"
    );
    assert_eq!(r.stages.len(), 16);
    assert!(r.stages.iter().all(|s| s.blocks == 6));
}

/// The example search's old best plan for GPT-3 (t = 1, 32 stages, d = 32, 64 GiB) needs
/// 18 bytes per parameter of 3 blocks and the embedding: it does not fit, and the error
/// says by how much.
#[test]
fn a_plan_that_does_not_fit_is_refused_with_the_numbers() {
    let mut pl = plan(1, 32, 32);
    pl.recomputation = Recomputation::Full;
    let mut input = gpt3(pl, 64);
    input.global_batch = 4096;
    let err = estimate_step(&input, &ReferenceModel::default()).unwrap_err();
    let StepError::OutOfMemory {
        memory, hbm_bytes, ..
    } = &err
    else {
        panic!("{err:?}");
    };
    assert_eq!(*hbm_bytes, 64 << 30);
    assert!(
        memory.weights + memory.gradients + memory.optimizer > 90e9,
        "{memory:?}"
    );
    let text = err.to_string();
    assert!(text.contains("HBM is 64.0 GiB"), "{text}");
    assert!(text.starts_with("needs "), "{text}");
}

#[test]
fn impossible_plans_say_why() {
    let r = |pl: StepPlan, devices: u64, batch: u64| {
        let mut input = gpt3(pl, 80);
        input.devices = devices;
        input.global_batch = batch;
        estimate_step(&input, &ReferenceModel::default()).unwrap_err()
    };
    assert!(matches!(
        r(plan(16, 1, 1), 16, 16),
        StepError::TensorParallel { t: 16, .. }
    ));
    assert!(matches!(
        r(plan(8, 128, 1), 1024, 128),
        StepError::Pipeline { layers: 96, .. }
    ));
    assert!(matches!(
        r(plan(8, 7, 1), 56, 56),
        StepError::Pipeline { chunks: 7, .. }
    ));
    assert!(matches!(
        r(plan(8, 8, 8), 1024, 1536),
        StepError::Devices {
            needed: 512,
            devices: 1024,
            ..
        }
    ));
    assert!(matches!(
        r(plan(8, 8, 8), 512, 100),
        StepError::Batch { .. }
    ));
    let mut pl = plan(8, 8, 8);
    pl.interleaving = 2;
    assert!(matches!(
        r(pl, 512, 8 * 12),
        StepError::Interleaving {
            micro_batches: 12,
            pipeline: 8
        }
    ));
}

/// The parts add up to the step, and the bubble is (p − 1)/v of the slowest stage's time
/// per micro-batch: interleaving divides it.
#[test]
fn breakdown_adds_up_and_interleaving_shrinks_the_bubble() {
    let one = estimate_step(&gpt3(plan(8, 8, 8), 80), &ReferenceModel::default()).unwrap();
    assert!(rel(one.time.total(), one.step_seconds) < 1e-12);
    let slowest = one
        .stages
        .iter()
        .map(|s| s.seconds_per_micro_batch)
        .fold(0.0, f64::max);
    assert!(rel(one.time.pipeline_bubble_seconds, 7.0 * slowest) < 1e-12);
    let m = one.micro_batches_per_replica as f64;
    assert!(
        rel(
            one.time.forward_seconds
                + one.time.backward_seconds
                + one.time.recomputation_seconds
                + one.time.tensor_parallel_communication_seconds
                + one.time.pipeline_point_to_point_seconds,
            m * slowest
        ) < 1e-12
    );
    let mut pl = plan(8, 8, 8);
    pl.interleaving = 2;
    let two = estimate_step(&gpt3(pl, 80), &ReferenceModel::default()).unwrap();
    assert!(two.time.pipeline_bubble_seconds < 0.6 * one.time.pipeline_bubble_seconds);
    assert!(
        rel(
            two.time.pipeline_point_to_point_seconds,
            2.0 * one.time.pipeline_point_to_point_seconds
        ) < 1e-12
    );
    // The first stage holds (1 + (p − 1)/(p·v)) × p micro-batches.
    assert!(
        rel(
            two.stages[0].micro_batches_in_flight,
            8.0 * (1.0 + 7.0 / 16.0)
        ) < 1e-12
    );
}

/// Selective recomputation keeps more than full and less than none, and recomputes less
/// than full; the hardware FLOPs follow.
#[test]
fn recomputation_trades_memory_for_time() {
    let run = |r| {
        let mut pl = plan(8, 8, 8);
        pl.recomputation = r;
        estimate_step(&gpt3(pl, 1 << 20), &ReferenceModel::default()).unwrap()
    };
    let (none, sel, full) = (
        run(Recomputation::None),
        run(Recomputation::Selective),
        run(Recomputation::Full),
    );
    assert!(full.memory_bytes.activations < sel.memory_bytes.activations);
    assert!(sel.memory_bytes.activations < none.memory_bytes.activations);
    assert_eq!(none.time.recomputation_seconds, 0.0);
    assert!(sel.time.recomputation_seconds > 0.0);
    assert!(sel.time.recomputation_seconds < full.time.recomputation_seconds);
    assert_eq!(none.hardware_flops_per_step, none.model_flops_per_step);
    assert!(full.hardware_flops_per_step > sel.hardware_flops_per_step);
    assert_eq!(none.model_flops_per_step, full.model_flops_per_step);
    // Full recomputation runs about 4/3 of the matrix FLOPs (Narayanan et al. 2021).
    let ratio = full.hardware_flops_per_step / full.model_flops_per_step;
    assert!((ratio - 4.0 / 3.0).abs() < 0.01, "{ratio}");
}

/// Megatron-LM's selective recomputation checkpoints the core attention, fused or not:
/// with FlashAttention it runs the kernel's forward again in backward (its FLOPs, once
/// more per block and sequence) and keeps all but the kernel's log-sum-exp.
#[test]
fn selective_recomputation_reruns_the_fused_attention_kernel() {
    let run = |r| {
        let mut input = llama3_long(1);
        input.plan.recomputation = r;
        (
            graph(&input),
            estimate_step(&input, &ReferenceModel::default()).unwrap(),
        )
    };
    let (g, none) = run(Recomputation::None);
    let (_, sel) = run(Recomputation::Selective);
    let kernel = g.block.forward.node("flash_attention").unwrap();
    assert!(kernel.is_attention_core());
    assert!(sel.time.recomputation_seconds > 0.0);
    assert_eq!(none.time.recomputation_seconds, 0.0);
    // t = 2 ranks per sequence, 8 sequences, every block.
    let again = kernel.matmul_flops() * 2.0 * 8.0 * g.blocks as f64;
    assert!(
        rel(
            sel.hardware_flops_per_step - none.hardware_flops_per_step,
            again
        ) < 1e-12
    );
    let (s, heads) = (32768u64, 32u64 / 2);
    assert_eq!(
        g.block.kept_bytes(Recomputation::Selective),
        g.block.stash_bytes - 4 * s * heads
    );
}

/// PyTorch's per-operator selective checkpointing on Llama 3 8B (GQA, SwiGLU, no biases,
/// FlashAttention), as torchtitan's policy keeps a block: its input, `wq`'s and `wv`'s
/// outputs (the first and third `mm`; `wk` the second), the attention kernel's output and
/// log-sum-exp, `w1`'s (fifth) and `w2`'s (seventh) outputs — `wo` and `w3` rerun — and,
/// with sequence parallelism, the two reduce-scatters' outputs. It reruns the `mm`s it
/// does not keep (`wk`, `wo`, `w3`: `2·s·(h·kv + q·h + h·f)` FLOPs per sequence and
/// block) and every element-wise kernel, keeps less than no recomputation and more than
/// full, and costs between them. Under FP8 the GEMMs run `_scaled_mm`: none is kept.
#[test]
fn per_operator_checkpointing_keeps_every_other_matmul() {
    let (h, q, kv, f, heads) = (4096u64, 4096u64, 1024u64, 14_336u64, 32u64);
    for (t, sp) in [(1, false), (2, false), (2, true)] {
        let at = format!("t {t}, sequence parallel {sp}");
        let run = |r: Recomputation, precision: Precision| {
            let mut input = llama3_long(1);
            input.model.seq_len = 4096;
            input.plan.tensor_parallel = t;
            input.plan.sequence_parallel = sp;
            input.plan.recomputation = r;
            input.plan.precision = precision;
            input.devices = 4 * t;
            let g = graph(&input);
            let step = estimate_step(&input, &Typed(ReferenceModel::default())).unwrap();
            (g, step)
        };
        let s = 4096u64;
        let (g, op) = run(Recomputation::SelectiveOp, Precision::Bf16Mixed);
        let rep = |e: u64| if sp { e / t } else { e };
        let reduce_scatters = if sp { 2 * 2 * s * h / t } else { 0 };
        let attention = 2 * s * q / t + 4 * s * heads / t;
        let want = 2 * rep(s * h)
            + 2 * s * (q + kv) / t
            + attention
            + 2 * s * f / t
            + 2 * s * h
            + reduce_scatters;
        assert_eq!(g.block.op_checkpoint_bytes, want, "{at}");
        assert_eq!(g.block.kept_bytes(Recomputation::SelectiveOp), want, "{at}");
        // The embedding and the head keep what they save.
        assert_eq!(
            g.head.kept_bytes(Recomputation::SelectiveOp),
            g.head.stash_bytes
        );
        let (_, none) = run(Recomputation::None, Precision::Bf16Mixed);
        let (_, full) = run(Recomputation::Full, Precision::Bf16Mixed);
        let acts = |r: &StepReport| r.stages[0].memory_bytes.activations;
        assert!(acts(&full) < acts(&op) && acts(&op) < acts(&none), "{at}");
        let again = |r: &StepReport| r.time.recomputation_seconds;
        assert!(again(&none) == 0.0 && 0.0 < again(&op), "{at}");
        assert!(again(&op) < again(&full), "{at}");
        assert!(none.step_seconds < op.step_seconds && op.step_seconds < full.step_seconds);
        // FLOPs run again: wk, wo and w3 of every block of every sequence.
        let blocks = g.blocks as f64;
        let rerun = (2 * s * (h * kv + q * h + h * f)) as f64 * blocks * 8.0;
        assert!(
            rel(
                op.hardware_flops_per_step - none.hardware_flops_per_step,
                rerun
            ) < 1e-12,
            "{at}"
        );
        // FP8: the block's GEMMs are `_scaled_mm`, none kept, all rerun.
        let (g8, op8) = run(Recomputation::SelectiveOp, Precision::Fp8Hybrid);
        assert_eq!(
            g8.block.op_checkpoint_bytes,
            2 * rep(s * h) + attention + reduce_scatters,
            "{at}"
        );
        let (_, none8) = run(Recomputation::None, Precision::Fp8Hybrid);
        let gemms = (2 * s * (h * (q + 2 * kv) + q * h + 3 * h * f)) as f64 * blocks * 8.0;
        assert!(
            rel(
                op8.hardware_flops_per_step - none8.hardware_flops_per_step,
                gemms
            ) < 1e-12,
            "{at}"
        );
    }
}

/// GPT-3's linear layers have biases (`addmm`, not `mm`) and its attention is not one
/// SDPA kernel: per-operator checkpointing keeps a block's input and, with sequence
/// parallelism, its reduce-scatters' outputs, and nothing else.
#[test]
fn per_operator_checkpointing_keeps_no_biased_linear() {
    let (h, s, t) = (12_288u64, 2_048u64, 8u64);
    for sp in [false, true] {
        let mut pl = plan(t, 16, 8);
        pl.sequence_parallel = sp;
        let g = graph(&gpt3(pl, 1 << 20));
        let want = if sp { 2 * s * h / t * 3 } else { 2 * s * h };
        assert_eq!(g.block.op_checkpoint_bytes, want, "sequence parallel {sp}");
    }
}

/// The distributed optimizer shards the optimizer's state, and its reduce-scatter plus
/// all-gather move no more than the all-reduce.
#[test]
fn distributed_optimizer_shards_state() {
    let run = |dist| {
        let mut pl = plan(8, 8, 8);
        pl.distributed_optimizer = dist;
        estimate_step(&gpt3(pl, 1 << 20), &ReferenceModel::default()).unwrap()
    };
    let (plain, dist) = (run(false), run(true));
    assert!(
        rel(
            dist.memory_bytes.optimizer * 8.0,
            plain.memory_bytes.optimizer
        ) < 1e-12
    );
    assert_eq!(dist.memory_bytes.weights, plain.memory_bytes.weights);
    assert!(
        dist.time.data_parallel_communication_seconds
            <= plain.time.data_parallel_communication_seconds
    );
}

#[test]
fn ring_collectives_go_hierarchical_across_nodes() {
    let net = gpt3(plan(1, 1, 1), 80).network;
    let bytes = 1e9;
    // Inside a node: the textbook ring all-reduce.
    let intra = net.ring_seconds(bytes, 2.0, 8, 1);
    assert!(rel(intra, 2.0 * (7.0 / 8.0 * bytes / 300e9 + 7.0 * 5e-6)) < 1e-12);
    // 64 ranks over 8 nodes: inside each node, then 1/8 of the bytes between nodes.
    let hier = net.ring_seconds(bytes, 2.0, 64, 1);
    let want = intra + 2.0 * (7.0 / 8.0 * bytes / 8.0 / 25e9 + 7.0 * 10e-6);
    assert!(rel(hier, want) < 1e-12);
    // A group with a stride of a whole node has one rank per node: all between nodes.
    let strided = net.ring_seconds(bytes, 2.0, 8, 8);
    assert!(rel(strided, 2.0 * (7.0 / 8.0 * bytes / 25e9 + 7.0 * 10e-6)) < 1e-12);
    assert_eq!(net.ring_seconds(bytes, 2.0, 1, 1), 0.0);
    // One tier: no latency, one bandwidth.
    let flat = Network::flat(4e9);
    assert!(
        rel(
            flat.ring_seconds(bytes, 2.0, 64, 8),
            2.0 * 63.0 / 64.0 * bytes / 4e9
        ) < 1e-12
    );
}

/// A stage list that is the even split prices exactly as the even split; an uneven one
/// moves blocks, their time and their memory between stages, and the step is the slowest
/// stage's: taking two blocks off the first stage (which holds the embedding) and giving
/// them to the second makes the second the slowest.
#[test]
fn a_stage_list_moves_blocks_between_stages() {
    let model = ReferenceModel::default();
    let even = estimate_step(&gpt3(plan(8, 8, 4), 1 << 20), &model).unwrap();
    let mut listed = plan(8, 8, 4);
    listed.stage_layers = Some(vec![12; 8]);
    let same = estimate_step(&gpt3(listed, 1 << 20), &model).unwrap();
    assert_eq!(even, same);

    let mut moved = plan(8, 8, 4);
    moved.stage_layers = Some(vec![10, 14, 12, 12, 12, 12, 12, 12]);
    let r = estimate_step(&gpt3(moved, 1 << 20), &model).unwrap();
    let blocks: Vec<u64> = r.stages.iter().map(|s| s.blocks).collect();
    assert_eq!(blocks, [10, 14, 12, 12, 12, 12, 12, 12]);
    assert!(r.stages[1].seconds_per_micro_batch > even.stages[1].seconds_per_micro_batch);
    assert!(r.stages[0].seconds_per_micro_batch < even.stages[0].seconds_per_micro_batch);
    assert!(r.stages[1].memory_bytes.total > even.stages[1].memory_bytes.total);
    let slowest = r
        .stages
        .iter()
        .map(|s| s.seconds_per_micro_batch)
        .fold(0.0, f64::max);
    assert_eq!(slowest, r.stages[1].seconds_per_micro_batch);
    // The step: m micro-batches of the slowest stage plus the bubble of (p − 1) of them.
    let m = r.micro_batches_per_replica as f64;
    let pipeline =
        r.time.total() - r.time.data_parallel_communication_seconds - r.time.optimizer_step_seconds;
    assert!(rel(pipeline, (m + 7.0) * slowest) < 1e-12, "{pipeline}");
    assert!(r.step_seconds > even.step_seconds);
}

/// A stage list must give each stage's blocks (one per stage, summing to the model's,
/// none empty but the first and the last), interleaved or not.
#[test]
fn a_stage_list_that_does_not_fit_the_plan_is_refused_with_the_numbers() {
    let cases: [(Vec<u64>, u64); 5] = [
        (vec![12; 7], 1),
        (vec![13; 8], 1),
        (vec![12, 12, 0, 24, 12, 12, 12, 12], 1),
        (vec![13; 8], 2),
        (vec![], 1),
    ];
    for (list, v) in cases {
        let mut pl = plan(8, 8, 4);
        pl.stage_layers = Some(list.clone());
        pl.interleaving = v;
        let e = check(&gpt3(pl, 80)).unwrap_err();
        assert_eq!(
            e,
            StepError::StageLayers {
                stages: list,
                pipeline: 8,
                layers: 96,
            }
        );
        assert!(e.to_string().contains("summing to the model's 96"), "{e}");
    }
    // The first and the last stage may hold only the embedding or the head.
    let mut pl = plan(8, 3, 4);
    pl.stage_layers = Some(vec![0, 96, 0]);
    let input = StepInput {
        devices: 96,
        ..gpt3(pl, 1 << 20)
    };
    assert_eq!(check(&input), Ok(()));
}

/// Mixtral 8x7B on 64 devices (t = 2, p = 4, d = 8) with its experts over EP = 8.
fn mixtral(ep: u64, etp: u64, distributed: bool) -> StepInput {
    let mut pl = plan(2, 4, 8);
    pl.sequence_parallel = true;
    pl.expert_parallel = ep;
    pl.expert_tensor_parallel = etp;
    pl.distributed_optimizer = distributed;
    pl.recomputation = Recomputation::Full;
    let mut input = gpt3(pl, 1 << 20);
    input.model = preset("mixtral-8x7b").unwrap();
    input.model.seq_len = 4096;
    input.global_batch = 256;
    input
}

/// Expert parameters are `E/EP` experts of `3·h·f/ETP` per block on each device, their
/// optimizer state sharded over the expert-data-parallel group (`t·d/(EP·ETP)` ranks)
/// with the distributed optimizer; the rest of the state is the dense parameters' as
/// before. Exactly, per stage.
#[test]
fn expert_state_is_sharded_over_expert_parallelism() {
    for (ep, etp) in [(1, 1), (8, 1), (4, 2), (2, 2)] {
        for distributed in [false, true] {
            let input = mixtral(ep, etp, distributed);
            let r = estimate_step(&input, &ReferenceModel::default()).unwrap();
            let cfg = &input.model;
            let moe = cfg.moe.unwrap();
            let per_block = moe.experts / ep * 3 * cfg.hidden * moe.expert_ffn / etp;
            let edp = 2 * 8 / (ep * etp);
            let dense = StateBytes::megatron(Precision::Bf16Mixed, Optimizer::Adam, distributed, 8);
            let experts =
                StateBytes::megatron(Precision::Bf16Mixed, Optimizer::Adam, distributed, edp);
            for s in &r.stages {
                assert_eq!(s.expert_parameters, s.blocks * per_block);
                let (e, d) = (
                    s.expert_parameters as f64,
                    (s.parameters - s.expert_parameters) as f64,
                );
                let m = s.memory_bytes;
                let at = format!(
                    "ep {ep} etp {etp} distributed {distributed} stage {}",
                    s.stage
                );
                assert_eq!(m.weights, d * dense.weights + e * experts.weights, "{at}");
                assert_eq!(
                    m.gradients,
                    d * dense.gradients + e * experts.gradients,
                    "{at}"
                );
                assert_eq!(
                    m.optimizer,
                    d * dense.optimizer + e * experts.optimizer,
                    "{at}"
                );
            }
        }
    }
}

/// The all-to-all part of the step is, per micro-batch on the slowest stage, each block's
/// dispatch and combine forward, backward and recomputed (6 exchanges under full
/// recomputation) of `b·s/t · k · h` bf16 elements over the expert-parallel group; none
/// without expert parallelism.
#[test]
fn all_to_all_time_is_six_exchanges_per_block_and_micro_batch() {
    let none = estimate_step(&mixtral(1, 1, true), &ReferenceModel::default()).unwrap();
    assert_eq!(none.time.all_to_all_seconds, 0.0);
    for (ep, etp) in [(8, 1), (4, 2)] {
        let input = mixtral(ep, etp, true);
        let r = estimate_step(&input, &ReferenceModel::default()).unwrap();
        let cfg = &input.model;
        let k = cfg.moe.unwrap().experts_per_token;
        let bytes = (cfg.seq_len / 2 * k * cfg.hidden * 2) as f64;
        let one = input.network.all_to_all_seconds(bytes, ep, etp);
        let blocks = 32 / 4;
        let want = r.micro_batches_per_replica as f64 * blocks as f64 * 6.0 * one;
        assert!(
            rel(r.time.all_to_all_seconds, want) < 1e-12,
            "{} vs {want}",
            r.time.all_to_all_seconds
        );
        assert!(r.step_seconds > r.time.all_to_all_seconds);
    }
}

/// With `all_to_all_overlap` the step exposes, per micro-batch of the slowest stage, only
/// the all-to-all its computation (forward, backward, recomputation) does not cover:
/// `max(0, A − C)` — checked on a fast network (all hidden) and on a slow one (some
/// exposed); the exchanges' whole time stays in `operator_seconds.all_to_all`, and nothing
/// else changes.
#[test]
fn all_to_all_overlap_exposes_what_computation_does_not_cover() {
    for inter_node_gbps in [50.0, 0.05] {
        let mut input = mixtral(8, 1, true);
        input.network.node_size = 4;
        input.network.inter_node.bytes_per_second = inter_node_gbps * 1e9;
        let plain = estimate_step(&input, &ReferenceModel::default()).unwrap();
        input.plan.all_to_all_overlap = true;
        let hidden = estimate_step(&input, &ReferenceModel::default()).unwrap();
        let m = plain.micro_batches_per_replica as f64;
        let a = plain.time.all_to_all_seconds / m;
        let c = (plain.time.forward_seconds
            + plain.time.backward_seconds
            + plain.time.recomputation_seconds)
            / m;
        let want = m * (a - c).max(0.0);
        assert!(
            (hidden.time.all_to_all_seconds - want).abs() <= 1e-12 * plain.step_seconds,
            "{} vs {want}",
            hidden.time.all_to_all_seconds
        );
        assert_eq!(
            hidden.operator_seconds.all_to_all,
            plain.operator_seconds.all_to_all
        );
        assert_eq!(hidden.time.forward_seconds, plain.time.forward_seconds);
        assert_eq!(hidden.memory_bytes, plain.memory_bytes);
        if inter_node_gbps > 1.0 {
            assert_eq!(hidden.time.all_to_all_seconds, 0.0, "{a} vs {c}");
        } else {
            assert!(hidden.time.all_to_all_seconds > 0.0, "{a} vs {c}");
        }
    }
}

/// The network's all-to-all: `(n − 1)/n` of the buffer and one latency inside a node;
/// across nodes the slower of the node's own share and the rest over the NIC.
#[test]
fn all_to_all_closed_form() {
    let net = gpt3(plan(1, 1, 1), 80).network;
    let b = 64e6;
    let inside = net.all_to_all_seconds(b, 8, 1);
    assert!(rel(inside, 7.0 / 8.0 * b / 300e9 + 5e-6) < 1e-12);
    let across = net.all_to_all_seconds(b, 16, 1);
    let intra = 7.0 / 16.0 * b / 300e9 + 5e-6;
    let inter = 8.0 / 16.0 * b / 25e9 + 10e-6;
    assert!(rel(across, intra.max(inter)) < 1e-12);
    // Strided: two ranks of the group per node of 8.
    let strided = net.all_to_all_seconds(b, 4, 4);
    let want = (1.0 / 4.0 * b / 300e9 + 5e-6).max(2.0 / 4.0 * b / 25e9 + 10e-6);
    assert!(rel(strided, want) < 1e-12);
    assert_eq!(net.all_to_all_seconds(b, 1, 1), 0.0);
}

/// Every impossible expert layout is refused with the numbers, and only for it.
#[test]
fn expert_layouts_that_cannot_run_are_refused() {
    let kinds = |input: &StepInput| -> Vec<String> {
        problems(input)
            .iter()
            .map(|e| {
                format!("{e:?}")
                    .split([' ', '{'])
                    .next()
                    .unwrap()
                    .to_string()
            })
            .collect::<Vec<_>>()
    };
    assert!(problems(&mixtral(8, 1, true)).is_empty());
    assert_eq!(
        kinds(&mixtral(3, 1, true)),
        ["ExpertParallel", "ExpertFolding"]
    );
    assert_eq!(kinds(&mixtral(8, 4, true)), ["ExpertFolding"]);
    assert_eq!(
        kinds(&mixtral(8, 3, true)),
        ["ExpertTensorParallel", "ExpertFolding"]
    );
    let mut no_sp = mixtral(8, 1, true);
    no_sp.plan.sequence_parallel = false;
    assert_eq!(kinds(&no_sp), ["MoeSequenceParallel"]);
    let mut dense = gpt3(plan(8, 16, 8), 80);
    dense.plan.expert_parallel = 2;
    assert_eq!(kinds(&dense), ["ExpertsWithoutMoe"]);
    let text = problems(&mixtral(8, 4, true))[0].to_string();
    assert!(
        text.contains("EP × ETP = 8 × 4") && text.contains("16 ranks"),
        "{text}"
    );
}

/// The dense leading blocks of a Mixture-of-Experts model sit where the plan puts the first
/// blocks: on the first stages of a plain pipeline, or in device 0's (then 1's, …) first
/// chunk of an interleaved one.
#[test]
fn dense_blocks_sit_on_the_stages_holding_the_first_blocks() {
    let mut pl = plan(1, 4, 1);
    assert_eq!(dense_per_stage(&pl, 16, 3), [3, 0, 0, 0]);
    assert_eq!(dense_per_stage(&pl, 16, 6), [4, 2, 0, 0]);
    pl.stage_layers = Some(vec![2, 5, 5, 4]);
    assert_eq!(dense_per_stage(&pl, 16, 3), [2, 1, 0, 0]);
    pl.stage_layers = None;
    pl.interleaving = 2; // chunks of 2: device k holds chunks k and k + 4
    assert_eq!(dense_per_stage(&pl, 16, 3), [2, 1, 0, 0]);
    assert_eq!(dense_per_stage(&pl, 16, 9), [3, 2, 2, 2]);
}

/// DeepSeek-V3 on 2,048 devices: t = 2, 16 stages of 3, 4 × 14 and 2 blocks, d = 64,
/// EP = 64, sequence parallelism, the distributed optimizer.
fn deepseek_v3_on_2048_devices() -> StepInput {
    let mut pl = plan(2, 16, 64);
    pl.sequence_parallel = true;
    pl.distributed_optimizer = true;
    pl.expert_parallel = 64;
    let mut stage_layers = vec![4; 16];
    (stage_layers[0], stage_layers[15]) = (3, 2);
    pl.stage_layers = Some(stage_layers);
    let mut input = gpt3(pl, 1 << 20);
    input.model = preset("deepseek-v3").unwrap();
    input.devices = 2048;
    input.global_batch = 8192;
    input
}

/// DeepSeek-V3 (3 dense blocks, 58 MoE blocks, multi-head latent attention, one
/// multi-token-prediction module) on 2,048 devices: each stage holds the parameters of its
/// blocks of each kind exactly, the experts only in its MoE blocks (and the module's), and
/// the all-to-all only for those.
#[test]
fn deepseek_v3_stages_hold_their_dense_and_moe_blocks() {
    let input = deepseek_v3_on_2048_devices();
    let r = estimate_step(&input, &ReferenceModel::default()).unwrap();
    let g = graph(&input);
    let dense = g.dense_block.as_ref().unwrap();
    assert_eq!(g.dense_blocks, 3);
    // Stage 0: the embedding and the 3 dense blocks; stage 1: 4 MoE blocks.
    assert_eq!(
        r.stages[0].parameters,
        g.embedding.parameters + 3 * dense.parameters
    );
    assert_eq!(r.stages[0].expert_parameters, 0);
    assert_eq!(r.stages[1].parameters, 4 * g.block.parameters);
    assert_eq!(r.stages[1].expert_parameters, 4 * g.block.expert_parameters);
    assert_eq!(g.block.expert_parameters, 4 * 3 * 7168 * 2048);
    assert!(r.time.all_to_all_seconds > 0.0);
    // The last stage: 2 MoE blocks, the multi-token-prediction module (one more) and the
    // head, with its copy of the input embedding.
    let mtp = g.mtp.as_ref().unwrap();
    assert_eq!(
        r.stages[15].parameters,
        2 * g.block.parameters + mtp.parameters + g.head.parameters
    );
    assert_eq!(
        r.stages[15].expert_parameters,
        3 * g.block.expert_parameters
    );
    let total: u64 = r.stages.iter().map(|s| s.parameters).sum();
    assert_eq!(total, g.parameters_per_rank() + g.head.shared_parameters);
    // Five distinct layers, each scheduled forward and backward.
    assert_eq!(r.layer_schedules, 10);
    assert!(r.schedules_not_proven_optimal <= 10);
    // Without dense blocks, three: the fourth slot is not counted twice.
    let m = estimate_step(&mixtral(8, 1, true), &ReferenceModel::default()).unwrap();
    assert_eq!(m.layer_schedules, 6);
    assert!(m.schedules_not_proven_optimal <= 6);
}

/// DeepSeek-V3's multi-token-prediction module runs in the last stage, with the head: the
/// other stages are as without it; the last holds its parameters and the head's copy of the
/// input embedding, keeps its activations (recomputed as a block's are) and spends its
/// forward, backward, recomputation and all-to-all time.
#[test]
fn multi_token_prediction_runs_in_the_last_stage() {
    let input = deepseek_v3_on_2048_devices();
    let mut plain = input.clone();
    plain.model.mtp_depth = 0;
    let with = estimate_step(&input, &ReferenceModel::default()).unwrap();
    let without = estimate_step(&plain, &ReferenceModel::default()).unwrap();
    let (g, g0) = (graph(&input), graph(&plain));
    let mtp = g.mtp.as_ref().unwrap();
    for k in 0..15 {
        let (a, b) = (&with.stages[k], &without.stages[k]);
        assert_eq!(a.parameters, b.parameters, "stage {k}");
        assert_eq!(a.seconds_per_micro_batch, b.seconds_per_micro_batch);
        assert_eq!(a.memory_bytes.total, b.memory_bytes.total);
    }
    let (a, b) = (&with.stages[15], &without.stages[15]);
    assert_eq!(
        a.parameters - b.parameters,
        mtp.parameters + g.head.shared_parameters
    );
    assert_eq!(
        a.expert_parameters - b.expert_parameters,
        mtp.expert_parameters
    );
    // Full recomputation: the module keeps its input; the one block rematerialised at a
    // time is the larger of a block and the module.
    let transient = |l: &crate::model::Layer| (l.stash_bytes - l.input_bytes) as f64;
    let kept = mtp.input_bytes as f64 + (g.head.stash_bytes - g0.head.stash_bytes) as f64;
    let more = kept + transient(mtp).max(transient(&g.block)) - transient(&g.block);
    assert!(
        rel(
            a.memory_bytes.activations - b.memory_bytes.activations,
            more
        ) < 1e-12
    );
    assert!(a.seconds_per_micro_batch > b.seconds_per_micro_batch);
    assert!(with.model_flops_per_step > without.model_flops_per_step);
    assert!(with.hardware_flops_per_step > without.hardware_flops_per_step);
}

/// The loss holds its logits and their gradients beside the fp32 softmax the head keeps:
/// nothing more fused (the in-place kernels); eager (PyTorch's over an fp32 copy) 8 bytes a
/// logit over the whole vocabulary and 12 over a tensor-parallel rank's share of it (DTensor's
/// loss parallelism, three fp32 temporaries in its backward). Llama-3-8B at TP 2 × PP 2,
/// micro-batch 2: the head's rank computes `2 · 8,192 × 128,256 / 2` logits; on its stage
/// the larger of that workspace and one block's rematerialised activations (full
/// recomputation) comes on top of what is kept, the other stage does not move, nor does
/// the step's time. At TP 1 the rank computes them all, at 8 bytes each.
#[test]
fn the_loss_holds_its_logits_and_gradients_beside_the_kept_softmax() {
    let mut pl = plan(2, 2, 4);
    pl.micro_batch = 2;
    pl.recomputation = Recomputation::Full;
    let mut input = gpt3(pl, 1 << 20);
    input.model = preset("llama3-8b").unwrap();
    input.global_batch = 64;
    let at = |cross_entropy, t: u64| {
        let mut i = input.clone();
        i.execution.cross_entropy = cross_entropy;
        i.plan.tensor_parallel = t;
        i.plan.data_parallel = 8 / t;
        (
            estimate_step(&i, &ReferenceModel::default()).unwrap(),
            graph(&i),
        )
    };
    let (fused, g) = at(CrossEntropy::Fused, 2);
    let (eager, ge) = at(CrossEntropy::Eager, 2);
    let logits = (2 * 8192 * 128_256 / 2) as u64;
    assert_eq!(g.head.workspace_bytes, 0);
    assert_eq!(ge.head.workspace_bytes, 12 * logits);
    assert_eq!(g.head.stash_bytes, ge.head.stash_bytes);
    assert_eq!(
        (g.block.workspace_bytes, g.embedding.workspace_bytes),
        (0, 0)
    );
    let rematerialised = (g.block.stash_bytes - g.block.input_bytes) as f64;
    let on_top = |workspace: u64| rematerialised.max(workspace as f64);
    let (a, b) = (&eager.stages[1], &fused.stages[1]);
    assert!(a.head && b.head);
    assert!(
        rel(
            a.memory_bytes.activations - b.memory_bytes.activations,
            on_top(12 * logits) - on_top(0)
        ) < 1e-12
    );
    assert!(12 * logits as u128 > rematerialised as u128);
    assert_eq!(
        eager.stages[0].memory_bytes.total.to_bits(),
        fused.stages[0].memory_bytes.total.to_bits()
    );
    // PyTorch's loss runs each of its operations as a kernel over fp32 logits: slower.
    assert!(eager.step_seconds > fused.step_seconds);
    // Megatron-Core's unfused loss holds what the fused one does.
    let (unfused, gu) = at(CrossEntropy::Unfused, 2);
    assert_eq!(gu.head.workspace_bytes, 0);
    assert_eq!(
        unfused.stages[1].memory_bytes.total.to_bits(),
        fused.stages[1].memory_bytes.total.to_bits()
    );
    // The whole vocabulary on one rank: F.cross_entropy's own kernels, 8 bytes a logit.
    let (_, whole) = at(CrossEntropy::Eager, 1);
    assert_eq!(whole.head.workspace_bytes, 8 * 2 * 8192 * 128_256);
    assert_eq!(at(CrossEntropy::Fused, 1).1.head.workspace_bytes, 0);
}

/// The loss's kernels move the logits through HBM as their implementation does, in bytes
/// a logit (each element-wise kernel reading and writing its share, twice backward, as the
/// plugins charge one; long rows read once more not counted here): fused, one kernel each
/// way over the 16-bit logits (4 + 8); Megatron-Core's unfused loss, six over an fp32 copy
/// forward and two backward (38 + 14); PyTorch's `F.cross_entropy` over fp32 logits, the
/// cast and log-softmax forward, the dense gradient, log-softmax's backward and the cast
/// back (14 + 22); the same under DTensor's loss parallelism, which decomposes it (38 +
/// 38). Each is its own kernel even where the rest of the layer fuses.
#[test]
fn the_loss_kernels_move_the_logits_as_their_implementation_does() {
    let mut pl = plan(1, 1, 8);
    pl.micro_batch = 1;
    let mut input = gpt3(pl, 1 << 20);
    input.model = preset("llama3-8b").unwrap();
    input.global_batch = 8;
    input.execution.kernels = crate::execution::KernelFusion::Fused;
    let bytes = |g: &OpGraph, backward: bool| -> f64 {
        g.nodes
            .iter()
            .filter(|n| n.name.starts_with("cross_entropy") && !n.name.contains("all_reduce"))
            .map(|n| match n.op.kind {
                OpKind::Vector { elements, .. } => {
                    let twice = if backward { 2.0 } else { 1.0 };
                    n.op.element.bytes() * elements as f64 * 2.0 * twice
                }
                _ => panic!("{n:?}"),
            })
            .sum()
    };
    for (loss, t, forward, backward, kernels) in [
        (CrossEntropy::Fused, 1, 4.0, 8.0, (1, 1)),
        (CrossEntropy::Unfused, 1, 38.0, 14.0, (6, 2)),
        (CrossEntropy::Unfused, 2, 38.0, 14.0, (6, 2)),
        (CrossEntropy::Eager, 1, 14.0, 22.0, (2, 3)),
        (CrossEntropy::Eager, 2, 38.0, 38.0, (7, 5)),
    ] {
        let mut i = input.clone();
        i.execution.cross_entropy = loss;
        i.plan.tensor_parallel = t;
        i.plan.data_parallel = 8 / t;
        let g = graph(&i);
        let logits = (8192 * 128_256 / t) as f64;
        let (f, b) = (&g.head.forward, &g.head.backward);
        let count = |g: &OpGraph| {
            g.nodes
                .iter()
                .filter(|n| n.name.starts_with("cross_entropy") && !n.name.contains("all_reduce"))
                .count()
        };
        assert_eq!((count(f), count(b)), kernels, "{loss:?} t = {t}");
        let per_logit = (bytes(f, false) / logits, bytes(b, true) / logits);
        assert!(
            (per_logit.0 - forward).abs() < 0.01 && (per_logit.1 - backward).abs() < 0.01,
            "{loss:?} t = {t}: {per_logit:?}"
        );
    }
}

/// Pure FSDP (ZeRO-3, t = p = 1) of Llama-3-8B over 16 devices of a flat 50 GB/s network:
/// every state is a sixteenth per device, plus the largest layer's gathered weights twice
/// (running and prefetched) and its unsharded gradient; every micro-batch gathers the whole
/// model's weights twice (forward and, resharded, backward) and reduce-scatters its
/// gradients, `(d − 1)/d` of the bytes each; nothing is left to synchronise once per step.
/// Kept gathered from forward to backward: one gather less, the whole model's weights held.
#[test]
fn pure_fsdp_shards_every_state_and_gathers_every_layer() {
    let mut pl = plan(1, 1, 16);
    pl.recomputation = Recomputation::Selective;
    pl.distributed_optimizer = true;
    pl.sharding.zero_stage = 3;
    let mut input = gpt3(pl, 1 << 20);
    input.model = preset("llama3-8b").unwrap();
    input.global_batch = 64;
    input.network = Network::flat(50e9);
    let r = estimate_step(&input, &ReferenceModel::default()).unwrap();
    let g = graph(&input);
    let params = g.parameters_per_rank() as f64;
    let largest = g.distinct().iter().map(|l| l.parameters).max().unwrap() as f64;
    assert_eq!(largest, g.head.parameters as f64);
    let m = r.memory_bytes;
    let d = 16.0;
    // bf16 mixed precision, Adam: 2, 4 and 12 bytes per parameter.
    assert!(rel(m.weights, params * 2.0 / d + 2.0 * largest * 2.0) < 1e-12);
    assert!(rel(m.gradients, params * 4.0 / d + largest * 4.0) < 1e-12);
    assert!(rel(m.optimizer, params * 12.0 / d) < 1e-12);
    let ring = |bytes: f64| (d - 1.0) / d * bytes / 50e9;
    let per_micro_batch = 2.0 * ring(params * 2.0) + ring(params * 4.0);
    let micro_batches = 64.0 / 16.0;
    assert!(
        rel(
            r.time.fsdp_communication_seconds,
            micro_batches * per_micro_batch
        ) < 1e-12
    );
    assert_eq!(r.time.data_parallel_communication_seconds, 0.0);
    // Kept gathered between the passes.
    let mut kept = input.clone();
    kept.plan.sharding.reshard_after_forward = false;
    let k = estimate_step(&kept, &ReferenceModel::default()).unwrap();
    assert!(rel(k.memory_bytes.weights, params * 2.0 / d + params * 2.0) < 1e-12);
    let once = ring(params * 2.0) + ring(params * 4.0);
    assert!(rel(k.time.fsdp_communication_seconds, micro_batches * once) < 1e-12);
    // Overlapped: only what the micro-batch's computation does not cover.
    let mut overlapped = input.clone();
    overlapped.plan.sharding.data_parallel_overlap = true;
    let o = estimate_step(&overlapped, &ReferenceModel::default()).unwrap();
    let busy = (r.time.forward_seconds + r.time.backward_seconds + r.time.recomputation_seconds)
        / micro_batches;
    let exposed = (per_micro_batch - busy).max(0.0);
    assert!((o.time.fsdp_communication_seconds - micro_batches * exposed).abs() < 1e-9);
    assert!(o.step_seconds < r.step_seconds);
}

/// ZeRO-2/3 under pipeline parallelism, as PyTorch's pipelining runs an FSDP stage
/// (`backward_maybe_with_nosync`): the gradients reduce-scattered once a step, the weights
/// gathered once a step when not resharded after forward (torchtitan's default with
/// pipelines), else once a micro-batch (each backward pass's gather; they stay gathered
/// after it); without pipelining, every micro-batch as before. The step's traffic is
/// those counts' bytes, `(d − 1)/d` of them each over the flat network. Overlapped, that
/// once-a-step traffic hides behind one micro-batch's forward pass (the gathers) and one's
/// backward pass (the reduce-scatters) only.
#[test]
fn fsdp_under_pipeline_parallelism_syncs_once_a_step() {
    let mut pl = plan(1, 4, 4);
    pl.distributed_optimizer = true;
    pl.sharding.zero_stage = 3;
    pl.sharding.reshard_after_forward = false;
    let mut input = gpt3(pl.clone(), 1 << 20);
    input.model = preset("llama3-8b").unwrap();
    input.global_batch = 64;
    input.network = Network::flat(50e9);
    let m = 64 / (input.plan.micro_batch * 4);
    assert!(m > 1);
    assert_eq!(fsdp_syncs(&input.plan, m), (1.0, 1.0));
    let mut resharded = input.plan.clone();
    resharded.sharding.reshard_after_forward = true;
    assert_eq!(fsdp_syncs(&resharded, m), (m as f64, 1.0));
    let mut flat = input.plan.clone();
    flat.pipeline_parallel = 1;
    assert_eq!(fsdp_syncs(&flat, m), (m as f64, m as f64));
    flat.sharding.reshard_after_forward = true;
    assert_eq!(fsdp_syncs(&flat, m), (2.0 * m as f64, m as f64));
    flat.sharding.zero_stage = 2;
    assert_eq!(fsdp_syncs(&flat, m), (0.0, m as f64));

    let r = estimate_step(&input, &ReferenceModel::default()).unwrap();
    let busiest = r.stages.iter().map(|s| s.parameters).max().unwrap() as f64;
    let d = 4.0;
    let ring = |bytes: f64| (d - 1.0) / d * bytes / 50e9;
    // bf16 weights gathered, fp32 gradients reduce-scattered: once each in the step.
    let once = ring(busiest * 2.0) + ring(busiest * 4.0);
    assert!(
        rel(r.fsdp_traffic_seconds, once) < 1e-9,
        "{} against {once}",
        r.fsdp_traffic_seconds
    );

    // Overlapped, what moves once a step hides behind one micro-batch's passes only: the
    // gathers behind the first forward pass, the reduce-scatters behind the last backward
    // pass (with its recomputation) — not behind the step's other micro-batches. On a
    // network where they take three micro-batches' passes, all sixteen would hide them.
    let mf = m as f64;
    let busy = |r: &StepReport| {
        (
            r.time.forward_seconds / mf,
            (r.time.backward_seconds + r.time.recomputation_seconds) / mf,
        )
    };
    let (fwd, bwd) = busy(&r);
    let bandwidth = (d - 1.0) / d * busiest * 6.0 / (3.0 * (fwd + bwd));
    let mut slow = input.clone();
    slow.plan.sharding.data_parallel_overlap = true;
    slow.network = Network::flat(bandwidth);
    let o = estimate_step(&slow, &ReferenceModel::default()).unwrap();
    let (fwd, bwd) = busy(&o);
    let ring = |bytes: f64| (d - 1.0) / d * bytes / bandwidth;
    let (gather, reduce) = (ring(busiest * 2.0), ring(busiest * 4.0));
    assert!(gather + reduce < mf * (fwd + bwd));
    let exposed = (gather - fwd).max(0.0) + (reduce - bwd).max(0.0);
    assert!(exposed > 0.0);
    assert!(
        rel(o.time.fsdp_communication_seconds, exposed) < 1e-9,
        "{} against {exposed}",
        o.time.fsdp_communication_seconds
    );
    assert!(rel(o.fsdp_traffic_seconds, gather + reduce) < 1e-9);
}

/// `overlap_efficiency`: a collective beside computation moves at its rate alone for
/// that share of the computation's time. ZeRO-3's traffic (its time alone) is the same at
/// any efficiency; what stays exposed is the traffic less the efficiency times the
/// computation it hides behind (`T − e·B`, read at `e = 1` and checked at `e = 0.4`), and the
/// tensor-parallel collectives, which overlap nothing here, do not change.
#[test]
fn collectives_beside_computation_move_at_the_overlap_efficiency() {
    let mut pl = plan(2, 1, 4);
    pl.sharding.zero_stage = 3;
    pl.sharding.data_parallel_overlap = true;
    pl.distributed_optimizer = true;
    let mut input = gpt3(pl, 1 << 20);
    input.model = preset("llama3-8b").unwrap();
    input.global_batch = 16;
    // A slow flat network: the gathers outlast the computation.
    input.network = Network::flat(2e9);
    let run = |e: f64| {
        let mut input = input.clone();
        input.network.overlap_efficiency = e;
        estimate_step(&input, &ReferenceModel::default()).unwrap()
    };
    let (alone, beside) = (run(1.0), run(0.4));
    let traffic = alone.fsdp_traffic_seconds;
    assert!(traffic > 0.0 && rel(beside.fsdp_traffic_seconds, traffic) < 1e-12);
    let hidden = traffic - alone.time.fsdp_communication_seconds;
    assert!(hidden > 0.0 && alone.time.fsdp_communication_seconds > 0.0);
    let exposed = beside.time.fsdp_communication_seconds;
    assert!(
        rel(exposed, traffic - 0.4 * hidden) < 1e-9,
        "{exposed} against {}",
        traffic - 0.4 * hidden
    );
    let tp = |r: &StepReport| r.time.tensor_parallel_communication_seconds;
    assert!(tp(&alone) > 0.0 && rel(tp(&beside), tp(&alone)) < 1e-12);
    assert!(beside.step_seconds > alone.step_seconds);
}

/// Each ZeRO stage shards one more state of every pipeline stage, exactly (a middle stage of
/// GPT-3 on t = 8, p = 16, d = 8: its 6 blocks), and holds besides, as PyTorch's
/// pipelining keeps them between micro-batches, all its blocks' unsharded gradients
/// (stage 2 and 3) and gathered weights (stage 3); the once-per-step traffic is
/// the fp32 gradients' all-reduce (0), their reduce-scatter and the bf16 weights' all-gather
/// (1), the all-gather (2), none (3).
#[test]
fn zero_stages_shard_one_more_state_of_each_pipeline_stage() {
    let mut reports = Vec::new();
    for zero in 0..=3 {
        let mut pl = plan(8, 16, 8);
        pl.distributed_optimizer = zero >= 1;
        pl.sharding.zero_stage = zero;
        let input = gpt3(pl, 1 << 20);
        let r = estimate_step(&input, &ReferenceModel::default()).unwrap();
        let g = graph(&input);
        let s = &r.stages[1];
        let params = s.parameters as f64;
        assert_eq!(s.parameters, 6 * g.block.parameters);
        let over = |stage: u64| if zero >= stage { 8.0 } else { 1.0 };
        let m = s.memory_bytes;
        let gathered = if zero == 3 { params * 2.0 } else { 0.0 };
        let unsharded = if zero >= 2 { params * 4.0 } else { 0.0 };
        assert!(
            rel(m.weights, params * 2.0 / over(3) + gathered) < 1e-12,
            "zero {zero}"
        );
        assert!(rel(m.gradients, params * 4.0 / over(2) + unsharded) < 1e-12);
        assert!(rel(m.optimizer, params * 12.0 / over(1)) < 1e-12);
        assert_eq!(r.time.fsdp_communication_seconds > 0.0, zero >= 2);
        reports.push(r);
    }
    let dp: Vec<f64> = reports
        .iter()
        .map(|r| r.time.data_parallel_communication_seconds)
        .collect();
    // The tied embedding's all-reduce between the first and the last stage is common to
    // all; the rest is the largest stage's, over 8 ranks 8 apart: one per node, so on the
    // inter-node tier (25 GB/s, 10 µs).
    let tied = dp[3];
    assert!(tied > 0.0);
    let largest = reports[0]
        .stages
        .iter()
        .map(|s| s.parameters)
        .max()
        .unwrap() as f64;
    let ring = |bytes: f64, passes: f64| passes * (7.0 / 8.0 * bytes / 25e9 + 7.0 * 10e-6);
    let (w, g) = (2.0 * largest, 4.0 * largest);
    assert!(rel(dp[0] - tied, ring(g, 2.0)) < 1e-9);
    assert!(rel(dp[1] - tied, ring(g, 1.0) + ring(w, 1.0)) < 1e-9);
    assert!(rel(dp[2] - tied, ring(w, 1.0)) < 1e-9);
}

/// Hybrid sharding (HSDP): Llama-3-8B on two nodes of 8, ZeRO-3 sharded within each node
/// (`sharding_group = 8`) and replicated across the two: every state an eighth per device,
/// the gathers and reduce-scatters inside the node (NVLink), and once per step each shard's
/// gradients all-reduced between the two nodes (InfiniBand).
#[test]
fn hybrid_sharding_shards_within_a_node_and_replicates_across() {
    let mut pl = plan(1, 1, 16);
    pl.recomputation = Recomputation::Selective;
    pl.distributed_optimizer = true;
    pl.sharding.zero_stage = 3;
    pl.sharding.sharding_group = Some(8);
    let mut input = gpt3(pl, 1 << 20);
    input.model = preset("llama3-8b").unwrap();
    input.global_batch = 64;
    let r = estimate_step(&input, &ReferenceModel::default()).unwrap();
    let g = graph(&input);
    let params = g.parameters_per_rank() as f64;
    let largest = g.head.parameters as f64;
    let m = r.memory_bytes;
    assert!(rel(m.weights, params * 2.0 / 8.0 + 2.0 * largest * 2.0) < 1e-12);
    assert!(rel(m.gradients, params * 4.0 / 8.0 + largest * 4.0) < 1e-12);
    assert!(rel(m.optimizer, params * 12.0 / 8.0) < 1e-12);
    // Inside a node: 300 GB/s, 5 µs; between nodes: 25 GB/s, 10 µs.
    let nvlink = |bytes: f64| 7.0 / 8.0 * bytes / 300e9 + 7.0 * 5e-6;
    let per_micro_batch = 2.0 * nvlink(params * 2.0) + nvlink(params * 4.0);
    assert!(rel(r.time.fsdp_communication_seconds, 4.0 * per_micro_batch) < 1e-12);
    let across = 2.0 * (0.5 * params * 4.0 / 8.0 / 25e9 + 10e-6);
    assert!(rel(r.time.data_parallel_communication_seconds, across) < 1e-12);
    // A group that does not divide the data-parallel ranks, or no sharding, is refused.
    for (group, zero) in [(5, 3), (8, 0)] {
        let mut bad = input.clone();
        bad.plan.sharding.sharding_group = Some(group);
        bad.plan.sharding.zero_stage = zero;
        bad.plan.distributed_optimizer = zero >= 1;
        assert!(matches!(check(&bad), Err(StepError::ShardingGroup { .. })));
    }
}

/// Llama 3 8B (FlashAttention, causal, 8 key/value heads of 128) at 32K tokens on t = 2,
/// p = 2, d = 2 and `cp` context-parallel ranks, sequence parallelism and the distributed
/// optimizer, no recomputation, 8 sequences per step.
fn llama3_long(cp: u64) -> StepInput {
    let mut pl = plan(2, 2, 2);
    pl.sequence_parallel = true;
    pl.context_parallel = cp;
    pl.recomputation = Recomputation::None;
    pl.distributed_optimizer = true;
    let mut input = gpt3(pl, 1 << 20);
    input.model = preset("llama3-8b").unwrap();
    input.model.seq_len = 32768;
    input.devices = 8 * cp;
    input.global_batch = 8;
    input
}

/// Context parallelism splits every sequence over CP ranks: each keeps `1/CP` of the
/// activations, exactly; the model's FLOPs per step are the same (the ranks' attention is
/// `1/CP` of the whole sequence's each); weights are replicated over CP and the optimizer's
/// state sharded over the `CP × d` ranks holding the same weights; each block exchanges its
/// rank's keys and values, `b · s/CP · kv_heads/t · 2 · head_dim` elements.
#[test]
fn context_parallelism_divides_activations_and_keeps_the_model_flops() {
    let one = estimate_step(&llama3_long(1), &ReferenceModel::default()).unwrap();
    assert_eq!(one.time.context_parallel_communication_seconds, 0.0);
    assert!(graph(&llama3_long(1)).block.kv_exchange.is_none());
    for cp in [2, 4, 8] {
        let input = llama3_long(cp);
        let r = estimate_step(&input, &ReferenceModel::default()).unwrap();
        let at = format!("cp {cp}");
        assert_eq!(r.stages.len(), one.stages.len());
        for (s, s1) in r.stages.iter().zip(&one.stages) {
            let (m, m1) = (s.memory_bytes, s1.memory_bytes);
            assert!(
                rel(m.activations * cp as f64, m1.activations) < 1e-12,
                "{at}"
            );
            assert_eq!(m.weights, m1.weights, "{at}");
            assert_eq!(s.parameters, s1.parameters, "{at}");
            let sharded = StateBytes::megatron(Precision::Bf16Mixed, Optimizer::Adam, true, 2 * cp);
            assert!(
                rel(m.optimizer, sharded.optimizer * s.parameters as f64) < 1e-12,
                "{at}"
            );
        }
        assert!(
            rel(r.model_flops_per_step, one.model_flops_per_step) < 1e-12,
            "{at}"
        );
        // The FLOPs run count the diagonal of every causal chunk pair: `CP` diagonals of
        // `s/CP` entries instead of one of `s`, `(CP − 1)/s` more of the attention's.
        assert!(
            r.hardware_flops_per_step >= one.hardware_flops_per_step
                && rel(r.hardware_flops_per_step, one.hardware_flops_per_step)
                    < (cp - 1) as f64 / 32768.0,
            "{at}"
        );
        let x = graph(&input).block.kv_exchange.unwrap();
        assert_eq!(x.bytes, 32768 / cp * (8 / 2) * 2 * 128 * 2, "{at}");
        assert_eq!((x.group, x.stride, x.count), (cp, 2, 1), "{at}");
        assert_eq!(input.plan.shard_groups().dense, (2 * cp, 2), "{at}");
        assert!(r.time.context_parallel_communication_seconds >= 0.0);
        assert!(r.operator_seconds.context_parallel > 0.0, "{at}");
    }
}

/// Ring attention's exchanges per micro-batch on the slowest stage: each of its blocks
/// passes its keys and values on `CP − 1` times forward and, with their gradients, twice
/// the bytes backward, each step one message on the ring's tier; the all-gather gathers
/// `CP` ranks' keys and values forward and backward and reduce-scatters their gradients;
/// full recomputation exchanges the forward's again; overlapped, only what the attention
/// does not hide.
#[test]
fn context_parallel_exchanges_closed_form() {
    for cp in [2, 4, 8] {
        let mut input = llama3_long(cp);
        input.plan.context_exchange.overlap = false;
        let x = graph(&input).block.kv_exchange.unwrap();
        let net = input.network;
        let bytes = x.bytes as f64;
        let (m, blocks) = (8.0 / 2.0, 16.0);
        let steps = (cp - 1) as f64;
        let ring = |b: f64| net.ring_step_seconds(b, cp, 2);
        let serial = estimate_step(&input, &ReferenceModel::default()).unwrap();
        let want = m * blocks * steps * (ring(bytes) + ring(2.0 * bytes));
        let got = serial.time.context_parallel_communication_seconds;
        assert!(rel(got, want) < 1e-12, "cp {cp}: {got} vs {want}");
        assert!(rel(serial.operator_seconds.context_parallel, want) < 1e-12);
        // The ring's step on its tier: inside a node of 8 up to t × CP = 8, else the NIC.
        let tier = if 2 * cp <= 8 { 300e9 } else { 25e9 };
        let latency = if 2 * cp <= 8 { 5e-6 } else { 10e-6 };
        assert!(rel(ring(bytes), bytes / tier + latency) < 1e-12);

        let mut full = input.clone();
        full.plan.recomputation = Recomputation::Full;
        let f = estimate_step(&full, &ReferenceModel::default()).unwrap();
        let want_full = m * blocks * steps * (2.0 * ring(bytes) + ring(2.0 * bytes));
        assert!(rel(f.time.context_parallel_communication_seconds, want_full) < 1e-12);

        let mut gather = input.clone();
        gather.plan.context_exchange.method = ContextMethod::AllGather;
        let g = estimate_step(&gather, &ReferenceModel::default()).unwrap();
        let all = |b: f64| net.ring_seconds(cp as f64 * b, 1.0, cp, 2);
        let want_gather = m * blocks * (all(bytes) + all(2.0 * bytes));
        assert!(rel(g.time.context_parallel_communication_seconds, want_gather) < 1e-12);

        let overlapped = estimate_step(&llama3_long(cp), &ReferenceModel::default()).unwrap();
        let exposed = overlapped.time.context_parallel_communication_seconds;
        assert!(exposed <= got, "cp {cp}: {exposed} > {got}");
        assert_eq!(
            overlapped.operator_seconds.context_parallel,
            serial.operator_seconds.context_parallel
        );
        assert!(overlapped.step_seconds <= serial.step_seconds);
        let parts: f64 = serial.time.parts().iter().map(|p| p.1).sum();
        assert!(rel(parts, serial.step_seconds) < 1e-12);
    }
}

/// Ulysses' all-to-all (`context_parallel_exchange = "all_to_all"`): per block and pass two
/// all-to-alls of the rank's share of the sequence — queries, keys and values
/// (`b·s/CP·(heads + 2·kv_heads)/t·head_dim` elements), then the output
/// (`b·s/CP·heads/t·head_dim`) — each sending `(CP − 1)/CP` of it, the same forward and
/// backward, again under full recomputation, never overlapped. A rank's bytes shrink as
/// `1/CP` while the all-gather's gathered keys and values stay the whole sequence's: the
/// all-to-all's time falls with CP where the all-gather's does not (DeepSpeed-Ulysses §3.2:
/// "communication volume per link ... constant" as sequence and devices grow together).
#[test]
fn ulysses_all_to_all_closed_form() {
    let mut previous: Option<(f64, f64)> = None;
    for cp in [2, 4] {
        let mut input = llama3_long(cp);
        input.plan.context_exchange.method = ContextMethod::AllToAll;
        let x = graph(&input).block.kv_exchange.unwrap();
        let m = &input.model;
        let (b, s, t) = (1.0, (m.seq_len / cp) as f64, 2.0);
        let d = m.head_dim() as f64;
        let elements = |heads: u64| b * s * heads as f64 / t * d;
        assert_eq!(x.bytes as f64, 2.0 * elements(2 * m.kv_heads));
        assert_eq!(x.query_bytes as f64, 2.0 * elements(m.heads));
        assert_eq!(x.output_bytes as f64, 2.0 * elements(m.heads));
        let net = input.network;
        let a2a = |bytes: u64| net.all_to_all_seconds(bytes as f64, cp, 2);
        let pass = a2a(x.bytes + x.query_bytes) + a2a(x.output_bytes);
        // The all-to-all sends (CP − 1)/CP of the buffer on the group's tier.
        let tier = if 2 * cp <= 8 { 300e9 } else { 25e9 };
        let latency = if 2 * cp <= 8 { 5e-6 } else { 10e-6 };
        let sent = (cp - 1) as f64 / cp as f64;
        assert!(
            rel(
                a2a(x.output_bytes),
                sent * x.output_bytes as f64 / tier + latency
            ) < 1e-12
        );
        let (micro_batches, blocks) = (8.0 / 2.0, 16.0);
        let r = estimate_step(&input, &ReferenceModel::default()).unwrap();
        let want = micro_batches * blocks * 2.0 * pass;
        let got = r.time.context_parallel_communication_seconds;
        assert!(rel(got, want) < 1e-12, "cp {cp}: {got} vs {want}");
        let mut full = input.clone();
        full.plan.recomputation = Recomputation::Full;
        let f = estimate_step(&full, &ReferenceModel::default()).unwrap();
        let want_full = micro_batches * blocks * 3.0 * pass;
        assert!(rel(f.time.context_parallel_communication_seconds, want_full) < 1e-12);
        let mut gather = input.clone();
        gather.plan.context_exchange.method = ContextMethod::AllGather;
        let g = estimate_step(&gather, &ReferenceModel::default()).unwrap();
        let gathered = g.time.context_parallel_communication_seconds;
        if let Some((ulysses, all_gather)) = previous {
            assert!(
                got < ulysses,
                "cp {cp}: the all-to-all's time falls with CP"
            );
            assert!(
                gathered > 0.9 * all_gather,
                "cp {cp}: the all-gather's does not"
            );
        }
        previous = Some((got, gathered));
    }
}

/// Ulysses splits a tensor-parallel rank's heads over the CP ranks: Llama 3 8B's 8
/// key-value heads at `t = 2` go over CP = 4, not over CP = 8 — refused with the numbers,
/// and the search's sizes skip it.
#[test]
fn ulysses_needs_the_heads_to_divide_among_the_ranks() {
    let mut four = llama3_long(4);
    four.plan.context_exchange.method = ContextMethod::AllToAll;
    assert!(problems(&four).is_empty(), "{:?}", problems(&four));
    let mut eight = llama3_long(8);
    eight.plan.context_exchange.method = ContextMethod::AllToAll;
    let e = problems(&eight);
    assert!(
        matches!(
            e.as_slice(),
            [StepError::ContextAllToAll {
                heads: 32,
                kv_heads: 8,
                t: 2,
                cp: 8
            }]
        ),
        "{e:?}"
    );
    assert!(e[0].to_string().contains("8 key-value heads"));
    // The ring has no such rule.
    assert!(problems(&llama3_long(8)).is_empty());
    // A size fits when one width does (t = 1: 8 key-value heads over CP = 8).
    let model = preset("llama3-8b").unwrap();
    let fits = |cp, method| crate::search::context_parallel_fits(&model, cp, 64, method);
    assert!(fits(8, ContextMethod::AllToAll).is_ok());
    assert!(fits(16, ContextMethod::AllToAll).is_err());
    assert!(fits(16, ContextMethod::Ring).is_ok());
}

/// Context parallelism that cannot run is refused with the numbers: a width that does not
/// cut the sequence into `2·CP` chunks, unfused attention, a device count without CP's
/// factor, a sharding group that does not divide `CP × d`.
#[test]
fn context_parallel_plans_that_cannot_run_are_refused() {
    let mut odd = llama3_long(3);
    odd.devices = 24;
    assert!(matches!(
        problems(&odd).as_slice(),
        [StepError::ContextParallel {
            cp: 3,
            seq: 32768,
            chunks: 6
        }]
    ));
    let mut zero = llama3_long(1);
    zero.plan.context_parallel = 0;
    assert!(
        problems(&zero)
            .iter()
            .any(|e| matches!(e, StepError::ContextParallel { cp: 0, .. }))
    );
    let mut unfused = llama3_long(2);
    unfused.model.attention = AttentionKernel::Unfused;
    let e = problems(&unfused);
    assert!(
        matches!(
            e.as_slice(),
            [StepError::ContextParallelAttention { cp: 2, .. }]
        ),
        "{e:?}"
    );
    assert!(
        e[0].to_string().contains("attention = \"unfused\""),
        "{}",
        e[0]
    );
    let mut devices = llama3_long(2);
    devices.devices = 8;
    let e = problems(&devices);
    assert!(
        matches!(
            e.as_slice(),
            [StepError::Devices {
                cp: 2,
                needed: 16,
                ..
            }]
        ),
        "{e:?}"
    );
    let mut group = llama3_long(2);
    group.plan.sharding.sharding_group = Some(3);
    let e = problems(&group);
    assert!(
        matches!(
            e.as_slice(),
            [StepError::ShardingGroup { group: 3, d: 4, .. }]
        ),
        "{e:?}"
    );
    let mut fine = llama3_long(2);
    fine.plan.sharding.sharding_group = Some(4);
    assert!(problems(&fine).is_empty());
}

/// Context parallelism with the other splits: a Mixture-of-Experts model's expert groups
/// fold into the `t × CP × d` ranks of a stage (EP 8 needs CP 2 on t = 2, d = 2), and
/// multi-head latent attention exchanges every head's keys (`qk_nope + qk_rope` wide) and
/// values (`v_head_dim`) after their up-projection.
#[test]
fn context_parallelism_folds_experts_and_exchanges_latent_keys() {
    let mut moe = mixtral(8, 1, true);
    moe.plan.data_parallel = 2;
    moe.global_batch = 64;
    moe.devices = 2 * 4 * 2;
    let e = problems(&moe);
    assert!(
        matches!(e.as_slice(), [StepError::ExpertFolding { ranks: 4, .. }]),
        "{e:?}"
    );
    moe.plan.context_parallel = 2;
    moe.devices *= 2;
    assert!(problems(&moe).is_empty(), "{:?}", problems(&moe));
    assert_eq!(moe.plan.expert_data_parallel(), 1);
    let r = estimate_step(&moe, &ReferenceModel::default()).unwrap();
    assert!(r.time.all_to_all_seconds > 0.0);
    // The all-to-all moves the rank's tokens: `b · s/(t·CP) · k · h` elements.
    let g = graph(&moe);
    let cfg = &moe.model;
    let k = cfg.moe.unwrap().experts_per_token;
    assert_eq!(
        g.block.all_to_all.unwrap().bytes,
        cfg.seq_len / (2 * 2) * k * cfg.hidden * 2
    );

    let mut mla = deepseek_v3_on_2048_devices();
    mla.plan.context_parallel = 2;
    mla.devices *= 2;
    assert!(problems(&mla).is_empty(), "{:?}", problems(&mla));
    let g = graph(&mla);
    let m = mla.model.mla.unwrap();
    let t = mla.plan.tensor_parallel;
    let per_token = mla.model.heads / t * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim);
    let x = g.block.kv_exchange.unwrap();
    assert_eq!(
        x.bytes,
        mla.plan.micro_batch * mla.model.seq_len / 2 * per_token * 2
    );
    assert_eq!((x.group, x.stride), (2, t));
    // Multi-token prediction's block exchanges too, once per depth.
    assert_eq!(g.mtp.as_ref().unwrap().kv_exchange.unwrap().count, 1);
}

/// The FP8 recipes in closed form on GPT-3 175B (h = 12,288, s = 2,048; dense, non-gated,
/// unfused attention) at t = 8:
/// * the quantised weights of a block are its four GEMMs' `12h²/t` (no bias, no norm), the
///   stage's those of its blocks; with ZeRO-1 state bytes per parameter are bf16's
///   (2 + 4 + 12/d) and the copies add 2 bytes (FP8: the weight and its transpose) or
///   2 × 33/32 (MXFP8: row- and column-wise blocks) per quantised weight;
/// * each block keeps its four GEMMs' inputs in the recipe's type instead of bf16: the
///   two normed inputs (`sbh`, a t-th of it with sequence parallelism), the attention's
///   context (`sbh/t`) and the GeLU's output (`4sbh/t`);
/// * the step casts the quantised weights once (a cast of that many elements) and runs
///   every quantised GEMM in the recipe's type, at half the 16-bit time with this model.
#[test]
fn fp8_recipes_closed_form() {
    let (h, s, t) = (12_288u64, 2_048u64, 8u64);
    for sp in [false, true] {
        let mut pl = plan(t, 16, 8);
        pl.sequence_parallel = sp;
        pl.recomputation = Recomputation::None;
        pl.distributed_optimizer = true;
        let bf16 = graph(&gpt3(pl.clone(), 1 << 20));
        let rep = |e: u64| if sp { e / t } else { e };
        for (precision, bytes) in [(Precision::Fp8Hybrid, 1.0), (Precision::Mxfp8, 33.0 / 32.0)] {
            let mut q = pl.clone();
            q.precision = precision;
            let g = graph(&gpt3(q.clone(), 1 << 20));
            assert_eq!(g.block.quantised_parameters, 12 * h * h / t);
            assert_eq!(
                g.embedding.quantised_parameters + g.head.quantised_parameters,
                0
            );
            assert_eq!(g.block.parameters, bf16.block.parameters);
            // Elements kept in the recipe's type instead of bf16 (2 bytes).
            let inputs = [rep(s * h), s * h / t, rep(s * h), 4 * s * h / t];
            let quantised: u64 = inputs
                .iter()
                .map(|&e| (e as f64 * bytes).ceil() as u64)
                .sum();
            let bf16_bytes: u64 = inputs.iter().map(|&e| 2 * e).sum();
            assert_eq!(
                g.block.stash_bytes,
                bf16.block.stash_bytes - bf16_bytes + quantised,
                "{precision:?}, sequence parallel {sp}"
            );
            let kept: Vec<&str> = g
                .block
                .kept
                .iter()
                .filter(|k| k.part == "quantised")
                .map(|k| k.needed_by[0].as_str())
                .collect();
            assert_eq!(kept, ["qkv", "attention_out", "fc1", "fc2"]);
            // Every GEMM of the block but the attention core's runs in the recipe's type,
            // forward and backward; those of the embedding and the head do not.
            let typed = |graph: &OpGraph| {
                graph
                    .nodes
                    .iter()
                    .filter(|n| n.op.element == precision.gemm_element())
                    .count()
            };
            assert_eq!(typed(&g.block.forward), 4);
            assert_eq!(typed(&g.block.backward), 8);
            assert_eq!(typed(&g.head.forward) + typed(&g.embedding.forward), 0);
            // With sequence parallelism the inputs of QKV and FC1 are cast on the rank's
            // shard and gathered in the recipe's type, forward and again backward for the
            // weight gradient; their gradients' reduce-scatters stay in bf16, and the
            // head's gather (a 16-bit GEMM's) too.
            let link = collective_bytes;
            for gather in ["attention_norm.copy_to_tp", "mlp_norm.copy_to_tp"] {
                let again = format!("{gather}.all_gather_again.grad");
                let (f16, f8) = (
                    link(&bf16.block.forward, gather),
                    link(&g.block.forward, gather),
                );
                let grad = format!("{gather}.grad");
                if !sp {
                    assert_eq!(f16, None);
                    assert_eq!(
                        link(&g.block.backward, &grad),
                        link(&bf16.block.backward, &grad)
                    );
                    continue;
                }
                let half = |b: u64| (b as f64 * bytes / 2.0).ceil() as u64;
                assert_eq!(f8, f16.map(half), "{gather}");
                assert_eq!(
                    link(&g.block.backward, &grad),
                    link(&bf16.block.backward, &grad)
                );
                assert_eq!(
                    link(&g.block.backward, &again),
                    link(&bf16.block.backward, &again).map(half)
                );
                // The shard's cast: fused into the norm before it (FP8, delayed scaling);
                // for MXFP8 a kernel of its own (Transformer Engine's norm writes MXFP8
                // only through cuDNN's, when asked).
                let norm = gather.trim_end_matches(".copy_to_tp");
                let node = |name: String| g.block.forward.nodes.iter().find(|n| n.name == name);
                if precision == Precision::Fp8Hybrid {
                    let fused = node(format!("{norm}+copy_to_tp.cast"))
                        .map(|n| n.op.fused.iter().map(|f| f.elements).collect::<Vec<_>>());
                    assert_eq!(fused, Some(vec![s * h / t]), "{gather}");
                } else {
                    let cast = node(format!("{gather}.cast")).map(|n| n.op.kind);
                    assert!(
                        matches!(cast, Some(OpKind::Cast(c)) if c.elements == s * h / t),
                        "{gather}: {cast:?}"
                    );
                }
            }
            assert_eq!(
                link(&g.head.forward, "logits.copy_to_tp"),
                link(&bf16.head.forward, "logits.copy_to_tp")
            );
            let r = estimate_step(&gpt3(q.clone(), 1 << 20), &Typed(ReferenceModel::default()))
                .unwrap();
            let base = estimate_step(
                &gpt3(pl.clone(), 1 << 20),
                &Typed(ReferenceModel::default()),
            )
            .unwrap();
            let stage = &r.stages[0];
            assert_eq!(stage.quantised_parameters, stage.blocks * 12 * h * h / t);
            let copies = stage.quantised_parameters as f64 * 2.0 * bytes;
            assert_eq!(
                stage.memory_bytes.weights,
                base.stages[0].memory_bytes.weights + copies
            );
            // The weight casts: one cast of the busiest stage's quantised weights.
            let most = r
                .stages
                .iter()
                .map(|s| s.quantised_parameters)
                .max()
                .unwrap();
            let cast = Op::new(
                OpKind::Cast(Cast {
                    elements: most,
                    to: precision.gemm_element(),
                    amax_pass: false,
                }),
                Direction::Forward,
            );
            let want = Typed(ReferenceModel::default())
                .latency(
                    &REFERENCE_CONFIG.vector_core(REFERENCE_CONFIG.vector_cores),
                    &[cast],
                )
                .unwrap()[0]
                .seconds;
            assert_eq!(r.time.weight_cast_seconds, want);
            assert_eq!(base.time.weight_cast_seconds, 0.0);
            // With delayed scaling every cast of this model is some kernel's epilogue.
            assert!(r.operator_seconds.casts >= r.time.weight_cast_seconds);
            assert_eq!(base.operator_seconds.casts, 0.0);
            assert!(r.operator_seconds.other_gemm < 0.6 * base.operator_seconds.other_gemm);
            assert_eq!(r.model_flops_per_step, base.model_flops_per_step);
        }
    }
}

/// Current scaling makes every cast a kernel of its own, which reads its input once more
/// for the maximum unless the kernel writing it took the maximum (a norm, an activation,
/// an element-wise kernel: Transformer Engine's fused amax); it changes no memory and no
/// GEMM.
#[test]
fn current_scaling_takes_each_maximum_where_transformer_engine_does() {
    let mut pl = plan(8, 16, 8);
    pl.precision = Precision::Fp8Hybrid;
    let delayed = graph(&gpt3(pl.clone(), 1 << 20));
    pl.fp8_scaling = Fp8Scaling::Current;
    let current = graph(&gpt3(pl.clone(), 1 << 20));
    assert_eq!(delayed.block.stash_bytes, current.block.stash_bytes);
    let casts = casts_in;
    for (d, c) in [
        (&delayed.block.forward, &current.block.forward),
        (&delayed.block.backward, &current.block.backward),
    ] {
        assert!(casts(d).iter().all(|c| !c.amax_pass));
        assert!(casts(c).len() >= casts(d).len());
    }
    // The one cast that reads its input twice: the attention's context (FlashAttention
    // writes no maximum), s·h/t elements. The normed inputs, the GeLU's output and the
    // output gradients (after the bias gradients' kernels) come with their maximum.
    let twice = |g: &OpGraph| -> Vec<u64> {
        casts(g)
            .iter()
            .filter(|c| c.amax_pass)
            .map(|c| c.elements)
            .collect()
    };
    assert_eq!(twice(&current.block.forward), [2_048 * 12_288 / 8]);
    assert!(twice(&current.block.backward).is_empty());
    // Not fusable with current scaling: the four GEMM inputs (h = 12,288, s = 2,048,
    // t = 8: the normed inputs whole, the context and the GeLU's output a t-th) and the
    // four GEMMs' output gradients (QKV 3h/t, the projection's and fc2's h, fc1's 4h/t).
    let (h, s, t) = (12_288u64, 2_048u64, 8u64);
    let forward: u64 = casts(&current.block.forward)
        .iter()
        .map(|c| c.elements)
        .sum();
    assert_eq!(forward, s * h + s * h / t + s * h + 4 * s * h / t);
    let backward: u64 = casts(&current.block.backward)
        .iter()
        .map(|c| c.elements)
        .sum();
    assert_eq!(backward, 3 * s * h / t + s * h + 4 * s * h / t + s * h);
    // Without FP8 the setting does nothing.
    pl.precision = Precision::Mxfp8;
    let mx = graph(&gpt3(pl, 1 << 20));
    assert!(casts(&mx.block.backward).iter().all(|c| !c.amax_pass));
}

/// FP8 parameters (`fp8_param_gather`): the quantised weights' bf16 copy is gone (their
/// FP8 copy and its transpose replace it: 2 bytes less per quantised weight, 2 more), and
/// the distributed optimizer all-gathers those weights in FP8 — at the blocks' share of
/// quantised weights, one byte instead of two — so the weights' all-gather shrinks by
/// that share's half; the gradients' reduce-scatter does not change.
#[test]
fn fp8_parameters_drop_the_bf16_copy_and_gather_one_byte() {
    let mut pl = plan(8, 16, 8);
    pl.precision = Precision::Fp8Hybrid;
    pl.distributed_optimizer = true;
    let model = Typed(ReferenceModel::default());
    let copies = estimate_step(&gpt3(pl.clone(), 1 << 20), &model).unwrap();
    pl.fp8_param_gather = true;
    let fp8 = estimate_step(&gpt3(pl.clone(), 1 << 20), &model).unwrap();
    for (a, b) in copies.stages.iter().zip(&fp8.stages) {
        let q = a.quantised_parameters as f64;
        assert_eq!(b.memory_bytes.weights, a.memory_bytes.weights - 2.0 * q);
        assert_eq!(b.memory_bytes.gradients, a.memory_bytes.gradients);
    }
    let g = graph(&gpt3(pl.clone(), 1 << 20));
    let share = g.block.quantised_parameters as f64 / g.block.parameters as f64;
    assert!((gathered_weight_bytes(&pl, &g) - (2.0 - share)).abs() < 1e-12);
    assert!(share > 0.99, "{share}");
    assert!(
        fp8.time.data_parallel_communication_seconds
            < copies.time.data_parallel_communication_seconds
    );
    // The optimizer casts the shard it updated: an eighth of the busiest stage's.
    let most = copies
        .stages
        .iter()
        .map(|s| s.quantised_parameters)
        .max()
        .unwrap();
    let shard = Op::new(
        OpKind::Cast(Cast {
            elements: most.div_ceil(8),
            to: archplace_plugin_sdk::ElementType::Fp8,
            amax_pass: false,
        }),
        Direction::Forward,
    );
    let core = REFERENCE_CONFIG.vector_core(REFERENCE_CONFIG.vector_cores);
    let want = model.latency(&core, &[shard]).unwrap()[0].seconds;
    assert_eq!(fp8.time.weight_cast_seconds, want);
    // Without FP8 the setting changes nothing.
    pl.precision = Precision::Bf16Mixed;
    assert_eq!(gathered_weight_bytes(&pl, &g), 2.0);
}

/// With sequential operators and tensor-parallel overlap, each sequence-parallel
/// all-gather or reduce-scatter keeps only what pipelining with its GEMM leaves exposed
/// (`pipelined_exposure`, in `t` chunks), in both passes; the backward pass's extra
/// all-gather and every compute task keep their durations; without sequence parallelism
/// (all-reduces) or without the overlap nothing changes. The step reports the
/// collectives' whole time as traffic and less exposed.
#[test]
fn sequence_parallel_collectives_are_pipelined_with_their_gemm() {
    use crate::execution::{Execution, OperatorExecution, TensorParallelOverlap};
    use crate::model::Core;
    use crate::operators::{instance, pipelined_exposure};
    let (alone, overlapped) = (
        Execution {
            operators: OperatorExecution::Sequential,
            tensor_parallel_overlap: TensorParallelOverlap::None,
            kernels: Default::default(),
            fp8_library: Default::default(),
            cross_entropy: Default::default(),
            overlap_efficiency: Default::default(),
        },
        Execution {
            operators: OperatorExecution::Sequential,
            tensor_parallel_overlap: TensorParallelOverlap::Pipelined,
            kernels: Default::default(),
            fp8_library: Default::default(),
            cross_entropy: Default::default(),
            overlap_efficiency: Default::default(),
        },
    );
    let model = ReferenceModel::default();
    for sp in [true, false] {
        let mut pl = plan(8, 1, 1);
        pl.sequence_parallel = sp;
        pl.recomputation = Recomputation::None;
        let input = gpt3(pl.clone(), 80);
        let g = graph(&input);
        let mut shortened = 0;
        for layer in [&g.block.forward, &g.block.backward] {
            let a = instance(layer, &REFERENCE_CONFIG, alone, &model).unwrap();
            let b = instance(layer, &REFERENCE_CONFIG, overlapped, &model).unwrap();
            for (i, node) in layer.nodes.iter().enumerate() {
                let (full, now) = (a.tasks[i].parallel, b.tasks[i].parallel);
                if node.core != Core::Link || !node.pipelined {
                    assert_eq!(full, now, "{}", node.name);
                    continue;
                }
                assert!(sp, "{} pipelined without sequence parallelism", node.name);
                let next = |i: usize| layer.edges.iter().filter(move |e| e.0 == i).map(|e| e.1);
                let prev = |i: usize| layer.edges.iter().filter(move |e| e.1 == i).map(|e| e.0);
                let gemm = |ends: Vec<usize>| {
                    ends.into_iter()
                        .filter(|&j| matches!(layer.nodes[j].op.kind, OpKind::Gemm(_)))
                        .map(|j| a.tasks[j].parallel)
                        .reduce(f64::max)
                };
                let partner = gemm(next(i).collect()).or_else(|| gemm(prev(i).collect()));
                let Some(partner) = partner else {
                    let around: Vec<_> = next(i)
                        .chain(prev(i))
                        .map(|j| &layer.nodes[j].name)
                        .collect();
                    panic!("{} has no GEMM beside it: {around:?}", node.name);
                };
                let want = pipelined_exposure(full, partner, 8);
                assert!(rel(now, want) < 1e-12, "{}: {now} vs {want}", node.name);
                assert!(now < full);
                shortened += 1;
            }
        }
        // Two all-gathers and two reduce-scatters forward, their gradients backward.
        assert_eq!(shortened, if sp { 8 } else { 0 });
        let step = |execution| {
            let mut input = gpt3(pl.clone(), 4096);
            input.execution = execution;
            estimate_step(&input, &model).unwrap()
        };
        let (a, b) = (step(alone), step(overlapped));
        let traffic = |r: &StepReport| r.operator_seconds.tensor_parallel;
        assert!(rel(traffic(&a), traffic(&b)) < 1e-12);
        assert!(rel(a.time.tensor_parallel_communication_seconds, traffic(&a)) < 1e-12);
        assert!(b.time.tensor_parallel_communication_seconds < traffic(&b));
    }
}

/// PyTorch's asynchronous tensor parallelism: each sequence-parallel collective's GEMMs
/// — those whose rows are its tokens, not the weight gradients that sum over them — run
/// as 8 GEMMs of an eighth of their rows, priced by the model (so never faster than the
/// whole), and the collective keeps what the decomposition leaves: an all-gather
/// nothing while its GEMMs take longer than its transfers (the rank's own shard first,
/// `max(0, c − g·7/8)`), a reduce-scatter one chunk ([`pipelined_exposure`]); nothing else
/// changes. Beside the GEMMs at an `overlap_efficiency` of one half, the transfers hide
/// behind half the GEMMs' time (`max(0, c − g/2·7/8)`; the reduce-scatter's chunks as
/// [`pipelined_exposure`] with `g/2`), and Transformer Engine's pipelined chunks expose
/// more too. On the step: the same traffic as without overlap, less of it exposed, the
/// GEMMs' decomposition in the forward and backward time.
#[test]
fn async_tensor_parallelism_decomposes_the_collectives_gemms() {
    use crate::execution::{Execution, OperatorExecution, TensorParallelOverlap};
    use crate::model::Core;
    use crate::operators::{instance, pipelined_exposure};
    let at = |tensor_parallel_overlap| Execution {
        operators: OperatorExecution::Sequential,
        tensor_parallel_overlap,
        kernels: Default::default(),
        fp8_library: Default::default(),
        cross_entropy: Default::default(),
        overlap_efficiency: Default::default(),
    };
    let (alone, pipelined, decomposed) = (
        at(TensorParallelOverlap::None),
        at(TensorParallelOverlap::Pipelined),
        at(TensorParallelOverlap::Async),
    );
    let half = |e: Execution| Execution {
        overlap_efficiency: crate::execution::Fraction(0.5),
        ..e
    };
    let model = ReferenceModel::default();
    let mut pl = plan(8, 1, 1);
    pl.sequence_parallel = true;
    pl.recomputation = Recomputation::None;
    let g = graph(&gpt3(pl.clone(), 80));
    let (mut gathers, mut scatters, mut weight_gradients) = (0, 0, 0);
    for layer in [&g.block.forward, &g.block.backward] {
        let a = instance(layer, &REFERENCE_CONFIG, alone, &model).unwrap();
        let c = instance(layer, &REFERENCE_CONFIG, decomposed, &model).unwrap();
        let beside = instance(layer, &REFERENCE_CONFIG, half(decomposed), &model).unwrap();
        let chunked = instance(layer, &REFERENCE_CONFIG, half(pipelined), &model).unwrap();
        let mut gemms = std::collections::HashSet::new();
        for (i, node) in layer.nodes.iter().enumerate() {
            if node.core != Core::Link || !node.pipelined {
                continue;
            }
            let around = |forward: bool| -> Vec<usize> {
                layer
                    .edges
                    .iter()
                    .filter(|e| if forward { e.0 == i } else { e.1 == i })
                    .map(|e| if forward { e.1 } else { e.0 })
                    .filter(|&j| matches!(layer.nodes[j].op.kind, OpKind::Gemm(_)))
                    .collect()
            };
            let (mut partners, gathers_input) = match around(true) {
                fed if !fed.is_empty() => (fed, true),
                _ => (around(false), false),
            };
            assert!(!partners.is_empty(), "{}", node.name);
            // Transformer Engine's chunks, beside the longest of the GEMMs they feed or
            // drain, for half its time.
            let longest = partners
                .iter()
                .map(|&j| a.tasks[j].parallel)
                .fold(0.0, f64::max);
            let want = pipelined_exposure(a.tasks[i].parallel, 0.5 * longest, 8);
            assert!(
                rel(chunked.tasks[i].parallel, want) < 1e-12,
                "{}",
                node.name
            );
            // A weight gradient sums over the gathered tokens: not decomposed, and not
            // what the gather hides behind.
            let before = partners.len();
            partners.retain(|&j| !layer.nodes[j].name.contains(".grad_weight"));
            weight_gradients += before - partners.len();
            assert!(!partners.is_empty(), "{}", node.name);
            let mut gemm = 0.0;
            for &j in &partners {
                let OpKind::Gemm(whole) = layer.nodes[j].op.kind else {
                    unreachable!()
                };
                let mut shard = layer.nodes[j].op.clone();
                shard.kind = OpKind::Gemm(archplace_plugin_sdk::Gemm {
                    m: whole.m.div_ceil(8),
                    ..whole
                });
                let tc = REFERENCE_CONFIG.tensor_core(REFERENCE_CONFIG.tensor_cores);
                let one = crate::operators::estimate(&model, &tc, std::slice::from_ref(&shard))
                    .unwrap()[0]
                    .seconds;
                assert!(
                    rel(c.tasks[j].parallel, 8.0 * one) < 1e-12,
                    "{}",
                    layer.nodes[j].name
                );
                assert!(c.tasks[j].parallel >= a.tasks[j].parallel * (1.0 - 1e-12));
                gemm += c.tasks[j].parallel;
                gemms.insert(j);
            }
            let full = a.tasks[i].parallel;
            let exposure = |gemm: f64| {
                if gathers_input {
                    (full - gemm * 7.0 / 8.0).max(0.0)
                } else {
                    pipelined_exposure(full, gemm, 8)
                }
            };
            if gathers_input {
                gathers += 1;
            } else {
                scatters += 1;
            }
            for (got, want) in [
                (c.tasks[i].parallel, exposure(gemm)),
                (beside.tasks[i].parallel, exposure(0.5 * gemm)),
            ] {
                assert!(
                    got == want || rel(got, want) < 1e-12,
                    "{}: {got} vs {want}",
                    node.name
                );
            }
        }
        // Nothing but the collectives and their GEMMs changes.
        for (k, node) in layer.nodes.iter().enumerate() {
            let changed = gemms.contains(&k) || (node.core == Core::Link && node.pipelined);
            if !changed {
                assert_eq!(a.tasks[k].parallel, c.tasks[k].parallel, "{}", node.name);
            }
        }
    }
    // Backward, the output gradients' gathers feed the input gradients (decomposed) and
    // the weight gradients of the attention's output projection and of FC2 (not).
    assert!(
        gathers > 0 && scatters > 0 && weight_gradients == 2,
        "{gathers} gathers, {scatters} scatters, {weight_gradients} weight gradients"
    );
    let step = |execution| {
        let mut input = gpt3(pl.clone(), 4096);
        input.execution = execution;
        estimate_step(&input, &model).unwrap()
    };
    let (a, b, c) = (step(alone), step(pipelined), step(decomposed));
    let traffic = |r: &StepReport| r.operator_seconds.tensor_parallel;
    assert!(rel(traffic(&a), traffic(&c)) < 1e-12);
    let exposed = |r: &StepReport| r.time.tensor_parallel_communication_seconds;
    assert!(exposed(&c) < exposed(&a));
    for overlap in [pipelined, decomposed] {
        let (all, some) = (step(overlap), step(half(overlap)));
        assert!(exposed(&all) <= exposed(&some) && exposed(&some) < exposed(&a));
        assert!(rel(traffic(&some), traffic(&a)) < 1e-12);
    }
    let compute = |r: &StepReport| r.time.forward_seconds + r.time.backward_seconds;
    assert!(compute(&c) >= compute(&b) * (1.0 - 1e-12));
}

/// The pipelined exposure: one chunk of the collective behind a longer GEMM, the
/// collective less all but one chunk of a shorter GEMM, the whole collective in one chunk.
#[test]
fn pipelined_exposure_closed_form() {
    use crate::operators::pipelined_exposure;
    assert_eq!(pipelined_exposure(4.0, 8.0, 4), 1.0);
    assert_eq!(pipelined_exposure(8.0, 4.0, 4), 5.0);
    assert_eq!(pipelined_exposure(8.0, 4.0, 1), 8.0);
    assert_eq!(pipelined_exposure(8.0, 4.0, 0), 8.0);
    assert_eq!(pipelined_exposure(0.0, 4.0, 8), 0.0);
}

/// With `pipeline_parallel_overlap` and interleaving, a micro-batch exposes only the
/// transfers its stage's work does not cover, the bubble still waits for all of them,
/// and nothing else moves; plain 1F1B is unchanged.
#[test]
fn pipeline_overlap_hides_the_steady_states_transfers() {
    let run = |v: u64, overlap: bool, inter_node: f64| {
        let mut pl = plan(8, 8, 8);
        pl.interleaving = v;
        pl.pipeline_parallel_overlap = overlap;
        let mut input = gpt3(pl, 80);
        input.network.inter_node.bytes_per_second = inter_node;
        estimate_step(&input, &ReferenceModel::default()).unwrap()
    };
    // A fast network (transfers hidden) and a very slow one (they are not).
    for inter_node in [25e9, 1e7] {
        let (a, b) = (run(2, false, inter_node), run(2, true, inter_node));
        let m = a.micro_batches_per_replica as f64;
        let slowest = |r: &StepReport| {
            r.stages
                .iter()
                .map(|s| s.seconds_per_micro_batch)
                .fold(0.0, f64::max)
        };
        let p2p = a.time.pipeline_point_to_point_seconds / m;
        assert!(p2p > 0.0);
        // Every stage sends as much: the slowest does the most work besides, and with the
        // overlap each stage takes the longer of its work and its transfers.
        let work = slowest(&a) - p2p;
        let sent = (p2p - work).max(0.0);
        assert!(rel(slowest(&b), work.max(p2p)) < 1e-12);
        let exposed = b.time.pipeline_point_to_point_seconds / m;
        assert!(exposed >= sent - 1e-15 && exposed <= p2p);
        assert!(
            rel(
                b.time.pipeline_bubble_seconds,
                7.0 / 2.0 * (slowest(&b) - exposed + p2p)
            ) < 1e-12
        );
        for (x, y) in a.stages.iter().zip(&b.stages) {
            let work = x.seconds_per_micro_batch - p2p;
            assert!(rel(y.seconds_per_micro_batch, work.max(p2p)) < 1e-12);
        }
        assert!(rel(b.time.total(), b.step_seconds) < 1e-12);
        if inter_node < 1e9 {
            assert!(sent > 0.0, "a slow network leaves transfers exposed");
        } else {
            assert_eq!(b.time.pipeline_point_to_point_seconds, 0.0);
        }
        assert!(b.step_seconds < a.step_seconds);
    }
    // Plain 1F1B: Megatron-LM runs its transfers exposed either way.
    let (a, b) = (run(1, false, 25e9), run(1, true, 25e9));
    assert_eq!(a.time, b.time);
}

/// Every schedule's timeline: each stage's passes add up to its time per micro-batch
/// times the micro-batches (DualPipe's to at most the pipeline), passes of a stage never
/// overlap, and the last span ends at the step time.
#[test]
fn each_schedules_timeline_adds_up_to_the_estimate() {
    use crate::pipeline::PipelineSchedule as S;
    use crate::step::timeline::estimate_step_timeline;
    for s in S::ALL {
        for recompute in [Recomputation::None, Recomputation::Full] {
            let mut pl = plan(8, 4, 4);
            pl.pipeline_schedule = s;
            pl.interleaving = if s == S::Interleaved { 2 } else { 1 };
            pl.recomputation = recompute;
            let input = gpt3(pl, 1 << 20);
            let latency = ReferenceModel::default();
            let (report, timeline) = estimate_step_timeline(&input, &latency).unwrap();
            assert_eq!(report, estimate_step(&input, &latency).unwrap(), "{s:?}");
            let end = timeline
                .spans
                .iter()
                .map(|x| x.start_seconds + x.duration_seconds)
                .fold(0.0, f64::max);
            assert!(
                rel(end, report.step_seconds) < 1e-9,
                "{s:?}: {end} vs {}",
                report.step_seconds
            );
            let m = report.micro_batches_per_replica as f64;
            for stage in &report.stages {
                let busy = timeline.busy_seconds(stage.stage);
                if s.overlaps_chunks() {
                    assert!(busy <= timeline.pipeline_seconds * (1.0 + 1e-9));
                    assert!(busy >= m * stage.seconds_per_micro_batch * (1.0 - 1e-9));
                } else {
                    assert!(
                        rel(busy, m * stage.seconds_per_micro_batch) < 1e-9,
                        "{s:?} stage {}: {busy} vs {}",
                        stage.stage,
                        m * stage.seconds_per_micro_batch
                    );
                }
                let mut mine: Vec<_> = timeline
                    .spans
                    .iter()
                    .filter(|x| x.stage == stage.stage)
                    .collect();
                mine.sort_by(|a, b| a.start_seconds.total_cmp(&b.start_seconds));
                for pair in mine.windows(2) {
                    let gap =
                        pair[1].start_seconds - (pair[0].start_seconds + pair[0].duration_seconds);
                    assert!(gap >= -1e-9 * report.step_seconds, "{s:?}: spans overlap");
                }
            }
            if s.splits_backward() {
                assert!(
                    timeline.spans.iter().any(|x| x.kind == "weight gradient"),
                    "{s:?}"
                );
            }
        }
    }
}

/// Zero-bubble's bubble is below 1F1B's at the same memory; DualPipe keeps two copies of
/// the weights.
#[test]
fn zero_bubble_shrinks_the_bubble_and_dualpipe_doubles_the_weights() {
    use crate::pipeline::PipelineSchedule as S;
    let run = |s: S| {
        let mut pl = plan(8, 4, 4);
        pl.pipeline_schedule = s;
        estimate_step(&gpt3(pl, 1 << 20), &ReferenceModel::default()).unwrap()
    };
    let (one, zb, dual) = (run(S::OneFOneB), run(S::ZeroBubble), run(S::DualPipe));
    assert!(zb.time.pipeline_bubble_seconds < one.time.pipeline_bubble_seconds);
    assert_eq!(zb.memory_bytes, one.memory_bytes);
    assert!(dual.time.pipeline_bubble_seconds < one.time.pipeline_bubble_seconds);
    let weights = |r: &StepReport| r.stages.iter().map(|s| s.parameters).sum::<u64>();
    assert_eq!(weights(&dual), 2 * weights(&one));
}

/// The FP8 recipes' casts on GPT-3 175B's block (t = 8): delayed scaling lets the norms
/// write theirs; every other recipe casts in kernels of their own. Current
/// scaling reads an input twice only where no kernel took its maximum; row-wise scales
/// read every input twice (the column-wise copy) and cast the weights at every
/// micro-batch; block-wise scales read every input once (a tile's maximum is local) and
/// cast the weights once per step. Their GEMMs are per-tensor FP8's.
#[test]
fn fp8_recipes_price_their_casts() {
    let mut pl = plan(8, 16, 8);
    pl.precision = Precision::Fp8Hybrid;
    pl.recomputation = Recomputation::None;
    let casts = casts_in;
    let (h, s, t) = (12_288u64, 2_048u64, 8u64);
    // The four GEMM inputs and the four output gradients (see
    // `current_scaling_takes_each_maximum_where_transformer_engine_does`).
    let all_forward = s * h + s * h / t + s * h + 4 * s * h / t;
    let all_backward = 3 * s * h / t + s * h + 4 * s * h / t + s * h;
    let model = Typed(ReferenceModel::default());
    let mut seconds = Vec::new();
    for recipe in Fp8Scaling::ALL {
        pl.fp8_scaling = recipe;
        let g = graph(&gpt3(pl.clone(), 1 << 20));
        let (f, b) = (casts(&g.block.forward), casts(&g.block.backward));
        let sum = |c: &[Cast]| c.iter().map(|c| c.elements).sum::<u64>();
        let twice = |c: &[Cast]| c.iter().filter(|c| c.amax_pass).count();
        match recipe {
            // The norms write their casts; the context's (after FlashAttention) and the
            // GeLU's output's (the GeLU runs in fc1's epilogue, which cuBLAS writes in
            // 16-bit) stand alone.
            Fp8Scaling::Delayed => {
                assert_eq!(sum(&f), s * h / t + 4 * s * h / t);
                assert_eq!(twice(&f) + twice(&b), 0);
            }
            Fp8Scaling::Current => {
                assert_eq!((sum(&f), sum(&b)), (all_forward, all_backward));
                assert_eq!(twice(&f) + twice(&b), 1);
            }
            Fp8Scaling::Rowwise => {
                assert_eq!((sum(&f), sum(&b)), (all_forward, all_backward));
                assert_eq!((twice(&f), twice(&b)), (f.len(), b.len()));
            }
            Fp8Scaling::Blockwise => {
                assert_eq!((sum(&f), sum(&b)), (all_forward, all_backward));
                assert_eq!(twice(&f) + twice(&b), 0);
            }
        }
        // The memory and the GEMMs do not change with the recipe (row-wise's rescaling
        // takes the GeLU's gradient out of fc2's input-gradient epilogue:
        // `rowwise_recipe_rescales_its_backward_products`).
        let r = estimate_step(&gpt3(pl.clone(), 1 << 20), &model).unwrap();
        seconds.push((recipe, r.operator_seconds.casts, r.time.weight_cast_seconds));
        let delayed = &seconds[0];
        if recipe == Fp8Scaling::Rowwise {
            continue;
        }
        assert_eq!(
            r.operator_seconds.other_gemm,
            estimate_step(
                &gpt3(
                    StepPlan {
                        fp8_scaling: Fp8Scaling::Delayed,
                        ..pl.clone()
                    },
                    1 << 20
                ),
                &model
            )
            .unwrap()
            .operator_seconds
            .other_gemm,
            "{recipe:?} {delayed:?}"
        );
    }
    let at = |r: Fp8Scaling| seconds.iter().find(|s| s.0 == r).copied().unwrap();
    let (delayed, current, rowwise, blockwise) = (
        at(Fp8Scaling::Delayed),
        at(Fp8Scaling::Current),
        at(Fp8Scaling::Rowwise),
        at(Fp8Scaling::Blockwise),
    );
    assert!(
        delayed.1 < blockwise.1 && blockwise.1 < current.1 && current.1 < rowwise.1,
        "{seconds:?}"
    );
    // The weights: once per step (delayed, block-wise: one read; current: two), at every
    // micro-batch with row-wise scales (two reads each).
    let micro_batches = gpt3(pl.clone(), 1 << 20).global_batch / (8 * pl.micro_batch);
    assert_eq!(delayed.2, blockwise.2);
    assert!(current.2 > delayed.2);
    assert!(
        (rowwise.2 - micro_batches as f64 * current.2).abs() < 1e-9 * rowwise.2,
        "{rowwise:?} {current:?} {micro_batches}"
    );
}

/// torchao's row-wise recipe rescales each quantised GEMM's two backward products in a
/// kernel of its own (cuBLAS's per-tensor kernel runs them with unit scales): on GPT-3
/// 175B's block (t = 8) one reads and writes every GEMM input's gradient — as many
/// elements as the inputs' casts — and one every weight's gradient; no GEMM takes them in
/// its epilogue, the breakdown counts them with the casts, and no other recipe has them.
#[test]
fn rowwise_recipe_rescales_its_backward_products() {
    let mut pl = plan(8, 16, 8);
    pl.precision = Precision::Fp8Hybrid;
    pl.recomputation = Recomputation::None;
    let (h, s, t) = (12_288u64, 2_048u64, 8u64);
    let model = Typed(ReferenceModel::default());
    let mut casts = Vec::new();
    for recipe in [Fp8Scaling::Current, Fp8Scaling::Rowwise] {
        pl.fp8_scaling = recipe;
        let g = graph(&gpt3(pl.clone(), 1 << 20));
        let rescales: Vec<&crate::model::OpNode> = g
            .block
            .backward
            .nodes
            .iter()
            .filter(|n| n.name.contains(".rescale"))
            .collect();
        let elements = |of: &str| {
            rescales
                .iter()
                .filter(|n| n.name.ends_with(of))
                .map(|n| match n.op.kind {
                    OpKind::Vector {
                        kind: VectorKind::Scale,
                        elements,
                        ..
                    } if n.op.element == archplace_plugin_sdk::ElementType::Bf16 => elements,
                    _ => panic!("{n:?}"),
                })
                .sum::<u64>()
        };
        if recipe == Fp8Scaling::Rowwise {
            assert_eq!(rescales.len(), 8, "{rescales:?}");
            assert!(rescales.iter().all(|n| n.work() == Work::Cast));
            assert_eq!(
                elements("grad_input.rescale"),
                s * h + s * h / t + s * h + 4 * s * h / t
            );
            assert_eq!(elements("grad_weight.rescale"), 12 * h * h / t);
        } else {
            assert!(rescales.is_empty(), "{rescales:?}");
        }
        let r = estimate_step(&gpt3(pl.clone(), 1 << 20), &model).unwrap();
        casts.push((r.operator_seconds.casts, g.block.backward.matmul_flops()));
    }
    // The GEMMs are the same; the row-wise casts and rescaling take longer.
    assert_eq!(casts[0].1, casts[1].1);
    assert!(casts[1].0 > casts[0].0, "{casts:?}");
}

/// Under sequence parallelism Transformer Engine's recipes and torchao's tensor-wise one
/// cast a quantised GEMM's input on the rank's shard and gather it in FP8; torchao's
/// row-wise recipe gathers the 16-bit tensor (torchtitan applies its float8 tensor-parallel
/// styles to tensor-wise scaling only) and casts all of it on every rank: on GPT-3 175B's
/// block (t = 8) QKV's and FC1's gathers move bf16's bytes and their casts take the
/// whole sequence, and the step is slower than with the gathers quantised.
#[test]
fn torchaos_rowwise_recipe_gathers_sequence_parallel_inputs_in_16_bits() {
    use crate::execution::Fp8Library;
    let (h, s, t) = (12_288u64, 2_048u64, 8u64);
    let model = Typed(ReferenceModel::default());
    let gathered = |g: &crate::model::ModelGraph, name: &str| {
        collective_bytes(&g.block.forward, name).unwrap()
    };
    let input = |precision, scaling, library| {
        let mut pl = plan(8, 16, 8);
        pl.sequence_parallel = true;
        pl.precision = precision;
        pl.fp8_scaling = scaling;
        let mut i = gpt3(pl, 1 << 20);
        i.execution.fp8_library = library;
        i
    };
    let bf16 = graph(&input(
        Precision::Bf16Mixed,
        Fp8Scaling::Current,
        Fp8Library::Torchao,
    ));
    let mut seconds = Vec::new();
    for (scaling, library) in [
        (Fp8Scaling::Current, Fp8Library::Torchao),
        (Fp8Scaling::Current, Fp8Library::TransformerEngine),
        (Fp8Scaling::Rowwise, Fp8Library::Torchao),
    ] {
        let i = input(Precision::Fp8Hybrid, scaling, library);
        let g = graph(&i);
        let casts = casts_in(&g.block.forward);
        for gather in ["attention_norm.copy_to_tp", "mlp_norm.copy_to_tp"] {
            let (f16, f8) = (gathered(&bf16, gather), gathered(&g, gather));
            if scaling == Fp8Scaling::Rowwise {
                assert_eq!(f8, f16, "{gather}");
            } else {
                assert_eq!(f8, f16.div_ceil(2), "{gather} {library:?}");
            }
        }
        // QKV's and FC1's inputs: the shard's cast before the gather, or the whole
        // gathered sequence's after it.
        let whole = casts.iter().filter(|c| c.elements == s * h).count();
        let shard = casts.iter().filter(|c| c.elements == s * h / t).count();
        if scaling == Fp8Scaling::Rowwise {
            assert_eq!(whole, 2, "{casts:?}");
        } else {
            assert_eq!(whole, 0, "{library:?} {casts:?}");
            assert!(shard >= 2, "{library:?} {casts:?}");
        }
        let r = estimate_step(&i, &model).unwrap();
        seconds.push(r.time.tensor_parallel_communication_seconds);
    }
    // The 16-bit gathers take longer than the FP8 ones.
    assert!(seconds[2] > seconds[0], "{seconds:?}");
    assert_eq!(seconds[0], seconds[1]);
}

/// The bytes of the collective `name` of a layer graph, if it has one by that name.
fn collective_bytes(graph: &OpGraph, name: &str) -> Option<u64> {
    graph
        .nodes
        .iter()
        .find(|n| n.name == name)
        .map(|n| match n.op.kind {
            OpKind::AllReduce { bytes, .. } => bytes,
            _ => panic!("{name} is not a collective"),
        })
}

/// The casts of a layer graph, in order.
fn casts_in(g: &OpGraph) -> Vec<Cast> {
    g.nodes
        .iter()
        .filter_map(|n| match n.op.kind {
            OpKind::Cast(c) => Some(c),
            _ => None,
        })
        .collect()
}

/// Every way of splitting `blocks` among `p` stages the step model accepts (inner stages
/// not empty, the ends may be).
fn splits(blocks: u64, p: u64) -> Vec<Vec<u64>> {
    if p == 1 {
        return vec![vec![blocks]];
    }
    let mut out = Vec::new();
    for first in 0..=blocks {
        for mut rest in splits(blocks - first, p - 1) {
            let mut split = vec![first];
            split.append(&mut rest);
            out.push(split);
        }
    }
    out.retain(|s| s[1..s.len() - 1].iter().all(|&b| b > 0));
    out
}

/// `most_blocks` (what a proven search rules plan shapes out by, and bounds their
/// slowest stage by) is at most the most loaded stage's blocks of every split that fits
/// the HBM, and `None` only when none does: every split of 8 GPT-3 blocks over 2 to 4
/// stages, under each recomputation, ZeRO stage and zero-bubble or 1F1B schedule, at HBM
/// sizes from nothing fits to everything does.
#[test]
fn most_blocks_bounds_every_split_that_fits() {
    let (mut checked, mut tighter, mut none) = (0, 0, 0);
    for p in 2..=4u64 {
        for recomputation in [
            Recomputation::None,
            Recomputation::Selective,
            Recomputation::Full,
        ] {
            for (zero, distributed) in [(0, false), (1, true), (3, false)] {
                for schedule in [PipelineSchedule::OneFOneB, PipelineSchedule::ZeroBubble] {
                    let mut pl = plan(8, p, 4);
                    pl.micro_batch = 4;
                    pl.recomputation = recomputation;
                    pl.distributed_optimizer = distributed;
                    pl.sharding.zero_stage = zero;
                    pl.pipeline_schedule = schedule;
                    let mut input = gpt3(pl, 0);
                    input.model.layers = 8;
                    input.global_batch = 64;
                    let g = graph(&input);
                    let n = input.global_batch / (input.plan.micro_batch * 4);
                    let fits = |hbm: u64, split: &[u64]| {
                        let mut at = input.clone();
                        at.hbm_bytes = hbm;
                        at.plan.stage_layers = Some(split.to_vec());
                        fitting_stages(&at, &g).is_ok()
                    };
                    for hbm_gib in (1..=64).map(|k| 4 * k) {
                        let hbm: u64 = hbm_gib << 30;
                        let mut at = input.clone();
                        at.hbm_bytes = hbm;
                        let least = most_blocks(&at, &g, &StageState::of(&at.plan), n);
                        let fitting: Vec<u64> = splits(8, p)
                            .into_iter()
                            .filter(|s| fits(hbm, s))
                            .map(|s| s.into_iter().max().unwrap_or(0))
                            .collect();
                        let at_p = format!(
                            "p {p}, {recomputation:?}, ZeRO {zero}, {schedule:?}, {hbm_gib} GiB"
                        );
                        match least {
                            None => {
                                assert!(fitting.is_empty(), "{at_p}: {fitting:?} fit");
                                none += 1;
                            }
                            Some(x) => {
                                if let Some(&best) = fitting.iter().min() {
                                    assert!(x <= best, "{at_p}: bound {x} above a split's {best}");
                                    tighter += usize::from(x > 8u64.div_ceil(p));
                                }
                            }
                        }
                        checked += 1;
                    }
                }
            }
        }
    }
    // Not vacuous: memory rules some shapes out, and pushes others' splits off the even one.
    assert!(checked >= 3000, "{checked}");
    assert!(
        none > 20 && tighter > 10,
        "{none} ruled out, {tighter} tightened of {checked}"
    );
}

/// Megatron-LM's block method (`recompute_layers`): each model chunk recomputes its first
/// N blocks and keeps every activation of the others. None of them recomputed is no
/// recomputation, to the byte and the second; N of a stage's 12 blocks run N/12 of full
/// recomputation's time and extra FLOPs, and keep what full recomputation keeps for those
/// N, everything for the rest.
#[test]
fn recompute_layers_reruns_the_first_blocks_of_each_chunk() {
    let model = ReferenceModel::default();
    let run = |r: Recomputation, layers: Option<u64>| {
        let mut pl = plan(8, 8, 8);
        pl.recomputation = r;
        pl.recompute_layers = layers;
        let input = gpt3(pl, 1 << 20);
        (graph(&input), estimate_step(&input, &model).unwrap())
    };
    let (g, full) = run(Recomputation::Full, None);
    let (_, none) = run(Recomputation::None, None);
    let (_, zero) = run(Recomputation::Full, Some(0));
    assert_eq!(zero.step_seconds, none.step_seconds);
    assert_eq!(zero.memory_bytes, none.memory_bytes);
    assert_eq!(zero.hardware_flops_per_step, none.hardware_flops_per_step);
    // Every block of a 12-block stage, or more: full recomputation.
    for n in [12, 96] {
        let (_, all) = run(Recomputation::Full, Some(n));
        assert_eq!(all.step_seconds, full.step_seconds, "{n}");
        assert_eq!(all.memory_bytes, full.memory_bytes, "{n}");
    }
    let (_, three) = run(Recomputation::Full, Some(3));
    let share = 3.0 / 12.0;
    assert!(
        rel(
            three.time.recomputation_seconds,
            share * full.time.recomputation_seconds
        ) < 1e-12
    );
    let extra = |r: &StepReport| r.hardware_flops_per_step - none.hardware_flops_per_step;
    assert!(rel(extra(&three), share * extra(&full)) < 1e-12);
    // The first stage holds 8 micro-batches in flight: each keeps 3 blocks' inputs and 9
    // blocks' everything; one block is rematerialised at a time.
    let (stash, kept) = (
        g.block.stash_bytes as f64,
        g.block.kept_bytes(Recomputation::Full) as f64,
    );
    let activations = |r: &StepReport| r.stages[0].memory_bytes.activations;
    let want = activations(&none) - 8.0 * 3.0 * (stash - kept) + (stash - kept);
    assert!(
        rel(activations(&three), want) < 1e-12,
        "{} {want}",
        activations(&three)
    );
    assert!(three.step_seconds > none.step_seconds && three.step_seconds < full.step_seconds);
}

/// Activation offloading (`activation_offload_layers`): the first N blocks' activations
/// leave the device (one block's come back at a time), and each block's copy — out
/// during the next block's forward pass, back during its backward pass — exposes what the
/// pass does not cover. A link fast enough hides all of it; on slow links the exposed time
/// grows by the copies' difference, both ways, for every offloaded block and micro-batch.
#[test]
fn offloaded_activations_leave_the_device_for_the_host_link_time() {
    let model = ReferenceModel::default();
    let run = |offload: u64, host: Option<f64>| {
        let mut pl = plan(8, 1, 8);
        pl.recomputation = Recomputation::None;
        pl.activation_offload_layers = offload;
        let mut input = gpt3(pl, 1 << 20);
        input.network.host_bytes_per_second = host;
        (graph(&input), estimate_step(&input, &model).unwrap())
    };
    let (g, kept) = run(0, Some(63e9));
    let stash = g.block.stash_bytes as f64;
    let (_, fast) = run(40, Some(1e18));
    assert_eq!(fast.time.activation_offload_seconds, 0.0);
    assert_eq!(fast.step_seconds, kept.step_seconds);
    // 40 blocks away, one back at a time.
    let saved = kept.memory_bytes.activations - fast.memory_bytes.activations;
    assert!(rel(saved, 39.0 * stash) < 1e-12, "{saved} {stash}");
    let (_, slow) = run(40, Some(1e8));
    let (_, slower) = run(40, Some(5e7));
    let micro_batches = 1536.0 / 8.0;
    let want = micro_batches * 40.0 * 2.0 * (stash / 5e7 - stash / 1e8);
    let copies = micro_batches * 40.0 * 2.0 * stash / 1e8;
    assert!(rel(slow.activation_offload_traffic_seconds, copies) < 1e-12);
    assert_eq!(kept.activation_offload_traffic_seconds, 0.0);
    let got = slower.time.activation_offload_seconds - slow.time.activation_offload_seconds;
    assert!(rel(got, want) < 1e-9, "{got} {want}");
    assert!(
        rel(
            slow.step_seconds - kept.step_seconds,
            slow.time.activation_offload_seconds
        ) < 1e-9
    );
    assert_eq!(slow.memory_bytes, fast.memory_bytes);
    assert_eq!(slow.time.limiting(), "activation offload");
}
