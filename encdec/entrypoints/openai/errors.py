"""Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, and their handlers.

Bad input is a 400 (401, 404, 413, 429 where OpenAI uses them) naming the field in `param`;
500 is only for real faults (the serving middleware answers those that escape a route). The
official client retries 429 and 5xx by default.
"""
from __future__ import annotations

import logging
import re
from typing import Any, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match

from encdec.engine.async_engine import EngineDeadError, EngineOverloaded

logger = logging.getLogger("encdec.server")

# OpenAI's error types: a wrong key and an unknown model are invalid requests too
TYPES = {429: "rate_limit_exceeded", 500: "server_error", 503: "server_error"}
RETRY_AFTER_SECONDS = 1


CLIENT_CLOSED_REQUEST = 499  # nginx's status for a client that left before its response


class ClientDisconnected(Exception):
    """The client closed the connection before its response was ready."""


class OpenAIError(Exception):
    """An error the client gets as `status` with OpenAI's error body."""

    def __init__(self, status: int, message: str, param: Optional[str] = None,
                 code: Optional[str] = None, headers: Optional[dict[str, str]] = None):
        super().__init__(message)
        self.status, self.code, self.headers = status, code, headers
        self.message = printable(message)
        self.param = None if param is None else printable(param)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": TYPES.get(self.status, "invalid_request_error"),
                          "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def printable(text: str) -> str:
    """`text` with lone surrogates (JSON's "\\ud800") escaped, so that it encodes as UTF-8."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def bad_request(message: str, param: Optional[str] = None) -> OpenAIError:
    return OpenAIError(400, message, param)


def value_error(err: ValueError, params: dict[str, str], default: Optional[str] = None) -> OpenAIError:
    """A 400 for a ValueError of the engine or SamplingParams; `param` is the API field its
    message starts with (`params` maps internal names such as beam_width to API names, in the
    message too)."""
    message = str(err)
    first = re.match(r"[A-Za-z_]+", message)
    name = first.group(0) if first else ""
    param = params.get(name, default)
    if first and param and param != name and name in params:
        message = param + message[first.end():]
    return bad_request(message, param)


def validation_error(err: ValidationError | RequestValidationError) -> OpenAIError:
    """A 400 for the first failed field of a request body or form. A field that takes one of
    several types is named alone, with the types it takes."""
    errors = err.errors()
    first = object_member_error(errors) or errors[0]
    loc = error_path(first)
    fields = loc[:1] + [part for part in loc[1:] if not is_union_member(part)]  # loc[0]: the field
    param = ".".join(fields[:1] + [part for part in fields[1:] if not part.isdigit()]) if loc else None
    kind = first.get("type")
    if kind == "json_invalid":
        return bad_request(f"the body is not valid JSON: {first.get('msg')}")
    if kind == "missing" and param is None:
        return bad_request("the body is empty: send a JSON object")
    if kind == "extra_forbidden":
        return bad_request(f"unknown field {param!r}", param)
    if kind == "missing":
        return bad_request(f"{param!r} is required", param)
    if fields != loc:
        field = fields[0]
        return bad_request(f"{field}: expected one of {', '.join(union_members(errors, field))}", field)
    message = str(first.get("ctx", {}).get("error", "")) if kind == "value_error" else first.get("msg", "")
    return bad_request(f"{'.'.join(fields)}: {message}" if loc else message, param)


def error_path(error: dict) -> list[str]:
    """Where a pydantic error is, as field names (and list indices) below the body."""
    return [str(part) for part in error.get("loc", ()) if part != "body"]


def is_union_member(part: str) -> bool:
    """Whether a part of pydantic's error location below the field names a member of a union
    (`list[int]`); the field's own name may hold brackets (`timestamp_granularities[]`)."""
    return "[" in part or part in ("str", "int", "float", "bool")


def union_members(errors: list[dict], field: str) -> list[str]:
    """The types the union `field` takes, as its errors name them (one error per type; an
    object member by its model's name)."""
    members: list[str] = []
    for error in errors:
        path = error_path(error)
        tags = [part for part in path[1:] if is_union_member(part)] or path[1:2]
        if path[:1] == [field] and tags and tags[0] not in members:
            members.append(tags[0])
    return members


def object_member_error(errors: list[dict]) -> Optional[dict]:
    """Where the first failed field is a union whose value was an object of its object member's
    shape (`chunking_strategy[type]=server_vad`): that member's first error, located at the
    member's field below the union field (`chunking_strategy.threshold`)."""
    field = error_path(errors[0])[:1]
    for error in errors:
        path = error_path(error)
        if len(path) > 2 and path[:1] == field and not is_union_member(path[1]) and not path[1].isdigit():
            return {**error, "loc": (*field, *path[2:])}
    return None


def add_error_handlers(app: FastAPI) -> None:
    """Every error leaves the server in OpenAI's shape."""

    @app.exception_handler(OpenAIError)
    async def on_openai_error(request: Request, err: OpenAIError) -> JSONResponse:
        return err.response()

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, err: RequestValidationError) -> JSONResponse:
        return validation_error(err).response()

    @app.exception_handler(HTTPException)
    async def on_http_error(request: Request, err: HTTPException) -> JSONResponse:
        headers = err.headers
        if err.status_code == 405:  # the methods of every route at the path, not the first one's
            headers = {**(headers or {}), "Allow": ", ".join(allowed_methods(request))}
        return OpenAIError(err.status_code, routing_message(request, err), headers=headers).response()

    @app.exception_handler(EngineOverloaded)
    async def on_overloaded(request: Request, err: EngineOverloaded) -> JSONResponse:
        return OpenAIError(429, str(err), code="engine_overloaded",
                           headers={"Retry-After": str(RETRY_AFTER_SECONDS)}).response()

    @app.exception_handler(EngineDeadError)
    async def on_engine_dead(request: Request, err: EngineDeadError) -> JSONResponse:
        logger.error("request %s: %s", request.state.request_id, err)
        return OpenAIError(500, str(err), code="engine_dead").response()

    @app.exception_handler(ClientDisconnected)
    @app.exception_handler(ClientDisconnect)  # starlette's, while an upload is read
    async def on_client_gone(request: Request, err: Exception) -> Response:
        logger.info("request %s: the client disconnected; its work was aborted", request.state.request_id)
        return Response(status_code=CLIENT_CLOSED_REQUEST)


MAX_PATH_SHOWN = 200  # characters of a request's path an error repeats


def allowed_methods(request: Request) -> list[str]:
    """The methods the app's routes at the request's path take."""
    return sorted({method for route in request.app.routes if route.matches(request.scope)[0] != Match.NONE
                   for method in getattr(route, "methods", None) or ()})


def routing_message(request: Request, err: HTTPException) -> str:
    """The router's "Not Found" and "Method Not Allowed" in words: the path asked for, and
    the routes the server has (or the methods it takes there); any other detail as it is."""
    where = f"{request.method} {request.url.path[:MAX_PATH_SHOWN]}"
    if err.status_code == 404 and err.detail == "Not Found":
        paths = sorted({route.path_format for route in request.app.routes if isinstance(route, APIRoute)})
        return f"{where}: no such route; this server serves {', '.join(paths)}"
    if err.status_code == 405 and err.detail == "Method Not Allowed":
        return f"{where}: the method is not allowed there; use {', '.join(allowed_methods(request))}"
    return str(err.detail)
