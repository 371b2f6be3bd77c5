"""Three 2026 peers under the one allocator contract: VIP, Rollout-GDRO and Pilot-Commit.

Registered in ``ALLOCATORS`` as ``"vip"``, ``"gdro"``, ``"pilot_commit"`` and as the methods of
the same names in ``sera_jax.methods``. Same contract as every allocator: integer counts in
``[n_min, n_max]`` summing to the budget B exactly (every prompt active), weights
``w_q = N0/N_q``, deterministic ties, one jitted program per static configuration (no Python
loop over prompts). Each rule below names its source and says where this port departs from
it (the contract's fixed P and exact B, the inputs an allocator sees).

**VIP** (`vip`; Nguyen et al., "Adaptive Rollout Allocation for Online Reinforcement
Learning with Verifiable Rewards", ICLR 2026, arXiv 2602.01601). With binary rewards the
per-prompt gradient variance of RLOO is ``Var_q = 4 σ_Z² p_q(1 − p_q) / (N_q − 1)`` (Dr.GRPO:
``4 σ_Z² p(1 − p)(N − 1)/N²``); VIP allocates the batch's budget to minimise the summed
variance,

    min_N  Σ_q p_q(1 − p_q) / (N_q − s)   s.t.  Σ_q N_q = B,  n_min ≤ N_q ≤ n_max,

a separable convex programme (s = 1: RLOO's N − 1, the centred estimators'; s = 0: 1/N).
Its continuous KKT solution is a square-root rule, ``N_q = clip(s + √(p_q(1 − p_q)/λ),
n_min, n_max)`` with λ set by the budget. Here the *integer* optimum of the same programme:
the objective is separable and convex in each N_q, so handing out the ``B − P·n_min`` units
(q, N → N + 1) in decreasing order of their variance decrease ``v_q/((N − s)(N + 1 − s))``
is exactly optimal (`_peers._greedy_units`, the knapsack peer's greedy; ties to the prompt
with fewer rollouts, then the lower index); prompts with v = 0 (p in {0, 1}) only take the
leftovers, evenly. *Predictor*: the paper predicts p per prompt with a Gaussian process over
prompt representations fitted to recent rollouts; an allocator sees only the batch's p̂ (no
prompt features or ids), so a GP cannot be carried in its state cheaply -- VIP here uses the
history's p̂ (the discounted Beta posterior mean, SERA_SPEC §4), like every other one-shot
peer. Unseen prompts: the project's ``unseen`` policy. Source read: the paper's abstract
(arxiv.org/html/2602.01601v1) and the variance formulas as quoted by a review of the paper
(themoonlight.io); the repository github.com/HieuNT91/VIP holds a README only ("Our code
will be available after cleanup!"), so the rounding of the paper's continuous solution
could not be checked: this port needs none (the integer optimum).

**Rollout-GDRO** (`gdro`; Panaganti et al., "Group Distributionally Robust
Optimization-Driven Reinforcement Learning for LLM Reasoning", ICML 2026, arXiv 2601.19280;
code github.com/kishanpb/verl-gdro). Prompts are binned by their online pass rate (bin
edges, default ``(0.4, 0.75)``: the code's 3-bin run, ``algorithm_comparison/
run_rollout_groupdro.sh``, bins ``[0, .4), [.4, .75), [.75, 1]`` as in
``PassKOnlineClassifier``), every prompt of a bin gets the bin's rollout count, and a
shadow price μ on the mean budget ``n̄ = B/P`` moves rollouts between bins. The paper's
variance proxy ``Σ_b c_b σ_b²/n_b`` (c_b prompts in bin b) with the price gives the
per-bin best response ``argmin_n σ_b²/n + μ n``, the square-root rule ``n_b = σ_b/√μ``.
Here, per call (one training step):

1. bin b(q) = #{edges ≤ p̂_q}; the bin's variance proxy is an EMA over steps of the batch's
   mean ``p̂(1 − p̂)`` in that bin, ``s_b ← (1 − β) s_b + β · mean_{q∈b} p̂_q(1 − p̂_q)``
   (β = ``ema_beta``, default 0.4 as in the 3-bin run; a bin's first observation sets it;
   bins absent from the batch keep theirs) -- the code's per-bin EMA;
2. the √-rule at the price carried from the previous step: ``n̂_q = clip(√s_{b(q)} / √μ_t,
   n_min, n_max)`` (on the first call ``√μ_0 = mean_q √s_{b(q)} / n̄``, so the unclipped
   proposal spends the budget);
3. the exact budget: ``n̂`` floored, then single rollouts added to the prompts of highest
   need √s_b (taken from the lowest) until Σ N_q = B (`_waterline._round`, ties by index;
   the code's drift fix in ``budget_allocation.py`` orders by need the same way);
4. the dual (shadow-price) step on the proposal's excess over the mean budget, in log space
   so μ stays positive: ``log μ_{t+1} = log μ_t + η (mean_q n̂_q − n̄)/n̄`` (η = ``dual_lr``,
   default 1: near the fixed point the proposal scales as μ^(−1/2), so η = 1 halves the
   log-price error per step).

The state ``GdroState(variance [K], log_price [])`` (K = len(edges) + 1 bins; NaN = not yet
observed) is the allocator's state (``api.register(..., init_state=...)``): the caller passes
``state=`` and carries ``Allocation.state`` to the next step (the allocation lab does in its
scan carry, the LM trainer in ``TrainState.alloc_state``). Where
this departs from the code: the code keeps per-(bin, arm) EXP3 scores fed by per-sample
surrogate losses and chooses one arm per bin by a DP that hits the budget exactly; its dual
update ``μ += lr (realised mean − n̄)`` then sees a realised mean equal to n̄ and μ stays at
its initial 0. An allocator sees no losses, so here the variance proxy is p̂(1 − p̂) (the
reward variance of a binary verifier) and the dual acts on the √-rule's proposal, before the
exact-budget step, so the price does move. Unseen prompts: the project's ``unseen`` policy
(they join no bin and do not update the state).

**Pilot-Commit** (`pilot_commit`; Kim et al., "Spend Your Rollouts Where It Counts: Rollout
Allocation for Group-Based RL Post-Training", arXiv 2605.26606; code
github.com/databricks/pilot-commit, ``recipe/pc/pc_ray_trainer.py``, ``recipe/pc/utils.py``,
``train_scripts/pc_qwen3-4b_p16c48.sh``). A pilot of m rollouts per prompt estimates each
prompt's accuracy ``a_q = K¹_q/m`` (its reward variance ``a_q(1 − a_q)``); prompts with
``diversity_lower ≤ a_q ≤ 1 − diversity_upper`` are kept (the code's ``filter_batch``;
defaults 0.125 and 0.25 from the p16c48 script: keep 0.125 ≤ a ≤ 0.75), too-hard ones are
deferred and too-easy ones evicted; every kept prompt then gets ``n_commit`` more rollouts
and trains on pilot + commit. Two-stage like ``sequential`` (``beyond.TWO_STAGE``): the
caller draws the pilot first and passes ``pilot_successes``. Under a fixed P and an exact
B: every prompt keeps its m pilot rollouts (lower bound ``max(n_min, m)``) and the commit
``B − P·max(n_min, m)`` is split equally over the kept prompts (up to n_max each: the code's
equal ``n_commit``), ties to the higher pilot variance, then the lower index; what the kept
prompts cannot take goes to the others in the same order. As units: the K smallest of

    key_q(N) = N + ½(1 − 4 a_q(1 − a_q)) + (n_max + 1)·1{q not kept},

nondecreasing in N (`_peers._greedy_units`). Departures from the code: pilot and commit are
in the same step on the same policy (the code commits from a buffer of pilots up to 4 steps
old and refills the train batch from up to 10 pilot batches); skipped prompts keep their
pilot rollouts in the batch (the contract has no "drawn but untrained" count: with an
all-equal pilot their centred advantages are 0 anyway); no eviction from later epochs. p̂ is
not used: the pilot is the estimate. ``E[g]`` under these pilot-dependent counts is
``beyond.conditional_scale`` (it holds for any rule of the pilot's rewards).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct
from jax import Array
from jax.typing import ArrayLike

from sera_jax.allocation._engine import (
    Allocation,
    _flush_subnormals,
    _prepare,
    _run,
    _trim,
    diagnostics,
)
from sera_jax.allocation._peers import _greedy_units
from sera_jax.allocation.api import register
from sera_jax.allocation.beyond import _check_common, _check_pilot

__all__ = ["GDRO_EDGES", "GdroState", "gdro", "gdro_state", "pilot_commit", "vip"]

#: Default pass-rate bin edges of Rollout-GDRO (the code's 3-bin run).
GDRO_EDGES = (0.4, 0.75)


@register("vip")
def vip(p: ArrayLike, budget: int, *, n_min: int, n_max: int, shift: int = 1,
        unseen: str = "fill") -> Allocation:
    """VIP: the integer minimiser of ``Σ_q p_q(1 − p_q)/(N_q − s)`` under the budget and the
    bounds (module docstring), p = the history's p̂. ``s = shift`` (1: RLOO's variance, the
    paper's). Exact: greedy on the variance decrease ``p(1 − p)/((N − s)(N + 1 − s))``."""
    return _run("vip", p, budget, n_min=n_min, n_max=n_max, shift=shift, unseen=unseen)


