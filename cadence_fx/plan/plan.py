"""``Plan``: everything derived from a declaration before anything runs.

``make_plan`` is the second arrow of the data flow (declare -> plan -> trace ...):
it builds the shape catalog, the arena layout (verified) and the scope verdicts
from a ``Declaration`` and the session's ``dims``.  A plan is plain data: print it
with ``explain()``, serialise it with ``to_json()``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping

from ..annotations import MODEL_DTYPE, Declaration
from ..errors import PlanError
from .catalog import CatalogEntry, TensorSpec, build_catalog, entry_for_step, model_dtype_name
from .layout import ArenaLayout, plan_arena, verify_layout
from .verdicts import ScopeVerdict, region_verdicts


@dataclasses.dataclass(frozen=True)
class Plan:
    """The catalog, arena layout and scope verdicts of one streaming configuration.

    Attributes:
        declaration: the model's clocks and regions.
        dims: values of the shape and prefix symbols (sizes, frames).
        dtype: the model dtype ("model" regions take it).
        device: where the arena and every region view live.
        catalog: one entry per clock phase, the last steady.
        layout: every in-scope region's arena slot.
        verdicts: per region (then per callable, from ``extra_verdicts``) in/out.
        stock_state_bytes: bytes the stock runtime holds for the same state (0 if
            not measured), for comparison only.
        inputs: the step's inputs.
    """

    declaration: Declaration
    dims: Mapping[str, int]
    dtype: str
    device: str
    catalog: tuple[CatalogEntry, ...]
    layout: ArenaLayout
    verdicts: tuple[ScopeVerdict, ...]
    stock_state_bytes: int
    inputs: Mapping[str, TensorSpec]

    @property
    def arena_bytes(self) -> int:
        """Bytes of the session's one arena allocation."""
        return self.layout.total_bytes

    def entry_for_step(self, step: int) -> CatalogEntry:
        return entry_for_step(self.catalog, step)

    def to_json(self) -> dict[str, Any]:
        slots = {s.name: s for s in self.layout.slots}
        regions = []
        for r in self.declaration.regions:
            slot = slots.get(r.name)
            stride = self.declaration.clock(r.clock).stride
            regions.append({
                "name": r.name,
                "clock": r.clock,
                "retention": r.retention.to_json(),
                "catalog_width": r.retention.catalog_width(stride),
                "bytes": slot.nbytes if slot else None,
                "offset": slot.offset if slot else None,
                # Out-of-scope regions have no capacity: keep the declared template.
                "shape": list(slot.shape) if slot else list(r.shape),
                "dtype": self.dtype if r.dtype == MODEL_DTYPE else r.dtype,
                "axis": r.axis,
                "carried": r.carried,
                "buffers": list(r.buffers),
            })
        return {
            "step": self.declaration.step,
            "unit": self.declaration.unit,
            "clocks": [c.to_json() for c in self.declaration.clocks],
            "regions": regions,
            "catalog": [e.to_json() for e in self.catalog],
            "verdicts": [v.to_json() for v in self.verdicts],
            "arena_bytes": self.arena_bytes,
            "stock_state_bytes": self.stock_state_bytes,
            "dims": dict(self.dims),
            "dtype": self.dtype,
            "device": self.device,
        }

    def explain(self) -> str:
        """A readable report: clocks, regions, catalog, verdicts, arena vs stock bytes."""
        decl = self.declaration
        slots = {s.name: s for s in self.layout.slots}
        unit = f" ({decl.unit})" if decl.unit else ""
        lines = [f"Plan for step {decl.step!r}{unit}: dtype {self.dtype} on {self.device}",
                 "dims: " + (", ".join(f"{k}={v}" for k, v in self.dims.items()) or "(none)"), ""]

        lines.append("Clocks")
        lines += _table(["clock", "Hz", "frames/step"],
                        [[c.name, f"{c.hz:g}", str(c.stride) if c.max_stride is None else
                          f"{c.stride} (at most {c.max_stride})"] for c in decl.clocks])
        lines.append("")

        lines.append("Regions (capacity = frames the arena holds along the growth axis)")
        rows = []
        for r in decl.regions:
            k = r.retention.catalog_width(decl.clock(r.clock).stride)
            slot = slots.get(r.name)
            dtype = self.dtype if r.dtype == MODEL_DTYPE else r.dtype
            rows.append([r.name, r.clock, r.retention.describe(), "-" if k is None else str(k),
                         "-" if r.axis is None else str(r.axis),
                         "-" if slot is None or slot.capacity is None else str(slot.capacity),
                         _shape(slot.shape) if slot else "out of scope", dtype,
                         f"{slot.nbytes:,}" if slot else "-", _mib(slot.nbytes) if slot else "-",
                         str(slot.offset) if slot else "-",
                         "yes" if r.carried else "no"])
        lines += _table(["region", "clock", "retention", "K", "axis", "capacity", "arena shape", "dtype",
                         "bytes", "MiB", "offset", "carried"], rows)
        lines.append("")

        growing = [s for s in self.layout.slots if s.axis is not None]
        fixed = [s.name for s in self.layout.slots if s.axis is None]
        lines.append(f"Catalog: {len(self.catalog)} entries (frames along each growth axis at the step's input)")
        lines += _table(["entry", "steps"] + [s.name for s in growing],
                        [[str(e.index), _steps(e.steps)] + [str(e.regions[s.name].shape[s.axis]) for s in growing]
                         for e in self.catalog])
        if fixed:
            lines.append("  fixed in every entry: " + ", ".join(fixed))
        if self.inputs:
            lines.append("  inputs in every entry: " + "; ".join(
                f"{n} {_shape(s.shape)} {s.dtype} {s.device}" for n, s in self.inputs.items()))
        lines.append("")

        lines.append("Scope verdicts")
        lines += _table(["verdict", "kind", "subject", "reason"],
                        [[v.verdict, v.kind, v.subject, v.reason] for v in self.verdicts])
        lines.append("")

        lines.append("Arena")
        rows = [["arena_bytes", f"{self.arena_bytes:,}",
                 f"({_mib(self.arena_bytes)} MiB, {len(self.layout.slots)} slots, "
                 f"{self.layout.alignment}-byte aligned)"]]
        if self.stock_state_bytes:
            saved = self.stock_state_bytes - self.arena_bytes
            rows.append(["stock_state_bytes", f"{self.stock_state_bytes:,}", f"({_mib(self.stock_state_bytes)} MiB)"])
            rows.append(["arena / stock", f"{100 * self.arena_bytes / self.stock_state_bytes:.1f}%",
                         f"({saved:,} bytes less than stock)" if saved >= 0
                         else f"({-saved:,} bytes more than stock)"])
        else:
            rows.append(["stock_state_bytes", "0", "(not measured: no ratio)"])
        lines += _table(["", "", ""], rows, show_header=False)
        return "\n".join(lines)


