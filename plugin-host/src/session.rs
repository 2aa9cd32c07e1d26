//! One plugin with one set of parameters for one search: a pool of instances, each call
//! run under the limits, every answer checked, faults counted.

use super::{Fault, FaultKind, Limits, Loaded, PluginError};
use crate::bindings::{self, Plugin, wit};
use crate::inspect::{
    MAX_PARAMETERS, MAX_TEXT_BYTES, bad_output, check_cost, check_error_size, check_memory,
};
use crate::memo::Memo;
use crate::store::{Slot, State, arm, classify, new_store};
use archplace_plugin_sdk::{
    AcceleratorConfig, AreaModel, CoreConfig, ElementType, EstimateError, LatencyModel, ModelInfo,
    Op, OpCost, OpKind, Parameter, ParameterError,
};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;
use wasmtime::Store;

/// Configurations per `area` call. The guest holds a call's arguments and answers in its
/// own memory (tens of bytes each, plus what the plugin builds), so one call for a whole
/// space of millions of chips ran into the plugin's memory cap at search time, on a spec the
/// validator had accepted, and was counted as the plugin's fault. Batches keep a
/// call's memory independent of the space and its fuel proportional to it.
pub const AREA_BATCH: usize = 4096;

/// Counters of one session (for `plugin check`, benchmarks and metrics).
#[derive(Debug, Default)]
pub struct Counters {
    pub calls: AtomicU64,
    pub items: AtomicU64,
    pub call_nanos: AtomicU64,
    pub memo_hits: AtomicU64,
    pub fuel: AtomicU64,
}

struct Pool {
    idle: Vec<Slot>,
    live: usize,
}

/// One plugin, one parameter set, one search. Implements the SDK's model traits.
pub struct Session {
    loaded: Arc<Loaded>,
    parameters: Vec<Parameter>,
    limits: Limits,
    cancel: Arc<AtomicBool>,
    pool: Mutex<Pool>,
    freed: Condvar,
    /// Faults counted in this search: never more than `limits.max_faults`.
    faults: AtomicU32,
    /// Set when `faults` reaches the limit: no call starts after it, and the calls in
    /// flight are stopped (not counted).
    halted: Arc<AtomicBool>,
    fault_log: Mutex<Vec<Fault>>,
    memo: Option<Arc<Memo>>,
    telemetry: Option<Arc<dyn super::Telemetry>>,
    /// What the tensor cores multiply, as configured: asked once when the session opens
    /// (interface 1.2's `tensor-element-types`; before 1.2, [`ElementType::UNTYPED`]).
    tensor_types: Vec<ElementType>,
    /// Interface 1.3's calibratable parameters as configured (empty before 1.3).
    configured: Vec<(String, f64)>,
    /// Calls, items and faults so far.
    pub counters: Counters,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("plugin", &self.loaded.info.name)
            .finish()
    }
}

impl Session {
    /// Opens a session and configures its first instance, so bad parameters are reported
    /// now, before any search.
    pub fn open(
        loaded: Arc<Loaded>,
        parameters: Vec<Parameter>,
        limits: Limits,
        cancel: Arc<AtomicBool>,
        memo: Option<Arc<Memo>>,
        telemetry: Option<Arc<dyn super::Telemetry>>,
    ) -> Result<Arc<Session>, PluginError> {
        let mut s = Session {
            loaded,
            parameters,
            limits,
            cancel,
            pool: Mutex::new(Pool {
                idle: Vec::new(),
                live: 0,
            }),
            freed: Condvar::new(),
            faults: AtomicU32::new(0),
            halted: Arc::new(AtomicBool::new(false)),
            fault_log: Mutex::new(Vec::new()),
            memo,
            telemetry,
            tensor_types: ElementType::UNTYPED.to_vec(),
            configured: Vec::new(),
            counters: Counters::default(),
        };
        let slot = s.instantiate().map_err(|e| match e {
            Ok(errors) => PluginError::Parameters {
                plugin: s.loaded.info.name.clone(),
                errors,
            },
            Err(fault) => PluginError::Fault {
                plugin: s.loaded.info.name.clone(),
                during: "starting (configure)".into(),
                fault,
            },
        })?;
        if let Ok(mut p) = s.pool.lock() {
            p.live = 1;
            p.idle.push(slot);
        }
        if s.loaded.pre.has_typed() {
            s.tensor_types = s
                .ask_tensor_types()
                .map_err(|e| s.opening_fault("listing its tensor element types", e))?;
        }
        if s.loaded.pre.has_calibration() {
            s.configured = s
                .ask_configured()
                .map_err(|e| s.opening_fault("listing its configured parameter values", e))?;
        }
        Ok(Arc::new(s))
    }

