//! Hyper-parameters of a transformer and the published presets.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    Gelu,
    Relu,
    Silu,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Norm {
    LayerNorm,
    RmsNorm,
}

/// Where the norm sits relative to the residual connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum NormPosition {
    /// `x + f(norm(x))`, with a final norm before the head (GPT, Llama, OPT ≥ 1.3B).
    Pre,
    /// `norm(x + f(x))` (BERT, OPT-350m).
    Post,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Positions {
    /// A learned table of `max_positions` position embeddings.
    Learned,
    /// Rotary embeddings applied to queries and keys (no parameters).
    Rotary,
}

/// How attention is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AttentionKernel {
    /// Scores, softmax and the product with the values as separate kernels: the `s × s`
    /// scores and probabilities go through memory and are kept for the backward pass
    /// (Megatron-LM before FlashAttention; the Korthikanti et al. 2022 activations).
    Unfused,
    /// One fused kernel (FlashAttention, Dao et al. 2022; Dao 2023): the scores stay on
    /// chip, only the output and its log-sum-exp are kept, backward recomputes the scores,
    /// and a causal mask skips half the products.
    Flash,
    /// Multi-head latent attention (DeepSeek-AI 2024, DeepSeek-V2 §2.1): queries and keys
    /// and values come from low-rank latent projections ([`Mla`]), with a decoupled rotary
    /// part; the core runs as one fused kernel, as `Flash`.
    Mla,
}

impl AttentionKernel {
    /// The name a spec writes.
    pub fn name(self) -> &'static str {
        match self {
            AttentionKernel::Unfused => "unfused",
            AttentionKernel::Flash => "flash",
            AttentionKernel::Mla => "mla",
        }
    }
}

/// The shapes of multi-head latent attention: queries through a `q_lora_rank` latent
/// (`None`: projected directly), keys and values through a `kv_lora_rank` latent shared by
/// all heads, each query and key head `qk_nope_head_dim + qk_rope_head_dim` wide (the
/// rotary part of the key shared by the heads), each value head `v_head_dim` wide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Mla {
    pub q_lora_rank: Option<u64>,
    pub kv_lora_rank: u64,
    pub qk_nope_head_dim: u64,
    pub qk_rope_head_dim: u64,
    pub v_head_dim: u64,
}

/// The largest head dimension a FlashAttention kernel takes: 256 for FlashAttention-2 (Dao
/// 2023, its README's "all head dimensions up to 256") and FlashAttention-3 (Shah et al.
/// 2024). The spec's validator refuses `attention = "flash"` beyond it.
pub const MAX_FLASH_HEAD_DIM: u64 = 256;

/// A Mixture-of-Experts feed-forward layer (Shazeer et al. 2017; Fedus et al. 2022;
/// Megatron-Core's `MoELayer`): a router picks `experts_per_token` of `experts` FFNs for
/// each token, the tokens are permuted to their experts (over the expert-parallel group by
/// an all-to-all), each expert runs its FFN on the tokens it received, and the outputs come
/// back weighted by the router's probabilities; `shared_experts` FFNs run on every token.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Moe {
    pub experts: u64,
    /// Top-k: experts each token is routed to.
    pub experts_per_token: u64,
    /// Each expert's FFN width (fine-grained experts are narrower than the dense FFN).
    pub expert_ffn: u64,
    /// Experts every token goes through, each `expert_ffn` wide (DeepSeek-V3: 1).
    pub shared_experts: u64,
    /// Tokens of the busiest expert over the mean (1: balanced). Dropless training with an
    /// auxiliary load-balancing loss runs a few tens of percent above 1
    /// (`docs/training-model.md` cites the measurements).
    pub routing_imbalance: f64,
    /// Each expert takes at most `capacity_factor` times the mean tokens and drops the
    /// rest (GShard, Switch Transformer); `None`: dropless.
    pub capacity_factor: Option<f64>,
}

impl Moe {
    /// The busiest expert's tokens over the mean: the imbalance, capped by the capacity.
    pub fn busiest_over_mean(&self) -> f64 {
        match self.capacity_factor {
            Some(c) => self.routing_imbalance.min(c),
            None => self.routing_imbalance,
        }
    }
}

/// What sits on top of the last block and produces the loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Head {
    /// Language-model logits over the vocabulary and cross-entropy.
    LanguageModel,
    /// BERT-style pooler (dense + tanh on the first token) and a classifier.
    Classifier { classes: u64 },
}

