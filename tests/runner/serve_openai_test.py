#!/usr/bin/env python3
"""Drives `pagedkv-llama serve` with the official openai Python client, on 127.0.0.1.

    serve_openai_test.py <pagedkv-llama> <model.gguf> <venv dir> [storm requests]

Runs under a virtual environment holding the openai package (3.57.0, the release the test was
written against), made once by scripts/python-venv.sh in <venv dir>; exits 77 (ctest's skip) when it
cannot be installed. Checks, through the client: a completion and a chat completion, streamed and
not, with greedy text equal to the CLI's for the same prompt and chat; n = 2; stop strings; usage
counts; logprobs whole and streamed (the chunks' together the whole response's, the EOS's in the
last); vLLM's use_beam_search through extra_body; the client's typed errors for 400 and 404. Then a
disconnect storm: concurrent streamed requests over a few prompts, half dropped at random points;
afterwards every KV block is free, the server counts exactly the requests sent as finished, every
stream read to its end carries its prompt's own greedy text (none lost, duplicated or crossed), and
the server still answers. Exits 1 naming the first failed check. Requests that do not depend on each
other go at once from a pool of threads, and the CLI's answers are computed meanwhile.
"""
import os
import subprocess
import sys

llama, model, venv = sys.argv[1], sys.argv[2], sys.argv[3]
storm_size = int(sys.argv[4]) if len(sys.argv) > 4 else 200
try:
    import openai
except ImportError:
    here = os.path.dirname(os.path.abspath(__file__))
    made = subprocess.run([os.path.join(here, "..", "..", "scripts", "python-venv.sh"), venv, "openai==3.57.0"],
                          stdout=subprocess.PIPE, text=True)
    if made.returncode != 0:
        print(f"serve_openai_test: skipped: no openai package (scripts/python-venv.sh exited {made.returncode})")
        sys.exit(77)
    python = made.stdout.strip()
    os.execv(python, [python] + sys.argv)

import asyncio
import concurrent.futures
import random
import time

from serve_harness import check, cli_output, cli_run, metrics, start_server, stop_server

PROMPT = "The capital of France is"
MODEL = "SmolLM2-135M-Instruct.Q4_1"
QUESTION = "What is the capital of France?"


def refused(error_type, call, message):
    """The client's typed error for a refusal, its message naming the problem."""
    try:
        call()
        check(False, f"accepted, not {error_type.__name__}: {message}")
    except error_type as e:
        check(message in str(e), f"{error_type.__name__}: {e}")


server, port = start_server(llama, model, "--kv-cache-tokens", "4096", "--max-queued-requests", "256")
cli_greedy = cli_run(llama, model, "--prompt", PROMPT, "--max-tokens", "8")
cli_chat = cli_run(llama, model, "--chat", "--prompt", QUESTION, "--max-tokens", "12")


def close(a, b):
    """Two log-probabilities of one token from requests that ran in different batches: the products'
    float rounding differs with the batch (9e-6 seen), nothing else may."""
    return abs(a - b) <= 1e-4


