//! A synthetic worker that answers every item at once with a copy of one evaluation: what
//! the coordinator benchmark (`benches/pool.rs`) measures the coordinator against, so that
//! its figure is the coordinator's capacity (publish, store, merge), not the workers'.

use super::protocol::*;
use super::{Pool, nats_err};
use archplace_engine::search::{Evaluated, Stats};
use async_nats::jetstream::consumer;
use futures_util::StreamExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Answers items from the workers' queue until `stop`: each candidate with `record`
/// (its index, configuration, area and bucket set to the candidate's), many items at a
/// time, posing as `workers` workers in the workers bucket (so that coordinators publish
/// as far ahead as for that many). Returns the items answered.
pub fn respond(pool: &Pool, record: &Evaluated, stop: &AtomicBool, workers: usize) -> u64 {
    let mut answered = 0;
    let mut beat = std::time::Instant::now() - Duration::from_secs(60);
    let Ok(consumer) = pool.block_on(
        pool.items
            .get_consumer::<consumer::pull::Config>(WORKERS_CONSUMER),
    ) else {
        return 0;
    };
    while !stop.load(Ordering::Relaxed) {
        if beat.elapsed() > Duration::from_secs(super::BEAT_SECONDS) {
            beat = std::time::Instant::now();
            for w in 0..workers {
                let b = WorkerBeat {
                    worker: format!("synthetic-{w}"),
                    archplace_version: env!("CARGO_PKG_VERSION").to_string(),
                    threads: 1,
                    busy: true,
                    items_completed: answered,
                };
                let bytes = serde_json::to_vec(&b).unwrap_or_default();
                let _ = pool.block_on(pool.workers.put(b.worker.as_str(), bytes.into()));
            }
        }
        let batch = pool.block_on(async {
            let mut batch = consumer
                .fetch()
                .max_messages(256)
                .expires(Duration::from_millis(100))
                .messages()
                .await
                .map_err(nats_err)?;
            let mut out = Vec::new();
            while let Some(m) = batch.next().await {
                out.push(m.map_err(nats_err)?);
            }
            Ok::<_, super::PoolError>(out)
        });
        let Ok(batch) = batch else {
            continue;
        };
        let n = batch.len() as u64;
        let js = &pool.js;
        let _ = pool.block_on(async {
            let mut acks = Vec::new();
            for m in &batch {
                let Ok(item) = serde_json::from_slice::<Item>(&m.payload) else {
                    continue;
                };
                let evaluated = item
                    .candidates
                    .iter()
                    .map(|c| Evaluated {
                        index: c.index,
                        config: c.config,
                        area_um2: c.area_um2,
                        bucket: c.bucket,
                        ..record.clone()
                    })
                    .collect();
                let result = ItemResult {
                    search: item.search.clone(),
                    item: item.item,
                    worker: "synthetic".into(),
                    answer: Answer::Evaluated {
                        evaluated,
                        work: Stats::default(),
                    },
                };
                let payload = serde_json::to_vec(&result).unwrap_or_default();
                acks.push(
                    js.publish(results_subject(&item.search), payload.into())
                        .await?,
                );
            }
            for a in acks {
                a.await?;
            }
            for m in &batch {
                m.ack()
                    .await
                    .map_err(|e| async_nats::Error::from(e.to_string()))?;
            }
            Ok::<_, async_nats::Error>(())
        });
        answered += n;
    }
    answered
}
