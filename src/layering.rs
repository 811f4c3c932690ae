//! The `layering` test: imports point down the layer table in the crate doc.
//!
//! The crate doc (`lib.rs`) holds a table of layers, bottom to top; each row names its modules
//! (`` `module` `` or `` `module::sub` ``). A module belongs to the row of the longest listed
//! prefix of its path, so `policy::rules` may sit below the rest of `policy`. This test reads that
//! table and every `use crate::…`, `use super::…` and inline `crate::…` / `super::…` path in
//! `src/` (comments, `#[cfg(test)]` modules and `$crate` paths left out), and fails — naming the
//! file, the line and both layers — when a module imports a module of a higher layer, or when a
//! file's module is missing from the table. A module may use modules of its own layer.
//!
//! Nothing here is compiled into the library: it is a test of the source tree.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// A module path, `["policy", "rules"]`; the crate root is empty.
type ModPath = Vec<String>;

/// One row of the table: its position (0 = bottom) and its name as written.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Layer {
    rank: usize,
    name: String,
}

/// The layer table: module path → layer.
#[derive(Debug, Default)]
struct Table {
    modules: BTreeMap<ModPath, Layer>,
}

/// An import that breaks the rule, or a module the table does not name.
#[derive(Debug, PartialEq, Eq)]
enum Violation {
    Upward {
        file: String,
        line: usize,
        from: String,
        from_layer: String,
        to: String,
        to_layer: String,
    },
    Missing {
        file: String,
        module: String,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Upward {
                file,
                line,
                from,
                from_layer,
                to,
                to_layer,
            } => write!(
                f,
                "{file}:{line}: `{from}` (layer \"{from_layer}\") imports `{to}` (layer \"{to_layer}\", higher)"
            ),
            Violation::Missing { file, module } => write!(
                f,
                "{file}: module `{module}` is in no row of the layer table in lib.rs"
            ),
        }
    }
}

impl Table {
    /// Reads the table from the crate doc: the `//!` lines of `lib.rs` after a line that starts
    /// with `//! | layer |`, one row per line, the modules in backticks in the second column.
    fn parse(lib_rs: &str) -> Result<Table, String> {
        let mut table = Table::default();
        let mut in_table = false;
        let mut rank = 0;
        for line in lib_rs.lines() {
            let Some(doc) = line.trim_start().strip_prefix("//!") else {
                if in_table {
                    break;
                }
                continue;
            };
            let doc = doc.trim();
            if !in_table {
                in_table = doc.starts_with("| layer |");
                continue;
            }
            if !doc.starts_with('|') {
                break;
            }
            let cells: Vec<&str> = doc.trim_matches('|').split('|').map(str::trim).collect();
            if cells.len() < 2 || cells[0].starts_with("---") {
                continue;
            }
            let layer = Layer {
                rank,
                name: cells[0].to_string(),
            };
            rank += 1;
            for module in cells[1].split('`').skip(1).step_by(2) {
                let path: ModPath = module.split("::").map(str::to_string).collect();
                if let Some(old) = table.modules.insert(path, layer.clone()) {
                    return Err(format!(
                        "module `{module}` is in two rows: \"{}\" and \"{}\"",
                        old.name, layer.name
                    ));
                }
            }
        }
        if table.modules.is_empty() {
            return Err("lib.rs has no layer table (a doc line starting `| layer |`)".into());
        }
        Ok(table)
    }

    /// The layer of a module: the row of its longest listed prefix.
    fn layer_of(&self, module: &[String]) -> Option<&Layer> {
        (1..=module.len())
            .rev()
            .find_map(|n| self.modules.get(&module[..n]))
    }
}

