"""The experiment wing: every experiment is a `vlmtrain lab <experiment>` subcommand (`experiments`, the index), a
named run is one `cases.Case`, every process it starts goes through `runner` (one way to launch `python train.py`
or a run's ranks), and rows land in results/ through `store`. Sweeps of a spec (`sweep`, `spec`, `repeats`,
`sweep_report`), tune (`tune/`), the overhead A/B (`overhead`, `overhead_ab`, `bridge_alone`), Bridge's own recipe as
the peer (`bridge_recipe`, `bridge_recipe_rank`), micro-benchmarks (`micro/`), calibrations (`calibrate/`) and the GPU
checks (`checks/`); the tests import these modules.
"""
