"""Discrete-event simulator: drives the core ``Scheduler`` on a virtual clock against simulated managers."""
