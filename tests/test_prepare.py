"""prepare.py and autokernel.baselines on a CPU: the spec table, the cache (round trip, another
device, corruption), the CLI, and nvidia-smi parsing."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import autokernel
import prepare
from autokernel import baselines
from autokernel.gpus import gpu_spec

ROOT = Path(__file__).resolve().parent.parent
CORE_FILES = ("prepare.py",)


@pytest.fixture
def cache_path(tmp_path, monkeypatch):
    path = tmp_path / "workspace" / "prepare.json"
    monkeypatch.setattr(baselines, "CACHE_PATH", path)
    monkeypatch.setattr(baselines, "_warned", set())
    return path


def _repo_copy(tmp_path, *extra):
    """The scripts in a throwaway root, so a CLI run writes its own workspace/."""
    for name in CORE_FILES + extra:
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "autokernel", tmp_path / "autokernel",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def _run(cwd, *args, timeout=120):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


# ---- the datasheet table --------------------------------------------------------------------

@pytest.mark.parametrize("name, spec_name, bandwidth", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 3350.0),  # how torch names the SXM card
    ("NVIDIA H100 PCIe", "H100 PCIe", 2000.0),
    ("NVIDIA H100 NVL", "H100 NVL", 3900.0),
    ("NVIDIA GH200 480GB", "GH200", 4000.0),        # not the H200 it contains
    ("NVIDIA H200", "H200 SXM", 4800.0),
    ("NVIDIA A100-SXM4-80GB", "A100 SXM 80GB", 2039.0),
])
def test_known_gpus(name, spec_name, bandwidth):
    spec = gpu_spec(name)
    assert (spec.name, spec.bandwidth_gb_s) == (spec_name, bandwidth)
    device = {"cuda": True, "name": name, "sm_count": 132, "capability": [9, 0],
              "max_sm_clock_mhz": 1980}
    assert baselines.spec_for(device)["bandwidth_gb_s"] == bandwidth


def test_unknown_gpu_is_estimated_from_sms_and_clock():
    device = {"cuda": True, "name": "NVIDIA Future X1", "sm_count": 100, "capability": [9, 0],
              "max_sm_clock_mhz": 2000}
    spec = baselines.spec_for(device)
    assert spec["name"] == "NVIDIA Future X1 (estimated)"
    assert spec["fp16_tflops"] == pytest.approx(100 * 2000e6 * 4096 / 1e12)
    assert spec["bandwidth_gb_s"] is None  # unknown: only the measured copy speed counts
    assert baselines.spec_for({"cuda": False, "name": "cpu"})["fp16_tflops"] is None


def test_nvidia_smi_parsing(tmp_path, monkeypatch):
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'NVIDIA H100 80GB HBM3, 1980, 2619, 550.54.15'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    props = SimpleNamespace(name="NVIDIA H100 80GB HBM3", uuid="1234-abcd")
    assert baselines._nvidia_smi(props) == {"max_sm_clock_mhz": 1980, "max_mem_clock_mhz": 2619,
                                          "driver": "550.54.15"}
    fake.write_text("#!/bin/sh\necho '[N/A]'\nexit 9\n")  # broken: no facts, no crash
    assert baselines._nvidia_smi(props) == {}
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert baselines._nvidia_smi(props) == {}


# ---- the cache ------------------------------------------------------------------------------

def test_cache_round_trip(cache_path, monkeypatch):
    ktype = autokernel.KERNEL_TYPES["rmsnorm"]  # has a library baseline
    shape = (4, 64)
    first = baselines.baseline_times(ktype, shape, "fp16")
    assert first["eager_us"] > 0 and first["library_us"] > 0
    assert first["library"] == "F.rms_norm" and first["compile_us"] is None  # CPU: no compile
    saved = json.loads(cache_path.read_text())
    entry = saved["baselines"]["rmsnorm|4x64|fp16"]
    assert entry["shape"] == [4, 64] and entry["eager_us"] == first["eager_us"]
    assert saved["key"] == baselines.cache_key(baselines.device_identity())

    def must_not_measure(*args, **kwargs):
        raise AssertionError("a cached baseline was measured again")
    monkeypatch.setattr(baselines, "measure_baselines", must_not_measure)
    assert baselines.baseline_times("rmsnorm", [4, 64], autokernel.DTYPES["fp16"]) == first

    # Ceilings written by a (pretend) GPU run come back through load_ceilings.
    baselines.update_cache(lambda c: c["ceilings"].update(bandwidth_gb_s=3018.0,
                                                        tflops={"fp16": 700.0}))
    ceilings = baselines.load_ceilings()
    assert ceilings["bandwidth_gb_s"] == 3018.0 and ceilings["tflops"] == {"fp16": 700.0}
    assert json.loads(cache_path.read_text())["baselines"]["rmsnorm|4x64|fp16"] == entry


def test_load_ceilings_cpu_and_absent(cache_path):
    ceilings = baselines.load_ceilings()
    assert ceilings["gpu"] == "cpu" and ceilings["bandwidth_gb_s"] is None
    assert ceilings["tflops"] is None and ceilings["spec"]["name"] == "cpu"
    assert not cache_path.exists()  # reading never writes, never measures


def test_another_device_invalidates(cache_path, capsys):
    baselines.baseline_times("reduce", (2, 32), "fp16")
    saved = json.loads(cache_path.read_text())
    saved["key"] = "NVIDIA H100 80GB HBM3|132 SMs|cc 9.0|81559 MiB|torch 2.11.0|triton 3.6.0"
    saved["ceilings"] = {"bandwidth_gb_s": 3018.0, "tflops": {"fp16": 700.0}}
    saved["baselines"]["reduce|2x32|fp16"]["eager_us"] = 123456.0
    cache_path.write_text(json.dumps(saved))
    assert baselines.load_ceilings()["bandwidth_gb_s"] is None  # not this device's ceilings
    assert baselines.baseline_times("reduce", (2, 32), "fp16")["eager_us"] != 123456.0
    assert "not this device" in capsys.readouterr().err
    assert json.loads(cache_path.read_text())["key"] == baselines.cache_key(
        baselines.device_identity())


@pytest.mark.parametrize("garbage", ["{not json", "[1, 2, 3]", '{"schema": 1}', ""])
def test_corrupt_cache_is_rebuilt(cache_path, capsys, garbage):
    cache_path.parent.mkdir(parents=True)
    cache_path.write_text(garbage)
    assert baselines.load_ceilings()["bandwidth_gb_s"] is None
    times = baselines.baseline_times("softmax", (2, 32), "fp32")
    assert times["eager_us"] > 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "corrupt" in line]
    assert len(warnings) == 1 and "rebuilding" in warnings[0]  # one line, said once
    assert "softmax|2x32|fp32" in json.loads(cache_path.read_text())["baselines"]


def test_bad_entry_values_are_remeasured(cache_path):
    baselines.baseline_times("softmax", (2, 32), "fp16")
    saved = json.loads(cache_path.read_text())
    saved["baselines"]["softmax|2x32|fp16"]["eager_us"] = "fast"
    cache_path.write_text(json.dumps(saved))
    assert isinstance(baselines.baseline_times("softmax", (2, 32), "fp16")["eager_us"], float)


def test_failed_measurement_is_cached_not_raised(cache_path, monkeypatch):
    from autokernel import reference

    def broken(**inputs):
        raise RuntimeError("CUDA out of memory\nsecond line")
    monkeypatch.setattr(reference, "softmax_eager", broken)
    times = baselines.baseline_times("softmax", (2, 32), "fp16")
    assert times["eager_us"] is None
    entry = json.loads(cache_path.read_text())["baselines"]["softmax|2x32|fp16"]
    assert entry["eager_error"] == "RuntimeError: CUDA out of memory ... second line"  # one line


# ---- the CLI --------------------------------------------------------------------------------

def test_cli_cpu_mode(tmp_path):
    root = _repo_copy(tmp_path)
    result = _run(root, "prepare.py", "--types", "softmax,flash_attention")
    assert result.returncode == 0, result.stderr
    assert "CPU mode" in result.stdout and "NOT meaningful" in result.stdout
    assert "SDPA" in result.stdout  # the library column
    saved = json.loads((root / "workspace" / "prepare.json").read_text())
    assert saved["device"]["name"] == "cpu" and saved["ceilings"]["bandwidth_gb_s"] is None
    assert set(saved["baselines"]) == {"softmax|64x1024|fp16", "flash_attention|1x2x128x64|fp16"}


def test_cli_bad_types(capsys):
    with pytest.raises(SystemExit) as exit_info:
        prepare.main(["--types", "softmax,sofmax"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "sofmax" in err and err.strip().count("\n") == 0


def test_report_for_a_gpu_cache(capsys):
    """The GPU printout, from a cache as an H100 run would write it (no GPU needed to format)."""
    device = {"name": "NVIDIA H100 80GB HBM3", "cuda": True, "sm_count": 132,
              "capability": [9, 0], "memory_mib": 81559, "max_sm_clock_mhz": 1980,
              "driver": "550.54.15", "torch": "2.11.0", "triton": "3.6.0"}
    cache = {"device": device, "spec": baselines.spec_for(device),
             "ceilings": {"bandwidth_gb_s": 3018.4, "tflops": {"fp16": 712.0, "bf16": 705.5,
                                                               "fp32": 51.2}},
             "baselines": {"rmsnorm|8192x8192|fp16": {
                 "eager_us": 515.0, "compile_us": 93.0, "compile_mode": "max-autotune",
                 "library": "F.rms_norm", "library_us": 142.0},
                 "softmax|8192x8192|fp16": {"eager_us": 271.0, "compile_us": None,
                                            "compile_error": "RuntimeError: boom"}}}
    prepare.print_report(cache, ["rmsnorm", "softmax"])
    out = capsys.readouterr().out
    assert "NVIDIA H100 80GB HBM3 | 132 SMs | cc 9.0" in out
    assert "datasheet (H100 SXM)" in out and "3,350 GB/s" in out
    assert "copy 3,018 GB/s (90% of datasheet)" in out and "fp16 712.0" in out
    assert "mode=max-autotune" in out and "note: softmax: compile RuntimeError: boom" in out
    rmsnorm_line = next(line for line in out.splitlines() if line.startswith("rmsnorm"))
    assert rmsnorm_line.split()[:4] == ["rmsnorm", "8192x8192", "fp16", "515.0"]


def test_the_tests_write_to_a_workspace_of_their_own():
    """A test run never touches a night's files: the session's workspace is a temporary folder
    (tests/conftest.py sets AUTOKERNEL_WORKSPACE for this process), and the paths the scripts
    write follow it."""
    from autokernel import judge, state
    real = autokernel.ROOT / "workspace"
    assert autokernel.WORKSPACE != real and "AUTOKERNEL_WORKSPACE" not in os.environ
    for path in (autokernel.PREPARE_JSON, autokernel.PROFILE_JSON, autokernel.PLAN_JSON,
                 autokernel.VERIFY_JSON, judge.CHILD_LOG, state.SNAPSHOT_PATH):
        assert path.is_relative_to(autokernel.WORKSPACE), path
