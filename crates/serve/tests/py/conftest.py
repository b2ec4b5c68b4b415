"""The `qtts serve` process the tests talk to, on 127.0.0.1 only.

QTTS_BIN names the `qtts` binary (default: the release build in CARGO_TARGET_DIR). The model is
the built-in tiny random-weight model: it never samples end-of-speech, so every request sets
`max_new_tokens` and the server caps frames with --max-frames.
"""

import os
import re
import signal
import subprocess
import time
import urllib.request

import pytest

LISTEN = re.compile(r"listening http=(\S+) wyoming=(\S+)")


def qtts_bin():
    if "QTTS_BIN" in os.environ:
        return os.environ["QTTS_BIN"]
    target = os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/qtts/target"))
    return os.path.join(target, "release", "qtts")


class Server:
    def __init__(self, *args):
        cmd = [qtts_bin(), "serve", "--http", "127.0.0.1:0", "--wyoming", "127.0.0.1:0",
               "--cores", "2", *args]
        if "--max-frames" not in args:
            cmd += ["--max-frames", "64"]
        # One request at a time unless a test says otherwise: the default depends on the
        # kernel tier (2 with AMX), and the tests of the queue's order assume one.
        if "--max-streams" not in args:
            cmd += ["--max-streams", "1"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        line = ""
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if line or self.proc.poll() is not None:
                break
        m = LISTEN.search(line)
        if not m:
            self.proc.kill()
            raise RuntimeError(f"qtts serve did not start: {line!r} {self.proc.stderr.read()}")
        self.http = m.group(1)
        self.wyoming_port = int(m.group(2).rsplit(":", 1)[1])
        self.base = f"http://{self.http}"

    def get(self, path):
        with urllib.request.urlopen(self.base + path, timeout=10) as r:
            return r.read().decode()

    def metric(self, name, **labels):
        """The value of one sample of /metrics (0 when absent)."""
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        total = 0.0
        for line in self.get("/metrics").splitlines():
            if line.startswith("#"):
                continue
            key, _, value = line.rpartition(" ")
            base, _, lab = key.partition("{")
            if base != name:
                continue
            have = ",".join(sorted(l for l in lab.rstrip("}").split(",") if l))
            if all(f'{k}="{v}"' in have.split(",") for k, v in labels.items()) or not want:
                total += float(value)
        return total

    def wait_idle(self, timeout=30.0):
        """Waits until no request is in flight; returns the seconds it took."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.metric("qtts_requests_in_flight") == 0:
                return time.monotonic() - t0
            time.sleep(0.02)
        raise AssertionError(f"still {self.metric('qtts_requests_in_flight')} in flight after {timeout} s")

    def threads(self):
        return len(os.listdir(f"/proc/{self.proc.pid}/task"))

    def threads_settled(self, want, timeout=5.0):
        """The thread count once it is `want`, or what it is after `timeout`: a pump thread is
        counted idle just before it exits, and an exited thread stays listed for a moment."""
        t0 = time.monotonic()
        while True:
            n = self.threads()
            if n == want or time.monotonic() - t0 > timeout:
                return n
            time.sleep(0.01)

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    s.stop()
    assert s.proc.returncode == 0, s.proc.stderr.read()


@pytest.fixture
def make_server():
    made = []

    def make(*args):
        s = Server(*args)
        made.append(s)
        return s

    yield make
    for s in made:
        s.stop()
