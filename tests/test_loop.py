"""The one training loop: exact resume, fingerprint refusal, finite guard, records."""

from __future__ import annotations

import glob
import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from sera_jax import loop, optim
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
                               log_every=1, async_checkpoint=config.async_checkpoint),
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
    assert last is not None and (f"step {last + 1} was not applied" in message
                                 or f"step {last + 1} made the parameters non-finite" in message)
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
    new, _, m = loop.guarded_update(tx, params, opt, jnp.float32(jnp.inf), {"w": jnp.ones(3)})
    assert float(m["finite"]) == 0.0
    _leaves_equal(new, params)


def test_guarded_update_flags_parameters_that_overflow():
    """Finite loss and gradient but parameters that overflow to inf: `finite` = 0 (the loop
    then stops before saving)."""
    tx = optax.sgd(1e38)
    params = {"w": jnp.full(3, 3e38, jnp.float32)}
    new, _, m = loop.guarded_update(tx, params, tx.init(params), jnp.float32(1.0),
                                    {"w": -jnp.ones(3)})
    assert float(m["grad_norm"]) > 0 and float(m["finite"]) == 0.0
    assert not bool(jnp.all(jnp.isfinite(new["w"])))


def _change_norm(new, old):
    """‖new − old‖ over every leaf, in float64 on the host (the independent computation)."""
    return float(np.sqrt(sum(np.sum((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2)
                             for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(old)))))


@pytest.mark.parametrize("fused", [False, True])
def test_guarded_update_reports_the_applied_change_and_clipping(fused):
    """`update_norm` is the norm of the parameter change actually applied (0 on a step that
    is not applied); `clipped` is 1 exactly when ‖g‖ exceeds a positive clip. Both the optax
    path and the trainer's fused AdamW step (`step=`), whose parameters are donated."""
    params = {"w": jnp.linspace(-1.0, 1.0, 6).reshape(2, 3), "b": jnp.full(3, 0.3)}
    grads = {"w": jnp.arange(6.0).reshape(2, 3) - 2.5, "b": jnp.array([0.5, -1.0, 2.0])}
    g_norm = _change_norm(grads, jax.tree.map(jnp.zeros_like, grads))
    for clip, clipped in ((1e-3, 1.0), (1e6, 0.0), (0.0, 0.0)):
        cfg = small_config(**{"optimizer.grad_clip": clip, "optimizer.learning_rate": 0.1})
        tx = optim.make_optimizer(cfg.optimizer)
        step = (lambda *a, cfg=cfg: trainer_lib.fused_adamw_step(cfg, *a)) if fused else None
        update = jax.jit(lambda p, s, g, loss, tx=tx, step=step, clip=clip: loop.guarded_update(
            tx, p, s, loss, g, step=step, grad_clip=clip), donate_argnums=(0, 1))
        old = jax.tree.map(np.array, params)
        new, _, m = update(jax.tree.map(jnp.copy, params), tx.init(params), grads,
                           jnp.float32(1.0))
        change = _change_norm(new, old)
        assert change > 0.01
        np.testing.assert_allclose(float(m["update_norm"]), change, rtol=1e-5)
        assert float(m["clipped"]) == clipped and float(m["grad_norm"]) == pytest.approx(g_norm)
        # A step with a non-finite loss is not applied: no change, update_norm 0.
        new, _, m = update(jax.tree.map(jnp.copy, params), tx.init(params), grads,
                           jnp.float32(jnp.nan))
        _leaves_equal(new, old)
        assert float(m["update_norm"]) == 0.0 and float(m["finite"]) == 0.0
    _, _, m = loop.guarded_update(tx, params, tx.init(params), jnp.float32(1.0), grads)
    assert "clipped" not in m  # no clip threshold given (SFT): not reported


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


