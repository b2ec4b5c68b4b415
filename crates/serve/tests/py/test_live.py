"""The live speech WebSocket (`/v1/audio/speech/live`) with the real `websockets` client (15.0.1):
text in as it is written, audio out, each sentence the audio it gets when sent whole."""

import asyncio
import base64
import json

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from test_wyoming import one_shot_events


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def url(server):
    return f"ws://{server.http}/v1/audio/speech/live"


def whole(server, text):
    """The audio of `text` sent whole (Wyoming's one-shot synthesize), s16le bytes."""
    return b"".join(e.payload for e in one_shot_events(server.wyoming_port, text)
                    if e.type == "audio-chunk")


async def send(ws, **msg):
    await ws.send(json.dumps(msg))


async def messages(ws):
    """Every message until the server closes: JSON events as dicts, audio as bytes."""
    out = []
    try:
        async for m in ws:
            out.append(m if isinstance(m, bytes) else json.loads(m))
    except ConnectionClosed:
        pass
    return out


def segments(msgs):
    """The audio of each segment index, in the order the server sent it."""
    audio, cur = {}, None
    for m in msgs:
        if isinstance(m, bytes):
            audio[cur] += m
        elif m["type"] == "segment":
            cur = m["index"]
            audio[cur] = b""
        elif m["type"] == "audio":
            audio[m["index"]] += base64.b64decode(m["data"])
    return audio


async def until_audio(ws):
    """The messages up to the first audio, included."""
    got = []
    while not got or not isinstance(got[-1], bytes):
        m = await ws.recv()
        got.append(m if isinstance(m, bytes) else json.loads(m))
    return got


def kinds(msgs):
    return ["audio" if isinstance(m, bytes) else m["type"] for m in msgs]


def test_sentences_in_pieces_are_the_sentences_sent_whole(server):
    async def go():
        async with connect(url(server)) as ws:
            await send(ws, type="session", voice="vivian")
            for t in ["Hel", "lo there. How a", "re you?"]:
                await send(ws, type="text", text=t)
            await send(ws, type="end")
            return await messages(ws), ws.close_code
    msgs, code = run(go())
    k = kinds(msgs)
    assert msgs[0] == {"type": "session", "sample_rate": 24000, "channels": 1,
                       "format": "pcm_s16le", "audio": "binary", "start": "paced"}
    assert k[-1] == "done" and code == 1000
    assert k.count("segment") == 2 and k.count("segment_end") == 2
    ends = [m for m in msgs if isinstance(m, dict) and m["type"] == "segment_end"]
    assert [e["index"] for e in ends] == [0, 1] and all(e["stop"] for e in ends)
    audio = segments(msgs)
    assert audio[0] == whole(server, "Hello there.")
    assert audio[1] == whole(server, "How are you?")
    assert all(e["samples"] * 2 == len(audio[e["index"]]) for e in ends)


def test_a_sentence_is_spoken_before_its_end_is_sent(server):
    async def go():
        async with connect(url(server)) as ws:
            await send(ws, type="text", text="Hello there, this is the first")
            # Nothing more is sent until audio came: without live sentences this waits for the
            # sentence's end forever (the 60 s timeout).
            got = await until_audio(ws)
            await send(ws, type="text", text=" sentence. And a second.")
            await send(ws, type="end")
            return got + await messages(ws)
    msgs = run(go())
    k = kinds(msgs)
    assert k[:3] == ["session", "segment", "audio"] and k[-1] == "done"
    assert k.count("segment_end") == 2
    assert segments(msgs)[0] == whole(server, "Hello there, this is the first sentence.")


def test_flush_ends_a_sentence_without_its_mark_and_base64_audio(server):
    async def go():
        async with connect(url(server)) as ws:
            await send(ws, type="session", audio="base64")
            await send(ws, type="text", text="Hello there")
            await send(ws, type="flush")
            await send(ws, type="text", text=" and more")
            await send(ws, type="end")
            return await messages(ws)
    msgs = run(go())
    assert msgs[0]["audio"] == "base64"
    assert not any(isinstance(m, bytes) for m in msgs)
    audio = segments(msgs)
    assert audio[0] == whole(server, "Hello there")
    assert audio[1] == whole(server, "and more")


