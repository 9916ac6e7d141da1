"""The README's examples run and its set-up commands are the ones CI runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_readme_python_examples_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the examples write files
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    assert len(blocks) >= 3
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)
    assert "[[9. 9. 9.]" in capsys.readouterr().out
    assert (tmp_path / "states.npz").exists()


def test_readme_opens_with_two_setup_commands_and_ci_runs_the_test_one():
    setup = README.split("## Set up", 1)[1]
    commands = re.search(r"```bash\n(.*?)```", setup, flags=re.S).group(1).strip().splitlines()
    assert len(commands) == 2
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == commands[1]
