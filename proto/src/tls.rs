//! TLS on TCP, the one place the scheduler and every client load it
//! (rustls, through tonic): PEM files read and checked up front, each
//! error naming the file or flag at fault, and the rule that says whether
//! a client's address is spoken to over TLS.
//!
//! The scheduler serves its TCP listeners with TLS when given a
//! certificate and key ([`ServerTlsFiles`]: `--tls-cert`, `--tls-key`, and
//! `--tls-client-ca` to require client certificates signed by that CA);
//! Unix sockets stay plaintext. A client ([`ClientTlsFiles`]: `--tls-ca`,
//! optionally `--tls-cert`/`--tls-key` for mutual TLS, else
//! `TENSILE_TLS_CA`, `TENSILE_TLS_CERT`, `TENSILE_TLS_KEY`) picks its
//! transport by [`transport`]:
//! - `unix:PATH` or an absolute path: the Unix socket, plaintext (TLS
//!   settings are not used);
//! - `https://HOST:PORT`: TLS, which needs the CA;
//! - `http://HOST:PORT`: plaintext, even with a CA given;
//! - `HOST:PORT`: TLS when a CA is given, else plaintext.
//!
//! The server's certificate is checked against the CA and against the
//! host of the address (its DNS name or IP address must be among the
//! certificate's subject alternative names).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig};

/// The CA a client checks the scheduler's certificate against.
pub const CA_ENV: &str = "TENSILE_TLS_CA";
/// A certificate: the scheduler's own, or a client's for mutual TLS.
pub const CERT_ENV: &str = "TENSILE_TLS_CERT";
/// The private key of [`CERT_ENV`]'s certificate.
pub const KEY_ENV: &str = "TENSILE_TLS_KEY";
/// The scheduler's: the CA that client certificates must be signed by.
pub const CLIENT_CA_ENV: &str = "TENSILE_TLS_CLIENT_CA";

/// How long a TLS handshake may take before the peer is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// TLS settings that cannot be used; the message names the file or flag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TlsError(pub String);

fn err(msg: impl Into<String>) -> TlsError {
    TlsError(msg.into())
}

/// `path`'s bytes; `what` names the flag (`--tls-cert`).
fn read(what: &str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| err(format!("{what} {}: {e}", path.display())))
}

/// The PEM certificates of `path`, at least one.
fn certificates(
    what: &str,
    path: &Path,
) -> Result<(Vec<u8>, Vec<CertificateDer<'static>>), TlsError> {
    let pem = read(what, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            err(format!(
                "{what} {}: not a PEM certificate file: {e}",
                path.display()
            ))
        })?;
    if certs.is_empty() {
        return Err(err(format!(
            "{what} {}: no certificate in it (expected PEM: -----BEGIN CERTIFICATE-----)",
            path.display()
        )));
    }
    Ok((pem, certs))
}

/// A CA file: its PEM, checked to be certificates rustls takes as roots.
fn ca(what: &str, path: &Path) -> Result<Certificate, TlsError> {
    let (pem, certs) = certificates(what, path)?;
    let mut roots = RootCertStore::empty();
    for c in certs {
        roots.add(c).map_err(|e| {
            err(format!(
                "{what} {}: not a usable CA certificate: {e}",
                path.display()
            ))
        })?;
    }
    Ok(Certificate::from_pem(pem))
}

/// A certificate and its key, checked to belong together: tonic's, and
/// rustls' (chain and key).
type Loaded = (
    Identity,
    Vec<CertificateDer<'static>>,
    PrivateKeyDer<'static>,
);

fn identity(cert_flag: &str, cert: &Path, key_flag: &str, key: &Path) -> Result<Loaded, TlsError> {
    let (cert_pem, chain) = certificates(cert_flag, cert)?;
    let key_pem = read(key_flag, key)?;
    let der = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
        err(format!(
            "{key_flag} {}: no private key in it (expected PEM: PKCS#8, PKCS#1 or SEC1): {e}",
            key.display()
        ))
    })?;
    let signing = rustls::crypto::ring::sign::any_supported_type(&der)
        .map_err(|e| err(format!("{key_flag} {}: {e}", key.display())))?;
    match CertifiedKey::new(chain.clone(), signing).keys_match() {
        // A key whose public half cannot be derived is checked at the
        // handshake instead.
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
        Err(rustls::Error::InconsistentKeys(_)) => {
            return Err(err(format!(
                "{key_flag} {} is not the key of the certificate in {cert_flag} {}",
                key.display(),
                cert.display()
            )));
        }
        Err(e) => return Err(err(format!("{key_flag} {}: {e}", key.display()))),
    }
    Ok((Identity::from_pem(cert_pem, key_pem), chain, der))
}

