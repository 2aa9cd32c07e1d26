//! The systemd unit's system-call filter, applied without systemd: does a search — wasmtime
//! compiling and running the cost-model plugin, HiGHS, rayon, the result files — and the
//! daemon (inotify, the tokio HTTP endpoint, signals) run under it?
//!
//! The unit says `SystemCallFilter=@system-service` then `SystemCallFilter=~@privileged
//! @obsolete` (with `NoNewPrivileges=true`; a call outside kills the process with SIGSYS).
//! This test expands those sets with `systemd-analyze syscall-filter` (the systemd on this
//! machine: the same tables the unit gets), builds the allow-list as a seccomp BPF program
//! (`seccompiler`), installs it in the child between fork and exec, and requires the
//! commands to succeed. Names this seccompiler does not know (syscalls newer than its table)
//! are left out, which makes the filter stricter than systemd's, never looser.

use crate::util::root;
use std::collections::{BTreeMap, BTreeSet};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Every group `systemd-analyze syscall-filter` prints, with its members (syscalls and
/// `@groups`).
fn groups() -> BTreeMap<String, Vec<String>> {
    let out = Command::new("systemd-analyze")
        .arg("syscall-filter")
        .output()
        .expect("systemd-analyze (Debian's `systemd` package; scripts/setup installs it)");
    assert!(out.status.success());
    let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut current = None;
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        if let Some(name) = line.strip_prefix('@') {
            current = Some(format!("@{}", name.trim()));
            groups.entry(format!("@{}", name.trim())).or_default();
        } else if let Some(member) = line.strip_prefix("    ")
            && !member.starts_with('#')
            && !member.trim().is_empty()
            && let Some(g) = &current
        {
            groups.get_mut(g).unwrap().push(member.trim().to_string());
        }
    }
    groups
}

fn expand(name: &str, groups: &BTreeMap<String, Vec<String>>, out: &mut BTreeSet<String>) {
    match groups.get(name) {
        Some(members) => {
            for m in members {
                expand(m, groups, out);
            }
        }
        None if name.starts_with('@') => panic!("unknown group {name}"),
        None => {
            out.insert(name.to_string());
        }
    }
}

/// The unit's allow-list: `@system-service` minus `@privileged` and `@obsolete`.
fn allowed() -> BTreeSet<String> {
    let g = groups();
    let mut allow = BTreeSet::new();
    expand("@system-service", &g, &mut allow);
    let mut deny = BTreeSet::new();
    expand("@privileged", &g, &mut deny);
    expand("@obsolete", &g, &mut deny);
    allow.retain(|s| !deny.contains(s));
    assert!(allow.len() > 200, "{}", allow.len());
    assert!(allow.contains("read") && !allow.contains("reboot") && !allow.contains("mount"));
    allow
}

fn filter_json(names: &[&String]) -> String {
    let rules: Vec<serde_json::Value> = names
        .iter()
        .map(|n| serde_json::json!({ "syscall": n }))
        .collect();
    serde_json::json!({
        "main": { "mismatch_action": "kill_process", "match_action": "allow", "filter": rules }
    })
    .to_string()
}

/// The allow-list as a BPF program for this machine's architecture.
fn program() -> seccompiler::BpfProgram {
    let arch = seccompiler::TargetArch::x86_64;
    let allow = allowed();
    let known: Vec<&String> = allow
        .iter()
        .filter(|n| seccompiler::compile_from_json(filter_json(&[n]).as_bytes(), arch).is_ok())
        .collect();
    let left_out: Vec<&String> = allow.iter().filter(|n| !known.contains(n)).collect();
    eprintln!(
        "allow-list: {} syscalls; unknown to seccompiler, left out: {left_out:?}",
        known.len()
    );
    let mut map = seccompiler::compile_from_json(filter_json(&known).as_bytes(), arch).unwrap();
    map.remove("main").unwrap()
}

