"""Read NVIDIA's Triton models for TensorRT-LLM and write down what they require of a repository.

    python tools/nvidia_contract.py ALL_MODELS --label L --repo OWNER/NAME --commit SHA \
        --trtllm VERSION [--path-prefix triton_backend/all_models] [--contract FILE]

ALL_MODELS is an `all_models` folder: `/app/all_models` in NVIDIA's container, `triton_backend/all_models`
in a TensorRT-LLM checkout, or `all_models` in tensorrtllm_backend from before the models moved (<= 0.20).
The facts (tensor names, types and dims of each config template, the parameters and outputs each
model.py reads without a default, the tensors the BLS asks of the other models, the sibling files a
model.py imports) are added to the contract as one source, replacing an earlier source of the same
label. Nothing of NVIDIA's code is copied: the tool keeps names and types, read from the code's syntax
tree, and the upstream path and commit they came from.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path

from google.protobuf import text_format
from google.protobuf.json_format import MessageToDict
from tritonclient.grpc import model_config_pb2 as mc

DEFAULT_CONTRACT = Path(__file__).resolve().parents[1] / "trtspec" / "repository" / "nvidia_contract.json"

# The templates trtspec generates repositories from (relative to all_models).
TEMPLATES = {
    "preprocessing": "inflight_batcher_llm/preprocessing",
    "postprocessing": "inflight_batcher_llm/postprocessing",
    "tensorrt_llm": "inflight_batcher_llm/tensorrt_llm",
    "tensorrt_llm_bls": "inflight_batcher_llm/tensorrt_llm_bls",
    "ensemble": "inflight_batcher_llm/ensemble",
    "llmapi": "llmapi/tensorrt_llm",
}

# Which model the BLS's helper methods build requests for (lib/triton_decoder.py): the name maps in
# these methods hold the tensor names sent, the lists on self the outputs asked for.
BLS_SENDS = {
    "_get_preproc_tensors": "preprocessing",
    "_get_tensors_from_preproc": "tensorrt_llm",
    "_get_llm_tensors_from_request": "tensorrt_llm",
    "_get_tensors_from_multimodal_enc": "tensorrt_llm",
    "_get_postproc_tensors": "postprocessing",
}
BLS_ASKS = {"_preproc_outputs": "preprocessing", "_llm_outputs": "tensorrt_llm", "_postproc_outputs": "postprocessing"}

_PLACEHOLDER = re.compile(r"(\w+)(\s*:\s*)\$\{(\w+)\}")
_BARE_PLACEHOLDER = re.compile(r"(?<![\"\w])\$\{(\w+)\}")


def _fill_template(text: str) -> tuple[str, dict[str, str]]:
    """Unquoted ${x} -> a parseable value; data_type placeholders are remembered by field."""
    typed: dict[str, str] = {}

    def field(m: re.Match) -> str:
        key, sep, name = m.groups()
        if key == "data_type":
            typed.setdefault(name, name)
            return f"{key}{sep}TYPE_FP32"
        if key == "decoupled":
            return f"{key}{sep}false"
        return f"{key}{sep}1"

    text = _PLACEHOLDER.sub(field, text)
    return _BARE_PLACEHOLDER.sub("1", text), typed


def _tensors(config_text: str, messages, kind: str) -> list[dict]:
    """Each tensor; a templated data_type is kept as the placeholder's name (${logits_datatype})."""
    blocks = re.split(r"\n\s*\{", config_text)
    out = []
    for message in messages:
        d = MessageToDict(message, preserving_proto_field_name=True)
        entry = {
            "name": message.name,
            "data_type": mc.DataType.Name(message.data_type).removeprefix("TYPE_"),
            "dims": [int(x) for x in message.dims],
        }
        for block in blocks:
            if re.search(rf'name:\s*"{re.escape(message.name)}"', block):
                m = re.search(r"data_type:\s*\$\{(\w+)\}", block)
                if m:
                    entry["data_type"] = "${" + m.group(1) + "}"
                break
        if kind == "input":
            entry["optional"] = bool(message.optional)
            entry["allow_ragged_batch"] = bool(message.allow_ragged_batch)
        if "reshape" in d:
            entry["reshape"] = [int(x) for x in d["reshape"].get("shape", [])]
        out.append(entry)
    return out


