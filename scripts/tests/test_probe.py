"""Unit tests of the interference probe's pure logic (no processes are started).

Run: python3 -m unittest discover -s scripts/tests -v
"""

import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import time
import unittest
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import owner_upload_interference_probe as probe  # noqa: E402

MIB = 1024 * 1024


def rec(op, start, latency_ms, ok=True, nbytes=0):
    return {"op": op, "start": float(start), "latency_ms": float(latency_ms), "ok": ok,
            "bytes": nbytes}


def cond(stat_p50, put_p50, errors=0, upload_bytes=0.0):
    """A pooled-condition dict shaped like summarize()'s output, for judge()."""
    return {
        "stat": {"p50_ms": stat_p50},
        "put": {"p50_ms": put_p50},
        "session_errors": errors,
        "upload": {"bytes": upload_bytes},
    }


class PercentileTest(unittest.TestCase):
    def test_empty_is_none(self):
        self.assertIsNone(probe.percentile([], 50))

    def test_single_value(self):
        for p in (0, 50, 99, 100):
            self.assertEqual(probe.percentile([7.5], p), 7.5)

    def test_linear_interpolation(self):
        xs = [1, 2, 3, 4]
        self.assertEqual(probe.percentile(xs, 0), 1)
        self.assertEqual(probe.percentile(xs, 100), 4)
        self.assertAlmostEqual(probe.percentile(xs, 50), 2.5)  # rank 1.5
        self.assertAlmostEqual(probe.percentile(xs, 90), 3.7)  # rank 2.7

    def test_unsorted_input_and_odd_median(self):
        self.assertEqual(probe.percentile([5, 1, 3], 50), 3)
        self.assertAlmostEqual(probe.percentile(list(range(1, 101)), 99), 99.01)

    def test_matches_statistics_quantiles_inclusive(self):
        import statistics

        xs = [0.4, 12.0, 3.3, 7.7, 1.1, 9.9, 2.2, 15.5, 6.0, 4.4, 0.9]
        q = statistics.quantiles(xs, n=100, method="inclusive")
        for p in (50, 90, 99):
            self.assertAlmostEqual(probe.percentile(xs, p), q[p - 1])

    def test_out_of_range(self):
        with self.assertRaises(ValueError):
            probe.percentile([1], 101)


class ParseTest(unittest.TestCase):
    def test_parses_good_lines_and_skips_malformed(self):
        lines = [
            json.dumps({"op": "stat", "start": 100.5, "latency_ms": 0.4, "ok": True}),
            "not json at all",
            '{"op": "put", "start": 100.6, "latency_ms": 1.5',  # truncated (killed mid-line)
            "",
            "   ",
            "[1, 2, 3]",
            json.dumps({"op": "put", "start": "100.7", "latency_ms": 1, "ok": True}),
            json.dumps({"op": "put", "start": 100.7, "latency_ms": -1, "ok": True}),
            json.dumps({"op": "put", "start": 100.7, "latency_ms": 1, "ok": "yes"}),
            json.dumps({"op": "put", "start": True, "latency_ms": 1, "ok": True}),
            json.dumps({"start": 100.7, "latency_ms": 1, "ok": True}),
            '{"op": "put", "start": NaN, "latency_ms": 1, "ok": true}',
            json.dumps({"op": "put", "start": 100.8, "latency_ms": 2, "ok": False}),
            json.dumps({"op": "upload", "start": 101, "latency_ms": 250, "bytes": 16 * MIB,
                        "ok": True, "extra": "ignored"}),
        ]
        records, skipped = probe.parse_lines(lines)
        self.assertEqual(skipped, 9)
        self.assertEqual([r["op"] for r in records], ["stat", "put", "upload"])
        self.assertEqual(records[0], rec("stat", 100.5, 0.4))
        self.assertFalse(records[1]["ok"])
        self.assertEqual(records[2]["bytes"], 16 * MIB)
        self.assertIsInstance(records[2]["start"], float)

    def test_negative_bytes_rejected(self):
        line = json.dumps({"op": "upload", "start": 1, "latency_ms": 1, "ok": True, "bytes": -5})
        self.assertIsNone(probe.parse_record(line))


class AttributionTest(unittest.TestCase):
    def setUp(self):
        self.windows = [
            probe.Window(0, "idle", 100.0, 110.0),
            probe.Window(0, "paced", 110.2, 120.2),
        ]

    def test_margin_drops_edges(self):
        records = [
            rec("stat", 99.0, 1),    # before everything
            rec("stat", 100.2, 1),   # inside idle's leading margin
            rec("stat", 100.5, 1),   # exactly at idle's trimmed start: kept
            rec("put", 105.0, 1),    # idle
            rec("put", 109.49, 1),   # idle, just before the trimmed end
            rec("put", 109.5, 1),    # trimmed end is exclusive
            rec("stat", 110.1, 1),   # gap between windows
            rec("stat", 110.8, 1),   # paced
            rec("stat", 119.9, 1),   # paced's trailing margin
        ]
        per, dropped = probe.attribute(records, self.windows, 0.5)
        self.assertEqual([r["start"] for r in per[0]], [100.5, 105.0, 109.49])
        self.assertEqual([r["start"] for r in per[1]], [110.8])
        self.assertEqual(dropped, 5)

    def test_zero_margin_keeps_window_start(self):
        per, dropped = probe.attribute([rec("stat", 100.0, 1), rec("stat", 110.0, 1)],
                                       self.windows, 0.0)
        self.assertEqual(len(per[0]), 1)
        self.assertEqual(dropped, 1)  # 110.0 is idle's end and before paced's start

    def test_effective_seconds(self):
        self.assertAlmostEqual(self.windows[0].effective_seconds(0.5), 9.0)
        self.assertEqual(probe.Window(0, "idle", 0, 0.6).effective_seconds(0.5), 0.0)


