"""Maze task: generator, BFS, encoding, the verifier (fuzz + exhaustive) and splits."""

import hashlib
import itertools

import matplotlib
import ml_collections
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sera_jax.tasks import maze as M

matplotlib.use("Agg")


def reference_reward(walls, tokens) -> float:
    """The spec's rules written as plainly as possible (the oracle for the vectorised one)."""
    tokens = [int(t) for t in tokens]
    if M.DONE not in tokens:
        return 0.0
    n = walls.shape[0]
    r, c = 1, 1
    for t in tokens[: tokens.index(M.DONE)]:
        if t not in (M.UP, M.DOWN, M.LEFT, M.RIGHT):
            return 0.0
        dr, dc = {M.UP: (-1, 0), M.DOWN: (1, 0), M.LEFT: (0, -1), M.RIGHT: (0, 1)}[t]
        r, c = r + dr, c + dc
        if not (0 <= r < n and 0 <= c < n) or walls[r, c]:
            return 0.0
        if (r, c) == (n - 2, n - 2):
            return 1.0
    return 0.0


def assert_perfect(walls):
    n = walls.shape[0]
    odd = np.arange(1, n - 1, 2)
    assert walls[0].all() and walls[-1].all() and walls[:, 0].all() and walls[:, -1].all()
    assert not walls[np.ix_(odd, odd)].any(), "every odd cell is carved"
    even = np.arange(0, n, 2)
    assert walls[np.ix_(even, even)].all(), "even-even cells are pillars"
    cells = len(odd) ** 2
    openings = int((~walls).sum()) - cells  # carved walls between two cells
    assert openings == cells - 1, "a tree over the cells has cells-1 edges"
    dist = M.bfs_distances(walls, (1, 1))
    assert (dist[np.ix_(odd, odd)] >= 0).all(), "connected"


@pytest.mark.parametrize("size", [5, 7, 9, 17, 21])
def test_generator_is_a_perfect_maze(size):
    for seed in range(5):
        assert_perfect(M.generate_maze(size, seed))


def test_generator_deterministic_and_varied():
    a, b = M.generate_maze(17, 123), M.generate_maze(17, 123)
    np.testing.assert_array_equal(a, b)
    hashes = {M.maze_hash(M.generate_maze(17, s)) for s in range(20)}
    assert len(hashes) == 20


#: sha1 over the maze_hash of Prim's mazes of sizes 5, 9, 11, 17 and seeds 0-3, taken before
#: the generator option existed: the default generator is bit-identical to the original one.
PRIM_HASH = "e06d4a66950f15a6ef8eedbc56dd0f85c2d844e0"


def _hash_of_mazes(**kwargs) -> str:
    h = hashlib.sha1()
    for size in (5, 9, 11, 17):
        for seed in range(4):
            h.update(M.maze_hash(M.generate_maze(size, seed, **kwargs)).encode())
    return h.hexdigest()


def test_prim_is_unchanged_and_the_default():
    assert _hash_of_mazes() == PRIM_HASH
    assert _hash_of_mazes(generator="prim") == PRIM_HASH
    assert M.MazeTask(9, num_train=4, num_eval=2).generator == "prim"


@pytest.mark.parametrize("size", [5, 7, 9, 11, 17, 21])
def test_backtracker_is_a_perfect_maze(size):
    for seed in range(5):
        assert_perfect(M.generate_maze(size, seed, generator="backtracker"))


def test_backtracker_deterministic_varied_and_longer():
    a = M.generate_maze(17, 123, generator="backtracker")
    np.testing.assert_array_equal(a, M.generate_maze(17, 123, generator="backtracker"))
    rng_a, rng_b = np.random.default_rng(5), np.random.default_rng(5)
    np.testing.assert_array_equal(M.generate_maze(11, rng_a, "backtracker"),
                                  M.generate_maze(11, rng_b, "backtracker"))
    hashes = {M.maze_hash(M.generate_maze(17, s, generator="backtracker")) for s in range(20)}
    assert len(hashes) == 20
    assert _hash_of_mazes(generator="backtracker") != PRIM_HASH
    # Depth-first carving makes long corridors: start-to-goal paths are longer than Prim's.
    lengths = {g: np.mean([len(M.shortest_path(M.generate_maze(11, s, g))) for s in range(40)])
               for g in M.GENERATORS}
    assert lengths["backtracker"] > 1.5 * lengths["prim"]


