"""The endpoint's OpenAPI 3.1 document, generated from the schema's dataclasses.

The response shapes are derived from the very classes the views build, so the description cannot
drift from what is served; the test suite validates real responses against it.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any

from asyncflow._version import __version__

__all__ = ["Param", "Route", "document"]


@dataclass(frozen=True, slots=True)
class Param:
    """A query or path parameter."""

    name: str
    where: str  # "query" or "path"
    description: str
    maximum: int | None = None
    default: int | None = None


@dataclass(frozen=True, slots=True)
class Route:
    """One ``GET`` route: its path, what it returns and what it accepts."""

    path: str
    summary: str
    #: what it returns: a type, or the name of a document class of ``asyncflow.schema``,
    #: resolved when the OpenAPI document is made (the endpoint process serves its first
    #: answers without importing the schema's dataclasses, 15-20% of what it imports)
    returns: type | str
    params: tuple[Param, ...] = ()
    #: the Content-Type of its 200 answer (``str`` as ``returns`` for text that is not JSON)
    media_type: str = "application/json"


def _schema_of(tp: Any, components: dict[str, Any]) -> dict[str, Any]:
    origin = typing.get_origin(tp)
    if tp is type(None):
        return {"type": "null"}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is float:
        return {"type": "number"}
    if tp is str:
        return {"type": "string"}
    if tp is Any:
        return {}
    if origin in (types.UnionType, typing.Union):
        return {"anyOf": [_schema_of(arg, components) for arg in typing.get_args(tp)]}
    if origin is list:
        (item,) = typing.get_args(tp)
        return {"type": "array", "items": _schema_of(item, components)}
    if origin is dict:
        key, value = typing.get_args(tp)
        if key is not str:
            raise TypeError(f"JSON object keys are strings, not {key!r}")
        return {"type": "object", "additionalProperties": _schema_of(value, components)}
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        _component(tp, components)
        return {"$ref": f"#/components/schemas/{tp.__name__}"}
    raise TypeError(f"no JSON schema for {tp!r}")


def _component(cls: type, components: dict[str, Any]) -> None:
    name = cls.__name__
    if name in components:
        return
    components[name] = {}  # placeholder: a class may refer to itself
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    body: dict[str, Any] = {
        "type": "object",
        "properties": {f.name: _schema_of(hints[f.name], components) for f in fields},
        "required": [f.name for f in fields],
        "additionalProperties": False,
    }
    doc = (cls.__doc__ or "").strip()
    if doc:
        body["description"] = " ".join(doc.split())
    components[name] = body


def _parameter(p: Param) -> dict[str, Any]:
    spec: dict[str, Any] = {"type": "integer", "minimum": 0 if p.where == "query" else 1}
    if p.maximum is not None:
        spec["maximum"] = p.maximum
    if p.default is not None:
        spec["default"] = p.default
    return {
        "name": p.name,
        "in": p.where,
        "required": p.where == "path",
        "description": p.description,
        "schema": spec,
    }


def _returned(returns: type | str) -> Any:
    """What a route returns, as a type: a schema document class's name resolved."""
    from asyncflow import schema

    return getattr(schema, returns) if isinstance(returns, str) else returns


def _error(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorDocument"}}},
    }


def document(routes: typing.Sequence[Route], token: bool) -> dict[str, Any]:
    """The OpenAPI document for ``routes``; ``token`` adds the bearer-token requirement."""
    from asyncflow import schema

    components: dict[str, Any] = {}
    _component(schema.ErrorDocument, components)
    paths: dict[str, Any] = {}
    for route in routes:
        responses: dict[str, Any] = {
            "200": {
                "description": route.summary,
                "content": {
                    route.media_type.split(";")[0].strip(): {
                        "schema": _schema_of(_returned(route.returns), components)
                    }
                },
            },
            "400": _error(
                "A parameter is unknown, given twice, not a whole number in ASCII digits, or "
                "out of range; or the Host header is missing or malformed."
            ),
            "403": _error(
                "A web page of another origin sent the request (Origin, Sec-Fetch-Site)."
            ),
            "404": _error(
                "No trace is recorded: the profiler was started without trace=."
                if route.path == "/trace"
                else "No such route, or no object with that id."
            ),
            "405": _error("A method other than GET or HEAD; the Allow header lists them."),
            "421": _error("The Host header does not name this endpoint (DNS rebinding)."),
            "503": _error("The endpoint holds as many connections as it allows; retry."),
        }
        public = route.path == "/"  # the web page holds no data: it asks for the token itself
        if token and not public:
            responses["401"] = _error("The bearer token is missing or wrong.")
        operation: dict[str, Any] = {
            "summary": route.summary,
            "operationId": route.path.strip("/").replace("/", "_").replace("{", "").replace("}", "")
            or "root",
            "responses": responses,
        }
        if token and public:
            operation["security"] = []
        if route.params:
            operation["parameters"] = [_parameter(p) for p in route.params]
        paths[route.path] = {"get": operation}
    spec: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "asyncflow",
            "version": __version__,
            "description": (
                f"Live data-flow profile of an asyncio program (schema {schema.SCHEMA}). "
                "Durations and timestamps are integers in nanoseconds; timestamps count from "
                "the profiler's start."
            ),
        },
        "paths": paths,
        "components": {"schemas": dict(sorted(components.items()))},
    }
    if token:
        spec["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        spec["security"] = [{"bearer": []}]
    return spec
