"""The experiment wing: every experiment is a `vlmtrain lab <experiment>` subcommand built from the kit (`kit/`: the
case type, the runner, the results store, the schedule of repeated runs, specs and the experiments' index). Sweeps of
a spec (`sweep`, `sweep_report`), tune (`tune/`), the overhead A/B (`overhead`, `overhead_ab`, `bridge_alone`),
Bridge's own recipe as the peer (`bridge_recipe`, `bridge_recipe_rank`, `bridge_benchmarks`, `vs_bridge`), named
cases (`cases`), micro-benchmarks (`micro/`), calibrations (`calibrate/`) and the GPU checks (`checks/`); the tests
in tests/lab/ import these modules.
"""
