//! Tidy checks of the source tree (as rust-analyzer's `xtask/src/tidy.rs`): the rules of
//! ARCHITECTURE.md that neither the compiler nor clippy can see. Each reads the files as
//! they are in the checkout (those git tracks and those it does not ignore).

use crate::util::root;
use proc_macro2::{TokenStream, TokenTree};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use syn::visit::Visit;

/// The source files of the workspace (`.rs`), relative to the root, that git would commit:
/// the fetched dependencies and build outputs are not ours.
fn rust_files() -> Vec<PathBuf> {
    files(&["*.rs"])
}

/// The files git tracks or would add (not ignored) matching `patterns`, relative to the
/// root.
fn files(patterns: &[&str]) -> Vec<PathBuf> {
    let out = std::process::Command::new("git")
        .args([
            "ls-files",
            "--cached",
            "--others",
            "--exclude-standard",
            "--",
        ])
        .args(patterns)
        .current_dir(root())
        .output()
        .expect("git runs (the tidy checks read a checkout)");
    assert!(out.status.success(), "git ls-files failed");
    let mut v: Vec<PathBuf> = String::from_utf8(out.stdout)
        .expect("UTF-8 paths")
        .lines()
        .map(PathBuf::from)
        .filter(|p| root().join(p).is_file())
        .collect();
    v.sort();
    v.dedup();
    v
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn parse(path: &Path) -> syn::File {
    syn::parse_file(&read(path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Whether `attrs` make an item test-only: `#[test]`, or `#[cfg(test)]`.
fn test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("test")
            || (a.path().is_ident("cfg")
                && a.parse_args::<syn::Meta>()
                    .is_ok_and(|m| m.path().is_ident("test")))
    })
}

/// Whether a file holds only tests or benchmarks: `tests/`, `benches/`, `examples/`
/// folders, and the `tests.rs` modules that `#[cfg(test)] mod tests;` declares.
fn test_file(path: &Path) -> bool {
    path.components().any(|c| {
        matches!(
            c.as_os_str().to_str(),
            Some("tests" | "benches" | "examples")
        )
    }) || path.file_name().is_some_and(|n| n == "tests.rs")
}

// --- Functions are short ---------------------------------------------------------------

/// The longest a function outside tests may be, in lines from its signature to its closing
/// brace: beyond it a function does several things that deserve names.
const MAX_FUNCTION_LINES: usize = 150;

/// Functions longer than [`MAX_FUNCTION_LINES`], outside tests.
struct LongFunctions<'a> {
    path: &'a Path,
    found: Vec<String>,
}

impl LongFunctions<'_> {
    fn check(&mut self, name: &syn::Ident, start: proc_macro2::Span, block: &syn::Block) {
        let lines = block.brace_token.span.close().end().line + 1 - start.start().line;
        if lines > MAX_FUNCTION_LINES {
            self.found.push(format!(
                "{}:{} `{name}`: {lines} lines",
                self.path.display(),
                start.start().line
            ));
        }
    }
}

impl<'ast> Visit<'ast> for LongFunctions<'_> {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !test_only(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if !test_only(&f.attrs) {
            self.check(&f.sig.ident, f.sig.fn_token.span, &f.block);
            syn::visit::visit_item_fn(self, f);
        }
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !test_only(&f.attrs) {
            self.check(&f.sig.ident, f.sig.fn_token.span, &f.block);
            syn::visit::visit_impl_item_fn(self, f);
        }
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if let Some(block) = &f.default {
            self.check(&f.sig.ident, f.sig.fn_token.span, block);
        }
        syn::visit::visit_trait_item_fn(self, f);
    }
}

#[test]
fn no_function_outside_tests_is_longer_than_150_lines() {
    let mut found = Vec::new();
    for path in rust_files().iter().filter(|p| !test_file(p)) {
        let mut v = LongFunctions {
            path,
            found: Vec::new(),
        };
        v.visit_file(&parse(path));
        found.extend(v.found);
    }
    assert!(
        found.is_empty(),
        "functions over {MAX_FUNCTION_LINES} lines (split them into named parts):\n{}",
        found.join("\n")
    );
}

// --- The engine's modules point one way --------------------------------------------------

