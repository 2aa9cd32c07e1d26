//! Human-readable quantities ("80 GiB", "4 GiB/s", "32 Gb/s", "278.8 mm2", "1.05 GHz") and
//! their SI values.
//!
//! Specs are written by hand, so every quantity carries its unit explicitly; a bare number
//! is refused because "is that bytes or GiB?" is exactly the mistake we want to catch.
//! Decimal prefixes (k, M, G, T) are powers of 1000, binary ones (Ki, Mi, Gi, Ti) powers of
//! 1024, `B` is a byte and `b` a bit.

use std::fmt;

/// Why a quantity could not be read. The message says what would be valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct UnitError {
    pub message: String,
}

fn err(message: String) -> UnitError {
    UnitError { message }
}

/// Splits `"80 GiB"` into `(80.0, "GiB")`.
fn split(input: &str, what: &str, example: &str) -> Result<(f64, String), UnitError> {
    let s = input.trim();
    let end = s
        .char_indices()
        .find(|&(_, c)| {
            !(c.is_ascii_digit()
                || c == '.'
                || c == '_'
                || c == 'e'
                || c == 'E'
                || c == '+'
                || c == '-')
        })
        .map(|(i, _)| i)
        .unwrap_or(s.len());
    // "1e3 B" is fine, but a unit starting with 'e' cannot exist; keep it simple.
    let (num, unit) = s.split_at(end);
    let num = num.replace('_', "");
    if num.is_empty() {
        return Err(err(format!(
            "`{input}` is not {} {what}: expected a number and a unit, e.g. \"{example}\"",
            article(what)
        )));
    }
    let value: f64 = num.parse().map_err(|_| {
        err(format!(
            "`{input}` is not {} {what}: `{num}` is not a number (e.g. \"{example}\")",
            article(what)
        ))
    })?;
    if !value.is_finite() || value < 0.0 {
        return Err(err(format!(
            "`{input}` is not {} {what}: the number must be finite and not negative",
            article(what)
        )));
    }
    let unit = unit.trim().to_string();
    if unit.is_empty() {
        return Err(err(format!(
            "`{input}` has no unit: write the {what} with its unit, e.g. \"{example}\""
        )));
    }
    Ok((value, unit))
}

/// "a" or "an" before `word` (by its first letter, which is right for our unit names).
fn article(word: &str) -> &'static str {
    if word.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    }
}

fn prefix(p: &str) -> Option<f64> {
    Some(match p {
        "" => 1.0,
        "k" | "K" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    })
}

/// Bytes of a data unit: `B` (byte) or `b` (bit) with a decimal or binary prefix.
fn data_unit(unit: &str) -> Option<f64> {
    let (p, base) = if let Some(p) = unit.strip_suffix('B') {
        (p, 1.0)
    } else if let Some(p) = unit.strip_suffix('b') {
        (p, 1.0 / 8.0)
    } else {
        return None;
    };
    prefix(p).map(|f| f * base)
}

const SIZE_UNITS: &str = "B, kB, MB, GB, TB, KiB, MiB, GiB, TiB (or bits: b, Mb, Gb, ...)";

/// A size such as `"80 GiB"` or `"128 MiB"`, in bytes (rounded to a whole byte).
pub fn parse_bytes(input: &str) -> Result<u64, UnitError> {
    let (value, unit) = split(input, "size", "80 GiB")?;
    let factor = data_unit(&unit).ok_or_else(|| {
        err(format!(
            "`{unit}` is not a unit of size; valid units: {SIZE_UNITS}"
        ))
    })?;
    let bytes = value * factor;
    if bytes > u64::MAX as f64 / 2.0 {
        return Err(err(format!("`{input}` is too large")));
    }
    Ok(bytes.round() as u64)
}

/// A bandwidth such as `"4 GiB/s"` or `"32 Gb/s"`, in bytes per second.
pub fn parse_bandwidth(input: &str) -> Result<f64, UnitError> {
    let (value, unit) = split(input, "bandwidth", "4 GiB/s")?;
    let data = unit
        .strip_suffix("/s")
        .or_else(|| unit.strip_suffix("ps"))
        .ok_or_else(|| err(format!("`{unit}` is not a unit of bandwidth; write a size per second, e.g. GiB/s, GB/s, Gb/s")))?;
    let factor = data_unit(data.trim()).ok_or_else(|| {
        err(format!(
            "`{unit}` is not a unit of bandwidth; valid: a size per second ({SIZE_UNITS}, then /s)"
        ))
    })?;
    Ok(value * factor)
}

/// An area such as `"278.8 mm2"`, `"278.8 mm²"` or `"3e6 um2"`, in µm².
pub fn parse_area_um2(input: &str) -> Result<f64, UnitError> {
    let (value, unit) = split(input, "area", "278.8 mm2")?;
    let factor = match unit.as_str() {
        "mm2" | "mm²" | "mm^2" => 1e6,
        "um2" | "µm2" | "μm2" | "um²" | "µm²" | "μm²" | "um^2" | "µm^2" => 1.0,
        "cm2" | "cm²" | "cm^2" => 1e8,
        _ => {
            return Err(err(format!(
                "`{unit}` is not a unit of area; valid units: mm2 (mm²), um2 (µm²), cm2"
            )));
        }
    };
    Ok(value * factor)
}

