#!/usr/bin/env python3
"""Owner-upload interference probe for nokv.

Question it answers: while one agent publishes large artifacts through the shard owner, do the
other agents on that shard keep their interactive latency?

The probe starts a nokv daemon (or connects to one with --endpoint), then, per cycle:

  * starts --sessions long-lived `nokv bench session` processes (a tool loop: stat a file,
    write a 4 KiB file; one JSON line per operation), each with its own workspace and its
    own scoped write token, all placed on the uploader's shard by default (--placement);
  * runs the conditions in order idle, paced, unpaced, idle-again, --seconds each; during
    paced and unpaced one `nokv bench upload` process publishes 16 MiB artifacts back to back
    (paced: --pace MiB/s on average; unpaced: as fast as it can);
  * stops everything and attributes each session operation to the condition whose window
    contains the operation's start time, dropping --margin seconds at both edges of every
    window (process start-up, the uploader starting and stopping).

Results are pooled over cycles per condition: stat and put p50/p90/p99, session request rate
(successful ops/s summed over sessions), uploader MiB/s, plus a 1 s timeline per cycle (ops,
p50 per bucket, uploader bytes per bucket) so that a stall that does not line up with upload
traffic is visible as such.

Verdict: QUALIFIED when the unpaced p50 is <= --ratio (1.2) x the idle p50 for both stat and
put, the unpaced uploader moved data, and no session operation failed in idle or unpaced.
Paced and idle-again are reported, not judged. Exit status: 0 QUALIFIED, 1 NOT QUALIFIED,
2 usage error or crash (a daemon, session or uploader process failing counts as a crash),
130 interrupted.

--smoke (scripts/probe_smoke.sh) is a run too short, on too busy a machine, to judge: the
verdict line says `verdict: (not judged: smoke run) measured ...` and the exit status is 0
whenever the run completed.

--control runs the same conditions with no uploader at all and prints `verdict: CONTROL (...)`
with the unpaced/idle ratios (exit 0 unless samples are missing or session operations failed):
what the verdict's ratios are on this machine without any upload — the sessions' own drift over
a run, which a real run's ratio includes too.

Every condition also reports how the machine's cores spent it (`machine`: busy, idle and
`steal_pct`, the share the hypervisor took, from /proc/stat over each window; the table's
`steal %`): on a shared VM, steal in one condition and not in another moves the ratios by itself,
so a difference of more than 5 points between idle and unpaced is printed as a warning (the
verdict is unchanged).

Every condition also reports where the CPU went (`cpu_cores`: the daemon, the sessions, the
uploader and the provider when the probe started it, in cores, from /proc/PID/stat at each
window's edges; and `daemon_cpu_ms_per_session_op`): with the machine saturated by the sessions,
a rise of the unpaced ratios is the CPU those other processes took, and this says whose it was.
`session_cpu_ms_per_op`, the sessions' CPU per operation, is the machine's speed: their work
per operation does not depend on the daemon, so when it differs between idle and unpaced by more
than 5 % the machine ran at a different speed (neighbours sharing caches and memory bandwidth
show here, not in steal) and a warning says so (the verdict is unchanged). The unpaced/idle
ratios divided by that change are reported too (`ratios_over_machine_speed`; not judged).

Percentiles use linear interpolation between closest ranks (numpy's default, Excel's
PERCENTILE.INC): rank = p/100 * (n - 1) over the sorted samples.

Only the Python standard library is required: timeline.png (one panel per target and cycle:
condition windows shaded, session ops/s, stat and put p50, uploader MiB/s) is drawn with zlib and
struct, so it is written on every run. `--check-png FILE` validates such a file and exits.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import math
import os
import platform
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.error
import urllib.request
import zlib
from pathlib import Path
from typing import Any, Iterable, Sequence

CONDITIONS = ("idle", "paced", "unpaced", "idle-again")
# Open loop (--session-rate) adds a window before the sessions start: the uploader alone on
# the node, the reference its speed beside the sessions is judged against in the same run.
ALONE = "alone"
ALL_CONDITIONS = (ALONE,) + CONDITIONS
UPLOAD_CONDITIONS = (ALONE, "paced", "unpaced")
SESSION_OPS = ("stat", "put")
PERCENTILES = (50, 90, 99)
PERCENTILE_METHOD = "linear interpolation between closest ranks (rank = p/100*(n-1))"
LISTENING_PREFIX = "nokv-server listening on "
MIB = 1024 * 1024

EXIT_QUALIFIED = 0
EXIT_NOT_QUALIFIED = 1
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130


# --------------------------------------------------------------------------------------------
# Pure logic: parsing, statistics, attribution, timeline, verdict. Unit-tested without
# processes (scripts/tests/test_probe.py).
# --------------------------------------------------------------------------------------------


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def parse_record(line: str) -> dict | None:
    """One bench JSON line -> normalised record, or None when the line is not a valid record.

    Valid: a JSON object with a string `op`, numeric `start` (unix seconds) and `latency_ms`
    (>= 0), and boolean `ok`. `bytes` is optional (defaults to 0) and must be a non-negative
    number when present.
    """
    line = line.strip()
    if not line:
        return None
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    op, start, lat, ok = obj.get("op"), obj.get("start"), obj.get("latency_ms"), obj.get("ok")
    if not isinstance(op, str) or not _is_number(start) or not _is_number(lat):
        return None
    if not isinstance(ok, bool) or lat < 0:
        return None
    nbytes = obj.get("bytes", 0)
    if nbytes is None:
        nbytes = 0
    if not _is_number(nbytes) or nbytes < 0:
        return None
    return {
        "op": op,
        "start": float(start),
        "latency_ms": float(lat),
        "ok": ok,
        "bytes": int(nbytes),
    }


def parse_lines(lines: Iterable[str]) -> tuple[list[dict], int]:
    """Parse bench output; returns (records, number of non-empty lines skipped as malformed)."""
    records: list[dict] = []
    skipped = 0
    for line in lines:
        rec = parse_record(line)
        if rec is None:
            if line.strip():
                skipped += 1
            continue
        records.append(rec)
    return records, skipped


def percentile(values: Sequence[float], p: float) -> float | None:
    """p-th percentile (0..100) by linear interpolation between closest ranks; None if empty."""
    if not 0 <= p <= 100:
        raise ValueError(f"percentile out of range: {p}")
    if not values:
        return None
    xs = sorted(values)
    if len(xs) == 1:
        return float(xs[0])
    rank = (p / 100.0) * (len(xs) - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, len(xs) - 1)
    frac = rank - lo
    return float(xs[lo] + (xs[hi] - xs[lo]) * frac)


def latency_stats(records: Sequence[dict]) -> dict:
    """Latency summary of successful records; failed ones are only counted."""
    ok = [r["latency_ms"] for r in records if r["ok"]]
    out: dict[str, Any] = {"n": len(ok), "errors": sum(1 for r in records if not r["ok"])}
    for p in PERCENTILES:
        out[f"p{p}_ms"] = percentile(ok, p)
    out["mean_ms"] = (sum(ok) / len(ok)) if ok else None
    out["max_ms"] = max(ok) if ok else None
    return out


@dataclasses.dataclass(frozen=True)
class Window:
    """One condition's interval in one cycle, in unix seconds."""

    cycle: int
    condition: str
    start: float
    end: float
    # The whole machine's CPU ticks over the window, from /proc/stat: (idle incl. iowait, stolen
    # by the hypervisor, total); None where /proc/stat is unavailable.
    ticks: tuple[int, int, int] | None = None
    # CPU seconds each process group spent over the window (see cpu_between): "daemon",
    # "sessions", "uploader", "provider" (moto, when the probe started it); a group the probe
    # did not start is absent. None where /proc is unavailable.
    cpu: dict[str, float] | None = None

    def inner(self, margin: float) -> tuple[float, float]:
        """The judged part of the window: both edges trimmed by `margin`."""
        return self.start + margin, self.end - margin

    def effective_seconds(self, margin: float) -> float:
        a, b = self.inner(margin)
        return max(0.0, b - a)


def machine_ticks(proc_stat: str) -> tuple[int, int, int] | None:
    """Cumulative (idle + iowait, steal, total) ticks of the aggregate `cpu` line of /proc/stat:
    user nice system idle iowait irq softirq steal [guest guest_nice]; guest time is already
    counted in user, so only the first eight fields make the total."""
    for line in proc_stat.splitlines():
        if line.startswith("cpu "):
            try:
                f = [int(x) for x in line.split()[1:9]]
            except ValueError:
                return None
            return (f[3] + f[4], f[7], sum(f)) if len(f) == 8 else None
    return None


def read_machine_ticks() -> tuple[int, int, int] | None:
    try:
        return machine_ticks(Path("/proc/stat").read_text())
    except OSError:
        return None


def ticks_between(
    a: tuple[int, int, int] | None, b: tuple[int, int, int] | None
) -> tuple[int, int, int] | None:
    if a is None or b is None:
        return None
    return (b[0] - a[0], b[1] - a[1], b[2] - a[2])


CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

