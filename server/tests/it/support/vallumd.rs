//! Shared helpers of the end-to-end tests: start a real `vallumd` on an ephemeral port with a
//! temporary database (or one in this process, [`InProcess`], where a test injects hooks such
//! as a clock), connect clients, find the shared data, join tasks, poll for a condition.

#![allow(dead_code)] // Each test uses a different part.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tonic::transport::Channel;
use vallum_proto::v1::ruleset_service_client::RulesetServiceClient;

/// Resource limits of a spawned vallumd ([`Vallumd::start_limited`]); `None` keeps the
/// test's own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rlimits {
    /// `RLIMIT_AS`, bytes.
    pub address_space: Option<u64>,
    /// `RLIMIT_NOFILE`: descriptors.
    pub open_files: Option<u64>,
}

/// A running vallumd; killed on drop.
pub struct Vallumd {
    pub child: Child,
    pub addr: String,
    /// The `/metrics` listener (`metrics on ADDR`).
    pub metrics_addr: String,
}

impl Vallumd {
    /// Starts vallumd with `--listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --db DB` and
    /// `extra` flags; waits for the `metrics on ADDR` and `listening on ADDR` lines. Unless
    /// `extra` says otherwise ([`harness_flags`]): `--insecure-no-auth` (the tests call over
    /// TCP without tokens) and `--socket none` (no test takes the host's default socket).
    pub fn start(db: &Path, extra: &[&str]) -> Vallumd {
        Vallumd::start_env(db, extra, &[])
    }

    /// As [`Vallumd::start`], with `env` set in vallumd's environment.
    pub fn start_env(db: &Path, extra: &[&str], env: &[(&str, &str)]) -> Vallumd {
        Vallumd::start_limited(db, extra, env, Rlimits::default())
    }

