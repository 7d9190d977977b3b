"""The ``omnicore`` command line, run in subprocesses: ``plugins`` (table, --json, --kind), torch-free
listing, a broken plugin shown as a failed row, and clean one-line user errors from ``train``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from omnicore.testing import write_fake_distribution

KINDS = ("encoder", "decoder", "foundation", "parallel", "kernel")
EXPECTED = [  # (kind, name, provider) in the order `omnicore plugins` lists them
    ("encoder", "siglip", "omnicore-image-siglip"),
    ("encoder", "whisper", "omnicore-audio-whisper"),
    ("decoder", "movqgan", "omnicore-image-movqgan"),
    ("foundation", "hf_causal_lm", "omnicore"),
    ("parallel", "fsdp2", "omnicore"),
    ("parallel", "none", "omnicore"),
    ("kernel", "eager", "omnicore"),
    ("kernel", "sdpa", "omnicore"),
]
HEADER = ["KIND", "NAME", "PROVIDER", "VERSION", "STATUS", "DESCRIPTION"]
JSON_KEYS = {"kind", "name", "provider", "version", "status", "reason", "description"}


def console_script() -> str:
    script = Path(sys.executable).parent / "omnicore"
    if script.is_file():
        return str(script)
    found = shutil.which("omnicore")
    assert found, "the omnicore console script is not installed"
    return found


COMMANDS = {
    "module": [sys.executable, "-m", "omnicore"],
    "script": [console_script()],
}


def env_with(pythonpath: Path | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNICORE_")}
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(pythonpath)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(extra)
    return env


def run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env or env_with(), capture_output=True, text=True, timeout=timeout)


def parse_table(out: str) -> tuple[list[str], list[list[str]]]:
    lines = out.rstrip("\n").splitlines()
    header = lines[0].split()
    rows = [line.split(None, 5) for line in lines[1:]]
    return header, rows


@pytest.fixture
def fake_site(tmp_path) -> Path:
    """A broken distribution (entry point naming a missing module) and a healthy one."""
    site = tmp_path / "site"
    write_fake_distribution(site, "omnicore-broken", "0.3.0", {"broken": "cli_fake_missing_module"}, {})
    write_fake_distribution(
        site,
        "omnicore-cli-fake",
        "1.2.3",
        {"clifake": "cli_fake_plugin"},
        {
            "cli_fake_plugin": """
                from omnicore.components import ComponentSpec
                from omnicore.hookspecs import hookimpl

                @hookimpl
                def omnicore_encoders():
                    return [ComponentSpec(kind="encoder", name="clifake", target="cli_fake_plugin:build",
                                          modalities=("video",), description="fake video encoder")]
            """
        },
    )
    return site


# ---- omnicore plugins ---------------------------------------------------------------------------


@pytest.mark.parametrize("how", sorted(COMMANDS))
def test_plugins_table(tmp_path, how):
    r = run(COMMANDS[how] + ["plugins"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    header, rows = parse_table(r.stdout)
    assert header == HEADER
    assert [(row[0], row[1], row[2]) for row in rows] == EXPECTED  # one row per component, in kind order
    assert {row[0] for row in rows} == set(KINDS)
    for row in rows:
        assert row[3] == "0.1.0" and row[4] == "available"
        assert len(row) == 6 and row[5]  # a description
    sdpa = next(row for row in rows if row[1] == "sdpa")
    assert sdpa[5] == "torch scaled_dot_product_attention through transformers; packed samples kept apart"
    # columns are aligned under the header
    lines = r.stdout.splitlines()
    col = lines[0].index("STATUS")
    assert all(line[col:].startswith("available") for line in lines[1:])


@pytest.mark.parametrize("how", sorted(COMMANDS))
def test_plugins_json(tmp_path, how):
    r = run(COMMANDS[how] + ["plugins", "--json"], tmp_path)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert isinstance(data, list)
    assert [(d["kind"], d["name"], d["provider"]) for d in data] == EXPECTED
    for d in data:
        assert JSON_KEYS <= set(d), set(d)
        assert all(isinstance(v, str) for v in d.values())
        assert (d["version"], d["status"], d["reason"]) == ("0.1.0", "available", "")
    whisper = next(d for d in data if d["name"] == "whisper")
    assert whisper["target"] == "omnicore_audio_whisper.encoder:build"
    assert whisper["entry_point"] == "omnicore_audio_whisper.plugin"
    # same components as the table
    table = run(COMMANDS[how] + ["plugins"], tmp_path)
    _, rows = parse_table(table.stdout)
    assert [(row[0], row[1], row[2], row[3], row[4], row[5]) for row in rows] == [
        (d["kind"], d["name"], d["provider"], d["version"], d["status"], d["description"]) for d in data
    ]


def test_plugins_kind_filter(tmp_path):
    cmd = COMMANDS["module"]
    r = run(cmd + ["plugins", "--kind", "encoder"], tmp_path)
    assert r.returncode == 0, r.stderr
    header, rows = parse_table(r.stdout)
    assert header == HEADER
    assert [(row[0], row[1]) for row in rows] == [("encoder", "siglip"), ("encoder", "whisper")]
    r = run(cmd + ["plugins", "--kind", "kernel", "--json"], tmp_path)
    assert [(d["kind"], d["name"]) for d in json.loads(r.stdout)] == [("kernel", "eager"), ("kernel", "sdpa")]
    r = run(cmd + ["plugins", "--kind", "encoders"], tmp_path)
    assert r.returncode == 2
    assert "invalid choice: 'encoders'" in r.stderr
    r = run(cmd + ["plugins", "--bogus"], tmp_path)
    assert r.returncode == 2
    assert "unrecognized arguments: --bogus" in r.stderr


NO_TORCH = """
import sys
sys.argv = ["omnicore"] + sys.argv[1:]
from omnicore.cli import main
rc = main()
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers", "diffusers", "omnicore_audio_whisper.encoder"))
heavy += sorted(m for m in sys.modules if m.endswith((".encoder", ".decoder")) and m.startswith("omnicore_"))
print("RC", rc, "HEAVY", ",".join(heavy) or "none", file=sys.stderr)
sys.exit(rc if not heavy else 99)
"""


@pytest.mark.parametrize("args", [["plugins"], ["plugins", "--json"], ["plugins", "--kind", "decoder"]], ids=" ".join)
def test_plugins_does_not_import_torch(tmp_path, args):
    r = run([sys.executable, "-c", NO_TORCH] + args, tmp_path)
    assert r.stderr.strip().splitlines()[-1] == "RC 0 HEAVY none", r.stderr
    assert r.returncode == 0
    assert r.stdout.strip()  # the command did print its listing


def test_plugins_importtime_has_no_torch(tmp_path):
    r = run([sys.executable, "-X", "importtime", "-m", "omnicore", "plugins"], tmp_path)
    assert r.returncode == 0
    imported = {line.split("|")[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}
    assert "omnicore.registry" in imported and "pluggy" in imported  # the trace is real
    assert "omnicore.builtin.plugin" in imported
    assert not {m for m in imported if m.split(".")[0] in ("torch", "transformers", "diffusers")}


@pytest.mark.parametrize("how", sorted(COMMANDS))
def test_broken_plugin_is_a_failed_row(tmp_path, fake_site, how):
    env = env_with(fake_site)
    r = run(COMMANDS[how] + ["plugins"], tmp_path, env)
    assert r.returncode == 0, r.stderr
    header, rows = parse_table(r.stdout)
    assert header == HEADER
    by_name = {row[1]: row for row in rows}
    failed = by_name["broken"]
    assert failed[:5] == ["-", "broken", "omnicore-broken", "0.3.0", "failed"]
    assert failed[5].startswith("entry point 'broken = cli_fake_missing_module' of omnicore-broken 0.3.0 failed to import: ModuleNotFoundError")
    assert rows[-1] == failed  # failed plugins list after the components
    assert by_name["clifake"][:5] == ["encoder", "clifake", "omnicore-cli-fake", "1.2.3", "available"]
    assert {(row[0], row[1], row[2]) for row in rows} >= set(EXPECTED)
    assert len(rows) == len(EXPECTED) + 2

    r = run(COMMANDS[how] + ["plugins", "--json"], tmp_path, env)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    (bad,) = [d for d in data if d["status"] == "failed"]
    assert (bad["kind"], bad["name"], bad["provider"], bad["version"]) == ("-", "broken", "omnicore-broken", "0.3.0")
    assert "ModuleNotFoundError" in bad["reason"] and "cli_fake_missing_module" in bad["reason"]
    assert {(d["kind"], d["name"], d["provider"]) for d in data if d["status"] == "available"} == set(EXPECTED) | {
        ("encoder", "clifake", "omnicore-cli-fake")
    }

    # --kind keeps failed plugins visible (they might have provided that kind)
    r = run(COMMANDS[how] + ["plugins", "--kind", "kernel", "--json"], tmp_path, env)
    assert [(d["kind"], d["name"], d["status"]) for d in json.loads(r.stdout)] == [
        ("kernel", "eager", "available"),
        ("kernel", "sdpa", "available"),
        ("-", "broken", "failed"),
    ]


def test_disabled_and_strict_env_in_cli(tmp_path, fake_site):
    r = run(COMMANDS["module"] + ["plugins", "--json"], tmp_path, env_with(fake_site, OMNICORE_DISABLE_PLUGINS="broken,omnicore-image-siglip"))
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert sorted((d["name"], d["status"]) for d in data if d["status"] != "available") == [("broken", "disabled"), ("siglip", "disabled")]
    assert "siglip" not in {d["name"] for d in data if d["status"] == "available"}
    r = run(COMMANDS["module"] + ["plugins"], tmp_path, env_with(fake_site, OMNICORE_STRICT="1"))
    assert r.returncode == 2, r.stderr
    assert r.stdout == "" and "Traceback" not in r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("error: entry point 'broken = cli_fake_missing_module' of omnicore-broken 0.3.0 failed to import: ModuleNotFoundError")
    assert line.endswith("(strict mode: OMNICORE_STRICT=1)")


# ---- user errors from train ---------------------------------------------------------------------


def test_train_with_misspelt_key_exits_2_with_one_line(tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("data:\n  train: train.jsonl\ntrain:\n  max_step: 3\n")
    r = run(COMMANDS["script"] + ["train", "config.yaml"], tmp_path, timeout=120)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stdout == ""
    assert "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == ["error: config.yaml: train.max_step: unknown key; did you mean 'max_steps'?"]


def test_train_misspelt_override_exits_2_with_one_line(tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("data:\n  train: train.jsonl\n")
    r = run(COMMANDS["module"] + ["train", "config.yaml", "--run.sed", "3"], tmp_path, timeout=120)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == ["error: config.yaml: run.sed: unknown key; did you mean 'seed'?"]


def test_train_missing_config_file_exits_2(tmp_path):
    r = run(COMMANDS["module"] + ["train", "nope.yaml"], tmp_path, timeout=120)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.strip().splitlines() == ["error: config file not found: nope.yaml"]
