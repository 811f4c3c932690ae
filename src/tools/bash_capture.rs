//! Bounded capture of a command's output, for `bash`.
//!
//! Each stream keeps its first half-cap bytes and a rolling last half-cap, counting what fell in
//! between, so memory never grows past the cap however much a command prints; [`combine`] joins
//! stdout and stderr the way the seed does (trimmed, `(no output)` when empty) and marks any gap
//! as `… N bytes truncated …`, cutting only on UTF-8 boundaries. Each piece read is also handed
//! to the call's live progress as it comes (a no-op when nobody listens).

use std::collections::VecDeque;

use tokio::io::{AsyncRead, AsyncReadExt};

use crate::tool::{OutputStream, Progress, cap_output};

/// One output stream, bounded: the first `cap / 2` bytes, a rolling last `cap - cap / 2` bytes,
/// and how many bytes fell between them.
pub(super) struct Capture {
    head: Vec<u8>,
    head_cap: usize,
    tail: VecDeque<u8>,
    tail_cap: usize,
    dropped: u64,
}

impl Capture {
    pub(super) fn new(cap: usize) -> Self {
        let head_cap = cap / 2;
        Capture {
            head: Vec::new(),
            head_cap,
            tail: VecDeque::new(),
            tail_cap: cap - head_cap,
            dropped: 0,
        }
    }

    /// Reads `pipe` to its end (or first error) into the buffers, handing each piece to the
    /// call's live `progress` as it comes (a no-op when nobody listens).
    pub(super) async fn fill<R: AsyncRead + Unpin>(
        &mut self,
        pipe: Option<R>,
        progress: &Progress,
        stream: OutputStream,
    ) {
        let Some(mut pipe) = pipe else { return };
        let mut buf = [0u8; 8192];
        while let Ok(n) = pipe.read(&mut buf).await {
            if n == 0 {
                break;
            }
            progress.output(stream, &buf[..n]);
            self.push(&buf[..n]);
        }
    }

    fn push(&mut self, data: &[u8]) {
        let take = (self.head_cap - self.head.len()).min(data.len());
        self.head.extend_from_slice(&data[..take]);
        let rest = &data[take..];
        if rest.len() >= self.tail_cap {
            self.dropped += (self.tail.len() + rest.len() - self.tail_cap) as u64;
            self.tail.clear();
            self.tail.extend(&rest[rest.len() - self.tail_cap..]);
        } else {
            self.tail.extend(rest);
            let over = self.tail.len().saturating_sub(self.tail_cap);
            self.tail.drain(..over);
            self.dropped += over as u64;
        }
    }

    /// The stream as text pieces: one piece when complete, or head and tail around a gap. A
    /// character cut in two by the gap is counted as dropped rather than shown as garbage.
    fn into_pieces(self) -> Vec<Piece> {
        let Capture {
            mut head,
            tail,
            mut dropped,
            ..
        } = self;
        if dropped == 0 {
            head.extend(tail);
            return vec![Piece::Text(String::from_utf8_lossy(&head).into_owned())];
        }
        let mut tail: Vec<u8> = tail.into();
        let cut = incomplete_suffix(&head);
        head.truncate(head.len() - cut);
        let skip = tail
            .iter()
            .take(3)
            .take_while(|b| (**b & 0xC0) == 0x80)
            .count();
        tail.drain(..skip);
        dropped += (cut + skip) as u64;
        vec![
            Piece::Text(String::from_utf8_lossy(&head).into_owned()),
            Piece::Gap(dropped),
            Piece::Text(String::from_utf8_lossy(&tail).into_owned()),
        ]
    }
}

/// Length of an incomplete UTF-8 sequence at the end of `bytes` (0 when it ends cleanly).
fn incomplete_suffix(bytes: &[u8]) -> usize {
    let start = bytes.len().saturating_sub(3);
    match std::str::from_utf8(&bytes[start..]) {
        Ok(_) => 0,
        Err(e) if e.error_len().is_none() => bytes.len() - start - e.valid_up_to(),
        // Invalid bytes, not a cut: leave them to the lossy decoder.
        Err(_) => 0,
    }
}

/// Part of the combined output: text we kept, or a count of bytes we never held.
enum Piece {
    Text(String),
    Gap(u64),
}

/// What an empty output reads.
pub(super) const NO_OUTPUT: &str = "(no output)";

