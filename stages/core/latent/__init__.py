"""The latent context: placements, framing, splicing, the latent and text-context teachers, latent batches."""
