//! Datasheet figures of the GPUs archplace has presets for, shared by the spec language
//! (`[accelerator] preset`, `[cluster] preset`) and the `gpu-like` example plugin
//! (`preset` parameter), so that both describe the same chip.
//!
//! Sources (every figure is the vendor's; nothing here is fitted to training runs):
//! * A100: NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020): 108 SMs, 1,024 dense
//!   FP16/BF16 FMA per SM per clock, 1,410 MHz boost, 312 TFLOP/s dense FP16/BF16, 40 MB L2
//!   read at 5,120 bytes per clock (7.2 TB/s);
//!   NVIDIA A100 80GB datasheet (2021): SXM4 80 GB HBM2e at 2,039 GB/s, NVLink 600 GB/s;
//!   NVIDIA DGX A100 user guide: 8 GPUs per node, one 200 Gb/s HDR InfiniBand adapter per GPU.
//! * H100: NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022): SXM5 with 132 SMs,
//!   2,048 dense FP16/BF16 FMA per SM per clock, 50 MB L2; NVIDIA H100 datasheet (2023):
//!   SXM 80 GB HBM3 at 3.35 TB/s, 989 TFLOP/s dense BF16 (1,979 with sparsity), NVLink
//!   900 GB/s; NVIDIA DGX H100 user guide: 8 GPUs per node, one 400 Gb/s NDR InfiniBand
//!   adapter per GPU. Its clock is the one that gives the datasheet's peak:
//!   989.4 TFLOP/s / (2 × 132 × 2,048) = 1.83 GHz. FP8: 3,958 TFLOP/s with sparsity, 1,979
//!   dense (the datasheet's footnote: its sparse figures are twice the dense ones).
//! * H200: NVIDIA H200 Tensor Core GPU datasheet (2024): the H100's GH100 die and compute
//!   (FP8 3,958 and BF16 1,979 TFLOP/s with sparsity: 1,979 and 989 dense), 141 GB of HBM3e
//!   at 4.8 TB/s, NVLink 900 GB/s; NVIDIA DGX H200 datasheet: 8 GPUs per node, eight 400
//!   Gb/s ConnectX-7 adapters (one per GPU). SMs, MAC arrays, L2 and clock are the H100's.
//! * H800: the H100 SXM with NVLink cut to 400 GB/s (NVIDIA's export variant, 2023; the
//!   die, compute and 80 GB of HBM3 at 3.35 TB/s as the H100's); the node as DeepSeek-AI
//!   2024 describe theirs (DeepSeek-V3 technical report, §3.1 and §3.2.2): 8 GPUs on
//!   NVLink/NVSwitch, InfiniBand at 50 GB/s per GPU, NVLink achieving 160 GB/s — 0.8 of the
//!   200 GB/s a GPU sends.
//! * B200: NVIDIA HGX B200 specifications (2024), per GPU of the 8: dense FP16/BF16 2.25,
//!   FP8 4.5, FP4 9 PFLOP/s (the sheet's 36, 72 and 144 PFLOP/s for eight with sparsity,
//!   halved); NVIDIA DGX B200 datasheet: 1,440 GB of HBM3e at 64 TB/s for eight (180 GB at
//!   8 TB/s each), fifth-generation NVLink at 1.8 TB/s per GPU (14.4 TB/s for eight), eight
//!   400 Gb/s ConnectX-7 adapters. Measured, not datasheet (Chips and Cheese, "Nvidia's
//!   B200: Keeping the CUDA Juggernaut Rolling", 2025): 148 SMs (74 enabled on each of two
//!   dies), 126 MB of L2, clocks near the H100 SXM's; 128 FP32 lanes per SM, Hopper's
//!   (assumed: not published for the B200). The SM's MAC array is then 64 × 64 (twice Hopper's
//!   64 × 32 per SM: 4,096 dense 16-bit FMA per clock give the datasheet's peak at 2.25
//!   PFLOP/s / (2 × 148 × 4,096) = 1.856 GHz, near the H100's 1.83).
//! * GB200: NVIDIA GB200 NVL72 specifications (2024), per GPU of the 72: dense FP16/BF16
//!   2.5, FP8 5, FP4 10 PFLOP/s (the rack's 360, 720 and 1,440 PFLOP/s with sparsity,
//!   halved), 13.4 TB of HBM3e at 576 TB/s (186 GB at 8 TB/s each), NVLink 130 TB/s (1.8 TB/s
//!   each) across all 72 GPUs: one NVLink domain; NVIDIA's DGX GB200 user guide and
//!   multi-node NVLink tuning guide: compute trays of 4 GPUs with ConnectX-7 adapters (400
//!   Gb/s per GPU) for InfiniBand between racks. The B200 die at the clock that gives the
//!   higher power budget's peak: 2.5 PFLOP/s / (2 × 148 × 4,096) = 2.06 GHz.
//! * Host links (activation offloading): PCIe 4.0 x16 on DGX A100, PCIe 5.0 x16 on DGX
//!   H100, H200 and B200 (the line rate less 128b/130b encoding: 31.5 and 63 GB/s each
//!   way); on GB200 each GPU's NVLink-C2C link to its Grace CPU, 900 GB/s both ways
//!   (NVIDIA GB200 NVL72 specifications; Transformer Engine's CPU-offloading guide, which
//!   contrasts it with PCIe 5.0's 128 GB/s both ways).
//! * No measured Blackwell GEMM fraction or NVLink 5 collective share is cited: the
//!   Blackwell presets take the H100's (80.1%, 0.82), an assumption each.
//!
//! Measured, not datasheet (each is a single-GPU microbenchmark, nothing end-to-end):
//! * The largest fraction of peak a 16-bit GEMM reaches: S. Bekman, "Machine Learning
//!   Engineering", compute/accelerator, "Maximum Achievable Matmul FLOPS comparison table"
//!   (bf16 `matmul`, best shape found by `mamf-finder.py`): A100 SXM 267.9 of 312 TFLOP/s
//!   (85.9%, CUDA 12.1), H100 SXM 792.1 of 989 TFLOP/s (80.1%, CUDA 12.1).
//! * The HBM bandwidth a streaming kernel sustains on A100 SXM4 80GB: 1.80 of 2.039 TB/s
//!   (88%, confirmed by Nsight Compute; NVIDIA developer forums, "Trouble to Reach Peak
//!   Bandwidth of A100", 2025, which also cites a GTC talk where no kernel exceeded ~90%).
//!   No such figure is cited for H100 here.
//! * The share of the NVLink line rate an NCCL collective achieves: A100, ~200 of 300 GB/s
//!   bus bandwidth for an 8-GPU all-reduce on an HGX A100 80GB board (NVIDIA/nccl-tests
//!   issue #149, NCCL 2.18); H100, 370 of 450 GB/s ("with the protocol overhead (~20%)
//!   NCCL can get an effective NVLink bandwidth of 370GB/s", the NCCL maintainer in
//!   NVIDIA/nccl-tests issue #212). No InfiniBand figure is cited: that tier stays at its
//!   line rate.
//! * The output tiles one SM computes per wave: cuBLAS's tile sizes for 16-bit GEMMs,
//!   256 × 128 the largest and most efficient, down to 64 × 64 (NVIDIA, "Matrix
//!   Multiplication Background User's Guide", DU-09799-001, 2023, §2.3 "Typical Tile
//!   Dimensions in cuBLAS and Performance" and §3 "Dimension Quantization Effects"): a
//!   GEMM's tiles run in waves of one tile per SM, so a GEMM whose tiles do not fill the
//!   last wave, or whose sides are not multiples of the tile, wastes the difference.
//! * The fused attention kernels' speed ([`AttentionKernel`]): cudnn-frontend's attention
//!   benchmarks (github.com/NVIDIA/cudnn-frontend), forward and backward TFLOP/s of causal
//!   attention with 128-wide heads at 4,096 to 32,768 tokens (a causal mask's FLOPs
//!   counted half, backward 2.5 times forward), each kernel's inner-loop fraction of the
//!   preset's dense 16-bit peak and fixed work per tile of 128 queries fitted to its
//!   combined forward and backward rate (within 3% at every length):
//!   H200 at 1,980 MHz, cuDNN 9.1.0 against PyTorch 2.3's SDPA FlashAttention-2
//!   (`benchmark/benchmark_results.csv`, commit b740542, 2024-05): cuDNN 468 → 520,
//!   FlashAttention-2 264 → 325 TFLOP/s from 4K to 32K tokens, 0.54 with 1.9 sweeps a tile
//!   and 0.34 with 3.8 — the Hopper presets'; B200, cuDNN 9.10.2 against
//!   flash-attn 2.7.3 (`benchmark/sdpa_benchmark_bf16_training/artifacts/`, commit
//!   f937055, 2025-06): cuDNN 754 → 1,206, FlashAttention-2 305 → 382 TFLOP/s, 0.60 with
//!   11.5 and 0.18 with 4.4 — the Blackwell presets' (FlashAttention-2 runs Ampere's
//!   instructions there). The A100's is FlashAttention-2 at 0.6 with 1.9, within the
//!   50–73% of peak its paper measured forward (Dao 2023, §4.1): what the A100's stacks
//!   run (Transformer Engine prefers cuDNN's kernel only from sm90), no separate cuDNN
//!   figure.
//!
//! NVLink figures are both directions together; a device sends half of it. The tensor
//! cores of an SM are described as one `width × depth` MAC array per SM (the archplace
//! accelerator template), with `width × depth` = the SM's FMA per clock.

