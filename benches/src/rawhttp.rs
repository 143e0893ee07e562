//! A minimal HTTP/1.1-over-TLS client for load generation.
//!
//! A load generator shares the machine with the server it measures, so what
//! it spends on itself is taken from the server. `kube`'s client runs each
//! connection in a task of its own and hands the body over through a
//! channel: two task wake-ups and a tower stack per read. Here one task owns
//! its TLS stream, writes a request in one write and parses the answer in
//! place. Only what the benches send is supported: bearer-token requests
//! with a complete body, answers with `Content-Length` or chunked bodies.

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use base64::Engine as _;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// Where and how to connect: address, trust and token from a kubeconfig.
#[derive(Clone)]
pub struct Connector {
    tls: tokio_rustls::TlsConnector,
    addr: SocketAddr,
    name: ServerName<'static>,
    authorization: String,
}

impl Connector {
    /// Reads the current context's server, CA data and token from a
    /// kubeconfig (only `https://IP:port` servers).
    pub fn from_kubeconfig(path: &Path) -> io::Result<Self> {
        let config = kube::config::Kubeconfig::read_from(path).map_err(invalid)?;
        let cluster = config
            .clusters
            .first()
            .and_then(|c| c.cluster.as_ref())
            .ok_or_else(|| invalid("kubeconfig has no cluster"))?;
        let server = cluster
            .server
            .as_deref()
            .and_then(|s| s.strip_prefix("https://"))
            .ok_or_else(|| invalid("kubeconfig server is not https://"))?;
        let addr: SocketAddr = server.trim_end_matches('/').parse().map_err(invalid)?;
        let ca_b64 = cluster
            .certificate_authority_data
            .as_deref()
            .ok_or_else(|| invalid("kubeconfig has no certificate-authority-data"))?;
        let ca_pem = base64::engine::general_purpose::STANDARD
            .decode(ca_b64)
            .map_err(invalid)?;
        let token = config
            .auth_infos
            .first()
            .and_then(|a| a.auth_info.as_ref())
            .and_then(|a| a.token.as_ref())
            .ok_or_else(|| invalid("kubeconfig has no token"))?;
        let mut roots = rustls::RootCertStore::empty();
        for block in pem::parse_many(&ca_pem).map_err(invalid)? {
            roots
                .add(CertificateDer::from(block.into_contents()))
                .map_err(invalid)?;
        }
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(invalid)?
            .with_root_certificates(roots)
            .with_no_client_auth();
        use secrecy::ExposeSecret as _;
        Ok(Self {
            tls: tokio_rustls::TlsConnector::from(Arc::new(tls)),
            addr,
            name: ServerName::IpAddress(addr.ip().into()),
            authorization: format!("Bearer {}", token.expose_secret()),
        })
    }

    /// A new connection (TLS handshake done).
    pub async fn connect(&self) -> io::Result<Conn> {
        let tcp = TcpStream::connect(self.addr).await?;
        tcp.set_nodelay(true)?;
        let tls = self.tls.connect(self.name.clone(), tcp).await?;
        Ok(Conn {
            tls,
            host: self.addr.to_string(),
            authorization: self.authorization.clone(),
            buf: Vec::with_capacity(64 * 1024),
            start: 0,
        })
    }
}

/// One keep-alive connection.
pub struct Conn {
    tls: TlsStream<TcpStream>,
    /// `host` header value.
    host: String,
    authorization: String,
    /// Bytes read and not yet consumed: `buf[start..]`.
    buf: Vec<u8>,
    start: usize,
}

/// An answer: status and complete body.
pub struct Response {
    /// HTTP status code.
    pub status: u16,
    /// The body, de-chunked.
    pub body: Vec<u8>,
}

/// How the body of an answer is framed.
enum Framing {
    Length(usize),
    Chunked,
}

