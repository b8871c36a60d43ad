"""`llmq deployments`: the admin API's deployments from a terminal (list, show, put, canary,
promote, rollback).

The functions take an ``httpx.Client`` pointed at llmq's `/v1`, with the admin key, so tests
drive them with a mock transport; the commands at the end only parse options and call them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import httpx
import typer

from llmq.cli_options import DEFAULT_BASE_URL, BaseUrlOption

DEFAULT_ADMIN_KEY = "sk-llmq-admin"
"""The local stack's admin key (`llmq dev up` configures and prints it)."""
AdminKeyOption = Annotated[
    str, typer.Option("--admin-key", envvar="LLMQ_ADMIN_KEY", help="llmq admin key.")
]
T = TypeVar("T")
deployments_app = typer.Typer(help="Deployments and their versions (admin API).")


class AdminApiError(RuntimeError):
    """The admin API answered with an error (its OpenAI-format message)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


def make_client(base_url: str, admin_key: str) -> httpx.Client:
    return httpx.Client(
        base_url=base_url.rstrip("/"),
        headers={"Authorization": f"Bearer {admin_key}"},
        timeout=60.0,
    )


def _checked(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        body = {}
    if response.is_error:
        message = body.get("error", {}).get("message") if isinstance(body, dict) else None
        raise AdminApiError(response.status_code, message or response.text)
    result: dict[str, Any] = body
    return result


def list_deployments(client: httpx.Client) -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = _checked(client.get("/deployments"))["data"]
    return data


def show(client: httpx.Client, name: str) -> dict[str, Any]:
    return _checked(client.get(f"/deployments/{name}"))


def put(client: httpx.Client, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return _checked(client.put(f"/deployments/{name}", json=spec))


def act(
    client: httpx.Client, name: str, action: str, body: dict[str, Any] | None = None
) -> dict[str, Any]:
    """`POST /deployments/{name}:{action}` (canary, promote, rollback)."""
    return _checked(client.post(f"/deployments/{name}:{action}", json=body))


def scale(client: httpx.Client, name: str, version: str, low: int, high: int) -> dict[str, Any]:
    body = {"version": version, "replicas": {"min": low, "max": high}}
    return _checked(client.patch(f"/deployments/{name}", json=body))


def spec_from_options(
    *,
    version: str,
    path: str,
    pool: str,
    precision: str | None = None,
    max_model_len: int | None = None,
    tensor_parallel_size: int | None = None,
    ttft_slo_s: float | None = None,
    tpot_slo_s: float | None = None,
    replicas_min: int | None = None,
    replicas_max: int | None = None,
    weights_uri: str | None = None,
    sha256: str | None = None,
    engine_args: list[str] | None = None,
) -> dict[str, Any]:
    """The PUT body from command-line options; options not given are left to the server's
    defaults. `engine_args` are `KEY=VALUE`, the value parsed as JSON when it is JSON."""
    spec: dict[str, Any] = {"version": version, "path": path, "pool": pool}
    optional = {
        "precision": precision,
        "max_model_len": max_model_len,
        "tensor_parallel_size": tensor_parallel_size,
        "ttft_slo_s": ttft_slo_s,
        "tpot_slo_s": tpot_slo_s,
        "weights_uri": weights_uri,
        "sha256": sha256,
    }
    spec.update({k: v for k, v in optional.items() if v is not None})
    if replicas_min is not None or replicas_max is not None:
        low = replicas_min if replicas_min is not None else 1
        spec["replicas"] = {"min": low, "max": replicas_max if replicas_max is not None else low}
    if engine_args:
        parsed: dict[str, Any] = {}
        for pair in engine_args:
            key, sep, value = pair.partition("=")
            if not sep or not key:
                raise ValueError(f"engine args must be KEY=VALUE, got {pair!r}")
            try:
                parsed[key] = json.loads(value)
            except ValueError:
                parsed[key] = value
        spec["engine_args"] = parsed
    return spec


def format_table(deployments: list[dict[str, Any]]) -> list[str]:
    """One line per version: deployment, version, arm, state, ready replicas, pool, precision."""
    rows = [("DEPLOYMENT", "VERSION", "ARM", "STATE", "READY", "POOL", "PRECISION")]
    for deployment in deployments:
        for v in deployment["versions"]:
            rows.append(
                (
                    deployment["id"], v["version"], v["arm"], v["state"],
                    str(v["ready_replicas"]), v["pool"], v["precision"],
                )
            )  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]


def report(exc: Exception) -> int:
    typer.echo(f"error: {exc}", err=True)
    return 1


def _call(base_url: str, admin_key: str, request: Callable[[httpx.Client], T]) -> T:
    """`request` on a client with the admin key; an API or connection error (a stack that is
    not running) is one line on stderr and exit code 1, not a traceback."""
    try:
        with make_client(base_url, admin_key) as client:
            return request(client)
    except (AdminApiError, httpx.HTTPError, OSError) as exc:  # httpx's are not OSErrors
        raise typer.Exit(report(exc)) from exc


def format_history(deployment: dict[str, Any], last: int = 5) -> list[str]:
    """The deployment's latest traffic changes: when, what, by whom, why."""
    lines = []
    for event in deployment.get("history", [])[-last:]:
        at = time.strftime("%H:%M:%S", time.localtime(event["at"]))
        reason = f": {event['reason']}" if event.get("reason") else ""
        lines.append(
            f"{at} {event['action']} {event['version']} -> {event['percent']:g}% "
            f"by {event['by']}{reason}"
        )
    return lines


