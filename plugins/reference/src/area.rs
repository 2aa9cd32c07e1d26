//! Silicon area of an accelerator (the reference's 22 nm model, `docs/reference.md` §1.2).
//!
//! The reference system runs Accelergy with 22 nm table plug-ins and CACTI. Its result is
//! reproduced exactly by a closed form: per-MAC (or per-lane) area including its register
//! file, plus a PE buffer per core whose area depends only on its size, plus one global
//! buffer. The PE buffer holds `max(1 KiB, 16 · width · depth)` bytes.

use archplace_plugin_sdk::{AcceleratorConfig, EstimateError};

/// Area of one tensor-core MAC with its 16-entry × 16-bit register file, µm².
pub const TENSOR_MAC_UM2: f64 = 760.041_386_01;
/// Area of one vector-core lane with its 6-entry × 16-bit register file, µm².
pub const VECTOR_LANE_UM2: f64 = 759.823_853_00;

/// PE-buffer SRAM area by size: (bytes, µm²), 1 KiB … 1 MiB.
const PE_BUFFER_UM2: [(u64, f64); 11] = [
    (1 << 10, 6133.98),
    (2 << 10, 8248.43),
    (4 << 10, 12610.5),
    (8 << 10, 22139.9),
    (16 << 10, 38583.0),
    (32 << 10, 63338.4),
    (64 << 10, 115579.0),
    (128 << 10, 204764.0),
    (256 << 10, 446565.0),
    (512 << 10, 897890.0),
    (1 << 20, 1634130.0),
];

/// Global-buffer SRAM area by size: (bytes, µm²), 2 MiB … 128 MiB.
const GLOBAL_BUFFER_UM2: [(u64, f64); 7] = [
    (2 << 20, 3_338_220.0),
    (4 << 20, 6_078_640.0),
    (8 << 20, 11_952_400.0),
    (16 << 20, 23_745_200.0),
    (32 << 20, 46_750_900.0),
    (64 << 20, 88_605_700.0),
    (128 << 20, 175_423_000.0),
];

/// Area of an SRAM of `bytes` from a table: exact at the table's sizes, log–log interpolated
/// between them, and out of the model's domain outside the table (no extrapolation: the
/// 22 nm data does not say what a 4 MiB PE buffer costs).
fn sram_um2(table: &[(u64, f64)], bytes: u64, what: &str) -> Result<f64, EstimateError> {
    if let Some(&(_, a)) = table.iter().find(|&&(b, _)| b == bytes) {
        return Ok(a);
    }
    let (lo, hi) = (table[0], table[table.len() - 1]);
    if bytes < lo.0 || bytes > hi.0 {
        return Err(EstimateError::OutOfDomain(format!(
            "{what} of {bytes} bytes is outside the 22 nm tables ({} to {} bytes)",
            lo.0, hi.0
        )));
    }
    let i = table
        .iter()
        .position(|&(b, _)| b > bytes)
        .unwrap_or(table.len() - 1);
    let ((b0, a0), (b1, a1)) = (table[i - 1], table[i]);
    // libm, not std: the same bits natively and in WebAssembly.
    use libm::{exp, log};
    let f = (log(bytes as f64) - log(b0 as f64)) / (log(b1 as f64) - log(b0 as f64));
    Ok(exp(log(a0) + f * (log(a1) - log(a0))))
}

/// Bytes of each core's PE buffer for a `width × depth` array (vector cores: depth 1).
pub fn pe_buffer_bytes(width: u32, depth: u32) -> u64 {
    (16 * width as u64 * depth as u64).max(1024)
}

/// Area of one accelerator configuration in µm².
pub fn area_um2(c: &AcceleratorConfig) -> Result<f64, EstimateError> {
    if c.tensor_cores == 0
        || c.vector_cores == 0
        || c.width == 0
        || c.depth == 0
        || c.vector_width == 0
    {
        return Err(EstimateError::OutOfDomain(
            "every core count and array dimension must be at least 1".into(),
        ));
    }
    let tc_pe = sram_um2(
        &PE_BUFFER_UM2,
        pe_buffer_bytes(c.width, c.depth),
        "tensor-core PE buffer",
    )?;
    let vc_pe = sram_um2(
        &PE_BUFFER_UM2,
        pe_buffer_bytes(c.vector_width, 1),
        "vector-core PE buffer",
    )?;
    let glb = sram_um2(&GLOBAL_BUFFER_UM2, c.buffer_bytes, "global buffer")?;
    let tc = c.tensor_cores as f64 * ((c.width as f64 * c.depth as f64) * TENSOR_MAC_UM2 + tc_pe);
    let vc = c.vector_cores as f64 * (c.vector_width as f64 * VECTOR_LANE_UM2 + vc_pe);
    Ok(tc + vc + glb)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(tc: u32, vc: u32, w: u32, d: u32, glb_mib: u64) -> AcceleratorConfig {
        AcceleratorConfig {
            tensor_cores: tc,
            vector_cores: vc,
            width: w,
            depth: d,
            vector_width: w,
            buffer_bytes: glb_mib << 20,
        }
    }

    /// The reference's spot-check rows and its maximum config (`docs/reference.md` §1.2),
    /// to 1e-9 relative.
    #[test]
    fn reproduces_reference_rows() {
        let rows = [
            (cfg(8, 2, 128, 128, 128), 278_826_676.31),
            (cfg(512, 128, 4, 32, 32), 101_958_347.686),
            (cfg(8, 2, 16, 2, 128), 175_703_224.758),
            (cfg(1, 64, 128, 128, 64), 108_257_159.592),
            (cfg(2048, 1, 32, 2, 4), 118_291_623.929),
            (cfg(128, 128, 32, 64, 2), 214_583_212.233),
            (cfg(16, 1024, 256, 4, 32), 271_917_162.189),
        ];
        for (c, want) in rows {
            let got = area_um2(&c).unwrap();
            let rel = ((got - want) / want).abs();
            assert!(rel < 1e-9, "{c:?}: got {got}, want {want}, rel {rel:e}");
        }
    }

    #[test]
    fn outside_tables_is_out_of_domain() {
        assert!(matches!(
            area_um2(&cfg(1, 1, 2, 2, 256)),
            Err(EstimateError::OutOfDomain(_))
        ));
        assert!(matches!(
            area_um2(&cfg(0, 1, 2, 2, 2)),
            Err(EstimateError::OutOfDomain(_))
        ));
        // Between table points: monotone.
        let a = area_um2(&cfg(1, 1, 2, 2, 2)).unwrap();
        let b = area_um2(&cfg(1, 1, 2, 2, 3)).unwrap();
        let c = area_um2(&cfg(1, 1, 2, 2, 4)).unwrap();
        assert!(a < b && b < c);
    }
}
