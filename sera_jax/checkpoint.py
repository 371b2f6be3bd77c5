"""Orbax checkpoints of a training-state pytree plus JSON metadata, with clear errors.

A checkpoint is one step directory `<directory>/<step>/` holding two Orbax items:

* `state`: any pytree of arrays (params, optimiser state, history tracker, PRNG key data,
  counters) saved with `StandardSave`; restored straight onto the target shardings;
* `meta`: a JSON dict (data position, config, ...) plus a *signature* of the state tree
  (every leaf's path, shape and dtype), written by `Checkpointer.save` itself.

Writes are atomic: Orbax writes into `<step>.orbax-checkpoint-tmp*` and renames it after
every item is committed, so a process killed mid-save leaves no step that `latest_step`
would pick up. Restoring first compares the stored signature with the target tree and
reports every mismatch by path; any failure while reading (a missing item, a truncated or
corrupted file) raises `CheckpointError` naming the step directory and how to recover.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

STATE_ITEM = "state"
META_ITEM = "meta"
_SIGNATURE_KEY = "_tree_signature"


class CheckpointError(ValueError):
    """A checkpoint that cannot be restored onto the requested target."""


def tree_signature(tree: Any) -> dict[str, list]:
    """`{leaf path: [shape, dtype]}` of a pytree of arrays or `ShapeDtypeStruct`s."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {
        jax.tree_util.keystr(path): [list(np.shape(x)), str(np.dtype(x.dtype))]
        for path, x in leaves
    }


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def config_meta(config: ml_collections.ConfigDict) -> dict[str, Any]:
    """The JSON form of `config` to store in a checkpoint's meta (see `check_resume_config`)."""
    return json.loads(config.to_json())


def check_resume_config(meta: Mapping[str, Any], config: ml_collections.ConfigDict,
                        directory: str, resumable: tuple[str, ...]) -> None:
    """Refuse to continue a checkpoint written under different hyperparameters.

    A resumed run must be the run that was interrupted: silently continuing it with, say, a
    new learning rate would mix two experiments in one curve. Only the top-level fields in
    `resumable` (step counts, logging) may differ. Raises `CheckpointError` listing each
    changed field (stored -> current).
    """
    if "config" not in meta:
        raise CheckpointError(
            f"the checkpoint in {directory} stores no config, so it cannot be checked against "
            "this run's; start the run in a new workdir")
    stored = _flatten(meta["config"])
    current = _flatten(config_meta(config))
    changed = sorted(
        k for k in set(stored) | set(current)
        if k.split(".")[0] not in resumable and stored.get(k) != current.get(k))
    if changed:
        detail = "; ".join(f"{k}: {stored.get(k)!r} -> {current.get(k)!r}" for k in changed)
        raise CheckpointError(
            f"the checkpoint in {directory} was written with a different config ({detail}). "
            "Resume with the original values, or start the changed run in a new workdir.")


def _signature_diff(stored: Mapping[str, list], target: Mapping[str, list]) -> list[str]:
    problems = []
    for path in sorted(set(target) - set(stored)):
        problems.append(f"missing in checkpoint: {path} {target[path]}")
    for path in sorted(set(stored) - set(target)):
        problems.append(f"not in target: {path} {stored[path]}")
    for path in sorted(set(stored) & set(target)):
        if list(stored[path]) != list(target[path]):
            problems.append(f"{path}: checkpoint {stored[path]} vs target {target[path]}")
    return problems


