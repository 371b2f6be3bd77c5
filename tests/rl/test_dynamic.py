"""DAPO dynamic sampling in the LM trainer (`sera_jax.rl.dynamic`): rounds, packing, history,
metrics, resume, and equality with the plain step when round 0 fills the batch."""

from __future__ import annotations

import ast
import inspect

import jax
import numpy as np
import pytest

from sera_jax import dynamic_sampling as ds
from sera_jax.records import read_jsonl
from sera_jax.rl import config as config_lib
from sera_jax.rl import dynamic
from sera_jax.rl import trainer as trainer_lib
from sera_jax.rl.data import epoch_permutation, next_prompt_ids
from tests.rl.test_trainer import hand_loss, one_device_mesh, small_config, with_history
from tests.rl.toy import EmitTask, tiny_model
from tests.test_loop import _leaves_equal, rl_run

#: Epoch 0's prompt order of the 12 toy prompts (seed 0): round r draws PERM[4r:4r+4].
PERM = epoch_permutation(0, 0, 12)


class PlantedTask(EmitTask):
    """Rewards planted per prompt id: `fail` ids all 0, `succeed` ids all 1, every other
    prompt 1 on its first row of the call and 0 on the rest (an informative group)."""

    def __init__(self, fail=(), succeed=()):
        super().__init__()
        self.fail, self.succeed = {int(i) for i in fail}, {int(i) for i in succeed}

    def score(self, split, ids, completions, truncated):
        seen, out = set(), []
        for i in ids:
            out.append(float(i in self.succeed or (i not in self.fail and i not in seen)))
            seen.add(i)
        return np.asarray(out, np.float32)


def trainer_for(method, task, **changes):
    model = tiny_model(seed=1)
    trainer = trainer_lib.Trainer(small_config(method=method, **changes), task, model,
                                  one_device_mesh())
    return trainer, trainer.init_state(model)


def test_all_informative_dapo_step_is_the_uniform_step():
    """When round 0's groups are all informative the batch is full after one round, and the
    dapo step (sampling key, batch, update, history, data position) is the uniform one."""
    task = PlantedTask()
    uniform, s_u = trainer_for("uniform", task)
    dapo, s_d = trainer_for("dapo", task)
    s_u, m_u, r_u = uniform.step(s_u, return_rollouts=True)
    s_d, m_d, r_d = dapo.step(s_d, return_rollouts=True)
    assert isinstance(r_d, dynamic.DynamicRollouts) and r_d.selection.rounds == 1
    for field in ("prompt_ids", "counts", "segment_ids", "completion_tokens", "lengths",
                  "rewards", "advantages", "weights"):
        np.testing.assert_array_equal(getattr(r_d, field), getattr(r_u, field), err_msg=field)
    _leaves_equal(s_d, s_u)  # params, AdamW state, history, key, step, epoch, cursor
    for key, value in m_u.items():
        if not key.endswith(("_time", "tokens_per_s")):
            assert m_d[key] == value, key
    assert (m_d["dapo_rounds"], m_d["dapo_kept_groups"], m_d["dapo_padding_rows"]) == (1, 4, 0)
    assert m_d["generated_rollouts"] == m_u["generated_rollouts"] == 16


