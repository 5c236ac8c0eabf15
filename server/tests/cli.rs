//! Runs the vallumctl binary against a fake in-process tonic server (RulesetService,
//! CounterService, EngineService) with canned answers that check what the client sent. The real
//! server's end-to-end tests come with the server crate.

use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;

use tokio_stream::Stream;
use tonic::{Request, Response, Status};
use tonic_types::{ErrorDetails, FieldViolation, StatusExt};
use vallum_proto::v1::counter_service_server::{CounterService, CounterServiceServer};
use vallum_proto::v1::engine_service_server::{EngineService, EngineServiceServer};
use vallum_proto::v1::ruleset_service_server::{RulesetService, RulesetServiceServer};
use vallum_proto::v1::*;

const TOKEN: &str = "test-token-0123456789";

#[derive(Default)]
struct Fake;

fn text_of(source: Option<RulesetSource>) -> Result<RestoreText, Status> {
    match source.and_then(|s| s.source) {
        Some(ruleset_source::Source::Text(t)) => Ok(t),
        _ => Err(Status::invalid_argument("source.text missing")),
    }
}

fn rules(t: &RestoreText) -> u32 {
    t.content.lines().filter(|l| l.starts_with("-A")).count() as u32
}

/// The parse errors the fake reports for a file containing `BAD`: one `LINE:COL:` and one
/// `FILE:LINE:COL:` description, as the real server may send either.
fn parse_error(t: &RestoreText) -> Status {
    let details = ErrorDetails::with_bad_request(vec![
        FieldViolation::new("source.text", "3:7: unknown option `--bogus`"),
        FieldViolation::new("source.text", format!("{}:4:1: missing COMMIT", t.filename)),
    ]);
    let mut d = details;
    d.set_error_info(
        "PARSE_ERROR",
        "vallum.dev",
        std::collections::HashMap::new(),
    );
    Status::with_error_details(tonic::Code::InvalidArgument, "2 parse errors", d)
}

fn revision(ruleset: &str, n: u64, state: RevisionState) -> Revision {
    Revision {
        name: format!("rulesets/{ruleset}/revisions/{n}"),
        ruleset: ruleset.to_owned(),
        number: n,
        parent: n.saturating_sub(1),
        digest: "0123456789abcdef0123".to_owned(),
        author: "test".to_owned(),
        message: format!("rev {n}"),
        state: state as i32,
        rule_count: 2,
        ..Revision::default()
    }
}

/// `rulesets/R/revisions/N` -> (R, N), or INVALID_ARGUMENT.
fn parse_name(name: &str) -> Result<(String, u64), Status> {
    let rest = name
        .strip_prefix("rulesets/")
        .ok_or_else(|| Status::invalid_argument(format!("bad name {name}")))?;
    let (r, n) = rest
        .split_once("/revisions/")
        .ok_or_else(|| Status::invalid_argument(format!("bad name {name}")))?;
    let n = n
        .parse()
        .map_err(|_| Status::invalid_argument(format!("bad name {name}")))?;
    if n == 99 {
        return Err(Status::not_found(format!("{name} does not exist")));
    }
    Ok((r.to_owned(), n))
}

fn commit_result(
    ruleset: &str,
    n: u64,
    confirm: Option<prost_types::Duration>,
) -> Result<CommitResult, Status> {
    if let Some(d) = &confirm {
        if d.seconds != 30 || d.nanos != 0 {
            return Err(Status::invalid_argument(format!(
                "confirm_within {d:?}, expected 30s"
            )));
        }
    }
    Ok(CommitResult {
        revision: Some(revision(ruleset, n, RevisionState::Active)),
        phases: Some(CommitPhases {
            validate_ns: 1_000,
            compile_ns: 2_000,
            persist_ns: 3_000,
            publish_ns: 400,
            quiesce_ns: 500,
            carry_ns: 600,
            total_ns: 7_500,
            cores_waited: 1,
        }),
        confirm_deadline: confirm.map(|_| prost_types::Timestamp {
            seconds: 1_900_000_000,
            nanos: 0,
        }),
        etag: "e2".to_owned(),
    })
}

