"""Core-style accounting (no torch): the host layout of a service and its split by module.

A service's weights are a list of tensors in module order (``service.collect_tensors``):
each module's own parameters and buffers, then the next module's. The *host layout* lays
them back to back in one buffer, each at a multiple of ``align_bytes`` so ``uint8`` views
can be reinterpreted as any dtype.

A replica over ``k`` devices is cut at *module boundaries* into ``k`` contiguous shards that
minimise the bytes of the most loaded device (``split_units``). Because a shard is a
contiguous run of tensors, it is one contiguous slice of the host buffer: a swap-in is one
copy per device, and the device extent mirrors the slice byte for byte (rebased), so
alignment carries over. No cut ever falls between a module's weight and its bias.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_ALIGN_BYTES = 256


def _align(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@dataclass(frozen=True)
class HostLayout:
    """Offset of every tensor in the host buffer; ``total_bytes`` is the buffer's size."""

    offsets_bytes: tuple[int, ...]
    nbytes: tuple[int, ...]
    total_bytes: int

    @property
    def payload_bytes(self) -> int:
        return sum(self.nbytes)


def plan_host_layout(
    tensor_nbytes: Sequence[int], align_bytes: int = DEFAULT_ALIGN_BYTES
) -> HostLayout:
    offsets, position = [], 0
    for nbytes in tensor_nbytes:
        offsets.append(position)
        position = _align(position + nbytes, align_bytes)
    return HostLayout(tuple(offsets), tuple(tensor_nbytes), position)


@dataclass(frozen=True)
class Unit:
    """A module that owns tensors: its qualified name and the (contiguous) tensors it owns."""

    module_name: str
    first_tensor: int
    num_tensors: int


@dataclass(frozen=True)
class Shard:
    """Tensors ``[first_tensor, stop_tensor)``: host bytes ``[host_start, host_stop)``."""

    first_tensor: int
    stop_tensor: int
    host_start_bytes: int
    host_stop_bytes: int

    @property
    def nbytes(self) -> int:
        return self.host_stop_bytes - self.host_start_bytes


def split_units(unit_bytes: Sequence[int], num_parts: int) -> list[range]:
    """Cut units, in order, into at most ``num_parts`` contiguous runs minimising the largest.

    Binary search on the cap with a greedy fill (optimal for contiguous partitions), then
    the heaviest splittable run is cut again while fewer runs than parts exist, so every
    device gets work when there are enough units. Deterministic.
    """
    if num_parts < 1:
        raise ValueError(f"num_parts must be >= 1, got {num_parts}")
    if not unit_bytes:
        return [range(0, 0)]

    def greedy(cap: int) -> list[range]:
        runs, start, acc = [], 0, 0
        for i, nbytes in enumerate(unit_bytes):
            if acc + nbytes > cap and i > start:
                runs.append(range(start, i))
                start, acc = i, 0
            acc += nbytes
        runs.append(range(start, len(unit_bytes)))
        return runs

    low, high = max(unit_bytes), sum(unit_bytes)
    while low < high:
        middle = (low + high) // 2
        if len(greedy(middle)) <= num_parts:
            high = middle
        else:
            low = middle + 1
    runs = greedy(low)
    while len(runs) < num_parts:
        splittable = [r for r in runs if len(r) > 1]
        if not splittable:
            break
        heaviest = max(splittable, key=lambda r: (sum(unit_bytes[i] for i in r), -r.start))
        cut = min(
            range(heaviest.start + 1, heaviest.stop),
            key=lambda c: max(
                sum(unit_bytes[heaviest.start : c]), sum(unit_bytes[c : heaviest.stop])
            ),
        )
        at = runs.index(heaviest)
        runs[at : at + 1] = [range(heaviest.start, cut), range(cut, heaviest.stop)]
    return runs


def plan_shards(units: Sequence[Unit], host: HostLayout, num_parts: int) -> tuple[Shard, ...]:
    """The shards of a replica over ``num_parts`` devices (fewer when there are fewer units)."""
    if not units:
        return (Shard(0, 0, 0, 0),)

    def span(first: int, stop: int) -> tuple[int, int]:
        if stop <= first:
            return (0, 0)
        return host.offsets_bytes[first], host.offsets_bytes[stop - 1] + host.nbytes[stop - 1]

    unit_bytes = [
        span(u.first_tensor, u.first_tensor + u.num_tensors)[1]
        - span(u.first_tensor, u.first_tensor + u.num_tensors)[0]
        for u in units
    ]
    shards = []
    for run in split_units(unit_bytes, num_parts):
        first = units[run.start].first_tensor
        stop = units[run.stop - 1].first_tensor + units[run.stop - 1].num_tensors
        start_bytes, stop_bytes = span(first, stop)
        shards.append(Shard(first, stop, start_bytes, stop_bytes))
    return tuple(shards)
