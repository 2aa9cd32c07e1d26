//! Located errors in a spec: file, line, column, field, what is wrong and what would be
//! valid — rendered like a compiler error for people, or as JSON for programs.

use serde::Serialize;
use std::fmt;
use std::ops::Range;
use toml::de::{DeTable, DeValue};

/// One segment of a field path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seg {
    Key(String),
    Index(usize),
}

/// A field path such as `models[0].max_tensor_parallel`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FieldPath(pub Vec<Seg>);

impl FieldPath {
    pub fn root() -> Self {
        FieldPath(Vec::new())
    }
    pub fn key(&self, k: &str) -> Self {
        let mut p = self.clone();
        p.0.push(Seg::Key(k.to_string()));
        p
    }
    pub fn index(&self, i: usize) -> Self {
        let mut p = self.clone();
        p.0.push(Seg::Index(i));
        p
    }
    /// Whether `self` is `other` or one of the fields inside it.
    pub fn within(&self, other: &FieldPath) -> bool {
        self.0.starts_with(&other.0)
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, s) in self.0.iter().enumerate() {
            match s {
                Seg::Key(k) if i == 0 => write!(f, "{k}")?,
                Seg::Key(k) => write!(f, ".{k}")?,
                Seg::Index(n) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}

/// One problem in a spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Diagnostic {
    pub file: String,
    /// 1-based; 0 when the problem has no place in the file (e.g. it cannot be read).
    pub line: usize,
    /// 1-based, in characters.
    pub column: usize,
    /// The field, e.g. `training.micro_batch_sizes[1]`; empty for the whole file.
    pub field: String,
    pub message: String,
    /// What would be valid, when we can say.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub help: Option<String>,
    #[serde(skip)]
    pub span: Option<Range<usize>>,
}

/// One line: `FILE:LINE:COLUMN: MESSAGE (HELP)` (`FILE: MESSAGE (HELP)` for a problem with
/// no place in the file) — for a log field or an error chain, where
/// [`Diagnostic::render`]'s snippet does not fit.
impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A problem with no place in the file (it cannot be read, it is too large) is the
        // file's, not at a made-up line 0.
        if self.line == 0 {
            write!(f, "{}: {}", self.file, self.message)?;
        } else {
            write!(
                f,
                "{}:{}:{}: {}",
                self.file, self.line, self.column, self.message
            )?;
        }
        if let Some(h) = &self.help {
            write!(f, " ({h})")?;
        }
        Ok(())
    }
}

impl Diagnostic {
    pub fn new(
        file: &str,
        source: &str,
        span: Option<Range<usize>>,
        field: String,
        message: String,
    ) -> Self {
        let (line, column) = match &span {
            Some(r) => line_column(source, r.start),
            None => (0, 0),
        };
        Diagnostic {
            file: file.to_string(),
            line,
            column,
            field,
            message,
            help: None,
            span,
        }
    }

    pub fn with_help(mut self, help: Option<String>) -> Self {
        self.help = help;
        self
    }

    /// A compiler-style rendering (annotate-snippets): the message, the file and place,
    /// the offending line with a caret under the value (its first line, for a table), the
    /// field and the help.
    pub fn render(&self, source: &str) -> String {
        use annotate_snippets::{AnnotationKind, Level, Origin, Renderer, Snippet};
        let title = Level::ERROR.primary_title(&self.message);
        let span = self
            .span
            .clone()
            .filter(|r| self.line > 0 && r.start <= r.end && source.get(r.clone()).is_some());
        let mut group = match span {
            Some(r) => {
                // The first line of the value only: a table's span covers all its lines.
                let first_line_end = source[r.start..]
                    .find('\n')
                    .map_or(source.len(), |i| r.start + i);
                let end = r.end.min(first_line_end).max(r.start);
                title.element(
                    Snippet::source(source)
                        .path(&self.file)
                        .annotation(AnnotationKind::Primary.span(r.start..end)),
                )
            }
            None => title.element(Origin::path(&self.file)),
        };
        let field = format!("field: {}", self.field);
        if !self.field.is_empty() {
            group = group.element(Level::NOTE.message(&field));
        }
        if let Some(h) = &self.help {
            group = group.element(Level::HELP.message(h));
        }
        let mut out = Renderer::plain().render(&[group]);
        out.push('\n');
        out
    }
}

pub use archplace_plugin_sdk::text::line_column;

/// Finds the span of `path` in a parsed document: the value itself, or, for a field that
/// is missing, the closest enclosing table or array that exists.
pub fn locate(doc: &DeTable<'_>, root_span: Range<usize>, path: &FieldPath) -> Range<usize> {
    let mut span = root_span;
    let mut table: Option<&DeTable<'_>> = Some(doc);
    let mut array: Option<&[toml::Spanned<DeValue<'_>>]> = None;
    for seg in &path.0 {
        let next = match seg {
            Seg::Key(k) => table.and_then(|t| {
                t.iter()
                    .find(|(key, _)| key.get_ref().as_ref() == k.as_str())
                    .map(|(_, v)| v)
            }),
            Seg::Index(i) => array.and_then(|a| a.get(*i)),
        };
        let Some(v) = next else { break };
        span = v.span();
        table = v.get_ref().as_table();
        array = v.get_ref().as_array().map(|a| a.as_ref());
    }
    span
}

/// The span of the *key* of the last segment of `path`, if it exists.
pub fn locate_key(doc: &DeTable<'_>, path: &FieldPath) -> Option<Range<usize>> {
    let mut table = doc;
    let (last, parents) = path.0.split_last()?;
    let mut array: Option<&[toml::Spanned<DeValue<'_>>]> = None;
    let mut current: Option<&DeTable<'_>> = Some(table);
    for seg in parents {
        let v = match seg {
            Seg::Key(k) => current?
                .iter()
                .find(|(key, _)| key.get_ref().as_ref() == k.as_str())
                .map(|(_, v)| v)?,
            Seg::Index(i) => array?.get(*i)?,
        };
        current = v.get_ref().as_table();
        array = v.get_ref().as_array().map(|a| a.as_ref());
    }
    table = current?;
    match last {
        Seg::Key(k) => table
            .iter()
            .find(|(key, _)| key.get_ref().as_ref() == k.as_str())
            .map(|(key, _)| key.span()),
        Seg::Index(_) => None,
    }
}

/// The closest of `candidates` to `word`, if it is close enough to be a likely typo.
pub fn did_you_mean<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (strsim::damerau_levenshtein(word, c), c))
        .filter(|&(d, c)| d <= 2.max(c.len() / 4))
        .min_by_key(|&(d, _)| d)
        .map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_display_like_toml() {
        let p = FieldPath::root().key("models").index(0).key("heads");
        assert_eq!(p.to_string(), "models[0].heads");
    }

    #[test]
    fn suggestions() {
        assert_eq!(
            did_you_mean("micro_batch_size", ["micro_batch_sizes", "global_batch"]),
            Some("micro_batch_sizes")
        );
        assert_eq!(did_you_mean("zzz", ["micro_batch_sizes"]), None);
    }
}
