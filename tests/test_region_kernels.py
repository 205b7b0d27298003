"""Region kernels on the CPU interpreter: extract.py writes a top region as a kernel file (its
reference frozen beside it, a starter of library calls and fused Triton kernels), bench.py judges
it under the region kind (the KernelBench stages, the libraries' convolutions and GEMMs allowed
and named, every other torch op refused), verify.py leaves it out with a note. The models are
written here the way users write theirs: a residual conv block, a written-out GELU MLP, a
GroupNorm + SiLU + conv block."""
import json
import math
import shutil
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import autokernel
from autokernel import gate, region_kind, region_starter, source_check
from autokernel.child import Runner
from autokernel.contract import load_module

profile_script = load_module(autokernel.ROOT / "profile.py", "profile_for_region_kernels")


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x):
        h = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(h)) + x)


class GELUMLP(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        h = self.fc1(x)
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h ** 3)))
        return self.fc2(h)


class GroupNormSiLUConv(nn.Module):  # a diffusion model's resnet half-block
    def __init__(self, c):
        super().__init__()
        self.norm, self.conv = nn.GroupNorm(4, c), nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x):
        return self.conv(nn.functional.silu(self.norm(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.block, self.mlp, self.diffusion = Block(8), GELUMLP(32), GroupNormSiLUConv(8)

    def forward(self, x):
        h = torch.softmax(self.diffusion(self.block(x)), 1)  # over channels: no kernel type's
        return self.mlp(h.flatten(2) * 0.5)


def trained_like(model):
    torch.manual_seed(0)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    return model.eval()


@pytest.fixture(scope="module")
def extracted(tmp_path_factory):
    """profile.py's ranking of Net and extract.py --top 5 on it: (workspace, plan, stdout)."""
    import extract
    work = tmp_path_factory.mktemp("regions")
    result = profile_script.profile_model(trained_like(Net()), [torch.randn(2, 8, 4, 8)],
                                          torch.device("cpu"), torch.float32, warmup=0, iters=1,
                                          description="Net")
    result.update(model="Net", model_args={})
    (work / "profile.json").write_text(json.dumps(result))
    out = subprocess.run([sys.executable, "-c", "import sys, extract; sys.exit(extract.main("
                          f"['--profile', {str(work / 'profile.json')!r}, '--workspace', "
                          f"{str(work)!r}, '--top', '5']))"], cwd=autokernel.ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    return work, json.loads((work / "plan.json").read_text()), out.stdout


def test_extract_writes_top_regions_beside_the_types(extracted):
    work, plan, stdout = extracted
    kinds = {k["name"]: k["kernel_type"] for k in plan["kernels"]}
    assert "matmul" in kinds.values() and list(kinds.values()).count("region") >= 2, kinds
    block = next(k for k in plan["kernels"] if k["name"].startswith("block_"))
    assert block["region"]["instances"] == ["block"] and block["ops"][0] == "conv2d"
    text = (work / f"{block['name']}.py").read_text()
    assert 'KERNEL_TYPE = "region"' in text and "class ModelNew(nn.Module)" in text
    assert (work / "regions" / f"Block_{block['region']['id']}.py").is_file()
    diffusion = next(k for k in plan["kernels"] if k["name"].startswith("groupnormsiluconv_"))
    assert diffusion["ops"] == ["group_norm", "silu", "conv2d"]
    # A softmax over channels has no generated starter yet: said in one line, its reference kept
    assert "skipped region Net:" in stdout and "softmax" in stdout, stdout
    shares = [k["share"] for k in plan["kernels"]]
    assert shares == sorted(shares, reverse=True)  # regions and types ranked together


def test_a_region_kernel_passes_the_gate_and_names_its_library_calls(extracted):
    work, plan, _ = extracted
    block = next(k for k in plan["kernels"] if k["name"].startswith("block_"))
    proc = subprocess.run([sys.executable, "bench.py", "--kernel", str(work / block["file"]
                           .split("/")[-1]), "--correctness-only"], cwd=autokernel.ROOT,
                          capture_output=True, text=True, timeout=600)
    assert "verdict: CHECKED" in proc.stdout and "PASS" in proc.stdout, proc.stdout[-3000:]
    assert "stage_5_edge: skipped (a region runs at the model's shapes" in proc.stdout


def judged(path):
    module = load_module(path)
    plan = region_kind.plan({k: getattr(module, k) for k in dir(module) if k.isupper()})
    return gate.check(Runner(None, module.ModelNew), plan, judge_class=region_kind.RegionJudge)


def test_in_process_the_starters_pass_and_their_convolutions_are_counted(extracted):
    work, plan, _ = extracted
    for k in plan["kernels"]:
        if k["kernel_type"] != "region":
            continue
        result = judged(work / k["file"].split("/")[-1])
        assert result["correctness"] == "PASS", (k["name"], result["reason"])
        if "conv2d" in k["ops"]:
            assert result["library_calls"] == {"convolution": 2}, result


def test_torch_doing_a_regions_elementwise_math_is_refused(extracted, tmp_path):
    """The libraries' GEMMs and convolutions are allowed in a region kernel; torch's relu or
    batch_norm is not: statically (the source check) and when it runs (the op guard)."""
    work, plan, _ = extracted
    block = next(k for k in plan["kernels"] if k["name"].startswith("block_"))
    text = (work / block["file"].split("/")[-1]).read_text()
    cheat = text.replace("        return y1", "        return torch.relu(y1)")
    assert cheat != text
    path = tmp_path / "cheat.py"
    path.write_text(cheat)
    assert "torch doing the math" in source_check.refusal(path)
    assert source_check.refusal(work / block["file"].split("/")[-1]) is None
    result = judged(path)
    assert result["correctness"] == "FAIL" and "called torch compute op aten.relu" in \
        result["reason"], result


def run_both(source, model_class, inputs):
    """The generated starter's ModelNew against the reference's Model, built under one seed."""
    torch.manual_seed(3)
    want = model_class().eval()(*inputs)
    namespace = {}
    exec(compile(source, "starter.py", "exec"), namespace)
    torch.manual_seed(3)
    got = namespace["ModelNew"]().eval()(*inputs)
    return got, want


REFERENCE = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.bias = nn.Parameter(torch.randn((6,)) * 0.5 + 0.1)

    def forward(self, in0, in1):
        {body}


def get_inputs():
    return [torch.randn((2, 4, 5, 6)), torch.randn((2, 6, 5, 4))]


def get_init_inputs():
    return []
'''
BODIES = {
    "broadcast bias, a permuted operand, hardtanh": "return torch.nn.functional.hardtanh("
    "in0 + self.bias + in1.permute(0, 3, 2, 1), -0.5, 0.5)",
    "a transposed copy (a region of copies)": "return in0.transpose(1, 3).contiguous() * 2",
    "comparisons and where": "return torch.where(in0 > in1.permute(0, 3, 2, 1), in0, "
    "torch.sigmoid(in0))",
    "two outputs of one kernel": "a = torch.nn.functional.silu(in0 + self.bias)\n"
    "        return a * 3, torch.nn.functional.gelu(a) - 1",
    "a max pool with stride and padding, then relu": "return torch.relu(torch.nn.functional."
    "max_pool2d(in0 - 0.5, 3, 2, 1))",
    "an average pool that leaves the padding out": "return torch.nn.functional.avg_pool2d("
    "in0, 2, 1, 1, count_include_pad=False)",
    "a global average pool, flattened (a classifier's head)": "return torch.flatten("
    "torch.nn.functional.adaptive_avg_pool2d(in0, 1), 1)",
    "GroupNorm, SiLU (a diffusion block's) on offset data": "return torch.nn.functional.silu("
    "torch.nn.functional.group_norm(in0 * 3 + 100, 2, self.bias[:4] * 2, self.bias[2:]))",
    "cat along the last dim, one input permuted": "return torch.cat([in0, in1.permute(0, 3, 2, "
    "1)], -1) + 1",
}


@pytest.mark.parametrize("what", BODIES)
def test_generated_kernels_compute_what_the_reference_computes(tmp_path, what):
    path = tmp_path / "reference.py"
    path.write_text(REFERENCE.replace("{body}", BODIES[what]))
    source = region_starter.starter_source(path, {"doc": what, "contract":
                                                  'KERNEL_TYPE = "region"'})
    assert "@triton.jit" in source
    problem = load_module(path)
    with torch.no_grad():
        got, want = run_both(source, problem.Model, problem.get_inputs())
    for g, w in zip(*((got, want) if isinstance(got, tuple) else ((got,), (want,)))):
        assert g.shape == w.shape and torch.allclose(g.float(), w.float(), atol=1e-5), what


def test_a_call_with_no_generated_code_is_named(tmp_path):
    path = tmp_path / "reference.py"
    path.write_text(REFERENCE.replace("{body}", "return torch.softmax(in0, -1)"))
    with pytest.raises(region_starter.StarterError, match="softmax"):
        region_starter.starter_source(path, {"doc": "", "contract": ""})


def test_verify_leaves_region_kernels_out_with_a_note(extracted, tmp_path):
    work, plan, _ = extracted
    from autokernel import verify_select
    repo_plan = tmp_path / "plan.json"
    shutil.copy(work / "plan.json", repo_plan)
    args = type("Args", (), {"kernels": None, "starters": False, "plan": str(repo_plan),
                             "no_regate": True, "backend": "triton"})()
    specs, _ = verify_select.kernel_specs(args)
    assert [s[2] for s in specs] == ["matmul"]