/// The module of a source file (`src/a/b.rs` and `src/a/b/mod.rs` → `a::b`; `lib.rs`, and the
/// binaries' roots `main.rs` and `bin/*.rs`, which use the library from outside → root).
fn module_of(src: &Path, file: &Path) -> ModPath {
    let rel = file.strip_prefix(src).unwrap_or(file).with_extension("");
    let mut parts: ModPath = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts == ["lib"] || parts == ["main"] || (parts.len() == 2 && parts[0] == "bin") {
        return Vec::new();
    }
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// Every `.rs` file below `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// The source with comments, string literals' contents and `#[cfg(test)]` items blanked out
/// (newlines kept, so line numbers stay true).
fn code_only(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |out: &mut String, s: &[u8]| {
        for &b in s {
            out.push(if b == b'\n' { '\n' } else { ' ' });
        }
    };
    while i < bytes.len() {
        let rest = &bytes[i..];
        if rest.starts_with(b"//") {
            let end = rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
            blank(&mut out, &rest[..end]);
            i += end;
        } else if rest.starts_with(b"/*") {
            let end = text[i + 2..].find("*/").map_or(rest.len(), |e| e + 4);
            blank(&mut out, &rest[..end]);
            i += end;
        } else if rest[0] == b'"' {
            // A string literal (raw strings with `#` are rare in paths; their text is blanked
            // up to the closing quote, which is what matters here).
            let mut j = 1;
            while j < rest.len() && rest[j] != b'"' {
                j += if rest[j] == b'\\' { 2 } else { 1 };
            }
            let end = (j + 1).min(rest.len());
            blank(&mut out, &rest[..end]);
            i += end;
        } else if rest[0] == b'\'' && rest.len() > 2 && (rest[2] == b'\'' || rest[1] == b'\\') {
            // A char literal such as '"' or '\''.
            let end = rest[1..]
                .iter()
                .position(|&b| b == b'\'')
                .map_or(1, |p| p + 2)
                .max(3);
            blank(&mut out, &rest[..end.min(rest.len())]);
            i += end.min(rest.len());
        } else {
            let ch = text[i..].chars().next().unwrap_or(' ');
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    strip_cfg_test(&out)
}

/// Blanks every item that follows a `#[cfg(test)]` line (a `mod tests { … }` or `mod tests;`).
fn strip_cfg_test(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut lines = code.split_inclusive('\n');
    while let Some(line) = lines.next() {
        if line.trim() != "#[cfg(test)]" {
            out.push_str(line);
            continue;
        }
        let mut depth = 0i32;
        let mut opened = false;
        let mut item = line;
        loop {
            out.push_str(&" ".repeat(item.trim_end_matches('\n').len()));
            if item.ends_with('\n') {
                out.push('\n');
            }
            if !std::ptr::eq(item, line) {
                depth += item.matches('{').count() as i32 - item.matches('}').count() as i32;
                opened |= item.contains('{');
                if (opened && depth <= 0) || (!opened && item.trim_end().ends_with(';')) {
                    break;
                }
            }
            match lines.next() {
                Some(next) => item = next,
                None => break,
            }
        }
    }
    out
}

/// One path found in the code: its line and its segments, starting with `crate`, `super` or
/// `self` (`self` only in `use` lines).
#[derive(Debug, PartialEq, Eq)]
struct Found {
    line: usize,
    segments: Vec<String>,
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Every `crate::…` / `super::…` path in the code, with `use` groups expanded.
fn paths_in(code: &str) -> Vec<Found> {
    let bytes = code.as_bytes();
    let line_at = |pos: usize| code[..pos].matches('\n').count() + 1;
    let mut found = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let word_start = i == 0 || !is_ident(bytes[i - 1]);
        let rest = &code[i..];
        if word_start && rest.starts_with("use ") {
            let end = rest.find(';').map_or(rest.len(), |e| e);
            let body = &rest[4..end];
            let mut leaves = Vec::new();
            expand_use(body, Vec::new(), &mut leaves);
            for segments in leaves {
                if matches!(
                    segments.first().map(String::as_str),
                    Some("crate" | "super" | "self")
                ) {
                    found.push(Found {
                        line: line_at(i),
                        segments,
                    });
                }
            }
            i += end.max(1);
            continue;
        }
        let head = ["crate::", "super::"]
            .into_iter()
            .find(|h| rest.starts_with(h));
        if word_start && head.is_some() && (i == 0 || bytes[i - 1] != b'$') {
            let mut j = i;
            let mut segments = Vec::new();
            loop {
                let start = j;
                while j < bytes.len() && is_ident(bytes[j]) {
                    j += 1;
                }
                if start == j {
                    break;
                }
                segments.push(code[start..j].to_string());
                if code[j..].starts_with("::")
                    && code[j + 2..].starts_with(|c: char| c.is_alphanumeric() || c == '_')
                {
                    j += 2;
                } else {
                    break;
                }
            }
            found.push(Found {
                line: line_at(i),
                segments,
            });
            i = j.max(i + 1);
            continue;
        }
        i += code[i..].chars().next().map_or(1, char::len_utf8);
    }
    found
}

/// Expands one `use` tree (`crate::a::{b, c::{d, e}}`) into its leaf paths.
fn expand_use(tree: &str, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    let tree = tree.trim();
    if let Some(open) = tree.find('{') {
        let mut base = prefix;
        base.extend(segments_of(&tree[..open]));
        let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
        let mut depth = 0;
        let mut start = 0;
        for (k, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    expand_use(&inner[start..k], base.clone(), out);
                    start = k + 1;
                }
                _ => {}
            }
        }
        expand_use(&inner[start..], base, out);
    } else {
        let mut path = prefix;
        let tree = tree.split(" as ").next().unwrap_or(tree);
        path.extend(segments_of(tree));
        // `use crate::a::{self}` names `a` itself.
        if path.last().is_some_and(|s| s == "self") && path.len() > 1 {
            path.pop();
        }
        if !path.is_empty() {
            out.push(path);
        }
    }
}

fn segments_of(path: &str) -> impl Iterator<Item = String> + '_ {
    path.split("::")
        .map(str::trim)
        .filter(|s| !s.is_empty() && *s != "*")
        .map(str::to_string)
}

