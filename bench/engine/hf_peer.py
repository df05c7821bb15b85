#!/usr/bin/env python3
"""The engine's peer: Hugging Face transformers' own continuous batching (ContinuousBatchingManager,
paged SDPA) on a random bf16 LLaMA of a named shape, serving the same requests as
`pagedkv-llama --device cuda --bench` (the prompt lengths and output lengths it wrote with
--bench-workload-out). Timing only: random weights, EOS ignored.

    python3 hf_peer.py --shape llama2-7b --workload workload.json --out hf.json
"""
import argparse
import inspect
import json
import sys
import time

import torch
import transformers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

SHAPES = {  # the same shapes as examples/llama/cuda/model_shapes.cpp
    "llama2-7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=32, vocab_size=32000, rope_theta=10000.0, max_position_embeddings=4096),
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0, max_position_embeddings=8192),
    "llama2-13b": dict(hidden_size=5120, intermediate_size=13824, num_hidden_layers=40, num_attention_heads=40,
                       num_key_value_heads=40, vocab_size=32000, rope_theta=10000.0, max_position_embeddings=4096),
}


def build_model(shape: str) -> LlamaForCausalLM:
    config = LlamaConfig(**SHAPES[shape], rms_norm_eps=1e-5, tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    for name in ("paged|sdpa", "sdpa_paged"):  # the paged SDPA's name has changed across 5.x
        try:
            model.set_attn_implementation(name)
            return model.eval(), name
        except Exception as e:  # noqa: BLE001 -- try the next spelling
            last = e
    raise RuntimeError(f"no paged sdpa attention in transformers {transformers.__version__}: {last}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", required=True, choices=sorted(SHAPES))
    ap.add_argument("--workload", required=True, help="JSON: [{prompt: [ids], output_tokens: n}, ...]")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    requests = json.load(open(args.workload))
    model, attn = build_model(args.shape)
    gen = GenerationConfig(max_new_tokens=max(r["output_tokens"] for r in requests), do_sample=False,
                           eos_token_id=-1, pad_token_id=0)
    manager = model.init_continuous_batching(generation_config=gen)
    manager.start()
    # Warm-up (graph capture, allocator): one short request, not timed.
    manager.add_request(input_ids=requests[0]["prompt"][:8], max_new_tokens=4)
    while True:
        r = manager.get_result(timeout=60)
        if r is not None and r.is_finished():
            break
    start = time.perf_counter()
    ids = [manager.add_request(input_ids=r["prompt"], max_new_tokens=r["output_tokens"]) for r in requests]
    done, generated = 0, 0
    while done < len(ids):
        r = manager.get_result(timeout=600)
        if r is None:
            print(f"hf_peer: timed out with {done} of {len(ids)} done", file=sys.stderr)
            break
        if r.is_finished():
            done += 1
            generated += len(r.generated_tokens)
    seconds = time.perf_counter() - start
    manager.stop(block=True)
    prompt_tokens = sum(len(r["prompt"]) for r in requests)
    result = {"peer": f"transformers {transformers.__version__} ContinuousBatchingManager ({attn})",
              "shape": args.shape, "requests": len(requests), "finished": done, "prompt_tokens": prompt_tokens,
              "output_tokens": generated, "seconds": seconds, "output_tokens_per_s": generated / seconds,
              "total_tokens_per_s": (prompt_tokens + generated) / seconds,
              "gpu": torch.cuda.get_device_name(), "add_request": str(inspect.signature(manager.add_request))}
    json.dump(result, open(args.out, "w"), indent=1)
    print(json.dumps(result))
    return 0 if done == len(ids) else 1


if __name__ == "__main__":
    sys.exit(main())
