//! The spec file as written: serde types that mirror the TOML one to one. They are also
//! the source of the JSON Schema (`archplace schema`). Quantities stay strings here
//! (`"80 GiB"`) and are read, with every other rule, by `validate`, so that
//! every problem can be reported with its location.

use archplace_engine::model::{Activation, AttentionKernel, Norm, NormPosition, Positions};
use archplace_engine::pipeline::PipelineSchedule;
use archplace_engine::step::ContextMethod;
use archplace_engine::training::{
    Fp8Scaling, MemoryModel, Optimizer, Precision, Recomputation, RecomputeModule,
};
use schemars::JsonSchema;
use serde::Deserialize;
use std::collections::BTreeMap;

/// A search spec: which models to train, on how many devices, and which accelerators to
/// consider. Every section but `models` may be left out; defaults are the reference
/// system's.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "archplace search spec, version 1")]
pub struct RawSpec {
    /// Version of the spec format. Must be 1.
    pub schema_version: u32,
    /// Name of the search: letters, digits, `-`, `_` and `.`. Results go to a folder of
    /// this name.
    pub name: String,
    /// Free text for people.
    #[serde(default)]
    pub description: Option<String>,
    /// One or more models. The search maximises their mean throughput.
    pub models: Vec<RawModel>,
    #[serde(default)]
    pub training: RawTraining,
    #[serde(default)]
    pub cluster: RawCluster,
    #[serde(default)]
    pub search: RawSearch,
    #[serde(default)]
    pub cost_model: RawCostModel,
    /// One fixed chip, for `archplace estimate` (the search ignores it).
    #[serde(default)]
    pub accelerator: Option<RawFixedAccelerator>,
    /// One fixed training plan, for `archplace estimate` (the search ignores it).
    #[serde(default)]
    pub plan: Option<RawPlan>,
}

/// The top-level keys of a spec, in the order the docs list them.
pub const TOP_LEVEL_KEYS: [&str; 10] = [
    "schema_version",
    "name",
    "description",
    "models",
    "training",
    "cluster",
    "search",
    "cost_model",
    "accelerator",
    "plan",
];

/// One value, or a list of values to try.
#[derive(Debug, Clone, JsonSchema)]
#[serde(untagged)]
pub enum OneOrMany<T> {
    One(T),
    Many(Vec<T>),
}

/// A flag or a name: the schema of a key that was a boolean before its values had names
/// (`tensor_parallel_overlap`).
#[derive(JsonSchema)]
#[serde(untagged)]
#[allow(dead_code)]
enum FlagOrName<T> {
    Flag(bool),
    Name(T),
}

/// `fp8_recipe`'s values as the schema lists them: the engine's names and
/// Megatron-LM's `tensorwise` for `current` (a serde alias, which a derived schema
/// leaves out).
#[derive(JsonSchema)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)]
enum Fp8RecipeName {
    Delayed,
    Tensorwise,
    Current,
    Rowwise,
    Blockwise,
}

/// Read by the value's own type, so that a wrong value gets that type's message (`unknown
/// variant `fp8`, expected one of `bf16-mixed`, …`) instead of an untagged enum's "a value
/// or a list of values".
impl<'de, T: Deserialize<'de>> Deserialize<'de> for OneOrMany<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::{IntoDeserializer, SeqAccess, Visitor};
        struct OneOrList<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for OneOrList<T> {
            type Value = OneOrMany<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a value or a list of values")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut all = Vec::new();
                while let Some(x) = seq.next_element()? {
                    all.push(x);
                }
                Ok(OneOrMany::Many(all))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                T::deserialize(v.into_deserializer()).map(OneOrMany::One)
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Self::Value, E> {
                T::deserialize(v.into_deserializer()).map(OneOrMany::One)
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
                T::deserialize(v.into_deserializer()).map(OneOrMany::One)
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
                T::deserialize(v.into_deserializer()).map(OneOrMany::One)
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Self::Value, E> {
                T::deserialize(v.into_deserializer()).map(OneOrMany::One)
            }
        }
        d.deserialize_any(OneOrList(std::marker::PhantomData))
    }
}

impl<T: Clone> OneOrMany<T> {
    pub fn to_vec(&self) -> Vec<T> {
        match self {
            OneOrMany::One(v) => vec![v.clone()],
            OneOrMany::Many(v) => v.clone(),
        }
    }
}

/// A recomputation choice: `"none"`, `"selective"`, `"selective_op"`, `"full"`, or the
/// older booleans (`false` = none, `true` = full).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(
    untagged,
    expecting = "not a recomputation choice: use \"none\", \"selective\", \"selective_op\", \"full\", false (none) or true (full)"
)]
pub enum RawRecomputation {
    Flag(bool),
    Named(Recomputation),
}

impl RawRecomputation {
    pub fn value(self) -> Recomputation {
        match self {
            RawRecomputation::Flag(false) => Recomputation::None,
            RawRecomputation::Flag(true) => Recomputation::Full,
            RawRecomputation::Named(r) => r,
        }
    }
}

