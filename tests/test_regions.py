"""Regions (autokernel/regions.py): the model's own computation outside the kernel types, cut
per module into convex pieces, grouped by what they compute, profiled, and written as standalone
reference files that compute what the model computes."""
import json

import pytest
import torch
import torch.nn as nn

import autokernel
from autokernel import graph_capture, regions
from autokernel.contract import load_module

profile_script = load_module(autokernel.ROOT / "profile.py", "profile_for_regions")


class BasicBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        return self.relu(self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x))))) + x)


class NewGELU(nn.Module):  # minGPT's, written out
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(0.7978845608 * (x + 0.044715 * torch.pow(x, 3.0))))


class Net(nn.Module):
    def __init__(self, c=8):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.blocks = nn.Sequential(BasicBlock(c), BasicBlock(c))
        self.wide = BasicBlock(2 * c)
        self.inverted = nn.Sequential(  # a block built as a Sequential, as MobileNetV2's are
            nn.Conv2d(2 * c, 2 * c, 1), nn.BatchNorm2d(2 * c), nn.ReLU6())
        self.head = nn.ModuleDict(dict(fc=nn.Linear(2 * c, 10), act=NewGELU()))
        head = self.head
        self.head_forward = lambda h: head.act(head.fc(h))  # minGPT's MLP, reached by a lambda

    def forward(self, x):
        h = self.blocks(torch.relu(self.stem(x)))
        h = self.inverted(self.wide(torch.cat([h, h], 1)))
        return self.head_forward(torch.flatten(nn.functional.adaptive_avg_pool2d(h, 1), 1))


def trained_like(model):
    """BatchNorm with the statistics and affine of a trained model, so no parameter is a
    constant a wrong reference could get away with."""
    torch.manual_seed(0)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.5, 0.5)
    return model.eval()


def captured(model, x):
    return captured_with(model, (x,))


def captured_with(model, inputs):
    found = {}
    with torch.no_grad(), graph_capture.recognized_forward(model, inputs, say=lambda m: None,
                                                           regions=found, origin="Net") as fwd:
        out = fwd(*inputs)
    return found, out


def swapped(region, model, x, tmp_path, path=None):
    """The region kernel file at path (default: the starter of the region's reference, written
    under tmp_path) plugged in where the region's instances are, as a plan row names it: (the
    swap, the model's own output on x, its output with the kernel in)."""
    from autokernel import region_starter
    from autokernel.kernel_call import Kernel
    from autokernel.swap import Swap
    if path is None:
        (tmp_path / "ref.py").write_text(region["reference"])
        path = tmp_path / "k.py"
        path.write_text(region_starter.starter_source(
            tmp_path / "ref.py", {"doc": "", "contract": 'KERNEL_TYPE = "region"'}))
    kernel = Kernel("k", "region", path, load_module(path).ModelNew,
                    instances=region["instances"], plug=region["plug"], region_id=region["id"])
    swap = Swap([kernel])
    with torch.no_grad():
        want = model(x)
        with swap.installed(model):
            got = model(x)
    return swap, want, got


def test_regions_are_cut_per_module_and_grouped_by_what_they_compute():
    found, _ = captured(trained_like(Net()), torch.randn(2, 3, 8, 8))
    by_label = {}
    for r in found.values():
        by_label.setdefault(r["label"], []).append(r)
    # The two blocks of the same width are one region with two instances; the wide one differs
    # in its shapes, so it is a region of its own.
    blocks = sorted(by_label["BasicBlock"], key=lambda r: -len(r["instances"]))
    assert [sorted(r["instances"]) for r in blocks] == [["blocks.0", "blocks.1"], ["wide"]]
    assert blocks[0]["ops"] == ["conv2d", "batch_norm", "relu", "conv2d", "batch_norm", "add",
                                "relu"]
    params = [i["parameter"] for i in blocks[0]["inputs"] if i["parameter"]]
    assert "conv1_weight" in params and "bn2_running_var" in params
    # The written-out GELU is one region (its branches joined), the linear stays a matmul.
    (gelu,) = by_label["NewGELU"]
    assert gelu["instances"] == ["head.act"]  # the module's name, not the lambda's way to it
    assert sorted(gelu["ops"]) == sorted(["mul", "pow", "mul", "add", "mul", "tanh", "add",
                                          "mul"])
    assert all("linear" not in r["ops"] for r in found.values())
    # A Sequential block is a region of its own, not part of the model's forward.
    (inverted,) = by_label["Sequential"]
    assert inverted["ops"] == ["conv2d", "batch_norm", "hardtanh"]
    assert inverted["instances"] == ["inverted"]
    # The model's own forward: stem + relu, then (after the blocks) cat, then the pooling.
    own = [r["ops"] for r in by_label["Net"]]
    assert ["conv2d", "relu"] in own and any("adaptive_avg_pool2d" in ops for ops in own)


