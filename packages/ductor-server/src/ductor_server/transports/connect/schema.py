"""The `.proto` files of the Connect services, written from the method table.

Each service is one file (`proto/ductor/v1/<service>.proto`); every message that
two or more places use is in `types.proto`. A method's request message has the
fields of its request struct; its response message has the fields of the
struct the service answers (a list answer is `repeated ... items`, no answer is
empty). The JSON names are the server's own: snake_case, given as `json_name`
where proto3's default (lowerCamelCase) would differ, so the JSON a generated
client writes and reads is exactly the server's.

How a msgspec type becomes a proto type:

    str, datetime, date, UUID, Decimal, str enum or Literal   string
    int (64-bit; 32-bit when its bounds fit)                   int64 / int32
    float / bool / bytes                                       double / bool / bytes
    X | None                                                   optional X
    list[X], tuple[X, ...], set[X]                             repeated X
    dict[str, Any]                                             google.protobuf.Struct
    dict[str, X]                                               map<string, X>
    a struct, dataclass or TypedDict                           a message of its name
    Annotated[X, Meta(description=...)]                        X
    Any, other unions, nested lists or maps                    google.protobuf.Value

The server speaks JSON only, so field numbers follow the struct's field order and
are not promised stable for the binary encoding. `python -m
ductor_server.transports.connect.schema DIR` writes the files; a test checks that
the committed files are these.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from msgspec import inspect as mi

from ductor_server.transports.connect.method import PACKAGE, Method

VALUE = "google.protobuf.Value"
STRUCT = "google.protobuf.Struct"
STRUCT_IMPORT = "google/protobuf/struct.proto"
TYPES_FILE = "types.proto"
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
_STRINGS = (
    mi.StrType,
    mi.DateTimeType,
    mi.DateType,
    mi.TimeType,
    mi.UUIDType,
    mi.DecimalType,
    mi.TimeDeltaType,
)
_NOT_SNAKE = re.compile(r"[^a-z0-9_]")


@dataclass
class _Field:
    name: str
    json: str
    type: str
    label: str = ""  # "", "optional" or "repeated"


@dataclass
class _Message:
    name: str
    doc: str
    fields: list[_Field] = field(default_factory=list)


class SchemaError(Exception):
    """The method table cannot be written as proto (a name clash, a bad field name)."""


_SCALAR = re.compile(r"string|bool|bytes|double|int32|int64")


def _presence(required: bool, default: Any) -> bool:
    # A field whose default is not proto3's zero value is `optional`, so a client
    # that sets it to the zero value (0, "", false) sends it, and one that leaves it
    # unset gets the server's default.
    if required or default is None or not isinstance(default, bool | int | float | str | bytes):
        return False
    return bool(default)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _doc(obj: Any) -> str:
    text = (getattr(obj, "__doc__", None) or "").strip()
    return text.split("\n\n", 1)[0].replace("\n", " ").strip() if text else ""


class _Builder:
    def __init__(self) -> None:
        self.shared: dict[str, _Message] = {}
        self.classes: dict[str, type[Any]] = {}

    def fields_of(self, info: mi.Type) -> list[_Field]:
        """The fields of a struct-like type, its tag first."""
        if isinstance(info, mi.StructType):
            fields: list[_Field] = []
            if info.tag_field is not None:
                fields.append(_Field(info.tag_field, info.tag_field, "string"))
            fields.extend(
                self._field(f.encode_name, f.type, _presence(f.required, f.default))
                for f in info.fields
            )
            return fields
        if isinstance(info, mi.DataclassType | mi.TypedDictType):
            return [self._field(f.encode_name, f.type) for f in info.fields]
        raise SchemaError(f"{info!r} is not a struct")

    def _field(self, wire: str, info: mi.Type, presence: bool = False) -> _Field:
        # A camelCase JSON name (a DSSE envelope's `payloadType`) is proto3's default
        # JSON name of the snake_case field.
        name = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", wire).lower()
        if _NOT_SNAKE.search(name) or not name[:1].isalpha():
            raise SchemaError(f"field {wire!r} has no lower_snake_case name")
        label, type_name = self.type_of(info)
        if presence and not label and _SCALAR.fullmatch(type_name):
            label = "optional"
        return _Field(name, wire, type_name, label)

    def type_of(self, info: mi.Type) -> tuple[str, str]:
        """(label, proto type) of a field of type `info`."""
        if isinstance(info, mi.Metadata):
            # A description or JSON-schema extra only (constraints are kept on the
            # type itself): the type it annotates.
            return self.type_of(info.type)
        if isinstance(info, mi.UnionType):
            inner = [t for t in info.types if not isinstance(t, mi.NoneType)]
            if len(inner) == 1 and len(inner) < len(info.types):
                label, name = self.type_of(inner[0])
                if label:
                    return "", VALUE
                return ("" if self._is_message(name) else "optional"), name
            return "", VALUE
        if isinstance(info, mi.ListType | mi.VarTupleType | mi.SetType | mi.FrozenSetType):
            label, name = self.type_of(info.item_type)
            return ("repeated", VALUE if label or name.startswith("map<") else name)
        if isinstance(info, mi.DictType):
            if isinstance(info.value_type, mi.AnyType) and isinstance(info.key_type, mi.StrType):
                return "", STRUCT
            label, value = self.type_of(info.value_type)
            if label or value.startswith("map<"):
                value = VALUE
            key = self.type_of(info.key_type)[1]
            if key not in ("string", "int64", "int32", "bool"):
                return "", VALUE
            return "", f"map<{key}, {value}>"
        return "", self._scalar_or_message(info)

    def _scalar_or_message(self, info: mi.Type) -> str:
        if isinstance(info, _STRINGS):
            return "string"
        if isinstance(info, mi.BoolType):
            return "bool"
        if isinstance(info, mi.IntType):
            low, high = info.ge, info.le
            if low is not None and high is not None and low >= INT32_MIN and high <= INT32_MAX:
                return "int32"
            return "int64"
        if isinstance(info, mi.FloatType):
            return "double"
        if isinstance(info, mi.BytesType | mi.ByteArrayType | mi.MemoryViewType):
            return "bytes"
        if isinstance(info, mi.EnumType | mi.LiteralType):
            values = (
                [member.value for member in info.cls]
                if isinstance(info, mi.EnumType)
                else list(info.values)
            )
            return "string" if all(isinstance(v, str) for v in values) else "int64"
        if isinstance(info, mi.StructType | mi.DataclassType | mi.TypedDictType):
            return self.message(info)
        return VALUE

    def _is_message(self, name: str) -> bool:
        return name in self.shared or name in (VALUE, STRUCT)

    def message(self, info: mi.StructType | mi.DataclassType | mi.TypedDictType) -> str:
        """The shared message of a struct-like type (made once). A second type of the
        same name is named after its package too (`ductor_routing`'s `Problem`:
        `RoutingProblem`)."""
        cls = info.cls
        for name in (cls.__name__, _qualified(cls)):
            known = self.classes.get(name)
            if known is cls:
                return name
            if known is None:
                break
        else:
            raise SchemaError(f"two types are named {cls.__name__}: {cls!r}")
        self.classes[name] = cls
        message = _Message(name, _doc(cls))
        self.shared[name] = message
        message.fields = self.fields_of(info)
        return name


def _qualified(cls: type[Any]) -> str:
    module = cls.__module__.split(".")
    part = module[0].removeprefix("ductor_") if module[0] != "ductor_server" else module[-1]
    return part.title().replace("_", "") + cls.__name__


def _response_fields(builder: _Builder, spec: Method) -> list[_Field]:
    if spec.response is None:
        return []
    if spec.listed:
        label, name = builder.type_of(mi.type_info(spec.response))
        return [_Field("items", "items", name, label)]
    return builder.fields_of(mi.type_info(spec.response))


def _file_name(service: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", service).lower() + ".proto"


def _render_message(message: _Message) -> list[str]:
    lines = [f"// {message.doc}"] if message.doc else []
    lines.append(f"message {message.name} {{")
    for number, item in enumerate(message.fields, start=1):
        label = f"{item.label} " if item.label else ""
        json_name = f' [json_name = "{item.json}"]' if _camel(item.name) != item.json else ""
        lines.append(f"  {label}{item.type} {item.name} = {number}{json_name};")
    lines.append("}")
    return lines


def _header(imports: set[str]) -> list[str]:
    lines = [
        "// Written by ductor_server.transports.connect.schema from the method table:",
        "// do not edit by hand.",
        'syntax = "proto3";',
        "",
        f"package {PACKAGE};",
        "",
    ]
    lines += [f'import "{name}";' for name in sorted(imports)]
    return [*lines, ""] if imports else lines


def _imports(messages: list[_Message], shared: dict[str, _Message], here: str) -> set[str]:
    imports: set[str] = set()
    for message in messages:
        for item in message.fields:
            for word in re.findall(r"[A-Za-z_][A-Za-z0-9_.]*", item.type):
                if word in (VALUE, STRUCT):
                    imports.add(STRUCT_IMPORT)
                elif word in shared and here != TYPES_FILE:
                    imports.add(f"ductor/v1/{TYPES_FILE}")
    return imports


def proto_files(methods: tuple[Method, ...]) -> dict[str, str]:
    """Every `.proto` file of `methods`, by its name under `proto/ductor/v1/`.

    Raises:
        SchemaError: a name clash or a field that cannot be named in proto.
    """
    builder = _Builder()
    by_service: dict[str, list[Method]] = {}
    for spec in methods:
        by_service.setdefault(spec.service, []).append(spec)
    files: dict[str, str] = {}
    own: dict[str, list[_Message]] = {}
    for service, specs in by_service.items():
        messages: list[_Message] = []
        for spec in specs:
            request = _Message(f"{spec.name}Request", _doc(spec.request))
            request.fields = builder.fields_of(mi.type_info(spec.request))
            response = _Message(f"{spec.name}Response", f"The answer of {spec.name}.")
            response.fields = _response_fields(builder, spec)
            messages += [request, response]
        own[service] = messages
    top = {m.name for messages in own.values() for m in messages}
    clash = top & builder.shared.keys()
    if clash:
        raise SchemaError(f"request or response names taken by shared types: {sorted(clash)}")
    for service, specs in by_service.items():
        body: list[str] = [f"service {service} {{"]
        for spec in specs:
            if spec.doc:
                body.append(f"  // {spec.doc} ({spec.rest})")
            rpc = f"  rpc {spec.name}({spec.name}Request) returns ({spec.name}Response)"
            if spec.read_only:
                body += [f"{rpc} {{", "    option idempotency_level = NO_SIDE_EFFECTS;", "  }"]
            else:
                body.append(f"{rpc};")
        body.append("}")
        for message in own[service]:
            body += ["", *_render_message(message)]
        imports = _imports(own[service], builder.shared, "")
        files[_file_name(service)] = "\n".join([*_header(imports), *body, ""])
    shared = sorted(builder.shared.values(), key=lambda m: m.name)
    body = []
    for message in shared:
        body += [*_render_message(message), ""]
    files[TYPES_FILE] = "\n".join([*_header(_imports(shared, builder.shared, TYPES_FILE)), *body])
    return files


def write(directory: Path, methods: tuple[Method, ...]) -> list[Path]:
    """Write `proto_files(methods)` into `directory` (removing stale `.proto` files)."""
    files = proto_files(methods)
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.proto"):
        if stale.name not in files:
            stale.unlink()
    written = []
    for name, text in files.items():
        path = directory / name
        path.write_text(text)
        written.append(path)
    return written


def main(argv: list[str]) -> int:
    """`python -m ductor_server.transports.connect.schema [DIR]` (default proto/ductor/v1)."""
    from ductor_server.transports.connect import METHODS

    directory = Path(argv[0] if argv else "proto/ductor/v1")
    for path in write(directory, METHODS):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


__all__ = ["SchemaError", "main", "proto_files", "write"]
