//! The wasmtime store of one plugin instance: its data (WASI on an empty context, the
//! capped stderr and log), the memory limiter, the per-call fuel and deadline, and what a
//! failed call was (fault classification).

use crate::bindings::{self, Level, Plugin};
use crate::{Fault, FaultKind, Limits};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use wasmtime::component::ResourceTable;
use wasmtime::{ResourceLimiter, Store, UpdateDeadline};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

/// Bytes of a plugin's stderr kept (it is only read after a trap).
pub const STDERR_BYTES: usize = 8 << 10;

/// Longest log line kept (longer ones are cut).
pub const MAX_LOG_BYTES: usize = 1024;
/// Log lines a plugin instance may write in a burst, and per second after it.
pub const LOG_BURST: f64 = 20.0;
pub const LOG_PER_SECOND: f64 = 5.0;

/// Why the epoch callback stopped a call.
#[derive(Debug, thiserror::Error)]
enum Interrupt {
    #[error("ran past its deadline of {0:?}")]
    Deadline(Duration),
    #[error("stopped: the search was cancelled")]
    Cancelled,
}

/// Store data of one instance.
pub struct State {
    wasi: WasiCtx,
    /// The guest's stderr, kept in memory (capped) so that a panic's message can be shown.
    stderr: MemoryOutputPipe,
    table: ResourceTable,
    limiter: Limiter,
    log: LogBucket,
    plugin: String,
    /// Stops a running call: the search was cancelled, or its session reached its fault
    /// limit (the calls in flight are not counted as more faults).
    stops: [Arc<AtomicBool>; 2],
    call_started: Instant,
    deadline: Duration,
}

impl WasiView for State {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// The shared types interface has no functions to implement.
impl bindings::archplace::cost_model::types::Host for State {}

impl bindings::archplace::cost_model::host::Host for State {
    fn log(&mut self, level: Level, message: String) {
        self.log.emit(&self.plugin, level, message);
    }
}

/// Caps a plugin's memory; remembers a refusal so the trap that follows is reported as
/// what it is.
struct Limiter {
    memory_bytes: usize,
    total_bytes: usize,
    refused: Option<usize>,
}

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let total = self
            .total_bytes
            .saturating_sub(current)
            .saturating_add(desired);
        if total > self.memory_bytes {
            self.refused = Some(total);
            return Ok(false);
        }
        self.total_bytes = total;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 1 << 16)
    }

    fn instances(&self) -> usize {
        64
    }
    fn tables(&self) -> usize {
        64
    }
    fn memories(&self) -> usize {
        16
    }
}

/// Cuts `text` to at most `max` bytes (on a character boundary), marking the cut.
fn cut_text(text: &mut String, max: usize) {
    if text.len() > max {
        let mut cut = max;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str(" […]");
    }
}

/// Token bucket for a plugin's log lines.
pub(crate) struct LogBucket {
    tokens: f64,
    last: Instant,
    dropped: u64,
}

impl LogBucket {
    pub(crate) fn new() -> Self {
        LogBucket {
            tokens: LOG_BURST,
            last: Instant::now(),
            dropped: 0,
        }
    }

    /// Lines dropped since the last one written.
    #[cfg(test)]
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped
    }

    pub(crate) fn emit(&mut self, plugin: &str, level: Level, mut message: String) {
        let now = Instant::now();
        self.tokens =
            (self.tokens + (now - self.last).as_secs_f64() * LOG_PER_SECOND).min(LOG_BURST);
        self.last = now;
        if self.tokens < 1.0 {
            self.dropped += 1;
            return;
        }
        self.tokens -= 1.0;
        cut_text(&mut message, MAX_LOG_BYTES);
        let dropped = std::mem::take(&mut self.dropped);
        match level {
            Level::Error => tracing::error!(plugin, dropped, "{message}"),
            Level::Warn => tracing::warn!(plugin, dropped, "{message}"),
            Level::Info => tracing::info!(plugin, dropped, "{message}"),
            Level::Debug => tracing::debug!(plugin, dropped, "{message}"),
        }
    }
}

