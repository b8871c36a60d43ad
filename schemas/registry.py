"""The registry's records: what `llmq.registry` (a compacted Kafka topic) holds per deployment
(and per team's LoRA adapter: `schemas.adapters`).

The topic is keyed by deployment name (adapters by `adapter:<team>:<name>`) and compacted, so
only the latest record of a name survives: each record is therefore the deployment's whole
state (every version, the traffic split), never a change. A record carries a `revision`;
readers fold the log keeping, per name, the first record of each revision in offset order, so
two writers racing on the same revision cannot both win (the loser sees it lost and retries).
A tombstone (no value) deletes a name.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from schemas.adapters import AdapterRecord
from schemas.deployment import Deployment, ReplicaBounds
from schemas.messages import Message
from schemas.rollout import EvalResult, Rollout, RolloutEvent
from schemas.tool_parsers import ToolCallParserName

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$"
"""Deployment names: what callers put in `model` (a Hugging Face id such as
`meta-llama/Llama-3.1-8B-Instruct` included); never `@` (it pins a version) or `:` (it starts
an action in the admin API's paths)."""
VERSION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
"""Versions and pools: what a Kafka topic name and a Kubernetes label take."""

Precision = Literal["bfloat16", "float16", "float32", "fp8", "int8", "int4"]
Lifecycle = Literal["active", "draining", "retired", "failed"]
"""What the registry says of a version. `active` versions are `loading` until a replica of
theirs is ready and `ready` after (the API's `state` adds that from heartbeats). `failed`:
its replicas could not run (weights that do not verify, a crash loop); it takes no traffic and
runs no replica, and its `failure` says why."""


class DeploymentSpec(BaseModel):
    """One immutable version of a deployment: what `PUT /v1/deployments/{name}` takes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: str = Field(pattern=VERSION_PATTERN)
    """The version's name, unique within the deployment (`name@version` pins it)."""
    path: str
    """A local folder with the model's tokenizer and chat template (and, in development, its
    weights)."""
    weights_uri: str | None = None
    """Where workers fetch the weights (`s3://bucket/prefix`); None: `path` holds them."""
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    """SHA-256 of the weights, checked by workers before they load them."""
    precision: Precision = "bfloat16"
    """The weights' and activations' numerics (a change of it must pass the eval gate)."""
    tensor_parallel_size: int = Field(default=1, ge=1)
    """GPUs per replica."""
    max_model_len: int = Field(default=2048, ge=16)
    """Prompt plus output tokens per request."""
    engine_args: dict[str, Any] = {}
    """Further engine settings (vLLM's names), passed to the version's workers."""
    pool: str = Field(pattern=VERSION_PATTERN)
    """The worker pool whose job topics carry this version's requests."""
    ttft_slo_s: float = Field(default=1.0, gt=0)
    """Interactive requests whose predicted time to first token exceeds this get 429."""
    tpot_slo_s: float | None = Field(default=None, gt=0)
    """The decode time per output token the version's workers keep under (None: no cap)."""
    replicas: ReplicaBounds = ReplicaBounds()
    """How many replicas of this version run."""
    tool_call_parser: ToolCallParserName | None = None
    """How the model writes tool calls in free text (vLLM's `--tool-call-parser`)."""
    shared_cache_teams: dict[str, list[str]] = {}
    """Named sets of teams sharing prefix-cache blocks (see `Deployment`)."""

    def spec(self) -> DeploymentSpec:
        """Only the spec's fields (of a registered version, without what registering added)."""
        return DeploymentSpec(**self.model_dump(include=set(DeploymentSpec.model_fields)))

    def serving(self, name: str) -> Deployment:
        """What a gateway serves for this version of deployment `name`."""
        shared = set(Deployment.model_fields) - {"name"}
        return Deployment(name=name, **self.model_dump(include=shared))


class DeploymentVersion(DeploymentSpec):
    """A registered version: its spec, when it was registered, and where it is in its life."""

    created_at: int
    """Unix seconds of registration."""
    lifecycle: Lifecycle = "active"
    failure: str | None = None
    """Why the version `failed` (what its replicas did); None otherwise."""
    evaluations: tuple[EvalResult, ...] = ()
    """Its evaluations against other versions, oldest first (the latest ten kept)."""

    def latest_eval(self, reference: str) -> EvalResult | None:
        """Its latest suite evaluation against `reference`."""
        return next(
            (
                e
                for e in reversed(self.evaluations)
                if e.reference == reference and e.kind == "suite"
            ),
            None,
        )

    def passed_eval(self, reference: str) -> EvalResult | None:
        """Its latest suite evaluation against `reference` when that one passed (a shadow
        run only measures agreement on live prompts: it adds evidence, opens no gate)."""
        latest = self.latest_eval(reference)
        return latest if latest is not None and latest.passed else None


class TrafficSplit(BaseModel):
    """Which versions take a deployment's requests: `stable` all but `canary_percent`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stable: str
    canary: str | None = None
    canary_percent: float = Field(default=0.0, ge=0.0, le=100.0)
    rollout: Rollout | None = None
    """The canary's rollout (its steps and how it is judged); None without a canary."""


class DeploymentRecord(Message):
    """A deployment's whole state at one revision: the value of its key in `llmq.registry`."""

    type: Literal["deployment"] = "deployment"
    name: str = Field(pattern=NAME_PATTERN)
    revision: int = Field(ge=1)
    """1 for the first record of a name, then one more per change."""
    versions: tuple[DeploymentVersion, ...]
    """Every version ever registered, oldest first (retired ones included: names are never
    reused)."""
    traffic: TrafficSplit
    history: tuple[RolloutEvent, ...] = ()
    """Its traffic changes, oldest first (the latest fifty kept)."""
    written_by: str
    """The writer's id for this revision: how a writer tells whether its write won."""
    updated_at: int
    """Unix seconds of this revision."""

    @model_validator(mode="after")
    def _consistent(self) -> DeploymentRecord:
        names = [v.version for v in self.versions]
        if len(set(names)) != len(names):
            raise ValueError(f"deployment {self.name!r} lists a version twice")
        for role, version in (("stable", self.traffic.stable), ("canary", self.traffic.canary)):
            if version is not None and version not in names:
                raise ValueError(f"traffic.{role} names unknown version {version!r}")
        return self

    def version(self, version: str) -> DeploymentVersion | None:
        return next((v for v in self.versions if v.version == version), None)

    def serving(self, version: str | None = None) -> Deployment:
        """What the gateway serves for `version` (the stable one by default)."""
        found = self.version(version or self.traffic.stable)
        if found is None:
            raise KeyError(version)
        return found.serving(self.name)


RegistryRecord = Annotated[DeploymentRecord | AdapterRecord, Field(discriminator="type")]
"""What the registry log holds under a key: a deployment's record or a team's adapter's."""
registry_record_adapter: TypeAdapter[DeploymentRecord | AdapterRecord] = TypeAdapter(RegistryRecord)


def spec_of(deployment: Deployment, version: str = "1") -> DeploymentSpec:
    """The spec a configured deployment (`LLMQ_DEPLOYMENTS`) seeds an empty registry with."""
    shared = set(DeploymentSpec.model_fields) - {"version"}
    return DeploymentSpec(version=version, **deployment.model_dump(include=shared))


def split_model(model: str) -> tuple[str, str | None]:
    """`name@version` -> (name, version); a plain name -> (name, None)."""
    name, at, version = model.partition("@")
    return (name, version) if at and version else (model, None)


def is_valid_name(name: str) -> bool:
    return re.fullmatch(NAME_PATTERN, name) is not None
