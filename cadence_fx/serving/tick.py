"""``run_tick``: launch every ready session's chunk, then collect them all.

Sessions opened with their own CUDA ``stream`` launch a chunk without waiting
(``submit``), so launching every chunk of a tick before reading any lets their graphs
run concurrently on one GPU; the tick then takes as long as the overlapped batch, not
the sum of its chunks.  On the CPU (or without streams) each chunk runs at ``submit``,
one after another.  ``serve-sim --overlap`` and ``SessionPool.tick`` use it.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..errors import CadenceError


class TickError(CadenceError, RuntimeError):
    """Some chunks of a tick were refused or failed at ``submit``.  The others ran and
    were collected: ``results[i]`` is chunk ``i``'s output (None where it failed) and
    ``errors`` maps each failed index to its exception.  A chunk refused on the host
    (bad tokens, a closed or busy session) launched nothing and changed nothing."""

    def __init__(self, results: list[Any], errors: dict[int, BaseException]):
        self.results, self.errors = results, errors
        what = "; ".join(f"chunk {i}: {type(e).__name__}: {e}" for i, e in errors.items())
        super().__init__(f"{len(errors)} of {len(results)} chunks of the tick failed at submit (the others ran "
                         f"and are in .results): {what}")


def run_tick(work: Sequence[tuple], before_submit: Callable[[int], None] | None = None,
             return_waveform: bool = False) -> list[Any]:
    """``work``: ``(session, chunk)`` or ``(session, chunk, last_chunk)`` per ready session.

    Submits each in order (``before_submit(i)`` first, e.g. to seed the generators as
    stock would be seeded for that chunk: offsets are read on the host at launch), then
    waits for each and returns their PCM bytes (or waveforms) in order.  A chunk that
    fails at submit does not stop the others: they are collected, then ``TickError``.
    """
    pending: list[Any] = []
    errors: dict[int, BaseException] = {}
    for i, (session, *chunk) in enumerate(work):
        try:
            if before_submit is not None:
                before_submit(i)
            pending.append(session.submit(*chunk))
        except Exception as e:  # noqa: BLE001 - reported in TickError once the others are collected
            errors[i] = e
            pending.append(None)
    results = [None if p is None else p.result(return_waveform) for p in pending]
    if errors:
        raise TickError(results, errors)
    return results
