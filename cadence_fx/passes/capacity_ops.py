"""The functions a capacity-form graph calls (``passes.capacity``), kept apart from the rewrite.

Each is plain torch: sizes from an expression's Python text (on host ints, or device
scalars, so a CUDA graph of the callers reads no host size), and the three ops whose
capacity form differs from the step's own: a ``cat`` after a padded part, a write into a
padded destination, and attention over padded keys.
"""

from __future__ import annotations

import builtins
import functools
from typing import Mapping, Sequence

import torch


#: the builtins an evaluation's frame sees: the real ones (an op that imports lazily, as a fake
#: tensor's dispatch does, finds ``__import__`` through the calling frame's builtins)
_GLOBALS = {"__builtins__": builtins}


@functools.lru_cache(maxsize=None)
def _code(text: str):
    return compile(text, "<size>", "eval")


def host_size(text: str, names: tuple, *values: int) -> int:
    """The size ``text`` (a Python expression over ``names``) at host ints ``values``."""
    v = eval(_code(text), _GLOBALS, dict(zip(names, values)))
    if type(v) is not int:
        raise ValueError(f"size {text} at {dict(zip(names, values))} is {v!r}, not an int")
    return v


def within(value: int, capacity: int, name: str) -> None:
    """Refuse a dim outside ``[0, capacity]`` (the graph's first node)."""
    if not 0 <= value <= capacity:
        raise ValueError(f"{name} = {value} is outside the capacity form's 0..{capacity}")


def faithful(x: torch.Tensor, shape: Sequence[int], stride: Sequence[int], offset: int) -> torch.Tensor:
    """``x``'s values in a tensor of ``shape``, ``stride`` and storage ``offset`` (the layout
    the step gives the value: what a stride-sensitive kernel reads the same way)."""
    span = 0 if 0 in shape else 1 + sum((n - 1) * st for n, st in zip(shape, stride))
    out = x.new_empty(offset + span).as_strided(shape, stride, offset)
    return out.copy_(x)


def device_size(text: str, names: tuple, *values: torch.Tensor) -> torch.Tensor:
    """The size ``text`` at device int64 scalars ``values`` (``//``, ``+``, ``*``, ``-``: device ops)."""
    return eval(_code(text), _GLOBALS, dict(zip(names, values)))


def _live_mask(shape: Sequence[int], dims: Mapping[int, torch.Tensor], device) -> torch.Tensor:
    """A bool tensor broadcastable to ``shape``: true inside the live prefix on each of ``dims``."""
    mask = None
    for d, n in dims.items():
        size = [1] * len(shape)
        size[d] = shape[d]
        m = (torch.arange(shape[d], device=device) < n).view(size)
        mask = m if mask is None else mask & m
    return mask


def offset_cat(parts: Sequence[torch.Tensor], dim: int, offsets: Sequence[torch.Tensor]) -> torch.Tensor:
    """``cat`` along a padded ``dim``: part ``i`` (whole, at capacity) written from device
    offset ``offsets[i]`` (the live sizes before it), in order, so each part's live prefix
    follows the one before it (past the last one: the last part's padding, then zeros)."""
    shape = list(parts[0].shape)
    shape[dim] = sum(p.shape[dim] for p in parts)
    dtype = functools.reduce(torch.promote_types, (p.dtype for p in parts))  # as cat promotes
    out = parts[0].new_zeros(shape, dtype=dtype)
    for p, off in zip(parts, offsets):
        index = torch.arange(p.shape[dim], device=p.device) + off
        out.index_copy_(dim, index, p.to(dtype))
    return out


def masked_copy(dst: torch.Tensor, src: torch.Tensor, dims: tuple, *lengths: torch.Tensor) -> torch.Tensor:
    """``dst.copy_(src)`` inside ``dst``'s live prefix on ``dims`` (device lengths); past it
    ``dst`` keeps its own values (a select, bit for bit)."""
    mask = _live_mask(dst.shape, dict(zip(dims, lengths)), dst.device)
    return dst.copy_(torch.where(mask, src, dst))


def masked_attention(q, k, v, length: torch.Tensor, *args, **kwargs):
    """``scaled_dot_product_attention`` over keys padded on dim -2, live below ``length``:
    the padding is zeroed (it may hold anything) and masked out."""
    live = torch.arange(k.shape[-2], device=k.device) < length
    keep = live.view(-1, 1)
    k, v = torch.where(keep, k, torch.zeros((), dtype=k.dtype, device=k.device)), \
        torch.where(keep, v, torch.zeros((), dtype=v.dtype, device=v.device))
    # the mask as benchmarks/length_free_attention.py measured it exact: [batch, 1, queries, keys]
    mask = live.view(1, 1, 1, -1).expand(q.shape[0], 1, q.shape[-2], -1).contiguous()
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, mask, *args, **kwargs)


def to_capacity(x: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """``x`` (exact sizes) as a padded value of ``shape``: its values in the prefix, zeros past it."""
    out = x.new_zeros(shape)
    out[tuple(slice(0, n) for n in x.shape)].copy_(x)
    return out


def probe_masked_attention(q_shape: Sequence[int], k_shape: Sequence[int], v_shape: Sequence[int],
                           dtype: torch.dtype, device, lengths: Sequence[int], seed: int = 0) -> bool:
    """Whether ``masked_attention`` over keys padded to ``k_shape`` (NaN past the live ones)
    gives the bits of the exact call on the live keys alone (contiguous, as a ``cat`` leaves
    them), at each of ``lengths``, on this device and dtype, under the caller's settings
    (deterministic algorithms: the protocol exactness is defined under)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = ((torch.randn(tuple(s), generator=g) * 0.5).to(device=device, dtype=dtype)
               for s in (q_shape, k_shape, v_shape))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    with torch.no_grad():
        for n in lengths:
            kp, vp = k.clone(), v.clone()
            kp[..., n:, :] = float("nan")
            vp[..., n:, :] = float("nan")
            want = sdpa(q, k[..., :n, :].contiguous(), v[..., :n, :].contiguous())
            if not torch.equal(want, masked_attention(q, kp, vp, torch.tensor(n, device=device))):
                return False
    return True
