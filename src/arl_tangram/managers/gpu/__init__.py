"""managers/gpu package."""
