//! Analytic training graphs of a transformer: the embedding, one block and the head, each
//! with parameters, stashed activations, and forward and backward operator graphs, per
//! tensor-parallel width (Megatron-style sharding) and micro-batch size.

use super::config::{
    Activation, AttentionKernel, Head, ModelConfig, Moe, Norm, NormPosition, Positions,
};
use super::graph::{
    ATTENTION_CORE, FwdKind, FwdOp, Input, KeptTensor, LayerBuilder, OpGraph, Operand, Saved,
};
use crate::execution::{CrossEntropy, Fp8Library, KernelFusion};
use crate::training::{Numerics, Recomputation, RecomputeModule, RecomputeModules};
use archplace_plugin_sdk::{Attention, Gemm, VectorKind};
use serde::Serialize;

/// How a model is laid out for one search point.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BuildOptions {
    pub micro_batch: u64,
    pub tensor_parallel: u64,
    /// How the layers' data is typed (bytes per activation element; FP8 GEMMs).
    pub numerics: Numerics,
    /// Bandwidth of one device link, for tensor-parallel collectives.
    pub link_bytes_per_second: u64,
    /// Sequence parallelism (Korthikanti et al. 2022; only with `tensor_parallel > 1`): the
    /// norm, dropout and residual regions work on `1/t` of the tokens, and each tensor-
    /// parallel all-reduce becomes an all-gather and a reduce-scatter.
    pub sequence_parallel: bool,
    /// How a Mixture-of-Experts model's experts are laid out (ignored by dense models).
    pub experts: ExpertLayout,
    /// CP: ranks each sequence is split over (context parallelism): every layer works on
    /// `seq / CP` tokens of each sequence, attention against the whole sequence (the
    /// `2·CP` load-balanced chunks of Megatron-Core, so each rank does `1/CP` of it).
    pub context_parallel: u64,
    /// What selective recomputation runs again of each block (the layers' operators are
    /// marked: [`FwdOp::recompute`]).
    pub recompute_modules: RecomputeModules,
    /// How the framework runs the element-wise operators: as the graph's fusion rules
    /// join them, or eager PyTorch's kernels, one per operator
    /// ([`crate::execution::KernelFusion`]).
    pub kernels: KernelFusion,
    /// The library that runs an FP8 recipe: whether a quantised GEMM saves its input in
    /// FP8 or in 16-bit for the backward pass, and casts it again there
    /// ([`crate::execution::Fp8Library`]).
    pub fp8_library: Fp8Library,
    /// How the loss is computed: what the head holds beside its kept softmax while the
    /// loss and its gradient are computed ([`Layer::workspace_bytes`]).
    pub cross_entropy: CrossEntropy,
}

/// How the experts of a Mixture-of-Experts model are laid out over the ranks of a pipeline
/// stage (Megatron-Core's expert parallelism with "parallel folding": the experts' own
/// groups fold into the ranks attention's tensor × data parallelism uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
pub struct ExpertLayout {
    /// EP: ranks the experts are divided over; each holds `experts / EP` of them.
    pub parallel: u64,
    /// ETP: ranks each expert's FFN is split over, like tensor parallelism.
    pub tensor_parallel: u64,
    /// Bandwidth of one link of the expert-tensor-parallel group (its all-gathers and
    /// reduce-scatters are operators of the layer, as tensor parallelism's are).
    pub link_bytes_per_second: u64,
}

impl Default for ExpertLayout {
    /// Every expert on every rank, unsplit.
    fn default() -> Self {
        ExpertLayout {
            parallel: 1,
            tensor_parallel: 1,
            link_bytes_per_second: 0,
        }
    }
}

/// The all-to-all exchanges of a Mixture-of-Experts block over its expert-parallel group:
/// the tokens dispatched to their experts and the outputs combined back, each in forward
/// and again (their gradients) in backward. They run on the network between devices, so
/// the step model prices them on the tier the group lives on, not the chip's latency
/// model.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct AllToAll {
    /// The buffer one exchange moves on the busiest rank of the group (the tokens its
    /// experts receive, `hidden` elements each); a device sends and receives
    /// `(group − 1)/group` of it.
    pub bytes: u64,
    /// EP: the ranks exchanging.
    pub group: u64,
    /// Ranks between two members of the group (ETP: the expert-tensor-parallel ranks sit
    /// between them).
    pub stride: u64,
    /// Mixture-of-Experts FFNs in the layer, each exchanging so (1 in a block; the depth in
    /// the multi-token-prediction modules).
    pub count: u64,
}

impl AllToAll {
    /// The layer's exchanges over `passes` (each a dispatch or a combine: forward,
    /// backward, forward again under full recomputation) on `network`, in seconds.
    pub fn seconds(&self, network: &crate::network::Network, passes: f64) -> f64 {
        let one = network.all_to_all_seconds(self.bytes as f64, self.group, self.stride);
        passes * self.count as f64 * one
    }
}

/// What a context-parallel rank shares with its group in each attention of a layer: what
/// one step of ring attention passes to the next rank (the rank's chunks' keys and values;
/// backward their gradients with them), what an all-gather collects from every rank, or
/// what Ulysses' all-to-alls redistribute (queries, keys and values; the output). The step model prices them on the tier the group lives on, with the
/// plan's way of exchanging ([`crate::step::ContextExchange`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct KvExchange {
    /// The rank's keys and values of one attention, in bytes.
    pub bytes: u64,
    /// The rank's queries of one attention, in bytes (what Ulysses' all-to-all moves
    /// besides the keys and values).
    pub query_bytes: u64,
    /// The rank's attention output of one attention, in bytes (Ulysses' second
    /// all-to-all).
    pub output_bytes: u64,
    /// CP: the ranks exchanging.
    pub group: u64,
    /// Ranks between two members of the group (the tensor-parallel ranks sit between them).
    pub stride: u64,
    /// Attentions in the layer (1 in a block; the depth in the multi-token-prediction
    /// modules).
    pub count: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerKind {
    Embedding,
    /// The repeated block (a Mixture-of-Experts model's MoE block).
    Block,
    /// A Mixture-of-Experts model's leading blocks with a dense FFN.
    DenseBlock,
    Head,
    /// The multi-token-prediction modules, all of them (they sit in one pipeline stage, the
    /// head's): per depth the embedding of the tokens one further ahead, the projection of
    /// it and the previous depth's output, one block of the repeated kind and a norm.
    Mtp,
}

impl LayerKind {
    pub fn name(self) -> &'static str {
        match self {
            LayerKind::Embedding => "embedding",
            LayerKind::Block => "block",
            LayerKind::DenseBlock => "dense_block",
            LayerKind::Head => "head",
            LayerKind::Mtp => "mtp",
        }
    }

    /// What recomputation recomputes: the blocks, and the multi-token-prediction modules,
    /// each a block with a few operators around it (Megatron-Core checkpoints them under
    /// full recomputation; selective recomputation is inside their block).
    pub fn is_block(self) -> bool {
        matches!(
            self,
            LayerKind::Block | LayerKind::DenseBlock | LayerKind::Mtp
        )
    }

    /// The layer's place in [`ModelGraph::distinct`] (and in the arrays of timings that
    /// follow its order).
    pub fn slot(self) -> usize {
        match self {
            LayerKind::Embedding => 0,
            LayerKind::Block => 1,
            LayerKind::Head => 2,
            LayerKind::DenseBlock => 3,
            LayerKind::Mtp => 4,
        }
    }
}