/// The module a path names: `crate`/`super`/`self` resolved against `current`, then the longest
/// prefix that is a module of the crate; a name re-exported at the root (`crate::Engine`) is
/// taken from `lib.rs`'s `pub use` lines. `None` for the crate root itself.
fn target_of(
    found: &Found,
    current: &[String],
    modules: &[ModPath],
    reexports: &BTreeMap<String, ModPath>,
) -> Option<ModPath> {
    let mut segments = found.segments.iter();
    let mut base: ModPath = match segments.next()?.as_str() {
        "crate" => Vec::new(),
        "self" => current.to_vec(),
        "super" => {
            // In `a/b.rs` (module a::b) `super` is `a`; in `a/mod.rs` (module a) it is the root.
            let mut m = current.to_vec();
            m.pop();
            m
        }
        _ => return None,
    };
    let rest: Vec<&String> = segments.collect();
    let mut rest = rest.into_iter().peekable();
    while rest.peek().is_some_and(|s| *s == "super") {
        base.pop();
        rest.next();
    }
    let mut full = base;
    full.extend(rest.cloned());
    let longest = (0..=full.len())
        .rev()
        .find(|&n| modules.iter().any(|m| m[..] == full[..n]))
        .unwrap_or(0);
    if longest == 0 {
        // The root: a re-exported name, or the root itself.
        return full.first().and_then(|name| reexports.get(name)).cloned();
    }
    Some(full[..longest].to_vec())
}

/// `pub use a::b::{X, Y};` lines of `lib.rs`: `X` → `a::b`.
fn reexports_of(lib_rs: &str) -> BTreeMap<String, ModPath> {
    let mut map = BTreeMap::new();
    let code = code_only(lib_rs);
    let mut rest = code.as_str();
    while let Some(at) = rest.find("pub use ") {
        rest = &rest[at + 8..];
        let end = rest.find(';').unwrap_or(rest.len());
        let mut leaves = Vec::new();
        expand_use(&rest[..end], Vec::new(), &mut leaves);
        for mut leaf in leaves {
            if leaf.first().is_some_and(|s| s == "crate") {
                leaf.remove(0);
            }
            if let Some(name) = leaf.pop() {
                map.insert(name, leaf);
            }
        }
        rest = &rest[end..];
    }
    map
}

