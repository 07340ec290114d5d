"""Dressage: the token-exact record of what an agent's policy generated, and the path from it to a gradient step."""

__version__ = "0.1.0"
