"""The shared secret the commands' clients present to bookies that ask for it.

Bookies started with the shared-secret plugin (``bookieAuthProviderFactoryClass=shared-secret``,
``authSharedSecretFile``) answer every request of an unauthenticated client with EUA. A command
that connects a client (shell, log, bench, spark) takes the secret from, in this order:
``bookkeeper --auth-secret-file FILE`` (before the command), ``$BOOKKEEPER_AUTH_SECRET_FILE``,
or the ``authSharedSecretFile`` of ``shell --conf bk_server.conf`` when that file's provider is
the shared-secret one (the shell on a bookie's machine then needs nothing more). Without any,
the client sends no ``AUTH``, as before.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from bookkeeper_py.auth import SharedSecretClientAuthProvider, read_secret

ENVIRONMENT = "BOOKKEEPER_AUTH_SECRET_FILE"
SHARED_SECRET = "shared-secret"  # bookieAuthProviderFactoryClass of the built-in plugin
PRINCIPAL = "bookkeeper-cli"


def secret_file(args: argparse.Namespace) -> str | None:
    """Where the command's secret is, if it has one (see the module)."""
    given = getattr(args, "client_secret_file", None) or os.environ.get(ENVIRONMENT)
    if given:
        return str(given)
    conf = shell_conf(args) if getattr(args, "shell_conf", None) else None
    if conf and conf.get("bookieAuthProviderFactoryClass") == SHARED_SECRET:
        found = conf.get("authSharedSecretFile")
        return str(found) if found else None
    return None


def shell_conf(args: argparse.Namespace) -> dict[str, Any]:
    """The keys of ``shell --conf FILE`` (read once per command)."""
    from bookkeeper_py.server.config import read_conf

    if getattr(args, "_conf_values", None) is None:
        args._conf_values = read_conf(args.shell_conf)
    values: dict[str, Any] = args._conf_values
    return values


def client_options(args: argparse.Namespace) -> dict[str, Any]:
    """Keyword options of the command's ``BookKeeper`` client: ``auth`` with the secret, when
    there is one (an unreadable or short secret file is an ``AuthenticationError``, one line)."""
    return options_for(secret_file(args))


def options_for(path: str | None) -> dict[str, Any]:
    """``client_options`` of the secret in ``path`` (none: no options)."""
    if path is None:
        return {}
    return {"auth": SharedSecretClientAuthProvider(read_secret(path), PRINCIPAL)}
