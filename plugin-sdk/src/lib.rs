//! The contract between archplace and a cost model.
//!
//! A cost model answers two questions about a candidate accelerator:
//! how large is it ([`AreaModel`], µm² of silicon) and how long does an operator take on
//! some of its cores ([`LatencyModel`], seconds and joules). The search engine depends only
//! on these traits, so the reference model, a vendor's model and a test double are
//! interchangeable. Everything here is plain data: integers where the quantity is a count
//! (so records can be hashed and memoised exactly), SI units everywhere, the unit in the
//! field name.
//!
//! The same records cross the WebAssembly boundary through the WIT interface in
//! `wit/cost-model.wit` (`archplace:cost-model@1.3.0`): a vendor implements [`Plugin`] on a
//! type and calls [`export_plugin!`], and `cargo build --target wasm32-wasip2` makes a
//! component that archplace loads in its sandbox. See the crate's README for the whole
//! vendor workflow.

use serde::{Deserialize, Serialize};

pub mod gpus;
pub mod text;
pub mod units;

#[cfg(feature = "testing")]
pub mod testing;

#[cfg(target_arch = "wasm32")]
#[doc(hidden)]
pub mod guest;

/// Guest bindings generated from `wit/cost-model.wit` (only when building a plugin).
#[cfg(target_arch = "wasm32")]
#[doc(hidden)]
#[allow(unsafe_code, clippy::all)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "wit",
        world: "cost-model",
        pub_export_macro: true,
        export_macro_name: "export",
        default_bindings_module: "archplace_plugin_sdk::bindings",
    });
}

/// The WIT package this crate implements, as it appears in component export names.
pub const WIT_PACKAGE: &str = "archplace:cost-model";
/// The WIT text of the interface (for tools that want to show or check it).
pub const WIT: &str = include_str!("../wit/cost-model.wit");

/// Version of the cost-model interface described by this crate (major, minor).
/// Minor versions only add; a host supports every minor of its major.
pub const INTERFACE_VERSION: (u16, u16) = (1, 3);

/// One candidate accelerator: a number of tensor cores (each a `width × depth` MAC array),
/// a number of vector cores (each `vector_width` lanes) and one on-chip global buffer
/// shared by all cores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AcceleratorConfig {
    pub tensor_cores: u32,
    pub vector_cores: u32,
    /// Columns of each tensor core's MAC array.
    pub width: u32,
    /// Rows of each tensor core's MAC array.
    pub depth: u32,
    /// Lanes of each vector core.
    pub vector_width: u32,
    /// On-chip global buffer.
    pub buffer_bytes: u64,
}

impl AcceleratorConfig {
    /// The tensor-core part, using `cores` of the tensor cores.
    pub fn tensor_core(&self, cores: u32) -> CoreConfig {
        CoreConfig {
            kind: CoreKind::Tensor,
            cores,
            width: self.width,
            depth: self.depth,
            buffer_bytes: self.buffer_bytes,
        }
    }

    /// The vector-core part, using `cores` of the vector cores.
    pub fn vector_core(&self, cores: u32) -> CoreConfig {
        CoreConfig {
            kind: CoreKind::Vector,
            cores,
            width: self.vector_width,
            depth: 1,
            buffer_bytes: self.buffer_bytes,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CoreKind {
    Tensor,
    Vector,
}

/// The cores an operator runs on: `cores` cores of one kind (one core, or all cores of the
/// type for intra-operator parallelism), each `width × depth` (vector cores: `depth = 1`),
/// sharing a global buffer of `buffer_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CoreConfig {
    pub kind: CoreKind,
    pub cores: u32,
    pub width: u32,
    pub depth: u32,
    pub buffer_bytes: u64,
}

/// Forward or backward pass. Element-wise operators cost differently in each direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    Forward,
    Backward,
}

/// Element-wise and reduction operators that run on vector lanes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VectorKind {
    LayerNorm,
    RmsNorm,
    /// Element-wise sum of two activations (residual connections).
    Add,
    /// Element-wise product of two activations (gated MLP).
    Mul,
    /// Broadcast add of a bias vector.
    BiasAdd,
    /// Multiplication by a scalar.
    Scale,
    Gelu,
    Relu,
    Silu,
    Tanh,
    Dropout,
    /// Row-wise softmax (with scale and mask fused, as in fused attention kernels);
    /// `row` of the operator gives the row length.
    Softmax,
    /// Row-wise log-softmax plus negative log-likelihood; `row` is the row length.
    CrossEntropy,
    /// Rotary position embedding applied to queries or keys.
    Rotary,
    /// Table lookup (forward) or scatter-add of gradients (backward).
    Embedding,
}