/// The engine's top-level modules in the order `engine/src/lib.rs` declares them.
fn engine_modules() -> Vec<String> {
    parse(Path::new("engine/src/lib.rs"))
        .items
        .iter()
        .filter_map(|i| match i {
            syn::Item::Mod(m) => Some(m.ident.to_string()),
            _ => None,
        })
        .collect()
}

/// The module paths that the code of one engine file names (`crate::x::…`, or `super::…`
/// climbing towards the crate root), outside tests and inline modules.
struct ModuleUses {
    /// The file's module path below the crate root (`["search", "memory"]`).
    module: Vec<String>,
    /// Inline modules entered (for `super`).
    inline: Vec<String>,
    /// Every module path named, whole (`["search", "context", "Ctx"]`).
    paths: BTreeSet<Vec<String>>,
}

impl ModuleUses {
    /// The whole path a path starting `crate`/`super`/`self` names, from the crate root.
    fn resolve_full(&self, segments: &[String]) -> Option<Vec<String>> {
        let mut here: Vec<String> = self.module.iter().chain(&self.inline).cloned().collect();
        let mut rest = segments;
        match rest.first().map(String::as_str) {
            Some("crate") => {
                here.clear();
                rest = &rest[1..];
            }
            Some("super") => {
                while rest.first().map(String::as_str) == Some("super") {
                    here.pop();
                    rest = &rest[1..];
                }
            }
            Some("self") => rest = &rest[1..],
            _ => return None,
        }
        here.extend(rest.iter().cloned());
        Some(here)
    }

    fn record(&mut self, segments: Vec<String>) {
        if self.inline.is_empty()
            && let Some(full) = self.resolve_full(&segments)
        {
            self.paths.insert(full);
        }
    }
}

/// The paths a `use` tree brings in, each as its segments.
fn use_paths(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            use_paths(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let mut v = prefix.clone();
            v.push(n.ident.to_string());
            out.push(v);
        }
        syn::UseTree::Rename(r) => {
            let mut v = prefix.clone();
            v.push(r.ident.to_string());
            out.push(v);
        }
        syn::UseTree::Glob(_) => out.push(prefix.clone()),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                use_paths(t, prefix, out);
            }
        }
    }
}

impl<'ast> Visit<'ast> for ModuleUses {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if test_only(&m.attrs) {
            return;
        }
        self.inline.push(m.ident.to_string());
        syn::visit::visit_item_mod(self, m);
        self.inline.pop();
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if !test_only(&f.attrs) {
            syn::visit::visit_item_fn(self, f);
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        let mut paths = Vec::new();
        use_paths(&u.tree, &mut Vec::new(), &mut paths);
        for p in paths {
            self.record(p);
        }
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        self.record(p.segments.iter().map(|s| s.ident.to_string()).collect());
        syn::visit::visit_path(self, p);
    }
}

/// The crates whose modules keep their order: every member of the workspace but the
/// plugins (their own small crates).
const ORDERED_CRATES: [&str; 11] = [
    "plugin-sdk",
    "util",
    "cost-port",
    "engine",
    "plugin-host",
    "spec",
    "calibrate",
    "job",
    "pool",
    "service",
    "daemon",
];

/// The module path of a source file of crate `krate`: `engine/src/search/memory.rs` →
/// `[search, memory]`; `mod.rs`, `lib.rs` and `main.rs` name their folder's module.
fn module_path(krate: &str, path: &Path) -> Vec<String> {
    let rel = path
        .strip_prefix(format!("{krate}/src"))
        .expect("a source file of the crate");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    let root_file = parts.len() == 1 && parts[0] == "main";
    if root_file || parts.last().is_some_and(|l| l == "mod" || l == "lib") {
        parts.pop();
    }
    parts
}

/// The modules that module `path` of crate `krate` declares, in order, outside tests
/// (`[]`: its lib.rs or main.rs).
fn declared_in(krate: &str, path: &[String]) -> Vec<String> {
    let dir = Path::new(krate).join("src").join(path.join("/"));
    let file = if path.is_empty() {
        if root().join(&dir).join("lib.rs").exists() {
            dir.join("lib.rs")
        } else {
            dir.join("main.rs")
        }
    } else if root().join(&dir).join("mod.rs").exists() {
        dir.join("mod.rs")
    } else {
        dir.with_extension("rs")
    };
    if !root().join(&file).exists() {
        return Vec::new();
    }
    parse(&file)
        .items
        .iter()
        .filter_map(|i| match i {
            syn::Item::Mod(m) if m.content.is_none() && !test_only(&m.attrs) => {
                Some(m.ident.to_string())
            }
            _ => None,
        })
        .collect()
}

