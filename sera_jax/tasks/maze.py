"""Maze navigation as an RL task (SERA_SPEC §7, Maze).

A perfect maze (a spanning tree over the odd cells of an `n x n` grid, carved by randomised
Prim's algorithm or, with `generator="backtracker"`, by a randomised depth-first search) is
shown to the policy as a grid of tokens; the answer is the sequence of moves from the start
(1, 1) to the goal (n-2, n-2), then DONE and eos.

Token layout (vocabulary of 32; ids 17..31 are reserved and never produced by the task):

    prompt  = bos GRID_START  (cell * n  NEWLINE) * n  GRID_END PATH_START
              -> 2 + n (n + 1) + 2 tokens, 310 at n = 17
    answer  = move * L  DONE  eos          move in {UP, DOWN, LEFT, RIGHT}

Verifier (total: any int sequence gets 0 or 1 and it never raises):
  * DONE is required; only the tokens before the first DONE are read;
  * they are walked from the start one grid cell per move; a token that is not a move,
    a step off the grid or onto a wall fails at once;
  * stepping onto the goal succeeds at once (tokens after it, before DONE, are not read).

Everything here is host NumPy: walking grids is control flow, not array math worth a
device. The batch verifier is vectorised over completions (one NumPy step per token
position), so scoring 10^5 completions costs milliseconds per position.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from sera_jax.tasks.base import RLTask

# --------------------------------------------------------------------------- vocabulary

PAD, BOS, EOS, UNK = 0, 1, 2, 3
GRID_START, GRID_END, PATH_START, DONE = 4, 5, 6, 7
PATH, WALL, GOAL, START, NEWLINE = 8, 9, 10, 11, 12
UP, DOWN, LEFT, RIGHT = 13, 14, 15, 16
VOCAB_SIZE = 32
TOKEN_NAMES: tuple[str, ...] = (
    "<pad>", "<bos>", "<eos>", "<unk>", "GRID_START", "GRID_END", "PATH_START", "DONE",
    "PATH", "WALL", "GOAL", "START", "NEWLINE", "UP", "DOWN", "LEFT", "RIGHT",
) + tuple(f"<reserved_{i}>" for i in range(17, VOCAB_SIZE))
MOVE_DELTAS: dict[int, tuple[int, int]] = {UP: (-1, 0), DOWN: (1, 0), LEFT: (0, -1), RIGHT: (0, 1)}
_DELTA_TO_MOVE = {d: t for t, d in MOVE_DELTAS.items()}

# Lookup tables over every int32 token id the verifier may see (clipped into [0, VOCAB)).
_IS_MOVE = np.zeros(VOCAB_SIZE, bool)
_DR = np.zeros(VOCAB_SIZE, np.int64)
_DC = np.zeros(VOCAB_SIZE, np.int64)
for _tok, (_dr, _dc) in MOVE_DELTAS.items():
    _IS_MOVE[_tok], _DR[_tok], _DC[_tok] = True, _dr, _dc


def _check_size(size: int) -> int:
    if isinstance(size, bool) or int(size) != size or size < 5 or size % 2 == 0:
        raise ValueError(f"size must be an odd integer >= 5, got {size!r}")
    return int(size)


def prompt_length(size: int) -> int:
    """Prompt tokens for an `size x size` maze: `2 + size (size + 1) + 2` (310 at 17)."""
    size = _check_size(size)
    return 2 + size * (size + 1) + 2


def max_path_moves(size: int) -> int:
    """Longest possible shortest path in moves: a Hamiltonian path through all odd cells,
    `2 (c^2 - 1)` with `c = (size - 1) / 2` cells per side (126 at 17)."""
    cells = (_check_size(size) - 1) // 2
    return 2 * (cells * cells - 1)


def max_answer_length(size: int) -> int:
    """Longest answer in tokens: the longest path, DONE and eos."""
    return max_path_moves(size) + 2


def start_goal(size: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """Start (1, 1) and goal (size-2, size-2)."""
    size = _check_size(size)
    return (1, 1), (size - 2, size - 2)


# --------------------------------------------------------------------------- generation


#: Maze generators: randomised Prim's (the study's original mazes: short, bushy trees whose
#: start-to-goal path is often one of the few monotone paths) and the recursive backtracker
#: (randomised depth-first search: long corridors, long and varied start-to-goal paths).
GENERATORS = ("prim", "backtracker")


def _check_generator(generator: str) -> str:
    if generator not in GENERATORS:
        raise ValueError(f"generator must be one of {GENERATORS}, got {generator!r}")
    return generator


def generate_maze(size: int, seed: int | np.random.Generator, generator: str = "prim"
                  ) -> np.ndarray:
    """A perfect maze on the odd cells; bool `[size, size]`, True = wall. Deterministic in
    `seed` (an int or a NumPy Generator, which is advanced) and `generator`:

    * "prim": randomised Prim's algorithm. The maze grows from the start cell by repeatedly
      opening a uniformly chosen frontier wall (a wall between a carved cell and an uncarved
      one) and carving the cell behind it.
    * "backtracker": recursive backtracker (randomised depth-first search). From the cell on
      top of a stack (the start first), carve into a uniformly chosen uncarved neighbour and
      push it; with none left, pop.

    Either way the open cells form a spanning tree over the odd cells.
    """
    size = _check_size(size)
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    if _check_generator(generator) == "backtracker":
        return _backtracker(size, rng)
    walls = np.ones((size, size), bool)
    carved = np.zeros((size, size), bool)
    start = (1, 1)
    walls[start] = False
    carved[start] = True
    # Frontier edges (cell_in, cell_out); duplicates to the same uncarved cell are allowed
    # (classic "randomised Prim": edges are stale once their outer cell is carved).
    frontier: list[tuple[int, int, int, int]] = []

    def push(r: int, c: int) -> None:
        for dr, dc in ((-2, 0), (2, 0), (0, -2), (0, 2)):
            rr, cc = r + dr, c + dc
            if 1 <= rr <= size - 2 and 1 <= cc <= size - 2 and not carved[rr, cc]:
                frontier.append((r, c, rr, cc))

    push(*start)
    while frontier:
        i = int(rng.integers(len(frontier)))
        frontier[i], frontier[-1] = frontier[-1], frontier[i]
        r, c, rr, cc = frontier.pop()
        if carved[rr, cc]:
            continue
        walls[(r + rr) // 2, (c + cc) // 2] = False
        walls[rr, cc] = False
        carved[rr, cc] = True
        push(rr, cc)
    return walls


def _backtracker(size: int, rng: np.random.Generator) -> np.ndarray:
    """Recursive-backtracker carving (iterative, with an explicit stack) from (1, 1)."""
    walls = np.ones((size, size), bool)
    walls[1, 1] = False
    stack = [(1, 1)]
    while stack:
        r, c = stack[-1]
        options = [(r + dr, c + dc) for dr, dc in ((-2, 0), (2, 0), (0, -2), (0, 2))
                   if 1 <= r + dr <= size - 2 and 1 <= c + dc <= size - 2
                   and walls[r + dr, c + dc]]
        if not options:
            stack.pop()
            continue
        rr, cc = options[int(rng.integers(len(options)))]
        walls[(r + rr) // 2, (c + cc) // 2] = False
        walls[rr, cc] = False
        stack.append((rr, cc))
    return walls


def maze_hash(walls: np.ndarray) -> str:
    """Content hash of a wall grid (size and cells): the identity used to dedupe splits."""
    walls = np.asarray(walls, bool)
    h = hashlib.sha1(np.asarray(walls.shape, np.int64).tobytes())
    h.update(np.packbits(walls).tobytes())
    return h.hexdigest()


def bfs_distances(walls: np.ndarray, source: tuple[int, int]) -> np.ndarray:
    """Shortest move counts from `source` to every open cell (-1: wall or unreachable)."""
    walls = np.asarray(walls, bool)
    dist = np.full(walls.shape, -1, np.int64)
    if walls[source]:
        return dist
    dist[source] = 0
    queue = deque([source])
    while queue:
        r, c = queue.popleft()
        for dr, dc in MOVE_DELTAS.values():
            rr, cc = r + dr, c + dc
            if (0 <= rr < walls.shape[0] and 0 <= cc < walls.shape[1]
                    and not walls[rr, cc] and dist[rr, cc] < 0):
                dist[rr, cc] = dist[r, c] + 1
                queue.append((rr, cc))
    return dist


def shortest_path(walls: np.ndarray) -> np.ndarray:
    """BFS shortest path from the start to the goal as move tokens (int32 `[L]`).

    Walks back from the goal along strictly decreasing BFS distance; in a perfect maze the
    path is unique. Raises ValueError if the goal is unreachable.
    """
    walls = np.asarray(walls, bool)
    start, goal = start_goal(walls.shape[0])
    dist = bfs_distances(walls, start)
    if dist[goal] < 0:
        raise ValueError("walls: the goal is not reachable from the start")
    moves: list[int] = []
    r, c = goal
    while (r, c) != start:
        for (dr, dc), tok in _DELTA_TO_MOVE.items():
            pr, pc = r - dr, c - dc  # predecessor that reaches (r, c) with move `tok`
            inside = 0 <= pr < walls.shape[0] and 0 <= pc < walls.shape[1]
            if inside and dist[pr, pc] == dist[r, c] - 1:
                moves.append(tok)
                r, c = pr, pc
                break
    return np.asarray(moves[::-1], np.int32)


# --------------------------------------------------------------------------- encoding


def encode_prompt(walls: np.ndarray) -> np.ndarray:
    """Prompt tokens (int32): bos GRID_START, each row's cells + NEWLINE, GRID_END PATH_START."""
    walls = np.asarray(walls, bool)
    size = _check_size(walls.shape[0])
    start, goal = start_goal(size)
    cells = np.where(walls, WALL, PATH).astype(np.int32)
    cells[start], cells[goal] = START, GOAL
    rows = np.concatenate([cells, np.full((size, 1), NEWLINE, np.int32)], axis=1)
    return np.concatenate([[BOS, GRID_START], rows.reshape(-1), [GRID_END, PATH_START]]).astype(
        np.int32
    )


