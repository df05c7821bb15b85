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
import random
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


# Strings the tokenizer tests encode: Unicode (accents, Cyrillic, CJK, RTL, emoji with modifiers and
# joiners, combining marks), whitespace runs of every kind, digits, contractions, code and special
# tokens, including near misses.
CORPUS = [
    "Hello world",
    "Hello, world! How are you today?",
    "The quick brown fox jumps over the lazy dog.",
    "",
    " ",
    "  ",
    "\n",
    "  leading spaces",
    "trailing spaces   ",
    "a  b   c    d     e",
    "\t\ttabs\tand\nnewlines\n\n\nend",
    "line one\r\nline two\r\n",
    "   \n   x \n\n  ",
    "word\u00a0nbsp\u2003em\u3000ideographic\u200bzero-width",
    "1234567890",
    "3.14159 and 2.71828",
    "In 2024, 1,000,000 people paid $100.00 (50% off).",
    "x1y22z333 v2.0.1-rc3",
    "\u0661\u0662\u0663 Arabic-Indic digits, \u00bd \u2153 \u216b fractions and numerals",
    "I'm sure they're here; we've seen he'll come, she'd go, it's fine, can't won't",
    "'S 'T 'RE upper-case contractions and ''double'' quotes",
    "\u00dcn\u00efc\u00f6d\u00e9 fa\u00e7ade na\u00efve caf\u00e9",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440!",
    "\u4f60\u597d\uff0c\u4e16\u754c\uff01\u6211\u4eec\u5728\u6d4b\u8bd5\u5206\u8bcd\u5668\u3002",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3068\u30ab\u30bf\u30ab\u30ca",
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645 \u05e9\u05dc\u05d5\u05dd",
    "\u03b5\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u0939\u093f\u0928\u094d\u0926\u0940 \u0e44\u0e17\u0e22",
    "emoji \U0001f642\U0001f44d\U0001f3fd family \U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 flags \U0001f1eb\U0001f1f7",
    "\U0001f917 Hugging Face \u2764\ufe0f",
    "e\u0301 combining, \u212b angstrom, \ufb01 ligature",
    "\u2211\u222b\u221a\u221e \u2260 \u2264 \u00b1 \u00d7 \u00f7",
    "bell\u0007 and nul\u0000 and del\u007f controls",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "!!!!!!!!!!!!!!!! ???? ... ---- ==== ____",
    "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "#include <vector>\nint main() {\n\tstd::vector<int> v{1, 2, 3};\n\treturn v.size() == 3 ? 0 : 1;\n}\n",
    '{"key": [1, 2.5, null, true], "nested": {"a": "b"}}',
    "<div class=\"x\">&amp; &lt;tag&gt;</div>",
    "for i in $(seq 1 10); do echo \"$i\" | grep -E '^[0-9]+$'; done",
    "https://example.com/path/to/page?q=1&r=two#frag user@example.org",
    "CamelCaseIdentifier snake_case_name SCREAMING_CASE kebab-case",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "text<|endoftext|>more text<file_sep>end",
    "<|im_start|><|im_end|><|im_start|>",
    "<|im_start partial <|im_end| and <| |>",
    " <|im_start|> spaced <|im_end|> ",
    "<s> and </s> and <unk> literal",
    "Mixed: caf\u00e9 123 \u4f60\u597d \U0001f642 it's <|im_end|> done.",
    "bytes missing from SmolLM2's vocabulary \u0004\u0006\u0013\u0014\u0016\u001d and U+40000 \U00040000",
]


def random_strings(count, seed=4):
    """Strings glued from pieces that stress the pre-tokenizer and BPE: whitespace of every kind,
    contraction letters, digits of several scripts, punctuation, CJK and other scripts, emoji with
    joiners and modifiers, control bytes, special tokens and near misses."""
    rng = random.Random(seed)
    pools = [" \t\n\r\u00a0\u3000\u2003\u200b\u0085\u2028\x0b\x0c", "abcXYZ'sStmdlrev",
             "0123456789\u0661\u00bd\u2153\u216b\u00b2", "!?.,;:()[]{}<>|/\\-_=+*&^%$#@~`\"'",
             "\u00e9\u00fc\u00df\u0416\u0436\u05e9\u0645\u4f60\u597d\u3042\u30a2\ud55c\u0e44\u0939\u093f",
             "\U0001f642\U0001f44d\U0001f3fd\u200d\u2764\ufe0f\U0001f1eb\U0001f1f7\u0301\u0300",
             "\x00\x01\x04\x07\x1b\x1d\x7f\x1c\x1e\x1f"]
    specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>", "<unk>", "<|im_start", "im_end|>"]
    words = ["hello", " world", "I'm", " they're", "  ", "\n\n", "def", " return", "12345", " 3.14", "caf\u00e9",
             "\u4f60\u597d\u4e16\u754c"]
    out = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(1, 10)):
            r = rng.random()
            if r < 0.1:
                parts.append(rng.choice(specials))
            elif r < 0.4:
                parts.append(rng.choice(words))
            else:
                pool = rng.choice(pools)
                parts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 6))))
        out.append("".join(parts))
    return out

