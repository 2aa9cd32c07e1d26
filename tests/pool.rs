//! The pool (`archplace daemon --nats`): several daemons on one NATS JetStream server
//! search one spec together, and the result is the single-machine one — with a worker
//! killed, the coordinator killed and restarted, the NATS server restarted; a worker's
//! faulting plugin fails the search with the reason; deleting the spec stops every worker.
//!
//! Each test starts its own `nats-server -js` (Debian's `nats-server` package; `scripts/
//! setup` installs it) on a free loopback port with its store in a temporary folder. The
//! tests run one at a time (each starts several daemons; on a 2-core machine they would
//! only slow each other down).

use crate::util::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

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

/// The spec of the exhaustive pooled searches (`pooled.toml`) and its single-machine
/// result, computed once for every test that compares with it (the pool's tests run one at
/// a time, and each run costs seconds of that time). In the target's scratch folder, which
/// the next test run overwrites.
fn exhaustive_reference() -> (String, PathBuf) {
    static REFERENCE: OnceLock<PathBuf> = OnceLock::new();
    let text = eight_layers("pooled", true);
    let out = REFERENCE.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("pool-reference");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        single(&dir, &text)
    });
    (text, out.clone())
}

/// The spec of the proven pooled searches: the eight-layer space, `strategy = "proven"`.
fn proven_spec() -> String {
    let text = eight_layers("proven", true).replace("exhaustive = true", "strategy = \"proven\"");
    assert!(text.contains("strategy = \"proven\""));
    text
}

/// The pooled result in `pooled` is the single-machine one in `single`: `result.json` but
/// for timings and work, `explored.jsonl` byte for byte.
fn assert_same(single: &Path, pooled: &Path) {
    let read = |d: &Path| read_json(&d.join("result.json"));
    let (a, b) = (read(single), read(pooled));
    assert_eq!(comparable(a), comparable(b));
    let (a, b) = (
        std::fs::read(single.join("explored.jsonl")).unwrap(),
        std::fs::read(pooled.join("explored.jsonl")).unwrap(),
    );
    assert!(a == b, "explored.jsonl differs");
}

/// Three daemons with the default ack wait (6 s), an exhaustive search dropped into one of
/// them, a worker killed (-9) while it holds an item: the item is redelivered after the ack
/// wait, the result is the single-machine one, and the search takes at most 10 s longer
/// than the same search in a pool of three where no worker dies.
#[test]
fn a_pool_of_three_with_a_worker_killed_gives_the_single_machine_result() {
    let _gate = crate::util::alone();
    let tmp = folder();
    let t = tmp.path();
    let (text, reference) = exhaustive_reference();
    let nats = Nats::start(t);
    let default_ack_wait = "ack_wait_seconds = 6";
    let a = Daemon::pooled(&t.join("a"), &nats.url(), "a", default_ack_wait);
    let b = Daemon::pooled(&t.join("b"), &nats.url(), "b", default_ack_wait);
    let mut c = Daemon::pooled(&t.join("c"), &nats.url(), "c", default_ack_wait);
    let started = Instant::now();
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
    let killed = started.elapsed();
    assert_same(&reference, &a.result_dir("pooled").unwrap());
    let redelivered = a.metric("archplace_pool_items_redelivered_total")
        + b.metric("archplace_pool_items_redelivered_total");
    assert!(
        redelivered >= 1.0,
        "the killed worker's item was redelivered"
    );
    // And said so in the log of the worker that took it again, with the search's id.
    let said = [a.log(), b.log()].iter().any(|l| {
        l.lines()
            .any(|line| line.contains("an item delivered again") && line.contains("search="))
    });
    assert!(said, "{}\n{}", a.log(), b.log());
    // The coordinator saw the worker go, and said so with the search's id.
    let gone = a.log().lines().any(|l| {
        l.contains("a worker left the pool") && l.contains("worker=c") && l.contains("search=")
    });
    assert!(gone, "{}", a.log());
    let pool = &result["work"]["pool"];
    assert_eq!(pool["items_answered"], pool["items_total"], "{pool}");
    assert_eq!(
        pool["items_speculative"], 0,
        "exhaustive: nothing is speculative"
    );
    drop((a, b, c, nats));
    // The same search in a pool of three of its own, every worker alive: the time to beat.
    let nats = Nats::start(&t.join("alive"));
    let daemons: Vec<Daemon> = ["d", "e", "f"]
        .iter()
        .map(|n| Daemon::pooled(&t.join("alive").join(n), &nats.url(), n, default_ack_wait))
        .collect();
    let started = Instant::now();
    daemons[0].drop_spec("pooled.toml", &text);
    daemons[0].wait_file("pooled", "result.json", 300);
    let alive = started.elapsed();
    assert!(
        killed <= alive + Duration::from_secs(10),
        "a lost worker cost {:.1} s (all alive: {:.1} s, one killed: {:.1} s)",
        (killed.saturating_sub(alive)).as_secs_f64(),
        alive.as_secs_f64(),
        killed.as_secs_f64()
    );
    eprintln!(
        "pool of three: {:.1} s all alive, {:.1} s with one killed -9",
        alive.as_secs_f64(),
        killed.as_secs_f64()
    );
}