/// The chip `archplace estimate` evaluates: the six axes of the search, and HBM — given,
/// or from a GPU preset (any key given overrides the preset's).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawFixedAccelerator {
    /// A GPU as its datasheet describes it: "a100-sxm-80gb", "h100-sxm-80gb",
    /// "h200-sxm-141gb", "h800-sxm-80gb", "b200-sxm-180gb" or "gb200" (one tensor
    /// core and one vector core per SM, L2 as the buffer; docs/training-model.md).
    pub preset: Option<String>,
    pub tensor_cores: Option<u32>,
    pub vector_cores: Option<u32>,
    /// Columns of each tensor core's MAC array.
    pub width: Option<u32>,
    /// Rows of each tensor core's MAC array.
    pub depth: Option<u32>,
    /// Lanes per vector core (default: `width`).
    pub vector_width: Option<u32>,
    /// Global buffer, e.g. "40 MiB".
    pub buffer: Option<String>,
    /// HBM per device, e.g. "80 GiB".
    pub hbm: Option<String>,
    /// Peak dense matrix throughput of one device, e.g. "312 TFLOP/s", for the model
    /// FLOPs utilisation (left out: no utilisation is reported).
    pub peak_flops: Option<String>,
}

/// The training plan `archplace estimate` evaluates.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawPlan {
    // Required (the validator reports each one missing, so the rest of the table is still
    // checked in the same run).
    #[schemars(required, with = "u64")]
    pub tensor_parallel: Option<u64>,
    #[schemars(required, with = "u64")]
    pub pipeline_parallel: Option<u64>,
    #[schemars(required, with = "u64")]
    pub data_parallel: Option<u64>,
    #[schemars(required, with = "u64")]
    pub micro_batch: Option<u64>,
    /// Virtual pipeline stages per device (default 1: plain 1F1B).
    pub interleaving: Option<u64>,
    /// How the pipeline runs its micro-batches: "1f1b", "interleaved" (`interleaving`
    /// chunks per device), "zero-bubble" (ZB-H1), "zbv" (ZB-V, two chunks in a V),
    /// "dualpipe" (DeepSeek-V3's, two copies of the parameters) or "dualpipev". Default:
    /// "interleaved" with `interleaving` > 1, else "1f1b".
    pub pipeline_schedule: Option<PipelineSchedule>,
    /// "none", "selective", "selective_op" or "full" (default: the first of
    /// `[training]`'s list).
    pub recomputation: Option<RawRecomputation>,
    /// Sequence parallelism (default false; only changes anything with t > 1).
    pub sequence_parallel: Option<bool>,
    /// "bf16-mixed", "fp16-mixed", "fp32", "fp8-hybrid" or "mxfp8" (default: the first
    /// of `[training]`'s list).
    pub precision: Option<Precision>,
    /// With "fp8-hybrid": the FP8 recipe, "delayed", "tensorwise" (or "current"),
    /// "rowwise" or "blockwise" (`[training]`'s `fp8_recipe`). Default: `[training]`'s.
    #[schemars(with = "Option<Fp8RecipeName>")]
    pub fp8_recipe: Option<Fp8Scaling>,
    /// `fp8_recipe`'s older name (its values "delayed" and "current" mean the same).
    #[schemars(with = "Option<Fp8RecipeName>")]
    pub fp8_scaling: Option<Fp8Scaling>,
    /// With "fp8-hybrid" or "mxfp8": keep the quantised GEMMs' weights in that type only and
    /// all-gather them in it (Megatron-LM's `--fp8-param-gather`; needs the distributed
    /// optimizer or ZeRO ≥ 1). Default: `[training]`'s.
    pub fp8_param_gather: Option<bool>,
    /// Shard the optimizer state over the data-parallel group (default: the first of
    /// `[training]`'s list).
    pub distributed_optimizer: Option<bool>,
    /// ZeRO stage (default: 1 with the distributed optimizer, else 0): 0 replicates every
    /// state over the data-parallel group, 1 shards the optimizer's (the distributed
    /// optimizer), 2 the gradients too (reduce-scattered every micro-batch), 3 the weights
    /// too (FSDP: each layer's gathered before its forward and backward passes).
    pub zero_stage: Option<u64>,
    /// With `zero_stage = 3`: free each layer's gathered weights after its forward pass and
    /// gather them again for backward (default true, FSDP's `reshard_after_forward`).
    pub reshard_after_forward: Option<bool>,
    /// Data-parallel traffic overlaps computation (default false): the gradients'
    /// reduction hides behind backward, the weights' gathers behind forward.
    pub data_parallel_overlap: Option<bool>,
    /// Hybrid sharding (HSDP): shard the state over groups of this many data-parallel
    /// ranks, replicated across the groups (default: the whole data-parallel group).
    pub sharding_group: Option<u64>,
    /// Ranks a Mixture-of-Experts model's experts are divided over (EP; default 1). The
    /// expert groups fold into the tensor × data-parallel ranks of a pipeline stage.
    pub expert_parallel: Option<u64>,
    /// Ranks each expert's FFN is split over (ETP; default: `tensor_parallel` for a
    /// Mixture-of-Experts model, as Megatron-Core defaults it, 1 for a dense one).
    pub expert_tensor_parallel: Option<u64>,
    /// The all-to-all exchanges overlap computation (DualPipe; Megatron-Core's
    /// `--overlap-moe-expert-parallel-comm`; default: `[training]`'s, else false).
    pub all_to_all_overlap: Option<bool>,
    /// The interleaved pipeline's point-to-point transfers overlap the steady state's
    /// computation (Megatron-LM's `overlap_p2p_comm`; needs `interleaving` > 1; default:
    /// `[training]`'s, else false).
    pub pipeline_parallel_overlap: Option<bool>,
    /// Ranks each sequence is split over (CP, context parallelism; default 1), between the
    /// tensor- and the data-parallel ranks: devices = t × CP × p × d. Needs FlashAttention
    /// (or MLA); the sequence must split into 2·CP equal chunks (causal models).
    pub context_parallel: Option<u64>,
    /// How the context-parallel ranks share keys and values: "ring" (default; Megatron's
    /// `--cp-comm-type p2p`), "all_gather" or "all_to_all" (DeepSpeed-Ulysses, `a2a`: the
    /// heads of a tensor-parallel rank split over CP, so they must divide by it).
    pub context_parallel_exchange: Option<ContextMethod>,
    /// With the ring: each step's transfer overlaps the attention of the chunk at hand
    /// (default true).
    pub context_parallel_overlap: Option<bool>,
    /// What `recomputation = "selective"` runs again (default: `[training]`'s, else
    /// ["core_attn"]); see `[training] recompute_modules`.
    pub recompute_modules: Option<Vec<RecomputeModule>>,
    /// With `recomputation = "full"`: recompute only the first this many blocks of each
    /// model chunk, the others keeping every activation (Megatron-LM's `--recompute-method
    /// block --recompute-num-layers`; default: every block).
    pub recompute_layers: Option<u64>,
    /// Move the activations of the first this many blocks to the host's memory after their
    /// forward pass and back before their backward pass (Megatron-Core's
    /// `cpu_offloading_num_layers`; default 0). Fewer than the model's blocks, one pipeline
    /// stage, no recomputation, and a host link (`[cluster] host_bandwidth` or a preset's).
    pub activation_offload_layers: Option<u64>,
    /// Transformer blocks of each pipeline stage, first to last, e.g. [9, 10, 10, 9]
    /// (default: an even split). The embedding goes with the first stage, the head with
    /// the last.
    pub stage_layers: Option<Vec<u64>>,
    /// Blocks of the first pipeline stage, the others split evenly (Megatron-LM's
    /// `--decoder-first-pipeline-num-layers`).
    pub first_stage_layers: Option<u64>,
    /// Blocks of the last pipeline stage, the others split evenly (Megatron-LM's
    /// `--decoder-last-pipeline-num-layers`).
    pub last_stage_layers: Option<u64>,
}