    /// A wrong answer to what the session asks once, at opening: the plugin's fault.
    fn opening_fault(&self, during: &str, e: EstimateError) -> PluginError {
        PluginError::Fault {
            plugin: self.loaded.info.name.clone(),
            during: during.into(),
            fault: Fault {
                kind: FaultKind::BadOutput,
                message: e.to_string(),
            },
        }
    }

    /// Interface 1.3's `configured`: a finite value for each calibratable parameter,
    /// those it declares only, in its declared order.
    fn ask_configured(&self) -> Result<Vec<(String, f64)>, EstimateError> {
        let declared = &self.loaded.info.calibratable;
        let listed = self.call(
            "configured",
            1,
            |store, plugin| match &plugin.calibration {
                Some(c) => c.call_configured(store),
                None => Err(wasmtime::format_err!(
                    "the plugin has no `calibration` interface"
                )),
            },
            |values| {
                if values.len() > MAX_PARAMETERS {
                    return Err(bad_output(format!("{} values listed", values.len())));
                }
                for v in values {
                    if !v.value.is_finite() || !declared.iter().any(|c| c.name == v.name) {
                        return Err(bad_output(format!(
                            "configured value of `{}` is not finite or not a calibratable parameter",
                            v.name.chars().take(64).collect::<String>()
                        )));
                    }
                }
                Ok(())
            },
        )?;
        Ok(declared
            .iter()
            .filter_map(|c| {
                listed
                    .iter()
                    .find(|v| v.name == c.name)
                    .map(|v| (c.name.clone(), v.value))
            })
            .collect())
    }

    /// Interface 1.2's `tensor-element-types`, each type once, in the SDK's order.
    fn ask_tensor_types(&self) -> Result<Vec<ElementType>, EstimateError> {
        let listed = self.call(
            "tensor-element-types",
            1,
            |store, plugin| match &plugin.typed {
                Some(t) => t.call_tensor_element_types(store),
                None => Err(wasmtime::format_err!("the plugin has no `typed` interface")),
            },
            |types| {
                if types.len() > 64 {
                    return Err(bad_output(format!(
                        "{} tensor element types listed",
                        types.len()
                    )));
                }
                Ok(())
            },
        )?;
        let listed: Vec<ElementType> = listed.into_iter().map(bindings::element_from_wit).collect();
        Ok(ElementType::ALL
            .into_iter()
            .filter(|e| listed.contains(e))
            .collect())
    }

    /// The component this session runs.
    pub fn loaded(&self) -> &Arc<Loaded> {
        &self.loaded
    }

    /// The limits of its calls.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Faults so far, oldest first.
    pub fn faults(&self) -> Vec<Fault> {
        self.fault_log.lock().map(|f| f.clone()).unwrap_or_default()
    }

    /// A fresh, configured instance. `Err(Ok(_))`: the plugin rejects the parameters.
    fn instantiate(&self) -> Result<Slot, Result<Vec<ParameterError>, Fault>> {
        let name = &self.loaded.info.name;
        let stops = [self.cancel.clone(), self.halted.clone()];
        let mut store = new_store(&self.loaded.engine, &self.limits, name, stops);
        arm(&mut store, &self.limits, self.parameters.len() + 1);
        let model = self
            .loaded
            .pre
            .instantiate(&mut store)
            .map_err(|e| Err(classify(&e, store.data(), &self.limits)))?;
        let params = bindings::parameters_to_wit(&self.parameters);
        match model.model.call_configure(&mut store, &params) {
            Ok(Ok(())) => Ok(Slot { store, model }),
            Ok(Err(errors)) => {
                if errors.len() > MAX_PARAMETERS
                    || errors
                        .iter()
                        .any(|e| e.name.len() > 256 || e.message.len() > MAX_TEXT_BYTES)
                {
                    return Err(Err(bad_output(
                        "returned oversized parameter errors".into(),
                    )));
                }
                Err(Ok(errors
                    .into_iter()
                    .map(|e| ParameterError::new(e.name, e.message))
                    .collect()))
            }
            Err(e) => Err(Err(classify(&e, store.data(), &self.limits))),
        }
    }

