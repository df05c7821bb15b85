#!/usr/bin/env python3
"""Writes golden chat prompts from Hugging Face transformers' apply_chat_template, which the runner's
chat-template tests (tests/runner/test_chat_template.cpp) compare with chat_template.cpp's render().

Needs transformers (5.x), tokenizers and jinja2 (`pip install transformers jinja2`); no model is
downloaded: each template is set on an empty tokenizer with the model's BOS and EOS text.

  python3 tools/make_chat_template_golden.py [--out tests/runner/golden/chat_templates.json]

The templates are the Jinja sources the models ship in tokenizer_config.json (GGUF converters copy
them into tokenizer.chat_template), written here as Jinja reads them:
  smollm2          HuggingFaceTB/SmolLM2-135M-Instruct, read from the GGUF that scripts/fetch-model.sh
                   fetches: ChatML with a default system prompt
  chatml           teknium/OpenHermes-2.5-Mistral-7B: plain ChatML
  llama2           meta-llama/Llama-2-7b-chat-hf
  llama3           meta-llama/Meta-Llama-3-8B-Instruct
  llama3_always    the same before add_generation_prompt guarded the assistant header (llama.cpp's
                   tests/test-chat-template.cpp quotes this form)
  mistral_v02      mistralai/Mistral-7B-Instruct-v0.2 (as llama.cpp's test-chat-template.cpp quotes it)
  mistral_v01      mistralai/Mistral-7B-Instruct-v0.1: v0.2's with a space after each reply's EOS
                   (as quoted in, for one, the README of codewithkyrian/jinja-php)
Every template renders every conversation below, with and without add_generation_prompt; where
the template raises (roles that do not alternate, a system role Mistral lacks), the golden records
the message.
"""
import argparse
import json

import transformers
from tokenizers import Tokenizer
from tokenizers.models import BPE
from transformers import PreTrainedTokenizerFast

SMOLLM2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
           "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
           "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
           "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

CHATML = (r"{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          r"'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

LLAMA2 = (r"{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
          r"{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
          r"{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
          r"{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
          r"{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
          r"{% if loop.index0 == 0 and system_message != false %}"
          r"{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}"
          r"{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
          r"{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
          r"{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}")

LLAMA3_BODY = ("{% set loop_messages = messages %}{% for message in loop_messages %}"
               "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ "
               "message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
               "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}")
LLAMA3 = LLAMA3_BODY + "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
LLAMA3_ALWAYS = LLAMA3_BODY + "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"


def mistral(after_reply):
    return ("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
            "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
            "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
            "{% elif message['role'] == 'assistant' %}{{ message['content'] + " + after_reply + "}}"
            "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")


# name -> (source, kind the runner must detect, bos text, eos text)
TEMPLATES = {
    "smollm2": (SMOLLM2, "chatml", "<|im_start|>", "<|im_end|>"),
    "chatml": (CHATML, "chatml", "<s>", "<|im_end|>"),
    "llama2": (LLAMA2, "llama2", "<s>", "</s>"),
    "llama3": (LLAMA3, "llama3", "<|begin_of_text|>", "<|eot_id|>"),
    "llama3_always": (LLAMA3_ALWAYS, "llama3", "<|begin_of_text|>", "<|eot_id|>"),
    "mistral_v02": (mistral("eos_token"), "mistral", "<s>", "</s>"),
    "mistral_v01": (mistral("eos_token + ' ' "), "mistral", "<s>", "</s>"),
}

# Whitespace around contents shows which templates strip it (Llama-2's strip(), Llama-3's trim),
# Unicode spaces included: Python's str.strip() removes them too.
CONVERSATIONS = [
    [("user", "What is the capital of France?")],
    [("system", "You are terse."), ("user", "Hi")],
    [("system", ""), ("user", "Hi")],
    [("user", "  Hello \n"), ("assistant", " Hi there! "), ("user", "Who are you?\n")],
    [("system", "Be brief.\nAnswer in French."), ("user", "U1"), ("assistant", "A1"), ("user", "U2")],
    [("user", "U1"), ("assistant", "A1")],
    [("assistant", "A first")],
    [("user", "U1"), ("user", "U2")],
    [("user", "Unicode: caf\u00e9 \u2014 \u65e5\u672c \U0001f600")],
    [("user", "\u3000\u00a0Wide spaces\u2009\x1f"), ("assistant", "\u2028A\u00a0"), ("user", "\tU")],
]


def render(source, bos, eos, messages, add_generation_prompt):
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(BPE()), bos_token=bos, eos_token=eos)
    tok.chat_template = source
    chat = [{"role": role, "content": content} for role, content in messages]
    try:
        return {"text": tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=add_generation_prompt)}
    except Exception as error:  # jinja2.TemplateError from raise_exception
        return {"error": str(error)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="tests/runner/golden/chat_templates.json")
    args = parser.parse_args()
    templates = {name: {"source": source, "kind": kind, "bos_token": bos, "eos_token": eos}
                 for name, (source, kind, bos, eos) in TEMPLATES.items()}
    cases = []
    for name, (source, _, bos, eos) in TEMPLATES.items():
        for messages in CONVERSATIONS:
            for add_generation_prompt in (True, False):
                case = {"template": name, "add_generation_prompt": add_generation_prompt,
                        "messages": [{"role": role, "content": content} for role, content in messages]}
                case.update(render(source, bos, eos, messages, add_generation_prompt))
                cases.append(case)
    golden = {"generator": f"tools/make_chat_template_golden.py, transformers {transformers.__version__}",
              "templates": templates, "cases": cases}
    with open(args.out, "w", encoding="utf-8") as out:
        json.dump(golden, out, indent=1, ensure_ascii=False)
        out.write("\n")
    print(f"{args.out}: {len(templates)} templates, {len(cases)} cases")


if __name__ == "__main__":
    main()