/// One distinct layer of a model on one tensor-parallel rank.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Layer {
    pub kind: LayerKind,
    /// Parameters held by one rank.
    pub parameters: u64,
    /// Of those, copies of parameters owned by another layer (a tied output embedding).
    pub shared_parameters: u64,
    pub parameter_bytes: u64,
    /// Activations kept from the forward pass for the backward pass, per micro-batch.
    pub stash_bytes: u64,
    /// Of those, what selective recomputation keeps (all but what the plan's modules
    /// recompute: [`LayerBuilder::selective_stash_bytes`]).
    pub selective_stash_bytes: u64,
    /// The layer's input, which is all full recomputation keeps of a block.
    pub input_bytes: u64,
    /// What per-operator selective checkpointing keeps of a block: its input and the
    /// outputs its policy saves ([`LayerBuilder::op_checkpoint`]; the layer's operators
    /// carry the share of their work it saves).
    pub op_checkpoint_bytes: u64,
    /// Activations this layer sends to the next one, per micro-batch.
    pub output_bytes: u64,
    /// Whether the layer is split over the tensor-parallel group.
    pub tensor_parallel: bool,
    /// Of `parameters`, the experts' (sharded over expert × expert-tensor parallelism, their
    /// gradients reduced over the expert-data-parallel group).
    pub expert_parameters: u64,
    /// The expert-parallel exchanges of each micro-batch (Mixture-of-Experts blocks with
    /// `EP > 1`).
    pub all_to_all: Option<AllToAll>,
    /// The context-parallel exchanges of keys and values of each micro-batch (blocks with
    /// `CP > 1`).
    pub kv_exchange: Option<KvExchange>,
    /// The matrix FLOPs of the forward pass that the busiest rank runs beyond its share of a
    /// balanced routing (its experts get more tokens than the mean): the time is the
    /// busiest rank's, a FLOPs count is the model's (backward runs twice these).
    pub imbalance_matmul_flops: f64,
    /// Of `parameters`, the weights of its quantised (FP8, MXFP8) GEMMs on this rank:
    /// the step casts them once and keeps their quantised copies
    /// ([`crate::training::Precision::weight_copy_bytes`]).
    pub quantised_parameters: u64,
    /// Activations its passes hold at their peak beside what it keeps, per micro-batch: the
    /// head's logits and their gradients while the loss runs
    /// ([`crate::execution::CrossEntropy`]); 0 for every other layer (a block's
    /// rematerialised activations are counted apart).
    pub workspace_bytes: u64,
    /// The distinct tensors its forward pass keeps for the backward pass (they add up to
    /// `stash_bytes`).
    pub kept: Vec<KeptTensor>,
    pub forward: OpGraph,
    pub backward: OpGraph,
}

impl Layer {
    /// The share of its parameters that are quantised GEMM weights (0 without FP8).
    pub fn quantised_share(&self) -> f64 {
        self.quantised_parameters as f64 / self.parameters.max(1) as f64
    }

    /// Activations one micro-batch keeps in this layer from its forward pass until its
    /// backward pass under recomputation `r`. Recomputation applies to blocks only (as in
    /// Megatron-LM); the embedding and the head keep what they save.
    pub fn kept_bytes(&self, r: Recomputation) -> u64 {
        match (self.kind.is_block(), r) {
            (true, Recomputation::Selective) => self.selective_stash_bytes,
            (true, Recomputation::SelectiveOp) => self.op_checkpoint_bytes,
            (true, Recomputation::Full) => self.input_bytes,
            _ => self.stash_bytes,
        }
    }
}

/// A model on one rank for one (micro-batch, tensor-parallel width): the pipeline of layers
/// is `embedding, block × blocks, head` (the first blocks dense ones, the
/// multi-token-prediction modules before the head, when the model has them).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelGraph {
    pub model: String,
    pub micro_batch: u64,
    pub tensor_parallel: u64,
    pub blocks: u64,
    pub embedding: Layer,
    pub block: Layer,
    pub head: Layer,
    /// A Mixture-of-Experts model's leading dense blocks: the first `dense_blocks` of the
    /// `blocks` are this layer, the rest `block`.
    pub dense_block: Option<Layer>,
    pub dense_blocks: u64,
    /// The multi-token-prediction modules (one layer, `mtp_depth` deep), just before the
    /// head and in its pipeline stage.
    pub mtp: Option<Layer>,
    pub mtp_depth: u64,
}

/// How many distinct layers [`ModelGraph::distinct`] lists.
pub const DISTINCT_LAYERS: usize = 5;

impl ModelGraph {
    /// The layers in pipeline order.
    pub fn layers(&self) -> impl Iterator<Item = &Layer> {
        let dense = self.dense_block.as_ref().unwrap_or(&self.block);
        std::iter::once(&self.embedding)
            .chain((0..self.dense_blocks).map(move |_| dense))
            .chain((self.dense_blocks..self.blocks).map(|_| &self.block))
            .chain(self.mtp.as_ref())
            .chain(std::iter::once(&self.head))
    }

    /// The distinct layers, in the order of [`LayerKind::slot`]: embedding, block, head,
    /// then the dense block and the multi-token-prediction modules when the model has
    /// them (else the block again, so that there are always five).
    pub fn distinct(&self) -> [&Layer; DISTINCT_LAYERS] {
        [
            &self.embedding,
            &self.block,
            &self.head,
            self.dense_block.as_ref().unwrap_or(&self.block),
            self.mtp.as_ref().unwrap_or(&self.block),
        ]
    }

    /// Whether the model has the distinct layer of `slot` (the embedding, the block and
    /// the head always; a dense block or the multi-token-prediction modules when it has
    /// them).
    pub fn has_slot(&self, slot: usize) -> bool {
        match slot {
            3 => self.dense_block.is_some(),
            4 => self.mtp.is_some(),
            _ => slot < DISTINCT_LAYERS,
        }
    }

    /// The model's own parameters on one rank: [`parameters_per_rank`](Self::parameters_per_rank)
    /// without the multi-token-prediction modules' (the count models are published by).
    pub fn model_parameters_per_rank(&self) -> u64 {
        self.parameters_per_rank() - self.mtp_parameters_per_rank()
    }

    /// Of [`parameters_per_rank`](Self::parameters_per_rank), the multi-token-prediction
    /// modules': trained with the model, counted apart from it (as DeepSeek-V3's 671 B
    /// are).
    pub fn mtp_parameters_per_rank(&self) -> u64 {
        self.mtp.as_ref().map_or(0, |l| l.parameters)
    }

    /// Blocks of the repeated kind (`block`).
    pub fn main_blocks(&self) -> u64 {
        self.blocks - self.dense_blocks
    }

    /// Parameters of the whole model on one rank, tied copies counted once, with the
    /// multi-token-prediction modules'.
    pub fn parameters_per_rank(&self) -> u64 {
        self.layers()
            .map(|l| l.parameters - l.shared_parameters)
            .sum()
    }

    /// What a model-FLOPs count (MFU) charges for one micro-batch, forward plus backward, on
    /// one rank ([`crate::model::OpNode::model_flops`]) of a balanced routing; no
    /// recomputation.
    pub fn model_flops_per_micro_batch(&self) -> f64 {
        self.layers()
            .map(|l| {
                l.forward.model_flops() + l.backward.model_flops() - 3.0 * l.imbalance_matmul_flops
            })
            .sum()
    }

    /// Matrix-multiply FLOPs one micro-batch runs, forward plus backward, on one rank of a
    /// balanced routing (the mean rank: what all of them run over their number).
    pub fn matmul_flops_per_micro_batch(&self, recompute: bool) -> f64 {
        self.layers()
            .map(|l| {
                let f = l.forward.matmul_flops() - l.imbalance_matmul_flops;
                let again = if recompute && l.kind.is_block() {
                    f
                } else {
                    0.0
                };
                f + again + l.backward.matmul_flops() - 2.0 * l.imbalance_matmul_flops
            })
            .sum()
    }
}

/// Builds the distinct layers of `cfg` for `opts`.
pub fn build(cfg: &ModelConfig, opts: &BuildOptions) -> ModelGraph {
    let ctx = Ctx::new(cfg, opts);
    let dense_blocks = cfg.dense_blocks();
    let mtp_depth = match cfg.head {
        Head::LanguageModel => cfg.mtp_depth,
        Head::Classifier { .. } => 0,
    };
    ModelGraph {
        model: cfg.name.clone(),
        micro_batch: opts.micro_batch,
        tensor_parallel: opts.tensor_parallel,
        blocks: cfg.layers,
        embedding: ctx.embedding(),
        block: ctx.block(cfg.moe, LayerKind::Block),
        head: ctx.head(),
        dense_block: (dense_blocks > 0).then(|| ctx.block(None, LayerKind::DenseBlock)),
        dense_blocks,
        mtp: (mtp_depth > 0).then(|| ctx.mtp(cfg.moe, mtp_depth)),
        mtp_depth,
    }
}

