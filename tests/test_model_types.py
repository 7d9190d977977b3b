"""``model.foundation: {name: auto}``: which installed foundation serves a checkpoint's ``model_type``
(:mod:`omnicore.registry.model_types`), answered from the specs' ``extra["model_types"]``, and how
``omnicore plugins`` shows what each foundation serves. Torch-free and quick: small plugin objects
in isolated registries, JSON config files in ``tmp_path``."""

from __future__ import annotations

import json
import re

import pytest

from omnicore.api import ComponentSpec, hookimpl
from omnicore.registry import RegistryError
from omnicore.registry.model_types import checkpoint_model_type, foundation_for, resolve_auto, served_model_types
from omnicore.testing import cli_main, installed_fake_distribution


class Family:
    """A plugin object registering ``foundation/<name>`` that serves ``model_types``."""

    def __init__(self, name: str, *model_types: str, requires: tuple[str, ...] = ()) -> None:
        self.name, self.model_types, self.requires = name, model_types, requires

    @hookimpl
    def omnicore_foundations(self) -> list[ComponentSpec]:
        extra = {"model_types": self.model_types} if self.model_types else {}
        return [ComponentSpec(name=self.name, target=f"{self.name}_mod:build", requires=self.requires, extra=extra)]


def checkpoint(tmp_path, config: dict | None) -> str:
    """A checkpoint folder whose ``config.json`` is ``config`` (none when None)."""
    folder = tmp_path / "ckpt"
    folder.mkdir(exist_ok=True)
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def test_auto_picks_the_family_that_names_the_model_type(isolated_registry, tmp_path):
    reg = isolated_registry(
        (Family("llava", "llava"), "fam-llava"),
        (Family("qwen2_vl", "qwen2_vl", "qwen2_5_vl"), "fam-qwen2-vl"),
        (Family("generic", "*"), "fam-kit"),
        builtins=True,  # hf_causal_lm names no model type: never picked
    )
    assert resolve_auto(reg.rows, "auto", {"checkpoint": checkpoint(tmp_path, {"model_type": "qwen2_5_vl"})}) == "qwen2_vl"
    assert foundation_for(reg.rows, "llava") == "llava"
    assert reg.foundation_for("qwen2_vl") == "qwen2_vl"
    assert resolve_auto(reg.rows, "llava", {}) == "llava"  # a name other than auto is kept as it is, nothing read


def test_the_generic_family_serves_what_no_family_names(isolated_registry, tmp_path):
    reg = isolated_registry((Family("llava", "llava"), "fam-llava"), (Family("generic", "*"), "fam-kit"))
    assert resolve_auto(reg.rows, "auto", {"checkpoint": checkpoint(tmp_path, {"model_type": "gemma3"})}) == "generic"
    assert sorted(served_model_types(reg.rows)) == ["*", "llava"]


def test_two_families_naming_the_model_type_is_an_error_listing_provider_choices(isolated_registry):
    reg = isolated_registry(
        (Family("llava", "llava"), "fam-llava"),
        (Family("llava_plus", "llava", "llava_next"), "fam-other"),
        (Family("generic", "*"), "fam-kit"),
    )
    with pytest.raises(RegistryError) as err:
        foundation_for(reg.rows, "llava")
    assert str(err.value) == (
        "model.foundation: name auto: several foundations serve model type 'llava': 'fam-llava:llava', 'fam-other:llava_plus'; "
        "name one instead of auto"
    )
    assert foundation_for(reg.rows, "llava_next") == "llava_plus"  # named by one of them only


def test_two_generic_families_are_an_error_too(isolated_registry):
    reg = isolated_registry((Family("generic", "*"), "fam-kit"), (Family("any", "*"), "fam-any"))
    with pytest.raises(RegistryError) as err:
        foundation_for(reg.rows, "bert")
    assert str(err.value) == (
        "model.foundation: name auto: several foundations serve any model type (generic families): 'fam-kit:generic', "
        "'fam-any:any'; name one instead of auto"
    )


