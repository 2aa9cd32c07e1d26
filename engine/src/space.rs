//! The space of candidate accelerators (`docs/reference.md` §1.2).
//!
//! Candidates are the product of the axes (tensor cores, vector cores, array width and
//! depth, vector width — tied to the width unless given —, global buffer), each visited in
//! descending order as the reference does, kept when their area is within the budget and
//! above the minimum-area fraction (configurations with a single tensor or vector core are
//! exempt from the minimum, so that every single-core estimate has a configuration). They
//! are then ordered for the search: by area bucket, largest first, and inside a bucket in
//! enumeration order.

use archplace_plugin_sdk::{AcceleratorConfig, AreaModel, CoreConfig, EstimateError};
use serde::Serialize;
use std::collections::HashSet;

/// The budget for a candidate's area.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AreaBudget {
    /// An explicit area.
    Um2(f64),
    /// The area of this configuration under the area model in use.
    ReferenceConfig(AcceleratorConfig),
}

/// An axis of the space, by which `pareto.svg` may colour its points.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum ChipAxis {
    TensorCores,
    VectorCores,
    Width,
    Depth,
    VectorWidth,
    Buffer,
}

impl ChipAxis {
    /// The axis's value on a chip.
    pub fn of(self, c: &AcceleratorConfig) -> u64 {
        match self {
            ChipAxis::TensorCores => c.tensor_cores.into(),
            ChipAxis::VectorCores => c.vector_cores.into(),
            ChipAxis::Width => c.width.into(),
            ChipAxis::Depth => c.depth.into(),
            ChipAxis::VectorWidth => c.vector_width.into(),
            ChipAxis::Buffer => c.buffer_bytes,
        }
    }

    /// The axis as the spec names it.
    pub fn name(self) -> &'static str {
        match self {
            ChipAxis::TensorCores => "tensor_cores",
            ChipAxis::VectorCores => "vector_cores",
            ChipAxis::Width => "width",
            ChipAxis::Depth => "depth",
            ChipAxis::VectorWidth => "vector_width",
            ChipAxis::Buffer => "buffer",
        }
    }
}

/// How a search walks the space and when it stops (`[search] strategy`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// The reference's rule: area buckets largest first, stopping when the best scores of
    /// the last `convergence_window` buckets did not increase. A quick look: nothing
    /// proves that a chip it did not visit is not better (its summary says so).
    Converge,
    /// Every candidate evaluated.
    Exhaustive,
    /// The default. Every candidate bounded ((`search::bound`)), then evaluated in the
    /// order of the bounds (ties: the smaller chip first) while a bound can beat the best
    /// so far: the best chip of the whole space, proven, evaluating only what the bounds
    /// cannot rule out — on the example spaces at about the converging walk's cost.
    #[default]
    Proven,
}

impl Strategy {
    /// The name the spec gives it.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Converge => "converge",
            Strategy::Exhaustive => "exhaustive",
            Strategy::Proven => "proven",
        }
    }
}

/// The axes and rules of the space, validated.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SpaceSpec {
    pub tensor_cores: Vec<u32>,
    pub vector_cores: Vec<u32>,
    pub width: Vec<u32>,
    pub depth: Vec<u32>,
    /// `None`: each vector core has as many lanes as a tensor core is wide (the reference).
    pub vector_width: Option<Vec<u32>>,
    pub buffer_bytes: Vec<u64>,
    pub area_budget: AreaBudget,
    pub min_area_fraction: f64,
    pub single_core_exempt: bool,
    pub bucket_um2: f64,
    pub convergence_window: u32,
    /// How the search walks the space.
    pub strategy: Strategy,
    /// Plans use every device (`t × p × d` = the cluster's devices); `false` lets some
    /// stay idle.
    pub use_all_devices: bool,
    /// What the search maximises over its models.
    pub objective: Objective,
    /// The axis `pareto.svg` colours its points by (`None`: one colour).
    pub plot_colour_by: Option<ChipAxis>,
    /// Relative gap at which a layer schedule is accepted during the search.
    pub schedule_gap: f64,
    /// Branch-and-bound nodes of one layer-schedule MIP during the search: a work limit,
    /// the same on any machine under any load.
    pub schedule_node_limit: u64,
    /// Wall-clock limit of one layer-schedule MIP during the search. What a MIP stops at
    /// when it fires depends on the machine's speed and load (counted in the results).
    pub schedule_time_limit_seconds: f64,
}

fn pow2(lo_log: u32, hi_log: u32) -> Vec<u32> {
    (lo_log..=hi_log).map(|l| 1u32 << l).collect()
}

