//! Reading a request body with bounds on its size, its time and the memory all bodies in flight
//! hold together: a body that stalls, trickles or is too large is answered (408, 413, 503)
//! instead of holding a connection and its buffer.
//!
//! ```text
//!  hyper ──frames──▶ read ──(≤ BODY_LIMIT, whole body ≤ body_timeout,
//!                           ≤ body_idle_timeout between frames)──▶ Bytes
//!                      │
//!                      └─ each frame takes its bytes from the budget shared by every body in
//!                         flight (BODY_BUDGET); the permit goes back when the body is dropped
//! ```

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, StatusCode};
use futures_util::StreamExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::http::ApiError;

/// Request bodies on `/v1/audio/*`: 16 MiB (room for a `speaker_embedding`, or a `ref_audio` at
/// the 30 s limit: 48 kHz stereo 16-bit WAV is 7.7 MB in base64).
pub const BODY_LIMIT: usize = 16 << 20;

/// Bytes every request body in flight may hold together: 32 MiB (two bodies at the limit, or
/// thousands of ordinary ones). Past it a body is answered 503 with `Retry-After`.
pub const BODY_BUDGET: usize = 32 << 20;

/// A whole body must arrive within 60 s of its headers (a 16 MiB body at 2.2 Mbit/s).
pub const BODY_TIMEOUT: Duration = Duration::from_secs(60);

/// At most 10 s may pass between two pieces of a body.
pub const BODY_IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a body may take.
#[derive(Debug, Clone, Copy)]
pub struct BodyTimes {
    /// The whole body, from the moment the handler starts reading it.
    pub whole: Duration,
    /// Between two pieces.
    pub idle: Duration,
}

impl Default for BodyTimes {
    fn default() -> Self {
        BodyTimes {
            whole: BODY_TIMEOUT,
            idle: BODY_IDLE_TIMEOUT,
        }
    }
}

/// The memory all bodies in flight share ([`BODY_BUDGET`] bytes).
#[derive(Debug, Clone)]
pub struct Budget(Arc<Semaphore>);

impl Default for Budget {
    fn default() -> Self {
        Budget::new(BODY_BUDGET)
    }
}

impl Budget {
    /// A budget of `bytes`.
    pub fn new(bytes: usize) -> Budget {
        Budget(Arc::new(Semaphore::new(bytes)))
    }

    /// Bytes not held by any body now.
    pub fn available(&self) -> usize {
        self.0.available_permits()
    }
}

/// A body read whole, holding its share of the [`Budget`] until it is dropped.
#[derive(Debug)]
pub struct Read {
    /// The bytes.
    pub bytes: Bytes,
    _held: Option<OwnedSemaphorePermit>,
}

fn too_large(found: String) -> ApiError {
    let mut e = ApiError::bad(
        "request_too_large",
        None,
        format!(
            "the body is {found}, over the {} MiB limit: send a shorter reference audio",
            BODY_LIMIT >> 20
        ),
    );
    e.status = StatusCode::PAYLOAD_TOO_LARGE;
    e
}

fn timed_out(message: String) -> ApiError {
    let mut e = ApiError::bad("request_timeout", None, message);
    e.status = StatusCode::REQUEST_TIMEOUT;
    e
}

