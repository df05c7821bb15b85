#!/usr/bin/env python3
"""Writes golden logits and greedy continuations from Hugging Face transformers, which the runner's
model tests (tests/runner/test_hf_golden.cpp) compare with the CPU model.

Needs torch, transformers (5.x), safetensors and numpy; `smollm2` also needs gguf (transformers'
GGUF loader dequantizes through it). The GPU machine has all but gguf, which travels as a wheel.
Everything runs on the CPU in float32 with eager attention, so the numbers do not depend on a GPU.

  python3 tools/make_hf_golden.py tiny [--out tests/runner/golden/hf_tiny]
      Random-weight LLaMAs, one folder each (config.json + model.safetensors as transformers
      saves them, golden.json + logits.f32): GQA, MQA with tied embeddings and an explicit
      head_dim, and the RoPE scalings linear, llama3 and yarn; weights in float32, bfloat16 and
      float16; a Mistral whose every layer has a sliding window of 24 tokens, and a Ministral
      whose layer_types interleave a 32-token window with full attention (both windows shorter
      than the longer prompts). Logits are stored for every position of every prompt.
      --only NAME makes just that model (the others are unchanged: each has its own seed).
  python3 tools/make_hf_golden.py smollm2 MODEL.gguf [--out tests/runner/golden/smollm2_logits.json]
      SmolLM2-135M-Instruct from the GGUF, dequantized by transformers/gguf-py: token ids of a few
      prompts, the top logits at every position and a greedy continuation.
"""
import argparse
import json
import os
import shutil
import tempfile

import numpy as np
import torch
import transformers
from transformers import (LlamaConfig, LlamaForCausalLM, MinistralConfig, MinistralForCausalLM, MistralConfig,
                          MistralForCausalLM)

torch.set_grad_enabled(False)

# name -> (LlamaConfig overrides, weight dtype). Small theta and original contexts of 32-64
# positions put the prompts (up to 97 tokens) well inside the range where each scaling matters.
TINY_MODELS = {
    "gqa": (dict(num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0), torch.float32),
    "mqa_tied": (dict(num_attention_heads=4, num_key_value_heads=1, head_dim=24, tie_word_embeddings=True,
                      rope_theta=500.0), torch.bfloat16),
    "linear": (dict(num_attention_heads=4, num_key_value_heads=2, rope_theta=1000.0,
                    rope_scaling={"rope_type": "linear", "factor": 2.5}), torch.float16),
    "llama3": (dict(num_attention_heads=8, num_key_value_heads=2, head_dim=16, rope_theta=500.0,
                    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 32}),
               torch.float32),
    "yarn": (dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=10000.0,
                  rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}),
             torch.float32),
    # Mistral: every layer windowed (transformers masks q - kv >= sliding_window).
    "mistral": (dict(num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0, sliding_window=24,
                     model_type="mistral"), torch.float32),
    # Ministral: layer_types interleave windowed and full layers, as Gemma 2/3 and GPT-OSS do.
    "ministral": (dict(num_attention_heads=4, num_key_value_heads=2, head_dim=8, rope_theta=10000.0,
                       sliding_window=32, num_hidden_layers=4,
                       layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
                       model_type="ministral"), torch.float32),
}
TINY_PROMPT_LENGTHS = [1, 9, 40, 97]
GREEDY_TOKENS = 16


def tiny_config(overrides):
    base = dict(vocab_size=80, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False,
                bos_token_id=None, eos_token_id=None, pad_token_id=None)
    base.update(overrides)
    model_type = base.pop("model_type", "llama")
    if model_type == "llama":
        return LlamaConfig(**base), LlamaForCausalLM
    base["rope_parameters"] = {"rope_type": "default", "rope_theta": base.pop("rope_theta")}
    if model_type == "mistral":
        return MistralConfig(**base), MistralForCausalLM
    return MinistralConfig(**base), MinistralForCausalLM


def randomize(model, generator):
    """Weights large enough that attention is far from uniform and logits spread (HF's 0.02 init is
    nearly a constant function); norms near 1."""
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=generator))
        elif "embed_tokens" in name:
            p.copy_(torch.randn(p.shape, generator=generator))
        else:
            p.copy_(torch.randn(p.shape, generator=generator) * (1.5 / p.shape[-1] ** 0.5))


