"""SIMULATION: one replica's LoRA adapter residency, as vLLM keeps it.

vLLM holds up to ``max_cpu_loras`` adapters in CPU memory (an LRU) and up to ``max_loras`` in
GPU slots (an LRU within them). A scheduler step may run at most ``max_loras`` distinct adapters;
a waiting request whose adapter would exceed that is skipped for the step (it keeps its place).
Before a step runs, each of its adapters without a GPU slot is copied into one (evicting the
least recently used adapter that the step does not use), after being read from local disk into
CPU memory if it was not there: the whole batch waits for those loads.

Fetching the weights from object storage onto the worker's disk happens in the worker before
the job reaches the engine (`workers.adapter_folders`), so it is not modelled here.

The timings are assumptions, not measurements: a rank-16 adapter of the seeds' 70B is 131 MB;
read from local NVMe and unpacked in about 50 ms; copied over PCIe into its slot in about 2 ms.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class LoraTimings:
    """SIMULATION: what bringing an adapter into use stalls a step for (assumed figures)."""

    load_s: float = 0.05
    """Local disk -> CPU memory (an adapter not among the ``max_cpu_loras`` kept there)."""
    activate_s: float = 0.002
    """CPU memory -> a GPU slot."""


class SimLoraSlots:
    """The adapters one replica holds in CPU memory and in GPU slots, and what loading cost."""

    def __init__(
        self, max_loras: int, max_cpu_loras: int | None = None, timings: LoraTimings | None = None
    ) -> None:
        if max_loras < 1:
            raise ValueError("max_loras must be at least 1")
        self.max_loras = max_loras
        self.max_cpu_loras = max(max_cpu_loras or max_loras, max_loras)
        self.timings = timings or LoraTimings()
        self._cpu: OrderedDict[str, None] = OrderedDict()
        self._gpu: OrderedDict[str, None] = OrderedDict()
        self.loads = 0
        """Adapters read into CPU memory (each one a first use or a reload after eviction)."""
        self.activations = 0
        """Adapters copied into a GPU slot."""

    @property
    def loaded(self) -> tuple[str, ...]:
        """Adapters in CPU memory, least recently used first (what the heartbeat lists)."""
        return tuple(self._cpu)

    def blocks(self, adapter: str | None, in_batch: set[str]) -> bool:
        """Whether a request for ``adapter`` must wait because the batch has its limit."""
        return adapter is not None and adapter not in in_batch and len(in_batch) >= self.max_loras

    def prepare(self, in_batch: Iterable[str]) -> float:
        """Give each of a step's adapters a GPU slot; return the seconds the step waits."""
        batch = set(in_batch)
        stall = 0.0
        for adapter in sorted(batch):  # a fixed order: simulations are reproducible
            if adapter in self._gpu:
                self._gpu.move_to_end(adapter)
                self._cpu.move_to_end(adapter)
                continue
            if adapter in self._cpu:
                self._cpu.move_to_end(adapter)
            else:
                self.loads += 1
                stall += self.timings.load_s
                self._cpu[adapter] = None
                self._evict(self._cpu, self.max_cpu_loras, batch)
            self.activations += 1
            stall += self.timings.activate_s
            self._gpu[adapter] = None
            self._evict(self._gpu, self.max_loras, batch)
        return stall

    def _evict(self, cache: OrderedDict[str, None], limit: int, keep: set[str]) -> None:
        for adapter in list(cache):
            if len(cache) <= limit:
                return
            if adapter not in keep:
                del cache[adapter]
                self._gpu.pop(adapter, None)  # a GPU slot needs its CPU copy