class PoolTest(unittest.TestCase):
    def test_pools_samples_durations_and_upload_bytes_over_cycles(self):
        windows = [
            probe.Window(0, "idle", 0.0, 10.0),
            probe.Window(0, "unpaced", 10.0, 20.0),
            probe.Window(1, "idle", 100.0, 110.0),
            probe.Window(1, "unpaced", 110.0, 120.0),
        ]
        sessions = [
            rec("stat", 1.0, 1.0), rec("stat", 2.0, 3.0), rec("put", 3.0, 10.0),
            rec("stat", 101.0, 2.0), rec("put", 102.0, 20.0), rec("put", 103.0, 30.0, ok=False),
            rec("stat", 11.0, 5.0), rec("put", 111.0, 40.0),
        ]
        uploads = [
            # Entirely inside cycle 0's trimmed unpaced window [10.5, 19.5).
            rec("upload", 11.0, 1000.0, nbytes=16 * MIB),
            # Straddles cycle 1's trimmed end at 119.5: half of it counts.
            rec("upload", 119.0, 1000.0, nbytes=16 * MIB),
            # Failed uploads move no bytes.
            rec("upload", 112.0, 500.0, ok=False, nbytes=16 * MIB),
        ]
        per, _ = probe.attribute(sessions, windows, 0.5)
        idle = probe.pool(windows, per, uploads, 0.5, "idle")
        self.assertEqual(idle["seconds"], 18.0)
        self.assertEqual(idle["stat"]["n"], 3)
        self.assertAlmostEqual(idle["stat"]["p50_ms"], 2.0)
        self.assertEqual(idle["put"]["n"], 2)
        self.assertEqual(idle["put"]["errors"], 1)
        self.assertAlmostEqual(idle["put"]["p50_ms"], 15.0)
        self.assertEqual(idle["session_ops"], 5)
        self.assertEqual(idle["session_errors"], 1)
        self.assertAlmostEqual(idle["ops_per_s"], 5 / 18.0)
        self.assertEqual(idle["upload"]["bytes"], 0)

        unpaced = probe.pool(windows, per, uploads, 0.5, "unpaced")
        self.assertAlmostEqual(unpaced["upload"]["bytes"], 24 * MIB)
        self.assertAlmostEqual(unpaced["upload"]["mib_per_s"], 24 / 18.0)
        self.assertEqual(unpaced["upload"]["artifacts_started"], 3)
        self.assertEqual(unpaced["upload"]["errors"], 1)
        self.assertEqual(unpaced["upload"]["latency"]["n"], 2)

        only1 = probe.pool(windows, per, uploads, 0.5, "unpaced", cycles=[1])
        self.assertEqual(only1["seconds"], 9.0)
        self.assertEqual(only1["put"]["n"], 1)
        self.assertAlmostEqual(only1["upload"]["bytes"], 8 * MIB)

        # Per-block records, when the uploader wrote them, count exactly the blocks
        # acknowledged inside each trimmed window (an artifact that never finished too).
        blocks = [rec("block", 11.0, 0.0, nbytes=4 * MIB), rec("block", 19.4, 0.0, nbytes=4 * MIB),
                  rec("block", 19.6, 0.0, nbytes=4 * MIB), rec("block", 112.0, 0.0, nbytes=MIB)]
        by_block = probe.pool(windows, per, uploads, 0.5, "unpaced", blocks=blocks)
        self.assertEqual(by_block["upload"]["bytes"], 9 * MIB)
        self.assertEqual(by_block["upload"]["artifacts_started"], 3, "artifacts still counted")

    def test_empty_condition(self):
        c = probe.pool([], [], [], 0.5, "idle")
        self.assertEqual(c["seconds"], 0.0)
        self.assertIsNone(c["stat"]["p50_ms"])
        self.assertIsNone(c["ops_per_s"])


