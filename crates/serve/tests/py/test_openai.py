"""The real `openai` client (3.60.0) against `qtts serve` (serving.md §1.7)."""

import asyncio
import base64
import io
import json
import shutil
import socket
import subprocess
import time
import wave

import httpx2 as httpx
import numpy as np
import openai
import pytest
import soundfile

FRAMES = 12
SAMPLES = FRAMES * 1920
EXTRA = {"max_new_tokens": FRAMES, "seed": 1}


def client(server, **kw):
    kw.setdefault("max_retries", 0)
    return openai.OpenAI(base_url=server.base + "/v1", api_key="sk-local", **kw)


def pcm(server, **kw):
    """The s16 samples of a streamed pcm response and the arrival time of each chunk."""
    times, data = [], b""
    t0 = time.monotonic()
    body = dict(model="tts-1", voice="vivian", input="Hello there.", response_format="pcm",
                extra_body=EXTRA)
    body.update(kw)
    with client(server).audio.speech.with_streaming_response.create(**body) as r:
        assert r.headers["content-type"] == "audio/pcm"
        for c in r.iter_bytes():
            times.append(time.monotonic() - t0)
            data += c
    return data, times


def test_models_list_has_the_model_and_aliases(server):
    ids = [m.id for m in client(server).models.list()]
    assert ids[0].startswith("qwen3-tts-12hz-")
    assert {"tts-1", "tts-1-hd", "gpt-4o-mini-tts"} <= set(ids)


def test_voices_are_objects_with_id_and_name(server):
    v = httpx.get(server.base + "/v1/audio/voices").json()["voices"]
    assert v and all("id" in x and "name" in x for x in v)
    assert "vivian" in [x["id"] for x in v]


def test_pcm_streams_incrementally_and_is_reproducible(server):
    data, times = pcm(server)
    assert len(data) == SAMPLES * 2
    assert len(times) > 1 and times[0] < times[-1], "audio came in one piece"
    again, _ = pcm(server)
    assert again == data
    other, _ = pcm(server, extra_body={"max_new_tokens": FRAMES, "seed": 2})
    assert other != data


def test_wav_has_streaming_header_and_the_same_samples(server):
    data, _ = pcm(server)
    with client(server).audio.speech.with_streaming_response.create(
            model="tts-1", voice="vivian", input="Hello there.", response_format="wav",
            extra_body=EXTRA) as r:
        wav = r.read()
    assert r.headers["content-type"] == "audio/wav"
    assert wav[:4] == b"RIFF" and wav[4:8] == b"\xff\xff\xff\xff"
    audio, rate = soundfile.read(io.BytesIO(wav), dtype="int16")
    assert rate == 24000
    assert len(audio) == SAMPLES
    assert audio.tobytes() == data


@pytest.mark.parametrize("fmt,ctype", [("mp3", "audio/mpeg"), ("opus", "audio/ogg"),
                                        ("flac", "audio/flac"), (None, "audio/mpeg")])
