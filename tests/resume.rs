//! Resuming an interrupted search from its journal (`job/src/journal.rs`): killed with
//! -9 half-way, `archplace run` evaluates only the candidates the journal lacks (and the
//! best once more: counted in layer schedules, exactly) and gives the identical result;
//! Ctrl-C writes the best result so far, marked partial, and the next run continues it.
//! (It used to compare wall-clock times, resumed ≤ 60% of whole: that depended on the
//! machine's load and on which candidates were left, and failed at 63% on an idle CI
//! machine. The time is still printed.)
//!
//! Its own test binary, so that no other test competes for the CPU while it runs.

use crate::util::*;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Candidates in the journal of `dir` (its lines after the header).
fn journaled(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join("journal.jsonl"))
        .map(|t| t.lines().count().saturating_sub(1))
        .unwrap_or(0)
}

/// Starts `archplace run` into `out` and waits until `at_least` candidates are journaled.
fn run_until(spec: &Path, out: &Path, at_least: usize) -> std::process::Child {
    let mut child = archplace()
        .args(["run"])
        .arg(spec)
        .arg("--out")
        .arg(out)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while journaled(out) < at_least {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before {at_least} candidates"
        );
        assert!(t.elapsed() < Duration::from_secs(300), "too slow");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

#[test]
fn an_interrupted_search_resumes_from_its_journal_with_the_identical_result() {
    let _gate = crate::util::shared();
    let tmp = tempfile::tempdir().unwrap();
    let spec_path = tmp.path().join("resume.toml");
    std::fs::write(&spec_path, eight_layers("resume", true)).unwrap();
    let (whole, killed, stopped) = (
        tmp.path().join("whole"),
        tmp.path().join("killed"),
        tmp.path().join("stopped"),
    );

    // The whole search, uninterrupted.
    let t = Instant::now();
    let o = archplace()
        .args(["run"])
        .arg(&spec_path)
        .arg("--out")
        .arg(&whole)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let full_wall = t.elapsed();
    let full = read_json(&whole.join("result.json"));
    let n = full["search"]["candidates_in_space"].as_u64().unwrap() as usize;
    assert_eq!(
        full["search"]["candidates_evaluated"].as_u64().unwrap() as usize,
        n
    );
    assert!(
        !whole.join("journal.jsonl").exists(),
        "a complete search keeps no journal"
    );

    // Killed (-9) half-way through (by the clock), then run again.
    let mut child = run_until(&spec_path, &killed, 1);
    std::thread::sleep(full_wall / 2);
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!killed.join("result.json").exists());
    let t = Instant::now();
    let o = archplace()
        .args(["run"])
        .arg(&spec_path)
        .arg("--out")
        .arg(&killed)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rest_wall = t.elapsed();
    let resumed = read_json(&killed.join("result.json"));
    let reused = resumed["search"]["resumed_candidates"].as_u64().unwrap() as usize;
    assert!(reused > 0 && reused < n, "{reused} of {n}");
    assert!(String::from_utf8_lossy(&o.stdout).contains("resumed from the journal"));
    let ratio = rest_wall.as_secs_f64() / full_wall.as_secs_f64();
    // What the resumed process did, counted (the wall-clock ratio above depends on the
    // machine's load and on which candidates were left): it scheduled the layers of the
    // candidates the journal did not have, and of the best once more — nothing else.
    let schedules = |r: &serde_json::Value| r["work"]["layer_schedules"].as_u64().unwrap();
    let per_candidate = schedules(&full) / n as u64;
    eprintln!(
        "whole run {full_wall:.2?}, {} layer schedules; killed after {:.2?} at {reused}/{n} candidates; the resumed run {rest_wall:.2?} ({:.0}%), {} layer schedules",
        schedules(&full),
        full_wall / 2,
        100.0 * ratio,
        schedules(&resumed)
    );
    assert_eq!(
        full["search"]["candidates_failed"], 0,
        "every candidate has as many schedules"
    );
    assert_eq!(schedules(&full), per_candidate * n as u64);
    let left = (n - reused) as u64;
    assert!(
        [left, left + 1]
            .map(|c| c * per_candidate)
            .contains(&schedules(&resumed)),
        "the resumed run scheduled more than the {left} candidates left and the best"
    );
    assert_eq!(comparable(resumed), comparable(full.clone()));
    assert_eq!(
        std::fs::read(killed.join("explored.jsonl")).unwrap(),
        std::fs::read(whole.join("explored.jsonl")).unwrap()
    );
    assert!(!killed.join("journal.jsonl").exists());

    // Ctrl-C: the best so far, marked partial, exit 130; the next run completes it.
    let child = run_until(&spec_path, &stopped, 3);
    let ok = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(130), "{err}");
    assert!(err.contains("the result is partial"), "{err}");
    let partial = read_json(&stopped.join("result.json"));
    assert_eq!(partial["search"]["cancelled"], true);
    let evaluated = partial["search"]["candidates_evaluated"].as_u64().unwrap() as usize;
    assert!((3..n).contains(&evaluated), "{evaluated}");
    assert!(partial["best"].is_object(), "the best so far is reported");
    assert!(stopped.join("journal.jsonl").exists(), "kept to continue");
    let o = archplace()
        .args(["run"])
        .arg(&spec_path)
        .arg("--out")
        .arg(&stopped)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let completed = read_json(&stopped.join("result.json"));
    assert!(completed["search"]["resumed_candidates"].as_u64().unwrap() as usize >= evaluated);
    assert_eq!(comparable(completed), comparable(full));
}
