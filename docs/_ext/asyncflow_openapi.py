"""The ``asyncflow-openapi`` directive: the endpoint's routes and documents, field by field.

It renders the OpenAPI document the endpoint serves at ``GET /openapi.json``, which is generated
from the very dataclasses the documents are built from: the reference cannot drift from what
is served. Each document's fields become a table with their types, linked to one another.
"""

from __future__ import annotations

from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective


def openapi_document() -> dict[str, Any]:
    """The OpenAPI document of an endpoint without a token, as ``GET /openapi.json`` gives it."""
    from asyncflow.serve import openapi, server

    return openapi.document(server.ROUTES, False)


def _label(name: str) -> str:
    return f"openapi-{name.lower()}"


def _type(schema: dict[str, Any]) -> str:
    """A JSON schema in words, each document's name linked to its table."""
    if "$ref" in schema:
        name = schema["$ref"].rpartition("/")[2]
        return f"{{ref}}`{name} <{_label(name)}>`"
    if "anyOf" in schema:
        return " or ".join(_type(s) for s in schema["anyOf"])
    kind = schema.get("type")
    if kind == "array":
        return f"list of {_type(schema.get('items', {}))}"
    if kind == "object" and "additionalProperties" in schema:
        return f"map of {_type(schema['additionalProperties'])}"
    if isinstance(kind, str):
        return kind
    return "any"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(document: dict[str, Any]) -> str:
    """The reference as MyST markdown: the routes, then every document's fields."""
    lines = [
        "| route | answers | parameters |",
        "| --- | --- | --- |",
    ]
    for path, item in document["paths"].items():
        get = item["get"]
        ok = get["responses"]["200"]
        (media, content), *_ = ok["content"].items()
        answer = _type(content["schema"]) if media == "application/json" else f"`{media}`"
        params = []
        for p in get.get("parameters", []):
            bounds = p["schema"]
            limits = (
                f"{bounds.get('minimum', 0)} to {bounds['maximum']:,}"
                if "maximum" in bounds
                else ""
            )
            default = f", {bounds['default']:,} by default" if "default" in bounds else ""
            params.append(f"`{p['name']}` ({p['in']}{': ' + limits if limits else ''}{default})")
        lines.append(
            f"| `GET {path}`: {_cell(get['summary'])} | {answer} | {'; '.join(params) or '-'} |"
        )
    errors = document["paths"]["/futures"]["get"]["responses"]
    lines += [
        "",
        "Every route answers errors as an {ref}`ErrorDocument <openapi-errordocument>`:",
        "",
    ]
    for status, response in errors.items():
        if status != "200":
            lines.append(f"- **{status}**: {_cell(response['description'])}")
    for name, schema in sorted(document["components"]["schemas"].items()):
        required = set(schema.get("required", ()))
        lines += ["", f"({_label(name)})=", f"**{name}**", "", "| field | type |", "| --- | --- |"]
        for field, spec in schema.get("properties", {}).items():
            optional = "" if field in required else " (may be absent)"
            lines.append(f"| `{field}` | {_type(spec)}{optional} |")
    return "\n".join(lines) + "\n"


class OpenApiReference(SphinxDirective):
    """``{asyncflow-openapi}``: the generated reference, parsed as markdown in place."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        container = nodes.container()
        text = markdown(openapi_document())
        self.state.nested_parse(StringList(text.splitlines(), source="openapi.json"), 0, container)
        children: list[nodes.Node] = container.children
        return children


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("asyncflow-openapi", OpenApiReference)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
