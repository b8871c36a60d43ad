"""Internal messages: what travels on Kafka topics and Redis channels.

Every message is versioned (``schema_version``), strict (``extra="forbid"``), frozen, and
discriminated by ``type``. They go on the wire as JSON, never pickle, so any Kafka or Redis
client can read them.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from schemas.chat import (
    ChatCompletionTokenLogprob,
    CompletionUsage,
    FinishReason,
    PromptTokensDetails,
    Tier,
)
from schemas.generation import GenerationRequest

SCHEMA_VERSION: Literal[1] = 1

Arm = Literal["stable", "canary", "pinned"]
"""How a request came to its deployment version: the traffic split's stable or canary share,
or pinned by the caller (`name@version`)."""


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = 1

    def to_bytes(self) -> bytes:
        return self.model_dump_json().encode()


class SamplingSettings(BaseModel):
    """What the engine needs to sample one request (engine-neutral)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    json_schema: dict[str, Any] | None = None
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    """vLLM's structured outputs: the output matches the regex, is one of the choices, or is
    derived by the (EBNF) grammar. At most one constraint of all of these is set."""
    top_k: int = 0
    """0: no top-k cut."""
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    logit_bias: dict[int, float] | None = None
    logprobs: int | None = None
    """None: no log probabilities; N: each token's, with the N most likely alternatives."""
    n: int = 1
    """Choices generated from the one prompt (its KV blocks are shared)."""


def sampling_settings(request: GenerationRequest, max_tokens: int) -> SamplingSettings:
    fmt = request.response_format
    structured = request.structured_outputs
    json_schema = request.tool_schema
    if fmt is not None and fmt.type == "json_schema":
        json_schema = fmt.json_schema.schema_ or {"type": "object"}
    elif structured is not None and isinstance(structured.json_, dict):
        json_schema = structured.json_
    return SamplingSettings(
        max_tokens=max_tokens,
        temperature=1.0 if request.temperature is None else request.temperature,
        top_p=1.0 if request.top_p is None else request.top_p,
        frequency_penalty=request.frequency_penalty or 0.0,
        presence_penalty=request.presence_penalty or 0.0,
        stop=tuple(request.stop_list),
        seed=request.seed,
        json_schema=json_schema,
        json_object=(fmt is not None and fmt.type == "json_object")
        or bool(structured and structured.json_object),
        regex=structured.regex if structured else None,
        choice=tuple(structured.choice) if structured and structured.choice else None,
        grammar=structured.grammar if structured else None,
        top_k=max(request.top_k or 0, 0),
        min_p=request.min_p or 0.0,
        repetition_penalty=request.repetition_penalty or 1.0,
        min_tokens=request.min_tokens or 0,
        ignore_eos=bool(request.ignore_eos),
        stop_token_ids=tuple(request.stop_token_ids or ()),
        include_stop_str_in_output=bool(request.include_stop_str_in_output),
        skip_special_tokens=request.skip_special_tokens is not False,
        spaces_between_special_tokens=request.spaces_between_special_tokens is not False,
        logit_bias={int(k): v for k, v in request.logit_bias.items()}
        if request.logit_bias
        else None,
        logprobs=request.logprobs_count,
        n=request.choices,
    )


class BatchLineRef(BaseModel):
    """Which line of which batch a job runs (set only on jobs fanned out from a batch file)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    batch_id: str
    line: int
    """0-based index of the line in the input file."""
    custom_id: str
    endpoint: Literal["/v1/chat/completions", "/v1/completions"] = "/v1/chat/completions"
    """The batch's endpoint: its output lines have that endpoint's response shape."""


class ReplayMarker(BaseModel):
    """Where a replayed job came from, and whether it runs even if it already finished."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    replay_id: str
    """One id per `llmq replay` run (in logs, to tell its jobs apart)."""
    source_topic: str
    source_partition: int
    source_offset: int
    replayed_at: float
    force: bool = False
    """Run even if the request already finished (the done ledger is not consulted)."""


