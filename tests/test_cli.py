"""The ``omnicore`` command line, run in subprocesses: ``plugins`` (table, --json, --kind), torch-free
listing, a broken plugin shown as a failed row, and clean one-line user errors from ``train``."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from omnicore.testing import write_fake_distribution

KINDS = ("encoder", "decoder", "foundation", "parallel", "kernel", "logger")
EXPECTED = [  # (kind, name, provider) in the order `omnicore plugins` lists them
    ("encoder", "siglip", "omnicore-image-siglip"),
    ("encoder", "whisper", "omnicore-audio-whisper"),
    ("decoder", "movqgan", "omnicore-image-movqgan"),
    ("foundation", "hf_causal_lm", "omnicore"),
    ("parallel", "activation_checkpointing", "omnicore"),
    ("parallel", "compile", "omnicore"),
    ("parallel", "ep", "omnicore"),
    ("parallel", "fsdp2", "omnicore"),
    ("parallel", "none", "omnicore"),
    *(
        ("kernel", k, "omnicore")
        for k in ("chunked_cross_entropy", "eager", "sdpa", "sdpa_varlen", "torch_cross_entropy", "torch_rms_norm")
    ),
    ("logger", "jsonl", "omnicore"),
]
BUILTIN_KERNELS = [name for kind, name, _ in EXPECTED if kind == "kernel"]
HEADER = ["KIND", "NAME", "PROVIDER", "VERSION", "STATUS", "DESCRIPTION"]
JSON_KEYS = {"kind", "name", "provider", "version", "status", "reason", "description", "entry_point", "target", "api", "model_types"}


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


def _other_installed() -> set[str]:
    """Distributions with ``omnicore`` entry points installed in this venv beyond the first-party
    ones (contrib plugins, experiments): the listings below ignore their rows."""
    from importlib import metadata

    first_party = {p for _, _, p in EXPECTED}
    return {ep.dist.metadata["Name"] for ep in metadata.entry_points(group="omnicore") if ep.dist is not None} - first_party


OTHERS = _other_installed()


def parse_table(out: str, columns: int = 6) -> tuple[list[str], list[list[str]]]:
    lines = out.rstrip("\n").splitlines()
    header = lines[0].split()
    rows = [line.split(None, columns - 1) for line in lines[1:]]
    return header, [r for r in rows if r[2] not in OTHERS]


def rows_json(out: str) -> list[dict]:
    return [d for d in json.loads(out) if d["provider"] not in OTHERS]


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
                from omnicore.api import ComponentSpec, hookimpl

                @hookimpl
                def omnicore_encoders():
                    return [ComponentSpec(name="clifake", target="cli_fake_plugin:build", processor="cli_fake_plugin:build",
                                          modalities=("video",), description="fake video encoder")]
            """
        },
    )
    return site


# ---- omnicore plugins ---------------------------------------------------------------------------


@pytest.mark.cli
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
    assert all(line[col:].startswith(("available", "unavailable")) for line in lines[1:])  # GPU-only kernels: unavailable on CPU


@pytest.mark.cli
@pytest.mark.parametrize("how", sorted(COMMANDS))
def test_plugins_json(tmp_path, how):
    r = run(COMMANDS[how] + ["plugins", "--json"], tmp_path)
    assert r.returncode == 0, r.stderr
    data = rows_json(r.stdout)
    assert isinstance(data, list)
    assert [(d["kind"], d["name"], d["provider"]) for d in data] == EXPECTED
    for d in data:
        assert JSON_KEYS <= set(d), set(d)
        assert all(isinstance(v, str) for k, v in d.items() if k != "model_types")
        assert d["model_types"] == []  # none of these foundations names a model type (tests/test_model_types.py: one that does)
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


