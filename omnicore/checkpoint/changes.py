"""What a resume changes: the settings that differ from the checkpoint's, each applied or refused;
and the command line that continues a run.

A checkpoint keeps the config its run was given (``trainer_state.json``, key ``config``). At
``--resume`` :func:`resume_changes` compares it with this run's, setting by setting (dotted keys),
and sorts each difference:

* **refused** (a :class:`ResumeError` naming each with both values): what the saved state depends
  on: the model (``model.*``, except the kernels), which parameters train (``train.freeze``) and in
  which optimizer groups (``train.lr_multipliers``), the parameters' dtype (``run.dtype``), the data
  stream (``run.seed``, ``data.*`` except the reading settings ``num_workers``, ``prefetch_factor``,
  ``pin_memory`` and the held-out ``eval`` file);
* **applied**, and listed at resume: everything else. The learning rate and its schedule
  (``train.lr``, ``max_steps``, ``warmup_steps``, ``min_lr_ratio``) are rebuilt from this run's
  config at the checkpoint's step (:func:`omnicore.train.optim.build_schedule`), and the optimizer's
  ``weight_decay`` and ``betas`` are this run's; the log says the next step's learning rate before
  and after;
* ``model.init_from`` is not used by a resumed run (its own checkpoint holds the weights);
  ``run.output_dir`` is where the checkpoint was found and ``run.verify`` how this command reads
  files: neither is compared.

``train.max_steps`` at or below the checkpoint's step is an error (nothing left to train), except
for the checkpoint of a finished run (its step is the ``max_steps`` it was given, and still is) with
``train.export`` on: that resume trains nothing and exports the run again (:func:`finished_run`), so
an export that failed (a full disk) is made once the cause is fixed.
"""

from __future__ import annotations

import os
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnicore.checkpoint.errors import CheckpointError
from omnicore.config import Config, ConfigError

NOT_COMPARED = ("run.output_dir", "run.verify")
"""Keys left out of the comparison: the checkpoint was found under this run's ``run.output_dir``,
and ``run.verify`` is how this command reads files, not a setting of the run."""

REFUSED: tuple[tuple[str, str], ...] = (
    ("model.kernels", ""),  # an attention or norm kernel computes the same model: applied
    ("model.init_from", ""),
    ("model.", "the model's parameters"),
    ("train.freeze", "which parameters train, and so the optimizer's state"),
    ("train.lr_multipliers", "the optimizer's parameter groups"),
    ("run.dtype", "the parameters' dtype"),
    ("run.seed", "the data order and every random stream"),
    ("data.num_workers", ""),
    ("data.prefetch_factor", ""),
    ("data.pin_memory", ""),
    ("data.eval", ""),
    ("data.", "the data stream (which samples come next)"),
)
"""``(prefix, why)``, first match wins: a non-empty ``why`` refuses a change (what the saved state
depends on); an empty one lets it through."""

SCHEDULE = ("train.lr", "train.max_steps", "train.warmup_steps", "train.min_lr_ratio")
"""The settings of the learning rate at a step."""


class ResumeError(CheckpointError):
    """A resume with settings the checkpoint's state cannot take; the message names each setting
    with the checkpoint's value and this run's."""


