"""The lab's task and policy: prompts with K candidate answers, a softmax over a shared scorer.

Prompt x has K candidate answers a, each described by a feature vector φ(x, a) ∈ R^D, and a
set C_x of correct answers (1 ≤ |C_x| ≤ `max_correct`). The policy is

    π_θ(a | x) = softmax_a( b(x, a) + f_θ(φ(x, a)) ),

with frozen base logits b (the "pretrained" model: they set the initial difficulty) and a
scorer f_θ shared by every prompt -- linear, f = w·φ, or linear + a small tanh MLP -- so a
step on one prompt moves the others (generalisation, as in the LM studies). Its exact
success probability is the softmax mass on the correct answers,

    p_θ(x) = Σ_{a ∈ C_x} π_θ(a | x),   log p = logsumexp_{a ∈ C_x} log π(a | x),

and the exact likelihood gradient of a set of prompts is ∇_θ mean_x log p_θ(x) (autodiff of
that closed form: `train.exact_gradient`, for every task family). Analytic pass@k
= 1 − (1 − p)^k is `scaling.kappa(p, k, shift=0)`.

Generative model of a task instance (host NumPy from a seeded generator):

* G skills with unit teacher directions t_g ∈ R^d; prompt x has skill g(x) (uniform);
* φ(x, a) = [ε_{x,a}, e_{g(x)}] with ε ~ N(0, I_d) and e_g the one-hot skill code (a linear
  scorer cannot use the code -- it is the same for every answer of a prompt -- an MLP can);
* C_x = the |C_x| answers with the largest teacher score t_{g(x)}·ε_{x,a};
* the initial success probability p0(x) is drawn from the difficulty distribution (a
  mixture of Beta laws), clipped to [`p_floor`, 1 − `p_floor`]; incorrect answers get
  b = σ_b·N(0, 1) and every correct answer the same b = β_x solving p_{θ=0}(x) = p0(x):
  β_x = log(p0/(1 − p0)) + log Σ_{a ∉ C} e^{b_a} − log |C_x|. The scorer starts at 0, so
  the initial policy has exactly these p0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from sera_jax import scaling

#: Named initial difficulty distributions: mixtures of Beta(a, b) laws as (weight, a, b).
DIFFICULTIES: dict[str, tuple[tuple[float, float, float], ...]] = {
    # Like the maze SFT policy: most prompts at 3-30 %, some (15 %) near 0.
    "maze": ((0.85, 2.0, 14.0), (0.15, 0.5, 400.0)),
    # Like a classifier's p over a hard dataset: p from ~0 to ~1, piled up at both ends.
    "imagenet": ((0.5, 0.25, 2.0), (0.5, 0.6, 0.4)),
    "uniform": ((1.0, 1.0, 1.0),),
    # Mostly hard: mean 2.4 %, a long tail towards 0.
    "hard": ((1.0, 0.5, 20.0),),
}
#: Mixture components carried as arrays (padded with zero weight): no recompilation per law.
MAX_COMPONENTS = 4


@flax.struct.dataclass
class LabTask:
    """One split of a task instance (arrays; M prompts, K answers, D features)."""

    features: Array  # float32[M, K, D]: φ(x, a) = [ε, one-hot skill]
    base_logits: Array  # float32[M, K]: frozen b(x, a)
    correct: Array  # bool[M, K]: a ∈ C_x
    skill: Array  # int32[M]: g(x)
    p0: Array  # float32[M]: the initial success probability (target of the base logits)

    @property
    def num_prompts(self) -> int:
        return self.correct.shape[0]


def difficulty_array(spec: str | Sequence[Sequence[float]]) -> np.ndarray:
    """float32[MAX_COMPONENTS, 3] rows (weight, a, b) of a named law (`DIFFICULTIES`) or of
    explicit (weight, a, b) triples; weights are normalised, padding rows have weight 0."""
    if isinstance(spec, str):
        if spec not in DIFFICULTIES:
            raise ValueError(f"difficulty={spec!r}; valid names: {sorted(DIFFICULTIES)} or a "
                             "tuple of (weight, a, b) Beta components")
        spec = DIFFICULTIES[spec]
    rows = np.asarray(spec, np.float64).reshape(-1, 3)
    if not 1 <= len(rows) <= MAX_COMPONENTS:
        raise ValueError(f"difficulty needs 1..{MAX_COMPONENTS} (weight, a, b) components, "
                         f"got {len(rows)}")
    if not (np.all(rows > 0) and np.all(np.isfinite(rows))):
        raise ValueError(f"difficulty components must be finite and > 0, got {rows.tolist()}")
    rows[:, 0] /= rows[:, 0].sum()
    out = np.zeros((MAX_COMPONENTS, 3), np.float32)
    out[:, 1:] = 1.0
    out[: len(rows)] = rows
    return out


def sample_difficulty(rng: np.random.Generator, law: np.ndarray, num: int) -> np.ndarray:
    """float64[num] draws from the Beta mixture `law` (rows (weight, a, b))."""
    law = np.asarray(law, np.float64)
    comp = rng.choice(law.shape[0], size=num, p=law[:, 0] / law[:, 0].sum())
    return rng.beta(law[comp, 1], law[comp, 2])


def make_split(rng: np.random.Generator, teachers: np.ndarray, law: np.ndarray,
               cfg: Mapping[str, Any], num: int) -> LabTask:
    """`num` prompts of a task instance with teacher directions `teachers` [G, d]."""
    num_skills, d = teachers.shape
    k = int(cfg["num_answers"])
    skill = rng.integers(0, num_skills, num)
    eps = rng.standard_normal((num, k, d))
    teacher = np.einsum("mkd,md->mk", eps, teachers[skill])
    n_correct = rng.integers(1, int(cfg["max_correct"]) + 1, num)
    rank = np.argsort(np.argsort(-teacher, axis=1, kind="stable"), axis=1, kind="stable")
    correct = rank < n_correct[:, None]
    floor = float(cfg["p_floor"])
    p0 = np.clip(sample_difficulty(rng, law, num), floor, 1.0 - floor)
    noise = float(cfg["base_logit_scale"]) * rng.standard_normal((num, k))
    wrong = np.where(correct, -np.inf, noise)
    top = wrong.max(axis=1)
    wrong_lse = top + np.log(np.exp(wrong - top[:, None]).sum(axis=1))
    beta = np.log(p0) - np.log1p(-p0) + wrong_lse - np.log(n_correct)
    base = np.where(correct, beta[:, None], noise)
    code = np.eye(num_skills)[skill]
    features = np.concatenate([eps, np.broadcast_to(code[:, None, :], (num, k, num_skills))],
                              axis=-1)
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    return LabTask(features=f32(features), base_logits=f32(base), correct=jnp.asarray(correct),
                   skill=jnp.asarray(skill, jnp.int32), p0=f32(p0))


def make_task(rng: np.random.Generator, law: np.ndarray, cfg: Mapping[str, Any]
              ) -> tuple[LabTask, LabTask]:
    """(train, held-out) splits of one task instance: shared skills and teachers. Host
    NumPy (generated once per seed and shared by every method, nothing to compile)."""
    t = rng.standard_normal((int(cfg["num_skills"]), int(cfg["feature_dim"])))
    teachers = t / np.linalg.norm(t, axis=1, keepdims=True)
    return (make_split(rng, teachers, law, cfg, int(cfg["num_train"])),
            make_split(rng, teachers, law, cfg, int(cfg["num_test"])))


# ----------------------------------------------------------------------------- policy


def init_params(rng: np.random.Generator, cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Scorer parameters with f_θ ≡ 0 (so π starts at softmax(b)): the linear weights are 0;
    the MLP (`scorer == "mlp"`) has random first layer W1 ~ N(0, 1/D) and zero output."""
    dim = int(cfg["feature_dim"]) + int(cfg["num_skills"])
    params: dict[str, Any] = {"linear": jnp.zeros((dim,), jnp.float32)}
    if cfg["scorer"] == "mlp":
        width = int(cfg["mlp_width"])
        params["mlp"] = {
            "w1": jnp.asarray(rng.standard_normal((dim, width)) / np.sqrt(dim), jnp.float32),
            "b1": jnp.zeros((width,), jnp.float32),
            "w2": jnp.zeros((width,), jnp.float32),
        }
    elif cfg["scorer"] != "linear":
        raise ValueError(f"scorer={cfg['scorer']!r}; allowed 'linear' or 'mlp'")
    return params