class MachineShareTest(unittest.TestCase):
    STAT = "cpu  100 0 50 800 20 0 10 20 7 0\ncpu0 1 2 3 4 5 6 7 8 9 10\nintr 1\n"

    def test_the_cpu_line_gives_idle_steal_and_total_ticks_without_guest_time(self):
        self.assertEqual(probe.machine_ticks(self.STAT), (820, 20, 1000))
        self.assertIsNone(probe.machine_ticks("cpu0 1 2 3\n"))
        self.assertIsNone(probe.machine_ticks("cpu  1 2 x 4 5 6 7 8\n"))

    def test_a_pooled_condition_reports_the_steal_of_its_windows_together(self):
        windows = [
            probe.Window(0, "idle", 0.0, 10.0, (100, 0, 400)),
            probe.Window(0, "unpaced", 10.0, 20.0, (50, 100, 400)),
            probe.Window(1, "idle", 20.0, 30.0, (60, 40, 400)),
        ]
        per = [[], [], []]
        idle = probe.pool(windows, per, [], 0.5, "idle")["machine"]
        # 800 ticks: 160 idle, 40 stolen, 600 busy.
        self.assertEqual(idle, {"busy_pct": 75.0, "idle_pct": 20.0, "steal_pct": 5.0})
        unpaced = probe.pool(windows, per, [], 0.5, "unpaced")["machine"]
        self.assertEqual(unpaced["steal_pct"], 25.0)
        lines = probe.format_table("t", {"idle": probe.pool(windows, per, [], 0.5, "idle")})
        self.assertTrue(lines[1].endswith("steal %"), lines[1])
        self.assertTrue(lines[3].endswith("5.0"), lines[3])

    def test_a_window_without_ticks_leaves_the_share_unknown(self):
        windows = [probe.Window(0, "idle", 0.0, 10.0, (100, 0, 400)),
                   probe.Window(1, "idle", 20.0, 30.0)]
        self.assertIsNone(probe.pool(windows, [[], []], [], 0.5, "idle")["machine"])
        self.assertIsNone(probe.machine_share([(0, 0, 0)]))

    def test_steal_that_differs_between_idle_and_unpaced_is_warned_about(self):
        def conds(idle, unpaced):
            return {"idle": {"machine": {"steal_pct": idle}},
                    "unpaced": {"machine": {"steal_pct": unpaced}}}
        self.assertIsNone(probe.steal_warning(conds(4.4, 9.0)))
        warning = probe.steal_warning(conds(18.5, 24.1))
        self.assertIn("24.1 % of the machine's CPU time in unpaced and 18.5 %", warning)
        self.assertIsNotNone(probe.steal_warning(conds(20.0, 2.0)))
        self.assertIsNone(probe.steal_warning({"idle": {"machine": None}, "unpaced": {}}))

    def test_a_machine_running_slower_for_the_same_session_work_is_warned_about(self):
        def conds(idle, unpaced):
            return {"idle": {"session_cpu_ms_per_op": idle},
                    "unpaced": {"session_cpu_ms_per_op": unpaced}}
        self.assertIsNone(probe.speed_warning(conds(0.169, 0.175)))
        # The control run started 2026-12-03 13:49 UTC (no uploader): 0.170 -> 0.194 ms per op.
        warning = probe.speed_warning(conds(0.170, 0.194))
        self.assertIn("0.194 ms of CPU per operation in unpaced and 0.170 ms in idle (1.14x)",
                      warning)
        self.assertIsNotNone(probe.speed_warning(conds(0.2, 0.17)))
        self.assertIsNone(probe.speed_warning(conds(None, 0.2)))
        self.assertIsNone(probe.speed_warning({"idle": {}, "unpaced": None}))

    def test_the_ratios_over_the_machines_speed_divide_by_the_sessions_own_slowdown(self):
        # The s3 run started 2026-12-03 14:24 UTC: put 2.54 / 2.07 ms while the sessions' CPU per
        # operation went 0.187 -> 0.218 ms.
        conds = {"idle": {"stat": {"p50_ms": 0.80}, "put": {"p50_ms": 2.07},
                          "session_cpu_ms_per_op": 0.187},
                 "unpaced": {"stat": {"p50_ms": 0.90}, "put": {"p50_ms": 2.54},
                             "session_cpu_ms_per_op": 0.218}}
        judged = probe.judge(conds).ratios
        adjusted = probe.ratios_over_machine_speed(judged, conds)
        self.assertAlmostEqual(adjusted["put"], (2.54 / 2.07) / (0.218 / 0.187))
        self.assertAlmostEqual(adjusted["stat"], (0.90 / 0.80) / (0.218 / 0.187))
        self.assertIn("put 1.053x", probe.format_over_machine_speed(adjusted))
        conds["idle"]["session_cpu_ms_per_op"] = None
        self.assertIsNone(probe.ratios_over_machine_speed(judged, conds))

    def test_ticks_between_two_samples_and_this_machines_proc_stat(self):
        self.assertEqual(probe.ticks_between((1, 2, 10), (4, 2, 30)), (3, 0, 20))
        self.assertIsNone(probe.ticks_between(None, (4, 2, 30)))
        if Path("/proc/stat").exists():
            self.assertIsNotNone(probe.read_machine_ticks())


class ProcessCpuTest(unittest.TestCase):
    def test_each_group_is_reported_in_cores_over_its_untrimmed_windows(self):
        windows = [
            probe.Window(0, "idle", 0.0, 10.0, cpu={"daemon": 8.0, "sessions": 9.0}),
            probe.Window(0, "unpaced", 10.0, 20.0,
                         cpu={"daemon": 9.0, "sessions": 8.0, "uploader": 1.0}),
            probe.Window(1, "idle", 20.0, 30.0, cpu={"daemon": 10.0, "sessions": 7.0}),
        ]
        sessions = [rec("stat", 1.0 + k * 0.01, 1.0) for k in range(400)]
        per, _ = probe.attribute(sessions, windows, 0.5)
        idle = probe.pool(windows, per, [], 0.5, "idle")
        # 18 s of daemon CPU over 20 s of idle windows (margins trim samples, not CPU).
        self.assertEqual(idle["cpu_cores"], {"daemon": 0.9, "sessions": 0.8})
        # 400 ops over 18 trimmed seconds: 22.2 ops/s, at 0.9 cores of daemon.
        self.assertAlmostEqual(idle["daemon_cpu_ms_per_session_op"], 1000 * 0.9 / (400 / 18))
        self.assertAlmostEqual(idle["session_cpu_ms_per_op"], 1000 * 0.8 / (400 / 18))
        unpaced = probe.pool(windows, per, [], 0.5, "unpaced")
        self.assertEqual(unpaced["cpu_cores"]["uploader"], 0.1)
        self.assertIsNone(unpaced["daemon_cpu_ms_per_session_op"])  # no session ops there
        lines = probe.format_cpu("t", {"idle": idle, "unpaced": unpaced})
        self.assertIn("uploader", lines[1])
        self.assertTrue(lines[3].startswith("idle") and "0.90" in lines[3], lines[3])
        self.assertIn("sessions ms/op", lines[1])
        self.assertIn(f"{1000 * 0.8 / (400 / 18):.3f}", lines[3])

    def test_a_window_without_a_reading_leaves_the_condition_unknown(self):
        windows = [probe.Window(0, "idle", 0.0, 10.0, cpu={"daemon": 1.0}),
                   probe.Window(1, "idle", 20.0, 30.0)]
        pooled = probe.pool(windows, [[], []], [], 0.5, "idle")
        self.assertIsNone(pooled["cpu_cores"])
        self.assertIsNone(pooled["daemon_cpu_ms_per_session_op"])
        self.assertEqual(probe.format_cpu("t", {"idle": pooled}), [])

    def test_a_group_started_inside_the_window_counts_all_its_cpu(self):
        self.assertEqual(probe.cpu_between({"daemon": 5.0}, {"daemon": 7.5, "uploader": 0.5}),
                         {"daemon": 2.5, "uploader": 0.5})
        self.assertIsNone(probe.cpu_between(None, {"daemon": 1.0}))

    @unittest.skipUnless(Path("/proc/self/stat").exists(), "needs /proc")
    def test_a_live_process_reads_its_cpu_and_a_gone_one_reads_none(self):
        before = probe.process_cpu_seconds(os.getpid())
        deadline = time.process_time() + 0.2
        while time.process_time() < deadline:
            pass
        after = probe.process_cpu_seconds(os.getpid())
        self.assertGreater(after, before)
        gone = subprocess.Popen(["true"])
        gone.wait()
        self.assertIsNone(probe.process_cpu_seconds(gone.pid))
        self.assertIsNone(probe.group_cpu_seconds({"daemon": [os.getpid(), gone.pid]}))
        self.assertEqual(set(probe.group_cpu_seconds({"sessions": [os.getpid()]})), {"sessions"})


