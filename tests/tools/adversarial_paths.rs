//! Confinement under attack: many variants of every escape a model (or a command it ran) can
//! try — `..` anywhere, absolute and sibling-prefix paths, symlinks of every shape including
//! `/proc` magic links, a symlink planted by bash earlier in the same turn, and a symlink swapped
//! back and forth while reads and writes run. Nothing outside the workspace is read, written,
//! created or listed. Each test builds `<tmp>/ws` next to `<tmp>/outside` and `<tmp>/ws-evil`.

use crate::common;

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::json;
use switchboard::protocol::ErrorCode;
use switchboard::tool::{ToolOutcome, ToolSpec};
use switchboard::tools::{edit_file, glob, read_file, write_file};

use common::direct::{assert_code, call_tool as call};
use common::workspace::Confined;
use switchboard::ToolCall;

const SECRET: &str = "outside secret\n";
const INSIDE: &str = "inside text\n";

/// The confinement layout with files on both sides, and the four file tools in its workspace.
struct Fixture {
    dir: Confined,
    read: ToolSpec,
    write: ToolSpec,
    edit: ToolSpec,
    glob: ToolSpec,
}

impl Fixture {
    fn new() -> Self {
        let dir = Confined::new(
            &["outside/sub"],
            &[
                ("outside/secret.txt", SECRET),
                ("outside/sub/deep.txt", SECRET),
                ("ws-evil/secret", SECRET),
                ("ws/inside.txt", INSIDE),
            ],
        );
        Fixture {
            read: common::direct::in_workspace(read_file::spec(), &dir.ws),
            write: common::direct::in_workspace(write_file::spec(), &dir.ws),
            edit: common::direct::in_workspace(edit_file::spec(), &dir.ws),
            glob: common::direct::in_workspace(glob::spec(), &dir.ws),
            dir,
        }
    }

    fn outside(&self, rel: &str) -> String {
        self.dir
            .base
            .join("outside")
            .join(rel)
            .display()
            .to_string()
    }

    fn read(&self, path: &str) -> ToolOutcome {
        call(&self.read, json!({"path": path}))
    }

    fn write(&self, path: &str) -> ToolOutcome {
        call(&self.write, json!({"path": path, "content": "pwned\n"}))
    }

    fn edit(&self, path: &str) -> ToolOutcome {
        call(
            &self.edit,
            json!({"path": path, "old_text": "secret", "new_text": "pwned"}),
        )
    }

    fn glob(&self, pattern: &str) -> ToolOutcome {
        call(&self.glob, json!({"pattern": pattern}))
    }

    /// Every file outside the workspace, with its content.
    fn outside_tree(&self) -> Vec<(String, String)> {
        fn walk(dir: &Path, base: &Path, out: &mut Vec<(String, String)>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                let meta = std::fs::symlink_metadata(&path).unwrap();
                let rel = path.strip_prefix(base).unwrap().display().to_string();
                if meta.is_dir() {
                    out.push((rel.clone() + "/", String::new()));
                    walk(&path, base, out);
                } else {
                    out.push((rel, std::fs::read_to_string(&path).unwrap_or_default()));
                }
            }
        }
        let mut out = Vec::new();
        for dir in ["outside", "ws-evil"] {
            walk(&self.dir.base.join(dir), &self.dir.base, &mut out);
        }
        out.sort();
        out
    }

    fn assert_outside_untouched(&self) {
        let expected: Vec<(String, String)> = [
            ("outside/secret.txt", SECRET),
            ("outside/sub/", ""),
            ("outside/sub/deep.txt", SECRET),
            ("ws-evil/secret", SECRET),
        ]
        .into_iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
        assert_eq!(self.outside_tree(), expected, "something outside changed");
        let top: Vec<_> = std::fs::read_dir(&self.dir.base)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(
            top.len(),
            3,
            "something appeared beside the workspace: {top:?}"
        );
    }
}

/// Denied, and the denial does not echo the outside content.
fn assert_denied(outcome: ToolOutcome, what: &str) {
    if let Err(e) = &outcome {
        assert!(!e.detail.contains("outside secret"), "{what}: {e}");
    }
    common::direct::assert_denied(outcome, what);
}

