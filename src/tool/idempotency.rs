//! The idempotency key of a call: a stable name for "this call", for the services behind a tool.
//!
//! The engine runs a call at most once per `tool_use_id` in a session, and with a journal says
//! `outcome_unknown` rather than run a side-effect call a second time after a crash. What it
//! cannot fence — a call re-run because its tool is declared idempotent, a replay that reaches an
//! engine without the journal, a tool's own retry of its HTTP request — a service can, when every
//! copy of a call carries the same key. The key is a pure function of the call's identity: the
//! session id, the turn id when the client gives one, and the `tool_use_id`. Nothing is stored;
//! any process that knows the three can compute it again (see `docs/idempotency.md`).
//!
//! Each kind of tool finds it in its own place: `SWITCHBOARD_IDEMPOTENCY_KEY` in a `bash`
//! command's environment, `_meta["io.switchboard/idempotency-key"]` of an MCP `tools/call`,
//! `idempotency_key` in a client tool's call event, [`ToolContext::idempotency_key`] in a Rust
//! handler.
//!
//! [`ToolContext::idempotency_key`]: super::ToolContext::idempotency_key

use sha2::{Digest, Sha256};

/// What the hash starts with: names the derivation, so a later one cannot produce the same keys.
const DOMAIN: &[u8] = b"switchboard-idempotency-v1";
/// What every key starts with: the version of the derivation.
const PREFIX: &str = "sb1-";
/// Hex digits of the digest kept: 128 bits.
const HEX_DIGITS: usize = 32;

/// The idempotency key of call `tool_use_id` of turn `turn` (when the client named it) in
/// `session`: `sb1-` and the first 32 lowercase hex digits of the SHA-256 of
/// `switchboard-idempotency-v1`, NUL, the session id, NUL, the turn id (empty when `None`), NUL,
/// the `tool_use_id`.
///
/// The same identity always gives the same key, in every process and after a restart; another
/// session or another `tool_use_id` gives another. `Some("")` is the same as `None` (a turn id
/// is never empty). Session and turn ids hold no NUL byte (the sidecar's cannot), so the fields
/// cannot run into each other.
///
/// ```
/// use switchboard::tool::idempotency_key;
/// let key = idempotency_key("s1", None, "toolu_01");
/// assert_eq!(key, "sb1-5101c8b18443bad9a910fa8df6d0bf15");
/// assert_ne!(key, idempotency_key("s2", None, "toolu_01"));
/// ```
pub fn idempotency_key(session: &str, turn: Option<&str>, tool_use_id: &str) -> String {
    let mut hash = Sha256::new();
    hash.update(DOMAIN);
    for field in [session, turn.unwrap_or(""), tool_use_id] {
        hash.update([0u8]);
        hash.update(field.as_bytes());
    }
    let digest = hash.finalize();
    let mut key = String::with_capacity(PREFIX.len() + HEX_DIGITS);
    key.push_str(PREFIX);
    for byte in &digest[..HEX_DIGITS / 2] {
        key.push(char::from(HEX[usize::from(byte >> 4)]));
        key.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
    key
}

/// The digits of a key, lowercase.
const HEX: &[u8; 16] = b"0123456789abcdef";

#[cfg(test)]
mod tests {
    use super::*;

    /// Pinned values: computed independently (Python's hashlib over the documented bytes). A
    /// change here changes every key a service has stored: make a new version instead.
    #[test]
    fn the_key_is_pinned_to_its_documented_derivation() {
        assert_eq!(
            idempotency_key("s1", None, "toolu_01"),
            "sb1-5101c8b18443bad9a910fa8df6d0bf15"
        );
        assert_eq!(
            idempotency_key("s1", Some("turn-7"), "toolu_01"),
            "sb1-a3ae66e59b6a98861d3c286fc5657a5b"
        );
        assert_eq!(
            idempotency_key("a", None, ""),
            "sb1-581994b12e108d90279611240e90f9fa"
        );
    }

    #[test]
    fn every_field_changes_the_key_and_nothing_else_does() {
        let base = idempotency_key("s1", Some("t1"), "toolu_01");
        assert_eq!(base, idempotency_key("s1", Some("t1"), "toolu_01"));
        assert_ne!(base, idempotency_key("s2", Some("t1"), "toolu_01"));
        assert_ne!(base, idempotency_key("s1", Some("t2"), "toolu_01"));
        assert_ne!(base, idempotency_key("s1", None, "toolu_01"));
        assert_ne!(base, idempotency_key("s1", Some("t1"), "toolu_02"));
        assert_eq!(
            idempotency_key("s1", Some(""), "x"),
            idempotency_key("s1", None, "x")
        );
        assert!(base.starts_with("sb1-") && base.len() == 36);
        assert!(
            base[4..]
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        );
    }

    #[test]
    fn the_separators_keep_the_fields_apart() {
        // The same characters split differently between the fields give different keys.
        let splits = [
            ("ab", None, "c"),
            ("a", Some("b"), "c"),
            ("a", None, "bc"),
            ("a", Some("bc"), ""),
            ("abc", None, ""),
            ("", Some("abc"), ""),
            ("", None, "abc"),
        ];
        let keys: std::collections::HashSet<String> = splits
            .iter()
            .map(|(s, t, id)| idempotency_key(s, *t, id))
            .collect();
        assert_eq!(keys.len(), splits.len());
    }
}
