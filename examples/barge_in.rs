//! Barge-in: starts speaking a long text, interrupts it mid-sentence (as a voice assistant does
//! when the user starts talking), then speaks the next reply at once.
//!
//! Demonstrates: `Canceller` from another thread, the flush of queued playback within one device
//! period, every stage going idle, and the engine serving the next request normally.
//! Plays on a real-time-paced device (no sound card needed), so the timings are those a
//! speaker would see.
//!
//! Run: `cargo run --release --example barge_in`
//! It uses the best model under `models/`, else the built-in tiny random model (noise).

use std::time::{Duration, Instant};

use qtts::audio::{ring, PacedDevice};
use qtts::engine::{Engine, EngineConfig, Request};
use qtts::model::find;

fn main() -> anyhow::Result<()> {
    let model = match find::scan("models".as_ref()).into_iter().next() {
        Some(m) => m,
        None => find::builtin(&find::cache_dir())?,
    };
    let mut engine = Engine::load(&model.files, EngineConfig::default())?;
    let (sink, player) = ring(2000.0, 200.0);
    let device = PacedDevice::start(player, 480, false);

    let long = "This is a long answer that goes on and on, explaining every detail at length, \
                until the user decides they have heard enough and starts talking over it.";
    let s = engine.synthesize(Request::text(long), Box::new(sink));
    let cancel = s.canceller();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        println!("user speaks: cancel");
        cancel.cancel();
    });
    let t = Instant::now();
    let (first, sink) = s.wait();
    let first = first?;
    println!(
        "interrupted after {:?}: {} frames made, stop {:?}",
        t.elapsed(),
        first.frames,
        first.stop
    );

    let (second, _sink) = engine
        .synthesize(Request::text("Sure, go ahead."), sink)
        .wait();
    let second = second?;
    println!(
        "reply: {} frames, first audio after {:?}, stop {:?}; underruns so far: {}",
        second.frames,
        second.ttfa.unwrap_or_default(),
        second.stop,
        device.shared().underruns()
    );
    Ok(())
}
