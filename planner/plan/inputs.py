"""Reading the user's inputs: a model (catalog name, our YAML, or a Hugging Face config.json)
and a cluster (catalog name or cluster YAML), with errors that name the file and the field.
Files are read through ``profiles.readers`` (bounded, UTF-8, no alias bombs, finite numbers)."""
from __future__ import annotations

from pathlib import Path

from costmodel.catalog import from_hf_config, get_model
from costmodel.limits import describe
from costmodel.specs import ClusterSpec, ModelSpec, SpecError
from profiles.clusters import load_cluster
from profiles.readers import parse_json, parse_yaml, read_text


def load_model(name_or_path: str) -> ModelSpec:
    p = Path(name_or_path)
    looks_like_file = p.suffix in (".json", ".yaml", ".yml") or "/" in name_or_path
    if not looks_like_file:
        return get_model(name_or_path)
    if p.is_dir() and (p / "config.json").exists():
        p = p / "config.json"
    if not p.exists():
        raise SpecError(_missing_model(name_or_path, p))
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


def _missing_model(given: str, p: Path) -> str:
    """The message for a ``--model`` that names no file: a Hugging Face id (org/name) gets told
    that the planner reads no hub, and the catalog model of that architecture where there is one
    (the id's name without -Instruct/-hf/Meta-), else the catalog's names and how to fetch a
    config.json."""
    import re

    from costmodel.catalog import HF_IDS, model_names
    if p.suffix not in (".json", ".yaml", ".yml") and re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", given):
        def norm(x: str) -> str:
            x = x.lower().split("/")[-1]
            for suffix in ("-instruct", "-hf", "-base", "-chat"):
                x = x.removesuffix(suffix)
            return x.removeprefix("meta-")
        same = [name for name in model_names() if norm(given) in (name, norm(HF_IDS.get(name, "")))]
        head = f"--model {given}: a Hugging Face id, and no file of that name; the planner reads no hub"
        if same:
            return f"{head}: the catalog has it as {same[0]}: give --model {same[0]}"
        return (f"{head}: give a catalog name ({', '.join(model_names())}) or the path of the model's config.json "
                f"(e.g. `huggingface-cli download {given} config.json --local-dir m`, then --model m/config.json)")
    return f"model file {p} does not exist (--model takes a catalog name, a model .yaml or a config.json path)"


def load_cluster_sized(name_or_path: str, gpus: int | None) -> ClusterSpec:
    c = load_cluster(name_or_path)
    return c if gpus is None else c.with_gpus(gpus)
