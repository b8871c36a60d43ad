"""Batch input validation: one JSONL line per request, as OpenAI's Batch API defines it.

Each line is ``{"custom_id": str, "method": "POST", "url": <the batch's endpoint>, "body":
{...chat completion or completion request...}}``. Validation reads the whole file once and
reports every problem with its 1-based line number (up to `MAX_REPORTED_ERRORS`); a batch with
any error fails as a whole, before anything runs. Blank lines are skipped and do not count as
requests, so a request's index (0-based, among requests) is the same in validation and in fan-out.

Pure logic: the caller streams lines in (see `batch.ports.iter_lines`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, Collection, Mapping
from dataclasses import dataclass, field

from pydantic import ValidationError

from schemas.batches import BatchEndpoint, BatchError
from schemas.chat import ChatCompletionRequest
from schemas.completions import CompletionRequest

MAX_REPORTED_ERRORS = 100
"""Errors listed on a failed batch; the rest are counted in the last message."""


@dataclass(frozen=True)
class BatchLine:
    """One valid request of a batch."""

    index: int
    """0-based among the file's requests (blank lines skipped)."""
    line_no: int
    """1-based line number in the file."""
    custom_id: str
    body: ChatCompletionRequest | CompletionRequest


@dataclass
class ValidationReport:
    requests: int = 0
    model: str | None = None
    errors: list[BatchError] = field(default_factory=list)
    error_count: int = 0

    @property
    def ok(self) -> bool:
        return self.error_count == 0 and self.requests > 0

    def add(self, line_no: int | None, code: str, message: str, param: str | None = None) -> None:
        self.error_count += 1
        if len(self.errors) < MAX_REPORTED_ERRORS:
            self.errors.append(BatchError(code=code, line=line_no, message=message, param=param))


class LineError(ValueError):
    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param


def parse_line(
    raw: bytes, index: int, line_no: int, endpoint: BatchEndpoint = "/v1/chat/completions"
) -> BatchLine:
    """One line to a `BatchLine`, or `LineError` saying what is wrong with it."""
    try:
        item = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise LineError("invalid_json_line", f"This line is not valid JSON: {exc.msg}.") from exc
    except UnicodeDecodeError as exc:
        raise LineError("invalid_json_line", "This line is not UTF-8 text.") from exc
    if not isinstance(item, dict):
        raise LineError("invalid_json_line", "Each line must be a JSON object.")
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise LineError(
            "missing_required_parameter", "Each line needs a string `custom_id`.", "custom_id"
        )
    if item.get("method") != "POST":
        raise LineError("invalid_method", "`method` must be `POST`.", "method")
    if item.get("url") != endpoint:
        raise LineError("invalid_url", f"`url` must be the batch's endpoint, `{endpoint}`.", "url")
    unknown = set(item) - {"custom_id", "method", "url", "body"}
    if unknown:
        raise LineError(
            "invalid_request",
            f"Unknown field(s): {', '.join(sorted(unknown))}.",
            sorted(unknown)[0],
        )
    body = item.get("body")
    if not isinstance(body, dict):
        raise LineError("missing_required_parameter", "Each line needs an object `body`.", "body")
    shape = CompletionRequest if endpoint == "/v1/completions" else ChatCompletionRequest
    try:
        request: ChatCompletionRequest | CompletionRequest = shape.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise LineError(
            "invalid_request", f"body.{where}: {first['msg']}", f"body.{where}" if where else "body"
        ) from exc
    if request.stream:
        raise LineError("invalid_request", "Batch requests cannot stream.", "body.stream")
    if request.choices > 1:
        raise LineError("invalid_request", "Batch lines ask for one choice (n=1).", "body.n")
    if request.logprobs_count is not None:
        raise LineError(
            "invalid_request", "Batch lines cannot ask for logprobs yet.", "body.logprobs"
        )
    if isinstance(request, ChatCompletionRequest) and request.tool_plan is not None:
        raise LineError("invalid_request", "Batch lines cannot call tools yet.", "body.tool_choice")
    if isinstance(request, CompletionRequest):
        if len(request.prompts) > 1:
            raise LineError("invalid_request", "Batch lines carry one prompt.", "body.prompt")
        if request.echo:
            raise LineError("invalid_request", "Batch lines cannot echo yet.", "body.echo")
    return BatchLine(index=index, line_no=line_no, custom_id=custom_id, body=request)


def custom_id_of(raw: bytes) -> str:
    """The custom_id of a line, or "" when the line has none readable (for error lines)."""
    try:
        value = json.loads(raw).get("custom_id")
    except (ValueError, AttributeError):
        return ""
    return value if isinstance(value, str) else ""


async def numbered_requests(lines: AsyncIterable[bytes]) -> AsyncIterable[tuple[int, int, bytes]]:
    """(request index, 1-based line number, raw line) for every non-blank line."""
    index = 0
    line_no = 0
    async for raw in lines:
        line_no += 1
        if not raw.strip():
            continue
        yield index, line_no, raw
        index += 1


async def validate(
    lines: AsyncIterable[bytes],
    models: Collection[str],
    max_requests: int,
    endpoint: BatchEndpoint = "/v1/chat/completions",
    adapter_bases: Mapping[str, str] | None = None,
) -> ValidationReport:
    """Check every line; a batch must name one known model throughout: one deployment, or
    its team's adapters of it (`adapter_bases`: adapter name -> base), mixed with it or not.
    The report's model is that deployment."""
    bases = adapter_bases or {}
    report = ValidationReport()
    seen: set[str] = set()
    async for index, line_no, raw in numbered_requests(lines):
        report.requests = index + 1
        if report.requests > max_requests:
            report.add(
                line_no, "too_many_requests", f"A batch holds at most {max_requests} requests."
            )
            break
        try:
            line = parse_line(raw, index, line_no, endpoint)
        except LineError as exc:
            report.add(line_no, exc.code, exc.message, exc.param)
            continue
        if line.custom_id in seen:
            report.add(
                line_no,
                "duplicate_custom_id",
                f"The custom_id `{line.custom_id}` appears more than once.",
                "custom_id",
            )
        seen.add(line.custom_id)
        model = line.body.model if line.body.model in models else bases.get(line.body.model)
        if model is None or model not in models:
            report.add(
                line_no,
                "model_not_found",
                f"The model `{line.body.model}` does not exist.",
                "body.model",
            )
        elif report.model is None:
            report.model = model
        elif model != report.model:
            report.add(
                line_no,
                "mismatched_model",
                f"Every request in a batch must use the same model ({report.model}).",
                "body.model",
            )
    if report.requests == 0:
        report.add(None, "empty_file", "The input file has no requests.")
    if report.error_count > len(report.errors):
        hidden = report.error_count - len(report.errors)
        report.errors.append(BatchError(code="more_errors", message=f"{hidden} more errors."))
    return report
