//! A tonic server of a test on a loopback port, served on a spawned task that [`Served::stop`]
//! stops (graceful shutdown) and joins: the server's error or a panic on its task fails the
//! test with its own message instead of vanishing with the runtime.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;

use tokio_stream::wrappers::TcpListenerStream;

/// The shutdown signal handed to `serve_with_incoming_shutdown`.
pub type Shutdown = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A server on its own task; [`Served::stop`] it at the end of the test.
pub struct Served {
    pub addr: SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

/// Binds 127.0.0.1:0 and spawns `serve(incoming, shutdown)`, e.g.
/// `|i, s| Server::builder().add_service(svc).serve_with_incoming_shutdown(i, s)`.
pub async fn serve<F, Fut>(serve: F) -> Served
where
    F: FnOnce(TcpListenerStream, Shutdown) -> Fut,
    Fut: Future<Output = Result<(), tonic::transport::Error>> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let shutdown: Shutdown = Box::pin(async move {
        let _ = stopped.await;
    });
    let task = tokio::spawn(serve(TcpListenerStream::new(listener), shutdown));
    Served { addr, stop, task }
}

impl Served {
    /// Stops the server, waits for its task and re-raises its error or panic.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        match self.task.await {
            Ok(served) => served.expect("the server failed"),
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => panic!("the server's task did not finish: {e}"),
        }
    }
}
