//! The live speech WebSocket, `GET /v1/audio/speech/live`: text in as it is written (a language
//! model's deltas), audio out as it is made. Each sentence is one request, spoken from its first
//! word in the streaming text mode (the same audio as the sentence sent whole), else once it is
//! complete ([`Cutter`]); the sentences of a session are spoken in order.
//!
//! The protocol (JSON text messages; audio as binary messages of s16le mono PCM at 24 kHz, or as
//! base64 `audio` events):
//!
//! ```text
//! client → server
//!   {"type":"session","voice":"vivian","language":"en","audio":"binary","start":"paced"}
//!                                           optional, before any text
//!   {"type":"text","text":"Hello, wor"}     any piece of the text, mid-word included
//!   {"type":"flush"}                        the sentence in progress ends here (no end mark needed)
//!   {"type":"cancel"}                       barge-in: the audio stops now, queued text is dropped
//!   {"type":"end"}                          no more text: the rest is spoken, then "done"
//! server → client
//!   {"type":"session","sample_rate":24000,"channels":1,"format":"pcm_s16le","audio":"binary",
//!    "start":"paced"}
//!   {"type":"segment","index":0,"job":7,"after_job":6}   a sentence's first audio follows
//!   binary PCM, or {"type":"audio","index":0,"data":"<base64>"}
//!   {"type":"segment_end","index":0,"frames":25,"samples":48000,"text_starved_frames":3,"stop":"eos"}
//!   {"type":"cancelled"}                    after a cancel: nothing of the dropped text follows
//!   {"type":"done"}                         after "end" and all its audio; then the server closes
//!   {"type":"error","code":"voice_not_found","message":"..."}   then the server closes (1008/1011)
//! ```
//!
//! `start`: when each sentence starts speaking: `"paced"` (the default: at its first word when
//! the text comes at least as fast as speech takes it, else once enough of it is there that
//! playback will not wait for the rest), `"first_word"`, `"text_end"` (once the sentence is
//! complete), or a number of tokens, at least 1 ([`qtts::engine::FeedStart`]).
//!
//! The first message, whatever it is, is answered by `session` (the defaults where the client sent
//! none); `session` after another message is an error. Bounds:
//! [`MAX_SESSIONS`] sessions, messages of [`MAX_MESSAGE`] bytes, the server's characters and audio
//! seconds per session (as Wyoming's per connection), 30 s to the first message and 120 s between
//! messages while nothing is spoken, and a client that takes no audio for the server's write-stall
//! time is dropped.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use base64::Engine as _;
use qtts::engine::FeedStart;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};

use crate::encode::push_s16le;
use crate::sentences::{Cutter, Sentence};
use crate::service::{Event as Audio, Pending, Refused, Service};

/// Live sessions open at once, at most: 64; past it the upgrade is answered 503.
pub const MAX_SESSIONS: usize = 64;
/// Bytes of one client message, at most: 64 KiB. A longer one is answered `message_too_long`
/// and closes the session (1009).
pub const MAX_MESSAGE: usize = 64 * 1024;
/// Bytes of one message the socket reads at all: 1 MiB. Past it the connection is dropped
/// without a word (the socket's own bound on memory).
pub const MAX_READ: usize = 1 << 20;
/// Bytes the server's WebSocket buffers for a client that reads slowly, at most: 4 MiB (past it
/// the session ends).
pub const MAX_WRITE_BUFFER: usize = 4 << 20;
/// Wait for the first message of a session: 30 s.
const IDLE_FIRST: Duration = Duration::from_secs(30);
/// Wait between messages while nothing is spoken (a language model's pauses): 120 s.
const IDLE_BETWEEN: Duration = Duration::from_secs(120);
/// Messages queued for the client: 64 (chunks of 4 frames: about 20 s of audio).
const WRITE_QUEUE: usize = 64;
/// Sentences queued for synthesis per session: 64.
const WORK_QUEUE: usize = 64;

/// A client message.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum ClientMessage {
    Session {
        voice: Option<String>,
        language: Option<String>,
        audio: Option<AudioEncoding>,
        start: Option<StartArg>,
    },
    Text {
        text: String,
    },
    Flush,
    Cancel,
    End,
}

/// `session.start`: a policy by name ([`FeedStart::NAMED`]), or a number of tokens.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum StartArg {
    Tokens(usize),
    Named(String),
}

