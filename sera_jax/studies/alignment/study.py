"""The gradient-alignment study (SERA_SPEC §7): measure mode and train mode, with outputs.

* `run_measure(config, workdir)` — train a classifier with cross-entropy (`config.sft`) and
  snapshot it at `config.measure.stage_steps` (so p goes from near-uniform to heavily skewed);
  for each snapshot, budget N0 and method of `config.compare.methods`, R paired draws (the
  same PRNG key for every allocator at a given draw; rollout j of image q has its own key, so
  methods share each image's first rollouts) of the allocated MaxRL gradient, each compared
  with the exact gradient of the mean CE on the same fixed minibatch. A two-stage method
  (`sera_sequential`) draws its pilot -- rollouts 0..m−1 of every image with the draw's key --
  then is allocated per draw from the pilot's successes, and its gradient uses all N_q
  rollouts (pilot included) with the weights N0/N_q of the realised counts
  (`alignment.allocate_batch(..., pilot_successes=)`). Writes `alignment.csv`,
  `alignment.png` (one panel per stage), TensorBoard scalars and `summary.md` (also returned
  and printed by the binary). Resumable: each (stage, budget) unit is stored in `units/`
  when it finishes, and a re-run skips the stored units (with every unit stored, also the CE
  training); a re-run under another measurement config is refused (`measure_fingerprint`).
* `run_train(config, workdir)` — train with the RL loss of one method (`config.rl`: the
  published protocol) and log every `rl.log_every` steps the cosine to the exact gradient on
  that step's minibatch, CE / top-1 on the minibatch and on validation, and analytic pass@k
  on validation (`config.eval`). One-shot methods only (a two-stage method is refused by
  `validate`). Writes `train_log.csv`, TensorBoard scalars and `summary.md`. Not resumable:
  a re-run trains again from step 0.

Both run data-parallel over all local devices: the batch is sharded over the mesh's batch
axes (`sera_jax.sharding`), parameters are replicated, and `jax.jit` partitions the rest.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging

from sera_jax import loop, optim, sharding, validation
from sera_jax import methods as methods_lib
from sera_jax.records import read_json, write_json
from sera_jax.rl import config as rl_config
from sera_jax.studies import common
from sera_jax.studies.alignment import data as data_lib
from sera_jax.studies.alignment import gradients as alignment
from sera_jax.studies.alignment import resnet
from sera_jax.studies.alignment.report import aggregate, plot_alignment, summary_markdown, write_csv
from sera_jax.studies.alignment.train import Steps, TrainState, init_state

#: Fields the study's configs moved to the one schema (old dotted path -> new one). The old
#: `batch_size` and `optim.*` served both modes; they now name measure mode's CE training
#: (`sft.*`), and train mode reads `rl.prompts_per_step` and `rl.optimizer.*`.
RENAMED = {
    "mesh": "rl.mesh",
    "allocation": "rl.allocation",
    "batch_size": "sft.batch_size",
    "optim.lr": "sft.optimizer.learning_rate",
    **{f"optim.{k}": f"sft.optimizer.{k}" for k in ("momentum", "weight_decay",
                                                     "warmup_steps")},
    "measure.methods": "compare.methods",
    "measure.batch_size": "measure.prompts_per_step",
    "train.method": "rl.method",
    "train.n0": "rl.rollouts_per_prompt",
    "train.num_steps": "rl.num_steps",
    "train.log_every": "rl.log_every",
    "train.eval_batch_size": "eval.batch_size",
    "train.eval_batches": "eval.num_batches",
    "train.pass_ks": "eval.ks",
}
common.RENAMED.update(RENAMED)

CSV_COLUMNS = ("stage", "stage_step", "budget", "method", "draw", "seed", "cosine",
               "norm_ratio", "cosine_expected", "kappa_min", "kappa_mean", "active_frac")

# ----------------------------------------------------------------------------- set-up


def build_model(config: ml_collections.ConfigDict, dtype: str | None = None) -> resnet.ResNet:
    """The ResNet named by `config.model.name` (a key of `resnet.CONFIGS`), computing in
    `dtype` (default `config.model.dtype`); its parameters are float32 either way."""
    m = config.model
    if m.name not in resnet.CONFIGS:
        raise ValueError(f"config.model.name={m.name!r}; allowed {sorted(resnet.CONFIGS)}")
    kwargs = {"num_classes": m.num_classes}
    if m.name == "digits_resnet":
        kwargs.update(width=m.get("width", 16), stage_sizes=tuple(m.get("stage_sizes", (1, 1, 1))))
    cfg = resnet.CONFIGS[m.name](**kwargs)
    dtype = dtype or m.get("dtype", "float32")
    if dtype != cfg.dtype:
        cfg = dataclasses.replace(cfg, dtype=dtype)
    return resnet.make_resnet(cfg, seed=config.seed)


@dataclasses.dataclass
class DataSource:
    """Batches for one study: `train()` endless shuffled batches; `eval()` one pass over the
    validation split; `measure(n)` one fixed, deterministic batch of n images."""

    config: ml_collections.ConfigDict
    batch_size: int

    def __post_init__(self):
        d = self.config.data
        if d.name not in ("digits", "imagenet2012"):
            raise ValueError(f"config.data.name={d.name!r}; allowed 'digits' or 'imagenet2012'")
        if d.name == "digits":
            self._train = data_lib.load_digits_split("train", val_fraction=d.val_fraction,
                                                     seed=d.split_seed)
            self._val = data_lib.load_digits_split("val", val_fraction=d.val_fraction,
                                                   seed=d.split_seed)

    def _imagenet(self, split: str, batch: int, train: bool, seed: int) -> Iterator:
        d = self.config.data
        return data_lib.imagenet_dataset(
            split, batch, train=train, seed=seed, data_dir=d.data_dir or None,
            manual_dir=d.manual_dir or None, prepare=d.prepare, image_size=d.image_size,
            shuffle_buffer=d.shuffle_buffer)

    def train(self, seed: int) -> Iterator[data_lib.Batch]:
        if self.config.data.name == "digits":
            return data_lib.array_batches(self._train, self.batch_size, seed=seed)
        return self._imagenet(self.config.data.train_split, self.batch_size, True, seed)

    def eval(self, batch_size: int, max_batches: int) -> Iterator[data_lib.Batch]:
        if self.config.data.name == "digits":
            it = data_lib.array_batches(self._val, min(batch_size, len(self._val)), seed=0,
                                        shuffle=False)
            n = len(self._val) // min(batch_size, len(self._val))
        else:
            it = self._imagenet(self.config.data.eval_split, batch_size, False, 0)
            n = None
        for i, b in enumerate(it):
            if (n is not None and i >= n) or (max_batches > 0 and i >= max_batches):
                return
            yield b

    def measure(self, n: int, split: str, seed: int) -> data_lib.Batch:
        if self.config.data.name == "digits":
            src = self._train if split == "train" else self._val
            if not 1 <= n <= len(src):
                raise ValueError(f"config.measure.prompts_per_step={n}; allowed 1..{len(src)} for "
                                 f"the digits {split} split")
            idx = np.sort(np.random.default_rng(seed).choice(len(src), n, replace=False))
            return {"image": src.images[idx], "label": src.labels[idx]}
        d = self.config.data
        tfds_split = d.train_split if split == "train" else d.eval_split
        return next(self._imagenet(tfds_split, n, False, seed))


def _mesh(config: ml_collections.ConfigDict):
    return sharding.make_mesh(dict(config.rl.mesh))


def _check_divisible(name: str, n: int, mesh) -> None:
    d = sharding.batch_divisor(mesh)
    if n % d:
        raise ValueError(f"{name}={n} must be a multiple of the {d} data-parallel devices "
                         f"(mesh {dict(mesh.shape)}); change it or --config.rl.mesh.data")


def _capped(block: ml_collections.ConfigDict, num_steps: int) -> dict[str, Any]:
    """The optimiser block with its warmup capped at num_steps − 1 (a short run, e.g. to a
    snapshot at step 5, keeps a cosine tail); `optim.make_optimizer(_capped(b, n), n)`."""
    return {**dict(block), "warmup_steps": min(block.warmup_steps, num_steps - 1)}


def _ce_steps(config: ml_collections.ConfigDict) -> int:
    """Length of measure mode's CE run: to the last snapshot (at least 1 step)."""
    return max(max(int(s) for s in config.measure.stage_steps), 1)


