//! The harness every end-to-end test shares: the real `archplace` binary with its caches
//! inside `target/`, temporary folders and specs, daemons and NATS servers as child
//! processes, and a gate that lets the few tests that measure timing or load run alone.

pub mod daemon;
pub mod nats;

pub use daemon::Daemon;
pub use nats::Nats;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

/// The repository's root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The binary, with its plugin cache and per-user plugin folder inside `target/`, so the
/// tests neither depend on nor touch the user's.
pub fn archplace() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_archplace"));
    c.env("ARCHPLACE_CACHE_DIR", root().join("target/test-cache"))
        .env("XDG_DATA_HOME", root().join("target/test-data"))
        .env_remove("ARCHPLACE_PLUGIN_DIRS");
    c
}

/// `archplace ARGS`, run to its end.
pub fn run(args: &[&str]) -> Output {
    archplace().args(args).output().expect("archplace runs")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).expect("stdout is UTF-8")
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A component built by `scripts/build-plugins`.
pub fn component(name: &str) -> PathBuf {
    for p in [
        root().join(format!("target/plugins/{name}/{name}.wasm")),
        root().join(format!("target/plugin-fixtures/{name}.wasm")),
    ] {
        if p.is_file() {
            return p;
        }
    }
    panic!("the `{name}` component is not built: run scripts/build-plugins (scripts/test does)");
}

/// Installs the built component `component` into the plugin folder `plugins` as plugin
/// `name` (version 0.1.0) without checking it — as `plugin install` would refuse a hostile
/// fixture: its file and a manifest in `plugins/<name>/`.
pub fn install_unchecked(plugins: &Path, component_name: &str, name: &str) {
    let inst = plugins.join(name);
    std::fs::create_dir_all(&inst).unwrap();
    std::fs::copy(component(component_name), inst.join(format!("{name}.wasm")))
        .expect("the fixtures are built by scripts/build-plugins");
    std::fs::write(
        inst.join("plugin.toml"),
        format!("name = \"{name}\"\nversion = \"0.1.0\"\ninterface = \"1.0\"\n"),
    )
    .unwrap();
}

/// The folder of the plugins `scripts/build-plugins` installs.
pub fn plugin_dir() -> String {
    root().join("target/plugins").display().to_string()
}

/// A spec whose exhaustive search (two candidates) takes a second or two, even in a debug
/// build.
pub const TINY: &str = include_str!("../fixtures/tiny.toml");

/// The embedded default spec, as is.
pub fn default_spec() -> String {
    std::fs::read_to_string(root().join("spec/src/default.toml")).expect("the default spec")
}

/// The default spec searched exhaustively: minutes of search (about six on this machine's
/// debug build), so that a test that needs a search still running when it acts — edits,
/// renames, copies, reloads, signals — never races it (the converging default takes under
/// a second, which a loaded machine can spend before the test acts).
pub fn slow_spec() -> String {
    let slow = default_spec().replace("[search]\n", "[search]\nexhaustive = true\n");
    assert_ne!(
        slow,
        default_spec(),
        "the default spec has a [search] table"
    );
    slow
}

/// 128 chips of an 8-layer model (126 fit): about 10 s on one thread of a debug build;
/// every layer schedule bounded by a node limit, so each candidate's result is the same on
/// every machine and in every run. `exhaustive = false` gives a converging walk
/// (`strategy = "converge"`) that stops after two buckets.
pub fn eight_layers(name: &str, exhaustive: bool) -> String {
    let s = TINY
        .replace("name = \"e2e-tiny\"", &format!("name = \"{name}\""))
        .replace("layers = 2", "layers = 8")
        .replace("tensor_cores = [1, 2]", "tensor_cores = [1, 2, 4, 8]")
        .replace("vector_cores = [1]", "vector_cores = [1, 2]")
        .replace("width = [16]", "width = [16, 32, 64, 128]")
        .replace("depth = [16]", "depth = [16, 32, 64, 128]")
        .replace(
            "schedule_time_limit_seconds = 0.05",
            "schedule_time_limit_seconds = 60\nschedule_node_limit = 200",
        );
    if exhaustive {
        s
    } else {
        s.replace(
            "exhaustive = true",
            "strategy = \"converge\"\nconvergence_window = 2",
        )
    }
}

