#!/usr/bin/env python3
"""Mutation check: each mutation below is a one-line bug in include/pagedkv that a test must catch.

The working tree (tracked files and untracked ones git does not ignore) is copied to a scratch
directory; there each mutation is applied to the copy of its header, the core tests are rebuilt
and run under ctest (so each gets its RC_PARAMS), and the header is restored. The real headers
are never touched. A mutation is caught when a test fails; the check fails when one survives,
when a mutation no longer matches its header (it went stale: update it), when a mutant does not
compile, or when the unmutated copy does not pass.

Run from the repository root:  python3 tools/mutate.py [--keep DIR] [--only NAME_SUBSTRING] [-j N]
It takes about 3 minutes a mutation on 2 cores (each rebuilds the tests that include its header).
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass


@dataclass
class mutation:
    name: str
    header: str  # below include/pagedkv/
    original: str  # must occur exactly once in the header
    mutant: str


MUTATIONS = [
    mutation("prefix hit ignores the parent's generation", "prefix_cache.hpp",
             "    if (e.parent != parent) return false;",
             "    if (e.parent.block != parent.block) return false;"),
    mutation("insert skips the stale-parent check", "prefix_cache.hpp",
             "    if (parent.block != null_block && !is_current(parent)) return std::nullopt;\n",
             ""),
    mutation("slot offset off by one", "block_table.hpp",
             "           position % block_size_;",
             "           (position + 1) % block_size_;"),
    mutation("append skips copy-on-write", "kv_cache_manager.hpp",
             "    const bool copy = needs_copy_on_write(s);",
             "    const bool copy = false;"),
    mutation("hash hit accepted without comparing tokens", "prefix_cache.hpp",
             "    return std::equal(stored.begin(), stored.end(), tokens.begin(), tokens.end());",
             "    return stored.size() == tokens.size();"),
    mutation("free leaks the sequence's blocks", "kv_cache_manager.hpp",
             "    release_all(s);\n    sequences_.erase(seq);",
             "    (void)s;\n    sequences_.erase(seq);"),
    mutation("LRU evicts the newest idle block", "eviction.hpp",
             "      return list_.pop_front();",
             "      return list_.pop_back();"),
    mutation("the scheduler ignores the token budget", "scheduler.hpp",
             "std::min(static_cast<std::int32_t>(s.tokens.size()) - computed, budget);",
             "static_cast<std::int32_t>(s.tokens.size()) - computed;"),
    mutation("swap copies a shared block twice", "kv_cache_manager.hpp",
             "        if (seen.emplace(id, true).second) blocks.push_back(id);",
             "        blocks.push_back(id);"),
]

# The tests that can see these headers, stateful ones first.
TEST_TARGETS = ["test_kv_cache_manager_stateful", "test_scheduler_stateful", "test_kv_cache_manager",
                "test_prefix_cache", "test_block_table", "test_eviction", "test_scheduler"]


def run(cmd, cwd, log=None, timeout=None):
    """Runs cmd; returns (exit status, output)."""
    try:
        done = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=timeout)
        status, output = done.returncode, done.stdout
    except subprocess.TimeoutExpired as e:
        status, output = 124, (e.stdout or b"").decode(errors="replace") + "\n(timed out)"
    if log:
        with open(log, "a") as f:
            f.write(f"$ {' '.join(cmd)}\n{output}\n")
    return status, output


def copy_tree(root, dest):
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                           check=True, stdout=subprocess.PIPE).stdout.decode().split("\0")
    for path in filter(None, files):
        src = os.path.join(root, path)
        if not os.path.isfile(src):
            continue  # deleted in the working tree, or a submodule
        os.makedirs(os.path.dirname(os.path.join(dest, path)), exist_ok=True)
        shutil.copy2(src, os.path.join(dest, path))


def test_names(build):
    """Maps each ctest test of TEST_TARGETS to its executable's name."""
    status, output = run(["ctest", "--show-only=json-v1"], build)
    if status != 0:
        sys.exit(f"mutate: ctest --show-only failed:\n{output}")
    names = {}
    for test in json.loads(output)["tests"]:
        exe = os.path.basename(test.get("command", [""])[0])
        if exe in TEST_TARGETS:
            names[test["name"]] = exe
    return names


