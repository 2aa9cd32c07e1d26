//! End-to-end tests of `archplace daemon`: a real process, a real folder, signals.

use crate::util::daemon::{
    drop_spec, http_get, http_request, job_named, jobs, result_dirs, sample, state_is,
};
use crate::util::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A spec that takes a few seconds even in a debug build: the tiny one over 36 chips.
fn medium_spec() -> String {
    let m = TINY
        .replace("name = \"e2e-tiny\"", "name = \"e2e-medium\"")
        .replace("tensor_cores = [1, 2]", "tensor_cores = [1, 2, 4, 8]")
        .replace("width = [16]", "width = [16, 32, 64]")
        .replace("depth = [16]", "depth = [16, 32, 64]");
    assert_ne!(m, TINY);
    m
}

#[test]
fn specs_dropped_are_searched_once_and_invalid_ones_get_located_errors() {
    let _gate = crate::util::shared();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut d = Daemon::start(dir);
    // With no spec folder, the daemon makes one with the default spec in it.
    d.until(Duration::from_secs(30), "the spec folder", || {
        dir.join("specs/default.toml").exists()
    });
    // Not searching the default here: take it away first.
    std::fs::remove_file(dir.join("specs/default.toml")).unwrap();
    drop_spec(dir, "tiny.toml", TINY);
    drop_spec(
        dir,
        "bad.toml",
        "schema_version = 1\nname = \"bad\"\n[training]\nmicro_batch_sizes = [3]\n",
    );
    // Latin-1, not UTF-8: located at its first bad byte, as `validate` locates it.
    let latin1 = dir.join("specs/.latin1.toml.part");
    std::fs::write(&latin1, b"schema_version = 1\nname = \"caf\xe9\"\n").unwrap();
    std::fs::rename(&latin1, dir.join("specs/latin1.toml")).unwrap();
    d.until(Duration::from_secs(120), "the three specs", || {
        let j = jobs(dir);
        state_is(&j, "e2e-tiny", "done")
            && state_is(&j, "bad", "invalid")
            && state_is(&j, "latin1", "invalid")
    });
    let err: serde_json::Value = serde_json::from_slice(
        &std::fs::read(result_dirs(dir, "latin1")[0].join("error.json")).unwrap(),
    )
    .unwrap();
    let e = &err["errors"][0];
    assert_eq!(
        (e["line"].as_u64(), e["column"].as_u64()),
        (Some(2), Some(12)),
        "{err}"
    );
    assert!(
        e["message"].as_str().unwrap().contains("not valid UTF-8"),
        "{err}"
    );
    let out = &result_dirs(dir, "e2e-tiny")[0];
    let result: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("result.json")).unwrap()).unwrap();
    assert_eq!(result["spec"]["name"], "e2e-tiny");
    assert_eq!(result["search"]["candidates_evaluated"], 2);
    let status: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("status.json")).unwrap()).unwrap();
    assert_eq!(status["state"], "done");
    let err: serde_json::Value = serde_json::from_slice(
        &std::fs::read(result_dirs(dir, "bad")[0].join("error.json")).unwrap(),
    )
    .unwrap();
    let e = err["errors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["field"] == "training.micro_batch_sizes[0]")
        .unwrap();
    assert_eq!(
        (e["line"].as_u64(), e["column"].as_u64()),
        (Some(4), Some(22))
    );
    assert!(e["file"].as_str().unwrap().ends_with("bad.toml"));

    // The metrics endpoint, at the URL the log gives (a free port was asked for).
    let url = d.metrics_addr();
    // (Metrics are refreshed every second.)
    d.until(
        Duration::from_secs(10),
        "the metrics to count the three jobs",
        || {
            let m = http_get(&url, "/metrics");
            m.contains("200 OK")
                && m.contains("archplace_specs{state=\"done\"} 1")
                && m.contains("archplace_specs{state=\"invalid\"} 2")
                && m.contains("archplace_specs{state=\"failed\"} 0")
        },
    );
    // The invalid spec never started: counted as invalid, not as a failed search (which
    // pages), and the log's "search ended" line says what the good one found.
    let m = http_get(&url, "/metrics");
    assert!(
        m.contains(r#"archplace_searches_finished_total{outcome="invalid"} 2"#)
            && m.contains(r#"archplace_searches_finished_total{outcome="failed"} 0"#),
        "{m}"
    );
    let ended = d
        .log()
        .lines()
        .find(|l| l.contains("search ended: best"))
        .map(str::to_string)
        .unwrap_or_default();
    assert!(
        ended.contains("samples/s on")
            && ended.contains("2 candidates")
            && ended.contains("seconds"),
        "{}",
        d.log()
    );
    assert!(http_get(&url, "/readyz").contains("200 OK"));
    assert!(http_get(&url, "/livez").contains("200 OK"));
    // The operator's view: every job with its state and result folder, one by its hash, a
    // hash it does not know answered 404 (docs/runbook.md's `curl -s localhost:9464/jobs`).
    let body = |answer: String| -> serde_json::Value {
        let (_, body) = answer.split_once("\r\n\r\n").expect("a body");
        serde_json::from_str(body).expect("JSON")
    };
    let listed = body(http_get(&url, "/jobs"));
    let all = listed["jobs"].as_array().expect("a list of jobs");
    assert_eq!(all.len(), 3, "{listed}");
    let tiny = all
        .iter()
        .find(|j| j["name"] == "e2e-tiny")
        .expect("e2e-tiny");
    assert_eq!(tiny["state"], "done");
    assert!(tiny["result_dir"].as_str().is_some_and(|d| !d.is_empty()));
    let hash = tiny["hash"].as_str().unwrap();
    let one = body(http_get(&url, &format!("/jobs/{hash}")));
    assert_eq!(
        (&one["name"], &one["state"]),
        (&tiny["name"], &tiny["state"])
    );
    assert!(http_request(&url, "GET", "/jobs/0123").0.contains("404"));

    // The same content again, under another name: no second search.
    drop_spec(dir, "tiny-again.toml", TINY);
    d.until(Duration::from_secs(30), "the duplicate to be seen", || {
        d.log().contains("already searched")
    });
    let j = jobs(dir);
    assert_eq!(job_named(&j, "e2e-tiny").unwrap()["attempts"], 1);

    d.signal("-TERM");
    let (code, took) = d.wait(Duration::from_secs(10));
    assert_eq!(code, Some(0), "{}", d.log());
    assert!(took < Duration::from_secs(10));
}

#[test]
fn editing_or_deleting_a_running_spec_cancels_its_search() {
    let _gate = crate::util::shared();
    let tmp = folder();
    let dir = tmp.path();
    let d = Daemon::start(dir);
    drop_spec(dir, "slow.toml", &slow_spec());
    d.wait_state("default-bert-large", "running", 60);
    // Edit: the old content's search is cancelled, the new content is searched.
    drop_spec(dir, "slow.toml", TINY);
    d.until(
        Duration::from_secs(120),
        "cancel and the new search",
        || {
            let j = jobs(dir);
            state_is(&j, "default-bert-large", "cancelled") && state_is(&j, "e2e-tiny", "done")
        },
    );
    let j = jobs(dir);
    assert_eq!(
        job_named(&j, "default-bert-large").unwrap()["message"],
        "its spec was edited"
    );
    // Delete: cancelled.
    drop_spec(
        dir,
        "slow2.toml",
        &slow_spec().replace("default-bert-large", "slow-two"),
    );
    d.wait_state("slow-two", "running", 60);
    std::fs::remove_file(dir.join("specs/slow2.toml")).unwrap();
    d.wait_state("slow-two", "cancelled", 60);
}

/// Two daemons on one state folder would search the same jobs and overwrite each other's
/// records: the second refuses to start, naming the first's PID (from the folder's
/// `daemon.lock`, which the first holds locked), and the first runs on.
#[test]
fn a_second_daemon_on_the_same_state_folder_is_refused() {
    let _gate = crate::util::shared();
    let tmp = folder();
    let dir = tmp.path();
    let mut first = Daemon::start(dir);
    let addr = first.metrics_addr();
    let pid = std::fs::read_to_string(dir.join(".archplace-state/daemon.lock")).unwrap();
    let pid = pid.trim().to_string();
    assert!(pid.parse::<u32>().is_ok(), "{pid:?}");
    let mut second = Daemon::start(dir);
    let (code, _) = second.wait(Duration::from_secs(30));
    assert!(code.is_some_and(|c| c != 0), "{code:?}\n{}", first.log());
    assert!(
        first.log().contains(&format!(
            "another archplace daemon (PID {pid}) uses the state folder"
        )),
        "{}",
        first.log()
    );
    assert!(http_get(&addr, "/livez").contains("200 OK"));
    first.signal("-TERM");
    let (code, _) = first.wait(Duration::from_secs(10));
    assert_eq!(code, Some(0), "{}", first.log());
}

#[test]
fn sigterm_stops_a_search_within_10_s_and_a_restart_completes_it() {
    let _gate = crate::util::shared();
    let tmp = folder();
    let dir = tmp.path();
    // A slow search: SIGTERM must stop it at its next safe point, within 10 s.
    let mut d = Daemon::start(dir);
    drop_spec(dir, "slow.toml", &slow_spec());
    d.wait_state("default-bert-large", "running", 60);
    d.signal("-TERM");
    let (code, took) = d.wait(Duration::from_secs(10));
    assert_eq!(code, Some(0), "{}", d.log());
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert_eq!(
        job_named(&jobs(dir), "default-bert-large").unwrap()["state"],
        "queued",
        "an interrupted search is searched again at the next start"
    );
    // Its status file says so too (it once said `cancelled`).
    let status: serde_json::Value = serde_json::from_slice(
        &std::fs::read(result_dirs(dir, "default-bert-large")[0].join("status.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(status["state"], "queued", "{status}");
    std::fs::remove_file(dir.join("specs/slow.toml")).unwrap();

    // A search that can finish: interrupted, then completed by the restart, once.
    drop_spec(dir, "medium.toml", &medium_spec());
    let mut d = Daemon::start(dir);
    d.wait_state("e2e-medium", "running", 60);
    d.signal("-TERM");
    let (code, _) = d.wait(Duration::from_secs(10));
    assert_eq!(code, Some(0), "{}", d.log());
    // The record says how far it got: the journal's candidates; its status file too, as
    // the search last reported it (no estimate of the time left: it is not running).
    let out = &result_dirs(dir, "e2e-medium")[0];
    let held = archplace_job::journal::candidates(out);
    assert_eq!(
        job_named(&jobs(dir), "e2e-medium").unwrap()["journal_candidates"],
        held
    );
    let status: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("status.json")).unwrap()).unwrap();
    assert_eq!(status["state"], "queued", "{status}");
    if held > 0 {
        assert!(
            status["candidates_evaluated"].as_u64() >= Some(1)
                && status.get("eta_seconds").is_none(),
            "{status}"
        );
    }
    let d = Daemon::start(dir);
    d.wait_state("e2e-medium", "done", 300);
    let j = jobs(dir);
    assert_eq!(job_named(&j, "e2e-medium").unwrap()["attempts"], 2);
    // The slow spec left the folder while the daemon was down: cancelled, not searched.
    assert_eq!(
        job_named(&j, "default-bert-large").unwrap()["state"],
        "cancelled"
    );
    let out = &result_dirs(dir, "e2e-medium")[0];
    let result: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("result.json")).unwrap()).unwrap();
    assert!(result["search"]["candidates_evaluated"].as_u64().unwrap() > 2);
}

#[test]
fn kill_9_during_a_search_loses_nothing_and_a_restart_completes_it_once() {
    let _gate = crate::util::shared();
    let tmp = folder();
    let dir = tmp.path();
    drop_spec(dir, "medium.toml", &medium_spec());
    let mut d = Daemon::start(dir);
    d.wait_state("e2e-medium", "running", 60);
    d.signal("-KILL");
    d.wait(Duration::from_secs(5));
    // No half-written file anywhere (a write the kill interrupted can only have left its
    // temporary file, which no reader sees and the restart removes; checked below).
    for e in walk(dir) {
        let name = e.file_name().unwrap().to_string_lossy().into_owned();
        if name.ends_with(".json") {
            let bytes = std::fs::read(&e).unwrap();
            serde_json::from_slice::<serde_json::Value>(&bytes)
                .unwrap_or_else(|err| panic!("{}: {err}", e.display()));
        }
    }
    let d = Daemon::start(dir);
    d.wait_state("e2e-medium", "done", 300);
    assert_eq!(job_named(&jobs(dir), "e2e-medium").unwrap()["attempts"], 2);
    assert_eq!(result_dirs(dir, "e2e-medium").len(), 1);
    for e in walk(dir) {
        let name = e.file_name().unwrap().to_string_lossy().into_owned();
        assert!(!name.ends_with(".tmp"), "{}", e.display());
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn a_spec_written_slowly_in_place_is_never_read_half_written() {
    let _gate = crate::util::shared();
    // Watching (the default) and polling (network filesystems) alike.
    // Writes 0.1 s apart against a 1 s settle time: robust on a loaded machine.
    for mode in [
        &["--settle-seconds", "1"][..],
        &["--settle-seconds", "1", "--poll"][..],
    ] {
        slow_writes(mode);
    }
}

fn slow_writes(mode: &[&str]) {
    let tmp = folder();
    let dir = tmp.path();
    let d = Daemon::start_with(dir, mode);
    // Five writes 0.1 s apart, no rename.
    let path = dir.join("specs/written-slowly.toml");
    let bytes = TINY.as_bytes();
    let step = bytes.len().div_ceil(5);
    for chunk in bytes.chunks(step) {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap();
        f.write_all(chunk).unwrap();
        drop(f);
        std::thread::sleep(Duration::from_millis(100));
    }
    d.wait_state("e2e-tiny", "done", 60);
    std::thread::sleep(Duration::from_millis(500));
    let j = jobs(dir);
    assert_eq!(j.len(), 1, "only the whole file was ever read: {j:#?}");
}

/// `max_faults` holds as configured in the daemon, for every hostile fixture: with 1 and
/// with 3, a search whose plugin faults on every call (on two search threads) logs exactly
/// that many faults and exports exactly that many in `archplace_plugin_faults_total` (8
/// were once counted for 3).
#[test]
fn the_daemon_counts_exactly_max_faults_faults() {
    let _gate = crate::util::shared();
    let fixtures = [
        ("hostile-trap", "trap"),
        ("hostile-nan-output", "bad_output"),
        ("hostile-negative-output", "bad_output"),
        ("hostile-wrong-count", "bad_output"),
        ("hostile-enormous-output", "bad_output"),
        ("hostile-memory-over-latency", "bad_output"),
        ("hostile-infinite-loop", "fuel"),
        ("hostile-memory-bomb", "memory"),
    ];
    for max_faults in [1, 3] {
        let tmp = folder();
        let dir = tmp.path();
        for (fixture, _) in fixtures {
            install_unchecked(&dir.join("plugins"), fixture, fixture);
        }
        std::fs::write(
            dir.join("archplace.toml"),
            format!(
                "threads_per_search = 2\nmax_concurrent_searches = 2\n[plugin_limits]\nmax_faults = {max_faults}\n"
            ),
        )
        .unwrap();
        let d = Daemon::start_with(dir, &["--config", "archplace.toml"]);
        let addr = d.metrics_addr();
        for (fixture, _) in fixtures {
            let spec = TINY.replace("name = \"e2e-tiny\"", &format!("name = \"{fixture}\""))
                + &format!("\n[cost_model]\nlatency = \"{fixture}\"\n");
            drop_spec(dir, &format!("{fixture}.toml"), &spec);
        }
        for (fixture, kind) in fixtures {
            d.wait_state(fixture, "failed", 120);
            let series = format!(
                "archplace_plugin_faults_total{{kind=\"{kind}\",plugin=\"{fixture}\"}} {max_faults}"
            );
            d.until(Duration::from_secs(10), "the faults counted", || {
                http_get(&addr, "/metrics").contains(&series)
            });
            let log = d.log();
            let logged = log
                .lines()
                .filter(|l| {
                    l.contains("plugin fault during") && l.contains(&format!("plugin={fixture} "))
                })
                .count();
            assert_eq!(logged, max_faults as usize, "{fixture}: {log}");
        }
        assert!(d.log().contains(&format!("of={max_faults}")), "{}", d.log());
    }
}

#[test]
fn a_hostile_plugin_named_by_a_spec_fails_only_that_spec() {
    let _gate = crate::util::shared();
    let tmp = folder();
    let dir = tmp.path();
    install_unchecked(&dir.join("plugins"), "hostile-trap", "hostile-trap");
    let d = Daemon::start(dir);
    let hostile = TINY.replace("name = \"e2e-tiny\"", "name = \"hostile\"")
        + "\n[cost_model]\nlatency = \"hostile-trap\"\n";
    drop_spec(dir, "hostile.toml", &hostile);
    drop_spec(dir, "good.toml", TINY);
    d.until(Duration::from_secs(120), "both searches", || {
        let j = jobs(dir);
        state_is(&j, "hostile", "failed") && state_is(&j, "e2e-tiny", "done")
    });
    let j = jobs(dir);
    let m = job_named(&j, "hostile").unwrap()["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        m.contains("plugin `hostile-trap`") && m.contains("deliberate panic"),
        "{m}"
    );
    let err = std::fs::read_to_string(result_dirs(dir, "hostile")[0].join("error.json")).unwrap();
    assert!(err.contains("hostile-trap"), "{err}");
}

/// Every way a search fails in the daemon leaves its folder saying so: `error.json` with
/// the reason and `status.json` in state `failed`, and the job's message the reason — a
/// latency-model fault mid-search, an area-model fault while the space is sized, a space
/// with no chip in the area budget. (The crash-loop guard's give-up is checked by
/// `a_search_the_daemon_keeps_dying_in_is_given_up_after_three_starts`, a pool worker's
/// fault by `tests/pool.rs`; results that cannot be written wait for disk instead.)
#[test]
fn every_way_a_search_fails_leaves_error_json_and_a_final_status() {
    let _gate = crate::util::shared();
    let tmp = folder();
    let dir = tmp.path();
    for fixture in ["hostile-trap", "hostile-area-nan"] {
        install_unchecked(&dir.join("plugins"), fixture, fixture);
    }
    let d = Daemon::start(dir);
    let named = |name: &str| TINY.replace("name = \"e2e-tiny\"", &format!("name = \"{name}\""));
    let cases = [
        (
            "latency-fault",
            named("latency-fault") + "\n[cost_model]\nlatency = \"hostile-trap\"\n",
            "deliberate panic",
        ),
        (
            "area-fault",
            named("area-fault") + "\n[cost_model]\narea = \"hostile-area-nan\"\n",
            "returned an area of NaN",
        ),
        (
            "empty-space",
            named("empty-space")
                .replace("area_budget = \"100 mm2\"", "area_budget = \"0.001 mm2\""),
            "no candidate fits the area budget",
        ),
    ];
    for (name, text, _) in &cases {
        assert!(text.contains(&format!("name = \"{name}\"")));
        drop_spec(dir, &format!("{name}.toml"), text);
    }
    for (name, _, reason) in &cases {
        d.wait_state(name, "failed", 120);
        let j = jobs(dir);
        let m = job_named(&j, name).unwrap()["message"].to_string();
        assert!(m.contains(reason), "{name}: {m}");
        let out = &result_dirs(dir, name)[0];
        let err = read_json(&out.join("error.json"));
        assert!(err.to_string().contains(reason), "{name}: {err}");
        let status = read_json(&out.join("status.json"));
        assert_eq!(status["state"], "failed", "{name}: {status}");
    }
}

/// A spec whose search may need more memory than the daemon's budget is refused before it
/// starts, with the numbers in its error file (not aborted mid-search, taking the
/// daemon with it); a small spec beside it is searched.
#[test]
fn a_spec_above_the_memory_budget_is_refused_with_the_numbers() {
    let _gate = crate::util::shared();
    let tmp = folder();
    let dir = tmp.path();
    std::fs::write(
        dir.join("archplace.toml"),
        "search_memory_bytes = 1073741824\nthreads_per_search = 1\n",
    )
    .unwrap();
    let d = Daemon::start_with(dir, &["--config", "archplace.toml"]);
    // 64 × 64 × 8 × 8 × 8 = 2,097,152 configurations.
    let list = |n: u32| {
        (1..=n)
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let huge = TINY
        .replace("name = \"e2e-tiny\"", "name = \"huge\"")
        .replace("tensor_cores = [1, 2]", &format!("tensor_cores = [{}]", list(64)))
        .replace("vector_cores = [1]", &format!("vector_cores = [{}]", list(64)))
        .replace("width = [16]", "width = [2, 4, 8, 16, 32, 64, 128, 256]")
        .replace("depth = [16]", "depth = [2, 4, 8, 16, 32, 64, 128, 256]")
        .replace(
            "buffer = [\"2 MiB\"]",
            "buffer = [\"1 MiB\", \"2 MiB\", \"3 MiB\", \"4 MiB\", \"5 MiB\", \"6 MiB\", \"7 MiB\", \"8 MiB\"]",
        );
    drop_spec(dir, "huge.toml", &huge);
    drop_spec(dir, "tiny.toml", TINY);
    d.until(Duration::from_secs(120), "both specs", || {
        let j = jobs(dir);
        state_is(&j, "huge", "invalid") && state_is(&j, "e2e-tiny", "done")
    });
    let err: serde_json::Value = serde_json::from_slice(
        &std::fs::read(result_dirs(dir, "huge")[0].join("error.json")).unwrap(),
    )
    .unwrap();
    let e = &err["errors"][0];
    let m = e["message"].as_str().unwrap();
    assert!(m.contains("above the memory budget of 1 GiB"), "{m}");
    assert!(m.contains("2,097,152 candidates"), "{m}");
    assert_eq!(e["field"], "search");
    assert_eq!(e["line"], 19);
    assert!(!result_dirs(dir, "huge")[0].join("result.json").exists());
}

/// Invalid specs are refused at once, whatever is searching (they once waited for a
/// search slot), each with its `error.json`; a spec file above `max_spec_bytes` is not read
/// but gets an `invalid` job too, with the reason, a log line and
/// `archplace_specs_skipped_total{reason="too_large"}` (it was once ignored in silence).
#[test]
fn invalid_and_oversized_specs_are_answered_at_once_while_a_search_runs() {
    let _gate = crate::util::shared();
    let tmp = folder();
    let dir = tmp.path();
    std::fs::write(
        dir.join("archplace.toml"),
        "max_concurrent_searches = 1\nmax_spec_bytes = 4096\n",
    )
    .unwrap();
    let d = Daemon::start_with(dir, &["--config", "archplace.toml"]);
    // Certainly still running when every bad spec has been answered.
    drop_spec(dir, "long.toml", &slow_spec());
    d.wait_state("default-bert-large", "running", 60);
    for i in 0..20 {
        drop_spec(
            dir,
            &format!("bad-{i:02}.toml"),
            &format!(
                "schema_version = 1\nname = \"bad-{i:02}\"\n[training]\nmicro_batch_sizes = [3]\n"
            ),
        );
    }
    drop_spec(
        dir,
        "big.toml",
        &format!("{TINY}\n{}", "# padding\n".repeat(500)),
    );
    d.until(Duration::from_secs(30), "every bad spec answered", || {
        let j = jobs(dir);
        (0..20).all(|i| state_is(&j, &format!("bad-{i:02}"), "invalid"))
            && state_is(&j, "big", "invalid")
    });
    let j = jobs(dir);
    assert!(
        state_is(&j, "default-bert-large", "running"),
        "the search goes on: {j:?}"
    );
    for i in [0, 19] {
        let dirs = result_dirs(dir, &format!("bad-{i:02}"));
        let err = std::fs::read_to_string(dirs[0].join("error.json")).unwrap();
        assert!(err.contains("does not divide the global batch"), "{err}");
    }
    let err = std::fs::read_to_string(result_dirs(dir, "big")[0].join("error.json")).unwrap();
    assert!(
        err.contains("larger than 4096 bytes") && err.contains("max_spec_bytes"),
        "{err}"
    );
    assert!(d.log().contains("not read as a spec"), "{}", d.log());
    let addr = d.metrics_addr();
    d.until(Duration::from_secs(10), "the skip counted", || {
        http_get(&addr, "/metrics")
            .contains(r#"archplace_specs_skipped_total{reason="too_large"} 1"#)
    });
}

#[test]
fn two_hundred_specs_dropped_at_once_are_each_searched_exactly_once() {
    let _gate = crate::util::shared();
    let tmp = folder();
    let dir = tmp.path();
    for i in 0..200 {
        let text = TINY.replace("name = \"e2e-tiny\"", &format!("name = \"many-{i:03}\""));
        std::fs::write(dir.join(format!("specs/.{i}.tmp")), text).unwrap();
    }
    let d = Daemon::start_with(dir, &["--max-concurrent-searches", "2"]);
    for i in 0..200 {
        std::fs::rename(
            dir.join(format!("specs/.{i}.tmp")),
            dir.join(format!("specs/many-{i:03}.toml")),
        )
        .unwrap();
    }
    let mut peak_kib = 0u64;
    d.until(Duration::from_secs(900), "all 200 searches", || {
        if let Ok(status) = std::fs::read_to_string(format!("/proc/{}/status", d.child.id())) {
            for l in status.lines() {
                if let Some(v) = l.strip_prefix("VmHWM:") {
                    peak_kib = v
                        .trim()
                        .trim_end_matches(" kB")
                        .trim()
                        .parse()
                        .unwrap_or(peak_kib);
                }
            }
        }
        let j = jobs(dir);
        j.len() == 200 && j.iter().all(|j| j["state"] == "done")
    });
    let j = jobs(dir);
    assert!(j.iter().all(|j| j["attempts"] == 1));
    for i in 0..200 {
        let dirs = result_dirs(dir, &format!("many-{i:03}"));
        assert_eq!(dirs.len(), 1);
        assert!(dirs[0].join("result.json").exists());
    }
    eprintln!("200 specs: peak RSS {peak_kib} KiB");
    assert!(peak_kib < 512 * 1024, "peak RSS {peak_kib} KiB");
}

#[test]
fn results_that_cannot_be_written_wait_for_disk_and_are_written_later() {
    let _gate = crate::util::shared();
    let tmp = folder();
    let dir = tmp.path();
    std::fs::create_dir_all(dir.join("results")).unwrap();
    // A file where the spec's result folder must go: no result can be written (this works
    // even as root, for whom permissions do not).
    std::fs::write(dir.join("results/e2e-tiny"), "in the way").unwrap();
    let d = Daemon::start_with(dir, &["--retry-seconds", "1"]);
    drop_spec(dir, "tiny.toml", TINY);
    d.wait_state("e2e-tiny", "waiting_for_disk", 60);
    let j = jobs(dir);
    let m = job_named(&j, "e2e-tiny").unwrap()["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        m.contains("cannot write") && m.contains("trying again in 1 s"),
        "{m}"
    );
    // The daemon carries on; once the folder can be written, the retry succeeds.
    std::fs::remove_file(dir.join("results/e2e-tiny")).unwrap();
    d.wait_state("e2e-tiny", "done", 60);
    assert!(result_dirs(dir, "e2e-tiny")[0].join("result.json").exists());
}

#[test]
fn sighup_reloads_the_config_and_finds_new_plugins_without_dropping_searches() {
    let _gate = crate::util::shared();
    let tmp = folder();
    let dir = tmp.path();
    std::fs::write(
        dir.join("archplace.toml"),
        "settle_seconds = 0.3\nmax_queue = 100\n",
    )
    .unwrap();
    let mut d = Daemon::start_with(
        dir,
        &[
            "--config",
            "archplace.toml",
            "--max-concurrent-searches",
            "2",
        ],
    );
    // A slow search runs meanwhile.
    drop_spec(dir, "slow.toml", &slow_spec());
    d.wait_state("default-bert-large", "running", 60);
    // A spec naming a plugin that is not installed yet is invalid, with a located error.
    let uses = |name: &str| {
        TINY.replace("name = \"e2e-tiny\"", &format!("name = \"{name}\""))
            + "\n[cost_model]\nlatency = \"my-cost-model\"\n"
    };
    drop_spec(dir, "early.toml", &uses("early"));
    d.wait_state("early", "invalid", 60);
    // Install it and reload.
    install_unchecked(&dir.join("plugins"), "template", "my-cost-model");
    // A bad config first: the reload fails, keeps the settings, and logs every reason in
    // its one event.
    std::fs::write(
        dir.join("archplace.toml"),
        "settle_seconds = 0.3\nmax_queue = \"lots\"\n",
    )
    .unwrap();
    d.signal("-HUP");
    d.until(Duration::from_secs(30), "the failed reload", || {
        d.log().contains("config reload failed")
    });
    let failed = d
        .log()
        .lines()
        .find(|l| l.contains("config reload failed"))
        .unwrap_or_default()
        .to_string();
    assert!(
        failed.contains("errors=")
            && failed.contains("archplace.toml:2:13")
            && failed.contains("\"lots\""),
        "{}",
        d.log()
    );
    std::fs::write(
        dir.join("archplace.toml"),
        "settle_seconds = 0.3\nmax_queue = 50\nstate_dir = \"elsewhere\"\n",
    )
    .unwrap();
    d.signal("-HUP");
    d.until(Duration::from_secs(30), "the reload", || {
        d.log().contains("config reloaded")
    });
    assert!(
        d.log()
            .contains("`state_dir` changed; it takes effect at the next start"),
        "{}",
        d.log()
    );
    drop_spec(dir, "late.toml", &uses("late"));
    d.wait_state("late", "done", 60);
    // The slow search was not dropped by the reload.
    let j = jobs(dir);
    let slow = job_named(&j, "default-bert-large").unwrap();
    assert!(
        slow["state"] == "running" || slow["state"] == "done",
        "{slow}"
    );
    assert_eq!(slow["attempts"], 1);
    d.signal("-TERM");
    d.wait(Duration::from_secs(10));
}

/// The metric families of a scrape (`# TYPE name kind` lines), by name.
fn families(scrape: &str) -> std::collections::BTreeMap<String, String> {
    scrape
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((w.next()?.to_string(), w.next()?.to_string()))
        })
        .collect()
}

/// Every `archplace_*` metric a PromQL expression reads (histogram series by family).
fn metrics_in(expr: &str, kinds: &std::collections::BTreeMap<String, String>) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while let Some(k) = expr[i..].find("archplace_") {
        let start = i + k;
        let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
        if start > 0 && ident(bytes[start - 1]) {
            i = start + 1;
            continue;
        }
        let mut end = start;
        while end < bytes.len() && ident(bytes[end]) {
            end += 1;
        }
        let name = &expr[start..end];
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                let base = name.strip_suffix(s)?;
                (kinds.get(base).map(String::as_str) == Some("histogram")).then_some(base)
            })
            .unwrap_or(name);
        out.push(family.to_string());
        i = end;
    }
    out
}

