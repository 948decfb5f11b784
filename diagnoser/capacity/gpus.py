"""Common accelerators' memory, and SGLang's automatic ``--mem-fraction-static`` for one of them.

**Usable memory** is what the driver reports as the device's total: ``nvidia-smi --query-gpu=memory.total``
(MiB) on NVIDIA, rocminfo's memory pool size on AMD. It is a little below the marketed figure, and it is
the number SGLang's automatic fraction reads (``get_device_memory_capacity`` in
``python/sglang/srt/utils/common.py`` at v0.5.23). The free memory when the weights start loading (SGLang's
"Load weight begin. avail mem=X GB", the ``pre`` of its pool formula) is lower again, by the CUDA context
and the distributed init: :data:`CONTEXT_GIB` is the estimate used when no start-up log says.

The marketed figures are the vendors' datasheets: NVIDIA H100 / H200 / H20 / B200 / A100 / L40S / L4 / A10
product pages (nvidia.com/en-us/data-center/<product>/), AMD Instinct MI300X / MI325X pages (amd.com). The
driver figures are what ``nvidia-smi`` prints on those parts as commonly reported; an entry marked
``approx`` is the marketed figure converted to MiB because no driver figure was at hand. A different SKU
(a MIG slice, another memory size) needs ``--gpu-mem-gb``.
"""

from __future__ import annotations

from dataclasses import dataclass

from diagnoser.capacity.kvbytes import CapacityInputError
from diagnoser.capacity.pool import CUDA_CONTEXT_GIB
from diagnoser.engines.sglang.versions import NEWEST_KNOWN, Version, fmt

CONTEXT_GIB = CUDA_CONTEXT_GIB  # usable memory minus the free memory before weights (CUDA context, NCCL)


@dataclass(frozen=True, slots=True)
class Gpu:
    name: str
    marketed: str  # the vendor's figure, as marketed
    usable_mib: int  # what the driver reports as total memory
    platform: str = "cuda"  # cuda, rocm or cpu (SGLang captures prefill CUDA graphs by default on CUDA only)
    approx: bool = False
    aliases: tuple[str, ...] = ()

    @property
    def usable_gib(self) -> float:
        return self.usable_mib / 1024

    def describe(self) -> str:
        return f"{self.name}: {self.marketed} marketed, {'≈' if self.approx else ''}{self.usable_gib:.1f} GiB usable"


GPUS: tuple[Gpu, ...] = (
    Gpu("H100", "80 GB HBM3", 81559, aliases=("h100-sxm", "h100-80gb", "h100-sxm5", "h800", "h100-pcie")),
    Gpu("H100-NVL", "94 GB HBM3", 95830, aliases=("h100nvl",)),
    Gpu("H200", "141 GB HBM3e", 143771, aliases=("h200-sxm", "h200-nvl", "gh200-141gb")),
    Gpu("H20", "96 GB HBM3", 97871),
    Gpu("B200", "180 GB HBM3e", 183359, aliases=("b200-sxm", "hgx-b200")),
    Gpu("A100-80GB", "80 GB HBM2e", 81920, aliases=("a100-80g", "a100-sxm4-80gb", "a800", "a800-80gb")),
    Gpu("A100-40GB", "40 GB HBM2", 40960, aliases=("a100", "a100-40g", "a100-sxm4-40gb")),
    Gpu("L40S", "48 GB GDDR6", 46068, aliases=("l40",)),
    Gpu("L4", "24 GB GDDR6", 23034),
    Gpu("A10G", "24 GB GDDR6", 23028, aliases=("a10",)),
    Gpu("RTX-4090", "24 GB GDDR6X", 24564, aliases=("4090", "rtx4090")),
    Gpu("MI300X", "192 GB HBM3", 196592, platform="rocm", aliases=("mi300",)),
    Gpu("MI325X", "256 GB HBM3E", 262144, platform="rocm", approx=True),
)


def _key(s: str) -> str:
    return s.strip().lower().replace(" ", "-").replace("_", "-")