@dataclass(frozen=True)
class Change:
    """One setting that differs: ``key`` (dotted), the checkpoint's value ``was``, this run's
    ``now``, and ``refused`` (why it cannot change; empty when it is applied)."""

    key: str
    was: Any
    now: Any
    refused: str = ""

    def describe(self) -> str:
        if self.key == "model.init_from":
            return f"{self.key} {self.was!r} -> {self.now!r} (not used: a resumed run starts from its own checkpoint)"
        return f"{self.key} {self.was!r} -> {self.now!r}" + (" (refused)" if self.refused else " (applied)")


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A nested JSON dict as ``{dotted key: leaf}`` (lists are leaves; an empty dict has none, so
    that it equals a missing one)."""
    if not isinstance(tree, dict):
        return {prefix.rstrip("."): tree}
    out: dict[str, Any] = {}
    for k, v in tree.items():
        out.update(flatten(v, f"{prefix}{k}."))
    return out


def config_json(cfg: Config) -> dict[str, Any]:
    """The config as a checkpoint keeps it (JSON-ready, ``source`` and ``command`` left out)."""
    return cfg.model_dump(mode="json")


def _why_refused(key: str) -> str:
    for prefix, why in REFUSED:
        if key == prefix or key.startswith(prefix if prefix.endswith(".") else prefix + "."):
            return why
    return ""


def resume_changes(saved: dict[str, Any] | None, cfg: Config, given: dict[str, Any] | None = None) -> list[Change]:
    """Every setting of this run that differs from ``saved`` (a checkpoint's ``config``; None for a
    checkpoint written before configs were kept: no change is known), in key order. ``given``: this
    run's config as :func:`config_json` gives it (default: of ``cfg``)."""
    if not saved:
        return []
    try:  # the checkpoint's config as this omnicore reads it: fields added since then take their defaults
        saved = Config.model_validate(saved).model_dump(mode="json")
    except ValueError:  # a field this omnicore no longer has: compared as written
        pass
    was, now = flatten(saved), flatten(given if given is not None else config_json(cfg))
    out = []
    for key in sorted(set(was) | set(now)):
        if key in NOT_COMPARED or was.get(key) == now.get(key):
            continue
        out.append(Change(key, was.get(key), now.get(key), _why_refused(key)))
    return out


def check_resume_changes(changes: list[Change], cfg: Config, step: int, folder: Path) -> None:
    """Refuse what cannot change, and a ``train.max_steps`` with nothing left to train.

    Raises:
        ResumeError: some change is refused; one line names each with both values and why.
        ConfigError: ``train.max_steps`` is at or below ``step``, unless the run finished there and
            is only exported again (:func:`finished_run`).
    """
    refused = [c for c in changes if c.refused]
    if refused:
        what = "; ".join(f"{c.key}: {c.was!r} in the checkpoint, {c.now!r} now ({c.refused})" for c in refused)
        raise ResumeError(
            f"cannot resume from {folder}: {len(refused)} setting(s) differ from the checkpoint's and cannot change in a resumed "
            f"run: {what}; resume with the checkpoint's values, or start a new run (another run.output_dir) from its weights "
            f"with --model.init_from {folder}"
        )
    if cfg.train.max_steps <= step and not finished_run(changes, cfg, step):
        raise ConfigError(
            f"{cfg.source or 'config'}: train.max_steps {cfg.train.max_steps} is at or below the checkpoint's step {step} ({folder}): "
            f"nothing is left to train; give a larger one (--train.max_steps N with N > {step}), or start a new run"
        )


def finished_run(changes: list[Change], cfg: Config, step: int) -> bool:
    """Whether a resume at ``step`` is of a finished run that is only to be exported again: ``step``
    is this run's ``train.max_steps``, unchanged from the checkpoint's config, and ``train.export``
    is on."""
    return cfg.train.export and cfg.train.max_steps == step and not any(c.key == "train.max_steps" for c in changes)


def describe_changes(changes: list[Change], step: int, lr_before: float, lr_now: float, finished: bool = False) -> str:
    """The resume's log line: every difference and what was done with it, and the learning rate of
    the next step under the checkpoint's schedule and under this run's. ``finished``: the run ended
    at ``step`` (:func:`finished_run`), so no step trains with the changes, and the line says so and
    how to train on instead of naming a learning rate no step will use."""
    if not changes:
        return f"resume from step {step}: the settings are the checkpoint's"
    line = f"resume from step {step}: {len(changes)} setting(s) differ from the checkpoint's: " + "; ".join(c.describe() for c in changes)
    if finished:
        line += (
            f"; the run finished at step {step} (train.max_steps), so no step trains with them: to train on, give "
            f"--train.max_steps N with N > {step}"
        )
    elif any(c.key in SCHEDULE for c in changes):
        line += f"; the learning rate of step {step + 1} is {lr_now:.4g} (the checkpoint's schedule: {lr_before:.4g})"
    return line


