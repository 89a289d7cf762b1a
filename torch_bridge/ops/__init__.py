"""ATen -> JAX lowerings, one module per op family; ``registry`` holds the table. Importing this package registers
every family's lowerings (each module registers its own with ``registry.lower`` when imported)."""
from . import (creation, elementwise, indexing, loss, nn, nn_extra, nn_instance_norm, nn_pool,  # noqa: F401
               nn_recurrent, nn_resample, reduction, shape, spectral)
