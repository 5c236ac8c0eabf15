use super::*;
use tonic::Code;

const ADMIN: &str = "admin-token-0123456789";
const READER: &str = "reader-token-0123456789";

fn layer() -> AuthLayer {
    let mut set = TokenSet::new();
    set.add_text(
        &format!("# comment\n\nadmin {ADMIN} alice\nread-only {READER}\n"),
        None,
        "tokens",
    )
    .unwrap();
    AuthLayer::new(set)
}

#[test]
fn classifies_methods() {
    for m in [
        "/vallum.v1.RulesetService/StageRevision",
        "/vallum.v1.RulesetService/CommitRevision",
        "/vallum.v1.RulesetService/ConfirmCommit",
        "/vallum.v1.RulesetService/Apply",
        "/vallum.v1.RulesetService/Rollback",
        "/vallum.v1.RulesetService/DeleteRuleset",
        "/vallum.v1.CounterService/ZeroCounters",
        "/vallum.v1.ConntrackService/Delete",
        "/vallum.v1.ConntrackService/Flush",
        "/vallum.v1.RulesetService/SomethingNew",
        "/other.Service/GetX",
    ] {
        assert_eq!(classify(m), Access::Admin, "{m}");
    }
    for m in [
        "/vallum.v1.RulesetService/ValidateRuleset",
        "/vallum.v1.RulesetService/ListRevisions",
        "/vallum.v1.RulesetService/WatchCommits",
        "/vallum.v1.TraceService/ReplayCapture",
        "/vallum.v1.EngineService/GetStatus",
        "/vallum.v1.CounterService/GetCounters",
        "/vallum.v1.ConntrackService/List",
        "/vallum.v1.ConntrackService/GetStats",
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    ] {
        assert_eq!(classify(m), Access::Read, "{m}");
    }
    for m in [
        "/grpc.health.v1.Health/Check",
        "/grpc.health.v1.Health/Watch",
    ] {
        assert_eq!(classify(m), Access::Public, "{m}");
    }
    // FleetService: reads are reads (the README's fleet demo reads over TCP without
    // tokens), writes are admin.
    for m in [
        "GetRuleset",
        "ListRulesets",
        "GetRolloutStatus",
        "WaitRollout",
        "ListNodes",
    ] {
        let path = format!("/vallum.v1.FleetService/{m}");
        assert_eq!(classify(&path), Access::Read, "{path}");
    }
    for m in ["PutRuleset", "DeleteRuleset"] {
        let path = format!("/vallum.v1.FleetService/{m}");
        assert_eq!(classify(&path), Access::Admin, "{path}");
    }
}

/// Every method of every `vallum.v1` service is in one of the two tables: a method the
/// tables miss is admin by default, so a read left out is refused to read-only callers
/// with a message calling it a change (as FleetService's reads were).
#[test]
fn every_api_method_is_classified_explicitly() {
    use prost::Message;
    let set = prost_types::FileDescriptorSet::decode(vallum_proto::FILE_DESCRIPTOR_SET)
        .expect("the descriptor set decodes");
    let mut seen = 0;
    for file in set.file.iter().filter(|f| f.package() == "vallum.v1") {
        for service in &file.service {
            for method in &service.method {
                let short = format!("{}/{}", service.name(), method.name());
                assert!(
                    READ_METHODS.contains(&short.as_str())
                        || ADMIN_METHODS.contains(&short.as_str()),
                    "{short} is in neither READ_METHODS nor ADMIN_METHODS"
                );
                assert!(
                    known_method(&format!("/vallum.v1.{short}")).is_some(),
                    "{short}: known_method has no service name for it"
                );
                seen += 1;
            }
        }
    }
    assert!(seen >= 40, "{seen} methods");
}

fn reason(s: &Status) -> String {
    s.get_details_error_info()
        .map(|i| i.reason)
        .unwrap_or_default()
}

