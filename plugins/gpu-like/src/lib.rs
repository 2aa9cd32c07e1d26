//! An example vendor cost model: a GPU-like chip.
//!
//! It shows what a vendor's plugin can do differently from the reference model: it is
//! described by its own parameters (clock, achievable fraction of peak, HBM and on-chip
//! bandwidth, kernel-launch overhead, energy per flop and per byte, area per MAC, per
//! vector lane and per byte of SRAM) and it models a GPU's behaviour rather than a
//! systolic template:
//!
//! * every operator is a kernel launch with a fixed overhead;
//! * tensor cores run at a fraction of peak (`matrix_efficiency`: what the best-shaped GEMM
//!   reaches) that falls with tile and wave quantisation: the output is cut into tiles,
//!   one tile per core per wave, so partial tiles at the edges and a partly idle last wave
//!   are wasted (NVIDIA's "Matrix Multiplication Background User's Guide", §3). By default
//!   a tile is one core's `width × depth` array; with `gemm_tiles` (cuBLAS's tile sizes on
//!   the GPU presets) the best tile is chosen per GEMM, as cuBLAS's heuristics do — a
//!   large tile wastes more at the edges and in the last wave, a small one re-reads its
//!   operands more often and is bound by the on-chip bandwidth;
//! * operands stream from HBM, read once when they fit on chip and otherwise as often as
//!   the blocked product needs at best (Hong and Kung's `2·m·n·k/√S` for `S` elements on
//!   chip): a tall GEMM's traffic grows as its rows; on-chip bandwidth bounds the rest;
//! * vector kernels are memory-bound unless the element is expensive (softmax, GELU);
//! * all-reduce is a ring with a per-step latency;
//! * GEMMs run at the rate of their element type (interface 1.2): FP8 and MXFP8 at
//!   `fp8_speedup` times the 16-bit peak where the chip has them (2 on Hopper and
//!   Blackwell, their datasheets' dense FP8 over dense BF16; MXFP8 only with `mx_formats`,
//!   Blackwell, and 5% slower than per-tensor FP8: `MXFP8_GEMM_RATE`), fp32 on TF32
//!   tensor cores at half the 16-bit peak (every NVIDIA datasheet since the A100: 156 of
//!   312, 495 of 989 TFLOP/s dense), each moving its own bytes per
//!   element; the same `matrix_efficiency` for every type (no measured FP8 GEMM ceiling is
//!   cited: an assumption). A quantising cast reads its input (twice with current
//!   scaling) and writes both layouts of its output, memory-bound;
//! * fused attention runs its products at `attention_efficiency` of peak and moves only
//!   Q, K, V, the output and its statistics through HBM. It works in tiles of 128
//!   queries, each sweeping the keys 128 at a time (under a causal mask, up to and
//!   including its diagonal block, computed whole), and each tile has a fixed cost
//!   besides — its queries loaded, its output rescaled and written with its statistics —
//!   of `attention_tile_overhead` sweeps of one block: a short sequence runs further from
//!   the kernel's peak than a long one. Both are the kernel's, measured on the GPU
//!   (`attention_kernel`, the preset's
//!   [`archplace_plugin_sdk::gpus::AttentionKernel`]s: cuDNN's, which Transformer
//!   Engine prefers on Hopper and Blackwell, or FlashAttention-2, which runs at 0.6 to 0.3
//!   of cuDNN's rate there; cudnn-frontend's benchmarks, `archplace_plugin_sdk::gpus`).
//!   Without a preset: 0.6, within the 50–73% of A100 peak FlashAttention-2 reports
//!   forward (Dao 2023, §4.1; 45–63% backward), and 1.9, what the forward kernels
//!   measured on H100 in pytorch/benchmark#2391 (head dimension 128, 16,384 tokens and
//!   16 heads at every length, so the same 2,048 tiles: Triton's FlashAttention-2 329 →
//!   477 TFLOP/s and FlashAttention-3 430 → 621 from 512 to 16,384 tokens: relative to
//!   the longest, `n/(n + 1.9)` for `n` blocks of keys is within 0.4% of the first at all
//!   six lengths, within 1.6% of the second). The kernel is
//!   compiled for a few head dimensions and runs a head at the next one up
//!   (`kernel_head_dim`): a 112-wide head (MPT-30B's) costs what a 128-wide one does.
//!
//! Area: MACs, vector lanes, SRAM and a fixed uncore, each from a parameter; a chip beyond
//! the reticle (default 858 mm²) is outside the model's domain.

use archplace_plugin_sdk::units::{parse_area_um2, parse_bandwidth, parse_hertz, parse_seconds};
use archplace_plugin_sdk::{
    AcceleratorConfig, CoreConfig, CoreKind, ElementType, EstimateError, ModelInfo, Op, OpCost,
    OpKind, Parameter, ParameterError, Plugin, VectorKind,
};

archplace_plugin_sdk::export_plugin!(GpuLike);

/// Bytes per element of 16-bit data, the default type.
const ELEMENT_BYTES: f64 = 2.0;

/// The queries of a fused attention kernel's tile and the keys it takes per step of its
/// sweep: FlashAttention-2's and 3's 128 × 128 blocks at head dimension 128, the unit of
/// `attention_tile_overhead`.
const ATTENTION_BLOCK: f64 = 128.0;

/// The head dimension a fused attention kernel runs a head of `d` at: FlashAttention-2
/// compiles its kernels for head dimensions in steps of 32 up to 192, then 256, and runs
/// every head at the next one up (`flash_api.cpp`: `head_size_rounded = head_size <= 192 ?
/// round_multiple(head_size, 32) : 256`), its tiles as wide as that whatever the head:
/// 64, 96, 128, 192 and 256 run as they are, 112 as 128. FlashAttention-3 (built for 64,
/// 96, 128, 192 and 256) rounds the same way; the Triton kernel of 2023 that llm-foundry
/// ran (`BLOCK_HEADDIM`, the next power of two) does for 112 too, though it would run a
/// 96-wide head as 128.
fn kernel_head_dim(d: u64) -> u64 {
    if d <= 192 { d.div_ceil(32) * 32 } else { 256 }
}

/// A block-scaled (MXFP8) GEMM's speed over a per-tensor-scaled FP8 one's on the same
/// tensor cores: Transformer Engine's GEMM profiling guide
/// (`docs/examples/gemm_profiling/gemm_profiling.rst`, 2026) times a 5B model's layer GEMMs
/// (forward, data and weight gradients, inputs quantised beforehand so only the kernels
/// are timed) on a B300: 6.812 ms a layer for FP8 with current scaling, 7.161 ms for MXFP8
/// — the block scales' loads and the scaled accumulation cost 5%.
const MXFP8_GEMM_RATE: f64 = 6.812 / 7.161;

/// The TF32 tensor cores' throughput over the 16-bit one (every NVIDIA datasheet since
/// the A100's: 156 of 312, 494.7 of 989.4, 1.1 of 2.25 PFLOP/s dense).
const TF32_SPEEDUP: f64 = 0.5;

/// The model's parameters, in SI units.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuLike {
    pub clock_hz: f64,
    /// Fraction of peak matrix throughput a large, well-shaped GEMM reaches.
    pub matrix_efficiency: f64,
    /// Fraction of peak matrix throughput a fused attention kernel's inner loop reaches
    /// (what a long sequence approaches).
    pub attention_efficiency: f64,
    /// A fused attention kernel's fixed work per tile of queries, in sweeps of one block
    /// of keys (`ATTENTION_BLOCK`).
    pub attention_tile_overhead: f64,
    /// The output tiles a core may compute per wave (rows, columns; either way round),
    /// the best chosen per GEMM; empty: the core's `width × depth` array.
    pub gemm_tiles: Vec<(u64, u64)>,
    pub hbm_bytes_per_second: f64,
    /// Fraction of the HBM bandwidth memory-bound kernels sustain.
    pub memory_efficiency: f64,
    /// Element-wise work fused to a GEMM runs in its epilogue (true) or as separate
    /// kernels after it, each reading and writing its elements (false: cuBLAS GEMMs
    /// followed by framework kernels, as Megatron-LM runs bias + GeLU and bias + dropout +
    /// residual).
    pub fused_epilogues: bool,
    pub on_chip_bytes_per_second: f64,
    pub launch_seconds: f64,
    pub link_latency_seconds: f64,
    pub joules_per_flop: f64,
    pub joules_per_hbm_byte: f64,
    pub mac_area_um2: f64,
    pub lane_area_um2: f64,
    pub sram_area_um2_per_byte: f64,
    pub uncore_area_um2: f64,
    pub max_area_um2: f64,
    /// FP8 tensor-core throughput over the 16-bit one; 0: the chip has no FP8.
    pub fp8_speedup: f64,
    /// The tensor cores take MXFP8 (block-scaled FP8) at the FP8 rate.
    pub mx_formats: bool,
    /// A cast to per-tensor-scaled FP8 also writes the transpose: the FP8 GEMMs take only
    /// the TN layout (Hopper), so the tensor both passes multiply is kept both ways
    /// (Transformer Engine's `cast_transpose`); Blackwell's take every layout and keep it
    /// once. A cast to MXFP8 always writes two copies (row- and column-wise blocks: the
    /// scales run along the reduction dimension, which the passes take along different
    /// axes).
    pub fp8_transpose: bool,
}