def _writer(workdir: str):
    # Legal tag names (`val_pass@1`), and a full disk is one logged line, not a traceback.
    return loop.open_tensorboard(os.path.join(workdir, "tensorboard"))


def _train_ce(steps: Steps, state: TrainState, batches: Iterator, mesh, num_steps: int,
              log_every: int = 50) -> TrainState:
    for i in range(num_steps):
        b = sharding.shard_batch(next(batches), mesh)
        state, m = steps.ce_step(state, b["image"], b["label"])
        if log_every and (i + 1) % log_every == 0:
            logging.info("CE pre-training step %d: ce %.4f top1 %.3f", int(state.step),
                         float(m["ce"]), float(m["top1"]))
    return state


#: Dtypes of measure mode's CE training (`config.sft.dtype`).
SFT_DTYPES = ("float32", "float64")


def _sft_dtype(config: ml_collections.ConfigDict) -> str:
    return config.sft.get("dtype", "float32")


def _cast_like(tree: Any, dtype: Any = None, like: Any = None) -> Any:
    """Floating leaves of `tree` cast to `dtype`, or to the dtypes of `like`'s leaves."""
    if like is not None:
        return jax.tree.map(lambda x, r: x.astype(r.dtype), tree, like)
    return jax.tree.map(
        lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def ce_snapshots(config: ml_collections.ConfigDict, source: DataSource, mesh
                 ) -> Iterator[tuple[Any, Any, Any]]:
    """Measure mode's CE training (`config.sft`), snapshot by snapshot: for each step of
    `config.measure.stage_steps`, `(graphdef, params, batch_stats)` of the measured model
    (`config.model`: its compute dtype, float32 parameters and statistics).

    `config.sft.dtype = "float64"` trains in float64 -- parameters, BatchNorm statistics,
    optimiser state and compute, under `jax.enable_x64` for the training segments only --
    from the float32 initial parameters, and rounds every snapshot to float32. Why: CE
    training amplifies rounding differences, and XLA's CPU kernels round differently on
    different processors. Two float32 runs of the digits default whose parameters start one
    ulp apart have logits up to 1.2 apart after 100 of the 300 steps (1 − p of an image
    moves by a median 18 %, so the well-trained stage is another model, with other
    allocations and other rollout failures: its cells moved by up to 2 se). In float64 the
    same experiment ends ~1e-14 apart, and with the parameters nudged by a float64 ulp before
    every step the float32 snapshots are bit-identical
    (`tests/studies/alignment/test_reproducible.py`; docs/results_alignment.md). "float32"
    trains the measured model as it is (`config.model.dtype` compute).
    """
    dtype = _sft_dtype(config)
    total = _ce_steps(config)
    tx = optim.make_optimizer(_capped(config.sft.optimizer, total), total)
    graphdef, params, batch_stats = resnet.split_model(build_model(config))
    train_graphdef = graphdef
    if dtype != "float32":
        train_graphdef, _, _ = resnet.split_model(build_model(config, dtype))
    x64 = functools.partial(jax.enable_x64, True) if dtype == "float64" else (
        contextlib.nullcontext)
    with x64():
        p0, s0 = _cast_like(params, dtype), _cast_like(batch_stats, dtype)
        state = sharding.replicate(TrainState(params=p0, batch_stats=s0, opt_state=tx.init(p0),
                                              step=jnp.zeros((), jnp.int32)), mesh)
    steps = Steps(train_graphdef, tx)
    batches = source.train(config.seed)
    done = 0
    for step in (int(s) for s in config.measure.stage_steps):
        with x64():  # the training segment only: nothing after the yield runs under x64
            state = _train_ce(steps, state, batches, mesh, step - done)
            snap = (_cast_like(state.params, like=params),
                    _cast_like(state.batch_stats, like=batch_stats))
        done = step
        yield (graphdef,) + snap


# ----------------------------------------------------------------------------- measure


@functools.cache
def _cotangent_fn(n0: int):
    """jit(vmap): (keys [M], logits, labels, counts [M,P], weights [M,P]) -> [M, P, C]."""
    one = functools.partial(alignment.maxrl_logit_cotangent, n0=n0)
    return jax.jit(jax.vmap(one, in_axes=(0, None, None, 0, 0)))


def _cotangents(n0: int, chunk: int, keys, logits, labels, counts, weights) -> jax.Array:
    """All M cotangents, `chunk` at a time (zero-padded last chunk: one compilation per n0)."""
    fn, m, out = _cotangent_fn(n0), counts.shape[0], []
    for i in range(0, m, chunk):
        k, c, w = keys[i:i + chunk], counts[i:i + chunk], weights[i:i + chunk]
        pad = chunk - c.shape[0]
        if pad:
            k = jnp.concatenate([k, jnp.repeat(k[:1], pad, axis=0)])
            c = np.concatenate([c, c[:1].repeat(pad, 0)])
            w = np.concatenate([w, w[:1].repeat(pad, 0)])
        out.append(fn(k, logits, labels, c, w)[:chunk - pad])
    return jnp.concatenate(out)


@functools.cache
def _linearize_fn(graphdef, bn_train: bool):
    """jit: (params, batch_stats, images) -> (logits, pullback of the logits at params)."""

    def fwd(params, batch_stats, images):
        return jax.vjp(lambda prm: resnet.apply_model(graphdef, prm, batch_stats, images,
                                                      train=bn_train)[0], params)

    return jax.jit(fwd)


def _allocate(name: str, p: np.ndarray, n0: int, draw_keys: jax.Array, logits: jax.Array,
              labels: jax.Array, al: ml_collections.ConfigDict) -> alignment.AllocatedBatch:
    """Method `name`'s allocation of the measure batch: one for every draw, or -- for a
    two-stage method -- one per draw after that draw's pilot (rollouts 0..m−1 of every
    image, drawn with the draw's key, so they are the first rollouts the cotangent uses)."""
    method = methods_lib.get_method(name)
    pilot = None
    if method.two_stage:
        pilot = alignment.pilot_successes(draw_keys, logits, labels,
                                          method.pilot_size(al.n_min))
    return alignment.allocate_batch(name, p, n0, n_min=al.n_min, n_max=al.n_max,
                                    threshold=al.threshold, shift=al.shift,
                                    pilot_successes=pilot)


#: Measure-mode fields a resumed run may change: budgets are separate units (a new budget
#: is computed, a stored one reused); the rest of `measure_fingerprint` must match.
MEASURE_RESUMABLE = ("measure.budgets",)
#: Bump when a change to the code changes what a stored unit holds.
UNITS_VERSION = 1


def measure_fingerprint(config: ml_collections.ConfigDict) -> dict[str, Any]:
    """Everything measure mode's numbers depend on: seed, data, model, the CE training, the
    allocation bounds, the mesh, the measurement block and the methods (not train mode's
    `rl.*` fields, `eval.*` or `name`). Stored in `units/fingerprint.json`."""
    return loop.canonical({
        "version": UNITS_VERSION, "seed": config.seed, "data": config.data,
        "model": config.model, "sft": config.sft, "allocation": config.rl.allocation,
        "mesh": config.rl.mesh, "measure": config.measure,
        "methods": list(config.compare.methods)})


def _units_dir(workdir: str, config: ml_collections.ConfigDict) -> str:
    """`<workdir>/units`, made and stamped with `measure_fingerprint(config)`; a stamp of
    another measurement is refused (CheckpointError naming every changed field)."""
    units = os.path.join(workdir, "units")
    os.makedirs(units, exist_ok=True)
    path, fp = os.path.join(units, "fingerprint.json"), measure_fingerprint(config)
    if os.path.exists(path):
        loop.check_fingerprint(read_json(path).get("fingerprint"), fp, MEASURE_RESUMABLE,
                               workdir)
    write_json(path, {"fingerprint": fp})
    return units


def _unit_path(units: str, stage_index: int, budget: int) -> str:
    return os.path.join(units, f"stage{stage_index}_n{budget}.json")


def _stage_path(units: str, stage_index: int) -> str:
    return os.path.join(units, f"stage{stage_index}.json")


def _stored(path: str) -> dict[str, Any] | None:
    """The record at `path`, or None when it is missing or torn (it is then recomputed)."""
    try:
        return read_json(path) if os.path.exists(path) else None
    except ValueError:
        return None


def run_measure(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
    """Measure mode; returns {'rows': csv rows, 'table', 'stages', 'summary': markdown,
    'seconds': wall time of this call, 'reused': units taken from `units/`}."""
    t0 = time.time()
    ms = config.measure
    os.makedirs(workdir, exist_ok=True)
    stage_steps = [int(s) for s in ms.stage_steps]
    stage_names = list(ms.stage_names) if ms.get("stage_names") else [
        f"step {s}" for s in stage_steps]
    budgets = [int(b) for b in ms.budgets]
    names = list(config.compare.methods)
    num_draws = int(ms.num_draws)

    mesh = _mesh(config)
    _check_divisible("config.sft.batch_size", config.sft.batch_size, mesh)
    _check_divisible("config.measure.prompts_per_step", ms.prompts_per_step, mesh)
    units = _units_dir(workdir, config)
    stored = {(si, n0): _stored(_unit_path(units, si, n0))
              for si in range(len(stage_steps)) for n0 in budgets}
    stage_info: list[dict[str, Any] | None] = [_stored(_stage_path(units, si))
                                               for si in range(len(stage_steps))]
    todo = [si for si in range(len(stage_steps)) if stage_info[si] is None
            or any(stored[(si, n0)] is None for n0 in budgets)]
    reused = sum(r is not None for r in stored.values())
    if reused:
        logging.info("resuming in %s: %d of %d (stage, budget) units stored", units, reused,
                     len(stored))
    writer = _writer(workdir) if todo else None
    key = jax.random.key(config.seed)
    n_units, n_total = 0, sum(stored[(si, n0)] is None for si in todo for n0 in budgets)
    if todo:  # the CE training runs up to the last stage with a unit left
        source = DataSource(config, config.sft.batch_size)
        batch = source.measure(ms.prompts_per_step, ms.split, config.seed)
        images, labels = (sharding.shard_batch(batch["image"], mesh),
                          sharding.shard_batch(batch["label"], mesh))
        snapshots = ce_snapshots(config, source, mesh)
    for si, (stage, step) in enumerate(zip(stage_names, stage_steps)):
        if si > max(todo, default=-1):
            break
        graphdef, params, batch_stats = next(snapshots)
        if si not in todo:
            continue
        logits, vjp_fn = _linearize_fn(graphdef, ms.bn_train)(params, batch_stats, images)
        logits_host = np.asarray(jax.device_get(logits))
        p = alignment.success_probs(logits_host, batch["label"])
        stage_info[si] = {
            "stage": stage, "step": step, "mean_p": float(p.mean()),
            "median_p": float(np.median(p)), "frac_p_below_0.1": float((p < 0.1).mean()),
            "frac_p_above_0.9": float((p > 0.9).mean()),
            "top1": float((logits_host.argmax(1) == batch["label"]).mean())}
        write_json(_stage_path(units, si), stage_info[si])
        exact = alignment.ce_logit_cotangent(logits, labels)
        for n0 in budgets:
            if stored[(si, n0)] is not None:
                continue
            t_unit = time.time()
            rows = _measure_unit(config, si, stage, step, n0, names, key, p, logits, labels,
                                 vjp_fn, exact)
            stored[(si, n0)] = {"rows": rows, "seconds": time.time() - t_unit}
            write_json(_unit_path(units, si, n0), stored[(si, n0)])
            m = num_draws * len(names)
            for a, n in enumerate(names):
                writer.add_scalar(f"measure/{stage.replace(' ', '_')}/{n}/cosine",
                                  float(np.mean([r["cosine"] for r in rows[a:m:len(names)]])),
                                  n0)
            n_units += 1
            el = time.time() - t0
            logging.info("[%d/%d] stage %r N0=%d: %s | %.0fs elapsed, ~%.0fs left", n_units,
                         n_total, stage, n0, " ".join(
                             f"{n}={np.mean([r['cosine'] for r in rows[a:m:len(names)]]):.3f}"
                             for a, n in enumerate(names)), el, el / n_units * (n_total - n_units))
    if writer is not None:
        writer.close()
    seconds = time.time() - t0
    rows = [r for si in range(len(stage_steps)) for n0 in budgets
            for r in stored[(si, n0)]["rows"]]
    write_csv(os.path.join(workdir, "alignment.csv"), rows, CSV_COLUMNS)
    table = aggregate(rows)
    plot_alignment(table, os.path.join(workdir, "alignment.png"), stage_names, names)
    note = (f" ({reused} of {len(stored)} (stage, budget) units reused from an earlier run: "
            f"{sum(stored[u]['seconds'] for u in stored):.1f} s of measurement in all)"
            if reused else "")
    summary = summary_markdown(table, stage_info, names, seconds, config, note=note)
    with open(os.path.join(workdir, "summary.md"), "w") as f:
        f.write(summary)
    return {"rows": rows, "table": table, "stages": stage_info, "summary": summary,
            "seconds": seconds, "reused": reused}


def _measure_unit(config: ml_collections.ConfigDict, si: int, stage: str, step: int, n0: int,
                  names: Sequence[str], key: jax.Array, p: np.ndarray, logits: jax.Array,
                  labels: jax.Array, vjp_fn: Any, exact: jax.Array) -> list[dict[str, Any]]:
    """The CSV rows of one (stage, budget) unit: every method × paired draw."""
    ms, al = config.measure, config.rl.allocation
    num_draws = int(ms.num_draws)
    skey = jax.random.fold_in(jax.random.fold_in(key, si), n0)
    draw_keys = jax.random.split(skey, num_draws)
    allocs = [_allocate(n, p, n0, draw_keys, logits, labels, al) for n in names]
    # Paired draws: the same key for every allocator at draw r; [R, A, P] -> [R·A, P].
    per_draw = lambda x: np.broadcast_to(x, (num_draws,) + x.shape[-1:])  # noqa: E731
    m_counts, m_weights = (
        np.stack([per_draw(getattr(a, f)) for a in allocs], 1).reshape(-1, p.size)
        for f in ("counts", "weights"))
    m_keys = jnp.repeat(draw_keys, len(names), axis=0)
    cots = _cotangents(n0, ms.cot_chunk, m_keys, logits, labels, m_counts, m_weights)
    expected = jnp.stack([alignment.expected_cotangent_of(a, logits, labels, n0)
                          for a in allocs])
    cos, ratio = alignment.gradient_alignment(
        vjp_fn, jnp.concatenate([cots, expected]), exact, unroll=ms.unroll)
    m = num_draws * len(names)
    cos_exp = cos[m:]
    rows = []
    for i in range(m):
        r, a = divmod(i, len(names))
        ab = allocs[a]  # κ: E[c_q], over the pilot too for a two-stage method
        rows.append({
            "stage": stage, "stage_step": step, "budget": n0, "method": names[a],
            "draw": r, "seed": config.seed, "cosine": float(cos[i]),
            "norm_ratio": float(ratio[i]), "cosine_expected": float(cos_exp[a]),
            "kappa_min": float(ab.kappa_min), "kappa_mean": float(ab.kappa_mean),
            "active_frac": float(ab.active_frac)})
    return rows


def evaluate(steps: Steps, state: TrainState, source: DataSource, mesh,
             config: ml_collections.ConfigDict) -> dict[str, float]:
    """Validation CE, top-1 and analytic pass@k (mean over images of 1 − (1 − p)^k)."""
    ev = config.eval
    eb = max(sharding.batch_divisor(mesh),
             ev.batch_size // sharding.batch_divisor(mesh) * sharding.batch_divisor(mesh))
    ps, correct = [], []
    for b in source.eval(eb, ev.num_batches):
        n = b["label"].shape[0] // sharding.batch_divisor(mesh) * sharding.batch_divisor(mesh)
        if n == 0:
            continue
        b = {k: v[:n] for k, v in b.items()}
        logits = np.asarray(steps.logits(state, sharding.shard_batch(b["image"], mesh),
                                         train=False))
        ps.append(alignment.success_probs(logits, b["label"]))
        correct.append(logits.argmax(1) == b["label"])
    if not ps:
        raise ValueError("the validation split gave no batch; lower config.eval.batch_size")
    p = np.concatenate(ps)
    out = {"val_ce": float(-np.log(p).mean()), "val_top1": float(np.concatenate(correct).mean()),
           "val_mean_p": float(p.mean())}
    out.update({f"val_pass@{k}": v for k, v in
                alignment.analytic_pass_curve(p, ev.ks).items()})
    return out


def run_train(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
    """Train mode; returns {'log': rows of train_log.csv, 'summary': markdown, 'seconds'}."""
    t0 = time.time()
    tr, al = config.rl, config.rl.allocation
    os.makedirs(workdir, exist_ok=True)
    mesh = _mesh(config)
    _check_divisible("config.rl.prompts_per_step", tr.prompts_per_step, mesh)
    source = DataSource(config, tr.prompts_per_step)
    tx = optim.make_optimizer(_capped(tr.optimizer, tr.num_steps), tr.num_steps)
    graphdef, state = init_state(build_model(config), tx)
    state = sharding.replicate(state, mesh)
    steps = Steps(graphdef, tx)
    writer = _writer(workdir)
    key = jax.random.key(config.seed)
    batches = source.train(config.seed)
    log: list[dict[str, Any]] = []
    for i in range(tr.num_steps):
        hb = next(batches)
        b = sharding.shard_batch(hb, mesh)
        # The allocation needs exact p of the policy that acts: the same train-mode forward
        # as the step's (batch statistics), evaluated once more on the host's behalf.
        p = alignment.success_probs(np.asarray(steps.logits(state, b["image"], train=True)),
                                    hb["label"])
        ab = alignment.allocate_batch(tr.method, p, tr.rollouts_per_prompt, n_min=al.n_min,
                                      n_max=al.n_max,
                                      threshold=al.threshold, shift=al.shift)
        align = i % tr.log_every == 0 or i == tr.num_steps - 1
        state, m = steps.rl_step(state, b["image"], b["label"], ab.counts, ab.weights,
                                 jax.random.fold_in(key, i), n0=tr.rollouts_per_prompt,
                                 align=align)
        if not align:
            continue
        row = {"step": i, "train_ce": float(m["ce"]), "train_top1": float(m["top1"]),
               "cosine": float(m["cosine"]), "norm_ratio": float(m["norm_ratio"]),
               "kappa_min": ab.kappa_min, "kappa_mean": ab.kappa_mean,
               "active_frac": ab.active_frac, "seconds": time.time() - t0}
        row.update(evaluate(steps, state, source, mesh, config))
        log.append(row)
        for k, v in row.items():
            if k != "step":
                writer.add_scalar(f"train/{k}", v, i)
        writer.flush()
        logging.info("step %d/%d: cosine %.3f | train ce %.3f top1 %.3f | val ce %.3f top1 "
                     "%.3f | κ min %.3f mean %.3f | %.0fs", i, tr.num_steps, row["cosine"],
                     row["train_ce"], row["train_top1"], row["val_ce"], row["val_top1"],
                     row["kappa_min"], row["kappa_mean"], row["seconds"])
    writer.close()
    seconds = time.time() - t0
    write_csv(os.path.join(workdir, "train_log.csv"), log, list(log[0]))
    ks = [f"val_pass@{k}" for k in config.eval.ks]
    lines = [f"## Train mode — {config.data.name}, {config.model.name}, method "
             f"{tr.method}, N0 = {tr.rollouts_per_prompt}, {tr.num_steps} steps, seed "
             f"{config.seed}, {seconds:.1f} s", "",
             "| step | cosine | train CE | val CE | val top-1 | κ min | κ mean | "
             + " | ".join(ks) + " |", "|---" * (7 + len(ks)) + "|"]
    for r in log:
        lines.append(f"| {r['step']} | {r['cosine']:.3f} | {r['train_ce']:.3f} | "
                     f"{r['val_ce']:.3f} | {r['val_top1']:.3f} | {r['kappa_min']:.3f} | "
                     f"{r['kappa_mean']:.3f} | " + " | ".join(f"{r[k]:.3f}" for k in ks) + " |")
    summary = "\n".join(lines) + "\n"
    with open(os.path.join(workdir, "summary.md"), "w") as f:
        f.write(summary)
    return {"log": log, "summary": summary, "seconds": seconds}


def validate(config: ml_collections.ConfigDict) -> None:
    """Every field the chosen mode reads, checked before any data or model loads
    (StudyError naming the field: an infeasible budget, a negative learning rate, ...); a
    field under its old name names the new one."""
    common.renamed_fields(config)
    c = functools.partial(validation.check, error=common.StudyError)
    pos = validation.is_positive_int
    c(config.mode in ("measure", "train"), "mode", config.mode, "'measure' or 'train'")
    c(validation.is_int(config.seed), "seed", config.seed, "an integer")
    al = config.rl.allocation
    try:
        rl_config.validate_mesh(config.rl.mesh, "rl.mesh")
    except ValueError as e:
        raise common.StudyError(str(e)) from None
    c(al.shift in (0, 1), "rl.allocation.shift", al.shift, "0 (conditional) or 1 (centered)")
    c(validation.is_int(al.n_min) and validation.is_int(al.n_max) and al.shift + 1 <= al.n_min
      <= al.n_max, "rl.allocation.n_min", al.n_min,
      f"an integer, {al.shift + 1} <= n_min <= n_max={al.n_max}")
    c(validation.is_number(al.threshold) and 0 <= al.threshold <= 1, "rl.allocation.threshold",
      al.threshold, "[0, 1]")

    def optimizer(block: str, num_steps: int) -> None:
        w = config[block].optimizer.warmup_steps
        c(validation.is_int(w) and w >= 0, f"{block}.optimizer.warmup_steps", w,
          "an integer >= 0 (capped at the run's last step)")
        try:
            optim.validate(_capped(config[block].optimizer, num_steps), num_steps,
                           prefix=f"{block}.optimizer.")
        except ValueError as e:
            raise common.StudyError(str(e)) from None

    def methods_and_budgets(field: str, names: Sequence[str], budgets: Sequence[int],
                            budget_field: str) -> None:
        for name in names:
            try:
                method = methods_lib.get_method(name)
            except ValueError as e:
                raise common.StudyError(f"config.{field}: {e}") from None
            c(not method.dynamic_sampling, field, name, "methods without DAPO dynamic "
              "sampling: one allocation per batch, with no resampling")
        for n0 in budgets:
            c(validation.is_int(n0) and al.n_min <= n0 <= al.n_max, budget_field, n0,
              f"integers in [n_min, n_max] = [{al.n_min}, {al.n_max}] (the budget P·N0 must "
              "be reachable with every prompt in bounds)")

    if config.mode == "measure":
        ms = config.measure
        steps = list(ms.stage_steps)
        names = list(ms.stage_names) if ms.get("stage_names") else steps
        c(all(validation.is_int(s) and s >= 0 for s in steps) and steps == sorted(steps)
          and len(names) == len(steps) and steps, "measure.stage_steps", tuple(steps),
          f"increasing integers >= 0, one per stage name ({len(names)})")
        methods = config.compare.methods
        c(isinstance(methods, tuple | list) and len(methods) >= 1
          and len(set(methods)) == len(methods), "compare.methods", methods,
          "a tuple of distinct method names, e.g. ('uniform', 'sera')")
        methods_and_budgets("compare.methods", list(methods), list(ms.budgets),
                            "measure.budgets")
        c(pos(ms.num_draws) and ms.num_draws >= 2, "measure.num_draws", ms.num_draws,
          ">= 2 (for error bars)")
        c(pos(ms.prompts_per_step), "measure.prompts_per_step", ms.prompts_per_step,
          "an integer >= 1")
        c(pos(ms.unroll) and pos(ms.cot_chunk), "measure.unroll", ms.unroll,
          "integers >= 1 (unroll, cot_chunk)")
        c(pos(config.sft.batch_size), "sft.batch_size", config.sft.batch_size,
          "an integer >= 1")
        c(_sft_dtype(config) in SFT_DTYPES, "sft.dtype", _sft_dtype(config),
          " or ".join(repr(d) for d in SFT_DTYPES))
        optimizer("sft", _ce_steps(config))
    else:
        tr = config.rl
        methods_and_budgets("rl.method", [tr.method], [tr.rollouts_per_prompt],
                            "rl.rollouts_per_prompt")
        c(not methods_lib.get_method(tr.method).two_stage, "rl.method", tr.method,
          "a one-shot method: train mode allocates before the step's rollouts, and this one "
          "allocates from in-step pilot rollouts (measure it with --config.mode=measure)")
        c(not methods_lib.get_method(tr.method).stateful, "rl.method", tr.method,
          "a stateless method: train mode does not carry allocator state across steps "
          "(measure it with --config.mode=measure: one step from a fresh state)")
        c(pos(tr.num_steps) and pos(tr.log_every), "rl.num_steps", tr.num_steps,
          "integers >= 1 (num_steps, log_every)")
        c(pos(tr.prompts_per_step), "rl.prompts_per_step", tr.prompts_per_step,
          "an integer >= 1")
        optimizer("rl", tr.num_steps)


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
    """Validate everything, then dispatch on `config.mode` ('measure' or 'train')."""
    validate(config)
    workdir = common.prepare_workdir(workdir)
    if config.mode == "measure":
        return run_measure(config, workdir)
    return run_train(config, workdir)