/// Kind of head on top of the last block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RawHead {
    /// Logits over the vocabulary and cross-entropy.
    LanguageModel,
    /// Pooler (dense + tanh on the first token) and a classifier over `classes`.
    Classifier,
}

/// A model: a preset, a preset with overrides, or every hyper-parameter given.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawModel {
    /// One of: bert-large, gpt2-xl, opt-350m, opt-1.3b, llama2-7b, llama2-70b, llama3-8b,
    /// llama3-70b, llama3-405b, mixtral-8x7b, mixtral-8x22b, qwen3-30b-a3b,
    /// qwen3-235b-a22b, deepseek-v3, megatron-gpt2-2.5b, megatron-gpt2-8.3b, gpt3-175b.
    pub preset: Option<String>,
    /// Display name (default: the preset's).
    pub name: Option<String>,
    /// Transformer blocks.
    pub layers: Option<u64>,
    /// Hidden size.
    pub hidden: Option<u64>,
    /// Attention heads.
    pub heads: Option<u64>,
    /// Key/value heads for grouped-query attention (default: `heads`).
    pub kv_heads: Option<u64>,
    /// Each head's dimension when it is not hidden / heads (Qwen3: 128).
    pub head_dim: Option<u64>,
    /// RMS-normalise queries and keys per head (Qwen3).
    pub qk_norm: Option<bool>,
    /// Width of the MLP (default: 4 × hidden).
    pub ffn: Option<u64>,
    /// Vocabulary size.
    pub vocab: Option<u64>,
    /// Pad the vocabulary to a multiple of this times the tensor-parallel width
    /// (Megatron: 128; default 1).
    pub vocab_pad_multiple: Option<u64>,
    /// Sequence length of the training samples.
    pub seq_len: Option<u64>,
    /// Rows of a learned position table (default: `seq_len`).
    pub max_positions: Option<u64>,
    /// Gated MLP (SwiGLU-style gate and up projections).
    pub gated_mlp: Option<bool>,
    pub activation: Option<Activation>,
    pub norm: Option<Norm>,
    /// `pre` (norm inside the residual branch, final norm before the head) or `post`.
    pub norm_position: Option<NormPosition>,
    /// `learned` position table or `rotary`.
    pub positions: Option<Positions>,
    /// Biases on linear layers.
    pub biases: Option<bool>,
    /// Output projection shares the word embedding.
    pub tied_embeddings: Option<bool>,
    /// Number of token types (segments), 0 for none.
    pub token_types: Option<u64>,
    /// Width of the word embedding when it differs from `hidden` (projected in and out).
    pub embedding_dim: Option<u64>,
    pub head: Option<RawHead>,
    /// Classes of a `classifier` head.
    pub classes: Option<u64>,
    /// Dropout layers (1-byte masks are kept for the backward pass).
    pub dropout: Option<bool>,
    /// `unfused` (scores, softmax and context as separate kernels, the `s × s` tensors
    /// kept), `flash` (one fused kernel: FlashAttention) or `mla` (multi-head latent
    /// attention with a fused core, DeepSeek-V2/V3; needs the latent shapes below); default
    /// `flash` for the presets of 2023 on, else `unfused`.
    pub attention: Option<AttentionKernel>,
    /// Multi-head latent attention: the queries' latent rank (0: projected directly).
    pub q_lora_rank: Option<u64>,
    /// Multi-head latent attention: the keys' and values' latent rank.
    pub kv_lora_rank: Option<u64>,
    /// Multi-head latent attention: each query and key head's part without rotary embedding.
    pub qk_nope_head_dim: Option<u64>,
    /// Multi-head latent attention: each query and key head's rotary part (even).
    pub qk_rope_head_dim: Option<u64>,
    /// Multi-head latent attention: each value head's dimension.
    pub v_head_dim: Option<u64>,
    /// Each token attends only to those before it (default: true, but for BERT); a flash
    /// kernel skips the masked half of the products.
    pub causal: Option<bool>,
    /// Largest tensor-parallel width to try: a power of two dividing the heads, the
    /// key/value heads, the hidden size and the MLP width.
    pub max_tensor_parallel: Option<u64>,
    /// Mixture-of-Experts: experts per block (every block's FFN is a mixture; 0 or left
    /// out: dense).
    pub experts: Option<u64>,
    /// Experts each token is routed to (top-k; default 2).
    pub experts_per_token: Option<u64>,
    /// Each expert's FFN width (default: `ffn`).
    pub expert_ffn: Option<u64>,
    /// Experts every token goes through, each `expert_ffn` wide (default 0).
    pub shared_experts: Option<u64>,
    /// The leading blocks whose FFN is dense, `ffn` wide (DeepSeek-V3: 3; default 0).
    pub dense_layers: Option<u64>,
    /// Tokens of the busiest expert over the mean, at least 1 (default 1: balanced).
    pub routing_imbalance: Option<f64>,
    /// Each expert takes at most this many times the mean tokens and drops the rest
    /// (default: dropless).
    pub capacity_factor: Option<f64>,
    /// Multi-token-prediction modules after the last block (DeepSeek-V3: 1; default 0):
    /// each predicts one token further ahead with one more block, in the head's stage.
    pub mtp_depth: Option<u64>,
    /// A fixed parallelisation to compare the search's best plan against.
    pub baseline: Option<RawBaseline>,
    /// How many times the model counts in the search's objective (default 1): with
    /// several models the search maximises the weighted mean of their throughputs.
    pub weight: Option<f64>,
}

