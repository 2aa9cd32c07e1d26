//! The daemon's HTTP endpoint: `/metrics` (Prometheus text format), `/livez`, `/readyz`.
//! Loopback by default; `127.0.0.1:0` takes a free port (the log says which).

use super::metrics::Metrics;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Serves until `stop` is set. Returns the bound address.
pub fn serve(
    listen: &str,
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
) -> Result<std::net::SocketAddr, String> {
    let server =
        tiny_http::Server::http(listen).map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let addr = server
        .server_addr()
        .to_ip()
        .ok_or_else(|| format!("{listen} is not an IP address"))?;
    std::thread::Builder::new()
        .name("archplace-http".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let Ok(Some(req)) = server.recv_timeout(std::time::Duration::from_millis(200))
                else {
                    continue;
                };
                let (code, body, kind) = match req.url() {
                    "/metrics" => (200, metrics.render(), "text/plain; version=0.0.4"),
                    "/livez" => (200, b"ok\n".to_vec(), "text/plain"),
                    "/readyz" if ready.load(Ordering::Relaxed) && !stop.load(Ordering::Relaxed) => {
                        (200, b"ready\n".to_vec(), "text/plain")
                    }
                    "/readyz" => (503, b"not ready\n".to_vec(), "text/plain"),
                    _ => (
                        404,
                        b"not found; try /metrics, /livez or /readyz\n".to_vec(),
                        "text/plain",
                    ),
                };
                let mut resp = tiny_http::Response::from_data(body).with_status_code(code);
                if let Ok(h) = tiny_http::Header::from_bytes("Content-Type", kind) {
                    resp = resp.with_header(h);
                }
                let _ = req.respond(resp);
            }
        })
        .map_err(|e| format!("cannot start the HTTP thread: {e}"))?;
    Ok(addr)
}
