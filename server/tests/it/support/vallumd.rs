//! Shared helpers of the end-to-end tests and the server benches: start a real `vallumd`
//! ([`Daemon`]: a process, or one in this process where a test injects hooks such as a clock)
//! on ephemeral ports with a temporary database, connect clients, find the shared data, join
//! tasks, poll for a condition.

#![allow(dead_code)] // Each test uses a different part.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tonic::transport::Channel;
use vallum_proto::v1::ruleset_service_client::RulesetServiceClient;

/// Resource limits of a spawned vallumd ([`Daemon::start_limited`]); `None` keeps the
/// test's own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rlimits {
    /// `RLIMIT_AS`, bytes.
    pub address_space: Option<u64>,
    /// `RLIMIT_NOFILE`: descriptors.
    pub open_files: Option<u64>,
}

/// A running vallumd, the one way tests and benches start it: a child process
/// ([`Daemon::start`], [`Daemon::start_env`], [`Daemon::start_limited`], [`Daemon::spawn`]) or
/// `server::run_with` on a task of the caller's runtime ([`Daemon::in_process`], where a test
/// injects hooks such as a clock). Both answer on `addr` (gRPC) and `metrics_addr` (`/metrics`)
/// on 127.0.0.1 and stop with [`Daemon::stop`]; a process is killed on drop, an in-process one
/// is told to stop on drop and ends with the runtime.
pub struct Daemon {
    /// The gRPC listener, `127.0.0.1:PORT`.
    pub addr: String,
    /// The `/metrics` listener, `127.0.0.1:PORT`.
    pub metrics_addr: String,
    run: Run,
}

/// How a [`Daemon`] runs.
enum Run {
    Process(Child),
    InProcess {
        stop: Option<tokio::sync::oneshot::Sender<()>>,
        task: Option<InProcessTask>,
    },
}

/// The task of an in-process vallumd: `server::run_with`'s result.
type InProcessTask = tokio::task::JoinHandle<vallum_server::error::Result<vallum_server::Summary>>;

impl Daemon {
    /// Starts vallumd with `--listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --db DB` and
    /// `extra` flags; waits for the `metrics on ADDR` and `listening on ADDR` lines. Unless
    /// `extra` says otherwise ([`harness_flags`]): `--insecure-no-auth` (the tests call over
    /// TCP without tokens) and `--socket none` (no test takes the host's default socket).
    pub fn start(db: &Path, extra: &[&str]) -> Daemon {
        Daemon::start_env(db, extra, &[])
    }

    /// As [`Daemon::start`], with `env` set in vallumd's environment.
    pub fn start_env(db: &Path, extra: &[&str], env: &[(&str, &str)]) -> Daemon {
        Daemon::start_limited(db, extra, env, Rlimits::default())
    }

    /// As [`Daemon::start_env`], under `limits` (setrlimit in the child before exec): with
    /// [`Rlimits::address_space`] an allocation past it fails and vallumd aborts, so a request
    /// whose memory is not bounded kills it instead of passing slowly.
    pub fn start_limited(
        db: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
        limits: Rlimits,
    ) -> Daemon {
        let mut cmd = command();
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
        cmd.arg("--db")
            .arg(db)
            .args(["--cores", "2"])
            .args(harness_flags(extra))
            .args(extra)
            .envs(env.iter().copied());
        Daemon::spawn(cmd, |_| {})
    }

    /// Spawns `cmd`, a vallumd command line the caller built whole (its binary, e.g. another
    /// build, and every flag; it must listen on 127.0.0.1 and print its listeners), calls
    /// `spawned` with the child (e.g. to move it into a cgroup) and waits for the
    /// `listening on ADDR` line (and the `metrics on ADDR` line before it, when there is one; other lines are passed
    /// over).
    /// stdout is drained after that so the child never blocks on a full pipe; stderr is the
    /// test's.
    pub fn spawn(mut cmd: Command, spawned: impl FnOnce(&Child)) -> Daemon {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn vallumd");
        spawned(&child);
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let (mut addr, mut metrics_addr) = (None, String::new());
        for line in lines.by_ref() {
            let line = line.expect("read vallumd's stdout");
            if let Some(a) = line.strip_prefix("metrics on ") {
                metrics_addr = a.to_string();
            } else if let Some(a) = line.strip_prefix("listening on ") {
                addr = Some(a.to_string());
                break;
            }
        }
        let Some(addr) = addr else {
            let status = child.wait();
            panic!("vallumd ended before `listening on ADDR`: {status:?}");
        };
        std::thread::spawn(move || for _ in lines {});
        Daemon {
            addr,
            metrics_addr,
            run: Run::Process(child),
        }
    }

