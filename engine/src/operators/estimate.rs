//! Batched latency estimation: every distinct operator of some layers on every core
//! configuration, one cost-model call per configuration.

use crate::model::{Core, OpGraph};
use archplace_plugin_sdk::{CoreConfig, EstimateError, LatencyModel, Op, OpCost};
use std::collections::BTreeSet;

/// The distinct operators of some graphs, by the cores they run on. A fused operator is a
/// tensor-core operator whose epilogue is charged in its estimate.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OpSet {
    pub tensor: Vec<Op>,
    pub vector: Vec<Op>,
    pub link: Vec<Op>,
}

impl OpSet {
    pub fn of<'a>(graphs: impl IntoIterator<Item = &'a OpGraph>) -> OpSet {
        let (mut t, mut v, mut l) = (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
        for g in graphs {
            for n in &g.nodes {
                match n.core {
                    Core::Tensor | Core::Fused => t.insert(n.op.clone()),
                    Core::Vector => v.insert(n.op.clone()),
                    Core::Link => l.insert(n.op.clone()),
                };
            }
        }
        OpSet {
            tensor: t.into_iter().collect(),
            vector: v.into_iter().collect(),
            link: l.into_iter().collect(),
        }
    }

    pub fn len(&self) -> usize {
        self.tensor.len() + self.vector.len() + self.link.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Costs of `ops` on `core`, checked: one finite, non-negative answer per operator.
pub fn estimate(
    model: &dyn LatencyModel,
    core: &CoreConfig,
    ops: &[Op],
) -> Result<Vec<OpCost>, EstimateError> {
    if ops.is_empty() {
        return Ok(Vec::new());
    }
    let costs = model.latency(core, ops)?;
    if costs.len() != ops.len() {
        return Err(EstimateError::Internal(format!(
            "the latency model returned {} results for {} operators",
            costs.len(),
            ops.len()
        )));
    }
    if let Some((i, c)) = costs.iter().enumerate().find(|(_, c)| {
        !(c.seconds.is_finite() && c.seconds >= 0.0 && c.joules.is_finite() && c.joules >= 0.0)
    }) {
        return Err(EstimateError::Internal(format!(
            "the latency model returned {} s / {} J for operator {i} ({:?})",
            c.seconds, c.joules, ops[i].kind
        )));
    }
    Ok(costs)
}

/// Costs of `ops` on every configuration of `cores`, each with all its cores and with one
/// core: `[config][0 = all cores, 1 = one core][op]`.
pub fn estimate_all(
    model: &dyn LatencyModel,
    cores: &[CoreConfig],
    ops: &[Op],
) -> Result<Vec<[Vec<OpCost>; 2]>, EstimateError> {
    cores
        .iter()
        .map(|c| {
            let one = CoreConfig { cores: 1, ..*c };
            Ok([estimate(model, c, ops)?, estimate(model, &one, ops)?])
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{BuildOptions, build, preset};
    use archplace_plugin_sdk::{CoreKind, ModelInfo};

    struct Broken;
    impl LatencyModel for Broken {
        fn info(&self) -> ModelInfo {
            unimplemented!()
        }
        fn latency(&self, _: &CoreConfig, ops: &[Op]) -> Result<Vec<OpCost>, EstimateError> {
            Ok(ops.iter().map(|_| OpCost::new(f64::NAN, 0.0)).collect())
        }
    }

    #[test]
    fn bad_numbers_are_rejected() {
        let g = build(
            &preset("gpt2-xl").unwrap(),
            &BuildOptions {
                recompute_modules: Default::default(),
                micro_batch: 1,
                tensor_parallel: 1,
                numerics: Default::default(),
                link_bytes_per_second: 1,
                sequence_parallel: false,
                experts: Default::default(),
                context_parallel: 1,
                kernels: Default::default(),
                fp8_library: Default::default(),
                cross_entropy: Default::default(),
            },
        );
        let ops = OpSet::of([&g.block.forward]);
        let core = CoreConfig {
            kind: CoreKind::Tensor,
            cores: 1,
            width: 2,
            depth: 2,
            buffer_bytes: 2 << 20,
        };
        let err = estimate(&Broken, &core, &ops.tensor).unwrap_err();
        assert!(matches!(err, EstimateError::Internal(_)), "{err}");
    }
}