def test_planted_all_equal_groups_are_packed_as_select_does():
    """Two rounds (max_rounds = 2) with planted all-fail / all-success groups: the packed
    batch is `dynamic_sampling.select` of the two rounds (weight-0, zero-length padding
    rows), the data position and the history hold both rounds, the metrics count both."""
    task = PlantedTask(fail=PERM[:3], succeed=PERM[5:7])  # kept: PERM[3], PERM[4], PERM[7]
    trainer, state = trainer_for("dapo", task, max_rounds=2)
    new_state, metrics, r = trainer.step(state, return_rollouts=True)

    # The rounds, rebuilt independently: the next 4 prompts of the epoch order each round.
    rounds, epoch, cursor = [], 0, 0
    for i in range(2):
        ids, epoch, cursor, _ = next_prompt_ids(0, 12, 4, epoch, cursor)
        seg = np.repeat(np.arange(4), 4)
        lengths = r.generated.lengths[16 * i:16 * (i + 1)]
        rounds.append(ds.Round(seg, task.score("train", ids[seg].tolist(), [], []), lengths, 4))
    want = ds.select(rounds, 16)
    assert (want.num_kept, want.padding_rows, want.rounds) == (3, 4, 2)
    np.testing.assert_array_equal(r.selection.rows, want.rows)
    np.testing.assert_array_equal(r.selection.keep, want.keep)
    np.testing.assert_array_equal(r.segment_ids, want.group)
    np.testing.assert_array_equal(r.prompt_ids, [PERM[3], PERM[4], PERM[7]])
    np.testing.assert_array_equal(r.counts, [4, 4, 4])
    g = r.generated
    keep = want.keep
    np.testing.assert_array_equal(r.completion_tokens[keep], g.completion_tokens[want.rows][keep])
    np.testing.assert_array_equal(r.advantages[keep], g.advantages[want.rows][keep])
    assert np.all(r.advantages[keep] * r.weights[keep] != 0)  # kept groups are all live
    assert not r.weights[~keep].any() and not r.advantages[~keep].any()
    assert not r.lengths[~keep].any() and not r.rewards[~keep].any()
    np.testing.assert_array_equal(r.prompt_tokens[~keep], r.prompt_tokens[keep][-4:])

    assert (int(new_state.epoch), int(new_state.cursor)) == (0, 8)
    assert metrics["generated_rollouts"] == 32 and metrics["generated_tokens"] == g.lengths.sum()
    assert (metrics["dapo_rounds"], metrics["dapo_kept_groups"],
            metrics["dapo_padding_rows"]) == (2, 3, 4)
    assert metrics["mixed_fraction"] == 3 / 8 and metrics["live_row_fraction"] == 12 / 16
    # The history got every generated group, kept or not (pending until the epoch ends).
    h = new_state.history
    trials = np.asarray(h.pending_successes) + np.asarray(h.pending_failures)
    np.testing.assert_array_equal(trials[PERM[:8]], 4)
    np.testing.assert_array_equal(trials[PERM[8:]], 0)
    succ = np.asarray(h.pending_successes)[PERM[:8]]
    np.testing.assert_array_equal(succ, [0, 0, 0, 1, 1, 4, 4, 1])

    # No informative group at all: every row is padding, one listed group with count 0.
    nothing, s0 = trainer_for("dapo", PlantedTask(fail=range(12)), max_rounds=2)
    r0, _, _ = nothing.collect(s0)
    assert r0.selection.num_kept == 0 and r0.counts.tolist() == [0]
    assert not r0.weights.any() and not r0.lengths.any() and r0.segment_ids.max() == 0
    assert dynamic.metrics(nothing, r0)["dapo_padding_rows"] == 16


def test_sera_dapo_packs_more_groups_than_prompts_and_trains_them_exactly():
    """SERA's counts (8, 3, 3, 2) with the 8-rollout prompt all-fail: two rounds give six
    kept groups in 16 rows (K > P). The packed batch's loss is the hand-made MaxRL one (N0/N_q
    weights of each group's own plan), and the shared-prefix, packed train step (the maze
    study's options) gives the per-row one's loss and gradient."""
    p_hat = np.full(12, 0.5, np.float32)
    p_hat[PERM[[0, 4, 8]]] = 0.02  # SERA gives these 8 rollouts each
    task = PlantedTask(fail=PERM[[0, 4, 8]])
    plain, state = trainer_for("sera_dapo", task)
    state = with_history(state, p_hat)
    r, _, _ = plain.collect(state)
    assert r.selection.rounds == 2 and r.selection.padding_rows == 0
    np.testing.assert_array_equal(r.prompt_ids, np.r_[PERM[1:4], PERM[5:8]])
    np.testing.assert_array_equal(r.counts, [3, 3, 2, 3, 3, 2])
    np.testing.assert_allclose(r.weights, (4 / r.counts)[r.segment_ids])
    loss, grads = plain.gradients(state.params, plain.device_batch(r))
    hand = hand_loss(state.params, plain.graphdef, task, r, "token_mean", 4, 3)
    np.testing.assert_allclose(float(loss), float(hand), rtol=1e-5, atol=1e-7)
    shared = trainer_lib.Trainer(
        small_config(method="sera_dapo", share_prompt_prefix=True, skip_zero_advantage=True),
        task, tiny_model(seed=1), one_device_mesh())
    loss_s, grads_s = shared.gradients(state.params, shared.device_batch(r))
    np.testing.assert_allclose(float(loss_s), float(loss), rtol=1e-5, atol=1e-7)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_s)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-6)


