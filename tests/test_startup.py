"""What keeps ``omnicore plugins`` fast gives the same answers as the slow path it replaces.

* :mod:`omnicore.registry.distinfo` reads the installed entry points and versions. It is compared
  with :mod:`importlib.metadata` on this environment and on synthetic ``sys.path`` layouts. Each
  layout it does not mirror must make it decline (``None``), so that the caller asks
  ``importlib.metadata``.
* ``policy._plain_contains`` decides plain core API ranges. It is compared with
  ``packaging.specifiers.SpecifierSet.contains`` over a grid.
* The listing's parser (``plugins`` alone) parses and fails as :func:`omnicore.cli.build_parser`'s.
* The listing imports neither ``importlib.metadata`` (with ``email``) nor ``packaging``.
"""

from __future__ import annotations

import importlib
import io
import subprocess
import sys
import zipfile
from contextlib import redirect_stderr
from importlib import metadata
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from omnicore.registry import distinfo
from omnicore.registry.policy import _plain_contains, api_compatible, entry_points_info

GROUP = "omnicore"


def _view(eps) -> list[tuple]:
    """What the registry reads of each entry point: name, value, group, the folder, Name, Version, Keywords."""
    out = []
    for ep in eps:
        md = ep.dist.metadata
        out.append((ep.name, ep.value, ep.group, Path(str(ep.dist._path)), md["Name"], md["Version"], md.get_all("Keywords")))
    return out


def _both(group: str = GROUP) -> tuple[list[tuple] | None, list[tuple]]:
    """The fast reader's view (None when it declines) and importlib.metadata's, of the current sys.path."""
    importlib.invalidate_caches()
    fast = distinfo.entry_points(group, force=True)
    return (None if fast is None else _view(fast)), _view(metadata.entry_points(group=group))


# ---- the installed environment --------------------------------------------------------------------


@pytest.mark.parametrize("group", [GROUP, "console_scripts", "pytest11", "no-such-group"])
def test_installed_entry_points_match_importlib_metadata(group):
    fast, slow = _both(group)
    assert fast is not None, "the venv's plain layout must be read by the fast reader"
    assert fast == slow
    if group == GROUP:
        assert {v[4] for v in fast} >= {"omnicore-audio-whisper", "omnicore-image-siglip", "omnicore-image-movqgan"}


def test_installed_listing_matches_importlib_metadata():
    """entry_points_info (what ``omnicore plugins --no-load`` prints) is the same from either reader."""
    fast = distinfo.entry_points(GROUP, force=True)
    assert fast is not None
    as_dicts = [i.as_dict() for i in entry_points_info(fast)]
    assert as_dicts == [i.as_dict() for i in entry_points_info(metadata.entry_points(group=GROUP))]
    assert {d["api"] for d in as_dicts if d["provider"].startswith("omnicore-")} == {">=2.0,<3"}


@pytest.mark.parametrize("name", ["omnicore", "pluggy", "packaging", "omnicore-audio-whisper", "omnicore_image_siglip", "PyYAML"])
def test_installed_versions_match_importlib_metadata(name):
    assert distinfo.version(name, force=True) == metadata.version(name)


def test_missing_distribution_is_left_to_importlib_metadata():
    assert distinfo.version("no-such-distribution-anywhere", force=True) is None


def test_declines_once_importlib_metadata_is_imported():
    """Here (pytest) importlib.metadata is loaded: the registry then asks it, patches included."""
    assert "importlib.metadata" in sys.modules
    assert distinfo.entry_points(GROUP) is None and distinfo.version("omnicore") is None


# ---- synthetic layouts --------------------------------------------------------------------------


def _dist(root: Path, folder: str, metadata_text: str | None, entry_points: str | None, *, file_name: str = "METADATA") -> Path:
    info = root / folder
    info.mkdir(parents=True)
    if metadata_text is not None:
        (info / file_name).write_text(metadata_text)
    if entry_points is not None:
        (info / "entry_points.txt").write_text(entry_points)
    return info