impl Default for GpuLike {
    fn default() -> Self {
        GpuLike {
            clock_hz: 1.4e9,
            matrix_efficiency: 0.75,
            attention_efficiency: 0.6,
            attention_tile_overhead: 1.9,
            gemm_tiles: Vec::new(),
            hbm_bytes_per_second: 2.0e12,
            memory_efficiency: 1.0,
            fused_epilogues: true,
            on_chip_bytes_per_second: 20.0e12,
            launch_seconds: 4e-6,
            link_latency_seconds: 5e-6,
            joules_per_flop: 0.4e-12,
            joules_per_hbm_byte: 7.0e-12,
            mac_area_um2: 600.0,
            lane_area_um2: 1500.0,
            sram_area_um2_per_byte: 0.6,
            uncore_area_um2: 40.0e6,
            max_area_um2: 858.0e6,
            fp8_speedup: 2.0,
            mx_formats: true,
            fp8_transpose: true,
        }
    }
}

struct Param {
    name: &'static str,
    description: &'static str,
    default: &'static str,
}

const PARAMETERS: [Param; 23] = [
    Param {
        name: "preset",
        description: "a GPU that sets clock, hbm_bandwidth and on_chip_bandwidth (datasheet; L2 for A100 only), matrix_efficiency (measured GEMM ceiling), memory_efficiency (measured, A100 only), gemm_tiles (cuBLAS), fp8_speedup and mx_formats (datasheet), fp8_transpose (cuBLASLt's FP8 layouts): a100-sxm-80gb, h100-sxm-80gb, h200-sxm-141gb, h800-sxm-80gb, b200-sxm-180gb, gb200 (parameters given override it)",
        default: "none",
    },
    Param {
        name: "clock",
        description: "core clock",
        default: "1.4 GHz",
    },
    Param {
        name: "matrix_efficiency",
        description: "fraction of peak matrix throughput a large GEMM reaches (0 < x ≤ 1)",
        default: "0.75",
    },
    Param {
        name: "attention_kernel",
        description: "the fused attention kernel: `default` (what the GPU's training stacks pick: cuDNN's on Hopper and Blackwell, FlashAttention-2 on Ampere) or `flash-attn-2` (Tri Dao's, as a stack that turns cuDNN's off runs); with a `preset` it sets attention_efficiency and attention_tile_overhead from the kernel's benchmark on that GPU (given ones override it)",
        default: "default",
    },
    Param {
        name: "attention_efficiency",
        description: "fraction of peak matrix throughput a fused attention kernel's inner loop reaches, what long sequences approach (0 < x ≤ 1; the preset's attention_kernel: cuDNN 0.54 and FlashAttention-2 0.34 on Hopper, 0.60 and 0.18 on Blackwell, FlashAttention-2 0.6 on A100)",
        default: "0.6",
    },
    Param {
        name: "attention_tile_overhead",
        description: "a fused attention kernel's fixed work per tile of 128 queries, in sweeps of one block of 128 keys (≥ 0; the preset's attention_kernel: cuDNN 1.9 and FlashAttention-2 3.8 on Hopper, 11.5 and 4.4 on Blackwell)",
        default: "1.9",
    },
    Param {
        name: "memory_efficiency",
        description: "fraction of the HBM bandwidth memory-bound kernels sustain (0 < x ≤ 1)",
        default: "1",
    },
    Param {
        name: "fused_epilogues",
        description: "element-wise work fused to a GEMM runs in its epilogue (true) or as separate memory-bound kernels after it (false)",
        default: "true",
    },
    Param {
        name: "gemm_tiles",
        description: "output tiles a core may compute per wave, the best chosen per GEMM, e.g. `256x128, 128x128, 64x64`, or `core` for the core's width × depth array",
        default: "core",
    },
    Param {
        name: "hbm_bandwidth",
        description: "HBM bandwidth of the chip",
        default: "2 TB/s",
    },
    Param {
        name: "on_chip_bandwidth",
        description: "on-chip (shared memory / L2) bandwidth",
        default: "20 TB/s",
    },
    Param {
        name: "launch_overhead",
        description: "fixed cost of every kernel",
        default: "4 us",
    },
    Param {
        name: "link_latency",
        description: "latency of one ring step of an all-reduce",
        default: "5 us",
    },
    Param {
        name: "pj_per_flop",
        description: "energy per floating-point operation, picojoules",
        default: "0.4",
    },
    Param {
        name: "pj_per_hbm_byte",
        description: "energy per byte moved to or from HBM, picojoules",
        default: "7",
    },
    Param {
        name: "mac_area",
        description: "area of one MAC unit of a tensor core",
        default: "600 um2",
    },
    Param {
        name: "lane_area",
        description: "area of one vector lane",
        default: "1500 um2",
    },
    Param {
        name: "sram_area_per_byte",
        description: "area of one byte of on-chip SRAM",
        default: "0.6 um2",
    },
    Param {
        name: "uncore_area",
        description: "fixed area: memory controllers, I/O, interconnect",
        default: "40 mm2",
    },
    Param {
        name: "max_area",
        description: "largest chip the model describes (the reticle)",
        default: "858 mm2",
    },
    Param {
        name: "fp8_speedup",
        description: "FP8 tensor-core throughput over the 16-bit one (2 on Hopper and Blackwell; 0: the chip has no FP8)",
        default: "2",
    },
    Param {
        name: "mx_formats",
        description: "the tensor cores take block-scaled MXFP8 at the FP8 rate (Blackwell: true; Hopper: false)",
        default: "true",
    },
    Param {
        name: "fp8_transpose",
        description: "a cast to per-tensor-scaled FP8 also writes the transpose, because the FP8 GEMMs take only the TN layout (Hopper: true; Blackwell takes every layout: false)",
        default: "true",
    },
];

/// What `archplace calibrate` may fit (interface 1.3): name, unit, physical bounds, and
/// whether it is fitted by default. The efficiencies and the launch overhead are what
/// measured steps tell apart; the sustained clock scales every kernel as
/// `matrix_efficiency` scales GEMMs, so whole steps cannot tell the two apart — it is
/// fitted from per-operator measurements when asked (`fit = ["clock", …]`), as is the
/// all-reduce ring step's latency. So is the launch overhead: fitted to whole steps it
/// became a stand-in for other costs (9× its physical value on NVIDIA's runs; held at the
/// preset's, their residuals show no dependence on the kernel count: docs/calibration.md,
/// "What the per-kernel overhead absorbed"). A fused attention kernel not built for the
/// GPU reaches well under a fifth of its peak (the Triton FlashAttention of 2023 on H100
/// that llm-foundry's MPT benchmarks ran), hence the floor of 0.1.
const CALIBRATABLE: [(&str, &str, f64, f64, bool); 7] = [
    ("matrix_efficiency", "", 0.3, 1.0, true),
    ("attention_efficiency", "", 0.1, 1.0, true),
    ("attention_tile_overhead", "", 0.1, 10.0, false),
    ("memory_efficiency", "", 0.3, 1.0, true),
    ("launch_overhead", "us", 0.5, 50.0, false),
    ("clock", "GHz", 0.5, 3.5, false),
    ("link_latency", "us", 0.5, 100.0, false),
];

