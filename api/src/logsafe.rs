//! What may reach a log line: the policy both binaries' loggers apply so
//! that no Secret's data, no PEM and no token is ever written, whatever
//! `RUST_LOG` asks for.
//!
//! Two guards, both pure (the writer adapter does no I/O of its own):
//!
//! - [`drops_target`]: event targets that are never written, at any level.
//!   kube-rs' `kube_client::client` logs a response body it could not
//!   decode (`"{body}, {error}"` at WARN in `Client::request`, the body of
//!   an error response at DEBUG): for a Secret that is its data, for a CSR
//!   its PEM. Everything that module reports is also returned to the
//!   caller as an error, which the caller logs, so dropping it loses no
//!   failure.
//! - [`redact`] and [`RedactingWriter`]: every formatted event passes
//!   through [`redact`] on its way out. PEM blocks (as text, or base64 of
//!   the text, as in a Secret's `data`) and JWTs (ServiceAccount tokens)
//!   become a marker naming what was removed. This is the backstop for
//!   paths no one audited: an error message that quotes a value (serde's
//!   "invalid type: string \"…\"") or a dependency's debug output.
//!
//! Neither guard decides what is secret in general (an arbitrary Secret
//! value has no shape to recognise); that is why objects that hold secrets
//! are never decoded by a library that may echo them (the controller's
//! `secret` module), and errors name fields, never values.

use std::borrow::Cow;
use std::io::{self, Write};

/// The JSON log layer of both binaries (feature `log-layer`): lines written
/// to what `make` returns (one writer per event) at the levels `filter`
/// lets through, with both guards outside `filter`, so no `RUST_LOG`
/// directive writes a dropped target or skips the redaction.
#[cfg(feature = "log-layer")]
pub fn json_layer<S, W, F>(
    filter: tracing_subscriber::EnvFilter,
    make: F,
) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    W: Write,
    F: Fn() -> W + Send + Sync + 'static,
{
    use tracing_subscriber::Layer as _;
    tracing_subscriber::fmt::layer()
        .json()
        .with_writer(move || RedactingWriter::new(make()))
        .with_filter(filter)
        .with_filter(tracing_subscriber::filter::filter_fn(|meta| {
            !drops_target(meta.target())
        }))
}

/// Whether events of `target` must never be written (see the module
/// documentation). Exact match: `kube_client::client::builder` (the
/// request span, which carries only the URL) and `kube_client::client::tls`
/// stay.
pub fn drops_target(target: &str) -> bool {
    BODY_ECHOING_TARGETS.contains(&target)
}

/// The targets [`drops_target`] refuses: modules that log response bodies.
pub const BODY_ECHOING_TARGETS: &[&str] = &["kube_client::client"];

/// What replaces a PEM block (armored text).
pub const PEM_MARKER: &str = "[redacted PEM]";
/// What replaces base64 of a PEM block (a Secret's or CSR's encoded data).
pub const BASE64_PEM_MARKER: &str = "[redacted base64 PEM]";
/// What replaces a JWT (a ServiceAccount token).
pub const TOKEN_MARKER: &str = "[redacted token]";

/// `-----BEGIN`, the start of every PEM block.
const PEM_BEGIN: &[u8] = b"-----BEGIN";

/// `-----BEGIN` in base64 at each of the three alignments a PEM can have
/// inside an encoded value (the value starts with it, or one or two bytes
/// precede it). Each is a run of whole base64 quanta that encode only
/// bytes of `-----BEGIN`.
const BASE64_PEM_BEGIN: [&[u8]; 3] = [b"LS0tLS1CRUdJT", b"LS0tLUJFR0lO", b"tLS0tQkVHSU4"];

/// `{"` in base64url: how every JWT's header starts.
const JWT_START: &[u8] = b"eyJ";

/// `line` with every PEM block, base64 of a PEM block and JWT replaced by
/// a marker ([`PEM_MARKER`], [`BASE64_PEM_MARKER`], [`TOKEN_MARKER`]).
/// Borrowed when nothing was found. The markers hold no quote or
/// backslash and a removed span never ends inside an escape sequence, so
/// a JSON line stays JSON.
pub fn redact(line: &[u8]) -> Cow<'_, [u8]> {
    let mut out: Option<Vec<u8>> = None;
    let mut copied = 0;
    let mut i = 0;
    while i < line.len() {
        let found = if line[i..].starts_with(PEM_BEGIN) {
            Some((i, pem_end(line, i), PEM_MARKER))
        } else if BASE64_PEM_BEGIN.iter().any(|p| line[i..].starts_with(p)) {
            let start = run_start(line, i, is_base64);
            Some((
                start.max(copied),
                run_end(line, i, is_base64),
                BASE64_PEM_MARKER,
            ))
        } else if line[i..].starts_with(JWT_START) {
            jwt_end(line, i).map(|end| (i, end, TOKEN_MARKER))
        } else {
            None
        };
        match found {
            Some((start, end, marker)) => {
                let buf = out.get_or_insert_with(|| Vec::with_capacity(line.len()));
                buf.extend_from_slice(&line[copied..start]);
                buf.extend_from_slice(marker.as_bytes());
                copied = end;
                i = end;
            }
            None => i += 1,
        }
    }
    match out {
        None => Cow::Borrowed(line),
        Some(mut buf) => {
            buf.extend_from_slice(&line[copied..]);
            Cow::Owned(buf)
        }
    }
}

