//! Wyoming's framing: a JSON header line, then `data_length` bytes of JSON data (no newline),
//! then `payload_length` bytes of payload, within [`MAX_HEADER`] and [`MAX_BLOCK`].

use serde_json::{json, Map, Value};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt};

/// The protocol version written in headers.
pub const VERSION: &str = "1.10.2";
/// Longest header line: 64 KiB (asyncio's `readline` limit).
pub const MAX_HEADER: usize = 64 << 10;
/// Longest data or payload block: 1 MiB.
pub const MAX_BLOCK: usize = 1 << 20;

/// One Wyoming event.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// `describe`, `synthesize`, ...
    pub kind: String,
    /// Its data (inline `data` merged with the data block).
    pub data: Map<String, Value>,
    /// Its payload (PCM for `audio-chunk`).
    pub payload: Vec<u8>,
}

/// A frame that breaks the protocol or its limits; the connection is closed.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// Reading failed.
    #[error("read failed: {0}")]
    Io(#[from] std::io::Error),
    /// The header line is longer than [`MAX_HEADER`].
    #[error("header line over {MAX_HEADER} bytes")]
    HeaderTooLong,
    /// A block is longer than [`MAX_BLOCK`].
    #[error("{what} of {len} bytes is over the {MAX_BLOCK}-byte limit")]
    TooLong {
        /// `data_length` or `payload_length`.
        what: &'static str,
        /// Its value.
        len: u64,
    },
    /// The header or data is not the JSON expected.
    #[error("bad event: {0}")]
    Bad(String),
    /// The stream ended inside an event.
    #[error("the connection closed inside an event")]
    Truncated,
}

/// Reads the next event; `Ok(None)` at a clean end of stream.
pub async fn read_event<R: AsyncBufRead + Unpin>(r: &mut R) -> Result<Option<Event>, FrameError> {
    let mut line = Vec::new();
    loop {
        let buf = r.fill_buf().await?;
        if buf.is_empty() {
            return if line.is_empty() {
                Ok(None)
            } else {
                Err(FrameError::Truncated)
            };
        }
        let (take, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        if line.len() + take > MAX_HEADER + 1 {
            return Err(FrameError::HeaderTooLong);
        }
        line.extend_from_slice(&buf[..take]);
        r.consume(take);
        if done {
            break;
        }
    }
    let header: Value =
        serde_json::from_slice(&line).map_err(|e| FrameError::Bad(format!("header: {e}")))?;
    let kind = header
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| FrameError::Bad("header without a string 'type'".into()))?
        .to_owned();
    let mut data = match header.get("data") {
        Some(Value::Object(m)) => m.clone(),
        None | Some(Value::Null) => Map::new(),
        Some(_) => return Err(FrameError::Bad("'data' is not an object".into())),
    };
    let len = |key: &'static str| -> Result<usize, FrameError> {
        match header.get(key) {
            None | Some(Value::Null) => Ok(0),
            Some(v) => {
                let n = v
                    .as_u64()
                    .ok_or_else(|| FrameError::Bad(format!("'{key}' is not a length")))?;
                if n as usize > MAX_BLOCK {
                    return Err(FrameError::TooLong { what: key, len: n });
                }
                Ok(n as usize)
            }
        }
    };
    let (data_len, payload_len) = (len("data_length")?, len("payload_length")?);
    if data_len > 0 {
        let mut block = vec![0; data_len];
        r.read_exact(&mut block)
            .await
            .map_err(|_| FrameError::Truncated)?;
        match serde_json::from_slice(&block) {
            Ok(Value::Object(m)) => data.extend(m),
            _ => {
                return Err(FrameError::Bad(
                    "the data block is not a JSON object".into(),
                ))
            }
        }
    }
    let mut payload = vec![0; payload_len];
    if payload_len > 0 {
        r.read_exact(&mut payload)
            .await
            .map_err(|_| FrameError::Truncated)?;
    }
    Ok(Some(Event {
        kind,
        data,
        payload,
    }))
}

