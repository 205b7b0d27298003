"""Region starters of convolution blocks run in channels_last (autokernel/region_starter.py,
autokernel/region_special.py): a region with a 2-d convolution is traced NHWC, its kernels walk
and allocate NHWC, its forward takes an input in either layout (a copy kernel where it is not
NHWC) and its weights in either layout (verify.py passes a model's own, NCHW). Each block here is
written as profile.py freezes a region (functional calls, parameters by flat names), at small
shapes; the judge's stages (what bench.py runs) pass on each."""
import re

import pytest
import torch

from autokernel import gate, region_kind, region_starter, source_check, state
from autokernel.child import Runner
from autokernel.contract import load_module

HEAD = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
'''
BLOCKS = {
    # ResNet18's layer2.0: a stride-2 BasicBlock with its 1x1 downsample
    "basicblock": ("""
        self.conv1_weight = nn.Parameter(torch.randn((8, 4, 3, 3)) * 0.2)
        self.conv2_weight = nn.Parameter(torch.randn((8, 8, 3, 3)) * 0.2)
        self.down_weight = nn.Parameter(torch.randn((8, 4, 1, 1)) * 0.3)
        for name, c in (("bn1", 8), ("bn2", 8), ("bnd", 8)):
            self.register_buffer(f"{name}_mean", torch.randn((c,)) * 0.3)  # eval-mode BatchNorm
            self.register_buffer(f"{name}_var", torch.rand((c,)) + 0.5)
            self.register_buffer(f"{name}_weight", torch.rand((c,)) + 0.5)
            self.register_buffer(f"{name}_bias", torch.randn((c,)) * 0.1)

    def norm(self, x, name):
        return F.batch_norm(x, getattr(self, f"{name}_mean"), getattr(self, f"{name}_var"),
                            getattr(self, f"{name}_weight"), getattr(self, f"{name}_bias"),
                            False, 0.1, 1e-05)

    def forward(self, in0):
        h = torch.relu(self.norm(torch.conv2d(in0, self.conv1_weight, None, 2, 1), "bn1"))
        h = self.norm(torch.conv2d(h, self.conv2_weight, None, 1, 1), "bn2")
        down = self.norm(torch.conv2d(in0, self.down_weight, None, 2), "bnd")
        return torch.relu(h + down)


def get_inputs():
    return [torch.randn((2, 4, 8, 8))]
""", 3),
    # ResNet's stem: 7x7 stride-2 conv, BatchNorm, ReLU, 3x3 stride-2 max pool
    "stem": ("""
        self.conv1_weight = nn.Parameter(torch.randn((8, 3, 7, 7)) * 0.1)
        for name, c in (("bn1", 8),):
            self.register_buffer(f"{name}_mean", torch.randn((c,)) * 0.3)  # eval-mode BatchNorm
            self.register_buffer(f"{name}_var", torch.rand((c,)) + 0.5)
            self.register_buffer(f"{name}_weight", torch.rand((c,)) + 0.5)
            self.register_buffer(f"{name}_bias", torch.randn((c,)) * 0.1)

    def forward(self, in0):
        h = torch.conv2d(in0, self.conv1_weight, None, 2, 3)
        h = F.batch_norm(h, self.bn1_mean, self.bn1_var, self.bn1_weight, self.bn1_bias,
                         False, 0.1, 1e-05)
        return F.max_pool2d(torch.relu(h), 3, 2, 1)


def get_inputs():
    return [torch.randn((2, 3, 16, 16))]
""", 1),
    # MobileNetV2's inverted residual: 1x1 expand, 3x3 depthwise (groups=C), 1x1 project
    "inverted_residual": ("""
        self.expand_weight = nn.Parameter(torch.randn((12, 4, 1, 1)) * 0.4)
        self.dw_weight = nn.Parameter(torch.randn((12, 1, 3, 3)) * 0.3)
        self.project_weight = nn.Parameter(torch.randn((4, 12, 1, 1)) * 0.3)
        for name, c in (("bn1", 12), ("bn2", 12), ("bn3", 4)):
            self.register_buffer(f"{name}_mean", torch.randn((c,)) * 0.3)  # eval-mode BatchNorm
            self.register_buffer(f"{name}_var", torch.rand((c,)) + 0.5)
            self.register_buffer(f"{name}_weight", torch.rand((c,)) + 0.5)
            self.register_buffer(f"{name}_bias", torch.randn((c,)) * 0.1)

    def norm(self, x, name):
        return F.batch_norm(x, getattr(self, f"{name}_mean"), getattr(self, f"{name}_var"),
                            getattr(self, f"{name}_weight"), getattr(self, f"{name}_bias"),
                            False, 0.1, 1e-05)

    def forward(self, in0):
        h = F.relu6(self.norm(torch.conv2d(in0, self.expand_weight), "bn1"))
        h = F.relu6(self.norm(torch.conv2d(h, self.dw_weight, None, 1, 1, 1, 12), "bn2"))
        return in0 + self.norm(torch.conv2d(h, self.project_weight), "bn3")


def get_inputs():
    return [torch.randn((2, 4, 8, 8))]
""", 3),
    # transformers' MobileNetV2ConvLayer with tf_padding: an asymmetric F.pad, then a stride-2
    # depthwise conv, BatchNorm, ReLU6 (hardtanh)
    "tf_padded_depthwise": ("""
        self.dw_weight = nn.Parameter(torch.randn((6, 1, 3, 3)) * 0.3)
        for name, c in (("bn1", 6),):
            self.register_buffer(f"{name}_mean", torch.randn((c,)) * 0.3)  # eval-mode BatchNorm
            self.register_buffer(f"{name}_var", torch.rand((c,)) + 0.5)
            self.register_buffer(f"{name}_weight", torch.rand((c,)) + 0.5)
            self.register_buffer(f"{name}_bias", torch.randn((c,)) * 0.1)

    def forward(self, in0):
        h = torch.conv2d(F.pad(in0, (0, 1, 0, 1), "constant", 0.0), self.dw_weight, None, 2, 0,
                         1, 6)
        h = F.batch_norm(h, self.bn1_mean, self.bn1_var, self.bn1_weight, self.bn1_bias,
                         False, 0.1, 1e-03)
        return F.hardtanh(h, 0.0, 6.0)


def get_inputs():
    return [torch.randn((2, 6, 8, 8))]
""", 1),
    # a diffusion model's half-block: GroupNorm, SiLU, conv (the groups walked NHWC)
    "groupnorm_silu_conv": ("""
        self.norm_weight = nn.Parameter(torch.rand((8,)) + 0.5)
        self.norm_bias = nn.Parameter(torch.randn((8,)) * 0.1)
        self.conv_weight = nn.Parameter(torch.randn((8, 8, 3, 3)) * 0.1)
        self.conv_bias = nn.Parameter(torch.randn((8,)) * 0.1)

    def forward(self, in0):
        h = F.silu(F.group_norm(in0 * 2 + 1, 4, self.norm_weight, self.norm_bias))
        return torch.conv2d(h, self.conv_weight, self.conv_bias, 1, 1) + in0


def get_inputs():
    return [torch.randn((2, 8, 4, 6))]
""", 1),
}
TAIL = '''

