"""The local web pages' shared parts: the Starlette app and uvicorn server behind every page, with the checks
each request passes (Host allow-list, same-origin POSTs, body size, CSRF token, security headers: server.py),
Markdown rendered with raw HTML off (markdown.py), and the pages' HTML, CSS and scripts (static/). The labelling
page (rlhfkit.labelling) and the run viewer (rlhfkit.viewer) are built on it."""