# ----------------------------------------------------------------------------- Rollout-GDRO


@struct.dataclass
class GdroState:
    """Rollout-GDRO's controller state (a pytree). variance: float[K], the EMA of each pass-
    rate bin's mean p̂(1 − p̂) (NaN: bin never observed); log_price: float[], log μ of the
    shadow price on the mean budget (NaN: not yet set)."""

    variance: Array
    log_price: Array


def _check_edges(edges: Any) -> tuple[float, ...]:
    ok = isinstance(edges, tuple | list) and len(edges) >= 1 and all(
        isinstance(e, int | float) and not isinstance(e, bool) for e in edges)
    e = tuple(float(x) for x in edges) if ok else ()
    if not ok or not all(0.0 < x < 1.0 for x in e) or any(a >= b for a, b in zip(e, e[1:])):
        raise ValueError(f"gdro: edges={edges!r}; allowed: a tuple of increasing numbers in "
                         "(0, 1), the pass-rate bin edges")
    return e


def gdro_state(*, edges: Any = GDRO_EDGES, **_: Any) -> GdroState:
    """The fresh state (no bin observed, no price yet) for ``edges``: K = len(edges) + 1."""
    k = len(_check_edges(edges)) + 1
    dt = jnp.result_type(float)
    return GdroState(variance=jnp.full((k,), jnp.nan, dt), log_price=jnp.full((), jnp.nan, dt))


