"""Which of our model classes serves a config. A model file registers its classes itself
(`register_model`: the Hugging Face `architectures` names a class serves, and the `model_type`s
of configs read from GGUF metadata, which name no architecture); `model_class_for` imports every
module of `srt.models` once, so a new architecture is one new file here and nothing else."""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable
from typing import Any, TypeVar

from torch import nn

ModelClass = TypeVar("ModelClass", bound=type[nn.Module])

# Filled by `register_model` as the model modules are imported.
_BY_ARCHITECTURE: dict[str, type[nn.Module]] = {}
_BY_MODEL_TYPE: dict[str, type[nn.Module]] = {}


def register_model(
    *architectures: str, model_types: tuple[str, ...] = ()
) -> Callable[[ModelClass], ModelClass]:
    """A class decorator: the class serves configs whose `architectures` name one of
    `architectures`, and configs without architectures (GGUF metadata's) of `model_types`.
    A name claimed by two classes is an error, raised as the second one's module is imported."""

    def register(cls: ModelClass) -> ModelClass:
        tables = ((_BY_ARCHITECTURE, architectures), (_BY_MODEL_TYPE, model_types))
        for table, names in tables:
            for name in names:
                if table.get(name, cls) is not cls:
                    raise ValueError(
                        f"{name} is served by {table[name].__qualname__}, "
                        f"not also {cls.__qualname__}"
                    )
        for table, names in tables:
            table.update(dict.fromkeys(names, cls))
        return cls

    return register


@functools.cache
def _import_models() -> None:
    """Imports every module of `srt.models`, which registers its classes."""
    package = importlib.import_module("srt.models")
    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{module.name}")


def supported_architectures() -> list[str]:
    """Every architecture name some model class serves, sorted."""
    _import_models()
    return sorted(_BY_ARCHITECTURE)


def model_class_for(config: Any) -> type[nn.Module]:
    """The class for a config; an unsupported architecture fails listing the supported ones."""
    _import_models()
    architectures = getattr(config, "architectures", None) or []
    for arch in architectures:
        if arch in _BY_ARCHITECTURE:
            return _BY_ARCHITECTURE[arch]
    model_type = getattr(config, "model_type", None)
    if not architectures and model_type in _BY_MODEL_TYPE:
        return _BY_MODEL_TYPE[model_type]
    if not architectures:  # a GGUF file's config: its architecture is the model type
        raise ValueError(
            f"unsupported GGUF architecture {model_type}; srt serves GGUF files of "
            f"{', '.join(sorted(_BY_MODEL_TYPE))}"
        )
    raise ValueError(
        f"unsupported model architecture {', '.join(architectures)}; "
        f"srt supports {', '.join(supported_architectures())}"
    )
