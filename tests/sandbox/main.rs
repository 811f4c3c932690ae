//! The bash sandbox: files, sessions, network, namespaces, inherited descriptors, limits, the
//! private TMPDIR, modes, the engine's death, the terminal it runs in, and its cost figure
//! (ignored by default).
//!
//! One test binary for the area; each module is one suite (filter with `<module>::`).

#[path = "../common/mod.rs"]
mod common;

mod sandbox_cost_figure;
mod sandbox_engine_death;
mod sandbox_files;
mod sandbox_inherited_fds;
mod sandbox_init;
mod sandbox_limits;
mod sandbox_modes;
mod sandbox_namespaces;
mod sandbox_network;
mod sandbox_read_paths;
mod sandbox_sessions;
mod sandbox_spawner;
mod sandbox_terminal;
mod sandbox_tmpdir;