def config_facts(path: Path) -> dict:
    raw = path.read_text(encoding="utf-8")
    filled, _ = _fill_template(raw)
    config = text_format.Parse(filled, mc.ModelConfig())
    facts = {
        "inputs": _tensors(raw, config.input, "input"),
        "outputs": _tensors(raw, config.output, "output"),
        "parameters": sorted(config.parameters),
        "dynamic_batching": config.HasField("dynamic_batching"),
    }
    if config.platform == "ensemble":
        facts["steps"] = [
            {"model": s.model_name, "input_map": dict(s.input_map), "output_map": dict(s.output_map)}
            for s in config.ensemble_scheduling.step
        ]
    return facts


def _strings(node: ast.AST) -> list[str] | None:
    if isinstance(node, ast.List | ast.Tuple) and all(
        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts
    ):
        return [e.value for e in node.elts]
    return None


def _const(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _is_parameters(node: ast.AST, aliases: set[str]) -> bool:
    """`x['parameters']`, `x.params` style aliases bound to it, or a name bound to it."""
    if isinstance(node, ast.Subscript) and _const(node.slice) == "parameters":
        return True
    if isinstance(node, ast.Name) and node.id in aliases:
        return True
    return isinstance(node, ast.Attribute) and node.attr in aliases


def code_facts(model_py: Path) -> dict:
    """What one model.py reads: parameters without a default, config entries it looks up, sibling imports."""
    tree = ast.parse(model_py.read_text(encoding="utf-8"))
    aliases: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and _is_parameters(node.value, set()):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    aliases.add(target.id)
                elif isinstance(target, ast.Attribute):
                    aliases.add(target.attr)
    unguarded, guarded, outputs, inputs, tensors_read, yaml_keys = set(), set(), set(), set(), set(), set()
    for func in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]:
        lists: dict[str, list[str]] = {}
        loops: dict[str, str] = {}
        for node in ast.walk(func):
            if isinstance(node, ast.Assign) and (values := _strings(node.value)) is not None:
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        lists[target.id] = values
            if isinstance(node, ast.For) and isinstance(node.target, ast.Name) and isinstance(node.iter, ast.Name):
                loops[node.target.id] = node.iter.id
        # `if "key" in params: params["key"]` reads a key only where it is present
        checked = {
            key
            for node in ast.walk(func)
            if isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.In) and (key := _const(node.left))
        }
        for node in ast.walk(func):
            if not isinstance(node, ast.Subscript) or (key := _const(node.slice)) is None or key in checked:
                continue
            if _is_parameters(node.value, aliases):
                unguarded.add(key)
            if isinstance(node.value, ast.Name) and node.value.id == "triton_config":
                yaml_keys.add(f"triton_config.{key}")
        for node in ast.walk(func):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute | ast.Name):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            is_get = name == "get" and isinstance(node.func, ast.Attribute)
            if is_get and _is_parameters(node.func.value, aliases) and node.args and (key := _const(node.args[0])):
                guarded.add(key)
            if name in ("get_output_config_by_name", "get_input_config_by_name") and len(node.args) == 2:
                arg = node.args[1]
                names = [_const(arg)] if _const(arg) else lists.get(loops.get(getattr(arg, "id", ""), ""), [])
                (outputs if name.startswith("get_output") else inputs).update(n for n in names if n)
            if name == "get_input_tensor_by_name" and len(node.args) >= 2 and (key := _const(node.args[1])):
                tensors_read.add(key)
    here = model_py.parent
    siblings = set()
    for node in ast.walk(tree):
        modules = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [node.module]
        elif isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        for module in modules:
            top = module.split(".")[0]
            if (here / f"{top}.py").is_file():
                siblings.add(f"{top}.py")
            elif (here / top).is_dir():
                siblings.add(top)
    return {
        "parameters_unguarded": sorted(unguarded - {"parameters"}),
        "parameters_with_default": sorted(guarded),
        "outputs_looked_up": sorted(outputs),
        "inputs_looked_up": sorted(inputs),
        "inputs_read": sorted(tensors_read),
        "model_yaml_keys": sorted(yaml_keys),
        "sibling_files": sorted(siblings),
    }


