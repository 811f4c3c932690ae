//! What an idle session and one kept answer hold in memory, counted by the allocator: the bytes
//! a session keeps once it is open and has dispatched (its answer memory empty), and what one
//! kept answer adds. `switchboard load --idle` measures the same in RSS (docs/performance.md);
//! this test holds the bound without a noisy reading. Alone in its own test binary: its global
//! allocator counts every allocation of the process.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use serde_json::json;
use switchboard::protocol::ToolCall;
use switchboard::testing::{TEXT, load_tools};

/// Counts the bytes allocated and not freed yet.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is passed on to the system allocator unchanged; the count is a side effect.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

/// An idle session keeps under 512 bytes on the heap (447 when this test was written, 566 before; the
/// allocator's own overhead comes on top: `load --idle` reads under 1 KiB of RSS per session),
/// and a kept 32-character answer under 640 (540).
#[tokio::test(flavor = "current_thread")]
async fn an_idle_session_and_a_kept_answer_stay_small() {
    let engine = switchboard::Engine::builder()
        .tools(load_tools(std::time::Duration::ZERO))
        .build()
        .unwrap();
    let n = 1_000;
    // The engine's lazily made state (the first turn's, the token tree's first children) first.
    let mut sessions: Vec<_> = (0..100).map(|_| engine.session()).collect();
    for s in &sessions {
        let call = ToolCall::new("warm", "noop", json!({"text": TEXT, "n": 0}));
        assert!(s.dispatch(vec![call]).await.unwrap()[0].is_ok());
    }
    sessions.reserve(2 * n);
    let before = live();
    for _ in 0..n {
        let session = engine.session();
        // Refused whole (an empty id): dispatched, and not remembered.
        let call = ToolCall::new("", "noop", json!({"text": TEXT, "n": 0}));
        let results = session.dispatch(vec![call]).await.unwrap();
        assert!(!results[0].is_ok(), "a call with an empty id is refused");
        sessions.push(session);
    }
    let opened = live();
    for (i, s) in sessions[100..].iter().enumerate() {
        let call = ToolCall::new(format!("call_{i}"), "noop", json!({"text": TEXT, "n": 0}));
        assert!(s.dispatch(vec![call]).await.unwrap()[0].is_ok());
    }
    let answered = live();
    let per_session = (opened - before) / n as isize;
    let per_answer = (answered - opened) / n as isize;
    eprintln!("an idle session: {per_session} bytes; a kept answer: {per_answer} bytes");
    assert!(
        per_session < 512,
        "an idle session keeps {per_session} bytes"
    );
    assert!(per_answer < 640, "a kept answer takes {per_answer} bytes");
    drop(sessions);
    engine.shutdown(std::time::Duration::from_secs(1)).await;
}