/// The keys of a model table (for suggestions).
pub const MODEL_KEYS: [&str; 42] = [
    "preset",
    "name",
    "layers",
    "hidden",
    "heads",
    "kv_heads",
    "head_dim",
    "qk_norm",
    "ffn",
    "vocab",
    "vocab_pad_multiple",
    "seq_len",
    "max_positions",
    "gated_mlp",
    "activation",
    "norm",
    "norm_position",
    "positions",
    "biases",
    "tied_embeddings",
    "token_types",
    "embedding_dim",
    "head",
    "classes",
    "dropout",
    "attention",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "causal",
    "max_tensor_parallel",
    "experts",
    "experts_per_token",
    "expert_ffn",
    "shared_experts",
    "dense_layers",
    "routing_imbalance",
    "capacity_factor",
    "mtp_depth",
    "baseline",
];

/// A fixed strategy: `pipeline` stages × `data` replicas × `tensor` ranks devices.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawBaseline {
    pub pipeline: u64,
    pub data: u64,
    pub tensor: u64,
}

/// The training job.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawTraining {
    /// The software stack whose defaults fill every `[training]` key the spec leaves out
    /// (its own keys win): "megatron-core", "pytorch-fsdp", "deepspeed" (`archplace stacks`
    /// lists them, their sources and calibrations), or a profile file of that format
    /// relative to the spec's folder.
    pub stack: Option<String>,
    /// Samples per optimizer step (default 4096).
    pub global_batch: Option<u64>,
    /// Micro-batch sizes to try; each must divide the global batch (default `[1]`).
    pub micro_batch_sizes: Option<Vec<u64>>,
    /// What to recompute in the backward pass, each value tried: "none", "selective"
    /// (the attention core), "selective_op" (PyTorch's per-operator checkpointing:
    /// every other matmul's output and the attention kernel's kept) or "full";
    /// `false`/`true` mean none/full (default ["none", "full"]). Both selective ones
    /// need the megatron memory model.
    pub activation_recomputation: Option<Vec<RawRecomputation>>,
    /// `adam` (two moments), `sgd_momentum` (one) or `sgd` (none). Default: adam with the
    /// megatron memory model, sgd with the reference's.
    pub optimizer: Option<Optimizer>,
    /// Numeric format, one value or a list to try: "bf16-mixed" (default), "fp16-mixed",
    /// "fp32", "fp8-hybrid" (the blocks' GEMMs in FP8, per-tensor scaling: Hopper and
    /// Blackwell) or "mxfp8" (in MXFP8, block scaling: Blackwell). Sets the bytes per
    /// parameter and per activation element and the element type of every GEMM.
    pub precision: Option<OneOrMany<Precision>>,
    /// With "fp8-hybrid", the FP8 recipe (Megatron-LM's `--fp8-recipe`, torchao's recipe
    /// names): "delayed" (default: one scale per tensor from earlier steps' maxima,
    /// Transformer Engine's `DelayedScaling`), "tensorwise" or "current" (one per tensor
    /// from the tensor being cast, NVIDIA's "FP8-CS"), "rowwise" (one per row of each GEMM
    /// operand, torchao's) or "blockwise" (1 × 128 tiles and 128 × 128 weight blocks,
    /// DeepSeek-V3's and Transformer Engine's `Float8BlockScaling`).
    #[schemars(with = "Option<Fp8RecipeName>")]
    pub fp8_recipe: Option<Fp8Scaling>,
    /// `fp8_recipe`'s older name (its values "delayed" and "current" mean the same).
    #[schemars(with = "Option<Fp8RecipeName>")]
    pub fp8_scaling: Option<Fp8Scaling>,
    /// With an FP8 recipe: keep the quantised GEMMs' weights in its type only, with no
    /// bf16 copy, and all-gather them in it (Megatron-LM's `--fp8-param-gather`, which
    /// NVIDIA's FP8 recipes set; default false). A search applies it to the plans that
    /// shard the optimizer's state (it gathers from those shards).
    pub fp8_param_gather: Option<bool>,
    /// Shard the optimizer state over the data-parallel group (ZeRO-1), one value or a
    /// list to try (default false).
    pub distributed_optimizer: Option<OneOrMany<bool>>,
    /// ZeRO stages to try, one value or a list of 0 … 3 (instead of
    /// `distributed_optimizer`: 0 replicates every state, 1 shards the optimizer's, 2 the
    /// gradients too, 3 the weights too, FSDP). Needs the megatron memory model.
    pub zero_stage: Option<OneOrMany<u64>>,
    /// With ZeRO-3: free each layer's gathered weights after forward and gather them again
    /// for backward (default true); one value or a list to try (`[true, false]`: less
    /// memory against one gather less per layer and micro-batch).
    pub reshard_after_forward: Option<OneOrMany<bool>>,
    /// Data-parallel traffic overlaps computation (default false).
    pub data_parallel_overlap: Option<bool>,
    /// Sequence parallelism (norm and dropout regions split over the tensor-parallel
    /// group), one value or a list to try (default false). Needs the megatron memory model.
    pub sequence_parallel: Option<OneOrMany<bool>>,
    /// Model chunks per device, one value or a list to try: 1 (default) is plain 1F1B,
    /// more is Megatron-LM's interleaved 1F1B with equal chunks. Needs the megatron memory
    /// model.
    pub pipeline_interleaving: Option<OneOrMany<u64>>,
    /// Pipeline schedules to try, a name or a list: "1f1b", "interleaved" (with the
    /// interleavings above 1 of `pipeline_interleaving`), "zero-bubble", "zbv",
    /// "dualpipe", "dualpipev" (as `[plan] pipeline_schedule`). Default: "1f1b", and
    /// "interleaved" when `pipeline_interleaving` lists more than 1. Needs the megatron
    /// memory model.
    pub pipeline_schedule: Option<OneOrMany<PipelineSchedule>>,
    /// Expert-parallel widths to try for Mixture-of-Experts models, one value or a list
    /// (default 1): each model takes those dividing its experts, dense models 1. The
    /// experts' groups fold into the tensor × data-parallel ranks of a stage.
    pub expert_parallel: Option<OneOrMany<u64>>,
    /// Mixture-of-Experts models: the expert-parallel all-to-all exchanges overlap
    /// computation — one micro-batch's dispatch and combine run while another's forward or
    /// backward computes (DeepSeek's DualPipe; Megatron-Core's
    /// `--overlap-moe-expert-parallel-comm`) — so only what a stage's computation does not
    /// cover is exposed (default false).
    pub all_to_all_overlap: Option<bool>,
    /// With interleaving, the pipeline's point-to-point transfers overlap the computation
    /// of the 1F1B steady state (Megatron-LM's `overlap_p2p_comm`, its default with
    /// virtual stages; NeMo's and Megatron-Bridge's recipes set it), so a micro-batch
    /// exposes only what its stage's work does not cover; the fill and the flush wait for
    /// every transfer, and plain 1F1B's are always exposed (default false).
    pub pipeline_parallel_overlap: Option<bool>,
    /// Context-parallel sizes to try, one value or a list (default 1): each sequence split
    /// over CP ranks in `2·CP` load-balanced chunks (causal models; `CP` otherwise), between
    /// the tensor-parallel and the data-parallel ranks. Each model takes the sizes that
    /// divide the devices and split its sequence so; needs a fused attention kernel.
    pub context_parallel: Option<OneOrMany<u64>>,
    /// How context-parallel ranks exchange keys and values: "ring" (default, Megatron-Core's
    /// `p2p`), "all_gather" or "all_to_all" (DeepSpeed-Ulysses, `a2a`; the search tries the
    /// tensor-parallel widths whose heads divide by CP). `[plan]` may say otherwise for
    /// `estimate`.
    pub context_parallel_exchange: Option<ContextMethod>,
    /// With the ring: each step's transfer runs while attention computes (default true).
    pub context_parallel_overlap: Option<bool>,
    /// What selective recomputation runs again of each block (Megatron-LM's
    /// `--recompute-modules`; default ["core_attn"]): "core_attn" (the attention core),
    /// "layernorm" (a pre-norm block's two norms, their outputs dropped), "mlp" (a dense
    /// block's MLP), "moe" (a Mixture-of-Experts block's FFN, its exchanges with it),
    /// "moe_act" (the experts' activation, its output dropped), "shared_experts",
    /// "mla_up_proj" (latent attention's up-projections and rotary embedding, their
    /// outputs dropped). Needs "selective" among the recomputation choices.
    pub recompute_modules: Option<Vec<RecomputeModule>>,
    /// "megatron" (default: memory as Megatron-LM trains) or "reference" (the reference
    /// system's two copies of the parameters plus optimizer copies, for comparisons).
    pub memory_model: Option<MemoryModel>,
    /// Bytes per element with the reference memory model: 1, 2 or 4 (default 2). With the
    /// megatron model it must agree with the precision, if given.
    pub bytes_per_element: Option<u64>,
    /// How a layer's operators share the chip: "concurrent" (default: operators on
    /// different cores overlap, a dataflow accelerator) or "sequential" (one operator at a
    /// time on all the cores of its type, as Megatron-LM runs kernels on a GPU).
    pub operator_execution: Option<archplace_engine::execution::OperatorExecution>,
    /// Whether tensor-parallel collectives overlap independent computation: "none"
    /// (default, also `false`: each runs alone), "pipelined" (also `true`: Transformer
    /// Engine's `tp_comm_overlap` — with sequential operators and sequence parallelism each
    /// all-gather and reduce-scatter is pipelined with its GEMM) or "async" (PyTorch's
    /// async TP: those GEMMs decomposed into one per rank's shard while the shards move).
    #[schemars(with = "Option<FlagOrName<archplace_engine::execution::TensorParallelOverlap>>")]
    pub tensor_parallel_overlap: Option<archplace_engine::execution::TensorParallelOverlap>,
    /// How the framework turns the layer's element-wise operators into kernels: "fused"
    /// (default: norms, activations and rotary embeddings one kernel each, a GEMM's
    /// epilogue taking what follows it — Transformer Engine, or PyTorch under
    /// torch.compile) or "eager" (PyTorch without torch.compile: every operator its own
    /// kernel, RMSNorm and the rotary embedding as the Llama implementations write them,
    /// over fp32 copies).
    pub kernel_fusion: Option<archplace_engine::execution::KernelFusion>,
    /// The library that runs an FP8 recipe: "transformer_engine" (default: FP8 copies of
    /// the GEMM inputs saved for backward, a weight's FP8 copy kept for the step) or
    /// "torchao" (torchtitan's Float8: the 16-bit inputs and weights saved and cast again
    /// in backward, every use of a weight cast). The row-wise recipe is torchao's.
    pub fp8_library: Option<archplace_engine::execution::Fp8Library>,
    /// How the loss over the vocabulary is computed: "fused" (default: one kernel each way
    /// — Megatron-Core's with `--cross-entropy-loss-fusion`, Transformer Engine's,
    /// flash-attn's, torch.compile's — nothing held beside the kept fp32 softmax),
    /// "unfused" (Megatron-Core's vocabulary-parallel cross-entropy as separate PyTorch
    /// operations, Megatron-LM's default: the memory of "fused", eight kernels over fp32
    /// logits) or "eager" (PyTorch's `F.cross_entropy` over the logits cast to fp32,
    /// torchtitan's loss: its backward allocates two fp32 gradients beside the kept
    /// log-softmax, 8 bytes a logit, and each operation is a kernel of its own).
    pub cross_entropy: Option<archplace_engine::execution::CrossEntropy>,
}

