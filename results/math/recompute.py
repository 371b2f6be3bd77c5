"""Recompute every number of an exported math comparison from the files in its folder alone:
`python results/math/recompute.py results/math/<name>` (the maze study's code: the math
study is that study on a pretrained LM, `sera_jax.studies.paired.kinds.lm`).

Prints the recomputed tables, then for each JSON how many saved values were recomputed equal;
exit status 1 when any differs.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from sera_jax.studies.paired.recompute import main  # noqa: E402

if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python results/math/recompute.py results/math/<config name>")
    sys.exit(main(sys.argv[1]))
