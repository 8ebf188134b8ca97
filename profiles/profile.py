"""Profile orchestration: run the probe and the benchmarks on every rank, turn the measurements
into a cluster file, raw CSVs and a report.

Owns: ``run_profile`` (what ``planner profile`` calls), the rank side (``rank_main``: one per
GPU, or one per CPU process over gloo), the local launcher (``launch_local``: spawns the ranks,
watches them, names a rank that dies or hangs, keeps partial results), ``analyze`` (fits, the
cluster dict) and ``write_outputs``.

Two ways to run:

* standalone (``planner profile --nproc N``): this process probes, spawns N ranks on this
  machine (NCCL on GPUs, gloo on CPUs) and watches them;
* under torchrun (``torchrun --nnodes M --nproc-per-node N ... -m planner profile``): every rank
  runs ``rank_main`` in place (c10d rendezvous, one or many nodes), the first rank of each node
  probes its node, rank 0 writes the outputs.

Ranks sharing a node are found by a node key: ``PLANNER_NODE`` if set, else torchrun's
``GROUP_RANK`` (node rank), else the host name. Every measured group holds rank 0, so rank 0
records every result; its rows are appended to ``raw/*.jsonl`` as they are made, which is what
survives when a rank dies.

Output files in ``--out``: ``cluster.yaml`` (the catalog format plus ``measured:`` tables,
``source: measured`` and ``provenance``), ``collectives.csv``, ``matmul.csv``, ``memory.csv``,
``fits.csv``, ``probe.json``, ``summary.json``, ``report.md``, ``report.html`` and ``raw/``.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from costmodel.specs import SpecError
from costmodel.units import GB, GIB, MIB, TERA, US

from . import bench_collectives as bc
from .bench_attention import attention_table
from .bench_matmul import efficiency_table, fit_efficiency
from .bench_memory import sustained_bandwidth
from costmodel.files.clusters import cluster_from_dict, cluster_to_dict, load_cluster
from .probe import ProbeResult, ReplayNVML, RecordingNVML, check_probe_result, load_nvml, nvlink_mesh_peers, probe
from costmodel.files.safeio import OutputError, check_output, check_output_folder, write_text
from costmodel.files.version import tool_version

CLUSTER_FILE = "cluster.yaml"
OUTPUT_FILES = (CLUSTER_FILE, "collectives.csv", "matmul.csv", "memory.csv", "fits.csv", "probe.json",
                "summary.json", "report.md", "report.html")


class ProfileInputError(ValueError):
    """Bad input found before anything is measured (exit 2)."""


class RankFailed(RuntimeError):
    """A rank died, hung or failed; the message names it, ``partial`` says what was kept (exit 1)."""

    def __init__(self, message: str, partial: dict | None = None) -> None:
        super().__init__(message)
        self.partial = partial or {}


@dataclass
class ProfileOptions:
    out_dir: Path
    quick: bool = False
    nproc: int | None = None
    timeout_s: float = 120.0
    name: str | None = None
    max_bytes: int | None = None
    nvml_replay: str | None = None
    record_nvml: str | None = None
    report: bool = True
    progress: bool = False
    extra: dict = field(default_factory=dict)


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


def check_output_dir(out: Path) -> Path:
    """Create ``out`` and prove it writable, or raise ``ProfileInputError`` (before measuring)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ProfileInputError(f"--out {out} is a file, not a folder; give a folder for the profile")
    try:
        # a link, FIFO or device where an output goes is refused before anything is measured
        check_output_folder(out, "--out")
        check_output_folder(out / "raw", "--out")
        for name in OUTPUT_FILES:
            check_output(out / name, "--out")
    except OutputError as e:
        raise ProfileInputError(str(e)) from None
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=out, prefix=".write-test-")
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise ProfileInputError(f"cannot write the profile to {out}: {e.strerror or e}; "
                                "give a writable folder with --out") from None
    return out


# --------------------------------------------------------------------------------------
# Progress
# --------------------------------------------------------------------------------------

class _Progress:
    """A rich progress bar on a terminal; nothing otherwise (messages are for people)."""

    def __init__(self, enabled: bool) -> None:
        self._bar = None
        self._task = None
        if enabled:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
            self._bar = Progress(TextColumn("[bold]profile[/]"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                                 TimeElapsedColumn(), TextColumn("{task.description}"), transient=True)
            self._bar.start()
            self._task = self._bar.add_task("starting", total=None)

    def update(self, done: int, total: int | None, desc: str) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=done, total=total or None, description=desc[:60])

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


# --------------------------------------------------------------------------------------
# The rank side
# --------------------------------------------------------------------------------------

def _node_key() -> str:
    if os.environ.get("PLANNER_NODE"):
        return os.environ["PLANNER_NODE"]
    if os.environ.get("GROUP_RANK") is not None and "TORCHELASTIC_RUN_ID" in os.environ:
        return f"node{os.environ['GROUP_RANK']}"
    return socket.gethostname()


def _append_jsonl(path: Path | None, row: dict) -> None:
    if path is None:
        return
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def _extra_pairs(probe_d: dict | None, local: int) -> list[tuple[int, str]]:
    """For a GPU box, one more pair per PCIe topology level seen from GPU 0 (PIX, NODE, SYS...)."""
    if not probe_d or not probe_d.get("topology"):
        return []
    row = probe_d["topology"][0][:local]
    seen = {row[1]} if len(row) > 1 else set()
    out = []
    for j, lvl in enumerate(row):
        if j and lvl not in seen:
            seen.add(lvl)
            out.append((j, lvl))
    return out


