"""What the benchmark scripts share: the machine facts recorded beside every result, and the input batches."""
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


def fashion_mnist_batches(batch_size: int, count: int, seed: int) -> tuple[list[dict], str]:
    """``count`` host batches ``{'input': float32 (B,28,28,1) normalized, 'target': int32 (B,)}`` (NHWC), from
    Fashion-MNIST when installed, else random data of its shape; also says which."""
    import numpy as np

    from jaxcomposer.data import (FASHION_MNIST_MEAN, FASHION_MNIST_STD, fashion_mnist_available,
                                  load_fashion_mnist, normalize_images)

    rng = np.random.default_rng(seed)
    if fashion_mnist_available():
        train = load_fashion_mnist("train")
        idx = rng.permutation(len(train["target"]))[: batch_size * count]
        x, y = train["input"][idx], train["target"][idx].astype(np.int32)
        source = "fashion_mnist (real, /usr/share/datasets/fashion-mnist)"
    else:
        x = rng.integers(0, 256, (batch_size * count, 28, 28, 1), dtype=np.uint8)
        y = rng.integers(0, 10, (batch_size * count,), dtype=np.int32)
        source = "random uint8 data of Fashion-MNIST's shape (dataset not installed)"
    x = normalize_images(x, FASHION_MNIST_MEAN, FASHION_MNIST_STD)
    return [{"input": np.ascontiguousarray(x[i * batch_size:(i + 1) * batch_size]),
             "target": np.ascontiguousarray(y[i * batch_size:(i + 1) * batch_size])} for i in range(count)], source
