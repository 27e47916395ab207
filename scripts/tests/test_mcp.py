"""`nokv mcp` driven by the real MCP client from PyPI (`mcp`) against a real daemon.

A daemon (local provider) is started on a temporary data directory; every test spawns
`nokv mcp` over stdio, initializes a session and calls tools as an agent host would. `nokv mcp`
starts in that temporary directory, so it is the default --local-root of every session.

Run: python3 -m unittest discover -s scripts/tests -v   (after `cargo build --workspace --bins`)

scripts/test.sh installs `mcp` and sets NOKV_TEST_REQUIRE_MCP=1, so there the test always runs;
elsewhere it is skipped, saying why, when `mcp` cannot be imported or the binaries are missing.
With NOKV_MCP_TRANSCRIPT=FILE the JSON-RPC messages of one short session are written to FILE.
"""

import asyncio
import contextlib
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import tomllib
import unittest
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SERVER_BIN = REPO / "target" / "debug" / "nokv-server"
CLI_BIN = REPO / "target" / "debug" / "nokv"
REQUIRED = os.environ.get("NOKV_TEST_REQUIRE_MCP") == "1"
LISTENING_PREFIX = "nokv-server listening on "
MIB = 1024 * 1024

try:
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    MCP_IMPORT_ERROR = None
except ImportError as e:  # pragma: no cover - depends on the machine
    if REQUIRED:
        raise
    MCP_IMPORT_ERROR = e

TOOLS = {
    "nokv_stat", "nokv_read", "nokv_write", "nokv_edit", "nokv_append", "nokv_list",
    "nokv_find", "nokv_grep", "nokv_delete", "nokv_publish", "nokv_restore", "nokv_health",
}
# Every numeric argument and its (minimum, maximum) — None: no maximum. Where the daemon bounds
# a value these are the daemon's (nokv-server: LIST_MAX, GREP_MAX_MATCHES, GREP_MAX_CONTEXT).
NUMERIC_BOUNDS = {
    ("nokv_read", "offset"): (0, None),
    ("nokv_read", "limit"): (1, None),
    ("nokv_write", "if_generation"): (0, None),
    ("nokv_edit", "if_generation"): (1, None),
    ("nokv_delete", "if_generation"): (1, None),
    ("nokv_list", "limit"): (1, 1000),
    ("nokv_find", "limit"): (1, 1000),
    ("nokv_grep", "max_matches"): (1, 10000),
    ("nokv_grep", "context_lines"): (0, 10),
}
WRITING_TOOLS = {"nokv_write", "nokv_edit", "nokv_append", "nokv_delete", "nokv_publish"}
LOCAL_FILE_TOOLS = {"nokv_publish", "nokv_restore"}


class Recorded:
    """A transport stream that records every JSON-RPC message passing through it."""

    def __init__(self, inner, direction: str, log: list):
        self.inner, self.direction, self.log = inner, direction, log

    def _record(self, item):
        msg = getattr(item, "message", None)
        if msg is not None:
            dump = getattr(msg, "model_dump", None)
            doc = dump(by_alias=True, exclude_none=True, mode="json") if dump else str(msg)
            self.log.append({"dir": self.direction, "msg": doc})

    async def receive(self):
        item = await self.inner.receive()
        self._record(item)
        return item

    async def send(self, item):
        self._record(item)
        await self.inner.send(item)

    def __aiter__(self):
        return self

    async def __anext__(self):
        try:
            return await self.receive()
        except Exception as e:
            if type(e).__name__ in ("EndOfStream", "ClosedResourceError"):
                raise StopAsyncIteration from e
            raise

    async def aclose(self):
        await self.inner.aclose()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.aclose()
        return None