def encode_answer(moves: np.ndarray) -> np.ndarray:
    """Answer tokens (int32): the moves, DONE, eos."""
    return np.concatenate([np.asarray(moves, np.int32), [DONE, EOS]]).astype(np.int32)


def decode(tokens: Sequence[int]) -> str:
    """Space-separated token names (unknown ids print as `<id:N>`)."""
    return " ".join(
        TOKEN_NAMES[t] if 0 <= t < VOCAB_SIZE else f"<id:{t}>" for t in (int(x) for x in tokens)
    )


# --------------------------------------------------------------------------- verifier


def pad_completions(
    completions: Sequence[np.ndarray], pad_id: int = PAD
) -> tuple[np.ndarray, np.ndarray]:
    """Ragged completions -> right-padded int64 `[B, L]` tokens and int64 `[B]` lengths."""
    lengths = np.asarray([len(c) for c in completions], np.int64)
    tokens = np.full((len(completions), max(1, int(lengths.max(initial=0)))), pad_id, np.int64)
    for i, comp in enumerate(completions):
        if len(comp):
            tokens[i, : len(comp)] = np.asarray(comp, np.int64).reshape(-1)
    return tokens, lengths


def walk(walls: np.ndarray, tokens: np.ndarray, lengths: np.ndarray) -> dict[str, np.ndarray]:
    """Vectorised verifier over a batch: walls bool `[B, n, n]` (or one `[n, n]` grid shared
    by all rows), tokens int `[B, L]` (right-padded), lengths int `[B]`.

    Returns `reward` float32 `[B]` in {0, 1} (the spec's rules, module docstring) plus the
    diagnostics `reached_goal`, `has_done`, `failed` (bool) and `steps` (moves taken).
    """
    tokens = np.asarray(tokens)
    if tokens.ndim != 2:
        raise ValueError(f"tokens must be [B, L], got shape {tokens.shape}")
    batch, width = tokens.shape
    lengths = np.clip(np.asarray(lengths, np.int64).reshape(batch), 0, width)
    walls = np.asarray(walls, bool)
    if walls.ndim == 2:
        walls = np.broadcast_to(walls, (batch, *walls.shape))
    if walls.shape[0] != batch or walls.shape[1] != walls.shape[2]:
        raise ValueError(f"walls must be [B, n, n] with B = {batch}, got shape {walls.shape}")
    size = walls.shape[1]
    (sr, sc), (gr, gc) = start_goal(size)
    in_len = np.arange(width)[None, :] < lengths[:, None]
    is_done = in_len & (tokens == DONE)
    has_done = is_done.any(axis=1)
    first_done = np.where(has_done, is_done.argmax(axis=1), width)
    # Ids outside the vocabulary (negative or >= 32) map to UNK: not a move, so a failure.
    tok = np.where((tokens >= 0) & (tokens < VOCAB_SIZE), tokens, UNK).astype(np.int64)
    r = np.full(batch, sr, np.int64)
    c = np.full(batch, sc, np.int64)
    status = np.zeros(batch, np.int8)  # 0 walking, 1 reached the goal, -1 failed
    steps = np.zeros(batch, np.int64)
    rows = np.arange(batch)
    for t in range(width):
        walking = (status == 0) & (t < first_done)
        if not walking.any():
            break
        tt = tok[:, t]
        nr, nc = r + _DR[tt], c + _DC[tt]
        off = (nr < 0) | (nr >= size) | (nc < 0) | (nc >= size)
        hit = walls[rows, np.clip(nr, 0, size - 1), np.clip(nc, 0, size - 1)]
        fail = walking & (~_IS_MOVE[tt] | off | hit)
        moved = walking & ~fail
        r, c = np.where(moved, nr, r), np.where(moved, nc, c)
        steps += moved
        status[fail] = -1
        status[moved & (r == gr) & (c == gc)] = 1
    reached = status == 1
    return {
        "reward": (reached & has_done).astype(np.float32),
        "reached_goal": reached,
        "has_done": has_done,
        "failed": status == -1,
        "steps": steps,
    }


