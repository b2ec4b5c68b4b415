#!/usr/bin/env python3
"""Small encoded reference files for the audio-in tests (tests/fixtures/voice/audio/).

The speech-like test signal of make_voice.py (`sig`) at 22050 Hz, 1.5 s, written by soundfile
(libsndfile) as FLAC (16-bit, stereo: the signal and 0.6x its reverse), Ogg/Vorbis and MP3 (mono),
plus `source.f32`: the mono signal's float32 samples, against which the decoded files are compared
(FLAC exactly after 16-bit rounding, the lossy ones by SNR).

Usage: python tools/oracle/make_audio_fixtures.py --out tests/fixtures/voice/audio
(in the oracle venv: `. ~/.cache/qtts/oracle-venv/bin/activate`).
"""
import argparse
import os
import sys

import numpy as np
import soundfile as sf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_voice import sig  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    sr, n = 22050, int(1.5 * 22050)
    x = sig(n, sr, 7).astype(np.float32)
    stereo = np.stack([x, 0.6 * x[::-1]], axis=1)
    sf.write(os.path.join(a.out, "stereo.flac"), stereo, sr, subtype="PCM_16")
    sf.write(os.path.join(a.out, "mono.ogg"), x, sr, format="OGG", subtype="VORBIS")
    sf.write(os.path.join(a.out, "mono.mp3"), x, sr, format="MP3", subtype="MPEG_LAYER_III")
    x.tofile(os.path.join(a.out, "source.f32"))
    for f in sorted(os.listdir(a.out)):
        print(f, os.path.getsize(os.path.join(a.out, f)))


if __name__ == "__main__":
    main()
