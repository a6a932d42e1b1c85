"""NTK-Attention the way peft is used: `NTKConfig`, `get_ntk_model(model, config)`, and `NTKModel` with
`save_pretrained` / `from_pretrained`, `print_trainable_parameters`, `disable_adapter()`, named adapters
(`load_adapter`, `set_adapter`) and `generate`. Shaped after peft's `LoraConfig` and `PeftModel`; it stands beside
peft, not inside it (peft's `register_peft_method` only takes names of its own `PeftType` enum).

A saved adapter is `adapter_config.json` (the config, with the base model's class and name) and
`adapter_model.safetensors` (the method's tensors and the task head, whatever `requires_grad` says). Loading checks
the base model's class, every tensor's name and shape; any mismatch is one ValueError.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Iterator

import torch
from torch import nn
from transformers import PreTrainedModel

from .. import __version__
from . import ntk, ptuning_v2
from .common import Options, count_parameters, task_head

CONFIG_NAME, WEIGHTS_NAME = "adapter_config.json", "adapter_model.safetensors"
ADAPTERS = {ntk.NAME: ntk, ptuning_v2.NAME: ptuning_v2}  # the attention-level methods a config can name


@dataclass
class NTKConfig:
    """An attention-level method (`ntk` or `ptuning-v2`), its options (see NTKOptions), and the base model it was
    made for (filled in by get_ntk_model)."""

    method: str = ntk.NAME
    options: dict = field(default_factory=dict)
    base_model_class: str | None = None
    base_model_name_or_path: str | None = None
    ntkcli_version: str = __version__

    def __post_init__(self):
        if self.method not in ADAPTERS:
            raise ValueError(f"NTKConfig.method {self.method!r}: choose one of {', '.join(ADAPTERS)}")
        if isinstance(self.options, Options):
            self.options = self.options.model_dump()
        if not isinstance(self.options, dict):
            raise ValueError(f"NTKConfig.options must be a mapping of {self.method}'s options, not "
                             f"{type(self.options).__name__}")
        try:
            self.options = ADAPTERS[self.method].OPTIONS(**self.options).model_dump()
        except Exception as err:  # pydantic's ValidationError: an unknown or ill-typed option
            raise ValueError(f"NTKConfig.options: {str(err).splitlines()[0]}: {_first_error(err)}") from None

    @classmethod
    def from_dict(cls, data: dict) -> "NTKConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"NTKConfig has no field {unknown[0]!r} (fields: {', '.join(sorted(known))})")
        return cls(**data)

    @classmethod
    def load(cls, directory: str | Path) -> "NTKConfig":
        path = Path(directory) / CONFIG_NAME
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise ValueError(f"no {CONFIG_NAME} in {directory}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(f"{path} is not valid JSON ({err})") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path} holds no JSON object")
        return cls.from_dict(data)

    def save(self, directory: str | Path) -> None:
        (Path(directory) / CONFIG_NAME).write_text(json.dumps(asdict(self), indent=2))


def _first_error(err: Exception) -> str:
    errors = getattr(err, "errors", None)
    if not callable(errors):
        return str(err)
    first = errors()[0]
    return f"{'.'.join(map(str, first['loc']))}: {first['msg']}"


def adapter_tensors(model: nn.Module, method: str) -> dict[str, torch.Tensor]:
    """What a saved adapter holds: the method's tensors on every attention module and the task head's parameters,
    whatever their requires_grad."""
    state = ADAPTERS[method].STATE
    head = set(task_head(model))
    return {n: t for n, t in model.state_dict(keep_vars=True).items() if n in head or n.rsplit(".", 1)[-1] in state}


def check_tensors(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], where: str) -> None:
    """One ValueError for the first tensor that `got` lacks, has too many, or has in another shape."""
    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    if missing:
        raise ValueError(f"{where} lacks {len(missing)} tensor(s) of this model, the first {missing[0]}")
    if extra:
        raise ValueError(f"{where} holds {len(extra)} tensor(s) this model has not, the first {extra[0]}")
    for name, tensor in got.items():
        if tuple(tensor.shape) != tuple(want[name].shape):
            raise ValueError(f"{where}: {name} has shape {tuple(tensor.shape)}, this model's "
                             f"{tuple(want[name].shape)}")


class NTKModel(PreTrainedModel):
    """A Hugging Face model with an attention-level method injected; forward and generate are the model's. A
    PreTrainedModel (sharing the base model's config) for the Trainer's sake: its save_model then calls our
    save_pretrained, which writes the adapter, as it does for peft's PeftModel."""

    _supports_sdpa = _supports_flash_attn = _supports_flex_attn = _supports_attention_backend = True

    def __init__(self, model: nn.Module, config: NTKConfig, adapter_name: str = "default",
                 calibration: dict | None = None):
        from . import inject

        super().__init__(model.config)
        self.original_attention = model.config._attn_implementation
        config.base_model_class = config.base_model_class or type(model).__name__
        config.base_model_name_or_path = (config.base_model_name_or_path
                                          or getattr(model.config, "_name_or_path", None) or None)
        self.wrapped = inject(model, config.method, calibration=calibration, **config.options).model
        self.ntk_configs = {adapter_name: config}
        self.active_adapter = adapter_name
        self.stored: dict[str, dict[str, torch.Tensor]] = {}  # the inactive adapters' tensors
        self.takes_positions = "position_ids" in inspect.signature(self.base_model.forward).parameters
        # the forward shows the base model's signature, which the Trainer reads to keep the dataset's columns
        self.forward = functools.wraps(self.base_model.forward)(functools.partial(NTKModel.forward, self))

    def forward(self, *args, **kwargs):
        """The model's forward; without position_ids, they are derived from the attention mask (as generate()
        does) wherever the model takes them, so that a padded row sees the positions it has alone: φ(Q) of
        NTK-Attention reads each query's absolute (RoPE-rotated) value, which softmax attention does not."""
        mask = kwargs.get("attention_mask")
        if mask is not None and kwargs.get("position_ids") is None and self.takes_positions:
            ids = kwargs.get("input_ids", args[0] if args else None)
            length = (ids if ids is not None else kwargs["inputs_embeds"]).shape[1]
            positions = mask.long().cumsum(-1) - 1
            kwargs["position_ids"] = positions.masked_fill(mask == 0, 1)[:, -length:]
        return self.base_model(*args, **kwargs)

    def generate(self, *args, **kwargs):
        return self.base_model.generate(*args, **kwargs)

    @property
    def base_model(self) -> nn.Module:
        """The model the method was injected into (peft's name for it)."""
        return self.wrapped

    def get_input_embeddings(self) -> nn.Module:
        return self.wrapped.get_input_embeddings()

    @property
    def method(self) -> str:
        return self.ntk_configs[self.active_adapter].method

    # --- parameters -----------------------------------------------------------------------------------------

    def get_nb_trainable_parameters(self) -> tuple[int, int]:
        """(trainable, all) parameters, as peft's PeftModel counts them."""
        return count_parameters(self.base_model)

    def print_trainable_parameters(self) -> None:
        trainable, total = self.get_nb_trainable_parameters()
        print(f"trainable params: {trainable:,d} || all params: {total:,d} || trainable%: {100 * trainable / total:.4f}")

    # --- switching ------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def disable_adapter(self) -> Iterator[None]:
        """Inside: the base model exactly (its own attention implementation); the adapter is back on exit."""
        self.base_model.set_attn_implementation(self.original_attention)
        try:
            yield
        finally:
            self.base_model.set_attn_implementation(self.method)

    def set_adapter(self, adapter_name: str) -> None:
        """Make a loaded adapter the active one: its tensors are copied into the model (no merge)."""
        if adapter_name not in self.ntk_configs:
            raise ValueError(f"no adapter named {adapter_name!r} (loaded: {', '.join(self.ntk_configs)})")
        if adapter_name == self.active_adapter:
            return
        live = adapter_tensors(self.base_model, self.method)
        self.stored[self.active_adapter] = {n: t.detach().clone() for n, t in live.items()}
        self._copy_in(self.stored.pop(adapter_name))
        self.active_adapter = adapter_name

    def _copy_in(self, tensors: dict[str, torch.Tensor]) -> None:
        """Write an adapter's tensors into the live model (the active adapter's place)."""
        live = adapter_tensors(self.base_model, self.method)
        with torch.no_grad():
            for name, tensor in tensors.items():
                live[name].copy_(tensor)

    # --- saving and loading ---------------------------------------------------------------------------------

    def save_pretrained(self, directory: str | Path, adapter_name: str | None = None, **_) -> Path:
        """adapter_config.json + adapter_model.safetensors of one adapter (the active one by default). Extra keyword
        arguments (the Trainer's state_dict, is_main_process, …) are accepted and ignored."""
        from safetensors.torch import save_file

        name = adapter_name or self.active_adapter
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        tensors = (adapter_tensors(self.base_model, self.method) if name == self.active_adapter
                   else self.stored[name])
        save_file({n: t.detach().cpu().contiguous() for n, t in tensors.items()}, directory / WEIGHTS_NAME)
        self.ntk_configs[name].save(directory)
        return directory

    def _read(self, directory: str | Path, config: NTKConfig) -> dict[str, torch.Tensor]:
        """The tensors of the adapter saved in `directory` with `config`, checked against this model: class, method,
        tensor names, shapes."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        _check_base(config, self.base_model, directory)
        if config.method != self.method:
            raise ValueError(f"the adapter in {directory} is {config.method}; this model's adapters are {self.method}")
        try:
            tensors = load_file(Path(directory) / WEIGHTS_NAME)
        except (FileNotFoundError, SafetensorError, OSError) as err:
            raise ValueError(f"cannot read {Path(directory) / WEIGHTS_NAME} ({err})") from None
        check_tensors(tensors, adapter_tensors(self.base_model, self.method), f"the adapter in {directory}")
        return tensors

    @classmethod
    def from_pretrained(cls, model: nn.Module, directory: str | Path, adapter_name: str = "default") -> "NTKModel":
        """The saved adapter in `directory` on `model` (the same base model it was trained on)."""
        config = NTKConfig.load(directory)
        _check_base(config, model, directory)  # before the method goes into `model`
        fresh = NTKConfig(config.method, _untrained(config), config.base_model_class, config.base_model_name_or_path)
        wrapped = cls(model, fresh, adapter_name)
        wrapped._copy_in(wrapped._read(directory, config))
        wrapped.ntk_configs[adapter_name] = config
        return wrapped

    def load_adapter(self, directory: str | Path, adapter_name: str) -> None:
        """Load another saved adapter of the same method and shapes under `adapter_name` (inactive until
        set_adapter)."""
        if adapter_name in self.ntk_configs:
            raise ValueError(f"an adapter named {adapter_name!r} is loaded already")
        config = NTKConfig.load(directory)
        self.stored[adapter_name] = self._read(directory, config)
        self.ntk_configs[adapter_name] = config


def _check_base(config: NTKConfig, model: nn.Module, directory) -> None:
    """One error when the adapter was saved for another class of model."""
    if config.base_model_class not in (None, type(model).__name__):
        raise ValueError(f"the adapter in {directory} was made for {config.base_model_class}, not "
                         f"{type(model).__name__}")


def _untrained(config: NTKConfig) -> dict:
    """The options with an init that reads nothing (the saved tensors replace whatever an init computes)."""
    if config.method == ntk.NAME:
        return {**config.options, "init": "zeros", "scale": "fixed"}
    return {**config.options, "init": "normal"}  # ptuning-v2: a random normal prefix, overwritten on load


def get_ntk_model(model: nn.Module, config: NTKConfig | None = None, adapter_name: str = "default",
                  calibration: dict | None = None) -> NTKModel:
    """peft's get_peft_model for NTK-Attention: the backbone frozen (the task head trainable), the method added."""
    return NTKModel(model, config or NTKConfig(), adapter_name, calibration)


def peft_on_ntk(model: NTKModel, peft_config, adapter_name: str = "default"):
    """peft's get_peft_model on an NTK model. peft freezes every tensor it did not add, so the NTK model's trainable
    ones (the method's tensors, the task head) are made trainable again. Each method saves its own: the returned
    peft model's save_pretrained the peft adapter, `model.save_pretrained` the NTK adapter and the head."""
    from peft import get_peft_model

    own = [p for p in model.parameters() if p.requires_grad]
    peft_model = get_peft_model(model, peft_config, adapter_name)
    for p in own:
        p.requires_grad_(True)
    return peft_model
