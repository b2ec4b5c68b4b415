"""The Python package on the built-in test model: streaming equals one-shot, cancellation from
another thread, two engines, typed errors, the GIL released, no leak over create/drop cycles, and
the shared table of requests (tests/fixtures/surfaces/cases.json) giving what every face gives.

Run by `.ci/run` in the venv it makes (`pytest crates/python/tests`)."""

import ctypes
import gc
import json
import os
import threading
import time

import numpy as np
import pytest

import qtts

FRAME = 1920  # samples per 80 ms frame at 24 kHz


@pytest.fixture(scope="session")
def cache(tmp_path_factory):
    """A cache directory holding the built-in model, made once."""
    d = tmp_path_factory.mktemp("qtts-cache")
    with qtts.Engine("builtin", cache_dir=str(d), cores=2) as e:
        assert e.builtin
    return str(d)


@pytest.fixture(scope="session")
def engine(cache):
    with qtts.Engine("builtin", cache_dir=cache, cores=2) as e:
        yield e


def test_module_surface():
    assert qtts.SAMPLE_RATE == 24000
    for name in ["ModelError", "RequestError", "BusyError", "EndedError"]:
        assert issubclass(getattr(qtts, name), qtts.QttsError)
    assert issubclass(qtts.QttsError, Exception)


def test_chunks_concatenate_to_the_one_shot_result(engine):
    assert engine.model_type == "custom_voice" and engine.voices
    one = engine.synthesize("Chunks and the whole.", seed=4, max_frames=20, min_frames=20)
    assert one.dtype == np.float32 and one.ndim == 1
    assert len(one) == 20 * FRAME
    assert np.isfinite(one).all()
    chunks = list(engine.stream("Chunks and the whole.", seed=4, max_frames=20, min_frames=20))
    assert len(chunks) > 1, "a stream comes in several chunks"
    assert all(c.dtype == np.float32 for c in chunks)
    assert np.array_equal(np.concatenate(chunks), one)
    # Another seed is other audio: the comparison above can fail.
    other = engine.synthesize("Chunks and the whole.", seed=5, max_frames=20, min_frames=20)
    assert not np.array_equal(other, one)


def test_stream_summary_and_cancel(engine):
    s = engine.stream("Stop me.", max_frames=400, min_frames=400)
    assert s.summary() is None
    first = next(s)
    assert len(first) > 0
    s.cancel()
    rest = list(s)
    summary = s.summary()
    assert summary["cancelled"] is True
    assert summary["frames"] < 400
    assert summary["samples"] == len(first) + sum(len(c) for c in rest)


LIVE_TEXT = "Héllo wörld, 你好! Read me as I am written."


def test_a_live_stream_fed_in_pieces_is_the_whole_texts_audio(engine):
    kw = dict(seed=7, max_frames=24, min_frames=24)
    whole = engine.synthesize(LIVE_TEXT, **kw)
    data = LIVE_TEXT.encode()
    first = len("Héllo wörld, ".encode())
    for step in [1, 2, 5]:
        s = engine.stream(data[:first].decode(), live=True, **kw)
        # Audio before any more text: speech starts while the text is written.
        chunks = [next(s)]

        def write():
            # bytes pieces of `step`, splitting characters, and a str at the end.
            for at in range(first, len(data) - 3, step):
                s.feed(data[at:min(at + step, len(data) - 3)])
            s.feed(data[len(data) - 3:].decode())
            s.finish()
        t = threading.Thread(target=write)
        t.start()
        chunks += list(s)
        t.join()
        assert np.array_equal(np.concatenate(chunks), whole), f"pieces of {step}"
        summary = s.summary()
        assert summary["frames"] == 24 and 0 <= summary["text_starved_frames"] <= 24
    summary = engine.stream(LIVE_TEXT, **kw)
    list(summary)
    assert summary.summary()["text_starved_frames"] == 0


