//! The runbook's commands (`docs/runbook.md`), run as an operator would run them: every
//! `curl` against a daemon with a finished job, every `archplace` command, and every log
//! line the runbook tells to `grep` for, found in that daemon's log. The commands are read
//! from the runbook (tests as data): one this test does not know how to run fails it, so
//! a command added to the runbook is a command tested. System tools (`systemctl`,
//! `journalctl` without a `grep`) are the system's, not archplace's.

use crate::util::daemon::{drop_spec, http_request, jobs};
use crate::util::*;
use std::time::Duration;

/// Every code span of the runbook.
fn spans(text: &str) -> Vec<String> {
    // Spans may wrap over a line break: joined with a space, as Markdown renders them.
    let flat = text.replace('\n', " ");
    flat.split('`')
        .skip(1)
        .step_by(2)
        .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

#[test]
fn every_command_of_the_runbook_works_against_a_daemon() {
    let _gate = crate::util::shared();
    let runbook = std::fs::read_to_string(root().join("docs/runbook.md")).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let d = Daemon::start(dir);
    d.until(Duration::from_secs(30), "the spec folder", || {
        dir.join("specs/default.toml").exists()
    });
    std::fs::remove_file(dir.join("specs/default.toml")).unwrap();
    drop_spec(dir, "tiny.toml", TINY);
    let result = d.wait_file("e2e-tiny", "result.json", 120);
    assert!(result["best"].is_object(), "{result}");
    let hash = jobs(dir)
        .iter()
        .find(|j| j["name"] == "e2e-tiny")
        .and_then(|j| j["hash"].as_str().map(str::to_string))
        .expect("the job");
    let addr = d.metrics_addr();
    let (spec_dir, spec) = temp_spec("tiny.toml", TINY);
    let spec = spec.display().to_string();
    let config = spec_dir.path().join("archplace.toml");
    std::fs::write(&config, "threads_per_search = 1\n").unwrap();
    let config = config.display().to_string();
    let reference = component("reference").display().to_string();
    let mut ran = Vec::new();
    for span in spans(&runbook) {
        let words: Vec<&str> = span.split(' ').collect();
        let run_ok = |args: &[&str]| {
            let out = archplace()
                .args(args)
                .env("ARCHPLACE_PLUGIN_DIRS", root().join("target/plugins"))
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "`{span}` as `archplace {}`: {}",
                args.join(" "),
                stderr(&out)
            );
            stdout(&out)
        };
        match words.as_slice() {
            ["curl", "-s", url] => {
                let path = url
                    .split_once(":9464")
                    .map(|(_, p)| p.replace("<hash>", &hash))
                    .unwrap_or_else(|| panic!("`{span}`: not the daemon's address"));
                let (status, answer) = http_request(&addr, "GET", &path);
                assert!(status.contains(" 200 "), "`{span}`: {status}\n{answer}");
                if path.starts_with("/jobs") {
                    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
                    let v: serde_json::Value = serde_json::from_str(body)
                        .unwrap_or_else(|e| panic!("`{span}`: {e}: {body}"));
                    assert!(body.contains(&hash), "`{span}`: the job is in {v}");
                }
            }
            ["archplace", "validate", "--config", _] => {
                run_ok(&["validate", "--config", &config]);
            }
            ["archplace", "validate", "SPEC"] => {
                run_ok(&["validate", &spec]);
            }
            ["archplace", "run"] => {
                let out = spec_dir.path().join("out");
                run_ok(&["run", &spec, "--out", &out.display().to_string()]);
                assert!(out.join("result.json").is_file(), "`{span}`");
            }
            ["archplace", "plugin", "list"] => {
                let listed = run_ok(&["plugin", "list"]);
                assert!(listed.contains("reference"), "`{span}`: {listed}");
            }
            ["archplace", "plugin", "check", "FILE.wasm"] => {
                run_ok(&["plugin", "check", &reference]);
            }
            ["archplace", "plugin", "install", "--pin", "FILE.wasm"] => {
                let into = spec_dir.path().join("pinned");
                let into = into.display().to_string();
                run_ok(&["plugin", "install", "--pin", &reference, "--dir", &into]);
                let manifest = std::fs::read_to_string(
                    spec_dir.path().join("pinned/reference-0.1.0/plugin.toml"),
                )
                .unwrap();
                assert!(manifest.contains("blake3"), "`{span}`: pinned: {manifest}");
            }
            ["journalctl", ..] if span.contains("grep '") => {
                let phrase = span
                    .split_once("grep '")
                    .and_then(|(_, p)| p.split_once('\''))
                    .map_or("", |(p, _)| p);
                assert!(
                    d.log().contains(phrase),
                    "`{span}`: the log never says `{phrase}`:\n{}",
                    d.log()
                );
            }
            ["archplace", _, ..] | ["curl", _, ..] => {
                panic!("the runbook's `{span}` is not run by this test: teach it how")
            }
            _ => continue,
        }
        ran.push(span);
    }
    // The commands the runbook had when this test was written are all still there.
    for kind in [
        "curl -s 127.0.0.1:9464/jobs",
        "curl -s 127.0.0.1:9464/livez",
        "archplace validate",
        "archplace plugin",
        "grep",
    ] {
        assert!(
            ran.iter().any(|s| s.contains(kind)),
            "no `{kind}` run: {ran:?}"
        );
    }
}
