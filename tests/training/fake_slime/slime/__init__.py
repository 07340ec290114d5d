"""Test stand-in for the parts of THUDM/slime that a rollout function sees (see ../README.md)."""