def rank_main(cfg: dict, progress: Callable[[int, int | None, str], None] | None = None) -> dict | None:
    """One rank of the profile. Collective: every rank calls it. Returns rank 0's results (every
    measured group holds rank 0), None on the other ranks."""
    import datetime

    import torch
    import torch.distributed as dist

    raw = Path(cfg["raw_dir"])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    plog = raw / f"progress.rank{rank}.log" if cfg.get("progress_files") else None

    store = None                 # the rendezvous store: every rank's progress, readable by all

    def note(done: int, total: int | None, desc: str) -> None:
        d = {"done": done, "total": total, "desc": desc, "t": time.time()}
        _append_jsonl(plog, d)
        if store is not None:
            try:
                store.set(f"{_STORE_PREFIX}{rank}", json.dumps(d))
            except Exception:
                pass
        if progress is not None and rank == 0:
            progress(done, total, desc)

    use_cuda = torch.cuda.is_available() and not cfg.get("force_cpu")
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    backend = "nccl" if use_cuda else "gloo"
    kw = {"device_id": device} if use_cuda else {}
    # spawned ranks: the launcher's watchdog (timeout_s without progress) names a hung rank
    # first; the process-group timeout is the backstop, and the only guard under torchrun
    pg_timeout = cfg["timeout_s"] + (10.0 if cfg.get("progress_files") else 0.0)
    timeout = datetime.timedelta(seconds=pg_timeout)
    if cfg.get("loopback_store"):      # spawned here: the store listens on 127.0.0.1 only
        kw["store"] = _loopback_store(rank, world, timeout)
        kw.update(rank=rank, world_size=world)
    dist.init_process_group(backend, timeout=timeout, **kw)
    everyone: list[Any] = []
    try:
        store = _default_store()
        note(0, None, "ready")
        local_probe = None
        if local_rank == 0:
            local_probe = cfg.get("probe") or probe().to_dict()
        me = {"rank": rank, "host": socket.gethostname(), "node": _node_key(), "pid": os.getpid(),
              "device": str(device), "probe": local_probe}
        everyone = [None] * world
        dist.all_gather_object(everyone, me)
        nodes = [e["node"] for e in everyone]
        per_node = nodes.count(nodes[0])
        probes = {e["node"]: e["probe"] for e in everyone if e["probe"] is not None}
        shapes = bc.group_shapes(nodes, _extra_pairs(probes.get(nodes[0]), per_node) if use_cuda else [])
        sizes = bc.message_sizes(device.type, cfg["quick"], cfg.get("max_bytes"))
        result: dict[str, Any] = {"ranks": [{k: v for k, v in e.items() if k != "probe"} for e in everyone],
                                  "probes": probes, "shapes": [vars(s) | {"ranks": list(s.ranks)} for s in shapes],
                                  "sizes": sizes, "backend": backend, "device_type": device.type,
                                  "torch": str(torch.__version__), "cuda": torch.version.cuda and str(torch.version.cuda),
                                  "nccl": ".".join(map(str, torch.cuda.nccl.version())) if use_cuda else None,
                                  "matmul": [], "memory": [], "collectives": [], "overlap": None}
        if rank == 0:
            (raw / "ranks.json").write_text(json.dumps(result["ranks"], indent=1))
            _rank0_compute(cfg, device, result, raw, note)
        _wait_for_rank0(store, rank, cfg["timeout_s"])
        dist.barrier()
        total = bc.count_measurements(shapes, sizes)
        rows = bc.run_collectives(shapes, sizes, device=device, target_s=cfg["target_s"],
                                  reps=1 if cfg["quick"] else 2,
                                  on_row=lambda r: _append_jsonl(raw / "collectives.jsonl", r) if rank == 0 else None,
                                  on_progress=note)
        result["collectives"] = rows
        pair = next((s for s in shapes if s.size == 2 and s.tier == "intra"), None)
        if use_cuda and pair is not None and not cfg["quick"]:
            note(total, total, "compute/communication overlap")
            result["overlap"] = bc.measure_overlap(pair, device)
        elif not use_cuda and pair is not None:
            note(total, total, "compute/communication overlap")
            result["overlap"] = bc.measure_overlap_cpu(pair, device)
        dist.barrier()
        note(total, total, "done")
        if rank == 0:
            (raw / "result.json").write_text(json.dumps(result))
            return result
        return None
    except Exception as e:
        first = str(e).splitlines()[0] if str(e) else ""
        blame = _blame(store, rank, world, everyone)
        raise RankFailed(f"{blame}rank {rank} (host {socket.gethostname()}, node {_node_key()}) "
                         f"{'gave up waiting' if blame else 'failed'}: {type(e).__name__}: {first[:300]}") from e
    finally:
        try:
            dist.destroy_process_group()
        except Exception:
            pass


_STORE_PREFIX = "planner_profile/progress/"


_COMPUTE_DONE = "planner_profile/compute_done"


def _wait_for_rank0(store: Any, rank: int, timeout_s: float) -> None:
    """Rank 0 measures matmul and memory alone while the others wait. They wait as long as rank 0
    keeps making progress (its stamp in the store changes within ``timeout_s``), not a fixed
    collective timeout: a slow but healthy compute phase is not a hang. Without the store the
    barrier that follows is the only wait."""
    if store is None:
        return
    try:
        if rank == 0:
            store.set(_COMPUTE_DONE, "1")
            return
        key, last, since = f"{_STORE_PREFIX}0", None, time.time()
        while not store.check([_COMPUTE_DONE]):
            stamp = store.get(key) if store.check([key]) else None
            if stamp != last:
                last, since = stamp, time.time()
            elif time.time() - since > timeout_s:
                state = json.loads(last) if last else {}
                raise TimeoutError(f"rank 0 stopped making progress {_activity(state)}: nothing for "
                                   f"{timeout_s:.0f} s while it measured compute alone")
            time.sleep(0.1)
    except TimeoutError:
        raise
    except Exception:
        return


