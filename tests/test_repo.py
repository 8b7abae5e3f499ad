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


def test_core_names_no_model_family():
    """passes, runtime and plan see models only through the adapter interface."""
    family = re.compile(r"\b(token2wav|step-?audio2?|cosyvoice|hift|mimi|moshi|vibevoice)\b", re.I)
    for folder in ("passes", "runtime", "plan"):
        for path in sorted((ROOT / "cadence_fx" / folder).rglob("*.py")):
            hits = family.findall(path.read_text())
            assert not hits, f"{path.relative_to(ROOT)} names {sorted(set(hits))}"
