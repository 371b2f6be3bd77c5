"""The RL trainer: one step equals a hand-assembled MaxRL/SERA update; data order; config."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from sera_jax import optim
from sera_jax import sharding as shd
from sera_jax.rl import config as config_lib
from sera_jax.rl import trainer as trainer_lib
from sera_jax.rl.evaluate import evaluate, majority_vote
from sera_jax.sampling import SamplingConfig
from tests.rl.toy import STOP, EmitTask, tiny_model


def small_config(**changes):
    c = config_lib.get_config()
    c.prompts_per_step = 4
    c.rollouts_per_prompt = 4
    c.allocation.n_min = 2
    c.allocation.n_max = 8
    c.micro_batch_size = 4
    c.optimizer.learning_rate = 1e-2
    c.optimizer.grad_clip = 0.5  # small enough to be active: the test covers clipping too
    c.log_every = 1
    for k, v in changes.items():
        target = c
        *path, last = k.split(".")
        for p in path:
            target = target[p]
        target[last] = v
    return c


def run_fingerprint(config):
    return config_lib.fingerprint(config, config_lib.method(config))


def one_device_mesh():
    return shd.make_mesh((1, 1, 1), devices=jax.devices()[:1])


def with_history(state, p_hat):
    """Give prompts 0..len(p_hat)-1 frozen estimates p_hat (so the allocation is uneven)."""
    h = state.history
    m = h.num_prompts
    ph = np.full(m, 0.5, np.float32)
    ph[: len(p_hat)] = p_hat
    seen = np.zeros(m, bool)
    seen[: len(p_hat)] = True
    h = h.replace(p_hat=jnp.asarray(ph), seen=jnp.asarray(seen))
    return state.replace(history=h)


def hand_loss(params, graphdef, task, rollouts, aggregation, n0, max_len):
    """−Σ_r c_r ℓ_r / normaliser, recomputed from the raw data by an independent path:
    each row is its *unpadded* prompt + completion, right-padded (the trainer left-pads),
    with explicit positions 0..len-1; MaxRL advantages per group and w_q = N0/N_q by hand."""
    model = nnx.merge(graphdef, params)
    r = rollouts
    num_p, rows = len(r.prompt_ids), len(r.rewards)
    rewards = r.rewards.astype(np.float64)
    adv = np.zeros_like(rewards)
    for q in range(num_p):
        sel = r.segment_ids == q
        if sel.any():
            mean = rewards[sel].mean()
            adv[sel] = (rewards[sel] - mean) / (mean + 1e-6)
    coef = n0 / r.counts[r.segment_ids] * adv
    width = task.max_prompt_len + task.max_new_tokens
    seqs = np.zeros((rows, width), np.int32)
    target = np.zeros((rows, width), bool)  # True where the token is a completion token
    for row in range(rows):
        prompt = task.prompt_tokens("train", [int(r.prompt_ids[r.segment_ids[row]])])[0]
        comp = r.completion_tokens[row, : r.lengths[row]]
        seqs[row, : len(prompt) + len(comp)] = np.concatenate([prompt, comp])
        target[row, len(prompt) : len(prompt) + len(comp)] = True
    positions = np.broadcast_to(np.arange(width), (rows, width))
    logits, _ = model(jnp.asarray(seqs), jnp.asarray(positions))
    lp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    lp = jnp.take_along_axis(lp, jnp.asarray(seqs[:, 1:, None]), axis=-1)[..., 0]
    ell = jnp.sum(jnp.where(target[:, 1:], lp, 0.0), axis=1)
    if aggregation == "sequence_mean":
        ell = ell / r.lengths
    total = jnp.sum(coef * ell)
    if aggregation == "token_mean":
        return -total / r.lengths.sum()
    if aggregation == "sequence_mean":
        return -total / (num_p * n0)
    return -total / (num_p * n0 * max_len)


def test_step_equals_hand_assembled_update():
    """allocate -> sample -> score -> MaxRL advantages -> w_q -> token-mean loss over 4
    micro-batches -> clip + AdamW equals the same update assembled by hand."""
    config = small_config()
    task = EmitTask()
    model = tiny_model(seed=1)
    trainer = trainer_lib.Trainer(config, task, model, one_device_mesh())
    state = trainer.init_state(model)
    # Prompt order of epoch 0 starts with the first 4 ids of the permutation; give every
    # prompt a distinct estimate so SERA allocates unevenly.
    p_hat = np.array([0.02, 0.2, 0.5, 0.9, 0.1, 0.3, 0.6, 0.8, 0.05, 0.4, 0.7, 0.95], np.float32)
    state = with_history(state, p_hat)
    params0 = jax.tree.map(np.array, state.params)

    new_state, metrics, r = trainer.step(state, return_rollouts=True)

    from sera_jax.allocation import allocate

    expected_alloc = allocate(jnp.asarray(p_hat[r.prompt_ids]), 16, n_min=2, n_max=8,
                              mode="dynamic", rounding="leximin", threshold=0.05)
    np.testing.assert_array_equal(r.counts, np.asarray(expected_alloc.counts))
    assert r.counts.sum() == 16 and len(set(r.counts.tolist())) > 1, r.counts
    np.testing.assert_array_equal(r.segment_ids, np.repeat(np.arange(4), r.counts))
    np.testing.assert_array_equal(r.rewards, task.score(
        "train", r.prompt_ids[r.segment_ids].tolist(),
        [r.completion_tokens[i, : r.lengths[i]] for i in range(16)], r.truncated))
    assert 0 < r.rewards.sum() < 16, "the toy policy must give mixed groups for a real test"
    # Completion tokens end with the stop token unless truncated; pads after it.
    for i in range(16):
        if not r.truncated[i]:
            assert r.completion_tokens[i, r.lengths[i] - 1] == STOP

    loss, grads = jax.value_and_grad(hand_loss)(
        params0, trainer.graphdef, task, r, "token_mean", 4, 3)
    np.testing.assert_allclose(metrics["loss"], float(loss), rtol=1e-5, atol=1e-7)
    _, trainer_grads = trainer.gradients(params0, trainer.device_batch(r))
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(trainer_grads)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-7)
    tx = optax.chain(optax.clip_by_global_norm(0.5),
                     optax.adamw(1e-2, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01))
    assert float(optax.global_norm(grads)) > 0.5, "clipping should be active in this test"
    updates, _ = tx.update(grads, tx.init(params0), params0)
    expected = optax.apply_updates(params0, updates)
    # Adam's first step is ~lr·sign(g): atol 1e-5 = lr/1000 still catches any wrong sign or
    # scale while tolerating coordinates whose |g| is near Adam's eps.
    for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(new_state.params)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=0, atol=1e-5)

    # Bookkeeping: one optimiser update, outcomes pending (p̂ frozen), data position moved.
    assert int(new_state.step) == 1 and int(new_state.cursor) == 4 and int(new_state.epoch) == 0
    successes = np.bincount(r.segment_ids, weights=r.rewards, minlength=4)
    np.testing.assert_allclose(
        np.asarray(new_state.history.pending_successes)[r.prompt_ids], successes)
    np.testing.assert_array_equal(np.asarray(new_state.history.p_hat), p_hat)
    for key in ("reward_mean", "mixed_fraction", "rollouts_min", "rollouts_max",
                "rollouts_std", "kappa_min", "kappa_mean", "tokens_per_s", "step_time"):
        assert np.isfinite(metrics[key]), key
    assert metrics["rollouts_min"] == r.counts.min() and metrics["rollouts_max"] == r.counts.max()


@pytest.mark.parametrize("aggregation", ["sequence_mean", "seq_mean_token_sum_norm"])
def test_gradients_other_aggregations(aggregation):
    """The micro-batched gradient of the other aggregations equals the hand-made one."""
    config = small_config(aggregation=aggregation, estimator="maxrl")
    task = EmitTask()
    model = tiny_model(seed=1)
    trainer = trainer_lib.Trainer(config, task, model, one_device_mesh())
    state = with_history(trainer.init_state(model), np.linspace(0.05, 0.95, 12))
    rollouts, _, _ = trainer.collect(state)
    loss, grads = trainer.gradients(state.params, trainer.device_batch(rollouts))
    hand, hand_grads = jax.value_and_grad(hand_loss)(
        state.params, trainer.graphdef, task, rollouts, aggregation, 4, 3)
    np.testing.assert_allclose(float(loss), float(hand), rtol=1e-5, atol=1e-7)
    for a, b in zip(jax.tree.leaves(hand_grads), jax.tree.leaves(grads)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-7)


def test_scanned_layers_gradients_equal_unrolled():
    """The trainer's accumulated gradient for a scan_layers policy (same seed: the same
    weights, stacked) equals the unrolled policy's on the same rollouts (the samplers'
    equality is tests/test_sampling.py's)."""
    config = small_config()
    task = EmitTask()
    # Any batch will do: the rollouts of the other tests' 1-layer policy (its sampler is
    # compiled already in a full run).
    sampler = trainer_lib.Trainer(config, task, tiny_model(seed=1), one_device_mesh())
    rollouts, _, _ = sampler.collect(
        with_history(sampler.init_state(tiny_model(seed=1)), np.linspace(0.05, 0.95, 12)))
    results = []
    for scan in (False, True):
        model = tiny_model(seed=1, num_layers=2, scan_layers=scan)
        trainer = trainer_lib.Trainer(config, task, model, one_device_mesh())
        state = trainer.init_state(model)
        loss, grads = trainer.gradients(state.params, trainer.device_batch(rollouts))
        flat = {path: np.asarray(v.get_value()) for path, v in nnx.to_flat_state(grads)}
        results.append((float(loss), flat))
    assert 0 < rollouts.rewards.sum() < len(rollouts.rewards)  # a non-zero policy gradient
    (loss_u, unrolled), (loss_s, scanned) = results
    np.testing.assert_allclose(loss_s, loss_u, rtol=1e-5, atol=1e-7)
    assert len(scanned) < len(unrolled)  # per-layer entries became stacked ones
    for path, x in scanned.items():
        if path[0] == "layers":  # ("layers", *rest) [L, ...] vs ("layers", i, *rest)
            want = np.stack([unrolled[("layers", i, *path[1:])] for i in range(2)])
        else:
            want = unrolled[path]
        np.testing.assert_allclose(x, want, rtol=1e-4, atol=1e-7, err_msg=str(path))


