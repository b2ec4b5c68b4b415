//! Voice names: profiles from `--voices DIR`, the model's speakers, and OpenAI's voice names
//! mapped onto the speakers; languages by name or ISO 639-1 code.
//!
//! A profile is `DIR/NAME.json`:
//! `{"speaker": "ryan", "language": "english", "instruct": "...", "xvector": [f32, ...]}`, every
//! field optional (an instruction preset for VoiceDesign, a saved x-vector for Base, a speaker
//! with a default language for CustomVoice); or a voice cloned by `qtts voice add` (a `qtts-voice`
//! file, for the Base model it was made with), so `--voices` may name the saved voices' directory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use qtts::engine::EngineInfo;
use qtts::gguf::GgufFile;
use qtts::talker::Voice;
use qtts::voice::ClonedVoice;

/// OpenAI's built-in voice names, answered with the model's speakers in turn.
pub const OPENAI_VOICES: [&str; 13] = [
    "alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage", "shimmer", "verse",
    "marin", "cedar",
];

/// ISO 639-1 codes of the Qwen3-TTS languages.
const ISO: [(&str, &str); 10] = [
    ("zh", "chinese"),
    ("en", "english"),
    ("ja", "japanese"),
    ("ko", "korean"),
    ("de", "german"),
    ("fr", "french"),
    ("ru", "russian"),
    ("pt", "portuguese"),
    ("es", "spanish"),
    ("it", "italian"),
];

