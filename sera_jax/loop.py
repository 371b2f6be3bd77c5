"""The one training loop of the LM studies: resume, fingerprint check, steps, records,
evaluation, checkpoints. RL (`sera_jax.rl.trainer.Trainer`) and SFT (`sera_jax.sft`) are
`Program`s it drives; a study adds what it needs through `Hooks`, never by forking the loop.

    result = loop.run(program, run_dir, fingerprint=fp, resumable=RL_RESUMABLE,
                      schedule=loop.Schedule(num_steps=32, checkpoint_every=8, eval_every=16),
                      hooks=loop.Hooks(evaluate=my_eval))

What one call does, in order:

1. opens `<run_dir>/checkpoints`; when a checkpoint exists, compares its stored
   fingerprint (the whole config that defines the run plus the identity of its starting
   point) with `fingerprint` and refuses -- `CheckpointError` naming every changed field --
   unless only fields under a `resumable` prefix differ; then restores the state;
   It also refuses (`CheckpointError`, before restoring) when `train.jsonl` lacks a record
   of any step up to the checkpoint (deleted, truncated, edited): resuming would leave a
   file that silently starts after the checkpoint. The records are not in the checkpoint,
   so they cannot be restored: put the file back or start over (the message says how).
   A checkpoint beyond the records (a stray `checkpoints/9` in a run recorded to step 4) or
   one whose directory names another step than it stores (renamed) is refused the same way,
   naming it and the fix (move it away);
2. writes `<run_dir>/config.json` (only now: a refused run never overwrites it);
3. drops records after the restored step from `train.jsonl` / `eval.jsonl` (that work is
   redone exactly) and calls `hooks.on_start`;
4. per step: `program.step`, the finite guard (a step with a non-finite loss or gradient
   has not been applied by the program, see `guarded_update`; the loop raises
   `NonFiniteError` naming the step and the last good checkpoint, which is never rotated
   away because nothing is saved after it), one `train.jsonl` record (undefined metrics
   are `null`), TensorBoard scalars (undefined metrics are skipped), a log line every
   `log_every` steps;
5. evaluation (`hooks.evaluate`) every `eval_every` steps and at the end; checkpoints
   every `checkpoint_every` steps, at every evaluation and at the end.

With `schedule.async_checkpoint` a save returns once the state is in host memory and the
write runs while the next steps do. The state being written cannot change under it: Orbax
copies device arrays to the host before `save` returns (on CPU it keeps zero-copy views,
and JAX does not donate a buffer that has one, so a donating step leaves it intact). The
loop waits for the write before the next save (and Orbax's rotation of old steps), before
naming the last good checkpoint of a non-finite step, and before returning; a failed
background write raises `CheckpointError` there.

A step's record that cannot be written (a full disk) stops the run with one
`RecordWriteError` (a `CheckpointError`). When the run fails (a full disk, a non-finite
step, a refused resume), that error is the one raised: closing the checkpointer or the
TensorBoard writer afterwards (both may fail too on a full disk) only logs its own error.
The TensorBoard event file's own failures (its writer thread, its close, tensorboardX's
exit-time cleanup) are one logged line per run, never a traceback (`open_tensorboard`);
scalar names are made legal for TensorBoard first (`tensorboard_tag`: `pass@k` ->
`pass_at_k`).

Logs: the loop's progress lines and the studies' results are absl INFO; the libraries'
INFO chatter (Orbax's ~60 lines per checkpoint, JAX's backend probing) is dropped unless
absl's verbosity flag asks for it (`--verbosity=1` / `-v 1`): `quiet_library_logs`.
Warnings and errors always show.

`stop_after` ends the call after that many steps, as a kill would (tests). Records are
written by process 0 only (`sera_jax.records`); every process must call `run`.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging as std_logging
import math
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import optax
from absl import logging

from sera_jax import checkpoint as ckpt_lib
from sera_jax.records import append_jsonl, read_jsonl, write_json, write_jsonl

TRAIN_RECORDS = "train.jsonl"
EVAL_RECORDS = "eval.jsonl"


class NonFiniteError(RuntimeError):
    """A step produced a non-finite loss, gradient norm or parameters (nothing is saved)."""


class RecordWriteError(ckpt_lib.CheckpointError):
    """A step's record could not be written (a full disk, a read-only workdir): the run
    stops; the last checkpoint is intact and the run resumes from it (a CheckpointError,
    so binaries report it in one line)."""


class Program(Protocol):
    """What the loop drives. `step(state, step)` does update number `step + 1` and returns
    `(new_state, metrics)`; metrics hold floats (None = undefined) and `finite` (0.0 when the
    step was non-finite: not applied, or its parameters overflowed; `guarded_update`)."""

    def init_state(self) -> Any: ...

    def abstract_state(self, state: Any) -> Any: ...

    def step(self, state: Any, step: int) -> tuple[Any, dict[str, float | None]]: ...

    def position(self, state: Any) -> dict[str, int]: ...


@dataclasses.dataclass(frozen=True)
class Schedule:
    """How long and how often: the fields a resume may change (see `RESUMABLE` lists)."""

    num_steps: int
    checkpoint_every: int = 0  # 0 = only at evaluations and at the end
    eval_every: int = 0  # 0 = only at the end (when hooks.evaluate is set)
    max_to_keep: int = 3
    log_every: int = 10
    #: Write checkpoints in the background (Orbax async): `save` returns once the state is
    #: on the host and the next step runs during the write; see `run`.
    async_checkpoint: bool = False


@dataclasses.dataclass
class Hooks:
    """Study-specific additions.

    on_start(step, state): after resume and record truncation (e.g. the step-0 evaluation).
    record(step, metrics) -> dict: extra fields of the step's train record.
    evaluate(step, state, final) -> scalars | None: evaluation at eval steps; the scalars go
      to TensorBoard under `eval/` (the hook writes its own records).
    log_keys: metric names shown in the periodic log line.
    """

    on_start: Callable[[int, Any], None] | None = None
    record: Callable[[int, dict], dict] | None = None
    evaluate: Callable[[int, Any, bool], Mapping[str, float] | None] | None = None
    log_keys: Sequence[str] = ("loss", "grad_norm", "reward_mean", "kappa_min", "step_time")


@dataclasses.dataclass
class Result:
    state: Any
    step: int
    resumed_from: int | None
    seconds: float


# ----------------------------------------------------------------------------- finite guard


def all_finite(tree: Any) -> jax.Array:
    """bool[]: every element of every leaf of `tree` is finite."""
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.bool_(True)


def guarded_update(tx: optax.GradientTransformation, params: Any, opt_state: Any,
                   loss: jax.Array, grads: Any, *, step: Callable | None = None,
                   grad_clip: float | None = None) -> tuple[Any, Any, dict[str, jax.Array]]:
    """One optimiser update that is applied only when it is finite (inside jit).

    The update is applied iff `isfinite(loss) & isfinite(‖g‖)`; otherwise the returned
    params and optimiser state are the inputs, unchanged. The metric `finite` (0 or 1) is
    that condition `& all(isfinite(params'))`; on `finite = 0` the loop stops the run
    before it saves anything, instead of training (or checkpointing) NaN.

    Why the new parameters are checked after the decision, not before it: a finite ‖g‖
    means every gradient (and its square) is finite, so the moments and AdamW's direction
    are finite (eps > 0) and the new parameters can only be non-finite by float overflow
    (a huge learning rate: lr = 1e20 with weight decay multiplies them by 1 - 1e18 a step);
    that case still gives `finite = 0`, but the returned parameters are the overflowed ones
    (the loop saves nothing of them). Deciding on the gradient lets XLA fuse the select
    into the update (one pass over parameters and moments); deciding on the new parameters
    materialises them and selects again (a dead SmolLM2-135M train step on one CPU core:
    0.97 s that way, 0.71 s this way).

    `step`: an optimiser step that returns the new parameters and state itself, applying
    them only where `apply` (e.g. `trainer.fused_adamw_step`, the same numbers as `tx`);
    None = `tx.update` + `optax.apply_updates`.

    Metrics: `loss`, `grad_norm` = ‖g‖ (before any clipping), `param_norm` = ‖θ'‖,
    `update_norm` = ‖θ' − θ‖ (global L2 norm of the change actually applied, in float32;
    0 when the update is not applied), `finite`; with `grad_clip` (the optimiser's
    global-norm clip, 0 = off) also `clipped` = 1 if grad_clip > 0 and ‖g‖ > grad_clip else
    0. The cost of `update_norm`: θ and θ' must both be live for the subtraction, and
    XLA:CPU does not fuse a reduction into the in-place update loop, so on a donated step
    (the trainer's fused AdamW) it keeps a copy of θ: measured on the fused update alone,
    +32 MB of temporaries at 8M float32 parameters, and at 135M the moments' buffers
    too (+410 MB); the norm summed inside the update loop, the update recomputed before or
    after the step, with or without optimisation barriers, all measured the same or worse.
    Small next to a train step's forward and backward (the maze policies: 0.5M / 3.9M
    parameters); optax's path already holds θ and θ'.
    """
    grad_norm = optax.global_norm(grads)
    apply = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    old = params
    if step is not None:  # `(params, opt_state) = step(params, opt_state, grads, apply)`
        params, opt_state = step(params, opt_state, grads, apply)
    else:
        keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(apply, a, b), new, old)  # noqa: E731
        updates, new_opt_state = tx.update(grads, opt_state, params)
        params = keep(optax.apply_updates(params, updates), params)
        opt_state = keep(new_opt_state, opt_state)
    finite = apply & all_finite(params)
    delta = jax.tree.map(lambda a, b: a.astype(jnp.float32) - b.astype(jnp.float32), params, old)
    metrics = {"loss": loss, "grad_norm": grad_norm, "param_norm": optax.global_norm(params),
               "update_norm": jnp.where(apply, optax.global_norm(delta), 0.0),
               "finite": finite.astype(jnp.float32)}
    if grad_clip is not None:
        metrics["clipped"] = ((grad_clip > 0) & (grad_norm > grad_clip)).astype(jnp.float32)
    return params, opt_state, metrics


# ----------------------------------------------------------------------------- fingerprints


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, Mapping):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: tree}


def canonical(tree: Any) -> Any:
    """The JSON round trip of `tree` (tuples -> lists, ConfigDicts -> dicts), as stored."""
    if hasattr(tree, "to_dict"):
        tree = tree.to_dict()
    return json.loads(json.dumps(tree, default=lambda x: x.to_dict() if hasattr(x, "to_dict")
                                 else str(x)))


_ANY = object()  # trim_fields: drop the field whatever its value


def trim_fields(tree: Mapping[str, Any], omit: Sequence[str] = (),
                defaults: Mapping[str, Any] | None = None) -> dict:
    """A copy of the nested dict `tree` without the dotted fields `omit` and without those of
    `defaults` whose value equals the default given there.

    Why: an option added after runs were started would otherwise change their fingerprints
    (refusing their resume, recomputing their cached evaluations) although at its default
    it changes nothing; an option that never changes results belongs in no fingerprint.
    """
    out = copy.deepcopy(canonical(tree))

    def pop(path: str, only_if: Any = _ANY) -> None:
        *parents, last = path.split(".")
        node = out
        for key in parents:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict) and last in node and (only_if is _ANY
                                                        or node[last] == only_if):
            del node[last]

    for path in omit:
        pop(path)
    for path, default in (defaults or {}).items():
        pop(path, default)
    return out


def changed_fields(stored: Mapping, current: Mapping, resumable: Sequence[str] = ()
                   ) -> list[str]:
    """Dotted paths whose values differ between two fingerprints, except under `resumable`
    prefixes (`"rl.num_steps"` covers exactly that field, `"eval.every"` likewise)."""
    a, b = _flatten(canonical(stored)), _flatten(canonical(current))
    free = lambda k: any(k == r or k.startswith(r + ".") for r in resumable)  # noqa: E731
    return sorted(k for k in set(a) | set(b) if not free(k) and a.get(k) != b.get(k))


def check_fingerprint(stored: Mapping | None, current: Mapping, resumable: Sequence[str],
                      directory: str) -> None:
    """Refuse to resume `directory` under a fingerprint that differs outside `resumable`."""
    if stored is None:
        raise ckpt_lib.CheckpointError(
            f"the checkpoint in {directory} stores no experiment fingerprint, so it cannot be "
            "checked against this run; start the run in a new workdir")
    changed = changed_fields(stored, current, resumable)
    if changed:
        a, b = _flatten(canonical(stored)), _flatten(canonical(current))
        shown = "; ".join(f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in changed[:12])
        more = f"; ... {len(changed) - 12} more" if len(changed) > 12 else ""
        raise ckpt_lib.CheckpointError(
            f"refusing to resume {directory}: it belongs to a different experiment ({shown}"
            f"{more}). Resume with the original values, or run the changed experiment in a new "
            f"workdir. Fields that may change on resume: {', '.join(resumable) or 'none'}.")


# ----------------------------------------------------------------------------- logs

#: Packages whose INFO / DEBUG records are dropped unless absl's verbosity is >= 1 (DEBUG).
QUIET_LIBRARIES = ("orbax", "jax", "jaxlib", "etils", "tensorstore", "absl")


class _QuietLibraries(std_logging.Filter):
    """Drops library records below WARNING unless `--verbosity` >= 1 (read at log time, so
    it follows the flag parsed after import). Orbax logs through absl's logger, so a
    record's library is read from its source path, not its logger name."""

    _parts = tuple(f"{os.sep}{name}{os.sep}" for name in QUIET_LIBRARIES)

    def filter(self, record: std_logging.LogRecord) -> bool:
        if record.levelno >= std_logging.WARNING or logging.get_verbosity() >= logging.DEBUG:
            return True
        path = record.pathname or ""
        installed = "site-packages" in path or "dist-packages" in path  # not our own files
        return not (installed and any(part in path for part in self._parts))


