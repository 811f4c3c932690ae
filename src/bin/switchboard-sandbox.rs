//! `switchboard-sandbox`: the sandbox's trampoline alone — `switchboard-sandbox sandbox-exec …`
//! does exactly what `switchboard sandbox-exec …` does, from a binary a tenth of the size, so
//! that each command's start of it (the init of the command's namespaces is the same process,
//! forked) costs little. The engine uses it when it lies
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
