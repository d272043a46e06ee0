"""`lopd distill`: the on-policy training loop for every method (recipe), the checks that run
before any model loads (checks) and its settings."""
