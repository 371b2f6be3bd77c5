"""SFT stopped on a non-finite step before any checkpoint: the message promises no
checkpoint to resume from."""

import pytest

from sera_jax import loop, sft
from sera_jax.records import read_jsonl
from tests.test_sft import program, small_config, task  # noqa: F401 -- `task` is a fixture


def test_sft_nonfinite_stop_before_any_checkpoint_says_it_starts_over(task, tmp_path):  # noqa: F811
    c = small_config(num_steps=6, checkpoint_every=0, learning_rate=1e20, warmup_steps=0)
    with pytest.raises(loop.NonFiniteError) as err:
        sft.train(program(task, c), str(tmp_path))
    message = str(err.value)
    assert "there is no checkpoint yet" in message, message
    assert "resumes from that checkpoint" not in message
    assert "starts again from step 0" in message
    assert not (tmp_path / "checkpoints").exists() or not any(
        p.name.isdigit() for p in (tmp_path / "checkpoints").iterdir())
    assert len(read_jsonl(str(tmp_path / "train.jsonl"))) < 6
