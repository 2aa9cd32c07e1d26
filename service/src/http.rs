//! The daemon's HTTP endpoint: `/metrics` (Prometheus text format), `/livez`, `/readyz`,
//! `/jobs` and `/jobs/<hash>` (JSON: every job, or one, with a running search's progress).
//! Loopback by default; `127.0.0.1:0` takes a free port (the log says which).
//!
//! On tokio and hyper, on a thread of its own, with the limits a listener open to
//! misbehaving clients needs (one `accept` error — file descriptors exhausted by
//! idle connections that were never timed out — ended the old listener for good):
//! * at most [`MAX_CONNECTIONS`] at once; at the limit a new connection takes the place of
//!   the one that has waited longest without a request answered (a slow or idle client:
//!   slowloris sockets cannot starve scrapes), and is answered `503` and closed only if none
//!   gives way within [`PREEMPT_WAIT`];
//! * a request's head must arrive within [`HEADER_TIMEOUT`], and a connection lives at most
//!   [`CONNECTION_TIMEOUT`] (so idle keep-alive and slowloris connections are closed);
//! * an `accept` error is logged and the listener goes on after a short pause;
//! * methods other than GET and HEAD are answered `405` with `Allow: GET, HEAD`.

use super::lock::Lock;
use super::metrics::Metrics;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{ALLOW, CONNECTION, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 64;
/// Time for a request's head to arrive, from the connection's start or its previous answer.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest a connection is kept, however busy.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);
/// Pause after an `accept` error (e.g. out of file descriptors) before accepting again.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);
/// How long a connection at the limit waits for the one it displaces to close.
pub const PREEMPT_WAIT: Duration = Duration::from_millis(500);

/// A connection being served, as the accept loop sees it.
struct Conn {
    id: u64,
    started: Instant,
    /// Requests answered on it.
    served: Arc<AtomicU64>,
    /// Closes it (its task drops the connection and its slot).
    close: Arc<tokio::sync::Notify>,
}

/// The connections being served.
struct Conns(Lock<Vec<Conn>>);

impl Conns {
    fn add(&self, conn: Conn) {
        self.0.lock().push(conn);
    }

    fn remove(&self, id: u64) {
        self.0.lock().retain(|c| c.id != id);
    }

    /// Asks the connection to give way for a new one: the oldest of those that have not
    /// had a request answered (a client that is slow to send one, or sends none), else the
    /// oldest. Whether there was one.
    fn displace_one(&self) -> bool {
        let conns = self.0.lock();
        let never = conns
            .iter()
            .filter(|c| c.served.load(Ordering::Relaxed) == 0)
            .min_by_key(|c| c.started);
        match never.or_else(|| conns.iter().min_by_key(|c| c.started)) {
            Some(c) => {
                c.close.notify_one();
                true
            }
            None => false,
        }
    }
}

/// The JSON of every job (`None`) or of the job with a hash, `None` when there is none;
/// set once the daemon's state exists (until then `/jobs` lists none).
pub type Jobs =
    Arc<std::sync::OnceLock<Box<dyn Fn(Option<&str>) -> Option<Vec<u8>> + Send + Sync>>>;

/// What the endpoint answers from.
pub struct Sources {
    pub metrics: Arc<Metrics>,
    pub ready: Arc<AtomicBool>,
    pub stop: Arc<AtomicBool>,
    pub jobs: Jobs,
}

impl Sources {
    /// `/jobs` (every job) or `/jobs/<hash>`.
    fn jobs(&self, path: &str) -> (StatusCode, Vec<u8>, &'static str) {
        let hash = path
            .strip_prefix("/jobs")
            .map(|rest| rest.trim_start_matches('/'))
            .filter(|h| !h.is_empty());
        let found = match self.jobs.get() {
            Some(view) => view(hash),
            None if hash.is_none() => Some(b"{\n  \"jobs\": []\n}\n".to_vec()),
            None => None,
        };
        match found {
            Some(body) => (StatusCode::OK, body, "application/json"),
            None => (
                StatusCode::NOT_FOUND,
                b"no such job; /jobs lists them\n".to_vec(),
                "text/plain",
            ),
        }
    }

    fn answer(&self, req: &Request<Incoming>) -> Response<Full<Bytes>> {
        let (status, body, kind): (StatusCode, Vec<u8>, &str) = match req.uri().path() {
            _ if req.method() != Method::GET && req.method() != Method::HEAD => (
                StatusCode::METHOD_NOT_ALLOWED,
                b"only GET and HEAD\n".to_vec(),
                "text/plain",
            ),
            "/metrics" => (
                StatusCode::OK,
                self.metrics.render(),
                "text/plain; version=0.0.4",
            ),
            "/livez" => (StatusCode::OK, b"ok\n".to_vec(), "text/plain"),
            path if path == "/jobs" || path.starts_with("/jobs/") => self.jobs(path),
            "/readyz"
                if self.ready.load(Ordering::Relaxed) && !self.stop.load(Ordering::Relaxed) =>
            {
                (StatusCode::OK, b"ready\n".to_vec(), "text/plain")
            }
            "/readyz" => (
                StatusCode::SERVICE_UNAVAILABLE,
                b"not ready\n".to_vec(),
                "text/plain",
            ),
            _ => (
                StatusCode::NOT_FOUND,
                b"not found; try /metrics, /jobs, /livez or /readyz\n".to_vec(),
                "text/plain",
            ),
        };
        let mut resp = Response::new(Full::new(Bytes::from(body)));
        *resp.status_mut() = status;
        resp.headers_mut()
            .insert(CONTENT_TYPE, hyper::header::HeaderValue::from_static(kind));
        if status == StatusCode::METHOD_NOT_ALLOWED {
            resp.headers_mut()
                .insert(ALLOW, hyper::header::HeaderValue::from_static("GET, HEAD"));
        }
        resp
    }
}

/// Serves until `stop` is set. Returns the bound address.
pub fn serve(listen: &str, sources: Sources) -> Result<std::net::SocketAddr, String> {
    let stop = sources.stop.clone();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(|e| format!("cannot start the HTTP runtime: {e}"))?;
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(listen))
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let endpoint = Arc::new(sources);
    std::thread::Builder::new()
        .name("archplace-http".into())
        .spawn(move || runtime.block_on(accept_loop(listener, endpoint, stop)))
        .map_err(|e| format!("cannot start the HTTP thread: {e}"))?;
    Ok(addr)
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    endpoint: Arc<Sources>,
    stop: Arc<AtomicBool>,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let conns = Arc::new(Conns(Lock::new("http connections", Vec::new())));
    let mut next_id = 0u64;
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    while !stop.load(Ordering::Relaxed) {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = tick.tick() => continue,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::warn!(error = %e, "the metrics endpoint cannot accept a connection; trying again");
                tokio::time::sleep(ACCEPT_PAUSE).await;
                continue;
            }
        };
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            // At the limit: one connection gives way for this one, or it is refused.
            Err(_) => {
                let freed = if conns.displace_one() {
                    tokio::time::timeout(PREEMPT_WAIT, slots.clone().acquire_owned())
                        .await
                        .ok()
                        .and_then(Result::ok)
                } else {
                    None
                };
                match freed {
                    Some(slot) => slot,
                    None => {
                        tokio::spawn(refuse(stream));
                        continue;
                    }
                }
            }
        };
        next_id += 1;
        let (id, served, close) = (
            next_id,
            Arc::new(AtomicU64::new(0)),
            Arc::new(tokio::sync::Notify::new()),
        );
        conns.add(Conn {
            id,
            started: Instant::now(),
            served: served.clone(),
            close: close.clone(),
        });
        let (endpoint, conns) = (endpoint.clone(), conns.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let resp = endpoint.answer(&req);
                served.fetch_add(1, Ordering::Relaxed);
                async move { Ok::<_, std::convert::Infallible>(resp) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .max_buf_size(64 * 1024)
                .serve_connection(TokioIo::new(stream), service);
            // A connection past its time, or asked to give way, is dropped (and with it its
            // socket).
            tokio::select! {
                _ = tokio::time::timeout(CONNECTION_TIMEOUT, conn) => {}
                () = close.notified() => {}
            }
            conns.remove(id);
            drop(slot);
        });
    }
}

/// Answers a connection beyond the limit with `503` and closes it.
async fn refuse(stream: tokio::net::TcpStream) {
    let service = hyper::service::service_fn(|_req: Request<Incoming>| async {
        let mut resp = Response::new(Full::new(Bytes::from_static(
            b"too many connections; try again\n",
        )));
        *resp.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        resp.headers_mut()
            .insert(CONNECTION, hyper::header::HeaderValue::from_static("close"));
        Ok::<_, std::convert::Infallible>(resp)
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(1))
        .keep_alive(false)
        .serve_connection(TokioIo::new(stream), service);
    let _ = tokio::time::timeout(Duration::from_secs(2), conn).await;
}
