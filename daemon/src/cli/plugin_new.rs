//! `archplace plugin new NAME`: a plugin project that builds anywhere.
//!
//! The project is the vendor template with NAME filled in everywhere (package, component
//! file, the name specs use — the template takes it from the package name), and the SDK of
//! this archplace vendored beside it (`archplace-plugin-sdk/`), so that it builds outside
//! archplace's repository, offline of it, against exactly the interface this archplace
//! hosts. The files are compiled into the binary; nothing is downloaded but the SDK's own
//! dependencies from crates.io.

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};

/// (path in the project, contents) of the template.
const TEMPLATE: [(&str, &str); 3] = [
    (
        "Cargo.toml",
        include_str!("../../../plugins/template/Cargo.toml"),
    ),
    (
        "Cargo.lock",
        include_str!("../../../plugins/template/Cargo.lock"),
    ),
    (
        "src/lib.rs",
        include_str!("../../../plugins/template/src/lib.rs"),
    ),
];

/// The SDK's sources, as `plugin-sdk/` has them.
const SDK: [(&str, &str); 9] = [
    ("Cargo.toml", include_str!("../../../plugin-sdk/Cargo.toml")),
    ("README.md", include_str!("../../../plugin-sdk/README.md")),
    ("src/lib.rs", include_str!("../../../plugin-sdk/src/lib.rs")),
    (
        "src/guest.rs",
        include_str!("../../../plugin-sdk/src/guest.rs"),
    ),
    (
        "src/gpus.rs",
        include_str!("../../../plugin-sdk/src/gpus.rs"),
    ),
    (
        "src/text.rs",
        include_str!("../../../plugin-sdk/src/text.rs"),
    ),
    (
        "src/units.rs",
        include_str!("../../../plugin-sdk/src/units.rs"),
    ),
    (
        "src/testing.rs",
        include_str!("../../../plugin-sdk/src/testing.rs"),
    ),
    (
        "wit/cost-model.wit",
        include_str!("../../../plugin-sdk/wit/cost-model.wit"),
    ),
];

/// The template's dependency on the SDK in archplace's repository, and what a new project
/// has instead.
const IN_REPOSITORY: &str = "# Outside this repository, depend on a released SDK instead, e.g.
# archplace-plugin-sdk = { git = \"https://example.invalid/archplace\", tag = \"v0.1.0\" }
archplace-plugin-sdk = { path = \"../../plugin-sdk\" }";
const VENDORED: &str =
    "# The SDK of the archplace that wrote this project (`archplace plugin new`), vendored in
# `archplace-plugin-sdk/`: it builds without archplace's repository. For a newer interface,
# copy the folder from a newer `archplace plugin new`.
archplace-plugin-sdk = { path = \"archplace-plugin-sdk\" }";

/// Whether `name` can name a plugin and its package: lower-case letters, digits and `-`,
/// starting with a letter, at most 64 characters.
fn valid(name: &str) -> bool {
    name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.ends_with('-')
}

/// Writes the project `dir/name/`; returns its path. Refuses a folder that exists.
pub fn create(name: &str, dir: &Path) -> Result<PathBuf> {
    if !valid(name) {
        bail!(
            "`{name}` cannot name a plugin: use lower-case letters, digits and `-`, starting with a letter (e.g. `acme-npu`)"
        );
    }
    let root = dir.join(name);
    if root.exists() {
        bail!(
            "{} exists already: choose another name or --dir",
            root.display()
        );
    }
    let crate_name = name.replace('-', "_");
    let fill = |text: &str| {
        text.replace(IN_REPOSITORY, VENDORED)
            .replace("my-cost-model", name)
            .replace("my_cost_model", &crate_name)
    };
    let mut files: Vec<(PathBuf, String)> = TEMPLATE
        .iter()
        .map(|(p, text)| (root.join(p), fill(text)))
        .collect();
    files.extend(
        SDK.iter()
            .map(|(p, text)| (root.join("archplace-plugin-sdk").join(p), text.to_string())),
    );
    files.push((root.join(".gitignore"), "/target\n".to_string()));
    for (path, text) in &files {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        archplace_util::atomic::write(path, text.as_bytes())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(root)
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)]
mod tests {
    use super::*;

    #[test]
    fn the_template_still_has_what_is_replaced() {
        assert!(TEMPLATE[0].1.contains(IN_REPOSITORY));
        assert!(
            TEMPLATE
                .iter()
                .all(|(_, t)| !t.contains("example.invalid") || t.contains(IN_REPOSITORY))
        );
        assert!(TEMPLATE[2].1.contains("env!(\"CARGO_PKG_NAME\")"));
    }

    #[test]
    fn names_a_plugin_project_everywhere() {
        let tmp = tempfile::tempdir().unwrap();
        let root = create("acme-npu", tmp.path()).unwrap();
        let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
        assert!(manifest.contains("name = \"acme-npu\""), "{manifest}");
        assert!(
            manifest.contains("path = \"archplace-plugin-sdk\""),
            "{manifest}"
        );
        assert!(!manifest.contains("my-cost-model") && !manifest.contains("../../"));
        assert!(manifest.contains("acme_npu.wasm"), "{manifest}");
        let lib = std::fs::read_to_string(root.join("src/lib.rs")).unwrap();
        assert!(!lib.contains("my-cost-model"), "{lib}");
        let sdk = std::fs::read_to_string(root.join("archplace-plugin-sdk/Cargo.toml")).unwrap();
        assert!(
            !sdk.contains(".workspace") && !sdk.contains("workspace = true"),
            "{sdk}"
        );
        assert!(
            root.join("archplace-plugin-sdk/wit/cost-model.wit")
                .is_file()
        );
        // Not over an existing project; not a bad name.
        assert!(create("acme-npu", tmp.path()).is_err());
        for bad in ["Acme", "1npu", "a_b", "npu-", ""] {
            assert!(create(bad, tmp.path()).is_err(), "{bad}");
        }
    }

    /// The SDK's manifest is written out, not inherited: its version must follow the
    /// workspace's by hand.
    #[test]
    fn the_sdk_has_the_workspace_version() {
        let line = format!("version = \"{}\"", env!("CARGO_PKG_VERSION"));
        assert!(
            SDK[0].1.lines().any(|l| l == line),
            "plugin-sdk/Cargo.toml: {line}?"
        );
    }

    /// The SDK's sources are all here: a file added to `plugin-sdk/src` must be added to
    /// [`SDK`], or vendored projects would not build.
    #[test]
    fn every_sdk_source_is_vendored() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugin-sdk/src");
        for e in std::fs::read_dir(src).unwrap() {
            let name = format!("src/{}", e.unwrap().file_name().to_string_lossy());
            assert!(SDK.iter().any(|(p, _)| *p == name), "{name} is not in SDK");
        }
    }
}
