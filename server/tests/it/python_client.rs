//! An independent client: Python grpcio (with grpcio-reflection and grpcio-health-checking from
//! PyPI, installed by `.ci/run`) lists vallumd's services through server reflection and gets
//! SERVING from grpc.health.v1. Ignored unless asked for (`-- --include-ignored`); fails when
//! python3 or those packages are missing.

use crate::support;

use std::process::Command;

use support::Daemon;

fn python_has_grpc() -> Result<(), String> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import grpc, grpc_reflection.v1alpha.proto_reflection_descriptor_database, grpc_health.v1.health_pb2",
        ])
        .output()
        .map_err(|e| format!("python3 not runnable: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "python grpcio packages missing (pip install grpcio grpcio-reflection grpcio-health-checking): {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        ))
    }
}

#[tokio::test]
#[ignore = "needs python3 with grpcio, grpcio-reflection and grpcio-health-checking"]
async fn python_grpcio_lists_services_and_gets_serving() {
    if let Err(reason) = python_has_grpc() {
        panic!("python grpc client: {reason}");
    }
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("v.db"), &["--example"]);
    d.wait_serving().await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/grpc_client.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(&d.addr)
        .output()
        .expect("run python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("python client: {stdout}");
    assert!(
        out.status.success(),
        "python client failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).expect("json line");
    assert_eq!(v["serving"], true);
    assert_eq!(v["missing"].as_array().map(Vec::len), Some(0));
}