def _loopback_store(rank: int, world: int, timeout: Any) -> Any:
    """The rendezvous store of spawned ranks at 127.0.0.1:MASTER_PORT. A TCPStore server listens
    on every interface whatever host it is given, so rank 0 hands it a socket bound to loopback."""
    import torch.distributed as dist
    port = int(os.environ["MASTER_PORT"])
    if rank != 0:
        return dist.TCPStore("127.0.0.1", port, world, False, timeout)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(1024)
    return dist.TCPStore("127.0.0.1", port, world, True, timeout, wait_for_workers=False,
                         master_listen_fd=s.detach())


def _default_store() -> Any:
    """The process group's key-value store (torchrun's rendezvous store, or the TCPStore of
    MASTER_ADDR), or None. A private torch API, used only to say which rank stalled."""
    try:
        import torch.distributed.distributed_c10d as c10d
        return c10d._get_default_store()
    except Exception:
        return None


def _blame(store: Any, me: int, world: int, everyone: list[Any]) -> str:
    """'rank 3 (host b, node node1) stopped making progress after ...; ' when the store shows a
    rank behind the others, else ''."""
    if store is None or world < 2:
        return ""
    states = {}
    for r in range(world):
        try:
            if store.check([f"{_STORE_PREFIX}{r}"]):
                states[r] = json.loads(store.get(f"{_STORE_PREFIX}{r}"))
            else:
                states[r] = {}
        except Exception:
            return ""
    keys = {r: _progress_key(st) for r, st in states.items()}
    ahead = max(keys.values())
    behind = [r for r, k in keys.items() if k < ahead and r != me]
    if not behind:
        return ""
    r = behind[0]
    info = everyone[r] if r < len(everyone) and everyone[r] else {}
    return (f"rank {r} (host {info.get('host', '?')}, node {info.get('node', '?')}) stopped making progress "
            f"{_activity(states[r])}; ")


def _rank0_compute(cfg: dict, device: Any, result: dict, raw: Path, note: Callable) -> None:
    from .bench_matmul import bench_matmul, square_sizes, transformer_shapes
    from .bench_memory import bench_copy, copy_sizes
    quick = cfg["quick"]
    dtypes = (["bf16", "fp16", "tf32", "fp32"] if not quick else ["bf16", "fp32"]) if device.type == "cuda" \
        else (["fp32", "bf16"] if quick else ["fp32", "bf16", "fp16"])
    shapes = [(s, s, s) for s in square_sizes(device.type, quick)] + transformer_shapes(device.type, quick)
    total = len(dtypes) * len(shapes)

    def mm_row(r: dict) -> None:
        result["matmul"].append(r)
        _append_jsonl(raw / "matmul.jsonl", r)
        note(len(result["matmul"]), total, f"matmul {r['dtype']} {r['m']}x{r['n']}x{r['k']}")

    def mm_start(dt: str, m: int, n: int, k: int) -> None:
        note(len(result["matmul"]), total, f"matmul {dt} {m}x{n}x{k}")

    def mm_skip(dt: str, m: int, n: int, k: int, secs: float) -> None:
        result.setdefault("matmul_skipped", []).append({"dtype": dt, "m": m, "n": n, "k": k,
                                                         "predicted_call_s": round(secs, 3)})

    bench_matmul(device, dtypes, shapes, target_s=cfg["target_s"], on_row=mm_row, on_start=mm_start,
                 on_skip=mm_skip)

    def mem_row(r: dict) -> None:
        result["memory"].append(r)
        _append_jsonl(raw / "memory.jsonl", r)
        note(len(result["memory"]), None, f"copy {r['bytes'] // MIB} MiB")

    bench_copy(device, copy_sizes(device.type, quick), target_s=cfg["target_s"], on_row=mem_row)

    # fused attention, each SDPA kernel this device runs (costmodel.attention prices on it)
    from .bench_attention import bench_attention

    def attn_row(r: dict) -> None:
        result.setdefault("attention", []).append(r)
        _append_jsonl(raw / "attention.jsonl", r)
        note(len(result["attention"]), None, f"attention {r['kernel']} d={r['head_dim']} s={r['seq_len']} "
                                             f"{r['mask']} {r['direction']}")

    note(0, None, "attention")
    bench_attention(device, quick, target_s=cfg["target_s"], on_row=attn_row)

    if device.type == "cpu":
        # eager CPU operators run synchronously: a fixed cost per layer adds to its FLOPs
        from .bench_layer import bench_layer_overhead
        fp32 = max([r["flops_per_s"] for r in result["matmul"] if r["dtype"] == "fp32"] or [0.0])
        note(0, None, "layer overhead")
        result["layer"] = bench_layer_overhead(device, fp32, target_s=max(0.8, 8 * cfg["target_s"]))
        _append_jsonl(raw / "layer.jsonl", result["layer"])
        # and what FSDP2's wrappers add (the built-in runtime wraps every data-parallel plan in them)
        from .bench_layer import measure_fsdp2_overhead
        note(0, None, "FSDP2 wrapper overhead")
        wrap = measure_fsdp2_overhead(max(0.8, 8 * cfg["target_s"]),
                                      tick=lambda: note(0, None, "FSDP2 wrapper overhead"))
        if wrap is not None:
            result["fsdp2"] = wrap
            _append_jsonl(raw / "fsdp2.jsonl", wrap)


def worker_entry(argv: list[str]) -> int:
    """``python -m profiles.profile --rank-worker CONFIG``: one spawned rank."""
    cfg = json.loads(Path(argv[1]).read_text())
    try:
        rank_main(cfg)
    except Exception as e:   # the parent reads this and names the rank
        rank = os.environ.get("RANK", "?")
        _append_jsonl(Path(cfg["raw_dir"]) / f"progress.rank{rank}.log",
                      {"error": f"{type(e).__name__}: {e}".splitlines()[0][:500], "t": time.time()})
        return 1
    return 0


