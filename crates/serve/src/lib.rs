//! `qtts serve`: one engine behind two network front ends.
//!
//! ```text
//!  HTTP (axum): OpenAI /v1/audio/speech ─┐
//!                                        ├─▶ Service::admit ─▶ Worker queue ─▶ engine
//!  Wyoming (TCP, Home Assistant) ────────┘        (one FIFO, bounded: --queue)
//! ```
//!
//! - [`service`]: admission, limits, voices, and the pump from an engine job to a front end.
//! - [`body`]: request bodies read within bounds of size, time and shared memory.
//! - [`http`]: the OpenAI speech API, models and voices lists, health and metrics routes.
//! - [`wyoming`]: the Wyoming protocol, framing included.
//! - [`encode`]: pcm, wav, mp3, opus and flac, chunk by chunk.
//! - [`metrics`]: the Prometheus exposition.
//!
//! The tokio runtime has one worker thread: network work is small beside the engine, whose stage
//! threads are pinned by its own plan; one thread keeps Wyoming's `describe` answerable within
//! Home Assistant's 1 s while the engine saturates the cores.

pub mod body;
pub mod clone;
pub mod encode;
pub mod http;
pub mod live;
pub mod metrics;
pub mod sentences;
pub mod service;
mod speech;
pub mod voices;
pub mod wyoming;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

pub use service::{Limits, Service};

/// How `qtts serve` runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// The HTTP address (`None`: no HTTP front end).
    pub http: Option<SocketAddr>,
    /// The Wyoming address (`None`: no Wyoming front end).
    pub wyoming: Option<SocketAddr>,
    /// HTTP settings.
    pub http_options: http::HttpOptions,
    /// After SIGTERM or Ctrl-C: how long running and queued requests may take before they are
    /// cancelled (25 s, under Kubernetes' default 30 s grace period).
    pub drain_timeout: Duration,
    /// Skip the warm-up request (tests that measure the first request).
    pub no_warmup: bool,
}

/// The server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {source}; pick a free port or address (port 0 takes any)")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// Neither front end was asked for.
    #[error("no front end: give --http ADDR, --wyoming ADDR, or both")]
    NoFrontEnd,
    /// The tokio runtime could not start.
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    /// The warm-up request failed: the engine cannot serve.
    #[error("the warm-up request failed: {0}")]
    Warmup(qtts::engine::EngineError),
}

/// The addresses bound (port 0 resolved).
#[derive(Debug, Clone, Copy)]
pub struct Bound {
    /// The HTTP address.
    pub http: Option<SocketAddr>,
    /// The Wyoming address.
    pub wyoming: Option<SocketAddr>,
}

impl std::fmt::Display for Bound {
    /// `listening http=127.0.0.1:8880 wyoming=127.0.0.1:10200` (`-` for a front end not run).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let a = |x: Option<SocketAddr>| x.map_or("-".to_string(), |a| a.to_string());
        write!(
            f,
            "listening http={} wyoming={}",
            a(self.http),
            a(self.wyoming)
        )
    }
}

/// Serves `svc` until SIGTERM or Ctrl-C, then drains; `listening` is called once both listeners
/// are bound and the engine is warm.
pub fn run(
    svc: Arc<Service>,
    opts: Options,
    listening: impl FnOnce(Bound),
) -> Result<(), ServeError> {
    run_until(svc, opts, listening, shutdown_signal())
}

/// [`run`], stopping when `stop` completes instead of on a signal (embedding, benches, tests).
pub fn run_until(
    svc: Arc<Service>,
    opts: Options,
    listening: impl FnOnce(Bound),
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), ServeError> {
    if opts.http.is_none() && opts.wyoming.is_none() {
        return Err(ServeError::NoFrontEnd);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("qtts-net")
        .enable_all()
        .build()
        .map_err(ServeError::Runtime)?;
    rt.block_on(serve(svc, opts, listening, stop))
}

async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, ServeError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })
}

async fn serve(
    svc: Arc<Service>,
    opts: Options,
    listening: impl FnOnce(Bound),
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), ServeError> {
    let http = match opts.http {
        Some(a) => Some(bind(a).await?),
        None => None,
    };
    let wyoming = match opts.wyoming {
        Some(a) => Some(bind(a).await?),
        None => None,
    };
    if !opts.no_warmup {
        warm_up(&svc).await?;
    }
    svc.set_ready();
    listening(Bound {
        http: http.as_ref().and_then(|l| l.local_addr().ok()),
        wyoming: wyoming.as_ref().and_then(|l| l.local_addr().ok()),
    });
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let wy = wyoming.map(|l| tokio::spawn(wyoming::serve(l, svc.clone())));
    let web = http.map(|l| {
        let app = http::router(svc.clone(), opts.http_options.clone());
        tokio::spawn(http::serve(l, app, stop_rx.clone()))
    });
    stop.await;
    eprintln!(
        "qtts serve: draining ({} requests in flight, up to {} s)",
        svc.in_flight(),
        opts.drain_timeout.as_secs()
    );
    svc.start_draining();
    let _ = stop_tx.send(true);
    if let Some(w) = wy {
        w.abort();
    }
    let deadline = tokio::time::Instant::now() + opts.drain_timeout;
    while svc.in_flight() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if svc.in_flight() > 0 {
        eprintln!("qtts serve: cancelling {} requests", svc.in_flight());
        svc.worker.cancel_all();
    }
    if let Some(w) = web {
        let _ = tokio::time::timeout(Duration::from_secs(5), w).await;
    }
    Ok(())
}

/// One short request through the whole engine before the server says it is ready.
async fn warm_up(svc: &Arc<Service>) -> Result<(), ServeError> {
    let mut req = qtts::engine::Request::text("Hello.");
    req.voice = svc.voice(None).unwrap_or_default();
    req.max_frames = Some(2);
    let mut a = match svc.admit(req, "warmup") {
        Ok(a) => a,
        Err(service::Refused::Engine(e)) => return Err(ServeError::Warmup(e)),
        Err(_) => return Ok(()),
    };
    loop {
        match a.next().await {
            Some(service::Event::End(Err(e))) => return Err(ServeError::Warmup(e)),
            Some(service::Event::End(Ok(_)))
            | None
            | Some(service::Event::QueueTimeout | service::Event::OverLimit { .. }) => {
                return Ok(())
            }
            Some(service::Event::Audio(_)) => {}
        }
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(t) => t,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