def clean_env(extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOKV_")}
    env.update(extra)
    return env


def text_of(result) -> str:
    return "\n".join(c.text for c in result.content if getattr(c, "type", "") == "text")


@unittest.skipIf(MCP_IMPORT_ERROR is not None, f"the `mcp` package is not installed "
                 f"({MCP_IMPORT_ERROR}); scripts/test.sh installs it")
class McpServerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        for b in (SERVER_BIN, CLI_BIN):
            if not b.exists():
                msg = f"{b} missing: run cargo build --workspace --bins first"
                if REQUIRED:
                    raise AssertionError(msg)
                raise unittest.SkipTest(msg)
        cls.tmp = tempfile.TemporaryDirectory(prefix="nokv-mcp-test-")
        # Canonical: absolute local paths are compared against the canonical --local-root.
        cls.dir = Path(cls.tmp.name).resolve()
        data = cls.dir / "data"
        cls.daemon = subprocess.Popen(
            [str(SERVER_BIN), "--data-dir", str(data), "--listen", "127.0.0.1:0", "--log", "warn"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, env=clean_env({}),
        )
        endpoint = None
        for line in cls.daemon.stdout:  # ends when the daemon exits
            if line.startswith(LISTENING_PREFIX):
                endpoint = line[len(LISTENING_PREFIX):].strip()
                break
        if endpoint is None:
            cls.daemon.wait()
            raise AssertionError(f"nokv-server exited ({cls.daemon.returncode}) before listening")
        # Keep draining stdout so the daemon never blocks on a full pipe.
        threading.Thread(target=cls.daemon.stdout.read, daemon=True).start()
        client = tomllib.loads((data / "client.toml").read_text())
        cls.endpoint, cls.ca, cls.admin = endpoint, client["ca"], client["token"]
        cls.token = cls.issue(data, "agent")
        cls.other_token = cls.issue(data, "other")
        cls.transcript = None

    @classmethod
    def issue(cls, data: Path, workspace: str) -> str:
        out = subprocess.run(
            [str(SERVER_BIN), "token", "issue", "--data-dir", str(data), "--workspace", workspace,
             "--role", "write", "--ttl", "1d"],
            check=True, capture_output=True, text=True, env=clean_env({}),
        ).stdout
        return out.strip().splitlines()[-1].strip()

    @classmethod
    def tearDownClass(cls):
        cls.daemon.terminate()
        cls.daemon.wait(timeout=30)
        path = os.environ.get("NOKV_MCP_TRANSCRIPT")
        if path and cls.transcript:
            Path(path).write_text("\n".join(json.dumps(m) for m in cls.transcript) + "\n")
        cls.tmp.cleanup()

    @contextlib.asynccontextmanager
    async def session(self, *args: str, token: str | None = None, env: dict | None = None,
                      record: list | None = None):
        extra = {"NOKV_ENDPOINT": self.endpoint, "NOKV_CA": self.ca,
                 "NOKV_TOKEN": token or self.token, **(env or {})}
        params = StdioServerParameters(command=str(CLI_BIN), args=["mcp", *args],
                                       env=clean_env(extra), cwd=str(self.dir))
        with open(self.dir / "mcp.stderr.log", "a") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write):
                if record is not None:
                    read, write = Recorded(read, "<-", record), Recorded(write, "->", record)
                async with ClientSession(read, write, read_timeout_seconds=120) as s:
                    await s.initialize()
                    yield s

    @contextlib.asynccontextmanager
    async def bare_session(self, env: dict):
        """`nokv mcp` with nothing but `env` and the MCP client's default environment (PATH,
        HOME, USER, ...: no NOKV_* variable), started in the test's directory."""
        params = StdioServerParameters(command=str(CLI_BIN), args=["mcp"], env=env,
                                       cwd=str(self.dir))
        with open(self.dir / "mcp.stderr.log", "a") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write):
                async with ClientSession(read, write, read_timeout_seconds=120) as s:
                    await s.initialize()
                    yield s

    async def ok(self, s, tool: str, args: dict) -> dict:
        r = await s.call_tool(tool, args)
        self.assertFalse(r.is_error, f"{tool} failed: {text_of(r)}")
        self.assertIsInstance(r.structured_content, dict)
        return r.structured_content

    async def fails(self, s, tool: str, args: dict, reason: str) -> str:
        r = await s.call_tool(tool, args)
        self.assertTrue(r.is_error, f"{tool} should have failed with {reason}: {text_of(r)}")
        self.assertEqual(r.structured_content["error"]["reason"], reason, text_of(r))
        self.assertTrue(text_of(r).startswith(reason + ":"), text_of(r))
        return text_of(r)

    def test_every_tool_is_listed_with_an_object_input_schema_and_a_description(self):
        async def go():
            record = []
            async with self.session(record=record) as s:
                tools = (await s.list_tools()).tools
                await self.ok(s, "nokv_write", {"workspace": "agent", "path": "hello.txt",
                                                "content": "hello, agent\n"})
                await self.fails(s, "nokv_stat", {"workspace": "agent", "path": "nope.txt"},
                                 "NotFound")
                # Arguments that do not fit the schema are a typed tool error like any other.
                text = await self.fails(s, "nokv_stat", {"workspace": "agent"},
                                        "InvalidArgument")
                self.assertIn("path", text)
            type(self).transcript = record
            return tools

        tools = asyncio.run(go())
        self.assertEqual({t.name for t in tools}, TOOLS)
        for t in tools:
            self.assertEqual(t.input_schema.get("type"), "object", t.name)
            self.assertIsInstance(t.input_schema.get("properties"), dict, t.name)
            self.assertIn("workspace", t.input_schema["properties"], t.name)
            self.assertGreater(len(t.description or ""), 40, t.name)

    def test_files_round_trip_and_stale_generations_or_existing_paths_are_typed_tool_errors(self):
        async def go():
            async with self.session() as s:
                ws = {"workspace": "agent"}
                body = "".join(f"line {i}\n" for i in range(1, 11))
                e = await self.ok(s, "nokv_write", {**ws, "path": "rt/notes.txt",
                                                    "content": body, "mode": "create_only"})
                self.assertEqual(e["size"], len(body))
                gen = e["generation"]
                await self.fails(s, "nokv_write", {**ws, "path": "rt/notes.txt",
                                                   "content": "x", "mode": "create_only"},
                                 "AlreadyExists")

                r = await self.ok(s, "nokv_read", {**ws, "path": "rt/notes.txt",
                                                   "offset": 2, "limit": 3})
                self.assertEqual(r["content"], "line 3\nline 4\nline 5\n")
                self.assertEqual((r["total_lines"], r["truncated"]), (10, True))
                self.assertEqual(r["entry"]["generation"], gen)

                st = await self.ok(s, "nokv_stat", {**ws, "path": "rt/notes.txt"})
                self.assertEqual(st["sha256"], hashlib.sha256(body.encode()).hexdigest())

                e2 = await self.ok(s, "nokv_write", {**ws, "path": "rt/notes.txt",
                                                     "content": "v2\n", "if_generation": gen})
                self.assertGreater(e2["generation"], gen)
                # A writer still holding the old generation is refused, and told why.
                text = await self.fails(s, "nokv_write", {**ws, "path": "rt/notes.txt",
                                                          "content": "lost update\n",
                                                          "if_generation": gen},
                                        "GenerationMismatch")
                self.assertIn("read it again", text)
                r = await self.ok(s, "nokv_read", {**ws, "path": "rt/notes.txt"})
                self.assertEqual(r["content"], "v2\n")

                page = await self.ok(s, "nokv_list", {**ws, "prefix": "rt/"})
                self.assertEqual([x["path"] for x in page["entries"]], ["rt/notes.txt"])

                await self.fails(s, "nokv_delete", {**ws, "path": "rt/notes.txt",
                                                    "if_generation": gen}, "GenerationMismatch")
                d = await self.ok(s, "nokv_delete", {**ws, "path": "rt/notes.txt"})
                self.assertEqual(d["deleted_generation"], e2["generation"])
                await self.fails(s, "nokv_read", {**ws, "path": "rt/notes.txt"}, "NotFound")

        asyncio.run(go())

    def test_edit_replaces_exactly_one_match_and_refuses_zero_two_or_a_stale_generation(self):
        async def go():
            async with self.session("--workspace", "agent") as s:
                e = await self.ok(s, "nokv_write", {"path": "ed/a.py",
                                                    "content": "x = 1\ny = 1\nz = 2\n"})
                gen = e["generation"]
                text = await self.fails(s, "nokv_edit", {"path": "ed/a.py", "old": "w = 9",
                                                         "new": "w = 0"}, "MatchCount")
                self.assertIn("occurs 0 times", text)
                text = await self.fails(s, "nokv_edit", {"path": "ed/a.py", "old": "= 1",
                                                         "new": "= 3"}, "MatchCount")
                self.assertIn("occurs 2 times", text)
                e2 = await self.ok(s, "nokv_edit", {"path": "ed/a.py", "old": "z = 2",
                                                    "new": "z = 3", "if_generation": gen})
                self.assertGreater(e2["generation"], gen)
                await self.fails(s, "nokv_edit", {"path": "ed/a.py", "old": "z = 3",
                                                  "new": "z = 4", "if_generation": gen},
                                 "GenerationMismatch")
                r = await self.ok(s, "nokv_read", {"path": "ed/a.py"})
                self.assertEqual(r["content"], "x = 1\ny = 1\nz = 3\n")

        asyncio.run(go())

    def test_append_find_and_grep_work_on_the_server(self):
        async def go():
            async with self.session("--workspace", "agent") as s:
                await self.ok(s, "nokv_append", {"path": "fg/log.txt", "content": "one\n"})
                e = await self.ok(s, "nokv_append", {"path": "fg/log.txt", "content": "two\n"})
                self.assertEqual(e["size"], len("one\ntwo\n"))
                await self.ok(s, "nokv_write", {"path": "fg/src/m.rs",
                                                "content": "fn main() {\n    todo!()\n}\n"})
                await self.ok(s, "nokv_write", {"path": "fg/src/n.rs",
                                                "content": "// TODO later\n"})
                # Outside path_glob: must not be searched.
                await self.ok(s, "nokv_write", {"path": "elsewhere/todo.rs",
                                                "content": "todo outside\n"})
                found = await self.ok(s, "nokv_find", {"glob": "fg/**/*.rs"})
                self.assertEqual(sorted(x["path"] for x in found["entries"]),
                                 ["fg/src/m.rs", "fg/src/n.rs"])
                g = await self.ok(s, "nokv_grep", {"regex": "todo", "path_glob": "fg/**",
                                                   "ignore_case": True, "context_lines": 1})
                hits = sorted((m["path"], m["line_number"]) for m in g["matches"])
                self.assertEqual(hits, [("fg/src/m.rs", 2), ("fg/src/n.rs", 1)])
                m = next(m for m in g["matches"] if m["path"] == "fg/src/m.rs")
                self.assertEqual((m["before"], m["after"]), (["fn main() {"], ["}"]))
                capped = await self.ok(s, "nokv_grep", {"regex": "o", "path_glob": "fg/**",
                                                        "max_matches": 1})
                self.assertEqual(len(capped["matches"]), 1)
                self.assertEqual(capped["summary"]["truncated_by"], "max_matches")
                # A trailing / is the directory's contents; the bare name matches no path,
                # and the answer says which glob would have.
                under = await self.ok(s, "nokv_find", {"glob": "fg/src/"})
                self.assertEqual(sorted(x["path"] for x in under["entries"]),
                                 ["fg/src/m.rs", "fg/src/n.rs"])
                bare = await s.call_tool("nokv_find", {"glob": "fg/src"})
                self.assertEqual(bare.structured_content["entries"], [])
                self.assertIn('no path is "fg/src"; if it is a directory, everything under it '
                              'is the glob "fg/src/"', text_of(bare))
                g = await s.call_tool("nokv_grep", {"regex": "todo", "path_glob": "fg/src"})
                self.assertEqual(g.structured_content["matches"], [])
                self.assertIn('is the glob "fg/src/"', text_of(g))

        asyncio.run(go())

    def test_read_only_mode_lists_no_writing_tool_and_refuses_a_call_to_one(self):
        async def go():
            async with self.session("--workspace", "agent") as s:
                await self.ok(s, "nokv_write", {"path": "ro/kept.txt", "content": "kept\n"})
            async with self.session("--workspace", "agent", "--read-only") as s:
                names = {t.name for t in (await s.list_tools()).tools}
                await self.fails(s, "nokv_write", {"path": "ro/kept.txt", "content": "gone\n"},
                                 "ReadOnly")
                await self.fails(s, "nokv_delete", {"path": "ro/kept.txt"}, "ReadOnly")
                r = await self.ok(s, "nokv_read", {"path": "ro/kept.txt"})
            return names, r

        names, r = asyncio.run(go())
        # nokv_restore writes files on this machine: gone too, unless --allow-restore.
        self.assertEqual(names, TOOLS - WRITING_TOOLS - {"nokv_restore"})
        self.assertEqual(r["content"], "kept\n")

    def test_read_only_refuses_restore_unless_allow_restore_is_given(self):
        dest = self.dir / "ro-restore.bin"

        async def go():
            async with self.session("--workspace", "agent", "--read-only") as s:
                text = await self.fails(s, "nokv_restore", {"path": "a.bin",
                                                            "local_path": str(dest)},
                                        "ReadOnly")
            async with self.session("--workspace", "agent", "--read-only",
                                    "--allow-restore") as s:
                names = {t.name for t in (await s.list_tools()).tools}
            return text, names

        text, names = asyncio.run(go())
        self.assertIn("--allow-restore", text)
        self.assertFalse(dest.exists())
        self.assertEqual(names, TOOLS - WRITING_TOOLS)

    def test_restore_never_replaces_an_existing_local_file_unless_overwrite_is_true(self):
        source = self.dir / "art.bin"
        source.write_bytes(os.urandom(5 * MIB + 7))
        dest = self.dir / "notes.txt"
        dest.write_bytes(b"my notes, not an artifact\n")
        os.chmod(dest, 0o600)
        before = dest.read_bytes()

        async def go():
            async with self.session("--workspace", "agent") as s:
                await self.ok(s, "nokv_publish", {"path": "ow/art.bin",
                                                  "local_path": str(source)})
                text = await self.fails(s, "nokv_restore", {"path": "ow/art.bin",
                                                            "local_path": str(dest)},
                                        "LocalRefused")
                untouched = dest.read_bytes()
                done = await self.ok(s, "nokv_restore", {"path": "ow/art.bin",
                                                         "local_path": str(dest),
                                                         "overwrite": True})
                return text, untouched, done

        text, untouched, done = asyncio.run(go())
        self.assertIn("overwrite", text)
        self.assertEqual(untouched, before, "the existing file is left byte for byte")
        self.assertEqual(dest.read_bytes(), source.read_bytes())
        self.assertEqual(done["sha256"], hashlib.sha256(source.read_bytes()).hexdigest())

    def test_publish_refuses_a_device_a_fifo_or_a_directory_before_reading_it(self):
        fifo = self.dir / "pipe"
        os.mkfifo(fifo)

        async def go():
            texts = []
            # /dev/zero is outside the default root (the test's directory).
            async with self.session("--workspace", "agent", "--local-root", "/") as s:
                for local in ("/dev/zero", str(fifo), str(self.dir)):
                    texts.append(await self.fails(s, "nokv_publish", {
                        "path": "bad/x.bin", "local_path": local}, "LocalRefused"))
            return texts

        texts = asyncio.run(go())
        self.assertIn("a device", texts[0])
        self.assertIn("a FIFO", texts[1])
        self.assertIn("a directory", texts[2])

    def test_local_root_refuses_every_escape_naming_its_rule_and_leaves_outside_files_untouched(self):
        base = self.dir / "escape"
        root = base / "root"
        (root / "sub").mkdir(parents=True)
        outside = base / "outside.txt"
        outside.write_bytes(os.urandom(4096))
        os.chmod(outside, 0o600)
        before = outside.read_bytes()
        (root / "art.bin").write_bytes(os.urandom(MIB + 3))
        os.symlink("../outside.txt", root / "up_link")
        os.symlink(str(outside), root / "abs_link")
        os.symlink(str(base), root / "dir_out")
        dotdot, absolute, symlink = "through `..`", "absolute path outside", "symbolic link"
        reads = [("../outside.txt", dotdot), ("sub/../../outside.txt", dotdot),
                 (str(outside), absolute), ("/etc/passwd", absolute),
                 ("up_link", symlink), ("abs_link", symlink), ("dir_out/outside.txt", symlink)]
        writes = reads[:3] + [("abs_link", symlink), ("up_link", symlink),
                              ("dir_out/outside.txt", symlink), ("dir_out/new.bin", symlink)]

        async def go():
            refusals = []
            async with self.session("--workspace", "agent", "--local-root", str(root)) as s:
                await self.ok(s, "nokv_publish", {"path": "esc/art.bin",
                                                  "local_path": "art.bin"})
                for local, rule in reads:
                    text = await self.fails(s, "nokv_publish", {
                        "path": "esc/stolen.bin", "local_path": local}, "OutsideLocalRoot")
                    refusals.append((local, rule, text))
                for local, rule in writes:
                    text = await self.fails(s, "nokv_restore", {
                        "path": "esc/art.bin", "local_path": local, "overwrite": True},
                        "OutsideLocalRoot")
                    refusals.append((local, rule, text))
                await self.fails(s, "nokv_stat", {"path": "esc/stolen.bin"}, "NotFound")
            return refusals

        for local, rule, text in asyncio.run(go()):
            self.assertIn(f"escapes --local-root {root}", text, local)
            self.assertIn(rule, text, local)
        self.assertEqual(outside.read_bytes(), before, "the file outside is left byte for byte")
        self.assertEqual(sorted(p.name for p in base.iterdir()), ["outside.txt", "root"])

    def test_publish_and_restore_inside_the_default_local_root_work_relative_or_absolute(self):
        # The default root is the directory `nokv mcp` starts in: the test's directory.
        source = self.dir / "inroot" / "data.bin"
        source.parent.mkdir()
        source.write_bytes(os.urandom(2 * MIB + 1))

        async def go():
            async with self.session("--workspace", "agent") as s:
                await self.ok(s, "nokv_publish", {"path": "inroot/data.bin",
                                                  "local_path": "inroot/data.bin"})
                rel = await self.ok(s, "nokv_restore", {"path": "inroot/data.bin",
                                                        "local_path": "inroot/copy.bin"})
                ab = await self.ok(s, "nokv_restore", {
                    "path": "inroot/data.bin",
                    "local_path": str(self.dir / "inroot" / "copy2.bin")})
                return rel, ab

        rel, ab = asyncio.run(go())
        digest = hashlib.sha256(source.read_bytes()).hexdigest()
        self.assertEqual((rel["sha256"], ab["sha256"]), (digest, digest))
        for name in ("copy.bin", "copy2.bin"):
            self.assertEqual((self.dir / "inroot" / name).read_bytes(), source.read_bytes())

    def test_local_root_none_removes_publish_and_restore_and_refuses_a_call_to_either(self):
        dest = self.dir / "none-restore.bin"

        async def go():
            async with self.session("--workspace", "agent", "--local-root", "none") as s:
                names = {t.name for t in (await s.list_tools()).tools}
                texts = [await self.fails(s, tool, {"path": "a.bin", "local_path": str(dest)},
                                          "LocalRefused") for tool in sorted(LOCAL_FILE_TOOLS)]
            return names, texts

        names, texts = asyncio.run(go())
        self.assertEqual(names, TOOLS - LOCAL_FILE_TOOLS)
        for t in texts:
            self.assertIn("--local-root none", t)
        self.assertFalse(dest.exists())

    def test_a_token_for_another_workspace_gets_permission_denied_as_a_tool_error(self):
        async def go():
            async with self.session(token=self.other_token) as s:
                await self.fails(s, "nokv_read", {"workspace": "agent", "path": "hello.txt"},
                                 "PermissionDenied")
                await self.fails(s, "nokv_write", {"workspace": "agent", "path": "x.txt",
                                                   "content": "x"}, "PermissionDenied")
                # The same token still works where it is valid: the session survived.
                await self.ok(s, "nokv_write", {"workspace": "other", "path": "x.txt",
                                                "content": "x"})

        asyncio.run(go())

    def test_a_pinned_workspace_drops_the_argument_and_refuses_another_workspace(self):
        async def go():
            async with self.session("--workspace", "agent") as s:
                tools = (await s.list_tools()).tools
                text = await self.fails(s, "nokv_stat", {"workspace": "other", "path": "x"},
                                        "Usage")
                return tools, text

        tools, text = asyncio.run(go())
        for t in tools:
            self.assertNotIn("workspace", t.input_schema.get("properties", {}), t.name)
            self.assertNotIn("workspace", t.input_schema.get("required", []), t.name)
        self.assertIn("pinned", text)

    def test_without_a_pinned_workspace_every_tool_requires_a_workspace_string(self):
        async def go():
            async with self.session() as s:
                tools = (await s.list_tools()).tools
                # The runtime agrees with the schema: a call without one is refused.
                text = await self.fails(s, "nokv_stat", {"path": "x"}, "Usage")
                return tools, text

        tools, text = asyncio.run(go())
        self.assertEqual({t.name for t in tools}, TOOLS)
        for t in tools:
            self.assertIn("workspace", t.input_schema.get("required", []), t.name)
            self.assertEqual(t.input_schema["properties"]["workspace"]["type"], "string", t.name)
        self.assertIn("workspace", text)

    def test_every_tool_names_the_generation_it_must_still_have_if_generation_and_nothing_else(self):
        async def go():
            async with self.session() as s:
                return (await s.list_tools()).tools

        tools = {t.name: t for t in asyncio.run(go())}
        for name in ("nokv_write", "nokv_edit", "nokv_delete"):
            self.assertIn("if_generation", tools[name].input_schema["properties"], name)
        for t in tools.values():
            self.assertNotIn("expected_generation", json.dumps(t.input_schema), t.name)
            self.assertNotIn("expected_generation", t.description, t.name)

    def test_edit_takes_if_generation_and_still_accepts_expected_generation_as_its_alias(self):
        async def go():
            async with self.session("--workspace", "agent") as s:
                e = await self.ok(s, "nokv_write", {"path": "alias/a.txt",
                                                    "content": "a = 1\nb = 1\n"})
                gen = e["generation"]
                e2 = await self.ok(s, "nokv_edit", {"path": "alias/a.txt", "old": "a = 1",
                                                    "new": "a = 2", "if_generation": gen})
                # The old name: honoured, stale generations refused as with the new one.
                await self.fails(s, "nokv_edit", {"path": "alias/a.txt", "old": "b = 1",
                                                  "new": "b = 9", "expected_generation": gen},
                                 "GenerationMismatch")
                e3 = await self.ok(s, "nokv_edit", {"path": "alias/a.txt", "old": "b = 1",
                                                    "new": "b = 2",
                                                    "expected_generation": e2["generation"]})
                await self.fails(s, "nokv_edit", {"path": "alias/a.txt", "old": "a = 2",
                                                  "new": "a = 9", "if_generation": gen},
                                 "GenerationMismatch")
                # Both names at once is one argument given twice.
                both = await self.fails(s, "nokv_edit", {
                    "path": "alias/a.txt", "old": "a = 2", "new": "a = 3",
                    "if_generation": e3["generation"],
                    "expected_generation": e3["generation"]}, "InvalidArgument")
                r = await self.ok(s, "nokv_read", {"path": "alias/a.txt"})
                return e3, both, r

        e3, both, r = asyncio.run(go())
        self.assertIn("if_generation", both)
        self.assertEqual(r["content"], "a = 2\nb = 2\n")
        self.assertEqual(r["entry"]["generation"], e3["generation"])

    def test_every_numeric_argument_publishes_its_minimum_and_maximum(self):
        async def go():
            async with self.session() as s:
                return (await s.list_tools()).tools

        found = {}
        for t in asyncio.run(go()):
            for prop, schema in t.input_schema["properties"].items():
                types = schema.get("type")
                types = types if isinstance(types, list) else [types]
                if "integer" in types or "number" in types:
                    found[(t.name, prop)] = (schema.get("minimum"), schema.get("maximum"))
        self.assertEqual(found, NUMERIC_BOUNDS)

    def test_numeric_arguments_at_their_bounds_reach_the_daemon_and_past_them_are_refused(self):
        async def go():
            async with self.session("--workspace", "agent") as s:
                await self.ok(s, "nokv_write", {"path": "bounds/f.txt", "content": "x\n"})
                # The schema's maxima are accepted by the daemon itself.
                await self.ok(s, "nokv_list", {"prefix": "bounds/", "limit": 1000})
                await self.ok(s, "nokv_find", {"glob": "bounds/**", "limit": 1000})
                await self.ok(s, "nokv_grep", {"regex": "x", "path_glob": "bounds/**",
                                               "max_matches": 10000, "context_lines": 10})
                await self.ok(s, "nokv_read", {"path": "bounds/f.txt", "limit": 1})
                refusals = []
                for tool, args in [
                    ("nokv_list", {"limit": 0}),
                    ("nokv_list", {"limit": 1001}),
                    ("nokv_find", {"glob": "**", "limit": 1001}),
                    ("nokv_grep", {"regex": "x", "max_matches": 0}),
                    ("nokv_grep", {"regex": "x", "max_matches": 10001}),
                    ("nokv_grep", {"regex": "x", "context_lines": 11}),
                    ("nokv_grep", {"regex": "x", "context_lines": -1}),
                    ("nokv_read", {"path": "bounds/f.txt", "limit": 0}),
                    ("nokv_read", {"path": "bounds/f.txt", "offset": 1.5}),
                    ("nokv_edit", {"path": "bounds/f.txt", "old": "x", "new": "y",
                                   "if_generation": 0}),
                    ("nokv_delete", {"path": "bounds/f.txt", "if_generation": 0}),
                    ("nokv_list", {"limit": "100"}),
                    ("nokv_list", {"limit": 2 ** 70}),
                ]:
                    text = await self.fails(s, tool, args, "InvalidArgument")
                    refusals.append((tool, args, text))
                # The session survived every refusal, and nothing was changed.
                r = await self.ok(s, "nokv_read", {"path": "bounds/f.txt"})
                return refusals, r

        refusals, r = asyncio.run(go())
        for tool, args, text in refusals:
            (prop,) = [k for k in args if (tool, k) in NUMERIC_BOUNDS]
            lo, hi = NUMERIC_BOUNDS[(tool, prop)]
            self.assertIn(prop, text, (tool, args))
            self.assertIn(f"from {lo} to {hi}" if hi is not None else f"at least {lo}", text,
                          (tool, args))
        self.assertEqual(r["content"], "x\n")

    def test_without_a_usable_configuration_the_server_answers_and_every_call_says_what_to_fix(self):
        home = self.dir / "empty-home"
        home.mkdir()
        missing = self.dir / "no-such-config.toml"

        async def go(env):
            async with self.bare_session(env) as s:
                names = {t.name for t in (await s.list_tools()).tools}
                stat = await s.call_tool("nokv_stat", {"workspace": "agent", "path": "x"})
                health = await s.call_tool("nokv_health", {"workspace": "agent"})
                return names, stat, health

        for env, named in [({"HOME": str(home)}, "NOKV_CA"),
                           ({"HOME": str(home), "NOKV_CONFIG": str(missing)}, str(missing))]:
            names, stat, health = asyncio.run(go(env))
            self.assertEqual(names, TOOLS, env)
            for r in (stat, health):
                text = text_of(r)
                self.assertTrue(r.is_error, text)
                self.assertEqual(r.structured_content["error"]["reason"], "NotConfigured", text)
                self.assertTrue(text.startswith("NotConfigured: "), text)
                # The problem: the missing setting, or the missing file.
                self.assertIn(named, text)
                # The fix: which settings to give, and where.
                for setting in ("NOKV_ENDPOINT", "NOKV_CA", "NOKV_TOKEN", "NOKV_CONFIG",
                                "restart"):
                    self.assertIn(setting, text)

    def test_health_says_whether_it_made_the_admin_check_or_the_route_check(self):
        async def go():
            async with self.session(token=self.admin) as s:
                admin = await self.ok(s, "nokv_health", {"workspace": "agent"})
            async with self.session("--workspace", "agent") as s:
                route = await self.ok(s, "nokv_health", {})
            return admin, route

        admin, route = asyncio.run(go())
        self.assertEqual((admin["check"], admin["status"]), ("admin_health", "SERVING"))
        self.assertEqual((route["check"], route["workspace"]), ("route", "agent"))

    def test_a_publish_interrupted_mid_upload_resumes_when_the_same_call_is_retried(self):
        source = self.dir / "model.bin"
        # 10 blocks of 4 MiB, the last one partial. The tool keeps 4 blocks in flight, so when
        # the crash point fires on the 2nd acknowledged block at most 5 have been sent: the
        # retry must still send some, and must skip the acknowledged ones.
        source.write_bytes(os.urandom(36 * MIB + 12345))
        args = {"path": "artifacts/model.bin", "local_path": str(source)}

        async def interrupted():
            async with self.session("--workspace", "agent",
                                    env={"NOKV_TEST_EXIT_AFTER_BLOCKS": "2"}) as s:
                await s.call_tool("nokv_publish", args)

        async def retried():
            async with self.session("--workspace", "agent") as s:
                first = await self.ok(s, "nokv_publish", args)
                again = await self.ok(s, "nokv_publish", args)
                dest = self.dir / "restored.bin"
                restored = await self.ok(s, "nokv_restore", {"path": args["path"],
                                                             "local_path": str(dest)})
                return first, again, restored, dest

        # The crash point kills `nokv mcp` after its 2nd block: the call never answers.
        with self.assertRaises(Exception):
            asyncio.run(interrupted())
        first, again, restored, dest = asyncio.run(retried())
        self.assertEqual(first["block_count"], 10)
        self.assertFalse(first["already_committed"])
        self.assertGreaterEqual(first["blocks_skipped"], 2)
        self.assertGreaterEqual(first["blocks_sent"], 1)
        self.assertLess(first["blocks_sent"], first["block_count"])
        self.assertEqual(first["blocks_sent"] + first["blocks_skipped"], first["block_count"])
        self.assertTrue(again["already_committed"])
        self.assertEqual(again["blocks_sent"], 0)
        self.assertEqual(restored["sha256"], hashlib.sha256(source.read_bytes()).hexdigest())
        self.assertEqual(dest.read_bytes(), source.read_bytes())


if __name__ == "__main__":
    unittest.main()
