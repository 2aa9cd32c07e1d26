//! The pool (`archplace daemon --nats`): several daemons on one NATS JetStream server
//! search one spec together, and the result is the single-machine one — with a worker
//! killed, the coordinator killed and restarted, the NATS server restarted; a worker's
//! faulting plugin fails the search with the reason; deleting the spec stops every worker.
//!
//! Each test starts its own `nats-server -js` (Debian's `nats-server` package; `scripts/
//! setup` installs it) on a free loopback port with its store in a temporary folder. The
//! tests run one at a time (each starts several daemons; on a 2-core machine they would
//! only slow each other down).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// 128 chips of an 8-layer model (126 fit): about 10 s on one thread of a debug build;
/// every layer schedule bounded by a node limit, so each candidate's result is the same on
/// every machine and in every run.
fn spec(name: &str, exhaustive: bool) -> String {
    let s = include_str!("fixtures/tiny.toml")
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
            "exhaustive = false\nconvergence_window = 2",
        )
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `nats-server -js` of the test's own: loopback, a free port, its store in `dir`.
struct Nats {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Nats {
    fn start(dir: &Path) -> Nats {
        Self::start_on(dir, free_port())
    }

    fn start_on(dir: &Path, port: u16) -> Nats {
        let store = dir.join("nats");
        std::fs::create_dir_all(&store).unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("nats.log"))
            .unwrap();
        let child = Command::new("nats-server")
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(&store)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("nats-server (Debian package nats-server; scripts/setup installs it)");
        let t = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "nats-server did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Nats {
            child,
            port,
            dir: dir.to_path_buf(),
        }
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Stops the server (SIGTERM: JetStream's files are flushed) and starts it again on the
    /// same port and store.
    fn restart(&mut self, down: Duration) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
        std::thread::sleep(down);
        let again = Nats::start_on(&self.dir, self.port);
        let old = std::mem::replace(self, again);
        std::mem::forget(old);
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A daemon of the pool in its own folder (`specs/`, `results/`, state, log), with the
/// test's pool settings: short ack wait, one thread.
struct Daemon {
    child: Child,
    dir: PathBuf,
}

impl Daemon {
    fn start(dir: &Path, nats: &str, name: &str, pool: &str) -> Daemon {
        std::fs::create_dir_all(dir.join("specs")).unwrap();
        std::fs::create_dir_all(dir.join("plugins")).unwrap();
        std::fs::write(
            dir.join("archplace.toml"),
            format!(
                "threads_per_search = 1\nsettle_seconds = 0.2\n[pool]\nname = \"{name}\"\nworker_threads = 1\nack_wait_seconds = 3\nconnect_timeout_seconds = 20\n{pool}\n"
            ),
        )
        .unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("daemon.log"))
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_archplace"))
            .args([
                "daemon",
                "--config",
                "archplace.toml",
                "--listen",
                "127.0.0.1:0",
                "--nats",
                nats,
            ])
            .current_dir(dir)
            .env("ARCHPLACE_CACHE_DIR", root().join("target/test-cache"))
            .env(
                "ARCHPLACE_PLUGIN_DIRS",
                std::env::join_paths([root().join("target/plugins"), dir.join("plugins")]).unwrap(),
            )
            .env("RUST_LOG", "info,highs=error")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let d = Daemon {
            child,
            dir: dir.to_path_buf(),
        };
        d.until(Duration::from_secs(30), "joined the pool", || {
            d.log().contains("working for the pool") || d.log().contains("joined the pool")
        });
        d
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("daemon.log")).unwrap_or_default()
    }

