"""What hardware the miner advertises on-chain: its GPUs as torch sees them.

On a machine without CUDA the miner still runs (the torch engine on CPU), and it says so:
the spec is named after the CPU, with the system memory and a count of 1, and `kind` is
"cpu" so `miner register` can print that no GPU was found.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class HardwareSpec:
    """The (name, memory MiB, count) GPURegistry stores, and where it came from."""

    name: str
    memory_mib: int
    count: int
    kind: str  # "cuda", "cpu" or "config"

    def describe(self) -> str:
        if self.kind == "cpu":
            return (f"no CUDA device: CPU only, advertised as {self.name!r} with "
                    f"{self.memory_mib} MiB system memory, count 1")
        source = "from the config" if self.kind == "config" else "detected by torch"
        return f"{self.count} x {self.name} ({self.memory_mib} MiB each), {source}"


def cpu_model_name(cpuinfo: str) -> str | None:
    """The first "model name" in /proc/cpuinfo's text (None when it has none)."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("model name", "hardware", "processor model"):
            if value.strip():
                return " ".join(value.split())
    return None


def meminfo_total_mib(meminfo: str) -> int | None:
    """MemTotal from /proc/meminfo's text, in MiB."""
    for line in meminfo.splitlines():
        if line.startswith("MemTotal:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                return int(parts[1]) // 1024
    return None


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def cpu_spec() -> HardwareSpec:
    """The CPU-only spec: CPU model name and total system memory."""
    name = cpu_model_name(_read("/proc/cpuinfo")) or platform.processor() or platform.machine()
    memory = meminfo_total_mib(_read("/proc/meminfo"))
    if memory is None:
        try:
            memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20)
        except (ValueError, OSError, AttributeError):
            memory = 1
    return HardwareSpec(f"CPU {name or 'unknown'}", max(1, int(memory)), 1, "cpu")


def detect() -> HardwareSpec:
    """The CUDA GPUs torch sees (name of device 0, its total memory, device count), or the
    CPU spec when there are none."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        return cpu_spec()
    props = torch.cuda.get_device_properties(0)
    return HardwareSpec(str(props.name), int(props.total_memory) // (1 << 20), int(count),
                        "cuda")
