"""Core: scheduling policies, plugins of one interface chosen by name (see ``registry``)."""
