"""Reports: plan tables, comparisons and figures (no torch)."""
