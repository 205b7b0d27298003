"""The graph swap (autokernel/swap_graph.py) on the CPU interpreter: attention a model writes out
as torch ops (minGPT's causal attention, its mask a tril buffer; an encoder's bidirectional one;
grouped-query heads repeated) is profiled as flash_attention, extracted as a kernel file, and
plugged into each module's captured graph by verify.py, calls counted and outputs matching, in
eager and inside torch.compile. A wrong kernel, a mask the caller passes, cross attention and
inputs of another shape are named fallbacks, never wrong values."""
import json
import math

import pytest
import torch
import torch.nn as nn

import autokernel
import extract
import verify
from autokernel import reference, swap_graph, verify_run, verify_select
from autokernel.contract import load_module
from autokernel.endtoend import checked_forward, compare_runs, forward
from autokernel.kernel_call import Kernel
from autokernel.swap import Swap, pluggable_types

profile_script = load_module(autokernel.ROOT / "profile.py", "profile_under_test")
STARTER = autokernel.ROOT / "kernels" / "flash_attention.py"
TEST_KERNEL = autokernel.ROOT / "tests" / "kernels_for_verify" / "flash_attention.py"

MODEL = '''
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):  # minGPT's
    def __init__(self, n_embd, n_head, max_seqlen):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.attn_dropout = nn.Dropout(0.1)
        self.register_buffer("bias", torch.tril(torch.ones(max_seqlen, max_seqlen))
                             .view(1, 1, max_seqlen, max_seqlen))
        self.n_head, self.n_embd = n_head, n_embd

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = self.attn_dropout(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class Encoder(nn.Module):  # bidirectional: no mask, the scores divided, torch.softmax
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.n_head = n_head

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (t.reshape(B, T, self.n_head, -1).permute(0, 2, 1, 3) for t in (q, k, v))
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)
        return (att @ v).permute(0, 2, 1, 3).reshape(B, T, C)


class Model(nn.Module):
    def __init__(self, n_embd, n_head, max_seqlen):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, max_seqlen)
        self.enc = Encoder(n_embd, n_head)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.enc(self.ln_2(x))


def get_inputs():
    return [torch.randn(2, 16, 32)]


def get_init_inputs():
    return [32, 2, 32]
'''


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    work = tmp_path_factory.mktemp("graph_swap")
    (work / "net.py").write_text(MODEL)
    return work, load_module(work / "net.py", "graph_swap_net")


def model_of(module, seed=0):
    torch.manual_seed(seed)
    return module.Model(*module.get_init_inputs()).eval(), tuple(module.get_inputs())


def wrong_kernel(tmp_path):
    """The test kernel with the causal flag ignored: every query sees every key."""
    bad = tmp_path / "flash_attention_no_mask.py"
    text = TEST_KERNEL.read_text()
    assert "CAUSAL=bool(causal)" in text
    bad.write_text(text.replace("CAUSAL=bool(causal)", "CAUSAL=False"))
    return verify_select.load_kernel(bad)


