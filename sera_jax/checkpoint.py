"""Orbax checkpoints of a training-state pytree plus JSON metadata, with clear errors.

A checkpoint is one step directory `<directory>/<step>/` holding two Orbax items:

* `state`: any pytree of arrays (params, optimiser state, history tracker, PRNG key data,
  counters) saved with `StandardSave`; restored straight onto the target shardings;
* `meta`: a JSON dict (data position, config, ...) plus, written by `Checkpointer.save`
  itself, a *signature* of the state tree (every leaf's path, shape and dtype), a
  *checksum* of every leaf's array data and a checksum of the meta dict itself.

Writes are atomic: Orbax writes into `<step>.orbax-checkpoint-tmp*` and renames it after
every item is committed, so a process killed mid-save leaves no step that `latest_step`
would pick up. Restoring first compares the stored signature with the target tree and
reports every mismatch by path; any failure while reading (a missing item, a truncated or
corrupted file) raises `CheckpointError` naming the step directory and how to recover.

Integrity: Orbax / TensorStore checksum only the shard index, not the array bytes (a flipped
bit in an incompressible array restores silently), so `save` stores a 64-bit checksum of
each leaf and `restore` recomputes it on the restored arrays and refuses any mismatch. The
checksum is `sum_i bits(x_i) * w_i mod 2**32` in two lanes, `w_i` an odd weight derived
from the element's index `i`: it catches every single-bit flip with certainty, does not
depend on how the array is sharded (so a checkpoint still restores onto other shardings),
and is computed where the arrays live: under `jit` on accelerators (global arrays of a
multi-host job included), with NumPy for host / CPU arrays (same integer arithmetic, same
result; about 10 ms per 100 MB, a few percent of a save). The meta dict carries a SHA-256
of itself. Checkpoints written before checksums existed restore unverified, with a warning.

A failed read leaves Orbax's other reads of that step in flight on TensorStore's threads;
they finish after Orbax has closed the event loop that awaited them, and each printed a raw
traceback at exit, after the one-line `CheckpointError`: "Exception ignored ...
RuntimeError: Event loop is closed", asyncio's "Task exception was never retrieved" (the
other reads' own errors, "Task" or "Future") and "coroutine ... was never awaited" --
sometimes before the error itself was raised. The first `Checkpointer` therefore installs
`quiet_orphaned_io` (once per process): exactly these leftovers are counted and logged at
debug level, never printed; every other unraisable exception and asyncio error is reported as
before. (The one wider effect: a process that made a Checkpointer does not print Python's
"coroutine ... was never awaited" warning; this project awaits no coroutine of its own.)
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import sys
import warnings
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

STATE_ITEM = "state"
META_ITEM = "meta"
_SIGNATURE_KEY = "_tree_signature"
_CHECKSUM_KEY = "_checksums"
_META_CHECKSUM_KEY = "_meta_sha256"
_RESERVED = (_SIGNATURE_KEY, _CHECKSUM_KEY, _META_CHECKSUM_KEY)

_log = logging.getLogger(__name__)


class CheckpointError(ValueError):
    """A checkpoint that cannot be restored onto the requested target."""


def _orphaned_io(unraisable: Any) -> bool:
    """Whether an unraisable exception is a leftover of an Orbax read or write that failed:
    a callback scheduled on the closed event loop, or a coroutine nobody awaits any more."""
    exc, obj = unraisable.exc_value, unraisable.object
    if isinstance(exc, RuntimeError) and "Event loop is closed" in str(exc):
        return True
    return type(obj).__name__ == "coroutine" or "coroutine" in str(unraisable.err_msg or "")


_previous_unraisablehook = None
_orphans_dropped = 0


class _OrphanedTasks(logging.Filter):
    """Drops asyncio's "Task / Future exception was never retrieved" for Orbax's tasks and
    TensorStore's reads."""

    def filter(self, record: logging.LogRecord) -> bool:
        global _orphans_dropped
        text = str(record.msg)
        error = record.exc_info[1] if record.exc_info else None
        if "exception was never retrieved" in text and (
                "orbax" in text or "tensorstore" in f"{text} {error}"):
            _orphans_dropped += 1
            return False
        return True


