"""Models: backbones (loading, device and dtype), the composer (QFormer + LoRA adapter), the student
forward, the assembly of a run's modules."""
