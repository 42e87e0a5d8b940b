"""Stage 2, check: preflight rules and the memory estimate, on the composed run before anything is built."""
