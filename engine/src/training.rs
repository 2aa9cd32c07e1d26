//! The training job and the cluster it runs on: what a step must hold in memory per
//! parameter (precision, optimizer, distributed optimizer) and which recomputation it uses.
//!
//! Bytes per parameter follow Megatron-LM (Megatron-LM's distributed-optimizer document; the
//! numbers are listed in `docs/training-model.md`): mixed precision keeps 16-bit weights
//! for the forward and backward passes, a gradient buffer (fp32 for bf16, where Megatron
//! accumulates and reduces gradients in fp32; fp16 for fp16), fp32 master weights, for fp16
//! an fp32 copy of the gradients inside the optimizer, and 4 bytes per optimizer moment.
//! With the distributed optimizer (ZeRO-1) everything the optimizer owns — master weights,
//! its gradient copy, moments — is sharded over the data-parallel group.

use crate::pipeline::PipelineSchedule;
use archplace_plugin_sdk::ElementType;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Optimizer {
    /// No optimizer state.
    Sgd,
    /// One fp32 moment (the momentum buffer).
    SgdMomentum,
    /// Two fp32 moments (first and second).
    Adam,
}

impl Optimizer {
    /// fp32 moments kept per parameter.
    pub fn moments(self) -> u64 {
        match self {
            Optimizer::Sgd => 0,
            Optimizer::SgdMomentum => 1,
            Optimizer::Adam => 2,
        }
    }

    /// The reference system's optimizer state, in copies of the parameters (SGD 0, Adam 1;
    /// it has no momentum SGD, which it would count as one copy).
    pub fn reference_copies(self) -> f64 {
        match self {
            Optimizer::Sgd => 0.0,
            Optimizer::SgdMomentum | Optimizer::Adam => 1.0,
        }
    }
}

/// Numeric format of the training run.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Precision {
    /// bf16 weights and activations, fp32 gradient accumulation and master weights.
    Bf16Mixed,
    /// fp16 weights, gradients and activations; fp32 master weights and gradient copy.
    Fp16Mixed,
    /// fp32 throughout.
    Fp32,
    /// bf16 mixed precision with the blocks' GEMMs in FP8 (Transformer Engine's "hybrid"
    /// format: E4M3 forward, E5M2 for gradients; one scale per tensor), as NVIDIA trains
    /// on Hopper: every GEMM input cast to FP8, the FP8 copies of the weights kept for the
    /// step, the GEMMs' saved inputs kept in FP8.
    Fp8Hybrid,
    /// bf16 mixed precision with the blocks' GEMMs in MXFP8 (Blackwell: E4M3 in blocks of
    /// 32 elements, one E8M0 scale per block, row- and column-wise copies).
    Mxfp8,
}

