"""The experiment wing: every run it starts goes through `runner` (one way to launch `python train.py`), a named run is
one `cases.Case` on the shared baselines there, and rows land in results/ through `store`. Sweeps of a spec
(`sweep`, `spec`, `repeats`, `sweep_report`), tune (`tune/`), the overhead A/B (`overhead`, `overhead_ab`,
`bridge_alone`), Bridge's own recipe as the peer (`bridge_recipe`), micro-benchmarks (`micro/`), calibrations
(`calibrate/`) and the GPU checks (`checks/`). Each entry point is a `vlmtrain` subcommand or
`python -m vlmtrain.lab.<module>`; the tests import these modules.
"""