def _print_table(deployment: dict[str, Any]) -> None:
    typer.echo("\n".join(format_table([deployment]) + format_history(deployment)))


@deployments_app.command("list")
def deployments_list(
    base_url: BaseUrlOption = DEFAULT_BASE_URL, admin_key: AdminKeyOption = DEFAULT_ADMIN_KEY
) -> None:
    """Every deployment's versions: arm (stable, canary), state, ready replicas, pool."""
    typer.echo("\n".join(format_table(_call(base_url, admin_key, list_deployments))))


@deployments_app.command("show")
def deployments_show(
    name: str,
    base_url: BaseUrlOption = DEFAULT_BASE_URL,
    admin_key: AdminKeyOption = DEFAULT_ADMIN_KEY,
) -> None:
    """One deployment as the admin API returns it (JSON)."""
    typer.echo(json.dumps(_call(base_url, admin_key, lambda c: show(c, name)), indent=2))


@deployments_app.command("put")
def deployments_put(
    name: str,
    version: Annotated[str, typer.Option(help="The new version's name (immutable).")],
    path: Annotated[str, typer.Option(help="Folder with the tokenizer (and local weights).")],
    pool: Annotated[str, typer.Option(help="The worker pool that runs this version.")],
    precision: Annotated[str | None, typer.Option(help="bfloat16, float16, float32, ...")] = None,
    max_model_len: Annotated[int | None, typer.Option()] = None,
    tensor_parallel_size: Annotated[int | None, typer.Option()] = None,
    ttft_slo_s: Annotated[float | None, typer.Option()] = None,
    tpot_slo_s: Annotated[float | None, typer.Option()] = None,
    replicas_min: Annotated[int | None, typer.Option()] = None,
    replicas_max: Annotated[int | None, typer.Option()] = None,
    weights_uri: Annotated[str | None, typer.Option(help="s3://bucket/prefix")] = None,
    sha256: Annotated[str | None, typer.Option(help="SHA-256 of the weights.")] = None,
    engine_arg: Annotated[
        list[str] | None, typer.Option(help="Engine setting KEY=VALUE (repeatable).")
    ] = None,
    base_url: BaseUrlOption = DEFAULT_BASE_URL,
    admin_key: AdminKeyOption = DEFAULT_ADMIN_KEY,
) -> None:
    """Register a new version of NAME (creating the deployment with its first version)."""
    try:
        spec = spec_from_options(
            version=version, path=path, pool=pool, precision=precision,
            max_model_len=max_model_len, tensor_parallel_size=tensor_parallel_size,
            ttft_slo_s=ttft_slo_s, tpot_slo_s=tpot_slo_s, replicas_min=replicas_min,
            replicas_max=replicas_max, weights_uri=weights_uri, sha256=sha256,
            engine_args=engine_arg,
        )  # fmt: skip
    except ValueError as exc:
        raise typer.Exit(report(exc)) from exc
    _print_table(_call(base_url, admin_key, lambda c: put(c, name, spec)))


