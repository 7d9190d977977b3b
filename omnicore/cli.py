"""The ``omnicore`` command line: ``plugins``, ``train``, ``plan``, ``eval``, ``generate``, ``plot``.

User errors (bad config, bad data, unknown component) print one clean ``error: ...`` message and exit
with status 2; they never show a traceback. ``omnicore plugins`` imports neither torch nor any
plugin's heavy code; ``omnicore plot`` imports matplotlib but not torch. Each subcommand's ``--help``
ends with an example of its own use (:data:`EXAMPLES`).
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import sys
from typing import Any, NoReturn


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
    (one per plugin) and adds its import time and whether torch came in. ``--options NAME`` lists
    one component's options instead (:func:`_plugins_options`). A foundation's description ends with
    the model types it serves (``[serves: ...]``, :func:`_serves`); ``--json`` has them as a list
    under ``model_types`` (empty for other rows).

    Raises:
        RegistryError: in strict mode (``OMNICORE_STRICT=1``), on the first failed or incompatible
            plugin (not with ``--no-load``); with ``--options``, an unknown or ambiguous NAME.
    """
    if args.no_load:
        return _plugins_no_load(args)
    from omnicore.components import KINDS
    from omnicore.registry import Registry
    from omnicore.registry.model_types import spec_model_types

    reg = Registry.discover()
    if args.options:
        return _plugins_options(args, reg.rows)
    rows = [(r.as_dict(), r) for r in reg.rows]
    for d, r in rows:  # what `model.foundation: {name: auto}` reads: the model types a foundation serves
        d["model_types"] = list(spec_model_types(r)) if r.kind == "foundation" else []  # type: ignore[assignment]
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
        import json  # here, not at the top: the listing's start-up time (bench/plugins_startup.py)

        for d in out:
            d.pop("import", None)
        print(json.dumps(out, indent=1))
        return 0
    for d in out:
        d["description"] = d["reason"] if d["status"] != "available" else d["description"] + _serves(d["model_types"])
    print(_table(out, columns))
    return 0


def _serves(model_types: list[str]) -> str:
    """The suffix of a foundation's description in the table: ``" [serves: llava]"`` for the model
    types it names in ``ComponentSpec.extra["model_types"]`` (``"*"``, a generic family's, reads
    "any other model type"), ``""`` for none."""
    if not model_types:
        return ""
    from omnicore.registry.model_types import ANY_MODEL_TYPE

    names = ["any other model type" if t == ANY_MODEL_TYPE else t for t in model_types]
    return f" [serves: {', '.join(names)}]"


def _plugins_options(args: argparse.Namespace, rows: list[Any]) -> int:
    """``omnicore plugins --options NAME``: the component's options (name, type, default,
    description) from its options model (:mod:`omnicore.registry.options`), as a table or JSON.
    Imports that model's module alone, not the component's.

    Raises:
        RegistryError: no component or several of that name, or its options model cannot be imported.
    """
    from omnicore.registry.options import describe_options, find_named, refuses_unknown_keys

    spec = find_named(rows, args.options, args.kind)
    row = next(r for r in rows if r.spec is not None and r.spec.key == spec.key and r.spec.target == spec.target)
    options = describe_options(spec)
    if args.json:
        import json

        out = {"component": spec.key, "provider": row.provider, "options_model": spec.options_model}
        out["options"] = None if options is None else [o.as_dict() for o in options]
        print(json.dumps(out, indent=1))
        return 0
    where = f"{spec.key} from {row.provider} {row.version}".rstrip()
    if options is None:
        print(f"{where} declares no options model: its options go to {spec.target} unchecked; see its documentation")
    elif not options:
        print(f"{where} takes no options (any key under options is refused)")
    else:
        strict = "unknown keys are refused" if refuses_unknown_keys(spec) else "unknown keys are not checked"
        print(f"{where}: options ({spec.options_model}; {strict})")
        print(_table([o.as_dict() for o in options], ["name", "type", "default", "description"]))
    return 0


