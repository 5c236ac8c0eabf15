//! The connection to vallumd: the flags every remote subcommand takes ([`Connection`]), the
//! bearer token (`--token` or `--token-file`), TLS (`vallum_api::tls`), and one client per
//! service over one channel ([`Clients`]).

use std::path::PathBuf;
use std::time::Duration;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use vallum_proto::v1::conntrack_service_client::ConntrackServiceClient;
use vallum_proto::v1::counter_service_client::CounterServiceClient;
use vallum_proto::v1::engine_service_client::EngineServiceClient;
use vallum_proto::v1::fleet_service_client::FleetServiceClient;
use vallum_proto::v1::ruleset_service_client::RulesetServiceClient;
use vallum_proto::v1::set_service_client::SetServiceClient;
use vallum_proto::v1::trace_service_client::TraceServiceClient;

use crate::args::parse_duration;
use crate::error::{self, CliError};
use crate::{fleet, sets};

/// Flags of the connection to vallumd. Global (accepted before or after the subcommand);
/// hidden from the help of the subcommands that run locally (see `crate::command`).
#[derive(Debug, clap::Args)]
pub struct Connection {
    /// gRPC endpoint of vallumd: `unix:PATH` (its local socket), `http://HOST:PORT` or
    /// `https://HOST:PORT` (`https://` or any TLS flag turns TLS on). Default: the local
    /// socket /run/vallum/vallumd.sock (or $XDG_RUNTIME_DIR/vallum/vallumd.sock) when it
    /// exists, else http://127.0.0.1:50051. Checked before a remote command connects (a usage
    /// error), not by local ones.
    #[arg(
        long = "server",
        global = true,
        env = "VALLUM_SERVER",
        value_name = "URL"
    )]
    pub server_flag: Option<String>,
    /// The endpoint used: `--server`, or the default (set by [`Connection::resolve`]).
    #[arg(skip)]
    pub server: String,
    /// Bearer token sent as `authorization: Bearer TOKEN`. Visible to other users in `ps`;
    /// prefer --token-file or VALLUM_TOKEN.
    #[arg(long, global = true, env = "VALLUM_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// File holding the bearer token (surrounding whitespace and the final newline are
    /// ignored), so the token is not on the command line.
    #[arg(
        long,
        global = true,
        env = "VALLUM_TOKEN_FILE",
        value_name = "FILE",
        conflicts_with = "token"
    )]
    pub token_file: Option<PathBuf>,
    /// CA certificate (PEM) that signed the server's certificate.
    #[arg(long, global = true, env = "VALLUM_CA", value_name = "FILE")]
    pub ca: Option<PathBuf>,
    /// Client certificate (PEM) for mutual TLS.
    #[arg(long, global = true, env = "VALLUM_CERT", value_name = "FILE")]
    pub cert: Option<PathBuf>,
    /// Client private key (PEM) for mutual TLS.
    #[arg(long, global = true, env = "VALLUM_KEY", value_name = "FILE")]
    pub key: Option<PathBuf>,
    /// Name to check in the server certificate (default: the host of --server).
    #[arg(long, global = true, env = "VALLUM_TLS_DOMAIN")]
    pub tls_domain: Option<String>,
    /// Deadline of each call, e.g. `30s`, `500ms`, `2m` (not for `watch` and `fleet wait`).
    #[arg(long, global = true, env = "VALLUM_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Wait for vallumd before the command, as vallum-iptables' `-w`: while it does not accept
    /// connections yet and while it is still loading its stored state (its health is not
    /// SERVING). `--wait` waits without limit, `--wait=DURATION` (e.g. `--wait=60s`) up to
    /// that long, then fails as without it (exit 3). Default: no waiting.
    #[arg(
        long,
        global = true,
        env = "VALLUM_WAIT",
        value_name = "DURATION",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "forever",
        value_parser = parse_wait
    )]
    pub wait: Option<Wait>,
}

/// How long `--wait` waits for vallumd.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// A bare `--wait` (or `VALLUM_WAIT=forever`): no limit.
    Forever,
    /// `--wait=DURATION`.
    Up(Duration),
}

/// `forever` or a duration ([`parse_duration`]).
fn parse_wait(s: &str) -> Result<Wait, String> {
    if s == "forever" {
        return Ok(Wait::Forever);
    }
    parse_duration(s).map(Wait::Up)
}

impl Wait {
    /// The moment the wait ends (`None`: never).
    fn until(self) -> Option<tokio::time::Instant> {
        match self {
            Wait::Forever => None,
            Wait::Up(d) => Some(tokio::time::Instant::now() + d),
        }
    }
}

