"""``omnicore plot`` and the ``loss.png`` written at the end of training: the PNG has the asked size,
the curves drawn are exactly the values of ``metrics.jsonl`` (training rows, validation rows in both
forms, skipped steps left out, the last row of a repeated step), bad or missing files are one error
line naming the file, and the command imports no torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from omnicore.cli import main
from omnicore.plot import PlotError, curves, plot_run, read_metrics


def _train_row(step: int, loss: float | None) -> dict:
    row = {"step": step, "loss": loss, "lr": 1e-3 * step, "grad_norm": 1.0, "tokens_per_s": 100.0 + step, "loss/text": 0.1 * step}
    if step % 2 == 0:  # image targets on even steps only: the key is absent on the others
        row["loss/decoder.image"] = 2.0 + step
    return row


def _write(path: Path, rows: list[dict], tail: str = "") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)
    return path


ROWS = [_train_row(s, 3.0 / s) for s in range(1, 7)]
ROWS[3]["loss"] = None  # step 4 skipped: its NaN loss is written as null
ROWS += [{"step": 6, "split": "val", "val_loss": 0.9, "val_loss/text": 0.8}]
ROWS += [_train_row(5, 0.55), _train_row(6, 0.45)]  # resumed from step 4: steps 5 and 6 again
ROWS += [{"step": 3, "split": "val", "loss": 1.5}]  # a validation row in the plain "split" form


@pytest.mark.slow
def test_curves_are_the_rows_values(tmp_path):
    run = _write(tmp_path / "run", ROWS)
    got = plot_run(run).panels
    # by hand from ROWS: step 4 has no loss, steps 5 and 6 take their last rows
    assert got["loss"]["train"] == ([1, 2, 3, 5, 6], [3.0, 1.5, 1.0, 0.55, 0.45])
    assert got["loss"]["val"] == ([3, 6], [1.5, 0.9])
    assert got["lr"] == {"train": ([1, 2, 3, 4, 5, 6], [1e-3 * s for s in range(1, 7)])}
    assert got["tokens_per_s"] == {"train": ([1, 2, 3, 4, 5, 6], [101.0, 102.0, 103.0, 104.0, 105.0, 106.0])}
    assert got["parts"] == {
        "train text": ([1, 2, 3, 4, 5, 6], [0.1 * s for s in range(1, 7)]),
        "train decoder.image": ([2, 4, 6], [4.0, 6.0, 8.0]),
        "val text": ([6], [0.8]),
    }


@pytest.mark.slow
@pytest.mark.parametrize("size", [(900, 1100), (640, 480)])
def test_png_has_the_asked_size_and_shows_lines(tmp_path, size):
    run = _write(tmp_path / "run", ROWS)
    out = tmp_path / "pics" / "curves.png"
    plot = plot_run(run, out, size=size) if size != (900, 1100) else plot_run(run)
    path = out if size != (900, 1100) else run / "loss.png"
    assert plot.path == path
    with Image.open(path) as img:
        assert img.format == "PNG" and img.size == size
        rgb = img.convert("RGB")
        colours = {c for _, c in rgb.getcolors(maxcolors=1 << 20)}
    assert (31, 119, 180) in colours and (255, 127, 14) in colours  # matplotlib's first two line colours: train, val


@pytest.mark.cli
def test_cli_plot_writes_loss_png_without_torch(tmp_path):
    run = _write(tmp_path / "run", ROWS)
    code = "import sys; from omnicore.cli import main; rc = main(['plot', sys.argv[1]]); print('torch' in sys.modules); sys.exit(rc)"
    res = subprocess.run([sys.executable, "-c", code, str(run)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [f"wrote {run / 'loss.png'} (steps 1-6)", "False"]
    with Image.open(run / "loss.png") as img:
        assert img.size == (900, 1100)


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (None, "no such file"),
        ("", "empty, no metrics rows"),
        ("\n\n", "empty, no metrics rows"),
        ('{"step": 1, "loss": 1.0}\n{"step": 2, "lo\n', ":2: not valid JSON"),
        ('{"step": 1, "loss": 1.0}\n[1, 2]\n', ":2: not a metrics row"),
        ('{"loss": 1.0}\n', ":1: not a metrics row"),
    ],
)
def test_bad_metrics_file_is_one_error_line(tmp_path, capsys, content, words):
    run = tmp_path / "run"
    run.mkdir()
    if content is not None:
        (run / "metrics.jsonl").write_text(content)
    assert main(["plot", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {run / 'metrics.jsonl'}") and words in err
    assert not (run / "loss.png").exists()


def test_row_being_written_is_left_out(tmp_path):
    run = _write(tmp_path / "run", ROWS[:2], tail='{"step": 3, "lo')  # a live run mid-write
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1, 2]


def test_rows_without_any_curve_are_an_error(tmp_path):
    run = _write(tmp_path / "run", [{"step": 1, "loss": None}])
    assert curves(read_metrics(run / "metrics.jsonl")) == {}
    with pytest.raises(PlotError, match="nothing to plot"):
        plot_run(run)


@pytest.mark.slow
def test_training_ends_with_loss_png_and_plain_progress_lines(digits_jsonl, tmp_path, capsys, caplog):
    """A tiny finished run: loss.png holds metrics.jsonl's curves; with stderr not a terminal (pytest
    captures it) progress is plain log lines, the first and last step at least, with no carriage return."""
    import logging

    from conftest import tiny_config_dict

    from omnicore.config import Config
    from omnicore.train.loop import train

    caplog.set_level(logging.INFO, logger="omnicore")
    d = tiny_config_dict(str(digits_jsonl / "train.jsonl"), output_dir=str(tmp_path / "run"), max_steps=3, progress=True)
    history = train(Config.model_validate(d))
    out = capsys.readouterr()
    logged = [r.getMessage() for r in caplog.records]
    run = tmp_path / "run"
    assert f"loss curves: {run / 'loss.png'}" in logged
    with Image.open(run / "loss.png") as img:
        assert img.size == (900, 1100)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    panels = plot_run(run, tmp_path / "again.png").panels
    assert panels["loss"]["train"] == ([r["step"] for r in rows], [r["loss"] for r in rows])
    assert panels["loss"]["train"][1] == [h["loss"] for h in history]
    assert panels["lr"]["train"][1] == [r["lr"] for r in rows]
    assert panels["parts"]["train text"][1] == [r["loss/text"] for r in rows]
    lines = [ln for ln in logged if ln.startswith("train: step")]
    assert "\r" not in out.err and not any("\r" in ln for ln in logged)
    assert lines[0].startswith("train: step 1/3 (33%), loss ") and lines[-1].startswith("train: step 3/3 (100%), loss ")


def test_balance_panels_draw_the_spread_and_each_ranks_wait(tmp_path):
    """The balance figures of two ranks' rows (omnicore.train.metrics): the spread as one line, the
    wait at the reduction as its mean, its max and one line per rank."""
    rows = [dict(_train_row(s, 1.0), flops_spread=1.0 + 0.1 * s, reduce_wait_s=0.01 * s, reduce_wait_max_s=0.02 * s) for s in (1, 2)]
    for r in rows:
        r.update({"reduce_wait_s/rank0": 0.0, "reduce_wait_s/rank1": r["reduce_wait_max_s"]})
    got = curves(rows)
    assert got["flops_spread"] == {"train": ([1, 2], [1.1, 1.2])}
    assert got["reduce_wait"] == {
        "mean": ([1, 2], [0.01, 0.02]),
        "max": ([1, 2], [0.02, 0.04]),
        "rank 0": ([1, 2], [0.0, 0.0]),
        "rank 1": ([1, 2], [0.02, 0.04]),
    }
    assert list(got)[-2:] == ["flops_spread", "reduce_wait"]  # drawn last, under the throughput
    assert plot_run(_write(tmp_path / "run", rows)).panels == got
