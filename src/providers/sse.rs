//! Server-sent events (the `text/event-stream` format both APIs stream in), parsed incrementally
//! from a byte stream split anywhere: inside a line, inside a `\r\n`, inside a UTF-8 character.
//!
//! Bytes are buffered until a line is complete, so a line is decoded only once it is whole. Lines
//! end with `\n`, `\r\n` or `\r`; `:` starts a comment; `data:` lines of one event are joined with
//! `\n`; a blank line dispatches the event. A UTF-8 byte-order mark at the very start is skipped.

/// One dispatched event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field (`None` means the default type, `message`).
    pub event: Option<String>,
    /// The `data:` lines, joined with `\n`.
    pub data: String,
}

/// Longest line accepted, so a broken server cannot grow memory without bound.
pub const MAX_LINE: usize = 16 << 20;

/// A line longer than [`MAX_LINE`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("event-stream line longer than {MAX_LINE} bytes")]
pub struct LineTooLong;

/// The incremental parser.
#[derive(Debug, Default)]
pub struct SseParser {
    line: Vec<u8>,
    after_cr: bool,
    seen_first_line: bool,
    event: Option<String>,
    data: String,
    has_data: bool,
}

impl SseParser {
    /// A parser at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds bytes; returns the events they completed.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<SseEvent>, LineTooLong> {
        let mut out = Vec::new();
        if bytes.is_empty() {
            return Ok(out);
        }
        let mut rest = bytes;
        if self.after_cr && rest.first() == Some(&b'\n') {
            rest = &rest[1..];
        }
        self.after_cr = false;
        while let Some(pos) = rest.iter().position(|&b| b == b'\n' || b == b'\r') {
            self.line.extend_from_slice(&rest[..pos]);
            self.check_len()?;
            let cr = rest[pos] == b'\r';
            rest = &rest[pos + 1..];
            if cr {
                match rest.first() {
                    Some(b'\n') => rest = &rest[1..],
                    Some(_) => {}
                    None => self.after_cr = true,
                }
            }
            self.end_line(&mut out);
        }
        self.line.extend_from_slice(rest);
        self.check_len()?;
        Ok(out)
    }

    /// The end of the stream: a last line without its newline is taken as complete, and an event
    /// still missing its blank line is dispatched.
    pub fn finish(&mut self) -> Vec<SseEvent> {
        let mut out = Vec::new();
        if !self.line.is_empty() {
            self.end_line(&mut out);
        }
        self.dispatch(&mut out);
        out
    }

    fn check_len(&self) -> Result<(), LineTooLong> {
        if self.line.len() > MAX_LINE {
            Err(LineTooLong)
        } else {
            Ok(())
        }
    }

    fn end_line(&mut self, out: &mut Vec<SseEvent>) {
        let mut raw = std::mem::take(&mut self.line);
        if !self.seen_first_line {
            self.seen_first_line = true;
            if raw.starts_with(&[0xEF, 0xBB, 0xBF]) {
                raw.drain(..3);
            }
        }
        if raw.is_empty() {
            self.dispatch(out);
            return;
        }
        let line = String::from_utf8_lossy(&raw);
        if line.starts_with(':') {
            return;
        }
        let (field, value) = match line.find(':') {
            Some(i) => {
                let value = &line[i + 1..];
                (&line[..i], value.strip_prefix(' ').unwrap_or(value))
            }
            None => (&*line, ""),
        };
        match field {
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "event" => self.event = Some(value.to_string()),
            // `id` and `retry` matter only for reconnecting, which these APIs do not use.
            _ => {}
        }
    }

    fn dispatch(&mut self, out: &mut Vec<SseEvent>) {
        let event = self.event.take();
        if !self.has_data {
            return;
        }
        self.has_data = false;
        out.push(SseEvent {
            event: event.filter(|e| !e.is_empty()),
            data: std::mem::take(&mut self.data),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(event: Option<&str>, data: &str) -> SseEvent {
        SseEvent {
            event: event.map(str::to_string),
            data: data.to_string(),
        }
    }

    fn parse_in_pieces(input: &[u8], cuts: &[usize]) -> Vec<SseEvent> {
        let mut parser = SseParser::new();
        let mut out = Vec::new();
        let mut start = 0;
        for &cut in cuts.iter().chain(std::iter::once(&input.len())) {
            out.extend(parser.push(&input[start..cut]).unwrap());
            start = cut;
        }
        out.extend(parser.finish());
        out
    }

    const STREAM: &str = "\u{feff}: a comment\r\nevent: content_block_delta\r\ndata: {\"text\":\"caf\u{e9} \\\"q\\\" \u{1F600}\"}\r\n\r\nevent: ping\ndata: {}\n\ndata: line one\ndata:line two\rdata\r\r: tail comment\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

    fn expected() -> Vec<SseEvent> {
        vec![
            ev(
                Some("content_block_delta"),
                "{\"text\":\"caf\u{e9} \\\"q\\\" \u{1F600}\"}",
            ),
            ev(Some("ping"), "{}"),
            ev(None, "line one\nline two\n"),
            ev(Some("message_stop"), "{\"type\":\"message_stop\"}"),
        ]
    }

    #[test]
    fn whole_stream_parses() {
        assert_eq!(parse_in_pieces(STREAM.as_bytes(), &[]), expected());
    }

    #[test]
    fn one_split_at_every_byte_gives_the_same_events() {
        let bytes = STREAM.as_bytes();
        for cut in 0..=bytes.len() {
            assert_eq!(parse_in_pieces(bytes, &[cut]), expected(), "cut at {cut}");
        }
    }

    #[test]
    fn two_splits_at_every_pair_of_bytes_give_the_same_events() {
        let bytes = STREAM.as_bytes();
        for a in 0..=bytes.len() {
            for b in a..=bytes.len() {
                assert_eq!(parse_in_pieces(bytes, &[a, b]), expected(), "cuts {a} {b}");
            }
        }
    }

    #[test]
    fn byte_by_byte_gives_the_same_events() {
        let bytes = STREAM.as_bytes();
        let cuts: Vec<usize> = (1..bytes.len()).collect();
        assert_eq!(parse_in_pieces(bytes, &cuts), expected());
    }

    #[test]
    fn an_unterminated_last_event_is_dispatched_at_the_end() {
        assert_eq!(
            parse_in_pieces(b"data: [DONE]", &[]),
            vec![ev(None, "[DONE]")]
        );
    }

    #[test]
    fn events_without_data_are_not_dispatched() {
        assert!(parse_in_pieces(b"event: ping\n\n: x\n\n", &[]).is_empty());
    }

    #[test]
    fn an_endless_line_is_refused() {
        let mut parser = SseParser::new();
        let chunk = vec![b'a'; 1 << 20];
        let mut failed = false;
        for _ in 0..=16 {
            if parser.push(&chunk).is_err() {
                failed = true;
                break;
            }
        }
        assert!(failed);
    }
}
