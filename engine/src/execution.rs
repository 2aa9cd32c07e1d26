//! How the software that trains the model lets a layer's operators share the chip.
//!
//! The layer schedule's own semantics are a dataflow accelerator's (the reference's):
//! operators on different cores run at the same time, and tensor-parallel collectives use
//! the network while the cores compute. Frameworks do not always allow that: Megatron-LM
//! on GPUs issues one kernel at a time on one stream, each kernel spread over the whole
//! chip, and waits for every tensor-parallel collective before the next kernel that
//! follows it. [`Execution`] says which: a choice of the training plan, an input of the
//! search (`crate::operators::restrict` turns a layer's scheduling instance into one that
//! allows only that).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Whether a layer's operators may run at the same time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OperatorExecution {
    /// Operators on different cores overlap (a dataflow accelerator; the reference's
    /// semantics).
    #[default]
    Concurrent,
    /// One operator at a time, each on all the cores of its type (eager frameworks with one
    /// stream, such as Megatron-LM and PyTorch on GPUs).
    Sequential,
}

impl OperatorExecution {
    pub const ALL: [OperatorExecution; 2] =
        [OperatorExecution::Concurrent, OperatorExecution::Sequential];

    pub fn name(self) -> &'static str {
        match self {
            OperatorExecution::Concurrent => "concurrent",
            OperatorExecution::Sequential => "sequential",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|e| e.name() == name)
    }
}

/// Whether and how tensor-parallel collectives overlap computation. Written `false` /
/// `true` (the two it had first: none, pipelined) or by name.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord, Serialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum TensorParallelOverlap {
    /// Each collective runs alone, as Megatron-LM runs them without its overlap options.
    #[default]
    None,
    /// Transformer Engine's overlap (Megatron-LM's `--tp-comm-overlap`; NeMo's "Communication
    /// Overlap" page): besides overlapping what the graph lets them ("bulk"), sequence
    /// parallelism's all-gathers and reduce-scatters are cut into as many chunks as the
    /// group has ranks and pipelined with the GEMM they feed or drain, one chunk of either
    /// exposed (`crate::operators::pipelined_exposure`).
    Pipelined,
    /// PyTorch's asynchronous tensor parallelism (torch.compile's micro-pipeline pass;
    /// `torch.ops.symm_mem.fused_all_gather_matmul` and `fused_matmul_reduce_scatter`;
    /// Wang et al., "Introducing Async Tensor Parallelism in PyTorch", 2024): the GEMM an
    /// all-gather feeds or a reduce-scatter drains is decomposed into one GEMM per rank's
    /// shard of the rows, each `1/t` of them — `t` kernels, each less efficient than the
    /// whole (their waves' tails) — while the copy engines move the shards. The gather's
    /// first GEMM takes the rank's own shard, so only what the others' transfers take
    /// beyond the remaining GEMMs is exposed; the reduce-scatter's last shard is sent after
    /// its GEMM. Other collectives overlap as the graph lets them.
    Async,
}

impl TensorParallelOverlap {
    pub const ALL: [TensorParallelOverlap; 3] = [
        TensorParallelOverlap::None,
        TensorParallelOverlap::Pipelined,
        TensorParallelOverlap::Async,
    ];

    pub fn name(self) -> &'static str {
        match self {
            TensorParallelOverlap::None => "none",
            TensorParallelOverlap::Pipelined => "pipelined",
            TensorParallelOverlap::Async => "async",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|o| o.name() == name)
    }

    /// Whether collectives overlap computation at all.
    pub fn overlaps(self) -> bool {
        self != TensorParallelOverlap::None
    }
}

impl From<bool> for TensorParallelOverlap {
    /// `true`: the overlap the key meant before it had names (Transformer Engine's).
    fn from(on: bool) -> Self {
        if on {
            TensorParallelOverlap::Pipelined
        } else {
            TensorParallelOverlap::None
        }
    }
}

impl<'de> Deserialize<'de> for TensorParallelOverlap {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Given {
            Flag(bool),
            Name(String),
        }
        match Given::deserialize(d)? {
            Given::Flag(on) => Ok(on.into()),
            Given::Name(name) => Self::from_name(&name).ok_or_else(|| {
                serde::de::Error::custom(format!(
                    "unknown tensor-parallel overlap \"{name}\": use \"none\", \"pipelined\" or \"async\" (or false / true)"
                ))
            }),
        }
    }
}

