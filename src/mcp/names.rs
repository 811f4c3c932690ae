//! Registry names of MCP tools: `mcp__<server>__<tool>`, within the registry's 64 characters,
//! and unique by construction — across servers and within one.
//!
//! The rule (pure functions, no state):
//!
//! 1. The server part is the server name as configured: 1–32 of `[A-Za-z0-9_-]`, without `__`
//!    and not ending in `_` (checked when the configuration loads). So `mcp__<server>__` is
//!    followed by the first `__` after `mcp__`, no server's prefix is the beginning of another's
//!    (`a` and `a_` would give `mcp__a__` and `mcp__a___`), and two servers can never produce the
//!    same name.
//! 2. The tool part is the tool's raw name with every character outside `[A-Za-z0-9_-]` replaced
//!    by `_`.
//! 3. A name keeps this plain form unless it is longer than 64 characters, or it collides with the
//!    plain form of another tool of the same server *and* its own tool part had to be changed by
//!    step 2 (a tool whose raw name needed no change keeps its plain name).
//! 4. Otherwise it becomes `<plain form cut to 55 characters>_<8 hex digits>`, the digits being the
//!    low 32 bits of the FNV-1a 64-bit hash of the raw tool name (stable across runs, machines and
//!    list orders).
//! 5. A name that is still taken — a hashed name equal to another tool's plain name, or two
//!    hashes that agree — is settled in a fixed order: plain names first, then the others by raw
//!    name, each taking its form from steps 3–4 if free, else the hash of `<raw>#1`, `<raw>#2`, …
//!    until one is free. The result depends only on the set of raw names, not on their order.
//! 6. A raw name listed twice by one server gets no name the second time (a call could not tell
//!    the two apart).
//!
//! The raw name is what goes over the protocol; the registry name is only what the model sees.

use std::collections::{HashMap, HashSet};

/// Longest registry name.
pub const MAX_NAME: usize = 64;
/// Characters of the hash suffix, `_` included.
const SUFFIX: usize = 9;
/// Salts tried per tool before it is left without a name (a bound that is never reached in
/// practice: each salt is a fresh 32-bit hash).
const MAX_SALTS: u32 = 1_000;

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

/// The hashed form of `plain` for `raw`, with `salt` 0 (the documented form) or more.
fn suffixed(plain: &str, raw: &str, salt: u32) -> String {
    let keep = plain.len().min(MAX_NAME - SUFFIX);
    let hash = match salt {
        0 => fnv1a(raw),
        n => fnv1a(&format!("{raw}#{n}")),
    };
    // `plain` is ASCII, so any byte index is a character boundary.
    format!("{}_{:08x}", &plain[..keep], hash as u32)
}

