"""Dishonest for problems/1_softmax.py: computes the first call's answer and returns it for every
call after it."""
from pathlib import Path

from autokernel.contract import load_module

right = load_module(Path(__file__).parents[1] / "solutions" / "1_softmax.py")


class ModelNew(right.ModelNew):
    def forward(self, x):
        if not hasattr(self, "first"):
            self.first = super().forward(x)
        return self.first
