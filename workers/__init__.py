"""The long-running processes behind ``dressage-worker`` (rollout, train, proxy, engine)."""