def run_tests(build, names, jobs, log):
    """Runs the tests; returns the executables whose tests failed, as {exe: [test names]}."""
    regex = "^(" + "|".join(re.escape(n) for n in names) + ")$"
    last_failed = os.path.join(build, "Testing", "Temporary", "LastTestsFailed.log")
    if os.path.exists(last_failed):
        os.remove(last_failed)
    run(["ctest", "-j", str(jobs), "--timeout", "300", "--output-on-failure", "-R", regex], build, log)
    failed = {}
    if os.path.exists(last_failed):
        with open(last_failed) as f:
            for line in f:
                name = line.strip().split(":", 1)[-1]
                if name in names:
                    failed.setdefault(names[name], []).append(name)
    return failed


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keep", help="scratch directory to use and keep (default: a temporary one)")
    parser.add_argument("--only", help="run only the mutations whose name contains this")
    parser.add_argument("-j", type=int, default=os.cpu_count() or 2, help="build and test jobs")
    args = parser.parse_args()
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], check=True, stdout=subprocess.PIPE,
                          text=True).stdout.strip()
    mutations = [m for m in MUTATIONS if not args.only or args.only in m.name]
    scratch = args.keep or tempfile.mkdtemp(prefix="pagedkv-mutate-")
    source, build = os.path.join(scratch, "src"), os.path.join(scratch, "build")
    log = os.path.join(scratch, "mutate.log")
    shutil.rmtree(source, ignore_errors=True)
    copy_tree(root, source)
    print(f"mutate: {len(mutations)} mutations in {source}, log {log}", flush=True)

    configure = ["cmake", "-S", source, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                 "-DPAGEDKV_ENABLE_CUDA=OFF", "-DPAGEDKV_BUILD_BENCHMARKS=OFF", "-DPAGEDKV_BUILD_EXAMPLES=OFF"]
    build_tests = ["cmake", "--build", build, "-j", str(args.j), "--target", *TEST_TARGETS]
    for cmd in (configure, build_tests):
        status, output = run(cmd, root, log)
        if status != 0:
            sys.exit(f"mutate: the unmutated copy does not build:\n{output[-4000:]}")
    names = test_names(build)
    if failed := run_tests(build, names, args.j, log):
        sys.exit(f"mutate: the unmutated copy fails {sorted(failed)}: fix that first (log {log})")

    survivors = []
    for m in mutations:
        path = os.path.join(source, "include", "pagedkv", m.header)
        with open(path) as f:
            text = f.read()
        start = time.monotonic()
        if text.count(m.original) != 1:
            print(f"STALE     {m.name}: {m.header} holds its line {text.count(m.original)} times", flush=True)
            survivors.append(m.name)
            continue
        with open(path, "w") as f:
            f.write(text.replace(m.original, m.mutant))
        try:
            status, output = run(build_tests, root, log)
            if status != 0:
                verdict, detail = "NO BUILD", "the mutant does not compile (see the log)"
                survivors.append(m.name)
            elif failed := run_tests(build, names, args.j, log):
                verdict = "caught"
                detail = "by " + ", ".join(f"{exe} ({len(tests)})" for exe, tests in failed.items())
            else:
                verdict, detail = "SURVIVED", "no test failed"
                survivors.append(m.name)
        finally:
            with open(path, "w") as f:
                f.write(text)
        print(f"{verdict:9} {m.name}: {detail} [{time.monotonic() - start:.0f} s]", flush=True)

    if not args.keep:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"mutate: {len(mutations) - len(survivors)} of {len(mutations)} caught")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