    fn take(&self) -> Result<Slot, Fault> {
        let mut pool = self
            .pool
            .lock()
            .map_err(|_| bad_output("instance pool poisoned".into()))?;
        loop {
            if let Some(s) = pool.idle.pop() {
                return Ok(s);
            }
            if pool.live < self.limits.max_instances.max(1) {
                pool.live += 1;
                drop(pool);
                return self.instantiate().map_err(|e| {
                    if let Ok(mut p) = self.pool.lock() {
                        p.live -= 1;
                    }
                    self.freed.notify_one();
                    match e {
                        Ok(errors) => bad_output(format!(
                            "a fresh instance rejected the parameters the first accepted: {}",
                            errors
                                .iter()
                                .map(|e| e.to_string())
                                .collect::<Vec<_>>()
                                .join("; ")
                        )),
                        Err(f) => f,
                    }
                });
            }
            pool = self
                .freed
                .wait(pool)
                .map_err(|_| bad_output("instance pool poisoned".into()))?;
        }
    }

    fn give_back(&self, slot: Slot) {
        if let Ok(mut p) = self.pool.lock() {
            p.idle.push(slot);
        }
        self.freed.notify_one();
    }

    fn discard(&self) {
        if let Ok(mut p) = self.pool.lock() {
            p.live -= 1;
        }
        self.freed.notify_one();
    }

