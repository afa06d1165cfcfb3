"""The gateway from a real browser: the classic Notebook 6
(Debian jupyter-notebook) started with `--gateway-url` at our daemon,
driven in headless Chromium through chromedriver (python3-selenium).

The agent's session, made with `kernelmgr exec --session agent`, appears
as the kernelspec "kernelmgr-python--agent"; a notebook opened on it sees
the agent's variables when a cell is typed and run from the UI, a
matplotlib plot renders as an <img>, and interrupt and restart work from
the toolbar and the Kernel menu — the agent's session works throughout.

Everything listens on loopback; the DOM is polled with WebDriverWait,
never slept on. Chromium runs with --headless=new --no-sandbox
--disable-dev-shm-usage so that it starts as root (CI) and unprivileged."""
import json
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kutil  # noqa: E402
import mgrutil  # noqa: E402
from test_gateway import GW  # noqa: E402

# Debian chromium, chromium-driver, python3-selenium (in make deps)
from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import WebDriverException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

pytestmark = pytest.mark.skipif(not mgrutil.have_kernel("python"), reason="no kernel-python")

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
SPEC = "kernelmgr-python--agent"
NB_TOKEN = "nbtok"
UI_DEADLINE = 120  # kernel start in the strict sandbox included


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_until(what, pred, deadline, msg):
    return kutil.poll_until(what, pred, deadline, msg, step=0.1)


@pytest.fixture
def notebook_server(make_mgr, tmp_path):
    """(gw, port, root): a GW whose agent session holds x = 41, and a classic
    Notebook 6 server in gateway mode on it, serving the notebook root."""
    gw = GW(make_mgr)
    root = tmp_path / "root"
    root.mkdir()
    port = free_port()
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"),
               JUPYTER_DATA_DIR=str(tmp_path / "data"), JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"),
               HOME=str(tmp_path))
    for k in ("JUPYTER_GATEWAY_URL", "JUPYTER_GATEWAY_WS_URL", "JUPYTER_GATEWAY_AUTH_TOKEN"):
        env.pop(k, None)
    log = tmp_path / "notebook.log"
    p = subprocess.Popen([sys.executable, "-m", "notebook", "--no-browser", f"--port={port}",
                          "--port-retries=0", "--ip=127.0.0.1", f"--NotebookApp.token={NB_TOKEN}",
                          "--allow-root", f"--notebook-dir={root}",
                          f"--gateway-url={gw.url}", f"--GatewayClient.auth_token={gw.token}",
                          "--debug"],
                         env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)

    def up():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api?token={NB_TOKEN}",
                                        timeout=5):
                return True
        except OSError:
            return p.poll() is not None

    try:
        wait_until(up, bool, 90, "notebook server up")
        assert p.poll() is None, log.read_text()[-3000:]
        yield gw, port, root
    finally:
        p.terminate()
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@pytest.fixture
def browser(tmp_path):
    for exe, pkg in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        assert os.access(exe, os.X_OK), f"{exe} missing: Debian {pkg} (make deps)"
    o = webdriver.ChromeOptions()
    o.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              "--window-size=1280,1024", f"--user-data-dir={tmp_path / 'chromium'}"):
        o.add_argument(a)
    try:
        d = webdriver.Chrome(service=Service(CHROMEDRIVER, log_path=str(tmp_path / "driver.log")),
                             options=o)
    except WebDriverException as e:
        first = (e.msg or str(e)).strip().splitlines()[0] if (e.msg or str(e)).strip() else repr(e)
        pytest.skip(f"chromium cannot start here (uid {os.getuid()}) even with --no-sandbox "
                    f"--headless=new --disable-dev-shm-usage: {first}")
    try:
        yield d
    finally:
        d.quit()


# ------------------------------------------------------------------ the notebook UI

