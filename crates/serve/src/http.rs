//! The HTTP front end: OpenAI's `POST /v1/audio/speech` (raw audio, SSE, or a buffered file),
//! the live WebSocket `/v1/audio/speech/live` (text in as it is written, [`crate::live`]),
//! `/v1/models`, `/v1/audio/voices`, `/v1/audio/models`, and the operations routes `/livez`,
//! `/readyz`, `/health`, `/metrics`. Errors use OpenAI's envelope
//! `{"error":{"message","type","param","code"}}`.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use base64::Engine as _;
use qtts::engine::{EngineError, Summary};
use serde_json::{json, Value};

use crate::encode::{Encoder, Format};
use crate::service::{Admitted, Event, Refused, Service};
use crate::speech::{self, Delivery};

pub use crate::body::{BodyTimes, BODY_BUDGET, BODY_IDLE_TIMEOUT, BODY_LIMIT, BODY_TIMEOUT};

/// Open HTTP connections at most: 256; past it new ones are closed at once.
pub const MAX_CONNECTIONS: usize = 256;

/// A request's headers must arrive within 30 s: slow-header clients are dropped.
pub const HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Completes once `stop` is true (or its sender is gone).
async fn stopped(mut stop: tokio::sync::watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Serves `app` on `listener` (HTTP/1.1, TCP_NODELAY, [`HEADER_TIMEOUT`], [`MAX_CONNECTIONS`])
/// until `stop` turns true; then lets open connections finish their responses and returns.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let sock = tokio::select! {
            r = listener.accept() => match r {
                Ok((sock, _)) => sock,
                // Out of descriptors or a reset before accept: try again shortly.
                Err(_) => {
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                }
            },
            _ = stopped(stop.clone()) => break,
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            continue;
        };
        // Nagle would hold small chunks back for tens of ms.
        let _ = sock.set_nodelay(true);
        let svc = hyper_util::service::TowerToHyperService::new(app.clone());
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut b = hyper::server::conn::http1::Builder::new();
            b.timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT);
            // Upgrades: the live WebSocket (its sessions have their own cap, `live::MAX_SESSIONS`).
            let conn = b
                .serve_connection(hyper_util::rt::TokioIo::new(sock), svc)
                .with_upgrades();
            let mut conn = std::pin::pin!(conn);
            let mut draining = false;
            loop {
                tokio::select! {
                    _ = conn.as_mut() => break,
                    _ = stopped(stop.clone()), if !draining => {
                        draining = true;
                        conn.as_mut().graceful_shutdown();
                    }
                }
            }
            drop(permit);
        });
    }
    // Every connection gives its permit back when it ends.
    let _ = permits.acquire_many(MAX_CONNECTIONS as u32).await;
}

/// Settings of the HTTP front end.
#[derive(Debug, Clone, Default)]
pub struct HttpOptions {
    /// How long a request body may take ([`BODY_TIMEOUT`] whole, [`BODY_IDLE_TIMEOUT`] between
    /// pieces); past it, 408.
    pub body_times: BodyTimes,
    /// Bearer key the `/v1` routes require; `None`: `Authorization` is ignored.
    pub api_key: Option<String>,
    /// Refuse a `model` other than the served one (404 `model_not_found`).
    pub strict_model: bool,
    /// Answer a full queue with 429 instead of 503 (for meshes that eject pods on 5xx).
    pub overload_429: bool,
}

struct App {
    svc: Arc<Service>,
    opts: HttpOptions,
    /// The key's SHA-256 (compared in constant time).
    key: Option<[u8; 32]>,
    bodies: crate::body::Budget,
    /// Places for live sessions ([`crate::live::MAX_SESSIONS`]).
    live: Arc<tokio::sync::Semaphore>,
}

fn sha256(s: &str) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(s.as_bytes()).into()
}

/// The router.
pub fn router(svc: Arc<Service>, opts: HttpOptions) -> Router {
    let key = opts.api_key.as_deref().map(sha256);
    let app = Arc::new(App {
        svc,
        opts,
        key,
        bodies: Default::default(),
        live: Arc::new(tokio::sync::Semaphore::new(crate::live::MAX_SESSIONS)),
    });
    Router::new()
        .route("/v1/audio/speech", post(speech))
        .route("/v1/audio/speech/live", get(live))
        .route("/v1/audio/voices", get(voices))
        .route("/v1/audio/models", get(audio_models))
        .route("/v1/models", get(models))
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .with_state(app)
}

