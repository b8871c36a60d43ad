"""Partition choice: the partition is the route.

Kafka gives each partition of a job topic to one worker of the pool, so choosing the partition
chooses the worker. The preferred partition is a stable hash of the prompt's first blocks
(salted with the job's prefix-cache salt, so per team unless teams share a cache), so requests
sharing a prefix reach the worker holding it in its prefix cache. Bounded load walks away from
an overloaded owner.

A LoRA adapter's requests hash by the adapter alone: its home partition's worker loads it
once and serves all of it (its prefix cache is the adapter's own anyway). Placement follows
demand, which the gateways see before any worker does: each adapter's outstanding jobs
(queued in the job topics or running), counted across gateways (`AdapterDemand`). An adapter
spreads over the fewest workers along the ring from its home that keep each within the bounded
load (`adapter_spread`), its requests spread evenly over them, so a busy adapter is served by
several workers before its home's queue grows, while a rarely used adapter stays loaded on its
one home worker instead of being loaded everywhere (slots churned, every replica's CPU LRU
evicting every adapter). Bounded load still applies: an overloaded worker is passed over, for
one that already holds the adapter when one can take it (heartbeats list loaded adapters).
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from schemas.heartbeat import ReplicaHeartbeat

RouteReason = Literal[
    "affinity", "bounded_load", "no_owner_info", "adapter_resident", "adapter_spread"
]
"""Why a partition was chosen.

- ``affinity``: the preferred partition (its owner is live and not overloaded, or every live
  owner is overloaded so moving would not help).
- ``bounded_load``: the preferred partition's owner is overloaded; walked to the next one.
- ``no_owner_info``: no live replica reports owning the preferred partition; walked to the next
  owned one, or kept it when no partition of the topic has a live owner.
- ``adapter_resident``: the preferred partition's owner is overloaded; walked to the first
  partition whose owner can take it and already holds the job's adapter.
- ``adapter_spread``: the adapter's demand spreads it over several workers; this request went
  to one of them other than its home.
