"""Building blocks shared by the stages, in sub-packages: text, exec, data, losses, run, models, latent."""
