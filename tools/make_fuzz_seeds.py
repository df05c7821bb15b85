#!/usr/bin/env python3
"""Writes the seed corpus of the runner's fuzz targets under tests/fuzz/corpus/: small valid inputs
that reach deep into each parser, so that fuzzing starts from files that parse.

  gguf/         tiny LLaMA GGUFs: config metadata, a byte-level BPE or SentencePiece vocabulary
                (from the tiny tokenizers in tests/runner/golden) and one tensor of each supported
                type (F32, F16, BF16, Q4_0, Q4_1, Q8_0)
  safetensors/  tiny safetensors files (F32, F16, BF16, I64, metadata, an empty tensor) and a
                config.json, which the same target also parses
  tokenizer/    first byte 0 or 1: text for the byte-level or SentencePiece tokenizer; 2: a
                tokenizer.json

Needs `gguf` and `numpy` (PyPI). Run from the repository root:  python3 tools/make_fuzz_seeds.py
"""
import json
import os
import struct

import gguf
import numpy as np

CORPUS = os.path.join("tests", "fuzz", "corpus")
GOLDEN = os.path.join("tests", "runner", "golden")


def write_gguf(path, tokenizer_json, spm):
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(2)
    writer.add_context_length(256)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(128)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    model = tokenizer_json["model"]
    vocab = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    tokens = [t for t, _ in vocab]
    special = {a["content"] for a in tokenizer_json.get("added_tokens", [])}
    writer.add_tokenizer_model("llama" if spm else "gpt2")
    writer.add_token_list(tokens)
    if spm:
        writer.add_token_types([2 if t == "<unk>" else 3 if t in special else 6 if t.startswith("<0x") else 1 for t in tokens])
        writer.add_token_scores([-float(i) for i in range(len(tokens))])
        writer.add_bos_token_id(1)
        writer.add_unk_token_id(0)
        writer.add_add_space_prefix(True)
    else:
        writer.add_tokenizer_pre("smollm")
        writer.add_token_types([3 if t in special else 1 for t in tokens])
        merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
        writer.add_token_merges(merges[:64])
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
    rng = np.random.default_rng(0)
    values = rng.standard_normal((2, 64)).astype(np.float32)
    writer.add_tensor("output_norm.weight", values[0])
    writer.add_tensor("f16.weight", values.astype(np.float16))
    for qtype in (gguf.GGMLQuantizationType.BF16, gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q4_1,
                  gguf.GGMLQuantizationType.Q8_0):
        packed = gguf.quants.quantize(values, qtype)
        writer.add_tensor(f"{qtype.name.lower()}.weight", packed, raw_shape=packed.shape, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def safetensors_bytes(tensors, metadata=None):
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def main():
    for sub in ("gguf", "safetensors", "tokenizer"):
        os.makedirs(os.path.join(CORPUS, sub), exist_ok=True)
    with open(os.path.join(GOLDEN, "tiny_bpe.tokenizer.json")) as f:
        bpe = json.load(f)
    with open(os.path.join(GOLDEN, "tiny_spm.tokenizer.json")) as f:
        spm = json.load(f)
    write_gguf(os.path.join(CORPUS, "gguf", "tiny_byte_level.gguf"), bpe, spm=False)
    write_gguf(os.path.join(CORPUS, "gguf", "tiny_sentencepiece.gguf"), spm, spm=True)

    f32 = np.arange(6, dtype=np.float32)
    seeds = {
        "mixed.safetensors": safetensors_bytes([
            ("model.embed_tokens.weight", "F32", [2, 3], f32.tobytes()),
            ("model.norm.weight", "F16", [3], f32[:3].astype(np.float16).tobytes()),
            ("lm_head.weight", "BF16", [2], struct.pack("<HH", 0x3F80, 0xC0A0)),
            ("positions", "I64", [2], np.arange(2, dtype=np.int64).tobytes()),
            ("empty", "F32", [0, 4], b""),
        ], {"format": "pt"}),
        "config.json": json.dumps({
            "architectures": ["LlamaForCausalLM"], "hidden_size": 576, "intermediate_size": 1536,
            "max_position_embeddings": 8192, "model_type": "llama", "num_attention_heads": 9,
            "num_hidden_layers": 30, "num_key_value_heads": 3, "rms_norm_eps": 1e-05, "rope_theta": 100000,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192},
            "tie_word_embeddings": True, "vocab_size": 49152}).encode(),
    }
    for name, raw in seeds.items():
        with open(os.path.join(CORPUS, "safetensors", name), "wb") as f:
            f.write(raw)

    texts = ["Hello world, it's 2024!", "  a\t\tb\n\n c   ", "\u4f60\u597d \U0001f642 caf\u00e9 <|im_start|>user",
             "def f(x):\n    return x**2  # 12345"]
    for i, text in enumerate(texts):
        for mode in (0, 1):
            with open(os.path.join(CORPUS, "tokenizer", f"text_{mode}_{i}"), "wb") as f:
                f.write(bytes([mode]) + text.encode())
    for name in ("tiny_bpe", "tiny_spm"):
        with open(os.path.join(GOLDEN, f"{name}.tokenizer.json"), "rb") as src, \
                open(os.path.join(CORPUS, "tokenizer", f"json_{name}"), "wb") as f:
            f.write(b"\x02" + src.read())


if __name__ == "__main__":
    main()