fn parse_bool(v: &str) -> Result<bool, String> {
    match v.trim() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(format!("`{v}` is not true or false")),
    }
}

fn parse_fraction(v: &str) -> Result<f64, String> {
    match v.trim().parse::<f64>() {
        Ok(x) if x > 0.0 && x <= 1.0 => Ok(x),
        _ => Err(format!("`{v}` is not a fraction in (0, 1]")),
    }
}

/// `core` (no tiles), or a comma-separated list of `ROWSxCOLUMNS`, each side 1 to 65,536.
fn parse_tiles(v: &str) -> Result<Vec<(u64, u64)>, String> {
    let v = v.trim();
    if v == "core" {
        return Ok(Vec::new());
    }
    v.split(',')
        .map(|tile| {
            let tile = tile.trim();
            let bad = || format!("`{tile}` is not a tile: use e.g. `256x128, 128x128`, or `core`");
            let (r, c) = tile.split_once(['x', 'X', '×']).ok_or_else(bad)?;
            match (r.trim().parse::<u64>(), c.trim().parse::<u64>()) {
                (Ok(r), Ok(c)) if (1..=1 << 16).contains(&r) && (1..=1 << 16).contains(&c) => {
                    Ok((r, c))
                }
                _ => Err(bad()),
            }
        })
        .collect()
}

fn parse_positive(v: &str) -> Result<f64, String> {
    match v.trim().parse::<f64>() {
        Ok(x) if x.is_finite() && x >= 0.0 => Ok(x),
        _ => Err(format!("`{v}` is not a non-negative number")),
    }
}

/// The fused attention kernels `attention_kernel` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AttentionKernelName {
    /// What the GPU's training stacks pick (the preset's `default_attention`).
    Default,
    /// Tri Dao's FlashAttention-2.
    FlashAttention2,
}

impl AttentionKernelName {
    fn parse(v: &str) -> Result<Self, String> {
        match v.trim() {
            "default" => Ok(Self::Default),
            "flash-attn-2" => Ok(Self::FlashAttention2),
            other => Err(format!(
                "no attention kernel `{other}`: `default` (the GPU's stacks' choice) or `flash-attn-2`"
            )),
        }
    }
}

impl GpuLike {
    /// The model from the spec's parameters; every bad one is reported.
    pub fn with_parameters(parameters: &[Parameter]) -> Result<Self, Vec<ParameterError>> {
        let mut m = GpuLike::default();
        let mut errors = Vec::new();
        let mut preset = None;
        // The preset first, whatever the order: the other parameters override it.
        for p in parameters.iter().filter(|p| p.name == "preset") {
            match (
                p.value.trim(),
                archplace_plugin_sdk::gpus::gpu(p.value.trim()),
            ) {
                ("none", _) => {}
                (_, Some(g)) => {
                    preset = Some(g);
                    m.clock_hz = g.clock_hz;
                    m.hbm_bytes_per_second = g.hbm_bytes_per_second;
                    if let Some(f) = g.max_memory_fraction {
                        m.memory_efficiency = f;
                    }
                    m.matrix_efficiency = g.max_matmul_fraction;
                    if let Some(l2) = g.l2_bytes_per_second {
                        m.on_chip_bytes_per_second = l2;
                    }
                    m.gemm_tiles = g
                        .gemm_tiles
                        .iter()
                        .map(|&(r, c)| (u64::from(r), u64::from(c)))
                        .collect();
                    m.fp8_speedup = g
                        .peak_dense_fp8_flops_per_second
                        .map_or(0.0, |f| f / g.peak_dense_16bit_flops_per_second);
                    m.mx_formats = g.mx_formats;
                    m.fp8_transpose = !g.non_tn_fp8_gemms;
                }
                (other, None) => errors.push(ParameterError::new(
                    "preset",
                    format!(
                        "no GPU preset `{other}`; presets: {}",
                        archplace_plugin_sdk::gpus::names()
                    ),
                )),
            }
        }
        let mut kernel = AttentionKernelName::Default;
        for p in parameters {
            let v = p.value.as_str();
            let r: Result<(), String> = (|| {
                match p.name.as_str() {
                    "preset" => {}
                    "attention_kernel" => kernel = AttentionKernelName::parse(v)?,
                    "clock" => m.clock_hz = parse_hertz(v).map_err(|e| e.message)?,
                    "matrix_efficiency" => m.matrix_efficiency = parse_fraction(v)?,
                    "memory_efficiency" => m.memory_efficiency = parse_fraction(v)?,
                    "attention_efficiency" => m.attention_efficiency = parse_fraction(v)?,
                    "attention_tile_overhead" => m.attention_tile_overhead = parse_positive(v)?,
                    "fused_epilogues" => m.fused_epilogues = parse_bool(v)?,
                    "mx_formats" => m.mx_formats = parse_bool(v)?,
                    "fp8_transpose" => m.fp8_transpose = parse_bool(v)?,
                    "fp8_speedup" => {
                        m.fp8_speedup = match v.trim().parse::<f64>() {
                            Ok(x) if x.is_finite() && x >= 0.0 => x,
                            _ => return Err(format!("`{v}` is not a non-negative number")),
                        }
                    }
                    "gemm_tiles" => m.gemm_tiles = parse_tiles(v)?,
                    "hbm_bandwidth" => {
                        m.hbm_bytes_per_second = parse_bandwidth(v).map_err(|e| e.message)?
                    }
                    "on_chip_bandwidth" => {
                        m.on_chip_bytes_per_second = parse_bandwidth(v).map_err(|e| e.message)?
                    }
                    "launch_overhead" => {
                        m.launch_seconds = parse_seconds(v).map_err(|e| e.message)?
                    }
                    "link_latency" => {
                        m.link_latency_seconds = parse_seconds(v).map_err(|e| e.message)?
                    }
                    "pj_per_flop" => m.joules_per_flop = parse_positive(v)? * 1e-12,
                    "pj_per_hbm_byte" => m.joules_per_hbm_byte = parse_positive(v)? * 1e-12,
                    "mac_area" => m.mac_area_um2 = parse_area_um2(v).map_err(|e| e.message)?,
                    "lane_area" => m.lane_area_um2 = parse_area_um2(v).map_err(|e| e.message)?,
                    "sram_area_per_byte" => {
                        m.sram_area_um2_per_byte = parse_area_um2(v).map_err(|e| e.message)?
                    }
                    "uncore_area" => {
                        m.uncore_area_um2 = parse_area_um2(v).map_err(|e| e.message)?
                    }
                    "max_area" => m.max_area_um2 = parse_area_um2(v).map_err(|e| e.message)?,
                    other => return Err(ParameterError::unknown(other, &Self::describe()).message),
                }
                Ok(())
            })();
            if let Err(message) = r {
                errors.push(ParameterError::new(&p.name, message));
            }
        }
        // The attention kernel's measured speed on the preset's GPU, where the spec does
        // not give it (without a preset the kernels are not told apart).
        if let Some(g) = preset {
            let k = match kernel {
                AttentionKernelName::Default => g.default_attention,
                AttentionKernelName::FlashAttention2 => g.flash_attention_2,
            };
            let given = |name: &str| parameters.iter().any(|p| p.name == name);
            if !given("attention_efficiency") {
                m.attention_efficiency = k.peak_fraction;
            }
            if !given("attention_tile_overhead") {
                m.attention_tile_overhead = k.tile_overhead;
            }
        }
        for (name, value) in [
            ("clock", m.clock_hz),
            ("hbm_bandwidth", m.hbm_bytes_per_second),
            ("on_chip_bandwidth", m.on_chip_bytes_per_second),
        ] {
            if value <= 0.0 && !errors.iter().any(|e| e.name == name) {
                errors.push(ParameterError::new(name, "must be above zero"));
            }
        }
        if errors.is_empty() {
            Ok(m)
        } else {
            Err(errors)
        }
    }

    fn describe() -> ModelInfo {
        let info = PARAMETERS.iter().fold(
            ModelInfo::new("gpu-like", "archplace examples", env!("CARGO_PKG_VERSION")),
            |info, p| info.parameter(p.name, p.description, p.default),
        );
        CALIBRATABLE
            .iter()
            .fold(info, |info, &(name, unit, lower, upper, fit)| {
                info.calibratable(name, unit, lower, upper, fit)
            })
    }

