//! Transformer training graphs, built analytically from hyper-parameters (the reference's
//! layers, `docs/reference.md` §1, with its defects fixed, §3): no tracing, every shape
//! derived from the configuration.

// In their order: each imports only those before it (a tidy test checks it); one per
// group, as rustfmt would sort consecutive declarations.
pub mod config;

pub mod graph;

pub mod build;

pub use crate::training::Numerics;
pub use build::{
    AllToAll, BuildOptions, DISTINCT_LAYERS, ExpertLayout, KvExchange, Layer, LayerKind,
    ModelGraph, build,
};
pub use config::{
    Activation, AttentionKernel, Head, MAX_FLASH_HEAD_DIM, Mla, ModelConfig, Moe, Norm,
    NormPosition, PRESETS, Positions, preset,
};
pub use graph::{Core, KeptTensor, OpGraph, OpNode, Work};

#[cfg(test)]
// The published-figure comparisons print their deviations (shown with --nocapture).
#[allow(clippy::disallowed_macros)]
mod tests {
    use super::*;

    fn opts(b: u64, t: u64) -> BuildOptions {
        opts_sp(b, t, false)
    }

    fn opts_sp(b: u64, t: u64, sequence_parallel: bool) -> BuildOptions {
        BuildOptions {
            recompute_modules: Default::default(),
            micro_batch: b,
            tensor_parallel: t,
            numerics: Default::default(),
            link_bytes_per_second: 4 << 30,
            sequence_parallel,
            experts: Default::default(),
            context_parallel: 1,
            kernels: Default::default(),
            fp8_library: Default::default(),
            cross_entropy: Default::default(),
        }
    }

    fn total_parameters(name: &str) -> u64 {
        let cfg = preset(name).unwrap();
        build(&cfg, &opts(1, 1)).model_parameters_per_rank()
    }

    /// Eager PyTorch ([`crate::execution::KernelFusion::Eager`]): no operator in a GEMM's
    /// epilogue; RMSNorm as its eight kernels over fp32 copies, 36 bytes an element read
    /// and written against the fused kernel's 4 (the plugins' model: each vector kernel
    /// reads and writes its elements once), and the rotary embedding as its three; each
    /// backward chain the forward's in reverse; LayerNorm and GELU keep their one kernel;
    /// the matrix work and the stash are the fused graph's.
    #[test]
    fn eager_pytorch_runs_each_operator_as_its_own_kernels() {
        use crate::execution::KernelFusion;
        use archplace_plugin_sdk::OpKind;
        let eager_opts = BuildOptions {
            kernels: KernelFusion::Eager,
            ..opts(2, 1)
        };
        let block = |name: &str, o: &BuildOptions| {
            let g = build(&preset(name).unwrap(), o);
            g.layers()
                .find(|l| l.kind == LayerKind::Block)
                .unwrap()
                .clone()
        };
        let bytes = |g: &OpGraph, prefix: &str| -> f64 {
            g.nodes
                .iter()
                .filter(|n| n.name == prefix || n.name.starts_with(&format!("{prefix}.")))
                .map(|n| match n.op.kind {
                    OpKind::Vector { elements, .. } => 2.0 * n.op.element.bytes() * elements as f64,
                    _ => panic!("{} is not a vector operator", n.name),
                })
                .sum()
        };
        let names = |g: &OpGraph, prefix: &str| -> Vec<String> {
            g.nodes
                .iter()
                .filter(|n| n.name.starts_with(&format!("{prefix}.")))
                .map(|n| n.name.clone())
                .collect()
        };
        let (fused, eager) = (
            block("llama3-8b", &opts(2, 1)),
            block("llama3-8b", &eager_opts),
        );
        assert!(fused.forward.nodes.iter().any(|n| !n.op.fused.is_empty()));
        for g in [&eager.forward, &eager.backward] {
            assert!(
                g.nodes.iter().all(|n| n.op.fused.is_empty()),
                "{:?}",
                g.nodes
            );
        }
        let norm = [
            "float",
            "pow",
            "mean",
            "add_eps",
            "rsqrt",
            "normalize",
            "type_as",
            "weight",
        ]
        .map(|k| format!("attention_norm.{k}"));
        assert_eq!(names(&eager.forward, "attention_norm"), norm);
        let ratio =
            bytes(&eager.forward, "attention_norm") / bytes(&fused.forward, "attention_norm");
        // 36 bytes an element, and the two per-row kernels' 16 per row of 4,096.
        assert!(
            (ratio - (36.0 + 16.0 / 4096.0) / 4.0).abs() < 1e-9,
            "{ratio}"
        );
        assert_eq!(
            names(&eager.forward, "rotary"),
            ["rotary.float", "rotary.complex_mul", "rotary.type_as"]
        );
        let rotary = bytes(&eager.forward, "rotary") / bytes(&fused.forward, "rotary");
        assert!((rotary - 20.0 / 4.0).abs() < 1e-9, "{rotary}");
        // Backward: the weight's product's gradient first, the input cast's last.
        let back: Vec<String> = norm.iter().rev().map(|n| format!("{n}.grad")).collect();
        assert_eq!(names(&eager.backward, "attention_norm"), back);
        assert_eq!(eager.forward.matmul_flops(), fused.forward.matmul_flops());
        assert_eq!(eager.backward.matmul_flops(), fused.backward.matmul_flops());
        assert_eq!(eager.stash_bytes, fused.stash_bytes);

        // GPT-3's LayerNorm and GELU are native kernels: one each, now outside the GEMMs.
        let gpt = block("gpt3-175b", &eager_opts);
        assert!(gpt.forward.node("attention_norm").is_some());
        assert!(names(&gpt.forward, "attention_norm").is_empty());
        let fused_gpt = block("gpt3-175b", &opts(2, 1));
        assert!(
            gpt.forward.nodes.len() > fused_gpt.forward.nodes.len(),
            "{} kernels eager, {} fused",
            gpt.forward.nodes.len(),
            fused_gpt.forward.nodes.len()
        );
    }

