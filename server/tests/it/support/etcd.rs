//! Real etcd for the fleet tests: one member, or a 3-member cluster, on loopback ports with
//! temporary data directories. `etcd` is found on `PATH` or at `/usr/bin/etcd` (Debian's
//! `etcd-server`); when absent, [`EtcdServer::start`] panics with that reason (the tests that use
//! it are `#[ignore = "needs etcd ..."]`).

#![allow(dead_code)] // Each test uses a different part.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The etcd binary, if installed.
pub fn etcd_bin() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("etcd"))
        .chain([PathBuf::from("/usr/bin/etcd")])
        .find(|p| p.is_file())
}

/// A free loopback port never handed out before in this process: the tests of one binary
/// run in parallel, and the kernel may give a port just released to the next `bind(0)`.
fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// One etcd member; killed on drop.
pub struct EtcdServer {
    child: Option<Child>,
    bin: PathBuf,
    name: String,
    pub client_port: u16,
    pub peer_port: u16,
    cluster: String,
    dir: tempfile::TempDir,
    /// TLS for clients: (CA, certificate, key) PEM files; /health is then read from a
    /// plaintext metrics listener on `health_port`.
    tls: Option<[PathBuf; 3]>,
    health_port: u16,
    /// More etcd flags (e.g. `--enable-pprof`).
    extra: Vec<String>,
}

impl EtcdServer {
    /// A single-member etcd, up and healthy; panics when etcd is not installed.
    pub fn start() -> EtcdServer {
        EtcdServer::start_with(&[])
    }

    /// As [`EtcdServer::start`], with more etcd flags.
    pub fn start_with(extra: &[&str]) -> EtcdServer {
        let bin = etcd_bin().expect("etcd is not installed (Debian package etcd-server)");
        let peer = free_port();
        let mut m = EtcdServer::member(
            bin,
            "m0",
            free_port(),
            peer,
            format!("m0=http://127.0.0.1:{peer}"),
        );
        m.extra = extra.iter().map(|a| a.to_string()).collect();
        m.spawn();
        m.wait_healthy();
        m
    }

    /// A single-member etcd serving clients over TLS only, with `cert`/`key` and requiring
    /// client certificates signed by `ca` (`--client-cert-auth`).
    pub fn start_tls(
        ca: &std::path::Path,
        cert: &std::path::Path,
        key: &std::path::Path,
    ) -> EtcdServer {
        let bin = etcd_bin().expect("etcd is not installed (Debian package etcd-server)");
        let peer = free_port();
        let mut m = EtcdServer::member(
            bin,
            "m0",
            free_port(),
            peer,
            format!("m0=http://127.0.0.1:{peer}"),
        );
        m.tls = Some([ca.to_path_buf(), cert.to_path_buf(), key.to_path_buf()]);
        m.health_port = free_port();
        m.spawn();
        m.wait_healthy();
        m
    }

    fn member(
        bin: PathBuf,
        name: &str,
        client_port: u16,
        peer_port: u16,
        cluster: String,
    ) -> EtcdServer {
        EtcdServer {
            child: None,
            bin,
            name: name.to_string(),
            client_port,
            peer_port,
            cluster,
            dir: tempfile::tempdir().expect("tempdir"),
            tls: None,
            health_port: client_port,
            extra: Vec::new(),
        }
    }

