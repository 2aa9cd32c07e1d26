//! The pool's Prometheus series (`archplace_pool_*`), registered in the daemon's registry
//! beside its own; zero in a daemon without a pool.

use prometheus::{IntCounter, IntGauge, IntGaugeVec, Opts, Registry};

/// Registers `$m` in `$r` and returns it.
macro_rules! reg {
    ($r:expr, $m:expr) => {{
        let m = $m;
        $r.register(Box::new(m.clone()))?;
        m
    }};
}

/// The pool's metrics: this daemon as a worker (items pulled, completed,
/// redelivered, failed, skipped; busy) and as a coordinator (items published, outstanding,
/// speculative; the pool's size as it sees it); the queue as the workers' consumer has it.
pub struct PoolMetrics {
    pub configured: IntGauge,
    pub connected: IntGauge,
    pub workers: IntGauge,
    pub worker_busy: IntGauge,
    pub items_pulled: IntCounter,
    pub items_completed: IntCounter,
    pub items_redelivered: IntCounter,
    pub items_failed: IntCounter,
    pub items_skipped: IntCounter,
    pub items_published: IntCounter,
    pub items_speculative: IntCounter,
    pub items_outstanding: IntGauge,
    pub queue_items: IntGaugeVec,
    pub schedules_shared: IntCounter,
}

impl PoolMetrics {
    /// The pool's series, registered in `r` (the daemon's registry), at zero.
    pub fn new(r: &Registry) -> Result<PoolMetrics, prometheus::Error> {
        let counter = |name: &str, help: &str| -> Result<IntCounter, prometheus::Error> {
            Ok(reg!(r, IntCounter::new(name, help)?))
        };
        let gauge = |name: &str, help: &str| -> Result<IntGauge, prometheus::Error> {
            Ok(reg!(r, IntGauge::new(name, help)?))
        };
        let m = PoolMetrics {
            configured: gauge(
                "archplace_pool_configured",
                "Whether the daemon was started with a pool (--nats); the pool's other series are zero without one",
            )?,
            connected: gauge(
                "archplace_pool_connected",
                "Whether the daemon is connected to the pool's NATS server (0 without a pool)",
            )?,
            workers: gauge(
                "archplace_pool_workers",
                "Workers with a live heartbeat in the pool, as this daemon last saw them while coordinating",
            )?,
            worker_busy: gauge(
                "archplace_pool_worker_busy",
                "Whether this daemon's pool worker is evaluating an item",
            )?,
            items_pulled: counter(
                "archplace_pool_items_pulled_total",
                "Work items this daemon's worker took from the pool's queue",
            )?,
            items_completed: counter(
                "archplace_pool_items_completed_total",
                "Work items this daemon's worker evaluated and answered",
            )?,
            items_redelivered: counter(
                "archplace_pool_items_redelivered_total",
                "Work items this daemon's worker took that had been delivered before (a worker died or stopped on them)",
            )?,
            items_failed: counter(
                "archplace_pool_items_failed_total",
                "Work items this daemon's worker could not evaluate (their search fails)",
            )?,
            items_skipped: counter(
                "archplace_pool_items_skipped_total",
                "Work items this daemon's worker dropped because their search had ended (converged, cancelled or failed)",
            )?,
            items_published: counter(
                "archplace_pool_items_published_total",
                "Work items this daemon published for the searches it coordinates",
            )?,
            items_speculative: counter(
                "archplace_pool_speculative_items_total",
                "Work items published past the point where a converging search stopped (bounded by the look-ahead)",
            )?,
            items_outstanding: gauge(
                "archplace_pool_items_outstanding",
                "Items published and not yet answered, for the search this daemon coordinates: the queue's lag behind the walk",
            )?,
            schedules_shared: counter(
                "archplace_pool_schedules_shared_total",
                "Layer schedules this daemon's worker took from the pool's memo instead of solving them",
            )?,
            queue_items: reg!(
                r,
                IntGaugeVec::new(
                    Opts::new(
                        "archplace_pool_queue_items",
                        "Items in the pool's queue, by state: pending (not taken) and in_progress (taken, not acknowledged)",
                    ),
                    &["state"],
                )?
            ),
        };
        for s in ["pending", "in_progress"] {
            m.queue_items.with_label_values(&[s]).set(0);
        }
        Ok(m)
    }
}
