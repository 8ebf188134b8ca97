"""The hardware probe: what NVML says about this machine's GPUs, or the CPU facts without it.

Owns: ``probe()`` -> ``ProbeResult`` (per GPU: name, total and free memory, PCIe generation
and width, NVLink links and their peers, NUMA node and CPU affinity; the GPU-to-GPU topology
matrix as ``nvidia-smi topo -m`` prints it; driver and CUDA versions), the catalog entry whose
datasheet matches the GPU, and two NVML stand-ins:

* ``ReplayNVML``   -- a fake ``pynvml`` module answering from a JSON recording (tests, demos,
                      other people's machines): same return types and same error classes.
* ``RecordingNVML`` -- wraps the real ``pynvml`` and writes every answer it gave to JSON, so a
                      recording of a real machine is one ``planner profile --record-nvml F``.

No NVML (no library, no driver, no GPU) is the normal CPU case: ``ProbeResult.nvml`` is False
and ``note`` says why, in one line. Nothing here imports torch.

Recording format (``tests/data/nvml/*.json``)::

    {"source": "...", "calls": {"nvmlDeviceGetNvLinkState": {"*,0-17": 1,
                                                            "*,*": {"error": "NVML_ERROR_INVALID_ARGUMENT"}}}}

A key is the call's arguments joined by commas (a device handle is its index); a part may be
``*`` or a range ``lo-hi``; the exact key wins, then patterns in file order. A value is the
answer: a number, a string, a list, a dict (a C struct: attributes), or ``{"error": NAME}``,
raised as the matching ``pynvml.NVMLError_*`` class.
"""
from __future__ import annotations

import json
import os
import platform
import socket
import types
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable
from costmodel.units import GIB

# ``nvmlDeviceGetTopologyCommonAncestor`` levels, named as ``nvidia-smi topo -m`` names them.
TOPOLOGY_LEVELS = {0: "BOARD", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
TOPOLOGY_MEANING = {
    "NV#": "NVLink, # links", "BOARD": "same board (multi-GPU card)", "PIX": "one PCIe switch",
    "PXB": "several PCIe switches, no host bridge", "PHB": "same PCIe host bridge",
    "NODE": "same NUMA node (CPU socket), different host bridges", "SYS": "across CPU sockets (SMP link)",
}

# NVLink bandwidth per link per direction (GB/s), by CUDA compute capability major. From the
# NVLink generations' datasheets: V100 NVLink2 6 links 300 GB/s both ways; A100 NVLink3 12
# links 600 GB/s; H100/H200 NVLink4 18 links 900 GB/s; B200 NVLink5 18 links 1.8 TB/s.
# Keyed by architecture rather than by nvmlDeviceGetNvLinkVersion, whose integer changed
# meaning when nvmlNvlinkVersion_t arrived (4 was "NVLink 4" before, "3.0" after).
NVLINK_GB_PER_S_PER_LINK = {7: 25.0, 8: 25.0, 9: 25.0, 10: 50.0}

# cpuSetSize for nvmlDeviceGetCpuAffinity: 64-bit words, enough for 1024 CPUs on any machine
# (a fixed size keeps recordings replayable on machines with other CPU counts).
AFFINITY_WORDS = 16

# PCIe x1 bandwidth per direction (GB/s) by generation, after line coding.
PCIE_GB_PER_S_PER_LANE = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}

# Catalog cluster whose datasheet matches an NVML GPU name (first substring match wins).
GPU_CATALOG = (
    ("H200", "dgx-h200"), ("H100", "dgx-h100"), ("B200", "dgx-b200"),
    ("A100-SXM4-40GB", "dgx-a100-40gb"), ("A100 40GB", "dgx-a100-40gb"), ("A100", "dgx-a100-80gb"),
    ("L40S", "l40s-pcie"), ("MI300X", "mi300x"),
)


def catalog_for_gpu(name: str) -> str | None:
    """The catalog cluster for an NVML GPU name, or None: an unknown GPU stays unknown."""
    for key, cluster in GPU_CATALOG:
        if key.lower() in name.lower():
            return cluster
    return None