/// A profile file is wrong.
#[derive(Debug, thiserror::Error)]
pub enum VoicesError {
    /// The directory or a file could not be read.
    #[error("cannot read voice profiles at {path}: {source}")]
    Read {
        /// Which path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A profile is not the JSON expected.
    #[error(
        "voice profile {path}: {message}; expected a JSON object with optional \"speaker\", \
         \"language\", \"instruct\" and \"xvector\" (an array of floats)"
    )]
    Bad {
        /// Which file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A voice file made by `qtts voice add` cannot be spoken by this model.
    #[error("saved voice {path}: {source}")]
    Cloned {
        /// Which file.
        path: PathBuf,
        /// Why.
        source: Box<qtts::voice::VoiceError>,
    },
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Profile {
    speaker: Option<String>,
    language: Option<String>,
    instruct: Option<String>,
    xvector: Option<Vec<f32>>,
}

/// The named voices of a server.
#[derive(Debug, Default)]
pub struct Voices {
    profiles: BTreeMap<String, Voice>,
}

impl Voices {
    /// Loads every `*.json` of `dir`, checking each against the model (speaker, language,
    /// x-vector size). A cloned voice (`qtts voice add`) is checked against the model's `mmproj`
    /// and its reference embedded with it; without `mmproj` it is refused.
    pub fn load(
        dir: &Path,
        info: &EngineInfo,
        mmproj: Option<&GgufFile>,
    ) -> Result<Voices, VoicesError> {
        let read = |path: &Path, source| VoicesError::Read {
            path: path.to_path_buf(),
            source,
        };
        let mut profiles = BTreeMap::new();
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| read(dir, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        entries.sort();
        for path in entries {
            let bad = |message: String| VoicesError::Bad {
                path: path.clone(),
                message,
            };
            let text = std::fs::read_to_string(&path).map_err(|e| read(&path, e))?;
            let name = path
                .file_stem()
                .map(|s| s.to_string_lossy().to_lowercase())
                .unwrap_or_default();
            let value: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
            if value.get("format").and_then(|f| f.as_str()) == Some(qtts::voice::store::FORMAT) {
                let cloned = |source| VoicesError::Cloned {
                    path: path.clone(),
                    source: Box::new(source),
                };
                let Some(mm) = mmproj else {
                    return Err(bad(
                        "a cloned voice needs the model's files to be spoken".into()
                    ));
                };
                let v = ClonedVoice::from_json(&text, &path).map_err(cloned)?;
                let voice = qtts::voice::speaking_voice(mm, &v, None).map_err(cloned)?;
                profiles.insert(name, voice);
                continue;
            }
            let p: Profile = serde_json::from_value(value).map_err(|e| bad(e.to_string()))?;
            if let Some(s) = &p.speaker {
                if !info.speakers.iter().any(|k| k.eq_ignore_ascii_case(s)) {
                    return Err(bad(format!(
                        "speaker '{s}' is not one of the model's ({})",
                        info.speakers.join(", ")
                    )));
                }
            }
            let language = match &p.language {
                Some(l) => Some(language(l, info).ok_or_else(|| {
                    bad(format!(
                        "language '{l}' is not one of the model's ({})",
                        info.languages.join(", ")
                    ))
                })?),
                None => None,
            };
            if let Some(x) = &p.xvector {
                if x.len() != info.hidden || x.iter().any(|v| !v.is_finite()) {
                    return Err(bad(format!(
                        "xvector has {} values (finite: {}); the model takes {} finite values",
                        x.len(),
                        x.iter().all(|v| v.is_finite()),
                        info.hidden
                    )));
                }
            }
            profiles.insert(
                name,
                Voice {
                    speaker: p.speaker,
                    language,
                    instruct: p.instruct,
                    xvector: p.xvector,
                    reference: None,
                },
            );
        }
        Ok(Voices { profiles })
    }

    /// The profile names, sorted.
    pub fn profiles(&self) -> impl Iterator<Item = &str> {
        self.profiles.keys().map(String::as_str)
    }

    /// Every name a request may give, for messages: profiles, speakers, aliases (or `default`).
    pub fn names(&self, info: &EngineInfo) -> Vec<String> {
        let mut v: Vec<String> = self.profiles.keys().cloned().collect();
        v.extend(info.speakers.iter().cloned());
        if info.speakers.is_empty() {
            v.push("default".into());
        }
        v.extend(OPENAI_VOICES.iter().map(|s| s.to_string()));
        v
    }

    /// The voice `name` stands for: a profile, a speaker (any case), an OpenAI voice name (the
    /// model's speakers in turn), or, on a model without speakers, `default`. `None` gives the
    /// model's default voice. `Err` carries the names the model knows.
    pub fn resolve(&self, name: Option<&str>, info: &EngineInfo) -> Result<Voice, String> {
        let default = || Voice {
            speaker: info.default_speaker().map(str::to_owned),
            ..Voice::default()
        };
        let Some(name) = name.map(str::trim).filter(|n| !n.is_empty()) else {
            return Ok(default());
        };
        let lower = name.to_lowercase();
        if let Some(v) = self.profiles.get(&lower) {
            let mut v = v.clone();
            if v.speaker.is_none() {
                v.speaker = default().speaker;
            }
            return Ok(v);
        }
        if let Some(s) = info.speakers.iter().find(|s| s.eq_ignore_ascii_case(name)) {
            return Ok(Voice {
                speaker: Some(s.clone()),
                ..Voice::default()
            });
        }
        if let Some(i) = OPENAI_VOICES.iter().position(|v| *v == lower) {
            if info.speakers.is_empty() {
                return Ok(default());
            }
            return Ok(Voice {
                speaker: Some(info.speakers[i % info.speakers.len()].clone()),
                ..Voice::default()
            });
        }
        if info.speakers.is_empty() && lower == "default" {
            return Ok(default());
        }
        Err(self.names(info).join(", "))
    }
}

/// The model's language named `s`: a language of the model in any case, `auto`, or an ISO 639-1
/// code of one.
pub fn language(s: &str, info: &EngineInfo) -> Option<String> {
    let s = s.trim().to_lowercase();
    let name = ISO
        .iter()
        .find(|(code, _)| *code == s)
        .map(|(_, n)| n.to_string())
        .unwrap_or(s);
    info.languages
        .iter()
        .find(|l| l.eq_ignore_ascii_case(&name))
        .cloned()
}

/// The model's languages as ISO 639-1 codes (names without one as they are), `auto` left out:
/// what voice lists advertise.
pub fn iso_codes(info: &EngineInfo) -> Vec<String> {
    info.languages
        .iter()
        .filter(|l| *l != "auto")
        .map(|l| iso_code(l))
        .collect()
}

/// The ISO 639-1 code of a model language (the name itself when it has none).
pub fn iso_code(language: &str) -> String {
    ISO.iter()
        .find(|(_, n)| n.eq_ignore_ascii_case(language))
        .map(|(c, _)| c.to_string())
        .unwrap_or_else(|| language.to_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(speakers: &[&str]) -> EngineInfo {
        EngineInfo {
            model_type: "custom_voice",
            size: "0b6".into(),
            speakers: speakers.iter().map(|s| s.to_string()).collect(),
            languages: ["auto", "chinese", "english"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
            hidden: 4,
        }
    }

    #[test]
    fn names_resolve_in_order() {
        let i = info(&["serena", "vivian"]);
        let v = Voices::default();
        assert_eq!(
            v.resolve(None, &i).unwrap().speaker.as_deref(),
            Some("vivian")
        );
        assert_eq!(
            v.resolve(Some("SERENA"), &i).unwrap().speaker.as_deref(),
            Some("serena")
        );
        // OpenAI names take the speakers in turn.
        assert_eq!(
            v.resolve(Some("alloy"), &i).unwrap().speaker.as_deref(),
            Some("serena")
        );
        assert_eq!(
            v.resolve(Some("ash"), &i).unwrap().speaker.as_deref(),
            Some("vivian")
        );
        let e = v.resolve(Some("nobody"), &i).unwrap_err();
        assert!(e.contains("serena") && e.contains("alloy"), "{e}");
        let none = info(&[]);
        assert_eq!(v.resolve(Some("default"), &none).unwrap().speaker, None);
        assert_eq!(v.resolve(Some("alloy"), &none).unwrap().speaker, None);
    }

    #[test]
    fn languages_by_name_or_code() {
        let i = info(&[]);
        assert_eq!(language("en", &i).as_deref(), Some("english"));
        assert_eq!(language("Chinese", &i).as_deref(), Some("chinese"));
        assert_eq!(language("AUTO", &i).as_deref(), Some("auto"));
        assert_eq!(language("fr", &i), None);
        assert_eq!(iso_code("english"), "en");
    }

    #[test]
    fn profiles_are_checked_against_the_model() {
        let i = info(&["vivian"]);
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("Narrator.json"),
            r#"{"speaker":"vivian","language":"en"}"#,
        )
        .unwrap();
        let v = Voices::load(dir.path(), &i, None).unwrap();
        let n = v.resolve(Some("narrator"), &i).unwrap();
        assert_eq!(n.language.as_deref(), Some("english"));
        std::fs::write(dir.path().join("bad.json"), r#"{"xvector":[1.0]}"#).unwrap();
        let e = Voices::load(dir.path(), &i, None).unwrap_err().to_string();
        assert!(e.contains("bad.json") && e.contains("takes 4"), "{e}");
        std::fs::remove_file(dir.path().join("bad.json")).unwrap();
        // A cloned voice is not read as a profile; it needs the model's files.
        std::fs::write(dir.path().join("anna.json"), r#"{"format":"qtts-voice"}"#).unwrap();
        let e = Voices::load(dir.path(), &i, None).unwrap_err().to_string();
        assert!(
            e.contains("anna.json") && e.contains("model's files"),
            "{e}"
        );
    }
}
