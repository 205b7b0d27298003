"""
From the model flags to a model: --model FILE (a models/ file, your own, or a KernelBench
problem), --module transformers --hf-config NAME_OR_PATH (a config: random weights), or
--pretrained DIR_OR_NAME (a transformers model with its real weights, from a local directory or
the local HF cache, offline, safetensors only), built in the --dtype on the --device, with the
inputs of --input-shape. profile.py, verify.py and any later tool load models
through here, so the flags mean the same everywhere and profile.json can record them
(model_args) for verify.py to rebuild the same model.

    parser = argparse.ArgumentParser(); add_model_args(parser); args = parser.parse_args()
    model, inputs, description = load_model(args)   # UsageError (exit 2) or ModelError (exit 1)
"""
import argparse
import inspect
import json
import os
import sys
from pathlib import Path

import autokernel.kernel_types  # noqa: F401  (first: CPU mode is set before triton is imported)
from autokernel import ROOT
from autokernel.cli import UsageError, describe, one_line
from autokernel.contract import load_module

import torch

DEFAULT_MODEL = autokernel.MODELS_DIR / "llama.py"
CPU_INPUT_SHAPE = (1, 32)   # token models on a CPU: small enough that the default run is seconds


class ModelError(UsageError):
    """The model itself failed (import, construction or forward raised): exit code 1."""

    def __init__(self, message):
        super().__init__(message, code=1)


# Tiny transformers configs built offline (no hub download): name -> (config class, kwargs).
HF_TINY = {
    "tiny-llama": ("LlamaConfig", dict(hidden_size=128, intermediate_size=344,
                                       num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=4, vocab_size=2048,
                                       max_position_embeddings=512)),
    "tiny-gpt2": ("GPT2Config", dict(n_embd=128, n_layer=2, n_head=4, vocab_size=2048,
                                     n_positions=512)),
    "tiny-bert": ("BertConfig", dict(hidden_size=128, intermediate_size=512,
                                     num_hidden_layers=2, num_attention_heads=4,
                                     vocab_size=2048, max_position_embeddings=512)),
}


# The model flags: (flag, add_argument keywords). Every tool that loads a model takes these.
FLAGS = (
    ("--model", dict(metavar="FILE", help=f"model file (default: "
                     f"{DEFAULT_MODEL.relative_to(ROOT)}); a models/ file, your own (see "
                     "models/custom.py) or a KernelBench file")),
    ("--class-name", dict(help="nn.Module class in FILE (default: Model)")),
    ("--config", dict(help="config preset from the file's CONFIGS, e.g. llama compact|7b")),
    ("--module", dict(choices=["transformers"], help="build a transformers model instead of a "
                      "file (needs the hf extra)")),
    ("--hf-config", dict(metavar="NAME_OR_PATH", help="with --module transformers: a local "
                         "config.json, a local model directory (its config only: random "
                         "weights), or a built-in tiny config: " + ", ".join(HF_TINY))),
    ("--pretrained", dict(metavar="DIR_OR_NAME", help="a transformers model with its real "
                          "weights: a local directory (config.json + *.safetensors) or a hub "
                          "name already in the local HF cache (never downloaded); implies "
                          "--module transformers")),
    ("--input-shape", dict(metavar="SHAPE", help="batch x sequence for token models, e.g. 8x1024 "
                           "(default: the model's DEFAULT_INPUT_SHAPE on a GPU, "
                           f"{CPU_INPUT_SHAPE[0]}x{CPU_INPUT_SHAPE[1]} on a CPU); transformers "
                           "vision models: BxCxHxW, e.g. 1x3x64x64 (default: the config's "
                           "image_size); KernelBench files: get_inputs() decides")),
    ("--dtype", dict(help="fp16 | bf16 | fp32 (default: fp16 on a GPU, fp32 on a CPU)")),
    ("--device", dict(help="cuda | cpu (default: cuda when available)")),
)
# Their argparse names (args.input_shape, ...), as profile.json's model_args records them.
MODEL_FLAGS = tuple(flag[2:].replace("-", "_") for flag, _ in FLAGS)


def add_model_args(parser: argparse.ArgumentParser, title="model"):
    """The model flags, in a group named `title` (a tool whose defaults come from elsewhere says
    so there)."""
    group = parser.add_argument_group(title)
    for flag, kwargs in FLAGS:
        group.add_argument(flag, default=None, **kwargs)
    return parser


def model_args(args) -> dict:
    """The model flags as given (None = default), as profile.json records them."""
    return {name: getattr(args, name) for name in MODEL_FLAGS}


