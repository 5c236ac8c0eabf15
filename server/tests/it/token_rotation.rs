//! Token rotation without downtime (docs/operations.md "Rotating a token"), against a real
//! `vallumd`: add the new token to the file and send SIGHUP, move the client over, remove the
//! old token and send SIGHUP again; vallumd keeps serving through a reload of a bad edit.
//! The server is never restarted.

use crate::support;

use std::time::Duration;

use support::{Daemon, poll, reason};
use vallum_proto::v1 as pb;
use vallum_proto::v1::engine_service_client::EngineServiceClient;

const OLD: &str = "old-token-0123456789abcdef";
const NEW: &str = "new-token-0123456789abcdef";

/// The answer to GetStatus with `token`: `Ok` or the ErrorInfo reason.
async fn status_with(d: &Daemon, token: &str) -> Result<(), String> {
    let mut c = EngineServiceClient::new(d.channel().await);
    let mut r = tonic::Request::new(pb::GetStatusRequest {});
    r.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    c.get_status(r).await.map(drop).map_err(|e| reason(&e))
}

fn hangup(d: &Daemon) {
    let pid = libc::pid_t::try_from(d.pid()).expect("a pid");
    // SAFETY: kill(2) on our own child's pid; it has not been waited for (Daemon waits only
    // on drop), so the pid is still ours.
    let rc = unsafe { libc::kill(pid, libc::SIGHUP) };
    assert_eq!(rc, 0, "kill -HUP");
}

#[tokio::test]
async fn sighup_reloads_the_token_file_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens");
    std::fs::write(&file, format!("admin {OLD} ci\n")).unwrap();
    let file_arg = file.to_str().unwrap();
    let d = Daemon::start(&dir.path().join("v.db"), &["--token-file", file_arg]);
    d.wait_serving().await;
    assert_eq!(status_with(&d, OLD).await, Ok(()));
    assert_eq!(status_with(&d, NEW).await, Err("TOKEN_INVALID".into()));

    // 1. Add the new token next to the old one; both work after the reload.
    std::fs::write(&file, format!("admin {OLD} ci\nadmin {NEW} ci-next\n")).unwrap();
    hangup(&d);
    poll(
        "the new token is accepted",
        400,
        Duration::from_millis(25),
        || async { status_with(&d, NEW).await.ok() },
    )
    .await;
    assert_eq!(
        status_with(&d, OLD).await,
        Ok(()),
        "the old one still works"
    );

    // 2. vallumd survives a reload of a bad edit and serves with the tokens in use (that
    // a bad file changes nothing is `auth::tests::a_reload_is_all_or_nothing`).
    std::fs::write(&file, format!("admin {NEW} ci-next\nbogus\n")).unwrap();
    hangup(&d);
    assert_eq!(status_with(&d, NEW).await, Ok(()));
    std::fs::write(&file, format!("admin {OLD} ci\nadmin {NEW} ci-next\n")).unwrap();
    hangup(&d);
    assert_eq!(status_with(&d, OLD).await, Ok(()));
    assert_eq!(status_with(&d, NEW).await, Ok(()));

    // 3. Retire the old token.
    std::fs::write(&file, format!("admin {NEW} ci-next\n")).unwrap();
    hangup(&d);
    poll(
        "the old token is refused",
        400,
        Duration::from_millis(25),
        || async { (status_with(&d, OLD).await == Err("TOKEN_INVALID".into())).then_some(()) },
    )
    .await;
    assert_eq!(status_with(&d, NEW).await, Ok(()));
}