/// The devices that train the model.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawCluster {
    /// Number of accelerators (default 1024).
    pub devices: Option<u64>,
    /// Nodes of a GPU preset (8 each, DGX-style: "a100-sxm-80gb", "h100-sxm-80gb",
    /// "h200-sxm-141gb", "h800-sxm-80gb", "b200-sxm-180gb"; "gb200" or "gb200-nvl72": 72 on
    /// one NVLink domain): sets `node_size`,
    /// the intra-node (NVLink) and inter-node (one InfiniBand adapter per GPU) bandwidths
    /// and the default `hbm`; any key given overrides the preset's.
    pub preset: Option<String>,
    /// Bandwidth of each device's link, e.g. "4 GiB/s" or "32 Gb/s" (default "4 GiB/s").
    pub link_bandwidth: Option<String>,
    /// HBM sizes per device to try, e.g. ["32 GiB", "80 GiB"] (default 32, 64, 80 GiB).
    pub hbm: Option<Vec<String>>,
    /// Devices per node (the scale-up domain: NVLink-class links inside it). With it, the
    /// network has two tiers: `intra_node_*` inside a node, `inter_node_*` between nodes
    /// (one NIC per device). Without it, one tier: `link_bandwidth`. A list (e.g. `[8,
    /// 72]`) makes the domain's size a design variable of a search: each candidate is
    /// evaluated at every size, and the result names the best chip at each and why.
    pub node_size: Option<OneOrMany<u64>>,
    /// Bandwidth per device inside a node, e.g. "300 GB/s" (NVLink-class); with several
    /// node sizes, one for all or a list with one per size.
    pub intra_node_bandwidth: Option<OneOrMany<String>>,
    /// Bandwidth per device between nodes, e.g. "25 GB/s" (a 200 Gb/s NIC).
    pub inter_node_bandwidth: Option<String>,
    /// Latency of one message inside a node (default "5 us").
    pub intra_node_latency: Option<String>,
    /// Latency of one message between nodes (default "10 us").
    pub inter_node_latency: Option<String>,
    /// Fraction of `intra_node_bandwidth` collectives and transfers achieve, 0 < x ≤ 1
    /// (default 1; a GPU preset sets the measured NCCL bus bandwidth's share).
    pub intra_node_efficiency: Option<f64>,
    /// Fraction of `inter_node_bandwidth` collectives and transfers achieve, 0 < x ≤ 1
    /// (default 1).
    pub inter_node_efficiency: Option<f64>,
    /// Share of the computation's time a collective overlapped with it moves at its rate
    /// alone, 0 < x ≤ 1 (default 1): ZeRO's gathers and reduce-scatters and the
    /// data-parallel synchronisation with `data_parallel_overlap`, and tensor parallelism's
    /// pipelined or asynchronous overlap, whose transfers share the SMs and HBM with the
    /// GEMMs they hide behind.
    pub overlap_efficiency: Option<f64>,
    /// Bandwidth between each device and its host's memory, one direction, e.g. "63 GB/s"
    /// (PCIe 5.0 x16) or "450 GB/s" (GB200's NVLink-C2C): what `activation_offload_layers`
    /// moves activations over. A GPU preset sets it; without one, nothing can be offloaded.
    pub host_bandwidth: Option<String>,
}

