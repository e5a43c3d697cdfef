"""`trtspec check`: one fixture pair per pitfall (real tokenizers made here), each reported with its
cause and fix; a clean pair reports no error; memory figures against hand calculations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from trtspec.check import run_check
from trtspec.cli import cli
from trtspec.config import validate_config
from trtspec.deploy.sizing import KNOWN_CHECKPOINTS

TEXT_A = ["the quick brown fox jumps over the lazy dog " * 3, "speculative decoding drafts and verifies tokens"] * 20
TEXT_B = ["lorem ipsum dolor sit amet consectetur adipiscing elit", "sed do eiusmod tempor incididunt"] * 20
SPECIAL = ["<s>", "</s>", "<pad>", "<unk>"]


def write_tokenizer(path: Path, corpus: list[str], vocab_size: int = 120, eos: str = "</s>") -> int:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL))
    tok.save(str(path / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": eos,
        "pad_token": "<pad>",
        "unk_token": "<unk>",
    }
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))
    (path / "special_tokens_map.json").write_text(json.dumps({k: v for k, v in cfg.items() if k != "tokenizer_class"}))
    return tok.get_vocab_size()


LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "vocab_size": 128,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}


def make(path: Path, corpus=TEXT_A, weights: list[str] | None = None, eos: str = "</s>", **overrides) -> Path:
    path.mkdir(parents=True)
    write_tokenizer(path, corpus, eos=eos)
    (path / "config.json").write_text(json.dumps({**LLAMA, **overrides}))
    if weights is not None:
        index = {"metadata": {}, "weight_map": {w: "model-00001.safetensors" for w in weights}}
        (path / "model.safetensors.index.json").write_text(json.dumps(index))
    return path


def config(tmp_path: Path, target: Path, draft: Path | None = None, **sections) -> dict:
    data = {
        "name": "pair",
        "target": {"checkpoint": str(target)},
        "speculation": {
            "mode": "draft-target" if draft else "none",
            "num_draft_tokens": 4,
            "sampling": {"max_tokens": 256},
        },
        "build": {"backend": "tensorrt", "max_input_len": 1024, "max_seq_len": 2048},
        "serve": {"flavour": "engine", "streaming": False},
    }
    if draft:
        data["draft"] = {"checkpoint": str(draft)}
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    return data


def findings(data: dict) -> dict[str, list]:
    report = run_check(validate_config(data))
    out: dict[str, list] = {}
    for f in report.findings:
        out.setdefault(f.code, []).append(f)
    return out


def test_clean_pair_has_no_error(tmp_path):
    found = findings(config(tmp_path, make(tmp_path / "t"), make(tmp_path / "d", num_hidden_layers=2)))
    assert not [f for fs in found.values() for f in fs if f.severity == "error"], found
    # the informational ones: what check could not see, and the serving trade-offs it reports
    assert set(found) <= {"compute-capability", "memory", "max-draft-len", "kv-shared-gpu"}
    assert all(f.severity == "info" for f in found.get("max-draft-len", []))
    # GPU size unknown here: the KV caps are the engines' limits, not checked against a GPU, and check says so
    assert [f.severity for f in found["kv-shared-gpu"]] == ["warning"]


def test_different_tokenizer_is_an_error_with_the_differing_tokens(tmp_path):
    found = findings(config(tmp_path, make(tmp_path / "t"), make(tmp_path / "d", corpus=TEXT_B)))
    errors = found["tokenizer-mismatch"]
    assert any("token-to-id map" in f.message and "target" in f.message for f in errors)
    assert all("same tokenizer" in f.fix or "target's tokenizer" in f.fix for f in errors)


def test_different_special_token_ids(tmp_path):
    found = findings(config(tmp_path, make(tmp_path / "t"), make(tmp_path / "d", eos="<pad>")))
    assert any("eos_token: target id 1 vs draft id 2" in f.message for f in found["tokenizer-mismatch"])


def test_padded_vocab_is_a_warning_naming_the_ids(tmp_path):
    found = findings(config(tmp_path, make(tmp_path / "t", vocab_size=152), make(tmp_path / "d", vocab_size=128)))
    (warning,) = found["vocab-padding"]
    assert warning.severity == "warning" and "ids 128..151 exist only in the target" in warning.message
    assert "vocab-size-mismatch" not in found


def test_vocab_that_tokens_map_into_is_an_error(tmp_path):
    target = make(tmp_path / "t")
    tokens = Tokenizer.from_file(str(target / "tokenizer.json")).get_vocab_size()
    small = tokens - 10  # the draft cannot embed the tokenizer's last ten ids
    found = findings(config(tmp_path, target, make(tmp_path / "d", vocab_size=small)))
    assert "vocab-size-mismatch" in found and "tokenizer-beyond-vocab" in found
    assert f"ids {small}..127" in found["vocab-size-mismatch"][0].message


@pytest.mark.parametrize(
    ("head", "mode"),
    [({"medusa_num_heads": 2, "hidden_size": 64}, "medusa"), ({"architectures": ["LlamaForCausalLMEagle3"]}, "eagle3")],
)
def test_a_head_given_to_draft_target_is_named_not_misread(tmp_path, head, mode):
    """A Medusa or EAGLE-3 head configured as draft-target's draft model: one error saying what it is and which
    mode reads it, not tokenizer or model-config errors about a model it never was."""
    draft = tmp_path / "head"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps({**(LLAMA if mode == "eagle3" else {}), **head}))
    # with a GPU's size or /dev/shm's, sizing, serving decisions and the pod's memory read the draft too
    for i, sections in enumerate(({}, {"build": {"gpu_memory_gb": 80}}, {"deploy": {"shm_size": "1Gi"}})):
        found = findings(config(tmp_path, make(tmp_path / f"t{i}"), draft, **sections))
        errors = {code for code, fs in found.items() for f in fs if f.severity == "error"}
        assert errors == {"draft-kind"}, found
        assert "not a draft for mode draft-target" in found["draft-kind"][0].message
        assert found["draft-kind"][0].fix.startswith(f"use mode {mode} with its settings")


def test_mtp_without_layers_and_with_missing_weights(tmp_path):
    ds = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3"}
    base = {
        "speculation": {"mode": "mtp", "num_draft_tokens": 3},
        "build": {"backend": "pytorch"},
        "serve": {"flavour": "llmapi", "streaming": True},
    }
    none = findings(config(tmp_path, make(tmp_path / "a", **ds), **base))
    assert none["mtp-missing"][0].severity == "error"
    weights = ["model.layers.4.eh_proj.weight", "model.layers.4.enorm.weight"]
    partial = findings(
        config(tmp_path, make(tmp_path / "b", weights=weights, num_nextn_predict_layers=1, **ds), **base)
    )
    (missing,) = partial["mtp-weights-missing"]
    assert "hnorm.weight" in missing.message and "shared_head.norm.weight" in missing.message
    full = [*weights, "model.layers.4.hnorm.weight", "model.layers.4.shared_head.norm.weight"]
    ok = findings(config(tmp_path, make(tmp_path / "c", weights=full, num_nextn_predict_layers=1, **ds), **base))
    assert "mtp-weights-missing" not in ok and "mtp-missing" not in ok


def test_mtp_on_an_architecture_without_mtp_support(tmp_path):
    found = findings(
        config(
            tmp_path,
            make(tmp_path / "t", num_nextn_predict_layers=1),
            speculation={"mode": "mtp"},
            build={"backend": "pytorch"},
            serve={"flavour": "llmapi", "streaming": True},
        )
    )
    assert "DeepseekV3ForCausalLM" in found["architecture-unsupported"][0].message


def test_relaxed_acceptance_is_flagged_not_lossless(tmp_path):
    data = config(
        tmp_path,
        make(tmp_path / "t", architectures=["DeepseekV3ForCausalLM"], num_nextn_predict_layers=1),
        speculation={"mode": "mtp"},
        build={"backend": "pytorch"},
        serve={"flavour": "llmapi", "streaming": True},
    )
    data["mtp"] = {"relaxed_acceptance": True}
    assert findings(data)["not-lossless"][0].severity == "warning"


def test_sequence_budget_counts_output_and_drafts(tmp_path):
    data = config(tmp_path, make(tmp_path / "t"), make(tmp_path / "d"), build={"max_seq_len": 1200})
    (err,) = findings(data)["max-seq-len"]
    assert "1024 + output 256 + draft tokens 4 = 1284" in err.message and "1284" in err.fix


def test_draft_context_shorter_than_max_seq_len(tmp_path):
    found = findings(config(tmp_path, make(tmp_path / "t"), make(tmp_path / "d", max_position_embeddings=1024)))
    (err,) = found["context-length"]
    assert "draft max_position_embeddings is 1024, below max_seq_len 2048" in err.message
    exact = findings(config(tmp_path, make(tmp_path / "t2"), make(tmp_path / "d2", max_position_embeddings=2048)))
    assert "context-length" not in exact


def test_tensor_and_pipeline_parallel_divisibility(tmp_path):
    found = findings(
        config(
            tmp_path,
            make(tmp_path / "t", num_attention_heads=12, num_key_value_heads=6, num_hidden_layers=5),
            make(tmp_path / "d"),
            build={"tp": 8, "pp": 2},
        )
    )
    assert "tp-heads" in found and "tp-kv-heads" in found and "pp-layers" in found


def test_dtype_and_rope_differences_are_warnings(tmp_path):
    found = findings(
        config(
            tmp_path,
            make(tmp_path / "t"),
            make(tmp_path / "d", torch_dtype="float16", rope_scaling={"type": "linear", "factor": 2}),
        )
    )
    assert found["differs-torch-dtype"][0].severity == "warning" and "differs-rope-scaling" in found


def test_weights_larger_than_the_gpu_is_an_error(tmp_path):
    found = findings(
        config(
            tmp_path,
            make(
                tmp_path / "t",
                hidden_size=8192,
                intermediate_size=28672,
                num_hidden_layers=80,
                num_attention_heads=64,
                num_key_value_heads=8,
            ),
            make(tmp_path / "d"),
            build={"gpu_memory_gb": 80},
        )
    )
    assert "memory-weights" in found and "fp8" in found["memory-weights"][0].fix


def test_cli_exit_codes(tmp_path, runner):
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(config(tmp_path, make(tmp_path / "t"), make(tmp_path / "d"))))
    res = runner.invoke(cli, ["check", str(good), "--json"])
    assert res.exit_code == 0 and json.loads(res.output)["ok"] is True
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(config(tmp_path, make(tmp_path / "t2"), make(tmp_path / "d2", corpus=TEXT_B))))
    res = runner.invoke(cli, ["check", str(bad)])
    assert res.exit_code == 1 and "FAILED" in res.output


# --- memory against hand calculations of the published configurations -------------------------


def _published_config(hub_id: str, **extra) -> dict:
    """A public checkpoint's config.json, from the one table that holds them (sizing.KNOWN_CHECKPOINTS)."""
    return {**{k: v for k, v in KNOWN_CHECKPOINTS[hub_id].items() if k != "published"}, **extra}


