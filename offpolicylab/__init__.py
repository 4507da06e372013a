"""offpolicylab: off-policy and stale-data RL objectives for LLMs, with toy worlds that have ground truth."""

__version__ = "0.1.0"
