//! Signals: SIGINT (ctrl-c) and SIGTERM (`docker stop`, systemd, `timeout`, `kill`) taken over
//! for the whole process, before the command line is parsed, and turned into one cancellation
//! token every long-running command watches — so a signal never kills the process with a call
//! unanswered or a command still running.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

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

impl Interrupt {
    /// Installs the handlers; must run inside a tokio runtime (with signals enabled).
    pub fn install() -> std::io::Result<Interrupt> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut int = signal(SignalKind::interrupt())?;
        let mut term = signal(SignalKind::terminate())?;
        let interrupt = Interrupt::never();
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
