//! The Wyoming front end (Home Assistant's local voice protocol, wyoming 1.10.2): `describe` →
//! `info`, one-shot `synthesize`, streaming `synthesize-start/-chunk/-stop` →
//! `synthesize-stopped`, audio as `audio-start/-chunk/-stop` at 24 kHz s16 mono, `ping` →
//! `pong`, errors as an `error` event after which the connection is closed.
//!
//! Framing (`framing.rs`): a JSON header line, then `data_length` bytes of JSON data (no newline),
//! then `payload_length` bytes of payload. Per connection, a reader (this task) owns the state; a
//! synthesis task speaks the work in order; a writer task owns the socket's write half. EOF on
//! the read side cancels the request in flight at once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use crate::encode::push_s16le;
use crate::service::{Event as Audio, Pending, Refused, Service};

/// Wait for the first event of a connection: 30 s.
const IDLE_FIRST: Duration = Duration::from_secs(30);
/// Wait between events once a conversation started (LLM pauses in a stream): 120 s.
const IDLE_BETWEEN: Duration = Duration::from_secs(120);
/// Frames queued for the writer: 64 (with chunks of 4 frames, 20 s of audio).
const WRITE_QUEUE: usize = 64;
/// Sentences queued for synthesis per connection: 64.
const WORK_QUEUE: usize = 64;

mod framing;

use crate::sentences::{Cutter, Sentence};
pub use crate::sentences::{Live, LivePiece, Sentences};
pub use framing::{frame, read_event, Event, FrameError, MAX_BLOCK, MAX_HEADER, VERSION};

/// The `info` event, built once: it answers `describe` at once whatever the engine is doing.
pub fn info_event(svc: &Service) -> Vec<u8> {
    let info = svc.info();
    let languages = crate::voices::iso_codes(info);
    let attribution = json!({"name": "Qwen", "url": "https://huggingface.co/Qwen"});
    let version = env!("CARGO_PKG_VERSION");
    let voice = |name: &str, description: String| {
        json!({"name": name, "attribution": attribution, "installed": true,
               "description": description, "version": version, "languages": languages,
               "speakers": null})
    };
    let mut voices: Vec<Value> = svc
        .voices
        .profiles()
        .map(|p| voice(p, format!("{p} (voice profile)")))
        .collect();
    voices.extend(info.speakers.iter().map(|s| voice(s, s.clone())));
    if info.speakers.is_empty() {
        voices.push(voice("default", "default voice".into()));
    }
    let tts = json!({
        "name": "qtts",
        "attribution": attribution,
        "installed": true,
        "description": format!("Qwen3-TTS-12Hz {} {} (qtts {version})", info.size, info.model_type),
        "version": version,
        "voices": voices,
        "supports_synthesize_streaming": true,
    });
    let data = json!({"asr": [], "tts": [tts], "handle": [], "intent": [], "wake": [],
                      "mic": [], "snd": []});
    frame("info", Some(&data), &[])
}

/// Open Wyoming connections at most: 64 (Home Assistant opens one per request); past it new ones
/// are closed at once.
pub const MAX_CONNECTIONS: usize = 64;

/// Accepts connections until the task is dropped.
pub async fn serve(listener: TcpListener, svc: Arc<Service>) {
    let info = Arc::new(info_event(&svc));
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok((sock, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        if svc.is_draining() {
            continue;
        }
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            continue;
        };
        let _ = sock.set_nodelay(true);
        let (svc, info) = (svc.clone(), info.clone());
        tokio::spawn(async move {
            connection(sock, svc, info).await;
            drop(permit);
        });
    }
}

/// What the synthesis task of a connection does, in order.
enum Work {
    /// Speak this text (one `audio-start` … `audio-stop`).
    Speak { text: String, voice: Option<Value> },
    /// Speak a sentence while its text streams in (the connection holds its writer).
    Fed {
        feed: qtts::engine::TextFeedHandle,
        voice: Option<Value>,
    },
    /// Send `synthesize-stopped` (after the stream's sentences).
    Stopped,
}

/// An error to send before closing.
struct Fail {
    text: String,
    code: &'static str,
}

impl Fail {
    /// The `error` event.
    fn frame(&self) -> Vec<u8> {
        frame(
            "error",
            Some(&json!({"text": self.text, "code": self.code})),
            &[],
        )
    }
}

/// Counts a Wyoming request that ended `code` (`ok` or an error code).
fn count(svc: &Service, code: &str) {
    svc.metrics.count_request("wyoming", "wyoming", code);
}