/// A converging search: the same result, and what was published past the convergence
/// point is counted and at most the look-ahead.
#[test]
fn a_converging_pooled_search_gives_the_same_result_and_bounds_its_speculation() {
    let _gate = crate::util::alone();
    let tmp = folder();
    let t = tmp.path();
    let text = eight_layers("converging", false);
    let reference = single(t, &text);
    let nats = Nats::start(t);
    let pool = "look_ahead_items = 3\nitem_candidates = 2";
    let a = Daemon::pooled(&t.join("a"), &nats.url(), "a", pool);
    let _b = Daemon::pooled(&t.join("b"), &nats.url(), "b", pool);
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

/// A proven search through a pool of two: the items follow the bounds' order, publishing
/// stops where the bounds can no longer beat the best (items are left unpublished, at
/// most the look-ahead is speculative), and the result is the single-machine proven one.
#[test]
fn a_proven_pooled_search_publishes_in_bound_order_and_gives_the_same_result() {
    let _gate = crate::util::alone();
    let tmp = folder();
    let t = tmp.path();
    let text = proven_spec();
    let reference = single(t, &text);
    let nats = Nats::start(t);
    let pool = "look_ahead_items = 3\nitem_candidates = 2";
    let a = Daemon::pooled(&t.join("a"), &nats.url(), "a", pool);
    let _b = Daemon::pooled(&t.join("b"), &nats.url(), "b", pool);
    a.drop_spec("proven.toml", &text);
    let result = a.wait_file("proven", "result.json", 300);
    assert_same(&reference, &a.result_dir("proven").unwrap());
    let search = &result["search"];
    assert_eq!(search["proven"], true, "{result}");
    assert!(
        search["candidates_pruned"].as_u64().unwrap() > 0,
        "{search}"
    );
    let p = &result["work"]["pool"];
    assert!(p["items_speculative"].as_u64().unwrap() <= 3, "{p}");
    assert!(
        p["items_published"].as_u64().unwrap() < p["items_total"].as_u64().unwrap(),
        "{p}"
    );
    assert!(p["items_answered"].as_u64().unwrap() > 0, "{p}");
}

/// The items the two workers `b` and `c` evaluated.
fn completed(b: &Daemon, c: &Daemon) -> f64 {
    b.metric("archplace_pool_items_completed_total")
        + c.metric("archplace_pool_items_completed_total")
}

/// A pool of three on `nats` in `t`: `a` coordinates without working (its `[pool]` with
/// `coordinator`), `b` and `c` work (with `workers` and `env`); `text` dropped into `a` as
/// `file`, and `a` killed -9 once `answered` of its items are answered. The workers.
fn coordinator_killed(
    t: &Path,
    nats: &Nats,
    (file, text): (&str, &str),
    (coordinator, workers, env): (&str, &str, &[(&str, &str)]),
    answered: u64,
) -> (Daemon, Daemon) {
    let mut a = Daemon::pooled(&t.join("a"), &nats.url(), "a", coordinator);
    let b = Daemon::pooled_env(&t.join("b"), &nats.url(), "b", workers, env);
    let c = Daemon::pooled_env(&t.join("c"), &nats.url(), "c", workers, env);
    a.drop_spec(file, text);
    let name = file.trim_end_matches(".toml");
    a.until(Duration::from_secs(120), "items answered", || {
        a.answered(name) >= answered
    });
    a.kill_9();
    (b, c)
}

/// The coordinator killed (-9) mid-search and started again: the search resumes from its
/// journal, the answers stored meanwhile and the published items — no item is evaluated
/// twice (the two workers' completed items add up to the items) and the result is the
/// single-machine one.
#[test]
fn a_killed_coordinator_resumes_without_evaluating_any_item_twice() {
    let _gate = crate::util::alone();
    let tmp = folder();
    let t = tmp.path();
    let (text, reference) = exhaustive_reference();
    let nats = Nats::start(t);
    let (b, c) = coordinator_killed(
        t,
        &nats,
        ("pooled.toml", &text),
        ("work = false", "", &[]),
        6,
    );
    std::thread::sleep(Duration::from_secs(1));
    let a = Daemon::pooled(&t.join("a"), &nats.url(), "a", "work = false");
    let result = a.wait_file("pooled", "result.json", 300);
    assert_same(&reference, &a.result_dir("pooled").unwrap());
    let total = result["work"]["pool"]["items_total"].as_f64().unwrap();
    let completed = completed(&b, &c);
    assert_eq!(completed, total, "every item evaluated exactly once");
    assert!(
        a.log().contains("resuming the search in the pool"),
        "{}",
        a.log()
    );
}

/// The coordinator killed (-9) mid-search and kept away: its lease lapses, another daemon
/// carries the search on and the two workers evaluate all of it; restarted after they
/// finished, the coordinator collects the answers and writes the result within 10 s,
/// evaluating nothing: the single-machine result, every item evaluated exactly once.
#[test]
fn the_pool_finishes_a_search_without_its_coordinator() {
    let _gate = crate::util::alone();
    let tmp = folder();
    let t = tmp.path();
    let (text, reference) = exhaustive_reference();
    let nats = Nats::start(t);
    let (b, c) = coordinator_killed(
        t,
        &nats,
        ("pooled.toml", &text),
        ("work = false", "", &[]),
        6,
    );
    let killed = Instant::now();
    let carrier = || {
        [("b", &b), ("c", &c)]
            .into_iter()
            .find(|(_, d)| d.log().contains("carried the search to its end"))
    };
    b.until(
        Duration::from_secs(300),
        "the search carried to its end",
        || carrier().is_some(),
    );
    let carried = killed.elapsed();
    let (carried_by, carrier_daemon) = carrier().unwrap();
    let line = carrier_daemon
        .log()
        .lines()
        .find(|l| l.contains("carrying the search on") && l.contains("search="))
        .map(str::to_string);
    assert!(line.is_some(), "{}", carrier_daemon.log());
    let before = completed(&b, &c);
    let restarted = Instant::now();
    let a = Daemon::pooled(&t.join("a"), &nats.url(), "a", "work = false");
    let result = a.wait_file("pooled", "result.json", 60);
    let took = restarted.elapsed();
    assert!(
        took <= Duration::from_secs(10),
        "the result came {:.1} s after the restart",
        took.as_secs_f64()
    );
    assert_same(&reference, &a.result_dir("pooled").unwrap());
    let pool = &result["work"]["pool"];
    assert_eq!(pool["carried_by"], carried_by, "{pool}");
    let total = pool["items_total"].as_f64().unwrap();
    assert_eq!(before, total, "every item evaluated exactly once");
    assert_eq!(
        completed(&b, &c),
        before,
        "nothing evaluated after the restart"
    );
    assert!(
        a.log()
            .contains("the search was carried to its end while this daemon was away"),
        "{}",
        a.log()
    );
    eprintln!(
        "carried by {carried_by} to its end {:.1} s after the coordinator's kill; result {:.1} s after its restart",
        carried.as_secs_f64(),
        took.as_secs_f64()
    );
}

/// The coordinator killed (-9), and back — under another name, as a daemon's default name
/// (host and PID) is — while another daemon carries its search on: it follows the answers
/// without publishing, takes the lease back when the carrier is done, and writes the
/// single-machine result; no item is evaluated twice.
#[test]
fn a_coordinator_back_while_its_search_is_carried_follows_it_to_the_same_result() {
    let _gate = crate::util::alone();
    let tmp = folder();
    let t = tmp.path();
    let (text, reference) = exhaustive_reference();
    let nats = Nats::start(t);
    let coordinator = "work = false\nitem_candidates = 2";
    // Slow workers: the carried walk lasts long enough for the coordinator to come back.
    let slow = [("ARCHPLACE_TEST_HOLD_ITEM_SECONDS", "0.2")];
    let (b, c) = coordinator_killed(
        t,
        &nats,
        ("pooled.toml", &text),
        (coordinator, "item_candidates = 2", &slow),
        4,
    );
    let carrying = || {
        [&b, &c]
            .iter()
            .any(|d| d.log().contains("carrying the search on"))
    };
    b.until(Duration::from_secs(120), "the search carried on", carrying);
    let carried_early = [&b, &c]
        .iter()
        .any(|d| d.log().contains("carried the search to its end"));
    assert!(
        !carried_early,
        "the carrier finished before the coordinator came back"
    );
    let a = Daemon::pooled(&t.join("a"), &nats.url(), "a-again", coordinator);
    let result = a.wait_file("pooled", "result.json", 300);
    assert_same(&reference, &a.result_dir("pooled").unwrap());
    let log = a.log();
    assert!(
        log.contains("another daemon carries this search on"),
        "{log}"
    );
    // Both walk the same answers: the carrier reached the end (and handed the search
    // back), or the coordinator did first and finished the search (and the carrier
    // stopped).
    b.until(Duration::from_secs(30), "the carrier done", || {
        [&b, &c].iter().any(|d| {
            let log = d.log();
            log.contains("carried the search to its end")
                || log.contains("the search ended in the pool while carried")
        })
    });
    let total = result["work"]["pool"]["items_total"].as_f64().unwrap();
    let completed = completed(&b, &c);
    assert_eq!(completed, total, "every item evaluated exactly once");
}

/// A proven search's coordinator killed (-9) mid-search and started again: it takes up
/// the items it published in the bounds' order (the same order: the bounds are
/// deterministic), no item is evaluated twice, and the result is the single-machine
/// proven one.
#[test]
fn a_killed_coordinator_resumes_a_proven_search_without_evaluating_any_item_twice() {
    let _gate = crate::util::alone();
    let tmp = folder();
    let t = tmp.path();
    let text = proven_spec();
    let reference = single(t, &text);
    let nats = Nats::start(t);
    let coordinator = "work = false\nitem_candidates = 2";
    // A proven search of this space evaluates a few dozen candidates in about a second:
    // the workers hold each item 0.3 s (archplace_pool::worker::HOLD_ITEM_VAR), so that
    // the coordinator dies with most of them still to come.
    let slow = [("ARCHPLACE_TEST_HOLD_ITEM_SECONDS", "0.3")];
    let (b, c) = coordinator_killed(
        t,
        &nats,
        ("proven.toml", &text),
        (coordinator, "item_candidates = 2", &slow),
        2,
    );
    std::thread::sleep(Duration::from_secs(1));
    let a = Daemon::pooled(&t.join("a"), &nats.url(), "a", coordinator);
    let result = a.wait_file("proven", "result.json", 300);
    assert_same(&reference, &a.result_dir("proven").unwrap());
    assert_eq!(result["search"]["proven"], true, "{result}");
    let pool = &result["work"]["pool"];
    let published = pool["items_published"].as_f64().unwrap();
    let answered = pool["items_answered"].as_f64().unwrap();
    let completed = completed(&b, &c);
    // Speculative items published past where the pruning stopped may be dropped with the
    // search before a worker takes them; none is evaluated twice.
    assert!(
        answered <= completed && completed <= published,
        "{completed} items completed, {answered} answered, {published} published: {pool}"
    );
    assert!(
        a.log().contains("resuming the search in the pool"),
        "{}",
        a.log()
    );
}

/// The NATS server stopped and started again mid-search: the daemons reconnect, the
/// file-backed streams keep the items and answers, the coordinator reads the answers on
/// from where it was, and the result is the single-machine one.
#[test]
fn the_pool_survives_a_nats_restart() {
    let _gate = crate::util::alone();
    let tmp = folder();
    let t = tmp.path();
    let (text, reference) = exhaustive_reference();
    let mut nats = Nats::start(t);
    let a = Daemon::pooled(&t.join("a"), &nats.url(), "a", "");
    let _b = Daemon::pooled(&t.join("b"), &nats.url(), "b", "");
    a.drop_spec("pooled.toml", &text);
    a.until(Duration::from_secs(120), "items answered", || {
        a.answered("pooled") >= 4
    });
    nats.restart(Duration::from_secs(2));
    a.wait_file("pooled", "result.json", 300);
    assert_same(&reference, &a.result_dir("pooled").unwrap());
    // The coordinator's reader of answers (an ordered consumer, which the server kept in
    // memory only) was opened again at the reconnection, not after two missed heartbeats.
    assert!(
        a.log().contains("reading the search's answers again"),
        "{}",
        a.log()
    );
}

/// A worker whose cost model faults answers its item with the reason, and the coordinator
/// fails the search with it (once: not retried). The worker did not have the plugin: it
/// fetched the component from the pool's object store, by hash.
#[test]
fn a_worker_whose_plugin_faults_fails_the_search_with_the_reason() {
    let _gate = crate::util::alone();
    let tmp = folder();
    let t = tmp.path();
    install_unchecked(&t.join("a/plugins"), "hostile-trap", "hostile-trap");
    let nats = Nats::start(t);
    let a = Daemon::pooled(&t.join("a"), &nats.url(), "a", "work = false");
    let b = Daemon::pooled(&t.join("b"), &nats.url(), "b", "");
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
    let _gate = crate::util::alone();
    let tmp = folder();
    let t = tmp.path();
    let nats = Nats::start(t);
    let a = Daemon::pooled(&t.join("a"), &nats.url(), "a", "");
    let b = Daemon::pooled(&t.join("b"), &nats.url(), "b", "");
    let c = Daemon::pooled(&t.join("c"), &nats.url(), "c", "");
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
/// one delivery, to a worker that is stopped (SIGSTOP) while it holds the item (it holds
/// each item 60 s first, a test hook: stopped as soon as it is busy, it certainly holds
/// one — an item it had just finished once let the search complete); another worker goes
/// on taking items.
#[test]
fn an_item_no_worker_finishes_fails_the_search_after_max_deliveries() {
    let _gate = crate::util::alone();
    let tmp = folder();
    let t = tmp.path();
    let nats = Nats::start(t);
    // The first daemon creates the workers' consumer: its limits are the pool's.
    let a = Daemon::pooled(
        &t.join("a"),
        &nats.url(),
        "a",
        "work = false\nmax_deliveries = 1",
    );
    let b = Daemon::pooled_env(
        &t.join("b"),
        &nats.url(),
        "b",
        "max_deliveries = 1",
        // archplace_pool::worker::HOLD_ITEM_VAR
        &[("ARCHPLACE_TEST_HOLD_ITEM_SECONDS", "60")],
    );
    a.drop_spec("stuck.toml", &eight_layers("stuck", true));
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
    let _c = Daemon::pooled(&t.join("c"), &nats.url(), "c", "max_deliveries = 1");
    let error = a.wait_file("stuck", "error.json", 60).to_string();
    let _ = Command::new("kill").args(["-CONT", &pid]).status();
    assert!(
        error.contains("was delivered 1 times and no worker finished it"),
        "{error}"
    );
}
