"""Admission's second look, once a request is routed: judge its TTFT on the replica that will
run it (`gateway.services.replica_wait`), not on the pool's average.

The pool's backlog is the first, atomic gate (concurrent admissions cannot overshoot it, and
it applies fair queuing between teams); it admits up to the SLO at the typical TTFT of its
raw wait (a calibration factor above 1 is left to this look). Here the request's percentile
is judged: on its replica's slots when that replica's heartbeat can tell, else on the pool's
calibrated prediction with its margin. Jobs admitted here are remembered per replica
until its heartbeats show them.
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog

from gateway.errors import ApiError
from gateway.services.admission import AdmissionController, TtftPrediction
from gateway.services.replica_wait import ReplicaSends, replica_wait
from schemas.deployment import Deployment
from schemas.heartbeat import ReplicaHeartbeat
from schemas.messages import InferenceJob

log = structlog.get_logger()


@dataclass(frozen=True)
class Judgement:
    """A routed request's prediction and, when it would miss the SLO, when to retry."""

    prediction: TtftPrediction
    retry_after_s: int | None = None
    """None: admitted."""


class ReplicaAdmission:
    def __init__(self, admission: AdmissionController) -> None:
        self._admission = admission
        self._sends = ReplicaSends()

    def judge(
        self,
        job: InferenceJob,
        owner: ReplicaHeartbeat | None,
        pooled: TtftPrediction,
        slo_s: float | None,
        team_queued: int = 0,
    ) -> Judgement:
        """Judge `job` (its prompt already in the pool's backlog) on the replica `owner` that
        its partition's heartbeat names, or on `pooled` when there is none or it cannot
        tell. As at the backlog, a team with nothing waiting (there, or with `team_queued`
        units in the pool's backlog before it) is admitted: a flooding team is refused, the
        others' next requests are not."""
        prediction, team_waiting = pooled, team_queued
        if owner is not None:
            on_replica = self._on_replica(owner, job, pooled)
            if on_replica is not None:
                prediction, team_waiting = on_replica
        retry_after = self._admission.retry_after(prediction, slo_s, job.pool)
        if team_waiting == 0:
            retry_after = None
        return Judgement(prediction, retry_after)

    def sent(self, job: InferenceJob, owner: ReplicaHeartbeat | None) -> None:
        """An admitted job goes to `owner`'s partition: remembered until its heartbeats
        show it. Call it as soon as `judge` admits, with no await between: requests judged
        while this one awaits its quota must count it (a burst judged all at once otherwise
        sees an idle replica, and every one of it is admitted as its team's first)."""
        if owner is not None:
            self._sends.record(
                owner.replica_id,
                job.created_at,
                job.team,
                len(job.prompt_token_ids),
                job.request_id,
            )

    def refusal(self, deployment: Deployment, team: str, judgement: Judgement) -> ApiError:
        """The 429 for a request `judge` refused, with the percentile it judged."""
        prediction = judgement.prediction
        percentile = self._admission.judged_s(prediction, deployment.pool)
        return shed(
            deployment,
            team,
            prediction.ttft_s,
            judgement.retry_after_s or 1,
            prediction.basis,
            (self._admission.quantile, percentile),
        )

    def withdrawn(self, request_id: str) -> None:
        """A job `sent` recorded is not produced after all."""
        self._sends.withdrawn(request_id)

    def started(self, request_id: str) -> None:
        """A request's first token (or its end) came back: it no longer waits anywhere."""
        self._sends.started(request_id)

    def _on_replica(
        self, owner: ReplicaHeartbeat, job: InferenceJob, pooled: TtftPrediction
    ) -> tuple[TtftPrediction, int] | None:
        """The prediction on `owner`'s slots and the jobs of the team waiting there."""
        rate = self._admission.predictor.rate(owner.prefill_tokens_per_s)
        sent = self._sends.since(owner.replica_id, owner.sent_at)
        wait = replica_wait(
            owner, now=job.created_at, sent=sent, prefill_tokens_per_s=rate, team=job.team
        )
        log.debug(
            "replica_judged",
            request_id=job.request_id,
            replica=owner.replica_id,
            heartbeat_age_s=round(job.created_at - owner.sent_at, 4),
            in_flight=owner.in_flight,
            max_num_seqs=owner.max_num_seqs,
            soonest_free_s=round(min(owner.slot_free_in_s, default=0.0), 4),
            buffered=sum(owner.buffered.values()),
            sent_waiting=sum(sent.teams.values()),
            sent_started=sent.started,
            startable=owner.startable.get(job.team, owner.startable.get("")),
            slot_wait_s=None if wait is None else round(wait.slot_s, 4),
        )
        if wait is None:
            return None
        prediction = self._admission.predict_on_replica(
            prompt_tokens=len(job.prompt_token_ids),
            wait=wait,
            prefill_tokens_per_s=rate,
            pool=owner.pool,
            team=job.team,
            pool_prediction=pooled,
        )
        return prediction, wait.team_waiting


def shed(
    deployment: Deployment,
    team: str,
    predicted_s: float,
    retry_after_s: int,
    by: str,
    judged: tuple[float, float] | None = None,
) -> ApiError:
    """The 429 of a request refused for its predicted TTFT, logged as shed ``by`` the pool's
    backlog, or after routing on the replica's or the pool's prediction. `judged`: the
    percentile held to the SLO and its value, when that (not the typical prediction) was
    judged."""
    log.info(
        "request_shed",
        team=team,
        pool=deployment.pool,
        predicted_ttft_s=round(predicted_s, 3),
        judged_ttft_s=round(judged[1], 3) if judged else None,
        by=by,
    )
    predicted = f"{predicted_s:.2f}s"
    if judged is not None:
        quantile, judged_s = judged
        predicted += f" (its {quantile * 100:.0f}th percentile {judged_s:.2f}s)"
    return ApiError(
        429,
        f"`{deployment.name}` is at capacity for interactive requests: the predicted time to "
        f"first token is {predicted} against an SLO of {deployment.ttft_slo_s:.2f}s. "
        'Retry later, or use tier "batch".',
        type_="rate_limit_error",
        code="overloaded",
        headers={"Retry-After": str(max(retry_after_s, 1))},
    )
