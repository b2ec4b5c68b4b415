//! The two GGUF files a model is made of.

use std::path::PathBuf;

use crate::error::ModelError;
use crate::gguf::{GgmlType, GgufFile};

/// The two GGUF files of a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelFiles {
    /// The talker (`general.architecture = qwen3tts`).
    pub talker: PathBuf,
    /// The code predictor and decoder (`mmproj`).
    pub mmproj: PathBuf,
}

impl ModelFiles {
    /// The GGUF pair of weight type `ty` that `qtts convert` writes into `dir`.
    pub fn converted_in(dir: &std::path::Path, ty: crate::model::convert::OutType) -> Self {
        let c = crate::model::convert::output_paths(dir, ty);
        ModelFiles {
            talker: c.talker,
            mmproj: c.mmproj,
        }
    }

    /// Refuses files that cannot give the exact path (`EngineConfig::exact`): every tensor of both
    /// files must be f32, as `qtts convert --type f32` writes them; quantized or f16 weights
    /// cannot reproduce the reference within its tolerance.
    pub fn check_exact(&self) -> Result<(), ModelError> {
        for path in [&self.talker, &self.mmproj] {
            let f = GgufFile::open(path)?;
            if let Some(t) = f.header.tensors.iter().find(|t| t.ty != GgmlType::F32) {
                return Err(ModelError::Unsupported {
                    what: format!("exact synthesis with {}", path.display()),
                    expected: "f32 weights in every tensor (`qtts convert --type f32`, or a \
                               checkpoint directory, converted to f32 once)"
                        .into(),
                    found: format!("{} stored as {:?}", t.name, t.ty),
                });
            }
        }
        Ok(())
    }
}
