//! Splits a byte stream into JSON texts (RFC 7047 §3: messages are JSON
//! objects sent back to back, with no length prefix or delimiter).
//!
//! Pure: bytes go in with [`Framer::feed`], complete values come out. The
//! framer tracks only nesting depth and string state, so it never parses a
//! partial message twice; a message is handed to `serde_json` once, when its
//! closing bracket arrives.

use serde_json::Value;

use crate::Error;

/// Default cap on one message: large enough for a full SB dump of a big
/// cluster, small enough that a runaway peer cannot exhaust memory.
pub const DEFAULT_MAX_MESSAGE: usize = 64 * 1024 * 1024;

/// Incremental JSON stream splitter with a size cap.
#[derive(Debug)]
pub struct Framer {
    buf: Vec<u8>,
    /// Index of the next byte to scan.
    pos: usize,
    /// Index where the current (incomplete) message starts, if one started.
    start: Option<usize>,
    depth: usize,
    in_string: bool,
    escape: bool,
    max: usize,
}

impl Default for Framer {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_MESSAGE)
    }
}

impl Framer {
    /// A framer that rejects any message longer than `max_message` bytes.
    pub fn new(max_message: usize) -> Self {
        Self {
            buf: Vec::with_capacity(8 * 1024),
            pos: 0,
            start: None,
            depth: 0,
            in_string: false,
            escape: false,
            max: max_message,
        }
    }

    /// The configured size cap in bytes.
    pub fn max_message(&self) -> usize {
        self.max
    }

    /// Bytes buffered but not yet returned as a complete message.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Appends `bytes` and returns every message they complete, in order.
    ///
    /// After an error the stream is out of sync; the caller must drop the
    /// connection (the framer is not reusable).
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Vec<Value>, Error> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        let mut consumed = 0;
        let mut i = self.pos;
        while i < self.buf.len() {
            let b = self.buf[i];
            match self.start {
                None => {
                    if matches!(b, b' ' | b'\t' | b'\r' | b'\n') {
                        consumed = i + 1;
                    } else if b == b'{' || b == b'[' {
                        self.start = Some(i);
                        self.depth = 1;
                    } else {
                        return Err(Error::Malformed {
                            reason: format!("unexpected byte 0x{b:02x} between JSON-RPC messages"),
                        });
                    }
                }
                Some(start) => {
                    if self.in_string {
                        if self.escape {
                            self.escape = false;
                        } else if b == b'\\' {
                            self.escape = true;
                        } else if b == b'"' {
                            self.in_string = false;
                        }
                    } else {
                        match b {
                            b'"' => self.in_string = true,
                            b'{' | b'[' => self.depth += 1,
                            b'}' | b']' => {
                                self.depth -= 1;
                                if self.depth == 0 {
                                    let text = &self.buf[start..=i];
                                    let value: Value =
                                        serde_json::from_slice(text).map_err(|e| {
                                            Error::Malformed {
                                                reason: format!("invalid JSON: {e}"),
                                            }
                                        })?;
                                    out.push(value);
                                    self.start = None;
                                    consumed = i + 1;
                                }
                            }
                            _ => {}
                        }
                    }
                    if let Some(start) = self.start
                        && i + 1 - start > self.max
                    {
                        return Err(Error::Oversized { limit: self.max });
                    }
                }
            }
            i += 1;
        }
        // Drop what was returned once per feed rather than per message, so a
        // read that carries many small messages stays linear.
        self.buf.drain(..consumed);
        self.pos = i - consumed;
        if let Some(start) = self.start.as_mut() {
            *start -= consumed;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn splits_back_to_back_messages() {
        let mut f = Framer::default();
        let got = f.feed(br#"{"a":1}{"b":[1,2]} [3]"#).unwrap();
        assert_eq!(got, vec![json!({"a":1}), json!({"b":[1,2]}), json!([3])]);
        assert_eq!(f.buffered(), 0);
    }

    #[test]
    fn byte_at_a_time_partial_reads() {
        let text = br#"{"id":1,"result":[{"rows":[{"s":"x}]{\"y"}]}],"error":null}"#;
        let mut f = Framer::default();
        let mut got = Vec::new();
        for b in text.iter() {
            got.extend(f.feed(std::slice::from_ref(b)).unwrap());
        }
        assert_eq!(got.len(), 1);
        assert_eq!(got[0]["result"][0]["rows"][0]["s"], json!("x}]{\"y"));
    }

    #[test]
    fn message_split_across_feeds_keeps_state() {
        let mut f = Framer::default();
        assert!(f.feed(br#"{"s":"a\"#).unwrap().is_empty());
        // The escape state carries across the split: `\"` is not the end.
        let got = f.feed(br#"""}{"t":2}"#).unwrap();
        assert_eq!(got, vec![json!({"s":"a\""}), json!({"t":2})]);
    }

    #[test]
    fn garbage_is_malformed() {
        let mut f = Framer::default();
        assert!(matches!(
            f.feed(b"HTTP/1.1 200 OK\r\n"),
            Err(Error::Malformed { .. })
        ));
        let mut f = Framer::default();
        assert!(matches!(
            f.feed(b"{\"a\":tru}"),
            Err(Error::Malformed { .. })
        ));
    }

    #[test]
    fn oversized_is_rejected_before_completion() {
        let mut f = Framer::new(16);
        assert!(f.feed(b"{\"a\":\"0123").unwrap().is_empty());
        assert!(matches!(
            f.feed(b"456789abcdef"),
            Err(Error::Oversized { limit: 16 })
        ));
    }

    #[test]
    fn exactly_at_cap_is_accepted() {
        let mut f = Framer::new(9);
        assert_eq!(f.feed(b"{\"a\":123}").unwrap(), vec![json!({"a":123})]);
    }
}