/// `text` written to `name` in a new temporary folder.
pub fn temp_spec(name: &str, text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let path = dir.path().join(name);
    std::fs::write(&path, text).expect("the spec is written");
    (dir, path)
}

/// A temporary folder with an empty `specs/` in it (a daemon's working folder).
pub fn folder() -> tempfile::TempDir {
    let tmp = tempfile::Builder::new()
        .prefix("archplace-test-")
        .tempdir()
        .expect("a temporary folder");
    std::fs::create_dir_all(tmp.path().join("specs")).expect("specs/");
    tmp
}

/// The JSON file at `path`.
pub fn read_json(path: &Path) -> serde_json::Value {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A result without what describes the run rather than the search: timings, work
/// counters, candidates resumed.
pub fn comparable(mut doc: serde_json::Value) -> serde_json::Value {
    if let Some(o) = doc.as_object_mut() {
        o.remove("timings");
        o.remove("work");
        if let Some(s) = o.get_mut("search").and_then(|s| s.as_object_mut()) {
            s.remove("resumed_candidates");
            // One machine bounds lazily, a pool every candidate exactly: the same walk.
            s.remove("candidates_bounded_exactly");
        }
    }
    doc
}

/// A free TCP port on the loopback interface.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Waits up to `limit` until `cond` holds, or fails the test saying what it waited for and
/// `context()` (a daemon's log).
pub fn wait_until(
    limit: Duration,
    what: &str,
    mut cond: impl FnMut() -> bool,
    context: impl Fn() -> String,
) {
    let t = Instant::now();
    while !cond() {
        assert!(
            t.elapsed() < limit,
            "timed out waiting for {what}\n{}",
            context()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The gate between the tests that share the machine and the few that measure timing or
/// load the machine on purpose, which run alone: every test takes one or the other first
/// (the test harness runs tests on every core).
static GATE: RwLock<()> = RwLock::new(());

/// A share of the machine, for the test's whole run.
pub fn shared() -> RwLockReadGuard<'static, ()> {
    GATE.read().unwrap_or_else(|e| e.into_inner())
}

/// The whole machine: no other test's process runs while it is held.
pub fn alone() -> RwLockWriteGuard<'static, ()> {
    GATE.write().unwrap_or_else(|e| e.into_inner())
}

/// Each `# ERR FIELD | TEXT` mark on a line of `text` that is not a comment line, as
/// (line, field, text): the mistakes planted in a fixture, where they must be reported.
pub fn planted_mistakes(text: &str) -> Vec<(usize, String, String)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.starts_with('#') {
            continue;
        }
        for mark in line.split("# ERR ").skip(1) {
            let (field, says) = mark.split_once(" | ").expect("`# ERR FIELD | TEXT`");
            out.push((i + 1, field.trim().to_string(), says.trim().to_string()));
        }
    }
    out
}

/// Checks `validate --json ARGS FILE`'s diagnostics against the mistakes planted in FILE
/// (see [`planted_mistakes`]): each found at its line and field, saying its text, and
/// nothing else reported — in one run.
pub fn assert_reports_planted_mistakes(args: &[&str], file: &Path) {
    let text = std::fs::read_to_string(file).unwrap();
    let planted = planted_mistakes(&text);
    assert!(planted.len() >= 10, "{} planted", planted.len());
    let mut all: Vec<&str> = vec!["validate", "--json"];
    all.extend_from_slice(args);
    all.push(file.to_str().unwrap());
    let o = run(&all);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let found: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let mut left: Vec<&serde_json::Value> = found.as_array().unwrap().iter().collect();
    let mut missing = Vec::new();
    for (line, field, says) in &planted {
        let hit = left.iter().position(|d| {
            let words = format!("{} {}", d["message"], d["help"]);
            d["line"].as_u64() == Some(*line as u64)
                && d["field"].as_str() == Some(field.as_str())
                && words.contains(says.as_str())
        });
        match hit {
            Some(k) => {
                left.remove(k);
            }
            None => missing.push(format!("line {line}: {field} `{says}`")),
        }
    }
    assert!(
        missing.is_empty() && left.is_empty(),
        "not reported: {missing:#?}\nreported but not planted: {left:#?}"
    );
}
