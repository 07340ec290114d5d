#!/usr/bin/env bash
# The SWE recipe's tools (recipes/swe/README.md): the 'swe' extra (SWE-bench's package) in .venv, and
# pytest for the system python3 that bubblewrap sandboxes see (/usr), which runs the sample's tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/venv-install.sh .venv/bin/python -e '.[swe]'
if ! /usr/bin/python3 -c 'import pytest' 2>/dev/null; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-pytest >/dev/null
  else
    echo "error: the SWE recipe's sandboxes need pytest for /usr/bin/python3 (Debian: apt-get install python3-pytest)" >&2
    exit 1
  fi
fi
