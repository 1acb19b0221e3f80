"""``vla-edge kv-store ls|verify|gc|rm|keygen``: look after a KV block store from the shell."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from ..kv_store import BlockStore, load_key, model_fingerprint
from ..kv_store.keys import write_new_key
from ..model.checkpoint import load_checkpoint


def _store(args: argparse.Namespace, *, needs_key: bool = False) -> BlockStore:
    if not args.dir.is_dir():
        raise ValueError(f"{args.dir} is not a directory")
    aes_key = None
    if needs_key and not args.plain:
        aes_key = load_key(args.key_file or "", args.key_env)
    fingerprint = model_fingerprint(load_checkpoint(args.model)) if getattr(args, "model", None) else b""
    return BlockStore(args.dir, fingerprint, aes_key=aes_key, budget_bytes=1 << 62)


def cmd_ls(args: argparse.Namespace) -> int:
    store = _store(args)
    rows = []
    for entry in store.entries():
        header = entry.header
        rows.append({
            "block": entry.path.name, "bytes": entry.size,
            "last_used": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(entry.last_used)),
            "kind": header.kind if header else "?", "encrypted": header.encrypted if header else None,
            "fingerprint": header.fingerprint.hex() if header else None,
            "this_model": bool(header and store.fingerprint and header.fingerprint == store.fingerprint),
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
          + ("  (* = blocks of --model)" if store.fingerprint else ""))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    store = _store(args, needs_key=True)
    problems = store.verify(store.fingerprint or None)
    count = len(store.entries(read_headers=False))
    for path, problem in problems:
        print(f"FAIL {path.name}: {problem}")
    print(f"{count - len(problems)} of {count} blocks verified"
          + (f" against {args.model}" if store.fingerprint else ""))
    return 1 if problems else 0


def cmd_gc(args: argparse.Namespace) -> int:
    store = _store(args)
    removed = store.gc(args.budget_bytes)
    left = sum(e.size for e in store.entries(read_headers=False))
    print(f"removed {len(removed)} least recently used blocks; {left:,} bytes left (budget {args.budget_bytes:,})")
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    store = _store(args)
    if not (args.blocks or args.all):
        raise ValueError("name the blocks to remove (key prefixes, as ls shows them) or pass --all")
    entries = store.entries(read_headers=False)
    chosen = entries if args.all else [e for e in entries if any(e.path.name.startswith(p) for p in args.blocks)]
    if not args.all:
        unmatched = [p for p in args.blocks if not any(e.path.name.startswith(p) for e in entries)]
        if unmatched:
            raise ValueError(f"no block matches {', '.join(unmatched)}")
    removed = sum(store.remove(e.path) for e in chosen)
    print(f"removed {removed} blocks")
    return 0


def cmd_keygen(args: argparse.Namespace) -> int:
    write_new_key(args.out)
    print(f"wrote a new 256-bit key to {args.out} (mode 600); point kv_store.key_file at it")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("kv-store", help="list, verify, garbage-collect or remove stored KV blocks")
    commands = parser.add_subparsers(dest="kv_command", required=True)

    def command(name: str, help_text: str, func) -> argparse.ArgumentParser:
        p = commands.add_parser(name, help=help_text)
        if name != "keygen":
            p.add_argument("--dir", required=True, type=Path, help="the store directory (kv_store.dir)")
        p.set_defaults(func=func)
        return p

    p = command("ls", "list blocks with sizes, kinds and model fingerprints (no key needed)", cmd_ls)
    p.add_argument("--model", type=Path, help="mark the blocks that belong to this model directory")
    p.add_argument("--json", action="store_true")
    p = command("verify", "authenticate every block; exit 1 if any fails", cmd_verify)
    p.add_argument("--key-file", help="key file (default: the variable named by --key-env)")
    p.add_argument("--key-env", default="VLA_EDGE_KV_KEY", help="environment variable holding the key")
    p.add_argument("--plain", action="store_true", help="the store is unencrypted (kv_store.encryption: none)")
    p.add_argument("--model", type=Path, help="also require every block to belong to this model directory")
    p = command("gc", "evict least recently used blocks until the store fits a budget", cmd_gc)
    p.add_argument("--budget-bytes", type=int, required=True)
    p = command("rm", "remove blocks by key prefix, or all of them", cmd_rm)
    p.add_argument("blocks", nargs="*", help="block key prefixes as ls shows them")
    p.add_argument("--all", action="store_true")
    p = command("keygen", "write a fresh random store key to a new owner-only file", cmd_keygen)
    p.add_argument("--out", required=True, type=Path)