def check_model_args(args):
    """The cheap checks of the model flags, for a script to run before its slow work (a typo in
    --model should not wait for minutes of re-gating)."""
    device_and_dtype(args)
    if args.input_shape:
        parse_input_shape(args.input_shape)
    if args.model and not (args.module == "transformers" or args.pretrained):
        _model_file(args.model)


def _model_file(path):
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"model file {path} not found: pass --model FILE (a .py file)")
    if path.suffix != ".py":
        raise UsageError(f"--model {path} is not a .py file: pass the Python file that "
                         "defines the model")
    return path


def load_model(args):
    """(model in eval mode on the device and dtype, inputs tuple, description) from the shared
    flags (add_model_args). Raises UsageError for bad flags, ModelError when the model fails."""
    device, dtype = device_and_dtype(args)
    if args.pretrained and args.model:
        raise UsageError("--pretrained loads a transformers model, --model a file: pass one")
    if args.module == "transformers" or args.pretrained:
        return _load_hf_model(args, device, dtype)
    if args.hf_config:
        raise UsageError("--hf-config needs --module transformers")
    return _load_file_model(args, device, dtype)


def load_model_in_a_dtype_it_runs(args, forward, log=print):
    """load_model, and where --dtype was not given and the default (fp16 on a GPU) fails in the
    forward while fp32 runs (KernelBench's LSTMs keep an fp32 hidden state: "Input and hidden
    tensors are not the same dtype" from cuDNN, "could not create a primitive descriptor" from
    oneDNN), the model loaded again in fp32, with a one-line note; args.dtype then says fp32, so
    the flags recorded for extract.py and verify.py load the model that ran. A model that fails
    in fp32 too is returned as loaded: the caller reports its own error. forward(model, inputs):
    one forward."""
    loaded, dtype = load_model(args), device_and_dtype(args)[1]
    if args.dtype is not None or dtype == torch.float32:
        return loaded
    try:
        with torch.inference_mode():
            forward(*loaded[:2])
        return loaded
    except Exception as e:  # noqa: BLE001  (decided by whether fp32 runs)
        error = e
    args.dtype = "fp32"
    try:
        in_fp32 = load_model(args)
        with torch.inference_mode():
            forward(*in_fp32[:2])
    except Exception:  # noqa: BLE001  (not a dtype problem: the caller reports the first error)
        args.dtype = None
        return loaded
    log(f"note: {loaded[2]} does not run in {autokernel.DTYPE_NAMES[dtype]} "
        f"({one_line(describe(error))}): loaded in fp32, the dtype it runs in (--dtype chooses)")
    return in_fp32


def parse_input_shape(text, image=None):
    """(batch, seq), or (batch, channels, height, width) for an image model. image: None when
    the model is not known yet (the cheap checks: either form passes)."""
    try:
        dims = tuple(int(d) for d in text.lower().replace("*", "x").split("x"))
    except ValueError:
        dims = ()
    lengths = {None: (2, 4), False: (2,), True: (4,)}[image]
    if len(dims) not in lengths or min(dims) < 1:
        use = ("BxCxHxW, e.g. 1x3x64x64 (an image model)" if image
               else "BATCHxSEQ, e.g. 8x1024" + ("" if image is False else
                                                 ", or BxCxHxW for an image model"))
        raise UsageError(f"bad --input-shape {text!r}: use {use}")
    return dims


