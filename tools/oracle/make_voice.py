#!/usr/bin/env python3
"""Voice-cloning oracle: a tiny random-weight Qwen3-TTS **Base** checkpoint and per-stage reference
tensors of the official `qwen-tts` 0.1.1 package (speaker encoder, Mimi codec encoder, ICL and
x-vector-only generate, primed decode, librosa resampling). Spec: ../shared/design/voice-clone.md §5.

Deterministic from --seed (default 20260122, like make_tiny.py). Reuses ../shared/oracle/oracle_common.py.

  OUT/model/                                 tiny Base checkpoint, float32 (speaker encoder included)
  OUT/oracle/speaker_encoder.safetensors     A: mel front end + ECAPA stages + x-vector (+ f64 study)
  OUT/oracle/codec_encoder_{aligned,ragged,long}.safetensors
                                             B: SEANet / transformer / downsample / RVQ stages, codes,
                                                f64 distances, f64 codes
  OUT/oracle/{icl_stream,icl_stream_longtext,icl_nonstream,xvec_stream,xvec_nonstream}.safetensors
                                             C: greedy generate() with a voice_clone_prompt, and the
                                                wrapper's output assembly (decode ref++gen, cut)
  OUT/oracle/decoder_primed.safetensors      D: one-shot decode of ref(70)++gen(12) random codes
  OUT/oracle/resample.safetensors            E: librosa.resample (soxr_hq) of the test signal to 24 kHz
  OUT/manifest.json                          tensors, shapes, notes, precision study, versions, sizes

Reruns on the same CPU type are bit-identical; on another CPU the float32 stage tensors can move by
round-off (~1e-6; the checkpoint files do not change), as for make_tiny.py.

Usage: python tools/oracle/make_voice.py --out OUT [--seed 20260122] [--gen-frames 8]
       python tools/oracle/make_voice.py --full OUT_FULL   (0.6B Base geometry, bf16 on disk, A+B only;
                                                            ~3 GB disk, ~8 GB RAM; not committed)
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "..", "shared", "oracle"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as Fnn  # noqa: E402

from oracle_common import (  # noqa: E402
    TINY_TEXT, TensorBag, build_tokenizer, build_tts, calibrate_decoder_output, diff_stats,
    full_06b_tts_config, full_tokenizer_config, load_tts_dir, oracle_init, save_tts_dir,
    tiny_tokenizer_config, tiny_tts_config, versions,
)
from make_tiny import run_decoder  # noqa: E402

import librosa  # noqa: E402
from qwen_tts.core.models import modeling_qwen3_tts as qmdl  # noqa: E402
from transformers import masking_utils  # noqa: E402
from transformers.models.mimi import modeling_mimi  # noqa: E402

SR = 24000
N_FFT, HOP, WIN, N_MELS, FMAX = 1024, 256, 1024, 128, 12000


# --------------------------------------------------------------------------------------
# Test signal
# --------------------------------------------------------------------------------------
def sig(n: int, sr: int, seed: int) -> np.ndarray:
    """Deterministic speech-like test signal, float32 [n] at `sr` Hz.

    Harmonics (amplitude 1/k, up to min(0.45 sr, 8 kHz) / 220 Hz of them) of an f0 that glides
    110 -> 220 -> 110 Hz (raised cosine, period 2.4 s) with a 5.5 Hz +-2 % vibrato; syllable-like
    amplitude modulation (4 Hz, 0.2..1); seeded Gaussian noise 30 dB below the harmonic part's RMS;
    exact digital zeros over [0.25 s, 0.45 s); scaled to peak 0.9 (times 1-1e-6).
    """
    t = np.arange(n, dtype=np.float64) / sr
    glide = 0.5 - 0.5 * np.cos(2 * np.pi * t / 2.4)
    f0 = 110.0 * 2.0 ** glide * (1.0 + 0.02 * np.sin(2 * np.pi * 5.5 * t))
    phase = 2 * np.pi * np.cumsum(f0) / sr
    kmax = int(min(0.45 * sr, 8000.0) // 220.0)
    harm = np.zeros(n)
    for k in range(1, kmax + 1):
        harm += np.sin(k * phase + 0.7 * k) / k
    env = 0.2 + 0.8 * (0.5 - 0.5 * np.cos(2 * np.pi * 4.0 * t))
    x = env * harm
    rms = float(np.sqrt(np.mean(x ** 2))) if n else 0.0
    noise = np.random.default_rng(seed).standard_normal(n)
    x = x + noise * rms * 10 ** (-30 / 20)
    z0, z1 = int(0.25 * sr), int(0.45 * sr)
    x[z0:min(z1, n)] = 0.0
    peak = float(np.abs(x).max()) if n else 1.0
    return (x * (0.9 * (1 - 1e-6) / peak)).astype(np.float32)


def zero_span(n, sr):
    return [int(0.25 * sr), min(int(0.45 * sr), n)]


# --------------------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------------------
def tiny_base_configs(talker_hidden=64):
    tts = tiny_tts_config(talker_hidden)
    tts["tts_model_type"] = "base"
    tts["talker_config"]["spk_id"] = {}
    tts["talker_config"]["spk_is_dialect"] = {}
    tts["speaker_encoder_config"] = {
        "enc_dim": talker_hidden, "sample_rate": SR, "enc_channels": [32, 32, 32, 32, 96],
        "enc_attention_channels": 16, "enc_se_channels": 16,
    }
    tok = tiny_tokenizer_config()
    tok["encoder_config"]["sliding_window"] = 16
    return tts, tok


def full_base_configs():
    tts = full_06b_tts_config()
    tts["tts_model_type"] = "base"
    tts["talker_config"]["spk_id"] = {}
    tts["talker_config"]["spk_is_dialect"] = {}
    tts["speaker_encoder_config"] = {"enc_dim": tts["talker_config"]["hidden_size"], "sample_rate": SR}
    tok = full_tokenizer_config()
    tok["encoder_config"]["sliding_window"] = 250  # the real speech_tokenizer/config.json value
    return tts, tok


# --------------------------------------------------------------------------------------
# A: speaker encoder
# --------------------------------------------------------------------------------------
def official_mel(wav: np.ndarray) -> torch.Tensor:
    """Exactly the call in Qwen3TTSForConditionalGeneration.extract_speaker_embedding -> [F,128]."""
    return qmdl.mel_spectrogram(torch.from_numpy(wav).unsqueeze(0), n_fft=1024, num_mels=128,
                                sampling_rate=24000, hop_size=256, win_size=1024, fmin=0,
                                fmax=12000).transpose(1, 2)[0]


def mel_stages(wav: np.ndarray, dtype=torch.float32):
    """Step-by-step replica of qwen_tts mel_spectrogram (float32: must equal it bit for bit)."""
    np_dt = np.float32 if dtype == torch.float32 else np.float64
    basis = torch.from_numpy(librosa.filters.mel(sr=SR, n_fft=N_FFT, n_mels=N_MELS, fmin=0, fmax=FMAX,
                                                 dtype=np.float64)).to(dtype)
    if dtype == torch.float32:  # what the package does: librosa's default float32 filterbank
        basis = torch.from_numpy(librosa.filters.mel(sr=SR, n_fft=N_FFT, n_mels=N_MELS, fmin=0,
                                                     fmax=FMAX)).float()
    window = torch.hann_window(WIN, dtype=dtype)
    y = torch.from_numpy(wav.astype(np_dt)).unsqueeze(0)
    pad = (N_FFT - HOP) // 2
    y = Fnn.pad(y.unsqueeze(1), (pad, pad), mode="reflect").squeeze(1)
    spec = torch.stft(y, N_FFT, hop_length=HOP, win_length=WIN, window=window, center=False,
                      pad_mode="reflect", normalized=False, onesided=True, return_complex=True)
    mag = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
    mel = torch.matmul(basis, mag)
    log_mel = torch.log(torch.clamp(mel, min=1e-5))
    return {"hann": window, "mel_basis": basis, "stft_mag": mag[0].T, "mel": mel[0].T,
            "log_mel": log_mel[0].T}


@torch.no_grad()
def run_speaker_encoder(spk, mels: torch.Tensor):
    """ECAPA forward on mels [F,128] with hooks on the official modules. Returns name -> tensor."""
    cap = {}
    hooks = []

    def grab(name, fn=lambda o: o[0]):
        return lambda m, i, o: cap.__setitem__(name, fn(o).clone())

    hooks.append(spk.blocks[0].register_forward_hook(grab("spk.blocks.0")))
    for b in (1, 2, 3):
        blk = spk.blocks[b]
        hooks.append(blk.tdnn1.register_forward_hook(grab(f"spk.blocks.{b}.tdnn1")))
        hooks.append(blk.res2net_block.register_forward_hook(grab(f"spk.blocks.{b}.res2net")))
        hooks.append(blk.tdnn2.register_forward_hook(grab(f"spk.blocks.{b}.tdnn2")))
        hooks.append(blk.se_block.sigmoid.register_forward_hook(grab(f"spk.blocks.{b}.se_gate",
                                                                     lambda o: o[0, :, 0])))
        hooks.append(blk.register_forward_hook(grab(f"spk.blocks.{b}")))
    hooks.append(spk.mfa.register_forward_hook(grab("spk.mfa")))
    hooks.append(spk.asp.conv.register_forward_hook(grab("spk.asp.attn_logits")))
    hooks.append(spk.asp.register_forward_hook(grab("spk.asp", lambda o: o[0, :, 0])))
    hooks.append(spk.fc.register_forward_hook(grab("fc_out", lambda o: o[0, :, 0])))
    stats = []
    orig_stats = spk.asp._compute_statistics
    spk.asp._compute_statistics = lambda x, m, dim=2: stats.append(orig_stats(x, m, dim)) or stats[-1]
    try:
        xvec = spk(mels.unsqueeze(0).to(next(spk.parameters()).dtype))[0]
    finally:
        del spk.asp._compute_statistics
        for h in hooks:
            h.remove()
    assert len(stats) == 2
    cap["spk.asp.global_mean"] = stats[0][0][0].clone()
    cap["spk.asp.global_std"] = stats[0][1][0].clone()
    # Consistency of the hook assembly with the module graph.
    assert torch.equal(cap["fc_out"], xvec)
    re_x = spk.fc(cap["spk.asp"].view(1, -1, 1))[0, :, 0]
    assert torch.equal(re_x, xvec), "fc(spk.asp) != x-vector"
    re_mfa = spk.mfa(torch.cat([cap[f"spk.blocks.{b}"] for b in (1, 2, 3)], 0).unsqueeze(0))[0]
    assert torch.equal(re_mfa, cap["spk.mfa"]), "mfa(cat(blocks 1..3)) mismatch"
    cap["xvector"] = xvec.clone()
    del cap["fc_out"]
    return cap


SPK_STAGES = (["spk.blocks.0"]
              + [f"spk.blocks.{b}.{s}" for b in (1, 2, 3) for s in ("tdnn1", "res2net", "tdnn2", "se_gate")]
              + [f"spk.blocks.{b}" for b in (1, 2, 3)]
              + ["spk.mfa", "spk.asp.global_mean", "spk.asp.global_std", "spk.asp.attn_logits", "spk.asp",
                 "xvector"])


def oracle_speaker_encoder(model, model64, wav: np.ndarray):
    """A. Returns (TensorBag, precision dict, xvector f32)."""
    official = official_mel(wav)
    m32 = mel_stages(wav, torch.float32)
    assert torch.equal(m32["log_mel"], official), "mel replica != qwen_tts mel_spectrogram"
    # The x-vector exactly as the package computes it (mel inside), with hooks on the ECAPA modules.
    pre = {}
    h = model.speaker_encoder.register_forward_pre_hook(lambda m, a: pre.__setitem__("mels", a[0][0].clone()))
    spk = model.speaker_encoder
    with torch.no_grad():
        xvec_api = model.extract_speaker_embedding(audio=wav, sr=SR).clone()
    h.remove()
    assert torch.equal(pre["mels"], official), "speaker encoder input != mel_spectrogram(...)"
    cap = run_speaker_encoder(spk, official)
    assert torch.equal(cap["xvector"], xvec_api), "hook-assembled x-vector != extract_speaker_embedding"

    F = official.shape[0]
    assert F == len(wav) // 256
    bag = TensorBag()
    bag.add("wav_24k", torch.from_numpy(wav), f"[N={len(wav)}] test signal sig(), 24 kHz float32")
    bag.add("hann", m32["hann"], "[1024] torch.hann_window(1024) (periodic)")
    bag.add("mel_basis", m32["mel_basis"], "[128,513] librosa.filters.mel(sr=24000,n_fft=1024,n_mels=128,fmin=0,"
            "fmax=12000) float32 (Slaney scale+norm)")
    bag.add("stft_mag", m32["stft_mag"], "[F,513] sqrt(re^2+im^2+1e-9), reflect pad 384, center=False, hop 256")
    bag.add("log_mel", official, "[F,128] log(clamp(basis@mag,1e-5)) = speaker-encoder input (F = N//256)")
    for k in SPK_STAGES:
        t = cap[k]
        note = {"spk.blocks.0": "[C,F] TDNN k5 + ReLU", "spk.mfa": "[3C,F] mfa(cat(blocks 1..3))",
                "spk.asp.global_mean": "[3C] uniform mean over F", "spk.asp.global_std": "[3C] population std, clamp 1e-12",
                "spk.asp.attn_logits": "[3C,F] asp.conv(tanh(relu(tdnn(cat(z,mean,std))))), pre-softmax",
                "spk.asp": "[6C] cat(weighted mean, weighted std)", "xvector": "[enc_dim] fc(spk.asp) = extract_speaker_embedding"}.get(k, "")
        if k.endswith(".se_gate"):
            note = "[C] sigmoid(conv2(relu(conv1(mean_t(tdnn2)))))"
        elif k.endswith(".res2net"):
            note = "[C,F] Res2Net (scale 8) output"
        elif k.startswith("spk.blocks.") and k.count(".") == 2 and k != "spk.blocks.0":
            note = "[C,F] tdnn2*se_gate + block input"
        bag.add(k, t, note)

    prec = {}
    # float64: the same formula in float64 (float64 filterbank and window), ECAPA in float64
    m64 = mel_stages(wav, torch.float64)
    cap64 = run_speaker_encoder(model64.speaker_encoder, m64["log_mel"])
    bag.add("xvector_f64", cap64["xvector"].float(), "x-vector with mel + ECAPA in float64 (stored f32)")
    bag.add("log_mel_f64", m64["log_mel"].float(), "log_mel in float64 (float64 filterbank/window), stored f32")
    prec["stft_mag_f32_vs_f64"] = diff_stats(m32["stft_mag"], m64["stft_mag"])
    mel64 = m64["mel"]
    big = mel64 >= 1e-3
    d = (m32["log_mel"].double() - m64["log_mel"]).abs()
    prec["log_mel_f32_vs_f64"] = {"max_abs_where_mel_ge_1e-3": float(d[big].max()),
                                  "max_abs_where_mel_lt_1e-3": float(d[~big].max()) if (~big).any() else 0.0,
                                  "frac_bins_mel_lt_1e-3": float((~big).double().mean()),
                                  "frac_bins_at_floor_1e-5": float((m32["mel"] <= 1e-5).double().mean())}
    # ECAPA stages: f64 end to end, and f64 ECAPA on the f32 log_mel (isolates the network's round-off)
    cap64b = run_speaker_encoder(model64.speaker_encoder, official.double())
    prec["ecapa_stages_f32_vs_f64_end_to_end"] = {k: diff_stats(cap[k], cap64[k])["max_rel_to_peak"] for k in SPK_STAGES}
    prec["ecapa_stages_f32_vs_f64_same_mel"] = {k: diff_stats(cap[k], cap64b[k])["max_rel_to_peak"] for k in SPK_STAGES}
    prec["xvector_f32_vs_f64"] = diff_stats(cap["xvector"], cap64["xvector"])
    prec["xvector_cosine_f32_vs_f64"] = float(torch.nn.functional.cosine_similarity(
        cap["xvector"].double(), cap64["xvector"], dim=0))
    prec["stage_peaks"] = {k: float(cap[k].abs().max()) for k in SPK_STAGES}
    return bag, prec, xvec_api


# --------------------------------------------------------------------------------------
# B: codec (Mimi) encoder
# --------------------------------------------------------------------------------------
SEANET_IDX = (0, 1, 3, 4, 6, 7, 9, 10, 12, 14)


def exact_quantize(self, hidden_states):
    """Nearest centroid in the input's own dtype (the package casts to float32 via cdist)."""
    e = self.embed.to(hidden_states.dtype)
    d2 = (hidden_states ** 2).sum(-1, keepdim=True) + (e ** 2).sum(-1)[None] - 2 * hidden_states @ e.T
    return d2.argmin(dim=-1)


