//! Text helpers shared by archplace's crates: positions in text, so that every TOML file
//! archplace reads (specs, the daemon config, plugin manifests) locates its errors the same
//! way (1-based line and character column), and numbers with thousands separators.

/// 1-based line and character column of a byte offset (clamped to the text).
pub fn line_column(source: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(source.len());
    let before = source.get(..offset).unwrap_or(source);
    let line = before.matches('\n').count() + 1;
    let start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before.get(start..).map_or(1, |s| s.chars().count() + 1);
    (line, column)
}

/// `1234567` → `"1,234,567"`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `x` to `digits` significant digits, without false precision and without an exponent
/// in the range people read: `29.1399` → `"29.14"`, `11154.48` → `"11,154"` (thousands
/// separated once no decimals are left), `0.0012346` → `"0.001235"`.
pub fn significant(x: f64, digits: u32) -> String {
    if !x.is_finite() {
        return x.to_string();
    }
    if x == 0.0 {
        return "0".into();
    }
    let digits = digits.max(1) as i32;
    let magnitude = x.abs().log10().floor() as i32;
    let decimals = (digits - 1 - magnitude).max(0);
    if decimals == 0 {
        // Round to the significant digits, then separate thousands.
        let step = 10f64.powi(magnitude + 1 - digits);
        let rounded = (x.abs() / step).round() * step;
        let sign = if x < 0.0 { "-" } else { "" };
        return format!("{sign}{}", thousands(rounded as u64));
    }
    format!("{x:.*}", decimals as usize)
}

#[cfg(test)]
mod tests {
    use super::{line_column, significant, thousands};

    #[test]
    fn significant_digits() {
        assert_eq!(significant(29.1399, 4), "29.14");
        assert_eq!(significant(11_154.48, 4), "11,150");
        assert_eq!(significant(12.4415, 4), "12.44");
        assert_eq!(significant(0.0012346, 4), "0.001235");
        assert_eq!(significant(-3.0, 3), "-3.00");
        assert_eq!(significant(1234.0, 4), "1,234");
        assert_eq!(significant(0.0, 4), "0");
    }

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }

    #[test]
    fn lines_and_character_columns() {
        let s = "a = 1\nbé = 2\n";
        assert_eq!(line_column(s, 0), (1, 1));
        assert_eq!(line_column(s, 6), (2, 1));
        assert_eq!(line_column(s, s.find('2').unwrap()), (2, 6));
        assert_eq!(line_column(s, 10_000), (3, 1));
    }
}