    /// Area of one configuration, µm².
    pub fn area(&self, c: &AcceleratorConfig) -> Result<f64, EstimateError> {
        let macs = f64::from(c.tensor_cores) * f64::from(c.width) * f64::from(c.depth);
        let lanes = f64::from(c.vector_cores) * f64::from(c.vector_width);
        let a = self.uncore_area_um2
            + macs * self.mac_area_um2
            + lanes * self.lane_area_um2
            + c.buffer_bytes as f64 * self.sram_area_um2_per_byte;
        if a > self.max_area_um2 {
            return Err(EstimateError::OutOfDomain(format!(
                "{:.1} mm² is beyond the largest chip this model describes ({:.1} mm²)",
                a / 1e6,
                self.max_area_um2 / 1e6
            )));
        }
        Ok(a)
    }

    /// Seconds of a fused attention kernel's products at `peak` FLOP/s: tiles of
    /// `ATTENTION_BLOCK` queries, each sweeping the keys a block at a time — all `n` blocks,
    /// or under a causal mask those up to and including its diagonal one, computed whole
    /// (`(n + 1)/2n` of the unmasked products, where the products themselves count
    /// `(s + 1)/2s`) — and each a fixed `attention_tile_overhead` sweeps more, at
    /// `attention_efficiency` of peak, its heads as wide as the kernel built for them
    /// (`kernel_head_dim`). The backward kernel's tiles (of keys, sweeping
    /// queries) are taken to cost the same per tile as the forward's: no measurement of
    /// its per-tile cost is cited.
    fn attention_seconds(
        &self,
        a: &archplace_plugin_sdk::Attention,
        direction: archplace_plugin_sdk::Direction,
        peak: f64,
    ) -> f64 {
        let kernel = archplace_plugin_sdk::Attention {
            head_dim: kernel_head_dim(a.head_dim),
            value_dim: kernel_head_dim(a.value_dim),
            ..*a
        };
        let unmasked = kernel.flops(direction) / kernel.computed_fraction();
        let blocks = (a.seq as f64 / ATTENTION_BLOCK).max(1.0);
        let swept = if a.causal {
            (blocks + 1.0) / (2.0 * blocks)
        } else {
            1.0
        };
        unmasked * (swept + self.attention_tile_overhead / blocks)
            / (peak * self.attention_efficiency)
    }

    /// The HBM bandwidth memory-bound kernels sustain.
    fn sustained_hbm(&self) -> f64 {
        self.hbm_bytes_per_second * self.memory_efficiency
    }

    /// Seconds of a GEMM's matrix work on `core`: its output cut into tiles, one tile per
    /// core per wave. With the core's own array as the tile, a tile takes its share of the
    /// peak (at `matrix_efficiency`); with `gemm_tiles`, a tile also streams its operands
    /// (`(rows + columns) × k` elements) through its core's share of the on-chip
    /// bandwidth, and the fastest tile, laid either way round, is chosen.
    pub fn matrix_seconds(&self, core: &CoreConfig, g: archplace_plugin_sdk::Gemm) -> f64 {
        self.typed_matrix_seconds(core, g, ElementType::Bf16, 1.0)
    }

    /// The tensor cores' throughput for inputs of `element` over their 16-bit one; an
    /// error for a type the chip does not multiply.
    pub fn tensor_speedup(&self, element: ElementType) -> Result<f64, EstimateError> {
        let missing = || {
            EstimateError::Unsupported(format!(
                "the tensor cores do not multiply {} (fp8_speedup = {}, mx_formats = {})",
                element.name(),
                self.fp8_speedup,
                self.mx_formats
            ))
        };
        match element {
            ElementType::Bf16 | ElementType::Fp16 => Ok(1.0),
            ElementType::Fp32 => Ok(TF32_SPEEDUP),
            ElementType::Fp8 if self.fp8_speedup > 0.0 => Ok(self.fp8_speedup),
            ElementType::Mxfp8 if self.fp8_speedup > 0.0 && self.mx_formats => {
                Ok(self.fp8_speedup * MXFP8_GEMM_RATE)
            }
            _ => Err(missing()),
        }
    }

    /// [`GpuLike::matrix_seconds`] for inputs of `element` at `speedup` times the 16-bit
    /// rate, each tile streaming its operands at that type's bytes.
    fn typed_matrix_seconds(
        &self,
        core: &CoreConfig,
        g: archplace_plugin_sdk::Gemm,
        element: ElementType,
        speedup: f64,
    ) -> f64 {
        let cores = u64::from(core.cores.max(1));
        let per_core_flops = 2.0
            * f64::from(core.width.max(1))
            * f64::from(core.depth.max(1))
            * self.clock_hz
            * self.matrix_efficiency
            * speedup;
        let waves = |(tm, tn): (u64, u64)| {
            let tiles = g
                .batch
                .saturating_mul(g.m.div_ceil(tm))
                .saturating_mul(g.n.div_ceil(tn));
            tiles.div_ceil(cores) as f64
        };
        let k = g.k as f64;
        if self.gemm_tiles.is_empty() {
            let tile = (u64::from(core.width.max(1)), u64::from(core.depth.max(1)));
            return waves(tile) * 2.0 * (tile.0 * tile.1) as f64 * k / per_core_flops;
        }
        let per_core_bandwidth = self.on_chip_bytes_per_second / cores as f64;
        self.gemm_tiles
            .iter()
            .flat_map(|&(r, c)| [(r, c), (c, r)])
            .map(|(tm, tn)| {
                let compute = 2.0 * (tm * tn) as f64 * k / per_core_flops;
                let operands = element.bytes() * (tm + tn) as f64 * k / per_core_bandwidth;
                waves((tm, tn)) * compute.max(operands)
            })
            .fold(f64::INFINITY, f64::min)
    }

    /// Copies a cast to `to` writes ([`GpuLike::fp8_transpose`]).
    fn cast_layouts(&self, to: ElementType) -> u32 {
        match to {
            ElementType::Fp8 if !self.fp8_transpose => 1,
            _ => 2,
        }
    }

    /// Flops per element of a vector operator.
    fn flops_per_element(kind: VectorKind) -> f64 {
        match kind {
            VectorKind::Add | VectorKind::Mul | VectorKind::BiasAdd | VectorKind::Scale => 1.0,
            VectorKind::Relu | VectorKind::Dropout | VectorKind::Embedding => 1.0,
            VectorKind::Rotary => 4.0,
            VectorKind::LayerNorm | VectorKind::RmsNorm => 8.0,
            VectorKind::Gelu | VectorKind::Silu | VectorKind::Tanh => 12.0,
            VectorKind::Softmax | VectorKind::CrossEntropy => 16.0,
        }
    }