@torch.no_grad()
def run_codec_encoder(tok, wav: torch.Tensor, exact_f64_argmin=False):
    """tok.encode (Qwen3TTSTokenizerV2Model) with hooks. wav [N] in tok's dtype. Returns dict."""
    enc = tok.encoder
    cap = {}
    hooks = []
    for i in SEANET_IDX:
        hooks.append(enc.encoder.layers[i].register_forward_hook(
            lambda m, a, o, i=i: cap.__setitem__(f"seanet.layers.{i}", o[0].clone())))
    for i, layer in enumerate(enc.encoder_transformer.layers):
        hooks.append(layer.register_forward_hook(
            lambda m, a, o, i=i: cap.__setitem__(f"tfm.layer.{i}", o[0][0].clone())))
    hooks.append(enc.downsample.register_forward_hook(lambda m, a, o: cap.__setitem__("downsample", o[0].clone())))
    q = enc.quantizer
    hooks.append(q.semantic_residual_vector_quantizer.input_proj.register_forward_hook(
        lambda m, a, o: cap.__setitem__("proj_sem", o[0].T.clone())))
    hooks.append(q.acoustic_residual_vector_quantizer.input_proj.register_forward_hook(
        lambda m, a, o: cap.__setitem__("proj_ac", o[0].T.clone())))
    level_in = {"sem": [], "ac": []}
    patched = []
    for key, rvq in (("sem", q.semantic_residual_vector_quantizer), ("ac", q.acoustic_residual_vector_quantizer)):
        for layer in rvq.layers:
            def enc_wrap(h, _f=layer.encode, key=key):
                level_in[key].append(h[0].T.clone())
                return _f(h)
            layer.encode = enc_wrap
            patched.append(layer)
    orig_q = modeling_mimi.MimiEuclideanCodebook.quantize
    if exact_f64_argmin:
        modeling_mimi.MimiEuclideanCodebook.quantize = exact_quantize
    try:
        x = wav.view(1, -1)
        out = tok.encode(x, padding_mask=torch.ones_like(x, dtype=torch.long))
    finally:
        modeling_mimi.MimiEuclideanCodebook.quantize = orig_q
        for layer in patched:
            del layer.encode
        for h in hooks:
            h.remove()
    codes = out.audio_codes[0]
    assert torch.equal(level_in["sem"][0], cap["proj_sem"])
    assert torch.equal(level_in["ac"][0], cap["proj_ac"])
    for k in range(15):
        cap[f"residual_ac.{k}"] = level_in["ac"][k]
    cap["codes"] = codes.clone()
    return cap


