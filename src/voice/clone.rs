//! From a reference recording to a [`ClonedVoice`], and from a saved voice to the talker's
//! [`Voice`].

use std::sync::{Arc, Mutex};

use super::{CodecEncoder, SpeakerEncoder, VoiceError};
use crate::gguf::{GgufFile, Value};
use crate::model::config::TtsConfig;
use crate::model::ModelFiles;
use crate::talker::{IclReference, TextInput, Voice};
use crate::voice::store::{ClonedVoice, VoiceModel};

/// The two encoders of a Base model, loaded from its mmproj (about 50 M f32 parameters at the
/// 0.6B geometry: load once, clone many).
#[derive(Debug)]
pub struct Cloner {
    speaker: SpeakerEncoder,
    codec: Option<CodecEncoder>,
    model: VoiceModel,
    threads: usize,
}

/// What model an mmproj belongs to, from the config it carries.
pub fn model_of(mmproj: &GgufFile) -> Result<VoiceModel, VoiceError> {
    let key = crate::model::convert::KEY_HF_CONFIG;
    let json = mmproj
        .header
        .get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| crate::error::ModelError::MissingKey {
            path: mmproj.path().into(),
            key: key.into(),
        })?;
    let cfg: TtsConfig = crate::model::config::parse_json(json, mmproj.path())?;
    Ok(VoiceModel {
        model_type: cfg.tts_model_type.as_str().into(),
        size: cfg.tts_model_size.clone(),
        hidden: cfg.talker_config.hidden_size as usize,
    })
}

impl Cloner {
    /// Loads the encoders of `files`' mmproj; computes on `threads` threads.
    pub fn load(files: &ModelFiles, threads: usize) -> Result<Self, VoiceError> {
        let f = GgufFile::open(&files.mmproj)?;
        let model = model_of(&f)?;
        if model.model_type != "base" {
            return Err(VoiceError::NotBase {
                model_type: model.model_type,
            });
        }
        let speaker = SpeakerEncoder::load(&f)?.ok_or_else(|| VoiceError::NotBase {
            model_type: "base without a speaker encoder".into(),
        })?;
        Ok(Cloner {
            speaker,
            codec: CodecEncoder::load(&f)?,
            model,
            threads: threads.max(1),
        })
    }

    /// The model the voices are made for.
    pub fn model(&self) -> &VoiceModel {
        &self.model
    }

    /// Whether the file has the codec encoder, which in-context cloning (with a transcript)
    /// needs; without it, only x-vector voices can be made.
    pub fn has_codec_encoder(&self) -> bool {
        self.codec.is_some()
    }

    /// A voice from 24 kHz mono `audio` (as [`super::audio_in`] returns it). With the
    /// recording's `transcript`, the voice speaks in context (the official default, better
    /// likeness); without, from the x-vector alone (`x_vector_only_mode`).
    pub fn clone_voice(
        &mut self,
        audio: &[f32],
        transcript: Option<&str>,
    ) -> Result<ClonedVoice, VoiceError> {
        check_samples(audio)?;
        let xvector = self.speaker.embed(audio, self.threads, None);
        let (codes, text) = match transcript.map(str::trim) {
            None => (Vec::new(), None),
            Some("") => {
                return Err(VoiceError::BadInput {
                    what: "reference transcript".into(),
                    expected: "the words spoken in the reference, or no transcript for an \
                               x-vector-only voice"
                        .into(),
                    found: "an empty text".into(),
                })
            }
            Some(t) => {
                let codec = self.codec.as_mut().ok_or(VoiceError::NoCodecEncoder)?;
                (codec.encode(audio, self.threads, None), Some(t.to_owned()))
            }
        };
        ClonedVoice::new(
            self.model.clone(),
            xvector,
            codes,
            text,
            audio.len() as f32 / 24000.0,
        )
    }
}

/// What the encoders refuse: fewer samples than the speaker encoder's paddings need, or
/// non-finite ones ([`super::audio_in`] checks more, with the file's own terms).
fn check_samples(audio: &[f32]) -> Result<(), VoiceError> {
    if audio.len() < SpeakerEncoder::MIN_SAMPLES {
        return Err(VoiceError::BadInput {
            what: "reference audio".into(),
            expected: format!(
                "at least {} samples at 24 kHz (3 to 10 s of speech is best)",
                SpeakerEncoder::MIN_SAMPLES
            ),
            found: format!("{} samples", audio.len()),
        });
    }
    if let Some(i) = audio.iter().position(|v| !v.is_finite()) {
        return Err(VoiceError::BadInput {
            what: "reference audio".into(),
            expected: "finite samples".into(),
            found: format!("{} at sample {i}", audio[i]),
        });
    }
    Ok(())
}

