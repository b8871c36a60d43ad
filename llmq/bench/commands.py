"""`llmq bench ...`: the benchmarks that print numbers (each imports its module lazily)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Literal, TypeVar

import typer
from pydantic import BaseModel

bench_app = typer.Typer(help="Benchmarks that print numbers.")
SettingsT = TypeVar("SettingsT", bound=BaseModel)
ReportT = TypeVar("ReportT", bound=BaseModel)
JsonOption = Annotated[Path | None, typer.Option("--json", help="Write raw numbers.")]
DEFAULT_RATES = [0.25, 0.5, 1.0]
"""`llmq bench goodput`'s offered rates (requests/s) when none are given."""


@bench_app.command("overhead")
def bench_overhead(
    base_url: Annotated[str, typer.Option(help="llmq's OpenAI base URL.")] = (
        "http://127.0.0.1:8000/v1"
    ),
    api_key: Annotated[str, typer.Option(help="llmq API key.")] = "sk-llmq-dev",
    model: Annotated[str, typer.Option(help="Model name on both targets.")] = (
        "smollm2-135m-instruct"
    ),
    concurrency: Annotated[list[int], typer.Option(help="Concurrency levels.")] = [1, 16],  # noqa: B006
    requests: Annotated[int, typer.Option(help="Requests per level, target and round.")] = 32,
    rounds: Annotated[
        int,
        typer.Option(
            min=1,
            help="Runs of every level on each target; the table pools them and shows "
            "each round's llmq/direct ratios.",
        ),
    ] = 1,
    max_tokens: Annotated[int, typer.Option(help="Output tokens per request.")] = 64,
    direct_frontend: Annotated[
        Literal["mirror", "floating"],
        typer.Option(
            help="On a stack with LLMQ_DEV_PLATFORM_CORES: mirror (the direct server's front "
            "end off its engine's core) or floating (vLLM's default)."
        ),
    ] = "mirror",
    retry_refused: Annotated[
        int,
        typer.Option(
            min=0,
            help="Re-send a refused request after its Retry-After up to this many times, as "
            "the OpenAI SDK does (2 by default); its times count from the first send.",
        ),
    ] = 0,
    json_path: JsonOption = None,
) -> None:
    """llmq against vLLM's own OpenAI server on the same model, side by side in one run."""
    from llmq.bench.overhead import OverheadError, OverheadSettings, run_overhead
    from llmq.bench.overhead_report import format_report, write_json
    from llmq.logging import configure_logging
    from llmq.services import ServiceStartError

    configure_logging(json=False, level="WARNING")
    settings = OverheadSettings(
        base_url=base_url,
        api_key=api_key,
        model=model,
        concurrency=concurrency,
        requests=requests,
        rounds=rounds,
        max_tokens=max_tokens,
        direct_frontend=direct_frontend,
        retry_refused=retry_refused,
    )
    try:
        report = run_overhead(settings)
    except (OverheadError, ServiceStartError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(format_report(report))
    if json_path is not None:
        write_json(report, json_path)


@bench_app.command("goodput")
def bench_goodput(
    base_url: Annotated[str, typer.Option(help="llmq's OpenAI base URL.")] = (
        "http://127.0.0.1:8000/v1"
    ),
    api_key: Annotated[str, typer.Option(help="llmq API key.")] = "sk-llmq-dev",
    model: Annotated[str, typer.Option(help="Model name on both targets.")] = (
        "smollm2-135m-instruct"
    ),
    rate: Annotated[list[float], typer.Option(help="Offered rates (requests/s).")] = DEFAULT_RATES,
    requests: Annotated[int, typer.Option(help="Requests per rate and target.")] = 24,
    duration_s: Annotated[
        float | None,
        typer.Option(help="Seconds of arrivals per rate and target (rate x this many requests)."),
    ] = None,
    max_tokens: Annotated[int, typer.Option(help="Output tokens per request.")] = 32,
    ttft_slo_s: Annotated[float, typer.Option(help="TTFT SLO for goodput (s).")] = 1.0,
    tpot_slo_s: Annotated[float, typer.Option(help="TPOT SLO for goodput (s).")] = 0.1,
    target: Annotated[list[str], typer.Option(help="Targets: llmq, direct.")] = ["llmq", "direct"],  # noqa: B006
    engine: Annotated[
        str,
        typer.Option(help="The stack's engine: vllm, or simulated (direct = simulated server)."),
    ] = "vllm",
    max_num_seqs: Annotated[
        int, typer.Option(help="The direct target's slots (set it to the stack's).")
    ] = 16,
    warm_up: Annotated[
        int, typer.Option(help="Unmeasured requests to each target first, 4 at a time.")
    ] = 8,
    plot: Annotated[Path, typer.Option(help="Where to write the PNG plot.")] = Path("goodput.png"),
    json_path: JsonOption = None,
) -> None:
    """Goodput against offered rate (Poisson arrivals), llmq and vLLM's own server."""
    from llmq.bench.goodput import GoodputSettings, format_report, run_goodput, write_json
    from llmq.bench.overhead import OverheadError
    from llmq.bench.plot import write_goodput_plot
    from llmq.logging import configure_logging
    from llmq.services import ServiceStartError

    configure_logging(json=False, level="WARNING")
    settings = GoodputSettings.model_validate(
        {
            "base_url": base_url, "api_key": api_key, "model": model, "rates": rate,
            "requests": requests, "duration_s": duration_s, "max_tokens": max_tokens,
            "ttft_slo_s": ttft_slo_s, "tpot_slo_s": tpot_slo_s, "targets": target, "engine": engine,
            "max_num_seqs": max_num_seqs, "warm_up_requests": warm_up,
        }
    )  # fmt: skip
    try:
        report = run_goodput(settings)
    except (OverheadError, ServiceStartError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(format_report(report))
    write_goodput_plot(report, plot)
    typer.echo(f"plot: {plot}")
    if json_path is not None:
        write_json(report, json_path)


@bench_app.command("load")
def bench_load(
    scenario: Annotated[
        str, typer.Option(help="single, batch-flood (with/without) or team-flood (with/without).")
    ] = "single",
    settings_json: Annotated[
        str, typer.Option("--settings", help="LoadSettings fields as JSON, e.g. rates, keys.")
    ] = "{}",
    json_path: JsonOption = None,
) -> None:
    """A mixed workload (interactive, batch flood, teams) against a running stack."""
    from llmq.bench.load import SCENARIOS, format_comparison, run_load
    from llmq.bench.load_model import LoadSettings, format_report
    from llmq.logging import configure_logging

    configure_logging(json=False, level="WARNING")
    settings = LoadSettings.model_validate_json(settings_json)
    if scenario == "single":
        report = run_load(settings)
        typer.echo(format_report(report))
        result = report.model_dump_json(indent=2)
    elif scenario in SCENARIOS:
        comparison = SCENARIOS[scenario](settings)
        typer.echo(format_comparison(comparison))
        result = comparison.model_dump_json(indent=2)
    else:
        raise typer.BadParameter(f"unknown scenario {scenario!r}", param_hint="--scenario")
    if json_path is not None:
        json_path.write_text(result + "\n")


@bench_app.command("batch")
def bench_batch(
    settings_json: Annotated[
        str,
        typer.Option(
            "--settings", help='BatchFileSettings as JSON: {"lines": 1000, "load": {...}}.'
        ),
    ] = "{}",
    json_path: JsonOption = None,
) -> None:
    """A batch file through the Batch API beside an interactive stream, and without it."""
    from llmq.bench.batch_file import BatchFileSettings, format_batch_file, run_batch_file
    from llmq.logging import configure_logging

    configure_logging(json=False, level="WARNING")
    comparison = run_batch_file(BatchFileSettings.model_validate_json(settings_json))
    typer.echo(format_batch_file(comparison))
    if json_path is not None:
        json_path.write_text(comparison.model_dump_json(indent=2) + "\n")


@bench_app.command("chaos")
def bench_chaos(
    settings_json: Annotated[
        str, typer.Option("--settings", help="ChaosSettings fields as JSON (rate, kill_at_s ...).")
    ] = "{}",
) -> None:
    """SIGKILL a worker (and optionally restart Redis) under load; count lost and duplicated."""
    from llmq.bench.chaos import ChaosSettings, format_chaos, run_chaos
    from llmq.logging import configure_logging

    configure_logging(json=False, level="WARNING")
    figures, timeline = asyncio.run(run_chaos(ChaosSettings.model_validate_json(settings_json)))
    typer.echo(format_chaos(figures, timeline))


@bench_app.command("rollout")
def bench_rollout(
    settings_json: Annotated[
        str,
        typer.Option("--settings", help="RolloutBenchSettings fields as JSON (rate, steps ...)."),
    ] = "{}",
) -> None:
    """Roll a new version out under steady load: failed, interrupted, lost and duplicated
    requests, and TTFT p95 before, while it loads, during the canary and after."""
    from llmq.bench.rollout import RolloutBenchSettings, RolloutRun, format_rollout
    from llmq.logging import configure_logging

    configure_logging(json=False, level="WARNING")
    run = RolloutRun(RolloutBenchSettings.model_validate_json(settings_json))
    figures, ttft, served = asyncio.run(run.run())
    typer.echo(format_rollout(figures, ttft, served, run.timeline))


@bench_app.command("simulate")
def bench_simulate(
    settings_json: Annotated[
        str, typer.Option("--settings", help="SimulationSettings fields as JSON.")
    ] = "{}",
) -> None:
    """A SIMULATED pool of GPU replicas (step times from first principles, no model)."""
    from llmq.bench.simulate import SimulationSettings, format_simulation, run_simulation

    typer.echo(
        format_simulation(run_simulation(SimulationSettings.model_validate_json(settings_json)))
    )


@bench_app.command("placement")
def bench_placement(
    settings_json: Annotated[
        str, typer.Option("--settings", help="PlacementSettings fields as JSON.")
    ] = "{}",
    json_path: JsonOption = None,
) -> None:
    """LoRA adapter placement on a SIMULATED pool: adapter loads and each traffic class's
    TTFT under four routing policies, the same arrivals for each."""
    from llmq.bench.lora_placement import PlacementSettings, format_placement, run_placement

    _simulation(PlacementSettings, run_placement, format_placement, settings_json, json_path)


@bench_app.command("relay")
def bench_relay(
    base_url: Annotated[str, typer.Option(help="llmq's OpenAI base URL.")] = (
        "http://127.0.0.1:8000/v1"
    ),
    api_key: Annotated[str, typer.Option(help="llmq API key.")] = "sk-llmq-dev",
    model: Annotated[str, typer.Option(help="Model name on both targets.")] = (
        "smollm2-135m-instruct"
    ),
    streams: Annotated[list[int], typer.Option(help="Concurrent streams per phase.")] = [8, 32, 64],  # noqa: B006
    duration_s: Annotated[float, typer.Option(help="Seconds per phase.")] = 15.0,
    max_tokens: Annotated[int, typer.Option(help="Output tokens per streamed request.")] = 256,
    max_num_seqs: Annotated[
        int, typer.Option(help="The direct server's slots (set it to the stack's).")
    ] = 64,
    max_model_len: Annotated[int, typer.Option(help="The direct server's max_model_len.")] = 2048,
    idle_s: Annotated[float, typer.Option(help="Seconds of the idle CPU phase.")] = 5.0,
    jobs_streams: Annotated[int, typer.Option(help="Streams of the jobs/s phase.")] = 64,
    partitions: Annotated[
        int | None, typer.Option(help="Partitions per topic (default: LLMQ_DEV_PARTITIONS, 8).")
    ] = None,
    target: Annotated[list[str], typer.Option(help="Targets: llmq, direct.")] = ["llmq", "direct"],  # noqa: B006
    json_path: JsonOption = None,
) -> None:
    """The platform's own ceiling on SIMULATED workers: relayed tokens/s per gateway core,
    added inter-token delay, worker CPU outside its engine, jobs/s per partition."""
    from pydantic import ValidationError

    from llmq.bench.relay import RelayError, RelaySettings, run_relay
    from llmq.bench.relay_report import format_report
    from llmq.logging import configure_logging
    from llmq.services import ServiceStartError

    configure_logging(json=False, level="WARNING")
    fields = {
        "base_url": base_url, "api_key": api_key, "model": model, "streams": streams,
        "duration_s": duration_s, "max_tokens": max_tokens, "max_num_seqs": max_num_seqs,
        "max_model_len": max_model_len, "idle_s": idle_s, "jobs_streams": jobs_streams,
        "targets": target,
    }  # fmt: skip
    if partitions is not None:
        fields["partitions"] = partitions
    try:
        report = run_relay(RelaySettings.model_validate(fields))
    except (RelayError, ServiceStartError, ValidationError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(format_report(report))
    if json_path is not None:
        json_path.write_text(report.model_dump_json(indent=2) + "\n")


@bench_app.command("lora")
def bench_lora(
    base_url: Annotated[str, typer.Option(help="llmq's OpenAI base URL.")] = (
        "http://127.0.0.1:8000/v1"
    ),
    api_key: Annotated[str, typer.Option(help="A team's API key (it owns the adapters).")] = (
        "sk-llmq-dev"
    ),
    model: Annotated[str, typer.Option(help="The base deployment (runs LoRA).")] = (
        "smollm2-135m-instruct"
    ),
    s3_endpoint: Annotated[
        str | None, typer.Option(help="S3 API for the adapters (default: the dev stack's).")
    ] = None,
    concurrency: Annotated[int, typer.Option(help="Requests at once in throughput rounds.")] = 8,
    requests: Annotated[int, typer.Option(help="Requests per throughput round.")] = 32,
    rounds: Annotated[int, typer.Option(help="Rounds per target, alternating.")] = 2,
    max_tokens: Annotated[int, typer.Option(help="Output tokens per request.")] = 32,
    cold_runs: Annotated[int, typer.Option(help="Cold adapter loads to time.")] = 3,
) -> None:
    """Adapters on a running stack: cold against warm TTFT, and base + 3 adapters
    interleaved against the base alone (tokens/s), side by side in one run."""
    import os

    from llmq.bench.lora import LoraBenchSettings, format_report, run_lora_bench
    from llmq.devstack_settings import DevStackSettings
    from llmq.logging import configure_logging

    configure_logging(json=False, level="WARNING")
    for variable, value in (("AWS_ACCESS_KEY_ID", "llmq-dev"),
                            ("AWS_SECRET_ACCESS_KEY", "llmq-dev"),
                            ("AWS_DEFAULT_REGION", "us-east-1")):  # fmt: skip
        os.environ.setdefault(variable, value)  # the dev stack's moto takes any
    settings = LoraBenchSettings(
        base_url=base_url,
        api_key=api_key,
        model=model,
        s3_endpoint=s3_endpoint or f"http://127.0.0.1:{DevStackSettings().s3_port}",
        concurrency=concurrency,
        requests=requests,
        rounds=rounds,
        max_tokens=max_tokens,
        cold_runs=cold_runs,
    )
    typer.echo(format_report(settings, run_lora_bench(settings)))


@bench_app.command("autoscale")
def bench_autoscale(
    settings_json: Annotated[
        str, typer.Option("--settings", help="DaySettings fields as JSON.")
    ] = "{}",
    json_path: JsonOption = None,
) -> None:
    """A SIMULATED day of seed 000's traffic: the KEDA policy against a fixed peak fleet
    (goodput, GPU-hours, busy share at peak, cost per million output tokens)."""
    from llmq.bench.autoscale import DaySettings, format_day, run_day

    _simulation(DaySettings, run_day, format_day, settings_json, json_path)


def _simulation(
    settings: type[SettingsT],
    run: Callable[[SettingsT], ReportT],
    show: Callable[[ReportT], str],
    settings_json: str,
    json_path: Path | None,
) -> None:
    """Run a simulation benchmark from its settings' JSON; print it, and write its report."""
    report = run(settings.model_validate_json(settings_json))
    typer.echo(show(report))
    if json_path is not None:
        json_path.write_text(report.model_dump_json(indent=2) + "\n")