    /// Runs vallumd in this process (`server::run_with`, on a task of the current runtime)
    /// with `--listen 127.0.0.1:PORT --metrics-listen 127.0.0.1:PORT2 --db DB --cores 2`, the
    /// [`harness_flags`], `extra` flags and `hooks`, and waits until it is SERVING. The ports
    /// are free ones picked here; when another process takes one first, starts again on others.
    pub async fn in_process(
        db: &Path,
        extra: &[&str],
        hooks: vallum_server::control::hooks::Hooks,
    ) -> Daemon {
        let free = || {
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port()
        };
        for _ in 0..5 {
            let addr = format!("127.0.0.1:{}", free());
            let metrics_addr = format!("127.0.0.1:{}", free());
            let mut args = vec!["vallumd", "--listen", &addr, "--cores", "2"];
            args.extend(["--metrics-listen", &metrics_addr, "--db"]);
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
            for _ in 0..400 {
                if task.is_finished() {
                    break;
                }
                if serving_now(&channel).await {
                    return Daemon {
                        addr,
                        metrics_addr,
                        run: Run::InProcess {
                            stop: Some(stop),
                            task: Some(task),
                        },
                    };
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

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The gRPC port.
    pub fn port(&self) -> u16 {
        let (_, port) = self.addr.rsplit_once(':').expect("ADDR:PORT");
        port.parse().expect("a port")
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

    /// Stops it as SIGTERM does and waits until it has ended; panics unless it ended cleanly
    /// (a process: exit status 0; in-process: `run_with` returned `Ok`, its panic re-raised).
    pub async fn stop(mut self) {
        if let Run::InProcess { stop, task } = &mut self.run {
            if let Some(stop) = stop.take() {
                let _ = stop.send(());
            }
            let task = task.take().expect("stopped once");
            join(task).await.expect("vallumd ends cleanly");
        } else {
            assert!(self.terminate(), "vallumd did not exit 0 on SIGTERM");
        }
    }

    /// The child process; panics for an in-process vallumd (a test that needs a pid, a signal
    /// or an exit status starts a process).
    fn child(&mut self) -> &mut Child {
        match &mut self.run {
            Run::Process(child) => child,
            Run::InProcess { .. } => panic!("an in-process vallumd has no process of its own"),
        }
    }

    /// The process id (a process only).
    pub fn pid(&self) -> u32 {
        match &self.run {
            Run::Process(child) => child.id(),
            Run::InProcess { .. } => panic!("an in-process vallumd has no process of its own"),
        }
    }

    /// The exit status once the process has ended, `None` while it runs (a process only).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child().try_wait().expect("wait for vallumd")
    }

    /// SIGTERM (a graceful stop) and waits for the exit; true when it exited 0 (a process
    /// only).
    pub fn terminate(&mut self) -> bool {
        let child = self.child();
        let pid = libc::pid_t::try_from(child.id()).expect("a pid");
        // SAFETY: kill(2) on our own child's pid; it has not been waited for, so the pid is
        // still ours.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        child.wait().is_ok_and(|s| s.success())
    }

    /// kill -9 (a process only).
    pub fn kill9(&mut self) {
        let child = self.child();
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        match &mut self.run {
            Run::Process(child) => {
                let _ = child.kill();
                let _ = child.wait();
            }
            Run::InProcess { stop, .. } => {
                if let Some(stop) = stop.take() {
                    let _ = stop.send(());
                }
            }
        }
    }
}

/// The vallumd this package built (`CARGO_BIN_EXE_vallumd`) as [`command_of`] starts it.
pub fn command() -> Command {
    command_of(Path::new(env!("CARGO_BIN_EXE_vallumd")))
}

/// The start of every vallumd command line of the tests: `bin --listen 127.0.0.1:0
/// --metrics-listen 127.0.0.1:0`, without `VALLUM_DB` from the test's environment. A test
/// adds `--db` and its flags, then hands it to [`Daemon::spawn`] or runs it to its exit (a
/// refusal at startup: `.output()`).
pub fn command_of(bin: &Path) -> Command {
    let mut cmd = Command::new(bin);
    cmd.args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .env_remove("VALLUM_DB");
    cmd
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
