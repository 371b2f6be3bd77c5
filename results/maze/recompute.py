"""Recompute every number of an exported maze comparison (and frontier, lr- and norm-matched
arms) from the files in its folder alone: `python results/maze/recompute.py results/maze/<name>`.

Prints the recomputed tables, then for each JSON how many saved values were recomputed equal;
exit status 1 when any differs. The arithmetic is `sera_jax.studies.paired.recompute`.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from sera_jax.studies.paired.recompute import main  # noqa: E402

if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python results/maze/recompute.py results/maze/<config name>")
    sys.exit(main(sys.argv[1]))
