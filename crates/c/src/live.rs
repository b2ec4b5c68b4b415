//! Text written while it is spoken: the pieces of a [`QttsRequest::live`] synthesis's text.

use qtts::engine::FeedError;

use super::{guard, invalid, QttsSynthesis, QTTS_ERR_ENDED, QTTS_OK};
#[cfg(doc)]
use super::{QttsRequest, QTTS_ERR_INVALID_ARGUMENT};

/// The writer of `s` for one call: `Err` for a handle that is NULL, not live, or finished.
fn with_writer<T>(
    s: *const QttsSynthesis,
    f: impl FnOnce(&mut Option<qtts::engine::TextWriter>) -> Result<T, (i32, String)>,
) -> Result<T, (i32, String)> {
    // SAFETY: null or a live synthesis by the callers' contract; shared access only (the writer
    // is behind a mutex).
    let s =
        unsafe { s.as_ref() }.ok_or_else(|| invalid("synthesis: expected a handle, found NULL"))?;
    let mut w = s.writer.lock().unwrap_or_else(|e| e.into_inner());
    if s.cancel.is_cancelled() && matches!(*w, Ok(Some(_))) {
        // Over once cancelled, whether or not the engine has let go of the text yet.
        return Err((QTTS_ERR_ENDED, qtts::engine::FeedClosed.to_string()));
    }
    match &mut *w {
        Err(()) => Err(invalid(
            "synthesis: expected a live one (req.live = 1), found one given its whole text",
        )),
        Ok(None) => Err(invalid(
            "synthesis: its text was finished (qtts_finish_text); start a new synthesis for more",
        )),
        Ok(w) => f(w),
    }
}

fn feed_error(e: FeedError) -> (i32, String) {
    match e {
        FeedError::Closed(c) => (QTTS_ERR_ENDED, c.to_string()),
        FeedError::NotUtf8(e) => invalid(format!("text: {e}")),
    }
}

/// Adds `len` bytes of UTF-8 text at `text` to a live synthesis ([`QttsRequest::live`]): any
/// piece, a word, part of one, even part of a character (the rest comes with the next call).
/// Returns at once unless 4096 pieces already wait for the engine (then it waits for room).
/// Returns a status: [`QTTS_ERR_ENDED`] once the synthesis is over (ended, cancelled, failed: a
/// cancel while text is still coming is normal; stop writing), [`QTTS_ERR_INVALID_ARGUMENT`] for
/// a synthesis that is not live or whose text was finished, or bytes that are not UTF-8.
///
/// # Safety
/// `s` is a live synthesis; `text` points to `len` readable bytes (or is NULL with `len` 0).
#[no_mangle]
pub unsafe extern "C" fn qtts_feed_text(
    s: *const QttsSynthesis,
    text: *const std::ffi::c_char,
    len: usize,
) -> i32 {
    guard(|| {
        if text.is_null() && len > 0 {
            return Err(invalid(format!("text: expected {len} bytes, found NULL")));
        }
        let bytes = if len == 0 {
            &[][..]
        } else {
            // SAFETY: `len` readable bytes at `text` by the contract.
            unsafe { std::slice::from_raw_parts(text.cast::<u8>(), len) }
        };
        with_writer(s, |w| {
            let w = w.as_mut().expect("with_writer passes a writer");
            w.push_bytes(bytes).map_err(feed_error)?;
            Ok(QTTS_OK)
        })
    })
}

/// Ends a live synthesis's text: the engine speaks what is left, then [`qtts_read`] answers 0
/// after the last sample. Returns a status: [`QTTS_ERR_INVALID_ARGUMENT`] when the last piece
/// ended inside a character, for a synthesis that is not live, or a second time;
/// [`QTTS_ERR_ENDED`] when the synthesis was already over. Freeing a live synthesis without it
/// ends the text too (and cancels the synthesis).
///
/// [`qtts_read`]: super::qtts_read
///
/// # Safety
/// `s` is a live synthesis.
#[no_mangle]
pub unsafe extern "C" fn qtts_finish_text(s: *const QttsSynthesis) -> i32 {
    guard(|| {
        with_writer(s, |w| {
            let w = w.take().expect("with_writer passes a writer");
            w.finish().map_err(feed_error)?;
            Ok(QTTS_OK)
        })
    })
}
