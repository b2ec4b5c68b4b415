//! The body of `POST /v1/audio/speech`, checked and turned into an engine [`Request`]: OpenAI's
//! fields, the Qwen3-TTS extensions (vLLM-Omni's names), and the server's limits.

use axum::http::StatusCode;
use qtts::engine::Request;
use qtts::sampling::SamplingOverrides;
use qtts::talker::TextMode;
use serde::Deserialize;
use serde_json::Value;

use crate::clone::{decode_ref_audio, Reference};
use crate::encode::Format;
use crate::http::{ApiError, HttpOptions};
use crate::service::Service;

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
    x_vector_only_mode: Option<bool>,
    non_streaming_mode: Option<bool>,
    sample_rate: Option<u32>,
}

/// What the response looks like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Delivery {
    /// Raw bytes as they are made.
    Stream,
    /// `speech.audio.delta` / `speech.audio.done` events.
    Sse,
    /// One file with `Content-Length` (`"stream": false`).
    Buffered,
}

pub(crate) struct Parsed {
    pub(crate) req: Request,
    pub(crate) format: Format,
    pub(crate) delivery: Delivery,
    pub(crate) speed_ignored: bool,
    pub(crate) instructions_ignored: bool,
    /// A reference to clone for this request (`ref_audio`), checked but not yet encoded.
    pub(crate) reference: Option<Reference>,
}

/// The name of the JSON field a serde error is about, for `param`.
fn field_of(path: &str) -> Option<&'static str> {
    const FIELDS: [&str; 23] = [
        "model",
        "input",
        "voice",
        "speaker",
        "instructions",
        "response_format",
        "speed",
        "stream_format",
        "stream",
        "language",
        "task_type",
        "max_new_tokens",
        "seed",
        "temperature",
        "top_k",
        "top_p",
        "repetition_penalty",
        "speaker_embedding",
        "ref_audio",
        "ref_text",
        "x_vector_only_mode",
        "non_streaming_mode",
        "sample_rate",
    ];
    let head = path.split(['.', '[']).next().unwrap_or("");
    FIELDS.iter().find(|f| **f == head).copied()
}

/// The longest name a field takes (`model`, `voice`, `speaker`, `language`, ...): 256 characters.
pub(crate) const MAX_NAME_CHARS: usize = 256;

/// The body as exactly one JSON object in UTF-8, as OpenAI's API takes it: no array read by
/// position, nothing after the object, no invalid UTF-8 even in a field this server ignores.
fn body_text(body: &[u8]) -> Result<&str, ApiError> {
    let text = std::str::from_utf8(body).map_err(|e| {
        ApiError::bad(
            "invalid_json",
            None,
            format!(
                "the body is not UTF-8 (byte {} is not): send a JSON object in UTF-8",
                e.valid_up_to()
            ),
        )
    })?;
    if !text.trim_start().starts_with('{') {
        return Err(ApiError::bad(
            "invalid_json",
            None,
            "the body must be one JSON object ({\"input\": ..., \"voice\": ...})",
        ));
    }
    Ok(text)
}

/// Refuses a name field longer than [`MAX_NAME_CHARS`].
fn check_name(field: &'static str, value: Option<&str>) -> Result<(), ApiError> {
    match value.map(|v| v.chars().count()) {
        Some(n) if n > MAX_NAME_CHARS => Err(ApiError::bad(
            "field_too_long",
            Some(field),
            format!("'{field}' has {n} characters; at most {MAX_NAME_CHARS} are taken"),
        )),
        _ => Ok(()),
    }
}