struct Ctx<'a> {
    cfg: &'a ModelConfig,
    b: u64,
    s: u64,
    h: u64,
    t: u64,
    bpe: u64,
    link: u64,
    /// Sequence parallelism is on (and `t > 1`).
    sp: bool,
    experts: ExpertLayout,
    /// CP; `s` is the rank's share of the sequence, `seq / CP`.
    cp: u64,
    numerics: Numerics,
    recompute_modules: RecomputeModules,
    kernels: KernelFusion,
    fp8_library: Fp8Library,
    cross_entropy: CrossEntropy,
}

/// A block's FFN: its parameters, of them the experts', and a Mixture-of-Experts layer's
/// exchanges and imbalance (see [`Layer`]).
#[derive(Default)]
struct Ffn {
    parameters: u64,
    expert_parameters: u64,
    all_to_all: Option<AllToAll>,
    imbalance_matmul_flops: f64,
}

fn save(producer: Input, part: &'static str, bytes: u64) -> Saved {
    Saved {
        producer,
        part,
        bytes,
    }
}

impl<'a> Ctx<'a> {
    fn new(cfg: &'a ModelConfig, o: &BuildOptions) -> Self {
        Ctx {
            cfg,
            b: o.micro_batch,
            s: cfg.seq_len / o.context_parallel.max(1),
            h: cfg.hidden,
            t: o.tensor_parallel,
            bpe: o.numerics.bytes_per_element,
            numerics: o.numerics,
            link: o.link_bytes_per_second,
            sp: o.sequence_parallel && o.tensor_parallel > 1,
            experts: o.experts,
            cp: o.context_parallel.max(1),
            recompute_modules: o.recompute_modules,
            kernels: o.kernels,
            fp8_library: o.numerics.scaling.run_by(o.fp8_library),
            cross_entropy: o.cross_entropy,
        }
    }

    /// The outermost of the plan's recomputed modules that a block's operator `name`
    /// belongs to, by the names this builder gives (a multi-token-prediction module's
    /// with their `mtp<k>.` prefix; an FP8 cast's begin with its GEMM's).
    fn recompute_module(&self, name: &str) -> Option<RecomputeModule> {
        let n = match name.split_once('.') {
            Some((mtp, rest)) if mtp.starts_with("mtp") && mtp[3..].parse::<u64>().is_ok() => rest,
            _ => name,
        };
        let first = n.split('.').next().unwrap_or(n);
        let belongs = |m: RecomputeModule| match m {
            RecomputeModule::CoreAttn => ATTENTION_CORE.contains(&first),
            RecomputeModule::Layernorm => {
                self.cfg.norm_position == NormPosition::Pre
                    && ["attention_norm", "mlp_norm"].contains(&n)
            }
            // The dense MLP's operators, its input's tensor-parallel copy (sequence
            // parallelism's all-gather) with them; the dropout after it is the residual's.
            RecomputeModule::Mlp => {
                (["gate", "up", "activation", "gate_mul", "fc1", "fc2"].contains(&first)
                    && n != "fc2.dropout")
                    || n.starts_with("mlp_norm.copy_to_tp")
            }
            RecomputeModule::Moe => {
                ["router", "permutation", "unpermutation", "experts"].contains(&first)
                    || n.starts_with("expert_")
                    || n.starts_with("shared_expert.")
            }
            RecomputeModule::MoeAct => ["expert_activation", "expert_gate_mul"].contains(&first),
            RecomputeModule::SharedExperts => {
                n.starts_with("shared_expert.") && n != "shared_expert.add"
            }
            RecomputeModule::MlaUpProj => {
                self.cfg.attention == AttentionKernel::Mla
                    && (["q_up", "kv_up"].contains(&first) || n == "rotary")
            }
        };
        // Outermost first: the MoE layer holds its activation and shared experts.
        [
            RecomputeModule::Moe,
            RecomputeModule::Mlp,
            RecomputeModule::SharedExperts,
            RecomputeModule::MoeAct,
            RecomputeModule::CoreAttn,
            RecomputeModule::Layernorm,
            RecomputeModule::MlaUpProj,
        ]
        .into_iter()
        .find(|&m| self.recompute_modules.contains(m) && belongs(m))
    }

    /// The keys and values this rank exchanges with its context-parallel group in each of
    /// `count` attentions, `None` without context parallelism: the rank's tokens' keys
    /// and values (the latent attention's after their up-projection, every head's), on its
    /// tensor-parallel share of the heads.
    fn kv_exchange(&self, count: u64) -> Option<KvExchange> {
        if self.cp <= 1 {
            return None;
        }
        let cfg = self.cfg;
        let heads = cfg.heads / self.t;
        // Per token: keys and values, queries, output.
        let (kv, query, output) = match (cfg.attention, cfg.mla) {
            (AttentionKernel::Mla, Some(m)) => {
                let qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
                (
                    heads * (qk + m.v_head_dim),
                    heads * qk,
                    heads * m.v_head_dim,
                )
            }
            _ => {
                let d = cfg.head_dim();
                (cfg.kv_heads / self.t * 2 * d, heads * d, heads * d)
            }
        };
        let bytes = |per_token: u64| self.tokens() * per_token * self.bpe;
        Some(KvExchange {
            bytes: bytes(kv),
            query_bytes: bytes(query),
            output_bytes: bytes(output),
            group: self.cp,
            stride: self.t,
            count,
        })
    }

    /// Elements of a tensor of the sequence-parallel region (norms, dropouts, residuals)
    /// on one rank: all of them, or `1/t` with sequence parallelism.
    fn rep(&self, elements: u64) -> u64 {
        if self.sp {
            elements.div_ceil(self.t)
        } else {
            elements
        }
    }

    /// A tensor-parallel collective over a full tensor of `elements`: the all-reduce in
    /// the pass `one_way` gives, or with sequence parallelism an all-gather and a
    /// reduce-scatter, one in each pass.
    fn collective(&self, one_way: fn(u64, u32, u64) -> FwdKind, elements_bytes: u64) -> FwdKind {
        if self.sp {
            FwdKind::AllReduceBoth {
                bytes: elements_bytes / 2,
                backward_bytes: elements_bytes / 2,
                group: self.t as u32,
                link_bytes_per_second: self.link,
            }
        } else {
            one_way(elements_bytes, self.t as u32, self.link)
        }
    }

    fn tokens(&self) -> u64 {
        self.b * self.s
    }

    fn gemm(&self, m: u64, n: u64, k: u64) -> FwdKind {
        FwdKind::Gemm {
            gemm: Gemm { batch: 1, m, n, k },
            second: Operand::Weight,
        }
    }

    fn vector(&self, kind: VectorKind, elements: u64, row: u64) -> FwdKind {
        FwdKind::Vector {
            kind,
            elements,
            row,
        }
    }

    fn norm_kind(&self) -> VectorKind {
        match self.cfg.norm {
            Norm::LayerNorm => VectorKind::LayerNorm,
            Norm::RmsNorm => VectorKind::RmsNorm,
        }
    }

    fn norm_parameters(&self) -> u64 {
        match self.cfg.norm {
            Norm::LayerNorm => 2 * self.h,
            Norm::RmsNorm => self.h,
        }
    }

