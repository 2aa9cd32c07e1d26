//! Where plugins are found: configured folders, each plugin in a subfolder with a small
//! manifest, `plugin.toml`, next to its component:
//!
//! ```toml
//! name = "reference"          # what specs call it
//! version = "0.1.0"           # semver; a spec may ask for a range
//! interface = "1.0"           # archplace:cost-model version it was built for
//! file = "reference.wasm"     # in the manifest's folder (default: <name>.wasm)
//! blake3 = "9f2c…"            # optional: the component's hash; a differing file is refused
//! description = "…"           # optional
//! ```
//!
//! `archplace plugin install` writes both from a `.wasm` file.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The manifest's file name inside a plugin's folder.
pub const MANIFEST: &str = "plugin.toml";

/// A manifest as written.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// The plugin's name, as specs name it.
    pub name: String,
    /// Its version (semver).
    pub version: String,
    /// The interface version it was built for (`1.0`).
    pub interface: String,
    /// The component's file name in the plugin's folder (default `NAME.wasm`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// The component's blake3 hash, hex: a different file is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blake3: Option<String>,
    /// What the plugin models, for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// A plugin found in a folder.
#[derive(Debug, Clone, Serialize)]
pub struct Entry {
    /// Its manifest as written.
    pub manifest: Manifest,
    /// The manifest's version, parsed.
    #[serde(skip)]
    pub version: semver::Version,
    /// The manifest's path.
    pub manifest_path: PathBuf,
    /// The component's path.
    pub wasm_path: PathBuf,
}

/// A manifest that could not be used; reported, never fatal.
#[derive(Debug, Clone, Serialize)]
pub struct BadManifest {
    /// The manifest.
    pub path: PathBuf,
    /// What is wrong with it.
    pub message: String,
}

/// Every plugin in the configured folders.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Catalog {
    /// The folders searched, first first.
    pub dirs: Vec<PathBuf>,
    /// The usable plugins.
    pub entries: Vec<Entry>,
    /// The manifests that could not be used.
    pub problems: Vec<BadManifest>,
}

/// Why a plugin a spec names is not in the catalog.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FindError {
    /// No plugin of that name.
    #[error("no plugin named `{name}` in {dirs}{known}")]
    NotFound {
        /// The name asked for.
        name: String,
        /// The folders searched, for the message.
        dirs: String,
        /// The plugins there are (or a closest name), for the message.
        known: String,
    },
    /// The plugin is there, but not in a version the requirement accepts.
    #[error("plugin `{name}`: no version matches `{wanted}` (found {found})")]
    NoVersion {
        /// The plugin.
        name: String,
        /// The version requirement.
        wanted: String,
        /// The versions installed.
        found: String,
    },
    /// The version requirement does not parse.
    #[error("`{wanted}` is not a version requirement: {message}")]
    BadRequirement {
        /// The requirement as written.
        wanted: String,
        /// Why it does not parse.
        message: String,
    },
}

/// Parses `plugin.toml` text; `path` locates errors.
pub fn parse_manifest(text: &str, path: &Path) -> Result<(Manifest, semver::Version), String> {
    let m: Manifest = toml::from_str(text).map_err(|e| {
        let at = e
            .span()
            .map(|s| {
                let (l, c) = archplace_plugin_sdk::text::line_column(text, s.start);
                format!(":{l}:{c}")
            })
            .unwrap_or_default();
        format!("{}{at}: {}", path.display(), e.message())
    })?;
    let version = semver::Version::parse(&m.version)
        .map_err(|e| format!("{}: version `{}`: {e}", path.display(), m.version))?;
    if m.name.is_empty()
        || !m
            .name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(format!(
            "{}: name `{}`: use letters, digits, `-` and `_`",
            path.display(),
            m.name
        ));
    }
    if let Some(file) = &m.file {
        let plain = Path::new(file)
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
        if file.is_empty() || !plain {
            return Err(format!(
                "{}: file `{file}`: name a file inside the plugin's folder (no `..`, no absolute path)",
                path.display()
            ));
        }
    }
    Ok((m, version))
}

/// The most bytes of a manifest that are read: a manifest is a few lines.
pub const MAX_MANIFEST_BYTES: u64 = 64 << 10;