_QUIET = _QuietLibraries()


def quiet_library_logs() -> None:
    """Install the library filter (idempotent) on absl's handler and the root logger's
    handlers: what a run prints is its progress, results and every warning."""
    handlers = [logging.get_absl_handler(), *std_logging.getLogger().handlers]
    for handler in handlers:
        if _QUIET not in handler.filters:
            handler.addFilter(_QUIET)


quiet_library_logs()  # at import too: JAX probes its backends before the first `run`


# ----------------------------------------------------------------------------- records


def check_records_complete(run_dir: str, step: int, checkpoint: str | None = None) -> None:
    """Raise CheckpointError unless `<run_dir>/train.jsonl` holds a record of every step
    1..`step` (a resume from `step` must not silently lose or re-number them). When the
    records are whole but end before `step`, the checkpoint (`checkpoint`, its directory) is
    named as beyond them: a stray copy or a renamed directory, to move away. Process 0 reads
    the file (only it writes records); every process gets its verdict."""
    from jax.experimental import multihost_utils

    path = os.path.join(run_dir, TRAIN_RECORDS)
    missing, whole = [], 0  # whole: records 1..whole are all there
    if jax.process_index() == 0:
        have = {r.get("step") for r in read_jsonl(path)}
        missing = [s for s in range(1, step + 1) if s not in have]
        whole = missing[0] - 1 if missing else step
    verdict = multihost_utils.broadcast_one_to_all(
        jnp.asarray([len(missing), missing[0] if missing else 0, os.path.exists(path), whole],
                    jnp.int32))
    count, first, exists, whole = (int(v) for v in verdict)
    if count and whole >= 1 and count == step - whole and checkpoint is not None:
        raise ckpt_lib.CheckpointError(
            f"refusing to resume {run_dir} from checkpoint {checkpoint}: its step {step} is "
            f"beyond the run's records ({path} ends at step {whole}), so it is not from this "
            f"run's history (a copied or renamed checkpoint). Move {checkpoint} away and run "
            "again (the run resumes from its previous checkpoint), or put the missing records "
            "back.")
    if count:
        what = (f"{path} does not exist" if not exists else
                f"{path} lacks the records of {count} of steps 1..{step} (first: step {first})")
        raise ckpt_lib.CheckpointError(
            f"refusing to resume {run_dir} from its step-{step} checkpoint: {what}, so the "
            "run's records would silently start after the checkpoint (records are not stored "
            "in checkpoints and cannot be rebuilt). Put the file back (e.g. from a backup), or "
            f"start over: move {os.path.join(run_dir, 'checkpoints')} away, or use a new "
            "workdir.")


