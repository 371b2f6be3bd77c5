"""The one training loop: exact resume, fingerprint refusal, finite guard, records."""

from __future__ import annotations

import glob
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from sera_jax import loop
from sera_jax.checkpoint import Checkpointer, CheckpointError
from sera_jax.records import read_jsonl
from sera_jax.rl import trainer as trainer_lib
from tests.rl.test_trainer import one_device_mesh, small_config
from tests.rl.toy import EmitTask, tiny_model


def _leaves_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def rl_run(config, task, model, run_dir, *, eval_fn=None, eval_every=0, stop_after=None,
           fingerprint=None):
    trainer = trainer_lib.Trainer(config, task, model, one_device_mesh())
    return loop.run(
        trainer_lib.RLProgram(trainer, model), str(run_dir),
        fingerprint=fingerprint or {"rl": config.to_dict()}, resumable=trainer_lib.RESUMABLE,
        schedule=loop.Schedule(num_steps=config.num_steps,
                               checkpoint_every=config.checkpoint_every, eval_every=eval_every,
                               log_every=1),
        hooks=loop.Hooks(evaluate=eval_fn), stop_after=stop_after)


def test_resume_reproduces_uninterrupted_run_bit_for_bit(tmp_path):
    """run 4 steps == run 2 steps, 'crash', run again to 4 (a new model object and Trainer,
    everything restored from the checkpoint)."""
    task = EmitTask({"train": 6, "eval": 2})  # P = 4 of 6: steps cross epoch boundaries
    config = small_config(num_steps=4, checkpoint_every=2)
    eval_steps = []

    def eval_fn(step, state, final):
        eval_steps.append((step, final))
        return {"probe": float(step)}

    full = rl_run(config, task, tiny_model(seed=3), tmp_path / "full", eval_fn=eval_fn,
                  eval_every=2)
    assert eval_steps == [(2, False), (4, True)]
    part = rl_run(config, task, tiny_model(seed=3), tmp_path / "resumed", stop_after=3)
    assert part.step == 3 and Checkpointer(tmp_path / "resumed" / "checkpoints").latest_step() == 2
    assert [r["step"] for r in read_jsonl(str(tmp_path / "resumed" / "train.jsonl"))] == [1, 2, 3]
    # The restart gets a *different* initial model: its parameters must be ignored.
    resumed = rl_run(config, task, tiny_model(seed=99), tmp_path / "resumed")
    assert resumed.resumed_from == 2
    _leaves_equal(full.state, resumed.state)
    assert int(resumed.state.step) == 4 and int(resumed.state.epoch) == 2
    a = read_jsonl(str(tmp_path / "full" / "train.jsonl"))
    b = read_jsonl(str(tmp_path / "resumed" / "train.jsonl"))
    assert [r["step"] for r in b] == [1, 2, 3, 4]  # the step after the checkpoint is redone
    for x, y in zip(a, b):
        assert (x["loss"], x["reward_mean"]) == (y["loss"], y["reward_mean"])
    assert glob.glob(str(tmp_path / "full" / "tensorboard" / "events.out.tfevents*"))
    meta = Checkpointer(tmp_path / "full" / "checkpoints").restore_meta()
    assert (meta["step"], meta["epoch"], meta["cursor"]) == (4, 2, 4)
    # Undefined metrics are recorded as undefined (κ before any estimate), never NaN.
    assert a[0]["kappa_min"] is None and "NaN" not in open(tmp_path / "full" / "train.jsonl").read()


def test_refused_resume_names_fields_and_leaves_config_json(tmp_path):
    task = EmitTask({"train": 6, "eval": 2})
    config = small_config(num_steps=2, checkpoint_every=1)
    fp = {"task": {"seed": 0}, "rl": config.to_dict()}
    rl_run(config, task, tiny_model(seed=3), tmp_path, fingerprint=fp, stop_after=1)
    saved = open(tmp_path / "config.json").read()
    assert json.loads(saved)["task"] == {"seed": 0}
    with pytest.raises(CheckpointError, match=r"task\.seed: 0 -> 1"):
        rl_run(config, task, tiny_model(seed=3), tmp_path,
               fingerprint={**fp, "task": {"seed": 1}})
    assert open(tmp_path / "config.json").read() == saved
    changed = small_config(num_steps=2, checkpoint_every=1, **{"optimizer.learning_rate": 0.5})
    with pytest.raises(CheckpointError, match="rl.optimizer.learning_rate"):
        rl_run(changed, task, tiny_model(seed=3), tmp_path,
               fingerprint={**fp, "rl": changed.to_dict()})
    # How long a run is may change: the resumed run continues.
    longer = small_config(num_steps=3, checkpoint_every=1)
    assert rl_run(longer, task, tiny_model(seed=3), tmp_path,
                  fingerprint={**fp, "rl": longer.to_dict()}).step == 3