impl VectorKind {
    pub const ALL: [VectorKind; 15] = [
        VectorKind::LayerNorm,
        VectorKind::RmsNorm,
        VectorKind::Add,
        VectorKind::Mul,
        VectorKind::BiasAdd,
        VectorKind::Scale,
        VectorKind::Gelu,
        VectorKind::Relu,
        VectorKind::Silu,
        VectorKind::Tanh,
        VectorKind::Dropout,
        VectorKind::Softmax,
        VectorKind::CrossEntropy,
        VectorKind::Rotary,
        VectorKind::Embedding,
    ];

    pub fn name(self) -> &'static str {
        match self {
            VectorKind::LayerNorm => "layer_norm",
            VectorKind::RmsNorm => "rms_norm",
            VectorKind::Add => "add",
            VectorKind::Mul => "mul",
            VectorKind::BiasAdd => "bias_add",
            VectorKind::Scale => "scale",
            VectorKind::Gelu => "gelu",
            VectorKind::Relu => "relu",
            VectorKind::Silu => "silu",
            VectorKind::Tanh => "tanh",
            VectorKind::Dropout => "dropout",
            VectorKind::Softmax => "softmax",
            VectorKind::CrossEntropy => "cross_entropy",
            VectorKind::Rotary => "rotary",
            VectorKind::Embedding => "embedding",
        }
    }
}

/// A (batched) matrix multiply: `batch` independent products of an `m × k` and a `k × n`
/// matrix. FLOPs = `2 · batch · m · n · k`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Gemm {
    pub batch: u64,
    pub m: u64,
    pub n: u64,
    pub k: u64,
}

impl Gemm {
    /// The GEMM of `[m, n, k]` or `[batch, m, n, k]`, each from 1 to 2²⁴ (what a user may
    /// ask of `estimate op` or a measurements file); `None` otherwise.
    pub fn from_dims(dims: &[u64]) -> Option<Gemm> {
        let g = match *dims {
            [m, n, k] => Gemm { batch: 1, m, n, k },
            [batch, m, n, k] => Gemm { batch, m, n, k },
            _ => return None,
        };
        [g.batch, g.m, g.n, g.k]
            .iter()
            .all(|&d| (1..=1 << 24).contains(&d))
            .then_some(g)
    }

    /// Multiply-accumulates (saturating: a shape too large for `u64` counts as the most).
    pub fn macs(&self) -> u64 {
        self.batch
            .saturating_mul(self.m)
            .saturating_mul(self.n)
            .saturating_mul(self.k)
    }
    pub fn flops(&self) -> f64 {
        2.0 * self.macs() as f64
    }
}

/// Element-wise work fused into an operator (e.g. bias and GELU after a GEMM): charged per
/// element, never as a constant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FusedOp {
    pub kind: VectorKind,
    pub elements: u64,
}

/// What an operator computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum OpKind {
    /// Runs on tensor cores.
    Gemm(Gemm),
    /// Runs on vector cores: `elements` output elements; `row` is the length of the
    /// reduced dimension for row-wise operators (softmax, norms, cross-entropy), else 1.
    Vector {
        kind: VectorKind,
        elements: u64,
        row: u64,
    },
    /// Ring all-reduce of `bytes` over `group` devices on links of
    /// `link_bytes_per_second` each (tensor parallelism).
    AllReduce {
        bytes: u64,
        group: u32,
        link_bytes_per_second: u64,
    },
    /// Attention as one fused kernel (FlashAttention) on tensor cores: the scores never
    /// leave the chip (interface 1.1; a model without a price of its own for it is asked
    /// for its unfused operators, [`Attention::unfused`]).
    Attention(Attention),
    /// A quantising cast on vector cores, from the operator's element type to a
    /// low-precision one (interface 1.2; see [`Cast`]).
    Cast(Cast),
}

/// The element type of an operator's data (interface 1.2): for a GEMM, its two inputs
/// (it accumulates in fp32 and writes its output in 16-bit); for a vector operator, what
/// it reads and writes. Collectives carry their bytes and ignore it.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum ElementType {
    Fp32,
    #[default]
    Bf16,
    Fp16,
    /// 8-bit floats (E4M3 forward, E5M2 for gradients: the same width and tensor-core
    /// rate) with one fp32 scale per tensor (Micikevicius et al. 2022, "FP8 Formats for
    /// Deep Learning").
    Fp8,
    /// 8-bit floats in blocks of 32 along the reduction, one 8-bit power-of-two (E8M0)
    /// scale per block (OCP Microscaling Formats Specification v1.0, 2023).
    Mxfp8,
    /// 4-bit floats (E2M1) in blocks of 16, one FP8 (E4M3) scale per block (NVIDIA's
    /// NVFP4, Blackwell).
    Nvfp4,
}