# The process groups whose CPU the probe reports per condition, in table order.
CPU_GROUPS = ("daemon", "sessions", "uploader", "provider")


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of every thread of process `pid` so far, from /proc/PID/stat;
    None once the process is gone (or where /proc is unavailable)."""
    try:
        # The command name (field 2) may contain spaces and parentheses: split after its ")".
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return None


def group_cpu_seconds(groups: dict[str, list[int]]) -> dict[str, float] | None:
    """CPU seconds used so far by each group of processes (summed over its pids); None if any
    process cannot be read, so that a window never reports part of a group."""
    out = {}
    for name, pids in groups.items():
        vals = [process_cpu_seconds(pid) for pid in pids]
        if any(v is None for v in vals):
            return None
        out[name] = sum(vals)
    return out


def cpu_between(
    a: dict[str, float] | None, b: dict[str, float] | None
) -> dict[str, float] | None:
    """CPU seconds per group between two readings; a group missing from `a` started in between
    (the uploader of an upload condition), so all it used counts."""
    if a is None or b is None:
        return None
    return {name: used - a.get(name, 0.0) for name, used in b.items()}


def cpu_cores(windows: Sequence[Window]) -> dict[str, float] | None:
    """Each process group's CPU over the pooled windows, in cores (CPU seconds per second of
    the untrimmed windows): what the daemon, the sessions, the uploader and the provider took
    of the machine in that condition. None unless every window has its reading."""
    if not windows or any(w.cpu is None for w in windows):
        return None
    seconds = sum(w.end - w.start for w in windows)
    if seconds <= 0:
        return None
    groups = {name for w in windows for name in w.cpu}
    return {g: sum(w.cpu.get(g, 0.0) for w in windows) / seconds
            for g in CPU_GROUPS if g in groups}


def machine_share(ticks: Sequence[tuple[int, int, int] | None]) -> dict | None:
    """How the machine's cores spent the pooled windows: busy, idle and stolen by the
    hypervisor, in percent. Steal is time this VM wanted to run and could not: every latency of
    a window with steal is inflated by it, so a ratio between conditions with different steal
    measures the neighbours too. None unless every window has ticks."""
    if not ticks or any(t is None for t in ticks):
        return None
    idle = sum(t[0] for t in ticks)
    steal = sum(t[1] for t in ticks)
    total = sum(t[2] for t in ticks)
    if total <= 0:
        return None
    return {"busy_pct": 100.0 * (total - idle - steal) / total,
            "idle_pct": 100.0 * idle / total,
            "steal_pct": 100.0 * steal / total}


STEAL_WARN_POINTS = 5.0


def steal_warning(conditions: dict, points: float = STEAL_WARN_POINTS) -> str | None:
    """A warning when the hypervisor took a share of the machine in unpaced that differs from
    idle's by more than `points` percentage points: the judged ratio then measures the
    neighbours as well as the upload. The verdict itself is unchanged."""
    shares = {c: ((conditions.get(c) or {}).get("machine") or {}).get("steal_pct")
              for c in ("idle", "unpaced")}
    i, u = shares["idle"], shares["unpaced"]
    if i is None or u is None or abs(u - i) <= points:
        return None
    return (f"the hypervisor took {u:.1f} % of the machine's CPU time in unpaced and {i:.1f} % "
            f"in idle: the unpaced/idle ratios include that difference, not only the upload")


SPEED_WARN_PCT = 5.0


def session_speed_change(conditions: dict) -> float | None:
    """The sessions' CPU per operation in unpaced over idle's (see summarize()): how much
    slower (above 1) the machine ran their fixed work while the upload ran. None without CPU
    readings."""
    i = (conditions.get("idle") or {}).get("session_cpu_ms_per_op")
    u = (conditions.get("unpaced") or {}).get("session_cpu_ms_per_op")
    return u / i if i and u is not None else None


def speed_warning(conditions: dict, pct: float = SPEED_WARN_PCT) -> str | None:
    """A warning when the sessions' CPU per operation in unpaced differs from idle's by more
    than `pct` percent: their work per operation is the same in every condition, so the machine
    ran at a different speed for them (see summarize(): the neighbours, or the uploader's share
    of caches and memory; a `--control` run has no uploader), and the judged ratios include that
    as well as the daemon's response to the upload. The verdict itself is unchanged."""
    change = session_speed_change(conditions)
    if change is None or abs(change - 1.0) * 100.0 <= pct:
        return None
    i = conditions["idle"]["session_cpu_ms_per_op"]
    u = conditions["unpaced"]["session_cpu_ms_per_op"]
    return (f"the sessions spent {u:.3f} ms of CPU per operation in unpaced and {i:.3f} ms in "
            f"idle ({change:.2f}x) for the same work: the machine ran at a different speed for "
            "them (the neighbours, or the uploader's share of caches and memory), and the "
            "unpaced/idle ratios include that, not only the daemon's response to the upload")


def ratios_over_machine_speed(judged: dict, conditions: dict) -> dict | None:
    """The judged unpaced/idle ratios (judge()'s) of stat and put, each divided by
    session_speed_change(): the ratios with the machine's change of speed taken out. Reported
    beside the verdict, never judged: when the uploader itself slows the sessions through shared
    caches, dividing takes that share out too. None without CPU readings."""
    change = session_speed_change(conditions)
    if not change:
        return None
    return {op: (r / change if r is not None else None) for op, r in judged.items()}


def window_of(t: float, windows: Sequence[Window], margin: float) -> int | None:
    """Index of the window whose trimmed interval [start+margin, end-margin) contains t."""
    for i, w in enumerate(windows):
        a, b = w.inner(margin)
        if a <= t < b:
            return i
    return None


def attribute(
    records: Iterable[dict], windows: Sequence[Window], margin: float
) -> tuple[list[list[dict]], int]:
    """Split records by the window containing their start; returns (per-window lists, dropped)."""
    per: list[list[dict]] = [[] for _ in windows]
    dropped = 0
    for r in records:
        i = window_of(r["start"], windows, margin)
        if i is None:
            dropped += 1
        else:
            per[i].append(r)
    return per, dropped


def overlap_bytes(rec: dict, a: float, b: float) -> float:
    """Bytes of a successful upload attributed to [a, b), pro rata over its [start, end]."""
    if not rec["ok"] or b <= a:
        return 0.0
    s = rec["start"]
    e = s + rec["latency_ms"] / 1000.0
    if e <= s:
        return float(rec["bytes"]) if a <= s < b else 0.0
    ov = min(e, b) - max(s, a)
    if ov <= 0:
        return 0.0
    return rec["bytes"] * ov / (e - s)


def summarize(
    session_records: Sequence[dict],
    upload_records: Sequence[dict],
    seconds: float,
    machine: dict | None = None,
    cpu: dict[str, float] | None = None,
    block_bytes: float | None = None,
) -> dict:
    """Figures of one condition (one window, or several pooled): `session_records` are already
    attributed to it; `upload_records` are all the uploader's records that may overlap it and
    must carry `_bytes_in` (their bytes attributed to the window(s), see pool()); `cpu` is
    cpu_cores() of its windows."""
    out: dict[str, Any] = {"seconds": seconds}
    for op in SESSION_OPS:
        out[op] = latency_stats([r for r in session_records if r["op"] == op])
    ok_ops = sum(1 for r in session_records if r["ok"] and r["op"] in SESSION_OPS)
    out["session_ops"] = ok_ops
    out["session_errors"] = sum(1 for r in session_records if not r["ok"])
    out["ops_per_s"] = (ok_ops / seconds) if seconds > 0 else None
    up_bytes = sum(r.get("_bytes_in", 0.0) for r in upload_records)
    if block_bytes is not None:
        up_bytes = block_bytes
    started = [r for r in upload_records if r.get("_started_in")]
    out["upload"] = {
        "bytes": up_bytes,
        "mib_per_s": (up_bytes / MIB / seconds) if seconds > 0 else None,
        "artifacts_started": len(started),
        "errors": sum(1 for r in started if not r["ok"]),
        "latency": latency_stats(started),
    }
    out["machine"] = machine
    out["cpu_cores"] = cpu
    # The daemon's CPU per session operation: with the uploader running, what the daemon
    # spends on bulk work shows up here as a rise over idle at the same session work.
    rate = out["ops_per_s"]

    def ms_per_session_op(group: str) -> float | None:
        cores = (cpu or {}).get(group)
        return 1000.0 * cores / rate if cores is not None and rate else None

    out["daemon_cpu_ms_per_session_op"] = ms_per_session_op("daemon")
    # The sessions' CPU per operation: a session's work per operation (encoding, TLS, decoding
    # the answer) does not depend on the daemon or its store, so a change between conditions is
    # the machine running faster or slower (neighbours sharing caches and memory, which steal
    # does not show, or the uploader's use of them): the ratios' reference of machine speed.
    out["session_cpu_ms_per_op"] = ms_per_session_op("sessions")
    return out


def pool(
    windows: Sequence[Window],
    per_window: Sequence[Sequence[dict]],
    uploads: Sequence[dict],
    margin: float,
    condition: str,
    cycles: Iterable[int] | None = None,
    blocks: Sequence[dict] = (),
) -> dict:
    """Pool one condition over cycles (all cycles, or only `cycles`): session samples are
    concatenated, durations summed, uploader bytes attributed pro rata to each trimmed window.

    `blocks`: the uploader's per-block records (op `block`, `start` = when the block was
    acknowledged). When there are any, the uploader's bytes in a window are the blocks
    acknowledged in it — exact to a block, where per-artifact records of large artifacts
    only count the artifacts that finished."""
    wanted = None if cycles is None else set(cycles)
    sess: list[dict] = []
    seconds = 0.0
    ups: dict[int, dict] = {}
    mine: list[Window] = []
    for w, recs in zip(windows, per_window):
        if w.condition != condition or (wanted is not None and w.cycle not in wanted):
            continue
        sess.extend(recs)
        mine.append(w)
        seconds += w.effective_seconds(margin)
        a, b = w.inner(margin)
        for u in uploads:
            share = overlap_bytes(u, a, b)
            started = a <= u["start"] < b
            if share > 0 or started:
                entry = ups.setdefault(id(u), dict(u, _bytes_in=0.0, _started_in=False))
                entry["_bytes_in"] += share
                entry["_started_in"] = entry["_started_in"] or started
    block_bytes = None
    if blocks:
        block_bytes = float(sum(
            r["bytes"] for r in blocks for w in mine
            if r["ok"] and w.inner(margin)[0] <= r["start"] < w.inner(margin)[1]))
    return summarize(sess, list(ups.values()), seconds,
                     machine_share([w.ticks for w in mine]), cpu_cores(mine), block_bytes)


def timeline(
    session_records: Sequence[dict],
    uploads: Sequence[dict],
    windows: Sequence[Window],
    t0: float,
    t1: float,
    width: float = 1.0,
) -> list[dict]:
    """Fixed-width buckets over [t0, t1): per bucket the condition (the window containing the
    bucket's midpoint, untrimmed; None in gaps), successful session ops, errors, stat and put
    p50, max latency, and uploader bytes (pro rata) and MiB/s."""
    if width <= 0:
        raise ValueError("bucket width must be positive")
    n = max(0, math.ceil((t1 - t0) / width - 1e-9))
    buckets: list[list[dict]] = [[] for _ in range(n)]
    for r in session_records:
        i = math.floor((r["start"] - t0) / width)
        if 0 <= i < n:
            buckets[i].append(r)
    out = []
    for i in range(n):
        a = t0 + i * width
        b = a + width
        mid = a + width / 2
        cond = next((w.condition for w in windows if w.start <= mid < w.end), None)
        recs = buckets[i]
        ok = [r for r in recs if r["ok"]]
        up = sum(overlap_bytes(u, a, b) for u in uploads)
        out.append(
            {
                "t": round(i * width, 6),
                "condition": cond,
                "ops": len(ok),
                "errors": len(recs) - len(ok),
                "stat_p50_ms": percentile([r["latency_ms"] for r in ok if r["op"] == "stat"], 50),
                "put_p50_ms": percentile([r["latency_ms"] for r in ok if r["op"] == "put"], 50),
                "max_ms": max((r["latency_ms"] for r in ok), default=None),
                "upload_bytes": up,
                "upload_mib_per_s": up / MIB / width,
            }
        )
    return out


