//! The coordinator of one pooled search: the engine's `Supplier` that publishes the walk's
//! candidates as items, in the walk's order, and hands back the workers' evaluations in
//! that order: the space's (area buckets), or a proven walk's (its bounds, largest first,
//! published only while they may beat the best).

use super::config::MAX_LOOK_AHEAD_ITEMS;
use super::lease::Lease;
use super::protocol::*;
use super::{Pool, PoolError, nats_err, objects};
use archplace_cost_port::CostModels;
use archplace_engine::search::{Evaluated, SearchError, Stats, Supplier};
use archplace_engine::space::{Candidate, Space};
use archplace_job::result::PoolStatus;
use archplace_job::run::Ending;
use archplace_spec::Spec;
use async_nats::jetstream::consumer;
use futures_util::StreamExt;

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The search's identity in the pool: the spec's content, archplace's version and the cost
/// models' components — what an evaluation depends on. It begins with the 16 hex digits
/// the daemon's own logs call the spec's job by (`hash=`), so that one search is one id in
/// every daemon's log: `<job hash>-<the rest's hash>`.
pub fn search_id(spec: &Spec, models: &CostModels) -> String {
    let text = format!(
        "{}/{}/{}/{}",
        spec.content_hash,
        env!("CARGO_PKG_VERSION"),
        models.area_source.blake3.as_deref().unwrap_or("native"),
        models.latency_source.blake3.as_deref().unwrap_or("native"),
    );
    let job: String = spec.content_hash.chars().take(16).collect();
    format!("{job}-{}", &blake3::hash(text.as_bytes()).to_hex()[..16])
}

/// The items of `space`: each area bucket cut into runs of at most `per_item` candidates.
pub fn items_of(space: &Space, per_item: usize) -> Vec<Range<usize>> {
    let per_item = per_item.max(1);
    let mut items = Vec::new();
    let n = space.candidates.len();
    let mut i = 0;
    while i < n {
        let bucket = space.candidates[i].bucket;
        let end = (i..n)
            .find(|&k| space.candidates[k].bucket != bucket)
            .unwrap_or(n);
        let mut k = i;
        while k < end {
            let e = (k + per_item).min(end);
            items.push(k..e);
            k = e;
        }
        i = end;
    }
    items
}

type Results = consumer::pull::Ordered;

/// What a coordinator is asked to spread: the items' common part (`template`, whose
/// `search` is the search's identity), the space and whether the walk visits all of it,
/// and the candidates its journal already has.
pub struct Search<'a> {
    pub template: Item,
    pub spec_name: String,
    pub space: &'a Space,
    pub exhaustive: bool,
    /// The walk visits the candidates in its own order, which it gives before the first
    /// candidate ([`Supplier::follow`]): the items are cut from that order then.
    pub ordered: bool,
    pub journaled: BTreeSet<usize>,
    /// The area model's component (blake3; `None`: linked natively): recorded, so that
    /// only a daemon with the same one carries the search on.
    pub area_blake3: Option<String>,
    /// This daemon carries on a search whose coordinator is away ([`super::takeover`]):
    /// it walks it to its end and leaves the answers for the coordinator to collect.
    pub carrying: bool,
}