impl StartArg {
    fn policy(self) -> Result<FeedStart, Fail> {
        match self {
            StartArg::Tokens(0) => Err(Fail::client(
                "invalid_request",
                "session.start: expected a number of tokens of at least 1, found 0",
            )),
            StartArg::Tokens(n) => Ok(FeedStart::Tokens(n)),
            StartArg::Named(name) => FeedStart::by_name(&name).ok_or_else(|| {
                let names: Vec<&str> = FeedStart::NAMED.iter().map(|(n, _)| *n).collect();
                Fail::client(
                    "invalid_request",
                    format!(
                        "session.start: expected {} or a number of tokens, found {name:?}",
                        names.join(", ")
                    ),
                )
            }),
        }
    }
}

/// How audio is sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum AudioEncoding {
    /// Binary messages of s16le PCM.
    #[default]
    Binary,
    /// `{"type":"audio","data":...}` events, the PCM in base64.
    Base64,
}

impl AudioEncoding {
    fn name(self) -> &'static str {
        match self {
            AudioEncoding::Binary => "binary",
            AudioEncoding::Base64 => "base64",
        }
    }
}

/// What the synthesis task does, in order.
enum Work {
    /// Speak sentence `index`, queued in cancel generation `gen`.
    Sentence {
        sentence: Sentence,
        index: u64,
        gen: u64,
    },
    /// Send this event once everything queued before it is spoken.
    Say(Value),
    /// Send `done`, then close.
    Done,
}

/// What the socket sends, tagged with the cancel generation it belongs to (audio of an older one
/// is dropped).
enum Out {
    Audio {
        gen: u64,
        msg: Message,
    },
    Event {
        gen: u64,
        value: Value,
    },
    /// Send this error event, then close with `code`.
    Fail(Fail),
    /// Close normally.
    Close,
}

/// An error to send before closing.
struct Fail {
    code: &'static str,
    message: String,
    /// The close code: 1008 (policy: the client's fault) or 1011 (the server's).
    close: u16,
}

impl Fail {
    fn client(code: &'static str, message: impl Into<String>) -> Fail {
        Fail {
            code,
            message: message.into(),
            close: 1008,
        }
    }
}

fn count(svc: &Service, code: &str) {
    svc.metrics.count_request("live", "pcm", code);
}