/// In every crate and at every level, each module's files import only the modules declared
/// before it by their common parent: `search/evaluate.rs` may name `search::context`
/// (declared before `evaluate` in `search/mod.rs`) but not `search::bound` — so no two
/// modules of a crate import each other, at the top or inside one.
#[test]
fn each_module_at_every_level_imports_only_modules_declared_before_it() {
    let mut wrong = BTreeSet::new();
    let mut checked = 0;
    for krate in ORDERED_CRATES {
        for path in rust_files()
            .iter()
            .filter(|p| p.starts_with(format!("{krate}/src")) && !test_file(p))
        {
            let module = module_path(krate, path);
            let mut v = ModuleUses {
                module: module.clone(),
                inline: Vec::new(),
                paths: BTreeSet::new(),
            };
            v.visit_file(&parse(path));
            for named in &v.paths {
                let common = module.iter().zip(named).take_while(|(a, b)| a == b).count();
                if common >= module.len() || common >= named.len() {
                    continue; // itself, or its own items and children
                }
                let parent = &module[..common];
                let order = declared_in(krate, parent);
                let position = |m: &str| order.iter().position(|o| o == m);
                if let (Some(at), Some(used)) =
                    (position(&module[common]), position(&named[common]))
                {
                    checked += 1;
                    if used > at {
                        wrong.insert(format!(
                            "{krate}: `{}` imports `{}`, declared after it",
                            module[..=common].join("::"),
                            named[..=common].join("::")
                        ));
                    }
                }
            }
        }
    }
    assert!(
        checked > 200,
        "only {checked} imports between sibling modules seen"
    );
    assert!(
        wrong.is_empty(),
        "module order (ARCHITECTURE.md, \"Invariants\", 19):\n{}",
        wrong.into_iter().collect::<Vec<_>>().join("\n")
    );
}

/// The inputs come first and the search last: the order the architecture names.
#[test]
fn the_engines_inputs_are_at_the_bottom_and_the_search_at_the_top() {
    let order = engine_modules();
    let at = |m: &str| {
        order
            .iter()
            .position(|o| o == m)
            .unwrap_or_else(|| panic!("engine/src/lib.rs declares no `{m}`"))
    };
    let inputs = ["options", "network", "execution", "training", "space"];
    let computation = [
        "model",
        "schedule",
        "operators",
        "placement",
        "step",
        "search",
    ];
    for i in inputs {
        assert!(at(i) < at("model"), "`{i}` is an input: below `model`");
    }
    for w in computation.windows(2) {
        assert!(at(w[0]) < at(w[1]), "`{}` before `{}`", w[0], w[1]);
    }
}

// --- unsafe is where ARCHITECTURE.md says -------------------------------------------------

/// Whether `tokens` hold the keyword `unsafe` (comments and strings are not tokens).
fn has_unsafe(tokens: TokenStream) -> bool {
    tokens.into_iter().any(|t| match t {
        TokenTree::Ident(i) => i == "unsafe",
        TokenTree::Group(g) => has_unsafe(g.stream()),
        _ => false,
    })
}

/// The files ARCHITECTURE.md lists where `unsafe` may appear: the backquoted `.rs` paths
/// that follow "`unsafe` appears in", up to the next numbered invariant.
fn unsafe_allowed_in_architecture() -> BTreeSet<PathBuf> {
    const SAYS: &str = "`unsafe` appears in";
    let doc = read(Path::new("ARCHITECTURE.md"));
    let paragraph = doc
        .split("\n\n")
        .find_map(|p| p.find(SAYS).map(|at| &p[at + SAYS.len()..]))
        .expect("ARCHITECTURE.md says where `unsafe` appears");
    // The invariant ends where the next numbered one begins.
    let item: String = paragraph
        .lines()
        .take_while(|l| {
            let l = l.trim_start();
            let digits = l.chars().take_while(char::is_ascii_digit).count();
            digits == 0 || !l[digits..].starts_with(". **")
        })
        .collect::<Vec<_>>()
        .join("\n");
    item.split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| s.ends_with(".rs"))
        .map(PathBuf::from)
        .collect()
}