def test_compressed_formats_decode(server, fmt, ctype):
    kw = {} if fmt is None else {"response_format": fmt}
    r = client(server).audio.speech.create(model="tts-1", voice="vivian", input="Hello there.",
                                            extra_body=EXTRA, **kw)
    assert r.response.headers["content-type"] == ctype
    body = r.content
    if fmt == "flac":
        # A streamed FLAC states no length (STREAMINFO total 0, "unknown"). libsndfile decodes
        # it, but soundfile's read() then seeks to the position it expects, which libFLAC
        # refuses without a length: call libsndfile's read directly, up to the end.
        with soundfile.SoundFile(io.BytesIO(body)) as f:
            rate = f.samplerate
            buf = np.zeros(SAMPLES * 2, dtype=np.int16)
            n = soundfile._snd.sf_readf_short(f._file, soundfile._ffi.cast("short*", buf.ctypes.data),
                                              len(buf))
            pcm16 = buf[:n]
        ref, _ = pcm(server)
        assert pcm16.tobytes() == ref, "FLAC is lossless"
        audio = pcm16
    else:
        audio, rate = soundfile.read(io.BytesIO(body), dtype="float32")
    if fmt == "opus":
        # libsndfile decodes Ogg Opus at 48 kHz; the end granule trims it to the input.
        assert rate in (24000, 48000)
        assert abs(len(audio) - SAMPLES * rate // 24000) <= 2 * rate // 100
    else:
        assert rate == 24000
    if fmt in ("mp3", None):
        assert not body.startswith(b"ID3")
        assert b"Xing" not in body[:2048] and b"Info" not in body[:2048]
        # MPEG decoders add the codec delay and pad to whole frames.
        assert SAMPLES <= len(audio) <= SAMPLES + 3 * 576 + 1152


def test_sse_deltas_carry_the_raw_bytes(server):
    data, _ = pcm(server)
    events = []
    with client(server).audio.speech.with_streaming_response.create(
            model="tts-1", voice="vivian", input="Hello there.", response_format="pcm",
            stream_format="sse", extra_body=EXTRA) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    kinds = [e["type"] for e in events]
    assert kinds[-1] == "speech.audio.done" and kinds.count("speech.audio.done") == 1
    assert set(kinds[:-1]) == {"speech.audio.delta"}
    audio = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert audio == data
    usage = events[-1]["usage"]
    assert usage["output_tokens"] == FRAMES
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert usage["input_tokens"] > 0


def test_buffered_files_have_exact_sizes(server):
    ref, _ = pcm(server)
    body = {"model": "tts-1", "voice": "vivian", "input": "Hello there.", "stream": False, **EXTRA}
    r = httpx.post(server.base + "/v1/audio/speech", json={**body, "response_format": "wav"})
    assert r.status_code == 200
    assert int(r.headers["content-length"]) == 44 + SAMPLES * 2
    assert int.from_bytes(r.content[40:44], "little") == SAMPLES * 2
    assert int.from_bytes(r.content[4:8], "little") == 36 + SAMPLES * 2
    assert r.content[44:] == ref
    r = httpx.post(server.base + "/v1/audio/speech", json={**body, "response_format": "flac"})
    audio, rate = soundfile.read(io.BytesIO(r.content), dtype="int16")
    assert rate == 24000 and audio.tobytes() == ref


@pytest.mark.parametrize("stream", [True, False])
def test_wav_and_flac_open_in_the_usual_readers(server, stream):
    """soundfile (libsndfile) reads FLAC and WAV whole, streamed or not, and Python's `wave` reads
    the WAV: the same samples as the raw pcm."""
    ref, _ = pcm(server)
    body = {"model": "tts-1", "voice": "vivian", "input": "Hello there.", "stream": stream, **EXTRA}
    for fmt in ("flac", "wav"):
        r = httpx.post(server.base + "/v1/audio/speech", json={**body, "response_format": fmt})
        assert r.status_code == 200
        audio, rate = soundfile.read(io.BytesIO(r.content), dtype="int16")
        assert rate == 24000 and audio.tobytes() == ref, (fmt, stream, len(audio))
        if fmt == "wav":
            with wave.open(io.BytesIO(r.content)) as w:
                assert (w.getframerate(), w.getsampwidth(), w.getnchannels()) == (24000, 2, 1)
                assert w.readframes(SAMPLES + 1) == ref


def ffmpeg_s16(body):
    """`body` decoded by ffmpeg (Debian's, as users run it) to 24 kHz mono s16."""
    exe = shutil.which("ffmpeg")
    if exe is None:
        pytest.skip("ffmpeg: not installed (.ci/run installs Debian's)")
    r = subprocess.run([exe, "-v", "error", "-i", "pipe:0", "-f", "s16le", "-ac", "1", "-ar",
                        "24000", "pipe:1"], input=body, capture_output=True, timeout=60)
    assert r.returncode == 0 and not r.stderr, r.stderr.decode(errors="replace")
    return r.stdout


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3", "opus"])
def test_every_format_opens_in_ffmpeg(server, fmt, stream):
    """ffmpeg reads every format the server sends, streamed or not, without a warning: WAV and
    FLAC give the raw pcm's samples exactly, MP3 and Opus the same length up to the codecs'
    padding."""
    ref, _ = pcm(server)
    body = {"model": "tts-1", "voice": "vivian", "input": "Hello there.", "stream": stream,
            "response_format": fmt, **EXTRA}
    r = httpx.post(server.base + "/v1/audio/speech", json=body)
    assert r.status_code == 200
    audio = ffmpeg_s16(r.content)
    if fmt in ("wav", "flac"):
        assert audio == ref, (fmt, stream, len(audio))
    else:
        n = len(audio) // 2
        assert SAMPLES - 960 <= n <= SAMPLES + 3 * 576 + 1152 + 960, (fmt, n)


@pytest.mark.parametrize("kw,code,param", [
    ({"voice": "nobody"}, "voice_not_found", "voice"),
    ({"input": "   "}, "empty_input", "input"),
    ({"input": "a" * 5000}, "input_too_long", "input"),
    ({"input": "word " * 20000}, "input_too_long", "input"),
    ({"speed": 5.0}, "invalid_speed", "speed"),
    ({"response_format": "aac"}, "unsupported_response_format", "response_format"),
    ({"extra_body": {"language": "klingon", **EXTRA}}, "unsupported_language", "language"),
    ({"extra_body": {"seed": -1}}, "invalid_type", "seed"),
])
def test_bad_requests_get_the_openai_envelope(server, kw, code, param):
    body = dict(model="tts-1", voice="vivian", input="Hello.", response_format="pcm",
                extra_body=EXTRA)
    body.update(kw)
    with pytest.raises(openai.BadRequestError) as e:
        client(server).audio.speech.create(**body)
    err = e.value.body
    assert err["code"] == code and err["param"] == param, err
    assert err["type"] == "invalid_request_error" and err["message"]


@pytest.mark.parametrize("raw", [b"{not json", b"\xff\xfe\x00garbage", b"[1,2]", b""])
def test_malformed_bodies_are_400(server, raw):
    r = httpx.post(server.base + "/v1/audio/speech", content=raw,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_a_body_over_16_mib_is_413(server):
    r = httpx.post(server.base + "/v1/audio/speech", content=b"{" + b" " * (17 << 20) + b"}",
                   headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "request_too_large"


def test_huge_headers_are_refused_and_the_server_stays_up(server):
    r = httpx.get(server.base + "/livez", headers={"x-big": "a" * 1_000_000})
    assert r.status_code in (400, 431)
    assert httpx.get(server.base + "/livez").status_code == 200


def test_open_webui_body_shape(server):
    r = httpx.post(server.base + "/v1/audio/speech",
                   json={"input": "hi", "voice": "alloy", "model": "tts-1", **EXTRA})
    assert r.status_code == 200 and r.headers["content-type"] == "audio/mpeg"


def test_speed_is_accepted_with_a_warning(server):
    r = httpx.post(server.base + "/v1/audio/speech", json={
        "input": "hi", "voice": "vivian", "speed": 1.5, "response_format": "pcm", **EXTRA})
    assert r.status_code == 200 and "speed ignored" in r.headers["x-qtts-warning"]
    assert len(r.content) == SAMPLES * 2


def test_health_routes_and_metrics(server):
    assert httpx.get(server.base + "/livez").status_code == 200
    assert httpx.get(server.base + "/readyz").status_code == 200
    h = httpx.get(server.base + "/health").json()
    assert h["status"] == "ok" and h["queue"] == 0
    text = server.get("/metrics")
    for name in ("qtts_requests_total", "qtts_requests_in_flight", "qtts_stage_seconds_bucket",
                 "qtts_time_to_first_audio_seconds_bucket", "qtts_late_chunks_total",
                 "qtts_request_lateness_seconds_bucket", "qtts_model_info"):
        assert name in text, name
    assert text.rstrip().endswith("# EOF")


def test_each_request_records_its_lateness_once(server):
    # One observation per request that made audio: the most its chunks came after the audio
    # before them had played out (the buffer a real-time listener needed), within its duration.
    count = server.metric("qtts_request_lateness_seconds_count")
    late = server.metric("qtts_request_lateness_seconds_sum")
    spent = server.metric("qtts_request_duration_seconds_sum")
    for _ in range(2):
        r = httpx.post(server.base + "/v1/audio/speech", json={
            "input": "Two sentences. Each one.", "voice": "vivian", "response_format": "pcm",
            **EXTRA})
        assert r.status_code == 200 and len(r.content) > 0
    assert server.metric("qtts_request_lateness_seconds_count") == count + 2
    added = server.metric("qtts_request_lateness_seconds_sum") - late
    assert 0 <= added <= server.metric("qtts_request_duration_seconds_sum") - spent


def wait_running(server, n=1, timeout=10):
    t0 = time.monotonic()
    while server.metric("qtts_requests_in_flight") < n:
        assert time.monotonic() - t0 < timeout, "the request did not start"
        time.sleep(0.01)


def held_request(server):
    """A streaming request whose client reads nothing: with `--buffer-seconds 1` the engine is
    held by backpressure (running, or queued behind a held one) until the socket is closed or
    the write-stall timeout; returns the socket."""
    sock = socket.create_connection(("127.0.0.1", int(server.http.rsplit(":", 1)[1])))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    body = json.dumps({"input": "A long one. " * 20, "voice": "vivian", "response_format": "pcm",
                       "max_new_tokens": 4000, "seed": 1})
    sock.sendall((f"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
    return sock


def test_full_queue_is_503_with_retry_after_and_the_sdk_retries(make_server):
    # Both held for as long as the test needs them (not for as long as they happen to take):
    # one running, one queued, so the queue of 1 stays full through the SDK's retries.
    s = make_server("--queue", "1", "--max-frames", "4000", "--buffer-seconds", "1",
                    "--write-stall-timeout", "60")
    running = held_request(s)
    wait_running(s, 1)
    queued = held_request(s)
    wait_running(s, 2)
    r = httpx.post(s.base + "/v1/audio/speech", json={"input": "hi", "voice": "vivian", **EXTRA})
    assert r.status_code == 503
    assert 1 <= int(r.headers["retry-after"]) <= 30
    assert r.json()["error"]["code"] == "server_overloaded"
    before = s.metric("qtts_requests_rejected_total", reason="queue_full")
    with pytest.raises(openai.InternalServerError):
        client(s, max_retries=2).audio.speech.create(model="tts-1", voice="vivian", input="hi",
                                                     extra_body=EXTRA)
    assert s.metric("qtts_requests_rejected_total", reason="queue_full") == before + 3
    assert s.metric("qtts_requests_in_flight") == 2
    # Their clients leave: both are cancelled and the engine serves the next request whole.
    running.close()
    queued.close()
    s.wait_idle(30.0)
    data, _ = pcm(s)
    assert len(data) == SAMPLES * 2


def test_client_disconnect_cancels_the_request(make_server):
    s = make_server("--max-frames", "4000")
    before = s.metric("qtts_requests_cancelled_total", reason="client_disconnect")
    with client(s).audio.speech.with_streaming_response.create(
            model="tts-1", voice="vivian", input="A long one. " * 20, response_format="pcm",
            extra_body={"max_new_tokens": 4000, "seed": 1}) as r:
        next(r.iter_bytes())
    # The deadline only keeps a broken server from hanging the suite; what is asserted is what
    # the server did: it cancelled the request long before its 4000 frames (the pump looks at
    # its client every 20 ms; the latency is the serving bench's to measure).
    t0 = time.monotonic()
    while s.metric("qtts_requests_cancelled_total", reason="client_disconnect") == before:
        assert time.monotonic() - t0 < 30, "the request was never cancelled"
        time.sleep(0.005)
    s.wait_idle(30.0)
    assert s.metric("qtts_frames_total") < 4000
    # The engine is free: the next request runs whole.
    data, _ = pcm(s)
    assert len(data) == SAMPLES * 2


def test_queued_disconnect_never_runs(make_server):
    s = make_server("--queue", "2", "--max-frames", "4000", "--buffer-seconds", "1",
                    "--write-stall-timeout", "60")
    running = held_request(s)
    wait_running(s, 1)
    sock = socket.create_connection(("127.0.0.1", int(s.http.rsplit(":", 1)[1])))
    body = json.dumps({"input": "queued", "voice": "vivian", "response_format": "pcm", **EXTRA})
    sock.sendall((f"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
    wait_running(s, 2)
    sock.close()
    t0 = time.monotonic()
    while s.metric("qtts_queue_abandoned_total") < 1:
        assert time.monotonic() - t0 < 30, "the queued request was never dropped"
        time.sleep(0.01)
    assert s.metric("qtts_requests_in_flight") == 1, "the held request still runs"
    httpx.get(s.base + "/livez")
    running.close()
    s.stop()


def test_api_key(make_server):
    s = make_server("--api-key", "k")
    with pytest.raises(openai.AuthenticationError):
        client(s).audio.speech.create(model="tts-1", voice="vivian", input="hi", extra_body=EXTRA)
    ok = openai.OpenAI(base_url=s.base + "/v1", api_key="k", max_retries=0)
    assert ok.audio.speech.create(model="tts-1", voice="vivian", input="hi",
                                  response_format="pcm", extra_body=EXTRA).content


def test_async_client_two_concurrent_requests_in_fifo_order(server):
    async def one(c, i):
        async with c.audio.speech.with_streaming_response.create(
                model="tts-1", voice="vivian", input=f"Request {i}.", response_format="pcm",
                extra_body={"max_new_tokens": 40, "seed": i}) as r:
            n = 0
            async for chunk in r.iter_bytes():
                n += len(chunk)
        return n, int(r.headers["x-qtts-job"]), int(r.headers["x-qtts-after-job"])

    async def main():
        c = openai.AsyncOpenAI(base_url=server.base + "/v1", api_key="sk-local", max_retries=0)
        first = asyncio.create_task(one(c, 1))
        await asyncio.sleep(0.005)
        second = asyncio.create_task(one(c, 2))
        return await first, await second

    # Both whole; the engine ran them one after the other in the order they were queued: the
    # later one started right after the earlier one ended (what the server did, not when the
    # client's event loop happened to read the bytes).
    (n1, seq1, after1), (n2, seq2, after2) = asyncio.run(main())
    assert n1 == n2 == 40 * 1920 * 2
    (early, _), (late, late_after) = sorted([(seq1, after1), (seq2, after2)])
    assert late_after == early, f"job {late} ran after job {late_after}, not after job {early}"


def test_max_streams_speaks_two_requests_at_once(make_server):
    s = make_server("--max-streams", "2")

    async def one(c, i, frames, text):
        async with c.audio.speech.with_streaming_response.create(
                model="tts-1", voice="vivian", input=text, response_format="pcm",
                extra_body={"max_new_tokens": frames, "seed": i}) as r:
            job, after = int(r.headers["x-qtts-job"]), int(r.headers["x-qtts-after-job"])
            n = 0
            async for chunk in r.iter_bytes():
                n += len(chunk)
                if i == 1 and n >= 1920 * 2:
                    started.set()
        return n, job, after

    async def main():
        c = openai.AsyncOpenAI(base_url=s.base + "/v1", api_key="sk-local", max_retries=0)
        long = asyncio.create_task(one(c, 1, 600, "A long request, spoken at length. " * 12))
        await started.wait()
        # The long request is under way (its first audio is here) and has hundreds of frames to
        # go: the short one is taken beside it, not after it.
        short = await one(c, 2, 40, "A short one.")
        return await long, short

    started = asyncio.Event()
    (n1, job1, _), (n2, job2, after2) = asyncio.run(main())
    assert n2 == 40 * 1920 * 2 and n1 > n2
    assert after2 != job1, f"job {job2} started after job {job1} ended, not beside it"
    # The engine reports its slots, and /metrics the talker's steps by batch size: the long
    # request's first steps alone, then steps of the two together, never three.
    assert httpx.get(s.base + "/health").json()["max_streams"] == 2
    deadline = time.monotonic() + 10
    while s.metric("qtts_talker_batch_steps_total", streams="2") == 0:
        # A request's figures reach /metrics as it ends, just after its last byte.
        assert time.monotonic() < deadline, "no step of two streams reached /metrics"
        time.sleep(0.05)
    assert s.metric("qtts_talker_batch_step_seconds_total", streams="2") > 0
    assert s.metric("qtts_talker_batch_steps_total", streams="1") > 0
    assert s.metric("qtts_talker_batch_steps_total", streams="3") == 0


def test_slow_reader_is_bounded_then_cancelled(make_server):
    s = make_server("--max-frames", "4000", "--buffer-seconds", "1", "--write-stall-timeout", "1")
    sock = socket.create_connection(("127.0.0.1", int(s.http.rsplit(":", 1)[1])))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    body = json.dumps({"input": "A long one. " * 20, "voice": "vivian", "response_format": "pcm",
                       "max_new_tokens": 4000, "seed": 1})
    sock.sendall((f"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
    sock.recv(100)  # then read nothing
    t0 = time.monotonic()
    while s.metric("qtts_requests_cancelled_total", reason="slow_client") < 1:
        assert time.monotonic() - t0 < 20, "a reader that stopped was never dropped"
        time.sleep(0.1)
    # Memory stayed bounded: far less than the 4000 frames (5 min of audio) it asked for.
    assert s.metric("qtts_frames_total") < 4000
    sock.close()
    s.wait_idle(30.0)


def test_sigterm_drains_then_cancels_and_exits(make_server):
    import signal
    # The client reads nothing, so its request is still running when the drain ends.
    s = make_server("--max-frames", "4000", "--drain-timeout", "0.5", "--buffer-seconds", "1",
                    "--write-stall-timeout", "60")
    sock = held_request(s)
    wait_running(s, 1)
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(timeout=30) == 0
    # What the server did: drained, then cancelled the request it still had, then exited. (Its
    # client, reading through a 4 KiB window, would take a minute to see the broken-off end;
    # the audio-limit test reads one.)
    log = s.proc.stderr.read()
    assert "draining (1 requests in flight" in log, log
    assert "cancelling 1 requests" in log, log
    sock.close()
    with pytest.raises(httpx.ConnectError):
        httpx.get(s.base + "/livez")


def test_audio_limit_breaks_the_body_off(make_server):
    s = make_server("--max-frames", "4000", "--max-audio-seconds", "1")
    with pytest.raises(httpx.RemoteProtocolError):
        httpx.post(s.base + "/v1/audio/speech", json={
            "input": "A long one. " * 20, "voice": "vivian", "response_format": "pcm",
            "max_new_tokens": 4000})
    assert s.metric("qtts_requests_cancelled_total", reason="audio_limit") == 1