def verify(walls: np.ndarray, completions: Sequence[np.ndarray]) -> np.ndarray:
    """Binary rewards (float32 `[B]`) of ragged completions on `walls` (`[B, n, n]` or one
    grid). Total: never raises on any token content."""
    tokens, lengths = pad_completions(completions)
    return walk(walls, tokens, lengths)["reward"]


def path_cells(walls: np.ndarray, tokens: Sequence[int]) -> list[tuple[int, int]]:
    """Cells visited by a completion's walk (start first), up to the first failure, the goal
    or the first DONE — for drawing."""
    walls = np.asarray(walls, bool)
    size = walls.shape[0]
    (r, c), goal = start_goal(size)
    cells = [(r, c)]
    for t in (int(x) for x in tokens):
        if t not in MOVE_DELTAS or (r, c) == goal:
            break
        nr, nc = r + MOVE_DELTAS[t][0], c + MOVE_DELTAS[t][1]
        if not (0 <= nr < size and 0 <= nc < size) or walls[nr, nc]:
            break
        r, c = nr, nc
        cells.append((r, c))
    return cells


# --------------------------------------------------------------------------- splits


def _draw_distinct(size: int, seed: int, count: int, seen: set[str], max_tries: int,
                   generator: str, too_few: Callable[[int, int], str]) -> list[np.ndarray]:
    """`count` mazes of the stream `(seed, j)`, j = 0, 1, ..., skipping any whose `maze_hash`
    is in `seen` (updated in place) or already drawn; ValueError(`too_few(found, draws)`)
    after `max_tries` draws."""
    mazes: list[np.ndarray] = []
    j = 0
    while len(mazes) < count:
        if j >= max_tries:
            raise ValueError(too_few(len(mazes), j))
        walls = generate_maze(size, np.random.default_rng([int(seed), j]), generator)
        j += 1
        key = maze_hash(walls)
        if key not in seen:
            seen.add(key)
            mazes.append(walls)
    return mazes


