"""The lab's compositional task: a next-move policy on small grid mazes, p exact by DP.

A prompt is (maze, start s, goal g) on a G×G grid (a random spanning-tree maze with a
fraction `maze_openings` of the remaining walls knocked down, so some mazes have loops). A
rollout makes H = `horizon` moves; a move into a wall leaves the agent in place; reaching g
is absorbing and is the success (reward 1). The shortest path has L ≤ H moves, so success
needs (at least) L correct moves: long paths are the hard prompts.

The policy is one softmax over the 4 moves, shared by every cell of every maze,

    π_θ(m | c) = softmax_m( w · φ(c, m) ),   w ∈ R^D,

with features φ of the local neighbourhood and the position relative to the goal
(`FEATURES`): the move is blocked, it reduces |Δrow| / |Δcol| to the goal, it increases the
Manhattan distance, the target cell is a dead end / the goal, the target's open degree, the
move's direction. Nothing in φ is the shortest-path direction, so the policy must combine
features; a better w raises p on every maze at once (generalisation across prompts).

Exact success probability by dynamic programming over the absorbing chain: with
T_θ[c, c'] = Σ_m π(m | c) 1{next(c, m) = c'} (the goal's row is the identity),

    d_0 = e_s,  d_{t+1} = d_t T_θ,  p_θ(x) = d_H[g],

and the exact likelihood gradient ∇ log p is autodiff through the H matrix products.
Rollouts draw move t by inverse CDF from the uniform U[x, j, t] (common random numbers, as
for the answer task); a rollout's log-likelihood is Σ_t 1{not yet at g} log π(m_t | c_t).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax import Array, lax

#: Moves (Δrow, Δcol): up, down, left, right.
MOVES = np.array([(-1, 0), (1, 0), (0, -1), (0, 1)])
FEATURES = ("blocked", "closer_row", "closer_col", "farther", "dead_end", "is_goal",
            "open_degree", "up", "down", "left", "right")


@flax.struct.dataclass
class MazeTask:
    """One split: M prompts on G×G grids (C = G² cells), D = len(FEATURES) features."""

    features: Array  # float32[M, C, 4, D]: φ(c, m)
    nxt: Array  # int32[M, C, 4]: the cell after move m from c (c: a wall; goal: absorbing)
    start: Array  # int32[M]
    goal: Array  # int32[M]
    length: Array  # int32[M]: shortest-path length L (1 ≤ L ≤ H)
    horizon: int = flax.struct.field(pytree_node=False, default=1)

    @property
    def num_prompts(self) -> int:
        return self.start.shape[0]


def random_maze(rng: np.random.Generator, size: int, openings: float) -> np.ndarray:
    """bool[C, 4] open[c, m]: a spanning tree of the G×G grid by randomised depth-first
    search, then each remaining interior wall knocked down with probability `openings`."""
    c_num = size * size
    open_ = np.zeros((c_num, 4), bool)
    seen = np.zeros(c_num, bool)
    stack = [int(rng.integers(c_num))]
    seen[stack[0]] = True
    while stack:
        c = stack[-1]
        r, q = divmod(c, size)
        nb = [(m, (r + dr) * size + q + dq) for m, (dr, dq) in enumerate(MOVES)
              if 0 <= r + dr < size and 0 <= q + dq < size and not seen[(r + dr) * size + q + dq]]
        if not nb:
            stack.pop()
            continue
        m, n = nb[int(rng.integers(len(nb)))]
        open_[c, m] = open_[n, m ^ 1] = True  # m ^ 1 is the opposite move
        seen[n] = True
        stack.append(n)
    for c in range(c_num):
        r, q = divmod(c, size)
        for m in (1, 3):  # each interior wall once (down, right)
            dr, dq = MOVES[m]
            if r + dr < size and q + dq < size and not open_[c, m] and rng.random() < openings:
                open_[c, m] = open_[(r + dr) * size + q + dq, m ^ 1] = True
    return open_


def _distances(open_: np.ndarray, size: int, goal: int) -> np.ndarray:
    """BFS distance of every cell to `goal` (int[C])."""
    dist = np.full(size * size, -1)
    dist[goal] = 0
    frontier = [goal]
    while frontier:
        new = []
        for c in frontier:
            r, q = divmod(c, size)
            for m, (dr, dq) in enumerate(MOVES):
                n = (r + dr) * size + q + dq
                if open_[c, m] and dist[n] < 0:
                    dist[n] = dist[c] + 1
                    new.append(n)
        frontier = new
    return dist


def make_prompt(rng: np.random.Generator, cfg: Mapping[str, Any]
                ) -> tuple[np.ndarray, np.ndarray, int, int, int]:
    """(features [C, 4, D], nxt [C, 4], start, goal, L) of one random prompt: a fresh maze,
    a random goal and a start at distance L ∈ [`min_path`, H] (redrawn until one exists)."""
    size, horizon = int(cfg["maze_size"]), int(cfg["horizon"])
    c_num = size * size
    while True:
        open_ = random_maze(rng, size, float(cfg["maze_openings"]))
        goal = int(rng.integers(c_num))
        dist = _distances(open_, size, goal)
        ok = np.flatnonzero((dist >= int(cfg["min_path"])) & (dist <= horizon))
        if ok.size:
            start = int(rng.choice(ok))
            break
    rows, cols = np.divmod(np.arange(c_num), size)
    gr, gc = divmod(goal, size)
    degree = open_.sum(axis=1)
    feats = np.zeros((c_num, 4, len(FEATURES)), np.float32)
    nxt = np.tile(np.arange(c_num)[:, None], (1, 4))
    for m, (dr, dq) in enumerate(MOVES):
        n = np.where(open_[:, m], (rows + dr) * size + cols + dq, np.arange(c_num))
        nxt[:, m] = n
        nr, nc = np.divmod(n, size)
        moved = open_[:, m]
        feats[:, m, 0] = ~moved
        feats[:, m, 1] = moved & (np.abs(nr - gr) < np.abs(rows - gr))
        feats[:, m, 2] = moved & (np.abs(nc - gc) < np.abs(cols - gc))
        feats[:, m, 3] = moved & (np.abs(nr - gr) + np.abs(nc - gc)
                                  > np.abs(rows - gr) + np.abs(cols - gc))
        feats[:, m, 4] = moved & (degree[n] == 1) & (n != goal)
        feats[:, m, 5] = moved & (n == goal)
        feats[:, m, 6] = np.where(moved, degree[n] / 4.0, 0.0)
        feats[:, m, 7 + m] = 1.0
    nxt[goal] = goal  # absorbing
    return feats, nxt, start, goal, int(dist[start])


def make_split(rng: np.random.Generator, cfg: Mapping[str, Any], num: int) -> MazeTask:
    """`num` random prompts (host NumPy, once per seed)."""
    parts = [make_prompt(rng, cfg) for _ in range(num)]
    f, n, s, g, ln = (np.stack(x) for x in zip(*parts))
    return MazeTask(features=jnp.asarray(f), nxt=jnp.asarray(n, jnp.int32),
                    start=jnp.asarray(s, jnp.int32), goal=jnp.asarray(g, jnp.int32),
                    length=jnp.asarray(ln, jnp.int32), horizon=int(cfg["horizon"]))


def make_task(rng: np.random.Generator, law: Any, cfg: Mapping[str, Any]
              ) -> tuple[MazeTask, MazeTask]:
    """(train, held-out) splits; `law` is unused (difficulty comes from the path lengths)."""
    del law
    return make_split(rng, cfg, int(cfg["num_train"])), make_split(rng, cfg, int(cfg["num_test"]))


def init_params(rng: np.random.Generator, cfg: Mapping[str, Any]) -> dict[str, Any]:
    """w = 0 except the 'blocked' weight `init_blocked` (the "pretrained" policy mostly
    avoids walls); `rng` is unused (kept for the family interface)."""
    del rng
    w = np.zeros(len(FEATURES), np.float32)
    w[0] = float(cfg["init_blocked"])
    return {"linear": jnp.asarray(w)}


def log_policy(params: Mapping[str, Any], task: MazeTask) -> Array:
    """log π_θ(m | c), float32[M, C, 4]."""
    return jax.nn.log_softmax(task.features @ params["linear"], axis=-1)


def success_probs(params: Mapping[str, Any], task: MazeTask) -> Array:
    """Exact p_θ(x) = d_H[g] by the DP of the module docstring, float32[M]."""
    pi = jnp.exp(log_policy(params, task))  # [M, C, 4]
    c_num = pi.shape[1]
    trans = jnp.einsum("mck,mckd->mcd", pi, jax.nn.one_hot(task.nxt, c_num, dtype=pi.dtype))
    d0 = jax.nn.one_hot(task.start, c_num, dtype=pi.dtype)
    d = lax.fori_loop(0, task.horizon, lambda _, d: jnp.einsum("mc,mcd->md", d, trans), d0)
    # Rounding can carry the goal's mass a few ulps above 1 (then log1p(−p) in pass@k is NaN).
    return jnp.minimum(jnp.take_along_axis(d, task.goal[:, None], axis=1)[:, 0], 1.0)


#: Floor of p inside the log: a maze the policy has learnt to avoid can underflow to p = 0.
LOG_P_FLOOR = 1e-30


def log_success_probs(params: Mapping[str, Any], task: MazeTask) -> Array:
    """Exact log p_θ(x) (floored at log `LOG_P_FLOOR`), float32[M]; autodiff through the DP
    gives ∇ log p."""
    return jnp.log(jnp.maximum(success_probs(params, task), LOG_P_FLOOR))


def sample(log_pi: Array, task: MazeTask, x: Array, u: Array
           ) -> tuple[tuple[Array, Array, Array], Array]:
    """H moves of each rollout row: ((cells [R, H], moves [R, H], live mask [R, H]),
    rewards [R]). Row r walks maze x[r] from its start; move t is the inverse-CDF draw of
    u[r, t] from π(· | c_t); `live` is False once the goal is reached (absorbed)."""
    goal = task.goal[x]

    def move(c, u_t):
        lp = log_pi[x, c]  # [R, 4]
        cdf = jnp.cumsum(jnp.exp(lp), axis=-1)
        m = jnp.minimum(jnp.sum(cdf < u_t[:, None] * cdf[:, -1:], axis=-1), 3).astype(jnp.int32)
        live = c != goal
        return task.nxt[x, c, m], (c, m, live)

    end, (cells, moves, live) = lax.scan(move, task.start[x], u.T)
    return (cells.T, moves.T, live.T), (end == goal).astype(jnp.float32)


def rollout_logprobs(params: Mapping[str, Any], task: MazeTask, x: Array,
                     actions: tuple[Array, Array, Array]) -> tuple[Array, Array]:
    """(token log-probs [R, H], mask [R, H]): log π_θ(m_t | c_t) of the moves made before
    absorption (the rollout's log-likelihood is their masked sum)."""
    cells, moves, live = actions
    lp = log_policy(params, task)[x[:, None], cells, moves]
    return jnp.where(live, lp, 0.0), live