def check_checkpoint_step(run_dir: str, checkpoint: str, step: int, stored_step: int) -> None:
    """Raise CheckpointError when the checkpoint directory `checkpoint` (step `step`) stores
    another step (`stored_step`, from its meta): it was renamed or copied, and resuming from
    it would save later steps over the run's own checkpoints."""
    if stored_step != step:
        raise ckpt_lib.CheckpointError(
            f"refusing to resume {run_dir} from checkpoint {checkpoint}: it holds step "
            f"{stored_step}, not {step} (the directory was renamed or copied). Move it away "
            "and run again (the run resumes from its previous checkpoint), or rename it back "
            f"to {stored_step}.")


def truncate_records(path: str, max_step: int) -> list[dict]:
    """Keep the records with step <= max_step (work after the last checkpoint is redone)."""
    records = [r for r in read_jsonl(path) if r.get("step", 0) <= max_step]
    if os.path.exists(path):
        write_jsonl(path, records)
    return records


def defined(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The metrics that are defined numbers (None and NaN dropped): TensorBoard's scalars."""
    return {k: float(v) for k, v in metrics.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)}


_BAD_TAG_CHARS = re.compile(r"[^-/\w.]")


def tensorboard_tag(name: str) -> str:
    """A summary name TensorBoard accepts: `@` -> `_at_` (`eval/pass@k` -> `eval/pass_at_k`),
    any other character outside `[-/\\w.]` -> `_`, no leading `/`. tensorboardX renames
    such names itself, with one INFO line each (16 of a tiny RL run's 28 console lines)."""
    return _BAD_TAG_CHARS.sub("_", name.replace("@", "_at_")).lstrip("/")