/// Every `expr` in a JSON document (the dashboard's queries).
fn exprs_json(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("expr", serde_json::Value::String(e)) => out.push(e.clone()),
                    _ => exprs_json(v, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| exprs_json(v, out)),
        _ => {}
    }
}

#[test]
fn the_dashboard_and_alerts_query_only_metrics_a_running_daemon_exports() {
    let _gate = crate::util::shared();
    let tmp = folder();
    let dir = tmp.path();
    let d = Daemon::start_with(dir, &["--log-format", "json"]);
    let addr = d.metrics_addr();
    d.until(Duration::from_secs(30), "/readyz", || {
        http_get(&addr, "/readyz").contains("200 OK")
    });
    assert!(http_get(&addr, "/livez").contains("200 OK"));

    // Scrape while a search runs and after it ends; every family any scrape had.
    drop_spec(dir, "medium.toml", &medium_spec());
    let mut seen = std::collections::BTreeMap::new();
    let mut progress_seen = false;
    let mut last = String::new();
    d.until(Duration::from_secs(120), "the search to end", || {
        last = http_get(&addr, "/metrics");
        assert!(last.starts_with("HTTP/1.1 200") || last.starts_with("HTTP/1.0 200"));
        seen.extend(families(&last));
        progress_seen |= last.contains(
            r#"archplace_search_candidates_evaluated{file="medium.toml",spec="e2e-medium"}"#,
        );
        state_is(&jobs(dir), "e2e-medium", "done")
    });
    assert!(progress_seen, "no progress series while the search ran");
    // (Metrics are refreshed every second.)
    d.until(
        Duration::from_secs(10),
        "the finished search in the metrics",
        || {
            last = http_get(&addr, "/metrics");
            let done = r#"archplace_searches_finished_total{outcome="done"}"#;
            sample(&last, done) == Some(1.0)
                && sample(&last, r#"archplace_specs{state="done"}"#) == Some(1.0)
        },
    );
    seen.extend(families(&last));
    // The running search's series are gone; its result stays while its file is there.
    assert!(
        !last.contains("archplace_search_candidates_evaluated{"),
        "{last}"
    );
    let throughput = sample(
        &last,
        r#"archplace_result_throughput_samples_per_second{file="medium.toml",spec="e2e-medium"}"#,
    )
    .unwrap_or_else(|| panic!("no result series:\n{last}"));
    assert!(throughput > 0.0);
    for (series, at_least) in [
        (r#"archplace_specs{state="done"}"#, 1.0),
        ("archplace_specs_discovered_total", 1.0),
        (
            r#"archplace_search_duration_seconds_count{outcome="done"}"#,
            1.0,
        ),
        (r#"archplace_layer_schedules_total{method="bounds"}"#, 1.0),
        ("archplace_estimates_computed_total", 1.0),
        ("archplace_placement_duration_seconds_count", 1.0),
        (r#"archplace_plugin_calls_total{plugin="reference"}"#, 1.0),
        (
            r#"archplace_plugin_call_duration_seconds_count{plugin="reference"}"#,
            1.0,
        ),
        (r#"archplace_rescans_total{reason="start"}"#, 1.0),
        ("archplace_watcher_events_total", 1.0),
        ("archplace_config_last_reload_successful", 1.0),
        ("archplace_process_resident_memory_bytes", 1e6),
        ("archplace_process_open_fds", 3.0),
    ] {
        let v = sample(&last, series).unwrap_or_else(|| panic!("no {series}:\n{last}"));
        assert!(v >= at_least, "{series} = {v}");
    }
    assert_eq!(
        sample(
            &last,
            r#"archplace_plugin_faults_total{kind="fuel",plugin="reference"}"#
        ),
        Some(0.0)
    );
    assert!(last.contains("archplace_build_info{highs=\""), "{last}");

    // The dashboard and the alert rules read only what was exported.
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("config/grafana/dashboards/archplace.json")).unwrap(),
    )
    .unwrap();
    let mut queries = Vec::new();
    exprs_json(&dashboard, &mut queries);
    let rules: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(root().join("config/prometheus/alerts.yml")).unwrap(),
    )
    .unwrap();
    let mut alert_exprs = Vec::new();
    for group in rules["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            alert_exprs.push(rule["expr"].as_str().unwrap().to_string());
        }
    }
    assert!(queries.len() >= 30, "{queries:?}");
    assert!(alert_exprs.len() >= 5, "{alert_exprs:?}");
    let mut used = std::collections::BTreeSet::new();
    for e in queries.iter().chain(&alert_exprs) {
        for m in metrics_in(e, &seen) {
            assert!(
                seen.contains_key(&m),
                "`{m}` (in `{e}`) is not exported; the daemon exports {:?}",
                seen.keys().collect::<Vec<_>>()
            );
            used.insert(m);
        }
    }
    assert!(
        used.len() >= 25,
        "the dashboard and alerts read only {used:?}"
    );

    // Deleting the spec removes its result series.
    std::fs::remove_file(dir.join("specs/medium.toml")).unwrap();
    d.until(Duration::from_secs(30), "the result series to go", || {
        !http_get(&addr, "/metrics").contains("archplace_result_throughput_samples_per_second{")
    });

    // The log: JSON lines, the search's span with the spec's name and hash.
    let log = d.log();
    let mut in_span = false;
    for line in log.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
        if v["span"]["name"] == "search" && v["span"]["spec"] == "e2e-medium" {
            assert_eq!(v["span"]["hash"].as_str().unwrap().len(), 16, "{line}");
            assert_eq!(v["span"]["file"], "medium.toml", "{line}");
            in_span = true;
        }
    }
    assert!(in_span, "no log line in the search's span:\n{log}");
}

