//! A Server-Sent Events parser (WHATWG HTML §9.2.6) over a byte stream.
//!
//! Lines end in CRLF, LF or CR, also when split across chunks; `:` lines are
//! comments (keep-alives); several `data:` lines join with `\n`; an event is
//! dispatched on a blank line, and an unfinished event at the end of the
//! stream is dropped. Only the data matters to A2A: `event:` names are not
//! used by the protocol, and `id:` and `retry:` serve reconnection, which
//! A2A 1.0 does not define, so they are skipped.

use std::collections::VecDeque;

use bytes::Bytes;
use futures_util::{Stream, StreamExt, stream};

use super::DelegateError;
use super::wire::MAX_BODY_BYTES;

/// A line or an event exceeded the size limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct TooLarge;

/// Incremental parser: feed it chunks, collect the events they complete.
#[derive(Debug)]
pub(super) struct SseParser {
    limit: usize,
    line: Vec<u8>,
    /// The previous chunk ended in CR: a leading LF belongs to that line end.
    after_cr: bool,
    first_line: bool,
    data: String,
}

impl SseParser {
    /// A parser refusing lines and events longer than `limit` bytes.
    pub(super) fn new(limit: usize) -> Self {
        Self { limit, line: Vec::new(), after_cr: false, first_line: true, data: String::new() }
    }

    /// Consumes `chunk` and returns the data of the events it completes, in order.
    pub(super) fn feed(&mut self, mut chunk: &[u8]) -> Result<Vec<String>, TooLarge> {
        let mut events = Vec::new();
        if chunk.is_empty() {
            return Ok(events);
        }
        if self.after_cr && chunk.first() == Some(&b'\n') {
            chunk = &chunk[1..];
        }
        self.after_cr = false;
        while let Some(end) = chunk.iter().position(|b| matches!(b, b'\r' | b'\n')) {
            self.push_bytes(&chunk[..end])?;
            let line = std::mem::take(&mut self.line);
            events.extend(self.process_line(&line)?);
            let crlf = chunk[end] == b'\r' && chunk.get(end + 1) == Some(&b'\n');
            self.after_cr = chunk[end] == b'\r' && end + 1 == chunk.len();
            chunk = &chunk[end + if crlf { 2 } else { 1 }..];
        }
        self.push_bytes(chunk)?;
        Ok(events)
    }

    fn push_bytes(&mut self, bytes: &[u8]) -> Result<(), TooLarge> {
        if self.line.len() + bytes.len() > self.limit {
            return Err(TooLarge);
        }
        self.line.extend_from_slice(bytes);
        Ok(())
    }

    fn process_line(&mut self, line: &[u8]) -> Result<Option<String>, TooLarge> {
        let line = if std::mem::take(&mut self.first_line) {
            line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line)
        } else {
            line
        };
        if line.is_empty() {
            return Ok(self.dispatch());
        }
        if line.starts_with(b":") {
            return Ok(None);
        }
        let line = String::from_utf8_lossy(line);
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line.as_ref(), ""),
        };
        if field == "data" {
            if self.data.len() + value.len() + 1 > self.limit {
                return Err(TooLarge);
            }
            self.data.push_str(value);
            self.data.push('\n');
        }
        Ok(None)
    }

    /// The data of the event ended by a blank line; `None` without `data:`.
    fn dispatch(&mut self) -> Option<String> {
        if self.data.is_empty() {
            return None;
        }
        let mut data = std::mem::take(&mut self.data);
        data.pop();
        Some(data)
    }
}