/// `archplace` with the filter installed in the child before exec.
fn filtered(program: &seccompiler::BpfProgram) -> Command {
    use std::os::unix::process::CommandExt;
    let mut c = Command::new(env!("CARGO_BIN_EXE_archplace"));
    let program = program.clone();
    #[allow(unsafe_code)]
    // SAFETY: between fork and exec the closure only makes the two system calls
    // `apply_filter` makes (prctl, seccomp) on memory prepared before the fork.
    unsafe {
        c.pre_exec(move || seccompiler::apply_filter(&program).map_err(std::io::Error::other));
    }
    c
}

#[cfg(target_arch = "x86_64")]
#[test]
fn a_search_and_the_daemon_run_under_the_units_system_call_filter() {
    let _gate = crate::util::shared();
    let program = program();
    let tmp = tempfile::tempdir().unwrap();
    // A fresh compiled-plugin cache: wasmtime compiles the plugin under the filter too.
    let cache = tmp.path().join("cache");

    // The filter is enforced: a privileged call kills the process.
    let o = filtered(&program).args(["--version"]).output().unwrap();
    assert!(o.status.success(), "{o:?}");
    let mut probe = Command::new("sh");
    {
        use std::os::unix::process::CommandExt;
        let program = program.clone();
        #[allow(unsafe_code)]
        // SAFETY: as in `filtered`.
        unsafe {
            probe.pre_exec(move || {
                seccompiler::apply_filter(&program).map_err(std::io::Error::other)
            });
        }
    }
    // `mount` is @privileged (@mount): sh's call is answered with SIGSYS.
    let status = probe
        .args(["-c", "exec mount -t tmpfs none /mnt 2>/dev/null"])
        .status()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        status.signal(),
        Some(31),
        "mount was not stopped: {status:?}"
    );

    // One search, end to end.
    let spec = tmp.path().join("tiny.toml");
    std::fs::copy(root().join("tests/fixtures/tiny.toml"), &spec).unwrap();
    let o = filtered(&program)
        .args(["run"])
        .arg(&spec)
        .arg("--out")
        .arg(tmp.path().join("out"))
        .env("ARCHPLACE_CACHE_DIR", &cache)
        .env_remove("ARCHPLACE_PLUGIN_DIRS")
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{:?}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(tmp.path().join("out/result.json").is_file());

    // The daemon: watch, search, serve, stop on SIGTERM.
    let work = tmp.path().join("daemon");
    std::fs::create_dir_all(work.join("specs")).unwrap();
    std::fs::copy(
        root().join("tests/fixtures/tiny.toml"),
        work.join("specs/tiny.toml"),
    )
    .unwrap();
    let mut child = filtered(&program)
        .args([
            "daemon",
            "--listen",
            "127.0.0.1:0",
            "--settle-seconds",
            "0.2",
        ])
        .current_dir(&work)
        .env("ARCHPLACE_CACHE_DIR", &cache)
        .env("ARCHPLACE_PLUGIN_DIRS", root().join("target/plugins"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(work.join("daemon.log")).unwrap())
        .spawn()
        .unwrap();
    let log = || std::fs::read_to_string(work.join("daemon.log")).unwrap_or_default();
    let t = Instant::now();
    while !log().contains("search ended") {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the daemon died: {:?}\n{}",
            child.try_wait(),
            log()
        );
        assert!(t.elapsed() < Duration::from_secs(120), "{}", log());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(log().contains("state=\"done\""), "{}", log());
    let addr = log()
        .split("metrics at http://")
        .nth(1)
        .and_then(|r| r.split("/metrics").next())
        .unwrap()
        .to_string();
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    use std::io::{Read, Write};
    write!(s, "GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    assert!(
        body.starts_with("HTTP/1.0 200") || body.starts_with("HTTP/1.1 200"),
        "{body}"
    );
    let ok = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(t.elapsed() < Duration::from_secs(15), "{}", log());
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}\n{}", log());
}
