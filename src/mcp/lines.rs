//! The framing of MCP over stdio: one JSON-RPC message a line, each line bounded.
//!
//! [`LineReader`] reads `\n`-terminated lines of at most a limit of bytes (the message limit,
//! [`MAX_MESSAGE`]). A longer line is not kept: its bytes stream through an [`OutlineScan`],
//! which sees the top-level `id` and `method` members of a JSON object whatever the rest holds
//! (nesting of any depth, invalid UTF-8, invalid escapes, any length) in constant memory, so the
//! sender of an oversized request or response can still be answered. The same scan reads the
//! outline of a whole line that does not parse. Reads are cancel-safe: all state lives in the
//! reader between awaits (rmcp polls `receive` inside a `select!`).

use rmcp::model::RequestId;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

/// The largest message (one line, newline excluded) read from a peer: 16 MiB, as rmcp's own
/// stdio transport and its Streamable HTTP client.
pub const MAX_MESSAGE: usize = 16 * 1024 * 1024;

/// Longest `id` or `method` value the scan keeps (longer ones are not read).
const MAX_MEMBER: usize = 256;

/// What a line's top level said, as far as a structural scan can tell.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outline {
    /// The `id` member, when it is a string or an integer.
    pub id: Option<RequestId>,
    /// The `id` member is present (valid or not).
    pub has_id: bool,
    /// The `method` member, when it is a string.
    pub method: Option<String>,
}

/// Where the scan is within the top-level object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum At {
    /// Before the first byte.
    Start,
    /// The text is not an object: nothing more to see.
    NotObject,
    /// Inside the top-level object, expecting a key.
    Key,
    /// Reading a key.
    InKey,
    /// After a key, expecting `:`.
    Colon,
    /// Reading a member's value.
    Value,
    /// After the top-level object.
    End,
}

/// A streaming scan of one JSON text for the top-level `id` and `method` members (see the module
/// docs). Feed it bytes with [`OutlineScan::feed`], then take [`OutlineScan::outline`].
#[derive(Debug, Clone)]
pub struct OutlineScan {
    at: At,
    /// Nesting depth (the top-level object is 1).
    depth: usize,
    in_string: bool,
    escaped: bool,
    key: Vec<u8>,
    /// The raw value of the member being read, when it is `id` or `method` (and not too long).
    value: Option<Vec<u8>>,
    capturing: Option<Member>,
    id: Option<Vec<u8>>,
    has_id: bool,
    method: Option<Vec<u8>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Member {
    Id,
    Method,
}

impl Default for OutlineScan {
    fn default() -> Self {
        OutlineScan {
            at: At::Start,
            depth: 0,
            in_string: false,
            escaped: false,
            key: Vec::new(),
            value: None,
            capturing: None,
            id: None,
            has_id: false,
            method: None,
        }
    }
}

impl OutlineScan {
    /// Scans `bytes`, the next part of the text.
    pub fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if matches!(self.at, At::NotObject | At::End) {
                return;
            }
            self.step(b);
        }
    }

    fn step(&mut self, b: u8) {
        if self.in_string {
            match (self.escaped, b) {
                (true, _) => self.escaped = false,
                (false, b'\\') => self.escaped = true,
                (false, b'"') => self.in_string = false,
                _ => {}
            }
            match self.at {
                At::InKey if self.in_string && self.key.len() <= MAX_MEMBER => self.key.push(b),
                At::InKey if self.in_string => {}
                At::InKey => self.at = At::Colon,
                At::Value => self.keep(b),
                _ => {}
            }
            return;
        }
        if b.is_ascii_whitespace() {
            if self.at == At::Value {
                self.keep(b);
            }
            return;
        }
        match (self.at, b) {
            (At::Start, b'{') => {
                self.depth = 1;
                self.at = At::Key;
            }
            (At::Start, _) => self.at = At::NotObject,
            (At::Key, b'"') => {
                self.in_string = true;
                self.key.clear();
                self.at = At::InKey;
            }
            (At::Key, b'}') => self.at = At::End,
            (At::Key, _) => {}
            (At::Colon, b':') => {
                self.capturing = match self.key.as_slice() {
                    b"id" => Some(Member::Id),
                    b"method" => Some(Member::Method),
                    _ => None,
                };
                self.has_id |= self.capturing == Some(Member::Id);
                self.value = self.capturing.map(|_| Vec::new());
                self.at = At::Value;
            }
            (At::Colon, _) => self.at = At::NotObject,
            (At::Value, _) => {
                match b {
                    b'"' => self.in_string = true,
                    b'{' | b'[' => self.depth += 1,
                    b'}' | b']' => self.depth = self.depth.saturating_sub(1),
                    _ => {}
                }
                if self.depth == 1 && b == b',' {
                    self.end_member();
                    self.at = At::Key;
                } else if self.depth == 0 {
                    self.end_member();
                    self.at = At::End;
                } else {
                    self.keep(b);
                }
            }
            (At::InKey | At::NotObject | At::End, _) => {}
        }
    }

    /// Keeps a byte of a captured value (dropping the value once it is too long).
    fn keep(&mut self, b: u8) {
        if let Some(value) = &mut self.value {
            if value.len() < MAX_MEMBER {
                value.push(b);
            } else {
                self.value = None;
            }
        }
    }

    fn end_member(&mut self) {
        let value = self.value.take();
        match self.capturing.take() {
            Some(Member::Id) if self.id.is_none() => self.id = value,
            Some(Member::Method) if self.method.is_none() => self.method = value,
            _ => {}
        }
    }

    /// What the scan saw.
    pub fn outline(&self) -> Outline {
        Outline {
            id: self
                .id
                .as_deref()
                .and_then(|raw| serde_json::from_slice(raw).ok()),
            has_id: self.has_id,
            method: self
                .method
                .as_deref()
                .and_then(|raw| serde_json::from_slice(raw).ok()),
        }
    }
}