def codebooks(tok, dtype=torch.float64):
    """E for level 0 (semantic) and levels 1..15 (acoustic 0..14): embed_sum/clamp(usage,1e-5)."""
    q = tok.encoder.quantizer
    layers = [q.semantic_residual_vector_quantizer.layers[0]] + list(q.acoustic_residual_vector_quantizer.layers[:15])
    return [(l.codebook.embed_sum.to(dtype) / l.codebook.cluster_usage.to(dtype).clamp(min=1e-5)[:, None])
            for l in layers]


def d2_top2(x: torch.Tensor, E: torch.Tensor):
    """Exact float64 squared distances of every row of x [T,D] to E [K,D]; best, second, argmin."""
    x = x.double()
    best, second, idx = [], [], []
    for t in range(x.shape[0]):
        d2 = ((E - x[t]) ** 2).sum(-1)
        v, i = torch.topk(d2, 2, largest=False)
        best.append(v[0])
        second.append(v[1])
        idx.append(int(d2.argmin()))
    return torch.stack(best), torch.stack(second), torch.tensor(idx)


CODEC_NOTES = {
    "input_values": "[N] 24 kHz float32 = feature extractor output (no normalisation)",
    "downsample": "[H,T12] k4/s2 replicate-padded conv, no bias",
    "proj_sem": "[T12,D] semantic input_proj(downsample)^T",
    "proj_ac": "[T12,D] acoustic input_proj(downsample)^T",
    "codes": "[T12,16] int64 = Qwen3TTSTokenizerV2Model.encode = Qwen3TTSTokenizer.encode(wav, sr=24000)",
    "d2_best": "[T12,16] float64-recomputed min squared distance of the level input (proj_sem / residual_ac.k) "
               "to E=embed_sum/clamp(usage,1e-5); stored f32",
    "d2_second": "[T12,16] second smallest, same; margin = (d2_second-d2_best)/(1+d2_best)",
    "codes_f64": "[T12,16] int64: whole encoder in float64 incl. an exact float64 argmin (the package's cdist "
                 "would cast to float32)",
}


