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

#[cfg(test)]
mod tests {
    use super::{line_column, thousands};

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
