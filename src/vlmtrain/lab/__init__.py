"""The benchmarks' code: named train.py cases and their results rows (`cases`), vlmtrain's overhead over Bridge
alone (`overhead`: the measurement, with `direct`: the Bridge-alone rank), the memory estimate against the measured
peaks (`memory_check`), a killed and relaunched run (`resume`) and the reliability checks (`reliability`,
`kill_checkpoint`). The 2 x H200 sweeps are the spec conf/tune/perf_h200x2.yaml, run by vlmtrain.tune.

benchmarks/*.py are the command-line entry points over these modules; the tests import them from here.
"""
