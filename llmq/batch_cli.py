"""`llmq batch`: submit a JSONL file to the OpenAI Batch API, follow a batch, cancel it.

Everything here takes an ``openai.OpenAI`` client, so tests drive it with a mock HTTP transport
and no server; ``llmq/cli.py`` only parses options and calls these functions.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import openai
import typer
from openai.types import Batch
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

TERMINAL_STATUSES: Final = frozenset({"completed", "failed", "expired", "cancelled"})
"""Statuses after which a batch never changes again."""


class BatchInputError(ValueError):
    """The JSONL input file cannot be prepared for upload (a line is not a request object)."""


def make_client(base_url: str, api_key: str) -> openai.OpenAI:
    """An OpenAI SDK client for llmq's API."""
    return openai.OpenAI(base_url=base_url, api_key=api_key)


def parse_metadata(pairs: Sequence[str]) -> dict[str, str]:
    """``["k=v", ...]`` as a dict; a value may contain ``=``, a key must not be empty."""
    metadata: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"metadata must be KEY=VALUE, got {pair!r}")
        metadata[key.strip()] = value
    return metadata


def prepare_input(path: Path, model: str | None) -> bytes:
    """The bytes to upload: the file as is, or with ``body.model`` set on every line to ``model``.

    Blank lines are kept out of a rewritten file; a line that is not a JSON object with an object
    ``body`` raises ``BatchInputError`` naming its line number (1-based).
    """
    data = path.read_bytes()
    if model is None:
        return data
    lines: list[str] = []
    for number, raw in enumerate(data.decode("utf-8").splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            request = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise BatchInputError(f"{path}:{number}: not JSON: {exc.msg}") from exc
        if not isinstance(request, dict) or not isinstance(request.get("body"), dict):
            raise BatchInputError(f"{path}:{number}: expected an object with an object 'body'")
        request["body"]["model"] = model
        lines.append(json.dumps(request, ensure_ascii=False))
    return ("\n".join(lines) + "\n").encode("utf-8")


def submit(
    client: openai.OpenAI,
    path: Path,
    *,
    endpoint: str,
    window: str,
    metadata: dict[str, str],
    model: str | None = None,
) -> Batch:
    """Upload ``path`` (purpose ``batch``), then create a batch on it; return the new batch."""
    uploaded = client.files.create(
        file=(path.name, prepare_input(path, model), "application/jsonl"), purpose="batch"
    )
    # The SDK types endpoint and window as literals; llmq's server decides what it accepts.
    # Metadata is left out of the request when empty rather than sent as null.
    options: dict[str, Any] = {"endpoint": endpoint, "completion_window": window}
    if metadata:
        options["metadata"] = metadata
    return client.batches.create(input_file_id=uploaded.id, **options)


def request_counts(batch: Batch) -> tuple[int, int, int]:
    """``(completed, failed, total)`` requests; zeros while the server has not counted yet."""
    counts = batch.request_counts
    if counts is None:
        return 0, 0, 0
    return counts.completed, counts.failed, counts.total


def follow(
    client: openai.OpenAI,
    batch_id: str,
    interval: float,
    on_update: Callable[[Batch], None],
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> Batch:
    """Retrieve the batch every ``interval`` seconds until its status is terminal.

    ``on_update`` sees every retrieved batch, the terminal one included, which is returned.
    """
    while True:
        batch = client.batches.retrieve(batch_id)
        on_update(batch)
        if batch.status in TERMINAL_STATUSES:
            return batch
        sleep(interval)


def elapsed_s(batch: Batch, watched_s: float) -> float:
    """Seconds from creation to the terminal status by the server's clock.

    Falls back to ``watched_s`` (how long this process followed it) when the server gives no end
    time or its whole-second timestamps are equal.
    """
    end = batch.completed_at or batch.failed_at or batch.expired_at or batch.cancelled_at
    if end is not None and end > batch.created_at:
        return float(end - batch.created_at)
    return watched_s


def format_summary(batch: Batch, elapsed: float) -> str:
    """One line: id, status, completed, failed, elapsed, lines per second."""
    completed, failed, total = request_counts(batch)
    rate = (completed + failed) / elapsed if elapsed > 0 else 0.0
    return (
        f"{batch.id} {batch.status}: {completed} completed, {failed} failed of {total}"
        f" in {elapsed:.1f}s ({rate:.1f} lines/s)"
    )


def format_errors(batch: Batch) -> list[str]:
    """One line per item of ``batch.errors.data`` (validation errors): line, code, message."""
    if batch.errors is None or not batch.errors.data:
        return []
    return [
        f"line {e.line if e.line is not None else '?'}: {e.code or 'error'}: {e.message or ''}"
        for e in batch.errors.data
    ]


def exit_code(batch: Batch) -> int:
    """0 for a completed batch, 1 for any other status."""
    return 0 if batch.status == "completed" else 1


def download(client: openai.OpenAI, file_id: str, path: Path) -> None:
    """Write the content of file ``file_id`` to ``path``."""
    path.write_bytes(client.files.content(file_id).content)


def watch(
    client: openai.OpenAI,
    batch_id: str,
    *,
    interval: float,
    output: Path | None = None,
    errors: Path | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Follow a batch with a progress bar on stderr, then print the summary; return the exit code.

    The bar counts completed plus failed requests over the total, labelled with the status. Any
    validation errors go to stderr, one per line. ``output`` and ``errors`` receive the batch's
    output and error files where it has them (a cancelled or expired batch may have partial ones).
    """
    started = clock()
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console(stderr=True)) as progress:
        task = progress.add_task(batch_id, total=None)

        def on_update(batch: Batch) -> None:
            completed, failed, total = request_counts(batch)
            progress.update(
                task,
                description=f"{batch_id} {batch.status}",
                completed=completed + failed,
                total=total if total > 0 else None,
            )

        try:
            batch = follow(client, batch_id, interval, on_update, sleep=sleep)
        except KeyboardInterrupt:
            progress.stop()
            typer.echo(
                f"stopped watching; {batch_id} goes on (llmq batch cancel {batch_id})", err=True
            )
            return 130
    for line in format_errors(batch):
        typer.echo(line, err=True)
    typer.echo(format_summary(batch, elapsed_s(batch, clock() - started)))
    for file_id, path, what in (
        (batch.output_file_id, output, "output"),
        (batch.error_file_id, errors, "error"),
    ):
        if path is None:
            continue
        if file_id is None:
            typer.echo(f"{batch_id} has no {what} file; {path} not written", err=True)
            continue
        download(client, file_id, path)
        typer.echo(f"{what} file {file_id} -> {path}", err=True)
    return exit_code(batch)


def cancel(client: openai.OpenAI, batch_id: str) -> Batch:
    """Ask the server to cancel a batch; returns it (status ``cancelling`` or already terminal)."""
    return client.batches.cancel(batch_id)


def _report_api_error(exc: openai.OpenAIError) -> int:
    """Print an SDK error (HTTP status and message where there is one) to stderr; return 1."""
    status = getattr(exc, "status_code", None)
    typer.echo(f"error: {f'HTTP {status}: ' if status else ''}{exc}", err=True)
    return 1


def run_submit(
    base_url: str,
    api_key: str,
    path: Path,
    *,
    model: str | None,
    endpoint: str,
    window: str,
    metadata: Sequence[str],
    watch_it: bool,
    interval: float,
    output: Path | None,
    errors: Path | None,
) -> int:
    """``llmq batch submit``: print the new batch's id, then follow it if asked; the exit code."""
    try:
        parsed = parse_metadata(metadata)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        return 2
    client = make_client(base_url, api_key)
    try:
        batch = submit(client, path, endpoint=endpoint, window=window, metadata=parsed, model=model)
    except BatchInputError as exc:
        typer.echo(f"error: {exc}", err=True)
        return 2
    except openai.OpenAIError as exc:
        return _report_api_error(exc)
    typer.echo(batch.id)
    if not watch_it:
        return 0
    return run_watch(base_url, api_key, batch.id, interval=interval, output=output, errors=errors)


def run_watch(
    base_url: str,
    api_key: str,
    batch_id: str,
    *,
    interval: float,
    output: Path | None,
    errors: Path | None,
) -> int:
    """``llmq batch watch``: follow a batch to its end; 0 if it completed, 1 otherwise."""
    client = make_client(base_url, api_key)
    try:
        return watch(client, batch_id, interval=interval, output=output, errors=errors)
    except openai.OpenAIError as exc:
        return _report_api_error(exc)


def run_cancel(base_url: str, api_key: str, batch_id: str) -> int:
    """``llmq batch cancel``: print the batch's id and status after the cancel request."""
    client = make_client(base_url, api_key)
    try:
        batch = cancel(client, batch_id)
    except openai.OpenAIError as exc:
        return _report_api_error(exc)
    typer.echo(f"{batch.id} {batch.status}")
    return 0