/// The scheduler's TLS, as files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerTlsFiles {
    /// Its certificate (chain), PEM.
    pub cert: PathBuf,
    /// The certificate's private key, PEM.
    pub key: PathBuf,
    /// Require client certificates signed by this CA (mutual TLS).
    pub client_ca: Option<PathBuf>,
}

/// The scheduler's TLS, loaded and checked.
#[derive(Debug, Clone)]
pub struct ServerTls {
    pub files: ServerTlsFiles,
    pub config: ServerTlsConfig,
}

impl ServerTlsFiles {
    /// From the flags' values (each `None` when not given): a certificate
    /// and key go together; a client CA needs them.
    pub fn from_parts(
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
        client_ca: Option<PathBuf>,
    ) -> Result<Option<ServerTlsFiles>, TlsError> {
        match (cert, key) {
            (Some(cert), Some(key)) => Ok(Some(ServerTlsFiles {
                cert,
                key,
                client_ca,
            })),
            (Some(c), None) => Err(err(format!(
                "--tls-cert {} needs --tls-key (its private key)",
                c.display()
            ))),
            (None, Some(k)) => Err(err(format!(
                "--tls-key {} needs --tls-cert (its certificate)",
                k.display()
            ))),
            (None, None) => match client_ca {
                Some(ca) => Err(err(format!(
                    "--tls-client-ca {} needs --tls-cert and --tls-key (the scheduler's own certificate)",
                    ca.display()
                ))),
                None => Ok(None),
            },
        }
    }

    /// Reads and checks the files.
    pub fn load(&self) -> Result<ServerTls, TlsError> {
        let mut config = ServerTlsConfig::new()
            .identity(identity("--tls-cert", &self.cert, "--tls-key", &self.key)?.0)
            .timeout(HANDSHAKE_TIMEOUT);
        if let Some(path) = &self.client_ca {
            config = config.client_ca_root(ca("--tls-client-ca", path)?);
        }
        Ok(ServerTls {
            files: self.clone(),
            config,
        })
    }
}

/// A client's TLS, as files; each `None` when not given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTlsFiles {
    /// The CA the scheduler's certificate must be signed by.
    pub ca: Option<PathBuf>,
    /// This client's certificate, for a scheduler that requires one.
    pub cert: Option<PathBuf>,
    /// Its private key.
    pub key: Option<PathBuf>,
}

/// A client's TLS, loaded and checked.
#[derive(Debug, Clone)]
pub struct ClientTls {
    pub files: ClientTlsFiles,
    config: ClientTlsConfig,
    /// The same settings for [`probe`]'s own handshake.
    rustls: Arc<rustls::ClientConfig>,
}

impl ClientTlsFiles {
    /// `TENSILE_TLS_CA`, `TENSILE_TLS_CERT`, `TENSILE_TLS_KEY` (empty
    /// values are unset).
    pub fn from_env() -> ClientTlsFiles {
        ClientTlsFiles::with_env(&|name| std::env::var(name).ok())
    }

    /// [`ClientTlsFiles::from_env`] with the environment given.
    pub fn with_env(env: &dyn Fn(&str) -> Option<String>) -> ClientTlsFiles {
        let path = |name: &str| {
            env(name)
                .filter(|v| !v.trim().is_empty())
                .map(PathBuf::from)
        };
        ClientTlsFiles {
            ca: path(CA_ENV),
            cert: path(CERT_ENV),
            key: path(KEY_ENV),
        }
    }

    /// Whether anything is set.
    pub fn is_empty(&self) -> bool {
        self.ca.is_none() && self.cert.is_none() && self.key.is_none()
    }

