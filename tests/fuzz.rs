//! Property tests over mutated inputs: whatever bytes a user, an operator or a reference
//! tool hands archplace, its readers answer with a value or a located error — never a
//! panic, never a hang.
//!
//! Seeds are the real inputs (every example spec, the error fixtures, the daemon config, the
//! reference-format fixtures); mutations are the kinds an attacker's probe used:
//! truncation, byte flips, numbers replaced by huge or odd values, deep nesting, lines
//! deleted, duplicated or spliced from another seed. Each property runs a fixed number of
//! cases from a fixed seed, so CI's run is bounded (a few seconds each) and reproducible;
//! a failure is shrunk to a minimal mutation list and printed.

use crate::util::root;
use archplace_engine::options::ScheduleOptions;
use archplace_engine::{phaze, schedule};
use archplace_service::config::DaemonConfig;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, RngSeed};
use std::path::{Path, PathBuf};

/// The files of `dir` (relative to the repository) ending in `ext`, sorted, as bytes.
fn seeds(dir: &str, ext: &str, skip: &str) -> Vec<Vec<u8>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(root().join(dir))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.ends_with(ext) && (skip.is_empty() || !name.ends_with(skip))
        })
        .collect();
    paths.sort();
    assert!(!paths.is_empty(), "no seeds in {dir}");
    paths.iter().map(|p| std::fs::read(p).unwrap()).collect()
}

fn spec_seeds() -> Vec<Vec<u8>> {
    let mut s = seeds("config/specs", ".toml", "");
    s.extend(seeds("tests/fixtures/spec/errors", ".toml", ""));
    s.push(std::fs::read(root().join("spec/src/default.toml")).unwrap());
    s.push(std::fs::read(root().join("tests/fixtures/tiny.toml")).unwrap());
    s
}

/// Values a number in the input is replaced with.
const ODD_NUMBERS: &[&str] = &[
    "0",
    "-1",
    "1e308",
    "-1e308",
    "1e-320",
    "18446744073709551616",
    "9223372036854775807",
    "4294967296",
    "nan",
    "inf",
    "-inf",
    "1e30",
    "0.0",
    "\"12\"",
    "[]",
    "{}",
    "true",
];

#[derive(Debug, Clone)]
enum Mutation {
    /// Cut the input at a position.
    Truncate(usize),
    /// Replace the byte at a position.
    Flip(usize, u8),
    /// Replace the n-th number with an odd value.
    Number(usize, &'static str),
    /// Insert `depth` nested arrays (or tables) as a new line after line n.
    Nest(usize, usize, bool),
    DeleteLine(usize),
    DuplicateLine(usize),
    /// Insert line m of another seed after line n.
    Splice(usize, usize, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Flip(i, b)),
        (any::<usize>(), prop::sample::select(ODD_NUMBERS))
            .prop_map(|(i, v)| Mutation::Number(i, v)),
        (any::<usize>(), 1usize..3000, any::<bool>()).prop_map(|(i, d, t)| Mutation::Nest(i, d, t)),
        any::<usize>().prop_map(Mutation::DeleteLine),
        any::<usize>().prop_map(Mutation::DuplicateLine),
        (any::<usize>(), any::<usize>(), any::<usize>())
            .prop_map(|(s, m, n)| Mutation::Splice(s, m, n)),
    ]
}

fn lines(b: &[u8]) -> Vec<Vec<u8>> {
    b.split(|&c| c == b'\n').map(<[u8]>::to_vec).collect()
}

