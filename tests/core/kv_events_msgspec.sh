#!/usr/bin/env bash
# ctest's kv_events_msgspec: makes the msgspec venv once (exit 77, a skip, when pip cannot), writes
# the event batches with the C++ emitter, and decodes them with vLLM's declarations in Python.
#   kv_events_msgspec.sh EMITTER OUT_DIR VENV_DIR
set -uo pipefail
emit=${1:?} out=${2:?} venv=${3:?}
here=$(cd "$(dirname "$0")" && pwd)
py=$("$here/../../scripts/python-venv.sh" "$venv" msgspec==0.22.0) || exit $?  # the release the test was written against
rm -rf "$out"
"$emit" "$out" || exit 1
exec "$py" "$here/kv_events_msgspec.py" "$out"
