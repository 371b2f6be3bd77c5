"""Supervised fine-tuning: batch layout, loss on answer tokens only, learning, exact resume."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from sera_jax import loop, sft
from sera_jax import sharding as shd
from sera_jax.checkpoint import CheckpointError
from sera_jax.models.decoder import Decoder, DecoderConfig
from sera_jax.models.logprobs import token_logprobs
from sera_jax.records import read_jsonl
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
    for field, value in (("learning_rate", float("inf")), ("learning_rate", float("nan")),
                         ("learning_rate", -1.0), ("grad_clip", float("nan"))):
        with pytest.raises(ValueError, match=field):
            sft.validate(small_config(**{field: value}))


def program(task, config, seed=0, mesh=None):
    width = task.max_prompt_len + M.max_answer_length(5)
    return sft.SFTProgram(tiny_model(seed), config, examples_of(task), task.split_size("sft"),
                          width, M.PAD, mesh=mesh)


def test_training_lowers_the_loss(task, tmp_path):
    c = small_config(num_steps=12, learning_rate=2e-2, warmup_steps=2)
    result = sft.train(program(task, c), str(tmp_path))
    hist = read_jsonl(str(tmp_path / "train.jsonl"))
    assert [r["step"] for r in hist] == list(range(1, 13)) and result.step == 12
    assert hist[-1]["loss"] < 0.5 * hist[0]["loss"]


def test_resume_is_exact_and_sharded_equals_single_device(task, tmp_path):
    c = small_config(num_steps=4, checkpoint_every=2)
    mesh8 = shd.make_mesh((-1, 1, 1))
    assert shd.batch_divisor(mesh8) == 8
    full = program(task, c, mesh=mesh8)
    sft.train(full, str(tmp_path / "full"))
    # 4 steps, "crash" after 3, then the same command again.
    part = program(task, c, mesh=mesh8)
    assert sft.train(part, str(tmp_path / "part"), stop_after=3).step == 3
    # Resuming under another hyperparameter is refused, naming it -- including num_steps,
    # which sets the cosine schedule; logging and checkpoint cadence may change.
    for changed, match in ((small_config(num_steps=4, checkpoint_every=2, learning_rate=1e-3),
                            r"sft\.learning_rate: 0\.003 -> 0\.001"),
                           (small_config(num_steps=9, checkpoint_every=2),
                            r"sft\.num_steps: 4 -> 9")):
        with pytest.raises(CheckpointError, match=match):
            sft.train(program(task, changed, mesh=mesh8), str(tmp_path / "part"))
    resumed = program(task, small_config(num_steps=4, checkpoint_every=1, log_every=2), seed=1,
                      mesh=mesh8)
    result = sft.train(resumed, str(tmp_path / "part"))
    assert (result.resumed_from, result.step) == (2, 4)
    # Shardings survive the jitted step (parameters stay on the mesh's partition rules).
    emb = nnx.state(resumed.model)["embed"].get_value()
    assert emb.sharding.mesh.devices.size == 8
    for a, b in zip(jax.tree.leaves(nnx.state(full.model)),
                    jax.tree.leaves(nnx.state(resumed.model))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # One device gives the same parameters up to float reassociation.
    mesh1 = shd.make_mesh((1, 1, 1), devices=jax.devices()[:1])
    single = program(task, c, mesh=mesh1)
    sft.train(single, str(tmp_path / "single"))
    for a, b in zip(jax.tree.leaves(nnx.state(full.model)),
                    jax.tree.leaves(nnx.state(single.model))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=1e-4)
    # The saved final parameters load into a fresh model (under the fingerprint they had).
    fresh = tiny_model(7)
    assert sft.load_final_params(fresh, c, str(tmp_path / "full"), mesh8,
                                 fingerprint={"sft": c.to_dict()}) == 4
    for a, b in zip(jax.tree.leaves(nnx.state(full.model)), jax.tree.leaves(nnx.state(fresh))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(CheckpointError, match="sft.batch_size"):
        sft.load_final_params(tiny_model(7), c, str(tmp_path / "full"), mesh8,
                              fingerprint={"sft": small_config(batch_size=16).to_dict()})


def test_huge_learning_rate_stops_with_the_last_finite_checkpoint(task, tmp_path):
    """lr = 1e20: the run stops with NonFiniteError instead of training and checkpointing
    NaN; the checkpoint it names restores to finite parameters."""
    c = small_config(num_steps=6, checkpoint_every=1, learning_rate=1e20, warmup_steps=0,
                     max_checkpoints_to_keep=1)
    with pytest.raises(loop.NonFiniteError, match="was not applied|is not saved"):
        sft.train(program(task, c), str(tmp_path))
    fresh = tiny_model(7)
    step = sft.load_final_params(fresh, c, str(tmp_path))
    assert step >= 1 and all(bool(jnp.all(jnp.isfinite(x)))
                             for x in jax.tree.leaves(nnx.state(fresh)))
    assert [r["step"] for r in read_jsonl(str(tmp_path / "train.jsonl"))] == list(
        range(1, step + 1))
