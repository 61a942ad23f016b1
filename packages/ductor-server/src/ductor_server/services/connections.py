"""Connections: a tenant's configured instances of providers (create, list, get, update,
delete, test), the providers' catalogue, re-encryption under the newest key, and the
publish-time check of ACTION steps that name a connection.

The API never sees a secret: views carry a mask per secret field and when the
secrets last changed. `config` and `secrets` are checked against the provider's
`settings` and `secrets` Structs, every problem with a JSON pointer into the
request body. No SQL here (`connections.store`), no transport types.
"""

from __future__ import annotations

import secrets as random
from collections.abc import Mapping
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

import msgspec

from ductor_core.validation import SLUG_PATTERN, Problem
from ductor_server.connections.calls import ConnectionCalls, open_record, unseal
from ductor_server.connections.errors import (
    ConnectionConflict,
    ConnectionInvalid,
    ConnectionNotFound,
    SecretsUnconfigured,
    SecretsUndecryptable,
)
from ductor_server.connections.secret_keys import (
    KeyNotInRing,
    Sealed,
    SecretKeys,
    Tampered,
)
from ductor_server.connections.shapes import (
    MASK,
    mask_of,
    pointer,
    problems_of,
    secret_strings,
)
from ductor_server.connections.store import ConnectionRecord, ConnectionsTx
from ductor_server.engine.clock import Clock, SystemClock
from ductor_server.engine.notify import EMAIL_PROVIDER
from ductor_server.providers.base import CheckResult, ProviderRegistry, Redactor
from ductor_server.services.action_steps import action_steps
from ductor_server.services.idempotency import Answer, Claim, Outcome, once
from ductor_server.storage.protocol import Store, Tx

MAX_CONNECTIONS = 1000
"""The most connections one tenant may have."""

MAX_CONFIG_BYTES = 64 * 1024
"""The largest `config` (as JSON) a connection may have."""

MAX_SECRETS_BYTES = 16 * 1024
"""The largest `secrets` object (as JSON) a connection may have."""

MAX_DESCRIPTION = 1000
"""The longest description, in characters."""

MAX_SECRET_VALUES = 32
"""The most distinct string values a connection's `secrets` may hold: each one is
looked for, and masked, in every output and error of its calls."""

_NOTIFY = "STEP_TYPE_NOTIFY"

# --- bodies and views -----------------------------------------------------------------


class ConnectionBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/connections`: a new connection.

    Attributes:
        name: lowercase letters, digits and '-', starting with a letter or digit,
            at most 63 long; unique within the tenant.
        provider: a provider `GET /v1/providers` lists.
        description: for people (at most 1000 characters).
        config: the provider's settings (not secret; returned as given).
        secrets: the provider's secrets (stored encrypted, never returned).
    """

    # Not bounded here: a name or provider that is too long or unknown is a
    # `connection.invalid` problem at its pointer, as every other bad value is.
    name: str
    provider: str
    description: str = ""
    config: dict[str, Any] = {}
    secrets: dict[str, Any] = {}


class ConnectionPatch(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`PATCH /v1/connections/{name}`: what to change.

    Attributes:
        description: the new description.
        config: the new settings, replacing the old ones whole.
        secrets: secret fields to change, one by one: a field given replaces that
            field, a field given as null removes it, fields left out keep their value.
    """

    description: str | None = None
    config: dict[str, Any] | None = None
    secrets: dict[str, Any] | None = None


class ConnectionCheck(msgspec.Struct, frozen=True, kw_only=True):
    """`POST /v1/connections/validate`: every problem (`{pointer, message}`) a create
    of the body would find before it looks at the store."""

    valid: bool
    problems: list[dict[str, str]]


class ConnectionView(msgspec.Struct, frozen=True, kw_only=True):
    """A connection as the API shows it: never a secret, only a mask per secret field."""

    id: str
    name: str
    provider: str
    description: str
    config: dict[str, Any]
    secrets: dict[str, str]
    secrets_updated_at: datetime | None
    created_at: datetime
    updated_at: datetime


class OperationView(msgspec.Struct, frozen=True, kw_only=True):
    """One operation of a provider, with its input and output JSON schemas."""

    name: str
    description: str
    input: dict[str, Any]
    output: dict[str, Any]
    required: list[str]


class ProviderView(msgspec.Struct, frozen=True, kw_only=True):
    """A provider: its settings and secrets schemas and its operations."""

    name: str
    description: str
    origin: str
    settings: dict[str, Any]
    secrets: dict[str, Any]
    operations: list[OperationView]


class RotateReport(msgspec.Struct, frozen=True, kw_only=True):
    """What `rotate` did: connections re-encrypted, already under the newest key,
    and those it could not decrypt (by tenant and name)."""

    key_id: str
    rotated: int
    current: int
    failed: list[dict[str, str]]


def _view(record: ConnectionRecord) -> ConnectionView:
    return ConnectionView(
        id=record.id,
        name=record.name,
        provider=record.provider,
        description=record.description,
        config=record.config,
        secrets=record.secrets_mask,
        secrets_updated_at=record.secrets_updated_at,
        created_at=record.created_at,
        updated_at=record.updated_at,
    )


def _schema(tp: Any) -> dict[str, Any]:
    (schema,), components = msgspec.json.schema_components([tp])
    if components:
        schema = {**schema, "$defs": components}
    return _inlined(dict(schema))


def _inlined(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` with a top-level `$ref` into its own `$defs` replaced by what it names
    (so `properties` and `required` are at the top, as readers expect)."""
    ref, defs = schema.get("$ref"), schema.get("$defs")
    prefix = "#/$defs/"
    if isinstance(ref, str) and ref.startswith(prefix) and isinstance(defs, dict):
        target = defs.get(ref[len(prefix) :])
        if isinstance(target, dict):
            rest = {k: v for k, v in schema.items() if k not in ("$ref", "$defs")}
            return {**target, **rest, "$defs": defs}
    return schema


def _destinations(config: Any, pointer: str = "/config") -> dict[tuple[str, str, str], str]:
    """Where a connection's `config` sends its requests, each with the pointer that
    says so: the scheme, host and port of every absolute URL among its strings,
    and each object's `host` with its `port`, at any depth."""
    found: dict[tuple[str, str, str], str] = {}
    if isinstance(config, dict):
        host = config.get("host")
        if isinstance(host, str):
            origin = ("host", host.strip().lower().rstrip("."), str(config.get("port")))
            found[origin] = f"{pointer}/host"
        for key, value in config.items():
            escaped = str(key).replace("~", "~0").replace("/", "~1")
            found.update(_destinations(value, f"{pointer}/{escaped}"))
    elif isinstance(config, list):
        for i, value in enumerate(config):
            found.update(_destinations(value, f"{pointer}/{i}"))
    elif isinstance(config, str) and "://" in config:
        try:
            parts = urlsplit(config.strip())
            origin = (parts.scheme.lower(), (parts.hostname or "").rstrip("."), str(parts.port))
        except ValueError:
            origin = ("", config, "")
        found[origin] = pointer
    return found


def _refuse_moved_secrets(
    old: Any, new: Any, held: Mapping[str, Any], patch: ConnectionPatch
) -> None:
    """Refuse a `patch` whose config sends the connection's stored secrets to an
    address its config did not name before, unless it gives every secret field
    again (a value, or null to drop it): else a key that may write the
    connection, knowing none of its secrets, could have them sent to a host of
    its own.

    Raises:
        ConnectionInvalid: a new address, and a stored secret not given again.
    """
    before = _destinations(old)
    moved = [at for origin, at in _destinations(new).items() if origin not in before]
    given = set(patch.secrets or {})
    kept = sorted(field for field in held if field not in given)
    if not moved or not kept:
        return
    raise ConnectionInvalid(
        [
            _problem(
                at,
                "this sends the connection's secrets to an address it did not use before:"
                f" give every secret again in the same request ({', '.join(kept)} not"
                " given; null drops one)",
            )
            for at in moved
        ]
    )


def _problem(at: str, message: str) -> dict[str, str]:
    return {"pointer": at, "message": message}


def _size(value: Any) -> int:
    return len(msgspec.json.encode(value))


# --- the service -----------------------------------------------------------------------