/// `entry`'s component path, checked to be inside its plugin's folder once symbolic links
/// are resolved (a manifest may not reach a file elsewhere through a link either).
pub fn component_path(entry: &Entry) -> Result<PathBuf, String> {
    let folder = entry
        .manifest_path
        .parent()
        .and_then(|d| d.canonicalize().ok())
        .ok_or_else(|| "its folder cannot be resolved".to_string())?;
    let real = entry
        .wasm_path
        .canonicalize()
        .map_err(|e| format!("its component {}: {e}", entry.wasm_path.display()))?;
    if !real.starts_with(&folder) {
        return Err(format!(
            "its component {} resolves outside the plugin's folder {}",
            entry.wasm_path.display(),
            folder.display()
        ));
    }
    Ok(real)
}

impl Catalog {
    /// Reads every `*/plugin.toml` under `dirs` (missing folders are skipped).
    pub fn scan(dirs: &[PathBuf]) -> Catalog {
        let mut cat = Catalog {
            dirs: dirs.to_vec(),
            ..Catalog::default()
        };
        for dir in dirs {
            let Ok(rd) = std::fs::read_dir(dir) else {
                continue;
            };
            let mut subdirs: Vec<PathBuf> = rd
                .filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.join(MANIFEST).is_file())
                .collect();
            subdirs.sort();
            for sub in subdirs {
                let path = sub.join(MANIFEST);
                let parsed = archplace_util::files::read_regular(&path, MAX_MANIFEST_BYTES)
                    .map_err(|e| format!("{}: {e}", path.display()))
                    .and_then(|b| {
                        String::from_utf8(b)
                            .map_err(|_| format!("{}: is not UTF-8 text", path.display()))
                    })
                    .and_then(|t| parse_manifest(&t, &path));
                match parsed {
                    Ok((manifest, version)) => {
                        let file = manifest
                            .file
                            .clone()
                            .unwrap_or_else(|| format!("{}.wasm", manifest.name));
                        cat.entries.push(Entry {
                            wasm_path: sub.join(file),
                            manifest,
                            version,
                            manifest_path: path,
                        });
                    }
                    Err(message) => cat.problems.push(BadManifest { path, message }),
                }
            }
        }
        cat
    }

    /// The highest version of `name` that matches `wanted` (any version if `None`).
    pub fn find(&self, name: &str, wanted: Option<&str>) -> Result<&Entry, FindError> {
        let req = match wanted {
            Some(w) => {
                Some(
                    semver::VersionReq::parse(w).map_err(|e| FindError::BadRequirement {
                        wanted: w.to_string(),
                        message: e.to_string(),
                    })?,
                )
            }
            None => None,
        };
        let named: Vec<&Entry> = self
            .entries
            .iter()
            .filter(|e| e.manifest.name == name)
            .collect();
        if named.is_empty() {
            let mut known: Vec<&str> = self
                .entries
                .iter()
                .map(|e| e.manifest.name.as_str())
                .collect();
            known.sort();
            known.dedup();
            let mut hint = if known.is_empty() {
                String::from(
                    "; no plugins are installed there (build them with scripts/build-plugins, or `archplace plugin install FILE.wasm`)",
                )
            } else {
                format!("; installed: {}", known.join(", "))
            };
            if let Some(p) = self
                .problems
                .iter()
                .find(|p| p.path.parent().and_then(|d| d.file_name()) == Some(name.as_ref()))
            {
                hint.push_str(&format!("; its manifest is unusable: {}", p.message));
            }
            return Err(FindError::NotFound {
                name: name.to_string(),
                dirs: if self.dirs.is_empty() {
                    "(no plugin folders configured)".into()
                } else {
                    self.dirs
                        .iter()
                        .map(|d| d.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                },
                known: hint,
            });
        }
        named
            .iter()
            .filter(|e| req.as_ref().is_none_or(|r| r.matches(&e.version)))
            .max_by(|a, b| a.version.cmp(&b.version))
            .copied()
            .ok_or_else(|| FindError::NoVersion {
                name: name.to_string(),
                wanted: wanted.unwrap_or("*").to_string(),
                found: named
                    .iter()
                    .map(|e| e.version.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }
}

/// The folders searched when none are configured: `$ARCHPLACE_PLUGIN_DIRS` (`:`-separated)
/// if set; else the per-user folder (`$XDG_DATA_HOME/archplace/plugins`, or
/// `~/.local/share/archplace/plugins`), then, relative to the executable,
/// `../lib/archplace/plugins` (an install under `/usr` or `/usr/local`) and `../plugins`
/// (a build in `target/release` or `target/debug`, where `scripts/build-plugins` puts them).
pub fn default_dirs() -> Vec<PathBuf> {
    if let Some(v) = std::env::var_os("ARCHPLACE_PLUGIN_DIRS") {
        return std::env::split_paths(&v)
            .filter(|p| !p.as_os_str().is_empty())
            .collect();
    }
    let mut dirs = Vec::new();
    if let Some(d) = user_dir() {
        dirs.push(d);
    }
    if let Some(exe_dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        dirs.push(exe_dir.join("../lib/archplace/plugins"));
        dirs.push(exe_dir.join("../plugins"));
    }
    dirs
}

/// The per-user plugin folder.
pub fn user_dir() -> Option<PathBuf> {
    std::env::var_os("XDG_DATA_HOME")
        .map(|d| PathBuf::from(d).join("archplace/plugins"))
        .or_else(|| {
            std::env::var_os("HOME")
                .map(|h| PathBuf::from(h).join(".local/share/archplace/plugins"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn install(dir: &Path, sub: &str, manifest: &str) {
        let d = dir.join(sub);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(MANIFEST), manifest).unwrap();
    }

    #[test]
    fn finds_the_highest_matching_version_and_reports_bad_manifests() {
        let dir = tempfile::tempdir().unwrap();
        install(
            dir.path(),
            "a1",
            "name = \"acme\"\nversion = \"1.2.0\"\ninterface = \"1.0\"\n",
        );
        install(
            dir.path(),
            "a2",
            "name = \"acme\"\nversion = \"2.0.1\"\ninterface = \"1.0\"\n",
        );
        install(
            dir.path(),
            "bad",
            "name = \"bad\"\nversion = \"1.0\"\ninterface = \"1.0\"\n",
        );
        install(dir.path(), "typo", "name = \"typo\"\nversoin = \"1.0.0\"\n");
        let cat = Catalog::scan(&[dir.path().to_path_buf()]);
        assert_eq!(cat.entries.len(), 2);
        assert_eq!(cat.problems.len(), 2);
        assert!(
            cat.problems.iter().any(
                |p| p.message.contains("unknown field `versoin`") && p.message.contains(":2:1")
            ),
            "{:?}",
            cat.problems
        );
        assert_eq!(cat.find("acme", None).unwrap().manifest.version, "2.0.1");
        assert_eq!(
            cat.find("acme", Some("1")).unwrap().manifest.version,
            "1.2.0"
        );
        assert_eq!(
            cat.find("acme", Some("1.2")).unwrap().wasm_path,
            dir.path().join("a1/acme.wasm")
        );
        let e = cat.find("acme", Some("3")).unwrap_err().to_string();
        assert!(
            e.contains("no version matches `3` (found 1.2.0, 2.0.1)"),
            "{e}"
        );
        let e = cat.find("nope", None).unwrap_err().to_string();
        assert!(e.contains("installed: acme"), "{e}");
        let e = cat.find("bad", None).unwrap_err().to_string();
        assert!(e.contains("manifest is unusable"), "{e}");
    }

    /// A manifest's `file` once named any path (`../x`, `/etc/shadow`, a FIFO),
    /// and the host read it. Now it must name a file inside the plugin's folder, also once
    /// symbolic links are resolved.
    #[test]
    fn a_component_must_be_a_file_inside_its_plugins_folder() {
        let dir = tempfile::tempdir().unwrap();
        let m = |file: &str| {
            format!("name = \"p\"\nversion = \"1.0.0\"\ninterface = \"1.0\"\nfile = \"{file}\"\n")
        };
        install(dir.path(), "up", &m("../x.wasm"));
        install(dir.path(), "abs", &m("/etc/passwd"));
        install(dir.path(), "link", &m("p.wasm"));
        std::fs::write(dir.path().join("outside.wasm"), b"\0asm").unwrap();
        std::os::unix::fs::symlink(
            dir.path().join("outside.wasm"),
            dir.path().join("link").join("p.wasm"),
        )
        .unwrap();
        let cat = Catalog::scan(&[dir.path().to_path_buf()]);
        let problems: Vec<&str> = cat.problems.iter().map(|p| p.message.as_str()).collect();
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(
            problems
                .iter()
                .all(|p| p.contains("inside the plugin's folder")),
            "{problems:?}"
        );
        let e = component_path(cat.find("p", None).unwrap()).unwrap_err();
        assert!(e.contains("outside the plugin's folder"), "{e}");
    }
}
