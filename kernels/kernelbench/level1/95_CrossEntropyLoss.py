"""KernelBench level 1, problem 95 (mean cross-entropy of [batch, classes] logits): the
cross_entropy starter (kernels/cross_entropy.py: one pass per row, fp32 loss)."""
import torch.nn as nn

from kernels.cross_entropy import kernel_fn as cross_entropy


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        return cross_entropy(predictions, targets)