    /// Runs `f` on an instance under the limits, checks its answer with `check`, and
    /// handles faults: the instance is dropped (if it trapped), the fault recorded, the
    /// call retried on a fresh instance until `max_faults`.
    fn call<R>(
        &self,
        what: &str,
        items: usize,
        f: impl Fn(&mut Store<State>, &Plugin) -> wasmtime::Result<R>,
        check: impl Fn(&R) -> Result<(), Fault>,
    ) -> Result<R, EstimateError> {
        let max = self.limits.max_faults.max(1);
        loop {
            if self.cancel.load(Ordering::Relaxed) {
                return Err(self.to_error(&Fault {
                    kind: FaultKind::Cancelled,
                    message: "stopped: the search was cancelled".into(),
                }));
            }
            if self.halted.load(Ordering::Relaxed) {
                return Err(self.limit_reached(what));
            }
            let fault = match self.take() {
                Err(fault) => fault,
                Ok(mut slot) => {
                    arm(&mut slot.store, &self.limits, items);
                    let t = Instant::now();
                    let r = f(&mut slot.store, &slot.model);
                    let nanos = t.elapsed().as_nanos() as u64;
                    self.counters.calls.fetch_add(1, Ordering::Relaxed);
                    self.counters
                        .items
                        .fetch_add(items as u64, Ordering::Relaxed);
                    self.counters.call_nanos.fetch_add(nanos, Ordering::Relaxed);
                    if let Some(t) = &self.telemetry {
                        t.call(&self.loaded.info.name, nanos as f64 * 1e-9, items);
                    }
                    match r {
                        Ok(v) => {
                            let budget = self.limits.fuel_budget(items);
                            let left = slot.store.get_fuel().unwrap_or(0);
                            self.counters
                                .fuel
                                .fetch_add(budget.saturating_sub(left), Ordering::Relaxed);
                            match check(&v) {
                                Ok(()) => {
                                    self.give_back(slot);
                                    return Ok(v);
                                }
                                Err(fault) => {
                                    self.give_back(slot);
                                    fault
                                }
                            }
                        }
                        Err(e) => {
                            let fault = classify(&e, slot.store.data(), &self.limits);
                            drop(slot);
                            self.discard();
                            fault
                        }
                    }
                }
            };
            if fault.kind == FaultKind::Cancelled {
                if self.halted.load(Ordering::Relaxed) {
                    return Err(self.limit_reached(what));
                }
                return Err(self.to_error(&fault));
            }
            // Counted only below the limit: a call in flight when another reached it
            // faults past the limit, which holds as configured. The count, the log and the
            // halt change under the log's lock, so that a call refused for the limit
            // (`limit_reached`, which reads the log) always finds the fault that reached it.
            let mut log = self
                .fault_log
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let Ok(before) = self
                .faults
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                    (n < max).then_some(n + 1)
                })
            else {
                drop(log);
                return Err(self.limit_reached(what));
            };
            let n = before + 1;
            log.push(fault.clone());
            if n >= max {
                self.halted.store(true, Ordering::SeqCst);
            }
            drop(log);
            if let Some(t) = &self.telemetry {
                t.fault(&self.loaded.info.name, fault.kind);
            }
            tracing::warn!(
                plugin = %self.loaded.info.name,
                kind = fault.kind.name(),
                fault = n,
                of = self.limits.max_faults,
                "plugin fault during {what}: {}",
                fault.message
            );
            if n >= max {
                return Err(self.to_error(&Fault {
                    kind: fault.kind,
                    message: format!(
                        "{} during {what} ({} fault{} in this search, the limit)",
                        fault.message,
                        n,
                        if n == 1 { "" } else { "s" }
                    ),
                }));
            }
        }
    }

    /// The error of a call not made (or stopped) because the search reached the plugin's
    /// fault limit: the last fault counted, as the call that reached the limit reports it,
    /// so that the search fails with the same reason whichever of its calls reports first.
    fn limit_reached(&self, what: &str) -> EstimateError {
        let max = self.limits.max_faults.max(1);
        let last = self
            .fault_log
            .lock()
            .ok()
            .and_then(|log| log.last().cloned());
        let fault = match last {
            Some(f) => Fault {
                kind: f.kind,
                message: format!(
                    "{} ({max} fault{} in this search, the limit)",
                    f.message,
                    if max == 1 { "" } else { "s" }
                ),
            },
            None => Fault {
                kind: FaultKind::Cancelled,
                message: format!(
                    "{what} not run: the fault limit of {max} in this search was reached"
                ),
            },
        };
        self.to_error(&fault)
    }

    fn to_error(&self, fault: &Fault) -> EstimateError {
        EstimateError::Internal(format!(
            "plugin `{}` {} ({} fault): {}",
            self.loaded.info.name,
            self.loaded.info.version,
            fault.kind.name(),
            fault.message
        ))
    }

    fn plugin_error(&self, e: wit::EstimateError) -> EstimateError {
        let prefix = format!("plugin `{}`: ", self.loaded.info.name);
        match bindings::error_from_wit(e) {
            EstimateError::OutOfDomain(m) => EstimateError::OutOfDomain(m),
            EstimateError::Unsupported(m) => EstimateError::Unsupported(prefix + &m),
            EstimateError::Internal(m) => EstimateError::Internal(prefix + &m),
        }
    }

    /// Latency without the memo (benchmarks, `plugin check`): fused attention kernels asked
    /// of `attention-detail` (a plugin of interface 1.0: their unfused operators, one after
    /// another), the other operators of `latency-detail` (1.0: `latency`).
    pub fn latency_uncached(
        &self,
        core: &CoreConfig,
        ops: &[Op],
    ) -> Result<Vec<OpCost>, EstimateError> {
        let is_attention = |op: &Op| matches!(op.kind, OpKind::Attention(_));
        if !ops.iter().any(is_attention) {
            return self.operators(core, ops);
        }
        let (attention, plain): (Vec<usize>, Vec<usize>) =
            (0..ops.len()).partition(|&i| is_attention(&ops[i]));
        let pick = |idx: &[usize]| -> Vec<Op> { idx.iter().map(|&i| ops[i].clone()).collect() };
        let (a_ops, p_ops) = (pick(&attention), pick(&plain));
        let p_costs = self.operators(core, &p_ops)?;
        let a_costs = if self.loaded.pre.has_detail() {
            self.attention(core, &a_ops)?
        } else {
            archplace_plugin_sdk::unfused_attention(&a_ops, |parts| self.operators(core, parts))?
        };
        let mut out = vec![OpCost::new(0.0, 0.0); ops.len()];
        for (i, c) in attention
            .into_iter()
            .zip(a_costs)
            .chain(plain.into_iter().zip(p_costs))
        {
            out[i] = c;
        }
        Ok(out)
    }

    /// `latency-typed` (1.2), `latency-detail` (1.1) or `latency` (1.0) of operators that
    /// are not fused attention. Before 1.2 a plugin cannot be told an element type: a
    /// quantised operator or a cast is refused (the spec's validation refuses FP8 training
    /// with such a plugin before a search starts).
    fn operators(&self, core: &CoreConfig, ops: &[Op]) -> Result<Vec<OpCost>, EstimateError> {
        if ops.is_empty() {
            return Ok(Vec::new());
        }
        if self.loaded.pre.has_typed() {
            return self.typed_operators(core, ops);
        }
        if let Some(op) = ops
            .iter()
            .find(|o| o.element.is_quantised() || matches!(o.kind, OpKind::Cast(_)))
        {
            return Err(EstimateError::Unsupported(format!(
                "plugin `{}` implements interface {}.{}, which cannot be told an operator's element type (interface 1.2 can): {} of {:?}",
                self.loaded.info.name,
                self.loaded.info.interface_version.0,
                self.loaded.info.interface_version.1,
                op.element.name(),
                op.kind
            )));
        }
        let wcore = bindings::core_to_wit(core);
        let wops: Vec<wit::Op> = ops.iter().filter_map(bindings::op_to_wit).collect();
        if wops.len() != ops.len() {
            return Err(EstimateError::Internal(
                "fused attention asked as a plain operator".into(),
            ));
        }
        let n = ops.len();
        // Interface 1.1's `latency-detail` where the plugin has it (one call gives the
        // memory times too), else 1.0's `latency`.
        let r = self.call(
            "latency",
            n,
            |store, plugin| match &plugin.detail {
                Some(t) => t.call_latency_detail(store, wcore, &wops),
                None => plugin.model.call_latency(store, wcore, &wops).map(|r| {
                    r.map(|costs| {
                        costs
                            .into_iter()
                            .map(|c| bindings::detail::OpDetail {
                                seconds: c.seconds,
                                joules: c.joules,
                                memory_seconds: None,
                            })
                            .collect()
                    })
                }),
            },
            |r| check_details(r, n),
        )?;
        self.details(r)
    }

    /// `latency-typed` of operators that are not fused attention (interface 1.2).
    fn typed_operators(&self, core: &CoreConfig, ops: &[Op]) -> Result<Vec<OpCost>, EstimateError> {
        let wcore = bindings::core_to_wit(core);
        let wops: Vec<bindings::typed::TypedOp> =
            ops.iter().filter_map(bindings::typed_op_to_wit).collect();
        if wops.len() != ops.len() {
            return Err(EstimateError::Internal(
                "fused attention asked as a plain operator".into(),
            ));
        }
        let n = ops.len();
        let r = self.call(
            "latency",
            n,
            |store, plugin| match &plugin.typed {
                Some(t) => t.call_latency_typed(store, wcore, &wops),
                None => Err(wasmtime::format_err!("the plugin has no `typed` interface")),
            },
            |r| check_details(r, n),
        )?;
        self.details(r)
    }

    /// `attention-detail` of fused attention kernels (interface 1.1).
    fn attention(&self, core: &CoreConfig, ops: &[Op]) -> Result<Vec<OpCost>, EstimateError> {
        let wcore = bindings::core_to_wit(core);
        let wops: Vec<bindings::detail::Attention> =
            ops.iter().filter_map(bindings::attention_to_wit).collect();
        let n = ops.len();
        if wops.len() != n {
            return Err(EstimateError::Internal(
                "a plain operator asked as fused attention".into(),
            ));
        }
        let r = self.call(
            "attention",
            n,
            |store, plugin| match &plugin.detail {
                Some(t) => t.call_attention_detail(store, wcore, &wops),
                None => Err(wasmtime::format_err!(
                    "the plugin has no `detail` interface"
                )),
            },
            |r| check_details(r, n),
        )?;
        self.details(r)
    }

    /// A checked `op-detail` answer as costs, or the plugin's error.
    fn details(
        &self,
        r: Result<Vec<bindings::detail::OpDetail>, wit::EstimateError>,
    ) -> Result<Vec<OpCost>, EstimateError> {
        match r {
            Ok(costs) => Ok(costs
                .into_iter()
                .map(|c| OpCost {
                    seconds: c.seconds,
                    joules: c.joules,
                    memory_seconds: c.memory_seconds,
                })
                .collect()),
            Err(e) => Err(self.plugin_error(e)),
        }
    }

    /// Areas without the memo, asked [`AREA_BATCH`] configurations at a time.
    pub fn area_uncached(
        &self,
        configs: &[AcceleratorConfig],
    ) -> Result<Vec<Result<f64, EstimateError>>, EstimateError> {
        let mut out = Vec::with_capacity(configs.len());
        for batch in configs.chunks(AREA_BATCH) {
            out.extend(self.area_batch(batch)?);
        }
        Ok(out)
    }

    fn area_batch(
        &self,
        configs: &[AcceleratorConfig],
    ) -> Result<Vec<Result<f64, EstimateError>>, EstimateError> {
        if configs.is_empty() {
            return Ok(Vec::new());
        }
        let wconfigs: Vec<wit::AcceleratorConfig> =
            configs.iter().map(bindings::config_to_wit).collect();
        let n = configs.len();
        let r = self.call(
            "area",
            n,
            |store, plugin| plugin.model.call_area(store, &wconfigs),
            |r| match r {
                Ok(areas) => {
                    if areas.len() != n {
                        return Err(bad_output(format!(
                            "returned {} areas for {n} configurations",
                            areas.len()
                        )));
                    }
                    for (i, a) in areas.iter().enumerate() {
                        match a {
                            Ok(a) if !(a.is_finite() && *a >= 0.0) => {
                                return Err(bad_output(format!(
                                    "returned an area of {a} µm² for configuration {i}: areas must be finite and not negative"
                                )));
                            }
                            Ok(_) => {}
                            Err(e) => check_error_size(e)?,
                        }
                    }
                    Ok(())
                }
                Err(e) => check_error_size(e),
            },
        )?;
        match r {
            Ok(areas) => Ok(areas
                .into_iter()
                .map(|a| a.map_err(|e| self.plugin_error(e)))
                .collect()),
            Err(e) => Err(self.plugin_error(e)),
        }
    }
}

