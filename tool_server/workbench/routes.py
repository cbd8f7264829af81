"""The workbench: a web UI at ``/ui`` for tools, trajectories, live load and training runs.

The page itself (``tool_server/workbench/static/``: plain HTML, CSS and JavaScript modules, no
build step, nothing fetched from elsewhere) is public, like /healthz: it holds no data.
Everything it shows comes from the API (``/v1/tools``, ``/v1/calls``) and from the
``/ui/api/*`` routes here, behind the same bearer token. Files (rollout JSONL, training
runs) are read only under ``workbench.runs_dir`` or from an upload, and only by a token
that may use every tool (a token scoped to some toolsets reads no server files, and no
environment's gold).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio.to_thread
import orjson
from starlette.requests import Request
from starlette.responses import FileResponse, RedirectResponse, Response
from starlette.routing import Route

from protocol import ErrorKind
from tool_server.api.auth import sees_server_wide
from tool_server.api.routes import HttpApi, error_response, json_response
from tool_server.config import Config
from tool_server.executor.admission import ANONYMOUS_TENANT
from tool_server.workbench.files import UPLOAD_PREFIX, FileError, Files, TrajectoryIndex
from tool_server.workbench.live import metrics_snapshot
from tool_server.workbench.runs import find_runs, read_runs
from tool_server.workbench.tensorboard import ScalarReader, TensorBoardMissing
from tool_server.workbench.tokens import TokenText

__all__ = ["Workbench"]

STATIC = Path(__file__).parent / "static"
MAX_PAGE = 500
NO_RUNS_DIR = (
    "this server has no runs directory: upload a file, or start it with workbench.runs_dir "
    "(config, or TOOLFACTORY__WORKBENCH__RUNS_DIR) naming the directory of your rollout files and runs"
)


class Workbench:
    """The ``/ui`` routes of one app; ``public_paths`` are the static files (no token needed)."""

    def __init__(self, config: Config, api: HttpApi, *, token_required: bool) -> None:
        self.api = api
        self.token_required = token_required
        self.registry = api.registry
        self.files = Files(config.workbench.runs_dir)
        self.index = TrajectoryIndex(config.workbench.index_max_lines, config.workbench.index_max_bytes)
        self.tokens = TokenText(config.workbench.tokenizer)
        self.scalars = ScalarReader()
        self.max_upload = config.limits.max_request_bytes

    @property
    def public_paths(self) -> list[str]:
        return [
            "/ui",
            "/ui/",
            "/ui/api/auth",
            *(f"/ui/{p.name}" for p in sorted(STATIC.iterdir()) if p.is_file()),
        ]

    def routes(self) -> list[Route]:
        return [
            Route("/ui", lambda request: RedirectResponse("/ui/"), methods=["GET"]),
            Route("/ui/", self.page, methods=["GET"]),
            Route("/ui/api/auth", self.auth, methods=["GET"]),
            Route("/ui/api/live", self.live, methods=["GET"]),
            Route("/ui/api/files", self.list_files, methods=["GET"]),
            Route("/ui/api/upload", self.upload, methods=["POST"]),
            Route("/ui/api/trajectories", self.trajectories, methods=["GET"]),
            Route("/ui/api/trajectory", self.trajectory, methods=["GET"]),
            Route("/ui/api/runs", self.runs, methods=["GET"]),
            Route("/ui/api/scalars", self.curve, methods=["GET"]),
            Route("/ui/api/environments", self.environments, methods=["GET"]),
            Route("/ui/api/replay", self.replay, methods=["POST"]),
            # last: any other /ui/<file> is one of the static files, or 404
            Route("/ui/{name}", self.static, methods=["GET"]),
        ]

    def close(self) -> None:
        self.files.close()

    # ----------------------------------------------------------------- the page

    async def page(self, request: Request) -> Response:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        path = STATIC / name
        if "/" in name or name.startswith(".") or not path.is_file():
            return error_response(404, ErrorKind.BAD_REQUEST, f"no workbench file {name!r}")
        return FileResponse(path, headers={"Cache-Control": "no-cache"})

    async def auth(self, request: Request) -> Response:
        # Public: the page asks before its first call (a 401 says the same, as a console error).
        return json_response({"token_required": self.token_required})

    # ----------------------------------------------------------------- live

    async def live(self, request: Request) -> Response:
        scraped = await self.api.metrics(request)  # refreshes the gauges as a scrape does
        if scraped.status_code != 200:
            return scraped  # a token scoped to some toolsets: the figures name every tool
        snapshot = metrics_snapshot(bytes(scraped.body).decode())
        checks = {}
        for check in self.api.readiness_checks:
            name, ok, detail = check()
            checks[name] = {"ok": ok, **detail}
        snapshot["checks"] = checks
        snapshot["ready"] = self.api.ready
        return json_response(snapshot)

    # ----------------------------------------------------------------- files

    def _refused(self, request: Request) -> Response | None:
        if not sees_server_wide(request.scope):
            return error_response(
                403,
                ErrorKind.UNAUTHORIZED,
                "this token is scoped to some toolsets; reading the server's files needs a token for every tool",
            )
        return None

    async def list_files(self, request: Request) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        files = await anyio.to_thread.run_sync(self._listing, _tenant(request))
        runs_dir = str(self.files.runs_dir) if self.files.runs_dir else None
        return json_response({"runs_dir": runs_dir, "files": files})

    async def upload(self, request: Request) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        body = await request.body()  # BodyLimitMiddleware caps it at limits.max_request_bytes
        if not body.strip():
            return error_response(400, ErrorKind.BAD_REQUEST, "the upload is empty")
        wanted = request.query_params.get("name", "upload.jsonl")
        name = await anyio.to_thread.run_sync(self.files.add_upload, wanted, body, _tenant(request))
        return json_response({"file": name}, 201)

    async def trajectories(self, request: Request) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        params = request.query_params
        try:
            path = self.files.resolve(params.get("file", ""), _tenant(request))
            offset, limit = _int(params, "offset", 0), min(_int(params, "limit", 50), MAX_PAGE)
            page = await anyio.to_thread.run_sync(self.index.page, path, dict(params), offset, limit)
        except FileError as exc:
            return self._file_failure(exc, params.get("file", ""))
        return json_response(page)

    async def trajectory(self, request: Request) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        params = request.query_params
        try:
            path = self.files.resolve(params.get("file", ""), _tenant(request))
            line = _int(params, "line", 0)
            body = await anyio.to_thread.run_sync(self._trajectory, path, line)
        except FileError as exc:
            return self._file_failure(exc, params.get("file", ""))
        return Response(body, media_type="application/json")

    def _file_failure(self, exc: FileError, name: str) -> Response:
        """A file the page may not have, with the kind that says whose side the fault is on."""
        if exc.status == 404 and self.files.runs_dir is None and not name.startswith(UPLOAD_PREFIX):
            # Nothing in the request is wrong: the server was started without a runs directory.
            return error_response(404, ErrorKind.UNAVAILABLE, NO_RUNS_DIR)
        kind = ErrorKind.UNAUTHORIZED if exc.status == 403 else ErrorKind.BAD_REQUEST
        return error_response(exc.status, kind, str(exc))

    def _listing(self, tenant: str) -> list[dict[str, Any]]:
        """The files the page may open, each with its index as it stands (being built, cut short)."""
        files = self.files.listing(".jsonl", tenant)
        for entry in files:
            entry["index"] = self.index.status(entry.pop("path"))
        return files

    def _trajectory(self, path: Path, line: int) -> bytes:
        """One trajectory as the view wants it; a malformed record comes without its bad fields,
        and ``problems`` says what they were (the view shows them as the record's error mark)."""
        answer = self.index.trajectory(path, line)
        record, problems = answer["record"], answer["problems"]
        record.pop("prompt_ids", None)  # the prompt is shown as messages
        try:
            texts = self.tokens.texts(record.get("response_ids") or [])
        except Exception as exc:  # ids the tokenizer has no text for (e.g. beyond its vocabulary)
            texts = None
            problems.append(
                f"response_ids: the tokenizer cannot decode them ({type(exc).__name__}: {exc})"[:300]
            )
        siblings = answer["siblings"]
        return orjson.dumps(
            {"line": line, "record": record, "problems": problems, "token_texts": texts, "siblings": siblings}
        )

    async def runs(self, request: Request) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        if self.files.runs_dir is None:
            return json_response({"runs_dir": None, "runs": []})
        runs = await anyio.to_thread.run_sync(read_runs, self.files.runs_dir, self.scalars)
        return json_response({"runs_dir": str(self.files.runs_dir), "runs": runs})

    async def curve(self, request: Request) -> Response:
        """One TensorBoard tag of one run: ``{"run", "tag", "points": [[step, value], ...]}``."""
        if (refused := self._refused(request)) is not None:
            return refused
        runs_dir = self.files.runs_dir
        name, tag = request.query_params.get("run", ""), request.query_params.get("tag", "")
        if runs_dir is None:
            return error_response(404, ErrorKind.UNAVAILABLE, NO_RUNS_DIR)
        found = await anyio.to_thread.run_sync(find_runs, runs_dir)
        if name not in found or not found[name].events:
            return error_response(404, ErrorKind.BAD_REQUEST, f"no run {name!r} with TensorBoard event files")
        try:
            points = await anyio.to_thread.run_sync(self.scalars.curve, found[name].events, tag)
        except TensorBoardMissing as exc:
            return error_response(501, ErrorKind.UNAVAILABLE, str(exc))
        if not points:
            return error_response(404, ErrorKind.BAD_REQUEST, f"run {name!r} has no scalar tag {tag!r}")
        return json_response({"run": name, "tag": tag, "points": points})

    # ----------------------------------------------------------------- environments

    async def environments(self, request: Request) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused  # gold calls and answers: not for a token scoped to some toolsets
        from tool_server.workbench.envs import describe_packs

        return json_response({"packs": describe_packs(self.registry.environments)})

    async def replay(self, request: Request) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        from tool_server.workbench.envs import replay_gold

        try:
            wanted = orjson.loads(await request.body())
            pack, task = wanted["pack"], wanted["task"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return error_response(400, ErrorKind.BAD_REQUEST, 'body must be {"pack": <id>, "task": <id>}')
        host = self.registry.environments
        if host is None:
            return error_response(404, ErrorKind.BAD_REQUEST, "this server serves no environments")
        try:
            answer = await anyio.to_thread.run_sync(replay_gold, host, str(pack), str(task))
        except LookupError as exc:
            return error_response(404, ErrorKind.BAD_REQUEST, str(exc.args[0]))
        return json_response(answer)


def _int(params: Any, key: str, default: int) -> int:
    raw = params.get(key)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError:
        raise FileError(f"{key} must be an integer, got {raw!r}") from None
    if value < 0:
        raise FileError(f"{key} must be 0 or more, got {value}")
    return value


def _tenant(request: Request) -> str:
    """Whose uploads a request may see: its token's tenant (one tenant on a server without tokens)."""
    return (request.scope.get("state") or {}).get("tenant", ANONYMOUS_TENANT)
