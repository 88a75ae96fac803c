"""Functional core: resources, actions, elasticity, cluster state, the scheduler and its policies.

Pure Python (numpy allowed); no I/O, no clock reads, no asyncio. Imports nothing of the
project outside ``core``.
"""
