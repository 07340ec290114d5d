#!/usr/bin/env bash
# Install packages into a virtual environment, the way scripts/setup.sh installs Dressage:
#
#   bash scripts/venv-install.sh PYTHON ARGS...     (PYTHON: the venv's python; ARGS: pip install's)
#
# By uv (.venv/bin/uv: pinned and hash-checked by scripts/setup.sh, from scripts/uv-requirements.txt),
# compiling to bytecode as pip does; by pip where that uv is not there. uv resolves as pip does here
# (checked: the same packages and versions) in a fraction of its time (docs/test-speed.md).
set -euo pipefail
cd "$(dirname "$0")/.."
python=$1
shift
if [ -x .venv/bin/uv ]; then
  exec .venv/bin/uv pip install -q --compile-bytecode --python "$python" "$@"
fi
exec "$python" -m pip install -q "$@"
