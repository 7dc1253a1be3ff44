"""Helpers of the labelling tests: candidate files, a server in this process, and a small HTTP client.

(A uniquely named module rather than conftest.py, so ``import`` cannot pick another folder's conftest.)
"""

from __future__ import annotations

import importlib.util
import json
import re
import secrets
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from rlhfkit.config.pages import LabelConfig
from rlhfkit.config.parse import parse_config
from rlhfkit.labelling.app import start
from rlhfkit.labelling.store import Store
from rlhfkit.web.server import Server
from tests.helpers import write_jsonl

XSS_SCRIPT = "<script>window.__pwned = 'script'</script>"
XSS_IMG = "<img src=x onerror=\"window.__pwned = 'img'\">"


def bench_script(name: str):
    """``bench/NAME.py`` as a module, loaded from its file."""
    path = Path(__file__).resolve().parents[2] / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def candidate_rows(n: int) -> list[dict]:
    """n rows of two responses each: a polite one (with 'thanks') and a curt one, so a reward model can
    learn the people's preference."""
    return [
        {
            "prompt": f"Customer {i}: my order is late.\nAgent:",
            "responses": [f" thanks for waiting, order {i} ships today", f" order {i} late, wait"],
            "ticket": i,
        }
        for i in range(n)
    ]


def label_config(argv: list[str]) -> LabelConfig:
    cfg, _ = parse_config("rlhfkit label", LabelConfig, argv)
    return cfg


@dataclass
class Running:
    server: Server
    store: Store
    tokens: dict[str, str]

    def url(self, annotator: str) -> str:
        return self.server.url(f"/a/{self.tokens[annotator]}")

    def stop(self) -> None:
        self.server.stop()
        self.store.close()


def serve(tmp_path: Path, rows: list[dict], *flags: str, out: str = "out") -> Running:
    """`rlhfkit label` on ``rows`` in a background thread of this process, on a free port."""
    data = write_jsonl(tmp_path / "candidates.jsonl", rows)
    cfg = label_config(["--data", str(data), "--output-dir", str(tmp_path / out), "--port", "0", *flags])
    server, store, tokens = start(cfg)
    return Running(server.start(), store, tokens)


class Client:
    """One annotator over HTTP, as the page talks to the server (CSRF token from the page, JSON bodies)."""

    def __init__(self, page_url: str):
        self.page_url = page_url
        self.base, self.token = page_url.split("/a/")
        self.csrf = ""

    def load_page(self) -> str:
        with urllib.request.urlopen(self.page_url, timeout=10) as resp:
            html = resp.read().decode()
        self.csrf = re.search(r'name="csrf-token" content="([0-9a-f]+)"', html).group(1)
        return html

    def request(self, method: str, path: str, body: dict | None = None, headers: dict | None = None):
        """(status, JSON answer); HTTP errors are answers too, connection errors raise."""
        data = None if body is None else json.dumps(body).encode()
        head = {"Content-Type": "application/json", "X-CSRF-Token": self.csrf} if method == "POST" else {}
        head.update(headers or {})
        req = urllib.request.Request(f"{self.base}/api/{self.token}/{path}", data=data, method=method, headers=head)
        try:
            with urllib.request.urlopen(req, timeout=20) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    def state(self) -> dict:
        status, answer = self.request("GET", "state")
        assert status == 200, answer
        return answer

    def judge(self, choice: str, item_id: int | None = None, request_id: str | None = None, **extra):
        if item_id is None:
            item_id = self.state()["item"]["id"]
        body = {"request_id": request_id or secrets.token_hex(8), "item_id": item_id, "choice": choice, **extra}
        return self.request("POST", "judge", body)
