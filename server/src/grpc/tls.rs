//! TLS and mutual TLS for the gRPC server, with rustls (ring provider) through tonic's `tls-ring`
//! feature. The PEM reading, [`TlsError`] and vallumctl's [`client_config`] are
//! `vallum_api::tls`, shared with the client and re-exported here.
//!
//! Server flags ([`ServerTlsArgs`]): `--tls-cert FILE --tls-key FILE` (PEM) turn TLS on;
//! `--tls-client-ca FILE` additionally requires every client to present a certificate signed by
//! that CA (mTLS). Client flags of vallumctl: `--ca FILE` (the CA that signed the server's
//! certificate), `--cert FILE --key FILE` (client certificate for mTLS).
//!
//! Wiring in the server:
//! ```ignore
//! let mut builder = tonic::transport::Server::builder();
//! if let Some(tls) = vallum_server::grpc::tls::server_config(&args.tls)? {
//!     builder = builder.tls_config(tls)?;
//! }
//! ```

use std::path::PathBuf;

use tonic::transport::{Certificate, ServerTlsConfig};
pub use vallum_api::tls::{TlsError, client_config};
use vallum_api::tls::{identity, read_pem};

/// TLS flags of `vallumd`; flatten into the server's clap parser.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct ServerTlsArgs {
    /// Server certificate chain (PEM); with --tls-key turns TLS on.
    #[arg(long, env = "VALLUM_TLS_CERT", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// Server private key (PEM).
    #[arg(long, env = "VALLUM_TLS_KEY", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// CA bundle (PEM) for client certificates; when set, clients must present one (mTLS).
    #[arg(long, env = "VALLUM_TLS_CLIENT_CA", value_name = "FILE")]
    pub tls_client_ca: Option<PathBuf>,
}

/// The server's TLS config, or `None` when TLS is off (no `--tls-cert`/`--tls-key`).
pub fn server_config(args: &ServerTlsArgs) -> Result<Option<ServerTlsConfig>, TlsError> {
    let Some(id) = identity(
        args.tls_cert.as_deref(),
        args.tls_key.as_deref(),
        "--tls-cert",
        "--tls-key",
    )?
    else {
        if args.tls_client_ca.is_some() {
            return Err(TlsError::ClientCaWithoutTls);
        }
        return Ok(None);
    };
    let mut cfg = ServerTlsConfig::new().identity(id);
    if let Some(ca) = &args.tls_client_ca {
        let ca = read_pem(ca, "CA", "CERTIFICATE")?;
        cfg = cfg.client_ca_root(Certificate::from_pem(ca));
    }
    Ok(Some(cfg))
}