def oracle_codec_encoder(tok, tok64, wav: np.ndarray, wrapper, sdpa_tok=None):
    x = torch.from_numpy(wav)
    cap = run_codec_encoder(tok, x)
    codes = cap["codes"]
    # The public wrapper path (feature extractor + trim) gives the same codes.
    api = wrapper.encode(wav, sr=SR).audio_codes[0]
    assert torch.equal(api.cpu(), codes), "Qwen3TTSTokenizer.encode != Qwen3TTSTokenizerV2Model.encode"
    fe = wrapper.feature_extractor(raw_audio=[wav], sampling_rate=SR, return_tensors="pt")
    assert torch.equal(fe["input_values"].view(-1), x), "feature extractor changed the samples"
    N = len(wav)
    T25, T12 = math.ceil(N / 960), math.ceil(N / 1920)
    assert codes.shape == (T12, 16), codes.shape
    assert cap["tfm.layer.0"].shape[0] == T25 and cap["downsample"].shape[1] == T12
    assert codes.dtype == torch.int64

    Es = codebooks(tok)
    ins = [cap["proj_sem"]] + [cap[f"residual_ac.{k}"] for k in range(15)]
    best, second, argmin64 = [], [], []
    for k in range(16):
        b, s, i = d2_top2(ins[k], Es[k])
        best.append(b)
        second.append(s)
        argmin64.append(i)
    d2b, d2s, am = torch.stack(best, 1), torch.stack(second, 1), torch.stack(argmin64, 1)
    margin = (d2s - d2b) / (1 + d2b)

    cap64 = run_codec_encoder(tok64, x.double(), exact_f64_argmin=True)
    codes64 = cap64["codes"]

    bag = TensorBag()
    bag.add("input_values", x, CODEC_NOTES["input_values"])
    for i in SEANET_IDX:
        bag.add(f"seanet.layers.{i}", cap[f"seanet.layers.{i}"],
                "[C,T] output of encoder.encoder.layers.%d (%s)" % (i, "conv" if i in (0, 3, 6, 9, 12, 14) else "resblock"))
    nl = len(tok.encoder.encoder_transformer.layers)
    for i in range(nl):
        bag.add(f"tfm.layer.{i}", cap[f"tfm.layer.{i}"], "[T25,H] output of encoder_transformer.layers.%d" % i)
    for k in ("downsample", "proj_sem", "proj_ac"):
        bag.add(k, cap[k], CODEC_NOTES[k])
    for k in range(15):
        bag.add(f"residual_ac.{k}", cap[f"residual_ac.{k}"],
                "[T12,D] acoustic residual entering acoustic level %d (code column %d)" % (k, k + 1))
    bag.add("codes", codes, CODEC_NOTES["codes"])
    bag.add("d2_best", d2b.float(), CODEC_NOTES["d2_best"])
    bag.add("d2_second", d2s.float(), CODEC_NOTES["d2_second"])
    bag.add("codes_f64", codes64, CODEC_NOTES["codes_f64"])

    stages = ([f"seanet.layers.{i}" for i in SEANET_IDX] + [f"tfm.layer.{i}" for i in range(nl)]
              + ["downsample", "proj_sem", "proj_ac"] + [f"residual_ac.{k}" for k in range(15)])
    prec = {
        "N": N, "T25": T25, "T12": T12,
        "codes_f32_ne_f64": int((codes != codes64).sum()),
        "codes_f32_ne_f64_per_level": (codes != codes64).sum(0).tolist(),
        "codes_f32_ne_teacher_forced_f64_argmin": int((codes != am).sum()),
        "min_margin_rel": float(margin.min()),
        "min_margin_rel_per_level": margin.min(0).values.tolist(),
        "min_margin_abs": float((d2s - d2b).min()),
        "stage_f32_vs_f64_max_rel_to_peak": {k: diff_stats(cap[k], cap64[k])["max_rel_to_peak"] for k in stages},
        "stage_peaks": {k: float(cap[k].abs().max()) for k in stages},
    }
    first_flip = [int(r) for r in torch.nonzero((codes != codes64).any(1)).view(-1)]
    prec["frames_with_f32_f64_flip"] = first_flip
    if first_flip:
        prec["note"] = "residual_ac diffs after a flipped level compare diverged chains"
    if sdpa_tok is not None:
        capsd = run_codec_encoder(sdpa_tok, x)
        prec["sdpa_vs_eager_codes_equal"] = bool(torch.equal(capsd["codes"], codes))
        prec["sdpa_vs_eager_tfm_last_max_rel"] = diff_stats(capsd[f"tfm.layer.{nl - 1}"], cap[f"tfm.layer.{nl - 1}"])["max_rel_to_peak"]
    return bag, prec, codes


