"""The generated reference (``scripts/gen_reference.py``) is current, and the check notices when it is not.

PLUGINS.md's hook, contract and API regions and ``docs/reference/config.md`` are generated from the
docstrings and the config models; like llm's ``cog --check``, the check regenerates them in memory and
fails with a diff when the files differ. The staleness tests change a copy of a source (a new
``Encoder`` member, a new config field), never the repository, and compare against text written out
here by hand.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "scripts" / "gen_reference.py")
gen = importlib.util.module_from_spec(_spec)
sys.modules["gen_reference"] = gen  # dataclasses resolve their annotations through sys.modules
_spec.loader.exec_module(gen)

NEW_MEMBER = '''    def warm_up(self, steps: int = 3) -> None:
        """Run ``steps`` dummy batches before training (a member added by this test).

        A second paragraph, indented under its list item."""

'''
NEW_MEMBER_MD = [
    "+- `warm_up(steps: int = 3) -> None`: Run `steps` dummy batches before training (a member added by this test).\n",
    "+\n",
    "+  A second paragraph, indented under its list item.\n",
]


def _with_member(tmp_path: Path, member: str) -> gen.Sources:
    """Sources whose components.py is a copy with ``member`` inserted before ``Encoder.forward``,
    and whose outputs are copies of the committed files."""
    text = (ROOT / "omnicore" / "components.py").read_text()
    encoder = text.index("class Encoder(Protocol):")
    forward = text.index("    def forward(", encoder)
    assert text.index("\nclass ", encoder + 1) > forward, "Encoder has no forward method to insert before"
    (tmp_path / "components.py").write_text(text[:forward] + member + text[forward:])
    shutil.copy(ROOT / "PLUGINS.md", tmp_path / "PLUGINS.md")
    shutil.copy(ROOT / "docs" / "reference" / "config.md", tmp_path / "config.md")
    return gen.Sources(components=tmp_path / "components.py", plugins_md=tmp_path / "PLUGINS.md", config_md=tmp_path / "config.md")


@pytest.mark.slow
def test_the_repository_reference_is_current():
    try:
        diffs = gen.check(gen.Sources())
    except gen.SourceError as exc:
        pytest.fail(
            "the reference is incomplete (add these docstrings, then run python scripts/gen_reference.py):\n" + "\n".join(exc.problems)
        )
    assert not diffs, "the reference is stale: run python scripts/gen_reference.py\n" + "\n".join(diffs)[:5000]


def _holes() -> list[str]:
    """What the repository as it is lacks, without ``FILE:LINE`` (none when it is complete): the
    tests below change a copy and must find nothing new missing, whatever
    ``test_the_repository_reference_is_current`` says of the repository itself."""
    return _names(gen.compare(gen.Sources())[1])


def _names(problems: list[str]) -> list[str]:
    """``Encoder.x has no docstring`` of each ``FILE:LINE: Encoder.x has no docstring``."""
    return [p.split(": ", 1)[1] for p in problems]


@pytest.mark.slow
def test_a_contract_member_added_without_regenerating_is_reported(tmp_path):
    src = _with_member(tmp_path, NEW_MEMBER)
    diffs, problems = gen.compare(src)
    assert _names(problems) == _holes()
    assert len(diffs) == 1 and diffs[0].startswith("--- ") and "PLUGINS.md (as is)" in diffs[0].splitlines()[0]
    lines = diffs[0].splitlines(True)
    added = [x for x in lines if x.startswith("+") and not x.startswith("+++")]
    removed = [x for x in lines if x.startswith("-") and not x.startswith("---")]
    assert added == NEW_MEMBER_MD and removed == []
    # the member lands in Encoder's section, after `modality` (and `processor`, if declared), before forward
    context = "".join(lines)
    assert context.index(NEW_MEMBER_MD[0]) < context.index(" - `forward(batch: dict[str, Any]) -> Any`")

    written, problems = gen.write(src)
    assert written == [tmp_path / "PLUGINS.md"] and _names(problems) == _holes()  # the config page did not change
    diffs, problems = gen.compare(src)
    assert diffs == [] and _names(problems) == _holes()
    written = (tmp_path / "PLUGINS.md").read_text()
    encoder = written[written.index("#### `Encoder`") : written.index("#### `Decoder`")]
    assert NEW_MEMBER_MD[0][1:] in encoder


def test_a_contract_member_without_a_docstring_is_an_error_naming_its_line(tmp_path):
    src = _with_member(tmp_path, "    def warm_up(self) -> None: ...\n\n")
    line = (tmp_path / "components.py").read_text().splitlines().index("    def warm_up(self) -> None: ...") + 1
    with pytest.raises(gen.SourceError) as exc:
        gen.check(src)
    new = f"{tmp_path / 'components.py'}:{line}: Encoder.warm_up has no docstring"
    assert new in exc.value.problems and _names([p for p in exc.value.problems if p != new]) == _holes()


def test_a_config_field_added_without_regenerating_is_reported(tmp_path):
    text = (ROOT / "omnicore" / "config.py").read_text()
    anchor = "class RunConfig(_Strict):\n"
    field = '    colour: str = Field(default="blue", description="a field added by this test; <b> shows as written")\n'
    (tmp_path / "config.py").write_text(text.replace(anchor, anchor + field, 1))
    shutil.copy(ROOT / "docs" / "reference" / "config.md", tmp_path / "config.md")
    src = gen.Sources(config=tmp_path / "config.py", config_md=tmp_path / "config.md", plugins_md=ROOT / "PLUGINS.md")
    diffs, problems = gen.compare(src)
    assert len(diffs) == 1 and _names(problems) == _holes()
    added = [x for x in diffs[0].splitlines() if x.startswith("+") and not x.startswith("+++")]
    assert added == ["+| `colour` | str | `blue` | a field added by this test; &lt;b&gt; shows as written |"]


def test_a_config_field_without_a_description_is_an_error_naming_its_line(tmp_path):
    text = (ROOT / "omnicore" / "config.py").read_text()
    anchor = "class RunConfig(_Strict):\n"
    (tmp_path / "config.py").write_text(text.replace(anchor, anchor + '    colour: str = "blue"\n', 1))
    line = (tmp_path / "config.py").read_text().splitlines().index('    colour: str = "blue"') + 1
    problems = gen.compare(gen.Sources(config=tmp_path / "config.py", config_md=tmp_path / "config.md"))[1]
    new = f"{tmp_path / 'config.py'}:{line}: RunConfig.colour (run.colour) has no description"
    assert new in problems and _names([p for p in problems if p != new]) == _holes()


def test_the_config_page_has_every_field_of_every_section():
    """Each field of each section model, as pydantic lists it, has a row in its section's table."""
    from pydantic import BaseModel

    from omnicore.config import Config

    page = (ROOT / "docs" / "reference" / "config.md").read_text()
    for section, field in Config.model_fields.items():
        if field.exclude:
            continue
        assert f"\n## `{section}`\n" in page
        model = field.annotation
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            continue
        body = page.split(f"\n## `{section}`\n", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
        for name, sub in model.model_fields.items():
            default = "required" if sub.is_required() else None
            row = next((x for x in body.splitlines() if x.startswith(f"| `{name}` |")), None)
            assert row is not None, f"docs/reference/config.md: {section}.{name} has no row"
            if default:
                assert f"| {default} |" in row
    assert "| `max_steps` | int (> 0) | `100` |" in page  # TrainConfig.max_steps: gt=0, default 100


def test_the_markdown_of_a_docstring():
    doc = "Summary with ``code`` and :class:`~omnicore.components.Encoder`.\n\nA block::\n\n    x = 1\n\nReturns:\n    The thing."
    assert gen.to_markdown(doc, {"Encoder": "#encoder"}) == [
        "Summary with `code` and [`Encoder`](#encoder).",
        "",
        "A block:",
        "",
        "    x = 1",
        "",
        "Returns: The thing.",
    ]
    assert gen.first_sentence("Set it (e.g. to 3. or 4.). Then more.") == "Set it (e.g. to 3. or 4.)."


@pytest.mark.cli
def test_the_command_line_check_exits_1_with_a_diff(tmp_path):
    root = tmp_path / "repo"
    shutil.copytree(ROOT / "omnicore", root / "omnicore", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    (root / "docs" / "reference").mkdir(parents=True)
    shutil.copy(ROOT / "docs" / "reference" / "config.md", root / "docs" / "reference" / "config.md")
    shutil.copy(ROOT / "PLUGINS.md", root / "PLUGINS.md")
    script = [sys.executable, str(ROOT / "scripts" / "gen_reference.py"), "--root", str(root)]
    complete = 2 if _holes() else 0  # the status of a current reference: 2 while the repository has holes
    fresh = subprocess.run([*script, "--check"], capture_output=True, text=True, timeout=120)
    assert (fresh.returncode, fresh.stdout) == (complete, ""), fresh.stderr
    text = (root / "omnicore" / "components.py").read_text()
    (root / "omnicore" / "components.py").write_text(text.replace("    def forward(", NEW_MEMBER + "    def forward(", 1))
    stale = subprocess.run([*script, "--check"], capture_output=True, text=True, timeout=120)
    assert stale.returncode == (complete or 1) and NEW_MEMBER_MD[0] in stale.stdout
    assert "the reference is stale: run python scripts/gen_reference.py" in stale.stderr
    rewrite = subprocess.run(script, capture_output=True, text=True, timeout=120)
    assert (rewrite.returncode, rewrite.stdout.strip()) == (complete, "wrote PLUGINS.md")
    again = subprocess.run([*script, "--check"], capture_output=True, text=True, timeout=120)
    assert (again.returncode, again.stdout) == (complete, "")