class ConnectionsService:
    """Every tenant's connections; every call takes the tenant.

    Args:
        store: the opened store.
        providers: the providers of this process.
        keys: the server's secret keys (None: connections with secrets are refused,
            `secrets.unconfigured`).
        calls: how connections are tested (the same one the step handler is).
        clock: when things happen.
    """

    def __init__(
        self,
        store: Store,
        providers: ProviderRegistry,
        keys: SecretKeys | None,
        calls: ConnectionCalls,
        *,
        clock: Clock | None = None,
    ) -> None:
        self._store = store
        self._providers = providers
        self._keys = keys
        self._calls = calls
        self._clock = clock or SystemClock()

    @property
    def providers(self) -> ProviderRegistry:
        """The providers connections may use."""
        return self._providers

    # --- providers ----------------------------------------------------------------

    def list_providers(self) -> list[ProviderView]:
        """Every provider, by name, with its schemas and operations."""
        return [
            ProviderView(
                name=p.name,
                description=p.description,
                origin=self._providers.origin(p.name),
                settings=_schema(p.settings),
                secrets=_schema(p.secrets),
                operations=[
                    OperationView(
                        name=op.name,
                        description=op.description,
                        input=_inlined(op.input_schema()),
                        output=_inlined(op.output_schema()),
                        required=sorted(op.required_inputs()),
                    )
                    for op in sorted(p.operations.values(), key=lambda o: o.name)
                ],
            )
            for p in self._providers
        ]

    # --- checking ------------------------------------------------------------------

    def _check(
        self,
        *,
        name: str | None,
        provider_name: str,
        description: str | None,
        config: Any,
        secrets: Mapping[str, Any] | None,
    ) -> None:
        problems: list[dict[str, str]] = []
        if name is not None and not SLUG_PATTERN.fullmatch(name):
            problems.append(
                _problem(
                    "/name",
                    "a connection name is lowercase letters, digits and '-', starting with"
                    " a letter or digit, at most 63 long",
                )
            )
        if description is not None and len(description) > MAX_DESCRIPTION:
            problems.append(_problem("/description", f"at most {MAX_DESCRIPTION} characters"))
        provider = self._providers.get(provider_name)
        if provider is None:
            known = ", ".join(p.name for p in self._providers) or "none"
            problems.append(
                _problem("/provider", f"unknown provider {provider_name[:64]!r} (known: {known})")
            )
        if config is not None and _size(config) > MAX_CONFIG_BYTES:
            problems.append(_problem("/config", f"config is over {MAX_CONFIG_BYTES} bytes"))
        elif config is not None and provider is not None:
            problems += problems_of(config, provider.settings, "/config")
        values = None if secrets is None else secret_strings(secrets)
        if secrets is not None and _size(secrets) > MAX_SECRETS_BYTES:
            problems.append(_problem("/secrets", f"secrets are over {MAX_SECRETS_BYTES} bytes"))
        elif values is not None and len(values) > MAX_SECRET_VALUES:
            problems.append(
                _problem(
                    "/secrets", f"secrets may hold at most {MAX_SECRET_VALUES} distinct values"
                )
            )
        elif secrets is not None and values is not None and provider is not None:
            # A problem's message may quote a value: never a secret one.
            redactor = Redactor(values, mask=MASK)
            problems += [
                _problem(found["pointer"], redactor.text(found["message"]))
                for found in problems_of(secrets, provider.secrets, "/secrets")
            ]
        if problems:
            raise ConnectionInvalid(problems)

    def check(self, body: ConnectionBody) -> list[dict[str, str]]:
        """Every problem `create` would find in `body` before it looks at the store
        (pointers into the body); the secrets are checked only when some are given,
        so a body may leave the ones already stored out."""
        secrets = {k: v for k, v in body.secrets.items() if v is not None}
        try:
            self._check(
                name=body.name,
                provider_name=body.provider,
                description=body.description,
                config=body.config,
                secrets=secrets or None,
            )
        except ConnectionInvalid as exc:
            return list(exc.details) if isinstance(exc.details, list) else []
        return []

    def _seal(
        self, tenant_id: str, connection_id: str, secrets: Mapping[str, Any]
    ) -> Sealed | None:
        if not secrets:
            return None
        if self._keys is None:
            raise SecretsUnconfigured()
        return self._keys.seal(
            msgspec.json.encode(dict(secrets)), tenant_id=tenant_id, connection_id=connection_id
        )

    # --- create, read, update, delete ------------------------------------------------

    async def create(
        self, tenant_id: str, body: ConnectionBody, *, idempotency_key: str | None = None
    ) -> Answer[ConnectionView]:
        """Create a connection (`CREATED`).

        Raises:
            ConnectionInvalid: a bad name, provider, config or secrets (every problem).
            SecretsUnconfigured: it has secrets and the server has no key.
            ConnectionConflict: the tenant has a connection of that name.
            IdempotencyConflict: the key was used with another request.
        """
        secrets = {k: v for k, v in body.secrets.items() if v is not None}
        self._check(
            name=body.name,
            provider_name=body.provider,
            description=body.description,
            config=body.config,
            secrets=secrets,
        )
        if secrets and self._keys is None:
            raise SecretsUnconfigured()
        now = self._clock.now()
        claim = Claim.of(tenant_id, "connections.create", idempotency_key, body, now=now)

        async def effect(tx: Tx) -> Answer[ConnectionView]:
            store = ConnectionsTx(tx)
            await tx.session.advisory_lock(f"connections:{tenant_id}")
            if await store.get(tenant_id, body.name) is not None:
                raise ConnectionConflict(body.name)
            if await store.count(tenant_id) >= MAX_CONNECTIONS:
                raise ConnectionInvalid(
                    [_problem("", f"a tenant may have at most {MAX_CONNECTIONS} connections")]
                )
            connection_id = "con_" + random.token_hex(12)
            sealed = self._seal(tenant_id, connection_id, secrets)
            record = ConnectionRecord(
                tenant_id=tenant_id,
                id=connection_id,
                name=body.name,
                provider=body.provider,
                description=body.description,
                config=body.config,
                secrets_ciphertext=None if sealed is None else sealed.ciphertext,
                secrets_key_id=None if sealed is None else sealed.kid,
                secrets_mask=mask_of(secrets),
                secrets_updated_at=None if sealed is None else now,
                created_at=now,
                updated_at=now,
            )
            if not await store.insert(record):
                raise ConnectionConflict(body.name)
            return Answer(_view(record), Outcome.CREATED)

        return await once(self._store, claim, ConnectionView, effect)

    async def list_connections(self, tenant_id: str) -> list[ConnectionView]:
        """Every connection of the tenant, by name."""
        async with self._store.transaction() as tx:
            records = await ConnectionsTx(tx).all(tenant_id)
        return [_view(r) for r in records]

    async def get(self, tenant_id: str, name: str) -> ConnectionView:
        """One connection.

        Raises:
            ConnectionNotFound: the tenant has none of that name.
        """
        async with self._store.transaction() as tx:
            record = await ConnectionsTx(tx).get(tenant_id, name)
        if record is None:
            raise ConnectionNotFound(name)
        return _view(record)

    async def update(
        self,
        tenant_id: str,
        name: str,
        patch: ConnectionPatch,
        *,
        idempotency_key: str | None = None,
    ) -> Answer[ConnectionView]:
        """Change a connection's description, config (whole) and secrets (field by field).

        Changed secrets are sealed again under the newest key.

        Raises:
            ConnectionNotFound, ConnectionInvalid, SecretsUnconfigured,
            SecretsUndecryptable, IdempotencyConflict.
        """
        now = self._clock.now()
        claim = Claim.of(
            tenant_id, "connections.update", idempotency_key, patch, now=now, target=name
        )

        async def effect(tx: Tx) -> Answer[ConnectionView]:
            store = ConnectionsTx(tx)
            record = await store.get_for_update(tenant_id, name)
            if record is None:
                raise ConnectionNotFound(name)
            config = record.config if patch.config is None else patch.config
            sealed: Sealed | None = None
            mask = record.secrets_mask
            secrets_at = record.secrets_updated_at
            secrets: dict[str, Any] | None = None
            if patch.secrets is not None:
                stored = unseal(record, self._keys)
                secrets = dict(stored)
                for key, value in patch.secrets.items():
                    if value is None:
                        secrets.pop(key, None)
                    else:
                        secrets[key] = value
            self._check(
                name=None,
                provider_name=record.provider,
                description=patch.description,
                config=patch.config,
                secrets=secrets,
            )
            if patch.config is not None and record.secrets_mask:
                _refuse_moved_secrets(record.config, patch.config, record.secrets_mask, patch)
            if secrets is not None:
                sealed = self._seal(tenant_id, record.id, secrets)
                mask = mask_of(secrets)
                if sealed is None:
                    secrets_at = None
                elif secrets != stored or secrets_at is None:
                    secrets_at = now
            updated = msgspec.structs.replace(
                record,
                description=record.description if patch.description is None else patch.description,
                config=config,
                secrets_ciphertext=(
                    record.secrets_ciphertext
                    if secrets is None
                    else (None if sealed is None else sealed.ciphertext)
                ),
                secrets_key_id=(
                    record.secrets_key_id
                    if secrets is None
                    else (None if sealed is None else sealed.kid)
                ),
                secrets_mask=mask,
                secrets_updated_at=secrets_at,
                updated_at=now,
            )
            await store.update(updated)
            return Answer(_view(updated), Outcome.OK)

        return await once(self._store, claim, ConnectionView, effect)

    async def delete(self, tenant_id: str, name: str) -> None:
        """Delete a connection; steps that name it fail `connection.not_found` from now on.

        Raises:
            ConnectionNotFound: the tenant has none of that name.
        """
        async with self._store.transaction() as tx:
            if not await ConnectionsTx(tx).delete(tenant_id, name):
                raise ConnectionNotFound(name)

    async def test(self, tenant_id: str, name: str) -> CheckResult:
        """Run the provider's test of the connection through the outbound guard.

        Raises:
            ConnectionNotFound: the tenant has none of that name.
            SecretsUnconfigured, SecretsUndecryptable: its secrets cannot be read.
        """
        async with self._store.transaction() as tx:
            record = await ConnectionsTx(tx).get(tenant_id, name)
        if record is None:
            raise ConnectionNotFound(name)
        opened = open_record(record, self._providers, self._keys)
        key = f"test:{record.id}:{random.token_hex(8)}"
        return await self._calls.test(opened, idempotency_key=key)

    # --- rotation --------------------------------------------------------------------

    async def rotate(self) -> RotateReport:
        """Seal every tenant's connection secrets under the newest key (see `rotate_secrets`).

        Raises:
            SecretsUnconfigured: the server has no keys.
        """
        if self._keys is None:
            raise SecretsUnconfigured()
        return await rotate_secrets(self._store, self._keys)

    # --- publish-time checks ---------------------------------------------------------

    async def definition_problems(self, tenant_id: str, definition: Any) -> list[Problem]:
        """The problems of the ACTION steps (and SCATTER templates) of `definition` that
        name a connection: the tenant must have it, its provider the operation, and
        `input` must hold every required field and no unknown one."""
        uses = list(_connection_uses(definition))
        emails = _email_uses(definition)
        if not uses and not emails:
            return []
        names = sorted({use[1] for use in uses} | {use[1] for use in emails})
        async with self._store.transaction() as tx:
            providers = await ConnectionsTx(tx).names(tenant_id, names)
        problems: list[Problem] = []
        for at, name in emails:
            provider_name = providers.get(name)
            if provider_name is None:
                problems.append(
                    Problem(
                        code="definition.unknown_connection",
                        message=f"the tenant has no connection named {name[:64]!r}",
                        pointer=at,
                    )
                )
            elif provider_name != EMAIL_PROVIDER:
                problems.append(
                    Problem(
                        code="definition.not_email_connection",
                        message=f"NOTIFY email needs an {EMAIL_PROVIDER!r} connection;"
                        f" {name!r} uses provider {provider_name!r}",
                        pointer=at,
                    )
                )
        for at, name, operation_name, input_keys in uses:
            provider_name = providers.get(name)
            if provider_name is None:
                problems.append(
                    Problem(
                        code="definition.unknown_connection",
                        message=f"the tenant has no connection named {name[:64]!r}",
                        pointer=at + "/connection",
                    )
                )
                continue
            provider = self._providers.get(provider_name)
            if provider is None:
                problems.append(
                    Problem(
                        code="definition.unknown_connection",
                        message=f"connection {name!r} uses provider {provider_name!r},"
                        " which this server does not have",
                        pointer=at + "/connection",
                    )
                )
                continue
            if not isinstance(operation_name, str):
                continue  # core validation reports it
            operation = provider.operations.get(operation_name)
            if operation is None:
                known = ", ".join(sorted(provider.operations)) or "none"
                problems.append(
                    Problem(
                        code="definition.unknown_operation",
                        message=f"provider {provider.name!r} has no operation"
                        f" {operation_name[:64]!r} (it has: {known})",
                        pointer=at + "/operation",
                    )
                )
                continue
            if input_keys is None:
                continue
            fields, required = operation.input_fields(), operation.required_inputs()
            for key in input_keys:
                if key not in fields:
                    problems.append(
                        Problem(
                            code="definition.bad_input",
                            message=f"{provider.name}.{operation.name} has no input"
                            f" {key[:64]!r} (it takes: {', '.join(sorted(fields)) or 'nothing'})",
                            pointer=at + "/input" + pointer(key),
                        )
                    )
            for key in sorted(required - set(input_keys)):
                problems.append(
                    Problem(
                        code="definition.bad_input",
                        message=f"{provider.name}.{operation.name} needs input {key!r}",
                        pointer=at + "/input" + pointer(key),
                    )
                )
        return problems