def test_async_checkpoints_restore_exactly_and_resume_to_the_uninterrupted_result(tmp_path):
    """`rl.async_checkpoint`: the step does not wait for the write (the train step donates
    params and optimiser state meanwhile), yet every checkpoint restores bit for bit and a
    killed-and-resumed async run ends exactly where the synchronous uninterrupted one does."""
    task = EmitTask({"train": 6, "eval": 2})
    sync = small_config(num_steps=4, checkpoint_every=1)
    full = rl_run(sync, task, tiny_model(seed=3), tmp_path / "sync")
    config = small_config(num_steps=4, checkpoint_every=1, async_checkpoint=True)
    part = rl_run(config, task, tiny_model(seed=3), tmp_path / "async", stop_after=3)
    assert part.step == 3
    trainer = trainer_lib.Trainer(config, task, tiny_model(seed=3), one_device_mesh())
    with Checkpointer(tmp_path / "async" / "checkpoints") as ckpt:
        assert ckpt.all_steps() == [1, 2, 3]  # the last write was committed before returning
        state, meta = ckpt.restore(trainer.abstract_state(trainer.init_state(tiny_model())))
    assert meta["step"] == 3
    _leaves_equal(state, part.state)  # params, AdamW state, history, key, counters
    resumed = rl_run(config, task, tiny_model(seed=99), tmp_path / "async")
    assert (resumed.resumed_from, resumed.step) == (3, 4)
    _leaves_equal(full.state, resumed.state)
    a = read_jsonl(str(tmp_path / "sync" / "train.jsonl"))
    b = read_jsonl(str(tmp_path / "async" / "train.jsonl"))
    assert [(r["loss"], r["reward_mean"]) for r in a] == [(r["loss"], r["reward_mean"]) for r in b]
    # The option does not define the run: a synchronous resume of the async run is accepted.
    longer = small_config(num_steps=5, checkpoint_every=1)
    assert rl_run(longer, task, tiny_model(seed=3), tmp_path / "async").step == 5


def test_a_failing_async_write_ends_the_run_with_checkpoint_error(tmp_path, monkeypatch):
    """The write of step 2 fails in the background after `save` returned: the loop surfaces
    it as the module's CheckpointError (at step 3's save, which waits for it), step 1
    survives, and the run resumes from it to the end."""
    import errno

    from orbax.checkpoint._src.checkpointers import async_checkpointer

    task = EmitTask({"train": 6, "eval": 2})
    config = small_config(num_steps=4, checkpoint_every=1, async_checkpoint=True)
    real_save = Checkpointer.save

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    def save(self, step, *args, **kwargs):
        if step == 2:
            self.wait_until_finished()  # step 1 commits with the real callback
            monkeypatch.setattr(async_checkpointer, "_on_commit_callback", full)
        return real_save(self, step, *args, **kwargs)

    monkeypatch.setattr(Checkpointer, "save", save)
    with pytest.raises(CheckpointError, match="asynchronous checkpoint write.*disk is full"):
        rl_run(config, task, tiny_model(seed=3), tmp_path)
    monkeypatch.undo()
    with Checkpointer(tmp_path / "checkpoints") as ckpt:
        assert ckpt.all_steps() == [1]
    resumed = rl_run(config, task, tiny_model(seed=3), tmp_path)
    assert (resumed.resumed_from, resumed.step) == (1, 4)


def test_async_checkpoint_options_are_validated_resumable_and_never_fingerprinted():
    from sera_jax import sft
    from sera_jax.rl import config as rl_config

    for validate, config in ((rl_config.validate, small_config()),
                             (sft.validate, sft.get_config())):
        assert config.async_checkpoint is False
        config = type(config)({**config.to_dict(), "async_checkpoint": "yes"})  # (typed field)
        with pytest.raises(ValueError, match="async_checkpoint='yes' is invalid"):
            validate(config)
    assert "rl.async_checkpoint" in trainer_lib.RESUMABLE
    assert "sft.async_checkpoint" in sft.RESUMABLE
    on, off = small_config(async_checkpoint=True), small_config()
    assert (rl_config.fingerprint(on, rl_config.method(on))
            == rl_config.fingerprint(off, rl_config.method(off)))
    assert "async_checkpoint" not in rl_config.fingerprint(on, rl_config.method(on))
    config = sft.get_config()
    config.async_checkpoint = True
    assert "async_checkpoint" not in sft.config_fingerprint(config)


def test_trim_fields_drops_omitted_and_default_fields_only():
    tree = {"a": {"b": 1, "c": ""}, "d": True, "e": {"c": "x"}}
    assert loop.trim_fields(tree, omit=("d", "missing.x"), defaults={"a.c": "", "e.c": ""}) \
        == {"a": {"b": 1}, "e": {"c": "x"}}
    assert tree == {"a": {"b": 1, "c": ""}, "d": True, "e": {"c": "x"}}  # not mutated


