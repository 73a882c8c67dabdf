"""The machine a measurement ran on (:func:`probe_hardware`), and how close decode gets to the
memory-bandwidth limit.

Hardware: the CPU model and cores, the GPUs ``nvidia-smi`` lists, the devices the llama-server
binary can offload to (``--list-devices``), and whether the run was offloaded (GPU layers
requested and a GPU device present).

Bandwidth:

At batch size 1 every decoded token must stream the trunk's *active* weights from memory once:
every dense tensor, and of each MoE layer's routed experts only the ``expert_used_count`` of
``expert_count`` that the router picks. ``peak bandwidth / active bytes`` is therefore an upper
bound on vanilla tokens per second; the fraction of it a server reaches says whether decode is
bandwidth-bound (near 100%) or overhead-bound (far below). MTP output tokens are counted the same
way, so its fraction can rise above vanilla's: one verification pass reads the weights once for
several tokens.

Counted per token: every tensor of the trunk's blocks (routed experts scaled by used/count), the
output norm and the LM head (``output.weight``; ``token_embd`` when the head is tied). Not
counted: the token-embedding lookup (one row), the MTP block (it drafts; its cost is part of the
step overhead), the KV cache and activations (small at short context).
"""
from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypedDict, TypeVar

from ..errors import BandwidthError
from ..gguf.reader import read_header, tensor_nbytes
from ..jsontypes import JsonObject

T = TypeVar("T")

__all__ = ["HardwareInfo", "GpuInfo", "probe_hardware", "hardware_info", "server_devices", "gpu_layers_requested",
           "ActiveWeights", "active_weights", "peak_bandwidth", "PEAK_BANDWIDTH_GBS", "bandwidth_report",
           "format_bandwidth", "BandwidthError", "PEAK_BANDWIDTH_ENV", "Bandwidth", "HardwareJson"]

PEAK_BANDWIDTH_ENV = "GGUFMTP_PEAK_BANDWIDTH_GBS"

# Vendor-specified peak memory bandwidth in GB/s (10^9 bytes/s). Matched against the name
# nvidia-smi reports, most specific first: "H100 PCIe" must not fall through to "H100".
PEAK_BANDWIDTH_GBS: tuple[tuple[str, float], ...] = (
    ("GH200", 4000.0),
    ("H200", 4800.0),
    ("H100 NVL", 3900.0),
    ("H100 PCIe", 2000.0),
    ("H100", 3350.0),
    ("H800", 3350.0),
    ("B200", 8000.0),
    ("A100-SXM4-80GB", 2039.0),
    ("A100 80GB PCIe", 1935.0),
    ("A100", 1555.0),
    ("A800", 2039.0),
    ("L40S", 864.0),
    ("L40", 864.0),
    ("L4", 300.0),
    ("A10G", 600.0),
    ("A10", 600.0),
    ("RTX 5090", 1792.0),
    ("RTX 4090", 1008.0),
    ("RTX 3090", 936.0),
)

_EXPERT_TENSOR = re.compile(r"\.ffn_(gate|up|down|gate_up)_exps\.")
_BLOCK = re.compile(r"^blk\.(\d+)\.")


@dataclass(frozen=True)
class ActiveWeights:
    """Bytes the trunk reads per decoded token at batch size 1."""

    bytes_per_token: int
    dense_bytes: int  # every non-expert tensor counted (blocks, output norm, LM head)
    expert_bytes_total: int  # all routed experts of the trunk
    expert_fraction: float  # expert_used_count / expert_count (1.0 for dense models)
    lm_head: str | None  # the tensor used as LM head
    trunk_layers: int
    file_bytes: int

    def to_dict(self) -> JsonObject:
        return asdict(self)


class Bandwidth(TypedDict):
    """The ``bandwidth`` object of verify's result (:func:`bandwidth_report`)."""

    active_weights: JsonObject  # ActiveWeights.to_dict()
    active_bytes_per_token: int
    peak_bytes_per_second: float | None
    peak_source: str | None
    device: str | None
    limit_tokens_per_second: float | None
    tokens_per_second: dict[str, float | None]
    fraction_of_limit: dict[str, float | None]
    note: str | None