    /// Seconds and joules of one operator.
    pub fn cost(&self, core: &CoreConfig, op: &Op) -> Result<OpCost, EstimateError> {
        let cores = f64::from(core.cores.max(1));
        let lanes = f64::from(core.width) * f64::from(core.depth) * cores;
        if lanes == 0.0 {
            return Err(EstimateError::OutOfDomain("a core with no lanes".into()));
        }
        let buffer = core.buffer_bytes.max(1) as f64;
        let backward = if op.direction == archplace_plugin_sdk::Direction::Backward {
            2.0
        } else {
            1.0
        };
        // Bytes of one element of the operator's data (a GEMM's inputs; its output and
        // everything else is 16-bit, or fp32 with fp32 data).
        let element_bytes = op.element.bytes();
        let output_bytes = if op.element == ElementType::Fp32 {
            4.0
        } else {
            ELEMENT_BYTES
        };
        // The last: the seconds of HBM traffic at the sustained bandwidth (interface 1.1),
        // `None` for collectives, which the links bound.
        let (seconds, flops, hbm_bytes, memory) = match op.kind {
            OpKind::Cast(c) => {
                if core.kind != CoreKind::Vector {
                    return Err(EstimateError::Unsupported("a cast on tensor cores".into()));
                }
                // The maximum and the scaling: a few operations per element read.
                let reads = if c.amax_pass { 2.0 } else { 1.0 };
                let flops = reads * 2.0 * c.elements as f64;
                let compute = flops / (lanes * self.clock_hz);
                let bytes = c.memory_bytes_in(op.element, self.cast_layouts(c.to));
                let memory = bytes / self.sustained_hbm();
                (compute.max(memory), flops, bytes, Some(memory))
            }
            OpKind::Attention(a) => {
                if core.kind != CoreKind::Tensor {
                    return Err(EstimateError::Unsupported(
                        "fused attention on vector cores".into(),
                    ));
                }
                let flops = a.flops(op.direction);
                let peak = 2.0 * lanes * self.clock_hz;
                let compute = self.attention_seconds(&a, op.direction, peak);
                // The log-sum-exp statistics are fp32.
                let bytes =
                    output_bytes * a.memory_elements(op.direction) + 4.0 * a.statistics() as f64;
                let memory = bytes / self.sustained_hbm();
                (compute.max(memory), flops, bytes, Some(memory))
            }
            OpKind::Gemm(g) => {
                if core.kind != CoreKind::Tensor {
                    return Err(EstimateError::Unsupported("a GEMM on vector cores".into()));
                }
                let flops = g.flops();
                let speedup = self.tensor_speedup(op.element)?;
                let compute = self.typed_matrix_seconds(core, g, op.element, speedup);
                let (hbm, working_set) = gemm_traffic(g, element_bytes, output_bytes, buffer);
                let memory = hbm / self.sustained_hbm();
                let on_chip = 2.0 * working_set / self.on_chip_bytes_per_second;
                let epilogue_flops: f64 = op
                    .fused
                    .iter()
                    .map(|f| f.elements as f64 * Self::flops_per_element(f.kind))
                    .sum();
                let epilogue = epilogue_flops / (lanes * self.clock_hz);
                if self.fused_epilogues {
                    (
                        compute.max(memory).max(on_chip) + epilogue,
                        flops,
                        hbm,
                        Some(memory),
                    )
                } else {
                    // The epilogue is one element-wise kernel of its own (the framework
                    // fuses bias, activation, dropout and residual into one): it reads
                    // and writes the GEMM's output once more.
                    let largest = op.fused.iter().map(|f| f.elements).max().unwrap_or(0);
                    let bytes = 2.0 * output_bytes * largest as f64;
                    let kernels = if op.fused.is_empty() {
                        0.0
                    } else {
                        epilogue.max(bytes / self.sustained_hbm()) + self.launch_seconds
                    };
                    let epilogue_memory = if op.fused.is_empty() {
                        0.0
                    } else {
                        bytes / self.sustained_hbm()
                    };
                    (
                        compute.max(memory).max(on_chip) + kernels,
                        flops,
                        hbm + bytes,
                        Some(memory + epilogue_memory),
                    )
                }
            }
            OpKind::Vector {
                kind,
                elements,
                row,
            } => {
                let flops = elements as f64 * Self::flops_per_element(kind) * backward;
                let compute = flops / (lanes * self.clock_hz);
                // Read and write every element (twice as much backward); row-wise
                // kernels that do not fit on chip read their rows twice.
                let mut bytes = element_bytes * elements as f64 * 2.0 * backward;
                if row > 1 && element_bytes * row as f64 > buffer / cores {
                    bytes *= 1.5;
                }
                let memory = bytes / self.sustained_hbm();
                (compute.max(memory), flops, bytes, Some(memory))
            }
            OpKind::AllReduce {
                bytes,
                group,
                link_bytes_per_second,
            } => {
                if group <= 1 {
                    return Ok(OpCost::new(0.0, 0.0));
                }
                if link_bytes_per_second == 0 {
                    return Err(EstimateError::OutOfDomain("links without bandwidth".into()));
                }
                let g = f64::from(group);
                let steps = 2.0 * (g - 1.0);
                let t = steps / g * bytes as f64 / link_bytes_per_second as f64
                    + steps * self.link_latency_seconds;
                (t, 0.0, 2.0 * bytes as f64, None)
            }
        };
        let cost = OpCost::new(
            seconds + self.launch_seconds,
            flops * self.joules_per_flop + hbm_bytes * self.joules_per_hbm_byte,
        );
        Ok(match memory {
            Some(m) => cost.with_memory_seconds(m),
            None => cost,
        })
    }
}

impl Plugin for GpuLike {
    fn info() -> ModelInfo {
        Self::describe()
    }

    fn configured(&self) -> Vec<(String, f64)> {
        vec![
            ("matrix_efficiency".into(), self.matrix_efficiency),
            ("attention_efficiency".into(), self.attention_efficiency),
            (
                "attention_tile_overhead".into(),
                self.attention_tile_overhead,
            ),
            ("memory_efficiency".into(), self.memory_efficiency),
            ("launch_overhead".into(), self.launch_seconds * 1e6),
            ("clock".into(), self.clock_hz / 1e9),
            ("link_latency".into(), self.link_latency_seconds * 1e6),
        ]
    }

    fn new(parameters: &[Parameter]) -> Result<Self, Vec<ParameterError>> {
        Self::with_parameters(parameters)
    }

    fn area_um2(
        &self,
        configs: &[AcceleratorConfig],
    ) -> Result<Vec<Result<f64, EstimateError>>, EstimateError> {
        Ok(configs.iter().map(|c| self.area(c)).collect())
    }

    fn latency(&self, core: &CoreConfig, ops: &[Op]) -> Result<Vec<OpCost>, EstimateError> {
        ops.iter().map(|op| self.cost(core, op)).collect()
    }

    /// Fused attention as the one kernel it is (`attention_efficiency` of peak, or its
    /// memory traffic), not the SDK's default of its unfused operators, whose `s × s`
    /// scores would go through memory.
    fn attention(&self, core: &CoreConfig, ops: &[Op]) -> Result<Vec<OpCost>, EstimateError> {
        self.latency(core, ops)
    }

    /// 16-bit and TF32 always; FP8 with `fp8_speedup > 0`, MXFP8 also with `mx_formats`.
    fn tensor_element_types(&self) -> Vec<ElementType> {
        ElementType::ALL
            .into_iter()
            .filter(|&e| self.tensor_speedup(e).is_ok())
            .collect()
    }
}

/// A GEMM's HBM bytes and its working set (operands and output, every GEMM of the batch),
/// `element_bytes` per input element, `output_bytes` per output one, through `buffer` bytes
/// on chip. Each GEMM of a batch has its own operands, read from HBM once when they fit on
/// chip; otherwise the output is computed in blocks whose operand panels the on-chip memory
/// holds, and the operands are read again for each block: at least `2·m·n·k / √S` elements
/// through an on-chip memory of `S` elements (Hong and Kung 1981, the I/O bound of matrix
/// multiplication), and never less than once each. A tall GEMM whose narrow operand stays
/// on chip reads its tall one once: its traffic grows as its rows do, and its row shards'
/// add up to it (and the narrow operand again per shard).
fn gemm_traffic(
    g: archplace_plugin_sdk::Gemm,
    element_bytes: f64,
    output_bytes: f64,
    buffer: f64,
) -> (f64, f64) {
    let (m, n, k) = (g.m as f64, g.n as f64, g.k as f64);
    let inputs = element_bytes * (m * k + k * n);
    let output = output_bytes * m * n;
    let blocked = element_bytes * 2.0 * m * n * k / (buffer / element_bytes).sqrt();
    let reads = if inputs + output <= buffer {
        inputs
    } else {
        inputs.max(blocked)
    };
    let batch = g.batch as f64;
    (batch * (reads + output), batch * (inputs + output))
}

#[cfg(test)]
mod tests {
    use super::*;
    use archplace_plugin_sdk::{Direction, Gemm};

    fn p(name: &str, value: &str) -> Parameter {
        Parameter {
            name: name.into(),
            value: value.into(),
        }
    }

    fn core(cores: u32, width: u32, buffer_bytes: u64) -> CoreConfig {
        CoreConfig {
            kind: CoreKind::Tensor,
            cores,
            width,
            depth: width,
            buffer_bytes,
        }
    }

    fn gemm(m: u64, n: u64, k: u64) -> Op {
        Op {
            kind: OpKind::Gemm(Gemm { batch: 1, m, n, k }),
            direction: Direction::Forward,
            fused: vec![],
            element: ElementType::Bf16,
        }
    }

    /// The H100 preset.
    fn h100_param() -> Parameter {
        p("preset", "h100-sxm-80gb")
    }