/// An error in OpenAI's envelope.
#[derive(Debug)]
pub struct ApiError {
    pub(crate) status: StatusCode,
    message: String,
    kind: &'static str,
    param: Option<&'static str>,
    pub(crate) code: &'static str,
    pub(crate) retry_after: Option<u64>,
}

impl ApiError {
    pub(crate) fn bad(
        code: &'static str,
        param: Option<&'static str>,
        message: impl Into<String>,
    ) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param,
            code,
            retry_after: None,
        }
    }

    pub(crate) fn server(
        status: StatusCode,
        code: &'static str,
        message: impl Into<String>,
    ) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind: "server_error",
            param: None,
            code,
            retry_after: None,
        }
    }

    /// The envelope's JSON.
    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
            r.headers_mut()
                .insert("x-should-retry", HeaderValue::from_static("true"));
        }
        r
    }
}

fn refused(app: &App, r: Refused) -> ApiError {
    match r {
        Refused::Busy { retry_after } => {
            let mut e = ApiError::server(
                if app.opts.overload_429 {
                    StatusCode::TOO_MANY_REQUESTS
                } else {
                    StatusCode::SERVICE_UNAVAILABLE
                },
                "server_overloaded",
                format!(
                    "the server is busy: {} requests wait for the engine; retry in {retry_after} s",
                    app.svc.worker.queued()
                ),
            );
            e.retry_after = Some(retry_after);
            e
        }
        Refused::Draining => {
            let mut e = ApiError::server(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_overloaded",
                "the server is shutting down; retry on another replica",
            );
            e.retry_after = Some(1);
            e
        }
        Refused::Engine(e) => engine_error(&e),
    }
}

/// An engine error before the first byte: the request's fault (400) or the engine's (500).
fn engine_error(e: &EngineError) -> ApiError {
    match crate::service::error_code(e) {
        "empty_input" => ApiError::bad("empty_input", Some("input"), e.to_string()),
        "invalid_request" => ApiError::bad("invalid_request", None, e.to_string()),
        code => ApiError::server(StatusCode::INTERNAL_SERVER_ERROR, code, e.to_string()),
    }
}