@pytest.fixture
def layout(tmp_path, monkeypatch):
    """Two roots on sys.path (and a missing one) with the cases the fast reader mirrors."""
    a, b = tmp_path / "a", tmp_path / "b"
    _dist(
        a,
        "plain_plugin-1.0.dist-info",
        "Metadata-Version: 2.1\nName: plain-plugin\nVersion: 1.0 \nKeywords: omnicore-api >=2.0,<3\n\nlong description\n",
        "# a comment\n\n[console_scripts]\nplain = plain_plugin.cli:main\n[omnicore]\n  plain   =   plain_plugin.plugin  \nsecond=plain_plugin.more:hooks.obj\n",
    )
    _dist(
        a,
        "folded-2.0.dist-info",  # a folded License, keywords twice and in another case, CRLF line ends
        "Metadata-Version: 2.1\r\nName: Folded\r\nVersion: 2.0\r\nLicense: MIT\r\n        second line\r\nkeywords: first\r\n"
        "Keywords: omnicore-api >=2,<3\r\n\r\nbody\r\n",
        "[omnicore]\nfolded = folded_mod:plugin\n[other.group]\nx = pkg.mod:attr [extra1, extra2]\n",
    )
    _dist(a, "dup-1.0.dist-info", "Name: dup\nVersion: 1.0\n", "[omnicore]\ndup = dup_first\n")
    _dist(b, "dup-9.0.dist-info", "Name: dup\nVersion: 9.0\n", "[omnicore]\ndup = dup_second\n")  # shadowed by a's
    _dist(
        b,
        "legacy-0.5.egg-info",
        "Metadata-Version: 1.1\nName: legacy\nVersion: 0.5\n",
        "[omnicore]\nlegacy = legacy_mod\n",
        file_name="PKG-INFO",
    )
    (b / "old_style-0.1.egg-info").write_text("Metadata-Version: 1.0\nName: old-style\nVersion: 0.1\n")  # a file, no entry points
    _dist(b, "no_entry_points-3.0.dist-info", "Name: no-entry-points\nVersion: 3.0\n", None)
    _dist(b, "stray-1.0.dist-info", "Name: stray\nVersion: 1.0\n", "orphan = before_any_section\n[omnicore]\n")
    monkeypatch.setattr(sys, "path", [str(a), str(tmp_path / "missing"), str(b)])
    return a, b


def test_synthetic_layout_matches_importlib_metadata(layout):
    fast, slow = _both()
    assert fast is not None
    assert fast == slow
    names = [(v[0], v[1], v[5]) for v in fast]
    assert ("dup", "dup_first", "1.0") in names and ("dup", "dup_second", "9.0") not in names  # the first root wins
    assert ("plain", "plain_plugin.plugin", "1.0 ") in names  # values stripped; a header value keeps trailing spaces
    assert ("legacy", "legacy_mod", "0.5") in names
    assert _both("console_scripts")[0] == _both("console_scripts")[1]
    for name in ("dup", "plain-plugin", "Folded", "legacy", "old_style", "no-entry-points"):
        assert distinfo.version(name, force=True) == metadata.version(name), name


def test_loads_like_importlib_metadata(layout):
    a, _ = layout  # on sys.path: its modules import
    (a / "plain_plugin").mkdir()
    (a / "plain_plugin" / "__init__.py").write_text("")
    (a / "plain_plugin" / "more.py").write_text("class hooks:\n    obj = 42\n")
    importlib.invalidate_caches()
    try:
        fast = {ep.name: ep for ep in distinfo.entry_points(GROUP, force=True) or []}
        slow = {ep.name: ep for ep in metadata.entry_points(group=GROUP)}
        assert fast["second"].load() == slow["second"].load() == 42
        assert (fast["second"].module, fast["second"].attr) == (slow["second"].module, slow["second"].attr)
        with pytest.raises(ModuleNotFoundError) as fast_error:
            fast["plain"].load()
        with pytest.raises(ModuleNotFoundError) as slow_error:
            slow["plain"].load()
        assert str(fast_error.value) == str(slow_error.value)
    finally:
        for mod in [m for m in sys.modules if m.startswith("plain_plugin")]:
            del sys.modules[mod]


def _declines(root: Path, monkeypatch, *extra_path) -> bool:
    """Whether the fast reader declines to list the entry points of ``root`` (and ``extra_path``)."""
    monkeypatch.setattr(sys, "path", [str(root), *extra_path])
    importlib.invalidate_caches()
    return distinfo.entry_points(GROUP, force=True) is None


@pytest.mark.parametrize(
    "case",
    [
        "value with extras",
        "line without equals",
        "no METADATA",
        "folded Keywords",
        "no Version",
        "upper-case suffix",
        "form feed in headers",
        "envelope line",
    ],
)
def test_declines_what_it_does_not_mirror(tmp_path, monkeypatch, case):
    root = tmp_path / "site"
    md, eps, folder = "Name: x\nVersion: 1\n", "[omnicore]\nx = x_mod\n", "x-1.dist-info"
    if case == "value with extras":
        eps = "[omnicore]\nx = x_mod:attr [extra]\n"
    elif case == "line without equals":
        eps = "[console_scripts]\njust a line\n"
    elif case == "no METADATA":
        md = None
    elif case == "folded Keywords":
        md += "Keywords: omnicore-api >=2.0,\n  <3\n"
    elif case == "no Version":
        md = "Name: x\n"
    elif case == "upper-case suffix":
        folder = "x-1.DIST-INFO"
    elif case == "form feed in headers":
        md += "Summary: a\x0cb\n"
    elif case == "envelope line":
        md = "From someone\n" + md
    _dist(root, folder, md, eps)
    assert _declines(root, monkeypatch)
    if case in ("value with extras", "line without equals"):  # entry points only: the version is still read
        assert distinfo.version("x", force=True) == metadata.version("x") == "1"
    else:
        assert distinfo.version("x", force=True) is None