impl ElementType {
    /// Every type, in the order above.
    pub const ALL: [ElementType; 6] = [
        ElementType::Fp32,
        ElementType::Bf16,
        ElementType::Fp16,
        ElementType::Fp8,
        ElementType::Mxfp8,
        ElementType::Nvfp4,
    ];

    /// What a model of interface 1.0 or 1.1 multiplies: it cannot be told a type, so it
    /// prices what it assumes, 16- or 32-bit.
    pub const UNTYPED: [ElementType; 3] = [ElementType::Fp32, ElementType::Bf16, ElementType::Fp16];

    /// The type [`ElementType::name`] names (`"bf16"`, `"fp8"`, …), spaces around it
    /// ignored.
    pub fn named(name: &str) -> Option<ElementType> {
        ElementType::ALL
            .into_iter()
            .find(|e| e.name() == name.trim())
    }

    /// Every type's name, for messages: `fp32, bf16, …`.
    pub fn names() -> String {
        ElementType::ALL.map(|e| e.name()).join(", ")
    }

    pub fn name(self) -> &'static str {
        match self {
            ElementType::Fp32 => "fp32",
            ElementType::Bf16 => "bf16",
            ElementType::Fp16 => "fp16",
            ElementType::Fp8 => "fp8",
            ElementType::Mxfp8 => "mxfp8",
            ElementType::Nvfp4 => "nvfp4",
        }
    }

    /// Bytes of one element in memory, its share of the block scales included: MXFP8 one
    /// byte per 32 elements, NVFP4 one per 16.
    pub fn bytes(self) -> f64 {
        match self {
            ElementType::Fp32 => 4.0,
            ElementType::Bf16 | ElementType::Fp16 => 2.0,
            ElementType::Fp8 => 1.0,
            ElementType::Mxfp8 => 1.0 + 1.0 / 32.0,
            ElementType::Nvfp4 => 0.5 + 1.0 / 16.0,
        }
    }

    /// Whether the type is one of the low-precision ones a cast produces.
    pub fn is_quantised(self) -> bool {
        matches!(
            self,
            ElementType::Fp8 | ElementType::Mxfp8 | ElementType::Nvfp4
        )
    }
}

/// A quantising cast (Transformer Engine's `cast_transpose`): reads `elements` values of
/// the operator's element type and writes them as `to` with their scales, once in each
/// layout the GEMMs of both passes need (the tensor and its transpose for FP8 on Hopper,
/// whose FP8 GEMMs take one layout only; row- and column-wise blocks for MXFP8), taking
/// the absolute maximum on the way; with `amax_pass` the values are read once more before,
/// to take the maximum first (per-tensor current scaling).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Cast {
    pub elements: u64,
    pub to: ElementType,
    pub amax_pass: bool,
}

impl Cast {
    /// Bytes the cast moves to and from memory when its input is `from`: the input read
    /// (twice with an amax pass) and both layouts of the output written.
    pub fn memory_bytes(&self, from: ElementType) -> f64 {
        self.memory_bytes_in(from, 2)
    }

    /// [`Cast::memory_bytes`] with `layouts` copies of the output written: 2 where the
    /// GEMMs of the two passes need the tensor in two layouts (FP8 on Hopper, MXFP8), 1
    /// where one layout serves both (per-tensor FP8 on Blackwell).
    pub fn memory_bytes_in(&self, from: ElementType, layouts: u32) -> f64 {
        let reads = if self.amax_pass { 2.0 } else { 1.0 };
        self.elements as f64 * (reads * from.bytes() + f64::from(layouts) * self.to.bytes())
    }
}

/// Attention computed by one fused kernel, as FlashAttention does (Dao et al. 2022; Dao
/// 2023): `batch` sequences of `seq` tokens, `heads` query heads and `kv_heads` key/value
/// heads (on this rank), queries and keys of `head_dim`, values of `value_dim`. The
/// `s × s` scores and probabilities stay on chip, in blocks; only Q, K, V, the output and
/// its log-sum-exp (and their gradients backward) move to and from memory. With `causal`
/// the kernel skips the blocks above the diagonal. Backward recomputes the scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Attention {
    pub batch: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub seq: u64,
    pub head_dim: u64,
    pub value_dim: u64,
    pub causal: bool,
}