    /// Reads and checks the files: `None` when none is given; a
    /// certificate and key go together and need the CA.
    pub fn load(&self) -> Result<Option<ClientTls>, TlsError> {
        let Some(ca_path) = &self.ca else {
            return match (&self.cert, &self.key) {
                (None, None) => Ok(None),
                (Some(c), _) | (None, Some(c)) => Err(err(format!(
                    "--tls-cert/--tls-key ({}) need --tls-ca ({CA_ENV}): the CA that signed the scheduler's certificate",
                    c.display()
                ))),
            };
        };
        let ca_pem = ca("--tls-ca", ca_path)?;
        let mut roots = RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(ca_pem.as_ref()).flatten() {
            // Checked by `ca` already.
            let _ = roots.add(c);
        }
        let probing = rustls::ClientConfig::builder().with_root_certificates(roots);
        let mut config = ClientTlsConfig::new()
            .ca_certificate(ca_pem)
            .timeout(HANDSHAKE_TIMEOUT);
        let mut probing = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                let (id, chain, der) = identity("--tls-cert", cert, "--tls-key", key)?;
                config = config.identity(id);
                probing
                    .with_client_auth_cert(chain, der)
                    .map_err(|e| err(format!("--tls-key {}: {e}", key.display())))?
            }
            (Some(c), None) => {
                return Err(err(format!(
                    "--tls-cert {} needs --tls-key ({KEY_ENV}): its private key",
                    c.display()
                )));
            }
            (None, Some(k)) => {
                return Err(err(format!(
                    "--tls-key {} needs --tls-cert ({CERT_ENV}): its certificate",
                    k.display()
                )));
            }
            (None, None) => probing.with_no_client_auth(),
        };
        probing.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Some(ClientTls {
            files: self.clone(),
            config,
            rustls: Arc::new(probing),
        }))
    }
}

/// How a client reaches an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// A Unix socket (plaintext).
    Unix,
    /// TCP, plaintext.
    Plain,
    /// TCP with TLS.
    Tls,
}

/// The URI tonic's `Endpoint` takes for `server` (a resolved address),
/// and how it is reached, by the rule in this module's header; `tls`:
/// whether the client has a CA. An `https://` address without one is an
/// error.
pub fn transport(server: &str, tls: bool) -> Result<(String, Transport), TlsError> {
    let uri = crate::endpoint::client_uri(Some(server));
    if uri.starts_with("unix:") {
        return Ok((uri, Transport::Unix));
    }
    let explicit = server.trim();
    if let Some(rest) = uri.strip_prefix("https://") {
        if !tls {
            return Err(err(format!(
                "{explicit}: https needs --tls-ca ({CA_ENV}): the CA that signed the scheduler's certificate"
            )));
        }
        return Ok((format!("https://{rest}"), Transport::Tls));
    }
    if explicit.starts_with("http://") || !tls {
        return Ok((uri, Transport::Plain));
    }
    let rest = uri.strip_prefix("http://").unwrap_or(&uri);
    Ok((format!("https://{rest}"), Transport::Tls))
}

/// The endpoint for `server` (a resolved address): TLS configured where
/// [`transport`] says so.
pub fn endpoint(server: &str, tls: Option<&ClientTls>) -> Result<(Endpoint, Transport), TlsError> {
    let (uri, how) = transport(server, tls.is_some())?;
    let e = Endpoint::from_shared(uri.clone())
        .map_err(|e| err(format!("bad scheduler address {server:?} ({uri}): {e}")))?;
    match (how, tls) {
        (Transport::Tls, Some(t)) => {
            let e = e
                .tls_config(t.config.clone())
                .map_err(|e| err(format!("TLS for {server}: {e}")))?;
            Ok((e, how))
        }
        _ => Ok((e, how)),
    }
}

/// Why the TLS server at `server` refuses this client once the handshake
/// is over, found by a handshake of its own: under TLS 1.3 the server
/// checks the client's certificate after the client has finished, so its
/// refusal (no certificate, one from another CA) reaches the gRPC client
/// only as a closed connection. `None` when the server takes the client,
/// or cannot be reached at all. Blocks for at most a few seconds.
pub fn probe(server: &str, tls: &ClientTls) -> Option<String> {
    let (uri, how) = transport(server, true).ok()?;
    if how != Transport::Tls {
        return None;
    }
    let r = handshake(&uri, tls.rustls.clone())?;
    Some(explain_rustls(&r, Some(tls)))
}

