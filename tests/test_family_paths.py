"""A published family's config read with a relative path from another working directory: the
encoders the foundation brings must point at the same checkpoint folder the foundation read, not
at that path taken relative to the config's folder a second time."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.mark.parametrize("family", ["qwen2_audio", "qwen2_vl", "qwen3_vl", "llava", "qwen2_5_omni"])
def test_brought_encoders_read_the_checkpoint_next_to_a_relative_config(tmp_path, monkeypatch, family):
    import importlib

    from omnicore.config import load_config
    from omnicore.model.build import build_omni_model

    module = f"omnicore_family_{family}"
    save_standin = importlib.import_module(f"{module}.standin").save_standin
    recipe = tmp_path / "recipes" / "mine"
    save_standin(recipe / "standin")
    (recipe / "train.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes"}]}\n')
    (recipe / "config.yaml").write_text(
        f"model:\n  foundation: {{name: {family}, options: {{checkpoint: standin}}}}\ndata:\n  train: train.jsonl\n"
    )
    monkeypatch.chdir(tmp_path)
    cfg = load_config("recipes/mine/config.yaml")
    model, _ = build_omni_model(cfg)
    assert cfg.model._brought
    for key in cfg.model._brought:
        folder = Path(cfg.model.encoders[key].options["checkpoint"])
        assert folder.is_absolute() and folder == (tmp_path / "recipes" / "mine" / "standin").absolute()
        assert key in model.encoders or cfg.model.encoders[key].share in model.encoders