    /// Megatron `f`: identity forward, all-reduce of the input gradient backward. With
    /// sequence parallelism: the input all-gathered forward, its gradient reduce-scattered
    /// backward — and the input all-gathered once more backward, for the weight gradient
    /// (Megatron-LM keeps only its shard; Korthikanti et al. 2022, §4.2.2).
    fn copy_to_tp(&self, lb: &mut LayerBuilder, name: &str, x: Input, elements: u64) -> Input {
        if self.t == 1 {
            return x;
        }
        let x = if self.sp {
            let again = FwdKind::AllReduceBackward {
                bytes: elements * self.bpe / 2,
                group: self.t as u32,
                link_bytes_per_second: self.link,
            };
            lb.push(&format!("{name}.all_gather_again"), again, vec![x], vec![])
        } else {
            x
        };
        let kind = self.collective(
            |bytes, group, link_bytes_per_second| FwdKind::AllReduceBackward {
                bytes,
                group,
                link_bytes_per_second,
            },
            elements * self.bpe,
        );
        lb.push(name, kind, vec![x], vec![])
    }

    /// Megatron `g`: all-reduce of partial sums forward, identity backward.
    fn reduce_from_tp(&self, lb: &mut LayerBuilder, name: &str, x: Input, bytes: u64) -> Input {
        if self.t == 1 {
            return x;
        }
        let kind = self.collective(
            |bytes, group, link_bytes_per_second| FwdKind::AllReduceForward {
                bytes,
                group,
                link_bytes_per_second,
            },
            bytes,
        );
        lb.push(name, kind, vec![x], vec![])
    }

    fn bias(&self, lb: &mut LayerBuilder, name: &str, x: Input, elements: u64) -> Input {
        if !self.cfg.biases {
            return x;
        }
        lb.push(
            name,
            self.vector(VectorKind::BiasAdd, elements, 1),
            vec![x],
            vec![],
        )
    }

    fn dropout(&self, lb: &mut LayerBuilder, name: &str, x: Input, elements: u64) -> Input {
        if !self.cfg.dropout {
            return x;
        }
        let d = lb.push(
            name,
            self.vector(VectorKind::Dropout, elements, 1),
            vec![x],
            vec![],
        );
        // The mask is one byte per element (Korthikanti et al. 2022).
        lb.save_output(d, "mask", elements);
        d
    }

    fn norm(&self, lb: &mut LayerBuilder, name: &str, x: Input) -> Input {
        let e = self.rep(self.tokens() * self.h);
        lb.push(
            name,
            self.vector(self.norm_kind(), e, self.h),
            vec![x],
            vec![save(x, "out", e * self.bpe)],
        )
    }

    fn layer(
        &self,
        kind: LayerKind,
        mut lb: LayerBuilder,
        parameters: u64,
        shared: u64,
        output_bytes: u64,
    ) -> Layer {
        lb.element = self.numerics.activations;
        lb.kernels = self.kernels;
        lb.fp8_library = self.fp8_library;
        // Transformer Engine's linear layers are the blocks' (and the multi-token-
        // prediction modules') weight GEMMs; the routers, the embedding and the output
        // layer stay in 16-bit, as Megatron-Core builds them.
        let quantised_parameters = if self.numerics.quantised() && kind.is_block() {
            lb.quantise(self.numerics.gemms, self.numerics.scaling, self.bpe, |op| {
                op.name != "router" && !op.name.ends_with(".router")
            })
        } else {
            0
        };
        if kind.is_block() {
            for op in &mut lb.ops {
                op.recompute = self.recompute_module(&op.name);
            }
        }
        let input_bytes = self.rep(self.tokens() * self.h) * self.bpe;
        // The `mm`s of torchtitan's linear layers: the fused QKV projection is its `wq`,
        // `wk`, `wv`; a linear layer with a bias runs `addmm`, which the policy neither
        // keeps nor counts.
        let (q, kv) = (
            self.cfg.query_width() / self.t,
            self.cfg.kv_heads * self.cfg.head_dim() / self.t,
        );
        let linears = |op: &FwdOp| match op.kind {
            FwdKind::Gemm { .. } if self.cfg.biases => Vec::new(),
            FwdKind::Gemm { gemm, .. } if op.name == "qkv" && gemm.n == q + 2 * kv => {
                vec![q, kv, kv]
            }
            FwdKind::Gemm { gemm, .. } => vec![gemm.n],
            _ => Vec::new(),
        };
        let op_checkpoint_bytes = if kind.is_block() {
            input_bytes + lb.op_checkpoint(linears, self.bpe)
        } else {
            input_bytes
        };
        Layer {
            quantised_parameters,
            kind,
            parameters,
            shared_parameters: shared,
            parameter_bytes: parameters * self.bpe,
            stash_bytes: lb.stash_bytes(),
            selective_stash_bytes: lb.selective_stash_bytes(),
            input_bytes,
            op_checkpoint_bytes,
            output_bytes,
            tensor_parallel: self.t > 1,
            expert_parameters: 0,
            all_to_all: None,
            kv_exchange: None,
            imbalance_matmul_flops: 0.0,
            workspace_bytes: 0,
            kept: lb.kept_tensors(),
            forward: lb.forward(),
            backward: lb.backward(),
        }
    }

    fn embedding(&self) -> Layer {
        let cfg = self.cfg;
        let (tok, h, bpe) = (self.tokens(), self.h, self.bpe);
        let e = cfg.embedding_dim.unwrap_or(h);
        let v = cfg.vocab_per_rank(self.t);
        let mut lb = LayerBuilder::default();
        let mut params = v * e;
        // Vocabulary-parallel lookup: each rank holds v rows, the partial results are summed.
        let words = lb.push(
            "word_embedding",
            self.vector(VectorKind::Embedding, tok * e, e),
            vec![Input::External],
            vec![],
        );
        let mut x = self.reduce_from_tp(&mut lb, "word_embedding.all_reduce", words, tok * e * bpe);
        if e != h {
            params += e * h;
            x = lb.push(
                "project_in",
                self.gemm(tok, h, e),
                vec![x],
                vec![save(x, "out", tok * e * bpe)],
            );
        }
        if cfg.positions == Positions::Learned {
            params += cfg.max_positions * h;
            x = self.add_lookup(&mut lb, ("position_embedding", "add_positions"), x);
        }
        if cfg.token_types > 0 {
            params += cfg.token_types * h;
            x = self.add_lookup(&mut lb, ("token_type_embedding", "add_token_types"), x);
        }
        if cfg.norm_position == NormPosition::Post && cfg.token_types > 0 {
            // BERT normalises its embeddings.
            params += self.norm_parameters();
            x = self.norm(&mut lb, "embedding_norm", x);
        }
        self.dropout(&mut lb, "embedding_dropout", x, self.rep(tok * h));
        self.layer(LayerKind::Embedding, lb, params, 0, self.rep(tok * h) * bpe)
    }

    /// `x` plus the rows of a replicated table looked up for the layer's tokens (learned
    /// positions, token types): the lookup, then the sum, named `names`.
    fn add_lookup(&self, lb: &mut LayerBuilder, names: (&str, &str), x: Input) -> Input {
        let (tok, h) = (self.tokens(), self.h);
        let rows = lb.push(
            names.0,
            self.vector(VectorKind::Embedding, tok * h, h),
            vec![Input::External],
            vec![],
        );
        lb.push(
            names.1,
            self.vector(VectorKind::Add, self.rep(tok * h), 1),
            vec![x, rows],
            vec![],
        )
    }

    /// A block with a Mixture-of-Experts FFN of `moe`, or a dense one.
    fn block(&self, moe: Option<Moe>, kind: LayerKind) -> Layer {
        let (tok, h, bpe) = (self.tokens(), self.h, self.bpe);
        let mut lb = LayerBuilder::default();
        let x = Input::External;
        let (r1, attention_parameters) = self.attention(&mut lb, x);
        let ffn = self.ffn(&mut lb, r1, moe);
        let params = attention_parameters + ffn.parameters;
        Layer {
            expert_parameters: ffn.expert_parameters,
            all_to_all: ffn.all_to_all,
            kv_exchange: self.kv_exchange(1),
            imbalance_matmul_flops: ffn.imbalance_matmul_flops,
            ..self.layer(kind, lb, params, 0, self.rep(tok * h) * bpe)
        }
    }