impl Precision {
    pub const ALL: [Precision; 5] = [
        Precision::Bf16Mixed,
        Precision::Fp16Mixed,
        Precision::Fp32,
        Precision::Fp8Hybrid,
        Precision::Mxfp8,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Precision::Bf16Mixed => "bf16-mixed",
            Precision::Fp16Mixed => "fp16-mixed",
            Precision::Fp32 => "fp32",
            Precision::Fp8Hybrid => "fp8-hybrid",
            Precision::Mxfp8 => "mxfp8",
        }
    }

    /// Bytes of one weight, activation or activation gradient element (the FP8 recipes'
    /// are bf16; their GEMMs' inputs are [`Precision::gemm_element`]).
    pub fn element_bytes(self) -> u64 {
        match self {
            Precision::Bf16Mixed
            | Precision::Fp16Mixed
            | Precision::Fp8Hybrid
            | Precision::Mxfp8 => 2,
            Precision::Fp32 => 4,
        }
    }

    /// The element type of weights, activations and their gradients.
    pub fn activation_element(self) -> ElementType {
        match self {
            Precision::Bf16Mixed | Precision::Fp8Hybrid | Precision::Mxfp8 => ElementType::Bf16,
            Precision::Fp16Mixed => ElementType::Fp16,
            Precision::Fp32 => ElementType::Fp32,
        }
    }

    /// The element type the blocks' weight GEMMs multiply.
    pub fn gemm_element(self) -> ElementType {
        match self {
            Precision::Fp8Hybrid => ElementType::Fp8,
            Precision::Mxfp8 => ElementType::Mxfp8,
            other => other.activation_element(),
        }
    }

    /// Whether the blocks' GEMMs run in a quantised type (FP8, MXFP8).
    pub fn is_quantised(self) -> bool {
        self.gemm_element().is_quantised()
    }

    /// How the layer graphs of this precision type their data, with `scaling` for the
    /// FP8 recipes' casts.
    pub fn numerics(self, scaling: Fp8Scaling) -> Numerics {
        Numerics {
            bytes_per_element: self.element_bytes(),
            activations: self.activation_element(),
            gemms: self.gemm_element(),
            scaling: if self == Precision::Fp8Hybrid {
                scaling
            } else {
                Fp8Scaling::Delayed
            },
        }
    }

    /// Bytes of the gradient buffer the backward pass accumulates into, per parameter.
    fn gradient_bytes(self) -> u64 {
        match self {
            Precision::Bf16Mixed | Precision::Fp32 | Precision::Fp8Hybrid | Precision::Mxfp8 => 4,
            Precision::Fp16Mixed => 2,
        }
    }

    /// Bytes the optimizer owns per parameter besides its moments: fp32 master weights
    /// (mixed precision) and, for fp16, an fp32 copy of the gradients.
    fn optimizer_own_bytes(self) -> u64 {
        match self {
            Precision::Bf16Mixed | Precision::Fp8Hybrid | Precision::Mxfp8 => 4,
            Precision::Fp16Mixed => 8,
            Precision::Fp32 => 0,
        }
    }

    /// Bytes per weight of the quantised copies an FP8 recipe keeps of its GEMMs' weights
    /// for the step (Transformer Engine casts each weight once per step and keeps both
    /// layouts: the weight and its transpose in FP8 on Hopper, row- and column-wise MXFP8
    /// blocks on Blackwell); 0 without FP8.
    pub fn weight_copy_bytes(self) -> f64 {
        if self.is_quantised() {
            2.0 * self.gemm_element().bytes()
        } else {
            0.0
        }
    }
}

/// How a layer's data is typed: what its tensors take in memory and what each operator
/// tells the latency model ([`archplace_plugin_sdk::Op::element`]).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, serde::Deserialize,
)]
pub struct Numerics {
    /// Bytes of one activation element: what saved tensors, collectives and pipeline
    /// transfers move (the reference memory model's `bytes_per_element`).
    pub bytes_per_element: u64,
    /// The element type of the operators' data.
    pub activations: ElementType,
    /// The element type of the blocks' weight GEMMs (Transformer Engine's linear layers):
    /// the activations' type, or FP8/MXFP8 — then each such GEMM's input is cast to it
    /// (its output gradient too, backward), and it keeps its input in that type.
    pub gemms: ElementType,
    /// The FP8 recipe's scaling (delayed but for `fp8-hybrid`): where its casts run and
    /// how many times each reads its input ([`Fp8Scaling::casts_read_twice`]).
    pub scaling: Fp8Scaling,
}

impl Numerics {
    /// Every operator in the one type of `bytes_per_element` bytes (fp32 for 4, else
    /// bf16), no FP8.
    pub fn plain(bytes_per_element: u64) -> Numerics {
        let element = if bytes_per_element == 4 {
            ElementType::Fp32
        } else {
            ElementType::Bf16
        };
        Numerics {
            bytes_per_element,
            activations: element,
            gemms: element,
            scaling: Fp8Scaling::Delayed,
        }
    }

    /// Whether the blocks' GEMMs are quantised.
    pub fn quantised(&self) -> bool {
        self.gemms.is_quantised()
    }
}

impl Default for Numerics {
    /// bf16 throughout.
    fn default() -> Self {
        Numerics::plain(2)
    }
}