/// One GPU as archplace describes it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gpu {
    pub name: &'static str,
    pub streaming_multiprocessors: u32,
    /// The SM's tensor cores as one MAC array: `mac_width × mac_depth` dense 16-bit FMA
    /// per clock.
    pub mac_width: u32,
    pub mac_depth: u32,
    /// FP32 lanes per SM (the vector units).
    pub fp32_lanes_per_sm: u32,
    pub clock_hz: f64,
    pub peak_dense_16bit_flops_per_second: f64,
    /// Dense FP8 tensor-core peak where the chip has FP8 (half the datasheets' figure with
    /// 2:4 sparsity).
    pub peak_dense_fp8_flops_per_second: Option<f64>,
    /// Dense FP4 tensor-core peak where the chip has FP4 (Blackwell).
    pub peak_dense_fp4_flops_per_second: Option<f64>,
    /// The tensor cores take block-scaled (OCP Microscaling) formats, MXFP8 among them,
    /// at the FP8 rate: Blackwell's fifth-generation tensor cores (NVIDIA Blackwell
    /// architecture technical brief, 2024); Hopper's take per-tensor-scaled FP8 only.
    pub mx_formats: bool,
    /// The FP8 GEMMs take their operands in every layout, not only "TN" (both with the
    /// reduction dimension contiguous): Blackwell's do, Hopper's do not (cuBLASLt's FP8
    /// layout rules; Transformer Engine's `is_non_tn_fp8_gemm_supported`, compute
    /// capability 10.x). Without it a per-tensor-scaled FP8 tensor that both passes
    /// multiply is kept twice, as is and transposed.
    pub non_tn_fp8_gemms: bool,
    pub l2_bytes: u64,
    pub hbm_bytes: u64,
    pub hbm_bytes_per_second: f64,
    /// NVLink per GPU, one direction.
    pub nvlink_bytes_per_second: f64,
    /// InfiniBand per GPU (one adapter each), one direction.
    pub infiniband_bytes_per_second: f64,
    /// The GPU's link to its host's memory, one direction: what activation offloading
    /// moves activations over (PCIe x16 on DGX nodes, NVLink-C2C on Grace superchips).
    pub host_link_bytes_per_second: f64,
    /// The share of the NVLink bandwidth an NCCL collective achieves (bus bandwidth over
    /// line rate), measured.
    pub nvlink_collective_fraction: f64,
    /// GPUs per node (DGX).
    pub node_size: u64,
    /// L2 read bandwidth, where the vendor publishes it.
    pub l2_bytes_per_second: Option<f64>,
    /// The fraction of the HBM bandwidth a measured streaming kernel sustains, where one is
    /// published.
    pub max_memory_fraction: Option<f64>,
    /// The largest fraction of the dense 16-bit peak a measured GEMM reaches.
    pub max_matmul_fraction: f64,
    /// The output tiles (rows × columns, either way round) one SM may compute per wave.
    pub gemm_tiles: &'static [(u32, u32)],
    /// The fused attention kernel the GPU's training stacks pick by default: cuDNN's
    /// (Transformer Engine's `FusedAttention`, preferred on sm90 and later) on Hopper and
    /// Blackwell, FlashAttention-2 on Ampere.
    pub default_attention: AttentionKernel,
    /// Tri Dao's FlashAttention-2 (the `flash-attn` package; PyTorch's SDPA flash backend),
    /// what a stack that turns cuDNN's kernel off runs instead.
    pub flash_attention_2: AttentionKernel,
}