@dataclass
class GpuInfo:
    index: int
    name: str
    uuid: str = ""
    memory_total_bytes: int = 0
    memory_free_bytes: int = 0
    pci_bus_id: str = ""
    compute_capability: str = ""
    pcie_gen_max: int | None = None
    pcie_width_max: int | None = None
    pcie_gen_current: int | None = None
    pcie_width_current: int | None = None
    numa_node: int | None = None
    cpu_affinity: str = ""
    nvlink_version: int | None = None     # the integer NVML returned, as is
    nvlink_links: int = 0                 # active links
    nvlink_switch_links: int = 0          # of which go to an NVSwitch
    nvlink_peers: dict[int, int] = field(default_factory=dict)   # direct links: peer index -> count
    sm_clock_max_mhz: int | None = None
    power_limit_w: float | None = None

    @property
    def pcie_gb_per_s(self) -> float | None:
        if not self.pcie_gen_max or not self.pcie_width_max:
            return None
        return PCIE_GB_PER_S_PER_LANE.get(self.pcie_gen_max, 0.0) * self.pcie_width_max

    @property
    def nvlink_gb_per_s(self) -> float:
        major = int(self.compute_capability.split(".")[0]) if self.compute_capability else 0
        return self.nvlink_links * NVLINK_GB_PER_S_PER_LINK.get(major, 25.0)


def nvlink_mesh_peers(gpus: "list[GpuInfo]") -> int:
    """The peers of a direct NVLink mesh (``LinkSpec.mesh_peers``): N when every GPU's NVLinks go
    straight to all N >= 2 other GPUs of the host, the same number of links to each, and none to a
    switch (an HGX 4-GPU board: 6 links to each of 3 peers); 0 otherwise (NVSwitch boards, bridged
    pairs, PCIe cards, or a partial mesh such as a hybrid cube, where some pairs have no NVLink and
    one figure per GPU cannot say which)."""
    n = len(gpus) - 1
    if n < 2 or any(g.nvlink_switch_links or set(g.nvlink_peers) != set(range(n + 1)) - {i}
                    for i, g in enumerate(gpus)):
        return 0
    return n if len({k for g in gpus for k in g.nvlink_peers.values()}) == 1 else 0


@dataclass
class ProbeResult:
    nvml: bool
    note: str
    host: str
    gpus: list[GpuInfo] = field(default_factory=list)
    driver_version: str = ""
    cuda_driver_version: str = ""
    topology: list[list[str]] = field(default_factory=list)   # "X", "NV18", "PIX", ..., "SYS"
    nvlink_matrix: list[list[int]] = field(default_factory=list)
    cpu_model: str = ""
    cpu_count: int = 0
    host_memory_bytes: int = 0
    catalog: str | None = None

    @property
    def gpu_name(self) -> str:
        names = sorted({g.name for g in self.gpus})
        return " + ".join(names) if names else "cpu-process"

    def to_dict(self) -> dict:
        d = asdict(self)
        for g, gd in zip(self.gpus, d["gpus"]):
            gd["nvlink_peers"] = {str(k): v for k, v in g.nvlink_peers.items()}
            gd["pcie_gb_per_s"] = g.pcie_gb_per_s
            gd["nvlink_gb_per_s"] = g.nvlink_gb_per_s
        return d

    def summary(self) -> str:
        if not self.gpus:
            return f"{self.host}: no GPU ({self.note}); {self.cpu_count} CPUs, {self.cpu_model or 'unknown CPU'}"
        g = self.gpus[0]
        link = (f"NVLink {g.nvlink_links} links ({g.nvlink_gb_per_s:.0f} GB/s)" if g.nvlink_links
                else f"PCIe gen{g.pcie_gen_max} x{g.pcie_width_max}")
        return (f"{self.host}: {len(self.gpus)}x {self.gpu_name}, {g.memory_total_bytes / GIB:.1f} GiB, "
                f"{link}; driver {self.driver_version}, CUDA {self.cuda_driver_version}")


# --------------------------------------------------------------------------------------
# NVML access
# --------------------------------------------------------------------------------------