@pytest.mark.cli
def test_plugins_kind_filter(tmp_path):
    cmd = COMMANDS["module"]
    r = run(cmd + ["plugins", "--kind", "encoder"], tmp_path)
    assert r.returncode == 0, r.stderr
    header, rows = parse_table(r.stdout)
    assert header == HEADER
    assert [(row[0], row[1]) for row in rows] == [("encoder", "siglip"), ("encoder", "whisper")]
    r = run(cmd + ["plugins", "--kind", "kernel", "--json"], tmp_path)
    assert [(d["kind"], d["name"]) for d in rows_json(r.stdout)] == [("kernel", k) for k in BUILTIN_KERNELS]
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
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers", "diffusers", "wandb", "mlflow", "tensorboard", "sqlalchemy"))
heavy += sorted(m for m in sys.modules if m.endswith((".encoder", ".decoder")) and m.startswith("omnicore_"))
print("RC", rc, "HEAVY", ",".join(heavy) or "none", file=sys.stderr)
sys.exit(rc if not heavy else 99)
"""


@pytest.mark.cli
@pytest.mark.parametrize(
    "args", [["plugins"], ["plugins", "--json"], ["plugins", "--kind", "decoder"], ["plugins", "--no-load"]], ids=" ".join
)
def test_plugins_does_not_import_torch(tmp_path, args):
    r = run([sys.executable, "-c", NO_TORCH] + args, tmp_path)
    assert r.stderr.strip().splitlines()[-1] == "RC 0 HEAVY none", r.stderr
    assert r.returncode == 0
    assert r.stdout.strip()  # the command did print its listing


@pytest.mark.cli
def test_plugins_importtime_has_no_torch(tmp_path):
    r = run([sys.executable, "-X", "importtime", "-m", "omnicore", "plugins"], tmp_path)
    assert r.returncode == 0
    imported = {line.split("|")[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}
    assert "omnicore.registry" in imported and "pluggy" in imported  # the trace is real
    assert "omnicore.builtins" in imported
    assert not {m for m in imported if m.split(".")[0] in ("torch", "transformers", "diffusers")}


@pytest.mark.cli
@pytest.mark.parametrize("how", sorted(COMMANDS))
def test_version_names_the_release_and_the_core_api_without_torch(tmp_path, how):
    """``omnicore --version`` prints the installed distribution's version (here read from its metadata,
    the command reads ``omnicore.__version__``) and the core API version, and imports nothing heavy."""
    from importlib.metadata import version

    from omnicore import CORE_API_VERSION

    r = run(COMMANDS[how] + ["--version"], tmp_path, env_with(PYTHONPROFILEIMPORTTIME="1"))
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"omnicore {version('omnicore')} (core API {CORE_API_VERSION})\n"
    imported = {line.split("|")[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}
    assert "omnicore.cli" in imported  # the trace is real
    assert not {m for m in imported if m.split(".")[0] in ("torch", "transformers", "pydantic", "pluggy")}


@pytest.mark.cli
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
    assert failed[5].startswith(
        "entry point 'broken = cli_fake_missing_module' of omnicore-broken 0.3.0 failed to import: ModuleNotFoundError"
    )
    assert rows[-1] == failed  # failed plugins list after the components
    assert by_name["clifake"][:5] == ["encoder", "clifake", "omnicore-cli-fake", "1.2.3", "available"]
    assert {(row[0], row[1], row[2]) for row in rows} >= set(EXPECTED)
    assert len(rows) == len(EXPECTED) + 2

    r = run(COMMANDS[how] + ["plugins", "--json"], tmp_path, env)
    assert r.returncode == 0, r.stderr
    data = rows_json(r.stdout)
    (bad,) = [d for d in data if d["status"] == "failed"]
    assert (bad["kind"], bad["name"], bad["provider"], bad["version"]) == ("-", "broken", "omnicore-broken", "0.3.0")
    assert "ModuleNotFoundError" in bad["reason"] and "cli_fake_missing_module" in bad["reason"]
    assert {(d["kind"], d["name"], d["provider"]) for d in data if d["status"] == "available"} == set(EXPECTED) | {
        ("encoder", "clifake", "omnicore-cli-fake")
    }

    # --kind keeps failed plugins visible (they might have provided that kind)
    r = run(COMMANDS[how] + ["plugins", "--kind", "kernel", "--json"], tmp_path, env)
    assert [(d["kind"], d["name"], d["status"]) for d in rows_json(r.stdout)] == [("kernel", k, "available") for k in BUILTIN_KERNELS] + [
        ("-", "broken", "failed"),
    ]


@pytest.mark.cli
def test_disabled_and_strict_env_in_cli(tmp_path, fake_site):
    r = run(
        COMMANDS["module"] + ["plugins", "--json"], tmp_path, env_with(fake_site, OMNICORE_DISABLE_PLUGINS="broken,omnicore-image-siglip")
    )
    assert r.returncode == 0, r.stderr
    data = rows_json(r.stdout)
    assert sorted((d["name"], d["status"]) for d in data if d["status"] != "available") == [("broken", "disabled"), ("siglip", "disabled")]
    assert "siglip" not in {d["name"] for d in data if d["status"] == "available"}
    r = run(COMMANDS["module"] + ["plugins"], tmp_path, env_with(fake_site, OMNICORE_STRICT="1"))
    assert r.returncode == 2, r.stderr
    assert r.stdout == "" and "Traceback" not in r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(
        "error: entry point 'broken = cli_fake_missing_module' of omnicore-broken 0.3.0 failed to import: ModuleNotFoundError"
    )
    assert line.endswith("(strict mode: OMNICORE_STRICT=1)")


# ---- user errors from train ---------------------------------------------------------------------


@pytest.mark.cli
def test_train_with_misspelt_key_exits_2_with_one_line(tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("data:\n  train: train.jsonl\ntrain:\n  max_step: 3\n")
    r = run(COMMANDS["script"] + ["train", "config.yaml"], tmp_path, timeout=120)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stdout == ""
    assert "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == ["error: config.yaml: train.max_step: unknown key; did you mean 'max_steps'?"]


@pytest.mark.cli
def test_train_misspelt_override_exits_2_with_one_line(tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("data:\n  train: train.jsonl\n")
    r = run(COMMANDS["module"] + ["train", "config.yaml", "--run.sed", "3"], tmp_path, timeout=120)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == ["error: command line (--run.sed): run.sed: unknown key; did you mean 'seed'?"]


@pytest.mark.cli
def test_train_missing_config_file_exits_2(tmp_path):
    r = run(COMMANDS["module"] + ["train", "nope.yaml"], tmp_path, timeout=120)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.strip().splitlines() == ["error: config file not found: nope.yaml"]


# ---- --check, --no-load, incompatible and allow-listed plugins in the CLI -------------------------


def _encoder_plugin(module: str, target: str) -> str:
    return f"""
        from omnicore.api import ComponentSpec, hookimpl

        @hookimpl
        def omnicore_encoders():
            return [ComponentSpec(name="{module}", target="{target}:build", processor="{target}:build", description="checked")]
    """


@pytest.fixture
def check_site(tmp_path) -> Path:
    """Three plugins for --check: healthy (its target pulls in a stand-in 'torch'), one whose target
    calls os._exit(3) on import, and one whose hook module raises."""
    site = tmp_path / "site"
    write_fake_distribution(
        site,
        "omnicore-chk-ok",
        "1.0",
        {"chkok": "chk_ok"},
        {
            "chk_ok": _encoder_plugin("chk_ok", "chk_ok_model"),
            "chk_ok_model": "import sys, types\nsys.modules['torch'] = types.ModuleType('torch')\n",
        },
    )
    write_fake_distribution(
        site,
        "omnicore-chk-exit",
        "1.0",
        {"chkexit": "chk_exit"},
        {"chk_exit": _encoder_plugin("chk_exit", "chk_exit_model"), "chk_exit_model": "import os\nos._exit(3)\n"},
    )
    write_fake_distribution(
        site, "omnicore-chk-raise", "1.0", {"chkraise": "chk_raise"}, {"chk_raise": "raise RuntimeError('boom at import')\n"}
    )
    return site


@pytest.mark.cli
def test_plugins_check_survives_crashing_imports(tmp_path, check_site):
    env = env_with(check_site, OMNICORE_ALLOW_PLUGINS="omnicore-chk-ok,chkexit,chkraise")
    r = run(COMMANDS["module"] + ["plugins", "--check", "--kind", "encoder", "--json"], tmp_path, env, timeout=120)
    assert r.returncode == 0, r.stderr
    data = {d["name"]: d for d in json.loads(r.stdout)}
    assert set(data) == {"chk_ok", "chk_exit", "chkraise", "whisper", "siglip", "movqgan"} | {
        d["name"] for d in json.loads(r.stdout) if d["provider"] in OTHERS
    }
    ok, ex, rs = data["chk_ok"]["check"], data["chk_exit"]["check"], data["chkraise"]["check"]
    assert (ok["ok"], ok["torch"], ok["hook_torch"], ok["error"]) == (True, True, False, "")
    assert isinstance(ok["import_s"], float) and 0 <= ok["import_s"] < 60
    assert data["chk_exit"]["status"] == "available"  # listing never imports targets; --check does, in a subprocess
    assert (ex["ok"], ex["error"]) == (False, "import process exited with status 3 before reporting")
    assert data["chkraise"]["status"] == "failed"
    assert (rs["ok"], rs["error"]) == (False, "RuntimeError: boom at import")
    for name in ("whisper", "siglip", "movqgan"):  # not allowed: disabled, so neither listed as loaded nor checked
        assert (data[name]["status"], data[name]["check"]) == ("disabled", None)

    r = run(COMMANDS["module"] + ["plugins", "--check", "--kind", "encoder"], tmp_path, env, timeout=120)
    assert r.returncode == 0, r.stderr
    header, rows = parse_table(r.stdout, columns=7)
    assert header == ["KIND", "NAME", "PROVIDER", "VERSION", "STATUS", "IMPORT", "DESCRIPTION"]
    lines = {line.split()[1]: line for line in r.stdout.splitlines()[1:]}
    assert " available  FAILED: import process exited with status 3 before reporting " in lines["chk_exit"]
    assert " failed     FAILED: RuntimeError: boom at import " in lines["chkraise"]
    assert re.search(r" available  ok \d+\.\d{3}s torch +checked$", lines["chk_ok"]), lines["chk_ok"]
    assert " disabled   not checked (disabled) " in lines["whisper"]


EXITS_ON_IMPORT = "import os\nos._exit(3)\n"


@pytest.fixture
def no_load_site(tmp_path) -> Path:
    """A plugin whose hook module kills the process on import, and one that needs core API 2."""
    site = tmp_path / "site"
    write_fake_distribution(site, "omnicore-exits", "0.4", {"exits": "nl_exits"}, {"nl_exits": EXITS_ON_IMPORT})
    info = write_fake_distribution(site, "omnicore-future", "3.1.0", {"future": "nl_future"}, {"nl_future": EXITS_ON_IMPORT})
    (info / "METADATA").write_text((info / "METADATA").read_text() + "Keywords: omnicore-api >=3,<4\n")
    return site


@pytest.mark.cli
def test_plugins_no_load_imports_no_plugin_code(tmp_path, no_load_site):
    env = env_with(no_load_site)
    r = run(COMMANDS["script"] + ["plugins", "--no-load", "--json"], tmp_path, env)
    assert r.returncode == 0, r.stderr  # the hook module that calls os._exit(3) was never imported
    data = {d["name"]: d for d in rows_json(r.stdout)}
    assert set(data) == {"exits", "future", "whisper", "siglip", "movqgan"}
    assert data["exits"] == {
        "name": "exits",
        "provider": "omnicore-exits",
        "version": "0.4",
        "value": "nl_exits",
        "api": "",
        "status": "not loaded",
        "reason": "",
    }
    assert (data["future"]["status"], data["future"]["api"]) == ("incompatible", ">=3,<4")
    assert (
        data["future"]["reason"]
        == "entry point 'future = nl_future' of omnicore-future 3.1.0 requires omnicore API >=3,<4; omnicore 0.1.0 provides API 2.0"
    )
    assert (data["whisper"]["value"], data["whisper"]["api"], data["whisper"]["version"]) == (
        "omnicore_audio_whisper.plugin",
        ">=2.0,<3",
        "0.1.0",
    )

    r = run(COMMANDS["module"] + ["plugins", "--no-load"], tmp_path, env_with(no_load_site, OMNICORE_DISABLE_PLUGINS="siglip"))
    assert r.returncode == 0, r.stderr
    header, rows = parse_table(r.stdout, columns=7)
    assert header == ["NAME", "PROVIDER", "VERSION", "VALUE", "API", "STATUS", "REASON"]
    by_name = {row[0]: row for row in rows if row[1] not in OTHERS}
    assert by_name["siglip"][5] == "disabled"
    assert by_name["exits"][4:6] == ["-", "not"]  # "not loaded"

    r = run(COMMANDS["module"] + ["plugins", "--no-load", "--check"], tmp_path, env)
    assert r.returncode == 2 and "cannot be combined with --check or --kind" in r.stderr


@pytest.mark.cli
def test_disabled_plugin_is_never_imported_by_the_listing(tmp_path, no_load_site):
    # without the variable, the hook module kills the listing: this is what disabling recovers from
    r = run(COMMANDS["module"] + ["plugins"], tmp_path, env_with(no_load_site))
    assert r.returncode == 3
    r = run(COMMANDS["module"] + ["plugins", "--json"], tmp_path, env_with(no_load_site, OMNICORE_DISABLE_PLUGINS="exits"))
    assert r.returncode == 0, r.stderr
    data = {d["name"]: d for d in rows_json(r.stdout)}
    assert (data["exits"]["status"], data["exits"]["reason"]) == (
        "disabled",
        "entry point 'exits = nl_exits' of omnicore-exits 0.4: disabled by OMNICORE_DISABLE_PLUGINS",
    )
    assert data["future"]["status"] == "incompatible"  # from metadata: its (deadly) hook module is not imported either
    r = run(COMMANDS["module"] + ["plugins"], tmp_path, env_with(no_load_site, OMNICORE_ALLOW_PLUGINS="whisper"))
    assert r.returncode == 0, r.stderr
    _, rows = parse_table(r.stdout)
    status = {row[1]: row[4] for row in rows}
    assert status["exits"] == "disabled" and status["whisper"] == "available" and status["sdpa"] == "available"
    assert status["future"] == "disabled"


@pytest.mark.cli
def test_missing_component_checkpoint_is_a_one_line_error(tmp_path):
    """A checkpoint that is neither a folder nor a cached Hugging Face model (here: MoVQGAN's) is
    reported as one `error:` line naming the config field, exit code 2, in plan and in train."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        "model:\n"
        "  foundation: {name: hf_causal_lm, options: {config: {model_type: qwen2, hidden_size: 32, intermediate_size: 64, "
        "num_hidden_layers: 1, num_attention_heads: 4, num_key_value_heads: 2}}}\n"
        "  decoders: {image: {name: movqgan, options: {checkpoint: nowhere/movq}}}\n"
        "data: {train: data.jsonl}\n"
    )
    for args in (["plan", str(cfg), "--world-size", "1"], ["train", str(cfg), "--run.output_dir", str(tmp_path / "run")]):
        r = run(COMMANDS["module"] + args, tmp_path)
        assert r.returncode == 2, r.stderr
        assert "Traceback" not in r.stderr
        last = r.stderr.strip().splitlines()[-1]
        assert last.startswith("error: model.decoders.image: options.checkpoint: 'nowhere/movq' is neither a folder (looked for "), last
    assert not (tmp_path / "run").exists()