@dataclasses.dataclass
class Verdict:
    qualified: bool
    reasons: list[str]
    ratios: dict[str, float | None]
    # A --control run: no uploader ran, so the ratios are the sessions' own drift, not a verdict.
    control: bool = False

    @property
    def text(self) -> str:
        if self.qualified and self.control:
            drift = ", ".join(f"{op} {_f(r)}x" for op, r in self.ratios.items())
            return f"CONTROL (no uploader ran; unpaced p50 / idle p50 is drift alone: {drift})"
        if self.qualified:
            return "QUALIFIED"
        return "NOT QUALIFIED (" + "; ".join(self.reasons) + ")"

    def as_dict(self) -> dict:
        return {"qualified": self.qualified, "text": self.text, "reasons": self.reasons,
                "ratios": self.ratios, "control": self.control}


def judge(conditions: dict, ratio: float = 1.2, control: bool = False,
          p99_ratio: float | None = None, min_upload_share: float | None = None) -> Verdict:
    """QUALIFIED iff for stat and put the unpaced p50 <= ratio x idle p50 (idle = the first idle
    condition, pooled over cycles), the unpaced uploader moved bytes, and no session operation
    failed in idle or unpaced. Missing samples are NOT QUALIFIED with a reason.

    Open loop adds two rules: `p99_ratio` (unpaced p99 <= p99_ratio x idle p99 for stat and
    put) and `min_upload_share` (the unpaced uploader's MiB/s >= that share of its speed alone
    on the node, the `alone` window of the same run).

    `control` (no uploader ran): the ratios are reported, not judged — they are what the verdict's
    ratios would be without any upload, i.e. the drift of the sessions' own latency over a run."""
    reasons: list[str] = []
    ratios: dict[str, float | None] = {}
    idle = conditions.get("idle") or {}
    unpaced = conditions.get("unpaced") or {}
    for op in SESSION_OPS:
        i50 = (idle.get(op) or {}).get("p50_ms")
        u50 = (unpaced.get(op) or {}).get("p50_ms")
        ratios[op] = None
        if i50 is None:
            reasons.append(f"no {op} samples in idle")
            continue
        if u50 is None:
            reasons.append(f"no {op} samples in unpaced")
            continue
        ratios[op] = (u50 / i50) if i50 > 0 else (1.0 if u50 == 0 else math.inf)
        limit = ratio * i50
        if u50 > limit and not control:
            reasons.append(
                f"unpaced {op} p50 {u50:.2f} ms > {ratio:g} x idle {i50:.2f} ms = {limit:.2f} ms"
            )
    if p99_ratio is not None and not control:
        for op in SESSION_OPS:
            i99 = (idle.get(op) or {}).get("p99_ms")
            u99 = (unpaced.get(op) or {}).get("p99_ms")
            if i99 is not None and u99 is not None and u99 > p99_ratio * i99:
                reasons.append(f"unpaced {op} p99 {u99:.2f} ms > {p99_ratio:g} x idle "
                               f"{i99:.2f} ms = {p99_ratio * i99:.2f} ms")
    up = (unpaced.get("upload") or {}).get("bytes") if unpaced else None
    if unpaced and not up and not control:
        reasons.append("the uploader moved no data in unpaced")
    share = upload_share(conditions)
    if min_upload_share is not None and not control:
        if share is None:
            reasons.append("no uploader speed to compare: the alone or unpaced window is missing")
        elif share < min_upload_share:
            reasons.append(f"unpaced uploader at {100 * share:.0f} % of its speed alone "
                           f"< {100 * min_upload_share:.0f} %")
    for cond in ("idle", "unpaced"):
        errs = (conditions.get(cond) or {}).get("session_errors") or 0
        if errs:
            reasons.append(f"{errs} session operation(s) failed in {cond}")
    return Verdict(qualified=not reasons, reasons=reasons, ratios=ratios, control=control)


def upload_share(conditions: dict) -> float | None:
    """The unpaced uploader's MiB/s over its MiB/s alone on the node (same run), or None."""
    alone = ((conditions.get(ALONE) or {}).get("upload") or {}).get("mib_per_s")
    beside = ((conditions.get("unpaced") or {}).get("upload") or {}).get("mib_per_s")
    if not alone or beside is None:
        return None
    return beside / alone


def shard_of(workspace: str, shard_count: int) -> int:
    """The daemon's default placement (nokv-server/src/placement.rs): FNV-1a 64 mod count."""
    h = 0xCBF29CE484222325
    for b in workspace.encode():
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h % max(1, shard_count)


def session_workspaces(
    n: int, uploader: str, shard_count: int | None, prefix: str = "probe-s"
) -> list[str]:
    """Workspace names for n sessions. With a shard count, every name lands on the uploader's
    shard (a numeric suffix is searched); without one, plain names (spread over shards)."""
    if shard_count is None:
        return [f"{prefix}{i}" for i in range(n)]
    target = shard_of(uploader, shard_count)
    names = []
    for i in range(n):
        k = 0
        while shard_of(f"{prefix}{i}-{k}", shard_count) != target:
            k += 1
        names.append(f"{prefix}{i}-{k}")
    return names


# --------------------------------------------------------------------------------------------
# Formatting
# --------------------------------------------------------------------------------------------


def _f(v: float | None, digits: int = 2) -> str:
    if v is None:
        return "-"
    if math.isinf(v):
        return "inf"
    return f"{v:.{digits}f}"


def format_table(label: str, conditions: dict) -> list[str]:
    """Text table of one target's pooled conditions."""
    head = (
        f"{'condition':<11} {'stat p50':>9} {'p90':>8} {'p99':>8} {'put p50':>9} {'p90':>8} "
        f"{'p99':>8} {'ops/s':>8} {'errors':>6} {'upload MiB/s':>12} {'steal %':>7}"
    )
    lines = [f"[{label}] latency in ms, pooled over cycles", head, "-" * len(head)]
    for cond in ALL_CONDITIONS:
        c = conditions.get(cond)
        if not c:
            continue
        s, p = c["stat"], c["put"]
        lines.append(
            f"{cond:<11} {_f(s['p50_ms']):>9} {_f(s['p90_ms']):>8} {_f(s['p99_ms']):>8} "
            f"{_f(p['p50_ms']):>9} {_f(p['p90_ms']):>8} {_f(p['p99_ms']):>8} "
            f"{_f(c['ops_per_s'], 1):>8} {c['session_errors']:>6} "
            f"{_f(c['upload']['mib_per_s'], 1):>12} "
            f"{_f((c.get('machine') or {}).get('steal_pct'), 1):>7}"
        )
    return lines


def format_cpu(label: str, conditions: dict) -> list[str]:
    """Text table of where the machine's CPU went per condition: each process group in cores,
    the daemon's CPU per session operation, and the machine's busy share. Empty when no
    condition has a CPU reading."""
    if not any((conditions.get(c) or {}).get("cpu_cores") for c in CONDITIONS):
        return []
    head = (f"{'condition':<11} " + " ".join(f"{g:>9}" for g in CPU_GROUPS)
            + f" {'daemon ms/op':>12} {'sessions ms/op':>14} {'busy %':>7}")
    lines = [f"[{label}] CPU in cores (CPU seconds per second) by process; daemon and sessions "
             "ms per session op", head, "-" * len(head)]
    for cond in ALL_CONDITIONS:
        if cond not in conditions:
            continue
        c = conditions.get(cond) or {}
        cores = c.get("cpu_cores") or {}
        lines.append(
            f"{cond:<11} " + " ".join(f"{_f(cores.get(g)):>9}" for g in CPU_GROUPS)
            + f" {_f(c.get('daemon_cpu_ms_per_session_op'), 3):>12}"
            + f" {_f(c.get('session_cpu_ms_per_op'), 3):>14}"
            + f" {_f((c.get('machine') or {}).get('busy_pct'), 1):>7}"
        )
    return lines


def format_ratios(conditions: dict, ratio: float) -> str:
    idle = conditions.get("idle") or {}
    parts = []
    for cond in ("paced", "unpaced", "idle-again"):
        c = conditions.get(cond) or {}
        for op in SESSION_OPS:
            i50 = (idle.get(op) or {}).get("p50_ms")
            c50 = (c.get(op) or {}).get("p50_ms")
            r = (c50 / i50) if (i50 and c50 is not None) else None
            parts.append(f"{cond} {op} {_f(r)}x")
    line = f"p50 vs idle (judged: unpaced <= {ratio:g}x): " + ", ".join(parts)
    if ALONE in conditions:
        p99 = []
        for op in SESSION_OPS:
            i99 = (idle.get(op) or {}).get("p99_ms")
            u99 = ((conditions.get("unpaced") or {}).get(op) or {}).get("p99_ms")
            p99.append(f"unpaced {op} {_f(u99 / i99 if i99 and u99 is not None else None)}x")
        share = upload_share(conditions)
        line += ("\np99 vs idle: " + ", ".join(p99)
                 + f"\nunpaced uploader vs alone: {_f(share)}x"
                 + (f" ({_f(100 * share, 0)} % of its speed alone)" if share is not None else ""))
    return line


def format_over_machine_speed(adjusted: dict) -> str:
    parts = [f"{op} {_f(adjusted.get(op), 3)}x" for op in SESSION_OPS]
    return ("unpaced p50 vs idle over the sessions' CPU per op (the machine's speed; reported, "
            "not judged): " + ", ".join(parts))


def format_side_by_side(cand: dict, base: dict) -> list[str]:
    """Candidate and baseline pooled figures in adjacent columns."""
    head = f"{'condition':<11} {'metric':<13} {'candidate':>10} {'baseline':>10} {'cand/base':>10}"
    lines = ["[candidate vs baseline]", head, "-" * len(head)]
    metrics = [
        ("stat p50 ms", lambda c: c["stat"]["p50_ms"]),
        ("stat p99 ms", lambda c: c["stat"]["p99_ms"]),
        ("put p50 ms", lambda c: c["put"]["p50_ms"]),
        ("put p99 ms", lambda c: c["put"]["p99_ms"]),
        ("ops/s", lambda c: c["ops_per_s"]),
        ("upload MiB/s", lambda c: c["upload"]["mib_per_s"]),
    ]
    for cond in CONDITIONS:
        if cond not in cand or cond not in base:
            continue
        for name, get in metrics:
            if name == "upload MiB/s" and cond not in UPLOAD_CONDITIONS:
                continue
            a, b = get(cand[cond]), get(base[cond])
            r = (a / b) if (a is not None and b) else None
            lines.append(f"{cond:<11} {name:<13} {_f(a):>10} {_f(b):>10} {_f(r):>10}")
    return lines


def format_timeline(label: str, cycle_timelines: list[dict]) -> list[str]:
    lines = []
    for tl in cycle_timelines:
        lines.append(f"[{label}] timeline, cycle {tl['cycle']} (1 s buckets, t from session start)")
        lines.append(
            f"{'t':>6} {'condition':<11} {'ops':>6} {'err':>4} {'stat p50':>9} {'put p50':>9} "
            f"{'max':>9} {'upload MiB/s':>12}"
        )
        for b in tl["buckets"]:
            lines.append(
                f"{b['t']:>6.1f} {b['condition'] or '-':<11} {b['ops']:>6} {b['errors']:>4} "
                f"{_f(b['stat_p50_ms']):>9} {_f(b['put_p50_ms']):>9} {_f(b['max_ms']):>9} "
                f"{_f(b['upload_mib_per_s'], 1):>12}"
            )
    return lines