class OverlapTest(unittest.TestCase):
    def test_pro_rata(self):
        u = rec("upload", 10.0, 2000.0, nbytes=100)
        self.assertAlmostEqual(probe.overlap_bytes(u, 0, 100), 100)
        self.assertAlmostEqual(probe.overlap_bytes(u, 11, 100), 50)
        self.assertAlmostEqual(probe.overlap_bytes(u, 10.5, 11), 25)
        self.assertEqual(probe.overlap_bytes(u, 12, 20), 0)
        self.assertEqual(probe.overlap_bytes(rec("upload", 10, 0, nbytes=7), 10, 11), 7)


class TimelineTest(unittest.TestCase):
    def test_buckets(self):
        windows = [probe.Window(0, "idle", 100.0, 102.0), probe.Window(0, "unpaced", 102.0, 104.0)]
        sessions = [
            rec("stat", 100.1, 1.0), rec("stat", 100.9, 3.0), rec("put", 100.5, 10.0),
            rec("put", 101.2, 12.0, ok=False),
            rec("stat", 103.999, 4.0),
            rec("stat", 104.0, 9.0),   # at t1: outside
            rec("stat", 99.9, 9.0),    # before t0: outside
        ]
        uploads = [rec("upload", 102.5, 1000.0, nbytes=2 * MIB)]
        tl = probe.timeline(sessions, uploads, windows, 100.0, 104.0, 1.0)
        self.assertEqual(len(tl), 4)
        self.assertEqual([b["t"] for b in tl], [0, 1, 2, 3])
        self.assertEqual([b["condition"] for b in tl], ["idle", "idle", "unpaced", "unpaced"])
        self.assertEqual([b["ops"] for b in tl], [3, 0, 0, 1])
        self.assertEqual([b["errors"] for b in tl], [0, 1, 0, 0])
        self.assertAlmostEqual(tl[0]["stat_p50_ms"], 2.0)
        self.assertAlmostEqual(tl[0]["put_p50_ms"], 10.0)
        self.assertEqual(tl[0]["max_ms"], 10.0)
        self.assertIsNone(tl[1]["stat_p50_ms"])
        self.assertIsNone(tl[1]["max_ms"])
        self.assertAlmostEqual(tl[2]["upload_bytes"], MIB)
        self.assertAlmostEqual(tl[3]["upload_mib_per_s"], 1.0)
        self.assertEqual(tl[0]["upload_bytes"], 0)

    def test_partial_last_bucket_and_gap_label(self):
        windows = [probe.Window(0, "idle", 0.0, 1.0), probe.Window(0, "paced", 2.0, 3.0)]
        tl = probe.timeline([rec("stat", 3.2, 1)], [], windows, 0.0, 3.5, 1.0)
        self.assertEqual(len(tl), 4)
        self.assertEqual([b["condition"] for b in tl], ["idle", None, "paced", None])
        self.assertEqual(tl[3]["ops"], 1)

    def test_half_second_buckets(self):
        tl = probe.timeline([rec("put", 0.7, 1)], [], [], 0.0, 1.0, 0.5)
        self.assertEqual([b["ops"] for b in tl], [0, 1])
        self.assertEqual([b["t"] for b in tl], [0.0, 0.5])


