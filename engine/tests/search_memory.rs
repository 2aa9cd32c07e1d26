//! The search's memory estimate bounds what a search allocates (a spec the engine
//! cannot hold is refused before its search, with the numbers). Its own test binary:
//! the counting allocator counts every thread, so nothing else may run beside it.

#![allow(unsafe_code, clippy::disallowed_macros)]

use archplace_engine::model::{ModelConfig, preset};
use archplace_engine::options::ScheduleOptions;
use archplace_engine::search::{self, ModelInput, SearchInput, memory};
use archplace_engine::space::{AreaBudget, SpaceSpec, enumerate};
use archplace_engine::training::{
    Cluster, MemoryModel, Optimizer, Precision, Recomputation, Training,
};
use archplace_reference_cost::ReferenceModel;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

static TRACKING: AtomicBool = AtomicBool::new(false);
static NOW: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

struct Counting;

// SAFETY: every call is forwarded to the system allocator unchanged; the counters are
// atomics, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if TRACKING.load(Ordering::Relaxed) {
            let now = NOW.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        // SAFETY: the caller's layout, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if TRACKING.load(Ordering::Relaxed) {
            // Frees of what was allocated before tracking began may take it below zero.
            let _ = NOW.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(layout.size()))
            });
        }
        // SAFETY: allocated by `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// One test at a time: the counters count every thread's allocations, and tests run on
/// threads of one process.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn alone() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The peak heap bytes (all threads) `f` held beyond what there was when it started.
fn peak<T>(f: impl FnOnce() -> T) -> (T, u64) {
    NOW.store(0, Ordering::SeqCst);
    PEAK.store(0, Ordering::SeqCst);
    TRACKING.store(true, Ordering::SeqCst);
    let out = f();
    TRACKING.store(false, Ordering::SeqCst);
    (out, PEAK.load(Ordering::SeqCst) as u64)
}

fn model(name: &str, layers: u64) -> ModelConfig {
    ModelConfig {
        name: name.into(),
        layers,
        hidden: 256,
        heads: 4,
        kv_heads: 4,
        ffn: 1024,
        vocab: 1000,
        vocab_pad_multiple: 1,
        seq_len: 128,
        max_positions: 128,
        max_tensor_parallel: 2,
        ..preset("gpt2-xl").expect("a preset")
    }
}

fn input(models: Vec<ModelConfig>) -> SearchInput {
    SearchInput {
        objective: Default::default(),
        models: models
            .into_iter()
            .map(|config| ModelInput {
                weight: 1.0,
                config,
                baseline: None,
            })
            .collect(),
        training: Training {
            recompute_modules: Default::default(),
            global_batch: 64,
            micro_batch_sizes: vec![1, 2, 4],
            activation_recomputation: vec![
                Recomputation::None,
                Recomputation::Selective,
                Recomputation::Full,
            ],
            optimizer: Optimizer::Adam,
            precisions: vec![Precision::Bf16Mixed],
            fp8_scaling: Default::default(),
            fp8_param_gather: false,
            distributed_optimizer: vec![false, true],
            zero_stages: vec![],
            reshard_after_forward: vec![true],
            data_parallel_overlap: false,
            sequence_parallel: vec![false, true],
            pipeline_interleaving: vec![1],
            pipeline_schedules: Vec::new(),
            expert_parallel: vec![1],
            context_parallel: vec![1],
            context_exchange: Default::default(),
            all_to_all_overlap: false,
            pipeline_parallel_overlap: false,
            memory_model: MemoryModel::Megatron,
            bytes_per_element: 2,
            execution: Default::default(),
        },
        cluster: Cluster {
            devices: 16,
            link_bytes_per_second: 4.0 * (1u64 << 30) as f64,
            hbm_bytes: vec![64 << 20, 1 << 30],
            network: archplace_engine::network::Network::flat(4.0 * (1u64 << 30) as f64),
            domains: Vec::new(),
        },
        convergence_window: 5,
        strategy: archplace_engine::search::Strategy::Exhaustive,
        use_all_devices: true,
        // The solver's native memory is not on this heap (the estimate counts it apart);
        // the list schedule keeps the test fast.
        schedule: ScheduleOptions {
            heuristic_only: true,
            ..ScheduleOptions::default()
        },
    }
}

fn space(tensor_cores: Vec<u32>) -> SpaceSpec {
    SpaceSpec {
        tensor_cores,
        vector_cores: vec![1, 2, 4],
        width: vec![16, 32],
        depth: vec![8, 16],
        vector_width: None,
        buffer_bytes: vec![2 << 20, 8 << 20],
        area_budget: AreaBudget::Um2(1e12),
        min_area_fraction: 0.0,
        strategy: archplace_engine::search::Strategy::Exhaustive,
        ..SpaceSpec::default()
    }
}

