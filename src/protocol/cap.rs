//! The output cap: how a tool's text is bounded before it goes back to the model (head and tail
//! kept around one marker, long lines clamped). Used by the engine for every result and by tools
//! that bound their own output.

/// Bounds a tool's output: at most `cap` bytes, and no line longer than 2,000 bytes.
///
/// * Text longer than `cap` keeps its head and its tail around one
///   `\n… N bytes truncated …\n` marker line (N counts the bytes left out of `text`); the
///   result, marker included, is at most `cap` bytes (for any `cap` of 40 bytes or more).
/// * Any single line longer than 2,000 bytes is then clamped to its first and last 900 bytes
///   around an inline ` … N bytes truncated … ` marker, so one minified file or one endless
///   progress line cannot crowd out everything else.
///
/// Every cut falls on a UTF-8 character boundary. The function is idempotent: output it
/// produced passes through it unchanged.
pub fn cap_output(text: String, cap: usize) -> String {
    /// Longest line kept whole.
    const LINE_CAP: usize = 2_000;
    /// Bytes kept at each end of a clamped line (the clamped line stays under `LINE_CAP`).
    const LINE_KEEP: usize = 900;

    fn floor(s: &str, mut i: usize) -> usize {
        while !s.is_char_boundary(i) {
            i -= 1;
        }
        i
    }
    fn ceil(s: &str, mut i: usize) -> usize {
        while !s.is_char_boundary(i) {
            i += 1;
        }
        i
    }
    fn has_long_line(s: &str) -> bool {
        s.split('\n').any(|line| line.len() > LINE_CAP)
    }
    fn clamp_lines(s: &str, out: &mut String) {
        for (i, line) in s.split('\n').enumerate() {
            if i > 0 {
                out.push('\n');
            }
            if line.len() <= LINE_CAP {
                out.push_str(line);
                continue;
            }
            let head = floor(line, LINE_KEEP);
            let tail = ceil(line, line.len() - LINE_KEEP);
            out.push_str(&line[..head]);
            out.push_str(&format!(" … {} bytes truncated … ", tail - head));
            out.push_str(&line[tail..]);
        }
    }

    if text.len() <= cap {
        if !has_long_line(&text) {
            return text;
        }
        let mut out = String::with_capacity(text.len().min(cap));
        clamp_lines(&text, &mut out);
        return out;
    }
    // Room for the marker, sized for the largest count it could show.
    let widest = format!("\n… {} bytes truncated …\n", text.len()).len();
    let budget = cap.saturating_sub(widest);
    let keep_head = budget / 2;
    let keep_tail = budget - keep_head;
    let head_end = floor(&text, keep_head);
    let tail_start = ceil(&text, text.len() - keep_tail);
    let dropped = tail_start - head_end;
    let mut out = String::with_capacity(cap);
    clamp_lines(&text[..head_end], &mut out);
    out.push_str(&format!("\n… {dropped} bytes truncated …\n"));
    clamp_lines(&text[tail_start..], &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_output_is_untouched() {
        assert_eq!(cap_output("abc".into(), 10), "abc");
    }

    /// Splits `head\n… N bytes truncated …\ntail` into its parts.
    fn parts(capped: &str) -> (&str, usize, &str) {
        let (head, rest) = capped.split_once("\n… ").unwrap();
        let (count, tail) = rest.split_once(" bytes truncated …\n").unwrap();
        (head, count.parse().unwrap(), tail)
    }

    #[test]
    fn long_output_keeps_head_and_tail_on_char_boundaries() {
        let text = "é".repeat(100); // 200 bytes
        let capped = cap_output(text, 51);
        assert!(capped.starts_with('é') && capped.ends_with('é'));
        let (head, dropped, tail) = parts(&capped);
        assert_eq!(head.len() + dropped + tail.len(), 200);
        assert!(capped.len() <= 51, "{} bytes", capped.len());
    }

    #[test]
    fn the_result_never_exceeds_the_cap_and_counts_every_dropped_byte() {
        for len in [41usize, 99, 100, 101, 1_000, 123_457] {
            for cap in [40usize, 41, 64, 100, 1_000, 50_000] {
                let text: String = (0..len)
                    .map(|i| if i % 37 == 36 { '\n' } else { 'x' })
                    .collect();
                let capped = cap_output(text.clone(), cap);
                if len <= cap {
                    assert_eq!(capped, text);
                    continue;
                }
                assert!(capped.len() <= cap, "len {len} cap {cap}: {}", capped.len());
                let (head, dropped, tail) = parts(&capped);
                assert_eq!(head.len() + dropped + tail.len(), len);
                assert!(text.starts_with(head) && text.ends_with(tail));
            }
        }
    }

    #[test]
    fn long_lines_are_clamped_to_head_and_tail_with_a_marker() {
        let line = format!(
            "{}{}{}",
            "a".repeat(1_000),
            "m".repeat(3_000),
            "z".repeat(1_000)
        );
        let text = format!("first\n{line}\nlast");
        let capped = cap_output(text, 1_000_000);
        let lines: Vec<&str> = capped.lines().collect();
        assert_eq!(lines.len(), 3);
        assert_eq!((lines[0], lines[2]), ("first", "last"));
        assert!(lines[1].len() <= 2_000, "{}", lines[1].len());
        let expected = format!(
            "{} … 3200 bytes truncated … {}",
            "a".repeat(900),
            "z".repeat(900)
        );
        assert_eq!(lines[1], expected);
        assert_eq!(cap_output("b".repeat(2_000), 10_000), "b".repeat(2_000));
    }

    #[test]
    fn clamped_lines_are_cut_on_char_boundaries() {
        let line = "✓".repeat(1_000); // 3,000 bytes
        let capped = cap_output(line, 100_000);
        let (head, rest) = capped.split_once(" … ").unwrap();
        let (_, tail) = rest.split_once(" … ").unwrap();
        assert!(head.chars().all(|c| c == '✓') && tail.chars().all(|c| c == '✓'));
        assert!(head.len() <= 900 && tail.len() <= 900);
    }

    #[test]
    fn capping_is_idempotent() {
        let samples = [
            "short".to_string(),
            "y\n".repeat(100_000),
            "q".repeat(300_000),
            format!("{}\n{}", "é".repeat(5_000), "w".repeat(10)),
        ];
        for text in samples {
            for cap in [64usize, 2_500, 50_000] {
                let once = cap_output(text.clone(), cap);
                assert_eq!(cap_output(once.clone(), cap), once, "cap {cap}");
            }
        }
    }
}
