"""`/metrics` checked against Prometheus conventions: `promtool check metrics` (Debian's
prometheus package) and PyPI's `prometheus_client` parser with the naming rules below.

A daemon is started with `--metrics-listen`, a client writes and reads a file so every
request-path family has samples, and the scrape is parsed by the reference text-format parser
(`prometheus_client.parser`). Then the names are held to the conventions of
https://prometheus.io/docs/practices/naming/: a `nokv_` prefix (or `process_`, the standard
process metrics every client library exports), base units spelled out as the last word
(`_seconds`, `_bytes`), counters ending in `_total` and nothing else doing so, and HELP on
every family. The `method` label has one form for every service (`Workspace/Write`,
`grpc.health.v1.Health/Check`), and `nokv_build_info` and the `process_*` families are there.

Run: python3 -m unittest discover -s scripts/tests -v   (after `cargo build --workspace --bins`)
scripts/test.sh installs `prometheus_client` and sets NOKV_TEST_REQUIRE_MCP=1, which makes a
missing package or binary a failure here too instead of a skip.
"""

import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
import unittest
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SERVER_BIN = REPO / "target" / "debug" / "nokv-server"
CLI_BIN = REPO / "target" / "debug" / "nokv"
REQUIRED = os.environ.get("NOKV_TEST_REQUIRE_MCP") == "1"
LISTENING_PREFIX = "nokv-server listening on "
METRICS_PREFIX = "nokv-server metrics on "

try:
    from prometheus_client.parser import text_string_to_metric_families

    IMPORT_ERROR = None
except ImportError as e:  # pragma: no cover - depends on the machine
    if REQUIRED:
        raise
    IMPORT_ERROR = e

NAME = re.compile(r"^(nokv|process)_[a-z][a-z0-9_]*[a-z0-9]$")
# The process metrics of the Prometheus client libraries (`process_` is their prefix).
PROCESS_FAMILIES = {"process_cpu_seconds": "counter", "process_resident_memory_bytes": "gauge",
                    "process_virtual_memory_bytes": "gauge", "process_open_fds": "gauge",
                    "process_max_fds": "gauge", "process_start_time_seconds": "gauge"}
# A method label: `Service/Method` for nokv's services, `package.Service/Method` for others.
METHOD = re.compile(r"^([A-Z][A-Za-z]*|[a-z][a-z0-9]*(\.[a-z0-9]+)*\.[A-Z][A-Za-z]*)/[A-Z][A-Za-z]*$")
# Units that are not Prometheus base units, as a word of the name.
NOT_BASE_UNITS = {"ms", "millis", "milliseconds", "us", "micros", "microseconds", "ns",
                  "nanoseconds", "minutes", "hours", "days", "kb", "kib", "mb", "mib", "gb",
                  "gib", "percent", "celsius"}
# Words that say a quantity is a time or a size, whose unit must then end the name.
TIME_WORDS = {"duration", "wait", "latency", "age", "elapsed"}
SIZE_WORDS = {"size", "memory"}