/// serde's message for a value that is neither form of [`RawAxis`].
pub const AXIS_EXPECTING: &str = "a list of values, or a table { min = ..., max = ... }";
/// serde's message for a value that is neither form of [`RawAreaBudget`].
pub const AREA_BUDGET_EXPECTING: &str =
    "an area such as \"278.8 mm2\", or { reference_config = { ... } }";

/// An axis of the space: a list of values, or every power of two from `min` to `max`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(
    untagged,
    expecting = "a list of values, or a table { min = ..., max = ... }"
)]
pub enum RawAxis<T> {
    List(Vec<T>),
    Range(RawRange<T>),
}

/// Every power of two from `min` to `max`, both included.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawRange<T> {
    pub min: T,
    pub max: T,
}

/// The area budget: an area such as "278.8 mm2", or the area of a configuration.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(
    untagged,
    expecting = "an area such as \"278.8 mm2\", or { reference_config = { ... } }"
)]
pub enum RawAreaBudget {
    Area(String),
    Config(RawReferenceConfig),
}

/// `{ reference_config = { tensor_cores = 8, ... } }`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawReferenceConfig {
    pub reference_config: RawAccelerator,
}

/// One accelerator configuration.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawAccelerator {
    pub tensor_cores: u32,
    pub vector_cores: u32,
    pub width: u32,
    pub depth: u32,
    /// Lanes per vector core (default: `width`).
    pub vector_width: Option<u32>,
    /// Global buffer, e.g. "128 MiB".
    pub buffer: String,
}

