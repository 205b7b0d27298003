"""--pretrained: a transformers model with its real weights, from a local directory or the local
HF cache, offline and safetensors only, in profile.py and verify.py; anything missing is a
one-line error. The model is a tiny Llama saved here with save_pretrained."""
import argparse
import json
import shutil

import pytest
import torch

import autokernel
import verify
from autokernel.contract import load_module
from models.load import add_model_args, load_model

# `import profile` finds the standard library's: the script is loaded by path under another name.
profile_script = load_module(autokernel.ROOT / "profile.py", "profile_under_test")

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(directory save_pretrained wrote, the saved model's logits on fixed tokens)."""
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2,
                                      vocab_size=64, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    directory = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(directory)
    return directory, model


def _load(*flags):
    args = add_model_args(argparse.ArgumentParser()).parse_args([*flags, "--input-shape", "1x8"])
    return load_model(args)


def _same_logits(loaded, saved_model):
    model, (ids,), _ = loaded
    with torch.no_grad():
        return torch.equal(model(ids), saved_model(input_ids=ids).logits)


def test_a_directory_loads_its_saved_weights(saved):
    directory, model = saved
    loaded = _load("--pretrained", str(directory))
    assert "pretrained" in loaded[2]
    assert _same_logits(loaded, model)


def test_hf_config_of_the_same_directory_builds_random_weights(saved, capsys):
    directory, model = saved
    assert not _same_logits(_load("--module", "transformers", "--hf-config", str(directory)),
                            model)
    assert "--pretrained loads the weights" in capsys.readouterr().err


def test_a_hub_name_is_found_in_the_local_cache(saved, tmp_path, monkeypatch):
    """The HF cache's layout: models--ORG--NAME/refs/main names the snapshot to read."""
    directory, model = saved
    repo = tmp_path / "hub" / "models--someone--tiny-llama"
    shutil.copytree(directory, repo / "snapshots" / "abc123")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert _same_logits(_load("--pretrained", "someone/tiny-llama"), model)


def _only(directory, tmp_path, keep):
    """A copy of the saved model's directory holding only the files `keep` names."""
    target = tmp_path / "partial"
    target.mkdir()
    for name in keep:
        shutil.copy(directory / name, target / name)
    return target


@pytest.mark.parametrize("case, message", [
    ("config only", "no *.safetensors weights"),
    ("pickled weights only", "pytorch_model.bin: pickled weights are not loaded"),
    ("weights without config", "no config.json"),
    ("missing directory", "does not exist"),
    ("a hub name not in the cache", "nor a model in the local HF cache"),
    ("a file", "is a file"),
    ("with --model", "pass one"),
    ("with --hf-config", "not both"),
])
def test_missing_weights_are_a_one_line_error(saved, tmp_path, capsys, monkeypatch, case,
                                              message):
    directory, _ = saved
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    if case == "pickled weights only":
        partial = _only(directory, tmp_path, ["config.json"])
        (partial / "pytorch_model.bin").write_bytes(b"not loaded")
    flags = {
        "config only": lambda: [str(_only(directory, tmp_path, ["config.json"]))],
        "pickled weights only": lambda: [str(tmp_path / "partial")],
        "weights without config": lambda: [str(_only(directory, tmp_path,
                                                     ["model.safetensors"]))],
        "missing directory": lambda: [str(tmp_path / "nowhere")],
        "a hub name not in the cache": lambda: ["someone/not-downloaded"],
        "a file": lambda: [str(directory / "config.json")],
        "with --model": lambda: [str(directory), "--model", "models/gpt2.py"],
        "with --hf-config": lambda: [str(directory), "--hf-config", "tiny-llama"],
    }[case]()
    code = profile_script.main(["--pretrained", *flags, "--output", str(tmp_path / "p.json")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "p.json").exists()


def test_profile_records_it_and_verify_rebuilds_the_same_model(saved, tmp_path, monkeypatch,
                                                               capsys):
    """The morning check compares logits of the real weights: verify.py with no model flags
    reloads what profile.json recorded."""
    directory, _ = saved
    out = tmp_path / "profile.json"
    assert profile_script.main(["--pretrained", str(directory), "--input-shape", "1x8",
                                "--iters", "1", "--warmup", "0", "--output", str(out)]) == 0
    assert json.loads(out.read_text())["model_args"]["pretrained"] == str(directory)
    monkeypatch.setattr(autokernel, "PROFILE_JSON", out)
    code = verify.main(["--kernels", "kernels/rmsnorm.py", "--no-regate", "--no-timing",
                        "--out", str(tmp_path / "verify.json")])
    report = json.loads((tmp_path / "verify.json").read_text())
    assert code == 0, capsys.readouterr().out
    assert "pretrained" in report["model"] and report["correctness"]["passed"]
    assert report["kernels"][0]["calls"] > 0