    fn kill_9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn until(&self, limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
        let t = Instant::now();
        while !cond() {
            assert!(
                t.elapsed() < limit,
                "timed out waiting for {what}\n--- {} log:\n{}",
                self.dir.display(),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn drop_spec(&self, name: &str, text: &str) {
        let tmp = self.dir.join("specs").join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, self.dir.join("specs").join(name)).unwrap();
    }

    /// The result folder of spec `name` (once it exists).
    fn result_dir(&self, name: &str) -> Option<PathBuf> {
        let rd = std::fs::read_dir(self.dir.join("results").join(name)).ok()?;
        rd.filter_map(|e| e.ok())
            .map(|e| e.path())
            .find(|p| p.is_dir())
    }

    fn file(&self, name: &str, file: &str) -> Option<serde_json::Value> {
        let p = self.result_dir(name)?.join(file);
        serde_json::from_slice(&std::fs::read(p).ok()?).ok()
    }

    fn wait_file(&self, name: &str, file: &str, seconds: u64) -> serde_json::Value {
        let mut v = None;
        self.until(Duration::from_secs(seconds), file, || {
            v = self.file(name, file);
            v.is_some()
        });
        v.unwrap()
    }

    fn metrics(&self) -> String {
        let log = self.log();
        let addr = log
            .split("metrics at http://")
            .nth(1)
            .and_then(|r| r.split("/metrics").next())
            .unwrap()
            .to_string();
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    fn metric(&self, series: &str) -> f64 {
        self.metrics()
            .lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0.0)
    }

    /// Items answered so far by the search `name` this daemon coordinates (`status.json`).
    fn answered(&self, name: &str) -> u64 {
        self.file(name, "status.json")
            .and_then(|s| s["pool"]["items_answered"].as_u64())
            .unwrap_or(0)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The single-machine result of `text` (`archplace run`), in `dir`.
fn single(dir: &Path, text: &str) -> PathBuf {
    let spec = dir.join("single.toml");
    std::fs::write(&spec, text).unwrap();
    let out = dir.join("single");
    let ok = Command::new(env!("CARGO_BIN_EXE_archplace"))
        .arg("run")
        .arg(&spec)
        .arg("--out")
        .arg(&out)
        .env("ARCHPLACE_CACHE_DIR", root().join("target/test-cache"))
        .env("ARCHPLACE_PLUGIN_DIRS", root().join("target/plugins"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(ok.success());
    out
}

/// A result without what describes the run rather than the search.
fn comparable(mut doc: serde_json::Value) -> serde_json::Value {
    let o = doc.as_object_mut().unwrap();
    o.remove("timings");
    o.remove("work");
    o["search"]
        .as_object_mut()
        .unwrap()
        .remove("resumed_candidates");
    doc
}

/// The pooled result in `pooled` is the single-machine one in `single`: `result.json` but
/// for timings and work, `explored.jsonl` byte for byte.
fn assert_same(single: &Path, pooled: &Path) {
    let read = |d: &Path| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(d.join("result.json")).unwrap()).unwrap()
    };
    let (a, b) = (read(single), read(pooled));
    assert_eq!(comparable(a), comparable(b));
    let (a, b) = (
        std::fs::read(single.join("explored.jsonl")).unwrap(),
        std::fs::read(pooled.join("explored.jsonl")).unwrap(),
    );
    assert!(a == b, "explored.jsonl differs");
}

fn folder() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("archplace-pool-")
        .tempdir()
        .unwrap()
}

/// Three daemons, an exhaustive search dropped into one of them, a worker killed (-9)
/// while it holds an item: the item is redelivered after the ack wait and the result is
/// the single-machine one.
#[test]
fn a_pool_of_three_with_a_worker_killed_gives_the_single_machine_result() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = folder();
    let t = tmp.path();
    let text = spec("pooled", true);
    let reference = single(t, &text);
    let nats = Nats::start(t);
    let a = Daemon::start(&t.join("a"), &nats.url(), "a", "");
    let b = Daemon::start(&t.join("b"), &nats.url(), "b", "");
    let mut c = Daemon::start(&t.join("c"), &nats.url(), "c", "");
    a.drop_spec("pooled.toml", &text);
    a.until(Duration::from_secs(120), "items answered", || {
        a.answered("pooled") >= 4
    });
    // Killed while it holds an item (it is idle only for the moment between two items,
    // or when the queue is empty).
    c.until(Duration::from_secs(60), "c busy", || {
        c.metric("archplace_pool_worker_busy") == 1.0
    });
    c.kill_9();
    let result = a.wait_file("pooled", "result.json", 300);
    assert_same(&reference, &a.result_dir("pooled").unwrap());
    let redelivered = a.metric("archplace_pool_items_redelivered_total")
        + b.metric("archplace_pool_items_redelivered_total");
    assert!(
        redelivered >= 1.0,
        "the killed worker's item was redelivered"
    );
    let pool = &result["work"]["pool"];
    assert_eq!(pool["items_answered"], pool["items_total"], "{pool}");
    assert_eq!(
        pool["items_speculative"], 0,
        "exhaustive: nothing is speculative"
    );
}

/// A converging search: the same result, and what was published past the convergence
/// point is counted and at most the look-ahead.
#[test]
fn a_converging_pooled_search_gives_the_same_result_and_bounds_its_speculation() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = folder();
    let t = tmp.path();
    let text = spec("converging", false);
    let reference = single(t, &text);
    let nats = Nats::start(t);
    let pool = "look_ahead_items = 3\nitem_candidates = 2";
    let a = Daemon::start(&t.join("a"), &nats.url(), "a", pool);
    let _b = Daemon::start(&t.join("b"), &nats.url(), "b", pool);
    a.drop_spec("converging.toml", &text);
    let result = a.wait_file("converging", "result.json", 300);
    assert_same(&reference, &a.result_dir("converging").unwrap());
    assert_eq!(result["search"]["converged"], true, "{result}");
    let p = &result["work"]["pool"];
    let speculative = p["items_speculative"].as_u64().unwrap();
    assert!(speculative <= 3, "{p}");
    assert!(
        p["items_published"].as_u64().unwrap() < p["items_total"].as_u64().unwrap(),
        "{p}"
    );
    assert_eq!(
        a.metric("archplace_pool_speculative_items_total"),
        speculative as f64
    );
}

/// The coordinator killed (-9) mid-search and started again: the search resumes from its
/// journal, the answers stored meanwhile and the published items — no item is evaluated
/// twice (the two workers' completed items add up to the items) and the result is the
/// single-machine one.
#[test]
fn a_killed_coordinator_resumes_without_evaluating_any_item_twice() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = folder();
    let t = tmp.path();
    let text = spec("resumed", true);
    let reference = single(t, &text);
    let nats = Nats::start(t);
    let mut a = Daemon::start(&t.join("a"), &nats.url(), "a", "work = false");
    let b = Daemon::start(&t.join("b"), &nats.url(), "b", "");
    let c = Daemon::start(&t.join("c"), &nats.url(), "c", "");
    a.drop_spec("resumed.toml", &text);
    a.until(Duration::from_secs(120), "items answered", || {
        a.answered("resumed") >= 6
    });
    a.kill_9();
    std::thread::sleep(Duration::from_secs(1));
    let a = Daemon::start(&t.join("a"), &nats.url(), "a", "work = false");
    let result = a.wait_file("resumed", "result.json", 300);
    assert_same(&reference, &a.result_dir("resumed").unwrap());
    let total = result["work"]["pool"]["items_total"].as_f64().unwrap();
    let completed = b.metric("archplace_pool_items_completed_total")
        + c.metric("archplace_pool_items_completed_total");
    assert_eq!(completed, total, "every item evaluated exactly once");
    assert!(
        a.log().contains("resuming the search in the pool"),
        "{}",
        a.log()
    );
}

