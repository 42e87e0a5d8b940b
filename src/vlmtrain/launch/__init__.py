"""Stage 4, launch: one process per GPU, through torchrun on this node or as Slurm tasks (submitit)."""