def find_gpu(name: str) -> Gpu:
    """The GPU called ``name`` (case and separators ignored); one sentence naming the known ones if none."""
    k = _key(name)
    for g in GPUS:
        if k == _key(g.name) or k in (_key(a) for a in g.aliases):
            return g
    raise CapacityInputError(f"unknown --gpu {name!r}; use one of {', '.join(g.name for g in GPUS)}, "
                             "or give its memory with --gpu-mem-gb")


def gpu_help() -> str:
    return "; ".join(g.describe() for g in GPUS)


# -- SGLang's automatic mem_fraction_static -----------------------------------------------------------------
@dataclass(slots=True)
class AutoFraction:
    fraction: float
    reserved_mib: float
    chunked_prefill_size: int | None
    cuda_graph_max_bs: int | None
    formula: str  # one line: what SGLang reserved and why
    era: str  # the versions this rule is SGLang's for


def _defaults_0523(gib: float, tp: int) -> tuple[int, int]:
    """chunked_prefill_size and the decode CUDA-graph max batch by GPU class (v0.5.23 memory_hook.py)."""
    if gib < 20:
        return 2048, 8
    if gib < 35:
        return 4096, 48 if tp < 4 else 160
    if gib < 60:
        return 4096, 32 if tp < 4 else 160
    if gib < 160:
        return 8192, 256 if tp < 4 else 512
    return 16384, 512


def _defaults_053(gib: float, tp: int) -> tuple[int, int]:
    """The same table in the v0.5.3 era (smaller GPUs got less)."""
    if gib < 20:
        return 2048, 8
    if gib < 35:
        return 2048, 16 if tp < 4 else 80
    if gib < 60:
        return 4096, 32 if tp < 4 else 160
    if gib < 160:
        return 8192, 256 if tp < 4 else 512
    return 16384, 512


def prefill_graph_sizes(max_tokens: int) -> int:
    """How many prefill CUDA graphs SGLang captures up to ``max_tokens`` (``generate_prefill_cuda_graph_batch_sizes``)."""
    sizes = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32)) + list(range(576, 1025, 64))
             + list(range(1280, 4097, 256)) + list(range(4608, max_tokens + 1, 512)))
    return sum(1 for s in sizes if s <= max_tokens)