def quiet_orphaned_io() -> None:
    """Install (once) what drops the leftovers of a failed Orbax read or write (module
    docstring): an unraisable-exception hook (`_orphaned_io`; everything else is passed on),
    a filter on asyncio's logger for Orbax's never-retrieved task errors, and a warnings
    filter for Orbax's never-awaited coroutines."""
    global _previous_unraisablehook
    if _previous_unraisablehook is not None:
        return
    _previous_unraisablehook = sys.unraisablehook
    logging.getLogger("asyncio").addFilter(_OrphanedTasks())
    warnings.filterwarnings("ignore", message=r"coroutine '.*' was never awaited",
                            category=RuntimeWarning)

    def hook(unraisable: Any) -> None:
        global _orphans_dropped
        if _orphaned_io(unraisable):
            _orphans_dropped += 1
            _log.debug("dropped a leftover of a failed checkpoint read / write (%d so far): "
                       "%s", _orphans_dropped, unraisable.exc_value)
            return
        _previous_unraisablehook(unraisable)

    sys.unraisablehook = hook


def tree_signature(tree: Any) -> dict[str, list]:
    """`{leaf path: [shape, dtype]}` of a pytree of arrays or `ShapeDtypeStruct`s."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {
        jax.tree_util.keystr(path): [list(np.shape(x)), str(np.dtype(x.dtype))]
        for path, x in leaves
    }


# ---------------------------------------------------------------------------------------
# Checksums of array data (see the module docstring).
# ---------------------------------------------------------------------------------------

_LANE_SEEDS = (0x243F6A88, 0x85A308D3)  # two independent lanes -> a 64-bit checksum


def _checksummable(dtype: Any) -> bool:
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return True
    if dtype.itemsize not in (1, 2, 4, 8, 16):
        return False
    try:  # sub-byte types (int4, float4) report itemsize 1 but fewer bits
        info = jnp.finfo(dtype) if jnp.issubdtype(dtype, jnp.inexact) else jnp.iinfo(dtype)
    except ValueError:
        return False
    bits = info.bits * (2 if jnp.issubdtype(dtype, jnp.complexfloating) else 1)
    return bits == 8 * dtype.itemsize


def _as_uint32(x: jax.Array) -> jax.Array:
    """The bits of `x` as uint32 words: shape `x.shape` (+ a trailing axis for wide types)."""
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint32)
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        x = jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1)
    size = x.dtype.itemsize
    if size == 4:
        return jax.lax.bitcast_convert_type(x, jnp.uint32)
    if size in (1, 2):
        narrow = jnp.uint8 if size == 1 else jnp.uint16
        return jax.lax.bitcast_convert_type(x, narrow).astype(jnp.uint32)
    return jax.lax.bitcast_convert_type(x, jnp.uint32)  # 8 bytes -> [..., 2]


def _mix(h):
    # murmur3's 32-bit finaliser (a bijection of uint32 NumPy arrays).
    h = h ^ (h >> 16)
    h = h * h.dtype.type(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * h.dtype.type(0xC2B2AE35)
    return h ^ (h >> 16)


def _axis_weights(size: int, axis: int, seed: int) -> np.ndarray:
    """Odd uint32 weights of the indices along one axis (host; small: one per index)."""
    with np.errstate(over="ignore"):
        index = np.arange(size, dtype=np.uint32) * np.uint32(0x9E3779B1)
        salt = np.uint32((seed + 0x61C88647 * (axis + 1)) % 2**32)
        return _mix(index + salt) | np.uint32(1)


def _device_checksum(x: jax.Array) -> jax.Array:
    """`[lane0, lane1]`: sum of words[i] * prod_k a_k[i_k] mod 2**32 (see `_host_checksum`).

    Written as a broadcast product (no reshape), so sharded inputs reduce in place."""
    words = _as_uint32(x)
    lanes = []
    for seed in _LANE_SEEDS:
        weight = jnp.uint32(1)
        for axis, size in enumerate(words.shape):
            a = jnp.asarray(_axis_weights(size, axis, seed))
            weight = weight * a.reshape((1,) * axis + (size,) + (1,) * (words.ndim - axis - 1))
        lanes.append(jnp.sum(words * weight, dtype=jnp.uint32))
    return jnp.stack(lanes)


@jax.jit
def _checksum_leaves(leaves: list) -> list:
    return [_device_checksum(x) for x in leaves]


def _host_words(x: np.ndarray) -> np.ndarray:
    """NumPy twin of `_as_uint32` (same words in the same order)."""
    x = np.asarray(x, order="C")  # (not ascontiguousarray: it makes scalars 1-d)
    if x.dtype == np.bool_:
        return x.astype(np.uint32)
    size = x.dtype.itemsize
    if size in (1, 2):
        return x.reshape(-1).view(np.uint8 if size == 1 else np.uint16).astype(
            np.uint32).reshape(x.shape)
    words = x.reshape(-1).view(np.uint32)
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        return words.reshape(x.shape + (2,) + ((2,) if size == 16 else ()))
    return words.reshape(x.shape + ((2,) if size == 8 else ()))


def _host_checksum(x: np.ndarray) -> tuple[int, int]:
    """The same checksum as `_device_checksum`, with NumPy: the axes are contracted one at
    a time from the last (`einsum` in uint32 wraps mod 2**32 exactly like XLA)."""
    words = _host_words(x)
    lanes = []
    for seed in _LANE_SEEDS:
        t = words
        for axis in reversed(range(words.ndim)):
            t = np.einsum("...k,k->...", t, _axis_weights(words.shape[axis], axis, seed),
                          dtype=np.uint32)
        lanes.append(int(t))
    return lanes[0], lanes[1]


def _on_host(x: Any) -> bool:
    """Host memory (NumPy, or CPU-backend arrays): hashed by NumPy, several times faster
    there than XLA:CPU's integer reductions. Accelerator / multi-host arrays use `jit`."""
    if not isinstance(x, jax.Array):
        return True
    return x.is_fully_addressable and all(d.platform == "cpu" for d in x.sharding.device_set)