/// The FP8 recipe: how `fp8-hybrid`'s scales are chosen and over what (`fp8_recipe`;
/// MXFP8's block scales are always computed from the block being cast).
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Fp8Scaling {
    /// One scale per tensor from the absolute maxima of earlier steps (`DelayedScaling`;
    /// Megatron-LM's `--fp8-recipe delayed`): a cast reads its input once and records its
    /// maximum; a norm, activation or element-wise kernel writes it.
    #[default]
    Delayed,
    /// One scale per tensor from the tensor being cast (`Float8CurrentScaling`;
    /// `--fp8-recipe tensorwise`, NVIDIA's "FP8-CS"): every cast a kernel of its own,
    /// reading its input once more for the maximum unless the kernel that wrote it took it.
    #[serde(alias = "tensorwise")]
    Current,
    /// One scale per row of each GEMM operand, along the dimension the GEMM reduces
    /// (torchao's `Float8LinearRecipeName.ROWWISE`, torchtitan's `recipe_name =
    /// "rowwise"`): the two passes reduce a tensor along different dimensions, so each
    /// operand is cast twice from its 16-bit values — row-wise (the maximum of each row
    /// taken in the kernel) and column-wise — priced as one cast that reads its input
    /// twice and writes both copies; the weights at every micro-batch (torchao keeps no
    /// FP8 copy). The forward GEMM's epilogue scaling (one multiply per output element)
    /// is left out; the two backward GEMMs' outputs are rescaled by a kernel of their own
    /// (torchao runs them on cuBLAS's per-tensor kernel with unit scales: docs/training-model.md,
    /// "Casts"). Sequence parallelism's gathers move the 16-bit inputs, cast after them
    /// (torchtitan's plain tensor-parallel styles for this recipe).
    Rowwise,
    /// DeepSeek-V3's fine-grained scaling (Transformer Engine's `Float8BlockScaling`,
    /// Megatron-LM's `--fp8-recipe blockwise`): activations and gradients in 1 × 128
    /// tiles, weights in 128 × 128 blocks, one fp32 scale each; every cast a kernel of its
    /// own that reads each tile once (its maximum is local) and writes the copies both
    /// passes need (row and column tiles), a weight's once per step (a block's scale serves
    /// its transpose). The GEMM promotes its partial sums to fp32 with their scales every
    /// 128 elements of the reduction, on the CUDA cores while the tensor cores run the
    /// next block (DeepSeek-V3 report §3.3.2); it is priced at per-tensor FP8's rate, as
    /// the cost-model interface cannot tell the latency model a GEMM's scaling (DeepGEMM's
    /// block-scaled GEMMs reach some 15% less: docs/training-model.md).
    Blockwise,
}

impl Fp8Scaling {
    /// The library that runs this recipe when `said` is the one named: the row-wise
    /// recipe is torchao's whatever is said.
    pub fn run_by(self, said: crate::execution::Fp8Library) -> crate::execution::Fp8Library {
        if self == Fp8Scaling::Rowwise {
            crate::execution::Fp8Library::Torchao
        } else {
            said
        }
    }

    pub const ALL: [Fp8Scaling; 4] = [
        Fp8Scaling::Delayed,
        Fp8Scaling::Current,
        Fp8Scaling::Rowwise,
        Fp8Scaling::Blockwise,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fp8Scaling::Delayed => "delayed",
            Fp8Scaling::Current => "current",
            Fp8Scaling::Rowwise => "rowwise",
            Fp8Scaling::Blockwise => "blockwise",
        }
    }

    /// Whether a cast reads its input a second time: for the tensor's own maximum
    /// (current scaling; not where the kernel that wrote it took it), for the second,
    /// column-wise copy (row-wise scales). A block-wise cast reads each 128-element tile
    /// once and writes both copies (Transformer Engine's `quantize_transpose_*_blockwise`
    /// kernels; a weight's 128 × 128 block serves its transpose).
    pub fn casts_read_twice(self) -> bool {
        matches!(self, Fp8Scaling::Current | Fp8Scaling::Rowwise)
    }

    /// Whether a norm, activation or element-wise kernel writes the cast of its output
    /// itself: only with delayed scaling (Transformer Engine's `Impl::FULLY_FUSED`); with
    /// the others every cast is a kernel of its own.
    pub fn casts_fuse(self) -> bool {
        self == Fp8Scaling::Delayed
    }
}