def auto_mem_fraction(gpu_mib: float, tp: int = 1, version: Version | None = None, *, pp: int = 1,
                      chunked_prefill_size: int | None = None, cuda_graph_max_bs: int | None = None,
                      attn_dp: int = 1, mla: bool = False, platform: str = "cuda",
                      max_running_requests: int | None = None, max_prefill_tokens: int = 16384) -> AutoFraction:
    """SGLang's ``mem_fraction_static`` when the flag is not given, for a GPU of ``gpu_mib`` usable MiB.

    * v0.5.14+ (checked at v0.5.23, ``python/sglang/srt/arg_groups/memory_hook.py``
      ``handle_gpu_memory_settings``): reserved MiB = 512 + 1.5 × max(chunk, 2048) + 1024 × tp × pp / 8 +
      the graph reserve (2 × decode max batch; with DP attention 3 × max batch × DP, 1.5 × more above 300;
      prefill graphs on CUDA: 8 MiB each, or 1.5 GiB for MLA), at least 10 GiB on GPUs above 60 GiB;
      fraction = round((mem − reserved) / mem, 3). The 0.5.14–0.5.22 releases are taken to match.
    * v0.5.3–v0.5.13: 512 + 1.5 × max(chunk, 2048) + 2 × decode max batch + 1024 × tp × pp / 8, at least
      10 GiB above 60 GiB (``python/sglang/srt/server_args.py`` ``_handle_gpu_memory_settings`` at v0.5.3).
    * v0.4.8–v0.5.2: reserved GiB = 2.8 + tp × pp / 10 below 35 GiB, 9.5 + tp × pp / 2 below 90, 12 + tp × pp / 2
      below 160, else 32; + 4 with DP attention (``server_args.py`` at v0.4.8).
    * up to v0.4.7: by TP size, 0.88 / 0.87 / 0.85 / 0.81 / 0.79 for TP 1 / 2 / 4 / 8 / 16+; from 0.4.6,
      GPUs above 80 GiB use (mem − 13 GiB) / mem.

    Speculative decoding, DeepEP and multimodal models reserve more; they are not modelled here.
    """
    v = version or NEWEST_KNOWN
    gib = gpu_mib / 1024
    tp, pp = max(1, tp), max(1, pp)
    if v >= (0, 5, 3):
        new = v >= (0, 5, 14)
        d_chunk, d_bs = (_defaults_0523 if new else _defaults_053)(gib, tp)
        chunk = chunked_prefill_size or d_chunk
        bs = cuda_graph_max_bs or d_bs
        if platform == "cpu" and v >= (0, 5, 10):
            bs = cuda_graph_max_bs or 32  # the CPU graph batch limit is --torch-compile-max-bs (default 32; server_args.py at v0.5.10)
        if cuda_graph_max_bs is None and max_running_requests is not None and new:
            bs = min(bs, max_running_requests)
        act = 1.5 * max(chunk if chunk > 0 else max_prefill_tokens, 2048)  # chunking off: --max-prefill-tokens
        par = tp * pp / 8 * 1024
        graph = 2.0 * bs
        parts = [f"512 + 1.5 × {max(chunk, 2048):,} (chunk) + {par:,.0f} (TP {tp})", f"{graph:,.0f} (decode graphs, max bs {bs})"]
        if new and attn_dp > 1:
            dpg = bs * attn_dp * 3 + (bs * attn_dp * 1.5 if bs > 300 else 0)
            graph += dpg
            parts.append(f"{dpg:,.0f} (DP attention {attn_dp})")
        if new and platform == "cuda":
            pg = 1536.0 if mla else 8.0 * prefill_graph_sizes(min(chunk, 8192) if mla else chunk)
            graph += pg
            parts.append(f"{pg:,.0f} (prefill graphs)")
        reserved = 512 + act + par + graph
        floor = gpu_mib > 60 * 1024 and reserved < 10 * 1024
        if floor:
            reserved = 10 * 1024.0
        frac = round((gpu_mib - reserved) / gpu_mib, 3)
        text = (f"SGLang {'0.5.14+' if new else '0.5.3–0.5.13'} reserves " + " + ".join(parts) + " MiB"
                + (" → the 10 GiB floor" if floor else f" = {reserved / 1024:.1f} GiB")
                + f" of {gib:.1f} GiB: fraction {frac}")
        return AutoFraction(frac, reserved, chunk, bs, text, "0.5.14–0.5.23" if new else "0.5.3–0.5.13")
    if v >= (0, 4, 8):
        if gib < 35:
            res = 2.8 + tp * pp / 10
        elif gib < 90:
            res = 9.5 + tp * pp / 2
        elif gib < 160:
            res = 12 + tp * pp / 2
        else:
            res = 32.0
        res += 4 if attn_dp > 1 else 0
        frac = round((gib - res) / gib, 3)
        return AutoFraction(frac, res * 1024, chunked_prefill_size, cuda_graph_max_bs,
                            f"SGLang 0.4.8–0.5.2 reserves {res:g} GiB of {gib:.1f} GiB: fraction {frac}", "0.4.8–0.5.2")
    by_tp = 0.88 if tp == 1 else 0.87 if tp == 2 else 0.85 if tp <= 4 else 0.81 if tp <= 8 else 0.79
    if v < (0, 4, 0) and 4 < tp <= 8:
        by_tp = 0.82
    if v >= (0, 4, 6) and gib > 80:
        by_tp = round((gib - 13) / gib, 3)
        return AutoFraction(by_tp, 13 * 1024, chunked_prefill_size, cuda_graph_max_bs,
                            f"SGLang 0.4.6–0.4.7 keeps 13 GiB of a {gib:.1f} GiB GPU: fraction {by_tp}", "0.4.6–0.4.7")
    return AutoFraction(by_tp, (1 - by_tp) * gpu_mib, chunked_prefill_size, cuda_graph_max_bs,
                        f"SGLang {fmt(v)} sets {by_tp} at TP {tp}", "0.3–0.4.7")


__all__ = ["CONTEXT_GIB", "GPUS", "AutoFraction", "Gpu", "auto_mem_fraction", "find_gpu", "gpu_help", "prefill_graph_sizes"]
