"""The Lab as a student starts it: README's `python3 dev.py lab`, checked through its server and in a real browser.

Through the server: `/` opens on notebooks/, the root served is the repository's, and every relative link and
image of every notebook (notebooks/*.ipynb, whoever wrote it, and the notebooks/*.md pages they link to) resolves
as JupyterLab resolves it: against the notebook's folder, inside the served root; a file or folder through the
contents API, an image through /files/ as an image.

In a browser: Debian's chromium (`apt-get install -y chromium`; `dev.py test` installs it), driven headless by
Playwright's Python package (its own browser download is never used). Every notebook opens rendered: all its cells,
no error output, no math error, no error dialog, every image loaded. The links of notebook 02 are clicked and open
their files. Notebook 01 runs all its cells in the Lab's own kernel, without an error. Where chromium or Playwright
is missing these tests skip and say so; in CI (CI set) they fail instead, so that CI cannot pass without them.
"""
import json
import os
import posixpath
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers.markdown_links import markdown_targets

ROOT = Path(__file__).resolve().parents[2]
LAB_HOME = "/lab/tree/notebooks/README.md"     # dev.py's: the course's start page, where the Lab opens
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
PAGES = sorted((ROOT / "notebooks").glob("*.md"))
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
RUN_ALL = ("01_softmax_attention.ipynb",)      # short enough to run in the browser too (nbval runs them all)
CLICK_LINKS_OF = "02_rwkv4_wkv.ipynb"
# The Lab's settings for the test: every cell rendered (no windowing), never saved (autosave would rewrite the
# committed notebooks), no request for news.
SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                         "checkForUpdates": False},
}


# ---------------------------------------------------------------- the links a notebook holds

def _markdown_targets(text):
    return markdown_targets(text)


def local_targets(path):
    """(kind, target) of every relative link and image of a notebook (markdown cells, markdown and HTML outputs)
    or of a markdown page; web addresses and in-page anchors are left out."""
    if path.suffix == ".md":
        texts = [path.read_text()]
    else:
        texts = []
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] == "markdown":
                texts.append("".join(cell["source"]))
            for output in cell.get("outputs", ()):
                texts += ["".join(output.get("data", {}).get(mime, ())) for mime in ("text/markdown", "text/html")]
    targets = [t for text in texts for t in _markdown_targets(text)]
    return [(kind, target) for kind, target in targets
            if target and not urllib.parse.urlsplit(target).scheme and not target.startswith(("#", "//"))]


def served_path(page, target):
    """The path under the served root that a relative target of page (a file in the repository) points to, as
    JupyterLab resolves it; None if it leaves the root."""
    target = urllib.parse.unquote(urllib.parse.urlsplit(target).path)
    path = posixpath.normpath(posixpath.join(page.parent.relative_to(ROOT).as_posix(), target))
    return None if path == ".." or path.startswith("../") else path


# ---------------------------------------------------------------- the Lab, started as README says

