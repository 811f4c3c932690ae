//! Every `--flag` a user is told about exists where they are told to use it: each flag a line of
//! the README or of `docs/` names after `switchboard COMMAND` is one of that command's flags, and
//! each flag a message in the source names exists on the commands that file speaks for (any
//! command, for shared files). Flags are read from the real binary's `--help`.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// `--name` tokens of `text` (letters, digits and `-`, at least two characters after `--`).
fn flags_in(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i + 2 < bytes.len() {
        let starts = bytes[i] == b'-'
            && bytes[i + 1] == b'-'
            && bytes[i + 2].is_ascii_lowercase()
            && (i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'-'));
        if starts {
            let end = (i + 2..bytes.len())
                .find(|&j| !(bytes[j].is_ascii_alphanumeric() || bytes[j] == b'-'))
                .unwrap_or(bytes.len());
            let flag = text[i..end].trim_end_matches('-');
            if flag.len() > 3 {
                out.insert(flag.to_string());
            }
            i = end;
        } else {
            i += 1;
        }
    }
    out
}

fn help(args: &[&str]) -> String {
    let out = common::cli::switchboard()
        .args(args)
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success(), "{args:?} --help failed");
    String::from_utf8(out.stdout).unwrap()
}

/// Each command (`mcp list` as `mcp list`) and its flags.
fn commands() -> BTreeMap<String, BTreeSet<String>> {
    let top = help(&[]);
    let mut names: Vec<String> = top
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| *n != "help")
        .map(String::from)
        .collect();
    names.push("mcp list".into());
    names
        .into_iter()
        .map(|name| {
            let args: Vec<&str> = name.split(' ').collect();
            let mut flags = flags_in(&help(&args));
            flags.insert("--help".into());
            (name, flags)
        })
        .collect()
}

fn markdown_files(root: &Path) -> Vec<PathBuf> {
    let mut files = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

#[test]
fn every_flag_the_readme_and_the_docs_name_after_a_command_is_one_of_its_flags() {
    let commands = commands();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut wrong = Vec::new();
    let mut checked = 0;
    for file in markdown_files(root) {
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            // The command a line runs: the longest command name after `switchboard `.
            let Some(at) = line.find("switchboard ") else {
                continue;
            };
            // A line where another program's flags come first wraps switchboard (the MCP
            // inspector's `--cli switchboard mcp-serve … --method …`): its later flags may be the
            // wrapper's own, so it is not checked.
            if !flags_in(&line[..at]).is_empty() {
                continue;
            }
            let rest = &line[at + "switchboard ".len()..];
            let Some(command) = commands
                .keys()
                .filter(|c| {
                    rest.starts_with(c.as_str())
                        && rest[c.len()..]
                            .chars()
                            .next()
                            .is_none_or(|ch| !ch.is_ascii_alphanumeric() && ch != '-')
                })
                .max_by_key(|c| c.len())
            else {
                continue;
            };
            // Flags up to the end of the command (a pipe, a `;`, `&&` or a closing backtick).
            let end = rest.find(['|', ';', '`']).unwrap_or(rest.len());
            for flag in flags_in(&rest[..end]) {
                checked += 1;
                if !commands[command].contains(&flag) {
                    wrong.push(format!(
                        "{}:{}: `switchboard {command}` has no {flag}",
                        file.strip_prefix(root).unwrap().display(),
                        n + 1
                    ));
                }
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} flags found: the scan is broken"
    );
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The commands a source file's messages speak for (none listed: any command).
fn speaks_for(path: &str) -> &'static [&'static str] {
    const TABLE: [(&str, &[&str]); 5] = [
        ("src/serve/", &["serve"]),
        ("src/run_cmd.rs", &["run", "chat"]),
        ("src/load/", &["load"]),
        ("src/demo.rs", &["demo"]),
        ("src/mcp/command.rs", &["mcp-serve", "mcp list"]),
    ];
    TABLE
        .iter()
        .find(|(prefix, _)| path.starts_with(prefix))
        .map_or(&[], |(_, commands)| commands)
}

/// The messages of a Rust source: its string literals (outside comments) that hold a space —
/// a lone `"--pid"` is an argument handed to another program, not something a user reads.
fn string_literals(source: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in source.lines() {
        let code = line.trim_start();
        if code.starts_with("//") {
            continue;
        }
        let mut parts = code.split('"');
        parts.next();
        while let Some(inside) = parts.next() {
            if inside.contains(' ') {
                out.push(inside.to_string());
            }
            parts.next();
        }
    }
    out
}

#[test]
fn every_flag_a_message_names_exists_on_the_commands_its_file_speaks_for() {
    let commands = commands();
    let every: BTreeSet<&String> = commands.values().flatten().collect();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut stack = vec![root.join("src")];
    let mut wrong = Vec::new();
    let mut checked = 0;
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(root).unwrap().display().to_string();
            // The trampoline's options are passed by the engine, never typed by a user.
            if rel == "src/sandbox/exec.rs" {
                continue;
            }
            let source = std::fs::read_to_string(&path).unwrap();
            // Tests in the file speak for nobody.
            let source = source.split("#[cfg(test)]").next().unwrap_or_default();
            let owners = speaks_for(&rel);
            for literal in string_literals(source) {
                for flag in flags_in(&literal) {
                    checked += 1;
                    let ok = if owners.is_empty() {
                        every.contains(&flag)
                    } else {
                        owners.iter().all(|c| commands[*c].contains(&flag))
                    };
                    if !ok {
                        wrong.push(format!("{rel}: {literal:?} names {flag}"));
                    }
                }
            }
        }
    }
    assert!(
        checked > 10,
        "only {checked} flags found: the scan is broken"
    );
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn an_unenforceable_sandbox_names_flags_every_command_that_says_them_has() {
    // `engine_error` adds "(--sandbox best-effort, --sandbox off)" for the commands whose
    // engine runs the built-in tools: each of them must take `--sandbox`.
    let commands = commands();
    for command in ["run", "chat", "dispatch", "demo", "serve", "mcp-serve"] {
        assert!(
            commands[command].contains("--sandbox"),
            "`switchboard {command}` builds an engine but has no --sandbox"
        );
    }
}
