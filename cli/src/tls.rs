//! The client TLS flags every binary that talks to a TCP scheduler takes
//! (`tensilectl`'s scheduler commands, `tensile-worker`), with their
//! environment variables, so that all of them read them the same way;
//! the files are loaded and checked by `tensile_proto::tls`.

use std::path::PathBuf;

use tensile_proto::tls::{CA_ENV, CERT_ENV, ClientTls, ClientTlsFiles, KEY_ENV, TlsError};

/// `--tls-ca`, `--tls-cert`, `--tls-key`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ClientTlsArgs {
    /// TLS to a TCP scheduler: the CA (PEM) that signed its certificate.
    /// With it, HOST:PORT is spoken to over TLS (http://HOST:PORT stays
    /// plaintext); https://HOST:PORT needs it. Unix sockets never use TLS.
    #[arg(long, env = CA_ENV, value_name = "PEM")]
    pub tls_ca: Option<PathBuf>,
    /// Mutual TLS: this client's certificate (PEM), for a scheduler that
    /// requires one (--tls-client-ca). Needs --tls-ca and --tls-key.
    #[arg(long, env = CERT_ENV, value_name = "PEM")]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, env = KEY_ENV, value_name = "PEM")]
    pub tls_key: Option<PathBuf>,
}

impl ClientTlsArgs {
    /// The files named.
    pub fn files(&self) -> ClientTlsFiles {
        ClientTlsFiles {
            ca: self.tls_ca.clone(),
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
        }
    }

    /// The files, read and checked; `None` when none is named.
    pub fn load(&self) -> Result<Option<ClientTls>, TlsError> {
        self.files().load()
    }
}