    /// The H100 preset and its tensor cores (132 SMs, 50 MiB of L2).
    fn h100_tensor_cores() -> (GpuLike, CoreConfig) {
        let h100 = GpuLike::with_parameters(&[h100_param()]).unwrap();
        let core = CoreConfig {
            kind: CoreKind::Tensor,
            cores: 132,
            width: 64,
            depth: 32,
            buffer_bytes: 50 << 20,
        };
        (h100, core)
    }

    /// A 16-bit fused attention operator: what the host asks `attention-detail` of.
    fn attention_op(a: archplace_plugin_sdk::Attention, direction: Direction) -> Op {
        Op {
            kind: OpKind::Attention(a),
            direction,
            fused: vec![],
            element: ElementType::Bf16,
        }
    }

    /// HBM traffic of a GEMM: its operands once when they fit on chip, else at best
    /// Hong and Kung's `2·m·n·k/√S` elements, never less than once each — so a tall GEMM
    /// (many tokens, a narrow weight) reads its operands once and its traffic grows as its
    /// rows: cut into row shards (PyTorch's async tensor parallelism), the shards move
    /// what the whole does plus the weight again per shard, not less.
    #[test]
    fn gemm_traffic_is_the_blocked_product_s_and_grows_as_its_rows() {
        let (h100, core) = h100_tensor_cores();
        let memory = |g: Op| h100.cost(&core, &g).unwrap().memory_seconds.unwrap();
        let bw = h100.sustained_hbm();
        let n = 16384.0f64;
        let elements = (50u64 << 20) as f64 / 2.0;
        let square = (2.0 * 2.0 * n * n * n / elements.sqrt() + 2.0 * n * n) / bw;
        let got = memory(gemm(16384, 16384, 16384));
        assert!((got / square - 1.0).abs() < 1e-12, "{got} {square}");
        let (m, n, k) = (131_072u64, 1280u64, 8192u64);
        let once = (2.0 * (m * k + k * n) as f64 + 2.0 * (m * n) as f64) / bw;
        let tall = memory(gemm(m, n, k));
        assert!((tall / once - 1.0).abs() < 1e-12, "{tall} {once}");
        let shards = 8.0 * memory(gemm(m / 8, n, k));
        let weight = 7.0 * 2.0 * (k * n) as f64 / bw;
        assert!(
            (shards - tall - weight).abs() < 1e-9 * tall,
            "{shards} {tall}"
        );
        // Small enough to stay on chip: each operand once.
        let small = memory(gemm(1024, 1024, 1024));
        assert!((small - 6.0 * 1024.0 * 1024.0 / bw).abs() < 1e-12 * small);
    }

    /// Each GEMM at its element type's rate (interface 1.2): on the H100 preset a large
    /// compute-bound GEMM in FP8 takes half its bf16 time (the datasheets' 1,979 over 989
    /// TFLOP/s dense), in fp32 (TF32) twice; MXFP8 only on Blackwell, FP8 not on the
    /// A100; the types listed follow. A cast moves its input once (twice with an amax
    /// pass) and both layouts of its output through HBM.
    #[test]
    fn gemms_run_at_their_element_types_rate_and_casts_are_memory_bound() {
        let (h100, core) = h100_tensor_cores();
        let big = gemm(16384, 16384, 16384);
        let t = |m: &GpuLike, e: ElementType| {
            m.cost(&core, &big.clone().with_element(e))
                .map(|c| c.seconds - m.launch_seconds)
        };
        let bf16 = t(&h100, ElementType::Bf16).unwrap();
        let fp8 = t(&h100, ElementType::Fp8).unwrap();
        let tf32 = t(&h100, ElementType::Fp32).unwrap();
        assert!((bf16 / fp8 - 1979.0 / 989.4).abs() < 0.01, "{bf16} {fp8}");
        assert!((tf32 / bf16 - 2.0).abs() < 0.01, "{tf32} {bf16}");
        assert!(matches!(
            t(&h100, ElementType::Mxfp8),
            Err(EstimateError::Unsupported(_))
        ));
        let types = |preset: &str| {
            GpuLike::with_parameters(&[p("preset", preset)])
                .unwrap()
                .tensor_element_types()
        };
        use ElementType::*;
        assert_eq!(types("a100-sxm-80gb"), [Fp32, Bf16, Fp16]);
        assert_eq!(types("h800-sxm-80gb"), [Fp32, Bf16, Fp16, Fp8]);
        assert_eq!(types("b200-sxm-180gb"), [Fp32, Bf16, Fp16, Fp8, Mxfp8]);
        let no_fp8 =
            GpuLike::with_parameters(&[p("preset", "h100-sxm-80gb"), p("fp8_speedup", "0")])
                .unwrap();
        assert_eq!(no_fp8.tensor_element_types(), [Fp32, Bf16, Fp16]);
        let b200 = GpuLike::with_parameters(&[p("preset", "b200-sxm-180gb")]).unwrap();
        let blackwell = CoreConfig {
            width: 64,
            depth: 64,
            cores: 148,
            ..core
        };
        let mx = b200
            .cost(&blackwell, &big.clone().with_element(Mxfp8))
            .unwrap();
        let b16 = b200.cost(&blackwell, &big).unwrap();
        assert!(mx.seconds < 0.55 * b16.seconds, "{mx:?} {b16:?}");
        // An MXFP8 GEMM runs at 95% of a per-tensor FP8 one's rate (the block scales):
        // Transformer Engine's profiling guide, 6.812 against 7.161 ms a layer on B300.
        // (At the preset's GEMM ceiling the B200's tiles are bound by the on-chip bandwidth
        // instead, where the scales' 1/32 more bytes are what MXFP8 costs: a ceiling that
        // leaves them compute-bound shows the rate.)
        let compute_bound = GpuLike::with_parameters(&[
            p("preset", "b200-sxm-180gb"),
            p("matrix_efficiency", "0.5"),
        ])
        .unwrap();
        let time = |e: ElementType| {
            compute_bound
                .cost(&blackwell, &big.clone().with_element(e))
                .unwrap()
                .seconds
                - compute_bound.launch_seconds
        };
        let ratio = time(Mxfp8) / time(Fp8);
        assert!((ratio - 7.161 / 6.812).abs() < 1e-9, "{ratio}");

        let vector = CoreConfig {
            kind: CoreKind::Vector,
            cores: 132,
            width: 128,
            depth: 1,
            buffer_bytes: 50 << 20,
        };
        for (amax_pass, to, bytes) in [(false, Fp8, 2.0 + 2.0), (true, Fp8, 4.0 + 2.0)] {
            let cast = Op::new(
                OpKind::Cast(archplace_plugin_sdk::Cast {
                    elements: 1 << 28,
                    to,
                    amax_pass,
                }),
                Direction::Backward,
            );
            let c = h100.cost(&vector, &cast).unwrap();
            let memory = bytes * (1u64 << 28) as f64 / h100.hbm_bytes_per_second;
            assert!((c.memory_seconds.unwrap() - memory).abs() < 1e-12 * memory.max(1.0));
            assert!((c.seconds - memory - h100.launch_seconds).abs() < 1e-9);
        }
        // Blackwell's FP8 GEMMs take every layout: a per-tensor FP8 cast writes one copy
        // (Hopper's two: the tensor and its transpose); MXFP8 keeps two (row- and
        // column-wise blocks) on any GPU.
        assert!(h100.fp8_transpose && !b200.fp8_transpose);
        let cast_to = |to| {
            Op::new(
                OpKind::Cast(archplace_plugin_sdk::Cast {
                    elements: 1 << 28,
                    to,
                    amax_pass: false,
                }),
                Direction::Forward,
            )
        };
        let vector_b200 = CoreConfig {
            cores: 148,
            ..vector
        };
        for (to, bytes) in [(Fp8, 2.0 + 1.0), (Mxfp8, 2.0 + 2.0 * 33.0 / 32.0)] {
            let c = b200.cost(&vector_b200, &cast_to(to)).unwrap();
            let memory = bytes * (1u64 << 28) as f64 / b200.hbm_bytes_per_second;
            assert!(
                (c.memory_seconds.unwrap() - memory).abs() < 1e-12 * memory.max(1.0),
                "{to:?}"
            );
        }
        let spelled =
            GpuLike::with_parameters(&[p("preset", "b200-sxm-180gb"), p("fp8_transpose", "true")])
                .unwrap();
        assert!(spelled.fp8_transpose);
    }

