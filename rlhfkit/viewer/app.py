"""`rlhfkit view RUN_DIR [RUN_DIR ...]`: a page of training runs.

    GET /                    the page: curves and samples (drawn by static/viewer.js), the reports (rendered here)
    GET /api/metrics         {"runs": [{"name", "path", "rows": [{"step": ..., "loss": ...}, ...]}]}
    GET /api/samples         {"runs": [{"name", "rows": [{"step", "prompt", "response", "score"}, ...]}]}; a
                             multi-turn row has "turns" ([{"role", "content", "kind"}]) instead of "messages"
    GET /file/N/PATH         an image under the N-th folder given (the plots a report shows)

Read-only: nothing here changes a file, so there is no POST. Curves are drawn by a small SVG plotter of
our own (static/viewer.js): no chart library, nothing fetched from elsewhere.
"""

from __future__ import annotations

import html
import logging
from pathlib import Path
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import Response

from rlhfkit.config.pages import ViewConfig
from rlhfkit.viewer.runs import IMAGE_SUFFIXES, Folder, find_runs, image_file, metrics, report_source, samples
from rlhfkit.web import markdown
from rlhfkit.web.server import HttpError, Server, is_loopback, json_response, page, route, web_app

logger = logging.getLogger(__name__)


class ViewerApp:
    def __init__(self, folders: list[Folder]):
        self.folders = folders
        self.runs = [run for folder in folders for run in folder.runs]
        routes = [
            route("/", self.index),
            route("/api/metrics", self.metrics),
            route("/api/samples", self.samples),
            route("/file/{n:int}/{path:path}", self.file),
        ]
        self.app = web_app(routes)

    def _reports(self) -> str:
        """Each folder's report (report.md, else summary.json), or else its runs' own reports, as HTML."""
        sections = []
        for n, folder in enumerate(self.folders):
            bases = [folder.path] if report_source(folder.path) else [run.path for run in folder.runs]
            for base in bases:
                found = report_source(base)
                if found is None:
                    continue
                name, source = found
                rel = "" if base == folder.path else base.relative_to(folder.path).as_posix()

                def image_url(src: str, n=n, rel=rel) -> str | None:
                    if Path(src).suffix.lower() not in IMAGE_SUFFIXES or "://" in src:
                        return None
                    return f"/file/{n}/{quote(f'{rel}/{src}' if rel else src)}"

                title = html.escape(f"{base / name}")
                body = markdown.render(source, image_url)
                sections.append(f'<article class="doc report"><p class="report-path">{title}</p>{body}</article>')
        if not sections:
            return '<p class="empty">No report.md or summary.json in these folders.</p>'
        return "\n".join(sections)

    def index(self, req: Request) -> Response:
        names = ", ".join(run.name for run in self.runs)
        return page("viewer.html", raw={"reports": self._reports()}, title=names)

    def metrics(self, req: Request) -> Response:
        runs = [{"name": run.name, "path": str(run.path), "rows": metrics(run)} for run in self.runs]
        return json_response({"runs": runs})

    def samples(self, req: Request) -> Response:
        return json_response({"runs": [{"name": run.name, "rows": samples(run)} for run in self.runs]})

    def file(self, req: Request) -> Response:
        n = req.path_params["n"]
        if n >= len(self.folders):
            raise HttpError(404, "no such folder")
        path = image_file(self.folders[n].path, req.path_params["path"])  # already percent-decoded
        if path is None:
            raise HttpError(404, "no such image")
        return Response(path.read_bytes(), 200, media_type=IMAGE_SUFFIXES[path.suffix.lower()])


def run(cfg: ViewConfig) -> None:
    """Entry point of `rlhfkit view`: serve the page until interrupted."""
    folders = find_runs(cfg.runs)
    viewer = ViewerApp(folders)
    server = Server(viewer.app, cfg.serve.host, cfg.serve.port)
    logger.info("%d run(s): %s", len(viewer.runs), ", ".join(run.name for run in viewer.runs))
    logger.info("open %s   (stop with Ctrl-C)", server.url("/"))
    if not is_loopback(cfg.serve.host):
        logger.warning("the page is reachable from other machines, without a password")
    server.serve_forever()