/// Every hyper-parameter of a model. Presets fill all of them; a spec may override any.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelConfig {
    pub name: String,
    pub layers: u64,
    pub hidden: u64,
    pub heads: u64,
    /// Key/value heads (grouped-query attention); equal to `heads` for multi-head attention.
    pub kv_heads: u64,
    /// Each head's dimension when it is not `hidden / heads` (Qwen3: 128 with 2,048-wide
    /// models of 32 heads); see [`ModelConfig::head_dim`].
    pub head_dim: Option<u64>,
    /// Queries and keys are RMS-normalised per head before the rotary embedding (Qwen3).
    pub qk_norm: bool,
    pub ffn: u64,
    pub vocab: u64,
    /// The vocabulary is padded to a multiple of `vocab_pad_multiple · t` (Megatron: 128).
    pub vocab_pad_multiple: u64,
    pub seq_len: u64,
    pub max_positions: u64,
    /// Gated MLP (SwiGLU): gate and up projections, their product, then down.
    pub gated_mlp: bool,
    pub activation: Activation,
    pub norm: Norm,
    pub norm_position: NormPosition,
    pub positions: Positions,
    pub biases: bool,
    pub tied_embeddings: bool,
    /// Token-type (segment) embeddings, 0 for none (BERT: 2).
    pub token_types: u64,
    /// Width of the word embedding when it differs from `hidden` (OPT-350m: 512, with
    /// projections in and out).
    pub embedding_dim: Option<u64>,
    pub head: Head,
    pub dropout: bool,
    /// How attention is computed.
    pub attention: AttentionKernel,
    /// Each token attends only to the tokens before it (decoders); a fused kernel skips the
    /// masked half.
    pub causal: bool,
    /// Largest tensor-parallel width to consider.
    pub max_tensor_parallel: u64,
    /// Every block's FFN is a Mixture-of-Experts layer (`None`: dense FFNs of `ffn`), but
    /// the first `dense_layers` blocks'.
    pub moe: Option<Moe>,
    /// With `moe`: the leading blocks whose FFN is dense, `ffn` wide (DeepSeek-V3: 3).
    pub dense_layers: u64,
    /// Multi-token prediction (DeepSeek-V3, §2.2): modules after the last block, each
    /// predicting one token further ahead with one more block of the repeated kind; 0 for
    /// none. They train with the model and are not part of its published parameter count.
    pub mtp_depth: u64,
    /// Multi-head latent attention's shapes (with `attention = Mla`).
    pub mla: Option<Mla>,
}

/// Names of all presets, in the order the docs list them.
pub const PRESETS: [&str; 17] = [
    "bert-large",
    "gpt2-xl",
    "opt-350m",
    "opt-1.3b",
    "llama2-7b",
    "llama2-70b",
    "llama3-8b",
    "llama3-70b",
    "llama3-405b",
    "mixtral-8x7b",
    "mixtral-8x22b",
    "qwen3-30b-a3b",
    "qwen3-235b-a22b",
    "deepseek-v3",
    "megatron-gpt2-2.5b",
    "megatron-gpt2-8.3b",
    "gpt3-175b",
];

/// A GPT-style decoder: pre-LN, GELU MLP of 4 × hidden, learned positions, biases, tied
/// embeddings, dropout, the GPT-2 vocabulary.
fn gpt(name: &str, layers: u64, hidden: u64, heads: u64, seq_len: u64) -> ModelConfig {
    ModelConfig {
        name: name.into(),
        layers,
        hidden,
        heads,
        kv_heads: heads,
        head_dim: None,
        qk_norm: false,
        ffn: 4 * hidden,
        vocab: 50257,
        vocab_pad_multiple: 1,
        seq_len,
        max_positions: seq_len,
        gated_mlp: false,
        activation: Activation::Gelu,
        norm: Norm::LayerNorm,
        norm_position: NormPosition::Pre,
        positions: Positions::Learned,
        biases: true,
        tied_embeddings: true,
        token_types: 0,
        embedding_dim: None,
        head: Head::LanguageModel,
        dropout: true,
        attention: AttentionKernel::Unfused,
        causal: true,
        max_tensor_parallel: 8,
        moe: None,
        dense_layers: 0,
        mtp_depth: 0,
        mla: None,
    }
}

