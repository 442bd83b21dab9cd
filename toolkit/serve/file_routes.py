"""LibreTranslate's file translation for tk serve: `POST /translate_file` and `GET /download_file/<name>`.

POST /translate_file takes a multipart form (`file`, `source`, `target`, optional `api_key`), translates the file with its
structure kept (toolkit.deploy.files: .txt, .html/.htm, .docx, .srt) and answers
`{"translatedFileUrl": "http://HOST/download_file/<token>.<name>"}`; GET on that URL sends the translation as an attachment,
once. A client never names a path here: uploads and translations live in a temporary directory the server owns, under
random names (an unguessable token), and the name in a download URL only looks the token up. A translation is deleted
once downloaded or after FileRoutesConfig.ttl_s, and the files held together never pass max_stored_bytes (503 beyond).
The request body is read within its own size and time limits before the form is parsed, by the reader the middleware
reads the translation routes' bodies with (the middleware leaves this route's body to it), and the file is checked by
files.read_file (size, zip bomb, DTD, outside links) before any translation. Every error answers `{"error": "one line"}`.

`add_file_routes(app, translate_texts, config)` registers both routes on a FastAPI app; translate_texts is the app's own
translation: `await translate_texts(texts, source, target, api_key)` gives the texts' translations in order, raising
the app's own errors (which its exception handlers answer) for a pair it does not serve, a key it refuses, a busy queue.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import tempfile
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse
from starlette.background import BackgroundTask
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException

from toolkit.core.errors import ToolkitError, UsageError
from toolkit.deploy import files
from toolkit.serve.bodies import error
from toolkit.serve.middleware import BodyLimits, Refused, read_body

log = logging.getLogger("tk.serve")
TRANSLATE_FILE = "/translate_file"
DOWNLOAD_FILE = "/download_file"
TranslateTexts = Callable[[list[str], str, str, "str | None"], Awaitable[list[str]]]
_TOKEN = re.compile(r"[A-Za-z0-9_-]{32}")  # secrets.token_urlsafe(24)
_FORM_FIELDS = 8  # file, source, target, api_key and a few a client may add (LibreTranslate's own send no more)
_FIELD_BYTES = 64 * 1024  # a form field other than the file


@dataclass(frozen=True)
class FileRoutesConfig:
    limits: files.Limits = field(default_factory=files.Limits)  # what a file may be (files.read_file)
    body_timeout_s: float = 60.0  # the whole upload must arrive within this (408 beyond)
    ttl_s: float = 900.0  # a translation not downloaded within this is deleted
    max_stored_bytes: int = 256 * files.MiB  # uploads being translated and translations waiting, together
    parallel: int = 2  # files read or written at the same time (on worker threads)

    @property
    def max_body_bytes(self) -> int:
        """The largest multipart body: the largest file, its part's headers and the other fields."""
        return max(self.limits.docx_bytes, self.limits.text_bytes) + _FORM_FIELDS * _FIELD_BYTES

    @property
    def body(self) -> BodyLimits:
        """The upload's limits, for the one body reader (toolkit.serve.middleware.read_body)."""
        return BodyLimits(self.max_body_bytes, self.body_timeout_s, fix="send a smaller file", late="the file", grouped=True)


@dataclass
class _Stored:
    path: Path
    name: str  # the name the client sent, made safe: the download's file name
    kind: str
    size: int
    expires: float


class FileStore:
    """The server's own directory of translations waiting for their download, by token."""

    def __init__(self, config: FileRoutesConfig, clock: Callable[[], float] = time.monotonic):
        self.config, self.clock = config, clock
        self._directory = tempfile.TemporaryDirectory(prefix="tk-serve-files-")  # removed with the server process
        self.root = Path(self._directory.name)
        self.entries: dict[str, _Stored] = {}
        self.reserved = 0  # bytes of uploads being translated

    @property
    def stored_bytes(self) -> int:
        return self.reserved + sum(e.size for e in self.entries.values())

    def sweep(self) -> None:
        """Deletes the translations whose time is up."""
        now = self.clock()
        for token in [t for t, e in self.entries.items() if e.expires <= now]:
            self.discard(self.entries.pop(token))

    def room(self, size: int) -> None:
        """Refuses a file of `size` bytes that the store has no room for."""
        self.sweep()
        if self.stored_bytes + size > self.config.max_stored_bytes:
            raise Refused(503, f"the server holds {self.stored_bytes:,} bytes of files, its limit is {self.config.max_stored_bytes:,}; "
                                   "retry once translations are downloaded")

    def add(self, token: str, path: Path, name: str, kind: str) -> None:
        self.entries[token] = _Stored(path, name, kind, path.stat().st_size, self.clock() + self.config.ttl_s)

    def take(self, token: str, name: str) -> _Stored | None:
        """The translation stored under token with this name, now the caller's to send and discard; None if none."""
        self.sweep()
        entry = self.entries.get(token)
        if entry is None or entry.name != name:
            return None
        return self.entries.pop(token)

    @staticmethod
    def discard(entry: _Stored) -> None:
        entry.path.unlink(missing_ok=True)

    def close(self) -> None:
        self._directory.cleanup()


def safe_name(filename: str | None) -> str:
    """The file name a client sent, reduced to its last component of ASCII letters, digits, '.', '-' and '_' (anything else,
    spaces too, an '_', as werkzeug's secure_filename that LibreTranslate uses), without leading dots, at most 100
    characters (its extension kept): only ever a download's name, never a path."""
    name = re.split(r"[\\/]", filename or "")[-1]
    name = re.sub(r"[^A-Za-z0-9._-]", "_", name.strip()).strip(".")
    if len(name) > 100:
        stem, dot, suffix = name.rpartition(".")
        name = (stem[: 99 - len(suffix)] + dot + suffix) if dot and len(suffix) < 10 else name[:100]
    return name or "file"


