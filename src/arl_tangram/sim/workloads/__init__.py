"""Sim: workload generators (coding, deepsearch, mopd). Each parameter cites PAPER.md or says assumption."""
