"""A soak of `qtts serve` under the hostile patterns of test_hostile.py, beside honest clients.

For `seconds`, these run at once against one server:
- stalled bodies: headers with the right key, `{`, then silence, reopened when dropped (32);
- trickled bodies: a byte every 0.5 s (4);
- wrong keys announcing 16 MiB bodies and sending 1 MiB of them (8);
- oversized fields: an 8 MiB `ref_text` (2);
- Wyoming clients that ask for `describe` until their sends block and never read (8);
- 2 honest clients, each speaking a short request (with the key) and asking `/livez`, in a loop.

Then it checks that every honest request was served whole, that `/livez` always answered 200,
and, once the attackers stopped, that the server's RSS is back within 64 MiB of where it was after
the first honest requests and its thread count is back to its count then.

Standalone, 10 minutes: `python soak.py --minutes 10` (QTTS_BIN names the binary, as for the
tests). test_hostile.py runs it for 20 s.
"""

import argparse
import json
import socket
import threading
import time

import httpx2 as httpx

KEY = "soak-key"
HONEST = {"input": "Hello there.", "voice": "vivian", "response_format": "pcm",
          "max_new_tokens": 6, "seed": 1}
HONEST_BYTES = 6 * 1920 * 2


def _http_addr(server):
    host, port = server.http.rsplit(":", 1)
    return host, int(port)


def _head(length, key):
    return (f"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {key}\r\nContent-Length: {length}\r\n\r\n").encode()


def _drain_until_closed(sock, stop):
    sock.settimeout(0.5)
    while not stop.is_set():
        try:
            if not sock.recv(65536):
                return
        except socket.timeout:
            continue
        except OSError:
            return


def _loop(stop, body):
    while not stop.is_set():
        try:
            body()
        except OSError:
            time.sleep(0.05)


def stalled(server, stop):
    s = socket.create_connection(_http_addr(server), timeout=5)
    with s:
        s.sendall(_head(100, KEY) + b"{")
        _drain_until_closed(s, stop)


def trickled(server, stop):
    s = socket.create_connection(_http_addr(server), timeout=5)
    with s:
        s.sendall(_head(1000, KEY))
        while not stop.is_set():
            s.sendall(b" ")
            time.sleep(0.5)


def wrong_key(server, stop):
    s = socket.create_connection(_http_addr(server), timeout=5)
    with s:
        s.sendall(_head((16 << 20) - 100, "wrong"))
        chunk = b" " * 65536
        for _ in range(16):
            if stop.is_set():
                break
            s.sendall(chunk)
        _drain_until_closed(s, stop)


def oversized(server, stop):
    body = json.dumps({**HONEST, "ref_text": "x" * (8 << 20)}).encode()
    r = httpx.post(server.base + "/v1/audio/speech", content=body, timeout=30,
                   headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"})
    assert r.status_code in (400, 503), r.status_code


def deaf_wyoming(server, stop):
    s = socket.create_connection(("127.0.0.1", server.wyoming_port), timeout=5)
    with s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.setblocking(False)
        while not stop.is_set():
            try:
                s.send(b'{"type": "describe"}\n')
            except BlockingIOError:
                break
        s.setblocking(True)
        # Held, never read, until the server drops it.
        deadline = time.monotonic() + 60
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                s.send(b'{"type": "describe"}\n')
                time.sleep(0.2)
            except OSError:
                return


def run(server, seconds):
    """Runs the soak against `server` (started with `--api-key soak-key`); returns its figures."""
    honest = {"ok": 0, "bad": [], "livez_bad": 0}
    lock = threading.Lock()

    def honest_client(stop):
        while not stop.is_set():
            r = httpx.post(server.base + "/v1/audio/speech", json=HONEST, timeout=60,
                           headers={"authorization": f"Bearer {KEY}"})
            live = httpx.get(server.base + "/livez", timeout=10).status_code
            with lock:
                if r.status_code == 200 and len(r.content) == HONEST_BYTES:
                    honest["ok"] += 1
                else:
                    honest["bad"].append((r.status_code, r.content[:200]))
                if live != 200:
                    honest["livez_bad"] += 1

    # The baseline: after a few honest requests (buffers, encoders and pumps made once).
    for _ in range(4):
        httpx.post(server.base + "/v1/audio/speech", json=HONEST, timeout=60,
                   headers={"authorization": f"Bearer {KEY}"}).raise_for_status()
    # Idle first: the last request's pump thread is gone (the client may have its last byte
    # before the pump has ended), and the count has stopped moving.
    server.wait_idle(timeout=60)
    threads0 = server.threads()
    t_stable = time.monotonic()
    while time.monotonic() - t_stable < 0.5:
        time.sleep(0.05)
        n = server.threads()
        if n != threads0:
            threads0, t_stable = n, time.monotonic()
    rss0 = server.rss_kib()
    stop = threading.Event()
    plan = [(stalled, 32), (trickled, 4), (wrong_key, 8), (oversized, 2), (deaf_wyoming, 8)]
    workers = [threading.Thread(target=_loop, args=(stop, lambda f=f: f(server, stop)), daemon=True)
               for f, n in plan for _ in range(n)]
    workers += [threading.Thread(target=honest_client, args=(stop,), daemon=True) for _ in range(2)]
    peak = rss0
    for w in workers:
        w.start()
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        time.sleep(1)
        peak = max(peak, server.rss_kib())
    stop.set()
    for w in workers:
        w.join(timeout=90)
    # Settled: every attacker's connection closed, the pumps gone.
    server.wait_idle(timeout=60)
    threads = server.threads_settled(threads0, timeout=30)
    rss = server.rss_kib()
    return {
        "seconds": seconds,
        "honest_ok": honest["ok"],
        "honest_bad": honest["bad"],
        "livez_bad": honest["livez_bad"],
        "rss_start_mib": rss0 / 1024,
        "rss_peak_mib": peak / 1024,
        "rss_end_mib": rss / 1024,
        "threads_start": threads0,
        "threads_end": threads,
        "body_timeouts": server.metric("qtts_requests_total", code="408"),
        "unauthorized": server.metric("qtts_requests_total", code="401"),
    }


def check(figures):
    assert figures["honest_ok"] > 0 and not figures["honest_bad"], figures
    assert figures["livez_bad"] == 0, figures
    assert figures["rss_end_mib"] <= figures["rss_start_mib"] + 64, figures
    assert figures["threads_end"] == figures["threads_start"], figures


if __name__ == "__main__":
    import os
    import sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from conftest import Server
    a = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    a.add_argument("--minutes", type=float, default=10.0)
    args = a.parse_args()
    srv = Server("--api-key", KEY)
    try:
        f = run(srv, args.minutes * 60)
        print(json.dumps(f, indent=1, default=str))
        check(f)
        print("soak: passed")
    finally:
        srv.stop()