/// stdout followed by stderr, trimmed, `(no output)` when empty, at most `cap` bytes like
/// [`cap_output`] (head and tail around one `… N bytes truncated …` marker that also counts the
/// bytes never held), with long lines clamped.
pub(super) fn combine(out: Capture, err: Capture, cap: usize) -> String {
    let mut pieces = out.into_pieces();
    pieces.extend(err.into_pieces());
    trim_pieces(&mut pieces);
    let dropped_unseen: u64 = pieces
        .iter()
        .map(|p| if let Piece::Gap(n) = p { *n } else { 0 })
        .sum();
    if dropped_unseen == 0 {
        let text: String = pieces
            .into_iter()
            .filter_map(|p| {
                if let Piece::Text(t) = p {
                    Some(t)
                } else {
                    None
                }
            })
            .collect();
        if text.is_empty() {
            return NO_OUTPUT.to_string();
        }
        return cap_output(text, cap);
    }
    let kept_len: usize = pieces
        .iter()
        .map(|p| if let Piece::Text(t) = p { t.len() } else { 0 })
        .sum();
    // Leave room for the marker, sized for the largest count it could show.
    let widest = marker(dropped_unseen + kept_len as u64).len();
    let budget = cap.saturating_sub(widest);
    let head = take_head(&pieces, budget / 2);
    let tail = take_tail(&pieces, budget - budget / 2);
    let dropped = (kept_len - head.len() - tail.len()) as u64 + dropped_unseen;
    // Within the cap now; `cap_output` only clamps long lines.
    cap_output(format!("{head}{}{tail}", marker(dropped)), cap)
}

/// The truncation marker of [`cap_output`].
fn marker(dropped: u64) -> String {
    format!("\n… {dropped} bytes truncated …\n")
}

/// Trims whitespace from the start and the end of the whole sequence, as `str::trim` would on
/// the joined text, stopping at a gap.
fn trim_pieces(pieces: &mut Vec<Piece>) {
    while let Some(Piece::Text(t)) = pieces.first_mut() {
        *t = t.trim_start().to_string();
        if !t.is_empty() {
            break;
        }
        pieces.remove(0);
    }
    while let Some(Piece::Text(t)) = pieces.last_mut() {
        t.truncate(t.trim_end().len());
        if !t.is_empty() {
            break;
        }
        pieces.pop();
    }
}

/// Up to `limit` bytes of text from the start, up to the first gap, cut on a char boundary.
fn take_head(pieces: &[Piece], limit: usize) -> String {
    let mut head = String::new();
    for piece in pieces {
        let Piece::Text(t) = piece else { break };
        let mut end = (limit - head.len()).min(t.len());
        while !t.is_char_boundary(end) {
            end -= 1;
        }
        head.push_str(&t[..end]);
        if head.len() >= limit || end < t.len() {
            break;
        }
    }
    head
}

/// Up to `limit` bytes of text from the end, back to the last gap, cut on a char boundary.
fn take_tail(pieces: &[Piece], limit: usize) -> String {
    let mut parts: Vec<&str> = Vec::new();
    let mut len = 0;
    for piece in pieces.iter().rev() {
        let Piece::Text(t) = piece else { break };
        let mut start = t.len() - (limit - len).min(t.len());
        while !t.is_char_boundary(start) {
            start += 1;
        }
        parts.push(&t[start..]);
        len += t.len() - start;
        if len >= limit || start > 0 {
            break;
        }
    }
    parts.into_iter().rev().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn captured(data: &[u8], cap: usize) -> Capture {
        let mut c = Capture::new(cap);
        for chunk in data.chunks(7) {
            c.push(chunk);
        }
        c
    }

    #[test]
    fn a_flood_keeps_head_and_tail_within_the_cap_and_counts_every_dropped_byte() {
        let data: Vec<u8> = (0..1000u32)
            .map(|i| {
                if i % 50 == 49 {
                    b'\n'
                } else {
                    b'a' + (i % 26) as u8
                }
            })
            .collect();
        let text = combine(captured(&data, 100), Capture::new(100), 100);
        assert!(text.len() <= 100, "{} bytes", text.len());
        let (head, rest) = text.split_once("\n… ").unwrap();
        let (count, tail) = rest.split_once(" bytes truncated …\n").unwrap();
        let dropped: usize = count.parse().unwrap();
        assert_eq!(
            head.len() + dropped + tail.len(),
            999,
            "trailing newline trimmed"
        );
        assert!(data.starts_with(head.as_bytes()));
        assert!(data[..999].ends_with(tail.as_bytes()));
    }

    #[test]
    fn a_gap_never_splits_a_character() {
        let data = "é".repeat(500);
        let text = combine(captured(data.as_bytes(), 101), Capture::new(101), 101);
        assert!(!text.contains('\u{FFFD}'), "{text}");
        let (head, rest) = text.split_once("\n… ").unwrap();
        let (count, tail) = rest.split_once(" bytes truncated …\n").unwrap();
        let dropped: usize = count.parse().unwrap();
        assert_eq!(head.len() + dropped + tail.len(), 1000);
    }

    #[test]
    fn streams_join_trimmed_and_empty_output_says_so() {
        let text = combine(captured(b"  out\n", 100), captured(b"err \n", 100), 100);
        assert_eq!(text, "out\nerr");
        assert_eq!(
            combine(Capture::new(10), captured(b" \n", 10), 10),
            "(no output)"
        );
    }
}
