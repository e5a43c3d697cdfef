"""tools/train_embedded_pair.py without training: the card it renders and how it asks for its corpus."""

from __future__ import annotations

import importlib.util
import json
import sys
from types import ModuleType

import pytest
from conftest import REPO

from trtspec.assets import ASSETS_DIR

URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"


@pytest.fixture(scope="module")
def script() -> ModuleType:
    name = "train_embedded_pair"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "tools" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_the_shipped_card_is_the_template_rendered_from_the_shipped_log(script):
    """An edit to tools/model_card.md.tmpl must come with `--card-only` re-rendering the shipped card."""
    record = json.loads((ASSETS_DIR / "training_log.json").read_text(encoding="utf-8"))
    assert script.render_model_card(record) == (ASSETS_DIR / "MODEL_CARD.md").read_text(encoding="utf-8")


def test_no_path_outside_the_repository_is_named():
    for path in (ASSETS_DIR / "MODEL_CARD.md", ASSETS_DIR / "training_log.json", REPO / "tools" / "model_card.md.tmpl"):
        assert "../shared" not in path.read_text(encoding="utf-8"), path


@pytest.mark.parametrize("given", [None, "missing.txt"])
def test_without_its_corpus_it_says_what_to_fetch(script, given, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("TRTSPEC_DATA", raising=False)
    argv = ["--out", str(tmp_path / "out")] + ([] if given is None else ["--corpus", str(tmp_path / given)])
    with pytest.raises(SystemExit) as exit_info:
        script.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and URL in err and "tinyshakespeare.txt" in err and "$TRTSPEC_DATA" in err
    assert not (tmp_path / "out").exists()  # nothing is made before the corpus is found


def test_the_corpus_defaults_to_trtspec_data(script, tmp_path, monkeypatch):
    monkeypatch.setenv("TRTSPEC_DATA", str(tmp_path))
    with pytest.raises(SystemExit):
        script.resolve_corpus(None)
    (tmp_path / "tinyshakespeare.txt").write_text("First Citizen:\n")
    assert script.resolve_corpus(None) == tmp_path / "tinyshakespeare.txt"


def test_a_defaulted_corpus_is_logged_by_its_variable_not_this_machines_path(script):
    hparams = script.hparams_record(script.parse_args(["--out", "trtspec/assets"]))
    assert hparams["corpus"] == "$TRTSPEC_DATA/tinyshakespeare.txt" and hparams["out"] == "trtspec/assets"
