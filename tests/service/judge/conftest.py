"""The judge's fixtures: a tiny random CLIP (and a vision-only model) saved to a folder, loaded
offline through the same code path a user's folder takes; digits shots in a data root."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_clip_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random CLIP (text and vision towers of 2 layers, 32 wide) with the tiny tokenizer,
    saved with ``save_pretrained`` as a user's model folder is."""
    import torch
    from transformers import CLIPConfig, CLIPModel, CLIPTokenizer

    from genaug.service.pipeline.tiny import tiny_tokenizer_dir

    folder = tmp_path_factory.mktemp("tiny-clip")
    tokenizer = CLIPTokenizer.from_pretrained(tiny_tokenizer_dir(), local_files_only=True)
    common = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4}
    config = CLIPConfig(
        text_config={**common, "vocab_size": len(tokenizer), "max_position_embeddings": 77,
                     "bos_token_id": tokenizer.bos_token_id,
                     "eos_token_id": tokenizer.eos_token_id,
                     "pad_token_id": tokenizer.pad_token_id},
        vision_config={**common, "image_size": 32, "patch_size": 8},
        projection_dim=16,
    )
    torch.manual_seed(0)
    CLIPModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_vision_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random vision-only transformers model (pooled embeddings, no text tower)."""
    import torch
    from transformers import CLIPVisionConfig, CLIPVisionModel

    folder = tmp_path_factory.mktemp("tiny-vision")
    torch.manual_seed(0)
    CLIPVisionModel(CLIPVisionConfig(hidden_size=32, intermediate_size=64,
                                     num_hidden_layers=2, num_attention_heads=4,
                                     image_size=32, patch_size=8)).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def digit_shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data root with ``shots/<5..9>/*.png``: 5 real digits per class of the ``fewshot``
    split (data seed 0, as the adapter of docs/benchmarks.md was trained on)."""
    from genaug.digits import write_split_folders

    root = tmp_path_factory.mktemp("data")
    written = write_split_folders(root, ["fewshot"], per_class=5, seed=0)["fewshot"]
    shots = root / "shots"
    shots.mkdir()
    for d in range(5, 10):
        (written / str(d)).rename(shots / str(d))
    return root