/// Sleeps `pause` (no longer than what is left before `until`) and doubles it up to 200 ms;
/// `false` when no time is left.
async fn pause_before_retry(until: Option<tokio::time::Instant>, pause: &mut Duration) -> bool {
    let nap = match until.map(|u| u.saturating_duration_since(tokio::time::Instant::now())) {
        Some(l) if l.is_zero() => return false,
        Some(l) => (*pause).min(l),
        None => *pause,
    };
    tokio::time::sleep(nap).await;
    *pause = (*pause * 2).min(Duration::from_millis(200));
    true
}

/// Checks `--server`: an `http://` or `https://` URL with a host (a usage error otherwise, before
/// any connection is tried). Not a clap value parser, so that a `VALLUM_SERVER` meant for
/// something else does not break the local subcommands.
fn parse_server(s: &str) -> Result<String, String> {
    if let Some(p) = crate::socket::unix_path(s) {
        if !p.is_absolute() {
            return Err(format!(
                "`{s}`: the socket path must be absolute (unix:/run/...)"
            ));
        }
        return Ok(s.to_owned());
    }
    let like = "a URL like http://HOST:PORT or https://HOST:PORT (or unix:PATH)";
    let uri: http::Uri = s
        .parse()
        .map_err(|e| format!("`{s}` is not {like} ({e})"))?;
    match (uri.scheme_str(), uri.host()) {
        (Some("http" | "https"), Some(h)) if !h.is_empty() => Ok(s.to_owned()),
        (Some(other), _) if other != "http" && other != "https" => {
            Err(format!("`{s}`: the scheme is `{other}`, not http or https"))
        }
        _ => Err(format!("`{s}` is not {like}")),
    }
}

/// Adds the bearer token to every call.
///
/// It also sends the `--timeout` deadline as the call's `grpc-timeout` (unless the call set
/// its own), so that vallumd bounds its own work by it (e.g. its etcd calls in fleet mode)
/// and answers with the reason before the deadline passes here.
#[derive(Clone)]
pub struct Auth(Option<MetadataValue<Ascii>>, Option<Duration>);

impl Interceptor for Auth {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        if let Some(t) = self.1 {
            if !req.metadata().contains_key("grpc-timeout") {
                req.set_timeout(t);
            }
        }
        Ok(req)
    }
}

/// The channel type of every client.
pub type Svc = InterceptedService<Channel, Auth>;

/// One client per service, sharing one channel.
pub struct Clients {
    /// RulesetService.
    pub rulesets: RulesetServiceClient<Svc>,
    /// CounterService.
    pub counters: CounterServiceClient<Svc>,
    /// TraceService.
    pub trace: TraceServiceClient<Svc>,
    /// EngineService.
    pub engine: EngineServiceClient<Svc>,
    /// ConntrackService.
    pub conntrack: ConntrackServiceClient<Svc>,
    /// SetService (64 MiB answers: `set save` of large sets).
    pub sets: sets::Client,
    /// FleetService (64 MiB answers).
    pub fleet: fleet::Client,
}

impl Connection {
    /// Sets [`Connection::server`]: `--server` / `VALLUM_SERVER`, else
    /// [`crate::socket::default_server`].
    pub fn resolve(&mut self) {
        self.server = self
            .server_flag
            .clone()
            .unwrap_or_else(crate::socket::default_server);
    }