/// What is recomputed in the backward pass instead of kept from the forward pass.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Recomputation {
    /// Every activation the backward pass needs is kept.
    #[default]
    None,
    /// The modules the plan's [`RecomputeModules`] name are recomputed: by default the
    /// attention core (scores, softmax, its dropout, the product with the values, or the
    /// fused kernel doing them; Korthikanti et al. 2022, "selective activation
    /// recomputation"; Megatron-LM's `--recompute-modules core_attn`).
    Selective,
    /// PyTorch's per-operator selective checkpointing as torchtitan applies it to each
    /// block (`activation_checkpoint.mode = "selective"`, `selective_ac_option = "op"`):
    /// the block's input is kept, and the outputs of the fused attention kernel (with its
    /// log-sum-exp), of sequence parallelism's reduce-scatters and of every other `mm` in
    /// the order the block runs them (the first, the third, …: a 16-bit weight GEMM per
    /// linear layer; FP8's scaled GEMMs and the experts' grouped GEMMs are not `mm`);
    /// every other operator — norms, activations, the other half of the linear layers,
    /// the all-gathers, casts — runs again in backward (docs/training-model.md,
    /// "Per-operator selective checkpointing").
    SelectiveOp,
    /// Only each block's input is kept; the whole forward pass of a block runs again.
    Full,
}

impl Recomputation {
    pub fn name(self) -> &'static str {
        match self {
            Recomputation::None => "none",
            Recomputation::Selective => "selective",
            Recomputation::SelectiveOp => "selective_op",
            Recomputation::Full => "full",
        }
    }

    /// Whether the rerun forward pass runs the attention again (and with context
    /// parallelism its key-value exchanges): full recomputation, and selective with the
    /// attention core among `modules` (the core is the fused kernel too); per-operator
    /// checkpointing keeps the kernel's output.
    pub fn reruns_attention(self, modules: RecomputeModules) -> bool {
        match self {
            Recomputation::Full => true,
            Recomputation::Selective => modules.contains(RecomputeModule::CoreAttn),
            Recomputation::None | Recomputation::SelectiveOp => false,
        }
    }

    /// Whether the rerun forward pass exchanges a Mixture-of-Experts block's tokens again:
    /// full recomputation reruns the whole block, per-operator checkpointing keeps no
    /// all-to-all's output, selective recomputation with the MoE layer among `modules`
    /// reruns it whole.
    pub fn reruns_all_to_all(self, modules: RecomputeModules) -> bool {
        match self {
            Recomputation::Full | Recomputation::SelectiveOp => true,
            Recomputation::Selective => modules.contains(RecomputeModule::Moe),
            Recomputation::None => false,
        }
    }
}

/// A module Megatron-LM's selective recomputation can run again in backward
/// (`--recompute-granularity selective --recompute-modules …`,
/// `megatron/core/transformer/transformer_config.py`): a checkpointed module keeps its
/// input and runs its forward again; the three Megatron-LM checkpoints "without output"
/// (`CheckpointWithoutOutput`) also drop their output, which the operator after them
/// would keep, and run again just before that operator's backward needs it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum RecomputeModule {
    /// The attention core: scores, softmax, its dropout and the product with the values,
    /// or the fused kernel doing them (Korthikanti et al. 2022; Megatron-LM's default).
    CoreAttn,
    /// The norms before attention and before the MLP of a pre-norm block (without
    /// output: the next GEMM's kept input is the norm's output).
    Layernorm,
    /// A dense block's MLP (its projections, activation and tensor-parallel collectives).
    Mlp,
    /// A Mixture-of-Experts block's whole FFN: router, permutation, the experts'
    /// exchanges and GEMMs, shared experts.
    Moe,
    /// The experts' activation (with a gated MLP, the product with the up projection;
    /// without output).
    MoeAct,
    /// The shared experts' MLP.
    SharedExperts,
    /// Multi-head latent attention's up-projections and rotary embedding (without output).
    MlaUpProj,
}