/// An `op-detail` answer is one result per operator, each finite and not negative, its
/// memory time no longer than its time — or an error of a bounded size.
fn check_details(
    r: &Result<Vec<bindings::detail::OpDetail>, wit::EstimateError>,
    n: usize,
) -> Result<(), Fault> {
    match r {
        Ok(costs) => {
            if costs.len() != n {
                return Err(bad_output(format!(
                    "returned {} results for {n} operators",
                    costs.len()
                )));
            }
            for (i, c) in costs.iter().enumerate() {
                check_cost("operator", i, c.seconds, c.joules)?;
                if let Some(m) = c.memory_seconds {
                    check_memory("operator", i, c.seconds, m)?;
                }
            }
            Ok(())
        }
        Err(e) => check_error_size(e),
    }
}

impl AreaModel for Session {
    fn info(&self) -> ModelInfo {
        self.loaded.info.clone()
    }

    fn area_um2(
        &self,
        configs: &[AcceleratorConfig],
    ) -> Result<Vec<Result<f64, EstimateError>>, EstimateError> {
        let Some(memo) = &self.memo else {
            return self.area_uncached(configs);
        };
        crate::memo::memoised(
            &self.counters.memo_hits,
            &memo.area,
            configs.to_vec(),
            |missing| {
                let ask: Vec<AcceleratorConfig> = missing.iter().map(|&i| configs[i]).collect();
                self.area_uncached(&ask)
            },
        )
    }
}

impl LatencyModel for Session {
    fn info(&self) -> ModelInfo {
        self.loaded.info.clone()
    }

    fn tensor_element_types(&self) -> Vec<ElementType> {
        self.tensor_types.clone()
    }

    fn configured(&self) -> Vec<(String, f64)> {
        self.configured.clone()
    }

    fn latency(&self, core: &CoreConfig, ops: &[Op]) -> Result<Vec<OpCost>, EstimateError> {
        let Some(memo) = &self.memo else {
            return self.latency_uncached(core, ops);
        };
        let keys = ops.iter().map(|op| (*core, op.clone())).collect();
        crate::memo::memoised(&self.counters.memo_hits, &memo.latency, keys, |missing| {
            let ask: Vec<Op> = missing.iter().map(|&i| ops[i].clone()).collect();
            self.latency_uncached(core, &ask)
        })
    }
}