@torch.no_grad()
def sliding_window_study(tok, wav: np.ndarray):
    """Show that the official eager path ignores encoder_config.sliding_window (W) and what honouring it
    would change: (a) official; (b) create_causal_mask swapped for transformers' own
    create_sliding_window_causal_mask (the flash-attention window semantics: a query attends to itself
    and the W-1 previous frames); (c) a hand-made additive 4D mask with the same window; (d) a hand-made
    full causal mask (must equal (a))."""
    enc = tok.encoder
    W = enc.config.sliding_window
    x = torch.from_numpy(wav).view(1, 1, -1).to(next(enc.parameters()).dtype)
    h = enc.encoder(x).transpose(1, 2)  # [1,T25,H]
    T = h.shape[1]
    tfm = enc.encoder_transformer
    a = tfm(h, return_dict=True).last_hidden_state
    orig = modeling_mimi.create_causal_mask
    modeling_mimi.create_causal_mask = masking_utils.create_sliding_window_causal_mask
    try:
        b = tfm(h, return_dict=True).last_hidden_state
    finally:
        modeling_mimi.create_causal_mask = orig
    q = torch.arange(T)[:, None]
    k = torch.arange(T)[None, :]
    neg = torch.finfo(h.dtype).min

    def run_mask(allowed):
        m = torch.where(allowed, torch.zeros((), dtype=h.dtype), torch.full((), neg, dtype=h.dtype))[None, None]
        pos = torch.arange(T)[None]
        y = h
        for layer in tfm.layers:
            y = layer(y, attention_mask=m, position_ids=pos, cache_position=torch.arange(T))[0]
        return y

    c = run_mask((k <= q) & (k > q - W))
    d = run_mask(k <= q)
    diff_rows = (a - b).abs().amax(-1)[0]
    differs = torch.nonzero(diff_rows > 0).view(-1)
    res = {
        "sliding_window": W, "T25": T,
        "official_equals_manual_full_causal": bool(torch.equal(a, d)),
        "official_vs_manual_full_causal_max_abs": float((a - d).abs().max()),
        "windowed_transformers_equals_manual_window": bool(torch.allclose(b, c, rtol=0, atol=1e-6)),
        "windowed_transformers_vs_manual_window_max_abs": float((b - c).abs().max()),
        "official_vs_windowed_max_abs": float((a - b).abs().max()),
        "official_vs_windowed_max_rel_to_peak": float((a - b).abs().max() / a.abs().max()),
        "first_frame_that_differs": int(differs[0]) if len(differs) else None,
        "frames_identical_before_window": bool((diff_rows[:W] == 0).all()),
    }
    assert res["official_vs_windowed_max_abs"] > 1e-3, "windowing made no difference?"
    assert res["first_frame_that_differs"] == W, res
    assert res["official_vs_manual_full_causal_max_abs"] < 1e-5
    # codes with the window honoured (whole encode, create_causal_mask swapped)
    full = tok.encode(torch.from_numpy(wav).view(1, -1), padding_mask=torch.ones(1, len(wav), dtype=torch.long)).audio_codes[0]
    modeling_mimi.create_causal_mask = masking_utils.create_sliding_window_causal_mask
    try:
        win = tok.encode(torch.from_numpy(wav).view(1, -1), padding_mask=torch.ones(1, len(wav), dtype=torch.long)).audio_codes[0]
    finally:
        modeling_mimi.create_causal_mask = orig
    res["codes_differ_official_vs_windowed"] = int((full != win).sum())
    res["first_code_frame_that_differs"] = (int(torch.nonzero((full != win).any(1)).view(-1)[0])
                                            if (full != win).any() else None)
    res["conclusion"] = ("eager (and sdpa) Mimi encoder attention is plain causal over all frames: "
                         "encoder_config.sliding_window is ignored; honouring it changes frames >= W")
    return res


# --------------------------------------------------------------------------------------
# C: voice-clone generate
# --------------------------------------------------------------------------------------
@torch.no_grad()
def run_generate_clone(model, input_ids, ref_ids, ref_code, xvec, icl, non_streaming, frames,
                       repetition_penalty=1.05, language="english"):
    talker = model.talker
    cap = {"talker_in": [], "talker_logits": [], "cp_logits": [], "trailing": None}
    hooks = [
        talker.model.register_forward_pre_hook(
            lambda m, a, kw: cap["talker_in"].append(kw["inputs_embeds"][0].clone()), with_kwargs=True),
        talker.codec_head.register_forward_hook(lambda m, i, o: cap["talker_logits"].append(o[0, -1].clone())),
    ]
    for k, head in enumerate(talker.code_predictor.lm_head):
        hooks.append(head.register_forward_hook(lambda m, i, o, k=k: cap["cp_logits"].append((k, o[0, -1].clone()))))
    orig_gen = talker.generate

    def gen_wrap(*a, **kw):
        cap["trailing"] = kw["trailing_text_hidden"][0].clone()
        cap["tts_pad"] = kw["tts_pad_embed"].view(-1).clone()
        return orig_gen(*a, **kw)

    talker.generate = gen_wrap
    # Exactly the form Qwen3TTSModel.generate_voice_clone passes (_prompt_items_to_voice_clone_prompt):
    # lists with one entry per batch item; ref_code [T,16] int64 (None in x-vector-only mode);
    # ref_spk_embedding [enc_dim] tensor; ref_ids list of [1,L] tensors (None when no ref text).
    vcp = dict(ref_code=[ref_code if icl else None], ref_spk_embedding=[xvec],
               x_vector_only_mode=[not icl], icl_mode=[icl])
    try:
        codes_list, hidden_list = model.generate(
            input_ids=[input_ids], ref_ids=[ref_ids] if icl else None, voice_clone_prompt=vcp,
            languages=[language], non_streaming_mode=non_streaming, max_new_tokens=frames + 1,
            do_sample=False, subtalker_dosample=False, repetition_penalty=repetition_penalty)
    finally:
        del talker.generate
        for h in hooks:
            h.remove()
    codes = codes_list[0]
    talker_logits = torch.stack(cap["talker_logits"])
    cp_logits = torch.stack([l for _, l in cap["cp_logits"]]).view(-1, 15, cap["cp_logits"][0][1].numel())
    # Output assembly exactly as Qwen3TTSModel.generate_voice_clone (inference/qwen3_tts_model.py).
    st = model.speech_tokenizer
    if icl:
        codes_for_decode = torch.cat([ref_code.to(codes.device), codes], dim=0)
    else:
        codes_for_decode = codes
    wavs_all, fs = st.decode([{"audio_codes": codes_for_decode}])
    assert fs == SR
    wav_all = wavs_all[0]
    out = {"codes": codes, "prefill": cap["talker_in"][0],
           "steps": torch.cat(cap["talker_in"][1:], 0) if len(cap["talker_in"]) > 1 else torch.zeros(0),
           "talker_logits": talker_logits, "cp_logits": cp_logits, "talker_hidden": hidden_list[0],
           "trailing": cap["trailing"], "tts_pad": cap["tts_pad"]}
    if icl:
        ref_len = int(ref_code.shape[0])
        total_len = int(codes_for_decode.shape[0])
        cut = int(ref_len / max(total_len, 1) * wav_all.shape[0])
        out.update(wav_full=torch.from_numpy(wav_all), cut=cut, wav=torch.from_numpy(wav_all[cut:]))
        # the package's decode is chunked_decode(300, 25): for <= 300 frames it is one forward
        one = run_decoder(st.model, codes_for_decode.T.unsqueeze(0))["wav"].view(-1)
        out["wav_full_equals_one_shot"] = bool(torch.equal(one, out["wav_full"]))
    else:
        out.update(wav=torch.from_numpy(wav_all))
    return out


# --------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------
def file_sizes(out_dir):
    sizes = {}
    for root, _, files in os.walk(out_dir):
        for f in files:
            p = os.path.join(root, f)
            sizes[os.path.relpath(p, out_dir)] = os.path.getsize(p)
    return dict(sorted(sizes.items()))


def build_and_save(tts_cfg, tok_cfg, model_dir, seed, dtype, attn="eager"):
    model = build_tts(tts_cfg, attn=attn)
    oracle_init(model, seed)
    tok = build_tokenizer(tok_cfg, attn=attn)
    oracle_init(tok, seed + 1)
    g = torch.Generator().manual_seed(seed + 2)
    cal_codes = torch.randint(0, tok_cfg["decoder_config"]["codebook_size"], (1, 16, 20), generator=g)
    calib = calibrate_decoder_output(tok, cal_codes)
    n_params = {"speaker_encoder": sum(p.numel() for p in model.speaker_encoder.parameters()),
                "tokenizer_encoder": sum(p.numel() for p in tok.encoder.parameters()),
                "tokenizer_encoder_buffers": sum(b.numel() for b in tok.encoder.buffers())}
    save_tts_dir(model, tok, model_dir, dtype, tts_cfg, tok_cfg)
    with open(os.path.join(model_dir, "config.json")) as f:
        written = json.load(f)
    for k, v in tts_cfg["speaker_encoder_config"].items():
        assert written["speaker_encoder_config"][k] == v, k
    with open(os.path.join(model_dir, "speech_tokenizer", "config.json")) as f:
        assert json.load(f)["encoder_config"]["sliding_window"] == tok_cfg["encoder_config"]["sliding_window"]
    return calib, n_params


