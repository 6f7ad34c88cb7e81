# Sourced by scripts/run and scripts/test: create or reuse .venv and install the project
# into it (again only when pyproject.toml changed).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${PIN_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "pin-orchestration needs Python 3.11+; set PYTHON=/path/to/python3.11" >&2
  exit 1
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "creating virtual environment in $VENV" >&2
  "$PYTHON" -m venv "$VENV"
fi
STAMP="$VENV/.pin-installed"
# The checkout's path is part of the stamp: the project is installed editable, so a venv
# shared between checkouts (PIN_VENV, as .ci/run keeps one) must point at this one.
WANT="$( (cat "$ROOT/pyproject.toml"; echo "$ROOT") | sha256sum | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
  echo "installing pin-orchestration and its dependencies into $VENV" >&2
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  "$VENV/bin/python" -m pip install --quiet -e "$ROOT[dev]"
  echo "$WANT" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
cd "$ROOT"
