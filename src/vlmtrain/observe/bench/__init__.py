"""The benchmarks' code: named train.py cases and their results rows (`cases`), the 2 x H200 performance sweeps
(`perf_h200x2`), vlmtrain's overhead over Bridge alone (`overhead`, with `direct`: the Bridge-alone rank),
the memory estimate against the measured peaks (`memory_check`).

benchmarks/*.py are the command-line entry points over these modules; the tests import them from here.
"""
