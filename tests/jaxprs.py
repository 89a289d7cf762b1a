"""Reading traced programs in tests: every equation of a jaxpr, its sub-jaxprs' included."""
from jax.extend.core import jaxprs_in_params


def equations(jaxpr):
    """Every equation of ``jaxpr`` and, depth first, of the jaxprs in its equations' params (jit, scan, remat,
    custom VJPs, ...)."""
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in jaxprs_in_params(eqn.params):
            yield from equations(sub)
