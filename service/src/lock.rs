//! The service's locks, checked: a thread holds at most one of them at a time.
//!
//! One lock at a time means no lock order to keep and no deadlock to find: every function
//! takes a lock, does its small work and lets go before it takes another or calls
//! anything that might. The rule is kept by the type, not by review alone: every mutex of
//! the service is a [`Lock`], and taking one while the same thread holds another panics in
//! debug builds (the daemon's end-to-end tests run them) and is logged as an error in
//! release builds.

// The one place the service's mutexes are made (service/clippy.toml forbids them elsewhere).
#![allow(clippy::disallowed_types)]

use std::cell::Cell;
use std::ops::{Deref, DerefMut};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

thread_local! {
    /// The lock this thread holds, by name.
    static HELD: Cell<Option<&'static str>> = const { Cell::new(None) };
}

/// That this thread holds the lock `name`, from [`Held::enter`] to its drop.
struct Held;

impl Held {
    fn enter(name: &'static str) -> Held {
        HELD.with(|h| {
            if let Some(other) = h.get() {
                let message =
                    format!("lock `{name}` taken while this thread holds `{other}`: one at a time");
                if cfg!(debug_assertions) {
                    panic!("{message}");
                }
                tracing::error!("{message}");
            }
            h.set(Some(name));
        });
        Held
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        HELD.with(|h| h.set(None));
    }
}

/// A mutex of the service, named for the message of a broken rule.
pub struct Lock<T> {
    name: &'static str,
    mutex: Mutex<T>,
}

/// A held [`Lock`].
pub struct Guard<'a, T> {
    guard: MutexGuard<'a, T>,
    // Dropped after `guard`: fields drop in declaration order.
    _held: Held,
}

impl<T> Lock<T> {
    pub fn new(name: &'static str, value: T) -> Self {
        Lock {
            name,
            mutex: Mutex::new(value),
        }
    }

    /// Takes the lock. A thread that panicked while holding it cannot have left its data
    /// half-changed in a way that matters more than stopping the daemon would, so a
    /// poisoned lock is taken over rather than propagated.
    pub fn lock(&self) -> Guard<'_, T> {
        let held = Held::enter(self.name);
        Guard {
            guard: self.mutex.lock().unwrap_or_else(PoisonError::into_inner),
            _held: held,
        }
    }

    /// Waits on `condvar` for at most `timeout`, the lock let go meanwhile.
    pub fn wait<'a>(
        &'a self,
        condvar: &Condvar,
        guard: Guard<'a, T>,
        timeout: Duration,
    ) -> Guard<'a, T> {
        let Guard { guard, _held } = guard;
        drop(_held);
        let guard = match condvar.wait_timeout(guard, timeout) {
            Ok((g, _)) => g,
            Err(p) => p.into_inner().0,
        };
        Guard {
            guard,
            _held: Held::enter(self.name),
        }
    }
}

impl<T> Deref for Guard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> DerefMut for Guard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_lock_at_a_time_is_fine() {
        let a = Lock::new("a", 1);
        let b = Lock::new("b", 2);
        let x = *a.lock();
        let y = *b.lock();
        assert_eq!(x + y, 3);
        let cv = Condvar::new();
        let g = a.lock();
        let g = a.wait(&cv, g, Duration::from_millis(1));
        drop(g);
        assert_eq!(*b.lock(), 2, "waiting let the lock go and took it back");
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "lock `b` taken while this thread holds `a`")]
    fn a_second_lock_while_holding_one_panics_in_debug_builds() {
        let a = Lock::new("a", ());
        let b = Lock::new("b", ());
        let _g = a.lock();
        let _h = b.lock();
    }
}