def test_a_live_stream_starting_at_its_texts_end_waits_for_it(engine):
    kw = dict(seed=7, max_frames=24, min_frames=24)
    whole = engine.synthesize(LIVE_TEXT, **kw)
    s = engine.stream(LIVE_TEXT[:20], live=True, start="text_end", **kw)
    got = []

    def read():
        got.extend(s)
    t = threading.Thread(target=read)
    t.start()
    # It cannot start before the text's end, however long this waits.
    t.join(0.3)
    assert t.is_alive() and not got
    s.feed(LIVE_TEXT[20:])
    s.finish()
    t.join()
    assert np.array_equal(np.concatenate(got), whole)
    for bad in ["soon", 0, -1]:
        with pytest.raises(ValueError, match="start"):
            engine.stream("", live=True, start=bad)


def test_a_live_stream_refuses_what_it_cannot_take(engine):
    whole = engine.stream("Whole.", max_frames=2, min_frames=2)
    with pytest.raises(qtts.RequestError, match="live=True"):
        whole.feed("more")
    with pytest.raises(qtts.RequestError):
        whole.finish()
    list(whole)
    s = engine.stream("", live=True, max_frames=2, min_frames=2)
    with pytest.raises(ValueError, match="UTF-8"):
        s.feed(b"Hi \xff")
    with pytest.raises(TypeError):
        s.feed(3)
    s.feed("Hi \u00e9".encode()[:-1])
    with pytest.raises(ValueError, match="UTF-8"):
        s.finish()  # ends inside a character: refused, and the text ends all the same
    with pytest.raises(qtts.RequestError, match="finished"):
        s.feed("more")
    list(s)
    # Cancelled: the writer is told to stop.
    s = engine.stream("Hello there", live=True, max_frames=400, min_frames=400)
    next(s)
    s.cancel()
    list(s)
    assert s.summary()["cancelled"] is True
    with pytest.raises(qtts.EndedError):
        s.feed(" and more")


def test_cancel_from_another_thread_stops_the_synthesis(engine):
    for _ in range(3):
        def cancel_later():
            time.sleep(0.3)
            engine.cancel()

        t = threading.Thread(target=cancel_later)
        t.start()
        audio = engine.synthesize("Long enough to be cancelled.", max_frames=2000, min_frames=2000)
        t.join()
        # What the engine did: it stopped between frames, short of the 2000 forced frames, and
        # returned whole frames (how fast is the embedding bench's to measure).
        assert len(audio) < 2000 * FRAME and len(audio) % FRAME == 0
    # The engine serves the next request whole.
    assert len(engine.synthesize("Again.", max_frames=3, min_frames=3)) == 3 * FRAME


def test_the_gil_is_released_while_synthesizing(engine):
    done = threading.Event()

    def speak():
        engine.synthesize("The other thread runs meanwhile.", max_frames=300, min_frames=300)
        done.set()

    t = threading.Thread(target=speak)
    start = time.monotonic()
    t.start()
    ticks, last, longest = 0, time.monotonic(), 0.0
    while not done.is_set():
        now = time.monotonic()
        longest = max(longest, now - last)
        last = now
        ticks += 1
    t.join()
    took = time.monotonic() - start
    # With the GIL held for the synthesis, this loop would stall for all of it.
    assert ticks > 1000
    assert longest < took / 2, f"longest stall {longest:.3f} s of {took:.3f} s"


def test_two_engines_in_one_process(cache, engine):
    with qtts.Engine("builtin", cache_dir=cache, cores=1) as other:
        a = engine.synthesize("Two engines.", seed=2, max_frames=10, min_frames=10)
        b = other.synthesize("Two engines.", seed=2, max_frames=10, min_frames=10)
        assert len(a) == len(b) == 10 * FRAME
        assert np.allclose(a, b, atol=1e-4)