impl ClonedVoice {
    /// Whether it was made for the model whose `mmproj` this is.
    pub fn check_for(&self, mmproj: &GgufFile) -> Result<(), VoiceError> {
        self.check_model(&model_of(mmproj)?)
    }
}

/// A model's encoders, loaded by the first cloning and then kept, for threads to share (one
/// cloning at a time): what a long-lived front end holds (the server, the C ABI, Python).
#[derive(Debug)]
pub struct SharedCloner {
    files: ModelFiles,
    threads: usize,
    cloner: Mutex<Option<Cloner>>,
}

impl SharedCloner {
    /// For the model `files`, computing on `threads` threads; loads nothing yet.
    pub fn new(files: ModelFiles, threads: usize) -> Self {
        SharedCloner {
            files,
            threads,
            cloner: Mutex::new(None),
        }
    }

    /// [`Cloner::clone_voice`], after loading the encoders ([`Cloner::load`]) on the first call.
    pub fn clone_voice(
        &self,
        audio: &[f32],
        text: Option<&str>,
    ) -> Result<ClonedVoice, VoiceError> {
        let mut slot = self.cloner.lock().unwrap_or_else(|e| e.into_inner());
        let cloner = match slot.as_mut() {
            Some(c) => c,
            None => slot.insert(Cloner::load(&self.files, self.threads)?),
        };
        cloner.clone_voice(audio, text)
    }
}

/// The talker's voice for a saved voice, with the model files it will speak with (`mmproj`:
/// the code predictor's embedding tables embed the reference frames). `language` as for any
/// voice (`None`: auto).
pub fn speaking_voice(
    mmproj: &GgufFile,
    v: &ClonedVoice,
    language: Option<String>,
) -> Result<Voice, VoiceError> {
    v.check_for(mmproj)?;
    let reference = match &v.text {
        None => None,
        Some(text) => Some(Arc::new(IclReference {
            text: TextInput::Text(text.clone()),
            codes: v.codes.clone(),
            embedded: embed_frames(mmproj, &v.codes)?,
        })),
    };
    Ok(Voice {
        language,
        xvector: Some(v.xvector.clone()),
        reference,
        ..Voice::default()
    })
}

/// Each frame's 16 code embeddings summed (the talker's codec row of code 0, then the code
/// predictor's table k of code k), as `CodePredictor::embed_frame` computes them, read from the
/// mmproj without loading the code predictor.
pub fn embed_frames(mmproj: &GgufFile, codes: &[[u32; 16]]) -> Result<Vec<f32>, VoiceError> {
    let table =
        |name: &str| -> Result<(crate::gguf::GgmlType, Vec<u64>, &[u8]), VoiceError> {
            let t = mmproj.header.tensor(name).ok_or_else(|| {
                crate::error::ModelError::MissingTensor {
                    path: mmproj.path().into(),
                    tensor: name.into(),
                }
            })?;
            let data = mmproj.tensor_data(name).unwrap_or_default();
            Ok((t.ty, t.ne.clone(), data))
        };
    let (ty0, ne0, d0) = table("a.gen.code.out_embd.weight")?;
    let (ty, ne, d) = table("a.gen.code.embd.weight")?;
    let n = ne0[0] as usize;
    let n_codes = ne[1] as usize;
    let row0 = ty0.nbytes(&[n as u64]).unwrap_or(0) as usize;
    let row = ty.nbytes(&[n as u64]).unwrap_or(0) as usize;
    let mut out = vec![0.0f32; codes.len() * n];
    let mut tmp = vec![0.0f32; n];
    for (f, o) in codes.iter().zip(out.chunks_exact_mut(n)) {
        let bad = || VoiceError::BadInput {
            what: "reference codes".into(),
            expected: format!("codes below {n_codes}"),
            found: format!("{f:?}"),
        };
        let bytes = d0
            .get(f[0] as usize * row0..(f[0] as usize + 1) * row0)
            .ok_or_else(bad)?;
        crate::ffi::dequantize_into(ty0, bytes, o).map_err(crate::error::ModelError::from)?;
        for (k, &c) in f[1..].iter().enumerate() {
            if c as usize >= n_codes {
                return Err(bad());
            }
            let at = (k * n_codes + c as usize) * row;
            let bytes = d.get(at..at + row).ok_or_else(bad)?;
            crate::ffi::dequantize_into(ty, bytes, &mut tmp)
                .map_err(crate::error::ModelError::from)?;
            for (o, x) in o.iter_mut().zip(&tmp) {
                *o += x;
            }
        }
    }
    Ok(out)
}
