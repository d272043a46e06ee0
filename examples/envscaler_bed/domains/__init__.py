"""Domain modules of the lopd study bed; each defines ENVS (see examples/envscaler_bed/README.md)."""