#[tonic::async_trait]
impl RulesetService for Fake {
    async fn validate_ruleset(
        &self,
        req: Request<ValidateRulesetRequest>,
    ) -> Result<Response<ValidateRulesetResponse>, Status> {
        let t = text_of(req.into_inner().source)?;
        let violations = if t.content.contains("BAD") {
            vec![Violation {
                severity: Severity::Error as i32,
                location: format!("{}:2:5", t.filename),
                path: "filter/INPUT#1".to_owned(),
                message: "unknown option `--bogus`".to_owned(),
                reason: "PARSE_ERROR".to_owned(),
            }]
        } else {
            Vec::new()
        };
        Ok(Response::new(ValidateRulesetResponse {
            valid: violations.is_empty(),
            rule_count: rules(&t),
            violations,
        }))
    }

    async fn stage_revision(
        &self,
        req: Request<StageRevisionRequest>,
    ) -> Result<Response<Revision>, Status> {
        let r = req.into_inner();
        let t = text_of(r.source)?;
        if t.content.contains("BAD") {
            return Err(parse_error(&t));
        }
        if r.ruleset.is_empty() {
            return Err(Status::invalid_argument("ruleset missing"));
        }
        let mut rev = revision(&r.ruleset, 1, RevisionState::Staged);
        rev.rule_count = rules(&t);
        rev.message = r.message;
        Ok(Response::new(rev))
    }

    async fn commit_revision(
        &self,
        req: Request<CommitRevisionRequest>,
    ) -> Result<Response<CommitResult>, Status> {
        let r = req.into_inner();
        let (rs, n) = parse_name(&r.name)?;
        commit_result(&rs, n, r.confirm_within).map(Response::new)
    }

    async fn confirm_commit(
        &self,
        req: Request<ConfirmCommitRequest>,
    ) -> Result<Response<ConfirmCommitResponse>, Status> {
        let (rs, n) = parse_name(&req.into_inner().name)?;
        Ok(Response::new(ConfirmCommitResponse {
            revision: Some(revision(&rs, n, RevisionState::Active)),
        }))
    }

    async fn apply(&self, req: Request<ApplyRequest>) -> Result<Response<CommitResult>, Status> {
        let r = req.into_inner();
        let t = text_of(r.source)?;
        if t.content.contains("BAD") {
            return Err(parse_error(&t));
        }
        commit_result(&r.ruleset, 2, r.confirm_within).map(Response::new)
    }

    async fn rollback(
        &self,
        req: Request<RollbackRequest>,
    ) -> Result<Response<CommitResult>, Status> {
        let (rs, n) = parse_name(&req.into_inner().name)?;
        commit_result(&rs, n + 10, None).map(Response::new)
    }

    async fn get_ruleset(
        &self,
        _: Request<GetRulesetRequest>,
    ) -> Result<Response<Ruleset>, Status> {
        Err(Status::unimplemented("not in the fake"))
    }

    async fn list_rulesets(
        &self,
        _: Request<ListRulesetsRequest>,
    ) -> Result<Response<ListRulesetsResponse>, Status> {
        Ok(Response::new(ListRulesetsResponse {
            rulesets: vec![
                Ruleset {
                    name: "rulesets/base".to_owned(),
                    priority: -10,
                    etag: "e1".to_owned(),
                    active_revision: 3,
                    latest_revision: 4,
                    update_time: None,
                },
                Ruleset {
                    name: "rulesets/web".to_owned(),
                    priority: 0,
                    etag: "e2".to_owned(),
                    active_revision: 1,
                    latest_revision: 1,
                    update_time: None,
                },
            ],
        }))
    }