async fn connection(sock: TcpStream, svc: Arc<Service>, info: Arc<Vec<u8>>) {
    let (rd, mut wr) = sock.into_split();
    let mut rd = BufReader::new(rd);
    let (out_tx, mut out_rx) = mpsc::channel::<Vec<u8>>(WRITE_QUEUE);
    let (close_tx, mut close_rx) = tokio::sync::watch::channel(false);
    let close_tx = Arc::new(close_tx);
    // A client that takes nothing for `write_stall` (it sends but never reads) is dropped: the
    // writer gives up, and the reader and the synthesis task close with it.
    let stall = svc.limits.write_stall;
    let writer = {
        let close = close_tx.clone();
        tokio::spawn(async move {
            while let Some(f) = out_rx.recv().await {
                match tokio::time::timeout(stall, wr.write_all(&f)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) | Err(_) => {
                        let _ = close.send(true);
                        return;
                    }
                }
            }
            let _ = tokio::time::timeout(stall, wr.shutdown()).await;
        })
    };
    let (work_tx, work_rx) = mpsc::channel::<Work>(WORK_QUEUE);
    let busy = Pending::default();
    let synth = tokio::spawn(synthesis(
        svc.clone(),
        work_rx,
        out_tx.clone(),
        close_tx,
        busy.clone(),
    ));
    let mut streaming: Option<Streaming> = None;
    let mut chars = 0usize;
    let mut first = true;
    // Idle time counts only while nothing is being spoken for this connection.
    let mut last = Instant::now();
    loop {
        let ev = {
            let read = read_event(&mut rd);
            tokio::pin!(read);
            loop {
                tokio::select! {
                    r = &mut read => break Some(r),
                    _ = close_rx.changed() => break None,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {
                        let limit = if first { IDLE_FIRST } else { IDLE_BETWEEN };
                        if busy.any() {
                            last = Instant::now();
                        } else if last.elapsed() > limit {
                            break None;
                        }
                    }
                }
            }
        };
        let ev = match ev {
            Some(Ok(Some(e))) => e,
            // Closed by the synthesis task, EOF, a broken frame, or idle: the connection ends (a
            // broken frame gets no reply: the stream cannot be resynchronised).
            None | Some(Ok(None)) | Some(Err(_)) => break,
        };
        first = false;
        last = Instant::now();
        let text_of = |e: &Event| {
            e.data
                .get("text")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned()
        };
        let names = check_names(&ev);
        let mut fail = None;
        match ev.kind.as_str() {
            "describe" if out_tx.send((*info).clone()).await.is_err() => break,
            "describe" => {}
            "ping" => {
                let text = ev.data.get("text").cloned().unwrap_or(Value::Null);
                if out_tx
                    .send(frame("pong", Some(&json!({"text": text})), &[]))
                    .await
                    .is_err()
                {
                    break;
                }
            }
            "synthesize" if streaming.is_some() => {
                // Home Assistant's compatibility copy of the streamed text: already spoken.
            }
            "synthesize" => {
                let text = text_of(&ev);
                chars += text.chars().count();
                if let Err(f) = names {
                    fail = Some(f);
                } else if !ev.data.get("text").is_some_and(Value::is_string) {
                    fail = Some(Fail {
                        text: "synthesize needs data.text, the text to speak (a string)".into(),
                        code: "invalid_request",
                    });
                } else if text.trim().is_empty() {
                    fail = Some(Fail {
                        text: "synthesize's text is empty: give the text to speak".into(),
                        code: "empty_input",
                    });
                } else if chars > svc.limits.max_input_chars {
                    fail = Some(too_long(&svc));
                } else if busy
                    .send(
                        &work_tx,
                        Work::Speak {
                            text,
                            voice: ev.data.get("voice").cloned(),
                        },
                    )
                    .await
                    .is_err()
                {
                    break;
                }
            }
            "synthesize-start" => match names {
                Ok(()) => {
                    let voice = ev.data.get("voice").cloned();
                    // Each sentence spoken from its first word where the text mode allows it
                    // (a text feed takes the streaming mode), else once it is complete.
                    let cut = Cutter::new(svc.text_mode);
                    streaming = Some(Streaming { cut, voice });
                }
                Err(f) => fail = Some(f),
            },
            "synthesize-chunk" => {
                if let Some(st) = &mut streaming {
                    let text = text_of(&ev);
                    chars += text.chars().count();
                    if chars > svc.limits.max_input_chars {
                        fail = Some(too_long(&svc));
                    } else if st.push(&text, &work_tx, &busy).await.is_err() {
                        break;
                    }
                }
            }
            "synthesize-stop" => {
                if let Some(mut st) = streaming.take() {
                    let _ = st.finish(&work_tx, &busy).await;
                }
                // Answered after the work queued, a stop without a start included.
                let _ = busy.send(&work_tx, Work::Stopped).await;
            }
            // Servers drop events they do not know (audio from a client, select-program, ...).
            _ => {}
        }
        if let Some(f) = fail {
            count(&svc, f.code);
            let _ = out_tx.send(f.frame()).await;
            break;
        }
    }
    // The client is gone or the conversation failed: stop what runs (its Admitted is dropped
    // with the task, which cancels the job), and let the writer flush and close.
    synth.abort();
    let _ = synth.await;
    drop(work_tx);
    drop(out_tx);
    let _ = writer.await;
}

