//! Saved voices: a [`ClonedVoice`] as a small versioned JSON file, and a [`VoiceStore`]
//! directory of them (`qtts voice add|list|rm`).
//!
//! A voice file holds what makes the next request cheap: the x-vector, the reference's codes and
//! its transcript (the decoder state the codes prime is rebuilt once per process and kept, see
//! `engine`). It names the model it was made for (type, size, width): the x-vector and codes mean
//! nothing to another model. A SHA-256 of the payload catches a damaged file.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::VoiceError;
use crate::talker::Voice;

/// The `format` field of a voice file.
pub const FORMAT: &str = "qtts-voice";
/// The version this build writes and reads.
pub const VERSION: u32 = 1;

/// The model a voice belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VoiceModel {
    /// `base`.
    pub model_type: String,
    /// `0b6`, `1b7`.
    pub size: String,
    /// The talker's width, the x-vector's length.
    pub hidden: usize,
}

/// A voice made from a reference recording.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClonedVoice {
    /// [`FORMAT`].
    pub format: String,
    /// [`VERSION`].
    pub version: u32,
    /// The model it was made with.
    pub model: VoiceModel,
    /// The speaker encoder's x-vector.
    pub xvector: Vec<f32>,
    /// The reference's codes (12.5 Hz frames); empty for an x-vector-only voice.
    pub codes: Vec<[u32; 16]>,
    /// The reference's transcript; `None` for an x-vector-only voice.
    pub text: Option<String>,
    /// The reference's length in seconds.
    pub seconds: f32,
    /// SHA-256 of the payload (model, x-vector, codes, text), hex.
    pub checksum: String,
}

impl ClonedVoice {
    /// A checked voice with its checksum.
    pub fn new(
        model: VoiceModel,
        xvector: Vec<f32>,
        codes: Vec<[u32; 16]>,
        text: Option<String>,
        seconds: f32,
    ) -> Result<Self, VoiceError> {
        let mut v = ClonedVoice {
            format: FORMAT.into(),
            version: VERSION,
            model,
            xvector,
            codes,
            text,
            seconds,
            checksum: String::new(),
        };
        v.checksum = v.digest();
        v.check(Path::new("(new voice)"))?;
        Ok(v)
    }

    /// Whether it speaks in context (has a transcript and codes).
    pub fn in_context(&self) -> bool {
        self.text.is_some()
    }

    fn digest(&self) -> String {
        let mut h = Sha256::new();
        h.update(self.model.model_type.as_bytes());
        h.update([0]);
        h.update(self.model.size.as_bytes());
        h.update((self.model.hidden as u64).to_le_bytes());
        for x in &self.xvector {
            h.update(x.to_le_bytes());
        }
        for f in &self.codes {
            for c in f {
                h.update(c.to_le_bytes());
            }
        }
        if let Some(t) = &self.text {
            h.update([1]);
            h.update(t.as_bytes());
        }
        h.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }

    fn check(&self, path: &Path) -> Result<(), VoiceError> {
        let bad = |expected: String, found: String| VoiceError::VoiceFile {
            path: path.into(),
            expected,
            found,
        };
        if self.format != FORMAT || self.version != VERSION {
            return Err(bad(
                format!("format {FORMAT:?} version {VERSION}"),
                format!("format {:?} version {}", self.format, self.version),
            ));
        }
        if self.checksum != self.digest() {
            return Err(bad(
                "a payload matching its checksum".into(),
                "a different payload: the file is damaged; add the voice again".into(),
            ));
        }
        if self.xvector.len() != self.model.hidden || self.xvector.iter().any(|x| !x.is_finite()) {
            return Err(bad(
                format!("{} finite x-vector values", self.model.hidden),
                format!("{} values", self.xvector.len()),
            ));
        }
        if self.text.is_some() == self.codes.is_empty()
            || self.codes.iter().flatten().any(|&c| c >= 2048)
        {
            return Err(bad(
                "codes below 2048 with a transcript, none without".into(),
                format!(
                    "{} frames, transcript {}",
                    self.codes.len(),
                    self.text.is_some()
                ),
            ));
        }
        Ok(())
    }

