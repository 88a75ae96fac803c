"""ARL-Tangram: action-level orchestration of agentic RL's external resources."""

__version__ = "0.1.0"
