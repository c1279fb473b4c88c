"""Layer 4 (below the run): what a run writes and shows: results files, the round table, plots,
sweep reports."""
