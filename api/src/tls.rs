//! TLS configuration read from PEM files, with rustls (ring provider) through tonic's
//! `tls-ring` feature: the client side of vallumctl (`--ca`, `--cert`, `--key`,
//! `--tls-domain`) and the PEM reading vallumd's server side (vallum-server's `tls` module)
//! shares.
//!
//! Every failure is a [`TlsError`] naming the file or flag; no file is trusted to be PEM
//! without a look at its `-----BEGIN` line.

use std::path::{Path, PathBuf};

use tonic::transport::{Certificate, ClientTlsConfig, Identity};

/// Why a TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read.
    #[error("cannot read {what} {path}: {source}")]
    Read {
        /// Which file (`certificate`, `key`, `CA`).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file does not look like PEM of the expected kind.
    #[error("{path} is not a PEM {what} (no `-----BEGIN {marker}` line)")]
    NotPem {
        /// Which file.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The expected PEM label fragment.
        marker: &'static str,
    },
    /// Only one of certificate and key was given.
    #[error("{given} given without {missing}")]
    Incomplete {
        /// The flag that was given.
        given: &'static str,
        /// The flag that is missing.
        missing: &'static str,
    },
    /// The client CA was given without a server certificate.
    #[error("--tls-client-ca needs --tls-cert and --tls-key")]
    ClientCaWithoutTls,
}

impl TlsError {
    /// UPPER_SNAKE code of this startup error, printed by vallumd. It never reaches a client,
    /// so it is not a row of the [`crate::Reason`] table.
    pub fn reason(&self) -> &'static str {
        match self {
            TlsError::Read { .. } => "TLS_FILE_UNREADABLE",
            TlsError::NotPem { .. } => "TLS_FILE_INVALID",
            TlsError::Incomplete { .. } | TlsError::ClientCaWithoutTls => "TLS_CONFIG_INCOMPLETE",
        }
    }
}

/// Reads a PEM file and checks it holds a `-----BEGIN {marker}` line; `what` names the file
/// in errors (`certificate`, `key`, `CA`).
pub fn read_pem(
    path: &Path,
    what: &'static str,
    marker: &'static str,
) -> Result<Vec<u8>, TlsError> {
    let pem = std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_owned(),
        source,
    })?;
    let needle = format!("-----BEGIN {marker}");
    let found = pem.windows(needle.len()).any(|w| w == needle.as_bytes());
    if !found {
        return Err(TlsError::NotPem {
            what,
            path: path.to_owned(),
            marker,
        });
    }
    Ok(pem)
}

/// The identity to present from a certificate chain and key (PEM), or `None` when neither is
/// given; one without the other is [`TlsError::Incomplete`] naming `cert_flag`/`key_flag`.
pub fn identity(
    cert: Option<&Path>,
    key: Option<&Path>,
    cert_flag: &'static str,
    key_flag: &'static str,
) -> Result<Option<Identity>, TlsError> {
    match (cert, key) {
        (None, None) => Ok(None),
        (Some(_), None) => Err(TlsError::Incomplete {
            given: cert_flag,
            missing: key_flag,
        }),
        (None, Some(_)) => Err(TlsError::Incomplete {
            given: key_flag,
            missing: cert_flag,
        }),
        (Some(c), Some(k)) => {
            let cert = read_pem(c, "certificate", "CERTIFICATE")?;
            // `PRIVATE KEY`, `RSA PRIVATE KEY` and `EC PRIVATE KEY` all contain this.
            let key = read_pem(k, "key", "")?;
            if !key.windows(11).any(|w| w == b"PRIVATE KEY") {
                return Err(TlsError::NotPem {
                    what: "key",
                    path: k.to_owned(),
                    marker: "... PRIVATE KEY",
                });
            }
            Ok(Some(Identity::from_pem(cert, key)))
        }
    }
}

/// A client's TLS config: trust `ca` (PEM; the system has no roots configured here, so a CA is
/// needed for a private PKI), present `cert` + `key` for mTLS. `domain` overrides the name checked
/// against the server certificate (default: the host of the URL).
pub fn client_config(
    ca: Option<&Path>,
    cert: Option<&Path>,
    key: Option<&Path>,
    domain: Option<&str>,
) -> Result<ClientTlsConfig, TlsError> {
    let mut cfg = ClientTlsConfig::new();
    if let Some(ca) = ca {
        cfg = cfg.ca_certificate(Certificate::from_pem(read_pem(ca, "CA", "CERTIFICATE")?));
    }
    if let Some(id) = identity(cert, key, "--cert", "--key")? {
        cfg = cfg.identity(id);
    }
    if let Some(d) = domain {
        cfg = cfg.domain_name(d);
    }
    Ok(cfg)
}