def get_init_inputs():
    return []
'''


def starter(tmp_path, body):
    """(the kernel file's path, its text, the reference's module) for one block."""
    problem = tmp_path / "reference.py"
    problem.write_text(HEAD + body + TAIL)
    header = {"doc": "a convolution block", "contract": "\n".join([
        'KERNEL_TYPE = "region"', "KERNEL_NAME = 'block'",
        f"KERNELBENCH_PROBLEM = {str(problem)!r}",
        f"KERNELBENCH_SHA256 = {state.digest(problem.read_bytes())!r}",
        "BENCH_DTYPE = 'fp16'"])}
    text = region_starter.starter_source(problem, header)
    path = tmp_path / "block.py"
    path.write_text(text)
    return path, text, load_module(problem)


@pytest.mark.parametrize("block", BLOCKS)
def test_a_convolution_block_runs_in_channels_last_and_passes_the_stages(tmp_path, block):
    body, convolutions = BLOCKS[block]
    path, text, problem = starter(tmp_path, body)
    # traced NHWC: the input copied into channels_last at the top, the kernels' outputs
    # allocated in it, the weights put in it once after the reference's draws
    assert "to_channels_last(in0)" in text and "torch.empty_strided(" in text, text
    assert "self.to(memory_format=torch.channels_last)" in text
    assert "torch.empty((" not in text  # no NCHW activation left
    assert source_check.refusal(path) is None
    kernel = load_module(path)

    torch.manual_seed(5)
    model = problem.Model().eval()
    torch.manual_seed(5)
    new = kernel.ModelNew().eval()
    x = problem.get_inputs()[0]
    with torch.no_grad():
        want = model(x)
        for given in (x, x.contiguous(memory_format=torch.channels_last)):
            got = new(given)
            assert got.is_contiguous(memory_format=torch.channels_last)
            assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (block, given.stride())
        # as verify.py plugs it in: the model's own (NCHW) tensors at every call
        tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
        got = torch.func.functional_call(new, tensors, (x,))
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), block

    plan = region_kind.plan({k: getattr(kernel, k) for k in dir(kernel) if k.isupper()})
    result = gate.check(Runner(None, kernel.ModelNew), plan,
                        judge_class=region_kind.RegionJudge)
    assert result["correctness"] == "PASS", (block, result["reason"])
    assert result["library_calls"] == {"convolution": convolutions}, result


def test_a_block_that_channels_last_would_copy_in_stays_nchw(tmp_path):
    """A flatten of an NHWC (N, C, H, W) into a linear would be torch's copy: such a region is
    traced NCHW, as before, and still computes the reference."""
    path, text, problem = starter(tmp_path, """
        self.conv_weight = nn.Parameter(torch.randn((4, 3, 3, 3)) * 0.2)
        self.fc_weight = nn.Parameter(torch.randn((5, 64)) * 0.1)

    def forward(self, in0):
        h = torch.relu(torch.conv2d(in0, self.conv_weight, None, 1, 1))
        return F.linear(torch.flatten(h, 1), self.fc_weight)


def get_inputs():
    return [torch.randn((2, 3, 4, 4))]
""")
    assert "to_channels_last" not in text and "permute(0, 2, 3, 1)" not in text, text
    kernel = load_module(path)
    torch.manual_seed(1)
    model = problem.Model().eval()
    torch.manual_seed(1)
    new = kernel.ModelNew().eval()
    x = problem.get_inputs()[0]
    with torch.no_grad():
        assert torch.allclose(new(x), model(x), atol=1e-5)


def agrees(tmp_path, body, atol=1e-4):
    """The starter's text, after checking ModelNew computes the reference on an NCHW input,
    the same input in channels_last (a neighbouring block's output in verify.py), and the
    model's own tensors as verify.py passes them."""
    path, text, problem = starter(tmp_path, body)
    assert source_check.refusal(path) is None
    kernel = load_module(path)
    torch.manual_seed(2)
    model = problem.Model().eval()
    torch.manual_seed(2)
    new = kernel.ModelNew().eval()
    x = problem.get_inputs()[0]
    tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    with torch.no_grad():
        want = model(x)
        for given in (x, x.contiguous(memory_format=torch.channels_last)):
            assert torch.allclose(new(given), want, atol=atol, rtol=atol), given.stride()
        got = torch.func.functional_call(new, tensors, (x,))
        assert torch.allclose(got, want, atol=atol, rtol=atol)
    return text


CONV = """
        self.w = nn.Parameter(torch.randn((8, 3, 3, 3)) * 0.2)
        self.b = nn.Parameter(torch.randn((8,)) * 0.1)
        self.g = nn.Parameter(torch.rand((8,)) + 0.5)
        self.s = nn.Parameter(torch.randn((1, 1, 1)))      # one value for every element
        self.k = nn.Parameter(torch.tensor(1.5))            # a 0-d parameter
        self.register_buffer("rm", torch.randn((8,)) * 0.1)
        self.register_buffer("rv", torch.rand((8,)) + 0.5)

    def forward(self, in0):
        x = torch.conv2d(in0, self.w, self.b, 1, 1)
        return %s


def get_inputs():
    return [torch.randn((2, 3, 6, 5))]
"""


@pytest.mark.parametrize("tail", [
    # KernelBench level 2's epilogues: torch.min(x, torch.tensor(0.0)) is elementwise (the
    # constant written into the kernel), a (1, 1, 1) or 0-d parameter is one value every lane
    # loads (a block of the same address: a scalar pointer under a block mask is refused)
    "torch.nn.functional.gelu(torch.min(x + 0.5, torch.tensor(0.0))) * 2.0",
    "torch.max(x, torch.sigmoid(x) * 0.5) + torch.clamp_min(x, 0.1) + x.clamp_max(0.2)",
    "torch.sigmoid(x + self.s) * self.k",
    "F.selu(x) + F.celu(x, 0.5) + F.softsign(x) + F.logsigmoid(x) + F.mish(F.hardswish(x))",
    "F.dropout2d(torch.relu(x), 0.2, False, False)",
    # reductions over NHWC: a CNN's head (a mean over H and W), a softmax over the channels
    "torch.relu(x).mean([2, 3]) * self.g",
    "torch.softmax(x * 2.0, dim=1) - torch.relu(x).amax(1, keepdim=True)",
])
def test_level2_epilogues(tmp_path, tail):
    assert "to_channels_last(in0)" in agrees(tmp_path, CONV % tail)


@pytest.mark.parametrize("norm", [
    "F.instance_norm(x, None, None, None, None, True, 0.1, 1e-05) / 2.0",
    "torch.relu(F.instance_norm(x, None, None, self.g, self.b, True, 0.1, 1e-05))",
    "F.instance_norm(x, self.rm, self.rv, self.g, self.b, False, 0.1, 1e-05)",
])
def test_instance_norm_is_a_group_norm_of_one_channel_traced_nchw(tmp_path, norm):
    """torch's InstanceNorm returns NCHW for an NHWC input, so the channels_last trace would
    hand the next kernel a layout the norm's kernel does not write: the region runs NCHW, its
    input copied into NCHW where it comes channels_last."""
    text = agrees(tmp_path, CONV % norm)
    assert "to_contiguous(in0)" in text and "to_channels_last" not in text, text


def test_group_norm_of_a_gemm_output(tmp_path):
    """GroupNorm over (N, C): each group a run of C // G values of a row."""
    path, text, problem = starter(tmp_path, """
        self.w = nn.Parameter(torch.randn((16, 8)) * 0.2)
        self.g = nn.Parameter(torch.rand((16,)) + 0.5)
        self.b = nn.Parameter(torch.randn((16,)) * 0.1)

    def forward(self, in0):
        x = F.linear(in0, self.w)
        return F.hardtanh(F.group_norm(x, 4, self.g, self.b, 1e-05), -2.0, 2.0)


def get_inputs():
    return [torch.randn((3, 8))]
""")
    assert "group_norm" in text and "to_c" not in text  # (a 2-d input: nothing to copy)
    kernel = load_module(path)
    torch.manual_seed(2)
    model = problem.Model().eval()
    torch.manual_seed(2)
    new = kernel.ModelNew().eval()
    x = problem.get_inputs()[0]
    with torch.no_grad():
        assert torch.allclose(new(x), model(x), atol=1e-5)


@pytest.mark.parametrize("tail, says", [
    ("torch.tanh(torch.min(x, dim = 1, keepdim = True)[0])", "min over dim 1 (a reduction"),
    ("x.var([2, 3])", "var over dim [2, 3] (a reduction"),
    ("torch.sigmoid(torch.logsumexp(x, dim = 1) * 2.0)", "logsumexp over dim 1 (a reduction"),
])
def test_a_reduction_is_a_one_line_starter_error(tmp_path, tail, says):
    with pytest.raises(region_starter.StarterError, match=re.escape(says)):
        starter(tmp_path, CONV % tail)


def test_the_calls_before_a_group_norm_are_computed_in_its_statistics_pass(tmp_path):
    """conv, bias, scale, sigmoid, GroupNorm (KernelBench level 2's 21st): the sigmoid's output
    never goes through memory, so in fp16 it is not rounded before the normalization divides
    the group's small spread into it (Model itself, rounding it, misses fp16's tolerance of the
    float64 result on some seeds)."""
    text = agrees(tmp_path, CONV % "F.group_norm(torch.sigmoid((x + self.s) * self.g[:, None, "
                                   "None]), 4, self.g, self.b, 1e-05)")
    assert text.count("def _fused_") == 1, text
    path, _, problem = starter(tmp_path, CONV % "F.group_norm(torch.sigmoid((x + self.s) * "
                                                "self.g[:, None, None]), 4, self.g, self.b)")
    kernel = load_module(path)
    for seed in range(3):
        torch.manual_seed(seed)
        model = problem.Model().eval()
        x = problem.get_inputs()[0]
        with torch.no_grad():
            want = model.double()(x.double())
            mine = kernel.ModelNew().eval()
            mine.load_state_dict(model.state_dict())
            got = mine.half()(x.half()).double()
            theirs = model.half()(x.half()).double()
        assert (got - want).abs().max() <= (theirs - want).abs().max() + 1e-3


def test_a_view_channels_last_cannot_take_falls_back_to_nchw_quietly(tmp_path, capsys):
    """LeNet-5's x.view(-1, 400) of an NHWC activation raises in the channels_last trace: the
    region is traced NCHW, and ShapeProp's printed traceback stays off the terminal (extract.py
    prints one line a region); F.linear is written by its public name (the source check refuses
    torch._C's)."""
    text = agrees(tmp_path, """
        self.w = nn.Parameter(torch.randn((4, 3, 3, 3)) * 0.2)
        self.fc = nn.Parameter(torch.randn((5, 64)) * 0.1)

    def forward(self, in0):
        x = F.max_pool2d(torch.relu(torch.conv2d(in0, self.w, None, 1, 1)), 2)
        return F.linear(x.view(-1, 64), self.fc)


def get_inputs():
    return [torch.randn((2, 3, 8, 8))]
""")
    assert "to_contiguous(in0)" in text and "to_channels_last" not in text
    assert "Traceback" not in capsys.readouterr().err
