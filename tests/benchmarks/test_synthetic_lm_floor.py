"""The floor benchmark's same-shape replay records every matrix product of a forward and backward pass: the FLOPs
of the recorded shapes (2·m·k·n each, worked out here) equal ``torch.utils.flop_counter``'s count of the same call,
and the replay runs the same products."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "synthetic_lm_floor.py"


def load_benchmark():
    spec = importlib.util.spec_from_file_location("synthetic_lm_floor", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def product_flops(op: object, shapes: list[torch.Size]) -> int:
    """2·m·k·n for mm / addmm (last two operands [m, k], [k, n]); 2·b·m·k·n for bmm / baddbmm."""
    a, b = shapes[-2], shapes[-1]
    batch = a[0] if len(a) == 3 else 1
    return 2 * batch * a[-2] * a[-1] * b[-1]


def test_recorded_products_are_every_product_of_forward_and_backward():
    floor = load_benchmark()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.GELU(), torch.nn.Linear(5, 3))
    x = torch.randn(4, 7, 6)
    q = torch.randn(4, 7, 3)

    def call() -> None:
        h = net(x)
        attention = torch.softmax(h @ q.transpose(1, 2), -1) @ h  # bmm in forward and backward
        attention.sum().backward()

    calls = floor.matmul_shapes(call)
    with FlopCounterMode(display=False) as counter:
        call()
    assert sum(product_flops(op, shapes) for op, shapes in calls) == counter.get_total_flops()
    ops = {str(op) for op, _ in calls}
    assert ops >= {"aten.addmm.default", "aten.mm.default", "aten.bmm.default"}
    with floor.MatmulShapes() as replayed:
        floor.replay(calls)()
    assert [(op, shapes) for op, shapes in replayed.calls] == calls