def test_generator_in_the_task_and_its_config():
    kw = dict(num_train=6, num_eval=3, num_sft=4, seed=1, num_test=2, test_seed=5)
    prim = M.MazeTask(9, **kw)
    back = M.MazeTask(9, generator="backtracker", **kw)
    assert back.describe()["generator"] == "backtracker"
    assert prim.describe()["generator"] == "prim"
    for split in M.MazeTask.SPLITS:
        assert not np.array_equal(prim.walls(split), back.walls(split))
        for w in back.walls(split):
            assert_perfect(w)
    cfg = ml_collections.ConfigDict(dict(size=9, **kw))
    np.testing.assert_array_equal(M.task_from_config(cfg).walls("eval"), prim.walls("eval"))
    cfg.generator = "backtracker"
    np.testing.assert_array_equal(M.task_from_config(cfg).walls("eval"), back.walls("eval"))
    with pytest.raises(ValueError, match="generator"):
        M.MazeTask(9, generator="kruskal", **kw)
    with pytest.raises(ValueError, match="generator"):
        M.generate_maze(9, 0, generator="dfs")


@pytest.mark.parametrize("bad", [3, 4, 6, 16, 5.5, True, -7])
def test_bad_size_raises(bad):
    with pytest.raises(ValueError, match="size"):
        M.generate_maze(bad, 0)


def test_bfs_shortest_path():
    for seed in range(10):
        walls = M.generate_maze(11, seed)
        path = M.shortest_path(walls)
        dist = M.bfs_distances(walls, (1, 1))
        assert len(path) == dist[9, 9]
        cells = M.path_cells(walls, path)
        assert cells[-1] == (9, 9) and len(cells) == len(path) + 1
        assert len(set(cells)) == len(cells), "a shortest path never revisits a cell"
    blocked = np.ones((5, 5), bool)
    blocked[1, 1] = blocked[3, 3] = False
    with pytest.raises(ValueError, match="not reachable"):
        M.shortest_path(blocked)


def test_prompt_layout_and_length():
    assert M.prompt_length(17) == 310
    walls = M.generate_maze(17, 0)
    prompt = M.encode_prompt(walls)
    assert prompt.shape == (310,) and prompt.dtype == np.int32
    assert list(prompt[:2]) == [M.BOS, M.GRID_START]
    assert list(prompt[-2:]) == [M.GRID_END, M.PATH_START]
    grid = prompt[2:-2].reshape(17, 18)
    assert (grid[:, -1] == M.NEWLINE).all()
    assert grid[1, 1] == M.START and grid[15, 15] == M.GOAL
    cells = grid[:, :-1].copy()
    cells[1, 1] = cells[15, 15] = M.PATH
    np.testing.assert_array_equal(cells == M.WALL, walls)
    answer = M.encode_answer(M.shortest_path(walls))
    assert list(answer[-2:]) == [M.DONE, M.EOS] and len(answer) <= M.max_answer_length(17)
    assert M.max_answer_length(17) == 128 <= 180
    assert int(prompt.max()) < M.VOCAB_SIZE == 32


tokens_st = st.lists(st.integers(min_value=-3, max_value=40), max_size=40)
move_heavy_st = st.lists(
    st.sampled_from([M.UP, M.DOWN, M.LEFT, M.RIGHT, M.UP, M.DOWN, M.LEFT, M.RIGHT, M.DONE,
                     M.EOS, M.PAD, M.WALL, 99]), max_size=40)


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 50), seqs=st.lists(st.one_of(tokens_st, move_heavy_st),
                                              min_size=1, max_size=8))
def test_verifier_fuzz_matches_reference(seed, seqs):
    walls = M.generate_maze(7, seed)
    comps = [np.asarray(s, np.int64) for s in seqs]
    got = M.verify(walls, comps)
    assert got.dtype == np.float32 and set(np.unique(got)) <= {0.0, 1.0}
    np.testing.assert_array_equal(got, [reference_reward(walls, s) for s in seqs])


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 50), garbage=tokens_st)
def test_verifier_rules(seed, garbage):
    walls = M.generate_maze(9, seed)
    path = list(M.shortest_path(walls))
    done = [M.DONE]
    assert M.verify(walls, [np.asarray(path + done + garbage)])[0] == 1.0  # garbage after DONE
    assert M.verify(walls, [np.asarray(path + [M.EOS])])[0] == 0.0  # no DONE
    assert M.verify(walls, [np.asarray([], np.int64)])[0] == 0.0  # empty
    assert M.verify(walls, [np.asarray(done + path + done)])[0] == 0.0  # moves after DONE
    # Reaching the goal succeeds at once: whatever follows before DONE is not read.
    assert M.verify(walls, [np.asarray(path + [M.WALL, M.UP] + done)])[0] == 1.0
    # Stopping one move short fails; a non-move token on the way fails.
    assert M.verify(walls, [np.asarray(path[:-1] + done)])[0] == 0.0
    assert M.verify(walls, [np.asarray(path[:1] + [M.PATH] + path[1:] + done)])[0] == 0.0