def test_no_family_and_no_generic_names_the_served_types(isolated_registry):
    reg = isolated_registry((Family("qwen2_vl", "qwen2_vl", "qwen2_5_vl"), "fam-qwen2-vl"), (Family("llava", "llava"), "fam-llava"))
    with pytest.raises(RegistryError) as err:
        foundation_for(reg.rows, "qwen3_vl", "model.foundation")
    assert str(err.value) == (
        "model.foundation: name auto: no installed family serves model type 'qwen3_vl' (served: llava, qwen2_5_vl, qwen2_vl) "
        "and no generic family is installed; pip install omnicore-family-kit (the generic family) or the family plugin for this model"
    )
    with pytest.raises(RegistryError, match=r"model type 'llava' \(served: none\)"):
        foundation_for(isolated_registry(builtins=True).rows, "llava")


def test_an_unavailable_family_serves_nothing(isolated_registry):
    reg = isolated_registry(
        (Family("llava_gpu", "llava", requires=("no_such_module_for_model_types",)), "fam-gpu"), (Family("generic", "*"), "fam-kit")
    )
    assert [r.status for r in reg.rows if r.name == "llava_gpu"] == ["unavailable"]
    assert foundation_for(reg.rows, "llava") == "generic"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (None, r"model.foundation.options.checkpoint: '.*ckpt' has no config.json; point it at a folder written by save_pretrained"),
        ({"architectures": ["LlavaForConditionalGeneration"]}, r"model.foundation.options.checkpoint: .*config.json names no model_type"),
        ({"model_type": ""}, r"config.json names no model_type"),
        ({"model_type": 3}, r"config.json names no model_type"),
    ],
)
def test_a_folder_without_a_model_type_names_the_field(isolated_registry, tmp_path, config, message):
    reg = isolated_registry((Family("generic", "*"), "fam-kit"))
    with pytest.raises(RegistryError, match=message):
        resolve_auto(reg.rows, "auto", {"checkpoint": checkpoint(tmp_path, config)})


def test_a_bad_config_json_and_a_missing_checkpoint_option_name_the_field(isolated_registry, tmp_path):
    folder = checkpoint(tmp_path, None)
    (tmp_path / "ckpt" / "config.json").write_text("{not json")
    with pytest.raises(RegistryError, match=r"model.encoders.x.options.checkpoint: .*config.json is not valid JSON"):
        checkpoint_model_type(folder, "model.encoders.x.options.checkpoint")
    reg = isolated_registry((Family("generic", "*"), "fam-kit"))
    with pytest.raises(RegistryError, match=r"model.foundation: name auto needs options.checkpoint"):
        resolve_auto(reg.rows, "auto", {})


HOOK = """
from omnicore.api import ComponentSpec, hookimpl


@hookimpl
def omnicore_foundations():
    return [
        ComponentSpec(name="foofam", target="foofam_mod:build", description="the foo family", extra={"model_types": ("foo", "foo_thinker")}),
        ComponentSpec(name="nofam", target="foofam_mod:build", description="serves nothing named"),
    ]
"""


def test_omnicore_plugins_shows_what_a_foundation_serves(tmp_path, capsys):
    with installed_fake_distribution(tmp_path / "site", "omnicore-foofam", "0.2", {"foofam": "foofam_hook"}, {"foofam_hook": HOOK}):
        assert cli_main(["plugins", "--kind", "foundation", "--json"]) == 0
        rows = {d["name"]: d for d in json.loads(capsys.readouterr().out) if d["provider"] == "omnicore-foofam"}
        assert cli_main(["plugins", "--kind", "foundation"]) == 0
        table = capsys.readouterr().out.splitlines()
    assert rows["foofam"]["model_types"] == ["foo", "foo_thinker"]
    assert rows["foofam"]["description"] == "the foo family"  # the JSON keeps the spec's description as it is
    assert rows["nofam"]["model_types"] == []
    foofam = [line for line in table if line.startswith("foundation") and " foofam " in line]
    nofam = [line for line in table if " nofam " in line]
    assert len(foofam) == 1 and re.search(r" available +the foo family \[serves: foo, foo_thinker\]$", foofam[0]), table
    assert len(nofam) == 1 and re.search(r" available +serves nothing named$", nofam[0]), table
    generic = [line for line in table if " generic " in line and "omnicore-family-kit" in line]
    assert all(line.endswith("[serves: any other model type]") for line in generic), generic  # "*" in words
