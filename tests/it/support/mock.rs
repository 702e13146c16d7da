//! A server on 127.0.0.1 for the client side's tests (and `examples/pool_bench.rs`, which
//! includes this file): any axum router, in its own thread and runtime; dropping it closes the
//! listener and every connection.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;

pub struct Mock {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Mock {
    /// `app` on a free port.
    pub fn start(app: Router) -> Mock {
        Self::start_on("127.0.0.1:0".parse().unwrap(), app).unwrap()
    }

    /// `app` on `addr` (a server that comes back where it was).
    pub fn start_on(addr: SocketAddr, app: Router) -> std::io::Result<Mock> {
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                tokio::select! {
                    _ = axum::serve(listener, app) => {}
                    _ = stopped => {}
                }
            });
            // Handlers still running (a sleeping one) and idle connections go with the runtime.
            rt.shutdown_timeout(Duration::from_millis(100));
        });
        Ok(Mock { addr, stop: Some(stop), thread: Some(thread) })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Mock {
    fn drop(&mut self) {
        let _ = self.stop.take().unwrap().send(());
        let _ = self.thread.take().unwrap().join();
    }
}