# --------------------------------------------------------------------------------------
# The local launcher
# --------------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _last(path: Path) -> dict:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    for line in reversed(lines):
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            continue
    return {}


def _activity(d: dict) -> str:
    """'in all_reduce 1 MiB in node [0, 1]' / 'after ...' / 'while starting up'."""
    desc = d.get("desc")
    if not desc:
        return "while starting up"
    if desc.startswith("begin "):
        return "in " + desc[6:]
    if desc.startswith("end "):
        return "after " + desc[4:]
    return f"at '{desc}'"


def launch_local(cfg: dict, nproc: int, raw: Path, timeout_s: float, progress: _Progress,
                 startup_grace_s: float = 90.0) -> dict:
    """Spawn ``nproc`` ranks on this machine and watch them. A rank that exits non-zero, or a
    run where no rank progresses for ``timeout_s``, stops all ranks and raises ``RankFailed``
    naming the rank, its host and what it was doing."""
    cfg_path = raw / "config.json"
    cfg_path.write_text(json.dumps(dict(cfg, loopback_store=True)))
    port = _free_port()
    host = socket.gethostname()
    procs = []
    for r in range(nproc):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(nproc), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(nproc),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        env.setdefault("PLANNER_NODE", host)
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        for k in ("TORCHELASTIC_RUN_ID", "GROUP_RANK"):
            env.pop(k, None)
        log = open(raw / f"rank{r}.log", "w")
        procs.append((subprocess.Popen([sys.executable, "-m", "profiles.profile", "--rank-worker", str(cfg_path)],
                                       env=env, stdout=log, stderr=subprocess.STDOUT,
                                       cwd=str(Path(__file__).resolve().parents[1])), log))
    logs = [raw / f"progress.rank{r}.log" for r in range(nproc)]
    last_change = time.time()
    seen = [0.0] * nproc
    started = False
    try:
        while True:
            time.sleep(0.1)
            states = [_last(p) for p in logs]
            stamps = [s.get("t", 0.0) for s in states]
            if stamps != seen:
                seen, last_change = stamps, time.time()
                started = started or all(s.get("desc") for s in states)
            s0 = states[0]
            if "done" in s0:
                progress.update(s0["done"], s0.get("total"), s0["desc"])
            codes = [p.poll() for p, _ in procs]
            bad = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if bad:
                time.sleep(0.3)          # let a first failure be the one reported, not its echo
                codes = [p.poll() for p, _ in procs]
                raise RankFailed(_failure_message(codes, logs, procs, host))
            if all(c == 0 for c in codes):
                return json.loads((raw / "result.json").read_text())
            limit = timeout_s if started else max(timeout_s, startup_grace_s)
            if time.time() - last_change > limit:
                raise RankFailed(_hang_message(logs, procs, host, limit))
    finally:
        for p, log in procs:
            if p.poll() is None:
                p.kill()
        for p, log in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            log.close()


def _last_progress(path: Path) -> dict:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    for line in reversed(lines):
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "desc" in d:
            return d
    return {}


def _failure_message(codes: list[int | None], logs: list[Path], procs: list, host: str) -> str:
    """Which rank to blame when ranks exit with errors: one that died without a message of its
    own; else a live rank behind the others (the failed ones timed out waiting for it); else
    the first that failed."""
    bad = [r for r, c in enumerate(codes) if c not in (None, 0)]
    errors = {r: _last(logs[r]).get("error") for r in bad}
    states = [_last_progress(p) for p in logs]
    quiet = [r for r in bad if not errors[r]]
    if quiet:
        r = quiet[0]
        return (f"rank {r} (host {host}, pid {procs[r][0].pid}) exited with code {codes[r]} "
                f"{_activity(states[r])}")
    keys = [_progress_key(st) for st in states]
    behind = [q for q in range(len(codes)) if codes[q] is None and keys[q] < max(keys[r] for r in bad)]
    r = bad[0]
    if behind:
        b = behind[0]
        return (f"rank {b} (host {host}, pid {procs[b][0].pid}) stopped making progress {_activity(states[b])}; "
                f"rank {r} gave up waiting for it {_activity(states[r])}: {errors[r]}")
    return (f"rank {r} (host {host}, pid {procs[r][0].pid}) exited with code {codes[r]} "
            f"{_activity(states[r])}: {errors[r]}")


def _progress_key(d: dict) -> tuple[int, int]:
    return (d.get("done", -1), 1 if str(d.get("desc", "")).startswith("begin") else 0)


def _hang_message(logs: list[Path], procs: list, host: str, limit: float) -> str:
    states = [_last_progress(p) for p in logs]
    keys = [_progress_key(s) for s in states]
    ahead = max(keys)
    behind = [r for r, k in enumerate(keys) if k < ahead]
    if behind:
        r = behind[0]
        waiting = [q for q, k in enumerate(keys) if k == ahead]
        return (f"rank {r} (host {host}, pid {procs[r][0].pid}) stopped making progress: nothing for "
                f"{limit:.0f} s {_activity(states[r])}, while rank(s) {', '.join(map(str, waiting))} "
                f"wait {_activity(states[waiting[0]])}")
    return (f"no rank made progress for {limit:.0f} s; all ranks are {_activity(states[0])} "
            f"on host {host} (a stalled link or peer)")


# --------------------------------------------------------------------------------------
# Analysis: measurements -> cluster dict
# --------------------------------------------------------------------------------------

def _datasheet(catalog: str | None) -> dict | None:
    if not catalog:
        return None
    try:
        return cluster_to_dict(load_cluster(catalog))
    except Exception:
        return None


def _r(x: float, nd: int = 4) -> float:
    return float(f"{x:.{nd}g}")


