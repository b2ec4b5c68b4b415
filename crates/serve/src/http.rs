//! The HTTP front end: OpenAI's `POST /v1/audio/speech` (raw audio, SSE, or a buffered file),
//! `/v1/models`, `/v1/audio/voices`, `/v1/audio/models`, and the operations routes `/livez`,
//! `/readyz`, `/health`, `/metrics`. Errors use OpenAI's envelope
//! `{"error":{"message","type","param","code"}}`.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use base64::Engine as _;
use qtts::engine::{EngineError, Request, Summary};
use qtts::sampling::SamplingParams;
use qtts::talker::TextMode;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::encode::{Encoder, Format};
use crate::service::{Admitted, Event, Refused, Service};

/// Request bodies on `/v1/audio/*`: 16 MiB (room for a `speaker_embedding`).
pub const BODY_LIMIT: usize = 16 << 20;

/// Settings of the HTTP front end.
#[derive(Debug, Clone, Default)]
pub struct HttpOptions {
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
}

/// The router.
pub fn router(svc: Arc<Service>, opts: HttpOptions) -> Router {
    let app = Arc::new(App { svc, opts });
    Router::new()
        .route("/v1/audio/speech", post(speech))
        .route("/v1/audio/voices", get(voices))
        .route("/v1/audio/models", get(audio_models))
        .route("/v1/models", get(models))
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(app)
}

/// An error in OpenAI's envelope.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
    kind: &'static str,
    param: Option<&'static str>,
    code: &'static str,
    retry_after: Option<u64>,
}

impl ApiError {
    fn bad(code: &'static str, param: Option<&'static str>, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param,
            code,
            retry_after: None,
        }
    }

    fn server(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
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
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
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
    match e {
        EngineError::EmptyText => ApiError::bad("empty_input", Some("input"), e.to_string()),
        EngineError::Talker(_) => ApiError::bad("invalid_request", None, e.to_string()),
        _ => ApiError::server(StatusCode::INTERNAL_SERVER_ERROR, "engine_error", e.to_string()),
    }
}

/// `voice`: a name or `{"id": name}`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum VoiceField {
    Name(String),
    Object { id: String },
}

/// The body of `POST /v1/audio/speech`: OpenAI's fields and the Qwen3-TTS extensions (vLLM-Omni's
/// names). Unknown fields are ignored; `null` is the same as absent.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SpeechBody {
    model: Option<String>,
    input: Option<String>,
    voice: Option<VoiceField>,
    speaker: Option<String>,
    instructions: Option<String>,
    response_format: Option<String>,
    speed: Option<f64>,
    stream_format: Option<String>,
    stream: Option<bool>,
    language: Option<String>,
    task_type: Option<String>,
    max_new_tokens: Option<u64>,
    seed: Option<u64>,
    temperature: Option<f32>,
    top_k: Option<usize>,
    top_p: Option<f32>,
    repetition_penalty: Option<f32>,
    speaker_embedding: Option<Vec<f32>>,
    ref_audio: Option<Value>,
    ref_text: Option<String>,
    non_streaming_mode: Option<bool>,
    sample_rate: Option<u32>,
}

/// What the response looks like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Delivery {
    /// Raw bytes as they are made.
    Stream,
    /// `speech.audio.delta` / `speech.audio.done` events.
    Sse,
    /// One file with `Content-Length` (`"stream": false`).
    Buffered,
}

struct Parsed {
    req: Request,
    format: Format,
    delivery: Delivery,
    speed_ignored: bool,
    instructions_ignored: bool,
}

/// The name of the JSON field a serde error is about, for `param`.
fn field_of(path: &str) -> Option<&'static str> {
    const FIELDS: [&str; 22] = [
        "model", "input", "voice", "speaker", "instructions", "response_format", "speed",
        "stream_format", "stream", "language", "task_type", "max_new_tokens", "seed",
        "temperature", "top_k", "top_p", "repetition_penalty", "speaker_embedding", "ref_audio",
        "ref_text", "non_streaming_mode", "sample_rate",
    ];
    let head = path.split(['.', '[']).next().unwrap_or("");
    FIELDS.iter().find(|f| **f == head).copied()
}