class Checkpointer:
    """Save / restore `(state pytree, metadata dict)` pairs under `directory`, one per step.

    Example::

        ckpt = Checkpointer(workdir / "checkpoints", max_to_keep=3)
        ckpt.save(step, state, {"epoch": 1})
        if ckpt.latest_step() is not None:
            state, meta = ckpt.restore(abstract_state)   # ShapeDtypeStructs with shardings

    All processes of a multi-host job must call `save` and `restore` (Orbax coordinates the
    writes; arrays are global `jax.Array`s).
    """

    def __init__(self, directory: str | os.PathLike, *, max_to_keep: int = 3,
                 async_save: bool = False):
        if max_to_keep < 1:
            raise ValueError(f"max_to_keep={max_to_keep}; must be >= 1")
        self.directory = os.path.abspath(os.fspath(directory))
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, create=True, enable_async_checkpointing=async_save
        )
        self._manager = ocp.CheckpointManager(
            self.directory, options=options, item_names=(STATE_ITEM, META_ITEM)
        )

    def latest_step(self) -> int | None:
        """Largest fully written step, or None (unfinished temporary directories are ignored)."""
        self._manager.reload()
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        """All fully written steps, ascending."""
        self._manager.reload()
        return sorted(self._manager.all_steps())

    def save(self, step: int, state: Any, meta: Mapping[str, Any] | None = None,
             *, force: bool = True) -> None:
        """Write `state` (pytree of arrays) and JSON-serialisable `meta` as checkpoint `step`."""
        meta = dict(meta or {})
        if _SIGNATURE_KEY in meta:
            raise ValueError(f"meta key {_SIGNATURE_KEY!r} is reserved")
        meta[_SIGNATURE_KEY] = tree_signature(state)
        self._manager.save(
            int(step),
            args=ocp.args.Composite(
                **{STATE_ITEM: ocp.args.StandardSave(state), META_ITEM: ocp.args.JsonSave(meta)}
            ),
            force=force,
        )

    def wait_until_finished(self) -> None:
        """Block until an asynchronous save has been committed."""
        self._manager.wait_until_finished()

    def _step_dir(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    def _fail(self, step: int, what: str, cause: BaseException | None = None) -> CheckpointError:
        path = self._step_dir(step)
        msg = (f"cannot restore checkpoint {path}: {what}. Fix: restore with the model/optimiser "
               f"config that wrote it, or move {path} away (training then resumes from the "
               f"previous step) or point the run at a fresh workdir.")
        if cause is not None:
            msg += f" Cause: {type(cause).__name__}: {str(cause)[:500]}"
        return CheckpointError(msg)

    def restore_meta(self, step: int | None = None) -> dict[str, Any]:
        """The metadata dict of `step` (default latest), without the tree signature."""
        step = self._resolve_step(step)
        meta = self._read_meta(step)
        meta.pop(_SIGNATURE_KEY, None)
        return meta

    def _resolve_step(self, step: int | None) -> int:
        if step is None:
            step = self.latest_step()
            if step is None:
                raise CheckpointError(f"no checkpoint in {self.directory}")
        if not os.path.isdir(self._step_dir(step)):
            raise CheckpointError(f"no checkpoint for step {step} in {self.directory} "
                                  f"(available: {self.all_steps()})")
        return int(step)

    def _read_meta(self, step: int) -> dict[str, Any]:
        if not os.path.isdir(os.path.join(self._step_dir(step), META_ITEM)):
            raise self._fail(step, f"the item {META_ITEM!r} is missing")
        try:
            restored = self._manager.restore(
                step, args=ocp.args.Composite(**{META_ITEM: ocp.args.JsonRestore()})
            )
        except Exception as e:  # Orbax raises many types; all mean "unreadable".
            raise self._fail(step, f"the item {META_ITEM!r} is unreadable", e) from e
        meta = restored[META_ITEM]
        if not isinstance(meta, dict):
            raise self._fail(step, f"the item {META_ITEM!r} is not a JSON object")
        return meta

    def restore(self, target: Any, step: int | None = None) -> tuple[Any, dict[str, Any]]:
        """Restore `(state, meta)` of `step` (default: latest) onto `target`'s structure.

        `target` is a pytree of `jax.ShapeDtypeStruct` (with `.sharding`) or of arrays (their
        shardings are used); the restored arrays get those shardings. Raises CheckpointError
        when the stored tree differs from `target` (listing the differing paths) or when
        any file of the step is missing or unreadable.
        """
        step = self._resolve_step(step)
        meta = self._read_meta(step)
        stored = meta.pop(_SIGNATURE_KEY, None)
        if stored is None:
            raise self._fail(step, "its metadata has no tree signature (not written by "
                                   "sera_jax.checkpoint.Checkpointer)")
        problems = _signature_diff(stored, tree_signature(target))
        if problems:
            shown = "; ".join(problems[:8]) + (f"; ... {len(problems) - 8} more"
                                               if len(problems) > 8 else "")
            raise self._fail(step, f"the saved state does not match the target ({shown})")
        if not os.path.isdir(os.path.join(self._step_dir(step), STATE_ITEM)):
            raise self._fail(step, f"the item {STATE_ITEM!r} is missing")
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
        try:
            restored = self._manager.restore(
                step, args=ocp.args.Composite(**{STATE_ITEM: ocp.args.StandardRestore(abstract)})
            )
        except Exception as e:  # truncated / corrupted array files, missing chunks, ...
            raise self._fail(step, f"the item {STATE_ITEM!r} is unreadable or corrupt", e) from e
        return restored[STATE_ITEM], meta

    def close(self) -> None:
        """Finish pending writes and release Orbax resources."""
        self._manager.wait_until_finished()
        self._manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