def test_nonfinite_step_is_not_applied_and_the_last_checkpoint_survives(tmp_path):
    """lr = 1e20: the first update is finite but huge, the next loss is not; the run stops
    with NonFiniteError naming the step and the checkpoint, which stays restorable."""
    task = EmitTask({"train": 6, "eval": 2})
    config = small_config(num_steps=6, checkpoint_every=1, max_checkpoints_to_keep=1,
                          **{"optimizer.learning_rate": 1e20})
    with pytest.raises(loop.NonFiniteError) as err:
        rl_run(config, task, tiny_model(seed=3), tmp_path)
    message = str(err.value)
    ckpt = Checkpointer(tmp_path / "checkpoints")
    last = ckpt.latest_step()
    assert last is not None and f"step {last + 1} was not applied" in message
    assert os.path.join(str(tmp_path / "checkpoints"), str(last)) in message
    records = read_jsonl(str(tmp_path / "train.jsonl"))
    assert [r["step"] for r in records] == list(range(1, last + 1))
    trainer = trainer_lib.Trainer(config, task, tiny_model(seed=3), one_device_mesh())
    state, _ = ckpt.restore(trainer.abstract_state(trainer.init_state(tiny_model(seed=3))))
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(state.params))
    ckpt.close()


def test_guarded_update_keeps_params_on_nonfinite_gradients():
    tx = optax.adam(0.1)
    params = {"w": jnp.ones(3)}
    opt = tx.init(params)
    grads = {"w": jnp.array([1.0, jnp.nan, 0.0])}
    new, new_opt, m = jax.jit(loop.guarded_update, static_argnums=0)(
        tx, params, opt, jnp.float32(1.0), grads)
    assert float(m["finite"]) == 0.0
    _leaves_equal(new, params)
    _leaves_equal(new_opt, opt)
    new, _, m = loop.guarded_update(tx, params, opt, jnp.float32(1.0), {"w": jnp.ones(3)})
    assert float(m["finite"]) == 1.0 and float(new["w"][0]) < 1.0


def test_changed_fields_respects_resumable_prefixes():
    a = {"rl": {"num_steps": 4, "optimizer": {"learning_rate": 1.0}}, "eval": {"every": 2}}
    b = {"rl": {"num_steps": 8, "optimizer": {"learning_rate": 2.0}}, "eval": {"every": 4}}
    assert loop.changed_fields(a, b, ("rl.num_steps", "eval.every")) == \
        ["rl.optimizer.learning_rate"]
    assert loop.changed_fields({"x": (1, 2)}, {"x": [1, 2]}) == []  # stored as JSON


def test_read_jsonl_drops_only_a_torn_last_line(tmp_path):
    path = str(tmp_path / "r.jsonl")
    with open(path, "w") as f:
        f.write('{"step": 1}\n{"step": 2}\n{"ste')
    assert read_jsonl(path) == [{"step": 1}, {"step": 2}]
    with open(path, "w") as f:
        f.write('{"step": 1}\n{"ste\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"r\.jsonl:2: not a JSON record"):
        read_jsonl(path)
    with open(path, "w") as f:
        f.write('{"step": 1}\n[1, 2]\n')
    with pytest.raises(ValueError, match="must be a JSON object"):
        read_jsonl(path)
    with open(path, "wb") as f:
        f.write(b'{"step": 1}\n\xff\xfe\n')
    with pytest.raises(ValueError, match="not UTF-8"):
        read_jsonl(path)


def test_disk_full_mid_run_is_one_error_and_the_previous_checkpoint_survives(tmp_path,
                                                                              monkeypatch):
    """ENOSPC while saving step 2: the loop ends with the checkpoint module's one
    CheckpointError (no secondary error from closing the writer or the manager), the step-1
    checkpoint restores, and the records stop where the work stopped."""
    import errno

    task = EmitTask({"train": 6, "eval": 2})
    config = small_config(num_steps=4, checkpoint_every=1)
    real_save = Checkpointer.save

    def save(self, step, *args, **kwargs):
        if step == 2:
            def full(*a, **k):
                raise OSError(errno.ENOSPC, "No space left on device", self.directory)
            monkeypatch.setattr(self._manager, "save", full)
        return real_save(self, step, *args, **kwargs)

    monkeypatch.setattr(Checkpointer, "save", save)
    with pytest.raises(CheckpointError, match="disk is full") as err:
        rl_run(config, task, tiny_model(seed=3), tmp_path)
    assert err.value.__context__ is None or not isinstance(err.value.__context__, CheckpointError)
    monkeypatch.setattr(Checkpointer, "save", real_save)
    with Checkpointer(tmp_path / "checkpoints") as ckpt:
        assert ckpt.all_steps() == [1]
    resumed = rl_run(config, task, tiny_model(seed=3), tmp_path)  # space is back: it resumes
    assert (resumed.resumed_from, resumed.step) == (1, 4)
