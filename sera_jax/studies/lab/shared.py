"""What the lab's two step builders share: `train._make_step` (one allocation per step) and
`dynamic.make_step` (DAPO dynamic sampling, rounds of allocations per step).

`Setup` (everything static about a run, from the config's `task`, `rl` and `eval` blocks:
`setup_from_config`), the task families `FAMILIES`, and the parts of one step of one seed
that do not depend on how the batch is filled: `epoch_batch` (the epoch's data order and the
history's epoch start), `rollout_uniforms` (the step's uniforms U_t[x, j]), `history_posterior`
(the frozen Beta posterior of a batch) and `rollout_plan` (the method's allocation of the B
rollouts, traced). Both step builders import this module; neither imports the other's.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import ml_collections
import numpy as np
from jax import Array, lax

from sera_jax import allocation as allocation_lib
from sera_jax import estimators, objective, optim
from sera_jax import history as history_lib
from sera_jax.methods import Method
from sera_jax.studies.lab import maze_task
from sera_jax.studies.lab import task as task_lib

#: Task families (config `task.family`): modules with `make_task`, `init_params`,
#: `log_policy`, `log_success_probs`, `sample`, `rollout_logprobs`.
FAMILIES = {"answers": task_lib, "maze": maze_task}


@dataclasses.dataclass(frozen=True)
class Setup:
    """Everything static about a lab run (hashable: one compiled program per setup+method)."""

    num_train: int = 32
    num_test: int = 64
    num_answers: int = 16
    feature_dim: int = 16
    num_skills: int = 4
    max_correct: int = 2
    p_floor: float = 1e-6
    base_logit_scale: float = 1.0
    scorer: str = "linear"
    mlp_width: int = 16
    #: "answers" (`lab.task`) or "maze" (`lab.maze_task`: the fields below).
    family: str = "answers"
    maze_size: int = 5
    maze_openings: float = 0.1
    horizon: int = 12
    min_path: int = 2
    init_blocked: float = -1.0
    prompts_per_step: int = 8
    n0: int = 8
    n_min: int = 2
    n_max: int = 64
    num_steps: int = 200
    eval_every: int = 20
    #: The optimiser block (`sera_jax.optim` fields as sorted (name, value) pairs: hashable);
    #: unset fields take `optim.DEFAULTS`. Constant schedule only: one compiled runner
    #: serves every run length.
    optimizer: tuple[tuple[str, Any], ...] = (("learning_rate", 0.05),)
    aggregation: str = "sequence_mean"
    unseen: str = "fill"
    posterior_from_history: bool = True
    history_alpha: float = 0.5
    history_beta: float = 0.5
    history_gamma: float = 0.75
    ks: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
    #: Generation rounds per step of a dynamic-sampling method (`lab.dynamic`; `rl.max_rounds`).
    max_rounds: int = 3

    def __post_init__(self):
        p, m = self.prompts_per_step, self.num_train
        if p < 1 or m % p:
            raise ValueError(f"num_train={m} must be a positive multiple of prompts_per_step={p} "
                             "(whole epochs, as the maze data preparation ensures)")
        if self.num_steps < 1 or self.eval_every < 1 or self.num_steps % self.eval_every:
            raise ValueError(f"num_steps={self.num_steps} must be a positive multiple of "
                             f"eval_every={self.eval_every}")
        if not 2 <= self.n_min <= self.n0 <= self.n_max:
            raise ValueError(f"need 2 <= n_min <= n0 <= n_max, got n_min={self.n_min}, "
                             f"n0={self.n0}, n_max={self.n_max}")
        if self.aggregation not in estimators.AGGREGATIONS:
            raise ValueError(f"aggregation={self.aggregation!r}; allowed "
                             f"{estimators.AGGREGATIONS}")
        if self.max_correct < 1 or self.max_correct >= self.num_answers:
            raise ValueError(f"max_correct={self.max_correct} must be in [1, num_answers)")
        if dict(self.optimizer).get("schedule", "constant") != "constant":
            raise ValueError("config.rl.optimizer.schedule must be 'constant' in the lab: one "
                             "compiled runner serves every run length")
        optim.validate(dict(self.optimizer), prefix="rl.optimizer.")
        if isinstance(self.max_rounds, bool) or not isinstance(self.max_rounds, int) \
                or self.max_rounds < 1:
            raise ValueError(f"rl.max_rounds={self.max_rounds!r} must be an integer >= 1")
        if self.family not in FAMILIES:
            raise ValueError(f"task.family={self.family!r}; allowed {tuple(FAMILIES)}")
        if self.family == "maze" and not (
                self.maze_size >= 2 and 1 <= self.min_path <= self.horizon
                and 0 <= self.maze_openings <= 1):
            raise ValueError(f"maze task needs task.maze_size >= 2, 1 <= task.min_path <= "
                             f"task.horizon and task.maze_openings in [0, 1]; got "
                             f"{self.maze_size}, {self.min_path}, {self.horizon}, "
                             f"{self.maze_openings}")

    @property
    def budget(self) -> int:
        return self.prompts_per_step * self.n0

    @property
    def steps_per_epoch(self) -> int:
        return self.num_train // self.prompts_per_step

    @property
    def eval_steps(self) -> np.ndarray:
        """Steps at which pass@k is evaluated: 0, eval_every, 2·eval_every, ..., num_steps."""
        return np.arange(0, self.num_steps + 1, self.eval_every)

    @property
    def uniform_shape(self) -> tuple[int, ...]:
        """Per-rollout uniforms: one (an answer) or H (the maze's moves)."""
        return (self.horizon,) if self.family == "maze" else ()

    def with_(self, **changes: Any) -> Setup:
        return dataclasses.replace(self, **changes)


def setup_from_config(config: ml_collections.ConfigDict) -> Setup:
    """`Setup` from the `task`, `rl` and `eval` blocks of a lab config."""
    t, r, a = config.task, config.rl, config.rl.allocation
    return Setup(
        num_train=t.num_train, num_test=t.num_test, num_answers=t.num_answers,
        feature_dim=t.feature_dim, num_skills=t.num_skills, max_correct=t.max_correct,
        p_floor=t.p_floor, base_logit_scale=t.base_logit_scale, scorer=t.scorer,
        mlp_width=t.mlp_width, family=t.family, maze_size=t.maze_size,
        maze_openings=t.maze_openings, horizon=t.horizon, min_path=t.min_path,
        init_blocked=t.init_blocked, prompts_per_step=r.prompts_per_step, n0=r.rollouts_per_prompt,
        n_min=a.n_min, n_max=a.n_max, num_steps=r.num_steps, eval_every=config.eval.every,
        optimizer=tuple(sorted(r.optimizer.items())), aggregation=r.aggregation,
        unseen=a.unseen, posterior_from_history=a.posterior_from_history,
        history_alpha=r.history.alpha, history_beta=r.history.beta,
        history_gamma=r.history.gamma, ks=tuple(int(k) for k in config.eval.ks),
        max_rounds=r.max_rounds)


def history_posterior(h: history_lib.SuccessHistory, ids: Array) -> tuple[Array, Array]:
    """The frozen Beta posterior (α + S, β + F) of the batch (the prior for unseen ids)."""
    return h.alpha + h.successes[ids], h.beta + h.failures[ids]


def _takes(allocator: str, option: str) -> bool:
    return option in allocation_lib.ALLOCATOR_OPTIONS.get(allocator, ())


def rollout_plan(method: Method, setup: Setup, p_hat: Array, post: tuple[Array, Array],
                 pilot_successes: Array | None = None, state: Any = None
                 ) -> objective.RolloutPlan:
    """The method's rollout plan of one batch (traced), given the pilot's successes
    (two-stage allocators), the history's posterior (allocators that take alpha/beta,
    when `posterior_from_history`) and a stateful allocator's state (the plan's `state` is
    the next one)."""
    alpha, beta = (post if setup.posterior_from_history and _takes(method.allocator, "alpha")
                   else (None, None))
    return objective.plan_rollouts(method, p_hat, setup.budget, n_min=setup.n_min,
                                   n_max=setup.n_max, unseen=setup.unseen,
                                   pilot_successes=pilot_successes, alpha=alpha, beta=beta,
                                   state=state)


def epoch_batch(setup: Setup, h: history_lib.SuccessHistory, t: Array, k_data: Array
                ) -> tuple[history_lib.SuccessHistory, Array]:
    """(history, batch prompt ids) of step t: epoch e = t // steps_per_epoch walks the
    permutation fold_in(k_data, e) of the train prompts in blocks of P; the history starts
    a new epoch (`history.start_epoch`) at the epoch's first step."""
    num_p, spe = setup.prompts_per_step, setup.steps_per_epoch
    epoch, pos = t // spe, t % spe
    h = lax.cond(pos == 0, history_lib.start_epoch, lambda x: x, h)
    perm = jax.random.permutation(jax.random.fold_in(k_data, epoch), setup.num_train)
    return h, lax.dynamic_slice_in_dim(perm, pos * num_p, num_p)


def rollout_uniforms(setup: Setup, k_roll: Array, t: Array) -> Array:
    """U_t [M, n_max, *uniform_shape]: rollout j of prompt x at step t uses U_t[x, j]."""
    shape = (setup.num_train, setup.n_max) + setup.uniform_shape
    return jax.random.uniform(jax.random.fold_in(k_roll, t), shape)


__all__ = ["FAMILIES", "Setup", "epoch_batch", "history_posterior", "rollout_plan",
           "rollout_uniforms", "setup_from_config"]
