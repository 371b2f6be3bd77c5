"""Allocation lab: a controlled RL testbed with exact success probabilities (issue 13).

`task` (prompts × candidate answers, softmax policy over a shared scorer, exact p and
∇ log p), `train` (one compiled program per method: vmap over seeds, scan over steps, the
library's history / allocators / estimators / loss, AdamW), `stats` (paired differences and
95 % CIs over seeds), `study` (methods × seeds, tables, figures, regime map).
"""