fn apply(seed: &[u8], others: &[Vec<u8>], muts: &[Mutation]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for m in muts {
        match *m {
            Mutation::Truncate(i) => b.truncate(i % (b.len() + 1)),
            Mutation::Flip(i, v) if !b.is_empty() => {
                let at = i % b.len();
                b[at] = v;
            }
            Mutation::Flip(..) => {}
            Mutation::Number(n, v) => {
                let mut spans = Vec::new();
                let mut i = 0;
                while i < b.len() {
                    if b[i].is_ascii_digit() {
                        let start = i;
                        while i < b.len()
                            && (b[i].is_ascii_digit() || matches!(b[i], b'.' | b'_' | b'e'))
                        {
                            i += 1;
                        }
                        spans.push((start, i));
                    } else {
                        i += 1;
                    }
                }
                if !spans.is_empty() {
                    let (s, e) = spans[n % spans.len()];
                    b.splice(s..e, v.bytes());
                }
            }
            Mutation::Nest(n, depth, table) => {
                let mut ls = lines(&b);
                let at = n % (ls.len() + 1);
                let nest = if table {
                    format!("fuzz = {}1{}", "{a = ".repeat(depth), "}".repeat(depth))
                } else {
                    format!("fuzz = {}1{}", "[".repeat(depth), "]".repeat(depth))
                };
                ls.insert(at, nest.into_bytes());
                b = ls.join(&b'\n');
            }
            Mutation::DeleteLine(n) => {
                let mut ls = lines(&b);
                let at = n % ls.len();
                ls.remove(at);
                b = ls.join(&b'\n');
            }
            Mutation::DuplicateLine(n) => {
                let mut ls = lines(&b);
                let at = n % ls.len();
                let l = ls[at].clone();
                ls.insert(at, l);
                b = ls.join(&b'\n');
            }
            Mutation::Splice(s, m, n) => {
                let other = lines(&others[s % others.len()]);
                let mut ls = lines(&b);
                let at = n % (ls.len() + 1);
                ls.insert(at, other[m % other.len()].clone());
                b = ls.join(&b'\n');
            }
        }
    }
    b
}

/// A fixed number of cases from a fixed seed: bounded and reproducible in CI.
fn config(cases: u32) -> Config {
    Config {
        cases,
        failure_persistence: None,
        rng_algorithm: RngAlgorithm::ChaCha,
        rng_seed: RngSeed::Fixed(0x0a7c_91ac_e516),
        max_shrink_iters: 2000,
        ..Config::default()
    }
}