def test_profile_extract_verify_plug_the_written_out_attention(net, capsys):
    work, _ = net
    profile_json = work / "profile.json"
    assert profile_script.main(["--model", str(work / "net.py"), "--output", str(profile_json),
                                "--warmup", "0", "--iters", "1"]) == 0
    entries = json.loads(profile_json.read_text())["entries"]
    attention = {e["name"]: e for e in entries if e["kernel_type"] == "flash_attention"}
    assert set(attention) == {"CausalSelfAttention", "Encoder"}
    assert attention["CausalSelfAttention"]["shape_detail"][0]["variant"] == {}  # causal
    assert attention["Encoder"]["shape_detail"][0]["variant"] == {"causal": False}
    assert all(e["pluggable"] for e in attention.values())

    capsys.readouterr()
    assert extract.main(["--profile", str(profile_json), "--workspace", str(work),
                         "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "skipped" not in out or "(flash_attention)" not in out, out
    plan = json.loads((work / "plan.json").read_text())
    fa = next(k for k in plan["kernels"] if k["kernel_type"] == "flash_attention")
    assert fa["shapes"] == [[2, 2, 16, 16]] and (work / fa["file"].split("/")[-1]).is_file()

    report_json = work / "verify.json"
    assert verify.main(["--model", str(work / "net.py"), "--kernels", str(STARTER),
                        "--no-timing", "--no-regate", "--out", str(report_json)]) == 0
    report = json.loads(report_json.read_text())
    entry = report["kernels"][0]
    assert report["passed"] and entry["status"] == "ok" and entry["fallbacks"] == {}, entry
    assert entry["calls"] == 2 and entry["shapes"] == ["2x2x16x16"]  # one call per instance


def test_a_wrong_kernel_falls_back_where_it_disagrees_with_the_reason(net, tmp_path):
    _, module = net
    model, inputs = model_of(module)
    report = verify_run.verify(model, inputs, [wrong_kernel(tmp_path)], timing=False)
    entry = report["kernels"][0]
    # The causal instance keeps its own forward, named; the bidirectional one takes the kernel.
    assert entry["calls"] == 1 and report["correctness"]["passed"], str(entry)
    (reason, n), = entry["fallbacks"].items()
    assert reason.startswith("at attn: the forward with flash_attention differs from its own")
    # Alone with the causal attention, the kernel never runs: the run fails, with the reason.
    attn = model.attn
    report = verify_run.verify(attn, (torch.randn(2, 16, 32),), [wrong_kernel(tmp_path)],
                               timing=False)
    assert not report["passed"] and report["kernels"][0]["status"] == "never ran"
    assert any("differs from its own" in f for f in report["failures"]), report["failures"]


def run_swapped(model, inputs, kernels, compiled):
    """(the swap, the model's run with the kernels in): eager, each instance checked at its
    first call; compiled, the compiled forward's (its calls alone counted, after an eager
    forward that checks), which must have no graph break."""
    swap = Swap(kernels, compiled=compiled)
    try:
        with swap.installed(model):
            run = checked_forward(model, inputs)
            if compiled:
                assert verify_run.graph_breaks(model, inputs) == 0
                model = torch.compile(model, backend="aot_eager")
                forward(model, inputs)
                swap.reset()
                run = checked_forward(model, inputs)
    finally:
        torch._dynamo.reset()
    return swap, run


def test_inside_torch_compile_the_kernel_is_one_op_without_graph_breaks(net):
    _, module = net
    model, inputs = model_of(module)
    run_ref = checked_forward(model, inputs)
    swap, run = run_swapped(model, inputs, [verify_select.load_kernel(TEST_KERNEL)], True)
    assert dict(swap.calls) == {"flash_attention": 2} and not swap.fallbacks
    assert compare_runs(run, run_ref)["passed"]


def test_regions_beside_written_out_attention_are_plugged_into_the_same_graphs(net, tmp_path):
    """The profile's regions of this model: the qkv split (a tuple out), the mask's test, the
    copy after minGPT's attention (it reads the attention's output), the encoder's chunk, and
    the residual add of the model's own forward (twice there). Each as a region kernel
    (ModelNew: its reference's Model) beside the flash_attention kernel: the model's graph holds
    the adds and, inside it, the blocks' regions and attention, every one plugged and counted,
    eager and inside torch.compile, and the outputs match."""
    _, module = net
    model, inputs = model_of(module)
    result = profile_script.profile_model(model, inputs, torch.device("cpu"), torch.float32,
                                          warmup=0, iters=1)
    kernels = []
    for e in result["entries"]:
        r = e.get("region")
        if r:
            path = tmp_path / f"{r['label']}_{r['id']}.py"
            path.write_text(r["reference"])
            assert r["plug"] is None  # none is a whole forward: each is a graph's part
            kernels.append(Kernel(r["id"], "region", path, load_module(path, r["id"]).Model,
                                  [], False, r["instances"], None, r["id"]))
    ops = {k.name: next(e["region"]["ops"] for e in result["entries"] if e["name"].endswith(
        k.name)) for k in kernels}
    assert sorted(map(tuple, ops.values())) == [("add",), ("chunk",), ("contiguous",),
                                                 ("eq",), ("split",)], ops
    # the mask's test: read only by the attention, which the flash kernel replaces (causal)
    mask = next(n for n, o in ops.items() if o == ["eq"])
    want = {k.name: 2 if ops[k.name] == ["add"] else 1 for k in kernels if k.name != mask}
    want["flash_attention"] = 2
    run_ref = checked_forward(model, inputs)
    for compiled in (False, True):
        swap, run = run_swapped(model, inputs, [verify_select.load_kernel(TEST_KERNEL), *kernels],
                                compiled)
        said = {k: list(v) for k, v in swap.fallbacks.items() if v}  # (an eager run's)
        assert dict(swap.calls) == want and list(said) == ([] if compiled else [mask]), \
            (compiled, dict(swap.calls), said)
        assert compiled or said[mask][0].startswith("at attn: what it computes is read only by")
        assert compare_runs(run, run_ref)["passed"]


class Recording:
    """A flash_attention kernel_fn (the reference) that records what it was given."""

    def __init__(self):
        self.calls = []

    def __call__(self, Q, K, V, causal=True, scale=None):
        self.calls.append((tuple(Q.shape), tuple(K.shape), causal, scale))
        return reference.flash_attention(Q, K, V, causal, scale)


def recording_swap(compiled=False):
    fn = Recording()
    return Swap([Kernel("rec", "flash_attention", TEST_KERNEL, fn)], compiled=compiled), fn


class GroupedQuery(nn.Module):
    """Two query heads per key/value head, k and v repeated, the scale a multiplier on the left,
    a causal mask built in the forward."""

    def __init__(self):
        super().__init__()
        self.q, self.kv = nn.Linear(32, 32), nn.Linear(32, 32)

    def forward(self, x):
        B, S, _ = x.shape
        q = self.q(x).view(B, S, 4, 8).transpose(1, 2)
        k, v = (t.view(B, S, 2, 8).transpose(1, 2) for t in self.kv(x).split(16, dim=-1))
        k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
        scores = 0.5 * (q @ k.transpose(-2, -1))
        future = torch.ones(S, S, dtype=torch.bool, device=x.device).triu(1)
        probs = scores.masked_fill(future, float("-inf")).softmax(-1)
        return (probs @ v).transpose(1, 2).reshape(B, S, 32)


def test_grouped_query_heads_reach_the_kernel_unrepeated_with_the_graphs_scale():
    torch.manual_seed(0)
    model, x = GroupedQuery().eval(), torch.randn(2, 8, 32)
    want = model(x)
    swap, fn = recording_swap()
    with torch.no_grad(), swap.installed(model):
        got = model(x)
    assert fn.calls[-1] == ((2, 4, 8, 8), (2, 2, 8, 8), True, 0.5)
    assert swap.calls["rec"] == 1 and torch.allclose(got, want, atol=1e-5)


def test_inputs_of_another_shape_are_captured_and_checked_again(net, monkeypatch):
    _, module = net
    model, _ = model_of(module)
    captures = []
    capture = swap_graph._capture
    monkeypatch.setattr(swap_graph, "_capture", lambda *a: captures.append(a) or capture(*a))
    xs = [torch.randn(1, S, 32) for S in (16, 8, 16, 4, 2, 3)]
    with torch.no_grad():
        wants = [model(x) for x in xs]
    swap, fn = recording_swap()
    with torch.no_grad(), swap.installed(model):
        for x, want in zip(xs, wants):
            assert torch.allclose(model(x), want, atol=1e-5)
    # 5 signatures per instance: the first 4 captured and plugged, the 5th its own forward
    assert len(captures) == 2 * 4 and swap.calls["rec"] == 2 * (4 + 1)
    assert all(r.endswith(f"inputs of more than {swap_graph.MAX_SIGNATURES} signatures: the "
                          "rest run its own forward") for r in swap.fallbacks["flash_attention"])
    # A second swap of the same model rewrites and checks the captured graphs again, no capture.
    swap, fn = recording_swap()
    with torch.no_grad(), swap.installed(model):
        model(torch.randn(1, 8, 32))
    assert len(captures) == 8 and swap.calls["rec"] == 2



class MaskedByCaller(nn.Module):
    """The mask is the caller's (causal in this call, but the next call's may not be)."""

    def forward(self, x, blocked):
        B, S, _ = x.shape
        q = k = v = x.view(B, S, 2, 16).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1)) * 0.25
        out = scores.masked_fill(blocked, float("-inf")).softmax(-1) @ v
        return out.transpose(1, 2).reshape(B, S, 32)


