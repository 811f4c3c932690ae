//! Confinement of the file tools: no path the model can write — `..`, absolute, sibling prefixes,
//! symlinks of every shape, `/proc` magic links — reads, writes or lists anything outside the
//! workspace. Each test builds `<tmp>/ws` (the workspace) next to `<tmp>/outside` and
//! `<tmp>/ws-evil`, whose files must stay unread and unchanged.

use crate::common;

use serde_json::json;
use switchboard::protocol::ErrorCode;
use switchboard::tool::ToolOutcome;
use switchboard::tools::{edit_file, glob, read_file, write_file};

use common::direct::{assert_code, assert_denied, call_tool as call};
use common::workspace::Confined;

const SECRET: &str = "outside secret\n";

/// The confinement layout with a secret on the outside.
struct Fixture {
    dir: Confined,
}

impl Fixture {
    fn new() -> Self {
        Fixture {
            dir: Confined::new(
                &[],
                &[("outside/secret.txt", SECRET), ("ws-evil/secret", SECRET)],
            ),
        }
    }

    fn read(&self, path: &str) -> ToolOutcome {
        call(
            &common::direct::in_workspace(read_file::spec(), &self.dir.ws),
            json!({"path": path}),
        )
    }

    fn write(&self, path: &str) -> ToolOutcome {
        call(
            &common::direct::in_workspace(write_file::spec(), &self.dir.ws),
            json!({"path": path, "content": "pwned\n"}),
        )
    }

    fn edit(&self, path: &str) -> ToolOutcome {
        call(
            &common::direct::in_workspace(edit_file::spec(), &self.dir.ws),
            json!({"path": path, "old_text": "secret", "new_text": "pwned"}),
        )
    }

    fn glob(&self, pattern: &str) -> ToolOutcome {
        call(
            &common::direct::in_workspace(glob::spec(), &self.dir.ws),
            json!({"pattern": pattern}),
        )
    }