def bls_facts(decoder_py: Path) -> dict:
    """The requests NVIDIA's BLS makes of the other models, and the client inputs it reads."""
    tree = ast.parse(decoder_py.read_text(encoding="utf-8"))
    calls: dict[str, dict[str, set[str]]] = {}
    client_inputs: list[str] = []
    for func in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]:
        for node in ast.walk(func):
            if isinstance(node, ast.Assign) and (values := _strings(node.value)) is not None:
                for target in node.targets:
                    if isinstance(target, ast.Attribute) and target.attr in BLS_ASKS:
                        calls.setdefault(BLS_ASKS[target.attr], {"sent": set(), "asked": set()})["asked"].update(values)
                    if isinstance(target, ast.Attribute) and target.attr == "input_names":
                        client_inputs = values
            model = BLS_SENDS.get(func.name)
            if model is None:
                continue
            entry = calls.setdefault(model, {"sent": set(), "asked": set()})
            if isinstance(node, ast.Dict):
                entry["sent"].update(v for v in map(_const, node.values) if v)
            is_tensor = isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "Tensor" and node.args
            if is_tensor and (key := _const(node.args[0])):
                entry["sent"].add(key)
    return {
        "requests": {m: {k: sorted(v) for k, v in e.items()} for m, e in sorted(calls.items())},
        "client_inputs_read": client_inputs,
    }


def read_all_models(root: Path) -> dict:
    models = {}
    for name, rel in TEMPLATES.items():
        folder = root / rel
        if not (folder / "config.pbtxt").is_file():
            raise SystemExit(f"{folder}/config.pbtxt not found: is {root} an all_models folder?")
        entry = {"template": rel, "config": config_facts(folder / "config.pbtxt")}
        if (folder / "1" / "model.py").is_file():
            entry["code"] = code_facts(folder / "1" / "model.py")
        models[name] = entry
    decoder = root / TEMPLATES["tensorrt_llm_bls"] / "1" / "lib" / "triton_decoder.py"
    models["tensorrt_llm_bls"]["bls"] = bls_facts(decoder)
    return models


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("all_models", type=Path)
    ap.add_argument("--label", required=True, help="a short name for this source, e.g. trtllm-1.2")
    ap.add_argument("--repo", required=True)
    ap.add_argument("--commit", required=True, help="the commit of the tree, or one per file: PATH=SHA,PATH=SHA")
    ap.add_argument("--trtllm", required=True, help="TensorRT-LLM version of these files")
    ap.add_argument("--path-prefix", default="triton_backend/all_models")
    ap.add_argument("--contract", type=Path, default=DEFAULT_CONTRACT)
    ap.add_argument("--print", action="store_true", help="print the facts instead of writing the contract")
    a = ap.parse_args(argv)
    facts = read_all_models(a.all_models)
    if a.print:
        json.dump(facts, sys.stdout, indent=1)
        return 0
    contract = json.loads(a.contract.read_text()) if a.contract.is_file() else {"sources": []}
    contract["sources"] = [s for s in contract["sources"] if s["label"] != a.label]
    commit = dict(item.split("=", 1) for item in a.commit.split(",")) if "=" in a.commit else a.commit
    contract["sources"].append(
        {
            "label": a.label,
            "repo": a.repo,
            "path": a.path_prefix,
            "commit": commit,
            "trtllm": a.trtllm,
            "models": facts,
        }
    )
    a.contract.write_text(json.dumps(contract, indent=1) + "\n", encoding="utf-8")
    print(f"{a.contract}: {len(contract['sources'])} sources")
    return 0


if __name__ == "__main__":
    sys.exit(main())
