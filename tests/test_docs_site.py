"""The documentation site as a reader gets it: `mkdocs build --strict` (what `make docs` runs) succeeds, the home page
is README, the guides and the API reference render, and its search finds a config field, in the index and in a
headless browser (Debian's chromium, which `make test`'s set-up installs where apt can)."""

import functools
import http.server
import inspect
import json
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

# one xdist worker runs this module, so its module-scoped fixture runs once
pytestmark = [pytest.mark.xdist_group("docs_site")]

REPO = Path(__file__).resolve().parents[1]
FIELD = "router_aux_loss_scope"  # a config field documented in docs/moe.md


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("site")
    mkdocs = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(folder)]
    built = subprocess.run(mkdocs, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    return folder


def test_the_site_holds_readme_the_guides_and_the_api(site):
    home = (site / "index.html").read_text()
    assert "Quick start" in home and 'href="models/"' in home  # README, its links pointing at the guides' pages
    assert "What a config can choose" in (site / "models" / "index.html").read_text()
    api = (site / "api" / "models" / "index.html").read_text()
    assert 'id="hf_tfm.TfmDecoderForCausalLM"' in api and 'id="hf_tfm.TfmConfig"' in api
    assert (site / "benchmarks" / "REPORT" / "index.html").is_file()  # a repository document the guides link


def test_the_config_reference_lists_every_field_with_its_type(site):
    """TfmConfig's docstring, in transformers' `name (`type`, *optional*): description` form, renders as a list of
    parameters (not one paragraph), each type in code and none left with its raw backticks."""
    from hf_tfm import TfmConfig, TfmEncoderDecoderConfig

    api = re.sub(r"\s+", " ", (site / "api" / "models" / "index.html").read_text())
    assert "<b><code>vocab_size</code></b> (<code>int</code>)" in api
    assert "<b><code>pad_vocab_size_to_multiple_of</code></b> (<code>int</code>, optional)" in api
    assert "<code>`" not in api
    docstrings = inspect.getdoc(TfmConfig) + inspect.getdoc(TfmEncoderDecoderConfig)  # indented as Python 3.13's
    documented = re.findall(r"^ {4}(\w+) \(`", docstrings, re.M)
    assert len(documented) > 90
    assert [name for name in documented if f"<b><code>{name}</code></b>" not in api] == []


def test_the_search_index_finds_a_config_field(site):
    index = json.loads((site / "search" / "search_index.json").read_text())
    assert any(FIELD in entry["text"] and entry["location"].startswith("moe/") for entry in index["docs"])


@pytest.mark.skipif(shutil.which("chromium") is None, reason="no chromium (make test installs it where apt can)")
def test_a_browser_renders_the_site_and_its_search_finds_a_config_field(site):
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/?q={FIELD}"  # Material opens its search on ?q=
        browser = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=15000"]
        page = subprocess.run([*browser, "--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
    finally:
        server.shutdown()
    assert "Quick start" in page  # the home page rendered
    results = page[page.index("md-search-result__list") :]
    assert 'href="moe/' in results, "the search did not list the MoE guide for " + FIELD
