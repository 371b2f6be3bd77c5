"""Resuming refuses a checkpoint written under another experiment, naming the fields."""

import pytest

from sera_jax import loop
from sera_jax.checkpoint import CheckpointError
from sera_jax.rl import config as config_lib
from sera_jax.rl.trainer import RESUMABLE


def fingerprint(config):
    return {"task": {"seed": 0}, "rl": config.to_dict()}


def test_same_config_and_longer_run_resume():
    config = config_lib.get_config()
    stored = loop.canonical(fingerprint(config))
    loop.check_fingerprint(stored, fingerprint(config), RESUMABLE, "/ckpt")
    config.num_steps = config.num_steps * 2  # extending a run is what resuming is for
    config.log_every = 7
    loop.check_fingerprint(stored, fingerprint(config), RESUMABLE, "/ckpt")


def test_changed_hyperparameters_are_named():
    config = config_lib.get_config()
    stored = loop.canonical(fingerprint(config))
    config.optimizer.learning_rate = config.optimizer.learning_rate * 10
    config.allocation.name = "uniform"
    current = {**fingerprint(config), "task": {"seed": 1}}
    with pytest.raises(CheckpointError) as err:
        loop.check_fingerprint(stored, current, RESUMABLE, "/ckpt")
    message = str(err.value)
    assert "rl.optimizer.learning_rate" in message and "rl.allocation.name" in message
    assert "task.seed: 0 -> 1" in message
    assert "/ckpt" in message and "new workdir" in message


def test_a_checkpoint_without_fingerprint_is_refused():
    with pytest.raises(CheckpointError, match="no experiment fingerprint"):
        loop.check_fingerprint(None, {"rl": {}}, RESUMABLE, "/ckpt")


def _old_fingerprint(config, name):
    """The run fingerprint before the method was passed as a `Method`: the resolved method
    written into a copy of the config (the former `rl_config.with_method`), then trimmed."""
    import ml_collections

    c = ml_collections.ConfigDict(config.to_dict())
    c.method = name
    m = config_lib.method(c)
    c.allocation.name = m.allocator
    for key in ("mode", "rounding", "threshold"):
        c.allocation[key] = m.options.get(key, c.allocation[key])
    c.allocation.multiplicity = m.multiplicity
    c.estimator = m.estimator
    d = c.to_dict()
    for k in ("name", "schedule", "warmup_steps", "momentum", "weight_decay_mask"):
        del d["optimizer"][k]  # the optimiser block before `sera_jax.optim`
    return loop.trim_fields(d, config_lib.FINGERPRINT_OMIT, {
        k: v for k, v in config_lib.FINGERPRINT_DEFAULTS.items()
        if not k.startswith("optimizer.")})


@pytest.mark.parametrize("name, overrides", [
    ("sera", {}), ("uniform", {}), ("grpo", {}), ("sera_no_multiplicity", {}),
    ("sera", {"threshold": 0.2}), ("sera", {"mode": "equalized"}),
    ("uniform", {"estimator": "rloo"}), ("sera", {"name": "knapsack"}),
])
def test_fingerprints_of_earlier_runs_hold(name, overrides):
    """The method is resolved once and passed as a `Method`; nothing is written into the
    config, and the fingerprint is the one runs recorded before (so they still resume)."""
    config = config_lib.get_config()
    for k, v in overrides.items():
        if k == "estimator":
            config.estimator = v
        else:
            config.allocation[k] = v
    run = config_lib.for_method(config, name)
    before = run.to_dict()
    method = config_lib.validate(run)  # resolves it once
    assert config_lib.fingerprint(run, method) == _old_fingerprint(config, name)
    assert run.to_dict() == before  # nothing resolved was written into the config
    assert method == config_lib.method(run)


def test_a_given_method_must_match_the_configs_name():
    run = config_lib.for_method(config_lib.get_config(), "sera")
    uniform = config_lib.method(config_lib.for_method(config_lib.get_config(), "uniform"))
    with pytest.raises(ValueError, match=r"config.method='sera' is invalid; allowed: unset or "
                                         r"'uniform'"):
        config_lib.validate(run, uniform)
    run.method = None
    assert config_lib.validate(run, uniform) is uniform


def test_two_stage_stateful_and_dynamic_methods_validate():
    # In-step pilot and allocator state (sera_jax.rl.collect), DAPO (sera_jax.rl.dynamic).
    for name in ("sera_sequential", "pilot_commit", "gdro", "dapo"):
        assert config_lib.validate(config_lib.for_method(config_lib.get_config(), name))
