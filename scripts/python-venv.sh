#!/usr/bin/env bash
# Makes, once, a Python virtual environment holding one package pinned to a release, for the tests
# that drive pagedkv through a Python library (tests/core/kv_events_msgspec.sh: msgspec;
# tests/runner/serve_openai_test.py: the official openai client). Idempotent: a venv that already
# imports the package is left as it is.
#   scripts/python-venv.sh DIR PACKAGE==VERSION    # prints DIR/bin/python
# Exits 77 (ctest's skip) when the venv or the package cannot be installed (no network, no venv module).
set -uo pipefail
dir=${1:?usage: python-venv.sh DIR PACKAGE==VERSION}
spec=${2:?usage: python-venv.sh DIR PACKAGE==VERSION}
package=${spec%%==*}
if [[ $package == "$spec" || -z ${spec#*==} ]]; then
  echo "python-venv.sh: '$spec' is not PACKAGE==VERSION" >&2
  exit 2
fi
if "$dir/bin/python" -c "import $package" 2>/dev/null; then
  echo "$dir/bin/python"
  exit 0
fi
mkdir -p "$(dirname "$dir")" && python3 -m venv "$dir" >&2 || { echo "python-venv.sh: python3 -m venv $dir failed" >&2; exit 77; }
"$dir/bin/python" -m pip install -q --disable-pip-version-check "$spec" >&2 ||
  { echo "python-venv.sh: pip could not install $spec into $dir" >&2; exit 77; }
echo "$dir/bin/python"
