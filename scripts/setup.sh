#!/usr/bin/env bash
# Set up Dressage in ./.venv: Python >= 3.11, the CPU build of torch 2.13.0 (a looser pin would pull a
# multi-GB CUDA build), and the package with all extras. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

find_python() {
  for candidate in "${PYTHON:-}" python3.11 python3.12 python3.13 python3; do
    [ -n "$candidate" ] || continue
    if command -v "$candidate" >/dev/null 2>&1 &&
      "$candidate" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
      echo "$candidate"
      return 0
    fi
  done
  echo "error: Dressage needs Python >= 3.11; set PYTHON=/path/to/python3.11" >&2
  return 1
}

if [ ! -x .venv/bin/python ]; then
  "$(find_python)" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
  .venv/bin/python -m pip install -q torch==2.13.0
fi
.venv/bin/python -m pip install -q -e '.[all]'
echo "Dressage is installed in .venv (dressage-worker: .venv/bin/dressage-worker)"