pub struct Coordinator<'a> {
    pool: &'a Pool,
    space: &'a Space,
    id: String,
    template: Item,
    spec_name: String,
    /// Runs of the walk's positions (see `order`), at most `item_candidates` long.
    items: Vec<Range<usize>>,
    /// The candidate at each position of the walk: `None` for the space's order (position
    /// = index); and each candidate's position (`usize::MAX`: never visited).
    order: Option<(Vec<usize>, Vec<usize>)>,
    /// Positions from here on will not be asked for (a proven walk's pruning).
    end: usize,
    /// Candidates the walk has from its journal: items made only of them are not published.
    journaled: BTreeSet<usize>,
    state: SearchState,
    answered: BTreeSet<usize>,
    /// Answers not yet taken by the walk, by position.
    evaluations: BTreeMap<usize, Evaluated>,
    failure: Option<String>,
    results: Option<Results>,
    /// The client's connection count when `results` was opened (see [`Pool::connections`]).
    results_connection: u64,
    /// The stream sequence of the last answer read: a consumer opened again starts after it.
    last_answer: u64,
    work: Stats,
    cancel: Arc<AtomicBool>,
    status: &'a Mutex<PoolStatus>,
    /// The last item the walk asked from.
    walked: Option<usize>,
    workers: usize,
    checked: Instant,
    /// Every candidate is evaluated: nothing published is speculative.
    exhaustive: bool,
    /// JetStream's advisories of items delivered `max_deliveries` times unanswered.
    exhausted: Option<async_nats::Subscriber>,
    /// The search's lease ([`Lease`]): only while it is held are items published and the
    /// state recorded. `None` once finished.
    lease: Option<Lease>,
    /// Whether the lease was held at the last look (a change to held takes up what the
    /// holder before recorded).
    holding: bool,
    /// See [`Search::carrying`].
    carrying: bool,
    /// The workers seen at the last look: one gone is said in the log.
    known_workers: BTreeSet<String>,
    /// The search ended in the pool while this daemon followed it (its coordinator came
    /// back and finished it, or cancelled it): why.
    ended_elsewhere: Option<String>,
}

/// Puts the spec and the latency model's component in the object store: what every item
/// of the search names; the item template of the search.
pub fn template(
    pool: &Pool,
    spec: &Spec,
    models: &CostModels,
    cancel: &AtomicBool,
) -> Result<Item, PoolError> {
    let src = &models.latency_source;
    let (Some(blake3), Some(path)) = (&src.blake3, &src.path) else {
        return Err(PoolError::NativeModel {
            plugin: src.plugin.clone(),
        });
    };
    let component = objects::read_component(std::path::Path::new(path), blake3)?;
    let id = search_id(spec, models);
    let stop = || super::set(cancel);
    // The text as the search runs it (a calibrated spec's has the calibrated values), named
    // by its own hash, which the workers check.
    let text = spec.source_text.as_bytes();
    let text_hash = blake3::hash(text).to_hex().to_string();
    let spec_object = spec_object(&text_hash);
    pool.retry("storing the spec in the pool", &stop, || {
        pool.put_object(&spec_object, text)
    })
    .ok_or_else(cancelled)?;
    let component_object = component_object(blake3);
    pool.retry("storing the cost model in the pool", &stop, || {
        pool.put_object(&component_object, &component)
    })
    .ok_or_else(cancelled)?;
    Ok(Item {
        protocol: PROTOCOL_VERSION,
        archplace_version: env!("CARGO_PKG_VERSION").to_string(),
        search: id,
        item: 0,
        spec_hash: text_hash,
        spec_file: spec.source_file.clone(),
        latency: ComponentRef {
            plugin: src.plugin.clone(),
            version: src.version.clone(),
            blake3: blake3.clone(),
        },
        candidates: Vec::new(),
    })
}