pool = concurrent.futures.ThreadPoolExecutor(max_workers=12)
client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=120)
try:
    check([m.id for m in client.models.list().data] == [MODEL], "models.list")

    # The storm's prompts: short (the storm is bound by the tokens its 200 requests compute), each
    # with its own greedy text, so that a stream carrying another's text shows.
    prompts = [f"{i}, {i + 1}, {i + 2}," for i in (1, 10, 20, 50, 100)]
    storm_body = dict(max_tokens=4, temperature=0, extra_body={"ignore_eos": True})

    # Requests that do not depend on each other, at once from a pool of threads (the engine
    # batches them; the client is thread-safe); each checked below.
    messages = [{"role": "user", "content": QUESTION}]
    create, chat_create = client.completions.create, client.chat.completions.create
    submit = pool.submit
    wave = {
        "whole": submit(create, model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0),
        "stream": submit(lambda: list(create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, stream=True,
                                             stream_options={"include_usage": True}))),
        "chat": submit(chat_create, model=MODEL, messages=messages, max_tokens=12, temperature=0),
        "chat_stream": submit(lambda: list(chat_create(model=MODEL, messages=messages, max_tokens=12, temperature=0,
                                                       stream=True))),
        "two": submit(create, model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0.8, seed=3, n=2),
        "logprobs": submit(create, model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0, logprobs=3),
        "logprobs_stream": submit(lambda: list(create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0,
                                                      logprobs=3, stream=True))),
        # Chat's logprobs, whole and streamed, to its EOS (which only the last chunk carries).
        "chat_logprobs": submit(chat_create, model=MODEL, messages=messages, max_tokens=12, temperature=0,
                                logprobs=True, top_logprobs=2),
        "chat_logprobs_stream": submit(lambda: list(chat_create(model=MODEL, messages=messages, max_tokens=12,
                                                                temperature=0, logprobs=True, top_logprobs=2,
                                                                stream=True))),
        "beams": submit(create, model=MODEL, prompt=PROMPT, max_tokens=5, n=2,
                        extra_body={"use_beam_search": True, "best_of": 3}),
        "expected": [submit(create, model=MODEL, prompt=p, **storm_body) for p in prompts],
        # The client's typed errors.
        "refusals": [submit(refused, openai.BadRequestError, lambda: create(model=MODEL, prompt=PROMPT, top_p=0),
                            "top_p: 0 is not in (0, 1]"),
                     submit(refused, openai.NotFoundError, lambda: create(model="gpt-4", prompt=PROMPT),
                            "'gpt-4' is not served")],
    }

    # A completion, whole and streamed: the CLI's greedy text, OpenAI's usage.
    whole = wave["whole"].result()
    text = whole.choices[0].text
    check(whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 8 and
          whole.usage.total_tokens == whole.usage.prompt_tokens + 8, f"completion: {whole}")
    # A stop string cuts the greedy text before it (sent now: it needs the text).
    stop = text.split()[1]
    stopped = submit(create, model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, stop=[stop])
    check(cli_output(cli_greedy) == text + "\n", f"completion {text!r} differs from the CLI's")
    chunks = wave["stream"].result()
    check("".join(c.choices[0].text for c in chunks if c.choices) == text, f"streamed completion: {chunks}")
    check(chunks[-1].usage.completion_tokens == 8, f"streamed usage: {chunks[-1]}")

    # A chat completion, whole and streamed: the CLI's --chat.
    chat = wave["chat"].result()
    answer = chat.choices[0].message.content
    check(chat.choices[0].message.role == "assistant", f"chat: {chat}")
    check(cli_output(cli_chat) == answer + "\n", f"chat {answer!r} differs from the CLI's")
    check(chat.usage.total_tokens == chat.usage.prompt_tokens + chat.usage.completion_tokens, f"chat usage: {chat.usage}")
    deltas = wave["chat_stream"].result()
    check("".join(d.choices[0].delta.content or "" for d in deltas) == answer and
          deltas[-1].choices[0].finish_reason == chat.choices[0].finish_reason, f"streamed chat: {deltas}")

    # n = 2, stop strings, logprobs, beams through extra_body.
    two = wave["two"].result()
    check(sorted(c.index for c in two.choices) == [0, 1] and two.usage.completion_tokens == 8, f"n = 2: {two}")
    stopped = stopped.result()
    check(stopped.choices[0].text == text[:text.index(stop)] and stopped.choices[0].finish_reason == "stop",
          f"stop {stop!r}: {stopped}")
    lp = wave["logprobs"].result().choices[0].logprobs
    check(len(lp.tokens) == 4 and all(len(t) == 3 for t in lp.top_logprobs) and
          all(top[tok] == logprob for tok, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs)),
          f"logprobs: {lp}")
    # Streamed logprobs: each chunk carries those of the tokens it releases; together, the whole
    # response's, in the same shapes (completions' text_offset counted from the completion's start).
    # The two requests share the server's steps with the rest of the wave: the same tokens, the
    # values equal to float rounding (close()).
    streamed_lp = [c.choices[0].logprobs for c in wave["logprobs_stream"].result() if c.choices and c.choices[0].logprobs]
    joined = {field: sum((getattr(chunk, field) for chunk in streamed_lp), [])
              for field in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
    check(joined["tokens"] == lp.tokens and joined["text_offset"] == lp.text_offset and
          len(joined["token_logprobs"]) == len(lp.token_logprobs) and
          all(close(a, b) for a, b in zip(joined["token_logprobs"], lp.token_logprobs)) and
          [sorted(t) for t in joined["top_logprobs"]] == [sorted(t) for t in lp.top_logprobs] and
          all(close(a[k], b[k]) for a, b in zip(joined["top_logprobs"], lp.top_logprobs) for k in a),
          f"streamed logprobs {joined} against {lp}")
    chat_lp = wave["chat_logprobs"].result().choices[0]
    check(chat_lp.finish_reason == "stop" and len(chat_lp.logprobs.content) == chat.usage.completion_tokens and
          all(len(t.top_logprobs) == 2 and t.top_logprobs[0].token == t.token for t in chat_lp.logprobs.content),
          f"chat logprobs: {chat_lp}")
    chat_chunks = wave["chat_logprobs_stream"].result()
    streamed_content = [t for c in chat_chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    same = lambda a, b: a.token == b.token and a.bytes == b.bytes and close(a.logprob, b.logprob)
    check(len(streamed_content) == len(chat_lp.logprobs.content) and
          all(same(a, b) and len(a.top_logprobs) == len(b.top_logprobs) and all(map(same, a.top_logprobs, b.top_logprobs))
              for a, b in zip(streamed_content, chat_lp.logprobs.content)),
          f"streamed chat logprobs {streamed_content} against {chat_lp}")
    last = [c for c in chat_chunks if c.choices][-1].choices[0]
    check(last.finish_reason == "stop" and last.logprobs.content[-1].token == "<|im_end|>",
          f"the last chat chunk carries the EOS's logprob: {last}")
    beams = wave["beams"].result()
    check(len(beams.choices) == 2 and beams.choices[0].text != beams.choices[1].text, f"beams: {beams}")
    for r in wave["refusals"]:
        r.result()

    # The disconnect storm: concurrent streams over a few prompts, half dropped at random points.
    expected = {p: r.result().choices[0].text for p, r in zip(prompts, wave["expected"])}
    check(len(set(expected.values())) == len(prompts), f"the storm's prompts share a greedy text: {expected}")
    before = metrics(port)
    rng = random.Random(26)
    plan = [(prompts[i % len(prompts)], rng.random() < 0.5, rng.randrange(0, 4)) for i in range(storm_size)]
    aclient = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=300)

    async def one(prompt, drop, after):
        stream = await aclient.completions.create(model=MODEL, prompt=prompt, stream=True, **storm_body)
        got, events = "", 0
        async for chunk in stream:
            if drop and events == after:
                await stream.close()  # hang up mid-stream
                return None
            events += 1
            got += chunk.choices[0].text if chunk.choices else ""
        return got

    async def storm():
        results = await asyncio.gather(*(one(*p) for p in plan))
        await aclient.close()
        return results

    started = time.monotonic()
    results = asyncio.run(storm())
    storm_s = time.monotonic() - started
    for (prompt, drop, _), got in zip(plan, results):
        check(got is None or got == expected[prompt], f"a storm stream of {prompt!r} read {got!r}, not {expected[prompt]!r}")
    kept = sum(got is not None for got in results)
    deadline = time.monotonic() + 30
    while True:
        m = metrics(port)
        # At least the storm's requests: the request before it may count after `before` was read (the
        # loop publishes its metrics after it releases a stream, and the client may read between).
        if (m["pagedkv_requests_finished_total"] - before["pagedkv_requests_finished_total"] >= storm_size and
                m["pagedkv_kv_blocks_used"] == 0 and m["pagedkv_requests_running"] == 0 and
                m["pagedkv_requests_waiting"] == 0):
            break
        check(time.monotonic() < deadline, f"the storm's requests finished and freed within 30 s: {m}")
        time.sleep(0.05)
    aborted = m["pagedkv_requests_aborted_total"] - before["pagedkv_requests_aborted_total"]
    check(aborted <= storm_size - kept, f"{aborted} aborted, more than the {storm_size - kept} dropped")
    again = create(model=MODEL, prompt=prompts[0], **storm_body)
    check(again.choices[0].text == expected[prompts[0]], "the server answers the same after the storm")
    print(f"serve_openai_test: storm of {storm_size}: {kept} read to the end, {storm_size - kept} dropped "
          f"({int(aborted)} aborted mid-generation), {storm_s:.1f} s", file=sys.stderr)
finally:
    pool.shutdown(wait=False, cancel_futures=True)
    client.close()  # its kept-alive connection would hold the server's stop for its keep-alive timeout
    for process in (cli_greedy, cli_chat):
        if process.poll() is None:
            process.kill()
    status, rest = stop_server(server)
check(status == 0, f"the server exited with {status}: {rest}")
print("serve_openai_test: all checks passed")