/// The space of candidate accelerators. Every axis defaults to the reference's.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawSearch {
    /// Tensor cores per chip (default powers of two 1..4096).
    pub tensor_cores: Option<RawAxis<u32>>,
    /// Vector cores per chip (default powers of two 1..4096).
    pub vector_cores: Option<RawAxis<u32>>,
    /// Columns of each tensor core's MAC array (default 2..256).
    pub width: Option<RawAxis<u32>>,
    /// Rows of each tensor core's MAC array (default 2..256).
    pub depth: Option<RawAxis<u32>>,
    /// Lanes per vector core; default: equal to `width` (tied, as the reference).
    pub vector_width: Option<RawAxis<u32>>,
    /// Global buffer sizes, e.g. ["32 MiB", "64 MiB"] or { min = "2 MiB", max = "128 MiB" }.
    pub buffer: Option<RawAxis<String>>,
    /// Largest chip area (default: the area of 8 TC 128×128, 2 VC, 128 MiB).
    pub area_budget: Option<RawAreaBudget>,
    /// Candidates smaller than this fraction of the budget are skipped (default 0.3).
    pub min_area_fraction: Option<f64>,
    /// Exempt chips with a single tensor or vector core from the minimum (default true).
    pub single_core_exempt: Option<bool>,
    /// Width of the area buckets the search visits, e.g. "0.01 mm2" (default 10,000 µm²).
    pub area_bucket: Option<String>,
    /// Stop after this many buckets without improvement (default 5).
    pub convergence_window: Option<u32>,
    /// Visit every candidate (default false: the default walk); the same as
    /// `strategy = "exhaustive"`.
    pub exhaustive: Option<bool>,
    /// How the search walks the space: "proven" (the default: every candidate bounded,
    /// then evaluated in the order of the bounds until none can beat the best — the best
    /// chip of the whole space), "converge" (a quick look: area buckets largest first,
    /// until `convergence_window` buckets bring nothing better — not proven) or
    /// "exhaustive" (every candidate).
    pub strategy: Option<archplace_engine::search::Strategy>,
    /// Propose only plans that use every device, `tensor × pipeline × data` = `[cluster]
    /// devices` (default true); false lets a plan leave devices idle, and says how many it
    /// uses.
    pub use_all_devices: Option<bool>,
    /// What the search maximises over the models: "samples_per_second" (default: the mean
    /// of the models' samples/s) or "tokens_per_second" (of their tokens/s, so a model of
    /// long sequences weighs as its tokens do); each model counted its `weight` times.
    pub objective: Option<archplace_engine::space::Objective>,
    /// Colour the points of `pareto.svg` by this axis of the space: "tensor_cores",
    /// "vector_cores", "width", "depth", "vector_width" or "buffer" (default: one colour).
    pub plot_colour_by: Option<archplace_engine::space::ChipAxis>,
    /// Accept a layer schedule within this relative gap of its lower bound (default 0.01,
    /// as the reference; 0 proves every schedule optimal, which is slower).
    pub schedule_gap: Option<f64>,
    /// Branch-and-bound nodes one layer-schedule MIP may explore during the search
    /// (default 100; at most 1000000). A work limit: a schedule that reaches it keeps the
    /// best solution found, the same on any machine under any load, and is counted as not
    /// proven optimal. It is what makes a search's result depend only on the spec, the cost
    /// models and archplace's version.
    pub schedule_node_limit: Option<u64>,
    /// Wall-clock limit of one layer-schedule MIP during the search, in seconds (default
    /// 10): a safety net behind the node limit. When it fires, what the MIP stops at
    /// depends on the machine's speed and load; the results count it
    /// (`work.mip_time_limit_hits`) and the run's summary says the result is not
    /// reproducible.
    pub schedule_time_limit_seconds: Option<f64>,
}