/// Runs one session on an upgraded socket; `permit` is its place among [`MAX_SESSIONS`].
pub(crate) async fn session(
    mut ws: WebSocket,
    svc: Arc<Service>,
    permit: tokio::sync::OwnedSemaphorePermit,
) {
    let (out_tx, mut out_rx) = mpsc::channel::<Out>(WRITE_QUEUE);
    let (work_tx, work_rx) = mpsc::channel::<Work>(WORK_QUEUE);
    // Taken by the synthesis task when the first message starts it.
    let mut work_rx = Some(work_rx);
    let (gen_tx, gen_rx) = watch::channel(0u64);
    let busy = Pending::default();
    let mut settings = Settings::default();
    let mut synth = None;
    let mut cutter = Cutter::new(svc.text_mode);
    let (mut chars, mut index, mut gen) = (0usize, 0u64, 0u64);
    let mut ended = false;
    let mut last = Instant::now();
    let mut first = true;
    let stall = svc.limits.write_stall;
    let fail: Option<Fail> = loop {
        let msg = tokio::select! {
            m = ws.recv() => m,
            out = out_rx.recv() => {
                // Never `None`: this loop holds a sender too.
                let Some(out) = out else { break None };
                // Older generations' audio and events are dropped (a cancel came after them).
                let (msg, last) = match out {
                    Out::Audio { gen: g, msg } if g == gen => (msg, false),
                    Out::Event { gen: g, value } if g == gen => (Message::text(value.to_string()), false),
                    Out::Audio { .. } | Out::Event { .. } => continue,
                    Out::Fail(f) => break Some(f),
                    Out::Close => (Message::Close(Some(CloseFrame { code: 1000, reason: "done".into() })), true),
                };
                match tokio::time::timeout(stall, ws.send(msg)).await {
                    Ok(Ok(())) if !last => continue,
                    _ => break None,
                }
            }
            _ = tokio::time::sleep(Duration::from_secs(1)) => {
                let limit = if first { IDLE_FIRST } else { IDLE_BETWEEN };
                if busy.any() {
                    last = Instant::now();
                } else if last.elapsed() > limit && !ended {
                    break Some(Fail::client("idle", format!(
                        "no message for {} s; the session is closed", limit.as_secs()
                    )));
                }
                continue;
            }
        };
        let text =
            match msg {
                Some(Ok(Message::Text(t))) => t,
                Some(Ok(Message::Binary(_))) => break Some(Fail::client(
                    "invalid_request",
                    "binary messages carry audio from the server; send text as JSON text messages",
                )),
                // Pings are answered by the socket; pongs need nothing.
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                // The client closed, went away, or broke the protocol (a message over `MAX_READ`):
                // what it queued is cancelled with the synthesis task.
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break None,
            };
        first = false;
        last = Instant::now();
        if text.len() > MAX_MESSAGE {
            break Some(Fail {
                code: "message_too_long",
                message: format!(
                    "a message has {} bytes; at most {MAX_MESSAGE} are taken: send the text in \
                     smaller pieces",
                    text.len()
                ),
                close: 1009,
            });
        }
        let m: ClientMessage = match serde_json::from_str(text.as_str()) {
            Ok(m) => m,
            Err(e) => {
                break Some(Fail::client(
                    "invalid_request",
                    format!(
                        "a message is one JSON object with \"type\" session, text, flush, \
                         cancel or end: {e}"
                    ),
                ))
            }
        };
        if ended {
            break Some(Fail::client(
                "invalid_request",
                "a message came after \"end\"; open a new session for more text",
            ));
        }
        let cancel = matches!(m, ClientMessage::Cancel);
        let work = match m {
            ClientMessage::Session {
                voice,
                language,
                audio,
                start,
            } => {
                if synth.is_some() {
                    break Some(Fail::client(
                        "invalid_request",
                        "\"session\" comes once, before any text",
                    ));
                }
                if let Some(f) = check_name("voice", voice.as_deref())
                    .or_else(|| check_name("language", language.as_deref()))
                {
                    break Some(f);
                }
                let start = match start.map_or(Ok(FeedStart::Paced), StartArg::policy) {
                    Ok(s) => s,
                    Err(f) => break Some(f),
                };
                settings = match svc.voice_in(voice.as_deref(), language.as_deref()) {
                    Ok(v) => Settings {
                        voice: Some(v),
                        audio: audio.unwrap_or_default(),
                        start,
                    },
                    Err(r) => break Some(Fail::client(r.code, r.message)),
                };
                vec![]
            }
            ClientMessage::Text { text } => {
                chars += text.chars().count();
                if chars > svc.limits.max_input_chars {
                    break Some(Fail::client(
                        "input_too_long",
                        format!(
                            "the text is over {} characters for one session; open another",
                            svc.limits.max_input_chars
                        ),
                    ));
                }
                cutter.push(&text)
            }
            ClientMessage::Flush => cutter.finish().into_iter().collect(),
            ClientMessage::Cancel => {
                // The open sentence's writer goes with the old cutter (dropped: finished), its
                // request is cancelled by the synthesis task, and older audio is not sent.
                cutter = Cutter::new(svc.text_mode);
                gen += 1;
                let _ = gen_tx.send(gen);
                vec![]
            }
            ClientMessage::End => {
                ended = true;
                cutter.finish().into_iter().collect()
            }
        };
        // The first message starts the session: its settings are answered, then its work
        // follows in order.
        if let Some(work_rx) = work_rx.take() {
            let start = match settings.start {
                FeedStart::Tokens(n) => json!(n),
                s => json!(s.name()),
            };
            let hello = json!({"type": "session", "sample_rate": 24_000, "channels": 1,
                               "format": "pcm_s16le", "audio": settings.audio.name(),
                               "start": start});
            // The queue is empty: nothing produces before the synthesis task starts.
            let _ = out_tx.try_send(Out::Event { gen, value: hello });
            let voice = match settings.voice.take() {
                Some(v) => v,
                None => match svc.voice_in(None, None) {
                    Ok(v) => v,
                    Err(r) => break Some(Fail::client(r.code, r.message)),
                },
            };
            synth = Some(tokio::spawn(synthesis(
                svc.clone(),
                voice,
                (settings.audio, settings.start),
                work_rx,
                out_tx.clone(),
                gen_rx.clone(),
                busy.clone(),
            )));
        }
        for sentence in work {
            let w = Work::Sentence {
                sentence,
                index,
                gen,
            };
            index += 1;
            if busy.send(&work_tx, w).await.is_err() {
                break;
            }
        }
        if cancel {
            let w = Work::Say(json!({"type": "cancelled"}));
            if busy.send(&work_tx, w).await.is_err() {
                break None;
            }
        }
        if ended && busy.send(&work_tx, Work::Done).await.is_err() {
            break None;
        }
    };
    if let Some(f) = fail {
        count(&svc, f.code);
        let ev = json!({"type": "error", "code": f.code, "message": f.message});
        let close = Message::Close(Some(CloseFrame {
            code: f.close,
            reason: f.code.into(),
        }));
        let _ = tokio::time::timeout(stall, async {
            ws.send(Message::text(ev.to_string())).await?;
            ws.send(close).await
        })
        .await;
    }
    // The client is gone or the session is over: the synthesis task's request (if any) is
    // cancelled with its `Admitted`.
    if let Some(s) = synth {
        s.abort();
        let _ = s.await;
    }
    drop(permit);
}

