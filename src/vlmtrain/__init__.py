"""vlmtrain: Hydra-composed MoE-VLM training on Megatron Bridge."""