/// Megatron-LM's GPT: the vocabulary padded to a multiple of 128 per rank.
fn megatron(
    name: &str,
    layers: u64,
    hidden: u64,
    heads: u64,
    seq_len: u64,
    max_t: u64,
) -> ModelConfig {
    ModelConfig {
        vocab_pad_multiple: 128,
        max_tensor_parallel: max_t,
        ..gpt(name, layers, hidden, heads, seq_len)
    }
}

/// A Llama-family shape: `(layers, hidden, heads, kv_heads, ffn)`.
type LlamaShape = (u64, u64, u64, u64, u64);

fn llama(
    name: &str,
    (layers, hidden, heads, kv_heads, ffn): LlamaShape,
    max_t: u64,
) -> ModelConfig {
    ModelConfig {
        kv_heads,
        ffn,
        gated_mlp: true,
        activation: Activation::Silu,
        norm: Norm::RmsNorm,
        positions: Positions::Rotary,
        biases: false,
        tied_embeddings: false,
        dropout: false,
        vocab: 32000,
        // Models of 2023 on were trained with fused attention kernels that keep no
        // attention weights (Llama: xformers' memory-efficient causal attention, Touvron
        // et al. 2023a, §2.4); their presets default to `flash`.
        attention: AttentionKernel::Flash,
        max_tensor_parallel: max_t,
        ..gpt(name, layers, hidden, heads, 4096)
    }
}

/// A Llama 3 shape: the Llama recipe with its 128,256-row vocabulary and 8,192-token
/// sequences.
fn llama3(name: &str, shape: LlamaShape) -> ModelConfig {
    ModelConfig {
        vocab: 128256,
        seq_len: 8192,
        max_positions: 8192,
        ..llama(name, shape, 8)
    }
}

/// A Mixtral shape (Jiang et al. 2024): the Llama recipe with every FFN a top-2 mixture of
/// 8 experts, each as wide as the dense FFN was; `(layers, hidden, heads, kv_heads,
/// expert_ffn)`, the vocabulary and the context the model was trained at.
fn mixtral(name: &str, shape: LlamaShape, vocab: u64, seq_len: u64) -> ModelConfig {
    let expert_ffn = shape.4;
    ModelConfig {
        vocab,
        seq_len,
        max_positions: seq_len,
        moe: Some(Moe {
            experts: 8,
            experts_per_token: 2,
            expert_ffn,
            shared_experts: 0,
            routing_imbalance: 1.0,
            capacity_factor: None,
        }),
        ..llama(name, shape, 8)
    }
}

/// A Qwen3 MoE shape (Qwen team 2025, "Qwen3 Technical Report", Table 2, and the released
/// configurations): `(layers, hidden, query heads, kv_heads, expert_ffn)`, 128 experts of
/// which 8 per token, no shared expert, heads of 128 whatever the width, RMS-normalised
/// queries and keys, the 151,936-row vocabulary untied, 4,096-token pre-training sequences
/// (its first two stages), tensor parallelism up to the 4 key/value heads. `ffn` is the
/// configurations' dense width, used by no block.
fn qwen3_moe(name: &str, shape: LlamaShape, dense_ffn: u64) -> ModelConfig {
    let expert_ffn = shape.4;
    ModelConfig {
        head_dim: Some(128),
        qk_norm: true,
        ffn: dense_ffn,
        vocab: 151936,
        seq_len: 4096,
        max_positions: 4096,
        moe: Some(Moe {
            experts: 128,
            experts_per_token: 8,
            expert_ffn,
            shared_experts: 0,
            routing_imbalance: 1.0,
            capacity_factor: None,
        }),
        ..llama(name, shape, 4)
    }
}