/// What a search maximises over its models (`[search] objective`): the mean of their
/// throughputs in samples per second, or in tokens per second (each model's samples/s
/// counted its sequence length times, so a long-sequence model weighs as its tokens do);
/// either way each model counted its `[[models]] weight` times besides
/// ([`crate::search::SearchInput::objective_weights`]).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Objective {
    #[default]
    SamplesPerSecond,
    TokensPerSecond,
}

impl Objective {
    pub fn name(self) -> &'static str {
        match self {
            Objective::SamplesPerSecond => "samples_per_second",
            Objective::TokensPerSecond => "tokens_per_second",
        }
    }
}

impl Default for SpaceSpec {
    /// The reference space (`docs/reference.md` §1.2).
    fn default() -> Self {
        SpaceSpec {
            objective: Default::default(),
            tensor_cores: pow2(0, 12),
            vector_cores: pow2(0, 12),
            width: pow2(1, 8),
            depth: pow2(1, 8),
            vector_width: None,
            buffer_bytes: (1..=7).map(|l| (1u64 << l) << 20).collect(),
            area_budget: AreaBudget::ReferenceConfig(REFERENCE_CONFIG),
            min_area_fraction: 0.3,
            single_core_exempt: true,
            bucket_um2: 10_000.0,
            convergence_window: 5,
            strategy: Strategy::Proven,
            use_all_devices: true,
            plot_colour_by: None,
            schedule_gap: 0.01,
            schedule_node_limit: crate::options::DEFAULT_NODE_LIMIT,
            schedule_time_limit_seconds: crate::options::DEFAULT_SCHEDULE_TIME_LIMIT_SECONDS,
        }
    }
}

/// The reference's largest configuration, whose area is the default budget: 8 tensor cores
/// of 128 × 128, 2 vector cores of 128 lanes, 128 MiB of global buffer.
pub const REFERENCE_CONFIG: AcceleratorConfig = AcceleratorConfig {
    tensor_cores: 8,
    vector_cores: 2,
    width: 128,
    depth: 128,
    vector_width: 128,
    buffer_bytes: 128 << 20,
};

/// One candidate accelerator with its area.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Candidate {
    pub config: AcceleratorConfig,
    pub area_um2: f64,
    /// `floor(area / bucket width)`.
    pub bucket: u64,
}

/// The enumerated space, in visit order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Space {
    pub candidates: Vec<Candidate>,
    pub budget_um2: f64,
    pub min_area_um2: f64,
    /// Distinct tensor-core configurations (all cores), in first-appearance order.
    pub tensor_core_configs: Vec<CoreConfig>,
    /// Distinct vector-core configurations (all cores), in first-appearance order.
    pub vector_core_configs: Vec<CoreConfig>,
    /// Number of distinct area buckets.
    pub buckets: usize,
    /// Width of an area bucket.
    pub bucket_um2: f64,
    /// Configurations of the product that the area model could not size.
    pub out_of_domain: usize,
    /// The largest area the area model gave any configuration of the product (within the
    /// budget or not); 0 when it sized none. With configurations out of its domain, a
    /// budget above it is beyond the model's range (`archplace_job::prepare` refuses it).
    pub max_priced_um2: f64,
    /// Size of the product of the axes.
    pub enumerated: usize,
}

/// Messages carry their cause in the text, not as a `source` too: an error chain printed
/// with its sources (anyhow's `{:#}`) would repeat it (a plugin's error once appeared
/// three times over).
#[derive(Debug, thiserror::Error)]
pub enum SpaceError {
    #[error("the area model failed: {0}")]
    AreaModel(EstimateError),
    #[error("the area model returned {got} areas for {want} configurations")]
    WrongCount { got: usize, want: usize },
    #[error("the area model returned an invalid area {area} µm² for {config:?}")]
    InvalidArea {
        config: AcceleratorConfig,
        area: f64,
    },
    #[error(
        "the reference configuration of the area budget is outside the area model's domain: {0}"
    )]
    BudgetOutOfDomain(EstimateError),
}

impl From<EstimateError> for SpaceError {
    fn from(e: EstimateError) -> Self {
        SpaceError::AreaModel(e)
    }
}

fn descending<T: Copy + Ord>(v: &[T]) -> Vec<T> {
    let mut v = v.to_vec();
    v.sort_unstable_by(|a, b| b.cmp(a));
    v.dedup();
    v
}