# --------------------------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------------------------


class ProbeError(Exception):
    """A crash of the measurement: a child failed, a daemon did not start, bad input."""


class Interrupted(BaseException):
    """SIGINT / SIGTERM received: unwind, stop every child, exit 130."""


def _on_signal(signum, _frame):
    raise Interrupted(signal.Signals(signum).name)


def _preexec():
    # Own process group (so a terminal Ctrl-C reaches only the probe, which stops children in
    # order), and on Linux die with the probe even if it is SIGKILLed.
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


class Children:
    """Every child process the probe started; stop_all() terminates them newest first."""

    def __init__(self) -> None:
        self.procs: list[tuple[str, subprocess.Popen]] = []

    def spawn(self, name: str, argv: list[str], env: dict, stdout, stderr) -> subprocess.Popen:
        try:
            p = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,
                preexec_fn=_preexec if sys.platform.startswith("linux") else None,
            )
        except OSError as e:
            raise ProbeError(f"cannot start {name} ({argv[0]}): {e}") from e
        self.procs.append((name, p))
        return p

    def stop(self, p: subprocess.Popen, timeout: float = 15.0) -> int:
        """SIGTERM, wait, then SIGKILL. Returns the exit status."""
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = [(n, q) for (n, q) in self.procs if q is not p]
        return p.returncode

    def stop_all(self) -> None:
        for _name, p in reversed(list(self.procs)):
            try:
                self.stop(p, timeout=10.0)
            except Exception:
                pass


def _tail(path: Path, n: int = 15) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join("    " + ln for ln in lines[-n:])


def clean_env(extra: dict | None = None) -> dict:
    """The probe's environment without NOKV_* settings (the probe passes what it means)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOKV_")}
    if extra:
        env.update(extra)
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_checked(argv: list[str], env: dict, what: str, timeout: float = 60.0) -> str:
    try:
        res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ProbeError(f"{what} failed: {e}") from e
    if res.returncode != 0:
        raise ProbeError(
            f"{what} failed (exit {res.returncode}): {shlex.join(argv)}\n{res.stderr.strip()}"
        )
    return res.stdout


@dataclasses.dataclass
class Daemon:
    label: str
    endpoint: str
    ca: str
    data_dir: str
    admin_token: str | None
    server_bin: str
    proc: subprocess.Popen | None = None
    provider: str = "local"


class Moto:
    """moto's S3 server on a free loopback port."""

    def __init__(self, children: Children, moto_bin: str, log_dir: Path) -> None:
        port = free_port()
        self.endpoint = f"http://127.0.0.1:{port}"
        log = open(log_dir / "moto.log", "wb")
        self.proc = children.spawn(
            "moto_server", [moto_bin, "-H", "127.0.0.1", "-p", str(port)], clean_env(), log, log
        )
        log.close()
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise ProbeError(
                    f"moto_server exited with {self.proc.returncode}:\n{_tail(log_dir / 'moto.log')}"
                )
            try:
                urllib.request.urlopen(self.endpoint + "/", timeout=1).read()
                break
            except urllib.error.HTTPError:
                break  # it answers
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    raise ProbeError("moto_server did not answer within 30 s")
                time.sleep(0.1)

    def create_bucket(self, bucket: str) -> None:
        req = urllib.request.Request(f"{self.endpoint}/{bucket}", method="PUT", data=b"")
        try:
            urllib.request.urlopen(req, timeout=10).read()
        except urllib.error.URLError as e:
            raise ProbeError(f"cannot create bucket {bucket} on moto: {e}") from e


def server_env(pairs: list[str]) -> dict[str, str]:
    """--server-env NAME=VALUE pairs as a dict (validate() checked their form)."""
    return dict(p.split("=", 1) for p in pairs)


def start_daemon(
    children: Children,
    label: str,
    server_bin: str,
    data_dir: Path,
    log_dir: Path,
    provider_args: list[str],
    provider: str,
    env_extra: dict,
    timeout: float,
) -> Daemon:
    argv = [server_bin, "--data-dir", str(data_dir), "--listen", "127.0.0.1:0", *provider_args]
    out_path = log_dir / f"{label}-server.stdout.log"
    err_path = log_dir / f"{label}-server.stderr.log"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = children.spawn(f"{label} nokv-server", argv, clean_env(env_extra), out, err)
    deadline = time.monotonic() + timeout
    endpoint = None
    while endpoint is None:
        try:
            text = out_path.read_text(errors="replace")
        except OSError:
            text = ""
        for line in text.splitlines():
            if line.startswith(LISTENING_PREFIX):
                endpoint = line[len(LISTENING_PREFIX):].strip()
                break
        if endpoint:
            break
        if proc.poll() is not None:
            raise ProbeError(
                f"{label} nokv-server exited with {proc.returncode} before listening:\n"
                f"{_tail(err_path)}"
            )
        if time.monotonic() > deadline:
            raise ProbeError(f"{label} nokv-server did not print its listening line in {timeout} s")
        time.sleep(0.05)
    admin = None
    client_toml = data_dir / "client.toml"
    try:
        admin = tomllib.loads(client_toml.read_text()).get("token")
    except (OSError, tomllib.TOMLDecodeError):
        pass
    return Daemon(label=label, endpoint=endpoint, ca=str(data_dir / "tls" / "ca.pem"),
                  data_dir=str(data_dir), admin_token=admin, server_bin=server_bin, proc=proc,
                  provider=provider)


def cli_env(d: Daemon, token: str) -> dict:
    return clean_env({"NOKV_ENDPOINT": d.endpoint, "NOKV_CA": d.ca, "NOKV_TOKEN": token})


def issue_token(server_bin: str, data_dir: str, workspace: str) -> str:
    out = run_checked(
        [server_bin, "token", "issue", "--data-dir", data_dir, "--workspace", workspace,
         "--role", "write", "--ttl", "1d"],
        clean_env(), f"issuing a token for {workspace}",
    )
    tok = out.strip().splitlines()[-1].strip() if out.strip() else ""
    if not tok:
        raise ProbeError(f"token issue printed nothing for {workspace}")
    return tok


def health(cli_bin: str, d: Daemon) -> dict | None:
    if not d.admin_token:
        return None
    try:
        out = run_checked([cli_bin, "--json", "admin", "health"], cli_env(d, d.admin_token),
                          "admin health", timeout=20)
        return json.loads(out)
    except (ProbeError, ValueError):
        return None


# --------------------------------------------------------------------------------------------
# Measurement
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Target:
    """One daemon under test with its workspaces, tokens and collected samples."""

    daemon: Daemon
    shard_count: int | None
    shard: int | None
    sessions: list[tuple[str, str]]  # (workspace, token)
    uploader: tuple[str, str]
    windows: list[Window] = dataclasses.field(default_factory=list)
    session_records: list[dict] = dataclasses.field(default_factory=list)
    upload_records: list[dict] = dataclasses.field(default_factory=list)
    block_records: list[dict] = dataclasses.field(default_factory=list)
    cycle_spans: list[tuple[int, float, float]] = dataclasses.field(default_factory=list)
    skipped_lines: int = 0
    warnings: list[str] = dataclasses.field(default_factory=list)
    health_before: dict | None = None
    health_after: dict | None = None
    # The provider's process when the probe started it (moto), for its CPU per condition.
    provider_pid: int | None = None


def prepare_target(args, d: Daemon, log) -> Target:
    shard_count = None
    h = health(args.cli_bin, d)
    if h and isinstance(h.get("shard_count"), int):
        shard_count = h["shard_count"]
    elif args.placement == "same-shard":
        log(f"[{d.label}] warning: admin health unavailable; assuming 16 shards for placement")
        shard_count = 16
    up_ws = args.uploader_workspace
    shard = shard_of(up_ws, shard_count) if shard_count else None
    if args.placement == "same-shard":
        names = session_workspaces(args.sessions, up_ws, shard_count)
    else:
        names = session_workspaces(args.sessions, up_ws, None)
    sessions = [(ws, issue_token(d.server_bin, d.data_dir, ws)) for ws in names]
    uploader = (up_ws, issue_token(d.server_bin, d.data_dir, up_ws))
    t = Target(daemon=d, shard_count=shard_count, shard=shard, sessions=sessions,
               uploader=uploader, health_before=h)
    return t


def _check_alive(t: Target, procs: list[tuple[str, subprocess.Popen, Path]]) -> None:
    d = t.daemon
    if d.proc is not None and d.proc.poll() is not None:
        raise ProbeError(f"[{d.label}] nokv-server exited with {d.proc.returncode} mid-run")
    for name, p, err in procs:
        if p.poll() is not None:
            raise ProbeError(
                f"[{d.label}] {name} exited early with status {p.returncode}:\n{_tail(err)}"
            )


def _sleep_watching(seconds: float, t: Target, procs) -> None:
    end = time.monotonic() + seconds
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(0.2, left))
        _check_alive(t, procs)


def _stopped_ok(t: Target, name: str, rc: int, err: Path) -> None:
    if rc == 0:
        return
    if rc == -signal.SIGTERM:
        t.warnings.append(f"{name} died by SIGTERM instead of exiting 0")
        return
    raise ProbeError(f"[{t.daemon.label}] {name} stopped with status {rc}:\n{_tail(err)}")


def _start_uploader(args, children: Children, t: Target, cdir: Path, up_files: list[Path],
                    cond: str) -> tuple[str, subprocess.Popen, Path]:
    n = len(up_files)
    outp, errp = cdir / f"upload{n}-{cond}.jsonl", cdir / f"upload{n}-{cond}.stderr.log"
    argv = [args.cli_bin, "bench", "upload", "--workspace", t.uploader[0],
            "--size-mib", str(args.upload_mib),
            "--seconds", str(int(args.seconds + 120))]
    if cond == "paced":
        argv += ["--pace", f"{args.pace:g}"]
    with open(outp, "wb") as o, open(errp, "wb") as e:
        p = children.spawn(f"uploader ({cond})", argv, cli_env(t.daemon, t.uploader[1]), o, e)
    up_files.append(outp)
    return (f"uploader ({cond})", p, errp)


