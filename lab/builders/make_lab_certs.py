#!/usr/bin/env python3
"""Issue the lab's TLS certificates on the controller: one private CA, made once, and a certificate per host.

The lab has no PKI, so the inference proxy of each lab host gets a certificate from a CA that exists only on
this controller (${GPUFLEET_CACHE}/lab-tls/ca.crt, the file clients and Prometheus trust). Each host's
certificate names the host and its address; it is reissued only when those change (a new lab address pool),
when the CA changed or when it expires within 30 days, so reruns leave the files alone.

Usage: python lab/builders/make_lab_certs.py [--inventory inventories/lab/hosts.yml]
Writes ca.crt, ca.key, <host>.crt (host then CA) and <host>.key; keys are 0600.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

REPO = Path(__file__).resolve().parents[2]
CA_DAYS = 3650
HOST_DAYS = 825
RENEW_BEFORE = datetime.timedelta(days=30)


@dataclass(frozen=True)
class Host:
    name: str
    address: str


def tls_dir() -> Path:
    return Path(os.environ.get("GPUFLEET_CACHE") or "/var/cache/gpufleet") / "lab-tls"


def default_inventory() -> Path:
    return Path(os.environ.get("GPUFLEET_LAB_INVENTORY") or REPO / "inventories" / "lab" / "hosts.yml")


def read_hosts(inventory: Path) -> list[Host]:
    """The gpu_nodes of a lab inventory, with the address the controller reaches them on."""
    if not inventory.is_file():
        raise SystemExit(f"make_lab_certs: {inventory} does not exist; run `gpufleet lab up` first")
    document = yaml.safe_load(inventory.read_text()) or {}
    hosts = document.get("all", {}).get("children", {}).get("gpu_nodes", {}).get("hosts") or {}
    return [Host(name, str(variables.get("ansible_host", name))) for name, variables in sorted(hosts.items())]


def write_private(path: Path, data: bytes) -> None:
    """Writes a key readable by its owner only, atomically."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.part")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)
    os.replace(partial, path)


def write_public(path: Path, data: bytes) -> None:
    partial = path.with_name(f".{path.name}.{os.getpid()}.part")
    partial.write_bytes(data)
    partial.chmod(0o644)
    os.replace(partial, path)


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def ensure_ca(directory: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey, bool]:
    """The lab CA, made once; returns it and whether it was made now."""
    cert_path, key_path = directory / "ca.crt", directory / "ca.key"
    if cert_path.is_file() and key_path.is_file():
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        return x509.load_pem_x509_certificate(cert_path.read_bytes()), key, False
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "gpufleet lab"),
            x509.NameAttribute(NameOID.COMMON_NAME, "gpufleet lab CA"),
        ]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now() - datetime.timedelta(minutes=5))
        .not_valid_after(now() + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    write_private(key_path, key_pem(key))
    write_public(cert_path, cert_pem(cert))
    return cert, key, True


def wanted_names(host: Host) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = [x509.DNSName(host.name)]
    try:
        names.append(x509.IPAddress(ipaddress.ip_address(host.address)))
    except ValueError:
        names.append(x509.DNSName(host.address))
    return names


def is_current(cert_path: Path, host: Host, ca: x509.Certificate) -> bool:
    """Whether the host's certificate was issued by this CA for these names and is not about to expire."""
    if not cert_path.is_file():
        return False
    cert = x509.load_pem_x509_certificates(cert_path.read_bytes())[0]
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    return (
        cert.issuer == ca.subject
        and set(names) == set(wanted_names(host))
        and cert.not_valid_after_utc - now() > RENEW_BEFORE
    )


def issue(host: Host, ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, directory: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host.name)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now() - datetime.timedelta(minutes=5))
        .not_valid_after(now() + datetime.timedelta(days=HOST_DAYS))
        .add_extension(x509.SubjectAlternativeName(wanted_names(host)), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    write_private(directory / f"{host.name}.key", key_pem(key))
    # nginx wants the chain in one file: the host's certificate first, then the CA.
    write_public(directory / f"{host.name}.crt", cert_pem(cert) + cert_pem(ca))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inventory", type=Path, default=default_inventory(), help="lab inventory (hosts.yml)")
    args = parser.parse_args(argv)
    hosts = read_hosts(args.inventory)
    directory = tls_dir()
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    ca, ca_key, made = ensure_ca(directory)
    print(f"CA {directory / 'ca.crt'}: {'made' if made else 'kept'}")
    for host in hosts:
        if made or not is_current(directory / f"{host.name}.crt", host, ca):
            issue(host, ca, ca_key, directory)
            print(f"{host.name}: issued for {host.name}, {host.address}")
        else:
            print(f"{host.name}: kept")
    return 0


if __name__ == "__main__":
    sys.exit(main())
