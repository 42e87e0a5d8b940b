"""`hydra/sweeper=vlmtrain` (conf/train.yaml's default): preflight every job of a -m sweep before any starts."""