def test_pack_live_rows_fills_the_first_micro_batches():
    """Live rows (c_r != 0), in order, take micro-batch 0's strided positions, then 1's."""
    coef = np.array([0, 1.5, 0, 0, -2, 0, 0, 3], np.float32)  # live rows 1, 4, 7
    order = trainer_lib.pack_live_rows(coef, num_micro=4)  # 2 rows per micro-batch
    assert sorted(order.tolist()) == list(range(8))
    micro = [order[m::4].tolist() for m in range(4)]  # micro-batch m = positions i % 4 == m
    assert micro[0] == [1, 4] and micro[1][0] == 7
    assert all(coef[i] == 0 for i in micro[1][1:] + micro[2] + micro[3])


def test_skip_zero_advantage_same_gradient_fewer_micro_batches():
    """`skip_zero_advantage`: the packed batch gives the unpacked gradient and loss; the
    train step loops over the micro-batches holding a live row only (a dynamic trip count
    in the compiled program), and an all-zero batch gives loss 0, gradient 0."""
    task = EmitTask()
    model = tiny_model(seed=1)
    plain = trainer_lib.Trainer(small_config(micro_batch_size=2), task, model,
                                one_device_mesh())
    state = with_history(plain.init_state(model), np.linspace(0.05, 0.95, 12))
    r, _, _ = plain.collect(state)
    live = r.advantages * r.weights != 0
    assert 0 < live.sum() < len(live) - 2, "the test needs live and zero rows"
    packed = trainer_lib.Trainer(small_config(micro_batch_size=2, skip_zero_advantage=True),
                                 task, model, one_device_mesh())
    loss_a, grads_a = plain.gradients(state.params, plain.device_batch(r))
    loss_b, grads_b = packed.gradients(state.params, packed.device_batch(r))
    np.testing.assert_allclose(float(loss_b), float(loss_a), rtol=1e-5, atol=1e-7)
    for a, b in zip(jax.tree.leaves(grads_a), jax.tree.leaves(grads_b)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-7)
    assert packed.trained_micro_batches(r) == -(-int(live.sum()) // 2)
    assert packed.trained_micro_batches(r) < plain.trained_micro_batches(r) <= 8
    hlo = packed.gradients.lower(state.params, packed.device_batch(r)).as_text()
    assert "stablehlo.while" in hlo  # the loop over the live micro-batches

    dead = dataclasses.replace(r, advantages=np.zeros_like(r.advantages))
    whole = trainer_lib.Trainer(small_config(micro_batch_size=0), task, model,
                                one_device_mesh())  # one micro-batch: a conditional
    for trainer in (packed, whole):
        loss0, grads0 = trainer.gradients(state.params, trainer.device_batch(dead))
        assert float(loss0) == 0
        assert all(not np.asarray(g).any() for g in jax.tree.leaves(grads0))
        assert trainer.trained_micro_batches(dead) == 0
    loss_c, grads_c = whole.gradients(state.params, whole.device_batch(r))
    np.testing.assert_allclose(float(loss_c), float(loss_a), rtol=1e-5, atol=1e-7)
    for a, c in zip(jax.tree.leaves(grads_a), jax.tree.leaves(grads_c)):
        np.testing.assert_allclose(np.asarray(c), np.asarray(a), rtol=1e-4, atol=1e-7)

    # Both options stay out of fingerprints at their defaults (earlier runs keep theirs).
    fp = run_fingerprint(small_config())
    assert "skip_zero_advantage" not in fp and "train_length_bucket" not in fp
    fp = run_fingerprint(small_config(skip_zero_advantage=True, train_length_bucket=8))
    assert fp["skip_zero_advantage"] is True and fp["train_length_bucket"] == 8


def test_prefix_layout_contiguous_micro_batches_and_slots():
    """`prefix_layout`: contiguous row blocks (live rows first with `pack`), each block's
    distinct prompts in S = a power of two of slots, every row pointing at its prompt."""
    seg = np.repeat(np.arange(5), [3, 1, 4, 2, 6])  # 16 rows of 5 prompts
    live = np.isin(seg, [1, 3])
    order, slots, row_slot = trainer_lib.prefix_layout(seg, live, 4, False, 4)
    assert order.tolist() == list(range(16)) and slots.shape == (4, 2)  # at most 2 per block
    for m in range(4):
        np.testing.assert_array_equal(slots[m][row_slot[m]], seg[order[4 * m:4 * m + 4]])
    order, slots, row_slot = trainer_lib.prefix_layout(seg, live, 4, True, 4)
    assert set(order[:3]) == {3, 8, 9}  # the live rows (prompts 1 and 3) fill block 0
    for m in range(4):
        np.testing.assert_array_equal(slots[m][row_slot[m]], seg[order[4 * m:4 * m + 4]])
    _, slots, _ = trainer_lib.prefix_layout(np.arange(8), np.ones(8, bool), 8, False, 8)
    assert slots.shape == (1, 8)
    # Blocks without a live row are never computed: their many n_min-row prompts do not
    # set S (cut to S, rows past it clipped to the last slot).
    seg = np.repeat(np.arange(10), [8] + [2] * 8 + [8])
    order, slots, row_slot = trainer_lib.prefix_layout(seg, seg == 0, 8, False, 8)
    assert slots.shape == (4, 1) and (slots[0] == 0).all()
    assert row_slot.min() == 0 and row_slot.max() == 0


@pytest.mark.parametrize("packed", [False, True])
def test_share_prompt_prefix_same_loss_and_gradient(packed):
    """`share_prompt_prefix`: each prompt's forward once per micro-batch, completions against
    its cache, gives the per-row forward's loss and gradient (uneven SERA counts, so prompts
    straddle micro-batches), skips the same kind of dead micro-batches, and a whole step
    trains like the per-row trainer."""
    task = EmitTask()
    model = tiny_model(seed=1)
    plain = trainer_lib.Trainer(small_config(), task, model, one_device_mesh())
    shared = trainer_lib.Trainer(small_config(share_prompt_prefix=True,
                                              skip_zero_advantage=packed),
                                 task, model, one_device_mesh())
    state = with_history(plain.init_state(model), np.linspace(0.05, 0.95, 12))
    r, _, _ = plain.collect(state)
    assert len(set(r.counts.tolist())) > 1, "the test needs an uneven allocation"
    batch = shared.device_batch(r)
    assert batch.completion_tokens.shape[:2] == (4, 4) and batch.prompt_tokens.shape[1] < 4
    loss_a, grads_a = plain.gradients(state.params, plain.device_batch(r))
    loss_b, grads_b = shared.gradients(state.params, batch)
    assert float(loss_a) != 0
    np.testing.assert_allclose(float(loss_b), float(loss_a), rtol=1e-5, atol=1e-7)
    for a, b in zip(jax.tree.leaves(grads_a), jax.tree.leaves(grads_b)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-6)
    live = r.live.reshape(4, 4)
    want = (-(-int(live.sum()) // 4) if packed else int(live.any(axis=1).sum()))
    assert shared.trained_micro_batches(r) == want

    s_plain, _ = plain.step(jax.tree.map(jnp.copy, state))  # steps donate their state
    s_shared, m_shared = shared.step(jax.tree.map(jnp.copy, state))
    assert m_shared["trained_micro_batches"] == want
    for a, b in zip(jax.tree.leaves(s_plain.params), jax.tree.leaves(s_shared.params)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-5)
    fp = run_fingerprint(small_config())
    assert "share_prompt_prefix" not in fp
    assert run_fingerprint(small_config(share_prompt_prefix=True))["share_prompt_prefix"]


def test_train_length_bucket_cuts_padding_only():
    """`train_length_bucket`: the train step sees the longest completion rounded up to the
    bucket (never past max_new_tokens), and the loss and gradient are those of the full width."""
    task = EmitTask()
    model = tiny_model(seed=1)
    full = trainer_lib.Trainer(small_config(), task, model, one_device_mesh())
    cut = trainer_lib.Trainer(small_config(train_length_bucket=2), task, model,
                              one_device_mesh())
    state = with_history(full.init_state(model), np.linspace(0.05, 0.95, 12))
    r, _, _ = full.collect(state)
    tokens = r.completion_tokens.copy()
    tokens[:, 1:] = task.pad_id
    short = dataclasses.replace(r, lengths=np.minimum(r.lengths, 1), completion_tokens=tokens)
    assert full.train_width(short) == task.max_new_tokens and cut.train_width(short) == 2
    assert cut.train_width(r) == min(task.max_new_tokens, -(-int(r.lengths.max()) // 2) * 2)
    assert cut.device_batch(short).completion_tokens.shape[1] == 2
    loss_a, grads_a = full.gradients(state.params, full.device_batch(short))
    loss_b, grads_b = cut.gradients(state.params, cut.device_batch(short))
    assert float(loss_a) != 0
    np.testing.assert_allclose(float(loss_b), float(loss_a), rtol=1e-5, atol=1e-7)
    for a, b in zip(jax.tree.leaves(grads_a), jax.tree.leaves(grads_b)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-7)
    with pytest.raises(ValueError, match="train_length_bucket"):
        config_lib.validate(small_config(train_length_bucket=-1))


def test_data_order_epochs_and_history():
    """Each epoch visits every prompt once in a (seed, epoch)-fixed order; a batch that
    crosses the boundary starts an epoch (history folds pending outcomes in)."""
    n, batch = 10, 4
    seen, epoch, cursor, starts = [], 0, 0, 0
    for _ in range(5):  # 20 prompts = 2 epochs
        ids, epoch, cursor, started = trainer_lib.next_prompt_ids(0, n, batch, epoch, cursor)
        seen.extend(ids.tolist())
        starts += started
    assert sorted(seen[:10]) == list(range(10)) and sorted(seen[10:]) == list(range(10))
    assert seen[:10] != seen[10:]  # a fresh permutation each epoch
    assert (epoch, cursor, starts) == (1, 10, 1)
    np.testing.assert_array_equal(trainer_lib.epoch_permutation(3, 2, 10),
                                  trainer_lib.epoch_permutation(3, 2, 10))
    with pytest.raises(ValueError, match="prompts_per_step"):
        trainer_lib.next_prompt_ids(0, 3, 4, 0, 0)


def test_training_raises_reward_and_history_updates_per_epoch():
    """A few SERA steps on the toy task raise the reward (the loss has the right sign);
    the history's estimate moves only at epoch starts."""
    config = small_config(**{"optimizer.learning_rate": 3e-2, "optimizer.grad_clip": 1.0})
    task = EmitTask({"train": 4, "eval": 4})  # P = 4: every step is a new epoch
    model = tiny_model(seed=1)
    trainer = trainer_lib.Trainer(config, task, model, one_device_mesh())
    state = trainer.init_state(model)
    rewards = []
    for i in range(12):
        state, metrics = trainer.step(state)
        rewards.append(metrics["reward_mean"])
        if i == 0:
            assert metrics["kappa_min"] is None  # first epoch: no estimates, κ undefined
            assert not bool(jnp.any(state.history.seen))
    assert bool(jnp.all(state.history.seen))
    assert np.mean(rewards[-3:]) > np.mean(rewards[:3]) + 0.2, rewards


def test_config_validation_names_the_field():
    for field, value, match in [
        ("allocation.n_min", 9, "n_min"),
        ("estimator", "nope", "estimator"),
        ("method", "serra", "did you mean 'sera'"),
        ("optimizer.learning_rate", float("inf"), "optimizer.learning_rate"),
        ("optimizer.learning_rate", float("nan"), "optimizer.learning_rate"),
        ("optimizer.learning_rate", -1e-3, "optimizer.learning_rate"),
        ("optimizer.eps", 0.0, "optimizer.eps"),
        ("history.gamma", float("nan"), "history.gamma"),
        ("aggregation", "sum", "aggregation"),
        ("micro_batch_size", 5, "micro_batch_size"),
        ("allocation.name", "nope", "allocation.name"),
        ("sampling.top_p", 0.0, "sampling.top_p"),
        ("allocation.unseen", "ignore", "allocation.unseen"),
        ("optimizer.schedule", "cosine", "optimizer.schedule='cosine' is invalid"),
        ("optimizer.name", "adam", "optimizer.name"),
        ("method", "sera_dynamic", "'sera_dynamic' was renamed 'sera'"),
    ]:
        with pytest.raises(ValueError, match=match):
            config_lib.validate(small_config(**{field: value}))
    config_lib.validate(small_config())
    with pytest.raises(ValueError, match="batch shards"):
        mesh = shd.make_mesh((8, 1, 1))
        trainer_lib.Trainer(small_config(micro_batch_size=4), EmitTask(), tiny_model(), mesh)


def test_an_sgd_optimizer_block_trains_through_optax():
    """Any `sera_jax.optim` block the trainer accepts trains; AdamW on a constant schedule
    takes the fused step, anything else optax's update (here SGD: p' = p - lr (g + wd p))."""
    config = small_config(**{"optimizer.name": "sgd", "optimizer.momentum": 0.0,
                             "optimizer.grad_clip": 0.0, "optimizer.weight_decay": 0.0})
    assert not trainer_lib.fuses_adamw(config) and trainer_lib.fuses_adamw(small_config())
    model = tiny_model()
    trainer = trainer_lib.Trainer(config, EmitTask(), model, one_device_mesh())
    state = with_history(trainer.init_state(model), [0.1, 0.5, 0.9, 0.3])
    before = jax.tree.map(np.asarray, state.params)
    rollouts, _, _ = trainer.collect(state)
    _, grads = trainer.gradients(state.params, trainer.device_batch(rollouts))
    state, metrics = trainer.step(state)
    assert metrics["finite"] == 1.0
    lr = config.optimizer.learning_rate
    for b, g, a in zip(jax.tree.leaves(before), jax.tree.leaves(grads),
                       jax.tree.leaves(state.params)):
        np.testing.assert_allclose(np.asarray(a), b - lr * np.asarray(g), rtol=1e-5, atol=1e-7)


def test_evaluate_pass_at_k_and_majority(tmp_path):
    """Greedy decoding: every sample of a prompt is identical, so pass@k = pass@1 ∈ {0,1}
    per prompt and maj@n agrees; sampled results do not depend on the chunk size."""
    task = EmitTask()
    model = tiny_model(seed=1)
    greedy = SamplingConfig(max_new_tokens=3, greedy=True, stop_ids=(STOP,), pad_id=0)
    res = evaluate(model, task, "eval", num_samples=4, sampling=greedy,
                   key=jax.random.key(0), batch_size=6)
    assert set(res.summary) >= {"pass@1", "pass@2", "pass@4", "maj@4"}
    assert set(res.num_correct.tolist()) <= {0, 4}
    assert res.summary["pass@1"] == res.summary["pass@4"] == res.summary["maj@4"]

    sampled = SamplingConfig(max_new_tokens=3, temperature=1.0, stop_ids=(STOP,), pad_id=0)
    kw = dict(num_samples=8, sampling=sampled, key=jax.random.key(1))
    a = evaluate(model, task, "train", batch_size=16, **kw)
    b = evaluate(model, task, "train", batch_size=40, **kw)
    np.testing.assert_array_equal(a.num_correct, b.num_correct)
    assert a.summary["pass@1"] <= a.summary["pass@4"] <= a.summary["pass@8"]
    summary_csv, prompts_csv = a.write_csv(tmp_path)
    assert "pass@8" in open(summary_csv).read()
    assert len(open(prompts_csv).read().splitlines()) == 1 + task.split_size("train")


def test_majority_vote():
    assert majority_vote([1, 2, 2, None], np.array([1.0, 0.0, 0.0, 0.0])) == 0.0
    assert majority_vote([1, 2, 1, 2], np.array([1.0, 0.0, 1.0, 0.0])) == 1.0  # tie: first
    assert majority_vote([None, None], np.array([1.0, 1.0])) == 0.0



@pytest.mark.parametrize("grad_clip", [0.5, 0.0])
def test_fused_adamw_step_equals_optax_clip_and_adamw(grad_clip):
    """`fused_adamw_step` gives the values of `optim.make_optimizer`'s optax chain (update +
    apply_updates) over several steps up to float rounding, the clip active or off, in the
    same state pytree; `apply = False` leaves parameters and state exactly untouched, also
    for NaN gradients."""
    config = small_config(**{"optimizer.grad_clip": grad_clip,
                             "optimizer.weight_decay": 0.1})
    tx = optim.make_optimizer(config.optimizer)
    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.normal(size=(5, 3)), jnp.float32),
              "b": jnp.asarray(rng.normal(size=(3,)), jnp.float32)}
    ref_p, ref_s = params, tx.init(params)
    p, s = params, tx.init(params)
    step = jax.jit(lambda p, s, g, a: trainer_lib.fused_adamw_step(config, p, s, g, a))
    for _ in range(3):
        grads = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape) * 3, x.dtype), p)
        updates, ref_s = tx.update(grads, ref_s, ref_p)
        ref_p = optax.apply_updates(ref_p, updates)
        p, s = step(p, s, grads, jnp.bool_(True))
        assert jax.tree.structure(s) == jax.tree.structure(ref_s)
        for a, b in zip(jax.tree.leaves((p, s)), jax.tree.leaves((ref_p, ref_s))):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-6, atol=1e-7)
    assert not np.allclose(np.asarray(p["w"]), np.asarray(params["w"]))
    grads = jax.tree.map(lambda g: g.at[0].set(jnp.nan), grads)
    kept_p, kept_s = step(p, s, grads, jnp.bool_(False))
    for a, b in zip(jax.tree.leaves((kept_p, kept_s)), jax.tree.leaves((p, s))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_evaluate_samples_every_chunk_with_one_prompt_shape(monkeypatch):
    """`evaluate`'s chunks, the short last one included, all prefill
    `evaluate.prompt_slots` prompts: one compiled sampler per evaluation."""
    from sera_jax import sampling
    from sera_jax.rl import evaluate as eval_lib

    shapes, real = [], sampling.generate

    def spy(model, toks, *args, **kwargs):
        shapes.append(toks.shape[0])
        return real(model, toks, *args, **kwargs)

    monkeypatch.setattr(sampling, "generate", spy)
    task = EmitTask()
    cfg = SamplingConfig(max_new_tokens=3, temperature=1.0, stop_ids=(STOP,), pad_id=0)
    evaluate(tiny_model(seed=1), task, "train", num_samples=3, sampling=cfg,
             key=jax.random.key(0), batch_size=7)
    total = task.split_size("train") * 3
    assert len(shapes) == -(-total // 7) > 1
    assert set(shapes) == {eval_lib.prompt_slots(task.split_size("train"), 7, 3)}, shapes
