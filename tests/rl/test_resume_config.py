"""Resuming refuses a checkpoint written under other hyperparameters."""

import json

import pytest

from sera_jax.checkpoint import CheckpointError
from sera_jax.rl import config as config_lib
from sera_jax.rl.trainer import check_resume_config


def _meta(config):
    return {"step": 2, "config": json.loads(config.to_json())}


def test_same_config_and_longer_run_resume():
    config = config_lib.get_config()
    meta = _meta(config)
    check_resume_config(meta, config, "/ckpt")
    config.num_steps = config.num_steps * 2  # extending a run is what resuming is for
    config.log_every = 7
    check_resume_config(meta, config, "/ckpt")


def test_changed_hyperparameters_are_named():
    config = config_lib.get_config()
    meta = _meta(config)
    config.optimizer.learning_rate = config.optimizer.learning_rate * 10
    config.allocation.name = "uniform"
    with pytest.raises(CheckpointError) as err:
        check_resume_config(meta, config, "/ckpt")
    message = str(err.value)
    assert "optimizer.learning_rate" in message and "allocation.name" in message
    assert "/ckpt" in message and "new workdir" in message