    /// torchao's Float8 ([`crate::execution::Fp8Library::Torchao`]) against Transformer
    /// Engine's, tensor-wise: the same GEMMs in FP8, but each quantised GEMM saves its
    /// 16-bit input (Transformer Engine an FP8 copy, one byte an element), so the stash is
    /// bf16's to the byte — a 16-bit input another operator saves too is kept once — and
    /// the backward pass casts each such input again (one cast node more per forward
    /// cast); the row-wise recipe is torchao's whatever the library says.
    #[test]
    fn torchao_saves_16_bit_inputs_and_casts_them_again_backward() {
        use crate::execution::Fp8Library;
        use crate::training::{Fp8Scaling, Precision};
        let cfg = preset("llama3-8b").unwrap();
        let fp8 = |library, scaling| BuildOptions {
            numerics: Precision::Fp8Hybrid.numerics(scaling),
            fp8_library: library,
            cross_entropy: Default::default(),
            ..opts(2, 1)
        };
        let block = |o: &BuildOptions| build(&cfg, o).block.clone();
        let te = block(&fp8(Fp8Library::TransformerEngine, Fp8Scaling::Current));
        let ao = block(&fp8(Fp8Library::Torchao, Fp8Scaling::Current));
        let bf16 = block(&opts(2, 1));
        // The quantised GEMMs' saved inputs: half their 16-bit bytes with Transformer
        // Engine, all of them with torchao.
        let quantised: u64 = te
            .kept
            .iter()
            .filter(|k| k.part == "quantised")
            .map(|k| k.bytes)
            .sum();
        assert!(quantised > 0);
        assert!(ao.stash_bytes > te.stash_bytes);
        assert!(ao.stash_bytes - te.stash_bytes <= quantised);
        assert!(ao.kept.iter().all(|k| k.part != "quantised"));
        assert_eq!(ao.stash_bytes, bf16.stash_bytes);
        let casts = |g: &OpGraph| {
            g.nodes
                .iter()
                .filter(|n| matches!(n.op.kind, archplace_plugin_sdk::OpKind::Cast(_)))
                .count()
        };
        assert_eq!(casts(&ao.forward), casts(&te.forward));
        assert_eq!(
            casts(&ao.backward),
            casts(&te.backward) + casts(&te.forward)
        );
        assert_eq!(ao.forward.matmul_flops(), te.forward.matmul_flops());
        // Row-wise: torchao's, saving 16-bit inputs, its forward cast writing both copies.
        let rowwise = |library| block(&fp8(library, Fp8Scaling::Rowwise));
        let (r_te, r_ao) = (
            rowwise(Fp8Library::TransformerEngine),
            rowwise(Fp8Library::Torchao),
        );
        assert_eq!(r_te.stash_bytes, r_ao.stash_bytes);
        assert_eq!(r_te.stash_bytes, bf16.stash_bytes);
        assert_eq!(casts(&r_ao.backward), casts(&r_te.backward));
    }

    /// Published parameter counts, within 0.5%.
    /// The kept tensors listed per layer are the stash, exactly: all of them add up to
    /// `stash_bytes`, those outside the attention core to `selective_stash_bytes`, and each
    /// names an operator of the forward graph whose backward pass reads it.
    #[test]
    fn kept_tensors_add_up_to_the_stash() {
        for name in ["gpt3-175b", "llama2-70b", "bert-large"] {
            for (b, t) in [(1, 1), (2, 8)] {
                let g = build(&preset(name).unwrap(), &opts(b, t));
                for l in g.layers() {
                    let all: u64 = l.kept.iter().map(|k| k.bytes).sum();
                    let selective: u64 = l
                        .kept
                        .iter()
                        .filter(|k| !k.recomputed)
                        .map(|k| k.bytes)
                        .sum();
                    assert_eq!(all, l.stash_bytes, "{name} {:?}", l.kind);
                    assert_eq!(selective, l.selective_stash_bytes, "{name} {:?}", l.kind);
                    assert!(l.kept.iter().all(|k| !k.needed_by.is_empty()));
                }
                assert!(g.block.kept.len() > 5, "{name}");
            }
        }
    }