    fn assert_outside_untouched(&self) {
        for file in ["outside/secret.txt", "ws-evil/secret"] {
            assert_eq!(
                std::fs::read_to_string(self.dir.base.join(file)).unwrap(),
                SECRET
            );
        }
        let names: Vec<_> = std::fs::read_dir(self.dir.base.join("outside"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["secret.txt"], "something was created outside");
        assert!(!self.dir.base.join("x").exists());
    }
}

#[test]
fn parent_and_foreign_absolute_paths_are_denied_for_every_file_tool() {
    let f = Fixture::new();
    let sibling = f.dir.base.join("ws-evil/secret");
    let sibling = sibling.to_str().unwrap();
    for path in [
        "../x",
        "a/../../x",
        "/etc/passwd",
        "../ws-evil/secret",
        sibling,
    ] {
        assert_denied(f.read(path), &format!("read {path}"));
        assert_denied(f.write(path), &format!("write {path}"));
        assert_denied(f.edit(path), &format!("edit {path}"));
    }
    let sibling_dir = format!("{}/ws-evil/*", f.dir.base.display());
    for pattern in ["../*", "a/../../*", "/etc/*", "../ws-evil/*", &sibling_dir] {
        assert_denied(f.glob(pattern), &format!("glob {pattern}"));
    }
    f.assert_outside_untouched();
}

#[test]
fn the_denial_names_the_path_as_the_model_gave_it() {
    let f = Fixture::new();
    let err = f.read("a/../../x").unwrap_err();
    assert_eq!(err.detail, "path escapes workspace: a/../../x");
}

#[test]
fn a_symlink_leaf_to_an_outside_file_is_denied_for_read_write_and_edit() {
    let f = Fixture::new();
    f.dir.link(f.dir.base.join("outside/secret.txt"), "leaf");
    assert_denied(f.read("leaf"), "read");
    assert_denied(f.write("leaf"), "write");
    assert_denied(f.edit("leaf"), "edit");
    f.assert_outside_untouched();
    assert!(
        std::fs::symlink_metadata(f.dir.ws_path("leaf"))
            .unwrap()
            .is_symlink()
    );
}

#[test]
fn a_dangling_symlink_to_an_outside_path_cannot_be_written_and_nothing_appears_outside() {
    let f = Fixture::new();
    f.dir.link(f.dir.base.join("outside/new.txt"), "dangling");
    assert_denied(f.write("dangling"), "write");
    assert_denied(f.read("dangling"), "read");
    assert!(!f.dir.base.join("outside/new.txt").exists());
    f.assert_outside_untouched();
}

#[test]
fn a_directory_symlink_component_pointing_outside_is_denied() {
    let f = Fixture::new();
    f.dir.link(f.dir.base.join("outside"), "dirlink");
    assert_denied(f.read("dirlink/secret.txt"), "read");
    assert_denied(f.write("dirlink/secret.txt"), "write over");
    assert_denied(f.write("dirlink/new.txt"), "write new");
    assert_denied(f.write("dirlink/sub/new.txt"), "write nested");
    assert_denied(f.edit("dirlink/secret.txt"), "edit");
    f.assert_outside_untouched();
}

#[test]
fn a_symlink_chain_that_ends_outside_is_denied() {
    let f = Fixture::new();
    f.dir.link("b", "a");
    f.dir.link(f.dir.base.join("outside/secret.txt"), "b");
    assert_denied(f.read("a"), "read");
    assert_denied(f.write("a"), "write");
    assert_denied(f.edit("a"), "edit");
    f.assert_outside_untouched();
}

#[test]
fn proc_magic_links_are_refused() {
    let f = Fixture::new();
    f.dir.link("/proc/self/root/etc/passwd", "proc_leaf");
    f.dir.link("/proc/self/root", "proc_dir");
    assert_denied(f.read("proc_leaf"), "read proc leaf");
    assert_denied(f.read("proc_dir/etc/passwd"), "read via proc dir");
    assert_denied(f.write("proc_dir/tmp/x"), "write via proc dir");
    assert_denied(f.read("/proc/self/root/etc/passwd"), "absolute proc path");
}

#[test]
fn a_symlink_inside_pointing_inside_reads_and_writes_its_target() {
    let f = Fixture::new();
    std::fs::create_dir(f.dir.ws_path("real")).unwrap();
    std::fs::write(f.dir.ws_path("real/file.txt"), "inside\n").unwrap();
    f.dir.link("real/file.txt", "alias");
    f.dir.link("real", "dir_alias");
    assert_eq!(f.read("alias").unwrap(), "inside");
    assert_eq!(f.read("dir_alias/file.txt").unwrap(), "inside");
    assert_eq!(f.write("alias").unwrap(), "Wrote 6 bytes to alias");
    assert_eq!(
        std::fs::read_to_string(f.dir.ws_path("real/file.txt")).unwrap(),
        "pwned\n"
    );
    assert!(
        std::fs::symlink_metadata(f.dir.ws_path("alias"))
            .unwrap()
            .is_symlink()
    );
}

#[test]
fn tilde_is_a_literal_directory_inside_the_workspace() {
    let f = Fixture::new();
    assert_eq!(f.write("~/x").unwrap(), "Wrote 6 bytes to ~/x");
    assert_eq!(
        std::fs::read_to_string(f.dir.ws_path("~/x")).unwrap(),
        "pwned\n"
    );
    assert_eq!(f.read("~/x").unwrap(), "pwned");
}

#[test]
fn empty_nul_and_overlong_paths_are_invalid_arguments() {
    let f = Fixture::new();
    let long = "a".repeat(5000);
    for path in ["", "a\0b", long.as_str()] {
        let shown = &path[..path.len().min(8)];
        assert_code(f.read(path), ErrorCode::InvalidArguments, shown);
        assert_code(f.write(path), ErrorCode::InvalidArguments, shown);
        assert_code(f.edit(path), ErrorCode::InvalidArguments, shown);
    }
    assert_code(f.glob(""), ErrorCode::InvalidArguments, "empty glob");
}

#[test]
fn an_absolute_path_inside_the_workspace_works() {
    let f = Fixture::new();
    let abs = f.dir.ws_path("sub/abs.txt");
    let abs = abs.to_str().unwrap();
    assert_eq!(f.write(abs).unwrap(), format!("Wrote 6 bytes to {abs}"));
    assert_eq!(f.read(abs).unwrap(), "pwned");
    assert_eq!(f.read("sub/abs.txt").unwrap(), "pwned");
}

#[test]
fn the_root_itself_is_a_directory_not_a_file() {
    let f = Fixture::new();
    let err = f.read(".").unwrap_err();
    assert_eq!(err.code, ErrorCode::ExecutionError);
    assert_eq!(err.detail, "is a directory: .");
    assert_code(
        f.read(f.dir.ws.root().to_str().unwrap()),
        ErrorCode::ExecutionError,
        "absolute root",
    );
}

#[test]
fn glob_never_lists_outside_files_and_terminates_on_symlink_loops() {
    let f = Fixture::new();
    std::fs::create_dir(f.dir.ws_path("src")).unwrap();
    std::fs::write(f.dir.ws_path("src/main.txt"), "m").unwrap();
    f.dir.link(f.dir.base.join("outside"), "dirlink");
    f.dir.link(".", "self_loop");
    f.dir.link("loop_b", "loop_a");
    f.dir.link("loop_a", "loop_b");
    let listed = f.glob("**").unwrap();
    let lines: Vec<&str> = listed.lines().collect();
    assert_eq!(
        lines,
        [
            "dirlink",
            "loop_a",
            "loop_b",
            "self_loop",
            "src",
            "src/main.txt"
        ]
    );
    assert_eq!(f.glob("dirlink/*").unwrap(), "(no matches)");
    assert_eq!(f.glob("**/secret*").unwrap(), "(no matches)");
    assert_eq!(f.glob("self_loop/**").unwrap(), "(no matches)");
}