/// A streamed synthesis in progress on a connection.
struct Streaming {
    cut: Cutter,
    voice: Option<Value>,
}

type Closed = mpsc::error::SendError<Work>;

impl Streaming {
    /// Takes a `synthesize-chunk`'s text: queues the sentences it completes, or the fed request
    /// of each sentence it begins.
    async fn push(
        &mut self,
        text: &str,
        tx: &mpsc::Sender<Work>,
        busy: &Pending,
    ) -> Result<(), Closed> {
        for sentence in self.cut.push(text) {
            self.queue(sentence, tx, busy).await?;
        }
        Ok(())
    }

    /// `synthesize-stop`: the rest is spoken.
    async fn finish(&mut self, tx: &mpsc::Sender<Work>, busy: &Pending) -> Result<(), Closed> {
        match self.cut.finish() {
            Some(sentence) => self.queue(sentence, tx, busy).await,
            None => Ok(()),
        }
    }

    async fn queue(
        &self,
        sentence: Sentence,
        tx: &mpsc::Sender<Work>,
        busy: &Pending,
    ) -> Result<(), Closed> {
        let voice = self.voice.clone();
        let work = match sentence {
            Sentence::Whole(text) => Work::Speak { text, voice },
            Sentence::Fed(feed) => Work::Fed { feed, voice },
        };
        busy.send(tx, work).await
    }
}

/// Refuses a voice name, speaker or language longer than the HTTP API takes
/// ([`crate::speech::MAX_NAME_CHARS`]).
fn check_names(ev: &Event) -> Result<(), Fail> {
    let Some(voice) = ev.data.get("voice") else {
        return Ok(());
    };
    for key in ["name", "speaker", "language"] {
        let n = voice
            .get(key)
            .and_then(Value::as_str)
            .map_or(0, |s| s.chars().count());
        if n > crate::speech::MAX_NAME_CHARS {
            return Err(Fail {
                text: format!(
                    "voice.{key} has {n} characters; at most {} are taken",
                    crate::speech::MAX_NAME_CHARS
                ),
                code: "field_too_long",
            });
        }
    }
    Ok(())
}

fn too_long(svc: &Service) -> Fail {
    Fail {
        text: format!(
            "the text is over {} characters for one connection; split it",
            svc.limits.max_input_chars
        ),
        code: "input_too_long",
    }
}

/// Speaks the connection's work in order; on an error, sends it and asks the reader to close.
async fn synthesis(
    svc: Arc<Service>,
    mut work: mpsc::Receiver<Work>,
    out: mpsc::Sender<Vec<u8>>,
    close: Arc<tokio::sync::watch::Sender<bool>>,
    busy: Pending,
) {
    // Samples sent on this connection: the audio limit counts per connection, as HTTP's counts
    // per request.
    let mut sent = 0usize;
    while let Some(w) = work.recv().await {
        let _done = busy.take();
        let r = match w {
            Work::Speak { text, voice } => {
                speak(&svc, Text::Whole(&text), voice.as_ref(), &out, &mut sent).await
            }
            Work::Fed { feed, voice } => {
                speak(&svc, Text::Fed(feed), voice.as_ref(), &out, &mut sent).await
            }
            Work::Stopped => out
                .send(frame("synthesize-stopped", None, &[]))
                .await
                .map_err(|_| None),
        };
        match r {
            Ok(()) => {}
            Err(None) => break,
            Err(Some(f)) => {
                count(&svc, f.code);
                let _ = out.send(f.frame()).await;
                break;
            }
        }
    }
    let _ = close.send(true);
}

/// What one `audio-start` … `audio-stop` speaks.
enum Text<'a> {
    /// A whole text.
    Whole(&'a str),
    /// A sentence still streaming in.
    Fed(qtts::engine::TextFeedHandle),
}