impl<'a> Coordinator<'a> {
    /// The coordinator of the search `template.search` (whose items are `template` with
    /// their candidates, see [`template`]), new or interrupted (then its published items and
    /// stored answers are taken up again). (The coordinator benchmark starts here, with a
    /// synthetic search.)
    pub fn open(
        pool: &'a Pool,
        search: Search<'a>,
        cancel: Arc<AtomicBool>,
        status: &'a Mutex<PoolStatus>,
    ) -> Result<Coordinator<'a>, PoolError> {
        let Search {
            template,
            spec_name,
            space,
            exhaustive,
            ordered,
            journaled,
            area_blake3,
            carrying,
        } = search;
        let id = template.search.clone();
        let state = SearchState {
            phase: Phase::Running,
            spec: spec_name.clone(),
            spec_hash: template.spec_hash.clone(),
            spec_file: template.spec_file.clone(),
            coordinator: pool.name.clone(),
            area_blake3,
            latency_blake3: Some(template.latency.blake3.clone()),
            carried_by: None,
            walked: false,
            items_published: 0,
            items_total: 0,
            reason: None,
        };
        let lease = Lease::take(pool, &id, &|| super::set(&cancel))?;
        let holding = lease.held();
        if carrying && !holding {
            // Two daemons saw the lease lapse; the other took it first.
            lease.release(pool);
            return Err(PoolError::CarriedElsewhere(id));
        }
        let mut c = Coordinator {
            pool,
            space,
            id,
            template,
            spec_name,
            items: Vec::new(),
            order: None,
            end: usize::MAX,
            journaled,
            state,
            answered: BTreeSet::new(),
            evaluations: BTreeMap::new(),
            failure: None,
            results: None,
            results_connection: 0,
            last_answer: 0,
            work: Stats::default(),
            cancel,
            status,
            walked: None,
            workers: 0,
            checked: Instant::now() - Duration::from_secs(60),
            exhaustive,
            exhausted: None,
            lease: Some(lease),
            holding,
            carrying,
            known_workers: BTreeSet::new(),
            ended_elsewhere: None,
        };
        let client = pool.js.client();
        c.exhausted = pool
            .block_on(client.subscribe(format!(
                "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{ITEMS_STREAM}.{WORKERS_CONSUMER}"
            )))
            .map_err(|e| tracing::warn!(error = %e, "cannot watch for items no worker finishes"))
            .ok();
        if !ordered {
            c.items = items_of(space, pool.settings.item_candidates);
            c.take_up()?;
        }
        c.refresh();
        Ok(c)
    }

    /// Records the search in the pool with its items: new, or interrupted with as many
    /// items (the same ones: the order is the spec's) — then its published items and
    /// stored answers are taken up again.
    fn take_up(&mut self) -> Result<(), PoolError> {
        let (pool, id) = (self.pool, self.id.clone());
        let cancel = self.cancel.clone();
        let stop = || super::set(&cancel);
        let previous = pool
            .retry("reading the search's state", &stop, || pool.state(&id))
            .ok_or_else(cancelled)?;
        let holding = self.holds();
        self.state = match previous {
            Some(s) if s.phase == Phase::Running && s.items_total == self.items.len() => {
                self.resumed(&s);
                if self.carrying {
                    SearchState {
                        carried_by: Some(pool.name.clone()),
                        ..s
                    }
                } else {
                    SearchState {
                        coordinator: pool.name.clone(),
                        ..s
                    }
                }
            }
            _ if self.carrying => return Err(PoolError::NotRunning(id)),
            // A new search whose lease another holds (it is served from two spec folders):
            // the holder records it.
            _ if !holding => SearchState {
                items_total: self.items.len(),
                ..self.state.clone()
            },
            _ => {
                // A fresh search (or one that ended before: its leftovers are purged).
                let subject = results_subject(&id);
                pool.retry("clearing old answers", &stop, || {
                    super::purge(&pool.results, subject.clone())
                })
                .ok_or_else(cancelled)?;
                SearchState {
                    phase: Phase::Running,
                    spec: self.spec_name.clone(),
                    coordinator: pool.name.clone(),
                    carried_by: None,
                    walked: false,
                    items_published: 0,
                    items_total: self.items.len(),
                    reason: None,
                    ..self.state.clone()
                }
            }
        };
        if holding {
            let state = &self.state;
            pool.retry("recording the search", &stop, || pool.put_state(&id, state))
                .ok_or_else(cancelled)?;
        }
        Ok(())
    }

    /// Says how a search found running in the pool is taken up.
    fn resumed(&self, s: &SearchState) {
        let id = &self.id;
        if self.carrying {
            tracing::info!(search = %id, coordinator = %s.coordinator, spec = %s.spec, published = s.items_published, "carrying the search on while its coordinator is away");
            return;
        }
        tracing::info!(search = %id, published = s.items_published, "resuming the search in the pool");
        if let Some(by) = &s.carried_by {
            if s.walked {
                tracing::info!(search = %id, carried_by = %by, "the search was carried to its end while this daemon was away: collecting its answers, evaluating nothing again");
            } else {
                tracing::info!(search = %id, carried_by = %by, "the search was carried on while this daemon was away: taking it up where it got to");
            }
        }
    }

    /// Whether this daemon holds the search's lease.
    fn holds(&self) -> bool {
        self.lease.as_ref().is_some_and(Lease::held)
    }

    /// Whether this daemon holds the lease now; when it has just taken it (back), what the
    /// holder before recorded is taken up first (the items it published are not published
    /// again).
    fn check_lease(&mut self) -> bool {
        let now = self.holds();
        if now && !self.holding {
            let (pool, id) = (self.pool, self.id.clone());
            let stop = || super::set(&self.cancel);
            if let Some(Some(s)) =
                pool.retry("reading the search's state", &stop, || pool.state(&id))
                && s.phase == Phase::Running
                && s.items_total == self.state.items_total
            {
                self.state.items_published = self.state.items_published.max(s.items_published);
                self.state.walked = s.walked;
                self.state.carried_by = s.carried_by;
            }
            if !self.carrying {
                self.state.coordinator = pool.name.clone();
            }
            self.holding = true;
            self.save_state();
        }
        self.holding = now;
        now
    }

    /// The candidate at position `pos` of the walk.
    fn at(&self, pos: usize) -> usize {
        self.order.as_ref().map_or(pos, |(order, _)| order[pos])
    }

    /// Candidate `index`'s position in the walk, if the walk visits it.
    fn position(&self, index: usize) -> Option<usize> {
        match &self.order {
            None => Some(index),
            Some((_, positions)) => positions.get(index).copied().filter(|&p| p != usize::MAX),
        }
    }

    /// Whether every candidate of item `n` is in the journal.
    fn journaled_item(&self, n: usize) -> bool {
        self.items[n]
            .clone()
            .all(|p| self.journaled.contains(&self.at(p)))
    }

    fn stopped(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }

    /// The item holding position `pos`.
    fn item_of(&self, pos: usize) -> usize {
        self.items.partition_point(|r| r.end <= pos)
    }

    /// Items to keep published ahead of the walk. The walk takes answers in candidate
    /// order, so workers run ahead of it: with too short a look-ahead a worker idles while
    /// the walk waits for a slower item. Four per worker, at least 1 — at most the
    /// configured look-ahead when the search may converge (what is published past its end
    /// is wasted work); in an exhaustive search, where nothing is wasted, at least the
    /// configured look-ahead and at most [`MAX_LOOK_AHEAD_ITEMS`] (it only bounds the
    /// answers held for merging).
    fn look_ahead(&self) -> usize {
        let per_workers = 4 * self.workers;
        if self.exhaustive {
            per_workers
                .max(self.pool.settings.look_ahead_items)
                .min(MAX_LOOK_AHEAD_ITEMS)
        } else {
            per_workers.clamp(1, self.pool.settings.look_ahead_items)
        }
    }

    /// Publishes items up to (not including) `upto`, all at once: every message is sent,
    /// then every acknowledgement awaited (one round trip for the batch, not one per
    /// item), then the state recorded. A batch that fails is sent again whole: the server
    /// drops the copies of items it already has (`Nats-Msg-Id`).
    fn publish_to(&mut self, upto: usize) -> Result<(), SearchError> {
        // Nothing past where the walk stops.
        let needed = self.items.partition_point(|r| r.start < self.end);
        let upto = upto.min(needed);
        let mut batch: Vec<(String, Vec<u8>)> = Vec::new();
        for n in self.state.items_published..upto {
            if self.journaled_item(n) {
                continue;
            }
            let mut item = self.template.clone();
            item.item = n;
            item.candidates = self.items[n]
                .clone()
                .map(|p| {
                    let k = self.at(p);
                    let c: &Candidate = &self.space.candidates[k];
                    ItemCandidate {
                        index: k,
                        config: c.config,
                        area_um2: c.area_um2,
                        bucket: c.bucket,
                    }
                })
                .collect();
            let payload = serde_json::to_vec(&item)
                .map_err(|e| SearchError::Supplier(format!("cannot encode item {n}: {e}")))?;
            batch.push((format!("{}.{n}", self.id), payload));
        }
        if upto <= self.state.items_published || !self.check_lease() {
            return Ok(());
        }
        let subject = items_subject(&self.id);
        let js = &self.pool.js;
        let stop = || super::set(&self.cancel);
        let batch = &batch;
        self.pool
            .retry("publishing items", &stop, || {
                let subject = subject.clone();
                async move {
                    let mut acks = Vec::with_capacity(batch.len());
                    for (msg_id, payload) in batch {
                        let mut headers = async_nats::HeaderMap::new();
                        headers.insert("Nats-Msg-Id", msg_id.as_str());
                        acks.push(
                            js.publish_with_headers(
                                subject.clone(),
                                headers,
                                payload.clone().into(),
                            )
                            .await
                            .map_err(nats_err)?,
                        );
                    }
                    for a in acks {
                        a.await.map_err(nats_err)?;
                    }
                    Ok::<_, PoolError>(())
                }
            })
            .ok_or_else(|| SearchError::Supplier("cancelled".into()))?;
        self.pool.metrics.items_published.inc_by(batch.len() as u64);
        self.state.items_published = upto;
        self.save_state();
        Ok(())
    }

    /// Keeps the look-ahead published: refilled to the whole look-ahead once less than
    /// half of it is left (so items go out in batches, with one state record per batch).
    fn keep_ahead(&mut self, item: usize) -> Result<(), SearchError> {
        let ahead = self.look_ahead();
        if self.state.items_published < item + 1 + ahead / 2 {
            self.publish_to(item + 1 + ahead)?;
        }
        Ok(())
    }

    fn save_state(&self) {
        if !self.holds() {
            return;
        }
        let stop = || super::set(&self.cancel);
        let _ = self.pool.retry("recording the search", &stop, || {
            self.pool.put_state(&self.id, &self.state)
        });
    }

    /// Opens the ordered consumer of the search's answers, from the first; again after the
    /// client reconnected, from the one after the last read. The server keeps an ordered
    /// consumer in memory only, so a restart loses it, and the client would notice only
    /// after two missed heartbeats (30 s) and then back off.
    fn results(&mut self) -> Result<&mut Results, SearchError> {
        let connection = self.pool.connections();
        if self.results.is_some() && connection != self.results_connection {
            tracing::info!(search = %self.id, after = self.last_answer, "reconnected to NATS: reading the search's answers again");
            self.results = None;
        }
        if self.results.is_none() {
            self.results_connection = connection;
            let subject = results_subject(&self.id);
            let stream = &self.pool.results;
            let stop = || super::set(&self.cancel);
            let deliver_policy = match self.last_answer {
                0 => consumer::DeliverPolicy::All,
                last => consumer::DeliverPolicy::ByStartSequence {
                    start_sequence: last + 1,
                },
            };
            let r = self
                .pool
                .retry("reading the search's answers", &stop, || {
                    let subject = subject.clone();
                    async move {
                        stream
                            .create_consumer(consumer::pull::OrderedConfig {
                                filter_subject: subject,
                                deliver_policy,
                                ..Default::default()
                            })
                            .await
                            .map_err(nats_err)?
                            .messages()
                            .await
                            .map_err(nats_err)
                    }
                })
                .ok_or_else(|| SearchError::Supplier("cancelled".into()))?;
            self.results = Some(r);
        }
        self.results
            .as_mut()
            .ok_or_else(|| SearchError::Supplier("no answers".into()))
    }

    /// Takes in the answers that arrive within `wait`.
    fn receive(&mut self, wait: Duration) -> Result<(), SearchError> {
        let pool = self.pool;
        let results = self.results()?;
        let next = pool.block_on(async { tokio::time::timeout(wait, results.next()).await });
        let message = match next {
            Err(_) | Ok(None) => return Ok(()),
            Ok(Some(Err(e))) => {
                tracing::warn!(error = %e, "reading the search's answers; going on");
                return Ok(());
            }
            Ok(Some(Ok(m))) => m,
        };
        if let Ok(info) = message.info() {
            self.last_answer = info.stream_sequence;
        }
        let result: ItemResult = match serde_json::from_slice(&message.payload) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "an answer that is not an item result; ignored");
                return Ok(());
            }
        };
        if result.search != self.id || !self.answered.insert(result.item) {
            // Another search's, or a second answer to an item (a redelivered item that
            // its first worker finished after all): the same answer, ignored.
            return Ok(());
        }
        match result.answer {
            Answer::Evaluated { evaluated, work } => {
                let walked = self.walked.map_or(0, |i| self.items[i].start);
                for e in evaluated {
                    let Some(pos) = self.position(e.index) else {
                        continue;
                    };
                    if pos >= walked && !self.journaled.contains(&e.index) {
                        self.evaluations.insert(pos, e);
                    }
                }
                self.work.add_work(&work);
            }
            Answer::Failed { reason } => {
                self.failure = Some(format!(
                    "worker {} could not evaluate item {}: {reason}",
                    result.worker, result.item
                ));
            }
        }
        Ok(())
    }

    /// Pool size, lag and items no worker could finish: every few seconds.
    fn refresh(&mut self) {
        if self.checked.elapsed() < Duration::from_secs(2) {
            return;
        }
        self.checked = Instant::now();
        let pool = self.pool;
        if let Ok(Ok(names)) = pool.block_on(async {
            tokio::time::timeout(Duration::from_secs(2), pool.live_workers()).await
        }) {
            for gone in self.known_workers.difference(&names) {
                tracing::warn!(search = %self.id, worker = %gone, "a worker left the pool (its heartbeat stopped): an item it held goes to another worker after the ack wait");
            }
            self.workers = names.len();
            self.known_workers = names;
            pool.metrics.workers.set(self.workers as i64);
        }
        self.check_exhausted();
        if self.carrying || !self.holding {
            self.check_ended();
        }
        self.update_status();
    }

    /// Whether the search ended in the pool while this daemon followed it.
    fn check_ended(&mut self) {
        if let Some(s) = self.pool.ended(&self.id) {
            let why = s.reason.map_or(String::new(), |r| format!(": {r}"));
            self.ended_elsewhere = Some(format!(
                "the search ended in the pool ({:?}, by {}){why}",
                s.phase, s.coordinator
            ));
        }
    }

    /// An item of this search delivered `max_deliveries` times without an answer (the
    /// workers that took it died on it) fails the search: it would never be answered.
    fn check_exhausted(&mut self) {
        use futures_util::FutureExt;
        let Some(sub) = self.exhausted.as_mut() else {
            return;
        };
        let mut sequences = Vec::new();
        while let Some(Some(m)) = sub.next().now_or_never() {
            #[derive(serde::Deserialize)]
            struct Advisory {
                stream_seq: u64,
                deliveries: u64,
            }
            match serde_json::from_slice::<Advisory>(&m.payload) {
                Ok(a) => sequences.push((a.stream_seq, a.deliveries)),
                Err(e) => {
                    tracing::warn!(error = %e, payload = %String::from_utf8_lossy(&m.payload), "a max-deliveries advisory not understood")
                }
            }
        }
        for (seq, deliveries) in sequences {
            let pool = self.pool;
            let msg = match pool.block_on(async {
                tokio::time::timeout(Duration::from_secs(2), pool.items.get_raw_message(seq)).await
            }) {
                Ok(Ok(msg)) => msg,
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, seq, "cannot read an item no worker finished");
                    continue;
                }
                Err(_) => continue,
            };
            if let Ok(item) = serde_json::from_slice::<Item>(&msg.payload)
                && item.search == self.id
                && !self.answered.contains(&item.item)
            {
                self.failure = Some(format!(
                    "item {} (candidates {}…) was delivered {deliveries} times and no worker finished it (each died or was stopped while evaluating it)",
                    item.item,
                    item.candidates.first().map_or(0, |c| c.index)
                ));
            }
        }
    }

    fn update_status(&self) {
        let outstanding = (0..self.state.items_published)
            .filter(|i| !self.answered.contains(i))
            .filter(|&i| !self.journaled_item(i))
            .count();
        self.pool.metrics.items_outstanding.set(outstanding as i64);
        if let Ok(mut s) = self.status.lock() {
            s.search.clone_from(&self.id);
            s.carried_by.clone_from(&self.state.carried_by);
            s.workers = self.workers;
            s.items_total = self.items.len();
            s.items_published = self.state.items_published;
            s.items_answered = self.answered.len();
            s.items_outstanding = outstanding;
        }
    }

    /// Ends the search in the pool and frees its lease. The coordinator's search done,
    /// cancelled or failed: the state says so (workers stop) and its items and answers are
    /// purged; interrupted: left as it is. A carried search walked to its end: recorded as
    /// walked, its answers left for the coordinator.
    pub fn finish(mut self, ending: Ending) {
        let speculative = match self.walked {
            Some(w) if ending == Ending::Done => self.state.items_published.saturating_sub(w + 1),
            _ => 0,
        };
        if speculative > 0 {
            self.pool
                .metrics
                .items_speculative
                .inc_by(speculative as u64);
        }
        if let Ok(mut s) = self.status.lock() {
            s.items_speculative = speculative;
        }
        // A last look at the pool: a worker lost near the end is said too.
        self.checked = Instant::now() - Duration::from_secs(60);
        self.refresh();
        if self.carrying {
            self.finish_carrying(&ending);
        } else {
            self.finish_coordinating(ending);
        }
        // Freed, so that another may take the search on at once (a shutdown) or the
        // coordinator take it back (a carried search's end).
        if let Some(lease) = self.lease.take() {
            lease.release(self.pool);
        }
    }

    /// A carried search's end: walked to its end, its answers are left for the
    /// coordinator (recorded as walked: nobody carries it on again); failed by a worker's
    /// answer, it is failed in the pool (the workers stop); else left as it is, for the
    /// coordinator or another daemon to go on with.
    fn finish_carrying(&mut self, ending: &Ending) {
        let record = match ending {
            Ending::Done => {
                self.state.walked = true;
                tracing::info!(search = %self.id, coordinator = %self.state.coordinator, "carried the search to its end: its answers wait in the pool for its coordinator");
                true
            }
            Ending::Failed(reason) if self.ended_elsewhere.is_none() => {
                self.state.phase = Phase::Failed;
                self.state.reason = Some(reason.clone());
                true
            }
            _ => false,
        };
        if record && self.holds() {
            let deadline = Instant::now() + Duration::from_secs(30);
            let stop = || Instant::now() > deadline;
            let pool = self.pool;
            let _ = pool.retry("recording the carried search", &stop, || {
                pool.put_state(&self.id, &self.state)
            });
        }
    }

    /// The coordinator's end of the search: done, cancelled or failed, the state says so
    /// (workers stop) and its items and answers are purged; interrupted, or ended already
    /// by another daemon, it is left as it is.
    fn finish_coordinating(&mut self, ending: Ending) {
        if self.ended_elsewhere.is_some() {
            return;
        }
        let phase = match &ending {
            Ending::Interrupted => return,
            Ending::Done => Phase::Done,
            Ending::Cancelled => Phase::Cancelled,
            Ending::Failed(reason) => {
                self.state.reason = Some(reason.clone());
                Phase::Failed
            }
        };
        self.state.phase = phase;
        // Once: the search is over, so its own cancel flag may be set; a few tries at most.
        let deadline = Instant::now() + Duration::from_secs(30);
        let stop = || Instant::now() > deadline;
        let pool = self.pool;
        let _ = pool.retry("recording the end of the search", &stop, || {
            pool.put_state(&self.id, &self.state)
        });
        let items = items_subject(&self.id);
        let _ = pool.retry("purging the search's items", &stop, || {
            super::purge(&pool.items, items.clone())
        });
        let results = results_subject(&self.id);
        let _ = pool.retry("purging the search's answers", &stop, || {
            super::purge(&pool.results, results.clone())
        });
        tracing::debug!(search = %self.id, ?phase, "search ended in the pool");
    }
}

