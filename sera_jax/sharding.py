"""Device meshes, logical-to-mesh partition rules and NamedSharding helpers.

One code path for a laptop, 8 forced CPU devices and a TPU pod:

* a 3-axis mesh `('data', 'fsdp', 'tensor')` whose shape comes from the config (-1 = fill
  with the remaining devices), built with `AxisType.Auto` axes so GSPMD propagates
  shardings through `jax.jit`;
* model parameters carry *logical* axis names (the decoder stores them in each
  `nnx.Param`'s `out_sharding` metadata, with `eager_sharding=False` so a model can be built
  without a mesh); `LOGICAL_RULES` map each logical name to mesh axes. A dimension whose size does
  not divide by its mesh axes is replicated instead (e.g. 2 KV heads on tensor=4), so every
  named config runs on every mesh;
* batches (rollout rows) are split over `BATCH_AXES = ('data', 'fsdp')` and replicated over
  `tensor`;
* `initialize_distributed` calls `jax.distributed.initialize` for multi-host runs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES: tuple[str, str, str] = ("data", "fsdp", "tensor")
#: Mesh axes that split the batch (rollout rows). `tensor` replicates the batch.
BATCH_AXES: tuple[str, str] = ("data", "fsdp")

MeshAxes = str | tuple[str, ...] | None

#: Logical axis name -> mesh axes. Weights are sharded ZeRO-3 style over `fsdp` along their
#: model dimension and Megatron style over `tensor` along heads / FFN / vocabulary.
LOGICAL_RULES: dict[str, MeshAxes] = {
    "batch": BATCH_AXES,
    "vocab": "tensor",
    "embed": "fsdp",
    "mlp": "tensor",
    "heads": "tensor",
    "q_heads": "tensor",
    "kv_heads": "tensor",
    "kv": None,
    "head_dim": None,
    "layers": None,
    "norm": None,
    "length": None,
}


def mesh_shape_from_config(shape: Mapping[str, int] | Sequence[int], num_devices: int) -> tuple:
    """Resolve a `(data, fsdp, tensor)` shape with at most one -1 ("fill") to concrete sizes.

    Raises ValueError when the product does not equal `num_devices`.
    """
    if isinstance(shape, Mapping):
        unknown = set(shape) - set(MESH_AXES)
        if unknown:
            raise ValueError(f"mesh shape has unknown axes {sorted(unknown)}; allowed {MESH_AXES}")
        sizes = [int(shape.get(a, 1)) for a in MESH_AXES]
    else:
        sizes = [int(s) for s in shape]
        if len(sizes) != len(MESH_AXES):
            raise ValueError(f"mesh shape {tuple(sizes)} must have {len(MESH_AXES)} entries "
                             f"{MESH_AXES}")
    fills = [i for i, s in enumerate(sizes) if s == -1]
    if len(fills) > 1 or any(s == 0 or s < -1 for s in sizes):
        raise ValueError(f"mesh shape {dict(zip(MESH_AXES, sizes))}: sizes must be >= 1, with "
                         "at most one -1 (fill with the remaining devices)")
    known = math.prod(s for s in sizes if s != -1)
    if fills:
        if num_devices % known:
            raise ValueError(f"mesh shape {dict(zip(MESH_AXES, sizes))}: {num_devices} devices "
                             f"do not divide by the fixed axes' product {known}")
        sizes[fills[0]] = num_devices // known
    if math.prod(sizes) != num_devices:
        raise ValueError(f"mesh shape {dict(zip(MESH_AXES, sizes))} has {math.prod(sizes)} "
                         f"devices but {num_devices} are available; use -1 on one axis to fill")
    return tuple(sizes)


def make_mesh(
    shape: Mapping[str, int] | Sequence[int] = (-1, 1, 1),
    devices: Sequence[jax.Device] | None = None,
) -> Mesh:
    """A `('data', 'fsdp', 'tensor')` mesh over `devices` (default: all global devices).

    Axes are `AxisType.Auto`: shardings given to `jax.jit` inputs propagate by GSPMD, and
    code written for this mesh needs no `shard_map` or explicit-sharding annotations.
    """
    devices = list(jax.devices() if devices is None else devices)
    sizes = mesh_shape_from_config(shape, len(devices))
    return jax.make_mesh(sizes, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES),
                         devices=devices)


def _axes_tuple(axes: MeshAxes) -> tuple[str, ...]:
    if axes is None:
        return ()
    return (axes,) if isinstance(axes, str) else tuple(axes)


def logical_to_spec(
    logical: Sequence[str | None],
    shape: Sequence[int],
    mesh: Mesh,
    rules: Mapping[str, MeshAxes] = LOGICAL_RULES,
) -> PartitionSpec:
    """PartitionSpec of an array with logical axis names `logical` and `shape` on `mesh`.

    Each logical name maps to mesh axes by `rules`; mesh axes of size 1, axes already used by
    an earlier dimension, and axes whose product does not divide the dimension are dropped
    (that dimension is then replicated over them). Unknown names raise ValueError.
    """
    if len(logical) != len(shape):
        raise ValueError(f"logical axes {tuple(logical)} do not match the array rank {len(shape)}")
    used: set[str] = set()
    spec: list[MeshAxes] = []
    for name, dim in zip(logical, shape):
        if name is None:
            spec.append(None)
            continue
        if name not in rules:
            raise ValueError(f"no partition rule for logical axis {name!r}; known: "
                             f"{sorted(rules)}. Add it to the `rules` mapping.")
        axes = [a for a in _axes_tuple(rules[name]) if a not in used and mesh.shape[a] > 1]
        # Keep the longest prefix of mesh axes that divides the dimension.
        while axes and dim % math.prod(mesh.shape[a] for a in axes):
            axes.pop()
        used.update(axes)
        spec.append(None if not axes else axes[0] if len(axes) == 1 else tuple(axes))
    return PartitionSpec(*spec)


def _logical_axes(var: nnx.Variable) -> tuple | None:
    meta = var.get_metadata()
    for key in ("out_sharding", "sharding_names", "sharding"):
        if meta.get(key):
            return tuple(meta[key])
    return None


def state_shardings(state: Any, mesh: Mesh, rules: Mapping[str, MeshAxes] = LOGICAL_RULES) -> Any:
    """NamedSharding for every leaf of an NNX state (or any pytree of `nnx.Variable`s).

    Variables annotated with logical axis names are partitioned by `rules`; unannotated
    variables and plain arrays are replicated. The result has the structure of
    `nnx.state(...)` with shardings in place of the arrays (so `jax.device_put` and
    `jax.jit(out_shardings=...)` accept it directly).
    """

    def one(x):
        if isinstance(x, nnx.Variable):
            logical = _logical_axes(x)
            shape = x.get_value().shape
            spec = PartitionSpec() if logical is None else logical_to_spec(logical, shape, mesh,
                                                                           rules)
            return x.replace(NamedSharding(mesh, spec))
        return NamedSharding(mesh, PartitionSpec())

    return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def replicated(mesh: Mesh) -> NamedSharding:
    """Fully replicated sharding on `mesh`."""
    return NamedSharding(mesh, PartitionSpec())


def batch_sharding(mesh: Mesh, ndim: int = 1, axis: int = 0) -> NamedSharding:
    """Rows (dimension `axis`) split over `BATCH_AXES`, other dimensions replicated."""
    spec = [None] * ndim
    spec[axis] = BATCH_AXES
    return NamedSharding(mesh, PartitionSpec(*spec))


def batch_divisor(mesh: Mesh) -> int:
    """Number of batch shards: a global batch dimension must be a multiple of it."""
    return math.prod(mesh.shape[a] for a in BATCH_AXES)


def round_up_to_shards(rows: int, mesh: Mesh | None) -> int:
    """The smallest multiple of the mesh's batch shards (data·fsdp) that is >= `rows`
    (`rows` itself without a mesh): a batch size every shard can take an equal part of."""
    if mesh is None:
        return int(rows)
    d = batch_divisor(mesh)
    return -(-int(rows) // d) * d


def shard_model(model: nnx.Module, mesh: Mesh, rules: Mapping[str, MeshAxes] = LOGICAL_RULES):
    """Place the model's state on `mesh` by the partition rules (in place); returns the model."""
    state = nnx.state(model)
    nnx.update(model, jax.device_put(state, state_shardings(state, mesh, rules)))
    return model


