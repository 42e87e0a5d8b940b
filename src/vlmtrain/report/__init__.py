"""Sweep report: rank a Hydra multirun (or a W&B group) by useful tokens/s/GPU, explain every failure, plot.

    vlmtrain report <multirun dir | run dir | wandb:<entity>/<project>/<group>> [--out DIR]

Each job is read from its own files (run_config.yaml, metrics.jsonl, train.log, .hydra/), from W&B offline
run files found under the directory, or from the W&B API for `wandb:` groups. Numbers are
vlmtrain.observe.run_summary.summarize_rows: over the steps after warm-up (rates as total work / total time, the rest
medians). Frozen-vision and mock-data runs get their own sections: their throughput is not comparable with
trainable runs on real data. Writes report.md, report.csv and three PNG plots.
"""

from vlmtrain.report.failures import classify, log_text
from vlmtrain.report.job import SECTIONS, STATUS, Job, steady_metrics
from vlmtrain.report.labels import baseline, describe, flags
from vlmtrain.report.plots import PLOTS
from vlmtrain.report.sources import gather, job_from_dir, rank
from vlmtrain.report.tables import CSV_COLUMNS, render, write_csv
from vlmtrain.report.wandb_runs import job_from_wandb, read_wandb_file
from vlmtrain.report.write import ReportCallback, safe_write, write_report

__all__ = ["CSV_COLUMNS", "PLOTS", "SECTIONS", "STATUS", "Job", "ReportCallback", "baseline", "classify", "describe",
           "flags", "gather", "job_from_dir", "job_from_wandb", "log_text", "rank", "read_wandb_file", "render",
           "safe_write", "steady_metrics", "write_csv", "write_report"]