pub(crate) fn parse(svc: &Service, opts: &HttpOptions, body: &[u8]) -> Result<Parsed, ApiError> {
    let info = svc.info();
    let de = &mut serde_json::Deserializer::from_str(body_text(body)?);
    let b: SpeechBody = serde_path_to_error::deserialize(&mut *de).map_err(|e| {
        let path = e.path().to_string();
        let param = field_of(&path);
        let code = if param.is_some() {
            "invalid_type"
        } else {
            "invalid_json"
        };
        ApiError::bad(
            code,
            param,
            format!("the body is not the JSON expected: {e}"),
        )
    })?;
    de.end().map_err(|e| {
        ApiError::bad(
            "invalid_json",
            None,
            format!("the body must be exactly one JSON object, with nothing after it: {e}"),
        )
    })?;
    let voice_name = match &b.voice {
        Some(VoiceField::Name(n)) => Some(n.as_str()),
        Some(VoiceField::Object { id }) => Some(id.as_str()),
        None => None,
    };
    for (field, value) in [
        ("model", b.model.as_deref()),
        ("voice", voice_name),
        ("speaker", b.speaker.as_deref()),
        ("response_format", b.response_format.as_deref()),
        ("stream_format", b.stream_format.as_deref()),
        ("language", b.language.as_deref()),
        ("task_type", b.task_type.as_deref()),
    ] {
        check_name(field, value)?;
    }
    if opts.strict_model {
        if let Some(m) = &b.model {
            if m != &svc.model_id {
                let mut e = ApiError::bad(
                    "model_not_found",
                    Some("model"),
                    format!(
                        "model '{m}' is not served here; this server serves '{}'",
                        svc.model_id
                    ),
                );
                e.status = StatusCode::NOT_FOUND;
                return Err(e);
            }
        }
    }
    let input = b.input.as_deref().map(str::trim).unwrap_or("");
    if b.input.is_none() {
        return Err(ApiError::bad(
            "missing_input",
            Some("input"),
            "'input' is required: the text to speak",
        ));
    }
    if input.is_empty() {
        return Err(ApiError::bad(
            "empty_input",
            Some("input"),
            "'input' is empty: give the text to speak",
        ));
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
                format!(
                    "response_format '{f}' is not supported; use one of pcm, wav, mp3, opus, flac"
                ),
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
            format!(
                "speed {} is outside 0.25 to 4.0",
                qtts::sampling::shown(speed)
            ),
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
    let reference = reference(svc, &b)?;
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
                format!(
                    "task_type '{t}' does not match the served model, a {} model",
                    info.model_type
                ),
            ));
        }
    }
    let name = voice_name.or(b.speaker.as_deref());
    if reference.is_none() && name.is_some_and(|n| n.trim().is_empty()) {
        return Err(ApiError::bad(
            "voice_not_found",
            Some("voice"),
            format!(
                "'voice' is empty: give a voice name, or leave it out for the default; available: {}",
                svc.voices.names(info).join(", ")
            ),
        ));
    }
    // With a reference to clone, a name the server does not know (clients must send one) is the
    // default voice: the reference gives the speaker.
    let resolved = match svc.voice(name) {
        Err(_) if reference.is_some() => svc.voice(None),
        r => r,
    };
    let mut voice = resolved.map_err(|names| {
        ApiError::bad(
            "voice_not_found",
            Some("voice"),
            format!(
                "voice '{}' is unknown; available: {names}",
                name.unwrap_or("")
            ),
        )
    })?;
    if let Some(l) = &b.language {
        voice.language = Some(svc.language(l).ok_or_else(|| {
            ApiError::bad(
                "unsupported_language",
                Some("language"),
                format!(
                    "language '{l}' is unknown; the model has: {}",
                    info.languages.join(", ")
                ),
            )
        })?);
    }
    let mut instructions_ignored = false;
    if let Some(i) = b
        .instructions
        .as_deref()
        .map(str::trim)
        .filter(|i| !i.is_empty())
    {
        if i.chars().count() > svc.limits.max_input_chars {
            return Err(ApiError::bad(
                "instructions_too_long",
                Some("instructions"),
                format!(
                    "'instructions' is longer than {} characters",
                    svc.limits.max_input_chars
                ),
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
    req.mode = match b.non_streaming_mode {
        Some(true) => TextMode::NonStreaming,
        Some(false) if svc.text_mode == TextMode::NonStreaming => TextMode::Streaming,
        _ => svc.text_mode,
    };
    if let Some(s) = b.seed {
        req.seed = s;
    }
    // Without max_new_tokens the engine's runaway guard, scaled to the text, caps each utterance;
    // --max-frames bounds both.
    req.frame_limit = Some(svc.limits.max_frames);
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
    // Each setting over the model's own (generation_config.json), as in the C ABI and Python.
    req.overrides = SamplingOverrides {
        temperature: b.temperature,
        top_k: b.top_k,
        top_p: b.top_p,
    };
    req.repetition_penalty = b.repetition_penalty;
    let checked = req.overrides.check().and_then(|()| {
        req.repetition_penalty
            .map_or(Ok(()), qtts::sampling::check_repetition_penalty)
    });
    if let Err(e) = checked {
        return Err(ApiError::bad(
            match e.setting {
                "temperature" => "invalid_temperature",
                "top_p" => "invalid_top_p",
                _ => "invalid_repetition_penalty",
            },
            Some(e.setting),
            e.to_string(),
        ));
    }
    Ok(Parsed {
        req,
        format,
        delivery,
        speed_ignored: speed != 1.0,
        instructions_ignored,
        reference,
    })
}

/// The request's reference to clone (`ref_audio` with `ref_text`, or `x_vector_only_mode`),
/// checked and decoded from base64; `None` without `ref_audio`.
fn reference(svc: &Service, b: &SpeechBody) -> Result<Option<Reference>, ApiError> {
    // Before anything else is looked at or decoded.
    if let Some(n) = b
        .ref_text
        .as_deref()
        .map(|t| t.chars().count())
        .filter(|&n| n > svc.limits.max_input_chars)
    {
        return Err(ApiError::bad(
            "ref_text_too_long",
            Some("ref_text"),
            format!(
                "'ref_text' has {n} characters; at most {} are taken: give the transcript of a \
                 3 to 10 s reference",
                svc.limits.max_input_chars
            ),
        ));
    }
    let Some(audio) = &b.ref_audio else {
        if b.ref_text.is_some() {
            return Err(ApiError::bad(
                "missing_ref_audio",
                Some("ref_audio"),
                "ref_text is the transcript of ref_audio, which is missing",
            ));
        }
        return Ok(None);
    };
    if svc.cloner.is_none() {
        return Err(ApiError::bad(
            "not_supported",
            Some("ref_audio"),
            format!(
                "cloning from reference audio needs a Base model; this server runs a {} model",
                svc.info().model_type
            ),
        ));
    }
    if b.speaker_embedding.is_some() {
        return Err(ApiError::bad(
            "invalid_request",
            Some("speaker_embedding"),
            "give ref_audio or speaker_embedding, not both",
        ));
    }
    let Value::String(s) = audio else {
        return Err(ApiError::bad(
            "invalid_type",
            Some("ref_audio"),
            "ref_audio is a string: a base64 data URL (data:audio/wav;base64,...)",
        ));
    };
    let (audio, extension) = decode_ref_audio(s)?;
    let text = b
        .ref_text
        .as_deref()
        .map(str::trim)
        .filter(|t| !t.is_empty());
    let text = match (b.x_vector_only_mode == Some(true), text) {
        // The official `x_vector_only_mode` ignores the transcript.
        (true, _) => None,
        (false, Some(t)) => Some(t.to_owned()),
        (false, None) => {
            return Err(ApiError::bad(
                "missing_ref_text",
                Some("ref_text"),
                "in-context cloning needs ref_text, the words spoken in ref_audio; or send \
                 x_vector_only_mode: true to clone from the speaker's x-vector alone",
            ))
        }
    };
    Ok(Some(Reference {
        audio,
        extension,
        text,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