#[test]
fn unsafe_appears_only_in_the_files_architecture_md_lists() {
    let found: BTreeSet<PathBuf> = rust_files()
        .into_iter()
        .filter(|p| read(p).parse::<TokenStream>().is_ok_and(has_unsafe))
        .collect();
    let listed = unsafe_allowed_in_architecture();
    assert_eq!(
        found, listed,
        "files with `unsafe` (left) against ARCHITECTURE.md's list (right)"
    );
}

// --- What the documents name exists -------------------------------------------------------

/// The top-level folders and files of the repository: a backquoted word starting with one
/// of them is a path.
fn top_level() -> BTreeSet<String> {
    std::fs::read_dir(root())
        .expect("the root")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !matches!(n.as_str(), "target" | ".git" | "results" | "specs"))
        .collect()
}

/// `a/{b,c}/d` → `a/b/d`, `a/c/d`.
fn expand_braces(path: &str) -> Vec<String> {
    let (Some(open), Some(close)) = (path.find('{'), path.find('}')) else {
        return vec![path.to_string()];
    };
    path[open + 1..close]
        .split(',')
        .flat_map(|alt| expand_braces(&format!("{}{alt}{}", &path[..open], &path[close + 1..])))
        .collect()
}

/// Whether a path (which may end in a `*` glob over one folder's files) names something.
fn exists(path: &str) -> bool {
    let path = path.trim_end_matches('/');
    match path.rsplit_once("/*") {
        Some((dir, ext)) => std::fs::read_dir(root().join(dir))
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .any(|e| e.file_name().to_string_lossy().ends_with(ext))
            })
            .unwrap_or(false),
        None => root().join(path).exists(),
    }
}

/// The repository paths a document names: backquoted words and link targets that start
/// with a top-level folder or file.
fn paths_named(text: &str, top: &BTreeSet<String>) -> Vec<String> {
    let mut words: Vec<&str> = text.split('`').skip(1).step_by(2).collect();
    words.extend(text.split("](").skip(1).filter_map(|r| r.split(')').next()));
    words
        .into_iter()
        .map(|w| {
            w.split_whitespace()
                .next()
                .unwrap_or("")
                .trim_end_matches([',', '.', ':'])
        })
        .map(|w| w.split('#').next().unwrap_or(w))
        .filter(|w| w.contains('/') && !w.contains("://") && !w.contains(' '))
        .filter(|w| w.split('/').next().is_some_and(|first| top.contains(first)))
        .flat_map(expand_braces)
        .collect()
}