    async fn delete_ruleset(
        &self,
        req: Request<DeleteRulesetRequest>,
    ) -> Result<Response<DeleteRulesetResponse>, Status> {
        match req.into_inner().name.as_str() {
            "rulesets/web" => Ok(Response::new(DeleteRulesetResponse {})),
            other => Err(Status::not_found(format!("{other} does not exist"))),
        }
    }

    async fn list_revisions(
        &self,
        req: Request<ListRevisionsRequest>,
    ) -> Result<Response<ListRevisionsResponse>, Status> {
        let r = req.into_inner();
        // Two pages, to check that the client follows next_page_token.
        let (n, next) = match r.page_token.as_str() {
            "" => (1, "p2"),
            "p2" => (2, ""),
            t => return Err(Status::invalid_argument(format!("bad page token {t}"))),
        };
        Ok(Response::new(ListRevisionsResponse {
            revisions: vec![revision(&r.ruleset, n, RevisionState::Superseded)],
            next_page_token: next.to_owned(),
        }))
    }

    async fn get_revision(
        &self,
        _: Request<GetRevisionRequest>,
    ) -> Result<Response<Revision>, Status> {
        Err(Status::unimplemented("not in the fake"))
    }

    async fn diff_revisions(
        &self,
        req: Request<DiffRevisionsRequest>,
    ) -> Result<Response<DiffRevisionsResponse>, Status> {
        let r = req.into_inner();
        parse_name(&r.from)?;
        parse_name(&r.to)?;
        Ok(Response::new(DiffRevisionsResponse {
            chains: vec![ChainDiff {
                family: Family::Ipv4 as i32,
                table: "filter".to_owned(),
                chain: "INPUT".to_owned(),
                added: vec!["-p tcp -m tcp --dport 443 -j ACCEPT".to_owned()],
                removed: vec!["-p tcp -m tcp --dport 80 -j ACCEPT".to_owned()],
                moved: vec![],
                policy_change: "ACCEPT -> DROP".to_owned(),
            }],
        }))
    }

    async fn export_revision(
        &self,
        req: Request<ExportRevisionRequest>,
    ) -> Result<Response<ExportRevisionResponse>, Status> {
        let r = req.into_inner();
        parse_name(&r.name)?;
        let c = if r.counters { "[5:300]" } else { "[0:0]" };
        Ok(Response::new(ExportRevisionResponse {
            content: format!("*filter\n:INPUT DROP {c}\nCOMMIT\n"),
            content_type: "text/plain".to_owned(),
        }))
    }

    type WatchCommitsStream = Pin<Box<dyn Stream<Item = Result<CommitEvent, Status>> + Send>>;

    async fn watch_commits(
        &self,
        _: Request<WatchCommitsRequest>,
    ) -> Result<Response<Self::WatchCommitsStream>, Status> {
        let events = (1..=2).map(|n| {
            Ok(CommitEvent {
                revision: format!("rulesets/web/revisions/{n}"),
                outcome: CommitOutcome::Committed as i32,
                phases: None,
                error: String::new(),
                time: None,
            })
        });
        Ok(Response::new(Box::pin(tokio_stream::iter(events))))
    }
}

fn counter(chain: &str, rule: u32, packets: u64, bytes: u64, text: &str) -> RuleCounter {
    RuleCounter {
        ruleset: "web".to_owned(),
        family: Family::Ipv4 as i32,
        table: "filter".to_owned(),
        chain: chain.to_owned(),
        rule,
        packets,
        bytes,
        text: text.to_owned(),
    }
}

