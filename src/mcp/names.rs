//! Registry names of MCP tools: `mcp__<server>__<tool>`, within the registry's 64 characters.
//!
//! The rule (pure functions, no state):
//!
//! 1. The server part is the server name as configured (already `[A-Za-z0-9_-]`, at most 32
//!    characters and without `__`, checked when the configuration loads).
//! 2. The tool part is the tool's raw name with every character outside `[A-Za-z0-9_-]` replaced
//!    by `_`.
//! 3. A name keeps this plain form unless it is longer than 64 characters, or it collides with the
//!    plain form of another tool of the same server *and* its own tool part had to be changed by
//!    step 2 (a tool whose raw name needed no change keeps its plain name).
//! 4. Otherwise it becomes `<plain form cut to 55 characters>_<8 hex digits>`, the digits being the
//!    FNV-1a 64-bit hash of the raw tool name (stable across runs, machines and list orders).
//!
//! The raw name is what goes over the protocol; the registry name is only what the model sees.

use std::collections::HashMap;

/// Longest registry name.
pub const MAX_NAME: usize = 64;
/// Characters of the hash suffix, `_` included.
const SUFFIX: usize = 9;

/// `mcp__<server>__`: the prefix every registry name of `server`'s tools starts with.
pub fn prefix(server: &str) -> String {
    format!("mcp__{server}__")
}

/// Replaces every character outside `[A-Za-z0-9_-]` by `_` (an empty name becomes `_`).
pub fn sanitize(part: &str) -> String {
    if part.is_empty() {
        return "_".into();
    }
    part.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// FNV-1a, 64 bits: small, stable, and good enough to tell a handful of names apart.
fn fnv1a(text: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn suffixed(plain: &str, raw: &str) -> String {
    let keep = plain.len().min(MAX_NAME - SUFFIX);
    // `plain` is ASCII, so any byte index is a character boundary.
    format!("{}_{:08x}", &plain[..keep], fnv1a(raw) as u32)
}

/// The registry name of each of `server`'s tools, in the order given (see the module docs).
pub fn registry_names(server: &str, raw_tools: &[&str]) -> Vec<String> {
    let pre = prefix(server);
    let plain: Vec<String> = raw_tools
        .iter()
        .map(|raw| format!("{pre}{}", sanitize(raw)))
        .collect();
    let mut count: HashMap<&str, usize> = HashMap::new();
    for p in &plain {
        *count.entry(p.as_str()).or_default() += 1;
    }
    raw_tools
        .iter()
        .zip(&plain)
        .map(|(raw, p)| {
            let changed = sanitize(raw) != *raw;
            let collides = count[p.as_str()] > 1 && changed;
            if p.len() > MAX_NAME || collides {
                suffixed(p, raw)
            } else {
                p.clone()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::valid_tool_name;

    #[test]
    fn plain_names_join_server_and_tool() {
        assert_eq!(
            registry_names("fs", &["read_file", "list-dir"]),
            ["mcp__fs__read_file", "mcp__fs__list-dir"]
        );
        assert_eq!(
            registry_names("s", &["get.time", "ünï"]),
            ["mcp__s__get_time", "mcp__s___n_"]
        );
    }

    #[test]
    fn collisions_after_sanitizing_get_a_stable_hash_suffix() {
        let names = registry_names("s", &["a.b", "a_b", "a b"]);
        // `a_b` needed no change and keeps its plain name; the other two are told apart.
        assert_eq!(names[1], "mcp__s__a_b");
        assert!(names[0].starts_with("mcp__s__a_b_") && names[0].len() == 20);
        assert!(names[2].starts_with("mcp__s__a_b_") && names[2].len() == 20);
        assert_ne!(names[0], names[2]);
        // Stable: the same raw name gets the same suffix whatever the order or neighbours.
        assert_eq!(
            registry_names("s", &["get_time", "get.time", "get time"]),
            [
                "mcp__s__get_time",
                "mcp__s__get_time_429f7372",
                "mcp__s__get_time_90a98794"
            ]
        );
        let again = registry_names("s", &["a b", "a.b"]);
        assert_eq!(again, [names[2].clone(), names[0].clone()]);
    }

    #[test]
    fn long_names_are_cut_to_64_with_the_suffix() {
        let long = "x".repeat(80);
        let other = format!("{}y", "x".repeat(79));
        let names = registry_names("server-with-a-long-name-32-chars", &[&long, &other]);
        for n in &names {
            assert_eq!(n.len(), MAX_NAME);
            assert!(valid_tool_name(n), "{n}");
        }
        assert_ne!(names[0], names[1]);
        assert_eq!(fnv1a("abc"), 0xe71f_a219_0541_574b);
    }

    #[test]
    fn every_name_is_a_valid_registry_name() {
        for raw in ["", "a/b/c", "tool:with:colons", "😀", &"é".repeat(40)] {
            let n = &registry_names("srv", &[raw])[0];
            assert!(valid_tool_name(n), "{raw:?} -> {n}");
            assert!(n.starts_with(&prefix("srv")));
        }
    }
}