/// The outline of a whole text.
pub fn outline(text: &[u8]) -> Outline {
    let mut scan = OutlineScan::default();
    scan.feed(text);
    scan.outline()
}

/// One read off the stream.
#[derive(Debug)]
pub enum Line {
    /// A whole line within the limit, without its `\n`.
    Whole(Vec<u8>),
    /// A line over the limit, not kept: its length and outline.
    Oversized {
        /// Its length in bytes, newline excluded.
        len: u64,
        /// What its top level said.
        outline: Outline,
    },
}

/// Bounded, cancel-safe line reads (see the module docs).
pub struct LineReader<R> {
    read: BufReader<R>,
    max: usize,
    line: Vec<u8>,
    /// Set while the rest of an oversized line streams past: its length so far and its scan.
    over: Option<(u64, OutlineScan)>,
}

impl<R: AsyncRead + Unpin> LineReader<R> {
    /// Reads lines of at most `max` bytes from `read`.
    pub fn new(read: R, max: usize) -> Self {
        LineReader {
            read: BufReader::with_capacity(64 * 1024, read),
            max,
            line: Vec::new(),
            over: None,
        }
    }

    /// The next line; `None` at the end of the stream (a last line without `\n` is dropped, as
    /// an incomplete message) or when reading fails.
    pub async fn next(&mut self) -> Option<Line> {
        loop {
            let available = match self.read.fill_buf().await {
                Ok([]) => return None,
                Ok(available) => available,
                Err(e) => {
                    tracing::debug!("MCP stream read failed: {e}");
                    return None;
                }
            };
            let newline = memchr::memchr(b'\n', available);
            let take = newline.map_or(available.len(), |i| i + 1);
            let chunk = &available[..newline.unwrap_or(take)];
            let mut done = None;
            if let Some((len, scan)) = &mut self.over {
                *len += chunk.len() as u64;
                scan.feed(chunk);
                if newline.is_some() {
                    done = Some(Line::Oversized {
                        len: *len,
                        outline: scan.outline(),
                    });
                }
            } else if self.line.len() + chunk.len() > self.max {
                let mut scan = OutlineScan::default();
                scan.feed(&self.line);
                scan.feed(chunk);
                let len = (self.line.len() + chunk.len()) as u64;
                self.line = Vec::new();
                if newline.is_some() {
                    done = Some(Line::Oversized {
                        len,
                        outline: scan.outline(),
                    });
                } else {
                    self.over = Some((len, scan));
                }
            } else {
                self.line.extend_from_slice(chunk);
                if newline.is_some() {
                    done = Some(Line::Whole(std::mem::take(&mut self.line)));
                }
            }
            self.read.consume(take);
            if let Some(line) = done {
                self.over = None;
                return Some(line);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: i64) -> Option<RequestId> {
        Some(RequestId::Number(n))
    }

    #[test]
    fn the_outline_finds_id_and_method_wherever_they_are() {
        let o = outline(br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{}}"#);
        assert_eq!(o.id, id(7));
        assert_eq!(o.method.as_deref(), Some("tools/call"));
        // After deep nesting, a bad escape and invalid UTF-8, at the end, with spaces.
        let mut text = br#"{"result": {"a": "\ud800 \xff", "b": "#.to_vec();
        text.extend(std::iter::repeat_n(b'[', 100_000));
        text.extend(std::iter::repeat_n(b']', 100_000));
        text.extend_from_slice(b"}, \"id\" : \"req-1\" }");
        let o = outline(&text);
        assert_eq!(o.id, Some(RequestId::String("req-1".into())));
        assert!(o.has_id && o.method.is_none());
        // Keys and brackets inside strings are text, not structure.
        let o = outline(br#"{"params": {"id": 1, "x": "}\"id\": 2"}, "id": 3}"#);
        assert_eq!(o.id, id(3));
    }

    #[test]
    fn the_outline_of_what_is_not_a_request_object_is_empty() {
        for text in [&b"hello"[..], b"[1, 2]", b"", b"{\"id\" 5}"] {
            assert_eq!(outline(text).id, None, "{}", String::from_utf8_lossy(text));
        }
        // An id of the wrong type is seen but not read.
        let o = outline(br#"{"id": {"a": 1}, "method": 5}"#);
        assert!(o.has_id);
        assert_eq!((o.id, o.method), (None, None));
        let o = outline(br#"{"id": 1.5}"#);
        assert!(o.has_id && o.id.is_none());
    }

    #[tokio::test]
    async fn lines_over_the_limit_are_not_kept_but_outlined() {
        let mut big = b"{\"method\":\"tools/call\",\"params\":\"".to_vec();
        big.extend(std::iter::repeat_n(b'x', 200_000));
        big.extend_from_slice(b"\",\"id\":2}\r");
        let mut input = b"{\"id\":1}\n".to_vec();
        input.extend_from_slice(&big);
        input.extend_from_slice(b"\n{\"id\":3}\n{\"id\":4}");
        let mut reader = LineReader::new(&input[..], 1_000);
        assert!(matches!(reader.next().await, Some(Line::Whole(l)) if l == b"{\"id\":1}"));
        match reader.next().await {
            Some(Line::Oversized { len, outline }) => {
                assert_eq!(len, big.len() as u64);
                assert_eq!(outline.id, id(2));
                assert_eq!(outline.method.as_deref(), Some("tools/call"));
            }
            other => panic!("{other:?}"),
        }
        assert!(reader.line.capacity() <= 1_000 + 64 * 1024, "not kept");
        assert!(matches!(reader.next().await, Some(Line::Whole(l)) if l == b"{\"id\":3}"));
        // The last line has no newline: an incomplete message.
        assert!(reader.next().await.is_none());
    }
}
