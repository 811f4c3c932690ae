use super::*;

fn handle(capacity: usize) -> (Progress, mpsc::Receiver<ProgressEvent>, ProgressSink) {
    let (sink, rx) = ProgressSink::channel(capacity);
    let id: Arc<str> = Arc::from("toolu_1");
    let progress = sink.for_call(&id, &Span::none(), &ProgressMetrics::new());
    (progress, rx, sink)
}

/// Every event waiting on `rx` now.
fn drain(rx: &mut mpsc::Receiver<ProgressEvent>) -> Vec<ProgressEvent> {
    let mut events = Vec::new();
    while let Ok(e) = rx.try_recv() {
        events.push(e);
    }
    events
}

fn text_of(events: &[ProgressEvent], stream: OutputStream) -> String {
    events
        .iter()
        .filter_map(|e| match &e.update {
            ProgressUpdate::Output { stream: s, text } if *s == stream => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

#[test]
fn an_inert_handle_does_nothing() {
    let progress = Progress::default();
    assert!(!progress.is_on());
    progress.output(OutputStream::Stdout, b"hello");
    progress.report(1.0, Some(2.0), Some("half"));
    progress.finish();
}

#[tokio::test]
async fn output_is_sent_in_order_with_sequence_numbers_and_nothing_after_finish() {
    let (progress, mut rx, _sink) = handle(64);
    assert!(progress.is_on());
    progress.output(OutputStream::Stdout, b"one\n");
    // The first output goes at once.
    let first = drain(&mut rx);
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].seq, 1);
    assert_eq!(first[0].tool_use_id.as_ref(), "toolu_1");
    // Within the interval: coalesced, sent by the timer.
    progress.output(OutputStream::Stdout, b"two\n");
    progress.output(OutputStream::Stderr, b"warn\n");
    progress.output(OutputStream::Stdout, b"three\n");
    assert!(drain(&mut rx).is_empty(), "held back within the interval");
    tokio::time::sleep(MIN_INTERVAL * 3).await;
    let later = drain(&mut rx);
    assert_eq!(text_of(&later, OutputStream::Stdout), "two\nthree\n");
    assert_eq!(text_of(&later, OutputStream::Stderr), "warn\n");
    let seqs: Vec<u64> = later.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [2, 3]);
    // What is pending at the end is sent by finish, and nothing after it.
    progress.output(OutputStream::Stdout, b"four");
    progress.finish();
    assert!(!progress.is_on());
    progress.output(OutputStream::Stdout, b"five\n");
    progress.report(1.0, None, None);
    let last = drain(&mut rx);
    assert_eq!(text_of(&last, OutputStream::Stdout), "four");
    assert_eq!(last.iter().map(|e| e.seq).collect::<Vec<_>>(), [4]);
    tokio::time::sleep(MIN_INTERVAL * 2).await;
    assert!(drain(&mut rx).is_empty());
}

#[tokio::test]
async fn a_character_cut_between_two_writes_arrives_whole() {
    let (progress, mut rx, _sink) = handle(64);
    let text = "naïve — ünïcode 😀\n";
    let bytes = text.as_bytes();
    // Split inside the 4-byte emoji and inside the 3-byte dash.
    let dash = text.find('—').unwrap() + 1;
    let emoji = text.find('😀').unwrap() + 2;
    progress.output(OutputStream::Stdout, &bytes[..dash]);
    tokio::time::sleep(MIN_INTERVAL * 2).await;
    progress.output(OutputStream::Stdout, &bytes[dash..emoji]);
    tokio::time::sleep(MIN_INTERVAL * 2).await;
    progress.output(OutputStream::Stdout, &bytes[emoji..]);
    progress.finish();
    let events = drain(&mut rx);
    assert!(events.len() >= 2, "{events:?}");
    assert_eq!(text_of(&events, OutputStream::Stdout), text);
    // Invalid bytes are replaced, never passed on.
    let (progress, mut rx, _sink) = handle(64);
    progress.output(OutputStream::Stderr, b"ok \xff\xfe end");
    progress.finish();
    assert_eq!(
        text_of(&drain(&mut rx), OutputStream::Stderr),
        "ok \u{fffd}\u{fffd} end"
    );
}

#[tokio::test]
async fn long_output_is_cut_at_line_ends_within_the_event_limit() {
    let (progress, mut rx, _sink) = handle(64);
    let line = format!("{}\n", "x".repeat(999));
    let text = line.repeat(20); // 20,000 bytes
    progress.output(OutputStream::Stdout, text.as_bytes());
    progress.finish();
    let events = drain(&mut rx);
    assert!(events.len() >= 3, "{}", events.len());
    for e in &events {
        let ProgressUpdate::Output { text, .. } = &e.update else {
            panic!("{e:?}")
        };
        assert!(text.len() <= MAX_EVENT_TEXT);
        assert!(text.ends_with('\n'), "cut inside a line");
    }
    assert_eq!(text_of(&events, OutputStream::Stdout), text);
}

