"""``genaug adapt``'s final check and its defaults by the data's size.

The check's logic is the subject, so the "learned" case is cheap: the embedded ``tiny-digits``
draws 0-2 well (it was trained on them), and ``tiny-digits-base`` cannot draw 5-7 (it never saw
them); both are checked against real shots of the ``fewshot`` split with the embedded judge
encoder, through the service's worker, 4 images per label at 8 steps. The CLI is run on a
LoRA of 2 steps (not learned) for the printed table and verdict.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from genaug.cli import main
from genaug.service.adapt import train as adapt_module
from genaug.service.adapt.check import check_adapter, cross_validate, score
from genaug.service.adapt.data import read_shots
from genaug.service.adapt.report import (
    UNSURE_COLOUR,
    WRONG_COLOUR,
    CheckResult,
    LabelCheck,
    read_sheet,
)
from genaug.service.adapt.train import default_steps
from genaug.service.pipeline.load import load_model
from genaug.service.pipeline.lora_record import read_record
from genaug.service.recipes.spec import LabelSpec, Recipe

_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def _write_recipe(path: Path, digits: tuple[int, ...]) -> Path:
    """Recipe ``d`` at 64 px, 8 steps: one label per digit, prompted by its word."""
    path.write_text(
        "recipes:\n  - name: d\n    height: 64\n    width: 64\n    steps: 8\n"
        "    guidance: 3.0\n    labels:\n"
        + "".join(f'      "{d}": {{prompts: [a handwritten {_WORDS[d]}]}}\n' for d in digits)
    )
    return path


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> None:
    import torch

    torch.set_num_threads(1)


def digits_recipe(digits: list[int], steps: int = 8) -> Recipe:
    return Recipe(name="digits", height=64, width=64, steps=steps, guidance=3.0,
                  labels={str(d): LabelSpec(prompts=[f"a handwritten {_WORDS[d]}"])
                          for d in digits})


WHITE = (255, 255, 255)


def frames(png: bytes) -> dict[str, list[tuple[int, ...]]]:
    """The colour of the frame around each image of a check sheet, per label: read from the
    pixels 2 px outside the image on all four sides (which must agree), at the positions the
    sheet's own layout chunk gives (``read_sheet`` checks those hold the images)."""
    with Image.open(io.BytesIO(png)) as image:
        layout = json.loads(image.info["genaug-check-sheet"])
        pixels = np.asarray(image.convert("RGB"))
    w, h = layout["size"]
    out: dict[str, list[tuple[int, ...]]] = {}
    for label, boxes in layout["boxes"].items():
        out[label] = []
        for x, y in boxes:
            sides = {tuple(int(v) for v in pixels[py, px]) for px, py in
                     [(x - 2, y + h // 2), (x + w + 1, y + h // 2), (x + w // 2, y - 2),
                      (x + w // 2, y + h + 1)]}
            assert len(sides) == 1, (label, x, y, sides)
            out[label].append(sides.pop())
    return out


def expected_frames(result: CheckResult) -> dict[str, list[tuple[int, ...]]]:
    return {c.label: [WHITE if call == c.label else UNSURE_COLOUR if call == "unsure"
                      else WRONG_COLOUR for call in c.calls] for c in result.labels}


def label_column(png: bytes, rows: int) -> list[np.ndarray]:
    """Each row's strip left of its first image (where the label's name is written)."""
    with Image.open(io.BytesIO(png)) as image:
        layout = json.loads(image.info["genaug-check-sheet"])
        pixels = np.asarray(image.convert("L"))
    h = layout["size"][1]
    boxes = list(layout["boxes"].values())
    assert len(boxes) == rows
    return [pixels[row[0][1]:row[0][1] + h, :row[0][0] - 4] for row in boxes]


@pytest.fixture(scope="module")
def shots_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``DATA/<0..9>/*.png``: 5 real digits per class of the ``fewshot`` split (seed 0)."""
    from genaug.digits import write_split_folders

    root = tmp_path_factory.mktemp("shots")
    return write_split_folders(root, ["fewshot"], per_class=5, seed=0)["fewshot"]


def test_the_check_says_learned_for_a_model_that_draws_its_labels(shots_folder: Path) -> None:
    recipe = digits_recipe([0, 1, 2])
    model = load_model(source="tiny-digits", unet_weights=None, device="cpu", dtype="auto")
    result = check_adapter(model, None, recipe, read_shots(shots_folder, recipe), per_label=4)
    assert [c.label for c in result.labels] == ["0", "1", "2"]
    assert all(c.asked == 4 for c in result.labels)
    assert all(c.share >= 0.75 for c in result.labels), result.table()
    assert result.verdict(steps=100, rank=32).startswith("learned: every label"), result.table()
    # the sheet holds exactly the images scored, one row per label, pixels kept
    png = result.sheet()
    cut = read_sheet(png)
    assert list(cut) == ["0", "1", "2"]
    for label in cut:
        assert np.array_equal(cut[label], result.drawn[label])
    # a frame around exactly the images that did not count; the counted ones have none
    assert [len(c.calls) for c in result.labels] == [4, 4, 4]
    assert frames(png) == expected_frames(result)
    assert WHITE in sum(frames(png).values(), [])

    # the same images at a bar no image reaches: its own label but unsure, in the other
    # colour (the judge's own scoring, fitted on the same shots, with a stricter bar)
    import torch

    from genaug.service.judge.encoders import load_encoder

    encoder = load_encoder("tiny-digits-encoder", torch.device("cpu"))
    strict = score(encoder, read_shots(shots_folder, recipe), result.drawn, min_score=1.01)
    unsure = CheckResult(strict, result.judge_accuracy, result.judge_held_out, "e", 1.0,
                         min_score=1.01, drawn=result.drawn)
    assert any("unsure" in c.calls for c in strict)
    png = unsure.sheet()
    assert frames(png) == expected_frames(unsure)
    assert UNSURE_COLOUR in sum(frames(png).values(), [])


def test_the_check_says_not_learned_with_the_fix_for_a_model_that_cannot(
    shots_folder: Path,
) -> None:
    recipe = digits_recipe([5, 6, 7])
    model = load_model(source="tiny-digits-base", unet_weights=None, device="cpu", dtype="auto")
    result = check_adapter(model, None, recipe, read_shots(shots_folder, recipe), per_label=4)
    assert result.share < 0.6, result.table()
    assert result.missed, result.table()
    worst = result.missed[0]
    verdict = result.verdict(steps=100, rank=4)
    assert verdict.startswith(f"not learned: label {worst.label}: {worst.drawn} of 4 drawn as "
                              "asked"), verdict
    assert "train longer, --steps 200 --rank 32" in verdict, verdict
    # the judge itself tells the real 5-7 apart (cross-validated on the shots)
    assert result.judge_accuracy is not None and result.judge_accuracy >= 0.8
    assert result.judge_held_out == 15
    # the sheet frames in red each image scored as another label, and says so in its legend;
    # each row carries its label's name at its left
    png = result.sheet()
    marked = frames(png)
    assert marked == expected_frames(result)
    assert sum(colour == WRONG_COLOUR for row in marked.values() for colour in row) == sum(
        c.asked - c.drawn - c.seen_as.get("unsure", 0) for c in result.labels) > 0
    sheet = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
    first_y = min(y for boxes in json.loads(Image.open(io.BytesIO(png)).info[
        "genaug-check-sheet"])["boxes"].values() for _, y in boxes)
    legend = sheet[:first_y - 4]
    for colour in (WRONG_COLOUR, UNSURE_COLOUR):  # the legend's swatches
        assert (legend == colour).all(axis=-1).sum() >= 50, colour
    assert (legend.min(axis=-1) < 100).sum() > 100  # and its words
    names = label_column(png, 3)
    assert all((strip < 128).sum() >= 10 for strip in names)  # ink: a name in each row
    assert not np.array_equal(names[0], names[1]) and not np.array_equal(names[1], names[2])


def test_cross_validation_holds_one_shot_per_label_out(shots_folder: Path) -> None:
    import torch

    from genaug.service.judge.encoders import load_encoder

    encoder = load_encoder("tiny-digits-encoder", torch.device("cpu"))
    recipe = digits_recipe([5, 6, 7, 8, 9])
    accuracy, own = cross_validate(encoder, read_shots(shots_folder, recipe))
    assert len(own) == 25 and accuracy is not None and accuracy >= 0.8
    assert ((own > 0) & (own <= 1)).all() and np.median(own) > 0.5  # p of their own label
    one = {label: images[:1] for label, images in read_shots(shots_folder, recipe).items()}
    accuracy, own = cross_validate(encoder, one)
    assert accuracy is None and len(own) == 0


def test_table_and_verdict_text() -> None:
    result = CheckResult(
        [LabelCheck("5", 20, 19), LabelCheck("7", 20, 2, {"1": 12, "9": 6}),
         LabelCheck("9", 20, 12, {"4": 8})],
        judge_accuracy=0.5, judge_held_out=10, encoder="tiny-digits-encoder", seconds=3.0)
    lines = result.table().splitlines()
    assert lines[0].split()[:2] == ["label", "drawn"]
    assert lines[1].split() == ["5", "19", "of", "20", "95", "-"]
    assert lines[2].split() == ["7", "2", "of", "20", "10", "1:", "12,", "9:", "6"]
    assert lines[-1].split() == ["all", "33", "of", "60", "55"]
    verdict = result.verdict(steps=2000, rank=32)
    assert verdict.startswith("not learned: label 7: 2 of 20 drawn as asked: train longer, "
                              "--steps 4000; 1 more label(s) under 80 %"), verdict
    assert "held-out images apart only 50 %" in verdict  # an untrusted judge is said
    assert "\n" not in verdict
    learned = CheckResult([LabelCheck("5", 20, 17), LabelCheck("6", 20, 20)], 0.9, 10, "e", 1.0)
    assert learned.verdict(steps=6000, rank=32) == (
        "learned: every label drawn as asked at least 80 % of the time (lowest: label 5, "
        "17 of 20)")
    never = CheckResult([LabelCheck("6", 20, 0, {"9": 13, "8": 7})], None, 0, "e", 1.0)
    assert "0 of 20 drawn as asked, most scored as 9" in never.verdict(steps=10, rank=32)
    assert "cannot be cross-validated" in never.judge_line()
    barred = CheckResult([LabelCheck("5", 20, 15, {"unsure": 5})], 0.9, 10, "e", 1.0,
                         min_score=0.68)
    assert barred.judge_line().endswith("an image counts at p >= 0.68")
    assert barred.table().splitlines()[1].split()[-2:] == ["unsure:", "5"]


def test_a_lora_on_a_model_that_draws_its_labels_is_checked_as_learned(
    tmp_path: Path, shots_folder: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """The CLI's check with a LoRA loaded, the "learned" side: a 2-step LoRA on the embedded
    ``tiny-digits`` (which draws 0-2 already) keeps drawing them, and the verdict says so."""
    recipes = _write_recipe(tmp_path / "recipes.yaml", (0, 1, 2))
    out = tmp_path / "keep.safetensors"
    assert main(["adapt", str(shots_folder), "--recipes", str(recipes), "--recipe", "d",
                 "--out", str(out), "--model", "tiny-digits", "--steps", "2", "--rank", "4",
                 "--no-progress", "--check-images", "4"]) == 0
    printed = capsys.readouterr().out
    check = json.loads((tmp_path / "keep.check.json").read_text())
    assert check["verdict"].startswith("learned: every label"), printed
    assert check["verdict"] in printed and check["lora"] == str(out)
    assert all(row["asked"] == 4 and row["drawn"] >= 3 for row in check["labels"].values())


def test_the_sheet_shrinks_large_images_and_keeps_one_row_per_label() -> None:
    rng = np.random.default_rng(0)
    drawn = {"a": rng.integers(0, 255, (3, 512, 384, 3), dtype=np.uint8),
             "b": rng.integers(0, 255, (2, 512, 384, 3), dtype=np.uint8)}
    result = CheckResult([LabelCheck("a", 3, 3), LabelCheck("b", 2, 1)], None, 0, "e", 1.0,
                         drawn=drawn)
    cut = read_sheet(result.sheet())
    assert {k: v.shape for k, v in cut.items()} == {  # 512x384 shrunk to fit 256
        "a": (3, 256, 192, 3), "b": (2, 256, 192, 3)}
    grey_images = np.random.default_rng(1).integers(0, 255, (2, 64, 64, 1), dtype=np.uint8)
    grey = CheckResult([LabelCheck("g", 2, 2)], None, 0, "e", 1.0, drawn={"g": grey_images})
    assert np.array_equal(read_sheet(grey.sheet())["g"], grey_images)  # grey stays grey
    with pytest.raises(ValueError, match="not a genaug adapt check sheet"):
        plain = io.BytesIO()
        Image.new("RGB", (4, 4)).save(plain, format="PNG")
        read_sheet(plain.getvalue())
    with pytest.raises(ValueError, match="no images"):
        CheckResult([LabelCheck("a", 0, 0)], None, 0, "e", 1.0).sheet()


def test_default_steps_follow_the_labels() -> None:
    assert [default_steps(n) for n in (1, 2, 5, 10, 20)] == [1200, 2400, 6000, 12000, 12000]
    assert default_steps(0) == 1000


def test_the_cosine_schedule_warms_up_then_decays_to_zero() -> None:
    import torch

    from genaug.service.adapt.train import AdaptConfig, _scheduler

    def rates(schedule: str) -> list[float]:
        param = torch.nn.Parameter(torch.zeros(1))
        optimizer = torch.optim.SGD([param], lr=0.1)
        scheduler = _scheduler(optimizer, AdaptConfig(steps=100, lr=0.1, lr_schedule=schedule))
        out = []
        for _ in range(100):
            out.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
        return out

    assert rates("constant") == [0.1] * 100
    cosine = rates("cosine")
    assert cosine[0] == pytest.approx(0.02) and cosine[4] == pytest.approx(0.1)  # 5 steps up
    assert all(a >= b for a, b in zip(cosine[4:], cosine[5:], strict=False))
    assert cosine[-1] < 0.001 and cosine[52] == pytest.approx(0.05, abs=0.003)
    with pytest.raises(ValueError, match="'constant', 'cosine'"):
        rates("linear")


def test_adapt_with_default_steps_prints_the_table_and_verdict(
    tmp_path: Path, shots_folder: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CLI with no --steps: steps by the recipe's labels (scaled down here: 1 per label),
    then the final check's table, judge line and verdict; 0 when the file was written."""
    monkeypatch.setattr(adapt_module, "STEPS_PER_LABEL", 1)
    monkeypatch.setattr(adapt_module, "MIN_STEPS", 1)
    recipes = _write_recipe(tmp_path / "recipes.yaml", (5, 6, 7))
    out = tmp_path / "d.safetensors"
    args = ["adapt", str(shots_folder), "--recipes", str(recipes), "--recipe", "d", "--out",
            str(out), "--model", "tiny-digits-base", "--rank", "4", "--no-progress",
            "--check-images", "4"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    record = read_record(out)
    assert (record["steps"], record["rank"]) == (3, 4)  # 3 labels x 1 step
    lines = printed.splitlines()
    head = next(i for i, x in enumerate(lines) if x.startswith("label "))
    rows = lines[head + 1:head + 4]
    assert [r.split()[0] for r in rows] == ["5", "6", "7"], printed
    assert all(r.split()[2:4] == ["of", "4"] for r in rows), printed
    assert lines[head + 4].split()[:4] == ["all", lines[head + 4].split()[1], "of", "12"]
    assert lines[head + 5].startswith("judge: tiny-digits-encoder")
    assert lines[head + 6].startswith("not learned: label "), printed
    assert "train longer, --steps 6 --rank 32" in lines[head + 6], printed
    check = json.loads((tmp_path / "d.check.json").read_text())
    assert set(check["labels"]) == {"5", "6", "7"} and check["steps"] == 3
    assert check["verdict"] == lines[head + 6]
    shares = [check["labels"][d]["share"] for d in ("5", "6", "7")]
    assert [float(r.split()[4]) for r in rows] == [round(100 * s) for s in shares]
    assert check["sheet"] == str(tmp_path / "d.check.png") and f"{tmp_path}/d.check.png" in printed
    cut = read_sheet(tmp_path / "d.check.png")  # 3 labels x 4 images
    assert {k: v.shape for k, v in cut.items()} == {d: (4, 64, 64, 3) for d in "567"}

    # --no-check: no images drawn, no table
    (tmp_path / "d.check.json").unlink()
    (tmp_path / "d.check.png").unlink()
    assert main([*args, "--no-check"]) == 0
    assert "drawn as asked" not in capsys.readouterr().out
    assert not (tmp_path / "d.check.json").exists() and not (tmp_path / "d.check.png").exists()
    assert np.isfinite(read_record(out)["final_loss"])