def build_splits(size: int, sizes: dict[str, int], seed: int, max_tries_factor: int = 20,
                 generator: str = "prim") -> dict[str, np.ndarray]:
    """Disjoint splits of distinct mazes: `{name: bool [sizes[name], size, size]}`.

    Mazes are drawn from one seeded stream (maze j uses seed `(seed, j)`), deduplicated by
    `maze_hash`, and dealt to the splits in the order of `sizes` — so a split's contents and
    ids depend only on (generator, size, seed, the sizes of the splits before it and its
    own size).
    Raises ValueError when the maze space is too small for the request (5x5 has 4 mazes).
    """
    size = _check_size(size)
    _check_generator(generator)
    for name, n in sizes.items():
        if int(n) != n or n < 0:
            raise ValueError(f"sizes[{name!r}] must be a non-negative integer, got {n!r}")
    total = int(sum(sizes.values()))
    mazes = _draw_distinct(
        size, seed, total, set(), max_tries_factor * total + 100, generator,
        lambda found, j: f"sizes={sizes}: found only {found} distinct {size}x{size} mazes in "
                         f"{j} draws; ask for fewer mazes or a larger size")
    out, offset = {}, 0
    for name, n in sizes.items():
        block = mazes[offset : offset + int(n)]
        out[name] = np.stack(block) if block else np.zeros((0, size, size), bool)
        offset += int(n)
    return out