class _GuardedEvents:
    """tensorboardX's event-file writer whose `write_event` / `flush` / `close` failures (a
    full disk: OSError ENOSPC) are logged once, in one line, and later calls do nothing.

    Why: tensorboardX calls these from its writer thread and from an `atexit` cleanup, where
    an exception prints a raw traceback (two after a full disk, after the run's own one-line
    error); the run's records are in train.jsonl, TensorBoard only shows them.
    """

    def __init__(self, events: Any, logdir: str):
        self._events, self._logdir, self.failed = events, logdir, False

    def _call(self, method: str, *args: Any) -> Any:
        if self.failed and method != "close":
            return None
        try:
            return getattr(self._events, method)(*args)
        except Exception as e:  # noqa: BLE001 -- a view of the records must not stop a run
            if not self.failed:
                self.failed = True
                logging.error("%s: the TensorBoard writer failed (%s); no more scalars are "
                              "written there (train.jsonl keeps every record)", self._logdir,
                              e.strerror if isinstance(e, OSError) and e.strerror else e)
            return None

    def write_event(self, event: Any) -> None:
        self._call("write_event", event)

    def flush(self) -> bool:
        self._call("flush")
        return True

    def close(self) -> bool:
        self._call("close")  # after a failure too: it releases the file
        return True


