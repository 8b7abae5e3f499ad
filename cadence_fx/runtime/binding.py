"""Module twins that share parameters but not buffers.

``rebind_buffers(root, {"decoder.att_cache_buffer": t})`` returns a shallow clone of
``root`` in which every module on the path to each named buffer is copied (so the
original tree is untouched) and the buffer is replaced by ``t``.  Parameters,
other buffers and every other submodule are shared, so the twin costs no weight
memory, and the stock buffer it replaces can be freed by its owner.
"""

from __future__ import annotations

import copy
from typing import Mapping

import torch

from ..errors import CadenceError


def rebind_buffers(root: torch.nn.Module, buffers: Mapping[str, torch.Tensor]) -> torch.nn.Module:
    clones: dict[str, torch.nn.Module] = {}

    def clone(path: str) -> torch.nn.Module:
        if path in clones:
            return clones[path]
        if path == "":
            mod = copy.copy(root)
        else:
            parent_path, _, name = path.rpartition(".")
            parent = clone(parent_path)
            if name not in parent._modules:
                raise CadenceError(f"no submodule {path!r} in {type(root).__name__}")
            mod = copy.copy(parent._modules[name])
            parent._modules[name] = mod
        mod._modules = dict(mod._modules)
        mod._buffers = dict(mod._buffers)
        clones[path] = mod
        return mod

    for path, tensor in buffers.items():
        owner_path, _, name = path.rpartition(".")
        owner = clone(owner_path)
        if name not in owner._buffers:
            raise CadenceError(f"{type(root).__name__} has no buffer {path!r} to rebind")
        owner._buffers[name] = tensor
    return clones.get("", root)