fn parse(app: &App, body: &[u8]) -> Result<Parsed, ApiError> {
    let svc = &app.svc;
    let info = svc.info();
    let de = &mut serde_json::Deserializer::from_slice(body);
    let b: SpeechBody = serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let param = field_of(&path);
        let code = if param.is_some() { "invalid_type" } else { "invalid_json" };
        ApiError::bad(code, param, format!("the body is not the JSON expected: {e}"))
    })?;
    if app.opts.strict_model {
        if let Some(m) = &b.model {
            if m != &svc.model_id {
                let mut e = ApiError::bad(
                    "model_not_found",
                    Some("model"),
                    format!("model '{m}' is not served here; this server serves '{}'", svc.model_id),
                );
                e.status = StatusCode::NOT_FOUND;
                return Err(e);
            }
        }
    }
    let input = b.input.as_deref().map(str::trim).unwrap_or("");
    if b.input.is_none() {
        return Err(ApiError::bad("missing_input", Some("input"), "'input' is required: the text to speak"));
    }
    if input.is_empty() {
        return Err(ApiError::bad("empty_input", Some("input"), "'input' is empty: give the text to speak"));
    }
    let chars = input.chars().count();
    if chars > svc.limits.max_input_chars {
        return Err(ApiError::bad(
            "input_too_long",
            Some("input"),
            format!(
                "'input' has {chars} characters; at most {} are taken per request: split the text",
                svc.limits.max_input_chars
            ),
        ));
    }
    let format = match b.response_format.as_deref() {
        None => Format::Mp3,
        Some(f) => Format::parse(f).ok_or_else(|| {
            ApiError::bad(
                "unsupported_response_format",
                Some("response_format"),
                format!("response_format '{f}' is not supported; use one of pcm, wav, mp3, opus, flac"),
            )
        })?,
    };
    let delivery = match (b.stream_format.as_deref(), b.stream) {
        (Some("sse"), _) => Delivery::Sse,
        (Some("audio") | None, Some(false)) => Delivery::Buffered,
        (Some("audio") | None, _) => Delivery::Stream,
        (Some(other), _) => {
            return Err(ApiError::bad(
                "invalid_stream_format",
                Some("stream_format"),
                format!("stream_format '{other}' is neither 'audio' nor 'sse'"),
            ))
        }
    };
    let speed = b.speed.unwrap_or(1.0);
    if !(0.25..=4.0).contains(&speed) {
        return Err(ApiError::bad(
            "invalid_speed",
            Some("speed"),
            format!("speed {speed} is outside 0.25 to 4.0"),
        ));
    }
    if let Some(r) = b.sample_rate {
        if r != crate::encode::RATE {
            return Err(ApiError::bad(
                "unsupported_sample_rate",
                Some("sample_rate"),
                format!("sample_rate {r}: this server makes 24000 Hz only"),
            ));
        }
    }
    if b.ref_audio.is_some() || b.ref_text.is_some() {
        return Err(ApiError::bad(
            "not_supported",
            Some("ref_audio"),
            "voice cloning from reference audio is not available yet; give a saved voice or 'speaker_embedding'",
        ));
    }
    if let Some(t) = &b.task_type {
        let want = match t.as_str() {
            "CustomVoice" => "custom_voice",
            "VoiceDesign" => "voice_design",
            "Base" => "base",
            other => other,
        };
        if want != info.model_type {
            return Err(ApiError::bad(
                "task_type_mismatch",
                Some("task_type"),
                format!("task_type '{t}' does not match the served model, a {} model", info.model_type),
            ));
        }
    }
    let name = match &b.voice {
        Some(VoiceField::Name(n)) => Some(n.as_str()),
        Some(VoiceField::Object { id }) => Some(id.as_str()),
        None => b.speaker.as_deref(),
    };
    let mut voice = svc.voice(name).map_err(|names| {
        ApiError::bad(
            "voice_not_found",
            Some("voice"),
            format!("voice '{}' is unknown; available: {names}", name.unwrap_or("")),
        )
    })?;
    if let Some(l) = &b.language {
        voice.language = Some(svc.language(l).ok_or_else(|| {
            ApiError::bad(
                "unsupported_language",
                Some("language"),
                format!("language '{l}' is unknown; the model has: {}", info.languages.join(", ")),
            )
        })?);
    }
    let mut instructions_ignored = false;
    if let Some(i) = b.instructions.as_deref().map(str::trim).filter(|i| !i.is_empty()) {
        if i.chars().count() > svc.limits.max_input_chars {
            return Err(ApiError::bad(
                "instructions_too_long",
                Some("instructions"),
                format!("'instructions' is longer than {} characters", svc.limits.max_input_chars),
            ));
        }
        // Home Assistant always sends a string; models without instruction support skip it.
        if info.model_type == "voice_design" || info.size == "1b7" {
            voice.instruct = Some(i.to_owned());
        } else {
            instructions_ignored = true;
        }
    }
    if let Some(x) = b.speaker_embedding {
        if x.len() != info.hidden || x.iter().any(|v| !v.is_finite()) {
            return Err(ApiError::bad(
                "invalid_speaker_embedding",
                Some("speaker_embedding"),
                format!(
                    "speaker_embedding has {} values; the model takes {} finite values",
                    x.len(),
                    info.hidden
                ),
            ));
        }
        voice.xvector = Some(x);
    }
    let mut req = Request::text(input);
    req.voice = voice;
    if b.non_streaming_mode == Some(true) {
        req.mode = TextMode::NonStreaming;
    }
    if let Some(s) = b.seed {
        req.seed = s;
    }
    // Without max_new_tokens the engine's runaway guard, scaled to the text, caps each utterance.
    req.max_frames = match b.max_new_tokens {
        Some(0) => {
            return Err(ApiError::bad(
                "invalid_max_new_tokens",
                Some("max_new_tokens"),
                "max_new_tokens must be at least 1",
            ))
        }
        Some(n) => Some((n as usize).min(svc.limits.max_frames)),
        None => None,
    };
    if b.temperature.is_some() || b.top_k.is_some() || b.top_p.is_some() {
        let t = b.temperature.unwrap_or(0.9);
        if !(t.is_finite() && t >= 0.0) {
            return Err(ApiError::bad("invalid_temperature", Some("temperature"), "temperature must be 0 (greedy) or above"));
        }
        let p = b.top_p.unwrap_or(1.0);
        if !(p > 0.0 && p <= 1.0) {
            return Err(ApiError::bad("invalid_top_p", Some("top_p"), "top_p must be in (0, 1]"));
        }
        req.sampling = Some(if t == 0.0 {
            SamplingParams::GREEDY
        } else {
            SamplingParams {
                do_sample: true,
                temperature: t,
                top_k: b.top_k.unwrap_or(50),
                top_p: p,
            }
        });
    }
    if let Some(r) = b.repetition_penalty {
        if !(r.is_finite() && r > 0.0) {
            return Err(ApiError::bad("invalid_repetition_penalty", Some("repetition_penalty"), "repetition_penalty must be above 0"));
        }
        req.repetition_penalty = Some(r);
    }
    Ok(Parsed {
        req,
        format,
        delivery,
        speed_ignored: speed != 1.0,
        instructions_ignored,
    })
}

