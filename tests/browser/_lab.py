"""Start JupyterLab headless on 127.0.0.1 for a browser test, and stop it.

Follows ``shared/recipes/browser_test_recipe.md``: isolated config, runtime
and settings dirs, a token, port 0 read back from the runtime file, no news
toast, ``window.jupyterapp`` exposed, and every cell rendered (no windowing).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


def require_browser() -> None:
    """Skip a browser test where chromium or playwright is missing; under CI
    (``CI`` set) fail instead: the browser tests must run there."""
    import pytest

    reason = None
    if not Path(CHROMIUM).exists():
        reason = f"{CHROMIUM} not found: apt-get install -y chromium"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            reason = "python package playwright not installed: pip install -e '.[test]'"
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"the browser test must run in CI: {reason}")
    pytest.skip(reason)


CHROME_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

KERNEL_IDLE = """() => {
  const app = window.jupyterapp; if (!app) return false;
  const w = app.shell.currentWidget;
  const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
  return !!(k && k.status === 'idle' && w.content && w.content.widgets.length > 0);
}"""

# Does not return the command's promise: page.evaluate would wait for every cell.
RUN_ALL = "() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }"

# The entries of JupyterLab's log console (every logger: one per notebook), as
# ``{source, level, text}``. The console's loggers live in the logconsole plugin's
# service; JupyterLab logs there every kernel message no cell claims, e.g. the
# kernel's stderr while it answers a widget's message (``No such comm``).
LOG_ENTRIES = """async () => {
  const app = window.jupyterapp;
  const data = app.pluginRegistry._plugins.get('@jupyterlab/logconsole-extension:plugin');
  const registry = data.service || await app.resolveRequiredService(data.provides);
  const entries = [];
  for (const logger of registry.getLoggers()) {
    const model = logger.outputAreaModel;
    for (let i = 0; i < model.length; i++) {
      const item = model.get(i);
      const json = item.toJSON();
      let text = json.text || json.evalue || '';
      if (!text && json.data) text = json.data['text/plain'] || JSON.stringify(json.data).slice(0, 500);
      entries.push({source: logger.source, level: item.level, text: String(text)});
    }
  }
  return entries;
}"""


def _user_setting(root: Path, plugin: str, value: dict) -> None:
    path = root / ".settings" / "@jupyterlab" / plugin
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value))


def start_lab(
    root: Path,
    token: str,
    timeout: float = 60.0,
    env: dict[str, str] | None = None,
    args: tuple[str, ...] = (),
) -> tuple[subprocess.Popen, str]:
    """Start ``jupyter lab`` serving ``root``; returns the process and its base URL.
    ``env`` adds variables for the server and its kernels, ``args`` options."""
    env = dict(
        os.environ,
        **(env or {}),
        JUPYTER_CONFIG_DIR=str(root / ".cfg"),
        JUPYTER_RUNTIME_DIR=str(root / ".rt"),
        IPYTHONDIR=str(root / ".ipython"),
        JUPYTER_PLATFORM_DIRS="1",
    )
    _user_setting(root, "notebook-extension/tracker.jupyterlab-settings", {"windowingMode": "none"})
    _user_setting(
        root,
        "apputils-extension/notification.jupyterlab-settings",
        {"fetchNews": "false", "checkForUpdates": False},
    )
    # The test serves copies, but an autosave must never write outputs into a notebook.
    _user_setting(root, "docmanager-extension/plugin.jupyterlab-settings", {"autosave": False})
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ServerApp.allow_root=True",
        "--ServerApp.ip=127.0.0.1",
        "--ServerApp.port=0",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        "--LabApp.expose_app_in_browser=True",
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        f"--LabApp.user_settings_dir={root / '.settings'}",
        f"--LabApp.workspaces_dir={root / '.ws'}",
        *args,
    ]
    log = open(root / "jupyter.log", "w")  # noqa: SIM115 (lives as long as the server)
    proc = subprocess.Popen(
        cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for info_file in (root / ".rt").glob("jpserver-*.json"):
            base = f"http://127.0.0.1:{json.loads(info_file.read_text())['port']}"
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2) as r:
                    if r.status == 200:
                        return proc, base
            except OSError:
                pass
        if proc.poll() is not None:
            raise RuntimeError(f"jupyter lab exited: {(root / 'jupyter.log').read_text()[-2000:]}")
        time.sleep(0.2)
    stop_lab(proc)
    raise TimeoutError("jupyter lab did not come up")


def stop_lab(proc: subprocess.Popen) -> None:
    """SIGINT twice (jupyter server's no-confirm shutdown, which stops its kernels);
    then kill our own child's process group if it lingers."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