def test_a_sentence_starting_at_its_end_waits_for_it(server):
    async def go():
        async with connect(url(server)) as ws:
            await send(ws, type="session", start="text_end")
            hello = json.loads(await ws.recv())
            await send(ws, type="text", text="Hello there, this is the first")
            # The sentence cannot start before its end, however long this waits.
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(ws.recv(), 0.5)
            await send(ws, type="text", text=" sentence.")
            await send(ws, type="end")
            return hello, await messages(ws)
    hello, msgs = run(go())
    assert hello["start"] == "text_end"
    assert kinds(msgs)[0] == "segment" and kinds(msgs)[-1] == "done"
    assert segments(msgs)[0] == whole(server, "Hello there, this is the first sentence.")

    async def tokens():
        async with connect(url(server)) as ws:
            await send(ws, type="session", start=3)
            return json.loads(await ws.recv())
    assert run(tokens())["start"] == 3


def test_cancel_stops_the_sentence_and_the_session_goes_on(server):
    ok = server.metric("qtts_requests_total", frontend="live", code="ok")

    async def go():
        async with connect(url(server)) as ws:
            # An open sentence: its request waits for the rest of its text, so it cannot end
            # before the cancel, which must stop it.
            await send(ws, type="text", text="Hello there, this is the first")
            got = await until_audio(ws)
            await send(ws, type="cancel")
            await send(ws, type="text", text="Bye.")
            await send(ws, type="end")
            return got + await messages(ws)
    msgs = run(go())
    k = kinds(msgs)
    assert k.count("cancelled") == 1 and k[-1] == "done"
    after = msgs[k.index("cancelled") + 1:]
    # After the cancel: only the new sentence, none of the cancelled one's audio, and it is the
    # sentence's audio sent whole.
    starts = [m["index"] for m in after if isinstance(m, dict) and m["type"] == "segment"]
    assert starts == [1], kinds(after)
    assert isinstance(after[0], dict) and after[0]["type"] == "segment"
    assert segments(after)[1] == whole(server, "Bye.")
    ended = [m["index"] for m in msgs if isinstance(m, dict) and m["type"] == "segment_end"]
    assert ended == [1], "a cancelled sentence does not end normally"
    # The server ended one sentence normally: the cancelled one was stopped, not finished.
    assert server.metric("qtts_requests_total", frontend="live", code="ok") == ok + 1


@pytest.mark.parametrize("first,code", [
    ({"type": "session", "voice": "nobody"}, "voice_not_found"),
    ({"type": "session", "language": "klingon"}, "unsupported_language"),
    ({"type": "session", "voice": "x" * 300}, "field_too_long"),
    ({"type": "speak", "text": "hi"}, "invalid_request"),
    ({"type": "text"}, "invalid_request"),
    ({"type": "text", "text": "hi", "extra": 1}, "invalid_request"),
    ({"type": "session", "start": "soon"}, "invalid_request"),
    ({"type": "session", "start": 0}, "invalid_request"),
])
def test_a_bad_message_is_an_error_then_close(server, first, code):
    async def go():
        async with connect(url(server)) as ws:
            await ws.send(json.dumps(first))
            return await messages(ws), ws.close_code
    msgs, close = run(go())
    assert msgs[-1]["type"] == "error" and msgs[-1]["code"] == code, msgs
    assert msgs[-1]["message"]
    assert close == 1008


def test_session_after_text_and_binary_input_are_refused(server):
    async def go(second):
        async with connect(url(server)) as ws:
            await send(ws, type="text", text="Hi")
            await second(ws)
            return await messages(ws)
    for second in [lambda ws: send(ws, type="session", voice="vivian"),
                   lambda ws: ws.send(b"\x00\x01")]:
        msgs = run(go(second))
        assert msgs[-1]["type"] == "error" and msgs[-1]["code"] == "invalid_request"


def test_an_oversized_message_closes_the_session_and_the_server_stays_up(server):
    async def go():
        async with connect(url(server), max_size=None) as ws:
            await send(ws, type="text", text="a" * 70_000)
            return await messages(ws), ws.close_code
    msgs, code = run(go())
    assert msgs[-1]["code"] == "message_too_long" and code == 1009
    assert server.get("/livez")


def test_the_key_is_checked_before_the_upgrade(make_server):
    s = make_server("--api-key", "sekrit")

    async def go(headers):
        async with connect(url(s), additional_headers=headers) as ws:
            await send(ws, type="end")
            return await messages(ws)
    with pytest.raises(InvalidStatus) as e:
        run(go({}))
    assert e.value.response.status_code == 401
    assert json.loads(e.value.response.body)["error"]["code"] == "invalid_api_key"
    assert kinds(run(go({"Authorization": "Bearer sekrit"}))) == ["session", "done"]


def test_a_plain_get_is_told_to_upgrade(server):
    import urllib.error
    import urllib.request
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(server.base + "/v1/audio/speech/live", timeout=10)
    body = json.loads(e.value.read())
    assert e.value.code >= 400 and body["error"]["code"] == "invalid_request"
