"""ResNets in Flax NNX: ResNet-50 for ImageNet, a tiny one for tests, a small one for digits.

BatchNorm is explicit about its mode: `model(x, train=True)` normalises with the batch's
statistics and updates the running averages (`nnx.BatchStat`); `train=False` uses the
running averages and changes no state. Passing the flag per call (instead of flipping a
module attribute) keeps one graph definition for both modes, so a functional caller can
`nnx.split` once and `nnx.merge` under `jax.jit` with either mode.

Logits are returned in float32 (float64 for a float64 model, the alignment study's CE
training: nothing in its step rounds to float32) whatever the compute dtype: the one-step-RL
study takes softmax probabilities down to 1e-300 from them (in float64 on the host).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

# He-normal on fan_out, as torchvision / big_vision ResNets: keeps activations O(1) at init.
_conv_init = nnx.initializers.variance_scaling(2.0, "fan_out", "normal")


@dataclasses.dataclass(frozen=True)
class ResNetConfig:
    """Shape of a ResNet.

    stage_sizes: blocks per stage; stage i has `width * 2**i` channels (x4 for bottleneck
      outputs) and stride 2 from the second stage on.
    block: "basic" (two 3x3 convs) or "bottleneck" (1x1, 3x3, 1x1 with 4x expansion).
    stem: "imagenet" (7x7/2 conv + 3x3/2 max-pool, for 224x224 input) or "small"
      (one 3x3/1 conv, for tiny images such as 8x8 digits).
    """

    stage_sizes: tuple[int, ...]
    block: str = "bottleneck"
    width: int = 64
    num_classes: int = 1000
    stem: str = "imagenet"
    in_channels: int = 3
    bn_momentum: float = 0.9
    bn_epsilon: float = 1e-5
    dtype: str = "float32"  # compute dtype; parameters stay float32

    def __post_init__(self):
        if self.block not in ("basic", "bottleneck"):
            raise ValueError(f"block={self.block!r}; allowed 'basic' or 'bottleneck'")
        if self.stem not in ("imagenet", "small"):
            raise ValueError(f"stem={self.stem!r}; allowed 'imagenet' or 'small'")
        if not self.stage_sizes or min(self.stage_sizes) < 1:
            raise ValueError(f"stage_sizes={self.stage_sizes}; need >= 1 stage of >= 1 block")
        if self.num_classes < 2:
            raise ValueError(f"num_classes={self.num_classes}; need >= 2")


def resnet50_config(num_classes: int = 1000) -> ResNetConfig:
    """ResNet-50 (He et al. 2016, v1.5: stride on the 3x3 conv), ~25.6M parameters."""
    return ResNetConfig(stage_sizes=(3, 4, 6, 3), block="bottleneck", width=64,
                        num_classes=num_classes, stem="imagenet")


def tiny_resnet_config(num_classes: int = 1000) -> ResNetConfig:
    """ImageNet-shaped (224x224 stem) but tiny: for end-to-end tests of the paper config."""
    return ResNetConfig(stage_sizes=(1, 1), block="basic", width=8, num_classes=num_classes,
                        stem="imagenet")


def digits_resnet_config(num_classes: int = 10, width: int = 16,
                         stage_sizes: Sequence[int] = (1, 1, 1)) -> ResNetConfig:
    """A small ResNet for 8x8x1 digits: 3x3 stem, basic blocks at 8x8, 4x4, 2x2."""
    return ResNetConfig(stage_sizes=tuple(stage_sizes), block="basic", width=width,
                        num_classes=num_classes, stem="small", in_channels=1)


CONFIGS = {
    "resnet50": resnet50_config,
    "tiny_resnet": tiny_resnet_config,
    "digits_resnet": digits_resnet_config,
}


class _Bn(nnx.BatchNorm):
    """BatchNorm whose mode must be given at every call (no silent default)."""

    def __call__(self, x, *, train: bool):  # type: ignore[override]
        return super().__call__(x, use_running_average=not train)


class _Block(nnx.Module):
    def __init__(self, cfg: ResNetConfig, in_ch: int, width: int, stride: int, *,
                 rngs: nnx.Rngs):
        dt = jnp.dtype(cfg.dtype)
        conv = lambda i, o, k, s: nnx.Conv(i, o, (k, k), strides=(s, s), padding="SAME",
                                           use_bias=False, kernel_init=_conv_init, dtype=dt,
                                           rngs=rngs)
        bn = lambda c, zero=False: _Bn(
            c, momentum=cfg.bn_momentum, epsilon=cfg.bn_epsilon, dtype=dt, rngs=rngs,
            # Zero-init the last BN scale of each residual branch: every block starts as the
            # identity, which makes deep ResNets train well from the first step.
            scale_init=nnx.initializers.zeros if zero else nnx.initializers.ones)
        self.bottleneck = cfg.block == "bottleneck"
        out_ch = width * 4 if self.bottleneck else width
        if self.bottleneck:
            self.convs = nnx.List([conv(in_ch, width, 1, 1), conv(width, width, 3, stride),
                                   conv(width, out_ch, 1, 1)])
            self.bns = nnx.List([bn(width), bn(width), bn(out_ch, zero=True)])
        else:
            self.convs = nnx.List([conv(in_ch, width, 3, stride), conv(width, out_ch, 3, 1)])
            self.bns = nnx.List([bn(width), bn(out_ch, zero=True)])
        if stride != 1 or in_ch != out_ch:
            self.proj = conv(in_ch, out_ch, 1, stride)
            self.proj_bn = bn(out_ch)
        else:
            self.proj = None
            self.proj_bn = None
        self.out_ch = out_ch

    def __call__(self, x, *, train: bool):
        h = x
        n = len(self.convs)
        for i, (c, b) in enumerate(zip(self.convs, self.bns)):
            h = b(c(h), train=train)
            if i < n - 1:
                h = nnx.relu(h)
        if self.proj is not None:
            x = self.proj_bn(self.proj(x), train=train)
        return nnx.relu(h + x)


class ResNet(nnx.Module):
    """`logits = model(images, train=...)`: images float `[B, H, W, C]` (NHWC), logits
    float32 `[B, num_classes]` (float64 for a float64 model)."""

    def __init__(self, cfg: ResNetConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        dt = jnp.dtype(cfg.dtype)
        k = 7 if cfg.stem == "imagenet" else 3
        s = 2 if cfg.stem == "imagenet" else 1
        self.stem = nnx.Conv(cfg.in_channels, cfg.width, (k, k), strides=(s, s), padding="SAME",
                             use_bias=False, kernel_init=_conv_init, dtype=dt, rngs=rngs)
        self.stem_bn = _Bn(cfg.width, momentum=cfg.bn_momentum, epsilon=cfg.bn_epsilon, dtype=dt,
                           rngs=rngs)
        blocks = []
        in_ch = cfg.width
        for i, n in enumerate(cfg.stage_sizes):
            for j in range(n):
                stride = 2 if (i > 0 and j == 0) else 1
                blk = _Block(cfg, in_ch, cfg.width * 2**i, stride, rngs=rngs)
                in_ch = blk.out_ch
                blocks.append(blk)
        self.blocks = nnx.List(blocks)
        self.head = nnx.Linear(in_ch, cfg.num_classes, dtype=dt, rngs=rngs)

    def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
        x = x.astype(jnp.dtype(self.cfg.dtype))
        x = nnx.relu(self.stem_bn(self.stem(x), train=train))
        if self.cfg.stem == "imagenet":
            x = nnx.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
        for blk in self.blocks:
            x = blk(x, train=train)
        x = jnp.mean(x, axis=(1, 2))
        return self.head(x).astype(jnp.promote_types(x.dtype, jnp.float32))


def make_resnet(cfg: ResNetConfig, seed: int = 0) -> ResNet:
    """Build a ResNet with parameters initialised from `seed`."""
    return ResNet(cfg, rngs=nnx.Rngs(seed))


def split_model(model: nnx.Module) -> tuple[nnx.GraphDef, nnx.State, nnx.State]:
    """`(graphdef, params, batch_stats)`: the functional view of an NNX model.

    Everything that is not an `nnx.Param` (BatchNorm running averages) lands in the third
    state, so gradients are taken with respect to `params` only.
    """
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    return graphdef, params, rest


def apply_model(graphdef: nnx.GraphDef, params: nnx.State, batch_stats: nnx.State,
                images: jax.Array, *, train: bool) -> tuple[jax.Array, nnx.State]:
    """Pure forward pass: `(logits, new_batch_stats)`.

    train=True normalises with the batch's statistics (over the *global* batch, also when it
    is sharded across devices: the mean is a jnp reduction that GSPMD all-reduces) and
    returns the updated running averages; train=False returns `batch_stats` unchanged.
    """
    # copy=True: fresh Variables in the current trace, so BatchNorm may update them under
    # jax.grad / jax.vjp (the states passed in belong to an outer trace).
    model = nnx.merge(graphdef, params, batch_stats, copy=True)
    logits = model(images, train=train)
    return logits, nnx.state(model, nnx.Not(nnx.Param))
