#!/usr/bin/env bash
# Create .cache/upstream-venv: a separate Python environment holding a legacy-era MCP SDK (1.x).
#
# Most MCP servers in the wild are built on SDK 1.x and only speak the initialize
# handshake (protocol <= 2025-11-25); ours is 2.3.0. tests/server/upstream/test_proxying.py runs a
# 1.x server from this venv as an upstream, to prove UpstreamServer falls back to the
# handshake. It cannot share our venv (mcp 1.x and 2.x conflict), hence its own.
#
# Idempotent: does nothing when the venv already has the wanted version. Prints the
# venv's python on the last line. Override with UPSTREAM_VENV, UPSTREAM_MCP_VERSION, PYTHON.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${UPSTREAM_VENV:-$ROOT/.cache/upstream-venv}"
VERSION="${UPSTREAM_MCP_VERSION:-1.30.0}"
PYTHON="${PYTHON:-python3}"

have_version() {
    "$VENV/bin/python" - "$VERSION" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
sys.exit(0 if version("mcp") == sys.argv[1] else 1)
PY
}

if [ -x "$VENV/bin/python" ] && have_version; then
    echo "$VENV/bin/python"
    exit 0
fi

echo "creating $VENV with mcp==$VERSION" >&2
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install --quiet --disable-pip-version-check "mcp==$VERSION" >&2
have_version
echo "$VENV/bin/python"