    /// `attention_kernel` takes the preset's measured kernel: cuDNN's by default on
    /// Hopper (0.54 of peak, 1.9 sweeps a tile), FlashAttention-2 when named (0.34, 3.8);
    /// a value the spec gives wins whatever the order; without a preset the kernels are
    /// not told apart; an unknown kernel is refused with the two it may be.
    #[test]
    fn the_attention_kernel_sets_its_measured_speed() {
        let kernel = |ps: &[(&str, &str)]| {
            let ps: Vec<Parameter> = ps.iter().map(|(n, v)| p(n, v)).collect();
            let m = GpuLike::with_parameters(&ps).unwrap();
            (m.attention_efficiency, m.attention_tile_overhead)
        };
        let h100 = ("preset", "h100-sxm-80gb");
        assert_eq!(kernel(&[h100]), (0.54, 1.9));
        assert_eq!(
            kernel(&[h100, ("attention_kernel", "default")]),
            (0.54, 1.9)
        );
        assert_eq!(
            kernel(&[("attention_kernel", "flash-attn-2"), h100]),
            (0.34, 3.8)
        );
        assert_eq!(
            kernel(&[
                ("attention_efficiency", "0.3"),
                ("attention_kernel", "flash-attn-2"),
                h100
            ]),
            (0.3, 3.8)
        );
        assert_eq!(kernel(&[("preset", "b200-sxm-180gb")]), (0.60, 11.5));
        assert_eq!(
            kernel(&[("preset", "gb200"), ("attention_kernel", "flash-attn-2")]),
            (0.18, 4.4)
        );
        assert_eq!(
            kernel(&[
                ("preset", "a100-sxm-80gb"),
                ("attention_kernel", "flash-attn-2")
            ]),
            kernel(&[("preset", "a100-sxm-80gb")])
        );
        assert_eq!(kernel(&[("attention_kernel", "flash-attn-2")]), (0.6, 1.9));
        let errors =
            GpuLike::with_parameters(&[h100_param(), p("attention_kernel", "fa3")]).unwrap_err();
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].name, "attention_kernel");
        assert!(
            errors[0].message.contains("flash-attn-2"),
            "{}",
            errors[0].message
        );
    }

    /// On an H100, FlashAttention-2 takes about 1.6 times cuDNN's time at 8,192 tokens —
    /// what the benchmark both come from measured (490 against 290 TFLOP/s): NeMo's
    /// launcher ran it until August 2024.
    #[test]
    fn flash_attention_2_on_hopper_is_cudnns_rate_times_six_tenths() {
        let (cudnn, core) = h100_tensor_cores();
        let fa2 = GpuLike::with_parameters(&[h100_param(), p("attention_kernel", "flash-attn-2")])
            .unwrap();
        let a = archplace_plugin_sdk::Attention {
            batch: 2,
            heads: 16,
            kv_heads: 16,
            seq: 8192,
            head_dim: 128,
            value_dim: 128,
            causal: true,
        };
        let time = |m: &GpuLike| -> f64 {
            [Direction::Forward, Direction::Backward]
                .into_iter()
                .map(|d| m.attention(&core, &[attention_op(a, d)]).unwrap()[0].seconds)
                .sum()
        };
        let ratio = time(&fa2) / time(&cudnn);
        assert!((ratio - 490.273 / 289.580).abs() < 0.06, "{ratio}");
    }

    /// `attention-detail` (what the host asks a fused kernel of) prices the kernel at
    /// `attention_efficiency` of peak (and a launch) — Llama-3-70B's at 8K tokens on one tensor-parallel
    /// rank of eight, compute-bound — far below its unfused operators, which move the
    /// `s × s` scores through memory.
    #[test]
    fn fused_attention_is_one_kernel_at_the_attention_efficiency() {
        let (m, h100) = h100_tensor_cores();
        for direction in [Direction::Forward, Direction::Backward] {
            let a = archplace_plugin_sdk::Attention {
                batch: 1,
                heads: 8,
                kv_heads: 1,
                seq: 8192,
                head_dim: 128,
                value_dim: 128,
                causal: true,
            };
            let op = attention_op(a, direction);
            let fused = m.attention(&h100, std::slice::from_ref(&op)).unwrap()[0];
            let peak = 2.0 * (132 * 64 * 32) as f64 * m.clock_hz;
            // 64 tiles of 128 queries, each sweeping up to its diagonal block (65/128 of
            // the unmasked products) and 1.9 blocks more; the kernel's launch besides.
            let unmasked = a.flops(direction) / a.computed_fraction();
            let want = unmasked * (65.0 / 128.0 + 1.9 / 64.0) / (peak * m.attention_efficiency)
                + m.launch_seconds;
            assert!(
                (fused.seconds - want).abs() / want < 1e-9,
                "{direction:?}: {} vs {want}",
                fused.seconds
            );
            let unfused =
                archplace_plugin_sdk::unfused_attention(&[op], |parts| m.latency(&h100, parts))
                    .unwrap()[0];
            assert!(unfused.seconds > 1.5 * fused.seconds, "{direction:?}");
        }
    }

    /// The per-tile overhead's default reproduces what it was read from: the forward
    /// kernels' TFLOP/s on H100 in pytorch/benchmark#2391 (head dimension 128, 16 heads,
    /// batch × sequence 16,384, not causal) — Triton's FlashAttention-2 and
    /// FlashAttention-3 at 512 to 16,384 tokens — each length's rate relative to the
    /// longest within 2%; and a causal kernel's rate rises with the sequence as the
    /// tiles' fixed work and their diagonal blocks weigh less.
    #[test]
    fn attention_runs_further_from_its_peak_the_shorter_the_sequence() {
        let (m, h100) = h100_tensor_cores();
        let rate = |seq: u64, causal: bool| {
            let a = archplace_plugin_sdk::Attention {
                batch: (16_384 / seq).max(1),
                heads: 16,
                kv_heads: 16,
                seq,
                head_dim: 128,
                value_dim: 128,
                causal,
            };
            let op = attention_op(a, Direction::Forward);
            let cost = m.latency(&h100, std::slice::from_ref(&op)).unwrap()[0];
            a.flops(Direction::Forward) / (cost.seconds - m.launch_seconds)
        };
        let published = [
            (512, 328.882, 430.32),
            (1024, 389.723, 517.099),
            (2048, 433.721, 565.544),
            (4096, 458.359, 590.233),
            (8192, 470.732, 614.234),
            (16_384, 476.753, 620.73),
        ];
        let longest = rate(16_384, false);
        for (seq, triton, fa3) in published {
            let ours = rate(seq, false) / longest;
            for (kernel, tflops, at_longest) in [("FA2", triton, 476.753), ("FA3", fa3, 620.73)] {
                let theirs = tflops / at_longest;
                assert!(
                    (ours / theirs - 1.0).abs() < 0.02,
                    "{kernel} at {seq}: {ours:.3} of the longest's rate, published {theirs:.3}"
                );
            }
        }
        let causal: Vec<f64> = [2048, 8192, 32_768].map(|s| rate(s, true)).into();
        assert!(causal.windows(2).all(|w| w[0] < w[1]), "{causal:?}");
        // 2,048 tokens: 16 tiles, 17/32 of the products swept and 1.9 of 16 blocks more;
        // 32,768: 256 tiles, nearly the inner loop's rate.
        let want = (257.0 / 512.0 + 1.9 / 256.0) / (17.0 / 32.0 + 1.9 / 16.0);
        assert!((causal[0] / causal[2] - want).abs() < 1e-3, "{causal:?}");
    }

    /// A head the kernel has no build for runs at the next width up: MPT-30B's 112-wide
    /// heads cost exactly what 128-wide ones do (forward and backward), 64, 96, 128 and 192
    /// run as they are, 200 as 256; the width of the values rounds on its own (MLA's
    /// 192-wide queries and keys with 128-wide values run as they are).
    #[test]
    fn attention_runs_its_heads_at_the_widths_the_kernel_is_built_for() {
        let (m, h100) = h100_tensor_cores();
        let seconds = |head_dim: u64, value_dim: u64, direction: Direction| {
            let a = archplace_plugin_sdk::Attention {
                batch: 1,
                heads: 64,
                kv_heads: 64,
                seq: 8192,
                head_dim,
                value_dim,
                causal: true,
            };
            let op = attention_op(a, direction);
            m.latency(&h100, std::slice::from_ref(&op)).unwrap()[0].seconds - m.launch_seconds
        };
        for direction in [Direction::Forward, Direction::Backward] {
            let (at_112, at_128) = (seconds(112, 112, direction), seconds(128, 128, direction));
            assert!((at_112 / at_128 - 1.0).abs() < 1e-12, "{direction:?}");
            let (at_96, at_64) = (seconds(96, 96, direction), seconds(64, 64, direction));
            assert!((at_96 / at_64 - 1.5).abs() < 1e-9, "{direction:?}");
            let at_192 = seconds(192, 192, direction);
            assert!((at_192 / at_64 - 3.0).abs() < 1e-9, "{direction:?}");
            let at_200 = seconds(200, 200, direction);
            assert!((at_200 / at_64 - 4.0).abs() < 1e-9, "{direction:?}");
            // Queries and keys 192 wide, values 128 (DeepSeek-V3's latent attention):
            // nothing rounds, so it costs what its products say.
            let mla = seconds(192, 128, direction);
            let (d, dv) = (192.0, 128.0);
            let per = |d: f64, dv: f64| match direction {
                Direction::Forward => d + dv,
                Direction::Backward => 3.0 * d + 2.0 * dv,
            };
            assert!(
                (mla / at_64 - per(d, dv) / per(64.0, 64.0)).abs() < 1e-9,
                "{direction:?}"
            );
        }
        assert_eq!(
            [32, 33, 64, 80, 96, 112, 128, 160, 176, 192, 200, 256].map(kernel_head_dim),
            [32, 64, 64, 96, 96, 128, 128, 160, 192, 192, 256, 256]
        );
    }

    #[test]
    fn parameters_are_parsed_and_every_bad_one_reported() {
        let m = GpuLike::with_parameters(&[
            p("clock", "2 GHz"),
            p("hbm_bandwidth", "3 TB/s"),
            p("launch_overhead", "2 us"),
        ])
        .unwrap();
        assert_eq!(m.clock_hz, 2e9);
        assert_eq!(m.hbm_bytes_per_second, 3e12);
        assert!((m.launch_seconds - 2e-6).abs() < 1e-18);
        let errs = GpuLike::with_parameters(&[
            p("clock", "fast"),
            p("matrix_efficiency", "1.5"),
            p("nodes", "7"),
        ])
        .unwrap_err();
        let names: Vec<&str> = errs.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["clock", "matrix_efficiency", "nodes"]);
        assert!(
            errs[2].message.contains("has no parameter `nodes`"),
            "{errs:?}"
        );
    }

    #[test]
    fn a_preset_sets_clock_and_hbm_and_parameters_override_it() {
        let m = GpuLike::with_parameters(&[p("preset", "h100-sxm-80gb")]).unwrap();
        assert_eq!((m.clock_hz, m.hbm_bytes_per_second), (1.83e9, 3.35e12));
        // Given before or after the preset, a parameter wins.
        let m =
            GpuLike::with_parameters(&[p("clock", "1 GHz"), p("preset", "a100-sxm-80gb")]).unwrap();
        assert_eq!((m.clock_hz, m.hbm_bytes_per_second), (1e9, 2.039e12));
        let errs = GpuLike::with_parameters(&[p("preset", "v100")]).unwrap_err();
        assert!(errs[0].message.contains("a100-sxm-80gb"), "{errs:?}");
    }

    #[test]
    fn a_gemm_is_compute_bound_when_large_and_launch_bound_when_tiny() {
        let m = GpuLike::default();
        let big = m
            .cost(&core(4, 128, 64 << 20), &gemm(8192, 8192, 8192))
            .unwrap();
        let peak = 2.0 * 4.0 * 128.0 * 128.0 * 1.4e9 * 0.75;
        let ideal = 2.0 * 8192f64.powi(3) / peak;
        assert!(
            (big.seconds - m.launch_seconds) / ideal < 1.05,
            "{} vs {ideal}",
            big.seconds
        );
        let tiny = m.cost(&core(4, 128, 64 << 20), &gemm(8, 8, 8)).unwrap();
        assert!(tiny.seconds < 1.01 * m.launch_seconds + 1e-9);
        // More cores: faster, until quantisation.
        let two = m
            .cost(&core(2, 128, 64 << 20), &gemm(8192, 8192, 8192))
            .unwrap();
        assert!(two.seconds > 1.9 * (big.seconds - m.launch_seconds));
    }

    /// The GPU preset's tile arithmetic, worked by hand on 108 SMs of 32 × 32 MACs at
    /// 1.41 GHz (one SM: 2,048 flops per clock at 85.9%) with 5,120 bytes of L2 per clock
    /// shared by them: a 6912 × 16384 output (the measured best shape) is 3,456 tiles of 256 × 128,
    /// 32 full waves — exactly the ceiling; a 2048 × 2304 output is 144 such tiles, two
    /// waves for 1.33 of work, but 288 tiles of 128 × 128 fill three waves (2.67 for
    /// 2.67) and win; 64 × 64 tiles are bound by the L2.
    #[test]
    fn the_best_tile_is_chosen_per_gemm() {
        let m = GpuLike::with_parameters(&[p("preset", "a100-sxm-80gb")]).unwrap();
        assert!((m.matrix_efficiency - 267.9 / 312.0).abs() < 1e-12);
        assert!(m.gemm_tiles.contains(&(256, 128)));
        let a100 = CoreConfig {
            kind: CoreKind::Tensor,
            cores: 108,
            width: 32,
            depth: 32,
            buffer_bytes: 40 << 20,
        };
        let g = |m, n, k| Gemm { batch: 1, m, n, k };
        let sm_flops = 2.0 * 1024.0 * 1.41e9 * m.matrix_efficiency;
        let ideal = |g: Gemm| g.flops() / (108.0 * sm_flops);
        let best = g(6912, 16384, 2048);
        assert!((m.matrix_seconds(&a100, best) / ideal(best) - 1.0).abs() < 1e-12);
        // 2048 × 2304: 128 × 128 tiles (16 × 18 = 288, three waves of 108) beat 256 × 128
        // (144 tiles: two waves for 144/108 of work).
        let qkv = g(2048, 2304, 6144);
        let tile_128 = 3.0 * 2.0 * 128.0 * 128.0 * 6144.0 / sm_flops;
        let got = m.matrix_seconds(&a100, qkv);
        assert!(
            (got - tile_128).abs() < 1e-12 * tile_128,
            "{got} vs {tile_128}"
        );
        // Only 64 × 64 tiles: each re-reads (64 + 64) × k operands through 1/108 of the L2
        // bandwidth, slower than its share of the peak.
        let small = GpuLike {
            gemm_tiles: vec![(64, 64)],
            ..m.clone()
        };
        let l2 = 2.0 * 128.0 * 6144.0 / (5120.0 * 1.41e9 / 108.0);
        let waves = (32.0f64 * 36.0 / 108.0).ceil();
        let s = small.matrix_seconds(&a100, qkv);
        assert!((s - waves * l2).abs() < 1e-12 * s, "{s}");
        assert!(GpuLike::with_parameters(&[p("gemm_tiles", "256x0")]).is_err());
        let core_tile = GpuLike::with_parameters(&[p("gemm_tiles", "core")]).unwrap();
        assert!(core_tile.gemm_tiles.is_empty());
    }

    #[test]
    fn area_grows_with_the_chip_and_has_a_reticle() {
        let m = GpuLike::default();
        let c = |t, w, b| AcceleratorConfig {
            tensor_cores: t,
            vector_cores: 4,
            width: w,
            depth: w,
            vector_width: 128,
            buffer_bytes: b,
        };
        let small = m.area(&c(1, 64, 8 << 20)).unwrap();
        let large = m.area(&c(8, 128, 64 << 20)).unwrap();
        assert!(small < large);
        assert!(matches!(
            m.area(&c(256, 256, 1 << 30)),
            Err(EstimateError::OutOfDomain(_))
        ));
    }
}
