//! Cloning per request (`ref_audio`, `ref_text`, `x_vector_only_mode`, vLLM-Omni's fields) on a
//! Base model: the reference arrives as a base64 data URL, is decoded, encoded by the model's
//! speaker and codec encoders off the async threads, and spoken with.
//!
//! Bounds: one cloning at a time ([`CLONINGS`]); a request waits for it at most the queue
//! timeout, then gets 503. The last [`CACHED`] voices are kept by the SHA-256 of their audio and
//! transcript, so a client that sends the same reference with every request pays the encoders
//! once and gets the engine's prompt and decoder reuse after that. The server fetches nothing:
//! `http(s)://` and `file://` references are refused.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::StatusCode;
use base64::Engine as _;
use qtts::gguf::GgufFile;
use qtts::model::ModelFiles;
use qtts::talker::Voice;
use qtts::voice::{SharedCloner, VoiceError};
use sha2::{Digest, Sha256};

use crate::http::ApiError;

/// Clonings that may run at once: each takes the cores it is given for about half a second per
/// 10 s of reference.
pub const CLONINGS: usize = 1;
/// Cloned voices kept for requests that send the same reference again.
pub const CACHED: usize = 4;

/// A reference a request gave: the decoded bytes and what is said in them.
#[derive(Debug)]
pub struct Reference {
    /// The audio file's bytes (WAV, FLAC, MP3, Ogg/Vorbis).
    pub audio: Vec<u8>,
    /// The file type the data URL named (`wav`, `mpeg`, ...), a hint for the decoder.
    pub extension: Option<String>,
    /// The transcript; `None`: the x-vector alone (`x_vector_only_mode`).
    pub text: Option<String>,
}

/// The model's encoders, loaded on first use, and the recent voices.
#[derive(Debug)]
pub struct RefCloner {
    mmproj: GgufFile,
    cloner: SharedCloner,
    permits: Arc<tokio::sync::Semaphore>,
    recent: Mutex<VecDeque<([u8; 32], Voice)>>,
}

impl RefCloner {
    /// For a Base model's `files` (another model is refused); encodes on `threads` threads. The
    /// encoders load on the first reference.
    pub fn new(files: ModelFiles, threads: usize) -> Result<RefCloner, VoiceError> {
        let mmproj = GgufFile::open(&files.mmproj)?;
        let model = qtts::voice::clone::model_of(&mmproj)?;
        if model.model_type != "base" {
            return Err(VoiceError::NotBase {
                model_type: model.model_type,
            });
        }
        Ok(RefCloner {
            mmproj,
            cloner: SharedCloner::new(files, threads),
            permits: Arc::new(tokio::sync::Semaphore::new(CLONINGS)),
            recent: Mutex::new(VecDeque::new()),
        })
    }

    /// The voice of `r` (no language set), cloned or from the recent ones; waits at most `wait`
    /// for the encoders.
    pub async fn voice(self: &Arc<Self>, r: Reference, wait: Duration) -> Result<Voice, ApiError> {
        let mut h = Sha256::new();
        h.update(&r.audio);
        h.update([0xff]);
        h.update(r.text.as_deref().unwrap_or("").as_bytes());
        let key: [u8; 32] = h.finalize().into();
        if let Some(v) = self.recent(&key) {
            return Ok(v);
        }
        let busy = || {
            let mut e = ApiError::server(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_overloaded",
                format!(
                    "another reference is being cloned and this one waited {} s; retry later",
                    wait.as_secs()
                ),
            );
            e.retry_after = Some(wait.as_secs().max(1));
            e
        };
        let permit = tokio::time::timeout(wait, Arc::clone(&self.permits).acquire_owned())
            .await
            .map_err(|_| busy())?
            .map_err(|_| busy())?;
        // A request with the same reference may have cloned it while this one waited.
        if let Some(v) = self.recent(&key) {
            return Ok(v);
        }
        let me = Arc::clone(self);
        // The permit goes with the work: a client that leaves does not free it for another
        // cloning while this one still runs.
        let voice = tokio::task::spawn_blocking(move || {
            let voice = me.clone_now(r);
            drop(permit);
            voice
        })
        .await
        .map_err(|e| {
            ApiError::server(
                StatusCode::INTERNAL_SERVER_ERROR,
                "clone_error",
                format!("the cloning task failed: {e}; report this"),
            )
        })??;
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        if recent.len() == CACHED {
            recent.pop_front();
        }
        recent.push_back((key, voice.clone()));
        Ok(voice)
    }

