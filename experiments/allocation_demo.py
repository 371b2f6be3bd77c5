r"""Allocation demo: uniform MaxRL vs SERA on a realistic batch of success probabilities.

    python -m experiments.allocation_demo --workdir=/tmp/allocation_demo [--methods=...]

Writes ``allocation_demo.md`` (per-prompt N / κ / w and a summary per method) and
``allocation_demo.png`` to ``--workdir``. The recipe is `sera_jax.studies.allocation_demo`.
"""

from absl import flags

from sera_jax.studies import common

_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for the table and the plot.")
_NUM_PROMPTS = flags.DEFINE_integer("num_prompts", 256, "P, prompts in the batch.")
_N0 = flags.DEFINE_integer("n0", 128, "Mean rollouts per prompt; the budget is P·N0.")
_N_MIN = flags.DEFINE_integer("n_min", 2, "Fewest rollouts of an active prompt.")
_N_MAX = flags.DEFINE_integer("n_max", 512, "Most rollouts of a prompt.")
_SEED = flags.DEFINE_integer("seed", 0, "PRNG seed of the synthetic batch.")
_ROWS = flags.DEFINE_integer("rows", 16, "Prompts shown in the per-prompt table.")
_METHODS = flags.DEFINE_string("methods", "uniform,sera,sera_equalized",
                               "Comma list of methods (names of sera_jax.methods.METHODS).")


def main(argv):
    del argv
    from sera_jax.studies import allocation_demo

    common.main(lambda: allocation_demo.run_demo(
        _WORKDIR.value, num_prompts=_NUM_PROMPTS.value, n0=_N0.value, n_min=_N_MIN.value,
        n_max=_N_MAX.value, seed=_SEED.value, rows=_ROWS.value,
        methods=common.parse_methods(_METHODS.value, "--methods")))


if __name__ == "__main__":
    common.run_app(main, None)
