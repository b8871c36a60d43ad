"""SIMULATION physics: GPU and model profiles, a replica's step time, and its paged KV blocks.

Used by `workers.engine.simulated.SimulatedGpuEngine`; figures from the public specifications
(H100 SXM: 80 GB HBM3 at 3.35 TB/s, 989 dense BF16 TFLOPS; H200: 141 GB at 4.8 TB/s, same
compute) and Llama 3 (70B: 80 layers, 8 KV heads of dimension 128: 320 KiB of KV per token;
8B: 32 layers: 128 KiB per token).

The step-time model (one vLLM-style scheduler step, per replica of ``tp`` GPUs):

* memory time = (weight bytes / tp + KV bytes of every running sequence / tp)
  / (HBM bandwidth x bandwidth efficiency): each step reads all weights and every KV cache once;
* decode time = max(memory time, 2 x params x decode tokens / (tp x peak FLOPS x utilisation));
* prefill time = 2 x params x prefill tokens / (tp x peak FLOPS x utilisation);
* step time = decode time + prefill time. The sum is the simple, conservative choice: real
  kernels overlap some weight reads with prefill compute, so a step carrying a prefill chunk
  is somewhat faster than modelled. Attention FLOPs and all-reduce time are ignored.

KV capacity = GPU memory x gpu_memory_utilization x tp - weights - activation reserve, in whole
16-token blocks: about 422,000 tokens for the 70B on four H100s (the seed's "about 420,000").
`KvBlockPool` accounts those blocks the way vLLM's prefix cache does (see its docstring).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

GB = 1e9


@dataclass(frozen=True)
class GpuProfile:
    """One accelerator: HBM size and bandwidth, dense BF16 peak."""

    name: str
    memory_bytes: float
    bandwidth_bytes_per_s: float
    peak_flops: float


@dataclass(frozen=True)
class ModelProfile:
    """A dense decoder: what one token costs in weight reads, FLOPs and KV cache."""

    name: str
    parameters: float
    bytes_per_parameter: float
    layers: int
    kv_heads: int
    head_dim: int
    kv_bytes_per_value: float = 2.0

    @property
    def weight_bytes(self) -> float:
        return self.parameters * self.bytes_per_parameter

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V, every layer, every KV head."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.kv_bytes_per_value

    @property
    def flops_per_token(self) -> float:
        return 2 * self.parameters


H100_SXM = GpuProfile("H100 SXM", 80 * GB, 3.35e12, 989e12)
H200 = GpuProfile("H200", 141 * GB, 4.8e12, 989e12)
LLAMA_8B = ModelProfile("llama-3-8b", 8e9, 2.0, layers=32, kv_heads=8, head_dim=128)
LLAMA_70B = ModelProfile("llama-3-70b", 70e9, 2.0, layers=80, kv_heads=8, head_dim=128)


@dataclass(frozen=True)
class ReplicaProfile:
    """One engine replica: a model on ``tensor_parallel`` GPUs, and the step-time model."""

    gpu: GpuProfile = H100_SXM
    model: ModelProfile = LLAMA_70B
    tensor_parallel: int = 4
    bandwidth_efficiency: float = 0.8
    compute_utilization: float = 0.4
    gpu_memory_utilization: float = 0.92
    activation_reserve_bytes_per_gpu: float = 4 * GB
    """Activations, CUDA graphs, communication buffers (the seed's 16 GB on a TP-4 replica)."""
    max_num_batched_tokens: int = 2048
    block_size: int = 16

    @property
    def kv_cache_bytes(self) -> float:
        """Memory left for KV cache after the safety margin, weights and activations."""
        usable = self.gpu.memory_bytes * self.gpu_memory_utilization * self.tensor_parallel
        reserve = self.activation_reserve_bytes_per_gpu * self.tensor_parallel
        return max(0.0, usable - self.model.weight_bytes - reserve)

    @property
    def kv_capacity_blocks(self) -> int:
        return int(self.kv_cache_bytes // (self.model.kv_bytes_per_token * self.block_size))

    @property
    def kv_capacity_tokens(self) -> int:
        return self.kv_capacity_blocks * self.block_size

    def memory_time(self, kv_tokens: int) -> float:
        """Seconds to read the weights and ``kv_tokens`` of KV cache once (per GPU, in parallel)."""
        per_gpu = (self.model.weight_bytes + kv_tokens * self.model.kv_bytes_per_token) / (
            self.tensor_parallel
        )
        return per_gpu / (self.gpu.bandwidth_bytes_per_s * self.bandwidth_efficiency)

    def compute_time(self, tokens: int) -> float:
        """Seconds of dense matmul work for ``tokens`` tokens at the achieved utilisation."""
        achieved = self.tensor_parallel * self.gpu.peak_flops * self.compute_utilization
        return self.model.flops_per_token * tokens / achieved

    def step_time(self, prefill_tokens: int, decode_tokens: int, kv_tokens: int) -> float:
        """One scheduler step: (memory-bound decode) + (compute-bound prefill); 0 when idle."""
        if prefill_tokens == 0 and decode_tokens == 0:
            return 0.0
        decode = max(self.memory_time(kv_tokens), self.compute_time(decode_tokens))
        return decode + self.compute_time(prefill_tokens)


def block_hashes(tokens: Sequence[int], block_size: int, salt: object = None) -> tuple[int, ...]:
    """Chained content hashes of every full block: each includes its parent's hash (and salt)."""
    hashes: list[int] = []
    parent = hash(("llmq-sim", salt))
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hash((parent, tuple(tokens[start : start + block_size])))
        hashes.append(parent)
    return tuple(hashes)


class KvBlockPool:
    """One replica's KV blocks with prefix caching.

    A sequence holds its full prompt blocks by hash (shared and refcounted between sequences)
    plus private blocks for the rest. A held block whose KV is computed is "ready"; when no
    sequence holds it any more it goes to an LRU of idle blocks, which only occupies free memory
    and is evicted (least recently used first) when blocks are needed. Ready and idle blocks are
    prefix-cache hits.
    """

    def __init__(self, total_blocks: int, block_size: int) -> None:
        self.total = total_blocks
        self.block_size = block_size
        self.private = 0
        self._refs: dict[int, int] = {}
        self._ready: set[int] = set()
        self._lru: OrderedDict[int, None] = OrderedDict()

    @property
    def used(self) -> int:
        """Blocks held by sequences (idle cached blocks count as free, as in vLLM)."""
        return len(self._refs) + self.private

    @property
    def idle(self) -> int:
        return len(self._lru)

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def cached_blocks(self, hashes: Iterable[int]) -> int:
        """How many leading blocks are cached (computed, held or idle)."""
        hits = 0
        for h in hashes:
            if h not in self._ready and h not in self._lru:
                break
            hits += 1
        return hits

    def hold(self, hashes: Sequence[int], private: int) -> bool:
        """Hold the prompt blocks and ``private`` more; False (holding nothing) if short."""
        in_lru = sum(1 for h in hashes if h in self._lru)
        absent = sum(1 for h in hashes if h not in self._refs and h not in self._lru)
        if absent + private > self.total - self.used - in_lru:
            return False
        for h in hashes:
            if h in self._lru:
                del self._lru[h]
                self._ready.add(h)
            self._refs[h] = self._refs.get(h, 0) + 1
        return self.grow(private)

    def grow(self, blocks: int) -> bool:
        """Take ``blocks`` more private blocks, evicting idle cached ones; False if out of KV."""
        while self.total - self.used - len(self._lru) < blocks and self._lru:
            self._lru.popitem(last=False)
        if self.total - self.used - len(self._lru) < blocks:
            return False
        self.private += blocks
        return True

    def computed(self, hashes: Iterable[int]) -> None:
        self._ready.update(hashes)

    def release(self, hashes: Iterable[int], private: int) -> None:
        """Drop a sequence's blocks: computed prompt blocks nobody holds become idle cache."""
        for h in hashes:
            count = self._refs.get(h, 0) - 1
            if count > 0:
                self._refs[h] = count
                continue
            self._refs.pop(h, None)
            if h in self._ready:
                self._ready.discard(h)
                self._lru[h] = None
        self.private -= private
