"""Micro-benchmarks: one kernel or one loader part at a model's shapes, medians of repeats into results/."""
