"""CPU layout of a CPU-engine stack: floating threads move, bound ones stay, the engines get
the cores the platform does not."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from llmq import affinity
from llmq.devstack_settings import DevStackSettings

needs_two_cores = pytest.mark.skipif(
    not affinity.supported() or len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores, Linux"
)


def test_engines_get_the_cores_the_platform_does_not() -> None:
    assert DevStackSettings(platform_cores=[]).engine_cores({0, 1}) is None
    assert DevStackSettings(platform_cores=[1]).engine_cores({0, 1, 2}) == [0, 2]
    with pytest.raises(ValueError, match="leave at least one"):
        DevStackSettings(platform_cores=[0, 1]).engine_cores({0, 1})
    with pytest.raises(ValueError, match=r"cannot use: \[7\]"):
        DevStackSettings(platform_cores=[7]).engine_cores({0, 1})


@needs_two_cores
def test_pinned_sets_the_affinity_a_child_inherits_and_restores_it() -> None:
    before = os.sched_getaffinity(0)
    first = min(before)
    with affinity.pinned([first]):
        child = subprocess.run(
            [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    assert child.stdout.strip() == f"[{first}]"
    assert os.sched_getaffinity(0) == before


@needs_two_cores
def test_floating_threads_move_and_a_thread_bound_to_one_core_stays() -> None:
    cores = sorted(os.sched_getaffinity(0))
    engine_core, front_end = cores[0], cores[1:]
    bound = threading.Event()
    release = threading.Event()
    tids: dict[str, int] = {}

    def compute_thread() -> None:  # what an engine's OpenMP binding does to its thread
        os.sched_setaffinity(0, {engine_core})
        tids["compute"] = threading.get_native_id()
        bound.set()
        release.wait(5)

    def floating_thread() -> None:
        tids["floating"] = threading.get_native_id()
        release.wait(5)

    threads = [threading.Thread(target=compute_thread), threading.Thread(target=floating_thread)]
    before = os.sched_getaffinity(0)
    for thread in threads:
        thread.start()
    try:
        assert bound.wait(5)
        moved = affinity.pin_floating_threads(os.getpid(), front_end)
        assert moved >= 2  # this thread and the floating one at least
        assert os.sched_getaffinity(tids["floating"]) == set(front_end)
        assert os.sched_getaffinity(tids["compute"]) == {engine_core}
        assert affinity.pin_floating_threads(os.getpid(), front_end) == 0  # nothing left
    finally:
        release.set()
        for thread in threads:
            thread.join()
        os.sched_setaffinity(0, before)


def test_process_tree_lists_a_child() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)  # fmt: skip
    try:
        assert affinity.process_tree(os.getpid())[0] == os.getpid()
        assert child.pid in affinity.process_tree(os.getpid())
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(10)
