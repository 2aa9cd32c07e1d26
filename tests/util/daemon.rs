//! `archplace daemon` as a child process in a folder of its own (`specs/`, `results/`,
//! its state, `daemon.log`), and what tests read of it: its log, jobs, result files and
//! metrics.

use super::{root, wait_until};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Daemon {
    pub child: Child,
    pub dir: PathBuf,
}

impl Daemon {
    /// A daemon on a free metrics port, settling specs after 0.3 s.
    pub fn start(dir: &Path) -> Daemon {
        Self::start_with(dir, &[])
    }

    /// With `extra` arguments.
    pub fn start_with(dir: &Path, extra: &[&str]) -> Daemon {
        Self::start_env(dir, extra, &[])
    }

    /// With `extra` arguments and environment variables.
    pub fn start_env(dir: &Path, extra: &[&str], env: &[(&str, &Path)]) -> Daemon {
        Self::start_via(
            Command::new(env!("CARGO_BIN_EXE_archplace")),
            dir,
            extra,
            env,
        )
    }

    /// Started with at most `files` open file descriptors (`ulimit -n`).
    pub fn start_with_open_files(dir: &Path, files: u32) -> Daemon {
        let mut sh = Command::new("sh");
        sh.args([
            "-c",
            &format!("ulimit -n {files} && exec \"$0\" \"$@\""),
            env!("CARGO_BIN_EXE_archplace"),
        ]);
        Self::start_via(sh, dir, &[], &[])
    }

    fn start_via(mut cmd: Command, dir: &Path, extra: &[&str], env: &[(&str, &Path)]) -> Daemon {
        let settle: &[&str] = if extra.contains(&"--settle-seconds") {
            &[]
        } else {
            &["--settle-seconds", "0.3"]
        };
        let log = std::fs::File::create(dir.join("daemon.log")).expect("the daemon's log");
        let child = in_folder(&mut cmd, dir)
            .args(["daemon", "--listen", "127.0.0.1:0"])
            .args(settle)
            .args(extra)
            .envs(env.iter().map(|(k, v)| (*k, *v)))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("the daemon starts");
        Daemon {
            child,
            dir: dir.to_path_buf(),
        }
    }

    /// A daemon of a pool on `nats`, named `name`, with the tests' pool settings (short ack
    /// wait, one thread) and `pool` added to its `[pool]` table; waits until it joined.
    pub fn pooled(dir: &Path, nats: &str, name: &str, pool: &str) -> Daemon {
        Self::pooled_env(dir, nats, name, pool, &[])
    }