/// A frequency such as `"1.05 GHz"`, in hertz.
pub fn parse_hertz(input: &str) -> Result<f64, UnitError> {
    let (value, unit) = split(input, "frequency", "1.05 GHz")?;
    let p = unit.strip_suffix("Hz").ok_or_else(|| {
        err(format!(
            "`{unit}` is not a unit of frequency; valid units: Hz, kHz, MHz, GHz"
        ))
    })?;
    let factor = match p {
        "" => 1.0,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        _ => {
            return Err(err(format!(
                "`{unit}` is not a unit of frequency; valid units: Hz, kHz, MHz, GHz"
            )));
        }
    };
    Ok(value * factor)
}

/// A duration such as `"5 us"`, `"5 µs"`, `"1.5 ms"` or `"2 s"`, in seconds.
pub fn parse_seconds(input: &str) -> Result<f64, UnitError> {
    let (value, unit) = split(input, "duration", "5 us")?;
    let factor = match unit.as_str() {
        "s" => 1.0,
        "ms" => 1e-3,
        "us" | "µs" | "μs" => 1e-6,
        "ns" => 1e-9,
        _ => {
            return Err(err(format!(
                "`{unit}` is not a unit of time; valid units: s, ms, us (µs), ns"
            )));
        }
    };
    Ok(value * factor)
}

/// A compute rate such as `"312 TFLOP/s"` or `"1.2 PFLOP/s"`, in floating-point operations
/// per second (decimal prefixes k, M, G, T, P).
pub fn parse_flops(input: &str) -> Result<f64, UnitError> {
    let (value, unit) = split(input, "compute rate", "312 TFLOP/s")?;
    let bad = || {
        err(format!(
            "`{unit}` is not a unit of compute rate; valid units: FLOP/s, GFLOP/s, TFLOP/s, PFLOP/s"
        ))
    };
    let p = unit.strip_suffix("FLOP/s").ok_or_else(bad)?;
    let factor = match p {
        "" => 1.0,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        _ => return Err(bad()),
    };
    Ok(value * factor)
}

/// Formats bytes with the largest binary prefix that keeps the number ≥ 1 ("128 MiB").
pub fn format_bytes(bytes: u64) -> String {
    struct B(u64);
    impl fmt::Display for B {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
            let mut v = self.0 as f64;
            let mut i = 0;
            while v >= 1024.0 && i + 1 < UNITS.len() {
                v /= 1024.0;
                i += 1;
            }
            if (v - v.round()).abs() < 1e-9 {
                write!(f, "{} {}", v.round() as u64, UNITS[i])
            } else {
                write!(f, "{:.2} {}", v, UNITS[i])
            }
        }
    }
    B(bytes).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compute_rates() {
        assert_eq!(parse_flops("312 TFLOP/s").unwrap(), 312e12);
        assert_eq!(parse_flops("1.5 PFLOP/s").unwrap(), 1.5e15);
        assert!(
            parse_flops("312 TFLOPS")
                .unwrap_err()
                .message
                .contains("TFLOP/s")
        );
        assert!(parse_flops("312").unwrap_err().message.contains("no unit"));
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("80 GiB").unwrap(), 80 << 30);
        assert_eq!(parse_bytes("128MiB").unwrap(), 128 << 20);
        assert_eq!(parse_bytes("4 GB").unwrap(), 4_000_000_000);
        assert_eq!(parse_bytes("8 b").unwrap(), 1);
        assert_eq!(parse_bytes("1_024 B").unwrap(), 1024);
        assert!(parse_bytes("80").unwrap_err().message.contains("no unit"));
        assert!(
            parse_bytes("80 GiBs")
                .unwrap_err()
                .message
                .contains("valid units")
        );
        assert!(parse_bytes("-1 GiB").is_err());
        assert!(parse_bytes("GiB").is_err());
    }

    #[test]
    fn bandwidths() {
        assert_eq!(
            parse_bandwidth("4 GiB/s").unwrap(),
            4.0 * 1024.0 * 1024.0 * 1024.0
        );
        assert_eq!(parse_bandwidth("32 Gb/s").unwrap(), 4e9);
        assert_eq!(parse_bandwidth("25 GBps").unwrap(), 25e9);
        assert!(
            parse_bandwidth("4 GiB")
                .unwrap_err()
                .message
                .contains("per second")
        );
    }

    #[test]
    fn areas_and_frequencies() {
        assert_eq!(parse_area_um2("278.8 mm2").unwrap(), 278.8e6);
        assert_eq!(parse_area_um2("5 µm²").unwrap(), 5.0);
        assert!(parse_area_um2("5 m2").is_err());
        assert_eq!(parse_hertz("1.05 GHz").unwrap(), 1.05e9);
        assert_eq!(parse_hertz("800 MHz").unwrap(), 8e8);
        assert!(parse_hertz("1 GHZ").is_err());
    }

    #[test]
    fn formatting() {
        assert_eq!(format_bytes(128 << 20), "128 MiB");
        assert_eq!(format_bytes(1536), "1.50 KiB");
        assert_eq!(format_bytes(7), "7 B");
    }
}
