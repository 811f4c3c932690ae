//! Writes lose nothing: `write_file` and `edit_file` replace a file whole or not at all — a reader
//! never sees half a file, a failure leaves the old content and no temp file, the mode (and, as
//! root, the owner) is kept, and an edit keeps every byte it did not replace (BOM, CRLF, lone CR,
//! a missing final newline).

use crate::common;

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::json;
use switchboard::protocol::ErrorCode;
use switchboard::tool::{ToolOutcome, ToolSpec};
use switchboard::tools::{edit_file, write_file};

use common::direct::call_tool as call;
use common::workspace::temp_workspace;

struct Files {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    write: ToolSpec,
    edit: ToolSpec,
}

impl Files {
    fn new() -> Self {
        let (tmp, ws) = temp_workspace();
        Files {
            root: ws.root().to_path_buf(),
            write: common::direct::in_workspace(write_file::spec(), &ws),
            edit: common::direct::in_workspace(edit_file::spec(), &ws),
            _tmp: tmp,
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    fn write(&self, path: &str, content: &str) -> ToolOutcome {
        call(&self.write, json!({"path": path, "content": content}))
    }

    fn edit(&self, path: &str, old: &str, new: &str) -> ToolOutcome {
        call(
            &self.edit,
            json!({"path": path, "old_text": old, "new_text": new}),
        )
    }

    /// Every entry under the workspace (relative paths), recursively.
    fn tree(&self) -> Vec<String> {
        fn walk(dir: &Path, root: &Path, out: &mut Vec<String>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                out.push(path.strip_prefix(root).unwrap().display().to_string());
                if std::fs::symlink_metadata(&path).unwrap().is_dir() {
                    walk(&path, root, out);
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.root, &self.root, &mut out);
        out.sort();
        out
    }

    fn assert_no_temp_files(&self) {
        let temps: Vec<String> = self
            .tree()
            .into_iter()
            .filter(|p| p.contains("switchboard-tmp"))
            .collect();
        assert!(temps.is_empty(), "temp files left: {temps:?}");
    }
}

#[test]
fn edits_keep_every_byte_they_do_not_replace() {
    let f = Files::new();
    let cases: [(&[u8], &str, &str, &[u8]); 7] = [
        (
            b"\xEF\xBB\xBFfirst\r\nsecond\r\nthird",
            "first",
            "1st",
            b"\xEF\xBB\xBF1st\r\nsecond\r\nthird",
        ),
        (b"a\r\nb\r\nc\r\n", "c", "C", b"a\r\nb\r\nC\r\n"),
        (b"no final newline", "final", "last", b"no last newline"),
        (b"one\rtwo\rthree", "two", "2", b"one\r2\rthree"),
        (
            b"mixed\nends\r\nhere\r",
            "ends",
            "line ends",
            b"mixed\nline ends\r\nhere\r",
        ),
        (
            b"trailing spaces   \n\t\n",
            "spaces",
            "blanks",
            b"trailing blanks   \n\t\n",
        ),
        (b"\xEF\xBB\xBF", "\u{FEFF}", "", b""),
    ];
    for (i, (before, old, new, after)) in cases.into_iter().enumerate() {
        let name = format!("f{i}.txt");
        std::fs::write(f.path(&name), before).unwrap();
        assert_eq!(f.edit(&name, old, new).unwrap(), format!("Edited {name}"));
        assert_eq!(
            std::fs::read(f.path(&name)).unwrap(),
            after,
            "case {i}: {:?}",
            String::from_utf8_lossy(before)
        );
    }
    f.assert_no_temp_files();
}

#[test]
fn an_edit_replaces_only_the_first_match_as_documented() {
    let f = Files::new();
    std::fs::write(f.path("dup.txt"), "x = 1\nx = 1\nx = 1\n").unwrap();
    f.edit("dup.txt", "x = 1", "x = 2").unwrap();
    assert_eq!(
        std::fs::read_to_string(f.path("dup.txt")).unwrap(),
        "x = 2\nx = 1\nx = 1\n"
    );
    // Overlapping candidates: the leftmost match wins.
    std::fs::write(f.path("overlap.txt"), "aaaa").unwrap();
    f.edit("overlap.txt", "aa", "b").unwrap();
    assert_eq!(
        std::fs::read_to_string(f.path("overlap.txt")).unwrap(),
        "baa"
    );
    assert!(f.edit.description.contains("FIRST"));
}

#[test]
fn the_mode_is_kept_by_writes_and_edits() {
    let f = Files::new();
    for (name, mode) in [("script.sh", 0o755), ("private", 0o600), ("shared", 0o664)] {
        std::fs::write(f.path(name), "echo old\n").unwrap();
        std::fs::set_permissions(f.path(name), std::fs::Permissions::from_mode(mode)).unwrap();
        f.write(name, "echo new\n").unwrap();
        let got = std::fs::metadata(f.path(name))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777;
        assert_eq!(got, mode, "write {name}");
        f.edit(name, "new", "newer").unwrap();
        let got = std::fs::metadata(f.path(name))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777;
        assert_eq!(got, mode, "edit {name}");
    }
    f.assert_no_temp_files();
}

#[test]
fn as_root_the_owner_is_kept_too() {
    if !rustix::process::geteuid().is_root() {
        return; // Only root may give a file to another user.
    }
    let f = Files::new();
    std::fs::write(f.path("theirs.txt"), "old").unwrap();
    std::os::unix::fs::chown(f.path("theirs.txt"), Some(4321), Some(4322)).unwrap();
    f.write("theirs.txt", "new").unwrap();
    let meta = std::fs::metadata(f.path("theirs.txt")).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (4321, 4322));
    f.edit("theirs.txt", "new", "newer").unwrap();
    let meta = std::fs::metadata(f.path("theirs.txt")).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (4321, 4322));
}

#[test]
fn failures_keep_the_old_content_and_leave_no_temp_file() {
    let f = Files::new();
    std::fs::write(f.path("file"), "I am a file").unwrap();
    std::fs::create_dir(f.path("dir")).unwrap();
    std::fs::write(f.path("dir/kept.txt"), "kept").unwrap();
    let fifo = std::process::Command::new("mkfifo")
        .arg(f.path("fifo"))
        .status()
        .unwrap();
    assert!(fifo.success());
    let before = f.tree();
    for (path, what) in [
        ("file/child.txt", "parent is a file"),
        ("file/deeper/child.txt", "ancestor is a file"),
        ("dir", "target is a directory"),
        ("fifo", "target is a FIFO"),
        (".", "the root"),
    ] {
        let err = f.write(path, "new").unwrap_err();
        assert_eq!(err.code, ErrorCode::ExecutionError, "{what}: {err}");
    }
    for path in ["fifo", "dir"] {
        let err = f.edit(path, "a", "b").unwrap_err();
        assert_eq!(err.code, ErrorCode::ExecutionError, "{path}: {err}");
    }
    assert_eq!(f.tree(), before, "nothing was created or removed");
    assert_eq!(
        std::fs::read_to_string(f.path("file")).unwrap(),
        "I am a file"
    );
    assert_eq!(
        std::fs::read_to_string(f.path("dir/kept.txt")).unwrap(),
        "kept"
    );
    assert!(
        std::fs::symlink_metadata(f.path("fifo"))
            .unwrap()
            .file_type()
            .is_fifo()
    );
}

/// Clears the immutable flag again on drop, so the temp dir can be removed.
struct Immutable(PathBuf);

impl Immutable {
    fn set(path: PathBuf) -> Option<Self> {
        let ok = std::process::Command::new("chattr")
            .arg("+i")
            .arg(&path)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(Immutable(path))
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = std::process::Command::new("chattr")
            .arg("-i")
            .arg(&self.0)
            .status();
    }
}

#[test]
fn a_rename_that_fails_after_the_temp_file_was_written_removes_it() {
    let f = Files::new();
    std::fs::write(f.path("locked.txt"), "old content").unwrap();
    // An immutable target: the temp file is created and written, the rename over it fails.
    let Some(_guard) = Immutable::set(f.path("locked.txt")) else {
        eprintln!("chattr +i unsupported here (needs root and ext4/xfs/btrfs); skipped");
        return;
    };
    let err = f.write("locked.txt", "new content").unwrap_err();
    assert_eq!(err.code, ErrorCode::ExecutionError, "{err}");
    let err = f.edit("locked.txt", "old", "new").unwrap_err();
    assert_eq!(err.code, ErrorCode::ExecutionError, "{err}");
    assert_eq!(
        std::fs::read_to_string(f.path("locked.txt")).unwrap(),
        "old content"
    );
    f.assert_no_temp_files();
    assert_eq!(f.tree(), ["locked.txt"]);
}

#[test]
fn a_read_only_directory_refuses_the_write_and_keeps_nothing() {
    let f = Files::new();
    std::fs::create_dir(f.path("ro")).unwrap();
    std::fs::write(f.path("ro/file.txt"), "old").unwrap();
    // Root ignores mode bits; the immutable flag binds root too.
    let guard = if rustix::process::geteuid().is_root() {
        match Immutable::set(f.path("ro")) {
            Some(g) => Some(g),
            None => {
                eprintln!("chattr +i unsupported here; skipped");
                return;
            }
        }
    } else {
        std::fs::set_permissions(f.path("ro"), std::fs::Permissions::from_mode(0o555)).unwrap();
        None
    };
    let err = f.write("ro/file.txt", "new").unwrap_err();
    assert_eq!(err.code, ErrorCode::ExecutionError, "{err}");
    let err = f.write("ro/other.txt", "new").unwrap_err();
    assert_eq!(err.code, ErrorCode::ExecutionError, "{err}");
    drop(guard);
    std::fs::set_permissions(f.path("ro"), std::fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(f.tree(), ["ro", "ro/file.txt"]);
    assert_eq!(
        std::fs::read_to_string(f.path("ro/file.txt")).unwrap(),
        "old"
    );
}

#[test]
fn a_reader_never_sees_a_partial_file_while_writes_replace_it() {
    let f = Files::new();
    let a = "a".repeat(256 * 1024);
    let b = "b".repeat(256 * 1024);
    f.write("big.txt", &a).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (path, stop) = (f.path("big.txt"), Arc::clone(&stop));
        let (a, b) = (a.clone(), b.clone());
        std::thread::spawn(move || {
            let mut reads = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let got = std::fs::read_to_string(&path).unwrap();
                assert!(
                    got == a || got == b,
                    "partial content of {} bytes",
                    got.len()
                );
                reads += 1;
            }
            reads
        })
    };
    for i in 0..200 {
        f.write("big.txt", if i % 2 == 0 { &b } else { &a })
            .unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    assert!(reader.join().unwrap() > 0);
    f.assert_no_temp_files();
}

#[test]
fn concurrent_writes_to_one_file_leave_one_whole_version_and_no_temp_files() {
    let f = Arc::new(Files::new());
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let f = Arc::clone(&f);
            std::thread::spawn(move || {
                for i in 0..50 {
                    let content = format!("{t}:{i}:").repeat(1000);
                    f.write("shared.txt", &content).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let got = std::fs::read_to_string(f.path("shared.txt")).unwrap();
    let unit = &got[..=got.match_indices(':').nth(1).unwrap().0];
    assert_eq!(got, unit.repeat(1000), "one writer's whole content");
    f.assert_no_temp_files();
}

#[test]
fn a_name_at_the_length_limit_can_be_written() {
    let f = Files::new();
    let name = "n".repeat(255);
    assert_eq!(
        f.write(&name, "x").unwrap(),
        format!("Wrote 1 bytes to {name}")
    );
    f.edit(&name, "x", "y").unwrap();
    assert_eq!(std::fs::read_to_string(f.path(&name)).unwrap(), "y");
    let wide = "é".repeat(127); // 254 bytes
    f.write(&wide, "z").unwrap();
    f.assert_no_temp_files();
}
