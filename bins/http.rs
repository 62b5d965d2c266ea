//! How the CLI reaches a server (`SWARM_URL`): `http://HOST:PORT` or `https://HOST:PORT`
//! over TCP (ureq; TLS with rustls, trusting the Mozilla roots and the CA certificates in
//! `SWARM_CA_CERT`, a PEM file, for a server with a self-signed certificate), or
//! `unix:///PATH`, a Unix socket (`swarm serve --socket PATH`), spoken to by the small
//! HTTP/1.1 client below (one request per connection, `Connection: close`; fixed-length,
//! chunked and until-close bodies), since ureq only dials TCP.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;

/// Longest response head (status line and headers) read from a Unix socket.
const HEAD_BYTES_MAX: u64 = 64 * 1024;

/// Where the server is.
pub enum Transport {
    /// `http://...` or `https://...`: ureq over TCP.
    Tcp {
        base: String,
        agent: ureq::Agent,
        /// `SWARM_CA_CERT`, with https://.
        ca: Option<PathBuf>,
    },
    /// `unix:///path`: a Unix socket, and the longest wait for a read (`None`: none).
    Unix(PathBuf, Option<Duration>),
}

/// A response: its status (any, refusals included), its headers (names in lower case)
/// and its body as it arrives.
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Box<dyn Read + Send>,
}

impl Answer {
    /// The value of header `name` (any case), if the response has it.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// The context of a failure talking to the server. Never a closed stdout: a broken pipe
/// under it (the server went away while the request's body was being sent) is an error
/// (exit 1: the outcome is unknown, retry with the same ids), where a broken stdout
/// (`swarm read | head`) ends the command quietly. The remote `append` exited 0, printing
/// nothing, for events that were never stored.
#[derive(Debug)]
pub struct ServerIo(pub String);

impl std::fmt::Display for ServerIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Transport {
    /// The transport of `url` (`SWARM_URL`).
    pub fn new(url: &str) -> anyhow::Result<Transport> {
        Transport::with_read_timeout(url, None)
    }

    /// The transport of `url`, whose reads give up after `read` (`None`: never).
    pub fn with_read_timeout(url: &str, read: Option<Duration>) -> anyhow::Result<Transport> {
        if let Some(path) = url.strip_prefix("unix://") {
            if path.is_empty() {
                bail!(crate::invalid(
                    "SWARM_URL",
                    "unix:// names no socket (unix:///run/swarm.sock)"
                ));
            }
            return Ok(Transport::Unix(PathBuf::from(path), read));
        }
        let https = url.starts_with("https://");
        if !https && !url.starts_with("http://") {
            bail!(crate::invalid(
                "SWARM_URL",
                format!(
                    "{url:?}: use http://HOST:PORT, https://HOST:PORT or unix:///PATH/TO/SOCKET"
                )
            ));
        }
        let mut agent = ureq::AgentBuilder::new().timeout_connect(Duration::from_secs(10));
        if let Some(t) = read {
            agent = agent.timeout_read(t);
        }
        let mut ca = None;
        if https {
            ca = std::env::var_os("SWARM_CA_CERT")
                .filter(|p| !p.is_empty())
                .map(PathBuf::from);
            agent = agent.tls_config(tls_config(ca.as_deref())?);
        }
        Ok(Transport::Tcp {
            base: url.to_string(),
            agent: agent.build(),
            ca,
        })
    }

    /// Sends `method target` (`target`: the path and the encoded query) with `headers`
    /// and `body`.
    /// A failure to send the request or read the answer's head is [`ServerIo`].
    pub fn send(
        &self,
        method: &str,
        target: &str,
        headers: &[(&str, String)],
        body: Option<&[u8]>,
    ) -> anyhow::Result<Answer> {
        match self {
            Transport::Tcp { base, agent, ca } => {
                let mut r = agent.request(method, &format!("{base}{target}"));
                for (k, v) in headers {
                    r = r.set(k, v);
                }
                let sent = match body {
                    Some(b) => r.send_bytes(b),
                    None => r.call(),
                };
                match sent {
                    Ok(resp) | Err(ureq::Error::Status(_, resp)) => Ok(Answer {
                        status: resp.status(),
                        headers: resp
                            .headers_names()
                            .into_iter()
                            .filter_map(|k| {
                                let v = resp.header(&k)?.to_string();
                                Some((k, v))
                            })
                            .collect(),
                        body: Box::new(resp.into_reader()),
                    }),
                    Err(e) => {
                        let hint = tls_hint(&e.to_string(), ca.as_deref());
                        Err(anyhow::Error::new(e)
                            .context(ServerIo(format!("cannot reach {base}{hint}"))))
                    }
                }
            }
            Transport::Unix(path, read) => unix_send(path, *read, method, target, headers, body)
                .map_err(|e| {
                    anyhow::Error::new(e)
                        .context(ServerIo(format!("cannot reach unix://{}", path.display())))
                }),
        }
    }