def _link(fit: bc.AlphaBeta | None, sheet: dict | None, kind: str, device_type: str) -> tuple[dict, str]:
    """The cluster file's link for a tier: measured bandwidth and latency; on GPUs the datasheet
    bandwidth is kept and the measured fraction becomes the efficiency."""
    if fit is None:
        if sheet is None:
            raise AssertionError("a tier with neither measurement nor datasheet")
        return dict(sheet), "datasheet (not measured)"
    bw = fit.bandwidth_bytes_per_s / GB
    lat = fit.alpha_s / US
    name = f"{sheet['name'] if sheet else kind} (measured)"
    if device_type == "cuda" and sheet and bw < sheet["gb_per_s"]:
        return {"name": name, "gb_per_s": sheet["gb_per_s"], "latency_us": _r(lat),
                "efficiency": _r(max(0.01, bw / sheet["gb_per_s"]))}, "measured"
    return {"name": name, "gb_per_s": _r(bw), "latency_us": _r(lat), "efficiency": 1.0}, "measured"


def _mesh_sheet(sheet: dict | None, gpus: list, peers: int) -> dict | None:
    """The datasheet's intra-node link on a direct mesh of ``peers`` (``probe.nvlink_mesh_peers``):
    the GPU's NVLinks at their datasheet rate. A node of 4 H100s on an HGX 4-GPU board matches the
    DGX H100 datasheet, whose NVSwitch link is named for the switch; the rate is the same 18 links."""
    if not peers or not sheet:
        return sheet
    rate = min(g.nvlink_gb_per_s for g in gpus)
    return {**sheet, "name": f"nvlink-mesh-{peers}-peers", "gb_per_s": _r(rate)}


def _attention_summary(rows: list[list]) -> dict:
    """Per measured kernel: the range of its causal forward and backward fractions of peak, at the
    largest head dimension measured, over the sequence lengths measured."""
    out: dict[str, dict] = {}
    for kernel in sorted({r[0] for r in rows}):
        mine = [r for r in rows if r[0] == kernel and r[2] == "causal"]
        hd = max(r[3] for r in mine) if mine else None
        ent: dict[str, Any] = {"head_dim": hd, "seq_lens": sorted({r[4] for r in mine if r[3] == hd})}
        for d in ("fwd", "bwd"):
            effs = [r[5] for r in mine if r[1] == d and r[3] == hd]
            ent[d] = [min(effs), max(effs)] if effs else None
        out[kernel] = ent
    return out


@dataclass
class Profile:
    """Everything a profile run produced, ready to write."""

    cluster: dict
    probe: ProbeResult
    result: dict
    fits: list[bc.AlphaBeta]
    summary: dict
    datasheet: dict | None


