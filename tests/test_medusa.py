"""Medusa deployed on backend torch: the engine flavour builds the heads beside the target and serves the static
tree medusa.choices gives, read back from the tensorrt_llm model's medusa_choices as TensorRT-LLM's backend
reads it; the flavours and settings that could not serve that tree are refused in one line."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import CONFIGS, pbtxt_parameters

from trtspec.assets import EMBEDDED_CHECKPOINTS
from trtspec.config import validate_config
from trtspec.errors import ConfigError, UsageError
from trtspec.speculative.batch import Sequence
from trtspec.speculative.drafters import MedusaDrafter
from trtspec.speculative.model import load_transformer
from trtspec.speculative.runner import GenerationParams, SpeculativeRunner
from trtspec.speculative.tree import TreeShape

PROMPTS = [[5, 6, 7, 8, 9], [40, 41, 42], [100, 101, 102, 103, 104, 105, 106, 107]]
GREEDY = GenerationParams(max_tokens=32)


def _deployment(root, **changes):
    data = yaml.safe_load((CONFIGS / "tiny-medusa.yaml").read_text())
    data["build"].update(max_batch_size=2, max_seq_len=256, max_input_len=64, output_dir=str(root / "engines"))
    data["serve"]["repository"] = str(root / "repo")
    for section, values in changes.items():
        data[section] = None if values is None else {**(data.get(section) or {}), **values}
    return validate_config(data, root / "medusa.yaml")


def test_a_medusa_deployment_builds_packages_and_serves_its_static_tree(tmp_path):
    """The heads are cast into the build's draft folder beside a target engine that records medusa and the room for
    a tree (max_token_len) as max_draft_len; the tensorrt_llm model carries NVIDIA's decoding_mode and
    medusa_choices; the engine trtspec's stand-in makes of those parameters verifies that tree and decodes greedily
    as plain decoding."""
    from trtspec.build.builder import run_build
    from trtspec.check import run_check
    from trtspec.modes.medusa import parse_choices
    from trtspec.repository.package import package_repository
    from trtspec.repository.serving import engine_from_parameters

    cfg = _deployment(tmp_path)
    assert run_build(cfg).built == ["target", "draft"]
    engines = tmp_path / "engines" / "tiny-medusa"
    build = json.loads((engines / "target" / "engine.json").read_text())["build_config"]
    assert (build["speculative_decoding_mode"], build["max_draft_len"]) == ("medusa", 63)  # max_token_len's room
    assert json.loads((engines / "draft" / "engine.json").read_text())["role"] == "draft"
    p = pbtxt_parameters(package_repository(cfg) / "tensorrt_llm" / "config.pbtxt")
    assert (p["decoding_mode"], p["medusa_choices"]) == ("medusa", "{0}, {1}, {0, 0}, {0, 1}, {1, 0}")
    assert p["trtspec_mode"] == "medusa" and p["trtspec_draft_dir"] == str(engines / "draft")
    assert p["trtspec_num_draft_tokens"] == "2"  # a step drafts the tree's depth, as its K (the metrics' label)
    assert p["trtspec_policy"] == "fixed"  # auto: the tree is fixed by the choices, so there is no K to adapt
    assert [f.code for f in run_check(cfg).findings if f.severity == "error"] == []

    plain = SpeculativeRunner(load_transformer(EMBEDDED_CHECKPOINTS["tiny-target"])).generate(PROMPTS, GREEDY)
    for choices, shape in (("{0}, {1}, {0, 0}, {0, 1}, {1, 0}", TreeShape(2, 3)), ("{0}, {0, 0}", TreeShape(2, 1))):
        engine = engine_from_parameters({**p, "medusa_choices": choices}, slots=2)  # the parameter's tree is run
        assert isinstance(engine.drafter, MedusaDrafter) and engine.tree == shape
        served = [Sequence(prompt, GREEDY) for prompt in PROMPTS]  # three requests in the engine's two slots
        for seq in served:
            engine.add(seq)
        while engine.has_work():
            engine.step()
        assert [s.result.tokens for s in served] == [g.tokens for g in plain]
        assert sum(s.result.stats.accepted_tokens for s in served) > 0  # the trained heads do guess right
    for bad in ("0, 1", "{-1}", "{}", "{0,}"):
        with pytest.raises(UsageError, match="medusa_choices must read like"):
            engine_from_parameters({**p, "medusa_choices": bad}, slots=2)
    with pytest.raises(UsageError, match="has no parent"):
        engine_from_parameters({**p, "medusa_choices": "{0}, {1, 0}"}, slots=2)
    # a tree bigger than the room the engine was built with is refused, as TensorRT-LLM's engine refuses it
    wide = ", ".join([*(f"{{{i}}}" for i in range(8)), *(f"{{0, {i}}}" for i in range(56))])  # 64 nodes
    with pytest.raises(UsageError, match=r"built with max_draft_len 63; the medusa settings need 64"):
        engine_from_parameters({**p, "medusa_choices": wide}, slots=2)
    # and check finds it first, in a config grown past the built engine's room
    grown = _deployment(tmp_path, medusa={"max_token_len": 64, "choices": parse_choices(wide)})
    found = [f for f in run_check(grown).findings if f.code == "tree-draft-len"]
    assert [f.severity for f in found] == ["error"] and "max_draft_len 63; the medusa settings need 64" in found[
        0
    ].message


def test_medusa_is_refused_where_its_tree_would_not_be_served(tmp_path):
    from trtspec.build.builder import run_build
    from trtspec.check import run_check

    with pytest.raises(UsageError, match=r"no LLM API config.*set serve\.flavour engine"):
        run_build(_deployment(tmp_path / "llmapi", serve={"flavour": "llmapi"}))
    with pytest.raises(UsageError, match=r"set medusa\.choices"):  # the backend's default tree is not trtspec's
        run_build(_deployment(tmp_path / "default", medusa={"choices": None}))
    for built in ("llmapi", "default"):
        assert not (tmp_path / built / "engines" / "tiny-medusa" / "target").exists()
    # generate and plan run a config without choices (the heads' chain): check warns before the build refuses
    found = {f.code: f for f in run_check(_deployment(tmp_path / "warn", medusa={"choices": None})).findings}
    assert found["torch-deploy"].severity == "warning" and "set medusa.choices" in found["torch-deploy"].message
    assert "torch-deploy" not in {f.code for f in run_check(_deployment(tmp_path / "ok")).findings}
    cases = [
        ({"medusa": {"choices": [[0], [1, 0]]}}, r"the path \[1, 0\] has no parent \[1\]"),
        ({"medusa": {"choices": [[0], [0]]}}, "given once"),
        ({"medusa": {"choices": [[0], [0, 0], [0, 0, 0]]}}, "a path of depth 3 needs 3 heads"),
        ({"speculation": {"tree": "2x2"}}, r"speculation\.tree: medusa\.choices is the tree"),
        ({"speculation": {"num_draft_tokens": 3}}, "Medusa's drafts are its tree"),
        ({"speculation": {"policy": "adaptive"}}, r"adaptive chooses K for chains; medusa's settings fix its tree"),
        ({"medusa": {"choices": []}}, "medusa.choices"),  # one line, not a traceback
    ]
    assert _deployment(tmp_path).policy == "fixed"  # auto, with the tree the choices fix
    for changes, message in cases:
        with pytest.raises(ConfigError, match=message):
            _deployment(tmp_path, **changes)


def test_the_runner_refuses_choices_deeper_than_the_heads_it_loads():
    from trtspec.speculative.factory import load_runner

    with pytest.raises(UsageError, match="a path 3 deep; the heads checkpoint has 2"):
        load_runner(
            EMBEDDED_CHECKPOINTS["tiny-target"], "medusa", EMBEDDED_CHECKPOINTS["tiny-medusa"],
            settings={"choices": [[0], [0, 0], [0, 0, 0]]},
        )  # fmt: skip


def test_plan_does_not_choose_k_for_a_static_tree_and_says_how_to_compare_it(tmp_path, runner):
    from trtspec.cli import cli

    res = runner.invoke(cli, ["plan", str(CONFIGS / "tiny-medusa.yaml")])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
    assert "medusa's follow from its own settings (the tree 2x3)" in res.output
    assert "plan a copy without the medusa settings that fix it" in res.output


def test_the_runner_up_once_tree_spends_its_nodes_on_the_heads_best_guesses():
    from trtspec.modes.medusa import choices_problem, runner_up_once_tree

    for depth in range(1, 6):
        tree = runner_up_once_tree(depth)
        assert choices_problem(tree) is None and len(tree) == depth * (depth + 3) // 2
        assert max(map(len, tree)) == depth and all(sum(path) <= 1 and set(path) <= {0, 1} for path in tree)
        assert [len(p) for p in tree] == sorted(len(p) for p in tree)  # shallow first
    assert runner_up_once_tree(2) == [[0], [1], [0, 0], [0, 1], [1, 0]]
    cut = runner_up_once_tree(16, 63)  # 152 nodes before the cut: the shallowest 63, each with its parent
    assert len(cut) == 63 and choices_problem(cut) is None and cut == runner_up_once_tree(16)[:63]


@pytest.mark.parametrize(
    ("backend", "heads", "tree"),
    [("torch", 2, True), ("tensorrt", 2, True), ("tensorrt", 4, False), ("torch", 16, True)],
)
def test_init_writes_a_tree_where_the_backends_default_does_not_fit(tmp_path, backend, heads, tree):
    """Backend torch has no copy of mc_sim_7b_63 and the backend's default needs 4 heads: init writes a tree
    then, so its config builds as written; a 4-head checkpoint on engines keeps the backend's default."""
    from trtspec.init_config import build_config_dict
    from trtspec.modes.medusa import runner_up_once_tree

    heads_dir = tmp_path / "heads"
    heads_dir.mkdir()
    config = json.loads((EMBEDDED_CHECKPOINTS["tiny-medusa"] / "config.json").read_text())
    (heads_dir / "config.json").write_text(json.dumps({**config, "medusa_num_heads": heads}))
    data = build_config_dict("m", "embedded:tiny-target", str(heads_dir), "medusa", backend, tmp_path)
    assert data["medusa"]["num_heads"] == heads
    assert data["medusa"]["choices"] == (runner_up_once_tree(heads, 63) if tree else None)  # 63: max_token_len
    assert validate_config(data).mode == "medusa"
    if backend == "torch":  # the walk in test_modes builds it; here: nothing refuses it
        from trtspec.modes import get_mode

        assert get_mode("medusa").torch_deploy_refusal(validate_config(data)) is None