def test_verifier_leaving_the_grid_fails():
    walls = np.ones((5, 5), bool)
    walls[1, 1:4] = walls[1:4, 3] = False
    walls[1, 0] = False  # an opening in the border: the only way out of the grid
    ok = [M.RIGHT, M.RIGHT, M.DOWN, M.DOWN, M.DONE]
    out = [M.LEFT, M.LEFT] + ok
    res = M.walk(walls, *M.pad_completions([np.asarray(ok), np.asarray(out)]))
    np.testing.assert_array_equal(res["reward"], [1.0, 0.0])
    assert res["failed"][1] and not res["failed"][0]


def test_exhaustive_small_mazes():
    """All 4 perfect 5x5 mazes x all move strings of length <= 6 + DONE agree with the
    oracle; every 7x7 shortest path succeeds and any one step into a wall fails."""
    splits = M.build_splits(5, {"all": 4}, seed=0)
    moves = [M.UP, M.DOWN, M.LEFT, M.RIGHT]
    seqs = [list(s) + [M.DONE] for n in range(7) for s in itertools.product(moves, repeat=n)]
    comps = [np.asarray(s) for s in seqs]
    for walls in splits["all"]:
        assert_perfect(walls)
        got = M.verify(walls, comps)
        np.testing.assert_array_equal(got, [reference_reward(walls, s) for s in seqs])
        # The shortest path (length 4 or 6 on 5x5 mazes) is among them and succeeds.
        assert got[seqs.index(list(M.shortest_path(walls)) + [M.DONE])] == 1.0
    for walls in M.build_splits(7, {"all": 40}, seed=1)["all"]:
        path = list(M.shortest_path(walls))
        assert M.verify(walls, [np.asarray(path + [M.DONE])])[0] == 1.0
        cells = M.path_cells(walls, path)
        bad = []
        for k, (r, c) in enumerate(cells[:-1]):
            for tok, (dr, dc) in M.MOVE_DELTAS.items():
                if walls[r + dr, c + dc]:
                    bad.append(path[:k] + [tok] + path[k:] + [M.DONE])
        assert bad and not M.verify(walls, [np.asarray(b) for b in bad]).any()


def test_splits_disjoint_distinct_and_stable():
    task = M.MazeTask(9, num_train=50, num_eval=20, num_sft=30, seed=3)
    hashes = {s: [M.maze_hash(w) for w in task.walls(s)] for s in task.SPLITS}
    all_hashes = sum(hashes.values(), [])
    assert len(set(all_hashes)) == len(all_hashes) == 100
    again = M.MazeTask(9, num_train=50, num_eval=20, num_sft=30, seed=3)
    for s in task.SPLITS:
        np.testing.assert_array_equal(task.walls(s), again.walls(s))
    # The train split does not depend on the later splits' sizes (stable ids).
    bigger = M.MazeTask(9, num_train=50, num_eval=40, seed=3)
    np.testing.assert_array_equal(bigger.walls("train"), task.walls("train"))
    np.testing.assert_array_equal(bigger.walls("eval")[:20], task.walls("eval"))
    with pytest.raises(ValueError, match="distinct 5x5"):
        M.MazeTask(5, num_train=4, num_eval=1)


def test_task_contract():
    task = M.MazeTask(7, num_train=8, num_eval=4, num_sft=6, seed=0)
    assert task.max_prompt_len == M.prompt_length(7) == 60
    assert task.pad_id == M.PAD and M.EOS in task.stop_ids and M.DONE in task.stop_ids
    ids = [3, 0, 3]
    prompts = task.prompt_tokens("train", ids)
    assert [len(p) for p in prompts] == [60] * 3
    _, answers = task.sft_examples("train", ids)
    comps = [a[:-1] for a in answers]  # generation stops at DONE
    np.testing.assert_array_equal(task.score("train", ids, comps, np.zeros(3, bool)), [1, 1, 1])
    # The same answers on other mazes are (here) wrong at least once.
    other = task.score("eval", [0, 1, 2], comps, np.zeros(3, bool))
    assert set(np.unique(other)) <= {0.0, 1.0}
    with pytest.raises(ValueError, match="ids must lie"):
        task.prompt_tokens("train", [8])
    with pytest.raises(ValueError, match="split must be"):
        task.split_size("dev")
    assert task.split_size("test") == 0  # no sealed test split unless num_test > 0
    assert task.decode([M.UP, M.DONE, 77]) == "UP DONE <id:77>"
    answers_ = task.extract_answers("train", ids, [np.asarray([M.UP, M.DONE, 5]),
                                                   np.asarray([M.UP]), comps[0]])
    assert answers_[0] == (M.UP,) and answers_[1] is None
    assert answers_[2] == tuple(int(t) for t in comps[0][:-1])


