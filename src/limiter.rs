//! Backpressure: a concurrency cap with a bounded waiting line.
//!
//! A [`Limiter`] admits at most `max_running` calls at once and lets at most `max_waiting` more
//! wait for a place; a call that finds the waiting line full is refused at once (answered
//! `overloaded`, nothing runs) instead of piling up. The engine has one global limiter and each
//! tool may have its own (`ToolPolicy::max_concurrency`); a call holds a place in both while it
//! runs. Waiting ends early when the call is cancelled.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};
use tokio_util::sync::CancellationToken;

/// Why a place was not granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The waiting line is full.
    Overloaded,
    /// The call was cancelled while waiting.
    Cancelled,
    /// The limiter was closed (engine shut down).
    Closed,
}

/// A concurrency cap plus a bounded waiting line.
#[derive(Debug)]
pub struct Limiter {
    running: Arc<Semaphore>,
    waiting: AtomicUsize,
    max_waiting: usize,
}

impl Limiter {
    /// At most `max_running` at once, at most `max_waiting` waiting.
    pub fn new(max_running: usize, max_waiting: usize) -> Self {
        Limiter {
            running: Arc::new(Semaphore::new(max_running.max(1))),
            waiting: AtomicUsize::new(0),
            max_waiting,
        }
    }

    /// Takes a place, waiting in line if needed.
    pub async fn acquire(
        &self,
        cancel: &CancellationToken,
    ) -> Result<OwnedSemaphorePermit, Refusal> {
        match Arc::clone(&self.running).try_acquire_owned() {
            Ok(permit) => return Ok(permit),
            Err(TryAcquireError::Closed) => return Err(Refusal::Closed),
            Err(TryAcquireError::NoPermits) => {}
        }
        if self.waiting.fetch_add(1, Ordering::AcqRel) >= self.max_waiting {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            return Err(Refusal::Overloaded);
        }
        // Leaves the line however the wait ends, also when this future is dropped mid-wait.
        let _in_line = InLine(&self.waiting);
        tokio::select! {
            biased;
            _ = cancel.cancelled() => Err(Refusal::Cancelled),
            permit = Arc::clone(&self.running).acquire_owned() => permit.map_err(|_| Refusal::Closed),
        }
    }

    /// Calls waiting for a place now.
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }

    /// Places free now.
    #[cfg(test)]
    pub(crate) fn available(&self) -> usize {
        self.running.available_permits()
    }

    /// Refuses every later request and wakes the waiting ones with [`Refusal::Closed`].
    pub fn close(&self) {
        self.running.close();
    }
}

/// One place in the waiting line, given back on drop.
struct InLine<'a>(&'a AtomicUsize);

impl Drop for InLine<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_full_waiting_line_refuses_at_once() {
        let limiter = Arc::new(Limiter::new(1, 1));
        let cancel = CancellationToken::new();
        let held = limiter.acquire(&cancel).await.unwrap();
        let waiter = {
            let limiter = Arc::clone(&limiter);
            let cancel = cancel.clone();
            tokio::spawn(async move { limiter.acquire(&cancel).await.map(drop) })
        };
        while limiter.waiting() == 0 {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            limiter.acquire(&cancel).await.err(),
            Some(Refusal::Overloaded)
        );
        drop(held);
        assert_eq!(waiter.await.unwrap(), Ok(()));
        assert_eq!(limiter.waiting(), 0);
    }

    #[tokio::test]
    async fn a_wait_dropped_midway_gives_its_place_back() {
        let limiter = Limiter::new(1, 1);
        let cancel = CancellationToken::new();
        let _held = limiter.acquire(&cancel).await.unwrap();
        let dropped = tokio::time::timeout(
            std::time::Duration::from_millis(10),
            limiter.acquire(&cancel),
        )
        .await;
        assert!(dropped.is_err());
        assert_eq!(limiter.waiting(), 0);
    }

    #[tokio::test]
    async fn cancellation_ends_the_wait() {
        let limiter = Limiter::new(1, 10);
        let cancel = CancellationToken::new();
        let _held = limiter.acquire(&cancel).await.unwrap();
        cancel.cancel();
        assert_eq!(
            limiter.acquire(&cancel).await.err(),
            Some(Refusal::Cancelled)
        );
        assert_eq!(limiter.waiting(), 0);
    }
}