def test_dapo_resume_reproduces_the_uninterrupted_run(tmp_path):
    """4 dapo steps == 2 steps, 'crash' after 3, resume to 4: rounds cross epoch ends (6
    prompts, P = 4), and the data position and history restored from the checkpoint give
    the same rounds again."""
    task = EmitTask({"train": 6, "eval": 2})
    config = small_config(method="dapo", num_steps=4, checkpoint_every=2, max_rounds=3)
    full = rl_run(config, task, tiny_model(seed=3), tmp_path / "full")
    rl_run(config, task, tiny_model(seed=3), tmp_path / "resumed", stop_after=3)
    resumed = rl_run(config, task, tiny_model(seed=99), tmp_path / "resumed")
    assert resumed.resumed_from == 2
    _leaves_equal(full.state, resumed.state)
    a = read_jsonl(str(tmp_path / "full" / "train.jsonl"))
    b = read_jsonl(str(tmp_path / "resumed" / "train.jsonl"))
    for x, y in zip(a, b):
        for key in ("loss", "reward_mean", "generated_rollouts", "dapo_rounds",
                    "dapo_kept_groups", "dapo_padding_rows"):
            assert x[key] == y[key], key
    rounds = sum(x["dapo_rounds"] for x in a)
    assert rounds > 4, "the toy policy should need refills"
    # Every generated prompt moved the data position: 4 prompts a round.
    assert 6 * int(full.state.epoch) + int(full.state.cursor) == 4 * rounds
    assert sum(x["generated_rollouts"] for x in a) == 16 * rounds


def test_config_max_rounds_fingerprint_and_acceptance():
    """dapo / sera_dapo validate; `max_rounds` is checked, in the fingerprint of the
    dynamic-sampling methods only (other runs keep their fingerprints)."""
    for name in ("dapo", "sera_dapo"):
        assert config_lib.validate(small_config(method=name)).dynamic_sampling
    with pytest.raises(ValueError, match="max_rounds=0 is invalid"):
        config_lib.validate(small_config(method="dapo", max_rounds=0))
    fp = lambda **c: config_lib.fingerprint(small_config(**c),  # noqa: E731
                                            config_lib.method(small_config(**c)))
    assert "max_rounds" not in fp(method="uniform")
    assert fp(method="uniform") == fp(method="uniform", max_rounds=2)
    assert fp(method="dapo")["max_rounds"] == 4 and fp(method="dapo")["dynamic_sampling"]
    assert fp(method="dapo", max_rounds=2)["max_rounds"] == 2
    key = jax.random.key(0)
    assert dynamic.round_key(key, 0) is key
    assert dynamic.min_group(config_lib.method(small_config(method="dapo")), 4, 2) == 4
    assert dynamic.min_group(config_lib.method(small_config(method="sera_dapo")), 4, 3) == 3


def test_dynamic_reads_the_trainer_through_its_interface_only():
    """`rl.dynamic` never imports `rl.trainer` (the trainer imports it, one way): it reads
    its trainer through `RoundTrainer`, every member of which a `Trainer` has."""
    tree = ast.parse(inspect.getsource(dynamic))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in imported if m and m.startswith("sera_jax.rl.trainer")}
    protocol = dynamic.RoundTrainer
    members = set(protocol.__annotations__) | {
        name for name, value in vars(protocol).items()
        if inspect.isfunction(value) and not name.startswith("__")}
    assert {"config", "collect_round", "rollout_metrics", "train_width"} <= members
    trainer, _ = trainer_for("dapo", PlantedTask())
    assert not [name for name in sorted(members) if not hasattr(trainer, name)]