fn check_key(app: &App, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &app.opts.api_key else {
        return Ok(());
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if given == Some(key.as_str()) {
        return Ok(());
    }
    let mut e = ApiError::bad(
        "invalid_api_key",
        None,
        "the API key is wrong or missing: send 'Authorization: Bearer <key>' with the server's --api-key",
    );
    e.status = StatusCode::UNAUTHORIZED;
    Err(e)
}

fn count(app: &App, format: &'static str, code: impl Into<String>) {
    app.svc
        .metrics
        .requests
        .get_or_create(&crate::metrics::RequestLabels {
            frontend: "http",
            format,
            code: code.into(),
        })
        .inc();
}

async fn speech(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let format_label = "unknown";
    let r = speech_inner(&app, &headers, body).await;
    match r {
        Ok((resp, format)) => {
            count(&app, format.name(), resp.status().as_str());
            resp
        }
        Err(e) => {
            count(&app, format_label, e.status.as_str());
            e.into_response()
        }
    }
}

async fn speech_inner(
    app: &Arc<App>,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(Response, Format), ApiError> {
    check_key(app, headers)?;
    let body = body.map_err(|r| {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            let mut e = ApiError::bad(
                "request_too_large",
                None,
                format!("the body is over {} MiB", BODY_LIMIT >> 20),
            );
            e.status = StatusCode::PAYLOAD_TOO_LARGE;
            e
        } else {
            ApiError::bad("invalid_body", None, r.body_text())
        }
    })?;
    let p = parse(app, &body)?;
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
        ApiError::server(StatusCode::INTERNAL_SERVER_ERROR, "encoder_error", e.to_string())
    })?;
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
    if p.speed_ignored {
        h.insert("x-qtts-warning", HeaderValue::from_static("speed ignored: the model has no rate control"));
    } else if p.instructions_ignored {
        h.insert("x-qtts-warning", HeaderValue::from_static("instructions ignored: this model takes none"));
    }
    Ok((resp, p.format))
}

