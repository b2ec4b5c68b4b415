//! Text written while it is spoken through the C ABI (`QttsRequest::live`, `qtts_feed_text`,
//! `qtts_finish_text`): the audio of the whole text whatever the pieces, speech before the text's
//! end, and statuses with messages for every misuse.

mod common;

use std::ffi::CString;
use std::ptr::null;

use common::*;
use qtts_c::*;

const TEXT: &str = "Héllo wörld, 你好! Read me as I am written.";
const FRAMES: u32 = 24;

fn feed(s: *mut QttsSynthesis, bytes: &[u8]) -> i32 {
    // SAFETY: a live synthesis and `bytes.len()` readable bytes.
    unsafe { qtts_feed_text(s, bytes.as_ptr().cast(), bytes.len()) }
}

fn finish(s: *mut QttsSynthesis) -> i32 {
    // SAFETY: a live synthesis.
    unsafe { qtts_finish_text(s) }
}

/// A live request: no text yet, the rest as `fixed`.
fn live() -> QttsRequest {
    let mut r = fixed(c"", FRAMES);
    r.text = null();
    r.live = 1;
    r
}

/// The raw pointer, sent to the writing thread (the ABI allows feeding from another thread).
struct Handle(*mut QttsSynthesis);
// SAFETY: the library's synthesis may be fed from any thread (a mutex guards its writer).
unsafe impl Send for Handle {}

/// The audio of [`TEXT`] given whole (no frame waits for text).
fn whole_texts_audio(engine: *mut QttsEngine) -> Vec<f32> {
    let whole = CString::new(TEXT).unwrap();
    let s = start(engine, &fixed(&whole, FRAMES)).unwrap();
    let (audio, end) = read_all(s, 4096);
    assert_eq!(end, 0, "{}", last_error());
    assert_eq!(summary(s).unwrap().text_starved_frames, 0);
    // SAFETY: a live synthesis, freed once.
    unsafe { qtts_synthesis_free(s) };
    audio
}

