"""Wrong for problems/5_scale_shift.py: the right math on parameters of its own (ones and zeros,
not the values Model draws under the judge's seed)."""
import torch

from tests.kernelbench.planted.scale_shift import ModelNew as RightMath


class ModelNew(RightMath):
    def __init__(self, features):
        super().__init__(features)
        with torch.no_grad():
            self.weight.fill_(1.0)
            self.bias.zero_()
