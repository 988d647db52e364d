"""The remote half of certification, run on the node through its own venv::

    python -m agent.bootstrap.keygen --dir DIR

Creates ``DIR/node.key`` (0600) unless it exists, and prints one JSON object: the raw public key
(hex), the node id, whether the key was created now, and what certificate is already installed
(its CA fingerprint, expiry and serial), so the operator's side can decide whether to sign a new
one. The private key never leaves the host.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from agent.common.quiet import quiet_third_party_warnings
from gossip.identity import (
    CA_CERT,
    NODE_CERT,
    NODE_KEY,
    IdentityError,
    certificate_fingerprint,
    generate_node_key,
    node_id_for,
)


def _raw(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _certificate_state(directory: Path, public: bytes) -> dict[str, Any] | None:
    cert_path, ca_path = directory / NODE_CERT, directory / CA_CERT
    if not cert_path.exists() or not ca_path.exists():
        return None
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        ca = x509.load_pem_x509_certificate(ca_path.read_bytes())
    except (OSError, ValueError):
        return None
    key = cert.public_key()
    return {
        "matches_key": isinstance(key, Ed25519PublicKey) and _raw(key) == public,
        "ca_fingerprint": certificate_fingerprint(ca),
        "not_after": cert.not_valid_after_utc.timestamp(),
        "serial": str(cert.serial_number),
    }


def keygen(directory: Path) -> dict[str, Any]:
    """Make the key if there is none; describe the key and the installed certificate."""
    key_path = directory / NODE_KEY
    created = False
    if key_path.exists():
        try:
            private = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        except (ValueError, TypeError) as exc:
            raise IdentityError(f"cannot load {key_path}: {exc}") from None
        if not isinstance(private, Ed25519PrivateKey):
            raise IdentityError(f"{key_path} is not an Ed25519 key")
        public = _raw(private.public_key())
    else:
        _, public = generate_node_key(directory)
        created = True
    return {
        "public_key": public.hex(),
        "node_id": node_id_for(public),
        "created": created,
        "certificate": _certificate_state(directory, public),
    }


def main(argv: Sequence[str] | None = None) -> int:
    quiet_third_party_warnings()
    parser = argparse.ArgumentParser(
        prog="python -m agent.bootstrap.keygen",
        description="create this node's key (once) and print its public key as JSON",
    )
    parser.add_argument("--dir", type=Path, required=True, help="the node's identity directory")
    args = parser.parse_args(argv)
    try:
        print(json.dumps(keygen(args.dir)))
    except (IdentityError, OSError) as exc:
        print(f"keygen: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
