//! `archplace plugin …`: check, list and install cost-model plugins.

use super::{Exit, print_json};
use anyhow::{Context, Result, bail};
use archplace_plugin_host::catalog::{self, MANIFEST, Manifest};
use archplace_plugin_host::{Host, HostOptions, check};
use archplace_plugin_sdk::Parameter;
use std::path::{Path, PathBuf};

/// Options shared by every command that loads plugins.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct PluginArgs {
    /// Folder of installed plugins (repeatable), searched before the default folders:
    /// $ARCHPLACE_PLUGIN_DIRS, or ~/.local/share/archplace/plugins, ../lib/archplace/plugins
    /// and ../plugins next to the executable.
    #[arg(long = "plugin-dir", global = true, value_name = "DIR")]
    pub plugin_dirs: Vec<PathBuf>,
    /// Folder of compiled plugins (default: $ARCHPLACE_CACHE_DIR or ~/.cache/archplace,
    /// then compiled-plugins).
    #[arg(long, global = true, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Compile plugins on every start instead of caching them.
    #[arg(long, global = true)]
    pub no_cache: bool,
}

impl PluginArgs {
    pub fn options(&self) -> HostOptions {
        let mut o = HostOptions::defaults();
        if !self.plugin_dirs.is_empty() {
            // Added to the defaults, first: a vendor testing a build still has the
            // installed plugins.
            let mut dirs = self.plugin_dirs.clone();
            dirs.extend(
                o.plugin_dirs
                    .into_iter()
                    .filter(|d| !self.plugin_dirs.contains(d)),
            );
            o.plugin_dirs = dirs;
        }
        if let Some(d) = &self.cache_dir {
            o.cache_dir = Some(archplace_plugin_host::cache::dir_in(d));
        }
        if self.no_cache {
            o.cache_dir = None;
        }
        o
    }

    pub fn host(&self) -> Result<Host> {
        Host::new(self.options()).context("starting the plugin host")
    }
}

#[derive(Debug, clap::Subcommand)]
pub enum PluginCommand {
    /// Load a component the way the daemon would, print its info, run a golden batch,
    /// check determinism and limits, time it; exit 1 with the reasons if it is unfit.
    Check(CheckArgs),
    /// List the plugins in the plugin folders (and unusable manifests).
    List(ListArgs),
    /// Check a component, then install it with a manifest into a plugin folder.
    Install(InstallArgs),
    /// Print the WIT interface plugins implement.
    Wit,
    /// Write a new plugin project: the template with NAME filled in everywhere and this
    /// archplace's SDK vendored beside it, ready for `cargo build --release --target
    /// wasm32-wasip2` anywhere.
    New(NewArgs),
}

/// `archplace plugin check`.
#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// The component (`.wasm`).
    pub file: PathBuf,
    /// A parameter for the plugin, NAME=VALUE (repeatable).
    #[arg(long = "param", value_name = "NAME=VALUE")]
    pub params: Vec<String>,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// `archplace plugin list`.
#[derive(Debug, clap::Args)]
pub struct ListArgs {
    #[arg(long)]
    pub json: bool,
}

/// `archplace plugin install`.
#[derive(Debug, clap::Args)]
pub struct InstallArgs {
    pub file: PathBuf,
    /// Folder to install into (default: the per-user plugin folder).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Record the component's hash in the manifest: a changed file is then refused.
    #[arg(long)]
    pub pin: bool,
    /// Replace a different component installed under the same name and version (a
    /// pin is kept, on the new component's hash).
    #[arg(long)]
    pub force: bool,
}