def device_and_dtype(args):
    """(torch.device, torch.dtype) from --device and --dtype, with the defaults for this box."""
    device = args.device or autokernel.DEVICE
    if device.split(":")[0] not in ("cuda", "cpu"):
        raise UsageError(f"unknown --device {device!r}: use cuda or cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError("--device cuda but no CUDA GPU is visible: use --device cpu")
    try:
        dtype = autokernel.parse_dtype(args.dtype or ("fp16" if device.startswith("cuda")
                                                      else "fp32"))
    except ValueError as e:
        raise UsageError(str(e)) from None
    return torch.device(device), dtype


def _import_file(path):
    path = _model_file(path)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # model files import models.layers
    try:
        return load_module(path)
    except Exception as e:
        raise ModelError(f"could not import {path}: {describe(e)}") from None


def _memory_check(model_on_meta, dtype, device, what, advice="use a smaller --config or a GPU"):
    """Refuse, with the numbers, to allocate a model that can't fit (7B on a small box)."""
    need = sum(p.numel() for p in model_on_meta.parameters()) * dtype.itemsize
    if device.type == "cuda":
        have = torch.cuda.mem_get_info(device)[0]
    else:
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    if need > 0.9 * have:
        raise UsageError(f"{what} needs {need / 2**30:.1f} GiB of weights in "
                         f"{autokernel.DTYPE_NAMES[dtype]} but {device.type} has "
                         f"{have / 2**30:.1f} GiB free: {advice}")


def _build(factory, dtype, device, what):
    """Construct on the meta device first (free) to check the size, then for real, directly in
    the target dtype and device (no fp32 copy of a 7B model)."""
    try:
        with torch.device("meta"):
            meta = factory()
    except Exception:
        meta = None  # a model that can't be built on meta is checked only by building it
    if meta is not None:
        _memory_check(meta, dtype, device, what)
    previous = torch.get_default_dtype()
    try:
        torch.set_default_dtype(dtype)
        with torch.device(device):
            model = factory()
        return model.to(device=device, dtype=dtype).eval()
    except UsageError:
        raise
    except Exception as e:
        raise ModelError(f"building {what} raised {describe(e)}") from None
    finally:
        torch.set_default_dtype(previous)


def _load_file_model(args, device, dtype):
    path = Path(args.model) if args.model else DEFAULT_MODEL
    module = _import_file(path)
    cls = _model_class(module, path, args.class_name or "Model")
    shown = path.resolve().relative_to(ROOT) if path.resolve().is_relative_to(ROOT) else path
    what = f"{shown} {cls.__name__}"
    if hasattr(module, "get_init_inputs"):  # KernelBench: Model(*get_init_inputs()), get_inputs()
        return _load_kernelbench(module, cls, args, device, dtype, what)

    batch, seq = _input_shape(args, device, module)  # bad shapes fail before any allocation
    model, config, what = _build_configured(module, cls, args, seq, dtype, device, shown, what)
    get_inputs = getattr(module, "get_inputs", None)
    if get_inputs is None:
        raise UsageError(f"{shown} has no get_inputs(batch, seq, device): add one "
                         "(see models/custom.py)")
    try:
        kwargs = {"config": config} if config is not None and _takes(get_inputs, "config") else {}
        inputs = tuple(get_inputs(batch, seq, device=device, **kwargs))
    except Exception as e:
        raise ModelError(f"{shown} get_inputs raised {describe(e)}") from None
    return model, inputs, f"{what} ({_params(model)})"


def _model_class(module, path, name):
    cls = getattr(module, name, None)
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        found = sorted(n for n, v in vars(module).items() if isinstance(v, type)
                       and issubclass(v, torch.nn.Module) and v.__module__ == module.__name__)
        if not found:
            raise UsageError(f"{path} defines no nn.Module class: pass a model file (see "
                             f"models/custom.py for what one holds)")
        raise UsageError(f"{path} has no nn.Module class {name!r}: pass --class-name, one of "
                         f"{', '.join(found)}")
    return cls


def _build_configured(module, cls, args, seq, dtype, device, shown, what):
    """(model, config or None, description): cls(CONFIGS[--config]) when the file has CONFIGS
    (the first one by default), else cls()."""
    configs = getattr(module, "CONFIGS", None)
    if not configs:
        if args.config:
            raise UsageError(f"{shown} has no CONFIGS, so --config {args.config!r} means nothing")
        return _build(cls, dtype, device, what), None, what
    config_name = args.config or next(iter(configs))
    if config_name not in configs:
        raise UsageError(f"unknown --config {config_name!r} for {shown}: use one of "
                         f"{', '.join(configs)}")
    config = configs[config_name]
    max_seq = getattr(config, "max_seq", None)
    if max_seq and seq > max_seq:
        raise UsageError(f"--input-shape sequence {seq} exceeds {what} "
                         f"config={config_name}'s max_seq {max_seq}")
    what = f"{what} config={config_name}"
    return _build(lambda: cls(config), dtype, device, what), config, what


def _load_kernelbench(module, cls, args, device, dtype, what):
    """A KernelBench problem: Model(*get_init_inputs()) run on get_inputs(), which decide the
    shapes; floating-point inputs are cast to --dtype."""
    if args.input_shape:
        print("profile: note: --input-shape ignored, a KernelBench file's get_inputs() "
              "decides", file=sys.stderr)
    try:
        init_args = module.get_init_inputs()
        model = _build(lambda: cls(*init_args), dtype, device, what)
        inputs = module.get_inputs()
    except UsageError:
        raise
    except Exception as e:
        raise ModelError(f"{what}: get_init_inputs/get_inputs raised {describe(e)}") \
            from None
    inputs = tuple(t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)
                   if torch.is_tensor(t) else t for t in inputs)
    return model, inputs, f"{what} (KernelBench, {_params(model)})"