def continue_command(cfg: Config) -> str:
    """The command line that continues this run: the one that started it (``cfg.command``, set by
    the CLI: the config file and every override) with ``--resume``, under the same ``torchrun``
    prefix when this process was started by torchrun (read from the launcher's command line where
    the system shows it, ``/proc``; else rebuilt from torchrun's environment variables)."""
    args = list(cfg.command) if cfg.command else ["train", cfg.source or "CONFIG", "--run.output_dir", cfg.run.output_dir]
    return shlex.join(_launcher() + args + ["--resume"])


def _launcher() -> list[str]:
    """What comes before ``train``: ``omnicore``, or the torchrun launch ending in ``-m omnicore``."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return ["omnicore"]
    parent = _parent_command()
    for i in range(len(parent) - 1):
        if parent[i] == "-m" and parent[i + 1] == "omnicore":
            head = parent[:i]
            if len(head) > 1 and Path(head[1]).name == "torchrun":  # the console script, run by its interpreter
                head = ["torchrun"] + head[2:]
            elif head and Path(head[0]).name == "torchrun":
                head[0] = "torchrun"
            elif head and shutil.which(Path(head[0]).name) == head[0]:
                head[0] = Path(head[0]).name  # python -m torch.distributed.run, with the python on PATH
            return head + ["-m", "omnicore"]
    nodes = max(1, int(os.environ.get("WORLD_SIZE", "1")) // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
    return ["torchrun", f"--nnodes={nodes}", f"--nproc-per-node={os.environ.get('LOCAL_WORLD_SIZE', '1')}", "-m", "omnicore"]


def load_for_resume(
    folder: Path, given: dict[str, Any], cfg: Config, model: Any, optimizer: Any, state: Any, log: Any, build_schedule: Any
) -> tuple[dict[str, Any], Any]:
    """Load ``folder`` (verified) into ``model`` and ``optimizer`` as this run's config says: the
    changes against the checkpoint's config (``given``: this run's, as the user gave it) refused
    before anything is read, or listed in the log and applied; returns the trainer state and the LR
    schedule at the checkpoint's step, made by ``build_schedule(optimizer, cfg, step)`` (the
    training loop's :func:`omnicore.train.optim.build_schedule`, passed in: this layer is below it).

    Raises:
        ResumeError, ConfigError: as :func:`check_resume_changes`.
        CheckpointError: as :func:`omnicore.checkpoint.dcp.load_checkpoint`.
    """
    import json

    from omnicore.checkpoint.dcp import load_checkpoint

    try:
        saved = json.loads((folder / "trainer_state.json").read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{folder / 'trainer_state.json'}: unreadable ({e}); resume from an earlier checkpoint") from e
    changes = resume_changes(saved.get("config"), cfg, given)
    check_resume_changes(changes, cfg, int(saved["step"]), folder)
    fresh = [(g["weight_decay"], g["betas"]) for g in optimizer.param_groups]
    meta = load_checkpoint(folder, model, optimizer, None, state, verify=False)  # verified by the caller
    for group, (decay, betas) in zip(optimizer.param_groups, fresh):
        group["weight_decay"], group["betas"] = decay, betas  # this run's, as its config says
    factor = optimizer.param_groups[0].get("factor", 1.0)
    before = optimizer.param_groups[0]["lr"] / factor
    scheduler = build_schedule(optimizer, cfg, int(meta["scheduler"]["last_epoch"]))
    if "config" not in saved:
        log(f"resume from step {meta['step']}: {folder} keeps no config (an older omnicore wrote it): settings are not compared")
    else:
        log(
            describe_changes(
                changes, int(meta["step"]), before, optimizer.param_groups[0]["lr"] / factor, finished_run(changes, cfg, int(meta["step"]))
            )
        )
    if finished_run(changes, cfg, int(meta["step"])):
        log(
            f"resume from step {meta['step']}: the run finished at this step (train.max_steps); nothing is left to train, so it is only exported"
        )
    return meta, scheduler


def _parent_command() -> list[str]:
    """The command line of this process's parent (the torchrun agent), where ``/proc`` shows it."""
    try:
        return Path(f"/proc/{os.getppid()}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []
