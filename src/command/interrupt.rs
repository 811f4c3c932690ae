//! Signals: SIGINT (ctrl-c) and SIGTERM (`docker stop`, systemd, `timeout`, `kill`) taken over
//! for the whole process, before the command line is parsed, and turned into one cancellation
//! token every long-running command watches — so a signal never kills the process with a call
//! unanswered or a command still running.
//!
//! Two steps, so that no signal falls between them: [`Early::catch`] installs a handler for both
//! on the first line of `main` (before the async runtime and its threads exist) that only notes
//! the signal, and [`Interrupt::install`] adds tokio's and then looks at that note — a signal
//! that came in between cancels the token at once. What remains is the time before `main` runs
//! at all (the program being loaded, a few milliseconds): a signal then ends the process by its
//! default action, before anything was read or run.
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use tokio_util::sync::CancellationToken;

/// Exit code after SIGINT (128 + 2), as shells report it.
pub const INTERRUPTED: u8 = 130;
/// Exit code after SIGTERM (128 + 15).
pub const TERMINATED: u8 = 143;

/// SIGINT (ctrl-c) and SIGTERM (`docker stop`, systemd, `timeout`, `kill`), taken over for the
/// whole process. Once installed neither signal kills the process: the first one cancels
/// [`Interrupt::token`], and each command answers every call in flight (`cancelled`, running
/// processes killed, partial output kept), prints what it owes, and exits 130 (SIGINT) or 143
/// (SIGTERM). Later signals change nothing; the command is already stopping.
#[derive(Debug, Clone)]
pub struct Interrupt {
    token: CancellationToken,
    code: Arc<AtomicU8>,
}

/// SIGINT and SIGTERM caught from the first line of `main`, before the handlers of
/// [`Interrupt::install`] exist: a signal then is only noted (the process goes on), and the
/// interrupt it makes is taken up by [`Interrupt::install`]. No signal mask is involved, so the
/// processes the engine starts inherit none.
#[derive(Debug)]
pub struct Early {
    int: Arc<AtomicBool>,
    term: Arc<AtomicBool>,
}

impl Early {
    /// Catches SIGINT and SIGTERM, noting each that comes.
    pub fn catch() -> Early {
        let early = Early {
            int: Arc::new(AtomicBool::new(false)),
            term: Arc::new(AtomicBool::new(false)),
        };
        for (signal, flag) in [
            (signal_hook::consts::SIGINT, &early.int),
            (signal_hook::consts::SIGTERM, &early.term),
        ] {
            if let Err(e) = signal_hook::flag::register(signal, Arc::clone(flag)) {
                // Cannot happen for these two signals; tokio's handlers still come a little later.
                eprintln!("switchboard: cannot catch signal {signal} at start-up: {e}");
            }
        }
        early
    }

    /// The exit code of the first signal noted so far (SIGTERM wins a tie), if any.
    fn code(&self) -> Option<u8> {
        if self.term.load(Ordering::SeqCst) {
            Some(TERMINATED)
        } else if self.int.load(Ordering::SeqCst) {
            Some(INTERRUPTED)
        } else {
            None
        }
    }
}

impl Interrupt {
    /// Installs the handlers, then takes up a signal `early` noted before they existed; must
    /// run inside a tokio runtime (with signals enabled).
    pub fn install(early: Early) -> std::io::Result<Interrupt> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut int = signal(SignalKind::interrupt())?;
        let mut term = signal(SignalKind::terminate())?;
        let interrupt = Interrupt::never();
        // From here on tokio sees every signal; one that came before is in `early`.
        if let Some(code) = early.code() {
            interrupt.code.store(code, Ordering::Release);
            interrupt.token.cancel();
        }
        let on_signal = interrupt.clone();
        tokio::spawn(async move {
            let code = tokio::select! {
                Some(()) = int.recv() => INTERRUPTED,
                Some(()) = term.recv() => TERMINATED,
                else => return,
            };
            on_signal.code.store(code, Ordering::Release);
            on_signal.token.cancel();
        });
        Ok(interrupt)
    }

    /// An interrupt that no signal triggers (for library callers and tests; cancel its token to
    /// simulate one).
    pub fn never() -> Interrupt {
        Interrupt {
            token: CancellationToken::new(),
            code: Arc::new(AtomicU8::new(0)),
        }
    }

    /// Cancelled by the first signal.
    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// Waits for the first signal.
    pub async fn cancelled(&self) {
        self.token.cancelled().await;
    }

    /// 130 after SIGINT, 143 after SIGTERM (130 if the token was cancelled by hand), `None`
    /// while no signal came.
    pub fn exit_code(&self) -> Option<u8> {
        if !self.token.is_cancelled() {
            return None;
        }
        match self.code.load(Ordering::Acquire) {
            0 => Some(INTERRUPTED),
            code => Some(code),
        }
    }
}
