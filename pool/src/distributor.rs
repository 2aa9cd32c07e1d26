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
}

impl<'a> Pooled<'a> {
    pub fn new(pool: &'a Pool, cancelled_for_good: &'a (dyn Fn() -> bool + Sync)) -> Self {
        Pooled {
            pool,
            status: Mutex::new(PoolStatus::default()),
            cancelled_for_good,
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
        let search = Search {
            template: coordinator::template(self.pool, spec, models, &cancel)?,
            spec_name: spec.name.clone(),
            space,
            exhaustive: spec.space.strategy == Strategy::Exhaustive,
            ordered: spec.space.strategy == Strategy::Proven,
            journaled,
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