def _takes(fn, name):
    return name in inspect.signature(fn).parameters


def _input_shape(args, device, module=None):
    if args.input_shape:
        return parse_input_shape(args.input_shape, image=False)
    if device.type == "cuda":
        return tuple(getattr(module, "DEFAULT_INPUT_SHAPE", (8, 1024)))
    return CPU_INPUT_SHAPE


def _params(model):
    n = sum(p.numel() for p in model.parameters())
    return (f"{n / 1e9:.2f}B params" if n >= 1e9 else f"{n / 1e6:.1f}M params" if n >= 1e6
            else f"{n:,} params")


class HFImage(torch.nn.Module):
    """A transformers vision model whose forward takes pixel values and returns one tensor: the
    logits of a classification head, else the last hidden state."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
        out = self.model(pixel_values=pixel_values)
        logits = getattr(out, "logits", None)
        return logits if logits is not None else out.last_hidden_state


def _is_vision(config):
    """A config whose model reads pixel values (ResNet, ConvNeXt, ViT, Swin, ...): channels and
    no vocabulary."""
    return hasattr(config, "num_channels") and not hasattr(config, "vocab_size")


def _vision_model(transformers, config, args, device, dtype, what):
    """(model, inputs) of a vision config: its image classifier (AutoModel where it has none) on
    a BxCxHxW batch, the config's image_size square by default."""
    auto = transformers.AutoModelForImageClassification
    if type(config) not in auto._model_mapping:  # a backbone only (e.g. a bare encoder)
        auto = transformers.AutoModel
    model = HFImage(_build(lambda: auto.from_config(config), dtype, device, what)).eval()
    if args.input_shape:
        shape = parse_input_shape(args.input_shape, image=True)
    else:
        size = getattr(config, "image_size", 224)
        size = size[0] if isinstance(size, (list, tuple)) else size
        shape = (8 if device.type == "cuda" else 1, config.num_channels, size, size)
    if shape[1] != config.num_channels:
        raise UsageError(f"--input-shape {args.input_shape} has {shape[1]} channels but "
                         f"{what} takes {config.num_channels}: use Bx{config.num_channels}xHxW")
    return model, (torch.randn(shape, device=device, dtype=dtype),)


