"""``vla-edge kv-store ls|verify|gc|rm|keygen|rekey|wipe``: look after a KV block store from the shell."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from ..kv_store import BlockDirectory, BlockStore, StoreBindingError, load_key, model_fingerprint
from ..kv_store.binding import read_binding, show
from ..kv_store.keys import key_id, write_new_key
from ..kv_store.rekey import wipe
from ..model.checkpoint import load_checkpoint


def _existing(directory: Path) -> Path:
    if not directory.is_dir():
        raise ValueError(f"{directory} is not a directory")
    return directory


def _fingerprint(args: argparse.Namespace) -> bytes:
    return model_fingerprint(load_checkpoint(args.model)) if getattr(args, "model", None) else b""


def _store(args: argparse.Namespace) -> BlockStore:
    """The store opened with its key (``--plain``: as plain blocks); refused if it is bound to another."""
    directory = _existing(args.dir)
    aes_key = None if getattr(args, "plain", False) else load_key(args.key_file or "", args.key_env)
    return BlockStore(directory, _fingerprint(args), aes_key=aes_key, budget_bytes=1 << 62)


def _binding(directory: Path) -> str:
    """What the store is bound to, in words (a damaged binding is reported, not raised)."""
    try:
        bound = read_binding(directory)
    except StoreBindingError as exc:
        return str(exc)
    return bound.describe() if bound else "not bound to a key yet: the first open binds it"


def cmd_ls(args: argparse.Namespace) -> int:
    store = BlockDirectory(_existing(args.dir))
    fingerprint = _fingerprint(args)
    rows = []
    for entry in store.entries():
        header = entry.header
        rows.append({
            "block": entry.path.name, "bytes": entry.size,
            "last_used": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(entry.last_used)),
            "kind": header.kind if header else "?", "encrypted": header.encrypted if header else None,
            "fingerprint": header.fingerprint.hex() if header else None,
            "this_model": bool(header and fingerprint and header.fingerprint == fingerprint),
            "error": entry.error,
        })
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        sealed = {True: "aes-256-gcm", False: "plain", None: "?"}[row["encrypted"]]
        mark = " *" if row["this_model"] else ""
        print(f"{row['block'][:16]}  {row['kind']:<6} {row['bytes']:>12,} B  {sealed:<11} "
              f"model {(row['fingerprint'] or '?')[:16]}{mark}  used {row['last_used']}  {row['error']}")
    print(f"{len(rows)} blocks, {sum(r['bytes'] for r in rows):,} bytes in {store.directory}"
          + ("  (* = blocks of --model)" if fingerprint else ""))
    print(f"store: {_binding(store.directory)}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    store = _store(args)
    problems = store.verify(store.fingerprint or None)
    count = len(store.entries(read_headers=False))
    for path, problem in problems:
        print(f"FAIL {path.name}: {problem}")
    print(f"{count - len(problems)} of {count} blocks verified"
          + (f" against {args.model}" if store.fingerprint else "") + f"; store: {_binding(store.directory)}")
    return 1 if problems else 0


def cmd_gc(args: argparse.Namespace) -> int:
    store = BlockDirectory(_existing(args.dir))
    removed = store.gc(args.budget_bytes)
    left = sum(e.size for e in store.entries(read_headers=False))
    print(f"removed {len(removed)} least recently used blocks; {left:,} bytes left (budget {args.budget_bytes:,})")
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    store = BlockDirectory(_existing(args.dir))
    if not (args.blocks or args.all):
        raise ValueError("name the blocks to remove (key prefixes, as ls shows them) or pass --all")
    entries = store.entries(read_headers=False)
    chosen = entries if args.all else [e for e in entries if any(e.path.name.startswith(p) for p in args.blocks)]
    if not args.all:
        unmatched = [p for p in args.blocks if not any(e.path.name.startswith(p) for e in entries)]
        if unmatched:
            raise ValueError(f"no block matches {', '.join(unmatched)}")
    removed = sum(store.remove(e.path) for e in chosen)
    print(f"removed {removed} blocks (the store stays bound to its key)")
    return 0


def cmd_keygen(args: argparse.Namespace) -> int:
    write_new_key(args.out)
    identity = show(key_id(load_key(str(args.out))))
    print(f"wrote a new 256-bit key (key {identity}) to {args.out} (mode 600); point kv_store.key_file at it")
    return 0


def cmd_rekey(args: argparse.Namespace) -> int:
    if not (args.new_key_file or args.new_key_env):
        raise ValueError("name the new key: --new-key-file F (vla-edge kv-store keygen --out F makes one) "
                         "or --new-key-env VAR")
    new_key = load_key(args.new_key_file or "", args.new_key_env or "")  # a bad new key fails before any change
    store = _store(args)
    count, size = store.rekey(new_key)
    print(f"re-sealed {count} blocks ({size:,} bytes) of {store.directory} under key {show(key_id(new_key))}; the "
          f"old key no longer opens it: point kv_store.key_file (or key_env) at the new key")
    return 0


def cmd_wipe(args: argparse.Namespace) -> int:
    store = BlockDirectory(_existing(args.dir))
    entries = store.entries(read_headers=False)
    if not args.yes:
        raise ValueError(f"wipe deletes all {len(entries)} blocks ({sum(e.size for e in entries):,} bytes) of "
                         f"{store.directory} and its key binding ({_binding(store.directory)}); pass --yes to do it")
    count, size = wipe(store)
    print(f"removed {count} blocks ({size:,} bytes) and the key binding of {store.directory}; the next open binds "
          f"it to its key (or to plain blocks)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("kv-store", help="list, verify, garbage-collect, remove, re-key or wipe stored KV blocks")
    commands = parser.add_subparsers(dest="kv_command", required=True)

    def command(name: str, help_text: str, func) -> argparse.ArgumentParser:
        p = commands.add_parser(name, help=help_text)
        if name != "keygen":
            p.add_argument("--dir", required=True, type=Path, help="the store directory (kv_store.dir)")
        p.set_defaults(func=func)
        return p

    def store_key(p: argparse.ArgumentParser) -> None:
        p.add_argument("--key-file", help="the store's key file (default: the variable named by --key-env)")
        p.add_argument("--key-env", default="VLA_EDGE_KV_KEY", help="environment variable holding the store's key")

    p = command("ls", "list blocks with sizes, kinds and model fingerprints, and the store's key (no key needed)",
                cmd_ls)
    p.add_argument("--model", type=Path, help="mark the blocks that belong to this model directory")
    p.add_argument("--json", action="store_true")
    p = command("verify", "authenticate every block; exit 1 if any fails, 2 if the key is not the store's", cmd_verify)
    store_key(p)
    p.add_argument("--plain", action="store_true", help="the store is unencrypted (kv_store.encryption: none)")
    p.add_argument("--model", type=Path, help="also require every block to belong to this model directory")
    p = command("gc", "evict least recently used blocks until the store fits a budget", cmd_gc)
    p.add_argument("--budget-bytes", type=int, required=True)
    p = command("rm", "remove blocks by key prefix, or all of them (the key binding stays)", cmd_rm)
    p.add_argument("blocks", nargs="*", help="block key prefixes as ls shows them")
    p.add_argument("--all", action="store_true")
    p = command("keygen", "write a fresh random store key to a new owner-only file", cmd_keygen)
    p.add_argument("--out", required=True, type=Path)
    p = command("rekey", "re-seal every block under a new key and bind the store to it (crash-safe)", cmd_rekey)
    store_key(p)
    p.add_argument("--new-key-file", help="the new key's file (vla-edge kv-store keygen makes one)")
    p.add_argument("--new-key-env", help="environment variable holding the new key")
    p = command("wipe", "delete every block and the key binding, so that the next open starts the store afresh",
                cmd_wipe)
    p.add_argument("--yes", action="store_true", help="really delete them")
