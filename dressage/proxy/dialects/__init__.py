"""API dialect adapters: each parses its requests into the one shared conversation and renders replies back."""