#[test]
fn checks_tokens_and_roles() {
    let l = layer();
    let apply = "/vallum.v1.RulesetService/Apply";
    let get = "/vallum.v1.RulesetService/GetRuleset";

    let e = l.check(apply, None).unwrap_err();
    assert_eq!(
        (e.code(), reason(&e).as_str()),
        (Code::Unauthenticated, "TOKEN_MISSING")
    );
    assert!(e.message().contains("--token-file"), "{e:?}");
    let e = l.check(apply, Some(b"Basic abc")).unwrap_err();
    assert_eq!(reason(&e), "TOKEN_MISSING");
    let e = l
        .check(apply, Some(b"Bearer nope-nope-nope-nope"))
        .unwrap_err();
    assert_eq!(
        (e.code(), reason(&e).as_str()),
        (Code::Unauthenticated, "TOKEN_INVALID")
    );

    let r = format!("Bearer {READER}");
    let c = l.check(get, Some(r.as_bytes())).unwrap();
    assert_eq!(c.role, Role::ReadOnly);
    assert_eq!(&*c.name, "read-only@tokens:4");
    let e = l.check(apply, Some(r.as_bytes())).unwrap_err();
    assert_eq!(
        (e.code(), reason(&e).as_str()),
        (Code::PermissionDenied, "ADMIN_REQUIRED")
    );

    let a = format!("bearer  {ADMIN} ");
    let c = l.check(apply, Some(a.as_bytes())).unwrap();
    assert_eq!((&*c.name, c.role), ("alice", Role::Admin));
}

#[test]
fn known_methods() {
    assert_eq!(
        known_method("/vallum.v1.RulesetService/Apply"),
        Some(("vallum.v1.RulesetService", "Apply"))
    );
    assert_eq!(
        known_method("/grpc.health.v1.Health/Check"),
        Some(("grpc.health.v1.Health", "Check"))
    );
    assert_eq!(known_method("/vallum.v1.RulesetService/Nope"), None);
    assert_eq!(known_method("/x"), None);
}

#[test]
fn no_tokens_means_anonymous_reader_unless_insecure() {
    let (apply, get) = (
        "/vallum.v1.RulesetService/Apply",
        "/vallum.v1.RulesetService/GetRuleset",
    );
    let l = AuthLayer::new(TokenSet::new());
    let e = l.check(apply, None).unwrap_err();
    assert_eq!(
        (e.code(), reason(&e).as_str()),
        (Code::PermissionDenied, "ANONYMOUS_READ_ONLY")
    );
    assert!(
        e.message().contains("--insecure-no-auth"),
        "{}",
        e.message()
    );
    assert_eq!(l.check(get, None).unwrap(), Caller::anonymous_reader());
    let l = AuthLayer::with_policy(
        TokenSet::new(),
        LocalPolicy {
            anonymous_tcp_admin: true,
            ..LocalPolicy::default()
        },
    );
    assert_eq!(l.check(apply, None).unwrap(), Caller::anonymous());
}

/// A fake `/proc` with one process per (pid, euid, CapEff, Groups).
fn fake_proc(procs: &[(i32, u32, &str, &str)]) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for (pid, uid, cap, groups) in procs {
        let dir = d.path().join(pid.to_string());
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(
            dir.join("status"),
            format!(
                "Name:\tx\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t100\t100\t100\t100\n\
                     Groups:\t{groups}\nCapInh:\t0000000000000000\nCapEff:\t{cap}\n"
            ),
        )
        .unwrap();
    }
    d
}