impl Attention {
    /// The fraction of the `s × s` score entries computed: `(s + 1) / 2s` with a causal
    /// mask (the lower triangle and the diagonal), else 1.
    pub fn computed_fraction(&self) -> f64 {
        if self.causal && self.seq > 0 {
            (self.seq as f64 + 1.0) / (2.0 * self.seq as f64)
        } else {
            1.0
        }
    }

    /// `batch · heads · seq²` as a float: the score entries of the whole, unmasked.
    fn scores(&self) -> f64 {
        self.batch as f64 * self.heads as f64 * self.seq as f64 * self.seq as f64
    }

    /// Matrix FLOPs the kernel runs: forward `QKᵀ` and `PV`, `2·b·h·s²·(d + dv)`;
    /// backward recomputes `QKᵀ` and computes `dV = PᵀdO`, `dP = dO·Vᵀ`, `dQ = dS·K`,
    /// `dK = dSᵀQ`, `2·b·h·s²·(3d + 2dv)` (2.5× forward at `d = dv`, FlashAttention-2 §3.2);
    /// both times the computed fraction.
    pub fn flops(&self, direction: Direction) -> f64 {
        let (d, dv) = (self.head_dim as f64, self.value_dim as f64);
        let per = match direction {
            Direction::Forward => d + dv,
            Direction::Backward => 3.0 * d + 2.0 * dv,
        };
        2.0 * self.scores() * per * self.computed_fraction()
    }

    /// The FLOPs a model-FLOPs count (MFU) charges: the unmasked forward products, and twice
    /// them backward — the convention of Megatron-LM's and PaLM's MFU formulas, whatever the
    /// kernel skips or recomputes.
    pub fn model_flops(&self, direction: Direction) -> f64 {
        let forward = 2.0 * self.scores() * (self.head_dim + self.value_dim) as f64;
        match direction {
            Direction::Forward => forward,
            Direction::Backward => 2.0 * forward,
        }
    }

    /// Elements the kernel reads from and writes to memory: forward Q, K, V in, the output
    /// out (its log-sum-exp counted apart, [`Attention::statistics`]); backward Q, K, V,
    /// the output and its gradient in, the gradients of Q, K and V out.
    pub fn memory_elements(&self, direction: Direction) -> f64 {
        let tokens = self.batch as f64 * self.seq as f64;
        let q = tokens * (self.heads * self.head_dim) as f64;
        let k = tokens * (self.kv_heads * self.head_dim) as f64;
        let v = tokens * (self.kv_heads * self.value_dim) as f64;
        let o = tokens * (self.heads * self.value_dim) as f64;
        match direction {
            Direction::Forward => q + k + v + o,
            Direction::Backward => 2.0 * (q + k + v) + 2.0 * o,
        }
    }

    /// The log-sum-exp statistics kept for backward: one fp32 per query row and head.
    pub fn statistics(&self) -> u64 {
        self.batch * self.heads * self.seq
    }

    /// The same attention as tensor-core GEMMs, for a cost model that does not price the
    /// fused kernel (they run on the same cores it would): forward the scores GEMM with the
    /// softmax as its epilogue, then the context GEMM; backward `dP = dO·Vᵀ` with the
    /// softmax's gradient as its epilogue, `dV = Pᵀ·dO`, `dQ = dS·K`, `dK = dSᵀ·Q`. The
    /// whole `s × s` is computed and goes through memory, masked or not.
    pub fn unfused(&self, direction: Direction) -> Vec<Op> {
        let bh = self.batch * self.heads;
        let (s, d, dv) = (self.seq, self.head_dim, self.value_dim);
        let softmax = vec![FusedOp {
            kind: VectorKind::Softmax,
            elements: bh * s * s,
        }];
        let gemm = |m, n, k, fused: &[FusedOp]| Op {
            kind: OpKind::Gemm(Gemm { batch: bh, m, n, k }),
            direction,
            fused: fused.to_vec(),
            element: ElementType::Bf16,
        };
        match direction {
            Direction::Forward => vec![gemm(s, s, d, &softmax), gemm(s, dv, s, &[])],
            Direction::Backward => vec![
                gemm(s, s, dv, &softmax),
                gemm(s, dv, s, &[]),
                gemm(s, d, s, &[]),
                gemm(s, d, s, &[]),
            ],
        }
    }
}

/// One operator as a cost model sees it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Op {
    pub kind: OpKind,
    pub direction: Direction,
    /// Element-wise operators fused into this one, in order.
    pub fused: Vec<FusedOp>,
    /// The type of its data ([`ElementType`]; interface 1.2 — a model of 1.0 or 1.1 is
    /// never told it and prices the 16-bit or 32-bit format it assumes).
    #[serde(default)]
    pub element: ElementType,
}