class DownBlock(BasicBlock):  # ResNet's first block of a stage: its shortcut a Sequential
    def __init__(self, c):
        super().__init__(c)
        self.downsample = nn.Sequential(nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        out = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
        return self.relu(out + self.downsample(x))


class Stage(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = DownBlock(4)

    def forward(self, x):
        return self.block(x)


def test_a_container_inside_a_block_is_part_of_the_blocks_region():
    """The downsample Sequential runs inside the block's forward: one region, the whole
    forward (a region of its own would leave the block's region taking its output as an
    input, which no module's forward takes: ResNet18's stage-opening blocks went unplugged)."""
    found, _ = captured(trained_like(Stage()), torch.randn(1, 4, 6, 6))
    assert [r["label"] for r in found.values()] == ["DownBlock"], found
    (block,) = found.values()
    assert block["instances"] == ["block"] and block["ops"].count("conv2d") == 3
    assert [i["parameter"] for i in block["inputs"]].count(None) == 1  # x alone


def test_a_reference_file_computes_what_the_model_computes():
    model = trained_like(Net())
    found, _ = captured(model, torch.randn(2, 3, 8, 8))
    record = next(r for r in found.values() if r["label"] == "BasicBlock"
                  and "wide" in r["instances"])
    problem = {}
    exec(compile(record["reference"], "region.py", "exec"), problem)
    ref = problem["Model"](*problem["get_init_inputs"]()).eval()
    (x,) = problem["get_inputs"]()
    assert list(x.shape) == record["inputs"][0]["shape"] == [2, 16, 8, 8]
    # Drawn like the real ones: a running variance stays positive, nothing is a constant.
    assert (ref.bn1_running_var > 0).all() and ref.conv1_weight.std() > 0
    # With the model's own parameters in, it is the model's block.
    with torch.no_grad():
        used = dict(ref.named_parameters()) | dict(ref.named_buffers())
        assert len(used) == 10  # two convs' weights, two BatchNorms' four tensors each
        for name, value in model.wide.state_dict().items():
            if name.replace(".", "_") in used:
                used.pop(name.replace(".", "_")).copy_(value)
        assert not used
        assert torch.equal(ref(x.clone()), model.wide(x.clone()))


def test_a_constant_parameter_is_drawn_with_a_spread():
    """A fresh BatchNorm's weight is all ones: a stand-in drawn as ones would let a kernel that
    skips the scale pass."""
    model = Net().eval()
    found, _ = captured(model, torch.randn(2, 3, 8, 8))
    record = next(r for r in found.values() if r["label"] == "BasicBlock")
    problem = {}
    exec(compile(record["reference"], "region.py", "exec"), problem)
    ref = problem["Model"]()
    assert ref.bn1_weight.std() > 0.01 and ref.bn1_running_mean.std() > 0.01


def test_profile_ranks_regions_beside_the_kernel_types(tmp_path, capsys):
    result = profile_script.profile_model(trained_like(Net()), [torch.randn(2, 3, 8, 8)],
                                          torch.device("cpu"), torch.float32, warmup=0, iters=1,
                                          description="Net")
    rows = [e for e in result["entries"] if e["group"] == "region"]
    assert rows and all(e["kernel_type"] is None and e["region"]["reference"] for e in rows)
    block = next(e for e in rows if e["region"]["instances"] == ["blocks.0", "blocks.1"])
    assert block["name"] == f"BasicBlock:{block['region']['id']}" and block["calls"] == 2
    assert block["shapes"] == [[2, 8, 8, 8]]
    assert result["region_pct"] > 90  # convolutions: almost all of this model's time
    assert any(e["kernel_type"] == "matmul" for e in result["entries"])
    assert abs(sum(e["share"] for e in result["entries"]) - 1) < 1e-6
    # extract.py ranks the regions beside the types: the blocks first (almost all the time)
    import extract
    result.update(model="Net", model_args={})
    (tmp_path / "profile.json").write_text(json.dumps(result))
    extract.main(["--profile", str(tmp_path / "profile.json"), "--workspace", str(tmp_path)])
    kinds = [k["kernel_type"] for k in json.loads((tmp_path / "plan.json").read_text())[
        "kernels"]]
    assert kinds[0] == "region", kinds


def test_module_paths_read_as_named_modules_spells_them():
    assert regions.module_path("L['self'].layers[0].mlp") == "layers.0.mlp"
    assert regions.module_path("getattr(L['self'].h, '0').attn") == "h.0.attn"
    assert regions.module_path("L['self'].blocks['a']") == "blocks.a"
    assert regions.module_path("L['self']") == ""


def test_a_region_whose_signature_starts_with_digits_keeps_its_id():
    """A scope's third field reads as a shape when it is all digits: a region's id never is."""
    from types import SimpleNamespace
    from autokernel.recognize import classify_event
    region = regions.Region(regions.REGION, None, set(), label="Block")
    region.note = regions.region_id("12345678" + "0" * 32)
    assert classify_event(SimpleNamespace(name=region.scope, input_shapes=[]))[:3] == \
        ("Block:r12345678", "region", None)


def test_a_reference_draws_masks_and_indices_of_their_own_kind():
    class Masked(nn.Module):
        def forward(self, x, mask, index):
            return torch.relu(x.masked_fill(mask, 0.0))[index] + 1

    x, mask, index = torch.randn(6, 4), torch.rand(6, 4) < 0.5, torch.tensor([0, 5, 2])
    found, _ = captured_with(Masked(), (x, mask, index))
    (record,) = found.values()
    problem = {}
    exec(compile(record["reference"], "region.py", "exec"), problem)
    inputs = problem["get_inputs"]()
    assert [t.dtype for t in inputs] == [torch.float32, torch.bool, torch.int64]
    assert int(inputs[2].min()) >= 0 and int(inputs[2].max()) <= 5  # the real indices' range
    assert problem["Model"]()(*inputs).shape == (3, 4)


def test_a_regions_bound_and_roofline_come_from_its_flops_and_bytes():
    """On a GPU (ceilings measured): 1 GFLOP over 1 MB is compute-bound at 100 TFLOP/s and
    1,000 GB/s (ridge: 100 FLOP a byte); its floor is 10 us a call, so 2 calls in 40 us reach
    50% of the roofline."""
    entry = {"time_us": 40.0, "calls": 2, "bound": "n/a", "pct_of_roofline": None}
    record = {"flops": 1e9, "bytes": 1e6, "inputs": [{"shape": [4, 8]}]}
    profile_script.add_region(entry, record, {"tflops": 100.0, "bandwidth_gb_s": 1000.0})
    assert entry["bound"] == "compute" and entry["pct_of_roofline"] == 50.0
    assert entry["shapes"] == [[4, 8]] and entry["region"] is record
    profile_script.add_region(entry, dict(record, flops=1e6), {"tflops": 100.0,
                                                               "bandwidth_gb_s": 1000.0})
    assert entry["bound"] == "memory" and entry["pct_of_roofline"] == 5.0  # 1 us a call


class Scaled(nn.Module):  # SwinV2's logit scale: a tensor made on the input's device
    def forward(self, x):
        return (x * torch.tensor(2.0, device=x.device).log()).clamp(-float("inf"), 1e4)


def test_a_reference_names_the_devices_and_constants_its_code_uses():
    model = nn.Sequential(nn.Linear(4, 4), Scaled()).eval()
    found, _ = captured(model, torch.randn(2, 4))
    (record,) = [r for r in found.values() if r["label"] == "Scaled"]
    assert "from torch import device" in record["reference"], record["reference"]
    problem = {}
    exec(compile(record["reference"], "region.py", "exec"), problem)
    x = problem["get_inputs"]()[0]
    assert torch.equal(problem["Model"]()(x), model[1](x))


class ConvNeXtBlock(nn.Module):
    """ConvNeXt's block: a depthwise conv, then a layernorm and a GELU MLP over channels last
    (kernel types), the residual added."""

    def __init__(self, c):
        super().__init__()
        self.dwconv = nn.Conv2d(c, c, 3, padding=1, groups=c)
        self.norm, self.fc1, self.fc2 = nn.LayerNorm(c), nn.Linear(c, 2 * c), nn.Linear(2 * c, c)

    def forward(self, x):
        h = self.dwconv(x).permute(0, 2, 3, 1)
        h = self.fc2(nn.functional.gelu(self.fc1(self.norm(h))))
        return x + h.permute(0, 3, 1, 2)


def test_a_region_that_is_all_a_child_computes_is_plugged_in_at_that_child(tmp_path):
    """The depthwise conv is the block's region but not its whole forward (the layernorm and
    linears are kernel types): it is swapped in at the conv, the child whose forward it is (the
    permute after it left to the block's code), with the instance's own weights; the residual
    add is no module's whole forward."""
    torch.manual_seed(0)
    model, x = nn.Sequential(ConvNeXtBlock(4), ConvNeXtBlock(4)).eval(), torch.randn(1, 4, 6, 6)
    found, _ = captured(model, x)
    (conv,) = [r for r in found.values() if r["ops"] == ["conv2d"]]
    assert conv["instances"] == ["0", "1"] and conv["plug"] == "dwconv"
    (residual,) = [r for r in found.values() if r["ops"] == ["add"]]
    assert residual["plug"] is None
    swap, want, got = swapped(conv, model, x, tmp_path)
    assert swap.calls["k"] == 2 and not swap.fallbacks["k"], swap.fallbacks
    assert torch.allclose(got, want, atol=1e-5)


def test_a_batch_first_encoder_layer_is_seen_through_its_fast_path(capsys):
    """nn.TransformerEncoderLayer(batch_first=True) in eval without autograd is one fused op
    (torch._transformer_encoder_layer_fwd): the profile and a swap turn its fast path off, so
    its linears, attention and norms are the kernel types' and kernels plug into them; the
    setting is the user's again afterwards."""
    from autokernel.endtoend import forward
    from autokernel.swap import pluggable_types
    torch.manual_seed(0)
    model = nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 2, 64, batch_first=True),
                                  num_layers=2, enable_nested_tensor=False).eval()
    x = torch.randn(2, 8, 32)
    with torch.no_grad():
        result = profile_script.profile_model(model, [x], torch.device("cpu"), torch.float32,
                                              warmup=0, iters=1)
    assert "fast path (one fused op in eval" in capsys.readouterr().out
    types = {e["kernel_type"] for e in result["entries"]}
    assert {"matmul", "layernorm", "flash_attention"} <= types, types
    ops = [op for e in result["entries"] if e.get("region") for op in e["region"]["ops"]]
    assert not any("transformer_encoder_layer" in op for op in ops), ops
    with torch.no_grad():
        plugged = pluggable_types(model, lambda m: forward(m, [x]))
    assert {"matmul", "layernorm", "flash_attention"} <= plugged, plugged
    assert torch.backends.mha.get_fastpath_enabled()