#[test]
fn dot_dot_in_every_position_is_denied() {
    let f = Fixture::new();
    let paths = [
        "..",
        "../",
        "./..",
        "../outside/secret.txt",
        "../../etc/passwd",
        "a/../../outside/secret.txt",
        "a/b/../../../outside/secret.txt",
        "inside.txt/..",
        "a/..",
        "a/../inside.txt",
        "./../ws/inside.txt",
        ".//..//outside/secret.txt",
        "a/./../../outside/secret.txt",
        "../ws-evil/secret",
        "sub/..",
        "x/y/z/../../../../outside/secret.txt",
    ];
    for path in paths {
        assert_denied(f.read(path), &format!("read {path}"));
        assert_denied(f.write(path), &format!("write {path}"));
        assert_denied(f.edit(path), &format!("edit {path}"));
    }
    for pattern in [
        "..",
        "../*",
        "../**",
        "a/../../*",
        "**/../*",
        "../outside/**",
    ] {
        assert_denied(f.glob(pattern), &format!("glob {pattern}"));
    }
    f.assert_outside_untouched();
}

#[test]
fn absolute_paths_outside_and_sibling_prefixes_are_denied() {
    let f = Fixture::new();
    let root = f.dir.ws.root().display().to_string();
    let paths = [
        "/".to_string(),
        "/etc/passwd".to_string(),
        "//etc/passwd".to_string(),
        "/proc/self/environ".to_string(),
        "/dev/zero".to_string(),
        f.outside("secret.txt"),
        f.outside("new.txt"),
        f.dir.base.join("ws-evil/secret").display().to_string(),
        f.dir.base.join("ws-evil/new").display().to_string(),
        format!("{root}-evil/secret"),
        format!("{root}evil"),
        format!("{root}/../outside/secret.txt"),
        f.dir.base.display().to_string(),
    ];
    for path in &paths {
        assert_denied(f.read(path), &format!("read {path}"));
        assert_denied(f.write(path), &format!("write {path}"));
        assert_denied(f.edit(path), &format!("edit {path}"));
    }
    for pattern in [
        "/*".to_string(),
        "/etc/*".to_string(),
        format!("{root}-evil/*"),
        format!("{}/*", f.outside("")),
    ] {
        assert_denied(f.glob(&pattern), &format!("glob {pattern}"));
    }
    // The absolute path of a file inside works.
    assert_eq!(
        f.read(&format!("{root}/inside.txt")).unwrap(),
        "inside text"
    );
    f.assert_outside_untouched();
}

#[test]
fn symlinks_out_of_every_shape_are_denied() {
    let f = Fixture::new();
    f.dir.link(f.outside("secret.txt"), "leaf_abs");
    f.dir.link("../outside/secret.txt", "leaf_rel");
    f.dir.link("../ws-evil/secret", "leaf_sibling");
    f.dir.link(f.outside("new.txt"), "dangling_abs");
    f.dir.link("../outside/new.txt", "dangling_rel");
    f.dir.link(f.outside(""), "dir_abs");
    f.dir.link("../outside", "dir_rel");
    f.dir.link("chain2", "chain1");
    f.dir.link("chain3", "chain2");
    f.dir.link(f.outside("secret.txt"), "chain3");
    f.dir.link("dir_rel/sub", "dir_chain");
    f.dir.link("/", "root_link");
    f.dir.link("/etc/passwd", "passwd");
    std::fs::create_dir(f.dir.ws_path("nested")).unwrap();
    symlink("../../outside/secret.txt", f.dir.ws_path("nested/up2")).unwrap();
    symlink("../dir_rel", f.dir.ws_path("nested/via_parent")).unwrap();
    for path in [
        "leaf_abs",
        "leaf_rel",
        "leaf_sibling",
        "dir_abs/secret.txt",
        "dir_rel/secret.txt",
        "dir_rel/sub/deep.txt",
        "chain1",
        "dir_chain/deep.txt",
        "root_link/etc/passwd",
        "passwd",
        "nested/up2",
        "nested/via_parent/secret.txt",
        "./leaf_abs",
        "nested/../leaf_abs",
    ] {
        assert_denied(f.read(path), &format!("read {path}"));
        assert_denied(f.write(path), &format!("write {path}"));
        assert_denied(f.edit(path), &format!("edit {path}"));
    }
    // Dangling links out, and new files under directory links out, cannot be written.
    for path in [
        "dangling_abs",
        "dangling_rel",
        "dir_abs/new.txt",
        "dir_rel/new.txt",
        "dir_rel/sub/new.txt",
        "dir_rel/newdir/new.txt",
        "nested/via_parent/new.txt",
        "root_link/tmp/switchboard-pwned",
    ] {
        assert_denied(f.write(path), &format!("write {path}"));
    }
    for path in ["dangling_abs", "dangling_rel"] {
        assert_denied(f.read(path), &format!("read {path}"));
    }
    assert!(!Path::new("/tmp/switchboard-pwned").exists());
    f.assert_outside_untouched();
    // The links themselves are still links: nothing was written over them.
    for name in ["leaf_abs", "dangling_abs", "chain3", "dir_rel"] {
        assert!(
            std::fs::symlink_metadata(f.dir.ws_path(name))
                .unwrap()
                .is_symlink()
        );
    }
}