#[test]
fn local_peers_by_credentials() {
    let proc_dir = fake_proc(&[
        (10, 1000, "0000000000000000", "100 27"),
        (11, 1001, "0000000000001000", ""),
        (12, 1002, "0000000000001000", ""),
    ]);
    let policy = LocalPolicy {
        own_uid: 999,
        group: Some(27),
        anonymous_tcp_admin: false,
        proc_root: proc_dir.path().to_owned(),
    };
    let l = AuthLayer::with_policy(TokenSet::new(), policy.clone());
    let (apply, get) = (
        "/vallum.v1.RulesetService/Apply",
        "/vallum.v1.RulesetService/GetRuleset",
    );
    let peer = |uid, gid, pid| LocalPeer {
        uid,
        gid,
        pid: Some(pid),
    };
    // root, vallumd's own user, the group (primary, or supplementary per /proc), CAP_NET_ADMIN.
    for (p, name) in [
        (peer(0, 0, 1), "local:uid=0,pid=1"),
        (peer(999, 5, 2), "local:uid=999,pid=2,owner"),
        (peer(4242, 27, 3), "local:uid=4242,pid=3,gid=27"),
        (peer(1000, 100, 10), "local:uid=1000,pid=10,gid=27"),
        (peer(1001, 100, 11), "local:uid=1001,pid=11,cap=net_admin"),
    ] {
        let c = l.check_local(apply, None, Some(&p)).unwrap();
        assert_eq!((&*c.name, c.role), (name, Role::Admin), "{p:?}");
    }
    // Anyone else reads, and is told what a change needs.
    let nobody = peer(65534, 65534, 99);
    let c = l.check_local(get, None, Some(&nobody)).unwrap();
    assert_eq!(
        (&*c.name, c.role),
        ("local:uid=65534,pid=99", Role::ReadOnly)
    );
    let e = l.check_local(apply, None, Some(&nobody)).unwrap_err();
    assert_eq!(
        (e.code(), reason(&e).as_str()),
        (Code::PermissionDenied, "LOCAL_ADMIN_REQUIRED")
    );
    for want in [
        "CAP_NET_ADMIN",
        "uid 0",
        "--socket-group (gid 27)",
        "local:uid=65534,pid=99",
    ] {
        assert!(e.message().contains(want), "{want}: {}", e.message());
    }
    // /proc of a pid now held by another user grants nothing; no credentials, nothing.
    assert!(
        l.check_local(apply, None, Some(&peer(1003, 100, 12)))
            .is_err()
    );
    assert!(l.check_local(apply, None, None).is_err());
    assert!(l.check_local(get, None, None).is_ok());
    // A token through the socket is decided by the token.
    let mut set = TokenSet::new();
    set.add_text(&format!("read-only {READER}\n"), None, "t")
        .unwrap();
    let l = AuthLayer::with_policy(set, policy);
    let r = format!("Bearer {READER}");
    let e = l
        .check_local(apply, Some(r.as_bytes()), Some(&peer(0, 0, 1)))
        .unwrap_err();
    assert_eq!(reason(&e), "ADMIN_REQUIRED");
    assert_eq!(
        l.check_local(apply, None, Some(&peer(0, 0, 1)))
            .unwrap()
            .role,
        Role::Admin
    );
}

#[test]
fn groups_resolve() {
    assert_eq!(resolve_group("27").unwrap(), 27);
    assert_eq!(resolve_group("root").unwrap(), 0);
    let e = resolve_group("no-such-group-vallum").unwrap_err();
    assert_eq!(e.reason(), "SOCKET_GROUP_UNKNOWN");
}

#[test]
fn token_file_errors() {
    let mut s = TokenSet::new();
    let e = s
        .add_text("boss abcdefabcdefabcdef", None, "f")
        .unwrap_err();
    assert!(
        e.to_string().starts_with("f:1: field 1 (ROLE) is not"),
        "{e}"
    );
    assert!(!e.to_string().contains("boss"), "a field value shown: {e}");
    let e = s.add_text("short", Some(Role::Admin), "f").unwrap_err();
    assert!(e.to_string().contains("shorter than 16"), "{e}");
    assert!(!e.to_string().contains("short "), "token leaked: {e}");
    let e = s
        .add_text(&format!("{ADMIN}\n{ADMIN} again\n"), Some(Role::Admin), "f")
        .unwrap_err();
    assert_eq!(e.to_string(), "f:2: duplicate token (also named admin@f:1)");
    assert_eq!(e.reason(), "TOKEN_DUPLICATE");
}

