//! The `switchboard` binary: everything lives in the library's `cli` module.

fn main() -> std::process::ExitCode {
    switchboard::cli::main()
}
