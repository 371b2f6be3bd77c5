"""Supervised fine-tuning: batch layout, loss on answer tokens only, learning, exact resume."""

import jax
import ml_collections
import numpy as np
import pytest
from flax import nnx

from sera_jax import sft
from sera_jax import sharding as shd
from sera_jax.checkpoint import CheckpointError
from sera_jax.models.decoder import Decoder, DecoderConfig, token_logprobs
from sera_jax.tasks import maze as M

TINY = DecoderConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_layers=1,
                     num_heads=2, num_kv_heads=1, name="tiny")


def tiny_model(seed=0):
    return Decoder(TINY, rngs=nnx.Rngs(seed))


def small_config(**kw) -> ml_collections.ConfigDict:
    c = sft.get_config()
    c.num_steps, c.batch_size, c.log_every, c.checkpoint_every = 6, 8, 1, 3
    c.learning_rate, c.warmup_steps = 3e-3, 1
    c.update(kw)
    return c


@pytest.fixture(scope="module")
def task():
    return M.MazeTask(5, num_train=1, num_eval=1, num_sft=2, seed=0)


def examples_of(task):
    return lambda ids: task.sft_examples("sft", ids)


def test_make_batch_layout():
    b = sft.make_batch([np.array([1, 2, 3]), np.array([4])], [np.array([5, 6]), np.array([7])],
                       width=6, pad_id=0)
    np.testing.assert_array_equal(b["tokens"], [[1, 2, 3, 5, 6, 0], [4, 7, 0, 0, 0, 0]])
    np.testing.assert_array_equal(b["mask"], [[1, 1, 1, 1, 1, 0], [1, 1, 0, 0, 0, 0]])
    np.testing.assert_array_equal(b["loss_mask"], [[0, 0, 0, 1, 1, 0], [0, 1, 0, 0, 0, 0]])
    with pytest.raises(ValueError, match="exceed width"):
        sft.make_batch([np.arange(4)], [np.arange(3)], width=6, pad_id=0)
    with pytest.raises(ValueError, match="empty answer"):
        sft.make_batch([np.arange(4)], [np.arange(0)], width=6, pad_id=0)


def test_loss_is_answer_token_mean_and_ignores_padding():
    graphdef, state = nnx.split(tiny_model())
    loss_fn = jax.jit(lambda st, b: sft.sft_loss(nnx.merge(graphdef, st), b))
    rng = np.random.default_rng(0)
    # Rows of 9 tokens each, split differently into prompt and answer.
    prompts = [rng.integers(4, 17, n) for n in (5, 8, 3)]
    answers = [rng.integers(4, 17, n) for n in (4, 1, 6)]
    batch = sft.make_batch(prompts, answers, width=16, pad_id=0)
    loss = float(loss_fn(state, batch))
    # Reference: the unpadded rows; sum of the answer tokens' NLL / their number.
    seqs = np.stack([np.concatenate([p, a]) for p, a in zip(prompts, answers)]).astype(np.int32)
    lp = np.asarray(jax.jit(lambda st, t: token_logprobs(nnx.merge(graphdef, st), t,
                                                         t >= 0))(state, seqs))
    ref = -sum(lp[i, len(p):].sum() for i, p in enumerate(prompts)) / sum(map(len, answers))
    assert loss == pytest.approx(ref, rel=1e-5)
    # Garbage in the padding changes nothing; changing an answer token does.
    noisy = dict(batch, tokens=np.where(batch["mask"], batch["tokens"], 9))
    assert float(loss_fn(state, noisy)) == pytest.approx(loss, rel=1e-6)
    changed = {k: v.copy() for k, v in batch.items()}
    changed["tokens"][0, 5] = (changed["tokens"][0, 5] + 1 - 4) % 13 + 4
    assert float(loss_fn(state, changed)) != pytest.approx(loss, rel=1e-6)


def test_validate_names_the_field():
    with pytest.raises(ValueError, match="warmup_steps"):
        sft.validate(small_config(warmup_steps=6))
    with pytest.raises(ValueError, match="batch_size"):
        sft.validate(small_config(batch_size=0))


def test_training_lowers_the_loss(task):
    c = small_config(num_steps=12, learning_rate=2e-2, warmup_steps=2)
    width = task.max_prompt_len + M.max_answer_length(5)
    trainer = sft.SFTTrainer(tiny_model(), c, examples_of(task), task.split_size("sft"), width,
                             M.PAD)
    hist = trainer.train()
    assert hist[-1]["loss"] < 0.5 * hist[0]["loss"]
    assert trainer.step == 12


def test_resume_is_exact_and_sharded_equals_single_device(task, tmp_path):
    width = task.max_prompt_len + M.max_answer_length(5)
    c = small_config(num_steps=4, checkpoint_every=2)
    mesh8 = shd.make_mesh((-1, 1, 1))
    assert shd.batch_divisor(mesh8) == 8
    full = sft.SFTTrainer(tiny_model(), c, examples_of(task), 2, width, M.PAD, mesh=mesh8,
                          workdir=str(tmp_path / "full"))
    full.train()
    # Two processes' worth: 4 steps, "crash", then the same command again.
    part = sft.SFTTrainer(tiny_model(), c, examples_of(task), 2, width, M.PAD, mesh=mesh8,
                          workdir=str(tmp_path / "part"))
    part.train(stop_after=3)  # checkpoints at 2, and at 3 on the way out
    part.ckpt.close()
    # Resuming under another hyperparameter is refused, naming it; step counts may change.
    with pytest.raises(CheckpointError, match=r"learning_rate: 0.003 -> 0.001"):
        sft.SFTTrainer(tiny_model(), small_config(num_steps=4, checkpoint_every=2,
                                                  learning_rate=1e-3),
                       examples_of(task), 2, width, M.PAD, mesh=mesh8,
                       workdir=str(tmp_path / "part"))
    longer = sft.SFTTrainer(tiny_model(), small_config(num_steps=9, checkpoint_every=2),
                            examples_of(task), 2, width, M.PAD, mesh=mesh8,
                            workdir=str(tmp_path / "part"))
    assert longer.step == 3
    longer.ckpt.close()
    resumed = sft.SFTTrainer(tiny_model(1), c, examples_of(task), 2, width, M.PAD, mesh=mesh8,
                             workdir=str(tmp_path / "part"))
    assert resumed.step == 3
    resumed.train()
    # Shardings survive the jitted step (parameters stay on the mesh's partition rules).
    emb = nnx.state(resumed.model)["embed"].get_value()
    assert emb.sharding.mesh.devices.size == 8
    for a, b in zip(jax.tree.leaves(nnx.state(full.model)),
                    jax.tree.leaves(nnx.state(resumed.model))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # One device gives the same parameters up to float reassociation.
    mesh1 = shd.make_mesh((1, 1, 1), devices=jax.devices()[:1])
    single = sft.SFTTrainer(tiny_model(), c, examples_of(task), 2, width, M.PAD, mesh=mesh1)
    single.train()
    for a, b in zip(jax.tree.leaves(nnx.state(full.model)),
                    jax.tree.leaves(nnx.state(single.model))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=1e-4)
    # The saved final parameters load into a fresh model.
    fresh = tiny_model(7)
    assert sft.load_final_params(fresh, c, str(tmp_path / "full"), mesh8) == 4
    for a, b in zip(jax.tree.leaves(nnx.state(full.model)), jax.tree.leaves(nnx.state(fresh))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