fn cancelled() -> PoolError {
    PoolError::Cancelled
}

impl Supplier for Coordinator<'_> {
    fn supply(
        &mut self,
        index: usize,
        _candidate: &Candidate,
    ) -> Result<Option<Evaluated>, SearchError> {
        let Some(pos) = self.position(index) else {
            // Not in the order the walk gave: evaluated by the walk itself.
            return Ok(None);
        };
        let item = self.item_of(pos);
        self.walked = Some(item);
        // Answers of candidates the walk has passed are not needed any more.
        while let Some((&k, _)) = self.evaluations.first_key_value() {
            if k >= pos {
                break;
            }
            self.evaluations.pop_first();
        }
        self.refresh();
        self.keep_ahead(item)?;
        loop {
            if let Some(e) = self.evaluations.remove(&pos) {
                return Ok(Some(e));
            }
            if let Some(f) = self.failure.as_ref().or(self.ended_elsewhere.as_ref()) {
                return Err(SearchError::Supplier(f.clone()));
            }
            if self.stopped() {
                return Err(SearchError::Supplier("cancelled".into()));
            }
            self.receive(Duration::from_millis(250))?;
            self.refresh();
            // Keep the look-ahead as workers join.
            self.keep_ahead(item)?;
        }
    }

    /// Cuts the items from the walk's order (runs of `item_candidates` positions) and
    /// records the search with them.
    fn follow(&mut self, order: &[usize]) -> Result<(), SearchError> {
        let mut positions = vec![usize::MAX; self.space.candidates.len()];
        for (p, &k) in order.iter().enumerate() {
            if let Some(slot) = positions.get_mut(k) {
                *slot = p;
            }
        }
        let per_item = self.pool.settings.item_candidates.max(1);
        self.items = (0..order.len())
            .step_by(per_item)
            .map(|from| from..(from + per_item).min(order.len()))
            .collect();
        self.order = Some((order.to_vec(), positions));
        self.take_up()
            .map_err(|e| SearchError::Supplier(e.to_string()))
    }

    /// The pool publishes the walk's order ahead of it, in items.
    fn needs_order(&self) -> bool {
        true
    }

    fn stop_at(&mut self, end: usize) {
        self.end = self.end.min(end);
    }

    fn work(&self) -> Stats {
        self.work.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use archplace_engine::space::Space;

    fn space(buckets: &[u64]) -> Space {
        Space {
            candidates: buckets
                .iter()
                .map(|&bucket| Candidate {
                    config: archplace_engine::space::REFERENCE_CONFIG,
                    area_um2: bucket as f64,
                    bucket,
                })
                .collect(),
            budget_um2: 0.0,
            min_area_um2: 0.0,
            tensor_core_configs: Vec::new(),
            vector_core_configs: Vec::new(),
            buckets: 0,
            bucket_um2: 1.0,
            out_of_domain: 0,
            max_priced_um2: 0.0,
            enumerated: 0,
        }
    }

    /// Items cover the candidates in order, never span two buckets, and hold at most
    /// `per_item` candidates.
    #[test]
    fn items_cut_each_bucket_in_order() {
        let s = space(&[9, 9, 9, 9, 9, 7, 5, 5, 5]);
        assert_eq!(items_of(&s, 2), vec![0..2, 2..4, 4..5, 5..6, 6..8, 8..9]);
        assert_eq!(items_of(&s, 64), vec![0..5, 5..6, 6..9]);
        assert_eq!(items_of(&s, 0), items_of(&s, 1));
        assert!(items_of(&space(&[]), 4).is_empty());
    }
}