    /// A block's FFN from the first residual `r1`: a Mixture-of-Experts one of `moe`, or
    /// the dense MLP.
    fn ffn(&self, lb: &mut LayerBuilder, r1: Input, moe: Option<Moe>) -> Ffn {
        match moe {
            Some(m) => self.moe_mlp(lb, r1, m),
            None => Ffn {
                parameters: self.mlp(lb, r1),
                ..Ffn::default()
            },
        }
    }

    /// The multi-token-prediction modules (DeepSeek-AI 2024, §2.2; Megatron-Core's
    /// `MultiTokenPredictionLayer`), `depth` of them in sequence. Module `k` looks up the
    /// embedding of the tokens `k` ahead (vocabulary-parallel, in the head's copy of the
    /// table), normalises it and the previous module's output (the last block's, for the
    /// first), projects their concatenation from `2h` to `h` (column-parallel, the output
    /// gathered over the tensor-parallel group), runs one block of the repeated kind (a
    /// Mixture-of-Experts one in DeepSeek-V3) and a norm; the head turns every module's
    /// output into logits and a loss. Operators are named `mtp<k>.<block's name>`.
    fn mtp(&self, moe: Option<Moe>, depth: u64) -> Layer {
        let (tok, h, bpe) = (self.tokens(), self.h, self.bpe);
        let mut lb = LayerBuilder::default();
        let mut x = Input::External;
        let mut params = 0;
        let mut ffn = Ffn::default();
        for k in 1..=depth {
            let start = lb.ops.len();
            let y = self.mtp_input(&mut lb, x);
            let (r1, attention_parameters) = self.attention(&mut lb, y);
            let f = self.ffn(&mut lb, r1, moe);
            let out = Input::Op(lb.ops.len() - 1);
            x = self.norm(&mut lb, "final_norm", out);
            for op in &mut lb.ops[start..] {
                op.name = format!("mtp{k}.{}", op.name);
            }
            params += 3 * self.norm_parameters() + 2 * h * h / self.t + attention_parameters;
            params += f.parameters;
            ffn.expert_parameters += f.expert_parameters;
            ffn.imbalance_matmul_flops += f.imbalance_matmul_flops;
            ffn.all_to_all = f.all_to_all.map(|a| AllToAll { count: depth, ..a });
        }
        Layer {
            expert_parameters: ffn.expert_parameters,
            all_to_all: ffn.all_to_all,
            kv_exchange: self.kv_exchange(depth),
            imbalance_matmul_flops: ffn.imbalance_matmul_flops,
            ..self.layer(LayerKind::Mtp, lb, params, 0, self.rep(tok * h) * bpe)
        }
    }

    /// A multi-token-prediction module's input to its block, from the previous depth's
    /// output `x`: the embedding of the tokens one further ahead and `x`, each normed,
    /// concatenated and projected.
    fn mtp_input(&self, lb: &mut LayerBuilder, x: Input) -> Input {
        let (tok, h, t, bpe) = (self.tokens(), self.h, self.t, self.bpe);
        let words = lb.push(
            "word_embedding",
            self.vector(VectorKind::Embedding, tok * h, h),
            vec![Input::External],
            vec![],
        );
        let mut e = self.reduce_from_tp(lb, "word_embedding.all_reduce", words, tok * h * bpe);
        if self.cfg.positions == Positions::Learned {
            e = self.add_lookup(lb, ("position_embedding", "add_positions"), e);
        }
        let e = self.norm(lb, "enorm", e);
        let hn = self.norm(lb, "hnorm", x);
        // The concatenation is a copy, priced as an element-wise operator of its size.
        let cat = lb.push(
            "concat",
            self.vector(VectorKind::Scale, self.rep(2 * tok * h), 1),
            vec![e, hn],
            vec![],
        );
        let xin = self.copy_to_tp(lb, "eh_proj.copy_to_tp", cat, 2 * tok * h);
        let y = lb.push(
            "eh_proj",
            self.gemm(tok, h / t, 2 * h),
            vec![xin],
            vec![save(cat, "out", self.rep(2 * tok * h) * bpe)],
        );
        if t == 1 {
            return y;
        }
        // The projection's output gathered over the tensor-parallel group (an all-gather:
        // a ring all-reduce of half the tensor); with sequence parallelism scattered
        // again, whose backward gathers the gradient.
        let bytes = tok * h * bpe / 2;
        let (group, link_bytes_per_second) = (t as u32, self.link);
        let gather = if self.sp {
            FwdKind::AllReduceBoth {
                bytes,
                backward_bytes: bytes,
                group,
                link_bytes_per_second,
            }
        } else {
            FwdKind::AllReduceForward {
                bytes,
                group,
                link_bytes_per_second,
            }
        };
        lb.push("eh_proj.all_gather", gather, vec![y], vec![])
    }

    /// A block's attention, from the block's input `x` to the first residual (normed after
    /// it with post-norm); its parameters (with both norms').
    fn attention(&self, lb: &mut LayerBuilder, x: Input) -> (Input, u64) {
        let cfg = self.cfg;
        let (h, bpe) = (self.h, self.bpe);
        let tok = self.tokens();
        let pre = cfg.norm_position == NormPosition::Pre;
        let bias = u64::from(cfg.biases);
        let attn_in = if pre {
            self.norm(lb, "attention_norm", x)
        } else {
            x
        };
        let a = self.copy_to_tp(lb, "attention_norm.copy_to_tp", attn_in, tok * h);
        // The core's output on this rank, its width, the parameters before the output
        // projection.
        let (context, width, core_params) = match (cfg.attention, cfg.mla) {
            (AttentionKernel::Mla, Some(m)) => self.latent_attention(lb, (attn_in, a), m),
            _ => self.head_attention(lb, (attn_in, a)),
        };
        let params = core_params + h * width + bias * h + 2 * self.norm_parameters();
        let proj = lb.push(
            "attention_out",
            self.gemm(tok, h, width),
            vec![context],
            vec![save(context, "out", tok * width * bpe)],
        );
        let y = self.reduce_from_tp(lb, "attention_out.all_reduce", proj, tok * h * bpe);
        let y = self.bias(lb, "attention_out.bias", y, self.rep(tok * h));
        let y = self.dropout(lb, "attention_out.dropout", y, self.rep(tok * h));
        let r1 = lb.push(
            "residual_1",
            self.vector(VectorKind::Add, self.rep(tok * h), 1),
            vec![y, x],
            vec![],
        );
        let r1 = if pre {
            r1
        } else {
            self.norm(lb, "attention_norm", r1)
        };
        (r1, params)
    }

    /// Multi-head (or grouped-query) attention from the normed input (`attn_in`, and `a`
    /// as the tensor-parallel region sees it): the QKV projection, QK-norm and rotary
    /// embedding when the model has them, the core (fused or not). Returns the context,
    /// its width on this rank and the parameters of the projection (and QK-norm).
    fn head_attention(
        &self,
        lb: &mut LayerBuilder,
        (attn_in, a): (Input, Input),
    ) -> (Input, u64, u64) {
        let cfg = self.cfg;
        let (b, s, h, t, bpe) = (self.b, self.s, self.h, self.t, self.bpe);
        let tok = self.tokens();
        let (n, d) = (cfg.heads / t, cfg.head_dim());
        let kv = cfg.kv_heads * d / t;
        let q = cfg.query_width() / t;
        let bias = u64::from(cfg.biases);
        let params = h * (q + 2 * kv) + bias * (q + 2 * kv) + u64::from(cfg.qk_norm) * 2 * d;
        let qkv = lb.push(
            "qkv",
            self.gemm(tok, q + 2 * kv, h),
            vec![a],
            vec![save(attn_in, "out", self.rep(tok * h) * bpe)],
        );
        let qkv = self.bias(lb, "qkv.bias", qkv, tok * (q + 2 * kv));
        // Qwen3's per-head RMS norm of the queries and keys, before the rotary embedding.
        let qk_in = if cfg.qk_norm {
            lb.push(
                "qk_norm",
                self.vector(VectorKind::RmsNorm, tok * (q + kv), d),
                vec![qkv],
                vec![save(qkv, "q_k", tok * (q + kv) * bpe)],
            )
        } else {
            qkv
        };
        let (qk_src, qk_parts) = if cfg.positions == Positions::Rotary {
            let r = lb.push(
                "rotary",
                self.vector(VectorKind::Rotary, tok * (q + kv), d),
                vec![qk_in],
                vec![],
            );
            (r, ("q_rotated", "k_rotated"))
        } else {
            (qk_in, ("q", "k"))
        };
        let context = if cfg.attention == AttentionKernel::Flash {
            let core = Attention {
                batch: b * self.cp,
                heads: n,
                kv_heads: cfg.kv_heads / t,
                seq: s,
                head_dim: d,
                value_dim: d,
                causal: cfg.causal,
            };
            self.flash(
                lb,
                core,
                (qk_src, qk_parts, tok * q, tok * kv),
                (qkv, tok * kv),
            )
        } else {
            self.unfused_attention(lb, (qk_src, qk_parts), qkv)
        };
        (context, q, params)
    }

