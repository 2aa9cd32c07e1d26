//! Positions in text, so that every TOML file archplace reads (specs, the daemon config,
//! plugin manifests) locates its errors the same way: 1-based line and character column.

/// 1-based line and character column of a byte offset (clamped to the text).
pub fn line_column(source: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(source.len());
    let before = source.get(..offset).unwrap_or(source);
    let line = before.matches('\n').count() + 1;
    let start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before.get(start..).map_or(1, |s| s.chars().count() + 1);
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::line_column;

    #[test]
    fn lines_and_character_columns() {
        let s = "a = 1\nbé = 2\n";
        assert_eq!(line_column(s, 0), (1, 1));
        assert_eq!(line_column(s, 6), (2, 1));
        assert_eq!(line_column(s, s.find('2').unwrap()), (2, 6));
        assert_eq!(line_column(s, 10_000), (3, 1));
    }
}
