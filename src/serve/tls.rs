//! HTTPS on the TCP listener (`--tls-cert`, `--tls-key`): rustls with the `ring`
//! provider, TLS 1.2 and 1.3, ALPN `http/1.1`. Both PEM files are read once at start;
//! every way they can be wrong (missing, unreadable, no certificate, no key, a key that
//! is not the certificate's) is an error naming the file, before anything is bound.
//! The handshake runs in each connection's own task (see `mod.rs`), within
//! [`HANDSHAKE_TIMEOUT`], so a slow client never holds up the accept loop.

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

/// Longest a client may take to complete its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

fn refuse(flag: &str, path: &Path, why: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{flag} {}: {why}", path.display()),
    )
}

/// The certificate chain in the PEM file `path` (the server's certificate first).
pub fn read_certs(path: &Path) -> io::Result<Vec<CertificateDer<'static>>> {
    let bytes =
        std::fs::read(path).map_err(|e| refuse("--tls-cert", path, format!("cannot read: {e}")))?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| refuse("--tls-cert", path, format!("not a PEM file: {e}")))?;
    if certs.is_empty() {
        return Err(refuse(
            "--tls-cert",
            path,
            "holds no certificate (PEM `BEGIN CERTIFICATE`)",
        ));
    }
    Ok(certs)
}

/// The private key in the PEM file `path` (PKCS#8, PKCS#1 or SEC1).
pub fn read_key(path: &Path) -> io::Result<PrivateKeyDer<'static>> {
    let bytes =
        std::fs::read(path).map_err(|e| refuse("--tls-key", path, format!("cannot read: {e}")))?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| match e {
        pem::Error::NoItemsFound => refuse(
            "--tls-key",
            path,
            "holds no private key (PEM `BEGIN PRIVATE KEY`, `BEGIN RSA PRIVATE KEY` or `BEGIN EC PRIVATE KEY`)",
        ),
        e => refuse("--tls-key", path, format!("not a readable key: {e}")),
    })
}

/// The acceptor for the certificate chain in `cert` and its key in `key`.
pub fn acceptor(cert: &Path, key: &Path) -> io::Result<TlsAcceptor> {
    let chain = read_certs(cert)?;
    let der = read_key(key)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(io::Error::other)?
        .with_no_client_auth()
        .with_single_cert(chain, der)
        .map_err(|e| match e {
            rustls::Error::InconsistentKeys(_) => refuse(
                "--tls-key",
                key,
                format!("is not the key of the certificate in {}", cert.display()),
            ),
            e => refuse("--tls-key", key, format!("cannot be used: {e}")),
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}
