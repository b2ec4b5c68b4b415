"""What the Python layer costs: the same request through `Engine.stream` (chunks taken in
Python, as a player would) and read entirely in Rust on the same engine (`Engine._time_in_rust`),
interleaved; medians and ratios from the same run. `crates/c/benches/overhead.rs` relates the
Rust worker to the Rust API.

    python crates/python/bench_overhead.py [MODEL [FRAMES [RUNS]]]
"""

import statistics
import sys
import time

import qtts

model = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] else None
frames = int(sys.argv[2]) if len(sys.argv) > 2 else 125
runs = int(sys.argv[3]) if len(sys.argv) > 3 else 7
text = "The quick brown fox jumps over the lazy dog, then naps in the sun."

engine = qtts.Engine(model)
print(f"{engine!r}, {frames} frames, {runs} runs", file=sys.stderr)


def in_python():
    t = time.perf_counter()
    first, samples = None, 0
    for c in engine.stream(text, max_frames=frames, min_frames=frames):
        if first is None:
            first = time.perf_counter() - t
        samples += len(c)
    return first, time.perf_counter() - t, samples


def in_rust():
    return engine._time_in_rust(text, frames)


in_python(), in_rust()  # warm-up
py, rs = [], []
for _ in range(runs):
    py.append(in_python())
    rs.append(in_rust())
assert all(r[2] == frames * 1920 for r in py + rs)
audio = frames * 0.08
rows = [("Rust, same worker", rs), ("Python (Engine.stream)", py)]
base_ttfa = statistics.median(r[0] for r in rs)
base_total = statistics.median(r[1] for r in rs)
print("| path | TTFA ms (median) | RTF (median) | TTFA - Rust | RTF / Rust |")
print("|---|---|---|---|---|")
for name, rows_ in rows:
    ttfa = statistics.median(r[0] for r in rows_)
    total = statistics.median(r[1] for r in rows_)
    print(
        f"| {name} | {ttfa * 1e3:.2f} | {total / audio:.4f} | {(ttfa - base_ttfa) * 1e3:+.2f} ms"
        f" | {total / base_total:.3f} |"
    )
