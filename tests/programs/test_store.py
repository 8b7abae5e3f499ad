"""ProgramStore.entry_steps: the catalog entries' symbolic steps, an off-catalog chunk's left out."""

from __future__ import annotations

import types

from cadence_fx.programs.store import ProgramStore, symbolic_key


def test_entry_steps_take_one_variant_free_in_the_dims_asked():
    store = ProgramStore()
    step = lambda *dims: types.SimpleNamespace(dims={d: 1 for d in dims})  # noqa: E731 - what entry_steps reads
    base = lambda i, flags=None: symbolic_key(i, str(i), {}, {}, "float32", "cpu", "", flags)  # noqa: E731
    entry0, entry1 = step("prompt_frames"), step("prompt_frames")
    store.put(base(0) + (("variant", 0),), entry0)
    store.put(base(1) + (("variant", 0),), entry1)
    store.put(base(1) + (("variant", 1),), step("prompt_frames"))  # another branch class
    store.put(base(2) + (("variant", 0),), step("prompt_frames", "chunk_tokens"))  # a window's
    store.put(base(2, {"last_chunk": True}) + (("variant", 0),), step("prompt_frames"))  # a flush's
    assert store.entry_steps(["prompt_frames"]) == {0: entry0, 1: entry1}
    assert list(store.entry_steps(["prompt_frames"], variant=1)) == [1]
    assert list(store.entry_steps(["chunk_tokens", "prompt_frames"])) == [2]