class NotebookPage:
    """The classic notebook page of one .ipynb, through the DOM."""

    def __init__(self, d, diag):
        self.d = d
        self.diag = diag  # () -> str: logs for a failure message

    def wait(self, cond, what, deadline=UI_DEADLINE):
        try:
            return WebDriverWait(self.d, deadline, poll_frequency=0.1).until(
                lambda d: cond(), message="")
        except Exception as e:  # TimeoutException, with the state around it
            raise AssertionError(f"{what}: not within {deadline} s ({e!r})\n{self.diag()}") from e

    def js(self, script):
        return self.d.execute_script(script)

    def kernel_state(self):
        """The kernel indicator's state class: idle, busy, dead, disconnected..."""
        el = self.d.find_elements(By.ID, "kernel_indicator_icon")
        if not el:
            return None
        cls = el[0].get_attribute("class") or ""
        for c in cls.split():
            if c.startswith("kernel_") and c.endswith("_icon"):
                return c[len("kernel_"):-len("_icon")]
        return cls

    def wait_idle(self):
        self.wait(lambda: self.kernel_state() == "idle", "kernel indicator idle")

    def cells(self):
        return self.d.find_elements(By.CSS_SELECTOR, "#notebook-container div.cell")

    def outputs(self, i):
        return self.cells()[i].find_elements(By.CSS_SELECTOR, "div.output_area")

    def output_text(self, i):
        return "\n".join(o.text for o in self.outputs(i))

    def type_and_run(self, code):
        """Types code into the last cell (a fresh one) and runs it with
        shift+enter; returns the cell's index."""
        i = len(self.cells()) - 1
        cell = self.cells()[i]
        self.wait(lambda: cell.find_element(By.CSS_SELECTOR, ".CodeMirror").is_displayed(),
                  "cell editor shown")
        cell.find_element(By.CSS_SELECTOR, ".CodeMirror").click()
        self.wait(lambda: self.js("return Jupyter.notebook.get_selected_index()") == i
                  and self.js("return Jupyter.notebook.mode") == "edit", f"cell {i} in edit mode")
        ActionChains(self.d).send_keys(code).perform()
        # CodeMirror closes brackets and quotes as they are typed; what the cell
        # holds must be what was typed
        got = self.js(f"return Jupyter.notebook.get_cell({i}).get_text()")
        assert got == code, (got, code)
        ActionChains(self.d).key_down(Keys.SHIFT).send_keys(Keys.ENTER).key_up(Keys.SHIFT).perform()
        # shift+enter on the last cell inserts a new one below and selects it
        self.wait(lambda: len(self.cells()) == i + 2, "a new cell after shift+enter")
        return i

    def wait_output(self, i, pred, what):
        return self.wait(lambda: pred(self.output_text(i)) and self.output_text(i), what)

    def click_action(self, action):
        """A toolbar button by its notebook action name."""
        b = self.d.find_element(By.CSS_SELECTOR, f'button[data-jupyter-action="{action}"]')
        self.wait(lambda: b.is_displayed() and b.is_enabled(), f"toolbar {action}")
        b.click()

    def menu(self, top_id, item_id):
        """Opens a menu of the menubar and clicks one of its items, by ids."""
        self.d.find_element(By.ID, top_id).click()
        item = self.d.find_element(By.CSS_SELECTOR, f"#{item_id} > a")
        self.wait(item.is_displayed, f"menu item {item_id} shown")
        item.click()


def diagnostics(d, tmp_path):
    """() -> the notebook server's log and the browser console, for failures."""
    def tail(p):
        try:
            return Path(p).read_text(errors="replace")[-3000:]
        except OSError:
            return "(none)"

    def diag():
        try:
            console = "\n".join(str(e) for e in d.get_log("browser")[-20:])
        except Exception as e:  # noqa: BLE001  (diagnostics only)
            console = repr(e)
        return (f"--- notebook.log:\n{tail(tmp_path / 'notebook.log')}\n"
                f"--- browser console:\n{console}")
    return diag


def open_agent_notebook(d, port, root, diag, name="agent.ipynb", create=True):
    """Creates NAME in the notebook root, bound to the agent's kernelspec, and
    opens it; returns the page once its kernel is idle."""
    if create:
        nb = {"cells": [{"cell_type": "code", "execution_count": None, "id": "c0",
                         "metadata": {}, "outputs": [], "source": ""}],
              "metadata": {"kernelspec": {"name": SPEC, "display_name": "kernelmgr agent",
                                          "language": "python"}},
              "nbformat": 4, "nbformat_minor": 5}
        (root / name).write_text(json.dumps(nb))
    d.get(f"http://127.0.0.1:{port}/notebooks/{name}?token={NB_TOKEN}")
    page = NotebookPage(d, diag)
    page.wait(lambda: page.js("return !!(window.Jupyter && Jupyter.notebook && "
                              "Jupyter.notebook._fully_loaded && Jupyter.notebook.kernel)"),
              "notebook loaded")
    page.wait_idle()
    return page