def _to_numpy(x: jax.Array) -> np.ndarray:
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return np.asarray(x.addressable_data(0))  # a replicated result: any copy
    return np.asarray(x)


def tree_checksums(tree: Any) -> dict[str, str | None]:
    """`{leaf path: 16-hex-digit checksum}` of a pytree of arrays (None: an empty leaf or a
    dtype without a checksum, e.g. int4). Sharding-independent; all processes of a
    multi-host job must call it together (device arrays are hashed under `jit`)."""
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    out: dict[str, str | None] = {jax.tree_util.keystr(p): None for p, _ in flat}
    groups: dict[Any, list[tuple[str, Any]]] = {}
    for path, x in flat:
        name = jax.tree_util.keystr(path)
        if not _checksummable(x.dtype) or 0 in np.shape(x):
            continue
        if _on_host(x):
            lo, hi = _host_checksum(np.asarray(x))
            out[name] = f"{hi:08x}{lo:08x}"
            continue
        groups.setdefault(frozenset(d.id for d in x.sharding.device_set), []).append((name, x))
    for members in groups.values():
        sums = _checksum_leaves([x for _, x in members])
        for (name, _), value in zip(members, sums):
            lo, hi = (int(v) for v in _to_numpy(value))
            out[name] = f"{hi:08x}{lo:08x}"
    return out


