"""Checked mode: the library's input checks, also under `jax.jit`.

The public entry points check their inputs on the host when the inputs are concrete
(`allocate(p=1.5)` raises ValueError at once). Under `jax.jit` the inputs are tracers, no
value can be read, and those checks are skipped: `allocate` with p = 1.5 returns counts,
`maxrl` with a segment id >= num_segments or a reward of 2 returns advantages,
`history.lookup` with an id >= num_prompts returns NaN (read as "unseen"). The wrappers
here add the same value checks as `jax.experimental.checkify` checks, which run inside
the compiled program:

    from sera_jax import checks

    step = checks.jit_checked(lambda p, r, ids: (checks.allocate(p, 256, n_min=2, n_max=64),
                                                 checks.maxrl(r, ids, 8)))
    step(p, r, ids)  # raises checks.CheckError (a ValueError) naming the bad value

What is checked (value checks, as checkify checks; also in docs/robustness.md):

* `allocate`: every p in [0, 1] or NaN (NaN = unseen).
* `advantages`, `maxrl`, `maxrl_conditional`: segment ids in [0, num_segments); rewards
  finite, and in {0, 1} for the estimators that need binary rewards (`requires_binary`).
* `lookup`: prompt ids in [0, num_prompts).
* `update`: prompt ids in range; 0 <= successes <= trials, both finite.
* `update_from_rollouts`: batch prompt ids in range; segment ids in [0, P); rewards in
  [0, 1].

Shapes, dtypes and static arguments are checked by the wrapped functions themselves (at
trace time, in every context).

* Eagerly (concrete inputs, no transformation) a failed check raises `CheckError` at once.
* Inside `jit_checked(fn)` (= `jax.jit(checkify.checkify(fn))`, then `throw`) the checks
  are compiled into the program; a failure raises `CheckError` when the call returns.
* Inside a plain `jax.jit` without checkify, JAX refuses to trace a check ("not
  functionalized"): checked mode needs `jit_checked` (or `checkify.checkify` yourself).
* The unwrapped functions (`sera_jax.allocation.allocate`, `sera_jax.estimators.maxrl`,
  `sera_jax.history.lookup`) keep their cost: under jit they check shapes only.

Cost: one pass over each checked input (a fused reduction) plus the error plumbing; meant
for a study's first step and for tests, not for every step of a long run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import checkify

from sera_jax import estimators as est_lib
from sera_jax import history as history_lib
from sera_jax.allocation import Allocation
from sera_jax.allocation import allocate as _allocate

#: What a failed check raises (checkify's error, a ValueError subclass).
CheckError = checkify.JaxRuntimeError


def _first(bad: jax.Array) -> jax.Array:
    """Index of the first True of `bad` (0 if none), for the message."""
    return jnp.argmax(bad.reshape(-1)).astype(jnp.int32)


def check_ids(name: str, ids: Any, size: int, where: str) -> None:
    """checkify: every id of `ids` lies in [0, size)."""
    ids = jnp.asarray(ids).reshape(-1)
    if ids.size == 0:
        return
    bad = (ids < 0) | (ids >= size)
    i = _first(bad)
    checkify.check(~jnp.any(bad), f"{where}: {name}[{{i}}]={{v}} is outside [0, {size}); "
                   f"{name} must index the {size} entries", i=i, v=ids[i])


def check_probabilities(p: Any, where: str = "allocate") -> None:
    """checkify: every p lies in [0, 1] or is NaN (an unseen prompt)."""
    p = jnp.asarray(p).reshape(-1)
    if p.size == 0:
        return
    bad = ~(jnp.isnan(p) | ((p >= 0) & (p <= 1)))
    i = _first(bad)
    checkify.check(~jnp.any(bad), f"{where}: p[{{i}}]={{v}} is outside [0, 1]; p must be "
                   "success probabilities (NaN marks an unseen prompt)", i=i, v=p[i])


def check_rewards(rewards: Any, binary: bool, where: str) -> None:
    """checkify: rewards are finite, and in {0, 1} when `binary`."""
    r = jnp.asarray(rewards).reshape(-1)
    if r.size == 0:
        return
    bad = ~jnp.isfinite(r)
    if binary:
        bad = bad | ((r != 0) & (r != 1))
    i = _first(bad)
    need = "binary (0 or 1)" if binary else "finite"
    checkify.check(~jnp.any(bad), f"{where}: rewards[{{i}}]={{v}}; rewards must be {need}",
                   i=i, v=r[i])


def allocate(p: Any, budget: Any, **kwargs: Any) -> Allocation:
    """`sera_jax.allocation.allocate` with p checked (in [0, 1] or NaN) in any context."""
    check_probabilities(p, "allocate")
    return _allocate(p, budget, **kwargs)


def advantages(estimator: str, rewards: Any, segment_ids: Any, num_segments: int,
               **kwargs: Any) -> jax.Array:
    """Advantages of the registered `estimator` with segment ids and rewards checked."""
    est = est_lib.get_advantage_estimator(estimator)
    check_ids("segment_ids", segment_ids, num_segments, estimator)
    check_rewards(rewards, est.requires_binary, estimator)
    return est(rewards, segment_ids, num_segments, **kwargs)


def maxrl(rewards: Any, segment_ids: Any, num_segments: int, **kwargs: Any) -> jax.Array:
    """`sera_jax.estimators.maxrl`, checked (segment ids in range, binary rewards)."""
    return advantages("maxrl", rewards, segment_ids, num_segments, **kwargs)


def maxrl_conditional(rewards: Any, segment_ids: Any, num_segments: int) -> jax.Array:
    """`sera_jax.estimators.maxrl_conditional`, checked as `maxrl`."""
    return advantages("maxrl_conditional", rewards, segment_ids, num_segments)


def lookup(h: history_lib.SuccessHistory, prompt_ids: Any) -> jax.Array:
    """`sera_jax.history.lookup` with prompt ids checked in [0, num_prompts)."""
    check_ids("prompt_ids", prompt_ids, h.num_prompts, "history.lookup")
    return history_lib.lookup(h, prompt_ids)


def update(h: history_lib.SuccessHistory, prompt_ids: Any, successes: Any, trials: Any
           ) -> history_lib.SuccessHistory:
    """`sera_jax.history.update`, checked (ids in range, 0 <= successes <= trials)."""
    check_ids("prompt_ids", prompt_ids, h.num_prompts, "history.update")
    s = jnp.asarray(successes, jnp.float32).reshape(-1)
    t = jnp.asarray(trials, jnp.float32).reshape(-1)
    if s.size and s.shape == t.shape:
        bad = ~(jnp.isfinite(s) & jnp.isfinite(t) & (s >= 0) & (s <= t))
        i = _first(bad)
        checkify.check(~jnp.any(bad), "history.update: successes[{i}]={s}, trials[{i}]={t}; "
                       "need 0 <= successes <= trials", i=i, s=s[i], t=t[i])
    return history_lib.update(h, prompt_ids, successes, trials)


def update_from_rollouts(h: history_lib.SuccessHistory, batch_prompt_ids: Any,
                         segment_ids: Any, rewards: Any) -> history_lib.SuccessHistory:
    """`sera_jax.history.update_from_rollouts`, checked (ids in range, rewards in [0, 1])."""
    batch_prompt_ids = jnp.asarray(batch_prompt_ids)
    where = "history.update_from_rollouts"
    check_ids("batch_prompt_ids", batch_prompt_ids, h.num_prompts, where)
    check_ids("segment_ids", segment_ids, batch_prompt_ids.shape[0], where)
    r = jnp.asarray(rewards, jnp.float32).reshape(-1)
    if r.size:
        bad = ~((r >= 0) & (r <= 1))
        i = _first(bad)
        checkify.check(~jnp.any(bad), f"{where}: rewards[{{i}}]={{v}}; rewards must lie in "
                       "[0, 1] (verifier outcomes)", i=i, v=r[i])
    return history_lib.update_from_rollouts(h, batch_prompt_ids, segment_ids, rewards)


def jit_checked(fn: Callable, **jit_kwargs: Any) -> Callable:
    """`fn` compiled with its checks: `jax.jit(checkify.checkify(fn))`; each call raises
    `CheckError` (naming the first bad value) when a check failed, else returns `fn`'s
    output. `jit_kwargs` go to `jax.jit` (e.g. `static_argnums`)."""
    compiled = jax.jit(checkify.checkify(fn, errors=checkify.user_checks), **jit_kwargs)

    def call(*args: Any, **kwargs: Any) -> Any:
        err, out = compiled(*args, **kwargs)
        err.throw()
        return out

    return call


__all__ = ["CheckError", "advantages", "allocate", "check_ids", "check_probabilities",
           "check_rewards", "jit_checked", "lookup", "maxrl", "maxrl_conditional", "update",
           "update_from_rollouts"]
