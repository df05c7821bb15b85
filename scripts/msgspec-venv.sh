#!/usr/bin/env bash
# Makes, once, a Python virtual environment holding msgspec, for tests/core/kv_events_msgspec.py
# (the library vLLM declares and encodes its KV events with). Idempotent: a venv that already
# imports msgspec is left as it is.
#   scripts/msgspec-venv.sh DIR    # prints DIR/bin/python
# Exits 77 (ctest's skip) when the venv or the package cannot be installed (no network, no venv module).
set -uo pipefail
dir=${1:?usage: msgspec-venv.sh DIR}
version=0.22.0  # the release the test was written against
if "$dir/bin/python" -c "import msgspec" 2>/dev/null; then
  echo "$dir/bin/python"
  exit 0
fi
mkdir -p "$(dirname "$dir")" && python3 -m venv "$dir" >&2 || { echo "msgspec-venv.sh: python3 -m venv $dir failed" >&2; exit 77; }
"$dir/bin/python" -m pip install -q --disable-pip-version-check "msgspec==$version" >&2 ||
  { echo "msgspec-venv.sh: pip could not install msgspec==$version into $dir" >&2; exit 77; }
echo "$dir/bin/python"