@register("gdro", init_state=gdro_state)
def gdro(p: ArrayLike, budget: int, *, n_min: int, n_max: int, shift: int = 1,
         unseen: str = "fill", state: GdroState | None = None, edges: Any = GDRO_EDGES,
         ema_beta: float = 0.4, dual_lr: float = 1.0) -> Allocation:
    """Rollout-GDRO (module docstring): pass-rate bins, the EMA of each bin's variance proxy,
    the √-rule at the carried shadow price, exact budget by need, one dual step.

    ``state``: the previous call's ``Allocation.state`` (None: ``gdro_state(edges=edges)``, a
    fresh controller). Returns the allocation with ``state`` the controller after this
    step. Traceable (state and p may be traced; the options are static)."""
    e = _check_edges(edges)
    for name, v, lo_ok in (("ema_beta", ema_beta, lambda x: 0.0 < x <= 1.0),
                           ("dual_lr", dual_lr, lambda x: 0.0 <= x < float("inf"))):
        if isinstance(v, bool) or not isinstance(v, int | float) or not lo_ok(float(v)):
            raise ValueError(f"gdro: {name}={v!r}; allowed: " + (
                "a number in (0, 1]" if name == "ema_beta" else "a finite number >= 0"))
    k = len(e) + 1
    st = gdro_state(edges=e) if state is None else state
    if not isinstance(st, GdroState) or jnp.shape(st.variance) != (k,) \
            or jnp.shape(st.log_price) != ():
        raise ValueError(f"gdro: state must be the GdroState of {k} bins that the previous "
                         f"call returned (Allocation.state), got {st!r}")
    pa = jnp.asarray(p, jnp.result_type(float))
    if pa.ndim != 1:
        raise ValueError(f"p must be a 1-D array (one probability per prompt), got {pa.shape}")
    proposal, need, new_state = _gdro_controller(
        pa, st, jnp.asarray(budget, pa.dtype) / pa.shape[0], jnp.asarray(n_min, pa.dtype),
        jnp.asarray(n_max, pa.dtype), edges=e, ema_beta=float(ema_beta),
        dual_lr=float(dual_lr))
    alloc = _run("gdro", p, budget, n_min=n_min, n_max=n_max, shift=shift, unseen=unseen,
                 aux=(proposal, need))
    return alloc.replace(state=new_state)