def _alone_window(args, children: Children, t: Target, cycle: int, cdir: Path,
                  up_files: list[Path], log) -> None:
    """The `alone` window: the unpaced uploader with no session running, so its speed beside
    the sessions is compared with its speed on the same node in the same run."""
    groups: dict[str, list[int]] = {}
    if t.daemon.proc is not None:
        groups["daemon"] = [t.daemon.proc.pid]
    if t.provider_pid is not None:
        groups["provider"] = [t.provider_pid]
    ws_start, ticks0 = time.time(), read_machine_ticks()
    cpu0 = group_cpu_seconds(groups)
    up = _start_uploader(args, children, t, cdir, up_files, ALONE)
    _sleep_watching(args.seconds, t, [up])
    ws_end, ticks1 = time.time(), read_machine_ticks()
    cpu1 = group_cpu_seconds(groups | {"uploader": [up[1].pid]})
    rc = children.stop(up[1])
    _stopped_ok(t, up[0], rc, up[2])
    t.windows.append(Window(cycle, ALONE, ws_start, ws_end, ticks_between(ticks0, ticks1),
                            cpu_between(cpu0, cpu1)))
    log(f"[{t.daemon.label}] cycle {cycle}: {ALONE} done")


def run_cycle(args, children: Children, t: Target, cycle: int, raw: Path, log) -> None:
    label = t.daemon.label
    cdir = raw / label / f"cycle{cycle}"
    cdir.mkdir(parents=True, exist_ok=True)
    # Safety net: children stop by themselves if the probe vanishes without signalling them.
    cycle_budget = int(args.warmup + 4 * args.seconds + 120)
    procs: list[tuple[str, subprocess.Popen, Path]] = []
    files: list[Path] = []
    up_files: list[Path] = []
    t_begin = time.time()
    if args.session_rate is not None and not args.control:
        _alone_window(args, children, t, cycle, cdir, up_files, log)
    for i, (ws, tok) in enumerate(t.sessions):
        outp, errp = cdir / f"session{i}.jsonl", cdir / f"session{i}.stderr.log"
        argv = [args.cli_bin, "bench", "session", "--workspace", ws,
                "--file-size", str(args.file_size), "--seconds", str(cycle_budget)]
        if args.session_rate is not None:
            argv += ["--rate", f"{args.session_rate:g}"]
        with open(outp, "wb") as o, open(errp, "wb") as e:
            p = children.spawn(f"session {i}", argv, cli_env(t.daemon, tok), o, e)
        procs.append((f"session {i} ({ws})", p, errp))
        files.append(outp)
    log(f"[{label}] cycle {cycle}: {len(procs)} sessions started; warm-up {args.warmup:g} s")
    _sleep_watching(args.warmup, t, procs)
    groups = {"sessions": [p.pid for _, p, _ in procs]}
    if t.daemon.proc is not None:
        groups["daemon"] = [t.daemon.proc.pid]
    if t.provider_pid is not None:
        groups["provider"] = [t.provider_pid]
    for cond in CONDITIONS:
        up = None
        ws_start, ticks0 = time.time(), read_machine_ticks()
        cpu0 = group_cpu_seconds(groups)
        if cond in UPLOAD_CONDITIONS and not args.control:
            up = _start_uploader(args, children, t, cdir, up_files, cond)
        watch = procs + ([up] if up else [])
        _sleep_watching(args.seconds, t, watch)
        ws_end, ticks1 = time.time(), read_machine_ticks()
        cpu1 = group_cpu_seconds(groups | ({"uploader": [up[1].pid]} if up else {}))
        if up:
            rc = children.stop(up[1])
            _stopped_ok(t, up[0], rc, up[2])
        t.windows.append(Window(cycle, cond, ws_start, ws_end, ticks_between(ticks0, ticks1),
                                cpu_between(cpu0, cpu1)))
        log(f"[{label}] cycle {cycle}: {cond} done")
    t_end = time.time()
    for name, p, err in procs:
        rc = children.stop(p)
        _stopped_ok(t, name, rc, err)
    t.cycle_spans.append((cycle, t_begin, t_end))
    for f in files:
        recs, skipped = parse_lines(f.read_text(errors="replace").splitlines())
        t.skipped_lines += skipped
        t.session_records.extend(r for r in recs if r["op"] in SESSION_OPS)
    for f in up_files:
        recs, skipped = parse_lines(f.read_text(errors="replace").splitlines())
        t.skipped_lines += skipped
        t.upload_records.extend(r for r in recs if r["op"] == "upload")
        t.block_records.extend(r for r in recs if r["op"] == "block")


def analyse(args, t: Target) -> dict:
    per, dropped = attribute(t.session_records, t.windows, args.margin)
    present = [c for c in ALL_CONDITIONS if any(w.condition == c for w in t.windows)]
    conds = {c: pool(t.windows, per, t.upload_records, args.margin, c, blocks=t.block_records)
             for c in present}
    cycles = sorted({w.cycle for w in t.windows})
    per_cycle = [
        {"cycle": cy,
         "conditions": {c: pool(t.windows, per, t.upload_records, args.margin, c, [cy],
                                t.block_records)
                        for c in present}}
        for cy in cycles
    ]
    tls = []
    for cy, a, b in t.cycle_spans:
        ws = [w for w in t.windows if w.cycle == cy]
        sess = [r for r in t.session_records if a <= r["start"] < b]
        tls.append({"cycle": cy, "t0": a,
                    "buckets": timeline(sess, t.upload_records, ws, a, b, args.bucket)})
    open_loop = args.session_rate is not None
    v = judge(conds, args.ratio, args.control,
              p99_ratio=args.p99_ratio if open_loop else None,
              min_upload_share=args.min_upload_share if open_loop else None)
    for warning in (steal_warning(conds), speed_warning(conds)):
        if warning is not None:
            t.warnings.append(warning)
    d = t.daemon
    placement_seen = None
    if t.health_after and isinstance(t.health_after.get("shards"), list):
        before = {s.get("shard"): s.get("entries", 0)
                  for s in (t.health_before or {}).get("shards", [])}
        placement_seen = sorted(
            s.get("shard") for s in t.health_after["shards"]
            if (s.get("entries") or 0) > (before.get(s.get("shard")) or 0)
        )
    if args.placement == "same-shard" and placement_seen and placement_seen != [t.shard]:
        t.warnings.append(
            f"entries grew on shards {placement_seen}, expected only shard {t.shard}: "
            "the daemon's placement differs from the probe's"
        )
    return {
        "label": d.label,
        "server_bin": d.server_bin,
        "endpoint": d.endpoint,
        "provider": d.provider,
        "shard_count": t.shard_count,
        "placement": args.placement,
        "uploader_shard": t.shard,
        "shards_that_grew": placement_seen,
        "workspaces": {"sessions": [w for w, _ in t.sessions], "uploader": t.uploader[0]},
        "windows": [dataclasses.asdict(w) for w in t.windows],
        "samples": {"session_ops": len(t.session_records),
                    "session_ops_outside_windows": dropped,
                    "uploads": len(t.upload_records),
                    "malformed_lines_skipped": t.skipped_lines},
        "conditions": conds,
        "ratios_over_machine_speed": ratios_over_machine_speed(v.ratios, conds),
        "per_cycle": per_cycle,
        "timeline": tls,
        "verdict": v.as_dict(),
        "warnings": t.warnings,
    }


def redacted_command(argv: list[str]) -> str:
    """The command line for report.json, with the value of --admin-token hidden."""
    out, hide = [], False
    for a in argv:
        if hide:
            out.append("<redacted>")
            hide = False
        elif a == "--admin-token":
            out.append(a)
            hide = True
        elif a.startswith("--admin-token="):
            out.append("--admin-token=<redacted>")
        else:
            out.append(a)
    return shlex.join(out)


def machine_facts(args) -> dict:
    u = platform.uname()
    facts = {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": sys.version,
        "uname": {"system": u.system, "node": u.node, "release": u.release,
                  "version": u.version, "machine": u.machine},
    }
    try:
        with open("/proc/meminfo") as f:
            facts["meminfo_total"] = f.readline().strip()
    except OSError:
        pass
    for key, binary in (("server_version", args.server_bin), ("cli_version", args.cli_bin)):
        try:
            facts[key] = subprocess.run([binary, "--version"], capture_output=True, text=True,
                                        timeout=10).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            facts[key] = None
    return facts


# --------------------------------------------------------------------------------------------
# timeline.png, drawn with the standard library only (zlib + struct). One path, nothing to
# install: the picture is always written, so its absence is a bug, never a missing package.
# --------------------------------------------------------------------------------------------

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

Rgb = tuple[int, int, int]

WHITE: Rgb = (255, 255, 255)
AXIS_COLOUR: Rgb = (0, 0, 0)
TEXT_COLOUR: Rgb = (0, 0, 0)
OPS_COLOUR: Rgb = (0, 0, 0)
STAT_COLOUR: Rgb = (31, 119, 180)
PUT_COLOUR: Rgb = (214, 39, 40)
UPLOAD_COLOUR: Rgb = (150, 150, 150)
CONDITION_COLOURS: dict[str, Rgb] = {
    "alone": (235, 235, 235),
    "idle": (222, 235, 247),
    "paced": (255, 242, 204),
    "unpaced": (248, 203, 173),
    "idle-again": (226, 239, 218),
}

# A 3x5 bitmap font (rows top to bottom, '1' = ink), enough for labels and numbers. Lower
# case is drawn as upper case; anything else as '?'.
_FONT_ROWS = {
    "0": "111101101101111", "1": "010110010010111", "2": "111001111100111",
    "3": "111001111001111", "4": "101101111001001", "5": "111100111001111",
    "6": "111100111101111", "7": "111001001001001", "8": "111101111101111",
    "9": "111101111001111", "A": "010101111101101", "B": "110101110101110",
    "C": "011100100100011", "D": "110101101101110", "E": "111100110100111",
    "F": "111100110100100", "G": "011100101101011", "H": "101101111101101",
    "I": "111010010010111", "J": "001001001101010", "K": "101101110101101",
    "L": "100100100100111", "M": "101111111101101", "N": "110101101101101",
    "O": "010101101101010", "P": "110101110100100", "Q": "010101101110011",
    "R": "110101110101101", "S": "011100010001110", "T": "111010010010010",
    "U": "101101101101111", "V": "101101101101010", "W": "101101111111101",
    "X": "101101010101101", "Y": "101101010010010", "Z": "111001010100111",
    " ": "000000000000000", ".": "000000000000010", "-": "000000111000000",
    ":": "000010000010000", "/": "001001010100100", "_": "000000000000111",
    "=": "000111000111000", "(": "010100100100010", ")": "010001001001010",
    "?": "111001010000010",
}
FONT_SCALE = 2
GLYPH_ADVANCE = 4 * FONT_SCALE
GLYPH_HEIGHT = 5 * FONT_SCALE