def _plugins_no_load(args: argparse.Namespace) -> int:
    from omnicore.registry import entry_points_info

    rows = [i.as_dict() for i in entry_points_info()]
    if args.json:
        import json

        print(json.dumps(rows, indent=1))
        return 0
    for r in rows:
        r["api"] = r["api"] or "-"
        r["reason"] = r["reason"] or "metadata only (--no-load): hook module not imported"
    print(_table(rows, ["name", "provider", "version", "value", "api", "status", "reason"]))
    return 0


def _config(args: argparse.Namespace, extra: list[str]) -> Any:
    from omnicore.config import load_config
    from omnicore.logs import Phase

    with Phase(logging.getLogger("omnicore.cli"), "reading the config") as ph:
        cfg = load_config(args.config, extra)
        n = sum(1 for x in extra if x.startswith("--"))
        ph.detail = args.config + (f" with {n} override(s)" if n else "")
    return cfg


def cmd_train(args: argparse.Namespace, extra: list[str]) -> int:
    cfg = _config(args, extra + _flag_overrides(args))
    cfg.command = ["train", args.config, *extra]  # what `continue with:` repeats, overrides included (not --no-verify)
    from omnicore.logs import Phase

    with Phase(logging.getLogger("omnicore.cli"), "importing torch and starting the process group") as ph:
        from omnicore.parallel.state import init_parallel_state, shutdown
        from omnicore.train.loop import train
        from omnicore.train.signals import Interrupted

        state = init_parallel_state(cfg.run.device, cfg.parallel.backend, cfg.parallel)
        ph.detail = f"rank {state.rank} of {state.world_size} on {state.device}"
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
    import json

    from omnicore.parallel.plan import make_plan

    report = make_plan(cfg, args.world_size)
    print(json.dumps(report.as_dict(), indent=1) if args.json else report.render())
    return 0 if report.ok else 2


_FLAG_KEYS = {
    "temperature": "generate.temperature",
    "top_k": "generate.top_k",
    "top_p": "generate.top_p",
    "max_new_tokens": "generate.max_new_tokens",
    "batch_size": "generate.batch_size",
    "seed": "run.seed",
}
"""``eval`` / ``generate`` flags and the config keys they set."""


def _flag_overrides(args: argparse.Namespace) -> list[str]:
    """The generation flags given (``--temperature 0.7``) as the dotted overrides they stand for
    (``--generate.temperature 0.7``), so that the config validates them with its usual messages."""
    out: list[str] = []
    for attr, key in _FLAG_KEYS.items():
        if getattr(args, attr, None) is not None:
            out += [f"--{key}", str(getattr(args, attr))]
    if getattr(args, "no_verify", False):
        out += ["--run.verify", "false"]
    return out


def cmd_eval(args: argparse.Namespace, extra: list[str]) -> int:
    cfg = _config(args, extra + _flag_overrides(args))
    from omnicore.eval.scoring import evaluate, task_line

    result = evaluate(cfg, checkpoint=args.checkpoint, export=args.export, limit=args.limit)
    if args.json:
        import json

        print(json.dumps(result, indent=1))
    else:
        for task, r in result["tasks"].items():
            print(task_line(task, r))
        print(f"overall: accuracy {result['accuracy']:.3f} ({result['correct']}/{result['total']}, the tasks with text answers)")
        print(f"held-out loss: {result['loss']:.4f} over {result['loss_targets']} targets (as eval.every's val_loss)")
        print(f"{result['seconds_per_sample']:.3f} s per sample on {result['device']}; every answer in {result['eval_json']}")
    return 0


class UsageError(Exception):
    """A command-line request that would do harm as given (overwrite files without ``--force``)."""


def generate_out_dir(out: str | None, output_dir: str, force: bool) -> str:
    """The folder ``omnicore generate`` writes images to: ``out``, or ``output_dir/generated``.

    Raises:
        UsageError: the folder already holds generated media (``generated-*``) and ``force`` is
            False; the message names the folder, a file, and the two ways on.
    """
    from pathlib import Path

    folder = Path(out) if out is not None else Path(output_dir) / "generated"
    existing = sorted(folder.glob("generated-*")) if folder.is_dir() else []
    if existing and not force:
        more = f" and {len(existing) - 1} more" if len(existing) > 1 else ""
        raise UsageError(
            f"{folder} already holds generated media ({existing[0].name}{more}); pass --force to overwrite them or choose another --out"
        )
    return str(folder)


