"""Cluster files: the datasheet catalog, ``extends:`` overrides, heterogeneous groups, and the
human-unit dict form used by cluster files, profiles and plan files.

A cluster file (YAML, human units)::

    extends: dgx-a100-80gb          # optional: start from a catalog entry (or another file)
    nodes: 4                        # hosts; gpus_per_node GPUs each
    # nvlink_domain: 72             # GPUs one GPU reaches over intra_node (default gpus_per_node)
    inter_node: {gb_per_s: 6.25}    # override any key; nested dicts merge

or, for a heterogeneous cluster, node groups::

    name: mixed
    groups:
      - {name: h100, extends: dgx-h100, nodes: 4}
      - {name: a100, extends: dgx-a100-80gb, nodes: 8}
    inter_node: {name: ib, gb_per_s: 25}

Two optional keys describe what failures cost (``costmodel.reliability``; the planner reports
goodput with them)::

    storage: {gb_per_s: 1.0, total_gb_per_s: 2000}   # checkpoint writes: per node, and the storage's cap
    reliability: {node_mtbf_hours: 6335}            # mean time between failures of one node

Without ``storage`` a checkpoint is written at 1 GB/s per node, uncapped: Meta's Tectonic
sustains 2 TB/s for the 2,048 nodes of the Llama 3 405B job (The Llama 3 Herd of Models, 2024,
section 3.3.1). Without ``reliability`` (or ``--mtbf-hours``) no goodput is reported.

Units are converted here, once: ``memory_gib`` -> bytes, ``tflops`` -> FLOP/s, ``gb_per_s`` ->
bytes/s, ``latency_us`` -> s.
"""
from __future__ import annotations

import copy
import difflib
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

import yaml

from costmodel.catalog import name_key
from costmodel.limits import describe
from costmodel.specs import ATTENTION_TABLE_KERNELS, OVERLAP_SLOWDOWN, ClusterSpec, GpuSpec, LinkSpec, NodeGroup, SpecError
from costmodel.units import GB, GIB, TERA, US

from .readers import load_yaml

CATALOG_FILE = Path(__file__).with_name("catalog") / "clusters.yaml"

_GPU_KEYS = {"name", "memory_gib", "tflops", "hbm_gb_per_s", "matmul_efficiency", "matmul_half_size",
             "reserved_gib", "price_per_hour", "layer_overhead_us", "fsdp2_block_us", "dtensor_param_step_us",
             "dtensor_tp_layer_us", "serving_matmul_efficiency", "attention_table", "tdp_w", "power_limit_w",
             "clock_factor", "host_link_gb_per_s", "host_memory_gib"}
_LINK_KEYS = {"name", "gb_per_s", "latency_us", "efficiency", "mesh_peers"}
_GROUP_KEYS = {"name", "extends", "description", "gpu", "gpus_per_node", "nvlink_domain", "nodes", "intra_node",
               "inter_node", "measured", "source", "provenance"}
_TOP_KEYS = _GROUP_KEYS | {"groups", "storage", "reliability"}
_STORAGE_KEYS = {"name", "gb_per_s", "total_gb_per_s"}
_RELIABILITY_KEYS = {"node_mtbf_hours"}


@lru_cache(maxsize=1)
def _catalog() -> dict[str, dict]:
    with open(CATALOG_FILE) as f:
        return yaml.safe_load(f)


def cluster_names() -> list[str]:
    return sorted(_catalog())


def _merge(base: dict, over: Mapping) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _resolve(entry: Mapping, where: str, base_dir: Path | None, depth: int = 0) -> dict:
    """Follow ``extends:`` chains (catalog names or file paths) and merge the overrides."""
    if depth > 8:
        raise SpecError(f"{where}: 'extends' chain is deeper than 8 (a cycle?)")
    if not isinstance(entry, Mapping):
        raise SpecError(f"{where}: expected a mapping of cluster fields, got {describe(entry)}")
    entry = dict(entry)
    parent = entry.pop("extends", None)
    if parent is None:
        return entry
    if not isinstance(parent, str) or not parent:
        raise SpecError(f"{where}: extends must name a catalog cluster or a cluster file, got {describe(parent)}; "
                        f"catalog: {', '.join(cluster_names())}")
    cat = _catalog()
    if parent in cat:
        base = _resolve(cat[parent], f"catalog entry {parent!r}", None, depth + 1)
        base.setdefault("name", parent)
    else:
        p = Path(parent)
        if base_dir is not None and not p.is_absolute():
            p = base_dir / p
        if not p.exists():
            hint = difflib.get_close_matches(str(parent), cluster_names(), n=3, cutoff=0.3)
            raise SpecError(f"{where}: extends {parent!r} is neither a catalog cluster nor a file"
                            + (f"; did you mean {', '.join(hint)}?" if hint else
                               f"; catalog: {', '.join(cluster_names())}"))
        base = _resolve(_read_yaml(p), str(p), p.parent, depth + 1)
    return _merge(base, entry)


