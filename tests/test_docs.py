"""The docs' runnable code runs: docs/annotating.md's walkthrough, block after block."""

import pathlib
import re

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _walkthrough_blocks() -> list[str]:
    text = (ROOT / "docs" / "annotating.md").read_text()
    section = text.split("## Walkthrough", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)\n```", section, re.S)


def test_the_annotating_walkthrough_runs_as_written(capsys):
    blocks = _walkthrough_blocks()
    assert len(blocks) >= 4  # the model, streaming it both ways, a wrong declaration, verify
    namespace: dict = {"__name__": "walkthrough"}
    rng = torch.random.get_rng_state()
    try:
        for i, block in enumerate(blocks):
            exec(compile(block, f"docs/annotating.md walkthrough block {i + 1}", "exec"), namespace)
    finally:
        torch.random.set_rng_state(rng)
    printed = capsys.readouterr().out
    assert "region 'kv' is (2, 32, 0)" in printed  # the wrong declaration was refused, as the doc says
    assert namespace["report"]["exact"] is True
    assert sum(namespace["session"].stats()["graph_runs"].values()) == 20
