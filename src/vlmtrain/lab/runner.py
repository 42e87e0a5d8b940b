"""One way to start a `python train.py` run from the lab: the command, its env, run dir, log, timeout and GPU slot.

Every experiment that trains (sweeps, tune's trials, the overhead A/B, the GPU checks and the acceptance suite)
starts its runs here, so they all see the same environment rules and leave the same files behind.
"""

from __future__ import annotations

from vlmtrain.config.compose import CONF_DIR

ROOT = CONF_DIR.parent
"""The checkout: train.py, results/ and outputs/ (the lab runs from a source checkout)."""
TRAIN_PY = ROOT / "train.py"