/// `archplace plugin new`.
#[derive(Debug, clap::Args)]
pub struct NewArgs {
    /// The plugin's name (and package name): lower-case letters, digits and `-`.
    pub name: String,
    /// Folder to create the project in (default: the current folder).
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

fn parse_params(params: &[String]) -> Result<Vec<Parameter>> {
    params
        .iter()
        .map(|p| match p.split_once('=') {
            Some((n, v)) if !n.trim().is_empty() => Ok(Parameter {
                name: n.trim().to_string(),
                value: v.trim().to_string(),
            }),
            _ => bail!("--param `{p}`: write NAME=VALUE, e.g. clock=\"1.2 GHz\""),
        })
        .collect()
}

pub fn run(cmd: &PluginCommand, args: &PluginArgs) -> Result<Exit> {
    match cmd {
        PluginCommand::Check(a) => check(a, args),
        PluginCommand::List(a) => list(a, args),
        PluginCommand::Install(a) => install_checked(a, args),
        PluginCommand::New(a) => {
            let dir = a.dir.as_deref().unwrap_or(Path::new("."));
            let root = super::plugin_new::create(&a.name, dir)?;
            outln!("created {}", root.display())?;
            errln!(
                "next: cd {} && rustup target add wasm32-wasip2 && cargo build --release --target wasm32-wasip2 && archplace plugin check target/wasm32-wasip2/release/{}.wasm",
                root.display(),
                a.name.replace('-', "_")
            );
            Ok(Exit::Success)
        }
        PluginCommand::Wit => {
            use std::io::Write;
            std::io::stdout()
                .lock()
                .write_all(archplace_plugin_sdk::WIT.as_bytes())?;
            Ok(Exit::Success)
        }
    }
}

/// `archplace plugin check`: the report; `Problems` when the component is unfit.
fn check(a: &CheckArgs, args: &PluginArgs) -> Result<Exit> {
    let (file, json) = (&a.file, a.json);
    let host = args.host()?;
    let params = parse_params(&a.params)?;
    let report = match check::check(&host, file, &params) {
        Ok(r) => r,
        Err(e) => {
            if json {
                print_json(&serde_json::json!({
                    "path": file.display().to_string(),
                    "fit": false,
                    "problems": [e.to_string()],
                }))?;
            }
            bail!("{} is not fit to use: {e}", file.display());
        }
    };
    if json {
        print_json(&report)?;
    } else {
        print_report(&report)?;
    }
    if report.fit {
        Ok(Exit::Success)
    } else {
        errln!(
            "error: {} is not fit to use: {}",
            file.display(),
            report.problems.join("; ")
        );
        Ok(Exit::Problems)
    }
}

/// `archplace plugin list`.
/// Whether an installed plugin's file is the component its manifest pins: `None` without
/// a pin, `Some(false)` when the file differs or cannot be read (the host refuses it).
fn pin_matches(e: &catalog::Entry) -> Option<bool> {
    let pin = e.manifest.blake3.as_deref()?;
    let bytes = archplace_util::files::read_regular(
        &e.wasm_path,
        archplace_plugin_host::MAX_COMPONENT_BYTES,
    );
    Some(bytes.is_ok_and(|b| blake3::hash(&b).to_hex().as_str() == pin))
}

/// One line of `plugin list --json`: the catalog's entry and whether its pin holds.
#[derive(serde::Serialize)]
struct Listed<'a> {
    #[serde(flatten)]
    entry: &'a catalog::Entry,
    /// `null` without a pin; `false`: the file is not the pinned component.
    pin_matches: Option<bool>,
}

/// `plugin list --json`: the catalog with each entry's pin checked.
#[derive(serde::Serialize)]
struct Listing<'a> {
    dirs: &'a [PathBuf],
    entries: Vec<Listed<'a>>,
    problems: &'a [catalog::BadManifest],
}

fn list(a: &ListArgs, args: &PluginArgs) -> Result<Exit> {
    let host = args.host()?;
    let cat = host.catalog();
    if a.json {
        print_json(&Listing {
            dirs: &cat.dirs,
            entries: cat
                .entries
                .iter()
                .map(|entry| Listed {
                    entry,
                    pin_matches: pin_matches(entry),
                })
                .collect(),
            problems: &cat.problems,
        })?;
        return Ok(Exit::Success);
    }
    outln!(
        "plugin folders: {}",
        cat.dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )?;
    if cat.entries.is_empty() {
        outln!("no plugins installed")?;
    }
    for e in &cat.entries {
        outln!(
            "{:<24} {:<10} interface {:<5} {}{}",
            e.manifest.name,
            e.manifest.version,
            e.manifest.interface,
            e.wasm_path.display(),
            match pin_matches(e) {
                Some(false) =>
                    "  (pinned component changed: the file is not the one its manifest's blake3 names; specs naming it fail — reinstall it)",
                _ => "",
            }
        )?;
    }
    for p in &cat.problems {
        outln!("unusable manifest: {}", p.message)?;
    }
    Ok(Exit::Success)
}

/// `archplace plugin install`: checked first, then installed.
fn install_checked(a: &InstallArgs, args: &PluginArgs) -> Result<Exit> {
    let file = &a.file;
    let host = args.host()?;
    let report =
        check::check(&host, file, &[]).with_context(|| format!("checking {}", file.display()))?;
    if !report.fit {
        bail!(
            "{} is not fit to use: {}",
            file.display(),
            report.problems.join("; ")
        );
    }
    let root = match &a.dir {
        Some(d) => d.clone(),
        None => {
            catalog::user_dir().context("no per-user plugin folder ($HOME unset); give --dir")?
        }
    };
    let installed = install(file, &root, &report, a.pin, a.force)?;
    outln!(
        "installed `{}` {} in {}",
        report.info.name,
        report.info.version,
        installed.display()
    )?;
    if !searched_by_default(&root) {
        errln!(
            "note: {} is not a folder archplace searches by default: give `--plugin-dir {}` to later commands (or list it in ARCHPLACE_PLUGIN_DIRS, or in the daemon config's `plugin_dirs`)",
            root.display(),
            root.display()
        );
    }
    Ok(Exit::Success)
}