def test_bad_arguments_raise_typed_errors(cache, engine, tmp_path):
    with pytest.raises(qtts.ModelError, match="nothing-here"):
        qtts.Engine(str(tmp_path / "nothing-here"), cache_dir=cache)
    # No model: an error that says what to give, never the built-in model's noise.
    with pytest.raises(qtts.ModelError, match="builtin"):
        qtts.Engine(cache_dir=cache)
    with pytest.raises(qtts.RequestError, match="nobody-by-this-name"):
        engine.synthesize("Hello.", voice="nobody-by-this-name")
    with pytest.raises(qtts.RequestError):
        engine.synthesize("  ")
    with pytest.raises(qtts.RequestError, match="klingon"):
        engine.synthesize("Hello.", language="klingon")
    with pytest.raises(TypeError):
        engine.synthesize(123)
    with pytest.raises(TypeError):
        engine.synthesize("Hello.", unknown_option=1)
    with pytest.raises(OverflowError):
        engine.synthesize("Hello.", seed=-1)
    e = qtts.Engine("builtin", cache_dir=cache, cores=1)
    e.close()
    with pytest.raises(RuntimeError, match="closed"):
        e.synthesize("Hello.")


def test_a_full_queue_raises_busy(cache):
    with qtts.Engine("builtin", cache_dir=cache, cores=1, queue=1) as e:
        running = e.stream("Nobody reads me.", max_frames=400, min_frames=400)
        next(running)  # running now: the next one queues
        queued = e.stream("I wait.", max_frames=400, min_frames=400)
        with pytest.raises(qtts.BusyError, match="busy"):
            e.stream("No room for me.")
        queued.cancel()
        running.cancel()
        assert list(queued) == []
        list(running)
        assert queued.summary()["cancelled"] and queued.summary()["frames"] == 0


def rss_bytes():
    # Free memory handed back first, so that the allocator's caches do not read as growth.
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def threads():
    return len(os.listdir("/proc/self/task"))


def test_no_leak_over_200_create_drop_cycles(cache):
    def cycle():
        e = qtts.Engine("builtin", cache_dir=cache, cores=1)
        e.synthesize("Leak check.", max_frames=1, min_frames=1)
        del e

    # Warm-up: the allocator's arenas and Python's caches reach their size (on a Sapphire Rapids
    # Xeon RSS then moves between +15 and +40 MiB without trend; a leaked engine would add
    # megabytes a cycle).
    for _ in range(50):
        cycle()
    before, before_threads = rss_bytes(), threads()
    for _ in range(200):
        cycle()
    grown = rss_bytes() - before
    assert grown < 64 << 20, f"RSS grew {grown / 2**20:.1f} MiB over 200 cycles"
    assert threads() == before_threads, "engine threads outlived their engines"


ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


@pytest.fixture(scope="session")
def base(cache, tmp_path_factory):
    """The tiny random-weight Base checkpoint of the voice oracle (tests/fixtures/voice/model)
    with its tiny tokenizer beside it, loaded as a user's checkpoint is."""
    import shutil

    ckpt = tmp_path_factory.mktemp("base") / "checkpoint"
    shutil.copytree(os.path.join(ROOT, "tests", "fixtures", "voice", "model"), ckpt)
    qtts._write_tiny_tokenizer(str(ckpt))
    with qtts.Engine(str(ckpt), cache_dir=cache, cores=2) as e:
        yield e


