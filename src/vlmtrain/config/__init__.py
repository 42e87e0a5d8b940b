"""Stage 0, config: the typed run config, composing it, the world it asks for, and every config group."""