#[test]
fn a_live_synthesis_fed_in_pieces_is_the_whole_texts_audio() {
    let engine = load_with(&builtin_options()).unwrap();
    let want = whole_texts_audio(engine);
    let bytes = TEXT.as_bytes();
    for round in 0..3u64 {
        let s = start(engine, &live()).unwrap();
        // The first words, then audio before any more text: speech starts while it is written.
        let first = "Héllo wörld, ".len();
        assert_eq!(feed(s, &bytes[..first]), QTTS_OK, "{}", last_error());
        let mut buf = vec![0f32; 4096];
        // SAFETY: a live synthesis and 4096 writable floats.
        let n = unsafe { qtts_read(s, buf.as_mut_ptr(), buf.len(), 60_000) };
        assert!(
            n > 0,
            "no audio before the rest of the text: {n} {}",
            last_error()
        );
        let mut got = buf[..n as usize].to_vec();
        // The rest from another thread, in pieces of 1 to 7 bytes (mid-character too), with
        // pauses, while this thread reads.
        let h = Handle(s);
        let writer = std::thread::spawn(move || {
            let h = h;
            let (mut at, mut x) = (first, round * 7919 + 1);
            while at < bytes.len() {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let len = 1 + (x >> 60) as usize % 7;
                let end = (at + len).min(bytes.len());
                assert_eq!(feed(h.0, &bytes[at..end]), QTTS_OK, "{}", last_error());
                at = end;
                if x & 3 == 0 {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
            }
            assert_eq!(finish(h.0), QTTS_OK, "{}", last_error());
        });
        let (rest, end) = read_all(s, 4096);
        writer.join().unwrap();
        assert_eq!(end, 0, "{}", last_error());
        got.extend(rest);
        assert!(
            got == want,
            "round {round}: the fed text's audio differs from the whole text's"
        );
        let sum = summary(s).unwrap();
        assert_eq!(sum.frames, u64::from(FRAMES));
        // How many frames waited for text depends on the writer's pace: not asserted here (the
        // engine's tests count them).
        assert!(sum.text_starved_frames <= u64::from(FRAMES));
        // SAFETY: a live synthesis, freed once.
        unsafe { qtts_synthesis_free(s) };
    }
    // SAFETY: a live engine, freed once.
    unsafe { qtts_engine_free(engine) };
}

/// `live_start = -1`: nothing before the text's end (however long the read waits: it cannot
/// start), then the whole text's audio.
#[test]
fn a_synthesis_starting_at_the_texts_end_waits_for_it() {
    let engine = load_with(&builtin_options()).unwrap();
    let want = whole_texts_audio(engine);
    let mut r = live();
    r.live_start = -1;
    let s = start(engine, &r).unwrap();
    let bytes = TEXT.as_bytes();
    assert_eq!(feed(s, &bytes[..20]), QTTS_OK);
    let mut buf = vec![0f32; 4096];
    // SAFETY: a live synthesis and 4096 writable floats.
    let n = unsafe { qtts_read(s, buf.as_mut_ptr(), buf.len(), 300) };
    assert_eq!(
        n,
        i64::from(QTTS_ERR_TIMEOUT),
        "audio before the text's end"
    );
    assert_eq!(feed(s, &bytes[20..]), QTTS_OK);
    assert_eq!(finish(s), QTTS_OK);
    let (got, end) = read_all(s, 4096);
    assert_eq!(end, 0, "{}", last_error());
    assert!(got == want, "the audio differs from the whole text's");
    // SAFETY: a live synthesis, freed once; then the engine.
    unsafe {
        qtts_synthesis_free(s);
        qtts_engine_free(engine);
    }
}

#[test]
fn misuses_are_statuses_with_messages() {
    let engine = load_with(&builtin_options()).unwrap();
    let mut bad = live();
    bad.live = 2;
    assert_eq!(start(engine, &bad), Err(QTTS_ERR_INVALID_ARGUMENT));
    assert!(last_error().contains("req.live"), "{}", last_error());
    let mut bad = live();
    bad.live_start = -2;
    assert_eq!(start(engine, &bad), Err(QTTS_ERR_INVALID_ARGUMENT));
    assert!(last_error().contains("req.live_start"), "{}", last_error());

    // Text to a synthesis given its whole text.
    let whole = start(engine, &fixed(c"Whole.", 2)).unwrap();
    assert_eq!(feed(whole, b"more"), QTTS_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("req.live = 1"), "{}", last_error());
    assert_eq!(finish(whole), QTTS_ERR_INVALID_ARGUMENT);
    assert_eq!(read_all(whole, 4096).1, 0);

    let s = start(engine, &live()).unwrap();
    // SAFETY: NULL with a length, and a NULL synthesis.
    unsafe {
        assert_eq!(qtts_feed_text(s, null(), 3), QTTS_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("NULL"), "{}", last_error());
        assert_eq!(qtts_feed_text(s, null(), 0), QTTS_OK);
        assert_eq!(
            qtts_feed_text(std::ptr::null_mut(), null(), 0),
            QTTS_ERR_INVALID_ARGUMENT
        );
        assert_eq!(qtts_finish_text(null()), QTTS_ERR_INVALID_ARGUMENT);
    }
    assert_eq!(feed(s, b"Hi \xff"), QTTS_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("UTF-8"), "{}", last_error());
    assert_eq!(
        feed(s, "Hi \u{e9}".as_bytes().split_last().unwrap().1),
        QTTS_OK
    );
    // The text ends inside a character: refused, and finished all the same.
    assert_eq!(finish(s), QTTS_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("UTF-8"), "{}", last_error());
    assert_eq!(finish(s), QTTS_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("finished"), "{}", last_error());
    assert_eq!(feed(s, b"more"), QTTS_ERR_INVALID_ARGUMENT);
    assert_eq!(read_all(s, 4096).1, 0);
    // SAFETY: live synthesis, freed once.
    unsafe {
        qtts_synthesis_free(whole);
        qtts_synthesis_free(s);
    }

    // A cancelled synthesis takes no more text: QTTS_ERR_ENDED, the writer's cue to stop.
    let s = start(engine, &live()).unwrap();
    assert_eq!(feed(s, b"Hello there"), QTTS_OK);
    // SAFETY: a live synthesis.
    assert_eq!(unsafe { qtts_cancel(s) }, QTTS_OK);
    assert_eq!(read_all(s, 4096).1, 0);
    assert_eq!(summary(s).unwrap().stop, QTTS_STOP_CANCELLED);
    assert_eq!(feed(s, b" and more"), QTTS_ERR_ENDED);
    assert!(last_error().contains("over"), "{}", last_error());
    // SAFETY: a live synthesis, freed once.
    unsafe { qtts_synthesis_free(s) };

    // Freed while its text is still open: cancelled, nothing waits for the text.
    let s = start(engine, &live()).unwrap();
    assert_eq!(feed(s, b"Never finished"), QTTS_OK);
    // SAFETY: a live synthesis, freed once; then the engine.
    unsafe {
        qtts_synthesis_free(s);
        qtts_engine_free(engine);
    }
}