LLAMA_70B = _published_config("meta-llama/Llama-3.3-70B-Instruct", max_position_embeddings=131072)
LLAMA_1B = _published_config("meta-llama/Llama-3.2-1B-Instruct", max_position_embeddings=131072)
DEEPSEEK_R1 = _published_config("deepseek-ai/DeepSeek-R1", max_position_embeddings=163840)


def _published(tmp_path: Path, name: str, cfg: dict) -> Path:
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def test_memory_llama_70b_with_1b_draft_on_one_h200(tmp_path):
    data = config(
        tmp_path,
        _published(tmp_path, "70b", LLAMA_70B),
        _published(tmp_path, "1b", LLAMA_1B),
        build={"gpu_memory_gb": 141, "max_batch_size": 16, "max_input_len": 4096, "max_seq_len": 8192},
    )
    data["target"]["quantization"] = "fp8"
    data["speculation"]["sampling"]["max_tokens"] = 512
    report = run_check(validate_config(data))
    mem = report.facts["memory"]
    # Hand calculation. 70B: embedding and head 2 x 128256 x 8192 = 2,101,346,304; per layer q and o
    # 2 x 8192 x 8192 = 134,217,728, k and v 2 x 8192 x 1024 = 16,777,216, MLP 3 x 8192 x 28672 =
    # 704,643,072, so 855,638,016 x 80 = 68,451,041,280; total 70,552,387,584 params, 1 byte in FP8.
    target_params = 2 * 128256 * 8192 + 80 * (2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672)
    assert target_params == 70_552_387_584
    # 1B: tied embedding 128256 x 2048 = 262,668,288; per layer q, o 2 x 2048 x 2048, k, v 2 x 2048 x 512,
    # MLP 3 x 2048 x 8192: 60,817,408 x 16 = 973,078,528; total 1,235,746,816 params, 2 bytes in BF16.
    draft_params = 128256 * 2048 + 16 * (2 * 2048 * 2048 + 2 * 2048 * 512 + 3 * 2048 * 8192)
    weights_gb = (target_params * 1 + draft_params * 2) / 1e9  # 73.02 GB
    # KV per token: 70B FP8 cache 2 x 80 layers x 8 heads x 128 x 1 byte = 163,840 B; 1B BF16
    # 2 x 16 x 8 x 64 x 2 = 32,768 B; at 16 x 8192 tokens: (163840 + 32768) x 131072 = 25.77 GB.
    kv_gb = (2 * 80 * 8 * 128 * 1 + 2 * 16 * 8 * 64 * 2) * 16 * 8192 / 1e9
    assert mem["weights_gb_per_gpu"] == pytest.approx(weights_gb, rel=0.05)
    assert mem["kv_needed_gb_per_gpu"] == pytest.approx(kv_gb, rel=0.05)
    assert mem["kv_needed_gb_per_gpu"] < mem["kv_budget_gb_per_gpu"]  # 25.8 GB needed, (141-73-3) x 0.9 left
    if data["build"].get("backend", "tensorrt") == "tensorrt":  # both caches fit: each gets every token it wants
        shared = next(f for f in report.findings if f.code == "kv-shared-gpu")
        assert shared.severity == "info" and f"max_tokens_in_paged_kv_cache {16 * 8192} of the" in shared.message
    assert not [f for f in report.findings if f.severity == "error"]