CHATS = [
    {"messages": [{"role": "user", "content": "What is the capital of France?"}], "add_generation_prompt": True},
    {"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi!"},
                  {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Count: 1 2 3"}],
     "add_generation_prompt": True},
    {"messages": [{"role": "user", "content": "Say \u4f60\u597d \U0001f642\n\nand\ttabs"}], "add_generation_prompt": False},
]


def smollm2_tokenizer_json(model_path):
    """The SmolLM2 tokenizer rebuilt from the GGUF's metadata: vocabulary, merges and control tokens
    from the file; the pipeline that HuggingFaceTB/SmolLM2's tokenizer.json declares (StarCoder's:
    digits isolated, then GPT-2 byte-level), which is what llama.cpp's "smollm" pre-tokenizer names."""
    import gguf

    reader = gguf.GGUFReader(model_path)

    def strings(key):
        field = reader.fields[key]
        return [bytes(field.parts[i]).decode("utf-8") for i in field.data]

    tokens = strings("tokenizer.ggml.tokens")
    merges = strings("tokenizer.ggml.merges")
    field = reader.fields["tokenizer.ggml.token_type"]
    types = [int(field.parts[i][0]) for i in field.data]
    assert reader.fields["tokenizer.ggml.pre"].contents() == "smollm"
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, (t, ty) in enumerate(zip(tokens, types)) if ty == 3],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "vocab": {t: i for i, t in enumerate(tokens)}, "merges": merges},
    }, reader.fields["tokenizer.chat_template"].contents()


def cases_for(tok):
    out = []
    for text in CORPUS + random_strings(150):
        ids = tok.encode(text, add_special_tokens=False).ids
        out.append({"text": text, "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False)})
    return out


def train_tiny(kind):
    """A small tokenizer trained here on CORPUS, to test the tokenizer.json readers: byte-level BPE
    (SmolLM2's pipeline) or LLaMA-2-style SentencePiece BPE with byte fallback, where only the 70
    commonest characters enter the vocabulary so that the rest fall back to bytes."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    text = CORPUS * 4 + [c["content"] for chat in CHATS for c in chat["messages"]]
    if kind == "bpe":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                      pre_tokenizers.ByteLevel(add_prefix_space=False)])
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], show_progress=False)
        tok.train_from_iterator(text, trainer)
        return tok
    # SentencePiece style: train, then lay the vocabulary out as LLaMA's is (<unk> <s> </s>, the 256
    # byte tokens, then the learned pieces) and rebuild with byte fallback.
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    trainer = trainers.BpeTrainer(vocab_size=500, limit_alphabet=70, show_progress=False)
    tok.train_from_iterator(text, trainer)
    learned = json.loads(tok.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece, _ in sorted(learned["vocab"].items(), key=lambda kv: kv[1]):
        vocab.setdefault(piece, len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in learned["merges"]]
    spm = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    spm.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    spm.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    spm.add_special_tokens(["<unk>", "<s>", "</s>"])
    spm.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    return spm


def tokenizer_golden(model_path):
    import jinja2
    from tokenizers import Tokenizer

    spec, template = smollm2_tokenizer_json(model_path)
    smollm2 = Tokenizer.from_str(json.dumps(spec))
    chats = []
    for chat in CHATS:
        text = jinja2.Environment().from_string(template).render(**chat)
        chats.append({**chat, "text": text, "ids": smollm2.encode(text, add_special_tokens=False).ids})
    golden = {"comment": "written by tools/make_golden.py; ids from Hugging Face tokenizers",
              "tokenizers_version": __import__("tokenizers").__version__,
              "smollm2": cases_for(smollm2), "smollm2_chat": chats}
    # Training breaks frequency ties differently from run to run, so the tiny tokenizers are trained
    # once and kept: delete their files to train new ones (then rerun tools/make_fuzz_seeds.py).
    for name in ("bpe", "spm"):
        path = os.path.join(GOLDEN, f"tiny_{name}.tokenizer.json")
        if not os.path.exists(path):
            train_tiny(name).save(path, pretty=False)
        golden[f"tiny_{name}"] = cases_for(Tokenizer.from_file(path))
    # The same SentencePiece model with the newer pipeline (Metaspace, prepend_scheme "first"; the
    # decoder unchanged), as recent LLaMA-2 and Mistral tokenizer.json files write it. Only its ids are golden; the C++
    # test swaps the pipeline into tiny_spm.tokenizer.json itself.
    from tokenizers import pre_tokenizers
    metaspace = Tokenizer.from_file(os.path.join(GOLDEN, "tiny_spm.tokenizer.json"))
    metaspace.normalizer = None
    metaspace.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    golden["tiny_spm_metaspace"] = cases_for(metaspace)
    with open(os.path.join(GOLDEN, "tokenizer_cases.json"), "w") as f:
        json.dump(golden, f, ensure_ascii=True, separators=(",", ":"))
        f.write("\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    args = parser.parse_args()
    os.makedirs(GOLDEN, exist_ok=True)
    tensor_golden(args.model)
    tokenizer_golden(args.model)


if __name__ == "__main__":
    sys.exit(main())