#[test]
fn every_path_the_documents_name_exists() {
    let top = top_level();
    let mut missing = Vec::new();
    let docs = files(&["*.md"]);
    for doc in docs.iter().filter(|d| !d.ends_with("CHANGELOG.md")) {
        for p in paths_named(&read(doc), &top) {
            if !exists(&p) {
                missing.push(format!("{}: `{p}`", doc.display()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "documents name paths that do not exist:\n{}",
        missing.join("\n")
    );
}

// --- Comments point at what a reader has ---------------------------------------------------

/// Where a line's comment starts: the first `//` outside a string literal.
fn comment_start(line: &str) -> Option<usize> {
    let bytes = line.as_bytes();
    let mut in_string = false;
    let mut i = 0;
    while i + 1 < bytes.len() {
        match bytes[i] {
            b'\\' if in_string => i += 1,
            b'"' => in_string = !in_string,
            b'/' if !in_string && bytes[i + 1] == b'/' => return Some(i),
            _ => {}
        }
        i += 1;
    }
    None
}

/// The comment text of a Rust file: `//` comments and doc comments, by line.
fn comments(text: &str) -> Vec<(usize, &str)> {
    text.lines()
        .enumerate()
        .filter_map(|(i, l)| comment_start(l).map(|at| (i + 1, &l[at..])))
        .collect()
}

/// Whether a comment cites something a reader of the repository cannot open: the issue
/// tracker (an issue's number) or a design write-up kept outside the repository.
fn cites_elsewhere(comment: &str) -> bool {
    let lower = comment.to_lowercase();
    let issue = lower.match_indices("issue").any(|(at, _)| {
        let rest = lower[at..]
            .trim_start_matches("issues")
            .trim_start_matches("issue");
        rest.trim_start().starts_with(|c: char| c.is_ascii_digit())
    });
    let hash = comment
        .match_indices("(#")
        .any(|(at, _)| comment[at + 2..].starts_with(|c: char| c.is_ascii_digit()));
    issue || hash || lower.contains("design doc")
}

#[test]
fn no_comment_cites_an_issue_or_a_document_that_is_not_here() {
    let mut found = Vec::new();
    for path in rust_files() {
        let text = read(&path);
        for (line, c) in comments(&text) {
            if cites_elsewhere(c) {
                found.push(format!("{}:{line}: {}", path.display(), c.trim()));
            }
        }
    }
    for path in files(&["*.toml", "*.sh", "*.yml", "*.yaml", "scripts/*", ".ci/*"]) {
        let text = read(&path);
        for (i, l) in text.lines().enumerate() {
            if let Some(at) = l.find('#')
                && cites_elsewhere(&l[at..])
            {
                found.push(format!("{}:{}: {}", path.display(), i + 1, l.trim()));
            }
        }
    }
    let top = top_level();
    for path in rust_files() {
        for (line, c) in comments(&read(&path)) {
            for p in paths_named(c, &top) {
                if p.ends_with(".md") && !exists(&p) {
                    found.push(format!("{}:{line}: `{p}` does not exist", path.display()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "comments that cite what the repository does not hold:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_comment_check_sees_what_it_must() {
    assert!(cites_elsewhere("// fixed in issue 16"));
    assert!(cites_elsewhere("/// see Issues 3 and 4"));
    assert!(cites_elsewhere("// (#12)"));
    assert!(cites_elsewhere("//! design doc §4"));
    assert!(!cites_elsewhere("// an issue with the solver"));
    assert!(!cites_elsewhere("// Korthikanti et al. §4.2.3"));
}

// --- The README's metrics are the daemon's ------------------------------------------------

/// The metric names of the README's table (the rows of its "Metrics" table; `…_x` after a
/// full name is that name's family with another ending).
fn readme_metrics(exported: &BTreeSet<String>) -> BTreeSet<String> {
    let readme = read(Path::new("README.md"));
    let mut names = BTreeSet::new();
    for row in readme.lines().filter(|l| l.starts_with("| `archplace_")) {
        let cell = row.split('|').nth(1).unwrap_or_default();
        let words: Vec<&str> = cell.split('`').skip(1).step_by(2).collect();
        let Some(first) = words.first() else {
            continue;
        };
        for w in &words {
            match w.strip_prefix("…_") {
                None => {
                    names.insert(w.to_string());
                }
                Some(ending) => {
                    // The longest prefix of the full name that makes an exported name.
                    let parts: Vec<&str> = first.split('_').collect();
                    let expanded = (1..parts.len())
                        .rev()
                        .map(|k| format!("{}_{ending}", parts[..k].join("_")))
                        .find(|n| exported.contains(n))
                        .unwrap_or_else(|| format!("{first}…_{ending}"));
                    names.insert(expanded);
                }
            }
        }
    }
    names
}

#[test]
fn the_readmes_metrics_table_lists_exactly_the_exported_metrics() {
    use archplace_plugin_host::Telemetry;
    use archplace_service::metrics::{Metrics, SpecLabels};
    let metrics = Metrics::new().expect("the metrics registry");
    // Series with labels appear once they have a value: one of each.
    let labels = SpecLabels {
        spec: "s".into(),
        file: "s.toml".into(),
    };
    metrics.plugin_known("p");
    metrics.call("p", 1e-6, 1);
    metrics.progress(
        &labels,
        &archplace_engine::search::Progress {
            evaluated: 1,
            total: 2,
            bucket: 1,
            bucket_area_um2: 1.0,
            best_throughput_samples_per_second: Some(1.0),
            best_area_um2: Some(1.0),
            estimates_computed: 1,
            estimate_cache_hits: 1,
        },
        (0, 0),
    );
    metrics.set_result(&labels, 1.0, 1.0);
    let scrape = String::from_utf8(metrics.render()).expect("UTF-8");
    let exported: BTreeSet<String> = scrape
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect();
    assert!(exported.len() > 30, "{exported:?}");
    let documented = readme_metrics(&exported);
    let undocumented: Vec<_> = exported.difference(&documented).collect();
    let gone: Vec<_> = documented.difference(&exported).collect();
    assert!(
        undocumented.is_empty() && gone.is_empty(),
        "exported but not in the README's table: {undocumented:?}\nin the table but not exported: {gone:?}"
    );
}

// --- The crates point one way -------------------------------------------------------------

/// What `cargo ARGS` (run in the repository's root) prints; it must succeed.
fn cargo_output(args: &[&str]) -> Vec<u8> {
    let out = std::process::Command::new(env!("CARGO"))
        .args(args)
        .current_dir(root())
        .output()
        .unwrap_or_else(|e| panic!("cargo {args:?} runs: {e}"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// `cargo metadata` of the workspace: the packages and the resolved graph.
fn metadata() -> serde_json::Value {
    serde_json::from_slice(&cargo_output(&[
        "metadata",
        "--format-version",
        "1",
        "--offline",
    ]))
    .expect("cargo metadata's JSON")
}

/// The workspace's members in the order the workspace's Cargo.toml lists them (the
/// pipeline's order; the plugins after).
fn members_in_order() -> Vec<String> {
    let manifest: toml::Table = toml::from_str(&read(Path::new("Cargo.toml"))).expect("Cargo.toml");
    manifest["workspace"]["members"]
        .as_array()
        .expect("members")
        .iter()
        .filter_map(|m| m.as_str())
        .map(|dir| {
            let m: toml::Table =
                toml::from_str(&read(&Path::new(dir).join("Cargo.toml"))).expect("a manifest");
            m["package"]["name"].as_str().expect("a name").to_string()
        })
        .collect()
}

/// Each package's normal and build dependencies (not dev-dependencies: tests may reach
/// further), by name.
fn normal_dependencies(meta: &serde_json::Value) -> BTreeMap<String, BTreeSet<String>> {
    let names: BTreeMap<&str, &str> = meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|p| {
            (
                p["id"].as_str().unwrap_or(""),
                p["name"].as_str().unwrap_or(""),
            )
        })
        .collect();
    let mut deps = BTreeMap::new();
    for node in meta["resolve"]["nodes"].as_array().expect("nodes") {
        let name = names[node["id"].as_str().unwrap_or("")].to_string();
        let set: BTreeSet<String> = node["deps"]
            .as_array()
            .expect("deps")
            .iter()
            .filter(|d| {
                d["dep_kinds"].as_array().is_some_and(|k| {
                    k.iter()
                        .any(|k| k["kind"].is_null() || k["kind"] == "build")
                })
            })
            .map(|d| names[d["pkg"].as_str().unwrap_or("")].to_string())
            .collect();
        deps.insert(name, set);
    }
    deps
}

/// Everything `crate_name` reaches through normal and build dependencies.
fn closure(deps: &BTreeMap<String, BTreeSet<String>>, crate_name: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![crate_name.to_string()];
    while let Some(c) = todo.pop() {
        for d in deps.get(&c).into_iter().flatten() {
            if seen.insert(d.clone()) {
                todo.push(d.clone());
            }
        }
    }
    seen
}

#[test]
fn each_crate_depends_only_on_crates_before_it_in_the_pipeline() {
    let order = members_in_order();
    let pipeline = &order[..order
        .iter()
        .position(|m| m == "archplace")
        .expect("the binary")
        + 1];
    let deps = normal_dependencies(&metadata());
    let mut wrong = Vec::new();
    for (i, c) in pipeline.iter().enumerate() {
        for d in deps.get(c).into_iter().flatten() {
            if let Some(j) = order.iter().position(|o| o == d)
                && pipeline.contains(d)
                && j >= i
            {
                wrong.push(format!("`{c}` depends on `{d}`, after it in the pipeline"));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_engine_and_the_plugin_host_reach_no_runtime_they_must_not() {
    let deps = normal_dependencies(&metadata());
    let forbidden: [(&str, &[&str]); 3] = [
        (
            "archplace-engine",
            &[
                "wasmtime",
                "wasmtime-wasi",
                "tokio",
                "hyper",
                "notify",
                "prometheus",
                "async-nats",
                "plotters",
                "archplace-util",
                "archplace-cost-port",
                "archplace-plugin-host",
                "archplace-spec",
                "archplace-job",
                "archplace-pool",
                "archplace-service",
                "archplace",
            ],
        ),
        (
            "archplace-plugin-host",
            &[
                "good_lp",
                "highs",
                "hyper",
                "notify",
                "prometheus",
                "async-nats",
                "archplace-engine",
                "archplace-spec",
                "archplace-job",
                "archplace-pool",
                "archplace-service",
                "archplace",
            ],
        ),
        (
            "archplace-spec",
            &[
                "wasmtime",
                "tokio",
                "hyper",
                "notify",
                "prometheus",
                "async-nats",
                "archplace-plugin-host",
            ],
        ),
    ];
    let mut found = Vec::new();
    for (c, banned) in forbidden {
        let reach = closure(&deps, c);
        for b in banned {
            if reach.contains(*b) {
                found.push(format!("`{c}` reaches `{b}`"));
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// How a package selection compiles each crate: the distinct `name version [features]`
/// lines of `cargo tree`, each marked `host` (proc macros, build scripts and what they
/// use, which resolve their features apart) or `target` — a crate may be compiled once
/// for each.
fn compiled_crates(selection: &[&str]) -> BTreeSet<String> {
    let args: Vec<&str> = ["tree", "--offline", "--format", "{p} [{f}]"]
        .into_iter()
        .chain(selection.iter().copied())
        .collect();
    let stdout = cargo_output(&args);
    // The tree is drawn four characters a level; a `[build-dependencies]` line, drawn one
    // level left of the children it heads, starts the build dependencies of a node.
    let mut host_at_depth: Vec<bool> = Vec::new();
    let mut build_section_at_depth: Vec<bool> = Vec::new();
    let mut crates = BTreeSet::new();
    for line in String::from_utf8_lossy(&stdout).lines() {
        let start = line
            .chars()
            .position(|c| !matches!(c, ' ' | '│' | '├' | '└' | '─'))
            .unwrap_or(0);
        let text: String = line.chars().skip(start).collect();
        if text.is_empty() {
            continue;
        }
        if text.starts_with('[') {
            let depth = start / 4 + 1;
            build_section_at_depth.resize(depth + 1, false);
            build_section_at_depth[depth] = text == "[build-dependencies]";
            continue;
        }
        let depth = start / 4;
        let parent_host = depth > 0 && host_at_depth.get(depth - 1).copied().unwrap_or(false);
        let in_build_section = build_section_at_depth.get(depth).copied().unwrap_or(false);
        let host = parent_host || in_build_section || text.contains(" (proc-macro)");
        host_at_depth.resize(depth + 1, false);
        host_at_depth[depth] = host;
        // A new node: the sections of its children start afresh.
        build_section_at_depth.truncate(depth + 1);
        let side = if host { "host" } else { "target" };
        crates.insert(format!("{side}: {}", text.trim_end_matches(" (*)")));
    }
    crates
}

#[test]
fn the_tests_wheel_shares_the_workspace_test_build() {
    // scripts/test builds the wheel (`maturin build`, this package alone, with
    // `workspace-features`) after `cargo test --workspace --all-targets`: every crate the
    // wheel compiles must be compiled the same way there, or it is compiled twice (minutes
    // of CI). python/Cargo.toml's `workspace-features` names the differences.
    let workspace = compiled_crates(&["--workspace", "--edges", "normal,build,dev"]);
    let wheel = compiled_crates(&[
        "--package",
        "archplace-python",
        "--features",
        "workspace-features",
        "--edges",
        "normal,build",
    ]);
    let differ: Vec<_> = wheel
        .iter()
        .filter(|l| !l.starts_with("target: archplace-python ") && !workspace.contains(*l))
        .collect();
    assert!(
        differ.is_empty(),
        "the wheel for the tests compiles these crates with other features than the workspace's \
         test build (`cargo tree -e features -i CRATE` says who turns them on there; add them \
         to `workspace-features` in python/Cargo.toml):\n{}",
        differ
            .iter()
            .map(|l| {
                let name = l.split(' ').take(3).collect::<Vec<_>>().join(" ");
                let there: Vec<_> = workspace
                    .iter()
                    .filter(|w| w.starts_with(&format!("{name} ")))
                    .collect();
                format!("  {l}\n    in the workspace's build: {there:?}")
            })
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(wheel.len() > 100, "{wheel:?}");
}

// --- clippy's settings carry the invariants ----------------------------------------------

/// The `path`s of a clippy.toml's `key` list.
fn clippy_list(config: &toml::Table, key: &str) -> BTreeSet<String> {
    config
        .get(key)
        .and_then(|v| v.as_array())
        .into_iter()
        .flatten()
        .filter_map(|e| e.get("path").and_then(|p| p.as_str()).map(str::to_string))
        .collect()
}

/// Clippy reads the nearest `clippy.toml` only, so every one of them must carry the
/// workspace's rules (the bounded reader, clamped durations, argument counts, prints in
/// tests only); the engine's adds its I/O ban and the service's its lock rule
/// (ARCHITECTURE.md, invariants 2, 5 and 7). Without this, a crate given its own
/// clippy.toml would silently drop a rule.
#[test]
fn every_clippy_toml_carries_the_workspace_rules() {
    let configs = files(&["clippy.toml", "*/clippy.toml"]);
    assert!(
        configs.len() >= 3,
        "the workspace's, the engine's and the service's: {configs:?}"
    );
    let mut wrong = Vec::new();
    for path in &configs {
        let config: toml::Table =
            toml::from_str(&read(path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let methods = clippy_list(&config, "disallowed-methods");
        for m in [
            "std::fs::read",
            "std::fs::read_to_string",
            "std::time::Duration::from_secs_f64",
        ] {
            if !methods.contains(m) {
                wrong.push(format!(
                    "{}: `{m}` is not a disallowed method",
                    path.display()
                ));
            }
        }
        for (key, want) in [
            ("too-many-arguments-threshold", toml::Value::Integer(6)),
            ("allow-print-in-tests", toml::Value::Boolean(true)),
        ] {
            if config.get(key) != Some(&want) {
                wrong.push(format!("{}: `{key}` is not {want}", path.display()));
            }
        }
    }
    let engine: toml::Table = toml::from_str(&read(Path::new("engine/clippy.toml"))).unwrap();
    let methods = clippy_list(&engine, "disallowed-methods");
    let types = clippy_list(&engine, "disallowed-types");
    let macros = clippy_list(&engine, "disallowed-macros");
    for m in [
        "std::fs::write",
        "std::fs::File::open",
        "std::net::TcpStream::connect",
        "std::process::Command::new",
        "std::env::var",
    ] {
        if !methods.contains(m) {
            wrong.push(format!("engine/clippy.toml: `{m}` is allowed"));
        }
    }
    for t in [
        "std::fs::File",
        "std::net::TcpStream",
        "std::process::Command",
    ] {
        if !types.contains(t) {
            wrong.push(format!("engine/clippy.toml: type `{t}` is allowed"));
        }
    }
    for m in ["std::println", "std::eprintln", "std::dbg"] {
        if !macros.contains(m) {
            wrong.push(format!("engine/clippy.toml: `{m}!` is allowed"));
        }
    }
    let service: toml::Table = toml::from_str(&read(Path::new("service/clippy.toml"))).unwrap();
    let types = clippy_list(&service, "disallowed-types");
    for t in ["std::sync::Mutex", "std::sync::RwLock"] {
        if !types.contains(t) {
            wrong.push(format!("service/clippy.toml: `{t}` is allowed"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The README's paragraph on alerts names exactly the alerts `config/prometheus/alerts.yml`
/// defines (each in italics, `*ArchplaceName*`).
#[test]
fn the_readmes_alert_list_is_the_alert_rules() {
    let rules: BTreeSet<String> = read(Path::new("config/prometheus/alerts.yml"))
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert:"))
        .map(|name| name.trim().to_string())
        .collect();
    let readme = read(Path::new("README.md"));
    let paragraph = readme
        .split("\n\n")
        .find(|p| p.starts_with("**Prometheus and alerts.**"))
        .expect("the README's paragraph on alerts");
    let named: BTreeSet<String> = paragraph
        .split('*')
        .filter(|w| w.starts_with("Archplace") && w.chars().all(char::is_alphanumeric))
        .map(str::to_string)
        .collect();
    assert!(rules.len() >= 10, "{rules:?}");
    assert_eq!(
        named, rules,
        "alerts the README names (left) against alerts.yml (right)"
    );
}
