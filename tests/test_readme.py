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


def test_readme_scripts_do_their_work_under_main(tmp_path, monkeypatch):
    """A script that starts a cluster is imported again by every spawned worker:
    its top level only defines, the work is under ``if __name__ == "__main__":``."""
    import ast

    import labkv

    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    scripts = [b for b in blocks if 'if __name__ == "__main__":' in b]
    assert len(scripts) >= 2
    for block in scripts:
        for node in ast.parse(block).body:
            defines = isinstance(node, ast.Import | ast.ImportFrom | ast.FunctionDef | ast.ClassDef)
            main = isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'"
            assert defines or main, ast.unparse(node)
    (torch_example,) = [b for b in scripts if "labkv.torch" in b]
    namespace: dict = {}
    exec(compile(torch_example, "README.md", "exec"), namespace)
    loss = namespace["train"](labkv.create("local"))
    assert isinstance(loss, float) and loss < 1.0


def setup_commands() -> list[str]:
    setup = README.split("## Set up", 1)[1]
    return re.search(r"```bash\n(.*?)```", setup, flags=re.S).group(1).strip().splitlines()


def test_readme_opens_with_two_setup_commands_and_ci_runs_the_test_one():
    commands = setup_commands()
    assert len(commands) == 2
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == commands[1]


def test_setup_commands_install_into_a_virtual_environment():
    # A Debian/Ubuntu system Python refuses pip install (externally-managed-environment).
    for command in setup_commands():
        steps = [step.strip() for step in command.split("&&")]
        assert steps[0] == "python3 -m venv .venv", command
        assert all(step.startswith(".venv/bin/") for step in steps[1:]), command


def test_the_lab_command_opens_the_first_notebook_with_the_repository_as_root():
    lab = setup_commands()[0].split("&&")[-1].split()
    assert lab[:2] == [".venv/bin/jupyter", "lab"]
    # a notebook path as argument would root the server at notebooks/ (no docs/, no README)
    assert not [arg for arg in lab[2:] if not arg.startswith("--")], lab
    (url,) = [arg.split("=", 1)[1] for arg in lab if arg.startswith("--LabApp.default_url=")]
    first = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))[0]
    assert url == f"/lab/tree/{first.relative_to(ROOT)}"


def test_readme_reads_in_a_newcomers_order():
    """What it is with one picture of the monitor, set-up, the course, the API, the
    cluster, the docs; tuning details live in docs/, not here."""
    intro, _ = README.split("\n## ", 1)
    pictures = [p for p in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", intro) if "://" not in p]
    assert pictures == ["docs/monitor.png"] and (ROOT / pictures[0]).is_file(), pictures
    headings = re.findall(r"^## (.*)$", README, flags=re.M)
    assert headings == [
        "Set up",
        "The course (`notebooks/`)",
        "The API in one screen",
        "The cluster",
        "Where the docs are",
    ]
    for detail in ("MALLOC_", "refresh_cpu", "ms per", "page fault"):
        assert detail not in README, detail
