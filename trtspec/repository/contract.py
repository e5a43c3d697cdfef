"""What NVIDIA's Triton models for TensorRT-LLM require of a repository, read from their code.

`nvidia_contract.json` beside this file is written by `tools/nvidia_contract.py` from NVIDIA's
`all_models` folders, one source per upstream tree (repository, path, commit, TensorRT-LLM version).
It holds names and types only: each config template's tensors, the parameters each model.py reads
without a default, the outputs it looks up at load time, the tensors NVIDIA's BLS asks of the other
models, and the sibling files a model.py imports. trtspec generates every engine- and llmapi-flavour
config from the union over the sources, so a repository serves whichever of those trees the
container carries; `tests/test_contract.py` fails when a generated config drops an item.

A few requirements are conditions in NVIDIA's code rather than names, and the tool cannot read them
from the syntax tree; they are stated in CONDITIONS with the source they come from.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from trtspec.repository.pbtxt import Tensor

CONTRACT_FILE = Path(__file__).with_name("nvidia_contract.json")

# Templated data types, as the documented fill_template commands set them for a decoder-only LLM.
DATA_TYPE_PARAMETERS = {
    "logits_datatype": "FP32",
    "encoder_input_features_data_type": "FP16",
    "prompt_embedding_table_data_type": "FP16",
}

# Requirements that are conditions in NVIDIA's code (file: what it does).
CONDITIONS = {
    "llmapi/tensorrt_llm/1/model.py (multi-instance)": (
        "an instance_group count above 1 raises 'gpu_device_ids parameter required when instance count > 1'"
        " unless config.pbtxt sets gpu_device_ids (one ';'-separated GPU list per instance): trtspec's config"
        " refuses serve.instances > 1 for NVIDIA's backends (scale with deploy.replicas)"
    ),
    "the union over trees": (
        "an older tree ignores what only a newer one declares (return_num_input/output_tokens in 0.20, the"
        " llmapi model's stop, lora_* and perf inputs before they were read): such inputs are accepted and"
        " have no effect there"
    ),
    "inflight_batcher_llm/tensorrt_llm_bls/1/model.py (speculative)": (
        "newer BLS versions read the target's and draft's exclude_input_in_output from the server's gRPC"
        " endpoint at localhost:8001 before speculating: gRPC must listen on 8001"
    ),
    "inflight_batcher_llm/tensorrt_llm_bls/1/model.py (streaming)": (
        "a request without 'stream' reads the absent tensor as None and fails ('NoneType' object has no"
        " attribute 'any'): clients of a non-decoupled BLS send stream=false"
    ),
}


@dataclass(frozen=True)
class ModelContract:
    template: str  # the all_models folder, e.g. inflight_batcher_llm/preprocessing
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    parameters: frozenset[str]  # every parameter key the templates carry
    parameters_required: frozenset[str]  # read as model_config['parameters'][key], no default
    outputs_looked_up: frozenset[str]  # get_output_config_by_name at load time
    inputs_looked_up: frozenset[str]
    sibling_files: tuple[str, ...]  # imported from the model's version folder
    model_yaml_keys: frozenset[str]


@cache
def load() -> dict:
    return json.loads(CONTRACT_FILE.read_text(encoding="utf-8"))


def sources() -> list[dict]:
    """Each upstream tree the contract was read from (label, repo, path, commit, trtllm), oldest first."""
    return [{k: v for k, v in s.items() if k != "models"} for s in load()["sources"]]


def _tensor(entry: dict, kind: str) -> Tensor:
    dtype = entry["data_type"]
    if dtype.startswith("${"):
        dtype = DATA_TYPE_PARAMETERS[dtype[2:-1]]
    reshape = tuple(entry["reshape"]) if "reshape" in entry else None
    optional = kind == "input" and entry.get("optional", False)
    ragged = kind == "input" and entry.get("allow_ragged_batch", False)
    return Tensor(entry["name"], dtype, tuple(entry["dims"]), optional=optional, ragged=ragged, reshape=reshape)


def _union(entries_by_source: list[list[dict]], kind: str) -> tuple[Tensor, ...]:
    """Every tensor any source declares, in first-seen order; a later (newer) source's type wins."""
    merged: dict[str, dict] = {}
    for entries in entries_by_source:
        for entry in entries:
            merged[entry["name"]] = entry
    return tuple(_tensor(e, kind) for e in merged.values())


@cache
def model(name: str) -> ModelContract:
    """name: preprocessing, postprocessing, tensorrt_llm, tensorrt_llm_bls, ensemble or llmapi."""
    entries = [s["models"][name] for s in load()["sources"]]
    code = [e.get("code", {}) for e in entries]

    def joined(key: str) -> frozenset[str]:
        return frozenset(x for c in code for x in c.get(key, ()))

    return ModelContract(
        template=entries[-1]["template"],
        inputs=_union([e["config"]["inputs"] for e in entries], "input"),
        outputs=_union([e["config"]["outputs"] for e in entries], "output"),
        parameters=frozenset(p for e in entries for p in e["config"]["parameters"]),
        parameters_required=joined("parameters_unguarded"),
        outputs_looked_up=joined("outputs_looked_up"),
        inputs_looked_up=joined("inputs_looked_up"),
        sibling_files=tuple(sorted(joined("sibling_files"))),
        model_yaml_keys=joined("model_yaml_keys"),
    )