    /// Whether it was made for `model`.
    pub fn check_model(&self, model: &VoiceModel) -> Result<(), VoiceError> {
        if &self.model != model {
            return Err(VoiceError::WrongModel {
                expected: format!("{} {}", model.model_type, model.size),
                found: format!(
                    "{} {} (width {})",
                    self.model.model_type, self.model.size, self.model.hidden
                ),
            });
        }
        Ok(())
    }

    /// Reads and checks a voice file.
    pub fn read(path: &Path) -> Result<Self, VoiceError> {
        let text = std::fs::read_to_string(path).map_err(|e| VoiceError::Io {
            path: path.into(),
            source: e,
        })?;
        Self::from_json(&text, path)
    }

    /// Parses and checks a voice file's `text`, read from `path` (named in errors).
    pub fn from_json(text: &str, path: &Path) -> Result<Self, VoiceError> {
        let v: ClonedVoice = serde_json::from_str(text).map_err(|e| VoiceError::VoiceFile {
            path: path.into(),
            expected: "a qtts voice file (JSON)".into(),
            found: format!("{e}: the file is damaged or not a voice; add the voice again"),
        })?;
        v.check(path)?;
        Ok(v)
    }

    /// Writes the file atomically (a temporary file renamed over `path`).
    pub fn write(&self, path: &Path) -> Result<(), VoiceError> {
        let io = |e| VoiceError::Io {
            path: path.into(),
            source: e,
        };
        let json = serde_json::to_string(self).map_err(|e| io(std::io::Error::other(e)))?;
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, json).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }
}

/// A directory of saved voices, one `NAME.json` each.
#[derive(Debug, Clone)]
pub struct VoiceStore {
    dir: PathBuf,
}

