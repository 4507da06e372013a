"""Test-wide settings: one intra-op thread (the tensors here are small; more threads only add contention on the
2-core CI machine) and a non-interactive matplotlib backend."""

import os

os.environ.setdefault("MPLBACKEND", "Agg")

import torch  # noqa: E402

torch.set_num_threads(1)