def open_tensorboard(logdir: str) -> Any:
    """A tensorboardX `SummaryWriter` on `logdir` whose `add_scalar` names go through
    `tensorboard_tag`, and whose event-file failures (a full disk) are one logged line, never
    an exception or a traceback at exit (`_GuardedEvents`)."""
    from tensorboardX import SummaryWriter

    class Writer(SummaryWriter):
        def add_scalar(self, tag: str, *args: Any, **kwargs: Any) -> None:
            super().add_scalar(tensorboard_tag(tag), *args, **kwargs)

    writer = Writer(logdir)
    # tensorboardX 2.6: SummaryWriter -> FileWriter -> EventFileWriter, whose writer thread
    # and atexit cleanup both reach the events writer: wrap it for both.
    events = writer._get_file_writer().event_writer
    guarded = _GuardedEvents(events._ev_writer, logdir)
    events._ev_writer = guarded
    events._worker._record_writer = guarded
    return writer


class MetricWriter:
    """TensorBoard scalars (tensorboardX, process 0 only) plus a periodic log line.

    The writer is `open_tensorboard`'s: legal scalar names, and a failing event file (a
    full disk) is one logged line, never an exception or a traceback at exit.
    """

    def __init__(self, logdir: str | None, log_every: int, log_keys: Sequence[str] = ()):
        self.log_every, self.log_keys = max(int(log_every), 1), tuple(log_keys)
        self._writer = None
        if logdir and jax.process_index() == 0:
            self._writer = open_tensorboard(logdir)

    def write(self, step: int, metrics: Mapping[str, Any], log: bool = True) -> None:
        scalars = defined(metrics)
        if self._writer is not None:
            for name, value in scalars.items():
                self._writer.add_scalar(name, value, step)
        if log and (step % self.log_every == 0 or step == 1):
            logging.info("step %d | %s", step, " ".join(
                f"{k}={scalars[k]:.4g}" for k in self.log_keys if k in scalars))

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