    /// A fused attention kernel over the queries and keys of `qk` (their saved parts and
    /// element counts) and the values of `v`: Q, K and V are kept (as unfused), the output
    /// and its log-sum-exp (fp32, one per query row and head) too; no s × s tensor, no
    /// dropout mask (the kernel regenerates it from its random state). With context
    /// parallelism the core is `b·CP` sequences of the rank's `s/CP` tokens: ring attention's
    /// `CP` steps each attend the rank's queries to one chunk pair's keys (the first step
    /// causally to its own, the others to half of their queries or keys), as many score
    /// entries as a causal attention over `s/CP` — `1/CP` of the whole sequence's, the
    /// same on every rank thanks to the load-balanced chunks.
    fn flash(
        &self,
        lb: &mut LayerBuilder,
        core: Attention,
        (qk, parts, q_elements, k_elements): (Input, (&'static str, &'static str), u64, u64),
        (v, v_elements): (Input, u64),
    ) -> Input {
        let bpe = self.bpe;
        let out = lb.push(
            "flash_attention",
            FwdKind::Attention(core),
            vec![qk, v],
            vec![
                save(qk, parts.0, q_elements * bpe),
                save(qk, parts.1, k_elements * bpe),
                save(v, "v", v_elements * bpe),
            ],
        );
        let tok = self.tokens();
        let heads_dv = core.heads * core.value_dim;
        lb.save_output(out, "out", tok * heads_dv * bpe);
        // One statistic per query row of this rank's tokens: the `1/CP` of the core's
        // rows its own queries are. Selective recomputation's checkpoint of the core
        // drops it (the output stays: the projection after it keeps it).
        lb.save_output(out, "log_sum_exp", core.statistics() / self.cp * 4);
        out
    }

    /// Multi-head latent attention (DeepSeek-V2/V3; Megatron-Core's `MLASelfAttention`):
    /// the queries through a `q_lora_rank` latent (down-projection, RMS norm,
    /// up-projection; or directly), the keys and values through a `kv_lora_rank` latent
    /// plus a rotary key part shared by the heads, the rotary embedding on the rotary parts,
    /// the fused core over `a/t` heads of `qk_nope + qk_rope` (values `v_head_dim`). The
    /// down-projections and their norms are replicated over the tensor-parallel group (each
    /// rank runs them on all tokens); the up-projections are split by heads. Returns the
    /// context, its width on this rank and the parameters before the output projection.
    fn latent_attention(
        &self,
        lb: &mut LayerBuilder,
        (attn_in, a): (Input, Input),
        m: crate::model::config::Mla,
    ) -> (Input, u64, u64) {
        let cfg = self.cfg;
        let (b, s, h, t, bpe) = (self.b, self.s, self.h, self.t, self.bpe);
        let tok = self.tokens();
        let n = cfg.heads / t;
        let (nope, rope, dv) = (m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim);
        let dq = nope + rope;
        let kvl = m.kv_lora_rank;
        let in_save = save(attn_in, "out", self.rep(tok * h) * bpe);
        let mut params = 0;
        let q = match m.q_lora_rank {
            Some(ql) => {
                params += h * ql + ql + ql * n * dq;
                let down = lb.push(
                    "q_down",
                    self.gemm(tok, ql, h),
                    vec![a],
                    vec![in_save.clone()],
                );
                let normed = lb.push(
                    "q_norm",
                    self.vector(VectorKind::RmsNorm, tok * ql, ql),
                    vec![down],
                    vec![save(down, "out", tok * ql * bpe)],
                );
                lb.push(
                    "q_up",
                    self.gemm(tok, n * dq, ql),
                    vec![normed],
                    vec![save(normed, "out", tok * ql * bpe)],
                )
            }
            None => {
                params += h * n * dq;
                lb.push(
                    "q",
                    self.gemm(tok, n * dq, h),
                    vec![a],
                    vec![in_save.clone()],
                )
            }
        };
        params += h * (kvl + rope) + kvl + kvl * n * (nope + dv);
        let kv_down = lb.push(
            "kv_down",
            self.gemm(tok, kvl + rope, h),
            vec![a],
            vec![in_save],
        );
        let kv_normed = lb.push(
            "kv_norm",
            self.vector(VectorKind::RmsNorm, tok * kvl, kvl),
            vec![kv_down],
            vec![save(kv_down, "out", tok * (kvl + rope) * bpe)],
        );
        let kv = lb.push(
            "kv_up",
            self.gemm(tok, n * (nope + dv), kvl),
            vec![kv_normed],
            vec![save(kv_normed, "out", tok * kvl * bpe)],
        );
        // The rotary parts: every head's of the queries, the one key part all heads share.
        let rotated = lb.push(
            "rotary",
            self.vector(VectorKind::Rotary, tok * (n * rope + rope), rope),
            vec![q, kv_down],
            vec![],
        );
        let core = Attention {
            batch: b * self.cp,
            heads: n,
            kv_heads: n,
            seq: s,
            head_dim: dq,
            value_dim: dv,
            causal: cfg.causal,
        };
        let qk = (
            rotated,
            ("q_rotated", "k_rotated"),
            tok * n * dq,
            tok * n * dq,
        );
        let context = self.flash(lb, core, qk, (kv, tok * n * dv));
        (context, n * dv, params)
    }

    /// Attention as separate kernels, from the queries and keys `qk` (with the names of
    /// their saved parts) and `qkv` (the values): the scores, their softmax (and its
    /// dropout), the product with the values — the `s × s` tensors kept for backward, as
    /// the attention core selective recomputation recomputes. Returns the context.
    fn unfused_attention(
        &self,
        lb: &mut LayerBuilder,
        (qk_src, qk_parts): (Input, (&'static str, &'static str)),
        qkv: Input,
    ) -> Input {
        let cfg = self.cfg;
        let (b, s, t, bpe) = (self.b, self.s, self.t, self.bpe);
        let tok = self.tokens();
        let (n, d) = (cfg.heads / t, cfg.head_dim());
        let kv = cfg.kv_heads * d / t;
        let q = cfg.query_width() / t;
        let scores = lb.push(
            "scores",
            FwdKind::Gemm {
                gemm: Gemm {
                    batch: b * n,
                    m: s,
                    n: s,
                    k: d,
                },
                second: Operand::Activation,
            },
            vec![qk_src, qk_src],
            vec![
                save(qk_src, qk_parts.0, tok * q * bpe),
                save(qk_src, qk_parts.1, tok * kv * bpe),
            ],
        );
        let probs_elems = b * n * s * s;
        let softmax = lb.push(
            "softmax",
            self.vector(VectorKind::Softmax, probs_elems, s),
            vec![scores],
            vec![],
        );
        lb.save_output(softmax, "out", probs_elems * bpe);
        let probs = self.dropout(lb, "attention_dropout", softmax, probs_elems);
        lb.push(
            "context",
            FwdKind::Gemm {
                gemm: Gemm {
                    batch: b * n,
                    m: s,
                    n: d,
                    k: s,
                },
                second: Operand::Activation,
            },
            vec![probs, qkv],
            vec![
                save(probs, "out", probs_elems * bpe),
                save(qkv, "v", tok * kv * bpe),
            ],
        )
    }