/// The data of the events of an SSE `body` read from `url`; ends after the first error.
pub(super) fn events<S>(url: String, body: S) -> impl Stream<Item = Result<String, DelegateError>> + Send + 'static
where
    S: Stream<Item = reqwest::Result<Bytes>> + Send + 'static,
{
    struct State<S> {
        body: std::pin::Pin<Box<S>>,
        parser: SseParser,
        ready: VecDeque<String>,
        done: bool,
        url: String,
    }
    let state = State {
        body: Box::pin(body),
        parser: SseParser::new(MAX_BODY_BYTES),
        ready: VecDeque::new(),
        done: false,
        url,
    };
    stream::unfold(state, |mut state| async move {
        loop {
            if let Some(event) = state.ready.pop_front() {
                return Some((Ok(event), state));
            }
            if state.done {
                return None;
            }
            let Some(chunk) = state.body.next().await else {
                state.done = true;
                continue;
            };
            let failure = match chunk {
                Ok(chunk) => match state.parser.feed(&chunk) {
                    Ok(events) => {
                        state.ready.extend(events);
                        continue;
                    }
                    Err(TooLarge) => super::wire::protocol(
                        &state.url,
                        format!("an event stream line or event is larger than {MAX_BODY_BYTES} bytes"),
                    ),
                },
                Err(source) => DelegateError::Http { url: state.url.clone(), source },
            };
            state.done = true;
            return Some((Err(failure), state));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(data: &str) -> String {
        data.to_owned()
    }

    fn parse_in_chunks(input: &[u8], chunk: usize) -> Vec<String> {
        let mut parser = SseParser::new(1024);
        input.chunks(chunk).flat_map(|c| parser.feed(c).expect("within the limit")).collect()
    }

    #[test]
    fn every_split_of_the_input_yields_the_same_events() {
        let input = b"\xEF\xBB\xBFdata: {\"a\":1}\r\n\r\n: keep-alive\r\n\r\ndata:first\ndata: second\n\nevent: note\rdata: x\r\rdata: a\r\ndata: b\r\n\r\n";
        let expected = vec![event("{\"a\":1}"), event("first\nsecond"), event("x"), event("a\nb")];
        for chunk in 1..=input.len() {
            assert_eq!(parse_in_chunks(input, chunk), expected, "chunk size {chunk}");
        }
    }

    #[test]
    fn crlf_split_between_chunks_is_one_line_end() {
        let mut parser = SseParser::new(1024);
        assert_eq!(parser.feed(b"data: a\r").unwrap(), Vec::<String>::new());
        assert_eq!(parser.feed(b"\n\r").unwrap(), vec![event("a")]);
        assert_eq!(parser.feed(b"\ndata: b\n\n").unwrap(), vec![event("b")]);
    }

    #[test]
    fn comments_and_empty_events_dispatch_nothing() {
        let mut parser = SseParser::new(1024);
        assert_eq!(parser.feed(b": ping\n\n:\n\nevent: x\n\nid: 7\n\n").unwrap(), Vec::<String>::new());
        assert_eq!(parser.feed(b"data\n\n").unwrap(), vec![event("")]);
    }

    #[test]
    fn only_one_space_after_the_colon_is_stripped() {
        assert_eq!(parse_in_chunks(b"data:  two\n\n", 4), vec![event(" two")]);
    }

    #[test]
    fn an_unfinished_event_at_the_end_is_dropped() {
        assert_eq!(parse_in_chunks(b"data: done\n\ndata: half", 3), vec![event("done")]);
    }

    #[test]
    fn oversized_lines_and_events_are_refused() {
        let mut parser = SseParser::new(8);
        assert_eq!(parser.feed(b"data: 0123456789"), Err(TooLarge));
        let mut parser = SseParser::new(8);
        assert_eq!(parser.feed(b"data:1234\ndata:5678\n"), Err(TooLarge));
    }

    #[tokio::test]
    async fn the_stream_yields_events_then_ends() {
        let chunks: Vec<reqwest::Result<Bytes>> =
            vec![Ok(Bytes::from_static(b"data: 1\n")), Ok(Bytes::from_static(b"\ndata: 2\n\n: bye\n"))];
        let events: Vec<_> = events("http://agent".into(), stream::iter(chunks)).collect().await;
        let data: Vec<_> = events.into_iter().map(|e| e.expect("no error")).collect();
        assert_eq!(data, ["1", "2"]);
    }
}