class HFLogits(torch.nn.Module):
    """A transformers model whose forward takes token ids and returns logits (as ours do)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        kwargs = {"use_cache": False} if getattr(self.model.config, "is_decoder", True) else {}
        return self.model(input_ids=input_ids, **kwargs).logits


def _load_hf_model(args, device, dtype):
    if args.pretrained and args.hf_config:
        raise UsageError("pass --pretrained or --hf-config, not both (--pretrained reads the "
                         "config next to the weights)")
    if not (args.hf_config or args.pretrained):
        raise UsageError("--module transformers needs --hf-config NAME_OR_PATH (a local "
                         f"config.json or model directory, or one of {', '.join(HF_TINY)}) "
                         "or --pretrained DIR_OR_NAME")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the hub
    try:
        import transformers
    except ImportError:
        raise UsageError("--module transformers needs the transformers package: "
                         "uv sync --extra hf") from None
    if args.pretrained:
        source, path = args.pretrained, pretrained_dir(args.pretrained)
    else:
        source, path = args.hf_config, Path(args.hf_config)
        if path.is_dir() and any(path.glob("*.safetensors")):
            print(f"note: --hf-config {source} builds the model from its config with random "
                  "weights; --pretrained loads the weights", file=sys.stderr)
    config = (_hf_config(transformers, str(path), path, "--pretrained") if args.pretrained
              else _hf_config(transformers, source, path))
    if _is_vision(config) and not args.pretrained:  # its own attention default (CNNs: none)
        what = f"transformers {config.model_type} ({source})"
        model, inputs = _vision_model(transformers, config, args, device, dtype, what)
        return model, inputs, f"{what} ({_params(model)})"
    config._attn_implementation = "sdpa"
    auto = (transformers.AutoModelForMaskedLM if config.model_type in ("bert", "roberta",
                                                                       "distilbert")
            else transformers.AutoModelForCausalLM)
    if args.pretrained:
        what = f"transformers {config.model_type} ({source}, pretrained)"
        model = _load_pretrained(transformers, auto, path, config, dtype, device, what)
    else:
        what = f"transformers {config.model_type} ({source})"
        model = _build(lambda: auto.from_config(config), dtype, device, what)
    model = HFLogits(model).eval()
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions",
                                                                        None)
    batch, seq = _input_shape(args, device)
    if not args.input_shape and limit:
        seq = min(seq, limit)  # the default shape fits the model's positions
    if limit and seq > limit:
        raise UsageError(f"--input-shape sequence {seq} exceeds {what}'s {limit} positions")
    inputs = (torch.randint(0, config.vocab_size, (batch, seq), device=device),)
    return model, inputs, f"{what} ({_params(model)})"


def pretrained_dir(source):
    """The directory --pretrained names: a local directory, or a hub name's snapshot in the local
    HF cache (looked up, never downloaded). UsageError when it has no config.json or no
    safetensors weights (pickled .bin weights are not loaded: unpickling runs code)."""
    path = Path(source).expanduser()
    if path.is_dir():
        directory = path
    elif path.exists() or source.startswith(("/", ".", "~")) or source.count("/") > 1:
        what = "is a file" if path.exists() else "does not exist"  # a path, not an org/name
        raise UsageError(f"--pretrained {source} {what}: pass the model's directory "
                         "(config.json + *.safetensors) or a hub name in the local HF cache")
    else:
        directory = _cached_snapshot(source)
    if not (directory / "config.json").is_file():
        raise UsageError(f"--pretrained {source}: no config.json in {directory}: pass the "
                         "directory save_pretrained wrote")
    if not any(directory.glob("*.safetensors")):
        found = sorted(p.name for p in directory.glob("*.bin"))
        hint = f" (it has {', '.join(found[:2])}: pickled weights are not loaded)" if found else ""
        raise UsageError(f"--pretrained {source}: no *.safetensors weights in {directory}{hint}"
                         ": save the model with save_pretrained(DIR) (safetensors by default) "
                         f"or download them: hf download {source} --include '*.safetensors'")
    return directory


def _cached_snapshot(name):
    """A hub name's snapshot directory in the local HF cache; UsageError when it is not there."""
    from huggingface_hub import constants, try_to_load_from_cache
    try:
        found = try_to_load_from_cache(name, "config.json")
    except Exception:  # noqa: BLE001  (not a valid hub name: a path that does not exist)
        found = None
    if not isinstance(found, str):
        raise UsageError(f"--pretrained {name}: neither a local directory nor a model in the "
                         f"local HF cache ({constants.HF_HUB_CACHE}); nothing is downloaded: "
                         f"run `hf download {name}` once, or pass the model's directory")
    return Path(found).parent


def _load_pretrained(transformers, auto, directory, config, dtype, device, what):
    """The model with its weights from the directory's safetensors, offline, in dtype on device
    (the size checked first, on the meta device)."""
    try:
        with torch.device("meta"):
            _memory_check(auto.from_config(config), dtype, device, what,
                          "use a smaller model, a 16-bit --dtype, or a larger GPU")
    except UsageError:
        raise
    except Exception:  # noqa: BLE001  (can't build on meta: loading it is the check)
        pass
    major, minor = (int(v) for v in transformers.__version__.split(".")[:2])
    dtype_arg = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"  # renamed in 4.56
    try:
        model = auto.from_pretrained(str(directory), config=config, local_files_only=True,
                                     use_safetensors=True, **{dtype_arg: dtype})
        return model.to(device=device, dtype=dtype).eval()
    except Exception as e:
        raise ModelError(f"loading {what} raised {describe(e)}") from None


def _hf_config(transformers, source, path, flag="--hf-config"):
    """The transformers config --hf-config names: a built-in tiny one, a config.json, or a local
    model directory (never the hub: offline)."""
    try:
        if source in HF_TINY:
            cls_name, kwargs = HF_TINY[source]
            return getattr(transformers, cls_name)(**kwargs)
        if path.is_file():  # a bare config.json
            fields = json.loads(path.read_text())
            return transformers.AutoConfig.for_model(fields.pop("model_type"), **fields)
        if path.is_dir():
            return transformers.AutoConfig.from_pretrained(str(path))
    except Exception as e:
        raise UsageError(f"could not read {flag} {source!r}: {describe(e)}") from None
    raise UsageError(f"--hf-config {source!r} is neither a local path nor a built-in "
                     f"tiny config ({', '.join(HF_TINY)}); hub names can't be "
                     "downloaded offline: pass a local config.json or directory")