class GpuJson(TypedDict):
    name: str
    memory: str | None
    driver: str | None


class HardwareJson(TypedDict):
    """:class:`HardwareInfo` in its JSON form (the ``hardware`` object of verify/tune/profiles results)."""

    cpu: str | None
    cpu_cores: int | None
    cores: int | None
    cpu_cores_usable: int | None
    gpus: list[GpuJson]
    gpu: str | None
    server_devices: list[str]
    gpu_layers: int | str | None
    offloaded: bool
    backend: str
    os: str


def _arch_int(meta: Mapping[str, object], arch: str, key: str) -> int | None:
    v = meta.get(f"{arch}.{key}")
    return int(v) if isinstance(v, (int, float)) else None


def active_weights(path: str | os.PathLike) -> ActiveWeights:
    """Per-token weight traffic of the trunk of the GGUF at ``path`` (header only, no weights read)."""
    p = Path(path)
    h = read_header(p)
    arch = str(h.metadata.get("general.architecture") or "")
    blocks = _arch_int(h.metadata, arch, "block_count")
    if blocks is None:
        raise BandwidthError(f"{p}: no {arch}.block_count in the header")
    nextn = _arch_int(h.metadata, arch, "nextn_predict_layers") or 0
    trunk = blocks - nextn
    n_exp = _arch_int(h.metadata, arch, "expert_count") or 0
    n_used = _arch_int(h.metadata, arch, "expert_used_count") or 0
    frac = (n_used / n_exp) if n_exp and n_used else 1.0
    names = {t.name for t in h.tensors}
    head = "output.weight" if "output.weight" in names else ("token_embd.weight" if "token_embd.weight" in names else None)
    dense = experts = 0
    for t in h.tensors:
        nbytes = tensor_nbytes(t.shape, t.type_id)[1]
        m = _BLOCK.match(t.name)
        if m:
            if int(m.group(1)) >= trunk:
                continue  # the MTP block drafts; its reads are step overhead, not the trunk's
            if _EXPERT_TENSOR.search(t.name):
                experts += nbytes
            else:
                dense += nbytes
        elif t.name == head or t.name == "output_norm.weight":
            dense += nbytes
    return ActiveWeights(bytes_per_token=int(dense + experts * frac), dense_bytes=dense, expert_bytes_total=experts,
                         expert_fraction=frac, lm_head=head, trunk_layers=trunk, file_bytes=h.file_size)


def peak_bandwidth(gpu_name: str | None, override_gbs: float | None = None) -> tuple[float | None, str | None]:
    """(peak bytes/s, where the figure came from) for ``gpu_name``; ``override_gbs`` or
    $GGUFMTP_PEAK_BANDWIDTH_GBS win over the built-in table. (None, None) when unknown."""
    if override_gbs is None and os.environ.get(PEAK_BANDWIDTH_ENV):
        raw = os.environ[PEAK_BANDWIDTH_ENV]
        try:
            override_gbs = float(raw)
        except ValueError:
            raise BandwidthError(f"${PEAK_BANDWIDTH_ENV}={raw!r}: expected a number of GB/s") from None
        if override_gbs <= 0:
            raise BandwidthError(f"${PEAK_BANDWIDTH_ENV}={raw!r}: must be positive")
        return override_gbs * 1e9, f"${PEAK_BANDWIDTH_ENV}"
    if override_gbs is not None:
        if override_gbs <= 0:
            raise BandwidthError(f"peak bandwidth {override_gbs} GB/s: must be positive")
        return override_gbs * 1e9, "given"
    if not gpu_name:
        return None, None
    for key, gbs in PEAK_BANDWIDTH_GBS:
        if key.lower() in gpu_name.lower():
            return gbs * 1e9, f"vendor specification for {key}"
    return None, None