def shard_batch(batch: Any, mesh: Mesh, axis: int = 0) -> Any:
    """Put a pytree of host arrays, each holding the *global* batch, on the batch sharding
    (rows along dimension `axis`).

    Every process passes the same global arrays (the trainer builds batches
    deterministically on all hosts); each process keeps the rows its devices own.
    """

    def one(x):
        x = np.asarray(x)
        if x.ndim <= axis:
            raise ValueError(f"shard_batch: a {x.ndim}-d array has no batch dimension {axis}")
        sharding = batch_sharding(mesh, x.ndim, axis)
        if x.shape[axis] % batch_divisor(mesh):
            raise ValueError(f"batch dimension {x.shape[axis]} is not a multiple of the "
                             f"{batch_divisor(mesh)} batch shards of mesh {dict(mesh.shape)}")
        return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])

    return jax.tree.map(one, batch)


def replicate(tree: Any, mesh: Mesh) -> Any:
    """Put a pytree of host values (identical on every process) replicated on `mesh`."""

    def one(x):
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, replicated(mesh), lambda idx: x[idx])

    return jax.tree.map(one, tree)


def to_host(x: Any) -> np.ndarray:
    """A (global) array as NumPy on every process; all-gathers rows held by other hosts."""
    if not isinstance(x, jax.Array) or x.is_fully_addressable:
        return np.asarray(x)
    if x.sharding.is_fully_replicated:
        return np.asarray(x.addressable_data(0))
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def initialize_distributed(
    multihost: bool,
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
) -> bool:
    """Call `jax.distributed.initialize` once when `multihost` (no-op otherwise).

    On TPU pods / Slurm / Open MPI all arguments may be None (auto-detected). Must run before
    any other JAX call. Returns True when this process is now part of a multi-process job.
    """
    if not multihost:
        return False
    kwargs = {}
    if coordinator_address:
        kwargs["coordinator_address"] = coordinator_address
    if num_processes is not None and num_processes > 0:
        kwargs["num_processes"] = int(num_processes)
    if process_id is not None and process_id >= 0:
        kwargs["process_id"] = int(process_id)
    if not jax.distributed.is_initialized():
        jax.distributed.initialize(**kwargs)
    return jax.process_count() > 1