/// What a plaintext call to `server` that failed for want of a
/// connection means when the listener there speaks TLS (it reads the
/// HTTP/2 preface as a malformed TLS record and drops the connection):
/// found by starting a TLS handshake of its own. `None` for anything else.
/// Blocks for at most a few seconds.
pub fn plaintext_hint(server: &str, s: &tonic::Status) -> Option<String> {
    let (uri, how) = transport(server, false).ok()?;
    let lost = matches!(
        s.code(),
        tonic::Code::Internal
            | tonic::Code::Unknown
            | tonic::Code::Unavailable
            | tonic::Code::Cancelled
    );
    if how != Transport::Plain || !lost {
        return None;
    }
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(RootCertStore::empty())
        .with_no_client_auth();
    let https = uri.replacen("http://", "https://", 1);
    // Trusting no CA, a TLS server's certificate is refused: it spoke TLS.
    match handshake(&https, Arc::new(config))? {
        rustls::Error::InvalidCertificate(_) => Some(format!(
            "the scheduler at {server} serves TLS there: pass --tls-ca ({CA_ENV}), the CA that signed its certificate"
        )),
        _ => None,
    }
}

/// A TLS handshake with `uri` (`https://HOST:PORT`) and the HTTP/2
/// preface after it: the TLS error it ends in, `None` when none.
fn handshake(uri: &str, config: Arc<rustls::ClientConfig>) -> Option<rustls::Error> {
    use std::io::{Read, Write};
    use std::net::ToSocketAddrs;

    let uri: tonic::codegen::http::Uri = uri.parse().ok()?;
    let host = uri
        .host()?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let addr = (host.as_str(), uri.port_u16().unwrap_or(443))
        .to_socket_addrs()
        .ok()?
        .next()?;
    let name = rustls::pki_types::ServerName::try_from(host).ok()?;
    let mut tcp = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(3)).ok()?;
    tcp.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
    tcp.set_write_timeout(Some(Duration::from_secs(3))).ok()?;
    let mut conn = rustls::ClientConnection::new(config, name).ok()?;
    let mut stream = rustls::Stream::new(&mut conn, &mut tcp);
    // The server answers the preface with its settings, or refuses the
    // client with an alert.
    let sent = stream.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
    let mut buf = [0_u8; 64];
    let error = match sent.and_then(|()| stream.read(&mut buf)) {
        Ok(_) => return None,
        Err(e) => e,
    };
    error.get_ref()?.downcast_ref::<rustls::Error>().cloned()
}

/// What a failed connection or call means when TLS is at fault, with what
/// to do: `None` when nothing in `e`'s chain is about TLS. `tls`: the
/// client's settings (`None`: it spoke plaintext).
pub fn explain(e: &(dyn std::error::Error + 'static), tls: Option<&ClientTls>) -> Option<String> {
    let mut cause = Some(e);
    while let Some(c) = cause {
        let rustls_error = c
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            .or_else(|| c.downcast_ref::<rustls::Error>());
        if let Some(r) = rustls_error {
            return Some(explain_rustls(r, tls));
        }
        cause = c.source();
    }
    None
}

fn explain_rustls(e: &rustls::Error, tls: Option<&ClientTls>) -> String {
    use rustls::{AlertDescription, CertificateError, Error};
    let ca = tls.and_then(|t| t.files.ca.as_ref()).map_or_else(
        || "--tls-ca".to_string(),
        |p| format!("--tls-ca {}", p.display()),
    );
    match e {
        Error::InvalidCertificate(CertificateError::UnknownIssuer)
        | Error::InvalidCertificate(CertificateError::BadSignature) => format!(
            "the scheduler's certificate is not signed by the CA in {ca} (untrusted server: {e})"
        ),
        Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => format!(
            "the scheduler's certificate does not name the host of the address ({e}): connect by a name or IP address it lists"
        ),
        Error::InvalidCertificate(
            CertificateError::Expired | CertificateError::ExpiredContext { .. },
        ) => format!("the scheduler's certificate has expired ({e})"),
        Error::AlertReceived(AlertDescription::CertificateRequired) => format!(
            "the scheduler requires a client certificate: pass --tls-cert and --tls-key ({CERT_ENV}, {KEY_ENV}) ({e})"
        ),
        Error::AlertReceived(
            AlertDescription::UnknownCA
            | AlertDescription::BadCertificate
            | AlertDescription::CertificateUnknown,
        ) => format!(
            "the scheduler refused this client's certificate: it is not signed by the CA the scheduler trusts (--tls-client-ca) ({e})"
        ),
        Error::InvalidMessage(_) => format!(
            "the scheduler does not speak TLS there ({e}): drop --tls-ca ({CA_ENV}) or address it as http://HOST:PORT"
        ),
        e => format!("TLS: {e}"),
    }
}

#[cfg(test)]
mod tests;