def logits(params: Mapping[str, Any], task: LabTask) -> Array:
    """float32[M, K]: b(x, a) + w·φ(x, a) (+ w2·tanh(W1ᵀφ + b1))."""
    z = task.base_logits + task.features @ params["linear"]
    if "mlp" in params:
        m = params["mlp"]
        z = z + jnp.tanh(task.features @ m["w1"] + m["b1"]) @ m["w2"]
    return z


def log_policy(params: Mapping[str, Any], task: LabTask) -> Array:
    """log π_θ(a | x), float32[M, K]."""
    return jax.nn.log_softmax(logits(params, task), axis=-1)


def log_success_probs(params: Mapping[str, Any], task: LabTask) -> Array:
    """Exact log p_θ(x) = logsumexp_{a ∈ C_x} log π(a | x), float32[M]."""
    lp = log_policy(params, task)
    return jax.nn.logsumexp(jnp.where(task.correct, lp, -jnp.inf), axis=-1)


def success_probs(params: Mapping[str, Any], task: LabTask) -> Array:
    """Exact p_θ(x) = Σ_{a ∈ C_x} π(a | x), float32[M]."""
    return jnp.exp(log_success_probs(params, task))


def analytic_pass_at_k(p: Array, ks: Sequence[int]) -> Array:
    """mean_x [1 − (1 − p_x)^k] for each k, float32[len(ks)] (`scaling.kappa` with s = 0)."""
    k = jnp.asarray(ks, jnp.float32)
    return jnp.mean(scaling.kappa(p[None, :], k[:, None], shift=0), axis=1)


def sample_answers(log_pi: Array, u: Array) -> Array:
    """Inverse-CDF draws: row r picks the first answer whose cumulative π exceeds u[r].

    log_pi [R, K], u [R] uniforms in [0, 1). One uniform per rollout, so two methods that
    draw rollout j of prompt x with the same policy and the same u get the same answer
    (common random numbers).
    """
    cdf = jnp.cumsum(jnp.exp(log_pi), axis=-1)
    a = jnp.sum(cdf < u[:, None] * cdf[:, -1:], axis=-1)
    return jnp.minimum(a, log_pi.shape[-1] - 1).astype(jnp.int32)


# ----------------------------------------------------------------------------- family interface
# (what `train` calls for every task family; the maze family is `lab.maze_task`)


def sample(log_pi: Array, task: LabTask, x: Array, u: Array) -> tuple[Array, Array]:
    """(answers [R], rewards [R]) of rollout rows of prompts x [R] with uniforms u [R]."""
    a = sample_answers(log_pi[x], u)
    return a, task.correct[x, a].astype(jnp.float32)


def rollout_logprobs(params: Mapping[str, Any], task: LabTask, x: Array, answers: Array
                     ) -> tuple[Array, None]:
    """(log π_θ(a_r | x_r) [R], no mask): one token per rollout."""
    return log_policy(params, task)[x, answers], None

