"""`lopd coldstart`: the composer phi_0 trained on successful trajectories (recipe), its batches
(data), its seeded init (composer), its settings, and the ladder of controls with the held-out
check (ladder, also `lopd ladder`)."""