/// Whether `dir` is one of the folders searched without `--plugin-dir` (compared as
/// canonical paths, so `./plugins` and its absolute path are the same folder).
fn searched_by_default(dir: &Path) -> bool {
    let canonical = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let dir = canonical(dir);
    catalog::default_dirs().iter().any(|d| canonical(d) == dir)
}

/// Copies the component and writes its manifest into `root/<name>-<version>/`. A different
/// component already there under that name and version is refused unless `force`: a
/// plugin's version names its behaviour (the host's memo and results rely on it), so new
/// bytes need a new version. An existing pin is kept.
fn install(
    file: &Path,
    root: &Path,
    report: &check::Report,
    pin: bool,
    force: bool,
) -> Result<PathBuf> {
    let name = &report.info.name;
    let version = &report.info.version;
    let dir = root.join(format!("{name}-{version}"));
    let wasm =
        archplace_util::files::read_regular(file, archplace_plugin_host::MAX_COMPONENT_BYTES)
            .with_context(|| format!("reading {}", file.display()))?;
    let old_manifest: Option<Manifest> =
        archplace_util::files::read_regular(&dir.join(MANIFEST), catalog::MAX_MANIFEST_BYTES)
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .and_then(|t| toml::from_str(&t).ok());
    let old_file = old_manifest
        .as_ref()
        .and_then(|m| m.file.clone())
        .unwrap_or_else(|| format!("{name}.wasm"));
    if let Ok(old) = archplace_util::files::read_regular(
        &dir.join(&old_file),
        archplace_plugin_host::MAX_COMPONENT_BYTES,
    ) && blake3::hash(&old) != blake3::hash(&wasm)
        && !force
    {
        bail!(
            "a different component is installed as `{name}` {version} in {}: give the new build a new version (its `ModelInfo`), or replace it with --force",
            dir.display()
        );
    }
    let pin = pin || old_manifest.as_ref().is_some_and(|m| m.blake3.is_some());
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    archplace_util::atomic::write(&dir.join(format!("{name}.wasm")), &wasm)
        .with_context(|| format!("writing into {}", dir.display()))?;
    let manifest = Manifest {
        name: name.clone(),
        version: report.info.version.clone(),
        interface: format!(
            "{}.{}",
            report.info.interface_version.0, report.info.interface_version.1
        ),
        file: None,
        blake3: pin.then(|| report.blake3.clone()),
        description: None,
    };
    let text = toml::to_string(&manifest).context("writing the manifest")?;
    archplace_util::atomic::write(&dir.join(MANIFEST), text.as_bytes())
        .with_context(|| format!("writing into {}", dir.display()))?;
    Ok(dir)
}

fn print_report(r: &check::Report) -> std::io::Result<()> {
    let i = &r.info;
    outln!("{} — `{}` {} by {}", r.path, i.name, i.version, i.vendor)?;
    outln!("  interface      {}", r.interface)?;
    outln!("  blake3         {}", r.blake3)?;
    outln!("  size           {} bytes", r.size_bytes)?;
    outln!(
        "  provides       {}{}",
        if i.provides.area { "area " } else { "" },
        if i.provides.latency { "latency" } else { "" }
    )?;
    outln!("  deterministic  {}", i.deterministic)?;
    for p in &i.parameters {
        outln!(
            "  parameter      {} = {:?}  ({})",
            p.name,
            p.default,
            p.description
        )?;
    }
    for c in &i.calibratable {
        outln!(
            "  calibratable   {} in [{}, {}]{}{}",
            c.name,
            c.lower,
            c.upper,
            if c.unit.is_empty() {
                String::new()
            } else {
                format!(" {}", c.unit)
            },
            if c.fit { ", fitted by default" } else { "" }
        )?;
    }
    outln!(
        "  load           {:.1} ms compiling or from the cache, {:.2} ms from the disk cache",
        r.compile_seconds * 1e3,
        r.cached_load_seconds * 1e3
    )?;
    outln!(
        "  golden batch   {} configurations ({} outside the model's domain), {} latency calls, {} operators",
        r.configurations,
        r.configurations_out_of_domain,
        r.latency_calls,
        r.operators_estimated
    )?;
    outln!(
        "  memory times   {} of {} GEMMs and vector operators",
        r.operators_with_memory_time,
        r.operators_with_memory_time + r.operators_without_memory_time
    )?;
    outln!(
        "  speed          {:.3} µs and {:.0} fuel per operator; at most {:.1}% of a call's fuel budget",
        r.seconds_per_operator * 1e6,
        r.fuel_per_operator,
        r.max_fuel_fraction * 100.0
    )?;
    outln!("  digest         {}", r.digest)?;
    for w in &r.warnings {
        outln!("  warning        {w}")?;
    }
    for p in &r.problems {
        outln!("  problem        {p}")?;
    }
    outln!(
        "  verdict        {}",
        if r.fit {
            "fit to use"
        } else {
            "NOT fit to use"
        }
    )?;
    Ok(())
}