/// What a `session` message sets.
#[derive(Default)]
struct Settings {
    voice: Option<qtts::talker::Voice>,
    audio: AudioEncoding,
    start: FeedStart,
}

/// Refuses a name longer than the HTTP API takes ([`crate::speech::MAX_NAME_CHARS`]).
fn check_name(field: &str, value: Option<&str>) -> Option<Fail> {
    let n = value.map_or(0, |s| s.chars().count());
    (n > crate::speech::MAX_NAME_CHARS).then(|| {
        Fail::client(
            "field_too_long",
            format!(
                "{field} has {n} characters; at most {} are taken",
                crate::speech::MAX_NAME_CHARS
            ),
        )
    })
}

/// Speaks the session's work in order; on an error, hands it to the socket loop and stops.
async fn synthesis(
    svc: Arc<Service>,
    voice: qtts::talker::Voice,
    (audio, start): (AudioEncoding, FeedStart),
    mut work: mpsc::Receiver<Work>,
    out: mpsc::Sender<Out>,
    mut gen: watch::Receiver<u64>,
    busy: Pending,
) {
    // Samples sent in this session: the audio limit counts per session.
    let mut sent = 0usize;
    while let Some(w) = work.recv().await {
        let _done = busy.take();
        let now = *gen.borrow();
        let r = match w {
            Work::Sentence {
                sentence,
                index,
                gen: g,
            } if g == now => {
                let s = Speak {
                    svc: &svc,
                    voice: &voice,
                    audio,
                    start,
                    out: &out,
                    index,
                    gen: g,
                };
                s.run(sentence, &mut gen, &mut sent).await
            }
            // Queued before a cancel: dropped.
            Work::Sentence { .. } => Ok(()),
            Work::Say(value) => out
                .send(Out::Event { gen: now, value })
                .await
                .map_err(|_| None),
            Work::Done => {
                let done = json!({"type": "done"});
                let _ = out
                    .send(Out::Event {
                        gen: now,
                        value: done,
                    })
                    .await;
                let _ = out.send(Out::Close).await;
                return;
            }
        };
        match r {
            Ok(()) => {}
            Err(None) => return,
            Err(Some(f)) => {
                // Counted by the socket loop, which sends it.
                let _ = out.send(Out::Fail(f)).await;
                return;
            }
        }
    }
}

/// One sentence's request.
struct Speak<'a> {
    svc: &'a Arc<Service>,
    voice: &'a qtts::talker::Voice,
    audio: AudioEncoding,
    start: FeedStart,
    out: &'a mpsc::Sender<Out>,
    index: u64,
    gen: u64,
}

