"""actuate."""
