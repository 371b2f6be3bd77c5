"""Fast per-step token draws for `sera_jax.sampling`: the same tokens and log-probs as
`jax.random.categorical` / `jnp.argmax` / `jax.nn.log_softmax`, with fewer full-vocabulary
passes.

Why: at 64 rows a SmolLM2 decode step draws from 64 x 49,152 logits, and on XLA:CPU the
reference draw cost about a third of the step (profile in docs/results_sampler.md,
"SmolLM2 decode" section): `jnp.argmax` lowers to a variadic (value, index) reduce that
XLA:CPU does not vectorise (15 ms for 64 x 49k, 5 ns an element), and the two
`log_softmax`es materialise [B, V] arrays only to gather one column each.

- `first_argmax`: `jnp.argmax` as a max reduce plus a min reduce over the indices that
  reach it -- two vectorised passes, the same (first) index.
- `gumbel_max`: `jax.random.categorical(key, logits)` for one key per row: the same Gumbel
  noise (`jax.random.gumbel(key, (V,))`, the call `categorical` makes) plus the logits,
  then `first_argmax` -- the same token for the same key, bit for bit.
- `token_logprob`: `log_softmax(x)[token]` as `(x[token] - max) - log(sum(exp(x - max)))`,
  the expression `jax.nn.log_softmax` evaluates, gathered instead of materialised.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def first_argmax(x: jax.Array) -> jax.Array:
    """int32 [...]: index of the first maximum of x [..., V] along the last axis.

    Equals `jnp.argmax(x, axis=-1)` on rows without NaN (a row with a NaN gives V - 1
    here, `jnp.argmax` the NaN's index; logits with NaN are a bug upstream either way).
    """
    vocab = x.shape[-1]
    top = jnp.max(x, axis=-1, keepdims=True)
    index = jnp.where(x == top, jnp.arange(vocab, dtype=jnp.int32), vocab)
    return jnp.minimum(jnp.min(index, axis=-1), vocab - 1)


def gumbel_max(keys: jax.Array, logits: jax.Array) -> jax.Array:
    """int32 [B]: one draw per row from softmax(logits [B, V]), row r with `keys[r]`.

    The same token as `jax.vmap(jax.random.categorical)(keys, logits)`: categorical adds
    `jax.random.gumbel(key, (V,), logits.dtype)` to the logits and takes the argmax; so
    does this, with `first_argmax` (the same index) in place of `jnp.argmax`.
    """
    noise = jax.vmap(lambda k: jax.random.gumbel(k, logits.shape[-1:], logits.dtype))(keys)
    return first_argmax(noise + logits)


def token_logprob(logits: jax.Array, tokens: jax.Array) -> jax.Array:
    """float32 [B]: `jax.nn.log_softmax(logits, -1)[b, tokens[b]]` for logits [B, V].

    The same expression as `log_softmax` (shift by the row max, log of the sum of exps),
    evaluated at the chosen column only: the [B, V] result is never written.
    """
    top = jnp.max(logits, axis=-1, keepdims=True)
    log_sum = jnp.log(jnp.sum(jnp.exp(logits - top), axis=-1))
    chosen = jnp.take_along_axis(logits, tokens[:, None], axis=-1)[:, 0]
    return (chosen - top[:, 0]) - log_sum