# ---- file-system failures are one error line ------------------------------------------------------


def test_output_folder_under_a_file_is_one_error_line(digits_jsonl, tmp_path, capsys):
    """A real failure: the output folder would be inside a regular file (ENOTDIR)."""
    import yaml
    from conftest import tiny_config_dict

    from omnicore.cli import main

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    cfg = tiny_config_dict(str(digits_jsonl / "train.jsonl"), output_dir=str(blocker / "run"), max_steps=1)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["train", str(tmp_path / "c.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()  # start-up status lines (omnicore.logs), then one error line
    errors = [x for x in err if x.startswith("error:")]
    assert errors == err[-1:] and errors[0].startswith(f"error: {blocker}") and "a file where a folder was expected" in errors[0], err
    assert not any("Traceback" in x for x in err)


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (errno.ENOSPC, "no space left on the device; free some space or choose another --run.output_dir"),
        (errno.EROFS, "the file system is read-only; choose a writable --run.output_dir"),
        (errno.EFBIG, "file too large for this file system or the file-size limit (ulimit -f); raise the limit"),
        (errno.EIO, os.strerror(errno.EIO)),  # no hint of our own: the system's words
    ],
)
def test_os_errors_name_the_file_and_what_to_do(monkeypatch, tmp_path, capsys, code, words):
    import omnicore.cli as cli

    path = str(tmp_path / "run" / "metrics.jsonl")

    def fail(args, extra):
        raise OSError(code, os.strerror(code), path)

    monkeypatch.setattr(cli, "cmd_train", fail)
    (tmp_path / "c.yaml").write_text("data: {train: t.jsonl}\n")
    assert cli.main(["train", str(tmp_path / "c.yaml")]) == 2
    assert capsys.readouterr().err == f"error: {path}: {words}\n"


