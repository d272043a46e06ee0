"""Building blocks shared by the stages: store, environments, policy, composer, losses."""