/// The preset called `name`, if there is one.
pub fn preset(name: &str) -> Option<ModelConfig> {
    Some(match name {
        // Devlin et al. 2019: 24 layers, 1024 wide, 16 heads, 30,522 word pieces, 512
        // positions, 2 segments, post-LN, with the pooler and a 2-way classifier.
        "bert-large" => ModelConfig {
            vocab: 30522,
            norm_position: NormPosition::Post,
            token_types: 2,
            tied_embeddings: false,
            head: Head::Classifier { classes: 2 },
            causal: false,
            ..gpt("bert-large", 24, 1024, 16, 512)
        },
        "gpt2-xl" => ModelConfig {
            max_tensor_parallel: 1,
            ..gpt("gpt2-xl", 48, 1600, 25, 1024)
        },
        // Zhang et al. 2022. OPT-350m is post-LN with a 512-wide word embedding projected
        // in and out, and no final norm; the learned positions have 2 extra slots.
        "opt-350m" => ModelConfig {
            activation: Activation::Relu,
            norm_position: NormPosition::Post,
            embedding_dim: Some(512),
            vocab: 50272,
            max_positions: 2050,
            ..gpt("opt-350m", 24, 1024, 16, 2048)
        },
        "opt-1.3b" => ModelConfig {
            activation: Activation::Relu,
            vocab: 50272,
            max_positions: 2050,
            ..gpt("opt-1.3b", 24, 2048, 32, 2048)
        },
        "llama2-7b" => llama("llama2-7b", (32, 4096, 32, 32, 11008), 8),
        "llama2-70b" => llama("llama2-70b", (80, 8192, 64, 8, 28672), 8),
        // Dubey et al. 2024 ("The Llama 3 Herd of Models"), Table 3: 32/80/126 layers,
        // model dimension 4,096/8,192/16,384, FFN 14,336/28,672/53,248, 32/64/128 heads with 8
        // key/value heads, a 128,000-token vocabulary (128,256 rows in the released
        // checkpoints, as counted here), untied; pre-trained at 8,192 tokens.
        "llama3-8b" => llama3("llama3-8b", (32, 4096, 32, 8, 14336)),
        "llama3-70b" => llama3("llama3-70b", (80, 8192, 64, 8, 28672)),
        "llama3-405b" => llama3("llama3-405b", (126, 16384, 128, 8, 53248)),
        // Jiang et al. 2024 ("Mixtral of Experts"), Table 1: 32 layers, 4,096 wide, 32 heads
        // with 8 key/value heads, 8 experts of 14,336 of which 2 per token, 32,000-token
        // vocabulary, trained at a 32K context.
        "mixtral-8x7b" => mixtral("mixtral-8x7b", (32, 4096, 32, 8, 14336), 32000, 32768),
        // Mistral AI's release of Mixtral 8x22B (April 2024) and its configuration: 56
        // layers, 6,144 wide, 48 heads with 8 key/value heads, 8 experts of 16,384, a
        // 32,768-token vocabulary, a 64K context.
        "mixtral-8x22b" => mixtral("mixtral-8x22b", (56, 6144, 48, 8, 16384), 32768, 65536),
        "qwen3-30b-a3b" => qwen3_moe("qwen3-30b-a3b", (48, 2048, 32, 4, 768), 6144),
        "qwen3-235b-a22b" => qwen3_moe("qwen3-235b-a22b", (94, 4096, 64, 4, 1536), 12288),
        // DeepSeek-AI 2024 ("DeepSeek-V3 Technical Report", §4.2, and the released
        // configuration): 61 layers, 7,168 wide, 128 heads of multi-head latent attention
        // (query latent 1,536, key-value latent 512, heads of 128 + 64 rotary, values of
        // 128), the first 3 blocks dense (18,432), the others 256 routed experts of 2,048
        // (8 per token) and 1 shared, a 129,280-row vocabulary untied, 4,096-token
        // pre-training sequences; trained with one multi-token-prediction module (§2.2,
        // §4.2: "we set the MTP depth D to 1").
        "deepseek-v3" => ModelConfig {
            kv_heads: 128,
            ffn: 18432,
            vocab: 129280,
            seq_len: 4096,
            max_positions: 4096,
            attention: AttentionKernel::Mla,
            mla: Some(Mla {
                q_lora_rank: Some(1536),
                kv_lora_rank: 512,
                qk_nope_head_dim: 128,
                qk_rope_head_dim: 64,
                v_head_dim: 128,
            }),
            moe: Some(Moe {
                experts: 256,
                experts_per_token: 8,
                expert_ffn: 2048,
                shared_experts: 1,
                routing_imbalance: 1.0,
                capacity_factor: None,
            }),
            dense_layers: 3,
            mtp_depth: 1,
            ..llama("deepseek-v3", (61, 7168, 128, 128, 18432), 8)
        },
        "megatron-gpt2-2.5b" => megatron("megatron-gpt2-2.5b", 54, 1920, 20, 1024, 4),
        "megatron-gpt2-8.3b" => megatron("megatron-gpt2-8.3b", 72, 3072, 24, 1024, 8),
        "gpt3-175b" => megatron("gpt3-175b", 96, 12288, 96, 2048, 8),
        _ => return None,
    })
}

