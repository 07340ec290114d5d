"""``slime.rollout`` stand-in."""
