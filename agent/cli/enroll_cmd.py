"""Enrolling a host by hand, for hosts ``shoal bootstrap`` cannot reach over SSH (Windows,
air-gapped, managed by configuration management)::

    host$     shoal enroll --dir DIR [--name NAME] [--address HOST]   # key + DIR/node.csr
    operator$ shoal certify node.csr [--out node.crt] [--days N]      # signed with the CA
    host$     shoal enroll --dir DIR --install node.crt [--ca ca.crt]  # then shoal agent

The same steps as bootstrap's, by other means: the host makes its key with bootstrap's own
:func:`agent.bootstrap.keygen.keygen` (once; a rerun reuses it) and the key never leaves it; only a
certificate signing request travels, signed with that key. The operator signs it with
bootstrap's :func:`agent.bootstrap.certify.sign_node`, which issues ``agent`` certificates only.
``certify`` writes the node's certificate followed by the CA's, so the one file is all the host
needs; installing checks, before anything is written, that the certificate is for this host's
key, is an agent's, and was issued by the CA given (or bundled), and that this folder does not
already trust another cluster.
"""

from __future__ import annotations

import argparse
import json
import socket
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature

from agent.common.errors import UserError
from gossip.identity import (
    CA_CERT,
    NODE_CSR,
    NODE_KEY,
    CertificateRequest,
    IdentityError,
    certificate_fingerprint,
    certificate_node_id,
    certificate_request,
    common_name,
    install_certificate,
    load_cluster,
    load_node_key,
    node_id_for,
    read_certificate_request,
    role_of_certificate,
)


def _print(args: argparse.Namespace, doc: dict[str, Any], lines: list[str]) -> int:
    print(json.dumps(doc, sort_keys=True) if args.json else "\n".join(lines))
    return 0


# -- on the host -----------------------------------------------------------------------------------


def cmd_enroll(args: argparse.Namespace) -> int:
    if args.install is not None:
        return _install(args)
    if args.ca is not None:
        raise UserError("--ca goes with --install CERT")
    return _request(args)


def _request(args: argparse.Namespace) -> int:
    from agent.bootstrap.keygen import keygen

    directory: Path = args.dir
    names = list(dict.fromkeys([args.name or socket.gethostname(), *args.address]))
    try:
        report = keygen(directory)  # the key bootstrap makes over SSH, made here the same way
        pem = certificate_request(load_node_key(directory), "agent", names)
        (directory / NODE_CSR).write_bytes(pem)
    except IdentityError as exc:
        raise UserError(str(exc)) from None
    except OSError as exc:
        raise UserError(f"cannot write {directory}: {exc.strerror or exc}") from None
    request = directory / NODE_CSR
    made = "made now" if report["created"] else "kept"
    return _print(
        args,
        {
            "node_id": report["node_id"],
            "key": str(directory / NODE_KEY),
            "key_created": report["created"],
            "request": str(request),
            "names": names,
        },
        [
            f"node id   {report['node_id']}",
            f"key       {directory / NODE_KEY} ({made}; it never leaves this host)",
            f"request   {request} (names: {', '.join(names)})",
            f"Next: give {request.name} to the operator, who runs",
            f"  shoal certify {request.name} --out {report['node_id'][:8]}.crt",
            "and, with that file back on this host:",
            f"  shoal enroll --dir {directory} --install {report['node_id'][:8]}.crt",
        ],
    )


def _read_certificates(path: Path, flag: str) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(path.read_bytes())
    except OSError as exc:
        raise UserError(f"{flag} {path}: {exc.strerror or exc}") from None
    except ValueError:
        raise UserError(f"{flag} {path}: not a PEM certificate") from None


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def _chosen_ca(args: argparse.Namespace, bundled: list[x509.Certificate]) -> x509.Certificate:
    """The CA to trust: ``--ca``, else the one ``certify`` bundled; they must agree."""
    given = None
    if args.ca is not None:
        cas = [c for c in _read_certificates(args.ca, "--ca") if _is_ca(c)]
        if len(cas) != 1:
            raise UserError(f"--ca {args.ca}: expected one CA certificate, found {len(cas)}")
        given = cas[0]
    if given is not None and bundled and bundled[0] != given:
        raise UserError(
            f"--install {args.install} bundles the CA {certificate_fingerprint(bundled[0])[:16]}"
            f"…, not the CA of --ca ({certificate_fingerprint(given)[:16]}…): another cluster's"
        )
    ca = given or (bundled[0] if bundled else None)
    if ca is None:
        raise UserError(f"--install {args.install} holds no CA certificate: pass --ca CA.crt")
    return ca


