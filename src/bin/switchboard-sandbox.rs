//! `switchboard-sandbox`: the sandbox's trampoline alone — `switchboard-sandbox sandbox-exec …`
//! does exactly what `switchboard sandbox-exec …` does, from a binary a tenth of the size, so
//! that each sandboxed command's two starts of it cost little. The engine uses it when it lies
//! beside the `switchboard` binary (see `switchboard::sandbox::find_trampoline`).

fn main() -> std::process::ExitCode {
    switchboard::sandbox::run_if_requested().unwrap_or_else(|| {
        eprintln!(
            "switchboard-sandbox: the sandbox's trampoline, started by the engine \
             (`switchboard-sandbox sandbox-exec …`); there is nothing to run by hand"
        );
        std::process::ExitCode::from(2)
    })
}