impl ModelConfig {
    /// Defaults for a model given by its hyper-parameters: a GPT-style decoder (pre-LN,
    /// GELU, learned positions, biases, tied embeddings, dropout). The shape (layers, hidden,
    /// heads, vocab, sequence) is always given by the spec.
    pub fn custom_base() -> ModelConfig {
        ModelConfig {
            max_tensor_parallel: 1,
            ..gpt("custom", 0, 0, 0, 0)
        }
    }

    /// Each query and key head's dimension: with multi-head latent attention its no-rotary
    /// and rotary parts, else the one given, else `hidden / heads`.
    pub fn head_dim(&self) -> u64 {
        if let (AttentionKernel::Mla, Some(m)) = (self.attention, self.mla) {
            return m.qk_nope_head_dim.saturating_add(m.qk_rope_head_dim);
        }
        self.head_dim
            .unwrap_or_else(|| self.hidden.checked_div(self.heads).unwrap_or(0))
    }

    /// The queries' width, `heads × head_dim` (the hidden size unless `head_dim` is given).
    pub fn query_width(&self) -> u64 {
        self.heads.saturating_mul(self.head_dim())
    }

    /// Layers of the pipeline the placement cuts into stages: the embedding, the blocks and
    /// the head (what [`crate::model::ModelGraph::layers`] yields).
    pub fn pipeline_layers(&self) -> u64 {
        self.layers.saturating_add(2)
    }

    /// Vocabulary rows per tensor-parallel rank, after padding.
    pub fn vocab_per_rank(&self, t: u64) -> u64 {
        let multiple = self.vocab_pad_multiple.max(1) * t;
        self.vocab.div_ceil(multiple) * multiple / t
    }

    /// The tensor-parallel widths this model supports: powers of two up to
    /// `max_tensor_parallel` that divide the heads, the key/value heads, the FFN width and
    /// the hidden size.
    pub fn tensor_parallel_widths(&self) -> Vec<u64> {
        let mut widths = Vec::new();
        let mut t = 1;
        while t <= self.max_tensor_parallel {
            if self.supports_tensor_parallel(t) {
                widths.push(t);
            }
            t *= 2;
        }
        widths
    }

    pub fn supports_tensor_parallel(&self, t: u64) -> bool {
        t >= 1
            && t.is_power_of_two()
            && self.heads.is_multiple_of(t)
            && self.kv_heads.is_multiple_of(t)
            && self.ffn.is_multiple_of(t)
            && self.hidden.is_multiple_of(t)
            && self
                .moe
                .is_none_or(|m| (m.shared_experts * m.expert_ffn).is_multiple_of(t))
    }

    /// The expert-tensor-parallel width a plan of tensor-parallel width `t` takes unless it
    /// says otherwise: `t` for a Mixture-of-Experts model (Megatron-Core's default, the
    /// experts split like the dense MLP), 1 for a dense one (it has no experts).
    pub fn expert_tensor_parallel(&self, t: u64) -> u64 {
        if self.moe.is_some() { t } else { 1 }
    }

    /// Expert parameters of one block (every expert's FFN, no router): what expert
    /// parallelism shards; 0 for a dense model.
    pub fn expert_parameters_per_block(&self) -> u64 {
        self.moe
            .map_or(0, |m| m.experts * self.expert_parameters(m))
    }

    /// One expert's FFN parameters.
    fn expert_parameters(&self, m: Moe) -> u64 {
        let (h, f) = (self.hidden, m.expert_ffn);
        let bias = u64::from(self.biases);
        let up = if self.gated_mlp { 2 } else { 1 };
        up * (h * f + bias * f) + f * h + bias * h
    }

    /// Parameters a token goes through: all of them but the experts it is not routed to
    /// (`None` for a dense model, where it is all of them).
    pub fn inactive_parameters(&self) -> Option<u64> {
        self.moe.map(|m| {
            let idle = m.experts.saturating_sub(m.experts_per_token);
            self.moe_layers() * idle * self.expert_parameters(m)
        })
    }

    /// Blocks with a Mixture-of-Experts FFN (all but the leading dense ones; 0 for a dense
    /// model).
    pub fn moe_layers(&self) -> u64 {
        if self.moe.is_some() {
            self.layers.saturating_sub(self.dense_layers)
        } else {
            0
        }
    }

    /// Leading blocks with a dense FFN in a Mixture-of-Experts model (0 for a dense model,
    /// whose blocks are all alike).
    pub fn dense_blocks(&self) -> u64 {
        if self.moe.is_some() {
            self.dense_layers.min(self.layers)
        } else {
            0
        }
    }
}