@dataclass
class Lab:
    url: str
    token: str
    log: Path

    def get(self, path, query=""):
        """(status, content type) of GET path (already quoted) on the server."""
        request = urllib.request.Request(f"{self.url}{path}{'?' + query if query else ''}",
                                         headers={"Authorization": f"token {self.token}"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, response.headers.get("Content-Type", "")
        except urllib.error.HTTPError as error:
            return error.code, error.headers.get("Content-Type", "")

    def broken(self, kind, path):
        """Why the target at path (under the root) does not resolve for a link or an image, or None if it does."""
        if path is None:
            return "outside the served root"
        quoted = urllib.parse.quote(path)
        if kind == "image":
            status, content_type = self.get(f"/files/{quoted}")
            ok = status == 200 and content_type.startswith("image/")
            return None if ok else f"/files/ answers {status} {content_type}"
        status, _ = self.get(f"/api/contents/{quoted}", "content=0")
        return None if status == 200 else f"the contents API answers {status}"

    def stop_kernels(self):
        """Shut down every session the browser opened (each notebook opened starts a kernel)."""
        request = urllib.request.Request(f"{self.url}/api/sessions", headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            sessions = json.load(response)
        for session in sessions:
            urllib.request.urlopen(urllib.request.Request(
                f"{self.url}/api/sessions/{session['id']}", method="DELETE",
                headers={"Authorization": f"token {self.token}"}), timeout=30)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """`python3 dev.py lab` (README's command) with the options a headless test needs: no browser, a port, a
    token, the app reachable from the browser's JavaScript, and settings of its own (see SETTINGS)."""
    settings = tmp_path_factory.mktemp("lab-settings")
    for name, values in SETTINGS.items():
        (settings / name).parent.mkdir(parents=True, exist_ok=True)
        (settings / name).write_text(json.dumps(values))
    port, token = _free_port(), secrets.token_hex(16)
    log = tmp_path_factory.mktemp("lab-log") / "lab.log"
    python3 = shutil.which("python3") or sys.executable
    command = [python3, "dev.py", "lab", "--no-browser", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
               "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={token}", "--LabApp.expose_app_in_browser=True",
               f"--LabApp.user_settings_dir={settings}", f"--LabApp.workspaces_dir={tmp_path_factory.mktemp('ws')}",
               # the checkpoints the Lab makes of each file it opens, outside the checkout (an absolute folder)
               f"--FileCheckpoints.checkpoint_dir={tmp_path_factory.mktemp('checkpoints')}"]
    with open(log, "w") as out:
        process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server = Lab(f"http://127.0.0.1:{port}", token, log)
    try:
        deadline = time.monotonic() + 300                          # dev.py may first (re)install the venv
        while server_status(server) != 200:
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"`python3 dev.py lab` did not come up (exit {process.poll()}):\n"
                            + "\n".join(log.read_text().splitlines()[-30:]))
            time.sleep(1)
        yield server
    finally:
        os.killpg(process.pid, signal.SIGTERM)                     # dev.py and the jupyter server it started
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


def server_status(server):
    try:
        return server.get("/api/status")[0]
    except OSError:
        return None


def test_lab_serves_the_repository_and_opens_on_the_start_page(lab):
    request = urllib.request.Request(f"{lab.url}/", headers={"Authorization": f"token {lab.token}"})

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args):
            return None

    with pytest.raises(urllib.error.HTTPError) as redirect:
        urllib.request.build_opener(NoRedirect).open(request, timeout=30)
    assert redirect.value.code == 302
    assert urllib.parse.urlsplit(redirect.value.headers["Location"]).path == LAB_HOME
    for folder in ("notebooks", "reference", "kernels", "models", "benchmarks"):
        assert lab.get(f"/api/contents/{folder}", "content=0")[0] == 200, folder


@pytest.mark.parametrize("page", NOTEBOOKS + PAGES, ids=lambda p: p.name)
def test_every_relative_link_and_image_resolves(lab, page):
    targets = local_targets(page)
    broken = [f"{kind} {target!r}: {why}" for kind, target in targets
              if (why := lab.broken(kind, served_path(page, target)))]
    assert not broken, f"{page.name}: {len(broken)} of {len(targets)} links and images do not resolve:\n" + \
        "\n".join(broken)


def test_the_link_check_finds_broken_links(lab):
    """The check above can fail: a missing file, a path out of the served root, an image that is not one."""
    page = ROOT / "notebooks" / "00_example.ipynb"
    assert lab.broken("link", served_path(page, "../reference/no_such_file.py"))
    assert lab.broken("link", served_path(page, "../../shared/design.md")) == "outside the served root"
    assert lab.broken("image", served_path(page, "../README.md"))
    assert lab.broken("image", served_path(page, "../benchmarks/results/scaling.png")) is None
    targets = _markdown_targets("[a](../x.py) ![b](img/y.png) <img src='z.svg'> [web](https://example.org)")
    assert targets == [("link", "../x.py"), ("image", "img/y.png"), ("image", "z.svg"),
                       ("link", "https://example.org")]


# ---------------------------------------------------------------- in a real browser

@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """A persistent (fresh, empty) Chromium context; skipped with the reason where it cannot run, failed in CI."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as error:
        missing = f"the Playwright Python package ({error}); it is in the test extra: pip install -e .[test]"
    else:
        missing = None if os.access(CHROMIUM, os.X_OK) else f"{CHROMIUM} (Debian: apt-get install -y chromium)"
    if missing:
        message = f"cannot run the Lab in a browser: missing {missing}"
        if os.environ.get("CI"):
            pytest.fail(message + "; CI must run this test (dev.py test installs chromium)")
        pytest.skip(message)
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=CHROMIUM, headless=True,
            args=CHROMIUM_FLAGS, viewport={"width": 1280, "height": 900})
        yield context
        context.close()


def open_notebook(lab, browser, name):
    """A page with the notebook open in the Lab (a fresh workspace) and every cell rendered."""
    page = browser.new_page()
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(f"{lab.url}/lab/tree/notebooks/{name}?reset&token={lab.token}")
    cells = json.loads((ROOT / "notebooks" / name).read_text())["cells"]
    markdown = sum(c["cell_type"] == "markdown" for c in cells)
    page.wait_for_function("""([n, md]) => {
        const nb = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook');
        return nb && nb.querySelectorAll('.jp-Cell').length === n
            && nb.querySelectorAll('.jp-MarkdownCell .jp-RenderedMarkdown').length === md;
    }""", arg=[len(cells), markdown], timeout=120_000)
    page.wait_for_function("""() => Array.from(document.querySelectorAll('.jp-Notebook img'))
        .every(img => img.complete)""", timeout=60_000)
    if _has_math(cells):                                         # MathJax typesets after the markdown renders
        page.wait_for_function("() => document.querySelector('.jp-Notebook mjx-container') !== null",
                               timeout=60_000)
    page.wait_for_timeout(1500)                                  # and may still be at it
    return page, cells, errors


def _has_math(cells):
    return any("$" in "".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


def rendered_problems(page, cells):
    """What is wrong with the notebook as rendered: error outputs, math errors, dialogs, broken or missing images."""
    found = page.evaluate("""() => {
        const nb = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook');
        const images = Array.from(nb.querySelectorAll('img'));
        return {
            stderr: nb.querySelectorAll('[data-mime-type="application/vnd.jupyter.stderr"]').length,
            mathErrors: Array.from(nb.querySelectorAll('mjx-merror')).map(e => e.textContent),
            math: nb.querySelectorAll('mjx-container').length,
            dialogs: Array.from(document.querySelectorAll('.jp-Dialog')).map(d => d.textContent.slice(0, 200)),
            images: images.length,
            broken: images.filter(img => img.naturalWidth === 0).map(img => img.getAttribute('src')),
        };
    }""")
    expected_images = sum("image/png" in o.get("data", {}) for c in cells for o in c.get("outputs", ()))
    expected_images += sum(kind == "image" for c in cells if c["cell_type"] == "markdown"
                           for kind, _ in _markdown_targets("".join(c["source"])))
    problems = []
    if found["stderr"]:
        problems.append(f"{found['stderr']} error or stderr outputs")
    if found["mathErrors"]:
        problems.append(f"math errors: {found['mathErrors']}")
    if _has_math(cells) and not found["math"]:
        problems.append("no math typeset")
    if found["dialogs"]:
        problems.append(f"dialogs: {found['dialogs']}")
    if found["broken"]:
        problems.append(f"broken images: {found['broken']}")
    if found["images"] < expected_images:
        problems.append(f"{found['images']} images shown, {expected_images} in the notebook")
    return problems


def test_the_lab_opens_the_start_page_rendered_beside_the_notebooks_alone(lab, browser, tmp_path):
    """The Lab's first page is the course's start page as a page (its heading rendered, not its Markdown source),
    and the file browser beside it lists the notebooks and no .py twin (those sit in notebooks/sources/, their
    solutions in plain text)."""
    page = browser.new_page()
    try:
        page.goto(f"{lab.url}{LAB_HOME}?reset&token={lab.token}")           # where "/" sends a student
        try:
            page.wait_for_function("""() => Array.from(document.querySelectorAll('.jp-RenderedMarkdown h1'))
                .some(h => h.textContent.includes('Start here'))""", timeout=120_000)
        except Exception:
            page.screenshot(path=str(tmp_path / "start_page.png"))        # what the Lab showed instead
            raise
        page.wait_for_function("() => document.querySelectorAll('.jp-DirListing-item').length > 0", timeout=60_000)
        listed = page.evaluate("""() => Array.from(document.querySelectorAll('.jp-DirListing-item'))
            .map(item => item.getAttribute('title') || item.textContent)""")
        names = [entry.split("\n")[0].split("Name: ")[-1].strip() for entry in listed]
        assert not [n for n in names if n.endswith(".py")], f"the file browser lists .py twins: {names}"
        assert sum(n.endswith(".ipynb") for n in names) == len(NOTEBOOKS), names
    finally:
        page.close()


@pytest.mark.parametrize("name", [p.name for p in NOTEBOOKS])
def test_every_notebook_renders_in_the_lab(lab, browser, name):
    page, cells, errors = open_notebook(lab, browser, name)
    try:
        problems = rendered_problems(page, cells)
        assert not problems and not errors, f"{name}: {problems} {errors}"
    finally:
        page.close()
        lab.stop_kernels()


def test_links_open_their_files_in_the_lab(lab, browser):
    """Each relative link of one notebook (the Lab renders it as a link to /files/...), clicked, opens its file in
    the Lab (the current tab holds that path), with no error dialog and no browser tab of its own."""
    page, _, errors = open_notebook(lab, browser, CLICK_LINKS_OF)
    try:
        links = page.evaluate("""(files) => Array.from(document.querySelectorAll(
            '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-RenderedMarkdown a'))
            .map(a => a.getAttribute('href')).filter(href => href.startsWith(files))""", f"{lab.url}/files/")
        assert len(links) >= 5, f"{CLICK_LINKS_OF}: expected its links to the code, found {links}"
        pages = len(browser.pages)
        for href in dict.fromkeys(links):
            path = urllib.parse.unquote(urllib.parse.urlsplit(href).path[len("/files/"):])
            page.locator(f'.jp-NotebookPanel:not(.lm-mod-hidden) .jp-RenderedMarkdown a[href="{href}"]').first.click()
            page.wait_for_function("""(path) => window.jupyterapp.shell.currentWidget?.context?.path === path""",
                                   arg=path, timeout=30_000, polling=200)
            assert not page.query_selector(".jp-Dialog"), f"{href}: {page.inner_text('.jp-Dialog')[:300]}"
            page.locator(".lm-TabBar-tab", has_text=CLICK_LINKS_OF).first.click()      # back to the notebook
            page.wait_for_selector(".jp-NotebookPanel:not(.lm-mod-hidden)")
        assert len(browser.pages) == pages, "a link opened a browser tab instead of a tab of the Lab"
        assert not errors
    finally:
        page.close()
        lab.stop_kernels()


@pytest.mark.parametrize("name", RUN_ALL)
def test_notebook_runs_in_the_lab(lab, browser, name):
    """Run all cells in the Lab's kernel (outputs cleared first): every code cell executed once, in order, by this
    kernel, none failed, the plots drawn again; the committed notebook is left as it was (nothing is saved)."""
    committed = (ROOT / "notebooks" / name).read_bytes()
    page, cells, errors = open_notebook(lab, browser, name)
    try:
        page.wait_for_function("""() => {
            const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session?.kernel;
            return kernel && kernel.status === 'idle';
        }""", timeout=120_000)
        page.evaluate("""async () => {
            await window.jupyterapp.commands.execute('notebook:clear-all-cell-outputs');
            await window.jupyterapp.commands.execute('notebook:run-all-cells');
        }""")
        page.wait_for_function("""() => {
            const panel = window.jupyterapp.shell.currentWidget;
            const code = panel.content.widgets.filter(c => c.model.type === 'code');
            return code.every(c => c.model.executionCount !== null)
                && panel.sessionContext.session.kernel.status === 'idle';
        }""", timeout=300_000, polling=1000)
        counts = page.evaluate("""() => window.jupyterapp.shell.currentWidget.content.widgets
            .filter(c => c.model.type === 'code').map(c => c.model.executionCount)""")
        assert counts == list(range(1, len(counts) + 1)), f"{name}: execution counts {counts}"
        failed = page.evaluate("""() => window.jupyterapp.shell.currentWidget.content.widgets
            .filter(c => c.model.type === 'code')
            .filter(c => c.model.outputs.toJSON().some(o => o.output_type === 'error'
                                                       || (o.output_type === 'stream' && o.name === 'stderr')))
            .map(c => c.model.sharedModel.getSource().slice(0, 120))""")
        assert not failed, f"{name}: cells that failed or wrote to stderr in the Lab: {failed}"
        page.wait_for_timeout(1000)
        assert not rendered_problems(page, cells) and not errors
    finally:
        page.close()
        lab.stop_kernels()
    assert (ROOT / "notebooks" / name).read_bytes() == committed, f"{name} was modified by the Lab"
