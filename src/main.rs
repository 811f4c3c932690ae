//! The `switchboard` binary: everything lives in the library's `cli` module.
//!
//! The binary uses mimalloc as its allocator: the dispatch hot path is allocation-bound (argument
//! values, result strings, encoded JSON), and on many-session workloads mimalloc measured
//! 1.5–2.4× faster than the system allocator here (`../shared/reference/perf-budget.md`). The
//! library leaves the allocator to its embedder.

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    switchboard::cli::main()
}