    #[test]
    fn parameters_match_published_counts() {
        let published = [
            ("gpt3-175b", 174.6e9),  // Brown et al. 2020
            ("llama2-7b", 6.74e9),   // Touvron et al. 2023
            ("llama2-70b", 68.98e9), // Touvron et al. 2023
            // Meta's model cards for Llama 3 8B and 70B (8.03 B, 70.6 B) and Dubey et al.
            // 2024 for Llama 3.1 405B (405 B).
            ("llama3-8b", 8.03e9),
            ("llama3-70b", 70.6e9),
            ("llama3-405b", 405e9),
            ("bert-large", 335.1e6), // Devlin et al. 2019, with the pooler
            ("gpt2-xl", 1.558e9),
            ("opt-350m", 331e6), // Zhang et al. 2022
            ("opt-1.3b", 1.316e9),
        ];
        for (name, want) in published {
            let got = total_parameters(name) as f64;
            let rel = (got - want) / want;
            eprintln!(
                "{name}: {got:.4e} parameters, published {want:.4e} ({:+.3}%)",
                rel * 100.0
            );
            assert!(
                rel.abs() < 0.005,
                "{name}: {got} vs {want} ({:.3}%)",
                rel * 100.0
            );
        }
    }

    /// Mixture-of-Experts presets: the total parameters within 0.5% of the published
    /// count, and the parameters a token goes through ("active") within one unit of the
    /// published figure's last digit (they are published to two or three significant
    /// digits, "12.9B", "3.3B"; Qwen3-30B-A3B's 3.35 B is published as "3.3B") and 2%.
    #[test]
    fn moe_parameters_match_published_counts() {
        let published = [
            // Jiang et al. 2024 and Mistral AI's announcement: 46.7 B total, 12.9 B active.
            ("mixtral-8x7b", 46.7e9, 12.9e9, 0.1e9),
            // Mistral AI's announcement of Mixtral 8x22B: 141 B total, 39 B active.
            ("mixtral-8x22b", 141e9, 39e9, 1e9),
            // The Qwen3 model cards: 30.5 B total, 3.3 B activated; 235 B, 22 B.
            ("qwen3-30b-a3b", 30.5e9, 3.3e9, 0.1e9),
            ("qwen3-235b-a22b", 235e9, 22e9, 1e9),
            // DeepSeek-AI 2024: 671 B total, 37 B activated per token (the main model; the
            // multi-token-prediction module's 14 B are not in it).
            ("deepseek-v3", 671e9, 37e9, 1e9),
        ];
        for (name, total, active, last_digit) in published {
            let cfg = preset(name).unwrap();
            let got = total_parameters(name) as f64;
            let got_active = got - cfg.inactive_parameters().unwrap() as f64;
            let (rel, rel_active) = ((got - total) / total, (got_active - active) / active);
            eprintln!(
                "{name}: {got:.4e} total ({:+.3}%), {got_active:.4e} active ({:+.3}%)",
                rel * 100.0,
                rel_active * 100.0
            );
            assert!(rel.abs() < 0.005, "{name}: {got} vs {total}");
            assert!(
                (got_active - active).abs() < last_digit && rel_active.abs() < 0.02,
                "{name}: {got_active} active vs {active}"
            );
        }
    }

