#!/usr/bin/env python3
"""Drives `pagedkv-llama serve` over HTTP on 127.0.0.1, with the standard library only.

    serve_test.py <pagedkv-llama> <model.gguf>

Starts the server on a free port (--port 0: it prints the one it took), checks /health,
/v1/models, /v1/completions and /v1/chat/completions whole and streamed (the JSON, the usage
counts, the SSE framing, greedy text equal to the CLI's for the same prompt and chat, n = 2, stop
strings, logprobs, best_of, vLLM's use_beam_search equal to the CLI's beams), the seeds drawn for
requests without one (--seed), the 400/404/429 errors naming the field, that clients hanging up
mid-stream abort their requests and free their KV blocks (/metrics), the TTFT/TPOT histograms,
and that SIGTERM turns /health and new requests to 503, aborts a stream that outlives
--shutdown-timeout with its last events and [DONE] sent, and exits 0.
Exits 1 naming the first failed check.

One server for everything, and the requests that do not depend on each other sent at once from a
pool of threads (the engine batches them), the CLI's answers computed meanwhile: the run is bound by
the engine's steps, not by waits.
"""
import concurrent.futures
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

from serve_harness import check, cli_output, cli_run, metrics, start_server, stop_server

llama, model = sys.argv[1], sys.argv[2]
PROMPT = "The capital of France is"


def request(port, method, path, body=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request(method, path, body=None if body is None else json.dumps(body),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read().decode()
    conn.close()
    return resp.status, resp.getheader("Content-Type", ""), data


def complete(port, body, status=200, path="/v1/completions"):
    got, _, data = request(port, "POST", path, body)
    check(got == status, f"POST {body}: status {got}, expected {status}: {data}")
    return json.loads(data)


def chat(port, body, status=200):
    return complete(port, body, status, "/v1/chat/completions")


def open_stream(port, body, path="/v1/completions"):
    """A streamed completion left open: the connection and its response, read line by line."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", path, json.dumps(dict(body, stream=True)), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    check(resp.status == 200, f"stream {body}: status {resp.status}")
    check(resp.getheader("Content-Type", "").startswith("text/event-stream"), "stream: not text/event-stream")
    return conn, resp


def read_event(resp):
    """One server-sent event: 'data: <payload>' and an empty line."""
    line = resp.readline().decode()
    check(line.startswith("data: ") and line.endswith("\n"), f"SSE line {line!r} is not 'data: ...'")
    check(resp.readline() == b"\n", "SSE event not ended by an empty line")
    return line[len("data: "):-1]


def read_events(resp):
    """The events of a stream up to [DONE], which must end it."""
    events = []
    while (payload := read_event(resp)) != "[DONE]":
        events.append(json.loads(payload))
    check(resp.read() == b"", "data after [DONE]")
    return events


def wait_metrics(port, done, what):
    deadline = time.monotonic() + 10
    while True:
        m = metrics(port)
        if done(m):
            return m
        check(time.monotonic() < deadline, f"{what} within 10 s: {m}")
        time.sleep(0.02)


def error_of(body, status, message_regex, path="/v1/completions"):
    got = complete(port, body, status, path)
    check(set(got) == {"error"} and set(got["error"]) == {"message", "type"}, f"error schema: {got}")
    check(re.search(message_regex, got["error"]["message"]), f"error {got} does not match {message_regex!r}")


def hostile_method(method, path):
    status, _, text = request(port, method, path, {} if method != "GET" else None)
    check(status == 405 and json.loads(text)["error"]["message"].startswith(f"{method} {path}: method not allowed"),
          f"{method} {path}: {status} {text}")


def huge_body():
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/v1/completions", b"{" + b" " * (9 << 20) + b"}", {"Content-Type": "application/json"})
    resp = conn.getresponse()
    text = resp.read().decode()
    conn.close()
    check(resp.status == 413 and "exceeds 8388608 bytes" in text, f"a 9 MiB body: {resp.status} {text}")


def not_http():
    with socket.create_connection(("127.0.0.1", port), timeout=30) as garbage:
        garbage.sendall(b"\x00\x01\x02 not http at all\r\n\r\n")
        reply = garbage.recv(4096)
        check(reply.startswith(b"HTTP/1.1 400"), f"bytes that are not HTTP: {reply[:80]!r}")


def streamed(body, path="/v1/completions"):
    conn, resp = open_stream(port, body, path)
    events = read_events(resp)
    conn.close()
    return events


def run_bench():
    """bench/serve's load generator: two streamed requests, every figure reported."""
    bench = subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench",
                                                         "serve", "bench_serve.py"),
                            "--port", str(port), "--num-requests", "2", "--rate", "inf", "--max-prompt-tokens", "16",
                            "--max-output-tokens", "4", "--shared-prefix", "8"], capture_output=True, text=True, timeout=120)
    check(bench.returncode == 0 and re.search(r"^requests +2 completed, 0 failed", bench.stdout, re.M) and
          all(re.search(rf"^{name} +mean [0-9.]+  p50 [0-9.]+  p99 [0-9.]+$", bench.stdout, re.M)
              for name in ("ttft_ms", "tpot_ms", "e2e_latency_ms")) and "goodput" in bench.stdout,
          f"bench_serve.py exited {bench.returncode}: {bench.stdout} {bench.stderr}")


