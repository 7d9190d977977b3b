"""The component registry: built-ins, installed plugins, and fake distributions with real entry points.

The fake distributions are real ``*.dist-info`` folders on ``sys.path``, so ``Registry.discover()``
finds them through ``importlib.metadata`` exactly as it finds installed plugins.
"""

from __future__ import annotations

import importlib
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from omnicore import builtins as builtin_plugin
from omnicore.components import ComponentSpec
from omnicore.registry import Registry, RegistryError
from omnicore.testing import write_fake_distribution

VERSION = "0.1.0"

BUILTINS = [
    ("foundation", "hf_causal_lm"),
    *(("parallel", n) for n in ("activation_checkpointing", "compile", "ep", "fsdp2", "none")),
    *(("kernel", n) for n in ("chunked_cross_entropy", "eager", "sdpa", "sdpa_varlen", "torch_cross_entropy", "torch_rms_norm")),
    ("logger", "jsonl"),
]
"""Every built-in component (kind, name)."""

EXPECTED_INSTALLED = {
    **{key: "omnicore" for key in BUILTINS},
    ("encoder", "siglip"): "omnicore-image-siglip",
    ("encoder", "whisper"): "omnicore-audio-whisper",
    ("decoder", "movqgan"): "omnicore-image-movqgan",
}


# ---- fake distributions ------------------------------------------------------------------------

HEADER = """\
from pydantic import BaseModel, ConfigDict
from omnicore.components import ComponentSpec
from omnicore.hookspecs import hookimpl
"""


def declare_api(info: Path, api: str, *, other_keywords: str = "") -> None:
    """Add the ``omnicore-api`` keyword to a fake ``.dist-info`` as setuptools writes it
    (``keywords = ["omnicore-api >=1.0,<2"]`` becomes ``Keywords: omnicore-api >=1.0,<2``)."""
    md = info / "METADATA"
    md.write_text(md.read_text() + f"Keywords: {other_keywords}omnicore-api {api}\n")


class FakeSite:
    """A folder on ``sys.path`` holding fake distributions; module names are unique per test."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch):
        self.root = root
        self.prefix = f"fakeplug_{uuid.uuid4().hex[:8]}"
        root.mkdir()
        monkeypatch.syspath_prepend(str(root))

    def mod(self, name: str) -> str:
        return f"{self.prefix}_{name}"

    def add(self, dist: str, version: str, ep_name: str, body: str | None, *, module: str | None = None, api: str | None = None) -> str:
        """One distribution with one entry point ``ep_name = <module>``; ``body=None`` writes no module.

        ``api`` declares the distribution's core API range (the ``omnicore-api`` keyword).
        """
        module = module or self.mod(ep_name)
        modules = {} if body is None else {module: HEADER + textwrap.dedent(body)}
        info = write_fake_distribution(self.root, dist, version, {ep_name: module}, modules)
        if api is not None:
            declare_api(info, api)
        importlib.invalidate_caches()
        return module

    def cleanup(self) -> None:
        for name in [m for m in sys.modules if m.startswith(self.prefix)]:
            del sys.modules[name]


FIRST_PARTY = {"omnicore-image-siglip", "omnicore-audio-whisper", "omnicore-image-movqgan"}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    """No OMNICORE_* variables, and only first-party and fake (tmp-path) distributions are seen:
    other plugins a developer installed into the venv (contrib, experiments) do not change results."""
    from importlib import metadata

    for var in ("OMNICORE_STRICT", "OMNICORE_DISABLE_PLUGINS", "OMNICORE_ALLOW_PLUGINS"):
        monkeypatch.delenv(var, raising=False)
    real = metadata.entry_points
    installed = {str(Path(p).resolve()) for p in sys.path if p.endswith("site-packages")}

    def ours(ep) -> bool:
        dist = ep.dist
        where = str(Path(str(getattr(dist, "_path", ""))).resolve().parent)
        return dist is None or dist.metadata["Name"] in FIRST_PARTY or where not in installed

    def entry_points(**params):
        eps = real(**params)
        if params.get("group") != "omnicore":
            return eps
        return metadata.EntryPoints(ep for ep in eps if ours(ep))

    monkeypatch.setattr(metadata, "entry_points", entry_points)


@pytest.fixture
def site(tmp_path, monkeypatch):
    s = FakeSite(tmp_path / "site", monkeypatch)
    yield s
    s.cleanup()
    importlib.invalidate_caches()


KERNEL_PLUGIN = """
class Opts(BaseModel):
    model_config = ConfigDict(extra="forbid")
    block_size: int = 64
    causal: bool = True

class FastAttn:
    op = "attention"
    def __init__(self, options):
        self.options = options
    def available(self):
        return True, "fake kernel"
    def activate(self, model):
        pass

def build_encoder(options, *, hidden_size):
    return {"options": options, "hidden_size": hidden_size}

@hookimpl
def omnicore_kernels():
    return [ComponentSpec(name="fastattn", target=__name__ + ":FastAttn",
                          options_model=__name__ + ":Opts", description="fake fast attention")]

@hookimpl
def omnicore_encoders():
    return [ComponentSpec(name="fakeenc", target=__name__ + ":build_encoder", processor=__name__ + ":build_encoder",
                          modalities=("video",), description="fake video encoder")]