#[tonic::async_trait]
impl CounterService for Fake {
    async fn get_counters(
        &self,
        req: Request<GetCountersRequest>,
    ) -> Result<Response<GetCountersResponse>, Status> {
        let r = req.into_inner();
        if !r.ruleset.is_empty() && r.ruleset != "web" {
            return Err(Status::not_found(format!(
                "ruleset {} does not exist",
                r.ruleset
            )));
        }
        Ok(Response::new(GetCountersResponse {
            counters: vec![
                counter("INPUT", 0, 12, 3456, "DROP"),
                counter(
                    "INPUT",
                    1,
                    100,
                    6000,
                    "-s 10.0.0.0/8 -p tcp -m tcp --dport 22 -j ACCEPT",
                ),
                counter("INPUT", 2, 7, 420, "-i eth0 -j LOG_DROP"),
                counter("FORWARD", 0, 0, 0, "ACCEPT"),
                counter(
                    "LOG_DROP",
                    1,
                    7,
                    420,
                    "-m comment --comment \"log it\" -j LOG --log-prefix \"drop \"",
                ),
                counter("LOG_DROP", 2, 7, 420, "-j DROP"),
            ],
        }))
    }

    async fn zero_counters(
        &self,
        _: Request<ZeroCountersRequest>,
    ) -> Result<Response<ZeroCountersResponse>, Status> {
        Ok(Response::new(ZeroCountersResponse {}))
    }
}

#[tonic::async_trait]
impl EngineService for Fake {
    async fn get_status(
        &self,
        _: Request<GetStatusRequest>,
    ) -> Result<Response<GetStatusResponse>, Status> {
        Ok(Response::new(GetStatusResponse {
            cores: vec![
                CoreStatus {
                    core: 0,
                    generation: 10,
                    packets: 1000,
                },
                CoreStatus {
                    core: 1,
                    generation: 7,
                    packets: 900,
                },
            ],
            active: vec![ActiveRevision {
                ruleset: "web".to_owned(),
                revision: 1,
                priority: 0,
            }],
            barrier_strategy: "seqcst".to_owned(),
            barrier_fallback: String::new(),
            packet_source: "none".to_owned(),
            version: "0.1.0".to_owned(),
            rules: 4,
            not_loaded: Vec::new(),
        }))
    }
}

#[allow(clippy::result_large_err)]
fn check_token(req: Request<()>) -> Result<Request<()>, Status> {
    let want = format!("Bearer {TOKEN}");
    match req.metadata().get("authorization") {
        Some(v) if v.as_bytes() == want.as_bytes() => Ok(req),
        Some(_) => Err(Status::unauthenticated("invalid token")),
        None => Err(Status::unauthenticated("missing bearer token")),
    }
}

async fn start() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RulesetServiceServer::with_interceptor(Fake, check_token))
            .add_service(CounterServiceServer::with_interceptor(Fake, check_token))
            .add_service(EngineServiceServer::with_interceptor(Fake, check_token))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    addr
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

async fn vallumctl(addr: SocketAddr, token: Option<&str>, args: &[&str]) -> Run {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_vallumctl"));
    cmd.args(args)
        .env_clear()
        .env("VALLUM_SERVER", format!("http://{addr}"));
    if let Some(t) = token {
        cmd.env("VALLUM_TOKEN", t);
    }
    let out = cmd.output().await.unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

async fn ok(addr: SocketAddr, args: &[&str]) -> String {
    let r = vallumctl(addr, Some(TOKEN), args).await;
    assert_eq!(
        r.code, 0,
        "{args:?}: stdout {} stderr {}",
        r.stdout, r.stderr
    );
    r.stdout
}

async fn json(addr: SocketAddr, args: &[&str]) -> serde_json::Value {
    let mut a = vec!["--output", "json"];
    a.extend_from_slice(args);
    let out = ok(addr, &a).await;
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
}

fn write(dir: &Path, name: &str, content: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, content).unwrap();
    p.display().to_string()
}

