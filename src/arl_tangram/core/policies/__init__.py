"""core/policies package."""