def analyze(pr: ProbeResult, result: dict, *, name: str | None, quick: bool, started: float,
            method: str) -> Profile:
    """Fit the measurements and build the cluster dict (catalog format, human units)."""
    ranks = result["ranks"]
    node_keys = list(dict.fromkeys(r["node"] for r in ranks))
    per_node = {n: [r["rank"] for r in ranks if r["node"] == n] for n in node_keys}
    sizes = {len(v) for v in per_node.values()}
    if len(sizes) != 1:
        raise RankFailed(f"nodes have different numbers of ranks: {per_node}; a cluster file needs "
                         "the same number of GPUs per node")
    gpn, nodes = sizes.pop(), len(node_keys)
    device_type = result["device_type"]
    # GPU facts describe the cluster only when the GPUs were what we measured (not a replay
    # or a GPU box profiled on its CPU)
    gpus = pr.gpus if device_type == "cuda" else []
    sheet = _datasheet(pr.catalog if gpus else "cpu")
    sheet_gpu = (sheet or {}).get("gpu", {})
    primary = "bf16"
    # --- matmul
    mm = result["matmul"]
    best: dict[str, float] = {}
    for r in mm:
        best[r["dtype"]] = max(best.get(r["dtype"], 0.0), r["flops_per_s"])
    tflops = {k: float(v) for k, v in (sheet_gpu.get("tflops") or {}).items()}
    gpu_datasheet_known = device_type == "cuda" and bool(tflops)
    for dt, v in best.items():
        key = "tf32" if dt == "tf32" else dt
        if not gpu_datasheet_known or v / TERA > tflops.get(key, 0.0):
            tflops[key] = _r(v / TERA)     # CPU (or unknown GPU): the measured best is the peak
    if primary not in best and best:
        primary = max(best, key=best.get)
    table = efficiency_table(mm, primary, tflops[primary] * TERA) if primary in best else []
    e_max, half = fit_efficiency(table) if table else (sheet_gpu.get("matmul_efficiency", 0.7),
                                                       sheet_gpu.get("matmul_half_size", 160.0))
    # --- memory
    copy_bw = sustained_bandwidth(result["memory"]) if result["memory"] else None
    # --- memory capacity
    if gpus:
        mem_gib = min(g.memory_total_bytes for g in gpus) / GIB
    else:
        mem_gib = (pr.host_memory_bytes or 2 * GIB * gpn) / GIB / gpn
    # --- collectives
    rows = result["collectives"]
    fits = bc.fit_alpha_beta(rows) if rows else []
    f_intra, f_inter = bc.tier_fit(fits, "intra", rows), bc.tier_fit(fits, "inter", rows)
    # a direct NVLink mesh (an HGX 4-GPU board): a pair of its GPUs moves at 1/peers of the link, whether
    # the link's rate is the datasheet's or, for a GPU the catalog lacks, the measured one
    peers = nvlink_mesh_peers(gpus)
    intra, intra_src = _link(f_intra, _mesh_sheet((sheet or {}).get("intra_node"), gpus, peers), "intra", device_type)
    if peers:
        intra["mesh_peers"] = peers
        intra_src += f"; a direct NVLink mesh of {peers} peers per GPU (NVML's link peers)"
    inter_sheet = (sheet or {}).get("inter_node")
    no_network = f_inter is None and inter_sheet is None
    if no_network:
        # one node of a GPU the catalog has no datasheet for: nothing says what its network is. No plan on
        # this one-node file crosses it; a file that is later given more nodes prices the network at the
        # GPU's own PCIe link, the most any NIC behind it can carry (an upper bound, so named)
        pcie = min((g.pcie_gb_per_s or 0.0) for g in gpus) if gpus else 0.0
        if pcie <= 0:
            raise RankFailed(f"one node of {gpus[0].name if gpus else 'an unknown device'} was measured, the catalog "
                             "has no datasheet for it and NVML gives no PCIe link: nothing bounds its network; "
                             "profile two nodes (the network is then measured)")
        inter_sheet = {"name": "unmeasured (one node): the GPU's PCIe link, an upper bound on its NIC",
                       "gb_per_s": _r(pcie)}
    inter, inter_src = _link(f_inter, inter_sheet, "inter", device_type)
    if no_network:
        inter_src = "not measured (one node) and no datasheet: the GPU's PCIe link as an upper bound"
    overlap = result.get("overlap")
    hosts = sorted({r["host"] for r in ranks})
    cname = name or (f"measured-{hosts[0]}" if len(hosts) == 1 else f"measured-{hosts[0]}-x{nodes}")
    gpu_name = gpus[0].name if gpus else (sheet_gpu.get("name") or "cpu-process")
    gpu = {"name": gpu_name, "memory_gib": _r(mem_gib), "tflops": tflops,
           "hbm_gb_per_s": _r(copy_bw / GB) if copy_bw else sheet_gpu.get("hbm_gb_per_s", 10.0),
           "matmul_efficiency": _r(e_max), "matmul_half_size": _r(half)}
    for k in ("reserved_gib", "price_per_hour", "tdp_w"):
        if k in sheet_gpu:
            gpu[k] = sheet_gpu[k]
    # a power limit below the part's rated power (NVML's enforced limit): written so the file says what its
    # measured curves were measured at (costmodel.specs.GpuSpec.power_limit_w)
    limits = [g.power_limit_w for g in gpus if g.power_limit_w]
    if limits and sheet_gpu.get("tdp_w") and min(limits) < sheet_gpu["tdp_w"]:
        gpu["power_limit_w"] = _r(min(limits))
    layer = result.get("layer")
    if layer and device_type == "cpu":
        gpu["layer_overhead_us"] = _r(layer["overhead_s"] / US)
    wrap = result.get("fsdp2")
    if wrap and device_type == "cpu":
        gpu["fsdp2_block_us"] = _r(wrap["block_s"] / US)
        gpu["dtensor_param_step_us"] = _r(wrap["param_step_s"] / US)
        if wrap.get("tp_layer_s") is not None:
            gpu["dtensor_tp_layer_us"] = _r(wrap["tp_layer_s"] / US)
    attn = attention_table(result.get("attention") or [], lambda dt: (tflops.get(dt) or 0.0) * TERA)
    if attn:
        gpu["attention_table"] = attn
    measured: dict[str, Any] = {}
    if table:
        measured["matmul"] = [[s, _r(e)] for s, e in table]
    trows = [r for r in rows if r.get("table", True)]
    if trows:
        measured["collectives"] = [{"tier": r["tier"], "op": r["op"], "group_size": r["group_size"],
                                    "bytes": r["bytes"], "busbw_gb_per_s": _r(r["busbw_bytes_per_s"] / GB)}
                                   for r in trows]
    if overlap:
        measured["compute_comm_slowdown"] = _r(overlap["compute_slowdown"])
    now = _dt.datetime.now(_dt.timezone.utc)
    provenance = {
        "tool": f"planner profile {tool_version()}", "date": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "hosts": hosts, "nodes": {n: per_node[n] for n in node_keys}, "method": method, "quick": quick,
        "versions": {"python": platform.python_version(), "torch": result["torch"], "backend": result["backend"],
                     "cuda": result.get("cuda"), "nccl": result.get("nccl"),
                     "driver": pr.driver_version or None, "cuda_driver": pr.cuda_driver_version or None},
        "device": result["device_type"], "matmul_dtype": primary,
        "matmul_peak": "datasheet" if gpu_datasheet_known else "measured best (no datasheet peak for this device)",
        "hbm": "measured copy bandwidth of the largest buffer (read + write)",
        "links": {"intra_node": intra_src,
                  "inter_node": inter_src if nodes > 1 or no_network else "datasheet (single node)"},
        "fits": {f"{f.tier}/{f.group}/{f.op}": {"group_size": f.group_size, "alpha_us": _r(f.alpha_s / US),
                                                "busbw_gb_per_s": _r(f.bandwidth_bytes_per_s / GB),
                                                "rms_rel_error": _r(f.rms_rel_error, 3)} for f in fits},
        "datasheet": {"catalog": pr.catalog, "gpu": sheet_gpu or None,
                      "intra_node": (sheet or {}).get("intra_node"), "inter_node": (sheet or {}).get("inter_node")},
        "probe": pr.summary(),
    }
    if overlap:
        provenance["overlap"] = {k: v for k, v in overlap.items() if k != "ranks"}
    desc_gpu = f"{gpn}x {gpu_name}" if gpus else f"{gpn} CPU processes (gloo)"
    cluster = {"name": cname,
               "description": f"Measured by planner profile on {', '.join(hosts)}: {nodes} node(s) of {desc_gpu}",
               "gpu": gpu, "gpus_per_node": gpn, "nodes": nodes, "intra_node": intra, "inter_node": inter,
               "measured": measured, "source": "measured", "provenance": provenance}
    cluster_from_dict(cluster, "measured profile")      # fail here, not in the planner, if invalid
    summary = {
        "status": "ok", "cluster_name": cname, "nodes": nodes, "gpus_per_node": gpn, "device": device_type,
        "backend": result["backend"], "gpu": gpu_name, "nvml": pr.nvml, "note": pr.note, "quick": quick,
        "measure_time_s": round(time.time() - started, 2), "wall_time_s": None,
        "matmul": {"dtype": primary, "best_tflops": _r(best.get(primary, 0.0) / TERA),
                   "peak_tflops": tflops.get(primary), "datasheet_tflops": (sheet_gpu.get("tflops") or {}).get(primary),
                   "efficiency_max": _r(e_max), "half_size": _r(half),
                   "best_tflops_by_dtype": {k: _r(v / TERA) for k, v in best.items()},
                   "skipped": result.get("matmul_skipped", [])},
        "memory": {"copy_gb_per_s": _r(copy_bw / GB) if copy_bw else None,
                   "datasheet_gb_per_s": sheet_gpu.get("hbm_gb_per_s")},
        "layer_overhead_us": gpu.get("layer_overhead_us"),
        "fsdp2_block_us": gpu.get("fsdp2_block_us"),
        "dtensor_param_step_us": gpu.get("dtensor_param_step_us"),
        "dtensor_tp_layer_us": gpu.get("dtensor_tp_layer_us"),
        "attention": _attention_summary(attn),
        "tiers": {},
        "compute_comm_slowdown": measured.get("compute_comm_slowdown"),
        "measurements": {"matmul": len(mm), "memory": len(result["memory"]), "collectives": len(rows)},
    }
    for tier, f, link in (("intra", f_intra, "intra_node"), ("inter", f_inter, "inter_node")):
        if f is not None:
            summary["tiers"][tier] = {"group": f.group, "op": f.op, "group_size": f.group_size,
                                      "busbw_gb_per_s": _r(f.bandwidth_bytes_per_s / GB),
                                      "max_busbw_gb_per_s": _r(f.max_busbw_bytes_per_s / GB),
                                      "latency_us": _r(f.alpha_s / US),
                                      "datasheet_gb_per_s": ((sheet or {}).get(link) or {}).get("gb_per_s")}
    return Profile(cluster=cluster, probe=pr, result=result, fits=fits, summary=summary, datasheet=sheet)