/// Enumerates and searches exhaustively: the peak heap, and the estimate's heap parts.
/// Bytes allocated at the peak, estimated (without the solver, which is not Rust's heap),
/// candidates, and at most what the memo of layer schedules held: an entry per schedule
/// solved, up to its capacity, each as large as the estimate counts.
fn measure(inp: &SearchInput, spec: &SpaceSpec) -> (u64, u64, usize, u64) {
    let threads = rayon::current_num_threads();
    let est = memory::estimate(inp, spec, threads);
    let ((n, explored), bytes) = peak(|| {
        let space = enumerate(spec, &ReferenceModel::default()).expect("a space");
        let out =
            search::search(inp, &space, &ReferenceModel::default(), &(), None).expect("a search");
        let solved = out.stats.schedules_by_bounds
            + out.stats.schedules_by_mip
            + out.stats.schedules_by_mip_reused;
        (space.candidates.len(), (out.explored.len(), solved))
    });
    let (explored, solved) = explored;
    let memo = est.schedule_memo_bytes / MEMO_CAPACITY * solved.min(MEMO_CAPACITY);
    assert_eq!(n, explored, "exhaustive");
    assert_eq!(n as u64, est.configurations, "no area filter here");
    (bytes, est.total_bytes - est.solver_bytes, n, memo)
}

/// Layer schedules the memo holds at most (two generations of 2,048).
const MEMO_CAPACITY: u64 = 4096;

#[test]
fn the_estimate_bounds_what_a_search_allocates() {
    let _alone = alone();
    let mut rows = Vec::new();
    for (models, tensor_cores) in [
        (vec![model("tiny", 4)], vec![1, 2]),
        (vec![model("tiny", 4)], vec![1, 2, 4, 8, 16, 32, 64, 128]),
        (
            vec![model("tiny", 4), model("a-longer-model-name", 24)],
            vec![1, 2, 4, 8, 16, 32, 64, 128],
        ),
    ] {
        let inp = input(models);
        let spec = space(tensor_cores);
        let (measured, estimated, n, memo) = measure(&inp, &spec);
        eprintln!("{}", check(&inp, (measured, estimated, n)));
        rows.push((n as u64, measured, estimated, memo));
    }
    // What grows with the space: the estimate's growth per candidate bounds the measured one
    // (less what the memo of layer schedules grew by: it fills as the search goes, up to a
    // fixed size the estimate counts whole).
    let (a, b) = (rows[0], rows[1]);
    let measured_each = (b.1 - a.1.min(b.1)).saturating_sub(b.3 - a.3.min(b.3)) / (b.0 - a.0);
    let estimated_each = (b.2 - a.2) / (b.0 - a.0);
    eprintln!("per candidate: {measured_each} bytes allocated, {estimated_each} estimated");
    assert!(measured_each <= estimated_each);
}

/// Context parallelism and two scale-up domain sizes multiply the graphs, the placement
/// runs and what each candidate's record holds: the estimate still bounds the search.
#[test]
fn the_estimate_bounds_a_search_over_domains_and_context_parallelism() {
    let _alone = alone();
    let mut tiny = model("tiny", 4);
    tiny.attention = archplace_engine::model::AttentionKernel::Flash;
    let mut inp = input(vec![tiny]);
    inp.training.context_parallel = vec![1, 2];
    let tier = |bytes_per_second: f64| archplace_engine::network::Tier {
        bytes_per_second,
        latency_seconds: 5e-6,
    };
    let domain = |node_size: u64| archplace_engine::network::Network {
        node_size,
        host_bytes_per_second: None,
        overlap_efficiency: 1.0,
        intra_node: tier(100e9),
        inter_node: tier(4e9),
    };
    inp.cluster.network = domain(2);
    inp.cluster.domains = vec![domain(2), domain(8)];
    let spec = space(vec![1, 2, 4, 8, 16, 32, 64, 128]);
    let (measured, estimated, n, _) = measure(&inp, &spec);
    eprintln!("{}", check(&inp, (measured, estimated, n)));
}

/// The estimate bounds what was allocated, and not uselessly; the figures in words.
fn check(inp: &SearchInput, (measured, estimated, n): (u64, u64, usize)) -> String {
    assert!(
        measured <= estimated,
        "{n} candidates: allocated {measured} > estimated {estimated}"
    );
    // An upper bound, but not a useless one: an operator's budget is compared with it.
    assert!(
        estimated <= 12 * measured,
        "{n} candidates: estimated {estimated} is more than 12× the {measured} allocated"
    );
    format!(
        "{} model(s), {n} candidates: {measured} bytes allocated at the peak, {estimated} estimated ({:.1}×)",
        inp.models.len(),
        estimated as f64 / measured as f64
    )
}
