"""Reading the user's inputs: a model (catalog name, our YAML, or a Hugging Face config.json)
and a cluster (catalog name or cluster YAML), with errors that name the file and the field.
Files are read through ``costmodel.files.readers`` (bounded, UTF-8, no alias bombs, finite numbers)."""
from __future__ import annotations

from pathlib import Path

from costmodel.catalog import from_hf_config, get_model
from costmodel.limits import describe
from costmodel.specs import ClusterSpec, ModelSpec, SpecError
from costmodel.files.clusters import load_cluster
from costmodel.files.readers import parse_json, parse_yaml, read_text


def load_model(name_or_path: str) -> ModelSpec:
    p = Path(name_or_path)
    looks_like_file = p.suffix in (".json", ".yaml", ".yml") or "/" in name_or_path
    if not looks_like_file:
        return get_model(name_or_path)
    if p.is_dir() and (p / "config.json").exists():
        p = p / "config.json"
    if not p.exists():
        raise SpecError(f"model file {p} does not exist")
    text = read_text(p, "model file")
    if p.suffix == ".json":
        cfg = parse_json(text, str(p))
        if not isinstance(cfg, dict):
            raise SpecError(f"{p}: expected a JSON object")
        if "model_type" in cfg:
            return from_hf_config(cfg, name=p.parent.name if p.name == "config.json" else p.stem, where=str(p))
        return ModelSpec.from_dict(cfg, str(p))
    d = parse_yaml(text, str(p))
    if not isinstance(d, dict):
        raise SpecError(f"{p}: expected a mapping of model fields")
    if "model_type" in d:
        return from_hf_config(d, name=p.stem, where=str(p))
    if "extends" in d:
        parent = d.pop("extends")
        if not isinstance(parent, str):
            raise SpecError(f"{p}: extends must name a catalog model, got {describe(parent)}")
        base = get_model(parent).to_dict()
        base.update(d)
        d = base
    d.setdefault("name", p.stem)
    return ModelSpec.from_dict(d, str(p))


def load_cluster_sized(name_or_path: str, gpus: int | None) -> ClusterSpec:
    c = load_cluster(name_or_path)
    return c if gpus is None else c.with_gpus(gpus)
