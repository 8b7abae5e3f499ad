"""Exception types.  Every message names the region, shape or entry at fault and
says what to do about it."""

from __future__ import annotations


class CadenceError(Exception):
    """Base class of every error cadence_fx raises on purpose."""


class DeclarationError(CadenceError, ValueError):
    """A clock/region declaration is invalid (raised where it is declared)."""


class PlanError(CadenceError, ValueError):
    """The declarations and the streaming configuration do not give a finite plan."""


class TraceError(CadenceError, RuntimeError):
    """make_fx could not trace the declared step at a catalog entry's shapes."""


class PassError(CadenceError, RuntimeError):
    """A pass's precondition (requires) or postcondition (ensures) failed."""


class InputError(CadenceError, ValueError):
    """A live call's input is malformed (wrong dtype, device, rank, or values)."""


class SessionClosed(CadenceError, RuntimeError):
    """A session was used after close() (or after its last chunk)."""


class RulesError(CadenceError, ValueError):
    """The requested rules cannot run here (e.g. R without CUDA)."""


class SessionBusy(CadenceError, RuntimeError):
    """A call on a session that is already running one (e.g. a second thread's step).

    Raised at once, never waited for: one step at a time per session; concurrent
    streams need one session each."""


class SessionBroken(CadenceError, RuntimeError):
    """A step failed part-way and may have left the session's state half-written.

    Every later step refuses with this error (naming the original one, also its
    ``__cause__``) until ``restore(snapshot)`` or ``load_state(...)`` sets a whole state."""


class SpecializationRefused(CadenceError, RuntimeError):
    """A symbolic step cannot serve these sizes (a guard fails, a shape disagrees).

    Never raised to a user: the compiler traces the entry concretely instead and
    counts the reason (``Executable.notes["setup"]``)."""


class NeedsForeground(CadenceError, RuntimeError):
    """A background build reached work that only the foreground thread may do (run the
    step for real, or draw from a default random generator: ``cadence_fx.foreground``).

    Never raised to a user: the stream stays on the exact eager path (counted, with
    this reason) and that configuration's next set-up builds in the foreground."""


def caused_by(e: "BaseException | None", kind: type) -> bool:
    """Whether ``e`` or an exception in its chain (cause or context) is a ``kind``."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, kind):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False
