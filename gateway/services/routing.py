"""Partition choice: the partition is the route.

Kafka gives each partition of a job topic to one worker of the pool, so choosing the partition
chooses the worker. The preferred partition is a stable hash of the prompt's first blocks
(salted with the job's prefix-cache salt, so per team unless teams share a cache), so requests
sharing a prefix reach the worker holding it in its prefix cache. Bounded load walks away from
an overloaded owner.

A LoRA adapter's requests hash by the adapter alone: its home partition's worker loads it
once and serves all of it (its prefix cache is the adapter's own anyway). Placement follows
demand: while the home worker keeps up, a rarely used adapter stays on that one worker; once
the adapter's load makes it overloaded, bounded load spills requests along the ring, to a
worker that already holds the adapter when one can take them (heartbeats list the adapters a
replica has loaded), so a busy adapter spreads over a few workers rather than being loaded
everywhere, and one replica's adapter slots are not churned by every adapter in the pool.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from schemas.heartbeat import ReplicaHeartbeat

RouteReason = Literal["affinity", "bounded_load", "no_owner_info", "adapter_resident"]
"""Why a partition was chosen.

- ``affinity``: the preferred partition (its owner is live and not overloaded, or every live
  owner is overloaded so moving would not help).
- ``bounded_load``: the preferred partition's owner is overloaded; walked to the next one.
- ``no_owner_info``: no live replica reports owning the preferred partition; walked to the next
  owned one, or kept it when no partition of the topic has a live owner.
- ``adapter_resident``: the preferred partition's owner is overloaded; walked to the first
  partition whose owner can take it and already holds the job's adapter.
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
        self, *, prefix_blocks: int = 4, block_size: int = 128, load_factor: float = 1.25
    ) -> None:
        if prefix_blocks < 1 or block_size < 1:
            raise ValueError("prefix_blocks and block_size must be at least 1")
        if load_factor < 1.0:
            raise ValueError("load_factor must be at least 1.0")
        self.prefix_blocks = prefix_blocks
        self.block_size = block_size
        self.load_factor = load_factor

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
    ) -> RouteDecision:
        """The partition for one job of `pool` on `topic`."""
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