/// Reads `body` (see the module docs). A declared `Content-Length` over the limit is refused
/// before any byte is read.
pub async fn read(
    body: Body,
    headers: &HeaderMap,
    times: BodyTimes,
    budget: &Budget,
) -> Result<Read, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(n) = declared.filter(|&n| n > BODY_LIMIT as u64) {
        return Err(too_large(format!("{n} bytes")));
    }
    let deadline = tokio::time::Instant::now() + times.whole;
    let mut stream = body.into_data_stream();
    // Grown as bytes come (and are taken from the budget), never sized by what is declared.
    let mut out: Vec<u8> = Vec::new();
    let mut held: Option<OwnedSemaphorePermit> = None;
    loop {
        let wait = (tokio::time::Instant::now() + times.idle).min(deadline);
        let next = match tokio::time::timeout_at(wait, stream.next()).await {
            Ok(n) => n,
            Err(_) if wait == deadline => {
                return Err(timed_out(format!(
                "the body did not arrive within {} s ({} bytes came); send it whole and at once",
                times.whole.as_secs_f64(),
                out.len()
            )))
            }
            Err(_) => {
                return Err(timed_out(format!(
                "the body stalled: nothing came for {} s after {} bytes; send it whole and at once",
                times.idle.as_secs_f64(),
                out.len()
            )))
            }
        };
        let chunk = match next {
            None => break,
            Some(Ok(c)) => c,
            Some(Err(e)) => {
                return Err(ApiError::bad(
                    "invalid_body",
                    None,
                    format!("the body could not be read: {e}"),
                ))
            }
        };
        if out.len() + chunk.len() > BODY_LIMIT {
            return Err(too_large(format!("over {} bytes", BODY_LIMIT)));
        }
        let take = chunk.len() as u32;
        if take > 0 {
            match budget.0.clone().try_acquire_many_owned(take) {
                Ok(p) => match &mut held {
                    Some(h) => h.merge(p),
                    None => held = Some(p),
                },
                Err(_) => {
                    let mut e = ApiError::server(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "server_overloaded",
                        format!(
                            "the request bodies being received are over {} MiB together; retry shortly",
                            BODY_BUDGET >> 20
                        ),
                    );
                    e.retry_after = Some(1);
                    return Err(e);
                }
            }
        }
        out.extend_from_slice(&chunk);
    }
    Ok(Read {
        bytes: Bytes::from(out),
        _held: held,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap()
    }

    /// A body whose pieces come from `parts`, each after its delay.
    fn trickle(parts: Vec<(u64, &'static [u8])>) -> Body {
        let s = futures_util::stream::unfold(parts.into_iter(), |mut it| async move {
            let (ms, b) = it.next()?;
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Some((Ok::<_, std::io::Error>(Bytes::from_static(b)), it))
        });
        Body::from_stream(s)
    }

    fn code(r: Result<Read, ApiError>) -> (StatusCode, &'static str) {
        let e = r.unwrap_err();
        (e.status, e.code)
    }

    #[test]
    fn whole_bodies_are_read_and_hold_the_budget_until_dropped() {
        rt().block_on(async {
            let budget = Budget::new(100);
            let r = read(
                trickle(vec![(5, b"{\"a\""), (5, b":1}")]),
                &HeaderMap::new(),
                BodyTimes::default(),
                &budget,
            )
            .await
            .unwrap();
            assert_eq!(&r.bytes[..], b"{\"a\":1}");
            assert_eq!(budget.available(), 93);
            drop(r);
            assert_eq!(budget.available(), 100);
        });
    }

    #[test]
    fn a_stalled_or_trickled_body_times_out_and_gives_its_bytes_back() {
        rt().block_on(async {
            let budget = Budget::new(100);
            let times = BodyTimes {
                whole: Duration::from_secs(60),
                idle: Duration::from_secs(10),
            };
            // `{` and then nothing: the idle limit.
            let stalled = trickle(vec![(0, b"{"), (3_600_000, b"}")]);
            let r = read(stalled, &HeaderMap::new(), times, &budget).await;
            assert_eq!(code(r), (StatusCode::REQUEST_TIMEOUT, "request_timeout"));
            // A byte every 5 s: never idle 10 s, but the whole body past 60 s.
            let parts: Vec<(u64, &'static [u8])> = (0..100).map(|_| (5_000, &b" "[..])).collect();
            let r = read(trickle(parts), &HeaderMap::new(), times, &budget).await;
            let e = r.unwrap_err();
            assert_eq!(e.status, StatusCode::REQUEST_TIMEOUT);
            assert!(e.body().to_string().contains("within 60 s"), "{}", e.body());
            assert_eq!(budget.available(), 100);
        });
    }

    #[test]
    fn sizes_over_the_limit_and_the_budget_are_refused() {
        rt().block_on(async {
            let budget = Budget::new(4);
            let mut h = HeaderMap::new();
            h.insert(header::CONTENT_LENGTH, (BODY_LIMIT + 1).into());
            // Refused from the header: the body (which would never end) is not read.
            let never = trickle(vec![(3_600_000, b"x")]);
            let r = read(never, &h, BodyTimes::default(), &budget).await;
            assert_eq!(
                code(r),
                (StatusCode::PAYLOAD_TOO_LARGE, "request_too_large")
            );
            let r = read(
                trickle(vec![(0, b"abc"), (0, b"de")]),
                &HeaderMap::new(),
                BodyTimes::default(),
                &budget,
            )
            .await;
            assert_eq!(
                code(r),
                (StatusCode::SERVICE_UNAVAILABLE, "server_overloaded")
            );
            assert_eq!(budget.available(), 4);
        });
    }
}