    /// A block's MLP, from the first residual `r1` to the second (normed after it with
    /// post-norm); its parameters.
    fn mlp(&self, lb: &mut LayerBuilder, r1: Input) -> u64 {
        let mlp_in = self.mlp_norm(lb, r1);
        let (y, params) = self.dense_ffn(lb, mlp_in, self.cfg.ffn / self.t, "");
        self.mlp_residual(lb, y, r1);
        params
    }

    /// The norm before the MLP (pre-norm), or nothing.
    fn mlp_norm(&self, lb: &mut LayerBuilder, r1: Input) -> Input {
        if self.cfg.norm_position == NormPosition::Pre {
            self.norm(lb, "mlp_norm", r1)
        } else {
            r1
        }
    }

    /// The MLP's output `y` dropped out and added to the first residual `r1` (then normed
    /// with post-norm).
    fn mlp_residual(&self, lb: &mut LayerBuilder, y: Input, r1: Input) {
        let tok = self.tokens();
        let h = self.h;
        let y = self.dropout(lb, "fc2.dropout", y, self.rep(tok * h));
        let r2 = lb.push(
            "residual_2",
            self.vector(VectorKind::Add, self.rep(tok * h), 1),
            vec![y, r1],
            vec![],
        );
        if self.cfg.norm_position == NormPosition::Post {
            self.norm(lb, "mlp_norm", r2);
        }
    }

    /// A tensor-parallel FFN `f` wide on this rank (Megatron's column- then row-parallel
    /// pair), from its normed input to its biased output; its parameters. `prefix` names
    /// its operators (the dense MLP's have none, a shared expert's `shared_expert.`).
    fn dense_ffn(
        &self,
        lb: &mut LayerBuilder,
        mlp_in: Input,
        f: u64,
        prefix: &str,
    ) -> (Input, u64) {
        let cfg = self.cfg;
        let (h, bpe) = (self.h, self.bpe);
        let tok = self.tokens();
        let bias = u64::from(cfg.biases);
        let name = |n: &str| format!("{prefix}{n}");
        let copy = if prefix.is_empty() {
            "mlp_norm.copy_to_tp".to_string()
        } else {
            name("copy_to_tp")
        };
        let m = self.copy_to_tp(lb, &copy, mlp_in, tok * h);
        let in_save = save(mlp_in, "out", self.rep(tok * h) * bpe);
        let (hidden, mut params) = self.ffn_up(lb, prefix, (m, in_save), (tok, f), &|n, k| {
            self.gemm(tok, n, k)
        });
        params += f * h + bias * h;
        let down = lb.push(
            &name("fc2"),
            self.gemm(tok, h, f),
            vec![hidden],
            vec![save(hidden, "out", tok * f * bpe)],
        );
        let y = self.reduce_from_tp(lb, &name("fc2.all_reduce"), down, tok * h * bpe);
        let y = self.bias(lb, &name("fc2.bias"), y, self.rep(tok * h));
        (y, params)
    }

    /// An FFN's first half over `tokens` tokens of input `x` (saved as `in_save` for the
    /// weight gradients), `f` wide on this rank: gate and up projections, the activation and
    /// their product with a gated MLP, else one projection and the activation; `proj(n, k)`
    /// makes each projection (a tensor-parallel GEMM, or the experts' grouped GEMM), named
    /// with `prefix`. Returns the hidden tensor and the projections' parameters.
    fn ffn_up(
        &self,
        lb: &mut LayerBuilder,
        prefix: &str,
        (x, in_save): (Input, Saved),
        (tokens, f): (u64, u64),
        proj: &dyn Fn(u64, u64) -> FwdKind,
    ) -> (Input, u64) {
        let (h, bpe) = (self.h, self.bpe);
        let bias = u64::from(self.cfg.biases);
        let name = |n: &str| format!("{prefix}{n}");
        let act_kind = self.activation_kind();
        if self.cfg.gated_mlp {
            let gate = lb.push(&name("gate"), proj(f, h), vec![x], vec![in_save.clone()]);
            let gate = self.bias(lb, &name("gate.bias"), gate, tokens * f);
            let up = lb.push(&name("up"), proj(f, h), vec![x], vec![in_save]);
            let up = self.bias(lb, &name("up.bias"), up, tokens * f);
            let act = lb.push(
                &name("activation"),
                self.vector(act_kind, tokens * f, 1),
                vec![gate],
                vec![save(gate, "out", tokens * f * bpe)],
            );
            // Megatron-LM fuses the gated activation (its `bias_swiglu` kernel, Transformer
            // Engine's fused SwiGLU): backward recomputes the activation from the gate, so
            // only the two projections' outputs are kept.
            let hidden = lb.push(
                &name("gate_mul"),
                self.vector(VectorKind::Mul, tokens * f, 1),
                vec![act, up],
                vec![
                    save(gate, "out", tokens * f * bpe),
                    save(up, "out", tokens * f * bpe),
                ],
            );
            (hidden, 2 * (h * f + bias * f))
        } else {
            let fc1 = lb.push(&name("fc1"), proj(f, h), vec![x], vec![in_save]);
            let fc1 = self.bias(lb, &name("fc1.bias"), fc1, tokens * f);
            let hidden = lb.push(
                &name("activation"),
                self.vector(act_kind, tokens * f, 1),
                vec![fc1],
                vec![save(fc1, "out", tokens * f * bpe)],
            );
            (hidden, h * f + bias * f)
        }
    }

    fn activation_kind(&self) -> VectorKind {
        match self.cfg.activation {
            Activation::Gelu => VectorKind::Gelu,
            Activation::Relu => VectorKind::Relu,
            Activation::Silu => VectorKind::Silu,
        }
    }