"""


def rows_of(reg: Registry, provider: str) -> list:
    return [r for r in reg.rows if r.provider == provider]


# ---- built-ins and installed plugins -----------------------------------------------------------


def test_builtins_and_installed_plugins_are_available():
    reg = Registry.discover()
    found = {(r.kind, r.name): r for r in reg.rows if r.status == "available"}
    for key, provider in EXPECTED_INSTALLED.items():
        assert key in found, f"{key} missing from {sorted(found)}"
        row = found[key]
        assert row.provider == provider
        assert row.version == VERSION
        assert row.reason == ""
        assert row.description  # every shipped component describes itself
        assert row.spec is not None and row.spec.key == f"{key[0]}/{key[1]}"
    assert found[("encoder", "siglip")].spec.modalities == ("image",)
    assert found[("encoder", "whisper")].spec.modalities == ("audio",)
    assert found[("decoder", "movqgan")].spec.modalities == ("image",)
    assert found[("encoder", "whisper")].entry_point == "omnicore_audio_whisper.plugin"
    assert found[("kernel", "sdpa")].entry_point == "builtin"
    assert not [r for r in reg.rows if r.status != "available"], [r.as_dict() for r in reg.rows if r.status != "available"]
    # resolve the bare names
    assert reg.resolve("kernel", "sdpa").target == "omnicore.kernels.attention:SDPAAttention"
    assert reg.resolve("encoder", "whisper").target == "omnicore_audio_whisper.encoder:build"
    assert reg.resolve("decoder", "omnicore-image-movqgan:movqgan").name == "movqgan"


def test_row_as_dict_keys():
    reg = Registry.discover()
    d = next(r for r in reg.rows if r.name == "fsdp2").as_dict()
    assert d == {
        "kind": "parallel",
        "name": "fsdp2",
        "provider": "omnicore",
        "version": VERSION,
        "status": "available",
        "reason": "",
        "description": d["description"],
        "entry_point": "builtin",
        "target": "omnicore.parallel.fsdp:FSDP2",
        "api": "==2.0",
    }
    assert "FSDP2" in d["description"]


def test_componentspec_validation():
    with pytest.raises(ValueError, match="kind 'encoders' is not one of encoder, decoder"):
        ComponentSpec(name="x", target="m:f").of_kind("encoders")
    with pytest.raises(TypeError, match="kind"):
        ComponentSpec(kind="encoder", name="x", target="m:f")  # type: ignore[call-arg]  # the hook states the kind
    with pytest.raises(ValueError, match="encoder/x names no processor: add processor="):
        ComponentSpec(name="x", target="m:f").of_kind("encoder")
    with pytest.raises(ValueError, match="kernel/x: processor= is only for encoders and decoders"):
        ComponentSpec(name="x", target="m:f", processor="m:p").of_kind("kernel")
    spec = ComponentSpec(name="x", target="m:f")
    bound = spec.of_kind("kernel")
    assert (spec.kind, bound.kind, bound.key, bound.name) == ("", "kernel", "kernel/x", "x")
    with pytest.raises(ValueError, match="must be non-empty"):
        ComponentSpec(name="bad name", target="m:f")
    with pytest.raises(ValueError, match="must be 'module:attr'"):
        ComponentSpec(name="x", target="m.f")


# ---- (a) a missing module: failed row, the rest still lists and builds -----------------------


def test_missing_module_is_a_failed_row_and_others_still_build(site):
    missing = site.mod("does_not_exist")
    site.add("omnicore-broken", "0.3.0", "broken", None, module=missing)
    kmod = site.add("omnicore-fake-kernels", "1.2.3", "fastattn", KERNEL_PLUGIN)

    reg = Registry.discover()
    failed = [r for r in reg.rows if r.status == "failed"]
    assert len(failed) == 1
    row = failed[0]
    assert (row.kind, row.name, row.provider, row.version) == ("-", "broken", "omnicore-broken", "0.3.0")
    assert row.spec is None
    assert f"entry point 'broken = {missing}' of omnicore-broken 0.3.0 failed to import" in row.reason
    assert "ModuleNotFoundError" in row.reason and missing in row.reason
    assert "\n" not in row.reason

    # everything else still lists
    avail = {(r.kind, r.name): r for r in reg.rows if r.status == "available"}
    assert set(EXPECTED_INSTALLED) <= set(avail)
    fake = avail[("kernel", "fastattn")]
    assert (fake.provider, fake.version, fake.description) == ("omnicore-fake-kernels", "1.2.3", "fake fast attention")
    assert avail[("encoder", "fakeenc")].provider == "omnicore-fake-kernels"

    # ... and builds
    sdpa = reg.build("kernel", "sdpa")
    assert type(sdpa).__name__ == "SDPAAttention"
    assert (sdpa.op, sdpa.implementation) == ("attention", "sdpa")
    assert sdpa.available()[0] is True
    fast = reg.build("kernel", "fastattn", {"block_size": 128})
    assert type(fast).__module__ == kmod
    assert fast.options == {"block_size": 128, "causal": True}  # validated and defaults filled in
    assert fast.available() == (True, "fake kernel")
    enc = reg.build("encoder", "fakeenc", {"x": 1}, hidden_size=32)
    assert enc == {"options": {"x": 1}, "hidden_size": 32}

    # the failed plugin is named when a lookup misses
    with pytest.raises(RegistryError) as ei:
        reg.resolve("encoder", "brokenenc")
    assert "Plugins that failed to load (see `omnicore plugins`): omnicore-broken (broken)." in str(ei.value)


def test_import_error_inside_plugin_module_is_failed(site):
    site.add("omnicore-explodes", "2.0", "explodes", "raise RuntimeError('boom at import')\n")
    reg = Registry.discover()
    (row,) = rows_of(reg, "omnicore-explodes")
    assert row.status == "failed"
    assert "failed to import: RuntimeError: boom at import" in row.reason
    assert "entry point 'explodes = " in row.reason


# ---- (b) all-or-nothing ----------------------------------------------------------------------


HALFWAY_PLUGIN = """
@hookimpl
def omnicore_encoders():
    return [ComponentSpec(name="halfenc", target="x.y:build", processor="x.y:build_processor")]