def bandwidth_report(model: str | os.PathLike, hardware: HardwareJson, tokens_per_second: dict[str, float | None],
                     peak_gbs: float | None = None) -> Bandwidth:
    """The ``bandwidth`` object of verify's result: active bytes, the limit, and per arm the fraction
    reached. The peak is looked up only for offloaded runs (the GPU's memory is what is read);
    CPU runs get a fraction only with an explicit ``peak_gbs`` (or the environment variable)."""
    aw = active_weights(model)
    gpu = hardware.get("gpu") if hardware.get("offloaded") else None
    if gpu or peak_gbs is not None or os.environ.get(PEAK_BANDWIDTH_ENV):
        peak, source = peak_bandwidth(gpu, peak_gbs)
    else:
        peak, source = None, None
    limit = peak / aw.bytes_per_token if peak and aw.bytes_per_token else None
    fractions = {arm: (tps / limit if tps and limit else None) for arm, tps in tokens_per_second.items()}
    note = None
    if peak is None:
        note = ("peak bandwidth unknown for this hardware: set --peak-bandwidth or "
                f"${PEAK_BANDWIDTH_ENV} (GB/s) to get the fraction")
    return {"active_weights": aw.to_dict(), "active_bytes_per_token": aw.bytes_per_token,
            "peak_bytes_per_second": peak, "peak_source": source, "device": gpu,
            "limit_tokens_per_second": limit, "tokens_per_second": dict(tokens_per_second),
            "fraction_of_limit": fractions, "note": note}


def format_bandwidth(b: JsonObject | None) -> str | None:
    """One line for verify's table, of a ``bandwidth`` object (:class:`Bandwidth`) as a result or a
    receipt holds it."""
    if not b:
        return None
    n = b["active_bytes_per_token"]
    size = f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"
    if not b.get("limit_tokens_per_second"):
        return f"bandwidth: active weights {size} per token; {b.get('note')}"
    fr = " · ".join(f"{arm} {f * 100:.1f}%" for arm, f in b["fraction_of_limit"].items() if f is not None)
    return (f"bandwidth: active weights {size} per token; limit {b['limit_tokens_per_second']:,.0f} tok/s at "
            f"{b['peak_bytes_per_second'] / 1e12:.2f} TB/s ({b['peak_source']}); reached: {fr}")


# ----------------------------------------------------------------------------- the machine


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as ``nvidia-smi`` lists it (``free_mib``: its free memory then)."""

    name: str
    memory: str | None = None
    driver: str | None = None
    free_mib: int | None = None


@dataclass(frozen=True)
class HardwareInfo:
    """The machine of a run (the ``hardware`` object of verify/tune/profiles results)."""

    cpu: str | None
    cpu_cores: int | None
    cpu_cores_usable: int | None
    gpus: tuple[GpuInfo, ...] = ()
    server_devices: tuple[str, ...] = ()
    gpu_layers: int | str | None = None
    offloaded: bool = False
    os: str = ""

    @property
    def gpu(self) -> str | None:
        """The first GPU's name (nvidia-smi), else the first device llama-server lists."""
        return self.gpus[0].name if self.gpus else (self.server_devices[0] if self.server_devices else None)

    @property
    def backend(self) -> str:
        return "gpu" if self.offloaded else "cpu"

    def to_dict(self) -> HardwareJson:
        """The JSON form (``cores`` repeats ``cpu_cores``: ggufmtp.provenance.card reads it)."""
        return {
            "cpu": self.cpu, "cpu_cores": self.cpu_cores, "cores": self.cpu_cores,
            "cpu_cores_usable": self.cpu_cores_usable,
            "gpus": [{"name": g.name, "memory": g.memory, "driver": g.driver} for g in self.gpus], "gpu": self.gpu,
            "server_devices": list(self.server_devices), "gpu_layers": self.gpu_layers, "offloaded": self.offloaded,
            "backend": self.backend, "os": self.os,
        }