/// A fused attention kernel's speed on one GPU, measured (the sources above): the
/// fraction of the dense 16-bit peak its inner loop reaches, and its fixed work per tile
/// of 128 queries in sweeps of one block of 128 keys — how far a short sequence falls
/// from the long ones' rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionKernel {
    pub peak_fraction: f64,
    pub tile_overhead: f64,
}

/// FlashAttention-2 on A100 (its paper's forward range) — the A100's default too.
const FLASH_ATTENTION_2_AMPERE: AttentionKernel = AttentionKernel {
    peak_fraction: 0.6,
    tile_overhead: 1.9,
};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// PCIe 4.0 x16, one direction: 16 GT/s × 16 lanes, 128b/130b encoding (DGX A100's GPUs
/// hang off PCIe 4.0 switches).
const PCIE4_X16: f64 = 16e9 * 16.0 * 128.0 / 130.0 / 8.0;
/// PCIe 5.0 x16, one direction (32 GT/s): DGX H100, H200 and B200 (Transformer Engine's
/// CPU-offloading guide: "128 GB/s bidirectional").
const PCIE5_X16: f64 = 2.0 * PCIE4_X16;

/// cuBLAS's tile sizes for 16-bit GEMMs (the NVIDIA guide above, §2.3), each either way
/// round.
const CUBLAS_TILES: &[(u32, u32)] = &[(256, 128), (128, 128), (256, 64), (128, 64), (64, 64)];

