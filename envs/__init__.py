"""Worlds: softmax bandits, token-sequence MDPs small enough to enumerate, GSM8k."""
