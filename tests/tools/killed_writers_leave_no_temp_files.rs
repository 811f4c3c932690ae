//! A writer killed mid-write (SIGKILL, the OOM killer) never leaves a half file, and the temp file
//! it leaves (`.NAME.switchboard-tmp-PID-N`) does not stay either: an engine starting on the
//! workspace removes it, and so does the next write into its directory. Temp files of writers
//! still alive are kept. `glob` of a hidden pattern (`.*`, `**/.*`) lists them like any hidden
//! file; `*` does not.

use crate::common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};
use serde_json::json;
use switchboard::Workspace;

use common::answers::{dispatch, turn};
use common::cli::BIN;

fn temp_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.contains(".switchboard-tmp-"))
        .collect();
    names.sort();
    names
}

/// The pid of a process that has exited.
fn dead_pid() -> u32 {
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

/// Starts `dispatch` writing `size` bytes to `big.txt`, SIGKILLs it once its temp file exists, and
/// returns whether the temp file was left behind (false if the write won the race).
fn kill_a_big_write(ws: &Path, size: usize) -> bool {
    let doc = turn(&[(
        "write_file",
        json!({"path": "big.txt", "content": "x".repeat(size)}),
    )])
    .to_string();
    let mut child = Command::new(BIN)
        .arg("dispatch")
        .arg("--workspace")
        .arg(ws)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(doc.as_bytes());
    });
    let started = Instant::now();
    while temp_files(ws).is_empty() && started.elapsed() < Duration::from_secs(30) {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let pid = Pid::from_raw(i32::try_from(child.id()).unwrap()).unwrap();
    let _ = kill_process(pid, Signal::KILL);
    child.wait().unwrap();
    writer.join().unwrap();
    !temp_files(ws).is_empty()
}

#[test]
fn a_temp_file_left_by_a_killed_writer_is_removed_when_the_next_engine_starts() {
    let ws = tempfile::tempdir().unwrap();
    let left = (0..5).any(|_| kill_a_big_write(ws.path(), 32 * 1024 * 1024));
    assert!(
        left,
        "a SIGKILL mid-write leaves the temp file (the defect's premise)"
    );
    assert!(!ws.path().join("big.txt").exists(), "never a half file");
    // The next engine on this workspace removes it before anything runs, even a read.
    let answers = dispatch(ws.path(), &[("glob", json!({"pattern": ".*"}))]);
    assert_eq!(answers[0].content, "(no matches)");
    assert!(
        temp_files(ws.path()).is_empty(),
        "{:?}",
        temp_files(ws.path())
    );
}

#[test]
fn the_next_write_into_a_directory_removes_temp_files_of_writers_that_are_gone() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = Workspace::open(tmp.path()).unwrap();
    let sub = tmp.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    let own = std::process::id();
    let dead = format!(".a.txt.switchboard-tmp-{}-0", dead_pid());
    // This process's pid with a counter it is not writing: an earlier process with the same pid.
    let reused = format!(".b.txt.switchboard-tmp-{own}-{}", u64::MAX);
    // pid 1 is alive: its file may be a write in progress and stays.
    let alive = ".c.txt.switchboard-tmp-1-0".to_string();
    for name in [&dead, &reused, &alive] {
        std::fs::write(sub.join(name), "leftover").unwrap();
    }
    // A write elsewhere leaves this directory alone.
    ws.write_atomic(Path::new("top.txt"), b"top", "top.txt")
        .unwrap();
    assert_eq!(temp_files(&sub).len(), 3);
    ws.write_atomic(Path::new("sub/new.txt"), b"new", "sub/new.txt")
        .unwrap();
    assert_eq!(temp_files(&sub), std::slice::from_ref(&alive));
    assert_eq!(std::fs::read_to_string(sub.join("new.txt")).unwrap(), "new");

    // The start-of-engine sweep walks the whole tree with the same rule.
    let deep = tmp.path().join("d1/d2");
    std::fs::create_dir_all(&deep).unwrap();
    std::fs::write(deep.join(&dead), "leftover").unwrap();
    assert_eq!(ws.remove_stale_temp_files(), 1);
    assert!(temp_files(&deep).is_empty());
    assert_eq!(temp_files(&sub), [alive]);
}

#[test]
fn hidden_glob_patterns_list_temp_files_and_plain_ones_do_not() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::create_dir(ws.path().join("sub")).unwrap();
    // pid 1 is alive, so the engine start keeps these.
    let top = ".a.txt.switchboard-tmp-1-7";
    let nested = "sub/.b.txt.switchboard-tmp-1-8";
    std::fs::write(ws.path().join(top), "x").unwrap();
    std::fs::write(ws.path().join(nested), "x").unwrap();
    std::fs::write(ws.path().join("visible.txt"), "x").unwrap();
    let answers = dispatch(
        ws.path(),
        &[
            ("glob", json!({"pattern": ".*"})),
            ("glob", json!({"pattern": "**/.*"})),
            ("glob", json!({"pattern": "**/*"})),
        ],
    );
    assert_eq!(answers[0].content, top);
    assert_eq!(answers[1].content, format!("{top}\n{nested}"));
    assert_eq!(answers[2].content, "sub\nvisible.txt");
}