/// The NATS server stopped and started again mid-search: the daemons reconnect, the
/// file-backed streams keep the items and answers, and the result is the single-machine
/// one.
#[test]
fn the_pool_survives_a_nats_restart() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = folder();
    let t = tmp.path();
    let text = spec("restarted", true);
    let reference = single(t, &text);
    let mut nats = Nats::start(t);
    let a = Daemon::start(&t.join("a"), &nats.url(), "a", "");
    let _b = Daemon::start(&t.join("b"), &nats.url(), "b", "");
    a.drop_spec("restarted.toml", &text);
    a.until(Duration::from_secs(120), "items answered", || {
        a.answered("restarted") >= 4
    });
    nats.restart(Duration::from_secs(2));
    a.wait_file("restarted", "result.json", 300);
    assert_same(&reference, &a.result_dir("restarted").unwrap());
}

/// A worker whose cost model faults answers its item with the reason, and the coordinator
/// fails the search with it (once: not retried). The worker did not have the plugin: it
/// fetched the component from the pool's object store, by hash.
#[test]
fn a_worker_whose_plugin_faults_fails_the_search_with_the_reason() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = folder();
    let t = tmp.path();
    let inst = t.join("a/plugins/trap");
    std::fs::create_dir_all(&inst).unwrap();
    std::fs::copy(
        root().join("target/plugin-fixtures/hostile-trap.wasm"),
        inst.join("hostile-trap.wasm"),
    )
    .expect("the hostile fixtures are built by scripts/build-plugins");
    std::fs::write(
        inst.join("plugin.toml"),
        "name = \"hostile-trap\"\nversion = \"0.1.0\"\ninterface = \"1.0\"\n",
    )
    .unwrap();
    let nats = Nats::start(t);
    let a = Daemon::start(&t.join("a"), &nats.url(), "a", "work = false");
    let b = Daemon::start(&t.join("b"), &nats.url(), "b", "");
    let text = include_str!("fixtures/tiny.toml")
        .replace("name = \"e2e-tiny\"", "name = \"hostile\"")
        + "\n[cost_model]\nlatency = \"hostile-trap\"\n";
    a.drop_spec("hostile.toml", &text);
    let error = a.wait_file("hostile", "error.json", 120);
    let message = error.to_string();
    assert!(
        message.contains("worker b") && message.contains("deliberate panic"),
        "{message}"
    );
    assert!(
        b.log().contains("fetched a cost model from the pool"),
        "{}",
        b.log()
    );
    assert!(b.metric("archplace_pool_items_failed_total") >= 1.0);
    // Failed once, not retried: a while later nothing new was pulled.
    let pulled = b.metric("archplace_pool_items_pulled_total");
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(b.metric("archplace_pool_items_pulled_total"), pulled);
}

