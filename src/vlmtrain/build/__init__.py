"""Stage 3, build: the run config -> Bridge's ConfigContainer, finalized on the declared target; the dry-run plan."""
