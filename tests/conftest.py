"""Test-wide set-up: 8 virtual CPU devices so sharded code paths run here as on a pod, and
one persistent XLA compilation cache for the session (both workers and every subprocess)."""

import os
import shutil
import tempfile

# Must happen before jax is imported anywhere: multi-device code is exercised on CPU.
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    _flags += " --xla_force_host_platform_device_count=8"
# Why: the suite's wall time is XLA's CPU compiler (hundreds of small programs per test, each
# compiled once), not running them. The legacy emitters and LLVM at -O1 compile them about
# 2.5x faster (tests/rl/test_trainer.py's reference step: 66 s → 26 s); a test compares
# programs built with the same flags, and no tolerance changed. (-O0 with the legacy emitters
# was faster still but never finished hit_utility's float64 allocation at the int32 limit.)
# A user's own setting of either flag wins.
for _flag in ("--xla_cpu_use_fusion_emitters=false", "--xla_backend_optimization_level=1"):
    if _flag.split("=")[0] not in _flags:
        _flags += " " + _flag
os.environ["XLA_FLAGS"] = _flags.strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# TensorFlow (tfds) must never grab an accelerator or all host threads in tests.
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

# Why: the suite is dominated by XLA compiles, and many tests build the same program (the
# lab's tiny cells, the tiny decoder) in fresh closures, which jit's in-memory cache cannot
# match; the persistent cache is keyed by the program itself, so each is compiled once per
# session. A fresh directory per session (set in the controller, inherited by the xdist
# workers and by the binaries the tests launch, `common.enable_compilation_cache`): nothing
# carries over between runs. A directory set by the user is used as is and kept.
_OWN_CACHE = "JAX_COMPILATION_CACHE_DIR" not in os.environ
if _OWN_CACHE:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="sera_jax_tests_xla_")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")


def pytest_unconfigure(config):
    """The process that made the session's cache directory removes it (the xdist workers
    inherit the variable, so their `_OWN_CACHE` is false)."""
    if _OWN_CACHE and not hasattr(config, "workerinput"):
        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)


# Test modules whose module-scoped fixture is a whole study run (the maze `finished` and
# `pipeline` fixtures: 25-40 s each; the lab's trained runners): their tests go to one
# worker together, so the fixture is built once per session, not once per worker that
# happens to draw one of its tests. Every other test is its own unit, as with `--dist load`.
ONE_WORKER_MODULES = frozenset({
    "tests/studies/paired/test_study.py",
    "tests/studies/lab/test_train.py",
})


class _OneWorkerModules:
    """pytest-xdist scheduler hook (registered only when xdist is active: the hook is xdist's)."""

    @staticmethod
    def pytest_xdist_make_scheduler(config, log):
        """`--dist load` with the modules above kept whole. Why not `--dist loadgroup`:
        xdist 3.8 groups by renaming `item._nodeid`, which pytest 9.2 no longer reads."""
        if config.getvalue("dist") != "load":
            return None  # an explicit other --dist is the user's choice
        from xdist.scheduler import LoadScopeScheduling

        class Scheduling(LoadScopeScheduling):
            # LoadScopeScheduling queues the largest units first (`--loadscope-reorder`, on
            # by default), so the long module units start at once instead of ending the run.
            def _split_scope(self, nodeid: str) -> str:
                module = nodeid.split("::", 1)[0]
                return module if module in ONE_WORKER_MODULES else nodeid

        return Scheduling(config, log)


def pytest_configure(config):
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_OneWorkerModules(), "sera_jax_one_worker_modules")
