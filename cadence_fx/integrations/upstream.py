"""Import an upstream package's submodules without running its ``__init__``.

``stepaudio2-minicpmo`` (pinned 0.1.1) has an ``__init__`` that imports its whole
product surface: ``token2wav`` (torchaudio, s3tokenizer, hyperpyyaml), ``stepaudio2``
(transformers) and the flashcosyvoice engine.  The streaming tail needs none of that:
only the flow (``cosyvoice2.flow``, ``cosyvoice2.transformer``) and the vocoder
(``flashcosyvoice.modules.hifigan``), whose own imports are torch, numpy, scipy, einops
and onnxruntime.  torchaudio's wheels are built against one exact torch, and a CPU
torch next to a CUDA torchaudio does not import, so we install the package with
``--no-deps`` and import the submodules we need through a bare parent package.

How: if the real package is already imported, it is reused as is.  Otherwise a
module object with the package's ``__path__`` is registered in ``sys.modules``
(exactly what the import system builds for a namespace package) so that
``import pkg.sub.mod`` resolves submodules from the installed files without
executing ``pkg/__init__.py``.  Nothing is copied from upstream.

``moshi`` (pinned 0.2.13) is the same story one level down: ``moshi/__init__``
imports everything, and ``moshi/models/__init__`` imports the hub loaders
(huggingface_hub, safetensors, sentencepiece) and the LM.  Mimi's decode path needs
torch, numpy and einops only, so ``import_submodule(..., bare=("models",))`` keeps
that subpackage's ``__init__`` from running too, and ``module_constants`` reads the
released configuration dicts out of ``moshi/models/loaders.py`` without importing it.

``vibevoice`` (pinned 0.0.1) declares gradio, diffusers, librosa, aiortc and more, and
pins transformers; its acoustic decoder (``modular/modular_vibevoice_tokenizer.py``)
imports torch, numpy and transformers alone.  It is installed ``--no-deps`` with
transformers==4.51.3 (its own pin) from the ``models`` extra, and imported with
``bare=("modular",)``: both of its ``__init__`` files are empty in 0.0.1, and a later
version that fills them (the inference model pulls diffusers and the Qwen2 LM) still
imports no more than the decoder needs.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import importlib.util
import sys
import types
from types import ModuleType

from ..errors import CadenceError


class UpstreamMissing(CadenceError, ImportError):
    """An upstream model package is not installed."""


def bare_package(name: str) -> ModuleType:
    """Register ``name`` as a package whose ``__init__`` is not executed."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise UpstreamMissing(
            f"the upstream package {name!r} is not installed; install it with "
            f"`pip install --no-deps {distribution_for(name)}` (see README.md)"
        )
    pkg = types.ModuleType(name)
    pkg.__path__ = list(spec.submodule_search_locations)
    pkg.__file__ = spec.origin
    pkg.__package__ = name
    pkg.__spec__ = spec
    # Marks the module so tests and users can tell it was bare-imported.
    pkg.__cadence_bare__ = True
    sys.modules[name] = pkg
    return pkg


def import_submodule(package: str, submodule: str, bare: tuple[str, ...] = ()) -> ModuleType:
    """``import package.submodule`` without running ``package/__init__.py``.

    ``bare`` names subpackages (relative to ``package``, e.g. ``"models"``) whose
    ``__init__`` must not run either; other intermediate packages import normally.
    """
    bare_package(package)
    for sub in bare:
        bare_package(f"{package}.{sub}")
    return importlib.import_module(f"{package}.{submodule}")


def module_constants(package: str, submodule: str, names: tuple[str, ...]) -> dict[str, object]:
    """Top-level constants ``names`` of ``package/submodule.py``, read from its source.

    For configuration dicts in a module whose imports we cannot afford.  Only the
    right-hand sides of ``NAME = <expression>`` assignments are evaluated, in order,
    with no builtins and only the names read so far in scope (so literals and
    references to earlier constants, nothing else).
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise UpstreamMissing(f"the upstream package {package!r} is not installed; install it with "
                              f"`pip install --no-deps {distribution_for(package)}` (see README.md)")
    path = f"{spec.submodule_search_locations[0]}/{submodule.replace('.', '/')}.py"
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    scope: dict[str, object] = {"__builtins__": {}}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id in names):
            scope[node.targets[0].id] = eval(compile(ast.Expression(node.value), path, "eval"), scope)  # noqa: S307
    missing = [n for n in names if n not in scope]
    if missing:
        raise UpstreamMissing(f"{package}.{submodule} defines no {missing}; the installed version is "
                              f"{installed_version(distribution_for(package).split('==')[0])}")
    return {n: scope[n] for n in names}


_DISTRIBUTIONS = {"stepaudio2": "stepaudio2-minicpmo==0.1.1", "moshi": "moshi==0.2.13",
                  "vibevoice": "vibevoice==0.0.1"}


def distribution_for(package: str) -> str:
    return _DISTRIBUTIONS.get(package, package)


def installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