impl Speak<'_> {
    /// Speaks `sentence`; `Err(None)`: the client is gone, `Err(Some)`: an error to send. A
    /// cancel (a newer generation in `gen`) ends it at once, quietly.
    async fn run(
        &self,
        sentence: Sentence,
        gen: &mut watch::Receiver<u64>,
        sent: &mut usize,
    ) -> Result<(), Option<Fail>> {
        let svc = self.svc;
        let max_samples = svc.limits.max_samples();
        let over_limit = || {
            Some(Fail::client(
                "audio_limit",
                crate::service::over_limit_message(svc.limits.max_audio_seconds),
            ))
        };
        if *sent >= max_samples {
            return Err(over_limit());
        }
        let fed = matches!(sentence, Sentence::Fed(_));
        let mut req = match sentence {
            Sentence::Whole(t) if t.trim().is_empty() => return Ok(()),
            Sentence::Whole(t) => qtts::engine::Request::text(t.trim()),
            Sentence::Fed(feed) => qtts::engine::Request::fed(feed),
        };
        req.voice = self.voice.clone();
        req.feed_start = self.start;
        req.mode = svc.text_mode;
        req.frame_limit = Some(svc.limits.max_frames);
        let mut job = svc.admit(req, "live").map_err(|r| {
            Some(match r {
                Refused::Busy { retry_after } => Fail {
                    code: "busy",
                    message: format!(
                        "server busy: the queue is full; try again in {retry_after} s"
                    ),
                    close: 1013,
                },
                Refused::Draining => Fail {
                    code: "busy",
                    message: "the server is shutting down; reconnect later".into(),
                    close: 1001,
                },
                Refused::Engine(e) => Fail {
                    code: "engine_error",
                    message: e.to_string(),
                    close: 1011,
                },
            })
        })?;
        let send = |o: Out| async move { self.out.send(o).await.map_err(|_| None::<Fail>) };
        let mut started = false;
        loop {
            let ev = tokio::select! {
                ev = job.next() => ev,
                _ = gen.wait_for(|g| *g != self.gen) => {
                    // Barge-in: dropping the job cancels it.
                    return Ok(());
                }
            };
            match ev {
                Some(Audio::Audio(c)) => {
                    *sent += c.len();
                    if *sent > max_samples {
                        return Err(over_limit());
                    }
                    if !started {
                        let (seq, after) = job.order();
                        let value = json!({"type": "segment", "index": self.index,
                                           "job": seq, "after_job": after});
                        send(Out::Event {
                            gen: self.gen,
                            value,
                        })
                        .await?;
                        started = true;
                    }
                    let mut pcm = Vec::with_capacity(c.len() * 2);
                    push_s16le(&c, &mut pcm);
                    let msg = match self.audio {
                        AudioEncoding::Binary => Message::binary(pcm),
                        AudioEncoding::Base64 => {
                            let data = base64::engine::general_purpose::STANDARD.encode(&pcm);
                            let ev = json!({"type": "audio", "index": self.index, "data": data});
                            Message::text(ev.to_string())
                        }
                    };
                    send(Out::Audio { gen: self.gen, msg }).await?;
                }
                Some(Audio::End(Ok(s))) if s.stop == qtts::talker::StopReason::Cancelled => {
                    return Err(Some(Fail {
                        code: "cancelled",
                        message: crate::service::CUT_SHORT.into(),
                        close: 1001,
                    }))
                }
                Some(Audio::End(Ok(s))) => {
                    let value = json!({"type": "segment_end", "index": self.index,
                        "frames": s.frames, "samples": s.samples,
                        "text_starved_frames": s.text_starved_frames,
                        "stop": crate::metrics::stop_label(&s.stop)});
                    send(Out::Event {
                        gen: self.gen,
                        value,
                    })
                    .await?;
                    count(svc, "ok");
                    return Ok(());
                }
                // A sentence that turned out to have nothing to speak is skipped, as a blank one.
                Some(Audio::End(Err(qtts::engine::EngineError::EmptyText))) if fed && !started => {
                    return Ok(())
                }
                Some(Audio::End(Err(e))) => {
                    let code = crate::service::error_code(&e);
                    let close = if code == "engine_error" { 1011 } else { 1008 };
                    return Err(Some(Fail {
                        code,
                        message: e.to_string(),
                        close,
                    }));
                }
                Some(Audio::OverLimit { .. }) => return Err(over_limit()),
                Some(Audio::QueueTimeout) => {
                    return Err(Some(Fail {
                        code: "busy",
                        message: "server busy: the sentence waited too long in the queue".into(),
                        close: 1013,
                    }))
                }
                None => {
                    return Err(Some(Fail {
                        code: "engine_error",
                        message: "the request ended without its audio".into(),
                        close: 1011,
                    }))
                }
            }
        }
    }
}