/// The whole file, for `"stream": false`.
async fn buffered(mut a: Admitted, first: Event, enc: &mut Encoder) -> Result<Response, ApiError> {
    let enc_err = |e: crate::encode::EncodeError| {
        ApiError::server(StatusCode::INTERNAL_SERVER_ERROR, "encoder_error", e.to_string())
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
            Some(Event::End(Ok(_))) => break,
            Some(Event::End(Err(e))) => return Err(engine_error(&e)),
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
    let stop = match s.stop {
        qtts::talker::StopReason::Eos => "eos",
        qtts::talker::StopReason::FrameCap { .. } => "frame_cap",
        qtts::talker::StopReason::Cancelled => "cancelled",
    };
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
            sse("speech.audio.delta", &json!({"type": "speech.audio.delta", "audio": audio}))
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
                Some(Event::End(Ok(summary))) => {
                    st.done = true;
                    let tail = match st.enc.finish() {
                        Ok(t) => t,
                        Err(e) => return Some((Err(fail(e.to_string())), st)),
                    };
                    let mut out = if tail.is_empty() { Bytes::new() } else { wrap(tail) };
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
                    if sse_events {
                        let ev = sse(
                            "speech.audio.error",
                            &json!({"type": "speech.audio.error", "error": {
                                "message": e.to_string(), "type": "server_error",
                                "param": null, "code": "engine_error"}}),
                        );
                        return Some((Ok(ev), st));
                    }
                    return Some((Err(fail(e.to_string())), st));
                }
                Some(Event::QueueTimeout) | None => {
                    st.done = true;
                    return Some((Err(fail("the request ended without its audio".into())), st));
                }
            }
        }
    })
}

async fn voices(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if let Err(e) = check_key(&app, &headers) {
        return e.into_response();
    }
    let info = app.svc.info();
    let langs: Vec<String> = info
        .languages
        .iter()
        .filter(|l| *l != "auto")
        .map(|l| crate::voices::iso_code(l))
        .collect();
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
    v.extend(info.speakers.iter().map(
        |s| json!({"id": s, "name": title(s), "languages": langs, "kind": "speaker"}),
    ));
    if info.speakers.is_empty() {
        v.push(json!({"id": "default", "name": "Default", "languages": langs, "kind": "default"}));
    }
    axum::Json(json!({ "voices": v })).into_response()
}

/// The names OpenAI clients send as `model`, listed beside the served model.
const MODEL_ALIASES: [&str; 3] = ["tts-1", "tts-1-hd", "gpt-4o-mini-tts"];

async fn models(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if let Err(e) = check_key(&app, &headers) {
        return e.into_response();
    }
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let data: Vec<Value> = std::iter::once(app.svc.model_id.as_str())
        .chain(MODEL_ALIASES)
        .map(|id| json!({"id": id, "object": "model", "created": created, "owned_by": "qtts"}))
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

async fn audio_models(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if let Err(e) = check_key(&app, &headers) {
        return e.into_response();
    }
    let m: Vec<Value> = std::iter::once(app.svc.model_id.as_str())
        .chain(MODEL_ALIASES)
        .map(|id| json!({"id": id, "name": id}))
        .collect();
    axum::Json(json!({ "models": m })).into_response()
}

async fn livez(State(app): State<Arc<App>>) -> Response {
    if app.svc.is_live() {
        (StatusCode::OK, "ok\n").into_response()
    } else {
        (StatusCode::INTERNAL_SERVER_ERROR, "an engine stage died; restart the server\n").into_response()
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
        "running": svc.in_flight().saturating_sub(queue).min(1),
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
    fn body_fields_parse_both_voice_forms_nulls_and_unknowns() {
        let b: SpeechBody = serde_json::from_str(
            r#"{"model":"tts-1","input":"hi","voice":{"id":"vivian"},"speed":null,"extra":[1,2]}"#,
        )
        .unwrap();
        assert!(matches!(b.voice, Some(VoiceField::Object { ref id }) if id == "vivian"));
        assert_eq!(b.speed, None);
        let b: SpeechBody = serde_json::from_str(r#"{"input":"hi","voice":"ash"}"#).unwrap();
        assert!(matches!(b.voice, Some(VoiceField::Name(ref n)) if n == "ash"));
        assert_eq!(field_of("speed"), Some("speed"));
        assert_eq!(field_of("speaker_embedding[3]"), Some("speaker_embedding"));
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
