//! Time to the first audio byte over HTTP against the engine's own time to first audio, on the
//! same worker, interleaved, in one run (`cargo bench -p qtts-serve --bench ttfb`).
//!
//! - engine: `Worker::submit` to the first chunk, in process (what `Engine` callers see);
//! - http: writing `POST /v1/audio/speech` (streaming pcm) on an open loopback connection to the
//!   first byte of the body.
//!
//! `QTTS_BENCH_MODEL` names the model (a GGUF pair's directory or a checkpoint; default: the
//! built-in tiny model), `QTTS_BENCH_RUNS` the runs of each (default 9). Prints medians and the
//! difference; the target is http − engine ≤ 10 ms (p50).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use qtts::engine::{EngineConfig, Request, ThreadPlan, Worker};
use qtts_serve::{http::HttpOptions, voices::Voices, Limits, Options, Service};

const TEXT: &str = "Hello there, how are you today?";

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn engine_ttfa(svc: &Service) -> f64 {
    let mut req = Request::text(TEXT);
    req.voice = svc.voice(None).expect("default voice");
    req.seed = 1;
    req.max_frames = Some(40);
    req.frame_limit = Some(Limits::default().max_frames);
    let t0 = Instant::now();
    let mut job = svc.worker.submit(req).expect("submit");
    let first = job.next_chunk(None);
    let dt = t0.elapsed().as_secs_f64() * 1e3;
    assert!(matches!(first, Ok(Some(_))), "no audio");
    job.cancel();
    let _ = job.finish();
    dt
}

fn http_ttfb(addr: std::net::SocketAddr) -> f64 {
    let body = format!(
        r#"{{"model":"tts-1","input":"{TEXT}","response_format":"pcm","seed":1,"max_new_tokens":40}}"#
    );
    let req = format!(
        "POST /v1/audio/speech HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_nodelay(true).expect("nodelay");
    let mut got = Vec::new();
    let mut buf = [0u8; 65536];
    let t0 = Instant::now();
    s.write_all(req.as_bytes()).expect("write");
    loop {
        let n = s.read(&mut buf).expect("read");
        assert!(
            n > 0,
            "closed before audio: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            assert!(
                got.starts_with(b"HTTP/1.1 200"),
                "{}",
                String::from_utf8_lossy(&got)
            );
            if got.len() > end + 4 {
                break;
            }
        }
    }
    t0.elapsed().as_secs_f64() * 1e3
}

fn wait_idle(svc: &Service) {
    let t0 = Instant::now();
    while svc.in_flight() > 0 && t0.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn main() -> anyhow::Result<()> {
    use qtts::model::find;
    let cache = find::cache_dir();
    let model = match std::env::var_os("QTTS_BENCH_MODEL") {
        Some(p) => find::resolve(
            std::path::Path::new(&p),
            &cache,
            false,
            &mut |l| eprintln!("{l}"),
            &mut |_, _| {},
        )?,
        None => find::builtin(&cache)?,
    };
    let runs: usize = std::env::var("QTTS_BENCH_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(9);
    let config = EngineConfig {
        plan: ThreadPlan::default_for(ThreadPlan::available_cores()),
        ..EngineConfig::default()
    };
    let worker = Worker::load(&model.files, config, 4)?;
    let svc = Arc::new(Service::new(
        worker,
        Limits::default(),
        Voices::default(),
        "bench".into(),
        model.description.clone(),
    ));
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = {
        let svc = svc.clone();
        std::thread::spawn(move || {
            let opts = Options {
                http: Some("127.0.0.1:0".parse().expect("address")),
                wyoming: None,
                http_options: HttpOptions::default(),
                drain_timeout: Duration::from_secs(1),
                no_warmup: false,
            };
            qtts_serve::run_until(
                svc,
                opts,
                |b| {
                    let _ = addr_tx.send(b.http);
                },
                async {
                    let _ = stop_rx.await;
                },
            )
        })
    };
    let addr = addr_rx.recv()?.expect("http address");
    // One of each unmeasured: caches, the connection path.
    engine_ttfa(&svc);
    wait_idle(&svc);
    http_ttfb(addr);
    wait_idle(&svc);
    let (mut engine, mut http) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        engine.push(engine_ttfa(&svc));
        wait_idle(&svc);
        http.push(http_ttfb(addr));
        wait_idle(&svc);
    }
    let (e, h) = (median(&mut engine), median(&mut http));
    println!("model: {}", model.description);
    println!("runs: {runs} of each, interleaved");
    println!("engine TTFA (Worker, in process)  median {e:8.2} ms");
    println!("HTTP first audio byte (pcm)       median {h:8.2} ms");
    println!(
        "difference                        median {:+8.2} ms (target <= +10 ms)",
        h - e
    );
    let _ = stop_tx.send(());
    let _ = server.join();
    Ok(())
}