async def _form(request: Request, config: FileRoutesConfig) -> tuple[str, bytes, str, str, str | None]:
    """(file name, file bytes, source, target, api_key) from the multipart form, read within the limits."""
    if request.headers.get("content-type", "").split(";")[0].strip().lower() != "multipart/form-data":
        raise Refused(400, "Invalid request: missing file parameter; send the file in a multipart/form-data form with the fields "
                               "file, source and target")
    body = await read_body(request.scope, request.receive, config.body)
    sent = False

    async def replay() -> dict:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    try:
        form = await Request(request.scope, replay).form(max_files=1, max_fields=_FORM_FIELDS, max_part_size=_FIELD_BYTES)
    except (HTTPException, MultiPartException) as e:
        raise Refused(400, f"the form cannot be read ({getattr(e, 'detail', None) or getattr(e, 'message', e)}); "
                               "send one file with the fields source and target") from None
    try:
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise Refused(400, "Invalid request: missing file parameter")
        fields = {}
        for key in ("source", "target", "api_key"):
            value = form.get(key)
            if value is not None and not isinstance(value, str):
                raise Refused(400, f"Invalid request: {key} must be a text field")
            fields[key] = value
        for key in ("source", "target"):
            if not fields[key]:
                raise Refused(400, f"Invalid request: missing {key} parameter")
        return upload.filename or "", await upload.read(), fields["source"], fields["target"], fields["api_key"] or None
    finally:
        await form.close()


class _FileRoutes:
    """The two routes' work, over one store of translations."""

    def __init__(self, translate_texts: TranslateTexts, config: FileRoutesConfig):
        self.translate_texts, self.config = translate_texts, config
        self.store = FileStore(config)
        self.turn = asyncio.Semaphore(config.parallel)  # reading and writing files take CPU: on worker threads, a few at a time

    async def on_thread(self, work: Callable, *args):
        async with self.turn:
            return await asyncio.to_thread(work, *args)

    async def translate_file(self, request: Request):
        """LibreTranslate's file translation: a multipart form with file, source, target (and api_key); answers
        translatedFileUrl, where the translation can be downloaded once."""
        try:
            return JSONResponse({"translatedFileUrl": await self.translated(request)})
        except Refused as e:  # the app's own, from translate_texts, too (a key's Retry-After kept)
            return error(e.status, str(e), e.headers)

    async def translated(self, request: Request) -> str:
        """The download URL of the posted file's translation, stored under a new token."""
        filename, data, source, target, api_key = await _form(request, self.config)
        name = safe_name(filename)
        try:
            kind = files.kind_of(name)
        except UsageError as e:
            raise Refused(400, str(e)) from None
        store = self.store
        store.room(len(data))
        token = secrets.token_urlsafe(24)
        suffix = Path(name).suffix.lower()  # one of files.KINDS, checked above
        src, dst = store.root / f"{token}.in{suffix}", store.root / f"{token}.out{suffix}"
        size = len(data)
        store.reserved += size
        try:
            await self.on_thread(src.write_bytes, data)
            del data  # the copy on disk is read from here on
            try:
                document = await self.on_thread(files.read_file, src, kind, self.config.limits, name)
            except UsageError as e:  # DataError too: the message names the client's file, never the server's copy
                raise Refused(400, str(e)) from None
            request.state.sentences = len(document.texts)
            translations = await self.translate_texts(document.texts, source, target, api_key) if document.texts else []
            try:
                await self.on_thread(document.save, dst, translations)
            except ToolkitError as e:
                log.error("cannot store the translation of %s: %s", name, e)
                raise Refused(500, "the server cannot store the translation; its log has the details") from None
        except BaseException:
            dst.unlink(missing_ok=True)
            raise
        finally:
            store.reserved -= size
            src.unlink(missing_ok=True)
        store.add(token, dst, name, kind)
        if store.stored_bytes > self.config.max_stored_bytes:
            store.discard(store.entries.pop(token))
            raise Refused(503, f"the translation does not fit in the server's {self.config.max_stored_bytes:,} bytes for files; "
                                   "retry once translations are downloaded")
        return f"{request.base_url}{DOWNLOAD_FILE.lstrip('/')}/{token}.{urllib.parse.quote(name)}"

    async def download_file(self, name: str):
        """A translation from /translate_file, as an attachment; each is sent once, then deleted."""
        token, dot, rest = name.partition(".")
        entry = self.store.take(token, rest) if dot and _TOKEN.fullmatch(token) else None
        if entry is None:
            return error(404, f"no translation {ascii(name[:120])} here: each is downloaded once, within {self.config.ttl_s:g}s; "
                               "translate the file again")
        return FileResponse(entry.path, media_type=files.MEDIA_TYPES[entry.kind], filename=entry.name,
                            headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"},
                            background=BackgroundTask(self.store.discard, entry))


def add_file_routes(app: FastAPI, translate_texts: TranslateTexts, config: FileRoutesConfig | None = None) -> FileStore:
    """Registers POST /translate_file and GET /download_file/{name} on app; returns the store of translations (also
    app.state.file_store)."""
    try:
        import python_multipart  # noqa: F401 (starlette parses multipart forms with it)
    except ImportError:
        raise UsageError("file translation needs python-multipart; install the serve extra: pip install 'tk-onnx-deploy[serve]'") from None
    routes = _FileRoutes(translate_texts, config or FileRoutesConfig())
    app.post(TRANSLATE_FILE)(routes.translate_file)
    app.get(DOWNLOAD_FILE + "/{name}")(routes.download_file)
    app.state.file_store = routes.store
    return routes.store
