//! An utterance's prompt (MODEL-NOTES.md §4.3, the reference's `generate`): the wrapped text,
//! the instruction, the codec prefix with speaker and language, then the text in its mode (or a
//! cloned voice's in-context block, `icl.rs`).

use super::{Dialect, ModelType, Prompt, Talker, TalkerError, TextInput, TextMode, Voice};

impl Talker {
    /// The ids of `<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n`, checked.
    pub fn wrap_text(&self, input: &TextInput) -> Result<Vec<u32>, TalkerError> {
        let ids = match input {
            TextInput::Text(t) => self.tokenizer.encode(&format!(
                "<|im_start|>assistant\n{t}<|im_end|>\n<|im_start|>assistant\n"
            )),
            TextInput::TokenIds(ids) => ids.clone(),
        };
        let c = &self.config;
        let n = ids.len();
        let shape_ok = n >= 9
            && ids[0] == c.im_start_token_id
            && ids[n - 5] == c.im_end_token_id
            && ids[n - 3] == c.im_start_token_id;
        if !shape_ok {
            return Err(TalkerError::BadText {
                expected: format!(
                    "ids [{}, assistant, \\n, text.., {}, \\n, {}, assistant, \\n] with at least one text token",
                    c.im_start_token_id, c.im_end_token_id, c.im_start_token_id
                ),
                found: format!("{n} ids starting {:?}", &ids[..n.min(4)]),
            });
        }
        self.check_text_ids(&ids)?;
        Ok(ids)
    }

    /// Refuses an id outside the text vocabulary.
    pub(super) fn check_text_ids(&self, ids: &[u32]) -> Result<(), TalkerError> {
        match ids.iter().find(|&&i| i as usize >= self.n_text) {
            Some(&bad) => Err(TalkerError::BadText {
                expected: format!("text ids below {}", self.n_text),
                found: bad.to_string(),
            }),
            None => Ok(()),
        }
    }

    /// Builds the prompt of one utterance (MODEL-NOTES.md §4.3, the reference's `generate`).
    pub fn prompt(
        &self,
        input: &TextInput,
        voice: &Voice,
        mode: TextMode,
    ) -> Result<Prompt, TalkerError> {
        let c = &self.config;
        let t = &c.talker_config;
        let model = c.tts_model_type.as_str();
        let ids = self.wrap_text(input)?;
        let text = &ids[3..ids.len() - 5];

        // Instruction: text-only rows first.
        let mut rows = Vec::new();
        if let Some(instruct) = &voice.instruct {
            if !c.tts_model_type.takes_instruct(&c.tts_model_size) {
                return Err(TalkerError::InstructUnsupported {
                    model,
                    size: c.tts_model_size.clone(),
                });
            }
            let ids = self
                .tokenizer
                .encode(&format!("<|im_start|>user\n{instruct}<|im_end|>\n"));
            for id in ids {
                self.push_row(&mut rows, Some(id as usize), None)?;
            }
        }

        // Speaker and language.
        let speaker = match &voice.speaker {
            Some(s) if !s.is_empty() => {
                let key = s.to_lowercase();
                match t.spk_id.get(&key) {
                    Some(&id) => Some((key, id)),
                    None => {
                        return Err(TalkerError::UnknownSpeaker {
                            speaker: s.clone(),
                            model,
                            supported: self.speakers(),
                        })
                    }
                }
            }
            _ => None,
        };
        let ref_ids = self.check_reference(voice)?;
        if let Some(x) = &voice.xvector {
            if c.tts_model_type != ModelType::Base || speaker.is_some() {
                return Err(TalkerError::SpeakerVector {
                    expected: "a Base model and no named speaker".into(),
                    found: format!("a {model} model, speaker {:?}", voice.speaker),
                });
            }
            if x.len() != self.n_embd || x.iter().any(|v| !v.is_finite()) {
                return Err(TalkerError::SpeakerVector {
                    expected: format!("{} finite values", self.n_embd),
                    found: format!("{} values", x.len()),
                });
            }
        }
        let language = voice.language.as_deref().unwrap_or("auto").to_lowercase();
        let mut lang_id = if language == "auto" {
            None
        } else {
            match t.codec_language_id.get(&language) {
                Some(&id) => Some(id),
                None => {
                    return Err(TalkerError::UnknownLanguage {
                        language,
                        supported: self.languages(),
                    })
                }
            }
        };
        if let Some((name, _)) = &speaker {
            if language == "chinese" || language == "auto" {
                if let Some(Dialect::Language(d)) = t.spk_is_dialect.get(name) {
                    if let Some(&id) = t.codec_language_id.get(d) {
                        lang_id = Some(id);
                    }
                }
            }
        }

        // Role, then the codec prefix over tts_pad .. tts_bos.
        for &id in &ids[..3] {
            self.push_row(&mut rows, Some(id as usize), None)?;
        }
        enum Slot<'a> {
            Code(u32),
            Vector(&'a [f32]),
        }
        let mut codec: Vec<Slot> = match lang_id {
            None => vec![
                t.codec_nothink_id,
                t.codec_think_bos_id,
                t.codec_think_eos_id,
            ],
            Some(l) => vec![
                t.codec_think_id,
                t.codec_think_bos_id,
                l,
                t.codec_think_eos_id,
            ],
        }
        .into_iter()
        .map(Slot::Code)
        .collect();
        if let Some((_, id)) = speaker {
            codec.push(Slot::Code(id));
        } else if let Some(x) = &voice.xvector {
            codec.push(Slot::Vector(x));
        }
        codec.push(Slot::Code(t.codec_pad_id));
        let n = codec.len() + 1;
        for (i, slot) in codec.iter().enumerate() {
            let at = rows.len();
            rows.extend_from_slice(if i + 2 < n {
                &self.tts_pad
            } else {
                &self.tts_bos
            });
            match slot {
                Slot::Code(id) => self.add_row(self.n_text + *id as usize, &mut rows[at..])?,
                Slot::Vector(x) => {
                    for (o, v) in rows[at..].iter_mut().zip(x.iter()) {
                        *o += v;
                    }
                }
            }
        }

        // The text.
        let mut trailing = Vec::new();
        if let (Some(r), Some(ref_ids)) = (&voice.reference, &ref_ids) {
            self.icl_rows(r, ref_ids, text, mode, &mut rows, &mut trailing)?;
            return Ok(Prompt {
                rows,
                trailing,
                n_embd: self.n_embd,
                text_tokens: text.len(),
            });
        }
        match mode {
            TextMode::Streaming | TextMode::Trailing => {
                self.push_row(&mut rows, Some(text[0] as usize), Some(t.codec_bos_id))?;
                for &id in &text[1..] {
                    self.push_row(&mut trailing, Some(id as usize), None)?;
                }
                trailing.extend_from_slice(&self.tts_eos);
            }
            TextMode::NonStreaming => {
                for &id in text {
                    self.push_row(&mut rows, Some(id as usize), Some(t.codec_pad_id))?;
                }
                let at = rows.len();
                rows.extend_from_slice(&self.tts_eos);
                self.add_row(self.n_text + t.codec_pad_id as usize, &mut rows[at..])?;
                let at = rows.len();
                rows.extend_from_slice(&self.tts_pad);
                self.add_row(self.n_text + t.codec_bos_id as usize, &mut rows[at..])?;
            }
        }
        Ok(Prompt {
            rows,
            trailing,
            n_embd: self.n_embd,
            text_tokens: text.len(),
        })
    }
}
