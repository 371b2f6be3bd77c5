"""A toy allocator added the way every allocator is: one decorated function (its options
read from its signature) and, to compare it, one `Method`. Importing this module registers
it; studies' tests run it by name with `monkeypatch.setitem(methods.METHODS, "toy", TOY)`.

`hardest_first`: every prompt gets n_min, then the rest of the budget fills the prompts with
the lowest p (unseen ones count as p = `unseen_p`) up to n_max, in that order. Traceable
(jit, vmap), so the lab can run it inside its compiled step.
"""

import jax.numpy as jnp

from sera_jax.allocation import Allocation, allocation_from_counts, register
from sera_jax.methods import Method

NAME = "toy_hardest_first"


@register(NAME)
def hardest_first(p, budget, *, n_min, n_max, shift=1, unseen="fill", unseen_p=0.5
                  ) -> Allocation:
    """n_min each, then the remaining B − P·n_min rollouts to the hardest prompts first."""
    p = jnp.asarray(p, jnp.result_type(float))
    num = p.shape[0]
    order = jnp.argsort(jnp.where(jnp.isnan(p), unseen_p, p), stable=True)
    room = n_max - n_min
    extra = jnp.clip(budget - num * n_min - jnp.arange(num) * room, 0, room)
    counts = jnp.zeros(num, jnp.int32).at[order].set((n_min + extra).astype(jnp.int32))
    return allocation_from_counts(p, counts, budget, n_min=n_min, n_max=n_max, shift=shift)


#: The compared method: the toy allocator with the multiplicity correction and MaxRL.
TOY = Method("toy", "toy hardest-first", NAME)
