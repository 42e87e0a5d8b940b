"""vlmtrain's one experiment system: declarative specs (conf/tune/*.yaml) that name knobs and either list cases
(`vlmtrain sweep`, the benchmarks) or stage a search (`vlmtrain tune`), one trial runner (the `-m` path: the sweeper's
preflight, its launcher, train.py), one results store (vlmtrain.observe.run_summary) and the paired A/B overhead
measurement (`vlmtrain overhead`).

The last stage of the flow (after report): it composes, checks, launches and reports through the earlier stages.
"""
