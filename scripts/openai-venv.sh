#!/usr/bin/env bash
# Makes, once, a Python virtual environment holding the official openai client, for
# tests/runner/serve_openai_test.py and bench/serve. Idempotent: a venv that already imports
# openai is left as it is.
#   scripts/openai-venv.sh DIR    # prints DIR/bin/python
# Exits 77 (ctest's skip) when the venv or the package cannot be installed (no network, no venv module).
set -uo pipefail
dir=${1:?usage: openai-venv.sh DIR}
version=3.57.0  # the release the test was written against
if "$dir/bin/python" -c "import openai" 2>/dev/null; then
  echo "$dir/bin/python"
  exit 0
fi
python3 -m venv "$dir" >&2 || { echo "openai-venv.sh: python3 -m venv $dir failed" >&2; exit 77; }
"$dir/bin/python" -m pip install -q --disable-pip-version-check "openai==$version" >&2 ||
  { echo "openai-venv.sh: pip could not install openai==$version into $dir" >&2; exit 77; }
echo "$dir/bin/python"