@pytest.mark.cli
def test_nonfinite_training_is_one_error_line(digits_jsonl, tmp_path):
    """``train.lr 1e6``: the gradient norm is NaN at step 2; the CLI stops with one line, exit 2."""
    import yaml
    from conftest import tiny_config_dict

    cfg = tiny_config_dict(str(digits_jsonl / "train.jsonl"), output_dir=str(tmp_path / "run"), max_steps=4, lr=1e6, save_every=1)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    r = run(COMMANDS["module"] + ["train", "c.yaml"], tmp_path, timeout=300)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = [x for x in r.stderr.strip().splitlines() if x.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith("error: non-finite training step "), r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "run" / "export").exists()


@pytest.mark.cli
def test_listing_into_a_closed_pipe_exits_quietly(tmp_path):
    """``omnicore plugins --no-load | head -1``: the reader is gone before the listing is written;
    the listing ends with status 0 and no traceback (the pipe's read end is closed up front, so
    the first write fails every time)."""
    read, write = os.pipe()
    os.close(read)
    try:
        r = subprocess.run(
            COMMANDS["module"] + ["plugins", "--no-load"], cwd=tmp_path, stdout=write, stderr=subprocess.PIPE, text=True, timeout=60
        )
    finally:
        os.close(write)
    assert r.returncode == 0 and "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr, r.stderr