/// The presets, by name.
pub const GPUS: [Gpu; 6] = [A100, H100, H200, H800, B200, GB200];

const A100: Gpu = Gpu {
    name: "a100-sxm-80gb",
    streaming_multiprocessors: 108,
    mac_width: 32,
    mac_depth: 32,
    fp32_lanes_per_sm: 64,
    clock_hz: 1.41e9,
    peak_dense_16bit_flops_per_second: 312e12,
    peak_dense_fp8_flops_per_second: None,
    peak_dense_fp4_flops_per_second: None,
    mx_formats: false,
    non_tn_fp8_gemms: false,
    l2_bytes: 40 * MIB,
    hbm_bytes: 80 * GIB,
    hbm_bytes_per_second: 2.039e12,
    nvlink_bytes_per_second: 300e9,
    infiniband_bytes_per_second: 25e9,
    host_link_bytes_per_second: PCIE4_X16,
    nvlink_collective_fraction: 200.0 / 300.0,
    node_size: 8,
    l2_bytes_per_second: Some(5120.0 * 1.41e9),
    max_memory_fraction: Some(1.80 / 2.039),
    max_matmul_fraction: 267.9 / 312.0,
    gemm_tiles: CUBLAS_TILES,
    default_attention: FLASH_ATTENTION_2_AMPERE,
    flash_attention_2: FLASH_ATTENTION_2_AMPERE,
};

