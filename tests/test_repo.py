"""The README's two set-up commands and CI stay in step."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _readme_commands():
    text = (ROOT / "README.md").read_text()
    setup = text.split("## Set up", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)\n```", setup, re.S)


def test_readme_has_exactly_two_setup_commands():
    cmds = _readme_commands()
    assert len(cmds) == 2, cmds
    assert all("\n" not in c for c in cmds)
    assert cmds[0].endswith("cadence-fx demo")
    assert "pytest" in cmds[1]


def test_ci_runs_the_readme_test_command_verbatim():
    ci = (ROOT / ".ci" / "run").read_text()
    assert _readme_commands()[1] in ci.splitlines()


def test_the_test_command_installs_every_extra_a_test_file_skips_without():
    """tests/serving/test_ray.py skips where Ray is missing: CI must install it."""
    section = (ROOT / "pyproject.toml").read_text().split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    extras = re.findall(r"^([a-z]+) = \[", section, re.M)
    installed = re.search(r'pip install -e "\.\[([a-z,]+)\]"', _readme_commands()[1]).group(1).split(",")
    assert sorted(installed) == sorted(extras), (installed, sorted(extras))


def test_core_names_no_model_family():
    """passes, runtime and plan see models only through the adapter interface."""
    family = re.compile(r"\b(token2wav|step-?audio2?|cosyvoice|hift|mimi|moshi|vibevoice)\b", re.I)
    for folder in ("passes", "runtime", "plan"):
        for path in sorted((ROOT / "cadence_fx" / folder).rglob("*.py")):
            hits = family.findall(path.read_text())
            assert not hits, f"{path.relative_to(ROOT)} names {sorted(set(hits))}"


# ------------------------------------------------------------------ architecture
import ast  # noqa: E402

PKG = ROOT / "cadence_fx"
#: files over the size limit (each with a comment saying why); empty: every file is under it
OVERSIZE_ALLOWED: set[str] = set()
MAX_LINES = 600


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """cadence_fx module -> the cadence_fx modules it imports (module and function level)."""
    files = {_module_name(p): p for p in PKG.rglob("*.py")}
    graph = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            for t in targets:
                while t and t not in files:
                    t = t.rpartition(".")[0]
                if t and t != name:
                    deps.add(t)
        graph[name] = deps
    return graph


def _is_package_init_edge(a: str, b: str) -> bool:
    # a package's __init__ re-exports its submodules: not an upward import
    return b.startswith(a + ".") or a.startswith(b + ".") and b in ("cadence_fx",)


def test_no_import_circle():
    graph = {m: {d for d in ds if not _is_package_init_edge(m, d)} for m, ds in _import_graph().items()}
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(m):
        state[m] = 1
        path.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                raise AssertionError(f"import circle: {' -> '.join(path[path.index(d):] + [d])}")
            if d not in state:
                visit(d)
        path.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_runtime_and_passes_never_import_each_other():
    graph = _import_graph()
    for m, deps in graph.items():
        if m.startswith("cadence_fx.runtime"):
            assert not [d for d in deps if d.startswith("cadence_fx.passes")], f"{m} imports a pass"
        if m.startswith("cadence_fx.passes"):
            assert not [d for d in deps if d.startswith("cadence_fx.runtime")], f"{m} imports the runtime"


def test_the_library_never_imports_the_tools():
    if not (PKG / "tools").is_dir():
        import pytest
        pytest.skip("no cadence_fx/tools yet")
    for m, deps in _import_graph().items():
        if not m.startswith("cadence_fx.tools") and m != "cadence_fx.__main__":
            assert not [d for d in deps if d.startswith("cadence_fx.tools")], f"{m} imports the tools"


def test_no_library_file_over_the_size_limit():
    over = {str(p.relative_to(ROOT)) for p in PKG.rglob("*.py") if len(p.read_text().splitlines()) > MAX_LINES}
    assert over <= OVERSIZE_ALLOWED, f"over {MAX_LINES} lines: {sorted(over - OVERSIZE_ALLOWED)}"
    stale = {f for f in OVERSIZE_ALLOWED if (ROOT / f).exists() and f not in over}
    assert not stale, f"allowed to be over-size but no longer are: drop them from the list: {sorted(stale)}"