/// How the framework turns a layer's element-wise operators (norms, activations, rotary
/// embeddings, residual additions, the loss) into kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum KernelFusion {
    /// Fused kernels: a GEMM's epilogue takes the element-wise work after it, and each
    /// norm, activation or rotary embedding is one kernel over 16-bit data — Transformer
    /// Engine and Megatron-Core's fused kernels, or PyTorch under `torch.compile`, whose
    /// Inductor backend generates them.
    #[default]
    Fused,
    /// PyTorch without `torch.compile` (eager mode): every operator is a kernel of its
    /// own, none in a GEMM's epilogue, and the operators PyTorch has no kernel for run as
    /// the Python code of the model writes them: RMSNorm as the Llama implementations
    /// (Meta's reference, Hugging Face's, torchtitan's, IBM's fms) compute it — a cast of
    /// the input to fp32, its square, the mean of each row, the reciprocal square root,
    /// the product, a cast back to 16-bit and the weight's product, eight kernels — the
    /// rotary embedding as a cast to fp32, a complex product and a cast back. LayerNorm,
    /// GELU, SiLU, softmax and the loss keep their one native kernel each.
    Eager,
}

impl KernelFusion {
    pub fn name(self) -> &'static str {
        match self {
            KernelFusion::Fused => "fused",
            KernelFusion::Eager => "eager",
        }
    }
}

/// The library that runs an FP8 recipe's casts and GEMMs (`[training] fp8_library`):
/// what a quantised linear layer keeps for its backward pass and how often it casts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Fp8Library {
    /// NVIDIA's Transformer Engine (Megatron-Core, NeMo, Megatron-Bridge): the forward
    /// cast writes the FP8 copies both passes use, the weight gradient's input is saved in
    /// FP8, and a weight's FP8 copy is kept for the step (at ZeRO-3 made at each gather).
    #[default]
    TransformerEngine,
    /// PyTorch's torchao (torchtitan's Float8 training): its linear layers' autograd
    /// function (`matmul_with_hp_or_float8_args`, `torchao/float8/float8_linear.py`) saves
    /// the 16-bit input and weight for the backward pass and casts them again there, so
    /// the activations are the 16-bit ones and every use of a weight casts it (forward and
    /// backward, each micro-batch); no FP8 copy outlives the kernel that reads it. Its
    /// row-wise recipe always runs so.
    Torchao,
}

impl Fp8Library {
    pub fn name(self) -> &'static str {
        match self {
            Fp8Library::TransformerEngine => "transformer_engine",
            Fp8Library::Torchao => "torchao",
        }
    }
}

/// How the loss over the vocabulary is computed (`[training] cross_entropy`): it decides
/// what the head holds beside the fp32 softmax it keeps for backward while the loss and its
/// gradient are computed — at long sequences and large vocabularies a stage's largest
/// transient (8,192 tokens of Llama 3's 128,256-entry vocabulary are 1.05 G logits) — and
/// how many times its kernels move the logits through HBM
/// (the layer graph's cross-entropy kernels: one kernel each way when fused, every
/// PyTorch operation its own otherwise).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CrossEntropy {
    /// A fused, in-place computation, counted as keeping the fp32 softmax (4 bytes a
    /// logit) and holding nothing beside it, one kernel forward and one backward:
    /// Megatron-Core's with `--cross-entropy-loss-fusion` (NeMo's and Megatron-Bridge's
    /// recipes), Transformer Engine's kernel, like flash-attn's that llm-foundry's MPT runs,
    /// keeps the 16-bit logits and writes the gradient into them (2 bytes kept, fewer than
    /// counted); torch.compile's generated kernels.
    #[default]
    Fused,
    /// Megatron-Core's vocabulary-parallel cross-entropy as separate PyTorch operations
    /// (Megatron-LM without `--cross-entropy-loss-fusion`, off unless given:
    /// `megatron/core/tensor_parallel/cross_entropy.py`): an fp32 copy of the logits
    /// (`.float()`), their row maxima, then in place the subtraction, the exponential and,
    /// after the row sums, the division that leaves the softmax it keeps; backward
    /// multiplies that softmax in place by the loss's gradient (after subtracting one at
    /// each target) and casts it to 16 bits for the output layer. Memory as fused (the
    /// 16-bit logits or gradient beside the fp32 copy, 2 bytes a logit for a moment, are
    /// not counted); six kernels forward, two backward, some 56 bytes of HBM traffic a
    /// logit where the fused kernels move about 18.
    Unfused,
    /// PyTorch's `F.cross_entropy` over the logits cast to fp32 (torchtitan's
    /// `cross_entropy_loss`: `cross_entropy(pred.flatten(0, 1).float(), labels)`; fms-fsdp's
    /// and Hugging Face's losses likewise): log-softmax keeps its fp32 output; backward
    /// allocates the loss's dense fp32 gradient and log-softmax's fp32 input gradient
    /// beside it — 8 bytes per logit (forward's peak, the 16-bit logits and their fp32
    /// copy, is 6). With the vocabulary split over tensor-parallel ranks, PyTorch computes
    /// it as DTensor's loss parallelism (`torch.distributed.tensor.parallel.loss_parallel`,
    /// torchtitan's default under tensor parallelism), which decomposes it: forward's
    /// log-softmax is a subtraction, an exponential and a sum over the local shard, and
    /// backward is `(zeros_like(x) + exp(x)) * grad` — three fp32 tensors the size of the
    /// shard's logits at once beside the kept softmax, 12 bytes per logit.
    Eager,
}