def png_encode(width: int, height: int, rgb: bytes) -> bytes:
    """An 8-bit truecolour PNG of `rgb` (height rows of width*3 bytes, top row first): filter
    type 0 on every row, one IDAT chunk."""
    if width < 1 or height < 1 or len(rgb) != width * height * 3:
        raise ValueError(f"need {width}x{height}x3 bytes of RGB, got {len(rgb)}")
    stride = width * 3
    raw = b"".join(b"\x00" + rgb[y * stride:(y + 1) * stride] for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (PNG_SIGNATURE + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw, 9))
            + chunk(b"IEND", b""))


def png_check(data: bytes) -> tuple[int, int]:
    """(width, height) of an 8-bit RGB PNG as png_encode writes it; ValueError naming the
    first problem otherwise: signature, chunk lengths and CRCs, IHDR first and IEND last, and
    the IDAT stream inflating to exactly height*(1+width*3) bytes."""
    if not data.startswith(PNG_SIGNATURE):
        raise ValueError("not a PNG: bad signature")
    pos, chunks = len(PNG_SIGNATURE), []
    while pos < len(data):
        if pos + 8 > len(data):
            raise ValueError(f"truncated chunk header at byte {pos}")
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        if len(body) != length or pos + 12 + length > len(data):
            raise ValueError(f"truncated {kind!r} chunk at byte {pos}")
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        if zlib.crc32(kind + body) & 0xFFFFFFFF != crc:
            raise ValueError(f"bad CRC in {kind!r} chunk at byte {pos}")
        chunks.append((kind, body))
        pos += 12 + length
    if not chunks or chunks[0][0] != b"IHDR" or len(chunks[0][1]) != 13:
        raise ValueError("first chunk is not a 13-byte IHDR")
    if chunks[-1][0] != b"IEND":
        raise ValueError("last chunk is not IEND")
    width, height, depth, colour, comp, filt, interlace = struct.unpack(">IIBBBBB",
                                                                        chunks[0][1])
    if width < 1 or height < 1:
        raise ValueError(f"empty image {width}x{height}")
    if (depth, colour, comp, filt, interlace) != (8, 2, 0, 0, 0):
        raise ValueError("not 8-bit RGB, non-interlaced")
    try:
        raw = zlib.decompress(b"".join(body for kind, body in chunks if kind == b"IDAT"))
    except zlib.error as e:
        raise ValueError(f"IDAT does not inflate: {e}") from None
    if len(raw) != height * (1 + width * 3):
        raise ValueError(f"IDAT inflates to {len(raw)} bytes, want {height * (1 + width * 3)}")
    return width, height