/// Speaks one text; `Err(None)`: the client is gone, `Err(Some)`: an error to send.
async fn speak(
    svc: &Arc<Service>,
    text: Text<'_>,
    voice: Option<&Value>,
    out: &mpsc::Sender<Vec<u8>>,
    sent: &mut usize,
) -> Result<(), Option<Fail>> {
    let max_samples = svc.limits.max_samples();
    let over_limit = || {
        Some(Fail {
            text: crate::service::over_limit_message(svc.limits.max_audio_seconds),
            code: "audio_limit",
        })
    };
    if *sent >= max_samples {
        return Err(over_limit());
    }
    let fed = matches!(text, Text::Fed(_));
    if let Text::Whole(t) = text {
        if t.trim().is_empty() {
            return Ok(());
        }
    }
    let name = voice
        .and_then(|v| v.get("speaker").and_then(Value::as_str))
        .filter(|s| !s.is_empty())
        .or_else(|| voice.and_then(|v| v.get("name").and_then(Value::as_str)));
    let language = voice.and_then(|v| v.get("language").and_then(Value::as_str));
    let v = svc.voice_in(name, language).map_err(|r| {
        Some(Fail {
            text: r.message,
            code: r.code,
        })
    })?;
    let mut req = match text {
        Text::Whole(t) => qtts::engine::Request::text(t.trim()),
        Text::Fed(feed) => qtts::engine::Request::fed(feed),
    };
    req.voice = v;
    req.mode = svc.text_mode;
    req.frame_limit = Some(svc.limits.max_frames);
    let mut job = svc.admit(req, "wyoming").map_err(|r| {
        Some(match r {
            Refused::Busy { .. } | Refused::Draining => Fail {
                text: "server busy: the queue is full; try again".into(),
                code: "busy",
            },
            Refused::Engine(e) => Fail {
                text: e.to_string(),
                code: "engine_error",
            },
        })
    })?;
    let fmt = json!({"rate": 24_000, "width": 2, "channels": 1});
    let t0 = Instant::now();
    let send = |f: Vec<u8>| async move { out.send(f).await.map_err(|_| None::<Fail>) };
    let mut started = false;
    loop {
        match job.next().await {
            Some(Audio::Audio(c)) => {
                *sent += c.len();
                if *sent > max_samples {
                    // Dropping the job cancels it.
                    return Err(over_limit());
                }
                if !started {
                    let mut d = fmt.clone();
                    d["timestamp"] = json!(0);
                    // The engine's order (`Admitted::order`), for clients that check it.
                    let (seq, after) = job.order();
                    d["qtts_job"] = json!(seq);
                    d["qtts_after_job"] = json!(after);
                    send(frame("audio-start", Some(&d), &[])).await?;
                    started = true;
                }
                let mut pcm = Vec::with_capacity(c.len() * 2);
                push_s16le(&c, &mut pcm);
                let mut d = fmt.clone();
                d["timestamp"] = json!(t0.elapsed().as_millis() as u64);
                send(frame("audio-chunk", Some(&d), &pcm)).await?;
            }
            Some(Audio::End(Ok(s))) if s.stop == qtts::talker::StopReason::Cancelled => {
                return Err(Some(Fail {
                    text: crate::service::CUT_SHORT.into(),
                    code: "cancelled",
                }))
            }
            Some(Audio::End(Ok(_))) => {
                if !started {
                    send(frame("audio-start", Some(&fmt), &[])).await?;
                }
                let d = json!({"timestamp": t0.elapsed().as_millis() as u64});
                send(frame("audio-stop", Some(&d), &[])).await?;
                count(svc, "ok");
                return Ok(());
            }
            // A sentence that turned out to have nothing to speak, as a blank one is skipped.
            Some(Audio::End(Err(qtts::engine::EngineError::EmptyText))) if fed && !started => {
                return Ok(())
            }
            Some(Audio::End(Err(e))) => {
                return Err(Some(Fail {
                    text: e.to_string(),
                    code: crate::service::error_code(&e),
                }))
            }
            Some(Audio::OverLimit { .. }) => return Err(over_limit()),
            Some(Audio::QueueTimeout) => {
                return Err(Some(Fail {
                    text: "server busy: the request waited too long in the queue".into(),
                    code: "busy",
                }))
            }
            None => {
                return Err(Some(Fail {
                    text: "the request ended without its audio".into(),
                    code: "engine_error",
                }))
            }
        }
    }
}
