"""``inflight keys``: create, list and revoke API keys (stored hashed)."""

from __future__ import annotations

import argparse
import sys


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``keys``."""
    p = subparsers.add_parser(
        "keys",
        help="manage API keys",
        description="API keys map to tenants; only a key's SHA-256 hash is stored, so the key "
        "is printed once, at creation.",
    )
    p.add_argument("--database-url", default=None, help="overrides DATABASE_URL")
    sub = p.add_subparsers(dest="keys_action", metavar="ACTION", required=True)
    c = sub.add_parser("create", help="create a key for a tenant and print it")
    c.add_argument("--tenant", required=True)
    c.add_argument("--name", default=None, help="a label for the key")
    c.add_argument(
        "--read-only", action="store_true", help="the key may only read (GET), never write"
    )
    ls = sub.add_parser("list", help="list keys (ids and prefixes, never the keys)")
    ls.add_argument("--tenant", default=None)
    r = sub.add_parser("revoke", help="revoke a key by id")
    r.add_argument("key_id")
    for action in (c, ls, r):  # also accepted after the action
        action.add_argument(
            "--database-url", default=argparse.SUPPRESS, help="overrides DATABASE_URL"
        )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Carry out the action; 0 on success."""
    from worker.protocol.limits import LimitError, check_tenant
    from worker.store.crud.api_keys import create_api_key, list_api_keys, revoke_api_key
    from worker.store.db import database_url, make_engine, make_session_factory

    if args.keys_action == "create":
        try:
            check_tenant(args.tenant)
        except LimitError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2

    engine = make_engine(url=database_url(args.database_url))
    try:
        sf = make_session_factory(engine=engine)
        if args.keys_action == "create":
            with sf.begin() as session:
                row, plain = create_api_key(
                    session=session, tenant=args.tenant, name=args.name, read_only=args.read_only
                )
            print(plain)
            kind = "read-only key" if row.read_only else "key"
            print(
                f"created {kind} {row.id} for tenant {row.tenant!r} (the key is shown only once)",
                flush=True,
            )
            return 0
        if args.keys_action == "list":
            with sf() as session:
                for k in list_api_keys(session=session, tenant=args.tenant):
                    state = "revoked" if k.revoked_at else "active"
                    print(f"{k.id}\t{k.tenant}\t{k.prefix}...\t{state}\t{k.name or ''}")
            return 0
        with sf.begin() as session:
            ok = revoke_api_key(session=session, key_id=args.key_id)
        print("revoked" if ok else f"no active key {args.key_id}")
        return 0 if ok else 1
    finally:
        engine.dispose()