    /// Megatron-LM's `--recompute-modules` on Llama-3-8B's block (one rank, 8,192
    /// tokens): "mlp" drops what the MLP keeps of itself — the gate and up projections'
    /// outputs and their product, `3·s·f` elements — keeping its normed input, and runs
    /// its three GEMMs again; "layernorm" drops both norms' outputs (`2·s·h`), which the
    /// GEMMs after them would keep. On Qwen3-30B-A3B, "moe_act" drops the experts'
    /// gated product (fc2's input), "moe" every tensor the MoE layer keeps of itself and
    /// reruns its exchanges. The kept tensors say which are recomputed.
    #[test]
    fn recompute_modules_keep_what_megatron_lm_keeps() {
        use crate::training::{Recomputation, RecomputeModule as M, RecomputeModules};
        let with = |name: &str, modules: &[M], o: BuildOptions| {
            build(
                &preset(name).unwrap(),
                &BuildOptions {
                    recompute_modules: RecomputeModules::of(modules.iter().copied()),
                    ..o
                },
            )
            .block
        };
        let llama = |m: &[M]| with("llama3-8b", m, opts(1, 1));
        let (s, h, f) = (8192u64, 4096u64, 14_336u64);
        let core = llama(&[M::CoreAttn]);
        let mlp = llama(&[M::CoreAttn, M::Mlp]);
        let norms = llama(&[M::CoreAttn, M::Layernorm]);
        assert_eq!(
            core.selective_stash_bytes - mlp.selective_stash_bytes,
            3 * s * f * 2
        );
        assert_eq!(
            core.selective_stash_bytes - norms.selective_stash_bytes,
            2 * s * h * 2
        );
        let rerun = |l: &Layer| {
            l.forward
                .nodes
                .iter()
                .map(|n| n.rerun_share(Recomputation::Selective) * n.matmul_flops())
                .sum::<f64>()
        };
        assert_eq!(rerun(&mlp) - rerun(&core), 3.0 * 2.0 * (s * h * f) as f64);
        assert_eq!(rerun(&norms), rerun(&core));
        assert!(
            norms
                .forward
                .nodes
                .iter()
                .any(|n| n.selective && n.name.starts_with("mlp_norm"))
        );
        for l in [&core, &mlp, &norms] {
            let recomputed: u64 = l
                .kept
                .iter()
                .filter(|k| k.recomputed)
                .map(|k| k.bytes)
                .sum();
            assert_eq!(recomputed, l.stash_bytes - l.selective_stash_bytes);
        }
        // Without the attention core, selective keeps it and reruns the MLP alone.
        let mlp_only = llama(&[M::Mlp]);
        assert_eq!(
            mlp_only.selective_stash_bytes,
            mlp_only.stash_bytes - 3 * s * f * 2
        );
        assert_eq!(rerun(&mlp_only), 3.0 * 2.0 * (s * h * f) as f64);
        let qwen = |m: &[M]| with("qwen3-30b-a3b", m, moe_opts(1, 1, 8, 1));
        let (core, act, moe) = (
            qwen(&[M::CoreAttn]),
            qwen(&[M::CoreAttn, M::MoeAct]),
            qwen(&[M::CoreAttn, M::Moe]),
        );
        let product = core
            .kept
            .iter()
            .find(|k| k.producer == "expert_gate_mul")
            .map(|k| k.bytes)
            .unwrap();
        assert_eq!(
            core.selective_stash_bytes - act.selective_stash_bytes,
            product
        );
        let moe_own: u64 = moe
            .kept
            .iter()
            .filter(|k| {
                k.recomputed
                    && !core
                        .kept
                        .iter()
                        .any(|c| c.producer == k.producer && c.part == k.part && c.recomputed)
            })
            .map(|k| k.bytes)
            .sum();
        assert!(moe_own > product, "{moe_own} {product}");
        assert_eq!(
            core.selective_stash_bytes - moe.selective_stash_bytes,
            moe_own
        );
        let modules = RecomputeModules::of([M::CoreAttn, M::Moe]);
        assert!(Recomputation::Selective.reruns_all_to_all(modules));
        assert!(!Recomputation::Selective.reruns_all_to_all(RecomputeModules::default()));
        assert!(!Recomputation::Selective.reruns_attention(RecomputeModules::of([M::Mlp])));
    }

    fn moe_opts(b: u64, t: u64, ep: u64, etp: u64) -> BuildOptions {
        BuildOptions {
            sequence_parallel: t > 1,
            experts: ExpertLayout {
                parallel: ep,
                tensor_parallel: etp,
                link_bytes_per_second: 4 << 30,
            },
            ..opts(b, t)
        }
    }

    /// A Mixture-of-Experts block on one rank against closed forms: the experts' parameters
    /// are `E/EP` experts of `3·h·f/ETP`; each all-to-all moves the rank's
    /// `b·s/t · k · h` elements (its sequence-parallel shard's tokens, `k` copies each);
    /// the grouped expert GEMMs run `6·h·f` FLOPs per routed copy forward, twice that
    /// backward; the router is an `h × E` GEMM.
    #[test]
    fn moe_block_matches_closed_forms() {
        for name in ["mixtral-8x7b", "qwen3-30b-a3b"] {
            let cfg = preset(name).unwrap();
            let m = cfg.moe.unwrap();
            let (h, f, e, k) = (cfg.hidden, m.expert_ffn, m.experts, m.experts_per_token);
            for (b, t, ep, etp) in [(1, 1, 1, 1), (2, 2, 4, 1), (1, 4, 8, 2), (1, 1, 8, 1)] {
                let g = build(&cfg, &moe_opts(b, t, ep, etp));
                let block = &g.block;
                let at = format!("{name} b{b} t{t} ep{ep} etp{etp}");
                assert_eq!(block.expert_parameters, e / ep * 3 * h * f / etp, "{at}");
                let tokens = b * cfg.seq_len / t;
                match block.all_to_all {
                    Some(a) => {
                        assert_eq!(a.bytes, tokens * k * h * 2, "{at}");
                        assert_eq!((a.group, a.stride), (ep, etp), "{at}");
                    }
                    None => assert_eq!(ep, 1, "{at}"),
                }
                let expert_flops = |graph: &OpGraph| -> f64 {
                    graph
                        .nodes
                        .iter()
                        .filter(|n| n.name.starts_with("expert_"))
                        .map(|n| n.matmul_flops())
                        .sum()
                };
                let per_copy = 6.0 * (h * f) as f64;
                let routed = (tokens * k) as f64;
                assert_eq!(expert_flops(&block.forward), per_copy * routed, "{at}");
                assert_eq!(
                    expert_flops(&block.backward),
                    2.0 * per_copy * routed,
                    "{at}"
                );
                let router = block
                    .forward
                    .nodes
                    .iter()
                    .find(|n| n.name == "router")
                    .unwrap();
                assert_eq!(router.matmul_flops(), 2.0 * (tokens * h * e) as f64, "{at}");
                assert_eq!(block.imbalance_matmul_flops, 0.0, "{at}");
            }
        }
    }