def _read_yaml(path: Path) -> dict:
    data = load_yaml(path, "cluster file")   # bounded, UTF-8, no alias bomb, finite numbers
    if not isinstance(data, dict):
        raise SpecError(f"cluster file {path}: expected a mapping at the top, got {type(data).__name__}")
    return data


def _unknown(d: Mapping, known: set, where: str) -> None:
    import difflib
    bad = sorted(set(d) - known)
    if bad:
        near = {b: difflib.get_close_matches(str(b), sorted(known), n=1, cutoff=0.6) for b in bad}
        mean = [f"{b} -> {m[0]}" for b, m in near.items() if m]
        raise SpecError(f"{where}: unknown key(s) {', '.join(map(str, bad))}"
                        + (f"; did you mean {', '.join(mean)}?" if mean else "")
                        + f" (known: {', '.join(sorted(known))})")


def _num(d: Mapping, key: str, where: str, default: Any = None, above: float | None = None,
         at_least: float | None = None, at_most: float | None = None) -> float:
    """A finite number, in the file's own unit (named in ``key``), optionally > ``above``,
    >= ``at_least``, <= ``at_most``."""
    v = _finite(d, key, where, default)
    if above is not None and not v > above:
        raise SpecError(f"{where}: {key!r} must be > {above:g}, got {v:g}")
    if at_least is not None and v < at_least:
        raise SpecError(f"{where}: {key!r} must be >= {at_least:g}, got {v:g}")
    if at_most is not None and v > at_most:
        raise SpecError(f"{where}: {key!r} must be at most {at_most:g}, got {v:g}")
    return v


def _finite(d: Mapping, key: str, where: str, default: Any = None) -> float:
    v = d.get(key, default)
    if v is None:
        raise SpecError(f"{where}: missing {key!r}")
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise SpecError(f"{where}: {key!r} must be a number, got {describe(v)}")
    if v != v or v in (float("inf"), float("-inf")):
        raise SpecError(f"{where}: {key!r} must be a finite number, got {v}")
    return float(v)


def _int(d: Mapping, key: str, where: str, default: Any = None) -> int:
    """A count: an integer (a float only if whole: 8.0 is 8; 2.5 is refused, never truncated)."""
    v = _num(d, key, where, default, at_least=1)
    if not v.is_integer():
        raise SpecError(f"{where}: {key!r} must be a whole number, got {d.get(key, default)!r}")
    return int(v)


def _str(d: Mapping, key: str, where: str, default: str) -> str:
    """A name: a string (a number is taken as its text: ``name: 4090``)."""
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (str, int, float)):
        raise SpecError(f"{where}: {key!r} must be a string, got {describe(v)}")
    return str(v)


