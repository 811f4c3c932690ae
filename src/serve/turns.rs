//! Turn ids and turn-addressed cancel: each dispatch names its turn (the client's
//! `Switchboard-Turn-Id` or `turn_id=`, else one the server makes), and
//! `POST /v1/sessions/{id}/turns/{turn_id}/cancel` reaches that turn wherever it is — running,
//! waiting for the session's earlier turns, or not arrived yet. A cancel that comes first is
//! remembered for [`EARLY_CANCEL_TTL`] (at most [`EARLY_CANCEL_MAX`] per session, the oldest
//! forgotten first); the turn, when it arrives, runs nothing and every call is answered
//! `cancelled`.
//!
//! Arrival and cancel meet under one lock, so there is no moment in which a cancel can miss its
//! turn: the turn registers before it reads its body, and a cancel either finds it or leaves
//! itself for it.
//!
//! A turn id is part of its calls' identity, so the same id sent again while its first copy is
//! still queued or running is a retry of that turn: it joins the table as another copy (it waits
//! behind the first for the session's turn lock, and gets its answers), and a cancel of the id
//! reaches every copy.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use crate::locks::lock;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::errors::ApiError;

/// How long a cancel that arrived before its turn is remembered.
pub const EARLY_CANCEL_TTL: Duration = Duration::from_secs(60);
/// Most early cancels remembered per session.
pub const EARLY_CANCEL_MAX: usize = 1024;
/// Most ended turn ids remembered per session (so a late cancel says `finished`).
const FINISHED_MAX: usize = 1024;
/// Longest turn id.
pub const MAX_TURN_ID_LEN: usize = 128;

/// Checks a client's turn id: `^[A-Za-z0-9._:-]{1,128}$`.
pub fn check_turn_id(id: &str) -> Result<(), ApiError> {
    let ok = !id.is_empty()
        && id.len() <= MAX_TURN_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(ApiError::BadRequest(format!(
            "bad turn id {id:?}: 1 to {MAX_TURN_ID_LEN} letters, digits, `.`, `_`, `:` or `-`"
        )))
    }
}

#[derive(Debug)]
struct Active {
    /// The cancellation of each copy of the turn that arrived while another was in flight.
    tokens: Vec<CancellationToken>,
    /// Copies registered and not yet gone.
    copies: usize,
    running: bool,
}

#[derive(Debug, Default)]
struct Turns {
    active: HashMap<Arc<str>, Active>,
    early: HashMap<Arc<str>, Instant>,
    early_order: VecDeque<Arc<str>>,
    finished: HashSet<Arc<str>>,
    finished_order: VecDeque<Arc<str>>,
}

/// One session's turns by id.
#[derive(Debug, Default)]
pub struct TurnTable {
    turns: Mutex<Turns>,
}

/// Where a cancelled turn was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// Its calls were running.
    Running,
    /// It waited for the session's earlier turns.
    Queued,
    /// Not arrived yet: it will be answered `cancelled` when it does.
    Early,
    /// It had already ended.
    Finished,
}

impl Found {
    /// The `state` of the cancel answer.
    pub fn as_str(self) -> &'static str {
        match self {
            Found::Running => "running",
            Found::Queued => "queued",
            Found::Early => "early",
            Found::Finished => "finished",
        }
    }
}

impl TurnTable {
    /// Registers turn `id` arriving with `token` (cancelled here at once if its cancel came
    /// first). A turn of that id still queued or running gets a copy: the same turn sent again.
    pub fn arrive(
        self: &Arc<Self>,
        id: Arc<str>,
        token: CancellationToken,
    ) -> Result<TurnGuard, ApiError> {
        let mut turns = lock(&self.turns);
        if let Some(active) = turns.active.get_mut(&id) {
            active.tokens.push(token);
            active.copies += 1;
            return Ok(TurnGuard {
                table: Arc::clone(self),
                id,
                started: false,
            });
        }
        if let Some(at) = turns.early.remove(&id) {
            turns.early_order.retain(|e| *e != id);
            if at.elapsed() <= EARLY_CANCEL_TTL {
                token.cancel();
            }
        }
        turns.finished.remove(&id);
        turns.active.insert(
            Arc::clone(&id),
            Active {
                tokens: vec![token],
                copies: 1,
                running: false,
            },
        );
        Ok(TurnGuard {
            table: Arc::clone(self),
            id,
            started: false,
        })
    }