impl Op {
    /// An operator of `kind` in `direction`, nothing fused, in bf16.
    pub fn new(kind: OpKind, direction: Direction) -> Op {
        Op {
            kind,
            direction,
            fused: Vec::new(),
            element: ElementType::Bf16,
        }
    }

    /// The same operator with data of type `element`.
    pub fn with_element(self, element: ElementType) -> Op {
        Op { element, ..self }
    }
}

/// Cost of one operator on one core configuration.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OpCost {
    pub seconds: f64,
    pub joules: f64,
    /// Seconds the operator's off-chip memory (HBM, DRAM) traffic takes with the chip's
    /// whole memory bandwidth to itself: at most `seconds`. `None` when the model does not
    /// say (every model of interface 1.0). The chip's cores share that bandwidth, so a
    /// layer takes at least the sum of its operators' memory times (interface 1.1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_seconds: Option<f64>,
}

impl OpCost {
    /// A cost whose memory time is unknown.
    pub fn new(seconds: f64, joules: f64) -> Self {
        OpCost {
            seconds,
            joules,
            memory_seconds: None,
        }
    }

    /// This cost with its operator's off-chip memory time.
    pub fn with_memory_seconds(self, memory_seconds: f64) -> Self {
        OpCost {
            memory_seconds: Some(memory_seconds),
            ..self
        }
    }
}

/// Why a cost model could not give an answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum EstimateError {
    /// The configuration is outside what the model describes: that candidate is infeasible,
    /// the search goes on.
    #[error("configuration outside the model's domain: {0}")]
    OutOfDomain(String),
    /// The model does not know this operator: a fault of the model.
    #[error("unsupported operator: {0}")]
    Unsupported(String),
    /// Anything else that went wrong inside the model: a fault of the model.
    #[error("internal error: {0}")]
    Internal(String),
}

/// Which questions a cost model answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Provides {
    pub area: bool,
    pub latency: bool,
}

/// A parameter that a spec may set for a cost model, with its default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParameterInfo {
    pub name: String,
    pub description: String,
    /// Default value, in the same human form a spec uses (e.g. `"1.05 GHz"`).
    pub default: String,
}

/// A parameter that measurements may fit (interface 1.3, `archplace calibrate`): one of
/// [`ModelInfo::parameters`] that is a number. A value is written as the number, a space
/// and `unit` (nothing when `unit` is empty), so the parameter must accept that unit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibratable {
    pub name: String,
    /// The unit a value is written in, e.g. `"us"`, `"GHz"`; empty for a plain number.
    pub unit: String,
    /// Physical bounds, in `unit`: finite, `lower < upper`.
    pub lower: f64,
    pub upper: f64,
    /// Fitted unless the measurements file says which parameters to fit.
    pub fit: bool,
}

/// What a cost model says about itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelInfo {
    pub name: String,
    pub vendor: String,
    pub version: String,
    pub interface_version: (u16, u16),
    /// Same inputs always give the same outputs (lets the host memoise across searches).
    pub deterministic: bool,
    pub provides: Provides,
    pub parameters: Vec<ParameterInfo>,
    /// The parameters calibration may fit (interface 1.3; empty for older plugins).
    #[serde(default)]
    pub calibratable: Vec<Calibratable>,
}

/// A parameter as a spec wrote it, e.g. `clock = "1.2 GHz"`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Parameter {
    pub name: String,
    pub value: String,
}

/// What is wrong with one parameter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("parameter `{name}`: {message}")]
pub struct ParameterError {
    pub name: String,
    pub message: String,
}

impl ParameterError {
    pub fn new(name: impl Into<String>, message: impl Into<String>) -> Self {
        ParameterError {
            name: name.into(),
            message: message.into(),
        }
    }

    /// The error for a parameter the model does not have, listing the ones it has.
    pub fn unknown(name: &str, info: &ModelInfo) -> Self {
        let known: Vec<&str> = info.parameters.iter().map(|p| p.name.as_str()).collect();
        ParameterError::new(
            name,
            if known.is_empty() {
                format!("`{}` has no parameters", info.name)
            } else {
                format!(
                    "`{}` has no parameter `{name}`; it has: {}",
                    info.name,
                    known.join(", ")
                )
            },
        )
    }
}

