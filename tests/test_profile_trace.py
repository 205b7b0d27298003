"""profile.py --export-trace writes a Chrome trace (what ui.perfetto.dev and chrome://tracing
open) of the profiled forwards, and the report shows peak memory (a GPU's allocator peak; n/a on
a CPU)."""
import gzip
import json

import pytest

import autokernel
from autokernel.contract import load_module

# `import profile` finds the standard library's: the script is loaded by path under another name.
profile_script = load_module(autokernel.ROOT / "profile.py", "profile_under_test")

TINY = '''
import torch
class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)
    def forward(self, x):
        return torch.softmax(self.proj(x), dim=-1)
def get_inputs(batch, seq, device="cpu"):
    return (torch.randn(batch, seq, 16, device=device),)
'''


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """(profile.json, the trace file, printed report) of one profile with --export-trace."""
    root = tmp_path_factory.mktemp("trace")
    (root / "tiny.py").write_text(TINY)
    trace = root / "traces" / "tiny.json.gz"  # a folder that does not exist yet, compressed
    out = root / "profile.json"
    code = profile_script.main(["--model", str(root / "tiny.py"), "--input-shape", "2x8",
                                "--iters", "1", "--warmup", "0", "--output", str(out),
                                "--export-trace", str(trace)])
    assert code == 0
    return json.loads(out.read_text()), trace


def test_the_trace_is_chrome_trace_json_of_the_profiled_ops(profiled):
    result, trace = profiled
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    names = {e.get("name", "") for e in events if e.get("ph") == "X"}  # complete events
    assert "aten::linear" in names and "aten::softmax" in names
    assert all("ts" in e and "dur" in e for e in events if e.get("ph") == "X")
    assert result["trace"] == str(trace)


def test_peak_memory_is_null_on_a_cpu_and_the_report_says_why(profiled, capsys):
    result, _ = profiled
    assert result["peak_memory_mib"] is None and result["resident_memory_mib"] is None
    profile_script.print_report(result, top=3)
    assert "peak memory:  n/a (CPU run" in capsys.readouterr().out


def test_the_report_shows_a_gpus_peak_memory(profiled, capsys):
    result, _ = profiled
    gpu = dict(result, device="cuda", device_name="NVIDIA H100 80GB HBM3", gpu_busy_pct=90.0,
               launch_bound=False, peak_memory_mib=5123.4, resident_memory_mib=1024.0)
    profile_script.print_report(gpu, top=3)
    assert "peak memory:  5,123 MiB allocated (1,024 MiB before the forward" in \
        capsys.readouterr().out


def test_a_trace_path_that_cannot_be_written_is_a_one_line_error(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    code = profile_script.main(["--export-trace", str(tmp_path / "file" / "trace.json")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "--export-trace" in err and len(err.splitlines()) == 1, err
