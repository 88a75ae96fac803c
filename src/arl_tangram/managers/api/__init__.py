"""managers/api package."""
