#!/usr/bin/env bash
# Regenerates tests/fixtures/{tiny,tiny17,voice}: the official qwen-tts 0.1.1 package (PyTorch, CPU) run on
# seeded random weights with real configs, by the oracle scripts in ../shared/oracle (tiny, tiny17) and
# tools/oracle/make_voice.py (voice: Base model, speaker/codec encoders, ICL; about 2 min).
# Needs network access to PyPI once (the venv is ~7.4 GB) and about a minute per fixture.
# Usage: tools/make_fixtures.sh [VENV_DIR]     (default: $HOME/.cache/qtts/oracle-venv)
# The outputs are deterministic: a rerun, even from a fresh venv, gives bit-identical files.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
oracle="$root/../shared/oracle"
venv="${1:-$HOME/.cache/qtts/oracle-venv}"
[ -x "$venv/bin/python" ] || bash "$oracle/setup_venv.sh" "$venv"
# shellcheck disable=SC1091
. "$venv/bin/activate"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python "$oracle/make_tiny.py" --out "$tmp/tiny"
python "$oracle/make_tiny.py" --out "$tmp/tiny17" --cp-hidden 48
python "$root/tools/oracle/make_voice.py" --out "$tmp/voice"
for f in tiny tiny17 voice; do
    rm -rf "$root/tests/fixtures/$f"
    cp -r "$tmp/$f" "$root/tests/fixtures/$f"
done
du -sh "$root/tests/fixtures"