    /// The server, as the user named it.
    pub fn name(&self) -> String {
        match self {
            Transport::Tcp { base, .. } => base.clone(),
            Transport::Unix(p, _) => format!("unix://{}", p.display()),
        }
    }
}

/// What to do about a refused server certificate (`why`: ureq's error), if it was one.
fn tls_hint(why: &str, ca: Option<&Path>) -> String {
    if !why.contains("certificate") {
        String::new()
    } else if why.contains("CaUsedAsEndEntity") {
        " (the server's certificate is a CA certificate: make it with basicConstraints CA:FALSE)"
            .into()
    } else if let Some(ca) = ca {
        format!(
            " (its certificate is not trusted with SWARM_CA_CERT={})",
            ca.display()
        )
    } else {
        " (a certificate not signed by a public CA needs SWARM_CA_CERT=CA.pem)".into()
    }
}

/// The TLS client configuration: the Mozilla roots, and the certificates in `ca` (PEM).
fn tls_config(ca: Option<&Path>) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    use rustls::pki_types::{pem::PemObject, CertificateDer};
    let mut roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    if let Some(path) = ca {
        let what =
            |why: String| crate::invalid("SWARM_CA_CERT", format!("{}: {why}", path.display()));
        let pem = std::fs::read(path).map_err(|e| what(format!("cannot read: {e}")))?;
        let certs = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| what(format!("not a PEM file: {e}")))?;
        if certs.is_empty() {
            bail!(what(
                "holds no certificate (PEM `BEGIN CERTIFICATE`)".into()
            ));
        }
        for c in certs {
            roots
                .add(c)
                .map_err(|e| what(format!("not a usable CA certificate: {e}")))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

fn bad(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

/// One HTTP/1.1 exchange over a new connection to the socket at `path`.
fn unix_send(
    path: &std::path::Path,
    read: Option<Duration>,
    method: &str,
    target: &str,
    headers: &[(&str, String)],
    body: Option<&[u8]>,
) -> io::Result<Answer> {
    let mut s = UnixStream::connect(path)?;
    s.set_read_timeout(read)?;
    let mut head =
        format!("{method} {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    for (k, v) in headers {
        if v.contains(['\r', '\n']) {
            return Err(bad(format!("header {k} holds a line break")));
        }
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str(&format!(
        "Content-Length: {}\r\n\r\n",
        body.map_or(0, <[u8]>::len)
    ));
    s.write_all(head.as_bytes())?;
    if let Some(b) = body {
        s.write_all(b)?;
    }
    let mut r = BufReader::new(s);
    let mut names = Vec::new();
    let (status, chunked, length) = {
        let mut h = (&mut r).take(HEAD_BYTES_MAX);
        let mut line = String::new();
        h.read_line(&mut line)?;
        let status = line
            .strip_prefix("HTTP/1.1 ")
            .or_else(|| line.strip_prefix("HTTP/1.0 "))
            .and_then(|l| l.get(..3))
            .and_then(|c| c.parse::<u16>().ok())
            .ok_or_else(|| bad(format!("not an HTTP response: {:?}", line.trim_end())))?;
        let (mut chunked, mut length) = (false, None);
        loop {
            line.clear();
            if h.read_line(&mut line)? == 0 {
                return Err(bad("the response head ended early or is too long"));
            }
            let l = line.trim_end_matches(['\r', '\n']);
            if l.is_empty() {
                break;
            }
            let Some((k, v)) = l.split_once(':') else {
                continue;
            };
            let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
            if k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked") {
                chunked = true;
            } else if k == "content-length" {
                length = Some(v.parse::<u64>().map_err(|_| bad("bad Content-Length"))?);
            }
            names.push((k, v.to_string()));
        }
        (status, chunked, length)
    };
    let body: Box<dyn Read + Send> = match (chunked, length) {
        (true, _) => Box::new(Chunked {
            inner: r,
            left: 0,
            done: false,
        }),
        (false, Some(n)) => Box::new(r.take(n)),
        (false, None) => Box::new(r),
    };
    Ok(Answer {
        status,
        headers: names,
        body,
    })
}

/// A chunked body, decoded as it arrives (streams: SSE, NDJSON acknowledgements).
struct Chunked<R> {
    inner: R,
    /// Bytes left in the current chunk.
    left: u64,
    done: bool,
}

impl<R: BufRead> Read for Chunked<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.done || buf.is_empty() {
            return Ok(0);
        }
        if self.left == 0 {
            let mut line = String::new();
            (&mut self.inner).take(1024).read_line(&mut line)?;
            let size = line.trim_end().split(';').next().unwrap_or_default().trim();
            self.left = u64::from_str_radix(size, 16)
                .map_err(|_| bad(format!("bad chunk size {size:?}")))?;
            if self.left == 0 {
                // The trailers, up to the empty line.
                loop {
                    line.clear();
                    let n = (&mut self.inner).take(1024).read_line(&mut line)?;
                    if n == 0 || line.trim_end().is_empty() {
                        break;
                    }
                }
                self.done = true;
                return Ok(0);
            }
        }
        let want = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the chunked body ended early",
            ));
        }
        self.left -= n as u64;
        if self.left == 0 {
            let mut crlf = [0u8; 2];
            self.inner.read_exact(&mut crlf)?;
            if &crlf != b"\r\n" {
                return Err(bad("a chunk does not end with CRLF"));
            }
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_bodies_decode_across_chunks() {
        let wire = b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nTrailer: x\r\n\r\n";
        let mut c = Chunked {
            inner: BufReader::new(&wire[..]),
            left: 0,
            done: false,
        };
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        assert_eq!(out, "hello, world");
        let mut c = Chunked {
            inner: BufReader::new(&b"5\r\nhel"[..]),
            left: 0,
            done: false,
        };
        assert!(c.read_to_string(&mut String::new()).is_err());
    }
}