/// Deleting the spec during a pooled search stops it on every worker within seconds.
#[test]
fn deleting_the_spec_cancels_the_search_on_every_worker_within_seconds() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = folder();
    let t = tmp.path();
    let nats = Nats::start(t);
    let a = Daemon::start(&t.join("a"), &nats.url(), "a", "");
    let b = Daemon::start(&t.join("b"), &nats.url(), "b", "");
    let c = Daemon::start(&t.join("c"), &nats.url(), "c", "");
    // The embedded default spec: minutes of work in a debug build.
    let text = std::fs::read_to_string(root().join("spec/src/default.toml")).unwrap();
    a.drop_spec("slow.toml", &text);
    let workers = [&a, &b, &c];
    a.until(Duration::from_secs(120), "every worker busy", || {
        workers
            .iter()
            .all(|d| d.metric("archplace_pool_worker_busy") == 1.0)
    });
    std::fs::remove_file(t.join("a/specs/slow.toml")).unwrap();
    let deleted = Instant::now();
    a.until(Duration::from_secs(10), "every worker idle", || {
        workers
            .iter()
            .all(|d| d.metric("archplace_pool_worker_busy") == 0.0)
    });
    let seconds = deleted.elapsed().as_secs_f64();
    eprintln!("every worker stopped {seconds:.1} s after the spec was deleted");
    // And stays idle: the search's remaining items were purged or are skipped.
    std::thread::sleep(Duration::from_secs(2));
    for d in workers {
        assert_eq!(d.metric("archplace_pool_worker_busy"), 0.0, "{}", d.log());
    }
}

/// An item that no worker finishes — each one that takes it dies or hangs — fails the
/// search after `max_deliveries` deliveries instead of leaving it waiting forever. Here
/// one delivery, to a worker that is stopped (SIGSTOP) while it holds the item; another
/// worker goes on taking items.
#[test]
fn an_item_no_worker_finishes_fails_the_search_after_max_deliveries() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = folder();
    let t = tmp.path();
    let nats = Nats::start(t);
    // The first daemon creates the workers' consumer: its limits are the pool's.
    let a = Daemon::start(
        &t.join("a"),
        &nats.url(),
        "a",
        "work = false\nmax_deliveries = 1",
    );
    let b = Daemon::start(&t.join("b"), &nats.url(), "b", "max_deliveries = 1");
    a.drop_spec("stuck.toml", &spec("stuck", true));
    b.until(Duration::from_secs(60), "b busy", || {
        b.metric("archplace_pool_worker_busy") == 1.0
    });
    let pid = b.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-STOP", &pid])
            .status()
            .unwrap()
            .success()
    );
    // JetStream notices an item has used its deliveries when a worker asks for the next
    // one: a worker that keeps asking.
    let _c = Daemon::start(&t.join("c"), &nats.url(), "c", "max_deliveries = 1");
    let error = a.wait_file("stuck", "error.json", 60).to_string();
    let _ = Command::new("kill").args(["-CONT", &pid]).status();
    assert!(
        error.contains("was delivered 1 times and no worker finished it"),
        "{error}"
    );
}
