"""A stand-in for Stripe's API on 127.0.0.1, for the wallet tests: a real HTTP server
that opens PaymentIntents (form-encoded, keyed by `Idempotency-Key` as Stripe's
are), refuses chosen amounts as a declined card, and signs webhook events the
way Stripe documents (`Stripe-Signature: t=<unix>,v1=<HMAC-SHA256 of "t.payload">`)."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

API_KEY = "sk_test_ductor_fake"
WEBHOOK_SECRET = "whsec_ductor_fake_secret"


def stripe_signature(payload: bytes, secret: str, *, timestamp: int | None = None) -> str:
    """The `Stripe-Signature` header Stripe would send with `payload`."""
    t = int(time.time()) if timestamp is None else timestamp
    mac = hmac.new(secret.encode(), f"{t}.".encode() + payload, hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


class FakeStripe:
    """The PaymentIntents endpoint and webhook events of a Stripe account."""

    def __init__(self) -> None:
        self.intents: dict[str, dict[str, Any]] = {}
        self.creates = 0
        self.decline_amounts: set[int] = set()
        self.broken_amounts: set[int] = set()
        self.broken_calls = 0
        self._by_key: dict[str, tuple[str, dict[str, str]]] = {}
        self._lock = threading.Lock()
        self._seq = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                form = dict(urllib.parse.parse_qsl(self.rfile.read(length).decode()))
                status, body = fake._post(self.path, dict(self.headers), form)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Request-Id", f"req_{fake._seq}")
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> FakeStripe:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _post(
        self, path: str, headers: dict[str, str], form: dict[str, str]
    ) -> tuple[int, dict[str, Any]]:
        lowered = {k.lower(): v for k, v in headers.items()}
        if lowered.get("authorization") != f"Bearer {API_KEY}":
            return 401, {"error": {"type": "invalid_request_error", "message": "bad key"}}
        if path != "/v1/payment_intents":
            return 404, {"error": {"type": "invalid_request_error", "message": path}}
        key = lowered.get("idempotency-key", "")
        with self._lock:
            if key and key in self._by_key:
                intent_id, first = self._by_key[key]
                if first != form:
                    return 400, {
                        "error": {"type": "idempotency_error", "message": "other parameters"}
                    }
                return 200, self.intents[intent_id]
            amount = int(form["amount"])
            if amount in self.broken_amounts:
                self.broken_calls += 1
                return 500, {"error": {"type": "api_error", "message": "try again"}}
            if amount in self.decline_amounts:
                return 402, {
                    "error": {
                        "type": "card_error",
                        "code": "card_declined",
                        "message": "Your card was declined.",
                    }
                }
            self._seq += 1
            self.creates += 1
            intent_id = f"pi_fake{self._seq:06d}"
            metadata = {
                k[len("metadata[") : -1]: v for k, v in form.items() if k.startswith("metadata[")
            }
            intent = {
                "id": intent_id,
                "object": "payment_intent",
                "amount": amount,
                "amount_received": 0,
                "currency": form["currency"],
                "description": form.get("description"),
                "metadata": metadata,
                "status": "requires_payment_method",
                "client_secret": f"{intent_id}_secret_{self._seq}",
            }
            self.intents[intent_id] = intent
            if key:
                self._by_key[key] = (intent_id, form)
            return 200, intent

    def event(
        self,
        intent_id: str,
        kind: str = "payment_intent.succeeded",
        *,
        amount_received: int | None = None,
        metadata: dict[str, str] | None = None,
    ) -> bytes:
        """The JSON body of a webhook event about one intent (as paid, by default)."""
        intent = dict(self.intents[intent_id])
        if kind == "payment_intent.succeeded":
            intent["status"] = "succeeded"
            intent["amount_received"] = (
                intent["amount"] if amount_received is None else amount_received
            )
        if metadata is not None:
            intent["metadata"] = metadata
        self._seq += 1
        event = {
            "id": f"evt_fake{self._seq:06d}",
            "object": "event",
            "api_version": "2024-06-20",
            "created": int(time.time()),
            "type": kind,
            "livemode": False,
            "pending_webhooks": 1,
            "data": {"object": intent},
        }
        return json.dumps(event).encode()


__all__ = ["API_KEY", "WEBHOOK_SECRET", "FakeStripe", "stripe_signature"]