async def rotate_secrets(store: Store, keys: SecretKeys) -> RotateReport:
    """Seal every tenant's connection secrets under `keys`' newest key (an operator's
    command over all tenants, one short transaction per connection).

    Idempotent: connections already under it are counted as `current`. One that
    does not decrypt is reported in `failed` and left as it is; one whose secrets
    changed meanwhile was sealed under the newest key by that change.
    """
    newest = keys.newest.kid
    rotated = current = 0
    failed: list[dict[str, str]] = []
    async with store.transaction() as tx:
        tenants = await ConnectionsTx(tx).tenants_with_secrets()
    for tenant_id in tenants:
        async with store.transaction() as tx:
            rows = await ConnectionsTx(tx).sealed_rows(tenant_id)
        for row in rows:
            if row.secrets_key_id is None or row.secrets_ciphertext is None:
                continue
            if row.secrets_key_id == newest:
                current += 1
                continue
            was = Sealed(kid=row.secrets_key_id, ciphertext=row.secrets_ciphertext)
            try:
                plain = keys.open(was, tenant_id=tenant_id, connection_id=row.id)
            except (KeyNotInRing, Tampered) as exc:
                failed.append({"tenant": tenant_id, "name": row.name, "reason": str(exc)})
                continue
            sealed = keys.seal(plain, tenant_id=tenant_id, connection_id=row.id)
            async with store.transaction() as tx:
                done = await ConnectionsTx(tx).reseal(
                    tenant_id,
                    row.id,
                    was=was.ciphertext,
                    kid=sealed.kid,
                    ciphertext=sealed.ciphertext,
                )
            if done:
                rotated += 1
            else:
                current += 1
    return RotateReport(key_id=newest, rotated=rotated, current=current, failed=failed)