#[test]
fn every_dashboard_query_is_valid_promql() {
    let _gate = crate::util::shared();
    // promtool parses PromQL only in rule files: each query becomes a recording rule, with
    // Grafana's variables replaced by what Grafana would put there. (JSON is YAML.)
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("config/grafana/dashboards/archplace.json")).unwrap(),
    )
    .unwrap();
    let mut queries = Vec::new();
    exprs_json(&dashboard, &mut queries);
    let rules: Vec<serde_json::Value> = queries
        .iter()
        .enumerate()
        .map(|(i, q)| {
            serde_json::json!({
                "record": format!("dashboard:query_{i}"),
                "expr": q.replace("$__rate_interval", "1m").replace("$instance", ".*"),
            })
        })
        .collect();
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("dashboard-queries.yml");
    std::fs::write(
        &file,
        serde_json::to_string(
            &serde_json::json!({"groups": [{"name": "dashboard", "rules": rules}]}),
        )
        .unwrap(),
    )
    .unwrap();
    let out = Command::new("promtool")
        .args(["check", "rules"])
        .arg(&file)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run promtool ({e}): install it with `scripts/setup --dev` (scripts/test does)")
        });
    assert!(
        out.status.success(),
        "a dashboard query is not valid PromQL:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("{} rules found", queries.len())),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn the_configs_log_level_applies_at_start_and_on_sighup_unless_rust_log_is_set() {
    let _gate = crate::util::shared();
    let tmp = folder();
    let dir = tmp.path();
    let config = dir.join("archplace.toml");
    // (A restart-only setting changes with the level, so that the reload logs a warning.)
    let write_config = |level: &str, searches: u32| {
        std::fs::write(
            &config,
            format!(
                "listen = \"127.0.0.1:0\"\nsettle_seconds = 0.3\nmax_concurrent_searches = {searches}\nlog_level = \"{level}\"\n"
            ),
        )
        .unwrap()
    };
    write_config("debug,highs=error", 2);
    let child = Command::new(env!("CARGO_BIN_EXE_archplace"))
        .args(["daemon", "--config"])
        .arg(&config)
        .current_dir(dir)
        .env("ARCHPLACE_CACHE_DIR", root().join("target/test-cache"))
        .env("ARCHPLACE_PLUGIN_DIRS", root().join("target/plugins"))
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("daemon.log")).unwrap())
        .spawn()
        .unwrap();
    let mut d = Daemon {
        child,
        dir: dir.to_path_buf(),
    };
    // debug: the main loop's scans are logged.
    d.until(Duration::from_secs(30), "debug lines", || {
        d.log().contains("scanning the spec folder")
    });
    write_config("warn", 3);
    d.signal("-HUP");
    d.until(Duration::from_secs(30), "the reload's warning", || {
        d.log()
            .contains("`max_concurrent_searches` changed; it takes effect at the next start")
    });
    let mark = d.log().len();
    drop_spec(dir, "tiny.toml", TINY);
    d.wait_state("e2e-tiny", "done", 60);
    let after = d.log()[mark..].to_string();
    assert!(
        !after.contains("INFO") && !after.contains("DEBUG"),
        "info or debug lines after the level became warn:\n{after}"
    );
    d.signal("-TERM");
    d.wait(Duration::from_secs(10));
}