def _text(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def _bus_key(bus_id: Any) -> tuple[int, int, int, int] | str:
    """'00000000:18:00.0' and '0000:18:00.0' compare equal."""
    s = _text(bus_id).strip().lower()
    try:
        dom, bus, rest = s.split(":")
        dev, fn = rest.split(".")
        return int(dom, 16), int(bus, 16), int(dev, 16), int(fn, 16)
    except ValueError:
        return s


def _cpu_list(words: Any) -> str:
    """A CPU affinity bitmask (list of 64-bit words, as nvmlDeviceGetCpuAffinity) -> '0-55,112-167'."""
    cpus = [w * 64 + b for w, word in enumerate(list(words)) for b in range(64) if int(word) >> b & 1]
    runs: list[str] = []
    start = prev = None
    for c in cpus + [None]:
        if start is not None and c == prev + 1:
            prev = c
            continue
        if start is not None:
            runs.append(f"{start}" if start == prev else f"{start}-{prev}")
        start = prev = c
    return ",".join(runs)


def load_nvml(module: Any | None = None) -> tuple[Any | None, str]:
    """``module`` (default: the real ``pynvml``) initialized, or None and a one-line reason."""
    if module is None:
        try:
            import pynvml as module
        except ImportError:
            return None, "pynvml is not installed (pip install nvidia-ml-py); profiling the CPU path"
    try:
        module.nvmlInit()
    except module.NVMLError as e:
        return None, f"NVML unavailable ({e}); no NVIDIA GPU or driver here, profiling the CPU path"
    return module, ""


def _cpu_facts() -> tuple[str, int, int]:
    model = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
                break
    except OSError:
        pass
    return model, os.cpu_count() or 1, mem


def probe(nvml: Any | None = None, host: str | None = None) -> ProbeResult:
    """Probe this machine. ``nvml``: a ``pynvml``-like module (a ``ReplayNVML`` in tests; None:
    the real one). Without NVML the result holds the CPU facts and a note saying why."""
    host = host or socket.gethostname()
    model, ncpu, mem = _cpu_facts()
    nvml, note = load_nvml(nvml)
    res = ProbeResult(nvml=nvml is not None, note=note, host=host, cpu_model=model, cpu_count=ncpu,
                      host_memory_bytes=mem)
    if nvml is None:
        res.catalog = "cpu"
        return res
    try:
        _probe_nvml(nvml, res)
    except nvml.NVMLError as e:       # a lost GPU, a driver/library mismatch: say so, keep going
        res.note = f"NVML failed while probing ({e}); GPU facts may be incomplete"
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass
    if not res.gpus:
        res.note = res.note or "NVML found no GPU; profiling the CPU path"
        res.catalog = "cpu"
    else:
        res.catalog = catalog_for_gpu(res.gpus[0].name)
        if res.catalog is None:
            res.note = (f"GPU {res.gpus[0].name!r} is not in the datasheet catalog: its peak FLOP/s is "
                        "unknown and the measured best is used instead")
    return res


def _optional(nvml: Any, fn: str, *args: Any) -> Any:
    """An answer, or None where this GPU or driver does not have it (NotSupported, NotFound,
    FunctionNotFound, NoPermission, InvalidArgument)."""
    try:
        return getattr(nvml, fn)(*args)
    except nvml.NVMLError:
        return None
    except AttributeError:   # an older pynvml without this function
        return None


def _probe_nvml(nvml: Any, res: ProbeResult) -> None:
    res.driver_version = _text(_optional(nvml, "nvmlSystemGetDriverVersion") or "")
    cuda = _optional(nvml, "nvmlSystemGetCudaDriverVersion")
    res.cuda_driver_version = f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else ""
    n = nvml.nvmlDeviceGetCount()
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
    bus_to_index: dict[Any, int] = {}
    for i, h in enumerate(handles):
        g = GpuInfo(index=i, name=_text(nvml.nvmlDeviceGetName(h)))
        g.uuid = _text(_optional(nvml, "nvmlDeviceGetUUID", h) or "")
        mem = nvml.nvmlDeviceGetMemoryInfo(h)
        g.memory_total_bytes, g.memory_free_bytes = int(mem.total), int(mem.free)
        pci = _optional(nvml, "nvmlDeviceGetPciInfo", h)
        if pci is not None:
            g.pci_bus_id = _text(pci.busId)
            bus_to_index[_bus_key(pci.busId)] = i
        cc = _optional(nvml, "nvmlDeviceGetCudaComputeCapability", h)
        g.compute_capability = f"{cc[0]}.{cc[1]}" if cc else ""
        g.pcie_gen_max = _optional(nvml, "nvmlDeviceGetMaxPcieLinkGeneration", h)
        g.pcie_width_max = _optional(nvml, "nvmlDeviceGetMaxPcieLinkWidth", h)
        g.pcie_gen_current = _optional(nvml, "nvmlDeviceGetCurrPcieLinkGeneration", h)
        g.pcie_width_current = _optional(nvml, "nvmlDeviceGetCurrPcieLinkWidth", h)
        g.numa_node = _optional(nvml, "nvmlDeviceGetNumaNodeId", h)
        aff = _optional(nvml, "nvmlDeviceGetCpuAffinity", h, AFFINITY_WORDS)
        g.cpu_affinity = _cpu_list(aff) if aff is not None else ""
        g.sm_clock_max_mhz = _optional(nvml, "nvmlDeviceGetMaxClockInfo", h, nvml.NVML_CLOCK_SM)
        pw = _optional(nvml, "nvmlDeviceGetPowerManagementLimit", h)
        g.power_limit_w = pw / 1000 if pw else None
        res.gpus.append(g)
    # NVLink: links, where each goes (another GPU directly, or an NVSwitch)
    remote_bus: dict[int, list[Any]] = {i: [] for i in range(n)}
    for i, h in enumerate(handles):
        g = res.gpus[i]
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            try:
                state = nvml.nvmlDeviceGetNvLinkState(h, link)
            except nvml.NVMLError_NotSupported:
                break                        # no NVLink on this GPU (PCIe card)
            except nvml.NVMLError_InvalidArgument:
                continue                     # this link index does not exist on this GPU
            if state != nvml.NVML_FEATURE_ENABLED:
                continue
            g.nvlink_links += 1
            if g.nvlink_version is None:
                g.nvlink_version = _optional(nvml, "nvmlDeviceGetNvLinkVersion", h, link)
            kind = _optional(nvml, "nvmlDeviceGetNvLinkRemoteDeviceType", h, link)
            if kind == nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
                g.nvlink_switch_links += 1
                continue
            rp = _optional(nvml, "nvmlDeviceGetNvLinkRemotePciInfo", h, link)
            if rp is not None:
                remote_bus[i].append(_bus_key(rp.busId))
    for i, buses in remote_bus.items():
        for b in buses:
            j = bus_to_index.get(b)
            if j is not None and j != i:
                res.gpus[i].nvlink_peers[j] = res.gpus[i].nvlink_peers.get(j, 0) + 1
            elif j is None:           # a link to something that is not one of our GPUs: a switch
                res.gpus[i].nvlink_switch_links += 1
    # pairwise: NVLink count (direct, or both ends on NVSwitches and P2P over NVLink OK) and PCIe level
    res.nvlink_matrix = [[0] * n for _ in range(n)]
    res.topology = [["X"] * n for _ in range(n)]
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            gi, gj = res.gpus[i], res.gpus[j]
            links = gi.nvlink_peers.get(j, 0)
            if not links and gi.nvlink_switch_links and gj.nvlink_switch_links:
                p2p = _optional(nvml, "nvmlDeviceGetP2PStatus", handles[i], handles[j],
                                nvml.NVML_P2P_CAPS_INDEX_NVLINK)
                if p2p is None or p2p == nvml.NVML_P2P_STATUS_OK:
                    links = min(gi.nvlink_switch_links, gj.nvlink_switch_links)
            res.nvlink_matrix[i][j] = links
            if links:
                res.topology[i][j] = f"NV{links}"
            else:
                lvl = _optional(nvml, "nvmlDeviceGetTopologyCommonAncestor", handles[i], handles[j])
                res.topology[i][j] = TOPOLOGY_LEVELS.get(lvl, "?") if lvl is not None else "?"


# --------------------------------------------------------------------------------------
# Replay and recording
# --------------------------------------------------------------------------------------

class _Handle:
    """A device handle of the replay: knows its index (real handles are opaque pointers)."""

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"<replay nvmlDevice {self.index}>"


_CHAR_FIELDS = {"busId", "busIdLegacy"}   # char arrays in the C structs: bytes in pynvml


def _matches(pattern: str, key: str) -> bool:
    pp, kk = pattern.split(","), key.split(",")
    if len(pp) != len(kk):
        return False
    for p, k in zip(pp, kk):
        if p == "*" or p == k:
            continue
        if "-" in p.strip("-"):
            lo, hi = p.split("-", 1)
            try:
                if int(lo) <= int(k) <= int(hi):
                    continue
            except ValueError:
                pass
        return False
    return True


def _error_classes() -> types.SimpleNamespace:
    """The real pynvml error classes and constants when installed (same shapes as the real API)."""
    import pynvml
    ns = types.SimpleNamespace()
    for k in dir(pynvml):
        if k.startswith(("NVML_", "NVMLError", "nvmlMemory_v")):
            setattr(ns, k, getattr(pynvml, k))
    return ns


MAX_REPLAY_GPUS = 256     # GPUs one host's NVML reports (today's largest hosts: 16)


def check_recording(data: Any, where: str) -> None:
    """The shape of a recording (see the module docstring), before the probe asks it anything;
    SpecError naming the first bad part. A call the probe asks that is missing or mistyped is
    caught where the probe runs (``profiles.profile``)."""
    from costmodel.limits import describe
    from costmodel.specs import SpecError
    if not isinstance(data, dict) or not isinstance(data.get("calls", {}), dict):
        raise SpecError(f"{where}: expected {{\"source\": ..., \"calls\": {{function: {{args: answer}}}}}}")
    unknown = sorted(set(data) - {"source", "calls"})
    if unknown:
        raise SpecError(f"{where}: unknown key(s) {', '.join(unknown)}; known: calls, source")
    if not isinstance(data.get("source", ""), str):
        raise SpecError(f"{where}: source must be a string, got {describe(data['source'])}")
    errors = set(vars(_error_classes()))
    for fn, table in data.get("calls", {}).items():
        if not fn.startswith("nvml") or not isinstance(table, dict):
            raise SpecError(f"{where}: calls.{fn}: expected an nvml* function mapping argument keys to answers")
        for key, ans in table.items():
            if isinstance(ans, dict) and "error" in ans and not (
                    (isinstance(ans["error"], str) and ans["error"] in errors)
                    or (isinstance(ans["error"], int) and not isinstance(ans["error"], bool))):
                raise SpecError(f"{where}: calls.{fn}[{key!r}]: error {describe(ans['error'])} is not an NVML "
                                "error name (NVML_ERROR_...) or code")
            if fn == "nvmlDeviceGetCount" and not isinstance(ans, dict) and (
                    isinstance(ans, bool) or not isinstance(ans, int) or not 0 <= ans <= MAX_REPLAY_GPUS):
                raise SpecError(f"{where}: calls.nvmlDeviceGetCount: the GPU count must be an integer in "
                                f"0..{MAX_REPLAY_GPUS}, got {describe(ans)}")


# what a replayed probe may find per GPU: (field, kind, lo, hi); None allowed where the field is optional
_GPU_FIELDS = (("memory_total_bytes", int, 0, 1 << 50), ("memory_free_bytes", int, 0, 1 << 50),
               ("pcie_gen_max", int, 1, 16), ("pcie_width_max", int, 1, 64), ("pcie_gen_current", int, 1, 16),
               ("pcie_width_current", int, 1, 64), ("numa_node", int, -1, 1 << 16), ("nvlink_version", int, 0, 1 << 16),
               ("sm_clock_max_mhz", int, 0, 1 << 20), ("power_limit_w", float, 0, 1e6))


def check_probe_result(pr: "ProbeResult", where: str) -> None:
    """What a replayed recording answered, held to NVML's own types and ranges (a recording is a
    file someone may have edited); SpecError naming the GPU and the field."""
    import math
    import re

    from costmodel.limits import describe
    from costmodel.specs import SpecError
    for g in pr.gpus:
        gw = f"{where}: GPU {g.index}"
        if not g.name or len(g.name) > 256:
            raise SpecError(f"{gw}: name must be 1 to 256 characters, got {describe(g.name)}")
        if g.compute_capability and not re.fullmatch(r"\d{1,2}\.\d{1,2}", g.compute_capability):
            raise SpecError(f"{gw}: compute capability must be two small integers, got {describe(g.compute_capability)}")
        for name, kind, lo, hi in _GPU_FIELDS:
            v = getattr(g, name)
            if v is None and name not in ("memory_total_bytes", "memory_free_bytes"):
                continue
            ok = (not isinstance(v, bool) and isinstance(v, (int, float) if kind is float else int)
                  and math.isfinite(v) and lo <= v <= hi)
            if not ok:
                raise SpecError(f"{gw}: {name} must be a number in {lo}..{hi}, got {describe(v)}")


class ReplayNVML(types.SimpleNamespace):
    """A ``pynvml`` stand-in answering from a recording (see the module docstring).

    ``nvmlInit`` raises what the recording says it raised (``NVMLError_LibraryNotFound`` for a
    machine without a driver); a call the recording does not hold raises ``KeyError`` naming
    it, so a probe that asks something new fails loudly instead of reading invented data.
    """

    def __init__(self, recording: dict, source: str = "") -> None:
        super().__init__(**vars(_error_classes()))
        self._calls: dict[str, dict[str, Any]] = recording.get("calls", {})
        self._source = source or recording.get("source", "")

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "ReplayNVML":
        from costmodel.files.readers import load_json
        data = load_json(path, "NVML recording")     # bounded, UTF-8, finite numbers
        check_recording(data, str(path))
        return cls(data, str(path))

    def _answer(self, fn: str, *args: Any) -> Any:
        table = self._calls.get(fn)
        if table is None:
            raise KeyError(f"NVML replay {self._source or ''}: no recorded answer for {fn}")
        key = ",".join(str(a.index if isinstance(a, _Handle) else a) for a in args)
        if key in table:
            ans = table[key]
        else:
            for pat, a in table.items():
                if _matches(pat, key):
                    ans = a
                    break
            else:
                raise KeyError(f"NVML replay {self._source or ''}: no recorded answer for {fn}({key})")
        if isinstance(ans, dict) and "error" in ans:
            code = getattr(self, ans["error"]) if isinstance(ans["error"], str) else ans["error"]
            raise self.NVMLError(code)
        if isinstance(ans, dict):
            return types.SimpleNamespace(**{k: v.encode() if k in _CHAR_FIELDS and isinstance(v, str) else v
                                            for k, v in ans.items()})
        if isinstance(ans, list) and fn == "nvmlDeviceGetCudaComputeCapability":
            return tuple(ans)
        return ans

    def __getattr__(self, fn: str) -> Callable[..., Any]:
        if not fn.startswith("nvml"):
            raise AttributeError(fn)
        if fn == "nvmlDeviceGetHandleByIndex":
            def get_handle(i: int) -> _Handle:
                if not 0 <= i < self._answer("nvmlDeviceGetCount"):
                    raise self.NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
                return _Handle(i)
            return get_handle
        if fn == "nvmlShutdown" or (fn == "nvmlInit" and fn not in self._calls):
            return lambda: None
        if fn == "nvmlDeviceGetMemoryInfo":
            return lambda h, version=None: self._answer(fn, h)
        return lambda *args: self._answer(fn, *args)


class RecordingNVML:
    """Wraps the real ``pynvml``; every answer (or error) is kept for ``save``."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._handles: dict[int, int] = {}
        self.calls: dict[str, dict[str, Any]] = {}

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._nvml, name)
        if not name.startswith("nvml") or not callable(attr):
            return attr

        def call(*args: Any, **kw: Any) -> Any:
            key = ",".join(str(self._handles.get(id(a), a)) if not isinstance(a, (int, str)) else str(a)
                           for a in args)
            try:
                out = attr(*args, **kw)
            except self._nvml.NVMLError as e:
                self.calls.setdefault(name, {})[key] = {"error": _error_name(self._nvml, e.value)}
                raise
            if name == "nvmlDeviceGetHandleByIndex":
                self._handles[id(out)] = int(args[0])
            elif name not in ("nvmlShutdown", "nvmlInit"):
                self.calls.setdefault(name, {})[key] = _plain(out)
            return out
        return call

    def save(self, path: str | os.PathLike, source: str) -> None:
        from costmodel.files.safeio import write_text
        write_text(path, json.dumps({"source": source, "calls": self.calls}, indent=1, sort_keys=True), "--record-nvml")


def _error_name(nvml: Any, code: int) -> str:
    for k in dir(nvml):
        if k.startswith("NVML_ERROR_") and getattr(nvml, k) == code:
            return k
    return str(code)


def _plain(x: Any) -> Any:
    if isinstance(x, bytes):
        return x.decode(errors="replace")
    if isinstance(x, (int, float, str)) or x is None:
        return x
    if isinstance(x, tuple):
        return list(x)
    if hasattr(x, "_fields_"):                  # a ctypes struct of the real pynvml
        return {f[0]: _plain(getattr(x, f[0])) for f in x._fields_}
    if isinstance(x, types.SimpleNamespace):     # a struct of a replay
        return {k: _plain(v) for k, v in vars(x).items()}
    try:
        return [_plain(v) for v in x]
    except TypeError:
        return str(x)