/// A value of a cost-model parameter.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(untagged, expecting = "a string, a number or a boolean")]
pub enum RawParameter {
    Text(String),
    Integer(i64),
    Float(f64),
    Bool(bool),
}

impl RawParameter {
    pub fn to_text(&self) -> String {
        match self {
            RawParameter::Text(s) => s.clone(),
            RawParameter::Integer(i) => i.to_string(),
            RawParameter::Float(f) => f.to_string(),
            RawParameter::Bool(b) => b.to_string(),
        }
    }
}

/// A cost-model plugin: its name, or a table that also pins a version range or the
/// component's hash.
#[derive(Debug, Clone, JsonSchema)]
#[serde(untagged)]
pub enum RawPluginRef {
    Name(String),
    Pinned(RawPinnedPlugin),
}

/// By hand rather than `untagged`, so that a mistake inside the table (an unknown key, a
/// wrong type) is reported as itself, not as "matches no variant".
impl<'de> Deserialize<'de> for RawPluginRef {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = RawPluginRef;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a plugin name, or a table { plugin = \"name\", version = \"^1.2\", blake3 = \"<hex>\" }")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(RawPluginRef::Name(v.to_string()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<Self::Value, A::Error> {
                RawPinnedPlugin::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(RawPluginRef::Pinned)
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawPinnedPlugin {
    /// The plugin's name, as its manifest gives it.
    pub plugin: String,
    /// A semver requirement on its version, e.g. "1.2" (= ^1.2) or "=1.2.3".
    pub version: Option<String>,
    /// The blake3 hash of its component (64 hex digits): any other file is refused.
    pub blake3: Option<String>,
}

/// Which cost models size the chips and time the operators.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawCostModel {
    /// Area model plugin (default "reference").
    pub area: Option<RawPluginRef>,
    /// Latency model plugin (default "reference").
    pub latency: Option<RawPluginRef>,
    /// Parameters per model, e.g. `[cost_model.parameters.reference] clock = "1.05 GHz"`.
    pub parameters: Option<BTreeMap<String, BTreeMap<String, RawParameter>>>,
    /// A calibration file made by `archplace calibrate` (relative to the spec's folder):
    /// its fitted factors multiply the latency model's and the cluster's parameters. It
    /// is refused when it was made for another plugin or version.
    pub calibration: Option<String>,
    /// Ranges of parameters whose effect is reported as an interval on the answer, per
    /// owner (the latency plugin, or `cluster`): `[cost_model.uncertainty.gpu-like]
    /// matrix_efficiency = ["0.75", "0.90"]`, `[cost_model.uncertainty.cluster]
    /// inter_node_efficiency = [0.7, 0.9]`. Values in the unit the parameter is declared in
    /// (`archplace plugin check` lists them).
    pub uncertainty: Option<BTreeMap<String, BTreeMap<String, [RawParameter; 2]>>>,
}
