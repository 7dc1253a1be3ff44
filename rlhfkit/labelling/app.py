"""`rlhfkit label`: a web page where people compare two responses to a prompt, and the export of their answers.

Pages and endpoints (TOKEN is the annotator's secret, in the URL printed at start):

    GET  /a/TOKEN                the labelling page (static HTML; static/label.js fills it in)
    GET  /a/TOKEN/guidelines     the --guidelines file, rendered
    GET  /api/TOKEN/state        {"item": {"id", "prompt", "a", "b"} | null, "progress": {"done", "total"}, ...}
    POST /api/TOKEN/judge        {"request_id", "item_id", "choice", "strength"?, "comment"?}
    POST /api/TOKEN/undo         {"request_id"}

A POST needs the page's CSRF token in ``X-CSRF-Token`` (an HMAC of the annotator's name under a secret kept in
the store, so it survives restarts; checked by ``rlhfkit.web.server.CsrfGuard``) besides the same-origin checks
of ``rlhfkit.web.server.Guard``. The answer to a
judgment is sent after the store committed it; the page retries a request whose answer it did not get, with
the same request id, which the store recognises.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
from pathlib import Path

from starlette.requests import Request
from starlette.responses import Response

from rlhfkit.config.pages import STRENGTHS, LabelConfig
from rlhfkit.errors import UserError, command, invocation, option
from rlhfkit.labelling.export import export
from rlhfkit.labelling.items import read_pairs
from rlhfkit.labelling.store import CHOICES, Conflict, Store, file_digest
from rlhfkit.web import markdown
from rlhfkit.web.server import HttpError, Server, is_loopback, json_body, json_response, page, route, web_app

logger = logging.getLogger(__name__)

MAX_COMMENT = 2000  # characters
DEFAULT_ANNOTATOR = "annotator"
_REQUEST_ID = re.compile(r"[A-Za-z0-9_-]{8,64}")
_JUDGE_FIELDS = {"request_id", "item_id", "choice", "strength", "comment"}
_API_PATH = re.compile(r"/api/([^/]+)/")


class LabelApp:
    def __init__(self, store: Store, guidelines: str = ""):
        self.store = store
        self.guidelines_html = ""
        if guidelines:
            try:
                self.guidelines_html = markdown.render(Path(guidelines).read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError) as exc:
                raise UserError(f"{guidelines}: cannot read {option('guidelines')} as UTF-8 text ({exc})") from None
        routes = [
            route("/", self.index),
            route("/a/{token}", self.label_page),
            route("/a/{token}/guidelines", self.guidelines_page),
            route("/api/{token}/state", self.state),
            route("/api/{token}/judge", self.judge, "POST"),
            route("/api/{token}/undo", self.undo, "POST"),
        ]
        self.app = web_app(routes, csrf=self.expected_csrf)

    # -- who is asking --------------------------------------------------------------------------------------

    def csrf_token(self, annotator: str) -> str:
        secret = (self.store.meta("csrf_secret") or "").encode()
        return hmac.new(secret, f"csrf/{annotator}".encode(), hashlib.sha256).hexdigest()

    def expected_csrf(self, path: str) -> str | None:
        """The CSRF token a POST to ``path`` must carry: its annotator's; None for no annotator's API path."""
        match = _API_PATH.match(path)
        name = self.store.annotator_for(match.group(1)) if match else None
        return None if name is None else self.csrf_token(name)

    def _annotator(self, req: Request) -> str:
        name = self.store.annotator_for(req.path_params["token"])
        if name is None:
            raise HttpError(404, "unknown link: ask for your personal URL")
        return name

    def _post_body(self, req: Request) -> tuple[str, dict]:
        return self._annotator(req), json_body(req)  # the CSRF token was checked by the middleware

    # -- pages ----------------------------------------------------------------------------------------------

    def index(self, req: Request) -> Response:
        return page("label_index.html")

    def label_page(self, req: Request) -> Response:
        name = self._annotator(req)
        return page(
            "label.html",
            annotator=name,
            csrf=self.csrf_token(name),
            guidelines_hidden="" if self.guidelines_html else "hidden",
            guidelines_url=f"/a/{req.path_params['token']}/guidelines",
        )

    def guidelines_page(self, req: Request) -> Response:
        self._annotator(req)
        body = self.guidelines_html or "<p>No guidelines were given for this task.</p>"
        return page("guidelines.html", raw={"body": body}, back=f"/a/{req.path_params['token']}")

    # -- API ------------------------------------------------------------------------------------------------

    def _state(self, name: str) -> dict:
        s = self.store.state(name)
        shown = s["item"]
        item = None if shown is None else {"id": shown.item_id, "prompt": shown.prompt, "a": shown.a, "b": shown.b}
        return {
            "annotator": name,
            "item": item,
            "progress": s["progress"],
            "can_undo": s["can_undo"],
            "strengths": list(STRENGTHS),
            "labels_per_item": self.store.labels_per_item,
        }

    def state(self, req: Request) -> Response:
        return json_response(self._state(self._annotator(req)))

    def judge(self, req: Request) -> Response:
        name, body = self._post_body(req)
        unknown = set(body) - _JUDGE_FIELDS
        if unknown:
            raise HttpError(400, f"unknown field(s): {', '.join(sorted(unknown))}")
        request_id, item_id, choice = body.get("request_id"), body.get("item_id"), body.get("choice")
        strength, comment = body.get("strength"), body.get("comment")
        if not isinstance(request_id, str) or not _REQUEST_ID.fullmatch(request_id):
            raise HttpError(400, "request_id must be 8-64 letters, digits, '-' or '_'")
        if not isinstance(item_id, int) or isinstance(item_id, bool):
            raise HttpError(400, "item_id must be an integer")
        if choice not in CHOICES:
            raise HttpError(400, f"unknown choice {str(choice)[:40]!r} (one of {', '.join(CHOICES)})")
        if strength is not None and (strength not in STRENGTHS or choice not in ("a", "b")):
            raise HttpError(400, f"strength must be one of {', '.join(STRENGTHS)}, and only with choice a or b")
        if comment is not None and (not isinstance(comment, str) or len(comment) > MAX_COMMENT):
            raise HttpError(400, f"comment must be text of at most {MAX_COMMENT} characters")
        try:
            judgment_id, new = self.store.judge(name, request_id, item_id, choice, strength, (comment or "").strip())
        except Conflict as exc:
            return json_response({"error": str(exc), "state": self._state(name)}, 409)
        return json_response({"ok": True, "judgment": judgment_id, "new": new, "state": self._state(name)})

    def undo(self, req: Request) -> Response:
        name, body = self._post_body(req)
        request_id = body.get("request_id")
        if set(body) - {"request_id"} or not isinstance(request_id, str) or not _REQUEST_ID.fullmatch(request_id):
            raise HttpError(400, "send {\"request_id\": ...} only, 8-64 letters, digits, '-' or '_'")
        try:
            new = self.store.undo(name, request_id)
        except Conflict as exc:
            return json_response({"error": str(exc), "state": self._state(name)}, 409)
        return json_response({"ok": True, "new": new, "state": self._state(name)})


def open_store(cfg: LabelConfig) -> Store:
    """The store in OUT, created from --data the first time; annotators added from --annotators."""
    out = Path(cfg.label.output_dir)
    db_path = out / "labels.sqlite"
    if cfg.export.export and not db_path.exists():
        start = invocation("label", data="FILE", output_dir=str(out))
        raise UserError(f"{db_path}: no labels to export (start `{start}` first)")
    pairs = digest = None
    if cfg.label.data:
        pairs = read_pairs(cfg.label.data, cfg.label.pairs)  # every row checked before anything is written
        digest = file_digest(cfg.label.data)
    elif not db_path.exists():
        raise UserError(
            f"{command('label')}: {option('data')} is required to start labelling in a new {option('output_dir')}"
        )
    if cfg.label.guidelines and not Path(cfg.label.guidelines).is_file():
        raise UserError(f"{cfg.label.guidelines}: {option('guidelines')} file does not exist")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{out}: cannot create {option('output_dir')} ({exc.strerror})") from None
    store = Store(db_path)
    store.initialise(pairs, digest, cfg.label.seed, cfg.label.labels_per_item)
    return store


def start(cfg: LabelConfig) -> tuple[Server, Store, dict[str, str]]:
    """Open the store and bind the server (not yet serving); returns it, the store and {annotator: token}."""
    host = cfg.serve.host
    store = open_store(cfg)
    tokens = store.add_annotators(cfg.annotator_names())
    if not is_loopback(host) and set(tokens) <= {DEFAULT_ANNOTATOR}:
        store.close()
        raise UserError(
            f"{option('host', host)} makes the page reachable from other machines: name the annotators "
            f"({option('annotators', 'a,b')}) "
            "so that each gets a private link"
        )
    if not tokens:
        tokens = store.add_annotators([DEFAULT_ANNOTATOR])
    store.prepare(list(tokens))  # before serving: no one's first page load waits for it
    labeller = LabelApp(store, cfg.label.guidelines)
    try:
        server = Server(labeller.app, host, cfg.serve.port)
    except UserError:
        store.close()
        raise
    return server, store, tokens


def run(cfg: LabelConfig):
    """Entry point of `rlhfkit label`: serve the labelling page until interrupted, or (--export) write the
    exports and return their paths."""
    if cfg.export.export:
        store = open_store(cfg)
        try:
            paths = export(store, Path(cfg.label.output_dir), cfg.margins(), cfg.export.aggregate)
        finally:
            store.close()
        for path in paths.values():
            logger.info("wrote %s", path)
        return paths
    server, store, tokens = start(cfg)
    logger.info(
        "labelling %d pairs (%d complete), %d label(s) per pair, store %s",
        store.item_count(),
        store.complete_items(),
        store.labels_per_item,
        store.path,
    )
    for name, token in tokens.items():
        logger.info("  %s: %s", name, server.url(f"/a/{token}"))
    if not is_loopback(cfg.serve.host):
        logger.warning("plain HTTP beyond this machine; anyone who sees a link can label as its annotator")
    logger.info("stop with Ctrl-C; then `rlhfkit label --output-dir %s --export`", cfg.label.output_dir)
    try:
        server.serve_forever()
    finally:
        store.close()
