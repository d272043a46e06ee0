"""Data on disk and in batches: the experience store, retrieval, the rows a run appends, training rows, input files."""