#[test]
fn a_dangling_directory_link_out_creates_nothing_outside() {
    let f = Fixture::new();
    f.dir.link(f.outside("newdir"), "dangdir");
    let outcome = f.write("dangdir/x.txt");
    assert!(outcome.is_err(), "{outcome:?}");
    assert!(!f.dir.base.join("outside/newdir").exists());
    f.assert_outside_untouched();
}

#[test]
fn proc_magic_links_are_denied() {
    let f = Fixture::new();
    let own = std::process::id();
    let links = [
        ("self_root", "/proc/self/root".to_string()),
        ("self_cwd", "/proc/self/cwd".to_string()),
        ("thread_root", "/proc/thread-self/root".to_string()),
        ("pid_root", format!("/proc/{own}/root")),
        ("self_environ", "/proc/self/environ".to_string()),
        ("self_exe", "/proc/self/exe".to_string()),
        ("fd0", "/proc/self/fd/0".to_string()),
        ("fd1", "/proc/self/fd/1".to_string()),
        ("fd2", "/proc/self/fd/2".to_string()),
        ("fd3", "/proc/self/fd/3".to_string()),
        ("fd_dir", "/proc/self/fd".to_string()),
    ];
    for (name, target) in &links {
        f.dir.link(target, name);
    }
    // An open handle on the outside file, so some /proc/self/fd/N points at it.
    let held = std::fs::File::open(f.dir.base.join("outside/secret.txt")).unwrap();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&held);
    f.dir.link(format!("/proc/self/fd/{fd}"), "fd_held");
    f.dir.link(format!("/proc/{own}/fd/{fd}"), "pid_fd_held");
    f.dir.link(format!("/dev/fd/{fd}"), "dev_fd_held");
    for path in [
        "self_root/etc/passwd",
        "self_cwd/Cargo.toml",
        "thread_root/etc/passwd",
        "pid_root/etc/passwd",
        "self_environ",
        "self_exe",
        "fd0",
        "fd1",
        "fd2",
        "fd3",
        "fd_held",
        "pid_fd_held",
        "dev_fd_held",
        "fd_dir/0",
    ] {
        assert_denied(f.read(path), &format!("read {path}"));
        assert_denied(f.write(path), &format!("write {path}"));
        assert_denied(f.edit(path), &format!("edit {path}"));
    }
    for path in ["self_root/tmp/x", "self_cwd/x", "fd_dir/99"] {
        assert_denied(f.write(path), &format!("write {path}"));
    }
    for path in [
        "/proc/self/root/etc/passwd",
        "/proc/self/cwd",
        &format!("/proc/self/fd/{fd}"),
    ] {
        assert_denied(f.read(path), &format!("absolute {path}"));
    }
    drop(held);
    f.assert_outside_untouched();
}

#[test]
fn nul_empty_and_overlong_paths_are_invalid_arguments() {
    let f = Fixture::new();
    let long = "a".repeat(4097);
    let long_components = "abc/".repeat(2000);
    for path in [
        "",
        "\0",
        "a\0b",
        "inside.txt\0",
        "\0../outside",
        long.as_str(),
        long_components.as_str(),
    ] {
        let shown: String = path.chars().take(12).collect();
        assert_code(f.read(path), ErrorCode::InvalidArguments, &shown);
        assert_code(f.write(path), ErrorCode::InvalidArguments, &shown);
        assert_code(f.edit(path), ErrorCode::InvalidArguments, &shown);
    }
    for pattern in ["", "a\0b", long.as_str()] {
        assert_code(f.glob(pattern), ErrorCode::InvalidArguments, "glob");
    }
    // A single component longer than the system allows is refused too, as a bad argument.
    let component = "n".repeat(300);
    assert_code(
        f.write(&component),
        ErrorCode::InvalidArguments,
        "long name",
    );
    assert_code(f.read(&component), ErrorCode::InvalidArguments, "long name");
    f.assert_outside_untouched();
}

