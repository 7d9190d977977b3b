"""scripts/check_dist.py, the metadata check of scripts/build_dist.sh, on hand-made wheels and sdists.

A complete plugin distribution passes; each field taken away or made wrong gives one line naming
the distribution and the field. (tests/test_dist_install.py runs the check on the real builds.)
"""

from __future__ import annotations

import importlib.util
import io
import tarfile
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT

spec = importlib.util.spec_from_file_location("check_dist", ROOT / "scripts" / "check_dist.py")
check_dist = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_dist)

README = "# omnicore-fake\n\nA fake plugin for the checker.\n"
GOOD = {
    "Metadata-Version": "2.4",
    "Name": "omnicore-fake",
    "Version": "0.2.0",
    "Summary": "a fake plugin",
    "License-Expression": "Apache-2.0",
    "Keywords": "omnicore-api >=2.0,<3",
    "Classifier": [f"Programming Language :: Python :: {v}" for v in ("3", "3.10", "3.11", "3.12", "3.13")],
    "Requires-Python": ">=3.10",
    "Description-Content-Type": "text/markdown",
    "License-File": "LICENSE",
    "Requires-Dist": ["omnicore<0.2,>=0.1", "numpy>=1.26", 'pytest>=8; extra == "test"'],
}


def _metadata(fields: dict) -> str:
    lines = []
    for key, value in fields.items():
        for v in value if isinstance(value, list) else [value]:
            lines.append(f"{key}: {v}")
    return "\n".join(lines) + "\n\n" + README


def _build(tmp_path: Path, fields: dict, *, entry_points: str = "[omnicore]\nfake = omnicore_fake.plugin\n", sdist_files=None) -> Path:
    """A project folder and, in tmp_path/dist, a wheel with METADATA ``fields`` and an sdist."""
    project = tmp_path / "omnicore-fake"
    project.mkdir()
    (project / "pyproject.toml").write_text('[project]\nname = "omnicore-fake"\nversion = "0.2.0"\nreadme = "README.md"\n')
    (project / "README.md").write_text(README)
    dist = tmp_path / "dist"
    dist.mkdir()
    info = "omnicore_fake-0.2.0.dist-info"
    with zipfile.ZipFile(dist / "omnicore_fake-0.2.0-py3-none-any.whl", "w") as zf:
        zf.writestr("omnicore_fake/__init__.py", "")
        zf.writestr(f"{info}/METADATA", _metadata(fields))
        zf.writestr(f"{info}/entry_points.txt", entry_points)
        zf.writestr(f"{info}/licenses/LICENSE", "Apache License\n")
    with tarfile.open(dist / "omnicore_fake-0.2.0.tar.gz", "w:gz") as tf:
        for name in sdist_files if sdist_files is not None else ["PKG-INFO", "pyproject.toml", "README.md", "LICENSE"]:
            data = b"x"
            member = tarfile.TarInfo(f"omnicore_fake-0.2.0/{name}")
            member.size = len(data)
            tf.addfile(member, io.BytesIO(data))
    return project


def test_a_complete_plugin_distribution_passes(tmp_path):
    project = _build(tmp_path, GOOD)
    assert check_dist.check_project(tmp_path / "dist", project) == []


@pytest.mark.parametrize(
    "change, problem",
    [
        ({"License-Expression": None}, "no License-Expression"),
        ({"Summary": None}, "no Summary (set description)"),
        ({"Classifier": GOOD["Classifier"][:-1]}, "no Classifier 'Programming Language :: Python :: 3.13'"),
        ({"Requires-Python": ">=3.11"}, "Requires-Python '>=3.11' excludes Python 3.10"),
        ({"Description-Content-Type": "text/x-rst"}, "Description-Content-Type is 'text/x-rst', not 'text/markdown'"),
        ({"Keywords": "omnicore-api >=1.2,<2"}, "keyword omnicore-api '>=1.2,<2', not '<3,>=2.0' (core API 2.x)"),
        ({"Keywords": "audio"}, "no keyword 'omnicore-api <3,>=2.0'"),
        ({"Requires-Dist": ["omnicore>=0.1", "numpy"]}, "depends on omnicore>=0.1, not omnicore<0.2,>=0.1"),
        ({"Requires-Dist": ["numpy"]}, "no dependency 'omnicore<0.2,>=0.1'"),
        ({"Version": "0.2.1"}, "Version is '0.2.1', not '0.2.0'"),
    ],
    ids=lambda x: x if isinstance(x, str) else None,
)
def test_each_missing_or_wrong_field_is_named(tmp_path, change, problem):
    fields = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    project = _build(tmp_path, fields)
    (line,) = check_dist.check_project(tmp_path / "dist", project)
    assert line.startswith("omnicore-fake 0.2.0 (omnicore_fake-0.2.0-py3-none-any.whl): ")
    assert problem in line and line.endswith(f"(fix {project}/pyproject.toml)"), line


def test_long_description_must_be_the_readme(tmp_path):
    project = _build(tmp_path, GOOD)
    (project / "README.md").write_text(README + "\nA line added after the build.\n")
    (line,) = check_dist.check_project(tmp_path / "dist", project)
    assert "the long description is not README.md" in line


def test_missing_entry_point_and_sdist_files_are_named(tmp_path):
    project = _build(
        tmp_path, GOOD, entry_points="[console_scripts]\nfake = omnicore_fake:main\n", sdist_files=["PKG-INFO", "pyproject.toml"]
    )
    assert check_dist.check_project(tmp_path / "dist", project) == [
        f"omnicore-fake 0.2.0 (omnicore_fake-0.2.0-py3-none-any.whl): no entry point of the group 'omnicore' (fix {project}/pyproject.toml [project.entry-points.omnicore])",
        "omnicore-fake 0.2.0 (omnicore_fake-0.2.0.tar.gz): README.md is not in the sdist",
        "omnicore-fake 0.2.0 (omnicore_fake-0.2.0.tar.gz): LICENSE is not in the sdist",
    ]


def test_a_missing_build_is_named(tmp_path):
    project = _build(tmp_path, GOOD)
    (tmp_path / "dist" / "omnicore_fake-0.2.0.tar.gz").unlink()
    assert check_dist.check_project(tmp_path / "dist", project) == [
        f"omnicore-fake 0.2.0: expected one wheel and one sdist in {tmp_path / 'dist'}, found ['omnicore_fake-0.2.0-py3-none-any.whl']"
    ]


def test_the_tree_provides_the_api_range_the_plugins_declare():
    """The versions read without importing are the imported ones, and they lie in the two ranges."""
    import omnicore

    assert check_dist.core_versions() == (omnicore.__version__, omnicore.CORE_API_VERSION)
    assert check_dist.check_mapping() == []
    assert str(check_dist.API_RANGE) == "<3,>=2.0" and str(check_dist.CORE_RANGE) == "<0.2,>=0.1"
