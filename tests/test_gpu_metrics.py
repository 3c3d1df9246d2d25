"""GPU memory gauges: absent without a GPU, per device with one (a GPU cannot run here,
so the CUDA runtime is stood in for through the two calls the collector makes)."""

from __future__ import annotations

import sys
from types import SimpleNamespace

from prometheus_client import generate_latest

from rag.metrics import REGISTRY


def _has_gpu() -> bool:
    """Whether this host has a GPU, asked the way an operator would: NVML, else torch."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount() > 0
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVML library or no driver
        pass
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def test_gauges_follow_the_host():
    """Without a GPU there are no gauges; on a GPU host, device 0 reports its real memory."""
    text = generate_latest(REGISTRY).decode()
    if not _has_gpu():
        assert "gpu_memory_used_bytes" not in text
        return
    samples = {(m.name, s.labels.get("device")): s.value
               for m in REGISTRY.collect() for s in m.samples if m.name.startswith("gpu_memory")}
    total, used = samples[("gpu_memory_total_bytes", "0")], samples[("gpu_memory_used_bytes", "0")]
    assert total > 2**30 and 0 <= used <= total


def test_gauges_per_device_when_cuda_reports_memory(monkeypatch):
    gib = 1024**3
    cuda = SimpleNamespace(is_available=lambda: True, device_count=lambda: 2,
                           mem_get_info=lambda i: ((100 - 10 * i) * gib, 141 * gib))
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=cuda))
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML: the torch path
    samples = {(m.name, s.labels.get("device")): s.value
               for m in REGISTRY.collect() for s in m.samples if m.name.startswith("gpu_memory")}
    assert samples == {("gpu_memory_total_bytes", "0"): 141 * gib, ("gpu_memory_total_bytes", "1"): 141 * gib,
                       ("gpu_memory_used_bytes", "0"): 41 * gib, ("gpu_memory_used_bytes", "1"): 51 * gib}
    assert 'gpu_memory_used_bytes{device="1"}' in generate_latest(REGISTRY).decode()