/// Checks the tree below `src` against the table in `src/lib.rs`.
fn check(src: &Path) -> Result<Vec<Violation>, String> {
    let lib_rs = std::fs::read_to_string(src.join("lib.rs"))
        .map_err(|e| format!("cannot read {}: {e}", src.join("lib.rs").display()))?;
    let table = Table::parse(&lib_rs)?;
    let reexports = reexports_of(&lib_rs);
    let files = rust_files(src);
    let modules: Vec<ModPath> = files.iter().map(|f| module_of(src, f)).collect();
    let test_only = test_only_modules(src, &files);
    let name = |m: &[String]| {
        if m.is_empty() {
            "crate".to_string()
        } else {
            m.join("::")
        }
    };
    let mut violations = Vec::new();
    for (file, module) in files.iter().zip(&modules) {
        let shown = file
            .strip_prefix(src.parent().unwrap_or(src))
            .unwrap_or(file)
            .display()
            .to_string();
        if module.is_empty() || test_only.contains(module) {
            continue;
        }
        let Some(from_layer) = table.layer_of(module) else {
            violations.push(Violation::Missing {
                file: shown,
                module: name(module),
            });
            continue;
        };
        let text =
            std::fs::read_to_string(file).map_err(|e| format!("cannot read {shown}: {e}"))?;
        for found in paths_in(&code_only(&text)) {
            let Some(target) = target_of(&found, module, &modules, &reexports) else {
                continue;
            };
            let Some(to_layer) = table.layer_of(&target) else {
                continue; // reported as missing for its own file
            };
            if to_layer.rank > from_layer.rank {
                violations.push(Violation::Upward {
                    file: shown.clone(),
                    line: found.line,
                    from: name(module),
                    from_layer: from_layer.name.clone(),
                    to: name(&target),
                    to_layer: to_layer.name.clone(),
                });
            }
        }
    }
    Ok(violations)
}

/// Modules declared only under `#[cfg(test)]` (`#[cfg(test)] mod tests;` → `parent::tests`).
fn test_only_modules(src: &Path, files: &[PathBuf]) -> Vec<ModPath> {
    let mut out = Vec::new();
    for file in files {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        let module = module_of(src, file);
        let mut lines = text.lines();
        while let Some(line) = lines.next() {
            if line.trim() != "#[cfg(test)]" {
                continue;
            }
            let Some(next) = lines.next() else { break };
            let next = next.trim();
            let decl = next
                .strip_prefix("pub(crate) ")
                .or_else(|| next.strip_prefix("pub "))
                .unwrap_or(next);
            if let Some(name) = decl.strip_prefix("mod ").and_then(|n| n.strip_suffix(';')) {
                let mut m = module.clone();
                m.push(name.trim().to_string());
                out.push(m);
            }
        }
    }
    out
}

#[test]
fn layering_imports_of_src_point_down_the_table_in_lib_rs() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let violations = check(&src).unwrap_or_else(|e| panic!("{e}"));
    let report: Vec<String> = violations.iter().map(ToString::to_string).collect();
    assert!(
        report.is_empty(),
        "{} import(s) break the layer table:\n{}",
        report.len(),
        report.join("\n")
    );
}

/// The one file allowed `unsafe` code (see the crate doc).
const UNSAFE_EXCEPTION: &str = "sandbox/fork.rs";

#[test]
fn layering_unsafe_code_is_allowed_in_one_reviewed_file_only() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let allowing: Vec<String> = rust_files(&src)
        .into_iter()
        .filter(|file| {
            let text = std::fs::read_to_string(file).unwrap_or_default();
            code_only(&text).contains("allow(unsafe_code)")
        })
        .map(|file| {
            let rel = file.strip_prefix(&src).unwrap_or(&file);
            rel.display().to_string()
        })
        .collect();
    assert_eq!(allowing, [UNSAFE_EXCEPTION], "files that allow unsafe code");
}

#[cfg(test)]
mod fixture {
    use super::*;

