"""The disk-floor bench measures both sides and leaves nothing behind (a short real run).

Run: python3 -m unittest discover -s scripts/tests -v
"""

import json
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "disk_interference_floor.py"


class DiskFloorTest(unittest.TestCase):
    def test_a_short_run_reports_each_rate_against_the_no_bulk_window_and_cleans_up(self):
        with tempfile.TemporaryDirectory() as work:
            out = Path(work) / "floor.json"
            data = Path(work) / "disk"
            data.mkdir()
            run = subprocess.run(
                [sys.executable, str(SCRIPT), "--dir", str(data), "--seconds", "0.5",
                 "--rates", "25", "--json", str(out)],
                capture_output=True, text=True, timeout=60)
            self.assertEqual(run.returncode, 0, run.stderr)
            results = json.loads(out.read_text())
            # The no-bulk window is always measured first, even when --rates leaves it out.
            self.assertEqual([r["bulk_target_mib_per_s"] for r in results], [0.0, 25.0])
            base, loaded = results
            self.assertEqual(base["bulk_mib_per_s"], 0.0)
            self.assertGreater(loaded["bulk_mib_per_s"], 0.0)
            for r in results:
                self.assertGreater(r["small_writes"], 0)
                self.assertLessEqual(r["p50_ms"], r["p99_ms"])
            self.assertEqual(base["p50_ratio"], 1.0)
            self.assertAlmostEqual(loaded["p50_ratio"], loaded["p50_ms"] / base["p50_ms"], places=1)
            self.assertIn("p50 ratio", run.stdout)
            self.assertEqual(list(data.iterdir()), [], "the scratch files were left behind")


if __name__ == "__main__":
    unittest.main()
