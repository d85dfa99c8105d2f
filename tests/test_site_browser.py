"""The site's math renders in a real browser with the network off (issue 78).

Debian's ``chromium`` opens three built pages (the derivations, a tutorial, the exercises) as
files, in a network namespace of its own (``unshare -n``: no network at all), and hands back the
DOM after the page's scripts ran (``--dump-dom``). Each page must have:

- every formula rendered by KaTeX (one ``.katex`` element per formula of the built page), none
  of them a KaTeX error (red source);
- no raw TeX delimiters left in the text that a reader sees;
- asked for no ``http(s)`` resource: Chromium's network log holds none of the page's requests.

Where Chromium is absent the test skips, saying so; ``.ci/run`` installs it and sets
``NPFORMER_REQUIRE_BROWSER=1``, which makes that (and a missing docs extra) a failure instead.
"""
import json
import os
import re
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser

import pytest

from site_build import built_site, unavailable

PAGES = ("backprop.html", "tutorials/01_one_layer_by_hand.html", "exercises.html")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync",
                  "--virtual-time-budget=15000")
# a formula as the built page holds it, before KaTeX: arithmatex's \(..\) and \[..\] on the
# Markdown pages, Jupyter's $..$ and $$..$$ in the notebooks' Markdown cells
FORMULA = re.compile(r"\$\$.+?\$\$|\\\[.+?\\\]|\\\(.+?\\\)|\$[^$]+?\$", re.S)
RAW_DELIMITERS = re.compile(r"\$\$|\\\[|\\\]|\\\(|\\\)|\$[^$\s][^$]*\$")
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
        "track", "wbr"}


@pytest.fixture(scope="module")
def chromium():
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        unavailable("Chromium is not installed (apt-get install -y chromium)")
    # a network namespace of its own: as root, or in a user namespace of its own elsewhere
    for offline in (["unshare", "-n"], ["unshare", "-r", "-n"]):
        try:
            subprocess.run([*offline, "true"], check=True, capture_output=True, timeout=30)
            return [*offline, found]
        except (OSError, subprocess.SubprocessError) as e:
            reason = e
    unavailable(f"cannot start a program without network (unshare -n, or -r -n): {reason}")


class ReadersText(HTMLParser):
    """The text a reader sees: without scripts, styles, code blocks and KaTeX's output (whose
    MathML copy keeps the TeX source for screen readers)."""
    SKIP = {"script", "style", "pre", "code", "noscript", "template", "svg"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.text, self.stack = [], []    # stack: one flag per open element, True = skipped

    def handle_starttag(self, tag, attrs):
        if tag in VOID:
            return
        classes = (dict(attrs).get("class") or "").split()
        skipped = tag in self.SKIP or "katex" in classes or "katex-display" in classes
        self.stack.append(skipped or (bool(self.stack) and self.stack[-1]))

    def handle_endtag(self, tag):
        if tag not in VOID and self.stack:
            self.stack.pop()

    def handle_data(self, data):
        if not (self.stack and self.stack[-1]):
            self.text.append(data)


def readers_text(html):
    parser = ReadersText()
    parser.feed(html)
    return "".join(parser.text)


def open_offline(chromium, page):
    """(the DOM after the scripts ran, the http(s) URLs the page asked for); ``chromium`` is the
    command that starts Chromium without network."""
    with tempfile.TemporaryDirectory() as profile:
        netlog = os.path.join(profile, "netlog.json")
        r = subprocess.run([*chromium, *CHROMIUM_FLAGS,
                            f"--user-data-dir={profile}/user", f"--log-net-log={netlog}",
                            "--dump-dom", page.as_uri()],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and "</html>" in r.stdout, r.stderr[-2000:]
        with open(netlog, encoding="utf-8") as f:
            log = json.load(f)
    start_job = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    asked = [e["params"]["url"] for e in log["events"]
             if e["type"] == start_job and "file://" in e["params"].get("network_isolation_key", "")
             and e["params"]["url"].startswith(("http:", "https:"))]   # the page's, not Chromium's
    return r.stdout, asked


@pytest.mark.parametrize("name", PAGES)
def test_the_math_renders_offline_in_a_real_browser(chromium, tmp_path_factory, name):
    page = built_site(tmp_path_factory) / name
    formulas = len(FORMULA.findall(readers_text(page.read_text(encoding="utf-8"))))
    dom, asked = open_offline(chromium, page)

    assert asked == [], f"{name} asked the network for {asked}"
    rendered = dom.count('class="katex"')
    errors = re.findall(r'class="katex-error"[^>]*title="([^"]*)"', dom)
    assert errors == [], f"{name}: KaTeX could not read {len(errors)} formulas: {errors[:3]}"
    assert rendered == formulas, f"{name}: {formulas} formulas, {rendered} rendered by KaTeX"
    if name != "exercises.html":
        assert formulas > 10, f"{name}: only {formulas} formulas found; is the math still there?"
    left = sorted(set(RAW_DELIMITERS.findall(readers_text(dom))))
    assert left == [], f"{name}: TeX left unrendered in the page's text: {left[:10]}"
