"""managers/cpu package."""