/// Scope words after NAME (or in its place); a line without them is unscoped, as before.
#[test]
fn token_lines_with_scopes() {
    let mut s = TokenSet::new();
    s.add_text(
        &format!(
            "admin {ADMIN} alice\nadmin admin-token-scoped-0001 ci rulesets=a,team-b-* \
                 ops=sets,apply min-priority=-5\nadmin admin-token-scoped-0002 ops=conntrack\n\
                 admin admin-token-named-eq-0003 a=b\n"
        ),
        None,
        "f",
    )
    .unwrap();
    let alice = s.authenticate(ADMIN.as_bytes()).unwrap();
    assert_eq!((&*alice.name, &alice.scope), ("alice", &None));
    assert_eq!(alice.audit_name(), "alice");
    let ci = s.authenticate(b"admin-token-scoped-0001").unwrap();
    let scope = ci.scope.as_deref().unwrap();
    assert_eq!(scope.names, ["a", "team-b-*"]);
    assert_eq!(scope.ops, [Op::Apply, Op::Sets]);
    assert_eq!(scope.min_priority, Some(-5));
    assert_eq!(
        ci.audit_name(),
        "ci [rulesets=a,team-b-* ops=apply,sets min-priority=-5]"
    );
    assert!(scope.covers("a") && scope.covers("team-b-web") && !scope.covers("ab"));
    // No NAME: the default name; no rulesets=: any name.
    let ct = s.authenticate(b"admin-token-scoped-0002").unwrap();
    assert_eq!(&*ct.name, "admin@f:3");
    assert_eq!(ct.audit_name(), "admin@f:3 [ops=conntrack]");
    // A NAME with `=` that is no scope key stays a name.
    let named = s.authenticate(b"admin-token-named-eq-0003").unwrap();
    assert_eq!((&*named.name, &named.scope), ("a=b", &None));

    for (line, expect) in [
        (
            "admin admin-token-bad-00001 n ops=flush",
            "f:1: ops=\"flush\": not one of",
        ),
        (
            "admin admin-token-bad-00001 n rulesets=a*b",
            "f:1: rulesets=\"a*b\"",
        ),
        (
            "admin admin-token-bad-00001 n rulesets=",
            "f:1: rulesets=\"\"",
        ),
        (
            "admin admin-token-bad-00001 n min-priority=x",
            "f:1: min-priority=\"x\"",
        ),
        (
            "admin admin-token-bad-00001 n ops=apply secret=x",
            "f:1: unknown scope key",
        ),
        (
            "admin admin-token-bad-00001 n ops=apply word",
            "f:1: trailing words",
        ),
    ] {
        let e = TokenSet::new().add_text(line, None, "f").unwrap_err();
        assert!(e.to_string().starts_with(expect), "{line}: {e}");
        assert!(!e.to_string().contains("secret"), "{e}");
    }
}

