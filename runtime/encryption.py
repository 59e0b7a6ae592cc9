"""Encryption at rest, the Temporal way: a payload codec (AES-256-GCM).

With keys set (``AGENT_ENCRYPTION_KEYS``, see ``runtime/settings.py``),
every payload a worker or client writes is encrypted after compression
and before external storage, so the Temporal server, its database, its
UI and the payload store hold only ciphertext: an encrypted payload is
``{"encoding": "binary/encrypted", "encryption-key-id": ID}`` with a
12-byte random nonce and the AES-GCM ciphertext of the serialized payload
as its data. The FIRST key encrypts; every key decrypts, so keys rotate
by putting a new key first and keeping the old ones while anything
written under them is still read (histories within retention, stored
payloads, running conversations).

The context store's blobs (``activities/blobs.py``) are sealed with the
same keys (``seal_blob``): they never pass through a codec. Their address
stays the sha256 of the plaintext, checked after decrypting.

A payload that cannot be decrypted (no key, an unknown key id, altered
data) is not raised on: the codec hands on a refused payload with the
reason (``runtime.converter.refused_payload``), so a stray signal is
dropped instead of failing workflow tasks forever.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from google.protobuf.message import DecodeError
from temporalio.api.common.v1 import Payload
from temporalio.converter import PayloadCodec

from activities.blobs import SEALED_PREFIX
from runtime.converter import refused_payload
from runtime.settings import Settings

ENCRYPTED = b"binary/encrypted"
KEY_ID = "encryption-key-id"
_NONCE_BYTES = 12


# ``cryptography`` is imported where a key is used, not at module import: a
# workflow module that imports this package is re-imported by the workflow
# sandbox, which cannot load cryptography's compiled extension twice.


class UnknownKey(LookupError):
    """Data was encrypted with a key id this process does not have."""


class Undecryptable(ValueError):
    """Data does not decrypt with the key its id names (altered, or another key by that id)."""


class Keyring:
    """AES-256-GCM keys by id; the first one encrypts."""

    def __init__(self, keys: Sequence[tuple[str, bytes]]) -> None:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        if not keys:
            raise ValueError("A keyring needs at least one key.")
        self._ciphers = {key_id: AESGCM(key) for key_id, key in keys}
        self.current = keys[0][0]

    @property
    def key_ids(self) -> list[str]:
        return list(self._ciphers)

    def encrypt(self, plain: bytes, context: bytes) -> tuple[str, bytes]:
        """The current key's id, and nonce + ciphertext bound to ``context``."""
        nonce = os.urandom(_NONCE_BYTES)
        return self.current, nonce + self._ciphers[self.current].encrypt(nonce, plain, context)

    def decrypt(self, key_id: str, sealed: bytes, context: bytes) -> bytes:
        """The plaintext; ``UnknownKey``, or ``Undecryptable`` (altered, or
        another key by that id)."""
        from cryptography.exceptions import InvalidTag

        cipher = self._ciphers.get(key_id)
        if cipher is None:
            raise UnknownKey(f"it is encrypted with key {key_id!r}, which this process does not have")
        try:
            return cipher.decrypt(sealed[:_NONCE_BYTES], sealed[_NONCE_BYTES:], context)
        except (InvalidTag, ValueError):
            raise Undecryptable(
                f"it does not decrypt with key {key_id!r} (altered, or another key by that id)"
            ) from None

    # --- blobs (the context store) -------------------------------------------------------

    def seal_blob(self, data: bytes, digest: str) -> bytes:
        key_id, sealed = self.encrypt(data, _blob_context(digest))
        name = key_id.encode()
        return SEALED_PREFIX + bytes([len(name)]) + name + sealed

    def open_blob(self, blob: bytes, digest: str) -> bytes | None:
        """The plaintext of a sealed blob; None for a plaintext one (written
        before encryption was switched on); ``UnknownKey``/``Undecryptable``."""
        if not blob.startswith(SEALED_PREFIX):
            return None
        start = len(SEALED_PREFIX) + 1
        end = start + blob[len(SEALED_PREFIX)]
        return self.decrypt(blob[start:end].decode(errors="replace"), blob[end:], _blob_context(digest))


def _blob_context(digest: str) -> bytes:
    # Bound to its address: a sealed blob moved under another name does not open.
    return b"durable-agent/blob:" + digest.encode()


def _payload_context(key_id: str) -> bytes:
    return b"durable-agent/payload:" + key_id.encode()


def keyring(settings: Settings) -> Keyring | None:
    """The keyring ``settings`` hold, or None when encryption is off."""
    return Keyring(settings.encryption_keys) if settings.encryption_keys else None


class EncryptionCodec(PayloadCodec):
    """Encrypts every payload with the keyring's current key; decrypts with
    the key its metadata names. Without a keyring it encrypts nothing and
    refuses encrypted payloads with a sentence saying which key is missing."""

    def __init__(self, keys: Keyring | None) -> None:
        self._keys = keys

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        if self._keys is None:
            return list(payloads)
        return [self._encrypt(self._keys, p) for p in payloads]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self._decrypt(p) if p.metadata.get("encoding") == ENCRYPTED else p for p in payloads]

    def _encrypt(self, keys: Keyring, payload: Payload) -> Payload:
        key_id, sealed = keys.encrypt(payload.SerializeToString(), _payload_context(keys.current))
        return Payload(metadata={"encoding": ENCRYPTED, KEY_ID: key_id.encode()}, data=sealed)

    def _decrypt(self, payload: Payload) -> Payload:
        key_id = payload.metadata.get(KEY_ID, b"").decode(errors="replace")
        if self._keys is None:
            named = f", key {key_id!r}" if key_id else ""
            return refused_payload(
                f"is encrypted (binary/encrypted{named}) but no encryption key is set here: "
                "give this process the workers' AGENT_ENCRYPTION_KEYS"
            )
        try:
            plain = self._keys.decrypt(key_id, payload.data, _payload_context(key_id))
        except UnknownKey:
            return refused_payload(
                f"is encrypted with key {key_id!r}, which is not among this process's keys "
                f"({', '.join(self._keys.key_ids)}): add it to AGENT_ENCRYPTION_KEYS"
            )
        except Undecryptable:
            return refused_payload(
                f"does not decrypt with key {key_id!r}: it was altered, "
                "or encrypted with another key of that id"
            )
        try:
            return Payload.FromString(plain)
        except DecodeError:
            return refused_payload(f"decrypts with key {key_id!r} but holds no payload")


class CodecChain(PayloadCodec):
    """Codecs applied in order on encode and in reverse order on decode
    (compress, then encrypt; decrypt, then decompress)."""

    def __init__(self, codecs: Sequence[PayloadCodec]) -> None:
        self._codecs = list(codecs)

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        out = list(payloads)
        for codec in self._codecs:
            out = await codec.encode(out)
        return out

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        out = list(payloads)
        for codec in reversed(self._codecs):
            out = await codec.decode(out)
        return out