class VerdictTest(unittest.TestCase):
    def test_qualified(self):
        v = probe.judge({"idle": cond(7.0, 14.0), "paced": cond(50.0, 90.0, upload_bytes=1),
                         "unpaced": cond(7.1, 14.77, upload_bytes=MIB),
                         "idle-again": cond(100.0, 100.0)})
        self.assertTrue(v.qualified, v.reasons)
        self.assertEqual(v.text, "QUALIFIED")
        self.assertAlmostEqual(v.ratios["put"], 14.77 / 14.0)

    def test_exactly_at_the_limit_qualifies(self):
        v = probe.judge({"idle": cond(10.0, 10.0), "unpaced": cond(12.0, 12.0, upload_bytes=1)})
        self.assertTrue(v.qualified, v.reasons)

    def test_not_qualified_on_stat(self):
        v = probe.judge({"idle": cond(5.83, 12.67), "unpaced": cond(7.31, 13.0, upload_bytes=1)})
        self.assertFalse(v.qualified)
        self.assertEqual(len(v.reasons), 1)
        self.assertIn("unpaced stat p50 7.31 ms > 1.2 x idle 5.83 ms", v.reasons[0])
        self.assertTrue(v.text.startswith("NOT QUALIFIED ("))

    def test_not_qualified_on_put(self):
        v = probe.judge({"idle": cond(5.83, 12.67), "unpaced": cond(6.0, 17.09, upload_bytes=1)})
        self.assertFalse(v.qualified)
        self.assertEqual(len(v.reasons), 1)
        self.assertIn("unpaced put p50 17.09 ms", v.reasons[0])

    def test_custom_ratio(self):
        conds = {"idle": cond(10.0, 10.0), "unpaced": cond(14.0, 14.0, upload_bytes=1)}
        self.assertFalse(probe.judge(conds).qualified)
        self.assertTrue(probe.judge(conds, ratio=1.5).qualified)

    def test_paced_is_not_judged(self):
        v = probe.judge({"idle": cond(1.0, 1.0), "paced": cond(99.0, 99.0, upload_bytes=1),
                         "unpaced": cond(1.0, 1.0, upload_bytes=1)})
        self.assertTrue(v.qualified)

    def test_missing_data(self):
        v = probe.judge({"idle": cond(None, 10.0), "unpaced": cond(5.0, None, upload_bytes=1)})
        self.assertFalse(v.qualified)
        self.assertIn("no stat samples in idle", v.reasons)
        self.assertIn("no put samples in unpaced", v.reasons)
        self.assertIsNone(v.ratios["stat"])

    def test_missing_conditions(self):
        v = probe.judge({})
        self.assertFalse(v.qualified)
        self.assertIn("no stat samples in idle", v.reasons)
        self.assertIn("no put samples in idle", v.reasons)

    def test_a_control_run_reports_the_drift_without_judging_it(self):
        # No uploader ran: a slow "unpaced" is drift, and no upload bytes is expected.
        v = probe.judge({"idle": cond(1.0, 2.0), "unpaced": cond(1.5, 2.6, upload_bytes=0)},
                        control=True)
        self.assertTrue(v.qualified, v.reasons)
        self.assertTrue(v.text.startswith("CONTROL (no uploader ran"), v.text)
        self.assertIn("stat 1.50x", v.text)
        self.assertIn("put 1.30x", v.text)
        self.assertTrue(v.as_dict()["control"])

    def test_a_control_run_still_fails_on_missing_samples_and_errors(self):
        v = probe.judge({"idle": cond(None, 2.0), "unpaced": cond(1.0, 2.0)}, control=True)
        self.assertFalse(v.qualified)
        self.assertIn("no stat samples in idle", v.reasons)

    def test_uploader_moved_nothing(self):
        v = probe.judge({"idle": cond(1.0, 1.0), "unpaced": cond(1.0, 1.0, upload_bytes=0)})
        self.assertFalse(v.qualified)
        self.assertIn("the uploader moved no data in unpaced", v.reasons)

    def test_failed_session_ops(self):
        v = probe.judge({"idle": cond(1.0, 1.0),
                         "unpaced": cond(1.0, 1.0, errors=3, upload_bytes=1)})
        self.assertFalse(v.qualified)
        self.assertIn("3 session operation(s) failed in unpaced", v.reasons)

    def test_zero_idle_latency(self):
        v = probe.judge({"idle": cond(0.0, 0.0), "unpaced": cond(0.0, 0.1, upload_bytes=1)})
        self.assertFalse(v.qualified)
        self.assertEqual(v.ratios["stat"], 1.0)
        self.assertTrue(math.isinf(v.ratios["put"]))


class PlacementTest(unittest.TestCase):
    def test_fnv1a_matches_the_daemon(self):
        # Same vectors as nokv-server/src/placement.rs's test.
        self.assertEqual(probe.shard_of("", 16), 0xCBF29CE484222325 % 16)
        self.assertEqual(probe.shard_of("alpha", 16), probe.shard_of("alpha", 16))
        self.assertEqual(len({probe.shard_of(f"ws{i}", 16) for i in range(200)}), 16)
        # FNV-1a 64 of "a" is 0xaf63dc4c8601ec8c (published test vector).
        self.assertEqual(probe.shard_of("a", 1 << 64), 0xAF63DC4C8601EC8C)

    def test_same_shard_workspaces(self):
        names = probe.session_workspaces(8, "probe-up", 16)
        self.assertEqual(len(set(names)), 8)
        target = probe.shard_of("probe-up", 16)
        self.assertTrue(all(probe.shard_of(n, 16) == target for n in names))

    def test_spread_workspaces(self):
        self.assertEqual(probe.session_workspaces(2, "probe-up", None), ["probe-s0", "probe-s1"])


class FormatTest(unittest.TestCase):
    def test_table_and_side_by_side_render(self):
        windows = [probe.Window(0, c, i * 10.0, i * 10.0 + 10) for i, c in
                   enumerate(probe.CONDITIONS)]
        sessions = [rec(op, w.start + 1 + k * 0.01, 1 + k % 5) for w in windows
                    for op in ("stat", "put") for k in range(50)]
        uploads = [rec("upload", 12.0, 500, nbytes=16 * MIB)]
        per, _ = probe.attribute(sessions, windows, 0.5)
        conds = {c: probe.pool(windows, per, uploads, 0.5, c) for c in probe.CONDITIONS}
        table = probe.format_table("candidate", conds)
        self.assertEqual(len(table), 3 + 4)
        self.assertTrue(table[3].startswith("idle"))
        side = probe.format_side_by_side(conds, conds)
        self.assertTrue(any(line.startswith("unpaced") and "upload MiB/s" in line
                            for line in side))
        self.assertIn("unpaced stat 1.00x", probe.format_ratios(conds, 1.2))
        json.dumps(conds)  # report.json must serialise