class Raster:
    """An RGB canvas, origin top left; drawing outside the canvas is clipped silently."""

    def __init__(self, width: int, height: int, background: Rgb = WHITE):
        self.width, self.height = width, height
        self.pixels = bytearray(bytes(background) * (width * height))

    def get(self, x: int, y: int) -> Rgb:
        i = (y * self.width + x) * 3
        return (self.pixels[i], self.pixels[i + 1], self.pixels[i + 2])

    def set(self, x: int, y: int, c: Rgb) -> None:
        if 0 <= x < self.width and 0 <= y < self.height:
            i = (y * self.width + x) * 3
            self.pixels[i:i + 3] = bytes(c)

    def fill(self, x0: int, y0: int, x1: int, y1: int, c: Rgb) -> None:
        """Fill the rectangle [x0, x1) x [y0, y1)."""
        x0, x1 = max(0, min(x0, x1)), min(self.width, max(x0, x1))
        y0, y1 = max(0, min(y0, y1)), min(self.height, max(y0, y1))
        if x0 >= x1:
            return
        row = bytes(c) * (x1 - x0)
        for y in range(y0, y1):
            i = (y * self.width + x0) * 3
            self.pixels[i:i + len(row)] = row

    def line(self, x0: int, y0: int, x1: int, y1: int, c: Rgb, thick: int = 1) -> None:
        """Bresenham, each point drawn as a thick x thick square (so a line of slope 0 covers
        rows y..y+thick-1)."""
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        err = dx + dy
        while True:
            self.fill(x0, y0, x0 + thick, y0 + thick, c)
            if x0 == x1 and y0 == y1:
                return
            e2 = 2 * err
            if e2 >= dy:
                err += dy
                x0 += sx
            if e2 <= dx:
                err += dx
                y0 += sy

    def text(self, x: int, y: int, s: str, c: Rgb = TEXT_COLOUR) -> int:
        """Draw `s` with its top left at (x, y); returns the x after the last glyph."""
        for ch in s.upper():
            rows = _FONT_ROWS.get(ch, _FONT_ROWS["?"])
            for k, bit in enumerate(rows):
                if bit == "1":
                    gx, gy = x + (k % 3) * FONT_SCALE, y + (k // 3) * FONT_SCALE
                    self.fill(gx, gy, gx + FONT_SCALE, gy + FONT_SCALE, c)
            x += GLYPH_ADVANCE
        return x

    def png(self) -> bytes:
        return png_encode(self.width, self.height, bytes(self.pixels))


PNG_WIDTH = 960
PANEL_HEIGHT = 220
# Margins wide enough for the axis titles and the unit-bearing labels of the right axis.
PLOT_LEFT, PLOT_RIGHT = 72, PNG_WIDTH - 104
PLOT_TOP, PLOT_BOTTOM = 44, PANEL_HEIGHT - 28  # relative to the panel's top


def _nice_max(v: float) -> float:
    """The smallest 1/2/5 x 10^k at or above v (an axis top that reads well); 1 for nothing."""
    if not v or v <= 0 or not math.isfinite(v):
        return 1.0
    k = 10 ** math.floor(math.log10(v))
    return next(m * k for m in (1, 2, 5, 10) if m * k >= v)


def _num(v: float) -> str:
    return f"{v:g}" if v < 10000 else f"{v:.0f}"


def _decade_floor(v: float) -> float:
    return 10.0 ** math.floor(math.log10(v))


def _decade_ceil(v: float) -> float:
    return 10.0 ** math.ceil(math.log10(v))


@dataclasses.dataclass
class Scales:
    """The value scales every panel of one picture shares, so panels compare at a glance:
    latency on a log scale from `latency_min` to `latency_max` (whole decades: a stat p50 of
    0.2 ms and a put p50 of 50 ms are both readable), session ops/s and uploader MiB/s each
    linear from 0 to a 1/2/5 top."""

    latency_min: float
    latency_max: float
    ops_max: float
    upload_max: float


def shared_scales(rows: Sequence[dict]) -> Scales:
    """The scales of panels whose timelines are `rows` (each {"buckets": [...]})."""
    lat = [v for tl in rows for b in tl["buckets"]
           for v in (b["stat_p50_ms"], b["put_p50_ms"]) if v is not None and v > 0]
    lo = _decade_floor(min(lat)) if lat else 1.0
    hi = _decade_ceil(max(lat)) if lat else 10.0
    if hi <= lo:
        hi = lo * 10
    ops = [b["ops"] / _bucket_width(tl["buckets"]) for tl in rows for b in tl["buckets"]]
    up = [b["upload_mib_per_s"] for tl in rows for b in tl["buckets"]]
    return Scales(lo, hi, _nice_max(max(ops, default=0.0)), _nice_max(max(up, default=0.0)))


@dataclasses.dataclass
class TimelinePlot:
    """Geometry of one panel (one target and cycle): maps seconds from the cycle start and
    values to pixels. Latency (stat, put p50) uses the left axis, on a log scale; session
    ops/s and uploader MiB/s each have their own linear scale from 0 on the right axis (its
    top is labelled with both, MiB/s in the bars' colour), since ops/s are often ten times the
    MiB/s. Every panel of a picture has the same scales (see `Scales`)."""

    top: int
    span: float
    latency_max: float
    ops_max: float
    upload_max: float
    latency_min: float = 1.0

    def x(self, t: float) -> int:
        return PLOT_LEFT + round(t / self.span * (PLOT_RIGHT - PLOT_LEFT))

    def _y(self, v: float, vmax: float) -> int:
        return self.top + PLOT_BOTTOM - round(min(v, vmax) / vmax * (PLOT_BOTTOM - PLOT_TOP))

    def y_latency(self, ms: float) -> int:
        """Log scale: latency_min at the bottom, latency_max at the top, clamped."""
        lo, hi = math.log10(self.latency_min), math.log10(self.latency_max)
        v = min(max(math.log10(ms) if ms > 0 else lo, lo), hi)
        return self.top + PLOT_BOTTOM - round((v - lo) / (hi - lo) * (PLOT_BOTTOM - PLOT_TOP))

    def y_ops(self, ops_per_s: float) -> int:
        return self._y(ops_per_s, self.ops_max)

    def y_upload(self, mib_per_s: float) -> int:
        return self._y(mib_per_s, self.upload_max)


def _bucket_width(buckets: Sequence[dict]) -> float:
    return (buckets[1]["t"] - buckets[0]["t"]) if len(buckets) > 1 else 1.0


def _draw_panel(r: Raster, top: int, label: str, tl: dict, windows: Sequence[dict],
                scales: Scales | None = None) -> TimelinePlot:
    buckets, t0 = tl["buckets"], tl["t0"]
    width = _bucket_width(buckets)
    mine = [w for w in windows if w["cycle"] == tl["cycle"]]
    span = max([len(buckets) * width] + [w["end"] - t0 for w in mine]) or 1.0
    scales = scales or shared_scales([tl])
    plot = TimelinePlot(top, span, scales.latency_max, scales.ops_max, scales.upload_max,
                        scales.latency_min)
    y_top, y_bottom = top + PLOT_TOP, top + PLOT_BOTTOM

    # Title and legend.
    x = r.text(8, top + 6, f"{label} cycle {tl['cycle']}")
    for name, colour in (("ops/s", OPS_COLOUR), ("stat p50 ms", STAT_COLOUR),
                         ("put p50 ms", PUT_COLOUR), ("upload MiB/s", UPLOAD_COLOUR)):
        x += 24
        r.fill(x, top + 6, x + GLYPH_HEIGHT, top + 6 + GLYPH_HEIGHT, colour)
        x = r.text(x + GLYPH_HEIGHT + 4, top + 6, name)

    # Condition windows, shaded and named.
    for w in mine:
        xa, xb = plot.x(max(0.0, w["start"] - t0)), plot.x(min(span, w["end"] - t0))
        r.fill(xa, y_top, xb, y_bottom, CONDITION_COLOURS.get(w["condition"], WHITE))
        name = w["condition"]
        if len(name) * GLYPH_ADVANCE < xb - xa:
            r.text((xa + xb - len(name) * GLYPH_ADVANCE) // 2, y_top - GLYPH_HEIGHT - 4, name)

    # Uploader MiB/s as bars, then the lines on top.
    for b in buckets:
        if b["upload_mib_per_s"] > 0:
            r.fill(plot.x(b["t"]) + 1, plot.y_upload(b["upload_mib_per_s"]),
                   plot.x(b["t"] + width) - 1, y_bottom, UPLOAD_COLOUR)
    series = (
        (OPS_COLOUR, plot.y_ops, lambda b: b["ops"] / width),
        (STAT_COLOUR, plot.y_latency, lambda b: b["stat_p50_ms"]),
        (PUT_COLOUR, plot.y_latency, lambda b: b["put_p50_ms"]),
    )
    for colour, y_of, value in series:
        prev = None
        for b in buckets:
            v = value(b)
            if v is None:  # no sample in this bucket: break the line rather than invent one
                prev = None
                continue
            pt = (plot.x(b["t"] + width / 2), y_of(v))
            if prev is None:
                r.fill(pt[0] - 1, pt[1] - 1, pt[0] + 2, pt[1] + 2, colour)
            else:
                r.line(prev[0], prev[1], pt[0], pt[1], colour, thick=2)
            prev = pt

    # Axes: left latency (log), right rates, bottom seconds; each with its title and unit.
    r.fill(PLOT_LEFT - 1, y_top, PLOT_LEFT, y_bottom + 1, AXIS_COLOUR)
    r.fill(PLOT_RIGHT, y_top, PLOT_RIGHT + 1, y_bottom + 1, AXIS_COLOUR)
    r.fill(PLOT_LEFT - 1, y_bottom, PLOT_RIGHT + 1, y_bottom + 1, AXIS_COLOUR)
    title_y = y_top - GLYPH_HEIGHT - 4
    r.text(4, title_y, LATENCY_AXIS_TITLE)
    for y, tick in latency_ticks(plot):
        r.fill(PLOT_LEFT - (6 if tick else 3), y, PLOT_LEFT - 1, y + 1, AXIS_COLOUR)
        if tick:
            r.text(PLOT_LEFT - 8 - len(tick) * GLYPH_ADVANCE,
                   min(max(y - GLYPH_HEIGHT // 2, y_top), y_bottom - GLYPH_HEIGHT), tick)
    for k in range(5):  # quarters of both rate scales
        y = plot.y_ops(plot.ops_max * k / 4)
        r.fill(PLOT_RIGHT + 1, y, PLOT_RIGHT + 6, y + 1, AXIS_COLOUR)
    r.text(PLOT_RIGHT + 8, y_top, f"{_num(plot.ops_max)} {OPS_UNIT}", OPS_COLOUR)
    r.text(PLOT_RIGHT + 8, y_top + GLYPH_HEIGHT + 4, f"{_num(plot.upload_max)} {UPLOAD_UNIT}",
           UPLOAD_COLOUR)
    r.text(PLOT_RIGHT + 8, y_bottom - GLYPH_HEIGHT, "0")
    step = _nice_max(span / 10)
    t = 0.0
    while t <= span + 1e-9:
        xt = plot.x(t)
        r.fill(xt, y_bottom, xt + 1, y_bottom + 4, AXIS_COLOUR)
        s = _num(round(t, 6))
        r.text(xt - len(s) * GLYPH_ADVANCE // 2, y_bottom + 6, s)
        t += step
    # Right-aligned, clear of the last tick's label.
    r.text(PNG_WIDTH - 4 - len(TIME_AXIS_TITLE) * GLYPH_ADVANCE, y_bottom + 6, TIME_AXIS_TITLE)
    return plot


LATENCY_AXIS_TITLE = "ms (log)"
TIME_AXIS_TITLE = "time (s)"
OPS_UNIT = "ops/s"
UPLOAD_UNIT = "MiB/s"


def latency_ticks(plot: TimelinePlot) -> list[tuple[int, str]]:
    """The left axis' ticks: (y, label) at every decade (labelled) and at 2 and 5 times it
    (unlabelled, label "")."""
    out = []
    decade = plot.latency_min
    while decade <= plot.latency_max * (1 + 1e-9):
        out.append((plot.y_latency(decade), _num(decade)))
        for m in (2, 5):
            if decade * m < plot.latency_max:
                out.append((plot.y_latency(decade * m), ""))
        decade *= 10
    return out


def render_timeline(results: Sequence[dict]) -> tuple[Raster, list[TimelinePlot]]:
    """The timeline picture: one panel per target and cycle, top to bottom in report order;
    also each panel's geometry (for tests and for anyone placing marks on it)."""
    rows = [(r["label"], tl, r["windows"]) for r in results for tl in r["timeline"]]
    if not rows:
        r = Raster(PNG_WIDTH, PANEL_HEIGHT)
        r.text(8, 6, "no timeline data")
        return r, []
    r = Raster(PNG_WIDTH, PANEL_HEIGHT * len(rows))
    scales = shared_scales([tl for _, tl, _ in rows])
    plots = [_draw_panel(r, i * PANEL_HEIGHT, label, tl, windows, scales)
             for i, (label, tl, windows) in enumerate(rows)]
    return r, plots


def write_png(path: Path, results: Sequence[dict]) -> None:
    """Write timeline.png (always: the standard library draws it)."""
    path.write_bytes(render_timeline(results)[0].png())


def check_png_file(path: str) -> int:
    """`--check-png FILE`: 0 and a line naming the size when FILE is a valid PNG as the probe
    writes it, EXIT_ERROR and the reason otherwise (the smoke run's check of timeline.png)."""
    try:
        w, h = png_check(Path(path).read_bytes())
    except (OSError, ValueError) as e:
        print(f"{path}: not a valid PNG: {e}", file=sys.stderr)
        return EXIT_ERROR
    print(f"{path}: valid PNG, {w}x{h}")
    return 0


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Measure interactive session latency on a nokv shard beside an "
        "owner-mediated uploader (idle, paced, unpaced, idle-again).",
        epilog="Exit status: 0 QUALIFIED (or any completed --smoke run), 1 NOT QUALIFIED, "
        "2 usage error or crash, 130 interrupted.",
    )
    p.add_argument("--sessions", type=int, default=None,
                   help="session processes (default 8; 32 with --open-loop)")
    p.add_argument("--session-rate", type=float, default=None, metavar="R",
                   help="open loop: each session starts a stat/put pair R times per second on "
                   "average, with jittered think time, instead of back to back (default: closed "
                   "loop). Adds an `alone` window (the uploader with no session running) before "
                   "each cycle and judges p99 and the uploader's share of its speed alone too")
    p.add_argument("--open-loop", action="store_true",
                   help="the agents' regime: 32 sessions x 10 pairs/s beside 256 MiB artifacts, "
                   "judged at p50 <= 1.1x, p99 <= 1.5x and uploader >= 50 %% of alone (each "
                   "can be overridden by its own flag)")
    p.add_argument("--p99-ratio", type=float, default=1.5,
                   help="open loop: verdict limit unpaced p99 <= RATIO x idle p99 (default 1.5)")
    p.add_argument("--min-upload-share", type=float, default=0.5,
                   help="open loop: verdict limit unpaced uploader MiB/s >= SHARE x alone "
                   "(default 0.5)")
    p.add_argument("--seconds", type=float, default=40.0,
                   help="seconds per condition (default 40)")
    p.add_argument("--cycles", type=int, default=2, help="cycles of the 4 conditions (default 2)")
    p.add_argument("--pace", type=float, default=8.0,
                   help="uploader MiB/s in the paced condition (default 8)")
    p.add_argument("--upload-mib", type=int, default=None,
                   help="artifact size in MiB (default 16; 256 with --open-loop)")
    p.add_argument("--file-size", type=int, default=4096,
                   help="session write size in bytes (default 4096)")
    p.add_argument("--server-bin", default="target/release/nokv-server")
    p.add_argument("--cli-bin", default="target/release/nokv")
    p.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for every nokv-server the probe starts (repeatable), "
                        "e.g. --server-arg=--bulk-mib-per-s=48")
    p.add_argument("--server-env", action="append", default=[], metavar="NAME=VALUE",
                   help="environment variable for every nokv-server the probe starts "
                   "(repeatable; the probe passes no NOKV_* variable of its own environment)")
    p.add_argument("--baseline-server", metavar="BIN",
                   help="also run every cycle against this nokv-server (interleaved)")
    p.add_argument("--provider", choices=("local", "s3"), default="local")
    p.add_argument("--s3-endpoint", help="existing S3 endpoint (default: start moto_server)")
    p.add_argument("--s3-bucket", help="bucket at --s3-endpoint (required with it)")
    p.add_argument("--moto-bin", default="moto_server")
    p.add_argument("--endpoint", help="use a running daemon at this URL instead of starting one")
    p.add_argument("--ca", help="CA PEM of the running daemon (with --endpoint)")
    p.add_argument("--data-dir",
                   help="data dir of the running daemon (with --endpoint; tokens are issued "
                   "from its cluster secret)")
    p.add_argument("--admin-token",
                   help="admin token of the running daemon (default: DATA_DIR/client.toml); "
                   "used only to read the shard count")
    p.add_argument("--placement", choices=("same-shard", "spread"), default="same-shard",
                   help="same-shard (default): every session workspace is chosen to hash to "
                   "the uploader's shard; spread: plain names")
    p.add_argument("--uploader-workspace", default="probe-up")
    p.add_argument("--ratio", type=float, default=None,
                   help="verdict limit: unpaced p50 <= RATIO x idle p50 (default 1.2; 1.1 with "
                   "--open-loop)")
    p.add_argument("--smoke", action="store_true",
                   help="a smoke run (scripts/probe_smoke.sh): the verdict is computed and "
                   "reported but not judged — its line says `(not judged ...)` and the exit "
                   "status is 0 whenever the run completed")
    p.add_argument("--control", action="store_true",
                   help="run no uploader at all (paced and unpaced are then idle too): prints "
                   "`verdict: CONTROL (...)` with the unpaced/idle p50 ratios, i.e. how much the "
                   "sessions' own latency drifts over a run on this machine, the noise floor of "
                   "the verdict")
    p.add_argument("--margin", type=float, default=0.5,
                   help="seconds dropped at each edge of every condition window (default 0.5)")
    p.add_argument("--warmup", type=float, default=1.0,
                   help="seconds the sessions run before the first window (default 1)")
    p.add_argument("--bucket", type=float, default=1.0, help="timeline bucket seconds (default 1)")
    p.add_argument("--startup-timeout", type=float, default=30.0)
    p.add_argument("--out", help="output directory (default: probe-out/<timestamp>/)")
    p.add_argument("--keep-data", action="store_true",
                   help="keep the temporary daemon data directories")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--check-png", metavar="FILE",
                   help="only check that FILE is a valid PNG as the probe writes timeline.png "
                   "(exit 0 valid, 2 not); runs nothing")
    return p


def apply_presets(a: argparse.Namespace) -> None:
    """Fills the defaults that depend on --open-loop (flags given explicitly win)."""
    if a.open_loop and a.session_rate is None:
        a.session_rate = 10.0
    for name, closed, opened in (("sessions", 8, 32), ("upload_mib", 16, 256),
                                 ("ratio", 1.2, 1.1)):
        if getattr(a, name) is None:
            setattr(a, name, opened if a.open_loop else closed)


def validate(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    apply_presets(a)
    if a.session_rate is not None and not (a.session_rate > 0 and math.isfinite(a.session_rate)):
        p.error("--session-rate must be a positive number of pairs per second")
    if any("=" not in e or e.startswith("=") for e in a.server_env):
        p.error("--server-env takes NAME=VALUE")
    if a.p99_ratio <= 0 or not 0 <= a.min_upload_share <= 1:
        p.error("--p99-ratio must be positive and --min-upload-share within 0..1")
    if a.sessions < 1 or a.cycles < 1:
        p.error("--sessions and --cycles must be at least 1")
    if a.seconds <= 2 * a.margin:
        p.error(f"--seconds must exceed twice --margin ({2 * a.margin:g} s)")
    if a.pace <= 0 or a.upload_mib < 1 or a.file_size < 0 or a.bucket <= 0 or a.ratio <= 0:
        p.error("--pace, --upload-mib, --bucket and --ratio must be positive")
    if a.margin < 0 or a.warmup < 0:
        p.error("--margin and --warmup must not be negative")
    if a.endpoint:
        if not a.ca or not a.data_dir:
            p.error("--endpoint needs --ca and --data-dir (tokens are issued from its secret)")
    elif a.ca or a.data_dir or a.admin_token:
        p.error("--ca, --data-dir and --admin-token only apply with --endpoint")
    if a.s3_endpoint and not a.s3_bucket:
        p.error("--s3-endpoint needs --s3-bucket")
    if (a.s3_endpoint or a.s3_bucket) and a.provider != "s3":
        p.error("--s3-endpoint / --s3-bucket need --provider s3")
    for flag, path in (("--server-bin", a.server_bin), ("--cli-bin", a.cli_bin),
                       ("--baseline-server", a.baseline_server)):
        if path and not (os.path.isfile(path) and os.access(path, os.X_OK)):
            p.error(f"{flag} {path}: not an executable file (the probe builds nothing)")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.check_png:
        return check_png_file(args.check_png)
    validate(parser, args)
    log = (lambda _m: None) if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))

    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(args.out) if args.out else Path("probe-out") / stamp
    try:
        out.mkdir(parents=True, exist_ok=bool(args.out))
    except OSError as e:
        print(f"probe error: cannot create {out}: {e}", file=sys.stderr)
        return EXIT_ERROR
    raw = out / "raw"
    raw.mkdir(exist_ok=True)

    children = Children()
    temps: list[Path] = []
    old = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return _run(args, children, temps, out, raw, log)
    except Interrupted as e:
        print(f"probe interrupted ({e}); stopping children", file=sys.stderr)
        return EXIT_INTERRUPTED
    except ProbeError as e:
        print(f"probe error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as e:  # a bug in the probe is a crash too, with its traceback
        import traceback

        traceback.print_exc()
        print(f"probe error: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        # Ignore further signals while cleaning up, then restore the handlers.
        for s in old:
            signal.signal(s, signal.SIG_IGN)
        children.stop_all()
        if not args.keep_data:
            for d in temps:
                shutil.rmtree(d, ignore_errors=True)
        elif temps:
            print("kept data dirs: " + " ".join(map(str, temps)), file=sys.stderr)
        for s, h in old.items():
            signal.signal(s, h)


def _run(args, children: Children, temps: list[Path], out: Path, raw: Path, log) -> int:
    # The CLI must have the bench subcommand (the probe builds nothing).
    res = subprocess.run([args.cli_bin, "bench", "--help"], capture_output=True, text=True,
                         env=clean_env(), timeout=30)
    if res.returncode != 0:
        raise ProbeError(f"{args.cli_bin} has no working `bench` subcommand:\n{res.stderr.strip()}")

    env_extra: dict[str, str] = {}
    run_id = f"{os.getpid()}-{int(time.time())}"
    started_utc = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    s3_endpoint: str | None = None
    moto = None
    buckets: dict[str, str] = {}
    if args.provider == "s3":
        env_extra = {"AWS_ACCESS_KEY_ID": os.environ.get("AWS_ACCESS_KEY_ID", "test"),
                     "AWS_SECRET_ACCESS_KEY": os.environ.get("AWS_SECRET_ACCESS_KEY", "test")}
        if args.s3_endpoint:
            s3_endpoint = args.s3_endpoint
            buckets = {"candidate": args.s3_bucket, "baseline": args.s3_bucket}
        else:
            moto = Moto(children, args.moto_bin, out)
            s3_endpoint = moto.endpoint
            buckets = {"candidate": "nokv-probe", "baseline": "nokv-probe-baseline"}
            for b in set(buckets.values()):
                moto.create_bucket(b)
            log(f"moto_server at {s3_endpoint}")

    def provider_for(label: str) -> list[str]:
        if args.provider == "local":
            return ["--provider", "local"]
        return ["--provider", "s3", "--s3-endpoint", s3_endpoint, "--s3-bucket", buckets[label],
                "--s3-prefix", f"nokv-probe-{label}-{run_id}"]

    daemons: list[Daemon] = []
    if args.endpoint:
        admin = args.admin_token
        if not admin:
            try:
                admin = tomllib.loads((Path(args.data_dir) / "client.toml").read_text()).get(
                    "token")
            except (OSError, tomllib.TOMLDecodeError):
                admin = None
        daemons.append(Daemon("candidate", args.endpoint, args.ca, args.data_dir, admin,
                              args.server_bin, None, provider="external"))
    targets_to_start = [] if args.endpoint else [("candidate", args.server_bin)]
    if args.baseline_server:
        targets_to_start.append(("baseline", args.baseline_server))
    for label, binary in targets_to_start:
        dd = Path(tempfile.mkdtemp(prefix=f"nokv-probe-{label}-"))
        temps.append(dd)
        d = start_daemon(children, label, binary, dd, out,
                         provider_for(label) + list(args.server_arg), args.provider,
                         env_extra | server_env(args.server_env), args.startup_timeout)
        log(f"[{label}] {binary} listening on {d.endpoint} (data {dd})")
        daemons.append(d)

    targets = [prepare_target(args, d, log) for d in daemons]
    for t in targets:
        t.provider_pid = moto.proc.pid if moto else None
        log(f"[{t.daemon.label}] shards {t.shard_count}, uploader {t.uploader[0]} on shard "
            f"{t.shard}, sessions {[w for w, _ in t.sessions]}")

    for cycle in range(args.cycles):
        # Alternate the order each cycle so drift over the run does not favour one binary.
        order = targets if cycle % 2 == 0 else list(reversed(targets))
        for t in order:
            run_cycle(args, children, t, cycle, raw, log)

    results = []
    for t in targets:
        t.health_after = health(args.cli_bin, t.daemon)
        results.append(analyse(args, t))

    # Text report.
    lines: list[str] = []
    lines.append(
        f"owner-upload interference probe: sessions {args.sessions}"
        + (f" open loop at {args.session_rate:g} pairs/s each" if args.session_rate else
           " closed loop")
        + f", {args.seconds:g} s per "
        f"condition, {args.cycles} cycle(s), provider {args.provider}, paced {args.pace:g} MiB/s, "
        f"artifacts {args.upload_mib} MiB, margin {args.margin:g} s"
    )
    lines.append(f"percentiles: {PERCENTILE_METHOD}")
    for r in results:
        lines.append("")
        lines.append(f"{r['label']}: {r['server_bin']} ({r['endpoint']}); placement "
                     f"{r['placement']}, uploader shard {r['uploader_shard']} of "
                     f"{r['shard_count']}")
        lines.extend(format_table(r["label"], r["conditions"]))
        lines.extend(format_cpu(r["label"], r["conditions"]))
        lines.append(format_ratios(r["conditions"], args.ratio))
        if (adjusted := r.get("ratios_over_machine_speed")) is not None:
            lines.append(format_over_machine_speed(adjusted))
        for w in r["warnings"]:
            lines.append(f"warning: {w}")
    by = {r["label"]: r for r in results}
    if "baseline" in by:
        lines.append("")
        lines.extend(format_side_by_side(by["candidate"]["conditions"],
                                         by["baseline"]["conditions"]))
    lines.append("")
    if "baseline" in by:
        lines.append(f"baseline verdict: {by['baseline']['verdict']['text']}")
    lines.append(verdict_line(by["candidate"]["verdict"], args.smoke))
    summary = "\n".join(lines)
    timeline_text = "\n".join(
        ln for r in results for ln in [""] + format_timeline(r["label"], r["timeline"])
    )
    (out / "report.txt").write_text(summary + "\n" + timeline_text + "\n")

    report = {
        "command": redacted_command([sys.executable, *sys.argv]),
        "args": {k: ("<redacted>" if k == "admin_token" and v else v)
                 for k, v in vars(args).items()},
        "started_utc": started_utc,
        "machine": machine_facts(args),
        "percentile_method": PERCENTILE_METHOD,
        "conditions_order": [c for c in ALL_CONDITIONS
                             if c in by["candidate"]["conditions"]],
        "verdict_rule": (
            "control run: no uploader; the unpaced/idle ratios are reported, not judged"
            if args.control else
            f"unpaced p50 <= {args.ratio:g} x idle p50 for stat and put; "
            "the unpaced uploader moved data; no failed session op in idle/unpaced"
            + (f"; open loop ({args.session_rate:g} pairs/s per session): unpaced p99 <= "
               f"{args.p99_ratio:g} x idle p99, uploader >= {args.min_upload_share:g} x alone"
               if args.session_rate is not None else "")),
        "s3_endpoint": s3_endpoint,
        "targets": by,
        "verdict": by["candidate"]["verdict"],
    }
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    write_png(out / "timeline.png", results)

    print(summary.rsplit("\n", 1)[0])
    print(f"report: {out / 'report.txt'}, {out / 'report.json'}, {out / 'timeline.png'}")
    print(summary.rsplit("\n", 1)[1], flush=True)
    if args.smoke:
        return EXIT_QUALIFIED
    return EXIT_QUALIFIED if by["candidate"]["verdict"]["qualified"] else EXIT_NOT_QUALIFIED


SMOKE_NOT_JUDGED = ("(not judged: smoke run, too short and on too busy a machine for a "
                    "verdict) measured")


def verdict_line(verdict: dict, smoke: bool) -> str:
    """The last line the probe prints: `verdict: QUALIFIED` / `verdict: NOT QUALIFIED (...)`,
    or in a smoke run, which judges nothing, `verdict: (not judged: ...) measured ...`."""
    if smoke:
        return f"verdict: {SMOKE_NOT_JUDGED} {verdict['text']}"
    return f"verdict: {verdict['text']}"


if __name__ == "__main__":
    sys.exit(main())