class Cross(nn.Module):
    """Queries of x over keys of a memory of another length."""

    def forward(self, x, memory):
        q, kv = x.unsqueeze(1), memory.unsqueeze(1)
        return (torch.softmax(q @ kv.transpose(-2, -1) / math.sqrt(32), -1) @ kv).squeeze(1)


class Unpluggable(nn.Module):
    def __init__(self):
        super().__init__()
        self.masked, self.cross = MaskedByCaller(), Cross()

    def forward(self, x, blocked, memory):
        return self.cross(self.masked(x, blocked), memory)


def test_what_the_graph_swap_cannot_plug_is_skipped_with_its_reason():
    torch.manual_seed(0)
    model = Unpluggable().eval()
    inputs = (torch.randn(2, 8, 32), torch.ones(8, 8, dtype=torch.bool).triu(1),
              torch.randn(2, 4, 32))
    result = profile_script.profile_model(model, inputs, torch.device("cpu"), torch.float32,
                                          warmup=0, iters=1)
    attention = {e["name"]: e for e in result["entries"] if e["kernel_type"] == "flash_attention"}
    assert attention["MaskedByCaller"]["pluggable"] is False
    assert "mask is computed from the forward's arguments" in \
        attention["MaskedByCaller"]["pluggable_note"]
    merged, skipped = extract.merge_by_type(result["entries"])
    assert "flash_attention" not in {m["kernel_type"] for m in merged}
    why = {name: reason for name, t, reason in skipped if t == "flash_attention"}
    assert why["MaskedByCaller"].startswith("verify.py cannot plug a kernel in where the model "
                                            "computes it: ")  # each place, named
    assert "at masked: its mask is computed from the forward's arguments" in why["MaskedByCaller"]
    assert why["Cross"].startswith("cross attention (8 queries, 4 keys)")
    # verify.py's swap says the same where it runs
    swap, fn = recording_swap()
    with torch.no_grad(), swap.installed(model):
        model(*inputs)
    assert not fn.calls and sorted(r.split(":")[0] for r in swap.fallbacks["flash_attention"]) \
        == ["at cross", "at masked"]
    assert pluggable_types(model, lambda m: m(*inputs), {"flash_attention"}) == set()