/// [`redact`] of a string (a log message or an error built for output).
pub fn redact_str(text: &str) -> Cow<'_, str> {
    match redact(text.as_bytes()) {
        Cow::Borrowed(_) => Cow::Borrowed(text),
        // The markers are ASCII and spans are cut at ASCII boundaries.
        Cow::Owned(bytes) => Cow::Owned(String::from_utf8_lossy(&bytes).into_owned()),
    }
}

fn is_base64(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'=')
}

fn is_base64url(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_')
}

/// Characters of a PEM block in any rendering: base64, the armor's dashes
/// and label, header lines (`Proc-Type: 4,ENCRYPTED`), whitespace.
fn is_pem_char(b: u8) -> bool {
    is_base64(b) || matches!(b, b'-' | b' ' | b':' | b',' | b'\n' | b'\r' | b'\t')
}

/// The end of the PEM block starting at `start`: just after its
/// `-----END …-----` line, or, for a block cut short, as far as PEM
/// characters and escaped line breaks (`\n`, `\\n` of a JSON or Debug
/// rendering) go.
fn pem_end(line: &[u8], start: usize) -> usize {
    let run = pem_run_end(line, start);
    let block = &line[start..run];
    let Some(end) = find(block, b"-----END") else {
        return run;
    };
    let label = end + b"-----END".len();
    match find(&block[label..], b"-----") {
        Some(close) => start + label + close + b"-----".len(),
        None => run,
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// How far PEM characters and escaped line breaks go from `start`.
/// Backslashes followed by anything else are left, so an escape is never
/// cut in half.
fn pem_run_end(line: &[u8], start: usize) -> usize {
    let mut i = start;
    while i < line.len() {
        if is_pem_char(line[i]) {
            i += 1;
            continue;
        }
        if line[i] == b'\\' {
            let mut j = i;
            while j < line.len() && line[j] == b'\\' {
                j += 1;
            }
            if j < line.len() && matches!(line[j], b'n' | b'r' | b't') {
                i = j + 1;
                continue;
            }
        }
        break;
    }
    i
}

fn run_start(line: &[u8], mut i: usize, class: fn(u8) -> bool) -> usize {
    while i > 0 && class(line[i - 1]) {
        i -= 1;
    }
    i
}

fn run_end(line: &[u8], mut i: usize, class: fn(u8) -> bool) -> usize {
    while i < line.len() && class(line[i]) {
        i += 1;
    }
    i
}

/// The end of the JWT starting at `start` (three base64url parts joined by
/// dots, the signature possibly empty), if there is one.
fn jwt_end(line: &[u8], start: usize) -> Option<usize> {
    let mut i = start;
    for part in 0..3 {
        let end = run_end(line, i, is_base64url);
        if end == i && part < 2 {
            return None;
        }
        i = end;
        if part < 2 {
            if line.get(i) != Some(&b'.') {
                return None;
            }
            i += 1;
        }
    }
    Some(i)
}

/// An [`io::Write`] that holds everything written to it and, on
/// [`flush`](Write::flush) or drop, writes it [`redact`]ed to `inner`.
/// Made once per event by the logger (tracing-subscriber's `MakeWriter`
/// calls its closure per event), so an event is redacted whole even when
/// it spans several writes or lines.
#[derive(Debug)]
pub struct RedactingWriter<W: Write> {
    inner: W,
    held: Vec<u8>,
}

impl<W: Write> RedactingWriter<W> {
    /// A writer that redacts into `inner`.
    pub fn new(inner: W) -> Self {
        RedactingWriter {
            inner,
            held: Vec::new(),
        }
    }

    fn emit(&mut self) -> io::Result<()> {
        if self.held.is_empty() {
            return Ok(());
        }
        let held = std::mem::take(&mut self.held);
        self.inner.write_all(&redact(&held))
    }
}

impl<W: Write> Write for RedactingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.held.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.emit()?;
        self.inner.flush()
    }
}

impl<W: Write> Drop for RedactingWriter<W> {
    fn drop(&mut self) {
        // A logger has nowhere to report its own failed write.
        let _ = self.emit();
        let _ = self.inner.flush();
    }
}

/// A writer that keeps everything a logger writes, for the tests that
/// grep every line (feature `test-util`): clone it into the layer's
/// writer, read it back with [`LogCapture::text`].
#[cfg(feature = "test-util")]
#[derive(Debug, Clone, Default)]
pub struct LogCapture(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

#[cfg(feature = "test-util")]
impl LogCapture {
    /// What was written so far.
    pub fn text(&self) -> String {
        let bytes = self.0.lock().unwrap_or_else(|p| p.into_inner());
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

#[cfg(feature = "test-util")]
impl Write for LogCapture {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests;