    fn recent(&self, key: &[u8; 32]) -> Option<Voice> {
        let recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        recent
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    }

    /// Decodes and encodes `r` on this thread.
    fn clone_now(&self, r: Reference) -> Result<Voice, ApiError> {
        let audio = qtts::voice::audio_in::load_reference_bytes(r.audio, r.extension.as_deref())
            .map_err(|e| ApiError::bad("invalid_ref_audio", Some("ref_audio"), e.to_string()))?;
        let cloned = self
            .cloner
            .clone_voice(&audio, r.text.as_deref())
            .map_err(request_error)?;
        qtts::voice::speaking_voice(&self.mmproj, &cloned, None).map_err(internal)
    }
}

/// A cloning error the request caused (400), or one of the server's (500).
fn request_error(e: VoiceError) -> ApiError {
    match e {
        VoiceError::Audio(_) | VoiceError::BadInput { .. } => {
            ApiError::bad("invalid_ref_audio", Some("ref_audio"), e.to_string())
        }
        VoiceError::NoCodecEncoder => ApiError::bad(
            "not_supported",
            Some("ref_text"),
            format!("{e}; or send x_vector_only_mode: true"),
        ),
        e => internal(e),
    }
}

fn internal(e: VoiceError) -> ApiError {
    ApiError::server(
        StatusCode::INTERNAL_SERVER_ERROR,
        "clone_error",
        e.to_string(),
    )
}

/// `ref_audio` as a request gives it: a `data:` URL (`data:audio/wav;base64,...`) or bare
/// base64. Returns the bytes and the file type the URL names.
pub fn decode_ref_audio(s: &str) -> Result<(Vec<u8>, Option<String>), ApiError> {
    let bad = |m: String| ApiError::bad("invalid_ref_audio", Some("ref_audio"), m);
    let s = s.trim();
    let lower = s.get(..8).unwrap_or(s).to_ascii_lowercase();
    if lower.starts_with("http://") || lower.starts_with("https://") || lower.starts_with("file:") {
        return Err(ApiError::bad(
            "unsupported_ref_audio",
            Some("ref_audio"),
            "this server fetches and reads no reference itself; send the audio in the request as \
             a base64 data URL (data:audio/wav;base64,...)",
        ));
    }
    let (extension, data) = match s.strip_prefix("data:") {
        Some(rest) => {
            let (meta, data) = rest
                .split_once(',')
                .ok_or_else(|| bad("a data URL without ',' before its data".into()))?;
            if !meta.ends_with(";base64") {
                return Err(bad(format!(
                    "a data URL that is not base64 ('data:{meta},'); expected \
                     data:audio/...;base64,"
                )));
            }
            let mime = meta.trim_end_matches(";base64");
            let ext = mime
                .split_once('/')
                .map(|(_, sub)| sub.trim_start_matches("x-").to_ascii_lowercase());
            (ext, data)
        }
        None => (None, s),
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .map_err(|e| bad(format!("the audio is not valid base64: {e}")))?;
    Ok((bytes, extension))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ref_audio_is_a_data_url_or_base64_and_nothing_is_fetched() {
        let (b, ext) = decode_ref_audio("data:audio/wav;base64,UklGRg==").unwrap();
        assert_eq!((b.as_slice(), ext.as_deref()), (&b"RIFF"[..], Some("wav")));
        let (b, ext) = decode_ref_audio("UklGRg==").unwrap();
        assert_eq!((b.as_slice(), ext), (&b"RIFF"[..], None));
        assert_eq!(
            decode_ref_audio("data:audio/x-flac;base64,ZkxhQw==")
                .unwrap()
                .1
                .as_deref(),
            Some("flac")
        );
        for (s, code) in [
            ("https://example.com/a.wav", "unsupported_ref_audio"),
            ("file:///etc/passwd", "unsupported_ref_audio"),
            ("data:audio/wav,RIFF", "invalid_ref_audio"),
            ("data:audio/wav;base64", "invalid_ref_audio"),
            ("not base64!", "invalid_ref_audio"),
        ] {
            assert_eq!(decode_ref_audio(s).unwrap_err().code, code, "{s}");
        }
    }
}