def cmd_generate(args: argparse.Namespace, extra: list[str]) -> int:
    cfg = _config(args, extra + _flag_overrides(args))
    out_dir = generate_out_dir(args.out, cfg.run.output_dir, args.force)
    from omnicore.eval.generate import generate_cli

    for line in generate_cli(
        cfg,
        prompts=args.prompt,
        image=args.image,
        audio=args.audio,
        video=args.video,
        out_dir=out_dir,
        checkpoint=args.checkpoint,
        export=args.export,
        num_samples=args.num_samples,
        speak=args.speak,
    ):
        print(line)
    return 0


def cmd_fit_tokenizer(args: argparse.Namespace, extra: list[str]) -> int:
    """``omnicore fit-tokenizer CONFIG --vocab-size N --out DIR``: a byte-level BPE fitted on the
    config's training text (:mod:`omnicore.model.text_tokenizer`); prints how much shorter the text
    becomes than with the byte tokenizer."""
    cfg = _config(args, extra)
    from omnicore.model.text_tokenizer import fit_bpe, save_tokenizer, training_texts

    texts = list(training_texts(cfg, limit=args.limit))
    tok = fit_bpe(texts, args.vocab_size)
    model_type = ((cfg.model.foundation.options or {}).get("config") or {}).get("model_type")
    folder = save_tokenizer(tok, args.out, model_type)
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    n_tokens = sum(len(e.ids) for e in tok.encode_batch(texts))
    print(
        f"wrote {folder}: {tok.get_vocab_size()} tokens (at most {args.vocab_size}: the fit stops when no pair of tokens is left "
        f"to merge) fitted on {len(texts)} texts; the training text takes {n_tokens} tokens "
        f"({n_bytes / max(n_tokens, 1):.2f} bytes per token, {n_bytes} with the byte tokenizer)"
    )
    print(
        f"use it with: --model.foundation.options.tokenizer {folder.resolve()} (in the config file a relative path is "
        "relative to the config file's folder)"
    )
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    """``omnicore plot RUN_DIR [--out FILE]``: ``loss.png`` from ``metrics.jsonl`` (:mod:`omnicore.plot`);
    imports matplotlib, never torch."""
    from omnicore.plot import plot_run

    plot = plot_run(args.run_dir, args.out)
    steps = {s for lines in plot.panels.values() for steps, _ in lines.values() for s in steps}
    print(f"wrote {plot.path} (steps {min(steps)}-{max(steps)})")
    return 0


OVERRIDES = """\
Any config key can be overridden after CONFIG by its dotted path, for example
  --train.max_steps 50  --run.output_dir runs/try  --parallel.strategies '[ulysses]'
The value is read as YAML (50 is an int, true a bool, [a, b] a list). A mapping merges into the
file's; null removes a key so that it takes its default (--run.loggers null: back to [jsonl]).
Every key is listed with its description in docs/reference/config.md (generated from
omnicore/config.py, where the keys are defined); docs/config.md explains the sections."""
"""The part of each config-reading subcommand's ``--help`` that explains dotted overrides."""

EXAMPLES = {
    "plugins": "omnicore plugins --kind encoder --check",
    "train": "omnicore train examples/digits/config.yaml --train.max_steps 50 --run.output_dir runs/try",
    "plan": "omnicore plan examples/digits/config.yaml --world-size 8 --parallel.dp_replicate 2",
    "eval": "omnicore eval examples/digits/config.yaml --export runs/digits/export --limit 100",
    "generate": "omnicore generate examples/digits/config.yaml --export runs/digits/export --prompt 'Draw the digit 7.'",
    "plot": "omnicore plot runs/digits --out runs/digits/curves.png",
    "fit-tokenizer": "omnicore fit-tokenizer examples/digits/config.yaml --vocab-size 400 --out examples/digits/data/tokenizer",
}
"""One example of each subcommand's own use; its ``--help`` ends with it (``tests/test_cli_help.py``
parses each one)."""


