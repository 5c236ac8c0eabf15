//! Runs the vallumctl binary against a fake in-process tonic server (RulesetService,
//! CounterService, EngineService) with canned answers that check what the client sent, and
//! against a real vallumd for exit codes, messages and the confirm deadline; checks that the
//! exit-code tables of README.md and docs/operations.md are the code's.

use crate::support;
use crate::support::served;

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

use served::Served;

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

fn ns(n: u64) -> prost_types::Duration {
    prost_types::Duration {
        seconds: (n / 1_000_000_000) as i64,
        nanos: (n % 1_000_000_000) as i32,
    }
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
            validate: Some(ns(1_000)),
            compile: Some(ns(2_000)),
            persist: Some(ns(3_000)),
            publish: Some(ns(400)),
            quiesce: Some(ns(500)),
            carry: Some(ns(600)),
            total: Some(ns(7_500)),
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

    async fn edit_ruleset(
        &self,
        _req: Request<vallum_proto::v1::EditRulesetRequest>,
    ) -> Result<Response<CommitResult>, Status> {
        Err(Status::unimplemented("not faked"))
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

    async fn update_ruleset(
        &self,
        _: Request<vallum_proto::v1::UpdateRulesetRequest>,
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
            next_page_token: String::new(),
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
        parse_name(&r.base)?;
        parse_name(&r.target)?;
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
        if parse_name(&r.name)?.1 == 77 {
            // Never answers: for the client's --timeout.
            std::future::pending::<()>().await;
        }
        let c = if r.counters { "[5:300]" } else { "[0:0]" };
        Ok(Response::new(ExportRevisionResponse {
            content: format!("*filter\n:INPUT DROP {c}\nCOMMIT\n"),
            content_type: "text/plain".to_owned(),
        }))
    }

    async fn shadow_revision(
        &self,
        _: Request<vallum_proto::v1::ShadowRevisionRequest>,
    ) -> Result<Response<vallum_proto::v1::ShadowReport>, Status> {
        Err(Status::unimplemented("not in the fake"))
    }

    async fn end_shadow(
        &self,
        _: Request<vallum_proto::v1::EndShadowRequest>,
    ) -> Result<Response<vallum_proto::v1::ShadowReport>, Status> {
        Err(Status::unimplemented("not in the fake"))
    }

    async fn get_shadow_report(
        &self,
        _: Request<vallum_proto::v1::GetShadowReportRequest>,
    ) -> Result<Response<vallum_proto::v1::ShadowReport>, Status> {
        Err(Status::unimplemented("not in the fake"))
    }

    type WatchCommitsStream = Pin<Box<dyn Stream<Item = Result<CommitEvent, Status>> + Send>>;

    async fn watch_commits(
        &self,
        _: Request<WatchCommitsRequest>,
    ) -> Result<Response<Self::WatchCommitsStream>, Status> {
        let events = (1..=2).map(|n| {
            Ok(CommitEvent {
                sequence: 100 + n,
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
        nft_rule: 0,
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
        // Two pages (vallumctl must join them): the first three counters, then the rest.
        let all = [
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
        ];
        let (counters, next_page_token) = match r.page_token.as_str() {
            "" => (all[..3].to_vec(), "page-2".to_owned()),
            "page-2" => (all[3..].to_vec(), String::new()),
            t => return Err(Status::invalid_argument(format!("page_token {t}"))),
        };
        Ok(Response::new(GetCountersResponse {
            counters,
            next_page_token,
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
            kernel_tables: Vec::new(),
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

async fn start() -> Served {
    served::serve(|incoming, shutdown| {
        tonic::transport::Server::builder()
            .add_service(RulesetServiceServer::with_interceptor(Fake, check_token))
            .add_service(CounterServiceServer::with_interceptor(Fake, check_token))
            .add_service(EngineServiceServer::with_interceptor(Fake, check_token))
            .serve_with_incoming_shutdown(incoming, shutdown)
    })
    .await
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

async fn vallumctl(addr: SocketAddr, token: Option<&str>, args: &[&str]) -> Run {
    let mut cmd = tokio::process::Command::new(support::vallumctl());
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
    let server = start().await;
    let addr = server.addr;
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
    // Rejected locally: unreadable file.
    let r = vallumctl(addr, Some(TOKEN), &["stage", "web", "/nonexistent.rules"]).await;
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.contains("cannot read /nonexistent.rules"),
        "{}",
        r.stderr
    );
    // Usage errors: clap's code 2, and a malformed revision name (no call made).
    assert_eq!(vallumctl(addr, Some(TOKEN), &["frobnicate"]).await.code, 2);
    for args in [["commit", "web"], ["export", "web"]] {
        let r = vallumctl(addr, Some(TOKEN), &args).await;
        assert_eq!(r.code, 2, "{args:?}: {}", r.stderr);
        assert!(r.stderr.contains("`web` is not a revision"), "{}", r.stderr);
    }
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
    // Unavailable: a closed port (held, so no other process takes it meanwhile).
    let (_held, closed) = closed_port();
    let r = vallumctl(closed, Some(TOKEN), &["status"]).await;
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert!(r.stderr.contains("cannot connect to"), "{}", r.stderr);
    let r = vallumctl(closed, Some(TOKEN), &["apply", "web", &good]).await;
    assert_eq!(r.code, 3);
    // The client's deadline: tonic says CANCELLED, the class is unavailable.
    let r = vallumctl(
        addr,
        Some(TOKEN),
        &["--timeout", "200ms", "export", "web/77"],
    )
    .await;
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert_eq!(
        r.stderr,
        format!(
            "vallumctl: DEADLINE_EXCEEDED: no answer from http://{addr} within 200ms (--timeout)\n"
        )
    );
    let r = vallumctl(
        addr,
        Some(TOKEN),
        &["-o", "json", "--timeout", "200ms", "export", "web/77"],
    )
    .await;
    assert_eq!(r.code, 3, "{}", r.stderr);
    let e: serde_json::Value = serde_json::from_str(&r.stderr).unwrap();
    assert_eq!(
        (&e["code"], &e["reason"], &e["exit_code"]),
        (
            &"DEADLINE_EXCEEDED".into(),
            &"DEADLINE_EXCEEDED".into(),
            &3.into()
        )
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_line_col_errors() {
    let server = start().await;
    let addr = server.addr;
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
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_output_parses() {
    let server = start().await;
    let addr = server.addr;
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
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_table() {
    let server = start().await;
    let addr = server.addr;
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
    // --line-numbers: a `num` column first, as `iptables -L --line-numbers`.
    let out = ok(addr, &["counters", "--line-numbers"]).await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[2],
        "num      pkts      bytes target     prot opt in     out    source              destination"
    );
    assert_eq!(
        lines[3],
        "1         100       6000 ACCEPT     tcp  --  *      *      10.0.0.0/8          0.0.0.0/0           -m tcp --dport 22"
    );
    assert!(
        lines[4].starts_with("2           7        420 LOG_DROP"),
        "{out}"
    );
    assert!(
        lines[12].starts_with("2           7        420 DROP"),
        "{out}"
    );
    let r = vallumctl(addr, Some(TOKEN), &["counters", "other"]).await;
    assert_eq!(r.code, 1);
    server.stop().await;
}

// === against a real vallumd ===

async fn run_at(url: &str, env: &[(&str, &str)], args: &[&str]) -> Run {
    let mut cmd = tokio::process::Command::new(support::vallumctl());
    cmd.args(args).env_clear().env("VALLUM_SERVER", url);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().await.unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

/// A real vallumd (loopback, no tokens) in a temporary directory.
async fn real() -> (support::Daemon, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let d = support::Daemon::start(&dir.path().join("v.db"), &[]);
    d.wait_serving().await;
    (d, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_of_failures_in_the_client() {
    let (mut d, dir) = real().await;
    let url = d.url();
    let good = write(dir.path(), "good.rules", GOOD);
    assert_eq!(run_at(&url, &[], &["apply", "web", &good]).await.code, 0);

    // A malformed --server is a usage error (no connection tried), in JSON too.
    let r = run_at(&url, &[], &["--server", "not-a-url", "status"]).await;
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("`not-a-url` is not a URL like http://HOST:PORT"),
        "{}",
        r.stderr
    );
    let r = run_at(
        &url,
        &[],
        &["-o", "json", "--server", "127.0.0.1:1", "status"],
    )
    .await;
    assert_eq!(r.code, 2, "{}", r.stderr);
    let e: serde_json::Value = serde_json::from_str(&r.stderr).unwrap();
    assert_eq!(
        (&e["reason"], &e["exit_code"]),
        (&"USAGE".into(), &2.into())
    );
    // A malformed revision: no call made, usage.
    let r = run_at(&url, &[], &["export", "web"]).await;
    assert_eq!(r.code, 2, "{}", r.stderr);
    // Usage errors from clap are JSON with -o json or VALLUM_OUTPUT=json, still exit 2.
    for (env, args) in [
        (&[][..], &["-o", "json", "frobnicate"][..]),
        (
            &[][..],
            &["--output=json", "commit", "web/1", "--confirm-within", "3x"][..],
        ),
        (&[("VALLUM_OUTPUT", "json")][..], &["stage", "web"][..]),
    ] {
        let r = run_at(&url, env, args).await;
        assert_eq!(r.code, 2, "{args:?}: {}", r.stderr);
        let e: serde_json::Value = serde_json::from_str(&r.stderr)
            .unwrap_or_else(|err| panic!("{args:?}: {err}: {}", r.stderr));
        assert_eq!(
            (&e["reason"], &e["exit_code"]),
            (&"USAGE".into(), &2.into()),
            "{e}"
        );
        assert!(e["error"].as_str().is_some_and(|m| !m.is_empty()), "{e}");
    }
    // Without -o json they stay clap's text.
    let r = run_at(&url, &[], &["frobnicate"]).await;
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.starts_with("error: unrecognized subcommand"),
        "{}",
        r.stderr
    );

    // https:// against the plaintext server: say what is wrong.
    let tls_url = url.replace("http://", "https://");
    let r = run_at(&tls_url, &[], &["status"]).await;
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert!(
        r.stderr.contains("the server does not speak TLS")
            && r.stderr.contains(&format!("use {url}")),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("InvalidContentType"), "{}", r.stderr);

    // The server killed during a call (a watch stream): unavailable, not UNKNOWN/1.
    let mut watch = tokio::process::Command::new(support::vallumctl())
        .args(["watch"])
        .env_clear()
        .env("VALLUM_SERVER", &url)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines =
        tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(watch.stdout.take().unwrap()));
    // Commit until the watch has printed one: then the stream is open.
    let mut printed = None;
    for port in 1..=200u16 {
        let rules = GOOD.replace("--dport 22", &format!("--dport {port}"));
        let f = write(dir.path(), "next.rules", &rules);
        assert_eq!(run_at(&url, &[], &["apply", "web", &f]).await.code, 0);
        if let Ok(line) =
            tokio::time::timeout(std::time::Duration::from_millis(200), lines.next_line()).await
        {
            printed = line.unwrap();
            break;
        }
    }
    let printed = printed.expect("watch printed a commit");
    // `TIME committed rulesets/web/revisions/N ...`, the time in RFC 3339.
    let (at, rest) = printed.split_once(' ').expect("a time first");
    let _: jiff::Timestamp = at.parse().unwrap_or_else(|e| panic!("{printed}: {e}"));
    assert!(rest.starts_with("committed"), "{printed}");
    d.kill9();
    let out = watch.wait_with_output().await.unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.starts_with(&format!(
            "vallumctl: UNAVAILABLE (CONNECTION_LOST): the connection to {url} broke during the call"
        )),
        "{stderr}"
    );
    // A closed port: the cause once.
    let r = run_at(&url, &[], &["status"]).await;
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert!(
        !r.stderr.contains("tcp connect error: tcp connect error"),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("transport error"), "{}", r.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_say_each_fact_once() {
    let (_d, dir) = real().await;
    let url = _d.url();
    let bad = write(
        dir.path(),
        "bad.rules",
        "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -p tcp --bogus 1 -j ACCEPT\n-A INPUT -p udp --bogus 2 -j ACCEPT\nCOMMIT\n",
    );
    for cmd in [
        &["apply", "web"][..],
        &["stage", "web"][..],
        &["validate"][..],
    ] {
        let mut args = cmd.to_vec();
        args.push(&bad);
        let r = run_at(&url, &[], &args).await;
        assert_eq!(r.code, 1, "{args:?}: {}", r.stderr);
        let lines: Vec<&str> = r.stderr.lines().collect();
        assert_eq!(lines.len(), 3, "{args:?}: {}", r.stderr);
        assert!(lines[0].starts_with(&format!("{bad}:3:")), "{}", r.stderr);
        assert!(lines[1].starts_with(&format!("{bad}:4:")), "{}", r.stderr);
        assert_eq!(
            lines[2], "vallumctl: INVALID_ARGUMENT (INVALID_RULESET): 2 errors",
            "{args:?}"
        );
    }
    // A reason equal to the code is said once.
    let r = run_at(&url, &[], &["export", "nosuch/1"]).await;
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.starts_with("vallumctl: NOT_FOUND: "),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("(NOT_FOUND)"), "{}", r.stderr);
    // JSON: the violations once each, and a headline that does not repeat them.
    let r = run_at(&url, &[], &["-o", "json", "apply", "web", &bad]).await;
    let e: serde_json::Value = serde_json::from_str(&r.stderr).unwrap();
    assert_eq!(e["violations"].as_array().map(Vec::len), Some(2), "{e}");
    assert_eq!(e["error"], "INVALID_ARGUMENT (INVALID_RULESET): 2 errors");
    assert_eq!(
        (&e["code"], &e["reason"]),
        (&"INVALID_ARGUMENT".into(), &"INVALID_RULESET".into())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirm_deadline_is_rfc3339_with_time_left() {
    let (_d, dir) = real().await;
    let url = _d.url();
    let good = write(dir.path(), "good.rules", GOOD);
    let r = run_at(
        &url,
        &[],
        &["apply", "web", &good, "--confirm-within", "60s"],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let line = r
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with("confirm "))
        .unwrap_or_else(|| panic!("no confirm line: {}", r.stdout));
    // `  confirm by 2030-03-17T17:46:40Z (in 1m) or it is rolled back: vallumctl confirm web/1`
    let rest = line.trim_start().strip_prefix("confirm by ").expect(line);
    let (at, rest) = rest.split_once(" (in ").expect(line);
    let (left, rest) = rest.split_once(')').expect(line);
    assert_eq!(
        rest, " or it is rolled back: vallumctl confirm web/1",
        "{line}"
    );
    let at: jiff::Timestamp = at.parse().unwrap_or_else(|e| panic!("{at}: {e}"));
    assert!(line.contains('Z'), "UTC: {line}");
    let left: jiff::SignedDuration = left.parse().unwrap_or_else(|e| panic!("{left}: {e}"));
    assert!(
        left > jiff::SignedDuration::ZERO && left <= jiff::SignedDuration::from_secs(60),
        "{line}"
    );
    // JSON carries the same instant, with its seconds.
    let r = run_at(
        &url,
        &[],
        &[
            "-o",
            "json",
            "apply",
            "web",
            &good,
            "--confirm-within",
            "60s",
        ],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    let d = &v["confirm_deadline"];
    let parsed: jiff::Timestamp = d["rfc3339"].as_str().unwrap().parse().unwrap();
    assert_eq!(Some(parsed.as_second()), d["seconds"].as_i64());
    assert!(parsed >= at, "{parsed} {at}");
}

/// `vallumctl update` changes the priority (a new revision while active), `--etag` guards it,
/// `--dry-run` changes nothing; `confirm` and `delete` take `--request-id` (a retry answers
/// as the first call did: exit 0, where a second confirm or delete alone is refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_priority_and_retried_confirm_and_delete() {
    let (_d, dir) = real().await;
    let url = _d.url();
    let good = write(dir.path(), "good.rules", GOOD);
    let r = run_at(
        &url,
        &[],
        &["apply", "web", &good, "--confirm-within", "1h"],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    for _ in 0..2 {
        let r = run_at(&url, &[], &["confirm", "web/1", "--request-id", "c-1"]).await;
        assert_eq!(r.code, 0, "a retry answers as the first call: {}", r.stderr);
    }
    let r = run_at(&url, &[], &["confirm", "web/1"]).await;
    assert_eq!(r.code, 1, "nothing pending: {}", r.stdout);
    let shown = |r: &Run| -> serde_json::Value {
        assert_eq!(r.code, 0, "{}", r.stderr);
        serde_json::from_str(&r.stdout).unwrap()
    };
    let dry = run_at(
        &url,
        &[],
        &[
            "-o",
            "json",
            "update",
            "web",
            "--priority",
            "-3",
            "--dry-run",
        ],
    )
    .await;
    let dry = shown(&dry);
    assert_eq!(
        (dry["priority"].as_i64(), dry["dry_run"].as_bool()),
        (Some(-3), Some(true))
    );
    assert_eq!(dry["latest_revision"].as_u64(), Some(1), "nothing changed");
    let r = run_at(
        &url,
        &[],
        &["update", "web", "--priority", "-3", "--etag", "stale"],
    )
    .await;
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("ETAG_MISMATCH"), "{}", r.stderr);
    let r = run_at(
        &url,
        &[],
        &["-o", "json", "update", "web", "--priority", "-3"],
    )
    .await;
    let v = shown(&r);
    assert_eq!(v["priority"].as_i64(), Some(-3));
    assert_eq!(
        (v["active_revision"].as_u64(), v["latest_revision"].as_u64()),
        (Some(2), Some(2))
    );
    let r = run_at(&url, &[], &["update", "web", "--priority", "4"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("etag "), "{}", r.stdout);
    for _ in 0..2 {
        let r = run_at(&url, &[], &["delete", "web", "--request-id", "d-1"]).await;
        assert_eq!(r.code, 0, "{}", r.stderr);
    }
    let r = run_at(&url, &[], &["delete", "web"]).await;
    assert_eq!(r.code, 1, "gone: {}", r.stdout);
}

/// As [`run_at`], with `stdin` written to the program's standard input.
async fn run_stdin(url: &str, env: &[(&str, &str)], args: &[&str], stdin: &str) -> Run {
    use tokio::io::AsyncWriteExt;
    let mut cmd = tokio::process::Command::new(support::vallumctl());
    cmd.args(args).env_clear().env("VALLUM_SERVER", url);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).await.unwrap();
    drop(input);
    let out = child.wait_with_output().await.unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

/// The revision numbers of `ruleset` (`vallumctl -o json revisions`); none when it does not
/// exist.
async fn revision_numbers(url: &str, env: &[(&str, &str)], ruleset: &str) -> Vec<u64> {
    let r = run_at(url, env, &["-o", "json", "revisions", ruleset]).await;
    if r.code != 0 {
        return Vec::new();
    }
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| r["number"].as_u64().unwrap())
        .collect()
}

/// `apply NAME -` reads the ruleset from standard input (`iptables-save | vallumctl apply host
/// -`), with errors located at `<stdin>:LINE:COL`; `--dry-run` runs Apply's checks and stores
/// nothing (exit 0 for a good file, 1 for a bad one), as does `stage --dry-run`, and `commit
/// --dry-run` commits nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_reads_stdin_and_dry_run_changes_nothing() {
    let (d, dir) = real().await;
    let url = d.url();
    let r = run_stdin(&url, &[], &["apply", "web", "-"], GOOD).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stdout.starts_with("committed rulesets/web/revisions/1"),
        "{}",
        r.stdout
    );
    let export = run_at(&url, &[], &["export", "web/1"]).await;
    assert!(
        export.stdout.contains("--dport 22 -j ACCEPT"),
        "{}",
        export.stdout
    );
    // A bad line from stdin is located in `<stdin>`.
    let bad = "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -p tcp --dport x -j ACCEPT\nCOMMIT\n";
    let r = run_stdin(&url, &[], &["apply", "web", "-"], bad).await;
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stderr.starts_with("<stdin>:3:"), "{}", r.stderr);
    // validate reads stdin too.
    let r = run_stdin(&url, &[], &["validate", "-"], GOOD).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("<stdin>: valid, 2 rules"), "{}", r.stdout);

    // --dry-run: checked, nothing stored or committed.
    let v2 = write(dir.path(), "v2.rules", &GOOD.replace("22", "2222"));
    let r = run_at(&url, &[], &["apply", "web", &v2, "--dry-run"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.starts_with("dry run: "), "{}", r.stdout);
    assert!(
        r.stdout.contains("nothing was stored or committed"),
        "{}",
        r.stdout
    );
    let r = run_at(&url, &[], &["-o", "json", "apply", "web", &v2, "--dry-run"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let j: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(j["dry_run"], true, "{j}");
    let r = run_at(&url, &[], &["apply", "new", &v2, "--dry-run"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = run_at(&url, &[], &["stage", "web", &v2, "--dry-run"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.starts_with("dry run: "), "{}", r.stdout);
    assert_eq!(revision_numbers(&url, &[], "web").await, [1]);
    assert_eq!(revision_numbers(&url, &[], "new").await, Vec::<u64>::new());
    let export = run_at(&url, &[], &["export", "web/1"]).await;
    assert!(!export.stdout.contains("2222"), "{}", export.stdout);
    // A dry run of a bad ruleset fails as the real Apply would, with the same locations.
    let bad_file = write(dir.path(), "bad.rules", bad);
    let r = run_at(&url, &[], &["apply", "web", &bad_file, "--dry-run"]).await;
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stderr.contains("bad.rules:3:"), "{}", r.stderr);
    // commit --dry-run of a staged revision leaves it staged.
    let r = run_at(&url, &[], &["stage", "web", &v2]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = run_at(&url, &[], &["commit", "web/2", "--dry-run"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("would be committed"), "{}", r.stdout);
    let r = run_at(&url, &[], &["-o", "json", "revisions", "web"]).await;
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v[1]["state"], "staged", "{v}");
}

/// `--token-file` sends the file's token (nothing on the command line for `ps` to show);
/// `revisions` lists each revision's RFC 3339 create time and author (the token's name).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_file_and_revisions_with_time_and_author() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = write(
        dir.path(),
        "tokens",
        "admin s3cret-admin-token-0123456789 alice\n",
    );
    let d = support::Daemon::start(&dir.path().join("v.db"), &["--token-file", &tokens]);
    d.wait_serving().await;
    let url = d.url();
    let good = write(dir.path(), "good.rules", GOOD);
    let mine = write(dir.path(), "my-token", "s3cret-admin-token-0123456789\n");
    // Without a token: refused.
    let r = run_at(&url, &[], &["apply", "web", &good]).await;
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stderr.contains("TOKEN_MISSING"), "{}", r.stderr);
    assert!(r.stderr.contains("--token-file"), "{}", r.stderr);
    let r = run_at(
        &url,
        &[],
        &["--token-file", &mine, "apply", "web", &good, "-m", "first"],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = run_at(
        &url,
        &[("VALLUM_TOKEN_FILE", &mine)],
        &["apply", "web", &good],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    // A missing or empty token file is the client's error; no call is made.
    let r = run_at(&url, &[], &["--token-file", "/nonexistent/token", "status"]).await;
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stderr.contains("/nonexistent/token"), "{}", r.stderr);
    let empty = write(dir.path(), "empty-token", "\n");
    let r = run_at(&url, &[], &["--token-file", &empty, "status"]).await;
    assert_eq!(r.code, 2, "{}", r.stderr);
    // --token and --token-file together: a usage error.
    let r = run_at(
        &url,
        &[],
        &["--token", "x", "--token-file", &mine, "status"],
    )
    .await;
    assert_eq!(r.code, 2, "{}", r.stderr);

    let r = run_at(&url, &[], &["--token-file", &mine, "revisions", "web"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "a header and two revisions: {}", r.stdout);
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(
        header,
        [
            "REVISION", "STATE", "RULES", "CREATED", "AUTHOR", "DIGEST", "MESSAGE"
        ],
        "{}",
        r.stdout
    );
    let first: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(first[0], "rulesets/web/revisions/1", "{}", r.stdout);
    assert_eq!(first[2], "2", "rules: {}", r.stdout);
    let created: jiff::Timestamp = first[3]
        .parse()
        .unwrap_or_else(|e| panic!("{}: {e}", first[3]));
    assert!(first[3].ends_with('Z'), "UTC: {}", r.stdout);
    let age = jiff::Timestamp::now().duration_since(created);
    assert!(
        age.abs() < jiff::SignedDuration::from_secs(3600),
        "{}",
        r.stdout
    );
    assert_eq!(first[4], "alice", "{}", r.stdout);
    assert_eq!(first.last(), Some(&"first"), "{}", r.stdout);
    let r = run_at(
        &url,
        &[],
        &["--token-file", &mine, "-o", "json", "revisions", "web"],
    )
    .await;
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v[0]["author"], "alice", "{v}");
    assert_eq!(v[0]["create_time"]["rfc3339"], first[3], "{v}");
}

/// The names of the exit-code table rows in `doc` (README.md or docs/operations.md): for each
/// `| N | ...` line, the backticked UPPER_SNAKE names in it.
fn exit_table(doc: &str) -> (Vec<String>, std::collections::BTreeMap<u8, Vec<String>>) {
    let mut rows = Vec::new();
    let mut names = std::collections::BTreeMap::new();
    for line in doc.lines() {
        let Some(rest) = line.strip_prefix("| ") else {
            continue;
        };
        let Some((n, _)) = rest.split_once(" |") else {
            continue;
        };
        let Ok(n) = n.parse::<u8>() else { continue };
        rows.push(line.to_owned());
        let found: Vec<String> = line
            .split('`')
            .skip(1)
            .step_by(2)
            .filter(|w| w.len() > 1 && w.bytes().all(|b| b.is_ascii_uppercase() || b == b'_'))
            .map(str::to_owned)
            .collect();
        names.insert(n, found);
    }
    (rows, names)
}

#[test]
fn documented_exit_codes_are_the_code_table() {
    use vallum_server::Reason;
    use vallum_server::error::ClientReason;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let ops = std::fs::read_to_string(root.join("docs/operations.md")).unwrap();
    let (rows, names) = exit_table(&readme);
    let (ops_rows, _) = exit_table(&ops);
    assert_eq!(
        rows, ops_rows,
        "README.md and docs/operations.md tables differ"
    );
    assert_eq!(names.keys().copied().collect::<Vec<_>>(), [0, 1, 2, 3]);
    let mut table: Vec<(&str, u8)> = Reason::ALL
        .iter()
        .map(|r| (r.info().name, r.info().exit_code))
        .collect();
    table.extend(
        ClientReason::ALL
            .iter()
            .map(|c| (c.info().name, c.info().exit_code)),
    );
    for (code, listed) in &names {
        let mut want: Vec<&str> = table
            .iter()
            .filter(|(_, e)| e == code)
            .map(|(n, _)| *n)
            .collect();
        let mut listed: Vec<&str> = listed.iter().map(String::as_str).collect();
        want.sort_unstable();
        listed.sort_unstable();
        if *code == 1 {
            // Exit 1 is "every other reason": the names listed must be of that class.
            assert!(
                listed.iter().all(|n| want.contains(n)),
                "exit 1 lists {listed:?}"
            );
        } else {
            assert_eq!(listed, want, "the names documented for exit {code}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_to_a_tls_server_says_use_https() {
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let cert = write(dir.path(), "server.pem", &key.cert.pem());
    let pkey = write(dir.path(), "server.key", &key.signing_key.serialize_pem());
    let d = support::Daemon::start(
        &dir.path().join("v.db"),
        &["--tls-cert", &cert, "--tls-key", &pkey],
    );
    let url = d.url();
    // Whether the server's alert reaches our h2 or the write breaks first is a race: both
    // must say the same.
    for _ in 0..3 {
        let r = run_at(&url, &[], &["status"]).await;
        assert_eq!(r.code, 3, "{}", r.stderr);
        assert_eq!(
            r.stderr,
            format!(
                "vallumctl: cannot connect to {url}: the server speaks TLS; use {}\n",
                url.replace("http://", "https://")
            )
        );
    }
}

/// Exit codes decided by the command line or the file alone, whether the server is up or not:
/// a malformed revision name is a usage error (2) before any call; a file over
/// `--max-file-bytes` is refused by its size (1) before it is read (the child's peak memory
/// stays far below the file's 300 MB), and standard input once one byte past the limit came.
/// And `--server` pointed at vallumd's metrics port (HTTP, not gRPC) exits 3 with a hint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_and_size_are_decided_before_any_call() {
    let (d, dir) = real().await;
    let up = d.url();
    let (_held, down) = closed_port();
    let down = format!("http://{down}");
    for url in [&up, &down] {
        for args in [
            &["commit", "web"][..],
            &["rollback", "web/x"],
            &["diff", "web/1", "web"],
            &[
                "trace",
                "--src",
                "10.0.0.1",
                "--dst",
                "10.0.0.2",
                "--revision",
                "a/b/1",
            ],
        ] {
            let r = run_at(url, &[], args).await;
            assert_eq!(r.code, 2, "{url} {args:?}: {}", r.stderr);
            assert!(r.stderr.contains("is not a revision"), "{}", r.stderr);
        }
    }

    // 300 MB (sparse): refused by its size, unread.
    let big = dir.path().join("big.rules");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(300 << 20)
        .unwrap();
    for url in [&up, &down] {
        let child = std::process::Command::new(support::vallumctl())
            .args(["apply", "web"])
            .arg(&big)
            .env_clear()
            .env("VALLUM_SERVER", url)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let (code, stderr, max_rss_kib) = wait_with_rusage(child);
        assert_eq!(code, 1, "{stderr}");
        assert!(
            stderr.contains("314572800 bytes, more than --max-file-bytes (67108864 bytes)"),
            "{stderr}"
        );
        assert!(
            max_rss_kib < 100 << 10,
            "peak RSS {max_rss_kib} KiB: the file was read"
        );
    }
    // Standard input over a lowered limit; within it, the call is made.
    let mut child = tokio::process::Command::new(support::vallumctl())
        .args(["--max-file-bytes", "100", "apply", "web", "-"])
        .env_clear()
        .env("VALLUM_SERVER", &up)
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use tokio::io::AsyncWriteExt;
        let mut stdin = child.stdin.take().unwrap();
        // The child stops reading past the limit: a refused write is the expected end.
        let _ = stdin.write_all(&[b'#'; 4096]).await;
    }
    let out = child.wait_with_output().await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("<stdin>: it holds more than --max-file-bytes (100 bytes)"),
        "{stderr}"
    );
    let good = write(dir.path(), "good.rules", GOOD);
    let r = run_at(
        &up,
        &[("VALLUM_MAX_FILE_BYTES", "4096")],
        &["apply", "web", &good],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.stderr);

    // The metrics port answers HTTP, not gRPC: unavailable, with what to use instead.
    let metrics = format!("http://{}", d.metrics_addr);
    let r = run_at(&metrics, &[], &["status"]).await;
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert!(
        r.stderr.contains("not vallumd's gRPC port") && r.stderr.contains("--listen"),
        "{}",
        r.stderr
    );
    let r = run_at(&metrics, &[], &["-o", "json", "rulesets"]).await;
    let e: serde_json::Value = serde_json::from_str(&r.stderr).unwrap();
    assert_eq!(
        (r.code, &e["reason"]),
        (3, &"UNREACHABLE".into()),
        "{}",
        r.stderr
    );
}

/// Waits for `child` with wait4(2): its exit code, stderr and peak resident memory (KiB).
fn wait_with_rusage(mut child: std::process::Child) -> (i32, String, i64) {
    use std::io::Read;
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let pid = libc::pid_t::try_from(child.id()).unwrap();
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value of the plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4 on our own child, not waited for yet; `status` and `usage` are live
    // out-parameters of the right types.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(r, pid, "wait4: {}", std::io::Error::last_os_error());
    (libc::WEXITSTATUS(status), stderr, usage.ru_maxrss)
}

/// `vallumctl --wait` waits for a vallumd that is not there yet and then answers; without
/// `--wait` the same call fails at once (3), and `--wait=DURATION` gives up after that long
/// (3). On a unix socket (no port another process could take in between): the test first
/// holds the socket path itself and accepts vallumctl's connection, which proves vallumctl is
/// waiting before vallumd exists; it closes that connection (a server that went away) and only
/// then starts vallumd on the path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_waits_for_vallumd_to_start_and_load() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("v.sock");
    let url = format!("unix:{}", sock.display());
    let r = run_at(&url, &[], &["status"]).await;
    assert_eq!(r.code, 3, "{}", r.stderr);
    let r = run_at(&url, &[], &["--wait=300ms", "status"]).await;
    assert_eq!(r.code, 3, "{}", r.stderr);
    let waiting = tokio::process::Command::new(support::vallumctl())
        .args(["--wait", "-o", "json", "status"])
        .env_clear()
        .env("VALLUM_SERVER", &url)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let held = sock.clone();
    tokio::task::spawn_blocking(move || {
        let l = std::os::unix::net::UnixListener::bind(&held).unwrap();
        let (conn, _) = l.accept().unwrap();
        drop(conn);
        drop(l);
        std::fs::remove_file(&held).unwrap();
    })
    .await
    .unwrap();
    let sock_arg = sock.display().to_string();
    let d = support::Daemon::start(&dir.path().join("v.db"), &["--socket", &sock_arg]);
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(120),
        waiting.wait_with_output(),
    )
    .await
    .expect("vallumctl --wait returned once vallumd served")
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        st["cores"].as_array().is_some_and(|c| !c.is_empty()),
        "{st}"
    );
    drop(d);
}

/// A loopback port where nothing listens, for as long as the socket returned lives: bound
/// and never listening, so a connection is refused, and held, so that no other process (the
/// tests of other binaries run at the same time) can take the port and answer, and no
/// outgoing connection gets it as its source port (a TCP self-connect to a freed port).
fn closed_port() -> (tokio::net::TcpSocket, std::net::SocketAddr) {
    let s = tokio::net::TcpSocket::new_v4().expect("socket");
    s.bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
    let addr = s.local_addr().expect("local addr");
    (s, addr)
}