def clean_env(extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOKV_")}
    env.update(extra)
    return env


def convention_violations(text: str) -> list:
    """Every way the exposition `text` breaks the naming conventions, as sentences."""
    problems = []
    # The parser normalises counter names (it strips `_total` from the family and adds it to
    # every sample), so the names as exposed are read from the TYPE lines.
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            if kind == "counter" and not name.endswith("_total"):
                problems.append(f"{name}: a counter's name ends in _total")
            if kind != "counter" and name.endswith("_total"):
                problems.append(f"{name}: only counters end in _total ({kind})")
    for f in text_string_to_metric_families(text):
        # The parser drops `_total` from a counter family's name; its samples keep it.
        words = f.name.split("_")
        if not NAME.match(f.name):
            problems.append(f"{f.name}: not a snake_case name with the nokv_ or process_ prefix")
        if not f.documentation.strip():
            problems.append(f"{f.name}: no HELP")
        if f.type in ("unknown", "untyped"):
            problems.append(f"{f.name}: no TYPE")
        for w in words:
            if w in NOT_BASE_UNITS:
                problems.append(f"{f.name}: '{w}' is not a base unit (use seconds or bytes)")
        if TIME_WORDS & set(words) and words[-1] != "seconds":
            problems.append(f"{f.name}: a time must end in _seconds")
        if SIZE_WORDS & set(words) and f.type != "counter" and words[-1] != "bytes" \
                and not f.name.endswith("_wait_seconds"):
            problems.append(f"{f.name}: a size must end in _bytes")
    return problems


@unittest.skipIf(IMPORT_ERROR is not None, f"`prometheus_client` is not installed "
                 f"({IMPORT_ERROR}); scripts/test.sh installs it")
class MetricsConventionsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        for b in (SERVER_BIN, CLI_BIN):
            if not b.exists():
                msg = f"{b} missing: run cargo build --workspace --bins first"
                if REQUIRED:
                    raise AssertionError(msg)
                raise unittest.SkipTest(msg)
        cls.tmp = tempfile.TemporaryDirectory(prefix="nokv-metrics-test-")
        cls.started_at = time.time()
        data = Path(cls.tmp.name) / "data"
        cls.daemon = subprocess.Popen(
            [str(SERVER_BIN), "--data-dir", str(data), "--listen", "127.0.0.1:0",
             "--metrics-listen", "127.0.0.1:0", "--log", "warn"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, env=clean_env({}),
        )
        cls.url = None
        for line in cls.daemon.stdout:  # ends when the daemon exits
            if line.startswith(METRICS_PREFIX):
                cls.url = line[len(METRICS_PREFIX):].strip()
            if line.startswith(LISTENING_PREFIX):
                endpoint = line[len(LISTENING_PREFIX):].strip()
                break
        if cls.url is None:
            cls.daemon.kill()
            cls.daemon.wait()
            raise AssertionError("nokv-server did not announce its metrics URL before listening")
        threading.Thread(target=cls.daemon.stdout.read, daemon=True).start()
        # One gRPC health check (grpc.health.v1.Health/Check), as a container probe makes it;
        # counted before the answer leaves the daemon.
        cls.probe = subprocess.run(
            [str(SERVER_BIN), "probe", "--endpoint", endpoint, "--ca",
             str(data / "tls" / "ca.pem")],
            env=clean_env({}), capture_output=True, text=True, timeout=60)
        env = clean_env({"NOKV_CONFIG": str(data / "client.toml")})
        for args, stdin in ((["put", "ws:a.txt", "-"], b"hello"), (["get", "ws:a.txt"], b"")):
            subprocess.run([str(CLI_BIN), *args], input=stdin, env=env, check=True,
                           capture_output=True)

    @classmethod
    def tearDownClass(cls):
        cls.daemon.terminate()
        cls.daemon.wait()
        cls.tmp.cleanup()

    def scrape(self) -> str:
        with urllib.request.urlopen(self.url, timeout=30) as r:
            self.assertEqual(r.status, 200)
            return r.read().decode()

    def test_the_scrape_parses_with_the_reference_parser_and_names_the_request_families(self):
        families = {f.name: f for f in text_string_to_metric_families(self.scrape())}
        for name, kind in (("nokv_rpc_requests", "counter"),
                           ("nokv_rpc_duration_seconds", "histogram"),
                           ("nokv_gate_queue_wait_seconds", "histogram")):
            self.assertIn(name, families)
            self.assertEqual(families[name].type, kind, name)

    def samples(self, name: str) -> list:
        return [s for f in text_string_to_metric_families(self.scrape()) for s in f.samples
                if s.name == name]

    def test_the_method_label_has_one_form_for_every_service_health_included(self):
        self.assertEqual((self.probe.returncode, self.probe.stdout.split()[-1:]), (0, ["SERVING"]),
                         self.probe)
        calls = {(s.labels["method"], s.labels["code"]): s.value
                 for s in self.samples("nokv_rpc_requests_total")}
        self.assertGreaterEqual(calls.get(("Workspace/Write", "OK"), 0), 1, calls)
        self.assertGreaterEqual(calls.get(("grpc.health.v1.Health/Check", "OK"), 0), 1, calls)
        for method, _ in calls:
            self.assertRegex(method, METHOD)
        durations = {s.labels["method"] for s in self.samples("nokv_rpc_duration_seconds_count")}
        self.assertEqual(durations, {m for m, _ in calls})

    def test_build_info_names_the_version_and_commit_with_the_value_one(self):
        (info,) = self.samples("nokv_build_info")
        self.assertEqual(info.value, 1)
        self.assertRegex(info.labels["version"], r"^\d+\.\d+\.\d+")
        self.assertTrue(info.labels["commit"], info.labels)

    def test_the_process_metrics_are_exported_as_client_libraries_name_them(self):
        families = {f.name: f for f in text_string_to_metric_families(self.scrape())}
        for name, kind in PROCESS_FAMILIES.items():
            self.assertIn(name, families)
            self.assertEqual(families[name].type, kind, name)
        value = {name: families[name].samples[0].value for name in PROCESS_FAMILIES}
        self.assertGreater(value["process_resident_memory_bytes"], 1 << 20)
        self.assertGreater(value["process_cpu_seconds"], 0)
        self.assertGreater(value["process_open_fds"], 3)
        self.assertGreaterEqual(value["process_max_fds"], value["process_open_fds"])
        started = value["process_start_time_seconds"]
        # Between the moment the test started the daemon and now (the kernel's boot time is
        # whole seconds, hence the one second either side).
        self.assertTrue(self.started_at - 1 <= started <= time.time() + 1,
                        (started, self.started_at))

    def test_every_metric_name_follows_the_prometheus_naming_conventions(self):
        text = self.scrape()
        self.assertGreater(len(list(text_string_to_metric_families(text))), 10)
        self.assertEqual(convention_violations(text), [])

    def test_promtool_check_metrics_finds_nothing_to_lint(self):
        promtool = shutil.which("promtool")
        if promtool is None:
            if REQUIRED:
                self.fail("promtool missing: scripts/test.sh installs Debian's prometheus")
            self.skipTest("promtool is not installed (Debian's prometheus package)")
        text = self.scrape()
        lint = subprocess.run([promtool, "check", "metrics"], input=text, text=True,
                              capture_output=True)
        self.assertEqual((lint.returncode, lint.stdout + lint.stderr), (0, ""))
        # And promtool does lint: a counter without _total is reported.
        bad = subprocess.run([promtool, "check", "metrics"], capture_output=True, text=True,
                             input="# HELP nokv_things Things.\n# TYPE nokv_things counter\n"
                                   "nokv_things 1\n")
        self.assertNotEqual(bad.returncode, 0, bad.stdout + bad.stderr)

    def test_the_convention_check_catches_a_counter_without_total_and_a_millisecond_unit(self):
        # The checker itself, on text that breaks the rules (so an empty list above means
        # something).
        bad = ("# HELP nokv_things Things.\n# TYPE nokv_things counter\nnokv_things 1\n"
               "# HELP nokv_wait_ms Waits.\n# TYPE nokv_wait_ms gauge\nnokv_wait_ms 3\n")
        problems = convention_violations(bad)
        self.assertTrue(any("_total" in p for p in problems), problems)
        self.assertTrue(any("'ms' is not a base unit" in p for p in problems), problems)


if __name__ == "__main__":
    unittest.main()
