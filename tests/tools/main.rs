//! The built-in tools: their behaviour, workspace confinement under attack, bash's process
//! control, private environment and idempotency key, atomic writes, bounded outputs and path forms.
//!
//! One test binary for the area; each module is one suite (filter with `<module>::`).

#[path = "../common/mod.rs"]
mod common;

mod adversarial_paths;
mod atomic_writes;
mod bash_commands_see_their_idempotency_key;
mod bash_environment_is_private;
mod bash_process_control;
mod bounded_outputs;
mod builtin_tools;
mod hard_links_do_not_leak_outside_files;
mod harmless_redirections_run;
mod killed_commands_are_errors;
mod killed_writers_leave_no_temp_files;
mod windows_path_forms_never_become_files;
mod workspace_confinement;