/// The daemon's own reading of the folder (each scan opens the folder
/// and the specs in it) is not a change. It used to count as one, so every scan caused the
/// next: an idle daemon rescanned about ten times a second. Now an idle daemon scans only
/// on its timers, and a real change still wakes it at once.
#[test]
fn an_idle_daemon_does_not_wake_itself() {
    let _gate = crate::util::shared();
    let tmp = folder();
    let dir = tmp.path();
    drop_spec(dir, "broken.toml", "this is not a spec");
    let d = Daemon::start(dir);
    let addr = d.metrics_addr();
    d.until(
        Duration::from_secs(30),
        "the broken spec in the log",
        || d.log().contains("broken.toml"),
    );
    std::thread::sleep(Duration::from_secs(1));
    let changes = || {
        sample(
            &http_get(&addr, "/metrics"),
            "archplace_rescans_total{reason=\"change\"}",
        )
        .unwrap_or(0.0)
    };
    let before = changes();
    std::thread::sleep(Duration::from_secs(3));
    let idle = changes() - before;
    assert!(
        idle == 0.0,
        "{idle} rescans for changes in 3 idle seconds\n{}",
        d.log()
    );
    // A real change still wakes it.
    drop_spec(dir, "other.toml", "neither is this");
    d.until(Duration::from_secs(10), "a rescan for the new spec", || {
        changes() > before
    });
}