    /// [`Daemon::pooled`] with environment variables.
    pub fn pooled_env(
        dir: &Path,
        nats: &str,
        name: &str,
        pool: &str,
        env: &[(&str, &str)],
    ) -> Daemon {
        std::fs::create_dir_all(dir.join("specs")).expect("specs/");
        std::fs::create_dir_all(dir.join("plugins")).expect("plugins/");
        // A short ack wait unless the test sets its own.
        let ack_wait = if pool.contains("ack_wait_seconds") {
            ""
        } else {
            "ack_wait_seconds = 3\n"
        };
        std::fs::write(
            dir.join("archplace.toml"),
            format!(
                "threads_per_search = 1\nsettle_seconds = 0.2\n[pool]\nname = \"{name}\"\nworker_threads = 1\n{ack_wait}connect_timeout_seconds = 20\n{pool}\n"
            ),
        )
        .expect("the daemon's config");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("daemon.log"))
            .expect("the daemon's log");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_archplace"));
        let child = in_folder(&mut cmd, dir)
            .args([
                "daemon",
                "--config",
                "archplace.toml",
                "--listen",
                "127.0.0.1:0",
                "--nats",
                nats,
            ])
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("the daemon starts");
        let d = Daemon {
            child,
            dir: dir.to_path_buf(),
        };
        d.until(Duration::from_secs(30), "joined the pool", || {
            d.log().contains("working for the pool") || d.log().contains("joined the pool")
        });
        d
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("daemon.log")).unwrap_or_default()
    }

    /// Sends `sig` (`-TERM`, `-HUP`, …) to the daemon.
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(ok.success());
    }

    pub fn kill_9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for the process to end; its exit status and how long it took.
    pub fn wait(&mut self, limit: Duration) -> (Option<i32>, Duration) {
        let t = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().expect("the daemon's status") {
                return (s.code(), t.elapsed());
            }
            if t.elapsed() > limit {
                let _ = self.child.kill();
                panic!("the daemon did not stop within {limit:?}\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until `cond` holds, or fails the test with the daemon's log.
    pub fn until(&self, limit: Duration, what: &str, cond: impl FnMut() -> bool) {
        wait_until(limit, what, cond, || {
            format!("--- {} log:\n{}", self.dir.display(), self.log())
        });
    }

    /// Drops `text` into the spec folder the documented way.
    pub fn drop_spec(&self, name: &str, text: &str) {
        drop_spec(&self.dir, name, text);
    }

    /// Waits up to `seconds` until the job of spec `name` is in `state`.
    pub fn wait_state(&self, name: &str, state: &str, seconds: u64) {
        self.until(
            Duration::from_secs(seconds),
            &format!("the job of `{name}` to be {state}"),
            || state_is(&jobs(&self.dir), name, state),
        );
    }

    /// The result folder of spec `name` (once it exists).
    pub fn result_dir(&self, name: &str) -> Option<PathBuf> {
        result_dirs(&self.dir, name)
            .into_iter()
            .find(|p| p.is_dir())
    }

    /// The JSON file `file` of the results of spec `name`, once it can be read.
    pub fn file(&self, name: &str, file: &str) -> Option<serde_json::Value> {
        let p = self.result_dir(name)?.join(file);
        serde_json::from_slice(&std::fs::read(p).ok()?).ok()
    }

    pub fn wait_file(&self, name: &str, file: &str, seconds: u64) -> serde_json::Value {
        let mut v = None;
        self.until(Duration::from_secs(seconds), file, || {
            v = self.file(name, file);
            v.is_some()
        });
        v.expect("the file was read")
    }

    /// The metrics endpoint's address, from the daemon's log (it was asked for a free port).
    pub fn metrics_addr(&self) -> String {
        let mut log = String::new();
        self.until(
            Duration::from_secs(30),
            "the metrics URL in the log",
            || {
                log = self.log();
                log.contains("metrics at http://")
            },
        );
        log.split("metrics at http://")
            .nth(1)
            .and_then(|r| r.split("/metrics").next())
            .unwrap_or_else(|| panic!("no metrics URL in the log:\n{log}"))
            .to_string()
    }

    /// Items answered so far by the pooled search `name` this daemon coordinates
    /// (`status.json`).
    pub fn answered(&self, name: &str) -> u64 {
        self.file(name, "status.json")
            .and_then(|s| s["pool"]["items_answered"].as_u64())
            .unwrap_or(0)
    }

    /// A scrape of `/metrics`.
    pub fn metrics(&self) -> String {
        http_get(&self.metrics_addr(), "/metrics")
    }

    /// The value of the sample `series` (name and labels exactly as exported); 0 if absent.
    pub fn metric(&self, series: &str) -> f64 {
        sample(&self.metrics(), series).unwrap_or(0.0)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Drops `text` into `dir/specs` the documented way: a temporary name, then a rename.
pub fn drop_spec(dir: &Path, name: &str, text: &str) {
    let tmp = dir.join("specs").join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).expect("the spec is written");
    std::fs::rename(&tmp, dir.join("specs").join(name)).expect("the spec is renamed");
}

/// The job records in `dir`'s state.
pub fn jobs(dir: &Path) -> Vec<serde_json::Value> {
    let Ok(rd) = std::fs::read_dir(dir.join(".archplace-state/jobs")) else {
        return vec![];
    };
    // Records only: a write's temporary file (`.archplace-*.tmp`) holds a record that is
    // not in force until it is renamed.
    rd.filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .filter_map(|p| std::fs::read(p).ok())
        .filter_map(|b| serde_json::from_slice(&b).ok())
        .collect()
}

pub fn job_named<'a>(jobs: &'a [serde_json::Value], name: &str) -> Option<&'a serde_json::Value> {
    jobs.iter().find(|j| j["name"] == name)
}

/// Whether the job of spec `name` is in `state`.
pub fn state_is(jobs: &[serde_json::Value], name: &str, state: &str) -> bool {
    job_named(jobs, name).is_some_and(|j| j["state"] == state)
}

/// The result folders of spec `name` under `dir/results`.
pub fn result_dirs(dir: &Path, name: &str) -> Vec<PathBuf> {
    std::fs::read_dir(dir.join("results").join(name))
        .map(|rd| rd.filter_map(|e| Some(e.ok()?.path())).collect())
        .unwrap_or_default()
}

/// A bare HTTP/1.0 GET; the whole response.
pub fn http_get(addr: &str, path: &str) -> String {
    http_request(addr, "GET", path).1
}

/// The status line and the whole answer of one request (HTTP/1.0, so the server closes).
pub fn http_request(addr: &str, method: &str, path: &str) -> (String, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("the endpoint accepts");
    write!(s, "{method} {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").expect("the request is sent");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("the answer is read");
    (out.lines().next().unwrap_or_default().to_string(), out)
}

/// The value of the sample `series` (name and labels exactly as exported) in a scrape.
pub fn sample(scrape: &str, series: &str) -> Option<f64> {
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// `cmd` run in the daemon's folder `dir`, with the tests' plugin cache and plugin folders
/// (the built plugins, then `dir/plugins`) and log level: what every test daemon shares.
fn in_folder<'c>(cmd: &'c mut Command, dir: &Path) -> &'c mut Command {
    cmd.current_dir(dir)
        .env("ARCHPLACE_CACHE_DIR", root().join("target/test-cache"))
        .env(
            "ARCHPLACE_PLUGIN_DIRS",
            std::env::join_paths([root().join("target/plugins"), dir.join("plugins")])
                .expect("plugin folders"),
        )
        .env("RUST_LOG", "info,highs=error")
}