def test_render_and_draw():
    walls = M.generate_maze(9, 0)
    path = M.shortest_path(walls)
    text = M.render(walls, path)
    assert text.count("*") == len(path) - 1 and "S" in text and "G" in text
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    M.draw(ax, walls, [path, path[:2]], rewards=[1.0, 0.0], title="t")
    assert len(ax.lines) == 2
    plt.close(fig)


def test_sealed_test_split_is_disjoint_deterministic_and_leaves_the_others_unchanged():
    kw = dict(num_train=40, num_eval=20, num_sft=30, seed=3)
    plain = M.MazeTask(9, **kw)
    sealed = M.MazeTask(9, num_test=25, test_seed=11, **kw)
    # The other splits are the same bit for bit whatever num_test is.
    for s in ("train", "eval", "sft"):
        np.testing.assert_array_equal(sealed.walls(s), plain.walls(s))
        np.testing.assert_array_equal(sealed.prompt_tokens(s, range(3)),
                                      plain.prompt_tokens(s, range(3)))
    assert plain.split_size("test") == 0 and sealed.split_size("test") == 25
    # Disjoint by content hash from every maze of the other splits, and distinct.
    others = {M.maze_hash(w) for s in ("train", "eval", "sft") for w in sealed.walls(s)}
    test = [M.maze_hash(w) for w in sealed.walls("test")]
    assert len(set(test)) == 25 and not set(test) & others
    for w in sealed.walls("test"):
        assert_perfect(w)
    # Deterministic; its own stream: maze j is drawn from default_rng([test_seed, j]).
    again = M.MazeTask(9, num_test=25, test_seed=11, **kw)
    np.testing.assert_array_equal(again.walls("test"), sealed.walls("test"))
    first = M.generate_maze(9, np.random.default_rng([11, 0]))
    if M.maze_hash(first) not in others:
        np.testing.assert_array_equal(sealed.walls("test")[0], first)
    # A prefix of a larger sealed split (stable ids), another one for another seed.
    bigger = M.MazeTask(9, num_test=30, test_seed=11, **kw)
    np.testing.assert_array_equal(bigger.walls("test")[:25], sealed.walls("test"))
    other = M.MazeTask(9, num_test=25, test_seed=12, **kw)
    assert not np.array_equal(other.walls("test"), sealed.walls("test"))
    # It is a split like the others: prompts, scores, SFT answers, the description.
    _, answers = sealed.sft_examples("test", [0, 1])
    np.testing.assert_array_equal(
        sealed.score("test", [0, 1], [a[:-1] for a in answers], np.zeros(2, bool)), [1, 1])
    d = sealed.describe()
    assert (d["num_test"], d["test_seed"]) == (25, 11)
    assert plain.describe()["num_test"] == 0 and plain.describe()["test_seed"] is None
    # Content-disjoint even where the test stream meets mazes the other splits hold: every
    # 7x7 maze of the sealed split is outside the 120 of the others (192 exist).
    small = M.MazeTask(7, num_train=80, num_eval=20, num_sft=20, num_test=20, test_seed=1)
    held = {M.maze_hash(w) for s in ("train", "eval", "sft") for w in small.walls(s)}
    raw = [M.maze_hash(M.generate_maze(7, np.random.default_rng([1, j]))) for j in range(5)]
    assert any(h in held for h in raw)  # the stream does meet them: dedupe is exercised
    assert not held & {M.maze_hash(w) for w in small.walls("test")}


def test_sealed_test_split_config_and_bad_values():
    cfg = ml_collections.ConfigDict(dict(size=9, num_train=6, num_eval=3, num_sft=4, seed=1))
    assert M.task_from_config(cfg).split_size("test") == 0  # old configs load unchanged
    cfg.num_test, cfg.test_seed = 5, 7
    task = M.task_from_config(cfg)
    np.testing.assert_array_equal(
        task.walls("test"), M.MazeTask(9, 6, 3, 4, seed=1, num_test=5, test_seed=7).walls("test"))
    kw = dict(num_train=6, num_eval=3, seed=1)
    for bad, match in ((dict(num_test=-1, test_seed=7), "num_test must be an integer >= 0"),
                       (dict(num_test=2.5, test_seed=7), "num_test must be"),
                       (dict(num_test=True, test_seed=7), "num_test must be"),
                       (dict(num_test=3), "test_seed is required"),
                       (dict(num_test=3, test_seed=1), "test_seed=1 equals seed=1"),
                       (dict(num_test=3, test_seed="7"), "test_seed must be an integer")):
        with pytest.raises(ValueError, match=match):
            M.MazeTask(9, **kw, **bad)
    with pytest.raises(ValueError, match="num_test=5: found only"):
        M.MazeTask(5, num_train=2, num_eval=1, num_sft=1, num_test=5, test_seed=9)
