"""tito."""