def check_loaded(model, tts_cfg, tok_cfg):
    sc = model.config.speaker_encoder_config
    for k, v in tts_cfg["speaker_encoder_config"].items():
        assert getattr(sc, k) == v, (k, getattr(sc, k), v)
    assert model.speaker_encoder is not None and model.tts_model_type == "base"
    tok = model.speech_tokenizer.model
    assert tok.encoder.config.sliding_window == tok_cfg["encoder_config"]["sliding_window"]
    assert tok.encoder.config._attn_implementation == "eager"


def main_tiny(args):
    t0 = time.time()
    out_dir = os.path.abspath(args.out)
    model_dir = os.path.join(out_dir, "model")
    oracle_dir = os.path.join(out_dir, "oracle")
    os.makedirs(oracle_dir, exist_ok=True)
    seed = args.seed
    sig_seed = seed + 10

    tts_cfg, tok_cfg = tiny_base_configs(args.talker_hidden)
    calib, n_params = build_and_save(tts_cfg, tok_cfg, model_dir, seed, torch.float32)
    model = load_tts_dir(model_dir, torch.float32, attn="eager")
    check_loaded(model, tts_cfg, tok_cfg)
    tok = model.speech_tokenizer.model.eval()
    model64 = load_tts_dir(model_dir, torch.float64, attn="eager")
    tok64 = model64.speech_tokenizer.model.eval()
    tok_sdpa = load_tts_dir(model_dir, torch.float32, attn="sdpa").speech_tokenizer.model.eval()
    wrapper = model.speech_tokenizer

    manifest = {
        "seed": seed, "signal_seed": sig_seed, "versions": versions_all(), "attn_implementation": "eager",
        "threads": args.threads, "dtype": "float32", "decoder_calibration_factor": calib,
        "n_params": n_params, "tts_config": tts_cfg, "tokenizer_config": tok_cfg, "text_ids": TINY_TEXT,
        "signal": sig.__doc__.strip(), "files": {}, "precision": {},
        "findings": [
            "generate(voice_clone_prompt=dict(ref_code=[T,16 int64 or None], ref_spk_embedding=[enc_dim tensor], "
            "x_vector_only_mode=[bool], icl_mode=[bool]), ref_ids=[[1,L] ids] (ICL only)); no speakers",
            "the x-vector is the codec track of prompt row 7 (tts_pad on the text track) in ICL and "
            "x-vector-only modes alike",
            "ICL ref text rows = ref_ids[:, 3:-2]; target text = input_ids[:, 3:-5]; codec block starts with "
            "codec_bos (2149), then the 16-code sum of each ref frame",
            "ICL output: wav_full = decode(cat(ref_code, codes)); cut = int(ref_len / max(total_len, 1) * "
            "wav_full.shape[0]); wav = wav_full[cut:] (here cut == ref_len*1920 exactly)",
            "Mimi encoder attention (eager and sdpa) ignores encoder_config.sliding_window: see "
            "precision.sliding_window_study",
            "MimiEuclideanCodebook.quantize casts to float32 (torch.cdist(x.float(), E.float())) even for a "
            "float64 model; codes_f64 uses an exact float64 argmin instead",
            "librosa.resample output length = int(np.ceil(n * (24000 / sr))) in float64: can be exact+1 "
            "(22050 and 44100 Hz here)",
        ],
    }
    prec = manifest["precision"]

    def save(bag, name):
        manifest["files"][f"oracle/{name}.safetensors"] = bag.save(os.path.join(oracle_dir, f"{name}.safetensors"))

    # ---- A
    n_a = 1920 * 16 + 777
    wav_a = sig(n_a, SR, sig_seed)
    bag, p, _ = oracle_speaker_encoder(model, model64, wav_a)
    save(bag, "speaker_encoder")
    prec["speaker_encoder"] = p
    manifest["speaker_encoder"] = {"N": n_a, "F": n_a // 256, "zero_span": zero_span(n_a, SR),
                                   "C": 32, "3C": 96, "enc_dim": args.talker_hidden}

    # ---- B
    prec["codec_encoder"] = {}
    for name, n in (("aligned", 1920 * 12), ("ragged", 1920 * 12 + 777), ("long", 1920 * 40 + 777)):
        wav = sig(n, SR, sig_seed)
        bag, p, _ = oracle_codec_encoder(tok, tok64, wav, wrapper, sdpa_tok=tok_sdpa)
        save(bag, f"codec_encoder_{name}")
        prec["codec_encoder"][name] = p
        if name == "long":
            prec["sliding_window_study"] = sliding_window_study(tok, wav)
    mins = [prec["codec_encoder"][k]["min_margin_rel"] for k in prec["codec_encoder"]]
    prec["codec_encoder_summary"] = {
        "codes_f32_ne_f64_total": sum(prec["codec_encoder"][k]["codes_f32_ne_f64"] for k in prec["codec_encoder"]),
        "min_margin_rel": min(mins),
        "worst_stage_rel": max(max(prec["codec_encoder"][k]["stage_f32_vs_f64_max_rel_to_peak"].values())
                               for k in prec["codec_encoder"]),
    }

    # ---- C
    g = torch.Generator().manual_seed(seed + 3)
    T = TINY_TEXT

    def ids_for(n_text):
        text = torch.randint(0, 1000, (n_text,), generator=g).tolist()
        return torch.tensor([[T["im_start"], T["assistant"], T["newline"]] + text +
                             [T["im_end"], T["newline"], T["im_start"], T["assistant"], T["newline"]]])

    def ref_ids_for():
        r = torch.randint(0, 1000, (6,), generator=g).tolist()
        return torch.tensor([[T["im_start"], T["assistant"], T["newline"]] + r + [T["im_end"], T["newline"]]])

    input_ids = ids_for(8)
    ref_ids = ref_ids_for()
    input_ids_long = ids_for(30)
    refs = {}
    for secs in (2.0, 0.5):
        w = sig(int(secs * SR), SR, sig_seed)
        xv = model.extract_speaker_embedding(audio=w, sr=SR).clone()
        rc = wrapper.encode(w, sr=SR).audio_codes[0].clone()
        refs[secs] = (w, xv, rc)
    cases = [
        ("icl_stream", True, False, 2.0, input_ids),
        ("icl_stream_longtext", True, False, 0.5, input_ids_long),
        ("icl_nonstream", True, True, 2.0, input_ids),
        ("xvec_stream", False, False, 2.0, input_ids),
        ("xvec_nonstream", False, True, 2.0, input_ids),
    ]
    gen = {}
    p0 = 9  # 3 role rows + think, think_bos, lang, think_eos, x-vector, tts_bos+codec_pad
    for name, icl, nonstream, secs, ids in cases:
        w, xv, rc = refs[secs]
        d = run_generate_clone(model, ids, ref_ids, rc, xv, icl, nonstream, args.gen_frames)
        n_text = ids.shape[1] - 8
        P = d["prefill"].shape[0]
        info = {"icl": icl, "non_streaming_mode": nonstream, "ref_seconds": secs if icl else None,
                "xvector_ref_seconds": secs, "prefill_len": P, "frames": int(d["codes"].shape[0]),
                "codes_group0": d["codes"][:, 0].tolist()}
        trailing_is_pad = (d["trailing"].shape[0] == 1 and torch.equal(d["trailing"][0], d["tts_pad"]))
        trailing_len = 0 if trailing_is_pad else int(d["trailing"].shape[0])
        if icl:
            Lr = ref_ids.shape[1] - 5
            Lt = Lr + n_text + 1
            Lc = rc.shape[0] + 1
            branch = ("non_streaming" if nonstream else ("Lt>Lc" if Lt > Lc else "Lt<=Lc"))
            info.update(Lr=Lr, Lt=Lt, Lc=Lc, T_ref=int(rc.shape[0]), branch=branch, cut=d["cut"],
                        cut_equals_ref_len_x1920=d["cut"] == rc.shape[0] * 1920,
                        wav_full_equals_one_shot_decode=d["wav_full_equals_one_shot"])
            if nonstream:
                assert P == p0 + Lt + Lc and trailing_len == 0
            elif Lt > Lc:
                assert P == p0 + Lc and trailing_len == Lt - Lc
            else:
                assert P == p0 + Lc and trailing_len == 0
        else:
            info["branch"] = "x_vector_only"
            if nonstream:
                assert P == p0 + n_text + 2 and trailing_len == 0
            else:
                assert P == p0 + 1 and trailing_len == n_text
        info["trailing_len"] = trailing_len
        top2 = d["cp_logits"].topk(2, dim=-1).values
        info["cp_top2_margin_min"] = float((top2[..., 0] - top2[..., 1]).min())
        # precision study: the same generate in float64 (same f32 x-vector and ref_code as inputs)
        d64 = run_generate_clone(model64, ids, ref_ids, rc, xv.double(), icl, nonstream, args.gen_frames)
        same = d64["codes"].shape == d["codes"].shape and torch.equal(d64["codes"], d["codes"])
        pg = {"codes_equal_f32_f64": bool(same),
              "prefill_embeds": diff_stats(d["prefill"], d64["prefill"])["max_abs"]}
        if same:
            pg["talker_logits_max_rel"] = diff_stats(d["talker_logits"], d64["talker_logits"])["max_rel_to_peak"]
            pg["cp_logits_max_rel"] = diff_stats(d["cp_logits"], d64["cp_logits"])["max_rel_to_peak"]
            pg["cp_logits_max_abs"] = diff_stats(d["cp_logits"], d64["cp_logits"])["max_abs"]
            pg["wav_max_abs"] = diff_stats(d["wav"], d64["wav"])["max_abs"]
        prec.setdefault("generate_f32_vs_f64", {})[name] = pg
        if name == "icl_stream":
            assert info["branch"] == "Lt<=Lc"
        if name == "icl_stream_longtext":
            assert info["branch"] == "Lt>Lc"
        # the x-vector is the codec track of prompt row 7 in every mode
        assert torch.allclose(d["prefill"][7], xv + d["tts_pad"], atol=1e-6)
        bag = TensorBag()
        bag.add("input_ids", ids[0], "<|im_start|>assistant\\n TEXT <|im_end|>\\n<|im_start|>assistant\\n")
        if icl:
            bag.add("ref_ids", ref_ids[0], "<|im_start|>assistant\\n REF <|im_end|>\\n (generate uses [3:-2])")
            bag.add("ref_code", rc, "[T_ref,16] int64 codec-encoder codes of the reference (Qwen3TTSTokenizer.encode)")
        bag.add("xvector", xv, "[enc_dim] extract_speaker_embedding of the reference (also used in ICL)")
        bag.add("prefill_embeds", d["prefill"], "[P,H] talker input at prefill")
        bag.add("step_embeds", d["steps"], "[S,H] talker input of each decode step")
        bag.add("trailing_text_hidden", d["trailing"], "[L,H] as passed to talker.generate (one tts_pad row when none)")
        bag.add("trailing_len", torch.tensor([trailing_len]), "rows of real trailing text (0 when it is tts_pad)")
        bag.add("talker_logits_raw", d["talker_logits"], "[S+1,3072] codec_head output before processors")
        bag.add("cp_logits_raw", d["cp_logits"], "[F',15,2048] CP raw logits per frame")
        bag.add("codes", d["codes"], "[F,16] generated codes (cut at first EOS)")
        bag.add("talker_hidden", d["talker_hidden"], "[F,H] talker hidden that seeded each frame's CP")
        if icl:
            bag.add("wav_full", d["wav_full"], "speech_tokenizer.decode(cat(ref_code, codes)) [(T_ref+F)*1920]")
            bag.add("cut", torch.tensor([d["cut"]]), "int(ref_len / max(total_len,1) * wav_full.shape[0])")
            bag.add("wav", d["wav"], "wav_full[cut:] = generate_voice_clone output")
        else:
            bag.add("wav", d["wav"], "speech_tokenizer.decode(codes) = generate_voice_clone output")
        save(bag, name)
        gen[name] = info
    manifest["generate"] = {"language": "english", "do_sample": False, "subtalker_dosample": False,
                            "repetition_penalty": 1.05, "max_new_tokens": args.gen_frames + 1, "p0": p0, **gen}

    # ---- D
    gd = torch.Generator().manual_seed(seed + 4)
    ref_codes = torch.randint(0, 2048, (70, 16), generator=gd)
    gen_codes = torch.randint(0, 2048, (12, 16), generator=gd)
    allc = torch.cat([ref_codes, gen_codes], 0).T.unsqueeze(0)
    dd = run_decoder(tok, allc)
    wav_full = dd["wav"].view(-1)
    assert wav_full.numel() == 82 * 1920
    api = wrapper.decode([{"audio_codes": torch.cat([ref_codes, gen_codes], 0)}])[0][0]
    assert torch.equal(torch.from_numpy(api), wav_full), "wrapper decode != one-shot decode"
    bag = TensorBag()
    bag.add("ref_codes", ref_codes, "[70,16] int64 random")
    bag.add("gen_codes", gen_codes, "[12,16] int64 random")
    bag.add("wav_full", wav_full, "[82*1920] one-shot decoder(codes [1,16,82]) incl. clamp = package decode")
    save(bag, "decoder_primed")
    d64 = run_decoder(tok64, allc)
    prec["decoder_primed_wav_preclamp_f32_vs_f64"] = diff_stats(dd["wav_preclamp"], d64["wav_preclamp"])

    # ---- E
    bag = TensorBag()
    rs = {}
    for sr in (8000, 16000, 22050, 44100, 48000):
        x = sig(int(round(1.3 * sr)), sr, sig_seed)
        y = librosa.resample(x, orig_sr=sr, target_sr=SR)
        # librosa: n_out = int(np.ceil(n * (float(target_sr) / orig_sr))) in float64, which can be one
        # more than the exact ceil(n*24000/sr) (e.g. 22050 Hz: 28665 * (24000/22050) = 31200.000000000004)
        assert y.dtype == np.float32 and len(y) == int(np.ceil(len(x) * (float(SR) / sr)))
        bag.add(f"in_{sr}", torch.from_numpy(x), f"[{len(x)}] sig() synthesised at {sr} Hz, 1.3 s")
        bag.add(f"out_{sr}", torch.from_numpy(y), "librosa.resample(x, orig_sr=%d, target_sr=24000) (soxr_hq)" % sr)
        rs[sr] = {"in": len(x), "out": len(y), "exact_ceil": -(-len(x) * SR // sr)}
    m = int(round(1.3 * 48000))
    st = np.stack([sig(m, 48000, sig_seed), 0.6 * sig(m, 48000, sig_seed + 1)[::-1].copy()])
    mono = librosa.to_mono(st)
    y = librosa.resample(mono, orig_sr=48000, target_sr=SR)
    bag.add("in_48000_stereo", torch.from_numpy(st), "[2,M] ch0 = sig(seed), ch1 = 0.6*reversed sig(seed+1)")
    bag.add("out_48000_stereo", torch.from_numpy(y), "librosa.resample(librosa.to_mono(x) (= mean over channels), "
            "orig_sr=48000, target_sr=24000)")
    rs["48000_stereo"] = {"in": m, "out": len(y), "exact_ceil": -(-m * SR // 48000)}
    save(bag, "resample")
    manifest["resample"] = {"res_type": "soxr_hq (librosa default)", "fix": True, "lengths": rs,
                            "length_rule": "int(np.ceil(n * (float(24000) / sr))) in float64 (librosa "
                                           "core/audio.py resample), then fix_length (pad/trim) to it"}

    manifest["elapsed_s"] = round(time.time() - t0, 1)
    manifest["file_sizes"] = file_sizes(out_dir)
    manifest["total_bytes"] = sum(manifest["file_sizes"].values())
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, default=str)
    print(json.dumps({k: manifest[k] for k in ("elapsed_s", "total_bytes", "generate")}, indent=1, default=str))


def versions_all():
    import importlib.metadata as md

    v = versions()
    for pkg in ("librosa", "soxr", "scipy", "soundfile"):
        try:
            v[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            v[pkg] = None
    return v


def load_f64_encoders(model_dir, model32):
    """float64 copies of the speaker encoder and the speech tokenizer, read from the files on disk."""
    from types import SimpleNamespace

    from safetensors import safe_open
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model

    spk = qmdl.Qwen3TTSSpeakerEncoder(model32.config.speaker_encoder_config)
    sd = {}
    with safe_open(os.path.join(model_dir, "model.safetensors"), framework="pt") as f:
        for k in f.keys():
            if k.startswith("speaker_encoder."):
                sd[k[len("speaker_encoder."):]] = f.get_tensor(k)
    spk.load_state_dict(sd, strict=True)
    spk = spk.double().eval()
    tok = Qwen3TTSTokenizerV2Model.from_pretrained(os.path.join(model_dir, "speech_tokenizer"), dtype=torch.float64,
                                                   attn_implementation="eager", local_files_only=True).eval()
    return SimpleNamespace(speaker_encoder=spk, speech_tokenizer=SimpleNamespace(model=tok))


def main_full(args):
    """Full 0.6B Base geometry, bf16 on disk, f32 compute: A and B for one 12 s signal."""
    t0 = time.time()
    out_dir = os.path.abspath(args.full)
    model_dir = os.path.join(out_dir, "model")
    oracle_dir = os.path.join(out_dir, "oracle")
    os.makedirs(oracle_dir, exist_ok=True)
    seed, sig_seed = args.seed, args.seed + 10
    tts_cfg, tok_cfg = full_base_configs()
    calib, n_params = build_and_save(tts_cfg, tok_cfg, model_dir, seed, torch.bfloat16, attn="sdpa")
    t_build = time.time() - t0
    model = load_tts_dir(model_dir, torch.float32, attn="eager")
    check_loaded(model, tts_cfg, tok_cfg)
    tok = model.speech_tokenizer.model.eval()
    wrapper = model.speech_tokenizer
    # float64: only the speaker encoder and the tokenizer are needed (a whole f64 model would be ~7 GB).
    model64 = load_f64_encoders(model_dir, model)
    tok64 = model64.speech_tokenizer.model
    manifest = {"seed": seed, "signal_seed": sig_seed, "versions": versions_all(), "checkpoint_dtype": "bfloat16",
                "compute_dtype": "float32", "n_params": n_params, "decoder_calibration_factor": calib,
                "tts_config": tts_cfg, "tokenizer_config": tok_cfg, "build_s": round(t_build, 1),
                "files": {}, "precision": {}}
    n = 1920 * 150 + 777  # 12.4 s: N > 240000, T25 = 301 > 250
    wav = sig(n, SR, sig_seed)
    bag, p, _ = oracle_speaker_encoder(model, model64, wav)
    manifest["files"]["oracle/speaker_encoder.safetensors"] = bag.save(os.path.join(oracle_dir, "speaker_encoder.safetensors"))
    manifest["precision"]["speaker_encoder"] = p
    bag, p, _ = oracle_codec_encoder(tok, tok64, wav, wrapper)
    manifest["files"]["oracle/codec_encoder_long.safetensors"] = bag.save(os.path.join(oracle_dir, "codec_encoder_long.safetensors"))
    manifest["precision"]["codec_encoder"] = {"long": p}
    manifest["precision"]["sliding_window_study"] = sliding_window_study(tok, wav)
    manifest["speaker_encoder"] = {"N": n, "F": n // 256, "zero_span": zero_span(n, SR)}
    manifest["elapsed_s"] = round(time.time() - t0, 1)
    manifest["file_sizes"] = file_sizes(out_dir)
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, default=str)
    print(json.dumps({k: manifest[k] for k in ("elapsed_s", "file_sizes")}, indent=1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out")
    ap.add_argument("--full", help="OUT_FULL: full 0.6B Base geometry (A and B only)")
    ap.add_argument("--seed", type=int, default=20260122)
    ap.add_argument("--gen-frames", type=int, default=8)
    ap.add_argument("--talker-hidden", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if not args.out and not args.full:
        ap.error("--out and/or --full is required")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if args.out:
        main_tiny(args)
    if args.full:
        main_full(args)


if __name__ == "__main__":
    main()
