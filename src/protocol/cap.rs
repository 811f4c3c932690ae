//! The output cap: how a tool's text is bounded before it goes back to the model (head and tail
//! kept around one marker, long lines clamped). Used by the engine for every result and by tools
//! that bound their own output.

/// Bounds a tool's output: at most `cap` bytes, and no line longer than 2,000 bytes among others.
///
/// * When the text has other lines, any line longer than 2,000 bytes is first clamped to its
///   first and last 900 bytes around an inline ` … N bytes truncated … ` marker, so one minified
///   file or one endless progress line cannot crowd out everything else. A lone line has nothing
///   to crowd out and is not clamped, nor are the two pieces of a line the cut went through (the
///   lines just before and after a cut's marker line).
/// * Text still longer than `cap` keeps its head and its tail around one
///   `\n… N bytes truncated …\n` marker line (N counts the bytes it leaves out); the result,
///   marker included, is at most `cap` bytes (for any `cap` of 40 bytes or more). A 10 MB
///   single-line output comes back as about `cap` bytes with that one marker.
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
    fn is_cut_marker(line: &str) -> bool {
        line.strip_prefix("… ")
            .and_then(|l| l.strip_suffix(" bytes truncated …"))
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    }
    /// Whether a line must be clamped: long, among other lines, and not a piece of a cut line.
    fn clamps(s: &str) -> Vec<bool> {
        let lines: Vec<&str> = s.split('\n').collect();
        let others = lines.iter().filter(|l| !l.trim().is_empty()).count() > 1;
        (0..lines.len())
            .map(|i| {
                let beside_cut = (i > 0 && is_cut_marker(lines[i - 1]))
                    || lines.get(i + 1).is_some_and(|l| is_cut_marker(l));
                others && lines[i].len() > LINE_CAP && !beside_cut
            })
            .collect()
    }
    fn has_long_line(s: &str) -> bool {
        s.split('\n').any(|line| line.len() > LINE_CAP) && clamps(s).contains(&true)
    }
    fn clamp_lines(s: &str, out: &mut String) {
        let clamp = clamps(s);
        for (i, line) in s.split('\n').enumerate() {
            if i > 0 {
                out.push('\n');
            }
            if !clamp[i] {
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

    // Long lines first, so the cut below keeps as many other lines as fit.
    let text = if has_long_line(&text) {
        let mut out = String::with_capacity(text.len().min(cap.saturating_mul(2)));
        clamp_lines(&text, &mut out);
        out
    } else {
        text
    };
    if text.len() <= cap {
        return text;
    }
    // Room for the marker, sized for the largest count it could show.
    let widest = format!("\n… {} bytes truncated …\n", text.len()).len();
    let budget = cap.saturating_sub(widest);
    let keep_head = budget / 2;
    let keep_tail = budget - keep_head;
    let head_end = floor(&text, keep_head);
    let tail_start = ceil(&text, text.len() - keep_tail);
    let dropped = tail_start - head_end;
    format!(
        "{}\n… {dropped} bytes truncated …\n{}",
        &text[..head_end],
        &text[tail_start..]
    )
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
    fn a_lone_long_line_keeps_the_whole_cap_with_one_marker() {
        let line = "0123456789".repeat(1_000_000); // 10 MB, one line
        let capped = cap_output(line.clone(), 50_000);
        assert!(
            capped.len() <= 50_000 && capped.len() > 49_000,
            "{}",
            capped.len()
        );
        assert_eq!(capped.matches("bytes truncated").count(), 1, "one marker");
        let (head, dropped, tail) = parts(&capped);
        assert_eq!(head.len() + dropped + tail.len(), line.len());
        assert_eq!(cap_output("✓".repeat(1_000), 100_000), "✓".repeat(1_000));
    }

    #[test]
    fn clamped_lines_are_cut_on_char_boundaries() {
        let line = format!("{}\nend", "✓".repeat(1_000)); // 3,000 bytes, then another line
        let capped = cap_output(line, 100_000);
        let (head, rest) = capped.split_once(" … ").unwrap();
        let (_, tail) = rest.split_once(" … ").unwrap();
        let tail = tail.strip_suffix("\nend").unwrap();
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
            format!("a\n{}\nb\n{}", "x".repeat(90_000), "é".repeat(3_000)),
            "z".repeat(10_000_000),
        ];
        for text in samples {
            for cap in [64usize, 2_500, 50_000] {
                let once = cap_output(text.clone(), cap);
                assert_eq!(cap_output(once.clone(), cap), once, "cap {cap}");
            }
        }
    }
}