const H100: Gpu = Gpu {
    name: "h100-sxm-80gb",
    streaming_multiprocessors: 132,
    mac_width: 64,
    mac_depth: 32,
    fp32_lanes_per_sm: 128,
    clock_hz: 1.83e9,
    peak_dense_16bit_flops_per_second: 989.4e12,
    peak_dense_fp8_flops_per_second: Some(1979e12),
    peak_dense_fp4_flops_per_second: None,
    mx_formats: false,
    non_tn_fp8_gemms: false,
    l2_bytes: 50 * MIB,
    hbm_bytes: 80 * GIB,
    hbm_bytes_per_second: 3.35e12,
    nvlink_bytes_per_second: 450e9,
    infiniband_bytes_per_second: 50e9,
    host_link_bytes_per_second: PCIE5_X16,
    nvlink_collective_fraction: 370.0 / 450.0,
    node_size: 8,
    // The H100 whitepaper gives no L2 bandwidth figure.
    l2_bytes_per_second: None,
    max_memory_fraction: None,
    max_matmul_fraction: 792.1 / 989.0,
    gemm_tiles: CUBLAS_TILES,
    default_attention: AttentionKernel {
        peak_fraction: 0.54,
        tile_overhead: 1.9,
    },
    flash_attention_2: AttentionKernel {
        peak_fraction: 0.34,
        tile_overhead: 3.8,
    },
};

/// The H100's die with more and faster HBM; its GEMM fraction is the H100's measured one
/// (no H200 figure is cited; the memory does not change a compute-bound GEMM), its HBM
/// streaming fraction is not known.
const H200: Gpu = Gpu {
    name: "h200-sxm-141gb",
    // As the other presets, the datasheet's GB read as GiB (an H100 reports 81,559 MiB of
    // its "80 GB").
    hbm_bytes: 141 * GIB,
    hbm_bytes_per_second: 4.8e12,
    ..H100
};

/// The H100 with a narrower NVLink and DeepSeek's measured share of it.
const H800: Gpu = Gpu {
    name: "h800-sxm-80gb",
    nvlink_bytes_per_second: 200e9,
    nvlink_collective_fraction: 160.0 / 200.0,
    ..H100
};

/// The HGX/DGX B200 (1,000 W): two dies of 74 SMs, each SM's tensor cores 4,096 dense
/// 16-bit FMA per clock.
const B200: Gpu = Gpu {
    name: "b200-sxm-180gb",
    streaming_multiprocessors: 148,
    mac_width: 64,
    mac_depth: 64,
    fp32_lanes_per_sm: 128,
    clock_hz: 2.25e15 / (2.0 * 148.0 * 4096.0),
    peak_dense_16bit_flops_per_second: 2.25e15,
    peak_dense_fp8_flops_per_second: Some(4.5e15),
    peak_dense_fp4_flops_per_second: Some(9e15),
    mx_formats: true,
    non_tn_fp8_gemms: true,
    l2_bytes: 126 * MIB,
    hbm_bytes: 180 * GIB,
    hbm_bytes_per_second: 8e12,
    nvlink_bytes_per_second: 900e9,
    infiniband_bytes_per_second: 50e9,
    node_size: 8,
    l2_bytes_per_second: None,
    max_memory_fraction: None,
    default_attention: AttentionKernel {
        peak_fraction: 0.60,
        tile_overhead: 11.5,
    },
    flash_attention_2: AttentionKernel {
        peak_fraction: 0.18,
        tile_overhead: 4.4,
    },
    ..H100
};

/// A GB200 NVL72's GPU (1,200 W): the B200 die at a higher clock, 72 on one NVLink
/// domain.
const GB200: Gpu = Gpu {
    name: "gb200",
    clock_hz: 2.5e15 / (2.0 * 148.0 * 4096.0),
    peak_dense_16bit_flops_per_second: 2.5e15,
    peak_dense_fp8_flops_per_second: Some(5e15),
    peak_dense_fp4_flops_per_second: Some(10e15),
    hbm_bytes: 186 * GIB,
    node_size: 72,
    // Each GPU's own NVLink-C2C link to the Grace CPU: 900 GB/s both ways.
    host_link_bytes_per_second: 450e9,
    ..B200
};

/// Cluster presets that are not a GPU's name: a system named by its NVLink domain.
const SYSTEMS: [(&str, &str); 1] = [("gb200-nvl72", "gb200")];

/// The GPU of the cluster preset `name`: a GPU's name (nodes of its `node_size`, DGX-style)
/// or a system's (`gb200-nvl72`: GB200s, 72 to an NVLink domain).
pub fn system(name: &str) -> Option<&'static Gpu> {
    let gpu_name = SYSTEMS
        .iter()
        .find(|(system, _)| *system == name)
        .map_or(name, |(_, gpu_name)| gpu_name);
    gpu(gpu_name)
}