#[test]
fn tilde_is_never_expanded() {
    let f = Fixture::new();
    for path in ["~", "~/x", "~root/x", "~/.ssh/id_rsa"] {
        let err = f.read(path).unwrap_err();
        assert_eq!(err.detail, format!("file not found: {path}"));
    }
    assert_eq!(f.write("~root/x").unwrap(), "Wrote 6 bytes to ~root/x");
    assert_eq!(
        std::fs::read_to_string(f.dir.ws_path("~root/x")).unwrap(),
        "pwned\n"
    );
    assert_eq!(f.glob("~*").unwrap(), "~root");
    f.assert_outside_untouched();
}

#[test]
fn glob_never_lists_or_follows_outside_and_terminates_on_loops() {
    let f = Fixture::new();
    f.dir.link(f.outside(""), "dir_abs");
    f.dir.link("../outside", "dir_rel");
    f.dir.link("/", "root_link");
    f.dir.link("/proc/self/root", "proc_root");
    f.dir.link(".", "self_loop");
    f.dir.link("..", "parent_link");
    f.dir.link("loop_b", "loop_a");
    f.dir.link("loop_a", "loop_b");
    std::fs::create_dir_all(f.dir.ws_path("d/e")).unwrap();
    symlink("../..", f.dir.ws_path("d/e/up")).unwrap();
    // A deep tree, so the walk has real work and still ends.
    let mut deep = f.dir.ws_path("deep");
    for i in 0..40 {
        deep = deep.join(format!("l{i}"));
    }
    std::fs::create_dir_all(&deep).unwrap();
    for pattern in [
        "**",
        "**/*",
        "**/secret*",
        "**/deep.txt",
        "dir_abs/*",
        "dir_rel/**",
        "root_link/etc/*",
        "proc_root/**",
        "self_loop/**",
        "parent_link/**",
        "loop_a/**",
        "d/e/up/**",
        "*/secret.txt",
        "{dir_abs,dir_rel}/*",
        "**/passwd",
    ] {
        let listed = f.glob(pattern).unwrap();
        assert!(
            !listed.contains("secret") && !listed.contains("passwd"),
            "glob {pattern} listed outside: {listed}"
        );
        for line in listed.lines() {
            if line == "(no matches)" {
                continue;
            }
            let path = f.dir.ws_path(line);
            assert!(
                std::fs::symlink_metadata(&path).is_ok(),
                "{pattern}: {line} is not an entry of the workspace"
            );
            assert!(!line.split('/').any(|seg| seg == ".."), "{pattern}: {line}");
        }
    }
    let all = f.glob("**").unwrap();
    assert!(all.contains("deep/l0/l1"), "{all}");
    assert!(
        !all.contains("self_loop/"),
        "links are not descended: {all}"
    );
}

