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
- `inverse_cdf` (opt-in, `token_draw="inverse_cdf"`): the same distribution from one
  uniform per row -- no [B, V] random bits, which are most of `gumbel_max`'s cost -- but
  other tokens than `categorical` for the same key.
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


#: Vocabulary block of `inverse_cdf`: the block sums are cumulated, then one block's tokens.
_CDF_BLOCK = 256


def inverse_cdf(keys: jax.Array, logits: jax.Array) -> jax.Array:
    """int32 [B]: one draw per row from softmax(logits [B, V]) by inversion, one uniform a row.

    Row r draws `u ~ U[0, 1)` from `keys[r]` and returns the first token i whose cumulative
    unnormalised mass `C_i = sum_{j <= i} exp(x_j - max)` exceeds `u * C_V`: in exact
    arithmetic P(i) = (C_i - C_{i-1}) / C_V = softmax(x)_i, the distribution `gumbel_max`
    draws from -- but *other tokens* than `jax.random.categorical` for the same key. The
    cumulative sums are two-level (block sums, then the chosen block's tokens): two passes
    over [B, V] and no [B, V] random bits (the Gumbel noise is most of the fast draw's
    cost). float32 rounding: boundaries move by about (V / `_CDF_BLOCK` + `_CDF_BLOCK`)
    ulps of C_V, u has 2^-24 resolution, and tokens with exp(x - max) below float32's
    range are never drawn; a token of zero mass (a filtered -inf) never is.
    """
    b, vocab = logits.shape
    pad = -vocab % _CDF_BLOCK
    x = jnp.pad(logits, ((0, 0), (0, pad)), constant_values=-jnp.inf) if pad else logits
    mass = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True)).reshape(b, -1, _CDF_BLOCK)
    block_mass = jnp.sum(mass, axis=-1)  # [B, nb]
    cum = jnp.cumsum(block_mass, axis=-1)
    u = jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(keys) * cum[:, -1]
    # First block whose cumulative mass exceeds u; if rounding leaves none, the last block
    # with mass (never a massless one).
    block = _first_above(cum, u, block_mass > 0)
    within = jnp.take_along_axis(mass, block[:, None, None], axis=1)[:, 0]  # [B, block]
    before = jnp.take_along_axis(cum, jnp.maximum(block - 1, 0)[:, None], axis=1)[:, 0]
    cum_within = jnp.where(block > 0, before, 0.0)[:, None] + jnp.cumsum(within, axis=-1)
    return block * _CDF_BLOCK + _first_above(cum_within, u, within > 0)


def _first_above(cum: jax.Array, u: jax.Array, positive: jax.Array) -> jax.Array:
    """int32 [B]: first index with cum > u (a strict rise there, so positive mass), else the
    last index with `positive` mass (u at or past the rounded total)."""
    n = cum.shape[-1]
    first = jnp.sum(cum <= u[:, None], axis=-1, dtype=jnp.int32)
    last = n - 1 - first_argmax(jnp.flip(positive, axis=-1).astype(jnp.int32))
    return jnp.where(first < n, first, last)
