"""The one registry of compared methods: a name -> allocator + options + multiplicity + estimator.

Every study (RL on mazes and math, gradient alignment, the allocation demo and lab) names
its methods from `METHODS`, so "sera" means the same thing in every table:

| name | allocator (options) | weights w_q | advantages |
|---|---|---|---|
| `uniform` | uniform (plain MaxRL) | N0/N_q = 1 | MaxRL |
| `sera` | sera (dynamic active set, leximin) | N0/N_q | MaxRL |
| `sera_equalized` | sera (every prompt active) | N0/N_q | MaxRL |
| `sera_no_multiplicity` | sera (dynamic) | 1 on active prompts (ablation) | MaxRL |
| `sera_paper_rounding` | sera (dynamic, the published rounding) | N0/N_q | MaxRL |
| `inverse_p`, `knapsack`, `hit_utility` | the peer allocators | N0/N_q | MaxRL |
| `vip` | VIP: min Σ p̂(1−p̂)/(N−1), exact integers (`peers_2026`) | N0/N_q | MaxRL |
| `gdro` | Rollout-GDRO: pass-rate bins, shadow price, √-rule; stateful | N0/N_q | MaxRL |
| `pilot_commit` | Pilot-Commit: in-step pilot, commit to mixed ones; two-stage | N0/N_q | MaxRL |
| `grpo` | uniform | 1 | GRPO |
| `sera_posterior`, `sera_sequential` | [ours] `sera_jax.allocation.beyond` | N0/N_q | MaxRL |
| `dapo`, `sera_dapo` | uniform / sera, then DAPO dynamic sampling | N0/N_q | MaxRL |
| `sera_evidence` | [ours] sera, minus prompts at the evidence cap (`evidence`) | N0/N_q | MaxRL |

Two kinds of methods need more than p̂ from their caller: a *two-stage* one
(`Method.two_stage`: `sera_sequential`, `pilot_commit`) allocates after an in-step pilot, and
a *stateful* one (`Method.stateful`: `gdro`) carries its allocator's state from one step to
the next (`Method.init_state`, `allocate(state=...)`, `Allocation.state`). The allocation lab
and the LM trainer (`sera_jax.rl.collect`: the pilot drawn in the step, the state in
`TrainState.alloc_state`) run both; the tunix learner refuses both.

`resolve(name, overrides)` applies a user's overrides on top of a preset: each one either
takes effect or raises ValueError (an option the chosen allocator does not use, an unknown
key) -- a preset never silently replaces what the user asked for.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from sera_jax import allocation as allocation_lib
from sera_jax import scaling
from sera_jax.allocation import beyond, evidence  # noqa: F401 (registers sera_evidence)
from sera_jax.estimators import ADVANTAGE_ESTIMATORS

#: Keys a user may override on top of a method preset (`None` = keep the preset's).
OVERRIDABLE = ("allocator", "mode", "rounding", "threshold", "multiplicity", "estimator")


@dataclasses.dataclass(frozen=True)
class Method:
    """One compared method.

    allocator: key of `sera_jax.allocation.ALLOCATORS`; options: its options
    (`ALLOCATOR_OPTIONS[allocator]` only); multiplicity: train with w_q = N0/N_q (False: the
    ablation w_q = 1 on active prompts); estimator: key of
    `sera_jax.estimators.ADVANTAGE_ESTIMATORS`; dynamic_sampling: DAPO's over-sample, drop
    all-equal groups, refill (`sera_jax.dynamic_sampling`), after the allocation; applied
    by `sera_jax.integrations.tunix`, the LM trainer (`sera_jax.rl.dynamic`) and the
    allocation lab (`sera_jax.studies.lab.dynamic`); other callers must refuse such a method.
    """

    name: str
    label: str
    allocator: str
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    multiplicity: bool = True
    estimator: str = "maxrl"
    dynamic_sampling: bool = False

    def __post_init__(self):
        allocation_lib.check_options(self.allocator, self.options)
        if self.dynamic_sampling and (self.allocator in beyond.TWO_STAGE
                                      or self.allocator in allocation_lib.ALLOCATOR_STATE):
            raise ValueError(f"method {self.name!r}: dynamic sampling draws several rounds "
                             "per step, so it takes a one-shot, stateless allocator; "
                             f"{self.allocator!r} is two-stage or stateful")
        if self.estimator not in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"method {self.name!r}: estimator={self.estimator!r}; valid: "
                             f"{sorted(ADVANTAGE_ESTIMATORS)}")
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))

    @property
    def two_stage(self) -> bool:
        """The allocator needs in-step pilot outcomes (`pilot_successes`): usable where the
        caller draws a pilot first (the allocation lab, the LM trainer, the alignment study's
        measure mode), not by the tunix learner."""
        return self.allocator in beyond.TWO_STAGE

    @property
    def stateful(self) -> bool:
        """The allocator carries a state from one step to the next (`init_state`,
        `allocate(state=...)`, `Allocation.state`): usable where the caller carries it (the
        allocation lab, the LM trainer's `TrainState.alloc_state`), not by the tunix
        learner."""
        return self.allocator in allocation_lib.ALLOCATOR_STATE

    def init_state(self) -> Any:
        """The allocator's fresh state for this method's options (a pytree of arrays), None
        for a stateless allocator (`allocation.initial_state`)."""
        return allocation_lib.initial_state(self.allocator, self.options)

    def pilot_size(self, n_min: int) -> int:
        """Pilot rollouts per prompt to draw before `allocate` (0 for a one-shot allocator):
        the allocator's ``pilot`` option, default n_min (`allocation.beyond.pilot_size`)."""
        return beyond.pilot_size(self.allocator, self.options, n_min)

    @property
    def kappa_shift(self) -> int:
        """s of κ(p, N, s) for this method's estimator (1 centered, 0 conditional)."""
        shift = ADVANTAGE_ESTIMATORS[self.estimator].kappa_shift
        return 1 if shift is None else int(shift)

    def allocate(self, p: Any, budget: int, *, n_min: int, n_max: int, unseen: str = "fill",
                 shift: int | None = None, pilot_successes: Any = None, alpha: Any = None,
                 beta: Any = None, state: Any = None) -> allocation_lib.Allocation:
        """`ALLOCATORS[allocator](p, budget, ..., **options, **inputs)`; shift defaults to the
        estimator's.

        The per-call inputs are passed only when given: `pilot_successes` (int[P], the
        successes of the `pilot_size(n_min)` pilot rollouts of each prompt; required by a
        two-stage allocator, whose call without it raises), a Beta posterior `alpha`,
        `beta` (float[P]) for the allocators that take one, and a stateful allocator's
        `state` (the previous step's `Allocation.state`; None: `init_state()`, a fresh
        start; the next state is the result's `.state`). An input the allocator does not
        use raises ValueError (`allocation.check_options`). Traceable (the lab calls it under
        jit + vmap).
        """
        inputs = {k: v for k, v in (("pilot_successes", pilot_successes), ("alpha", alpha),
                                    ("beta", beta), ("state", state)) if v is not None}
        fn = allocation_lib.get_allocator(self.allocator)
        return fn(p, budget, n_min=n_min, n_max=n_max, unseen=unseen,
                  shift=self.kappa_shift if shift is None else shift, **self.options, **inputs)

    def expected_scale(self, p: Any, counts: Any, *, n_min: int, pilot_successes: Any = None,
                       shift: int | None = None) -> Any:
        """E[scale of prompt q's gradient term | the allocation], per prompt (jnp, traceable).

        E[(1/N_q) Σ_i A_i S_i | what chose N_q] = scale_q · ∇log p_q: κ(p_q, N_q, s) for a
        one-shot allocator (counts fixed before any rollout); for a two-stage one, given its
        pilot's successes K¹ (of m = `pilot_size(n_min)`), the conditional scale
        `allocation.beyond.conditional_scale(p, K¹, m, N_q)` (centred MaxRL on all N_q
        rollouts, pilot included). `shift`: s of the one-shot κ (default the estimator's).
        Inactive prompts (N_q = 0) are the caller's to mask.
        """
        if not self.two_stage:
            return scaling.kappa(p, counts, self.kappa_shift if shift is None else shift)
        if pilot_successes is None:
            raise ValueError(f"method {self.name!r} is two-stage: its scale depends on the "
                             "pilot's outcomes; pass pilot_successes=...")
        return beyond.conditional_scale(p, pilot_successes, self.pilot_size(n_min), counts)

    def prompt_weights(self, counts: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """The per-prompt loss weights: the allocator's N0/N_q, or 1{N_q > 0} without the
        multiplicity correction. NumPy in, NumPy out; traced (jit) in, traced out, so jitted
        callers use this function itself without a host round-trip."""
        xp = jnp if isinstance(counts, jax.Array) or isinstance(weights, jax.Array) else np
        if self.multiplicity:
            return xp.asarray(weights, xp.float32)
        return (xp.asarray(counts) > 0).astype(xp.float32)

    def to_dict(self) -> dict[str, Any]:
        """JSON form (stored in run configs and fingerprints)."""
        return {"name": self.name, "allocator": self.allocator, "options": dict(self.options),
                "multiplicity": self.multiplicity, "estimator": self.estimator,
                **({"dynamic_sampling": True} if self.dynamic_sampling else {})}


def _m(name, label, allocator, multiplicity=True, estimator="maxrl", dynamic_sampling=False,
       **options) -> Method:
    return Method(name, label, allocator, options, multiplicity, estimator, dynamic_sampling)


METHODS: dict[str, Method] = {m.name: m for m in (
    _m("uniform", "uniform (MaxRL)", "uniform"),
    _m("sera", "SERA", "sera", mode="dynamic", rounding="leximin", threshold=0.05),
    _m("sera_equalized", "SERA equalized", "sera", mode="equalized", rounding="leximin"),
    _m("sera_no_multiplicity", "SERA w/o multiplicity", "sera", multiplicity=False,
       mode="dynamic", rounding="leximin", threshold=0.05),
    _m("sera_paper_rounding", "SERA paper rounding", "sera", mode="dynamic", rounding="paper",
       threshold=0.05),
    _m("inverse_p", "inverse-p", "inverse_p"),
    _m("knapsack", "knapsack", "knapsack"),
    _m("hit_utility", "hit-utility", "hit_utility"),
    # The 2026 peers (sera_jax.allocation.peers_2026): VIP, Rollout-GDRO, Pilot-Commit.
    _m("vip", "VIP", "vip"),
    _m("gdro", "Rollout-GDRO", "gdro"),
    _m("pilot_commit", "Pilot-Commit", "pilot_commit", pilot=2),
    _m("grpo", "GRPO", "uniform", estimator="grpo"),
    # Beyond the paper (sera_jax.allocation.beyond; measured in docs/results_lab.md).
    _m("sera_posterior", "SERA posterior-aware", "posterior"),
    _m("sera_sequential", "SERA in-step sequential", "sequential", pilot=2),
    _m("sera_evidence", "SERA + evidence cap", "sera_evidence", threshold=0.05, evidence_cap=64.0),
    # DAPO dynamic sampling (sera_jax.dynamic_sampling), alone and after SERA's allocation.
    _m("dapo", "DAPO dynamic sampling", "uniform", dynamic_sampling=True),
    _m("sera_dapo", "SERA + dynamic sampling", "sera", dynamic_sampling=True, mode="dynamic",
       rounding="leximin", threshold=0.05),
)}


#: Former method names (in older configs, records and docs) -> their name now.
RENAMED_METHODS: dict[str, str] = {
    "sera_dynamic": "sera",
    "sera_no_mult": "sera_no_multiplicity",
    "sera_no_correction": "sera_no_multiplicity",
}


def unknown_method_message(name: Any, what: str = "method") -> str:
    """Why `name` is not a method: the new name of a renamed one (`RENAMED_METHODS`), else
    the nearest valid name; with the valid names."""
    if name in RENAMED_METHODS:
        return (f"{what} {name!r} was renamed {RENAMED_METHODS[name]!r}; use "
                f"{RENAMED_METHODS[name]!r}")
    return f"unknown {what} {name!r}{nearest(name, METHODS)}; valid methods: {sorted(METHODS)}"


def nearest(name: str, valid: Any) -> str:
    """' (did you mean X?)' for the closest valid name, or ''."""
    close = difflib.get_close_matches(str(name), [str(v) for v in valid], n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else ""


def get_method(name: str) -> Method:
    """The registered method `name`; ValueError naming its new name when it was renamed
    (`RENAMED_METHODS`), else the valid ones (and the nearest)."""
    try:
        return METHODS[name]
    except (KeyError, TypeError):
        raise ValueError(unknown_method_message(name)) from None


def resolve(name: str, overrides: Mapping[str, Any] | None = None) -> Method:
    """The method `name` with the user's `overrides` (keys of `OVERRIDABLE`; None = preset).

    Changing `allocator` drops the preset's allocator options (they belong to the preset's
    allocator) but keeps every option the user set. Raises ValueError for an unknown key,
    an unknown allocator or estimator, or an option the resulting allocator does not use.
    """
    base = get_method(name)
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    unknown = sorted(set(given) - set(OVERRIDABLE))
    if unknown:
        raise ValueError(f"method {name!r}: unknown override(s) {unknown}; overridable: "
                         f"{list(OVERRIDABLE)}")
    allocator = given.pop("allocator", base.allocator)
    options = dict(base.options) if allocator == base.allocator else {}
    if given.get("mode", "dynamic") != "dynamic":
        options.pop("threshold", None)  # θ belongs to the preset's dynamic mode
    multiplicity = bool(given.pop("multiplicity", base.multiplicity))
    estimator = given.pop("estimator", base.estimator)
    options.update(given)
    try:
        return Method(name, base.label, allocator, options, multiplicity, estimator,
                      base.dynamic_sampling)
    except ValueError as e:
        shown = {k: v for k, v in (overrides or {}).items() if v is not None}
        raise ValueError(f"method {name!r} with overrides {shown}: {e}") from None


__all__ = ["METHODS", "OVERRIDABLE", "RENAMED_METHODS", "Method", "get_method", "nearest",
           "resolve", "unknown_method_message"]
