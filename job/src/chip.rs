//! A chip in words, the one way every output describes it: short in pictures
//! (`8 TC 128×128, 2 VC ×128, 128 MiB`), whole in summaries and logs (its cores, buffer,
//! area and HBM).

use crate::lines::Configuration;
use archplace_plugin_sdk::AcceleratorConfig;
use archplace_plugin_sdk::units::format_bytes;

/// The chip's cores and buffer, abbreviated for the plots: `8 TC 128×128, 2 VC ×128, 128 MiB`.
pub fn short(c: &AcceleratorConfig) -> String {
    format!(
        "{} TC {}×{}, {} VC ×{}, {}",
        c.tensor_cores,
        c.width,
        c.depth,
        c.vector_cores,
        c.vector_width,
        format_bytes(c.buffer_bytes)
    )
}

/// The chip's peak tensor throughput, FLOP/s: every MAC of every tensor core, two FLOPs
/// a cycle, at the clock of the latency model `latency` (its `clock` parameter, as the
/// search used it: `parameters` are `result.json`'s `cost_model_parameters`). `None` for a
/// latency model without a `clock` parameter: its peak is not known here.
pub fn peak_flops_per_second(
    chip: &AcceleratorConfig,
    latency: &str,
    parameters: &std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>,
) -> Option<f64> {
    let clock = parameters.get(latency)?.get("clock")?;
    let hz = archplace_plugin_sdk::units::parse_hertz(clock).ok()?;
    let macs = f64::from(chip.tensor_cores) * f64::from(chip.width) * f64::from(chip.depth);
    Some(2.0 * macs * hz)
}

/// The chip in one line: its cores, buffer, area and HBM — `4 tensor cores of 256×256,
/// 64 vector cores of 256 lanes, 32 MiB buffer, 265.78 mm²; HBM 32 GiB`.
pub fn long(c: &Configuration, hbm_bytes: u64) -> String {
    let k = &c.chip;
    let s = |n: u32| if n == 1 { "" } else { "s" };
    format!(
        "{} tensor core{} of {}×{}, {} vector core{} of {} lanes, {} buffer, {:.2} mm²; HBM {}",
        k.tensor_cores,
        s(k.tensor_cores),
        k.width,
        k.depth,
        k.vector_cores,
        s(k.vector_cores),
        k.vector_width,
        format_bytes(k.buffer_bytes),
        c.area_mm2,
        format_bytes(hbm_bytes)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_and_long_forms() {
        let c = archplace_engine::space::REFERENCE_CONFIG;
        let conf = Configuration {
            chip: c,
            area_mm2: 265.781,
        };
        assert_eq!(
            short(&c),
            format!(
                "{} TC {}×{}, {} VC ×{}, {}",
                c.tensor_cores,
                c.width,
                c.depth,
                c.vector_cores,
                c.vector_width,
                format_bytes(c.buffer_bytes)
            )
        );
        assert!(long(&conf, 32 << 30).ends_with(", 265.78 mm²; HBM 32 GiB"));
        let mut one = conf.clone();
        one.chip.tensor_cores = 1;
        one.chip.vector_cores = 1;
        let text = long(&one, 32 << 30);
        assert!(text.starts_with("1 tensor core of "), "{text}");
        assert!(text.contains(", 1 vector core of "), "{text}");
    }
}
