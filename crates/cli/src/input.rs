//! The requests of a `speak` or `synth` run: the text argument, token ids, or standard input
//! (sentence by sentence, each fed to the engine as it is written, or `--lines`: line by line).

use anyhow::Context as _;

use crate::SpeakArgs;

fn parse_ids(s: &str) -> anyhow::Result<Vec<u32>> {
    s.split(|c: char| c == ',' || c.is_whitespace() || c == '[' || c == ']')
        .filter(|t| !t.is_empty())
        .map(|t| {
            t.parse::<u32>()
                .with_context(|| format!("--token-ids: '{t}' is not a token id"))
        })
        .collect()
}

/// The requests of a run: one, or one per stdin line.
pub(crate) fn requests(
    args: &SpeakArgs,
    info: &qtts::engine::EngineInfo,
    cloned: Option<qtts::talker::Voice>,
) -> anyhow::Result<Box<dyn Iterator<Item = anyhow::Result<qtts::engine::Request>>>> {
    use qtts::engine::Request;
    use qtts::talker::{TextInput, Voice};
    let xvector = match &args.xvector {
        Some(p) => {
            let bytes = std::fs::read(p).with_context(|| format!("--xvector {}", p.display()))?;
            anyhow::ensure!(
                bytes.len() % 4 == 0,
                "--xvector {}: {} bytes is not a whole number of f32 values",
                p.display(),
                bytes.len()
            );
            Some(
                bytes
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect::<Vec<f32>>(),
            )
        }
        None => None,
    };
    let speaker = args
        .speaker
        .clone()
        .or_else(|| info.default_speaker().map(str::to_owned));
    let voice = cloned.unwrap_or(Voice {
        speaker,
        language: args.language.clone(),
        instruct: args.instruct.clone(),
        xvector,
        reference: None,
    });
    let base = Request {
        input: TextInput::Text(String::new()),
        voice,
        mode: args.text_mode,
        sampling: None,
        overrides: qtts::sampling::SamplingOverrides {
            temperature: args.temperature,
            top_k: args.top_k,
            top_p: args.top_p,
        },
        code_predictor_sampling: None,
        repetition_penalty: args.repetition_penalty,
        seed: args.seed,
        max_frames: args.max_frames,
        frame_limit: None,
        min_frames: args.min_frames.map_or(qtts::talker::MIN_FRAMES, |m| {
            m.max(qtts::talker::MIN_FRAMES)
        }),
        keep_codes: args.codes_out.is_some(),
        text_feed: None,
        feed_start: qtts::engine::FeedStart::default(),
    };
    anyhow::ensure!(
        !args.greedy || base.overrides.is_empty(),
        "--greedy sets the sampling: give it or --temperature/--top-k/--top-p, not both"
    );
    let base = if args.greedy { base.greedy() } else { base };
    if let Some(ids) = &args.token_ids {
        anyhow::ensure!(args.text.is_none(), "give text or --token-ids, not both");
        let mut r = base;
        r.input = TextInput::TokenIds(parse_ids(ids)?);
        return Ok(Box::new(std::iter::once(Ok(r))));
    }
    match args.text.as_deref() {
        None => anyhow::bail!("no text: pass it as an argument, or - to read standard input"),
        Some("-") if !args.lines => Ok(Box::new(live_sentences(base))),
        Some("-") => Ok(Box::new(std::io::stdin().lines().filter_map(
            move |line| match line {
                Ok(l) if l.trim().is_empty() => None,
                Ok(l) => {
                    let mut r = base.clone();
                    r.input = TextInput::Text(l);
                    Some(Ok(r))
                }
                Err(e) => Some(Err(
                    anyhow::Error::from(e).context("reading standard input"),
                )),
            },
        ))),
        Some(t) => {
            let mut r = base;
            r.input = TextInput::Text(t.to_owned());
            Ok(Box::new(std::iter::once(Ok(r))))
        }
    }
}

/// Sentences read from standard input and not yet taken by the engine, at most: 64 (each waits
/// for the one before it to be spoken).
const SENTENCE_QUEUE: usize = 64;

/// `speak -`: standard input cut into sentences as it is read (a line's end ends one too), each
/// one request, in order: fed from its first character in the streaming text mode (spoken from
/// its first word, with the audio of the sentence read whole), else queued once complete (the
/// other text modes, and a cloned voice speaking in context, take no feed).
fn live_sentences(
    base: qtts::engine::Request,
) -> impl Iterator<Item = anyhow::Result<qtts::engine::Request>> {
    use qtts_serve::sentences::{Cutter, Sentence};
    use std::io::Read;
    let live = base.mode == qtts::talker::TextMode::Streaming && base.voice.reference.is_none();
    let (tx, rx) = crossbeam_channel::bounded::<anyhow::Result<Sentence>>(SENTENCE_QUEUE);
    std::thread::spawn(move || {
        let mut cut = if live {
            Cutter::live()
        } else {
            Cutter::whole()
        };
        // Sends what the cutter gave; false once the engine's side is gone.
        let send = |s: Vec<Sentence>| s.into_iter().all(|s| tx.send(Ok(s)).is_ok());
        let mut stdin = std::io::stdin().lock();
        let mut buf = [0u8; 4096];
        // Bytes of a character split across reads.
        let mut partial: Vec<u8> = Vec::new();
        let mut offset = 0usize;
        loop {
            let n = match stdin.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    let _ = tx.send(Err(anyhow::Error::from(e).context("reading standard input")));
                    return;
                }
            };
            partial.extend_from_slice(&buf[..n]);
            let valid = match std::str::from_utf8(&partial) {
                Ok(t) => t.len(),
                Err(e) if e.error_len().is_none() => e.valid_up_to(),
                Err(e) => {
                    let at = offset + e.valid_up_to();
                    let _ = tx.send(Err(anyhow::anyhow!(
                        "standard input is not UTF-8 text (an invalid byte at {at}): give text"
                    )));
                    return;
                }
            };
            offset += valid;
            let text: Vec<u8> = partial.drain(..valid).collect();
            let text = String::from_utf8_lossy(&text);
            for (i, line) in text.split('\n').enumerate() {
                if i > 0 && !send(cut.finish().into_iter().collect()) {
                    return;
                }
                if !send(cut.push(line)) {
                    return;
                }
            }
        }
        if !partial.is_empty() {
            let _ = tx.send(Err(anyhow::anyhow!(
                "standard input ends inside a UTF-8 character (at byte {offset}): give text"
            )));
            return;
        }
        let _ = send(cut.finish().into_iter().collect());
    });
    rx.into_iter().map(move |s| {
        let mut r = base.clone();
        match s? {
            Sentence::Fed(handle) => r.text_feed = Some(handle),
            Sentence::Whole(text) => r.input = qtts::talker::TextInput::Text(text),
        }
        Ok(r)
    })
}
