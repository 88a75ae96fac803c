"""Tests of the HTTP service (api/): real HTTP over loopback, real sandboxes."""