def _subparser(sub: Any, name: str, text: str, *, config: bool) -> argparse.ArgumentParser:
    """A subcommand whose ``--help`` says ``text``, then (for commands reading a config, with a
    ``config`` argument) how overrides work, and ends with its example from :data:`EXAMPLES`."""
    more = " (dotted overrides such as --train.max_steps 50 may follow)" if config else ""
    sp = sub.add_parser(
        name,
        help=text + more,
        description=text[0].upper() + text[1:] + "." + ("\n\n" + OVERRIDES if config else ""),
        epilog=f"example:\n  {EXAMPLES[name]}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    if config:
        sp.add_argument("config", help="the run's YAML config file")
    sp.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        help="status lines on stderr at this level and above (default: OMNICORE_LOG_LEVEL, else info; ranks other than 0 "
        "show only warnings and errors unless debug)",
    )
    return sp


def _top_parser(cls: type[argparse.ArgumentParser]) -> tuple[argparse.ArgumentParser, Any]:
    """The top-level parser (of class ``cls``) and its subcommand action, with no subcommand yet."""
    p = cls(
        prog="omnicore",
        description="Train omni-modal models from plugins.",
        epilog="Each subcommand has its own help and example: omnicore SUBCOMMAND --help",
    )
    from omnicore import CORE_API_VERSION, __version__  # the package itself: torch-free

    p.add_argument("--version", action="version", version=f"omnicore {__version__} (core API {CORE_API_VERSION})")
    return p, p.add_subparsers(dest="command", required=True, parser_class=argparse.ArgumentParser)


class _ListingParser(argparse.ArgumentParser):
    """The top-level parser of ``omnicore plugins ...``: :func:`build_parser`'s, with the ``plugins``
    subcommand alone. Building the other six subcommands costs a noticeable share of the listing's
    start-up (``bench/plugins_startup.py``). Parsing gives the same namespace, because arguments
    after ``plugins`` go to its subparser, which is built the same way. An error of the top level
    is reported by :func:`build_parser`'s parser, so that its usage line still lists every
    subcommand."""

    def error(self, message: str) -> NoReturn:
        build_parser().error(message)


def _parser_for(argv: list[str]) -> argparse.ArgumentParser:
    """:func:`build_parser`'s parser, or :class:`_ListingParser` when ``argv`` starts with ``plugins``."""
    if argv[:1] != ["plugins"]:
        return build_parser()
    p, sub = _top_parser(_ListingParser)
    _add_plugins(sub)
    return p


def build_parser() -> argparse.ArgumentParser:
    """The ``omnicore`` argument parser; unknown ``--dotted.key VALUE`` pairs are left over for
    :func:`omnicore.config.parse_overrides`."""
    p, sub = _top_parser(argparse.ArgumentParser)
    _add_plugins(sub)
    sp = _subparser(sub, "train", "train from a YAML config", config=True)
    sp.add_argument(
        "--resume",
        nargs="?",
        const=True,
        default=False,
        metavar="CHECKPOINT",
        help="continue from the newest checkpoint in run.output_dir that verifies, or from CHECKPOINT (a folder, or a name such as step-00000004)",
    )
    _add_no_verify(sp)
    sp = _subparser(sub, "plan", "check and size the parallel layout for N ranks without starting processes", config=True)
    sp.add_argument("--world-size", type=int, required=True, metavar="N", help="number of ranks to plan for")
    sp.add_argument("--json", action="store_true", help="print JSON")
    sp = _subparser(sub, "eval", "held-out loss per task, and accuracy on the samples whose answer is text", config=True)
    _add_weights(sp)
    sp.add_argument("--limit", type=int, help="generate answers for only the first N samples with a text answer")
    sp.add_argument("--max-new-tokens", type=int, metavar="N", help="text tokens per answer (sets generate.max_new_tokens)")
    sp.add_argument("--batch-size", type=int, metavar="N", help="prompts per forward (sets generate.batch_size; default 16)")
    sp.add_argument("--json", action="store_true", help="print JSON")
    _add_generate(sub)
    sp = _subparser(sub, "plot", "draw a run's loss, learning rate and tokens/s against step from its metrics.jsonl", config=False)
    sp.add_argument("run_dir", metavar="RUN_DIR", help="a run folder (run.output_dir) holding metrics.jsonl")
    sp.add_argument("--out", metavar="FILE", help="the PNG to write (default: RUN_DIR/loss.png)")
    sp = _subparser(sub, "fit-tokenizer", "fit a byte-level BPE text tokenizer on the config's training text", config=True)
    sp.add_argument("--vocab-size", type=int, required=True, metavar="N", help="tokens in all, the 256 bytes included (>= 256)")
    sp.add_argument("--out", required=True, metavar="DIR", help="the tokenizer folder to write (AutoTokenizer layout)")
    sp.add_argument("--limit", type=int, metavar="N", help="read at most N samples per source")
    return p