impl Conn {
    /// Sends one request and reads its whole answer.
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        content_type: &str,
        body: &[u8],
    ) -> io::Result<Response> {
        self.send(method, path, content_type, body).await?;
        let (status, framing) = self.head().await?;
        let body = match framing {
            Framing::Length(n) => {
                while self.buf.len() - self.start < n {
                    self.fill().await?;
                }
                let body = self.buf[self.start..self.start + n].to_vec();
                self.start += n;
                body
            }
            Framing::Chunked => {
                let mut body = Vec::new();
                let mut chunked = Chunked::default();
                let mut scratch = [0u8; 16 * 1024];
                loop {
                    let n = chunked.read(self, &mut scratch).await?;
                    if n == 0 {
                        break;
                    }
                    body.extend_from_slice(&scratch[..n]);
                }
                body
            }
        };
        Ok(Response { status, body })
    }

    /// Sends a GET for a streamed (chunked) answer, e.g. a watch.
    pub async fn stream(mut self, path: &str) -> io::Result<Body> {
        self.send("GET", path, "", &[]).await?;
        let (status, framing) = self.head().await?;
        if status != 200 {
            return Err(invalid(format!("stream {path}: status {status}")));
        }
        if !matches!(framing, Framing::Chunked) {
            return Err(invalid(format!("stream {path}: answer is not chunked")));
        }
        Ok(Body {
            conn: self,
            chunked: Chunked::default(),
        })
    }

    async fn send(
        &mut self,
        method: &str,
        path: &str,
        content_type: &str,
        body: &[u8],
    ) -> io::Result<()> {
        let mut req = Vec::with_capacity(256 + body.len());
        req.extend_from_slice(
            format!(
                "{method} {path} HTTP/1.1\r\nhost: {}\r\nauthorization: {}\r\naccept: application/json\r\n",
                self.host, self.authorization
            )
            .as_bytes(),
        );
        if !body.is_empty() {
            req.extend_from_slice(
                format!(
                    "content-type: {content_type}\r\ncontent-length: {}\r\n",
                    body.len()
                )
                .as_bytes(),
            );
        }
        req.extend_from_slice(b"\r\n");
        req.extend_from_slice(body);
        self.tls.write_all(&req).await?;
        self.tls.flush().await
    }

    /// Reads and parses a response head; leaves the body in the buffer.
    async fn head(&mut self) -> io::Result<(u16, Framing)> {
        loop {
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut resp = httparse::Response::new(&mut headers);
            match resp.parse(&self.buf[self.start..]).map_err(invalid)? {
                httparse::Status::Complete(len) => {
                    let status = resp.code.unwrap_or(0);
                    let mut framing = Framing::Length(0);
                    for h in resp.headers.iter() {
                        if h.name.eq_ignore_ascii_case("content-length") {
                            let n = std::str::from_utf8(h.value)
                                .ok()
                                .and_then(|v| v.trim().parse().ok())
                                .ok_or_else(|| invalid("bad content-length"))?;
                            framing = Framing::Length(n);
                        } else if h.name.eq_ignore_ascii_case("transfer-encoding")
                            && h.value.eq_ignore_ascii_case(b"chunked")
                        {
                            framing = Framing::Chunked;
                        }
                    }
                    self.start += len;
                    return Ok((status, framing));
                }
                httparse::Status::Partial => self.fill().await?,
            }
        }
    }

    /// Reads more bytes from the stream into the buffer (compacting first).
    async fn fill(&mut self) -> io::Result<()> {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        if self.buf.capacity() - self.buf.len() < 16 * 1024 {
            self.buf.reserve(64 * 1024);
        }
        // Appends into the spare capacity: nothing is zeroed per read.
        let n = self.tls.read_buf(&mut self.buf).await?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed",
            ));
        }
        Ok(())
    }
}

/// Chunked transfer decoding state.
#[derive(Default)]
struct Chunked {
    /// Data bytes left in the current chunk.
    left: usize,
    /// The CRLF after a chunk's data is still to be consumed.
    crlf: bool,
    /// The last chunk has been read.
    done: bool,
}