pub(crate) struct Slot {
    pub(crate) store: Store<State>,
    pub(crate) model: Plugin,
}

pub(crate) fn new_store(
    engine: &wasmtime::Engine,
    limits: &Limits,
    plugin: &str,
    stops: [Arc<AtomicBool>; 2],
) -> Store<State> {
    let stderr = MemoryOutputPipe::new(STDERR_BYTES);
    let state = State {
        // No preopened folders, no environment, no arguments, no sockets, stdin and stdout
        // closed; stderr goes to a small in-memory buffer.
        wasi: WasiCtxBuilder::new()
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .stderr(stderr.clone())
            .build(),
        stderr,
        table: ResourceTable::new(),
        limiter: Limiter {
            memory_bytes: usize::try_from(limits.memory_bytes).unwrap_or(usize::MAX),
            total_bytes: 0,
            refused: None,
        },
        log: LogBucket::new(),
        plugin: plugin.to_string(),
        stops,
        call_started: Instant::now(),
        deadline: limits.deadline(),
    };
    let mut store = Store::new(engine, state);
    store.limiter(|s| &mut s.limiter);
    store.epoch_deadline_callback(|ctx| {
        let s = ctx.data();
        if s.stops.iter().any(|f| f.load(Ordering::Relaxed)) {
            return Err(wasmtime::Error::new(Interrupt::Cancelled));
        }
        if s.call_started.elapsed() > s.deadline {
            return Err(wasmtime::Error::new(Interrupt::Deadline(s.deadline)));
        }
        Ok(UpdateDeadline::Continue(1))
    });
    store
}

/// Arms the limits for a call over `items` configurations or operators.
pub(crate) fn arm(store: &mut Store<State>, limits: &Limits, items: usize) {
    // Fuel is always enabled on our engine; setting it cannot fail then.
    let _ = store.set_fuel(limits.fuel_budget(items));
    store.set_epoch_deadline(1);
    store.data_mut().call_started = Instant::now();
}

/// What a failed call was.
pub(crate) fn classify(err: &wasmtime::Error, state: &State, limits: &Limits) -> Fault {
    if let Some(i) = err.downcast_ref::<Interrupt>() {
        return Fault {
            kind: match i {
                Interrupt::Deadline(_) => FaultKind::Deadline,
                Interrupt::Cancelled => FaultKind::Cancelled,
            },
            message: i.to_string(),
        };
    }
    if let Some(asked) = state.limiter.refused {
        return Fault {
            kind: FaultKind::Memory,
            message: format!(
                "exceeded its memory limit of {} (it asked for {})",
                archplace_plugin_sdk::units::format_bytes(limits.memory_bytes),
                archplace_plugin_sdk::units::format_bytes(asked as u64)
            ),
        };
    }
    if let Some(trap) = err.downcast_ref::<wasmtime::Trap>()
        && *trap == wasmtime::Trap::OutOfFuel
    {
        return Fault {
            kind: FaultKind::Fuel,
            message: "ran out of fuel (its instruction budget for this call); an endless loop?"
                .into(),
        };
    }
    // The trap itself, and what the guest printed before it (a Rust panic's message).
    tracing::debug!(plugin = %state.plugin, "plugin trap: {err:?}");
    let cause = err.root_cause().to_string();
    let printed = String::from_utf8_lossy(&state.stderr.contents()).into_owned();
    let printed: Vec<&str> = printed
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("note: run with `RUST_BACKTRACE"))
        .collect();
    let mut message = format!("trapped ({cause})");
    if !printed.is_empty() {
        let mut text = printed.join(" ");
        cut_text(&mut text, MAX_LOG_BYTES);
        message.push_str(&format!(" after printing: {text}"));
    }
    Fault {
        kind: FaultKind::Trap,
        message,
    }
}
