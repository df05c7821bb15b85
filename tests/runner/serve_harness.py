"""What serve_test.py and serve_openai_test.py share: a `pagedkv-llama serve` started on a free
port and stopped by SIGTERM, the CLI run beside it for comparison, the check that names a failure,
and /metrics read as numbers."""
import http.client
import os
import re
import signal
import subprocess

# One OpenBLAS thread in the server and the CLIs the tests compare with: ctest runs two tests at once
# on CI's two cores, where OpenBLAS's waiting threads spin (sched_yield) against the other test:
# serve_test.py took 25 s (user 4.9 s, sys 3.6 s) against 46 s (5.2 s, 6.8 s) with its default.
os.environ["OPENBLAS_NUM_THREADS"] = "1"


def check(condition, what):
    if not condition:
        raise AssertionError(what)


def cli_run(llama, model, *args):
    """The CLI started now, in the background, for a comparison read later: its process."""
    return subprocess.Popen([llama, "--model", model, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def cli_output(process):
    """What the CLI started by cli_run printed, once it exited 0 (within 120 s)."""
    out, err = process.communicate(timeout=120)
    check(process.returncode == 0, f"the CLI {process.args} exited {process.returncode}: {err}")
    return out


def start_server(llama, model, *options):
    """The server on a port it chose (--port 0: it prints the one it took): (process, port)."""
    server = subprocess.Popen([llama, "serve", "--model", model, "--port", "0", *options], stderr=subprocess.PIPE,
                              text=True)
    banner = ""
    while (match := re.search(r"listening on http://127\.0\.0\.1:(\d+)", banner)) is None:
        line = server.stderr.readline()
        if not line:
            server.kill()
            raise AssertionError(f"the server ended before listening: {banner}")
        banner += line
    return server, int(match.group(1))


def stop_server(server, signalled=False):
    """SIGTERM (unless already sent), then the exit status and the rest of stderr, within 30 s."""
    if not signalled:
        server.send_signal(signal.SIGTERM)
    try:
        status = server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
        raise AssertionError("the server did not stop within 30 s of SIGTERM")
    return status, server.stderr.read()


def metrics(port):
    """GET /metrics as {name: value}; histogram buckets keep their label: name{le="0.1"}."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", "/metrics")
    resp = conn.getresponse()
    text = resp.read().decode()
    conn.close()
    check(resp.status == 200 and resp.getheader("Content-Type", "").startswith("text/plain"),
          f"/metrics: {resp.status} {resp.getheader('Content-Type')}")
    return {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines() if line and line[0] != "#"}