"""


@dataclass(frozen=True)
class RouteDecision:
    """Where one job goes, and why."""

    partition: int
    preferred_partition: int
    reason: RouteReason
    owner_replica_id: str | None


def _is_live(replica: ReplicaHeartbeat) -> bool:
    return replica.state == "ready" and replica.healthy


def partition_owners(
    topic: str, partitions: int, replicas: Sequence[ReplicaHeartbeat]
) -> dict[int, ReplicaHeartbeat]:
    """Partition -> its live owner, from heartbeats' ``"topic:partition"`` entries.

    When two heartbeats claim one partition (mid-rebalance), the most recent one wins.
    """
    owners: dict[int, ReplicaHeartbeat] = {}
    for replica in replicas:
        if not _is_live(replica):
            continue
        for entry in replica.partitions:
            name, _, number = entry.rpartition(":")
            if name != topic or not number.isdigit():
                continue
            partition = int(number)
            if partition >= partitions:
                continue
            current = owners.get(partition)
            if current is None or replica.sent_at > current.sent_at:
                owners[partition] = replica
    return owners


def replica_loads(replicas: Sequence[ReplicaHeartbeat]) -> dict[str, float]:
    """Replica id -> load: outstanding tokens when any replica reports them, else jobs held."""
    by_tokens = any(r.outstanding_tokens > 0 for r in replicas)
    return {
        r.replica_id: float(r.outstanding_tokens if by_tokens else r.in_flight) for r in replicas
    }


class PartitionRouter:
    """Prefix-affinity partition choice with bounded load. Pure logic: no I/O."""

    def __init__(
        self,
        *,
        prefix_blocks: int = 4,
        block_size: int = 128,
        load_factor: float = 1.25,
        adapter_jobs_per_replica: int = 4,
    ) -> None:
        if prefix_blocks < 1 or block_size < 1:
            raise ValueError("prefix_blocks and block_size must be at least 1")
        if load_factor < 1.0:
            raise ValueError("load_factor must be at least 1.0")
        if adapter_jobs_per_replica < 1:
            raise ValueError("adapter_jobs_per_replica must be at least 1")
        self.prefix_blocks = prefix_blocks
        self.block_size = block_size
        self.load_factor = load_factor
        self.adapter_jobs_per_replica = adapter_jobs_per_replica
        """The fewest outstanding jobs of one adapter per worker it spreads to: an adapter
        never spreads so thin that each worker loads it for a request or two."""

    def affinity_prefix(self, prompt_token_ids: Sequence[int]) -> Sequence[int]:
        """The tokens that decide affinity: whole leading blocks, or all of a short prompt."""
        whole_blocks = min(self.prefix_blocks, len(prompt_token_ids) // self.block_size)
        if whole_blocks == 0:
            return prompt_token_ids
        return prompt_token_ids[: whole_blocks * self.block_size]

    def preferred_partition(
        self,
        *,
        salt: str,
        prompt_token_ids: Sequence[int],
        adapter: str | None,
        partitions: int,
        cache_key: str | None = None,
    ) -> int:
        """A stable hash (BLAKE2b, the same in every process) of salt and prefix, or of the
        adapter alone for an adapter's requests (see the module docstring).

        The salt is the job's prefix-cache salt: requests that may share cached blocks (one
        team, or teams sharing a cache) hash alike; others spread independently. A caller's
        `prompt_cache_key` replaces the prefix: its requests meet on one worker whatever
        their prompts."""
        if partitions < 1:
            raise ValueError("a topic has at least one partition")
        digest = hashlib.blake2b(digest_size=8, person=b"llmq-route")
        if adapter is not None:
            digest.update(b"adapter:" + adapter.encode())
            return int.from_bytes(digest.digest(), "big") % partitions
        salt_bytes = salt.encode()
        digest.update(struct.pack("<I", len(salt_bytes)) + salt_bytes)
        if cache_key is not None:
            digest.update(b"key:" + cache_key.encode())
        else:
            prefix = self.affinity_prefix(prompt_token_ids)
            digest.update(struct.pack(f"<I{len(prefix)}I", len(prefix), *prefix))
        return int.from_bytes(digest.digest(), "big") % partitions

    def choose(
        self,
        *,
        pool: str,
        salt: str,
        prompt_token_ids: Sequence[int],
        adapter: str | None,
        partitions: int,
        replicas: Sequence[ReplicaHeartbeat],
        topic: str,
        cache_key: str | None = None,
        adapter_demand: int = 0,
        spread_key: str = "",
    ) -> RouteDecision:
        """The partition for one job of `pool` on `topic`.

        ``adapter_demand``: the adapter's outstanding jobs in the pool, this one included (0:
        unknown, the adapter stays on its home worker); ``spread_key`` (the request id)
        picks one of the workers it spreads over."""
        preferred = self.preferred_partition(
            salt=salt,
            prompt_token_ids=prompt_token_ids,
            adapter=adapter,
            partitions=partitions,
            cache_key=cache_key,
        )
        live = [r for r in replicas if r.pool == pool and _is_live(r)]
        owners = partition_owners(topic, partitions, live)
        overloaded = self._overloaded(live, len(prompt_token_ids))
        walk = [(preferred + step) % partitions for step in range(partitions)]
        open_ = [p for p in walk if p in owners and owners[p].replica_id not in overloaded]
        if open_ and adapter is not None and adapter_demand > 1:
            spread = self._spread(walk, owners, overloaded, adapter_demand, live)
            if len(spread) > 1:
                digest = hashlib.blake2b(spread_key.encode(), digest_size=8).digest()
                partition = spread[int.from_bytes(digest, "big") % len(spread)]
                reason: RouteReason = "affinity" if partition == preferred else "adapter_spread"
                return RouteDecision(partition, preferred, reason, owners[partition].replica_id)
        if open_ and adapter is not None and open_[0] != preferred:
            resident = next((p for p in open_ if adapter in owners[p].adapters), None)
            if resident is not None:
                owner_id = owners[resident].replica_id
                return RouteDecision(resident, preferred, "adapter_resident", owner_id)
        if open_:
            partition = open_[0]
            return RouteDecision(
                partition=partition,
                preferred_partition=preferred,
                reason=self._reason(partition, preferred, owners),
                owner_replica_id=owners[partition].replica_id,
            )
        # Every live owner is overloaded, or no partition has a live owner.
        if preferred in owners:
            return RouteDecision(preferred, preferred, "affinity", owners[preferred].replica_id)
        owned = next((p for p in walk if p in owners), None)
        if owned is not None:
            return RouteDecision(owned, preferred, "no_owner_info", owners[owned].replica_id)
        return RouteDecision(preferred, preferred, "no_owner_info", None)

    def adapter_spread(self, demand: int, live: Sequence[ReplicaHeartbeat]) -> int:
        """How many workers an adapter with ``demand`` outstanding jobs spreads over: the
        fewest that keep each of them within ``load_factor`` x the pool's mean load, at most
        one per ``adapter_jobs_per_replica`` of its jobs, at least 1.

        With D jobs in the pool (workers' jobs in flight, at least the adapter's own d) over
        n workers, the rest spread evenly, each of k workers serving the adapter carries
        d/k + (D - d)/n; keeping that within load_factor x D/n needs
        k >= n d / (d + (load_factor - 1) D)."""
        if demand <= 1 or not live:
            return 1
        pool_jobs = max(sum(r.in_flight for r in live), demand)
        headroom = (self.load_factor - 1.0) * pool_jobs
        by_share = math.ceil(len(live) * demand / (demand + headroom))
        by_size = math.ceil(demand / self.adapter_jobs_per_replica)
        return max(1, min(by_share, by_size, len(live)))

    def _spread(
        self,
        walk: Sequence[int],
        owners: Mapping[int, ReplicaHeartbeat],
        overloaded: set[str],
        demand: int,
        live: Sequence[ReplicaHeartbeat],
    ) -> list[int]:
        """One partition for each of the first `adapter_spread` distinct workers along the ring
        from the adapter's home, overloaded workers passed over."""
        want = self.adapter_spread(demand, live)
        chosen: list[int] = []
        seen: set[str] = set()
        for partition in walk:
            owner = owners.get(partition)
            if len(chosen) == want:
                break
            if owner is None or owner.replica_id in seen or owner.replica_id in overloaded:
                continue
            seen.add(owner.replica_id)
            chosen.append(partition)
        return chosen

    def _overloaded(self, live: Sequence[ReplicaHeartbeat], request_tokens: int) -> set[str]:
        """Ids of replicas above `load_factor` x the pool's mean load by more than one request
        (this request's prompt tokens, or one job when loads are job counts); none when the
        mean is 0. The one-request slack is the token analogue of the ceiling in consistent
        hashing with bounded loads: without it, a single cold prefill on a quiet pool makes
        its worker "overloaded" and moves the next request sharing its prefix elsewhere,
        where the prefix is not cached."""
        loads = replica_loads(live)
        if not loads:
            return set()
        mean = sum(loads.values()) / len(loads)
        if mean <= 0:
            return set()
        by_tokens = any(r.outstanding_tokens > 0 for r in live)
        slack = float(request_tokens if by_tokens else 1)
        return {rid for rid, load in loads.items() if load > self.load_factor * mean + slack}

    @staticmethod
    def _reason(
        partition: int, preferred: int, owners: Mapping[int, ReplicaHeartbeat]
    ) -> RouteReason:
        if partition == preferred:
            return "affinity"
        return "bounded_load" if preferred in owners else "no_owner_info"