    /// The token to send: `--token`, or the content of `--token-file` without surrounding
    /// whitespace. An unreadable file is [`CliError::Read`] (exit 1); an empty one, or a token
    /// that is not printable ASCII, a usage error (exit 2).
    pub fn token(&self) -> Result<Option<String>, CliError> {
        if let Some(t) = &self.token {
            return Ok(Some(t.clone()));
        }
        let Some(path) = &self.token_file else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path).map_err(|source| CliError::Read {
            path: path.clone(),
            source,
        })?;
        let token = text.trim();
        if token.is_empty() {
            return Err(CliError::Argument(format!(
                "--token-file {}: the file holds no token",
                path.display()
            )));
        }
        Ok(Some(token.to_owned()))
    }

    /// Connects to `--server` (TLS when it is `https://` or a TLS flag is given), with the
    /// `--timeout` deadline on each call when `with_timeout`.
    pub async fn connect(&self, with_timeout: bool) -> Result<Clients, CliError> {
        parse_server(&self.server).map_err(|m| CliError::Argument(format!("--server: {m}")))?;
        let flag = if self.token.is_some() {
            "--token"
        } else {
            "--token-file"
        };
        let token = match self.token()? {
            Some(t) => Some(format!("Bearer {t}").parse().map_err(|_| {
                CliError::Argument(format!("{flag}: the token must be printable ASCII"))
            })?),
            None => None,
        };
        let bad = |m: String| CliError::Connect {
            server: self.server.clone(),
            message: m,
        };
        let unix = crate::socket::unix_path(&self.server);
        let mut ep = match unix {
            Some(_) => unix_endpoint(),
            None => Endpoint::from_shared(self.server.clone())
                .map_err(|e| CliError::Argument(format!("--server {}: {e}", self.server)))?,
        }
        .connect_timeout(Duration::from_secs(5));
        if with_timeout {
            ep = ep.timeout(self.timeout);
        }
        let until = self.wait.and_then(Wait::until);
        let deadline = with_timeout.then_some(self.timeout);
        let mut pause = Duration::from_millis(5);
        if let Some(path) = unix {
            let channel = loop {
                match unix_connect(ep.clone(), path).await {
                    Ok(c) => break c,
                    Err(_)
                        if self.wait.is_some() && pause_before_retry(until, &mut pause).await => {}
                    Err(e) => return Err(bad(error::chain(&e))),
                }
            };
            let auth = Auth(token, deadline);
            self.wait_serving(&channel, &auth, until).await;
            return Ok(Clients::new(channel, auth));
        }
        let tls = self.server.starts_with("https://") || self.ca.is_some() || self.cert.is_some();
        if tls {
            let cfg = vallum_api::tls::client_config(
                self.ca.as_deref(),
                self.cert.as_deref(),
                self.key.as_deref(),
                self.tls_domain.as_deref(),
            )?;
            ep = ep.tls_config(cfg).map_err(|e| bad(error::chain(&e)))?;
        }
        let connected = loop {
            match ep.connect().await {
                Err(e)
                    if self.wait.is_some()
                        && !(tls && error::is_plaintext_answer(&e))
                        && pause_before_retry(until, &mut pause).await =>
                {
                    let _ = e;
                }
                r => break r,
            }
        };
        let channel = connected.map_err(|e| {
            if tls && error::is_plaintext_answer(&e) {
                let instead = match self.server.strip_prefix("https://") {
                    Some(rest) => format!("use http://{rest}"),
                    None => "leave out --ca, --cert and --key".to_owned(),
                };
                bad(format!(
                    "the server does not speak TLS (it answered the TLS handshake in plaintext); \
                     {instead}, or start vallumd with --tls-cert and --tls-key"
                ))
            } else {
                bad(error::chain(&e))
            }
        })?;
        let auth = Auth(token, deadline);
        self.wait_serving(&channel, &auth, until).await;
        // Without --server the endpoint is the local socket when it exists; with --wait it
        // may not have existed yet when vallumctl started (vallumd just launched), so the
        // default fell to TCP, where a change without a token is refused. vallumd binds its
        // socket before it serves TCP: once TCP has answered, ask for the default again and
        // use the socket if it is there now (as a command started a moment later would).
        if self.server_flag.is_none() && self.wait.is_some() && !tls {
            let now = crate::socket::default_server();
            if let Some(path) = crate::socket::unix_path(&now) {
                let mut ep = unix_endpoint().connect_timeout(Duration::from_secs(5));
                if with_timeout {
                    ep = ep.timeout(self.timeout);
                }
                if let Ok(c) = unix_connect(ep, path).await {
                    return Ok(Clients::new(c, auth));
                }
            }
        }
        Ok(Clients::new(channel, auth))
    }

    /// With `--wait`: asks `grpc.health.v1` (service `""`) until vallumd says SERVING (it
    /// says NOT_SERVING while it loads its stored state) or `until` passed; a connection that
    /// fails or breaks is tried again. Any other answer the server sends (no health service, a
    /// refused call) ends the wait: the command's own call then reports what is wrong.
    async fn wait_serving(
        &self,
        channel: &Channel,
        auth: &Auth,
        until: Option<tokio::time::Instant>,
    ) {
        use tonic_health::pb::HealthCheckRequest;
        use tonic_health::pb::health_check_response::ServingStatus;
        use tonic_health::pb::health_client::HealthClient;
        if self.wait.is_none() {
            return;
        }
        let mut health = HealthClient::with_interceptor(channel.clone(), auth.clone());
        let mut pause = Duration::from_millis(5);
        loop {
            let req = HealthCheckRequest {
                service: String::new(),
            };
            match health.check(req).await {
                Ok(r) => match r.into_inner().status() {
                    ServingStatus::NotServing | ServingStatus::Unknown => {}
                    ServingStatus::Serving | ServingStatus::ServiceUnknown => return,
                },
                // UNAVAILABLE, or a failure of the connection itself (a status tonic made in the
                // client carries its cause as a source: refused, reset, a handshake cut short
                // while vallumd starts or restarts): try again.
                Err(s)
                    if s.code() == tonic::Code::Unavailable
                        || std::error::Error::source(&s).is_some() => {}
                // A status the server sent (no health service here, a refused call).
                Err(_) => return,
            }
            if !pause_before_retry(until, &mut pause).await {
                return;
            }
        }
    }
}