impl RecomputeModule {
    pub const ALL: [RecomputeModule; 7] = [
        RecomputeModule::CoreAttn,
        RecomputeModule::Layernorm,
        RecomputeModule::Mlp,
        RecomputeModule::Moe,
        RecomputeModule::MoeAct,
        RecomputeModule::SharedExperts,
        RecomputeModule::MlaUpProj,
    ];

    pub fn name(self) -> &'static str {
        match self {
            RecomputeModule::CoreAttn => "core_attn",
            RecomputeModule::Layernorm => "layernorm",
            RecomputeModule::Mlp => "mlp",
            RecomputeModule::Moe => "moe",
            RecomputeModule::MoeAct => "moe_act",
            RecomputeModule::SharedExperts => "shared_experts",
            RecomputeModule::MlaUpProj => "mla_up_proj",
        }
    }

    /// Whether Megatron-LM checkpoints it without its output (`CheckpointWithoutOutput`):
    /// the output is dropped wherever it would be kept.
    pub fn drops_output(self) -> bool {
        matches!(
            self,
            RecomputeModule::Layernorm | RecomputeModule::MoeAct | RecomputeModule::MlaUpProj
        )
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// The modules selective recomputation runs again ([`Recomputation::Selective`]): the
/// attention core unless said otherwise, as Megatron-LM's default. Written as a list of
/// module names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(from = "Vec<RecomputeModule>", into = "Vec<RecomputeModule>")]
pub struct RecomputeModules(u8);

impl Default for RecomputeModules {
    fn default() -> Self {
        RecomputeModules::of([RecomputeModule::CoreAttn])
    }
}

impl RecomputeModules {
    pub fn of(modules: impl IntoIterator<Item = RecomputeModule>) -> Self {
        RecomputeModules(modules.into_iter().fold(0, |bits, m| bits | m.bit()))
    }

    pub fn contains(self, m: RecomputeModule) -> bool {
        self.0 & m.bit() != 0
    }

    /// The modules, in [`RecomputeModule::ALL`]'s order.
    pub fn iter(self) -> impl Iterator<Item = RecomputeModule> {
        RecomputeModule::ALL
            .into_iter()
            .filter(move |&m| self.contains(m))
    }

    /// The names, comma-separated (for messages and reports).
    pub fn names(self) -> String {
        self.iter()
            .map(RecomputeModule::name)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl From<Vec<RecomputeModule>> for RecomputeModules {
    fn from(v: Vec<RecomputeModule>) -> Self {
        RecomputeModules::of(v)
    }
}

impl From<RecomputeModules> for Vec<RecomputeModule> {
    fn from(m: RecomputeModules) -> Self {
        m.iter().collect()
    }
}

/// How the memory of a device is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MemoryModel {
    /// As Megatron-LM trains: bytes per parameter from the precision and optimizer,
    /// activations per recomputation and sequence parallelism (Korthikanti et al. 2022).
    Megatron,
    /// The reference system's: two copies of the parameters (weights and gradients) plus
    /// the optimizer's copies, `bytes_per_element` for everything. Kept for comparisons.
    Reference,
}

/// Bytes of state one device holds per parameter it owns.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StateBytes {
    pub weights: f64,
    pub gradients: f64,
    /// Master weights, the optimizer's gradient copy and its moments (sharded over the
    /// data-parallel group with the distributed optimizer).
    pub optimizer: f64,
}

impl StateBytes {
    /// Megatron-LM's bytes per parameter for `precision` and `optimizer`, with the
    /// optimizer's part sharded over `data_parallel` devices when `distributed` (ZeRO-1).
    pub fn megatron(
        precision: Precision,
        optimizer: Optimizer,
        distributed: bool,
        data_parallel: u64,
    ) -> StateBytes {
        StateBytes::sharded(precision, optimizer, u64::from(distributed), data_parallel)
    }

    /// The one place that decides how data parallelism shards each state (ZeRO,
    /// Rajbhandari et al. 2020): bytes per parameter of a device whose data-parallel group
    /// of `group` ranks holds the state at `zero_stage` — the optimizer's part (master
    /// weights, gradient copy, moments) sharded from stage 1 (Megatron-LM's distributed
    /// optimizer), the gradients from stage 2, the weights from stage 3 (FSDP). What a
    /// device holds besides its shards while it works (a layer's gathered weights and
    /// unsharded gradient) is the step model's: see `step::zero_buffers`.
    pub fn sharded(
        precision: Precision,
        optimizer: Optimizer,
        zero_stage: u64,
        group: u64,
    ) -> StateBytes {
        // Plain SGD in mixed precision still updates fp32 master weights.
        let own = (precision.optimizer_own_bytes() + 4 * optimizer.moments()) as f64;
        let over = |stage: u64| {
            if zero_stage >= stage {
                group.max(1) as f64
            } else {
                1.0
            }
        };
        StateBytes {
            weights: precision.element_bytes() as f64 / over(3),
            gradients: precision.gradient_bytes() as f64 / over(2),
            optimizer: own / over(1),
        }
    }

    /// The bytes of one unsharded weight and one unsharded gradient, what a data-parallel
    /// all-gather of weights and a reduction of gradients move per parameter.
    pub fn unsharded(precision: Precision) -> (f64, f64) {
        (
            precision.element_bytes() as f64,
            precision.gradient_bytes() as f64,
        )
    }

    /// The reference's: weights and gradients at `bytes_per_element`, the optimizer as
    /// copies of the weights.
    pub fn reference(optimizer: Optimizer, bytes_per_element: u64) -> StateBytes {
        let b = bytes_per_element as f64;
        StateBytes {
            weights: b,
            gradients: b,
            optimizer: optimizer.reference_copies() * b,
        }
    }

    pub fn total(&self) -> f64 {
        self.weights + self.gradients + self.optimizer
    }
}

/// The training plan's fixed inputs and the choices the search makes among.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Training {
    /// Samples per optimizer step.
    pub global_batch: u64,
    /// Micro-batch sizes to try; each divides the global batch.
    pub micro_batch_sizes: Vec<u64>,
    /// Recomputation choices to try.
    pub activation_recomputation: Vec<Recomputation>,
    pub optimizer: Optimizer,
    /// Numeric formats to try (the Megatron memory model; the reference model uses
    /// `bytes_per_element`).
    pub precisions: Vec<Precision>,
    /// How the FP8 recipe's per-tensor scales are chosen (`[training] fp8_scaling`).
    pub fp8_scaling: Fp8Scaling,
    /// FP8 parameters with an FP8 recipe (`[training] fp8_param_gather`).
    pub fp8_param_gather: bool,
    /// Distributed-optimizer choices to try.
    pub distributed_optimizer: Vec<bool>,
    /// ZeRO stages to try (`[training] zero_stage`); empty: those `distributed_optimizer`
    /// gives (0 without it, 1 with it).
    pub zero_stages: Vec<u64>,
    /// ZeRO-3 frees each layer's gathered weights after forward (FSDP's default), each
    /// value tried; empty: true.
    pub reshard_after_forward: Vec<bool>,
    /// Data-parallel traffic overlaps computation.
    pub data_parallel_overlap: bool,
    /// Sequence-parallelism choices to try (they matter for widths above 1).
    pub sequence_parallel: Vec<bool>,
    /// Model chunks per device to try (1: plain 1F1B; above 1: interleaved 1F1B with
    /// equal chunks).
    pub pipeline_interleaving: Vec<u64>,
    /// Pipeline schedules to try (`[training] pipeline_schedule`), in
    /// [`PipelineSchedule::ALL`]'s order; empty: 1F1B, and the interleaved schedule for
    /// the interleavings above 1.
    pub pipeline_schedules: Vec<PipelineSchedule>,
    /// Expert-parallel widths to try for Mixture-of-Experts models (each model takes those
    /// dividing its experts; dense models run 1).
    pub expert_parallel: Vec<u64>,
    /// Context-parallel sizes to try (`[training] context_parallel`; each model takes
    /// those its sequence splits into); empty: 1.
    pub context_parallel: Vec<u64>,
    /// How the context-parallel ranks exchange keys and values.
    pub context_exchange: ContextExchange,
    /// What selective recomputation runs again (`[training] recompute_modules`).
    pub recompute_modules: RecomputeModules,
    /// Mixture-of-Experts all-to-all exchanges overlap computation
    /// (`[training] all_to_all_overlap`).
    pub all_to_all_overlap: bool,
    /// With interleaving, pipeline transfers overlap the steady state's computation
    /// (`[training] pipeline_parallel_overlap`).
    pub pipeline_parallel_overlap: bool,
    pub memory_model: MemoryModel,
    /// Element bytes of the reference memory model (and of every graph when it is used).
    pub bytes_per_element: u64,
    /// Which of a layer's operators may overlap on the chip.
    pub execution: crate::execution::Execution,
}