/// GET and HEAD only (any method once got 200).
#[test]
fn the_endpoint_answers_get_and_head_and_refuses_other_methods() {
    let _gate = crate::util::shared();
    let tmp = folder();
    let d = Daemon::start(tmp.path());
    let addr = d.metrics_addr();
    let (status, _) = http_request(&addr, "GET", "/livez");
    assert!(status.contains("200"), "{status}");
    let (status, all) = http_request(&addr, "HEAD", "/metrics");
    assert!(status.contains("200"), "{status}");
    assert!(
        all.ends_with("\r\n\r\n"),
        "a HEAD answer has no body: {all}"
    );
    for method in ["POST", "PUT", "DELETE", "PATCH"] {
        let (status, all) = http_request(&addr, method, "/metrics");
        assert!(status.contains("405"), "{method}: {status}");
        assert!(
            all.to_ascii_lowercase().contains("allow: get, head"),
            "{all}"
        );
    }
    let (status, _) = http_request(&addr, "GET", "/nothing");
    assert!(status.contains("404"), "{status}");
}

/// Idle connections are closed and `accept` errors do not end the listener (once, with
/// file descriptors exhausted by idle connections, one `accept` error stopped /livez and
/// /metrics for good while the daemon ran on). 400 idle connections against a daemon
/// allowed 64 open files — fewer than the connection slots, so descriptors run out before
/// connections displace each other: some cannot be accepted; once the idle ones time out,
/// it answers.
#[test]
fn the_endpoint_survives_idle_connections_that_exhaust_file_descriptors() {
    let _gate = crate::util::shared();
    let tmp = folder();
    let mut d = Daemon::start_with_open_files(tmp.path(), 64);
    let addr = d.metrics_addr();
    let (status, _) = http_request(&addr, "GET", "/livez");
    assert!(status.contains("200"), "{status}");
    let idle: Vec<std::net::TcpStream> = (0..400)
        .map(|_| std::net::TcpStream::connect(&addr).unwrap())
        .collect();
    d.until(
        Duration::from_secs(20),
        "an accept error in the log",
        || d.log().contains("cannot accept a connection"),
    );
    // The idle connections are closed by the header timeout (5 s); then it answers again.
    let t = Instant::now();
    let mut answered = false;
    while t.elapsed() < Duration::from_secs(20) && !answered {
        std::thread::sleep(Duration::from_millis(500));
        answered = std::panic::catch_unwind(|| http_request(&addr, "GET", "/livez"))
            .is_ok_and(|(status, _)| status.contains("200"));
    }
    assert!(answered, "/livez never answered again\n{}", d.log());
    let (status, body) = http_request(&addr, "GET", "/metrics");
    assert!(
        status.contains("200") && body.contains("archplace_"),
        "{status}"
    );
    assert!(d.child.try_wait().unwrap().is_none(), "the daemon exited");
    drop(idle);
}

/// A search whose results cannot be written (here the place of its `result.json` is taken
/// by a folder; a full disk does the same) is failed "trying again", and the retry writes
/// what the search found, without searching again (each retry once re-ran the whole
/// search).
#[test]
fn results_that_cannot_be_written_are_written_later_without_searching_again() {
    let _gate = crate::util::shared();
    let tmp = folder();
    let dir = tmp.path();
    std::fs::write(dir.join("archplace.toml"), "retry_seconds = 1.0\n").unwrap();
    let d = Daemon::start_with(dir, &["--config", "archplace.toml"]);
    drop_spec(dir, "medium.toml", &medium_spec());
    d.wait_state("e2e-medium", "running", 60);
    // The job is running before its worker makes the result folder: on a loaded machine
    // there is a moment between the two.
    d.until(Duration::from_secs(60), "the result folder", || {
        d.result_dir("e2e-medium").is_some()
    });
    let out = d.result_dir("e2e-medium").unwrap();
    std::fs::create_dir_all(out.join("result.json/in-the-way")).unwrap();
    d.until(Duration::from_secs(300), "the write to fail", || {
        d.log().contains("cannot write the results")
    });
    std::fs::remove_dir_all(out.join("result.json")).unwrap();
    d.wait_state("e2e-medium", "done", 60);
    let log = d.log();
    assert!(
        log.contains("writing the results of the finished search again"),
        "{log}"
    );
    assert_eq!(log.matches("search ended: best").count(), 1, "{log}");
    let result = read_json(&out.join("result.json"));
    assert!(result["best"].is_object(), "{result}");
}

