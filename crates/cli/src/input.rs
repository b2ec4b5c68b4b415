//! The requests of a `speak` or `synth` run: the text argument, token ids, or standard input
//! (line by line, or `--live`: each line fed to the engine as it is written).

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
        Some("-") if args.live => Ok(Box::new(live_lines(base))),
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

/// `speak - --live`: one fed request per line of standard input, each made when its line's first
/// byte arrives; a thread pushes the line's bytes into the request's feed as they come and
/// finishes it at the line's end.
fn live_lines(
    base: qtts::engine::Request,
) -> impl Iterator<Item = anyhow::Result<qtts::engine::Request>> {
    use std::io::Read;
    let (started_tx, started_rx) = crossbeam_channel::bounded::<()>(1);
    let (writer_tx, writer_rx) = crossbeam_channel::bounded::<qtts::engine::TextWriter>(1);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = [0u8; 4096];
        let mut line: Option<qtts::engine::TextWriter> = None;
        loop {
            let n = match stdin.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let mut rest = &buf[..n];
            while !rest.is_empty() {
                if line.is_none() {
                    // A new line: ask for its request, then feed it.
                    if started_tx.send(()).is_err() {
                        return;
                    }
                    match writer_rx.recv() {
                        Ok(w) => line = Some(w),
                        Err(_) => return,
                    }
                }
                let (piece, end) = match rest.iter().position(|&b| b == b'\n') {
                    Some(i) => (&rest[..i], true),
                    None => (rest, false),
                };
                if let Some(w) = line.as_mut() {
                    // A request that ended (end of speech, a cancel) takes no more: drop the rest.
                    let _ = w.push_bytes(piece);
                }
                rest = &rest[piece.len() + end as usize..];
                if end {
                    if let Some(w) = line.take() {
                        let _ = w.finish();
                    }
                }
            }
        }
        if let Some(w) = line.take() {
            let _ = w.finish();
        }
    });
    std::iter::from_fn(move || {
        started_rx.recv().ok()?;
        let (writer, handle) = qtts::engine::text_feed();
        writer_tx.send(writer).ok()?;
        let mut r = base.clone();
        r.text_feed = Some(handle);
        Some(Ok(r))
    })
}
