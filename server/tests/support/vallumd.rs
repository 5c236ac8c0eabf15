//! Shared helpers of the end-to-end tests: start a real `vallumd` on an ephemeral port with a
//! temporary database, connect clients, find the shared data.

#![allow(dead_code)] // Each test uses a different part.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tonic::transport::Channel;
use vallum_proto::v1::ruleset_service_client::RulesetServiceClient;

/// A running vallumd; killed on drop.
pub struct Vallumd {
    pub child: Child,
    pub addr: String,
    /// The `/metrics` listener (`metrics on ADDR`).
    pub metrics_addr: String,
}

impl Vallumd {
    /// Starts vallumd with `--listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --db DB` and
    /// `extra` flags; waits for the `metrics on ADDR` and `listening on ADDR` lines.
    pub fn start(db: &Path, extra: &[&str]) -> Vallumd {
        let mut child = Command::new(env!("CARGO_BIN_EXE_vallumd"))
            .args(["--listen", "127.0.0.1:0", "--db"])
            .arg(db)
            .args(["--cores", "2"])
            .args(["--metrics-listen", "127.0.0.1:0"])
            .args(extra)
            .env_remove("VALLUM_DB")
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
        for _ in 0..100 {
            if let Ok(c) = Channel::from_shared(self.url())
                .expect("url")
                .connect()
                .await
            {
                return c;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("cannot connect to {}", self.addr)
    }

    pub async fn rulesets(&self) -> RulesetServiceClient<Channel> {
        RulesetServiceClient::new(self.channel().await).max_decoding_message_size(64 << 20)
    }

    /// Waits until health says SERVING for "".
    pub async fn wait_serving(&self) {
        use tonic_health::pb::health_client::HealthClient;
        use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};
        let mut h = HealthClient::new(self.channel().await);
        for _ in 0..400 {
            let r = h
                .check(HealthCheckRequest {
                    service: String::new(),
                })
                .await;
            if matches!(r, Ok(ref r) if r.get_ref().status == ServingStatus::Serving as i32) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("vallumd never became SERVING");
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

/// `../shared/data` next to the workspace (or `$VALLUM_SHARED_DATA`), when present.
pub fn shared_data() -> Option<PathBuf> {
    let p = std::env::var_os("VALLUM_SHARED_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data"));
    p.is_dir().then_some(p)
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