impl CrossEntropy {
    pub fn name(self) -> &'static str {
        match self {
            CrossEntropy::Fused => "fused",
            CrossEntropy::Unfused => "unfused",
            CrossEntropy::Eager => "eager",
        }
    }

    /// Bytes per logit (on this rank) the loss holds at its peak beside the fp32 softmax
    /// the head keeps for backward, its vocabulary `split` over tensor-parallel ranks or
    /// whole.
    pub fn workspace_bytes_per_logit(self, split: bool) -> u64 {
        match (self, split) {
            (CrossEntropy::Fused | CrossEntropy::Unfused, _) => 0,
            (CrossEntropy::Eager, false) => 8,
            (CrossEntropy::Eager, true) => 12,
        }
    }
}

/// How a layer runs: operator concurrency and whether tensor-parallel collectives may
/// overlap computation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Execution {
    pub operators: OperatorExecution,
    /// Whether and how tensor-parallel collectives overlap independent computation (none
    /// by default). With concurrent operators any overlap lets them run beside what the
    /// graph allows; with sequential operators [`TensorParallelOverlap`] says how.
    pub tensor_parallel_overlap: TensorParallelOverlap,
    /// How the layer's element-wise operators become kernels (fused unless said): what
    /// the layer graphs are built with ([`crate::model::BuildOptions::kernels`]).
    #[serde(default, skip_serializing_if = "is_default")]
    pub kernels: KernelFusion,
    /// The library that runs an FP8 recipe (Transformer Engine unless said): what the
    /// layer graphs save and cast ([`crate::model::BuildOptions::fp8_library`]) and how
    /// often the step casts the weights.
    #[serde(default, skip_serializing_if = "is_default")]
    pub fp8_library: Fp8Library,
    /// The share of a GEMM's time in which a collective pipelined or decomposed beside it
    /// moves at its rate alone: the cluster's `overlap_efficiency`
    /// ([`crate::network::Network::overlap_efficiency`]), which the layer's tensor-parallel
    /// overlaps need where the schedule is built.
    #[serde(default, skip_serializing_if = "is_default")]
    pub overlap_efficiency: Fraction,
    /// How the loss is computed (fused unless said): what the head holds while it runs
    /// ([`crate::model::BuildOptions::cross_entropy`]).
    #[serde(default, skip_serializing_if = "is_default")]
    pub cross_entropy: CrossEntropy,
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

/// A fraction that keys a cache as the rest of [`Execution`] does: equal and hashed by
/// its bits. Default 1.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Fraction(pub f64);

impl Default for Fraction {
    fn default() -> Self {
        Fraction(1.0)
    }
}

impl PartialEq for Fraction {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

impl Eq for Fraction {}

impl std::hash::Hash for Fraction {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.to_bits().hash(state);
    }
}

impl Execution {
    /// The reference's semantics: everything that can overlap does.
    pub const DATAFLOW: Execution = Execution {
        operators: OperatorExecution::Concurrent,
        tensor_parallel_overlap: TensorParallelOverlap::Pipelined,
        kernels: KernelFusion::Fused,
        fp8_library: Fp8Library::TransformerEngine,
        overlap_efficiency: Fraction(1.0),
        cross_entropy: CrossEntropy::Fused,
    };

    /// Whether operators run on all cores only (no single-core durations are needed).
    pub fn all_cores_only(self) -> bool {
        self.operators == OperatorExecution::Sequential
    }
}
