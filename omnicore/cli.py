"""The ``omnicore`` command line: ``plugins``, ``train``, ``plan``, ``eval``, ``generate``.

User errors (bad config, bad data, unknown component) print one clean ``error: ...`` message and exit
with status 2; they never show a traceback. ``omnicore plugins`` imports neither torch nor any
plugin's heavy code.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
from typing import Any


def _table(rows: list[dict[str, str]], columns: list[str]) -> str:
    widths = {c: max([len(c)] + [len(r[c]) for r in rows]) for c in columns}
    line = "  ".join(c.upper().ljust(widths[c]) for c in columns).rstrip()
    out = [line]
    for r in rows:
        out.append("  ".join(r[c].ljust(widths[c]) for c in columns).rstrip())
    return "\n".join(out)


def cmd_plugins(args: argparse.Namespace) -> int:
    """``omnicore plugins``: list components (or, with ``--no-load``, entry points) and their status.

    Listing imports each enabled plugin's hook module but never torch or a component's own module.
    ``--no-load`` reads metadata only and imports no plugin code at all, so it always works, however
    broken a plugin is. ``--check`` imports each plugin's hook and target modules in a subprocess
    (one per plugin) and adds its import time and whether torch came in.

    Raises:
        RegistryError: in strict mode (``OMNICORE_STRICT=1``), on the first failed or incompatible
            plugin (not with ``--no-load``).
    """
    if args.no_load:
        return _plugins_no_load(args)
    from omnicore.components import KINDS
    from omnicore.registry import Registry

    reg = Registry.discover()
    rows = [(r.as_dict(), r) for r in reg.rows]
    if args.kind:
        rows = [(d, r) for d, r in rows if d["kind"] in (args.kind, "-")]
    order = {k: i for i, k in enumerate(KINDS)}
    rows.sort(key=lambda dr: (order.get(dr[0]["kind"], len(KINDS)), dr[0]["name"], dr[0]["provider"]))
    columns = ["kind", "name", "provider", "version", "status", "description"]
    if args.check:
        from omnicore.registry import check_plugins

        results = check_plugins(reg, timeout=args.check_timeout, only={(r.provider, r.entry_point) for _, r in rows})
        for d, r in rows:
            res = results.get((r.provider, r.entry_point))
            d["check"] = res.as_dict() if res else None  # type: ignore[assignment]
            d["import"] = res.summary() if res else f"not checked ({r.status})"
        columns = ["kind", "name", "provider", "version", "status", "import", "description"]
    out = [d for d, _ in rows]
    if args.json:
        for d in out:
            d.pop("import", None)
        print(json.dumps(out, indent=1))
        return 0
    for d in out:
        d["description"] = d["reason"] if d["status"] != "available" else d["description"]
    print(_table(out, columns))
    return 0


def _plugins_no_load(args: argparse.Namespace) -> int:
    from omnicore.registry import entry_points_info

    rows = [i.as_dict() for i in entry_points_info()]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    for r in rows:
        r["api"] = r["api"] or "-"
        r["reason"] = r["reason"] or "metadata only (--no-load): hook module not imported"
    print(_table(rows, ["name", "provider", "version", "value", "api", "status", "reason"]))
    return 0


def _config(args: argparse.Namespace, extra: list[str]) -> Any:
    from omnicore.config import load_config

    return load_config(args.config, extra)


def cmd_train(args: argparse.Namespace, extra: list[str]) -> int:
    cfg = _config(args, extra)
    from omnicore.parallel.state import init_parallel_state, shutdown
    from omnicore.train.loop import train
    from omnicore.train.signals import Interrupted

    state = init_parallel_state(cfg.run.device, cfg.parallel.backend, cfg.parallel)
    try:
        history = train(cfg, resume=args.resume, state=state)
    except Interrupted as exc:  # SIGTERM/SIGINT: every rank saved the same step; say how to go on
        if state.is_main:
            print(str(exc), file=sys.stderr)
        shutdown(state, exit_code=exc.exit_code)
        return exc.exit_code
    if state.is_main and history:
        print(f"done: step {history[-1]['step']}, loss {history[-1]['loss']:.4f}; metrics in {cfg.run.output_dir}/metrics.jsonl")
    shutdown(state, exit_code=0)
    return 0


def cmd_plan(args: argparse.Namespace, extra: list[str]) -> int:
    """``omnicore plan CONFIG --world-size N``: the mesh, strategies, per-rank memory and every
    violated constraint, without starting processes (the model is built on the meta device).
    Exit status 0 when the layout is valid, 2 when a constraint is violated."""
    cfg = _config(args, extra)
    from omnicore.parallel.plan import make_plan

    report = make_plan(cfg, args.world_size)
    print(json.dumps(report.as_dict(), indent=1) if args.json else report.render())
    return 0 if report.ok else 2


def cmd_eval(args: argparse.Namespace, extra: list[str]) -> int:
    cfg = _config(args, extra)
    from omnicore.evaluate import evaluate

    result = evaluate(cfg, checkpoint=args.checkpoint, export=args.export, limit=args.limit)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for task, r in result["tasks"].items():
            print(f"{task}: accuracy {r['accuracy']:.3f} ({r['correct']}/{r['total']})")
        print(f"overall: accuracy {result['accuracy']:.3f} ({result['correct']}/{result['total']})")
    return 0


def cmd_generate(args: argparse.Namespace, extra: list[str]) -> int:
    cfg = _config(args, extra)
    from omnicore.evaluate import generate_cli

    for line in generate_cli(
        cfg, prompt=args.prompt, image=args.image, audio=args.audio, out_dir=args.out, checkpoint=args.checkpoint, export=args.export
    ):
        print(line)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="omnicore", description="Train omni-modal models from plugins.")
    sub = p.add_subparsers(dest="command", required=True)

    sp = sub.add_parser("plugins", help="list every installed component, its provider and status")
    sp.add_argument("--json", action="store_true", help="print JSON instead of a table")
    sp.add_argument("--kind", choices=["encoder", "decoder", "foundation", "parallel", "kernel"], help="only this kind")
    sp.add_argument(
        "--check", action="store_true", help="import each plugin's hook and component modules in a subprocess; report import time and torch"
    )
    sp.add_argument("--check-timeout", type=float, default=120.0, metavar="S", help="seconds allowed per plugin for --check (default 120)")
    sp.add_argument(
        "--no-load", action="store_true", help="list entry points from metadata only; import no plugin code (to recover from a bad plugin)"
    )

    over = "dotted overrides such as --train.max_steps 50 may follow"
    sp = sub.add_parser("train", help="train from a YAML config (" + over + ")")
    sp.add_argument("config")
    sp.add_argument(
        "--resume",
        nargs="?",
        const=True,
        default=False,
        metavar="CHECKPOINT",
        help="continue from the newest checkpoint in run.output_dir that verifies, or from CHECKPOINT (a folder, or a name such as step-00000004)",
    )

    sp = sub.add_parser("plan", help="check and size the parallel layout for N ranks without starting processes (" + over + ")")
    sp.add_argument("config")
    sp.add_argument("--world-size", type=int, required=True, metavar="N", help="number of ranks to plan for")
    sp.add_argument("--json", action="store_true", help="print JSON")

    for name, text in (
        ("eval", "accuracy on held-out samples whose answer is text"),
        ("generate", "generate text, or an image saved as PNG"),
    ):
        sp = sub.add_parser(name, help=text + " (" + over + ")")
        sp.add_argument("config")
        sp.add_argument("--checkpoint", help="a checkpoint folder (default: the latest under run.output_dir)")
        sp.add_argument("--export", help="an export folder to load instead of a checkpoint")
        if name == "eval":
            sp.add_argument("--limit", type=int, help="evaluate only the first N samples")
            sp.add_argument("--json", action="store_true", help="print JSON")
        else:
            sp.add_argument("--prompt", required=True, help="the user's text")
            sp.add_argument("--image", help="an input image file")
            sp.add_argument("--audio", help="an input audio file")
            sp.add_argument("--out", default=".", help="folder for generated images (PNG)")
    return p


def main(argv: list[str] | None = None) -> int:
    from omnicore.registry import RegistryError

    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command == "plugins":  # kept light: no config (pydantic) import, no torch
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        if args.no_load and (args.check or args.kind):
            parser.error("--no-load lists entry points without loading them; it cannot be combined with --check or --kind")
        try:
            return cmd_plugins(args)
        except RegistryError as exc:  # OMNICORE_STRICT=1 and a plugin failed
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except BrokenPipeError:  # `omnicore plugins | head`: the reader has all it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
            return 0
    from omnicore.config import ConfigError

    handlers = {"train": cmd_train, "plan": cmd_plan, "eval": cmd_eval, "generate": cmd_generate}
    user_errors: tuple[type[BaseException], ...] = (ConfigError, RegistryError)
    try:
        from omnicore.checkpoint.dcp import CheckpointError
        from omnicore.data.jsonl import SampleError
        from omnicore.data.packing import PackingError
        from omnicore.data.pipeline import DataResumeError, DataWorkerError
        from omnicore.parallel.mesh import MeshError
        from omnicore.parallel.parallelize import ParallelizeError
        from omnicore.train.optim import NonFiniteError

        user_errors += (SampleError, CheckpointError, PackingError, MeshError, ParallelizeError, NonFiniteError)
        user_errors += (DataResumeError, DataWorkerError)
        return handlers[args.command](args, extra)
    except user_errors as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the file system said no: a user's problem to fix, in one line
        print(f"error: {describe_os_error(exc)}", file=sys.stderr)
        return 2


_OS_HINTS = {
    errno.ENOSPC: "no space left on the device; free some space or choose another --run.output_dir",
    errno.EDQUOT: "disk quota exceeded; free some space or choose another --run.output_dir",
    errno.EROFS: "the file system is read-only; choose a writable --run.output_dir",
    errno.EACCES: "permission denied; choose a folder you can write to (--run.output_dir) or fix its permissions",
    errno.EPERM: "operation not permitted; check the folder's permissions",
    errno.EFBIG: "file too large for this file system or the file-size limit (ulimit -f); raise the limit",
    errno.ENOENT: "no such file or folder; check the path",
    errno.EISDIR: "a folder where a file was expected; check the path",
    errno.ENOTDIR: "a file where a folder was expected; check the path",
}


def describe_os_error(exc: OSError) -> str:
    """One line for an ``OSError``: the file it concerns, what happened and what to do
    (``/runs/x/metrics.jsonl: no space left on the device; free some space ...``)."""
    where = exc.filename if exc.filename is not None else ""
    if exc.filename2 is not None:
        where = f"{where} -> {exc.filename2}"
    what = _OS_HINTS.get(exc.errno) or (exc.strerror or str(exc) or type(exc).__name__)
    return f"{where}: {what}" if where else what


if __name__ == "__main__":
    sys.exit(main())
