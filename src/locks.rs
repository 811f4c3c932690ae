//! One way to take a `std::sync::Mutex` across the crate: a poisoned lock (a thread panicked
//! while holding it) is taken all the same, since every state these mutexes guard stays valid
//! between statements, and a panic elsewhere must not turn every later request into a panic.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `m`, poisoned or not.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