def _add_plugins(sub: Any) -> None:
    sp = _subparser(sub, "plugins", "list every installed component, its provider and status", config=False)
    sp.add_argument("--json", action="store_true", help="print JSON instead of a table")
    sp.add_argument("--kind", choices=["encoder", "decoder", "foundation", "parallel", "kernel", "logger"], help="only this kind")
    sp.add_argument(
        "--check", action="store_true", help="import each plugin's hook and component modules in a subprocess; report import time and torch"
    )
    sp.add_argument("--check-timeout", type=float, default=120.0, metavar="S", help="seconds allowed per plugin for --check (default 120)")
    sp.add_argument(
        "--no-load", action="store_true", help="list entry points from metadata only; import no plugin code (to recover from a bad plugin)"
    )
    sp.add_argument(
        "--options",
        metavar="NAME",
        help="list the options of component NAME (or KIND/NAME) with their type, default and description, from its options "
        "model (imports that model's module, which a plugin may have import torch)",
    )


def _add_weights(sp: argparse.ArgumentParser) -> None:
    """``--checkpoint`` / ``--export``: which trained weights ``eval`` and ``generate`` load."""
    sp.add_argument("--checkpoint", help="a checkpoint folder (default: the latest under run.output_dir)")
    sp.add_argument("--export", help="an export folder to load instead of a checkpoint")
    _add_no_verify(sp)


def _add_no_verify(sp: argparse.ArgumentParser) -> None:
    """``--no-verify``: the user's way past a checksum check (sets ``run.verify: false``)."""
    sp.add_argument(
        "--no-verify",
        action="store_true",
        help="load checkpoints and exports without checking their checksum manifests, and resume on changed data files "
        "(sets run.verify false; for files written before checksums existed)",
    )


def _add_generate(sub: Any) -> None:
    sp = _subparser(sub, "generate", "generate text, or images and speech saved as PNG and WAV", config=True)
    _add_weights(sp)
    sp.add_argument("--prompt", required=True, action="append", help="the user's text; repeat for several prompts (batched)")
    sp.add_argument("--num-samples", type=int, default=1, metavar="N", help="answers per prompt (needs --temperature > 0)")
    sp.add_argument("--temperature", type=float, help="0 = greedy; > 0 samples (sets generate.temperature)")
    sp.add_argument("--top-k", type=int, metavar="K", help="sample among the K most likely tokens (sets generate.top_k; 0 = all)")
    sp.add_argument("--top-p", type=float, metavar="P", help="sample among the tokens holding probability P (sets generate.top_p)")
    sp.add_argument("--seed", type=int, help="sampling seed; answer k draws with seed + k (sets run.seed)")
    sp.add_argument("--max-new-tokens", type=int, metavar="N", help="text tokens per answer (sets generate.max_new_tokens)")
    sp.add_argument("--batch-size", type=int, metavar="N", help="answers per forward (sets generate.batch_size)")
    for kind in ("image", "audio", "video"):
        sp.add_argument(
            f"--{kind}",
            action="append",
            metavar="FILE",
            help=f"an input {kind} file: given once it goes with every prompt; repeated, once per --prompt, in order",
        )
    sp.add_argument(
        "--speak",
        action="store_true",
        help="also speak each answer, saved as a WAV (a foundation that has speak(); needs --export)",
    )
    sp.add_argument(
        "--out",
        metavar="DIR",
        help="folder for generated images and speech (PNG, WAV; default: RUN_DIR/generated, RUN_DIR being run.output_dir)",
    )
    sp.add_argument(
        "--force", action="store_true", help="overwrite generated images and speech already in the --out folder (refused without it)"
    )