/// Every configuration of the product of the axes, in the reference's order.
pub fn product(spec: &SpaceSpec) -> Vec<AcceleratorConfig> {
    let (tcs, vcs, ws, ds, bufs) = (
        descending(&spec.tensor_cores),
        descending(&spec.vector_cores),
        descending(&spec.width),
        descending(&spec.depth),
        descending(&spec.buffer_bytes),
    );
    let vws = spec.vector_width.as_deref().map(descending);
    let mut out = Vec::new();
    for &tensor_cores in &tcs {
        for &vector_cores in &vcs {
            for &width in &ws {
                for &depth in &ds {
                    let tied = [width];
                    for &vector_width in vws.as_deref().unwrap_or(&tied) {
                        for &buffer_bytes in &bufs {
                            out.push(AcceleratorConfig {
                                tensor_cores,
                                vector_cores,
                                width,
                                depth,
                                vector_width,
                                buffer_bytes,
                            });
                        }
                    }
                }
            }
        }
    }
    out
}

fn check_area(config: &AcceleratorConfig, area: f64) -> Result<f64, SpaceError> {
    if area.is_finite() && area > 0.0 {
        Ok(area)
    } else {
        Err(SpaceError::InvalidArea {
            config: *config,
            area,
        })
    }
}

/// The area budget of `spec` in µm²: as given, or its reference configuration's area
/// (one call of `area_model`).
pub fn budget_um2(spec: &SpaceSpec, area_model: &dyn AreaModel) -> Result<f64, SpaceError> {
    match &spec.area_budget {
        AreaBudget::Um2(a) => Ok(*a),
        AreaBudget::ReferenceConfig(c) => {
            let mut r = area_model.area_um2(std::slice::from_ref(c))?;
            match r.pop() {
                Some(Ok(a)) => check_area(c, a),
                Some(Err(e)) => Err(SpaceError::BudgetOutOfDomain(e)),
                None => Err(SpaceError::WrongCount { got: 0, want: 1 }),
            }
        }
    }
}

