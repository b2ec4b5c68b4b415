#!/usr/bin/env bash
# Download an official Qwen3-TTS checkpoint and convert it for qtts.
# Usage: models/download.sh Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice [f32|f16|q8_0|q6_k|q5_k|q4_k]
# Needs the Hugging Face CLI (pip install -U "huggingface_hub[cli]") and network access to the hub.
set -euo pipefail
repo="${1:?usage: download.sh <hf-repo> [type]}"
type="${2:-q8_0}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
name="${repo##*/}"
hf download "$repo" --local-dir "$here/hf/$name"
cd "$here/.."
cargo run --release -- convert "$here/hf/$name" "$here/$name-$type" --type "$type"
if [ -s "$here/SHA256SUMS" ]; then
    (cd "$here/.." && sha256sum --check --ignore-missing models/SHA256SUMS)
fi