class CallerTags(BaseModel):
    """What the caller said about itself, recorded on the usage record (metering): never
    logged, never sent to the engine."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    user: str | None = None
    safety_identifier: str | None = None
    metadata: dict[str, str] | None = None

    @classmethod
    def of(cls, request: GenerationRequest) -> CallerTags | None:
        if request.user is None and request.safety_identifier is None and not request.metadata:
            return None
        return cls(
            user=request.user,
            safety_identifier=request.safety_identifier,
            metadata=request.metadata or None,
        )


class AdapterRef(BaseModel):
    """What a worker needs to apply an adapter to one job: carried in the job itself, so a
    job already queued runs as it was admitted even if its adapter is deleted or replaced."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    """`team/name`: unique across teams (the routing hash and the engine's adapter name)."""
    weights_uri: str
    """Where the adapter's folder is (`s3://bucket/prefix`: adapter_config.json and weights)."""
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    """The folder digest (`llmq weights digest`), checked before the engine loads it."""
    rank: int = Field(ge=1)

    @property
    def name(self) -> str:
        """The adapter's name within its team: what the caller put in `model`."""
        return self.id.partition("/")[2]


class InferenceJob(Message):
    """One request to run: produced by the gateway (or batch service), consumed by a worker."""

    type: Literal["inference"] = "inference"
    request_id: str
    team: str
    model: str
    pool: str
    model_version: str | None = None
    """The deployment version the gateway chose for this job (None: jobs written before
    versions existed); `system_fingerprint` reports it."""
    arm: Arm | None = None
    """How that version was chosen: the traffic split's stable or canary share, or pinned."""
    adapter: AdapterRef | None = None
    """The team's LoRA adapter applied to the base model (None: the base alone)."""
    tier: Tier = "interactive"
    team_weight: float = 1.0
    """The team's share in weighted fair ordering between teams of one priority class."""
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingSettings
    reserved_tokens: int = 0
    """Tokens reserved from the team's quota at admission (reconciled from usage)."""
    stream: bool = True
    created_at: float
    deadline: float
    reply_to: str
    """Redis channel of the gateway holding the request, or the results topic for batch lines."""
    batch: BatchLineRef | None = None
    """Set on jobs from a batch file: their outcome goes to the results topic as one
    `BatchResultEvent` instead of token events."""
    replay: ReplayMarker | None = None
    """Set on jobs re-driven by `llmq replay` (incident recovery)."""
    caller: CallerTags | None = None
    """`user`, `safety_identifier` and `metadata` of the request, for the usage record."""
    cache_salt: str | None = None
    """Salts the engine's prefix-cache block hashes (vLLM's ``cache_salt``): jobs share cached
    blocks only when their salts are equal. Derived from the team (`Deployment.cache_salt`),
    so one team's cache never serves, or reveals, another team's prompt. Replays keep it."""
    queue_units: int = 0
    """What the job added to its pool's admission backlog: its prompt tokens plus its share
    of the pool's slot time as prefill-token equivalents (`gateway.services.admission`). The
    worker removes the prompt tokens when it starts the job and the slot share when the job
    ends, so the backlog counts queued prompts and the slots that queued and running jobs
    hold. 0: its prompt length only (batch jobs)."""

    @property
    def backlog_units(self) -> int:
        """The amount this job holds in its pool's backlog counter until it starts."""
        return max(self.queue_units, len(self.prompt_token_ids))

    @property
    def slot_units(self) -> int:
        """The part of `backlog_units` held until the job ends (its share of slot time)."""
        return self.backlog_units - len(self.prompt_token_ids)

    @property
    def requested_model(self) -> str:
        """The model name the caller used: the adapter's, else the deployment's."""
        return self.adapter.name if self.adapter is not None else self.model


class UsageCounts(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0

    def to_openai(self) -> CompletionUsage:
        """As OpenAI's ``usage`` object (cached tokens under ``prompt_tokens_details``)."""
        return CompletionUsage(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            total_tokens=self.prompt_tokens + self.completion_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=self.cached_tokens),
        )


class TokenEvent(Message):
    """Text produced by one engine step (deltas are coalesced per step)."""

    type: Literal["token"] = "token"
    request_id: str
    seq: int
    text: str
    num_tokens: int
    attempt: int = 1
    """Which run of the job produced it: a job whose worker died before its caller saw a
    token runs again, and the gateway keeps only one run's text."""
    logprobs: tuple[ChatCompletionTokenLogprob, ...] | None = None
    """The step's tokens with their log probabilities, when the request asked for them."""
    index: int = 0
    """The choice it belongs to (requests with `n` > 1)."""
    generated_at: float | None = None
    """When the worker received the step from the engine (Unix time): how streaming is
    checked to send nothing before the first generated token, and relay latency measured."""


def token_event_bytes(
    request_id: str,
    seq: int,
    text: str,
    num_tokens: int,
    attempt: int,
    index: int,
    generated_at: float,
) -> bytes:
    """A `TokenEvent` without log probabilities, as its JSON, without building the model:
    the worker's per-token path. It reads back as `TokenEvent(...)` with these fields."""
    return (
        f'{{"schema_version":1,"type":"token","request_id":{json.dumps(request_id)},'
        f'"seq":{seq},"text":{json.dumps(text)},"num_tokens":{num_tokens},'
        f'"attempt":{attempt},"index":{index},"generated_at":{generated_at!r}}}'
    ).encode()


class FinishEvent(Message):
    """The last event of a successful request."""

    type: Literal["finish"] = "finish"
    request_id: str
    finish_reason: FinishReason
    usage: UsageCounts
    finish_reasons: tuple[FinishReason, ...] = ()
    """Each choice's finish reason, by index, when the request asked for `n` > 1."""
    started_at: float | None = None
    """When the worker started the job (Unix time): the gateway's queue-time metric."""


class ErrorEvent(Message):
    """The last event of a failed request; ``usage`` counts only what was delivered."""

    type: Literal["error"] = "error"
    request_id: str
    code: str
    message: str
    usage: UsageCounts = UsageCounts()


ReplyEvent = Annotated[TokenEvent | FinishEvent | ErrorEvent, Field(discriminator="type")]
reply_event_adapter: TypeAdapter[TokenEvent | FinishEvent | ErrorEvent] = TypeAdapter(ReplyEvent)


class ReplyBatchEvent(Message):
    """Events of several requests published together on one gateway's reply channel: what
    one engine step produced for the requests of that gateway (one message, not one each)."""

    type: Literal["batch"] = "batch"
    events: tuple[ReplyEvent, ...]


RelayMessage = Annotated[
    TokenEvent | FinishEvent | ErrorEvent | ReplyBatchEvent, Field(discriminator="type")
]
"""What a gateway's reply channel carries: one event, or a batch of them."""
relay_message_adapter: TypeAdapter[TokenEvent | FinishEvent | ErrorEvent | ReplyBatchEvent] = (
    TypeAdapter(RelayMessage)
)

_BATCH_OPEN = b'{"schema_version":1,"type":"batch","events":['


def reply_batch_bytes(events: list[bytes]) -> bytes:
    """The message carrying these events (each one's JSON): one event as it is, several as a
    `ReplyBatchEvent`, built around their JSON without decoding it again."""
    if len(events) == 1:
        return events[0]
    return _BATCH_OPEN + b",".join(events) + b"]}"


class BatchResultEvent(Message):
    """The outcome of one batch line, on the durable results topic (keyed by batch id).

    Exactly one of ``text`` (with ``finish_reason``) and ``error_code`` is set. A line may be
    redelivered or replayed; the collector records the first result per line and ignores the rest.
    """

    type: Literal["batch_result"] = "batch_result"
    request_id: str
    batch: BatchLineRef
    model: str
    model_version: str | None = None
    """The deployment version that ran the line (its output's `system_fingerprint`)."""
    text: str | None = None
    finish_reason: FinishReason | None = None
    error_code: str | None = None
    error_message: str | None = None
    usage: UsageCounts = UsageCounts()
    finished_at: float


class BatchCreatedEvent(Message):
    """A batch was created and awaits validation and fan-out (on the batch control topic)."""

    type: Literal["batch_created"] = "batch_created"
    batch_id: str
    team: str


class DeadLetter(Message):
    """A job that could not be processed, with the reason and the original record, on the
    dead-letter topic (keyed by request id when known). `llmq replay --dead` re-drives it."""

    type: Literal["dead_letter"] = "dead_letter"
    reason: Literal["unparseable", "unknown_schema_version", "engine_failed"]
    detail: str
    """What went wrong (a parse error's summary, an exception's type): never the content."""
    request_id: str | None = None
    topic: str
    partition: int
    offset: int
    payload_b64: str
    """The original record's value, base64-encoded (it may not be valid UTF-8)."""
    failed_at: float
    attempts: int = 1


class CancelEvent(Message):
    """Ask whichever worker holds (or will fetch) this request to drop it."""

    type: Literal["cancel"] = "cancel"
    request_id: str


class UsageRecord(Message):
    """One per finished request, on the usage topic (metering, quota reconciliation)."""

    type: Literal["usage"] = "usage"
    request_id: str
    team: str
    model: str
    model_version: str | None = None
    """The version that ran the request."""
    adapter: str | None = None
    """The team's LoRA adapter applied (`team/name`); None: the base model alone."""
    arm: Arm | None = None
    """Its arm of the traffic split (`stable`, `canary`, `pinned`), so a canary comparison
    can be audited from usage afterwards."""
    tier: Tier
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    reserved_tokens: int = 0
    """What admission reserved for this request; the quota refunds the difference."""
    finish_reason: str
    finished_at: float
    caller: CallerTags | None = None
    """The request's `user`, `safety_identifier` and `metadata`, when it named any."""
