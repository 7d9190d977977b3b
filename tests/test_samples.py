"""Generation during training: the sample grid (``samples.every``) has the documented size and
its cells are the images ``omnicore generate`` draws on the same checkpoint, prompts and seeds; the
images reach the loggers; the val row's task accuracy (``eval.task_samples``) is what
``omnicore eval --limit K`` reports on the same checkpoint; the training is the same without them;
and 2 processes (FSDP2, gloo) give grids and accuracies equal to one-process generation on their
checkpoints."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import tiny_config_dict
from PIL import Image

from omnicore.components import ComponentSpec
from omnicore.config import Config, ConfigError, SamplesConfig
from omnicore.eval.samples import CELL_MIN, LABEL_HEIGHT, PAD, grid_shape, sample_grid
from omnicore.hookspecs import hookimpl
from omnicore.testing.distributed import run_distributed

STEPS, EVERY, K = 40, 20, 10
PROMPTS = [f"Draw the digit {d}." for d in range(5)]
GREY = (220, 220, 220)
IMAGES: list[tuple[int, str, list[np.ndarray]]] = []
"""``(step, name, images)`` of every ``log_images`` call to :class:`ImageRecorder` in this process."""


class ImageRecorder:
    """A logger that keeps every image it is given (the recording logger of these tests)."""

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        pass

    def start(self, run_info: dict[str, Any]) -> None:
        pass

    def log_metrics(self, step: int, row: dict[str, Any], split: str) -> None:
        pass

    def log_images(self, step: int, name: str, images: list[Any]) -> None:
        IMAGES.append((step, name, [np.array(im) for im in images]))

    def close(self) -> None:
        pass


@hookimpl
def omnicore_loggers() -> list[ComponentSpec]:
    return [ComponentSpec(name="image_recorder", target=f"{__name__}:ImageRecorder", description="test: keeps images")]


def _const(i: int) -> str:
    """A text task a tiny model learns in a few steps: the answer is always 5."""
    user = {"role": "user", "content": [{"type": "text", "text": f"Say five, please {i}."}]}
    return json.dumps({"task": "constant", "messages": [user, {"role": "assistant", "content": [{"type": "text", "text": "5"}]}]})


@pytest.fixture(scope="module")
def data(digits_jsonl) -> tuple[Path, Path]:
    """Training: the 8 drawing samples twice (so that sampled generation opens images often enough
    for the grid checks to have drawings to compare) and 8 constant-answer ones. Held-out: 4 digit questions, 4
    constant ones, then 8 more digit questions (the first K=10 with a text answer are scored)."""
    gen = [x for x in (digits_jsonl / "train.jsonl").read_text().splitlines() if '"text_to_image"' in x]
    questions = (digits_jsonl / "eval.jsonl").read_text().splitlines()
    train, held = digits_jsonl / "samples_train.jsonl", digits_jsonl / "samples_eval.jsonl"
    train.write_text("\n".join(gen + gen + [_const(i) for i in range(8)]) + "\n")
    held.write_text("\n".join(questions[:4] + [_const(i) for i in range(8, 12)] + questions[4:]) + "\n")
    return train, held


def _cfg(data: tuple[Path, Path], out: Path, *, generation: bool = True) -> Config:
    d = tiny_config_dict(str(data[0]), eval=str(data[1]), output_dir=str(out), max_steps=STEPS, lr=1e-2, save_every=EVERY)
    d["eval"] = {"every": EVERY}
    if generation:
        d["eval"]["task_samples"] = K
        d["samples"] = {"every": EVERY, "prompts": PROMPTS}
    d["generate"] = {"temperature": 1.0, "max_new_tokens": 4}  # sampled, so the seeds matter
    cfg = Config.model_validate(d)
    cfg.source = str(out.parent / "config.yaml")
    return cfg


def _registry():
    import sys

    from omnicore.testing import isolated_registry

    plugins = ["omnicore_image_siglip.plugin", "omnicore_audio_whisper.plugin", "omnicore_image_movqgan.plugin", sys.modules[__name__]]
    return isolated_registry(plugins, builtins=True)


@pytest.fixture(scope="module")
def one_process(data, tmp_path_factory):
    from omnicore.train.loop import train

    IMAGES.clear()
    out = tmp_path_factory.mktemp("samples1") / "run"
    cfg = _cfg(data, out)
    cfg.run.loggers = ["jsonl", "image_recorder"]
    history = train(cfg, registry=_registry())
    return cfg, history, list(IMAGES)


def _generated(cfg: Config, step: int, out: Path, threads: int | None = None) -> list[Image.Image | None]:
    """What ``omnicore generate --checkpoint checkpoints/step-N --prompt P0 ... --prompt P4`` draws:
    per prompt its image, or None."""
    import torch

    from omnicore.eval.generate import generate_cli

    saved = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)  # the ranks' thread count: the same sums, bit for bit
    try:
        ckpt = Path(cfg.run.output_dir) / "checkpoints" / f"step-{step:08d}"
        list(generate_cli(cfg, prompts=PROMPTS, image=None, audio=None, out_dir=str(out), checkpoint=str(ckpt), export=None))
    finally:
        torch.set_num_threads(saved)
    files = [out / f"generated-p{i + 1}-s1-image-0.png" for i in range(len(PROMPTS))]
    return [Image.open(f).convert("RGB") if f.is_file() else None for f in files]


def _cells(grid: Image.Image, n: int, side: int) -> list[np.ndarray]:
    """The image area of each of the first ``n`` cells of a one-row grid of ``side``-pixel cells."""
    a = np.asarray(grid)
    return [a[PAD : PAD + side, PAD + i * (side + PAD) : PAD + i * (side + PAD) + side] for i in range(n)]


def _check_grid(grid_path: Path, reference: list[Image.Image | None]) -> int:
    """The grid's size and its cells against the reference images (scaled 3x: 32-pixel images, 96-pixel
    cells); returns how many prompts drew an image."""
    grid = Image.open(grid_path)
    assert grid.size == (4 + 5 * (96 + 4), 4 + 96 + 24 + 4) == (504, 128)  # 5 prompts: one row of five
    for cell, ref in zip(_cells(grid, len(PROMPTS), 96), reference):
        if ref is None:
            assert (cell == np.array(GREY, np.uint8)).all()
        else:
            assert ref.size == (32, 32)
            assert np.array_equal(cell, np.kron(np.asarray(ref), np.ones((3, 3, 1), np.uint8)))
    return sum(r is not None for r in reference)


@pytest.mark.slow
def test_grid_cells_are_what_omnicore_generate_draws(one_process, tmp_path):
    cfg, _, _ = one_process
    folder = Path(cfg.run.output_dir) / "samples"
    assert sorted(p.name for p in folder.iterdir()) == ["final.png", "step-00000020.png", "step-00000040.png"]
    assert np.array_equal(np.asarray(Image.open(folder / "final.png")), np.asarray(Image.open(folder / "step-00000040.png")))
    drawn = {step: _check_grid(folder / f"step-{step:08d}.png", _generated(cfg, step, tmp_path / str(step))) for step in (20, 40)}
    assert drawn[40] >= 1, "the check needs prompts that drew an image"
    assert not np.array_equal(np.asarray(Image.open(folder / "step-00000020.png")), np.asarray(Image.open(folder / "final.png")))


@pytest.mark.slow
def test_images_reach_the_loggers(one_process, tmp_path):
    cfg, _, images = one_process
    assert [(step, name) for step, name, _ in images] == [(20, "samples/image"), (40, "samples/image")]
    for step, _, got in images:
        want = [np.asarray(im) for im in _generated(cfg, step, tmp_path / str(step)) if im is not None]
        assert len(got) == len(want) and all(g.dtype == np.uint8 and np.array_equal(g, w) for g, w in zip(got, want))


def _val_rows(out: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows if r.get("split") == "val"}


def _eval_accuracy(cfg: Config, step: int, out: Path) -> dict:
    """``omnicore eval --checkpoint checkpoints/step-N --limit K`` (eval.json into ``out``)."""
    from omnicore.eval.scoring import evaluate

    ckpt = Path(cfg.run.output_dir) / "checkpoints" / f"step-{step:08d}"
    c = cfg.model_copy(update={"run": cfg.run.model_copy(update={"output_dir": str(out)})})
    return evaluate(c, checkpoint=str(ckpt), limit=K, progress=False)


@pytest.mark.slow
def test_val_accuracy_equals_omnicore_eval(one_process, tmp_path):
    cfg, _, _ = one_process
    val = _val_rows(Path(cfg.run.output_dir))
    assert sorted(val) == [20, 40]
    for step in (20, 40):
        got = _eval_accuracy(cfg, step, tmp_path / str(step))
        row = val[step]
        assert row["val_acc_samples"] == got["total"] == K
        assert row["val_acc"] == got["accuracy"]
        assert {k[8:]: v for k, v in row.items() if k.startswith("val_acc/")} == {t: s["accuracy"] for t, s in got["tasks"].items()}
    assert set(got["tasks"]) == {"image_to_text", "audio_to_text", "constant"}
    assert val[40]["val_acc/constant"] > 0  # the learnt task scores: the figures are not all zero


@pytest.mark.slow
def test_generation_leaves_training_alone(one_process, data, tmp_path):
    """The same run without samples and task accuracy has the same training losses and val losses:
    generation changes no weight, data position or RNG state."""
    from omnicore.train.loop import train

    cfg = _cfg(data, tmp_path / "run", generation=False)
    history = train(cfg)
    # rel 1e-6: exact when run alone; after other tests the process's state can move the last bits
    assert [r["loss"] for r in history] == pytest.approx([r["loss"] for r in one_process[1]], rel=1e-6)
    plain, with_gen = _val_rows(tmp_path / "run"), _val_rows(Path(one_process[0].run.output_dir))
    assert [plain[s]["val_loss"] for s in (20, 40)] == pytest.approx([with_gen[s]["val_loss"] for s in (20, 40)], rel=1e-6)
    assert "val_acc" not in plain[40] and not (tmp_path / "run" / "samples").exists()


def _two_ranks(cfg_dict: dict) -> dict:
    from omnicore.train.loop import train

    cfg = Config.model_validate(cfg_dict)
    cfg.source = str(Path(cfg.run.output_dir).parent / "config.yaml")
    train(cfg)
    return {}


@pytest.mark.multiprocess
def test_two_processes_fsdp2_equal_one_process_generation_on_their_checkpoints(data, tmp_path):
    """2 processes (FSDP2 over gloo, every rank generating with the root all-gathered): the last
    step's grid and val accuracies equal one-process ``omnicore generate`` / ``omnicore eval`` on the
    checkpoint the run wrote (one thread, as each rank has)."""
    cfg = _cfg(data, tmp_path / "run")
    d = copy.deepcopy(cfg.model_dump(mode="json"))
    d["parallel"] = {"strategies": ["fsdp2"]}
    d["samples"]["every"] = d["eval"]["every"] = STEPS  # once, at the end: the slow part is generating under FSDP2
    run_distributed(_two_ranks, 2, args=(d,))
    folder = tmp_path / "run" / "samples"
    assert sorted(p.name for p in folder.iterdir()) == ["final.png", f"step-{STEPS:08d}.png"]
    assert _check_grid(folder / "final.png", _generated(cfg, STEPS, tmp_path / "gen", threads=1)) >= 1
    row = _val_rows(tmp_path / "run")[STEPS]
    got = _eval_accuracy(cfg, STEPS, tmp_path / "eval")
    assert row["val_acc"] == got["accuracy"] and row["val_acc_samples"] == K
    assert {k[8:]: v for k, v in row.items() if k.startswith("val_acc/")} == {t: s["accuracy"] for t, s in got["tasks"].items()}


def test_grid_layout_and_labels():
    """Ten 28-pixel images, one missing: 5 x 2 cells of 112 pixels (scaled 4x), a grey empty cell,
    labels drawn under each cell (dark pixels in every label strip), nothing drawn in the padding."""
    rng = np.random.default_rng(0)
    arrays = [rng.integers(0, 256, (28, 28, 3), dtype=np.uint8) for _ in range(10)]
    images = [Image.fromarray(a) for a in arrays]
    images[3] = None
    grid = sample_grid(images, [f"Draw the digit {d}, a long prompt that needs cutting." for d in range(10)])
    assert grid_shape(10) == (5, 2) and grid_shape(8) == (8, 1) and grid_shape(9) == (5, 2) and grid_shape(17) == (6, 3)
    side = 4 * 28
    assert side >= CELL_MIN and grid.size == (PAD + 5 * (side + PAD), PAD + 2 * (side + LABEL_HEIGHT + PAD)) == (584, 284)
    a = np.asarray(grid)
    for i, ref in enumerate(arrays):
        x, y = PAD + (i % 5) * (side + PAD), PAD + (i // 5) * (side + LABEL_HEIGHT + PAD)
        cell = a[y : y + side, x : x + side]
        want = np.full_like(cell, 220) if i == 3 else np.kron(ref, np.ones((4, 4, 1), np.uint8))
        assert np.array_equal(cell, want)
        strip = a[y + side : y + side + LABEL_HEIGHT, x : x + side]
        assert (strip.min(-1) < 128).any()  # some text
        assert (a[y : y + side + LABEL_HEIGHT, x + side : x + side + PAD] == 255).all()  # the padding stays white
    with pytest.raises(ValueError, match="one label per cell"):
        sample_grid(images, ["x"])


def test_config_needs_prompts_validation_and_decoders(data, tmp_path):
    import yaml

    from omnicore.config import load_config

    base = tiny_config_dict(str(data[0]), eval=str(data[1]))
    cases = [
        ({"samples": {"every": 5}}, r"cfg.yaml: samples: samples.every needs samples.prompts"),
        ({"eval": {"task_samples": 4}}, r"cfg.yaml: eval: eval.task_samples is part of validation: set eval.every"),
    ]
    for extra, message in cases:
        d = copy.deepcopy(base)
        d.update(extra)
        path = tmp_path / "cfg.yaml"
        path.write_text(yaml.safe_dump(d))
        with pytest.raises(ConfigError, match=message):
            load_config(path)
    d = {**tiny_config_dict(str(data[0]), decoders=False), "samples": {"every": 5, "prompts": ["Draw."]}}
    path.write_text(yaml.safe_dump(d))
    with pytest.raises(ConfigError, match="samples: samples.every draws with the model's decoders, and model.decoders is empty"):
        load_config(path)


def test_generation_refused_under_sequence_parallelism(data, tmp_path):
    """The sampler and the validator's task accuracy refuse to be built where ranks share each
    sequence (``replicas`` > 1), naming the key that asked for generation; off, they build."""
    import contextlib

    import torch

    from omnicore.eval.samples import Sampler
    from omnicore.eval.validate import Validator
    from omnicore.parallel.state import ParallelState

    state = ParallelState(0, 1, 0, torch.device("cpu"))
    common = {"tokenizer": None, "processor": None, "state": state, "replicas": 2, "log": print}

    def build(cfg: Config) -> tuple[Sampler, Validator]:
        sampler = Sampler(cfg, out_dir=tmp_path, log_images=lambda *a: None, **common)
        validator = Validator(cfg, data_rank=0, data_size=1, autocast=contextlib.nullcontext, log_row=lambda *a: None, **common)
        return sampler, validator

    cfg = _cfg(data, tmp_path / "run")
    with pytest.raises(ConfigError, match=r"samples\.every: generation during training does not run under sequence parallelism \(2 ranks"):
        build(cfg)
    no_grid = cfg.model_copy(update={"samples": cfg.samples.model_copy(update={"every": 0})})
    with pytest.raises(ConfigError, match=r"eval\.task_samples: generation during training does not run under sequence parallelism"):
        build(no_grid)
    off = cfg.model_copy(update={"samples": no_grid.samples, "eval": cfg.eval.model_copy(update={"task_samples": 0})})
    sampler, validator = build(off)  # nothing on: nothing to refuse
    assert not any(sampler.due(s) or sampler.due(s, final=True) for s in range(STEPS + 1))
    assert [s for s in range(1, STEPS + 1) if validator.due(s)] == [EVERY, STEPS]  # validation itself stays on


def test_sampler_and_validator_are_due_every_n_steps_and_at_the_end(data, tmp_path):
    """``due``: every N steps and at ``train.max_steps``; the sampler also at an early end (``final``),
    never at step 0; the validator every 7 steps of 40 is due at 7, 14, ..., 35 and 40."""
    import contextlib

    import torch

    from omnicore.eval.samples import Sampler
    from omnicore.eval.validate import Validator
    from omnicore.parallel.state import ParallelState

    cfg = _cfg(data, tmp_path / "run", generation=False)
    cfg = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"every": 7}), "samples": SamplesConfig(every=15, prompts=["Draw."])})
    state = ParallelState(0, 1, 0, torch.device("cpu"))
    processor = SimpleProcessor()
    sampler = Sampler(cfg, tokenizer=None, processor=processor, state=state, out_dir=tmp_path, replicas=1, log_images=print, log=print)
    validator = Validator(cfg, tokenizer=None, processor=processor, state=state, data_rank=0, data_size=1, replicas=1,
                          autocast=contextlib.nullcontext, log_row=print, log=print)  # fmt: skip
    assert [s for s in range(STEPS + 1) if sampler.due(s)] == [15, 30, 40]
    assert sampler.due(17, final=True) and not sampler.due(0, final=True) and not sampler.due(17)
    assert [s for s in range(1, STEPS + 1) if validator.due(s)] == [7, 14, 21, 28, 35, 40]
    assert processor.encoded == [("Draw.", "samples.prompts[0]:0")]  # prompts encoded once, when built


class SimpleProcessor:
    """Records what the sampler encodes (a prompt-only user message) instead of tokenising it."""

    decoders: dict = {}

    def __init__(self) -> None:
        self.encoded: list[tuple[str, str]] = []

    def encode(self, sample, prompt_only: bool = False):
        assert prompt_only
        self.encoded.append((sample.messages[-1].parts[-1].value, sample.where))
        return []