/// A cost model as a plugin: what a vendor implements. [`export_plugin!`] turns an
/// implementation into a WebAssembly component; natively the same type can be tested
/// directly.
///
/// The host makes one instance per worker, calls [`Plugin::new`] with the spec's
/// parameters, then asks for areas and latencies in batches. A model that provides only
/// one of the two leaves the other method at its default, which reports `Unsupported`.
pub trait Plugin: Sized + 'static {
    /// Who the model is and what it provides; must not depend on parameters.
    fn info() -> ModelInfo;

    /// The model with the spec's parameters (unset ones at their defaults). Report every
    /// bad parameter, not only the first.
    fn new(parameters: &[Parameter]) -> Result<Self, Vec<ParameterError>>;

    /// Area in µm² of each configuration, in order; `OutOfDomain` for configurations the
    /// model does not describe.
    fn area_um2(
        &self,
        configs: &[AcceleratorConfig],
    ) -> Result<Vec<Result<f64, EstimateError>>, EstimateError> {
        let _ = configs;
        Err(EstimateError::Unsupported(format!(
            "`{}` provides no area model",
            Self::info().name
        )))
    }

    /// Seconds and joules of each operator on `core`, in order, each with the time its
    /// off-chip memory traffic takes ([`OpCost::memory_seconds`]) when the model knows it.
    /// Fused attention ([`OpKind::Attention`]) is asked of [`Plugin::attention`] instead.
    fn latency(&self, core: &CoreConfig, ops: &[Op]) -> Result<Vec<OpCost>, EstimateError> {
        let _ = (core, ops);
        Err(EstimateError::Unsupported(format!(
            "`{}` provides no latency model",
            Self::info().name
        )))
    }

    /// The element types the tensor cores multiply, with the model's parameters
    /// (interface 1.2): archplace refuses a training precision whose GEMMs need another.
    /// By default fp32, bf16 and fp16, as a model that ignores [`Op::element`] prices them.
    fn tensor_element_types(&self) -> Vec<ElementType> {
        ElementType::UNTYPED.to_vec()
    }

    /// The value of each calibratable parameter ([`ModelInfo::calibratable`]) as this
    /// instance is configured, in its declared unit (interface 1.3): what a calibration's
    /// factors multiply. By default none.
    fn configured(&self) -> Vec<(String, f64)> {
        Vec::new()
    }

    /// Seconds and joules of each fused attention kernel ([`OpKind::Attention`]) on
    /// `core`, in order. By default each is priced as its unfused operators
    /// ([`Attention::unfused`]) run one after another — the `s × s` scores moved through
    /// memory — which overestimates a fused kernel: a model that knows better overrides it.
    fn attention(&self, core: &CoreConfig, ops: &[Op]) -> Result<Vec<OpCost>, EstimateError> {
        unfused_attention(ops, |parts| self.latency(core, parts))
    }
}

/// Each attention operator of `ops` priced as its unfused operators ([`Attention::unfused`])
/// run one after another, by `latency`: the seconds and joules add up, and so do the
/// memory times when every part has one. An operator that is not attention is an error.
pub fn unfused_attention(
    ops: &[Op],
    latency: impl Fn(&[Op]) -> Result<Vec<OpCost>, EstimateError>,
) -> Result<Vec<OpCost>, EstimateError> {
    ops.iter()
        .map(|op| {
            let OpKind::Attention(a) = op.kind else {
                return Err(EstimateError::Unsupported(format!(
                    "{:?} asked as attention",
                    op.kind
                )));
            };
            let parts = a.unfused(op.direction);
            let costs = latency(&parts)?;
            if costs.len() != parts.len() {
                return Err(EstimateError::Internal(format!(
                    "{} costs for {} operators",
                    costs.len(),
                    parts.len()
                )));
            }
            let memory: Option<f64> = costs.iter().map(|c| c.memory_seconds).sum();
            let cost = OpCost::new(
                costs.iter().map(|c| c.seconds).sum(),
                costs.iter().map(|c| c.joules).sum(),
            );
            Ok(match memory {
                Some(m) => cost.with_memory_seconds(m),
                None => cost,
            })
        })
        .collect()
}