impl Chunked {
    /// Reads de-chunked body bytes into `out`; 0 at the end of the body.
    async fn read(&mut self, conn: &mut Conn, out: &mut [u8]) -> io::Result<usize> {
        loop {
            if self.done {
                return Ok(0);
            }
            let have = conn.buf.len() - conn.start;
            if self.left > 0 {
                if have == 0 {
                    conn.fill().await?;
                    continue;
                }
                let n = self.left.min(have).min(out.len());
                out[..n].copy_from_slice(&conn.buf[conn.start..conn.start + n]);
                conn.start += n;
                self.left -= n;
                self.crlf = self.left == 0;
                return Ok(n);
            }
            let pending = &conn.buf[conn.start..];
            if self.crlf {
                if pending.len() < 2 {
                    conn.fill().await?;
                    continue;
                }
                if &pending[..2] != b"\r\n" {
                    return Err(invalid("chunk not followed by CRLF"));
                }
                conn.start += 2;
                self.crlf = false;
                continue;
            }
            let Some(eol) = memchr::memmem::find(pending, b"\r\n") else {
                if pending.len() > 1024 {
                    return Err(invalid("chunk size line too long"));
                }
                conn.fill().await?;
                continue;
            };
            let line = std::str::from_utf8(&pending[..eol]).map_err(invalid)?;
            let size = line.split(';').next().unwrap_or("").trim();
            let size = usize::from_str_radix(size, 16).map_err(invalid)?;
            conn.start += eol + 2;
            if size == 0 {
                // No trailers are sent by the servers this talks to: the
                // final CRLF follows.
                while conn.buf.len() - conn.start < 2 {
                    conn.fill().await?;
                }
                conn.start += 2;
                self.done = true;
                return Ok(0);
            }
            self.left = size;
        }
    }
}

/// A streamed answer's body (its own connection).
pub struct Body {
    conn: Conn,
    chunked: Chunked,
}

impl Body {
    /// Reads de-chunked bytes into `out`; 0 at the end of the stream.
    pub async fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        self.chunked.read(&mut self.conn, out).await
    }
}

fn invalid(e: impl ToString) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use apiserver::{ADMIN_TOKEN, ApiServer};

    #[tokio::test]
    async fn writes_and_streams_against_the_embedded_server() {
        let server = ApiServer::builder().start().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        server.write_kubeconfig(&kubeconfig, ADMIN_TOKEN).unwrap();
        let connector = Connector::from_kubeconfig(&kubeconfig).unwrap();

        let watch = connector.connect().await.unwrap();
        let mut body = watch
            .stream("/api/v1/namespaces/default/configmaps?watch=true")
            .await
            .unwrap();
        let mut conn = connector.connect().await.unwrap();
        for i in 0..3 {
            let cm = format!(
                r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"c{i}"}},"data":{{"k":"{}"}}}}"#,
                "x".repeat(40_000 * i)
            );
            let resp = conn
                .request(
                    "POST",
                    "/api/v1/namespaces/default/configmaps",
                    "application/json",
                    cm.as_bytes(),
                )
                .await
                .unwrap();
            assert_eq!(resp.status, 201, "{}", String::from_utf8_lossy(&resp.body));
            let obj: serde_json::Value = serde_json::from_slice(&resp.body).unwrap();
            assert_eq!(obj["metadata"]["name"], format!("c{i}"));
        }
        // A refused write is an answer too, and the connection stays usable.
        let resp = conn
            .request(
                "POST",
                "/api/v1/namespaces/default/configmaps",
                "application/json",
                b"{",
            )
            .await
            .unwrap();
        assert_eq!(resp.status, 400);
        let resp = conn
            .request("GET", "/api/v1/namespaces/default/configmaps/c0", "", &[])
            .await
            .unwrap();
        assert_eq!(resp.status, 200);

        // The stream carries the three events, whole, across chunk and
        // read boundaries (the last one is 80 kB).
        let mut seen = Vec::new();
        let mut buf = vec![0u8; 1000];
        while seen.iter().filter(|c| **c == b'\n').count() < 3 {
            let n = body.read(&mut buf).await.unwrap();
            assert!(n > 0);
            seen.extend_from_slice(&buf[..n]);
        }
        let names: Vec<String> = seen
            .split(|c| *c == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| {
                let ev: serde_json::Value = serde_json::from_slice(l).unwrap();
                assert_eq!(ev["type"], "ADDED");
                ev["object"]["metadata"]["name"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect();
        assert_eq!(names, ["c0", "c1", "c2"]);
        server.shutdown().await;
    }
}