/// The cluster preset names, for messages and the schema.
pub fn system_names() -> Vec<&'static str> {
    GPUS.iter()
        .map(|g| g.name)
        .chain(SYSTEMS.iter().map(|(s, _)| *s))
        .collect()
}

/// The preset called `name`.
pub fn gpu(name: &str) -> Option<&'static Gpu> {
    GPUS.iter().find(|g| g.name == name)
}

/// The preset names, for messages.
pub fn names() -> String {
    GPUS.iter().map(|g| g.name).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The MAC arrays, SM counts and clocks give the datasheets' peaks (within 0.2%).
    #[test]
    fn the_template_reproduces_the_datasheet_peaks() {
        for g in GPUS {
            let peak = 2.0
                * f64::from(g.streaming_multiprocessors)
                * f64::from(g.mac_width * g.mac_depth)
                * g.clock_hz;
            let rel = (peak - g.peak_dense_16bit_flops_per_second).abs()
                / g.peak_dense_16bit_flops_per_second;
            assert!(rel < 0.002, "{}: {peak:e}", g.name);
        }
        assert!(gpu("a100-sxm-80gb").is_some() && gpu("v100").is_none());
    }

    /// The Hopper variants differ from the H100 only where their datasheets do: the H200 in
    /// its HBM (141 GB at 4.8 TB/s), the H800 in its NVLink (400 GB/s both ways) and the
    /// share of it DeepSeek measured (160 GB/s); FP8 runs at twice the 16-bit rate (the
    /// datasheets' 3,958 TFLOP/s with sparsity, 1,979 dense).
    #[test]
    fn hopper_variants_differ_where_their_datasheets_do() {
        let h100 = gpu("h100-sxm-80gb").unwrap();
        let h200 = gpu("h200-sxm-141gb").unwrap();
        let h800 = gpu("h800-sxm-80gb").unwrap();
        assert_eq!(
            (h200.hbm_bytes, h200.hbm_bytes_per_second),
            (141 * GIB, 4.8e12)
        );
        assert_eq!(
            Gpu {
                name: h100.name,
                hbm_bytes: h100.hbm_bytes,
                hbm_bytes_per_second: h100.hbm_bytes_per_second,
                ..*h200
            },
            *h100
        );
        assert_eq!(2.0 * h800.nvlink_bytes_per_second, 400e9);
        assert_eq!(
            h800.nvlink_bytes_per_second * h800.nvlink_collective_fraction,
            160e9
        );
        assert_eq!(h800.hbm_bytes, h100.hbm_bytes);
        for g in [h100, h200, h800] {
            let fp8 = g.peak_dense_fp8_flops_per_second.unwrap();
            assert_eq!(fp8, 1979e12);
            assert!((fp8 / g.peak_dense_16bit_flops_per_second - 2.0).abs() < 0.001);
        }
        assert!(
            gpu("a100-sxm-80gb")
                .unwrap()
                .peak_dense_fp8_flops_per_second
                .is_none()
        );
    }

    /// The Blackwell presets: the datasheets' dense peaks (half their sparse figures) per
    /// GPU, their HBM, NVLink 5 at 900 GB/s each way, and the GB200's 72-GPU NVLink
    /// domain, reached by its system name too.
    #[test]
    fn blackwell_presets_hold_their_datasheet_figures() {
        let b200 = gpu("b200-sxm-180gb").unwrap();
        let gb200 = gpu("gb200").unwrap();
        for (g, bf16, sparse_fp8) in [(b200, 2.25e15, 72e15 / 8.0), (gb200, 2.5e15, 720e15 / 72.0)]
        {
            assert_eq!(g.peak_dense_16bit_flops_per_second, bf16);
            assert_eq!(g.peak_dense_fp8_flops_per_second, Some(sparse_fp8 / 2.0));
            assert_eq!(g.peak_dense_fp4_flops_per_second, Some(4.0 * bf16));
            assert_eq!(g.streaming_multiprocessors, 148);
            assert_eq!(g.nvlink_bytes_per_second, 900e9);
            assert_eq!(g.hbm_bytes_per_second, 8e12);
        }
        assert_eq!((b200.hbm_bytes, b200.node_size), (180 * GIB, 8));
        assert_eq!((gb200.hbm_bytes, gb200.node_size), (186 * GIB, 72));
        assert_eq!(system("gb200-nvl72"), Some(gb200));
        assert_eq!(system("h100-sxm-80gb"), gpu("h100-sxm-80gb"));
        assert!(system("nvl72").is_none());
        assert!(system_names().contains(&"gb200-nvl72"));
    }

    /// Each preset's attention kernels reproduce the benchmark they were taken from: the
    /// combined forward and backward rate of causal attention (128-wide heads; FLOPs of the
    /// masked half not counted, backward 2.5 times forward) as `gpu-like` prices it — tiles
    /// of 128 queries sweeping their keys up to the diagonal block, plus the kernel's fixed
    /// sweeps per tile, at its fraction of the peak — within 3.5% from 4K to 32K tokens.
    #[test]
    fn attention_kernels_reproduce_their_benchmarks() {
        let rate = |g: &Gpu, k: AttentionKernel, seq: f64| {
            let blocks = seq / 128.0;
            g.peak_dense_16bit_flops_per_second * k.peak_fraction * 0.5
                / ((blocks + 1.0) / (2.0 * blocks) + k.tile_overhead / blocks)
        };
        // (forward, backward) TFLOP/s → combined.
        let both = |f: f64, b: f64| 3.5 / (1.0 / f + 2.5 / b);
        let h200 = gpu("h200-sxm-141gb").unwrap();
        let b200 = gpu("b200-sxm-180gb").unwrap();
        // cudnn-frontend b740542 (H200, cuDNN 9.1.0; combined rates as published).
        let hopper_cudnn = [
            (4096.0, 467.939),
            (8192.0, 490.273),
            (16384.0, 520.258),
            (32768.0, 519.641),
        ];
        let hopper_fa2 = [
            (4096.0, 264.475),
            (8192.0, 289.580),
            (16384.0, 310.532),
            (32768.0, 324.813),
        ];
        // cudnn-frontend f937055 (B200, cuDNN 9.10.2 and flash-attn 2.7.3; forward, backward).
        let blackwell_cudnn = [
            (4096.0, both(897.309, 709.138)),
            (8192.0, both(1211.140, 945.440)),
            (16384.0, both(1358.566, 1074.499)),
            (32768.0, both(1435.072, 1132.387)),
        ];
        let blackwell_fa2 = [
            (4096.0, both(347.732, 291.053)),
            (8192.0, both(403.305, 335.386)),
            (16384.0, both(428.611, 354.678)),
            (32768.0, both(438.873, 363.713)),
        ];
        for (g, k, table) in [
            (h200, h200.default_attention, &hopper_cudnn),
            (h200, h200.flash_attention_2, &hopper_fa2),
            (b200, b200.default_attention, &blackwell_cudnn),
            (b200, b200.flash_attention_2, &blackwell_fa2),
        ] {
            for &(seq, measured) in table {
                let modelled = rate(g, k, seq) / 1e12;
                assert!(
                    (modelled / measured - 1.0).abs() < 0.035,
                    "{} at {seq}: {modelled:.0} against {measured:.0} TFLOP/s",
                    g.name
                );
            }
        }
        // The Hopper variants share the die's kernels, the GB200 the B200's; on the A100
        // FlashAttention-2 is the default.
        for name in ["h100-sxm-80gb", "h800-sxm-80gb"] {
            let g = gpu(name).unwrap();
            assert_eq!(
                (g.default_attention, g.flash_attention_2),
                (h200.default_attention, h200.flash_attention_2)
            );
        }
        let gb200 = gpu("gb200").unwrap();
        assert_eq!(gb200.default_attention, b200.default_attention);
        let a100 = gpu("a100-sxm-80gb").unwrap();
        assert_eq!(a100.default_attention, a100.flash_attention_2);
    }
}