def read_cpu_model() -> str | None:
    """The CPU's model name (/proc/cpuinfo, else ``platform.processor()``)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def nvidia_gpus(env: Mapping[str, str] | None = None) -> list[GpuInfo]:
    """The GPUs ``nvidia-smi`` lists that a process started with ``env`` (default: this one's) can
    use, in CUDA's order (:func:`visible_gpus`); none when it is missing or fails."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        p = subprocess.run([exe, "--query-gpu=index,uuid,name,memory.total,memory.free,driver_version",
                            "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    rows: list[tuple[str, str, GpuInfo]] = []
    for line in p.stdout.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) >= 6 and parts[2]:
            free = int(float(parts[4])) if parts[4].replace(".", "", 1).isdigit() else None
            rows.append((parts[0], parts[1], GpuInfo(parts[2], f"{parts[3]} MiB", parts[5], free)))
    return visible_gpus(rows, (env if env is not None else os.environ).get("CUDA_VISIBLE_DEVICES"))


def visible_gpus(rows: Sequence[tuple[str, str, T]], cuda_visible_devices: str | None) -> list[T]:
    """The ``(index, uuid, gpu)`` rows a CUDA process sees under ``CUDA_VISIBLE_DEVICES``, in its
    order: unset, every GPU; each entry an index or a (prefix of a) ``GPU-`` UUID; the list ends at the
    first entry that names no GPU or one already named, as CUDA reads it (so "" and "-1" hide all).
    A ladder worker pinned to one card, or a user's ``CUDA_VISIBLE_DEVICES=1``, is planned against
    that card's free memory alone, not every card nvidia-smi lists."""
    if cuda_visible_devices is None:
        return [g for _, _, g in rows]
    out: list[T] = []
    seen: set[int] = set()
    for entry in cuda_visible_devices.split(","):
        e = entry.strip()
        hit = [i for i, (idx, uuid, _) in enumerate(rows)
               if (e.isdigit() and int(e) == int(idx)) or (e.startswith("GPU-") and uuid.startswith(e))]
        if len(hit) != 1 or hit[0] in seen:
            break
        seen.add(hit[0])
        out.append(rows[hit[0]][2])
    return out


def server_devices(binary: Path) -> list[str]:
    """GPU devices llama-server can use (``--list-devices``); empty for a CPU-only build."""
    try:
        p = subprocess.run([str(binary), "--list-devices"], capture_output=True, text=True, timeout=60,
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return []
    devs = []
    seen = False
    for line in (p.stdout + p.stderr).splitlines():
        if line.strip().startswith("Available devices"):
            seen = True
            continue
        if seen and line.startswith((" ", "\t")) and line.strip() and line.strip() != "(none)":
            devs.append(line.strip())
    return devs


def gpu_layers_requested(gpu_layers: int | str | None) -> bool:
    """Whether ``--n-gpu-layers`` asks for any offload (> 0, ``all`` or ``auto``)."""
    if gpu_layers is None:
        return False
    if isinstance(gpu_layers, str):
        s = gpu_layers.strip().lower()
        if s in ("all", "auto"):
            return True
        try:
            return int(s) > 0
        except ValueError:
            return False
    return int(gpu_layers) > 0


def probe_hardware(binary: Path | None, gpu_layers: int | str | None) -> HardwareInfo:
    """The machine a run with llama-server ``binary`` and ``gpu_layers`` happens on."""
    devices = server_devices(binary) if binary else []
    try:
        affinity: int | None = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    return HardwareInfo(
        cpu=read_cpu_model(), cpu_cores=os.cpu_count(), cpu_cores_usable=affinity, gpus=tuple(nvidia_gpus()),
        server_devices=tuple(devices), gpu_layers=gpu_layers,
        offloaded=gpu_layers_requested(gpu_layers) and bool(devices),
        os=f"{platform.system()} {platform.release()} {platform.machine()}")


def hardware_info(binary: Path | None, gpu_layers: int | str | None) -> HardwareJson:
    """:func:`probe_hardware` in its JSON form."""
    return probe_hardware(binary, gpu_layers).to_dict()
