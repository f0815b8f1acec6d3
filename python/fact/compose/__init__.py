"""Stage 3: compose realized kernels into a drop-in module (`fact.optimize`)."""