def gpu_from_dict(d: Mapping, where: str) -> GpuSpec:
    if not isinstance(d, Mapping):
        raise SpecError(f"{where}: expected a mapping of GPU fields, got {describe(d)}")
    _unknown(d, _GPU_KEYS, where)
    tf = d.get("tflops")
    if not isinstance(tf, Mapping) or not tf:
        raise SpecError(f"{where}: 'tflops' must map dtypes to dense TFLOP/s, e.g. {{bf16: 989}}")
    return GpuSpec(
        name=_str(d, "name", where, "unknown"),
        memory_bytes=_num(d, "memory_gib", where, above=0) * GIB,
        peak_flops_per_s={str(k): _num(tf, k, f"{where}.tflops", above=0) * TERA for k in tf},
        hbm_bandwidth_bytes_per_s=_num(d, "hbm_gb_per_s", where, above=0) * GB,
        matmul_efficiency=_num(d, "matmul_efficiency", where, 0.7, above=0, at_most=1),
        matmul_half_size=_num(d, "matmul_half_size", where, 160.0, at_least=0),
        reserved_bytes=_num(d, "reserved_gib", where, 1.0, at_least=0) * GIB,
        price_per_hour=_num(d, "price_per_hour", where, 0.0, at_least=0),
        layer_overhead_s=_num(d, "layer_overhead_us", where, 0.0, at_least=0) * US,
        fsdp2_block_s=_num(d, "fsdp2_block_us", where, 0.0, at_least=0) * US,
        dtensor_param_step_s=_num(d, "dtensor_param_step_us", where, 0.0, at_least=0) * US,
        dtensor_tp_layer_s=_num(d, "dtensor_tp_layer_us", where, 0.0, at_least=0) * US,
        serving_matmul_efficiency=_num(d, "serving_matmul_efficiency", where, 0.0, at_least=0, at_most=1),
        attention_table=_attention_table(d, where),
        tdp_w=_num(d, "tdp_w", where, 0.0, at_least=0),
        power_limit_w=_num(d, "power_limit_w", where, 0.0, at_least=0),
        clock_factor=_num(d, "clock_factor", where, 1.0, above=0, at_most=2),
        host_link_bytes_per_s=_num(d, "host_link_gb_per_s", where, 0.0, at_least=0) * GB,
        host_memory_bytes=_num(d, "host_memory_gib", where, 0.0, at_least=0) * GIB,
    )


_ATTENTION_ROW = "[kernel, direction, mask, head_dim, seq_len, efficiency]"


def _attention_table(d: Mapping, where: str) -> tuple:
    """``attention_table``: measured fused attention, rows ``[kernel, direction, mask, head_dim,
    seq_len, efficiency]`` (GpuSpec.attention_table); each field checked here with its row's
    place, the ranges again by GpuSpec."""
    rows = d.get("attention_table")
    if rows is None:
        return ()
    if not isinstance(rows, list):
        raise SpecError(f"{where}: 'attention_table' must be a list of rows {_ATTENTION_ROW}, got {describe(rows)}")
    out = []
    for i, row in enumerate(rows):
        rw = f"{where}.attention_table[{i}]"
        if not isinstance(row, list) or len(row) != 6:
            raise SpecError(f"{rw}: expected {_ATTENTION_ROW}, e.g. [fa2, fwd, causal, 128, 4096, 0.33], "
                            f"got {describe(row)}")
        cells = dict(zip(("kernel", "direction", "mask", "head_dim", "seq_len", "efficiency"), row))
        kernel, direction, mask = (_str(cells, k, rw, "") for k in ("kernel", "direction", "mask"))
        for k, v, allowed in (("kernel", kernel, ATTENTION_TABLE_KERNELS), ("direction", direction, ("fwd", "bwd")),
                              ("mask", mask, ("causal", "none"))):
            if v not in allowed:
                raise SpecError(f"{rw}: {k} must be one of {', '.join(allowed)}, got {describe(v)}")
        out.append((kernel, direction, mask, _num(cells, "head_dim", rw, above=0, at_most=1024),
                    _num(cells, "seq_len", rw, above=0, at_most=1e8),
                    _num(cells, "efficiency", rw, above=0, at_most=1)))
    return tuple(sorted(out))


def link_from_dict(d: Mapping, where: str) -> LinkSpec:
    if not isinstance(d, Mapping):
        raise SpecError(f"{where}: expected a mapping of link fields (gb_per_s, latency_us, ...), got {describe(d)}")
    _unknown(d, _LINK_KEYS, where)
    return LinkSpec(name=_str(d, "name", where, "link"), bandwidth_bytes_per_s=_num(d, "gb_per_s", where, above=0) * GB,
                    latency_s=_num(d, "latency_us", where, 5.0, at_least=0) * US,
                    efficiency=_num(d, "efficiency", where, 0.8, above=0, at_most=1),
                    mesh_peers=_int(d, "mesh_peers", where) if d.get("mesh_peers", 0) != 0 else 0)


