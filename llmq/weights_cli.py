"""`llmq weights`: a model folder's digest, and pushing the folder to object storage for a
deployment version's `weights_uri` and `sha256` (see `workers.weights` for the digest)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated

import typer

from workers.weights import WeightsError, folder_digest

weights_app = typer.Typer(help="Model weights in object storage: digest a folder, push it.")

EndpointOption = Annotated[
    str | None,
    typer.Option(
        "--endpoint-url", envvar="LLMQ_S3_ENDPOINT_URL", help="S3 API endpoint (not AWS)."
    ),
]
FolderArgument = Annotated[
    Path,
    typer.Argument(exists=True, file_okay=False, dir_okay=True, help="The model folder."),
]


@weights_app.command()
def digest(path: FolderArgument) -> None:
    """Print the folder's sha256 (what a deployment version's `sha256` pins)."""
    typer.echo(folder_digest(path))


async def push_folder(path: Path, uri: str, endpoint_url: str | None) -> str:
    """Upload `path` under `uri` (credentials from the environment); returns its sha256."""
    from workers.s3_weights import S3WeightsSource

    sha256 = await asyncio.to_thread(folder_digest, path)
    async with S3WeightsSource(endpoint_url=endpoint_url) as source:
        await source.push(path, uri)
    return sha256


@weights_app.command()
def push(
    path: FolderArgument,
    uri: Annotated[str, typer.Argument(help="Where to put it: s3://bucket/prefix (new).")],
    endpoint_url: EndpointOption = None,
) -> None:
    """Upload the folder; print the deployment spec's `weights_uri` and `sha256` (JSON; or
    `llmq deployments put --weights-uri ... --sha256 ...`)."""
    from llmq.logging import configure_logging

    configure_logging(json=False)  # logs to stderr: stdout carries only the JSON
    try:
        sha256 = asyncio.run(push_folder(path, uri, endpoint_url))
    except WeightsError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(json.dumps({"weights_uri": uri, "sha256": sha256}))


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt")
"""Files that hold weights: what `pull --tokenizer-only` leaves behind."""


async def pull_folder(uri: str, dest: Path, endpoint_url: str | None, tokenizer_only: bool) -> int:
    """Download the objects under `uri` into `dest` (without weight files when
    `tokenizer_only`); returns how many files were written."""
    from workers.s3_weights import S3WeightsSource

    async with S3WeightsSource(endpoint_url=endpoint_url) as source:
        listed = await source.list(uri)
        wanted = [p for p, _ in listed if not (tokenizer_only and p.endswith(WEIGHT_SUFFIXES))]
        for relative in wanted:
            target = dest / relative
            if ".." in Path(relative).parts:
                raise WeightsError(f"{uri} holds an object outside its folder: {relative}")
            target.parent.mkdir(parents=True, exist_ok=True)
            await source.download(uri, relative, target)
    return len(wanted)


@weights_app.command()
def pull(
    uri: Annotated[str, typer.Argument(help="The folder: s3://bucket/prefix.")],
    dest: Annotated[Path, typer.Argument(file_okay=False, help="Where to write it.")],
    tokenizer_only: Annotated[
        bool,
        typer.Option(help="Leave the weight files (what a gateway needs: tokenizer, config)."),
    ] = False,
    endpoint_url: EndpointOption = None,
) -> None:
    """Download a model folder from object storage (a gateway pod's init container pulls
    each deployment's tokenizer this way; workers fetch and verify weights themselves)."""
    from llmq.logging import configure_logging

    configure_logging(json=False)
    try:
        files = asyncio.run(pull_folder(uri, dest, endpoint_url, tokenizer_only))
    except WeightsError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    if files == 0:
        typer.echo(f"error: nothing under {uri}", err=True)
        raise typer.Exit(1)
    typer.echo(f"pulled {files} files into {dest}")