def test_pytorch_quantization_must_come_from_the_checkpoint(tmp_path):
    """The LLM API quantizes nothing itself: fp8 on a BF16 checkpoint is an error, on an FP8 one it is read."""
    plain = dict(DEEPSEEK_R1)
    del plain["quantization_config"]
    for cfg_json, expect in ((plain, "error"), (DEEPSEEK_R1, None)):
        data = config(
            tmp_path, _published(tmp_path, f"r1-{expect}", cfg_json), speculation={"mode": "mtp"},
            build={"backend": "pytorch", "tp": 8, "gpu_memory_gb": 141}, serve={"flavour": "llmapi"},
        )  # fmt: skip
        data["target"]["quantization"] = "fp8"
        report = run_check(validate_config(data))
        ignored = [f for f in report.findings if f.code == "quantization-ignored"]
        assert [f.severity for f in ignored] == ([expect] if expect else []), report.findings
        # the memory plan counts what would load: BF16 weights where the checkpoint is not quantized
        per_gpu = report.facts["memory"]["target_weights_gb_per_gpu"]
        assert per_gpu > 150 if expect else per_gpu < 100


def test_memory_deepseek_r1_mtp_on_8_gpus(tmp_path):
    data = config(
        tmp_path,
        _published(tmp_path, "r1", DEEPSEEK_R1),
        speculation={"mode": "mtp"},
        build={
            "backend": "pytorch",
            "tp": 8,
            "gpu_memory_gb": 141,
            "max_batch_size": 32,
            "max_input_len": 4096,
            "max_seq_len": 8192,
        },
        serve={"flavour": "llmapi", "streaming": True},
    )
    data["target"]["quantization"] = "fp8"
    mem = run_check(validate_config(data)).facts["memory"]
    # Hand calculation. MLA attention per layer: q_a 7168 x 1536 + q_b 1536 x 128 x 192 + kv_a 7168 x 576
    # + kv_b 512 x 128 x 256 + o 128 x 128 x 7168 = 187,105,280. Dense MLP 3 x 7168 x 18432 = 396,361,728
    # (3 layers). MoE layer: (256 + 1) x 3 x 7168 x 2048 + router 256 x 7168 = 11,320,426,496 (58 layers).
    # Embedding and head 2 x 129280 x 7168. MTP layer: attention + MoE + eh_proj 2 x 7168 x 7168.
    attn = 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168
    moe = 257 * 3 * 7168 * 2048 + 256 * 7168
    trunk = 2 * 129280 * 7168 + 61 * attn + 3 * 3 * 7168 * 18432 + 58 * moe
    assert 670e9 < trunk < 672e9  # DeepSeek's "671B"
    total = trunk + attn + moe + 2 * 7168 * 7168  # 685B with the MTP layer, as published
    assert mem["target_params"] == pytest.approx(total, rel=0.001)
    assert mem["weights_gb_per_gpu"] == pytest.approx(total / 8 / 1e9, rel=0.05)  # FP8, TP8: 85.6 GB
    # KV: MLA latent (512 + 64) x 62 layers, replicated across TP ranks, in FP8 (1 byte) as NVIDIA's DeepSeek
    # serving recipe keeps it (kv_cache_config.dtype fp8): 35,712 B/token.
    assert mem["kv_needed_gb_per_gpu"] == pytest.approx(62 * 576 * 1 * 32 * 8192 / 1e9, rel=0.05)