@hookimpl
def omnicore_kernels():
    raise ValueError("kernel table is corrupt")
"""


def test_hook_raising_halfway_registers_nothing(site):
    module = site.add("omnicore-halfway", "0.9", "halfway", HALFWAY_PLUGIN)
    reg = Registry.discover()
    rows = rows_of(reg, "omnicore-halfway")
    assert len(rows) == 1, [r.as_dict() for r in rows]
    (row,) = rows
    assert (row.status, row.name, row.version, row.spec) == ("failed", "halfway", "0.9", None)
    assert row.reason == (
        f"entry point 'halfway = {module}' of omnicore-halfway 0.9 raised in registration: ValueError: kernel table is corrupt"
    )
    assert not [r for r in reg.components() if r.name == "halfenc"]
    with pytest.raises(RegistryError, match="no encoder named 'halfenc'"):
        reg.resolve("encoder", "halfenc")
    # the plugin is also unregistered from pluggy: calling the hook does not reach it
    assert all(impl.plugin_name != "omnicore-halfway:halfway" for impl in reg.pm.hook.omnicore_encoders.get_hookimpls())
    names = [spec.name for specs in reg.pm.hook.omnicore_encoders() for spec in specs]
    assert "halfenc" not in names and {"siglip", "whisper"} <= set(names)


# ---- (c) wrong return types -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            """
            @hookimpl
            def omnicore_encoders():
                return [{"kind": "encoder", "name": "dictenc", "target": "a:b"}]
            """,
            "TypeError: hook omnicore_encoders returned {'kind': 'encoder', 'name': 'dictenc', 'target': 'a:b'}; "
            "expected ComponentSpec(name=..., target=...)",
        ),
        (
            """
            @hookimpl
            def omnicore_encoders():
                return [ComponentSpec(kind="decoder", name="withkind", target="a:b")]
            """,
            "(core API 2.0: ComponentSpec takes no kind=, the hook states it; drop it)",
        ),
        (
            """
            @hookimpl
            def omnicore_encoders():
                return [ComponentSpec(name="noproc", target="a:b")]
            """,
            "ValueError: encoder/noproc names no processor: add processor='package.module:factory'",
        ),
        (
            """
            @hookimpl
            def omnicore_kernels():
                return [ComponentSpec(name="bad name!", target="a:b")]
            """,
            "ValueError: ComponentSpec name 'bad name!' must be non-empty",
        ),
    ],
    ids=["not-a-spec", "kind-given", "no-processor", "invalid-spec"],
)
def test_bad_hook_results_are_failed(site, body, expected):
    site.add("omnicore-badresult", "0.1", "badresult", body)
    reg = Registry.discover()
    (row,) = rows_of(reg, "omnicore-badresult")
    assert row.status == "failed"
    assert "raised in registration" in row.reason
    assert expected in row.reason
    assert {(r.kind, r.name) for r in reg.rows if r.status == "available"} >= set(EXPECTED_INSTALLED)


def test_pluggy_validation_failure_is_failed(site):
    site.add(
        "omnicore-typo-hook",
        "0.1",
        "typohook",
        """
        @hookimpl
        def omnicore_encoderz():
            return []
        """,
    )
    site.add(
        "omnicore-bad-args",
        "0.1",
        "badargs",
        """
        @hookimpl
        def omnicore_kernels(config):
            return []
        """,
    )
    reg = Registry.discover()
    (typo,) = rows_of(reg, "omnicore-typo-hook")
    assert typo.status == "failed"
    assert "failed validation" in typo.reason and "omnicore_encoderz" in typo.reason
    (bad,) = rows_of(reg, "omnicore-bad-args")
    assert bad.status == "failed"
    assert "failed validation" in bad.reason and "config" in bad.reason
    assert not reg.pm.has_plugin("omnicore-typo-hook:typohook")
    assert not reg.pm.has_plugin("omnicore-bad-args:badargs")


# ---- (d) conflicts ----------------------------------------------------------------------------


def _dup_plugin(tag: str) -> str:
    return f"""
    def build(options, *, hidden_size):
        return "{tag}"

    @hookimpl
    def omnicore_encoders():
        return [ComponentSpec(name="dup", target=__name__ + ":build", processor=__name__ + ":build", description="{tag} dup")]
    """


def test_conflict_between_two_distributions(site):
    site.add("omnicore-alpha", "1.0", "alpha", _dup_plugin("alpha"))
    site.add("omnicore-beta", "2.0", "beta", _dup_plugin("beta"))
    reg = Registry.discover()
    dup = sorted((r for r in reg.rows if r.name == "dup"), key=lambda r: r.provider)
    assert [(r.provider, r.version, r.status) for r in dup] == [
        ("omnicore-alpha", "1.0", "conflict"),
        ("omnicore-beta", "2.0", "conflict"),
    ]
    for r in dup:
        assert r.reason == f"encoder/dup is offered by omnicore-alpha, omnicore-beta; pick one in config as '{r.provider}:dup'"

    with pytest.raises(RegistryError) as ei:
        reg.resolve("encoder", "dup")
    msg = str(ei.value)
    assert msg == "encoder/dup is offered by several plugins; choose one in config: 'omnicore-alpha:dup', 'omnicore-beta:dup'"

    assert reg.resolve("encoder", "omnicore-beta:dup").description == "beta dup"
    assert reg.resolve("encoder", "omnicore-alpha:dup").description == "alpha dup"
    assert reg.build("encoder", "omnicore-beta:dup", hidden_size=8) == "beta"
    with pytest.raises(RegistryError, match="offered by several plugins"):
        reg.build("encoder", "dup", hidden_size=8)
    # a provider that does not offer it
    with pytest.raises(RegistryError, match="no encoder named 'omnicore-gamma:dup'"):
        reg.resolve("encoder", "omnicore-gamma:dup")
    # unrelated components are unaffected
    assert next(r for r in reg.rows if r.name == "siglip").status == "available"


def test_conflict_with_builtin_name(site):
    site.add(
        "omnicore-sdpa-clone",
        "0.5",
        "sdpaclone",
        """
        @hookimpl
        def omnicore_kernels():
            return [ComponentSpec(name="sdpa", target="a:b")]
        """,
    )
    reg = Registry.discover()
    sdpa = sorted((r.provider, r.status) for r in reg.rows if r.name == "sdpa")
    assert sdpa == [("omnicore", "conflict"), ("omnicore-sdpa-clone", "conflict")]
    with pytest.raises(RegistryError, match="'omnicore:sdpa', 'omnicore-sdpa-clone:sdpa'"):
        reg.resolve("kernel", "sdpa")
    assert reg.resolve("kernel", "omnicore:sdpa").target == "omnicore.kernels.attention:SDPAAttention"
    # the plugin never silently replaces the built-in; both rows say how to pick, the built-in included
    rows = {r.provider: r for r in reg.rows if r.name == "sdpa"}
    assert rows["omnicore-sdpa-clone"].reason == (
        "kernel/sdpa is offered by omnicore, omnicore-sdpa-clone; pick one in config as 'omnicore-sdpa-clone:sdpa' "
        "(or 'omnicore:sdpa' to keep the built-in)"
    )
    assert rows["omnicore"].reason == (
        "kernel/sdpa is offered by omnicore, omnicore-sdpa-clone; pick one in config as 'omnicore:sdpa' "
        "(the built-in; a plugin never replaces it without that choice)"
    )
    with pytest.raises(RegistryError) as ei:
        reg.build("kernel", "sdpa")
    assert str(ei.value) == (
        "kernel/sdpa is offered by several plugins; choose one in config: 'omnicore:sdpa', 'omnicore-sdpa-clone:sdpa' "
        "('omnicore:sdpa' is the built-in)"
    )
    assert reg.resolve("kernel", "omnicore-sdpa-clone:sdpa").target == "a:b"


# ---- (e) disabling ----------------------------------------------------------------------------


def test_disable_by_entry_point_name(site, monkeypatch):
    module = site.add("omnicore-fake-kernels", "1.2.3", "fastattn", KERNEL_PLUGIN)
    monkeypatch.setenv("OMNICORE_DISABLE_PLUGINS", "fastattn")
    reg = Registry.discover()
    (row,) = rows_of(reg, "omnicore-fake-kernels")
    assert (row.kind, row.name, row.version, row.status) == ("-", "fastattn", "1.2.3", "disabled")
    assert row.reason == f"entry point 'fastattn = {module}' of omnicore-fake-kernels 1.2.3: disabled by OMNICORE_DISABLE_PLUGINS"
    assert not [r for r in reg.components() if r.name in ("fastattn", "fakeenc")]
    assert module not in sys.modules  # a disabled plugin is not even imported
    with pytest.raises(RegistryError, match="no kernel named 'fastattn'"):
        reg.resolve("kernel", "fastattn")


def test_disable_by_distribution_name(monkeypatch):
    monkeypatch.setenv("OMNICORE_DISABLE_PLUGINS", " omnicore-image-siglip , movqgan")
    reg = Registry.discover()
    disabled = sorted((r.provider, r.name) for r in reg.rows if r.status == "disabled")
    assert disabled == [("omnicore-image-movqgan", "movqgan"), ("omnicore-image-siglip", "siglip")]
    names = {r.name for r in reg.components()}
    assert "siglip" not in names and "movqgan" not in names
    assert {"whisper", "sdpa", "hf_causal_lm"} <= names
    with pytest.raises(RegistryError) as ei:
        reg.resolve("encoder", "siglip")
    assert "Known encoders: whisper." in str(ei.value)


# ---- (f) strict mode --------------------------------------------------------------------------


def test_strict_mode_raises_on_broken_entry_point(site, monkeypatch):
    missing = site.mod("gone")
    site.add("omnicore-broken", "0.3.0", "broken", None, module=missing)
    assert [r.status for r in rows_of(Registry.discover(), "omnicore-broken")] == ["failed"]
    monkeypatch.setenv("OMNICORE_STRICT", "1")
    with pytest.raises(RegistryError) as ei:
        Registry.discover()
    msg = str(ei.value)
    assert f"entry point 'broken = {missing}' of omnicore-broken 0.3.0 failed to import: ModuleNotFoundError" in msg
    assert msg.endswith("(strict mode: OMNICORE_STRICT=1)")


def test_strict_mode_raises_on_registration_error(site, monkeypatch):
    site.add("omnicore-halfway", "0.9", "halfway", HALFWAY_PLUGIN)
    monkeypatch.setenv("OMNICORE_STRICT", "1")
    with pytest.raises(RegistryError, match="raised in registration: ValueError: kernel table is corrupt"):
        Registry.discover()


def test_strict_mode_passes_when_all_healthy(monkeypatch):
    monkeypatch.setenv("OMNICORE_STRICT", "1")
    reg = Registry.discover()
    assert {(r.kind, r.name) for r in reg.rows} >= set(EXPECTED_INSTALLED)


# ---- (g) unknown names ------------------------------------------------------------------------


def test_unknown_name_suggests_close_match():
    reg = Registry.discover()
    with pytest.raises(RegistryError) as ei:
        reg.resolve("kernel", "sdpaa")
    known = ", ".join(sorted(n for k, n in BUILTINS if k == "kernel"))
    assert str(ei.value) == f"no kernel named 'sdpaa'; did you mean 'sdpa'? Known kernels: {known}."
    with pytest.raises(RegistryError, match="no encoder named 'wisper'; did you mean 'whisper'\\?"):
        reg.resolve("encoder", "wisper")
    with pytest.raises(RegistryError) as ei:
        reg.resolve("parallel", "zzzzzz")
    assert str(ei.value) == "no parallel named 'zzzzzz' Known parallels: activation_checkpointing, compile, ep, fsdp2, none."
    with pytest.raises(RegistryError) as ei:
        reg.build("kernel", "sdpaa")
    assert "did you mean 'sdpa'?" in str(ei.value)


def test_unknown_kind():
    reg = Registry.discover()
    with pytest.raises(RegistryError) as ei:
        reg.resolve("encoders", "siglip")
    assert str(ei.value) == "unknown component kind 'encoders'; kinds are encoder, decoder, foundation, parallel, kernel, logger"


# ---- (h) options validation -------------------------------------------------------------------


def test_build_rejects_unknown_option_with_closest_key(site):
    site.add("omnicore-fake-kernels", "1.2.3", "fastattn", KERNEL_PLUGIN)
    reg = Registry.discover()
    with pytest.raises(RegistryError) as ei:
        reg.build("kernel", "fastattn", {"blok_size": 8})
    assert str(ei.value) == "options of kernel/fastattn: blok_size: unknown key; did you mean 'block_size'?"
    with pytest.raises(RegistryError) as ei:
        reg.build("kernel", "fastattn", {"zzz": 8})
    assert str(ei.value) == "options of kernel/fastattn: zzz: unknown key; valid keys: block_size, causal"
    with pytest.raises(RegistryError) as ei:
        reg.build("kernel", "fastattn", {"block_size": "wide"})
    assert str(ei.value).startswith("options of kernel/fastattn: block_size: Input should be a valid integer")


def test_build_builtin_foundation_rejects_misspelt_option():
    reg = Registry.discover()
    with pytest.raises(RegistryError) as ei:
        reg.build("foundation", "hf_causal_lm", {"confg": {"model_type": "qwen2"}})
    assert str(ei.value) == "options of foundation/hf_causal_lm: confg: unknown key; did you mean 'config'?"
    with pytest.raises(RegistryError, match="options of foundation/hf_causal_lm: .*set exactly one of 'config'"):
        reg.build("foundation", "hf_causal_lm", {})


def test_build_with_unimportable_target(site):
    site.add(
        "omnicore-ghost",
        "0.1",
        "ghost",
        """
        @hookimpl
        def omnicore_kernels():
            return [ComponentSpec(name="ghost", target="no_such_module_xyz.inner:Ghost"),
                    ComponentSpec(name="ghost2", target=__name__ + ":Missing")]
        """,
    )
    reg = Registry.discover()
    assert {r.status for r in rows_of(reg, "omnicore-ghost")} == {"available"}  # listing never imports targets
    with pytest.raises(RegistryError, match="cannot import 'no_such_module_xyz.inner' \\(target 'no_such_module_xyz.inner:Ghost'\\)"):
        reg.build("kernel", "ghost")
    with pytest.raises(RegistryError, match="has no attribute 'Missing'"):
        reg.build("kernel", "ghost2")


# ---- (i) idempotent registration --------------------------------------------------------------


def test_adding_same_plugin_twice_is_harmless():
    reg = Registry.from_plugins([(builtin_plugin, "omnicore"), (builtin_plugin, "omnicore")])
    assert sorted((r.kind, r.name) for r in reg.rows) == sorted(BUILTINS)
    assert {r.status for r in reg.rows} == {"available"}
    reg2 = Registry.discover()
    before = [r.as_dict() for r in reg2.rows]
    assert reg2.add_plugin(builtin_plugin, provider="omnicore", version="0.1.0", entry_point="builtin") is True
    assert [r.as_dict() for r in reg2.rows] == before
    assert reg2.resolve("kernel", "sdpa").name == "sdpa"  # no self-conflict


def test_from_plugins_with_plugin_object():
    from omnicore.hookspecs import hookimpl

    class Plugin:
        @hookimpl
        def omnicore_parallel_strategies(self):
            return [ComponentSpec(name="ring", target="m:Ring", description="ring attention")]

    p = Plugin()
    reg = Registry.from_plugins([(p, "ringpkg"), (p, "ringpkg")])
    assert [(r.kind, r.name, r.provider, r.status, r.description) for r in reg.rows] == [
        ("parallel", "ring", "ringpkg", "available", "ring attention")
    ]
    assert reg.resolve("parallel", "ring").target == "m:Ring"


def test_registries_are_independent(site):
    site.add("omnicore-fake-kernels", "1.2.3", "fastattn", KERNEL_PLUGIN)
    a = Registry.discover()
    b = Registry.discover(entry_points=[])
    assert "fastattn" in {r.name for r in a.components()}
    assert {r.provider for r in b.rows} == {"omnicore"}
    assert len(b.rows) == len(BUILTINS)


# ---- (j) core API version: incompatible plugins are never imported ------------------------------


def test_first_party_plugins_declare_their_api_range():
    from omnicore import CORE_API_VERSION

    assert CORE_API_VERSION == "2.0"
    reg = Registry.discover()
    api = {r.provider: r.api for r in reg.rows if r.provider in EXPECTED_INSTALLED.values()}
    assert api == {
        "omnicore": "==2.0",
        "omnicore-image-siglip": ">=2.0,<3",
        "omnicore-audio-whisper": ">=2.0,<3",
        "omnicore-image-movqgan": ">=2.0,<3",
    }


def test_incompatible_plugin_is_not_imported(site):
    module = site.add("omnicore-future", "3.1.0", "future", KERNEL_PLUGIN, api=">=3.0,<4")
    reg = Registry.discover()
    (row,) = rows_of(reg, "omnicore-future")
    assert (row.kind, row.name, row.version, row.status, row.api, row.spec) == ("-", "future", "3.1.0", "incompatible", ">=3.0,<4", None)
    assert row.reason == (
        f"entry point 'future = {module}' of omnicore-future 3.1.0 requires omnicore API >=3.0,<4; omnicore 0.1.0 provides API 2.0"
    )
    assert module not in sys.modules  # checked from metadata alone
    assert not [r for r in reg.components() if r.name in ("fastattn", "fakeenc")]
    with pytest.raises(RegistryError) as ei:
        reg.resolve("kernel", "fastattn")
    assert "Plugins that are incompatible (see `omnicore plugins`): omnicore-future (future)." in str(ei.value)
    assert {(r.kind, r.name) for r in reg.rows if r.status == "available"} >= set(EXPECTED_INSTALLED)


@pytest.mark.parametrize("declared", [">=1.2,<2", "~=1.0", "==1.3", "<2"])
def test_a_plugin_written_for_api_1_is_one_incompatible_row_saying_what_to_change(site, declared):
    module = site.add("omnicore-old", "0.4", "old", KERNEL_PLUGIN, api=declared)
    reg = Registry.discover()
    rows = rows_of(reg, "omnicore-old")
    assert [(r.kind, r.name, r.status, r.api) for r in rows] == [("-", "old", "incompatible", declared)]
    assert module not in sys.modules
    reason = rows[0].reason
    assert reason.startswith(
        f"entry point 'old = {module}' of omnicore-old 0.4 requires omnicore API {declared}; omnicore 0.1.0 provides API 2.0; "
    )
    for change in ("omnicore.api only", "drop kind=", "processor='module:factory'", "apply(model, state)", "omnicore-api >=2.0,<3"):
        assert change in reason, change


def test_a_range_that_never_admitted_api_1_gets_no_porting_advice(site):
    site.add("omnicore-future", "3.1.0", "future", KERNEL_PLUGIN, api=">=3")
    (row,) = rows_of(Registry.discover(), "omnicore-future")
    assert row.status == "incompatible" and "to port" not in row.reason


def test_compatible_and_undeclared_ranges_load(site):
    site.add("omnicore-fake-kernels", "1.2.3", "fastattn", KERNEL_PLUGIN, api="~=2.0")
    site.add("omnicore-alpha", "1.0", "alpha", _dup_plugin("alpha"))  # no declaration: assumed compatible
    reg = Registry.discover()
    assert {(r.name, r.status, r.api) for r in rows_of(reg, "omnicore-fake-kernels")} == {
        ("fastattn", "available", "~=2.0"),
        ("fakeenc", "available", "~=2.0"),
    }
    assert [(r.name, r.status, r.api) for r in rows_of(reg, "omnicore-alpha")] == [("dup", "available", "")]


def test_invalid_api_range_is_failed(site):
    module = site.add("omnicore-garbled", "0.2", "garbled", KERNEL_PLUGIN, api="version one")
    reg = Registry.discover()
    (row,) = rows_of(reg, "omnicore-garbled")
    assert row.status == "failed"
    assert row.reason.startswith(
        f"entry point 'garbled = {module}' of omnicore-garbled 0.2 declares an invalid core API range 'version one' (omnicore-api keyword): "
    )
    assert module not in sys.modules


def test_strict_mode_raises_on_incompatible(site, monkeypatch):
    site.add("omnicore-future", "3.1.0", "future", KERNEL_PLUGIN, api=">=3")
    monkeypatch.setenv("OMNICORE_STRICT", "1")
    with pytest.raises(RegistryError) as ei:
        Registry.discover()
    assert str(ei.value).endswith("requires omnicore API >=3; omnicore 0.1.0 provides API 2.0 (strict mode: OMNICORE_STRICT=1)")


def test_api_range_is_read_among_other_keywords(tmp_path):
    from importlib import metadata

    from omnicore.registry import api_range

    info = write_fake_distribution(tmp_path, "omnicore-kw", "1.0", {"kw": "kw_mod"})
    assert api_range(metadata.PathDistribution(info)) == ""
    declare_api(info, ">=1.0,<2,!=1.3", other_keywords="omnicore-plugin,vision,")
    assert api_range(metadata.PathDistribution(info)) == ">=1.0,<2,!=1.3"
    assert api_range(None) == ""


# ---- (k) allow-list, discover arguments, config section ----------------------------------------


def test_allow_list_env_keeps_builtins(site, monkeypatch):
    kmod = site.add("omnicore-fake-kernels", "1.2.3", "fastattn", KERNEL_PLUGIN)
    amod = site.add("omnicore-alpha", "1.0", "alpha", _dup_plugin("alpha"))
    monkeypatch.setenv("OMNICORE_ALLOW_PLUGINS", "fastattn, omnicore-audio-whisper")
    reg = Registry.discover()
    avail = {(r.name, r.provider) for r in reg.rows if r.status == "available"}
    assert avail >= {("fastattn", "omnicore-fake-kernels"), ("fakeenc", "omnicore-fake-kernels"), ("whisper", "omnicore-audio-whisper")}
    assert {p for _, p in avail} == {"omnicore", "omnicore-fake-kernels", "omnicore-audio-whisper"}  # built-ins stay on
    (alpha,) = rows_of(reg, "omnicore-alpha")
    assert alpha.status == "disabled"
    assert alpha.reason == (
        f"entry point 'alpha = {amod}' of omnicore-alpha 1.0: not in the allow-list "
        "(OMNICORE_ALLOW_PLUGINS: fastattn, omnicore-audio-whisper)"
    )
    assert amod not in sys.modules and kmod in sys.modules
    assert {r.status for r in reg.rows if r.provider in ("omnicore-image-siglip", "omnicore-image-movqgan")} == {"disabled"}


def test_discover_arguments_merge_with_env(site, monkeypatch):
    kmod = site.add("omnicore-fake-kernels", "1.2.3", "fastattn", KERNEL_PLUGIN)
    amod = site.add("omnicore-alpha", "1.0", "alpha", _dup_plugin("alpha"))
    site.add("omnicore-broken", "0.3.0", "broken", None, module=site.mod("gone"))
    monkeypatch.setenv("OMNICORE_DISABLE_PLUGINS", "siglip")
    reg = Registry.discover(disable=["omnicore_fake_kernels"], allow=None)  # distribution names compare normalised
    reasons = {r.provider: r.reason for r in reg.rows if r.status == "disabled"}
    assert reasons == {
        "omnicore-fake-kernels": f"entry point 'fastattn = {kmod}' of omnicore-fake-kernels 1.2.3: disabled by config plugins.disable",
        "omnicore-image-siglip": "entry point 'siglip = omnicore_image_siglip.plugin' of omnicore-image-siglip 0.1.0: disabled by OMNICORE_DISABLE_PLUGINS",
    }
    reg = Registry.discover(allow=["alpha"], disable=["broken"])
    assert {r.provider for r in reg.rows if r.status == "available"} == {"omnicore", "omnicore-alpha"}
    assert next(r for r in reg.rows if r.provider == "omnicore-fake-kernels").reason.endswith(
        "not in the allow-list (config plugins.allow: alpha)"
    )
    assert next(r for r in reg.rows if r.provider == "omnicore-broken").reason.endswith("disabled by config plugins.disable")
    with pytest.raises(RegistryError) as ei:
        Registry.discover(strict=True)
    assert "omnicore-broken 0.3.0 failed to import" in str(ei.value)
    assert str(ei.value).endswith("(strict mode: plugins.strict)")
    assert amod in sys.modules


def test_registry_for_config_section(site, tmp_path):
    from omnicore.config import ConfigError, load_config
    from omnicore.registry import registry_for

    site.add("omnicore-fake-kernels", "1.2.3", "fastattn", KERNEL_PLUGIN)
    site.add("omnicore-broken", "0.3.0", "broken", None, module=site.mod("gone"))
    cfg_file = tmp_path / "config.yaml"
    cfg_file.write_text(
        "data:\n  train: t.jsonl\nplugins:\n  disable: [broken]\n  allow: [omnicore-fake-kernels, broken, whisper]\n  strict: true\n"
    )
    cfg = load_config(cfg_file)
    assert (cfg.plugins.disable, cfg.plugins.allow, cfg.plugins.strict) == (
        ["broken"],
        ["omnicore-fake-kernels", "broken", "whisper"],
        True,
    )
    reg = registry_for(cfg)  # strict, but the broken plugin is disabled, so nothing raises
    assert {r.provider for r in reg.rows if r.status == "available"} == {"omnicore", "omnicore-fake-kernels", "omnicore-audio-whisper"}
    assert reg.resolve("kernel", "fastattn").name == "fastattn"
    cfg = load_config(cfg_file, ["--plugins.disable", "[]"])
    with pytest.raises(RegistryError, match="omnicore-broken 0.3.0 failed to import.*\\(strict mode: plugins.strict\\)$"):
        registry_for(cfg)
    default = load_config(cfg_file, {"plugins": {"disable": [], "allow": None, "strict": False}})
    assert {r.status for r in rows_of(registry_for(default), "omnicore-broken")} == {"failed"}
    cfg_file.write_text("data:\n  train: t.jsonl\nplugins:\n  alow: [x]\n")
    with pytest.raises(ConfigError) as ei:
        load_config(cfg_file)
    assert str(ei.value) == f"{cfg_file}: plugins.alow: unknown key; did you mean 'allow'?"


# ---- (l) the order of entry points never matters -------------------------------------------------


def test_entry_point_order_does_not_change_what_loads(site):
    import random
    from importlib import metadata

    site.add("omnicore-fake-kernels", "1.2.3", "fastattn", KERNEL_PLUGIN)
    site.add("omnicore-alpha", "1.0", "alpha", _dup_plugin("alpha"))
    site.add("omnicore-beta", "2.0", "beta", _dup_plugin("beta"))
    site.add("omnicore-halfway", "0.9", "halfway", HALFWAY_PLUGIN)
    site.add("omnicore-broken", "0.3.0", "broken", None, module=site.mod("gone"))
    site.add("omnicore-future", "3.1.0", "future", _dup_plugin("future"), api=">=3")
    eps = list(metadata.entry_points(group="omnicore"))
    assert len(eps) >= 6

    def summary(entry_points):
        reg = Registry.discover(entry_points=entry_points)
        return [(r.kind, r.name, r.provider, r.status, r.reason) for r in reg.rows]

    expected = summary(eps)
    for order in (list(reversed(eps)), random.Random(0).sample(eps, len(eps)), random.Random(1).sample(eps, len(eps))):
        assert summary(order) == expected
    available = {(k, n, p) for k, n, p, s, _ in expected if s == "available"}
    assert {("kernel", "fastattn", "omnicore-fake-kernels"), ("encoder", "fakeenc", "omnicore-fake-kernels")} <= available
    assert {(n, s) for _, n, p, s, _ in expected if p in ("omnicore-alpha", "omnicore-beta")} == {("dup", "conflict")}
    assert {p: s for _, _, p, s, _ in expected if p in ("omnicore-halfway", "omnicore-broken", "omnicore-future")} == {
        "omnicore-halfway": "failed",
        "omnicore-broken": "failed",
        "omnicore-future": "incompatible",
    }


# ---- (m) metadata-only listing and --check's subprocess import -----------------------------------


def test_entry_points_info_imports_nothing(site, monkeypatch):
    from omnicore.registry import entry_points_info

    fmod = site.add("omnicore-fake-kernels", "1.2.3", "fastattn", KERNEL_PLUGIN, api=">=1")
    xmod = site.add("omnicore-exits", "0.1", "exits", "import os\nos._exit(3)\n")
    site.add("omnicore-future", "3.1.0", "future", KERNEL_PLUGIN, api="<1")
    monkeypatch.setenv("OMNICORE_DISABLE_PLUGINS", "whisper")
    infos = {i.name: i for i in entry_points_info()}
    assert fmod not in sys.modules and xmod not in sys.modules
    assert infos["fastattn"].as_dict() == {
        "name": "fastattn",
        "provider": "omnicore-fake-kernels",
        "version": "1.2.3",
        "value": fmod,
        "api": ">=1",
        "status": "not loaded",
        "reason": "",
    }
    assert (infos["future"].status, infos["whisper"].status, infos["exits"].status) == ("incompatible", "disabled", "")
    assert infos["siglip"].api == ">=2.0,<3"


@pytest.mark.slow
def test_check_import_reports_time_torch_and_crashes(tmp_path):
    from omnicore.registry import check_import

    (tmp_path / "ok_hook.py").write_text("X = 1\n")
    (tmp_path / "fake_heavy.py").write_text("import sys, types\nsys.modules['torch'] = types.ModuleType('torch')\n")
    (tmp_path / "exits_hook.py").write_text("import os\nos._exit(3)\n")
    (tmp_path / "raises_hook.py").write_text("raise RuntimeError('boom at import')\n")
    (tmp_path / "segv_hook.py").write_text("import ctypes\nctypes.string_at(0)\n")
    import os

    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(tmp_path)
    try:
        ok = check_import("ok_hook", ["fake_heavy"])
        exits = check_import("exits_hook")
        raises = check_import("raises_hook", ["ok_hook"])
        segv = check_import("segv_hook")
        missing = check_import("ok_hook", ["no_such_module_xyz"])
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old
    assert (ok.ok, ok.torch, ok.hook_torch, ok.error) == (True, True, False, "")
    assert 0 <= ok.import_s < 30 and ok.summary().startswith("ok ") and ok.summary().endswith("s torch")
    assert (exits.ok, exits.error) == (False, "import process exited with status 3 before reporting")
    assert (raises.ok, raises.error) == (False, "RuntimeError: boom at import")
    assert segv.ok is False and segv.error.startswith("import process killed by SIGSEGV before reporting")
    assert (missing.ok, missing.error) == (False, "ModuleNotFoundError: No module named 'no_such_module_xyz'")
    assert raises.summary() == "FAILED: RuntimeError: boom at import"


@pytest.mark.parametrize(
    ("kind", "name", "options", "message"),
    [
        ("parallel", "fsdp2", {"reshard": True}, "options of parallel/fsdp2: reshard: unknown key; this component takes no options"),
        ("parallel", "none", {"x": 1}, "options of parallel/none: x: unknown key; this component takes no options"),
        ("parallel", "ep", {"chunk": 2}, "options of parallel/ep: chunk: unknown key; did you mean 'chunks'?"),
        ("kernel", "sdpa", {"causal": False}, "options of kernel/sdpa: causal: unknown key; this component takes no options"),
        (
            "kernel",
            "sdpa_varlen",
            {"pad_below": 64},
            "options of kernel/sdpa_varlen: pad_below: unknown key; this component takes no options",
        ),
    ],
)
def test_builtin_options_are_never_silently_ignored(kind, name, options, message):
    """Every built-in has an options model: a misspelt or unsupported key is an error naming it."""
    with pytest.raises(RegistryError) as ei:
        Registry.discover().build(kind, name, options)
    assert message in str(ei.value)


def test_every_builtin_declares_an_options_model():
    from omnicore import builtins

    specs = [
        s for hook in (builtins.omnicore_foundations, builtins.omnicore_parallel_strategies, builtins.omnicore_kernels) for s in hook()
    ]
    assert len(specs) >= 12 and all(s.options_model for s in specs), [s.key for s in specs if not s.options_model]
