#!/usr/bin/env bash
# Install the agent CLIs that Crucible's built-in presets run, at pinned versions, into DIR:
#   DIR/node_modules/.bin/claude and DIR/node_modules/.bin/codex   (npm --prefix DIR)
#   DIR/aider/bin/aider                                            (a venv of its own)
# Usage: scripts/install_agent_clis.sh [DIR]   (default: var/agent-clis)
# Needs node/npm and Python 3.10-3.12 (PYTHON overrides the interpreter). Safe to run twice:
# a CLI already at its pinned version is left alone.
set -Eeuo pipefail

CLAUDE_CODE_VERSION=2.1.332
CODEX_VERSION=0.171.0
AIDER_VERSION=0.86.2

cd "$(dirname "${BASH_SOURCE[0]}")/.."
dir=${1:-var/agent-clis}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

installed_npm_version() {
    node -p "require(process.argv[1]).version" "$dir/node_modules/$1/package.json" 2>/dev/null || true
}

wanted=()
[[ "$(installed_npm_version @anthropic-ai/claude-code)" == "$CLAUDE_CODE_VERSION" ]] \
    || wanted+=("@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION")
[[ "$(installed_npm_version @openai/codex)" == "$CODEX_VERSION" ]] \
    || wanted+=("@openai/codex@$CODEX_VERSION")
if ((${#wanted[@]})); then
    # --save-exact keeps DIR/package.json pinned, so a later install of one CLI keeps the other.
    npm install --prefix "$dir" --save-exact --no-audit --no-fund "${wanted[@]}"
fi
echo "claude: $("$dir/node_modules/.bin/claude" --version)"
echo "codex: $("$dir/node_modules/.bin/codex" --version)"

if [[ "$("$dir/aider/bin/aider" --version 2>/dev/null || true)" != "aider $AIDER_VERSION" ]]; then
    # aider-chat supports Python 3.10-3.12 only; Debian 12's python3 is 3.11.
    python=${PYTHON:-$(command -v python3.11 || command -v python3)}
    "$python" -m venv "$dir/aider"
    "$dir/aider/bin/python" -m pip install --quiet --upgrade pip
    "$dir/aider/bin/python" -m pip install --quiet "aider-chat==$AIDER_VERSION"
fi
echo "aider: $("$dir/aider/bin/aider" --version)"