# --------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------

def _frames(result: dict, fits: list[bc.AlphaBeta]) -> dict[str, Any]:
    import pandas as pd
    coll = pd.DataFrame(result.get("collectives") or [],
                        columns=["group", "tier", "op", "group_size", "ranks", "bytes", "time_s",
                                 "algbw_bytes_per_s", "busbw_bytes_per_s", "iters", "table"])
    coll["algbw_gb_per_s"] = coll["algbw_bytes_per_s"] / GB
    coll["busbw_gb_per_s"] = coll["busbw_bytes_per_s"] / GB
    mm = pd.DataFrame(result.get("matmul") or [], columns=["dtype", "m", "n", "k", "size", "time_s", "flops_per_s", "iters"])
    mm["tflops"] = mm["flops_per_s"] / TERA
    mem = pd.DataFrame(result.get("memory") or [], columns=["bytes", "time_s", "bandwidth_bytes_per_s", "iters"])
    mem["gb_per_s"] = mem["bandwidth_bytes_per_s"] / GB
    fit = pd.DataFrame([f.to_dict() for f in fits],
                       columns=["tier", "group", "op", "group_size", "alpha_s", "bandwidth_bytes_per_s",
                                "max_busbw_bytes_per_s", "points", "rms_rel_error"])
    return {"collectives": coll, "matmul": mm, "memory": mem, "fits": fit}


def write_csvs(result: dict, fits: list[bc.AlphaBeta], out: Path) -> dict[str, str]:
    paths = {}
    for name, df in _frames(result, fits).items():
        p = out / f"{name}.csv"
        write_text(p, df.to_csv(index=False), "--out")
        paths[name] = str(p)
    return paths


def write_outputs(prof: Profile, out: Path, report: bool = True) -> dict:
    """The cluster file, CSVs, probe and summary JSON, and the report; returns the summary."""
    out = Path(out)
    cpath = out / CLUSTER_FILE
    header = ("# Cluster file written by `planner profile` (measured). Human units; see\n"
              "# costmodel/files/catalog/clusters.yaml for the format. Use: planner plan --cluster "
              f"{cpath.name}\n")
    write_text(cpath, header + yaml.safe_dump(prof.cluster, sort_keys=False, default_flow_style=None, width=110), "--out")
    files = {"cluster": str(cpath)}
    files.update(write_csvs(prof.result, prof.fits, out))
    write_text(out / "probe.json", json.dumps({"this_host": prof.probe.to_dict(),
                                               "nodes": prof.result.get("probes", {})}, indent=1), "--out")
    files["probe"] = str(out / "probe.json")
    files["summary"] = str(out / "summary.json")
    prof.summary["files"] = files
    prof.summary["cluster_file"] = str(cpath)
    if report:
        from .report import write_report
        write_report(prof, out)       # adds report_md and report_html to summary["files"]
    write_text(out / "summary.json", json.dumps(prof.summary, indent=1), "--out")
    return prof.summary


def _partial_result(raw: Path) -> dict:
    def rows(name: str) -> list[dict]:
        try:
            return [json.loads(x) for x in (raw / name).read_text().splitlines() if x.strip()]
        except OSError:
            return []
    return {"matmul": rows("matmul.jsonl"), "memory": rows("memory.jsonl"), "collectives": rows("collectives.jsonl")}


def keep_partial(out: Path, error: str) -> dict:
    """After a failure: whatever rank 0 recorded, as CSVs, and a summary saying what failed."""
    raw = out / "raw"
    part = _partial_result(raw)
    fits = bc.fit_alpha_beta(part["collectives"]) if part["collectives"] else []
    files = write_csvs(part, fits, out)
    summary = {"status": "failed", "error": error, "files": files,
               "measurements": {k: len(v) for k, v in part.items()}}
    write_text(out / "summary.json", json.dumps(summary, indent=1), "--out")
    return summary


