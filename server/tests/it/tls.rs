//! TLS and mTLS end to end: an in-process tonic server (the gRPC health service) with
//! certificates made by rcgen in the test, and clients with and without the CA / a client cert.

use crate::support::served;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};
use tonic::transport::{Channel, Server};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use vallum_server::grpc::tls::{ServerTlsArgs, client_config, server_config};

use served::Served;

struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    /// A CA, a server certificate for `localhost` and a client certificate, as PEM files.
    fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "vallum test CA");
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();

        for (name, san, eku) in [
            ("server", "localhost", ExtendedKeyUsagePurpose::ServerAuth),
            ("client", "client", ExtendedKeyUsagePurpose::ClientAuth),
        ] {
            let key = KeyPair::generate().unwrap();
            let mut params = CertificateParams::new(vec![san.to_owned()]).unwrap();
            params.extended_key_usages = vec![eku];
            let cert = params.signed_by(&key, &ca).unwrap();
            std::fs::write(dir.path().join(format!("{name}.pem")), cert.pem()).unwrap();
            std::fs::write(dir.path().join(format!("{name}.key")), key.serialize_pem()).unwrap();
        }
        Pki { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// Starts the health service over TLS.
async fn start(args: &ServerTlsArgs) -> Served {
    let tls = server_config(args).unwrap().expect("TLS configured");
    let (_reporter, health) = tonic_health::server::health_reporter();
    let server = Server::builder()
        .tls_config(tls)
        .unwrap()
        .add_service(health);
    served::serve(|incoming, shutdown| server.serve_with_incoming_shutdown(incoming, shutdown))
        .await
}

async fn check(
    addr: SocketAddr,
    ca: Option<&Path>,
    cert: Option<&Path>,
    key: Option<&Path>,
) -> Result<(), String> {
    let tls = client_config(ca, cert, key, Some("localhost")).map_err(|e| e.to_string())?;
    let channel = Channel::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .map(|_| ())
        .map_err(|e| format!("call: {e}"))
}

#[tokio::test]
async fn tls_needs_the_ca() {
    let pki = Pki::new();
    let server = start(&ServerTlsArgs {
        tls_cert: Some(pki.path("server.pem")),
        tls_key: Some(pki.path("server.key")),
        tls_client_ca: None,
    })
    .await;
    let addr = server.addr;
    check(addr, Some(&pki.path("ca.pem")), None, None)
        .await
        .expect("client trusting the CA succeeds");
    let e = check(addr, None, None, None).await.unwrap_err();
    assert!(!e.is_empty());
    // A CA that did not sign the server certificate fails too.
    let other = Pki::new();
    check(addr, Some(&other.path("ca.pem")), None, None)
        .await
        .unwrap_err();
    server.stop().await;
}

#[tokio::test]
async fn mtls_needs_a_client_certificate() {
    let pki = Pki::new();
    let server = start(&ServerTlsArgs {
        tls_cert: Some(pki.path("server.pem")),
        tls_key: Some(pki.path("server.key")),
        tls_client_ca: Some(pki.path("ca.pem")),
    })
    .await;
    let addr = server.addr;
    let ca = pki.path("ca.pem");
    check(
        addr,
        Some(&ca),
        Some(&pki.path("client.pem")),
        Some(&pki.path("client.key")),
    )
    .await
    .expect("client with a certificate succeeds");
    check(addr, Some(&ca), None, None)
        .await
        .expect_err("client without a certificate is refused");
    // A client certificate from another CA is refused.
    let other = Pki::new();
    check(
        addr,
        Some(&ca),
        Some(&other.path("client.pem")),
        Some(&other.path("client.key")),
    )
    .await
    .expect_err("client with a foreign certificate is refused");
    server.stop().await;
}

#[test]
fn config_errors() {
    let pki = Pki::new();
    let e = server_config(&ServerTlsArgs {
        tls_cert: Some(pki.path("server.pem")),
        tls_key: None,
        tls_client_ca: None,
    })
    .unwrap_err();
    assert_eq!(e.to_string(), "--tls-cert given without --tls-key");
    let e = server_config(&ServerTlsArgs {
        tls_cert: None,
        tls_key: None,
        tls_client_ca: Some(pki.path("ca.pem")),
    })
    .unwrap_err();
    assert_eq!(e.reason(), "TLS_CONFIG_INCOMPLETE");
    let e = server_config(&ServerTlsArgs {
        tls_cert: Some(pki.path("server.key")),
        tls_key: Some(pki.path("server.key")),
        tls_client_ca: None,
    })
    .unwrap_err();
    assert!(e.to_string().contains("is not a PEM certificate"), "{e}");
    let e = client_config(Some(&pki.path("missing.pem")), None, None, None).unwrap_err();
    assert!(e.to_string().starts_with("cannot read CA "), "{e}");
    assert!(server_config(&ServerTlsArgs::default()).unwrap().is_none());
}