#[test]
fn grants_check_op_name_and_priority() {
    let grant = |scope: Option<Scope>| Grant {
        caller: scope.map(|s| (Arc::from("ci"), Arc::new(s))),
    };
    let scoped = grant(Some(Scope {
        names: vec!["team-a-*".into()],
        ops: vec![Op::Apply],
        min_priority: Some(100),
    }));
    let missing = |r: Result<(), Error>| match r {
        Ok(()) => String::new(),
        Err(Error::ScopeDenied { missing, .. }) => missing,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(
        missing(scoped.check("x", Op::Apply, Some("team-a-1"), Some(100))),
        ""
    );
    assert_eq!(
        missing(scoped.check("x", Op::Apply, Some("team-a-1"), Some(99))),
        "min-priority<=99"
    );
    assert_eq!(
        missing(scoped.check("x", Op::Apply, Some("team-b"), None)),
        "rulesets=team-b"
    );
    assert_eq!(
        missing(scoped.check("x", Op::Apply, None, None)),
        "rulesets=*"
    );
    assert_eq!(
        missing(scoped.check("x", Op::Sets, Some("team-a-1"), None)),
        "ops=sets"
    );
    let e = scoped
        .check(
            "DeleteRuleset rulesets/team-b",
            Op::Apply,
            Some("team-b"),
            None,
        )
        .unwrap_err();
    assert_eq!(e.reason(), Reason::ScopeDenied);
    assert_eq!(
        e.to_string(),
        "ci may not DeleteRuleset rulesets/team-b: its scope (rulesets=team-a-* \
             ops=apply min-priority=100) lacks rulesets=team-b"
    );
    let status = Status::from(e);
    assert_eq!(status.code(), tonic::Code::PermissionDenied);
    let info = status.get_details_error_info().unwrap();
    assert_eq!(info.reason, "SCOPE_DENIED");
    assert_eq!(info.metadata["scope"], "rulesets=team-b");
    // Unscoped (or no auth layer): everything.
    assert!(
        grant(None)
            .check("x", Op::Conntrack, None, Some(-1))
            .is_ok()
    );
}

/// A line in the wrong format never shows its words: not a token written where the role
/// goes, not a token missing its role, not the words after a name.
#[test]
fn token_file_errors_never_show_a_token() {
    let secret = "07d1c24b9f6a4e1d8c3b2a1f0e9d8c7b";
    for (text, role, expect) in [
        (format!("{secret} admin\n"), None, "f:1: field 1 (ROLE)"),
        (format!("# c\n\n{secret}\n"), None, "f:3: field 1 (ROLE)"),
        (
            format!("admin {secret} n {secret}"),
            None,
            "f:1: trailing words",
        ),
        (
            format!("{secret} n {secret}"),
            Some(Role::Admin),
            "f:1: trailing words",
        ),
        (
            format!("admin {secret}é"),
            None,
            "f:1: field 2 (TOKEN): token must be",
        ),
        (
            secret[..10].to_owned(),
            Some(Role::Admin),
            "f:1: field 1 (TOKEN)",
        ),
        (
            "read-only".to_owned(),
            None,
            "f:1: field 2 (TOKEN) is missing",
        ),
    ] {
        let e = TokenSet::new().add_text(&text, role, "f").unwrap_err();
        let shown = format!("{e} {e:?}");
        assert!(shown.starts_with(expect), "{text:?}: {shown}");
        assert!(!shown.contains(&secret[..10]), "token leaked: {shown}");
        assert_eq!(e.reason(), "TOKEN_FILE_INVALID");
    }
}

/// A token file that holds no token (empty, blank lines or comments only: a secret mount
/// that came up empty) refuses to start; it used to turn authentication off.
/// A reload swaps the whole set for later checks, or, when a file does not load (bad
/// line, empty) or auth would turn off, keeps the set in use.
#[test]
fn a_reload_is_all_or_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens");
    let (old, new) = ("old-token-0123456789abcdef", "new-token-0123456789abcdef");
    std::fs::write(&path, format!("admin {old} ci\n")).unwrap();
    let config = AuthConfig {
        token_file: Some(path.clone()),
        ..AuthConfig::default()
    };
    let layer = AuthLayer::new(config.load().unwrap());
    let reloader = layer.reloader();
    let path_ok = |token: &str| {
        let h = format!("Bearer {token}");
        layer
            .check("/vallum.v1.RulesetService/Apply", Some(h.as_bytes()))
            .is_ok()
    };
    assert!(path_ok(old) && !path_ok(new));
    std::fs::write(&path, format!("admin {old} ci\nadmin {new} ci2\n")).unwrap();
    assert_eq!(reloader.reload(&config).unwrap(), 2);
    assert!(path_ok(old) && path_ok(new));
    for bad in [format!("admin {new} ci2\nbogus\n"), "# none\n".to_string()] {
        std::fs::write(&path, bad).unwrap();
        assert!(reloader.reload(&config).is_err());
        assert!(path_ok(old) && path_ok(new), "kept");
    }
    std::fs::remove_file(&path).unwrap();
    assert!(matches!(
        reloader.reload(&config),
        Err(AuthError::Read { .. })
    ));
    let off = AuthConfig::default();
    assert!(matches!(
        reloader.reload(&off),
        Err(AuthError::ReloadChangesMode)
    ));
    assert!(path_ok(old), "auth stays on");
    std::fs::write(&path, format!("admin {new} ci2\n")).unwrap();
    assert_eq!(reloader.reload(&config).unwrap(), 1);
    assert!(!path_ok(old) && path_ok(new));
}

#[test]
fn a_token_file_without_tokens_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    for text in ["", "\n\n", "# admin 0123456789abcdef0123\n"] {
        let path = dir.path().join("tokens");
        std::fs::write(&path, text).unwrap();
        for cfg in [
            AuthConfig {
                token_file: Some(path.clone()),
                ..AuthConfig::default()
            },
            AuthConfig {
                admin_token_file: Some(path.clone()),
                ..AuthConfig::default()
            },
            AuthConfig {
                reader_token_file: Some(path.clone()),
                ..AuthConfig::default()
            },
        ] {
            let e = cfg.load().unwrap_err();
            assert_eq!(e.reason(), "TOKEN_FILE_EMPTY", "{text:?}: {e}");
            assert!(e.to_string().contains("holds no token"), "{e}");
        }
    }
}

#[test]
fn refuses_open_listener_without_tokens() {
    let cfg = AuthConfig::default();
    let empty = TokenSet::new();
    assert!(
        cfg.check_listen(&empty, "127.0.0.1:1".parse().unwrap())
            .is_ok()
    );
    assert!(
        cfg.check_listen(&empty, "0.0.0.0:1".parse().unwrap())
            .is_err()
    );
    let cfg = AuthConfig {
        insecure_no_auth: true,
        ..AuthConfig::default()
    };
    assert!(
        cfg.check_listen(&empty, "0.0.0.0:1".parse().unwrap())
            .is_ok()
    );
}
