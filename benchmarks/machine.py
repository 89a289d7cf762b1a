"""The machine facts every benchmark records beside its numbers (one definition for all scripts)."""
from __future__ import annotations

import datetime
import os
import platform


def machine_facts(**extra) -> dict:
    """CPU, platform, library versions, JAX devices, load and date; ``extra`` adds script-specific facts."""
    from importlib import metadata

    def version(dist: str):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    import jax
    facts = {
        "cpu_count": os.cpu_count(),
        "sched_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "platform": platform.platform(), "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        **{name: version(name) for name in ("jax", "jaxlib", "flax", "optax", "torch", "jaxcomposer")},
        "jax_backend": jax.default_backend(), "jax_devices": [str(d) for d in jax.devices()],
        "loadavg_1_5_15": [round(x, 2) for x in os.getloadavg()],
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    }
    return {**facts, **extra}