def _group_from_dict(d: Mapping, name: str, where: str) -> NodeGroup:
    _unknown(d, _GROUP_KEYS, where)
    for k in ("gpu", "gpus_per_node", "intra_node"):
        if k not in d:
            raise SpecError(f"{where}: missing {k!r} (or 'extends: <catalog name>')")
    gpn = _int(d, "gpus_per_node", where)
    domain = _int(d, "nvlink_domain", where) if d.get("nvlink_domain") is not None else gpn
    if domain % gpn:
        raise SpecError(f"{where}: 'nvlink_domain' {domain} must be a whole number of hosts of 'gpus_per_node' {gpn} "
                        f"(GB200 NVL72: nvlink_domain 72, gpus_per_node 4)")
    intra = link_from_dict(d["intra_node"], f"{where}.intra_node")
    if intra.mesh_peers >= domain:
        raise SpecError(f"{where}.intra_node: mesh_peers {intra.mesh_peers} needs at least {intra.mesh_peers + 1} GPUs "
                        f"linked together, but the NVLink domain has {domain} (gpus_per_node, nvlink_domain); an HGX "
                        "4-GPU board is mesh_peers 3")
    return NodeGroup(name=name, gpu=gpu_from_dict(d["gpu"], f"{where}.gpu"),
                     gpus_per_node=gpn, nodes=_int(d, "nodes", where, 1), intra_node=intra, nvlink_domain=domain)


_COLLECTIVE_KEYS = {"tier", "op", "group_size", "bytes", "busbw_gb_per_s"}


def _rows(m: Mapping, key: str, where: str) -> list:
    rows = m.get(key)
    if not isinstance(rows, list):
        raise SpecError(f"{where}.measured: {key!r} must be a list of rows, got {describe(rows)}")
    return rows


def _measured(d: Mapping, where: str) -> dict:
    m = d.get("measured") or {}
    if not isinstance(m, Mapping):
        raise SpecError(f"{where}: 'measured' must be a mapping (matmul, collectives, compute_comm_slowdown), "
                        f"got {describe(m)}")
    _unknown(m, {"matmul", "collectives", "compute_comm_slowdown"}, f"{where}.measured")
    out: dict[str, Any] = {}
    if "matmul" in m:
        table = []
        for i, row in enumerate(_rows(m, "matmul", where)):
            if not isinstance(row, list) or len(row) != 2:
                raise SpecError(f"{where}.measured.matmul[{i}]: expected [size, efficiency], got {describe(row)}")
            rw = f"{where}.measured.matmul[{i}]"
            table.append((_num({"size": row[0]}, "size", rw), _num({"efficiency": row[1]}, "efficiency", rw)))
        out["matmul_table"] = tuple(sorted(table))
    if "collectives" in m:
        rows = []
        for i, r in enumerate(_rows(m, "collectives", where)):
            rw = f"{where}.measured.collectives[{i}]"
            if not isinstance(r, Mapping):
                raise SpecError(f"{rw}: expected a mapping with {', '.join(sorted(_COLLECTIVE_KEYS))}")
            _unknown(r, _COLLECTIVE_KEYS, rw)
            missing = sorted(_COLLECTIVE_KEYS - set(r))
            if missing:
                raise SpecError(f"{rw}: missing {', '.join(missing)}")
            rows.append((_str(r, "tier", rw, ""), _str(r, "op", rw, ""), _int(r, "group_size", rw),
                         _num(r, "bytes", rw), _num(r, "busbw_gb_per_s", rw) * GB))
        out["collective_table"] = tuple(sorted(rows))
    if "compute_comm_slowdown" in m:
        out["compute_comm_slowdown"] = _num(m, "compute_comm_slowdown", f"{where}.measured")
    return out


def cluster_from_dict(data: Mapping, where: str = "cluster", base_dir: Path | None = None) -> ClusterSpec:
    """A ``ClusterSpec`` from the human-unit dict form (catalog entry, file, or plan section)."""
    if not isinstance(data, Mapping):
        raise SpecError(f"{where}: expected a mapping")
    data = _resolve(data, where, base_dir)
    _unknown(data, _TOP_KEYS, where)
    name = _str(data, "name", where, "cluster")
    if "groups" in data:
        if not isinstance(data["groups"], list) or not data["groups"]:
            raise SpecError(f"{where}: 'groups' must list at least one node group, e.g. "
                            f"[{{name: h100, extends: dgx-h100, nodes: 4}}], got {describe(data['groups'])}")
        groups = []
        for i, g in enumerate(data["groups"]):
            gw = f"{where}.groups[{i}]"
            g = _resolve(g, gw, base_dir)
            gname = _str(g, "name", gw, f"group{i}")
            groups.append(_group_from_dict({k: v for k, v in g.items() if k not in ("name", "inter_node",
                                            "description", "measured", "source", "provenance", "storage",
                                            "reliability")}, gname, gw))
        inter = data.get("inter_node")
        if inter is None:
            inter = _resolve(data["groups"][0], where, base_dir).get("inter_node")
        if inter is None:
            raise SpecError(f"{where}: missing 'inter_node' for a grouped cluster")
    else:
        groups = [_group_from_dict({k: v for k, v in data.items() if k not in ("name", "inter_node", "description",
                                    "measured", "source", "provenance", "storage", "reliability")}, "main", where)]
        inter = data.get("inter_node")
        if inter is None:
            raise SpecError(f"{where}: missing 'inter_node'")
    if isinstance(inter, Mapping) and inter.get("mesh_peers", 0) not in (0, None):
        raise SpecError(f"{where}.inter_node: mesh_peers={inter['mesh_peers']!r} describes how a node's GPUs are "
                        "linked to each other; the network between nodes has none (move it to intra_node)")
    return ClusterSpec(name=name, groups=tuple(groups), inter_node=link_from_dict(inter, f"{where}.inter_node"),
                       source=_str(data, "source", where, "datasheet"), **_measured(data, where),
                       **_storage_and_reliability(data, where))