/// An invalid spec whose `error.json` cannot be written (here its results folder's place
/// is taken by a file; a full disk does the same) waits for disk, not `failed`; its job
/// keeps the first error and why the file is missing, and once the way is clear the
/// errors are written and it is `invalid`.
#[test]
fn an_invalid_spec_keeps_its_errors_when_error_json_cannot_be_written() {
    let _gate = crate::util::shared();
    let tmp = folder();
    let dir = tmp.path();
    std::fs::create_dir_all(dir.join("results")).unwrap();
    std::fs::write(dir.join("results/bad"), "in the way").unwrap();
    let d = Daemon::start_with(dir, &["--retry-seconds", "1"]);
    drop_spec(
        dir,
        "bad.toml",
        "schema_version = 1\nname = \"bad\"\n[training]\nmicro_batch_sizes = [3]\n",
    );
    d.wait_state("bad", "waiting_for_disk", 30);
    let j = jobs(dir);
    let m = job_named(&j, "bad").unwrap()["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(m.contains("3 error(s) in the spec"), "{m}");
    assert!(m.contains("bad.toml:1:1: missing `models`"), "located: {m}");
    assert!(m.contains("cannot write"), "{m}");
    assert!(!dir.join("results/bad").is_dir(), "no folder left behind");
    std::fs::remove_file(dir.join("results/bad")).unwrap();
    d.wait_state("bad", "invalid", 30);
    let errors = read_json(&result_dirs(dir, "bad")[0].join("error.json"));
    assert_eq!(
        errors["errors"].as_array().map(Vec::len),
        Some(3),
        "{errors}"
    );
}

/// A tmpfs mounted on a folder for a test, unmounted when dropped; `None` when this
/// process may not mount (not root).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Option<Tmpfs> {
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Tmpfs(at.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// A real full disk: the results folder is a 2 MiB tmpfs filled to its last byte. A
/// search's results and an invalid spec's `error.json` cannot be written: both jobs wait
/// for disk (state, log line, `archplace_specs{state="waiting_for_disk"}`), the invalid
/// one with its first error in its message; once space returns both are written — the
/// search's without searching again.
#[test]
fn a_full_disk_pauses_jobs_until_space_returns() {
    let _gate = crate::util::shared();
    let tmp = folder();
    let dir = tmp.path();
    let results = dir.join("results");
    std::fs::create_dir_all(&results).unwrap();
    let Some(_disk) = Tmpfs::mount(&results, "2m") else {
        let root = Command::new("id")
            .arg("-u")
            .output()
            .map(|o| o.stdout == b"0\n");
        assert!(
            !root.unwrap_or(false),
            "running as root, yet a tmpfs could not be mounted"
        );
        eprintln!(
            "a_full_disk_pauses_jobs_until_space_returns: not root, cannot mount a tmpfs; the fault-injected tests cover the logic"
        );
        return;
    };
    let filler = results.join("filler");
    {
        use std::io::Write as _;
        let mut f = std::fs::File::create(&filler).unwrap();
        let chunk = vec![1u8; 4096];
        while f.write_all(&chunk).is_ok() {}
        while f.write_all(&[1]).is_ok() {}
        let _ = f.sync_all();
    }
    let d = Daemon::start_with(dir, &["--retry-seconds", "1"]);
    d.drop_spec("tiny.toml", TINY);
    d.drop_spec(
        "bad.toml",
        "schema_version = 1\nname = \"bad\"\n[training]\nmicro_batch_sizes = [3]\n",
    );
    d.wait_state("bad", "waiting_for_disk", 30);
    d.wait_state("e2e-tiny", "waiting_for_disk", 120);
    let j = jobs(dir);
    let message = |name: &str| {
        job_named(&j, name).unwrap()["message"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let m = message("e2e-tiny");
    assert!(m.contains("No space left on device"), "{m}");
    let m = message("bad");
    assert!(m.contains("bad.toml:1:1: missing `models`"), "{m}");
    assert!(d.log().contains("waiting for disk space"), "{}", d.log());
    d.until(Duration::from_secs(30), "the gauge to count both", || {
        d.metric("archplace_specs{state=\"waiting_for_disk\"}") == 2.0
    });
    std::fs::remove_file(&filler).unwrap();
    d.wait_state("e2e-tiny", "done", 60);
    d.wait_state("bad", "invalid", 30);
    assert!(
        result_dirs(dir, "e2e-tiny")[0]
            .join("result.json")
            .is_file()
    );
    assert!(result_dirs(dir, "bad")[0].join("error.json").is_file());
    let log = d.log();
    assert_eq!(log.matches("search ended: best").count(), 1, "{log}");
    assert!(
        log.contains("writing the results of the finished search again"),
        "{log}"
    );
    d.until(Duration::from_secs(30), "the gauge to drop", || {
        d.metric("archplace_specs{state=\"waiting_for_disk\"}") == 0.0
    });
}

/// Scrapes get through 80 slow clients above the 64-connection limit (each sends its
/// request head a few bytes at a time and reconnects when closed): a new connection takes
/// the place of the one waiting longest for a request, so ≥ 99% of 100 scrapes answer 200
/// (58% answered 503 before). The figures are printed (`--nocapture`).
#[test]
fn scrapes_get_through_slow_clients_above_the_connection_limit() {
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicBool, Ordering};
    let _gate = crate::util::shared();
    let tmp = folder();
    let d = Daemon::start(tmp.path());
    let addr = d.metrics_addr();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let slow: Vec<_> = (0..80)
        .map(|_| {
            let (addr, stop) = (addr.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Ok(mut s) = std::net::TcpStream::connect(&addr) else {
                        std::thread::sleep(Duration::from_millis(50));
                        continue;
                    };
                    let _ = s.write_all(b"GET /metrics HTTP/1.1\r\n");
                    while !stop.load(Ordering::Relaxed) && s.write_all(b"X-Slow: 1\r\n").is_ok() {
                        std::thread::sleep(Duration::from_millis(200));
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    let scrape = || -> Option<(bool, Duration)> {
        let t = Instant::now();
        let mut s = std::net::TcpStream::connect(&addr).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").ok()?;
        let mut head = [0u8; 12];
        s.read_exact(&mut head).ok()?;
        Some((head.ends_with(b"200"), t.elapsed()))
    };
    let mut ok = 0;
    let mut times = Vec::new();
    for _ in 0..100 {
        if let Some((good, took)) = scrape() {
            ok += usize::from(good);
            times.push(took);
        }
        std::thread::sleep(Duration::from_millis(30));
    }
    stop.store(true, Ordering::Relaxed);
    for t in slow {
        let _ = t.join();
    }
    times.sort();
    let median = times.get(times.len() / 2).copied().unwrap_or_default();
    let worst = times.last().copied().unwrap_or_default();
    println!(
        "scrapes under 80 slow clients: {ok} of 100 answered 200; median {median:?}, slowest {worst:?}"
    );
    assert!(ok >= 99, "{ok} of 100 scrapes answered 200\n{}", d.log());
}

/// A results folder deleted by hand is searched again at the next start (it was once never
/// regenerated); FIFOs and links out of the folder are skipped with a log line, once.
#[test]
fn deleted_results_are_regenerated_and_odd_files_are_reported() {
    let _gate = crate::util::shared();
    let tmp = folder();
    let dir = tmp.path();
    drop_spec(dir, "tiny.toml", TINY);
    let mut d = Daemon::start(dir);
    d.wait_state("e2e-tiny", "done", 60);
    d.signal("-TERM");
    d.wait(Duration::from_secs(10));
    std::fs::remove_dir_all(dir.join("results/e2e-tiny")).unwrap();
    assert!(
        Command::new("mkfifo")
            .arg(dir.join("specs/fifo.toml"))
            .status()
            .unwrap()
            .success()
    );
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("x.toml"), TINY).unwrap();
    std::os::unix::fs::symlink(outside.path().join("x.toml"), dir.join("specs/out.toml")).unwrap();
    let d = Daemon::start(dir);
    d.until(Duration::from_secs(60), "the results again", || {
        result_dirs(dir, "e2e-tiny")
            .iter()
            .any(|r| r.join("result.json").is_file())
    });
    d.wait_state("e2e-tiny", "done", 60);
    std::thread::sleep(Duration::from_millis(1500));
    let log = d.log();
    assert!(log.contains("its results are gone"), "{log}");
    assert_eq!(log.matches("search started").count(), 1, "{log}");
    assert_eq!(
        log.matches("skipped: not a regular file").count(),
        1,
        "{log}"
    );
    assert_eq!(
        log.matches("skipped: a symbolic link to a file outside")
            .count(),
        1,
        "{log}"
    );
}

/// Every JSON file under `dir` parses (nothing torn) and no temporary file is left.
fn assert_whole(dir: &Path, after_restart: bool) {
    for e in walk(dir) {
        let name = e.file_name().unwrap().to_string_lossy().into_owned();
        if name.ends_with(".json") {
            let bytes = std::fs::read(&e).unwrap();
            serde_json::from_slice::<serde_json::Value>(&bytes)
                .unwrap_or_else(|err| panic!("torn {}: {err}", e.display()));
        }
        if after_restart {
            assert!(
                !name.ends_with(".tmp"),
                "left behind: {}\n{:#?}",
                e.display(),
                walk(dir)
            );
        }
    }
}

/// The file-system steps of a job's life, from the daemon's log (the fault-injection hook
/// logs each): 13 atomic writes of 4 steps each, 52 in all — the job record written when
/// the spec is found, queued and started; `status.json` when the search starts and once a
/// second while it runs (once on a fast machine; each further second adds 4 steps); the
/// result files; `status.json` and the job record when it is done. Returns the number of
/// steps, after checking they are exactly these.
fn job_steps(log: &str) -> u32 {
    let steps: Vec<(&str, &str)> = log
        .lines()
        .filter(|l| l.contains("fault injection: step"))
        .map(|l| {
            let what = l.split("what=\"").nth(1).and_then(|w| w.split('"').next());
            let path = l.split("path=").nth(1).map(str::trim);
            (what.unwrap_or_default(), path.unwrap_or_default())
        })
        .collect();
    let phases = [
        "created the temporary file",
        "wrote the temporary file",
        "synced the temporary file",
        "renamed it into place",
    ];
    let mut files: Vec<&str> = Vec::new();
    for (i, write) in steps.chunks(4).enumerate() {
        let whats: Vec<&str> = write.iter().map(|s| s.0).collect();
        assert_eq!(whats, phases, "write {i} of {steps:?}");
        let path = write[0].1;
        assert!(write.iter().all(|s| s.1 == path), "{write:?}");
        files.push(if path.contains("/jobs/") {
            "job record"
        } else {
            path.rsplit('/').next().unwrap_or_default()
        });
    }
    // The progress writes after the first depend on the machine's speed.
    let mut shown: Vec<&str> = Vec::new();
    for (i, f) in files.iter().enumerate() {
        if !(*f == "status.json" && i >= 5 && files[i - 1] == "status.json") {
            shown.push(f);
        }
    }
    expect_test::expect![[r#"
        [
            "job record",
            "job record",
            "job record",
            "status.json",
            "status.json",
            "explored.jsonl",
            "spec.json",
            "pareto.svg",
            "placement.svg",
            "timeline.svg",
            "result.json",
            "status.json",
            "job record",
        ]
    "#]]
    .assert_debug_eq(&shown);
    let progress = files.len() - shown.len();
    assert_eq!(steps.len(), 52 + 4 * progress, "{files:?}");
    steps.len() as u32
}

/// Fault injection: the daemon is killed (aborted, as kill -9) at each file-system step of a
/// job's life in turn — every temporary file created, written, synced and renamed, for the
/// job records, `status.json`, `explored.jsonl`, the plots and `result.json` — then
/// restarted. Each time: no JSON torn, no temporary file left after the restart, exactly one
/// complete result, and a search whose results were complete before the kill is not
/// searched again.
#[test]
fn a_kill_at_every_file_system_step_loses_nothing_and_searches_nothing_twice() {
    let _gate = crate::util::shared();
    let mut step = 1u32;
    loop {
        let tmp = folder();
        let dir = tmp.path();
        drop_spec(dir, "tiny.toml", TINY);
        let at = step.to_string();
        let mut d = Daemon::start_env(
            dir,
            &[],
            &[(archplace_util::atomic::ABORT_AT_STEP_VAR, Path::new(&at))],
        );
        let t = Instant::now();
        let aborted = loop {
            if d.child.try_wait().unwrap().is_some() {
                break true;
            }
            if state_is(&jobs(dir), "e2e-tiny", "done") {
                // Past the job's last step: give a late write the chance to show.
                std::thread::sleep(Duration::from_millis(300));
                break d.child.try_wait().unwrap().is_some();
            }
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "step {step}: {}",
                d.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        if !aborted {
            // Every step of the job's life has been a kill point: this run, which none
            // stopped, had no more steps than the kills before it reached.
            let steps = job_steps(&d.log());
            assert!(steps < step, "{steps} steps, killed at {}", step - 1);
            eprintln!("killed and restarted at each of {} steps", step - 1);
            break;
        }
        assert!(d.log().contains("fault injection: aborting"), "{}", d.log());
        assert_whole(dir, false);
        let complete_before = result_dirs(dir, "e2e-tiny")
            .iter()
            .any(|r| r.join("result.json").is_file());
        std::fs::rename(dir.join("daemon.log"), dir.join("killed.log")).unwrap();
        let mut d = Daemon::start(dir);
        // Up (and past its start-up clean-up) before the job's state is believed.
        d.metrics_addr();
        d.wait_state("e2e-tiny", "done", 60);
        d.signal("-TERM");
        let (code, _) = d.wait(Duration::from_secs(10));
        assert_eq!(code, Some(0), "step {step}: {}", d.log());
        assert_whole(dir, true);
        let results = result_dirs(dir, "e2e-tiny");
        assert_eq!(results.len(), 1, "step {step}: {results:?}");
        let doc: serde_json::Value =
            serde_json::from_slice(&std::fs::read(results[0].join("result.json")).unwrap())
                .unwrap();
        assert!(doc["best"].is_object(), "step {step}: {doc}");
        let searched_again = d.log().matches("search started").count();
        if complete_before {
            assert_eq!(
                searched_again,
                0,
                "step {step}: searched twice\n{}",
                d.log()
            );
        } else {
            assert!(searched_again <= 1, "step {step}\n{}", d.log());
        }
        step += 1;
    }
}

/// A spec renamed while it is searched: the search goes on, and its job record,
/// `status.json` and metrics follow the new name (the old name once stayed).
#[test]
fn renaming_a_spec_during_its_search_moves_its_labels_and_paths() {
    let _gate = crate::util::shared();
    let tmp = folder();
    let dir = tmp.path();
    let d = Daemon::start(dir);
    let addr = d.metrics_addr();
    drop_spec(dir, "before.toml", &slow_spec());
    d.wait_state("default-bert-large", "running", 60);
    d.until(
        Duration::from_secs(60),
        "progress under the old name",
        || http_get(&addr, "/metrics").contains("file=\"before.toml\""),
    );
    std::fs::rename(dir.join("specs/before.toml"), dir.join("specs/after.toml")).unwrap();
    d.until(
        Duration::from_secs(60),
        "the metrics to follow the rename",
        || {
            let m = http_get(&addr, "/metrics");
            m.contains("archplace_search_candidates_evaluated{file=\"after.toml\"")
                && !m.contains("file=\"before.toml\"")
        },
    );
    let j = jobs(dir);
    let job = job_named(&j, "default-bert-large").unwrap();
    assert_eq!(job["state"], "running", "the search goes on: {job}");
    assert_eq!(job["file"], "specs/after.toml", "{job}");
    d.until(Duration::from_secs(30), "status.json to follow", || {
        std::fs::read_to_string(result_dirs(dir, "default-bert-large")[0].join("status.json"))
            .is_ok_and(|t| t.contains("specs/after.toml"))
    });
    assert!(d.log().contains("the spec was renamed"), "{}", d.log());
}

/// A byte-identical copy of a spec beside it is a duplicate, not a rename: logged as such,
/// searched once, and the job keeps the first file's name (both files stay).
#[test]
fn an_identical_copy_is_a_duplicate_not_a_rename() {
    let _gate = crate::util::shared();
    let tmp = folder();
    let dir = tmp.path();
    let d = Daemon::start(dir);
    drop_spec(dir, "first.toml", &slow_spec());
    d.wait_state("default-bert-large", "running", 60);
    drop_spec(dir, "copy.toml", &slow_spec());
    d.until(Duration::from_secs(30), "the duplicate in the log", || {
        d.log()
            .contains("the same content as another spec in the folder")
    });
    let log = d.log();
    assert!(!log.contains("the spec was renamed"), "{log}");
    assert!(
        log.contains("copy.toml") && log.contains("duplicate_of"),
        "{log}"
    );
    let j = jobs(dir);
    let job = job_named(&j, "default-bert-large").unwrap();
    assert_eq!(job["file"], "specs/first.toml", "{job}");
    assert_eq!(j.len(), 1, "searched once: {j:?}");
}

/// JSON log lines are objects with each key once ("search ended" once repeated the
/// `message` key, which log shippers reject or silently overwrite).
#[test]
fn json_log_lines_have_each_key_once() {
    let _gate = crate::util::shared();
    let tmp = folder();
    let dir = tmp.path();
    let d = Daemon::start_env(dir, &["--log-format", "json"], &[]);
    drop_spec(dir, "tiny.toml", TINY);
    d.wait_state("e2e-tiny", "done", 60);
    d.until(
        Duration::from_secs(10),
        "the search's end in the log",
        || d.log().contains("search ended"),
    );
    let log = d.log();
    let mut lines = 0;
    for line in log.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        let fields = v["fields"].as_object().unwrap_or_else(|| panic!("{line}"));
        // The text has exactly as many `"key":` as the parsed object has keys: none twice.
        let inner = line.split("\"fields\":").nth(1).unwrap_or_default();
        let inner = &inner[..inner.find('}').map_or(inner.len(), |i| i + 1)];
        for key in fields.keys() {
            assert_eq!(inner.matches(&format!("\"{key}\":")).count(), 1, "{line}");
        }
        lines += 1;
    }
    assert!(lines > 3, "{log}");
    assert!(log.contains("\"reason\":"), "{log}");
}

/// Sets the job record of spec `name` to `state`, as a kill at that moment leaves it.
fn set_job_state(dir: &Path, name: &str, state: &str) {
    for e in std::fs::read_dir(dir.join(".archplace-state/jobs")).unwrap() {
        let path = e.unwrap().path();
        let mut job: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        if job["name"] == name {
            job["state"] = state.into();
            std::fs::write(&path, serde_json::to_vec(&job).unwrap()).unwrap();
            return;
        }
    }
    panic!("no job record for {name}");
}

/// A kill after the results were written but before the job record said so (the whole spec
/// was once searched again): the restart finds the complete results and records the
/// job as done without searching.
#[test]
fn a_kill_between_the_results_and_the_job_record_does_not_search_again() {
    let _gate = crate::util::shared();
    let tmp = folder();
    let dir = tmp.path();
    drop_spec(dir, "tiny.toml", TINY);
    let mut d = Daemon::start(dir);
    d.wait_state("e2e-tiny", "done", 60);
    d.signal("-KILL");
    d.wait(Duration::from_secs(5));
    set_job_state(dir, "e2e-tiny", "running");
    let d = Daemon::start(dir);
    d.wait_state("e2e-tiny", "done", 60);
    std::thread::sleep(Duration::from_millis(500));
    let log = d.log();
    assert!(log.contains("recorded as done"), "{log}");
    assert!(!log.contains("search started"), "searched again:\n{log}");
    let j = jobs(dir);
    assert_eq!(job_named(&j, "e2e-tiny").unwrap()["attempts"], 1);
}

/// A spec during whose search the daemon keeps dying before any candidate is evaluated
/// (here: its latency plugin's first call never returns, and the daemon is killed each
/// time) is given up after three starts, with a message, its `error.json` and a final
/// `status.json` — instead of killing every restart under systemd's Restart=on-failure.
#[test]
fn a_search_the_daemon_keeps_dying_in_is_given_up_after_three_starts() {
    let _gate = crate::util::shared();
    let tmp = folder();
    let dir = tmp.path();
    install_unchecked(
        &dir.join("plugins"),
        "hostile-infinite-loop",
        "hostile-infinite-loop",
    );
    // Its calls may run (nearly) forever: the search makes no progress until killed.
    std::fs::write(
        dir.join("archplace.toml"),
        "[plugins.hostile-infinite-loop]\nfuel_per_call = 1000000000000000\ndeadline_seconds = 600\n",
    )
    .unwrap();
    let spec = TINY.replace("name = \"e2e-tiny\"", "name = \"dies\"")
        + "\n[cost_model]\nlatency = \"hostile-infinite-loop\"\n";
    drop_spec(dir, "dies.toml", &spec);
    for start in 1..=3 {
        let mut d = Daemon::start_with(dir, &["--config", "archplace.toml"]);
        d.until(Duration::from_secs(60), "the search to start", || {
            job_named(&jobs(dir), "dies")
                .is_some_and(|j| j["state"] == "running" && j["attempts"] == start)
        });
        std::thread::sleep(Duration::from_millis(300));
        d.signal("-KILL");
        d.wait(Duration::from_secs(5));
    }
    let d = Daemon::start_with(dir, &["--config", "archplace.toml"]);
    d.wait_state("dies", "failed", 60);
    let j = jobs(dir);
    let job = job_named(&j, "dies").unwrap();
    assert_eq!(job["attempts"], 3);
    assert_eq!(job["interrupted"], 3);
    assert!(
        job["message"]
            .as_str()
            .unwrap()
            .contains("stopped 3 times in a row"),
        "{job}"
    );
    assert!(d.log().contains("giving it up"), "{}", d.log());
    // Its folder says so, as every failed job's does.
    let out = &result_dirs(dir, "dies")[0];
    let err = std::fs::read_to_string(out.join("error.json")).unwrap();
    assert!(err.contains("not searched again"), "{err}");
    let status: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("status.json")).unwrap()).unwrap();
    assert_eq!(status["state"], "failed", "{status}");
}

/// Ten kill -9 of the daemon during a healthy search, each after the search made progress
/// (its journal gained candidates since it started), never give it up: each restart resumes it from its
/// journal, and the crash-loop guard counts nothing (it once failed healthy searches after
/// three kills).
#[test]
fn ten_kills_during_a_healthy_search_never_give_it_up() {
    let _gate = crate::util::shared();
    let tmp = folder();
    let dir = tmp.path();
    // The GPT-3 example, exhaustive: a search of many minutes.
    let spec = std::fs::read_to_string(root().join("config/specs/gpt3-175b.toml"))
        .unwrap()
        .replace("[search]", "[search]\nexhaustive = true");
    drop_spec(dir, "long.toml", &spec);
    for round in 1..=10 {
        let mut d = Daemon::start(dir);
        d.until(Duration::from_secs(60), "the search to (re)start", || {
            job_named(&jobs(dir), "gpt3-175b")
                .is_some_and(|j| j["state"] == "running" && j["attempts"] == round)
        });
        let at_start = job_named(&jobs(dir), "gpt3-175b").unwrap()["journal_candidates"]
            .as_u64()
            .unwrap_or(0);
        d.until(Duration::from_secs(120), "progress since the start", || {
            result_dirs(dir, "gpt3-175b").first().is_some_and(|r| {
                let lines = std::fs::read(r.join("journal.jsonl"))
                    .map_or(0, |b| b.iter().filter(|&&c| c == b'\n').count() as u64);
                lines.saturating_sub(1) > at_start
            })
        });
        d.signal("-KILL");
        d.wait(Duration::from_secs(5));
    }
    let d = Daemon::start(dir);
    d.until(Duration::from_secs(60), "the eleventh start", || {
        job_named(&jobs(dir), "gpt3-175b").is_some_and(|j| j["attempts"] == 11)
    });
    let j = jobs(dir);
    let job = job_named(&j, "gpt3-175b").unwrap();
    assert_eq!(job["state"], "running", "{job}");
    assert_eq!(job["interrupted"], 0, "{job}");
    assert!(!d.log().contains("giving it up"), "{}", d.log());
}

#[test]
fn a_corrupt_state_is_reported_and_rebuilt_from_the_folders() {
    let _gate = crate::util::shared();
    let tmp = folder();
    let dir = tmp.path();
    drop_spec(dir, "tiny.toml", TINY);
    let mut d = Daemon::start(dir);
    d.wait_state("e2e-tiny", "done", 60);
    d.signal("-TERM");
    d.wait(Duration::from_secs(10));
    for e in std::fs::read_dir(dir.join(".archplace-state/jobs")).unwrap() {
        std::fs::write(e.unwrap().path(), b"\0garbage").unwrap();
    }
    let d = Daemon::start(dir);
    d.wait_state("e2e-tiny", "done", 60);
    let log = d.log();
    assert!(log.contains("corrupt job record"), "{log}");
    assert!(!log.contains("search started"), "searched again:\n{log}");
}

#[test]
fn systemd_hears_ready_status_watchdog_and_stopping() {
    let _gate = crate::util::shared();
    let tmp = folder();
    let dir = tmp.path();
    let socket_path = dir.join("notify.sock");
    let socket = std::os::unix::net::UnixDatagram::bind(&socket_path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    drop_spec(dir, "slow.toml", &slow_spec());
    let mut d = Daemon::start_env(dir, &[], &[("NOTIFY_SOCKET", &socket_path)]);
    let mut heard = String::new();
    let mut buf = [0u8; 4096];
    let t = Instant::now();
    while !(heard.contains("READY=1")
        && heard.contains("WATCHDOG=1")
        && heard.contains("default-bert-large: "))
    {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "heard only:\n{heard}\n{}",
            d.log()
        );
        if let Ok(n) = socket.recv(&mut buf) {
            heard.push_str(&String::from_utf8_lossy(&buf[..n]));
            heard.push('\n');
        }
    }
    assert!(heard.contains("STATUS=1 running"), "{heard}");
    d.signal("-TERM");
    let t = Instant::now();
    while !heard.contains("STOPPING=1") {
        assert!(t.elapsed() < Duration::from_secs(10), "{heard}");
        if let Ok(n) = socket.recv(&mut buf) {
            heard.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    }
    d.wait(Duration::from_secs(10));
}