class CosineAttention(nn.Module):
    """Swin V2's window attention core: normalized q and k, a learned scale, a bias, softmax,
    then v (no kernel type's pattern: flash_attention takes neither the normalize nor the
    bias)."""
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.rand(2, 1, 1) + 1)
        self.bias = nn.Parameter(torch.randn(2, 9, 9) * 0.1)

    def forward(self, q, k, v):
        scores = nn.functional.normalize(q, dim=-1) @ nn.functional.normalize(k, dim=-1).transpose(
            -2, -1)
        return torch.softmax(scores * self.scale + self.bias, -1) @ v


def test_a_batched_matmul_is_part_of_its_region_not_the_matmul_type():
    """q @ k.T over batch and heads has no (M, N, K) of the matmul type: the regions around it
    take it and the @ v (library calls inside a region kernel), not the type, which extract.py
    would skip."""
    q, k, v = (torch.randn(2, 2, 9, 4) for _ in range(3))
    found, _ = captured_with(CosineAttention().eval(), (q, k, v))
    ops = sorted(r["ops"] for r in found.values())  # the softmax between them is its type's
    assert ops == [["matmul"], ["normalize", "normalize", "matmul", "mul", "add"]], ops


class SequentialNet(nn.Module):
    """KernelBench's MobileNetV2 in small: a stem of torch.nn layers straight in a Sequential
    (no block class of its own), then a block that is a Sequential of its own."""
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8),
                                      nn.ReLU6(inplace=True),
                                      nn.Sequential(nn.Conv2d(8, 8, 1, bias=False),
                                                    nn.BatchNorm2d(8)))

    def forward(self, x):
        return self.features(x).flatten(1)


