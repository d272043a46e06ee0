"""Run folders: settings and resume, checkpoints, provenance, metrics loggers, memory checks, distributed training."""