#[tokio::test]
async fn a_reader_that_does_not_keep_up_loses_output_counted_never_more_than_the_cap() {
    // One event of room, nobody reading.
    let (progress, mut rx, sink) = handle(1);
    let chunk = vec![b'a'; 8192];
    let total = 1024 * 1024;
    for _ in 0..total / chunk.len() {
        progress.output(OutputStream::Stdout, &chunk);
        assert!(sink.inner.pending.load(Ordering::Relaxed) <= CALL_PENDING);
    }
    // The call held at most its cap; the rest was dropped.
    let held = lock(&progress.0.as_ref().unwrap().state).held();
    assert!(held <= CALL_PENDING, "{held}");
    // Now the reader keeps up: the pending output comes, and says what was left out.
    let mut events = Vec::new();
    for _ in 0..100 {
        events.extend(drain(&mut rx));
        tokio::time::sleep(MIN_INTERVAL).await;
        if lock(&progress.0.as_ref().unwrap().state).held() == 0 {
            break;
        }
    }
    progress.finish();
    events.extend(drain(&mut rx));
    let shown: usize = events.iter().map(ProgressEvent::text_len).sum();
    let dropped: u64 = events.iter().map(|e| e.dropped_bytes).sum();
    assert!(dropped > 0);
    assert_eq!(
        shown as u64 + dropped,
        total as u64,
        "every byte shown or counted"
    );
    assert!(shown <= CALL_PENDING + MAX_EVENT_TEXT, "{shown}");
    assert_eq!(sink.inner.pending.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn the_calls_of_a_turn_share_one_budget_of_unsent_output() {
    let (sink, _rx) = ProgressSink::channel(1);
    let metrics = ProgressMetrics::new();
    let calls: Vec<Progress> = (0..8)
        .map(|i| sink.for_call(&Arc::from(format!("c{i}")), &Span::none(), &metrics))
        .collect();
    let chunk = vec![b'b'; 4096];
    for call in &calls {
        for _ in 0..(CALL_PENDING / chunk.len()) {
            call.output(OutputStream::Stderr, &chunk);
        }
    }
    let held: usize = calls
        .iter()
        .map(|c| lock(&c.0.as_ref().unwrap().state).held())
        .sum();
    assert!(held <= TURN_PENDING, "{held}");
    assert_eq!(sink.inner.pending.load(Ordering::Relaxed), held);
    for call in &calls {
        call.finish();
    }
    assert_eq!(sink.inner.pending.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn values_coalesce_to_the_newest_and_a_gone_reader_stops_the_call_s_progress() {
    let (progress, mut rx, _sink) = handle(64);
    progress.report(1.0, Some(10.0), Some("start"));
    progress.report(2.0, Some(10.0), None);
    progress.report(3.0, Some(10.0), Some("three"));
    tokio::time::sleep(MIN_INTERVAL * 3).await;
    let events = drain(&mut rx);
    let values: Vec<(f64, Option<String>)> = events
        .iter()
        .map(|e| match &e.update {
            ProgressUpdate::Value {
                progress, message, ..
            } => (*progress, message.clone()),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        values,
        [(1.0, Some("start".into())), (3.0, Some("three".into()))]
    );
    assert_eq!(
        events[1].to_json(),
        json!({"tool_use_id": "toolu_1", "seq": 2, "kind": "progress", "progress": 3.0,
               "total": 10.0, "message": "three"})
    );
    drop(rx);
    progress.output(OutputStream::Stdout, b"nobody reads this\n");
    assert!(!progress.is_on());
}

#[test]
fn an_output_event_s_json_names_its_stream_and_what_was_dropped() {
    let event = ProgressEvent {
        tool_use_id: Arc::from("t"),
        seq: 7,
        dropped_bytes: 12,
        update: ProgressUpdate::Output {
            stream: OutputStream::Stderr,
            text: "x\n".into(),
        },
    };
    assert_eq!(
        event.to_json(),
        json!({"tool_use_id": "t", "seq": 7, "kind": "output", "stream": "stderr",
               "text": "x\n", "dropped_bytes": 12})
    );
}

#[test]
fn an_incomplete_character_is_found_at_the_end_only() {
    assert_eq!(incomplete_suffix(b"abc"), 0);
    assert_eq!(incomplete_suffix("é".as_bytes()), 0);
    assert_eq!(incomplete_suffix(&"é".as_bytes()[..1]), 1);
    assert_eq!(incomplete_suffix(&"😀".as_bytes()[..3]), 3);
    assert_eq!(incomplete_suffix(&"a😀".as_bytes()[..3]), 2);
    assert_eq!(incomplete_suffix(&"—".as_bytes()[..2]), 2);
    assert_eq!(incomplete_suffix(b"\x80\x80\x80"), 0);
    assert_eq!(incomplete_suffix(b""), 0);
    assert_eq!(cut(b"", false), 0);
    assert_eq!(cut(&"a😀".as_bytes()[..3], false), 1);
    assert_eq!(cut(&"a😀".as_bytes()[..3], true), 3);
}

/// Every event sent is also a `progress` event on the call's span (at debug), naming the call
/// and the event's sequence number and size.
#[tokio::test]
async fn each_event_sent_is_an_event_on_the_call_s_span() {
    use std::io::Write;

    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);
    impl Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            lock(&self.0).extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let span = tracing::info_span!("execute_tool", gen_ai.tool.call.id = "toolu_9");
    let (sink, mut rx) = ProgressSink::channel(8);
    let progress = sink.for_call(&Arc::from("toolu_9"), &span, &ProgressMetrics::new());
    progress.output(OutputStream::Stdout, b"hello\n");
    progress.finish();
    assert_eq!(drain(&mut rx).len(), 1);
    let text = String::from_utf8(lock(&lines.0).clone()).unwrap();
    let line = text
        .lines()
        .find(|l| l.contains("progress"))
        .unwrap_or_else(|| panic!("no progress event: {text}"));
    assert!(line.contains("execute_tool"), "{line}");
    assert!(
        line.contains("progress.seq=1") && line.contains("progress.bytes=6"),
        "{line}"
    );
}