# One server for every check; the queue holds what the first wave sends at once.
QUEUE = 12
terminated = False
server, port = start_server(llama, model, "--kv-cache-tokens", "2048", "--max-queued-requests", str(QUEUE),
                            "--shutdown-timeout", "1", "--seed", "26")
# A twin started with the same --seed: its first request without a seed draws what the server's does.
twin, twin_port = start_server(llama, model, "--kv-cache-tokens", "256", "--seed", "26")
pool = concurrent.futures.ThreadPoolExecutor(max_workers=QUEUE - 2)  # the bench's 2 requests beside them
# The CLI's answers to compare with, computed meanwhile: greedy, beams, chat.
QUESTION = "What is the capital of France?"
cli_greedy = cli_run(llama, model, "--prompt", PROMPT, "--max-tokens", "8")
cli_beams = cli_run(llama, model, "--prompt", PROMPT, "--max-tokens", "5", "--beam-width", "3")
cli_chat = cli_run(llama, model, "--chat", "--prompt", QUESTION, "--max-tokens", "12")
try:
    # A client that stalls mid-request from the start: every check below runs while it holds its
    # connection; at the end, the server must have dropped it (its 5 s read timeout).
    stalled = socket.create_connection(("127.0.0.1", port), timeout=30)
    stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\":")

    # Requests without a seed draw theirs from the server's generator, seeded by --seed: the first
    # of two servers started alike are the same, the next one differs, and a seed repeats.
    SAMPLED = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 2.0}
    first, twin_first = pool.submit(complete, port, SAMPLED), pool.submit(complete, twin_port, SAMPLED)
    first, twin_first = first.result()["choices"][0]["text"], twin_first.result()["choices"][0]["text"]
    twin_status, twin_rest = stop_server(twin)
    check(twin_status == 0, f"the twin exited with {twin_status}: {twin_rest}")
    check(first == twin_first, f"--seed 26's first seedless request: {first!r}, its twin's {twin_first!r}")

    # The first wave, sent at once (the engine batches them): requests that do not depend on each
    # other, refusals, hostile HTTP and the load generator. Each future is checked below.
    messages = [{"role": "user", "content": QUESTION}]
    submit = pool.submit
    wave = {
        "whole": submit(complete, port, {"model": "SmolLM2-135M-Instruct.Q4_1", "prompt": PROMPT, "max_tokens": 8,
                                         "temperature": 0}),
        "stream": submit(streamed, {"prompt": PROMPT, "max_tokens": 8, "temperature": 0,
                                    "stream_options": {"include_usage": True}}),
        "two": submit(complete, port, {"prompt": PROMPT, "max_tokens": 4, "temperature": 0.8, "seed": 7, "n": 2}),
        "logprobs": submit(complete, port, {"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "logprobs": 2}),
        "beams": submit(complete, port, {"prompt": PROMPT, "max_tokens": 5, "use_beam_search": True, "best_of": 3,
                                         "n": 2}),
        "best": submit(complete, port, {"prompt": PROMPT, "max_tokens": 4, "temperature": 1.0, "seed": 5, "best_of": 3}),
        "chat": submit(chat, port, {"messages": messages, "max_tokens": 12, "temperature": 0}),
        "chat_stream": submit(streamed, {"messages": messages, "max_tokens": 12, "temperature": 0,
                                         "stream_options": {"include_usage": True}}, "/v1/chat/completions"),
        "unseeded": submit(complete, port, SAMPLED),
        "seeded": [submit(complete, port, dict(SAMPLED, seed=11)) for _ in range(2)],
        "chat_logprobs": submit(chat, port, {"messages": messages, "max_tokens": 3, "temperature": 0, "logprobs": True,
                                             "top_logprobs": 1}),
    }
    bench = submit(run_bench)
    queued = 1 + len(wave) + 1 + 2  # requests the engine finishes (first, the wave, bench); refusals never queue
    checks = [submit(request, port, "GET", "/health"), submit(request, port, "GET", "/v1/models")]
    # Refusals name the field.
    for args in (
            ({"messages": [{"role": "tool", "content": "x"}]}, 400, r"^messages\[0\]\.role: 'tool' is not one of",
             "/v1/chat/completions"),
            ({"messages": []}, 400, r"^messages: expected a non-empty array", "/v1/chat/completions"),
            ({"messages": messages, "top_logprobs": 2}, 400, r'^top_logprobs: needs "logprobs": true',
             "/v1/chat/completions"),
            ({"messages": [{"role": "user", "content": 5}]}, 400, r"^messages\[0\]\.content: expected a string",
             "/v1/chat/completions"),
            ({"prompt": PROMPT, "logprobs": 21}, 400, r"^logprobs: 21 is not in \[0, 20\]$"),
            ({"prompt": PROMPT, "n": 3, "best_of": 2}, 400, r"^best_of: 2 is less than n 3$"),
            ({"prompt": PROMPT, "presence_penalty": 0.5}, 400, r"^presence_penalty: not supported"),
            ({"prompt": PROMPT, "stream": "yes"}, 400, r"^stream: expected true or false"),
            ({"prompt": PROMPT, "stop": [1]}, 400, r"^stop: expected non-empty strings"),
            ({"prompt": [1, 2, 10 ** 9]}, 400, r"^prompt: token 2 is 1000000000, outside the vocabulary"),
            ({"prompt": PROMPT, "max_tokens": 9000}, 400, r"^max_tokens: \d+ prompt tokens and max_tokens 9000 exceed"),
            ({"prompt": PROMPT, "top_p": 0}, 400, r"^top_p: 0 is not in \(0, 1\]$"),
            ({"prompt": PROMPT, "max_tokens": "8"}, 400, r"^max_tokens: expected an integer"),
            ({"prompt": PROMPT, "temperature": -1}, 400, r"^temperature: -1 is not in \[0, 100\]$"),
            ({"prompt": 42}, 400, r"^prompt: expected a string"),
            ({"prompt": PROMPT, "model": "gpt-4"}, 404, r"^model: 'gpt-4' is not served"),
            ({"prompt": "hello " * 3000}, 400,
             r"^prompt: its \d+ tokens need \d+ KV blocks of 16 tokens; the cache holds 128")):
        checks.append(submit(error_of, *args))
    # Hostile HTTP: wrong methods, unknown paths, a huge body, bytes that are not HTTP. Each gets a
    # bounded answer in OpenAI's error shape while the server keeps answering the others.
    for method, path in (("GET", "/v1/completions"), ("PUT", "/v1/chat/completions"), ("DELETE", "/health"),
                         ("POST", "/metrics")):
        checks.append(submit(hostile_method, method, path))
    checks += [submit(huge_body), submit(not_http)]

    status, content_type, text = checks[0].result()
    check(status == 200 and json.loads(text) == {"status": "ok"}, f"/health: {status} {text}")
    status, _, text = checks[1].result()
    models = json.loads(text)
    check(status == 200 and models["object"] == "list" and models["data"][0]["id"] == "SmolLM2-135M-Instruct.Q4_1",
          f"/v1/models: {status} {text}")
    for c in checks[2:]:
        c.result()
    status, _, text = request(port, "POST", "/v1/completions", None)
    check(status == 400 and "not JSON" in json.loads(text)["error"]["message"], f"empty body: {status} {text}")
    status, _, text = request(port, "GET", "/v2/nothing")
    check(status == 404 and "no such endpoint" in json.loads(text)["error"]["message"], f"unknown path: {status} {text}")

    # Whole: greedy, the CLI's text for the same prompt, usage as OpenAI counts it.
    whole = wave["whole"].result()
    check(whole["object"] == "text_completion" and whole["id"].startswith("cmpl-"), f"completion: {whole}")
    (choice,) = whole["choices"]
    check(choice["index"] == 0 and choice["finish_reason"] == "length", f"choice: {choice}")
    usage = whole["usage"]
    check(usage["completion_tokens"] == 8 and usage["prompt_tokens"] > 0 and
          usage["total_tokens"] == usage["prompt_tokens"] + 8, f"usage: {usage}")

    # A stop string cuts the greedy text before it (sent now: it needs the text).
    stop = choice["text"].split()[1]
    stopped = pool.submit(complete, port, {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "stop": [stop]})
    queued += 1

    greedy = cli_output(cli_greedy)
    check(greedy == choice["text"] + "\n", f"the CLI says {greedy!r}, the server {choice['text']!r}")

    # Streamed: the same text in 'data:' events, the finish_reason on the last choice, usage, [DONE].
    events = wave["stream"].result()
    chunks = [e for e in events if e["choices"]]
    check(all(e["object"] == "text_completion" and len(e["choices"]) == 1 for e in chunks), f"chunks: {chunks}")
    check("".join(e["choices"][0]["text"] for e in chunks) == choice["text"], f"streamed text differs: {chunks}")
    check([e["choices"][0]["finish_reason"] for e in chunks][-1] == "length" and
          all(e["choices"][0]["finish_reason"] is None for e in chunks[:-1]), f"finish reasons: {chunks}")
    check(events[-1]["choices"] == [] and events[-1]["usage"] == usage, f"usage event: {events[-1]}")

    # n = 2 samples.
    two = wave["two"].result()
    check([c["index"] for c in two["choices"]] == [0, 1], f"n = 2: {two}")
    check(two["usage"]["completion_tokens"] == 8, f"n = 2 usage: {two['usage']}")
    stopped = stopped.result()
    check(stopped["choices"][0] == dict(choice, text=choice["text"][:choice["text"].index(stop)], finish_reason="stop"),
          f"stop {stop!r}: {stopped}")

    # logprobs: one entry a token, the chosen (greedy) token the most likely of its top 2.
    lp = wave["logprobs"].result()["choices"][0]
    check(choice["text"].startswith(lp["text"]), f"logprobs changed the greedy text: {lp}")
    lps = lp["logprobs"]
    check(len(lps["tokens"]) == len(lps["token_logprobs"]) == len(lps["top_logprobs"]) == len(lps["text_offset"]) == 4
          and "".join(lps["tokens"]) == lp["text"], f"logprobs shape: {lps}")
    for token, logprob, top, offset in zip(lps["tokens"], lps["token_logprobs"], lps["top_logprobs"], lps["text_offset"]):
        check(len(top) == 2 and top.get(token) == logprob == max(top.values()) and logprob < 0,
              f"token {token!r} {logprob} against its top 2 {top}")
        check(lp["text"][offset:].startswith(token), f"text_offset {offset} of {token!r}")

    # vLLM's beam extension: use_beam_search with best_of beams, the n best returned, equal to the CLI's.
    beams = wave["beams"].result()
    cli_beam_texts = [b.split("\n", 1)[1][:-1] for b in cli_output(cli_beams).split("=== prompt 0, beam ")[1:]]
    check([c["text"] for c in beams["choices"]] == cli_beam_texts[:2],
          f"beams: the CLI's {cli_beam_texts}, the server's {beams['choices']}")
    check(beams["usage"]["completion_tokens"] == 15, f"beam usage counts the 3 beams: {beams['usage']}")
    # best_of samples 3 and returns the one of highest log-probability a token.
    best = wave["best"].result()
    check(len(best["choices"]) == 1 and best["usage"]["completion_tokens"] == 12, f"best_of: {best}")

    # Chat through the model's template (ChatML): greedy content equal to the CLI's --chat.
    whole_chat = wave["chat"].result()
    check(whole_chat["object"] == "chat.completion" and whole_chat["id"].startswith("chatcmpl-"), f"chat: {whole_chat}")
    (answer,) = whole_chat["choices"]
    check(answer["message"]["role"] == "assistant" and answer["finish_reason"] == "stop", f"chat choice: {answer}")
    cli_answer = cli_output(cli_chat)
    check(cli_answer == answer["message"]["content"] + "\n",
          f"the CLI's chat says {cli_answer!r}, the server {answer['message']['content']!r}")
    chat_usage = whole_chat["usage"]
    check(chat_usage["prompt_tokens"] > 20 and chat_usage["total_tokens"] == chat_usage["prompt_tokens"] +
          chat_usage["completion_tokens"], f"chat usage: {chat_usage}")
    events = wave["chat_stream"].result()
    check(all(e["object"] == "chat.completion.chunk" for e in events), f"chat chunks: {events}")
    check(events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}, f"first chat chunk: {events[0]}")
    deltas = [e["choices"][0] for e in events if e["choices"]]
    check("".join(d["delta"].get("content", "") for d in deltas) == answer["message"]["content"] and
          deltas[-1] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}, f"chat deltas: {deltas}")
    check(events[-1]["usage"] == chat_usage, f"chat usage event: {events[-1]}")
    content = wave["chat_logprobs"].result()["choices"][0]["logprobs"]["content"]
    check(len(content) == 3 and all(c["top_logprobs"][0]["token"] == c["token"] and bytes(c["bytes"]) == c["token"].encode()
                                    for c in content), f"chat logprobs: {content}")
    bench.result()
    unseeded = wave["unseeded"].result()["choices"][0]["text"]
    check(unseeded != first, f"two requests without a seed sampled the same {first!r}")
    seeded = [r.result()["choices"][0]["text"] for r in wave["seeded"]]
    check(seeded[0] == seeded[1], f"seed 11 sampled {seeded}")

    # Long streams fill the queue (--max-queued-requests): one more gets 429. Then their clients
    # hang up mid-stream: their requests are aborted and every KV block is free again.
    long_body = {"prompt": PROMPT, "max_tokens": 500, "temperature": 0, "ignore_eos": True}
    streams = [open_stream(port, long_body) for _ in range(QUEUE)]
    for _, resp in streams:
        read_event(resp)
    error_of(long_body, 429, rf"limit \(--max-queued-requests {QUEUE}\)")
    # /metrics is what the engine thread published after its last step: it may lag a step behind.
    wait_metrics(port, lambda m: m["pagedkv_requests_running"] == QUEUE and m["pagedkv_kv_blocks_used"] >= QUEUE,
                 "the long streams running")
    for conn, resp in streams:
        resp.close()
        conn.close()
    queued += QUEUE
    freed = wait_metrics(port, lambda m: m["pagedkv_requests_aborted_total"] == QUEUE and m["pagedkv_kv_blocks_used"] == 0
                         and m["pagedkv_requests_running"] == 0, "the hung-up streams aborted and freed")
    check(freed["pagedkv_requests_finished_total"] == queued, f"finished requests, {queued} expected: {freed}")
    check(complete(port, {"prompt": PROMPT, "max_tokens": 8, "temperature": 0})["choices"][0]["text"] == choice["text"],
          "the server answers the same after the hang-ups")
    queued += 1
    # Every request that produced a token has its time to first token; buckets are cumulative.
    m = metrics(port)
    ttft = "pagedkv_time_to_first_token_seconds"
    check(m[ttft + "_count"] == queued and m[ttft + '_bucket{le="+Inf"}'] == queued and m[ttft + "_sum"] > 0,
          f"TTFT of {queued}: {m}")
    check(m["pagedkv_time_per_output_token_seconds_count"] > queued, f"TPOT: {m}")

    # The stalled client was dropped: its socket reads the end (or an error status), not a timeout.
    reply = stalled.recv(4096)
    check(reply == b"" or reply.startswith(b"HTTP/1.1 4"), f"the stalled client was dropped: {reply[:80]!r}")
    stalled.close()

    # SIGTERM: new requests get 503; a stream running past --shutdown-timeout 1 is aborted and still
    # gets its finish_reason and [DONE]; the server exits 0.
    conn, resp = open_stream(port, long_body)
    read_event(resp)
    server.send_signal(signal.SIGTERM)
    terminated = True
    deadline = time.monotonic() + 5
    while (got := request(port, "GET", "/health"))[0] != 503:  # the signal thread has begun to drain
        check(time.monotonic() < deadline and got[0] == 200, f"/health not 503 within 5 s of SIGTERM: {got}")
    check(json.loads(got[2]) == {"status": "stopping"}, f"/health: {got}")
    got = request(port, "POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 1})
    check(got[0] == 503 and json.loads(got[2])["error"]["message"] == "the server is stopping", f"503: {got}")
    events = read_events(resp)
    check(events[-1]["choices"][0]["finish_reason"] == "aborted", f"the aborted stream's last event: {events[-1]}")
    conn.close()
finally:
    pool.shutdown(wait=False, cancel_futures=True)
    for process in (cli_greedy, cli_beams, cli_chat, twin):
        if process.poll() is None:
            process.kill()
    status, rest = stop_server(server, terminated)
check(status == 0, f"the server exited with {status}: {rest}")
print("serve_test: all checks passed")