def write_reference(path, seconds=2.5, rate=24000):
    """A voiced, speech-like 16-bit WAV: a 120 Hz harmonic series under a 4 Hz syllable envelope,
    with a little noise."""
    import wave

    t = np.arange(int(seconds * rate)) / rate
    x = sum(np.sin(2 * np.pi * 120 * k * t) / k for k in range(1, 12))
    x *= 0.5 + 0.5 * np.sin(2 * np.pi * 4 * t) ** 2
    x += 0.01 * np.random.default_rng(7).standard_normal(len(t))
    pcm = (0.3 * x / np.abs(x).max() * 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    return str(path)


def test_a_cloned_voice_is_saved_loaded_and_spoken(base, engine, tmp_path):
    assert base.model_type == "base"
    ref = write_reference(tmp_path / "ref.wav")
    v = base.clone_voice(ref, text="Hello there.")
    # The wheel has no resampler (libsoxr is not bundled): other rates are a clear error.
    with pytest.raises(qtts.VoiceError, match="24000 Hz|resampl"):
        base.clone_voice(write_reference(tmp_path / "ref8k.wav", rate=8000))
    assert v.in_context and v.text == "Hello there." and v.model.startswith("base ")
    assert 1.0 <= v.seconds <= 30.0
    x = base.clone_voice(ref)
    assert not x.in_context and x.text is None

    def say(voice):
        return base.synthesize("How are you?", voice=voice, seed=3, max_frames=4, min_frames=4)

    spoken = say(v)
    assert len(spoken) == 4 * FRAME and np.isfinite(spoken).all()
    # Saved and read back, the voice speaks the same samples; the x-vector-only voice does not.
    voices = str(tmp_path / "voices")
    path = v.save("anna", voices_dir=voices)
    assert os.path.isfile(path)
    assert np.array_equal(say(base.load_voice("anna", voices_dir=voices)), spoken)
    assert not np.array_equal(say(x), spoken)
    assert len(list(base.stream("How are you?", voice=v, max_frames=2, min_frames=2))) >= 1
    # By name, as every face names a voice: a saved voice where the model has no such speaker.
    os.environ["QTTS_VOICES"] = voices
    try:
        assert np.array_equal(say("anna"), spoken)
        with pytest.raises(qtts.RequestError, match="unknown voice"):
            say("nobody")
    finally:
        del os.environ["QTTS_VOICES"]
    # The same recording as samples with their rate: the same voice.
    import wave

    with wave.open(ref, "rb") as w:
        pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768
    assert np.array_equal(say(base.clone_voice(pcm, "Hello there.", sample_rate=24000)), spoken)
    assert np.array_equal(
        say(base.clone_voice(pcm.tolist(), "Hello there.", sample_rate=24000)), spoken
    )
    with pytest.raises(ValueError, match="sample_rate"):
        base.clone_voice(pcm, "Hello there.")
    with pytest.raises(ValueError, match="sample_rate"):
        base.clone_voice(ref, sample_rate=24000)
    with pytest.raises(qtts.VoiceError, match="rate"):
        base.clone_voice(pcm, sample_rate=0)

    # Bad input: typed errors, and the engine goes on.
    notaudio = tmp_path / "notes.wav"
    notaudio.write_text("this is not a recording\n")
    with pytest.raises(qtts.VoiceError, match="not audio"):
        base.clone_voice(str(notaudio))
    with pytest.raises(qtts.VoiceError, match="nobody"):
        base.load_voice("nobody", voices_dir=voices)
    with pytest.raises(qtts.RequestError, match="instruct"):
        base.synthesize("Hi.", voice=v, instruct="whisper")
    with pytest.raises(TypeError):
        base.synthesize("Hi.", voice=123)
    # A CustomVoice engine clones nothing and refuses a Base model's voice.
    with pytest.raises(qtts.VoiceError, match="Base model"):
        engine.clone_voice(ref)
    with pytest.raises(qtts.VoiceError, match="made for"):
        engine.synthesize("Hi.", voice=v)
    with pytest.raises(qtts.VoiceError, match="made for"):
        engine.load_voice("anna", voices_dir=voices)
    assert np.array_equal(say(v), spoken)


def test_threads_is_the_old_name_of_cores(cache):
    with pytest.warns(DeprecationWarning, match="cores"):
        e = qtts.Engine("builtin", cache_dir=cache, threads=1)
    e.close()


def test_synthesize_keeps_its_summary_within_reach(engine):
    audio, summary = engine.synthesize("Capped.", max_frames=3, min_frames=3, with_summary=True)
    assert len(audio) == 3 * FRAME
    assert summary["stop"] == "frame_cap" and summary["cancelled"] is False
    assert summary["frames"] == 3 and summary["samples"] == len(audio)
    assert summary["ttfa_ms"] > 0 and summary["rtf"] > 0


STOPS = {"eos", "frame_cap", "cancelled"}


def test_the_shared_table(engine):
    """tests/fixtures/surfaces/cases.json: the same requests and outcomes as the Rust, C and
    command faces."""
    with open(os.path.join(ROOT, "tests", "fixtures", "surfaces", "cases.json")) as f:
        table = json.load(f)
    assert table["model"] == "builtin" and engine.builtin
    outcomes = {}
    for case in table["cases"]:
        frames = case.get("frames", table["frames"])
        kwargs = {k: case[k] for k in ("voice", "language") if k in case}
        for k in ("temperature", "top_p", "repetition_penalty"):
            if k in case:
                kwargs[k] = float(case[k])
        if "top_k" in case:
            kwargs["top_k"] = int(case["top_k"])
        try:
            s = engine.stream(case["text"], max_frames=frames, min_frames=frames, **kwargs)
        except qtts.RequestError as e:
            outcomes[case["name"]] = ("error", "request", str(e))
            continue
        except qtts.QttsError as e:
            outcomes[case["name"]] = ("error", type(e).__name__, str(e))
            continue
        chunks = []
        for c in s:
            chunks.append(c)
            if case.get("cancel"):
                s.cancel()
        summary = s.summary()
        assert summary["stop"] in STOPS
        assert summary["cancelled"] == (summary["stop"] == "cancelled")
        outcomes[case["name"]] = ("ok", np.concatenate(chunks), summary["stop"], frames, case)

    failures = []
    for case in table["cases"]:
        got = outcomes[case["name"]]
        if case["expect"] != got[0]:
            failures.append(f"{case['name']}: expected {case['expect']}, got {got}")
        elif got[0] == "error":
            if got[1] != case["kind"] or case["message"] not in got[2]:
                failures.append(f"{case['name']}: {got[1]} error {got[2]!r}")
        else:
            _, audio, stop, frames, _ = got
            if stop != case["stop"]:
                failures.append(f"{case['name']}: stop {stop}")
            n = len(audio)
            if case.get("cancel"):
                fits = 0 < n < frames * FRAME and n % FRAME == 0
            else:
                fits = n == frames * FRAME
            if not fits or not np.isfinite(audio).all():
                failures.append(f"{case['name']}: {n} samples for {frames} frames")
            if "same_as" in case and not np.array_equal(audio, outcomes[case["same_as"]][1]):
                failures.append(f"{case['name']}: audio differs from {case['same_as']}'s")
            if "differs_from" in case and np.array_equal(
                audio, outcomes[case["differs_from"]][1]
            ):
                failures.append(f"{case['name']}: audio equals {case['differs_from']}'s")
    assert not failures, "\n".join(failures)


def test_max_streams_runs_syntheses_at_once_each_as_alone(cache, engine):
    texts = ["The first.", "A second one.", "And a third."]
    alone = [engine.synthesize(t, seed=3, max_frames=25, min_frames=25) for t in texts]
    with pytest.raises(ValueError, match="max_streams"):
        qtts.Engine("builtin", cache_dir=cache, cores=2, max_streams=0)
    with qtts.Engine("builtin", cache_dir=cache, cores=2, max_streams=3) as e:
        streams = [e.stream(t, seed=3, max_frames=25, min_frames=25) for t in texts]
        # Read the last first: the others wait meanwhile, without holding it back.
        got = [np.concatenate(list(s)) for s in reversed(streams)][::-1]
    for a, g in zip(alone, got):
        assert np.array_equal(a, g)