def build_sealed_split(size: int, num: int, seed: int, exclude: dict[str, np.ndarray],
                       max_tries_factor: int = 20, generator: str = "prim") -> np.ndarray:
    """A sealed split of `num` distinct mazes (bool `[num, size, size]`) disjoint in content
    from every maze of `exclude` (`{split: walls}`, the other splits).

    The mazes come from their own stream (maze j uses seed `(seed, j)`, `seed` other than the
    other splits' seed), deduplicated by `maze_hash` against `exclude` and each other, so the
    other splits are the same whatever `num` is and this split depends only on (generator,
    size, seed, num, the other splits' contents). ValueError when too few mazes are left.
    """
    size = _check_size(size)
    _check_generator(generator)
    seen = {maze_hash(w) for block in exclude.values() for w in block}
    mazes = _draw_distinct(
        size, seed, int(num), seen, max_tries_factor * int(num) + 100, generator,
        lambda found, j: f"num_test={num}: found only {found} {size}x{size} mazes outside the "
                         f"other splits in {j} draws; ask for fewer mazes or a larger size")
    return np.stack(mazes) if mazes else np.zeros((0, size, size), bool)


def _check_test(num_test: Any, test_seed: Any, seed: int) -> tuple[int, int | None]:
    """(num_test, test_seed) checked: an integer >= 0, and with num_test > 0 an integer seed
    other than `seed` (ValueError naming the argument otherwise)."""
    if isinstance(num_test, bool) or not isinstance(num_test, int | np.integer) or num_test < 0:
        raise ValueError(f"num_test must be an integer >= 0, got {num_test!r}")
    if test_seed is not None and (isinstance(test_seed, bool)
                                  or not isinstance(test_seed, int | np.integer)):
        raise ValueError(f"test_seed must be an integer (or None without a test split), got "
                         f"{test_seed!r}")
    if num_test > 0 and test_seed is None:
        raise ValueError(f"test_seed is required with num_test={num_test}: the sealed split's "
                         f"own stream (an integer other than seed={seed})")
    if num_test > 0 and int(test_seed) == int(seed):
        raise ValueError(f"test_seed={test_seed} equals seed={seed}: the sealed split needs its "
                         "own stream (another integer)")
    return int(num_test), None if test_seed is None else int(test_seed)


