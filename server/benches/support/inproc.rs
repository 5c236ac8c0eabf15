//! An in-process vallumd for the server benches: ephemeral gRPC port, metrics on an ephemeral
//! port, 2 engine cores, the store at a given path. The bench process uses vallumd's global
//! allocator and its settings (see server/src/host/allocator.rs), so the server runs as in vallumd.

#[global_allocator]
static ALLOCATOR: vallum_server::host::allocator::MiMalloc =
    vallum_server::host::allocator::MiMalloc;

/// A running in-process server.
pub struct Server {
    /// Send to stop it.
    pub stop: tokio::sync::oneshot::Sender<()>,
    /// Its task; await it after `stop`.
    pub task: tokio::task::JoinHandle<vallum_server::error::Result<vallum_server::Summary>>,
    /// The gRPC port on 127.0.0.1.
    pub port: u16,
}

/// Starts vallumd on `rt` with its store at `db` and `extra` flags after the defaults.
pub fn start(rt: &tokio::runtime::Runtime, db: &std::path::Path, extra: &[String]) -> Server {
    vallum_server::host::allocator::keep_freed_memory();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let mut args = vec![
        "vallumd".to_string(),
        "--listen".into(),
        format!("127.0.0.1:{port}"),
        "--db".into(),
        db.display().to_string(),
        "--cores".into(),
        "2".into(),
        "--metrics-listen".into(),
        "127.0.0.1:0".into(),
        // Mutations over TCP without tokens; never the host's default socket.
        "--insecure-no-auth".into(),
        "--socket".into(),
        "none".into(),
    ];
    args.extend_from_slice(extra);
    let config = vallum_server::Config::from_args(args).expect("config");
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let task = rt.spawn(vallum_server::server::run_with(
        config,
        Default::default(),
        async {
            let _ = rx.await;
        },
    ));
    Server { stop, task, port }
}