/// An event's bytes, as the Python writer lays them out (data in its own block).
pub fn frame(kind: &str, data: Option<&Value>, payload: &[u8]) -> Vec<u8> {
    let data = data.map(|d| d.to_string()).unwrap_or_default();
    let mut header = json!({"type": kind, "version": VERSION});
    if !data.is_empty() {
        header["data_length"] = json!(data.len());
    }
    if !payload.is_empty() {
        header["payload_length"] = json!(payload.len());
    }
    let mut out = header.to_string().into_bytes();
    out.push(b'\n');
    out.extend_from_slice(data.as_bytes());
    out.extend_from_slice(payload);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::BufReader;

    async fn read_all(bytes: &[u8]) -> Vec<Result<Option<Event>, String>> {
        let mut r = BufReader::new(bytes);
        let mut out = Vec::new();
        loop {
            let e = read_event(&mut r).await.map_err(|e| e.to_string());
            let stop = !matches!(e, Ok(Some(_)));
            out.push(e);
            if stop {
                return out;
            }
        }
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    }

    /// The bytes wyoming 1.10.2 writes (serving.md §2.1), and inline data without a version.
    #[test]
    fn reads_python_frames_and_inline_data() {
        let py = b"{\"type\": \"synthesize\", \"version\": \"1.10.2\", \"data_length\": 76}\n{\"text\": \"Hello.\", \"voice\": {\"name\": \"qwen3-tts-0.6b\", \"speaker\": \"vivian\"}}{\"type\": \"describe\"}\n{\"type\": \"ping\", \"data\": {\"text\": \"x\"}}\n";
        let evs = rt().block_on(read_all(py));
        let e = evs[0].as_ref().unwrap().as_ref().unwrap();
        assert_eq!(e.kind, "synthesize");
        assert_eq!(e.data["text"], "Hello.");
        assert_eq!(e.data["voice"]["speaker"], "vivian");
        assert_eq!(evs[1].as_ref().unwrap().as_ref().unwrap().kind, "describe");
        let p = evs[2].as_ref().unwrap().as_ref().unwrap();
        assert_eq!(p.data["text"], "x");
        assert!(matches!(evs[3], Ok(None)));
    }

    /// What `frame` writes reads back; the data block has no newline after it; payload follows.
    #[test]
    fn frames_round_trip_with_payload() {
        let d = json!({"rate": 24000, "width": 2, "channels": 1});
        let mut bytes = frame("audio-chunk", Some(&d), &[1, 2, 3, 4]);
        let header_end = bytes.iter().position(|&b| b == b'\n').unwrap();
        let header: Value = serde_json::from_slice(&bytes[..header_end]).unwrap();
        assert_eq!(header["payload_length"], 4);
        assert_eq!(header["version"], VERSION);
        let dl = header["data_length"].as_u64().unwrap() as usize;
        assert_eq!(&bytes[header_end + 1 + dl..], &[1, 2, 3, 4]);
        bytes.extend(frame("audio-stop", None, &[]));
        let evs = rt().block_on(read_all(&bytes));
        let e = evs[0].as_ref().unwrap().as_ref().unwrap();
        assert_eq!(e.data["rate"], 24000);
        assert_eq!(e.payload, vec![1, 2, 3, 4]);
        assert_eq!(
            evs[1].as_ref().unwrap().as_ref().unwrap().kind,
            "audio-stop"
        );
    }

    /// Split reads (one byte at a time) give the same events.
    #[test]
    fn split_reads() {
        let bytes = frame("synthesize", Some(&json!({"text": "héllo"})), &[9; 10]);
        let e = rt().block_on(async {
            let mut r = BufReader::with_capacity(1, &bytes[..]);
            read_event(&mut r).await.unwrap().unwrap()
        });
        assert_eq!(e.data["text"], "héllo");
        assert_eq!(e.payload, vec![9; 10]);
    }

    #[test]
    fn limits_and_truncation() {
        let long = format!(
            "{{\"type\": \"x\", \"pad\": \"{}\"}}\n",
            "a".repeat(MAX_HEADER + 10)
        );
        let evs = rt().block_on(read_all(long.as_bytes()));
        assert!(
            evs[0].as_ref().unwrap_err().contains("header line"),
            "{:?}",
            evs[0]
        );
        let big = format!(
            "{{\"type\": \"x\", \"payload_length\": {}}}\n",
            MAX_BLOCK + 1
        );
        let evs = rt().block_on(read_all(big.as_bytes()));
        assert!(evs[0].as_ref().unwrap_err().contains("payload_length"));
        let short = b"{\"type\": \"x\", \"data_length\": 50}\n{\"a\":1}";
        let evs = rt().block_on(read_all(short));
        assert!(evs[0].as_ref().unwrap_err().contains("closed inside"));
        let evs = rt().block_on(read_all(b"not json\n"));
        assert!(evs[0].is_err());
    }
}
