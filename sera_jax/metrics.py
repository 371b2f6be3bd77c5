"""Evaluation metrics: unbiased pass@k, analytic pass@k, gradient cosine (SERA_SPEC §6).

`pass_at_k` and `analytic_pass_at_k` are host-side NumPy float64 (evaluation runs on host
counts, and n up to 10,000 needs float64 log-space sums). `cosine` is jnp and jit-able.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

# Terms of the log-space product handled per chunk (bounds memory at E × _CHUNK floats).
_CHUNK = 1024


def _integers(name: str, x: Any) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype == np.bool_ or not (
        np.issubdtype(arr.dtype, np.integer)
        or (np.issubdtype(arr.dtype, np.floating) and np.all(arr == np.round(arr)))
    ):
        raise ValueError(f"{name} must hold integers; got {arr.dtype} values {arr.ravel()[:5]}")
    return arr.astype(np.int64)


def pass_at_k(n: Any, c: Any, k: Any) -> np.ndarray:
    """Unbiased pass@k from n samples with c correct: 1 − C(n−c, k)/C(n, k) (float64).

    Broadcasts n, c, k (integers, 0 <= c <= n, 1 <= k <= n). Computed in log space as
    −expm1(Σ_{t<min(c,k)} log1p(−max(c,k)/(n−t))) — the product Π_{i=n−c+1..n}(1 − k/i)
    rewritten with whichever of c, k is smaller as the number of factors — so it is accurate
    to a few ulps for n in the tens of thousands. Exact edge cases: k = 1 → c/n, c = 0 → 0,
    n − c < k → 1.
    """
    n, c, k = _integers("n", n), _integers("c", c), _integers("k", k)
    try:
        n, c, k = np.broadcast_arrays(n, c, k)
    except ValueError:
        raise ValueError(
            f"n, c and k must broadcast together; got shapes n {n.shape}, c {c.shape}, "
            f"k {k.shape} (give one count per prompt in n and c, or a scalar)"
        ) from None
    if np.any(n < 1):
        raise ValueError(f"n must be >= 1; got {int(n.min())}")
    if np.any((c < 0) | (c > n)):
        i = np.flatnonzero((c < 0) | (c > n))[0]
        raise ValueError(f"c={int(c.flat[i])} is out of range [0, n={int(n.flat[i])}]")
    if np.any((k < 1) | (k > n)):
        i = np.flatnonzero((k < 1) | (k > n))[0]
        raise ValueError(f"k={int(k.flat[i])} is out of range [1, n={int(n.flat[i])}]")

    out = np.zeros(n.shape, np.float64)
    ones = n - c < k
    out[ones] = 1.0
    single = (k == 1) & ~ones
    out[single] = c[single] / n[single]
    todo = ~ones & ~single & (c > 0)
    if todo.any():
        nn, cc, kk = n[todo], c[todo], k[todo]
        terms, big = np.minimum(cc, kk), np.maximum(cc, kk).astype(np.float64)
        log_ratio = np.zeros(nn.shape, np.float64)
        for start in range(0, int(terms.max()), _CHUNK):
            t = start + np.arange(_CHUNK)[None, :]
            valid = t < terms[:, None]
            # Valid terms have n − t >= n − min(c,k) + 1 > max(c,k), so the ratio is < 1.
            x = np.where(valid, big[:, None] / np.maximum(nn[:, None] - t, 1), 0.0)
            log_ratio += np.sum(np.log1p(-x), axis=1)
        out[todo] = -np.expm1(log_ratio)
    return out


def pass_at_k_curve(n: Any, c: Any) -> tuple[np.ndarray, np.ndarray]:
    """Mean pass@k over prompts for k = 1, 2, 4, … (powers of two up to min n, then min n).

    n, c: [P] samples and correct counts per prompt (n may be one scalar for every prompt).
    Returns (ks int64[K], pass float64[K]). ValueError if n and c are of different lengths.
    """
    n, c = _integers("n", n), _integers("c", c)
    if n.ndim and n.shape != c.shape:
        raise ValueError(
            f"n and c must have one entry per prompt each; got n of shape {n.shape} and c of "
            f"shape {c.shape} (pass n as a scalar if every prompt has the same count)"
        )
    n, c = np.broadcast_to(n, c.shape).reshape(-1), c.reshape(-1)
    if n.size == 0:
        raise ValueError("n is empty; need at least one prompt")
    n_min = int(n.min())
    if n_min < 1:
        raise ValueError(f"n must be >= 1; got {n_min}")
    ks = [1 << i for i in range(n_min.bit_length()) if 1 << i <= n_min]
    if ks[-1] != n_min:
        ks.append(n_min)
    ks_arr = np.asarray(ks, np.int64)
    return ks_arr, pass_at_k(n[None, :], c[None, :], ks_arr[:, None]).mean(axis=1)


def analytic_pass_at_k(p: Any, k: Any) -> np.ndarray:
    """pass@k of a prompt with known success probability p: 1 − (1−p)^k (float64).

    Computed as −expm1(k·log1p(−p)), accurate for p down to 1e-300 and up to 1; p in [0, 1],
    k >= 0 (real k allowed: the same form gives κ(p, N) = analytic_pass_at_k(p, N − s)).
    """
    p = np.asarray(p, np.float64)
    k = np.asarray(k, np.float64)
    if np.any(~((p >= 0) & (p <= 1))):
        raise ValueError(f"p must lie in [0, 1]; got {p[~((p >= 0) & (p <= 1))].ravel()[0]!r}")
    if np.any(~(k >= 0)):
        raise ValueError(f"k must be >= 0; got {k[~(k >= 0)].ravel()[0]!r}")
    with np.errstate(divide="ignore", invalid="ignore"):
        # p = 1 gives log1p(−1) = −inf; k·(−inf) = −inf → 1, except k = 0 → 0 (nothing drawn).
        out = -np.expm1(k * np.log1p(-p))
    return np.where(k == 0, 0.0, out)


def cosine(a: Any, b: Any) -> jax.Array:
    """Cosine similarity of two pytrees with the same structure, all leaves flattened.

    Each vector is divided by its largest |entry| before the dot products, so squares never
    overflow or underflow; accumulation is float64 when `jax_enable_x64` is on (float32
    otherwise; bf16/f16 leaves are promoted). Returns 0 when either vector is all zeros
    (cosine undefined), so averages over steps are never poisoned by NaN. jit-able.
    """
    leaves_a, tree_a = jax.tree.flatten(a)
    leaves_b, tree_b = jax.tree.flatten(b)
    if tree_a != tree_b:
        raise ValueError(f"a and b must have the same pytree structure; got {tree_a} vs {tree_b}")
    if not leaves_a:
        raise ValueError("a and b have no leaves; nothing to compare")
    leaves_a = [jnp.asarray(x) for x in leaves_a]
    leaves_b = [jnp.asarray(x) for x in leaves_b]
    for i, (x, y) in enumerate(zip(leaves_a, leaves_b, strict=True)):
        if x.shape != y.shape:
            raise ValueError(f"leaf {i} has shape {x.shape} in a but {y.shape} in b")
    acc = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
    leaves_a = [x.astype(jnp.promote_types(x.dtype, acc)) for x in leaves_a]
    leaves_b = [y.astype(jnp.promote_types(y.dtype, acc)) for y in leaves_b]

    def max_abs(leaves: list[jax.Array]) -> jax.Array:
        return jnp.max(jnp.stack([jnp.max(jnp.abs(x), initial=0.0) for x in leaves]))

    sa, sb = max_abs(leaves_a), max_abs(leaves_b)
    scale_a = jnp.where(sa > 0, sa, 1.0)
    scale_b = jnp.where(sb > 0, sb, 1.0)
    dot = sum(jnp.vdot(x / scale_a, y / scale_b) for x, y in zip(leaves_a, leaves_b))
    norm_a = jnp.sqrt(sum(jnp.vdot(x / scale_a, x / scale_a) for x in leaves_a))
    norm_b = jnp.sqrt(sum(jnp.vdot(y / scale_b, y / scale_b) for y in leaves_b))
    both = (sa > 0) & (sb > 0)
    cos = dot / jnp.where(both, norm_a * norm_b, 1.0)
    return jnp.where(both, jnp.clip(cos, -1.0, 1.0), 0.0)
