"""`lopd coldstart`: the composer phi_0 trained on successful trajectories (recipe), its batches
(data), its held-out check (heldout), the ladder of controls (ladder) and its settings."""