const GOOD: &str =
    "*filter\n:INPUT DROP [0:0]\n-A INPUT -p tcp --dport 22 -j ACCEPT\n-A INPUT -j DROP\nCOMMIT\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes() {
    let addr = start().await;
    let dir = tempfile::tempdir().unwrap();
    let good = write(dir.path(), "good.rules", GOOD);

    assert_eq!(vallumctl(addr, Some(TOKEN), &["status"]).await.code, 0);
    // Rejected by the server: NOT_FOUND, INVALID_ARGUMENT.
    let r = vallumctl(addr, Some(TOKEN), &["commit", "web/99"]).await;
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("NOT_FOUND: rulesets/web/revisions/99 does not exist"),
        "{}",
        r.stderr
    );
    assert_eq!(
        vallumctl(addr, Some(TOKEN), &["delete", "nope"]).await.code,
        1
    );
    // UNAUTHENTICATED without a token, and with a wrong one.
    let r = vallumctl(addr, None, &["rulesets"]).await;
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.contains("UNAUTHENTICATED: missing bearer token"),
        "{}",
        r.stderr
    );
    assert_eq!(vallumctl(addr, Some("wrong"), &["rulesets"]).await.code, 1);
    // Rejected locally: bad revision name, unreadable file.
    assert_eq!(
        vallumctl(addr, Some(TOKEN), &["commit", "web"]).await.code,
        1
    );
    let r = vallumctl(addr, Some(TOKEN), &["stage", "web", "/nonexistent.rules"]).await;
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.contains("cannot read /nonexistent.rules"),
        "{}",
        r.stderr
    );
    // Usage errors: clap's code 2.
    assert_eq!(vallumctl(addr, Some(TOKEN), &["frobnicate"]).await.code, 2);
    assert_eq!(
        vallumctl(addr, Some(TOKEN), &["stage", "web"]).await.code,
        2
    );
    assert_eq!(
        vallumctl(
            addr,
            Some(TOKEN),
            &["commit", "web/1", "--confirm-within", "3x"]
        )
        .await
        .code,
        2
    );
    assert_eq!(vallumctl(addr, Some(TOKEN), &["--help"]).await.code, 0);
    // Unavailable: a closed port.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let r = vallumctl(closed, Some(TOKEN), &["status"]).await;
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert!(r.stderr.contains("cannot connect to"), "{}", r.stderr);
    let r = vallumctl(closed, Some(TOKEN), &["apply", "web", &good]).await;
    assert_eq!(r.code, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_line_col_errors() {
    let addr = start().await;
    let dir = tempfile::tempdir().unwrap();
    let bad = write(dir.path(), "bad.rules", "*filter\nBAD\n");

    for cmd in ["stage", "apply"] {
        let r = vallumctl(addr, Some(TOKEN), &[cmd, "web", &bad]).await;
        assert_eq!(r.code, 1, "{}", r.stderr);
        let lines: Vec<&str> = r.stderr.lines().collect();
        assert_eq!(
            lines,
            [
                format!("{bad}:3:7: unknown option `--bogus`").as_str(),
                format!("{bad}:4:1: missing COMMIT").as_str(),
                "vallumctl: INVALID_ARGUMENT (PARSE_ERROR): 2 parse errors",
            ],
            "{cmd}"
        );
    }

    let r = vallumctl(addr, Some(TOKEN), &["validate", &bad]).await;
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert_eq!(
        r.stdout,
        format!("{bad}:2:5: error: unknown option `--bogus` (in filter/INPUT#1)\n")
    );

    // JSON errors are one object on stderr.
    let r = vallumctl(addr, Some(TOKEN), &["-o", "json", "stage", "web", &bad]).await;
    assert_eq!(r.code, 1);
    let e: serde_json::Value = serde_json::from_str(&r.stderr).unwrap();
    assert_eq!(e["code"], "INVALID_ARGUMENT");
    assert_eq!(e["reason"], "PARSE_ERROR");
    assert_eq!(e["exit_code"], 1);
    assert_eq!(
        e["violations"][0],
        format!("{bad}:3:7: unknown option `--bogus`")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_output_parses() {
    let addr = start().await;
    let dir = tempfile::tempdir().unwrap();
    let good = write(dir.path(), "good.rules", GOOD);

    let v = json(addr, &["validate", &good]).await;
    assert_eq!(
        (v["valid"].as_bool(), v["rule_count"].as_u64()),
        (Some(true), Some(2))
    );
    let v = json(addr, &["stage", "web", &good, "-m", "first"]).await;
    assert_eq!(v["name"], "rulesets/web/revisions/1");
    assert_eq!(v["state"], "staged");
    assert_eq!(v["message"], "first");
    let v = json(addr, &["commit", "web/1", "--confirm-within", "30s"]).await;
    assert_eq!(v["revision"]["state"], "active");
    assert_eq!(v["phases"]["total_ns"], 7500);
    assert_eq!(v["confirm_deadline"]["seconds"], 1_900_000_000i64);
    let v = json(addr, &["apply", "web", &good, "--confirm-within", "30s"]).await;
    assert_eq!(v["revision"]["number"], 2);
    let v = json(addr, &["confirm", "rulesets/web/revisions/2"]).await;
    assert_eq!(v["number"], 2);
    let v = json(addr, &["rollback", "web/1"]).await;
    assert_eq!(v["revision"]["number"], 11);
    let v = json(addr, &["revisions", "web"]).await;
    let numbers: Vec<u64> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["number"].as_u64().unwrap())
        .collect();
    assert_eq!(numbers, [1, 2], "both pages");
    let v = json(addr, &["diff", "web/1", "web/2"]).await;
    assert_eq!(v[0]["policy_change"], "ACCEPT -> DROP");
    let v = json(addr, &["export", "web/1", "--counters"]).await;
    assert!(
        v["content"]
            .as_str()
            .unwrap()
            .contains(":INPUT DROP [5:300]")
    );
    let v = json(addr, &["counters", "web"]).await;
    assert_eq!(v.as_array().unwrap().len(), 6);
    assert_eq!(v[0]["bytes"], 3456);
    let v = json(addr, &["status"]).await;
    assert_eq!(v["cores"][1]["generation"], 7);
    let v = json(addr, &["rulesets"]).await;
    assert_eq!(v[0]["priority"], -10);
    let v = json(addr, &["delete", "web"]).await;
    assert_eq!(v["deleted"], "web");
    let v = json(addr, &["counters", "--zero"]).await;
    assert_eq!(v["zeroed"], "");

    // watch: one JSON object per line.
    let out = ok(addr, &["--output", "json", "watch"]).await;
    let events: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events.len(), 2);
    assert_eq!(events[1]["revision"], "rulesets/web/revisions/2");
    assert_eq!(events[1]["outcome"], "committed");

    // Text output of export is the content itself.
    let out = ok(addr, &["export", "web/1"]).await;
    assert_eq!(out, "*filter\n:INPUT DROP [0:0]\nCOMMIT\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_table() {
    let addr = start().await;
    let out = ok(addr, &["counters"]).await;
    let expected = "\
# ruleset web, table filter (ipv4)
Chain INPUT (policy DROP 12 packets, 3456 bytes)
    pkts      bytes target     prot opt in     out    source              destination
     100       6000 ACCEPT     tcp  --  *      *      10.0.0.0/8          0.0.0.0/0           -m tcp --dport 22
       7        420 LOG_DROP   all  --  eth0   *      0.0.0.0/0           0.0.0.0/0

Chain FORWARD (policy ACCEPT 0 packets, 0 bytes)
    pkts      bytes target     prot opt in     out    source              destination

Chain LOG_DROP (1 references)
    pkts      bytes target     prot opt in     out    source              destination
       7        420 LOG        all  --  *      *      0.0.0.0/0           0.0.0.0/0           -m comment --comment \"log it\" --log-prefix \"drop \"
       7        420 DROP       all  --  *      *      0.0.0.0/0           0.0.0.0/0

";
    assert_eq!(out, expected, "got:\n{out}");
    let r = vallumctl(addr, Some(TOKEN), &["counters", "other"]).await;
    assert_eq!(r.code, 1);
}