    /// As [`Vallumd::start_env`], under `limits` (setrlimit in the child before exec): with
    /// [`Rlimits::address_space`] an allocation past it fails and vallumd aborts, so a request
    /// whose memory is not bounded kills it instead of passing slowly.
    pub fn start_limited(
        db: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
        limits: Rlimits,
    ) -> Vallumd {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_vallumd"));
        if limits != Rlimits::default() {
            use std::os::unix::process::CommandExt;
            // SAFETY: the closure runs in the forked child before exec and only calls
            // setrlimit(2), which is async-signal-safe; it takes no lock and allocates nothing.
            unsafe {
                cmd.pre_exec(move || {
                    let set = |resource, bytes: u64| {
                        let lim = libc::rlimit {
                            rlim_cur: bytes,
                            rlim_max: bytes,
                        };
                        if libc::setrlimit(resource, &lim) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        Ok(())
                    };
                    if let Some(n) = limits.address_space {
                        set(libc::RLIMIT_AS, n)?;
                    }
                    if let Some(n) = limits.open_files {
                        set(libc::RLIMIT_NOFILE, n)?;
                    }
                    Ok(())
                });
            }
        }
        let mut child = cmd
            .args(["--listen", "127.0.0.1:0", "--db"])
            .arg(db)
            .args(["--cores", "2"])
            .args(["--metrics-listen", "127.0.0.1:0"])
            .args(harness_flags(extra))
            .args(extra)
            .env_remove("VALLUM_DB")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn vallumd");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let first = lines.next().expect("a line").expect("read stdout");
        let metrics_addr = first
            .strip_prefix("metrics on ")
            .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
            .to_string();
        let second = lines.next().expect("a line").expect("read stdout");
        let addr = second
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected second line {second:?}"))
            .to_string();
        // Keep draining stdout so the child never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Vallumd {
            child,
            addr,
            metrics_addr,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub async fn channel(&self) -> Channel {
        connect(&self.addr).await
    }

    pub async fn rulesets(&self) -> RulesetServiceClient<Channel> {
        RulesetServiceClient::new(self.channel().await).max_decoding_message_size(64 << 20)
    }

    /// Waits until health says SERVING for "".
    pub async fn wait_serving(&self) {
        assert!(serving(&self.addr).await, "vallumd never became SERVING");
    }

    /// SIGTERM (a graceful stop) and waits for the exit; true when it exited 0.
    pub fn terminate(&mut self) -> bool {
        let pid = libc::pid_t::try_from(self.child.id()).expect("a pid");
        // SAFETY: kill(2) on our own child's pid; it has not been waited for, so the pid is
        // still ours.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        self.child.wait().is_ok_and(|s| s.success())
    }

    /// kill -9.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Vallumd {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// The flags a test's vallumd gets unless `extra` has them: `--insecure-no-auth` (anonymous
/// TCP admin: the tests call over TCP without tokens; a test of the default passes
/// `--socket` or a token flag and gets no such flag) and `--socket none`.
pub fn harness_flags(extra: &[&str]) -> Vec<&'static str> {
    let has = |f: &str| {
        extra
            .iter()
            .any(|a| *a == f || a.starts_with(&format!("{f}=")))
    };
    let mut out = Vec::new();
    let secure = [
        "--insecure-no-auth",
        "--token-file",
        "--admin-token-file",
        "--reader-token-file",
        "--socket",
    ];
    if !secure.iter().any(|f| has(f)) {
        out.push("--insecure-no-auth");
    }
    if !has("--socket") {
        out.extend(["--socket", "none"]);
    }
    out
}

/// A channel to `addr` (retried while the listener comes up).
pub async fn connect(addr: &str) -> Channel {
    for _ in 0..100 {
        if let Ok(c) = Channel::from_shared(format!("http://{addr}"))
            .expect("url")
            .connect()
            .await
        {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("cannot connect to {addr}")
}

/// How long [`serving`] and [`poll`] keep trying at least: a wait for something that will
/// happen, sized for a loaded machine (a 2-core CI box running several test binaries, where
/// a debug vallumd loading `--example` can take seconds), never a duration a test asserts.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Polls health at `addr` until it says SERVING for "" (true) or [`PATIENCE`] passed
/// (false).
pub async fn serving(addr: &str) -> bool {
    let channel = connect(addr).await;
    let until = tokio::time::Instant::now() + PATIENCE;
    while tokio::time::Instant::now() < until {
        if serving_now(&channel).await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    false
}

/// One health check over a new connection to `addr` (no retry): SERVING for "" (true), or
/// anything else, a connection that fails included (false).
pub async fn serving_once(addr: &str) -> bool {
    let Ok(endpoint) = tonic::transport::Endpoint::from_shared(format!("http://{addr}")) else {
        return false;
    };
    let endpoint = endpoint
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10));
    match endpoint.connect().await {
        Ok(ch) => serving_now(&ch).await,
        Err(_) => false,
    }
}

/// Whether health on `channel` says SERVING for "".
async fn serving_now(channel: &Channel) -> bool {
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};
    let r = HealthClient::new(channel.clone())
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await;
    matches!(r, Ok(ref r) if r.get_ref().status == ServingStatus::Serving as i32)
}

/// vallumd run in this process (`server::run_with`) with the hooks a test gives it, e.g. a
/// [`vallum_server::control::pipeline::confirm_clock::ManualWallClock`]. Stopped on [`InProcess::stop`]
/// or when the test's runtime ends.
pub struct InProcess {
    pub addr: String,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<vallum_server::error::Result<vallum_server::Summary>>,
}

impl InProcess {
    /// Starts vallumd with `--listen 127.0.0.1:PORT --metrics-listen 127.0.0.1:0 --db DB
    /// --cores 2`, `extra` flags and `hooks`, and waits until it is SERVING. PORT is a free
    /// port picked here; when another process takes it first, starts again on another.
    pub async fn start(
        db: &Path,
        extra: &[&str],
        hooks: vallum_server::control::hooks::Hooks,
    ) -> Self {
        for _ in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port();
            let addr = format!("127.0.0.1:{port}");
            let mut args = vec!["vallumd", "--listen", &addr, "--cores", "2"];
            args.extend(["--metrics-listen", "127.0.0.1:0", "--db"]);
            let db = db.to_str().expect("a UTF-8 path");
            args.push(db);
            args.extend(harness_flags(extra));
            args.extend_from_slice(extra);
            let config = vallum_server::Config::from_args(args).expect("flags");
            let (stop, rx) = tokio::sync::oneshot::channel::<()>();
            let task = tokio::spawn(vallum_server::server::run_with(
                config,
                hooks.clone(),
                async {
                    let _ = rx.await;
                },
            ));
            // Until SERVING, or the server ended (it could not bind, or failed to start).
            let channel = Channel::from_shared(format!("http://{addr}"))
                .expect("url")
                .connect_lazy();
            let until = tokio::time::Instant::now() + PATIENCE;
            while tokio::time::Instant::now() < until {
                if task.is_finished() {
                    break;
                }
                if serving_now(&channel).await {
                    return InProcess { addr, stop, task };
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            assert!(
                task.is_finished(),
                "in-process vallumd never became SERVING"
            );
            match join(task).await {
                Err(e) if e.to_string().contains("bind") => continue,
                r => panic!("in-process vallumd did not start: {r:?}"),
            }
        }
        panic!("in-process vallumd: no free port after 5 tries");
    }

    pub async fn channel(&self) -> Channel {
        connect(&self.addr).await
    }

    pub async fn rulesets(&self) -> RulesetServiceClient<Channel> {
        RulesetServiceClient::new(self.channel().await).max_decoding_message_size(64 << 20)
    }

    /// Stops it as SIGTERM would and waits until it has ended.
    pub async fn stop(self) {
        let InProcess { stop, task, .. } = self;
        let _ = stop.send(());
        join(task).await.expect("vallumd ends cleanly");
    }
}

/// `../shared/data` next to the workspace (or `$VALLUM_SHARED_DATA`), when present.
pub fn shared_data() -> Option<PathBuf> {
    let p = std::env::var_os("VALLUM_SHARED_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data"));
    p.is_dir().then_some(p)
}

/// Where vallumd keeps its connection table across a graceful restart (`conntrack_state`).
pub fn conntrack_state_file(db: &Path) -> PathBuf {
    vallum_server::host::conntrack_state::path(db)
}

/// A restore-text source.
pub fn text_source(content: &str, v6: bool, filename: &str) -> vallum_proto::v1::RulesetSource {
    use vallum_proto::v1::{Family, RestoreText, RulesetSource, ruleset_source::Source};
    RulesetSource {
        source: Some(Source::Text(RestoreText {
            content: content.to_string(),
            family: if v6 { Family::Ipv6 } else { Family::Ipv4 } as i32,
            content_v6: String::new(),
            filename: filename.to_string(),
            ..Default::default()
        })),
    }
}

/// The ErrorInfo reason of a status.
pub fn reason(s: &tonic::Status) -> String {
    use tonic_types::StatusExt;
    s.get_error_details()
        .error_info()
        .map(|i| i.reason.clone())
        .unwrap_or_default()
}

/// Awaits a spawned task and re-raises its panic in the test (a failed assertion inside the
/// task fails the test with its own message); a task that was cancelled fails the test too.
pub async fn join<T>(task: tokio::task::JoinHandle<T>) -> T {
    match task.await {
        Ok(v) => v,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => panic!("task did not finish: {e}"),
    }
}

/// Polls `probe` `every` apart until it returns `Some`, for at least `attempts` polls and at
/// least [`PATIENCE`]; panics with `what` when it never does. A bound on the wait for
/// something that will happen, not a deadline the test asserts: on a loaded machine the
/// polls stretch out, and the bound does not end the wait before the thing could happen.
pub async fn poll<T, F, Fut>(what: &str, attempts: usize, every: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let until = tokio::time::Instant::now() + PATIENCE;
    let mut polls = 0;
    while polls < attempts || tokio::time::Instant::now() < until {
        if let Some(v) = probe().await {
            return v;
        }
        polls += 1;
        tokio::time::sleep(every).await;
    }
    panic!("{what}: not reached after {polls} polls");
}

/// The `vallumctl` binary, for tests that run it. It belongs to another package (vallum-cli),
/// and cargo builds only this package's binaries for its tests, so the first call builds it
/// with the cargo that runs the tests (`$CARGO`), into the target directory and profile of the
/// running test binary (`target/PROFILE/deps/TEST-HASH`), and later calls reuse that path.
/// The same build makes `vallum-iptables`, which lies beside it. `VALLUMCTL=PATH` runs a
/// prebuilt binary instead. Panics when the build fails (a test that runs vallumctl cannot go
/// on without it).
pub fn vallumctl() -> &'static Path {
    static PATH: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        if let Some(p) = std::env::var_os("VALLUMCTL") {
            return PathBuf::from(p);
        }
        let exe = std::env::current_exe().expect("the test binary's path");
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("the test binary lies in target/PROFILE/deps");
        let target_dir = profile_dir.parent().expect("target/PROFILE has a parent");
        let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") => "dev",
            Some(other) => other,
            None => panic!("no profile in {}", profile_dir.display()),
        };
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "--quiet", "-p", "vallum-cli", "--bin", "vallumctl"])
            .args(["--bin", "vallum-iptables"])
            .args(["--profile", profile, "--target-dir"])
            .arg(target_dir)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("run cargo build -p vallum-cli");
        assert!(status.success(), "cargo build -p vallum-cli: {status}");
        profile_dir.join("vallumctl")
    })
}

/// Sends bytes as they are (the codec neither encodes nor decodes).
#[derive(Clone, Copy, Default)]
pub struct RawCodec;

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }

    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl tonic::codec::Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        use prost::bytes::BufMut;
        dst.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        use prost::bytes::Buf;
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

/// Sends `bytes` as the request message of the unary RPC at `path`
/// (`/grpc.health.v1.Health/Check`) and returns the reply's bytes.
pub async fn raw_unary(ch: Channel, path: &str, bytes: Vec<u8>) -> Result<Vec<u8>, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(ch);
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(format!("not ready: {e}")))?;
    let path = http::uri::PathAndQuery::try_from(path)
        .map_err(|e| tonic::Status::invalid_argument(format!("path: {e}")))?;
    grpc.unary(tonic::Request::new(bytes), path, RawCodec)
        .await
        .map(tonic::Response::into_inner)
}
