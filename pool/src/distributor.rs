//! The pool as a job's [`Distributor`]: a search whose candidates the pool's workers
//! evaluate, coordinated by this daemon ([`Coordinator`]).

use crate::Pool;
use crate::coordinator::{self, Coordinator, Search};
use archplace_cost_port::CostModels;
use archplace_engine::search::Strategy;
use archplace_engine::space::Space;
use archplace_job::result::PoolStatus;
use archplace_job::run::{Distribution, Distributor, Ending};
use archplace_spec::Spec;
use std::collections::BTreeSet;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

/// One search through the pool: where the coordinator reports the pool's progress, and
/// whether a cancellation is for good.
pub struct Pooled<'a> {
    pub pool: &'a Pool,
    /// The pool's side of the search (`status.json`, `result.json`'s `work.pool`).
    pub status: Mutex<PoolStatus>,
    /// Whether a cancellation is for good (the spec left or changed: the pool drops the
    /// search) rather than the daemon's shutdown (the pool keeps it for the next start).
    pub cancelled_for_good: &'a (dyn Fn() -> bool + Sync),
    /// The id of a search this daemon carries on for its absent coordinator
    /// ([`crate::takeover`]); `None`: this daemon's own search.
    pub carrying: Option<String>,
}

impl<'a> Pooled<'a> {
    pub fn new(pool: &'a Pool, cancelled_for_good: &'a (dyn Fn() -> bool + Sync)) -> Self {
        Pooled {
            pool,
            status: Mutex::new(PoolStatus::default()),
            cancelled_for_good,
            carrying: None,
        }
    }
}

impl Distributor for Pooled<'_> {
    fn start<'s>(
        &'s self,
        spec: &Spec,
        models: &CostModels,
        space: &'s Space,
        journaled: BTreeSet<usize>,
        cancel: Arc<AtomicBool>,
    ) -> Result<Box<dyn Distribution + 's>, Box<dyn std::error::Error + Send + Sync>> {
        let mut template = coordinator::template(self.pool, spec, models, &cancel)?;
        // A carried search keeps its coordinator's id: the spec text it runs is the one the
        // coordinator stored (with a calibration's values written in), whose hash differs.
        if let Some(id) = &self.carrying {
            template.search.clone_from(id);
        }
        let search = Search {
            template,
            spec_name: spec.name.clone(),
            space,
            exhaustive: spec.space.strategy == Strategy::Exhaustive,
            ordered: spec.space.strategy == Strategy::Proven,
            journaled,
            area_blake3: models.area_source.blake3.clone(),
            carrying: self.carrying.is_some(),
        };
        let c = Coordinator::open(self.pool, search, cancel, &self.status)?;
        Ok(Box::new(c))
    }

    fn cancelled_for_good(&self) -> bool {
        (self.cancelled_for_good)()
    }

    fn status(&self) -> Option<PoolStatus> {
        self.status.lock().ok().map(|s| s.clone())
    }
}

impl Distribution for Coordinator<'_> {
    fn finish(self: Box<Self>, ending: Ending) {
        Coordinator::finish(*self, ending);
    }
}