def _install(args: argparse.Namespace) -> int:
    directory: Path = args.dir
    certs = _read_certificates(args.install, "--install")
    nodes = [c for c in certs if not _is_ca(c)]
    if len(nodes) != 1:
        raise UserError(
            f"--install {args.install}: expected one node certificate, found {len(nodes)}"
        )
    cert = nodes[0]
    ca = _chosen_ca(args, [c for c in certs if _is_ca(c)])
    try:
        key = load_node_key(directory)
    except IdentityError:
        raise UserError(
            f"{directory} holds no node key: run 'shoal enroll --dir {directory}' first"
        ) from None
    mine = node_id_for(key.public_key())
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        raise UserError(
            f"--install {args.install} was not issued by the CA {common_name(ca)!r} "
            f"(sha256 {certificate_fingerprint(ca)[:16]}…): wrong CA"
        ) from None
    try:
        theirs = certificate_node_id(cert)
        role = role_of_certificate(cert)
    except IdentityError as exc:
        raise UserError(f"--install {args.install}: {exc}") from None
    if theirs != mine:
        raise UserError(
            f"--install {args.install} certifies node {theirs}, not this host's key "
            f"(node {mine}): it answers another request"
        )
    person = bool(getattr(args, "person", False))  # shoal user install
    if person and role == "agent":
        raise UserError(f"--install {args.install} is an agent's certificate, not a person's")
    if not person and role != "agent":
        raise UserError(
            f"--install {args.install} is an {role} certificate; an agent needs an agent's"
        )
    if cert.not_valid_after_utc <= datetime.now(UTC):
        raise UserError(f"--install {args.install} expired on {cert.not_valid_after_utc:%Y-%m-%d}")
    _check_same_cluster(directory, ca)
    try:
        identity = install_certificate(directory, cert, ca)
    except IdentityError as exc:
        raise UserError(str(exc)) from None
    except OSError as exc:
        raise UserError(f"cannot write {directory}: {exc.strerror or exc}") from None
    fingerprint = certificate_fingerprint(ca)
    return _print(
        args,
        {
            "node_id": identity.node_id,
            "identity": str(directory),
            "cluster": common_name(ca),
            "ca_fingerprint_sha256": fingerprint,
            "not_after": cert.not_valid_after_utc.isoformat(),
        },
        [
            f"installed node {identity.node_id} of cluster {common_name(ca)!r}",
            f"  CA sha256  {fingerprint} (compare with what 'shoal init' printed)",
            f"  valid until {cert.not_valid_after_utc:%Y-%m-%d}",
            *(
                [f"Act as yourself: shoal submit --identity {directory} --agent HOST:PORT ..."]
                if person
                else [
                    "Start the agent:",
                    f"  shoal agent --identity {directory} --data-dir DATA --join SEED:7946 "
                    "--listen 0.0.0.0:7946",
                ]
            ),
        ],
    )


def _check_same_cluster(directory: Path, ca: x509.Certificate) -> None:
    """Refuse to replace the CA a folder already trusts with another cluster's."""
    path = directory / CA_CERT
    if not path.exists():
        return
    try:
        current = x509.load_pem_x509_certificate(path.read_bytes())
    except (OSError, ValueError):
        return  # unreadable: replaced by the checked one
    if current != ca:
        raise UserError(
            f"{path} is the CA of another cluster (sha256 {certificate_fingerprint(current)[:16]}"
            "…); this host's key belongs to it: enroll for a new cluster in another --dir"
        )


# -- on the operator's machine ---------------------------------------------------------------------


def _read_request(path: Path) -> CertificateRequest:
    try:
        pem = path.read_bytes()
    except OSError as exc:
        raise UserError(f"{path}: {exc.strerror or exc}") from None
    try:
        return read_certificate_request(pem)
    except IdentityError as exc:
        raise UserError(f"{path}: {exc}") from None


def cmd_certify(args: argparse.Namespace) -> int:
    from agent.bootstrap.certify import KeyReport, sign_node
    from agent.operator.revocations import load_revocations

    if args.days < 1:
        raise UserError("--days must be at least 1")
    request = _read_request(args.request)
    if request.role != "agent":
        raise UserError(
            f"{args.request} asks for an {request.role} certificate; shoal certify signs agent "
            "certificates only (an operator's identity comes from 'shoal init')"
        )
    try:
        cluster = load_cluster(args.identity)
    except IdentityError as exc:
        raise UserError(
            f"certifying needs the cluster directory ({args.identity}): {exc}"
        ) from None
    if request.node_id in load_revocations(cluster.directory).node_ids:
        raise UserError(
            f"node {request.node_id} is revoked in this cluster; the host must enroll with a new "
            "key (remove its node.key and run shoal enroll again)"
        )
    out: Path = args.out or args.request.with_suffix(".crt")
    if out.resolve() == args.request.resolve():
        raise UserError(f"--out {out} is the request itself")
    report = KeyReport(  # what bootstrap's keygen reports, from the request's verified key
        public_key=request.public_key,
        node_id=request.node_id,
        created=False,
        cert_matches_key=False,
        cert_ca_fingerprint=None,
        cert_not_after_s=None,
    )
    now = datetime.now(UTC)
    signed = sign_node(cluster, report, request.names, timedelta(days=args.days), now)
    try:
        out.write_bytes(signed.node_crt_pem + signed.ca_crt_pem)
    except OSError as exc:
        raise UserError(f"cannot write {out}: {exc.strerror or exc}") from None
    until = now + timedelta(days=args.days)
    return _print(
        args,
        {
            "node_id": request.node_id,
            "certificate": str(out),
            "names": list(request.names),
            "serial": str(signed.serial),
            "not_after": until.isoformat(),
            "ca_fingerprint_sha256": cluster.ca_fingerprint,
        },
        [
            f"certified node {request.node_id} as an agent of {cluster.name!r} "
            f"until {until:%Y-%m-%d} (names: {', '.join(request.names) or '-'})",
            f"wrote {out} (the node's certificate, then the CA's)",
            f"On the host: shoal enroll --dir DIR --install {out.name}",
        ],
    )
