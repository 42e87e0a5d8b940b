"""Stage 6, observe: FLOPs, step timing, metrics.jsonl rows, the W&B run and the results files."""