class _FailingProgram:
    """Step 2 reports `finite = 0` with the given loss and gradient norm."""

    def __init__(self, loss, grad_norm):
        self.loss, self.grad_norm = loss, grad_norm

    def init_state(self):
        return {"w": jnp.zeros(2)}

    def abstract_state(self, state):
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)

    def step(self, state, step):
        bad = step == 1
        return {"w": state["w"] + 1}, {"loss": self.loss if bad else 0.5,
                                       "grad_norm": self.grad_norm if bad else 1.0,
                                       "finite": 0.0 if bad else 1.0}

    def position(self, state):
        return {}


@pytest.mark.parametrize("loss, grad_norm, message", [
    (float("nan"), 1.0, "step 2 was not applied: non-finite loss or gradient"),
    (0.5, 1.0, "step 2 made the parameters non-finite (float overflow) and is not saved"),
    (None, None, "step 2 was not applied: non-finite loss, gradient or parameters"),
])
def test_nonfinite_message_names_what_failed(tmp_path, loss, grad_norm, message):
    schedule = loop.Schedule(num_steps=3, checkpoint_every=1)
    with pytest.raises(loop.NonFiniteError, match=re.escape(message)) as err:
        loop.run(_FailingProgram(loss, grad_norm), str(tmp_path), fingerprint={"a": 1},
                 resumable=(), schedule=schedule)
    assert os.path.join(str(tmp_path), "checkpoints", "1") in str(err.value)


# ------------------------------------------------------------- rough edges of the loop


class _CountingProgram:
    """A finite program: w += 1 per step (fast; no compile)."""

    def init_state(self):
        return {"w": jnp.zeros(2)}

    def abstract_state(self, state):
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)

    def step(self, state, step):
        return {"w": state["w"] + 1}, {"loss": float(step), "finite": 1.0}

    def position(self, state):
        return {}


def _count_run(run_dir, num_steps, stop_after=None, checkpoint_every=1):
    return loop.run(_CountingProgram(), str(run_dir), fingerprint={"a": 1}, resumable=(),
                    schedule=loop.Schedule(num_steps=num_steps,
                                           checkpoint_every=checkpoint_every),
                    stop_after=stop_after)


@pytest.mark.parametrize("damage", ["deleted", "emptied", "lost_a_step", "lost_the_first"])
def test_resume_without_the_records_up_to_the_checkpoint_is_refused(tmp_path, damage):
    """Records up to the checkpoint are not in the checkpoint: a resume whose train.jsonl
    lacks any of them is refused (naming the file and the fix), nothing is changed, and the
    run resumes once the file is back."""
    _count_run(tmp_path, 5, stop_after=3)
    path = tmp_path / loop.TRAIN_RECORDS
    good = path.read_text()
    config, steps = (tmp_path / "config.json").read_text(), [1, 2, 3]
    if damage == "deleted":
        path.unlink()
    else:
        keep = {"emptied": [], "lost_a_step": [1, 3], "lost_the_first": [2, 3]}[damage]
        lines = good.splitlines(keepends=True)
        path.write_text("".join(lines[s - 1] for s in keep))
    damaged = path.read_text() if path.exists() else None
    with pytest.raises(CheckpointError, match=r"refusing to resume .* step-3 checkpoint: .*"
                       r"train\.jsonl (does not exist|lacks).*Put the file back") as err:
        _count_run(tmp_path, 5)
    assert "\n" not in str(err.value)
    assert (path.read_text() if path.exists() else None) == damaged  # nothing rewritten
    assert (tmp_path / "config.json").read_text() == config
    with Checkpointer(tmp_path / "checkpoints") as ckpt:
        assert ckpt.all_steps() == steps
    path.write_text(good)  # put back: the resume goes on
    assert _count_run(tmp_path, 5).resumed_from == 3
    assert [r["step"] for r in read_jsonl(str(path))] == [1, 2, 3, 4, 5]


def test_resume_with_records_beyond_the_checkpoint_is_still_accepted(tmp_path):
    _count_run(tmp_path, 4, stop_after=3, checkpoint_every=2)  # checkpoint 2, records 1..3
    result = _count_run(tmp_path, 4, checkpoint_every=2)
    assert result.resumed_from == 2
    assert [r["step"] for r in read_jsonl(str(tmp_path / loop.TRAIN_RECORDS))] == [1, 2, 3, 4]