def _storage_and_reliability(d: Mapping, where: str) -> dict:
    """``storage: {gb_per_s: per node, total_gb_per_s: the storage's cap}`` (checkpoint writes;
    default: costmodel.reliability.DEFAULT_STORAGE_BYTES_PER_S_PER_NODE, Meta's Tectonic 2 TB/s
    over 2,048 nodes) and ``reliability: {node_mtbf_hours: ...}`` (failures per node)."""
    out: dict[str, Any] = {}
    st = d.get("storage")
    if st is not None:
        if not isinstance(st, Mapping):
            raise SpecError(f"{where}.storage: expected a mapping like {{gb_per_s: 1.0}}, got {st!r}")
        _unknown(st, _STORAGE_KEYS, f"{where}.storage")
        for key, field in (("gb_per_s", "storage_bytes_per_s_per_node"), ("total_gb_per_s", "storage_total_bytes_per_s")):
            if key in st:
                v = _num(st, key, f"{where}.storage")
                if v <= 0:
                    raise SpecError(f"{where}.storage: {key!r} must be > 0 (GB/s), got {v:g}")
                out[field] = v * GB
    rel = d.get("reliability")
    if rel is not None:
        if not isinstance(rel, Mapping):
            raise SpecError(f"{where}.reliability: expected a mapping like {{node_mtbf_hours: 6335}}, got {rel!r}")
        _unknown(rel, _RELIABILITY_KEYS, f"{where}.reliability")
        if "node_mtbf_hours" in rel:
            v = _num(rel, "node_mtbf_hours", f"{where}.reliability")
            if v <= 0:
                raise SpecError(f"{where}.reliability: 'node_mtbf_hours' must be > 0, got {v:g}")
            out["node_mtbf_s"] = v * 3600.0
    return out


def catalog_key(name_or_path: str) -> str | None:
    """The catalog cluster ``load_cluster`` reads for an argument: its exact name, or, where the argument names
    no file, a catalog name however it is typed ("DGX-H100", "dgx_h100": ``costmodel.catalog.name_key``); None
    for a file or an unknown name (a bare GPU name names no network). Also what a plan's provenance records
    (``planner.cli.args.cluster_source_of``)."""
    cat = _catalog()
    if name_or_path in cat:
        return name_or_path
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml", ".json") or p.exists():
        return None
    key = name_key(name_or_path)
    return key if key in cat else None


def load_cluster(name_or_path: str) -> ClusterSpec:
    """A catalog name (``catalog_key``) or a cluster YAML file (which may ``extends:`` a catalog entry)."""
    key = catalog_key(name_or_path)
    if key is not None:
        d = dict(_catalog()[key])
        d.setdefault("name", key)
        return cluster_from_dict(d, f"catalog cluster {key!r}")
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml", ".json") or p.exists():
        if not p.exists():
            raise SpecError(f"cluster file {p} does not exist")
        d = _read_yaml(p)
        d.setdefault("name", p.stem)
        return cluster_from_dict(d, str(p), p.parent)
    hint = difflib.get_close_matches(name_or_path, cluster_names(), n=3, cutoff=0.3)
    raise SpecError(f"unknown cluster {name_or_path!r}" + (f"; did you mean {', '.join(hint)}?" if hint else "")
                    + f" (catalog: {', '.join(cluster_names())}; or give a cluster .yaml path)")


# --------------------------------------------------------------------------------------
# back to human units (for plan files and profile output)
# --------------------------------------------------------------------------------------

