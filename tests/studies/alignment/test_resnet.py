"""sera_jax.studies.alignment.resnet: shapes, parameter counts, BatchNorm train/eval."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sera_jax.studies.alignment import resnet


def _num_params(cfg):
    abstract = nnx.eval_shape(lambda: resnet.ResNet(cfg, rngs=nnx.Rngs(0)))
    return sum(x.size for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))


def test_resnet50_has_the_canonical_parameter_count():
    assert _num_params(resnet.resnet50_config()) == 25_557_032  # torchvision resnet50


def test_batchnorm_train_updates_stats_eval_is_per_example():
    model = resnet.make_resnet(resnet.digits_resnet_config(width=4, stage_sizes=(1, 1)))
    g, params, stats = resnet.split_model(model)
    apply = jax.jit(lambda p, s, x, train: resnet.apply_model(g, p, s, x, train=train),
                    static_argnames="train")
    x = jax.random.normal(jax.random.key(0), (8, 8, 8, 1)) * 3 + 1
    logits, new_stats = apply(params, stats, x, train=True)
    assert logits.shape == (8, 10) and logits.dtype == jnp.float32
    moved = [not np.allclose(a, b) for a, b in zip(jax.tree.leaves(stats),
                                                   jax.tree.leaves(new_stats))]
    assert any(moved)  # running averages updated
    ev, same = apply(params, stats, x, train=False)
    for a, b in zip(jax.tree.leaves(stats), jax.tree.leaves(same)):
        np.testing.assert_array_equal(a, b)
    # Inference mode: an image's logits do not depend on the rest of the batch.
    ev2, _ = apply(params, stats, x[:3], train=False)
    np.testing.assert_allclose(ev[:3], ev2, rtol=1e-5, atol=1e-6)
    tr2, _ = apply(params, stats, x[:3], train=True)
    assert not np.allclose(logits[:3], tr2, atol=1e-4)  # batch statistics do


def test_imagenet_stem_shapes_and_bad_config():
    model = resnet.make_resnet(resnet.tiny_resnet_config(num_classes=7))
    out = nnx.jit(lambda m, x: m(x, train=False))(model, jnp.ones((2, 32, 32, 3)))
    assert out.shape == (2, 7)
    with pytest.raises(ValueError, match="block"):
        resnet.ResNetConfig(stage_sizes=(1,), block="dense")
    with pytest.raises(ValueError, match="stem"):
        resnet.ResNetConfig(stage_sizes=(1,), stem="big")