/// The devices and their links.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Cluster {
    pub devices: u64,
    /// The bandwidth the search's placement charges pipeline and data-parallel traffic
    /// at: the one tier's, or with two tiers the inter-node one's.
    pub link_bytes_per_second: f64,
    /// HBM sizes to try.
    pub hbm_bytes: Vec<u64>,
    /// The network's tiers (one tier: [`crate::network::Network::flat`] of the link bandwidth).
    pub network: crate::network::Network,
    /// Scale-up domain sizes a search tries (`[cluster] node_size` as a list): each a
    /// network of its own node size and intra-node tier, the first of them `network`;
    /// empty: `network` alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub domains: Vec<crate::network::Network>,
}

impl Cluster {
    /// The networks a search tries: every scale-up domain, or the one network.
    pub fn networks(&self) -> &[crate::network::Network] {
        if self.domains.is_empty() {
            std::slice::from_ref(&self.network)
        } else {
            &self.domains
        }
    }
}

/// A fixed parallelisation to compare against (`docs/reference.md` §1.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Baseline {
    pub pipeline: u64,
    pub data: u64,
    pub tensor: u64,
}

/// How a context-parallel group exchanges the keys and values of its ranks' chunks of the
/// sequence (Megatron-Core's `--cp-comm-type`, Transformer Engine's implementations).
/// Serialised flat into the plan, each key only when it is not its default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextExchange {
    /// Ring (`p2p`, the default) or gather (`all_gather`).
    #[serde(
        rename = "context_parallel_exchange",
        default,
        skip_serializing_if = "ContextMethod::is_ring"
    )]
    pub method: ContextMethod,
    /// With the ring: each step's transfer of the next chunk's keys and values runs while
    /// the attention of the chunk at hand computes (Transformer Engine's default); `false`
    /// runs them one after the other.
    #[serde(
        rename = "context_parallel_overlap",
        default = "yes",
        skip_serializing_if = "is_true"
    )]
    pub overlap: bool,
}

