#!/usr/bin/env python3
"""Drives `pagedkv-llama serve` with the official openai Python client, on 127.0.0.1.

    serve_openai_test.py <pagedkv-llama> <model.gguf> <venv dir> [storm requests]

Runs under a virtual environment holding the openai package, made once by scripts/openai-venv.sh in
<venv dir>; exits 77 (ctest's skip) when it cannot be installed. Checks, through the client: a
completion and a chat completion, streamed and not, with greedy text equal to the CLI's for the
same prompt and chat; n = 2; stop strings; usage counts; logprobs; vLLM's use_beam_search through
extra_body; the client's typed errors for 400 and 404. Then a disconnect storm: concurrent streamed
requests over a few prompts, half dropped at random points; afterwards every KV block is free, the
server counts exactly the requests sent as finished, every stream read to its end carries its
prompt's own greedy text (none lost, duplicated or crossed), and the server still answers.
Exits 1 naming the first failed check.
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
    made = subprocess.run([os.path.join(here, "..", "..", "scripts", "openai-venv.sh"), venv], stdout=subprocess.PIPE,
                          text=True)
    if made.returncode != 0:
        print(f"serve_openai_test: skipped: no openai package (scripts/openai-venv.sh exited {made.returncode})")
        sys.exit(77)
    python = made.stdout.strip()
    os.execv(python, [python] + sys.argv)

import asyncio
import random
import time

from serve_harness import check, metrics, start_server, stop_server

PROMPT = "The capital of France is"
MODEL = "SmolLM2-135M-Instruct.Q4_1"


def cli(*args):
    run = subprocess.run([llama, "--model", model, *args], capture_output=True, text=True, timeout=120)
    check(run.returncode == 0, f"the CLI {args} exited {run.returncode}: {run.stderr}")
    return run.stdout


server, port = start_server(llama, model, "--kv-cache-tokens", "4096", "--max-queued-requests", "256")
try:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=120)

    check([m.id for m in client.models.list().data] == [MODEL], "models.list")

    # A completion, whole and streamed: the CLI's greedy text, OpenAI's usage.
    whole = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0)
    text = whole.choices[0].text
    check(cli("--prompt", PROMPT, "--max-tokens", "8") == text + "\n", f"completion {text!r} differs from the CLI's")
    check(whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 8 and
          whole.usage.total_tokens == whole.usage.prompt_tokens + 8, f"completion: {whole}")
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    check("".join(c.choices[0].text for c in chunks if c.choices) == text, f"streamed completion: {chunks}")
    check(chunks[-1].usage.completion_tokens == 8, f"streamed usage: {chunks[-1]}")

    # A chat completion, whole and streamed: the CLI's --chat.
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0)
    answer = chat.choices[0].message.content
    check(chat.choices[0].message.role == "assistant", f"chat: {chat}")
    check(cli("--chat", "--prompt", messages[0]["content"], "--max-tokens", "12") == answer + "\n",
          f"chat {answer!r} differs from the CLI's")
    check(chat.usage.total_tokens == chat.usage.prompt_tokens + chat.usage.completion_tokens, f"chat usage: {chat.usage}")
    deltas = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0,
                                                 stream=True))
    check("".join(d.choices[0].delta.content or "" for d in deltas) == answer and
          deltas[-1].choices[0].finish_reason == chat.choices[0].finish_reason, f"streamed chat: {deltas}")

    # n = 2, stop strings, logprobs, beams through extra_body.
    two = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0.8, seed=3, n=2)
    check(sorted(c.index for c in two.choices) == [0, 1] and two.usage.completion_tokens == 12, f"n = 2: {two}")
    stop = text.split()[1]
    stopped = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, stop=[stop])
    check(stopped.choices[0].text == text[:text.index(stop)] and stopped.choices[0].finish_reason == "stop",
          f"stop {stop!r}: {stopped}")
    lp = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0, logprobs=3).choices[0].logprobs
    check(len(lp.tokens) == 4 and all(len(t) == 3 for t in lp.top_logprobs) and
          all(top[tok] == logprob for tok, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs)),
          f"logprobs: {lp}")
    beams = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, n=2,
                                      extra_body={"use_beam_search": True, "best_of": 3})
    check(len(beams.choices) == 2 and beams.choices[0].text != beams.choices[1].text, f"beams: {beams}")

    # The client's typed errors.
    try:
        client.completions.create(model=MODEL, prompt=PROMPT, top_p=0)
        check(False, "top_p 0 was accepted")
    except openai.BadRequestError as e:
        check("top_p: 0 is not in (0, 1]" in str(e), f"400: {e}")
    try:
        client.completions.create(model="gpt-4", prompt=PROMPT)
        check(False, "another model was accepted")
    except openai.NotFoundError as e:
        check("'gpt-4' is not served" in str(e), f"404: {e}")

    # The disconnect storm.
    prompts = [f"Question {i}: what comes after {i}? Answer:" for i in range(5)]
    expected = {p: client.completions.create(model=MODEL, prompt=p, max_tokens=6, temperature=0,
                                             extra_body={"ignore_eos": True}).choices[0].text for p in prompts}
    before = metrics(port)
    rng = random.Random(26)
    plan = [(prompts[i % len(prompts)], rng.random() < 0.5, rng.randrange(0, 4)) for i in range(storm_size)]
    aclient = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=300)

    async def one(prompt, drop, after):
        stream = await aclient.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0, stream=True,
                                                  extra_body={"ignore_eos": True})
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
    again = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0)
    check(again.choices[0].text == text, "the server answers the same after the storm")
    print(f"serve_openai_test: storm of {storm_size}: {kept} read to the end, {storm_size - kept} dropped "
          f"({int(aborted)} aborted mid-generation), {storm_s:.1f} s", file=sys.stderr)
finally:
    status, rest = stop_server(server)
check(status == 0, f"the server exited with {status}: {rest}")
print("serve_openai_test: all checks passed")