def test_notebook_in_chromium_on_the_agents_session(notebook_server, browser, tmp_path):
    gw, port, root = notebook_server
    d = browser
    agent_id = gw.kernel_of("agent")["id"]
    diag = diagnostics(d, tmp_path)

    # the agent's session is offered as a kernelspec, through the notebook server
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/kernelspecs?token={NB_TOKEN}",
                                timeout=60) as r:
        specs = json.loads(r.read())
    assert SPEC in specs["kernelspecs"], specs
    assert "agent" in specs["kernelspecs"][SPEC]["spec"]["display_name"]

    page = open_agent_notebook(d, port, root, diag)
    # the page's kernel is the agent's own kernel, not a new one
    assert page.js("return Jupyter.notebook.kernel.id") == agent_id
    assert "agent" in d.find_element(By.CSS_SELECTOR, ".kernel_indicator_name").text

    # the agent's variables, from a cell typed in the UI
    i = page.type_and_run("print(x + 1); y = 'from-browser'")
    page.wait_output(i, lambda t: "42" in t, "output 42")
    assert page.output_text(i).strip() == "42"
    rc, res, p = gw.m.exec("agent", "print(y)")
    assert rc == 0 and res[0]["stdout"].strip() == "from-browser", (p.stderr, res)

    # a plot renders as an image
    i = page.type_and_run("import matplotlib; matplotlib.use('agg'); "
                          "import matplotlib.pyplot as plt; plt.plot([1, 2, 3]); plt.show()")

    def png():
        for img in page.cells()[i].find_elements(By.CSS_SELECTOR, "div.output_area img"):
            src = img.get_attribute("src") or ""
            if src.startswith("data:image/png;base64,") and img.size["width"] > 0:
                return src
        return None
    src = page.wait(png, "an <img> with a data:image/png src")
    assert len(src) > 1000, src[:100]
    page.wait(lambda: page.js(
        f"return Jupyter.notebook.get_cell({i}).element.find('img')[0].naturalWidth") > 0,
        "the png decoded")

    # interrupt from the toolbar
    page.wait_idle()
    i = page.type_and_run("import time; print('sleeping', flush=True); time.sleep(60)")
    page.wait_output(i, lambda t: "sleeping" in t, "the sleeping cell started")
    page.click_action("jupyter-notebook:interrupt-kernel")
    page.wait_output(i, lambda t: "KeyboardInterrupt" in t, "KeyboardInterrupt shown")
    page.wait_idle()
    agent_works = gw.m.exec("agent", "print(x + 1)")
    assert agent_works[0] == 0 and agent_works[1][0]["stdout"].strip() == "42", agent_works

    # restart from the Kernel menu, confirmed in its dialog
    def agent_pid():
        k = gw.kernel_of("agent")
        return k and k["kernelmgr"]["pid"]
    pid_before = agent_pid()
    page.menu("kernellink", "restart_kernel")
    confirm = page.wait(lambda: next((b for b in d.find_elements(
        By.CSS_SELECTOR, ".modal-dialog .modal-footer button")
        if b.is_displayed() and b.text.strip() == "Restart"), None), "the restart dialog")
    confirm.click()
    page.wait(lambda: not d.find_elements(By.CSS_SELECTOR, ".modal-dialog"), "dialog closed")
    page.wait(lambda: agent_pid() not in (None, pid_before),
              "a new kernel process for the agent's session")
    page.wait_idle()
    assert page.js("return Jupyter.notebook.kernel.id") == agent_id
    i = page.type_and_run("print(x)")
    page.wait_output(i, lambda t: "NameError" in t, "NameError after restart")

    # the agent's session still works, on the restarted kernel the UI used
    rc, res, p = gw.m.exec("agent", "print('x' in dir(), 6 * 7)")
    assert rc == 0 and res[0]["stdout"].strip() == "False 42", (p.stderr, res)
    i = page.type_and_run("x = 7; print(x * 6)")
    page.wait_output(i, lambda t: "42" in t, "the UI still runs cells")
    rc, res, p = gw.m.exec("agent", "print(x)")
    assert rc == 0 and res[0]["stdout"].strip() == "7", (p.stderr, res)


def test_saved_notebook_reopens_on_the_agents_session(notebook_server, browser, tmp_path):
    gw, port, root = notebook_server
    d = browser
    agent_id = gw.kernel_of("agent")["id"]
    diag = diagnostics(d, tmp_path)
    page = open_agent_notebook(d, port, root, diag)
    assert page.js("return Jupyter.notebook.kernel.id") == agent_id
    page.click_action("jupyter-notebook:save-notebook")
    saved = root / "agent.ipynb"

    def saved_metadata():
        # the server may be writing the file as we read it (seen empty on a
        # loaded machine): a file that is not JSON yet is "not saved yet"
        try:
            return json.loads(saved.read_text()).get("metadata", {})
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    wait_until(saved_metadata, lambda md: "language_info" in md, 60,
               "the notebook saved from the UI")
    assert saved_metadata()["kernelspec"]["name"] == SPEC
    page = open_agent_notebook(d, port, root, diag, create=False)
    assert page.js("return Jupyter.notebook.kernel.id") == agent_id
