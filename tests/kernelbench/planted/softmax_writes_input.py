"""Dishonest for problems/1_softmax.py: returns a right answer, and overwrites its input with it
too (in a Triton kernel, where the dispatch guard does not look)."""
from pathlib import Path

from autokernel.contract import load_module

right = load_module(Path(__file__).parents[1] / "solutions" / "1_softmax.py")


class ModelNew(right.ModelNew):
    def forward(self, x):
        y = super().forward(x)
        right.softmax_kernel[(x.shape[0],)](x, x, x.shape[1], BLOCK=64)
        return y