def main(argv: list[str] | None = None) -> int:
    """``omnicore ARGS``: parse them, configure logging for the command (undone on return, so that an
    in-process call leaves logging as it found it), run the subcommand; returns the exit status."""
    from omnicore.logs import reset_logging

    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _parser_for(argv)
    args, extra = parser.parse_known_args(argv)
    _start_logging(parser, args)
    try:
        return _run(parser, args, extra)
    finally:
        reset_logging()


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace, extra: list[str]) -> int:
    """The subcommand of ``args``, its user errors as one ``error: ...`` line on stderr (status 2)."""
    from omnicore.registry import RegistryError

    if args.command == "plugins":  # kept light: no config (pydantic) import, no torch
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        if args.no_load and (args.check or args.kind):
            parser.error("--no-load lists entry points without loading them; it cannot be combined with --check or --kind")
        if args.options and (args.check or args.no_load):
            parser.error("--options lists one component's options from its options model; it cannot be combined with --check or --no-load")
        try:
            return cmd_plugins(args)
        except RegistryError as exc:  # OMNICORE_STRICT=1 and a plugin failed
            _print_error(str(exc), alike=True)
            return 2
        except BrokenPipeError:  # `omnicore plugins | head`: the reader has all it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
            return 0
    if args.command == "plot":  # kept light: no torch, no config
        return _light(parser, args, extra, cmd_plot)
    from omnicore.config import ConfigError

    handlers = {"train": cmd_train, "plan": cmd_plan, "eval": cmd_eval, "generate": cmd_generate, "fit-tokenizer": cmd_fit_tokenizer}
    user_errors: tuple[type[BaseException], ...] = (ConfigError, RegistryError, UsageError)
    alike: tuple[type[BaseException], ...] = user_errors  # met by every rank alike (omnicore.logs.error_line)
    try:
        from omnicore.checkpoint.dcp import CheckpointError
        from omnicore.data.jsonl import SampleError
        from omnicore.data.loader import DataWorkerError
        from omnicore.data.packing import PackingError
        from omnicore.data.state import DataResumeError
        from omnicore.parallel.mesh import MeshError
        from omnicore.parallel.parallelize import ParallelizeError
        from omnicore.train.optim import NonFiniteError

        user_errors += (SampleError, CheckpointError, PackingError, MeshError, ParallelizeError, NonFiniteError)
        user_errors += (DataResumeError, DataWorkerError)
        # checkpoints are verified (and saves agreed) on every rank; a non-finite step is all-reduced
        alike += (CheckpointError, MeshError, ParallelizeError, NonFiniteError)
        return handlers[args.command](args, extra)
    except user_errors as exc:
        from omnicore.logs import ECHO_ATTRIBUTE

        _print_error(str(exc), alike=isinstance(exc, alike), echo=bool(getattr(exc, ECHO_ATTRIBUTE, False)))
        return 2
    except OSError as exc:  # the file system said no: a user's problem to fix, in one line
        _print_error(describe_os_error(exc), alike=False)
        return 2


def _print_error(message: str, *, alike: bool, echo: bool = False) -> None:
    """Print a user error's ``error: ...`` line on stderr, once per run under torchrun
    (:func:`omnicore.logs.error_line`: rank 0 alone for an error every rank meets ``alike``, else
    each failing rank with its ``[rankN]`` prefix; an echo of another rank's failure not at all)."""
    from omnicore.logs import error_line

    line = error_line(message, alike=alike, echo=echo)
    if line is not None:
        print(line, file=sys.stderr)


def _start_logging(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Configure logging for the command, before anything logs (:func:`omnicore.logs.setup_logging`:
    the rank-aware format on stderr, warnings routed through it); a bad ``OMNICORE_LOG_LEVEL`` is a
    usage error."""
    from omnicore.logs import setup_logging

    try:
        setup_logging(args.log_level)
    except ValueError as exc:
        parser.error(str(exc))


def _light(parser: argparse.ArgumentParser, args: argparse.Namespace, extra: list[str], handler: Any) -> int:
    """Run a subcommand that takes no config overrides, with its user errors as one line."""
    from omnicore.plot import PlotError

    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return handler(args)
    except PlotError as exc:
        _print_error(str(exc), alike=True)
        return 2
    except OSError as exc:
        _print_error(describe_os_error(exc), alike=True)
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
