//! The ring between the decoder and the device: what the player plays, underruns, prebuffering,
//! flushing, and that the device side never allocates.

use std::sync::atomic::AtomicBool;

use assert_no_alloc::{assert_no_alloc, reset_violation_count, violation_count};
use qtts::audio::{ring, AudioSink, FRAME_SAMPLES};

const PERIOD: usize = 480; // 20 ms

fn frame(k: usize) -> Vec<f32> {
    (0..FRAME_SAMPLES)
        .map(|i| ((k * FRAME_SAMPLES + i) % 1000) as f32 * 1e-3 + 1e-3)
        .collect()
}

/// A decoder stall of exactly K periods after playback started gives exactly K underruns, each
/// a silent period, at the periods it hit; nothing is lost: the audio resumes where it stopped.
#[test]
fn a_stall_of_k_periods_is_k_underruns_of_silence() {
    let never = AtomicBool::new(false);
    // The detector works: an allocation inside is counted.
    reset_violation_count();
    assert_no_alloc(|| drop(std::hint::black_box(vec![1u8; 16])));
    assert!(violation_count() > 0);
    for k in [1usize, 3, 7] {
        reset_violation_count();
        let (mut sink, mut player) = ring(500.0, 0.0);
        let shared = sink.shared();
        sink.begin().unwrap();
        let mut played = Vec::new();
        let mut buf = vec![0.0; PERIOD];
        // Two frames in, 8 periods played (the first 2 frames exactly), then K empty periods,
        // then the rest.
        sink.write(&frame(0), &never).unwrap();
        sink.write(&frame(1), &never).unwrap();
        for _ in 0..8 {
            assert_no_alloc(|| player.fill(&mut buf));
            played.extend_from_slice(&buf);
        }
        for _ in 0..k {
            assert_no_alloc(|| player.fill(&mut buf));
            assert!(buf.iter().all(|&x| x == 0.0));
        }
        sink.write(&frame(2), &never).unwrap();
        for _ in 0..4 {
            assert_no_alloc(|| player.fill(&mut buf));
            played.extend_from_slice(&buf);
        }
        assert_eq!(violation_count(), 0, "the player allocated");
        assert_eq!(shared.underruns(), k as u64);
        assert_eq!(
            shared.underrun_periods(),
            (8..8 + k as u64).collect::<Vec<_>>()
        );
        let want: Vec<f32> = (0..3).flat_map(frame).collect();
        assert!(played == want, "k={k}: audio changed across the stall");
        // The end is not an underrun: the tail plays, then silence.
        let mut end_cancel = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                for _ in 0..10 {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                    player.fill(&mut buf);
                }
            });
            sink.end(&end_cancel).unwrap();
        });
        assert_eq!(shared.underruns(), k as u64);
        assert!(shared.is_idle());
        let _ = end_cancel.get_mut();
    }
}

#[test]
fn playback_waits_for_the_prebuffer() {
    let never = AtomicBool::new(false);
    let (mut sink, mut player) = ring(1000.0, 200.0); // 4800 samples
    let shared = sink.shared();
    let mut buf = vec![0.0; PERIOD];
    sink.begin().unwrap();
    sink.write(&frame(0), &never).unwrap();
    sink.write(&frame(1), &never).unwrap(); // 3840 < 4800
    for _ in 0..5 {
        player.fill(&mut buf);
        assert!(buf.iter().all(|&x| x == 0.0));
    }
    assert_eq!(shared.underruns(), 0, "waiting to prebuffer is no underrun");
    assert_eq!(shared.played(), 0);
    sink.write(&frame(2), &never).unwrap();
    player.fill(&mut buf);
    assert_eq!(&buf[..], &frame(0)[..PERIOD]);
}

#[test]
fn cancel_flushes_within_one_period() {
    let (mut sink, mut player) = ring(1000.0, 0.0);
    let mut buf = vec![0.0; PERIOD];
    let cancel = AtomicBool::new(false);
    sink.begin().unwrap();
    for k in 0..5 {
        sink.write(&frame(k), &cancel).unwrap();
    }
    player.fill(&mut buf);
    assert!(buf.iter().any(|&x| x != 0.0));
    cancel.store(true, std::sync::atomic::Ordering::Release);
    sink.end(&cancel).unwrap();
    player.fill(&mut buf);
    assert!(
        buf.iter().all(|&x| x == 0.0),
        "still playing after the flush"
    );
    assert!(sink.shared().is_idle());
    assert_eq!(sink.queued_ms(), Some(0.0));
    // A full ring: write returns once cancelled instead of blocking.
    sink.begin().unwrap();
    let big = vec![0.5; 48_000];
    assert!(matches!(
        sink.write(&big, &cancel),
        Err(qtts::audio::AudioError::Cancelled)
    ));
}

