//! The in-context (ICL) part of a cloned voice's prompt (`generate_icl_prompt` of the official
//! implementation).

use super::{Talker, TalkerError, TextInput, TextMode, Voice};

/// What the in-context prompt takes from a reference recording (`generate_icl_prompt` in the
/// reference implementation): the transcript's token ids and the recording's codes, each frame
/// embedded as the talker's step input is (`CodePredictor::embed_frame`).
#[derive(Debug, Clone, PartialEq)]
pub struct IclReference {
    /// The transcript: text, tokenized inside `<|im_start|>assistant\n{text}<|im_end|>\n` as the
    /// official wrapper does, or the ids of that whole string (the wrapper's `ref_ids`).
    pub text: TextInput,
    /// The recording's codes, `[frames][16]`.
    pub codes: Vec<[u32; 16]>,
    /// `frames × n_embd`: each frame's 16 code embeddings summed.
    pub embedded: Vec<f32>,
}

impl Talker {
    /// A voice's reference, checked: with an x-vector, a transcript, and a finite embedded row
    /// per frame. Returns the transcript's ids (`None` without a reference).
    pub(super) fn check_reference(&self, voice: &Voice) -> Result<Option<Vec<u32>>, TalkerError> {
        let Some(r) = &voice.reference else {
            return Ok(None);
        };
        let n = self.n_embd;
        let ref_ids = self.reference_ids(&r.text)?;
        if voice.xvector.is_none()
            || r.codes.is_empty()
            || r.embedded.len() != r.codes.len() * n
            || r.embedded.iter().any(|v| !v.is_finite())
        {
            return Err(TalkerError::SpeakerVector {
                expected: format!(
                    "an x-vector with the reference, a non-empty transcript, and {n} finite \
                     values per reference frame"
                ),
                found: format!(
                    "x-vector {}, {} transcript tokens, {} frames, {} values",
                    voice.xvector.is_some(),
                    ref_ids.len(),
                    r.codes.len(),
                    r.embedded.len()
                ),
            });
        }
        Ok(Some(ref_ids))
    }

    /// The transcript's ids alone (`ref_ids[3..len − 2]`), checked.
    fn reference_ids(&self, text: &TextInput) -> Result<Vec<u32>, TalkerError> {
        let ids = match text {
            TextInput::Text(t) => self
                .tokenizer
                .encode(&format!("<|im_start|>assistant\n{t}<|im_end|>\n")),
            TextInput::TokenIds(ids) => ids.clone(),
        };
        let c = &self.config;
        let n = ids.len();
        let wrapped = n >= 6
            && ids[0] == c.im_start_token_id
            && ids[1] == c.assistant_token_id
            && ids[n - 2] == c.im_end_token_id
            && ids[n - 1] == ids[2];
        if !wrapped {
            return Err(TalkerError::BadText {
                expected: "a reference transcript with at least one token, wrapped as \
                           <|im_start|>assistant\\n{text}<|im_end|>\\n"
                    .into(),
                found: format!("{n} ids starting {:?}", &ids[..n.min(4)]),
            });
        }
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= self.n_text) {
            return Err(TalkerError::BadText {
                expected: format!("reference text ids below {}", self.n_text),
                found: bad.to_string(),
            });
        }
        Ok(ids[3..n - 2].to_vec())
    }

    /// The in-context block after the codec prefix (`generate_icl_prompt`): the text track is
    /// the transcript, then the target text, then `tts_eos`; the codec track is `codec_bos`, then
    /// the reference frames. Non-streaming: all the text over `codec_pad`, then the codec track
    /// over `tts_pad`. Streaming: the two tracks summed row by row over the codec track's length,
    /// the text left over (if longer) trailing into the steps, `tts_pad` padding it (if shorter).
    /// Trailing (not official): as streaming, with the target text moved after the codec track
    /// (`tts_pad` between), so that the rows depend on the reference alone.
    pub(super) fn icl_rows(
        &self,
        r: &IclReference,
        ref_ids: &[u32],
        text: &[u32],
        mode: TextMode,
        rows: &mut Vec<f32>,
        trailing: &mut Vec<f32>,
    ) -> Result<(), TalkerError> {
        let t = &self.config.talker_config;
        let n = self.n_embd;
        let mut codec_track = vec![0.0; n];
        self.add_row(self.n_text + t.codec_bos_id as usize, &mut codec_track)?;
        codec_track.extend_from_slice(&r.embedded);
        let lc = codec_track.len() / n;
        let mut text_track = Vec::new();
        for &id in ref_ids {
            self.push_row(&mut text_track, Some(id as usize), None)?;
        }
        if mode == TextMode::Trailing {
            while text_track.len() < lc * n {
                text_track.extend_from_slice(&self.tts_pad);
            }
        }
        for &id in text {
            self.push_row(&mut text_track, Some(id as usize), None)?;
        }
        text_track.extend_from_slice(&self.tts_eos);
        let lt = text_track.len() / n;
        match mode {
            TextMode::NonStreaming => {
                for row in text_track.chunks_exact(n) {
                    let at = rows.len();
                    rows.extend_from_slice(row);
                    self.add_row(self.n_text + t.codec_pad_id as usize, &mut rows[at..])?;
                }
                for row in codec_track.chunks_exact(n) {
                    rows.extend(row.iter().zip(&self.tts_pad).map(|(c, p)| c + p));
                }
            }
            TextMode::Streaming | TextMode::Trailing => {
                for i in 0..lc {
                    let text_row = if i < lt {
                        &text_track[i * n..(i + 1) * n]
                    } else {
                        &self.tts_pad[..]
                    };
                    let codec_row = &codec_track[i * n..(i + 1) * n];
                    rows.extend(text_row.iter().zip(codec_row).map(|(a, b)| a + b));
                }
                if lt > lc {
                    trailing.extend_from_slice(&text_track[lc * n..]);
                }
            }
        }
        Ok(())
    }
}