class MazeTask(RLTask):
    """Maze navigation with splits 'train' (RL prompts), 'eval' (held out), 'sft'
    (supervised shortest paths) and the optional sealed 'test' split (`num_test` mazes, empty
    by default); all are disjoint sets of distinct mazes.

    Prompt ids are `0..split_size-1`, stable for a given (generator, size, seed, split sizes).
    The test split has its own stream (`test_seed`, required when `num_test` > 0 and other
    than `seed`; `build_sealed_split`), so the other splits are identical bit for bit
    whatever `num_test` is.
    """

    SPLITS = ("train", "eval", "sft", "test")

    def __init__(self, size: int, num_train: int, num_eval: int, num_sft: int = 0, seed: int = 0,
                 max_new_tokens: int | None = None, generator: str = "prim",
                 num_test: int = 0, test_seed: int | None = None):
        self.size = _check_size(size)
        self.seed = int(seed)
        self.generator = _check_generator(generator)
        self.num_test, self.test_seed = _check_test(num_test, test_seed, self.seed)
        if max_new_tokens is None:
            max_new_tokens = max_answer_length(self.size)
        if int(max_new_tokens) != max_new_tokens or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
        self.pad_id = PAD
        # Stop at DONE as well as eos: the reward reads only the tokens before the first
        # DONE, so anything after it is wasted compute.
        self.stop_ids = (DONE, EOS)
        self.max_prompt_len = prompt_length(self.size)
        self.max_new_tokens = int(max_new_tokens)
        self.vocab_size = VOCAB_SIZE
        self._walls = build_splits(
            self.size, {"train": num_train, "eval": num_eval, "sft": num_sft}, self.seed,
            generator=self.generator)
        self._walls["test"] = build_sealed_split(
            self.size, self.num_test, 0 if self.test_seed is None else self.test_seed,
            dict(self._walls), generator=self.generator)
        self._paths: dict[str, list[np.ndarray]] = {}
        self._prompts = {s: np.stack([encode_prompt(w) for w in m]) if len(m) else
                         np.zeros((0, self.max_prompt_len), np.int32)
                         for s, m in self._walls.items()}

    # ---- RLTask
    def _split(self, split: str) -> str:
        if split not in self._walls:
            raise ValueError(f"split must be one of {self.SPLITS}, got {split!r}")
        return split

    def _ids(self, split: str, ids: Sequence[int]) -> np.ndarray:
        ids = np.asarray(ids, np.int64).reshape(-1)
        n = self.split_size(split)
        if ids.size and (ids.min() < 0 or ids.max() >= n):
            raise ValueError(f"ids must lie in [0, {n}) for split {split!r}, got min {ids.min()} "
                             f"max {ids.max()}")
        return ids

    def split_size(self, split: str) -> int:
        return int(self._walls[self._split(split)].shape[0])

    def prompt_tokens(self, split: str, ids: Sequence[int]) -> list[np.ndarray]:
        ids = self._ids(split, ids)
        return list(self._prompts[split][ids])

    def score(self, split: str, ids: Sequence[int], completions: Sequence[np.ndarray],
              truncated: np.ndarray) -> np.ndarray:
        """Spec verifier per completion; `truncated` is not consulted (the rule reads the
        tokens before the first DONE, and a truncated row without DONE already scores 0)."""
        ids = self._ids(split, ids)
        if len(completions) != ids.size:
            raise ValueError(f"completions has {len(completions)} rows, ids has {ids.size}")
        return verify(self._walls[split][ids], completions)

    def extract_answers(self, split: str, ids: Sequence[int], completions: Sequence[np.ndarray]
                        ) -> list[tuple[int, ...] | None]:
        """The move sequence before the first DONE (None without DONE): equal answers get
        equal rewards on the same maze, as majority voting (maj@n) requires."""
        del split, ids
        out: list[tuple[int, ...] | None] = []
        for comp in completions:
            comp = np.asarray(comp).reshape(-1)
            done = np.flatnonzero(comp == DONE)
            out.append(tuple(int(t) for t in comp[: done[0]]) if done.size else None)
        return out

    def decode(self, tokens: Sequence[int]) -> str:
        return decode(tokens)

    # ---- extras for SFT, evaluation and notebooks
    def walls(self, split: str, ids: Sequence[int] | None = None) -> np.ndarray:
        """Wall grids bool `[len(ids), n, n]` (all of the split when ids is None)."""
        m = self._walls[self._split(split)]
        return m if ids is None else m[self._ids(split, ids)]

    def solutions(self, split: str) -> list[np.ndarray]:
        """BFS shortest paths (move tokens) of every maze of the split (cached)."""
        if split not in self._paths:
            self._paths[split] = [shortest_path(w) for w in self.walls(split)]
        return self._paths[split]

    def sft_examples(
        self, split: str, ids: Sequence[int]
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """(prompt tokens, answer tokens = shortest path, DONE, eos) for each id."""
        ids = self._ids(split, ids)
        paths = self.solutions(split)
        return (list(self._prompts[split][ids]), [encode_answer(paths[i]) for i in ids])

    def describe(self) -> dict[str, Any]:
        return {"size": self.size, "generator": self.generator, "seed": self.seed,
                "max_new_tokens": self.max_new_tokens,
                "prompt_len": self.max_prompt_len,
                **{f"num_{s}": self.split_size(s) for s in self.SPLITS},
                "test_seed": self.test_seed}


def task_from_config(cfg: Any) -> MazeTask:
    """MazeTask from a config block with fields size, num_train, num_eval, num_sft, seed,
    max_new_tokens (None = the longest possible answer), generator ("prim" when absent) and
    the sealed split's num_test / test_seed (0 / None when absent): configs written before
    an option load unchanged."""
    return MazeTask(size=cfg.size, num_train=cfg.num_train, num_eval=cfg.num_eval,
                    num_sft=cfg.get("num_sft", 0), seed=cfg.get("seed", 0),
                    max_new_tokens=cfg.get("max_new_tokens", None),
                    generator=cfg.get("generator", "prim"),
                    num_test=cfg.get("num_test", 0), test_seed=cfg.get("test_seed", None))


# --------------------------------------------------------------------------- drawing


def render(walls: np.ndarray, tokens: Sequence[int] | None = None) -> str:
    """ASCII picture: '#' wall, '.' open, 'S' start, 'G' goal, '*' cells walked by `tokens`."""
    walls = np.asarray(walls, bool)
    chars = np.where(walls, "#", ".").astype("<U1")
    if tokens is not None:
        for rc in path_cells(walls, tokens)[1:]:
            chars[rc] = "*"
    start, goal = start_goal(walls.shape[0])
    chars[start], chars[goal] = "S", "G"
    return "\n".join("".join(row) for row in chars)


def draw(ax: Any, walls: np.ndarray, paths: Sequence[Sequence[int]] = (),
         rewards: Sequence[float] | None = None, title: str | None = None) -> Any:
    """Draw a maze on a matplotlib Axes with the walks of `paths` (move tokens) overlaid:
    green for successful walks, red for failed ones (when `rewards` is given)."""
    walls = np.asarray(walls, bool)
    ax.imshow(walls, cmap="Greys", interpolation="nearest")
    start, goal = start_goal(walls.shape[0])
    ax.scatter([start[1]], [start[0]], c="tab:blue", s=60, marker="o", zorder=3)
    ax.scatter([goal[1]], [goal[0]], c="tab:orange", s=80, marker="*", zorder=3)
    rng = np.random.default_rng(0)
    for i, toks in enumerate(paths):
        cells = np.asarray(path_cells(walls, toks), float)
        jitter = rng.uniform(-0.15, 0.15, size=2)  # separate overlapping walks
        ok = rewards is None or rewards[i] > 0
        ax.plot(cells[:, 1] + jitter[1], cells[:, 0] + jitter[0],
                color="tab:green" if ok else "tab:red", alpha=0.6, lw=1.5)
    ax.set_xticks([])
    ax.set_yticks([])
    if title:
        ax.set_title(title)
    return ax