/// The `/v1` routes' key check, made from the headers alone (before any byte of the body is
/// read), comparing SHA-256 digests in constant time: the time taken says nothing of the key.
fn check_key(app: &App, headers: &HeaderMap) -> Result<(), ApiError> {
    use subtle::ConstantTimeEq;
    let Some(key) = &app.key else {
        return Ok(());
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if let Some(given) = given {
        if bool::from(sha256(given).ct_eq(key)) {
            return Ok(());
        }
    }
    let mut e = ApiError::bad(
        "invalid_api_key",
        None,
        "the API key is wrong or missing: send 'Authorization: Bearer <key>' with the server's --api-key",
    );
    e.status = StatusCode::UNAUTHORIZED;
    Err(e)
}

fn count(app: &App, format: &'static str, code: &str) {
    app.svc.metrics.count_request("http", format, code);
}

async fn speech(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    match speech_inner(&app, &headers, body).await {
        Ok((resp, format)) => {
            count(&app, format.name(), resp.status().as_str());
            resp
        }
        Err(e) => {
            count(&app, "unknown", e.status.as_str());
            e.into_response()
        }
    }
}

async fn speech_inner(
    app: &Arc<App>,
    headers: &HeaderMap,
    body: Body,
) -> Result<(Response, Format), ApiError> {
    // The key first: a client without it never gets a byte of its body read.
    check_key(app, headers)?;
    let body = crate::body::read(body, headers, app.opts.body_times, &app.bodies).await?;
    let mut p = speech::parse(&app.svc, &app.opts, &body.bytes)?;
    drop(body);
    if let (Some(r), Some(cloner)) = (p.reference.take(), &app.svc.cloner) {
        let v = cloner.voice(r, app.svc.limits.queue_timeout).await?;
        p.req.voice.xvector = v.xvector;
        p.req.voice.reference = v.reference;
    }
    let mut admitted = app.svc.admit(p.req, "http").map_err(|r| refused(app, r))?;
    // The status is decided by the first event: audio (200), an error before any audio, or a
    // request that waited too long in the queue.
    let first = match admitted.next().await {
        Some(Event::QueueTimeout) => {
            let mut e = ApiError::server(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_overloaded",
                format!(
                    "the request waited {} s in the queue without starting; retry later",
                    app.svc.limits.queue_timeout.as_secs()
                ),
            );
            e.retry_after = Some(app.svc.retry_after());
            return Err(e);
        }
        Some(Event::End(Err(e))) => return Err(engine_error(&e)),
        Some(Event::OverLimit { seconds }) => return Err(over_limit(seconds)),
        None => {
            return Err(ApiError::server(
                StatusCode::INTERNAL_SERVER_ERROR,
                "engine_error",
                "the request's audio pump stopped; report this",
            ))
        }
        Some(e) => e,
    };
    let mut enc = Encoder::new(p.format, p.delivery != Delivery::Buffered).map_err(|e| {
        ApiError::server(
            StatusCode::INTERNAL_SERVER_ERROR,
            "encoder_error",
            e.to_string(),
        )
    })?;
    // Taken by the engine by now (its first event came): where it stood in the engine's order.
    let (seq, after) = admitted.order();
    let mut resp = match p.delivery {
        Delivery::Buffered => buffered(admitted, first, &mut enc).await?,
        Delivery::Stream => {
            let s = chunks(admitted, first, enc, false);
            Response::new(Body::from_stream(s))
        }
        Delivery::Sse => {
            let s = chunks(admitted, first, enc, true);
            Response::new(Body::from_stream(s))
        }
    };
    let h = resp.headers_mut();
    let ct = if p.delivery == Delivery::Sse {
        "text/event-stream"
    } else {
        p.format.content_type()
    };
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    h.insert("x-qtts-job", HeaderValue::from(seq));
    if let Some(after) = after {
        h.insert("x-qtts-after-job", HeaderValue::from(after));
    }
    if p.speed_ignored {
        h.insert(
            "x-qtts-warning",
            HeaderValue::from_static("speed ignored: the model has no rate control"),
        );
    } else if p.instructions_ignored {
        h.insert(
            "x-qtts-warning",
            HeaderValue::from_static("instructions ignored: this model takes none"),
        );
    }
    Ok((resp, p.format))
}

/// A request whose audio reached the limit: the client's to split (400, never retried as a 5xx
/// would be).
fn over_limit(seconds: f64) -> ApiError {
    ApiError::bad(
        "audio_too_long",
        Some("input"),
        crate::service::over_limit_message(seconds),
    )
}

/// The whole file, for `"stream": false`.
async fn buffered(mut a: Admitted, first: Event, enc: &mut Encoder) -> Result<Response, ApiError> {
    let enc_err = |e: crate::encode::EncodeError| {
        ApiError::server(
            StatusCode::INTERNAL_SERVER_ERROR,
            "encoder_error",
            e.to_string(),
        )
    };
    let mut out = Vec::new();
    let mut ev = Some(first);
    loop {
        let next = match ev.take() {
            Some(e) => Some(e),
            None => a.next().await,
        };
        match next {
            Some(Event::Audio(c)) => out.extend(enc.push(&c).map_err(enc_err)?),
            Some(Event::End(Ok(s))) if s.stop == qtts::talker::StopReason::Cancelled => {
                return Err(ApiError::server(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "cancelled",
                    crate::service::CUT_SHORT,
                ))
            }
            Some(Event::End(Ok(_))) => break,
            Some(Event::End(Err(e))) => return Err(engine_error(&e)),
            Some(Event::OverLimit { seconds }) => return Err(over_limit(seconds)),
            Some(Event::QueueTimeout) | None => {
                return Err(ApiError::server(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "engine_error",
                    "the request ended without its audio",
                ))
            }
        }
    }
    out.extend(enc.finish().map_err(enc_err)?);
    Ok(Response::new(Body::from(out)))
}

/// The SSE text of one event.
fn sse(kind: &str, data: &Value) -> Bytes {
    Bytes::from(format!("event: {kind}\ndata: {data}\n\n"))
}

fn usage(s: &Summary) -> Value {
    let input: usize = s.segments.iter().map(|g| g.tokens).sum();
    let audio = s.samples as f64 / 24_000.0;
    let stop = crate::metrics::stop_label(&s.stop);
    json!({
        "input_tokens": input,
        "output_tokens": s.frames,
        "total_tokens": input + s.frames,
        "qtts": {
            "ttfa_ms": s.ttfa.map(|t| t.as_secs_f64() * 1e3),
            "rtf": if audio > 0.0 { Some(s.generated.as_secs_f64() / audio) } else { None },
            "frames": s.frames,
            "stop_reason": stop,
        }
    })
}

/// How a body already begun ends on an error: SSE sends `speech.audio.error` with the error's
/// envelope, raw audio is broken off (an I/O error ends the chunked body).
fn broken_off(e: ApiError, sse_events: bool) -> Result<Bytes, std::io::Error> {
    if sse_events {
        let ev = json!({"type": "speech.audio.error", "error": e.body()["error"]});
        Ok(sse("speech.audio.error", &ev))
    } else {
        Err(std::io::Error::other(e.message))
    }
}

/// The body stream: encoded audio as it comes (raw or as SSE deltas). An engine error after the
/// first byte ends the body with an error, so the client sees a broken chunked body rather than
/// a short file it would take as whole (SSE sends `speech.audio.error` first).
fn chunks(
    admitted: Admitted,
    first: Event,
    enc: Encoder,
    sse_events: bool,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send {
    struct St {
        a: Admitted,
        first: Option<Event>,
        enc: Encoder,
        done: bool,
    }
    let wrap = move |bytes: Vec<u8>| -> Bytes {
        if sse_events {
            let audio = base64::engine::general_purpose::STANDARD.encode(&bytes);
            sse(
                "speech.audio.delta",
                &json!({"type": "speech.audio.delta", "audio": audio}),
            )
        } else {
            Bytes::from(bytes)
        }
    };
    let st = St {
        a: admitted,
        first: Some(first),
        enc,
        done: false,
    };
    futures_util::stream::unfold(st, move |mut st| async move {
        if st.done {
            return None;
        }
        loop {
            let ev = match st.first.take() {
                Some(e) => Some(e),
                None => st.a.next().await,
            };
            let fail = |msg: String| std::io::Error::other(msg);
            match ev {
                Some(Event::Audio(c)) => match st.enc.push(&c) {
                    Ok(b) if b.is_empty() => continue,
                    Ok(b) => return Some((Ok(wrap(b)), st)),
                    Err(e) => {
                        st.done = true;
                        return Some((Err(fail(e.to_string())), st));
                    }
                },
                Some(Event::End(Ok(summary)))
                    if summary.stop == qtts::talker::StopReason::Cancelled =>
                {
                    // Cut short (shutdown): never end like a whole file.
                    st.done = true;
                    let e = ApiError::server(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "cancelled",
                        crate::service::CUT_SHORT,
                    );
                    return Some((broken_off(e, sse_events), st));
                }
                Some(Event::OverLimit { seconds }) => {
                    // Cut at the limit: the client's to split; never ends like a whole file.
                    st.done = true;
                    return Some((broken_off(over_limit(seconds), sse_events), st));
                }
                Some(Event::End(Ok(summary))) => {
                    st.done = true;
                    let tail = match st.enc.finish() {
                        Ok(t) => t,
                        Err(e) => return Some((Err(fail(e.to_string())), st)),
                    };
                    let mut out = if tail.is_empty() {
                        Bytes::new()
                    } else {
                        wrap(tail)
                    };
                    if sse_events {
                        let done = sse(
                            "speech.audio.done",
                            &json!({"type": "speech.audio.done", "usage": usage(&summary)}),
                        );
                        out = [out, done].concat().into();
                    }
                    return Some((Ok(out), st));
                }
                Some(Event::End(Err(e))) => {
                    st.done = true;
                    let e = ApiError::server(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "engine_error",
                        e.to_string(),
                    );
                    return Some((broken_off(e, sse_events), st));
                }
                Some(Event::QueueTimeout) | None => {
                    st.done = true;
                    return Some((Err(fail("the request ended without its audio".into())), st));
                }
            }
        }
    })
}

/// `GET /v1/audio/speech/live`: the key, then a place among the live sessions, then the upgrade
/// to the live WebSocket ([`crate::live`]).
async fn live(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    let refused = |e: ApiError| {
        count(&app, "live", e.status.as_str());
        e.into_response()
    };
    if let Err(e) = check_key(&app, &headers) {
        return refused(e);
    }
    let ws = match ws {
        Ok(ws) => ws,
        Err(r) => {
            let mut e = ApiError::bad(
                "invalid_request",
                None,
                format!(
                    "{}: open it as a WebSocket (GET with Upgrade: websocket)",
                    r.body_text()
                ),
            );
            e.status = r.status();
            return refused(e);
        }
    };
    if app.svc.is_draining() {
        return refused(ApiError::server(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_shutting_down",
            "the server is shutting down; reconnect later",
        ));
    }
    let Ok(permit) = app.live.clone().try_acquire_owned() else {
        return refused(ApiError::server(
            StatusCode::SERVICE_UNAVAILABLE,
            "too_many_sessions",
            format!(
                "{} live sessions are open, the most this server takes; try again later",
                crate::live::MAX_SESSIONS
            ),
        ));
    };
    let svc = app.svc.clone();
    ws.max_message_size(crate::live::MAX_READ)
        .max_frame_size(crate::live::MAX_READ)
        .max_write_buffer_size(crate::live::MAX_WRITE_BUFFER)
        .on_upgrade(move |socket| crate::live::session(socket, svc, permit))
}

async fn voices(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if let Err(e) = check_key(&app, &headers) {
        return e.into_response();
    }
    let info = app.svc.info();
    let langs = crate::voices::iso_codes(info);
    let title = |s: &str| {
        let mut c = s.chars();
        c.next()
            .map(|f| f.to_uppercase().collect::<String>() + c.as_str())
            .unwrap_or_default()
    };
    let mut v: Vec<Value> = app
        .svc
        .voices
        .profiles()
        .map(|p| json!({"id": p, "name": title(p), "languages": langs, "kind": "profile"}))
        .collect();
    v.extend(
        info.speakers
            .iter()
            .map(|s| json!({"id": s, "name": title(s), "languages": langs, "kind": "speaker"})),
    );
    if info.speakers.is_empty() {
        v.push(json!({"id": "default", "name": "Default", "languages": langs, "kind": "default"}));
    }
    axum::Json(json!({ "voices": v })).into_response()
}

/// The names OpenAI clients send as `model`, listed beside the served model.
const MODEL_ALIASES: [&str; 3] = ["tts-1", "tts-1-hd", "gpt-4o-mini-tts"];

/// The names `/v1/models` and `/v1/audio/models` list: the served model, and the aliases unless
/// `--strict-model` refuses them.
fn model_names(app: &App) -> impl Iterator<Item = &str> {
    let aliases = if app.opts.strict_model {
        &[][..]
    } else {
        &MODEL_ALIASES[..]
    };
    std::iter::once(app.svc.model_id.as_str()).chain(aliases.iter().copied())
}

async fn models(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if let Err(e) = check_key(&app, &headers) {
        return e.into_response();
    }
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let data: Vec<Value> = model_names(&app)
        .map(|id| json!({"id": id, "object": "model", "created": created, "owned_by": "qtts"}))
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

async fn audio_models(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if let Err(e) = check_key(&app, &headers) {
        return e.into_response();
    }
    let m: Vec<Value> = model_names(&app)
        .map(|id| json!({"id": id, "name": id}))
        .collect();
    axum::Json(json!({ "models": m })).into_response()
}

async fn livez(State(app): State<Arc<App>>) -> Response {
    if app.svc.is_live() {
        (StatusCode::OK, "ok\n").into_response()
    } else {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            "an engine stage died; restart the server\n",
        )
            .into_response()
    }
}

async fn readyz(State(app): State<Arc<App>>) -> Response {
    if app.svc.is_ready() {
        (StatusCode::OK, "ready\n").into_response()
    } else if app.svc.is_draining() {
        (StatusCode::SERVICE_UNAVAILABLE, "draining\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "warming up\n").into_response()
    }
}

async fn health(State(app): State<Arc<App>>) -> Response {
    let svc = &app.svc;
    let queue = svc.worker.queued();
    let body = json!({
        "status": if svc.is_ready() { "ok" } else if svc.is_draining() { "draining" } else { "starting" },
        "model": svc.model_id,
        "queue": queue,
        "running": svc.worker.running(),
        "max_streams": svc.worker.config().streams(),
    });
    let status = if svc.is_ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(body)).into_response()
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    app.svc.refresh_gauges();
    (
        [(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)],
        app.svc.metrics.encode(),
    )
        .into_response()
}

async fn not_found(uri: axum::http::Uri) -> Response {
    let mut e = ApiError::bad("not_found", None, format!("no route {uri}"));
    e.status = StatusCode::NOT_FOUND;
    e.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_envelope_shape() {
        let e = ApiError::bad("voice_not_found", Some("voice"), "voice 'x' is unknown");
        assert_eq!(
            e.body(),
            json!({"error": {"message": "voice 'x' is unknown", "type": "invalid_request_error",
                   "param": "voice", "code": "voice_not_found"}})
        );
    }

    #[test]
    fn sse_event_text() {
        let v = json!({"type": "speech.audio.delta", "audio": "AAE="});
        let b = sse("speech.audio.delta", &v);
        let text = std::str::from_utf8(&b).unwrap();
        let data = text
            .strip_prefix("event: speech.audio.delta\ndata: ")
            .and_then(|t| t.strip_suffix("\n\n"))
            .unwrap();
        assert!(!data.contains('\n'));
        assert_eq!(serde_json::from_str::<Value>(data).unwrap(), v);
    }
}