def _r(x: float, nd: int = 6) -> float:
    return float(f"{x:.{nd}g}")


def gpu_to_dict(g: GpuSpec) -> dict:
    return {"name": g.name, "memory_gib": _r(g.memory_bytes / GIB),
            "tflops": {k: _r(v / TERA) for k, v in g.peak_flops_per_s.items()},
            "hbm_gb_per_s": _r(g.hbm_bandwidth_bytes_per_s / GB), "matmul_efficiency": g.matmul_efficiency,
            "matmul_half_size": g.matmul_half_size, "reserved_gib": _r(g.reserved_bytes / GIB),
            "price_per_hour": g.price_per_hour,
            **({"layer_overhead_us": _r(g.layer_overhead_s / US)} if g.layer_overhead_s else {}),
            **({"fsdp2_block_us": _r(g.fsdp2_block_s / US)} if g.fsdp2_block_s else {}),
            **({"dtensor_param_step_us": _r(g.dtensor_param_step_s / US)} if g.dtensor_param_step_s else {}),
            **({"dtensor_tp_layer_us": _r(g.dtensor_tp_layer_s / US)} if g.dtensor_tp_layer_s else {}),
            **({"serving_matmul_efficiency": g.serving_matmul_efficiency} if g.serving_matmul_efficiency else {}),
            **({"tdp_w": _r(g.tdp_w)} if g.tdp_w else {}),
            **({"power_limit_w": _r(g.power_limit_w)} if g.power_limit_w else {}),
            **({"clock_factor": g.clock_factor} if g.clock_factor != 1.0 else {}),
            **({"host_link_gb_per_s": _r(g.host_link_bytes_per_s / GB)} if g.host_link_bytes_per_s else {}),
            **({"host_memory_gib": _r(g.host_memory_bytes / GIB)} if g.host_memory_bytes else {}),
            **({"attention_table": [[k, d, m, _r(hd), _r(s), _r(e)] for k, d, m, hd, s, e in g.attention_table]}
               if g.attention_table else {})}


def link_to_dict(link: LinkSpec) -> dict:
    return {"name": link.name, "gb_per_s": _r(link.bandwidth_bytes_per_s / GB),
            "latency_us": _r(link.latency_s / US), "efficiency": link.efficiency,
            **({"mesh_peers": link.mesh_peers} if link.mesh_peers else {})}


def _domain(g: NodeGroup) -> dict:
    """``nvlink_domain``, written only where it differs from the host (older readers never see it)."""
    return {"nvlink_domain": g.nvlink_domain} if g.nvlink_domain else {}


def cluster_to_dict(c: ClusterSpec) -> dict:
    d: dict[str, Any] = {"name": c.name}
    if len(c.groups) == 1:
        g = c.groups[0]
        d.update(gpu=gpu_to_dict(g.gpu), gpus_per_node=g.gpus_per_node, nodes=g.nodes,
                 intra_node=link_to_dict(g.intra_node), **_domain(g))
    else:
        d["groups"] = [{"name": g.name, "gpu": gpu_to_dict(g.gpu), "gpus_per_node": g.gpus_per_node,
                        "nodes": g.nodes, "intra_node": link_to_dict(g.intra_node), **_domain(g)} for g in c.groups]
    d["inter_node"] = link_to_dict(c.inter_node)
    m: dict[str, Any] = {}
    if c.matmul_table:
        m["matmul"] = [[s, e] for s, e in c.matmul_table]
    if c.collective_table:
        m["collectives"] = [{"tier": t, "op": op, "group_size": n, "bytes": b, "busbw_gb_per_s": _r(bw / GB)}
                            for t, op, n, b, bw in c.collective_table]
    if c.compute_comm_slowdown != OVERLAP_SLOWDOWN:     # measured (the default is not written)
        m["compute_comm_slowdown"] = c.compute_comm_slowdown
    if m:
        d["measured"] = m
    if c.storage_bytes_per_s_per_node or c.storage_total_bytes_per_s:    # given (the default is not written)
        d["storage"] = {k: _r(v / GB) for k, v in (("gb_per_s", c.storage_bytes_per_s_per_node),
                                                   ("total_gb_per_s", c.storage_total_bytes_per_s)) if v}
    if c.node_mtbf_s:
        d["reliability"] = {"node_mtbf_hours": _r(c.node_mtbf_s / 3600.0)}
    d["source"] = c.source
    return d
