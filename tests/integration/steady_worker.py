"""A real worker process whose engine emits one token every `step_s`, like clockwork.

Run as ``python -m tests.integration.steady_worker STEP_S TOKENS`` with the worker's ``LLMQ_*``
settings in the environment. Tests that measure what the gateway adds to a stream's timing use
it: a real engine's own step-time jitter (on two shared CPU cores, hundreds of milliseconds)
would hide what they measure.
"""

from __future__ import annotations

import asyncio
import sys

from tests.integration.scripted_engine import ScriptedEngine
from workers.main import serve
from workers.settings import WorkerSettings

if __name__ == "__main__":
    step_s, tokens = float(sys.argv[1]), int(sys.argv[2])
    engine = ScriptedEngine(tokens=tokens, step_s=step_s, max_num_seqs=4)
    asyncio.run(serve(WorkerSettings(), engine))
