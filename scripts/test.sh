#!/usr/bin/env bash
# The one test command: installs the external services the black-box tests need (etcd,
# moto's S3 server) when they are missing, builds every binary the tests run, then runs
# all Rust and Python tests. Safe to run repeatedly: installed tools are detected and skipped.
set -euo pipefail

start=$(date +%s)
# Tests locate binaries and scripts relative to the repository, so run from its root.
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Root runs apt-get directly; otherwise use sudo when it exists (and fail loudly if not).
as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        echo "scripts/test.sh: need root or sudo to run: $*" >&2
        return 1
    fi
}

install_etcd() {
    if command -v etcd >/dev/null 2>&1 || [ -x /usr/bin/etcd ]; then
        echo "scripts/test.sh: etcd present, skipping install"
        return
    fi
    echo "scripts/test.sh: installing etcd-server"
    as_root apt-get update
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y etcd-server
}

# promtool (Debian's prometheus package), which scripts/tests/test_metrics.py lints /metrics
# with. Only the binary is used; the package's service is never started by the tests.
install_promtool() {
    if command -v promtool >/dev/null 2>&1; then
        echo "scripts/test.sh: promtool present, skipping install"
        return
    fi
    echo "scripts/test.sh: installing prometheus (for promtool)"
    as_root apt-get update
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus
}

# A pyenv shim for moto_server can exist without the package behind it, so check both
# that the module imports and that the entry point actually runs.
moto_ok() {
    python3 -c 'import moto.server' >/dev/null 2>&1 && moto_server --help >/dev/null 2>&1
}

install_moto() {
    if moto_ok; then
        echo "scripts/test.sh: moto_server present, skipping install"
        return
    fi
    echo "scripts/test.sh: installing moto[server]"
    python3 -m pip install --quiet 'moto[server]'
    # pyenv needs its shims regenerated to expose a newly installed entry point.
    if command -v pyenv >/dev/null 2>&1; then
        pyenv rehash || true
    fi
    moto_ok || { echo "scripts/test.sh: moto_server still not runnable after install" >&2; exit 1; }
}

# The MCP client from PyPI that scripts/tests/test_mcp.py drives `nokv mcp` with.
install_mcp() {
    if python3 -c 'import mcp.client.stdio' >/dev/null 2>&1; then
        echo "scripts/test.sh: python mcp present, skipping install"
        return
    fi
    echo "scripts/test.sh: installing mcp"
    python3 -m pip install --quiet mcp
    python3 -c 'import mcp.client.stdio' || { echo "scripts/test.sh: mcp still not importable after install" >&2; exit 1; }
}

# The reference Prometheus text-format parser that scripts/tests/test_metrics.py checks
# /metrics with.
install_prometheus_client() {
    if python3 -c 'import prometheus_client.parser' >/dev/null 2>&1; then
        echo "scripts/test.sh: python prometheus_client present, skipping install"
        return
    fi
    echo "scripts/test.sh: installing prometheus_client"
    python3 -m pip install --quiet prometheus_client
    python3 -c 'import prometheus_client.parser' || { echo "scripts/test.sh: prometheus_client still not importable after install" >&2; exit 1; }
}

install_etcd
install_promtool
install_moto
install_mcp
install_prometheus_client

# Arrows point one way: no import cycle between the files of a crate (the check first proves
# it can see one, on a planted cycle).
python3 scripts/check_cycles.py --self-test
python3 scripts/check_cycles.py
# Only `meta` names redb and only `object` names object_store, tests included.
python3 scripts/check_boundaries.py --self-test
python3 scripts/check_boundaries.py

cargo build --workspace --bins
cargo test --workspace

if [ -d scripts/tests ]; then
    # Required here: a missing `mcp`/`prometheus_client` package or binary fails its test
    # instead of skipping it.
    NOKV_TEST_REQUIRE_MCP=1 python3 -m unittest discover -s scripts/tests -v
fi

if [ -f scripts/probe_smoke.sh ]; then
    bash scripts/probe_smoke.sh
fi

echo "scripts/test.sh: all tests passed in $(( $(date +%s) - start )) s"