impl Default for ContextExchange {
    fn default() -> Self {
        ContextExchange {
            method: ContextMethod::Ring,
            overlap: true,
        }
    }
}

/// The ways a context-parallel group shares what attention needs across the sequence.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum ContextMethod {
    /// Ring attention: `CP − 1` steps, each passing the keys and values a rank holds to the
    /// next rank (and, backward, their gradients with them) while attending to the chunk
    /// at hand (`--cp-comm-type p2p`).
    #[default]
    Ring,
    /// The keys and values all-gathered before attention (and their gradients
    /// reduce-scattered after it), not overlapped (`--cp-comm-type all_gather`).
    AllGather,
    /// DeepSpeed-Ulysses (Jacobs et al. 2023, "DeepSpeed Ulysses: System Optimizations for
    /// Enabling Training of Extreme Long Sequence Transformer Models", §3): an all-to-all
    /// turns each rank's queries, keys and values of its share of the sequence into the
    /// whole sequence's of `1/CP` of the heads; attention runs on those heads; a second
    /// all-to-all returns the output to the sequence split. Backward the same two, the
    /// output gradient's and then the query, key and value gradients'. Not overlapped
    /// (`--cp-comm-type a2a`, Transformer Engine's `a2a`); the heads — and the key-value
    /// heads — of a tensor-parallel rank must divide among the CP ranks.
    AllToAll,
}

