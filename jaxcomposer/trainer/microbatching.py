"""``device_train_microbatch_size='auto'``: the largest microbatch whose compiled step fits the device memory."""
from __future__ import annotations

from typing import Callable

from jaxcomposer.errors import ConfigurationError


def largest_fitting_microbatch(batch_size: int, batch_ways: int, budget: int | None,
                               peak_bytes: Callable[[int], int]) -> tuple[int, dict[int, int]]:
    """``(microbatch size, {size: peak bytes per device} of the sizes compiled)``: the largest size that divides
    the batch and the ``batch_ways`` whose step peaks (``peak_bytes(size)``: XLA's memory analysis of the compiled
    step, before anything runs) within ``budget`` bytes, found by a binary search over the candidates (memory
    falls as microbatches shrink). Composer instead runs the step, catches CUDA's out-of-memory error and halves;
    that cannot work inside one compiled program, and asking the compiler is cheaper than failing. Without a
    budget (CPU) the whole batch."""
    n = batch_size
    sizes = [m for m in range(n, 0, -1) if n % m == 0 and m % batch_ways == 0]
    if budget is None:
        return n, {}
    needs: dict[int, int] = {}
    lo, hi = 0, len(sizes) - 1  # sizes[lo] is the largest
    while lo <= hi:
        mid = (lo + hi) // 2
        needs[sizes[mid]] = peak_bytes(sizes[mid])
        if needs[sizes[mid]] <= budget:
            hi = mid - 1
        else:
            lo = mid + 1
    if lo == len(sizes):
        raise ConfigurationError(
            f"device_train_microbatch_size='auto': even microbatches of {sizes[-1]} need {needs[sizes[-1]]:,} "
            f"bytes per device, over the {budget:,} available (device_memory_bytes); shard the model "
            "(parallelism_config={'fsdp': {}}), use precision='amp_bf16', or a smaller model")
    chosen = sizes[lo]
    if chosen not in needs:
        needs[chosen] = peak_bytes(chosen)
    return chosen, needs