def test_a_stray_checkpoint_beyond_the_records_is_refused_before_any_work(tmp_path):
    """Records for steps 1-4, `checkpoints/3` renamed `checkpoints/9`: the resume is refused
    in one line naming checkpoints/9 and the fix (it used to resume at step 3 and leave 2, 4
    and 9, or fail on Orbax's "Checkpoint for step 4 already exists"); nothing is changed,
    and once it is moved away the run resumes from checkpoint 4."""
    _count_run(tmp_path, 4)
    ckpts = tmp_path / "checkpoints"
    os.rename(ckpts / "3", ckpts / "9")
    records, config = (tmp_path / loop.TRAIN_RECORDS).read_text(), (
        tmp_path / "config.json").read_text()
    with pytest.raises(CheckpointError, match=r"refusing to resume .* from checkpoint "
                       r".*checkpoints/9: its step 9 is beyond the run's records "
                       r"\(.*train\.jsonl ends at step 4\).*Move .*checkpoints/9 away") as err:
        _count_run(tmp_path, 4)
    assert "\n" not in str(err.value)
    assert (tmp_path / loop.TRAIN_RECORDS).read_text() == records
    assert (tmp_path / "config.json").read_text() == config
    assert sorted(os.listdir(ckpts)) == ["2", "4", "9"]
    os.rename(ckpts / "9", tmp_path / "stray")
    assert _count_run(tmp_path, 4).resumed_from == 4


def test_a_renamed_checkpoint_within_the_records_is_refused(tmp_path):
    """`checkpoints/4` renamed `checkpoints/3` (records 1-4): the directory's step is not the
    one it stores; refused naming it, before any work."""
    _count_run(tmp_path, 4, checkpoint_every=2)  # checkpoints 2 and 4
    ckpts = tmp_path / "checkpoints"
    os.rename(ckpts / "4", ckpts / "3")
    with pytest.raises(CheckpointError, match=r"checkpoint .*checkpoints/3: it holds step 4, "
                       r"not 3 .*rename it back to 4"):
        _count_run(tmp_path, 4, checkpoint_every=2)
    assert [r["step"] for r in read_jsonl(str(tmp_path / loop.TRAIN_RECORDS))] == [1, 2, 3, 4]
    os.rename(ckpts / "3", ckpts / "4")
    assert _count_run(tmp_path, 4, checkpoint_every=2).resumed_from == 4


def test_nonfinite_stop_without_a_checkpoint_does_not_promise_one(tmp_path):
    schedule = loop.Schedule(num_steps=3, checkpoint_every=0)  # no checkpoint before the end
    with pytest.raises(loop.NonFiniteError) as err:
        loop.run(_FailingProgram(float("nan"), 1.0), str(tmp_path), fingerprint={"a": 1},
                 resumable=(), schedule=schedule)
    message = str(err.value)
    assert "there is no checkpoint yet" in message
    assert "resumes from that checkpoint" not in message
    assert "starts again from step 0" in message


def _fill(directory):
    """Write a filler file until the filesystem of `directory` is full (real ENOSPC)."""
    import errno

    with open(os.path.join(directory, "filler"), "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as e:
            assert e.errno == errno.ENOSPC


@pytest.fixture
def small_filesystem(tmp_path):
    """A 32 MiB tmpfs (root only; skipped where `mount` is not permitted)."""
    import subprocess

    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(mount)],
                          capture_output=True)
    if done.returncode:
        pytest.skip("cannot mount a tmpfs here (needs root): "
                    + done.stderr.decode(errors="replace").strip())
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_real_full_disk_during_an_rl_save_is_one_checkpoint_error(small_filesystem,
                                                                   monkeypatch, caplog):
    """A real tmpfs fills up before step 2's save: Orbax's write fails with ENOSPC and so
    does the TensorBoard writer's event file; the error raised is the CheckpointError (the
    writer's is one logged line, its close raises nothing), step 1 survives and the run
    resumes once space is back."""
    run_dir = small_filesystem / "run"
    task = EmitTask({"train": 6, "eval": 2})
    config = small_config(num_steps=3, checkpoint_every=1)
    real_save = Checkpointer.save

    def save(self, step, *args, **kwargs):
        if step == 2:
            _fill(small_filesystem)
        return real_save(self, step, *args, **kwargs)

    closes = []
    real_close = loop.MetricWriter.close

    def close(self):
        try:
            real_close(self)
        except OSError as e:  # pragma: no cover -- the failure must be logged, not raised
            closes.append(e)
            raise

    monkeypatch.setattr(Checkpointer, "save", save)
    monkeypatch.setattr(loop.MetricWriter, "close", close)
    with pytest.raises(CheckpointError, match="disk is full"):
        rl_run(config, task, tiny_model(seed=3), run_dir)
    failed = [r.getMessage() for r in caplog.records
              if "TensorBoard writer failed" in r.getMessage()]
    assert not closes and len(failed) == 1 and "No space left" in failed[0], failed
    monkeypatch.undo()
    os.remove(small_filesystem / "filler")
    with Checkpointer(run_dir / "checkpoints") as ckpt:
        assert ckpt.all_steps() == [1]
    resumed = rl_run(config, task, tiny_model(seed=3), run_dir)
    assert (resumed.resumed_from, resumed.step) == (1, 3)