    /// A small tree: `base` at the bottom, `mid` (with `mid::low` listed one row lower), `top`.
    /// A fixture tree's `src/`; the tree is removed when this is dropped.
    struct Tree(PathBuf);

    impl Drop for Tree {
        fn drop(&mut self) {
            if let Some(dir) = self.0.parent() {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }

    impl std::ops::Deref for Tree {
        type Target = Path;
        fn deref(&self) -> &Path {
            &self.0
        }
    }

    fn tree(files: &[(&str, &str)]) -> Tree {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("switchboard-layering-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let src = dir.join("src");
        for (path, text) in files {
            let file = src.join(path);
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(file, text).unwrap();
        }
        Tree(src)
    }

    const LIB: &str = "//! The crate.\n//!\n//! | layer | modules |\n//! | --- | --- |\n\
        //! | base | `base`, `mid::low` |\n//! | middle | `mid` |\n//! | top | `top` |\n\
        \nmod base;\nmod mid;\nmod top;\npub use base::Thing;\n";

    #[test]
    fn layering_catches_an_upward_import_with_file_line_and_layers() {
        let src = tree(&[
            ("lib.rs", LIB),
            (
                "base.rs",
                "pub struct Thing;\n\nfn f() {\n    let _ = crate::top::go();\n}\n",
            ),
            ("mid/mod.rs", "mod low;\nuse crate::base::Thing;\n"),
            ("mid/low.rs", "use super::super::base::Thing;\n"),
            (
                "top.rs",
                "use crate::{Thing, mid::{self}};\npub fn go() {}\n",
            ),
        ]);
        let violations = check(&src).unwrap();
        assert_eq!(
            violations,
            vec![Violation::Upward {
                file: "src/base.rs".into(),
                line: 4,
                from: "base".into(),
                from_layer: "base".into(),
                to: "top".into(),
                to_layer: "top".into(),
            }]
        );
        assert_eq!(
            violations[0].to_string(),
            "src/base.rs:4: `base` (layer \"base\") imports `top` (layer \"top\", higher)"
        );
    }

    #[test]
    fn layering_sees_grouped_super_and_reexported_imports() {
        let src = tree(&[
            ("lib.rs", LIB),
            ("base.rs", "pub struct Thing;\n"),
            // `mid::low` sits in the bottom row: importing the rest of `mid` goes up.
            ("mid/mod.rs", "mod low;\npub fn m() {}\n"),
            (
                "mid/low.rs",
                "// crate::top::go in a comment is no import\nuse super::{m};\n",
            ),
            ("top.rs", "pub fn go() {}\n"),
        ]);
        let violations = check(&src).unwrap();
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(
            violations[0]
                .to_string()
                .starts_with("src/mid/low.rs:2: `mid::low` (layer \"base\") imports `mid`"),
            "{}",
            violations[0]
        );
    }

    #[test]
    fn layering_reports_a_module_missing_from_the_table() {
        let src = tree(&[
            ("lib.rs", LIB),
            ("base.rs", "pub struct Thing;\n"),
            ("stray.rs", "use crate::base::Thing;\n"),
            (
                "top.rs",
                "#[cfg(test)]\nmod tests {\n    use crate::stray::X;\n}\n",
            ),
        ]);
        let violations = check(&src).unwrap();
        assert_eq!(
            violations,
            vec![Violation::Missing {
                file: "src/stray.rs".into(),
                module: "stray".into(),
            }]
        );
    }

    #[test]
    fn layering_ignores_test_modules_strings_and_macro_paths() {
        let src = tree(&[
            ("lib.rs", LIB),
            (
                "base.rs",
                "pub struct Thing;\nconst S: &str = \"crate::top::go\";\n\
                 macro_rules! m { () => { $crate::top::go() } }\n\
                 #[cfg(test)]\nmod tests {\n    use crate::top::go;\n}\n",
            ),
            ("top.rs", "pub fn go() {}\n"),
        ]);
        assert_eq!(check(&src).unwrap(), vec![]);
    }
}
