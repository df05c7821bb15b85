#!/usr/bin/env python3
"""Drives `pagedkv-llama serve` over HTTP on 127.0.0.1, with the standard library only.

    serve_test.py <pagedkv-llama> <model.gguf>

Starts the server on a free port (--port 0: it prints the one it took), checks /health,
/v1/models, /v1/completions whole and streamed (the JSON, the usage counts, the SSE framing,
greedy text equal to the CLI's for the same prompt, n = 2, stop strings), the 400/404/429 errors,
that clients hanging up mid-stream abort their requests and free their KV blocks (/metrics), and
that SIGTERM ends the server with exit status 0. Exits 1 naming the first failed check.
"""
import http.client
import json
import re
import signal
import subprocess
import sys
import time

llama, model = sys.argv[1], sys.argv[2]
PROMPT = "The capital of France is"


def check(condition, what):
    if not condition:
        raise AssertionError(what)


def request(port, method, path, body=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request(method, path, body=None if body is None else json.dumps(body),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read().decode()
    conn.close()
    return resp.status, resp.getheader("Content-Type", ""), data


def complete(port, body, status=200):
    got, _, data = request(port, "POST", "/v1/completions", body)
    check(got == status, f"POST {body}: status {got}, expected {status}: {data}")
    return json.loads(data)


def open_stream(port, body):
    """A streamed completion left open: the connection and its response, read line by line."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps(dict(body, stream=True)), {"Content-Type": "application/json"})
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


def metrics(port):
    status, content_type, text = request(port, "GET", "/metrics")
    check(status == 200 and content_type.startswith("text/plain"), f"/metrics: {status} {content_type}")
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.split(" ")
            values[name] = float(value)
    return values


def wait_metrics(port, done, what):
    deadline = time.monotonic() + 10
    while True:
        m = metrics(port)
        if done(m):
            return m
        check(time.monotonic() < deadline, f"{what} within 10 s: {m}")
        time.sleep(0.02)


def error_of(body, status, message_regex):
    got = complete(port, body, status)
    check(set(got) == {"error"} and set(got["error"]) == {"message", "type"}, f"error schema: {got}")
    check(re.search(message_regex, got["error"]["message"]), f"error {got} does not match {message_regex!r}")


server = subprocess.Popen([llama, "serve", "--model", model, "--port", "0", "--kv-cache-tokens", "2048",
                           "--max-queued-requests", "2"], stderr=subprocess.PIPE, text=True)
try:
    banner = ""
    while (match := re.search(r"listening on http://127\.0\.0\.1:(\d+)", banner)) is None:
        line = server.stderr.readline()
        check(line, f"the server ended before listening: {banner}")
        banner += line
    port = int(match.group(1))

    status, content_type, text = request(port, "GET", "/health")
    check(status == 200 and json.loads(text) == {"status": "ok"}, f"/health: {status} {text}")
    status, _, text = request(port, "GET", "/v1/models")
    models = json.loads(text)
    check(status == 200 and models["object"] == "list" and models["data"][0]["id"] == "SmolLM2-135M-Instruct.Q4_1",
          f"/v1/models: {status} {text}")

    # Whole: greedy, the CLI's text for the same prompt, usage as OpenAI counts it.
    whole = complete(port, {"model": "SmolLM2-135M-Instruct.Q4_1", "prompt": PROMPT, "max_tokens": 8, "temperature": 0})
    check(whole["object"] == "text_completion" and whole["id"].startswith("cmpl-"), f"completion: {whole}")
    (choice,) = whole["choices"]
    check(choice["index"] == 0 and choice["finish_reason"] == "length", f"choice: {choice}")
    usage = whole["usage"]
    check(usage["completion_tokens"] == 8 and usage["prompt_tokens"] > 0 and
          usage["total_tokens"] == usage["prompt_tokens"] + 8, f"usage: {usage}")
    cli = subprocess.run([llama, "--model", model, "--prompt", PROMPT, "--max-tokens", "8"], capture_output=True,
                         text=True, timeout=60)
    check(cli.returncode == 0 and cli.stdout == choice["text"] + "\n",
          f"the CLI says {cli.stdout!r} (status {cli.returncode}), the server {choice['text']!r}")

    # Streamed: the same text in 'data:' events, the finish_reason on the last choice, usage, [DONE].
    conn, resp = open_stream(port, {"prompt": PROMPT, "max_tokens": 8, "temperature": 0,
                                    "stream_options": {"include_usage": True}})
    events = []
    while (payload := read_event(resp)) != "[DONE]":
        events.append(json.loads(payload))
    check(resp.read() == b"", "data after [DONE]")
    conn.close()
    chunks = [e for e in events if e["choices"]]
    check(all(e["object"] == "text_completion" and len(e["choices"]) == 1 for e in chunks), f"chunks: {chunks}")
    check("".join(e["choices"][0]["text"] for e in chunks) == choice["text"], f"streamed text differs: {chunks}")
    check([e["choices"][0]["finish_reason"] for e in chunks][-1] == "length" and
          all(e["choices"][0]["finish_reason"] is None for e in chunks[:-1]), f"finish reasons: {chunks}")
    check(events[-1]["choices"] == [] and events[-1]["usage"] == usage, f"usage event: {events[-1]}")

    # n = 2 samples; a stop string cuts the greedy text before it.
    two = complete(port, {"prompt": PROMPT, "max_tokens": 6, "temperature": 0.8, "seed": 7, "n": 2})
    check([c["index"] for c in two["choices"]] == [0, 1], f"n = 2: {two}")
    check(two["usage"]["completion_tokens"] == 12, f"n = 2 usage: {two['usage']}")
    stop = choice["text"].split()[1]
    stopped = complete(port, {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "stop": [stop]})
    check(stopped["choices"][0] == dict(choice, text=choice["text"][:choice["text"].index(stop)], finish_reason="stop"),
          f"stop {stop!r}: {stopped}")

    # Refusals name the field.
    error_of({"prompt": PROMPT, "top_p": 0}, 400, r"^top_p: 0 is not in \(0, 1\]$")
    error_of({"prompt": PROMPT, "max_tokens": "8"}, 400, r"^max_tokens: expected an integer")
    error_of({"prompt": PROMPT, "temperature": -1}, 400, r"^temperature: -1 is not in \[0, 100\]$")
    error_of({"prompt": 42}, 400, r"^prompt: expected a string")
    error_of({"prompt": PROMPT, "model": "gpt-4"}, 404, r"^model: 'gpt-4' is not served")
    error_of({"prompt": "hello " * 3000}, 400, r"^prompt: its \d+ tokens need \d+ KV blocks of 16 tokens; the cache holds 128")
    status, _, text = request(port, "POST", "/v1/completions", None)
    check(status == 400 and "not JSON" in json.loads(text)["error"]["message"], f"empty body: {status} {text}")

    # Two long streams fill the queue (--max-queued-requests 2): a third gets 429. Then both clients
    # hang up mid-stream: their requests are aborted and every KV block is free again.
    long_body = {"prompt": PROMPT, "max_tokens": 500, "temperature": 0, "ignore_eos": True}
    streams = [open_stream(port, long_body) for _ in range(2)]
    for _, resp in streams:
        read_event(resp)
    error_of(long_body, 429, r"limit \(--max-queued-requests 2\)")
    # /metrics is what the engine thread published after its last step: it may lag a step behind.
    wait_metrics(port, lambda m: m["pagedkv_requests_running"] == 2 and m["pagedkv_kv_blocks_used"] >= 2,
                 "two streams running")
    for conn, resp in streams:
        resp.close()
        conn.close()
    freed = wait_metrics(port, lambda m: m["pagedkv_requests_aborted_total"] == 2 and m["pagedkv_kv_blocks_used"] == 0
                         and m["pagedkv_requests_running"] == 0, "the hung-up streams aborted and freed")
    # Finished: the whole, streamed, n = 2 and stop requests and the two hung up (refusals never queue).
    check(freed["pagedkv_requests_finished_total"] == 6, f"finished requests: {freed}")
    check(complete(port, {"prompt": PROMPT, "max_tokens": 8, "temperature": 0})["choices"][0]["text"] == choice["text"],
          "the server answers the same after the hang-ups")
finally:
    server.send_signal(signal.SIGTERM)
    try:
        status = server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
        raise AssertionError("the server did not stop within 30 s of SIGTERM")
    rest = server.stderr.read()
check(status == 0, f"the server exited with {status}: {rest}")
print("serve_test: all checks passed")
