"""Stage 5, train: Bridge's pretrain() on the built container, step counters, Bridge code patches, checks."""