impl Clients {
    /// One client per service over `channel`, each sending `auth`.
    fn new(channel: Channel, auth: Auth) -> Clients {
        Clients {
            rulesets: RulesetServiceClient::with_interceptor(channel.clone(), auth.clone()),
            counters: CounterServiceClient::with_interceptor(channel.clone(), auth.clone()),
            trace: TraceServiceClient::with_interceptor(channel.clone(), auth.clone()),
            engine: EngineServiceClient::with_interceptor(channel.clone(), auth.clone()),
            conntrack: ConntrackServiceClient::with_interceptor(channel.clone(), auth.clone()),
            fleet: FleetServiceClient::with_interceptor(channel.clone(), auth.clone())
                .max_decoding_message_size(64 << 20),
            sets: SetServiceClient::with_interceptor(channel, auth)
                .max_decoding_message_size(64 << 20),
        }
    }
}

impl Connection {
    /// After a call over `http://` failed in a way a TLS server causes
    /// ([`error::maybe_tls_peer`]): whether the server answers a TLS handshake, so the message
    /// can say to use `https://`. One connection attempt, only on that failure path.
    pub async fn speaks_tls(&self) -> bool {
        let Some(rest) = self.server.strip_prefix("http://") else {
            return false;
        };
        let Ok(cfg) = vallum_api::tls::client_config(None, None, None, self.tls_domain.as_deref())
        else {
            return false;
        };
        let Ok(ep) = Endpoint::from_shared(format!("https://{rest}")) else {
            return false;
        };
        let Ok(ep) = ep.connect_timeout(Duration::from_secs(2)).tls_config(cfg) else {
            return false;
        };
        match ep.connect().await {
            Ok(_) => error::tls_answered(Ok(())),
            Err(e) => error::tls_answered(Err(&e)),
        }
    }
}

// === the local socket ===

/// A channel to vallumd's unix socket at `path`, with `ep`'s settings (timeouts); the
/// endpoint's URI only names the HTTP/2 authority.
///
/// Errors: tonic's transport error when the socket cannot be connected.
async fn unix_connect(
    ep: Endpoint,
    path: &std::path::Path,
) -> Result<Channel, tonic::transport::Error> {
    let path = path.to_owned();
    ep.connect_with_connector(tower::service_fn(move |_: http::Uri| {
        let path = path.clone();
        async move {
            let s = tokio::net::UnixStream::connect(path).await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
        }
    }))
    .await
}

/// An [`Endpoint`] for `unix:PATH` (the authority `localhost`).
fn unix_endpoint() -> Endpoint {
    Endpoint::from_static("http://localhost")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers() {
        assert!(parse_server("http://127.0.0.1:50051").is_ok());
        assert!(parse_server("https://vallum.example:443").is_ok());
        assert!(parse_server("http://[::1]:50051").is_ok());
        assert!(parse_server("not-a-url").is_err());
        assert!(parse_server("127.0.0.1:50051").is_err());
        assert!(parse_server("ftp://h:1").is_err());
        assert!(parse_server("").is_err());
        assert!(parse_server("unix:/run/vallum/vallumd.sock").is_ok());
        assert!(parse_server("unix:///run/vallum/vallumd.sock").is_ok());
        assert!(parse_server("unix:relative.sock").is_err());
    }

    fn with_token_file(content: &str) -> Result<Option<String>, CliError> {
        let dir = tempfile::tempdir().map_err(|e| CliError::Output(e.to_string()))?;
        let path = dir.path().join("token");
        std::fs::write(&path, content).map_err(|e| CliError::Output(e.to_string()))?;
        let c = Connection {
            server_flag: None,
            server: String::new(),
            token: None,
            token_file: Some(path),
            ca: None,
            cert: None,
            key: None,
            tls_domain: None,
            timeout: Duration::from_secs(1),
            wait: None,
        };
        c.token()
    }

    #[test]
    fn token_file_is_trimmed_and_must_hold_a_token() {
        assert_eq!(
            with_token_file("s3cret\n").unwrap().as_deref(),
            Some("s3cret")
        );
        assert_eq!(
            with_token_file("  s3cret \r\n").unwrap().as_deref(),
            Some("s3cret")
        );
        assert!(matches!(
            with_token_file("\n \n"),
            Err(CliError::Argument(m)) if m.contains("holds no token")
        ));
    }
}
