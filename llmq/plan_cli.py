"""`llmq plan`: the seeds' sizing arithmetic for one or more pools (see `llmq.plan`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from llmq.plan import PRESETS, PlanInput, format_plan, plan, plans_json, write_tfvars

TFVARS = Path("infra/terraform/envs/prod/fleet.auto.tfvars.json")


def plan_command(
    preset: Annotated[
        list[str], typer.Option(help="A built-in pool: seed-70b, seed-8b (repeatable).")
    ] = [],  # noqa: B006
    input_file: Annotated[
        list[Path],
        typer.Option("--input", help="A PlanInput as JSON, for your own pool (repeatable)."),
    ] = [],  # noqa: B006
    peak_rps: Annotated[float | None, typer.Option(help="Override: req/s at peak.")] = None,
    prompt_tokens: Annotated[int | None, typer.Option(help="Override: mean prompt.")] = None,
    output_tokens: Annotated[int | None, typer.Option(help="Override: mean output.")] = None,
    prefix_cache_share: Annotated[
        float | None, typer.Option(help="Override: share of prompt tokens cached.")
    ] = None,
    usd_per_gpu_hour: Annotated[float | None, typer.Option(help="Override: GPU price.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Figures as JSON, stable keys.")] = False,
    tfvars: Annotated[
        Path | None,
        typer.Option(help=f"Write the pools' GPU node groups for Terraform (e.g. {TFVARS})."),
    ] = None,
) -> None:
    """Size model pools from model, GPU and traffic facts: KV memory, replicas, GPUs, nodes,
    cost per million output tokens and autoscaling bounds, each figure with its formula."""
    from pydantic import ValidationError

    unknown = [name for name in preset if name not in PRESETS]
    if unknown or not (preset or input_file):
        typer.echo(f"error: name --preset ({', '.join(PRESETS)}) or --input", err=True)
        raise typer.Exit(2)
    traffic = {
        "peak_rps": peak_rps, "prompt_tokens": prompt_tokens, "output_tokens": output_tokens,
        "prefix_cache_share": prefix_cache_share,
    }  # fmt: skip
    overrides = {k: v for k, v in traffic.items() if v is not None}
    try:
        inputs = [PRESETS[name] for name in preset]
        inputs += [PlanInput.model_validate_json(path.read_text()) for path in input_file]
        inputs = [_override(p, overrides, usd_per_gpu_hour) for p in inputs]
        results = [plan(p) for p in inputs]
    except (ValidationError, ValueError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(plans_json(results) if as_json else "\n\n".join(map(format_plan, results)))
    if tfvars is not None:
        write_tfvars(results, tfvars)
        if not as_json:
            typer.echo(f"\nwrote {tfvars}")


def _override(
    p: PlanInput, traffic: dict[str, float | int], usd_per_gpu_hour: float | None
) -> PlanInput:
    """A plan input with the command line's overrides, validated again."""
    data = p.model_dump()
    data["traffic"].update(traffic)
    if usd_per_gpu_hour is not None:
        data["gpu"]["usd_per_hour"] = usd_per_gpu_hour
    return PlanInput.model_validate(data)