/// The registry name of each of `server`'s tools, in the order given — the names a model sees
/// and permission rules match: `mcp__<server>__<tool>` with every character of the tool's name
/// outside `[A-Za-z0-9_-]` replaced by `_`, and an 8-hex-digit hash of the raw name in place of
/// the end when that is longer than 64 characters or collides with another tool of the server
/// (the full rule is in `docs/mcp.md`). Every `Some` is distinct; `None` for a raw name listed
/// before (or, in theory, one for which no free name was found).
pub fn registry_names(server: &str, raw_tools: &[&str]) -> Vec<Option<String>> {
    let pre = prefix(server);
    let plain: Vec<String> = raw_tools
        .iter()
        .map(|raw| format!("{pre}{}", sanitize(raw)))
        .collect();
    let mut count: HashMap<&str, usize> = HashMap::new();
    for p in &plain {
        *count.entry(p.as_str()).or_default() += 1;
    }
    // The first occurrence of each raw name; later ones get no name.
    let mut seen = HashSet::new();
    let first: Vec<bool> = raw_tools.iter().map(|raw| seen.insert(*raw)).collect();
    // Steps 3 and 4: each tool's own form, and whether it is a plain, unchanged name.
    let wanted: Vec<(String, bool)> = raw_tools
        .iter()
        .zip(&plain)
        .map(|(raw, p)| {
            let unchanged = sanitize(raw) == *raw;
            let collides = count[p.as_str()] > 1 && !unchanged;
            if p.len() > MAX_NAME || collides {
                (suffixed(p, raw, 0), false)
            } else {
                (p.clone(), unchanged)
            }
        })
        .collect();
    // Step 5: plain unchanged names first (distinct raw names give distinct ones), then the rest
    // by raw name; each takes the first free form.
    let mut order: Vec<usize> = (0..raw_tools.len()).filter(|&i| first[i]).collect();
    order.sort_by(|&a, &b| (!wanted[a].1, raw_tools[a]).cmp(&(!wanted[b].1, raw_tools[b])));
    let mut taken: HashSet<String> = HashSet::with_capacity(order.len());
    let mut names: Vec<Option<String>> = vec![None; raw_tools.len()];
    for i in order {
        let candidates = std::iter::once(wanted[i].0.clone())
            .chain((1..=MAX_SALTS).map(|salt| suffixed(&plain[i], raw_tools[i], salt)));
        for name in candidates {
            if taken.insert(name.clone()) {
                names[i] = Some(name);
                break;
            }
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::valid_tool_name;

    /// The names, all of which must be given.
    fn named(server: &str, raw: &[&str]) -> Vec<String> {
        registry_names(server, raw)
            .into_iter()
            .map(|n| n.expect("a name"))
            .collect()
    }

    #[test]
    fn plain_names_join_server_and_tool() {
        assert_eq!(
            named("fs", &["read_file", "list-dir"]),
            ["mcp__fs__read_file", "mcp__fs__list-dir"]
        );
        assert_eq!(
            named("s", &["get.time", "ünï"]),
            ["mcp__s__get_time", "mcp__s___n_"]
        );
    }

    #[test]
    fn collisions_after_sanitizing_get_a_stable_hash_suffix() {
        let names = named("s", &["a.b", "a_b", "a b"]);
        // `a_b` needed no change and keeps its plain name; the other two are told apart.
        assert_eq!(names[1], "mcp__s__a_b");
        assert!(names[0].starts_with("mcp__s__a_b_") && names[0].len() == 20);
        assert!(names[2].starts_with("mcp__s__a_b_") && names[2].len() == 20);
        assert_ne!(names[0], names[2]);
        // Stable: the same raw name gets the same suffix whatever the order or neighbours.
        assert_eq!(
            named("s", &["get_time", "get.time", "get time"]),
            [
                "mcp__s__get_time",
                "mcp__s__get_time_429f7372",
                "mcp__s__get_time_90a98794"
            ]
        );
        let again = named("s", &["a b", "a.b"]);
        assert_eq!(again, [names[2].clone(), names[0].clone()]);
    }

    #[test]
    fn long_names_are_cut_to_64_with_the_suffix() {
        let long = "x".repeat(80);
        let other = format!("{}y", "x".repeat(79));
        let names = named("server-with-a-long-name-32-chars", &[&long, &other]);
        for n in &names {
            assert_eq!(n.len(), MAX_NAME);
            assert!(valid_tool_name(n), "{n}");
        }
        assert_ne!(names[0], names[1]);
        assert_eq!(fnv1a("abc"), 0xe71f_a219_0541_574b);
    }

    #[test]
    fn a_hashed_name_never_takes_a_name_another_tool_has() {
        // `x.y` collides with `x_y` and is hashed to `mcp__a__x_y_7f3152d6`, which is the plain
        // name of a third tool: the plain name stays with the tool that has it.
        let raw = ["x.y", "x_y", "x_y_7f3152d6"];
        assert_eq!(fnv1a("x.y") as u32, 0x7f31_52d6);
        let names = named("a", &raw);
        assert_eq!(names[1], "mcp__a__x_y");
        assert_eq!(names[2], "mcp__a__x_y_7f3152d6");
        assert!(names[0].starts_with("mcp__a__x_y_") && names[0] != names[2]);
        // Whatever the order of the list, each raw name gets the same name.
        let mut reversed = raw;
        reversed.reverse();
        let mut again = named("a", &reversed);
        again.reverse();
        assert_eq!(again, names);
    }

    #[test]
    fn two_hashes_that_agree_still_give_two_names() {
        // Two 58-character names with the same first 47 characters and the same low 32 bits of
        // FNV-1a: the documented rule alone would give both `mcp__a__…_55110f15`.
        let one = "a_very_long_tool_name_that_the_server_chose_to_use_281191";
        let two = "a_very_long_tool_name_that_the_server_chose_to_use_455080";
        assert_eq!(fnv1a(one) as u32, fnv1a(two) as u32);
        let names = named("a", &[two, one]);
        assert_ne!(names[0], names[1]);
        // The one first by raw name keeps the documented form.
        assert_eq!(names[1], suffixed(&format!("mcp__a__{one}"), one, 0));
        assert!(
            names
                .iter()
                .all(|n| n.len() == MAX_NAME && valid_tool_name(n))
        );
    }

    #[test]
    fn a_raw_name_listed_twice_is_named_once() {
        assert_eq!(
            registry_names("s", &["t", "u", "t"]),
            [
                Some("mcp__s__t".to_string()),
                Some("mcp__s__u".into()),
                None
            ]
        );
    }

    #[test]
    fn names_are_distinct_for_any_set_of_raw_names() {
        // Many near-identical names: every one gets a distinct, valid name.
        let raw: Vec<String> = [
            "a", "a.", "a_", "a-", "a ", "_a", ".a", "a__b", "a._b", "a_.b",
        ]
        .iter()
        .flat_map(|p| (0..40).map(move |i| format!("{p}{}", "x".repeat(i))))
        .collect();
        let raw: Vec<&str> = raw.iter().map(String::as_str).collect();
        let names = named("s", &raw);
        let distinct: HashSet<&String> = names.iter().collect();
        assert_eq!(distinct.len(), names.len());
        assert!(names.iter().all(|n| valid_tool_name(n)));
    }

    #[test]
    fn every_name_is_a_valid_registry_name() {
        for raw in ["", "a/b/c", "tool:with:colons", "😀", &"é".repeat(40)] {
            let n = &named("srv", &[raw])[0];
            assert!(valid_tool_name(n), "{raw:?} -> {n}");
            assert!(n.starts_with(&prefix("srv")));
        }
    }
}
