//! Several syntheses at once on one engine through the C ABI (`QttsOptions::max_streams`).

mod common;

use common::*;
use qtts_c::*;

/// Reads `s` to its end, then frees it; its audio.
fn read_to_end(s: *mut QttsSynthesis) -> Vec<f32> {
    let (audio, end) = read_all(s, 4096);
    assert_eq!(end, 0, "{}", last_error());
    // SAFETY: a live synthesis, freed once.
    unsafe { qtts_synthesis_free(s) };
    audio
}

/// An engine loaded with `max_streams` 3 runs three syntheses at once, read one after the other
/// from this thread (each waits while another is read): each gives the audio it gives alone;
/// `max_streams` over 16 is refused with a message.
#[test]
fn several_syntheses_at_once_are_each_what_they_are_alone() {
    let texts = [c"The first.", c"A second one.", c"And a third."];
    let mut opts = builtin_options();
    let alone: Vec<Vec<f32>> = {
        let engine = load_with(&opts).unwrap();
        let v = texts
            .iter()
            .map(|t| read_to_end(start(engine, &fixed(t, 30)).unwrap()))
            .collect();
        // SAFETY: a live engine, freed once.
        unsafe { qtts_engine_free(engine) };
        v
    };
    opts.max_streams = 17;
    assert_eq!(load_with(&opts), Err(QTTS_ERR_INVALID_ARGUMENT));
    assert!(last_error().contains("max_streams"), "{}", last_error());
    opts.max_streams = 3;
    let engine = load_with(&opts).unwrap();
    let running: Vec<_> = texts
        .iter()
        .map(|t| start(engine, &fixed(t, 30)).unwrap())
        .collect();
    for (s, want) in running.into_iter().zip(&alone).rev() {
        let audio = read_to_end(s);
        assert!(
            audio == *want,
            "a synthesis beside others differs from its run alone"
        );
    }
    // SAFETY: a live engine, freed once.
    unsafe { qtts_engine_free(engine) };
}
