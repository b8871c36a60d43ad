"""A flood sent from its own process, so that it does not slow the client it disturbs.

On one machine, a Python client sending a flood of 30 streamed requests a second spends most
of a core on them; when the same event loop also times the steady team's requests, that
team's TTFT includes the flood's client work, which no real deployment has (its clients run
elsewhere). The flood runs here in a child process (spawned, so nothing is inherited but its
settings); the steady stream runs in the parent; both start together and their samples are
merged into one report. The flood still shares the machine's cores with the stack.
"""

from __future__ import annotations

import multiprocessing
from multiprocessing.connection import Connection
from typing import Any

from llmq.bench.load_model import LoadReport, LoadSettings, RequestSample, summarize

_READY, _GO = "ready", "go"
START_TIMEOUT_S = 60.0


def _flood_child(settings: dict[str, Any], pipe: Connection) -> None:
    """Child: import everything, say ready, wait for go, run, send the samples back."""
    from llmq.bench.load import run_load
    from llmq.logging import configure_logging

    configure_logging(json=False, level="WARNING")
    flood = LoadSettings.model_validate(settings)
    pipe.send(_READY)
    if pipe.recv() != _GO:
        return
    report = run_load(flood)
    pipe.send([sample.model_dump(mode="json") for sample in report.samples])


def run_with_flood_process(steady: LoadSettings, flood: LoadSettings) -> LoadReport:
    """Run `flood` in a child process and `steady` here, started together; one report of
    both (its settings: `steady`'s with `flood`'s rates)."""
    from llmq.bench.load import run_load

    parent, child = multiprocessing.get_context("spawn").Pipe()
    # The API keys are excluded from the settings' dump: hand them over explicitly.
    options = {**flood.model_dump(), "api_keys": dict(flood.api_keys)}
    process = multiprocessing.get_context("spawn").Process(
        target=_flood_child, args=(options, child), name="llmq-bench-flood", daemon=True
    )
    process.start()
    try:
        if not parent.poll(START_TIMEOUT_S) or parent.recv() != _READY:
            raise RuntimeError("the flood process did not start")
        parent.send(_GO)
        report = run_load(steady)
        while not parent.poll(1.0):  # a child that died sends nothing: do not wait for ever
            if not process.is_alive():
                raise RuntimeError(
                    f"the flood process ended (exit code {process.exitcode}) without its samples"
                )
        flood_samples = [RequestSample.model_validate(s) for s in parent.recv()]
    finally:
        process.join(timeout=30)
        if process.is_alive():
            process.kill()
    merged = LoadSettings.model_validate(
        {
            **steady.model_dump(),
            "api_keys": {**flood.api_keys, **steady.api_keys},
            "team_b_rate": flood.team_b_rate,
            "team_flood_rate": flood.team_flood_rate,
            "batch_flood": flood.batch_flood,
        }
    )
    samples = report.samples + flood_samples
    return report.model_copy(
        update={"settings": merged, "samples": samples, "groups": summarize(merged, samples)}
    )