# ----------------------------------------------------------------------------- the loop


def _write_record(run_dir: str, step: int, record: dict, writer: MetricWriter,
                  metrics: Mapping[str, Any]) -> None:
    """The step's `train.jsonl` record and TensorBoard scalars; an OSError (ENOSPC, EROFS)
    becomes one RecordWriteError naming the file and the fix."""
    path = os.path.join(run_dir, TRAIN_RECORDS)
    try:
        append_jsonl(path, record)
        writer.write(step, metrics)
    except OSError as e:
        raise RecordWriteError(
            f"{run_dir}: cannot write the record of step {step} to {path} or TensorBoard "
            f"({e.strerror or e}): free disk space (or fix the workdir's permissions) and run "
            "again: the run resumes from its last checkpoint") from None


def _close_quietly(run_dir: str, what: str, close: Callable[[], None] | None) -> None:
    """`close()`, logging instead of raising: an error is already propagating."""
    try:
        if close is not None:
            close()
    except Exception as e:  # noqa: BLE001
        logging.error("%s: closing the %s failed too: %s", run_dir, what, e)



def run(program: Program, run_dir: str, *, fingerprint: Mapping[str, Any],
        resumable: Sequence[str], schedule: Schedule, hooks: Hooks | None = None,
        config_json: Mapping[str, Any] | None = None, stop_after: int | None = None
        ) -> Result:
    """Train `program` to `schedule.num_steps` in `run_dir`, resuming (see the module doc)."""
    hooks = hooks or Hooks()
    quiet_library_logs()
    t0 = time.perf_counter()
    os.makedirs(run_dir, exist_ok=True)
    ckpt = ckpt_lib.Checkpointer(os.path.join(run_dir, "checkpoints"),
                                 max_to_keep=schedule.max_to_keep,
                                 async_save=schedule.async_checkpoint)
    writer = None
    try:
        state = program.init_state()
        step, resumed_from = 0, ckpt.latest_step()
        if resumed_from is not None:
            meta = ckpt.restore_meta(resumed_from)
            check_fingerprint(meta.get("fingerprint"), fingerprint, resumable, ckpt.directory)
            # The directory's step, not the meta's: a stray `checkpoints/9` is the latest.
            where = os.path.join(ckpt.directory, str(resumed_from))
            check_records_complete(run_dir, resumed_from, where)
            check_checkpoint_step(run_dir, where, resumed_from,
                                  int(meta.get("step", resumed_from)))
            state, meta = ckpt.restore(program.abstract_state(state), resumed_from)
            step = int(meta["step"])
            logging.info("%s: resumed at step %d", run_dir, step)
        write_json(os.path.join(run_dir, "config.json"),
                   canonical(config_json if config_json is not None else fingerprint))
        for name in (TRAIN_RECORDS, EVAL_RECORDS):
            truncate_records(os.path.join(run_dir, name), step)
        if hooks.on_start is not None:
            hooks.on_start(step, state)
        writer = MetricWriter(os.path.join(run_dir, "tensorboard"), schedule.log_every,
                              hooks.log_keys)
        done_here = 0
        while step < schedule.num_steps and (stop_after is None or done_here < stop_after):
            t_step = time.perf_counter()
            state, metrics = program.step(state, step)
            if metrics.get("finite", 1.0) != 1.0:
                last = ckpt.latest_step()  # waits for an in-flight write: a committed step
                if last is not None:
                    where = (f"the last good checkpoint is "
                             f"{os.path.join(ckpt.directory, str(last))}")
                    again = "the run resumes from that checkpoint"
                else:
                    where = "there is no checkpoint yet"
                    again = "the run starts again from step 0"

                loss, grad_norm = metrics.get("loss"), metrics.get("grad_norm")
                known = [v for v in (loss, grad_norm) if isinstance(v, float)]
                if len(known) < 2:  # a program that does not report both
                    what = "was not applied: non-finite loss, gradient or parameters"
                elif all(math.isfinite(v) for v in known):
                    what = "made the parameters non-finite (float overflow) and is not saved"
                else:
                    what = "was not applied: non-finite loss or gradient"
                raise NonFiniteError(
                    f"{run_dir}: step {step + 1} {what} (loss={loss}, grad_norm={grad_norm}); "
                    f"{where}. Lower the learning rate (or check the data) and run again: "
                    f"{again}.")
            step += 1
            done_here += 1
            metrics = {**metrics, "loop_step_time": time.perf_counter() - t_step}
            record = {"step": step, **(hooks.record(step, metrics) if hooks.record else {}),
                      **{k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                         for k, v in metrics.items()}}
            _write_record(run_dir, step, record, writer, metrics)
            final = step == schedule.num_steps
            at_eval = final or bool(schedule.eval_every and step % schedule.eval_every == 0)
            if at_eval and hooks.evaluate is not None:
                scalars = hooks.evaluate(step, state, final)
                if scalars:
                    writer.write(step, {f"eval/{k}": v for k, v in scalars.items()}, log=False)
            if final or at_eval or (schedule.checkpoint_every
                                    and step % schedule.checkpoint_every == 0):
                ckpt.save(step, state, {"step": step, **program.position(state),
                                        "fingerprint": canonical(fingerprint)})
        ckpt.wait_until_finished()  # the last write is committed (or fails) before we return
    except BaseException:
        # The error propagating is the one to read: closing the checkpointer (a failing
        # background write) or the writer (its flush on the same full disk) only logs.
        _close_quietly(run_dir, "checkpointer", ckpt.close)
        _close_quietly(run_dir, "TensorBoard writer", writer and writer.close)
        raise
    else:
        try:
            ckpt.close()
        except BaseException:
            _close_quietly(run_dir, "TensorBoard writer", writer and writer.close)
            raise
        if writer is not None:
            writer.close()
    return Result(state=state, step=step, resumed_from=resumed_from,
                  seconds=time.perf_counter() - t0)


__all__ = ["EVAL_RECORDS", "TRAIN_RECORDS", "Hooks", "MetricWriter", "NonFiniteError",
           "RecordWriteError",
           "Program", "Result", "Schedule", "canonical", "changed_fields",
           "check_checkpoint_step", "check_fingerprint", "check_records_complete", "defined",
           "guarded_update", "open_tensorboard", "quiet_library_logs", "run", "tensorboard_tag",
           "truncate_records"]