def test_a_region_in_a_container_at_the_top_is_plugged_where_the_profile_cut_it(tmp_path):
    """The stem's conv, norm and clamp are a region of `features` (the container they ran in),
    part of its forward: the graph swap, which traces the model with the model's own module on
    Dynamo's stack (the profile's trace has not), cuts the same region there and plugs the
    kernel in (once it cut the whole model as one region of another id: silently never run)."""
    torch.manual_seed(0)
    model, x = trained_like(SequentialNet()).eval(), torch.randn(2, 3, 8, 8)
    found, _ = captured(model, x)
    (stem,) = [r for r in found.values() if r["ops"] == ["conv2d", "batch_norm", "hardtanh"]]
    assert stem["instances"] == ["features"] and stem["plug"] is None
    swap, want, got = swapped(stem, model, x, tmp_path)
    assert swap.calls["k"] == 1 and not swap.fallbacks["k"], swap.fallbacks
    assert torch.allclose(got, want, atol=1e-5)


class Act(nn.Module):  # an activation module of the model's own code (transformers' SiLU's)
    def forward(self, x):
        return nn.functional.silu(x)


class ConvNormAct(nn.Module):
    """MobileViT's conv layer: conv and norm, then its activation as a child of its own."""
    def __init__(self, c_in, c, act=True):
        super().__init__()
        self.conv, self.norm = nn.Conv2d(c_in, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.act = Act() if act else None

    def forward(self, x):
        y = self.norm(self.conv(x))
        return self.act(y) if self.act is not None else y


def test_a_region_after_a_kernel_that_changed_the_layout_is_still_plugged(tmp_path):
    """The first block's kernel (a starter: channels_last) hands the second block an input in
    another layout than the profile saw; the second's region, part of its forward (the
    activation is a module of its own), is cut from the graph of that forward on contiguous
    copies of its inputs, as the profile cut it, and runs (it was left out: 'not in the graph
    of this forward as the profile cut it')."""
    from autokernel import region_starter
    from autokernel.kernel_call import Kernel
    from autokernel.swap import Swap
    torch.manual_seed(0)
    model = trained_like(nn.Sequential(ConvNormAct(4, 8, act=False), ConvNormAct(8, 8))).eval()
    x = torch.randn(2, 4, 6, 6)
    found, _ = captured(model, x)
    kernels = []
    for i, r in enumerate(r for r in found.values() if r["ops"] == ["conv2d", "batch_norm"]):
        (tmp_path / f"ref{i}.py").write_text(r["reference"])
        path = tmp_path / f"k{i}.py"
        path.write_text(region_starter.starter_source(
            tmp_path / f"ref{i}.py", {"doc": "", "contract": 'KERNEL_TYPE = "region"'}))
        kernels.append(Kernel(f"k{i}", "region", path, load_module(path).ModelNew,
                              instances=r["instances"], plug=r["plug"], region_id=r["id"]))
    assert sorted(map(repr, (k.plug for k in kernels))) == ["''", "None"]
    swap = Swap(kernels)
    with torch.no_grad():
        want = model(x)
        with swap.installed(model):
            got = model(x)
    assert dict(swap.calls) == {"k0": 1, "k1": 1}, dict(swap.fallbacks)
    assert torch.allclose(got, want, atol=1e-5)


def test_a_transformers_activation_module_is_its_callers_as_torch_nn_s_are():
    """MobileViT's conv layer calls its activation as a module of transformers' (ACT2FN): like
    torch.nn's, that module is a library layer, so conv, norm and activation are one region of
    the layer (one fused kernel, the layer's whole forward), not two."""
    activations = pytest.importorskip("transformers.activations")

    class ConvLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.norm = nn.Conv2d(4, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4)
            self.activation = activations.ACT2FN["silu"]

        def forward(self, x):
            return self.activation(self.norm(self.conv(x)))
    found, _ = captured(trained_like(nn.Sequential(ConvLayer(), ConvLayer())).eval(),
                        torch.randn(2, 4, 6, 6))
    (layer,) = found.values()
    assert layer["ops"] == ["conv2d", "batch_norm", "silu"] and layer["plug"] == "", layer
    assert layer["instances"] == ["0", "1"]


class Drop(nn.Module):  # SegFormer's MLP ends in a dropout of its own module
    def forward(self, x):
        return nn.functional.dropout(x, 0.1, self.training)


def test_an_eval_mode_dropout_alone_is_no_region():
    """In eval a dropout hands its input back: alone in its module it computes nothing, so it
    is no region (its kernel would be a copy); inside a region it is the identity there."""
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.drop, self.tail = Drop(), Drop()

        def forward(self, x):
            return self.tail(torch.sigmoid(self.drop(x)) * 2)
    found, _ = captured(Net().eval(), torch.randn(2, 8))
    assert sorted(r["ops"] for r in found.values()) == [["sigmoid", "mul"]], found