def test_declines_zip_egg_and_foreign_finders(tmp_path, monkeypatch):
    root = tmp_path / "site"
    _dist(root, "x-1.dist-info", "Name: x\nVersion: 1\n", "[omnicore]\nx = x_mod\n")
    archive = tmp_path / "deps.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("y-1.dist-info/METADATA", "Name: y\nVersion: 1\n")
    assert _declines(root, monkeypatch, str(archive))
    egg = tmp_path / "z-1.egg"
    egg.mkdir()
    assert _declines(root, monkeypatch, str(egg))
    monkeypatch.setattr(sys, "path", [str(root), Path(root)])
    assert distinfo.entry_points(GROUP, force=True) is None

    class Finder:
        @staticmethod
        def find_distributions(context=None):
            return iter(())

    monkeypatch.setattr(sys, "path", [str(root)])
    assert distinfo.entry_points(GROUP, force=True) is not None
    monkeypatch.setattr(sys, "meta_path", [*sys.meta_path, Finder()])
    assert distinfo.entry_points(GROUP, force=True) is None


# ---- plain core API ranges ------------------------------------------------------------------------

PLAIN = [
    ">=2.0,<3",
    ">=2,<3",
    " >= 2.0 , < 3 ",
    ",>=2,",
    "==2",
    "==2.0.0",
    "==02.0",
    "!=2.0",
    "<=2",
    ">2",
    ">2.0.0",
    "<2.0.1",
    ">=1.0,<2",
    ">1.3,<=2.0",
    ">=3",
]
NOT_PLAIN = ["~=2.0", "==2.*", ">=2.0rc1", "===2.0", ">=2.0.post1", "bogus", ">=2.0;", "<2.0+local", ">==2", "=>2", "2.0", ">=v2"]
VERSIONS = ["1.0", "1.3", "2", "2.0", "2.0.0", "2.0.1", "2.1", "3", "3.0", "10.0"]


@pytest.mark.parametrize("spec", PLAIN)
def test_plain_ranges_agree_with_packaging(spec):
    for version in VERSIONS:
        assert _plain_contains(spec, version) is SpecifierSet(spec).contains(version, prereleases=True), (spec, version)


@pytest.mark.parametrize("spec", NOT_PLAIN)
def test_other_ranges_are_left_to_packaging(spec):
    assert _plain_contains(spec, "2.0") is None


def test_a_pre_release_core_api_is_left_to_packaging():
    assert _plain_contains(">=2.0", "2.0rc1") is None and _plain_contains(">=2.0", "2.0.post1") is None


def test_api_compatible_keeps_packaging_errors():
    assert api_compatible(">=2.0,<3") is True and api_compatible(">=1.0,<2") is False and api_compatible("~=2.0") is True
    with pytest.raises(ValueError, match="bogus"):
        api_compatible("bogus")


# ---- the listing's parser and imports -----------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [["plugins"], ["plugins", "--json", "--kind", "encoder"], ["plugins", "--no-load"], ["plugins", "--check", "--check-timeout", "5"]],
)
def test_listing_parser_parses_as_the_full_parser(argv):
    from omnicore.cli import _parser_for, build_parser

    assert vars(_parser_for(argv).parse_known_args(argv)[0]) == vars(build_parser().parse_known_args(argv)[0])
    assert type(_parser_for(["train", "c.yaml"])) is type(build_parser())


@pytest.mark.parametrize("argv", [["plugins", "--bogus"], ["plugins", "--no-load", "--kind", "encoder"], ["plugins", "--kind", "encoders"]])
def test_listing_errors_are_the_full_parsers(argv):
    from omnicore.cli import build_parser, main

    err = io.StringIO()
    with redirect_stderr(err), pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    usage = build_parser().format_usage() if argv[1] != "--kind" else "usage: omnicore plugins "
    assert err.getvalue().startswith(usage), err.getvalue()


@pytest.mark.cli
def test_listing_imports_neither_importlib_metadata_nor_packaging(tmp_path):
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "omnicore", "plugins", "--json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    imported = {line.split("|")[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}
    assert "omnicore.registry.distinfo" in imported  # the trace is real
    assert not imported & {"importlib.metadata", "email", "packaging", "packaging.specifiers", "zipfile"}, sorted(imported)
    assert '"provider": "omnicore-audio-whisper"' in r.stdout
