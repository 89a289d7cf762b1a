"""Random draws shared by the mixing methods (MixUp, CutMix)."""
import jax
import jax.numpy as jnp


def symmetric_beta(key: jax.Array, alpha: float) -> jax.Array:
    """One draw of Beta(alpha, alpha), float32, as ``G1 / (G1 + G2)`` with ``G1, G2 ~ Gamma(alpha)`` independent.

    The two gammas come from one ``jax.random.loggamma`` call of shape (2,), so the step holds one rejection-sampling
    loop instead of the two of ``jax.random.beta`` (whose loops are most of a small step's compile time on CPU;
    benchmarks/README.md, "Measurements behind code choices"). The ratio is taken in log space,
    ``sigmoid(log G1 - log G2)``, so small ``alpha`` (gammas that underflow float32) stays exact. The distribution
    is ``jax.random.beta``'s; the values drawn from a given key are not.
    """
    log_g = jax.random.loggamma(key, jnp.full((2,), alpha, jnp.float32))
    return jax.nn.sigmoid(log_g[0] - log_g[1])
