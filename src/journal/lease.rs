//! A session's lease on this node, in cluster mode: the one place that says whether this node
//! serves a session, at which epoch, and whether it lost it.
//!
//! A node's [`Leases`] table is shared by everything that needs the answer:
//!
//! * the cluster grants a lease when it records a session created here or takes one over (the
//!   session's key in the owners bucket names this node at the lease's epoch), checks it against
//!   that key after a lapse of its heartbeat, and lets it go when another node took the session
//!   or this node closed it;
//! * the replicated journal writes a session's records at its lease's epoch, refuses writes for a
//!   lease that was lost, and marks the lease lost when the stream refuses a write (another node
//!   claimed the session: the stream's fence);
//! * self-fencing lets go of every lease at once when this node's heartbeat went stale;
//! * an engine session holds its lease and answers a turn whose lease was lost meanwhile as
//!   moved ([`crate::engine::EngineError::Moved`]).
//!
//! A lease is lost once and for good: taking a session back makes a new lease at a new epoch, so
//! a write that still holds the old one is refused, whatever the new one does.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::locks::lock;

/// This node's lease on one session.
#[derive(Debug)]
pub struct Lease {
    epoch: u64,
    lost: AtomicBool,
    /// When the session's key was last known to name this node at this epoch.
    verified: Mutex<Instant>,
}

impl Lease {
    fn new(epoch: u64) -> Lease {
        Lease {
            epoch,
            lost: AtomicBool::new(false),
            verified: Mutex::new(Instant::now()),
        }
    }

    /// The session's epoch under this lease (1 when it was created here, one more at each
    /// takeover).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Whether this lease was lost (another node owns the session, or this node let it go).
    pub fn lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// When the session's key was last known to name this node at this lease's epoch.
    pub fn verified(&self) -> Instant {
        *lock(&self.verified)
    }

    /// The session's key was read at `at` and still names this node at this epoch.
    pub fn verify(&self, at: Instant) {
        let mut verified = lock(&self.verified);
        *verified = (*verified).max(at);
    }

    /// Marks it lost; true the first time.
    fn lose(&self) -> bool {
        !self.lost.swap(true, Ordering::AcqRel)
    }
}

/// The leases this node holds, by session id.
#[derive(Debug, Default)]
pub struct Leases {
    held: Mutex<HashMap<String, Arc<Lease>>>,
}

impl Leases {
    /// An empty table.
    pub fn new() -> Leases {
        Leases::default()
    }

    /// Grants this node a lease on session `id` at `epoch`; a lease it held before on the same
    /// session is lost.
    pub fn grant(&self, id: &str, epoch: u64) -> Arc<Lease> {
        let lease = Arc::new(Lease::new(epoch));
        if let Some(old) = lock(&self.held).insert(id.to_string(), Arc::clone(&lease)) {
            old.lose();
        }
        lease
    }

    /// The lease held on session `id`, if any (a held lease is never lost).
    pub fn get(&self, id: &str) -> Option<Arc<Lease>> {
        lock(&self.held).get(id).cloned()
    }

    /// Lets go of the lease on session `id`; true if one was held.
    pub fn lose(&self, id: &str) -> bool {
        match lock(&self.held).remove(id) {
            Some(lease) => {
                lease.lose();
                true
            }
            None => false,
        }
    }

    /// Marks `lease` (on session `id`) lost, and lets it go if it is the one held; true the
    /// first time it is marked.
    pub fn lose_lease(&self, id: &str, lease: &Arc<Lease>) -> bool {
        let mut held = lock(&self.held);
        if held.get(id).is_some_and(|l| Arc::ptr_eq(l, lease)) {
            held.remove(id);
        }
        lease.lose()
    }

    /// The sessions whose lease this node holds.
    pub fn ids(&self) -> Vec<String> {
        lock(&self.held).keys().cloned().collect()
    }

    /// How many leases this node holds.
    pub fn len(&self) -> usize {
        lock(&self.held).len()
    }

    /// Whether this node holds no lease.
    pub fn is_empty(&self) -> bool {
        lock(&self.held).is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_granted_again_loses_the_old_one() {
        let leases = Leases::new();
        let first = leases.grant("s1", 1);
        assert!(!first.lost());
        let second = leases.grant("s1", 2);
        assert!(first.lost(), "the lease of the earlier epoch is lost");
        assert!(!second.lost());
        assert_eq!(leases.get("s1").map(|l| l.epoch()), Some(2));
        // A refusal met by a write of the old lease does not touch the new one.
        assert!(!leases.lose_lease("s1", &first), "already lost");
        assert!(leases.get("s1").is_some_and(|l| Arc::ptr_eq(&l, &second)));
        assert!(leases.lose_lease("s1", &second));
        assert!(second.lost());
        assert!(leases.get("s1").is_none());
        assert!(leases.is_empty());
    }

    #[test]
    fn letting_go_loses_the_lease_its_holders_see() {
        let leases = Leases::new();
        let lease = leases.grant("s1", 3);
        let held_by_a_session = Arc::clone(&lease);
        assert_eq!(leases.ids(), vec!["s1".to_string()]);
        assert!(leases.lose("s1"));
        assert!(held_by_a_session.lost());
        assert!(!leases.lose("s1"), "nothing held any more");
        assert_eq!(leases.len(), 0);
    }

    #[test]
    fn verification_only_moves_forward() {
        let leases = Leases::new();
        let lease = leases.grant("s1", 1);
        let later = Instant::now() + std::time::Duration::from_secs(5);
        lease.verify(later);
        lease.verify(Instant::now());
        assert_eq!(lease.verified(), later);
    }
}