/// Enumerates and orders the space with `area_model`.
pub fn enumerate(spec: &SpaceSpec, area_model: &dyn AreaModel) -> Result<Space, SpaceError> {
    let budget_um2 = budget_um2(spec, area_model)?;
    let min_area_um2 = spec.min_area_fraction * budget_um2;
    let configs = product(spec);
    let areas = area_model.area_um2(&configs)?;
    if areas.len() != configs.len() {
        return Err(SpaceError::WrongCount {
            got: areas.len(),
            want: configs.len(),
        });
    }
    let mut candidates = Vec::new();
    let mut out_of_domain = 0;
    let mut max_priced_um2: f64 = 0.0;
    for (config, area) in configs.iter().zip(areas) {
        let area = match area {
            Ok(a) => check_area(config, a)?,
            Err(EstimateError::OutOfDomain(_)) => {
                out_of_domain += 1;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        max_priced_um2 = max_priced_um2.max(area);
        let exempt =
            spec.single_core_exempt && (config.tensor_cores == 1 || config.vector_cores == 1);
        let lo = if exempt { 0.0 } else { min_area_um2 };
        if lo <= area && area <= budget_um2 {
            candidates.push(Candidate {
                config: *config,
                area_um2: area,
                bucket: (area / spec.bucket_um2).floor() as u64,
            });
        }
    }
    let mut tc_seen = HashSet::new();
    let mut vc_seen = HashSet::new();
    let mut tensor_core_configs = Vec::new();
    let mut vector_core_configs = Vec::new();
    for c in &candidates {
        let tc = c.config.tensor_core(c.config.tensor_cores);
        if tc_seen.insert(tc) {
            tensor_core_configs.push(tc);
        }
        let vc = c.config.vector_core(c.config.vector_cores);
        if vc_seen.insert(vc) {
            vector_core_configs.push(vc);
        }
    }
    // Stable: inside a bucket the enumeration order is kept.
    candidates.sort_by_key(|c| std::cmp::Reverse(c.bucket));
    let buckets = {
        let mut n = 0;
        let mut last = None;
        for c in &candidates {
            if last != Some(c.bucket) {
                n += 1;
                last = Some(c.bucket);
            }
        }
        n
    };
    Ok(Space {
        candidates,
        budget_um2,
        min_area_um2,
        tensor_core_configs,
        vector_core_configs,
        buckets,
        bucket_um2: spec.bucket_um2,
        out_of_domain,
        max_priced_um2,
        enumerated: configs.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use archplace_reference_cost::ReferenceModel;
    use std::collections::BTreeMap;

    /// The default space under the reference area model (`docs/reference.md` §1.2).
    #[test]
    fn default_space_matches_the_reference() {
        let space = enumerate(&SpaceSpec::default(), &ReferenceModel::default()).unwrap();
        assert_eq!(space.enumerated, 75_712);
        assert_eq!(space.candidates.len(), 29_360);
        assert_eq!(space.tensor_core_configs.len(), 4_186);
        assert_eq!(space.vector_core_configs.len(), 697);
        assert_eq!(space.buckets, 13_506);
        assert!((space.budget_um2 - 278_826_676.31).abs() < 0.01);

        // Statistics of the reference's cores.json (§4.3).
        let areas: Vec<f64> = space.candidates.iter().map(|c| c.area_um2).collect();
        let min = areas.iter().copied().fold(f64::INFINITY, f64::min);
        let max = areas.iter().copied().fold(0.0, f64::max);
        let mean = areas.iter().sum::<f64>() / areas.len() as f64;
        assert!((min - 3_355_047.77).abs() < 0.01, "{min}");
        assert!((max - 278_826_676.31).abs() < 0.01, "{max}");
        assert!((mean / 1e6 - 134.14).abs() < 0.005, "{mean}");
        let mut sorted = areas.clone();
        sorted.sort_by(f64::total_cmp);
        // The reference's deciles are `sorted[floor(p · n)]`.
        let percentile = |p: f64| sorted[(p * sorted.len() as f64) as usize] / 1e6;
        for (p, want_mm2) in [
            (0.10, 24.58),
            (0.25, 89.84),
            (0.50, 127.65),
            (0.75, 190.23),
            (0.90, 229.63),
        ] {
            let got = percentile(p);
            assert!(
                (got - want_mm2).abs() < 0.005,
                "p{}: {got} mm² vs {want_mm2}",
                p * 100.0
            );
        }
        let count = |f: &dyn Fn(&AcceleratorConfig) -> u64| {
            let mut m = BTreeMap::new();
            for c in &space.candidates {
                *m.entry(f(&c.config)).or_insert(0) += 1;
            }
            m.into_values().collect::<Vec<u32>>()
        };
        assert_eq!(
            count(&|c| c.tensor_cores as u64),
            [
                5570, 2300, 2352, 2386, 2398, 2362, 2297, 2202, 2049, 1793, 1468, 1223, 960
            ]
        );
        assert_eq!(
            count(&|c| c.vector_cores as u64),
            [
                4186, 2039, 2034, 2032, 2031, 2030, 2043, 2072, 2129, 2217, 2242, 2163, 2142
            ]
        );
        assert_eq!(
            count(&|c| c.width as u64),
            [4100, 4118, 4068, 4087, 3909, 3555, 3024, 2499]
        );
        assert_eq!(
            count(&|c| c.depth as u64),
            [4240, 4173, 4067, 3897, 3670, 3393, 3108, 2812]
        );
        assert_eq!(
            count(&|c| c.buffer_bytes),
            [2968, 3010, 3066, 3224, 3918, 7029, 6145]
        );
        let single = space
            .candidates
            .iter()
            .filter(|c| c.config.tensor_cores == 1 || c.config.vector_cores == 1)
            .count();
        assert_eq!(single, 9_308);

        // Visit order: buckets descending; the first candidate is the budget config itself.
        assert_eq!(space.candidates[0].config, REFERENCE_CONFIG);
        assert!(
            space
                .candidates
                .windows(2)
                .all(|w| w[0].bucket >= w[1].bucket)
        );
        let mut per_bucket: BTreeMap<u64, u32> = BTreeMap::new();
        for c in &space.candidates {
            *per_bucket.entry(c.bucket).or_default() += 1;
        }
        assert_eq!(per_bucket.values().copied().max(), Some(22));
        assert_eq!(per_bucket.values().filter(|&&n| n == 1).count(), 6_578);
    }

    #[test]
    fn axes_and_rules_are_overridable() {
        let spec = SpaceSpec {
            tensor_cores: vec![1, 2],
            vector_cores: vec![1],
            width: vec![8],
            depth: vec![8, 16],
            vector_width: Some(vec![4, 8]),
            buffer_bytes: vec![2 << 20],
            area_budget: AreaBudget::Um2(1e12),
            min_area_fraction: 0.0,
            ..SpaceSpec::default()
        };
        let space = enumerate(&spec, &ReferenceModel::default()).unwrap();
        assert_eq!(space.candidates.len(), 8);
        assert!(space.candidates.iter().any(|c| c.config.vector_width == 4));
    }

    #[test]
    fn out_of_domain_configurations_are_skipped_not_fatal() {
        let spec = SpaceSpec {
            buffer_bytes: vec![2 << 20, 1 << 30],
            area_budget: AreaBudget::Um2(1e12),
            tensor_cores: vec![1],
            vector_cores: vec![1],
            width: vec![2],
            depth: vec![2],
            ..SpaceSpec::default()
        };
        let space = enumerate(&spec, &ReferenceModel::default()).unwrap();
        assert_eq!(space.candidates.len(), 1);
        assert_eq!(space.out_of_domain, 1);
    }
}
