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