/// Turns a [`Plugin`] implementation into the component's exports. Use it once, at the
/// top of the plugin crate (it does nothing in native builds, so the crate's unit tests
/// still build):
///
/// ```ignore
/// archplace_plugin_sdk::export_plugin!(MyModel);
/// ```
#[macro_export]
macro_rules! export_plugin {
    ($ty:ty) => {
        #[cfg(target_arch = "wasm32")]
        #[allow(unsafe_code)]
        const _: () = {
            struct ArchplacePluginExport;

            ::std::thread_local! {
                static STATE: ::core::cell::RefCell<::core::option::Option<$ty>> =
                    const { ::core::cell::RefCell::new(::core::option::Option::None) };
            }

            fn with_model<R>(
                f: impl FnOnce(&$ty) -> ::core::result::Result<R, $crate::EstimateError>,
            ) -> ::core::result::Result<R, $crate::EstimateError> {
                STATE.with(|state| {
                    let mut state = state.borrow_mut();
                    if state.is_none() {
                        *state = ::core::option::Option::Some(
                            <$ty as $crate::Plugin>::new(&[]).map_err(|errors| {
                                $crate::EstimateError::Internal(
                                    $crate::guest::describe_parameter_errors(&errors),
                                )
                            })?,
                        );
                    }
                    match state.as_ref() {
                        ::core::option::Option::Some(model) => f(model),
                        ::core::option::Option::None => ::core::result::Result::Err(
                            $crate::EstimateError::Internal("the model is not configured".into()),
                        ),
                    }
                })
            }

            impl $crate::bindings::exports::archplace::cost_model::model::Guest
                for ArchplacePluginExport
            {
                fn info() -> $crate::guest::wit::PluginInfo {
                    $crate::guest::info_to_wit(&<$ty as $crate::Plugin>::info())
                }

                fn configure(
                    parameters: ::std::vec::Vec<$crate::guest::wit::Parameter>,
                ) -> ::core::result::Result<(), ::std::vec::Vec<$crate::guest::wit::ParameterError>>
                {
                    let parameters = $crate::guest::parameters_from_wit(parameters);
                    match <$ty as $crate::Plugin>::new(&parameters) {
                        ::core::result::Result::Ok(model) => {
                            STATE.with(|state| {
                                *state.borrow_mut() = ::core::option::Option::Some(model)
                            });
                            ::core::result::Result::Ok(())
                        }
                        ::core::result::Result::Err(errors) => ::core::result::Result::Err(
                            $crate::guest::parameter_errors_to_wit(errors),
                        ),
                    }
                }

                fn area(
                    configs: ::std::vec::Vec<$crate::guest::wit::AcceleratorConfig>,
                ) -> ::core::result::Result<
                    ::std::vec::Vec<::core::result::Result<f64, $crate::guest::wit::EstimateError>>,
                    $crate::guest::wit::EstimateError,
                > {
                    let configs = $crate::guest::configs_from_wit(&configs);
                    $crate::guest::areas_to_wit(with_model(|m| {
                        <$ty as $crate::Plugin>::area_um2(m, &configs)
                    }))
                }

                fn latency(
                    core: $crate::guest::wit::CoreConfig,
                    ops: ::std::vec::Vec<$crate::guest::wit::Op>,
                ) -> ::core::result::Result<
                    ::std::vec::Vec<$crate::guest::wit::OpCost>,
                    $crate::guest::wit::EstimateError,
                > {
                    let core = $crate::guest::core_from_wit(&core);
                    let ops = $crate::guest::ops_from_wit(&ops);
                    $crate::guest::costs_to_wit(with_model(|m| {
                        <$ty as $crate::Plugin>::latency(m, &core, &ops)
                    }))
                }
            }

            impl $crate::bindings::exports::archplace::cost_model::detail::Guest
                for ArchplacePluginExport
            {
                fn latency_detail(
                    core: $crate::guest::wit::CoreConfig,
                    ops: ::std::vec::Vec<$crate::guest::wit::Op>,
                ) -> ::core::result::Result<
                    ::std::vec::Vec<$crate::guest::detail::OpDetail>,
                    $crate::guest::wit::EstimateError,
                > {
                    let core = $crate::guest::core_from_wit(&core);
                    let ops = $crate::guest::ops_from_wit(&ops);
                    $crate::guest::details_to_wit(with_model(|m| {
                        <$ty as $crate::Plugin>::latency(m, &core, &ops)
                    }))
                }

                fn attention_detail(
                    core: $crate::guest::wit::CoreConfig,
                    ops: ::std::vec::Vec<$crate::guest::detail::Attention>,
                ) -> ::core::result::Result<
                    ::std::vec::Vec<$crate::guest::detail::OpDetail>,
                    $crate::guest::wit::EstimateError,
                > {
                    let core = $crate::guest::core_from_wit(&core);
                    let ops = $crate::guest::attention_from_wit(&ops);
                    $crate::guest::details_to_wit(with_model(|m| {
                        <$ty as $crate::Plugin>::attention(m, &core, &ops)
                    }))
                }
            }

            impl $crate::bindings::exports::archplace::cost_model::typed::Guest
                for ArchplacePluginExport
            {
                fn tensor_element_types() -> ::std::vec::Vec<$crate::guest::typed::ElementType> {
                    with_model(|m| {
                        ::core::result::Result::Ok(<$ty as $crate::Plugin>::tensor_element_types(m))
                    })
                    .map(|types| $crate::guest::element_types_to_wit(&types))
                    .unwrap_or_default()
                }

                fn latency_typed(
                    core: $crate::guest::wit::CoreConfig,
                    ops: ::std::vec::Vec<$crate::guest::typed::TypedOp>,
                ) -> ::core::result::Result<
                    ::std::vec::Vec<$crate::guest::detail::OpDetail>,
                    $crate::guest::wit::EstimateError,
                > {
                    let core = $crate::guest::core_from_wit(&core);
                    let ops = $crate::guest::typed_ops_from_wit(&ops);
                    $crate::guest::details_to_wit(with_model(|m| {
                        <$ty as $crate::Plugin>::latency(m, &core, &ops)
                    }))
                }
            }

            impl $crate::bindings::exports::archplace::cost_model::calibration::Guest
                for ArchplacePluginExport
            {
                fn calibratable()
                -> ::std::vec::Vec<$crate::guest::calibration::CalibratableParameter> {
                    $crate::guest::calibratable_to_wit(&<$ty as $crate::Plugin>::info())
                }

                fn configured() -> ::std::vec::Vec<$crate::guest::calibration::ParameterValue> {
                    with_model(|m| {
                        ::core::result::Result::Ok(<$ty as $crate::Plugin>::configured(m))
                    })
                    .map(|values| $crate::guest::values_to_wit(values))
                    .unwrap_or_default()
                }
            }

    $crate::bindings::export!(ArchplacePluginExport with_types_in $crate::bindings);
        };
    };
}