impl VoiceStore {
    /// The store in `dir` (created when a voice is added).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        VoiceStore { dir: dir.into() }
    }

    /// `$QTTS_VOICES`, else `$XDG_DATA_HOME/qtts/voices`, else `~/.local/share/qtts/voices`.
    pub fn default_dir() -> PathBuf {
        if let Some(d) = std::env::var_os("QTTS_VOICES") {
            return d.into();
        }
        let data = std::env::var_os("XDG_DATA_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".local/share")))
            .unwrap_or_else(|| PathBuf::from("."));
        data.join("qtts").join("voices")
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, name: &str) -> Result<PathBuf, VoiceError> {
        let ok = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && !name.starts_with('.');
        if !ok {
            return Err(VoiceError::BadInput {
                what: "voice name".into(),
                expected: "1 to 64 letters, digits, '-', '_' or '.', not starting with '.'".into(),
                found: format!("{name:?}"),
            });
        }
        Ok(self.dir.join(format!("{name}.json")))
    }

    /// Saves `voice` as `name`, replacing one of that name.
    pub fn add(&self, name: &str, voice: &ClonedVoice) -> Result<PathBuf, VoiceError> {
        let path = self.path(name)?;
        std::fs::create_dir_all(&self.dir).map_err(|e| VoiceError::Io {
            path: self.dir.clone(),
            source: e,
        })?;
        voice.write(&path)?;
        Ok(path)
    }

    /// The voice saved as `name`.
    pub fn get(&self, name: &str) -> Result<ClonedVoice, VoiceError> {
        let path = self.path(name)?;
        if !path.is_file() {
            return Err(VoiceError::UnknownVoice {
                name: name.into(),
                dir: self.dir.clone(),
                known: self.names().unwrap_or_default(),
            });
        }
        ClonedVoice::read(&path)
    }

    /// The voice `name` means on every surface (C's `voice`, Python's `voice=`, `qtts speak
    /// --voice`, the server's `voice`): the model's speaker of that name (any case; `speakers`:
    /// `EngineInfo::speakers`) when it has one, else the voice saved here under that name,
    /// checked against the model (`mmproj`).
    pub fn named(
        &self,
        speakers: &[String],
        mmproj: &Path,
        name: &str,
        language: Option<String>,
    ) -> Result<Voice, VoiceError> {
        if let Some(s) = speakers.iter().find(|s| s.eq_ignore_ascii_case(name)) {
            return Ok(Voice {
                speaker: Some(s.clone()),
                language,
                ..Voice::default()
            });
        }
        let voice = match self.get(name) {
            Err(VoiceError::UnknownVoice { name, dir, known }) => {
                return Err(VoiceError::UnknownName {
                    name,
                    speakers: speakers.to_vec(),
                    dir,
                    known,
                })
            }
            other => other?,
        };
        let mmproj = crate::gguf::GgufFile::open(mmproj)?;
        super::speaking_voice(&mmproj, &voice, language)
    }

    /// The saved names, sorted.
    pub fn names(&self) -> Result<Vec<String>, VoiceError> {
        let rd = match std::fs::read_dir(&self.dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => {
                return Err(VoiceError::Io {
                    path: self.dir.clone(),
                    source: e,
                })
            }
        };
        let mut v: Vec<String> = rd
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let p = e.path();
                (p.extension()? == "json").then(|| p.file_stem()?.to_str().map(str::to_owned))?
            })
            .collect();
        v.sort();
        Ok(v)
    }

    /// Removes the voice saved as `name`.
    pub fn remove(&self, name: &str) -> Result<(), VoiceError> {
        let path = self.path(name)?;
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(VoiceError::UnknownVoice {
                name: name.into(),
                dir: self.dir.clone(),
                known: self.names().unwrap_or_default(),
            }),
            Err(e) => Err(VoiceError::Io { path, source: e }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn voice() -> ClonedVoice {
        let model = VoiceModel {
            model_type: "base".into(),
            size: "0b6".into(),
            hidden: 4,
        };
        ClonedVoice::new(
            model,
            vec![0.5, -1.25, 3.0e-7, 2.0],
            vec![[7; 16], [2047; 16]],
            Some("Hello.".into()),
            0.16,
        )
        .unwrap()
    }

    #[test]
    fn a_voice_survives_the_store_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let store = VoiceStore::new(dir.path().join("voices"));
        assert!(store.names().unwrap().is_empty());
        let v = voice();
        store.add("anna", &v).unwrap();
        assert_eq!(store.get("anna").unwrap(), v);
        assert_eq!(store.names().unwrap(), ["anna"]);
        store.remove("anna").unwrap();
        assert!(matches!(
            store.get("anna"),
            Err(VoiceError::UnknownVoice { .. })
        ));
        assert!(matches!(
            store.remove("anna"),
            Err(VoiceError::UnknownVoice { .. })
        ));
        for bad in ["", "../x", ".hidden", "a/b", "é"] {
            assert!(
                matches!(store.add(bad, &v), Err(VoiceError::BadInput { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn damaged_foreign_and_other_model_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = VoiceStore::new(dir.path());
        let path = store.add("v", &voice()).unwrap();
        let good = std::fs::read_to_string(&path).unwrap();
        // One code changed: the checksum catches it.
        std::fs::write(&path, good.replacen("2047", "2046", 1)).unwrap();
        assert!(matches!(store.get("v"), Err(VoiceError::VoiceFile { .. })));
        // Cut short, and not JSON at all.
        std::fs::write(&path, &good[..good.len() / 2]).unwrap();
        assert!(matches!(store.get("v"), Err(VoiceError::VoiceFile { .. })));
        std::fs::write(&path, b"\x00\x01RIFF").unwrap();
        assert!(matches!(store.get("v"), Err(VoiceError::VoiceFile { .. })));
        // Another version.
        std::fs::write(&path, good.replace("\"version\":1", "\"version\":2")).unwrap();
        assert!(matches!(store.get("v"), Err(VoiceError::VoiceFile { .. })));
        // Another model size.
        let other = VoiceModel {
            model_type: "base".into(),
            size: "1b7".into(),
            hidden: 2048,
        };
        assert!(matches!(
            voice().check_model(&other),
            Err(VoiceError::WrongModel { .. })
        ));
    }
}
