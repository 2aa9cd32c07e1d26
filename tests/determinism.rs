//! Determinism: with the solver bounded by work (branch-and-bound nodes, the default), not
//! by the clock, a search's result depends only on the spec, the cost models and
//! archplace's version — not on the load, the thread count or the time it took (four runs
//! of the default spec once gave four results). The default spec is searched on one
//! thread, on two, and on two while busy processes compete for both cores; the results must
//! be identical byte for byte, but for the timings and work counters (how long it took and
//! how much was cached describe the run, not the search).
//!
//! Its own test binary: the load it makes must not disturb other tests' timings.

use crate::util::*;
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// The embedded default spec, as is: the spec that once gave four results in four runs
/// under the old wall-clock limit.
fn spec() -> String {
    std::fs::read_to_string(root().join("spec/src/default.toml")).unwrap()
}

/// `result.json` without timings and work counters, and `explored.jsonl`, as bytes.
fn outcome(dir: &Path) -> (Vec<u8>, Vec<u8>) {
    let mut doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("result.json")).unwrap()).unwrap();
    let o = doc.as_object_mut().unwrap();
    assert_eq!(
        o["work"]["mip_time_limit_hits"], 0,
        "the safety net was reached"
    );
    o.remove("timings");
    o.remove("work");
    (
        serde_json::to_vec_pretty(&doc).unwrap(),
        std::fs::read(dir.join("explored.jsonl")).unwrap(),
    )
}

fn search(spec: &Path, out: &Path, threads: &str) {
    let o = archplace()
        .args(["run"])
        .arg(spec)
        .arg("--out")
        .arg(out)
        .args(["--threads", threads])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// Busy processes, one per core and one more, until dropped.
struct Load(Vec<Child>);

impl Load {
    fn new() -> Load {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        Load(
            (0..=cores)
                .map(|_| {
                    Command::new("sh")
                        .args(["-c", "while :; do :; done"])
                        .stdout(Stdio::null())
                        .spawn()
                        .unwrap()
                })
                .collect(),
        )
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn the_same_spec_gives_the_same_result_under_any_load_and_thread_count() {
    let _gate = crate::util::alone();
    let tmp = tempfile::tempdir().unwrap();
    let spec_path = tmp.path().join("default.toml");
    std::fs::write(&spec_path, spec()).unwrap();
    let quiet = tmp.path().join("one-thread");
    search(&spec_path, &quiet, "1");
    let two = tmp.path().join("two-threads");
    search(&spec_path, &two, "2");
    let loaded = tmp.path().join("two-threads-loaded");
    {
        let _load = Load::new();
        search(&spec_path, &loaded, "2");
    }
    let want = outcome(&quiet);
    assert!(!want.1.is_empty());
    assert!(want.0 == outcome(&two).0, "two threads changed result.json");
    assert!(
        want.1 == outcome(&two).1,
        "two threads changed explored.jsonl"
    );
    assert!(want.0 == outcome(&loaded).0, "load changed result.json");
    assert!(want.1 == outcome(&loaded).1, "load changed explored.jsonl");
}