    /// With a routing imbalance `r` the busiest rank's experts receive `(E/EP − 1 + r)`
    /// times the mean tokens per expert (capped by a capacity factor): its grouped GEMMs
    /// and its all-to-all grow by that, the model's FLOPs count does not.
    #[test]
    fn routing_imbalance_loads_the_busiest_rank() {
        let mut cfg = preset("mixtral-8x7b").unwrap();
        let balanced = build(&cfg, &moe_opts(1, 1, 8, 1));
        let mut m = cfg.moe.unwrap();
        m.routing_imbalance = 1.5;
        cfg.moe = Some(m);
        let skewed = build(&cfg, &moe_opts(1, 1, 8, 1));
        let (a, b) = (
            balanced.block.all_to_all.unwrap(),
            skewed.block.all_to_all.unwrap(),
        );
        // One expert per rank: the busiest rank receives 1.5 times the mean.
        assert_eq!(2 * b.bytes, 3 * a.bytes);
        assert!(
            (skewed.block.forward.matmul_flops()
                - skewed.block.imbalance_matmul_flops
                - balanced.block.forward.matmul_flops())
            .abs()
                < 1.0
        );
        assert!(skewed.block.imbalance_matmul_flops > 0.0);
        assert_eq!(
            skewed.model_flops_per_micro_batch(),
            balanced.model_flops_per_micro_batch()
        );
        // A capacity factor of 1.25 caps the busiest expert.
        m.capacity_factor = Some(1.25);
        cfg.moe = Some(m);
        let capped = build(&cfg, &moe_opts(1, 1, 8, 1));
        assert_eq!(4 * capped.block.all_to_all.unwrap().bytes, 5 * a.bytes);
        // Two experts per rank: the busiest holds one at 1.5 and one at the mean.
        m.capacity_factor = None;
        cfg.moe = Some(m);
        let two = build(&cfg, &moe_opts(1, 1, 4, 1));
        assert_eq!(4 * two.block.all_to_all.unwrap().bytes, 5 * a.bytes);
    }

    /// DeepSeek-V3's attention (DeepSeek-AI 2024, §4.2 and its configuration: 128 heads,
    /// query latent 1,536, key-value latent 512, heads of 128 + 64 rotary, values of 128,
    /// hidden 7,168): 187,107,328 parameters with the two latent norms, exactly; split by
    /// heads over the tensor-parallel group but for the replicated down-projections; the
    /// fused core runs `2·b·a·s²·(192 + 128)` FLOPs forward before the causal mask.
    #[test]
    fn latent_attention_matches_deepseek_v3() {
        let mla = Mla {
            q_lora_rank: Some(1536),
            kv_lora_rank: 512,
            qk_nope_head_dim: 128,
            qk_rope_head_dim: 64,
            v_head_dim: 128,
        };
        let cfg = ModelConfig {
            name: "mla".into(),
            layers: 2,
            hidden: 7168,
            heads: 128,
            kv_heads: 128,
            ffn: 18432,
            attention: AttentionKernel::Mla,
            mla: Some(mla),
            ..preset("llama3-8b").unwrap()
        };
        let dense_mlp = 3 * 7168 * 18432;
        let norms = 2 * 7168;
        for t in [1, 2, 8] {
            let g = build(&cfg, &opts(1, t));
            let n = 128 / t;
            let down = 7168 * 1536 + 1536 + 7168 * 576 + 512;
            let up = 1536 * n * 192 + 512 * n * 256 + n * 128 * 7168;
            assert_eq!(
                g.block.parameters,
                down + up + dense_mlp / t + norms,
                "t = {t}"
            );
            if t == 1 {
                assert_eq!(down + up, 187_107_328);
            }
            let core = g.block.forward.node("flash_attention").unwrap();
            let s = cfg.seq_len as f64;
            assert_eq!(core.model_flops(), 2.0 * n as f64 * s * s * 320.0);
            // Q and K of 192 per head, V of 128, the output and its log-sum-exp are kept.
            let tok = cfg.seq_len;
            let kept: u64 = g
                .block
                .kept
                .iter()
                .filter(|k| k.producer.starts_with("rotary") || k.producer.starts_with("kv_up"))
                .map(|k| k.bytes)
                .sum();
            assert_eq!(kept, 2 * tok * n * (192 + 192 + 128));
        }
    }

