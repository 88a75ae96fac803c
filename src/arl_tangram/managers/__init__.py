"""Shell: mechanism per resource kind on one node (cpu sandboxes, gpu services, api quotas)."""