proptest! {
    #![proptest_config(config(3000))]

    /// Specs: a spec or located errors, and the errors render (with their source line and
    /// caret) whatever bytes the line holds.
    #[test]
    fn specs_parse_or_report_located_errors(
        seed in any::<prop::sample::Index>(),
        muts in prop::collection::vec(mutation(), 1..4),
    ) {
        let seeds = spec_seeds();
        let bytes = apply(seeds[seed.index(seeds.len())].as_slice(), &seeds, &muts);
        let Ok(text) = String::from_utf8(bytes) else {
            return Ok(()); // the reader refuses non-UTF-8 before parsing
        };
        match archplace_spec::parse(&text, "fuzz.toml") {
            Ok(spec) => prop_assert!(!spec.name.is_empty()),
            Err(diags) => {
                prop_assert!(!diags.is_empty());
                for d in &diags {
                    prop_assert!(!d.render(&text).is_empty());
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(config(3000))]

    /// The daemon config: a config or located errors; what it accepts never panics the
    /// settings derived from it (durations, limits).
    #[test]
    fn daemon_configs_parse_or_report_located_errors(
        muts in prop::collection::vec(mutation(), 1..4),
    ) {
        let seed = std::fs::read(root().join("config/archplace.toml")).unwrap();
        let bytes = apply(&seed, std::slice::from_ref(&seed), &muts);
        let Ok(text) = String::from_utf8(bytes) else {
            return Ok(());
        };
        match DaemonConfig::parse(&text, Path::new("/etc/archplace/archplace.toml")) {
            Ok(c) => {
                let (start, live) = c.split();
                prop_assert!(start.max_concurrent_searches >= 1);
                for seconds in [
                    live.settle_seconds,
                    live.rescan_interval_seconds,
                    live.poll_interval_seconds,
                    live.retry_seconds,
                ] {
                    let _ = archplace_util::duration::interval(seconds);
                }
                let _ = start.plugin_limits.deadline();
                for limits in start.plugins.values() {
                    let _ = limits.deadline();
                }
            }
            Err(errors) => prop_assert!(!errors.is_empty()),
        }
    }
}

proptest! {
    #![proptest_config(config(600))]

    /// The reference's placement format: an input, a checked problem and a solution, or a
    /// located error. A solution places every layer of its width once, in stages of 1 or
    /// `t` devices, within the devices, at a positive finite time per batch; an answer
    /// without a placement says why. (Fewer cases: each solves a placement.)
    #[test]
    fn reference_placement_inputs_solve_or_report_errors(
        seed in any::<prop::sample::Index>(),
        muts in prop::collection::vec(mutation(), 1..3),
    ) {
        let seeds = seeds("tests/fixtures/placement", ".json", ".out.json");
        let bytes = apply(seeds[seed.index(seeds.len())].as_slice(), &seeds, &muts);
        let Ok(text) = String::from_utf8(bytes) else {
            return Ok(());
        };
        let input = match phaze::parse(&text) {
            Ok(input) => input,
            Err(e) => {
                prop_assert!(!e.message.is_empty(), "an error without a message: {e:?}");
                return Ok(());
            }
        };
        let problem = match phaze::problem(&input) {
            Ok(p) => p,
            Err(e) => {
                prop_assert!(!e.location.is_empty() && !e.message.is_empty(), "{e:?}");
                return Ok(());
            }
        };
        let Ok(out) = phaze::solve(&problem) else {
            return Ok(()); // the program's own limits, reported by its error
        };
        let Some(time) = out.final_time_per_batch else {
            prop_assert!(out.stages.is_empty() && !out.messages.is_empty(), "{out:?}");
            return Ok(());
        };
        prop_assert!(time.is_finite() && time > 0.0, "time per batch {time}");
        let t = out.tensor_parallel_degree.unwrap_or(0);
        let d = out.data_parallel_degree.unwrap_or(0);
        let chain = problem.chains.iter().find(|c| c.width == t);
        prop_assert!(chain.is_some(), "width {t} is not one of the input's");
        let layers: Vec<i64> = chain.map(|c| c.layers.iter().map(|l| l.id).collect()).unwrap_or_default();
        let placed: Vec<i64> = out.stages.iter().flat_map(|s| s.nodes.iter().copied()).collect();
        let mut sorted = placed.clone();
        sorted.sort_unstable();
        let mut expected = layers.clone();
        expected.sort_unstable();
        prop_assert_eq!(sorted, expected, "every layer placed once");
        let devices: u64 = out.stages.iter().map(|s| s.devices_for_stage).sum::<u64>() * d;
        prop_assert!(devices >= 1 && devices <= problem.settings.devices, "{devices} devices");
        for s in &out.stages {
            prop_assert!(s.devices_for_stage == 1 || s.devices_for_stage == t, "{s:?}");
        }
    }

    /// The reference's layer-schedule format: an instance, or a located error; an instance
    /// has a schedule the checker accepts, within its bounds, or a solver error.
    #[test]
    fn reference_schedule_inputs_load_or_report_errors(
        seed in any::<prop::sample::Index>(),
        muts in prop::collection::vec(mutation(), 1..3),
    ) {
        let seeds = seeds("tests/fixtures/schedule", ".json", ".expected.json");
        let bytes = apply(seeds[seed.index(seeds.len())].as_slice(), &seeds, &muts);
        let Ok(text) = String::from_utf8(bytes) else {
            return Ok(());
        };
        let input = match phaze::schedule::parse(&text) {
            Ok(input) => input,
            Err(e) => {
                prop_assert!(!e.message.is_empty(), "{e:?}");
                return Ok(());
            }
        };
        let instance = match phaze::schedule::instance(&input) {
            Ok(i) => i,
            Err(e) => {
                prop_assert!(!e.location.is_empty() && !e.message.is_empty(), "{e:?}");
                return Ok(());
            }
        };
        let options = ScheduleOptions {
            node_limit: 50,
            heuristic_only: true,
            ..ScheduleOptions::default()
        };
        match schedule::solve(&instance, &options) {
            Ok(s) => {
                prop_assert!(schedule::check(&instance, &s.placements).is_ok(), "{:?}", schedule::check(&instance, &s.placements));
                prop_assert!(s.makespan.is_finite() && s.lower_bound <= s.makespan * (1.0 + 1e-9), "{} < {}", s.makespan, s.lower_bound);
            }
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }
}