impl ContextMethod {
    pub const ALL: [ContextMethod; 3] = [
        ContextMethod::Ring,
        ContextMethod::AllGather,
        ContextMethod::AllToAll,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ContextMethod::Ring => "ring",
            ContextMethod::AllGather => "all_gather",
            ContextMethod::AllToAll => "all_to_all",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }

    pub(crate) fn is_ring(&self) -> bool {
        *self == ContextMethod::Ring
    }
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Megatron-LM's table of bytes per parameter (its distributed-optimizer document): 20, 18 and
    /// 16 without the distributed optimizer; 4 + 16/d, 6 + 12/d and 8 + 8/d with it.
    #[test]
    fn adam_bytes_per_parameter_match_megatron() {
        let cases = [
            (Precision::Fp16Mixed, 20.0, 4.0, 16.0),
            (Precision::Bf16Mixed, 18.0, 6.0, 12.0),
            (Precision::Fp32, 16.0, 8.0, 8.0),
        ];
        for (p, plain, fixed, sharded) in cases {
            assert_eq!(
                StateBytes::megatron(p, Optimizer::Adam, false, 64).total(),
                plain
            );
            for d in [1, 2, 8, 64] {
                let s = StateBytes::megatron(p, Optimizer::Adam, true, d);
                assert_eq!(s.total(), fixed + sharded / d as f64, "{p:?} d={d}");
            }
        }
    }

    /// ZeRO's bytes per parameter (Rajbhandari et al. 2020, §5.1: for stages 0–3,
    /// `(2 + 2 + K)Ψ`, `(2 + 2 + K/N_d)Ψ`, `(2 + (2 + K)/N_d)Ψ`, `(2 + 2 + K)Ψ/N_d` with
    /// `Ψ` parameters, `N_d` ranks and `K` bytes of optimizer state), with Megatron-LM's bytes
    /// per state (the fp32 gradients of bf16 training, the fp32 gradient copy of fp16
    /// training) for every precision: each stage shards one more state, exactly.
    #[test]
    fn zero_stages_shard_one_more_state_each() {
        // (precision, weight bytes, gradient bytes, optimizer bytes) per parameter.
        let cases = [
            // fp32 master weights, an fp32 copy of the gradients, two fp32 moments.
            (Precision::Fp16Mixed, 2.0, 2.0, 16.0),
            // fp32 gradient accumulation; fp32 master weights and moments.
            (Precision::Bf16Mixed, 2.0, 4.0, 12.0),
            (Precision::Fp32, 4.0, 4.0, 8.0),
        ];
        for (p, w, g, o) in cases {
            for d in [1_u64, 2, 8, 64] {
                let n = d as f64;
                let want = [w + g + o, w + g + o / n, w + (g + o) / n, (w + g + o) / n];
                for (stage, want) in want.into_iter().enumerate() {
                    let s = StateBytes::sharded(p, Optimizer::Adam, stage as u64, d);
                    assert!(
                        (s.total() - want).abs() < 1e-12,
                        "{p:?} stage {stage} d {d}"
                    );
                }
                assert_eq!(
                    StateBytes::sharded(p, Optimizer::Adam, 1, d),
                    StateBytes::megatron(p, Optimizer::Adam, true, d)
                );
            }
        }
    }

    #[test]
    fn fewer_moments_less_state() {
        let b = |o| StateBytes::megatron(Precision::Bf16Mixed, o, false, 1).total();
        assert_eq!(b(Optimizer::Adam), 18.0);
        assert_eq!(b(Optimizer::SgdMomentum), 14.0);
        assert_eq!(b(Optimizer::Sgd), 10.0);
        assert_eq!(
            StateBytes::megatron(Precision::Fp32, Optimizer::Sgd, false, 1).total(),
            8.0
        );
    }

    #[test]
    fn reference_counts_copies() {
        assert_eq!(StateBytes::reference(Optimizer::Adam, 2).total(), 6.0);
        assert_eq!(StateBytes::reference(Optimizer::Sgd, 2).total(), 4.0);
    }
}