def _table(columns: list[str], rows: list[list[str]], *, show_header: bool = True) -> list[str]:
    """Left-aligned columns, two spaces apart, indented by two."""
    body = ([columns] if show_header else []) + rows
    widths = [max(len(row[i]) for row in body) for i in range(len(columns))]
    return ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in body]


def _shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(v) for v in shape) + ")"


def _steps(steps: tuple[int, ...] | str) -> str:
    return steps if isinstance(steps, str) else ",".join(str(s) for s in steps)


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:,.2f}"


def make_plan(declaration: Declaration, dims: Mapping[str, int], inputs: Mapping[str, TensorSpec],
              dtype: str = "float32", device: str = "cpu", stock_state_bytes: int = 0,
              extra_verdicts: Iterable[ScopeVerdict] = ()) -> Plan:
    """Derive the plan of ``declaration`` under ``dims``.

    Args:
        dims: values of the shape and prefix symbols (e.g. ``{"n_timesteps": 5,
            "prompt_frames": 100}``).
        inputs: the step's inputs, name -> spec.
        dtype: the model dtype ("model" regions take it).
        device: where the arena lives.
        stock_state_bytes: what the stock runtime holds for the same state (bytes).
        extra_verdicts: verdicts on callables from later stages.
    """
    if not isinstance(declaration, Declaration):
        raise PlanError(f"make_plan needs a Declaration (get_declaration(model)), got {type(declaration).__name__}")
    dtype = model_dtype_name(dtype)
    if isinstance(stock_state_bytes, bool) or not isinstance(stock_state_bytes, int) or stock_state_bytes < 0:
        raise PlanError(f"stock_state_bytes={stock_state_bytes!r} must be an int >= 0 (bytes; 0 = not measured)")
    extra = tuple(extra_verdicts)
    bad = [v for v in extra if not isinstance(v, ScopeVerdict)]
    if bad:
        raise PlanError(f"extra_verdicts must be ScopeVerdicts, got {bad!r}")
    dims = dict(dims)
    catalog = build_catalog(declaration, dims, inputs, dtype, device)
    layout = plan_arena(declaration, dims, dtype)
    verify_layout(layout)  # fail closed: never hand out a layout whose slots could clobber each other
    verdicts = region_verdicts(declaration, dims, dtype) + extra
    return Plan(declaration, dims, dtype, device, catalog, layout, verdicts, stock_state_bytes, dict(inputs))
