"""Rollout allocation: SERA (scale-equalised) and its peers (SERA_SPEC §3-5).

Every allocator maps success estimates ``p`` (one per prompt, ``NaN`` = unseen) and an
integer rollout budget ``B`` to an :class:`Allocation`: integer counts that sum to ``B``
exactly, each ``0`` (inactive) or in ``[n_min, n_max]``, the multiplicity weights
``w_q = N0 / N_q`` (``N0 = B / P``) and diagnostics.

How it is computed (all under one ``jax.jit`` per static configuration, O(P) memory):

* **Continuous waterline.** With ``a_q = log λ_q``, ``λ_q = -log(1 - p_q)``, counts are
  ``N_q(t) = clip(s + exp(t - a_q), n_min, n_max)`` at ``t = log τ``. The sum is piecewise
  linear in ``τ`` with kinks at the 2P breakpoints ``log(n_{min|max} - s) + a_q``. Instead
  of sorting them (``jnp.sort`` of 2M floats takes seconds on CPU) a bracketed
  Newton iteration walks between linear pieces: each step solves the one linear equation
  of the current piece exactly, ``t' = t + log(B - fixed(t)) - log(Σ_free exp(t - a_q))``,
  and stops when the piece it solved is the piece it lands in -- the exact solution, not
  a fixed number of bisection steps. Bisection is only the safeguard.
* **Leximin rounding.** ``κ`` is increasing in the level ``ℓ_q(N) = log(N - s) + a_q``,
  so leximin over κ is leximin over levels. Handing out rollouts one at a time to the
  prompt whose current level is lowest yields the leximin allocation (the exchange and
  brute-force tests check it), i.e. the ``B - Σ n_min`` single-rollout "units" with the
  lowest levels. They are found as a second waterline on integer levels: prompt q holds
  ``floor(s + exp(v - a_q)) + 1`` rollouts at level v, and the threshold v is searched
  (secant steps in exp(v), bisection as the safeguard, no sort) inside ``[t* - log 2, t*]``.
  Near-ties (within ``4 ulp``) go to the prompt with fewer rollouts, whose next rollout
  raises κ most, then to the lower index. (Floor-then-top-up is *not* exact: a prompt
  clipped at ``n_max`` may have to give a rollout back.)
* **Active set [paper].** The top-k prompts by the mixed-group probability
  ``u(p, n_max)`` share the budget, k the largest for which every active prompt keeps
  ``u(p, N_q) >= θ``. The paper bisects k, allocating every candidate. Here a window for k
  is predicted without allocating (a set is feasible when the units below its highest
  required level fit in the budget -- two cheap passes per threshold step), then k is
  bisected inside the window with full allocations (usually 2-4), galloping outwards if
  the window was wrong, so the result is the bisection's for either rounding. The ranking
  reproduces the paper's float64 one, ties included (u is quantised to multiples of 2**-53
  near 1, tied prompts keep index order).
* **Passes.** Each step of every search is one pass over P; sums and integer min/max
  share one variadic reduce (see ``_reduce``), selection by index uses a 32-ary tree of
  partial sums (no cumsum, no sort).
* **Paper rounding.** Floor, then +1 for the prompts with the smallest change of
  ``(κ(N) - κ*)^2``, ties by index -- evaluated as ``expm1(τ* - L)^2`` (the common factor
  ``exp(-2τ*)`` dropped) so it does not saturate when ``κ*`` rounds to 1; a float64
  implementation of the formula falls back to index order there (see
  docs/results_allocation.md).

``p = 0`` is treated as the limit ``p -> 0+`` (harder than every representable p: it gets
``n_max`` first) and ``p = 1`` as ``p -> 1-`` (easier than all: ``n_min``); this is what
SERA_SPEC §3 prescribes. Inputs are float32 unless ``jax_enable_x64`` is on, in which case
every step runs in float64 (p down to 1e-300); float32 subnormals (p < 1.2e-38) are 0.
Counts are int32 in both: ``budget``, ``n_min`` and ``n_max`` may each be up to ``2**31 - 1``,
and the batch sums that pass that (``P·n_max`` long before the budget does) are saturated or
rearranged so that no int32 intermediate wraps (see ``_select``), so ``Σ counts == budget``
holds for every accepted input.

Layout, one layer per module (each imports only the ones above it):

* ``_select``: selection without sorting -- variadic reduces, threshold searches on the
  bit patterns of the keys, selection by index (``_reduce``, ``_search``,
  ``_select_smallest``, ``_select_units``, ``_spread``).
* ``_waterline``: the continuous waterline and its roundings (leximin, [paper]) and the
  dynamic active set; ``_peers``: the greedy on marginal gains of Knapsack-RL and HORA.
* ``_engine``: the jitted ``_core`` shared by every allocator and the validation in front
  of it (``_prepare``, ``_run``); it defines the :class:`Allocation` pytree.
* ``api``: the public functions and the registry (``register``; ``register(...,
  init_state=...)`` for an allocator with state across calls), re-exported here;
  ``beyond``: the allocators beyond the paper (``posterior``, ``sequential``) and
  ``evidence`` (``sera_evidence``: SERA with a cap on failure evidence), registered there too;
  ``peers_2026``: the 2026 peers ``vip``, ``gdro`` (stateful: a shadow-price controller)
  and ``pilot_commit`` (two-stage).

Compile size: every call site of a traced function is compiled on its own, and the allocator
is compiled into every program that allocates (the trainer's step, the lab's runner, the
checked step). Where the same large computation runs more than once with different inputs it
runs through one traced copy: ``_select._at_both`` (a search's two end totals, a two-step
``lax.map``) and the two k-bounds of ``_waterline._predict_k`` (a two-step ``fori_loop``).
That took the dynamic rule from 8,099 to 5,218 StableHLO lines (P = 256) and backend compile
time down 35-40 % in two back-to-back runs, with bit-identical counts (384 cases, float32 and
float64; ``git show 508ae7b``).
"""

# The public API and its one `__all__` live in api.py; importing `beyond` and `peers_2026`
# registers their allocators ("posterior", "sequential"; "vip", "gdro", "pilot_commit") in the
# same registry.
from sera_jax.allocation import beyond, peers_2026  # noqa: F401
from sera_jax.allocation.api import *  # noqa: F403
from sera_jax.allocation.api import __all__  # noqa: F401