/// Barge-in: a request started right after a cancel, before the device's next period, plays
/// whole and in order; nothing of the cancelled one plays after it, and its end waits for it.
#[test]
fn a_request_started_right_after_a_cancel_plays_whole() {
    let (mut sink, mut player) = ring(1000.0, 0.0);
    let mut buf = vec![0.0; PERIOD];
    let cancel = AtomicBool::new(false);
    sink.begin().unwrap();
    for k in 0..3 {
        sink.write(&frame(k), &cancel).unwrap();
    }
    player.fill(&mut buf);
    cancel.store(true, std::sync::atomic::Ordering::Release);
    sink.end(&cancel).unwrap();
    // The next request, before the device's next period.
    let go = AtomicBool::new(false);
    sink.begin().unwrap();
    sink.write(&frame(7), &go).unwrap();
    assert!(!sink.shared().is_idle(), "idle with an utterance going");
    let mut played = Vec::new();
    for _ in 0..FRAME_SAMPLES / PERIOD + 2 {
        player.fill(&mut buf);
        played.extend_from_slice(&buf);
    }
    let sound: Vec<f32> = played.into_iter().filter(|&x| x != 0.0).collect();
    assert!(
        sound == frame(7),
        "played {} samples, not the new frame",
        sound.len()
    );
    std::thread::scope(|s| {
        s.spawn(|| player.fill(&mut buf));
        sink.end(&go).unwrap();
    });
    assert!(sink.shared().is_idle());
}

/// A `Write` whose bytes a test reads after the sink has written them.
#[derive(Clone, Default)]
struct Shared(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Shared {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `synth --out -`: the stream's samples are the WAV file's data bytes (hound's, for the same
/// samples), behind a header hound reads with unknown lengths, or none (`--raw`); every chunk is
/// out as soon as it is written.
#[test]
fn a_stream_sink_writes_what_a_wav_file_holds() {
    use qtts::audio::{SampleFormat, StreamHeader, StreamSink, WavSink};
    let cancel = AtomicBool::new(false);
    let chunks = [frame(1), frame(2), vec![1.5, -2.0, 0.25]];
    let tmp = tempfile::tempdir().unwrap();
    for format in [SampleFormat::F32, SampleFormat::S16] {
        let path = tmp.path().join("x.wav");
        let mut wav = WavSink::create(&path, format).unwrap();
        for c in &chunks {
            wav.write(c, &cancel).unwrap();
        }
        wav.finish().unwrap();
        let file = std::fs::read(&path).unwrap();
        let data =
            &file[file.len() - chunks.iter().map(Vec::len).sum::<usize>() * format_bytes(format)..];

        for header in [StreamHeader::Wav, StreamHeader::Raw] {
            let out = Shared::default();
            let mut sink = StreamSink::new(Box::new(out.clone()), format, header);
            let mut seen = 0;
            for c in &chunks {
                sink.write(c, &cancel).unwrap();
                seen += c.len();
                let head = if header == StreamHeader::Wav { 44 } else { 0 };
                assert_eq!(
                    out.0.lock().unwrap().len(),
                    head + seen * format_bytes(format),
                    "written at once"
                );
            }
            assert_eq!(sink.samples(), seen as u64);
            sink.finish().unwrap();
            let bytes = out.0.lock().unwrap().clone();
            match header {
                StreamHeader::Raw => assert_eq!(bytes, data),
                StreamHeader::Wav => {
                    assert_eq!(&bytes[44..], data);
                    assert_eq!(&bytes[0..4], b"RIFF");
                    assert_eq!(&bytes[4..8], &[0xFF; 4]);
                    assert_eq!(&bytes[40..44], &[0xFF; 4]);
                    let spec = hound::WavReader::new(std::io::Cursor::new(&file[..]))
                        .unwrap()
                        .spec();
                    let mut fake = bytes.clone();
                    // With the lengths filled in, the header is one hound reads as the file's.
                    let n = (bytes.len() - 44) as u32;
                    fake[4..8].copy_from_slice(&(n + 36).to_le_bytes());
                    fake[40..44].copy_from_slice(&n.to_le_bytes());
                    let got = hound::WavReader::new(std::io::Cursor::new(fake))
                        .unwrap()
                        .spec();
                    assert_eq!(got, spec);
                }
            }
        }
    }
    // No sample: the header alone.
    let out = Shared::default();
    StreamSink::new(Box::new(out.clone()), SampleFormat::F32, StreamHeader::Wav)
        .finish()
        .unwrap();
    assert_eq!(out.0.lock().unwrap().len(), 44);
}

fn format_bytes(f: qtts::audio::SampleFormat) -> usize {
    match f {
        qtts::audio::SampleFormat::F32 => 4,
        qtts::audio::SampleFormat::S16 => 2,
    }
}