def test_a_writer_that_really_fails_on_close_does_not_replace_the_error(tmp_path,
                                                                         monkeypatch):
    """Without root (no tmpfs): the writer's close writes to /dev/full (a real ENOSPC from
    the kernel); the step's own error is the one raised."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")

    def close(self):
        with open("/dev/full", "w") as f:
            f.write("events")  # flushed on exit: OSError(ENOSPC)

    monkeypatch.setattr(loop.MetricWriter, "close", close)
    with pytest.raises(loop.NonFiniteError, match="step 2 was not applied"):
        loop.run(_FailingProgram(float("nan"), 1.0), str(tmp_path), fingerprint={"a": 1},
                 resumable=(), schedule=loop.Schedule(num_steps=3, checkpoint_every=1))
    with pytest.raises(OSError, match="No space left"):  # a clean run still reports it
        _count_run(tmp_path / "clean", 1)


_QUIET_SCRIPT = """
import sys
from absl import app
from sera_jax import loop
from tests.test_loop import _count_run

def main(argv):
    _count_run(sys.argv[-1], 2)
    print("done")

app.run(main)
"""


@pytest.mark.parametrize("verbose", [False, True])
def test_a_loop_run_is_quiet_unless_verbose(tmp_path, verbose):
    """Under absl's app.run (as every binary): no Orbax / JAX INFO lines by default, the
    loop's progress lines stay; `--verbosity=1` brings the library lines back."""
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    args = ["--verbosity=1"] if verbose else []
    out = subprocess.run([sys.executable, "-c", _QUIET_SCRIPT, *args, str(tmp_path / "run")],
                         cwd=root, env={**os.environ, "PYTHONPATH": root},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "done", out.stderr[-3000:]
    orbax = [line for line in out.stderr.splitlines() if "checkpoint_manager.py" in line
             or "orbax" in line.lower()]
    assert any("loop.py" in line and "step 1 |" in line for line in out.stderr.splitlines())
    if verbose:
        assert len(orbax) > 5
    else:
        assert orbax == [], orbax[:5]
        assert len(out.stderr.splitlines()) <= 5, out.stderr


def test_a_record_write_that_fails_for_real_is_one_error_and_the_run_resumes(tmp_path):
    """train.jsonl on /dev/full (a real ENOSPC from the kernel) at step 3: one
    RecordWriteError (a CheckpointError: one line in every binary) naming the file, the
    step and the fix; the step-2 checkpoint resumes once the file is writable again."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    path = tmp_path / loop.TRAIN_RECORDS

    class Program(_CountingProgram):
        def step(self, state, step):
            if step == 2:  # the record of step 3 goes to a full device
                good = path.read_text()
                path.unlink()
                path.symlink_to("/dev/full")
                self.good = good
            return super().step(state, step)

    program = Program()
    with pytest.raises(loop.RecordWriteError, match=r"cannot write the record of step 3 to "
                       r".*train\.jsonl.*No space left.*free disk space") as err:
        loop.run(program, str(tmp_path), fingerprint={"a": 1}, resumable=(),
                 schedule=loop.Schedule(num_steps=4, checkpoint_every=1))
    assert isinstance(err.value, CheckpointError) and err.value.__suppress_context__
    path.unlink()
    path.write_text(program.good)
    assert _count_run(tmp_path, 4).resumed_from == 2
    assert [r["step"] for r in read_jsonl(str(path))] == [1, 2, 3, 4]
