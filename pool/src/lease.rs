//! A search's lease: which daemon coordinates it now. Its coordinator renews it every
//! [`LEASE_RENEW_SECONDS`] from the pool's runtime (not the walk's thread, so a long local
//! computation does not let it lapse); the bucket forgets a value [`LEASE_SECONDS`] after
//! it was written, so a lease that lapsed means its coordinator is gone — killed, cut off —
//! and another daemon may carry the search on ([`super::takeover`]).
//!
//! Only the lease's holder publishes items and records the search's state: a coordinator
//! that finds the lease held by another (it came back while another carries its search)
//! follows the answers until the lease is free again, then takes it and goes on from the
//! state the other recorded. A daemon restarted under the same name takes its lease back at
//! once.

use super::protocol::*;
use super::{Pool, PoolError, nats_err};
use async_nats::jetstream::kv;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Who holds a lease, as its would-be holder last saw it.
#[derive(Debug, Clone, Default)]
struct Seen {
    /// The revision of our value, when we hold it.
    revision: Option<u64>,
    /// Another daemon's name, when it holds it.
    other: Option<String>,
}

/// One daemon's hold on (or wait for) one search's lease.
pub struct Lease {
    id: String,
    seen: Arc<Mutex<Seen>>,
    renewal: tokio::task::JoinHandle<()>,
}

impl Lease {
    /// Takes search `id`'s lease if it is free (or this daemon's name holds it), else waits
    /// for it; renewed, or tried again, every [`LEASE_RENEW_SECONDS`] until
    /// [`Lease::release`]. The first try is made before this returns (retried while the
    /// server is away, until `stop`).
    pub(crate) fn take(pool: &Pool, id: &str, stop: &dyn Fn() -> bool) -> Result<Lease, PoolError> {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let first = pool
            .retry("taking the search's lease", stop, || {
                renew(&pool.leases, id, &pool.name, &seen)
            })
            .ok_or(PoolError::Cancelled)?;
        if let Some(other) = &first.other {
            tracing::info!(search = %id, holder = %other, "another daemon carries this search on: following its answers until it hands the search back");
        }
        let renewal = pool.spawn(keep(
            pool.leases.clone(),
            id.to_string(),
            pool.name.clone(),
            seen.clone(),
        ));
        Ok(Lease {
            id: id.to_string(),
            seen,
            renewal,
        })
    }

    /// Whether this daemon holds the lease (as of its last renewal).
    pub(crate) fn held(&self) -> bool {
        held(&self.seen)
    }

    /// Stops renewing and frees the lease if this daemon holds it, so that another may
    /// take it at once rather than after it lapses.
    pub(crate) fn release(self, pool: &Pool) {
        self.renewal.abort();
        let revision = self.seen.lock().ok().and_then(|s| s.revision);
        if let Some(revision) = revision {
            let deleted = pool.block_on(async {
                tokio::time::timeout(
                    Duration::from_secs(5),
                    pool.leases.delete_expect_revision(&self.id, Some(revision)),
                )
                .await
            });
            if !matches!(deleted, Ok(Ok(()))) {
                tracing::debug!(search = %self.id, "could not free the lease; it lapses by itself");
            }
        }
    }
}

/// A lease dropped without `release` (a search that ended in a panic) stops being
/// renewed — a task on the pool's runtime would otherwise renew it for the daemon's life —
/// and lapses by itself.
impl Drop for Lease {
    fn drop(&mut self) {
        self.renewal.abort();
    }
}

/// Renews (or takes, if free) the lease every [`LEASE_RENEW_SECONDS`], saying when it is
/// lost or taken.
async fn keep(leases: kv::Store, id: String, name: String, seen: Arc<Mutex<Seen>>) {
    loop {
        tokio::time::sleep(Duration::from_secs(LEASE_RENEW_SECONDS)).await;
        let was = held(&seen);
        let Ok(Ok(now)) = tokio::time::timeout(
            Duration::from_secs(LEASE_RENEW_SECONDS),
            renew(&leases, &id, &name, &seen),
        )
        .await
        else {
            // The server is away: nothing can be known, and nothing published either.
            continue;
        };
        match (was, &now.other) {
            (true, Some(other)) => {
                tracing::warn!(search = %id, holder = %other, "lost the search's lease (this daemon was silent too long): following the other's answers")
            }
            (false, None) => tracing::info!(search = %id, "took the search's lease"),
            _ => {}
        }
    }
}

/// One renewal: our value written again over our last revision, or — lost, or never
/// held — written if the key is free, expired or ours by name. Returns who holds it now.
async fn renew(
    leases: &kv::Store,
    id: &str,
    name: &str,
    seen: &Mutex<Seen>,
) -> Result<Seen, PoolError> {
    let value = || name.as_bytes().to_vec().into();
    let last = seen.lock().ok().and_then(|s| s.revision);
    let mut now = Seen::default();
    let renewed = match last {
        Some(revision) => leases.update(id, value(), revision).await.ok(),
        None => None,
    };
    now.revision = match renewed {
        Some(revision) => Some(revision),
        None => match holding(leases, id).await? {
            Some((holder, revision)) if holder == name => Some(
                leases
                    .update(id, value(), revision)
                    .await
                    .map_err(nats_err)?,
            ),
            Some((holder, _)) => {
                now.other = Some(holder);
                None
            }
            None => match leases.create(id, value()).await {
                Ok(revision) => Some(revision),
                // Another took it between the read and the write.
                Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {
                    now.other = Some("another daemon".into());
                    None
                }
                Err(e) => return Err(nats_err(e)),
            },
        },
    };
    if let Ok(mut s) = seen.lock() {
        *s = now.clone();
    }
    Ok(now)
}

/// Whether the last renewal found the lease this daemon's.
fn held(seen: &Mutex<Seen>) -> bool {
    seen.lock().is_ok_and(|s| s.revision.is_some())
}

/// Who holds search `id`'s lease, with its value's revision, if anyone (a lapsed or freed
/// lease is no one's).
async fn holding(leases: &kv::Store, id: &str) -> Result<Option<(String, u64)>, PoolError> {
    Ok(match leases.entry(id).await.map_err(nats_err)? {
        Some(e) if e.operation == kv::Operation::Put => {
            Some((String::from_utf8_lossy(&e.value).to_string(), e.revision))
        }
        _ => None,
    })
}

/// Who holds search `id`'s lease, if anyone.
pub(crate) async fn holder(pool: &Pool, id: &str) -> Result<Option<String>, PoolError> {
    Ok(holding(&pool.leases, id).await?.map(|(name, _)| name))
}