impl ModelInfo {
    /// A deterministic model of this interface version that provides area and latency and
    /// has no parameters; adjust with the methods below or the fields.
    pub fn new(name: &str, vendor: &str, version: &str) -> Self {
        ModelInfo {
            name: name.into(),
            vendor: vendor.into(),
            version: version.into(),
            interface_version: INTERFACE_VERSION,
            deterministic: true,
            provides: Provides {
                area: true,
                latency: true,
            },
            parameters: Vec::new(),
            calibratable: Vec::new(),
        }
    }

    /// Declares that calibration may fit parameter `name` (declared with
    /// [`ModelInfo::parameter`]) between `lower` and `upper`, values written in `unit`;
    /// `fit`: fitted unless the measurements say which to fit.
    pub fn calibratable(
        mut self,
        name: &str,
        unit: &str,
        lower: f64,
        upper: f64,
        fit: bool,
    ) -> Self {
        self.calibratable.push(Calibratable {
            name: name.into(),
            unit: unit.into(),
            lower,
            upper,
            fit,
        });
        self
    }

    /// Declares a parameter with its description and default (as a spec would write it).
    pub fn parameter(mut self, name: &str, description: &str, default: &str) -> Self {
        self.parameters.push(ParameterInfo {
            name: name.into(),
            description: description.into(),
            default: default.into(),
        });
        self
    }
}

/// Silicon area of accelerator candidates.
pub trait AreaModel: Send + Sync {
    fn info(&self) -> ModelInfo;
    /// Area in µm² of each configuration, in order. A configuration outside the model's
    /// domain gets `Err(OutOfDomain)`; a fault of the model fails the whole call.
    fn area_um2(
        &self,
        configs: &[AcceleratorConfig],
    ) -> Result<Vec<Result<f64, EstimateError>>, EstimateError>;
}

/// Latency and energy of operators.
pub trait LatencyModel: Send + Sync {
    fn info(&self) -> ModelInfo;
    /// Cost of each operator on `core` (its `cores` field says how many cores the operator
    /// is spread over), in order.
    fn latency(&self, core: &CoreConfig, ops: &[Op]) -> Result<Vec<OpCost>, EstimateError>;
    /// The element types its tensor cores multiply ([`Plugin::tensor_element_types`]; a
    /// model of interface 1.0 or 1.1: [`ElementType::UNTYPED`]).
    fn tensor_element_types(&self) -> Vec<ElementType> {
        ElementType::UNTYPED.to_vec()
    }
    /// Its calibratable parameters' values as configured ([`Plugin::configured`]; a model
    /// before interface 1.3: none).
    fn configured(&self) -> Vec<(String, f64)> {
        Vec::new()
    }
}

/// Severity of a plugin's log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
}

/// Writes a line to archplace's log, tagged with the plugin's name. The host keeps at most a
/// few lines per second and truncates long ones. Natively (unit tests) it writes to stderr.
pub fn log(level: LogLevel, message: &str) {
    #[cfg(target_arch = "wasm32")]
    guest::log(level, message);
    #[cfg(not(target_arch = "wasm32"))]
    eprintln!("[{level:?}] {message}");
}