def _email_uses(definition: Any) -> list[tuple[str, str]]:
    """(pointer to `email.connection`, connection) of every NOTIFY step that emails."""
    found: list[tuple[str, str]] = []
    steps = definition.get("steps") if isinstance(definition, Mapping) else None
    for index, step in enumerate(steps if isinstance(steps, list) else []):
        if not isinstance(step, Mapping) or step.get("type") != _NOTIFY:
            continue
        args = step.get("args")
        email = args.get("email") if isinstance(args, Mapping) else None
        name = email.get("connection") if isinstance(email, Mapping) else None
        if isinstance(name, str) and name.strip():
            found.append((f"/steps/{index}/args/email/connection", name))
    return found


def _connection_uses(
    definition: Any,
) -> list[tuple[str, str, Any, list[str] | None]]:
    """(pointer to the args, connection, operation, input keys) of every ACTION that
    names a connection, SCATTER templates included."""
    found: list[tuple[str, str, Any, list[str] | None]] = []
    for step in action_steps(definition):
        args = step.args
        name = args.get("connection")
        if isinstance(name, str) and name.strip() and args.get("action") is None:
            raw_input = args.get("input", {})
            keys = [str(k) for k in raw_input] if isinstance(raw_input, Mapping) else None
            found.append((step.pointer + "/args", name, args.get("operation"), keys))
    return found


__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_CONNECTIONS",
    "MAX_SECRETS_BYTES",
    "MAX_SECRET_VALUES",
    "ConnectionBody",
    "ConnectionCheck",
    "ConnectionPatch",
    "ConnectionView",
    "ConnectionsService",
    "OperationView",
    "ProviderView",
    "RotateReport",
    "SecretsUndecryptable",
    "rotate_secrets",
]
