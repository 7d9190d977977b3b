"""``omnicore_family_kit.checkpoint``: a family's checkpoint folder check, and the hint naming the
installed foundation that serves another model type, read from the registry's specs (no table).
Torch-free: small plugin objects in isolated registries stand for the installed families."""

from __future__ import annotations

import json

import pytest

from omnicore.api import ComponentSpec, hookimpl
from omnicore_family_kit import checkpoint as kit

WHAT = "model.foundation.options.checkpoint"
PUT = "point options.checkpoint at a Foo folder"


class Family:
    """A plugin object registering ``foundation/<name>`` that serves ``model_types``."""

    def __init__(self, name: str, *model_types: str) -> None:
        self.name, self.model_types = name, model_types

    @hookimpl
    def omnicore_foundations(self) -> list[ComponentSpec]:
        return [ComponentSpec(name=self.name, target=f"{self.name}_mod:build", extra={"model_types": self.model_types})]


@pytest.fixture
def installed(monkeypatch, isolated_registry):
    """Factory: make the kit see exactly these families as the installed ones."""

    def make(*families: Family) -> None:
        rows = tuple(isolated_registry(*((f, f"fam-{f.name}") for f in families)).rows)
        monkeypatch.setattr(kit, "_installed_rows", lambda: rows)

    return make


def folder_of(tmp_path, model_type) -> str:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    return str(tmp_path)


def test_a_folder_of_the_family_is_returned(tmp_path, installed):
    installed(Family("foo", "foo", "foo_thinker"))
    assert kit.checkpoint_folder(folder_of(tmp_path, "foo_thinker"), WHAT, ("foo", "foo_thinker"), PUT) == tmp_path


def test_another_family_s_checkpoint_names_the_foundation_serving_it(tmp_path, installed):
    installed(Family("foo", "foo"), Family("barfam", "bar", "bar_vl"), Family("generic", "*"))
    with pytest.raises(ValueError) as err:
        kit.checkpoint_folder(folder_of(tmp_path, "bar_vl"), WHAT, ("foo",), PUT)
    assert str(err.value) == (
        f"{WHAT}: {tmp_path / 'config.json'} has model_type 'bar_vl', not one of foo; model type 'bar_vl' is served by "
        f"foundation/barfam: set model.foundation.name to barfam (or auto); otherwise {PUT}"
    )
    with pytest.raises(ValueError) as err:  # an encoder's field: the checkpoint belongs to a foundation, not to it
        kit.checkpoint_folder(str(tmp_path), "model.encoders.image.options.checkpoint", ("foo",), PUT)
    assert "served by foundation/barfam: point model.foundation (name: barfam, or auto) at it, not model.encoders.image;" in str(err.value)
    with pytest.raises(ValueError, match=r"model_type 'gemma3', not one of foo; model type 'gemma3' is served by foundation/generic: "):
        kit.checkpoint_folder(folder_of(tmp_path, "gemma3"), WHAT, ("foo",), PUT)


def test_no_hint_where_no_foundation_serves_it(tmp_path, installed):
    installed(Family("foo", "foo"))  # no generic family
    with pytest.raises(ValueError) as err:
        kit.checkpoint_folder(folder_of(tmp_path, "bar"), WHAT, ("foo",), PUT)
    assert str(err.value) == f"{WHAT}: {tmp_path / 'config.json'} has model_type 'bar', not one of foo; otherwise {PUT}"
    installed(Family("a", "bar"), Family("b", "bar"))  # two serve it: the hint would have to choose; none given
    assert kit.family_hint("bar", WHAT) == ""
    assert kit.family_hint(None, WHAT) == ""


def test_a_missing_or_bad_config_names_the_field(tmp_path, installed):
    installed(Family("foo", "foo"))
    with pytest.raises(ValueError, match=rf"^{WHAT}: '.*' has no config.json; {PUT}$"):
        kit.checkpoint_folder(str(tmp_path), WHAT, ("foo",), PUT)
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(ValueError, match=r"config.json is not valid JSON"):
        kit.checkpoint_folder(str(tmp_path), WHAT, ("foo",), PUT)
