"""Reading the user's inputs: a model (catalog name, our YAML, or a Hugging Face config.json)
and a cluster (catalog name or cluster YAML), with errors that name the file and the field."""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from costmodel.catalog import from_hf_config, get_model
from costmodel.specs import ClusterSpec, ModelSpec, SpecError
from profiles.clusters import load_cluster


def load_model(name_or_path: str) -> ModelSpec:
    p = Path(name_or_path)
    looks_like_file = p.suffix in (".json", ".yaml", ".yml") or "/" in name_or_path
    if not looks_like_file:
        return get_model(name_or_path)
    if p.is_dir() and (p / "config.json").exists():
        p = p / "config.json"
    if not p.exists():
        raise SpecError(f"model file {p} does not exist")
    try:
        text = p.read_text()
    except OSError as e:
        raise SpecError(f"cannot read model file {p}: {e.strerror}") from None
    if p.suffix == ".json":
        try:
            cfg = json.loads(text)
        except json.JSONDecodeError as e:
            raise SpecError(f"{p}: not valid JSON ({e.msg} at line {e.lineno})") from None
        if not isinstance(cfg, dict):
            raise SpecError(f"{p}: expected a JSON object")
        if "model_type" in cfg:
            return from_hf_config(cfg, name=p.parent.name if p.name == "config.json" else p.stem, where=str(p))
        return ModelSpec.from_dict(cfg, str(p))
    try:
        d = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SpecError(f"{p}: not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(d, dict):
        raise SpecError(f"{p}: expected a mapping of model fields")
    if "model_type" in d:
        return from_hf_config(d, name=p.stem, where=str(p))
    if "extends" in d:
        base = get_model(d.pop("extends")).to_dict()
        base.update(d)
        d = base
    d.setdefault("name", p.stem)
    return ModelSpec.from_dict(d, str(p))


def load_cluster_sized(name_or_path: str, gpus: int | None) -> ClusterSpec:
    c = load_cluster(name_or_path)
    return c if gpus is None else c.with_gpus(gpus)