def _deployment_action(
    name: str, action: str, base_url: str, admin_key: str, body: dict[str, object] | None = None
) -> None:
    _print_table(_call(base_url, admin_key, lambda c: act(c, name, action, body)))


@deployments_app.command("canary")
def deployments_canary(
    name: str,
    version: Annotated[str, typer.Option(help="The version to send a share of traffic.")],
    percent: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            max=100.0,
            help="A fixed share, in %, held until you promote or roll "
            "back. Omitted: an automatic rollout through --steps.",
        ),
    ] = None,
    steps: Annotated[
        str | None, typer.Option(help="The automatic rollout's shares, e.g. 5,25,100.")
    ] = None,
    min_step_s: Annotated[
        float | None, typer.Option(help="Least seconds per step of the automatic rollout.")
    ] = None,
    min_requests: Annotated[
        int | None, typer.Option(help="Requests each arm needs before a step is judged.")
    ] = None,
    policy_json: Annotated[
        str | None,
        typer.Option(
            "--policy", help='More RolloutPolicy fields as JSON, e.g. {"max_ttft_p95_ratio": 2}.'
        ),
    ] = None,
    base_url: BaseUrlOption = DEFAULT_BASE_URL,
    admin_key: AdminKeyOption = DEFAULT_ADMIN_KEY,
) -> None:
    """Start a rollout of VERSION of NAME: PERCENT of its requests (those not pinned), or
    steps taken by the controller while the canary is as healthy as the stable version
    (TTFT, TPOT, errors). A regression rolls it back either way."""
    body: dict[str, object] = {"version": version}
    if percent is not None:
        body["percent"] = percent
    policy: dict[str, object] = json.loads(policy_json) if policy_json else {}
    if steps is not None:
        policy["steps"] = [float(s) for s in steps.split(",") if s.strip()]
    if min_step_s is not None:
        policy["min_step_s"] = min_step_s
    if min_requests is not None:
        policy["min_requests"] = min_requests
    if policy:
        body["policy"] = policy
    _deployment_action(name, "canary", base_url, admin_key, body)


@deployments_app.command("promote")
def deployments_promote(
    name: str,
    base_url: BaseUrlOption = DEFAULT_BASE_URL,
    admin_key: AdminKeyOption = DEFAULT_ADMIN_KEY,
) -> None:
    """Make NAME's canary its stable version (all traffic); the old stable version drains."""
    _deployment_action(name, "promote", base_url, admin_key)


@deployments_app.command("rollback")
def deployments_rollback(
    name: str,
    base_url: BaseUrlOption = DEFAULT_BASE_URL,
    admin_key: AdminKeyOption = DEFAULT_ADMIN_KEY,
) -> None:
    """Send all of NAME's traffic back to its stable version; the canary drains."""
    _deployment_action(name, "rollback", base_url, admin_key)


@deployments_app.command("scale")
def deployments_scale(
    name: str,
    version: Annotated[str, typer.Option(help="The version to scale.")],
    replicas: Annotated[int, typer.Option(min=0, help="Replicas to run (its warm floor).")],
    max_replicas: Annotated[
        int | None, typer.Option(min=0, help="Most replicas (default: --replicas).")
    ] = None,
    base_url: BaseUrlOption = DEFAULT_BASE_URL,
    admin_key: AdminKeyOption = DEFAULT_ADMIN_KEY,
) -> None:
    """Run REPLICAS replicas of VERSION of NAME; scale-in drains the replicas it stops."""
    high = max_replicas if max_replicas is not None else replicas
    _print_table(_call(base_url, admin_key, lambda c: scale(c, name, version, replicas, high)))