#[test]
fn a_hard_link_to_an_outside_file_is_never_written_through() {
    let f = Fixture::new();
    // Same filesystem (one temp dir), so the link can be made; as a bash command could.
    std::fs::hard_link(f.dir.base.join("outside/secret.txt"), f.dir.ws_path("hard")).unwrap();
    assert_eq!(f.write("hard").unwrap(), "Wrote 6 bytes to hard");
    std::fs::hard_link(
        f.dir.base.join("outside/sub/deep.txt"),
        f.dir.ws_path("hard2"),
    )
    .unwrap();
    // Reading (and so editing) a file with a second name is refused by default…
    assert_eq!(
        f.edit("hard2").unwrap_err().code,
        ErrorCode::PermissionDenied
    );
    // …and where hard links are allowed, the edit replaces the entry, never writes through.
    let allowed =
        common::direct::in_workspace(edit_file::spec(), &f.dir.ws.clone().allow_hard_links(true));
    let edited = call(
        &allowed,
        json!({"path": "hard2", "old_text": "secret", "new_text": "pwned"}),
    );
    assert_eq!(edited.unwrap(), "Edited hard2");
    // The workspace entries were replaced; the shared inodes outside kept their content.
    assert_eq!(
        std::fs::read_to_string(f.dir.ws_path("hard")).unwrap(),
        "pwned\n"
    );
    assert_eq!(
        std::fs::read_to_string(f.dir.ws_path("hard2")).unwrap(),
        "outside pwned\n"
    );
    f.assert_outside_untouched();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlink_planted_by_bash_earlier_in_the_same_turn_is_denied() {
    let f = Fixture::new();
    let engine = common::builtin_engine(&f.dir.ws, Vec::new());
    let outside_dir = f.outside("");
    let turn = vec![
        ToolCall::new(
            "plant",
            "bash",
            json!({"command": format!(
                "ln -s /etc/passwd leak && ln -s {outside_dir} outdir && \
                 ln -s ../outside/secret.txt rel && ln -s /proc/self/root proc && echo planted"
            )}),
        ),
        ToolCall::new("r1", "read_file", json!({"path": "leak"})),
        ToolCall::new("r2", "read_file", json!({"path": "outdir/secret.txt"})),
        ToolCall::new("r3", "read_file", json!({"path": "rel"})),
        ToolCall::new("r4", "read_file", json!({"path": "proc/etc/passwd"})),
        ToolCall::new(
            "w1",
            "write_file",
            json!({"path": "outdir/secret.txt", "content": "pwned"}),
        ),
        ToolCall::new(
            "w2",
            "write_file",
            json!({"path": "outdir/planted.txt", "content": "pwned"}),
        ),
        ToolCall::new(
            "e1",
            "edit_file",
            json!({"path": "rel", "old_text": "secret", "new_text": "pwned"}),
        ),
        ToolCall::new("g1", "glob", json!({"pattern": "outdir/*"})),
        ToolCall::new("g2", "glob", json!({"pattern": "**/secret*"})),
    ];
    let results = tokio::time::timeout(Duration::from_secs(10), engine.dispatch(turn))
        .await
        .unwrap()
        .expect("engine available");
    assert_eq!(results[0].content, "planted");
    for r in &results[1..8] {
        assert_eq!(
            r.error,
            Some(ErrorCode::PermissionDenied),
            "{}: {}",
            r.tool_use_id,
            r.content
        );
        assert!(!r.content.contains("root:") && !r.content.contains("outside secret"));
    }
    assert_eq!(results[8].content, "(no matches)");
    assert_eq!(results[9].content, "(no matches)");
    f.assert_outside_untouched();
}

/// Swaps `link` between pointing at `inside` and at `outside` as fast as it can (symlink to a
/// temp name, then rename over: each state is complete at every instant).
fn swapper(dir: PathBuf, link: &'static str, targets: [PathBuf; 2], stop: Arc<AtomicBool>) {
    let tmp = dir.join(format!(".{link}.swap"));
    let mut i = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let _ = std::fs::remove_file(&tmp);
        if symlink(&targets[i % 2], &tmp).is_ok() {
            let _ = std::fs::rename(&tmp, dir.join(link));
        }
        i += 1;
    }
}

#[test]
fn a_symlink_swapped_while_reads_and_writes_run_never_leads_outside() {
    let f = Fixture::new();
    std::fs::create_dir(f.dir.ws_path("realdir")).unwrap();
    std::fs::write(f.dir.ws_path("realdir/secret.txt"), INSIDE).unwrap();
    f.dir.link("inside.txt", "leaf");
    f.dir.link("realdir", "dir");
    let stop = Arc::new(AtomicBool::new(false));
    let ws_dir = f.dir.base.join("ws");
    let swappers = [
        {
            let (dir, stop) = (ws_dir.clone(), Arc::clone(&stop));
            let targets = [
                PathBuf::from("inside.txt"),
                f.dir.base.join("outside/secret.txt"),
            ];
            std::thread::spawn(move || swapper(dir, "leaf", targets, stop))
        },
        {
            let (dir, stop) = (ws_dir.clone(), Arc::clone(&stop));
            let targets = [PathBuf::from("realdir"), PathBuf::from("../outside")];
            std::thread::spawn(move || swapper(dir, "dir", targets, stop))
        },
    ];
    let (mut read_inside, mut denied) = (0usize, 0usize);
    for i in 0..1500 {
        for path in ["leaf", "dir/secret.txt"] {
            match f.read(path) {
                Ok(text) => {
                    assert!(!text.contains("outside"), "read {path} returned {text}");
                    read_inside += 1;
                }
                Err(e) => {
                    assert!(!e.detail.contains("outside secret"), "{e}");
                    denied += 1;
                }
            }
            let content = json!({"path": path, "content": format!("write {i}\n")});
            let _ = call(&f.write, content);
            let _ = call(
                &f.edit,
                json!({"path": path, "old_text": "write", "new_text": "edit"}),
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    for s in swappers {
        s.join().unwrap();
    }
    assert!(read_inside + denied == 3000);
    f.assert_outside_untouched();
}
