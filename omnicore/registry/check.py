"""``omnicore plugins --check``: import each plugin in a fresh subprocess and report time and torch.

A plugin's hook module and its components' target modules are imported in a child Python process,
so a plugin that raises, exits, segfaults or hangs on import only gives a failed
:class:`CheckResult`; the listing process itself imports none of it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from omnicore.registry.discovery import Registry

_CHECK_SCRIPT = r"""
import importlib, json, sys, time
hook, targets = sys.argv[1], sys.argv[2:]
out = {"hook_s": 0.0, "targets_s": 0.0, "hook_torch": False, "torch": False, "error": ""}
try:
    t = time.perf_counter()
    importlib.import_module(hook)
    out["hook_s"] = time.perf_counter() - t
    out["hook_torch"] = "torch" in sys.modules
    t = time.perf_counter()
    for mod in targets:
        importlib.import_module(mod)
    out["targets_s"] = time.perf_counter() - t
except BaseException as exc:
    out["error"] = f"{type(exc).__name__}: {exc}".replace("\n", " ")
out["torch"] = "torch" in sys.modules
sys.stdout.flush()
print("\n@@omnicore-check@@" + json.dumps(out))
"""


@dataclass
class CheckResult:
    """Outcome of importing one plugin in a fresh subprocess (``omnicore plugins --check``).

    ``import_s`` is the time to import the hook module plus every component's target module, in
    seconds; ``torch`` says whether torch was imported by then (``hook_torch``: already by the hook
    module, which breaks the hook-module contract). ``ok`` is False when an import raised, the
    process crashed or it timed out; ``error`` then says which, in one line.
    """

    ok: bool
    import_s: float = 0.0
    torch: bool = False
    hook_torch: bool = False
    error: str = ""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"ok": self.ok, "import_s": round(self.import_s, 4), "torch": self.torch, "hook_torch": self.hook_torch, "error": self.error}

    def summary(self) -> str:
        """One line for the table: ``ok 0.012s`` / ``ok 3.1s torch`` / ``FAILED: ...``."""
        if not self.ok:
            return f"FAILED: {self.error}"
        note = " torch (in hook module!)" if self.hook_torch else (" torch" if self.torch else "")
        return f"ok {self.import_s:.3f}s{note}"


def check_import(hook_module: str, targets: Iterable[str] = (), timeout: float = 60.0) -> CheckResult:
    """Import ``hook_module`` then each target module in a fresh Python subprocess and report.

    A crash inside the imports (an exception, ``os._exit``, a segfault, a hang past ``timeout``
    seconds) only makes the result ``ok=False`` with the reason; it never raises.
    """
    import json
    import signal
    import subprocess
    import sys

    cmd = [sys.executable, "-c", _CHECK_SCRIPT, hook_module, *sorted(set(targets))]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return CheckResult(False, timeout, error=f"import timed out after {timeout:g}s")
    marker = "@@omnicore-check@@"
    line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith(marker)), None)
    if line is None or proc.returncode != 0:
        if proc.returncode < 0:
            try:
                how = f"killed by {signal.Signals(-proc.returncode).name}"
            except ValueError:
                how = f"killed by signal {-proc.returncode}"
        else:
            how = f"exited with status {proc.returncode}"
        tail = (proc.stderr.strip().splitlines() or [""])[-1]
        return CheckResult(False, error=f"import process {how} before reporting" + (f": {tail}" if tail else ""))
    data = json.loads(line[len(marker) :])
    return CheckResult(not data["error"], data["hook_s"] + data["targets_s"], data["torch"], data["hook_torch"], data["error"])


def check_plugins(
    reg: Registry, timeout: float = 60.0, workers: int | None = None, only: Iterable[tuple[str, str]] | None = None
) -> dict[tuple[str, str], CheckResult]:
    """Run :func:`check_import` once per plugin of ``reg`` that is not disabled or incompatible.

    Returns results keyed by ``(provider, entry_point)``, the two fields every row carries; ``only``
    restricts the check to those keys (``omnicore plugins --check --kind encoder``). The
    targets checked are the plugin's components' ``target`` and ``options_model`` modules (none for
    a plugin that failed to register). Plugins are checked concurrently (``workers`` processes,
    default: the CPU count, at most 4).
    """
    from concurrent.futures import ThreadPoolExecutor

    plugins: dict[tuple[str, str], set[str]] = {}
    keep = None if only is None else set(only)
    for row in reg.rows:
        if row.status in ("disabled", "incompatible") or (keep is not None and (row.provider, row.entry_point) not in keep):
            continue
        if not row.entry_point:
            continue  # a distribution whose metadata could not be read names no module to import
        mods = plugins.setdefault((row.provider, row.entry_point), set())
        if row.spec is not None:
            mods.add(row.spec.target.partition(":")[0])
            if row.spec.options_model:
                mods.add(row.spec.options_model.partition(":")[0])
    hook_of = {key: ("omnicore.builtins" if key[1] == "builtin" else key[1].partition(":")[0]) for key in plugins}
    workers = workers or min(4, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {key: pool.submit(check_import, hook_of[key], mods, timeout) for key, mods in plugins.items()}
        return {key: f.result() for key, f in futures.items()}