def cond99(p50, p99, mib_per_s=None, upload_bytes=0.0):
    """A pooled condition with p50 and p99 for both ops and the uploader's speed."""
    return {
        "stat": {"p50_ms": p50, "p99_ms": p99},
        "put": {"p50_ms": p50, "p99_ms": p99},
        "session_errors": 0,
        "upload": {"bytes": upload_bytes, "mib_per_s": mib_per_s},
    }


class OpenLoopJudgeTest(unittest.TestCase):
    def judge(self, unpaced, alone_mib=100.0):
        conds = {"alone": cond99(None, None, mib_per_s=alone_mib, upload_bytes=1),
                 "idle": cond99(1.0, 3.0), "unpaced": unpaced}
        return probe.judge(conds, 1.1, p99_ratio=1.5, min_upload_share=0.5)

    def test_within_every_bar_qualifies(self):
        v = self.judge(cond99(1.05, 4.4, mib_per_s=60.0, upload_bytes=1))
        self.assertTrue(v.qualified, v.reasons)

    def test_a_tail_past_the_p99_bar_fails_although_p50_holds(self):
        v = self.judge(cond99(1.05, 4.6, mib_per_s=60.0, upload_bytes=1))
        self.assertFalse(v.qualified)
        self.assertTrue(any("p99" in r for r in v.reasons), v.reasons)

    def test_a_starved_uploader_fails_although_latency_holds(self):
        v = self.judge(cond99(1.0, 3.0, mib_per_s=19.1, upload_bytes=1))
        self.assertFalse(v.qualified)
        self.assertIn("19 % of its speed alone", " ".join(v.reasons))

    def test_without_an_alone_window_the_share_cannot_be_judged(self):
        conds = {"idle": cond99(1.0, 3.0), "unpaced": cond99(1.0, 3.0, 60.0, 1)}
        v = probe.judge(conds, 1.1, p99_ratio=1.5, min_upload_share=0.5)
        self.assertFalse(v.qualified)
        self.assertIsNone(probe.upload_share(conds))

    def test_closed_loop_verdict_ignores_the_tail_and_the_share(self):
        conds = {"idle": cond99(1.0, 3.0), "unpaced": cond99(1.05, 30.0, 1.0, 1)}
        self.assertTrue(probe.judge(conds, 1.1).qualified)


class CliTest(unittest.TestCase):
    def test_endpoint_requires_ca_and_data_dir(self):
        parser = probe.build_parser()
        args = parser.parse_args(["--endpoint", "https://127.0.0.1:1", "--ca", "x"])
        import contextlib
        import io

        with contextlib.redirect_stderr(io.StringIO()), self.assertRaises(SystemExit) as cm:
            probe.validate(parser, args)
        self.assertEqual(cm.exception.code, 2)

    def test_admin_token_is_redacted(self):
        cmd = probe.redacted_command(["probe.py", "--admin-token", "secret1",
                                      "--admin-token=secret2", "--sessions", "2"])
        self.assertNotIn("secret", cmd)
        self.assertIn("--sessions 2", cmd)

    def test_defaults(self):
        a = probe.build_parser().parse_args([])
        probe.apply_presets(a)
        self.assertEqual((a.sessions, a.seconds, a.cycles, a.provider),
                         (8, 40.0, 2, "local"))
        self.assertEqual((a.session_rate, a.upload_mib, a.ratio), (None, 16, 1.2),
                         "closed loop stays the default, so old runs compare")

    def test_a_smoke_run_prints_its_verdict_as_not_judged_on_the_verdict_line(self):
        self.assertFalse(probe.build_parser().parse_args([]).smoke)
        self.assertTrue(probe.build_parser().parse_args(["--smoke"]).smoke)
        failed = probe.judge({"idle": cond(1.0, 10.0, upload_bytes=0),
                              "unpaced": cond(2.0, 10.0, upload_bytes=MIB)})
        self.assertFalse(failed.qualified)
        line = probe.verdict_line(failed.as_dict(), smoke=True)
        self.assertTrue(line.startswith("verdict: (not judged: smoke run"), line)
        self.assertIn("measured NOT QUALIFIED (", line)
        judged = probe.verdict_line(failed.as_dict(), smoke=False)
        self.assertTrue(judged.startswith("verdict: NOT QUALIFIED ("), judged)
        self.assertNotIn("not judged", judged)

    def test_open_loop_preset_is_the_agents_regime_and_explicit_flags_win(self):
        a = probe.build_parser().parse_args(["--open-loop"])
        probe.apply_presets(a)
        self.assertEqual((a.sessions, a.session_rate, a.upload_mib, a.ratio),
                         (32, 10.0, 256, 1.1))
        a = probe.build_parser().parse_args(["--open-loop", "--sessions", "4",
                                             "--session-rate", "2"])
        probe.apply_presets(a)
        self.assertEqual((a.sessions, a.session_rate), (4, 2.0))
        self.assertEqual(a.server_bin, "target/release/nokv-server")
        self.assertEqual(a.cli_bin, "target/release/nokv")


def parse_png(data):
    """An independent reader (not the probe's png_check): (width, height, bit depth, colour
    type, rows of RGB tuples), asserting the signature and every chunk's CRC on the way."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "signature"
    pos, chunks = 8, []
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        (crc,) = struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])
        assert zlib.crc32(kind + body) & 0xFFFFFFFF == crc, f"CRC of {kind!r}"
        chunks.append((kind, body))
        pos += 12 + n
    assert chunks[0][0] == b"IHDR" and chunks[-1][0] == b"IEND"
    w, h, depth, colour = struct.unpack(">IIBB", chunks[0][1][:10])
    raw = zlib.decompress(b"".join(b for k, b in chunks if k == b"IDAT"))
    assert len(raw) == h * (1 + w * 3), "IDAT size"
    rows = []
    for y in range(h):
        line = raw[y * (1 + w * 3):(y + 1) * (1 + w * 3)]
        assert line[0] == 0, "filter type 0"
        rows.append([tuple(line[1 + 3 * x:4 + 3 * x]) for x in range(w)])
    return w, h, depth, colour, rows


def known_timeline():
    """One target, one cycle of 4 conditions x 4 s from t0 = 100: 10 session ops per 1 s
    bucket (10 ops/s) but 15 in the last (so the ops/s scale tops at 20), no latency samples,
    the uploader moving 40 MiB/s in unpaced only (its own scale tops at 50)."""
    windows = [{"cycle": 0, "condition": c, "start": 100.0 + 4 * i, "end": 104.0 + 4 * i}
               for i, c in enumerate(probe.CONDITIONS)]
    buckets = [{"t": float(i), "condition": None, "ops": 15 if i == 15 else 10, "errors": 0,
                "stat_p50_ms": None, "put_p50_ms": None, "max_ms": None,
                "upload_bytes": 0.0, "upload_mib_per_s": 40.0 if 8 <= i < 12 else 0.0}
               for i in range(16)]
    return [{"label": "candidate", "windows": windows,
             "timeline": [{"cycle": 0, "t0": 100.0, "buckets": buckets}]}]


def timeline_with_latency(label, ops, stat_ms, put_ms):
    """known_timeline()'s shape with `ops` session ops per 1 s bucket and constant p50s."""
    (t,) = known_timeline()
    for b in t["timeline"][0]["buckets"]:
        b.update(ops=ops, stat_p50_ms=stat_ms, put_p50_ms=put_ms)
    return dict(t, label=label)


class PngWriterTest(unittest.TestCase):
    def test_encoded_png_parses_back_to_the_same_pixels(self):
        w, h = 5, 3
        rgb = b"".join(bytes((x * 40, y * 80, 7)) for y in range(h) for x in range(w))
        data = probe.png_encode(w, h, rgb)
        pw, ph, depth, colour, rows = parse_png(data)
        self.assertEqual((pw, ph, depth, colour), (5, 3, 8, 2))
        self.assertEqual(rows[2][4], (160, 160, 7))
        self.assertEqual(probe.png_check(data), (5, 3))

    def test_png_check_rejects_a_bad_crc_a_bad_signature_and_a_short_idat(self):
        good = probe.png_encode(2, 2, bytes(12))
        bad_crc = bytearray(good)
        bad_crc[-5] ^= 0xFF  # inside IEND's CRC
        with self.assertRaisesRegex(ValueError, "CRC"):
            probe.png_check(bytes(bad_crc))
        with self.assertRaisesRegex(ValueError, "signature"):
            probe.png_check(b"GIF89a" + good[6:])
        # An IHDR claiming one more row than the IDAT holds (CRC recomputed, so only the
        # size check can catch it).
        ihdr = struct.pack(">IIBBBBB", 2, 3, 8, 2, 0, 0, 0)
        chunk = struct.pack(">I", 13) + b"IHDR" + ihdr + struct.pack(
            ">I", zlib.crc32(b"IHDR" + ihdr) & 0xFFFFFFFF)
        with self.assertRaisesRegex(ValueError, "inflates"):
            probe.png_check(good[:8] + chunk + good[8 + 25:])

    def test_png_encode_refuses_a_buffer_of_the_wrong_size(self):
        with self.assertRaises(ValueError):
            probe.png_encode(2, 2, bytes(11))


class TimelinePictureTest(unittest.TestCase):
    def setUp(self):
        self.raster, self.plots = probe.render_timeline(known_timeline())
        self.plot = self.plots[0]

    def test_the_timeline_png_is_a_valid_png_of_one_panel_per_target_and_cycle(self):
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "timeline.png"
            probe.write_png(path, known_timeline() * 2)
            w, h, depth, colour, _ = parse_png(path.read_bytes())
            self.assertEqual((w, h, depth, colour),
                             (probe.PNG_WIDTH, 2 * probe.PANEL_HEIGHT, 8, 2))
            import contextlib
            import io

            with contextlib.redirect_stdout(io.StringIO()):
                self.assertEqual(probe.check_png_file(str(path)), 0)
            path.write_bytes(b"not a png")
            with contextlib.redirect_stderr(io.StringIO()):
                self.assertEqual(probe.check_png_file(str(path)), probe.EXIT_ERROR)

    def test_the_ops_per_second_line_is_drawn_in_the_series_colour_at_its_value(self):
        self.assertEqual((self.plot.ops_max, self.plot.upload_max), (20, 50))
        y = self.plot.y_ops(10)
        for t in (2.5, 6.0, 14.5):  # mid-bucket and between two bucket midpoints
            self.assertEqual(self.raster.get(self.plot.x(t), y), probe.OPS_COLOUR, t)

    def test_condition_windows_are_shaded_and_upload_bars_sit_in_their_buckets(self):
        high = self.plot.y_upload(45)  # above the bars and the ops line
        for t, cond in ((2.5, "idle"), (6.5, "paced"), (10.5, "unpaced"),
                        (14.5, "idle-again")):  # mid-bucket: on a bar if one were too tall
            self.assertEqual(self.raster.get(self.plot.x(t), high),
                             probe.CONDITION_COLOURS[cond], cond)
        low = self.plot.y_upload(20)  # inside a 40 MiB/s bar, away from the 10 ops/s line
        self.assertEqual(self.raster.get(self.plot.x(9.5), low), probe.UPLOAD_COLOUR)
        self.assertEqual(self.raster.get(self.plot.x(5.5), low),
                         probe.CONDITION_COLOURS["paced"])

    def test_a_bucket_without_latency_samples_draws_no_latency_line(self):
        # Inside the plot area (the legend above it shows every series' colour).
        top = self.plot.top
        colours = {self.raster.get(x, y)
                   for y in range(top + probe.PLOT_TOP, top + probe.PLOT_BOTTOM)
                   for x in range(probe.PLOT_LEFT, probe.PLOT_RIGHT)}
        self.assertNotIn(probe.STAT_COLOUR, colours)
        self.assertNotIn(probe.PUT_COLOUR, colours)

    def test_every_panel_shares_one_ops_per_second_scale(self):
        _, plots = probe.render_timeline([timeline_with_latency("candidate", 300, 0.3, 20),
                                          timeline_with_latency("baseline", 40, 0.3, 20)])
        self.assertEqual([p.ops_max for p in plots], [500, 500])
        self.assertEqual(plots[0].y_ops(40) - plots[0].top, plots[1].y_ops(40) - plots[1].top)
        self.assertEqual([p.upload_max for p in plots], [50, 50])

    def test_a_sub_millisecond_stat_p50_stands_clear_of_the_axis_beside_a_slow_put(self):
        # Linear from 0 to 50 ms, 0.2 ms was one pixel above the axis, hidden under it.
        raster, (plot,) = probe.render_timeline([timeline_with_latency("c", 10, 0.2, 40)])
        self.assertEqual((plot.latency_min, plot.latency_max), (0.1, 100))
        height = probe.PLOT_BOTTOM - probe.PLOT_TOP
        stat_y, put_y = plot.y_latency(0.2), plot.y_latency(40)
        self.assertGreater(plot.top + probe.PLOT_BOTTOM - stat_y, height // 10)
        self.assertGreater(stat_y - put_y, height // 2)
        self.assertEqual(raster.get(plot.x(6.0), stat_y), probe.STAT_COLOUR)
        self.assertEqual(raster.get(plot.x(6.0), put_y), probe.PUT_COLOUR)

    def test_the_axes_have_titles_with_units_and_tick_marks(self):
        raster, (plot,) = probe.render_timeline([timeline_with_latency("c", 10, 0.2, 40)])

        def inked(x0, x1, y0, y1, colour=probe.TEXT_COLOUR):
            return any(raster.get(x, y) == colour for x in range(x0, x1) for y in range(y0, y1))

        self.assertIn("ms", probe.LATENCY_AXIS_TITLE)
        self.assertIn("(s)", probe.TIME_AXIS_TITLE)
        self.assertEqual((probe.OPS_UNIT, probe.UPLOAD_UNIT), ("ops/s", "MiB/s"))
        y_top, y_bottom = plot.top + probe.PLOT_TOP, plot.top + probe.PLOT_BOTTOM
        title_y = y_top - probe.GLYPH_HEIGHT - 4
        # Left title above the latency axis; time title right of the x axis' labels; the
        # rate scale's top labelled with its units in the series' colours.
        width = len(probe.LATENCY_AXIS_TITLE) * probe.GLYPH_ADVANCE
        self.assertLessEqual(4 + width, probe.PLOT_LEFT)
        self.assertTrue(inked(4, 4 + width, title_y, title_y + probe.GLYPH_HEIGHT))
        self.assertTrue(inked(probe.PLOT_RIGHT + 2, probe.PNG_WIDTH, y_bottom + 6,
                              y_bottom + 6 + probe.GLYPH_HEIGHT))
        self.assertTrue(inked(probe.PLOT_RIGHT + 8, probe.PNG_WIDTH, y_top,
                              y_top + probe.GLYPH_HEIGHT, probe.OPS_COLOUR))
        self.assertTrue(inked(probe.PLOT_RIGHT + 8, probe.PNG_WIDTH,
                              y_top + probe.GLYPH_HEIGHT + 4, y_top + 2 * probe.GLYPH_HEIGHT + 4,
                              probe.UPLOAD_COLOUR))
        # Tick marks: every latency decade (0.1, 1, 10, 100) out of the left axis, with 2x and
        # 5x between; quarters of the rate scale out of the right one.
        ticks = probe.latency_ticks(plot)
        self.assertEqual([label for _, label in ticks if label], ["0.1", "1", "10", "100"])
        self.assertEqual(len(ticks), 4 + 3 * 2)
        for y, label in ticks:
            self.assertEqual(raster.get(probe.PLOT_LEFT - 3, y), probe.AXIS_COLOUR, label)
        for k in range(5):
            y = plot.y_ops(plot.ops_max * k / 4)
            self.assertEqual(raster.get(probe.PLOT_RIGHT + 4, y), probe.AXIS_COLOUR, k)

    def test_no_timeline_still_writes_a_valid_png(self):
        raster, plots = probe.render_timeline([])
        self.assertEqual(plots, [])
        self.assertEqual(probe.png_check(raster.png()), (probe.PNG_WIDTH, probe.PANEL_HEIGHT))

    def test_the_probe_needs_no_plotting_package(self):
        source = Path(probe.__file__).read_text()
        self.assertNotIn("import matplotlib", source)


if __name__ == "__main__":
    unittest.main()