    /// DeepSeek-V3's multi-token-prediction module (DeepSeek-AI 2024, §2.2; depth 1): one
    /// Mixture-of-Experts block, the `2h → h` projection and three norms (of the embedding,
    /// of the hidden state, before the shared head), placed before the head; the head's
    /// logits and loss cover twice the tokens, and it holds a copy of the untied input
    /// embedding that the module looks up, counted once. As released (with its own copies
    /// of the embedding and the output head) the module is the published 14 B (685 B − 671
    /// B, each rounded to a unit).
    #[test]
    fn multi_token_prediction_matches_its_closed_form() {
        let cfg = preset("deepseek-v3").unwrap();
        let (h, s) = (7168_u64, cfg.seq_len);
        for t in [1, 8] {
            let g = build(&cfg, &opts(1, t));
            let mtp = g.mtp.as_ref().unwrap();
            let v = cfg.vocab_per_rank(t);
            assert_eq!(g.mtp_depth, 1);
            assert_eq!(mtp.kind, LayerKind::Mtp);
            assert_eq!(mtp.parameters, g.block.parameters + 2 * h * h / t + 3 * h);
            assert_eq!(mtp.expert_parameters, g.block.expert_parameters);
            assert_eq!(mtp.all_to_all, g.block.all_to_all);
            let projection = 2.0 * s as f64 * (h / t) as f64 * (2 * h) as f64;
            assert_eq!(
                mtp.forward.matmul_flops(),
                g.block.forward.matmul_flops() + projection
            );
            let logits: f64 = g
                .head
                .forward
                .nodes
                .iter()
                .filter(|n| n.name.starts_with("logits"))
                .map(|n| n.matmul_flops())
                .sum();
            assert_eq!(logits, 2.0 * (2 * s) as f64 * v as f64 * h as f64);
            assert_eq!(g.head.parameters, h + 2 * v * h);
            assert_eq!(g.head.shared_parameters, v * h);
            // In pipeline order: the blocks, the module, the head.
            let kinds: Vec<LayerKind> = g.layers().map(|l| l.kind).collect();
            assert_eq!(kinds.len() as u64, cfg.layers + 3);
            assert_eq!(kinds[kinds.len() - 2], LayerKind::Mtp);
            assert_eq!(
                g.parameters_per_rank(),
                g.model_parameters_per_rank() + mtp.parameters
            );
        }
        let g = build(&cfg, &opts(1, 1));
        let released = g.mtp_parameters_per_rank() + 2 * cfg.vocab * h;
        assert!((13.0e9..14.5e9).contains(&(released as f64)), "{released}");
        // Without the module the model is the same but for the head's tokens and copy.
        let plain = build(
            &ModelConfig {
                mtp_depth: 0,
                ..cfg.clone()
            },
            &opts(1, 1),
        );
        assert_eq!(
            plain.model_parameters_per_rank(),
            g.model_parameters_per_rank()
        );
        assert!(plain.mtp.is_none() && plain.head.shared_parameters == 0);
    }

    #[test]
    fn exact_layer_parameters() {
        // Reference §9: per-layer parameters of BERT-large, Llama-2-7B and the BERT embedding.
        let bert = build(&preset("bert-large").unwrap(), &opts(3, 1));
        assert_eq!(bert.block.parameters, 12_596_224);
        assert_eq!(bert.embedding.parameters, 31_782_912);
        let llama = build(&preset("llama2-7b").unwrap(), &opts(3, 1));
        assert_eq!(llama.block.parameters, 202_383_360);
        assert_eq!(llama.embedding.parameters, 131_072_000);
    }

    /// Korthikanti et al. 2022, eq. (1) and (2): activation bytes stashed per GPT block are
    /// `s·b·h·(34 + 5·a·s/h)` at t = 1 and `s·b·h·(10 + 24/t + 5·a·s/(h·t))` with tensor
    /// parallelism.
    #[test]
    fn block_activations_match_korthikanti() {
        for name in ["gpt3-175b", "megatron-gpt2-8.3b", "gpt2-xl"] {
            let cfg = preset(name).unwrap();
            for b in [1, 2, 4] {
                for t in cfg.tensor_parallel_widths() {
                    let g = build(&cfg, &opts(b, t));
                    let (s, h, a) = (cfg.seq_len as f64, cfg.hidden as f64, cfg.heads as f64);
                    let (bf, tf) = (b as f64, t as f64);
                    let want = if t == 1 {
                        s * bf * h * (34.0 + 5.0 * a * s / h)
                    } else {
                        s * bf * h * (10.0 + 24.0 / tf + 5.0 * a * s / (h * tf))
                    };
                    assert_eq!(g.block.stash_bytes as f64, want, "{name} b={b} t={t}");
                }
            }
        }
    }