# --------------------------------------------------------------------------------------
# Entry
# --------------------------------------------------------------------------------------

def _probe_for(opts: ProfileOptions) -> ProbeResult:
    nvml = None
    if opts.nvml_replay:
        try:
            nvml = ReplayNVML.from_file(opts.nvml_replay)
        except SpecError as e:
            raise ProfileInputError(str(e)) from None
    elif opts.record_nvml:
        real, note = load_nvml()
        if real is None:
            raise ProfileInputError(f"--record-nvml: {note}")
        nvml = RecordingNVML(real)
    if isinstance(nvml, ReplayNVML):
        try:
            pr = probe(nvml)
            check_probe_result(pr, f"--nvml-replay {opts.nvml_replay}")
            pr.summary(), pr.to_dict()
        except SpecError as e:
            raise ProfileInputError(str(e)) from None
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, ZeroDivisionError, OverflowError) as e:
            msg = e.args[0] if isinstance(e, KeyError) and e.args else e
            raise ProfileInputError(f"--nvml-replay {opts.nvml_replay}: the recording cannot answer the probe "
                                    f"({type(e).__name__}: {str(msg)[:200]}); record it again with --record-nvml") from None
    else:
        pr = probe(nvml)
    if opts.record_nvml and isinstance(nvml, RecordingNVML):
        nvml.save(opts.record_nvml, f"recorded by planner profile on {pr.host} "
                  f"({_dt.date.today().isoformat()}): {pr.summary()}")
    return pr


def default_nproc(pr: ProbeResult, quick: bool, gpus_used: bool) -> int:
    if pr.gpus and gpus_used:
        return len(pr.gpus)
    return 2 if quick else 4


def run_profile(opts: ProfileOptions, log: Callable[[str], None] = lambda m: None) -> dict:
    """Measure, fit, write. Standalone or under torchrun (see the module docstring). Returns the
    summary (on torchrun ranks other than 0: ``{"status": "ok", "rank": r}``)."""
    started = time.time()
    if opts.nproc is not None and opts.nproc < 1:
        raise ProfileInputError(f"--nproc must be >= 1, got {opts.nproc}")
    # under torchrun only rank 0 writes (other ranks may share its file system)
    writer = not under_torchrun() or os.environ.get("RANK") == "0"
    out = check_output_dir(opts.out_dir) if writer else Path(opts.out_dir)
    raw = (out / "raw").absolute()     # the worker processes run from the repository root, not the caller's folder
    if writer:
        if raw.exists():
            shutil.rmtree(raw)
        raw.mkdir()
    cfg: dict[str, Any] = {"raw_dir": str(raw), "quick": opts.quick, "timeout_s": opts.timeout_s,
                           "max_bytes": opts.max_bytes, "target_s": 0.02 if opts.quick else 0.1,
                           "progress_files": True, **opts.extra}
    progress = _Progress(opts.progress)
    try:
        if under_torchrun():
            rank = int(os.environ["RANK"])
            method = (f"torchrun: {os.environ.get('WORLD_SIZE')} ranks, c10d rendezvous, "
                      f"{'NCCL' if _cuda() else 'gloo'}; rank 0 measures matmul and copy bandwidth")
            cfg["progress_files"] = False
            pr = _probe_for(opts) if rank == 0 else None
            if pr is not None:
                cfg["probe"] = pr.to_dict()
            try:
                result = rank_main(cfg, progress.update)
            except Exception as e:
                msg = str(e) if isinstance(e, RankFailed) else (
                    f"rank {rank} (host {socket.gethostname()}, node {_node_key()}) failed: {type(e).__name__}: "
                    f"{str(e).splitlines()[0] if str(e) else ''}")
                raise RankFailed(msg, keep_partial(out, msg) if rank == 0 else {}) from None
            if rank != 0:
                return {"status": "ok", "rank": rank}
        else:
            pr = _probe_for(opts)
            log(pr.summary() if pr.nvml else pr.note)
            gpus_used = bool(pr.gpus) and not opts.nvml_replay
            nproc = opts.nproc or default_nproc(pr, opts.quick, gpus_used)
            if gpus_used and nproc > len(pr.gpus):
                raise ProfileInputError(f"--nproc {nproc} is more than the {len(pr.gpus)} GPUs here")
            cfg["probe"] = pr.to_dict()
            if opts.nvml_replay:
                cfg["force_cpu"] = True     # a replayed GPU box: measure this machine's CPU path
            method = (f"{nproc} local process(es) spawned by planner profile, "
                      f"{'NCCL' if gpus_used else 'gloo'}; rank 0 measures matmul "
                      "and copy bandwidth")
            try:
                if nproc == 1:
                    result = _single(cfg, raw, opts.timeout_s, progress)
                else:
                    result = launch_local(cfg, nproc, raw, opts.timeout_s, progress)
            except RankFailed as e:
                raise RankFailed(f"{e}; partial results kept in {out}", keep_partial(out, str(e))) from None
    finally:
        progress.close()
    prof = analyze(pr, result, name=opts.name, quick=opts.quick, started=started, method=method)
    summary = write_outputs(prof, out, report=opts.report)
    summary["wall_time_s"] = round(time.time() - started, 2)
    write_text(out / "summary.json", json.dumps(summary, indent=1), "--out")
    return summary


def _cuda() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False


def _single(cfg: dict, raw: Path, timeout_s: float, progress: _Progress) -> dict:
    """One rank: still a process group of one (so the same code path), in a child process."""
    return launch_local(cfg, 1, raw, timeout_s, progress)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--rank-worker":
        sys.exit(worker_entry(sys.argv[1:]))
    print("usage: python -m profiles.profile --rank-worker CONFIG.json (internal; use `planner profile`)",
          file=sys.stderr)
    sys.exit(2)
