r"""Math pilot: the start policy on candidate task mixes at the RL sampler, scored with the
paired study's evaluation (the recipe is `sera_jax.studies.math_pilot`).

    python -m experiments.math_pilot --config=configs/math/cpu.py --workdir=runs/math_pilot \
        --candidates=plain32,number24_s1 --config.eval.num_prompts=32 --config.eval.num_samples=8
"""
from absl import flags

from sera_jax.studies import common, math_pilot

_CANDIDATES = flags.DEFINE_list("candidates", ",".join(math_pilot.CANDIDATES),
                                f"Comma-separated names of {sorted(math_pilot.CANDIDATES)}.")

if __name__ == "__main__":
    common.binary(lambda config, workdir: print(
        math_pilot.run(config, workdir, _CANDIDATES.value)["summary"]), "configs/math/cpu.py")