@cache
def bls_requests() -> dict[str, dict[str, frozenset[str]]]:
    """model -> {'sent': tensors NVIDIA's BLS sends it, 'asked': outputs it asks for}, over all sources."""
    out: dict[str, dict[str, set[str]]] = {}
    for s in load()["sources"]:
        for target, req in s["models"]["tensorrt_llm_bls"]["bls"]["requests"].items():
            entry = out.setdefault(target, {"sent": set(), "asked": set()})
            entry["sent"].update(req["sent"])
            entry["asked"].update(req["asked"])
    return {m: {k: frozenset(v) for k, v in e.items()} for m, e in out.items()}


def ensemble_steps() -> list[dict]:
    """The ensemble's steps (model, input_map, output_map), each map the union over the sources."""
    steps: dict[str, dict] = {}
    for s in load()["sources"]:
        for step in s["models"]["ensemble"]["config"]["steps"]:
            entry = steps.setdefault(step["model"], {"model": step["model"], "input_map": {}, "output_map": {}})
            entry["input_map"].update(step["input_map"])
            entry["output_map"].update(step["output_map"])
    return list(steps.values())


def violations(repository: Path) -> list[str]:
    """What a repository for NVIDIA's container lacks that NVIDIA's code requires, one line each."""
    from trtspec.repository.pbtxt import DTYPES, parse

    def config(name: str):
        path = repository / name / "config.pbtxt"
        return parse(path.read_text(encoding="utf-8")) if path.is_file() else None

    problems: list[str] = []
    slots = {"ensemble": "ensemble", "preprocessing": "preprocessing", "postprocessing": "postprocessing",
             "tensorrt_llm_bls": "tensorrt_llm_bls", "tensorrt_llm": "tensorrt_llm"}  # fmt: skip
    llmapi = (repository / "tensorrt_llm" / "1" / "model.yaml").is_file()
    if llmapi:
        slots = {"llmapi": "tensorrt_llm"}
    for name, slot in slots.items():
        c, want = config(slot), model(name)
        if c is None:
            problems.append(f"{slot}: no config.pbtxt")
            continue
        inputs, outputs = {t.name for t in c.input}, {t.name for t in c.output}
        parameters = set(c.parameters)
        for ours, theirs in ((c.input, want.inputs), (c.output, want.outputs)):
            declared = {t.name: t for t in ours}
            for t in theirs:
                got = declared.get(t.name)
                if got is not None and (got.data_type != DTYPES[t.dtype] or tuple(got.dims) != t.dims):
                    problems.append(
                        f"{slot}: {t.name} is not {t.dtype} {list(t.dims)} as NVIDIA's template declares it"
                    )
        for missing in sorted(want.parameters_required - parameters):
            problems.append(f"{slot}: parameter {missing} (read without a default by {want.template}/1/model.py)")
        for missing in sorted(want.outputs_looked_up - outputs):
            problems.append(f"{slot}: output {missing} (looked up by {want.template}/1/model.py at load)")
        for missing in sorted(want.inputs_looked_up - inputs):
            problems.append(f"{slot}: input {missing} (looked up by {want.template}/1/model.py at load)")
        for missing in [t.name for t in want.inputs if t.name not in inputs]:
            problems.append(f"{slot}: input {missing} (declared by NVIDIA's template; clients may send it)")
        for missing in [t.name for t in want.outputs if t.name not in outputs]:
            problems.append(f"{slot}: output {missing} (declared by NVIDIA's template)")
        if name != "ensemble" and name != "tensorrt_llm":
            for file in ("model.py", *want.sibling_files):
                if not (repository / slot / "1" / file).is_symlink() and not (repository / slot / "1" / file).exists():
                    problems.append(f"{slot}: 1/{file} (imported by {want.template}/1/model.py)")
    if llmapi:
        import yaml

        options = yaml.safe_load((repository / "tensorrt_llm" / "1" / "model.yaml").read_text(encoding="utf-8"))
        for key in sorted(model("llmapi").model_yaml_keys):
            section, _, field = key.partition(".")
            if field not in (options.get(section) or {}):
                problems.append(f"tensorrt_llm: model.yaml {key} (read without a default by the llmapi model)")
        return problems
    for target, request in bls_requests().items():
        for slot in [target, *(["tensorrt_llm_draft"] if target == "tensorrt_llm" else [])]:
            c = config(slot)
            if c is None:
                continue
            inputs, outputs = {t.name for t in c.input}, {t.name for t in c.output}
            for missing in sorted(request["sent"] - inputs):
                problems.append(f"{slot}: input {missing} (NVIDIA's BLS sends it)")
            for missing in sorted(request["asked"] - outputs):
                problems.append(f"{slot}: output {missing} (NVIDIA's BLS asks for it)")
    return problems