    /// A block's Mixture-of-Experts FFN (Megatron-Core's `MoELayer` with the all-to-all
    /// token dispatcher), from the first residual `r1` to the second. Each rank routes the
    /// tokens of its sequence-parallel shard: the router (a GEMM over the experts, then
    /// softmax and top-k), the permutation that groups the `k` copies of each token by
    /// expert (a row gather), the all-to-all to the experts' ranks (priced by the step on
    /// the network: [`AllToAll`]), with `ETP > 1` an all-gather over the expert-tensor-
    /// parallel group, the experts' grouped GEMMs, and back: reduce-scatter, all-to-all,
    /// the un-permutation that weights each copy by its probability and sums them. Shared
    /// experts run on every token as a tensor-parallel MLP beside the routed ones.
    ///
    /// The layer is the busiest rank's: its experts receive `(E/EP − 1 + r)` times the mean
    /// tokens per expert, `r` the routing imbalance capped by the capacity factor, so the
    /// grouped GEMMs and the exchanges are sized by what that rank receives.
    fn moe_mlp(&self, lb: &mut LayerBuilder, r1: Input, m: Moe) -> Ffn {
        let (h, bpe) = (self.h, self.bpe);
        let tok = self.rep(self.tokens());
        let (e, k) = (m.experts.max(1), m.experts_per_token);
        let (ep, etp) = (
            self.experts.parallel.max(1),
            self.experts.tensor_parallel.max(1),
        );
        let local = (e / ep).max(1);
        let f = m.expert_ffn / etp;
        let mlp_in = self.mlp_norm(lb, r1);
        let router = lb.push(
            "router",
            self.gemm(tok, e, h),
            vec![mlp_in],
            vec![save(mlp_in, "out", tok * h * bpe)],
        );
        // Softmax and top-k in fp32, the probabilities and the chosen experts kept.
        let probs = lb.push(
            "router.softmax_top_k",
            self.vector(VectorKind::Softmax, tok * e, e),
            vec![router],
            vec![],
        );
        lb.save_output(probs, "probabilities", tok * e * 4);
        let sent = tok * k;
        lb.save_output(probs, "top_k_indices", sent * 4);
        let permuted = lb.push(
            "permutation",
            self.vector(VectorKind::Embedding, sent * h, h),
            vec![mlp_in, probs],
            vec![],
        );
        // Tokens the busiest rank's experts receive (exactly `sent` when balanced).
        let mean_per_expert = (sent * ep) as f64 / e as f64;
        let exact = mean_per_expert * ((local - 1) as f64 + m.busiest_over_mean());
        let received = if (exact - exact.round()).abs() < 1e-6 {
            exact.round() as u64
        } else {
            exact.ceil() as u64
        };
        let mut x = permuted;
        let gathered = etp * received;
        if etp > 1 {
            x = lb.push(
                "experts.all_gather",
                FwdKind::AllReduceBoth {
                    bytes: gathered * h * bpe / 2,
                    backward_bytes: gathered * h * bpe / 2,
                    group: etp as u32,
                    link_bytes_per_second: self.experts.link_bytes_per_second,
                },
                vec![x],
                vec![],
            );
        }
        let (y, expert_parameters, expert_flops) = self.experts_ffn(lb, x, local, gathered, f);
        let mut y = y;
        if etp > 1 {
            y = lb.push(
                "experts.reduce_scatter",
                FwdKind::AllReduceBoth {
                    bytes: gathered * h * bpe / 2,
                    backward_bytes: gathered * h * bpe / 2,
                    group: etp as u32,
                    link_bytes_per_second: self.experts.link_bytes_per_second,
                },
                vec![y],
                vec![],
            );
        }
        let mut combined = lb.push(
            "unpermutation",
            self.vector(VectorKind::Mul, sent * h, 1),
            vec![y, probs],
            vec![save(y, "out", sent * h * bpe)],
        );
        let mut parameters = h * e + expert_parameters;
        if m.shared_experts > 0 {
            let width = m.shared_experts * m.expert_ffn / self.t;
            let (shared, p) = self.dense_ffn(lb, mlp_in, width, "shared_expert.");
            parameters += p;
            combined = lb.push(
                "shared_expert.add",
                self.vector(VectorKind::Add, tok * h, 1),
                vec![combined, shared],
                vec![],
            );
        }
        self.mlp_residual(lb, combined, r1);
        // The balanced rank's expert GEMMs: `etp · sent` tokens.
        let balanced =
            expert_flops * (etp * sent) as f64 / (local * gathered.div_ceil(local)).max(1) as f64;
        Ffn {
            parameters,
            expert_parameters,
            all_to_all: (ep > 1).then_some(AllToAll {
                bytes: received * h * bpe,
                group: ep,
                stride: etp,
                count: 1,
            }),
            imbalance_matmul_flops: (expert_flops - balanced).max(0.0),
        }
    }

    /// The `local` experts of this rank over the `tokens` they receive (split evenly
    /// between them, so that a grouped GEMM of `local` products runs the busiest rank's
    /// FLOPs), each FFN `f` wide on this rank: its output, the experts' parameters on this
    /// rank and their forward matrix FLOPs.
    fn experts_ffn(
        &self,
        lb: &mut LayerBuilder,
        x: Input,
        local: u64,
        tokens: u64,
        f: u64,
    ) -> (Input, u64, f64) {
        let cfg = self.cfg;
        let (h, bpe) = (self.h, self.bpe);
        let bias = u64::from(cfg.biases);
        let per_expert = tokens.div_ceil(local);
        let grouped = |n: u64, k: u64| FwdKind::Gemm {
            gemm: Gemm {
                batch: local,
                m: per_expert,
                n,
                k,
            },
            second: Operand::Experts,
        };
        let in_save = save(x, "out", tokens * h * bpe);
        let (hidden, mut params) = self.ffn_up(lb, "expert_", (x, in_save), (tokens, f), &grouped);
        params += f * h + bias * h;
        let y = lb.push(
            "expert_fc2",
            grouped(h, f),
            vec![hidden],
            vec![save(hidden, "out", tokens * f * bpe)],
        );
        let y = self.bias(lb, "expert_fc2.bias", y, tokens * h);
        let gemms = if cfg.gated_mlp { 3.0 } else { 2.0 };
        let flops = gemms * 2.0 * (local * per_expert) as f64 * (h * f) as f64;
        (y, local * params, flops)
    }

    /// The head: the final norm, then the logits and the loss of the model's tokens and,
    /// with multi-token prediction, of each module's (Megatron-Core's output layer over
    /// `1 + depth` times the tokens; the modules' outputs are normed already).
    fn head(&self) -> Layer {
        let cfg = self.cfg;
        let (b, h, t, bpe) = (self.b, self.h, self.t, self.bpe);
        let tok = self.tokens();
        let predicted = tok * (1 + cfg.mtp_depth);
        let mut lb = LayerBuilder::default();
        let mut params = 0;
        let mut shared = 0;
        // The loss's logits, whose computation holds the workspace, and whether their
        // vocabulary is split over the tensor-parallel ranks (how PyTorch computes it).
        let logit_count;
        let mut vocabulary_split = false;
        let mut x = Input::External;
        if cfg.norm_position == NormPosition::Pre {
            params += self.norm_parameters();
            x = self.norm(&mut lb, "final_norm", x);
        }
        match cfg.head {
            Head::LanguageModel => {
                let e = cfg.embedding_dim.unwrap_or(h);
                if e != h {
                    params += h * e;
                    x = lb.push(
                        "project_out",
                        self.gemm(tok, e, h),
                        vec![x],
                        vec![save(x, "out", tok * h * bpe)],
                    );
                }
                let v = cfg.vocab_per_rank(t);
                params += v * e;
                if cfg.tied_embeddings {
                    shared += v * e;
                } else if cfg.mtp_depth > 0 {
                    // The multi-token-prediction modules look up the input embedding: this
                    // stage holds a copy of it, its gradient summed with the first stage's
                    // (as a tied output embedding is).
                    params += v * e;
                    shared += v * e;
                }
                let tok = predicted;
                let xin = self.copy_to_tp(&mut lb, "logits.copy_to_tp", x, tok * e);
                let logits = lb.push(
                    "logits",
                    self.gemm(tok, v, e),
                    vec![xin],
                    vec![save(x, "out", self.rep(tok * e) * bpe)],
                );
                // The softmax of the logits is kept in fp32 for the backward pass.
                logit_count = tok * v;
                vocabulary_split = t > 1;
                let ce = lb.push(
                    "cross_entropy",
                    self.vector(VectorKind::CrossEntropy, tok * v, v),
                    vec![logits],
                    vec![save(logits, "softmax", tok * v * 4)],
                );
                // Vocabulary-parallel cross-entropy: all-reduces of the row maxima, the sums
                // of exponentials and the target logits (fp32 each).
                self.reduce_from_tp(&mut lb, "cross_entropy.all_reduce", ce, 3 * tok * 4);
            }
            Head::Classifier { classes } => {
                params += h * h + h + h * classes + classes;
                let first = lb.push(
                    "pooler",
                    self.gemm(b, h, h),
                    vec![x],
                    vec![save(x, "first_token", b * h * bpe)],
                );
                let p = self.bias(&mut lb, "pooler.bias", first, b * h);
                let p = lb.push(
                    "pooler.tanh",
                    self.vector(VectorKind::Tanh, b * h, 1),
                    vec![p],
                    vec![],
                );
                lb.save_output(p, "out", b * h * bpe);
                let c = lb.push("classifier", self.gemm(b, classes, h), vec![p], vec![]);
                let c = self.bias(&mut lb, "classifier.bias", c, b * classes);
                logit_count = b * classes;
                lb.push(
                    "cross_entropy",
                    self.vector(VectorKind::CrossEntropy, b * classes, classes),
                    vec![c],
                    vec![save(c, "softmax", b * classes * 4)],
                );
            }
        }
        lb.cross_entropy = (self.cross_entropy, vocabulary_split);
        let mut head = self.layer(LayerKind::Head, lb, params, shared, 0);
        head.workspace_bytes = logit_count
            * self
                .cross_entropy
                .workspace_bytes_per_logit(vocabulary_split);
        head
    }
}