    /// Cancels turn `id` wherever it is.
    pub fn cancel(&self, id: &str) -> Found {
        let mut turns = lock(&self.turns);
        if let Some(active) = turns.active.get(id) {
            for token in &active.tokens {
                token.cancel();
            }
            return if active.running {
                Found::Running
            } else {
                Found::Queued
            };
        }
        if turns.finished.contains(id) {
            return Found::Finished;
        }
        let id: Arc<str> = Arc::from(id);
        let now = Instant::now();
        if turns.early.insert(Arc::clone(&id), now).is_none() {
            turns.early_order.push_back(id);
        }
        // Forget what expired, then the oldest beyond the bound.
        while let Some(oldest) = turns.early_order.front().cloned() {
            let expired = turns
                .early
                .get(&oldest)
                .is_none_or(|at| now.duration_since(*at) > EARLY_CANCEL_TTL);
            if !expired && turns.early_order.len() <= EARLY_CANCEL_MAX {
                break;
            }
            turns.early_order.pop_front();
            turns.early.remove(&oldest);
        }
        Found::Early
    }
}

/// A turn registered in its session's table; it leaves when this drops — as finished if it
/// started, else as if it never came (a refused request's retry may bring the same id).
#[derive(Debug)]
pub struct TurnGuard {
    table: Arc<TurnTable>,
    id: Arc<str>,
    started: bool,
}

impl TurnGuard {
    /// The turn got its place and its calls start now.
    pub fn running(&mut self) {
        self.started = true;
        if let Some(active) = lock(&self.table.turns).active.get_mut(&self.id) {
            active.running = true;
        }
    }
}

impl Drop for TurnGuard {
    fn drop(&mut self) {
        let mut turns = lock(&self.table.turns);
        if let Some(active) = turns.active.get_mut(&self.id) {
            active.copies -= 1;
            if active.copies == 0 {
                turns.active.remove(&self.id);
            }
        }
        if !self.started {
            return;
        }
        if turns.finished.insert(Arc::clone(&self.id)) {
            turns.finished_order.push_back(Arc::clone(&self.id));
        }
        while turns.finished_order.len() > FINISHED_MAX {
            if let Some(old) = turns.finished_order.pop_front() {
                turns.finished.remove(&old);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cancel_reaches_its_turn_before_during_and_after() {
        let table = Arc::new(TurnTable::default());
        // Before: remembered, and the turn arrives cancelled.
        assert_eq!(table.cancel("t1"), Found::Early);
        let token = CancellationToken::new();
        let mut guard = table.arrive(Arc::from("t1"), token.clone()).unwrap();
        assert!(token.is_cancelled());
        guard.running();
        drop(guard);
        assert_eq!(table.cancel("t1"), Found::Finished);
        // A turn refused before it started (overloaded, a bad body) leaves no trace: a cancel
        // of its retry is remembered for the retry.
        let refused = table
            .arrive(Arc::from("t9"), CancellationToken::new())
            .unwrap();
        drop(refused);
        assert_eq!(table.cancel("t9"), Found::Early);
        // Queued, then running; the same id again is a copy of it, which a cancel reaches too.
        let token = CancellationToken::new();
        let mut guard = table.arrive(Arc::from("t2"), token.clone()).unwrap();
        let copy_token = CancellationToken::new();
        let copy = table.arrive(Arc::from("t2"), copy_token.clone()).unwrap();
        assert_eq!(table.cancel("t2"), Found::Queued);
        assert!(token.is_cancelled() && copy_token.is_cancelled());
        guard.running();
        assert_eq!(table.cancel("t2"), Found::Running);
        drop(guard);
        // The copy is still in flight: the id is not finished until it is gone too.
        assert_eq!(table.cancel("t2"), Found::Running);
        drop(copy);
        assert_eq!(table.cancel("t2"), Found::Finished);
        // A later turn of another id is not touched by those cancels.
        let token = CancellationToken::new();
        let _g = table.arrive(Arc::from("t3"), token.clone()).unwrap();
        assert!(!token.is_cancelled());
    }

    #[test]
    fn early_cancels_are_bounded() {
        let table = TurnTable::default();
        for i in 0..EARLY_CANCEL_MAX + 10 {
            table.cancel(&format!("t{i}"));
        }
        let turns = lock(&table.turns);
        assert_eq!(turns.early.len(), EARLY_CANCEL_MAX);
        assert!(!turns.early.contains_key("t0"));
        assert!(
            turns
                .early
                .contains_key(&*format!("t{}", EARLY_CANCEL_MAX + 9))
        );
    }

    #[test]
    fn turn_ids_are_checked() {
        for good in ["t1", "a.b:c-d_e", &"x".repeat(128)] {
            assert!(check_turn_id(good).is_ok(), "{good}");
        }
        for bad in ["", "a b", "a/b", "é", &"x".repeat(129)] {
            assert!(check_turn_id(bad).is_err(), "{bad:?}");
        }
    }
}