def greedy(model, ids, count):
    ids = list(ids)
    out = []
    for _ in range(count):
        logits = model(torch.tensor([ids])).logits[0, -1]
        token = int(torch.argmax(logits))
        out.append(token)
        ids.append(token)
    return out


def make_tiny(out_root, only=None):
    os.makedirs(out_root, exist_ok=True)
    for index, (name, (overrides, dtype)) in enumerate(TINY_MODELS.items()):
        if only and name not in only:
            continue
        generator = torch.Generator().manual_seed(1000 + index)
        config, model_class = tiny_config(overrides)
        model = model_class(config).eval()
        randomize(model, generator)
        model.to(dtype)  # round the weights to the stored dtype, then compute in float32 from them
        folder = os.path.join(out_root, name)
        if os.path.isdir(folder):
            shutil.rmtree(folder)
        model.save_pretrained(folder, safe_serialization=True)
        for extra in os.listdir(folder):
            if extra not in ("config.json", "model.safetensors"):
                os.remove(os.path.join(folder, extra))
        model = model_class.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()

        prompts, blocks = [], []
        for length in TINY_PROMPT_LENGTHS:
            ids = torch.randint(0, config.vocab_size, (length,), generator=generator).tolist()
            logits = model(torch.tensor([ids])).logits[0].to(torch.float32).numpy()
            prompts.append({"ids": ids, "greedy": greedy(model, ids, GREEDY_TOKENS)})
            blocks.append(logits)
        np.concatenate(blocks).astype("<f4").tofile(os.path.join(folder, "logits.f32"))
        with open(os.path.join(folder, "golden.json"), "w") as f:
            json.dump({"transformers": transformers.__version__, "torch": torch.__version__,
                       "weights_dtype": str(dtype).removeprefix("torch."), "vocab_size": config.vocab_size,
                       "sliding_window": getattr(config, "sliding_window", None),
                       "logits": "logits.f32: float32 [sum of prompt lengths, vocab_size], prompts in order",
                       "prompts": prompts}, f, indent=1)
            f.write("\n")
        print(f"{name}: {sum(TINY_PROMPT_LENGTHS)} positions x {config.vocab_size}")


SMOLLM2_PROMPTS = [
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "The quick brown fox jumps over the lazy dog. In 1969, 3 astronauts",
    "def fib(n):\n    if n < 2:\n        return n\n",
]
SMOLLM2_TOP = 16
SMOLLM2_GREEDY = 24


def make_smollm2(gguf_path, out_path):
    folder, file_name = os.path.split(os.path.abspath(gguf_path))
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=file_name, dtype=torch.float32,
                                                              attn_implementation="eager").eval()
    tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=file_name)
    embed = model.get_input_embeddings().weight
    tied = torch.equal(model.lm_head.weight, embed)
    if not tied:  # the file has no output.weight: the head is the embedding (tie it if the loader did not)
        model.lm_head.weight = embed
    prompts = []
    for text in SMOLLM2_PROMPTS:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        logits = model(torch.tensor([ids])).logits[0].to(torch.float32)
        top = torch.topk(logits, SMOLLM2_TOP, dim=-1)
        prompts.append({"text": text, "ids": ids,
                        "top_ids": top.indices.tolist(),
                        "top_logits": [[round(float(v), 5) for v in row] for row in top.values],
                        "greedy": greedy(model, ids, SMOLLM2_GREEDY)})
    with open(out_path, "w") as f:
        json.dump({"model": file_name, "transformers": transformers.__version__, "torch": torch.__version__,
                   "head_tied_by_loader": tied, "top": SMOLLM2_TOP, "prompts": prompts}, f, indent=1)
        f.write("\n")
    for p in prompts:
        print(repr(p["text"][:40]), "->", tok.decode(p["greedy"]))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    tiny = sub.add_parser("tiny")
    tiny.add_argument("--out", default=os.path.join("tests", "runner", "golden", "hf_tiny"))
    tiny.add_argument("--only", action="append", choices=list(TINY_MODELS), help="make only this model (repeatable)")
    smol = sub.add_parser("smollm2")
    smol.add_argument("model")
    smol.add_argument("--out", default=os.path.join("tests", "runner", "golden", "smollm2_logits.json"))
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.what == "tiny":
        make_tiny(args.out, args.only)
    else:
        make_smollm2(args.model, args.out)


if __name__ == "__main__":
    main()
