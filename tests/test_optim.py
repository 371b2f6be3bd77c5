"""`sera_jax.optim`: every optimiser the studies built before it gives the same updates and
state, bit for bit (the old chains are written out here as the reference)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from sera_jax import optim


def _params():
    k = jax.random.split(jax.random.key(0), 3)
    return {"kernel": jax.random.normal(k[0], (4, 3)), "bias": jax.random.normal(k[1], (3,)),
            "conv": {"w": jax.random.normal(k[2], (2, 2, 3)), "scale": jnp.ones((3,))}}


def _run(tx, steps=6):
    """(params, state) after `steps` updates with large random gradients (so clipping acts)."""
    params = _params()
    state = tx.init(params)
    for t in range(steps):
        grads = jax.tree.map(lambda x, i=t: 5.0 * jax.random.normal(
            jax.random.fold_in(jax.random.key(1), i), x.shape), params)
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)
    return params, state


def _same(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _kernels(params):
    return jax.tree.map(lambda x: x.ndim > 1, params)


@pytest.mark.parametrize("clip", [1.0, 0.0])
def test_rl_trainer_and_lab_adamw_constant(clip):
    # The old rl/trainer.make_optimizer and lab/train.make_optimizer.
    adamw = optax.adamw(3e-3, b1=0.9, b2=0.99, eps=1e-7, weight_decay=0.05)
    old = optax.chain(optax.clip_by_global_norm(clip), adamw) if clip > 0 else adamw
    new = optim.make_optimizer(optim.get_config(learning_rate=3e-3, b2=0.99, eps=1e-7,
                                                weight_decay=0.05, grad_clip=clip))
    _same(_run(old), _run(new))


@pytest.mark.parametrize("warmup", [0, 2])
def test_sft_adamw_cosine(warmup):
    # The old sft.make_optimizer (clip > 0, its only use).
    lr, steps = 5e-3, 8
    schedule = (optax.warmup_cosine_decay_schedule(0.0, lr, warmup, steps, 0.0) if warmup
                else optax.cosine_decay_schedule(lr, steps))
    old = optax.chain(optax.clip_by_global_norm(1.0),
                      optax.adamw(schedule, b1=0.9, b2=0.95, weight_decay=0.01))
    config = optim.get_config(learning_rate=lr, schedule="cosine", warmup_steps=warmup, b2=0.95)
    _same(_run(old), _run(optim.make_optimizer(config, num_steps=steps)))


@pytest.mark.parametrize("warmup", [0, 3])
def test_alignment_sgd_cosine_kernel_decay(warmup):
    # The old studies/alignment/train.make_optimizer.
    lr, steps = 0.1, 10
    schedule = (optax.warmup_cosine_decay_schedule(0.0, lr, warmup, steps) if warmup
                else optax.cosine_decay_schedule(lr, steps))
    old = optax.chain(optax.add_decayed_weights(1e-4, mask=_kernels),
                      optax.sgd(schedule, momentum=0.9))
    config = optim.get_config(name="sgd", learning_rate=lr, schedule="cosine",
                              warmup_steps=warmup, weight_decay=1e-4, momentum=0.9,
                              weight_decay_mask="kernels", grad_clip=0.0)
    _same(_run(old), _run(optim.make_optimizer(config, num_steps=steps)))


def test_kernel_mask_leaves_vectors_undecayed():
    # Zero gradients: only weight decay moves a parameter, and only the kernels decay.
    config = optim.get_config(name="sgd", learning_rate=0.5, weight_decay=0.1,
                              weight_decay_mask="kernels", grad_clip=0.0, momentum=0.0)
    tx = optim.make_optimizer(config)
    params = _params()
    updates, _ = tx.update(jax.tree.map(jnp.zeros_like, params), tx.init(params), params)
    assert np.all(np.asarray(updates["bias"]) == 0)
    np.testing.assert_allclose(updates["kernel"], -0.05 * params["kernel"], rtol=1e-6)


def test_equal_settings_return_the_same_object():
    a = optim.make_optimizer(optim.get_config(schedule="cosine"), num_steps=10)
    b = optim.make_optimizer(optim.get_config(schedule="cosine"), num_steps=10)
    c = optim.make_optimizer(optim.get_config(schedule="cosine"), num_steps=11)
    assert a is b and a is not c


def test_missing_fields_take_the_defaults():
    old_block = {"learning_rate": 1e-4, "b1": 0.9, "b2": 0.999, "eps": 1e-8,
                 "weight_decay": 0.01, "grad_clip": 1.0}
    assert optim.make_optimizer(old_block) is optim.make_optimizer(optim.get_config())


@pytest.mark.parametrize("overrides, num_steps, match", [
    (dict(name="adam"), None, r"optimizer\.name='adam'.*one of"),
    (dict(schedule="linear"), None, r"optimizer\.schedule"),
    (dict(learning_rate=float("inf")), None, r"optimizer\.learning_rate=inf"),
    (dict(b1=1.0), None, r"optimizer\.b1=1\.0"),
    (dict(eps=0.0), None, r"optimizer\.eps"),
    (dict(grad_clip=-1.0), None, r"optimizer\.grad_clip"),
    (dict(weight_decay_mask="biases"), None, r"optimizer\.weight_decay_mask"),
    (dict(warmup_steps=2), None, r"warmup_steps=2.*'cosine'"),
    (dict(schedule="cosine"), None, r"num_steps, which is None"),
    (dict(schedule="cosine", warmup_steps=5), 5, r"warmup_steps=5.*\[0, num_steps=5\)"),
])
def test_bad_values_raise_one_clear_error(overrides, num_steps, match):
    with pytest.raises(ValueError, match=match):
        optim.make_optimizer(optim.get_config(**overrides), num_steps)


def test_unknown_field_is_refused():
    with pytest.raises(ValueError, match="no field 'lr'"):
        optim.get_config(lr=0.1)
    with pytest.raises(ValueError, match="no field 'lr'"):
        optim.make_optimizer({"lr": 0.1})
