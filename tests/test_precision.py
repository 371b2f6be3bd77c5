"""Mixed precision as config options: bfloat16 compute, a bfloat16 KV cache, float32 master
weights and AdamW state, dtype names validated up front, overrides that take effect.

Tolerances (measured on a 2-layer maze policy with init std 0.1, logits of std ~0.85):
bfloat16 compute moves logits and token log-probs by <= 0.035 (asserted < 0.1); a bfloat16
KV cache under float32 compute moves the sampler's log-probs by <= 0.005 (asserted < 0.02).
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sera_jax import config_files, sampling
from sera_jax.models.configs import MAZE_POLICY, dtype_from_name
from sera_jax.models.decoder import Decoder, init_cache, positions_from_mask
from sera_jax.models.logprobs import shared_prefix_logprobs, token_logprobs
from sera_jax.rl import config as rl_config
from sera_jax.rl import trainer as trainer_lib
from sera_jax.sampling import SamplingConfig, cache_length, generate, generate_with_cache
from sera_jax.studies import common
from sera_jax.studies import paired as maze_study
from sera_jax.studies.paired import evaluation as paired_evaluation
from sera_jax.studies.paired.kinds import lm
from tests.rl.test_trainer import one_device_mesh, small_config
from tests.rl.toy import EmitTask, tiny_model
from tests.util import ROOT

#: The maze policy's architecture, narrowed for test speed; init std 0.1 gives logits with
#: a realistic spread (the default 0.02 makes a near-uniform policy that hides errors).
CFG = MAZE_POLICY.replace(hidden_size=64, intermediate_size=128, num_layers=2,
                          initializer_range=0.1)


def _models():
    f32 = Decoder(CFG, rngs=nnx.Rngs(0))
    bf16 = Decoder(CFG.replace(dtype=jnp.bfloat16), rngs=nnx.Rngs(0))
    nnx.update(bf16, nnx.state(f32))  # identical float32 parameters
    return f32, bf16


def _prompts(batch=4, width=20, seed=0):
    rng = np.random.default_rng(seed)
    tokens = jnp.asarray(rng.integers(3, CFG.vocab_size, (batch, width)), jnp.int32)
    mask = jnp.asarray(np.arange(width)[None] >= rng.integers(0, 6, (batch, 1)))  # left pads
    return tokens, mask


def test_bf16_compute_logits_and_token_logprobs_within_tolerance_of_float32():
    f32, bf16 = _models()
    tokens, mask = _prompts(batch=4, width=40)
    pos = positions_from_mask(mask)
    a, _ = f32(tokens, pos, attention_mask=mask)
    b, _ = bf16(tokens, pos, attention_mask=mask)
    assert b.dtype == jnp.float32  # logits are float32 whatever the compute dtype
    real = np.asarray(mask)
    assert np.abs(np.asarray(a - b))[real].max() < 0.1
    lp_a, lp_b = (np.asarray(token_logprobs(m, tokens, mask)) for m in (f32, bf16))
    assert lp_b.dtype == np.float32
    assert np.abs(lp_a - lp_b).max() < 0.1 and np.abs(lp_a - lp_b)[real].mean() < 0.02
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(nnx.state(bf16)))


def test_bf16_shared_prefix_logprobs_within_tolerance_of_float32():
    """bfloat16 compute through `shared_prefix_logprobs` (its cached completion block and
    the prompts' last-position decode attention) stays within the per-row bf16 tolerance
    of the float32 per-row log-probs (measured: max 0.034, mean 0.006; per-row bf16: 0.028,
    0.007)."""
    f32, bf16 = _models()
    prompts, pmask = _prompts(batch=3, width=20, seed=1)
    row_prompt = jnp.asarray([0, 0, 1, 2, 2, 1])
    completions, cmask = _prompts(batch=6, width=12, seed=2)
    cmask = jnp.asarray(np.arange(12)[None] < np.array([[12], [3], [7], [1], [12], [9]]))
    tokens = jnp.concatenate([prompts[row_prompt], completions], axis=1)
    mask = jnp.concatenate([pmask[row_prompt], cmask], axis=1)
    want = np.asarray(token_logprobs(f32, tokens, mask, start=20))
    got = np.asarray(nnx.jit(shared_prefix_logprobs)(bf16, prompts, pmask, row_prompt,
                                                     completions, cmask))
    real = np.asarray(cmask)
    assert got.dtype == np.float32 and not got[~real].any()
    assert np.abs(got - want).max() < 0.1 and np.abs(got - want)[real].mean() < 0.02


def test_bf16_kv_cache_sampling_matches_float32_cache():
    model, _ = _models()  # float32 compute: only the cache is rounded
    tokens, mask = _prompts()
    steps = 16
    greedy = SamplingConfig(max_new_tokens=steps, greedy=True)
    ref = generate(model, tokens, mask, None, greedy)
    out = generate(model, tokens, mask, None, SamplingConfig(
        max_new_tokens=steps, greedy=True, cache_dtype="bfloat16"))
    # Greedy tokens agree until the float32 run's top-2 logit margin gets small (a near tie
    # may flip under any rounding; the margin is measured with a float32 full forward).
    seq = jnp.concatenate([tokens, ref.tokens], axis=1)
    seq_mask = jnp.concatenate([mask, jnp.ones_like(ref.tokens, bool)], axis=1)
    logits, _ = model(seq, positions_from_mask(seq_mask), attention_mask=seq_mask)
    top2 = np.sort(np.asarray(logits[:, tokens.shape[1] - 1:-1]), axis=-1)[..., -2:]
    margin = top2[..., 1] - top2[..., 0]  # [B, steps]
    safe = np.cumprod(margin > 0.05, axis=1).astype(bool)  # prefix before the first near tie
    assert safe.sum() >= safe.size // 2, "the test needs confident greedy steps"
    np.testing.assert_array_equal(np.asarray(out.tokens)[safe], np.asarray(ref.tokens)[safe])
    assert np.abs(np.asarray(out.logprobs - ref.logprobs))[safe].max() < 0.02
    # Sampling at T = 1: the bf16-cache sampler's log-probs of its own tokens agree with a
    # float32 full forward over those tokens.
    sampled = generate(model, tokens, mask, jax.random.key(1), SamplingConfig(
        max_new_tokens=steps, cache_dtype="bfloat16"))
    seq = jnp.concatenate([tokens, sampled.tokens], axis=1)
    seq_mask = jnp.concatenate([mask, jnp.ones_like(sampled.tokens, bool)], axis=1)
    scored = np.asarray(token_logprobs(model, seq, seq_mask))[:, tokens.shape[1]:]
    assert np.abs(scored - np.asarray(sampled.logprobs)).max() < 0.02


def test_bf16_kv_cache_halves_cache_memory():
    """nbytes of the cache pytree the sampler returns (shapes only: `eval_shape` traces the
    sampler without compiling it)."""
    model, _ = _models()
    tokens, mask = _prompts()
    caches = {}
    for name in ("float32", "bfloat16"):
        config = SamplingConfig(max_new_tokens=8, cache_dtype=name)
        cache = init_cache(CFG, tokens.shape[0], cache_length(tokens.shape[1], config),
                           dtype_from_name(name))
        # (Prompts as arguments: traced, so the host-side value checks are skipped.)
        _, caches[name] = jax.eval_shape(lambda t, m, c=config, k=cache: generate_with_cache(
            model, t, m, jax.random.key(0), c, k), tokens, mask)
        # Without a caller's cache, the sampler allocates its own in the configured dtype.
        _, own = jax.eval_shape(lambda t, m, c=config: sampling._run(
            model, t, m, jax.random.key(0), c, None, None, None), tokens, mask)
        assert {str(x.dtype) for x in jax.tree.leaves((own.k, own.v))} == {name}

    def nbytes(tree):
        return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))

    kv = {n: nbytes((c.k, c.v)) for n, c in caches.items()}
    total = {n: nbytes(c) for n, c in caches.items()}
    assert {str(x.dtype) for x in jax.tree.leaves((caches["bfloat16"].k,
                                                   caches["bfloat16"].v))} == {"bfloat16"}
    assert kv["bfloat16"] * 2 == kv["float32"]
    rest = total["float32"] - kv["float32"]  # the valid mask and the index
    assert total["bfloat16"] == kv["float32"] // 2 + rest
    with pytest.raises(ValueError, match="cache_dtype is 'bfloat16'"):
        generate_with_cache(model, tokens, mask, jax.random.key(0), SamplingConfig(
            max_new_tokens=8, cache_dtype="bfloat16"), init_cache(CFG, tokens.shape[0], 27))
    with pytest.raises(ValueError, match="cache_dtype='bf16'"):
        SamplingConfig(max_new_tokens=8, cache_dtype="bf16")


def test_bf16_trainer_step_keeps_float32_params_and_adamw_state_and_is_finite():
    task = EmitTask({"train": 6, "eval": 2})
    config = small_config(**{"sampling.kv_cache_dtype": "bfloat16"})
    model = tiny_model(seed=3, dtype=jnp.bfloat16)
    trainer = trainer_lib.Trainer(config, task, model, one_device_mesh())
    assert trainer.sampling.cache_dtype == "bfloat16"
    state = trainer.init_state(model)
    before = jax.tree.map(np.asarray, state.params)
    state, metrics = trainer.step(state)
    floats = [x for x in jax.tree.leaves((state.params, state.opt_state))
              if jnp.issubdtype(x.dtype, jnp.floating)]
    assert floats and {str(x.dtype) for x in floats} == {"float32"}
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in floats)
    assert metrics["finite"] == 1.0 and np.isfinite(metrics["loss"])
    assert np.isfinite(metrics["grad_norm"]) and metrics["grad_norm"] > 0
    assert any(not np.array_equal(a, np.asarray(b)) for a, b in zip(
        jax.tree.leaves(before), jax.tree.leaves(state.params)))  # the update was applied


def _maze(name="tiny"):
    return config_files.get_config(os.path.join(ROOT, "configs", "maze", f"{name}.py"))


def _maze_validate(cfg):
    maze_study.validate(cfg, common.method_names(cfg.compare.methods, "compare.methods"), [0])


@pytest.mark.parametrize("field, value", [("model.dtype", "float16"),
                                          ("eval.kv_cache_dtype", "bf16"),
                                          ("rl.sampling.kv_cache_dtype", "fp8")])
def test_unknown_dtype_names_fail_with_one_clear_message(field, value):
    cfg = _maze()
    block, key = field.rsplit(".", 1)
    target = cfg
    for part in block.split("."):
        target = target[part]
    target[key] = value
    short = field.removeprefix("rl.")  # the trainer config names its own fields
    with pytest.raises(common.StudyError, match=rf"config\.{short}='{value}' is invalid; "
                                                r"allowed: .*bfloat16"):
        _maze_validate(cfg)
    if field.startswith("rl."):
        with pytest.raises(ValueError, match=rf"config\.{short}='{value}' is invalid"):
            rl_config.validate(maze_study.run_config(cfg, "uniform", 0))


def test_math_study_validates_dtype_names():
    cfg = config_files.get_config(os.path.join(ROOT, "configs", "math", "cpu.py"))
    maze_study.resolve(cfg, "all")
    for field, value in (("dtype", "bf16"), ("param_dtype", "half")):
        bad = config_files.get_config(os.path.join(ROOT, "configs", "math", "cpu.py"))
        bad.model[field] = value
        with pytest.raises(common.StudyError, match=rf"config\.model\.{field}='{value}'"):
            maze_study.resolve(bad, "all")
    cfg.eval.kv_cache_dtype = "bfloat16"
    assert lm.eval_sampling(cfg, type("T", (), dict(max_new_tokens=4, stop_ids=(), pad_id=0))
                            ).cache_dtype == "bfloat16"


def test_precision_overrides_take_effect_and_defaults_keep_fingerprints():
    cfg = _maze()
    default_model = maze_study.build_model(cfg)
    assert default_model.cfg.dtype == jnp.float32
    # At their defaults the new options are not in any fingerprint: runs started before they
    # existed resume, and their cached evaluations stay valid.
    fp = maze_study.rl_fingerprint(cfg, maze_study.run_config(cfg, "uniform", 0), 3)
    old_model = {k: v for k, v in cfg.model.to_dict().items()
                 if k not in ("dtype", "scan_layers")}
    assert fp["model"] == old_model
    assert "kv_cache_dtype" not in fp["eval"] and "kv_cache_dtype" not in fp["rl"]["sampling"]
    assert "async_checkpoint" not in fp["rl"] and "async_checkpoint" not in fp["sft"]

    cfg.model.dtype = "bfloat16"
    cfg.eval.kv_cache_dtype = "bfloat16"
    cfg.rl.sampling.kv_cache_dtype = "bfloat16"
    cfg.rl.async_checkpoint = True  # never changes results: never in a fingerprint
    _maze_validate(cfg)
    model = maze_study.build_model(cfg)
    assert model.cfg.dtype == jnp.bfloat16
    assert {str(x.dtype) for x in jax.tree.leaves(nnx.state(model))} == {"float32"}
    rl = maze_study.run_config(cfg, "uniform", 0)
    fp = maze_study.rl_fingerprint(cfg, rl, 3)
    assert fp["model"]["dtype"] == "bfloat16" and fp["eval"]["kv_cache_dtype"] == "bfloat16"
    assert fp["rl"]["sampling"]["kv_cache_dtype"] == "bfloat16"
    assert "async_checkpoint" not in fp["rl"]
    assert paired_evaluation._eval_fingerprint(cfg)["kv_cache_dtype"] == "bfloat16"
    task = maze_study.build_task(cfg)
    assert maze_study.eval_sampling(cfg, task).cache_dtype == "bfloat16"
    trainer = trainer_lib.Trainer(rl, task, model, one_device_mesh())
    assert trainer.sampling.cache_dtype == "bfloat16"


def test_scan_layers_option_takes_effect_and_is_validated():
    cfg = _maze()
    assert not maze_study.build_model(cfg).cfg.scan_layers
    cfg.model.scan_layers = True
    assert maze_study.build_model(cfg).cfg.scan_layers
    fp = maze_study.rl_fingerprint(cfg, maze_study.run_config(cfg, "uniform", 0), 3)
    assert fp["model"]["scan_layers"] is True  # not the default: a different run
    with pytest.raises(TypeError, match="scan_layers"):  # ml_collections keeps it a bool
        cfg.model.scan_layers = "yes"
    math_cfg = config_files.get_config(os.path.join(ROOT, "configs", "math", "cpu.py"))
    assert "scan_layers" not in maze_study.start_fingerprint(math_cfg)["model"]
    math_cfg.model.scan_layers = True
    assert maze_study.start_fingerprint(math_cfg)["model"]["scan_layers"] is True