    /// Korthikanti et al. 2022, Table 2: activation bytes per GPT block for every
    /// recomputation with and without sequence parallelism, exactly. `sbh` times:
    /// none `10 + 24/t + 5as/(ht)` (sequence parallel `34/t + 5as/(ht)`), selective
    /// `10 + 24/t` (`34/t`), full `2` (the block input; with sequence parallelism Megatron-LM
    /// keeps its `1/t` shard: `2/t`). At t = 1 both columns are the same.
    #[test]
    fn kept_activations_match_korthikanti_table_2() {
        use crate::training::Recomputation;
        for name in [
            "gpt3-175b",
            "megatron-gpt2-8.3b",
            "megatron-gpt2-2.5b",
            "gpt2-xl",
        ] {
            let cfg = preset(name).unwrap();
            let (s, h, a) = (cfg.seq_len, cfg.hidden, cfg.heads);
            for b in [1, 2, 4] {
                for t in cfg.tensor_parallel_widths() {
                    // In integers (every division is exact: t divides h and a).
                    let sbh = s * b * h;
                    let core = 5 * a * s * s * b / t;
                    for sp in [false, true] {
                        let g = build(&cfg, &opts_sp(b, t, sp));
                        let (none, selective, full) = if sp && t > 1 {
                            (34 * sbh / t + core, 34 * sbh / t, 2 * sbh / t)
                        } else {
                            let kept = 10 * sbh + 24 * sbh / t;
                            (kept + core, kept, 2 * sbh)
                        };
                        for (r, want) in [
                            (Recomputation::None, none),
                            (Recomputation::Selective, selective),
                            (Recomputation::Full, full),
                        ] {
                            assert_eq!(
                                g.block.kept_bytes(r),
                                want,
                                "{name} b={b} t={t} sp={sp} {r:?}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Sequence parallelism changes neither the GEMMs nor the bytes the tensor-parallel
    /// collectives move (Korthikanti et al. 2022, §4.2.2): each all-reduce becomes an
    /// all-gather and a reduce-scatter.
    #[test]
    fn sequence_parallel_keeps_gemms_and_collective_volume() {
        let cfg = preset("gpt3-175b").unwrap();
        let link_bytes = |g: &OpGraph| -> u64 {
            g.nodes
                .iter()
                .filter_map(|n| match n.op.kind {
                    archplace_plugin_sdk::OpKind::AllReduce { bytes, .. } => Some(bytes),
                    _ => None,
                })
                .sum()
        };
        let plain = build(&cfg, &opts_sp(1, 8, false));
        let sp = build(&cfg, &opts_sp(1, 8, true));
        for (a, b) in [
            (&plain.block.forward, &sp.block.forward),
            (&plain.block.backward, &sp.block.backward),
        ] {
            assert_eq!(a.matmul_flops(), b.matmul_flops());
        }
        // Forward: the same bytes (each all-reduce becomes an all-gather and a
        // reduce-scatter of half its ring traffic). Backward: the column-parallel inputs
        // (QKV, first MLP) are all-gathered once more for their weight gradients — half an
        // all-reduce each, a quarter more than without sequence parallelism overall.
        assert_eq!(
            link_bytes(&plain.block.forward),
            link_bytes(&sp.block.forward)
        );
        assert_eq!(
            2 * link_bytes(&sp.block.backward),
            3 * link_bytes(&plain.block.backward)
        );
        // Two all-reduces forward and two backward become four collectives forward and
        // six backward.
        assert_eq!(sp.block.forward.count(Core::Link), 4);
        assert_eq!(sp.block.backward.count(Core::Link), 6);
        assert_eq!(sp.block.output_bytes * 8, plain.block.output_bytes);
    }

    /// Narayanan et al. 2021: forward + backward matrix-multiply FLOPs per iteration are
    /// `72·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))` without recomputation and 96 instead of 72 with
    /// full recomputation, within 1% for GPT-3 175B.
    #[test]
    fn gpt3_flops_match_narayanan() {
        let cfg = preset("gpt3-175b").unwrap();
        let global_batch = 1536.0;
        let b = 1;
        let g = build(&cfg, &opts(b, 1));
        let (s, l, h, v) = (
            cfg.seq_len as f64,
            cfg.layers as f64,
            cfg.hidden as f64,
            cfg.vocab as f64,
        );
        for (recompute, factor) in [(false, 72.0), (true, 96.0)] {
            let ours = g.matmul_flops_per_micro_batch(recompute) * global_batch / b as f64;
            let want =
                factor * global_batch * s * l * h * h * (1.0 + s / (6.0 * h) + v / (16.0 * l * h));
            let rel = (ours - want) / want;
            eprintln!(
                "recompute={recompute}: {ours:.5e} FLOPs vs {want:.5e} ({:+.4}%)",
                rel * 100.0
            );
            assert!(rel.abs() < 0.01, "recompute={recompute}: {rel}");
        }
    }

    #[test]
    fn tensor_parallel_shards_flops_and_adds_four_all_reduces_per_block() {
        let cfg = preset("megatron-gpt2-8.3b").unwrap();
        let one = build(&cfg, &opts(2, 1));
        let eight = build(&cfg, &opts(2, 8));
        let r = one.block.forward.matmul_flops() / eight.block.forward.matmul_flops();
        assert!((r - 8.0).abs() < 1e-9);
        assert_eq!(
            one.block.forward.count(Core::Link) + one.block.backward.count(Core::Link),
            0
        );
        assert_eq!(eight.block.forward.count(Core::Link), 2);
        assert_eq!(eight.block.backward.count(Core::Link), 2);
        // Vocabulary-parallel embedding (forward) and head (backward input gradient).
        assert_eq!(eight.embedding.forward.count(Core::Link), 1);
        assert!(eight.head.backward.count(Core::Link) >= 1);
    }

    /// The model-FLOPs count charges backward twice forward, whatever the attention
    /// kernel; the unfused kernels run exactly that.
    #[test]
    fn backward_has_twice_the_forward_gemm_work() {
        for name in PRESETS {
            let cfg = preset(name).unwrap();
            let g = build(&cfg, &opts(2, 1));
            let (f, bw) = (
                g.block.forward.model_flops(),
                g.block.backward.model_flops(),
            );
            assert!((bw / f - 2.0).abs() < 1e-12, "{name}: {bw} vs {f}");
            if cfg.attention == AttentionKernel::Unfused {
                let (f, bw) = (
                    g.block.forward.matmul_flops(),
                    g.block.backward.matmul_flops(),
                );
                assert!((bw / f - 2.0).abs() < 1e-12, "{name}: {bw} vs {f}");
            }
        }
    }

    /// FlashAttention against closed forms: a block keeps no `s × s` tensor — its stash is
    /// the unfused one less the scores' softmax output (and dropout mask), plus the fp32
    /// log-sum-exp, `4·b·a·s` bytes; the kernel runs `4·b·a·s²·d` FLOPs forward over the
    /// `(s + 1)/2s` a causal mask leaves, and 2.5 times that backward (the scores
    /// recomputed); the model-FLOPs count is the unmasked unfused one.
    #[test]
    fn flash_attention_keeps_no_scores_and_runs_what_the_mask_leaves() {
        for name in ["llama2-7b", "llama3-70b", "gpt3-175b"] {
            let mut flash = preset(name).unwrap();
            flash.attention = AttentionKernel::Flash;
            let unfused = ModelConfig {
                attention: AttentionKernel::Unfused,
                ..flash.clone()
            };
            for b in [1, 2] {
                for t in flash.tensor_parallel_widths() {
                    let (f, u) = (build(&flash, &opts(b, t)), build(&unfused, &opts(b, t)));
                    let (s, a, d) = (flash.seq_len, flash.heads / t, flash.head_dim());
                    let bpe = 2;
                    let scores = b * a * s * s;
                    // Unfused keeps the softmax output (and, with dropout, the dropped
                    // probabilities and a 1-byte mask).
                    let dropped = if flash.dropout { scores * (bpe + 1) } else { 0 };
                    let want = u.block.stash_bytes - scores * bpe - dropped + 4 * b * a * s;
                    assert_eq!(f.block.stash_bytes, want, "{name} b{b} t{t}");
                    // Selective recomputation reruns the kernel and drops its
                    // log-sum-exp (the output is the projection's input).
                    assert_eq!(
                        f.block.selective_stash_bytes,
                        f.block.stash_bytes - 4 * b * a * s
                    );
                    let node = |g: &OpGraph| g.node("flash_attention").unwrap().clone();
                    let (fwd, bwd) = (node(&f.block.forward), node(&f.block.backward));
                    let full = 4.0 * (b * a * s * s * d) as f64;
                    let kept = (s as f64 + 1.0) / (2.0 * s as f64);
                    assert!((fwd.matmul_flops() / (full * kept) - 1.0).abs() < 1e-12);
                    assert!((bwd.matmul_flops() / (2.5 * full * kept) - 1.0).abs() < 1e-12);
                    assert_eq!(fwd.model_flops(), full);
                    assert_eq!(bwd.model_flops(), 2.0 * full);
                    assert_eq!(
                        f.model_flops_per_micro_batch(),
                        u.matmul_flops_per_micro_batch(false)
                    );
                }
            }
        }
    }

    #[test]
    fn micro_batch_scales_every_gemm() {
        // The reference drops the micro-batch of 3-D linear layers (§6.1); we must not.
        let cfg = preset("llama2-7b").unwrap();
        let one = build(&cfg, &opts(1, 1));
        let four = build(&cfg, &opts(4, 1));
        for (a, b) in one
            .block
            .forward
            .nodes
            .iter()
            .zip(&four.block.forward.nodes)
        {
            assert_eq!(a.name, b.name);
            if a.matmul_flops() > 0.0 {
                assert_eq!(b.matmul_flops(), 4.0 * a.matmul_flops(), "{}", a.name);
            }
        }
    }

    #[test]
    fn gpt_block_fuses_like_megatron() {
        let cfg = preset("gpt3-175b").unwrap();
        let g = build(&cfg, &opts(1, 8));
        let names: Vec<&str> = g
            .block
            .forward
            .nodes
            .iter()
            .map(|n| n.name.as_str())
            .collect();
        assert!(names.contains(&"qkv+bias"), "{names:?}");
        assert!(names.contains(&"fc1+bias+activation"), "{names:?}");
        // The residual add has an operand from outside the layer: never fused into a GEMM.
        assert!(names.contains(&"residual_1"), "{names:?}");
        for n in &g.block.forward.nodes {
            assert_eq!(
                n.core == Core::Fused,
                !n.op.fused.is_empty() && n.matmul_flops() > 0.0,
                "{}",
                n.name
            );
        }
    }

    #[test]
    fn every_preset_has_consistent_graphs() {
        for name in PRESETS {
            let cfg = preset(name).unwrap();
            for t in cfg.tensor_parallel_widths() {
                let g = build(&cfg, &opts(1, t));
                for layer in g.distinct() {
                    for graph in [&layer.forward, &layer.backward] {
                        assert!(!graph.nodes.is_empty(), "{name} t={t} {:?}", layer.kind);
                        for &(a, b) in &graph.edges {
                            assert!(a < b, "edges follow the node order");
                        }
                    }
                }
            }
        }
    }
}