@functools.partial(jax.jit, static_argnames=("edges", "ema_beta", "dual_lr"))
def _gdro_controller(p, st, n_bar, n_min, n_max, *, edges, ema_beta, dual_lr):
    """Steps 1, 2 and 4 of the module docstring: (proposal n̂ [P], need √s_b(q) [P], state)."""
    k = len(edges) + 1
    seen = ~jnp.isnan(p)
    ps = jnp.where(seen, jnp.clip(p, 0.0, 1.0), 0.0)
    b = jnp.searchsorted(jnp.asarray(edges, p.dtype), ps, side="right")  # #{edges <= p}
    member = seen[:, None] & (b[:, None] == jnp.arange(k)[None, :])  # [P, K], K small
    num = jnp.sum(member, axis=0)
    mean = jnp.sum(jnp.where(member, (ps * (1.0 - ps))[:, None], 0.0), axis=0) / jnp.maximum(
        num, 1)
    old = st.variance.astype(p.dtype)
    ema = jnp.where(num > 0, jnp.where(jnp.isnan(old), mean, (1 - ema_beta) * old
                                       + ema_beta * mean), old)
    need = jnp.where(seen, jnp.sqrt(jnp.nan_to_num(ema)[b]), 0.0)
    n_seen = jnp.sum(seen)
    any_seen = n_seen > 0
    mean_need = jnp.sum(need) / jnp.maximum(n_seen, 1)
    first = 2.0 * jnp.log(jnp.maximum(mean_need, jnp.finfo(p.dtype).tiny) / n_bar)
    log_mu = jnp.where(jnp.isnan(st.log_price), first, st.log_price.astype(p.dtype))
    proposal = jnp.where(seen, jnp.clip(need * jnp.exp(-0.5 * log_mu), n_min, n_max), 0.0)
    excess = (jnp.sum(proposal) / jnp.maximum(n_seen, 1) - n_bar) / n_bar
    log_next = jnp.where(any_seen, log_mu + dual_lr * excess, st.log_price.astype(p.dtype))
    return proposal, need, GdroState(variance=ema, log_price=log_next)


# ----------------------------------------------------------------------------- Pilot-Commit


@functools.partial(jax.jit, static_argnames=("shift",))
def _pilot_commit_core(p, key_shift, num, budget, n_min, n_max, *, shift):
    p = _flush_subnormals(p)
    valid = jnp.arange(p.shape[0]) < num
    known = valid & ~jnp.isnan(p)
    key = lambda n: n.astype(key_shift.dtype) + key_shift  # noqa: E731
    counts = _greedy_units(key, valid, budget, n_min, n_max).astype(jnp.int32)
    return diagnostics(p, valid, known, counts, budget, num, n_min, n_max, shift, None)


@register("pilot_commit")
def pilot_commit(
    p: ArrayLike, budget: int, *, n_min: int, n_max: int, shift: int = 1, unseen: str = "fill",
    pilot_successes: ArrayLike | None = None, pilot: int | None = None,
    diversity_lower: float = 0.125, diversity_upper: float = 0.25,
) -> Allocation:
    """Pilot-Commit (module docstring): after a pilot of ``pilot`` rollouts per prompt
    (default n_min) with ``pilot_successes`` K¹ (int[P] in [0, pilot]), the commit
    ``B − P·max(n_min, pilot)`` goes to the prompts with pilot accuracy in
    ``[diversity_lower, 1 − diversity_upper]``, equally (ties: higher pilot variance, then
    index); the rest keep their pilot. Counts >= pilot (the pilot rollouts are part of
    them). p is not used (NaN allowed); ``unseen="error"`` still refuses NaN."""
    if pilot_successes is None:
        raise ValueError(
            "pilot_commit is a two-stage allocator: draw `pilot` rollouts (default n_min) of "
            "every prompt first and pass their successes as pilot_successes=... (see "
            "sera_jax.studies.lab.train for the protocol)")
    m, k1 = _check_pilot(p, budget, pilot, pilot_successes, n_min, n_max)
    lo = max(int(n_min), m)  # every prompt keeps its pilot
    for name, v in (("diversity_lower", diversity_lower), ("diversity_upper", diversity_upper)):
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0.0 <= float(v) <= 1.0:
            raise ValueError(f"pilot_commit: {name}={v!r}; allowed: a number in [0, 1]")
    _check_common(p, unseen, None, None, 1.0)
    pa = jnp.asarray(p, jnp.result_type(float))
    acc = k1.astype(pa.dtype) / m
    kept = (acc >= diversity_lower) & (acc <= 1.0 - diversity_upper)
    # ½(1 − 4v) in [0, ½]: within a round of N, the higher pilot variance first.
    shift_q = 0.5 * (1.0 - 4.0 * acc * (1.0 - acc)) + jnp.where(kept, 0.0, n_max + 1.0)
    p_pad, n, (nn, bud, lo_c, hi), _ = _prepare(pa, budget, lo, n_max, shift, allow_nan=True)
    size = p_pad.shape[0]
    key_shift = jnp.pad(shift_q.astype(p_pad.dtype), (0, size - n))
    return _trim(_pilot_commit_core(p_pad, key_shift, nn, bud, lo_c, hi, shift=shift), n)
