"""`llmq k8s render`: the fleet's Kubernetes objects as YAML (see `control.k8s_fleet`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from control.k8s_fleet import Fleet, FleetPool, render_fleet
from llmq.plan import PRESETS, Plan, plan

k8s_app = typer.Typer(help="Kubernetes objects of an llmq fleet.")

SERVICES = ("gateway", "worker", "batch", "keda", "controller")
"""The services with an IRSA role (terraform's `service_role_arns`)."""
TERRAFORM_OUTPUTS = ("kafka_bootstrap", "buckets", "service_role_arns", "region")
"""The outputs of infra/terraform/envs/prod a fleet is rendered from."""


def from_terraform(outputs: dict[str, Any]) -> dict[str, str]:
    """Fleet fields from `terraform output -json` of infra/terraform/envs/prod."""
    value = {name: outputs[name]["value"] for name in TERRAFORM_OUTPUTS}
    buckets, roles = value["buckets"], value["service_role_arns"]
    return {
        "kafka_bootstrap": value["kafka_bootstrap"],
        "aws_region": value["region"],
        "files_bucket": buckets["files"],
        "adapters_bucket": buckets["adapters"],
        "weights_bucket": buckets["weights"],
        **{f"{service}_role_arn": roles[service] for service in SERVICES},
    }


EXAMPLE = {
    "kafka_bootstrap": "b-1.llmq-prod.abc123.c2.kafka.us-east-1.amazonaws.com:9098,"
    "b-2.llmq-prod.abc123.c2.kafka.us-east-1.amazonaws.com:9098",
    "files_bucket": "llmq-prod-files",
    "adapters_bucket": "llmq-prod-adapters",
    "weights_bucket": "llmq-prod-weights",
    "gateway_role_arn": "arn:aws:iam::123456789012:role/llmq-prod-gateway",
    "worker_role_arn": "arn:aws:iam::123456789012:role/llmq-prod-worker",
    "batch_role_arn": "arn:aws:iam::123456789012:role/llmq-prod-batch",
    "keda_role_arn": "arn:aws:iam::123456789012:role/llmq-prod-keda",
    "controller_role_arn": "arn:aws:iam::123456789012:role/llmq-prod-controller",
}
"""Placeholders of the committed example (infra/k8s/seed-fleet.yaml): no real account."""


def pool_of(result: Plan, weights_bucket: str) -> FleetPool:
    """A pool of the fleet from its plan: TP, SLOs and the autoscaling bounds."""
    p = result.input
    return FleetPool(
        deployment=p.pool,
        pool=p.pool,
        weights_uri=f"s3://{weights_bucket}/{p.pool}/",
        tensor_parallel=p.tensor_parallel,
        ttft_slo_s=p.ttft_slo_s,
        tpot_slo_s=p.tpot_slo_s,
        min_replicas=int(result.value("min_replicas")),
        max_replicas=int(result.value("max_replicas")),
        target_sequences=round(result.value("sequences_per_replica"), 1),
    )


def fleet_from(presets: list[str], terraform: dict[str, Any] | None, image: str | None) -> Fleet:
    """The fleet of these planned pools on the infrastructure `terraform` describes (the
    JSON of `terraform output -json`), or on the example's placeholders."""
    values = dict(EXAMPLE) if terraform is None else from_terraform(terraform)
    weights = values.pop("weights_bucket")
    pools = [pool_of(plan(PRESETS[name]), weights) for name in presets]
    extra = {"image": image} if image else {}
    return Fleet.model_validate({**values, **extra, "pools": [p.model_dump() for p in pools]})


def render_yaml(fleet: Fleet) -> str:
    import yaml

    header = "# Rendered by `llmq k8s render`; edit the inputs, not this file.\n"
    return header + yaml.safe_dump_all(render_fleet(fleet), sort_keys=False)


@k8s_app.command("render")
def render(
    preset: Annotated[list[str], typer.Option(help="Planned pools: seed-70b, seed-8b.")] = [  # noqa: B006
        "seed-70b",
        "seed-8b",
    ],
    terraform_output: Annotated[
        Path | None, typer.Option(help="`terraform output -json` of infra/terraform/envs/prod.")
    ] = None,
    image: Annotated[str | None, typer.Option(help="The llmq container image.")] = None,
    out: Annotated[Path | None, typer.Option(help="Write here instead of stdout.")] = None,
) -> None:
    """Render the fleet's objects (gateway, batch service, workers with KEDA) as YAML."""
    from pydantic import ValidationError

    unknown = [name for name in preset if name not in PRESETS]
    if unknown:
        typer.echo(f"error: unknown preset {unknown[0]} (known: {', '.join(PRESETS)})", err=True)
        raise typer.Exit(2)
    try:
        outputs = json.loads(terraform_output.read_text()) if terraform_output else None
        text = render_yaml(fleet_from(preset, outputs, image))
    except (OSError, KeyError, ValueError, ValidationError) as exc:
        typer.echo(f"error: {exc!r}", err=True)
        raise typer.Exit(1) from exc
    if out is None:
        typer.echo(text, nl=False)
    else:
        out.write_text(text)