def _meta_digest(meta: Mapping[str, Any]) -> str:
    body = {k: v for k, v in meta.items() if k != _META_CHECKSUM_KEY}
    canonical = json.dumps(json.loads(json.dumps(body)), sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


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


_WRITE_ERRORS = {
    errno.ENOSPC: ("the disk is full", "No space left on device"),
    errno.EDQUOT: ("the disk quota is exceeded", "Disk quota exceeded"),
    errno.EACCES: ("permission denied", "Permission denied"),
    errno.EROFS: ("the file system is read-only", "Read-only file system"),
}


def _write_error(e: BaseException) -> str | None:
    """What went wrong when a save failed for lack of space / permissions, else None.

    Orbax surfaces these as OSError or as TensorStore errors that only carry the text."""
    for cause in (e, e.__cause__, e.__context__):
        if isinstance(cause, OSError) and cause.errno in _WRITE_ERRORS:
            return _WRITE_ERRORS[cause.errno][0]
    text = str(e)
    for what, marker in _WRITE_ERRORS.values():
        if marker in text:
            return what
    return None


class Checkpointer:
    """Save / restore `(state pytree, metadata dict)` pairs under `directory`, one per step.

    Example::

        ckpt = Checkpointer(workdir / "checkpoints", max_to_keep=3)
        ckpt.save(step, state, {"epoch": 1})
        if ckpt.latest_step() is not None:
            state, meta = ckpt.restore(abstract_state)   # ShapeDtypeStructs with shardings

    All processes of a multi-host job must call `save` and `restore` (Orbax coordinates the
    writes; arrays are global `jax.Array`s).

    `async_save=True`: `save` returns once the state is in host memory (Orbax copies device
    arrays first; on CPU it holds views, which JAX will not donate) and Orbax writes and
    commits in the background. Every other method (the next `save`, `latest_step`,
    `restore`, `close`, ...) first waits for that write; a failed write raises
    `CheckpointError` from the first of them.
    """

    def __init__(self, directory: str | os.PathLike, *, max_to_keep: int = 3,
                 async_save: bool = False):
        if max_to_keep < 1:
            raise ValueError(f"max_to_keep={max_to_keep}; must be >= 1")
        quiet_orphaned_io()  # a failed read's leftovers may finish before its error is raised
        self.directory = os.path.abspath(os.fspath(directory))
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, create=True, enable_async_checkpointing=async_save
        )
        self._manager = ocp.CheckpointManager(
            self.directory, options=options, item_names=(STATE_ITEM, META_ITEM)
        )

    def latest_step(self) -> int | None:
        """Largest fully written step, or None (unfinished temporary directories are ignored)."""
        self.wait_until_finished()  # an in-flight step is not on disk yet
        self._manager.reload()
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        """All fully written steps, ascending."""
        self.wait_until_finished()
        self._manager.reload()
        return sorted(self._manager.all_steps())

    def save(self, step: int, state: Any, meta: Mapping[str, Any] | None = None,
             *, force: bool = True) -> None:
        """Write `state` (pytree of arrays) and JSON-serialisable `meta` as checkpoint `step`.

        Also stores the tree signature, a checksum of every leaf and of `meta`. Raises
        ValueError for a reserved or non-JSON meta, CheckpointError when the disk is full
        or not writable (the previous checkpoints stay intact). With `async_save`, first
        waits for the previous write (raising its error) and returns before this one is
        written.
        """
        self.wait_until_finished()
        meta = dict(meta or {})
        reserved = [k for k in _RESERVED if k in meta]
        if reserved:
            raise ValueError(f"meta keys {reserved} are reserved")
        try:
            json.dumps(meta)
        except (TypeError, ValueError) as e:
            raise ValueError(f"meta must be JSON-serialisable (numbers, strings, lists, "
                             f"dicts): {e}") from e
        meta[_SIGNATURE_KEY] = tree_signature(state)
        meta[_CHECKSUM_KEY] = tree_checksums(state)
        meta[_META_CHECKSUM_KEY] = _meta_digest(meta)
        try:
            self._manager.save(
                int(step),
                args=ocp.args.Composite(**{STATE_ITEM: ocp.args.StandardSave(state),
                                           META_ITEM: ocp.args.JsonSave(meta)}),
                force=force,
            )
        except Exception as e:
            what = _write_error(e)
            if what is None:
                raise
            raise self._write_failed(int(step), what, e) from e

    def _write_failed(self, step: int, what: str, cause: BaseException) -> CheckpointError:
        quiet_orphaned_io()  # the failed write's other tasks may still finish later
        try:
            kept = self.all_steps()
        except Exception:  # noqa: BLE001 -- only for the message
            kept = "unknown"
        return CheckpointError(
            f"cannot write checkpoint {self._step_dir(step)}: {what} ({cause}). Nothing of "
            f"step {step} was committed; the previous checkpoints (steps {kept}) are intact. "
            f"Fix: free space / fix permissions in {self.directory} and resume the run.")

    def wait_until_finished(self) -> None:
        """Block until an asynchronous save has been committed (a no-op when none is pending).

        Raises CheckpointError when the background write failed, whatever the cause: the
        step was not committed and the previous checkpoints are intact.
        """
        try:
            self._manager.wait_until_finished()
        except Exception as e:  # noqa: BLE001 -- Orbax / TensorStore raise many types
            what = _write_error(e) or f"{type(e).__name__}: {str(e)[:500]}"
            quiet_orphaned_io()
            raise CheckpointError(
                f"an asynchronous checkpoint write to {self.directory} failed: {what}; that "
                "step was not committed and the previous checkpoints are intact. Fix: free "
                f"space / fix permissions in {self.directory} and resume the run.") from e

    def _step_dir(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    def _fail(self, step: int, what: str, cause: BaseException | None = None, *,
              corrupt: bool = False) -> CheckpointError:
        path = self._step_dir(step)
        first = ("" if corrupt else
                 "restore with the model/optimiser config that wrote it, or ")
        msg = (f"cannot restore checkpoint {path}: {what}. Fix: {first}move {path} away "
               f"(training then resumes from the previous step) or point the run at a fresh "
               f"workdir.")
        if cause is not None:
            msg += f" Cause: {type(cause).__name__}: {str(cause)[:500]}"
            quiet_orphaned_io()  # the failed read's other reads may still finish later
        return CheckpointError(msg)

    def restore_meta(self, step: int | None = None) -> dict[str, Any]:
        """The metadata dict of `step` (default latest), without the signature / checksums."""
        self.wait_until_finished()
        step = self._resolve_step(step)
        meta = self._read_meta(step)
        for key in _RESERVED:
            meta.pop(key, None)
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
            raise self._fail(step, f"the item {META_ITEM!r} is not a JSON object", corrupt=True)
        digest = meta.get(_META_CHECKSUM_KEY)
        if digest is not None and digest != _meta_digest(meta):
            raise self._fail(step, f"the item {META_ITEM!r} does not match the checksum "
                                   "written with it (the file is corrupt)", corrupt=True)
        return meta

    def restore(self, target: Any, step: int | None = None) -> tuple[Any, dict[str, Any]]:
        """Restore `(state, meta)` of `step` (default: latest) onto `target`'s structure.

        `target` is a pytree of `jax.ShapeDtypeStruct` (with `.sharding`) or of arrays (their
        shardings are used); the restored arrays get those shardings. Raises CheckpointError
        when the stored tree differs from `target` (listing the differing paths), when any
        file of the step is missing or unreadable, or when restored array data does not
        match the checksum saved with it.
        """
        self.wait_until_finished()
        step = self._resolve_step(step)
        meta = self._read_meta(step)
        meta.pop(_META_CHECKSUM_KEY, None)
        checksums = meta.pop(_CHECKSUM_KEY, None)
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
            raise self._fail(step, f"the item {STATE_ITEM!r} is unreadable or corrupt", e,
                             corrupt=True) from e
        state = restored[STATE_ITEM]
        self._verify(step, state, checksums)
        return state, meta

    def _verify(self, step: int, state: Any, checksums: Mapping[str, Any] | None) -> None:
        if checksums is None:
            _log.warning("checkpoint %s has no checksums (written by an older version): its "
                         "array data is restored unverified", self._step_dir(step))
            return
        actual = tree_checksums(state)
        bad = sorted(k for k, v in actual.items()
                     if checksums.get(k) is not None and v is not None and checksums[k] != v)
        if bad:
            shown = ", ".join(bad[:8]) + (f" and {len(bad) - 8} more" if len(bad) > 8 else "")
            raise self._fail(
                step, f"the array data of {shown} does not match the checksum written with it "
                      "(a corrupted file: disk, copy or transfer error)", corrupt=True)

    def close(self) -> None:
        """Finish pending writes and release Orbax resources (CheckpointError when a
        pending asynchronous write failed; the resources are released either way)."""
        try:
            self.wait_until_finished()
        finally:
            self._manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
