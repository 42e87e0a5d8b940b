"""Checks that a behaviour holds, on a GPU (packing equivalence, resume, kill mid-checkpoint, reliability, Slurm
preemption, precision parity) or on CPU (the dry-run configs of two checkouts, the results rows)."""
