"""CPU accounting for benchmarks: process trees read from /proc, per 1,000 tokens."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from llmq.bench.cpu import cpu_per_1k_tokens, cpu_snapshot, process_tree_cpu_s

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs /proc")


def test_a_process_tree_counts_its_childrens_cpu() -> None:
    burn = (
        "import sys, time\nend = time.process_time() + 0.3\n"
        "while time.process_time() < end: pass\nprint('burnt', flush=True)\nsys.stdin.read()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", burn], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == b"burnt\n"
        assert process_tree_cpu_s(child.pid) >= 0.3
        # This process's tree includes the child.
        assert process_tree_cpu_s(os.getpid()) >= process_tree_cpu_s(child.pid)
        # Named in its own right (a worker the controller spawned), it counts only there.
        alone = process_tree_cpu_s(os.getpid(), frozenset({child.pid}))
        snapshot = cpu_snapshot({"parent": os.getpid(), "child": child.pid})
        assert snapshot["child"] >= 0.3
        assert snapshot["parent"] < alone + 0.2 < process_tree_cpu_s(os.getpid())
    finally:
        child.communicate(b"")
    assert process_tree_cpu_s(child.pid) == 0.0  # gone: nothing to read


def test_cpu_per_1k_tokens() -> None:
    per_1k = cpu_per_1k_tokens({"gateway": 1.0}, {"gateway": 1.5, "worker": 0.25}, 5_000)
    assert per_1k == pytest.approx({"gateway": 0.1, "worker": 0.05})
    assert cpu_per_1k_tokens({}, {"gateway": 1.0}, 0) == {}
