#!/usr/bin/env python3
"""What a bulk writer costs a small durable write on this disk, with no daemon at all.

The floor under issue 46's bars: a put is acknowledged after its redo-log append reaches the
disk (`pwrite` of a few KiB + `fdatasync`), and a published block after its 4 MiB reach the
disk (`O_DIRECT` write + `fdatasync`). When both share one disk, every small flush also waits
for the bulk bytes written since the last one. This measures that and nothing else: one
process appends 4 KiB records and fdatasyncs each (as the node committer does for one put),
while another process writes 4 MiB `O_DIRECT` blocks, each followed by `fdatasync`, paced to a
given MiB/s (as the owner writes an upload's blocks). Neither does anything else, so
scheduling, TLS, hashing and the provider are out of the picture: whatever the small write pays
here, no schedule inside the daemon can take back.

Prints, per bulk rate, the small writes' p50 / p99 and their ratio to the no-bulk window, and
the bulk rate reached; `--json FILE` writes the same. Usage:

    python3 scripts/disk_interference_floor.py [--dir /tmp] [--seconds 10] [--rates 0,25,60,115,230]
"""

import argparse
import json
import mmap
import multiprocessing
import os
import statistics
import time

SMALL = 4096
BLOCK = 4 << 20


def bulk_writer(path, mib_per_s, stop, written):
    """Write 4 MiB O_DIRECT blocks + fdatasync, paced to mib_per_s (0: never started)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600)
    buf = mmap.mmap(-1, BLOCK)
    buf.write(os.urandom(BLOCK))
    blocks = 0
    start = time.monotonic()
    try:
        while not stop.is_set():
            # Wrap within 256 MiB so the file stays bounded; the disk sees new writes either way.
            os.pwritev(fd, [buf], (blocks % 64) * BLOCK)
            os.fdatasync(fd)
            blocks += 1
            due = start + blocks * BLOCK / (mib_per_s * (1 << 20))
            pause = due - time.monotonic()
            if pause > 0:
                # A load generator's pacing, not a synchronisation.
                stop.wait(pause)
    finally:
        written.value = blocks * BLOCK / (1 << 20) / (time.monotonic() - start)
        os.close(fd)


def small_writes(path, seconds):
    """Append 4 KiB records with fdatasync each, for `seconds`; return latencies in ms."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.posix_fallocate(fd, 0, 64 << 20)
    os.fsync(fd)
    record = os.urandom(SMALL)
    latencies = []
    offset = 0
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            began = time.perf_counter()
            os.pwrite(fd, record, offset)
            os.fdatasync(fd)
            latencies.append((time.perf_counter() - began) * 1000)
            offset = (offset + SMALL) % (64 << 20)
    finally:
        os.close(fd)
    return latencies


def percentile(values, p):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))]


def measure(directory, seconds, rate):
    small_path = os.path.join(directory, "floor-small.log")
    bulk_path = os.path.join(directory, "floor-bulk.dat")
    stop = multiprocessing.Event()
    written = multiprocessing.Value("d", 0.0)
    writer = None
    if rate > 0:
        writer = multiprocessing.Process(target=bulk_writer, args=(bulk_path, rate, stop, written))
        writer.start()
    try:
        latencies = small_writes(small_path, seconds)
    finally:
        stop.set()
        if writer is not None:
            writer.join()
    for path in (small_path, bulk_path):
        if os.path.exists(path):
            os.unlink(path)
    return {
        "bulk_target_mib_per_s": rate,
        "bulk_mib_per_s": round(written.value, 1),
        "small_writes": len(latencies),
        "p50_ms": round(statistics.median(latencies), 3),
        "p99_ms": round(percentile(latencies, 0.99), 3),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", default="/tmp", help="a directory on the disk to measure")
    parser.add_argument("--seconds", type=float, default=10.0, help="per rate")
    parser.add_argument("--rates", default="0,25,60,115,230", help="bulk MiB/s; 0 is no bulk")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    if 0.0 not in rates:
        rates.insert(0, 0.0)
    results = [measure(args.dir, args.seconds, rate) for rate in rates]
    base = next(r for r in results if r["bulk_target_mib_per_s"] == 0.0)
    print(f"{'bulk target':>12} {'bulk reached':>13} {'small p50 ms':>13} {'p99 ms':>8} "
          f"{'p50 ratio':>10} {'p99 ratio':>10}")
    for r in results:
        r["p50_ratio"] = round(r["p50_ms"] / base["p50_ms"], 2)
        r["p99_ratio"] = round(r["p99_ms"] / base["p99_ms"], 2)
        print(f"{r['bulk_target_mib_per_s']:>12.0f} {r['bulk_mib_per_s']:>13.1f} "
              f"{r['p50_ms']:>13.3f} {r['p99_ms']:>8.3f} {r['p50_ratio']:>9.2f}x "
              f"{r['p99_ratio']:>9.2f}x")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)


if __name__ == "__main__":
    main()