    /// `http://127.0.0.1:PORT` (`https://` with TLS).
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    fn spawn(&mut self) {
        let client = self.url();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::File::create(self.dir.path().join("etcd.log")).expect("log file");
        let mut cmd = Command::new(&self.bin);
        if let Some([ca, cert, key]) = &self.tls {
            cmd.arg("--cert-file")
                .arg(cert)
                .arg("--key-file")
                .arg(key)
                .arg("--trusted-ca-file")
                .arg(ca)
                .arg("--client-cert-auth")
                .arg("--listen-metrics-urls")
                .arg(format!("http://127.0.0.1:{}", self.health_port));
        }
        let child = cmd
            .arg("--name")
            .arg(&self.name)
            .arg("--data-dir")
            .arg(self.dir.path().join("data"))
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &self.cluster])
            .args([
                "--initial-cluster-state",
                "new",
                "--initial-cluster-token",
                "vallum-test",
            ])
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn etcd");
        self.child = Some(child);
    }

    /// Waits until `/health` says true (at most 30 s), from this member's own process.
    pub fn wait_healthy(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let exited = self
                .child
                .as_mut()
                .is_none_or(|c| !matches!(c.try_wait(), Ok(None)));
            if exited {
                break;
            }
            if self.healthy() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let log = std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default();
        panic!("etcd {} never became healthy; its log:\n{log}", self.name);
    }

    fn healthy(&self) -> bool {
        self.http_get("/health", Duration::from_secs(2))
            .is_some_and(|b| String::from_utf8_lossy(&b).contains("\"health\":\"true\""))
    }

    /// The body of `GET path` on the health/metrics listener (plaintext; HTTP/1.0, so never
    /// chunked), waiting at most `timeout` for it; `None` when unreachable.
    pub fn http_get(&self, path: &str, timeout: Duration) -> Option<Vec<u8>> {
        let mut s = TcpStream::connect(("127.0.0.1", self.health_port)).ok()?;
        let _ = s.set_read_timeout(Some(timeout));
        let req = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
        s.write_all(req.as_bytes()).ok()?;
        let mut all = Vec::new();
        let _ = s.read_to_end(&mut all);
        let at = all.windows(4).position(|w| w == b"\r\n\r\n")?;
        Some(all.split_off(at + 4))
    }

    /// The process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGSTOP: etcd hangs (its sockets accept, nothing answers) until [`EtcdServer::resume`].
    /// Returns once every thread of etcd is stopped (state `T` in `/proc/PID/task/*/stat`):
    /// a thread inside a system call (an fsync) stops only when it returns from it.
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
        let pid = self.pid().expect("etcd is running");
        let stopped = || {
            let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
                return false;
            };
            tasks.flatten().all(|t| {
                std::fs::read_to_string(t.path().join("stat"))
                    .ok()
                    .and_then(|s| Some(s.rsplit_once(") ")?.1.starts_with(['T', 't'])))
                    .unwrap_or(true)
            })
        };
        let mut polls = 0;
        while !stopped() {
            polls += 1;
            assert!(polls < 10_000, "etcd {pid} never stopped after SIGSTOP");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// SIGCONT after [`EtcdServer::pause`].
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    fn signal(&self, sig: libc::c_int) {
        let pid = self
            .pid()
            .and_then(|p| libc::pid_t::try_from(p).ok())
            .expect("etcd is running");
        // SAFETY: kill(2) on our own child's pid, which has not been waited for (it is still
        // in `self.child`), so the pid is still ours.
        let rc = unsafe { libc::kill(pid, sig) };
        assert_eq!(
            rc,
            0,
            "kill({pid}, {sig}): {}",
            std::io::Error::last_os_error()
        );
    }

    /// kill -9 (the data directory stays).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts again on the same ports and data directory.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
        self.wait_healthy();
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        // SIGKILL ends a paused (SIGSTOPped) etcd too.
        self.stop();
    }
}

/// A 3-member etcd cluster.
pub struct EtcdCluster {
    pub members: Vec<EtcdServer>,
}

impl EtcdCluster {
    /// Three members, all healthy; panics when etcd is not installed.
    pub fn start() -> EtcdCluster {
        let bin = etcd_bin().expect("etcd is not installed (Debian package etcd-server)");
        let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
        let cluster = ports
            .iter()
            .enumerate()
            .map(|(i, (_, p))| format!("m{i}=http://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut members: Vec<EtcdServer> = ports
            .iter()
            .enumerate()
            .map(|(i, (c, p))| {
                EtcdServer::member(bin.clone(), &format!("m{i}"), *c, *p, cluster.clone())
            })
            .collect();
        for m in &mut members {
            m.spawn();
        }
        for m in &mut members {
            m.wait_healthy();
        }
        EtcdCluster { members }
    }

    /// Starts every stopped member again (all at once: a member alone has no quorum and
    /// never says healthy) and waits until each is healthy.
    pub fn restart_stopped(&mut self) {
        let stopped: Vec<usize> = (0..self.members.len())
            .filter(|i| self.members[*i].child.is_none())
            .collect();
        for i in &stopped {
            self.members[*i].spawn();
        }
        for i in stopped {
            self.members[i].wait_healthy();
        }
    }

    /// Every member's URL, comma-separated (for `--fleet-endpoints`).
    pub fn endpoints(&self) -> String {
        self.members
            .iter()
            .map(EtcdServer::url)
            .collect::<Vec<_>>()
            .join(",")
    }
}
