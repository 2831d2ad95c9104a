#!/usr/bin/env python3
"""servesim: an LLM server is a batch scheduler with a KV cache.

Subcommands:
  capacity   the memory plan: weights, KV per token, KV blocks, max concurrency, decode step cost
  simulate   one run of a vLLM-style scheduler on a virtual clock (continuous batching,
             chunked prefill, paged KV cache with prefix sharing and recompute preemption)
  sweep      the same run at every combination of up to two loads or settings, one table
  search     the highest load within an SLO, or the cheapest deployment that serves a load
  plan       replicas window by window over a day of traffic, as an autoscaler would run them
  loadgen    the same metrics measured from a real OpenAI-compatible server's stream
  merge      loadgen reports from several client machines (or shards of one schedule) as one run
  compare    a measured run's exact shape simulated, measured and predicted side by side
  calibrate  fit the cost model's bandwidth, FLOPS and overheads to measured runs
  validate   replay published runs and score the cost models on runs they were not fitted to
  explain    the tuning runbook's decision table applied to a scrape or a report
  presets    the hardware and model presets

The file reads top to bottom in the order the lesson teaches, core first:
  presets, memory plan, cost model (the roofline), block pool, request, scheduler (the per-step
  rule), engine (and simulate()), workload (synthetic requests, conversations, arrivals), metrics;
then the variations on the core, one part each: the kernel cost model, the in-flight cap, static
batching, slots, prefill/decode disaggregation, a host tier for the KV cache, tensor and pipeline
parallelism, replicas behind a router,
mixtures of experts, speculative decoding; then speed (the event engine, tested against the
per-step rule); then settings (every knob described once, as a row of RunSpec) and the API the
command line calls (run, sweeps, search); then the edges: readers (presets, traces in six
formats, measured runs, reports), load generator, calibration, comparison with measured runs,
diagnosis, reports, pictures (SVG) and the command line. No part uses a name defined in a later
one (code/tests/test_layout.py). Standard library only.
"""
from __future__ import annotations

import os
import signal
import sys

if __name__ == "__main__":      # Ctrl-C or SIGTERM while the rest loads: one line, as later on
    def stopped_while_loading(signum, frame):
        os.write(2, b"servesim: interrupted\n" if signum == signal.SIGINT else b"servesim: terminated\n")
        os._exit(130 if signum == signal.SIGINT else 143)
    signal.signal(signal.SIGINT, stopped_while_loading)
    signal.signal(signal.SIGTERM, stopped_while_loading)

import argparse
import base64
import concurrent.futures
import contextlib
import bisect
import heapq
import csv
import datetime
import difflib
import email.utils
import errno
import functools
import hashlib
import http.client
import io
import itertools
import json
import math
import operator
import random
import re
import shlex
import socket
import ssl
import tempfile
import threading
import time
import urllib.parse
from collections import Counter, OrderedDict, defaultdict, deque
from dataclasses import MISSING, asdict, dataclass, field, fields, is_dataclass, replace
from typing import Callable, Iterable, Iterator, Optional
from xml.sax.saxutils import escape as xml_escape

if sys.version_info < (3, 10):
    sys.exit(f"servesim needs Python 3.10 or newer; this is {sys.version.split()[0]}")

GIB = 2**30
KIB = 2**10


class UserError(Exception):
    """Bad input a user can fix: a flag, a file, a value. Exit code 2."""


class CapacityError(Exception):
    """It does not fit, a server is unreachable, or a request failed. Exit code 1."""


class Terminated(Exception):
    """SIGTERM, raised in the main thread so that a run ends the way Ctrl-C ends it."""


# ---------------------------------------------------------------------------------------------
# Presets: datasheet peaks times an efficiency factor. A user adds their own device or model
# with a JSON file of the same fields (--hardware my-gpu.json).
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Hardware:
    name: str
    memory_gib: float          # as nvidia-smi reports it
    bandwidth_gbs: float       # HBM or GDDR peak, GB/s
    tflops: float              # dense BF16 peak
    mbu: float = 0.75          # share of peak bandwidth a decode step achieves
    mfu: float = 0.5           # share of peak FLOPs a prefill achieves
    step_overhead_ms: float = 1.0   # scheduling and kernel launches, per step
    reserve_gib: float = 2.0   # activations and CUDA graphs, kept out of the KV cache
    seq_overhead_ms: float = 0.0    # per sequence per step (sampling, per-slot work); calibrated on CPUs
    # What the kernel-level cost model (--cost-model kernels) uses; see its section for the sources.
    fp8_tflops: float = 0.0            # dense FP8 peak; 0: no FP8 tensor cores (FP8 weights then compute in BF16)
    gemm_efficiency: float = 0.8       # share of dense peak a large BF16 GEMM achieves
    attention_efficiency: float = 0.6  # share of dense peak flash attention achieves in prefill
    bandwidth_efficiency: float = 0.9  # share of peak bandwidth a streaming read achieves
    # Between devices: NVLink or PCIe, GB/s per direction per GPU, and the latency of one step of a
    # ring all-reduce (NCCL's hwLat: 0.6 us on NVLink, 1.0 us over PCIe). 0 GB/s: none known, so
    # tensor parallelism refuses this device. A file that gives the bandwidth but not the latency
    # gets PCIe's 1.0 us.
    interconnect_gbs: float = 0.0
    interconnect_latency_us: float = 1.0
    link_efficiency: float = 0.85      # share of interconnect_gbs an all-reduce's bytes move at (see Parallel)
    # Whether every GPU reaches every other over NVLink (or AMD's Infinity Fabric), and, over PCIe,
    # whether two can read each other's memory: what lets an engine run its own all-reduce (Parallel).
    nvlink: bool = False
    peer_to_peer: bool = True
    price_per_hour: float = 0.0        # typical on-demand USD per GPU-hour (see the presets' sources)
    # What the kernel model charges each kernel, however small: its floor inside a CUDA graph, and
    # the launch it adds outside one (0 on a CPU: llama.cpp's overheads are calibrated instead).
    kernel_floor_us: float = 1.3
    kernel_launch_us: float = 1.2
    # Between the GPU and host memory (PCIe), GB/s per direction, for a host tier of the KV cache;
    # and the host memory one GPU's share of the priced instance has (0: not stated).
    host_link_gbs: float = 0.0
    host_memory_gib: float = 0.0

    @property
    def link_bytes_per_second(self) -> float:
        """What a collective's bytes move at between two of these devices: the link's achieved rate."""
        return self.interconnect_gbs * 1e9 * self.link_efficiency


@dataclass(frozen=True)
class ModelSpec:
    name: str
    params: float              # parameter count
    layers: int
    kv_heads: int
    head_dim: int
    weight_dtype_bytes: float = 2.0   # 2 for BF16, 34/32 for llama.cpp's Q8_0
    kv_dtype_bytes: int = 2
    # What the kernel-level cost model needs from the model's config.json; 0 means not given.
    hidden_size: int = 0       # 0: heads x head_dim
    heads: int = 0             # query heads; 0: kv_heads
    vocab_size: int = 0        # 0: unknown, so embeddings are priced as ordinary weights
    tie_word_embeddings: bool = False
    # The longest request the model takes, config.json's max_position_embeddings: vLLM's default
    # --max-model-len. 0: unknown (servesim then takes 4,096).
    max_position_embeddings: int = 0
    # Mixture of experts; 0 means dense. All experts sit in memory; a token computes only the
    # shared weights (attention, embeddings, router) and its experts_per_token experts.
    active_params: float = 0.0     # parameters one token computes
    experts: int = 0               # experts per MoE layer
    experts_per_token: int = 0
    expert_dtype_bytes: float = 0.0   # 0: weight_dtype_bytes (gpt-oss keeps its experts in MXFP4)
    # Sliding-window attention (gpt-oss): these layers keep only the last sliding_window tokens, in
    # a small pool of their own, so only the other layers grow the KV cache with the context.
    sliding_layers: int = 0
    sliding_window: int = 0
    expert_share: float = 1.0      # the share of the experts one device holds (expert parallelism)

    @property
    def expert_params(self) -> float:
        """All the experts' parameters, every layer's, every expert's."""
        if not self.experts:
            return 0.0
        one = (self.params - self.active_params) / (self.experts - self.experts_per_token)
        return one * self.experts

    @property
    def shared_params(self) -> float:
        return self.params - self.expert_params

    @property
    def expert_bytes(self) -> float:
        """The experts' bytes on one device."""
        return self.expert_params * (self.expert_dtype_bytes or self.weight_dtype_bytes) * self.expert_share

    @property
    def weight_bytes(self) -> float:
        return self.shared_params * self.weight_dtype_bytes + self.expert_bytes

    @property
    def compute_params(self) -> float:
        """Parameters one token computes: all of a dense model, the active ones of a MoE."""
        return self.active_params or self.params

    @property
    def query_heads(self) -> int:
        return self.heads or self.kv_heads

    @property
    def embedding_params(self) -> float:
        """The token embedding table: looked up a row per token, never streamed whole."""
        return self.vocab_size * (self.hidden_size or self.query_heads * self.head_dim)

    @property
    def lm_head_params(self) -> float:
        """The output projection to the vocabulary (the embedding table itself when tied)."""
        return self.embedding_params

    @property
    def kv_bytes_per_token(self) -> int:
        # A key and a value vector per layer per KV head. Grouped-query attention is why this
        # uses kv_heads, not the query heads: it cuts the cache by the group size.
        return 2 * (self.layers - self.sliding_layers) * self.kv_heads * self.head_dim * self.kv_dtype_bytes


# Two RTX PRO 6000s over PCIe Gen5, measured with NCCL (vLLM's PyNcclCommunicator, BF16 all-reduce,
# CUDA-graphed): 12.7 us for 4 KB, 41 us for 1 MiB, 587 us for 20 MiB, i.e. 36.4 GB/s (0.58 of
# 63) plus ~12 us, which is 6.6 + 2 x 3.0 us (casys-kaist/LLMServingSim
# profiler/perf/RTXPRO6000/hardware.yaml at 1b2cc02d, "measured: interconnect", Server Edition).
# Measured on two ranks and for all-reduce only: larger groups and the expert-parallel gathers
# (all-gather 683 us, reduce-scatter 787 us for 20 MiB there) are priced from it, a little fast.
RTX_PRO_6000 = Hardware("rtx-pro-6000-96gb", 95.59, 1792, 503.8, fp8_tflops=1007.6, interconnect_gbs=63,
                        interconnect_latency_us=3.0, link_efficiency=0.58, price_per_hour=1.85, host_link_gbs=63)

HARDWARE = {h.name: h for h in [
    # Datasheets: NVIDIA H100, A100, H200 and L4 datasheets; the Ada Lovelace architecture
    # whitepaper for the RTX 4090 (165.2 dense BF16 and 330.3 dense FP8 TFLOPS with FP32 accumulate).
    # Sparsity figures are halved to dense. Kernel efficiencies (for --cost-model kernels), measured:
    # GEMM from the "Maximum Achievable Matmul FLOPS" table in stas00/ml-engineering
    # (compute/accelerator: A100 SXM 85.9%, H100 SXM 80.1%, B200 77.6%, MI300X 60.1%) and, for the
    # 4090, cuBLAS BF16 GEMMs of 150-168 TFLOPS (mli/transformers-benchmarks#4,
    # zzc0721/torch-performance-test-data#78); attention from FlashAttention-2 (50-73% of A100 peak,
    # arXiv 2307.08691), FlashAttention-3 (75% of H100, 740 TFLOPS, arXiv 2407.08608) and FA2 on the
    # 4090 (151-169 TFLOPS, apache/tvm flash_perf); bandwidth from clpeak on the 4090 (921 GB/s,
    # krrishnarraj/clpeak#106). Devices without a measurement keep the defaults (0.8, 0.6, 0.9).
    # Interconnect per direction: NVLink 4 450 GB/s (H100, H200), NVLink 3 300 (A100), NVLink 5 900
    # (B200), Infinity Fabric 7 x 64 (MI300X); PCIe Gen4 x16 31.5, Gen5 x16 63. The GeForce RTX 4090's
    # driver gives two of them no peer-to-peer access (tinygrad/open-gpu-kernel-modules, a patch to
    # turn it back on), so vLLM's own all-reduce refuses them and NCCL runs. A step of a ring
    # all-reduce costs NCCL's hwLat: 0.6 us on NVLink, 1.0 us over PCIe (NVIDIA/nccl src/graph/tuning.cc
    # at 5067397c, LL protocol; see Parallel). A kernel's floor in a CUDA graph, 1.3 us, and the 1.2 us
    # a launch adds outside one: a streaming kernel on 64 KB takes 1.3 us graphed and 2.5 us eager on
    # an H200 (te42kyfo/gpu-benches gpu-small-kernels, h200_graph.txt and h200.txt). Prices: typical on-demand USD per GPU-hour as read in
    # Aug-Sep 2026 from Lambda (H100 3.99, A100 2.79, B200 6.69; 8-GPU instances), Crusoe (H200 4.29,
    # MI300X 3.45), AWS us-east-1 g6.xlarge (L4 0.80), RunPod secure cloud (RTX 4090 0.74,
    # L40S 1.09) and Hyperstack (RTX PRO 6000 1.85); pass --price-per-hour for your own.
    # To host memory (a host tier of the KV cache): each GPU's own PCIe link, per direction, Gen4
    # x16 31.5 GB/s (A100, L4, RTX 4090, L40S), Gen5 x16 63 (H100, H200, B200, RTX PRO 6000,
    # MI300X). Host memory is stated only where the priced instance is one GPU: AWS g6.xlarge, 16 GiB.
    Hardware("h100-sxm-80gb", 79.6, 3350, 989, fp8_tflops=1979, gemm_efficiency=0.80, attention_efficiency=0.75,
             interconnect_gbs=450, interconnect_latency_us=0.6, nvlink=True, price_per_hour=3.99, host_link_gbs=63),
    Hardware("a100-sxm-80gb", 80.0, 2039, 312, gemm_efficiency=0.86, attention_efficiency=0.6,
             interconnect_gbs=300, interconnect_latency_us=0.6, nvlink=True, price_per_hour=2.79, host_link_gbs=31.5),
    Hardware("h200-141gb", 140.4, 4800, 989, fp8_tflops=1979, gemm_efficiency=0.80, attention_efficiency=0.75,
             interconnect_gbs=450, interconnect_latency_us=0.6, nvlink=True, price_per_hour=4.29, host_link_gbs=63),
    Hardware("l4-24gb", 22.5, 300, 121, reserve_gib=1.5, fp8_tflops=242.5,
             interconnect_gbs=31.5, interconnect_latency_us=1.0, price_per_hour=0.80, host_link_gbs=31.5,
             host_memory_gib=16),
    Hardware("rtx-4090-24gb", 24.0, 1008, 165.2, reserve_gib=1.5, fp8_tflops=330.3, gemm_efficiency=0.9,
             attention_efficiency=0.9, bandwidth_efficiency=0.91, interconnect_gbs=31.5,
             interconnect_latency_us=1.0, peer_to_peer=False, price_per_hour=0.74, host_link_gbs=31.5),
    # Memory as nvidia-smi (or rocm-smi) reports it. L40S datasheet; RTX PRO Blackwell architecture
    # whitepaper table 4 (Workstation Edition; FP8 is twice its BF16); NVIDIA HGX B200 table;
    # AMD Instinct MI300X (1,307.4 BF16 = 2,100 MHz x 1,216 matrix cores x 512 FLOPs per clock).
    Hardware("l40s-48gb", 44.99, 864, 362.05, fp8_tflops=733, interconnect_gbs=31.5, interconnect_latency_us=1.0,
             price_per_hour=1.09, host_link_gbs=31.5),
    RTX_PRO_6000,
    # Its Server Edition (passive, for servers and clouds) runs its GDDR7 slower: NVML reports a
    # 12,481 MHz memory clock on its 512-bit bus, 1,598 GB/s (the hardware.yaml above, "spec"), where
    # the Workstation Edition's 14,001 MHz gives 1,792. Its boost clock is not on record there, so its
    # FLOPS are the Workstation's; its link is the one measured above; Hyperstack's RTX PRO 6000 price
    # does not name the edition.
    replace(RTX_PRO_6000, name="rtx-pro-6000-server-96gb", bandwidth_gbs=1598),
    Hardware("b200-180gb", 179.06, 7700, 2250, fp8_tflops=4500, gemm_efficiency=0.78, interconnect_gbs=900,
             interconnect_latency_us=0.6, nvlink=True, price_per_hour=6.69, host_link_gbs=63),
    Hardware("mi300x-192gb", 191.69, 5300, 1307.4, fp8_tflops=2614.9, gemm_efficiency=0.60, interconnect_gbs=448,
             interconnect_latency_us=0.6, nvlink=True, price_per_hour=3.45, host_link_gbs=63),
    # Effective figures for a 4-vCPU box running llama.cpp, meant to be calibrated: the
    # efficiencies are folded into the peaks (20 GB/s achieved, 0.1 TFLOPS achieved).
    Hardware("cpu-4vcpu", 16.0, 20, 0.1, mbu=1.0, mfu=1.0, step_overhead_ms=2.0, reserve_gib=0.5,
             kernel_floor_us=0.0, kernel_launch_us=0.0),
]}

# Where each preset's price_per_hour comes from (see the sources above), shown by `presets`.
PRICE_SOURCES = {"h100-sxm-80gb": "Lambda", "a100-sxm-80gb": "Lambda", "b200-180gb": "Lambda", "h200-141gb": "Crusoe",
                 "mi300x-192gb": "Crusoe", "l4-24gb": "AWS g6.xlarge", "rtx-4090-24gb": "RunPod",
                 "l40s-48gb": "RunPod", "rtx-pro-6000-96gb": "Hyperstack", "rtx-pro-6000-server-96gb": "Hyperstack"}

MODELS = {m.name: m for m in [
    # Shapes from each model's config.json on Hugging Face (meta-llama/Llama-3.1-8B, -70B,
    # Qwen/Qwen2.5-7B, HuggingFaceTB/SmolLM2-135M), max_position_embeddings included (131,072 for
    # Llama 3.1 and Qwen2.5-7B, 8,192 for SmolLM2; Qwen3's 40,960; gpt-oss's 131,072, which is its
    # YaRN factor 32 x 4,096, what vLLM derives too).
    ModelSpec("llama-3.1-8b", 8.03e9, 32, 8, 128, hidden_size=4096, heads=32, vocab_size=128256,
              max_position_embeddings=131072),
    ModelSpec("llama-3.1-70b", 70.6e9, 80, 8, 128, hidden_size=8192, heads=64, vocab_size=128256,
              max_position_embeddings=131072),
    # meta-llama/Llama-3.1-405B config.json: 126 layers, hidden 16,384, 128 heads, 8 KV heads,
    # intermediate 53,248; 405.85 B parameters counted from those shapes (untied embeddings).
    ModelSpec("llama-3.1-405b", 405.85e9, 126, 8, 128, hidden_size=16384, heads=128, vocab_size=128256,
              max_position_embeddings=131072),
    ModelSpec("qwen2.5-7b", 7.62e9, 28, 4, 128, hidden_size=3584, heads=28, vocab_size=152064,
              max_position_embeddings=131072),
    ModelSpec("smollm2-135m-q8_0", 134.5e6, 30, 3, 64, weight_dtype_bytes=34 / 32, hidden_size=576, heads=9,
              vocab_size=49152, tie_word_embeddings=True, max_position_embeddings=8192),
    # What people deploy now, from each config.json (Qwen/Qwen3-8B, -32B, -30B-A3B;
    # openai/gpt-oss-20b, -120b; meta-llama/Llama-3.3-70B-Instruct) and the model cards' parameter
    # counts. gpt-oss keeps its experts in MXFP4: 4 bits plus an 8-bit scale per 32 values, 17/32 of
    # a byte; its other weights in BF16; half its layers attend to a 128-token sliding window. Its
    # cards count active parameters without the input embedding (3.61 B, 5.13 B); active_params
    # counts every weight a token uses, so the embedding's 201,088 x 2,880 is added.
    ModelSpec("qwen3-8b", 8.19e9, 36, 8, 128, hidden_size=4096, heads=32, vocab_size=151936,
              max_position_embeddings=40960),
    ModelSpec("qwen3-32b", 32.8e9, 64, 8, 128, hidden_size=5120, heads=64, vocab_size=151936,
              max_position_embeddings=40960),
    ModelSpec("qwen3-30b-a3b", 30.5e9, 48, 4, 128, hidden_size=2048, heads=32, vocab_size=151936,
              active_params=3.3e9, experts=128, experts_per_token=8, max_position_embeddings=40960),
    ModelSpec("gpt-oss-20b", 20.91e9, 24, 8, 64, hidden_size=2880, heads=64, vocab_size=201088,
              active_params=3.61e9 + 201088 * 2880, experts=32, experts_per_token=4, expert_dtype_bytes=17 / 32,
              sliding_layers=12, sliding_window=128, max_position_embeddings=131072),
    ModelSpec("gpt-oss-120b", 116.83e9, 36, 8, 64, hidden_size=2880, heads=64, vocab_size=201088,
              active_params=5.13e9 + 201088 * 2880, experts=128, experts_per_token=4, expert_dtype_bytes=17 / 32,
              sliding_layers=18, sliding_window=128, max_position_embeddings=131072),
    ModelSpec("llama-3.3-70b", 70.55e9, 80, 8, 128, hidden_size=8192, heads=64, vocab_size=128256,
              max_position_embeddings=131072),
    # Qwen/Qwen3-235B-A22B config.json: 94 layers, hidden 4096, 64 heads, 4 KV heads, head_dim 128, 128
    # experts of moe_intermediate_size 1536, 8 per token, vocabulary 151,936, 40,960 positions; the model
    # card's 235 B and 22 B: 94 x 128 experts x 3 x 4096 x 1536 = 227.1 B in experts, 8.0 B shared.
    ModelSpec("qwen3-235b-a22b", 235.1e9, 94, 4, 128, hidden_size=4096, heads=64, vocab_size=151936,
              active_params=22.2e9, experts=128, experts_per_token=8, max_position_embeddings=40960),
]}


# ---------------------------------------------------------------------------------------------
# Memory plan: what is left of the device after the weights becomes KV blocks, the way vLLM
# sizes its cache from --gpu-memory-utilization (vLLM profiles activations; we use a reserve).
# ---------------------------------------------------------------------------------------------

@dataclass
class CapacityPlan:
    hardware: Hardware
    model: ModelSpec
    gpu_memory_utilization: float
    block_size: int
    max_model_len: int
    budget_bytes: float
    kv_cache_bytes: float
    num_blocks: int
    source: str       # how the block count was decided: "budget", "--kv-tokens", "--num-gpu-blocks" or "context"
    note: str = ""    # what an explicit size implies, said once on stderr
    tensor_parallel_size: int = 1      # the plan is one GPU's of that many
    pipeline_parallel_size: int = 1    # ... in each of that many stages
    group_model: Optional[ModelSpec] = None     # the whole model, when `model` is one GPU's share
    replicas: int = 1                  # data-parallel engines of this plan, each with its own cache
    expert_parallel: bool = False      # ... sharing out the experts between them
    of_free: bool = False              # the fraction is of what the weights and activations leave (TensorRT-LLM)
    draft: Optional[ModelSpec] = None  # one GPU's share of a speculative draft model beside it
    static_share: bool = False         # the fraction holds the weights and cache alone (SGLang): no reserve inside it

    @property
    def kv_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def max_concurrency(self) -> float:
        # vLLM's startup line: blocks over the blocks one max-length request needs.
        return self.num_blocks / math.ceil(self.max_model_len / self.block_size)


def plan_capacity(hardware: Hardware, model: ModelSpec, gpu_memory_utilization: float = 0.9,
                  block_size: int = 16, max_model_len: int = 4096, kv_tokens: Optional[int] = None,
                  num_gpu_blocks: Optional[int] = None, draft: Optional[ModelSpec] = None,
                  of_free: bool = False, reserve: bool = True) -> CapacityPlan:
    """draft: a speculative draft model sharing the device, its weights and its own KV for every
    sequence, its layers' share of each block (vLLM allocates the drafter's attention layers beside
    the target's). of_free:
    the fraction is TensorRT-LLM's kv_cache_free_gpu_mem_fraction, the share of the memory the
    weights and activations leave that the KV cache takes, not vLLM's share of the whole device.
    reserve False: the fraction is SGLang's mem_fraction_static, of the weights and the cache alone,
    so what it leaves is the activations' and graphs' reserve, and servesim's is not taken again."""
    # A size given explicitly (copied from vLLM's log, or llama.cpp's --ctx-size) is a measurement:
    # it replaces servesim's fixed reserve, so only the weights and the fraction limit it.
    reserve_bytes = 0.0 if kv_tokens or num_gpu_blocks or not reserve else hardware.reserve_gib * GIB
    memory = hardware.memory_gib * GIB
    weights = model.weight_bytes + (draft.weight_bytes if draft else 0.0)
    if of_free:
        free = gpu_memory_utilization * (memory - weights - reserve_bytes)
        budget = weights + reserve_bytes + max(free, 0.0)       # what the engine takes, as reported
    else:
        budget = memory * gpu_memory_utilization
        free = budget - weights - reserve_bytes
    after_weights = free + reserve_bytes
    block_bytes = block_size * (model.kv_bytes_per_token + (draft.kv_bytes_per_token if draft else 0))
    if free <= 0:
        taken = "" if kv_tokens or num_gpu_blocks or not reserve else f" plus {hardware.reserve_gib} GiB reserve"
        drafted = f" plus a draft model's {draft.weight_bytes / 1e9:.2f} GB" if draft else ""
        room = f"{hardware.memory_gib:g} GiB" if of_free else \
            f"{budget / GIB:.2f} GiB ({hardware.memory_gib:g} GiB x {gpu_memory_utilization:.2f})"
        raise CapacityError(
            f"{model.name} does not fit on {hardware.name}: weights {model.weight_bytes / 1e9:.2f} GB{drafted}{taken} "
            f"exceed {room}; "
            f"quantize the weights, shard them with tensor parallelism, or use a bigger device")
    if num_gpu_blocks is not None:
        num_blocks, source = num_gpu_blocks, "--num-gpu-blocks"
    elif kv_tokens is not None:
        num_blocks, source = kv_tokens // block_size, "--kv-tokens"
    else:
        num_blocks, source = int(free // block_bytes), "budget"
    kv_bytes = num_blocks * block_bytes
    if num_blocks < 1 and source == "--kv-tokens":
        raise UserError(f"--kv-tokens {kv_tokens:,} is less than one KV block of {block_size} tokens (--block-size); "
                        f"give at least {block_size}")
    if num_blocks < 1:
        raise CapacityError(
            f"{model.name} on {hardware.name}: no room for one KV block of {block_size} tokens "
            f"({block_bytes / KIB:.0f} KiB); raise --gpu-memory-utilization, quantize, shard with "
            f"tensor parallelism, or use a bigger device")
    if kv_bytes > free + 1e-6:
        raise CapacityError(
            f"{model.name} on {hardware.name}: a KV cache of {num_blocks * block_size:,} tokens "
            f"({kv_bytes / GIB:.2f} GiB, from {source}) does not fit the {free / GIB:.2f} GiB left after the "
            f"weights at --gpu-memory-utilization {gpu_memory_utilization:g}; ask for fewer tokens, raise the "
            f"fraction, quantize, shard with tensor parallelism, or use a bigger device")
    plan = CapacityPlan(hardware, model, gpu_memory_utilization, block_size, max_model_len,
                        budget, kv_bytes, num_blocks, source, of_free=of_free, static_share=not reserve)
    if num_gpu_blocks is not None and not of_free and reserve:
        plan.note = (f"--num-gpu-blocks {num_gpu_blocks:,} leaves {(after_weights - kv_bytes) / GIB:.2f} GiB of the "
                     f"{budget / GIB:.2f} GiB budget for activations and CUDA graphs (servesim's own reserve for "
                     f"{hardware.name} is {hardware.reserve_gib:g} GiB)")
    return plan


# Quantization, with vLLM's flag names: what each does to the bytes per weight and per KV element.
# fp8: one byte per weight, on FP8 tensor cores where the device has them. int4 (AWQ/GPTQ): four
# bits per weight plus a 16-bit scale and zero per group of 128, computed in BF16.
WEIGHT_BYTES = {"fp8": 1.0, "int4": 0.5 + 4 / 128}
KV_BYTES = {"fp8": 1}


def quantized(model: ModelSpec, quantization: Optional[str], kv_cache_dtype: str = "auto") -> ModelSpec:
    if quantization:
        model = replace(model, weight_dtype_bytes=WEIGHT_BYTES[quantization])
    if kv_cache_dtype != "auto":
        model = replace(model, kv_dtype_bytes=KV_BYTES[kv_cache_dtype])
    return model


def gemm_tflops(hardware: Hardware, quantization: Optional[str]) -> float:
    """The peak the weights' matrix multiplies run at."""
    return hardware.fp8_tflops if quantization == "fp8" and hardware.fp8_tflops else hardware.tflops


# ---------------------------------------------------------------------------------------------
# Cost model: a roofline per step. A step reads every weight once plus the KV the attention
# needs, and does two FLOPs per weight per token; whichever is slower sets the time.
# ---------------------------------------------------------------------------------------------

def priced_by_rule(cost, seqs: int) -> Callable[[float], float]:
    """A cost model's decode_pricing where nothing is worked out ahead: step_seconds itself."""
    return lambda context: cost.step_seconds(seqs, context, seqs, context)


class Roofline:
    """The lesson's cost of one step: compute is two FLOPs per weight per token at the achieved
    share of peak; memory is every weight plus the KV the attention reads, at the achieved share
    of the bandwidth; the slower of the two, plus a fixed overhead. Everything that prices a step
    uses this; the constants are worked out once per device."""

    def __init__(self, hardware: Hardware, model: ModelSpec, gemm_tflops: Optional[float] = None):
        # gemm_tflops: the peak the weights' matrix multiplies run at (FP8 weights on FP8 tensor cores).
        self.flops_per_token = 2 * model.compute_params
        self.flops_per_second = (gemm_tflops or hardware.tflops) * 1e12 * hardware.mfu
        self.weight_bytes = model.weight_bytes
        self.kv_bytes_per_token = model.kv_bytes_per_token
        self.bytes_per_second = hardware.bandwidth_gbs * 1e9 * hardware.mbu
        # The GPU presets have no per-sequence cost; a CPU server pays one (see calibrate).
        self.step_overhead_ms = hardware.step_overhead_ms
        self.seq_overhead_ms = hardware.seq_overhead_ms

    def times(self, tokens: float, context_tokens: float) -> tuple[float, float]:
        """(compute seconds, memory seconds) of a step of `tokens` that reads `context_tokens` of KV."""
        compute = self.flops_per_token * tokens / self.flops_per_second
        memory = (self.weights_read(tokens) + context_tokens * self.kv_bytes_per_token) / self.bytes_per_second
        return compute, memory

    def weights_read(self, tokens: float) -> float:
        """Bytes of weights a step of `tokens` streams: all of them (see Mixtures of experts)."""
        return self.weight_bytes

    def step_seconds(self, tokens: float, context_tokens: float, seqs: float = 1, pairs: float = 0,
                     largest: float = 0) -> float:
        """`pairs` (attention's query-key pairs) is what a finer model prices; the roofline leaves
        attention's arithmetic out. `largest` (one request's most tokens) is a pipeline's."""
        return self.overhead_seconds(seqs) + max(self.times(tokens, context_tokens))

    def overhead_seconds(self, seqs: float) -> float:
        return (self.step_overhead_ms + seqs * self.seq_overhead_ms) / 1000

    def decode_pricing(self, seqs: int) -> Callable[[float], float]:
        """step_seconds(seqs, context, seqs, context), a step of `seqs` decodes, as a function
        of the context alone: the event engine prices its plain steps with it. The same
        arithmetic in the same order, with what the batch fixes worked out once, so the same
        seconds to the last bit; a subclass that prices steps its own way is called as it is."""
        if type(self).step_seconds is not Roofline.step_seconds or type(self).times is not Roofline.times:
            return priced_by_rule(self, seqs)
        overhead, (compute, _) = self.overhead_seconds(seqs), self.times(seqs, 0)
        weights, kv, bandwidth = self.weights_read(seqs), self.kv_bytes_per_token, self.bytes_per_second

        def price(context: float) -> float:
            memory = (weights + context * kv) / bandwidth
            return overhead + (memory if memory > compute else compute)
        return price

    def critical_batch(self) -> float:
        """Tokens per step at which the arithmetic takes as long as reading the weights."""
        compute_per_token, weight_read = self.times(1, 0)
        return weight_read / compute_per_token


def step_seconds(hardware: Hardware, model: ModelSpec, tokens: float, context_tokens: float, seqs: float = 1) -> float:
    return Roofline(hardware, model).step_seconds(tokens, context_tokens, seqs)


def critical_batch(hardware: Hardware, model: ModelSpec) -> float:
    return Roofline(hardware, model).critical_batch()


# ---------------------------------------------------------------------------------------------
# Block pool: the paged KV cache. Blocks are allocated as a sequence grows and freed when it
# ends. A freed block keeps its content key, so it stays a prefix-cache hit until reused.
# ---------------------------------------------------------------------------------------------

class BlockPool:
    """The free list is in least-recently-used order: first the blocks never used (lowest id
    first), then released blocks in the order they were released. Only blocks that have been
    used cost memory, so a cache of any size is cheap. Released blocks queue in a list read from
    `head`, so taking and returning many blocks is a slice and an extend. Only keyed blocks can
    be shared (a cache hit takes them), so only they carry a holder count; a cache hit that takes
    a block back off the free list leaves a stale entry there, skipped when reached."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.in_use = 0
        self.fresh = 0                       # blocks fresh.. have never been used
        self.free: list[int] = []            # released blocks, oldest first, from index head
        self.head = 0
        self.stale: Counter = Counter()      # block -> entries of it in free that are out of date
        self.key_of: dict[int, object] = {}
        self.cached: dict[object, int] = {}
        self.holders: dict[int, int] = {}    # keyed blocks in use -> how many requests hold them
        self.extra_holds = 0                 # holders beyond the first, summed over those blocks
        self.evictions = 0
        self.prefix_queries = self.prefix_hits = 0   # prompt tokens looked up, and found cached

    def free_count(self) -> int:
        return self.num_blocks - self.in_use

    def used_count(self) -> int:
        return self.in_use

    def allocate(self, count: int) -> list[int]:
        if count > self.free_count():
            raise CapacityError(f"asked for {count} KV blocks, {self.free_count()} free")
        new = min(count, self.num_blocks - self.fresh)
        blocks = list(range(self.fresh, self.fresh + new)) if new else []
        self.fresh += new
        while len(blocks) < count:
            want = count - len(blocks)
            taken = self.free[self.head:self.head + want]
            self.head += want
            if self.stale:
                taken = [block for block in taken if not self.skip(block)]
            if self.key_of:
                for block in taken:
                    key = self.key_of.pop(block, None)
                    if key is not None:
                        # Reusing a block that still held cached content: that content is gone now.
                        del self.cached[key]
                        self.evictions += 1
            blocks += taken
        if self.head > 4096 and self.head * 2 > len(self.free):
            del self.free[:self.head]
            self.head = 0
        self.in_use += count
        return blocks

    def skip(self, block: int) -> bool:
        """Whether this free-list entry of `block` is out of date (older entries are met first)."""
        if not self.stale[block]:
            return False
        self.stale[block] -= 1
        if not self.stale[block]:
            del self.stale[block]
        return True

    def release(self, blocks: list[int]) -> None:
        # In reverse, as vLLM does: a sequence's tail is evicted before the prefix it shares.
        freed = blocks[::-1]
        holders = self.holders
        if holders and not holders.keys().isdisjoint(blocks):
            # One holder lets go of each; a block still held by another stays in use.
            last = []
            for block in freed:
                held = holders.get(block)
                if held is None:
                    last.append(block)
                elif held > 1:
                    holders[block] = held - 1
                    self.extra_holds -= 1
                else:
                    del holders[block]
                    last.append(block)
            freed = last
        self.in_use -= len(freed)
        self.free += freed

    def free_order(self) -> list[int]:
        """The released blocks on the free list, least recently used first (for tests)."""
        stale = Counter(self.stale)
        order = []
        for block in self.free[self.head:]:
            if stale[block]:
                stale[block] -= 1
            else:
                order.append(block)
        return order

    def register(self, block: int, key: object) -> None:
        """Key a full block (held by the one request that filled it) by its content. A duplicate
        of content already cached stays unkeyed."""
        if key not in self.cached and block not in self.key_of:
            self.cached[key] = block
            self.key_of[block] = key
            self.holders[block] = 1

    def register_all(self, blocks: list[int], keys: list) -> None:
        """register() each block with its key, in order: in one go when none is keyed yet and
        no key is cached (the keys of one request's blocks differ from each other)."""
        if self.cached.keys().isdisjoint(keys) and self.key_of.keys().isdisjoint(blocks):
            self.cached.update(zip(keys, blocks))
            self.key_of.update(zip(blocks, keys))
            self.holders.update(zip(blocks, itertools.repeat(1)))
        else:
            for block, key in zip(blocks, keys):
                self.register(block, key)

    def lookup(self, keys: Iterable[object]) -> list[int]:
        """The leading run of keys that are cached, as blocks."""
        run = []
        for key in keys:
            block = self.cached.get(key)
            if block is None:
                break
            run.append(block)
        return run

    def touch(self, blocks: list[int]) -> None:
        """Take cached blocks for a request: one more holder, or back off the free list."""
        for block in blocks:
            if block in self.holders:
                self.holders[block] += 1
                self.extra_holds += 1
            else:
                self.holders[block] = 1
                self.in_use += 1
                self.stale[block] += 1       # its entry in the free list no longer counts

    def free_among(self, blocks: list[int]) -> int:
        """How many of these cached blocks sit on the free list (idle)."""
        return sum(1 for block in blocks if block not in self.holders)

    # Prefix caching: a request's blocks keyed by what they hold, found again by the next
    # request whose prompt starts the same way.
    def cached_prefix(self, request, block_size: int) -> list[int]:
        """The blocks, cached now, that hold the request's leading full blocks. Its last token
        is always computed: the model needs its logits to sample."""
        return self.lookup(block_keys(request, 0, (request.length - 1) // block_size, block_size))

    def key_filled(self, request, tokens: int, block_size: int) -> None:
        """Key the blocks a request fills up to `tokens` (this step's included), where it was not
        keyed yet."""
        full = tokens // block_size
        if full > request.registered:
            self.register_all(request.blocks[request.registered:full],
                              block_keys(request, request.registered, full, block_size))
            request.registered = full

    def count_lookup(self, request, cached: int) -> None:
        """A request's first admission: its prompt tokens looked up, `cached` of them found."""
        self.prefix_queries += request.length
        self.prefix_hits += cached
        request.cached_tokens = cached


def block_key(request, index: int, block_size: int) -> tuple:
    """What a full KV block holds, for prefix caching. vLLM hashes a block's token ids chained
    with the previous block's hash, so a block matches only when everything before it matches
    too. Here the tokens are content runs: a block ending at token e inside run k is keyed by the
    chain of runs 1..k and e; a block past the content, by the request's own id."""
    end = (index + 1) * block_size
    run = bisect.bisect_left(request.content_ends, end)
    if run == len(request.content_ends):
        return (request.id, index)
    return (request.content_chain[run], end)


def block_keys(request, start: int, stop: int, block_size: int) -> list[tuple]:
    """block_key for blocks start..stop-1, a run of content at a time instead of a search for each
    block (a 1,000-token system prompt is 63 blocks of one run)."""
    ends, chain, keys, index = request.content_ends, request.content_chain, [], start
    run = bisect.bisect_left(ends, (start + 1) * block_size)
    while index < stop and run < len(ends):
        last = min(stop, ends[run] // block_size)         # the blocks ending inside this run
        if last > index:
            keys += zip(itertools.repeat(chain[run]), range((index + 1) * block_size, (last + 1) * block_size, block_size))
            index = last
        run += 1
    keys += zip(itertools.repeat(request.id), range(index, stop))
    return keys


# ---------------------------------------------------------------------------------------------
# Request: its prompt plus what it has generated, and how many of those tokens have KV.
# remaining == the prompt is a prefill; remaining == 1 is a decode; after a preemption
# remaining is everything again, a recompute. One rule for all three.
# ---------------------------------------------------------------------------------------------

@dataclass(eq=False, slots=True)
class Request:
    id: int
    prompt_tokens: int
    output_tokens: int
    sent_s: float = 0.0
    # What the leading tokens hold, as runs of content: ((content id, tokens), ...). Two requests
    # whose runs start alike hold the same tokens there, so prefix caching shares those blocks.
    # The tokens after the last run are the request's own.
    content: tuple = ()
    # A conversation: the turn sent `think_s` after this one ends, and this one's place in it.
    next_turn: Optional["Request"] = None
    think_s: float = 0.0
    turn: int = 0
    not_before: float = 0.0      # a trace's next turn is sent no earlier than its own time
    # A reasoning model thinks first: the first `reasoning_tokens` of the output are thinking, and
    # the user waits for the token after them (the first answer token).
    reasoning_tokens: int = 0
    # Engine state.
    generated: int = 0
    computed: int = 0
    blocks: list = field(default_factory=list)
    registered: int = 0          # leading full blocks already keyed in the pool
    preemptions: int = 0
    admitted: int = -1           # order of the latest admission: the running order
    cruise_from: int = -1        # the event engine's step counter when this decode last joined it
    wake_at: int = -1            # ... and the step at which it must be handled on its own again
    # What the client sees. Times are seconds on the virtual clock.
    queue_s: Optional[float] = None
    first_token_s: Optional[float] = None
    last_token_s: Optional[float] = None
    answer_s: Optional[float] = None     # the first answer token's time (the first token's without reasoning)
    token_times: Optional[list] = None   # every token's time, only kept for --detailed
    error: Optional[str] = None
    streamed: Optional[tuple] = None     # a failed request read from a report: (tokens, ttft) it streamed first
    ended_s: Optional[float] = None      # ... and when it ended, where the report says (a run lasts to it)
    cached_tokens: int = 0       # prompt tokens found in the prefix cache at first admission
    measured: bool = True        # False for a warm-up request: sent, but left out of every figure
    content_ends: tuple = ()     # where each content run ends, and the hash of the runs up to it
    content_chain: tuple = ()

    def __post_init__(self) -> None:
        if self.content:
            ends, chain, end, link = [], [], 0, 0
            for key, tokens in self.content:
                end += tokens
                link = hash((link, key))
                ends.append(end)
                chain.append(link)
            self.content_ends, self.content_chain = tuple(ends), tuple(chain)

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.output_tokens

    @property
    def length(self) -> int:
        return self.prompt_tokens + self.generated

    @property
    def remaining(self) -> int:
        return self.length - self.computed

    @property
    def finished(self) -> bool:
        return self.generated >= self.output_tokens

    def emit(self, now: float) -> Optional[float]:
        """Sample one token at `now`; the gap since the previous one (None for the first)."""
        gap = None if self.last_token_s is None else now - self.last_token_s
        if self.first_token_s is None:
            self.first_token_s = now
        self.generated += 1
        if self.answer_s is None and self.generated > self.reasoning_tokens:
            self.answer_s = now
        self.last_token_s = now
        if self.token_times is not None:
            self.token_times.append(now)
        return gap


# ---------------------------------------------------------------------------------------------
# Scheduler: vLLM v1's first-come-first-served loop. Running requests first, each with the
# tokens it needs or the budget allows; then waiting requests while --max-num-seqs, the token
# budget and the free blocks last. A block shortage preempts the last-admitted request.
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 4096
    block_size: int = 16
    chunked_prefill: bool = True
    prefix_caching: bool = False
    reserve_full_isl: bool = False


@dataclass(slots=True)
class Batch:
    """One step's work: the requests scheduled one by one with their token counts, and the sums
    the cost model and the statistics need."""
    items: list = field(default_factory=list)
    tokens: int = 0          # tokens computed in the step
    context: int = 0         # KV tokens the attention reads: each request's computed + its tokens
    seqs: int = 0
    decodes: int = 0         # rows of requests already generating, one token each
    rows: int = 0            # decode rows computed; more than decodes only when padding is computed
    pairs: int = 0           # (query, key) pairs attention computes: a chunk attends to all before it
    largest: int = 0         # the most tokens one request computes in the step (a pipeline cannot split them)

    def add(self, request: Request, tokens: int) -> None:
        self.items.append((request, tokens))
        self.tokens += tokens
        if tokens > self.largest:
            self.largest = tokens
        self.context += request.computed + tokens
        self.seqs += 1
        self.pairs += tokens * request.computed + tokens * (tokens + 1) // 2
        if tokens == 1 and request.generated:
            self.decodes += 1
            self.rows += 1

    def __iter__(self):
        return iter(self.items)


# Gaps between tokens are counted to the microsecond: exact counts of each distinct gap would
# grow with the number of steps (every step's duration differs), counts per microsecond with the
# spread of step times only. Percentiles print to 0.1 ms.
ITL_DIGITS = 6
ITL_SAME = 0.49 * 10 ** -ITL_DIGITS  # a gap this close to a rounded one rounds to it


def size_of(request: Request) -> str:
    return f"prompt {request.prompt_tokens:,} + output {request.output_tokens:,} tokens"


class Scheduler:
    def __init__(self, config: SchedulerConfig, num_blocks: int, detailed: bool = False):
        self.config = config
        self.pool = BlockPool(num_blocks)
        self.detailed = detailed                 # keep every token's time
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []         # in order of latest admission
        self.done: list[Request] = []            # completed and failed, in the order they ended
        self.itl: Counter = Counter()            # every gap between two tokens of a request -> count
        self.sampled = 0                         # tokens sampled after a request's first (measured ones)
        self.handoff: Optional[Callable[[Request, float], None]] = None   # see Disaggregation
        self.admissions = itertools.count()
        self.preemptions = 0
        # Running requests a variation holds out of this step's scheduling (SGLang's decodes while
        # it prefills): they keep their seats, so admission counts them.
        self.aside: list[Request] = []

    def add(self, request: Request) -> None:
        if self.detailed and request.token_times is None:
            request.token_times = []
        reason = self.rejection(request)
        if reason:
            self.fail(request, reason)
        else:
            self.waiting.append(request)

    def fail(self, request: Request, reason: str) -> None:
        """Failed requests are counted and reported with their reason, never dropped."""
        request.error = reason
        self.done.append(request)

    def rejection(self, request: Request) -> Optional[str]:
        """Why this request can never run here, or None."""
        c = self.config
        if request.total > c.max_model_len:
            return f"longer than --max-model-len: {size_of(request)} > {c.max_model_len:,}"
        longest = self.longest_prefill(request)
        if not c.chunked_prefill and longest > self.token_budget():      # static batching has no budget
            named = size_of(request) if longest == request.total else f"prompt {longest:,} tokens"
            return f"longer than --max-num-batched-tokens without chunked prefill: {named} > {c.max_num_batched_tokens:,}"
        if self.blocks_for(request.total - 1) > self.pool.num_blocks:   # the last token is never stored
            return (f"larger than the KV cache: needs {self.blocks_for(request.total - 1):,} blocks, "
                    f"the cache has {self.pool.num_blocks:,}")
        return None

    def longest_prefill(self, request: Request) -> int:
        """The most tokens a request may prefill in one step: its prompt and its output, which a
        preempted request recomputes together."""
        return request.total

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.config.block_size)

    def token_budget(self) -> int:
        return self.config.max_num_batched_tokens

    def wanted(self, request: Request) -> int:
        """Tokens a running request would compute this step, budget permitting."""
        return request.remaining

    def schedule(self, now: float) -> Batch:
        batch, budget, preemptions = Batch(), self.token_budget(), self.preemptions
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            tokens = min(self.wanted(request), budget)
            need = self.blocks_for(request.computed + tokens) - len(request.blocks)
            if not self.make_room(request, need):
                break                 # it was the last running request, and it had to go
            self.grow(request, tokens, need)
            batch.add(request, tokens)
            budget -= tokens
            index += 1
        if self.preemptions == preemptions:   # no point admitting work in a step that evicted work
            self.admit(now, budget, batch)
        return batch

    def admit(self, now: float, budget: int, batch: Batch) -> None:
        c = self.config
        while self.waiting and budget > 0 and len(self.running) + len(self.aside) < c.max_num_seqs:
            request = self.waiting[0]
            # A request handed over by a prefill engine arrives with its KV already computed.
            hits = self.cache_hits(request) if request.computed == 0 else []
            start = request.computed or len(hits) * c.block_size
            tokens = min(request.length - start, budget)
            if not c.chunked_prefill and tokens < request.length - start:
                break
            need = self.blocks_for(start + tokens) - len(hits)
            if not self.admissible(request, hits, need):
                break                 # first come, first served: the head blocks everyone behind it
            self.waiting.popleft()
            self.start(request, hits, start, now)
            self.grow(request, tokens, need)
            batch.add(request, tokens)
            budget -= tokens

    def admissible(self, request: Request, hits: list[int], need: int) -> bool:
        # With --scheduler-reserve-full-isl the whole prompt's blocks must be free now, so a
        # request is not admitted only to stall on its second chunk. Idle cached blocks count as free.
        if self.config.reserve_full_isl:
            need = self.blocks_for(request.length) - len(hits)
        return need <= self.free_blocks() - (self.pool.free_among(hits) if hits else 0)

    def start(self, request: Request, hits: list[int], start: int, now: float) -> None:
        if hits:
            self.pool.touch(hits)
        request.blocks, request.computed, request.registered = hits, start, len(hits)
        request.admitted = next(self.admissions)
        if request.queue_s is None:
            request.queue_s = now - request.sent_s
            if self.config.prefix_caching:
                self.pool.count_lookup(request, start)
        self.running.append(request)

    def make_room(self, request: Request, need: int) -> bool:
        """Preempt from the tail until `need` blocks are free. False if `request` itself went."""
        while need > self.free_blocks():
            victim = self.running[-1]
            self.preempt(victim)
            if victim is request:
                return False
        return True

    def preempt(self, request: Request) -> None:
        self.release(request)
        request.computed = request.registered = 0
        request.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(request)

    def grow(self, request: Request, tokens: int, need: int) -> None:
        """Give a request the blocks for this step's tokens, and key the blocks it fills."""
        if need > 0:
            request.blocks.extend(self.pool.allocate(need))
        if self.config.prefix_caching:
            self.pool.key_filled(request, request.computed + tokens, self.config.block_size)

    def update(self, batch: Batch, now: float) -> None:
        for request, tokens in batch.items:
            request.computed += tokens
            if request.computed == request.length:     # else a prefill chunk short of the prompt's end
                self.emit(request, now)

    def emit(self, request: Request, now: float, tokens: int = 1) -> None:
        """The request samples `tokens` tokens at the end of the step (several: accepted
        speculative proposals). A request that is done leaves; one a prefill engine hands over
        leaves with its KV."""
        gap = request.emit(now)
        for _ in range(tokens - 1):       # accepted proposals come with it, no gap between them
            request.emit(now)
        if request.measured:
            if gap is not None:
                self.count_gaps(gap, 1)
            if tokens > 1:
                self.count_gaps(0.0, tokens - 1)
        if request.finished:
            self.release(request)
            self.done.append(request)
        elif self.handoff:
            self.release(request)
            self.handoff(request, now)

    def count_gaps(self, gap: float, count: int) -> None:
        """`count` measured tokens that came `gap` seconds after their request's previous one:
        the inter-token latencies, and the tokens a timeline counts."""
        gap = round(gap, ITL_DIGITS)
        self.itl[gap] = self.itl.get(gap, 0) + count
        self.sampled += count

    def release(self, request: Request) -> None:
        """The request leaves the running batch and its blocks go back to the pool."""
        self.running.remove(request)
        self.pool.release(request.blocks)
        request.blocks = []

    # The cache as the statistics and the cost model see it; variants override these.
    def free_blocks(self) -> int:
        return self.pool.free_count()

    def used_blocks(self) -> int:
        return self.pool.used_count()

    def reserved_tokens(self) -> int:
        return self.used_blocks() * self.config.block_size

    def work(self, batch: Batch) -> tuple[int, int, int, int]:
        """(tokens, context, sequences, attention pairs) the hardware computes for this batch."""
        return batch.tokens, batch.context, batch.seqs, batch.pairs

    def extra_seconds(self, batch: Batch) -> float:
        """Time a step spends outside the served model (a speculative draft model's passes)."""
        return 0.0

    def cache_hits(self, request: Request) -> list[int]:
        return self.pool.cached_prefix(request, self.config.block_size) if self.config.prefix_caching else []

    # What the event engine's scheduler overrides: which running requests have their fields up
    # to date, and bringing every one up to date so the next step is scheduled by the rule above.
    def handled(self) -> list[Request]:
        return self.running

    def handle_each(self) -> None:
        pass


# ---------------------------------------------------------------------------------------------
# Engine: steps a scheduler on a virtual clock, pricing each batch with the roofline, and
# keeps the statistics only a server can see. simulate() feeds it arrivals.
# ---------------------------------------------------------------------------------------------

@dataclass
class EngineStats:
    steps: int = 0
    scheduled_seqs: int = 0      # summed over steps, for the mean batch
    kv_peak: int = 0             # blocks in use, the highest seen
    kv_block_seconds: float = 0.0  # blocks in use x time stepping, for the time-weighted mean
    peak_waiting: int = 0
    peak_running: int = 0
    capped_steps: int = 0        # steps where requests waited while the batch was at --max-num-seqs
    decode_rows: int = 0         # rows of decode steps computed, padding included
    useful_rows: int = 0         # of those, rows of a request still generating
    kv_reserved_peak: int = 0    # tokens of KV memory set aside, the most at once
    kv_used_share: float = 0.0   # sum over steps of KV read / KV reserved (a constant reserved's steps at once)
    running_seconds: float = 0.0 # running requests x time stepping, for the time-weighted mean

    def __post_init__(self):
        # The sums above change only when what they weigh does: the blocks in use, the running
        # requests and the KV reserved stay put over most back-to-back steps (every plain decode
        # step but one in block_size, for a lone decode). So they are taken an interval at a
        # time: while those three hold, over steps that follow each other with no idle time, each
        # sum gains its value x the clock's advance, and the KV read (an integer) over the
        # reserved once, at the interval's end.
        self.used = self.running = self.reserved = 0     # what the open interval holds
        self.since = self.until = 0.0   # the open interval's first step's start, its last one's end
        self.read = 0             # KV tokens its steps read, a shared prefix block counted once

    def record(self, batch: Batch, start: float, duration: float, scheduler: Scheduler) -> None:
        self.record_step(batch.seqs, batch.rows, batch.decodes, batch.context, start, duration, scheduler)

    def record_step(self, seqs: int, rows: int, decodes: int, context: int, start: float, duration: float,
                    scheduler: Scheduler) -> None:
        """One step of `seqs` sequences (`rows` decode rows computed, `decodes` of them useful)
        reading `context` KV tokens, from `start` for `duration` seconds, as the scheduler stands
        after scheduling it."""
        used, running, reserved = scheduler.used_blocks(), len(scheduler.running), scheduler.reserved_tokens()
        self.count(1, seqs, rows, decodes, scheduler, used, running, reserved)
        self.hold(start, used, running, reserved)
        self.read += context - scheduler.pool.extra_holds * scheduler.config.block_size
        self.until = start + duration

    def count(self, steps: int, seqs: int, rows: int, decodes: int, scheduler: Scheduler, used: int, running: int,
              reserved: int) -> None:
        """The counts and peaks of `steps` steps alike (each of `seqs` sequences, `rows` decode
        rows, `decodes` of them useful), with these blocks in use, running requests and KV
        reserved, and the scheduler's queue as it stands."""
        waiting = len(scheduler.waiting)
        self.steps += steps
        self.scheduled_seqs += seqs * steps
        self.decode_rows += rows * steps
        self.useful_rows += decodes * steps
        if waiting and running >= scheduler.config.max_num_seqs:
            self.capped_steps += steps
        if used > self.kv_peak:
            self.kv_peak = used
        if waiting > self.peak_waiting:
            self.peak_waiting = waiting
        if running > self.peak_running:
            self.peak_running = running
        if reserved > self.kv_reserved_peak:
            self.kv_reserved_peak = reserved

    def hold(self, start: float, used: int, running: int, reserved: int) -> None:
        """A step from `start` holds these: if they moved, or the engine stood idle since the
        last step ended, the open interval closes and this step opens the next."""
        if used != self.used or running != self.running or reserved != self.reserved or start != self.until:
            self.close()
            self.used, self.running, self.reserved, self.since = used, running, reserved, start

    def ran_to(self, end: float, read: int) -> None:
        """Steps of the open interval (the event engine's plain ones) ran to `end`, reading `read`."""
        self.until, self.read = end, self.read + read

    def moved(self, at: float, read: int, used: int, running: int, reserved: int) -> None:
        """ran_to(at, read), then hold() for a step from `at` where what the interval weighs moved
        (a decode crossed into a block): the event engine's most frequent call, in one."""
        self.until, self.read = at, self.read + read
        self.close()
        self.used, self.running, self.reserved, self.since = used, running, reserved, at

    def close(self) -> None:
        span = self.until - self.since
        self.kv_block_seconds += self.used * span
        self.running_seconds += self.running * span
        self.kv_used_share += self.read / self.reserved if self.reserved else 0.0
        self.since, self.read = self.until, 0

    @classmethod
    def merged(cls, stats: list["EngineStats"]) -> "EngineStats":
        """Several engines' statistics as one: counts and times add, peaks take the highest (the
        busiest replica's)."""
        peaks = ("kv_peak", "peak_waiting", "peak_running", "kv_reserved_peak")
        for s in stats:
            s.close()
        return cls(**{f.name: (max if f.name in peaks else sum)(getattr(s, f.name) for s in stats)
                      for f in fields(cls)})

    def report(self, schedulers: list[Scheduler], span: float) -> dict:
        """The engine's report, or one for several replicas (their schedulers, this their merged
        statistics): KV shares are of one replica's blocks, means are over all the steps."""
        self.close()
        pools = [s.pool for s in schedulers]
        blocks = sum(pool.num_blocks for pool in pools)
        queries = sum(pool.prefix_queries for pool in pools)
        return {
            "steps": self.steps,
            "mean_batch": self.scheduled_seqs / self.steps if self.steps else 0.0,
            "kv_peak": self.kv_peak / pools[0].num_blocks,
            "kv_mean": self.kv_block_seconds / blocks / span if span > 0 else 0.0,
            "peak_waiting": self.peak_waiting,
            "peak_running": self.peak_running,
            "steps_waiting_at_seq_cap": self.capped_steps,
            "preemptions": sum(s.preemptions for s in schedulers),
            "evictions": sum(pool.evictions for pool in pools),
            "prefix_hit_rate": sum(pool.prefix_hits for pool in pools) / queries if queries else 0.0,
            "num_blocks": blocks,
            "block_size": schedulers[0].config.block_size,
            "row_utilisation": self.useful_rows / self.decode_rows if self.decode_rows else None,
            "wasted_decode_rows": self.decode_rows - self.useful_rows,
            "kv_reserved_peak_tokens": self.kv_reserved_peak,
            "kv_used_of_reserved": self.kv_used_share / self.steps if self.steps else 0.0,
            "mean_running": self.running_seconds / span if span > 0 else 0.0,
        }


class Engine:
    def __init__(self, hardware: Hardware, model: ModelSpec, scheduler: Scheduler, cost: Optional[Roofline] = None):
        self.hardware = hardware
        self.cost = cost or Roofline(hardware, model)
        self.scheduler = scheduler
        self.stats = EngineStats()
        self.clock = 0.0
        self.inbox: deque = deque()  # (time, request) not yet handed to the scheduler, in time order
        self.plan_note = ""
        self.refused_note = ""     # vLLM would not start this deployment (simulate says so; a measured run did start)
        # When asked for: second -> (running, waiting, KV use, tokens sampled so far), the state
        # at the last step to end in that second, as vLLM logs its stats.
        self.timeline: Optional[dict] = None
        self.engines = [self]        # what simulate() looks at for ended requests

    def step(self) -> Batch:
        batch, duration = self.schedule_step()
        if duration is not None:
            self.end_step(batch, duration)
        return batch

    def schedule_step(self) -> tuple[Batch, Optional[float]]:
        """The step's batch and its price (None: nothing runs). A step is scheduled, then ended,
        in two halves, so that engines that step together (Lockstep) can end theirs at once."""
        scheduler, preemptions = self.scheduler, self.scheduler.preemptions
        batch = scheduler.schedule(self.clock)
        if not batch.seqs and not scheduler.running and scheduler.preemptions == preemptions:
            if not scheduler.waiting:
                return batch, None    # the only request left is loading its prefix from host memory
            # Nothing runs and the head of the queue could not start in an idle engine: it never
            # will. Fail it rather than spin.
            head = scheduler.waiting.popleft()
            scheduler.fail(head, f"cannot be scheduled: it does not fit this engine even when idle "
                                 f"(prompt {head.prompt_tokens:,} + output {head.output_tokens:,} tokens)")
            return batch, None
        return batch, self.cost.step_seconds(*self.scheduler.work(batch), batch.largest) + scheduler.extra_seconds(batch)

    def end_step(self, batch: Batch, duration: float) -> None:
        self.stats.record(batch, self.clock, duration, self.scheduler)
        self.clock += duration
        self.scheduler.update(batch, self.clock)
        if self.timeline is not None:
            self.snapshot(self.clock)

    def snapshot(self, at: float) -> None:
        s = self.scheduler
        self.timeline[math.ceil(at)] = (len(s.running), len(s.waiting), s.used_blocks() / s.pool.num_blocks, s.sampled)

    def advance(self, until: float) -> None:
        """Take the next step. (An engine that can tell the steps after it are plain decode steps
        may take every one that starts before `until`, when something may reach it: EventEngine.)"""
        self.step()

    def deliver(self, at: float, request: Request, now: bool = False) -> None:
        # Deliveries nearly always come in time order (sends, link transfers): append. Ties keep
        # the order they were sent in.
        if self.inbox and at < self.inbox[-1][0]:
            self.inbox.insert(bisect.bisect_right([t for t, _ in self.inbox], at), (at, request))
        else:
            self.inbox.append((at, request))

    def next_event(self) -> float:
        """When this engine can next do something: now if it has work, else its next delivery."""
        if self.scheduler.waiting or self.scheduler.running:      # has_work(), asked at every event
            return self.clock
        return self.inbox[0][0] if self.inbox else math.inf

    def take_next(self) -> Optional[bool]:
        """Move the clock to the next event and take the requests delivered by then; whether
        there is work to step (None: nothing happened here that ends a request or needs a step)."""
        self.catch_up(self.next_event())
        return self.has_work()

    def catch_up(self, now: float) -> None:
        self.clock = max(self.clock, now)
        while self.inbox and self.inbox[0][0] <= self.clock:
            self.scheduler.add(self.inbox.popleft()[1])

    def has_work(self) -> bool:
        return bool(self.scheduler.waiting or self.scheduler.running)

    @property
    def steps(self) -> int:
        return self.stats.steps

    def report(self, span: float) -> dict:
        return {"hardware": self.hardware.name, **self.stats.report([self.scheduler], span)}


TURN_FAILED = "conversation stopped"      # the error kind of a turn after one that failed (here or on a server)


def simulate(server, requests: list[Request], concurrency: Optional[int] = None,
             progress: Optional[Callable[[float], None]] = None,
             stop: Optional[Callable[[], Optional[str]]] = None) -> Optional[str]:
    """Run requests to the end on an engine (or on several sharing one clock: see Replicas).
    Open loop: each request (each conversation's first turn) is sent at its sent_s. Closed loop:
    `concurrency` clients, each starting its next conversation the moment its last one ends. A
    conversation's next turn is sent think_s after the turn before it ends. Whatever comes first,
    an arrival or the engine's next step, happens next. `stop`, asked every STOP_CHECK_STEPS
    steps, may end the run early with its reason, which is returned."""
    def send(request: Request, at: float, now: bool = False) -> None:
        request.sent_s = at
        server.deliver(at, request, now)

    starts = deque(r for r in requests if r.turn <= 1)      # each conversation's first request
    if not concurrency:
        for request in sorted(starts, key=lambda r: r.sent_s):
            send(request, request.sent_s)
        starts.clear()
    dones = [engine.scheduler.done for engine in server.engines]
    seen = [0] * len(dones)               # how much of each engine's done list has been looked at
    active = 0                            # conversations started and not ended
    next_report = next_check = 0          # the step counts at which to report, and to ask `stop`

    # Only a closed loop's clients and conversations' next turns wait on what ends.
    waits = bool(concurrency) or any(r.next_turn for r in requests)
    for engine in server.engines:
        engine.ends_send = waits

    def settle() -> None:
        """Act on what ended since last time: send next turns, free clients."""
        nonlocal active
        if not waits:
            return
        for i, done in enumerate(dones):
            while seen[i] < len(done):
                request = done[seen[i]]
                seen[i] += 1
                follow = request.next_turn
                if follow is None:
                    active -= 1
                elif request.error is None:
                    send(follow, max(request.last_token_s + request.think_s, follow.not_before))
                else:                 # a conversation cannot go on past a failed turn
                    server.engines[i].scheduler.fail(follow, f"{TURN_FAILED}: turn {request.turn} failed")

    now = 0.0
    while True:
        settle()
        if concurrency:
            while starts and active < concurrency:
                send(starts.popleft(), now, now=True)
                active += 1
        if server.next_event() == math.inf:
            return
        work = server.take_next()
        if work is None:
            continue
        settle()                      # a delivery the engine refused at once has ended
        if work:
            # A free client sends now, so only one step may go before it; otherwise the engine
            # goes on until something else can reach it. (A turn whose end starts the next one
            # needs nothing here: an advance stops when a request ends.)
            server.advance(server.clock if concurrency and starts and active < concurrency else math.inf)
            if progress and server.steps >= next_report:
                progress(server.clock)
                next_report = server.steps + 4096
            if stop and server.steps >= next_check:
                why = stop()
                if why:
                    return why
                next_check = server.steps + STOP_CHECK_STEPS
        now = server.clock


STOP_CHECK_STEPS = 256     # steps between two asks whether a run may stop (a few hundred to a run's thousands)


# ---------------------------------------------------------------------------------------------
# Workload: synthetic requests with seeded lengths, and Poisson arrivals.
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TokenRange:
    """A count or a uniform range A-B, as --prompt-tokens and --output-tokens take them."""
    low: int
    high: int

    def __str__(self) -> str:
        return str(self.low) if self.low == self.high else f"{self.low}-{self.high}"


def synthetic_requests(count: int, prompt: TokenRange, output: TokenRange, rng: random.Random,
                       prefix_tokens: int = 0, num_prefixes: int = 1,
                       progress: Optional[Callable[[str], None]] = None) -> list[Request]:
    """One randint for the prompt, then one for the output, per request, from one seeded stream.
    A shared system prompt of prefix_tokens goes in front of the drawn prompt."""
    requests = []
    for i in range(count):
        if progress and i % 100_000 == 0:
            progress(f"building requests: {i:,}/{count:,}")
        prompt_tokens = rng.randrange(prompt.low, prompt.high + 1)     # randint, one call less
        output_tokens = rng.randrange(output.low, output.high + 1)
        prefix = ((f"system-{i % num_prefixes}", prefix_tokens),) if prefix_tokens else ()
        requests.append(Request(i, prefix_tokens + prompt_tokens, output_tokens, content=prefix))
    return requests


def conversations(count: int, prompt: TokenRange, output: TokenRange, rng: random.Random, turns: int,
                  think_s: float, prefix_tokens: int = 0, num_prefixes: int = 1) -> list[Request]:
    """Chats of `turns` requests (the last one shorter if `count` runs out). Each turn's prompt is
    the conversation so far, its earlier messages and the answers to them, plus a new message of
    --prompt-tokens; so each turn's content is the previous turn's plus two runs, and the cache
    can hold everything but the new message."""
    requests: list[Request] = []
    for session in range(-(-count // turns)):
        history = ((f"system-{session % num_prefixes}", prefix_tokens),) if prefix_tokens else ()
        before = None
        for turn in range(1, min(turns, count - session * turns) + 1):
            message = rng.randrange(prompt.low, prompt.high + 1)
            answer = rng.randrange(output.low, output.high + 1)
            spoken = sum(tokens for _, tokens in history)
            runs = history + ((("user", session, turn), message), (("reply", session, turn), answer))
            request = Request(len(requests), spoken + message, answer, content=runs, turn=turn, think_s=think_s)
            if before:
                before.next_turn = request
            requests.append(request)
            history, before = runs, request
    return requests


def arrival_times(count: int, rng: random.Random, rate: Optional[float], burstiness: float = 1.0,
                  ramp: Optional[tuple] = None) -> list[float]:
    """Send times, the first at 0, as vllm bench serve draws its gaps: gamma with shape
    `burstiness` and mean 1/rate (1 is exponential: Poisson arrivals; below 1 burstier, above 1
    more even), the rate either fixed or, with `ramp` (strategy, start, end), set by the request's
    index: linear from start to end, or exponential (start x (end/start)^(i/(n-1)))."""
    times, clock = [], 0.0
    for i in range(count):
        times.append(clock)
        at = rate
        if ramp:
            strategy, start, end = ramp
            progress = (i + 1) / max(count - 1, 1)
            at = start + (end - start) * progress if strategy == "linear" else start * (end / start) ** progress
        clock += next_gap(rng, at, burstiness)
    return times


def next_gap(rng: random.Random, rate: float, burstiness: float = 1.0) -> float:
    return rng.expovariate(rate) if burstiness == 1 else rng.gammavariate(burstiness, 1 / (rate * burstiness))


def profile_arrivals(windows: tuple, end_s: float, rng: random.Random, burstiness: float = 1.0,
                     limit: int = 0) -> list[float]:
    """Send times following a rate that changes by window: within a window, gaps as at a fixed
    rate; a gap that would cross into the next window is drawn again from the boundary at the
    next window's rate (exact for Poisson arrivals, which forget how long they have waited)."""
    times, clock = [], 0.0
    bounds = [start for start, _ in windows[1:]] + [end_s]
    for (start, rate), stop in zip(windows, bounds):
        clock = max(clock, start)
        while rate > 0:
            at = clock + next_gap(rng, rate, burstiness)
            if at >= stop:
                break
            times.append(at)
            clock = at
            if limit and len(times) >= limit:
                return times
    return times


# ---------------------------------------------------------------------------------------------
# Metrics: one definition for simulated and measured requests. TTFT is queue plus prefill;
# TPOT is the mean gap after the first token; ITL is every gap; percentiles are nearest rank.
# A request needs sent_s, first_token_s, last_token_s, prompt_tokens, output_tokens, queue_s
# and error; simulated and measured requests both have them.
# ---------------------------------------------------------------------------------------------

PERCENTILES = (50, 90, 95, 99)
METRICS = ("ttft", "tpot", "itl", "e2el", "queue")
# A finished request's own figures in ms (None: it has none), worked out once here, so whatever
# compares one with a bound gets the float the report's percentiles are drawn from.
REQUEST_MS = {
    "ttft": lambda r: (r.first_token_s - r.sent_s) * 1000,
    "tpot": lambda r: (r.last_token_s - r.first_token_s) * 1000 / (r.output_tokens - 1)
    if r.output_tokens > 1 and r.last_token_s > r.first_token_s else None,
    "e2el": lambda r: (r.last_token_s - r.sent_s) * 1000,
    "queue": lambda r: r.queue_s * 1000 if r.queue_s is not None else None,
}


def distribution(samples) -> dict:
    """Mean, population std and nearest-rank percentiles of a list of values, or of a Counter of
    value -> how many times it occurred (the ITL gaps, where one gap repeats for a whole batch)."""
    values = sorted(samples)    # sums in value order: the same samples always give the same floats
    if isinstance(samples, Counter):
        weights = [samples[v] for v in values]
        n = sum(weights)
        mean = sum(map(operator.mul, values, weights)) / n if n else None
    else:
        weights = None
        n = len(values)
        mean = sum(values) / n if n else None
    if not n:
        return {"mean": None, "std": None, **{f"p{p}": None for p in PERCENTILES}}
    deviations = [v - mean for v in values]
    squares = map(operator.mul, deviations, deviations)
    std = math.sqrt(sum(map(operator.mul, squares, weights) if weights else squares) / n)
    # Nearest rank: the smallest value with at least p% of the samples at or below it.
    seen = list(itertools.accumulate(weights)) if weights else range(1, n + 1)
    result = {"mean": mean, "std": std}
    for p in PERCENTILES:
        result[f"p{p}"] = values[bisect.bisect_left(seen, max(1, math.ceil(p / 100 * n)))]
    return result


def summarize(requests: list, itl: Optional[Counter] = None, slos: Optional[dict] = None,
              since: Optional[float] = None) -> dict:
    """The vllm bench serve result keys for a list of finished requests. `itl` gives every
    inter-token gap in seconds as a count; without it the gaps come from token_times. `slos`
    ({"ttft": ms, ...}) adds goodput, as vllm bench serve --goodput counts it. Rates are over the
    time from the first send (or `since`) to the last token, or to the end of a measured request
    that failed after it (vllm bench serve's duration is the benchmark's: its failures' time too)."""
    done = [r for r in requests if r.error is None and r.first_token_s is not None]
    if itl is None:
        itl = Counter(b - a for r in done if r.token_times for a, b in zip(r.token_times, r.token_times[1:]))
    start = min(map(operator.attrgetter("sent_s"), requests), default=0.0) if since is None else since
    failed_ends = [r.ended_s for r in requests if r.error is not None and getattr(r, "ended_s", None) is not None]
    end = max([r.last_token_s for r in done] + failed_ends, default=start)
    duration = end - start
    ms = 1000
    samples = {name: [v for v in map(figure, done) if v is not None] for name, figure in REQUEST_MS.items()}
    samples["itl"] = Counter({gap * ms: count for gap, count in itl.items()})
    total_in = sum(map(operator.attrgetter("prompt_tokens"), done))
    total_out = sum(map(operator.attrgetter("output_tokens"), done))
    per_second = (lambda x: x / duration) if duration > 0 else (lambda x: 0.0)
    result = {
        "duration": duration,
        "completed": len(done),
        "failed": len(requests) - len(done),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": per_second(len(done)),
        "output_throughput": per_second(total_out),
        "total_token_throughput": per_second(total_in + total_out),
    }
    # Time to first answer token: only where some request reasons (without reasoning it is TTFT).
    thinking = any(getattr(r, "reasoning_tokens", 0) for r in done)
    if thinking:
        samples["ttfa"] = [(r.answer_s - r.sent_s) * ms for r in done if r.answer_s is not None]
    for name in METRICS + (("ttfa",) if thinking else ()):
        d = distribution(samples[name])
        result[f"mean_{name}_ms"] = d["mean"]
        result[f"median_{name}_ms"] = d["p50"]
        result[f"std_{name}_ms"] = d["std"]
        for p in PERCENTILES[1:]:
            result[f"p{p}_{name}_ms"] = d[f"p{p}"]
    if thinking:
        result["total_reasoning_tokens"] = sum(getattr(r, "reasoning_tokens", 0) for r in done)
        result["answered"] = len(samples["ttfa"])
    result["request_goodput"] = None
    if slos:
        good = sum(meets_slos(r, slos) for r in done)
        result.update(request_goodput=per_second(good), good_requests=good,
                      goodput_share=good / len(requests) if requests else 0.0, goodput_slos_ms=dict(slos))
    failures = [r.error for r in requests if r.error is not None]
    result["errors_by_kind"] = dict(Counter(map(error_kind, failures)))
    result["first_error_by_kind"] = {}
    for error in failures:
        result["first_error_by_kind"].setdefault(error_kind(error), error)
    return result


GOODPUT_METRICS = ("ttft", "tpot", "e2el", "ttfa")
GOODPUT_HELP = ("count the requests that meet every bound, as vllm bench serve's flag: ttft:MS, tpot:MS (per request: "
                "(e2e - ttft) / (output tokens - 1)), e2el:MS, ttfa:MS (time to the first answer token of a reasoning "
                "model; ttft without thinking); reports request_goodput (good requests/s) and goodput_share")


def meets_slos(request, slos: dict) -> bool:
    """A completed request is good when every bound given holds (ms), with vLLM's per-request
    TPOT: (E2E - TTFT) / (output tokens - 1), 0 for a one-token answer."""
    ttft = (request.first_token_s - request.sent_s) * 1000
    e2el = (request.last_token_s - request.sent_s) * 1000
    tpot = (e2el - ttft) / (request.output_tokens - 1) if request.output_tokens > 1 else 0.0
    # A reasoning model's first answer token; without thinking it is the first token, and a
    # request that thought and never answered has not met any ttfa bound.
    answer = request.answer_s if getattr(request, "answer_s", None) is not None else \
        math.inf if getattr(request, "reasoning_tokens", 0) else request.first_token_s
    seen = {"ttft": ttft, "tpot": tpot, "e2el": e2el, "ttfa": (answer - request.sent_s) * 1000}
    return all(seen[metric] <= bound for metric, bound in slos.items())


def error_kind(error: str) -> str:
    return error.split(":", 1)[0] if ":" in error else error


def first_failure(report: dict) -> Optional[str]:
    """The reason the report's first failed request gave, if any failed."""
    return next(iter((report.get("first_error_by_kind") or {}).values()), None)


def number(value: Optional[float], digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def knee_text(tokens: float) -> str:
    """A batch in tokens per step as a sentence shows it: 197, 35,416,667, or 0.4 (never "0")."""
    return f"{tokens:,.0f}" if tokens >= 10 else f"{tokens:.2g}"


def count_text(value: float) -> str:
    """A count, or the mean of the seeds' counts to a tenth (0.3 failed is not 0 failed)."""
    return f"{value:,.0f}" if value == int(value) else f"{value:,.1f}"


def detailed_arrays(requests: list) -> dict:
    """Per-request arrays, as vllm bench serve --save-detailed writes them (seconds)."""
    def gaps(r):
        times = r.token_times or []
        return [b - a for a, b in zip(times, times[1:])]
    ok = [r.error is None and r.first_token_s is not None for r in requests]
    ends = [None if good or getattr(r, "ended_s", None) is None else r.ended_s - r.sent_s
            for r, good in zip(requests, ok)]
    return {
        "input_lens": [r.prompt_tokens for r in requests],
        "output_lens": [r.output_tokens if good else 0 for r, good in zip(requests, ok)],
        "ttfts": [r.first_token_s - r.sent_s if good else None for r, good in zip(requests, ok)],
        "itls": [gaps(r) if good else [] for r, good in zip(requests, ok)],
        "latencies": [r.last_token_s - r.sent_s if good else None for r, good in zip(requests, ok)],
        "start_times": [r.sent_s for r in requests],
        "errors": [r.error or "" for r in requests],
        # What a request streamed before it failed (its tokens, and its first token's time): the
        # arrays above count it as vllm bench serve does, as nothing.
        "failed_streamed": [None if good else
                            {"tokens": len(r.token_times), "ttft": r.token_times[0] - r.sent_s} if r.token_times else
                            dict(zip(("tokens", "ttft"), r.streamed)) if getattr(r, "streamed", None) else None
                            for r, good in zip(requests, ok)],     # (loadgen's records stream; a report's requests were read)
        **({"ttfas": [r.answer_s - r.sent_s if good and r.answer_s is not None else None
                      for r, good in zip(requests, ok)]}
           if any(getattr(r, "reasoning_tokens", 0) for r in requests) else {}),
        # When each failed request ended, from its send: the run's duration reaches it (summarize).
        **({"failed_ends": ends} if any(e is not None for e in ends) else {}),
    }


# ---------------------------------------------------------------------------------------------
# Variations on the core, one section each, in the lesson's order of exercises. Each one
# overrides what differs and nothing else; deleting a section deletes a feature.
# ---------------------------------------------------------------------------------------------

# Serving engines (--engine): what differs between vLLM, SGLang, TensorRT-LLM and llama.cpp once
# the GPU's work is priced: the engine's own CPU work each step and for each sequence in it, whether
# it prepares the next step while the GPU runs this one (async scheduling: a step then costs the
# slower of the two, not their sum), the batch sizes its CUDA graphs are captured at (a decode step
# computes its batch padded up to the next one), and its scheduling rules. The kernel cost model
# prices with the first three; the scheduler takes the rules. Sources, read in each engine's code at
# the version named: vLLM 0.19 (vllm/config/*.py, vllm/v1/cudagraph_dispatcher.py), SGLang 0.5.23
# (python/sglang/srt/arg_groups/*.py, managers/scheduler.py), TensorRT-LLM 1.0 (tensorrt_llm/
# commands/serve.py, llm_args.py, and its docs), llama.cpp 0c1e570 (common/common.h, server).

# The kernel model's one fitted constant: how much longer a real step's kernels take than the
# kernel model prices them. Fitted by `validate` on every source of the published runs (it prints
# the fit); validate scores each source with the fit from the others alone.
KERNEL_SCALE = 1.27


@dataclass(frozen=True)
class EngineProfile:
    name: str
    step_cpu_ms: float        # the engine's CPU work a step, whatever its size
    seq_cpu_ms: float         # ... and per sequence in the step (inputs, sampling, detokenizing)
    overlap: bool             # async scheduling: a step costs max(GPU, CPU), not their sum
    graph_sizes: Callable     # max_num_seqs -> the decode batch sizes captured as CUDA graphs, ascending
    pad_to_graph: bool        # a decode batch runs at the next captured size (else only at a captured one)
    prefill_apart: bool       # a step prefills or decodes, never both (SGLang)
    reserve_output: bool      # admit a request only if its prompt and all its output fit (TensorRT-LLM)
    defaults: Callable        # Hardware -> the knobs as the engine sets them when not given
    kernel_scale: float = KERNEL_SCALE   # a real step's kernel time over the kernel model's
    kv_of_free: bool = False  # --gpu-memory-utilization is a share of what the weights and activations leave
    static_share: bool = False  # ... is of the weights and the KV cache alone: what it leaves is the reserve
    base: str = ""            # a profile file's: the engine whose rules, graphs and defaults it keeps

    # What a profile file (calibrate --fit engine writes one) sets; the rest is the base engine's.
    FILE_FIELDS = ("step_cpu_ms", "seq_cpu_ms", "overlap", "kernel_scale")

    @property
    def rules(self) -> str:
        """The engine whose rules, graphs and defaults this one runs: its base, else itself."""
        return self.base or self.name


def vllm_graphs(max_num_seqs: int) -> list[int]:
    # [1, 2, 4] + 8..248 by 8 + 256.. by 16, up to min(2 x max_num_seqs, 512) (vllm/config/vllm.py
    # _set_cudagraph_sizes at v0.33.0, the same pattern since 0.12).
    top = min(2 * max_num_seqs, 512)
    return [n for n in [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)] if n <= top]


def sglang_graphs(max_num_seqs: int) -> list[int]:
    # [1, 2, 4, 8, 12] + 16..256 by 8 + 272..496 by 16 + 512.. by 32 (cuda_graph_hook.py); 256 by default.
    return [n for n in [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16)] if n <= 256]


def trtllm_graphs(max_num_seqs: int) -> list[int]:
    # Decode-only graphs at 1..31, 32, 64, 128 without padding (llm_args.py).
    return [*range(1, 33), 64, 128]


def no_graphs(max_num_seqs: int) -> list[int]:
    return []


def vllm_defaults(hardware: Hardware) -> dict:
    # vllm serve's batch limits by device memory (vllm/engine/arg_utils.py get_batch_defaults):
    # 160 GiB and up 1024 sequences / 16,384 tokens; 70 GiB and up, A100 excluded, 1024 / 8,192;
    # others 256 / 2,048. 16-token blocks, 0.9 of memory (vllm/config/cache.py at v0.19.0). V1 turns
    # automatic prefix caching on unless told --no-enable-prefix-caching (CacheConfig's
    # enable_prefix_caching; tests/v1/engine/test_engine_args.py, test_prefix_caching_from_cli).
    # On a CPU, 128 sequences and 2,048 tokens for the API server, times the world size (the same
    # function's CPU branch; vllm_batch_defaults multiplies).
    memory = hardware.memory_gib
    seqs, tokens = (128, 2048) if not hardware.kernel_floor_us else (1024, 16384) if memory >= 160 else \
        (1024, 8192) if memory >= 70 and "a100" not in hardware.name else (256, 2048)
    return {"max_num_seqs": seqs, "max_num_batched_tokens": tokens, "block_size": 16, "gpu_memory_utilization": 0.9,
            "prefix_caching": True}


def vllm_batch_defaults(spec: "RunSpec", given: set) -> dict:
    """What vLLM then makes of its batch defaults, for the knobs not given (EngineArgs.
    _set_default_max_num_seqs_and_batched_tokens_args, vllm/engine/arg_utils.py): on a CPU both
    scale with the world size (TP x PP); without chunked prefill the token budget is at least
    --max-model-len, so any prompt fits a step; it is at most max_num_seqs x --max-model-len; and
    max_num_seqs at most the budget."""
    seqs, tokens, length = spec.max_num_seqs, spec.max_num_batched_tokens, spec.model_len()
    if not spec.hardware.kernel_floor_us:
        seqs, tokens = seqs * spec.gpus_per_replica if "max_num_seqs" not in given else seqs, \
            tokens * spec.gpus_per_replica if "max_num_batched_tokens" not in given else tokens
    if "max_num_batched_tokens" not in given:
        tokens = min(seqs * length, max(length, tokens) if not spec.chunked_prefill else tokens)
    if "max_num_seqs" not in given:
        seqs = min(seqs, tokens)
    return {"max_num_seqs": seqs, "max_num_batched_tokens": tokens}


def sglang_defaults(hardware: Hardware) -> dict:
    # chunked_prefill_size by memory (python/sglang/srt/arg_groups/memory_hook.py at 031ed82d,
    # handle_gpu_memory_settings): under 20 GiB 2,048, under 60 4,096, under 160 8,192, else 16,384;
    # max_running_requests is bounded by memory (2,048 to 4,096), the radix cache is on. The memory
    # share is worked out from the device (sglang_memory_share); 0.88 where it has none (a CPU).
    memory = hardware.memory_gib
    chunk = 2048 if memory < 20 else 4096 if memory < 60 else 8192 if memory < 160 else 16384
    return {"max_num_seqs": 2048, "max_num_batched_tokens": chunk, "block_size": 16, "prefix_caching": True,
            "gpu_memory_utilization": 0.88}


def sglang_memory_share(spec: "RunSpec") -> float:
    """SGLang's mem_fraction_static when not given (the same function): what a GPU of `memory` MB
    keeps once it reserves 512 MB, 1.5 MB a token of the prefill chunk (at least 2,048 tokens),
    1 GiB per 8 GPUs of the TP x PP group, and 2 MB a batch size of its largest decode CUDA graph
    (8 under 20 GiB, 48 under 35 and 32 under 60 below TP 4, else 160; 256 under 160 GiB below
    TP 4, else 512), and at least 10 GiB on a GPU of more than 60. Left out: the prefill graphs'
    8 MB each where that backend is on, and the sizing after graph capture some builds plan."""
    memory, tp = spec.hardware.memory_gib * 1024, spec.tensor_parallel_size
    graph = 8 if memory < 20 * 1024 else (48 if tp < 4 else 160) if memory < 35 * 1024 else \
        (32 if tp < 4 else 160) if memory < 60 * 1024 else (256 if tp < 4 else 512) if memory < 160 * 1024 else 512
    chunk = spec.max_num_batched_tokens if spec.chunked_prefill else 2048    # (SGLang's -1: its 2,048 floor)
    reserved = 512 + max(chunk, 2048) * 1.5 + spec.gpus_per_replica / 8 * 1024 + graph * 2
    if memory > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    share = round((memory - reserved) / memory, 3)
    if share <= 0:
        raise UserError(f"--engine sglang on {spec.hardware.name}: a prefill chunk of {chunk:,} tokens "
                        f"(--max-num-batched-tokens) and its CUDA graphs leave SGLang no memory share "
                        f"({reserved / 1024:,.1f} GiB of {spec.hardware.memory_gib:g}); give a smaller chunk or "
                        f"--gpu-memory-utilization")
    return share


def trtllm_defaults(hardware: Hardware) -> dict:
    # trtllm-serve: max_batch_size 2,048, max_num_tokens 8,192 (BuildConfig), chunked prefill off,
    # tokens_per_block 32 and block reuse on (KvCacheConfig).
    return {"max_num_seqs": 2048, "max_num_batched_tokens": 8192, "block_size": 32, "chunked_prefill": False,
            "prefix_caching": True}


def llamacpp_defaults(hardware: Hardware) -> dict:
    # llama-server with --parallel left to auto: 4 slots over one unified KV buffer, batches of
    # n_batch 2,048 tokens (common/common.h; tools/server/server.cpp).
    return {"max_num_seqs": 4, "max_num_batched_tokens": 2048}


ENGINES = {e.name: e for e in [
    # vLLM V1: framework overhead about 0.4 ms per decode step (vllm-project/vllm#42131, B200) and about
    # 1.1 us per sequence in the scheduler alone (#46112, a lower bound); async scheduling on from 0.14
    # (vllm/config/scheduler.py, vllm/config/vllm.py).
    EngineProfile("vllm", 0.4, 0.0011, True, vllm_graphs, True, False, False, vllm_defaults),
    # SGLang: no published per-step figure; the overlap scheduler is on (disable_overlap_schedule
    # False); a step runs a prefill batch when it has one, else decodes (managers/scheduler.py).
    EngineProfile("sglang", 0.0, 0.0, True, sglang_graphs, True, True, False, sglang_defaults, static_share=True),
    # TensorRT-LLM 1.0's PyTorch backend: 45 ms of host time an iteration at batch 1,536 (NVIDIA/
    # TensorRT-LLM#10273), about 0.029 ms a sequence, hidden by the overlap scheduler (on by default);
    # decode-only CUDA graphs, not padded; admission by GUARANTEED_NO_EVICT, the default capacity
    # policy: prompt + max output must fit. Its memory fraction (kv_cache_free_gpu_mem_fraction, 0.9)
    # is of what the weights and activations leave once the model loads: (total - peak + allocated)
    # x fraction (tensorrt_llm/_torch/pyexecutor/_util.py, KvCacheCreator._cal_max_memory), the peak
    # taken after a dry run with activations; servesim's reserve stands for that peak.
    EngineProfile("trtllm", 0.0, 0.029, True, trtllm_graphs, False, False, True, trtllm_defaults, kv_of_free=True),
    # llama.cpp: its CPU costs are the device's (calibrate them); no CUDA graphs on a CPU.
    EngineProfile("llamacpp", 0.0, 0.0, False, no_graphs, False, False, False, llamacpp_defaults),
]}


class NoEvict:
    """Mixed in before a scheduler class: TensorRT-LLM's GUARANTEED_NO_EVICT. A request is admitted
    only if the blocks it needs to finish, its prompt and all its output, fit beside what every
    running request still needs to finish; so nothing is ever preempted."""

    needed = 0                # blocks the running requests need to finish, summed

    def admissible(self, request: Request, hits: list[int], need: int) -> bool:
        if not super().admissible(request, hits, need):
            return False
        # Summed over the running requests, (blocks to finish - blocks held) - free blocks is
        # needed - (in use + extra holds) - (all - in use): only running requests hold blocks, and
        # a block they share is held once per holder. So the shortfall is kept in O(1) from
        # `needed`, which changes only when a request starts or leaves. (A block a cruising decode
        # grew into and has not taken yet, the event engine's, is in neither count.)
        short = self.needed - self.pool.num_blocks - self.pool.extra_holds
        return self.blocks_for(request.total - 1) - len(hits) + short <= 0

    def start(self, request: Request, hits: list[int], start: int, now: float) -> None:
        super().start(request, hits, start, now)
        self.needed += self.blocks_for(request.total - 1)

    def release(self, request: Request) -> None:
        super().release(request)
        self.needed -= self.blocks_for(request.total - 1)

    def longest_prefill(self, request: Request) -> int:
        # Never preempted, so never recomputed with its output: only the prompt is prefilled at once
        # (trtllm-bench raises max_num_tokens to the longest prompt plus the batch for this reason).
        return request.prompt_tokens


class PrefillApart:
    """Mixed in before a scheduler class: SGLang's rule, a step prefills (running prompts' next
    chunks, then new requests) when it can and decodes only when there is nothing to prefill.
    A step with nothing to prefill is an ordinary one, so the event engine may cruise through it;
    one with something is taken by the per-step rule, every request as it stands."""

    def schedule(self, now: float) -> Batch:
        # A decode the event engine carries along is a decode: only the requests it handles one by
        # one can have a prompt left to compute.
        if not self.waiting and all(r.generated and r.remaining == 1 for r in self.handled()):
            return super().schedule(now)
        self.handle_each()
        self.aside = [r for r in self.running if r.generated and r.remaining == 1]
        set_aside = {id(r) for r in self.aside}
        self.running = [r for r in self.running if id(r) not in set_aside]
        self.handle_each()       # (the event engine's one-by-one list follows the running list)
        batch = super().schedule(now)
        self.running = sorted(self.running + self.aside, key=operator.attrgetter("admitted"))
        self.aside = []
        self.handle_each()
        return batch if batch.seqs else super().schedule(now)


# The kernel-level cost model (--cost-model kernels): the lesson's roofline, applied per kernel.
# A step runs two kinds of kernel that do not overlap: the linear layers (GEMMs), which stream
# the weights once and do 2 FLOPs per weight per token, and attention, which streams each
# sequence's KV and does 4 FLOPs per head dimension per (query, key) pair. Each kind costs the
# slower of its arithmetic and its memory traffic; the step costs both, each kernel's fixed floor,
# and the serving engine's CPU work (hidden behind the GPU's when the engine overlaps them).
# What it adds to the lesson's roofline, each from a published source:
# - Embeddings are gathered, a row per token, not streamed (vLLM's VocabParallelEmbedding is an
#   index lookup); the output projection runs once per sequence, for its last token, because vLLM
#   computes logits only at each request's last position (logits_indices in its model runner).
# - GEMMs run in tiles of 128 rows, so a step of T tokens costs ceil(T / 128) tiles (tile
#   quantization: NVIDIA's "Matrix Multiplication Background" guide; Sarathi-Serve measures a
#   257-token chunk 32% slower than a 256-token one); a decode batch is first padded up to the
#   engine's next CUDA graph size.
# - Attention's arithmetic is counted, so a long prefill is quadratic in its prompt, and a chunk
#   attends to everything before it.
# - Efficiencies are achieved fractions from published kernel measurements, per device, in the
#   Hardware fields gemm_efficiency, attention_efficiency and bandwidth_efficiency.
# - Each kernel takes at least the device's kernel_floor_us (a decoder layer runs 9: four GEMMs
#   (qkv, o, gate_up, down), two fused add-norms, rotary, attention, the activation), plus its
#   kernel_launch_us when the step runs outside a CUDA graph (a prefill, or a batch too big for one).
# - A mixture-of-experts layer's experts cost a fixed time beside the bytes they read: routing,
#   sorting the tokens by expert and two grouped GEMMs whose few rows per expert fill the GPU
#   poorly. vLLM's benchmark_moe.py on an H100 (vllm-project/vllm#24700: Qwen3-30B-A3B, FP8, TP 1)
#   times the fused experts at 40.4 us for one token and 247.7 us for 128, which read 37.7 MB and
#   604 MB of experts: 27 us plus the bytes at 81% of peak bandwidth. The same shape in BF16 on a
#   B200 (vllm-project/vllm#31447: 39.6 us for one token, 75.5 MB) leaves 27.5 us, so the fixed part
#   is not the device's bandwidth. It is a measured kernel time, so the fitted scale leaves it alone;
#   the bytes beside it stream at bandwidth_efficiency and take the scale, which prices that layer
#   6-13% slower than the benchmark (the test holds the unscaled sum within 10%).

GEMM_TILE = 128
KERNELS_PER_LAYER = 9
MOE_LAYER_US = 27.0


class KernelCost(Roofline):
    def __init__(self, hardware: Hardware, model: ModelSpec, gemm_tflops: Optional[float] = None,
                 engine: Optional[EngineProfile] = None, max_num_seqs: int = 256):
        super().__init__(hardware, model, gemm_tflops)
        embedding, lm_head = model.embedding_params, model.lm_head_params
        tied = model.tie_word_embeddings
        self.linear_flops_per_token = 2 * (model.compute_params - embedding - (0 if tied else lm_head))
        self.lm_head_flops_per_seq = 2 * lm_head
        # What a step streams: every weight but the embedding table, so the roofline's weights_read
        # (experts touched, and all the rest) applies to it unchanged.
        self.weight_bytes = self.streamed_bytes = model.weight_bytes - (0 if tied else embedding) * model.weight_dtype_bytes
        self.gemm_flops_per_second = (gemm_tflops or hardware.tflops) * 1e12 * hardware.gemm_efficiency
        self.attention_flops_per_pair = 4 * model.layers * model.query_heads * model.head_dim
        self.attention_flops_per_second = hardware.tflops * 1e12 * hardware.attention_efficiency
        self.stream_bytes_per_second = hardware.bandwidth_gbs * 1e9 * hardware.bandwidth_efficiency
        self.engine = engine or ENGINES["vllm"]
        self.graphs = self.engine.graph_sizes(max_num_seqs)
        kernels = KERNELS_PER_LAYER * model.layers
        self.graphed_floor = kernels * hardware.kernel_floor_us / 1e6
        self.eager_floor = kernels * (hardware.kernel_floor_us + hardware.kernel_launch_us) / 1e6
        # A device with no kernel floor is a CPU: its GEMMs (ggml's) run by the row, not in tensor-core
        # tiles, and it pays its calibrated step and sequence overheads in place of kernel floors.
        self.on_cpu = not hardware.kernel_floor_us
        self.tile = 1 if self.on_cpu else GEMM_TILE
        self.experts_fixed = model.layers * MOE_LAYER_US / 1e6 if model.experts and not self.on_cpu else 0.0

    def times(self, tokens: float, context_tokens: float) -> tuple[float, float]:
        compute = self.linear_flops_per_token * tokens / self.gemm_flops_per_second
        memory = (self.weights_read(tokens) + context_tokens * self.kv_bytes_per_token) / self.stream_bytes_per_second
        return compute, memory

    def step_seconds(self, tokens: float, context_tokens: float, seqs: float = 1, pairs: float = 0,
                     largest: float = 0) -> float:
        return self.priced(self.fixed_seconds(tokens, seqs), pairs, context_tokens)

    def fixed_seconds(self, tokens: float, seqs: float) -> tuple[float, float, float]:
        """What a step's batch fixes, whatever its context: (its kernel floor and GEMMs, in the
        CUDA graph and tiles they run in; a CPU server's calibrated cost; the engine's CPU time)."""
        rows, floor = tokens, self.eager_floor
        if tokens == seqs and self.graphs and tokens <= self.graphs[-1]:      # a decode step in a CUDA graph
            captured = self.graphs[bisect.bisect_left(self.graphs, tokens)]
            if self.engine.pad_to_graph or captured == tokens:
                rows, floor = captured, self.graphed_floor
        tile = self.tile
        tiles = -(-rows // tile) * tile
        head_tiles = -(-seqs // tile) * tile
        gemm = max((self.linear_flops_per_token * tiles + self.lm_head_flops_per_seq * head_tiles)
                   / self.gemm_flops_per_second, self.weights_read(tokens) / self.stream_bytes_per_second)
        calibrated = (self.step_overhead_ms + seqs * self.seq_overhead_ms) / 1000 if self.on_cpu else 0.0
        cpu = (self.engine.step_cpu_ms + seqs * self.engine.seq_cpu_ms) / 1000
        return floor + gemm, calibrated, cpu

    def priced(self, fixed: tuple[float, float, float], pairs: float, context_tokens: float) -> float:
        """A step's seconds: what its batch fixes, plus its attention over the context."""
        kernels, calibrated, cpu = fixed
        attention = max(self.attention_flops_per_pair * pairs / self.attention_flops_per_second,
                        context_tokens * self.kv_bytes_per_token / self.stream_bytes_per_second)
        # Real kernels run slower than this ideal by one factor, fitted on published runs (KERNEL_SCALE).
        gpu = calibrated + (kernels + attention) * self.engine.kernel_scale + self.experts_fixed
        return max(gpu, cpu) if self.engine.overlap else gpu + cpu

    def decode_pricing(self, seqs: int) -> Callable[[float], float]:
        """As Roofline's: what the batch fixes worked out once (fixed_seconds), the rest priced
        by the same method step_seconds prices it with."""
        if type(self).step_seconds is not KernelCost.step_seconds:
            return priced_by_rule(self, seqs)
        fixed, priced = self.fixed_seconds(seqs, seqs), self.priced
        return lambda context: priced(fixed, context, context)


COST_MODELS = {"roofline": Roofline, "kernels": KernelCost}
DEFAULT_COST_MODEL = "roofline"


# In-flight cap (the Easy exercise): admit a request only while prompt + output, summed over the
# running requests, stays within a cap, counted the way TGI's --max-batch-total-tokens counts.

class InFlightCap:
    """Mixed in before a scheduler class: one more admission check and one more rejection."""

    def __init__(self, *args, max_tokens_in_flight: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_tokens_in_flight = max_tokens_in_flight

    def rejection(self, request: Request) -> Optional[str]:
        if request.total > self.max_tokens_in_flight:
            reason = f"longer than --max-tokens-in-flight: {size_of(request)} > {self.max_tokens_in_flight:,}"
        else:
            reason = None
        return super().rejection(request) or reason

    def admissible(self, request: Request, hits: list[int], need: int) -> bool:
        in_flight = sum(r.total for r in itertools.chain(self.running, self.aside))
        return super().admissible(request, hits, need) and in_flight + request.total <= self.max_tokens_in_flight


# Static batching (the reference engine's run_static): when the last batch is done, take up to
# --max-num-seqs waiting requests in order, as many as the cache holds once every row is padded
# to the longest prompt and reserves the longest output; prefill them at once, then decode every
# row until the slowest is done. A row that finished early is still computed.

@dataclass
class StaticBatch:
    rows: int
    padded_prompt: int
    longest_output: int
    decode_steps: int = 0


class StaticBatchScheduler(Scheduler):
    """Always stepped by the per-step rule: a padded batch has no cruising decodes."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.shape: Optional[StaticBatch] = None

    def capacity(self) -> int:
        return self.pool.num_blocks * self.config.block_size

    def token_budget(self) -> int:
        return 1 << 62                # the padded batch is prefilled whole: no per-step budget

    def rejection(self, request: Request) -> Optional[str]:
        # A row reserves its prompt plus its whole output, so that much must fit an empty cache.
        reason = (f"larger than the KV cache for static batching, where a row holds its prompt and its "
                  f"whole output: {size_of(request)} > {self.capacity():,}") if request.total > self.capacity() else None
        return super().rejection(request) or reason

    def admit(self, now: float, budget: int, batch: Batch) -> None:
        if self.running or not self.waiting:
            return
        rows: list[Request] = []
        for request in itertools.islice(self.waiting, self.config.max_num_seqs):
            trial = rows + [request]
            padded = max(r.length for r in trial) + max(r.output_tokens - r.generated for r in trial)
            if len(trial) * padded > self.capacity():
                break
            rows = trial
        if not rows:
            return
        self.shape = StaticBatch(len(rows), max(r.length for r in rows), max(r.output_tokens - r.generated for r in rows))
        for request in rows:
            self.waiting.popleft()
            self.start(request, [], 0, now)
            self.grow(request, request.length, self.blocks_for(request.length))
            batch.add(request, request.length)

    def schedule(self, now: float) -> Batch:
        batch = super().schedule(now)
        if self.shape:
            batch.rows = self.shape.rows if self.shape.decode_steps else 0
        return batch

    def work(self, batch: Batch) -> tuple[int, int, int, int]:
        s = self.shape
        if s is None:
            return super().work(batch)
        if s.decode_steps == 0:       # the prefill: every row left-padded to the longest prompt
            prompt = s.padded_prompt
            return s.rows * prompt, s.rows * prompt, s.rows, s.rows * prompt * (prompt + 1) // 2
        width = s.padded_prompt + s.decode_steps
        return s.rows, s.rows * width, s.rows, s.rows * width

    def reserved_tokens(self) -> int:
        s = self.shape
        return s.rows * (s.padded_prompt + s.longest_output) if s else super().reserved_tokens()

    def update(self, batch: Batch, now: float) -> None:
        super().update(batch, now)
        if self.shape:
            self.shape.decode_steps += 1
            if not self.running:
                self.shape = None


# Slots (llama.cpp with an explicit --parallel): the cache is split evenly into one fixed
# context per sequence, allocated up front. A slot is a block as long as that context.

class SlotLayout:
    """Mixed in before a scheduler class."""

    def __init__(self, config: SchedulerConfig, num_blocks: int, *args, kv_tokens: int, **kwargs):
        slot = kv_tokens // config.max_num_seqs
        super().__init__(replace(config, block_size=slot), config.max_num_seqs, *args, **kwargs)

    def rejection(self, request: Request) -> Optional[str]:
        slot = self.config.block_size
        reason = (f"the request exceeds the available context size: {size_of(request)} > one slot's "
                  f"{slot:,} (--kv-tokens / --max-num-seqs)") if request.total > slot else None
        return super().rejection(request) or reason

    def reserved_tokens(self) -> int:
        return self.pool.num_blocks * self.config.block_size


# Prefill/decode disaggregation (the Hard exercise): one engine only prefills, another only
# decodes. The prefill engine's scheduler hands each request over after its first token (the
# one hook in the core, Scheduler.handoff); its KV crosses a link before the decode engine can
# take it. Transfers queue on the link.

@dataclass
class KvLink:
    gbs: float
    kv_bytes_per_token: int
    decode: Engine
    free_at: float = 0.0
    transfers: int = 0
    busy_s: float = 0.0
    wait_s: float = 0.0

    def send(self, request: Request, ready: float) -> None:
        start = max(ready, self.free_at)
        seconds = request.computed * self.kv_bytes_per_token / (self.gbs * 1e9)
        self.free_at = arrival = start + seconds
        self.transfers += 1
        self.busy_s += seconds
        self.wait_s += arrival - ready
        # The first token, sampled by the prefill engine, reaches the user with the KV.
        if request.answer_s == request.first_token_s:      # no thinking: the first token is the answer's
            request.answer_s = arrival
        request.first_token_s = request.last_token_s = arrival
        if request.token_times:
            request.token_times[-1] = arrival
        self.decode.deliver(arrival, request)

    def report(self, span: float) -> dict:
        return {"gbs": self.gbs, "transfers": self.transfers,
                "mean_wait_ms": self.wait_s / self.transfers * 1000 if self.transfers else None,
                "busy": self.busy_s / span if span else 0.0}


# A host tier for the KV cache (vLLM's --kv-offloading-size GiB, --kv-offloading-backend
# native|lmcache): every full block the engine computes is also stored in host memory, which
# keeps the most recently used ones; a waiting request whose prefix goes on in host memory past
# what HBM still holds leaves the queue while those blocks load over PCIe, and comes back with
# them computed, so the engine runs the others meanwhile (vLLM's asynchronous load). Stores are
# asynchronous copies on the link's other direction: they cost no step time, and the report says
# how busy they kept it. Simplified: the loaded request's HBM blocks are taken when it comes back,
# not when its load starts, and the blocks HBM already held are taken again, not shared.

HOST_LINK_EFFICIENCY = 0.8     # pinned copies: ~50 of 63 GB/s one way on an H100 (vLLM blog 2025-12-29, offloading connector)


def check_offloading(spec: RunSpec) -> None:
    hardware, gpus = spec.hardware, spec.tensor_parallel_size
    if spec.disaggregate or spec.kv_layout == "slots" or spec.batching == "static":
        raise UserError("--kv-offloading-size is simulated on the paged, continuous engine: drop --disaggregate, "
                        "--kv-layout slots and --batching static")
    if hardware.host_link_gbs <= 0:
        raise UserError(f"{hardware.name} has no host_link_gbs (GB/s per direction between a GPU and host memory): "
                        f"add it to the hardware JSON to give it a host tier")
    if hardware.host_link_gbs < 0.1:
        raise UserError(f"{hardware.name}'s host_link_gbs {hardware.host_link_gbs:g} is below any PCIe link's; give GB/s "
                        f"per direction (PCIe Gen4 x16: 31.5, Gen5 x16: 63)")
    gpus = spec.gpus_per_replica
    if hardware.host_memory_gib and spec.kv_offloading_size > hardware.host_memory_gib * gpus:
        raise UserError(f"--kv-offloading-size {spec.kv_offloading_size:g} GiB: {hardware.name}'s instance has "
                        f"{hardware.host_memory_gib * gpus:g} GiB of host memory for {gpus} GPU{'s' * (gpus > 1)}; "
                        f"give less, or a hardware JSON with your machine's host_memory_gib")


class HostTier:
    """The keys of the blocks host memory holds, least recently used first out, and the traffic
    on the link to it. Each GPU of a tensor-parallel group moves its own share of a block over
    its own link, so a transfer takes one device's bytes over one link."""

    def __init__(self, blocks: int, device_block_bytes: float, gbs: float):
        self.capacity, self.block_bytes = blocks, device_block_bytes
        self.rate = gbs * 1e9 * HOST_LINK_EFFICIENCY
        self.keys: OrderedDict = OrderedDict()
        self.stored = self.evicted = self.loaded = self.loads = self.hit_tokens = 0
        self.reloads = 0         # loads of a preempted request's own KV, which no prompt lookup counts
        self.load_free_at = self.load_wait_s = 0.0

    def store(self, key) -> None:
        if key in self.keys:
            self.keys.move_to_end(key)
            return
        self.keys[key] = None
        self.stored += 1
        if len(self.keys) > self.capacity:
            self.keys.popitem(last=False)
            self.evicted += 1

    def found(self, keys: Iterable) -> int:
        """How many of these keys, from the first, host memory holds; each found is used again."""
        count = 0
        for key in keys:
            if key not in self.keys:
                break
            self.keys.move_to_end(key)
            count += 1
        return count

    def load(self, blocks: int, now: float) -> float:
        """When `blocks` asked for now are in HBM: loads queue on the link in the order asked."""
        start = max(now, self.load_free_at)
        self.load_free_at = start + blocks * self.block_bytes / self.rate
        self.loads += 1
        self.loaded += blocks
        self.load_wait_s += self.load_free_at - now
        return self.load_free_at


class TieredPool(BlockPool):
    def __init__(self, num_blocks: int, host: HostTier):
        super().__init__(num_blocks)
        self.host = host

    def register_all(self, blocks: list[int], keys: list) -> None:
        super().register_all(blocks, keys)
        for key in keys:
            self.host.store(key)    # written through: host memory holds every block computed


class Offloaded:
    """Mixed in before a scheduler class: a host tier behind its block pool."""

    def __init__(self, *args, host: HostTier, **kwargs):
        super().__init__(*args, **kwargs)
        self.pool, self.host = TieredPool(self.pool.num_blocks, host), host
        self.deliver: Optional[Callable] = None     # the engine's: a loaded request comes back by its inbox
        self.looked_up: Optional[tuple] = None      # (the head, its HBM hits) as admit last looked them up

    def add(self, request: Request) -> None:
        # Back from its load: it keeps its place at the head of the queue, as vLLM's request waiting
        # for its KV never left the queue.
        if request.computed:           # behind those back before it, in the order they came back
            place = 0
            while place < len(self.waiting) and self.waiting[place].computed:
                place += 1
            self.waiting.insert(place, request)
        else:
            super().add(request)

    def admit(self, now: float, budget: int, batch: Batch) -> None:
        size = self.config.block_size
        while self.waiting and self.waiting[0].computed == 0:
            request = self.waiting[0]
            hits = self.cache_hits(request)
            more = self.host.found(block_key(request, i, size) for i in range(len(hits), (request.length - 1) // size))
            if not more:
                # The core admits this head next, before the pool changes: its lookup is this one.
                self.looked_up = (request, hits)
                break
            self.waiting.popleft()
            request.computed = (len(hits) + more) * size
            if request.queue_s is None:       # counted once a request, as the pool counts its lookups
                self.host.hit_tokens += more * size
            else:
                self.host.reloads += 1
            self.deliver(self.host.load(more, now), request)
        super().admit(now, budget, batch)
        self.looked_up = None

    def cache_hits(self, request: Request) -> list[int]:
        seen = self.looked_up
        if seen and seen[0] is request:
            self.looked_up = None
            return seen[1]
        return super().cache_hits(request)


def host_tier_report(tiers: list[HostTier], span: float, block_size: int, queries: int) -> dict:
    """Both tiers' prefix hits and the host link's traffic, over every replica's tier."""
    gb = lambda blocks: blocks * tiers[0].block_bytes / 1e9 / len(tiers)     # each replica's GPUs move their own
    loads = sum(t.loads for t in tiers)
    hits = sum(t.hit_tokens for t in tiers)
    return {"blocks": sum(t.capacity for t in tiers), "tokens": sum(t.capacity for t in tiers) * block_size,
            "host_hit_rate": hits / queries if queries else 0.0, "host_hit_tokens": hits,
            "stored_gb_per_gpu": gb(sum(t.stored for t in tiers)), "loaded_gb_per_gpu": gb(sum(t.loaded for t in tiers)),
            "loads": loads, "reloads": sum(t.reloads for t in tiers),
            "mean_load_wait_ms": sum(t.load_wait_s for t in tiers) / loads * 1000 if loads else None,
            "evicted_blocks": sum(t.evicted for t in tiers),
            "store_link_busy": gb(sum(t.stored for t in tiers)) * 1e9 / tiers[0].rate / span if span > 0 else 0.0,
            "load_link_busy": gb(sum(t.loaded for t in tiers)) * 1e9 / tiers[0].rate / span if span > 0 else 0.0}


# Tensor parallelism (vLLM's --tensor-parallel-size N): every weight matrix is split across N
# devices, and so are the query and KV heads (a KV head is replicated when N exceeds them), so each
# device holds 1/N of the weights and of each token's KV, and computes 1/N of each step. After the
# attention and after the MLP of every layer the devices all-reduce the activations. vLLM's "GPU KV
# cache size" counts tokens across the group: a block spans the N devices.

def tensor_shard(model: ModelSpec, tp: int) -> ModelSpec:
    """What one device of a tensor-parallel group holds and computes."""
    if tp == 1:
        return model
    if model.kv_heads % tp and tp % model.kv_heads:
        raise UserError(f"--tensor-parallel-size {tp}: {model.name}'s {model.kv_heads} KV heads do not split "
                        f"evenly over {tp} devices (vLLM needs one to divide the other)")
    if model.query_heads % tp:
        raise UserError(f"--tensor-parallel-size {tp}: {model.name}'s {model.query_heads} attention heads do not "
                        f"split evenly over {tp} devices (vLLM needs {tp} to divide them)")
    return replace(model, params=model.params / tp, active_params=model.active_params / tp,
                   kv_heads=max(1, model.kv_heads // tp), heads=max(1, model.query_heads // tp),
                   hidden_size=model.hidden_size or model.query_heads * model.head_dim,
                   vocab_size=-(-model.vocab_size // tp))


# An all-reduce inside one node, as the engines run it. vLLM (and SGLang and TensorRT-LLM, whose
# kernels are of the same two kinds) sends a message under 8 MiB through its own kernel when the
# group is a pair of GPUs with peer-to-peer access or up to 8 GPUs all joined by NVLink
# (vllm-project/vllm vllm/distributed/device_communicators/custom_all_reduce.py: max_size
# 8192 * 1024, _SUPPORTED_WORLD_SIZES, "not supported on more than two PCIe-only GPUs"):
# - one-shot, each GPU reading every peer's whole message and summing: on a pair always, and on
#   up to 4 GPUs below 512 KiB, up to 8 below 256 KiB (csrc/custom_all_reduce.cuh);
# - two-shot, a reduce-scatter then an all-gather, above that.
# Their fixed times and rates are read off vLLM's CUDA-graphed microbenchmark of both kernels on
# four H100s (vllm-project/vllm#24532: one-shot 10, 14, 19, 23, 30, 38 us and two-shot 17, 18,
# 25, 26, 35, 42 us at 0.5, 1, 1.5, 2, 3, 4 MiB; #24111's run agrees within 1 us but two-shot at
# 1.5 MiB, 27): one-shot 6 us plus (N - 1) messages at the link's achieved rate, two-shot 10 us
# plus twice its 2(N - 1)/N of the message, within 3 us of each figure. The same constants stand
# for every device and group size: no other was measured this way.
#
# Anything else goes to NCCL, priced as its tuning model prices a ring (NVIDIA/nccl
# src/graph/tuning.cc at 5067397c, LL protocol): a base latency of 6.6 us, plus 2(N - 1) steps of
# the link's latency (interconnect_latency_us), plus 2(N - 1)/N of the bytes at the link's
# achieved bandwidth: by default 0.85 of its peak (H200 NVSwitch copies at 88%, an A100 all-reduce
# at 80% of NVLink: stas00/ml-engineering network/README.md), or a device's own link_efficiency
# where it was measured.
CUSTOM_ALL_REDUCE_MAX_BYTES = 8 * 2**20
ONE_SHOT_US, TWO_SHOT_US = 6.0, 10.0
ALLREDUCE_BASE_US = 6.6


class GroupStep:
    """One device's step in a group of `size` GPUs: its own share of the work (`inner`), plus
    what the group sends between them each step (communication_seconds, per kind of group)."""

    def __init__(self, inner: Roofline, hardware: Hardware, model: ModelSpec, size: int):
        if hardware.interconnect_gbs <= 0:
            raise UserError(f"{hardware.name} has no interconnect_gbs (GB/s per direction between its GPUs): "
                            f"add it to the hardware JSON to run {size} of them as one group")
        self.inner = inner
        self.link = hardware.link_bytes_per_second
        self.activation_bytes = 2 * (model.hidden_size or model.query_heads * model.head_dim)   # BF16
        self.layers = model.layers

    def communication_seconds(self, tokens: float) -> float:
        raise NotImplementedError

    def step_seconds(self, tokens: float, context_tokens: float, seqs: float = 1, pairs: float = 0,
                     largest: float = 0) -> float:
        return self.inner.step_seconds(tokens, context_tokens, seqs, pairs) + self.communication_seconds(tokens)

    def decode_pricing(self, seqs: int) -> Callable[[float], float]:
        inner, communication = self.inner.decode_pricing(seqs), self.communication_seconds(seqs)
        return lambda context: inner(context) + communication

    def times(self, tokens: float, context_tokens: float) -> tuple[float, float]:
        return self.inner.times(tokens, context_tokens)

    def critical_batch(self) -> float:
        return self.inner.critical_batch()


class Parallel(GroupStep):
    """One device's step in a tensor-parallel group: its own share of the work, plus the group's
    two all-reduces a layer (after attention and after the MLP), each of one step's activations,
    by the engine's own kernel where it runs one (`engine`: a profile's rules), else NCCL's ring."""

    def __init__(self, inner: Roofline, hardware: Hardware, model: ModelSpec, tp: int, engine: str = "vllm",
                 network: Optional[tuple[float, float]] = None):
        super().__init__(inner, hardware, model, tp)
        self.tp = tp
        self.latency = (ALLREDUCE_BASE_US + 2 * (tp - 1) * hardware.interconnect_latency_us) / 1e6
        # llama.cpp has no such kernel: its ring is the one priced.
        self.own_kernel = engine != "llamacpp" and tp <= 8 and (hardware.nvlink or (tp == 2 and hardware.peer_to_peer))
        self.network = network
        if network:
            # A group larger than a node: (bytes/s, seconds a send) of the network between nodes. The
            # engines' own kernels need every GPU in one node (vLLM turns its custom all-reduce off
            # for a group that spans nodes), and NCCL's ring moves at its slowest link, every step.
            self.link, hop = network
            self.latency = ALLREDUCE_BASE_US / 1e6 + 2 * (tp - 1) * hop
            self.own_kernel = False

    def kernel(self, message: float) -> str:
        """Which all-reduce a message of this many bytes takes: one-shot, two-shot or ring (NCCL's)."""
        if not self.own_kernel or message >= CUSTOM_ALL_REDUCE_MAX_BYTES:
            return "ring"
        return "one-shot" if self.tp == 2 or message < (512 if self.tp <= 4 else 256) * 1024 else "two-shot"

    def all_reduce_seconds(self, message: float) -> float:
        n, kernel = self.tp, self.kernel(message)
        if kernel == "one-shot":
            return ONE_SHOT_US / 1e6 + (n - 1) * message / self.link
        if kernel == "two-shot":
            return TWO_SHOT_US / 1e6 + 2 * (2 * (n - 1) / n) * message / self.link
        return self.latency + 2 * (n - 1) / n * message / self.link

    def communication_seconds(self, tokens: float) -> float:
        return 2 * self.layers * self.all_reduce_seconds(tokens * self.activation_bytes)


# Replicas behind a router (vLLM's --data-parallel-size N, or N servers behind llm-d or SGLang's
# router): N engines on one virtual clock, each with its own cache; each request goes to one of
# them at the moment it arrives.

ROUTERS = ("round-robin", "least-loaded", "prefix-aware")
# sgl-router's --cache-threshold, --balance-abs-threshold and --balance-rel-threshold defaults.
PREFIX_ROUTER_MATCH, PREFIX_ROUTER_ABS, PREFIX_ROUTER_REL = 0.3, 64, 1.5


class Router:
    def __init__(self, engines: list[Engine], policy: str, spans: Optional[list] = None):
        self.engines, self.policy = engines, policy
        self.arrivals: list = []          # heap of (time, order sent, request) not yet routed
        self.sent = itertools.count()
        self.turn = 0
        # Replicas that come and go: each engine's (asked, ready, leave) spans; it takes requests
        # only while ready and not yet let go. None: every engine, always.
        self.spans = spans

    def arrive(self, request: Request, at: float) -> None:
        heapq.heappush(self.arrivals, (at, next(self.sent), request))

    def next_event(self) -> float:
        return self.arrivals[0][0] if self.arrivals else math.inf

    def route_next(self) -> None:
        at, _, request = heapq.heappop(self.arrivals)
        self.send(request, at)

    def send(self, request: Request, at: float) -> None:
        self.choose(request, self.serving(at)).deliver(at, request)

    def serving(self, at: float) -> list[Engine]:
        if self.spans is None:
            return self.engines
        return [e for e, spans in zip(self.engines, self.spans) if any(ready <= at < leave for _, ready, leave in spans)]

    def choose(self, request: Request, engines: list[Engine]) -> Engine:
        if self.policy == "round-robin":
            self.turn += 1
            return engines[(self.turn - 1) % len(engines)]
        load = lambda e: len(e.scheduler.waiting) + len(e.scheduler.running) + len(e.inbox)
        if self.policy == "prefix-aware":
            # SGLang's cache-aware router, with its defaults: while the loads are balanced, the
            # replica whose cache holds the longest run of the prompt, if that run is over 30% of
            # it; otherwise, or once the busiest replica has 64 more requests than the idlest and
            # 1.5 times as many, the least loaded.
            loads = [load(e) for e in engines]
            balanced = max(loads) - min(loads) <= PREFIX_ROUTER_ABS or max(loads) <= PREFIX_ROUTER_REL * min(loads)
            hits = [len(e.scheduler.cache_hits(request)) for e in engines]
            blocks = request.prompt_tokens / engines[0].scheduler.config.block_size
            if balanced and max(hits) > PREFIX_ROUTER_MATCH * blocks:
                return min((e for e, h in zip(engines, hits) if h == max(hits)), key=load)
        return min(engines, key=load)


class Replicas:
    """Several engines on one virtual clock, which simulate() drives as one server: replicas
    behind a router (each request routed the moment it arrives, on the replicas' state then), or
    a prefill engine handing its requests to a decode engine (no router: every request goes to
    the first). Whatever comes first, an arrival or any engine's next step, happens next."""

    def __init__(self, engines: list[Engine], router: Optional[Router] = None, apart: bool = False):
        self.engines, self.router = engines, router
        self.current = engines[0]
        # Replicas behind a router touch each other only where a request is routed. When no
        # request's end sends another (open loop, no conversations), each may run on alone to the
        # next arrival: it is then where the interleaved clock would have put it.
        self.apart = apart and router is not None
        self.due: Optional[Engine] = None      # what next_event() found comes next: an engine, or an arrival

    def deliver(self, at: float, request: Request, now: bool = False) -> None:
        if not self.router:
            self.engines[0].deliver(at, request)
        elif now:
            self.router.send(request, at)
        else:
            self.router.arrive(request, at)

    def arrival(self) -> float:
        return self.router.next_event() if self.router else math.inf

    def next_event(self) -> float:
        """The earliest of the next arrival and every engine's next event; take_next() acts on the
        one found here (an arrival first on a tie, then the first engine)."""
        when, self.due = self.arrival(), None
        for engine in self.engines:
            at = engine.next_event()
            if at < when:
                when, self.due = at, engine
        return when

    def take_next(self) -> Optional[bool]:
        if self.due is None:
            self.router.route_next()
            return None
        self.current = self.due
        return self.due.take_next()

    def advance(self, until: float) -> None:
        """The engine that moved last goes on until an arrival or another engine may reach it."""
        engine = self.current
        others = () if self.apart else (e.next_event() for e in self.engines if e is not engine)
        engine.advance(min(until, self.arrival(), *others))

    @property
    def clock(self) -> float:
        return self.current.clock

    @property
    def steps(self) -> int:
        return sum(e.stats.steps for e in self.engines)


# Mixtures of experts: all experts sit in memory, but a token computes only the shared weights
# and its experts_per_token experts (ModelSpec's active_params), and a step streams only the
# experts its tokens touch. Expert parallelism (vLLM's --enable-expert-parallel, across the
# data-parallel replicas) gives each device a share of the experts and an all-to-all per layer.

class ExpertRead:
    """Mixed in before a cost model. T tokens each choosing k of E experts touch
    E x (1 - (1 - k/E)^T) of them: a few for one decode, all for a long prefill. With expert
    parallelism a device's experts see the tokens of every device in the group."""

    def __init__(self, hardware: Hardware, model: ModelSpec, *args, **kwargs):
        super().__init__(hardware, model, *args, **kwargs)
        self.expert_bytes = model.expert_bytes
        self.miss = 1 - model.experts_per_token / model.experts
        self.tokens_per_expert_token = 1 / model.expert_share

    def weights_read(self, tokens: float) -> float:
        return self.weight_bytes - self.expert_bytes * self.miss ** (tokens * self.tokens_per_expert_token)

    def critical_batch(self) -> float:
        """The tokens at which the arithmetic catches up with the read of the experts those tokens
        touch (not of the few one token touches): the read grows with the batch, so bisect."""
        def compute_bound(tokens: float) -> bool:
            compute, memory = self.times(tokens, 0)
            return compute >= memory

        low, high = 1.0, 2.0
        while not compute_bound(high) and high < 1e9:
            low, high = high, high * 2
        for _ in range(60):
            middle = (low + high) / 2
            low, high = (low, middle) if compute_bound(middle) else (middle, high)
        return high


def cost_model(name: str, hardware: Hardware, model: ModelSpec, gemm_tflops: Optional[float] = None,
               engine: Optional[EngineProfile] = None, max_num_seqs: int = 256) -> Roofline:
    """How a step of this model on this device is priced: the cost model `name` (the kernel model
    with the serving engine's costs), reading only the experts a step touches when the model is a
    mixture of experts."""
    cls = COST_MODELS[name]
    if model.experts:
        cls = type(f"Expert{cls.__name__}", (ExpertRead, cls), {})
    if cls is KernelCost or issubclass(cls, KernelCost):
        return cls(hardware, model, gemm_tflops, engine, max_num_seqs)
    return cls(hardware, model, gemm_tflops)


def expert_shard(model: ModelSpec, ep: int) -> ModelSpec:
    """Expert parallelism over ep devices: each holds its experts and all the rest. vLLM gives the
    first E mod ep devices one expert more; the busiest device is the one priced."""
    return replace(model, expert_share=-(-model.experts // ep) / model.experts) if ep > 1 else model


class ExpertParallel(GroupStep):
    """A device's step in an expert-parallel group, as vLLM runs one by default (all2all_backend
    allgather_reducescatter, vllm/distributed/device_communicators/all2all.py): before each MoE
    layer every rank gathers every rank's tokens, and after it reduce-scatters their results; each
    moves (N - 1) ranks' tokens' activations, the ranks taken as busy as this one, at the
    interconnect's achieved bandwidth, with NCCL's ring latency (see Parallel)."""

    def __init__(self, inner, hardware: Hardware, model: ModelSpec, ep: int):
        super().__init__(inner, hardware, model, ep)
        self.ep = ep
        self.latency = (ALLREDUCE_BASE_US + (ep - 1) * hardware.interconnect_latency_us) / 1e6

    def communication_seconds(self, tokens: float) -> float:
        moved = (self.ep - 1) * tokens * self.activation_bytes
        return 2 * self.layers * (self.latency + moved / self.link)     # gather, then reduce-scatter


# vLLM's data-parallel ranks of a mixture of experts step in lockstep: the expert layers of every
# rank synchronise in every forward pass, so while any rank has requests, the others run empty
# ("dummy") passes beside it (docs/serving/data_parallel_deployment.md, vLLM 0.12 to 0.19). A step
# of the group therefore lasts as long as its slowest rank's, one rank's prefill holds up the
# others' decodes, and a request reaching an idle rank waits for the group's step to end.

def lockstep(replicas: int, model: ModelSpec, engine: EngineProfile) -> bool:
    return replicas > 1 and bool(model.experts) and engine.rules == "vllm"


class Lockstep(Replicas):
    """Replicas on one clock that step together: each schedules its own batch, and every one's
    step ends when the slowest ends. (Per step: the event engine's runs of plain steps are one
    engine's.)"""

    def take_next(self) -> Optional[bool]:
        first = min(e.next_event() for e in self.engines)
        if self.arrival() <= first:
            self.router.route_next()
            return None
        for engine in self.engines:       # one clock: an idle rank's is moved with the others'
            engine.catch_up(first)
        return any(e.has_work() for e in self.engines)

    def advance(self, until: float) -> None:
        start = self.engines[0].clock
        steps = [(e, *e.schedule_step()) for e in self.engines if e.has_work()]
        priced = [d for _, _, d in steps if d is not None]
        if not priced:
            return
        duration = max(priced)
        for engine, batch, own in steps:
            if own is not None:
                engine.end_step(batch, duration)
        for engine in self.engines:       # the ranks with nothing to run ran an empty pass
            if engine.clock < start + duration:
                engine.clock = start + duration


# Pipeline parallelism (vLLM's --pipeline-parallel-size N): the layers split into N stages, each on
# its own GPU (or tensor-parallel group), each holding its layers' weights and its layers' KV for
# every token. vLLM keeps N micro-batches in flight (one per virtual engine) so every stage works
# while the others do: the running batch is split into min(N, sequences) micro-batches, and a
# request gets its next token once its micro-batch has passed all N stages and the N - 1 hand-offs
# between them. A step (every running request's next token) therefore costs N stage-times of one
# micro-batch, plus the hand-offs: with N micro-batches the stages are never idle; with fewer, the
# difference is the bubble. A hand-off crosses NVLink inside a node, the network between nodes.

def check_pipeline(spec: RunSpec) -> None:
    pp, model = spec.pipeline_parallel_size, spec.model
    if model.layers % pp:
        raise UserError(f"--pipeline-parallel-size {pp}: {model.name}'s {model.layers} layers do not split into {pp} "
                        f"equal stages (vLLM then splits them unevenly, or as VLLM_PP_LAYER_PARTITION says; servesim "
                        f"does not model uneven stages): use a divisor of {model.layers}")
    if spec.enable_expert_parallel or spec.disaggregate or spec.speculative_tokens or spec.batching == "static":
        raise UserError("--pipeline-parallel-size is simulated with tensor parallelism and replicas only: drop "
                        "--enable-expert-parallel, --disaggregate, speculative decoding and --batching static")
    if spec.hardware.interconnect_gbs <= 0 and spec.gpus_per_replica > 1 and spec.gpus_per_node > 1:
        raise UserError(f"{spec.hardware.name} has no interconnect_gbs (GB/s between its GPUs in a node): add it to "
                        f"the hardware JSON, or pass --gpus-per-node {spec.tensor_parallel_size} so every stage "
                        f"hands off over the network")


def pipeline_shard(model: ModelSpec, pp: int) -> ModelSpec:
    """What the fullest stage holds and computes: 1/pp of the layers, and one vocabulary-sized
    matrix: the first stage's embedding table or the last stage's output projection (vLLM loads
    each on its own stage, a tied one on both). The fullest stage sets the pace of the pipeline,
    and vLLM sizes every stage's KV cache by the worker with the least memory free. Modelled as
    the last stage: its layers and the projection, streamed each step (as a tied table is)."""
    if pp == 1:
        return model
    matrix = model.embedding_params               # (0 when the vocabulary is not known: an even split)
    ends = matrix * (1 if model.tie_word_embeddings else 2)
    stage = lambda params: (params - ends) / pp + matrix if params else 0.0
    return replace(model, params=stage(model.params), active_params=stage(model.active_params),
                   layers=model.layers // pp, sliding_layers=model.sliding_layers // pp,
                   tie_word_embeddings=bool(matrix) or model.tie_word_embeddings)


def pipeline_layers(model: ModelSpec, pp: int) -> ModelSpec:
    """Each of the other pp - 1 stages, for a step's time: the model less the fullest stage
    (pipeline_shard), spread evenly, so the stages add up to the whole model (the first stage's
    embedding table among them, priced as an ordinary weight: the roofline prices it so in one
    piece too; the kernel model, which does not stream it there, is a little slow here)."""
    last = pipeline_shard(model, pp)
    rest = lambda whole, fullest: (whole - fullest) / (pp - 1) if whole else 0.0
    return replace(model, params=rest(model.params, last.params), active_params=rest(model.active_params, last.active_params),
                   layers=model.layers // pp, sliding_layers=model.sliding_layers // pp, vocab_size=0,
                   tie_word_embeddings=False)


class Pipeline:
    """`stage`: the fullest stage's step (the last: its layers and the output projection);
    `layers`: a stage of layers alone. A micro-batch passes pp - 1 of the one and one of the other."""
    def __init__(self, stage, layers, hardware: Hardware, model: ModelSpec, spec: "RunSpec"):
        self.stage, self.layers, self.pp = stage, layers, spec.pipeline_parallel_size
        self.activation_bytes = 2 * (model.hidden_size or model.query_heads * model.head_dim)   # BF16
        tp, per_node = spec.tensor_parallel_size, spec.gpus_per_node
        # Hand-off i goes from the stage on GPUs [i*tp, (i+1)*tp) to the next: across the network
        # when the two stages sit in different nodes.
        self.hops = []
        for i in range(1, self.pp):
            apart = (i * tp) // per_node != ((i - 1) * tp) // per_node or tp > per_node
            self.hops.append((spec.inter_node_gbs * 1e9, spec.inter_node_latency_us / 1e6) if apart else
                             (hardware.link_bytes_per_second, hardware.interconnect_latency_us / 1e6))

    def micro_batches(self, seqs: float) -> float:
        return max(1.0, min(self.pp, seqs))

    def handoff_seconds(self, tokens: float) -> float:
        return sum(latency + tokens * self.activation_bytes / gbs for gbs, latency in self.hops)

    def step_seconds(self, tokens: float, context_tokens: float, seqs: float = 1, pairs: float = 0,
                     largest: float = 0) -> float:
        # Micro-batches are made of whole requests: the one holding the step's largest chunk holds
        # at least that (a prompt is not split over micro-batches, so a pipeline makes it no
        # faster), and its share of the batch passes every stage. (0: not known, an even split.)
        m = self.micro_batches(seqs)
        f = max(1 / m, largest / tokens if tokens else 0.0)
        work = (tokens * f, context_tokens * f, seqs * f, pairs * f)
        return (self.pp - 1) * self.layers.step_seconds(*work) + self.stage.step_seconds(*work) \
            + self.handoff_seconds(tokens * f)

    def decode_pricing(self, seqs: int) -> Callable[[float], float]:
        return priced_by_rule(self, seqs)

    def times(self, tokens: float, context_tokens: float) -> tuple[float, float]:
        (compute, memory), (c, m) = self.stage.times(tokens, context_tokens), self.layers.times(tokens, context_tokens)
        return compute + (self.pp - 1) * c, memory + (self.pp - 1) * m

    def critical_batch(self) -> float:
        return self.stage.critical_batch() * self.pp      # each of the pp micro-batches reaches the knee


# Speculative decoding (vLLM's --speculative-config: num_speculative_tokens K, and a draft model or
# n-gram prompt lookup): each step a decoding sequence brings K proposed tokens, the model computes
# all K + 1 positions in one pass, keeps the proposals up to the first one it disagrees with, and
# adds one token of its own. With each proposal accepted with probability A, a step yields
# (1 - A^(K+1)) / (1 - A) tokens in expectation. The draws are seeded, so a run repeats.
#
# Each request draws from its own stream (seeded by the run's seed and its id), one draw u per
# verify step: the run of proposals the target model would accept is how many m in 1..K have
# u < A^m (so P(run >= m) = A^m), and the step keeps as many of them as it proposed. So a request
# accepts the same runs whoever steps it: the event engine draws a cruising decode's ahead.

class SpeculativeScheduler(Scheduler):
    def __init__(self, *args, speculative_tokens: int, acceptance_rate: float, seed: int,
                 draft: Optional[Roofline] = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.proposals, self.acceptance = speculative_tokens, acceptance_rate
        self.seed = seed
        self.odds = [acceptance_rate ** m for m in range(1, speculative_tokens + 1)]   # P(run >= m)
        self.streams: dict[int, random.Random] = {}    # request id -> its draws, while it runs
        self.draft = draft            # the draft model's cost, or None for n-gram lookup (free)
        self.spec_steps = self.spec_tokens = 0

    def stream(self, request: Request) -> random.Random:
        stream = self.streams.get(request.id)
        if stream is None:     # (seeded by text, so that seeds -7 and 7, and every id, stay apart)
            stream = self.streams[request.id] = random.Random(f"accept:{self.seed}:{request.id}")
        return stream

    def next_run(self, request: Request) -> int:
        """The run of proposals the request's next verify step would accept (of K)."""
        u = self.stream(request).random()
        return sum(u < odds for odds in self.odds)

    def wanted(self, request: Request) -> int:
        if request.remaining == 1 and request.generated:     # decoding: verify the proposals too
            return 1 + min(self.proposals, request.output_tokens - request.generated - 1)
        return request.remaining

    def update(self, batch: Batch, now: float) -> None:
        plain = Batch()
        for request, tokens in batch.items:
            if request.computed + 1 == request.length and request.generated and tokens > 1:
                self.verify(request, tokens - 1, now)
            else:
                plain.items.append((request, tokens))
        super().update(plain, now)

    def verify(self, request: Request, proposed: int, now: float) -> None:
        accepted = min(self.next_run(request), proposed)
        request.computed += 1 + accepted          # the accepted proposals' KV stays
        self.spec_steps += 1
        self.spec_tokens += accepted + 1
        self.emit(request, now, accepted + 1)     # they arrive together, at the end of the step

    def release(self, request: Request) -> None:
        super().release(request)
        if request.finished:
            self.streams.pop(request.id, None)

    def drafting(self, batch: Batch) -> tuple[int, int]:
        """(sequences, their KV tokens) the draft model proposes for in this step."""
        drafting = [r for r, tokens in batch.items if tokens > 1 and r.computed + 1 == r.length and r.generated]
        return len(drafting), sum(r.computed for r in drafting)

    def extra_seconds(self, batch: Batch) -> float:
        if self.draft is None:
            return 0.0
        seqs, context = self.drafting(batch)
        # K sequential passes of the draft model over the decoding sequences.
        return self.proposals * self.draft.step_seconds(seqs, context, seqs, context) if seqs else 0.0

    def report(self) -> dict:
        return {"speculative_tokens": self.proposals, "acceptance_rate": self.acceptance,
                "draft": "n-gram" if self.draft is None else "draft model",
                "verify_steps": self.spec_steps,
                "mean_accepted_length": self.spec_tokens / self.spec_steps if self.spec_steps else None,
                "expected_accepted_length": expected_accepted_length(self.proposals, self.acceptance)}


def expected_accepted_length(k: int, a: float) -> float:
    """Tokens a verify step yields on average: the accepted run of K proposals, plus one."""
    return k + 1.0 if a >= 1 else (1 - a ** (k + 1)) / (1 - a)


# ---------------------------------------------------------------------------------------------
# Speed: the same rule with work per event, not per token. The per-step Scheduler above is the
# rule and the test oracle: code/tests/test_engine.py runs both on random cases and compares
# every output, and code/bench.py times both.
# ---------------------------------------------------------------------------------------------

class EventScheduler(Scheduler):
    """In most steps most running requests are plain decodes: one token, not their last, nothing
    else changes for them. Such a decode *cruises*: it advances with a shared step counter and
    costs nothing per step. It is handled on its own again at its wake step (the step of its last
    token, or of a reasoning model's first answer token), when it is released, or when the budget
    or the blocks run out before the end of the running list, where every request goes through
    the per-step rule itself.

    A cruising decode that grows into a block owes it: the free count subtracts it at once, and
    the decode takes it when it wakes. Without prefix caching no block has a key, so which block a
    decode gets cannot be seen. With it, the blocks owed are taken off the free list in one go
    before anything else reads or changes it (a lookup, an allocation): the same least recently
    used blocks, with the same contents evicted, as one at a time at each crossing. A decode keys
    the blocks it filled when it wakes, and nobody could have found them sooner: a block a decode
    fills holds its own answer, which only its conversation's next turn (sent once it has ended)
    or the request itself (recomputing after a preemption) looks up. Keys make the order of
    releases seen, so there a decode at its last token is handled in the step's batch, released
    in running order with the others, unless ending is all that happens in its step (let_go)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.steps = 0                       # steps done: the counter cruising decodes advance with
        self.last_end = 0.0                  # when the last step ended: every cruising decode's last token
        self.step_ends: list[float] = []     # each step's end, kept for --detailed token times
        self.active: list[Request] = []      # running requests handled one by one, in running order
        self.cruising = 0
        self.cruising_measured = 0           # of them, requests the metrics count (not warm-up)
        self.cruise_base = 0                 # sum over cruising decodes of (computed - steps)
        self.wake: dict[int, list] = defaultdict(list)   # step -> [(request, its cruise_from)]
        self.wake_steps: list[int] = []      # a heap of the steps in `wake`
        self.blocked = False                 # the last step's admission left its head waiting
        self.finishing: list[Request] = []   # cruising decodes whose last token is this step's
        self.lazy_blocks = not self.config.prefix_caching
        self.owed = 0                        # blocks cruising decodes grew into and have not taken
        self.prepaid: list[int] = []         # ... taken off the free list for them (prefix caching)
        self.phase: dict[int, int] = {}      # cruising decodes by (computed - steps) % block_size

    def schedule(self, now: float) -> Batch:
        while self.wake_steps and self.wake_steps[0] <= self.steps:
            heapq.heappop(self.wake_steps)
        due = self.wake.pop(self.steps, None)
        woken = [request for request, since in due if request.cruise_from == since] if due else []
        if woken and self.lazy_blocks:
            # Without keys a wake is a last token (or a first answer token), and the order of
            # releases cannot be seen: decodes at their last token take it with the others and
            # leave in update().
            ends = [self.at_last_token(r, self.steps) for r in woken]
            self.finishing = [r for r, end in zip(woken, ends) if end]
            woken = [r for r, end in zip(woken, ends) if not end]
        if woken:
            for request in woken:
                self.settle(request)
            self.active = sorted(self.active + woken, key=operator.attrgetter("admitted")) \
                if self.active or len(woken) > 1 else woken
        budget = self.token_budget() - self.cruise_tokens()
        crossing = self.crossing()
        free = self.free_blocks() - crossing
        last = self.running[-1] if self.running else None
        plan = []
        for request in self.active:
            wanted = self.wanted(request)
            tokens = min(wanted, budget)
            need = self.blocks_for(request.computed + tokens) - len(request.blocks)
            free -= need
            # The budget or the blocks run out before the end of the running list: this step is
            # for the per-step rule (only the last request may be cut short here).
            if tokens < 1 or (tokens < wanted and request is not last) or free < 0:
                return self.per_step(now)
            plan.append((request, tokens, need))
            budget -= tokens
        if budget < 0 or free < 0:
            return self.per_step(now)
        batch = self.cruise_batch()
        self.owed += crossing
        self.pay()
        for request, tokens, need in plan:
            self.grow(request, tokens, need)
            batch.add(request, tokens)
        if self.waiting:
            self.admit(now, budget, batch)
        # Refused with nobody else scheduled: refused again by every plain step after this one.
        # Not with prefix caching: a block a cruising decode grows into can evict one of the
        # head's cached blocks, after which it asks for fewer new blocks and may fit.
        self.blocked = bool(self.waiting) and not batch.items and self.lazy_blocks
        return batch

    def per_step(self, now: float) -> Batch:
        self.handle_each()
        return super().schedule(now)

    # What the cruising decodes do in this step: each takes one token, and (lazily) a block when
    # it crosses into one. (Speculative decoding's cruise differs: SpeculativeCruise.)
    def cruise_tokens(self) -> int:
        return self.cruising

    def crossing(self) -> int:
        """Blocks the cruising decodes grow into this step."""
        return self.phase.get(-self.steps % self.config.block_size, 0)

    def cruise_batch(self) -> Batch:
        n = self.cruising
        context = self.cruise_base + n * self.steps + n     # each reads its KV plus its new token
        return Batch([], n, context, n, n, n, context)

    def at_last_token(self, request: Request, step: int) -> bool:
        """Whether a cruising decode takes its last token in `step`."""
        return request.output_tokens - request.generated == step - request.cruise_from + 1

    def only_ends(self, step: int) -> bool:
        """Whether every decode that wakes at `step` takes its last token there: such a step is a
        plain step but for letting them go after it (let_go)."""
        due = [r for r, since in self.wake.get(step, ()) if r.cruise_from == since]
        return bool(due) and all(self.at_last_token(r, step) for r in due)

    def let_go(self, step: int) -> None:
        """After `step`, taken as a plain step: its decodes at their last token leave, in the order
        the per-step rule's update() lets them go (running order: with prefix caching, the order
        their blocks join the free list, which decides what is evicted first)."""
        while self.wake_steps and self.wake_steps[0] <= step:
            heapq.heappop(self.wake_steps)
        due = [request for request, since in self.wake.pop(step) if request.cruise_from == since]
        self.end(sorted(due, key=operator.attrgetter("admitted")), len(self.done))

    def end(self, finishing: list[Request], ended: int) -> None:
        """Cruising decodes that took their last token leave; `ended` is how many had ended
        before this step."""
        for request in finishing:
            self.release(request)
            self.done.append(request)
        if len(self.done) - ended > 1:
            # The per-step rule ends a step's requests in running order, and a conversation's
            # next turns are sent in the order their turns ended: keep that order.
            self.done[ended:] = sorted(self.done[ended:], key=operator.attrgetter("admitted"))

    def handled(self) -> list[Request]:
        return self.active

    def handle_each(self) -> None:
        self.pay()
        for request in self.running:
            if request.cruise_from >= 0:
                self.settle(request)
        self.active = list(self.running)
        self.finishing = []
        self.wake.clear()
        self.wake_steps.clear()
        self.blocked = False          # a step that preempted did not try to admit

    def update(self, batch: Batch, now: float) -> None:
        ended = len(self.done)
        super().update(batch, now)
        if self.cruising_measured:
            self.count_gaps(now - self.last_end, self.cruising_measured)
        self.steps += 1
        self.last_end = now
        if self.detailed:
            self.step_ends.append(now)
        if self.finishing:
            self.end(self.finishing, ended)
        self.finishing = []
        active, self.active = self.active, []
        for request in active:
            wake = self.wake_step(request, now)
            if wake is None:
                self.active.append(request)
            else:
                self.cruise(request, wake)

    def wake_step(self, request: Request, now: float) -> Optional[int]:
        """The step at which a decode that sampled a token now must next be handled on its own,
        or None if that is the next step (or it is not a plain decode)."""
        if request.remaining != 1 or request.last_token_s != now:
            return None               # still prefilling, or not served this step
        plain = request.output_tokens - request.generated - 1     # steps before its last token
        if request.answer_s is None:
            plain = min(plain, request.reasoning_tokens - request.generated)  # ... or its first answer token
        return self.steps + plain if plain > 0 else None

    def cruise(self, request: Request, wake: int) -> None:
        self.enlist(request, wake)
        base = request.computed - self.steps
        self.cruise_base += base
        phase = base % self.config.block_size
        self.phase[phase] = self.phase.get(phase, 0) + 1

    def enlist(self, request: Request, wake: int) -> None:
        request.cruise_from, request.wake_at = self.steps, wake
        self.cruising += 1
        self.cruising_measured += request.measured
        if wake not in self.wake:
            heapq.heappush(self.wake_steps, wake)
        self.wake[wake].append((request, self.steps))

    def delist(self, request: Request) -> int:
        """The steps a cruising decode advanced; it cruises no more."""
        self.cruising -= 1
        self.cruising_measured -= request.measured
        advanced, request.cruise_from = self.steps - request.cruise_from, -1
        return advanced

    def settle(self, request: Request) -> None:
        """Bring a cruising decode's own fields up to date, and hand it to the one-by-one list's
        caller."""
        base = request.computed - request.cruise_from
        advanced = self.delist(request)
        self.cruise_base -= base
        if advanced:
            request.computed += advanced
            request.generated += advanced
            request.last_token_s = self.last_end
            if request.answer_s is None and request.generated > request.reasoning_tokens:
                request.answer_s = self.last_end     # a decode wakes for its first answer token, unless it is its last
            if request.token_times is not None:
                request.token_times.extend(self.step_ends[self.steps - advanced:self.steps])
        self.phase[base % self.config.block_size] -= 1
        need = self.blocks_for(request.computed) - len(request.blocks)
        if need and self.lazy_blocks:
            request.blocks.extend(self.pool.allocate(need))
            self.owed -= need
        elif need:
            self.pay()
            request.blocks.extend(self.prepaid[-need:])
            del self.prepaid[-need:]
        if not self.lazy_blocks:
            self.pool.key_filled(request, request.computed, self.config.block_size)   # filled while cruising

    def pay(self) -> None:
        """With prefix caching, take the blocks cruising decodes owe off the free list now, as the
        rule took each at its crossing, before the list is read or changed."""
        if self.owed and not self.lazy_blocks:
            self.prepaid += self.pool.allocate(self.owed)
            self.owed = 0

    def cache_hits(self, request: Request) -> list[int]:
        self.pay()       # a router looks between steps: what the rule would have evicted is gone
        return super().cache_hits(request)

    def start(self, request: Request, hits: list[int], start: int, now: float) -> None:
        super().start(request, hits, start, now)
        self.active.append(request)

    def release(self, request: Request) -> None:
        if request.cruise_from >= 0:
            self.settle(request)
        else:
            self.active.remove(request)
        super().release(request)
        self.blocked = False          # its seat and blocks are free: the head may fit now

    def free_blocks(self) -> int:
        return self.pool.free_count() - self.owed

    def used_blocks(self) -> int:
        return self.pool.used_count() + self.owed


    def plain_steps(self) -> Optional[int]:
        """How many of the next steps are certainly plain: every running request cruising, nobody
        waking, nothing to admit (the queue is empty, or its head was refused by budgets that
        cannot loosen until someone wakes, or since). None if the next step is not: someone is
        handled one by one, or may be admitted. Blocks for crossing decodes are checked step by step."""
        if not self.cruising or self.active or (self.waiting and not self.blocked and not self.seats_full()) \
                or self.cruise_tokens() > self.token_budget():
            return None
        return (self.wake_steps[0] if self.wake_steps else math.inf) - self.steps

    def seats_full(self) -> bool:
        """Every seat taken (--max-num-seqs): the queue's head is refused by every plain step, as
        the rule's admission refuses it before anything else (a variant that schedules a queue its
        own way, such as SGLang's prefill first, is asked by the rule)."""
        return type(self).schedule is EventScheduler.schedule \
            and len(self.running) + len(self.aside) >= self.config.max_num_seqs


class EventEngine(Engine):
    """An engine whose scheduler is an EventScheduler. After each step it takes every following
    plain step that starts before `until` in one tight loop: the same pricing, the same
    statistics and the same bookkeeping as step(), in the same order, without scheduling anyone.
    In a plain step nobody is admitted, released or preempted, so what EngineStats.record_step
    reads of the scheduler stays put (the blocks in use move only when a decode crosses into a
    block): the loop reads it once, and brings the statistics' interval up to date only where a
    crossing moves it and at the end. The last step of a run may be one where the first decodes
    to wake take their last token: they leave after it (let_go). A scheduler whose used_blocks()
    or reserved_tokens() moved from step to step on its own (static batching's does) must not be
    stepped here."""

    resume = (0, -1, -1)   # (plain steps left, at which step, with how many waiting) when `until` cut a run short
    ends_send = True       # whether a request's end may send another (simulate() says): its sender is heard first
    pricing: tuple = (0, None)   # (batch size, its decode_pricing)

    def plain_ahead(self) -> int:
        """How many of the next steps the loop may take: the plain ones, and the step where the
        first decodes to wake take their last token, if that is all they do there (they are let
        go after it; not with a timeline, whose snapshot of that step would still count them)."""
        s = self.scheduler
        plain = s.plain_steps()
        if plain is None:
            return 0
        if plain < math.inf and self.timeline is None and s.only_ends(s.steps + plain):
            plain += 1
        return plain

    def advance(self, until: float) -> None:
        s, stats, cost = self.scheduler, self.stats, self.cost
        plain, at_step, waiting = self.resume
        # Arrivals behind a head the last step refused (s.blocked) change none of the steps left:
        # first come, first served, none of them is looked at before the head is admitted.
        came = len(s.waiting) - waiting
        resumed = plain and at_step == s.steps and (not came or (came > 0 and waiting and s.blocked)) \
            and not s.crossing() > s.free_blocks()
        if not resumed:
            # Stepped on, or a request came in, since the run was cut short: its steps may not
            # be plain any more. Unless they are as things stand (as after decodes were let go,
            # with nothing waiting), take a step by the rule, and count the plain ones after it.
            # Either way the first step is taken whatever `until` says.
            plain = self.plain_ahead()
            resumed = plain > 0 and not s.crossing() > s.free_blocks()
            if not resumed:
                ended = len(s.done)
                self.step()
                # A request that ended may make a closed-loop client send its next one: not plain.
                plain = self.plain_ahead() if len(s.done) == ended or not self.ends_send else 0
                if not plain:
                    return
        until = min(until, self.inbox[0][0] if self.inbox else math.inf)
        if self.clock >= until and not resumed:       # something may reach it first: none to take now
            self.resume = (plain, s.steps, len(s.waiting))
            return
        n, measured, block_size = s.cruising, s.cruising_measured, s.config.block_size
        if self.pricing[0] != n:     # a batch size's price is worked out once while it lasts
            self.pricing = (n, cost.decode_pricing(n))
        clock, timeline, price, itl, phase = self.clock, self.timeline, self.pricing[1], s.itl, s.phase
        step_ends = s.step_ends if s.detailed else None
        running, waiting = len(s.running), len(s.waiting)
        held_less = s.pool.extra_holds * block_size
        used, reserved, free = s.used_blocks(), s.reserved_tokens(), s.free_blocks()
        by_blocks = type(s).reserved_tokens is Scheduler.reserved_tokens     # KV reserved: the blocks in use
        begun, last_end, sampled = s.steps, s.last_end, s.sampled
        # The statistics' interval is brought up to date where what it weighs moves (a crossing)
        # and at the end; `read` is the KV read since `first`, held blocks not yet taken off.
        steps = first = begun
        context, read = s.cruise_base + n * steps + n, 0     # each reads its KV plus its new token
        # Gaps are counted as they round to ITL_DIGITS, a run of equal ones at a time: a gap
        # within 0.49 of the last digit of the last one rounded rounds as it did (the difference
        # of two close floats is exact, and a float holds the rounded value to far better than 0.01).
        gap_shown, low, high, repeats = 0.0, math.nan, math.nan, 0
        # A resumed run takes its first step whatever `until` says, as step() would have.
        while plain > 0 and (clock < until or (resumed and steps == begun)):
            crossing = phase.get(-steps % block_size, 0)
            if crossing or steps == begun:
                if crossing > free:
                    break             # a decode needs a block and none is free: the step preempts
                if crossing:          # blocks in use only grow here, so their peaks are taken once, after
                    s.owed += crossing          # (owed blocks count as used, and not as free)
                    used, free = used + crossing, free - crossing
                    reserved = reserved + crossing * block_size if by_blocks else s.reserved_tokens()
                if steps > begun:        # the blocks in use moved: the interval closes here
                    stats.moved(clock, read - held_less * (steps - first), used, running, reserved)
                else:
                    stats.hold(clock, used, running, reserved)
                first, read = steps, 0
            clock += price(context)
            read += context
            context += n
            if measured:
                gap = clock - last_end
                if not low < gap < high:
                    if repeats:
                        itl[gap_shown] = itl.get(gap_shown, 0) + repeats
                    gap_shown, repeats = round(gap, ITL_DIGITS), 0
                    low, high = gap_shown - ITL_SAME, gap_shown + ITL_SAME
                repeats += measured
            steps += 1
            last_end = clock
            if step_ends is not None:
                step_ends.append(clock)
            if timeline is not None:
                s.steps, s.last_end, s.sampled = steps, last_end, sampled + measured * (steps - begun)
                self.snapshot(clock)
            plain -= 1
        if repeats:
            itl[gap_shown] = itl.get(gap_shown, 0) + repeats
        # Cut short by `until` (another engine's event, an arrival) with plain steps left: the
        # next advance goes on with them, unless something reached this engine in between.
        self.resume = (plain, steps, waiting) if plain and clock >= until else (0, -1, -1)
        taken = steps - begun
        if taken:
            stats.ran_to(clock, read - held_less * (steps - first))
            stats.count(taken, n, n, n, s, used, running, reserved)
            s.steps, s.last_end, s.sampled = steps, last_end, sampled + measured * taken
            self.clock = clock
            if s.wake_steps and s.wake_steps[0] < steps:
                s.let_go(s.wake_steps[0])


# Speculative decoding, per event. A decode whose next steps are all full verifies (K proposals,
# none reaching its last token or its first answer token) cruises too: its runs are drawn ahead
# from its own stream, so the tokens it advances by and the blocks it grows into, step by step,
# are known when it joins. They are added into per-step sums, and a step reads the sums for every
# cruising decode at once. Such a decode wakes for its last few tokens, taken by the rule.

def add_into(sums: list, values: list, at: int, sign: Callable[[int, int], int] = operator.add) -> None:
    """sums[at + i] = sign(sums[at + i], values[i]), the list grown with zeros as needed."""
    if len(sums) < at + len(values):
        sums.extend([0] * (at + len(values) - len(sums)))
    sums[at:at + len(values)] = map(sign, sums[at:at + len(values)], values)


class SpeculativeCruise(SpeculativeScheduler, EventScheduler):
    """The event engine's speculative scheduler; SpeculativeScheduler is its oracle. Every step
    is scheduled by the rule (plain_steps() is 0: no step is taken in EventEngine's loop), but
    costs nothing per cruising decode. Without prefix caching only (blocks are taken lazily).
    The per-step sums are lists from step `origin` on, and a decode's steps are added into them
    a slice at a time. A cruise is planned at most `horizon` steps ahead, and not right after a
    step that took every request by the rule (it may be the first of many: SGLang's while anything
    waits), where each plan would be undone at the next."""

    horizon = 256                    # steps a cruise is planned ahead, at most
    keep_steps = 4096                # steps the per-step lists keep behind them before they drop them

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Runs drawn ahead of each request's verify steps, next first; the same as next_run()
        # would draw (a bisect over ascending negatives counts the u < A^m).
        self.ahead: dict[int, list[int]] = {}
        self.count_run = functools.partial(bisect.bisect_left, [-odds for odds in self.odds])
        self.expected = expected_accepted_length(self.proposals, self.acceptance)   # tokens a verify yields
        self.ruled = -1              # the last step taken with every request by the rule
        self.cruise_computed = 0     # KV tokens the cruising decodes hold, summed
        self.origin = 0              # the step the lists below start at
        self.accepted_at: list[int] = []   # per step, the proposals cruising decodes accept in it
        self.measured_at: list[int] = []   # ... of those, the ones the metrics count
        self.grown_at: list[int] = []      # per step, the blocks they grow into
        self.plans: dict[int, tuple] = {}  # request id -> (accepted, blocks grown) per step it cruises

    def cruise_tokens(self) -> int:
        return (1 + self.proposals) * self.cruising

    def crossing(self) -> int:
        at = self.steps - self.origin
        return self.grown_at[at] if at < len(self.grown_at) else 0

    def cruise_batch(self) -> Batch:
        n, k, held = self.cruising, 1 + self.proposals, self.cruise_computed
        # Each reads its KV plus its K + 1 new tokens, which attend to it and to each other.
        return Batch([], k * n, held + k * n, n, 0, 0, k * held + n * (k * (k + 1) // 2))

    def at_last_token(self, request: Request, step: int) -> bool:
        return False                 # a cruise ends before a decode's last step

    def drafting(self, batch: Batch) -> tuple[int, int]:
        seqs, context = super().drafting(batch)
        return seqs + self.cruising, context + self.cruise_computed

    def plain_steps(self) -> Optional[int]:
        return None

    def next_run(self, request: Request) -> int:
        ahead = self.ahead.get(request.id)
        return ahead.pop(0) if ahead else super().next_run(request)

    def runs_ahead(self, request: Request, count: int) -> list[int]:
        """The runs of the request's next `count` verify steps, drawn now where not drawn yet."""
        ahead = self.ahead.setdefault(request.id, [])
        if len(ahead) < count:
            draw = self.stream(request).random
            ahead += map(self.count_run, [-draw() for _ in range(count - len(ahead))])
        return ahead[:count]

    def handle_each(self) -> None:
        self.ruled = self.steps
        super().handle_each()

    def release(self, request: Request) -> None:
        super().release(request)
        if request.finished:
            self.ahead.pop(request.id, None)

    def update(self, batch: Batch, now: float) -> None:
        at = self.steps - self.origin
        if at < len(self.accepted_at):
            self.cruise_computed += self.cruising + self.accepted_at[at]
            if self.measured_at[at]:
                self.count_gaps(0.0, self.measured_at[at])   # accepted proposals arrive with the step's own token
        else:
            self.cruise_computed += self.cruising
        if at >= self.keep_steps:    # the steps behind are done with
            for sums in (self.accepted_at, self.measured_at, self.grown_at):
                del sums[:at + 1]
            self.origin += at + 1
        super().update(batch, now)

    def wake_step(self, request: Request, now: float) -> Optional[int]:
        # (Not a decode that sampled now, or at its last token or first answer token next.)
        if self.ruled == self.steps - 1 or super().wake_step(request, now) is None:
            return None
        k, block, generated = self.proposals, self.config.block_size, request.generated
        # A step cruises while it proposes K (K below what is left after its own token), does not
        # end the request, and does not reach its first answer token.
        full, last = request.output_tokens - 1 - k, request.output_tokens - 1
        if request.answer_s is None:
            last = min(last, request.reasoning_tokens)
        if generated > full:
            return None
        # Runs drawn until they take it past where a cruise must stop or the horizon (about as
        # many as it takes on average, then more if they fall short), and what it has generated
        # before each.
        runs, reach = [], generated
        while reach <= full and len(runs) < self.horizon:
            runs = self.runs_ahead(request, min(self.horizon, len(runs) + 1 + int((full - reach) / self.expected)))
            reach = generated + len(runs) + sum(runs)
        before = list(itertools.accumulate([1 + run for run in runs], initial=generated))
        steps = min(bisect.bisect_right(before, full), bisect.bisect_right(before, last) - 1, len(runs))
        if steps < 1:
            return None
        runs = runs[:steps]
        # Blocks it holds for each step's K + 1 tokens: those of its KV then, plus K + 1 (it may
        # hold more already: never fewer).
        shift, have = request.computed - generated + k + block, len(request.blocks)   # ceil((computed + 1 + K) / block)
        held = [max(have, (g + shift) // block) for g in before[:steps]]
        grown = [held[0] - have] + [now - then for then, now in zip(held, held[1:])]
        self.plans[request.id] = (runs, grown)
        return self.steps + steps

    def cruise(self, request: Request, wake: int) -> None:
        self.enlist(request, wake)
        self.cruise_computed += request.computed
        runs, grown = self.plans[request.id]
        at = self.steps - self.origin
        add_into(self.accepted_at, runs, at)
        add_into(self.measured_at, runs if request.measured else [0] * len(runs), at)
        add_into(self.grown_at, grown, at)

    def settle(self, request: Request) -> None:
        start, (runs, grown) = request.cruise_from, self.plans.pop(request.id)
        advanced = self.delist(request)
        if advanced < len(runs):     # the steps it leaves untaken
            at = start + advanced - self.origin
            add_into(self.accepted_at, runs[advanced:], at, operator.sub)
            if request.measured:
                add_into(self.measured_at, runs[advanced:], at, operator.sub)
            add_into(self.grown_at, grown[advanced:], at, operator.sub)
        tokens = advanced + sum(runs[:advanced])
        self.cruise_computed -= request.computed + tokens
        if advanced:
            request.computed += tokens
            request.generated += tokens
            request.last_token_s = self.last_end
            if request.token_times is not None:
                for step, accepted in enumerate(runs[:advanced], start):
                    request.token_times.extend([self.step_ends[step]] * (1 + accepted))
            del self.ahead[request.id][:advanced]
            self.spec_steps += advanced
            self.spec_tokens += tokens
        blocks = sum(grown[:advanced])
        if blocks:
            request.blocks.extend(self.pool.allocate(blocks))
            self.owed -= blocks


# ---------------------------------------------------------------------------------------------
# Settings: every knob of a run described once, as a row of RunSpec: its flag, how its text is
# read, its help with unit and default, the group it belongs to, and whether sweep and search take
# several values of it. The command line (every subcommand's flags), the run description built
# from them, sweep axes and labels, compare's overrides and the rerun commands are all made from
# these rows. A new knob is its row, the code that acts on it, and its test.
# ---------------------------------------------------------------------------------------------

def whole(low: int = 1, high: int = 10**12) -> Callable[[str], int]:
    """A whole number in [low, high]; 1,000 and 1_000 are fine, 1,2 (a list) is not."""
    def parse(text: str) -> int:
        one_number(text)
        try:
            value = int(text.replace(",", "").replace("_", ""))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be from {low:,} to {high:,}, got {text}")
        return value
    parse.__name__ = "whole number"
    return parse


THOUSANDS = re.compile(r"\s*[-+]?\d{1,3}(,\d{3})+(\.\d*)?\s*")     # 10,000: one number, its thousands grouped


def one_number(text: str) -> None:
    """Commas may group thousands (10,000); anything else with a comma is a list given to a flag
    that takes one value, and silently reading 1,2 as 12 would be worse than refusing it."""
    if "," in text and not THOUSANDS.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a list, and this flag takes one value "
                                         f"(sweep and search take lists of server settings)")


def given(what: str) -> Callable[[str], str]:
    """Text that must say something: an empty --api-key would send `Bearer ` with no key, and an
    empty --model ask for a model named ''."""
    def parse(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"is empty; give {what}, or leave the flag out")
        return text
    parse.__name__ = what
    return parse


def real(low: float, high: float, above_low: bool = True, what: str = "") -> Callable[[str], float]:
    """A finite number in (low, high] (or [low, high])."""
    def parse(text: str) -> float:
        one_number(text)
        try:
            value = float(text.replace(",", "").replace("_", ""))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not (math.isfinite(value) and (value > low if above_low else value >= low) and value <= high):
            percent = f" (a percent? write {value / 100:g})" if high == 1 and 10 <= value <= 100 else ""
            raise argparse.ArgumentTypeError(f"must be {what or ('above' if above_low else 'at least')} {low:g} "
                                             f"and at most {high:g}, got {text}{percent}" if not what else
                                             f"must be {what}, got {text}{percent}")
        return value
    parse.__name__ = "number"
    return parse


fraction = real(0, 1, what="a fraction in (0, 1]")
SEED = whole(-2**63, 2**63 - 1)       # random.Random takes any; a 64-bit one is more than enough
TOKENS = whole(1, 10**8)             # more than any model's context
CLIENTS = whole(1, 10**6)
RATE = real(1e-6, 1e6, above_low=False)    # requests per second; arrivals must also fall within a year
HOURS_PER_MONTH = 730.0          # a year's hours over 12: what $ a month means unless --hours-per-month says
LINK_GBS = real(0.001, 10**6, above_low=False)
MAX_REQUESTS = 2 * 10**6             # each request is kept, ~1 KB, for exact percentiles


def token_range(text: str) -> TokenRange:
    low, dash, high = text.partition("-")
    try:
        if dash and not high.strip():
            raise argparse.ArgumentTypeError(text)
        r = TokenRange(TOKENS(low), TOKENS(high if dash else low))
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected a token count N or a range A-B of whole numbers from 1 "
                                         f"to {10**8:,}, got {text!r}") from None
    if r.low > r.high:
        raise argparse.ArgumentTypeError(f"range {text!r} runs backwards; write it low-high")
    return r


def zero_item(parts: list[str]) -> Optional[str]:
    """The first item after the first that starts with a zero (1,024's 024): a list refuses it."""
    return next((part.strip() for part in parts[1:] if re.fullmatch(r"0\d+", part.strip())), None)


def list_of(kind: Callable) -> Callable:
    def parse(text: str) -> list:
        parts = text.split(",")
        if any(not part.strip() for part in parts):
            raise argparse.ArgumentTypeError(f"an empty item in {text!r}; write the values comma-separated, "
                                             f"like 1,8,32")
        grouped = re.fullmatch(r"\d{1,3}(,\d{3})+", text.strip())     # reads as 8,192: one number, or a list?
        zero = zero_item(parts)
        if zero is not None:         # 1,024 is a thousands comma here, and would run 1 and 24
            raise argparse.ArgumentTypeError(
                f"{text!r} is read as a list, whose item {zero} starts with a zero: "
                + (f"write {text.strip().replace(',', '')} for one value (no thousands commas in a list), or the "
                   f"items without leading zeros" if grouped else "write the items without leading zeros"))
        values = [kind(part.strip()) for part in parts]
        if grouped:                  # simulate reads the same text as one number: say which it is here
            sys.stderr.write(f"servesim: {text.strip()} is read as {len(parts)} values, "
                             f"{', '.join(p.strip() for p in parts)} (a list: write {text.strip().replace(',', '')} "
                             f"for one value)\n")
        # Compared as tables print them (5 and 5.0000001 are both "5"): a sweep or search would run the
        # same point twice, or two points no row tells apart.
        shown = [f"{v:g}" if isinstance(v, float) else v for v in values]
        twice = next((part.strip() for i, part in enumerate(parts) if shown[i] in shown[:i]), None)
        if twice is not None:
            raise argparse.ArgumentTypeError(f"{twice} is given twice in {text!r} (as a table shows it); give each "
                                             f"value once")
        return values
    parse.__name__ = f"comma-separated {kind.__name__}s"
    return parse


def engine_name(text: str) -> str:
    """An engine's name, or the path of a profile file (read when the run is built, so the path is kept)."""
    if text not in ENGINES and os.path.exists(text) and not os.path.isfile(text):
        # A profile is read again for every point a sweep or search runs: a pipe would be empty the second time.
        raise argparse.ArgumentTypeError(f"{text!r} is not a regular file (a pipe, a device or a folder): save the "
                                         f"profile to a file and pass its path")
    if text not in ENGINES and not text.endswith(".json") and not os.path.isfile(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(ENGINES)}, nor a profile file "
                                         f"(calibrate --fit engine writes one)")
    return text


def choice(*names: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in names:
            raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(names)}")
        return text
    parse.__name__ = "choice"
    return parse


def shard_of(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not match or not 1 <= int(match.group(1)) <= int(match.group(2)) <= 100_000:
        raise argparse.ArgumentTypeError(f"{text!r} is not K/N with 1 <= K <= N (e.g. 3/8: the third of eight shards)")
    return int(match.group(1)), int(match.group(2))


def on_off(text: str) -> bool:
    if text.lower() in ("on", "true", "yes", "1"):
        return True
    if text.lower() in ("off", "false", "no", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected on or off, got {text!r}")


def kv_dtype(text: str) -> str:
    """auto or fp8, vLLM's fp8 formats read as fp8: each is one byte an element."""
    return "fp8" if text in ("fp8_e4m3", "fp8_e5m2") else choice("auto", *KV_BYTES)(text)


# vLLM's --quantization names of 4-bit weight formats, all priced as int4.
INT4_METHODS = ("awq", "gptq", "awq_marlin", "gptq_marlin")


def quantization_flag(text: str) -> Optional[str]:
    """fp8, int4 (or vLLM's awq, gptq and their marlin kernels), or none: the model's own dtype
    (a sweep compares it with the others)."""
    if text.strip().lower() in INT4_METHODS:
        return "int4"
    try:
        return None if text == "none" else choice(*WEIGHT_BYTES)(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of none, {', '.join(WEIGHT_BYTES)} "
                                         f"(or {', '.join(INT4_METHODS)}, read as int4)") from None


def tokens_or_none(text: str) -> Optional[int]:
    """A token cap, where 0 (or none) is no cap."""
    if text.strip() in ("0", "none"):
        return None
    try:
        return whole(1, 10**12)(text)
    except argparse.ArgumentTypeError as e:       # (0 is taken too: say so)
        raise argparse.ArgumentTypeError(f"{e} (or 0 for no cap)") from None


def goodput_bound(text: str) -> tuple[str, float]:
    metric, colon, value = text.partition(":")
    if metric not in GOODPUT_METRICS or not colon:
        raise argparse.ArgumentTypeError(f"expected KEY:MS with KEY one of {', '.join(GOODPUT_METRICS)}, got {text!r}")
    if re.fullmatch(r"\d{1,3}(,\d{3})+(\.\d*)?", value):     # 1,000: a thousands comma, as other flags take it
        value = value.replace(",", "")
    try:
        bound = float(value)
    except ValueError:
        bound = math.nan
    if "," in value:           # written as --slo is: --goodput takes its bounds apart
        raise argparse.ArgumentTypeError(f"{text!r}: give each bound on its own, space-separated (ttft:200 tpot:15), "
                                         f"as vllm bench serve --goodput takes them")
    if not 0 < bound < 1e10:
        raise argparse.ArgumentTypeError(f"{text!r}: the bound is milliseconds, a positive number")
    return metric, bound


def preset_name(text: str) -> str:
    """A preset's name or a JSON file's path: read when the run is built, so the path is kept."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a preset name or a JSON file")
    return text


# The groups rows belong to, in the order --help shows them.
GROUPS = {
    "plan": "hardware and memory plan", "scheduler": "scheduler",
    "modes": "batching modes (the reference engine's, side by side)", "replicas": "replicas and experts",
    "speculative": "speculative decoding (vLLM's --speculative-config)",
    "disaggregation": "prefill/decode disaggregation", "workload": "workload", "slo": "SLOs and cost",
    "simulator": "simulator", "server": "server", "load": "load",
    "sustained": "sustained load: the steady window and its verdict (see README, Sustained capacity)",
    "machines": "across machines (see README, Load from many machines)",
}


def setting(default, flag: str, kind: Optional[Callable], help: str, group: str, *, metavar: Optional[str] = None,
            axis: int = 0, short: str = "", aliases: tuple = (), default_text: Optional[str] = None,
            switch: bool = False, recorded: bool = False, none_label: str = "none", nargs: Optional[str] = None,
            exclusive: str = "", needs: str = ""):
    """One row of the settings table, kept in a RunSpec field's metadata.
    kind: reads the flag's text (raising argparse.ArgumentTypeError); None for a plain on/off flag.
    axis: its place among the settings sweep and search vary, outermost first (0: one value only).
    short: its label in pictures; default_text: the default as --help says it (else the value).
    switch: on|off, the flag alone being on. recorded: a measured run records it, and compare
    takes the flag to replace the recorded value. nargs: "+" for a flag that takes several words.
    exclusive: rows with the same tag are alternatives; the command line takes one of them.
    needs: the row without which this one changes nothing: named without it, it is refused (a run
    that ignored it would answer another question than the one asked, without a word)."""
    return field(default=default, metadata=dict(
        flag=flag, kind=kind, help=help, group=group, metavar=metavar, axis=axis, short=short, aliases=aliases,
        default_text=default_text, switch=switch, recorded=recorded, none_label=none_label, nargs=nargs,
        exclusive=exclusive, needs=needs))


@dataclass(frozen=True)
class Trace:
    """Requests with their own lengths and send times, read from a file (or built by a caller)."""
    name: str
    rows: tuple      # (arrival_s, prompt_tokens, output_tokens, content) per request
    format: str = "servesim"
    notes: tuple = ()     # what the reader left out or changed, said once on stderr
    reasoning: tuple = () # each row's thinking tokens (the head of its output), where the trace gives them
    # Sessions: each row's parent (the index of an earlier row it continues, -1 for none) and its
    # delay after the parent's end (None: at its own arrival, never before the parent has ended).
    parents: tuple = ()
    delays: tuple = ()


@dataclass(frozen=True)
class RateProfile:
    """An arrival rate that changes over time, read from a file: each window starts at its time
    and runs at its rate until the next; the last lasts as long as the one before it."""
    name: str
    windows: tuple    # (start_s, requests per second), starts ascending from 0
    end_s: float

    def mean_rate(self, start: float, end: float) -> float:
        """The mean rate over [start, end), windows cut where they cross it."""
        bounds = [w[0] for w in self.windows[1:]] + [self.end_s]
        total = sum(rate * max(0.0, min(end, stop) - max(start, begin))
                    for (begin, rate), stop in zip(self.windows, bounds))
        return total / (end - start)

    def expected_requests(self) -> float:
        """About how many requests the whole profile sends (a --time-scale stretches its windows
        and slows its rates alike: the count stays)."""
        return self.mean_rate(0, self.end_s) * self.end_s


@dataclass(frozen=True)
class ReplicaSchedule:
    """Replicas asked for over time, as an autoscaler decides them: (time_s, replicas) steps from
    0. A replica asked for later than 0 serves once it has loaded (the scale-up delay); when fewer
    are asked for, the last ones added stop taking requests and drain what they have."""
    name: str
    steps: tuple      # (time_s, replicas)

    @property
    def most(self) -> int:
        return max(n for _, n in self.steps)

    def serving(self, delay: float) -> tuple[Callable[[float], int], list[float]]:
        """How many replicas serve at a time t (asked for, loaded, not yet let go), and the times
        that count can change."""
        spans = [span for replica in self.spans(delay) for span in replica]
        return (lambda t: sum(ready <= t < leave for _, ready, leave in spans),
                sorted({t for _, ready, leave in spans for t in (ready, leave) if t < math.inf}))

    def spans(self, delay: float) -> list[list[tuple[float, float, float]]]:
        """Each replica's (asked, ready, leave) spans; leave is inf if it is never let go."""
        spans: list[list] = [[] for _ in range(self.most)]
        asked: list = [None] * self.most
        count = 0
        for at, n in self.steps:
            for i in range(count, n):
                asked[i] = at
            for i in range(n, count):
                spans[i].append((asked[i], asked[i] + (delay if asked[i] else 0.0), at))
            count = n
        for i in range(count):
            spans[i].append((asked[i], asked[i] + (delay if asked[i] else 0.0), math.inf))
        return spans


DEFAULT_REQUESTS, DEFAULT_PROMPT, DEFAULT_OUTPUT = 256, TokenRange(256, 1024), TokenRange(64, 256)
DEFAULT_MODEL_LEN = 4096             # --max-model-len for a model file that gives no length
MAX_ARRIVAL_S = 365 * 86400           # a year: beyond it a float clock loses the milliseconds
# A replica's start: a vLLM restart averaged 48 s per switch with a small model (vLLM blog "Zero-
# Reload Model Switching with vLLM Sleep Mode", 2025-10-26, A100), then the weights: 2 GB/s, a
# safetensors read from local NVMe (NVIDIA Run:ai Model Streamer's benchmarks: 0.3 GB/s for the
# default loader on a throttled cloud disk, about 2 with a streamer on fast SSD).
ENGINE_START_S = 48.0
WEIGHT_LOAD_GBS = 2.0
PROFILE_SEED = 104729                 # a rate profile's send times have their own random stream
REASONING_SEED = 15485863             # so do reasoning lengths: the same requests with and without them
MAX_TIMELINE_S = 200_000              # a timeline's rows, one a simulated second: 2.3 days, some 80 MB
DEFAULT_CLIENTS = 32
COMPARE_MODES = {"static": ("static", "paged"), "slots": ("continuous", "slots"), "paged": ("continuous", "paged")}


@dataclass(frozen=True)
class RunSpec:
    """A run described once: the deployment, the scheduler's knobs, the workload, and how the
    simulator prices and reports it. Each field is a row of the settings table."""
    # Hardware and memory plan.
    hardware: Hardware = setting(
        HARDWARE["h100-sxm-80gb"], "--hardware", preset_name, "hardware preset name or a JSON file with its fields "
        "(list: main.py presets)", "plan", axis=1, recorded=True)
    model: ModelSpec = setting(
        MODELS["llama-3.1-8b"], "--model", preset_name, "model preset name or a JSON file with its fields", "plan",
        recorded=True)
    gpu_memory_utilization: float = setting(
        0.9, "--gpu-memory-utilization", fraction, "share of device memory for weights plus KV cache, as vLLM's flag; under --engine trtllm the share "
        "of what the weights and activations leave that the KV cache takes (its kv_cache_free_gpu_mem_fraction)",
        "plan", metavar="F", axis=8, short="gpu mem", recorded=True)
    block_size: int = setting(
        16, "--block-size", whole(1, 2**20), "tokens per KV block, as vLLM's --block-size", "plan", metavar="TOKENS",
        axis=9, recorded=True)
    max_model_len: Optional[int] = setting(
        None, "--max-model-len", TOKENS, "longest prompt + output a request may have; longer requests fail", "plan",
        metavar="TOKENS", axis=10, recorded=True, default_text=f"the model's own length, as vLLM takes it (its "
        f"max_position_embeddings), else {DEFAULT_MODEL_LEN:,}")
    kv_tokens: Optional[int] = setting(
        None, "--kv-tokens", whole(1, 10**12), "fix the KV cache at this many tokens instead of sizing it from memory, "
        "as llama.cpp's --ctx-size does", "plan", metavar="TOKENS", axis=11, default_text="from the memory budget",
        recorded=True, exclusive="kv size")
    num_gpu_blocks: Optional[int] = setting(
        None, "--num-gpu-blocks", whole(1, 10**11), "fix the number of KV blocks, as copied from a vLLM startup log "
        "(vLLM's --num-gpu-blocks-override)", "plan", metavar="BLOCKS", axis=12, default_text="from the memory budget",
        recorded=True, exclusive="kv size", aliases=("--num-gpu-blocks-override",))
    quantization: Optional[str] = setting(
        None, "--quantization", quantization_flag, "fp8: 1 byte per weight, on FP8 tensor cores where the device has "
        "them; int4 (vLLM's awq, gptq, awq_marlin, gptq_marlin): 4-bit weights (0.53 bytes with scales), BF16 "
        "compute; none: the model's own", "plan",
        metavar="none|fp8|int4",
        axis=5, default_text="the model's own dtype")
    kv_cache_dtype: str = setting(
        "auto", "--kv-cache-dtype", kv_dtype, "fp8: one byte per KV element, twice the tokens in the "
        "same memory (vLLM's fp8_e4m3 and fp8_e5m2 are read as fp8)", "plan", metavar="auto|fp8", axis=6,
        default_text="auto, the model's dtype")
    # Scheduler.
    max_num_seqs: int = setting(
        256, "--max-num-seqs", whole(1, 10**6), "most sequences in one step (vLLM --max-num-seqs, llama.cpp "
        "--parallel)", "scheduler", metavar="N", axis=13, short="seqs", recorded=True)
    max_num_batched_tokens: int = setting(
        8192, "--max-num-batched-tokens", TOKENS, "token budget per step, prefill chunks plus decodes", "scheduler",
        metavar="TOKENS", axis=14, short="batched tokens", recorded=True)
    chunked_prefill: bool = setting(
        True, "--no-chunked-prefill", None, "admit a prompt only if all of it fits the step's budget left "
        "(vLLM's --no-enable-chunked-prefill; --enable-chunked-prefill is the default)",
        "scheduler", default_text="chunked prefill on")
    prefix_caching: bool = setting(
        False, "--prefix-caching", on_off, "share KV blocks of identical prefixes, as vLLM's automatic prefix "
        "caching (vLLM's --enable-prefix-caching and --no-enable-prefix-caching say on and off)", "scheduler",
        axis=15, switch=True, recorded=True)
    reserve_full_isl: bool = setting(
        False, "--scheduler-reserve-full-isl", on_off, "admit a request only if blocks for its whole prompt are free, "
        "not just its first chunk", "scheduler", axis=16, short="reserve isl", switch=True, recorded=True)
    # Variations.
    max_tokens_in_flight: Optional[int] = setting(
        None, "--max-tokens-in-flight", tokens_or_none, "admit a request only while prompt + output summed over "
        "running requests stays under this cap, as TGI's --max-batch-total-tokens; 0 is no cap", "scheduler",
        metavar="TOKENS", axis=17, short="in flight", default_text="no cap", none_label="no cap")
    batching: str = setting(
        "continuous", "--batching", choice("continuous", "static"), "continuous: the batch is decided again every "
        "step; static: take --max-num-seqs requests, left-pad them, run until the slowest is done", "modes",
        metavar="continuous|static")
    kv_layout: str = setting(
        "paged", "--kv-layout", choice("paged", "slots"), "paged: blocks allocated as sequences grow; slots: the "
        "cache split evenly into --max-num-seqs fixed contexts, as llama.cpp with --parallel", "modes",
        metavar="paged|slots")
    speculative_tokens: int = setting(
        0, "--speculative-tokens", whole(0, 64), "each decoding sequence verifies K proposed tokens per step, as "
        "num_speculative_tokens", "speculative", metavar="K", axis=19, default_text="off")
    acceptance_rate: float = setting(
        0.7, "--acceptance-rate", real(0, 1, above_low=False, what="a fraction in [0, 1]"), "the chance each proposal "
        "is accepted; a step yields (1 - A^(K+1)) / (1 - A) tokens on average", "speculative", metavar="A", axis=20,
        needs="speculative_tokens")
    draft_model: Optional[ModelSpec] = setting(
        None, "--draft-model", preset_name, "the draft model proposing them (a preset or JSON), run K times per step "
        "and kept in memory", "speculative", metavar="MODEL", default_text="n-gram prompt lookup, which costs nothing",
        needs="speculative_tokens")
    tensor_parallel_size: int = setting(
        1, "--tensor-parallel-size", whole(1, 64), "split each engine's weights and KV heads over N GPUs, as vLLM's "
        "flag; each step adds two all-reduces per layer on the interconnect", "plan", metavar="N", axis=2, short="tp",
        aliases=("-tp",), recorded=True)
    pipeline_parallel_size: int = setting(
        1, "--pipeline-parallel-size", whole(1, 64), "split each engine's layers into N stages on N GPU groups (of "
        "--tensor-parallel-size each), as vLLM's flag; N micro-batches in flight keep the stages busy, and each "
        "stage hands its activations to the next over NVLink inside a node or the network between nodes", "plan",
        metavar="N", axis=2.5, short="pp", aliases=("-pp",), recorded=True)
    gpus_per_node: int = setting(
        8, "--gpus-per-node", whole(1, 1024), "GPUs in one node: a tensor-parallel group larger than it all-reduces, "
        "and pipeline stages beyond it hand off, over the network", "plan", metavar="N", needs="gpus_per_replica")
    inter_node_gbs: float = setting(
        50.0, "--inter-node-gbs", LINK_GBS, "GB/s per GPU between nodes: InfiniBand NDR 400 Gb/s is 50, HDR 200 Gb/s "
        "and RoCE 200 GbE are 25", "plan", metavar="GBS", needs="nodes")
    inter_node_latency_us: float = setting(
        5.0, "--inter-node-latency-us", real(0, 10_000), "microseconds of one send between nodes (assumed, not "
        "measured here)", "plan", metavar="US", needs="nodes")
    data_parallel_size: int = setting(
        1, "--data-parallel-size", whole(1, 1024), "N engines, each with its own cache, behind a router on one clock, "
        "as vLLM's flag", "replicas", metavar="N", axis=3, short="dp", aliases=("-dp", "--replicas"), recorded=True)
    router: str = setting(
        "least-loaded", "--router", choice(*ROUTERS), "which replica gets a request when it arrives: in turn, the one "
        "with the fewest running and waiting, or the one whose cache holds the longest run of its prompt (llm-d's "
        "and SGLang's prefix-aware routing)", "replicas", metavar="|".join(ROUTERS), axis=4, recorded=True)
    enable_expert_parallel: bool = setting(
        False, "--enable-expert-parallel", on_off, "with replicas and a mixture-of-experts model: deal the experts "
        "out over the replicas (attention stays on each), adding an all-to-all per MoE layer; without it, vLLM's "
        "replicas split every expert between their GPUs instead, at the same memory and traffic", "replicas", axis=18,
        switch=True, recorded=True)
    replica_schedule: Optional[ReplicaSchedule] = setting(
        None, "--replica-schedule", None, "replicas that come and go: a CSV of time_s,replicas rows, the replicas "
        "asked for from each time on (a plan's --csv, or an autoscaler's log); a replica added serves after "
        "--scale-up-delay, one let go takes no new requests and finishes its own", "replicas", metavar="FILE",
        default_text="a fixed --data-parallel-size")
    scale_up_delay: Optional[float] = setting(
        None, "--scale-up-delay", real(0, 86_400, above_low=False), "seconds from asking for a replica to its first "
        "request: start-up and loading the weights", "replicas", metavar="S",
        default_text=f"{ENGINE_START_S:g} s to start an engine + each GPU's weights at {WEIGHT_LOAD_GBS:g} GB/s")
    disaggregate: bool = setting(
        False, "--disaggregate", None, "one engine only prefills, another only decodes; each request's KV crosses a "
        "link between them", "disaggregation", default_text="off; any flag below turns it on")
    prefill_hardware: Optional[Hardware] = setting(
        None, "--prefill-hardware", preset_name, "the prefill engine's hardware", "disaggregation",
        default_text="--hardware")
    decode_hardware: Optional[Hardware] = setting(
        None, "--decode-hardware", preset_name, "the decode engine's hardware", "disaggregation",
        default_text="--hardware")
    kv_link_gbs: float = setting(
        25.0, "--kv-link-gbs", LINK_GBS, "the link's bandwidth in GB/s", "disaggregation", metavar="GBS", axis=21,
        default_text="25")
    kv_offloading_size: Optional[float] = setting(
        None, "--kv-offloading-size", real(0, 32768, above_low=False), "a second tier of the KV cache in host "
        "memory, GiB for the "
        "whole replica (its tensor-parallel GPUs together), as vLLM's flag: every full block computed is stored "
        "there too, and a prefix found only there is loaded back over PCIe (the hardware's host_link_gbs) while "
        "the request waits and others run; needs prefix caching (--prefix-caching, or an --engine that caches prefixes: "
        "vllm, sglang, trtllm); 0 is off, 32,768 (32 TiB, a large server's "
        "memory) the most", "plan", metavar="GiB", axis=22,
        short="offload GiB", default_text="off", none_label="off")
    kv_offloading_backend: str = setting(
        "native", "--kv-offloading-backend", choice("native", "lmcache"), "vLLM's backend for the host tier; both "
        "are simulated by the same rule (see README, A host tier for the KV cache)", "plan",
        metavar="native|lmcache", needs="kv_offloading_size")
    # Workload.
    trace: Optional[Trace] = setting(
        None, "--trace", None, "requests with their own send times, lengths and shared content, in any "
        "--trace-format (servesim JSONL: arrival s, prompt_tokens, output_tokens, optional prefix and prefix_tokens)",
        "workload", metavar="FILE", exclusive="arrivals")
    trace_repeats: int = setting(
        1, "--trace-repeats", whole(1, 10**6), "play the trace N times end to end, each copy after the last by the "
        "trace's span plus its mean gap; content shared by several requests (hash ids, system prompts, "
        "conversations) stays shared, content of one request is new in every copy", "workload", metavar="N")
    requests: Optional[int] = setting(
        None, "--requests", whole(1, MAX_REQUESTS), "number of synthetic requests, or the first N of a trace",
        "workload", metavar="N", default_text=f"{DEFAULT_REQUESTS}, or the whole trace")
    prompt_tokens: TokenRange = setting(
        DEFAULT_PROMPT, "--prompt-tokens", token_range, "prompt length in tokens after any shared prefix, fixed or "
        "uniform", "workload", metavar="N|A-B")
    output_tokens: TokenRange = setting(
        DEFAULT_OUTPUT, "--output-tokens", token_range, "output length in tokens, fixed or uniform", "workload",
        metavar="N|A-B")
    reasoning_tokens: Optional[TokenRange] = setting(
        None, "--reasoning-tokens", token_range, "a reasoning model: the first N (or uniform A-B) tokens of each output "
        "are thinking, streamed before the answer; reports add time to the first answer token (ttfa) and the SLO key "
        "ttfa_pXX. Below the shortest --output-tokens, which counts thinking and answer, as usage does", "workload",
        metavar="N|A-B", default_text="none")
    prefix_tokens: int = setting(
        0, "--prefix-tokens", whole(0, 10**8), "a shared system prompt of this many tokens in front of every prompt",
        "workload", metavar="TOKENS", default_text="none")
    num_prefixes: int = setting(
        1, "--num-prefixes", whole(1, 10**6), "how many distinct shared system prompts, assigned round robin",
        "workload", metavar="M")
    rate: Optional[float] = setting(
        None, "--rate", RATE, "open loop: arrivals at R requests/s, Poisson (or gamma with --burstiness)", "workload",
        metavar="R", axis=24, default_text="closed loop", exclusive="arrivals")
    concurrency: Optional[int] = setting(
        None, "--concurrency", CLIENTS, "closed loop: N clients, each sending its next request when the last ends",
        "workload", metavar="N", axis=25, default_text=f"closed loop with {DEFAULT_CLIENTS} clients",
        exclusive="arrivals")
    seed: int = setting(7, "--seed", SEED, "random seed for lengths and arrivals", "workload")
    time_scale: float = setting(
        1.0, "--time-scale", real(1e-6, 1e6), "multiply a trace's arrival times by X: 0.5 replays it at twice its rate",
        "workload", metavar="X")
    burstiness: float = setting(
        1.0, "--burstiness", real(0.001, 1000), "gaps between arrivals are gamma with shape B at the same mean rate: 1 "
        "is Poisson, below 1 burstier (coefficient of variation 1/sqrt(B)), above 1 more even; with --rate or a ramp",
        "workload", metavar="B", axis=23)
    ramp_up: Optional[tuple] = setting(
        None, "--ramp-up-strategy", choice("linear", "exponential"), "raise the arrival rate from --ramp-up-start-rps to --ramp-up-end-rps over "
        "the run, request by request, as vllm bench serve does; instead of --rate", "workload",
        metavar="linear|exponential", default_text="off")
    rate_profile: Optional[RateProfile] = setting(
        None, "--rate-profile", None, "open loop at a rate that changes over time: a CSV of time_s,rate rows (seconds "
        "from the start, requests a second), each "
        "window at its rate until the next (the last as long as the one before it), arrivals Poisson (or gamma with "
        "--burstiness) within each; --time-scale stretches it; it sets the requests unless --requests caps them",
        "workload", metavar="FILE", default_text="off", exclusive="arrivals")
    turns: int = setting(
        1, "--turns", whole(1, 10_000), "conversations of N requests: each turn's prompt is the conversation so far "
        "(earlier messages and answers) plus a new --prompt-tokens message; --requests counts requests", "workload",
        metavar="N", default_text="1, no conversations")
    think_time: float = setting(
        0.0, "--think-time", real(0, 86_400, above_low=False), "seconds between a turn's last token and the next "
        "turn's request", "workload", metavar="S")
    warmup: int = setting(
        0, "--warmup", whole(0, MAX_REQUESTS), "the first N requests sent are left out of the metrics (they are among "
        "the requests asked for, not sent on top of them)", "workload", metavar="N")
    # Output, engine and cost model.
    detailed: bool = False               # keep every token's time, for --detailed arrays
    profile: Optional[EngineProfile] = None     # a fit's engine constants, in place of --engine's own
    given: tuple = ()                    # the knobs named (engine_defaults fills the rest, again at each sweep point)
    engine: Optional[str] = setting(
        None, "--engine", engine_name, "the serving engine whose CPU costs, async scheduling, CUDA graphs and "
        "scheduling rules the run takes: vllm, sglang, trtllm or llamacpp, or a profile JSON file (calibrate --fit "
        "engine writes one: an engine's rules with fitted costs); naming one also takes its own defaults "
        "for the knobs not given (batch limits, block size, memory share, and prefix caching, which vLLM, "
        "SGLang and TensorRT-LLM turn on)", "scheduler",
        metavar="|".join(ENGINES) + "|FILE",
        default_text="vLLM's rules and costs with the lesson's knobs: 256 sequences, 8,192 tokens")
    async_scheduling: Optional[bool] = setting(
        None, "--async-scheduling", on_off, "the engine prepares the next step while the GPU runs this one, so a "
        "step costs the slower of its GPU and CPU work, not their sum (vLLM's flag; on from vLLM 0.14)", "scheduler",
        switch=True, default_text="the engine's")
    simulator: str = setting(
        "event", "--simulator", choice("event", "step"), "event: work per event (arrivals, block boundaries, "
        "finishes); step: the per-step rule the event engine is tested against, slower, same results", "simulator",
        metavar="event|step")
    cost_model: str = setting(
        DEFAULT_COST_MODEL, "--cost-model", choice(*COST_MODELS), "how a step is priced: roofline (the lesson's: "
        "compute vs memory for the whole step) or kernels (GEMMs and attention apart, with tiles and measured "
        "efficiencies)", "plan", metavar="|".join(COST_MODELS), axis=7,
        default_text=f"{DEFAULT_COST_MODEL}; kernels with an --engine profile file, whose costs it prices")
    goodput: tuple = setting(
        (), "--goodput", goodput_bound, GOODPUT_HELP, "slo", metavar="KEY:MS", default_text="off", nargs="+")
    price_per_hour: Optional[float] = setting(
        None, "--price-per-hour", real(0, 1e6), "USD an hour per GPU, in place of the hardware preset's price; "
        "reports gain $ an hour and $ per million output tokens", "slo", metavar="USD",
        default_text="the preset's on-demand price, see main.py presets")
    hours_per_month: float = setting(
        HOURS_PER_MONTH, "--hours-per-month", real(1, 744), "hours a month of service, for $ a month (above 1, at most 744)",
        "slo", metavar="H",
        default_text="730, a year's hours over 12")
    steady_skip: float = setting(
        0.2, "--steady-skip", real(0, 0.9, above_low=False, what="a fraction from 0 to 0.9"), "the share of the "
        "requests sent before the steady window starts (the transient of a server filling up); it starts no "
        "earlier than the first request's end", "sustained", metavar="F")
    min_served: float = setting(
        0.95, "--min-served", fraction, "sustained needs the steady window's served rate (requests ended a second) "
        "to be at least this share of its offered rate (requests sent a second), less the uncertainty of counting "
        "ends at the window's edges (at most 1 - F more: never below 2F - 1, 0.90 at 0.95; the JSON's "
        "steady_state.least_served_share is the bound a run was held to); a shortfall while the wait does not grow "
        "at all and nothing failed counts only below 2F - 1", "sustained", metavar="F")
    max_queue_growth: float = setting(
        0.05, "--max-queue-growth", fraction, "sustained needs the wait (queue time) of the requests sent in the "
        "steady window to grow by at most this many seconds per second of run (the queue grows by at most this "
        "share of the offered rate), and by less over the whole window than a request's time in service (the "
        "median end-to-end latency less the wait) or than twice the wait's mean swing about its trend",
        "sustained", metavar="F")

    @property
    def gpus_per_replica(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def nodes(self) -> int:
        """The nodes one replica spans, its GPUs placed in order: more than one, and something
        crosses the network (a pipeline's hand-off, or a tensor-parallel group's all-reduce)."""
        return -(-self.gpus_per_replica // self.gpus_per_node)

    def model_len(self) -> int:
        """--max-model-len, or vLLM's default: the model's own length, else DEFAULT_MODEL_LEN."""
        return self.max_model_len or self.model.max_position_embeddings or DEFAULT_MODEL_LEN

    def clients(self) -> Optional[int]:
        """The arrivals rule, decided here only: --concurrency N is a closed loop of N clients;
        otherwise a trace or a --rate is open loop, and neither is a closed loop of 32 clients."""
        if self.concurrency:
            return self.concurrency
        return None if self.trace or self.rate or self.ramp_up or self.rate_profile else DEFAULT_CLIENTS

    def rate_unit(self) -> str:
        return "conversations/s" if self.turns > 1 else "req/s"     # a rate starts conversations

    def sends(self) -> int:
        """The requests (conversations, with turns) a closed loop has to send: at most that many
        of its clients are busy at once."""
        return -(-(self.requests or DEFAULT_REQUESTS) // self.turns)

    def arrivals(self) -> str:
        chats = f" ({self.turns}-turn conversations, think {self.think_time:g} s)" if self.turns > 1 else ""
        if self.clients():
            sends = self.sends()
            fewer = f" (at most {sends:,} at once: the {'conversations' if self.turns > 1 else 'requests'})" \
                if sends < self.clients() and not self.trace else ""
            return f"closed loop {self.clients()} client{'s' * (self.clients() != 1)}{fewer}" + chats
        if self.trace:
            return f"trace arrivals ({self.trace.name})"
        shape = "poisson" if self.burstiness == 1 else f"gamma (burstiness {self.burstiness:g})"
        unit = self.rate_unit()
        if self.ramp_up:
            strategy, start, end = self.ramp_up
            return f"{shape} ramp {strategy} {start:g} to {end:g} {unit}" + chats
        if self.rate_profile:
            p, x = self.rate_profile, self.time_scale
            span = p.end_s * x
            span = f"{span / 3600:,.3g} h" if span >= 3600 else f"{span / 60:,.3g} min" if span >= 60 else f"{span:,.3g} s"
            return (f"{shape} rate profile {p.name} ({len(p.windows)} windows over {span}, "
                    f"mean {p.mean_rate(0, p.end_s) / x:,.3g}, peak {max(r for _, r in p.windows) / x:,.3g} {unit})"
                    + chats)
        return f"{shape} {self.rate:g} {unit}" + chats


SETTINGS = {f.name: f for f in fields(RunSpec) if f.metadata}
SWEPT = sorted((f.name for f in SETTINGS.values() if f.metadata["axis"]), key=lambda n: SETTINGS[n].metadata["axis"])


def engine_profile(spec: RunSpec) -> EngineProfile:
    """The serving engine a run prices and schedules with, its async scheduling as the run sets it."""
    profile = spec.profile or ENGINES[spec.engine or "vllm"]
    return profile if spec.async_scheduling is None else replace(profile, overlap=spec.async_scheduling)


def engine_label(spec: RunSpec) -> Optional[str]:
    """The engine as a report names it: a profile file's own name and its base, else the engine's."""
    profile = engine_profile(spec) if spec.engine or spec.profile else None
    return profile and (f"{profile.name} ({profile.base}'s rules)" if profile.base else profile.name)


def engine_defaults(spec: RunSpec, given: Iterable[str] = ()) -> RunSpec:
    """The spec with its engine's own defaults for every knob not in `given` (no engine named: the
    lesson's knobs as they are)."""
    if not spec.engine:
        return spec
    engine = spec.profile or ENGINES[spec.engine]
    given = set(given)
    spec = replace(spec, given=tuple(sorted(given)),
                   **{k: v for k, v in engine.defaults(spec.hardware).items() if k not in given})
    if engine.rules == "sglang" and spec.hardware.kernel_floor_us and "gpu_memory_utilization" not in given:
        spec = replace(spec, gpu_memory_utilization=sglang_memory_share(spec))
    return replace(spec, **vllm_batch_defaults(spec, given)) if engine.rules == "vllm" else spec


def flag_of(name: str) -> str:
    """A setting's flag; the pseudo-settings of sweep (--compare) are named as they are."""
    return SETTINGS[name].metadata["flag"] if name in SETTINGS else "--" + name.replace("_", "-")


def short_label(name: str) -> str:
    return SETTINGS[name].metadata["short"] if name in SETTINGS and SETTINGS[name].metadata["short"] \
        else flag_of(name)[2:]


def value_label(name: str, value) -> str:
    """A setting's value as a table cell or a picture's label."""
    if value is None:
        return SETTINGS[name].metadata["none_label"] if name in SETTINGS else "none"
    if isinstance(value, (Hardware, ModelSpec)):
        return value.name
    if isinstance(value, bool):
        return "on" if value else "off"
    if name == "trace":
        return os.path.basename(str(value))
    return f"{value:g}" if isinstance(value, (int, float)) else str(value)


def engine_turned_caching_on(spec: RunSpec, given: Iterable[str]) -> bool:
    """Whether --engine's defaults, not the user, turned prefix caching on."""
    return bool(spec.engine) and "prefix_caching" not in given and \
        bool((spec.profile or ENGINES[spec.engine]).defaults(spec.hardware).get("prefix_caching"))


def check_spec(spec: RunSpec, given: Iterable[str] = (), swept: Iterable[str] = (), capped: bool = True) -> None:
    """Every rule that spans two settings, so the API refuses what the command line refuses.
    `given`: the settings the user named (else the engine's defaults are blamed where they apply),
    `swept`: those of them a sweep or search gave several values (`given` holds their first);
    `capped`: the command takes --requests, so a message may offer it."""
    default = RunSpec()
    if spec.engine and spec.engine not in ENGINES and not spec.profile:
        raise UserError(f"engine {spec.engine!r}: not one of {', '.join(ENGINES)}; a profile file is read by "
                        f"--engine on the command line (or pass RunSpec(profile=...))")
    draft, target = spec.draft_model, spec.model
    if spec.speculative_tokens and draft and draft.vocab_size and target.vocab_size \
            and draft.vocab_size != target.vocab_size:
        # A draft proposes token ids the target verifies: the two must share a tokenizer.
        raise UserError(f"--draft-model {draft.name} has a vocabulary of {draft.vocab_size:,} tokens and "
                        f"{target.name} {target.vocab_size:,}: a draft's proposals are token ids the model verifies, "
                        f"so the two must share a tokenizer (a smaller model of the same family)")
    if spec.speculative_tokens and draft and draft.compute_params >= target.compute_params:
        # Each step runs the draft K times: one that computes as much as the model costs more than
        # the tokens it could save (likely --model and --draft-model swapped).
        raise UserError(f"--draft-model {draft.name} computes {draft.compute_params / 1e9:,.3g} B parameters a token, "
                        f"not fewer than {target.name}'s {target.compute_params / 1e9:,.3g} B: a draft runs K times a "
                        f"step, so it must be a smaller model than the one it proposes for (--model and --draft-model "
                        f"swapped?)")
    if spec.quantization and target.expert_dtype_bytes:
        # A checkpoint stored quantized (gpt-oss's MXFP4 experts) declares its own method, and vLLM
        # refuses a --quantization that differs from it (ModelConfig's quantization check).
        raise UserError(f"--quantization {spec.quantization}: {target.name}'s checkpoint is quantized already (its "
                        f"experts at {target.expert_dtype_bytes:g} bytes a weight), and vLLM refuses a method other "
                        f"than the checkpoint's; drop --quantization")
    engine = engine_profile(spec) if spec.engine or spec.profile else None
    if engine and engine.rules == "llamacpp":
        # vLLM's features llama-server has no counterpart of (its replicas are separate servers: -dp is fine)
        vllm_only = [flag for flag, on in (("--kv-offloading-size", spec.kv_offloading_size),
                                           ("--enable-expert-parallel", spec.enable_expert_parallel)) if on]
        if vllm_only:
            raise UserError(f"--engine {spec.engine or engine.name}: llama.cpp's server has no {vllm_only[0]} (a vLLM "
                            f"feature); drop it, or give --engine vllm")
    if engine and engine.rules == "trtllm" and not spec.hardware.kernel_floor_us:
        raise UserError(f"--engine trtllm: TensorRT-LLM runs on NVIDIA GPUs, and {spec.hardware.name} is a CPU (no "
                        f"kernel_floor_us); use --engine llamacpp, or a GPU preset")
    synthetic = (spec.prompt_tokens, spec.output_tokens, spec.prefix_tokens, spec.num_prefixes) != \
        (default.prompt_tokens, default.output_tokens, default.prefix_tokens, default.num_prefixes)
    if spec.trace and synthetic:
        raise UserError("--prompt-tokens, --output-tokens, --prefix-tokens and --num-prefixes describe synthetic "
                        "requests; a --trace gives each request's own lengths")
    if spec.trace and (spec.rate or spec.concurrency):
        raise UserError("--trace brings its own arrivals; drop --concurrency and --rate")
    if spec.rate and spec.concurrency:
        raise UserError("--rate (open loop) and --concurrency (closed loop) are two ways to send load: give one")
    if spec.time_scale != 1 and not (spec.trace or spec.rate_profile):
        raise UserError("--time-scale stretches a --trace's or a --rate-profile's times; without either use --rate")
    if spec.trace_repeats > 1 and not spec.trace:
        raise UserError("--trace-repeats plays a --trace several times: give the trace")
    idle = inert(spec)
    if "router" in given and "router" in idle and "data_parallel_size" not in swept:
        raise UserError("--router chooses between replicas, and there is one" +
                        (" at every moment of the --replica-schedule" if spec.replica_schedule else "") +
                        ": add --data-parallel-size N (or a --replica-schedule of more), or drop --router")
    if "hardware" in given and "hardware" in idle and "hardware" not in swept:
        raise UserError("--hardware changes nothing: --prefill-hardware and --decode-hardware name both engines' "
                        "devices; drop one of them")
    for name in set(given) & SETTINGS.keys():
        needs = SETTINGS[name].metadata["needs"]
        if needs in DERIVED_NEEDS:         # (a figure worked out of several settings, not one of them)
            without, inputs = DERIVED_NEEDS[needs]
            if getattr(spec, needs) == getattr(default, needs) and not inputs & set(swept):
                raise UserError(f"{SETTINGS[name].metadata['flag']} changes nothing with {without}: drop it")
            continue
        off = getattr(default, needs) if needs else None        # (given as its default, it is as off: --speculative-tokens 0)
        if needs and is_off(getattr(spec, needs), off) and (needs not in given or is_off(given[needs], off)) \
                and needs not in swept:
            flag, other = SETTINGS[name].metadata["flag"], SETTINGS[needs].metadata["flag"]
            if needs in given:        # given as its own "off"
                value = f"{given[needs]:g}" if isinstance(given[needs], float) else given[needs]
                raise UserError(f"{flag} changes nothing with {other} {value}, which is off: give {other} "
                                f"a value that turns it on, or drop {flag}")
            raise UserError(f"{flag} changes nothing without {other}: add {other}, or drop {flag}")
    if spec.trace and not spec.requests and len(spec.trace.rows) * spec.trace_repeats > MAX_REQUESTS:
        raise UserError(f"--trace-repeats {spec.trace_repeats:,} plays {len(spec.trace.rows):,} requests as "
                        f"{len(spec.trace.rows) * spec.trace_repeats:,}; servesim simulates up to {MAX_REQUESTS:,}: "
                        f"lower it" + (", or cap them with --requests" if capped else ""))
    if spec.turns > 1 and spec.trace:
        raise UserError("--turns builds synthetic conversations; a --trace brings its own requests")
    if spec.think_time and spec.turns == 1:
        raise UserError("--think-time is the pause between a conversation's turns: add --turns N")
    turns = min(spec.turns, spec.requests) if spec.requests else spec.turns     # (a conversation ends with the requests)
    if (turns - 1) * spec.think_time > MAX_ARRIVAL_S:
        raise UserError(f"--turns {turns} with --think-time {spec.think_time:g} s is "
                        f"{(turns - 1) * spec.think_time / 86400:,.0f} days of thinking in one conversation; "
                        f"servesim simulates up to a year")
    if spec.num_prefixes > 1 and not spec.prefix_tokens:
        raise UserError("--num-prefixes needs --prefix-tokens: how long each shared system prompt is")
    if spec.kv_offloading_size:
        check_offloading(spec)
    if spec.pipeline_parallel_size > 1:
        check_pipeline(spec)
    if spec.reasoning_tokens and spec.trace:
        raise UserError("--reasoning-tokens shapes generated requests; a --trace gives each row its own "
                        "reasoning_tokens field")
    if spec.reasoning_tokens and spec.turns > 1:
        raise UserError("--reasoning-tokens with --turns: whether a conversation's history keeps the earlier "
                        "thinking differs by model, and servesim does not model it yet; drop one of them")
    if spec.reasoning_tokens and spec.reasoning_tokens.high >= spec.output_tokens.low:
        raise UserError(f"--reasoning-tokens {spec.reasoning_tokens}: an output (--output-tokens "
                        f"{spec.output_tokens}) holds the thinking and the answer, so the thinking must stay below "
                        f"the shortest output, {spec.output_tokens.low:,} token{'s' * (spec.output_tokens.low != 1)}")
    if spec.ramp_up:
        strategy, start, end = spec.ramp_up
        if start > end:
            raise UserError("--ramp-up-start-rps must not exceed --ramp-up-end-rps")
    # (each message names only the flags given: plan, which takes neither --rate nor --concurrency, was told to drop them)
    given_arrivals = [flag for flag, on in (("--rate", spec.rate), ("--concurrency", spec.concurrency),
                                            ("--trace", spec.trace), ("the ramp", spec.ramp_up)) if on]
    if spec.ramp_up and len(given_arrivals) > 1:
        raise UserError(f"a ramp sets the arrival rate itself: drop {' and '.join(given_arrivals[:-1])}")
    if spec.rate_profile and given_arrivals:
        raise UserError(f"--rate-profile sets the arrivals: drop {' and '.join(given_arrivals)}")
    if spec.burstiness != 1 and not (spec.ramp_up or spec.rate or spec.rate_profile):
        raise UserError("--burstiness shapes the gaps of open-loop arrivals: add --rate R (or a ramp)")
    if spec.warmup and not (spec.rate_profile and not spec.requests):   # (a profile's count is its draw's: later)
        sent = min(len(spec.trace.rows), spec.requests or len(spec.trace.rows)) if spec.trace else \
            spec.requests or DEFAULT_REQUESTS
        if spec.warmup >= sent:
            raise UserError(f"--warmup {spec.warmup:,} leaves no request to measure: send more --requests"
                            if not spec.trace else f"--warmup {spec.warmup:,} leaves no request of trace "
                            f"{spec.trace.name} ({len(spec.trace.rows):,} requests) to measure")
    if spec.batching == "static" and (spec.prefix_caching or spec.kv_layout == "slots"):
        on = [flag for flag, given in (("--prefix-caching off", spec.prefix_caching),
                                       ("--kv-layout paged", spec.kv_layout == "slots")) if given]
        engine = f" (--engine {spec.engine} turns prefix caching on)" \
            if spec.prefix_caching and engine_turned_caching_on(spec, given) else ""
        raise UserError(f"--batching static runs its own padded batch, with no prefix cache and no slots{engine}: "
                        f"add {' and '.join(on)}")
    if spec.batching == "static" and "batching" in given:
        # A padded batch of --max-num-seqs runs whole, with no token budget to spend or save.
        idle = [flag_of(name) for name in ("max_num_batched_tokens", "chunked_prefill", "reserve_full_isl",
                                           "max_tokens_in_flight") if name in given]
        if idle:
            raise UserError(f"--batching static takes --max-num-seqs requests and runs them whole, with no token "
                            f"budget a step: {idle[0]} changes nothing there; drop it")
    if spec.kv_layout == "slots" and spec.prefix_caching:
        engine = f" (--engine {spec.engine} turns prefix caching on)" \
            if engine_turned_caching_on(spec, given) else ""
        raise UserError(f"--kv-layout slots models llama.cpp's fixed contexts, whose prompt cache is per slot{engine}: "
                        f"add --prefix-caching off")
    if spec.replica_schedule and spec.data_parallel_size not in (1, spec.replica_schedule.most):
        raise UserError(f"--replica-schedule asks for up to {spec.replica_schedule.most} replicas and sets "
                        f"--data-parallel-size itself: drop --data-parallel-size {spec.data_parallel_size}")
    if spec.replica_schedule and spec.disaggregate:
        raise UserError("--replica-schedule with --disaggregate is not modelled: one prefill and one decode engine")
    if spec.replica_schedule and spec.enable_expert_parallel:
        raise UserError("--enable-expert-parallel spreads the experts over one server's data-parallel ranks; a "
                        "--replica-schedule's replicas are separate servers, each holding the whole model: drop one")
    if spec.scale_up_delay is not None and not spec.replica_schedule:
        raise UserError("--scale-up-delay is how long a replica added by a --replica-schedule takes: give the schedule")
    if spec.disaggregate and spec.data_parallel_size > 1:
        raise UserError("--data-parallel-size with --disaggregate is not modelled: one prefill and one decode engine")
    if spec.enable_expert_parallel and not spec.model.experts:
        raise UserError(f"--enable-expert-parallel spreads a mixture of experts' experts; {spec.model.name} is dense")
    # (A sweep over the GPU counts leaves out its one-GPU points instead: applicable.)
    if spec.enable_expert_parallel and spec.data_parallel_size == 1 and spec.tensor_parallel_size == 1 \
            and not {"data_parallel_size", "tensor_parallel_size"} & set(swept):
        raise UserError("--enable-expert-parallel spreads the experts over data-parallel replicas: add -dp N "
                        "(N of 2 or more), or drop it")
    if spec.enable_expert_parallel and spec.tensor_parallel_size > 1:
        raise UserError("expert parallelism with tensor parallelism is not modelled (servesim spreads the experts "
                        "over data-parallel replicas: -tp 1 -dp N --enable-expert-parallel): drop one of them")
    if spec.enable_expert_parallel and spec.data_parallel_size > spec.model.experts:
        raise UserError(f"--enable-expert-parallel over {spec.data_parallel_size} replicas: {spec.model.name} has "
                        f"{spec.model.experts} experts, fewer than one per GPU")
    if spec.router not in ROUTERS:
        raise UserError(f"--router {spec.router!r}: use one of {', '.join(ROUTERS)}")
    if spec.speculative_tokens and spec.batching == "static":
        raise UserError("speculative decoding is modelled for continuous batching; drop --batching static")
    if spec.disaggregate and (spec.batching == "static" or spec.kv_layout == "slots"):
        raise UserError("disaggregation is modelled for continuous batching on a paged cache; "
                        "drop --batching static / --kv-layout slots")


def flag_words(f, value) -> list[str]:
    """A setting's value as the words of its flag, as a command line would give it."""
    flag = f.metadata["flag"]
    if flag.startswith("--no-"):
        return [flag] if not value else []
    if value is True or (value is False and f.metadata["switch"]):
        return [flag] if value else [flag, "off"]
    if f.name == "goodput":
        return [flag, *(f"{metric}:{bound:g}" for metric, bound in value)]
    if f.name == "ramp_up":
        strategy, start, end = value
        return [flag, strategy, "--ramp-up-start-rps", f"{start:g}", "--ramp-up-end-rps", f"{end:g}"]
    if isinstance(value, (Hardware, ModelSpec, Trace, RateProfile, ReplicaSchedule)):
        return [flag, value.name]
    if isinstance(value, float):          # exact, so the command reruns the same run
        return [flag, f"{value:g}" if float(f"{value:g}") == value else repr(value)]
    return [flag, str(value)]


# How the commands servesim prints start: main.py as it was started (`python3 code/main.py` from
# the repository, `python3 ~/bin/main.py` elsewhere), so a printed rerun runs where it was printed.
PROGRAM = "code/main.py"


def is_off(value, default) -> bool:
    """Whether a setting another one needs is off: its default, or 0 or none (--kv-offloading-size 0)."""
    return value == default or value in (0, None)


# A `needs` that is a RunSpec property, not a setting: what it is when off, and the settings it is
# worked out from (swept, it may be on at another point).
DERIVED_NEEDS = {
    "gpus_per_replica": ("one GPU a replica (no --tensor-parallel-size or --pipeline-parallel-size)",
                         {"tensor_parallel_size", "pipeline_parallel_size"}),
    "nodes": ("a replica inside one node (--tensor-parallel-size x --pipeline-parallel-size within --gpus-per-node)",
              {"tensor_parallel_size", "pipeline_parallel_size", "gpus_per_node"}),
}


def inert(spec: RunSpec) -> set[str]:
    """The settings that change nothing in this deployment: those whose `needs` is off (a link
    between pipeline stages without stages), a router with one replica, and --hardware where both
    disaggregated engines' devices are named. A grid's point may
    hold them (-pp 1,2 with --inter-node-gbs); its rerun command and the grid leave them out."""
    default = RunSpec()
    idle = {name for name, f in SETTINGS.items()
            if f.metadata["needs"] and is_off(getattr(spec, f.metadata["needs"]), getattr(default, f.metadata["needs"]))}
    if spec.data_parallel_size == 1 and (not spec.replica_schedule or spec.replica_schedule.most == 1):
        idle.add("router")
    if spec.disaggregate and spec.prefill_hardware and spec.decode_hardware:
        idle.add("hardware")       # (each engine's device is named)
    return idle


def simulate_command(spec: RunSpec, sources: Optional[dict] = None, keep: Iterable[str] = ()) -> str:
    """The simulate command line that runs exactly this spec; `sources` maps a preset (the
    Hardware or ModelSpec itself, so two files that give one name stay apart) to the file it
    was read from. `keep`: settings written even where they change nothing in this spec (plan's
    one replica, whose schedule adds the replicas a router chooses between)."""
    words, default, idle = ["python3", PROGRAM, "simulate"], RunSpec(), inert(spec) - set(keep)
    for f in SETTINGS.values():
        value = getattr(spec, f.name)
        if value == getattr(default, f.name) or f.name == "simulator" or f.name in idle or \
                (f.name == "kv_link_gbs" and not spec.disaggregate):
            continue
        said = flag_words(f, value)
        if isinstance(value, (Hardware, ModelSpec)) and sources:
            said[-1] = sources.get(value, value.name)
        words += said
    return shlex.join(words)


# ---------------------------------------------------------------------------------------------
# API: a run described once, built into engines, simulated and summarised. The command line,
# the tests and bench.py all go through run(spec) and sweep(spec, axis, values).
# ---------------------------------------------------------------------------------------------

def host_tier(spec: RunSpec, plan: CapacityPlan) -> HostTier:
    """A replica's host tier: --kv-offloading-size GiB over its GPUs' share of each block."""
    block_bytes = device_kv_bytes(spec) * spec.block_size      # each GPU moves its share over its own link
    blocks = int(spec.kv_offloading_size * 2**30 / (block_bytes * spec.gpus_per_replica))
    if blocks < 1:
        raise UserError(f"--kv-offloading-size {spec.kv_offloading_size:g} GiB holds less than one KV block of "
                        f"{block_bytes * spec.gpus_per_replica / 2**20:,.2f} MiB; give at least that")
    return HostTier(blocks, block_bytes, spec.hardware.host_link_gbs)


def make_scheduler(spec: RunSpec, plan: CapacityPlan, draft: Optional[Roofline] = None) -> Scheduler:
    """The core scheduler (per step or per event) with the variations the spec asks for."""
    config = SchedulerConfig(spec.max_num_seqs, spec.max_num_batched_tokens, spec.model_len(), spec.block_size,
                             spec.chunked_prefill, spec.prefix_caching, spec.reserve_full_isl)
    options: dict = {}
    classes: list[type] = []
    if spec.max_tokens_in_flight:
        classes.append(InFlightCap)
        options["max_tokens_in_flight"] = spec.max_tokens_in_flight
    if spec.kv_layout == "slots":
        if plan.kv_tokens // spec.max_num_seqs < 1:
            raise UserError(f"--kv-layout slots splits {plan.kv_tokens:,} KV tokens into {spec.max_num_seqs} slots: "
                            f"less than one token each; lower --max-num-seqs")
        classes.append(SlotLayout)
        options["kv_tokens"] = plan.kv_tokens
    if spec.kv_offloading_size:
        if not spec.prefix_caching:
            raise UserError("--kv-offloading-size keeps prefix-cached blocks in host memory: add --prefix-caching")
        classes.append(Offloaded)
        options["host"] = host_tier(spec, plan)
    profile = engine_profile(spec)
    if profile.reserve_output:
        classes.append(NoEvict)
    if profile.prefill_apart:
        classes.append(PrefillApart)
    if spec.batching == "static":
        classes.append(StaticBatchScheduler)
    elif spec.speculative_tokens:
        # (The cruise takes blocks lazily, so not with prefix caching; a host tier and lockstep,
        # as below.)
        event = spec.simulator == "event" and not spec.prefix_caching and not spec.kv_offloading_size \
            and not lockstep(spec.data_parallel_size, spec.model, profile)
        classes.append(SpeculativeCruise if event else SpeculativeScheduler)
        options.update(speculative_tokens=spec.speculative_tokens, acceptance_rate=spec.acceptance_rate,
                       seed=spec.seed, draft=draft)
    else:      # the event engine follows every rule but a host tier's (the order blocks reach
        # host memory, which its LRU keeps, is the order they fill, and a cruising decode's blocks
        # are keyed when it wakes, a step later) and replicas stepping in lockstep
        event = spec.simulator == "event" and not spec.kv_offloading_size \
            and not lockstep(spec.data_parallel_size, spec.model, profile)
        classes.append(EventScheduler if event else Scheduler)
    cls = classes[0] if len(classes) == 1 else type("Scheduler", tuple(classes), {})
    return cls(config, plan.num_blocks, spec.detailed, **options)


def draft_of(spec: RunSpec) -> Optional[ModelSpec]:
    """What one device holds and computes of the speculative draft model: vLLM shards it over the
    target's tensor-parallel group (SpeculativeConfig takes the target's size for the draft's, and
    V1's DraftModelProposer refuses any other), and keeps its cache in the engine's KV type."""
    if not (spec.speculative_tokens and spec.draft_model):
        return None
    return tensor_shard(quantized(spec.draft_model, None, spec.kv_cache_dtype), spec.tensor_parallel_size)


def device_kv_bytes(spec: RunSpec) -> int:
    """One device's KV bytes per token (its heads of its stage's layers), a draft model's included:
    its share of every block, which a host tier and a prefill engine's hand-off move whole."""
    stage = pipeline_shard(quantized(spec.model, spec.quantization, spec.kv_cache_dtype), spec.pipeline_parallel_size)
    draft = draft_of(spec)
    return tensor_shard(stage, spec.tensor_parallel_size).kv_bytes_per_token + (draft.kv_bytes_per_token if draft else 0)


def tp_network(spec: RunSpec) -> Optional[tuple[float, float]]:
    """The network a tensor-parallel group larger than a node all-reduces over: (bytes/s per GPU,
    seconds a send), or None inside one node."""
    if spec.tensor_parallel_size <= spec.gpus_per_node:
        return None
    return spec.inter_node_gbs * 1e9, spec.inter_node_latency_us / 1e6


def expert_ranks(spec: RunSpec) -> int:
    """The data-parallel ranks a mixture of experts' expert layers are spread over (1: each rank
    holds them all). With --enable-expert-parallel each rank holds its own experts. Without it,
    vLLM spreads them all the same: its ranks that step in lockstep shard every expert over their
    DP x TP GPUs as tensor parallelism does (FusedMoEParallelConfig.make, flatten_tp_across_dp:
    "there are actually dp_size * tp_size devices"), gathering every rank's tokens before each
    MoE layer and reduce-scattering after it, as its expert-parallel default does; the same
    memory, expert read and traffic, so it is priced as expert parallelism, each expert split
    evenly rather than the experts dealt out."""
    if spec.replica_schedule:     # separate servers an autoscaler starts, each with the whole model
        return 1
    if spec.enable_expert_parallel:
        return spec.data_parallel_size
    return spec.data_parallel_size if lockstep(spec.data_parallel_size, spec.model, engine_profile(spec)) else 1


def device_plan(spec: RunSpec, hardware: Hardware) -> tuple[CapacityPlan, Roofline]:
    """One GPU's memory plan, and how a step of its engine is priced (its group's communication
    included): what capacity prints and what each engine of run() is built from."""
    model = quantized(spec.model, spec.quantization, spec.kv_cache_dtype)
    tp, ep, pp = spec.tensor_parallel_size, expert_ranks(spec), spec.pipeline_parallel_size
    engine, draft = engine_profile(spec), draft_of(spec)

    def on_each_gpu(stage: ModelSpec) -> ModelSpec:      # what each GPU of a stage holds and computes
        device = tensor_shard(stage, tp)
        if ep > 1:
            device = expert_shard(device, ep) if spec.enable_expert_parallel else replace(device, expert_share=1 / ep)
        return device

    def priced(stage: ModelSpec) -> Roofline:            # a step of a stage, its group's communication included
        cost = cost_model(spec.cost_model, hardware, on_each_gpu(stage), gemm_tflops(hardware, spec.quantization),
                          engine, spec.max_num_seqs)
        if tp > 1:
            cost = Parallel(cost, hardware, stage, tp, engine.rules, tp_network(spec))
        return ExpertParallel(cost, hardware, model, ep) if ep > 1 else cost

    stage = pipeline_shard(model, pp)       # (the fullest stage: the whole model without a pipeline)
    device = on_each_gpu(stage)
    plan = plan_capacity(hardware, device, spec.gpu_memory_utilization, spec.block_size, spec.model_len(),
                         spec.kv_tokens, spec.num_gpu_blocks, draft=draft, of_free=engine.kv_of_free,
                         reserve=not engine.static_share)
    # llama-server's --ctx-size 0 (its default) takes the model's training context (llama.cpp
    # common/common.h n_ctx = 0; llama-context.cpp: n_ctx_train), shared by its slots, not what
    # memory would hold: where memory holds more, the cache is that context.
    context = spec.model.max_position_embeddings or DEFAULT_MODEL_LEN
    if engine.rules == "llamacpp" and plan.source == "budget" and plan.kv_tokens > context:
        plan = plan_capacity(hardware, device, spec.gpu_memory_utilization, spec.block_size, spec.model_len(),
                             context, None, draft=draft)
        plan.source = "context"
    cost = priced(stage)
    if pp > 1:
        cost = Pipeline(cost, priced(pipeline_layers(model, pp)), hardware, model, spec)
    plan.tensor_parallel_size, plan.group_model = tp, model
    plan.pipeline_parallel_size, plan.draft = pp, draft
    plan.replicas, plan.expert_parallel = spec.data_parallel_size, spec.enable_expert_parallel
    return plan, cost


VLLM_BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)     # vllm/config/cache.py, BlockSize


def vllm_refusal(spec: RunSpec, plan: CapacityPlan) -> str:
    """Why vLLM would not start this deployment (each reason, joined), or "". It checks at start that one request of
    max_model_len fits the KV cache (capacity says so too), that the block size is one of its
    own, and that a step's token budget gives every sequence it may run a token
    (SchedulerConfig._verify_args). The run is simulated as given, and says what vLLM would do."""
    if engine_profile(spec).rules != "vllm":
        return ""
    why = []
    if plan.max_concurrency < 1:
        why.append(f"one request of {plan.max_model_len:,} tokens (the model's own length unless --max-model-len "
                   f"says) does not fit its {plan.kv_tokens:,}-token KV cache; vLLM needs --max-model-len "
                   f"{plan.kv_tokens} or less")
    if spec.block_size not in VLLM_BLOCK_SIZES:
        why.append(f"--block-size {spec.block_size:,} is not one it takes ({', '.join(map(str, VLLM_BLOCK_SIZES))})")
    if spec.max_num_batched_tokens < spec.max_num_seqs:
        why.append(f"--max-num-batched-tokens {spec.max_num_batched_tokens:,} is below --max-num-seqs "
                   f"{spec.max_num_seqs:,} (vLLM: \"max_num_batched_tokens must be greater than or equal to "
                   f"max_num_seqs\"); raise the one or lower the other")
    own = spec.model.max_position_embeddings
    if own and spec.model_len() > own:     # (ModelConfig: past it only with VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)
        why.append(f"--max-model-len {spec.model_len():,} is longer than {spec.model.name}'s own "
                   f"{own:,} (its max_position_embeddings), which vLLM takes only with "
                   f"VLLM_ALLOW_LONG_MAX_MODEL_LEN=1")
    return "; and ".join(why)


def build_engines(spec: RunSpec) -> tuple[list[Engine], Optional[KvLink]]:
    """One engine per replica, or a prefill engine and a decode engine joined by a KvLink."""
    check_spec(spec)

    def engine(hardware: Hardware) -> Engine:
        plan, cost = device_plan(spec, hardware)
        draft, draft_cost = draft_of(spec), None
        if draft:
            draft_cost = cost_model(spec.cost_model, hardware, draft, None, engine_profile(spec))
            if spec.tensor_parallel_size > 1:
                draft_cost = Parallel(draft_cost, hardware, spec.draft_model, spec.tensor_parallel_size,
                                      engine_profile(spec).rules, tp_network(spec))
        scheduler = make_scheduler(spec, plan, draft_cost)
        engine = (EventEngine if isinstance(scheduler, EventScheduler) else Engine)(hardware, spec.model, scheduler, cost)
        if isinstance(scheduler, Offloaded):
            scheduler.deliver = engine.deliver
        why = vllm_refusal(spec, plan)
        engine.plan_note = plan.note
        engine.refused_note = f"vLLM would refuse to start this deployment: {why} (simulated as given)" if why else ""
        return engine

    if not spec.disaggregate:
        return [engine(spec.hardware) for _ in range(spec.data_parallel_size)], None
    prefill, decode = engine(spec.prefill_hardware or spec.hardware), engine(spec.decode_hardware or spec.hardware)
    link = KvLink(spec.kv_link_gbs, device_kv_bytes(spec) * spec.tensor_parallel_size, decode)
    prefill.scheduler.handoff = link.send
    return [prefill, decode], link


def repeated_rows(rows: tuple, copies: int, limit: Optional[int] = None) -> list:
    """A trace played `copies` times end to end: each copy follows the one before by the trace's
    span plus its mean gap, so the rate stays the trace's own. Content shared by several requests
    (hash ids, system prompts, a conversation's history) stays shared, as the next day of the same
    traffic shares it; content of one request only is new in every copy, as the next day's users
    write new messages. (Sharing everything would turn every copy into cache hits; sharing nothing
    would lose the system prompts every request of a service sends.)"""
    if limit:           # the copies the first `limit` rows come from, no more
        copies = min(copies, -(-limit // len(rows)))
    if copies <= 1:
        return list(rows)
    uses = Counter(key for *_, content in rows for key in {key for key, _ in content})
    arrivals = [row[0] for row in rows]
    span = max(arrivals) - min(arrivals)
    period = span + span / (len(rows) - 1) if len(rows) > 1 and span > 0 else 1.0
    out = list(rows)
    for copy in range(1, copies):
        for arrival, prompt, output, content in rows:
            new = tuple(((key, "copy", copy) if uses[key] == 1 else key, tokens) for key, tokens in content)
            out.append((arrival + copy * period, prompt, output, new))
    return out


# Sessions in a trace (a row's parent, and its delay after the parent's end): each row becomes its
# parent's next turn, sent when the parent ends plus the delay (or at its own time, never before the
# parent has ended). In servesim's JSONL a turn's prompt_tokens is its whole context, so the
# parent's prompt and reply head it and are shared with the parent in the cache; hash-id traces
# (Bailian) say what is shared themselves.

def session_contents(trace: Trace, rows: list) -> list[tuple]:
    n = len(trace.rows)
    contents = [row[3] for row in rows]
    if trace.format != "servesim":
        return contents
    whole: dict[int, tuple] = {}      # a row's prompt as content runs, history included

    def covered(i: int) -> tuple:
        if i not in whole:
            content, prompt = contents[i], rows[i][1]
            rest = prompt - sum(tokens for _, tokens in content)
            whole[i] = content + (((("turn", i // n, i % n), rest),) if rest > 0 else ())
        return whole[i]

    for i, row in enumerate(rows):
        parent = trace.parents[i % n]
        if parent < 0:
            continue
        p = i - i % n + parent
        history = covered(p) + ((("reply", i // n, p % n), rows[p][2]),)
        spoken = sum(tokens for _, tokens in history)
        if row[1] > spoken:          # the turn sends the conversation so far, then its new message
            contents[p] = history        # the parent's reply is content too: its blocks are the turn's
            contents[i] = history + ((("turn", i // n, i % n), row[1] - spoken),)
            whole[i] = contents[i]
    return contents


def chain_sessions(requests: list[Request], trace: Trace, time_scale: float) -> None:
    n = len(trace.rows)
    for request in requests:
        parent = trace.parents[request.id % n]
        if parent < 0:
            continue
        before = requests[request.id - request.id % n + parent]
        delay = trace.delays[request.id % n]
        before.next_turn, before.think_s = request, (delay or 0.0) * time_scale
        request.not_before = 0.0 if delay is not None else request.sent_s
        before.turn = before.turn or 1
        request.turn = before.turn + 1


def profile_sends(profile: RateProfile, time_scale: float, seed: int, burstiness: float, limit: int) -> list[float]:
    """A rate profile's send times (at most `limit`, 0 for all), its times stretched by
    `time_scale`; simulate and loadgen draw the same ones for the same seed."""
    p, x = profile, time_scale
    windows, end = tuple((start * x, rate / x) for start, rate in p.windows), p.end_s * x
    if end > MAX_ARRIVAL_S:
        raise UserError(f"rate profile {p.name} at time scale {x:g} spans {end / 86400:,.0f} days; servesim "
                        f"simulates up to a year")
    expected = p.expected_requests()
    if not limit and expected > MAX_REQUESTS:
        raise UserError(f"rate profile {p.name} sends about {expected:,.0f} requests; servesim simulates up to "
                        f"{MAX_REQUESTS:,}: cap them with --requests, or lower its rates")
    sends = profile_arrivals(windows, end, random.Random(seed + PROFILE_SEED), burstiness, limit)
    if not sends:
        raise UserError(f"rate profile {p.name} sends no requests: its rates are 0, or too low for its windows")
    return sends


def draws_from_seed(spec: RunSpec) -> bool:
    """Whether --seed changes the run: a trace brings its own requests and send times, so only a
    speculative decoder's acceptances (each request's own stream) are left to draw."""
    return not spec.trace or bool(spec.speculative_tokens and spec.acceptance_rate < 1)


def make_requests(spec: RunSpec, progress: Optional[Callable[[str], None]] = None) -> list[Request]:
    if spec.trace:
        rows = repeated_rows(spec.trace.rows, spec.trace_repeats, spec.requests)
        rows = rows[:spec.requests] if spec.requests else rows
        last = max(arrival for arrival, *_ in rows) * spec.time_scale
        if last > MAX_ARRIVAL_S:
            raise UserError(f"trace {spec.trace.name} x {spec.trace_repeats} at time scale {spec.time_scale:g} spreads "
                            f"{len(rows):,} arrivals over {last / 86400:,.0f} days; servesim simulates up to a year")
        thinking, n = spec.trace.reasoning, len(spec.trace.rows)
        contents = session_contents(spec.trace, rows) if spec.trace.parents else [row[3] for row in rows]
        requests = [Request(i, prompt, output, sent_s=arrival * spec.time_scale, content=content,
                            reasoning_tokens=thinking[i % n] if thinking else 0)
                    for i, ((arrival, prompt, output, _), content) in enumerate(zip(rows, contents))]
        if spec.trace.parents:
            chain_sessions(requests, spec.trace, spec.time_scale)
        return requests
    rng = random.Random(spec.seed)
    count = spec.requests or DEFAULT_REQUESTS
    if spec.rate_profile:        # the profile sets the count: its send times are drawn first, apart
        # Each send starts a conversation (one request without --turns), as loadgen sends them.
        sends = profile_sends(spec.rate_profile, spec.time_scale, spec.seed, spec.burstiness,
                              -(-spec.requests // spec.turns) if spec.requests else 0)
        count = min(spec.requests or math.inf, len(sends) * spec.turns)
        if spec.warmup >= count:      # (its count is the draw's: known only now, seed by seed)
            raise UserError(f"--warmup {spec.warmup:,} leaves no request to measure: rate profile "
                            f"{spec.rate_profile.name} sends {count:,} with --seed {spec.seed}; lower --warmup")
    if spec.turns > 1:
        requests = conversations(count, spec.prompt_tokens, spec.output_tokens, rng, spec.turns, spec.think_time,
                                 spec.prefix_tokens, spec.num_prefixes)
    else:
        requests = synthetic_requests(count, spec.prompt_tokens, spec.output_tokens, rng,
                                      spec.prefix_tokens, spec.num_prefixes, progress)
    if spec.reasoning_tokens:
        low, high = spec.reasoning_tokens.low, spec.reasoning_tokens.high
        think = random.Random(spec.seed + REASONING_SEED)
        for request in requests:
            request.reasoning_tokens = think.randrange(low, high + 1)
    if spec.rate_profile:
        for request, at in zip([r for r in requests if r.turn <= 1], sends):
            request.sent_s = at
    elif spec.rate or spec.ramp_up:
        # Drawn after the lengths, so a rate sweep sees the same requests. A conversation's
        # later turns are sent when the turn before ends.
        starts = [r for r in requests if r.turn <= 1]
        for request, at in zip(starts, arrival_times(len(starts), rng, spec.rate, spec.burstiness, spec.ramp_up)):
            request.sent_s = at
        if starts[-1].sent_s > MAX_ARRIVAL_S:
            raise UserError(f"{spec.arrivals()} spreads {len(starts):,} arrivals over "
                            f"{starts[-1].sent_s / 86400:,.0f} days; servesim simulates up to a year of arrivals")
    return requests


def scale_up_delay(spec: RunSpec) -> float:
    """--scale-up-delay, or the start of an engine and its share of the weights read from disk."""
    if spec.scale_up_delay is not None:
        return spec.scale_up_delay
    share = quantized(spec.model, spec.quantization, spec.kv_cache_dtype).weight_bytes / spec.gpus_per_replica
    return ENGINE_START_S + share / (WEIGHT_LOAD_GBS * 1e9)


def schedule_report(schedule: ReplicaSchedule, spans: list, delay: float, duration: float, gpus: int,
                    price: Optional[float]) -> dict:
    """What a schedule costs: each replica paid from the moment it is asked for until it is let go
    (or the run ends), against the same replicas kept all the time."""
    paid = sum(min(leave, duration) - asked for replica in spans for asked, _, leave in replica if asked < duration)
    # The steps the run reached (a schedule may go on after the last request ends).
    reached = [n for t, n in schedule.steps if t < duration or t == 0]
    after = next((t for t, _ in schedule.steps if t >= duration and t > 0), None)
    gpu_hours, fixed = paid * gpus / 3600, max(reached) * duration * gpus / 3600
    return {"name": schedule.name, "scale_up_delay_s": delay, "least": min(reached),
            "most": max(reached), "mean_replicas": paid / duration if duration else 0.0,
            "gpu_hours": gpu_hours, "fixed_fleet_gpu_hours": fixed,
            "usd": gpu_hours * price if price else None, "fixed_fleet_usd": fixed * price if price else None,
            "gpus_per_replica": gpus, **({"rows_after_the_run_from_s": after} if after is not None else {})}


def run(spec: RunSpec, progress: Optional[Callable[[str], None]] = None, timeline: bool = False,
        requests_out: Optional[list] = None, stop_on: Optional["Slo"] = None) -> dict:
    """Simulate one run; the result has vllm bench serve's keys plus engine, config (and link);
    with `timeline`, per-second stats in the shape vLLM logs them; `requests_out` is given the
    measured requests themselves, for a caller that summarises them its own way. With `stop_on`,
    an open loop without conversations stops once it misses that SLO for certain (CertainMiss):
    its result says where and why under `stopped`, it has no latency figures (None) and no
    steady window, and its counts and throughput are those of the requests ended by then."""
    schedule = spec.replica_schedule
    if schedule:
        spec = replace(spec, data_parallel_size=schedule.most)
    engines, link = build_engines(spec)
    replicas = engines if len(engines) > 1 and not link else [engines[-1]]
    if timeline:
        for engine in engines:      # (disaggregated: the prefill engine's queue too)
            engine.timeline = {}
    spans = schedule.spans(scale_up_delay(spec)) if schedule else None
    router = Router(engines, spec.router, spans) if len(replicas) > 1 else None
    # Replicas a schedule adds and lets go are separate servers, not one deployment's DP ranks.
    together = router and not schedule and lockstep(spec.data_parallel_size, spec.model, engine_profile(spec))
    requests = make_requests(spec, progress)
    apart = not spec.clients() and not any(r.next_turn for r in requests)
    server = engines[0] if len(engines) == 1 else (Lockstep if together else Replicas)(engines, router, apart)
    # The first --warmup requests sent warm the cache and fill the batch; they are not measured.
    sent_first = sorted(requests, key=operator.attrgetter("sent_s")) if spec.trace else requests
    for request in sent_first[:spec.warmup]:
        request.measured = False
    report = None
    if progress:
        report = lambda clock: progress(f"{sum(len(e.scheduler.done) for e in engines):,}/{len(requests):,} "
                                        f"requests done, {clock:,.1f} s simulated")
    watch = CertainMiss(stop_on, requests, [e.scheduler.done for e in engines], spec.steady_skip,
                        bool(spec.reasoning_tokens or (spec.trace and spec.trace.reasoning))) \
        if stop_on and apart else None
    stopped = simulate(server, requests, spec.clients(), report, watch)
    done = [r for e in engines for r in e.scheduler.done if r.measured]
    if requests_out is not None:
        requests_out.extend(done)
    result = summarize(done, sum((e.scheduler.itl for e in engines), Counter()), dict(spec.goodput))
    if spec.warmup:
        result["warmup_requests"] = spec.warmup
    everyone = [r for e in engines for r in e.scheduler.done]
    if stopped:
        # Latencies of the requests ended by then are the quick ones: left out, not to be read
        # as the run's (the bound it missed is over, for certain; the rest were not run to tell).
        result.update({key: None for key in result if key.endswith("_ms")})
        at = server.clock - min(r.sent_s for r in requests)
        result["stopped"] = {"at_s": at, "requests_ended": len(everyone), "requests": len(requests), "why": stopped,
                             "slo": watch.missed}
        result["steady_state"] = {"sustained": None, "stopped": True,
                                  "note": f"{stopped}; stopped at {at:,.1f} s, {len(everyone):,} of {len(requests):,} "
                                          f"requests ended"}
    else:
        result["steady_state"] = steady_window(everyone, spec.steady_skip, spec.min_served, spec.max_queue_growth,
                                               bool(spec.clients()), dict(spec.goodput),
                                               may_stay_in_step(spec) if spec.clients() else None)
    if any(r.turn for r in done):
        result["turns"] = by_turn(done)
    decode = engines[-1]
    # The engines' time-weighted figures are over all they ran, warm-up included: from the first
    # send to the last step's end (the measured requests' duration leaves the warm-up out).
    served = max(e.stats.until for e in engines) - min((r.sent_s for r in requests), default=0.0)
    if router:
        result["replicas"] = [{"completed": sum(r.error is None for r in e.scheduler.done),
                               "failed": sum(r.error is not None for r in e.scheduler.done),
                               **e.report(served)} for e in replicas]
        merged = EngineStats.merged([e.stats for e in replicas])
        result["engine"] = {"hardware": decode.hardware.name,
                            **merged.report([e.scheduler for e in replicas], served)}
    else:
        result["engine"] = decode.report(served)
    tiers = [e.scheduler.host for e in engines if isinstance(e.scheduler, Offloaded)]
    if tiers:
        queries = sum(e.scheduler.pool.prefix_queries for e in engines)
        result["host_tier"] = host_tier_report(tiers, served, spec.block_size, queries)
    gpus = spec.gpus_per_replica * spec.data_parallel_size * (2 if link else 1)
    where = f"on {decode.hardware.name}" + (f" x {gpus}" if gpus > 1 else "")
    if spec.tensor_parallel_size > 1:
        where += f" (tensor parallel {spec.tensor_parallel_size})"
    if spec.pipeline_parallel_size > 1:
        where += f" ({spec.pipeline_parallel_size} pipeline stages)"
    if router and together:       # one server: its ranks step together and share the experts (expert_ranks)
        where += (f" ({spec.data_parallel_size} data-parallel ranks stepping in lockstep, the experts spread over "
                  f"their {gpus} GPUs, {spec.router} router" + (", expert parallel" if spec.enable_expert_parallel
                                                                 else "") + ")")
    elif router:
        where += (f" ({spec.data_parallel_size} replicas, {spec.router} router"
                  + (", expert parallel" if spec.enable_expert_parallel else "") + ")")
    if link:
        result["prefill_engine"] = engines[0].report(served)
        result["link"] = link.report(served)
        tp = f" x {spec.tensor_parallel_size} (tensor parallel)" if spec.tensor_parallel_size > 1 else ""
        where = f"prefill on {engines[0].hardware.name}{tp}, decode on {decode.hardware.name}{tp}, {link.gbs:g} GB/s link"
    if engine_label(spec):         # (named only where given: without one, vLLM's rules with the lesson's knobs)
        where += f", engine {engine_label(spec)}"
    config = decode.scheduler.config
    result["config"] = {
        "title": f"servesim {spec.model.name} {where}  {len(requests):,} requests  {spec.arrivals()}",
        "hardware": decode.hardware.name, "model": spec.model.name,
        "num_prompts": len(requests), "arrivals": spec.arrivals(),
        "max_concurrency": spec.clients(), "request_rate": spec.rate,
        "trace": spec.trace.name if spec.trace else None,
        # What its reader left out or changed, as stderr said it: a script reads this.
        **({"trace_notes": list(spec.trace.notes)} if spec.trace and spec.trace.notes else {}),
        "prompt_tokens": None if spec.trace else str(spec.prompt_tokens),
        "output_tokens": None if spec.trace else str(spec.output_tokens), "seed": spec.seed,
        **asdict(config), "max_tokens_in_flight": spec.max_tokens_in_flight,
        "batching": spec.batching, "kv_layout": spec.kv_layout,
        "gpu_memory_utilization": spec.gpu_memory_utilization,
        "kv_tokens": decode.scheduler.pool.num_blocks * config.block_size,
        "kv_cache_fixed": bool(spec.kv_tokens or spec.num_gpu_blocks),     # by --kv-tokens or --num-gpu-blocks
        "disaggregated": bool(link), "kv_link_gbs": link.gbs if link else None,
        "cost_model": spec.cost_model, "quantization": spec.quantization, "kv_cache_dtype": spec.kv_cache_dtype,
        "tensor_parallel_size": spec.tensor_parallel_size, "data_parallel_size": spec.data_parallel_size,
        "pipeline_parallel_size": spec.pipeline_parallel_size, "router": spec.router if router else None,
        # where a replica spans nodes (a pipeline's hand-offs, a TP group's all-reduces), what it crosses
        "gpus_per_node": spec.gpus_per_node, "inter_node_gbs": spec.inter_node_gbs,
        "inter_node_latency_us": spec.inter_node_latency_us,
        "enable_expert_parallel": spec.enable_expert_parallel,
        "gpus": gpus, "engine": (spec.engine or spec.profile) and engine_profile(spec).name,
        "engine_base": engine_profile(spec).base or None, "async_scheduling": engine_profile(spec).overlap,
        "speculative_tokens": spec.speculative_tokens,
        "acceptance_rate": spec.acceptance_rate if spec.speculative_tokens else None,
        "draft_model": spec.draft_model.name if spec.speculative_tokens and spec.draft_model else None,
    }
    if spec.time_scale != 1:
        result["config"]["time_scale"] = spec.time_scale
    if spec.kv_offloading_size:
        result["config"].update(kv_offloading_size=spec.kv_offloading_size,
                                kv_offloading_backend=spec.kv_offloading_backend)
    if spec.reasoning_tokens or (spec.trace and spec.trace.reasoning):
        result["config"]["reasoning_tokens"] = str(spec.reasoning_tokens) if spec.reasoning_tokens else "from the trace"
    if schedule:
        result["replica_schedule"] = schedule_report(schedule, spans or [[(0.0, 0.0, math.inf)]], scale_up_delay(spec),
                                                     result["duration"], gpus // max(1, spec.data_parallel_size),
                                                     deployment_price(spec, [decode.hardware], 1))
    price = deployment_price(spec, [e.hardware for e in engines], gpus // len(engines))
    if schedule and price:      # what the schedule pays an hour on average, not its largest fleet's
        price = result["replica_schedule"]["usd"] / (result["duration"] / 3600) if result["duration"] else price
    result["cost"] = cost_report(price, result["output_throughput"], spec.hours_per_month)
    if decode.plan_note:
        result["config"]["kv_plan_note"] = decode.plan_note
    notes = [e.refused_note for e in engines]       # (a prefill engine's device may be the smaller)
    if spec.disaggregate:
        notes = [note and f"the {role} engine: {note}" for note, role in zip(notes, ("prefill", "decode"))]
    if any(notes):
        result["config"]["vllm_would_refuse"] = "; ".join(dict.fromkeys(note for note in notes if note))
    if isinstance(decode.scheduler, SpeculativeScheduler):
        result["speculative"] = decode.scheduler.report()
    if timeline:
        # The timeline spans the whole run, warm-up included (its running, waiting and KV figures
        # count every request; its token rates, as the engines' sampled counts do, the measured).
        if served > MAX_TIMELINE_S:      # a row a second: refuse before building them
            raise UserError(f"--timeline and --plot keep one row per simulated second, and this run spans "
                            f"{served / 86400:,.1f} days, more than {MAX_TIMELINE_S / 86400:,.1f} days: "
                            f"drop them, or shorten the run")
        # A disaggregated run's prefill engine holds its queue and its prompts' KV; its tokens
        # are the first ones, counted with the requests.
        prefill = [{t: (*state[:3], 0) for t, state in engines[0].timeline.items()}] if link else []
        result["timeline"] = timeline_rows([e.timeline for e in replicas] + prefill, done,
                                           min((r.sent_s for r in requests), default=0.0), served)
    if spec.detailed:
        result.update(detailed_arrays(sorted(done, key=lambda r: r.id)))
    return result


SPREAD = ("output_throughput", "request_throughput",
          *(f"{stat}_{metric}_ms" for metric in ("ttft", "tpot", "itl", "e2el", "ttfa") for stat in ("median", "p95", "p99")))


def spread_of(reports: list[dict]) -> dict:
    """How far apart the reports' figures are: min and max, and p10 and p90 (nearest rank) from
    SPREAD_PERCENTILES_FROM reports."""
    spread = {}
    for key in SPREAD:
        values = sorted(r[key] for r in reports if r.get(key) is not None)
        if values:
            rank = lambda p: values[max(0, math.ceil(p / 100 * len(values)) - 1)]
            spread[key] = {"min": values[0], "max": values[-1],
                           **({"p10": rank(10), "p90": rank(90)} if len(values) >= SPREAD_PERCENTILES_FROM else {})}
    return spread


def mean_report(values: list):
    """Reports of one shape as one: numbers averaged, a verdict true only if true in all, lists
    of objects (replicas, turns) item by item; per-request arrays and text as the first has them."""
    first = values[0]
    if isinstance(first, bool):
        return all(values) if all(isinstance(v, bool) for v in values) else first
    if isinstance(first, (int, float)) and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                               for v in values):
        # A figure every seed agrees on (a count, a setting) keeps its own value and type.
        return first if all(v == first for v in values) else sum(values) / len(values)
    if isinstance(first, dict) and all(isinstance(v, dict) for v in values):
        return {key: mean_report([v.get(key) for v in values]) for key in first}
    if isinstance(first, list) and first and all(isinstance(item, dict) for item in first) and \
            all(isinstance(v, list) and len(v) == len(first) for v in values):
        return [mean_report(list(items)) for items in zip(*values)]
    return first


SPREAD_PERCENTILES_FROM = 11     # by nearest rank, below 11 seeds the 10th percentile is the min (below 10 the 90th the max)


def seeded(runs: list[dict]) -> dict:
    """Runs of one point with seeds seed, seed + 1, ... as one report: every figure the mean of
    the runs (a verdict holds only if it holds in every run), and under `seeds` how many runs
    were sustained and the spread of the headline figures: min-max, and from SPREAD_PERCENTILES_FROM
    seeds on the 10th-90th percentile interval (nearest rank)."""
    merged = mean_report(runs)
    merged["config"] = runs[0]["config"]
    # A rate profile's requests are drawn, so each seed sends its own count: the title says the range.
    counts = sorted({r["config"].get("num_prompts") for r in runs} - {None})
    if len(counts) > 1 and "title" in merged["config"]:
        merged["config"] = {**merged["config"], "title": merged["config"]["title"].replace(
            f"  {merged['config']['num_prompts']:,} requests  ", f"  {counts[0]:,} to {counts[-1]:,} requests (by seed)  ",
            1)}
    # Failures by kind over every seed, not the first seed's kinds alone: each kind's mean count, and
    # the first example of it in seed order.
    kinds = list(dict.fromkeys(kind for r in runs for kind in r.get("errors_by_kind") or {}))
    merged["errors_by_kind"] = {kind: sum((r.get("errors_by_kind") or {}).get(kind, 0) for r in runs) / len(runs)
                                for kind in kinds}
    merged["first_error_by_kind"] = {kind: next(r["first_error_by_kind"][kind] for r in runs
                                                if kind in (r.get("first_error_by_kind") or {}))
                                     for kind in kinds if any(kind in (r.get("first_error_by_kind") or {}) for r in runs)}
    sustained = sum(1 for r in runs if (r.get("steady_state") or {}).get("sustained"))
    # A seed too short for a verdict has no window figures to average: the window is the mean of
    # the seeds that have one, and says how many had none.
    windows = [r["steady_state"] for r in runs if r.get("steady_state")]
    judged = [w for w in windows if w.get("sustained") is not None]
    unjudged = len(runs) - len(judged)        # a seed with no window at all (every request failed) too
    if judged and unjudged:
        merged["steady_state"] = {**mean_report(judged), "seeds_too_short": unjudged, "seeds_count": len(runs)}
    elif windows and unjudged:
        bursts = sum(1 for w in windows if w.get("one_burst"))
        merged["steady_state"] = {**mean_report(windows), "seeds_too_short": unjudged, "seeds_count": len(runs),
                                  "one_burst": bursts == len(windows),
                                  "note": f"too short to tell whether the server keeps up in all {unjudged} seeds"
                                  + (f" ({bursts} of them one burst, every request sent before the first ended)"
                                     if bursts else "") + "; send more requests for a verdict"}
    # The whole runs' figures spread as the report's means do; the steady windows' as a search's
    # verdicts read them (a window's TPOT p95 passes where the whole run's, transient and drain in, misses).
    merged["seeds"] = {"count": len(runs), "seeds": [r["config"]["seed"] for r in runs], "sustained": sustained,
                       "too_short": unjudged, "one_burst": sum(1 for w in windows if w.get("one_burst")),
                       "spread": spread_of(runs), "steady_spread": spread_of([w for w in windows if w.get("completed")])}
    steady = merged.get("steady_state")
    if isinstance(steady, dict) and steady.get("sustained") is not None and not steady.get("closed_loop"):
        steady["seeds_sustained"], steady["seeds_count"] = sustained, len(runs)
        # Each seed's reasons carry its own figures: counted by the test that failed.
        tests = Counter(test for r in runs for test in (r.get("steady_state") or {}).get("overloaded_on", ()))
        steady.pop("overloaded_by", None)
        steady.pop("overloaded_on", None)
        if not steady["sustained"]:
            named = {"wait": "the wait grows past the bound", "served": "it serves too little of what is offered"}
            steady["overloaded_on"] = sorted(tests, key=list(named).index)
            steady["overloaded_by"] = [f"{named[test]} in {tests[test]} of {len(runs)} seeds"
                                       for test in steady["overloaded_on"]] \
                or [f"in {len(judged) - sustained} of {len(runs)} seeds"]
    return merged


def slope(points: list[tuple[float, float]]) -> float:
    """The least-squares slope of y against x (0 for fewer than two distinct x)."""
    n = len(points)
    if n < 2:
        return 0.0
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / spread if spread > 0 else 0.0


def mean_residual(points: list[tuple[float, float]]) -> float:
    """The mean distance of y from its least-squares line against x (0 for no points)."""
    if not points:
        return 0.0
    b = slope(points)
    mean_x, mean_y = sum(x for x, _ in points) / len(points), sum(y for _, y in points) / len(points)
    return sum(abs(y - mean_y - b * (x - mean_x)) for x, y in points) / len(points)


MIN_WINDOW_REQUESTS = 10      # fewer sent inside the steady window: too few to tell a trend
# An open loop's steady window must last this many request lifetimes (the median time from a
# request's first token to its last: its time in a batch, without a queue that an overloaded
# server grows with the run): shorter, and more of its requests are still in a batch at its edges
# than end inside it, so the ends it counts are those of the transient before it and of the
# drain after it (with --steady-requests 40, search passed 43.7 req/s, "served 172%", on a server
# that serves 37).
WINDOW_LIFETIMES = 2


def window_floor(min_served: float, bunched: float = 1.0) -> int:
    """The fewest requests a steady window needs for a verdict. Its served rate counts the requests
    that end inside it, so one more or fewer at each edge moves the rate by 2/N of the offered: below
    N = 2 / (1 - min_served) (40 at 0.95) that edge alone is larger than the shortfall the rule
    allows, and a run would be called overloaded, or not, by where its last request happened to end.
    Requests sent in bunches (`bunched`, see bunching) cross an edge together: as many times more."""
    alone = min(MAX_WINDOW_FLOOR, max(MIN_WINDOW_REQUESTS, math.ceil(2 / (1 - min_served) - 1e-9))) \
        if min_served < 1 else MAX_WINDOW_FLOOR
    return math.ceil(alone * bunched - 1e-9)


MAX_WINDOW_FLOOR = 400        # --min-served 1 (no shortfall at all) still judges a window this long


def bunching(times: Iterable[float]) -> float:
    """The mean size of the bunch a request is sent in, the requests sent at one moment making a
    bunch (sum of sizes squared over sum of sizes): 1 where no two share a moment. A trace's
    bunches keep their moments at any time scale, and cross a window's edge together: one bunch of
    m more or fewer at an edge moves its counts by m, so a window needs m times the requests for
    the same certainty, and the spread of its counts is sqrt(m) times as wide."""
    sizes = Counter(times).values()
    return sum(m * m for m in sizes) / max(1, sum(sizes))


def steady_window(requests: list, skip: float, min_served: float, max_growth: float, closed_loop: bool,
                  slos: Optional[dict] = None, in_step: Optional[bool] = None) -> Optional[dict]:
    """The steady window of a run, and whether the server kept up in it. The window runs while
    load is offered: from the later of the send that follows the first `skip` share of requests
    (the transient of a server filling up) and the first request's end (until then nothing can
    have been served), to the last send. In it: the offered rate (sends a second), the served rate
    (requests ended a second, counted in the window moved later by the median latency), and how
    fast the wait grew: the least-squares slope of each
    request's queue time (its TTFT where a client cannot see the queue) against its send time,
    in seconds of wait per second of run. Sustained: that slope <= max_growth, and served >=
    least_served_share x offered (min_served, less the uncertainty of counting ends at the
    window's edges) unless the slope is not positive at all and nothing failed; a closed loop,
    which sends only when a request ends, is sustained by construction. A window of fewer than
    window_floor requests gets no verdict. `overloaded_on` names the tests failed ("wait",
    "served"), `overloaded_by` says the same with the figures. The metrics are those of the
    measured requests sent inside the window.
    `in_step` (a simulated closed loop: whether its clients can stay in step, see may_stay_in_step)
    adds clients_in_step: they could, and at least half the window's requests were sent at the same
    moment as another."""
    sent = sorted(requests, key=operator.attrgetter("sent_s"))
    ended = [r for r in sent if r.error is None and r.last_token_s is not None]
    if len(sent) < 2 or not ended:
        return None
    t0 = sent[0].sent_s
    start = max(sent[min(len(sent) - 1, math.ceil(skip * len(sent)))].sent_s, min(r.last_token_s for r in ended))
    end = sent[-1].sent_s
    conversations = 0
    if any(getattr(r, "turn", 0) > 1 for r in sent) and not closed_loop:
        # Conversations (turns count from 1): their rate is offered while they start; after the
        # last one starts only their later turns drain, at a rate of their own. Until the first
        # one ends, the turns in flight are all early ones, with short histories. The window is
        # between the two.
        # (A measured run's records do not link their turns: their window starts at the first end.)
        if all(hasattr(r, "next_turn") for r in sent):
            start = max(start, min((r.last_token_s for r in ended if r.next_turn is None and r.turn > 1),
                                   default=start))
        end = max(r.sent_s for r in sent if getattr(r, "turn", 0) <= 1)
        conversations = sum(getattr(r, "turn", 0) == 1 for r in sent)
    window = [r for r in sent if start <= r.sent_s <= end]
    bunched = 1.0 if closed_loop else bunching(r.sent_s for r in window)
    floor = MIN_WINDOW_REQUESTS if closed_loop else window_floor(min_served, bunched)
    if end < start:         # no request ended while load was offered: the run is one burst
        # (An empty window at the first end: one that ended at the last send would end before it began.)
        return {"start_s": start - t0, "end_s": start - t0, "requests": 0, "sustained": None, "one_burst": True,
                "sent": len(sent), "last_sent_s": end - t0, "closed_loop": closed_loop, "conversations": conversations,
                "note": f"{burst_words(len(sent), start - t0, conversations)}: one burst, with no steady window to tell whether the "
                "server keeps up; " + ("send more requests than there are clients for a verdict" if closed_loop else
                                       "send more requests (or repeat the trace), or at a lower rate, for a verdict")}
    # (A window whose sends all fall at its last moment offers nothing in it: one moment too.)
    if len(window) < floor or end == start or all(r.sent_s == end for r in window):
        sent_in = f"{len(window)} request{'s' * (len(window) != 1)} sent in the steady window, " + (
            f"fewer than the {floor} a verdict needs" + (f" (they are sent in bunches at one moment, {bunched:.3g} "
                                                         f"on average)" if bunched > 1 else "")
            if len(window) < floor else "all at one moment")
        return {"start_s": start - t0, "end_s": end - t0, "requests": len(window), "sustained": None,
                "closed_loop": closed_loop, "needs_requests": floor,
                "note": f"{sent_in}: too short a run to tell whether the server keeps up"}
    # Ends are counted in the window moved later by the median request's end-to-end latency, so
    # a request sent at its start is counted where it ends: counted in the window itself, the
    # requests in flight at its two edges would make the served rate swing by their number.
    timed = [(r.sent_s, r.last_token_s - r.sent_s) for r in window if r.error is None and r.last_token_s is not None]
    latencies = sorted(latency for _, latency in timed)
    lag = latencies[len(latencies) // 2] if latencies else 0.0
    # Sends are counted as ends are, in a half-open window: those at its end belong to the next
    # (with one send at a time, the window's sends less one). A trace's requests come in bunches
    # sent at one moment, and the bunch at the end would count whole as offered while only those
    # of its requests faster than the median could end inside the counted window: at 16 replicas
    # on a conversation trace that read as 89% served where the wait did not grow.
    offered = sum(1 for r in window if r.sent_s < end) / (end - start)
    served = sum(1 for r in ended if start + lag <= r.last_token_s < end + lag) / (end - start)

    def wait(r) -> float:       # its TTFT where a client cannot see the queue
        return r.queue_s if r.queue_s is not None else r.first_token_s - r.sent_s
    waits = [(r.sent_s, wait(r)) for r in window if r.error is None and r.first_token_s is not None]
    growth = slope(waits)
    # A request whose latency differs from the trend by d lands on the other side of an edge if it
    # was sent within d of it: about offered x (mean |latency - trend|) requests can cross each edge,
    # either way, so the count of ends is off by a sum of that many +-1s, whose spread over the two
    # edges is sqrt(2 x offered x mean |latency - trend|). Two such spreads (as a share of the
    # window's requests, at most 1 - min_served) come off the share to be served: a shortfall
    # within them is the noise of counting ends, not a server falling behind. (The trend, not the
    # median: latencies that grow with a queue move every end alike, and the ends then come at the
    # rate served.) So is a shortfall while the wait does not grow at all: what is offered and not
    # served must queue.
    spread = math.sqrt(2 * offered * mean_residual(timed) * bunched)
    least = min_served - min(1 - min_served, 2 * spread / len(window))
    # (Failed requests are not served, whatever the wait does: they are no queue to show it.)
    failed = sum(1 for r in window if r.error is not None)
    tests = ["wait"] if growth > max_growth else []
    # The ends counted reach past the last send, into the drain: running batches finishing
    # without new prefills, faster than the server kept up while load was offered. That steadies
    # the count: one stopped at the last send reads the ordinary swings of a queue near capacity
    # as a shortfall (in trials it called Poisson runs below capacity overloaded that runs 50
    # times longer call sustained). But as the rate of a server that fell behind, the drain can read
    # above what was offered, and a short window's count can catch a lull between bunches of
    # ends. Where the wait grows past its bound, offered / (1 + g) of the requests that did not
    # fail is what the server served, if the count is not lower still (a queue the wait does not
    # see, such as a disaggregated decode's, grows too): that is the figure reported and judged.
    # (A closed loop's is a count as any other: it is sustained by construction.)
    # A wait growing more slowly than max_growth still grows: over a long enough window it adds
    # more to every request than the request's own time in service (end to end, less its wait),
    # and its latencies are then the run's length speaking (at 38 req/s on the default H100, 12,501
    # requests: 0.049 s per s over 263 s, 12.9 s of queue on 7 s in service, TTFT p95 13.7 s where
    # 1,251 requests had 0.7 s). Only a growth past the wait's own swings about its trend counts: a
    # slope drawn through noise is none (a client that cannot see the queue sees 1-token outputs
    # served in 0 s, and any slope at all would pass that).
    done = [r for r in window if r.error is None and r.last_token_s is not None and r.first_token_s is not None]
    services = sorted(r.last_token_s - r.sent_s - wait(r) for r in done)
    service = services[len(services) // 2] if services else 0.0
    lives = sorted(r.last_token_s - r.first_token_s for r in done)
    life = lives[len(lives) // 2] if lives else 0.0
    grown = growth * (end - start)
    if not tests and grown > service and grown > 2 * mean_residual(waits):
        tests.append("wait")
    unfailed = offered * (1 - failed / len(window))
    if tests and not closed_loop:
        served = min(served, unfailed / (1 + growth))
    # A shortfall beyond what the edges could ever excuse is one whatever the wait does.
    if served < least * offered and (growth > 0 or failed or served < (2 * min_served - 1) * offered):
        tests.append("served")
    sustained = closed_loop or not tests
    # Too short a window can pass a server that cannot keep up, never fail one that can: what it
    # gives is a shortfall or a growing wait, which a longer window would only make plainer.
    if sustained and not closed_loop and end - start < WINDOW_LIFETIMES * life:
        return {"start_s": start - t0, "end_s": end - t0, "requests": len(window), "sustained": None,
                "closed_loop": False, "lifetime_s": life,
                "note": f"a steady window of {end - start:,.3g} s, shorter than {WINDOW_LIFETIMES} request lifetimes "
                        f"({life:,.3g} s each, the median from first token to last): too short a run to tell "
                        f"whether the server keeps up"}
    why = [] if sustained else [
        *([f"wait grows {growth:.3g} s per s > {max_growth:g}" if growth > max_growth else
           f"wait grows {growth:.3g} s per s, {grown:,.3g} s over the window > a request's {service:,.3g} s in "
           f"service"] if "wait" in tests else []),
        *([f"served {' < '.join(shares_apart(served / offered, least))} of offered"
           + (f" ({failed:,} of the window's requests failed)" if failed else "")] if "served" in tests else [])]
    measured = [r for r in window if getattr(r, "measured", True)]
    # Its rates are over the window, from its start to the last of its requests' ends (a window
    # whose requests were all sent at its end served them over the whole of it, not in their span).
    metrics = summarize(measured, None, slos, start)
    keep = ("completed", "failed", "output_throughput", "request_throughput", "request_goodput",
            *(f"{stat}_{m}_ms" for m in ("ttft", "tpot", "e2el", "ttfa", "queue")
              for stat in ("mean", "median", "p90", "p95", "p99")))
    together = {}
    if in_step is not None:
        sends = Counter(r.sent_s for r in window)
        together["clients_in_step"] = in_step and sum(n for n in sends.values() if n > 1) >= 0.5 * len(window)
    # A wait growing g seconds a second means the server serves offered / (1 + g) a second of the
    # requests that do not fail: the queue grows by the difference (by what was not served, where
    # that is less).
    queue = unfailed - served if tests and not closed_loop else \
        unfailed * growth / (1 + growth) if growth > -1 else -unfailed
    return {"start_s": start - t0, "end_s": end - t0, "requests": len(window), "offered_rate": offered,
            "served_rate": served, "queue_growth_rps": queue, "lifetime_s": life,
            "wait_growth_s_per_s": growth, "least_served_share": least, "sustained": sustained,
            "closed_loop": closed_loop, **({"overloaded_by": why, "overloaded_on": tests} if why else {}), **together,
            **{k: metrics[k] for k in keep if k in metrics}}


def shares_apart(*shares: float) -> list[str]:
    """Shares as percents with as many decimals (1 to 4) as it takes for unequal ones to read
    unequal: 'served 90.9% < 90.9%' says nothing."""
    for digits in range(1, 5):
        texts = [f"{share:.{digits}%}" for share in shares]
        if len(set(texts)) == len(set(shares)):
            break
    return texts


def burst_words(sent: int, first_end_s: float, conversations: int = 0) -> str:
    """A run sent whole before its first request ended (or, of conversations, begun before the
    first one ended): the start of its note, and of a probe's miss."""
    if conversations:
        return f"all {conversations:,} conversations started before the first one ended ({first_end_s:,.1f} s in)"
    return f"all {sent:,} requests were sent before the first one ended ({first_end_s:,.1f} s in)"


def too_short_in(seeds: int, of: Optional[int] = None, bursts: int = 0) -> str:
    """How many seeds were too short for a verdict, as a report's lines say it, and how many of
    them were one burst (as a table's cell says it)."""
    return f"too short to tell in {seeds}" + (f" of {of} seeds" if of else "") \
        + ((" (all one burst)" if bursts >= seeds else f" ({bursts} of them one burst)") if bursts else "")


def overload_reason(steady: dict) -> str:
    """Which of the sustained rule's tests a window failed (a merged report of several seeds: how
    many seeds failed)."""
    return "; ".join(steady.get("overloaded_by") or ["its verdict's reasons were not kept"])


class CertainMiss:
    """Whether a run, partway, already misses an SLO whatever the rest of it does: search's long
    probes stop there (a recheck that misses does so a quarter of the way in, as a rule: its queue
    grows from the start). Only what cannot change is counted. A request's latencies are final once
    it has ended; the steady window (see steady_window) starts no earlier than the send after the
    first `skip` share and the first end seen so far, and holds at most the measured requests sent
    from the first of those to the last send. A nearest-rank percentile over n samples exceeds its
    bound once more than n - ceil(p n / 100) of them do, and that count only grows with n: so a
    count of ended requests over the bound past the most the whole window could allow is a miss
    for certain; so is a failed request in it. Means can still move either way: never stopped on.
    For an open loop without conversations, whose sends are all known from the start."""

    def __init__(self, slo: "Slo", requests: list, dones: list[list], skip: float, thinking: bool):
        sends = sorted(r.sent_s for r in requests)
        self.floor, self.last = sends[min(len(sends) - 1, math.ceil(skip * len(sends)))], sends[-1]
        window = sum(1 for r in requests if self.floor <= r.sent_s and getattr(r, "measured", True))
        self.bounds = []            # (name, value of a request in ms, bound in ms, most allowed over it)
        for name, _, ms in slo.bounds:
            metric, _, stat = name.partition("_")
            metric = "ttft" if metric == "ttfa" and not thinking else metric
            if metric in REQUEST_MS and stat != "mean":     # (a figure equal to its bound is within it)
                p = 50 if stat == "p50" else int(stat[1:])
                self.bounds.append((name, REQUEST_MS[metric], ms, window - math.ceil(p * window / 100)))
        self.over = [0] * len(self.bounds)
        self.dones, self.seen, self.window = dones, [0] * len(dones), window
        self.first_end = math.inf
        self.missed: Optional[str] = None       # the bound missed, once one is

    def __call__(self) -> Optional[str]:
        """Why the run misses for certain, from what has ended since the last call; None if it may not."""
        fresh = []
        for i, done in enumerate(self.dones):
            fresh += done[self.seen[i]:]
            self.seen[i] = len(done)
        self.first_end = min([self.first_end] + [r.last_token_s for r in fresh if r.error is None])
        start = max(self.floor, self.first_end)
        for r in fresh:
            if not start <= r.sent_s <= self.last or not getattr(r, "measured", True):
                continue
            if r.error is not None:
                return f"a request in the steady window failed ({r.error})"
            for i, (name, value, bound, allowed) in enumerate(self.bounds):
                ms = value(r)
                self.over[i] += ms is not None and ms > bound
                if self.over[i] > allowed:
                    self.missed = name
                    return (f"{name} > {bound:g} for certain: {self.over[i]:,} of the steady window's "
                            f"requests ({self.window:,} at most) are over it already, more than the {allowed:,} it "
                            f"allows")
        return None


def may_stay_in_step(spec: RunSpec) -> bool:
    """Whether a simulated closed loop's clients can stay in step. With fixed lengths and no timing
    noise, requests that end in one step are sent again together and prefilled together, round
    after round, where a real run's clients drift apart: two clients or more, fixed lengths."""
    fixed = spec.prompt_tokens.low == spec.prompt_tokens.high and spec.output_tokens.low == spec.output_tokens.high
    return (spec.clients() or 0) >= 2 and not spec.trace and fixed


def by_turn(requests: list) -> list[dict]:
    """TTFT and prefix hits per conversation turn: later turns carry more history to reuse."""
    rows = []
    for turn in sorted({r.turn for r in requests}):
        these = [r for r in requests if r.turn == turn]
        ok = [r for r in these if r.error is None and r.first_token_s is not None]
        ttft = distribution([(r.first_token_s - r.sent_s) * 1000 for r in ok])
        prompt = sum(r.prompt_tokens for r in ok)
        rows.append({"turn": turn, "requests": len(these), "failed": len(these) - len(ok),
                     "mean_prompt_tokens": prompt / len(ok) if ok else None,
                     "median_ttft_ms": ttft["p50"], "p95_ttft_ms": ttft["p95"],
                     "prefix_hit_rate": sum(r.cached_tokens for r in ok) / prompt if prompt else 0.0})
    return rows


def deployment_price(spec: RunSpec, hardware: list[Hardware], gpus_per_engine: int) -> Optional[float]:
    """USD an hour for every GPU the run uses, or None when a device has no price."""
    prices = [spec.price_per_hour or h.price_per_hour for h in hardware]
    return sum(prices) * gpus_per_engine if all(prices) else None


def cost_report(usd_per_hour: Optional[float], output_throughput: float, hours_per_month: float = HOURS_PER_MONTH) -> Optional[dict]:
    """What an hour and a month cost, and a million output tokens at the run's output throughput."""
    if usd_per_hour is None:
        return None
    per_million = usd_per_hour / (output_throughput * 3600) * 1e6 if output_throughput > 0 else None
    return {"usd_per_hour": usd_per_hour, "usd_per_month": usd_per_hour * hours_per_month,
            "hours_per_month": hours_per_month, "usd_per_million_output_tokens": per_million}


TIMELINE_COLUMNS = ("t", "prompt_throughput", "gen_throughput", "running", "waiting", "kv_cache_pct")


def timeline_rows(snapshots: list[dict], requests: list, start: float, duration: float) -> list[dict]:
    """One row per second from the second the run starts in (a trace's first arrival may come
    long after 0, and its seconds count from there), as vLLM's logged stats: prompt tokens
    credited when a request's first token comes out (vLLM counts the whole prompt then), generated
    tokens when they do, and the running, waiting and KV figures of the last step to end in that
    second (replicas: running and waiting summed, KV use averaged). `snapshots` are the engines'
    timelines, by the second of the run's clock; the tokens after a request's first are counted by
    its engine, the first ones here."""
    offset = math.floor(start)
    seconds = max(1, math.ceil(start + duration) - offset)
    prompt, first = Counter(), Counter()
    for r in requests:
        if r.error is None and r.first_token_s is not None:
            second = max(offset + 1, math.ceil(r.first_token_s))
            prompt[second] += r.prompt_tokens
            first[second] += 1
    rows, states, sampled = [], [(0, 0, 0.0, 0)] * len(snapshots), 0
    for t in range(offset + 1, offset + seconds + 1):
        states = [snapshot.get(t, state) for snapshot, state in zip(snapshots, states)]
        generated, sampled = first[t] + sum(s[3] for s in states) - sampled, sum(s[3] for s in states)
        rows.append({"t": float(t - offset), "prompt_throughput": float(prompt[t]), "gen_throughput": float(generated),
                     "running": sum(s[0] for s in states), "waiting": sum(s[1] for s in states),
                     "kv_cache_pct": round(100 * sum(s[2] for s in states) / len(states), 2)})
    return rows


def sweep_point(spec: RunSpec, settings: dict) -> RunSpec:
    """The spec of one sweep point: each RunSpec field in `settings` set to its value."""
    for name, value in settings.items():
        if name == "compare":
            batching, kv_layout = COMPARE_MODES[value]
            spec = replace(spec, batching=batching, kv_layout=kv_layout)
        elif name == "kv_link_gbs":
            spec = replace(spec, disaggregate=value != "colocated", kv_link_gbs=25.0 if value == "colocated" else value)
        elif name == "max_tokens_in_flight":
            spec = replace(spec, max_tokens_in_flight=value or None)     # 0 is no cap
        elif name != "trace":
            spec = replace(spec, **{name: value})
    if spec.engine and settings:      # an engine's defaults follow the point's device, length and group
        spec = engine_defaults(spec, set(spec.given) | set(settings))
    return spec


def run_point(spec: RunSpec, settings: dict, progress: Optional[Callable[[str], None]] = None, seeds: int = 1,
              mapper: Callable = map) -> dict:
    """One point's result (the mean of `seeds` runs); a point whose model does not fit is a
    result saying so, so a sweep over deployments shows which ones are too small instead of
    stopping at the first."""
    point = shown_settings(settings)
    try:
        result = run_seeds(sweep_point(spec, settings), seeds, progress, mapper)
    except CapacityError as e:
        return {"config": {"model": spec.model.name, "sweep_point": point}, "does_not_fit": str(e)}
    result["config"]["sweep_point"] = point
    if len(settings) == 1:
        (axis, value), = settings.items()
        result["config"]["sweep_axis"], result["config"]["sweep_value"] = axis, getattr(value, "name", value)
    return result


def quiet_worker(of_points: bool = False) -> None:
    """Workers leave Ctrl-C (which a terminal sends to each process of the group) to the parent,
    which stops them. A worker of points (`of_points`) cuts the point in hand short on the
    parent's stop request (STOP_SIGNAL) and on SIGTERM (which `timeout` sends the whole group):
    see stoppable(); any other dies of SIGTERM. A worker whose parent is gone (killed outright)
    ends itself. The parent blocked these signals while it forked (see PointRunner): they are
    let in once their handlers are set."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, stop_worker if of_points else signal.SIG_DFL)
    if STOP_SIGNAL is not None and of_points:
        signal.signal(STOP_SIGNAL, stop_worker)
    threading.Thread(target=outlive_no_parent, args=(os.getppid(),), daemon=True).start()
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, BLOCKED_WHILE_FORKING)


def outlive_no_parent(parent: int) -> None:
    """A worker's watch: its parent killed outright (kill -9) leaves it waiting for work forever."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


# A parallel search's workers each hold a deployment part way through when a signal reaches the
# parent; killed, they would take its ended probes with them. So the parent first sends them
# STOP_SIGNAL: a worker cuts its point short as Ctrl-C cuts a point run in the parent (a search
# keeps its ended probes), returns that, and starts no other; then the parent kills them.
STOP_SIGNAL = getattr(signal, "SIGUSR1", None)     # None where there is none: the workers are killed
STOP_WAIT_S = 10.0       # how long the parent waits for its workers' cut points before killing them
worker_state = {"busy": False, "stopping": False}
BLOCKED_WHILE_FORKING = {signal.SIGINT, signal.SIGTERM} | ({STOP_SIGNAL} if STOP_SIGNAL else set())
POOLS: set = set()       # the process pools alive now: a third Ctrl-C kills their workers as it quits


def pool(jobs: int, of_points: bool = False) -> concurrent.futures.ProcessPoolExecutor:
    """A pool of `jobs` worker processes (see quiet_worker), registered in POOLS until
    kill_pool(). Its workers fork at the first submit(): do that inside forking()."""
    executor = concurrent.futures.ProcessPoolExecutor(jobs, initializer=quiet_worker, initargs=(of_points,))
    POOLS.add(executor)
    return executor


@contextlib.contextmanager
def forking():
    """Ctrl-C and SIGTERM held back while worker processes fork: a signal in between would reach a
    child before its handlers are set (a traceback, or a worker left behind) or the parent half
    way through starting them. Let in afterwards, they are raised here."""
    if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, BLOCKED_WHILE_FORKING)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def signal_workers(executor, signum: int) -> None:
    """Send each of a pool's live worker processes a signal (a worker already gone is skipped)."""
    for process in list((getattr(executor, "_processes", None) or {}).values()):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            os.kill(process.pid, signum)


def kill_pool(executor) -> None:
    """Stop a pool's workers now (whatever they are doing) and wait for them to go."""
    signal_workers(executor, signal.SIGKILL)
    executor.shutdown(wait=True, cancel_futures=True)
    POOLS.discard(executor)


def stop_worker(signum, frame) -> None:
    worker_state["stopping"] = True
    if worker_state["busy"]:       # raised once, inside the point only (never in the pool's own code)
        worker_state["busy"] = False
        raise KeyboardInterrupt


@dataclass
class Cut:
    """A point a worker was stopped in: what it kept (`partial`, a search's ended probes), or None."""
    partial: Optional[dict] = None


def stoppable(task: Callable, settings: dict):
    """task(settings) in a worker, or the Cut it was stopped at (a worker stopped starts nothing)."""
    if worker_state["stopping"]:
        return Cut()
    done = None
    worker_state["busy"] = True
    try:
        done = task(settings)
    except KeyboardInterrupt as e:
        return done if done is not None else Cut(getattr(e, "partial", None))
    finally:
        worker_state["busy"] = False
    return done


class WorkerDied(CapacityError):
    """A worker process of a parallel sweep or search died (the out-of-memory killer, a kill)."""


def point_label(settings: dict) -> str:
    return " ".join(f"{k.replace('_', '-')} {value_label(k, v)}" for k, v in settings.items())


@contextlib.contextmanager
def refused_at(point: dict, several: bool) -> Iterator[None]:
    """Where a grid's point is built to be checked before anything runs: one that does not fit
    is left to its run (a row saying so), and a bad combination is refused naming the point."""
    try:
        with contextlib.suppress(CapacityError):
            yield
    except UserError as e:
        if several and point:
            raise UserError(f"at {point_label(point)}: {e}") from None
        raise


class PointRunner:
    """task(settings, progress) for each point, yielded in the order of `points` as soon as it and
    those before it are done. With jobs > 1 the points run in that many processes (without
    progress lines); the results are the same. A worker that dies is WorkerDied, not a wait
    forever. However the iteration ends (done, a dead worker, Ctrl-C), the workers are stopped;
    finished() then gives the points that did finish but were not yielded, having waited behind
    an unfinished one, and those a stop cut short that kept something (the `partial` a task
    attaches to the exception that stopped it: a search's ended probes)."""

    def __init__(self, task: Callable, points: list[dict], jobs: int = 1,
                 progress: Optional[Callable[[str], None]] = None, spread: bool = False, noun: str = "point"):
        self.task, self.points, self.progress, self.noun = task, points, progress, noun
        self.executor, self.futures, self.next, self.rest, self.cut = None, [], 0, None, []
        # spread: the points run here, one after another, each spreading its own seeds over the
        # processes (the task takes a `mapper`); else the points themselves are spread.
        self.seeds = pool(jobs) if spread and jobs > 1 else None
        try:
            with forking():
                if self.seeds:      # started now, not at a first map() that a signal could cut short
                    list(self.seeds.map(abs, range(jobs)))
                if jobs > 1 and len(points) > 1 and not self.seeds:
                    self.workers = min(jobs, len(points))
                    self.executor = pool(self.workers, of_points=True)
                    self.futures = [self.executor.submit(stoppable, task, settings) for settings in points]
        except BaseException:       # a signal let in as the forking ends: nothing is left running
            self.finished()
            raise

    def __iter__(self) -> Iterator[dict]:
        try:
            while self.next < len(self.points):
                yield self.result(self.points[self.next])
        finally:
            self.finished()

    def result(self, settings: dict) -> dict:
        """The next point's result (run here, or waited for)."""
        try:
            if self.executor is None:
                label = point_label(settings)
                point = (lambda text: self.progress(f"{label}: {text}" if label else text)) if self.progress else None
                result = self.task(settings, point, **({"mapper": self.seeds.map} if self.seeds else {}))
            else:
                result = self.waited(self.futures[self.next])
        except BaseException as e:
            if getattr(e, "partial", None) is not None:      # what the point ended, whatever stopped it
                self.cut = [(self.next, e.partial)]
            if isinstance(e, concurrent.futures.BrokenExecutor):
                raise self.died() from None
            raise
        if isinstance(result, Cut):     # a stop sent by someone else than this process
            raise self.died("was stopped by a signal")
        self.next += 1
        return result

    def waited(self, future) -> dict:
        """The point's result from its worker; while it runs, a line now and then of how many
        are done (the workers print nothing themselves)."""
        while self.progress:
            try:
                return future.result(timeout=HEARTBEAT_S)
            except concurrent.futures.TimeoutError:
                done = sum(f.done() for f in self.futures)
                self.progress(f"{done:,} of {len(self.points):,} {self.noun}s done, {self.workers} at a time; "
                              f"waiting for {point_label(self.points[self.next]) or 'the next'}")
        return future.result()

    def died(self, how: str = "died (killed, perhaps by the out-of-memory killer)") -> WorkerDied:
        lost = [point_label(p) for i, (p, f) in enumerate(zip(self.points, self.futures))
                if i >= self.next and not (self.succeeded(f) and not isinstance(f.result(), Cut))] \
            or [point_label(p) for p in self.points[self.next:]]
        nouns = f"{self.noun}{'s' * (len(self.points) != 1)}"
        first = f", the first {lost[0]}" if lost[0] and len(self.points) > 1 else ""
        return WorkerDied(f"a worker process {how} before {len(lost):,} of {len(self.points):,} {nouns} finished"
                          f"{first}; the output holds what had finished")

    @staticmethod
    def succeeded(future) -> bool:
        return future.done() and not future.cancelled() and future.exception() is None

    def finished(self) -> list[tuple[int, dict]]:
        """(index, result) of the points after the last one yielded that finished anyway, or were
        cut short keeping something; the workers stop."""
        if self.rest is None:
            self.stop_workers()
            rest = [(i, f.result()) for i, f in enumerate(self.futures) if i >= self.next and self.succeeded(f)]
            self.rest = sorted(self.cut + [(i, r.partial if isinstance(r, Cut) else r) for i, r in rest
                                           if not isinstance(r, Cut) or r.partial is not None], key=lambda x: x[0])
            for executor in (self.executor, self.seeds):
                if executor is not None:
                    kill_pool(executor)
            self.executor = self.seeds = None
        return self.rest

    def stop_workers(self) -> None:
        """Ask the workers still running a point to cut it short, and wait (a while) for what they kept."""
        pending = [f for f in self.futures[self.next:] if not f.done()]
        if not pending or STOP_SIGNAL is None:
            return
        running = [f for f in pending if not f.cancel()]        # (cancel() takes back those no worker has taken)
        if not running:
            return
        if self.progress:      # (the pool hands a worker its next point early: at most one a worker runs)
            busy = min(len(running), self.workers)
            # (what they keep, if anything, the last line says)
            self.progress(f"stopping the {busy} running {self.noun}{'s' * (busy != 1)}")
        signal_workers(self.executor, STOP_SIGNAL)
        concurrent.futures.wait(running, timeout=STOP_WAIT_S)


def map_points(task: Callable, points: list[dict], jobs: int = 1,
               progress: Optional[Callable[[str], None]] = None, spread: bool = False,
               noun: str = "point") -> PointRunner:
    """Each point's task(settings, progress), in order (see PointRunner)."""
    return PointRunner(task, points, jobs, progress, spread, noun)


def iter_sweep(spec: RunSpec, points: list[dict], jobs: int = 1,
               progress: Optional[Callable[[str], None]] = None, seeds: int = 1) -> PointRunner:
    """Each point's run_point result, in order, in `jobs` processes spread over the points, or
    over each point's seeds when there are fewer points than jobs."""
    return map_points(functools.partial(run_point, spec, seeds=seeds), points, jobs, progress,
                      spread=seeds > 1 and len(points) < jobs)


def sweep(spec: RunSpec, axis: str, values: list, jobs: int = 1, seeds: int = 1) -> list[dict]:
    """One point per value of one RunSpec field."""
    return list(iter_sweep(spec, [{axis: value} for value in values], jobs, seeds=seeds))


# Search: the highest load a deployment serves within an SLO, and the cheapest deployment that
# serves a given load within it. Every probe is one run(): the same simulate with the same seed.

SLO_METRICS = ("ttft", "tpot", "itl", "e2el", "queue", "ttfa")


def answer_figures(result: dict) -> dict:
    """A result with its time-to-first-answer figures: a run without reasoning has none of its
    own, and there the first answer token is the first token."""
    if "p95_ttfa_ms" in result or "p95_ttft_ms" not in result:
        return result
    return {**result, **{k.replace("_ttft_", "_ttfa_"): v for k, v in result.items() if "_ttft_" in k}}
SLO_STATS = {"mean": "mean", "p50": "median", "p90": "p90", "p95": "p95", "p99": "p99"}


def over(value: Optional[float], bound: float) -> str:
    """A figure above its bound, in enough decimals to show it is (25.03 > 25, not 25.0 > 25)."""
    digits = 1
    while value is not None and digits < 6 and round(value, digits) <= bound:
        digits += 1
    return number(value, digits)


@dataclass(frozen=True)
class Slo:
    bounds: tuple       # ((name, result key, ms), ...), e.g. ("ttft_p95", "p95_ttft_ms", 500.0)

    def misses(self, result: dict) -> list[str]:
        """The bounds a run misses, each as 'ttft_p95 612.3 > 500'; a failed request misses too."""
        result = answer_figures(result)
        missed = [f"{name} {over(result[key], bound)} > {bound:g}" for name, key, bound in self.bounds
                  if result[key] is None or result[key] > bound]
        if result["failed"]:
            why = first_failure(result)
            missed.append(f"{result['failed']:,} request{'s' * (result['failed'] != 1)} failed"
                          + (f" ({why})" if why else ""))
        return missed

    def text(self) -> str:
        return ", ".join(f"{name} <= {bound:g} ms" for name, _, bound in self.bounds)


def parse_slo(text: str) -> Slo:
    bounds = []
    grouped = re.search(r":\d{1,3}(,\d{3})+(?![\d.])", text)
    if grouped:                  # 2,000: a comma separates the bounds here, so it reads as two items
        raise UserError(f"--slo {text!r}: {grouped.group()[1:]!r} reads as two items here (a comma separates the "
                        f"bounds): write {grouped.group()[1:].replace(',', '')}")
    for item in text.split(","):
        if not item.strip():
            raise UserError(f"--slo {text!r}: " + ("an empty item" if text.strip() else "no bound") +
                            "; write the bounds comma-separated, like ttft_p95:500,tpot_p95:50")
        name, colon, value = item.strip().partition(":")
        unit = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(m?s)\s*", value)
        if unit and float(unit.group(1)) > 0:
            meant = float(unit.group(1)) * (1 if unit.group(2) == "ms" else 1000)
            raise UserError(f"--slo {item.strip()!r}: a bound is a number of milliseconds, without a unit: write "
                            f"{name}:{meant:g}")
        metric, _, stat = name.partition("_")
        try:
            bound = float(value)
        except ValueError:
            bound = math.nan
        if metric in SLO_METRICS and stat in SLO_STATS and colon and math.isfinite(bound) and not 0 < bound < 1e10:
            raise UserError(f"--slo {item.strip()!r}: the bound is milliseconds above 0 and below 10^10, "
                            f"got {value.strip()}")
        if metric not in SLO_METRICS or stat not in SLO_STATS or not colon or not 0 < bound < 1e10:
            raise UserError(f"--slo {item.strip()!r}: expected METRIC_STAT:MS, METRIC one of {', '.join(SLO_METRICS)}, "
                            f"STAT one of {', '.join(SLO_STATS)}, e.g. ttft_p95:500,tpot_p95:50")
        if any(name == seen for seen, _, _ in bounds):
            raise UserError(f"--slo gives {name} twice; give each bound once")
        if bound < 1:            # no server answers in under a millisecond: seconds written for milliseconds?
            sys.stderr.write(f"servesim: --slo {name}:{value.strip()} is {bound:g} ms (bounds are milliseconds): "
                             f"{bound * 1000:g} ms was meant?\n")
        bounds.append((name, f"{SLO_STATS[stat]}_{metric}_ms", bound))
    return Slo(tuple(bounds))


def tidy(x: float, within: float) -> float:
    """x in as few significant digits as keep it within `within` of itself: a load a rerun
    command shows. Seventeen digits are x itself."""
    return next((t for t in (float(f"{x:.{d}g}") for d in range(1, 17)) if abs(t - x) <= within), x)


def highest_passing(passes: Callable[[float], bool], start: float, tolerance: float, integer: bool = False,
                    lowest: float = 1e-3, highest: float = 1e6,
                    guess: Optional[Callable[[Optional[float], float], Optional[float]]] = None,
                    factor: float = 2.0, reach: bool = False) -> tuple[Optional[float], Optional[float]]:
    """(the highest load found to pass, the lowest found to fail). Double (or halve) from `start`
    until the answer changes, then narrow the bracket until the two are within `tolerance` of
    each other (relative; whole numbers also stop 1 apart). A `factor` under 2 steps by it,
    twice, then by its square, its fourth power and so on up to 2: a walk that starts with small
    steps (the recheck's) reaches an answer far away in a few more. Every load at or below the first
    passed and every one at or above the second failed; on a curve that is not monotone, that is
    one boundary of several, not necessarily the highest. (None, x): even the lowest load failed;
    (x, None): `highest` passed, or with `reach` False (a recheck's highest is a load known to miss)
    the last doubling under it.

    `guess(low or None, high)`, when given, is where the probes so far say the answer changes.
    A search of real numbers then narrows the bracket there instead of at the middle, and at a
    guess within half the tolerance of either end, at half the tolerance from it: a right guess
    closes the bracket with the next probe, tighter than bisection ends. While halving, a guess
    above half is tried first, once (if it misses, halving goes on below it). Two guesses in a
    row that did not halve the bracket are followed by a bisection, so it halves at least once
    every three probes; the answer means the same either way."""
    guess = None if integer else guess
    up = passes(start)
    low, high = (start, None) if up else (None, start)
    guided, steps, ratio = False, 0, factor
    while True:
        steps += 1
        ratio = min(2.0, ratio * ratio) if steps > 2 else ratio
        x = low * ratio if up else high / ratio
        hint = guess(None, high) if low is None and guess and not guided else None
        guided = hint is not None and math.isfinite(hint) and x < hint and hint * (1 + tolerance) < high
        if guided:
            x = tidy(hint, tolerance * hint / 100)
        if integer:
            x = int(round(x))
        elif factor != 2:      # (halves and doubles of a tidy start are tidy already)
            x = tidy(x, tolerance * x / 100)
        if reach and x > highest and high is None and low is not None and low < highest:
            x = highest        # (the doubling would pass it: the highest itself is tried, once)
        if x > highest or x < lowest or x in (low, high):
            return low, high
        if passes(x):
            low = x
            if high is not None:
                break
        else:
            high = x
            if low is not None:
                break
    slow = 0      # guided probes in a row that did not halve the bracket
    while high - low > (max(1, tolerance * low) if integer else tolerance * low):
        x = (low + high) // 2 if integer else (low + high) / 2
        hint = guess(low, high) if guess and slow < 2 else None
        if hint is not None and math.isfinite(hint):
            # Half the tolerance from an end: a right guess leaves the two that close to each
            # other, where bisection ends anywhere from half the tolerance to all of it.
            up, down = low * (1 + tolerance / 2), high / (1 + tolerance / 2)
            x = min(max(hint, up), down) if up < down else x
        if not integer:
            x = tidy(x, tolerance * low / 100)      # 1% of the tolerance: it stays where it was put
        width = high - low
        if passes(x):
            low = x
        else:
            high = x
        slow = 0 if hint is None or high - low <= width / 2 else slow + 1
    return low, high


def trace_rate(spec: RunSpec) -> float:
    """The mean arrival rate (requests/s over the span of their arrivals) of the requests a run of
    the trace sends: its copies (--trace-repeats), up to --requests."""
    rows = repeated_rows(spec.trace.rows, spec.trace_repeats, spec.requests)[:spec.requests or None]
    arrivals = [row[0] for row in rows]
    span = max(arrivals) - min(arrivals)
    own = [row[0] for row in spec.trace.rows[:len(rows)]]        # (copies are spaced apart whatever they hold)
    if len(rows) < 2 or span <= 0 or max(own) == min(own):
        if spec.requests and len(rows) < len(spec.trace.rows) * spec.trace_repeats:      # cut short by --requests
            which = f"its first {len(rows):,} requests (--requests {spec.requests}) arrive at once, so they have" \
                if len(rows) > 1 else "its first request alone (--requests 1) has"
            raise UserError(f"trace {spec.trace.name}: {which} no rate to scale: give a larger --requests, or drop it")
        raise UserError(f"trace {spec.trace.name}: its requests all arrive at once, so it has no rate to scale")
    return (len(rows) - 1) / span


def at_load(spec: RunSpec, by: str, load: float) -> dict:
    """The settings that put `load` on the spec: a Poisson rate, a trace sped up or slowed down to
    that mean rate, or a number of clients."""
    if by == "concurrency":
        return {"concurrency": int(load), "rate": None}
    if spec.trace:       # rounded as a command line shows it, so a probe's rerun is the probe
        return {"time_scale": float(f"{trace_rate(replace(spec, time_scale=1.0)) / load:.6g}")}
    return {"rate": load, "concurrency": None}


MAX_SEEDS = 1000


@dataclass(frozen=True)
class Probing:
    """How search tries a load. Sustained (the default): each probe sends enough requests for a
    steady window of `steady_requests` (a trace repeated end to end as often as that needs),
    whatever --requests says, and passes only if the server keeps up in that window and the
    window's requests meet the SLO. Otherwise a burst: the trace played once passes if all its
    requests meet the SLO. Each probe runs `seeds` seeds (seed, seed + 1, ...), of which at least
    `confidence` must pass. A sustained highest rate is rechecked with probes `recheck` times as
    long (see search_point)."""
    slo: Slo
    by: str = "rate"
    target: Optional[float] = None
    tolerance: float = 0.05
    sustained: bool = True
    steady_requests: int = 1000
    seeds: int = 1
    confidence: float = 1.0
    guided: bool = True        # narrow where the probes point (False: bisect, as bench compares)
    recheck: int = 10
    rechecks: bool = False     # this is the recheck's probing (rechecking()): its probes are long

    def rechecking(self) -> Optional["Probing"]:
        """The probing that rechecks a sustained highest rate: the same, with a steady window
        `recheck` times as long. None where there is nothing to recheck: a burst, a closed loop
        (sustained by construction), or a recheck of 1."""
        if not self.sustained or self.by != "rate" or self.recheck <= 1:
            return None
        return replace(self, steady_requests=self.steady_requests * self.recheck, recheck=1, rechecks=True)

    @property
    def needed(self) -> int:
        """The seeds of a probe that must pass: the --confidence share of them, rounded up, and at
        least one (a share so small that none need pass would pass any load)."""
        return max(1, math.ceil(self.confidence * self.seeds - 1e-9))

    def stop_on(self) -> Optional[Slo]:
        """The SLO a probe's first seed stops on once it misses it for certain (run's stop_on), or
        None. Only the recheck's long probes stop: they are most of a search's time, and a miss
        costs a quarter of one; a short probe's whole run guides the next (its served rate, its
        margins). Only where one seed's miss settles the probe, and never for a target rate,
        whose figures are the answer."""
        one_miss_settles = self.needed == self.seeds
        return self.slo if self.rechecks and self.target is None and one_miss_settles else None

    def check(self, spec: RunSpec) -> None:
        if self.confidence < 1 and self.seeds == 1:
            raise UserError(f"--confidence {self.confidence:g} is the share of --seeds that must pass, and there is "
                            f"one seed: give --seeds N (say 5), or drop --confidence")
        if self.seeds > 1 and not draws_from_seed(spec):     # N copies of one run would read as N agreeing
            raise UserError(f"--seeds {self.seeds}: every seed of trace {spec.trace.name} replays the same requests "
                            f"at the same times, so the seeds would be copies of one run; drop --seeds")
        floor = MIN_WINDOW_REQUESTS if self.by == "concurrency" else window_floor(spec.min_served)
        # (A trace's bunches keep their moments in a probe, at any rate: its windows need as many more.)
        bunched = bunching(row[0] for row in spec.trace.rows) if spec.trace and self.by == "rate" else 1.0
        least = floor if self.by == "concurrency" else window_floor(spec.min_served, bunched)
        if self.sustained and self.steady_requests < least:
            raise UserError(f"--steady-requests {self.steady_requests:,} is fewer than the {least:,} requests a steady "
                            f"window needs for a verdict at --min-served {spec.min_served:g} " +
                            ("(2 / (1 - min served): one request more or fewer at each edge of the window is then "
                             "within the shortfall allowed" if floor < MAX_WINDOW_FLOOR else
                             f"(2 / (1 - min served), at most {MAX_WINDOW_FLOOR}: no shortfall, or almost none, is "
                             f"allowed") +
                            (f"; times {bunched:.3g}, the mean size of the bunch of requests trace {spec.trace.name} "
                             f"sends at one moment, which cross an edge together)" if bunched > 1 else ")") +
                            f"; give --steady-requests {least:,} or more")
        if self.sustained and spec.warmup >= self.requests(spec):      # (--requests is not what a probe sends)
            raise UserError(f"--warmup {spec.warmup:,} leaves no request to measure in a probe, which sends "
                            f"{self.requests(spec):,} (--steady-requests {self.steady_requests:,} after the first "
                            f"{spec.steady_skip:.0%}): lower --warmup or raise --steady-requests")
        if self.by == "concurrency" and self.target and self.clients_requests(spec, self.target) > MAX_REQUESTS:
            raise UserError(f"--concurrency {self.target:,.0f}: a probe sends each client's first "
                            f"{'conversation' if spec.turns > 1 else 'request'} as well as its window's, "
                            f"{self.clients_requests(spec, self.target):,} requests, more than the {MAX_REQUESTS:,} a run "
                            f"holds; lower --concurrency" + (" or --turns" if spec.turns > 1 else ""))
        longest = self.steady_requests * (self.recheck if self.rechecking() else 1)
        if longest > MAX_REQUESTS // 2:
            raise UserError(f"--steady-requests {self.steady_requests:,} x --recheck {self.recheck} is "
                            f"{longest:,} requests in a recheck's window, more than the {MAX_REQUESTS // 2:,} a run "
                            f"holds there; lower one of them")

    def requests(self, spec: RunSpec) -> int:
        """Requests a sustained probe sends: the steady window's, after the transient it skips."""
        return math.ceil(self.steady_requests / (1 - spec.steady_skip)) + 1

    def clients_requests(self, spec: RunSpec, clients: float) -> int:
        """Requests a closed-loop probe of `clients` sends: each client's first request (or
        conversation, with --turns) goes out at once and no window starts before one ends, so
        those as well as the window's; fewer, and many clients make the run one burst."""
        return math.ceil(clients * spec.turns + self.steady_requests / (1 - spec.steady_skip)) + 1

    def highest(self, spec: RunSpec) -> float:
        """The highest load a search tries: for clients, those whose probe stays within
        MAX_PROBE_GROWTH times the usual length."""
        if self.by != "concurrency":
            return 1e6
        return max(1, (MAX_PROBE_GROWTH * self.requests(spec) - self.clients_requests(spec, 0)) // spec.turns)

    def probe(self, deployment: RunSpec, load: float, count: Optional[int] = None) -> RunSpec:
        if not self.sustained:
            return sweep_point(deployment, at_load(deployment, self.by, load))
        count = count or self.requests(deployment)
        if self.by == "concurrency":
            count = max(count, self.clients_requests(deployment, load))
        if deployment.trace and len(deployment.trace.rows) <= MAX_PROBE_GROWTH * self.requests(deployment):
            count = max(count, len(deployment.trace.rows))      # the whole of a trace, at least once
        return self.sized(deployment, count, load)

    def sized(self, spec: RunSpec, count: int, load: float) -> RunSpec:
        """The run of `count` requests at `load`: a trace repeated end to end as often as they
        take, at its own rate scaled to the load (--requests counts only a burst's requests), or
        a trace too long to play whole, its first `count` rows, at their own rate scaled so (the
        whole trace's rate would have them offer another load than the probe's)."""
        spec = replace(spec, requests=count)
        if spec.trace:
            rows = len(spec.trace.rows)
            spec = replace(spec, trace_repeats=-(-count // rows))
            return sweep_point(spec, at_load(replace(spec, requests=count if count < rows else None, trace_repeats=1),
                                             self.by, load))
        return sweep_point(spec, at_load(spec, self.by, load))

    def longer(self, probe: RunSpec, result: dict, load: float) -> Optional[RunSpec]:
        """The probe again with more requests, when its steady window held fewer than
        steady_requests; None when it held enough (or it is a burst, or a closed loop, whose
        window starts at the skip). The window starts at the first request's end, so the requests
        sent before that are not in it: as many more are sent, and a tenth for the longer run's
        slower first requests. At most MAX_PROBE_GROWTH times the usual length."""
        steady = result.get("steady_state") or {}
        if result.get("stopped"):          # a certain miss: no longer run can be needed to tell
            return None
        held = steady.get("requests") or 0
        # Lengthened a quarter past the lifetimes a window needs: the other seeds' windows, of other
        # lengths, are to hold them too. And to the requests its own verdict needs, where its bunches
        # of requests sent at one moment ask more than the trace's as a whole (its first rows').
        needs = 1.25 * WINDOW_LIFETIMES * (steady.get("lifetime_s") or 0)
        wanted = max(self.steady_requests, steady.get("needs_requests") or 0)
        lasted = (steady.get("end_s") or 0) - (steady.get("start_s") or 0)
        if not self.sustained or self.by != "rate" or steady.get("closed_loop") or \
                (held >= wanted and lasted >= needs):
            return None
        count = math.ceil((probe.requests + wanted - held) * 1.1) if held else 2 * probe.requests
        if 0 < lasted < needs:         # as many requests more as the window needs seconds more
            count = max(count, math.ceil(probe.requests * (1 + (needs - lasted) / lasted)))
        most = min(MAX_PROBE_GROWTH * self.requests(probe), MAX_REQUESTS)
        if probe.requests >= most:
            return None
        return self.sized(probe, min(count, most), load)      # (the longest allowed may be long enough)

    def start(self, deployment: RunSpec) -> float:
        """Where the search starts: a guess at the capacity from the cost model alone, so that the
        doubling and halving take a few probes. A full batch of the mean request (the KV cache or
        --max-num-seqs, whichever binds first) decodes its output, one step after another, and
        each request's prompt is one step of its own; the guess only saves probes, the probes
        decide."""
        if self.by == "concurrency":
            return 1
        rows = deployment.trace.rows if deployment.trace else None
        prompt = sum(r[1] for r in rows) / len(rows) if rows else (deployment.prompt_tokens.low +
                                                                  deployment.prompt_tokens.high) / 2
        output = sum(r[2] for r in rows) / len(rows) if rows else (deployment.output_tokens.low +
                                                                  deployment.output_tokens.high) / 2
        try:
            plan, cost = device_plan(deployment, deployment.hardware)
        except (CapacityError, UserError):
            return 1.0
        batch = max(1, min(deployment.max_num_seqs, plan.kv_tokens // max(1, prompt + output)))
        decode = output * cost.step_seconds(batch, batch * (prompt + output / 2), batch) / batch
        prefill = cost.step_seconds(prompt, prompt, 1, prompt * prompt / 2)
        guess = deployment.data_parallel_size / (decode + prefill)
        return float(f"{guess:.2g}")

    def lowest(self, deployment: RunSpec) -> float:
        """The lowest load a probe may try: its arrivals must fit in a year."""
        if self.by == "concurrency":
            return 1
        count = self.requests(deployment) if self.sustained else \
            len(deployment.trace.rows) if deployment.trace else deployment.requests or DEFAULT_REQUESTS
        return 1.01 * count / MAX_ARRIVAL_S

    def figures(self, result: dict) -> dict:
        """What the SLO is checked on: when sustained, the requests sent in the steady window (its
        latencies and failures; ITL, which needs every token's time, from the whole run)."""
        steady = result.get("steady_state") or {}
        if not self.sustained or steady.get("sustained") is None:
            return answer_figures(result)
        return answer_figures({**result, **{k: v for k, v in steady.items() if k.endswith("_ms") or k == "failed"}})

    def margins(self, runs: list[dict]) -> Optional[list[float]]:
        """Each SLO bound's margin on the worst of the runs (a probe's seeds): log(figure / bound),
        above 0 where the bound is missed; None where a figure is missing. A figure under a
        hundredth of its bound counts as that: a queue of 0 ms says the bound is far, not where."""
        if any(r.get("stopped") for r in runs):       # its figures are of the requests ended by then
            return None
        worst, figures = [], [self.figures(r) for r in runs]
        for _, key, bound in self.slo.bounds:
            values = [f.get(key) for f in figures]
            if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
                return None
            worst.append(math.log(max(max(values), bound / 100) / bound))
        return worst

    def boundary(self, low: Optional[float], below: Optional[list[float]], high: float,
                 above: Optional[list[float]], steady: dict) -> Optional[float]:
        """Where the answer likely changes, from the margins of the probe that passed at the
        highest load, `low` (None: none yet), and the one that missed at the lowest, `high`, and
        the steady window of the second: a server that could not keep up served about all it can,
        so at most its served rate (or what its wait's growth says it served, if less); and where
        the first bound it missed crosses its margin 0, on the straight line between the two
        probes."""
        overloaded = self.sustained and steady.get("sustained") is False
        # Ends counted over a short window can bunch (a batch finishing together) and read above
        # what was offered; a wait growing g s per s says offered / (1 + g) was served.
        growth, offered = steady.get("wait_growth_s_per_s"), steady.get("offered_rate")
        served = [steady.get("served_rate")]
        if isinstance(growth, (int, float)) and growth > 0 and isinstance(offered, (int, float)):
            served.append(offered / (1 + growth))
        served = [x for x in served if isinstance(x, (int, float)) and 0 < x < math.inf]
        guesses = [min(served)] if overloaded and served else []
        if low is not None and below is not None and above is not None:
            guesses += [low + (high - low) * -b / (a - b) for b, a in zip(below, above) if b <= 0 < a]
        return min(guesses, default=None)

    def misses(self, result: dict) -> list[str]:
        """Why a run misses: the SLO's bounds, failed requests, and a server that did not keep up
        (a run stopped early: why it stopped)."""
        if result.get("stopped"):
            return [result["steady_state"]["note"]]
        steady = result.get("steady_state") or {}
        missed = self.slo.misses(self.figures(result))
        if self.sustained and steady.get("sustained") is None:
            if not steady.get("one_burst"):
                missed.append("too short a run to tell whether the server keeps up")
            else:            # (seeds merged say so in their own note)
                missed.append("one burst: " + (steady["note"] if "seeds_count" in steady else
                                               burst_words(steady["sent"], steady["start_s"],
                                                           steady.get("conversations", 0))))
        elif self.sustained and not steady["sustained"]:
            missed.append(f"overloaded: {overload_reason(steady)}: offered {steady['offered_rate']:,.3g} req/s, served "
                          f"{steady['served_rate']:,.3g}, queue grows {steady['queue_growth_rps']:,.3g} req/s")
        return missed


def recheck_step(tolerance: float) -> float:
    """The recheck's first steps down: a hair under the tolerance, so a pass one step below a
    miss ends it."""
    return 1 + 0.98 * tolerance


def undefined_slo(spec: RunSpec, slo: Slo) -> Optional[str]:
    """Why a bound of the SLO cannot be measured on this workload: TPOT and ITL need outputs of
    two tokens or more."""
    longest = max(row[2] for row in spec.trace.rows) if spec.trace else spec.output_tokens.high
    gapped = [name for name, _, _ in slo.bounds if name.split("_")[0] in ("tpot", "itl")]
    if gapped and longest < 2:
        return (f"--slo {gapped[0]}: every request here has a 1-token output, so there is no gap between tokens "
                f"and {gapped[0].split('_')[0].upper()} is undefined; bound ttft or e2el instead")
    return None


def run_seeds(spec: RunSpec, seeds: int = 1, progress: Optional[Callable[[str], None]] = None,
              mapper: Callable = map) -> dict:
    """One run, or `seeds` of them (seed, seed + 1, ...) combined by seeded()."""
    if seeds <= 1:
        return run(spec, progress)
    return seeded(list(mapper(run, [replace(spec, seed=spec.seed + i) for i in range(seeds)])))


def shown_settings(settings: dict) -> dict:
    """A grid point's settings as a report shows them: presets by name."""
    return {k: getattr(v, "name", v) for k, v in settings.items()}


def search_point(spec: RunSpec, settings: dict, progress: Optional[Callable[[str], None]] = None, *,
                 probing: Probing, mapper: Callable = map) -> dict:
    """One deployment: its run at the target load, or its highest load that passes, found by
    highest_passing; for a trace, the highest load of a burst too (the trace played once). Each
    probe's result is kept, with its `load`, its `misses` and how many seeds passed.

    A sustained highest rate is then rechecked with probes probing.recheck times as long, and
    stepped down until one holds: near capacity a queue settles far more slowly than one probe's
    window, and the sustained rule's tolerances (a few percent of the offered rate unserved, a
    wait growing 0.05 s per s) pass a few percent of overload, which a run ten times as long turns
    into an SLO miss (the default search's 38.13 req/s: its 1,251-request probe met TTFT p95 1 s
    and kept up; 12,501 requests at that rate are overloaded, TTFT p95 13.7 s). A target rate is
    probed at the recheck's length from the start. The recheck's probes are kept too, marked
    `recheck`; the answer is theirs."""
    point = shown_settings(settings)
    deployment = sweep_point(spec, settings)
    found = {"settings": point, "by": probing.by}
    kept: dict[bool, list[dict]] = {True: [], False: []}     # each probe as it ends, sustained or a burst

    def searched(how: Probing, start: Optional[float] = None, highest: Optional[float] = None, factor: float = 2.0,
                 count: Optional[int] = None) -> dict:
        probes: list[dict] = []
        margins: dict[float, Optional[list[float]]] = {}     # load -> each bound's, on its worst seed

        def passes(load: float) -> bool:
            need = how.needed

            def settled(runs: list) -> Optional[int]:
                """How many of the seeds, taken in order, settle the verdict, or None. The seeds
                after those are not run, or (run by other processes) are left out: --jobs changes
                nothing."""
                passed = 0
                for i, result in enumerate(runs, 1):
                    passed += not how.misses(result)
                    if passed >= need or i - passed > how.seeds - need:
                        return i
                return None

            try:
                # The first seed sets the probe's length: longer, while its steady window holds
                # fewer requests than asked for (its first requests ended late).
                probe = how.probe(deployment, load, count)
                runs = [run(probe, stop_on=how.stop_on())]
                for _ in range(MAX_LENGTHENINGS):
                    longer = how.longer(probe, runs[0], load)
                    if longer is None:
                        break
                    probe = longer
                    runs = [run(probe, stop_on=how.stop_on())]
                rest = [replace(probe, seed=probe.seed + i) for i in range(1, how.seeds)]
                if mapper is map:
                    for spec_ in rest:
                        if settled(runs):
                            break
                        runs.append(run(spec_))
                elif rest and not settled(runs):
                    runs += mapper(run, rest)
                runs = runs[:settled(runs) or len(runs)]
            except CapacityError as e:
                raise Unfit(str(e)) from None
            rejected = never_served(runs[0])
            if rejected:
                raise Unfit(f"a request no load can serve: {rejected}; raise that limit or leave such requests out")
            margins[load] = how.margins(runs)
            verdicts = [how.misses(r) for r in runs]
            passed = sum(not missed for missed in verdicts)
            result = runs[0] if len(runs) == 1 else seeded(runs)
            enough = passed >= need
            result["load"], result["seeds_passed"], result["seeds_run"] = load, passed, len(runs)
            if how.rechecks:
                result["recheck"] = True
            if how.sustained:
                result["probe_requests"] = probe.requests        # longer than usual if its window fell short
            if enough:
                result["misses"] = []
            elif how.seeds == 1:
                result["misses"] = verdicts[0]
            else:     # the columns are the seeds' mean: say whose figures the reasons are
                seed, missed = next((r["config"]["seed"], m) for r, m in zip(runs, verdicts) if m)
                result["misses"] = [f"seed {seed}: {missed[0]}", *missed[1:],
                                    f"{len(runs) - passed} of {len(runs)} seeds run miss" if len(runs) > 1 else
                                    "the one seed run misses"]
                result["missed_seed"] = seed
            probes.append(result)
            kept[how.sustained].append(result)
            if progress:
                progress(f"{how.by} {load:g}" + (f" ({probe.requests:,} requests)" if how.sustained else "") + ": " +
                         ("meets the slo" if enough else "misses: " + result["misses"][0]))
            if not enough and how.by == "rate" and ran_alone(result) and not any(not p["misses"] for p in probes):
                if how.target is not None:     # one probe, nothing to stop: its caller reads the mark
                    result["alone"] = True
                else:
                    raise Alone()
            if not enough and how.by == "rate" and how.target is None and not how.rechecks \
                    and not any(not p["misses"] for p in probes):
                flat = unmoved_by_load(how, probes, margins)
                if flat:
                    raise Floor(flat)
            return enough

        if how.target is not None:
            passes(how.target)
            return {"probes": probes, "best": probes[0] if not probes[0]["misses"] else None}
        try:
            def guess(low: Optional[float], high: float) -> Optional[float]:
                steady = next(p for p in probes if p["load"] == high).get("steady_state") or {}
                return how.boundary(low, margins.get(low), high, margins[high], steady)

            low, high = highest_passing(passes, start or how.start(deployment), how.tolerance,
                                        integer=how.by == "concurrency", lowest=how.lowest(deployment),
                                        highest=highest or how.highest(deployment),
                                        guess=guess if how.guided else None, factor=factor,
                                        reach=highest is None and how.by == "concurrency")
        except Alone:
            return {"probes": probes, "highest_load": None, "lowest_missing_load": probes[-1]["load"], "best": None,
                    "alone": True}
        except Floor as e:
            return {"probes": probes, "highest_load": None, "lowest_missing_load": probes[-1]["load"], "best": None,
                    "floor": str(e)}
        return {"probes": probes, "highest_load": low, "lowest_missing_load": high,
                "best": next((p for p in probes if p["load"] == low), None)}

    def rechecked(first: dict, how: Probing) -> dict:
        """The first search's answer rechecked with `how`'s longer probes, each at least
        probing.recheck times the probe that passed (which may have been lengthened): from that
        answer, never above its miss, down a tolerance at a time, twice, then faster (a long probe
        costs ten short ones, and the first answer overshoots by a few percent: halving would take
        more), then narrowed as the first was."""
        low, high = first["highest_load"], first["lowest_missing_load"]
        if low is None or first.get("alone"):
            return first
        passed = first["best"].get("probe_requests", 0)
        count = probing.recheck * passed if passed > probing.requests(deployment) else None
        second = searched(how, start=low, highest=high if high is not None else low, factor=recheck_step(how.tolerance),
                          count=count)
        probes = first["probes"] + second["probes"]
        if second.get("alone") or second["highest_load"] is None:
            return {**second, "probes": probes}
        return {"probes": probes, "highest_load": second["highest_load"],
                "lowest_missing_load": second["lowest_missing_load"] or high, "best": second["best"]}

    answered = False
    try:
        longer = probing.rechecking()
        if longer and probing.target is not None:
            found.update(searched(longer))
        else:
            found.update(searched(probing))
            if longer:
                found.update(rechecked(found, longer))
        answered = True
        if deployment.trace and probing.target is None and probing.sustained:
            found["burst"] = searched(replace(probing, sustained=False))
    except Unfit as e:
        return {**found, "probes": found.get("probes", []), "does_not_fit": str(e), "best": None}
    except BaseException as e:
        # Whatever stopped it (a signal, above all), the probes that ended are kept, for a caller
        # to report beside the finished deployments; an answer only if the search that gives it
        # ended (a first answer not yet rechecked is none).
        cut = {"best": None, "highest_load": None, "lowest_missing_load": None, "interrupted": True}
        if not answered:
            e.partial = {**found, **cut, "probes": kept[True]}
        else:             # only a trace's burst search was left, if anything
            e.partial = {**found, "burst": {**cut, "probes": kept[False]}} if deployment.trace and \
                probing.target is None and probing.sustained else found
        raise
    return found


HEARTBEAT_S = 2.0          # how often a command waiting on its workers says how far they are
MAX_LENGTHENINGS = 4       # a probe whose steady window is short is run longer at most this often
MAX_PROBE_GROWTH = 16      # ... and to at most this many times its usual requests


class Unfit(Exception):
    """A deployment whose model does not fit, inside a search (not an error of the whole search)."""


def never_served(result: dict) -> Optional[str]:
    """The first failure of a request the deployment cannot serve at any load. In a simulation
    that is every failure: a request Scheduler.rejection refuses (too long for its context, its
    token budget, a llama.cpp slot or its cache) or one that fits no step even when the engine is
    idle; a conversation's later turns fail only after such a turn."""
    return next((first for kind, first in (result.get("first_error_by_kind") or {}).items()
                 if kind != TURN_FAILED), None)


class Alone(Exception):
    """A probe missed although each of its requests ran alone: no lower rate can meet the SLO."""


class Floor(Exception):
    """Halving the rate left every missed figure where it was: what misses is not the load (a
    trace's bunches, sent at one moment at any rate, or requests that overlap however rare)."""


FLOOR_MOVE = 0.01      # a missed figure that moves less than this when the rate is halved is a floor


def unmoved_by_load(how: "Probing", probes: list[dict], margins: dict) -> str:
    """Why the probe just run ends the halving, or "": it and the one before it (at a higher rate)
    both missed, both kept up, and every bound the last one missed moved by less than FLOOR_MOVE.
    Halving on would go on down to rates whose arrivals span weeks, every probe the same miss."""
    # (only a halving: a recheck's steps of a few percent move a figure near its bound by little)
    if len(probes) < 2 or probes[-2]["load"] < 1.9 * probes[-1]["load"] or not probes[-2]["misses"]:
        return ""
    now, before = margins.get(probes[-1]["load"]), margins.get(probes[-2]["load"])
    kept_up = all((p.get("steady_state") or {}).get("sustained") is not False for p in probes[-2:])
    missed = [i for i, m in enumerate(now or []) if m > 0]
    if not (now and before and kept_up and missed) or any(abs(now[i] - before[i]) >= math.log1p(FLOOR_MOVE)
                                                           for i in missed):
        return ""
    name, key, _ = how.slo.bounds[missed[0]]
    figures = [how.figures(p).get(key) for p in probes[-2:]]
    return (f"halving the rate left {name} where it was ({number(figures[0])} at {probes[-2]['load']:.4g}, "
            f"{number(figures[1])} at {probes[-1]['load']:.4g}): what misses it is not the load (requests sent "
            f"together, or each request's own time in service), so no lower rate meets it")


def ran_alone(result: dict) -> bool:
    if result.get("stopped"):     # what ran by then does not say
        return False
    engine = result.get("engine") or {}
    return engine.get("mean_batch", 2.0) <= 1.001 and not result.get("p99_queue_ms")   # 0.1% of steps shared, no wait


def search_points(spec: RunSpec, points: list[dict], probing: Probing, jobs: int = 1,
                  progress: Optional[Callable[[str], None]] = None) -> PointRunner:
    """search_point for each deployment, in order; with `jobs` processes spread over the
    deployments, or over each probe's seeds when there are fewer deployments than jobs. The
    results are the same either way."""
    return map_points(functools.partial(search_point, spec, probing=probing), points, jobs, progress,
                      spread=probing.seeds > 1 and len(points) < jobs, noun="deployment")


# Plan: replicas window by window over a day of traffic. Each window's load (a rate profile's mean,
# or a trace's arrivals counted) gets the fewest replicas whose sustained probe at that load meets
# the SLO; the needs become a schedule an autoscaler could follow (replicas asked for at a
# window's start serve after the scale-up delay; fewer are asked for only once the need has stayed
# lower for scale_down_after, as Kubernetes' HPA stabilises a scale-down, 300 s by default); the
# schedule is priced against a fleet sized for the peak, and the whole period is simulated with it.

@dataclass(frozen=True)
class Scaling:
    window_s: float = 900.0
    min_replicas: int = 1
    max_replicas: int = 16
    scale_down_after: float = 300.0
    ahead: bool = False        # ask for each window's replicas the scale-up delay before it starts
    scale_up_delay: Optional[float] = None     # None: an engine's start-up and its weights' load


MAX_WINDOWS = 100_000      # a plan's windows, at most: a year of 15-minute ones is 35,040


def window_edges(end: float, window_s: float) -> list[float]:
    """Where a period of `end` s is cut into windows of window_s (the last one short)."""
    count = math.ceil(end / window_s - 1e-9)
    if count > MAX_WINDOWS:
        raise UserError(f"--window {window_s:g} s cuts the {end:,.0f}-s period into {count:,} windows, more than the "
                        f"{MAX_WINDOWS:,} a plan takes; give --window {math.ceil(end / MAX_WINDOWS):,} or more")
    return [i * window_s for i in range(count)] + [end]


def plan_windows(spec: RunSpec, window_s: float) -> list[tuple[float, float, float]]:
    """(start s, end s, requests per second) of each window of the profile or the trace."""
    if spec.rate_profile:
        p, x = spec.rate_profile, spec.time_scale
        end = p.end_s * x
        edges = window_edges(end, window_s)
        return [(a, b, p.mean_rate(a / x, b / x) / x) for a, b in zip(edges, edges[1:])]
    if not spec.trace:
        raise UserError("plan follows load that changes: give --rate-profile FILE or --trace FILE")
    sends = sorted(row[0] * spec.time_scale for row in repeated_rows(spec.trace.rows, spec.trace_repeats))
    # The trace ends a mean gap after its last send, not at a whole window: an 84 s trace counted
    # over 15 minutes would be planned at a tenth of its load (and so would a last partial window).
    end = sends[-1] + ((sends[-1] - sends[0]) / (len(sends) - 1) if len(sends) > 1 and sends[-1] > sends[0] else 1.0)
    edges = window_edges(end, window_s)
    if len(edges) > 2 and end - edges[-2] < window_s / 4:
        del edges[-2]       # a sliver past the last whole window joins it, rather than be planned on a few requests
    counts = Counter(min(bisect.bisect_right(edges, t) - 1, len(edges) - 2) for t in sends)
    return [(a, b, counts[i] / (b - a)) for i, (a, b) in enumerate(zip(edges, edges[1:]))]


def replicas_needed(spec: RunSpec, load: float, probing: Probing, scaling: Scaling, cache: dict,
                    guess: int) -> tuple[int, Optional[dict]]:
    """The replicas for `load`: `guess` (the load over what one replica sustains), or more until
    their sustained probe meets the SLO, and that probe; (max + 1, None) if even max misses. Not
    fewer than the guess: replicas behind a router pool their queues, so a short probe of fewer
    can pass where the load, held for a window, would outgrow them."""
    if load <= 0:
        return scaling.min_replicas, None

    def passes(n: int) -> Optional[dict]:
        if (n, load) not in cache:
            # n separate servers, as the plan's schedule runs them (not one data-parallel server of n
            # ranks: a mixture of experts' would step in lockstep and shard its experts over them)
            found = search_point(spec, {"replica_schedule": ReplicaSchedule(f"{n} replicas", ((0.0, n),))},
                                 probing=replace(probing, target=load, by="rate"))
            probe = (found.get("probes") or [None])[-1]
            if probe and probe.get("alone"):     # no replica count makes a lone request faster
                # (A bound missed with every request alone is no count's noise, whatever else missed.)
                counted = "served" in ((probe.get("steady_state") or {}).get("overloaded_on") or []) and \
                    all(miss.startswith("overloaded") for miss in probe["misses"])
                raise CapacityError(
                    f"at {load:g} {spec.rate_unit()} on {n} replica{'s' * (n != 1)} the probe's requests each ran alone and still "
                    f"miss ({probe['misses'][0]}); more replicas cannot help: " +
                    (f"with nothing shared or queued that shortfall is the noise of counting a short window's ends: "
                     f"raise --steady-requests (now {probing.steady_requests:,})" if counted else
                     "the window's requests need a faster deployment or shorter requests"))
            if probe and probe["misses"] and all("too short a run" in m or re.fullmatch(r"\d+ of \d+ seeds run miss", m)
                                                 or m == "the one seed run misses" for m in probe["misses"]):
                # (Its window, however many replicas, lasts as long as the load takes to send its
                # requests: a count found past this would be judged on windows as short.)
                note = (probe.get("steady_state") or {}).get("note") or ""
                raise UserError(f"at {load:g} {spec.rate_unit()} on {n} replica{'s' * (n != 1)}, a probe of "
                                f"{probe.get('probe_requests', 0):,} requests, lengthened as far as a search lengthens "
                                f"one, is too short to tell whether they keep up"
                                + (f" ({note.split(': too short')[0]})" if ": too short" in note else "")
                                + f"; raise --steady-requests (now {probing.steady_requests:,})")
            cache[(n, load)] = found["best"] if not found.get("does_not_fit") else None
        return cache[(n, load)]

    # The need, whatever --min-replicas asks for (autoscaled() raises it there): from the guess up,
    # and past --max-replicas when the guess is (a probe of the cap could pass where the load,
    # held for a window, outgrows it).
    if guess > scaling.max_replicas:
        return scaling.max_replicas + 1, None
    for n in range(max(1, guess), scaling.max_replicas + 1):
        if passes(n):
            return n, passes(n)
    return scaling.max_replicas + 1, None


def autoscaled(needs: list[int], windows: list[tuple], scaling: Scaling, lead: float = 0.0) -> list[tuple[float, int]]:
    """Replicas asked for over the period, as (time s, replicas) steps: each window's need from
    `lead` before its start until scale_down_after past its end (a scale-down waits until the
    need has been lower that long, as Kubernetes' HPA stabilises one: to the second, not to the
    next window), the most of those held at once, within min and max."""
    held = sorted((max(0.0, start - lead), end + scaling.scale_down_after, need)
                  for need, (start, end, _) in zip(needs, windows))
    period = windows[-1][1]
    steps: list[tuple[float, int]] = []
    # At each moment a need starts or ends, the most of those held (a <= t < b): the needs begun
    # so far in a heap by size, the largest dropped once it has ended (a year of windows is
    # 35,040 of them, and looking through all of them at each moment took minutes).
    begun, i = [], 0
    for t in sorted({0.0, *(a for a, _, _ in held), *(b for _, b, _ in held if b < period)}):
        while i < len(held) and held[i][0] <= t:
            heapq.heappush(begun, (-held[i][2], held[i][1]))
            i += 1
        while begun and begun[0][1] <= t:
            heapq.heappop(begun)
        n = min(scaling.max_replicas, max(scaling.min_replicas, -begun[0][0] if begun else 0))
        if not steps or n != steps[-1][1]:
            steps.append((t, n))
    return steps


def asked_at(steps: list[tuple[float, int]], t: float) -> int:
    """The replicas a schedule's steps ask for at time t."""
    return steps[max(0, bisect.bisect_right([at for at, _ in steps], t) - 1)][1]


MAX_REPAIRS = 3       # whole-period simulations a plan may add replicas after


def plan(spec: RunSpec, probing: Probing, scaling: Scaling, verify: bool = True,
         progress: Optional[Callable[[str], None]] = None) -> dict:
    """The plan of one deployment over the period of spec's rate profile or trace. A window's
    probe holds its load for a steady window of probing.steady_requests, shorter than a window;
    a backlog that builds more slowly shows only in the whole period. So the whole period is
    simulated with the schedule, and where a window misses the SLO (for another reason than
    replicas still starting), it gets one replica more and the period is simulated again."""
    windows = plan_windows(spec, scaling.window_s)
    # The windows' loads have the profile's --time-scale in them: a probe at a load has none.
    deployment = replace(spec, rate_profile=None, data_parallel_size=1, replica_schedule=None, scale_up_delay=None,
                         time_scale=1.0 if spec.rate_profile else spec.time_scale)
    try:
        one = search_point(deployment, {}, (lambda text: progress(f"one replica: {text}")) if progress else None,
                           probing=replace(probing, target=None, by="rate"))
    except (KeyboardInterrupt, Terminated) as e:
        e.partial = None          # (its probes, which search_point kept): no window is planned yet
        raise
    if one.get("does_not_fit"):
        raise CapacityError(one["does_not_fit"])
    if one.get("alone"):              # replicas divide the load; they cannot make a lone request faster
        missed = one["probes"][-1]["misses"][0] if one["probes"] and one["probes"][-1]["misses"] else "the slo"
        raise CapacityError(f"no load meets the slo on one replica even with every request alone ({missed}); more "
                            f"replicas cannot help: it needs a faster deployment or shorter requests")
    if one.get("floor") and not (spec.trace and bunching(row[0] for row in spec.trace.rows) > 1):
        # Without requests sent together (which replicas do split), a miss that halving the load
        # left where it was is each request's own: replicas divide the load, not a request's time.
        raise CapacityError(f"no load meets the slo on one replica: {one['floor']}; more replicas cannot help: it "
                            f"needs a faster deployment or shorter requests")
    per_replica = one.get("highest_load") or 0.0
    cache: dict = {}
    rows: list[dict] = []
    stop, verified = None, None
    try:
        for i, (start, end, load) in enumerate(windows):
            key = float(f"{load:.3g}")           # loads a few per mille apart share their probes
            # One replica that meets the slo at no rate gives no lower bound (a trace's bunches of
            # requests sent at one moment arrive together at any rate): climb from the fewest.
            guess = max(1, math.ceil(key / per_replica)) if per_replica else 1      # (autoscaled() applies the least)
            need, probe = replicas_needed(deployment, key, probing, scaling, cache, guess)
            rows.append({"start_s": start, "end_s": end, "load": load, "needs": need, "raised": 0, "simulated": None,
                         "figures": {name: probing.figures(probe)[k] for name, k, _ in probing.slo.bounds}
                         if probe else None, "median_tpot_ms": probe["median_tpot_ms"] if probe else None})
            if progress:
                progress(f"window {i + 1}/{len(windows)}: {load:.3g} {spec.rate_unit()} needs " +
                         (f"more than --max-replicas {scaling.max_replicas}" if need > scaling.max_replicas else
                          f"{need} replica{'s' * (need != 1)}"))
    except (KeyboardInterrupt, Terminated) as e:
        if not rows:            # nothing planned yet: nothing to keep
            e.partial = None
            raise
        stop = e           # the windows planned are a plan of the period they cover, not simulated
    delay = scale_up_delay(replace(spec, scale_up_delay=scaling.scale_up_delay))
    price = deployment_price(spec, [spec.hardware], spec.gpus_per_replica)
    duration = rows[-1]["end_s"]
    report = {"deployment": simulate_command(deployment, keep={"router"}), "windows": rows, "window_s": scaling.window_s,
              "one_replica_sustains": per_replica, "rate_unit": spec.rate_unit(), "scale_up_delay_s": delay, "ahead": scaling.ahead,
              "scale_down_after_s": scaling.scale_down_after, "slo": {name: bound for name, _, bound in probing.slo.bounds},
              "never_met": [r["start_s"] for r in rows if r["needs"] > scaling.max_replicas],
              "max_replicas": scaling.max_replicas, "gpus_per_replica": spec.gpus_per_replica,
              "period_windows": len(windows), "verified": None, "interrupted": None,
              "vllm_would_refuse": ((one.get("best") or {}).get("config") or {}).get("vllm_would_refuse")}
    for attempt in range(MAX_REPAIRS + 1):
        schedule = scheduled(rows, scaling, delay, price)
        if not verify or stop:
            break
        try:
            verified = simulated_windows(spec, rows, schedule, delay, probing, progress)
        except (KeyboardInterrupt, Terminated) as e:
            stop, verified = e, None
            for row in rows:     # what an earlier simulation said was of an earlier schedule
                row["simulated"] = None
            break
        fixable = [r for r in rows if r["start_s"] in verified["windows_missing_the_slo"]
                   and r["start_s"] not in verified["of_them_scaling_up"] and r["needs"] < scaling.max_replicas]
        if not fixable or attempt == MAX_REPAIRS:      # (a replica added now would be neither asked for nor simulated)
            break
        fixable[0]["needs"] += 1
        fixable[0]["raised"] += 1
    report["schedule"] = [{"time_s": t, "replicas": n} for t, n in schedule.steps]
    report["totals"] = schedule_report(schedule, schedule.spans(delay), delay, duration, spec.gpus_per_replica,
                                       price / spec.gpus_per_replica if price else None)
    # (the fleet the schedule is weighed against keeps --min-replicas too, or it would "save" a negative sum)
    peak = max(scaling.min_replicas, *(min(r["needs"], scaling.max_replicas) for r in rows))
    report["totals"].update(peak_fleet=peak, peak_fleet_gpu_hours=peak * spec.gpus_per_replica * duration / 3600,
                            peak_fleet_usd=peak * price * duration / 3600 if price else None)
    # A month (--hours-per-month) of periods like this one, as search and simulate price a month.
    month = spec.hours_per_month * 3600 / duration
    report["totals"].update({f"{k}_per_month": report["totals"][k] * month if report["totals"][k] is not None else None
                             for k in ("usd", "peak_fleet_usd")}, hours_per_month=spec.hours_per_month)
    if verified:
        report["verified"] = verified
    report["does_not_meet_slo"] = plan_misses(report)
    if stop:     # the caller reports what was planned, then the stop
        again = any(r["raised"] for r in rows)
        report["interrupted"] = (f"planning {len(rows)} of {len(windows)} windows" if len(rows) < len(windows) else
                                 f"planning all {len(windows)} windows") + ", before the whole period was simulated" \
            + (" again with the replicas added" if again else "")
        stop.partial = report
        raise stop
    return report


def clock_text(seconds: float, fine: bool = False, end: bool = False) -> str:
    """A time in the period as a clock: 09:15, or 1d 09:15 past the first day; `fine`, to the
    second (09:15:30), for windows shorter than a minute; the `end` of a window at midnight is the
    day's 24:00, not the next day's 00:00."""
    days, rest = divmod(int(round(seconds)), 86400)
    if end and days and not rest:
        days, rest = days - 1, 86400
    return (f"{days}d " if days else "") + f"{rest // 3600:02d}:{rest % 3600 // 60:02d}" \
        + (f":{rest % 60:02d}" if fine else "")


def plan_clock(report: dict) -> Callable[..., str]:
    """clock_text for a plan's times: to the second where a window's edge or a step (a scale-down
    that waited into a window) falls inside a minute."""
    times = [r[edge] for r in report["windows"] for edge in ("start_s", "end_s")] + \
        [step["time_s"] for step in report.get("schedule") or []]
    return functools.partial(clock_text, fine=any(round(t) % 60 for t in times))


def plan_misses(report: dict) -> Optional[str]:
    """Why the plan's schedule does not meet the SLO (None: it does): windows no --max-replicas
    meets, or windows the whole-period simulation finds missing for a reason other than replicas
    still starting."""
    clock = plan_clock(report)
    if report["never_met"]:
        n = len(report["never_met"])
        return (f"{n} window{'s' * (n != 1)} need{'s' * (n == 1)} more than "
                f"--max-replicas {report['max_replicas']}, from {clock(report['never_met'][0])}")
    verified = report.get("verified") or {}
    short = verified.get("of_them_short_throughout") or []
    if short:      # a start-up is excused only where the replicas, once they serve, keep the window within the slo
        return (f"simulated whole, {len(short)} window{'s' * (len(short) != 1)} miss{'es' * (len(short) == 1)} the "
                f"slo while the replicas {'they need' if len(short) != 1 else 'it needs'} start, all through, from "
                f"{clock(short[0])}: their {report['scale_up_delay_s']:,.0f}-s start-up outlasts what they send; give "
                f"--ahead (each scale-up asked for a start-up early) or a longer --window")
    missed = [t for t in verified.get("windows_missing_the_slo", []) if t not in verified.get("of_them_scaling_up", [])]
    if missed:
        full = any(r["asked"] >= report["max_replicas"] for r in report["windows"] if r["start_s"] in missed)
        return (f"simulated whole, {len(missed)} window{'s' * (len(missed) != 1)} miss{'es' * (len(missed) == 1)} "
                f"the slo with the replicas serving, from {clock(missed[0])}: "
                + ("raise --max-replicas" if full else f"the plan adds a replica after each of at most "
                   f"{MAX_REPAIRS} simulations, and ran out; raise the windows' replicas by hand, or shorten --window"))
    return None


def scheduled(rows: list[dict], scaling: Scaling, delay: float, price: Optional[float]) -> ReplicaSchedule:
    """The windows' needs as an autoscaler's schedule; each row gets the most it asks for at
    once, how long replicas added at its start leave it short, and what it costs (replica-seconds
    asked for inside it, so a scale-down that waits into a window is paid there)."""
    windows = [(r["start_s"], r["end_s"], r["load"]) for r in rows]
    steps = autoscaled([min(r["needs"], scaling.max_replicas) for r in rows], windows, scaling,
                       delay if scaling.ahead else 0.0)
    schedule = ReplicaSchedule("plan", tuple(steps))
    serving, changes = schedule.serving(delay)
    for row in rows:
        start, end = row["start_s"], row["end_s"]
        inside = [(start, asked_at(steps, start))] + [(at, n) for at, n in steps if start < at < end]
        edges = [at for at, _ in inside[1:]] + [end]
        paid = sum(n * (stop - at) for (at, n), stop in zip(inside, edges))
        # Short until as many replicas serve as it needs: a start-up longer than the window leaves
        # all of it short, and replicas asked for ahead of a later window do not make it short.
        # (Never, where they are let go before they serve: a scale-down sooner than a start-up.)
        need = min(row["needs"], scaling.max_replicas)
        ready = next((t for t in [start, *(t for t in changes if t > start)] if serving(t) >= need), math.inf)
        row.update(asked=max(n for _, n in inside), short_s=round(min(ready, end) - start, 6),
                   serves_after_s=round(ready - start, 6) if ready < math.inf else None,
                   usd=paid * price / 3600 if price else None)
    return schedule


def simulated_windows(spec: RunSpec, rows: list[dict], schedule: ReplicaSchedule, delay: float, probing: Probing,
                      progress: Optional[Callable[[str], None]]) -> dict:
    """The whole period simulated with the schedule, its requests judged by the SLO window by window."""
    whole = replace(spec, replica_schedule=schedule, data_parallel_size=1, requests=None, scale_up_delay=delay)
    done: list = []
    result = run(whole, progress, requests_out=done)
    missed, starting, whole = [], [], []
    for row in rows:
        sent = [r for r in done if row["start_s"] <= r.sent_s < row["end_s"]]
        row["simulated"] = None
        if sent:
            misses = probing.slo.misses(summarize(sent))
            row["simulated"] = {"requests": len(sent), "misses": misses}
            if misses:
                missed.append(row["start_s"])
                # The start-up is to blame only if the requests sent once the added replicas serve
                # meet the SLO: a window that misses after that too is short of replicas.
                served = [r for r in sent if r.sent_s >= row["start_s"] + row["short_s"]]
                if row["short_s"] and (not served or not probing.slo.misses(summarize(served))):
                    starting.append(row["start_s"])
                if row["short_s"] and not served:     # (no request it sent found the replicas it needs)
                    whole.append(row["start_s"])
    return {"requests": result["completed"] + result["failed"], "failed": result["failed"],
            "windows_missing_the_slo": missed, "of_them_scaling_up": starting, "of_them_short_throughout": whole,
            **{k: result[k] for k in ("p95_ttft_ms", "median_tpot_ms", "output_throughput")}}


# A search split over machines: shard K of N runs every N-th deployment from the K-th, as the
# whole search would run it, and writes what it found; collect puts the shards back in the grid's
# order, and the report is the whole search's. A fingerprint of the search (its settings, grid and
# probing) keeps shards of different searches apart.

def search_fingerprint(spec: RunSpec, points: list[dict], probing: Probing) -> str:
    def plain(o):
        return asdict(o) if is_dataclass(o) else repr(o)
    settings = {f.name: getattr(spec, f.name) for f in fields(spec) if f.metadata}
    if spec.profile:          # two profile files of one name are two engines
        settings["profile"] = {k: getattr(spec.profile, k) for k in ("name", *EngineProfile.FILE_FIELDS)}
    text = json.dumps({"spec": settings, "points": points, "probing": asdict(probing)}, default=plain, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def shard_indices(shard: tuple[int, int], count: int) -> list[int]:
    k, n = shard
    return list(range(k - 1, count, n))


def shard_report(found: list[dict], shard: tuple[int, int], fingerprint: str, count: int, indices: list[int],
                 complete: bool) -> dict:
    """A shard's deployments and their indices in the whole search (those that finished, which an
    interrupted shard's need not be the first of its share)."""
    return {"search_shard": {"shard": shard[0], "of": shard[1], "fingerprint": fingerprint, "deployments": count,
                             "indices": indices, "complete": complete},
            "found": found}


def cheapest_first(found: list[dict], probing: Optional["Probing"] = None) -> list[dict]:
    """Deployments that meet the SLO, cheapest an hour first; then those that miss it; then
    those that do not fit. Among those of one price (8 GPUs as TP 8, 4 x 2 or 2 x 4), the one with
    the most room under the SLO (its tightest bound's figure over the bound) first: at one load
    their cost per token differs only by the noise of what each happened to finish."""
    def key(item):
        best = item["best"]
        cost = (best or (item["probes"][-1] if item["probes"] else {})).get("cost") or {}
        rank = 0 if best else 1 if item["probes"] else 2
        return (rank, cost.get("usd_per_hour") or math.inf, slo_room(best, probing) if best else math.inf,
                cost.get("usd_per_million_output_tokens") or math.inf)
    return sorted(found, key=key)


def slo_room(result: dict, probing: Optional["Probing"]) -> float:
    """How close a passing probe came to its SLO: its tightest bound's figure over the bound (1 at
    the bound); 0 where no SLO is known, so the order is the price's alone."""
    if probing is None:
        return 0.0
    figures = probing.figures(result)
    shares = [figures[key] / bound for _, key, bound in probing.slo.bounds
              if isinstance(figures.get(key), (int, float)) and bound > 0]
    return max(shares, default=0.0)


# Grids: the points a sweep runs and the deployments a search tries, from the settings given
# several values.

DEFAULT_SWEEP = [1, 8, 32, 128, 256]
COMPARE_AXIS = 22        # sweep --compare's place among the axes: after the link, before the load
AXES = sorted([*SWEPT, "compare"], key=lambda n: SETTINGS[n].metadata["axis"] if n in SETTINGS else COMPARE_AXIS)


def sweep_grid(given: dict, gpus: Optional[int] = None, trace: Optional[str] = None) -> tuple[list[str], list[dict]]:
    """The settings a sweep varies (at most two) and its points, the grid of their values. `given`
    maps each setting given as a list to its values; a list of one is a fixed setting, not an axis."""
    given = {axis: given[axis] for axis in AXES if axis in given}
    axes = [axis for axis, values in given.items() if len(values) > 1 or axis in ("compare", "kv_link_gbs")]
    if len(axes) > 2:
        raise UserError(f"sweep varies at most two settings at a time: {', '.join(flag_of(a) for a in axes)} "
                        f"each have several values; give all but two of them one value")
    if gpus:
        return gpu_split_points(gpus, given, axes)
    if not axes and trace:
        return ["trace"], [{"trace": trace}]
    if not axes:
        axes = ["rate" if given.get("rate") else "concurrency"]
    values = {axis: given.get(axis) or DEFAULT_SWEEP for axis in axes}
    if "kv_link_gbs" in values:
        values["kv_link_gbs"] = ["colocated"] + values["kv_link_gbs"]     # the baseline the link has to beat
    check_points(list(values.values()))
    return axes, [dict(zip(axes, combination)) for combination in itertools.product(*values.values())]


MAX_SWEEP_POINTS = 1_000      # each point is a whole simulation whose report is kept


def check_points(lists: list) -> None:
    """Refuse a grid with more points than a sweep runs, before building it."""
    count = math.prod(len(values) for values in lists)
    if count > MAX_SWEEP_POINTS:
        raise UserError(f"a sweep of {count:,} points ({' x '.join(f'{len(v):,}' for v in lists)} values); sweep runs "
                        f"at most {MAX_SWEEP_POINTS:,}, each a whole simulation: shorten the lists")


def gpu_split_points(gpus: int, given: dict, axes: list[str]) -> tuple[list[str], list[dict]]:
    """--gpus N: the same N GPUs split each way -tp lists (or the ways -dp lists), the rest replicas
    (or tensor parallel), so the rows compare TP against replicas at equal cost."""
    split = [a for a in ("tensor_parallel_size", "data_parallel_size") if a in given]
    if len(split) != 1:
        raise UserError(f"--gpus {gpus} splits the GPUs by the -tp values or by the -dp values: give one of "
                        f"them, e.g. -tp 1,2,4,8")
    by, other = split[0], ({"tensor_parallel_size", "data_parallel_size"} - set(split)).pop()
    odd = [v for v in given[by] if gpus % v]
    if odd:
        raise UserError(f"--gpus {gpus}: {flag_of(by)} {odd[0]} does not divide {gpus} GPUs evenly")
    rest = [a for a in axes if a != by]
    if not rest:
        rest = ["rate"] if given.get("rate") else ["concurrency"]
    if len(rest) > 1:
        raise UserError(f"--gpus {gpus} varies {flag_of(by)} and one more setting; "
                        f"{' and '.join(flag_of(a) for a in rest)} both have several values")
    loads = {a: given.get(a) or DEFAULT_SWEEP for a in rest}
    check_points([given[by], *loads.values()])
    points = []
    for v in given[by]:
        for combination in itertools.product(*loads.values()):
            point = {by: v, **dict(zip(rest, combination))}
            # A pipeline's stages are GPUs too: a replica is tp x pp of them.
            stages = point.get("pipeline_parallel_size") or (given.get("pipeline_parallel_size") or [1])[0]
            if gpus % (v * stages):
                raise UserError(f"--gpus {gpus}: {flag_of(by)} {v} x --pipeline-parallel-size {stages} does not "
                                f"divide {gpus} GPUs evenly")
            points.append({by: v, other: gpus // (v * stages), **dict(zip(rest, combination))})
    return [by, other, *rest], points


SEARCH_EXCLUDED = ("kv_link_gbs", "compare", "rate", "concurrency")
MAX_DEPLOYMENTS = 1_000     # each is several whole simulations, and every probe is kept for the report


def search_grid(given: dict) -> tuple[list[str], list[dict]]:
    """The deployments a search tries: every combination of the server settings given as lists."""
    if len(given.get("kv_link_gbs") or []) > 1:
        raise UserError("search tries deployments; --kv-link-gbs takes one value here (sweep it instead)")
    axes = [axis for axis in AXES if axis not in SEARCH_EXCLUDED and len(given.get(axis) or []) > 1]
    count = math.prod(len(given[a]) for a in axes)
    if count > MAX_DEPLOYMENTS:
        raise UserError(f"a search of {count:,} deployments ({' x '.join(f'{len(given[a]):,}' for a in axes)} values); "
                        f"search tries at most {MAX_DEPLOYMENTS:,}, each several whole simulations: shorten the lists")
    return axes, [dict(zip(axes, combination)) for combination in itertools.product(*(given[a] for a in axes))]


def applicable(spec: RunSpec, points: list[dict], what: str) -> list[dict]:
    """The grid's points less those where expert parallelism, tried on and off over several GPU
    counts, has one GPU to spread the experts over (the same deployment as with it off), said on
    stderr."""
    if not any("enable_expert_parallel" in p for p in points) or \
            not any({"data_parallel_size", "tensor_parallel_size"} & p.keys() for p in points):
        return points         # (one GPU count, with expert parallelism on: check_spec refuses it)
    single = lambda d: d.enable_expert_parallel and d.data_parallel_size == 1 and d.tensor_parallel_size == 1
    kept = [p for p in points if not single(sweep_point(spec, p))]
    alone = len(points) - len(kept)
    if kept and alone:
        sys.stderr.write(f"servesim: {alone} {what}{'s' * (alone != 1)} with --enable-expert-parallel on and one GPU "
                         f"left out: the experts have nowhere to spread (the same as with it off)\n")
    return kept or points


def distinct(spec: RunSpec, points: list[dict], what: str) -> list[dict]:
    """The grid's points less those that differ from an earlier one only in settings that change
    nothing there (inert: two routers of one replica), said on stderr."""
    kept, seen, idle = [], set(), set()
    for point in points:
        unused = inert(sweep_point(spec, point)) & point.keys()
        key = repr(sorted((name, value) for name, value in point.items() if name not in unused))
        if key in seen:
            idle |= unused
            continue
        seen.add(key)
        kept.append(point)
    if len(kept) < len(points):
        dropped = len(points) - len(kept)
        sys.stderr.write(f"servesim: {dropped} {what}{'s' * (dropped != 1)} left out: "
                         f"{' and '.join(sorted(flag_of(name) for name in idle))} change{'s' * (len(idle) == 1)} "
                         f"nothing there, so "
                         f"{'they are' if dropped != 1 else 'it is'} the same as one kept\n")
    return kept


def search_report(spec: RunSpec, points: list[dict], found: list[dict], probing: Probing,
                  sources: Optional[dict] = None, stopped_of: Optional[int] = None) -> dict:
    """What a search found, as one report: each probe with the simulate command that reruns it,
    the deployments ranked cheapest first when they were all run at one load. `points` are the
    settings of each of `found`; a search that was stopped had `stopped_of` deployments to try."""
    for item, settings in zip(found, points):
        deployment = sweep_point(spec, settings)
        for how, probes in ((probing, item["probes"]), (replace(probing, sustained=False),
                                                         (item.get("burst") or {}).get("probes", []))):
            for probe in probes:
                # The seeds the probe ran (those that settled its verdict), so the rerun shows its figures.
                seeds = f" --seeds {probe.get('seeds_run', 1)}" if probe.get("seeds_run", 1) > 1 else ""
                ran = how.probe(deployment, probe["load"], probe.get("probe_requests"))
                probe["rerun"] = simulate_command(ran, sources) + seeds
                if probe.get("missed_seed") is not None:     # its figures are the mean; the miss is this seed's
                    probe["rerun_missed_seed"] = simulate_command(replace(ran, seed=probe["missed_seed"]), sources)
    ranked = cheapest_first(found, probing) if probing.target is not None else found
    for item in ranked:      # how close each answer came to its slo, by which cheapest_first breaks a tie of price
        if probing.target is not None and item.get("best"):
            item["slo_room"] = slo_room(item["best"], probing)
    longer = probing.rechecking()
    return {"slo": {name: bound for name, _, bound in probing.slo.bounds}, "by": probing.by, "target": probing.target,
            "tolerance": probing.tolerance if probing.target is None else None, "sustained": probing.sustained,
            "steady_requests": probing.steady_requests if probing.sustained else None,
            # A target is probed at the recheck's length; a highest load's answer is a recheck's probe.
            "probe_requests": None if not probing.sustained else
            (longer or probing).requests(spec) if probing.target is not None else probing.requests(spec),
            "recheck": probing.recheck if longer else None,
            "recheck_requests": longer.requests(spec) if longer and probing.target is None else None,
            "seeds": probing.seeds, "confidence": probing.confidence, "deployments": ranked,
            "tried": f"{sum(not item.get('interrupted') for item in found)} of {stopped_of}" if stopped_of else None}


# ---------------------------------------------------------------------------------------------
# Readers: every file a user hands servesim (presets, traces, prompts, reports, scrapes) is read
# here, and whatever is wrong with it becomes one line naming the file, the line and the fix.
# ---------------------------------------------------------------------------------------------

PRESET_BYTES = 1 << 20      # a preset or profile file is a few hundred bytes; this stops /dev/zero
# A file read whole (a report, a scrape, a published run's files) is a few MiB, a detailed report
# of a long run some hundreds (about 28 bytes an output token): past this it is not one (a pipe
# that never ends, a model's weights).
FILE_BYTES = 1 << 30


def text_head(f, path: str, kind: str) -> bytes:
    """The first 64 KiB of a file that must be text, refused at once if they show it is not."""
    head = f.read(65536)
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise UserError(f"{kind} {path}: is UTF-16 text; save it as UTF-8")
    if head.startswith(b"\x1f\x8b"):
        raise UserError(f"{kind} {path}: is gzip-compressed; pass it through zcat, as <(zcat {path})")
    if b"\0" in head:
        raise UserError(f"{kind} {path}: is a binary file, not text")
    return head


def read_bytes(path: str, kind: str, limit: int = FILE_BYTES, f=None) -> bytes:
    """A text file's bytes, whole (`f`: the file, already open, as a pipe read once is), read a
    MiB at a time: read(limit) would set aside the whole limit for a file of a few KiB."""
    too_big = UserError(f"{kind} {path}: is over {limit:,} bytes, more than servesim reads of such a file; check "
                        f"the path")
    try:
        with (open(path, "rb") if f is None else f) as f:
            with contextlib.suppress(OSError, ValueError, io.UnsupportedOperation):
                if os.fstat(f.fileno()).st_size > limit:
                    raise too_big
            chunks = [text_head(f, path, kind)]
            size = len(chunks[0])
            while size <= limit and len(chunks[-1]):
                chunks.append(f.read(min(1 << 20, limit + 1 - size)))
                size += len(chunks[-1])
    except OSError as e:
        raise UserError(f"{kind} {path}: cannot read it ({e.strerror})") from None
    except MemoryError:
        raise UserError(f"{kind} {path}: too large to hold in this process's memory; check the path") from None
    if size > limit:
        raise too_big
    return b"".join(chunks)


def read_text(path: str, kind: str, limit: int = FILE_BYTES, f=None) -> str:
    """A text file (`f`: already open, as read_bytes takes it) as UTF-8 (a BOM is fine); anything
    else is a one-line error."""
    raw = read_bytes(path, kind, limit, f)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise UserError(f"{kind} {path}: is not UTF-8 text (byte {raw[e.start]:#04x} at offset {e.start:,}); "
                        f"save it as UTF-8") from None


class Replayed(io.RawIOBase):
    """A stream that can be read only once (a pipe), its first bytes, already read to look at,
    served again before the rest: it is still read a line at a time, never whole."""

    def __init__(self, head: bytes, rest):
        self.head, self.rest = memoryview(head), rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.head:
            n = min(len(buffer), len(self.head))
            buffer[:n], self.head = self.head[:n], self.head[n:]
            return n
        return self.rest.readinto(buffer)


def text_lines(path: str, kind: str, max_line: Optional[int] = None, why: str = "",
               data=None) -> Iterator[tuple[int, str]]:
    """(number, line) of a text file (or of its bytes, already read, or of a pipe read once) read
    a line at a time, so a big file is never held whole, with read_text's one-line errors; a line
    longer than max_line bytes is refused (saying `why`) before it is read whole."""
    try:
        f = open(path, "rb") if data is None else io.BytesIO(data) if isinstance(data, bytes) else data
    except OSError as e:
        raise UserError(f"{kind} {path}: cannot read it ({e.strerror})") from None
    with f:
        head = text_head(f, path, kind)
        try:
            f.seek(0)
        except OSError:                # a pipe: what was read, then the rest
            f = io.BufferedReader(Replayed(head, f))
        offset = 0
        for number in itertools.count(1):
            raw = f.readline(max_line + 2) if max_line else f.readline()
            if not raw:
                return
            if max_line and len(raw.rstrip(b"\r\n")) > max_line:
                raise UserError(f"{kind} {path} line {number}: longer than {max_line // KIB:,} KiB"
                                + (f"; {why}" if why else ""))
            if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw, offset = raw[3:], 3
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise UserError(f"{kind} {path}: is not UTF-8 text (byte {raw[e.start]:#04x} at offset "
                                f"{offset + e.start:,}); save it as UTF-8") from None
            offset += len(raw)
            yield number, line


class DuplicateKey(ValueError):
    """A JSON object that names one key twice: json keeps the last silently."""


def unique_keys(pairs: list) -> dict:
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise DuplicateKey(key)
        seen[key] = value
    return seen


def json_int(digits: str):
    """An integer past 20 digits read as the float it is (inf past 308), so every range check
    that follows sees a number it can compare, not one too large to convert (Python refuses
    integers past 4,300 digits outright)."""
    return int(digits) if len(digits) <= 20 else float(digits)


def parse_json(text: str, where: str, expect: str):
    """JSON, or a one-line error: bad syntax (where in a file of several lines), a key given
    twice in one object (which of two values was meant is not ours to guess), integers past
    Python's 4,300 digits, deep nesting."""
    try:
        return json.loads(text, parse_int=json_int, object_pairs_hook=unique_keys)
    except RecursionError:
        raise UserError(f"{where}: JSON nested too deeply; {expect}") from None
    except DuplicateKey as e:
        # Where: the key's second place in the text (in another object it may stand alone, but the
        # line is where to look).
        places = [m.start() for m in re.finditer(re.escape(json.dumps(e.args[0])) + r"\s*:", text)]
        at = f" (line {text.count(chr(10), 0, places[1]) + 1})" if len(places) > 1 and "\n" in text.strip() else ""
        raise UserError(f"{where}: the key {str(e.args[0])[:60]!r} is given twice in one object{at}; keep the one "
                        f"you mean") from None
    except ValueError as e:
        if not text.strip():
            raise UserError(f"{where}: empty; {expect}") from None
        reason = getattr(e, "msg", None) or str(e).split(";")[0]
        at = ""
        if isinstance(e, json.JSONDecodeError):      # (a one-line text: its column is enough)
            at = f"line {e.lineno} column {e.colno}" if "\n" in text.strip() else f"column {e.colno}"
            # ("Unterminated string starting at" names its place itself)
            at = f" {at}" if reason.endswith(" at") else f" at {at}"
        raise UserError(f"{where}: not valid JSON ({reason}{at}); {expect}") from None


# What a preset's numbers may be: (lowest, highest, note). Real devices and models sit well inside.
PRESET_RANGES = {
    "memory_gib": (0.5, 2048, "GiB of device memory; the largest preset has 192"),
    "bandwidth_gbs": (1, 100_000, "GB/s; an H100 has 3,350"),
    "tflops": (0.001, 100_000, "dense TFLOPS; an H100 has 989"),
    "mbu": (0.01, 1, "a fraction of peak bandwidth"), "mfu": (0.01, 1, "a fraction of peak FLOPS"),
    "step_overhead_ms": (0, 10_000, "ms"), "seq_overhead_ms": (0, 10_000, "ms"),
    "reserve_gib": (0, 2048, "GiB"),
    "params": (1e6, 1e14, "a parameter count: 8.03e9 for an 8B model"),
    "layers": (1, 10_000, ""), "kv_heads": (1, 4096, ""), "head_dim": (1, 65_536, ""),
    "weight_dtype_bytes": (0.1, 8, "bytes per weight: 2 for BF16, 1 for FP8"),
    "kv_dtype_bytes": (1, 8, "bytes per KV element: 2 for BF16, 1 for FP8"),
    "fp8_tflops": (0, 100_000, "dense FP8 TFLOPS, 0 for none"),
    "gemm_efficiency": (0.01, 1, "a fraction of dense peak"),
    "attention_efficiency": (0.01, 1, "a fraction of dense peak"),
    "bandwidth_efficiency": (0.01, 1, "a fraction of peak bandwidth"),
    "hidden_size": (0, 1_000_000, "0 for heads x head_dim"), "heads": (0, 4096, "query heads; 0 for kv_heads"),
    "vocab_size": (0, 10_000_000, "0 if unknown"), "max_position_embeddings": (0, 10**8, "tokens, 0 if unknown"),
    "active_params": (0, 1e14, "0 for a dense model"), "experts": (0, 100_000, "0 for a dense model"),
    "experts_per_token": (0, 100_000, ""), "expert_dtype_bytes": (0, 8, "0 for weight_dtype_bytes"),
    "sliding_layers": (0, 10_000, ""), "sliding_window": (0, 10**8, "tokens"),
    "interconnect_gbs": (0, 100_000, "GB/s per direction, 0 for none"),
    "interconnect_latency_us": (0, 10_000, "us per step of a ring"),
    "link_efficiency": (0.01, 1, "a fraction of interconnect_gbs"), "price_per_hour": (0, 10_000, "USD per GPU-hour"),
    "kernel_floor_us": (0, 1_000, "us a kernel takes at least, in a CUDA graph"),
    "kernel_launch_us": (0, 1_000, "us a kernel's launch adds outside a CUDA graph"),
    "host_link_gbs": (0, 10_000, "GB/s per direction between a GPU and host memory, 0 for none"),
    "host_memory_gib": (0, 1_000_000, "GiB of host memory per GPU, 0 if not stated"),
}
PRESET_SWITCHES = ("tie_word_embeddings", "nvlink", "peer_to_peer")
INTERNAL_FIELDS = ("expert_share",)        # set by data-parallel ranks of a mixture of experts, never by a file


def preset_fields(preset) -> dict:
    """A preset as its JSON file: every field a file may set."""
    return {k: v for k, v in asdict(preset).items() if k not in INTERNAL_FIELDS}


SLIDING_WINDOW_MAX = 1024     # a sliding layer's cache counted as none: true only for short windows


def model_problem(m: ModelSpec) -> Optional[str]:
    """The first rule between a model file's fields that it breaks, said; None if it keeps them all."""
    if m.experts and (not 0 < m.experts_per_token < m.experts or not 0 < m.active_params < m.params):
        return "a mixture of experts needs 0 < experts_per_token < experts and 0 < active_params < params"
    if m.sliding_layers >= m.layers:
        return "sliding_layers must be fewer than layers"
    if not m.experts and (m.experts_per_token or m.expert_dtype_bytes or m.active_params not in (0, m.params)):
        return ("experts_per_token, expert_dtype_bytes and active_params describe a mixture of experts: give experts "
                "too, or drop them (a dense model would ignore them)")
    if m.sliding_window > SLIDING_WINDOW_MAX:
        return (f"sliding_window {m.sliding_window:,} is more than servesim models: it counts a sliding layer's cache "
                f"as nothing, which holds for windows far shorter than a request (gpt-oss's 128), up to "
                f"{SLIDING_WINDOW_MAX:,} tokens; count such layers as full attention (sliding_layers 0, sliding_window 0)")
    if bool(m.sliding_layers) != bool(m.sliding_window):
        # Either alone would be dropped: layers with no window would hold no cache at all (twice the
        # requests fit), and a window with no layers under it changes nothing.
        return ("sliding_layers and sliding_window go together (the layers that attend to only the last "
                "sliding_window tokens): give both above 0, or neither")
    if m.heads and (m.kv_heads > m.heads or m.heads % m.kv_heads):
        return (f"heads {m.heads} must be a multiple of kv_heads {m.kv_heads} (grouped-query attention shares each "
                f"KV head among a whole number of query heads)")
    if shape_params(m) > m.compute_params:
        count = "active_params" if m.experts else "params"
        return (f"its shape alone holds {shape_params(m) / 1e9:.3g} B parameters (vocab_size x hidden_size "
                f"embeddings{'' if m.tie_word_embeddings else ' and output projection'}, and {m.layers} layers of "
                f"attention projections), more than {count} {m.compute_params:g}; check vocab_size, hidden_size, "
                f"heads, head_dim and {count}")
    return None


def hardware_problem(h: Hardware) -> Optional[str]:
    """The first rule between a hardware file's fields that it breaks, said; None if it keeps them all."""
    if 0 < h.fp8_tflops < h.tflops:
        return (f"fp8_tflops {h.fp8_tflops:g} is below tflops {h.tflops:g}; FP8 tensor cores run at least as fast "
                f"as BF16 (twice on H100): give the dense FP8 peak, or 0 for none")
    if 0 < h.interconnect_gbs < 0.1:
        return (f"interconnect_gbs {h.interconnect_gbs:g} GB/s is no link to run a group on: 0 for none, or the "
                f"link's GB/s per direction (PCIe Gen4 x16 is 31.5)")
    if h.reserve_gib >= h.memory_gib:
        return f"reserve_gib {h.reserve_gib:g} leaves nothing of memory_gib {h.memory_gib:g}"
    return None


def load_preset(kind: str, value: str, presets: dict, cls, flag: str = ""):
    """A preset name, or a path to a JSON file with the dataclass's fields (given to `flag`,
    --hardware or --model unless said)."""
    flag = flag or f"--{kind}"
    if value in presets:
        return presets[value]
    if "," in value and not os.path.exists(value):
        raise UserError(f"{flag} {value!r}: " + (
            "one device here; sweep and search take a comma-separated list of --hardware" if flag == "--hardware" else
            f"one {kind} at a time" + ("; sweep and search vary server settings, not the model, so run each model "
                                       "on its own" if flag == "--model" else "")))
    if not os.path.exists(value) and value.lower().endswith(".json"):
        raise UserError(f"{flag} {value}: no such file (a {kind} file is JSON with the fields of one entry of "
                        f"`main.py presets --json`)")
    if not os.path.exists(value):
        near = difflib.get_close_matches(value.lower(), list(presets), n=1, cutoff=0.5) or \
            [name for name in presets if name.startswith(value.lower())][:1]
        raise UserError(f"{flag}: unknown {kind} {value!r}" + (f" (did you mean {near[0]}?)" if near else "") +
                        f": use one of {', '.join(presets)} or a path to a JSON file with the same fields "
                        f"(see: main.py presets)")
    where = f"{kind} file {value}"
    data = parse_json(read_text(value, f"{kind} file", limit=PRESET_BYTES), where,
                      "expected one entry of `main.py presets --json`")
    if not isinstance(data, dict):
        raise UserError(f"{where}: expected a JSON object like one entry of `main.py presets --json`")
    known = {f.name: f for f in fields(cls) if f.name not in INTERNAL_FIELDS}
    unknown = sorted(set(data) - set(known))
    missing = sorted(n for n, f in known.items() if f.default is MISSING and n not in data)
    if unknown or missing:
        problems = ([f"unknown fields {printable(', '.join(unknown))}"] if unknown else []) + \
                   ([f"missing fields {', '.join(missing)}"] if missing else [])
        raise UserError(f"{where}: {'; '.join(problems)}; the fields are {', '.join(known)}")
    for name, v in data.items():
        if name == "name":
            if not isinstance(v, str) or not v.strip() or len(v) > 200 or UNPRINTABLE.search(v):
                raise UserError(f"{where}: field 'name' must be a non-empty string of at most 200 printable "
                                f"characters (every report shows it)")
            if v != v.strip():      # a report's name is read back stripped: a preset's, padded, would be it
                raise UserError(f"{where}: field 'name' {v!r} has spaces around it; write it without them")
            continue
        if name in PRESET_SWITCHES:
            if not isinstance(v, bool):
                raise UserError(f"{where}: field {name!r} must be true or false, got {v!r}")
            continue
        low, high, note = PRESET_RANGES[name]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise UserError(f"{where}: field {name!r} must be a number, got {v!r}")
        if high == 1 and 10 <= v <= 100:      # 85 meant as 0.85 (1.5 is no percent anyone means: the range says it)
            raise UserError(f"{where}: field {name!r} is {note} from {low:g} to 1; {v!r} looks like a percent: "
                            f"write {v / 100:g}")
        inside = low <= v <= high
        if not inside:
            mib = f"; nvidia-smi reports MiB: {v:g} MiB is {v / 1024:.3g} GiB" if name.endswith("_gib") and v > high and low <= v / 1024 <= high else ""
            raise UserError(f"{where}: field {name!r} must be from {low:g} to {high:,g} ({note}), got {v!r}{mib}"
                            .replace(" ()", ""))
        if known[name].type == "int" and v != int(v):
            raise UserError(f"{where}: field {name!r} must be a whole number, got {v!r}")
    preset = cls(**{k: int(v) if known[k].type == "int" and not isinstance(v, bool) else v for k, v in data.items()})
    problem = model_problem(preset) if isinstance(preset, ModelSpec) else hardware_problem(preset)
    if problem:
        raise UserError(f"{where}: {problem}")
    if preset.name in presets and preset != presets[preset.name]:
        # A preset edited in place keeps its name; reports name what they ran on by it, and a later
        # compare or calibrate reading that name would take the preset's figures, not the file's.
        # The path as given tells two such files apart; its tail keeps the name within 200 characters.
        path = printable(value)
        path = path if len(path) <= 120 else "..." + path[-117:]
        preset = replace(preset, name=f"{preset.name} (from {path})")
    return preset


# An engine profile file: one engine's rules with its own costs (calibrate --fit engine writes one).
ENGINE_FIELD_RANGES = {"step_cpu_ms": (0, 1000, "ms of CPU work a step"),
                       "seq_cpu_ms": (0, 100, "ms of CPU work per sequence in a step"),
                       "kernel_scale": (0.1, 10, "a real step's kernel time over the kernel model's")}


def engine_field_problem(values: dict) -> Optional[str]:
    """The first of a profile's numbers that is not a number in its range, said; None if all are."""
    for key, (low, high, note) in ENGINE_FIELD_RANGES.items():
        v = values[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not low <= v <= high:
            return f"field {key!r} must be a number from {low:g} to {high:g} ({note}), got {printable(repr(v)[:40])}"
    return None


def read_engine_profile(path: str) -> EngineProfile:
    where = f"engine profile {path}"
    data = parse_json(read_text(path, "engine profile", limit=PRESET_BYTES), where,
                      "expected the JSON calibrate --fit engine writes")
    if not isinstance(data, dict):
        raise UserError(f"{where}: expected a JSON object with name, base, {', '.join(EngineProfile.FILE_FIELDS)}")
    known = ("name", "base", *EngineProfile.FILE_FIELDS, "source")
    unknown = sorted(set(data) - set(known))
    missing = [k for k in known if k != "source" and k not in data]
    if unknown or missing:
        raise UserError(f"{where}: " + "; ".join([f"unknown fields {', '.join(unknown)}"] * bool(unknown)
                                                + [f"missing fields {', '.join(missing)}"] * bool(missing))
                        + f"; the fields are {', '.join(known)}")
    for key in ("name", "source"):
        if key in data and (not isinstance(data[key], str) or not data[key].strip() or len(data[key]) > 2000):
            raise UserError(f"{where}: field {key!r} must be a non-empty string of at most 2,000 characters")
    if not isinstance(data["base"], str) or data["base"] not in ENGINES:
        raise UserError(f"{where}: field 'base' must be one of {', '.join(ENGINES)} (whose rules, CUDA graphs and "
                        f"defaults the profile keeps), got {printable(str(data['base'])[:40])!r}")
    if not isinstance(data["overlap"], bool):
        raise UserError(f"{where}: field 'overlap' (async scheduling) must be true or false, got {data['overlap']!r}")
    problem = engine_field_problem(data)
    if problem:
        raise UserError(f"{where}: {problem}")
    return replace(ENGINES[data["base"]], name=printable(data["name"][:200]), base=data["base"],
                   **{k: data[k] for k in EngineProfile.FILE_FIELDS})


def engine_profile_json(profile: EngineProfile, source: str) -> dict:
    return {"name": profile.name, "base": profile.rules,
            **{k: getattr(profile, k) for k in EngineProfile.FILE_FIELDS}, "source": source}


def shape_params(model: ModelSpec) -> float:
    """The fewest parameters a token computes that the shape itself implies: the embedding table
    (and the output projection, unless tied) and each layer's query, key, value and output
    projections. A model file whose params are fewer is inconsistent (the kernel cost model
    would price the rest of its weights below zero)."""
    hidden = model.hidden_size or model.query_heads * model.head_dim
    attention = model.layers * 2 * hidden * model.head_dim * (model.query_heads + model.kv_heads)
    return model.embedding_params * (1 if model.tie_word_embeddings else 2) + attention


def read_jsonl(path: str, kind: str, lines: Optional[Iterable[tuple[int, str]]] = None) -> Iterable[tuple[str, object]]:
    """(where, parsed line) for each non-blank line of the file (or of its `lines`, text_lines
    of it), read a line at a time; an unreadable file or line is a UserError."""
    for number, line in text_lines(path, kind) if lines is None else lines:
        if line.strip():
            where = f"{kind} {path} line {number}"
            yield where, parse_json(line, where, "each line must be one JSON object")


REPORT_SECTIONS = ("config", "engine", "server", "timings", "client", "link", "prefill_engine")
# The only report figures that may be negative: a difference, an error, and a queue that shrinks.
SIGNED = ("client_minus_server_tokens", "error", "queue_growth_rps", "wait_growth_s_per_s", "offset_s", "low_s",
          "high_s")


def check_report(report, where: str) -> dict:
    """A report written by servesim (simulate, sweep, loadgen --json), or edited by hand: its
    sections are objects and every figure a finite number, non-negative where it is a count, a
    rate or a time, and within reason."""
    if not isinstance(report, dict):
        raise UserError(f"{where}: expected a JSON object like simulate or loadgen --json writes")

    def check(value, path: str) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                check(inner, f"{path}.{key}" if path else str(key))
        elif isinstance(value, list):
            return                    # per-request arrays: read by compare, which checks them itself
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            name = path.rsplit(".", 1)[-1]
            low = -1e15 if name in SIGNED else 0
            if not (math.isfinite(value) and low <= value <= 1e15):
                raise UserError(f"{where}: {path} is {value!r}; expected a finite number"
                                + ("" if name in SIGNED else " >= 0"))
    for section in REPORT_SECTIONS:
        if report.get(section) is not None and not isinstance(report[section], dict):
            raise UserError(f"{where}: {section} must be an object, got {str(report[section])[:40]}")
    # A --seeds report's counts are the seeds' means, not whole numbers.
    count = (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)) if report.get("seeds") else \
        (lambda v: isinstance(v, int) and not isinstance(v, bool))
    for key in ("completed", "failed", "total_input_tokens", "total_output_tokens"):
        if key in report and not count(report[key]):
            raise UserError(f"{where}: {key} must be a whole number, got {got(report[key])}")
    for key, value in report.items():
        if (key.endswith("_ms") or key.endswith("_throughput") or key == "duration") and value is not None \
                and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            raise UserError(f"{where}: {key} must be a number, got {got(value)}")
    timings = report.get("timings") or {}
    for key, value in timings.items():
        if key.endswith("_ms") and not isinstance(value, dict):
            raise UserError(f"{where}: timings.{key} must be an object of percentiles")
    check({k: v for k, v in report.items() if k != "side_by_side"}, "")
    return report


@dataclass
class MeasuredRun:
    name: str
    requests: list                    # Request-like records: sent_s, first/last_token_s, lengths, error
    settings: dict = field(default_factory=dict)   # RunSpec fields the run recorded (knobs, presets)
    timeline: list = field(default_factory=list)   # the server's own per-second stats, if logged
    notes: list = field(default_factory=list)      # what the reader had to assume
    # Its rates as the file states them, where its send times were made up (no start_times): a
    # rate summed from stand-in arrivals would be servesim's guess shown as measured.
    stated_rates: Optional[dict] = None
    # Its KV blocks are a servesim report's own fixed cache: what they leave of memory was said
    # when the report was made.
    simulated_cache: bool = False


# How vLLM's logs and bench files name what servesim has presets for.
KNOWN_MODELS = {"meta-llama/llama-3.1-8b": "llama-3.1-8b", "meta-llama/llama-3.1-8b-instruct": "llama-3.1-8b",
                "meta-llama/llama-3.1-70b": "llama-3.1-70b", "meta-llama/llama-3.1-70b-instruct": "llama-3.1-70b",
                "qwen/qwen2.5-7b": "qwen2.5-7b", "qwen/qwen2.5-7b-instruct": "qwen2.5-7b",
                "meta-llama/llama-3.3-70b-instruct": "llama-3.3-70b", "qwen/qwen3-8b": "qwen3-8b",
                "qwen/qwen3-32b": "qwen3-32b", "qwen/qwen3-30b-a3b": "qwen3-30b-a3b",
                "qwen/qwen3-30b-a3b-instruct-2507": "qwen3-30b-a3b", "openai/gpt-oss-20b": "gpt-oss-20b",
                "openai/gpt-oss-120b": "gpt-oss-120b"}


KNOWN_DEVICES = {"nvidia geforce rtx 4090": "rtx-4090-24gb", "nvidia h100 80gb hbm3": "h100-sxm-80gb",
                 "nvidia a100-sxm4-80gb": "a100-sxm-80gb", "nvidia l4": "l4-24gb", "nvidia h200": "h200-141gb",
                 "nvidia l40s": "l40s-48gb", "nvidia rtx pro 6000 blackwell workstation edition": "rtx-pro-6000-96gb",
                 "nvidia rtx pro 6000 blackwell server edition": "rtx-pro-6000-server-96gb", "nvidia b200": "b200-180gb",
                 "amd instinct mi300x": "mi300x-192gb"}


def measured_request(index: int, sent: float, first: Optional[float], last: Optional[float], prompt: int,
                     output: int, error: Optional[str] = None, gaps: Optional[list] = None) -> Request:
    request = Request(index, max(1, prompt), max(1, output), sent_s=sent)
    request.first_token_s, request.last_token_s, request.error = first, last, error
    if gaps is not None and first is not None:
        request.token_times = list(itertools.accumulate(gaps, initial=first))
    return request


def read_run(path: str) -> MeasuredRun:
    """A measured run from a directory or a requests.jsonl with meta.json (vLLM's per-request
    stats, as published runs record them), a loadgen --detailed report, or a vllm bench serve
    --save-result --save-detailed JSON."""
    if os.path.isdir(path):
        return read_request_log(os.path.join(path, "requests.jsonl"))
    if path.endswith(".jsonl"):
        return read_request_log(path)
    report = parse_json(read_text(path, "run"), f"run {path}", "pass a requests.jsonl, a loadgen --detailed "
                        "report or a vllm bench serve --save-detailed result")
    if not isinstance(report, dict) or not isinstance(report.get("input_lens"), list):
        raise UserError(f"run {path}: no per-request arrays (input_lens, ...); save the run with loadgen --detailed "
                        f"or vllm bench serve --save-result --save-detailed")
    return run_from_report(report, os.path.basename(path))


def run_files(path: str) -> list[str]:
    """The files read_run reads for a run given as `path`."""
    if os.path.isdir(path) or path.endswith(".jsonl"):
        folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
        log = os.path.join(path, "requests.jsonl") if os.path.isdir(path) else path
        return [log, os.path.join(folder, "meta.json"), os.path.join(folder, "timeseries.csv")]
    return [path]


SERVER_SHAPE = {"max_num_seqs": (1, 65536), "kv_tokens": (1, 65536 * 10**8), "max_num_batched_tokens": (1, 10**7),
                "block_size": (1, 2**20)}


def request_entry(report: dict, key: str, i: int, n: int, where: str):
    """Request i's entry of an optional per-request array of a report (None: no array, or none
    for it); an array of another length than input_lens is a one-line error."""
    kept = report.get(key)
    if kept is None:
        return None
    if not isinstance(kept, list) or len(kept) != n:
        raise UserError(f"{where}: {key} must be a list as long as input_lens ({n})")
    return kept[i]


def failed_streamed(report: dict, i: int, n: int, where: str) -> Optional[tuple]:
    """(tokens, ttft) that failed request i streamed before it failed, as loadgen --detailed keeps
    it (failed_streamed), or None."""
    entry = request_entry(report, "failed_streamed", i, n, where)
    if entry is None:
        return None
    tokens, ttft = (entry.get("tokens"), entry.get("ttft")) if isinstance(entry, dict) else (None, None)
    if type(tokens) is not int or not 1 <= tokens <= 10**8 or isinstance(ttft, bool) \
            or not isinstance(ttft, (int, float)) or not math.isfinite(ttft) or not 0 <= ttft <= MAX_ARRIVAL_S:
        raise UserError(f"{where}: failed_streamed[{i}] must be null or {{\"tokens\": 1 to 100,000,000, "
                        f"\"ttft\": seconds}}, got {printable(str(entry)[:60])}")
    return tokens, float(ttft)


def failed_end(report: dict, i: int, n: int, where: str) -> Optional[float]:
    """When failed request i ended, in seconds from its send (loadgen --detailed's failed_ends), or None."""
    end = request_entry(report, "failed_ends", i, n, where)
    if end is not None and (isinstance(end, bool) or not isinstance(end, (int, float)) or not math.isfinite(end)
                            or not 0 <= end <= MAX_ARRIVAL_S):
        raise UserError(f"{where}: failed_ends[{i}] must be null or seconds from 0 to a year, got "
                        f"{printable(str(end)[:40])}")
    return None if end is None else float(end)


STATED_RATES = ("duration", "request_throughput", "output_throughput", "total_token_throughput", "request_goodput")


# What a servesim report's config says of the deployment that prices a step (the rest is the
# workload's), and of its scheduler: explain prices the first, compare replays both.
REPORT_DEPLOYMENT = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "enable_expert_parallel",
                     "quantization", "kv_cache_dtype", "cost_model", "async_scheduling", "block_size",
                     "gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens", "speculative_tokens",
                     "acceptance_rate", "kv_offloading_size", "kv_offloading_backend")
REPORT_SCHEDULING = ("prefix_caching", "chunked_prefill", "reserve_full_isl", "max_model_len", "router", "batching",
                     "kv_layout", "max_tokens_in_flight", "gpus_per_node", "inter_node_gbs", "inter_node_latency_us")
REPORT_SETTINGS = REPORT_DEPLOYMENT + REPORT_SCHEDULING


def run_from_report(report: dict, name: str, kind: str = "run") -> MeasuredRun:
    """loadgen --detailed and vllm bench serve --save-detailed share these arrays (seconds)."""
    keys = ("input_lens", "output_lens", "ttfts", "itls", "start_times", "errors")
    columns = {k: report.get(k) for k in keys}
    if not isinstance(columns["input_lens"], list) or not columns["input_lens"]:
        raise UserError(f"{kind} {name}: no requests in it (input_lens is "
                        f"{'empty' if columns['input_lens'] == [] else 'not a list'})")
    n = len(columns["input_lens"])
    for k in ("output_lens", "ttfts", "itls"):     # without them no request has a length, a TTFT or an end
        if columns[k] is None:
            raise UserError(f"{kind} {name}: no {k} array; loadgen --detailed and vllm bench serve --save-detailed "
                            f"save input_lens, output_lens, ttfts and itls")
    for k, values in columns.items():
        if values is not None and (not isinstance(values, list) or len(values) != n):
            raise UserError(f"{kind} {name}: {k} must be a list as long as input_lens ({n})")
    config = report.get("config")
    if config is not None and not isinstance(config, dict):
        raise UserError(f"{kind} {name}: config must be an object, got {str(config)[:40]}")
    config = config or {}
    notes = []
    starts = columns["start_times"]
    if starts is None:
        rate = report.get("request_rate") or config.get("request_rate")
        if rate is None or rate == "inf":     # (vllm bench serve writes "inf" for all at once)
            raise UserError(f"{kind} {name}: no start_times and no finite request_rate; newer vllm bench serve and "
                            f"loadgen --detailed save start_times")
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 1e-6 <= rate <= 1e6:
            raise UserError(f"{kind} {name}: no start_times, and request_rate must be from 1e-06 to 1,000,000 "
                            f"requests/s (as --rate), got {printable(str(rate)[:40])}")
        starts = arrival_times(n, random.Random(0), rate)
        notes.append(f"no start_times in the file: Poisson arrivals at its request_rate {rate:g}/s stand in, and "
                     f"the measured rates are the file's own")
        stated = {}
        for key in STATED_RATES:
            value = report.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value) or value < 0):
                raise UserError(f"{kind} {name}: {key} must be a number of at least 0, got {str(value)[:40]}")
            stated[key] = value
    else:
        stated = None
    # A value is named by its array and index (from 0), as the file holds it: "input_lens[3]".
    def count(value, what: str, low: int) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or \
                not low <= value <= 10**8:
            raise UserError(f"{kind} {name}: {what} must be a whole number from {low} to 100,000,000, "
                            f"got {str(value)[:40]}")
        return int(value)

    def seconds(value, what: str, high: float = MAX_ARRIVAL_S) -> float:
        # A TTFT or a gap is held to a year, as the arrivals are. Start times are read off a clock
        # (time.perf_counter for vllm bench serve and loadgen) that does not run below 0: 10^10 s.
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not 0 <= value <= high:
            shown = repr(value[:40]) if isinstance(value, str) else str(value)[:40]
            bound = f"0 to a year ({high:,.0f})" if high == MAX_ARRIVAL_S else f"0 to {high:g}"
            raise UserError(f"{kind} {name}: {what} must be a number of seconds from {bound}, "
                            f"got {shown}")
        return float(value)

    starts = [seconds(t, f"start_times[{i}]", 10**10) for i, t in enumerate(starts)]
    began = config.get("started_perf")
    if isinstance(began, (int, float)) and not isinstance(began, bool) and math.isfinite(began):
        # loadgen sends nothing before it starts: an earlier start time is an edited one, and
        # would stretch the run (a start 100 s early merged into a 22-hour run).
        early = next((i for i, t in enumerate(starts) if t < began - 1), None)
        if early is not None:
            raise UserError(f"{kind} {name}: start_times[{early}] ({starts[early]:g}) is before the run started "
                            f"({began:g}, config.started_perf)")
    first_start = min(starts) if starts else 0.0
    if starts and max(starts) - first_start > MAX_ARRIVAL_S:
        raise UserError(f"{kind} {name}: its start_times span more than a year")
    # The end-to-end times are worked out from ttfts and itls; where the report has its own, each
    # must be a time, and one no shorter than its request's TTFT.
    latencies = report.get("latencies")
    if latencies is not None and (not isinstance(latencies, list) or len(latencies) != n):
        raise UserError(f"{kind} {name}: latencies must be a list as long as input_lens ({n})")
    requests = []
    for i in range(n):
        error = (columns["errors"] or [""] * n)[i] or None
        if error is not None and not isinstance(error, str):
            raise UserError(f"{kind} {name}: errors[{i}] must be text (or empty), got {printable(str(error)[:40])}")
        ttft = columns["ttfts"][i]
        failed = bool(error) or ttft is None
        # A failed request may have sent nothing the server counted: 0 tokens is then its length.
        prompt = count(columns["input_lens"][i], f"input_lens[{i}]", 0 if failed else 1)
        output = count(columns["output_lens"][i], f"output_lens[{i}]", 0)
        sent = starts[i] - first_start
        if failed:
            requests.append(measured_request(i, sent, None, None, prompt, output, str(error or "failed")))
            requests[-1].streamed = failed_streamed(report, i, n, f"{kind} {name}")
            ended = failed_end(report, i, n, f"{kind} {name}")
            if ended is not None:
                requests[-1].ended_s = sent + ended
            continue
        gaps = columns["itls"][i]
        if not isinstance(gaps, list):
            raise UserError(f"{kind} {name}: itls[{i}] must be a list of seconds between tokens, got "
                            f"{printable(str(gaps)[:40])!r}")
        gaps = [seconds(g, f"itls[{i}][{k}]") for k, g in enumerate(gaps)]
        if len(gaps) > max(0, output - 1):       # a gap is between two of its tokens (0 tokens: none)
            raise UserError(f"{kind} {name}: itls[{i}] has {len(gaps):,} gaps between tokens where output_lens[{i}] "
                            f"is {output:,} tokens; each gap is between two of them, so one of the two is wrong")
        first = sent + seconds(ttft, f"ttfts[{i}]")
        latency = latencies[i] if latencies else None
        if latency is not None and seconds(latency, f"latencies[{i}]") < first - sent - 0.001:
            raise UserError(f"{kind} {name}: latencies[{i}] ({latency:g} s) is shorter than ttfts[{i}] "
                            f"({first - sent:g} s): the two cannot be of one request")
        requests.append(measured_request(i, sent, first, first + sum(gaps), prompt, output, None, gaps))
        answer = (report.get("ttfas") or [None] * n)[i] if isinstance(report.get("ttfas"), list) \
            and len(report["ttfas"]) == n else None
        if answer is not None:        # a reasoning model's first answer token, where the report times it
            requests[-1].answer_s = sent + max(seconds(answer, f"ttfas[{i}]"), first - sent)
            requests[-1].reasoning_tokens = 1
    streamed = [r for r in requests if r.error is None and r.output_tokens > 1]
    if streamed and not any(len(r.token_times or ()) > 1 for r in streamed):
        notes.append("itls holds no gap for any request of two tokens or more: its tokens came in one piece, so its "
                     "measured E2E is its TTFT and it has no measured TPOT")
    # A servesim report (its config names an engine, or null for the lesson's) records its whole
    # deployment; a loadgen or vllm bench report at most its server's batch limits.
    simulated = "engine" in config and "cost_model" in config
    settings = {k: recorded_setting(k, config[k], f"{kind} {name}", f"config.{k}")
                for k in (REPORT_SETTINGS if simulated else ("max_num_seqs", "max_num_batched_tokens"))
                if config.get(k) is not None and k in SETTINGS}
    if simulated and config.get("disaggregated"):     # (its prefill engine's device is not in the report)
        notes.append("the run was disaggregated (--disaggregate): it is replayed on one engine unless --disaggregate "
                     "and its devices are given")
    engine, = config_names(config, ("engine",), f"{kind} {name}", "an engine's name") if simulated else (None,)
    if engine in ENGINES and not config.get("engine_base"):     # (a profile file records the engine it is based on)
        settings["engine"] = engine
    elif engine is not None:
        notes.append(f"the run's engine profile {printable(str(engine)[:60])!r} is a file the report does not hold: "
                     f"its rules and costs are vLLM's unless --engine names the file")
    if simulated and config.get("kv_cache_fixed") is True and not config.get("disaggregated"):
        # The cache --kv-tokens or --num-gpu-blocks fixed (else its plan's, which the replay plans
        # again): a changed deployment drops it.
        tokens, size = (recorded_setting(k, config.get(k), f"{kind} {name}", f"config.{k}")
                        for k in ("kv_tokens", "block_size"))
        if size and tokens % size == 0:
            settings["num_gpu_blocks"] = tokens // size
    draft = config.get("draft_model") if simulated else None
    if isinstance(draft, str) and draft in MODELS:
        settings["draft_model"] = MODELS[draft]
    elif draft is not None:
        notes.append(f"the run's draft model {printable(str(draft)[:60])!r} is not a preset, and the report holds "
                     f"no file of it: it is replayed with n-gram proposals, which cost nothing")
    # What ran: servesim's and loadgen's config name a preset, vllm bench serve its model_id.
    for key, said in (("model_name", config.get("model") or report.get("model_id")),
                      ("named_device", config.get("hardware"))):
        if isinstance(said, str) and said.strip():
            settings[key] = said.strip()
    server = report.get("server")
    shape = server.get("shape") if isinstance(server, dict) else None
    if server is not None and not isinstance(server, dict) or shape is not None and not isinstance(shape, dict):
        raise UserError(f"{kind} {name}: server and server.shape must be objects, as loadgen writes them")
    if isinstance(shape, dict) and "unknown" in shape:
        notes.append(f"the server's shape is unknown ({printable(str(shape['unknown'])[:400])}): servesim's defaults "
                     f"stand in; pass --max-num-seqs and --kv-tokens as the server ran")
    elif isinstance(shape, dict):       # loadgen kept the server's /props or vLLM's cache config
        for key, (low, high) in SERVER_SHAPE.items():
            value = shape.get(key)
            if value is None and key != "kv_tokens":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise UserError(f"{kind} {name}: server.shape.{key} must be a whole number from {low:,} to {high:,}, "
                                f"got {str(value)[:40]}")
            settings[key] = value
        if "block_size" in shape:     # vLLM's: its block count, which a changed deployment drops (recorded_spec)
            if settings["kv_tokens"] % shape["block_size"] or settings["kv_tokens"] < shape["block_size"]:
                raise UserError(f"{kind} {name}: server.shape.kv_tokens {settings['kv_tokens']:,} is not a whole "
                                f"number of its {shape['block_size']:,}-token blocks; a cache holds whole blocks")
            settings["num_gpu_blocks"] = settings.pop("kv_tokens") // shape["block_size"]
        elif settings["kv_tokens"] < max(16, settings.get("max_num_seqs", 1)):
            # (llama.cpp's: its context, split over its slots; servesim keeps it in 16-token blocks)
            raise UserError(f"{kind} {name}: server.shape.kv_tokens {settings['kv_tokens']:,} is less than a "
                            f"16-token KV block, or a token for each of its {settings.get('max_num_seqs', 1):,} "
                            f"slots: no server serves from such a cache, so the report's shape is not a server's")
        if "prefix_caching" in shape:
            if not isinstance(shape["prefix_caching"], bool):
                raise UserError(f"{kind} {name}: server.shape.prefix_caching must be true or false, "
                                f"got {str(shape['prefix_caching'])[:40]}")
            settings["prefix_caching"] = shape["prefix_caching"]
        source = shape.get("source", "/props")
        said = ([f"{shape['max_num_seqs']} slots"] if "max_num_seqs" in shape else []) \
            + [f"{shape['kv_tokens']:,} KV tokens"] \
            + ([f"{shape['block_size']}-token blocks"] if "block_size" in shape else []) \
            + ([f"prefix caching {'on' if shape['prefix_caching'] else 'off'}"] if "prefix_caching" in shape else [])
        notes.append(f"the server's shape as loadgen read it from {printable(str(source)[:60])}: {', '.join(said)}")
    return MeasuredRun(name, requests, settings, [], notes, stated, simulated_cache="num_gpu_blocks" in settings
                       and simulated)


def read_request_log(path: str) -> MeasuredRun:
    """vLLM's per-request stats as JSONL (input_toks, output_toks, queued_ts, first_token_ts,
    last_token_ts), with the engine's settings from meta.json and its per-second stats from
    timeseries.csv beside it, as published runs record them."""
    requests, sends, columns = [], [], set()
    for where, row in read_jsonl(path, "run", text_lines(path, "run", TRACE_LINE_BYTES)):
        if not isinstance(row, dict):
            raise UserError(f"{where}: expected a JSON object")
        columns.update(row)
        prompt = trace_number(where, row, "input_toks", 0, 10**8)
        output = trace_number(where, row, "output_toks", 0, 10**8)
        sent = trace_number(where, row, "queued_ts", 0, 1e11, whole_number=False)     # seconds, engine clock
        first, last = None, None
        # A failed request has neither time (absent or null); one of them alone, or a time that is
        # not a number (0 included where nothing was queued before it), is refused, not a failure.
        if row.get("first_token_ts") is not None or row.get("last_token_ts") is not None:
            absent = next((key for key in ("first_token_ts", "last_token_ts") if key not in row), None)
            if absent:        # a column renamed or dropped, more likely than one time of a request lost
                raise UserError(f"{where}: no {absent} beside the other time; vLLM's per-request stats give input_toks, "
                                f"output_toks, queued_ts, first_token_ts and last_token_ts (a failed request has "
                                f"neither time, or both null)")
            first = trace_number(where, row, "first_token_ts", 0, 1e11, whole_number=False)
            last = trace_number(where, row, "last_token_ts", 0, 1e11, whole_number=False)
            if not sent <= first <= last:
                raise UserError(f"{where}: the times must run queued_ts <= first_token_ts <= last_token_ts, got "
                                f"{sent:g}, {first:g}, {last:g}")
            if prompt < 1 or output < 1:       # (0 is a failed request's, which has no token times)
                raise UserError(f"{where}: input_toks {prompt} and output_toks {output} beside token times; a request "
                                f"that streamed had a prompt token and an output token at least")
        sends.append(sent)
        requests.append((len(requests), sent, first, last, prompt, output))
    if not requests:
        raise UserError(f"run {path}: no requests in it")
    if not any(first is not None for _, _, first, _, _, _ in requests):
        missing = [key for key in ("first_token_ts", "last_token_ts") if key not in columns]
        if missing:       # not a run whose requests all failed: a file without the columns
            raise UserError(f"run {path}: no row has {' or '.join(missing)}; vLLM's per-request stats give "
                            f"input_toks, output_toks, queued_ts, first_token_ts and last_token_ts")
    t0 = min(sends)
    ends = [last for _, _, _, last, _, _ in requests if last is not None]
    if max(sends + ends) - t0 > MAX_ARRIVAL_S:
        raise UserError(f"run {path}: its requests span more than a year (queued_ts from {t0:g} to "
                        f"{max(sends + ends):g} s); servesim compares up to a year")
    measured = [measured_request(i, sent - t0, None if first is None else first - t0, None if last is None else last - t0,
                                 prompt, output, None if first is not None else "failed: no token times")
                for i, sent, first, last, prompt, output in requests]
    run_ = MeasuredRun(os.path.basename(os.path.dirname(os.path.abspath(path))) or path, measured)
    folder = os.path.dirname(os.path.abspath(path))
    meta_path = os.path.join(folder, "meta.json")
    if os.path.exists(meta_path):
        run_.settings = settings_from_meta(parse_json(read_text(meta_path, "meta"), f"meta {meta_path}",
                                                      "expected the run's meta.json"), meta_path)
    else:
        run_.notes.append("no meta.json beside the requests: the engine's settings are servesim's defaults and flags")
    series = os.path.join(folder, "timeseries.csv")
    if os.path.exists(series):
        run_.timeline = read_timeline(series)
        if not run_.timeline:
            run_.notes.append("timeseries.csv has a header and no rows: running, waiting and KV use have no measured "
                              "figures")
        kv = max((t.get("kv_cache_pct", 0) for t in run_.timeline), default=0)
        if 0 < kv <= 1:
            run_.notes.append(f"timeseries.csv's kv_cache_pct never passes {kv:g}: it reads as a percent, so a "
                              f"fraction (vLLM's vllm:kv_cache_usage_perc gauge is 0 to 1) is 100 times too small; "
                              f"multiply the column by 100")
    return run_


SIXTEEN_BITS = ("auto", "bfloat16", "float16", "half")     # vLLM's --dtype and --kv-cache-dtype words for 16 bits


def settings_from_meta(meta: dict, where: str) -> dict:
    """The RunSpec fields a run's meta.json records (vLLM's engine arguments and KV plan), each
    held to what its flag accepts."""
    if not isinstance(meta, dict):
        raise UserError(f"{where}: expected a JSON object")

    def section(parent: dict, key: str, label: str) -> dict:
        value = parent.get(key)
        if value is not None and not isinstance(value, dict):
            raise UserError(f"{where}: {label} must be an object, got {str(value)[:40]}")
        return value or {}
    engine = section(meta, "engine_kwargs", "engine_kwargs")
    kv = section(meta, "kv_cache", "kv_cache")
    scheduler = section(section(meta, "resolved_config", "resolved_config"), "scheduler_config",
                        "resolved_config.scheduler_config")
    device = section(meta, "hardware", "hardware")
    recorded = {   # setting: (section, its key there, the section's name)
        "max_num_seqs": (engine, "max_num_seqs", "engine_kwargs"),
        "max_num_batched_tokens": (engine, "max_num_batched_tokens", "engine_kwargs"),
        "max_model_len": (engine, "max_model_len", "engine_kwargs"),
        "tensor_parallel_size": (engine, "tensor_parallel_size", "engine_kwargs"),
        "data_parallel_size": (engine, "data_parallel_size", "engine_kwargs"),
        "enable_expert_parallel": (engine, "enable_expert_parallel", "engine_kwargs"),
        "kv_offloading_size": (engine, "kv_offloading_size", "engine_kwargs"),        # a host tier, vLLM's flags
        "kv_offloading_backend": (engine, "kv_offloading_backend", "engine_kwargs"),
        "num_gpu_blocks": (kv, "num_gpu_blocks", "kv_cache"), "block_size": (kv, "block_size", "kv_cache"),
        "prefix_caching": (kv, "enable_prefix_caching", "kv_cache"),
        "gpu_memory_utilization": (kv, "gpu_memory_utilization", "kv_cache"),
        "reserve_full_isl": (scheduler, "scheduler_reserve_full_isl", "resolved_config.scheduler_config"),
        "chunked_prefill": (scheduler, "enable_chunked_prefill", "resolved_config.scheduler_config"),
    }
    found = {name: recorded_setting(name, part[key], where, f"{label}.{key}")
             for name, (part, key, label) in recorded.items() if part.get(key) is not None}
    for key, value in (("model", meta.get("model") or engine.get("model")), ("kv_cache_dtype", engine.get("kv_cache_dtype")),
                       ("device_name", device.get("device_name"))):
        if value is not None and not isinstance(value, str):
            raise UserError(f"{where}: {key} must be a string, got {str(value)[:40]}")
    for key in ("quantization", "dtype"):
        if engine.get(key) is not None and not isinstance(engine[key], str):
            raise UserError(f"{where}: engine_kwargs.{key} must be a string, got {str(engine[key])[:40]}")
    cache = engine.get("kv_cache_dtype")
    if cache is not None:     # "auto" or the model's own dtype: not FP8
        if not (cache.startswith("fp8") or cache in SIXTEEN_BITS):
            raise UserError(f"{where}: engine_kwargs.kv_cache_dtype {printable(cache[:40])!r} is none of vLLM's "
                            f"(auto, bfloat16, float16, fp8 and its variants)")
        found["kv_cache_dtype"] = "fp8" if cache.startswith("fp8") else "auto"
    if engine.get("quantization") is not None:
        try:
            found["quantization"] = quantization_flag(engine["quantization"])
        except argparse.ArgumentTypeError:
            # A checkpoint's own format (mxfp4, compressed-tensors, modelopt): its bytes are the model
            # preset's (or a model file's), which says them.
            sys.stderr.write(f"servesim: {where}: engine_kwargs.quantization "
                             f"{printable(engine['quantization'][:40])!r} is a checkpoint's own format, not one "
                             f"servesim prices by name: the weights are priced as the model preset (or --model "
                             f"FILE) gives them\n")
    if engine.get("dtype") is not None and engine["dtype"] not in SIXTEEN_BITS:
        raise UserError(f"{where}: engine_kwargs.dtype {printable(engine['dtype'][:40])!r}: servesim prices weights "
                        f"in 16 bits (auto, bfloat16, float16) or as --quantization says")
    found["model_name"] = (meta.get("model") or engine.get("model") or "").lower()
    found["device_name"] = (device.get("device_name") or "").lower()
    memory = device.get("device_total_memory_bytes")
    if memory is not None:
        low, high, _ = PRESET_RANGES["memory_gib"]
        if isinstance(memory, bool) or not isinstance(memory, (int, float)) or not low <= memory / GIB <= high:
            raise UserError(f"{where}: hardware.device_total_memory_bytes must be a device's memory in bytes, "
                            f"{low:g} to {high:,} GiB, got {str(memory)[:40]}")
        found["device_bytes"] = memory
    if found.get("kv_offloading_size") and found.get("prefix_caching") is False:
        # (said here, naming the file: check_spec's line would tell the user to add a flag compare lacks)
        raise UserError(f"{where}: engine_kwargs.kv_offloading_size {found['kv_offloading_size']:g} with "
                        f"kv_cache.enable_prefix_caching false: servesim's host tier holds prefix-cached blocks, "
                        f"so it cannot replay one without them; set one of the two as the server ran")
    return {k: v for k, v in found.items() if v is not None and v != ""}


def config_names(config: dict, keys: tuple, where: str, what: str = "a name") -> list:
    """A report's config's names (its model, device, engine), each text or absent: an edited
    report's number or object in their place is refused."""
    for key in keys:
        if config.get(key) is not None and not isinstance(config[key], str):
            raise UserError(f"{where}: config.{key} must be {what}, got {printable(str(config[key])[:40])!r}")
    return [config.get(key) for key in keys]


def recorded_setting(name: str, value, where: str, label: str):
    """A setting a measured run recorded, held to what its flag accepts: the same type (a JSON
    true or false for a switch, a number for a number) and the same range."""
    f = SETTINGS[name]
    if f.metadata["switch"] or f.metadata["kind"] is None:
        if not isinstance(value, bool):
            raise UserError(f"{where}: {label} must be true or false, got {got(value)}")
        return value
    if f.type in ("str", "Optional[str]"):      # a word (--quantization fp8), never a file's path: a report names no file
        if not isinstance(value, str) or os.sep in value or (os.altsep and os.altsep in value):
            raise UserError(f"{where}: {label} must be one of the words {f.metadata['flag']} takes, got "
                            f"{printable(str(value)[:40])!r}")
        try:
            return f.metadata["kind"](value)
        except argparse.ArgumentTypeError as e:
            raise UserError(f"{where}: {label} {e}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserError(f"{where}: {label} must be a number, got {got(value)}")
    try:
        return f.metadata["kind"](str(value))
    except argparse.ArgumentTypeError as e:
        raise UserError(f"{where}: {label} {e} (the range {f.metadata['flag']} takes)") from None


TIMELINE_FIGURES = ("running", "waiting", "kv_cache_pct")      # vLLM's logged stats compare sets beside its own


def read_timeline(path: str) -> list[dict]:
    """vLLM's logged per-second stats: every figure a finite number, none negative, KV use a percent;
    a header without one of the figures compare reads is refused (its rows would all be left out)."""
    rows = []
    for number, row in csv_rows(io.StringIO(read_text(path, "timeseries")), f"timeseries {path}"):
        row = {k.lower() if k else k: v for k, v in row.items()}       # (its columns in any case)
        if not rows and not set(row) & set(TIMELINE_FIGURES):
            raise UserError(f"timeseries {path}: its header ({printable(', '.join(str(k) for k in row))[:80]}) has "
                            f"none of {', '.join(TIMELINE_FIGURES)}, the figures compare reads")
        try:
            values = {k: float(v) for k, v in row.items() if k}
        except (TypeError, ValueError):
            raise UserError(f"timeseries {path} line {number}: expected numbers") from None
        for k, v in values.items():
            if not (math.isfinite(v) and 0 <= v <= (100 if k == "kv_cache_pct" else 1e15)):
                raise UserError(f"timeseries {path} line {number}: {k} is {v:g}; expected a finite number from 0 "
                                f"to {'100 (a percent)' if k == 'kv_cache_pct' else '10^15'}")
            if k in ("running", "waiting") and v != int(v):
                raise UserError(f"timeseries {path} line {number}: {k} is {v:g}; requests come whole")
        if rows and "t" in values and "t" in rows[-1] and values["t"] <= rows[-1]["t"]:
            raise UserError(f"timeseries {path} line {number}: t is {values['t']:g}, not after the line before's "
                            f"{rows[-1]['t']:g}; the seconds must run in order, one row each")
        rows.append(values)
    return rows


def csv_rows(lines: Iterable[str], where: str, columns: tuple = ()) -> Iterator[tuple[int, dict]]:
    """(line number, row) of a CSV file with a header, every CSV servesim reads: blank lines before
    the header are none, a space after a comma is no part of a name or a number, and `columns` are
    found in any case (`TIMESTAMP`, `Time_s`) and named as given. A header without one of them (a
    comment line above it, say), a row with fewer cells than the header, a field too long for the
    csv module or a broken quote is a one-line error. Cells past the header's are under the key
    None, for the caller to count or refuse."""
    lines, skipped = iter(lines), 0
    first = next(lines, "")
    while first and not first.strip():
        first, skipped = next(lines, ""), skipped + 1
    if not first:
        raise UserError(f"{where}: empty; its first line names the columns" + (f", {','.join(columns)}" if columns else ""))
    reader = csv.DictReader(itertools.chain([first] if first else [], lines), skipinitialspace=True)
    number = lambda: reader.line_num + skipped
    try:
        header = [name.strip() for name in reader.fieldnames or []]
        twice = [name for i, name in enumerate(header) if name and name.lower() in {h.lower() for h in header[:i]}]
        if twice:        # (a reader keeps the last of the two: which one was meant is not ours to guess)
            raise UserError(f"{where} line {number()}: the header names the column {printable(twice[0][:40])!r} twice; "
                            f"keep the one you mean")
        named = {name.lower(): name for name in header}
        wanted = {named.get(name.lower()): name for name in columns}
        reader.fieldnames = [wanted.get(name, name) for name in header]
        missing = [name for name in columns if name not in reader.fieldnames]
        if missing:
            shown = printable(",".join(header))
            raise UserError(f"{where} line {number()}: the header {shown if len(shown) <= 120 else shown[:120] + ' ...'!r} "
                            f"has no {' or '.join(missing)} column; the first line names the columns, {','.join(columns)}")
        for row in reader:
            if any(row.get(name) is None for name in columns or header):     # (one it does not read may be missing)
                cells = len([v for v in row.values() if v is not None])
                raise UserError(f"{where} line {number()}: {cells} cell{'s' * (cells != 1)} where the header has "
                                f"{len(header)} columns")
            yield number(), row
    except csv.Error as e:
        raise UserError(f"{where} line {number()}: not readable as CSV ({e})") from None


# What a terminal acts on instead of printing (C0 and C1 controls: ESC starts a sequence that can
# set the window title or clear the screen; bidirectional overrides reorder what is shown), and
# what no encoding can write (a lone surrogate, which JSON's \ud800 escape makes).
UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def got(value) -> str:
    """A value a reader refused, as its message shows it: text in quotes, and a number written as
    text said to be one (`"12.7"` printed bare reads as if 12.7 itself were refused)."""
    if isinstance(value, str):
        try:
            float(value)
            return f"{printable(value[:40])!r} (text: write the number without quotes)"
        except ValueError:
            return repr(printable(value[:40]))
    if isinstance(value, bool) or value is None:      # as the JSON file writes it
        return json.dumps(value)
    return printable(str(value)[:40])


def signed(x: float, digits: int) -> str:
    """x with its sign, to `digits` decimals; one that rounds to zero is +0 (not -0.000)."""
    return f"{round(x, digits) + 0.0:+.{digits}f}"


def printable(text: str) -> str:
    """Text from a server, safe to print, store and draw: whitespace controls become spaces, the
    other characters above their escapes (\\x1b, \\ud800)."""
    def escaped(match) -> str:
        c = match.group()
        return " " if c in "\t\n\r" else f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"
    return UNPRINTABLE.sub(escaped, text)


@dataclass
class PublishedRun:
    """A published run as servesim replays it: where it comes from, the deployment, the load, and
    what was measured (summarize()'s keys)."""
    source: str                       # the folder of its source: runs of one source are fitted and scored together
    name: str
    engine: str
    engine_version: str
    settings: dict                    # RunSpec fields: hardware and model read, the deployment's knobs
    load: dict                        # {"replay": folder}, {"concurrency", "requests", "warmup", ...} or {"all_at_once", ...}
    measured: dict
    cite: str
    folder: str
    # Settings its page does not print that were read from its own published figures (a bound
    # they break otherwise): its score is then partly in-sample, and validate says so.
    inferred: tuple = ()


# Settings a run's description may not give: validate sets them, or the load does.
NOT_PUBLISHED_SETTINGS = {
    **{name: "the row's engine field names the engine" for name in ("engine",)},
    **{name: "validate's --cost-model chooses it" for name in ("cost_model",)},
    **{name: "the load field describes the load" for name in (
        "rate", "concurrency", "requests", "warmup", "prompt_tokens", "output_tokens", "trace", "rate_profile",
        "ramp_up", "turns", "think_time", "burstiness", "time_scale", "trace_repeats", "prefix_tokens",
        "num_prefixes", "max_model_len", "seed")},
    **{name: "the row's hardware and model fields name them" for name in ("hardware", "model", "decode_hardware",
                                                                          "draft_model")},
    **{name: "it is not part of a deployment" for name in (
        "goodput", "detailed", "price_per_hour", "hours_per_month", "steady_skip", "min_served",
        "max_queue_growth", "simulator", "replica_schedule", "scale_up_delay")},
}
# A published run is replayed whole: these bound one run to minutes, not hours.
PUBLISHED_LOADS = {"concurrency": (1, 4096), "requests": (1, 20_000), "warmup": (0, 20_000),
                   "prompt_tokens": (1, 10**6), "output_tokens": (1, 10**5)}
# The figures a published run may give, each with the range a real server's can lie in: a TPOT
# under 0.1 ms (10,000 tokens a second to one request) is a figure in seconds, not milliseconds.
PUBLISHED_FIGURES = {"output_throughput": (0.01, 1e8), "mean_ttft_ms": (0.1, 1e9), "mean_tpot_ms": (0.1, 1e6),
                     "mean_e2el_ms": (0.1, 1e9)}


def read_corpus(folder: str) -> tuple[list[PublishedRun], list[str]]:
    """Every run in the runs.json of each source folder under `folder`, and the runs skipped, each
    with its reason: a run a reader cannot replay is listed, and the rest still score."""
    if not os.path.isdir(folder):
        raise UserError(f"corpus {folder}: not a directory of sources (each a folder with a runs.json)")
    runs, skipped = [], []
    for source in sorted(os.listdir(folder)):
        path = os.path.join(folder, source, "runs.json")
        if source.startswith(".") or not os.path.isdir(os.path.join(folder, source)):
            continue
        if not os.path.isfile(path):         # a source dropping out of the scores without a word
            skipped.append(f"source {os.path.join(folder, source)}: " + (
                "runs.json is not a regular file" if os.path.lexists(path) else
                "cannot read the folder (permission denied)" if not os.access(os.path.join(folder, source), os.R_OK | os.X_OK)
                else "no runs.json in it"))
            continue
        try:
            data = parse_json(read_text(path, "runs"), f"runs {path}", "expected {\"runs\": [...]}")
            if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
                raise UserError(f"runs {path}: expected an object with a list of runs")
        except UserError as e:      # one broken source is listed; the others still score
            skipped.append(str(e))
            continue
        if not data["runs"]:
            skipped.append(f"source {os.path.join(folder, source)}: its runs.json lists no runs")
        for i, row in enumerate(data["runs"]):
            where = f"runs {path} run {i + 1}"
            try:
                run = published_run(row, source, os.path.join(folder, source), where)
                if any(r.name == run.name for r in runs):     # it would be scored twice, and weigh twice in every median
                    raise UserError(f"{where}: a second run named {run.name}; give each run its own name")
                replays = lambda r: os.path.realpath(os.path.join(r.folder, r.load["replay"])) \
                    if "replay" in r.load else None
                twin = next((r for r in runs if replays(run) and replays(r) == replays(run)), None)
                if twin:                                      # the same measurements under another name
                    raise UserError(f"{where} ({run.name}): replays {run.load['replay']}, which run {twin.name} "
                                    f"replays already; a run is scored once")
                runs.append(run)
            except UserError as e:
                skipped.append(str(e))
    if not runs and os.path.isfile(os.path.join(folder, "runs.json")):
        raise UserError(f"corpus {folder}: this folder is one source; pass the folder that holds the sources "
                        f"({os.path.dirname(os.path.abspath(folder))})")
    if not runs:
        hint = "" if skipped else "; pass the folder that holds the sources, each a folder with a runs.json"
        raise UserError(f"corpus {folder}: no runs to score" + (every_skip(skipped) if skipped else hint))
    return runs, skipped


def every_skip(skipped: list[str], shown: int = 3) -> str:
    """Why each run of a corpus that scores none was skipped, the first few in full: one line
    still, and a corpus skipped for several reasons does not send its author to fix only one."""
    more = f"; and {len(skipped) - shown} more" if len(skipped) > shown else ""
    return f": {len(skipped)} skipped ({'; '.join(skipped[:shown])}{more})"


PUBLISHED_RUN_FIELDS = frozenset(("name", "engine", "engine_version", "hardware", "model", "settings", "load",
                                  "measured", "inferred", "cite"))


def published_run(row, source: str, folder: str, where: str) -> PublishedRun:
    if not isinstance(row, dict) or not isinstance(row.get("name"), str) or not row["name"].strip():
        raise UserError(f"{where}: expected an object with a name")
    where = f"{where} ({printable(row['name'][:80])})"
    unknown = sorted(set(row) - PUBLISHED_RUN_FIELDS)
    if unknown:       # a misspelt "inferred" would score a run as out of sample that is not
        raise UserError(f"{where}: unknown field {printable(unknown[0][:40])!r}; a run has "
                        f"{', '.join(sorted(PUBLISHED_RUN_FIELDS))}")
    engine = row.get("engine")
    for key in ("engine", "hardware", "model"):
        if row.get(key) is not None and not isinstance(row[key], str):
            raise UserError(f"{where}: {key} must be a name, got {printable(str(row[key])[:40])}")
    if engine is None:
        raise UserError(f"{where}: no engine; give the engine it ran on, one of {', '.join(ENGINES)}")
    if engine not in ENGINES:
        raise UserError(f"{where}: engine {printable(engine[:40])!r} has no profile; use one of {', '.join(ENGINES)}")
    given = row.get("settings", {})
    if not isinstance(given, dict):
        raise UserError(f"{where}: settings must be an object of servesim settings")
    unknown = sorted(set(given) - set(SETTINGS))
    if unknown:
        raise UserError(f"{where}: unknown setting {unknown[0]!r}")
    theirs = sorted(set(given) & set(NOT_PUBLISHED_SETTINGS))
    if theirs:
        raise UserError(f"{where}: settings.{theirs[0]} is not a deployment setting: "
                        + NOT_PUBLISHED_SETTINGS[theirs[0]])
    settings = {}
    for name, value in given.items():      # each held to what its flag accepts
        kind = SETTINGS[name].metadata["kind"]
        if isinstance(value, str) and kind is not None and not SETTINGS[name].metadata["switch"]:
            try:
                settings[name] = kind(value)
            except argparse.ArgumentTypeError as e:
                raise UserError(f"{where}: settings.{name} {e}") from None
        else:
            settings[name] = recorded_setting(name, value, where, f"settings.{name}")
    for name, table, cls in (("hardware", HARDWARE, Hardware), ("model", MODELS, ModelSpec)):
        if row.get(name) is not None:
            if row[name] not in table:
                raise UserError(f"{where}: {name} {row[name]!r} has no preset")
            settings[name] = table[row[name]]
    load = row.get("load")
    if not isinstance(load, dict):
        raise UserError(f"{where}: no load to replay")
    odd = sorted(set(load) - {"replay", "all_at_once", *PUBLISHED_LOADS})
    if odd:
        raise UserError(f"{where}: load.{printable(str(odd[0])[:40])} is not a load field; use replay, all_at_once, "
                        f"{', '.join(PUBLISHED_LOADS)}")
    if "all_at_once" in load and not isinstance(load["all_at_once"], bool):
        raise UserError(f"{where}: load.all_at_once must be true or false")
    if "replay" in load and (not isinstance(load["replay"], str) or os.path.isabs(load["replay"])
                             or ".." in load["replay"].split("/")):
        raise UserError(f"{where}: load.replay must name a folder inside the source's folder")
    if "replay" in load:
        if not os.path.isfile(os.path.join(folder, str(load["replay"]), "requests.jsonl")):
            raise UserError(f"{where}: no {load['replay']}/requests.jsonl to replay")
        given_too = sorted(set(load) - {"replay"}) + (["measured"] if "measured" in row else [])
        if given_too:      # they would be ignored: a replay's load and figures are its requests'
            raise UserError(f"{where}: a replayed run's load and measured figures are read from its requests.jsonl: "
                            f"drop {', '.join('load.' + k if k != 'measured' else k for k in given_too)}")
    else:
        for key, (low, high) in PUBLISHED_LOADS.items():
            value = load.get(key, 0 if key == "warmup" else None)
            if key == "concurrency" and load.get("all_at_once"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise UserError(f"{where}: load.{key} must be a whole number from {low:,} to {high:,}")
        if "model" not in settings or "hardware" not in settings:
            raise UserError(f"{where}: a run without per-request data needs its hardware and model")
    measured = row.get("measured") or {}
    unknown = sorted(k for k in measured if k not in PUBLISHED_FIGURES) if isinstance(measured, dict) else []
    if unknown:        # (a misspelt figure would be skipped as missing, or the run as figureless)
        near = difflib.get_close_matches(str(unknown[0]), list(PUBLISHED_FIGURES), 1, 0.6)
        raise UserError(f"{where}: measured.{printable(str(unknown[0]))[:40]} is not a figure validate scores"
                        + (f" (did you mean {near[0]}?)" if near else "") + f"; the figures are "
                        f"{', '.join(PUBLISHED_FIGURES)}")
    if not isinstance(measured, dict) or any(
            isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 for v in measured.values()):
        raise UserError(f"{where}: measured must give positive numbers for some of {', '.join(PUBLISHED_FIGURES)}")
    for key, value in measured.items():
        low, high = PUBLISHED_FIGURES[key]
        if not low <= value <= high:
            unit = "; in seconds? the figures are in milliseconds" if key.endswith("_ms") and value < low else ""
            raise UserError(f"{where}: measured.{key} {value:.4g} is outside what a server can give "
                            f"({low:g} to {high:g}{unit})")
    if not measured and "replay" not in load:
        raise UserError(f"{where}: nothing measured to score")
    for key in ("engine_version", "cite"):
        if row.get(key) is not None and not isinstance(row[key], str):      # null: not known
            raise UserError(f"{where}: {key} must be text (or null), got {type(row[key]).__name__}")
    inferred = row.get("inferred", [])
    if not isinstance(inferred, list) or any(not isinstance(name, str) or name not in given for name in inferred):
        raise UserError(f"{where}: inferred must list settings the run gives (those read from its own figures)")
    return PublishedRun(source, printable(row["name"]), engine, str(row.get("engine_version") or ""), settings, load, measured,
                        str(row.get("cite") or ""), folder, tuple(inferred))


TRACE_FIELDS = {"arrival": float, "prompt_tokens": int, "output_tokens": int,
                "prefix": str, "prefix_tokens": int, "reasoning_tokens": int, "id": str, "parent": str, "delay": float}


# The longest trace row servesim reads: far past any real row, short of one that would fill memory.
TRACE_LINE_BYTES = 1 << 20
MAX_HASH_IDS = 65_536        # a row's hash_ids: 1M tokens at Bailian's 16 a block, 33M at Mooncake's 512


def counted(note: str, count: int) -> str:
    """A reader's note of how many rows it concerns, in the singular for one: {s} a plural's s,
    {are} are or is, {v} a verb's s, {they} and {them} it."""
    one = count == 1
    return note.format(count, s="" if one else "s", are="is" if one else "are", v="s" if one else "",
                       they="it" if one else "they", them="it" if one else "them")


def read_trace(path: str, fmt: str = "auto", limit: Optional[int] = None, cut_by_requests: bool = True) -> Trace:
    """A trace in any of TRACE_FORMATS, as rows of (arrival s, prompt tokens, output tokens,
    content runs). `auto` tells the format from the file's first line. With `limit` (--requests)
    only the first that many requests are read: a big trace is read a line at a time, never whole.
    `cut_by_requests`: the command reads a trace's first --requests N, so a message may offer it."""
    data = head = pipe = None
    notes: Counter = Counter()     # what the reader left out or changed: message -> how many times
    try:
        if os.path.exists(path) and not os.path.isfile(path):
            # A pipe (--trace <(zcat trace.gz)) can be read only once: its first MiB tells the
            # format, and the reader reads it from the start, that MiB again and then the rest.
            try:
                pipe = open(path, "rb")
                head = pipe.read(1_000_000)
            except OSError as e:
                raise UserError(f"trace {path}: cannot read it ({e.strerror})") from None
            data = io.BufferedReader(Replayed(head, pipe))
        if fmt == "auto":
            fmt = trace_format(path, head)
        rows = list(itertools.islice(TRACE_READERS[fmt](path, notes, data), limit or MAX_REQUESTS + 1))
    finally:
        if pipe:
            pipe.close()
    if not rows:        # (every row may have been one the run cannot use: say which)
        raise UserError(f"trace {path}: no requests in it" if not notes else
                        f"trace {path}: no request to replay: " + "; ".join(counted(note, count)
                                                                          for note, count in notes.items()))
    if len(rows) > MAX_REQUESTS:
        raise UserError(f"trace {path}: more than {MAX_REQUESTS:,} requests; cut it (e.g. head -n {MAX_REQUESTS})"
                        + (" or read its first --requests N" if cut_by_requests else ""))
    first = min(row[0] for row in rows)
    wall_clock = fmt in ("azure", "vllm-bench")      # these formats' times: count from the first request
    if not wall_clock and first > MAX_ARRIVAL_S:
        notes[f"its first request is sent at {first:,.0f} s, more than a year in: wall-clock (epoch) seconds "
              f"by the look of it, so its times are counted from that request"] += 1
    if wall_clock or first > MAX_ARRIVAL_S:
        rows = [(arrival - first, *rest) for arrival, *rest in rows]
    if max(row[0] for row in rows) > MAX_ARRIVAL_S:
        raise UserError(f"trace {path}: its arrivals span more than a year; servesim simulates up to a year")
    for before, row in zip(rows, rows[1:]):      # (a file sorted by another column, or merged from several)
        if row[0] < before[0]:
            notes["{:,} row{s} {are} timed before the row above {them}; every request is sent at its own time, "
                  "in time order"] += 1
    # A reader may add a fifth field of extras: the row's reasoning tokens, its id, its parent's.
    extras = [row[4] if len(row) > 4 else {} for row in rows]
    reasoning = tuple(extra.get("reasoning", 0) for extra in extras)
    parents, delays = sessions_of(path, extras, notes, strict=fmt == "servesim")
    earliest = []         # each row's send at the soonest: its session's delays add up past its own time
    for i, parent in enumerate(parents):
        own = rows[i][0]
        earliest.append(own if parent < 0 else earliest[parent] + delays[i] if delays[i] is not None else
                        max(own, earliest[parent]))
        if earliest[-1] > MAX_ARRIVAL_S:
            raise UserError(f"trace {path} row {i + 1}: its session's delays put it {earliest[-1] / 86400:,.0f} days "
                            f"in, past the year servesim simulates; shorten the delays")
    for i, parent in enumerate(parents):
        if parent >= 0 and rows[i][1] < rows[parent][1] + rows[parent][2]:
            notes["{:,} turn{s} {are} shorter than the prompt and reply before {them} (a turn's prompt_tokens is its whole "
                  "context); each is sent as itself, without the history"] += 1
    return Trace(path, tuple(row[:4] for row in rows), fmt, tuple(counted(note, count) for note, count in notes.items()),
                 reasoning if any(reasoning) else (), parents, delays)


def sessions_of(path: str, extras: list[dict], notes: Counter, strict: bool = True) -> tuple[tuple, tuple]:
    """Each row's parent row (-1 for none) and delay, from the ids; () when no row has a parent.
    A parent must come earlier in the file (so there are no cycles); a parent continued by two
    rows is followed by the first, and the second is sent at its own time. A published trace cut
    from a longer one (not strict) may continue chats from before its start: those start afresh."""
    linked = any("parent" in extra for extra in extras)
    where, parents, delays, continued = {}, [], [], set()
    for i, extra in enumerate(extras):
        parent = extra.get("parent")
        if parent is None:
            parents.append(-1)
        elif parent not in where and not strict:
            notes["{:,} row{s} continue{v} a chat from before the trace starts; {they} start{v} afresh"] += 1
            parents.append(-1)
        elif parent not in where:
            raise UserError(f"trace {path} row {i + 1}: its parent {printable(parent)[:40]!r} is not an earlier row's "
                            f"id; a session's rows come in order, each after the one it continues")
        elif where[parent] in continued:
            notes["{:,} row{s} continue{v} a parent another row already continues; servesim follows one chain per "
                  "session, and sends these at their own times"] += 1
            parents.append(-1)
        else:
            parents.append(where[parent])
            continued.add(where[parent])
        delays.append(extra.get("delay") if parents[-1] >= 0 else None)
        if "id" in extra:
            if extra["id"] in where and (strict or linked):
                raise UserError(f"trace {path} row {i + 1}: id {printable(extra['id'])[:40]!r} names more than one "
                                f"row (row {where[extra['id']] + 1} too); ids name one row each")
            where[extra["id"]] = i
    return (tuple(parents), tuple(delays)) if linked else ((), ())


def read_rate_profile(path: str) -> RateProfile:
    """A CSV of time_s,rate (requests per second) rows, times ascending from 0."""
    text = read_text(path, "rate profile")
    if text.lstrip().startswith(("{", "[")):
        raise UserError(f"rate profile {path}: is JSON, which looks like a trace (give it as --trace); a rate "
                        f"profile is a CSV of time_s,rate rows")
    windows = []
    for number, row in csv_rows(io.StringIO(text), f"rate profile {path}", ("time_s", "rate")):
        where = f"rate profile {path} line {number}"
        if None in row:
            raise UserError(f"{where}: expected two columns, time_s,rate")
        start = trace_number(where, row, "time_s", 0, MAX_ARRIVAL_S, whole_number=False)
        rate = trace_number(where, row, "rate", 0, 1e6, whole_number=False)
        if windows and start <= windows[-1][0]:
            raise UserError(f"{where}: time_s {start:g} is not after the line before's {windows[-1][0]:g}; sort the "
                            f"rows by time")
        if not windows and start != 0:
            raise UserError(f"{where}: the first window starts at time_s {start:g}; a profile starts at 0")
        windows.append((start, rate))
    if len(windows) < 2:
        raise UserError(f"rate profile {path}: {len(windows)} window{'s' * (len(windows) != 1)}; give a header "
                        f"time_s,rate and at least two rows (the last window lasts as long as the one before it)")
    end = 2 * windows[-1][0] - windows[-2][0]
    if end > MAX_ARRIVAL_S:
        raise UserError(f"rate profile {path}: spans {end / 86400:,.0f} days; servesim simulates up to a year")
    return RateProfile(path, tuple(windows), end)


def collect_shards(paths: list[str], fingerprint: str, points: list[dict]) -> list[dict]:
    """Every deployment's result from the shard reports, in the grid's order: each shard of the
    same search exactly once, each complete, each deployment the grid's."""
    count = len(points)
    found: dict[int, dict] = {}
    seen: dict[int, str] = {}
    total = None
    for path in paths:
        report = parse_json(read_text(path, "shard"), f"shard {path}", "pass what search --shard K/N --json wrote")
        head = report.get("search_shard") if isinstance(report, dict) else None
        if not isinstance(head, dict) or not isinstance(report.get("found"), list):
            raise UserError(f"shard {path}: not a search --shard report")
        if head.get("fingerprint") != fingerprint or head.get("deployments") != count:
            raise UserError(f"shard {path}: from another search (other settings, grid or slo); collect with the "
                            f"flags the shards ran with")
        k, n = head.get("shard"), head.get("of")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (k, n)) or not 1 <= k <= n:
            raise UserError(f"shard {path}: shard {k!r} of {n!r} is not a shard K/N with 1 <= K <= N")
        if total is not None and n != total:
            raise UserError(f"shard {path}: one of {n} shards, where the others are of {total}")
        total = n
        if k in seen:
            raise UserError(f"shard {path}: shard {k}/{n} again (also {seen[k]})")
        if not head.get("complete") or len(report["found"]) != len(shard_indices((k, n), count)):
            raise UserError(f"shard {path}: shard {k}/{n} was stopped before it finished; run it again")
        seen[k] = path
        for index, item in zip(shard_indices((k, n), count), report["found"]):
            if not isinstance(item, dict) or item.get("settings") != shown_settings(points[index]):
                raise UserError(f"shard {path}: its deployment {index + 1} is not this grid's; the file was changed "
                                f"after search --shard wrote it")
            found[index] = item
    missing = [k for k in range(1, (total or 0) + 1) if k not in seen]
    if missing:
        raise UserError(f"collect: shard {missing[0]}/{total} is missing" + (f" (and {len(missing) - 1} more)"
                                                                          if len(missing) > 1 else ""))
    items = [found[i] for i in range(count)]
    for item in items:          # a deployment's best probe is one of its probes, as the search made it
        for part in (item, item.get("burst") or {}):
            if part.get("best") is not None:
                part["best"] = next(p for p in part["probes"] if p["load"] == part["best"]["load"]
                                    and p.get("recheck") == part["best"].get("recheck"))
    return items


def read_replica_schedule(path: str) -> ReplicaSchedule:
    """A CSV of time_s,replicas rows, times ascending from 0, at least one replica throughout."""
    steps = []
    for number, row in csv_rows(io.StringIO(read_text(path, "replica schedule")),
                                f"replica schedule {path}", ("time_s", "replicas")):
        where = f"replica schedule {path} line {number}"
        if None in row:
            raise UserError(f"{where}: expected the columns time_s,replicas")
        at = trace_number(where, row, "time_s", 0, MAX_ARRIVAL_S, whole_number=False)
        n = trace_number(where, row, "replicas", 1, 1024)
        if steps and at <= steps[-1][0]:
            raise UserError(f"{where}: time_s {at:g} is not after the line before's {steps[-1][0]:g}; sort the rows")
        if not steps and at != 0:
            raise UserError(f"{where}: the first row is at time_s {at:g}; a schedule starts at 0 with the replicas "
                            f"running then")
        steps.append((at, n))
    if not steps:
        raise UserError(f"replica schedule {path}: no rows; expected a header time_s,replicas and a row per change")
    return ReplicaSchedule(path, tuple(steps))


def trace_format(path: str, data: Optional[bytes] = None) -> str:
    """The format, from the first line: a JSON object's keys, or a CSV header's columns. Anything
    else is read as servesim's JSONL, whose reader says what is wrong with which line."""
    if data is None:
        try:
            with open(path, "rb") as f:
                data = f.read(1_000_000)
        except OSError as e:
            raise UserError(f"trace {path}: cannot read it ({e.strerror})") from None
    head = data[:1_000_000].decode("utf-8", errors="replace").lstrip("\ufeff")
    line, newline, _ = head.lstrip().partition("\n")
    line = line.strip()
    try:
        first = json.loads(line) if line.startswith("{") and newline else None
    except (ValueError, RecursionError):
        first = None
    if line.startswith("{") and not newline:      # a line longer than what was read: go by its keys
        first = {key: None for key in ("chat_id", "hash_ids", "input_length", "input_lens") if f'"{key}"' in line}
    if isinstance(first, dict):
        if "chat_id" in first or "parent_chat_id" in first:
            return "bailian"
        if "hash_ids" in first or "input_length" in first:
            return "mooncake"
        if "input_lens" in first:
            return "vllm-bench"
        return "servesim"
    if line.startswith("{") and "\"input_lens\"" in head:
        return "vllm-bench"      # a vllm bench serve result, one object over many lines
    if "contexttokens" in line.lower():
        return "azure"
    if "request tokens" in line.lower():
        return "burstgpt"
    named_csv = path.lower().endswith(".csv")      # (else the JSONL reader says what is wrong: a binary file, say)
    if named_csv and line.startswith("#"):
        raise UserError(f"trace {path}: its first line is a comment ({printable(line[:60])}), which none of the trace "
                        f"formats has: remove it (a CSV trace starts with its header)")
    if named_csv and "," in line:      # a CSV header no reader knows: say so
        raise UserError(f"trace {path}: its first line reads as a CSV header ({printable(line[:80])}), of neither "
                        f"Azure's trace (TIMESTAMP, ContextTokens, GeneratedTokens) nor BurstGPT's (Timestamp, "
                        f"Request tokens, Response tokens): name the columns so, or give --trace-format")
    return "servesim"


WHOLE_TEXT = re.compile(r"[+-]?[0-9]+", re.ASCII)
NUMBER_TEXT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?", re.ASCII)


def trace_number(where: str, row: dict, name: str, low: float, high: float, whole_number: bool = True):
    value = row.get(name)
    if value is None:
        raise UserError(f"{where}: missing field {name!r}")
    kind = "a whole number" if whole_number else "a number"
    if isinstance(value, str):       # a CSV cell: ASCII digits only (Python's int() reads 4_4 as 44, and other scripts' digits)
        if not (WHOLE_TEXT if whole_number else NUMBER_TEXT).fullmatch(value.strip()):
            raise UserError(f"{where}: field {name!r} must be {kind}, got {printable(value[:40])!r}")
        if len(value.strip()) > 40:      # (int() refuses past 4,300 digits; no range here needs 40)
            raise UserError(f"{where}: field {name!r} must be {kind} from {low:,} to {high:,}, got a number of "
                            f"{len(value.strip()):,} characters")
        value = float(value.strip()) if not whole_number else int(value.strip())
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not low <= value <= high or (whole_number and value != int(value)):
        # A time past the range that reads as one since 1970 (2001 to 2286, in s or in ms) is a clock's.
        clock = high and not whole_number and isinstance(value, (int, float)) and not isinstance(value, bool) \
            and math.isfinite(value) and value > high and 1e9 <= value / (high / MAX_ARRIVAL_S) < 1e10
        bound = lambda x: f"{x:,.0f}" if x == int(x) else f"{x:,}"
        raise UserError(f"{where}: field {name!r} must be {kind} from {bound(low)} to {bound(high)}, got "
                        f"{str(value)[:40]}"
                        + ("; that reads as a wall-clock time (since 1970): give each time from the file's start"
                           if clock else ""))
    return int(value) if whole_number else float(value)


def hashed_runs(where: str, row: dict, tokens: int, block: int) -> tuple:
    """Mooncake and Bailian hash_ids: one id per `block` tokens of the prompt; equal ids at equal
    places are equal content, so they become shared content runs. Mooncake's own traces count a
    partial last block (ceil); NVIDIA Dynamo's data generator documents full blocks only (floor,
    benchmarks/data_generator/README.md), its tail then being the request's own text. Both are read."""
    ids = row.get("hash_ids")
    if ids is None:
        raise UserError(f"{where}: missing field 'hash_ids'")
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise UserError(f"{where}: field 'hash_ids' must be a list of whole numbers")
    if len(ids) > MAX_HASH_IDS:
        raise UserError(f"{where}: {len(ids):,} hash_ids; servesim reads at most {MAX_HASH_IDS:,} a row")
    if len(ids) not in (-(-tokens // block), tokens // block):
        raise UserError(f"{where}: {len(ids)} hash_ids for {tokens:,} input tokens; this format has one per "
                        f"{block} tokens, so {-(-tokens // block)} (a partial last block counted) or "
                        f"{tokens // block} (whole blocks only)")
    return tuple((("hash", i), min(block, tokens - k * block)) for k, i in enumerate(ids))


def jsonl_rows(path: str, data: Optional[bytes], max_line: int = TRACE_LINE_BYTES,
               why: str = "") -> Iterator[tuple[str, dict]]:
    """A JSONL trace's lines, each a JSON object, read a line at a time."""
    for where, row in read_jsonl(path, "trace", text_lines(path, "trace", max_line, why, data)):
        if not isinstance(row, dict):
            raise UserError(f"{where}: expected a JSON object")
        yield where, row


def servesim_trace(path: str, notes: Counter, data: Optional[io.BufferedReader] = None) -> Iterator[tuple]:
    """servesim's JSONL: arrival (s), prompt_tokens, output_tokens, optional prefix and
    prefix_tokens (the shared system prompt at the head of prompt_tokens)."""
    lengths: dict[str, tuple[int, str]] = {}      # prefix name -> its length, and where it was first given
    for where, row in jsonl_rows(path, data):
        unknown = set(row) - set(TRACE_FIELDS)
        if unknown:
            raise UserError(f"{where}: unknown field {sorted(unknown)[0]!r}; fields are {', '.join(TRACE_FIELDS)}")
        arrival = trace_number(where, row, "arrival", 0, MAX_ARRIVAL_S, whole_number=False)
        prompt = trace_number(where, row, "prompt_tokens", 1, 10**8)
        output = trace_number(where, row, "output_tokens", 1, 10**8)
        prefix_tokens = trace_number(where, row, "prefix_tokens", 0, 10**8) if "prefix_tokens" in row else 0
        if "prefix" in row and (not isinstance(row["prefix"], str) or not row["prefix"]):
            raise UserError(f"{where}: field 'prefix' must be a non-empty string, got {str(row['prefix'])[:40]}")
        if prefix_tokens > prompt:
            raise UserError(f"{where}: prefix_tokens {prefix_tokens} is longer than prompt_tokens {prompt}")
        if prefix_tokens and "prefix" not in row:
            raise UserError(f"{where}: prefix_tokens needs a prefix name, the shared system prompt's id")
        prefix = ((row["prefix"], prefix_tokens),) if row.get("prefix") and prefix_tokens else ()
        if prefix:
            first = lengths.setdefault(row["prefix"], (prefix_tokens, where))
            if first[0] != prefix_tokens:
                raise UserError(f"{where}: prefix {printable(row['prefix'][:40])!r} is {prefix_tokens:,} tokens here "
                                f"and {first[0]:,} at {first[1]}; a shared system prompt has one length (name the "
                                f"other prompt differently)")
        extra = {}
        if "reasoning_tokens" in row:
            extra["reasoning"] = trace_number(where, row, "reasoning_tokens", 0, 10**8)
            if extra["reasoning"] >= output:
                raise UserError(f"{where}: reasoning_tokens {extra['reasoning']:,} is not below output_tokens "
                                f"{output:,}; the output holds the thinking and at least one answer token")
        for key in ("id", "parent"):
            if key in row:
                if not isinstance(row[key], (str, int)) or isinstance(row[key], bool) or str(row[key]) == "":
                    raise UserError(f"{where}: field {key!r} must be a non-empty string or a whole number, got "
                                    f"{str(row[key])[:40]}")
                extra[key] = str(row[key])
        if "delay" in row:
            if "parent" not in row:
                raise UserError(f"{where}: delay is the pause after a parent's end: add the parent's id")
            extra["delay"] = trace_number(where, row, "delay", 0, 86_400, whole_number=False)
        yield (arrival, prompt, output, prefix, extra) if extra else (arrival, prompt, output, prefix)


def hashed_trace(block: int, seconds_per_unit: float):
    """Mooncake (timestamp in ms, 512-token blocks) and Bailian (seconds, 16-token blocks)."""
    def read(path: str, notes: Counter, data: Optional[io.BufferedReader] = None) -> Iterator[tuple]:
        # A row of MAX_HASH_IDS ids of up to 20 digits each, and its other fields.
        longest, why = MAX_HASH_IDS * 22 + 65536, f"a row holds at most {MAX_HASH_IDS:,} hash_ids"
        for where, row in jsonl_rows(path, data, longest, why):
            arrival = trace_number(where, row, "timestamp", 0, MAX_ARRIVAL_S / seconds_per_unit, whole_number=False)
            prompt = trace_number(where, row, "input_length", 1, 10**8)
            output = trace_number(where, row, "output_length", 0, 10**8)
            if output == 0:
                notes["{:,} request{s} ask{v} for 0 output tokens; servesim generates 1, the first token"] += 1
            runs = hashed_runs(where, row, prompt, block)
            # Bailian's sessions: a chat continues its parent_chat_id (-1: none), at its own time.
            # (Its ids are whole numbers; text names a chat as well. Anything else is counted.)
            ids = [str(v) if isinstance(v, int) and not isinstance(v, bool) or isinstance(v, str) and v.strip()
                   else None for v in (row.get("chat_id"), row.get("parent_chat_id"))]
            chat, parent = ids
            if parent is not None and parent.strip() == "-1":
                parent = None
            if any(v is not None and i is None for v, i in zip((row.get("chat_id"), row.get("parent_chat_id")), ids)):
                notes["{:,} row{s} with a chat_id or parent_chat_id that is neither a whole number nor text "
                      "start{v} afresh, in no chat"] += 1
            if parent is not None and chat is not None:
                yield arrival * seconds_per_unit, prompt, max(1, output), runs, {"id": chat, "parent": parent}
            elif chat is not None:
                yield arrival * seconds_per_unit, prompt, max(1, output), runs, {"id": chat}
            else:
                yield arrival * seconds_per_unit, prompt, max(1, output), runs
    return read


def csv_trace(time_field: str, prompt_field: str, output_field: str, clock):
    """Azure's and BurstGPT's CSV: columns looked up by name (in any case), so added columns do
    not matter."""
    fields = (time_field, prompt_field, output_field)
    def read(path: str, notes: Counter, data: Optional[io.BufferedReader] = None) -> Iterator[tuple]:
        lines = (line for _, line in text_lines(path, "trace", TRACE_LINE_BYTES, data=data))
        for number, row in csv_rows(lines, f"trace {path}", fields):
            where = f"trace {path} line {number}"
            if row.get(None):       # cells past the header's: counted, never silently dropped
                notes["{:,} row{s} with more cells than the header {are} read by the header's columns, the rest "
                      "left out"] += 1
            arrival = clock(where, row[time_field])
            prompt = trace_number(where, row, prompt_field, 1, 10**8)
            output = trace_number(where, row, output_field, 0, 10**8)
            if output == 0:      # the service answered nothing: a failed request in these traces
                notes["{:,} row{s} with 0 " + output_field + " (failed in the original service) {are} not "
                      "replayed"] += 1
                continue
            yield arrival, prompt, output, ()
    return read


ISO_TIME = re.compile(r"\s*(\d{4})-(\d\d)-(\d\d)[ T](\d\d):(\d\d):(\d\d)(?:\.(\d+))?\s*(Z|[+-]\d\d:?\d\d)?\s*", re.ASCII)


def iso_seconds(where: str, text: str) -> float:
    """Seconds since the epoch of Azure's timestamps: 2023's 100 ns ticks without a zone, 2024's
    microseconds with +00:00 (fraction left out when zero). A naive time is taken as UTC."""
    match = ISO_TIME.fullmatch(text or "")
    if not match:
        raise UserError(f"{where}: TIMESTAMP must be a date and time like 2023-11-16 18:17:03.9799600, got {text[:40]!r}")
    year, month, day, hour, minute, second, fraction, zone = match.groups()
    try:
        moment = datetime.datetime(int(year), int(month), int(day), int(hour), int(minute), int(second),
                                   tzinfo=datetime.timezone.utc)
    except ValueError as e:
        raise UserError(f"{where}: TIMESTAMP {text.strip()!r} is not a date ({e})") from None
    offset = 0
    if zone and zone != "Z":
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        offset = sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
    return moment.timestamp() - offset + (float("0." + fraction) if fraction else 0.0)


def plain_seconds(where: str, text: str) -> float:
    try:      # (ASCII digits only, as every CSV cell: float() reads 1_0 and other scripts' digits)
        value = float(text) if NUMBER_TEXT.fullmatch((text or "").strip()) else math.nan
    except (TypeError, ValueError):
        value = math.nan
    if not 0 <= value <= 10**10:
        raise UserError(f"{where}: Timestamp must be seconds from the trace's start, got {str(text)[:40]!r}")
    return value


def vllm_bench_trace(path: str, notes: Counter, data: Optional[io.BufferedReader] = None) -> Iterator[tuple]:
    """vllm bench serve --save-detailed (or loadgen --detailed): each request's length and start."""
    report = parse_json(read_text(path, "trace", f=data), f"trace {path}",
                        "expected a vllm bench serve --save-detailed result")
    if not isinstance(report, dict):
        raise UserError(f"trace {path}: expected a JSON object with input_lens, output_lens and start_times")
    if report.get("start_times") is None:
        raise UserError(f"trace {path}: no start_times (vLLM records them since January 2026, loadgen --detailed "
                        f"always); without them there are no arrivals to replay")
    for r in run_from_report(report, path, "trace").requests:
        if r.error is None:
            yield r.sent_s, r.prompt_tokens, r.output_tokens, ()
        else:
            notes["{:,} request{s} failed in the measured run and {are} not replayed"] += 1


TRACE_READERS = {
    "servesim": servesim_trace,
    "mooncake": hashed_trace(512, 0.001),
    "bailian": hashed_trace(16, 1.0),
    "azure": csv_trace("TIMESTAMP", "ContextTokens", "GeneratedTokens", iso_seconds),
    "burstgpt": csv_trace("Timestamp", "Request tokens", "Response tokens", plain_seconds),
    "vllm-bench": vllm_bench_trace,
}
TRACE_FORMATS = tuple(TRACE_READERS)


# ---------------------------------------------------------------------------------------------
# Load generator: the same metrics measured from a real OpenAI-compatible server's stream.
# Each server-sent event is timestamped as its line is read, before any JSON parsing; the
# server's own /metrics are scraped before, during and after, and turned into window figures.
# ---------------------------------------------------------------------------------------------

# Common English words, one token each (with their leading space) in the usual BPE vocabularies,
# so --prompt-tokens N words is close to N tokens.
PROMPT_WORDS = tuple("""the of and to in is you that it he was for on are as with his they at be this have
from or one had by word but not what all were we when your can said there use an each which she do
how their if will up other about out many then them these so some her would make like him into time
has look two more write go see number no way could people my than first water been call who oil its
now find long down day did get come made may part over new sound take only little work know place
year live me back give most very after thing our just name good sentence man think say great where
help through much before line right too mean old any same tell boy follow came want show also around
form three small set put end does another well large must big even such because turn here why ask
went men read need land different home us move try kind hand picture again change off play spell air
away animal house point page letter mother answer found study still learn should world""".split())


def make_prompt(index: int, words: int, seed: int, run_id: str = "") -> str:
    """A distinct prompt per request, so a server's prompt cache cannot turn a load test into a
    cache test: the run's id and the request's number first (a server keeps its cache between
    runs), then seeded random words."""
    rng = random.Random(f"{seed}:{index}")
    head = f"{run_id}-{index}" if run_id else str(index)
    return head + " " + " ".join(rng.choice(PROMPT_WORDS) for _ in range(max(0, words - 1)))


@dataclass
class StreamRecord:
    """One measured request. Same field names as a simulated Request, for summarize()."""
    index: int
    sent_s: float = 0.0
    prompt_tokens: int = 0
    output_tokens: int = 0
    first_token_s: Optional[float] = None
    last_token_s: Optional[float] = None
    token_times: list = field(default_factory=list)
    queue_s: Optional[float] = None     # a client cannot see the server's queue
    finish_reason: Optional[str] = None
    usage_seen: bool = False
    timings: Optional[dict] = None      # llama.cpp's per-request server timings
    error: Optional[str] = None
    turn: int = 0                       # its place in a conversation (0: not in one)
    cached_tokens: int = 0              # prompt tokens the server found cached, where it says
    scheduled_s: Optional[float] = None  # when the arrival schedule said to send it (open loop)
    asked_prompt_tokens: Optional[int] = None
    text: Optional[list] = None         # the reply's text, kept to carry a conversation on
    measured: bool = True               # False for a warm-up request: sent, but left out of every figure
    left_out: list = field(default_factory=list)   # (field, why) of server figures not believed
    answered_s: Optional[float] = None  # when the answer's headers arrived
    answer_s: Optional[float] = None    # the first content event after (or without) reasoning events
    reasoning_tokens: int = 0           # reasoning events seen (a reasoning parser's split)
    streamed_bytes: int = 0             # UTF-8 bytes of content and thinking received: a token is one at least
    think_tags: bool = False            # thinking streamed inside content, as <think>...
    tag_tail: str = ""                  # the content's last characters, for a tag split over events
    server_date: Optional[float] = None # the answer's Date header, whole seconds of the server's clock
    date_sent: bool = False             # a Date header came, readable or not
    ended_s: Optional[float] = None     # when the client let go of it (a failed one's end: the run lasted to it)


@dataclass
class LoadConfig:
    """A load run described once; each field with a flag is a row of loadgen's settings table."""
    url: str = setting("http://127.0.0.1:8080", "--url", str, "the server's base address (a pasted endpoint ending "
                       "in /v1 or /v1/chat/completions is taken for it)", "server")
    model: Optional[str] = setting(None, "--model", given("the model id"), "model id to request", "server",
                                   default_text="the first id from GET /v1/models")
    api_key: Optional[str] = setting(None, "--api-key", given("the key"), "sent as a Bearer token, never printed",
                                     "server",
                                     default_text="$OPENAI_API_KEY if set")
    timeout_s: float = setting(
        120.0, "--timeout", real(0, 86400), "longest wait for the next event of a stream (or for the answer to "
        "start) before the request counts as failed; comments and keep-alives do not reset it", "server",
        metavar="SECONDS")
    request_timeout_s: Optional[float] = setting(
        None, "--request-timeout", real(0, 7 * 86400), "longest a whole request may take before it counts as failed",
        "server", metavar="SECONDS", default_text="no limit")
    scrape_interval_s: float = setting(
        1.0, "--scrape-interval", real(0.01, 3600, above_low=False), "how often /metrics is read during the run",
        "server", metavar="SECONDS")
    concurrency: Optional[int] = setting(
        None, "--concurrency", whole(1, 10000), "closed loop: N clients; with --rate, the most requests in flight",
        "load", metavar="N", default_text="1; with --rate, no cap")
    rate: Optional[float] = setting(
        None, "--rate", real(0.001, 100000, above_low=False), "open loop: Poisson arrivals at R requests/s, 0.001 to "
        "100,000", "load", metavar="R", default_text="closed loop")
    requests: Optional[int] = setting(
        64, "--requests", whole(1, MAX_REQUESTS), "requests to send", "load", metavar="N",
        default_text="64, or no count limit when --duration is given")
    duration_s: Optional[float] = setting(
        None, "--duration", real(0, 7 * 86400), "stop sending after this long; requests in flight finish", "load",
        metavar="SECONDS", default_text="no time limit")
    max_tokens: int = setting(64, "--max-tokens", whole(1, 10**7), "max_tokens of each request", "load",
                              metavar="TOKENS")
    ignore_eos: bool = setting(
        False, "--ignore-eos", None, "ask the server to generate exactly --max-tokens tokens (llama.cpp, vLLM and "
        "SGLang accept ignore_eos)", "load", default_text="off")
    prompt_words: int = setting(
        40, "--prompt-tokens", whole(1, 10**6), "a distinct prompt of this many tokens per request, in common words "
        "sized by the server's own token counts for two probe prompts sent first", "load", metavar="TOKENS")
    prefix_words: int = setting(
        0, "--prefix-tokens", whole(1, 10**6), "a shared system prompt of this many tokens, the same for every request",
        "load", metavar="TOKENS", default_text="none")
    prompts: Optional[list] = setting(
        None, "--prompts", None, "your own prompts, JSONL with {\"prompt\": ...} or {\"messages\": [...]} per line, "
        "used in turn", "load", metavar="FILE", default_text="generated prompts")
    seed: int = setting(7, "--seed", SEED, "seed for prompts and arrivals", "load")
    slos: Optional[dict] = setting(
        None, "--goodput", goodput_bound, GOODPUT_HELP, "slo", metavar="KEY:MS", default_text="off", nargs="+")
    timeline: bool = False               # per-second rows for --timeline and --plot
    burstiness: float = setting(
        1.0, "--burstiness", real(0.001, 1000), "gaps between arrivals are gamma with shape B at the same mean rate: 1 "
        "is Poisson, below 1 burstier (coefficient of variation 1/sqrt(B)), above 1 more even; with --rate or a ramp",
        "load", metavar="B")
    ramp_up: Optional[tuple] = setting(
        None, "--ramp-up-strategy", choice("linear", "exponential"), "raise the arrival rate from --ramp-up-start-rps "
        "to --ramp-up-end-rps over the run, request by request, as vllm bench serve does; instead of --rate", "load",
        metavar="linear|exponential", default_text="off")
    trace: Optional[Trace] = setting(
        None, "--trace", None, "replay a trace (any --trace-format): each request at its time (x --time-scale), its "
        "prompt built so equal content runs (hash ids, system prompts) are equal text and others differ, max_tokens "
        "its output length with ignore_eos", "load", metavar="FILE", default_text="off")
    rate_profile: Optional[RateProfile] = setting(
        None, "--rate-profile", None, "open loop at a rate that changes over time: a CSV of time_s,rate rows (the "
        "file simulate and plan read), arrivals Poisson (or gamma with --burstiness) within each window; --time-scale "
        "stretches it; it sets the requests unless --requests caps them", "load", metavar="FILE", default_text="off")
    time_scale: float = setting(1.0, "--time-scale", real(1e-6, 1e6), "multiply the trace's or the rate profile's "
                                "times by X (and divide the profile's rates by it)", "load", metavar="X")
    turns: int = setting(
        1, "--turns", whole(1, 10_000), "conversations of N requests: each turn sends the earlier messages and the "
        "server's own replies, plus a new --prompt-tokens message; --requests counts requests", "load", metavar="N")
    think_time_s: float = setting(
        0.0, "--think-time", real(0, 86_400, above_low=False), "seconds between a reply's end and the next turn",
        "load", metavar="S")
    warmup: int = setting(0, "--warmup", whole(0, MAX_REQUESTS), "the first N requests are sent but left out of the "
                          "metrics", "load", metavar="N")
    size_prompts: bool = setting(
        False, "--no-size-prompts", None, "skip the probe and send one word per token asked", "load",
        default_text="probe")
    price_per_hour: Optional[float] = setting(
        None, "--price-per-hour", real(0, 1e6), "USD an hour for the server measured, all its GPUs together; reports "
        "gain $ an hour and $ per million output tokens", "slo", metavar="USD", default_text="no cost")
    shard: Optional[tuple] = setting(
        None, "--shard", shard_of, "send only the K-th of N shares of an open-loop schedule (--rate, a ramp, "
        "--rate-profile or --trace): every N-th request from the K-th, drawn from the same --seed on every machine, "
        "so N machines started at the same --start-at send exactly the load one would; --concurrency caps each "
        "machine's requests in flight; merge joins the reports", "machines", metavar="K/N",
        default_text="the whole schedule")
    start_at: Optional[float] = setting(
        None, "--start-at", real(1e9, 1e10, what="Unix seconds, like $(date +%s) gives"), "start the schedule at this wall-clock instant, Unix seconds (e.g. "
        "$(( $(date +%s) + 60 ))), after the probe; refused if the clock has already passed it by more than 1 s. "
        "Keep the machines' clocks synchronised (NTP): merge says how far apart they were", "machines",
        metavar="UNIX_TIME", default_text="start at once")
    words_per_token: float = 1.0         # set by the probe
    template_tokens: float = 0.0         # the chat template's own tokens, set by the probe
    run_id: str = field(default_factory=lambda: f"{random.SystemRandom().getrandbits(24):06x}")


class ServerUnreachable(CapacityError):
    pass


MAX_LINE_BYTES = 1 << 20      # an event stream line (or event) longer than this is a broken stream
MAX_PAGE_BYTES = 16 << 20     # a GET answer (/metrics, /v1/models, /props) longer than this is refused


class PageTooLarge(http.client.HTTPException):
    pass


class Answer(http.client.HTTPResponse):
    """A response that passes over every informational answer before the real one: http.client
    passes over 100 Continue alone, so a 103 Early Hints would stand for the answer."""
    def _read_status(self):
        while True:
            version, status, reason = super()._read_status()
            if not 100 < status < 200 or status == 101:
                return version, status, reason
            http.client.parse_headers(self.fp)       # its hints: nothing servesim uses


def split_url(url: str) -> tuple[str, str, int, str, Optional[tuple[str, str]]]:
    """scheme, host, port, base path and (user, password) of --url, checked into one-line errors.
    A pasted endpoint (.../v1, .../v1/chat/completions) is taken for the base address it ends."""
    netloc = ""
    try:
        parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
        netloc = parts.netloc
        port = parts.port
    except ValueError:
        given = netloc.rpartition("@")[2].rpartition(":")[2]
        if given.isdigit() and int(given) > 65535:
            raise UserError(f"--url {redact_url(url)!r}: port {given} is out of range; a port is from 1 "
                            f"to 65,535") from None
        raise UserError(f"--url {redact_url(url)!r}: not a URL (a password with / ? # or @ must be "
                        f"percent-encoded); expected http://HOST:PORT") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(f"--url {redact_url(url)!r}: expected http://HOST:PORT, the server's base address")
    if port == 0:
        raise UserError(f"--url {redact_url(url)!r}: port 0 is not a server's port")
    if parts.query or parts.fragment:
        # Requests go to the base address's own paths: a query (?api_key=...) would never be sent.
        raise UserError(f"--url {redact_url(url)!r}: servesim sends nothing after ? or # in the URL; drop it, and "
                        f"give a key with --api-key (sent as a Bearer token)")
    port = port or (443 if parts.scheme == "https" else 80)
    try:
        socket.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:
        raise UserError(f"--url {redact_url(url)!r}: cannot resolve the host {parts.hostname!r} ({e}); "
                        f"expected http://HOST:PORT") from None
    base = re.sub(r"/v1(/chat/completions|/completions|/models)?/*$", "", parts.path.rstrip("/"))
    credentials = (urllib.parse.unquote(parts.username or ""), urllib.parse.unquote(parts.password or "")) \
        if parts.username is not None else None
    return parts.scheme, parts.hostname, port, base, credentials


def redact_url(url: str) -> str:
    """The URL as reports print it: everything up to its last @ (a user and password, with or
    without a scheme in front, whether or not the URL parses) replaced by ***, and a query or
    fragment (?api_key=...) too."""
    if "@" in url and re.search(r"[?#]", url):      # which @ ends a password cannot be told: show neither
        return re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://)?.*", r"\1***", url, flags=re.S)
    url = re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://)?.*@", r"\1***@", url, flags=re.S)
    return re.sub(r"[?#].*", "?***", url, flags=re.S)


def hide_pieces(text: str, secrets: list[str], least: int = 8, ends: int = 6) -> str:
    """The text with every run of `least` or more characters that is a piece of one of `secrets`
    (the whole of a shorter one), and every run of `ends` or more that starts or ends one as it
    does, shown as ***: a server that refuses a key often echoes its first and last characters
    ("abcdef...uvwxyz"), and a piece of a key is a piece of a secret. (Four, as OpenAI's
    "****wxyz" shows, would hide "token" in "tokens" for vLLM's example key token-abc123.) The
    pieces of every secret are found in the text as given, then hidden together: hidden one secret
    after another, a user name hidden first would cut the password beside it into pieces too short
    to find."""
    hidden = [False] * len(text)
    for secret in secrets:
        if len(secret) > ends:
            for edge in (secret[:ends], secret[-ends:]):
                at = text.find(edge)
                while at >= 0:
                    start, end = at, at + ends
                    if edge == secret[:ends]:       # the secret's start, as far as the text follows it
                        while end < len(text) and end - start < len(secret) and text[end] == secret[end - start]:
                            end += 1
                    else:                           # its end, as far back as the text follows it
                        while start > 0 and end - start < len(secret) and text[start - 1] == secret[-(end - start) - 1]:
                            start -= 1
                    hidden[start:end] = [True] * (end - start)
                    at = text.find(edge, at + 1)
        if len(secret) < least:
            # A short key ("e", "test") is found where it stands alone: hidden inside every word,
            # it would hide every "e" of what the server said, and such a key guards little.
            for found in re.finditer(rf"(?<![A-Za-z0-9]){re.escape(secret)}(?![A-Za-z0-9])", text):
                hidden[found.start():found.end()] = [True] * (found.end() - found.start())
            continue
        size = least
        if not any(secret[j:j + size] in text for j in range(len(secret) - size + 1)):
            continue        # (most of what a server says: no piece to look for, character by character)
        for i in range(len(text) - size + 1):
            if text[i:i + size] in secret:
                end = i + size
                while end < len(text) and text[i:end + 1] in secret:
                    end += 1
                hidden[i:end] = [True] * (end - i)
    shown, i = [], 0
    while i < len(text):
        if hidden[i]:
            while i < len(text) and hidden[i]:
                i += 1
            shown.append("***")
        else:
            shown.append(text[i])
            i += 1
    return "".join(shown)


class Http:
    """Plain http.client requests to one server. A refused connection is ServerUnreachable.
    Credentials in the URL are sent as Basic auth and never printed; --api-key as a Bearer token."""
    def __init__(self, url: str, timeout_s: float, api_key: Optional[str]):
        self.url = redact_url(url)
        self.scheme, self.host, self.port, self.base, credentials = split_url(url)
        self.timeout_s = timeout_s
        self.connection_class = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        self.headers = {"Content-Type": "application/json", "Accept": "text/event-stream, application/json"}
        self.secrets = [secret for secret in (api_key, *(credentials or ())) if secret]
        for secret in self.secrets:
            if any(c in secret for c in "\r\n\0") or not secret.isprintable() or not secret.isascii():
                raise UserError("--api-key (or the URL's password) holds a line break or a character an HTTP "
                                "header cannot carry; pass the key itself")
        if api_key and credentials:
            raise UserError("--url carries a user and password and --api-key is given too: use one of them")
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        elif credentials:
            token = base64.b64encode(":".join(credentials).encode()).decode()
            self.headers["Authorization"] = f"Basic {token}"
            self.secrets.append(token)

    def redact(self, text: str) -> str:
        """A server's words as servesim shows and stores them: our secrets taken out, and
        anything that looks like a key, and no control characters (printable())."""
        text = hide_pieces(text, self.secrets)
        return printable(re.sub(r"(?i)(bearer\s+|basic\s+|sk-)[A-Za-z0-9._~+/=-]{6,}", r"\1***", text))

    def open(self, method: str, path: str, body: Optional[bytes] = None, answer_within: Optional[float] = None):
        """Send a request and read the answer's status and headers; with answer_within, a server
        that has not finished its headers by then (dripping them byte by byte, say) is a timeout."""
        connection = self.connection_class(self.host, self.port, timeout=self.timeout_s)
        connection.response_class = Answer
        try:
            connection.connect()
            sock = connection.sock       # getresponse() lets go of it when the server will close
            late = threading.Event()

            def cut() -> None:
                late.set()
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            timer = threading.Timer(answer_within, cut) if answer_within else None
            if timer:
                timer.daemon = True
                timer.start()
            try:
                # (Sent within the timer too: a server that never reads a long prompt holds the
                # send, and the answer it owes is what the deadline bounds.)
                connection.request(method, self.base + path, body=body, headers=self.headers)
                response = connection.getresponse()
            except (OSError, http.client.HTTPException):
                if late.is_set():
                    raise socket.timeout("no answer in time") from None
                raise
            finally:
                if timer:
                    timer.cancel()
            response.socket = sock       # the stream reader sets its deadlines on it
            return connection, response
        except ConnectionRefusedError:
            connection.close()
            raise ServerUnreachable(f"cannot connect to {self.url}: connection refused; is the server "
                                    f"running and listening on {self.host}:{self.port}?") from None
        except ssl.SSLCertVerificationError as e:
            connection.close()
            raise ServerUnreachable(f"cannot connect to {self.url}: its TLS certificate is not trusted "
                                    f"({e.verify_message}); give its CA with SSL_CERT_FILE=ca.pem") from None
        except BaseException:
            connection.close()
            raise

    def get(self, path: str) -> tuple[int, bytes]:
        """A whole page within --timeout: a server that drips it, or stalls part way, is a timeout,
        and one longer than MAX_PAGE_BYTES an error, never a page silently cut short."""
        deadline = time.perf_counter() + self.timeout_s
        connection, response = self.open("GET", path, answer_within=self.timeout_s)
        try:
            body = bytearray()
            while True:
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    raise socket.timeout(f"{path} did not arrive whole within {self.timeout_s:g} s (--timeout)")
                response.socket.settimeout(remaining)
                chunk = response.read1(65536)
                if not chunk and response.length:       # (None without a Content-Length)
                    raise http.client.HTTPException(f"{path} was cut short: the connection closed after {len(body):,} of "
                                                    f"its {len(body) + response.length:,} bytes")
                if not chunk:
                    coding = (response.getheader("Content-Encoding") or "identity").strip().lower()
                    if coding != "identity":     # not asked for: the bytes hold no page
                        said = f"compressed (Content-Encoding {self.redact(coding)[:40]}), which servesim did not ask for"
                        if response.status == 200:
                            raise http.client.HTTPException(f"{path} is {said}")
                        body = bytearray(f"(its body is {said})".encode())
                    where = response.getheader("Location") if 300 <= response.status < 400 else None
                    if where:       # not followed (it would take the key elsewhere): what is said is where
                        # (--url takes no query: a place that needs one is said, not offered)
                        body = bytearray((f"redirected to {redact_url(self.redact(where))[:200]}"
                                          + ("; pass that as --url" if not re.search(r"[?#]", where) else "")).encode())
                    return response.status, bytes(body)
                body += chunk
                if len(body) > MAX_PAGE_BYTES:
                    raise PageTooLarge(f"{path} is longer than {MAX_PAGE_BYTES >> 20} MiB")
        finally:
            connection.close()


def first_model(client: Http) -> str:
    try:
        status, body = client.get("/v1/models")
        if status == 200:
            listed = json.loads(body)
            listed = listed.get("data") if isinstance(listed, dict) else None
            if listed == []:
                raise CapacityError(f"{client.url}/v1/models lists no model (is one still loading?); pass --model")
            model = listed[0].get("id") if isinstance(listed, list) and isinstance(listed[0], dict) else None
            if isinstance(model, str) and model:
                return model
            problem = (f"its first model id is {client.redact(repr(model))[:80]}" if isinstance(listed, list)
                       and isinstance(listed[0], dict) else "its answer is not an object whose data lists models")
        else:
            problem = f"HTTP {status}: {client.redact(body[:200].decode(errors='replace'))}"
    except ServerUnreachable:
        raise
    except (OSError, http.client.HTTPException, ValueError, KeyError, IndexError, TypeError, RecursionError) as e:
        problem = f"{type(e).__name__}: {client.redact(str(e))[:200]}"
    raise CapacityError(f"could not read the model id from {client.url}/v1/models ({' '.join(problem.split())}); "
                        f"this does not look like an OpenAI-compatible server, or pass --model")


class StreamError(Exception):
    """A stream that broke its format: its message is the request's failure."""


LINE_END = re.compile(rb"\r\n|\r|\n")


def stream_lines(response, sock, deadline: Callable[[], tuple[float, str]]) -> Iterator[tuple[bytes, float]]:
    """(line, the time the read that completed it returned) from an HTTP body. Each read waits at
    most until deadline() (a time and what it means), so a server that drips bytes or sends only
    keep-alives cannot hold a request past it; a line longer than MAX_LINE_BYTES is an error.
    Lines end as the SSE format lets them: CRLF, LF or CR alone."""
    buffer = bytearray()
    start, at = 0, time.perf_counter()
    after_cr = False        # the last line ended at a CR that was the last byte read: an LF first is its end's
    while True:
        if after_cr and start < len(buffer):
            start += buffer[start:start + 1] == b"\n"
            after_cr = False
        found = LINE_END.search(buffer, start)
        if found:
            yield bytes(buffer[start:found.start()]), at
            start = found.end()
            after_cr = found.group() == b"\r" and start == len(buffer)   # its LF may come in the next read
            continue
        del buffer[:start]
        start = 0
        if len(buffer) > MAX_LINE_BYTES:
            raise StreamError(f"bad stream: a line longer than {MAX_LINE_BYTES // 1024:,} KiB")
        limit, meaning = deadline()
        remaining = limit - time.perf_counter()
        if remaining <= 0:
            raise StreamError(f"timeout: {meaning}")
        sock.settimeout(remaining)
        try:
            chunk = response.read1(65536)
        except (socket.timeout, TimeoutError):
            raise StreamError(f"timeout: {meaning}") from None
        at = time.perf_counter()
        if not chunk:
            if buffer:
                yield bytes(buffer), at
            return
        buffer += chunk


def read_stream(response, sock, record: StreamRecord, max_events: int, timeout_s: float,
                request_timeout_s: Optional[float]) -> None:
    """Read server-sent events from a streaming chat completion into `record`. --timeout bounds
    the wait for each event (comments and keep-alives do not count); --request-timeout the whole
    request."""
    last_event = record.sent_s
    request_end = record.sent_s + request_timeout_s if request_timeout_s else math.inf

    def deadline() -> tuple[float, str]:
        if last_event + timeout_s <= request_end:
            return last_event + timeout_s, f"no event for {timeout_s:g} s (--timeout)"
        return request_end, f"the request took longer than {request_timeout_s:g} s (--request-timeout)"

    data_lines: list[str] = []
    event_at = 0.0
    event_bytes = 0
    done = False
    failing = False
    events = 0
    first = True
    for raw, at in stream_lines(response, sock, deadline):
        line = raw.decode("utf-8", errors="replace").rstrip("\r")
        if first:           # a stream may open with a byte-order mark, which is not its first field's
            line, first = line.removeprefix("\ufeff"), False
        if line:
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "data":
                if not data_lines:
                    event_at = at
                event_bytes += len(raw)
                if event_bytes > MAX_LINE_BYTES:
                    raise StreamError(f"bad stream: an event longer than {MAX_LINE_BYTES // 1024:,} KiB")
                data_lines.append(value)
            elif name == "error":     # llama.cpp reports a failure mid-stream as an `error:` field
                raise StreamError(f"server error in stream: {value}")
            elif name == "event" and value.strip() == "error":    # its data: lines are the server's failure
                failing = True
            continue                  # comments (": keep-alive"), other event:s, id:, unknown fields
        if not data_lines:            # (an event with no data is none, and its type goes with it)
            failing = False
            continue
        if not "".join(data_lines).strip():     # `data:` with nothing: a keep-alive, not an event or progress
            data_lines, event_bytes, failing = [], 0, False
            continue
        # A whole event (its blank line came) is progress; a data: line without one is not.
        data, data_lines, event_bytes, last_event = "\n".join(data_lines), [], 0, at
        events += 1
        if events > max_events:
            raise StreamError(f"bad stream: more than {max_events:,} events for this request")
        if data.strip() == "[DONE]":
            done = True
            break
        if failing:
            raise StreamError(f"server error in stream: {error_message(data)}")
        take_event(data, event_at, record)
    if data_lines and "".join(data_lines).strip() == "[DONE]":
        done = True            # a last event without its blank line
    elif data_lines:
        try:
            take_event("\n".join(data_lines), event_at, record)
        except StreamError as e:      # a body cut inside an event: what ended it was the connection
            if "not JSON" not in str(e):
                raise
            raise StreamError(f"truncated: the stream ended inside an event ({str(e).partition(': ')[2]})") from None
    if events == 0 and not done and not data_lines:
        if "text/event-stream" in (response.getheader("Content-Type") or ""):
            # It said it would stream, and the body ended first: a server stopped mid-answer.
            raise StreamError("truncated: the stream ended before its first event")
        raise StreamError("not an event stream: the body held no data: lines")
    if record.finish_reason is None:
        raise StreamError("truncated: the stream ended without a finish_reason")
    if record.finish_reason in SERVER_ENDED:     # the server gave up on it: not an answer, whatever it streamed
        raise StreamError(f"ended by the server: finish_reason {record.finish_reason!r}")
    if not done:
        raise StreamError("truncated: the stream ended without [DONE]")
    if record.first_token_s is None:
        raise StreamError("empty answer: no content in the stream")


# finish_reasons of a request the server ended without answering it: "abort" (vLLM counts such
# requests apart, vllm:request_success_total{finished_reason="abort"}: its engine dropped them)
# and "error".
SERVER_ENDED = ("abort", "error")


def error_message(data: str) -> str:
    """What an `event: error`'s data says: its message (or its error's), else the data itself."""
    try:
        body = json.loads(data)
    except (ValueError, RecursionError):
        return data[:200]
    inner = body.get("error", body) if isinstance(body, dict) else body
    message = inner.get("message") if isinstance(inner, dict) else inner
    return str(message if message is not None else data)[:200]


def noted_once(record: StreamRecord, name: str, why: str) -> None:
    """What a reader left out of a request, said once however many of its events did it."""
    if not any(seen == name for seen, _ in record.left_out):
        record.left_out.append((name, why))


def take_event(data: str, at: float, record: StreamRecord) -> None:
    """One chat.completion.chunk into the record; a malformed one is a StreamError."""
    try:
        event = json.loads(data, parse_int=json_int)     # (a 5,000-digit count is a bad count, not bad JSON)
    except (ValueError, RecursionError):
        raise StreamError(f"bad stream: an event is not JSON: {data[:80]!r}") from None
    if not isinstance(event, dict):
        raise StreamError(f"bad stream: an event is not a JSON object: {data[:80]!r}")
    if event.get("error"):
        raise StreamError(f"server error in stream: {error_message(data)}")
    choices = event.get("choices") or []
    if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
        raise StreamError(f"bad stream: choices is not a list of objects: {data[:80]!r}")
    for choice in choices:
        if choice.get("index") not in (0, None):     # (one choice was asked for: another is no token of it)
            noted_once(record, "choices", f"the stream carried choice {printable(str(choice.get('index'))[:20])} "
                                          f"where one was asked for: only the first was counted")
            continue
        delta = choice.get("delta") or {}
        if not isinstance(delta, dict):
            raise StreamError(f"bad stream: a delta is not an object: {data[:80]!r}")
        # A reasoning parser's thinking: vLLM's `reasoning` (from 0.11; `reasoning_content` before),
        # SGLang's and llama.cpp's `reasoning_content`. Both are tokens; the answer is `content`.
        content = delta.get("content")
        thinking = delta.get("reasoning") or delta.get("reasoning_content")
        for name, value in (("content", content), ("reasoning", thinking)):
            if value is not None and not isinstance(value, str):
                raise StreamError(f"bad stream: a delta's {name} is not a string: {data[:80]!r}")
        if (content or thinking) and record.finish_reason:     # after its end: no token of this answer
            noted_once(record, "after the end", "the stream carried text after its finish_reason: not counted")
            content = thinking = None
        if content or thinking:
            record.streamed_bytes += len((content or "").encode()) + len((thinking or "").encode())
            if record.first_token_s is None:
                record.first_token_s = at
            record.token_times.append(at)
            record.last_token_s = at
            if record.text is not None and isinstance(content, str):
                record.text.append(content)
        if thinking:
            record.reasoning_tokens += 1
        if content and record.answer_s is None:
            record.answer_s = at
        if content:     # a template may put <think> in the prompt: look for either tag, across events
            record.tag_tail = (record.tag_tail + content)[-16:]
            if "<think>" in record.tag_tail or "</think>" in record.tag_tail:
                record.think_tags = True
        reason = choice.get("finish_reason")
        if reason is not None and not isinstance(reason, str):    # ([], 0 and false too: not "no reason yet")
            raise StreamError(f"bad stream: a finish_reason is not a string: {data[:80]!r}")
        if reason:
            record.finish_reason = reason
    usage = event.get("usage")
    if usage:
        counts = [usage.get(k) if isinstance(usage, dict) else None for k in ("prompt_tokens", "completion_tokens")]
        # (The ranges merge and compare read a report's lengths in: a prompt is a token at least.)
        usable = all(isinstance(c, (int, float)) and not isinstance(c, bool) and low <= c <= MAX_COUNTED_TOKENS
                     and c == int(c) for c, low in zip(counts, (1, 0)))
        if not usable:
            # The stream itself is good: its times stand, and its content events are counted instead.
            record.left_out.append(("usage", f"usage token counts {printable(json.dumps(usage))[:80]!r} are not "
                                             f"whole numbers from 1 (a prompt) or 0 (an output) to 10^8"))
        else:
            record.usage_seen = True
            record.prompt_tokens, record.output_tokens = map(int, counts)
        details = usage.get("prompt_tokens_details") if usable else None      # OpenAI's, and vLLM's with details on
        if isinstance(details, dict) and details.get("cached_tokens") is not None:
            cached = server_figure(record, "usage.prompt_tokens_details.cached_tokens", details["cached_tokens"])
            if cached is not None:
                record.cached_tokens = min(int(cached), record.prompt_tokens)
    if isinstance(event.get("timings"), dict):
        # llama.cpp's own per-request figures: only numbers in range are kept, the rest are noted
        record.timings = {key: figure for key in TIMINGS if key in event["timings"]
                          for figure in [server_figure(record, f"timings.{key}", event["timings"][key])]
                          if figure is not None}
        if "cache_n" in record.timings:                       # its prompt tokens from its cache
            cached = int(record.timings["cache_n"])
            record.cached_tokens = min(cached, record.prompt_tokens) if record.usage_seen else cached


TIMINGS = ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "predicted_per_token_ms", "cache_n")
SPECIAL_TOKENS = 16       # an answer's tokens that stream no text: its end, a template's channel markers
TEMPLATE_TOKENS = 4096    # a chat template's own tokens around the messages sent (a system preamble)


REPLY_CHARS_PER_TOKEN = 64     # a token's text is a few characters: a reply past this many a token is not its tokens'


def reply_text(record: StreamRecord, max_tokens: int) -> str:
    """A reply as the next turn of its conversation sends it back: at most what max_tokens tokens
    can hold, so a server that streams megabytes a token cannot grow every later turn by them."""
    text = "".join(record.text or ())
    most = REPLY_CHARS_PER_TOKEN * max(1, max_tokens)
    if len(text) > most:
        record.left_out.append(("reply", f"the reply's {len(text):,} characters are more than {max_tokens:,} tokens "
                                         f"hold ({REPLY_CHARS_PER_TOKEN} a token): the conversation carries its first "
                                         f"{most:,}"))
        text = text[:most]
    return text


def prompt_estimate(body: dict, config: "LoadConfig") -> int:
    """A request's prompt tokens from the words it sent, where the server's count is missing or
    not believed."""
    words = sum(len(str(m.get("content") or "").split()) for m in body["messages"])
    return max(1, round(words / config.words_per_token + config.template_tokens))


def believe_timings(record: StreamRecord) -> None:
    """llama.cpp's timings, held to what the client saw: its prompt's time within the first
    token's wait, and its prompt's tokens (computed, or from its cache) within the prompt's."""
    timings, why = record.timings or {}, {}
    if "prompt_ms" in timings and record.first_token_s is not None \
            and timings["prompt_ms"] > (record.first_token_s - record.sent_s) * 1000 + 1:
        why["prompt_ms"] = (f"{timings['prompt_ms']:,.1f} ms is longer than the first token's wait, "
                            f"{(record.first_token_s - record.sent_s) * 1000:,.1f} ms")
    for key in ("prompt_n", "cache_n"):
        if record.usage_seen and timings.get(key, 0) > record.prompt_tokens:
            why[key] = f"{timings[key]:,.0f} tokens is more than the prompt's {record.prompt_tokens:,} (usage.prompt_tokens)"
    if "cache_n" in why:
        record.cached_tokens = 0
    for key, reason in why.items():
        record.left_out.append((f"timings.{key}", f"timings.{key} {reason}"))
        del timings[key]


def server_figure(record: StreamRecord, name: str, value) -> Optional[float]:
    """A number a server sent, if it is one in range (0 to 10^9, finite); else None, and the
    record notes it was left out."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value)
                                                                             and 0 <= value <= 1e9):
        record.left_out.append((name, f"{name} {printable(str(value))[:40]!r} is not a number from 0 to 10^9"))
        return None
    return value


MAX_COUNTED_TOKENS = 10**8     # a request's tokens, as a report's arrays hold them (run_from_report)


def send_request(client: Http, body: dict, record: StreamRecord, config: LoadConfig) -> None:
    """One streaming request into `record`; whatever goes wrong becomes its error, by kind."""
    payload = json.dumps(body).encode()
    record.sent_s = time.perf_counter()
    connection = None
    try:
        connection, response = client.open("POST", "/v1/chat/completions", payload,
                                           answer_within=min(config.timeout_s, config.request_timeout_s or math.inf))
        record.answered_s, record.server_date = time.perf_counter(), http_date(response.msg.get_all("Date"))
        record.date_sent = bool(response.msg.get_all("Date"))
        kind = response.getheader("Content-Type") or ""
        if response.status != 200:
            text = client.redact(body_within(response, config))
            # A redirect is not followed (it would take the key to another host): say where it pointed.
            where = response.getheader("Location") if 300 <= response.status < 400 else None
            text = f"redirected to {redact_url(client.redact(where))[:200]}" + \
                ("; pass that as --url" if not re.search(r"[?#]", where) else "") if where else text
            # A server shedding load (429, 503) says when to come back: a lower --rate or --concurrency will.
            after = response.getheader("Retry-After")
            text = " ".join(text.split())[:200] or "(an empty body)"
            if after:
                text += f" (Retry-After: {client.redact(' '.join(after.split()))[:40]})"
            record.error = f"http {response.status}: {text}"
        elif kind and "text/event-stream" not in kind.lower():
            text = client.redact(body_within(response, config))
            record.error = f"not an event stream: Content-Type {kind}: {' '.join(text.split())[:120]}"
        elif (response.getheader("Content-Encoding") or "identity").strip().lower() != "identity":
            # (Not asked for: a proxy that compresses anyway sends bytes that hold no event.)
            coding = client.redact(" ".join(response.getheader("Content-Encoding").split()))[:40]
            record.error = (f"not an event stream: the body is compressed (Content-Encoding {coding}), which a "
                            f"streaming client does not ask for; turn compression off for this route")
        else:
            read_stream(response, response.socket, record, 4 * body["max_tokens"] + 64, config.timeout_s,
                        config.request_timeout_s)
            if not record.usage_seen:      # the server ignored include_usage: what can be counted instead,
                record.output_tokens = len(record.token_times)          # its content events, and the prompt
                record.prompt_tokens = prompt_estimate(body, config)   # it was sent
            # max_tokens caps what a server generates, and each content event carries a token at
            # least: a count past the one or under the other (a proxy that recounts with another
            # tokenizer) contradicts the request or the stream, and would price each gap wrongly
            # and a token is a byte of text at least, but for the few a template's markers take
            # (with ignore_eos the tokens after an end stream no text: no such bound)
            most = min(body["max_tokens"], math.inf if body.get("ignore_eos") else record.streamed_bytes + SPECIAL_TOKENS)
            if record.usage_seen and not max(1, len(record.token_times)) <= record.output_tokens <= most:
                why = f"more than max_tokens {body['max_tokens']:,}" if record.output_tokens > body["max_tokens"] else \
                    (f"more than the {record.streamed_bytes:,} bytes of text streamed (+{SPECIAL_TOKENS} for "
                     f"markers) can hold") if record.output_tokens > most else \
                    "none" if not record.output_tokens else "fewer than the content events"
                record.left_out.append(("usage.completion_tokens",
                                        f"usage.completion_tokens {record.output_tokens:,} is {why}; the stream's "
                                        f"{len(record.token_times):,} content events were counted instead"))
                record.output_tokens = len(record.token_times)
            # (text alone: an image sent as a part of a message is tokens no byte count bounds)
            texts = [m.get("content") for m in body["messages"]]
            sent = sum(len(t.encode()) for t in texts if isinstance(t, str))
            if record.usage_seen and all(isinstance(t, str) for t in texts) and \
                    record.prompt_tokens > sent + TEMPLATE_TOKENS:
                record.left_out.append(("usage.prompt_tokens",
                                        f"usage.prompt_tokens {record.prompt_tokens:,} is more than the {sent:,} bytes "
                                        f"sent (+{TEMPLATE_TOKENS:,} for a chat template) can hold; the words sent were "
                                        f"counted instead"))
                record.prompt_tokens = prompt_estimate(body, config)
                record.cached_tokens = min(record.cached_tokens, record.prompt_tokens)
            believe_timings(record)
    except StreamError as e:
        record.error = client.redact(str(e))[:300]
    except (socket.timeout, TimeoutError):
        record.error = "timeout: " + (f"no answer within {config.request_timeout_s:g} s (--request-timeout)"
                                      if (config.request_timeout_s or math.inf) < config.timeout_s else
                                      f"no answer for {config.timeout_s:g} s (--timeout)")
    except ServerUnreachable:
        record.error = "connection: refused"
        raise
    except OSError as e:
        if e.errno in (errno.EMFILE, errno.ENFILE):     # this machine's limit, not the server's doing
            record.error = f"client: out of open files ({e.strerror}); raise ulimit -n, or lower --concurrency"
        else:          # reset, broken pipe
            record.error = client.redact(f"connection: {type(e).__name__}: {e}")[:240]
    except http.client.IncompleteRead:                  # a chunk size that is not one, or a chunk cut short
        record.error = "truncated: the body's chunked transfer encoding broke off"
    except http.client.HTTPException as e:              # too many headers, a bad status line
        record.error = client.redact(f"connection: {type(e).__name__}: {e}")[:240]
    finally:
        record.ended_s = time.perf_counter()
        if connection is not None:
            connection.close()
        if record.error:
            record.error = client.redact(record.error)
        if record.finish_reason:
            record.finish_reason = client.redact(record.finish_reason)[:80]
        record.left_out = [(name, client.redact(why)) for name, why in record.left_out]


def body_within(response, config: LoadConfig, limit: int = 65536) -> str:
    """Up to `limit` bytes of an answer that is not a stream (an error's body), read within
    --timeout (and --request-timeout): a server that drips it holds the request no longer than a
    stream's would, and what came by then is kept."""
    body, wait = bytearray(), min(config.timeout_s, config.request_timeout_s or math.inf)
    end = time.perf_counter() + wait
    with contextlib.suppress(OSError, http.client.HTTPException):
        while len(body) < limit:
            remaining = end - time.perf_counter()
            if remaining <= 0:
                break
            response.socket.settimeout(remaining)
            chunk = response.read1(limit - len(body))
            if not chunk:
                return body.decode("utf-8", errors="replace")
            body += chunk
    if len(body) >= limit:
        return body.decode("utf-8", errors="replace")
    return body.decode("utf-8", errors="replace") + f" (the rest of its body did not come within {wait:g} s)"


def words_for(config: LoadConfig, tokens: float) -> int:
    return max(1, round(tokens * config.words_per_token))


def run_text(config: LoadConfig, key, tokens: int) -> str:
    """The text of one content run: the same run (a hash id, a system prompt) is the same text
    within a run of loadgen and different text in another run, so a server's cache is shared
    exactly where the trace says, and not across runs."""
    rng = random.Random(f"{config.run_id}:{config.seed}:{key!r}")
    return " ".join(rng.choice(PROMPT_WORDS) for _ in range(words_for(config, tokens)))


def request_body(config: LoadConfig, model: str, index: int, history: Optional[list] = None) -> dict:
    max_tokens, ignore_eos = config.max_tokens, config.ignore_eos
    if config.prompts:
        messages = config.prompts[index % len(config.prompts)]
    elif config.trace and history:
        # A session's later turn: the conversation so far (the server's own replies), then its new
        # message, the rest of the row's prompt_tokens after its parent's prompt and output.
        _, prompt, output, _ = config.trace.rows[index]
        _, asked, answered, _ = config.trace.rows[config.trace.parents[index]]
        own = max(1, prompt - asked - answered)
        messages = list(history) + [{"role": "user", "content": make_prompt(index, words_for(config, own), config.seed,
                                                                             config.run_id)}]
        max_tokens, ignore_eos = output, True
    elif config.trace:
        _, prompt, output, runs = config.trace.rows[index]
        shared = sum(tokens for _, tokens in runs)
        own = max(0.0, prompt - shared - config.template_tokens)
        text = " ".join([run_text(config, key, tokens) for key, tokens in runs]
                        + ([make_prompt(index, words_for(config, own), config.seed, config.run_id)] if own >= 1 else []))
        messages, max_tokens, ignore_eos = [{"role": "user", "content": text}], output, True
    else:
        own = config.prompt_words - (config.template_tokens if not history else 0)
        words = words_for(config, own) if config.size_prompts else config.prompt_words
        messages = list(history or []) + [{"role": "user", "content": make_prompt(index, words, config.seed,
                                                                                   config.run_id)}]
        if config.prefix_words and not history:     # a later turn's history starts with it already
            # shared on purpose, across runs too
            system = make_prompt(-1, words_for(config, config.prefix_words) if config.size_prompts else
                                 config.prefix_words, config.seed)
            messages.insert(0, {"role": "system", "content": system})
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}
    if ignore_eos:
        body["ignore_eos"] = True
    return body


def asked_tokens(config: LoadConfig, index: int) -> Optional[int]:
    if config.trace:
        return config.trace.rows[index][1]
    return None if config.prompts else config.prompt_words + config.prefix_words


def size_prompts(client: Http, model: str, config: LoadConfig) -> dict:
    """Tokens per word, from the server's own usage counts for two probe prompts that differ by
    128 words (sent before the run, not counted); prompts are then built to the asked token
    counts. A server that reports no usable counts keeps one word per token, and says so."""
    counts = []
    for words in (16, 144):
        record = StreamRecord(-1)
        text = make_prompt(-1, words, config.seed, f"{config.run_id}-probe-{words}")
        body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 1, "stream": True,
                "stream_options": {"include_usage": True}}
        send_request(client, body, record, config)
        if record.error or not record.usage_seen:
            return {"note": f"no prompt sizing: the probe request {'failed: ' + record.error if record.error else 'got no usage counts'}; "
                            f"prompts are one word per token"}
        counts.append(record.prompt_tokens)
    per_word = (counts[1] - counts[0]) / 128
    if not 0.2 <= per_word <= 20:
        return {"note": f"no prompt sizing: 128 more words changed the prompt by {counts[1] - counts[0]} tokens; "
                        f"prompts are one word per token"}
    config.words_per_token = 1 / per_word
    config.template_tokens = max(0.0, counts[0] - 16 * per_word)
    return {"tokens_per_word": per_word, "template_tokens": config.template_tokens}


def read_prompts(path: str) -> list:
    """JSONL: each line {"prompt": "..."} or {"messages": [...]}."""
    prompts = []

    def text(value) -> bool:      # what a server can take as a message: some text, or a list of parts
        return isinstance(value, str) and value.strip() != "" or isinstance(value, list) and value != []
    for where, row in read_jsonl(path, "prompts"):
        if isinstance(row, dict) and text(row.get("prompt")) and isinstance(row["prompt"], str):
            prompts.append([{"role": "user", "content": row["prompt"]}])
        elif isinstance(row, dict) and isinstance(row.get("messages"), list) and row["messages"] and all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and m["role"].strip() and text(m.get("content"))
                for m in row["messages"]):
            prompts.append(row["messages"])
        else:
            raise UserError(f"{where}: expected {{\"prompt\": \"text\"}} or {{\"messages\": [{{\"role\": ..., "
                            f"\"content\": ...}}]}}, each role and content not empty")
    if not prompts:
        raise UserError(f"prompts {path}: no prompts in it")
    return prompts


# Prometheus text format, by exact name. Labelled series of one name are summed (vLLM has one
# per engine); `_created` samples are timestamps, not values.

# No gauge or counter of a serving engine comes near this; a sample beyond it is left out.
PROMETHEUS_LIMIT = 1e15


LABEL = re.compile(r'([A-Za-z_]\w*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str, ignored: Optional[Counter] = None) -> dict[str, float]:
    """name -> value; samples that are not finite or beyond PROMETHEUS_LIMIT are left out (and
    counted by name in `ignored`)."""
    values: dict[str, float] = {}
    series = set()

    def ignore(key: str) -> None:         # by name, the first 32 names: a page may hold thousands
        if ignored is not None:
            ignored[key if key in ignored or len(ignored) < 32 else "other names"] += 1
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "{" in line:
            name, _, rest = line.partition("{")
            labels, _, rest = rest.rpartition("}")
        else:
            name, _, rest = line.partition(" ")
            labels = ""
        name = name.strip()
        parts = rest.split()
        if not parts or name.endswith("_created"):
            continue
        one = (name, tuple(sorted(LABEL.findall(labels))))      # (its labels in any order: one series)
        if one in series:      # one series twice (Prometheus refuses such a page): added, it counts twice
            ignore(f"{name} given twice")
            continue
        series.add(one)
        try:
            if "_" in parts[0]:     # (Python reads 1_000; the text format has no such number)
                raise ValueError(parts[0])
            value = float(parts[0])
        except ValueError:          # not a number at all: left out, and counted as one that is out of range
            ignore(name)
            continue
        if math.isfinite(value) and abs(value) <= PROMETHEUS_LIMIT:
            # A counter or a count over several label sets (a data-parallel server's engines) adds
            # up; a share of the KV cache does not: the fullest cache is the one that binds.
            values[name] = max(values.get(name, 0.0), value) if name in KV_GAUGES else values.get(name, 0.0) + value
        else:
            ignore(name)
    return values


# The servers' gauges for the timeline: running, waiting, and KV use (a fraction, shown as %).
RUNNING_GAUGES = ("vllm:num_requests_running", "llamacpp:requests_processing", "sglang:num_running_reqs")
WAITING_GAUGES = ("vllm:num_requests_waiting", "llamacpp:requests_deferred", "sglang:num_queue_reqs")
KV_GAUGES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "llamacpp:kv_cache_usage_ratio", "sglang:token_usage")
# What a scrape keeps: the samples server_window and the timeline read (a page may hold thousands).
SCRAPED = frozenset((*RUNNING_GAUGES, *WAITING_GAUGES, *KV_GAUGES,
                     "llamacpp:n_decode_total", "llamacpp:n_busy_slots_per_decode", "llamacpp:prompt_tokens_total",
                     "llamacpp:tokens_predicted_total", "llamacpp:prompt_tokens_cached_total",
                     "vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total",
                     "vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total", "vllm:num_preemptions_total",
                     "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "sglang:cached_tokens_total",
                     "sglang:prompt_tokens_total", "sglang:generation_tokens_total"))


class MetricsSampler:
    """Scrapes /metrics before, every interval during, and after a run; reports a missing
    endpoint once and carries on. Each scrape ends within --timeout (Http.get); the last one is
    optional: if it fails, the window ends at the last scrape that answered. Also measures how
    late a sleeping thread wakes, the client's own worst scheduling delay, which bounds how late
    an event's timestamp can be."""
    def __init__(self, client: Http, interval_s: float):
        self.client = client
        self.interval_s = interval_s
        self.final_scrape = True
        self.scrapes: list[dict[str, float]] = []
        self.times: list[float] = []           # when each scrape was read (perf_counter)
        self.problem: Optional[str] = None     # why /metrics cannot be read: no more scrapes
        self.skipped: list[str] = []           # why each scrape that failed after one had answered failed
        self.final_problem: Optional[str] = None
        self.ignored: Counter = Counter()      # samples out of range, by name
        self.worst_wake_delay_s = 0.0
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.closed = False                    # the report has taken the scrapes: keep no more
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def scrape(self, final: bool = False, during: bool = False) -> None:
        """One scrape; `during`: taken while streams are read, so its reading delays their events."""
        if self.problem:
            return
        problem = None
        try:
            status, body = self.client.get("/metrics")
        except (OSError, http.client.HTTPException, CapacityError) as e:
            problem = f"/metrics could not be read ({type(e).__name__}: {self.client.redact(str(e))[:160]})"
        else:
            began = time.perf_counter()
            read = parse_prometheus(body.decode("utf-8", errors="replace"), self.ignored)
            # Decoding and reading a page holds the interpreter in long C calls, during which no
            # stream is read: a page of megabytes delays every event's timestamp by that long.
            if during:
                self.worst_wake_delay_s = max(self.worst_wake_delay_s, time.perf_counter() - began)
            values = {name: value for name, value in read.items() if name in SCRAPED}   # kept for every scrape
            if status != 200:
                detail = self.client.redact(" ".join(body[:160].decode("utf-8", errors="replace").split()))
                problem = (f"/metrics answered HTTP {status} ({detail}); llama.cpp needs --metrics, SGLang "
                           f"--enable-metrics")
            elif not read:
                problem = "/metrics answered but held no samples in Prometheus text format"
        with self.lock:
            if self.closed:
                return
            if problem and final and self.scrapes:
                self.final_problem = f"the last scrape failed, so the window ends at the one before: {problem}"
            elif problem and self.scrapes:     # it answered before: a stall or a hiccup, not a missing endpoint
                self.skipped.append(problem)
            elif problem:
                self.problem = problem
            else:
                self.scrapes.append(values)
                self.times.append(time.perf_counter())

    def loop(self) -> None:
        next_scrape = time.perf_counter() + self.interval_s
        while not self.stop.is_set():
            wake = time.perf_counter() + 0.005
            self.stop.wait(0.005)
            self.worst_wake_delay_s = max(self.worst_wake_delay_s, time.perf_counter() - wake)
            if time.perf_counter() >= next_scrape:
                self.scrape(during=True)
                next_scrape = time.perf_counter() + self.interval_s
        if self.final_scrape:
            self.scrape(final=True)

    def __enter__(self):
        self.scrape()
        self.thread.start()
        return self

    def finish(self) -> None:
        """The run is over: take the last scrape and stop. The thread takes it; this one only
        waits, so Ctrl-C or SIGTERM during a slow last scrape ends the wait, not the report."""
        self.stop.set()
        while self.thread.is_alive():
            self.thread.join(0.05)
        self.close()

    def close(self) -> None:
        """Keep the scrapes taken so far; any later one is dropped."""
        self.final_scrape = False
        self.stop.set()
        with self.lock:
            self.closed = True

    def __exit__(self, *exc):
        self.close()


SHARES = ("peak_kv_cache_usage", "peak_token_usage", "prefix_hit_rate")     # of the cache, of prefix lookups: 0 to 1
WHOLE_COUNTS = ("decode_calls", "peak_requests_processing", "peak_requests_deferred", "peak_running", "peak_waiting",
                "peak_queued", "preemptions")      # requests and calls come whole


# Requests a server runs or holds at once, and its mean batch: no engine's come near this (vLLM's
# --max-num-seqs, SGLang's --max-running-requests and llama.cpp's slots are thousands at most).
REQUEST_FIGURES = ("peak_running", "peak_waiting", "peak_queued", "peak_requests_processing", "peak_requests_deferred",
                   "mean_batch_per_decode")
MAX_REQUESTS_SEEN = 10**7


def server_window(scrapes: list[dict[str, float]]) -> dict:
    """Before/after deltas of counters and before/peak/after of gauges, by server."""
    if len(scrapes) < 2:
        return {}
    before, after = scrapes[0], scrapes[-1]

    went_down, below_zero = [], []

    def delta(name):     # a counter that went backwards (the server restarted) has no window
        if name not in after or name not in before:
            return None
        seen = [s[name] for s in scrapes if name in s]
        if min(seen) < 0:
            below_zero.append(f"{name} {min(seen):,.4g}")    # no counter counts below 0
            return None
        if any(later < earlier for earlier, later in zip(seen, seen[1:])):    # (and back above: still a restart)
            went_down.append(name)
            return None
        return after[name] - before[name]

    def peak(name):
        seen = [s[name] for s in scrapes if name in s]
        return max(seen) if seen else None

    def first(*names):
        return next((n for n in names if n in after), names[0])

    window: dict = {}
    if any(n.startswith("llamacpp:") for n in after):
        decodes = delta("llamacpp:n_decode_total")
        busy = None
        if decodes:
            # n_busy_slots_per_decode is a running mean since start; undo it over the window.
            m0, m1 = before.get("llamacpp:n_busy_slots_per_decode"), after.get("llamacpp:n_busy_slots_per_decode")
            if m0 is not None and m1 is not None:
                busy = (m1 * after["llamacpp:n_decode_total"] - m0 * before["llamacpp:n_decode_total"]) / decodes
        prompt, predicted = delta("llamacpp:prompt_tokens_total"), delta("llamacpp:tokens_predicted_total")
        window = {
            "server": "llama.cpp",
            "decode_calls": decodes,
            "mean_batch_per_decode": busy,
            "tokens_per_decode": (prompt + predicted) / decodes if decodes and prompt is not None and predicted is not None else None,
            "peak_requests_processing": peak("llamacpp:requests_processing"),
            "peak_requests_deferred": peak("llamacpp:requests_deferred"),
            "prompt_tokens": prompt,
            "prompt_tokens_cached": delta("llamacpp:prompt_tokens_cached_total"),
            "generated_tokens": predicted,
        }
    elif any(n.startswith("vllm:") for n in after):
        queries = delta(first("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"))
        hits = delta(first("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"))
        window = {
            "server": "vllm",
            "peak_running": peak("vllm:num_requests_running"),
            "peak_waiting": peak("vllm:num_requests_waiting"),
            "peak_kv_cache_usage": peak(first("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")),
            "preemptions": delta("vllm:num_preemptions_total"),
            "prefix_hit_rate": hits / queries if queries and hits is not None else None,
            "prompt_tokens": delta("vllm:prompt_tokens_total"),
            "generated_tokens": delta("vllm:generation_tokens_total"),
        }
    elif any(n.startswith("sglang:") for n in after):
        window = {
            "server": "sglang",
            "peak_running": peak("sglang:num_running_reqs"),
            "peak_queued": peak("sglang:num_queue_reqs"),
            "peak_token_usage": peak("sglang:token_usage"),
            "cached_tokens": delta("sglang:cached_tokens_total"),
            "prompt_tokens": delta("sglang:prompt_tokens_total"),
            "generated_tokens": delta("sglang:generation_tokens_total"),
        }
    else:
        window = {"server": "unknown"}
    # Each figure held to what a server can give: no count of requests or tokens below 0, no share
    # of the cache or of prefix lookups above 1. One that is not is left out and said.
    bad = {key: value for key, value in window.items() if isinstance(value, (int, float)) and not isinstance(value, bool)
           and (value < 0 or (key in SHARES and value > 1) or (key in WHOLE_COUNTS and value != int(value))
                or (key in REQUEST_FIGURES and value > MAX_REQUESTS_SEEN))}
    # Every busy slot of a decode call computes a token at least: more slots than tokens a call is
    # a running mean and a call count that do not belong together.
    busy, tokens = window.get("mean_batch_per_decode"), window.get("tokens_per_decode")
    # (llama.cpp prints its counters to 6 digits: a window's means are off by a few percent)
    if busy is not None and tokens is not None and busy > tokens * 1.05 + 0.01 and "mean_batch_per_decode" not in bad:
        bad["mean_batch_per_decode"] = busy
    if bad or below_zero:
        window.update(dict.fromkeys(bad))
        window["impossible"] = "left out, as no server gives them: " + ", ".join(
            [*(f"{key} {value:,.4g}" for key, value in bad.items()), *(printable(n) for n in below_zero)])
    if went_down:
        window["went_down"] = (f"{', '.join(printable(n) for n in sorted(set(went_down)))} went down between two "
                               f"scrapes (the server restarted?): their window is left out")
    window["scrapes"] = len(scrapes)
    return window


def timings_report(records: list[StreamRecord]) -> Optional[dict]:
    """llama.cpp's own per-request timings: prefill time, and TTFT minus it (queue plus network).
    take_event kept only numbers in range."""
    timed = [r for r in records if r.error is None and r.timings and r.first_token_s is not None]
    if not timed:
        return None
    prompted = [r for r in timed if "prompt_ms" in r.timings]
    prefill = Counter(float(r.timings["prompt_ms"]) for r in prompted)
    waited = Counter((r.first_token_s - r.sent_s) * 1000 - float(r.timings["prompt_ms"]) for r in prompted)
    per_token = Counter(float(r.timings["predicted_per_token_ms"]) for r in timed if r.timings.get("predicted_per_token_ms"))
    return {
        "requests": len(timed),
        "prompt_ms": distribution(prefill),
        "ttft_minus_prompt_ms": distribution(waited),
        "predicted_per_token_ms": distribution(per_token),
        "prompt_n": sum(int(r.timings.get("prompt_n") or 0) for r in timed),
        "cache_n": sum(int(r.timings.get("cache_n") or 0) for r in timed),
        "predicted_n": sum(int(r.timings.get("predicted_n") or 0) for r in timed),
    }


class Stopped(Exception):
    """A run that ended early: the report still holds what was measured; main() prints the
    message and exits with the code (1: the server went away, 130: Ctrl-C, 143: SIGTERM)."""
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code, self.message = code, message

    @classmethod
    def by_signal(cls, e: BaseException, what: str) -> "Stopped":
        """Ctrl-C (130) or SIGTERM (143), with what was kept: "interrupted after ..."."""
        code = 143 if isinstance(e, Terminated) else 130
        return cls(code, f"{'terminated' if code == 143 else 'interrupted'} after {what}")


def kept_of(done: int, total: int, noun: str, probes: int = 0, cut: int = 1) -> str:
    """What an interrupted sweep or search kept, for Stopped.by_signal (`probes`: the ended probes
    of the `cut` deployments a search was in the middle of)."""
    more = f"the {probes:,} ended probe{'s' * (probes != 1)} of the " + ("one interrupted" if cut == 1 else
                                                                          f"{cut} interrupted")
    if not done:
        return f"0 of {total:,} {noun}{'s' * (total != 1)}: none had finished, so the output holds " + \
            (more if probes else "none")
    return f"{done:,} of {total:,} {noun}{'s' * (total != 1)}; the output holds the finished ones" + \
        (f" and {more}" if probes else "")


# Ctrl-C and SIGTERM, once main() has installed on_signal. The first one stops the work (raised as
# KeyboardInterrupt or Terminated); from then on the program only writes what it has, so a second
# one (a double Ctrl-C, or `timeout` signalling the process and then its group) is noted and the
# report still comes out; a third quits at once. While held even the first is only
# noted (hold_signals()), so a report being built from what was measured always comes out whole.
SIGNAL_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}
SIGNAL_WORDS = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}
stops = {"held": False, "noted": []}


def on_signal(signum, frame) -> None:
    stops["noted"].append(signum)
    first = stops["noted"][0]
    if len(stops["noted"]) >= 3:
        os.write(2, f"servesim: {SIGNAL_WORDS[first]} three times: quitting without the output\n".encode())
        for executor in list(POOLS):        # no worker outlives the quit
            signal_workers(executor, signal.SIGKILL)
        os._exit(SIGNAL_CODES[first])
    if not stops["held"]:
        stops["held"] = True
        raise signal_exception(signum)


def signal_exception(signum: int) -> BaseException:
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def hold_signals(hold: bool = True) -> None:
    """hold_signals(): from now on Ctrl-C and SIGTERM are noted, not raised (see noted_stop());
    hold_signals(False): raised again, unless one was noted (the program is then finishing)."""
    if hold or not stops["noted"]:
        stops["held"] = hold


def noted_stop(what: str) -> Optional[Stopped]:
    """A Stopped for the first signal noted while held, or None."""
    return Stopped.by_signal(signal_exception(stops["noted"][0]), what) if stops["noted"] else None


def server_shape(client: Http) -> tuple[dict, str]:
    """The server's own shape, to simulate the same server: llama.cpp's slots and per-slot context
    from /props, or vLLM's KV blocks from the cache_config_info of its /metrics; or no shape and
    why not (then the simulator's defaults stand in)."""
    try:
        status, body = client.get("/props")
        if status != 200:
            return vllm_cache_shape(client, f"no llama.cpp /props (HTTP {status})")
        props = json.loads(body)
        slots, context = props["total_slots"], props["default_generation_settings"]["n_ctx"]
    except (OSError, http.client.HTTPException, CapacityError, ValueError, KeyError, TypeError, RecursionError) as e:
        return vllm_cache_shape(client, f"no usable llama.cpp /props ({type(e).__name__})")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (slots, context)) \
            or not (1 <= slots <= 65536 and 1 <= context <= 10**8):
        return {}, client.redact(f"/props reports {str(slots)[:40]!r} slots of {str(context)[:40]!r} tokens, not a "
                                 f"server shape: simulator defaults")
    return {"max_num_seqs": slots, "kv_tokens": slots * context, "max_num_batched_tokens": 2048,
            "source": "llama.cpp /props"}, ""


CACHE_CONFIG = "vllm:cache_config_info"


def vllm_cache_shape(client: Http, why_not_props: str) -> tuple[dict, str]:
    """vLLM's KV cache as its /metrics states it: an info gauge whose labels carry num_gpu_blocks,
    block_size and enable_prefix_caching (vllm/v1/metrics/loggers.py). Its batch limits are not
    exported, so those stay the simulator's."""
    unknown = f"{why_not_props}, no vLLM {CACHE_CONFIG} on /metrics: simulator defaults"
    try:
        status, body = client.get("/metrics")
    except (OSError, http.client.HTTPException, CapacityError) as e:
        return {}, f"{why_not_props}, and /metrics could not be read for vLLM's {CACHE_CONFIG} ({type(e).__name__}): " \
                   f"simulator defaults"
    lines = [l for l in body.decode("utf-8", errors="replace").splitlines()
             if l.startswith(CACHE_CONFIG + "{")] if status == 200 else []
    if not lines:
        return {}, unknown
    caches = set()
    for line in lines:        # one per data-parallel rank, the same cache each
        labels = dict(LABEL.findall(line.partition("{")[2].rpartition("}")[0]))
        digits = [labels.get("num_gpu_blocks", ""), labels.get("block_size", "")]
        caching = {"True": True, "False": False}.get(labels.get("enable_prefix_caching", ""))
        if not all(re.fullmatch(r"[0-9]{1,12}", d) for d in digits) or caching is None:
            return {}, client.redact(f"vLLM's {CACHE_CONFIG} holds no usable num_gpu_blocks, block_size and "
                                     f"enable_prefix_caching ({printable(line[:160])}): simulator defaults")
        caches.add((int(digits[0]), int(digits[1]), caching))
    if len(caches) > 1:
        return {}, f"vLLM's {CACHE_CONFIG} gives {len(caches):,} different caches: simulator defaults"
    blocks, block_size, caching = caches.pop()
    if not (1 <= blocks <= 10**9 and SERVER_SHAPE["block_size"][0] <= block_size <= SERVER_SHAPE["block_size"][1]
            and blocks * block_size <= SERVER_SHAPE["kv_tokens"][1]):
        return {}, client.redact(f"vLLM's {CACHE_CONFIG} reports {blocks:,} blocks of {block_size:,} tokens, not a "
                                 f"cache: simulator defaults")
    return {"kv_tokens": blocks * block_size, "block_size": block_size, "prefix_caching": caching,
            "source": f"vLLM {CACHE_CONFIG}"}, ""


# Load from many machines: each sends its share of one schedule from the same instant, and says
# how late it started and how far its clock is from the server's, so merge can say how far apart
# the machines were.

START_LATE_S = 1.0           # a machine later than this to --start-at would skew the load it shares
START_SCRAPE_S = 10.0        # the first /metrics scrape begins this long before --start-at
START_AHEAD_S = 7 * 86400
DATE_SLACK_S = 1.5           # uvicorn (vLLM, SGLang) refreshes its cached Date about once a second


def check_start(start_at: float, why: str = "") -> None:
    ahead = start_at - time.time()
    if ahead < -START_LATE_S:
        raise UserError(f"--start-at {start_at:.3f}: this machine's clock passed it {-ahead:,.1f} s ago"
                        f"{f' ({why})' if why else ''}; give every machine a later instant, e.g. "
                        f"$(( $(date +%s) + 60 ))")
    if ahead > START_AHEAD_S:
        raise UserError(f"--start-at {start_at:.0f} is {ahead / 86400:,.1f} days away; at most 7")


def wait_until(instant: float, progress: Optional[Progress] = None) -> None:
    said = math.inf
    while (left := instant - time.time()) > 0:
        if progress and left > 1 and said - left >= 10:
            said = left
            progress(f"waiting for --start-at: {left:,.0f} s")
        time.sleep(min(left, 0.5))


def http_date(values: Optional[list]) -> Optional[float]:
    """An answer's one HTTP Date header as Unix seconds; None when absent, repeated, or not a
    date of this century. HTTP dates are GMT, the asctime form included."""
    if not values or len(values) != 1 or len(values[0]) > 64:
        return None
    try:
        moment = email.utils.parsedate_to_datetime(values[0])
        value = (moment if moment.tzinfo else moment.replace(tzinfo=datetime.timezone.utc)).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return value if 1e9 <= value <= 1e10 else None


def server_clock(records: list[StreamRecord], started: float, started_unix: float) -> dict:
    """How far the server's clock is ahead of this machine's, bounded by its Date headers: a Date
    D (whole seconds) on an answer asked at s and received at r means the server read between D
    and D + 1 at some instant of [s, r], so the offset lies in [D - r, D + 1 - s]. Each answer
    narrows it; merge compares machines through the server's clock."""
    wall = lambda perf: started_unix + perf - started
    bounds = [(r.server_date - wall(r.answered_s), r.server_date + 1 + DATE_SLACK_S - wall(r.sent_s))
              for r in records if r.server_date is not None and r.answered_s is not None and r.sent_s]
    if not bounds:
        unreadable = any(r.date_sent for r in records)
        return {"offset_s": None, "why": "the server's Date headers were not one readable date each" if unreadable
                else "the server sent no Date header"}
    low, high = max(b[0] for b in bounds), min(b[1] for b in bounds)
    if low > high:
        return {"offset_s": None, "why": f"the server's Date headers contradict each other by {low - high:.2f} s"}
    return {"offset_s": (low + high) / 2, "low_s": low, "high_s": high, "answers": len(bounds)}


def schedule_fingerprint(config: LoadConfig) -> str:
    """What fixes the schedule every shard draws its share from: equal on every machine of one run."""
    digest = hashlib.sha256(repr((
        config.seed, config.rate, config.burstiness, config.ramp_up,
        config.rate_profile.windows if config.rate_profile else None, config.time_scale, config.requests,
        config.duration_s, config.turns, config.think_time_s, config.prompt_words, config.prefix_words,
        config.max_tokens, config.ignore_eos, config.warmup, config.start_at)).encode())
    for row in (config.trace.rows if config.trace else ()):
        digest.update(repr(row).encode())
    if config.trace:
        digest.update(repr((config.trace.parents, config.trace.delays)).encode())
    for prompt in config.prompts or ():
        digest.update(repr(prompt).encode())
    return digest.hexdigest()[:16]


HEARTBEAT_LOAD_S = 5.0      # loadgen says how far it is at least this often, requests ending or not


def run_load(config: LoadConfig, progress: Optional[Progress] = None) -> tuple[dict, list[StreamRecord], Optional[Stopped]]:
    """Closed loop: `concurrency` clients, each sending its next request (or conversation) when
    the last ends. Open loop (--rate, a ramp, a --trace): each request (each conversation's first
    turn) is sent at its scheduled time, at most `concurrency` in flight if given; a turn after
    the first is sent think-time after the reply before it, with that reply in its history.
    Both stop at --requests, and stop sending at --duration; requests in flight finish.
    Every request's outcome is kept: a server that stops accepting connections, Ctrl-C or SIGTERM
    end the run early, and the report holds what completed plus why it stopped."""
    client = Http(config.url, config.timeout_s, config.api_key)
    # The load first: what is wrong with it is the user's to fix, whatever the server does.
    rows = config.trace.rows if config.trace else None
    turns = max(1, config.turns)
    limit = config.requests if config.requests is not None else math.inf
    if rows is not None:
        limit = min(limit, len(rows))
    sends = profile_sends(config.rate_profile, config.time_scale, config.seed, config.burstiness,
                          -(-config.requests // turns) if config.requests else 0) if config.rate_profile else None
    if sends is not None:
        limit = min(limit, len(sends) * turns)
        if config.warmup >= limit:
            raise UserError(f"--warmup {config.warmup:,} leaves no request to measure: rate profile "
                            f"{config.rate_profile.name} sends {limit:,}")
    # (A progress that can say what a slow step waits on, or none: the same steps, in silence.)
    slow = getattr(progress, "during", None) or (lambda text: contextlib.nullcontext())
    with slow(f"waiting for {client.url}/v1/models (up to {config.timeout_s:g} s, --timeout)"):
        model = config.model or first_model(client)
    shown_model = client.redact(model)[:160]   # the id is the server's text: sent back as it is, shown redacted
    with slow(f"sizing prompts with two probe requests (each up to {config.timeout_s:g} s, --timeout; "
              f"--no-size-prompts skips them)"):
        sizing = size_prompts(client, model, config) if config.size_prompts and not config.prompts else None
    lock = threading.Lock()
    records: list[StreamRecord] = []
    in_flight: dict[int, StreamRecord] = {}
    stop = threading.Event()
    refused: list[str] = []
    issued = 0
    slots = threading.BoundedSemaphore(config.concurrency) if config.concurrency else None
    rng = random.Random(config.seed)
    open_loop = bool(config.rate or config.ramp_up or rows or sends)
    # A trace's sessions: the row that continues each row, sent by the machine that sent its parent.
    parents = config.trace.parents if config.trace else ()
    child_of = {parent: row for row, parent in enumerate(parents) if parent >= 0 and row < limit}

    def next_unit() -> Optional[int]:
        """The next conversation (a single request when --turns is 1) to start, or None."""
        nonlocal issued
        with lock:
            if stop.is_set() or issued * turns >= limit or (config.duration_s is not None
                                                            and time.perf_counter() - started >= config.duration_s):
                return None
            issued += 1
            return issued - 1

    def send(index: int, body: dict, turn: int, scheduled: Optional[float]) -> StreamRecord:
        record = StreamRecord(index, turn=turn, scheduled_s=scheduled,
                              asked_prompt_tokens=asked_tokens(config, index) if turn <= 1 else None)
        record.text = [] if turns > 1 or index in child_of else None
        with lock:
            in_flight[index] = record
        try:
            send_request(client, body, record, config)
        except ServerUnreachable as e:
            refused.append(str(e))
            stop.set()                # the server is gone: send nothing more
        except Exception as e:        # a bug of ours: keep the request, say what happened
            record.error = client.redact(f"client error: {type(e).__name__}: {e}")[:240]
        with lock:
            if in_flight.pop(index, None) is not None:   # else the main thread already counted it
                records.append(record)
        if progress:
            failed = sum(1 for r in records if r.error)
            progress(f"{len(records):,} requests done, {failed:,} failed, {time.perf_counter() - started:.1f} s")
        return record

    def run_unit(unit: int, scheduled: Optional[float] = None) -> None:
        """One request, or one conversation: each turn carries the questions and the server's
        own replies so far."""
        history: list = []
        for turn in range(1, turns + 1):
            index = unit * turns + turn - 1
            if index >= limit or (turn > 1 and stop.is_set()):
                return
            body = request_body(config, model, index, history)
            record = send(index, body, turn if turns > 1 else 0, scheduled if turn == 1 else None)
            if turns == 1:
                return
            if record.error:          # the rest of this conversation cannot be sent: count it, at the stop
                with lock:
                    for later in range(turn + 1, turns + 1):
                        if unit * turns + later - 1 < limit:
                            records.append(StreamRecord(unit * turns + later - 1, turn=later, sent_s=record.sent_s,
                                                        error=f"{TURN_FAILED}: turn {turn} failed"))
                return
            history = body["messages"] + [{"role": "assistant", "content": reply_text(record, body["max_tokens"])}]
            if stop.wait(config.think_time_s):
                return

    def run_session(row: int, scheduled: float) -> None:
        """A trace row and the rows that continue it, each sent with the conversation so far once
        the one before it has ended, after its delay (or at its own time, never before)."""
        history, turn = [], 1 if row in child_of else 0
        while True:
            body = request_body(config, model, row, history)
            record = send(row, body, turn, scheduled)
            child = child_of.get(row)
            if child is None:
                return
            if record.error:          # the rest of this session cannot be sent: count it
                with lock:
                    later = turn + 1
                    while child is not None:
                        records.append(StreamRecord(child, turn=later, sent_s=record.sent_s,
                                                    error=f"{TURN_FAILED}: turn {turn} failed"))
                        child, later = child_of.get(child), later + 1
                return
            history = body["messages"] + [{"role": "assistant", "content": reply_text(record, body["max_tokens"])}]
            if rows[child][1] <= rows[row][1] + rows[row][2]:
                history = []          # its prompt_tokens cannot hold the conversation so far: sent as itself
            delay = config.trace.delays[child]
            wait = delay * config.time_scale if delay is not None else \
                started + rows[child][0] * config.time_scale - time.perf_counter()
            if stop.wait(max(0.0, wait)):
                return
            row, turn, scheduled = child, turn + 1, None

    def worker() -> None:
        while (unit := next_unit()) is not None:
            run_unit(unit)

    def offsets() -> Iterator[tuple[int, float]]:
        """(unit, seconds from the start) in send order: the trace's own times, or drawn gaps."""
        if rows is not None:            # a session's later turns follow their parents, not the clock
            order = sorted((i for i in range(int(limit)) if not parents or parents[i] < 0), key=lambda i: rows[i][0])
            yield from ((i, rows[i][0] * config.time_scale) for i in order)
        elif sends is not None:
            yield from enumerate(sends)
        elif config.ramp_up:
            yield from enumerate(arrival_times(-(-int(limit) // turns), rng, None, config.burstiness, config.ramp_up))
        else:
            clock, unit = 0.0, 0
            while True:
                yield unit, clock
                unit += 1
                clock += next_gap(rng, config.rate, config.burstiness)

    def open_loop_send(unit: int, scheduled: float) -> None:
        try:
            (run_session if parents else run_unit)(unit, scheduled)
        finally:
            if slots:
                slots.release()

    def open_loop_sender() -> None:
        # With --shard K/N, every machine walks the whole schedule and sends the N-th share in
        # send order from the K-th: together they send each request once, at its time.
        for position, (unit, offset) in enumerate(offsets()):
            if position * turns >= limit:
                break
            if config.shard and position % config.shard[1] != config.shard[0] - 1:
                continue
            if next_unit() is None:
                break
            send_at = started + offset
            delay = send_at - time.perf_counter()
            if delay > 0 and stop.wait(delay):
                break
            while slots and not slots.acquire(timeout=0.1):
                if stop.is_set():
                    return
            t = threading.Thread(target=open_loop_send, args=(unit, send_at), daemon=True)
            t.start()
            threads.append(t)

    threads: list = []
    stopped: Optional[Stopped] = None
    cpu_before = time.process_time()
    if config.start_at is not None:      # the first /metrics scrape goes before the start: begin it early
        wait_until(config.start_at - START_SCRAPE_S, progress)
    scraping = time.time()
    with MetricsSampler(client, config.scrape_interval_s) as sampler:
        if config.start_at is not None:
            wait_until(config.start_at, progress)
            check_start(config.start_at, f"the prompt-sizing probe and the server's first /metrics answer, which "
                                         f"took {time.time() - scraping:,.1f} s, ended after it")
        started, started_unix = time.perf_counter(), time.time()
        if not open_loop:
            threads = [threading.Thread(target=worker, daemon=True) for _ in range(config.concurrency or 1)]
        else:
            threads = [threading.Thread(target=open_loop_sender, daemon=True)]
        for t in list(threads):
            t.start()
        try:
            beat = time.perf_counter()
            while any(t.is_alive() for t in list(threads)):
                time.sleep(0.05)
                if progress and time.perf_counter() - beat >= HEARTBEAT_LOAD_S:   # requests that take long
                    beat = time.perf_counter()
                    with lock:
                        done, failed, running = len(records), sum(1 for r in records if r.error), len(in_flight)
                    progress(f"{done:,} requests done, {failed:,} failed, {running:,} in flight, "
                             f"{beat - started:.1f} s")
            with slow(f"reading the server's last /metrics (up to {config.timeout_s:g} s, --timeout)"):
                sampler.finish()
            hold_signals()   # what was measured becomes a report, whatever arrives from now on
        except (KeyboardInterrupt, Terminated) as e:      # (the first signal holds the later ones)
            stop.set()
            sampler.close()
            stopped = Stopped.by_signal(e, f"{len(records):,} requests ended; {len(in_flight):,} in flight "
                                           f"were stopped")
        with lock:
            for record in in_flight.values():
                record.error = "interrupted: the run was stopped before this request ended"
                record.ended_s = time.perf_counter()
                records.append(record)
            in_flight.clear()
    if refused and not stopped:
        if not any(r.error is None or not r.error.startswith("connection: refused") for r in records):
            raise ServerUnreachable(refused[0])
        stopped = Stopped(1, f"the server stopped accepting connections after {len(records):,} requests "
                             f"({refused[0]}); the report has every request sent")
    cpu = time.process_time() - cpu_before
    records.sort(key=lambda r: r.index)
    # The first --warmup requests sent (a trace's in the order of its times) are not measured.
    warm = set(sorted(range(int(limit)), key=lambda i: rows[i][0])[:config.warmup]) if rows is not None \
        else set(range(config.warmup))
    measured = [r for r in records if r.index not in warm]
    result = summarize(measured, slos=config.slos)
    # vllm bench serve counts a failed request's tokens as none, and so does the summary above; what
    # a request streamed before it failed or was stopped was measured all the same: kept apart.
    result["failed_streamed_tokens"] = sum(len(r.token_times) for r in measured if r.error is not None)
    if config.warmup:
        result["warmup_requests"] = len(records) - len(measured)
        warm_failed = [r for r in records if r.index in warm and r.error is not None]
        if warm_failed:          # left out of every figure, and of the exit code: a cold start's to take
            result["warmup_failed"] = len(warm_failed)
            result["warmup_first_error"] = warm_failed[0].error
    result["cost"] = cost_report(config.price_per_hour, result["output_throughput"])
    result["server"] = server_window(sampler.scrapes)
    if sampler.problem:
        result["server"]["problem"] = sampler.problem
    if sampler.final_problem:
        result["server"]["final_scrape"] = sampler.final_problem
    if sampler.skipped:
        n = len(sampler.skipped)       # (counted() would read a server's braces as its own)
        result["server"]["skipped_scrapes"] = (f"{n:,} scrape{'s' * (n != 1)} during the run failed and "
                                               f"{'are' if n != 1 else 'is'} missing from the peaks (the first: "
                                               f"{sampler.skipped[0]})")
    if sampler.ignored:
        names = client.redact(", ".join(f"{name[:80]} ({n:,})" for name, n in sampler.ignored.most_common(3)))
        result["server"]["ignored_samples"] = (f"{sum(sampler.ignored.values()):,} samples were not finite numbers "
                                               f"within +-10^15, or repeated a series, and were left out: {names}")
    # The server's own shape, kept so that compare simulates this server and not the defaults.
    with slow(f"reading the server's shape from /props or /metrics (up to {config.timeout_s:g} s each, --timeout)"):
        shape, note = server_shape(client) if not stopped else ({}, "the run was stopped before /props was read")
        if stops["noted"] and not stopped:     # (the read it cut short failed for that, not the server)
            shape, note = {}, "the run was stopped while /props and /metrics were read for it"
    result["server"]["shape"] = shape or {"unknown": note}
    result["timings"] = timings_report(measured)
    finish = Counter(r.finish_reason for r in records if r.error is None)
    short = [r for r in records if r.error is None and config.ignore_eos and r.usage_seen
             and r.output_tokens < config.max_tokens]
    result["client"] = {
        "cpu_seconds": cpu,
        "worst_wake_delay_ms": sampler.worst_wake_delay_s * 1000,
        "finish_reasons": dict(finish),
        "requests_without_usage": sum(1 for r in records if r.error is None and not r.usage_seen),
        "short_of_max_tokens": len(short),
        "short_finish_reasons": dict(Counter(r.finish_reason for r in short)),
        "fewest_output_tokens": min((r.output_tokens for r in short), default=None),
        **dispatch_report(records, result),
        "server_clock": server_clock(records, started, started_unix),
        "reasoning": reasoning_report(records),
    }
    left_out: dict = {}
    for r in records:
        for name, why in dict(r.left_out).items():
            left_out.setdefault(name, {"answers": 0, "first": why})["answers"] += 1
    if left_out:
        result["client"]["server_figures_left_out"] = left_out
    if sizing is not None:
        asked = [r for r in measured if r.asked_prompt_tokens and r.usage_seen and r.error is None]
        result["prompt_sizing"] = {**sizing, "requests": len(asked),
                                   "asked_prompt_tokens_mean": sum(r.asked_prompt_tokens for r in asked) / len(asked)
                                   if asked else None,
                                   "received_prompt_tokens_mean": sum(r.prompt_tokens for r in asked) / len(asked)
                                   if asked else None}
    timeline = measured_timeline(records, list(zip(sampler.times, sampler.scrapes)), started)
    for record in records:
        if record.index in warm:
            record.measured = False
    rule = RunSpec()
    result["steady_state"] = steady_window(records, rule.steady_skip, rule.min_served, rule.max_queue_growth,
                                           not open_loop, config.slos)
    if turns > 1 or child_of:
        result["turns"] = by_turn(measured)
    # The server counts every token it generated over its window: warm-up requests' too, and what
    # failed requests streamed. A window cut short by a failed last scrape is not the run's.
    generated = None if sampler.final_problem else result["server"].get("generated_tokens")
    client_tokens = sum(r.output_tokens if r.error is None else len(r.token_times) for r in records)
    result["server"]["client_output_tokens"] = client_tokens
    result["server"]["client_minus_server_tokens"] = None if generated is None else client_tokens - generated
    # (Without --requests, --duration ends the run: no count caps the clients busy at once.)
    arrivals = RunSpec(requests=config.requests or 2**62, rate=config.rate, ramp_up=config.ramp_up,
                       burstiness=config.burstiness,
                       concurrency=None if open_loop else config.concurrency or 1, turns=turns,
                       think_time=config.think_time_s, rate_profile=config.rate_profile,
                       time_scale=config.time_scale if config.rate_profile else 1.0,
                       trace=config.trace).arrivals() if not rows else f"trace arrivals ({config.trace.name})"
    shape = arrivals + (f", at most {config.concurrency} in flight" if open_loop and config.concurrency else "")
    if config.shard:
        shape += f", shard {config.shard[0]}/{config.shard[1]} (one request in {config.shard[1]})"
    result["config"] = {
        "title": f"loadgen {shown_model} at {client.url}  {len(records):,} requests  {shape}",
        "url": client.url, "model": shown_model, "max_concurrency": config.concurrency, "request_rate": config.rate,
        "num_prompts": len(records), "duration_limit_s": config.duration_s, "max_tokens": config.max_tokens,
        "ignore_eos": config.ignore_eos, "prompt_words": None if config.prompts else config.prompt_words,
        "prefix_words": config.prefix_words, "prompts_file": bool(config.prompts), "seed": config.seed,
        "run_id": config.run_id,
        "timeout_s": config.timeout_s, "request_timeout_s": config.request_timeout_s,
        "burstiness": config.burstiness, "ramp_up": list(config.ramp_up) if config.ramp_up else None,
        "trace": config.trace.name if config.trace else None, "time_scale": config.time_scale,
        **({"trace_notes": list(config.trace.notes)} if config.trace and config.trace.notes else {}),
        "turns": turns, "think_time_s": config.think_time_s, "warmup": config.warmup,
        "rate_profile": config.rate_profile.name if config.rate_profile else None,
        "shard": list(config.shard) if config.shard else None, "schedule": schedule_fingerprint(config),
        "start_at": config.start_at,
        "start_lag_ms": None if config.start_at is None else (started_unix - config.start_at) * 1000,
        # The same moment on the wall clock and on the clock start_times use: merge lines up
        # reports from several machines with it (their clocks synchronised, e.g. by NTP).
        "started_unix": started_unix, "started_perf": started,
    }
    if config.timeline:
        result["timeline"] = timeline
    stopped = stopped or noted_stop("the run had ended; the report is whole")
    if stopped:
        result["stopped"] = stopped.message
    kinds = {error_kind(r.error) for r in records if r.error}
    if records and all(r.error for r in records) and kinds <= {"http 404", "http 405", "http 501", "not an event stream"}:
        result["hint"] = (f"this does not look like an OpenAI-compatible server: POST {client.url}/v1/chat/completions "
                          f"answered {', '.join(sorted(kinds))}; is --url the server's base address?")
    return result, records, stopped


def reasoning_report(records: list[StreamRecord]) -> Optional[dict]:
    """Whether the server split thinking from the answer: ttfa needs reasoning events apart from
    content. None for a server that sent neither (not a reasoning model)."""
    split = sum(1 for r in records if r.reasoning_tokens)
    tagged = sum(1 for r in records if r.think_tags)
    if not split and not tagged:
        return None
    return {"requests_with_reasoning": split, "think_tags_in_content": tagged,
            "note": None if split else "the server streams its thinking inside content (<think>...), so the first "
                                       "answer token cannot be told apart: start it with a reasoning parser (vLLM "
                                       "and SGLang --reasoning-parser, llama.cpp --reasoning-format deepseek)"}


def dispatch_report(records: list[StreamRecord], result: dict) -> dict:
    """Whether the client kept to its schedule: the rate it meant to offer, the rate completed,
    and how late each scheduled send left (a thread's wake-up, a full --concurrency cap). Large
    lags mean the client, not the server, set the pace."""
    scheduled = sorted((r.scheduled_s, r.sent_s) for r in records if r.scheduled_s is not None and r.sent_s)
    if len(scheduled) < 2:
        return {}
    span = scheduled[-1][0] - scheduled[0][0]
    lag = distribution([(sent - at) * 1000 for at, sent in scheduled])
    return {"offered_rate": (len(scheduled) - 1) / span if span > 0 else None,
            "achieved_rate": result["request_throughput"],
            "dispatch_lag_ms": {"mean": lag["mean"], "p50": lag["p50"], "p99": lag["p99"],
                                "max": max((sent - at) * 1000 for at, sent in scheduled)}}


def measured_timeline(records: list[StreamRecord], scrapes: list[tuple[float, dict]], t0: float) -> list[dict]:
    """The simulator's per-second rows from a real run: tokens from the client's own events
    (prompt tokens credited at the first token, each event's share of the output), running,
    waiting and KV use from the last /metrics scrape in that second. A server without those
    gauges gets the client's requests in flight as running, and no waiting or KV figure."""
    ok = [r for r in records if r.error is None and r.first_token_s is not None]
    ends = sorted((r.last_token_s or r.sent_s) - t0 for r in records)
    sends = sorted(r.sent_s - t0 for r in records)
    seconds = max(1, math.ceil(max(ends, default=0.0)))
    prompt, generated = Counter(), Counter()
    for r in ok:
        prompt[max(1, math.ceil(r.first_token_s - t0))] += r.prompt_tokens
        share = r.output_tokens / len(r.token_times) if r.token_times else 0.0
        for at in r.token_times:
            generated[max(1, math.ceil(at - t0))] += share
    pick = lambda values, names: next((values[n] for n in names if n in values), None)
    rows, latest, i = [], {}, 0
    for t in range(1, seconds + 1):
        while i < len(scrapes) and scrapes[i][0] - t0 <= t:
            latest = scrapes[i][1]
            i += 1
        kv = pick(latest, KV_GAUGES)
        running = pick(latest, RUNNING_GAUGES)
        rows.append({"t": float(t), "prompt_throughput": float(prompt[t]), "gen_throughput": round(generated[t], 3),
                     "running": running if running is not None else
                     bisect.bisect_right(sends, t) - bisect.bisect_right(ends, t),
                     "waiting": pick(latest, WAITING_GAUGES),
                     "kv_cache_pct": None if kv is None else round(100 * kv, 2)})
    return rows


# ---------------------------------------------------------------------------------------------
# Calibration: fit the cost model's unknowns (effective bandwidth, effective FLOPS, overhead per
# step and per sequence) to measured runs. A TPOT is one decode step at the run's batch; the TTFT
# of an unqueued request is one prefill step. Each is step_seconds() of a known shape.
# ---------------------------------------------------------------------------------------------

@dataclass
class StepObservation:
    label: str
    seconds: float
    tokens: float      # tokens in the step
    context: float     # KV tokens the step reads
    seqs: float        # sequences in the step
    pairs: float = 0   # (query, key) pairs its attention computes (the kernel model prices them)


def observations(report: dict, name: str) -> list[StepObservation]:
    """The steps a report pins down: its decode step (TPOT at its batch) and, for a single
    client, its prefill step (TTFT, nothing queued ahead)."""
    done = report.get("completed") or 0
    if not done or report.get("median_tpot_ms") is None:
        raise UserError(f"{name}: no completed requests with a TPOT; calibrate needs a report with output")
    for key in ("median_tpot_ms", "median_ttft_ms"):
        if report.get(key) is not None and report[key] < 0.001:
            raise UserError(f"{name}: {key} is {report[key]!r} ms; a step takes at least a microsecond")
    if not isinstance(report.get("total_input_tokens"), int) or not isinstance(report.get("total_output_tokens"), int):
        raise UserError(f"{name}: total_input_tokens and total_output_tokens must be whole numbers")
    prompt = report["total_input_tokens"] / done
    output = report["total_output_tokens"] / done
    config = report.get("config") or {}
    # One GPU serving the model in its own dtype is what a fit prices: a report of a group, replicas
    # or quantized weights would fit its figures into one GPU's and be wrong by that factor.
    ran = [f"{flag} {config[key]}" for key, flag, plain in (
        ("tensor_parallel_size", "-tp", 1), ("pipeline_parallel_size", "-pp", 1), ("data_parallel_size", "-dp", 1),
        ("quantization", "--quantization", None), ("kv_cache_dtype", "--kv-cache-dtype", "auto"))
        if config.get(key) is not None and config[key] != plain]
    if ran:
        raise UserError(f"{name}: it ran {', '.join(map(printable, ran))}; calibrate fits one GPU serving the model "
                        f"in its own dtype: give it runs of one GPU, unquantized")
    # servesim's reports keep it under config; vllm bench serve --save-result at the top level.
    clients = config.get("max_concurrency") or report.get("max_concurrency")
    if not clients:
        raise UserError(f"{name}: not a closed-loop run (no max_concurrency); calibrate on --concurrency runs "
                        f"(vllm bench serve: --max-concurrency)")
    if not isinstance(clients, int) or isinstance(clients, bool) or clients < 1:
        raise UserError(f"{name}: max_concurrency must be a whole number of clients, got {str(clients)[:40]!r}")
    # The batch the server really ran: its own figure when it has one, else the clients (capped by seqs).
    measured, seqs = (report.get("server") or {}).get("mean_batch_per_decode"), config.get("max_num_seqs")
    for label, value in (("server.mean_batch_per_decode", measured), ("config.max_num_seqs", seqs)):
        # (A server's mean can sit a hair under 1 at one client: a real llama.cpp read 0.9999967.)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or
                                  not value >= (0.999 if label.startswith("server") else 1)):
            raise UserError(f"{name}: {label} must be a number of sequences, got {str(value)[:40]!r}")
    measured = measured and max(measured, 1.0)
    # (A server's own mean, a float, can sit at or a hair over the clients: a real llama.cpp at 4
    # clients read 4 and failed a strict test. Half as many again is not that: it is another run.)
    if measured is not None and measured > 1.5 * clients:
        raise UserError(f"{name}: server.mean_batch_per_decode {measured:.4g} is more sequences than its "
                        f"{clients} clients could send at once; the report is not of one closed-loop run")
    if prompt < 1:
        raise UserError(f"{name}: total_input_tokens {report['total_input_tokens']} over {done} requests; every "
                        f"request sends at least one prompt token")
    if output < 1:       # (a TPOT is read off a request's second token and on: it had tokens)
        raise UserError(f"{name}: total_output_tokens {report['total_output_tokens']} over {done} completed requests "
                        f"that have a TPOT; each of them answered at least one token")
    # (Never more than the requests there were: 64 clients sending 16 requests run 16 at most.)
    batch = measured or min(clients, seqs or clients, done)
    context = batch * (prompt + output / 2)
    shown = f"{batch:.2g}" if batch < 100 else f"{batch:.0f}"
    found = [StepObservation(f"{name} tpot at batch {shown}", report["median_tpot_ms"] / 1000,
                             batch, context, batch, context)]
    if clients == 1 and report.get("median_ttft_ms"):
        found.append(StepObservation(f"{name} ttft of a {prompt:.0f}-token prefill",
                                     report["median_ttft_ms"] / 1000, prompt, prompt, 1, prompt * (prompt + 1) / 2))
    return found


def nelder_mead(f: Callable[[list[float]], float], start: list[float], step: float = 0.5,
                iterations: int = 6000) -> list[float]:
    """A plain downhill simplex: deterministic and enough for four parameters."""
    simplex = [list(start)] + [[x + (step if i == j else 0) for j, x in enumerate(start)] for i in range(len(start))]
    scores = [f(p) for p in simplex]
    for _ in range(iterations):
        order = sorted(range(len(simplex)), key=scores.__getitem__)
        simplex, scores = [simplex[i] for i in order], [scores[i] for i in order]
        if scores[-1] - scores[0] < 1e-18:
            break
        centre = [sum(p[j] for p in simplex[:-1]) / (len(simplex) - 1) for j in range(len(start))]
        toward = lambda t: [c + t * (w - c) for c, w in zip(centre, simplex[-1])]
        reflected = toward(-1.0)
        r = f(reflected)
        if r < scores[0]:
            expanded = toward(-2.0)
            e = f(expanded)
            simplex[-1], scores[-1] = (expanded, e) if e < r else (reflected, r)
        elif r < scores[-2]:
            simplex[-1], scores[-1] = reflected, r
        else:
            contracted = toward(0.5)
            c = f(contracted)
            if c < scores[-1]:
                simplex[-1], scores[-1] = contracted, c
            else:
                simplex = [simplex[0]] + [[b + 0.5 * (x - b) for b, x in zip(simplex[0], p)] for p in simplex[1:]]
                scores = [scores[0]] + [f(p) for p in simplex[1:]]
    return min(simplex, key=f)


def calibrate(found: list[StepObservation], model: ModelSpec, base: Hardware,
              name: str) -> tuple[Hardware, list[float], dict[str, str]]:
    """Effective figures (mbu = mfu = 1) that best fit the observed step times by relative error:
    bandwidth, TFLOPS, overhead per step and overhead per sequence. A small prior keeps the
    per-sequence cost at zero unless the data needs it: a GPU fits the plain roofline, while a
    CPU llama.cpp pays milliseconds per extra sequence that no FLOPS figure explains.
    A figure no measured step depends on is not fitted: the bandwidth when no step is memory-bound
    at the fit, the FLOPS when none is compute-bound (a step costs the slower of the two, so the
    other moves nothing). It keeps the base preset's effective value, and is named in the result.
    Returns the hardware, each observation's error (predicted / measured - 1), and what was kept."""
    def hardware(params: list[float]) -> Hardware:
        # The simplex may wander far on data no figure fits (a 0.002 ms prefill): held within
        # e^+-40 (and a per-sequence cost of 10^6 ms) it gets a huge error there and turns back.
        bandwidth, tflops, overhead = (float(f"{math.exp(min(40.0, max(-40.0, v))):.6g}") for v in params[:3])
        # The base preset's other figures (memory, reserve, link, price, kernel floors) are kept.
        return replace(base, name=name, bandwidth_gbs=bandwidth, tflops=tflops, mbu=1.0, mfu=1.0,
                       step_overhead_ms=overhead, seq_overhead_ms=float(f"{min(1e3, abs(params[3])) ** 2:.6g}"))

    def errors(h: Hardware) -> list[float]:
        return [cost_model("roofline", h, model).step_seconds(o.tokens, o.context, o.seqs) / o.seconds - 1 for o in found]

    shortest = min(o.seconds for o in found)
    biggest = max(found, key=lambda o: o.tokens)
    smallest = min(found, key=lambda o: o.tokens)
    # Start from "half the shortest step is overhead; the biggest step is compute, the smallest memory".
    overhead = shortest / 2
    tflops = 2 * model.params * biggest.tokens / max(biggest.seconds - overhead, 1e-9) / 1e12
    bandwidth = (model.weight_bytes + smallest.context * model.kv_bytes_per_token) / max(smallest.seconds - overhead, 1e-9) / 1e9
    start = [math.log(bandwidth), math.log(tflops), math.log(overhead * 1000), 0.0]
    preset = {0: math.log(base.bandwidth_gbs * base.mbu), 1: math.log(base.tflops * base.mfu)}
    seq_prior = 1e-4 / (shortest * 1000) ** 2
    kept: dict[int, float] = {}
    while True:
        free = [i for i in range(4) if i not in kept]

        def full(values: list[float]) -> list[float]:
            params = {**kept, **dict(zip(free, values))}
            return [params[i] for i in range(4)]

        best = full(nelder_mead(lambda v: sum(e * e for e in errors(hardware(full(v)))) + seq_prior * full(v)[3] ** 4,
                                [start[i] for i in free]))
        fitted = hardware(best)
        bound = [memory_bound(fitted, model, o) for o in found]
        unmeasured = {i: preset[i] for i, seen in ((0, any(bound)), (1, not all(bound))) if not seen and i not in kept}
        if not unmeasured:
            why = {0: ("bandwidth", "no measured step was memory-bound"), 1: ("tflops", "no measured step was compute-bound")}
            return fitted, errors(fitted), dict(why[i] for i in sorted(kept))
        kept.update(unmeasured)


# Calibrating an engine (calibrate --fit engine): the device and model held at their presets, the
# engine's own numbers fitted on the kernel cost model: how much slower than priced its kernels run
# (kernel_scale) and its CPU work a step and per sequence. With async scheduling a step costs the
# slower of GPU and CPU, so the CPU terms are seen only in steps where the CPU is the slower, and the
# kernel scale only where the GPU is: what no measured step depends on keeps the base engine's value
# and is named, as calibrate does for the hardware. There is no other prior.

def calibrate_engine(found: list[StepObservation], model: ModelSpec, hardware: Hardware, base: EngineProfile,
                     max_num_seqs: int, name: str) -> tuple[EngineProfile, list[float], dict[str, str]]:
    """The base engine with kernel_scale, step_cpu_ms and seq_cpu_ms fitted to the observed steps by
    relative error; returns the profile, each observation's error, and the figures kept at the
    base's, each with why."""
    if all(o.tokens == o.seqs for o in found):
        # Decode steps' kernels (weights, then each sequence's KV) grow nearly as a line in the batch,
        # as the CPU costs do: only a prefill tells the kernel scale from them.
        short = next((o for o in found if "ttft of a" in o.label), None)
        if short:      # (a one-client run is there: its prompts are too short to be a prefill to the fit)
            raise UserError(f"calibrate --fit engine: {short.label.split(' ttft')[0]}'s prompts are {short.tokens:.0f} "
                            f"token{'s' * (short.tokens != 1)}, a prefill that prices as a decode step, so it cannot "
                            f"tell the kernel scale from the CPU costs; give the one-client run prompts of a few "
                            f"hundred tokens")
        raise UserError("calibrate --fit engine needs a one-client run among the reports: its TTFT is a prefill "
                        "step, the one step whose kernels the CPU costs cannot stand in for")

    def priced(profile: EngineProfile, o: StepObservation) -> float:
        return cost_model("kernels", hardware, model, None, profile, max_num_seqs).step_seconds(o.tokens, o.context, o.seqs, o.pairs)
    # A step is (device's own overheads) + scale x (kernels), beside or after CPU work: price both parts once.
    bare = replace(base, step_cpu_ms=0.0, seq_cpu_ms=0.0, overlap=False)
    fixed = [priced(replace(bare, kernel_scale=0.0), o) for o in found]
    kernels = [priced(replace(bare, kernel_scale=1.0), o) - f for o, f in zip(found, fixed)]

    def steps(scale: float, step_ms: float, seq_ms: float) -> list[tuple[float, float]]:
        return [(f + scale * k, (step_ms + o.seqs * seq_ms) / 1000) for o, f, k in zip(found, fixed, kernels)]

    def errors(values: list[float]) -> list[float]:
        return [(max(gpu, cpu) if base.overlap else gpu + cpu) / o.seconds - 1
                for o, (gpu, cpu) in zip(found, steps(*values))]

    start = {0: base.kernel_scale, 1: base.step_cpu_ms, 2: base.seq_cpu_ms}

    def fit(kept: dict) -> list[float]:
        free = [i for i in range(3) if i not in kept]

        def full(v: list[float]) -> list[float]:
            # The scale is positive (a log), the CPU costs non-negative (squares).
            given = dict(zip(free, v))
            return [kept.get(0, math.exp(given.get(0, 0.0))), kept.get(1, given.get(1, 0.0) ** 2),
                    kept.get(2, given.get(2, 0.0) ** 2)]

        guess = [math.log(start[0]), math.sqrt(max(start[1], 0.01)), math.sqrt(max(start[2], 1e-4))]
        return full(nelder_mead(lambda v: sum(e * e for e in errors(full(v))), [guess[i] for i in free], step=0.3))

    worst = lambda values: max(abs(e) for e in errors(values))
    kept: dict[int, float] = {}
    why: dict[int, str] = {}
    while True:
        values = fit(kept)
        bound = steps(*values)
        cpu_seen = any(cpu >= gpu for gpu, cpu in bound) or not base.overlap
        gpu_seen = any(gpu > cpu for gpu, cpu in bound) or not base.overlap
        counts = {o.seqs for o, (gpu, cpu) in zip(found, bound) if cpu >= gpu or not base.overlap}
        unseen = {0: None if gpu_seen else "no measured step was GPU-bound",
                  1: None if cpu_seen else "no measured step was CPU-bound",
                  2: None if cpu_seen and len(counts) > 1 else "no measured step was CPU-bound" if not cpu_seen
                  else "the CPU-bound steps all ran one batch size"}
        unmeasured = {i: reason for i, reason in unseen.items() if reason and i not in kept}
        if not unmeasured:
            break
        kept.update({i: start[i] for i in unmeasured})
        why.update(unmeasured)
    # A CPU cost the runs cannot tell from the other figures (the base's value fits them as well, to
    # half a point) is the base's: the runs did not measure it.
    for i in (2, 1):
        if i not in kept and worst(alternative := fit({**kept, i: start[i]})) <= worst(values) + 0.005:
            kept[i], values, why[i] = start[i], alternative, "the runs fit as well with it"
    values = [float(f"{v:.4g}") for v in values]
    profile = replace(base, name=name, base=base.rules,
                      kernel_scale=values[0], step_cpu_ms=values[1], seq_cpu_ms=values[2])
    names = {0: "kernel_scale", 1: "step_cpu_ms", 2: "seq_cpu_ms"}
    return profile, errors(values), {names[i]: why[i] for i in sorted(kept)}


def memory_bound(hardware: Hardware, model: ModelSpec, o: StepObservation) -> bool:
    compute, memory = cost_model("roofline", hardware, model).times(o.tokens, o.context)
    return memory >= compute


# ---------------------------------------------------------------------------------------------
# Comparison with a measured run: simulate exactly the shape a real server was measured on (the
# measured send times as arrivals, each request's own lengths, the engine's settings where the run
# recorded them) and put the two side by side. compare, loadgen --simulate and search --confirm
# share it; merge puts several client machines' runs on one clock.
# ---------------------------------------------------------------------------------------------

# Failures before a request ran: servesim's, loadgen's (http 4xx) and vllm bench serve's (a 4xx's
# reason phrase, as it records them).
REFUSED_AT_THE_DOOR = ("longer than", "http 4", "Bad Request", "Unprocessable", "Payload Too Large",
                       "Request Entity Too Large")


def simulate_measured(measured: MeasuredRun, spec: RunSpec, timeline: bool = False) -> dict:
    """The measured run's shape through the simulator: its send times, its lengths, its engine."""
    # A request the server refused at the door (too long for it, an HTTP 4xx) cost it nothing: it is
    # not replayed. The rest ran, so the replay's model length holds the longest of them.
    requests = [r for r in measured.requests if not str(r.error or "").startswith(REFUSED_AT_THE_DOOR)] \
        or measured.requests
    trace = Trace(measured.name, tuple((r.sent_s, r.prompt_tokens, r.output_tokens, ()) for r in requests))
    longest = max(r.prompt_tokens + r.output_tokens for r in requests)
    workload = {name: f.default for name, f in SETTINGS.items() if f.metadata["group"] == "workload" and name != "seed"}
    workload.update(trace=trace, max_model_len=max(spec.model_len(), longest))
    spec = replace(spec, **workload)
    return run(spec, timeline=timeline)


COMPARED = (   # label, key in a summarize() result, digits
    ("out tok/s", "output_throughput", 1), ("ttft mean ms", "mean_ttft_ms", 1), ("ttft p50 ms", "median_ttft_ms", 1),
    ("ttft p90 ms", "p90_ttft_ms", 1), ("ttft p99 ms", "p99_ttft_ms", 1), ("tpot mean ms", "mean_tpot_ms", 1),
    ("tpot p50 ms", "median_tpot_ms", 1), ("tpot p90 ms", "p90_tpot_ms", 1), ("tpot p99 ms", "p99_tpot_ms", 1),
    ("itl mean ms", "mean_itl_ms", 1), ("itl p50 ms", "median_itl_ms", 1), ("itl p99 ms", "p99_itl_ms", 1),
    ("e2e mean ms", "mean_e2el_ms", 1), ("e2e p50 ms", "median_e2el_ms", 1), ("e2e p90 ms", "p90_e2el_ms", 1),
    ("e2e p99 ms", "p99_e2el_ms", 1), ("ttfa p50 ms", "median_ttfa_ms", 1), ("ttfa p99 ms", "p99_ttfa_ms", 1),
)


def compared_rows(measured: dict, simulated: dict, timeline: list = ()) -> dict:
    """Each figure measured and simulated, with its error (simulated / measured - 1)."""
    rows = {label: (measured.get(key), simulated.get(key)) for label, key, _ in COMPARED}
    engine = simulated.get("engine") or {}
    server = measured.get("server") or {}
    if timeline:
        # A column the file does not have is not a measured 0.
        logs = lambda key: all(key in t for t in timeline)
        rows["mean running"] = (sum(t["running"] for t in timeline) / len(timeline) if logs("running") else None,
                                engine.get("mean_running"))
        rows["peak waiting"] = (max(t["waiting"] for t in timeline) if logs("waiting") else None,
                                engine.get("peak_waiting"))
        logged = max(t.get("kv_cache_pct", 0) for t in timeline)
        rows["peak kv use %"] = (logged or None, 100 * engine.get("kv_peak", 0))    # all zeros: not logged
    elif server.get("server"):
        # llama.cpp reports its mean batch; vLLM and SGLang only gauges, whose peaks stand beside the simulated ones.
        if server.get("mean_batch_per_decode") is not None:
            rows["mean batch"] = (server["mean_batch_per_decode"], engine.get("mean_batch"))
        else:
            rows["peak running"] = (server.get("peak_running"), engine.get("peak_running"))
        rows["peak waiting"] = (server.get("peak_requests_deferred", server.get("peak_waiting")), engine.get("peak_waiting"))
        if server.get("preemptions") is not None:
            rows["preemptions"] = (server["preemptions"], engine.get("preemptions"))
    rows["preemptions (sim)"] = (None, engine.get("preemptions"))
    if measured.get("request_goodput") is not None:
        rows["goodput req/s"] = (measured["request_goodput"], simulated.get("request_goodput"))
    return {label: {"measured": m, "servesim": s, "error": s / m - 1 if m and s is not None else None}
            for label, (m, s) in rows.items() if m is not None or s is not None}


def recorded_spec(measured: MeasuredRun, given: dict, how: str = "pass --{kind} (a preset or a JSON file)") -> RunSpec:
    """The engine the run recorded, with the `given` settings on top. Changing the deployment
    (its device, parallelism, block size or memory share) drops the recorded KV block count,
    which was that deployment's. `how`: how the caller's user gives a model or device the run
    does not record."""
    found = measured.settings
    # (a servesim report records more of its deployment than a measured run can: REPORT_DEPLOYMENT)
    settings = {k: v for k, v in found.items() if k in SETTINGS and (SETTINGS[k].metadata["recorded"] or
                                                                       k in REPORT_SETTINGS or k in ("engine",
                                                                                                     "draft_model"))}
    for kind, known, presets, recorded in (("model", KNOWN_MODELS, MODELS, ("model_name",)),
                                           ("hardware", KNOWN_DEVICES, HARDWARE, ("device_name", "named_device"))):
        if kind in given:
            continue
        # A Hugging Face id or a device's name (meta.json, vllm bench), or a preset's own (a report's config).
        said = next((found[key] for key in recorded if found.get(key)), "")
        name = known.get(said.lower()) or (said if said in presets else None)
        if not name:
            what = "model" if kind == "model" else "device"
            raise UserError(f"run {measured.name}: " + (f"{what} {printable(said[:80])!r} has no preset" if said else
                            f"the run does not record its {what}") + "; " + how.format(kind=kind))
        settings[kind] = presets[name]
    if "hardware" not in given:
        if found.get("device_bytes"):        # what the run's device reported
            settings["hardware"] = replace(settings["hardware"], memory_gib=found["device_bytes"] / GIB)
    changed = [k for k in ("tensor_parallel_size", "data_parallel_size", "enable_expert_parallel", "block_size",
                           "gpu_memory_utilization") if k in given and given[k] != found.get(k)]
    settings.update(given)
    # (A device given where the run recorded none, as a loadgen report, states it; it changes nothing.)
    moved = changed or ("hardware" in given and found.get("device_name"))
    if "kv_tokens" in given or (moved and "num_gpu_blocks" not in given):
        settings.pop("num_gpu_blocks", None)
    if found.get("enable_expert_parallel") and settings.get("tensor_parallel_size", 1) > 1 and \
            "enable_expert_parallel" not in given:
        raise UserError(f"run {measured.name} recorded --enable-expert-parallel, which servesim models with -tp 1; "
                        f"add --enable-expert-parallel off to try tensor parallelism instead")
    # An --engine given takes its own defaults for the knobs the run did not record either.
    spec = engine_defaults(RunSpec(**settings), settings)
    try:
        check_spec(spec)
        with contextlib.suppress(CapacityError):    # (what does not fit is said where the plan is read)
            device_plan(spec, spec.hardware)        # a group the model does not split over, say
    except UserError as e:       # (a flag it names may be a setting the run's files gave, not the user)
        named = [flag_of(k) for k in sorted(set(settings) - set(given) - {"hardware", "model"}) if flag_of(k) in str(e)]
        raise UserError(f"run {measured.name}: {e}" + (f" ({', '.join(named)}: as the run recorded it; the flag "
                                                       f"replaces it)" if named else "")) from None
    return spec


def measured_failures(measured: MeasuredRun) -> Optional[str]:
    """How many of a run's measured requests failed, in a line (None: none did). A run none of whose
    requests has its token times has nothing to compare: CapacityError, as a failed request is."""
    failed = [r for r in measured.requests if r.error is not None]
    if not failed:
        return None
    first = printable(str(failed[0].error)[:120])
    if len(failed) == len(measured.requests):
        raise CapacityError(f"run {measured.name}: every one of its {len(failed):,} measured requests failed or has no "
                            f"token times (the first: {first}): nothing to compare")
    return (f"{len(failed):,} of {len(measured.requests):,} measured requests failed (the first: {first}): the "
            f"measured figures are of the rest")


def compare_run(measured: MeasuredRun, spec: RunSpec, timeline: bool = False) -> dict:
    """A measured run beside its simulation: a title naming what was simulated, the rows of
    figures with their errors, and both reports."""
    measured_failures(measured)
    simulated = simulate_measured(measured, spec, timeline=timeline)
    if not simulated["completed"]:
        raise CapacityError(f"none of the {simulated['failed']:,} simulated requests completed "
                            f"({'; '.join(simulated['errors_by_kind'])}): check the settings against the server's")
    actual = summarize(measured.requests, slos=dict(spec.goodput))
    if measured.stated_rates is not None:       # (None where the file states no such rate: not measured here)
        actual.update(measured.stated_rates)
    title = (f"compare {measured.name} ({len(measured.requests):,} requests): measured against servesim "
             f"{spec.hardware.name} / {spec.model.name}, {spec.cost_model} cost model, "
             f"{simulated['config']['kv_tokens']:,} KV tokens{' a replica' if spec.data_parallel_size > 1 else ''}, "
             f"max-num-seqs {spec.max_num_seqs}, "
             f"max-num-batched-tokens {spec.max_num_batched_tokens}"
             + (", prefix caching" if spec.prefix_caching else "")
             + (", reserve full isl" if spec.reserve_full_isl else "")
             + (f", host tier {spec.kv_offloading_size:g} GiB" if spec.kv_offloading_size else "")
             + (f", tensor parallel {spec.tensor_parallel_size}" if spec.tensor_parallel_size > 1 else "")
             + (f", {spec.data_parallel_size} replicas" if spec.data_parallel_size > 1 else "")
             + (", expert parallel" if spec.enable_expert_parallel else "")
             + (f", engine {engine_label(spec)}" if spec.engine else ""))
    return {"title": title, "rows": compared_rows(actual, simulated, measured.timeline), "measured": actual,
            "servesim": simulated}


CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "published-runs")
NEAR_CAPACITY = 80       # requests running at once: a run this busy is scored on TTFT apart


def contradiction(recorded: dict, given: dict) -> Optional[str]:
    """Where a corpus row's settings contradict what its replay's files record, said (None if
    nowhere): a setting under the same name, the model, the device (by the memory it reported: an
    edition the files cannot tell apart still applies) or a cache size beside the recorded blocks."""
    clash = next((k for k in sorted(given) if k in recorded and recorded[k] != given[k]), None)
    if clash:
        return (f"settings.{clash} {value_label(clash, given[clash])} contradicts the run's own files "
                f"({value_label(clash, recorded[clash])}): a replay runs the deployment its files record; drop it "
                f"from settings")
    ran = KNOWN_MODELS.get(recorded.get("model_name", ""))
    if "model" in given and ran and given["model"].name != ran:
        return f"model {given['model'].name} contradicts the run's own files ({ran}); drop it"
    memory = recorded.get("device_bytes", 0) / GIB
    if "hardware" in given and memory and abs(given["hardware"].memory_gib - memory) > 0.1 * memory:
        return (f"hardware {given['hardware'].name} ({given['hardware'].memory_gib:g} GiB) contradicts the run's own "
                f"files (a device of {memory:.1f} GiB); give the device it ran on")
    if "kv_tokens" in given and "num_gpu_blocks" in recorded:
        return (f"settings.kv_tokens contradicts the run's own files ({recorded['num_gpu_blocks']:,} KV blocks); "
                f"drop it from settings")
    return None


def replay_published(published: PublishedRun, cost_model: str, kernel_scale: Optional[float] = None) -> dict:
    """One published run through the simulator, as it was measured: its engine (its kernels priced
    at `kernel_scale`, as a fit gives it, in place of KERNEL_SCALE), its device, its load. Returns
    the measured and predicted figures, their errors, and both sustained verdicts."""
    profile = ENGINES[published.engine]
    if kernel_scale is not None:
        profile = replace(profile, kernel_scale=kernel_scale)
    measured, spec_args = dict(published.measured), dict(published.settings)
    notes: list[str] = []      # what the reader assumed, and measured requests that failed
    if "replay" in published.load:
        log = read_request_log(os.path.join(published.folder, published.load["replay"], "requests.jsonl"))
        failures = measured_failures(log)
        notes += log.notes + ([failures] if failures else [])
        clash = contradiction(log.settings, spec_args)
        if clash:      # it would score a deployment other than the one measured
            raise UserError(clash)
        spec = recorded_spec(log, {**spec_args, "cost_model": cost_model}, "give the run's {kind} in runs.json (a preset)")
        spec = engine_defaults(replace(spec, engine=published.engine), set(spec_args) | set(log.settings))
        summary = summarize(log.requests)
        measured = {key: summary[key] for key in PUBLISHED_FIGURES}
        busy = sum(t.get("running", 0) for t in log.timeline) / len(log.timeline) if log.timeline else 0
        verdict = steady_window(log.requests, spec.steady_skip, spec.min_served, spec.max_queue_growth, False)
        simulated = simulate_measured(log, replace(spec, profile=profile))
    else:
        spec = RunSpec(engine=published.engine, cost_model=cost_model, **spec_args)
        spec = engine_defaults(spec, spec_args)
        load = published.load
        if load.get("all_at_once"):
            rows = tuple((0.0, load["prompt_tokens"], load["output_tokens"], ()) for _ in range(load["requests"]))
            spec = replace(spec, trace=Trace(published.name, rows), max_model_len=load["prompt_tokens"] + load["output_tokens"])
            busy, verdict = spec.max_num_seqs, None
        else:
            spec = replace(spec, concurrency=load["concurrency"], requests=load["requests"], warmup=load.get("warmup", 0),
                           prompt_tokens=TokenRange(load["prompt_tokens"], load["prompt_tokens"]),
                           output_tokens=TokenRange(load["output_tokens"], load["output_tokens"]),
                           max_model_len=load["prompt_tokens"] + load["output_tokens"])
            busy, verdict = load["concurrency"], {"sustained": True, "closed_loop": True}
        simulated = run(replace(spec, profile=profile))
    rows = {key: {"measured": measured[key], "servesim": simulated.get(key),
                  "error": simulated[key] / measured[key] - 1 if simulated.get(key) is not None else None}
            for key in PUBLISHED_FIGURES if measured.get(key)}
    predicted = simulated.get("steady_state")
    return {"name": published.name, "source": published.source, "engine": published.engine, "engine_version": published.engine_version,
            "hardware": spec.hardware.name, "model": spec.model.name,
            "gpus": spec.gpus_per_replica * spec.data_parallel_size, "near_capacity": busy >= NEAR_CAPACITY,
            "rows": rows, "sustained": {"measured": None if verdict is None else verdict.get("sustained"),
                                        "servesim": None if predicted is None or verdict is None else predicted.get("sustained"),
                                        "closed_loop": bool(verdict and verdict.get("closed_loop"))},
            "kernel_scale": profile.kernel_scale if cost_model == "kernels" else None, "cite": published.cite,
            "inferred": list(published.inferred),
            "failed": simulated["failed"], "sent": simulated["completed"] + simulated["failed"],
            "failure": first_failure(simulated), "notes": notes}


# Validation: every published run replayed, scored out of sample. The kernel model's one fitted
# constant, KERNEL_SCALE, is fitted leaving one source out: each source's runs are scored with the
# scale fitted on the other sources' runs alone, so no run is scored by a fit that read its source.

def step_ratio(result: dict) -> Optional[float]:
    """How much longer the run's steps took than servesim priced them: measured over predicted TPOT,
    or predicted over measured throughput where no TPOT was published."""
    rows = result["rows"]
    for key, flip in (("mean_tpot_ms", False), ("output_throughput", True)):
        row = rows.get(key)
        if row and row["servesim"]:
            ratio = row["measured"] / row["servesim"]
            return 1 / ratio if flip else ratio
    return None


def fit_kernel_scale(results: list[dict]) -> Optional[float]:
    """The scale that best prices these runs, replayed unscaled: the median log step ratio of each
    source's runs, averaged over the sources (a source with many runs gets one vote, not many).
    First order: a step's time is taken to scale with its kernels' time."""
    by_source = defaultdict(list)
    for result in results:
        ratio = step_ratio(result)
        if ratio:
            by_source[result["source"]].append(math.log(ratio))
    if not by_source:
        return None
    middles = []
    for logs in by_source.values():
        logs.sort()
        middles.append((logs[(len(logs) - 1) // 2] + logs[len(logs) // 2]) / 2)
    return math.exp(sum(middles) / len(middles))


def left_out_fits(results: list[dict]) -> dict[str, Optional[float]]:
    """For each source, the scale fitted on every other source's runs: the one that scores it."""
    sources = sorted({r["source"] for r in results})
    return {source: fit_kernel_scale([r for r in results if r["source"] != source]) for source in sources}


def replay_or_skip(published: PublishedRun, cost_model: str, kernel_scale: Optional[float] = None) -> dict:
    try:
        result = replay_published(published, cost_model, kernel_scale)
    except (UserError, CapacityError) as e:
        return {"name": published.name, "source": published.source, "skipped": str(e)}
    if result["failed"]:        # the real server served them all: this is not the deployment it ran
        return {"name": published.name, "source": published.source,
                "skipped": f"{result['failed']:,} of {result['sent']:,} simulated requests failed "
                           f"({result['failure']}); check the run's settings"}
    return result


def replay_all(runs: list[PublishedRun], cost_model: str, scales: list, jobs: int,
               progress: Optional[Callable[[str], None]]) -> list[dict]:
    tasks = [functools.partial(replay_or_skip, run, cost_model, scale) for run, scale in zip(runs, scales)]
    results = []
    if jobs <= 1 or len(tasks) <= 1:
        for task in tasks:
            results.append(task())
            if progress:
                progress(f"{len(results)} of {len(tasks)} runs replayed ({results[-1]['name']})")
        return results
    workers = pool(min(jobs, len(tasks)))
    try:
        with forking():
            results_in_order = workers.map(call, tasks)
        for result in results_in_order:
            results.append(result)
            if progress:
                progress(f"{len(results)} of {len(tasks)} runs replayed ({result['name']})")
    except concurrent.futures.BrokenExecutor:
        raise WorkerDied(f"a worker process died (killed, perhaps by the out-of-memory killer) after "
                         f"{len(results):,} of {len(tasks):,} runs were replayed") from None
    finally:
        kill_pool(workers)
    return results


def call(task: Callable):
    return task()


def validate(folder: str, cost_model: str = "kernels", jobs: int = 1,
             progress: Optional[Callable[[str], None]] = None) -> dict:
    """Every published run under `folder` replayed and scored. With the kernel model, twice: once
    unscaled, to fit the scale leaving each source out, then each source at its own left-out fit.
    The fit over every source, the one KERNEL_SCALE should hold, is reported beside them."""
    runs, skipped = read_corpus(folder)
    fits: dict = {}
    every = None
    if cost_model == "kernels":
        unscaled = replay_all(runs, cost_model, [1.0] * len(runs), jobs, progress)
        scored = [r for r in unscaled if "skipped" not in r]
        fits, every = left_out_fits(scored), fit_kernel_scale(scored)
        results = replay_all(runs, cost_model, [fits.get(run.source) or 1.0 for run in runs], jobs, progress)
    else:
        results = replay_all(runs, cost_model, [None] * len(runs), jobs, progress)
    skipped += [f"{r['name']}: {r['skipped']}" for r in results if "skipped" in r]
    results = [r for r in results if "skipped" not in r]
    if not results:
        raise UserError(f"corpus {folder}: no run could be replayed" + every_skip(skipped))
    return {"corpus": folder, "cost_model": cost_model, "runs": results, "skipped": skipped,
            "kernel_scale": {"left_out": fits, "all_sources": every, "in_use": KERNEL_SCALE} if fits else None,
            "summary": validation_summary(results)}


VALIDATION_BOUND = 0.25         # the issue's bar for any one run, on throughput and TPOT


def validation_summary(results: list[dict]) -> dict:
    """Median |error| of each figure (TTFT apart for runs near capacity, where it is queueing),
    the runs within VALIDATION_BOUND on throughput and TPOT, and the sustained verdicts."""
    def errors(key, runs):
        return [abs(r["rows"][key]["error"]) for r in runs if key in r["rows"] and r["rows"][key]["error"] is not None]

    def median_of(values):
        values = sorted(values)
        return (values[(len(values) - 1) // 2] + values[len(values) // 2]) / 2 if values else None

    def medians_of(scored):
        quiet = [r for r in scored if not r["near_capacity"]]
        busy = [r for r in scored if r["near_capacity"]]
        medians = {}
        for label, key, runs in (("throughput", "output_throughput", scored), ("tpot", "mean_tpot_ms", scored),
                                 ("ttft", "mean_ttft_ms", quiet), ("ttft near capacity", "mean_ttft_ms", busy),
                                 ("e2e", "mean_e2el_ms", scored)):
            found = errors(key, runs)
            medians[label] = {"median": median_of(found), "runs": len(found)}
        return medians

    medians = medians_of(results)
    inferred = [r for r in results if r.get("inferred")]
    strict = {"runs": len(inferred), "settings": sorted({name for r in inferred for name in r["inferred"]}),
              "medians": medians_of([r for r in results if not r.get("inferred")])} if inferred else None
    within = [r["name"] for r in results
              if all(abs(r["rows"][k]["error"]) <= VALIDATION_BOUND for k in ("output_throughput", "mean_tpot_ms")
                     if k in r["rows"] and r["rows"][k]["error"] is not None)]
    # A closed loop is sustained on both sides by construction: agreeing there tells nothing.
    judged = [r for r in results if r["sustained"]["measured"] is not None and r["sustained"]["servesim"] is not None
              and not r["sustained"].get("closed_loop")]
    wrong = [r["name"] for r in judged if r["sustained"]["measured"] != r["sustained"]["servesim"]]
    closed = sum(1 for r in results if r["sustained"].get("closed_loop"))
    by_source = {}
    for source in sorted({r["source"] for r in results}):
        mine = [r for r in results if r["source"] == source]
        by_source[source] = {label: median_of(errors(key, mine)) for label, key in
                             (("throughput", "output_throughput"), ("tpot", "mean_tpot_ms"), ("ttft", "mean_ttft_ms"))}
    return {"medians": medians, "within_bound": len(within), "runs": len(results), "verdicts_judged": len(judged),
            "verdicts_wrong": wrong, "verdicts_by_construction": closed,
            "verdicts": dict(Counter("sustained" if r["sustained"]["measured"] else "overloaded" for r in judged)),
            "by_source": by_source, "without_inferred": strict}


# What loadgen --simulate takes about the server beside the run's own shape: the engine it runs.
SIMULATED_AS = ("engine", "async_scheduling", "cost_model")


def beside_the_run(config: LoadConfig, report: dict, hardware: Hardware, model: ModelSpec,
                   settings: Optional[dict] = None) -> dict:
    """loadgen --simulate: the run just measured (its send times and lengths, the server's own
    shape where /props gives it) simulated on `settings` (an engine, a cost model), each figure
    beside the measured one. An engine named takes its own defaults for what the server did not say."""
    kept = (report.get("server") or {}).get("shape") or {}
    shape, note = ({}, kept["unknown"]) if "unknown" in kept else (kept, "") if kept else \
        server_shape(Http(config.url, config.timeout_s, config.api_key))
    given = {**{k: v for k, v in shape.items() if k in SETTINGS}, **(settings or {})}
    spec = engine_defaults(RunSpec(hardware=hardware, model=model, **given), given)
    engine = engine_label(spec)
    title = f"servesim {hardware.name} / {model.name}" + (f", {engine}" if engine else "") + \
        (f", {spec.cost_model} cost model" if spec.cost_model != DEFAULT_COST_MODEL else "") + \
        f", {spec.max_num_seqs} seqs" + (f" ({note})" if note else "")
    try:
        predicted = simulate_measured(run_from_report(report, "just measured", kind="the run"), spec)
    except (CapacityError, UserError) as e:
        return {"title": title, "problem": f"servesim could not simulate this run: {e}"}
    title += f", {predicted['config']['kv_tokens']:,} kv tokens"
    if predicted["failed"]:       # the figures are of the rest: say so where they are read
        kinds = "; ".join(f"{n:,} x {kind}" for kind, n in predicted["errors_by_kind"].items())
        title += f"; {predicted['failed']:,} of {len(report['input_lens']):,} simulated requests failed ({kinds})"
    return {"title": title, "rows": compared_rows(report, predicted), "servesim": predicted}


def confirm_check(url: str, spec: RunSpec) -> None:
    """search --confirm sends what the search simulated; refuse what loadgen cannot send, before
    searching."""
    try:
        Http(url, 1.0, os.environ.get("OPENAI_API_KEY"))       # the URL and the key, as loadgen will take them
    except UserError as e:
        raise UserError(str(e).replace("--api-key", "OPENAI_API_KEY").replace("--url", "--confirm")) from None
    if spec.trace and spec.trace_repeats > 1:
        raise UserError("--confirm replays the trace once, as loadgen --trace does: drop --trace-repeats")
    if spec.trace:
        return
    if spec.prompt_tokens.low != spec.prompt_tokens.high or spec.output_tokens.low != spec.output_tokens.high:
        raise UserError("--confirm sends fixed lengths: give --prompt-tokens N and --output-tokens N, one value each")
    if spec.prefix_tokens and spec.num_prefixes > 1:
        raise UserError("--confirm sends one shared prefix: drop --num-prefixes")


CONFIRM_REQUESTS, CONFIRM_TIMEOUT_S = 64, 120.0    # search --confirm's run: requests, and the wait for an event


def confirm(url: str, deployment: RunSpec, load: float, by: str, requests: int, timeout_s: float,
            progress: Optional[Callable[[str], None]] = None) -> tuple[dict, Optional[Stopped]]:
    """One short loadgen at the load a search chose, with the search's arrivals (gamma gaps of its
    burstiness, conversations with their think time, or the trace at the time scale that makes
    the load), simulated again on its own send times and lengths: measured against predicted."""
    trace = deployment.trace
    config = LoadConfig(url=url, requests=min(requests, len(trace.rows)) if trace else requests,
                        rate=load if by == "rate" and not trace else None,
                        concurrency=int(load) if by == "concurrency" else None,
                        trace=trace, time_scale=at_load(deployment, by, load)["time_scale"] if trace else 1.0,
                        burstiness=deployment.burstiness, turns=deployment.turns, think_time_s=deployment.think_time,
                        max_tokens=deployment.output_tokens.low, ignore_eos=True,
                        prompt_words=deployment.prompt_tokens.low, prefix_words=deployment.prefix_tokens,
                        seed=deployment.seed, slos=dict(deployment.goodput) or None, size_prompts=True,
                        timeout_s=timeout_s, api_key=os.environ.get("OPENAI_API_KEY"))
    result, records, stopped = run_load(config, progress)
    found = {"url": redact_url(url), "load": load, "by": by, "measured": result}
    if stopped:
        found["stopped"] = stopped.message
        return found, stopped
    measured = run_from_report({**result, **detailed_arrays(records)}, "the confirm run")
    found["rows"] = compared_rows(result, simulate_measured(measured, deployment))
    found["title"] = (f"confirm: {len(records):,} requests to {redact_url(url)} at {by} {load:g}, "
                      f"measured against servesim on the same send times and lengths")
    return found, None


def union_length(windows: list[tuple[float, float]]) -> float:
    """The seconds covered by at least one of the windows."""
    total, reach = 0.0, -math.inf
    for start, end in sorted(windows):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def merge_reports(reports: list[tuple[str, dict]], slos: Optional[dict] = None) -> tuple[dict, list, list[str]]:
    """Several loadgen --detailed reports (one per client machine) as one run: every request on
    one clock, percentiles recomputed, throughput over the union of the windows. Returns the
    report, its requests, and what had to be assumed."""
    parts, notes, seen, machines, models, devices, spans, runs = [], [], {}, [], {}, {}, {}, []
    streamed = 0      # what failed requests streamed, each report's (loadgen keeps it apart from the summary)
    for path, report in reports:
        if not isinstance(report, dict) or not isinstance(report.get("input_lens"), list):
            raise UserError(f"report {path}: no per-request arrays; run loadgen with --detailed")
        for key in ("config", "client"):
            if report.get(key) is not None and not isinstance(report[key], dict):
                raise UserError(f"report {path}: {key} is not an object; pass what loadgen --detailed wrote")
        config, starts = report.get("config") or {}, report.get("start_times") or []
        if not report["input_lens"] and config.get("shard") is not None:
            machines.append(machine_of(path, report))     # a shard whose share of the schedule was empty
            continue
        measured = run_from_report(report, path)
        warm = report.get("warmup_flags")
        if warm is not None:
            if not (isinstance(warm, list) and len(warm) == len(measured.requests)
                    and all(isinstance(w, bool) for w in warm)):
                raise UserError(f"report {path}: warmup_flags must be true or false for each request")
            measured.requests = [r for r, w in zip(measured.requests, warm) if not w]
            if not measured.requests:
                machines.append(machine_of(path, report))     # sent only warm-up requests: present all the same
                continue
        # Clocks: started_unix is the wall clock (2001 to 2286), started_perf the clock start_times use.
        for key, low, high in (("started_unix", 1e9, 1e10), ("started_perf", 0, 1e10)):     # (a clock from boot)
            value = config.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not low <= value <= high):
                raise UserError(f"report {path}: config.{key} is {str(value)[:40]}; expected seconds from {low:g} "
                                f"to {high:g}")
        anchor = (config["started_unix"] + min(starts) - config["started_perf"]
                  if starts and config.get("started_unix") is not None and config.get("started_perf") is not None
                  else None)
        # The same run twice: the same run id at the same moment, or the same per-request arrays.
        marks = [json.dumps([report.get(k) for k in ("input_lens", "output_lens", "ttfts", "itls", "start_times")])]
        # A merged report is its runs: each is one run, whichever report brings it (merge writes them).
        runs_in = config.get("runs")
        if runs_in is not None and not (isinstance(runs_in, list) and all(
                isinstance(r, list) and len(r) == 2 and (r[0] is None or isinstance(r[0], str))
                and isinstance(r[1], (int, float)) and not isinstance(r[1], bool) and math.isfinite(r[1])
                for r in runs_in)):
            raise UserError(f"report {path}: config.runs must be [run id, start] pairs, as merge writes them")
        own_runs = [tuple(r) for r in runs_in] if runs_in else [(config.get("run_id"), anchor)] if anchor is not None \
            else []
        marks += [repr(run_) for run_ in own_runs]
        runs += own_runs
        same = next((seen[mark] for mark in marks if mark in seen), None)
        if same:
            raise UserError(f"report {path} is the same run as {same}: merging it twice would count its requests "
                            f"twice")
        seen.update({mark: path for mark in marks})
        parts.append((path, measured, anchor))
        windows_of = config.get("windows")
        if windows_of is not None:      # (merge writes them: each run's span, from its first send, in seconds)
            if not (isinstance(windows_of, list) and windows_of and all(
                    isinstance(w, list) and len(w) == 2 and all(isinstance(t, (int, float)) and not isinstance(t, bool)
                                                                and 0 <= t <= MAX_ARRIVAL_S for t in w) and w[0] <= w[1]
                    for w in windows_of)):
                raise UserError(f"report {path}: config.windows must be [start, end] pairs of seconds from 0 to a "
                                f"year, as merge writes them")
            spans[path] = [tuple(w) for w in windows_of]
        machines.append(machine_of(path, report))
        tokens = report.get("failed_streamed_tokens", 0)
        if isinstance(tokens, bool) or not isinstance(tokens, int) or not 0 <= tokens <= 10**12:
            raise UserError(f"report {path}: failed_streamed_tokens must be a whole number of tokens, got "
                            f"{printable(str(tokens)[:40])}")
        streamed += tokens
        for said, by_name in zip(config_names(config, ("model", "hardware"), f"report {path}"), (models, devices)):
            if said is not None:
                by_name.setdefault(said, path)
    if not parts:
        raise UserError("no report has a measured request to merge")
    for kind, named in (("model", models), ("device", devices)):
        if len(named) > 1:     # one run's percentiles over two models' (or devices') requests describe neither
            (a, first), (b, second) = list(named.items())[:2]
            raise UserError(f"report {second} is of {kind} {printable(b[:80])}, report {first} of "
                            f"{printable(a[:80])}: merge the reports of one deployment")
    on_wall_clock = all(anchor is not None for _, _, anchor in parts)
    base = min(anchor for _, _, anchor in parts) if on_wall_clock else 0.0
    if not on_wall_clock:
        notes.append("not every report says when it started on the wall clock (vllm bench results do not); each "
                     "one's first request is put at 0")
    requests, windows = [], []
    for path, measured, anchor in parts:
        shift = anchor - base if on_wall_clock else 0.0
        for r in measured.requests:
            request = measured_request(len(requests), r.sent_s + shift,
                                       None if r.first_token_s is None else r.first_token_s + shift,
                                       None if r.last_token_s is None else r.last_token_s + shift,
                                       r.prompt_tokens, r.output_tokens, r.error)
            request.token_times = [t + shift for t in r.token_times] if r.token_times else None
            request.streamed = r.streamed
            if getattr(r, "ended_s", None) is not None:
                request.ended_s = r.ended_s + shift
            if r.answer_s is not None and r.reasoning_tokens:
                request.answer_s, request.reasoning_tokens = r.answer_s + shift, r.reasoning_tokens
            requests.append(request)
        ends = [r.last_token_s if r.last_token_s is not None else r.ended_s for r in measured.requests
                if r.last_token_s is not None or r.ended_s is not None]     # (a failure's end, where kept)
        own = spans.get(path)       # a merged report's own runs, apart: its gaps measured nothing either
        windows += [(shift + a, shift + b) for a, b in own] if own else [(shift, shift + max(ends, default=0.0))]
    if on_wall_clock and len(windows) > 1 and max(w[0] for w in windows) > min(w[1] for w in windows):
        notes.append("these runs did not all overlap in time; throughput is over the union of their windows")
    result = summarize(requests, slos=slos)
    result["failed_streamed_tokens"] = streamed
    busy = union_length(windows)
    if on_wall_clock and 0 < busy < result["duration"]:      # gaps between the runs measured nothing
        scale = result["duration"] / busy
        for key in ("request_throughput", "output_throughput", "total_token_throughput"):
            result[key] *= scale
        if result["request_goodput"] is not None:
            result["request_goodput"] *= scale
        result["duration"] = busy
    result["config"] = {"title": f"merge of {len(parts)} report{'s' * (len(parts) != 1)}  {len(requests):,} requests",
                        "model": next(iter(models), None), "hardware": next(iter(devices), None),
                        "reports": [path for path, _ in reports], "requests_each": [len(m.requests) for _, m, _ in parts],
                        "clock": "wall clock" if on_wall_clock else "each report's first request at 0"}
    if on_wall_clock:
        # Where the merged run sits on the wall clock, as loadgen says it (its start_times count from
        # 0 at `base`), and an id of its own: merged again, it lands where its requests were sent.
        result["config"].update(started_unix=base, started_perf=0.0, run_id="merge-" + hashlib.sha256(
            repr(sorted(anchor for _, _, anchor in parts)).encode()).hexdigest()[:12],
            windows=[list(w) for w in sorted(windows)], runs=[list(run_) for run_ in runs])
    if any(m["shard"] for m in machines):
        result["config"]["machines"] = shards_together(machines, notes)
    return result, requests, notes


def machine_of(path: str, report: dict) -> dict:
    """What a loadgen report says of its machine's share of a sharded run, checked where it is read."""
    config, client = report.get("config") or {}, report.get("client") or {}
    shard = config.get("shard")
    if shard is None:
        return {"path": path, "shard": None}
    def number(value, low, high, name):
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise UserError(f"report {path}: {name} is {str(value)[:40]}; expected a number from {low:g} to {high:g}")
        return float(value)
    if not (isinstance(shard, list) and len(shard) == 2 and all(type(v) is int for v in shard)
            and 1 <= shard[0] <= shard[1] <= 100_000):
        raise UserError(f"report {path}: config.shard is {str(shard)[:40]}; expected [K, N] with 1 <= K <= N")
    schedule = config.get("schedule")
    if not isinstance(schedule, str) or not re.fullmatch(r"[0-9a-f]{16}", schedule):
        raise UserError(f"report {path}: " + ("a shard without its schedule fingerprint (config.schedule)" if schedule is None
                                               else f"config.schedule {printable(str(schedule))[:40]!r} is not a "
                                                    f"schedule fingerprint (16 hex digits, as loadgen writes it)")
                        + "; rerun loadgen")
    indices = report.get("indices")
    if not (isinstance(indices, list) and len(indices) == len(report["input_lens"])
            and all(type(i) is int and 0 <= i < MAX_REQUESTS for i in indices)):
        raise UserError(f"report {path}: a shard needs its requests' places in the schedule (indices, one whole "
                        f"number per request); rerun loadgen with --detailed")
    clock = client.get("server_clock") if isinstance(client.get("server_clock"), dict) else {}
    low = number(clock.get("low_s"), -1e9, 1e9, "client.server_clock.low_s")
    high = number(clock.get("high_s"), -1e9, 1e9, "client.server_clock.high_s")
    lag = client.get("dispatch_lag_ms") if isinstance(client.get("dispatch_lag_ms"), dict) else {}
    started_unix = number(config.get("started_unix"), 1e9, 1e10, "config.started_unix")
    started_perf = number(config.get("started_perf"), -1e10, 1e10, "config.started_perf")
    # A conversation's later turns have no scheduled time: they follow the turn before.
    scheduled = report.get("scheduled_times")
    if not (isinstance(scheduled, list) and len(scheduled) == len(indices) and all(
            t is None or (isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t)
                          and (started_perf is None or abs(t - started_perf) <= MAX_ARRIVAL_S)) for t in scheduled)):
        raise UserError(f"report {path}: a shard needs its requests' scheduled send times (scheduled_times, a "
                        f"number of seconds within a year of the start, or null for a later turn, per request); "
                        f"rerun loadgen with --detailed")
    on_wall = None if started_unix is None or started_perf is None else \
        [started_unix + t - started_perf for t in scheduled if t is not None]
    start_at = number(config.get("start_at"), 1e9, 1e10, "config.start_at")
    if start_at is not None and started_unix is not None and not -START_LATE_S <= started_unix - start_at <= 86400:
        raise UserError(f"report {path}: config.started_unix is {started_unix - start_at:,.1f} s from its start_at; "
                        f"a shard starts at its --start-at, at most a second late")
    stopped = report.get("stopped")
    return {"path": path, "shard": tuple(shard), "schedule": schedule, "indices": indices, "scheduled": on_wall,
            "stopped": printable(str(stopped))[:200] if stopped else None,
            "start_at": start_at, "started_unix": started_unix,
            "clock": (low, high) if low is not None and high is not None and low <= high else None,
            "dispatch_p99_ms": number(lag.get("p99"), -1e9, 1e12, "client.dispatch_lag_ms.p99")}


def shards_together(machines: list[dict], notes: list[str]) -> dict:
    """Whether the reports are the shards of one schedule, each once, and how far apart the machines
    started and how far their clocks were (each bounded against the server's Date headers)."""
    plain = next((m for m in machines if not m["shard"]), None)
    if plain:
        sharded = next(m for m in machines if m["shard"])
        raise UserError(f"report {sharded['path']} is shard {sharded['shard'][0]}/{sharded['shard'][1]} of a run and "
                        f"{plain['path']} is not a shard: merge the reports of one sharded run")
    first = machines[0]
    for m in machines[1:]:
        if m["schedule"] != first["schedule"] or m["shard"][1] != first["shard"][1]:
            raise UserError(f"report {m['path']} is a shard of another run than {first['path']} (its seed, load, "
                            f"--shard N or --start-at differ): merge the shards of one run")
    by_shard: dict = {}
    for m in machines:
        if m["shard"] in by_shard:
            raise UserError(f"reports {by_shard[m['shard']]} and {m['path']} are both shard {m['shard'][0]}/"
                            f"{m['shard'][1]}: merging both would count its requests twice")
        by_shard[m["shard"]] = m["path"]
    count = first["shard"][1]
    missing = [k for k in range(1, count + 1) if (k, count) not in by_shard]
    sent = Counter(i for m in machines for i in m["indices"])
    twice = [i for i, n in sent.items() if n > 1]
    if twice:
        raise UserError(f"request {twice[0]:,} of the schedule is in more than one shard's report; these are not "
                        f"the shares of one run")
    for m in machines:
        if m["stopped"]:
            notes.append(f"shard {m['shard'][0]}/{count} ({m['path']}) stopped early: {m['stopped']}; its share of "
                         f"the schedule is cut short")
    if missing:
        notes.append(f"shard{'s' if len(missing) > 1 else ''} {', '.join(f'{k}/{count}' for k in missing[:8])} "
                     f"{'are' if len(missing) > 1 else 'is'} missing: the merged load is {count - len(missing)} of "
                     f"{count} shares of the schedule")
    starts = [m["started_unix"] for m in machines if m["started_unix"] is not None]
    lags = [(m["started_unix"] - m["start_at"]) * 1000 for m in machines
            if m["started_unix"] is not None and m["start_at"] is not None]
    clocks = [m["clock"] for m in machines if m["clock"]]
    apart = (max(high for _, high in clocks) - min(low for low, _ in clocks)) if len(clocks) == len(machines) else None
    if apart is None:
        notes.append("not every machine could bound its clock against the server's Date header: how far apart the "
                     "clocks were is not known (keep them synchronised, e.g. by NTP)")
    lagging = [m for m in machines if m["dispatch_p99_ms"] is not None]
    worst = max(lagging, key=lambda m: m["dispatch_p99_ms"], default=None)
    # The rate the whole schedule offered: its sends from every machine, on the wall clock.
    sends = sorted(t for m in machines for t in m["scheduled"] or ())
    whole = all(m["scheduled"] is not None for m in machines) and len(sends) > 1 and sends[-1] > sends[0]
    return {"shards": count, "present": sorted(k for k, _ in by_shard), "missing": missing,
            "requests": len(sent), "schedule_holes": (max(sent) + 1 - len(sent)) if sent else 0,
            "start_spread_ms": (max(starts) - min(starts)) * 1000 if starts else None,
            "latest_start_lag_ms": max(lags) if lags else None,
            "clocks_apart_at_most_s": apart,
            "offered_rate": (len(sends) - 1) / (sends[-1] - sends[0]) if whole else None,
            "worst_dispatch_lag_p99_ms": worst["dispatch_p99_ms"] if worst else None,
            "worst_dispatch_shard": f"{worst['shard'][0]}/{worst['shard'][1]}" if worst else None}


# ---------------------------------------------------------------------------------------------
# Diagnosis: the runbook's decision table, applied to a /metrics scrape, a loadgen report or a
# simulate/sweep report. The table lives here once; `explain --table` prints it for the runbook.
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Remedy:
    symptom: str
    signs: str
    binds: str
    knobs: dict          # server -> the knob to change first
    effect: str          # expected effect on each metric
    will_not_help: str   # each claim holds in servesim's own model (test_explain.WontHelp turns the knob);
                         # {seqs}, {tokens} and {memory} stand for each server's own flag (SERVER_KNOBS)


# The budgets "won't help" names, in each server's own flags. llama.cpp's cache is --ctx-size, split
# among --parallel slots: raised alone it gives each slot more context, not more slots.
SERVER_KNOBS = {
    "seqs": {"vllm": "`--max-num-seqs`", "llama.cpp": "`--parallel`", "sglang": "`--max-running-requests`"},
    "tokens": {"vllm": "`--max-num-batched-tokens`", "llama.cpp": "`--batch-size`",
               "sglang": "`--chunked-prefill-size`"},
    "memory": {"vllm": "`--gpu-memory-utilization`", "llama.cpp": "`--ctx-size` alone",
               "sglang": "`--mem-fraction-static`"},
}


def will_not_help(remedy: Remedy, server: Optional[str]) -> str:
    """The row's "won't help" in one server's flags, or (None) in all three's, for the table."""
    return remedy.will_not_help.format(**{
        name: flags[server] if server else " / ".join(flags.values()) for name, flags in SERVER_KNOBS.items()})


DECISION_TABLE = (
    Remedy("kv-bound", "preemptions climb; KV usage pinned near 100%; requests wait",
           "KV cache blocks",
           {"vllm": "`--enable-prefix-caching` if prompts share a prefix; else raise `--gpu-memory-utilization`, "
                    "store the cache in FP8 (`--kv-cache-dtype fp8`), quantize the weights, or add tensor parallelism "
                    "(`--tensor-parallel-size`)",
            "llama.cpp": "`--cache-reuse` for shared prefixes; else `--ctx-size` up",
            "sglang": "`--mem-fraction-static` up"},
           "TTFT falls (no recompute, shorter queue); throughput rises with the bigger batch; TPOT rises a little",
           "raising {seqs} (memory, not the cap, limits the batch)"),
    Remedy("compute-bound", "a step's tokens (its decodes and prompt chunks) past the knee; TPOT grows with "
           "every added sequence or chunk; throughput flat",
           "compute (the roofline)",
           {"vllm": "for TPOT, `--max-num-seqs` down toward the knee (requests then wait longer); for throughput, "
                    "quantization or tensor parallelism (`--tensor-parallel-size`)",
            "llama.cpp": "for TPOT, `--parallel` down toward the knee (requests then wait longer); for throughput, "
                         "another `llama-server` on its own cores or machine",
            "sglang": "for TPOT, `--max-running-requests` down toward the knee (requests then wait longer); for "
                      "throughput, quantization or tensor parallelism (`--tp-size`)"},
           "TPOT falls toward the batch-1 step; throughput drops by less than the batch does (past the knee "
           "each sequence bought little); TTFT rises for waiting requests",
           "more KV memory (the cache is not the limit); reading GPU utilisation as batch fullness (it says a "
           "kernel ran, not how full the batch was)"),
    Remedy("sequence-bound", "running requests at the sequence cap; KV cache mostly idle; requests wait",
           "sequences",
           {"vllm": "`--max-num-seqs` up",
            "llama.cpp": "`--parallel` up, with `--ctx-size` raised to keep each slot's context (or `--kv-unified`)",
            "sglang": "`--max-running-requests` up"},
           "TTFT falls as the queue drains; throughput rises until KV or compute binds; TPOT rises a little",
           "more KV memory ({memory}): the cache is idle"),
    Remedy("token-budget-bound", "long prompts; requests wait while sequences and KV have room",
           "tokens per step",
           {"vllm": "`--max-num-batched-tokens` up",
            "llama.cpp": "`--batch-size` and `--ubatch-size` up",
            "sglang": "`--chunked-prefill-size` up"},
           "TTFT falls under load (more prompt tokens per step); ITL spikier when big chunks land; throughput about the same",
           "raising {seqs} (sequences are not the limit)"),
    Remedy("queue-bound", "TTFT is mostly queue and no single budget binds: arrivals exceed one replica",
           "the whole replica",
           {"vllm": "another replica (data parallel), or a bigger one with `--tensor-parallel-size`",
            "llama.cpp": "another `llama-server` on its own cores or machine",
            "sglang": "another replica (`--dp-size`)"},
           "TTFT falls with the added capacity; TPOT unchanged; throughput rises",
           "tuning a budget that does not bind ({seqs}, {tokens})"),
    Remedy("failing", "requests fail (each counted, with its reason) while no budget binds",
           "the limit the failures name",
           {"vllm": "the limit the first failure names: `--max-model-len` up, or shorter requests, for a request "
                    "longer than it; a client timeout under little load: the timeout, or the server's log",
            "llama.cpp": "the limit the first failure names: `--ctx-size` up (a slot holds it divided by "
                         "`--parallel`), or shorter requests, for a request longer than a slot; else the server's log",
            "sglang": "the limit the first failure names: `--context-length` up, or shorter requests, for a request "
                      "longer than it; else the server's log"},
           "the failed requests run; the latency figures, which leave failed requests out, then count them",
           "tuning a budget for latency while requests fail (the latency figures leave them out)"),
    Remedy("healthy", "little queue; TPOT near the batch-1 step; no preemptions; no request failed",
           "none",
           {"vllm": "nothing; raise load until a budget binds if throughput matters",
            "llama.cpp": "nothing; raise load until a budget binds if throughput matters",
            "sglang": "nothing; raise load until a budget binds if throughput matters"},
           "none expected",
           "changing knobs without a symptom"),
)
REMEDIES = {r.symptom: r for r in DECISION_TABLE}


def decision_table_markdown() -> str:
    rows = ["| symptom | what the numbers show | binds | vLLM | llama.cpp | SGLang | expected effect | will not help |",
            "|---|---|---|---|---|---|---|---|"]
    for r in DECISION_TABLE:
        rows.append(f"| {r.symptom} | {r.signs} | {r.binds} | {r.knobs['vllm']} | {r.knobs['llama.cpp']} | "
                    f"{r.knobs['sglang']} | {r.effect} | {will_not_help(r, None)} |")
    return "\n".join(rows)


@dataclass
class Signals:
    """What a diagnosis needs, from whichever input had it; None where the input cannot say."""
    source: str
    server: str                              # vllm, llama.cpp, sglang or servesim
    ttft_ms: Optional[float] = None          # p50 or mean, as the input has it
    queue_ms: Optional[float] = None
    prefill_ms: Optional[float] = None
    e2e_ms: Optional[float] = None
    tpot_ms: Optional[float] = None
    running: Optional[float] = None          # peak running sequences
    waiting: Optional[float] = None          # peak waiting requests
    max_seqs: Optional[int] = None
    kv_peak: Optional[float] = None          # 0..1
    kv_tokens: Optional[int] = None
    preemptions: Optional[float] = None
    prefix_hit_rate: Optional[float] = None
    mean_batch: Optional[float] = None
    batch_said: str = "mean batch"           # what mean_batch is: a gauge's moment, or a peak, where no mean is
    step_tokens: Optional[float] = None      # tokens a step computes, decodes and prompt chunks (a servesim report's)
    tensor_parallel: int = 1                 # GPUs of a replica's group, where the report names its deployment
    gpus_per_node: int = 8
    knee: Optional[float] = None             # critical batch, when hardware and model are known
    batch1_tpot_ms: Optional[float] = None
    budget: Optional[int] = None             # tokens per step
    prompt_tokens: Optional[float] = None    # mean per request
    output_tokens: Optional[float] = None
    throughput_trend: Optional[float] = None # throughput at the last sweep point / the one before
    waited_at_cap: Optional[bool] = None     # requests waited while the batch was at the cap (simulator)
    prefix_caching: Optional[bool] = None    # already on, as the report's config or --server-flags say
    scrape: bool = False                     # a /metrics snapshot, not a report of a run
    failed: float = 0                        # requests that failed (a mean, over seeds), of `requests`
    requests: float = 0
    first_failure: Optional[str] = None      # the first failed request's reason
    replicas: int = 1                        # engines behind a router (-dp): kv_tokens and max_seqs are each one's
    ran_on: Optional[tuple] = None           # (device, model) as a servesim report names them
    no_knee: str = ""                        # why a report that names its deployment gives no knee


FLAG_NAMES = {   # server flag -> what it sets, for --server-flags
    "--max-num-seqs": "max_seqs", "--parallel": "max_seqs", "-np": "max_seqs", "--max-running-requests": "max_seqs",
    "--max-num-batched-tokens": "budget", "--batch-size": "budget", "-b": "budget", "--chunked-prefill-size": "budget",
    "--ctx-size": "kv_tokens", "-c": "kv_tokens",
}


SWITCHES = {"--enable-prefix-caching": ("prefix_caching", True), "--no-enable-prefix-caching": ("prefix_caching", False)}
SERVER_FLAG_WORDS = {"max_seqs": "the sequence cap", "budget": "the token budget a step", "kv_tokens": "the KV cache's tokens",
                     "prefix_caching": "prefix caching"}


def server_flags(text: str) -> dict:
    """The server command line's flags that explain reads. Other flags are fine (a real command
    line has many); one that looks like a misspelling of a flag it reads is a warning."""
    try:
        words = shlex.split(text)
    except ValueError as e:
        raise UserError(f"--server-flags: cannot split {text!r} ({e})") from None
    found: dict = {}
    said: dict = {}      # what set each, as given
    i = 0
    while i < len(words):
        flag, value = words[i].partition("=")[::2] if words[i].startswith("--") else (words[i], "")
        i += 1
        if flag in SWITCHES:
            key, setting = SWITCHES[flag]
            shown = flag
        elif flag in FLAG_NAMES:
            if not value:
                value, i = (words[i], i + 1) if i < len(words) else ("", i)
            try:
                setting = int(value.replace(",", "").replace("_", ""))
            except ValueError:
                raise UserError(f"--server-flags: {flag} needs a whole number, got {value!r}") from None
            if not 1 <= setting <= 10**9:
                raise UserError(f"--server-flags: {flag} must be from 1 to 1,000,000,000, got {setting}")
            key, shown = FLAG_NAMES[flag], f"{flag} {setting:,}"
        else:
            close = difflib.get_close_matches(flag, [*FLAG_NAMES, *SWITCHES], n=1, cutoff=0.8) \
                if flag.startswith("-") else None
            if close:
                sys.stderr.write(f"servesim: --server-flags: ignoring {flag}; did you mean {close[0]}?\n")
            continue
        if key in found and found[key] != setting:      # (two engines' names for one knob: which ran?)
            raise UserError(f"--server-flags gives {SERVER_FLAG_WORDS[key]} twice, {said[key]} and {shown}; "
                            f"give the one the server ran with")
        found[key], said[key] = setting, shown
    if words and not found:       # given for a reason: say it changed nothing, and what would
        sys.stderr.write(f"servesim: --server-flags: none of these is a flag explain reads ({', '.join([*FLAG_NAMES, *SWITCHES])}); "
                         f"they change nothing\n")
    return found


def mean_of(scrape: dict, histogram: str, scale: float = 1000) -> Optional[float]:
    """A histogram's mean from its _sum and _count; seconds become ms unless scale says otherwise.
    None when either is missing or the count is not positive."""
    count, total = scrape.get(f"{histogram}_count"), scrape.get(f"{histogram}_sum")
    return total / count * scale if count and count > 0 and total is not None and total >= 0 else None


def signals_from_scrape(text: str, name: str) -> Signals:
    left_out = Counter()
    m = parse_prometheus(text, left_out)
    # No count, time or gauge of these is negative; a KV share is 0..1; requests, preemptions and a
    # histogram's observations come whole, and no server runs or holds ten million requests.
    whole = lambda k: k in (*RUNNING_GAUGES, *WAITING_GAUGES, "vllm:num_preemptions_total") or k.endswith("_count")
    for key in [k for k, v in m.items() if v < 0 or (k in KV_GAUGES and v > 1)
                or (whole(k) and v != int(v)) or (k in (*RUNNING_GAUGES, *WAITING_GAUGES) and v > MAX_REQUESTS_SEEN)]:
        left_out[key] += 1
        del m[key]
    for key in [k for k in left_out if not k.startswith(("vllm:", "llamacpp:", "sglang:"))]:
        del left_out[key]             # another exporter's samples: explain reads none of them
    names = ', '.join(sorted(printable(k[:60]) for k in left_out))
    if left_out and not any(k.startswith(("vllm:", "llamacpp:", "sglang:")) for k in m):
        raise UserError(f"{name}: none of its {sum(left_out.values()):,} server sample(s) is a number in range "
                        f"({names}): nothing is left to diagnose")
    if left_out:
        sys.stderr.write(f"servesim: {name}: left out {sum(left_out.values()):,} sample(s) that are not a number in "
                         f"range, or repeat a series ({names}): the diagnosis does without them\n")
    servers = [prefix for prefix in ("vllm:", "llamacpp:", "sglang:") if any(k.startswith(prefix) for k in m)]
    if len(servers) > 1:
        sys.stderr.write(f"servesim: {name}: holds {' and '.join(p[:-1] for p in servers)} series; it is read as "
                         f"{servers[0][:-1]}'s alone (explain one server's scrape at a time)\n")
    if any(k.startswith("vllm:") for k in m):
        queries, hits = m.get("vllm:prefix_cache_queries_total"), m.get("vllm:prefix_cache_hits_total")
        if queries is not None and hits is not None and not 0 <= hits <= queries:
            sys.stderr.write(f"servesim: {name}: vllm:prefix_cache_hits_total {hits:,.0f} is more than the "
                             f"{queries:,.0f} tokens looked up: the hit rate is left out\n")
        return Signals(name, "vllm", ttft_ms=mean_of(m, "vllm:time_to_first_token_seconds"),
                       queue_ms=mean_of(m, "vllm:request_queue_time_seconds"),
                       prefill_ms=mean_of(m, "vllm:request_prefill_time_seconds"),
                       e2e_ms=mean_of(m, "vllm:e2e_request_latency_seconds"),
                       tpot_ms=mean_of(m, "vllm:request_time_per_output_token_seconds"),
                       running=m.get("vllm:num_requests_running"), waiting=m.get("vllm:num_requests_waiting"),
                       kv_peak=m.get("vllm:kv_cache_usage_perc", m.get("vllm:gpu_cache_usage_perc")),
                       preemptions=m.get("vllm:num_preemptions_total"),
                       prefix_hit_rate=hits / queries if queries and hits is not None and 0 <= hits <= queries
                       else None,
                       # a hit is a cached block found: caching is on (off, vLLM looks nothing up)
                       prefix_caching=True if hits and queries and hits <= queries else None,
                       mean_batch=m.get("vllm:num_requests_running"), batch_said="batch at the scrape",
                       prompt_tokens=mean_of(m, "vllm:request_prompt_tokens", scale=1),
                       output_tokens=mean_of(m, "vllm:request_generation_tokens", scale=1))
    if any(k.startswith("llamacpp:") for k in m):
        return Signals(name, "llama.cpp", running=m.get("llamacpp:requests_processing"),
                       waiting=m.get("llamacpp:requests_deferred"),
                       mean_batch=m.get("llamacpp:n_busy_slots_per_decode"))
    if any(k.startswith("sglang:") for k in m):
        return Signals(name, "sglang", ttft_ms=mean_of(m, "sglang:time_to_first_token_seconds"),
                       queue_ms=mean_of(m, "sglang:queue_time_seconds"),
                       e2e_ms=mean_of(m, "sglang:e2e_request_latency_seconds"),
                       running=m.get("sglang:num_running_reqs"), waiting=m.get("sglang:num_queue_reqs"),
                       kv_peak=m.get("sglang:token_usage"), mean_batch=m.get("sglang:num_running_reqs"),
                       batch_said="batch at the scrape")
    raise UserError(f"{name}: no vllm:, llamacpp: or sglang: metrics in it; pass a /metrics scrape, "
                    f"a loadgen --json report or a simulate/sweep --json report")


EXPLAIN_SHARES = frozenset((*SHARES, "kv_peak"))      # a loadgen report's server shares, a simulate report's KV peak
EXPLAIN_AT_LEAST_ONE = frozenset(("max_num_seqs", "max_num_batched_tokens", "num_blocks", "block_size"))


def in_order(sig: Signals, name: str) -> Signals:
    """The signals, if their latencies come in the order a request's do: each request's end after
    its first token, and its first token after its wait, so their medians too (and a client's
    queue is TTFT less the server's prefill). A report that says otherwise was edited, and its
    diagnosis would be the edit's."""
    for later, earlier in (("e2e_ms", "ttft_ms"), ("ttft_ms", "queue_ms")):
        a, b = getattr(sig, later), getattr(sig, earlier)
        if a is not None and b is not None and a < b - 0.05:      # (shown to a tenth: a tenth apart is one)
            words = {"e2e_ms": "E2E latency", "ttft_ms": "TTFT", "queue_ms": "queue time"}
            raise UserError(f"explain input {name}: its {words[later]} {a:,.1f} ms is less than its {words[earlier]} "
                            f"{b:,.1f} ms, which no run gives (a request ends after its first token, which comes "
                            f"after its wait)")
    return sig


def signals_from_report(report: dict, name: str, previous: Optional[dict] = None) -> Signals:
    def number_at(section: dict, key: str, label: str = "") -> Optional[float]:
        """A figure of the report: None if it is not there, a one-line error if it is not a number."""
        value = section.get(key) if isinstance(section, dict) else None
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise UserError(f"explain input {name}: {label or key} is {str(value)[:40]!r}; expected a number")
        # Every figure explain reads is a count, a time or a share: a diagnosis drawn from a KV peak
        # of 7,500% or a cap of 0 sequences would be the edit's, not the server's.
        low, high = (0, 1) if key in EXPLAIN_SHARES else (1, math.inf) if key in EXPLAIN_AT_LEAST_ONE else (0, math.inf)
        if not low <= value <= high:
            raise UserError(f"explain input {name}: {label or key} is {value:g}; expected "
                            + ("a share from 0 to 1" if high == 1 else f"a number of at least {low}"))
        # A server's peaks are whole requests (a servesim report's may be a mean over seeds), and no
        # server runs or holds ten million at once.
        if key in REQUEST_FIGURES and value > MAX_REQUESTS_SEEN or \
                (label or "").startswith("server.") and key in WHOLE_COUNTS and value != int(value):
            raise UserError(f"explain input {name}: {label or key} is {value:g}; expected a whole number of requests "
                            f"up to {MAX_REQUESTS_SEEN:,}")
        return value

    done = number_at(report, "completed") or 0
    failed = number_at(report, "failed") or 0
    if not done and failed:
        # Nothing ran, so no budget bound: saying "healthy" would hide the one thing to fix.
        first = first_failure(report)
        raise CapacityError(f"explain input {name}: all {failed:,.0f} of its requests failed"
                            + (f" (the first: {printable(str(first)[:200])})" if first else "")
                            + "; there is no latency to diagnose until they run")
    config, engine = report.get("config") or {}, report.get("engine")
    server = report.get("server") or {}
    totals = [number_at(report, key) for key in ("total_input_tokens", "total_output_tokens")]
    sig = Signals(name, "servesim" if engine else str(server.get("server", "unknown")),
                  ttft_ms=number_at(report, "median_ttft_ms"), queue_ms=number_at(report, "median_queue_ms"),
                  e2e_ms=number_at(report, "median_e2el_ms"), tpot_ms=number_at(report, "median_tpot_ms"),
                  prompt_tokens=totals[0] / done if done and totals[0] is not None else None,
                  output_tokens=totals[1] / done if done and totals[1] is not None else None,
                  failed=failed, requests=done + failed, first_failure=first_failure(report))
    if previous and number_at(previous, "output_throughput") and number_at(report, "output_throughput") is not None:
        sig.throughput_trend = report["output_throughput"] / previous["output_throughput"]
    if engine:
        figure = lambda key: number_at(engine, key, f"engine.{key}")
        sig.running, sig.waiting = figure("peak_running"), figure("peak_waiting")
        sig.max_seqs, sig.kv_peak = number_at(config, "max_num_seqs", "config.max_num_seqs"), figure("kv_peak")
        blocks, block_size = figure("num_blocks"), figure("block_size")
        sig.kv_tokens = int(blocks * block_size) if blocks is not None and block_size is not None else None
        sig.preemptions = figure("preemptions")
        sig.prefix_hit_rate, sig.mean_batch = figure("prefix_hit_rate"), figure("mean_batch")
        capped, steps = figure("steps_waiting_at_seq_cap"), figure("steps")
        sig.waited_at_cap = capped > 0.05 * steps if capped is not None and steps is not None else None
        if steps and None not in totals and done and not config.get("disaggregated"):
            # What a step computes is its decodes and its prompt chunks: a batch of 40 sequences is
            # past a knee of 197 tokens when 2,000-token prompts share its steps (cached tokens cost none).
            # The totals are the measured requests'; the steps ran the warm-up's too, taken as alike.
            # (A disaggregated report's steps are its decode engine's, whose prompts another computed.)
            hit = sig.prefix_hit_rate or 0
            ran = (done + (number_at(report, "warmup_requests") or 0)) / done
            sig.step_tokens = (totals[0] * (1 - hit) + totals[1]) * ran / steps
        sig.budget = number_at(config, "max_num_batched_tokens", "config.max_num_batched_tokens")
        sig.prefix_caching = config.get("prefix_caching") is True
        if sig.queue_ms is not None and sig.ttft_ms is not None:
            sig.prefill_ms = max(0.0, sig.ttft_ms - sig.queue_ms)
        deployment = report_deployment(config, name)
        if isinstance(config.get("hardware"), str) and isinstance(config.get("model"), str):
            sig.ran_on = (config["hardware"], config["model"])
            if not deployment:
                sig.no_knee = (f"{name} ran on {printable(config['hardware'][:60])} / {printable(config['model'][:60])}"
                               f", which explain cannot price (a device or model file, or an engine profile): give "
                               f"--hardware and --model for the knee and the batch-1 step")
        if deployment:
            sig.replicas = deployment.data_parallel_size
            node = config.get("gpus_per_node")       # (a scheduling setting, not one that prices a step)
            sig.tensor_parallel = deployment.tensor_parallel_size
            sig.gpus_per_node = recorded_setting("gpus_per_node", node, f"explain input {name}", "config.gpus_per_node") \
                if node is not None else deployment.gpus_per_node
            if sig.kv_tokens is not None:
                sig.kv_tokens //= sig.replicas
            device_figures(sig, device_plan(deployment, deployment.hardware)[1])
        return in_order(sig, name)
    figure = lambda key: number_at(server, key, f"server.{key}")
    if server.get("server") == "llama.cpp":
        sig.running, sig.waiting = figure("peak_requests_processing"), figure("peak_requests_deferred")
        sig.mean_batch = figure("mean_batch_per_decode")
        timings = report.get("timings") or {}
        prompt, waited = timings.get("prompt_ms"), timings.get("ttft_minus_prompt_ms")
        if isinstance(prompt, dict) and isinstance(waited, dict):
            sig.prefill_ms = number_at(prompt, "p50", "timings.prompt_ms.p50")
            sig.queue_ms = number_at(waited, "p50", "timings.ttft_minus_prompt_ms.p50")
    elif server.get("server") == "vllm":
        sig.running, sig.waiting = figure("peak_running"), figure("peak_waiting")
        sig.kv_peak, sig.preemptions = figure("peak_kv_cache_usage"), figure("preemptions")
        sig.prefix_hit_rate, sig.mean_batch = figure("prefix_hit_rate"), figure("peak_running")
        sig.batch_said = "peak batch"
    elif server.get("server") == "sglang":
        sig.running, sig.waiting = figure("peak_running"), figure("peak_queued")
        sig.kv_peak, sig.mean_batch = figure("peak_token_usage"), figure("peak_running")
        sig.batch_said = "peak batch"
    return in_order(sig, name)


def report_deployment(config: dict, name: str) -> Optional[RunSpec]:
    """The deployment a simulate or sweep report ran, from its config, for its knee and batch-1
    step: its parallelism, quantization and cost model as well as its device and model. None where
    the device or the model is not a preset, or the engine is a profile file: the report names it,
    and holds none of its figures."""
    hardware, model = config.get("hardware"), config.get("model")
    engine, = config_names(config, ("engine",), f"explain input {name}", "an engine's name")
    if not (isinstance(hardware, str) and hardware in HARDWARE and isinstance(model, str) and model in MODELS) \
            or engine is not None and (engine not in ENGINES or config.get("engine_base")):
        return None
    where = f"explain input {name}"
    settings = {k: recorded_setting(k, config[k], where, f"config.{k}") for k in REPORT_DEPLOYMENT
                if config.get(k) is not None}
    spec = RunSpec(hardware=HARDWARE[hardware], model=MODELS[model], engine=engine, **settings)
    try:
        check_spec(spec)
    except UserError as e:
        raise UserError(f"{where}: its config is not a deployment servesim runs ({e})") from None
    return spec


def device_figures(sig: Signals, cost: Roofline) -> None:
    """The knee, and a batch-1 decode step at the requests' mean context (its prompt and half its output)."""
    context = (sig.prompt_tokens or 0) + (sig.output_tokens or 0) / 2
    sig.knee, sig.batch1_tpot_ms = cost.critical_batch(), cost.step_seconds(1, context) * 1000


def offered_load(point: dict) -> tuple:
    """How loaded a sweep's point was: the rate it was offered, else its clients (a sweep lists its
    values in whatever order it was given them), then how long its requests queued, for points
    offered the same load on different deployments."""
    config = point.get("config") if isinstance(point.get("config"), dict) else {}
    return tuple(v if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else 0
                 for v in (config.get("request_rate"), config.get("max_concurrency"), point.get("mean_queue_ms")))


def read_signals(path: str) -> Signals:
    text = read_text(path, "explain input")
    name = os.path.basename(path)
    if not text.strip():
        raise UserError(f"{path}: empty; pass a /metrics scrape, or a loadgen, simulate or sweep --json report")
    if not text.lstrip().startswith(("{", "[")):
        sig = signals_from_scrape(text, name)
        sig.scrape = True
        return sig
    data = parse_json(text, f"explain input {path}", "pass a /metrics scrape, or a loadgen, simulate or sweep --json report")
    if isinstance(data, list) and data and all(isinstance(r, dict) and ("median_ttft_ms" in r or "does_not_fit" in r)
                                               for r in data):
        # A sweep: diagnose its most loaded point, and keep the trend from the point before.
        # Points whose model did not fit, or whose every request failed, ran nothing to diagnose.
        fitted = [point for point in data if "median_ttft_ms" in point]
        if not fitted:
            raise UserError(f"{path}: a sweep in which no point fitted; there is no run to diagnose")
        data = [point for point in fitted if point.get("completed") or not point.get("failed")] or fitted[-1:]
        for i, point in enumerate(data):
            check_report(point, f"explain input {path} point {i + 1}")
        left = f", {len(fitted) - len(data)} whose requests all failed left out" if len(data) < len(fitted) else ""
        data.sort(key=offered_load)        # stable: points offered the same load keep the sweep's order
        return signals_from_report(data[-1], f"{name} (most loaded of {len(data)} point{'s' if len(data) > 1 else ''}"
                                             f"{left})", data[-2] if len(data) > 1 else None)
    if isinstance(data, dict) and "median_ttft_ms" in data:
        return signals_from_report(check_report(data, f"explain input {path}"), name)
    if isinstance(data, dict) and isinstance(data.get("error"), str):      # what a command printed as it failed
        raise UserError(f"{path}: the output of a command that failed ({printable(data['error'][:160])}), not a "
                        f"report; explain the report of a run that ran")
    raise UserError(f"{path}: not a loadgen, simulate or sweep --json report, nor a /metrics scrape")


IDLE = Remedy("idle", "no request running or waiting, no latency in the input", "nothing: the server was idle",
              {server: "nothing yet: scrape /metrics while the server is under load, or explain a loadgen report"
               for server in ("vllm", "llama.cpp", "sglang")},
              "none", "changing knobs on an idle server")


QUEUE_NOTICED_MS = 50       # a typical queue time (a scrape's mean, a report's median) a user notices
TTFT_NOTICED_MS = 1000      # a first token a user waits for: without a queue figure, too long to call healthy


def diagnose(sig: Signals) -> tuple[Remedy, list[str]]:
    """The first row of the decision table whose signs the numbers show, and the evidence."""
    if sig.scrape and not sig.running and not sig.waiting and sig.ttft_ms is None and sig.tpot_ms is None:
        return IDLE, ["running 0, waiting 0 at the moment of the scrape"]
    # Requests wait when the queue is a share of TTFT a user notices. A report's peak of requests
    # waiting says nothing by itself: a closed loop's first round all waits at once, then never.
    # A scrape's gauge is the moment it was taken, so it counts.
    queued = sig.queue_ms is not None and sig.queue_ms >= QUEUE_NOTICED_MS \
        and sig.queue_ms > 0.25 * (sig.ttft_ms or math.inf)
    waiting = queued or bool(sig.waited_at_cap) or (
        (sig.waiting or 0) > 0 if sig.queue_ms is None or sig.scrape else False)
    # The simulator counts steps that were at the cap with requests waiting; a server's gauges only
    # give peaks, which must do.
    at_cap = sig.waited_at_cap if sig.waited_at_cap is not None else (
        sig.max_seqs is not None and sig.running is not None and sig.running >= 0.95 * sig.max_seqs)
    kv_room = sig.kv_peak is None or sig.kv_peak < 0.8
    if (sig.preemptions or 0) > 0 or ((sig.kv_peak or 0) >= 0.95 and waiting):
        return REMEDIES["kv-bound"], [f"preemptions {sig.preemptions:,.0f}" if sig.preemptions is not None else
                                      "preemptions not reported",
                                      f"KV peak {sig.kv_peak:.0%}" if sig.kv_peak is not None else "KV peak unknown"]
    past_knee = sig.knee is not None and sig.mean_batch is not None and sig.mean_batch > sig.knee
    flat = sig.throughput_trend is not None and sig.throughput_trend < 1.1
    tpot_words = f"TPOT {sig.tpot_ms:.1f} ms against {sig.batch1_tpot_ms:.1f} ms at batch 1" if slowed(sig) else ""
    if tpot_words and (past_knee or flat):
        return REMEDIES["compute-bound"], [past_the_knee(sig) if past_knee else "throughput flat from the previous point",
                                           tpot_words]
    # A step's tokens (decodes and prompt chunks) past the knee, with TPOT past twice the batch-1
    # step: compute-bound, though its batch of sequences is under the knee. Unless a queue or a
    # budget binds (a bigger budget halves a long prompt's TTFT though its steps are past the knee),
    # which the rows below weigh first; more seats only add to steps past the knee (helper-78:
    # "--max-num-seqs up" at 905 tokens a step, 4.6 times the knee).
    prompts_slow = bool(past_the_knee(sig)) and slowed(sig, PROMPTS_SLOW)
    if waiting and at_cap and kv_room and prompts_slow:
        return REMEDIES["compute-bound"], [past_the_knee(sig), tpot_words, f"{number(sig.running, 0)} running of "
                                           f"{number(sig.max_seqs, 0)} allowed: more would add to each step"]
    if waiting and at_cap and kv_room:
        return REMEDIES["sequence-bound"], [f"{number(sig.running, 0)} running of {number(sig.max_seqs, 0)} allowed",
                                            f"{sig.waiting:.0f} waiting" if sig.waiting is not None else "queue time",
                                            f"KV peak {sig.kv_peak:.0%}" if sig.kv_peak is not None else "KV not reported"]
    # The prompt tokens a step must compute: cached ones cost none.
    fresh = sig.prompt_tokens * (1 - (sig.prefix_hit_rate or 0)) if sig.prompt_tokens else 0
    if waiting and kv_room and sig.budget and fresh >= sig.budget / 4:
        cached = f" ({fresh:,.0f} not cached)" if sig.prefix_hit_rate else ""
        return REMEDIES["token-budget-bound"], [f"mean prompt {sig.prompt_tokens:,.0f} tokens{cached} against a "
                                                f"{sig.budget:,}-token step budget", "sequences and KV have room"]
    if sig.queue_ms is not None and sig.ttft_ms and sig.queue_ms > 0.5 * sig.ttft_ms:
        return REMEDIES["queue-bound"], [f"queue {sig.queue_ms:,.0f} ms of TTFT {sig.ttft_ms:,.0f} ms",
                                         "no single budget binds"]
    queued = (sig.waiting or 0) >= max(1.0, 0.1 * (sig.running or 0)) or (sig.queue_ms or 0) >= QUEUE_NOTICED_MS
    if not sig.ttft_ms and queued:
        # No TTFT to weigh the queue against (not in the input, or unreadable): a queue a tenth of
        # the batch, or one a user notices, is a queue.
        queue = f"{sig.waiting:,.0f} waiting" if sig.waiting else f"queue {sig.queue_ms:,.0f} ms"
        return REMEDIES["queue-bound"], [queue, "no TTFT in this input", "no single budget binds"]
    decode = sig.e2e_ms - sig.ttft_ms if sig.e2e_ms is not None and sig.ttft_ms is not None else None
    if sig.queue_ms is None and sig.prefill_ms is None and (sig.ttft_ms or 0) >= TTFT_NOTICED_MS \
            and (decode is None or sig.ttft_ms > decode) and not sig.waiting == 0:
        # A report that cannot split TTFT into queue and prefill (a client's alone, or a server's
        # gauges without a queue time): a TTFT this long that outweighs the whole decode is a
        # queue unless prompts are huge, or the server's gauges saw nothing waiting.
        return REMEDIES["queue-bound"], [f"TTFT {sig.ttft_ms:,.0f} ms"
                                         + (f", longer than the decode after it ({decode:,.0f} ms)" if decode is not None
                                            else ""),
                                         "no queue or prefill figure in this input to split it"
                                         + (" (add the server's /metrics, or its --metrics)" if sig.running is None
                                            else "")
                                         + (f"; mean prompt {sig.prompt_tokens:,.0f} tokens" if sig.prompt_tokens
                                            else "")]
    if sig.failed:
        return REMEDIES["failing"], [failures(sig)]
    if prompts_slow:      # no queue or budget binds: every decode pays for the prompt chunks in its steps
        return REMEDIES["compute-bound"], [past_the_knee(sig), tpot_words]
    # Only what the input says: a scrape of one gauge shows no preemption counter and no queue.
    seen = [*(["no preemptions"] if sig.preemptions is not None else []),
            *(["little queue"] if sig.waiting is not None or sig.queue_ms is not None else [])]
    return REMEDIES["healthy"], [", ".join(seen) if seen else "nothing in this input binds, though it reports no "
                                 "preemptions, queue or latency to judge by"]


def past_the_knee(sig: Signals) -> str:
    """How a step is past the knee, as evidence, or "": its tokens where the report counts them
    (decodes and prompt chunks), else its batch of sequences."""
    if sig.knee is None:
        return ""
    if sig.step_tokens is not None and sig.step_tokens > sig.knee:
        batch = f", {sig.batch_said} {sig.mean_batch:.1f}" if sig.mean_batch is not None else ""
        return f"{sig.step_tokens:,.0f} tokens a step (decodes and prompt chunks{batch}) past the knee at ~{knee_text(sig.knee)}"
    if sig.mean_batch is not None and sig.mean_batch > sig.knee:
        return f"{sig.batch_said} {sig.mean_batch:.1f} past the knee at ~{knee_text(sig.knee)}"
    return ""


# The knob that makes a step's prompt chunks smaller, where prompts (not the batch) push it past the knee.
CHUNK_KNOBS = {"vllm": "`--max-num-batched-tokens` down (smaller prompt chunks in each step; TTFT rises)",
               "sglang": "`--chunked-prefill-size` down (smaller prompt chunks in each step; TTFT rises)",
               "llama.cpp": "`--ubatch-size` down (smaller prompt chunks in each step; TTFT rises)"}


PROMPTS_SLOW = 2.0     # TPOT over the batch-1 step past which prompt chunks, not a healthy mix, slow decodes


def slowed(sig: Signals, by: float = 1.3) -> bool:
    """TPOT well above the batch-1 step: what each sequence (or chunk) added to a step shows."""
    return bool(sig.batch1_tpot_ms and sig.tpot_ms and sig.tpot_ms > by * sig.batch1_tpot_ms)


def failures(sig: Signals) -> str:
    """How many of the input's requests failed, and the first one's reason."""
    share = f"{sig.failed:,.{0 if sig.failed == int(sig.failed) else 1}f} of {sig.requests:,.0f} requests failed"
    return share + (f" (the first: {printable(str(sig.first_failure)[:200])})" if sig.first_failure else "")


def explain(sig: Signals) -> dict:
    remedy, evidence = diagnose(sig)
    # 1. Which phase dominates latency.
    phases = {"queue": sig.queue_ms, "prefill": sig.prefill_ms,
              "decode": sig.e2e_ms - sig.ttft_ms if sig.e2e_ms is not None and sig.ttft_ms is not None else None}
    if sig.queue_ms is None and sig.prefill_ms is None and sig.ttft_ms is not None:
        phases["ttft"] = sig.ttft_ms       # queue and prefill as one: the input does not split them
    known = {k: v for k, v in phases.items() if v is not None}
    phase = max(known, key=known.get) if known else None
    # 3. Capacity arithmetic: how many requests of this shape the cache holds, against the cap.
    arithmetic = []
    length = (sig.prompt_tokens or 0) + (sig.output_tokens or 0)
    if sig.kv_tokens and length:
        fit = sig.kv_tokens / length
        whose = f"each of the {sig.replicas:,} replicas' KV caches holds" if sig.replicas > 1 else "the KV cache holds"
        arithmetic.append(f"{whose} {sig.kv_tokens:,} tokens: {fit:,.1f} requests of {length:,.0f} tokens (prompt {number(sig.prompt_tokens, 0)} + output "
                          f"{number(sig.output_tokens, 0)})")
        if sig.max_seqs:
            arithmetic.append(f"the sequence cap allows {sig.max_seqs:,}{' in each' * (sig.replicas > 1)}, so "
                              + ("memory binds first" if fit < sig.max_seqs else "the cap binds first"))
    if sig.knee is not None:
        arithmetic.append(f"compute catches up with the weight read at ~{knee_text(sig.knee)} tokens per step; "
                          f"the {sig.batch_said} was {number(sig.mean_batch)}"
                          + (f", and a step computed {sig.step_tokens:,.0f} tokens (decodes and prompt chunks)"
                             if sig.step_tokens is not None else ""))
    if sig.running is not None:
        arithmetic.append(f"running up to {sig.running:,.0f}, "
                          + (f"waiting up to {sig.waiting:,.0f}" if sig.waiting is not None else "waiting not reported")
                          + (" (in the busiest replica)" if sig.replicas > 1 else ""))
    if not arithmetic:
        arithmetic.append("not enough in this input to check: add --server-flags, or use a simulate report")
    server = sig.server if sig.server in ("vllm", "llama.cpp", "sglang") else "vllm"
    change_first = remedy.knobs[server]
    if remedy.symptom == "kv-bound" and sig.prefix_caching and server == "vllm":
        # Prefix caching is already on: the rest of the row is what is left.
        change_first = change_first.split("; else ", 1)[-1] + " (prefix caching is already on)"
        evidence = evidence + ["prefix caching on"]
    expected = remedy.effect
    if remedy.symptom == "token-budget-bound" and sig.knee is not None and sig.budget >= 2 * sig.knee:
        # A step of this budget is already compute-bound: a bigger one takes longer in proportion,
        # so it prefills no more tokens a second; it gives prompts more of each step than the decodes.
        evidence = evidence + [f"a step of {sig.budget:,} tokens is already compute-bound (knee "
                               f"~{knee_text(sig.knee)})"]
        expected = ("TTFT falls only as TPOT rises (prompts take more of each step; no more tokens a second); "
                    "ITL spikier; throughput about the same. For both, more compute: " + REMEDIES["queue-bound"].knobs[server])
    prompts_push = remedy.symptom == "compute-bound" and sig.step_tokens is not None and sig.knee is not None \
        and sig.step_tokens > sig.knee and (sig.mean_batch or 0) <= sig.knee
    if prompts_push:
        # The sequences alone are under the knee: the prompt chunks sharing each step push it past,
        # so a lower sequence cap buys little TPOT, and smaller chunks buy it.
        _, _, throughput = change_first.partition("; for throughput, ")
        change_first = f"for TPOT, {CHUNK_KNOBS[server]}; for throughput, {throughput}"
        expected = ("TPOT falls toward the batch-1 step; TTFT rises (prompts take more steps); throughput about the "
                    "same. For both, more compute: " + REMEDIES["queue-bound"].knobs[server])
    if remedy.symptom == "kv-bound" and past_the_knee(sig) and slowed(sig):
        # A bigger cache would run a bigger batch, and past the knee that buys little throughput.
        evidence = evidence + [past_the_knee(sig)]
        expected = ("TTFT falls (no recompute); throughput rises little: each step is past the knee already. For "
                    "throughput, more compute: " + REMEDIES["queue-bound"].knobs[server])
    if remedy.symptom == "compute-bound" and phase == "queue":
        # Requests already wait most of their TTFT: a lower cap would make them wait longer, so
        # what buys throughput comes first.
        tpot, _, throughput = change_first.partition("; for throughput, ")
        change_first = f"for throughput (TTFT is mostly queue), {throughput}; {tpot}"
        expected = "more throughput: the queue drains, so TTFT falls; a lower cap instead: " + remedy.effect
    if server in ("vllm", "sglang") and sig.tensor_parallel >= sig.gpus_per_node \
            and remedy.symptom in ("compute-bound", "kv-bound", "queue-bound", "token-budget-bound"):
        # A group already a node's GPUs grows only across nodes, where its all-reduces are slow: a replica instead.
        flag = "`--tensor-parallel-size`" if server == "vllm" else "`--tp-size`"
        change_first = change_first.replace(f"tensor parallelism ({flag})", f"another replica (tensor parallelism "
                                            f"is {sig.tensor_parallel} already, a node's GPUs)")
        expected = expected.replace(f", or a bigger one with {flag}", "")
    if sig.running is not None and sig.waiting == 0 and (sig.queue_ms or 0) > 0 and not sig.scrape \
            and sig.server in ("vllm", "servesim"):
        arithmetic[-1] += (" (counted after each step's admissions, as vLLM counts it: requests that arrive during "
                           "a step wait for its end)")
    if sig.failed and remedy.symptom != "failing":     # a failure is evidence whatever else binds
        evidence = evidence + [failures(sig)]
    return {
        "source": sig.source, "server": sig.server,
        "phase": phase, "phases_ms": phases, "ttft_ms": sig.ttft_ms,
        "binds": remedy.binds, "symptom": remedy.symptom, "evidence": evidence,
        "capacity": arithmetic,
        "change_first": change_first, "knobs": remedy.knobs, "expected_effect": expected,
        "will_not_help": will_not_help(remedy, server),
    }


def print_explanation(e: dict, w) -> None:
    phases = e["phases_ms"]
    named = {"ttft": "TTFT (queue and prefill, not split in this input)"}
    shown = ", ".join(f"{named.get(k, k)} {v:,.0f} ms" for k, v in phases.items() if v is not None)
    latency = f"{'TTFT' if e['phase'] == 'ttft' else e['phase']} dominates the whole request ({shown})" if e["phase"] else \
        "not in this input"
    if phases["queue"] is not None and e.get("ttft_ms"):
        latency += f"; TTFT is {min(1.0, phases['queue'] / e['ttft_ms']):.0%} queue"
    line = lambda label, text: w(f"{label:<16}{text}\n")
    w(f"explain {e['source']} ({e['server']})\n")
    line("1. latency", latency)
    line("2. binding", f"{e['binds']}  [{e['symptom']}: {'; '.join(e['evidence'])}]")
    for i, text in enumerate(e["capacity"]):
        line("3. capacity" if i == 0 else "", text)
    line("4. change first", e["change_first"])
    line("", f"expected: {e['expected_effect']}")
    line("5. won't help", e["will_not_help"])


# ---------------------------------------------------------------------------------------------
# Reports: one printer for a run, simulated or measured, and one for a sweep table.
# ---------------------------------------------------------------------------------------------

def finite(value):
    """The same report with NaN and infinities as null: JSON has no spelling for them."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


# Whether this command has written its report to stdout. Where a command's exit 1 is its answer
# (it does not fit, no load meets the SLO), --json writes that answer there as an object, as
# sweep and search do for each point; a server that fails loadgen is not an answer.
REPORTED = {"stdout": False}
ANSWERS = ("capacity", "simulate", "plan")


def write_text(text: str, out=None) -> None:
    """A finished report, written at once so an interrupt never leaves half of it."""
    out = out or sys.stdout
    REPORTED["stdout"] |= out is sys.stdout
    text = text if text.endswith("\n") else text + "\n"
    encoding = getattr(out, "encoding", None) or "utf-8"
    try:        # what the terminal's encoding cannot hold is shown as its escape, never a traceback
        text.encode(encoding)
    except UnicodeEncodeError:
        text = text.encode(encoding, "backslashreplace").decode(encoding)
    except LookupError:
        pass
    try:
        write_whole(out, text, encoding)
    except BrokenPipeError:
        raise
    except OSError as e:
        raise CapacityError(f"cannot write the report: {e.strerror or e}") from None


def write_whole(out, text: str, encoding: str) -> None:
    """Every byte of text, even when a signal arrives while a pipe is full. The kernel then hands
    back a part-written count; with PYTHONUNBUFFERED (common in containers) stdout has no buffer
    to retry the rest, and its text layer drops it: a finished sweep cut at 64 KiB."""
    layer = getattr(out, "buffer", None)
    if layer is None:                  # a StringIO, or a stream of text only
        out.write(text)
        out.flush()
        return
    out.flush()
    left = memoryview(text.encode(encoding, "backslashreplace"))
    while left:
        written = layer.write(left)
        if written is None:            # a non-blocking stdout that is full: wait for room
            time.sleep(0.01)
        left = left[written or 0:]
    layer.flush()


def write_json(report, out=None) -> None:
    write_text(json.dumps(finite(report), indent=2, allow_nan=False), out)


# The arguments that name files a command reads: an output must not be one of them.
INPUT_ARGS = {"trace": "--trace", "prompts": "--prompts", "hardware": "--hardware", "model": "--model",
              "rate_profile": "--rate-profile", "replica_schedule": "--replica-schedule", "engine": "--engine",
              "draft_model": "--draft-model", "prefill_hardware": "--prefill-hardware",
              "decode_hardware": "--decode-hardware", "simulate": "--simulate", "run": "the run",
              "reports": "a report", "files": "an input"}


OUTPUT_ARGS = {"timeline": "--timeline", "plot": "--plot", "out": "--out"}


def same_file(a: str, b: str) -> bool:
    """Whether two paths name one file, through links (neither need exist yet)."""
    return os.path.realpath(a) == os.path.realpath(b) or (os.path.exists(a) and os.path.exists(b)
                                                          and os.path.samefile(a, b))


# What each output flag writes, by how such a file starts: an existing file that does not is not
# replaced.
WRITTEN_STARTS = {"--plot": ("an SVG picture", (b"<svg", b"<?xml")), "--timeline": ("a timeline CSV", (b"t,",)),
                  "--out": ("a JSON file", (b"{",))}


def check_writable(path: str, flag: str, args=None) -> None:
    """Before the work: a file we are asked to write must have a directory to go in, and must not
    be a file the command reads (writing it would destroy the input)."""
    if path == "-":
        raise UserError(f"{flag} -: give a file name (stdout carries the report; /dev/stdout if you mean it)")
    if flag == "--plot" and os.path.splitext(path)[1].lower() in (".png", ".jpg", ".jpeg", ".gif", ".pdf", ".webp"):
        raise UserError(f"{flag} {path}: servesim draws SVG, which a {os.path.splitext(path)[1]} name would mislabel; "
                        f"name the file .svg (a browser shows it; rsvg-convert or inkscape turn it into a PNG)")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise UserError(f"{flag} {path}: the directory {directory} does not exist")
    if os.path.isdir(path):
        raise UserError(f"{flag} {path}: is a directory; give a file name")
    if os.path.isfile(path) and not os.access(path, os.W_OK):      # a rename would replace it all the same
        raise UserError(f"{flag} {path}: is read-only; make it writable or give another file")
    # A file is written through a new one beside it, so its directory must take a file (a device
    # or a pipe, such as /dev/stdout, is written in place).
    # Tried, not asked: os.access says yes to root anywhere, and /proc and /sys take no new file.
    # What write_file writes in place (a device, a pipe, a name under /dev or /proc) must be there.
    if written_in_place(path):
        if not os.path.exists(path):        # tried as write_file opens it (/dev/shm takes one; /proc none)
            try:
                with open(path, "ab"):
                    pass
                os.remove(path)
            except OSError as e:
                raise UserError(f"{flag} {path}: no such file, and {directory} takes no new one ({e.strerror or e}); "
                                f"give a file in a directory you can write") from None
    else:
        directory = os.path.dirname(os.path.realpath(path))     # (written beside what a link points to)
        try:
            fd, trial = tempfile.mkstemp(dir=directory, prefix=".servesim-check-")
            os.close(fd)
            os.unlink(trial)
        except OSError as e:
            raise UserError(f"{flag} {path}: cannot write in the directory {directory} ({e.strerror or e}); give a "
                            f"file in a directory you can write") from None
    for name, what in INPUT_ARGS.items():
        given = getattr(args, name, None)
        for value in given if isinstance(given, list) else [given]:
            if not isinstance(value, str):
                continue
            for read in run_files(value) if name == "run" else [value]:
                if os.path.exists(read) and same_file(read, path):
                    raise UserError(f"{flag} {path}: that is {what} this command reads; writing it would destroy "
                                    f"the input, so give {flag} another file")
    if os.path.isfile(path) and flag in WRITTEN_STARTS and not written_in_place(path):
        # Replaced whole: only a file of what the flag writes (an earlier run's), never another
        # (--plot code/main.py replaced the program with a picture).
        try:
            with open(path, "rb") as f:
                head = f.read(64).lstrip(b"\xef\xbb\xbf \t\r\n")
        except OSError:          # (unreadable: what it holds is not known, and it is not ours to replace)
            head = b"?"
        kind, starts = WRITTEN_STARTS[flag]
        if head and not head.startswith(starts):
            raise UserError(f"{flag} {path}: exists and is not {kind}, which {flag} would replace it with; give "
                            f"another name (or remove it first)")
    for name, other in OUTPUT_ARGS.items():
        given = getattr(args, name, None)
        if other != flag and isinstance(given, str) and same_file(given, path):
            raise UserError(f"{flag} {path}: {other} writes there too, and one would overwrite the other; give each "
                            f"its own file")


def written_in_place(path: str) -> bool:
    """Whether write_file appends to the path itself (a device, a pipe, a name under /dev or /proc)
    rather than replacing it through a new file beside it."""
    return path.startswith(("/dev/", "/proc/")) or (os.path.exists(path) and not os.path.isfile(path))


def write_file(path: str, text: str) -> None:
    """Write a whole file or nothing: a full disk or a missing directory is one line, exit 1. The
    text goes to a new file of a random name beside it (created exclusively, so a planted file or
    link of that name cannot redirect it), then replaces the file."""
    data = text.encode("utf-8", "backslashreplace")
    # A device or a pipe, or a name for one (/dev/stdout, /proc/self/fd/1, links to whatever the
    # shell opened): written to, there is nothing to replace (replaced, /dev/stdout became a file),
    # and appended to, so that a file the shell opened for stdout keeps what was printed before.
    if written_in_place(path):
        try:
            with open(path, "ab") as f:
                f.write(data)
            return
        except OSError as e:
            raise CapacityError(f"cannot write {path}: {e.strerror or e}") from None
    target = os.path.realpath(path)   # through a link (latest.csv -> run-7.csv): the link stays a link
    partial = None
    try:
        for _ in range(100):
            candidate = f"{target}.{os.urandom(6).hex()}.partial"
            try:
                fd = os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666)
            except FileExistsError:
                continue
            partial = candidate
            break
        else:
            raise CapacityError(f"cannot write {path}: no free name for its temporary file beside it")
        with open(fd, "wb") as f:
            f.write(data)
        os.replace(partial, target)
    except BaseException as e:        # a full disk, or a signal: no half-written file is left
        if partial:
            with contextlib.suppress(OSError):
                os.remove(partial)
        if isinstance(e, OSError):
            raise CapacityError(f"cannot write {path}: {e.strerror or e}") from None
        raise


def load_verdict(result: dict) -> str:
    """The steady window's verdict in a few words, for a table cell."""
    steady, seeds = result.get("steady_state"), result.get("seeds")
    if not steady or steady.get("sustained") is None:
        return "one burst" if steady and steady.get("one_burst") else "too short"
    if steady["closed_loop"]:
        return "closed loop"
    short = f" ({steady['seeds_too_short']}/{steady['seeds_count']} too short)" if steady.get("seeds_too_short") else ""
    if seeds and 0 < seeds["sustained"] < seeds["count"]:
        return f"sustained in {seeds['sustained']}/{seeds['count']} seeds" + short
    if steady["sustained"]:
        return "sustained"
    if steady.get("overloaded_on") == ["wait"]:          # served enough; its wait grew
        return f"overloaded (wait +{steady['wait_growth_s_per_s']:.2g} s/s)" + short
    return f"overloaded ({steady['served_rate'] / steady['offered_rate']:.0%} served)" + short


def steady_lines(steady: Optional[dict]) -> list[str]:
    """The steady window: whether the server kept up with the load offered, and its figures."""
    if not steady:
        return []
    where = f"{steady['start_s']:,.0f}-{steady['end_s']:,.0f} s, {number(steady['requests'], 0)} request" \
        f"{'s' * (round(steady['requests']) != 1)} sent"
    too_short = ", " + too_short_in(steady["seeds_too_short"]) if steady.get("seeds_too_short") else ""
    unjudged = "; " + too_short_in(steady["seeds_too_short"], steady["seeds_count"]) if too_short else ""
    if steady["sustained"] is None:
        return [f"{'steady':<12}" + ("" if steady.get("one_burst") or "seeds_too_short" in steady else f"{where}: ")
                + steady["note"]]
    if steady["closed_loop"]:
        verdict = (f"{'steady':<12}{where} (a closed loop sends only when a request ends: sustained by construction"
                   f"{unjudged})")
    elif steady["sustained"]:
        seeds = f"in {steady['seeds_sustained']} of {steady['seeds_count']} seeds{too_short}; their mean, " \
            if too_short else ""
        verdict = (f"{'sustained':<12}{seeds}{where}: offered {steady['offered_rate']:,.2f} req/s, served "
                   f"{steady['served_rate']:,.2f} req/s, wait {signed(steady['wait_growth_s_per_s'], 3)} s per s")
    elif 0 < steady.get("seeds_sustained", 0) < steady.get("seeds_count", 0):
        over = steady["seeds_count"] - steady["seeds_sustained"] - steady.get("seeds_too_short", 0)
        verdict = (f"{'mixed':<12}sustained in {steady['seeds_sustained']} of {steady['seeds_count']} seeds, "
                   f"overloaded in {over}{too_short}; their mean, {where}: offered {steady['offered_rate']:,.2f} "
                   f"req/s, served {steady['served_rate']:,.2f} req/s, wait {signed(steady['wait_growth_s_per_s'], 3)} s per s")
    else:
        verdict = (f"{'overloaded':<12}offered {steady['offered_rate']:,.2f} req/s, served {steady['served_rate']:,.2f} "
                   f"req/s, queue grows {steady['queue_growth_rps']:,.2f} req/s (wait {signed(steady['wait_growth_s_per_s'], 3)} "
                   f"s per s) in {where}: the server does not keep up ({overload_reason(steady)}{unjudged}), and its "
                   f"latencies grow with the run's length")
    figures = (f"{'':<12}in it: ttft p50 {number(steady.get('median_ttft_ms'))} "
               f"p95 {number(steady.get('p95_ttft_ms'))} p99 {number(steady.get('p99_ttft_ms'))} ms  "
               f"tpot p50 {number(steady.get('median_tpot_ms'))} p95 {number(steady.get('p95_tpot_ms'))} ms  "
               f"{number(steady.get('output_throughput'))} output tok/s")
    in_step = [f"{'':<12}clients in step: with fixed lengths, requests that end together are sent again together "
               f"and prefilled together, round after round; real clients drift apart and spread the prefills (so does "
               f"a range A-B for --prompt-tokens or --output-tokens)"] if steady.get("clients_in_step") else []
    return [verdict, figures, *in_step]


SPREAD_SHOWN = (("ttft p95", "p95_ttft_ms", " ms"), ("ttfa p95", "p95_ttfa_ms", " ms"), ("tpot p95", "p95_tpot_ms", " ms"),
                ("e2e p95", "p95_e2el_ms", " ms"), ("out tok/s", "output_throughput", ""))


def seed_lines(seeds: Optional[dict]) -> list[str]:
    """How a report of several seeds was made, and how far apart the seeds' figures were."""
    if not seeds:
        return []
    first, last = seeds["seeds"][0], seeds["seeds"][-1]
    short = seeds.get("too_short", 0)
    whose = f" (the steady window's, of the {seeds['count'] - short} with one)" if 0 < short < seeds["count"] else ""
    lines = [f"{'seeds':<12}{seeds['count']} runs, seeds {first}-{last}: every figure above is their mean{whose}; "
             f"sustained in {seeds['sustained']} of {seeds['count']}"
             + (", " + too_short_in(short, bursts=seeds.get("one_burst", 0)) if short else "")]
    return lines + [f"{'':<12}{text}" for text in spread_texts(seeds)] \
        + [f"{'':<12}steady window {text}" for text in spread_texts(seeds, "steady_spread")[:1]]


def spread_texts(seeds: dict, which: str = "spread") -> list[str]:
    """How far apart the seeds' figures were: min-max, and p10-p90 where there are enough seeds."""
    texts, spread = [], seeds.get(which) or {}
    for label, interval in (("min-max", ("min", "max")), ("p10-p90", ("p10", "p90"))):
        cells = [f"{name} {number(spread[key][interval[0]])}-{number(spread[key][interval[1]])}{unit}"
                 for name, key, unit in SPREAD_SHOWN if key in spread and interval[0] in spread[key]]
        if cells:
            texts.append(f"{label}: " + "  ".join(cells))
    return texts


def point_text(point: dict) -> str:
    return "  ".join(f"{flag_of(k)[2:]} {value_label(k, v)}" for k, v in point.items())


def sweep_seed_lines(results: list[dict]) -> list[str]:
    """Under a sweep's table of several seeds a point: what each row's figures are, and each
    point's spread (the table has room for the means alone)."""
    seeded = [r for r in results if r.get("seeds")]
    if not seeded:
        return []
    seeds = seeded[0]["seeds"]["seeds"]
    lines = [f"{'seeds':<12}{len(seeds)} runs a point, seeds {seeds[0]}-{seeds[-1]}: every figure above is their "
             f"mean; each point's spread:"]
    for r in seeded:
        texts = spread_texts(r["seeds"]) or ["no spread"]
        short = r["seeds"].get("too_short", 0)
        lines.append(f"  {point_text(r['config']['sweep_point'])}, sustained in {r['seeds']['sustained']} of "
                     f"{r['seeds']['count']}" + (", " + too_short_in(short, bursts=r["seeds"].get("one_burst", 0))
                                                 if short else ""))
        lines += [f"    {text}" for text in texts]
    return lines


def print_run(result: dict, out=None) -> None:
    out = out or sys.stdout
    cfg = result["config"]
    w = out.write
    w(f"{printable(cfg['title'])}\n")      # (a trace's file name may hold a line break or an escape)
    w(f"{'requests':<12}{count_text(result['completed'])} completed  {count_text(result['failed'])} failed\n")
    examples = result.get("first_error_by_kind", {})
    for kind, n in sorted(result["errors_by_kind"].items()):
        example = examples.get(kind, kind)
        if n > 1 and example != kind:    # one request's figures stand for them all: say whose
            example = f"{kind} (the first: {example[len(kind):].lstrip(': ')})"
        example = printable(example)     # a report's errors are a server's words: no terminal escapes
        w(f"{'':<12}{count_text(n)} x {example if len(example) <= 160 else example[:157] + '...'}\n")
    if result.get("failed_streamed_tokens"):
        w(f"{'':<12}{result['failed_streamed_tokens']:,} tokens streamed before their requests failed (counted apart: "
          f"vllm bench serve counts a failed request's as none)\n")
    if result.get("stopped"):
        w(f"{'':<12}stopped early: {result['stopped']}\n")
    if result.get("hint"):
        w(f"{'':<12}{result['hint']}\n")
    engine = result.get("engine")
    if engine:
        # With replicas, blocks and steps are all of theirs, a batch each one's (the lines below).
        n = len(result.get("replicas") or ())
        each = f" in all, {engine['num_blocks'] / n:,.0f} in each replica" if n > 1 else ""
        w(f"{'kv cache':<12}{engine['num_blocks']:,.0f} blocks x {engine['block_size']} tokens{each}  "
          f"peak {engine['kv_peak']:.1%}  mean {engine['kv_mean']:.1%}\n")
        w(f"{'steps':<12}{engine['steps']:,.0f}{' in all' if n > 1 else ''}  mean batch {engine['mean_batch']:.1f} "
          f"seqs{' a replica' if n > 1 else ''}  "
          f"preemptions {engine['preemptions']:,.0f}  evictions {engine['evictions']:,.0f}  "
          + (f"prefix hits {engine['prefix_hit_rate']:.1%}\n" if "prefill_engine" not in result else
             "prefix hits: the prefill engine's (below)\n"))
        host = result.get("host_tier")
        if host:
            w(f"{'host tier':<12}{host['tokens']:,.0f} tokens: {host['host_hit_rate']:.1%} of prompt tokens found only "
              f"there (so {engine['prefix_hit_rate'] - host['host_hit_rate']:.1%} in HBM); {host['loads']:,.0f} loads"
              + (f" ({host['reloads']:,.0f} of them a preempted request's own KV, back)" if host.get("reloads") else "")
              + f", {host['loaded_gb_per_gpu']:,.1f} GB a GPU, mean wait {number(host['mean_load_wait_ms'])} ms; stores "
              f"{host['stored_gb_per_gpu']:,.1f} GB a GPU, keeping its link {host['store_link_busy']:.1%} busy\n")
        if engine["evictions"]:
            w(f"{'':<12}an eviction is a freed block's cached prefix overwritten when the block is reused (least "
              f"recently used first), so it happens below a full cache; it costs a later prefix hit, not a request\n")
        if engine["row_utilisation"] is not None:
            w(f"{'rows':<12}{engine['row_utilisation']:.1%} of decode rows useful ({engine['wasted_decode_rows']:,.0f} "
              f"padding)  kv reserved {engine['kv_reserved_peak_tokens']:,.0f} tokens, "
              f"{engine['kv_used_of_reserved']:.1%} used\n")
    for index, replica in enumerate(result.get("replicas") or [], 1):
        w(f"{f'replica {index}':<11} {replica['completed']:,.0f} requests done"
          + (f", {replica['failed']:,.0f} failed" if replica["failed"] else "")
          + f"  mean batch {replica['mean_batch']:.1f}  kv peak {replica['kv_peak']:.1%}  "
            f"preemptions {replica['preemptions']:,.0f}  prefix hits {replica['prefix_hit_rate']:.1%}\n")
    if result.get("speculative"):
        sp = result["speculative"]
        w(f"{'speculative':<12}{sp['speculative_tokens']} proposals ({sp['draft']}), acceptance {sp['acceptance_rate']:g}: "
          f"{number(sp['mean_accepted_length'], 2)} tokens per verify step (expected "
          f"{sp['expected_accepted_length']:.2f})\n")
    if result.get("link"):
        prefill, link = result["prefill_engine"], result["link"]
        w(f"{'prefill':<12}{prefill['hardware']}: {prefill['steps']:,.0f} steps  mean batch {prefill['mean_batch']:.1f}  "
          f"kv peak {prefill['kv_peak']:.1%}  preemptions {prefill['preemptions']:,.0f}  "
          f"prefix hits {prefill['prefix_hit_rate']:.1%}\n")
        w(f"{'link':<12}{link['gbs']:g} GB/s: {link['transfers']:,} transfers  mean wait {number(link['mean_wait_ms'])} ms "
          f"(queue + transfer)  busy {link['busy']:.1%}\n")
    rows = [(label, [number(result[f"{stat}_{name}_ms"]) for stat in ("mean", "median", "p90", "p95", "p99")])
            for name, label in (("ttft", "ttft ms"), ("ttfa", "ttfa ms"), ("tpot", "tpot ms"), ("itl", "itl ms"),
                                ("queue", "queue ms"), ("e2el", "e2e ms")) if f"mean_{name}_ms" in result]
    # Ten characters a column, wider where a value needs it: columns never run together.
    widths = [max(10, *(len(cells[i]) + 2 for _, cells in rows)) for i in range(5)]
    w(f"{'':<12}" + "".join(h.rjust(width) for h, width in zip(("mean", "p50", "p90", "p95", "p99"), widths)) + "\n")
    for label, cells in rows:
        w(f"{label:<12}" + "".join(c.rjust(width) for c, width in zip(cells, widths)) + "\n")
    w(f"{'throughput':<12}{result['output_throughput']:,.1f} output tok/s  "
      f"{result['total_token_throughput']:,.1f} total tok/s  {result['request_throughput']:.2f} req/s  "
      f"over {result['duration']:,.2f} s\n")
    for line in steady_lines(result.get("steady_state")) + seed_lines(result.get("seeds")):
        w(line + "\n")
    machines = cfg.get("machines")
    if machines:
        ms = lambda v: "not known" if v is None else f"{v:,.1f} ms"
        w(f"{'machines':<12}shards {', '.join(map(str, machines['present']))} of {machines['shards']}, "
          f"{machines['requests']:,} requests of one schedule; started within {ms(machines['start_spread_ms'])} of "
          f"each other by their own clocks, the last {ms(machines['latest_start_lag_ms'])} after --start-at\n")
        apart = machines["clocks_apart_at_most_s"]
        w(f"{'':<12}" + (f"clocks at most {apart:.2f} s apart (each bounded by the server's Date headers)"
                         if apart is not None else "how far apart the clocks were is not known")
          + (f"; sends left late by p99 {machines['worst_dispatch_lag_p99_ms']:,.1f} ms at worst (shard "
             f"{machines['worst_dispatch_shard']})" if machines["worst_dispatch_lag_p99_ms"] is not None else "")
          + (f"; offered {machines['offered_rate']:,.2f} req/s together, completed "
             f"{result['request_throughput']:,.2f} req/s"
             if machines["offered_rate"] is not None else "") + "\n")
    plan = result.get("replica_schedule")
    if plan:
        paid = f", ${plan['usd']:,.2f}" if plan["usd"] is not None else ""
        fleet = f", ${plan['fixed_fleet_usd']:,.2f}" if plan["fixed_fleet_usd"] is not None else ""
        w(f"{'schedule':<12}{replica_range(plan['least'], plan['most'])} (mean {plan['mean_replicas']:.2f}), each added "
          f"serving {plan['scale_up_delay_s']:,.0f} s after it is asked for: {plan['gpu_hours']:,.2f} GPU-hours{paid}; "
          f"{plan['most']:,} replica{'s' * (plan['most'] != 1)} all the time: {plan['fixed_fleet_gpu_hours']:,.2f} GPU-hours{fleet}"
          + (f"; its rows from {plan['rows_after_the_run_from_s']:,.0f} s come after the run ended, and change nothing"
             if plan.get("rows_after_the_run_from_s") is not None else "") + "\n")
    if result.get("warmup_requests"):
        w(f"{'warm-up':<12}" + counted("the first {:,} request{s} sent {are} left out of every figure",
                                       result["warmup_requests"])
          + (f"; {result['warmup_failed']:,} of them failed (the first: {result['warmup_first_error']})"
             if result.get("warmup_failed") else "") + "\n")
    for row in result.get("turns") or []:
        failed = f" ({number(row['failed'], 0)} failed)" if row.get("failed") else ""
        w(f"{'turn ' + str(row['turn']):<12}{row['requests']:,} requests{failed}  prompt {number(row['mean_prompt_tokens'], 0)} "
          f"tokens  ttft p50 {number(row['median_ttft_ms'])} p95 {number(row['p95_ttft_ms'])} ms  "
          f"prefix hits {row['prefix_hit_rate']:.1%}\n")
    if result.get("goodput_slos_ms"):
        bounds = ", ".join(f"{metric} <= {bound:g} ms" for metric, bound in result["goodput_slos_ms"].items())
        total = result["completed"] + result["failed"]
        w(f"{'goodput':<12}{result['request_goodput']:.2f} req/s: {result['good_requests']:,} of {total:,} requests "
          f"({result['goodput_share']:.1%}) within {bounds}\n")
    cost = result.get("cost")
    if cost:
        gpus = cfg.get("gpus")
        paid = f" ({gpus} GPUs)" if gpus and gpus > 1 else ""
        if plan:
            paid = f" (a mean of {plan['mean_replicas'] * plan['gpus_per_replica']:,.2f} GPUs over the schedule)"
        w(f"{'cost':<12}${cost['usd_per_hour']:,.2f} an hour" + paid
          + f", ${cost['usd_per_month']:,.0f} a month of {cost['hours_per_month']:g} hours"
          + (f"  ${cost['usd_per_million_output_tokens']:,.3f} per million output tokens"
             if cost["usd_per_million_output_tokens"] is not None else "") + "\n")
    if "server" in result:
        print_server(result, w)


LATE_WAKE_MS = 20      # a client this late to wake makes a 20 ms ITL read twice as long: said beside it

SERVER_LABELS = {   # key: (label, digits)
    "decode_calls": ("decode calls", 0), "mean_batch_per_decode": ("mean batch per decode", 2),
    "tokens_per_decode": ("tokens per decode", 2), "peak_requests_processing": ("peak processing", 0),
    "peak_requests_deferred": ("peak deferred", 0), "prompt_tokens": ("prompt tokens", 0),
    "prompt_tokens_cached": ("cached prompt tokens", 0), "generated_tokens": ("generated tokens", 0),
    "peak_running": ("peak running", 0), "peak_waiting": ("peak waiting", 0), "peak_queued": ("peak queued", 0),
    "peak_kv_cache_usage": ("peak kv cache usage", 3), "peak_token_usage": ("peak token usage", 3),
    "preemptions": ("preemptions", 0), "prefix_hit_rate": ("prefix hit rate", 3),
    "cached_tokens": ("cached tokens", 0),
}


def print_server(result: dict, w) -> None:
    server = result["server"]
    if server.get("problem"):
        w(f"{'server':<12}{server['problem']}\n")
    elif server.get("server"):
        w(f"{'server':<12}{server['server']} /metrics over the run ({server['scrapes']} scrapes; gauges are peaks seen)\n")
        items = [f"{label} {server[key]:,.{digits}f}" for key, (label, digits) in SERVER_LABELS.items()
                 if server.get(key) is not None]
        for i in range(0, len(items), 3):
            w(f"{'':<12}" + "  ".join(items[i:i + 3]) + "\n")
        if server.get("client_minus_server_tokens") is not None:
            w(f"{'':<12}client counted {server['client_output_tokens']:,} output tokens, the server "
              f"{server['generated_tokens']:,.0f} (difference {server['client_minus_server_tokens']:,.0f})\n")
    shown = server.get("problem") or server.get("server")
    for note in ("final_scrape", "skipped_scrapes", "ignored_samples", "impossible", "went_down"):
        if server.get(note):
            w(f"{'' if shown else 'server':<12}{server[note]}\n")
            shown = True
    timings = result.get("timings")
    if timings:
        w(f"{'timings':<12}llama.cpp per request (p50/p95): prompt {number(timings['prompt_ms']['p50'])}/"
          f"{number(timings['prompt_ms']['p95'])} ms  ttft minus prompt {number(timings['ttft_minus_prompt_ms']['p50'])}/"
          f"{number(timings['ttft_minus_prompt_ms']['p95'])} ms  per token {number(timings['predicted_per_token_ms']['p50'])}/"
          f"{number(timings['predicted_per_token_ms']['p95'])} ms  cache_n {timings['cache_n']:,}\n")
    client = result["client"]
    late = client["worst_wake_delay_ms"] > LATE_WAKE_MS      # (a bound on how late any timestamp is)
    w(f"{'client':<12}{client['cpu_seconds']:.2f} s cpu  worst wake delay {client['worst_wake_delay_ms']:.1f} ms"
      + (" (event times may be late by as much: a busy client machine, or a /metrics page that takes that long to "
         "read; raise --scrape-interval)" if late else "") + "  "
      f"finish reasons {client['finish_reasons']}"
      + (f"  {client['requests_without_usage']} answers without usage (output tokens counted from events, "
         f"prompt tokens from the words sent)"
         if client['requests_without_usage'] else "") + "\n")
    thinking = client.get("reasoning")
    if thinking:
        w(f"{'reasoning':<12}" + (thinking["note"] or f"{thinking['requests_with_reasoning']:,} answers streamed "
                                  f"reasoning events first; ttfa is their first content event") + "\n")
    if result["config"].get("start_at") is not None:
        clock = client.get("server_clock") or {}
        w(f"{'':<12}started {result['config']['start_lag_ms']:,.1f} ms after --start-at; "
          + (f"the server's clock is {signed(clock['offset_s'], 2)} s from this one (between {signed(clock['low_s'], 2)} and "
             f"{signed(clock['high_s'], 2)} s, by {clock['answers']:,} Date headers)" if clock.get("offset_s") is not None
             else f"clock against the server's not known: {clock.get('why', 'no answers')}") + "\n")
    if client.get("dispatch_lag_ms"):
        lag = client["dispatch_lag_ms"]
        w(f"{'':<12}offered {number(client['offered_rate'], 2)} req/s, completed {client['achieved_rate']:.2f} req/s; "
          f"sends left their schedule late by p50 {lag['p50']:.1f} ms, p99 {lag['p99']:.1f} ms, max {lag['max']:.1f} ms\n")
    sizing = result.get("prompt_sizing")
    if sizing:
        w(f"{'prompts':<12}" + (sizing["note"] if sizing.get("note") else
                                f"{sizing['tokens_per_word']:.2f} tokens a word and {sizing['template_tokens']:.0f} "
                                f"template tokens, measured by two probe requests")
          + (f"; asked {number(sizing['asked_prompt_tokens_mean'])}, received {number(sizing['received_prompt_tokens_mean'])} "
             f"prompt tokens a request" if sizing.get("asked_prompt_tokens_mean") is not None else "") + "\n")
    for name, seen in (client.get("server_figures_left_out") or {}).items():
        w(f"{'':<12}left out of {seen['answers']:,} answer{'s' if seen['answers'] != 1 else ''}: {seen['first']}\n")
    if client.get("short_of_max_tokens"):
        w(f"{'':<12}--ignore-eos was not honoured: {client['short_of_max_tokens']:,} answers were shorter than "
          f"--max-tokens {result['config']['max_tokens']:,} (fewest {client['fewest_output_tokens']:,} tokens; "
          f"finish reasons {client['short_finish_reasons']}); the server may not accept ignore_eos, or hit its "
          f"context limit\n")
    w(f"{'definitions':<12}ttft: send to the first content or reasoning event; tpot: (last - first such "
      f"event) / (usage completion_tokens - 1); itl: every gap between such events; ttfa (with reasoning): send to "
      f"the first content event; nearest-rank percentiles\n")


def print_compared(title: str, rows: dict, w) -> None:
    w(f"{printable(title)}\n")
    w(f"{'':<18}{'measured':>12}{'servesim':>12}{'error':>9}\n")
    for name, row in rows.items():
        error = "" if row["error"] is None else f"{row['error']:+.1%}"
        w(f"{name:<18}{number(row['measured']):>12}{number(row['servesim']):>12}{error:>9}\n")


def print_validation(report: dict, w) -> None:
    """One row per published run, grouped by source, then the medians the defaults are chosen by."""
    summary, runs = report["summary"], report["runs"]
    scale = report["kernel_scale"]
    sources = len(summary["by_source"])
    w(f"validate: {len(runs)} published run{'s' * (len(runs) != 1)} from {sources} source{'s' * (sources != 1)}, "
      f"{report['cost_model']} cost model"
      + ("; each source scored with the kernel scale fitted on the other sources alone\n" if scale else "\n"))
    figures = (("tok/s", "output_throughput"), ("TPOT ms", "mean_tpot_ms"), ("TTFT ms", "mean_ttft_ms"),
               ("E2E ms", "mean_e2el_ms"))
    width = max([3, *(len(r["name"]) + 2 * bool(r.get("inferred")) for r in runs)]) + 4

    def cell(row: Optional[dict]) -> tuple[str, str]:
        return (number(row["measured"]), f"{row['error']:+.0%}") if row and row["error"] is not None else ("-", "-")
    # Each column as wide as its widest cell (a 7-hour TTFT and its -100% ran into the next column).
    cells_of = {key: [cell(r["rows"].get(key)) for r in runs] for _, key in figures}
    widths = {key: (max([10, *(len(a) + 1 for a, _ in cells_of[key])]), max([8, *(len(b) + 1 for _, b in cells_of[key])]))
              for _, key in figures}
    w(f"{'run':<{width}}{'engine':<8}{'GPUs':>4}{'scale':>7}"
      + "".join(f"{label:>{widths[key][0]}}{'error':>{widths[key][1]}}" for label, key in figures) + "  kept up\n")
    for source in summary["by_source"]:
        w(f"{source}\n")
        for r in (r for r in runs if r["source"] == source):
            cells = ""
            for _, key in figures:
                shown, error = cell(r["rows"].get(key))
                cells += f"{shown:>{widths[key][0]}}{error:>{widths[key][1]}}"
            measured, predicted = r["sustained"]["measured"], r["sustained"]["servesim"]
            verdict = "-" if measured is None or predicted is None else ("yes" if measured else "no") + (
                "" if measured == predicted else f", predicted {'yes' if predicted else 'no'}")
            near = " (busy)" if r["near_capacity"] else ""
            name = r["name"] + (" *" if r.get("inferred") else "")
            w(f"  {name:<{width - 2}}{r['engine']:<8}{r['gpus']:>4}"
              f"{'-' if r['kernel_scale'] is None else format(r['kernel_scale'], '.2f'):>7}{cells}  {verdict}{near}\n")

    def medians_text(medians):
        return ", ".join(f"{label} {m['median']:.1%} ({m['runs']} run{'s' * (m['runs'] != 1)})" for label, m in medians.items()
                         if m["median"] is not None)

    w(f"median |error|: {medians_text(summary['medians'])}\n")
    strict = summary.get("without_inferred")
    if strict:
        one = strict["runs"] == 1
        w(f"  * {strict['runs']} run{'s' * (not one)} replay{'s' * one} with {', '.join(strict['settings'])} read from "
          f"{'its' if one else 'their'} own figures; "
          f"without them: {medians_text(strict['medians']) or 'no figure left'}\n")
    w(f"within {VALIDATION_BOUND:.0%} on throughput and TPOT: {summary['within_bound']} of {summary['runs']} runs\n")
    wrong = summary["verdicts_wrong"]
    kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(summary["verdicts"].items()))
    closed = summary["verdicts_by_construction"]
    w(f"sustained verdicts: {summary['verdicts_judged']} judged" + (f" ({kinds} as measured)" if kinds else "")
      + f", {len(wrong)} wrong" + (f" ({', '.join(wrong)})" if wrong else "")
      + (f"; {closed} closed-loop run{'s' * (closed != 1)} not counted (sustained by construction)" if closed else "")
      + "\n")
    for source, m in summary["by_source"].items():
        w(f"  {source}: median |error| " + ", ".join(
            f"{label} {value:.1%}" for label, value in m.items() if value is not None) + "\n")
    if scale:
        w("kernel scale fitted without each source: "
          + ", ".join(f"{source} {'unfitted' if fit is None else format(fit, '.2f')}" for source, fit in scale["left_out"].items())
          + "; on all sources " + ("unfitted" if scale["all_sources"] is None else f"{scale['all_sources']:.2f}")
          + f" (KERNEL_SCALE holds {scale['in_use']:.2f})\n")
    for reason in report["skipped"]:
        w(f"skipped: {reason}\n")


def replica_range(least: int, most: int) -> str:
    return f"{least:,} to {most:,} replicas" if least != most else f"{most:,} replica{'s' * (most != 1)}"


def print_plan(report: dict, title: str, w) -> None:
    totals, slo = report["totals"], report["slo"]
    w(f"{printable(title)}\n")
    unit = report["rate_unit"]     # (a rate starts conversations, with --turns)
    w((f"one replica sustains up to {report['one_replica_sustains']:.4g} {unit} within the slo" if
       report["one_replica_sustains"] else "one replica meets the slo at no load tried, so each window's replicas are "
       "tried from --min-replicas up") + "; a replica added serves "
      f"{report['scale_up_delay_s']:,.0f} s after it is asked for"
      + (" (asked for that much ahead)" if report["ahead"] else "")
      + f"; fewer are asked for once the need has been lower for {report['scale_down_after_s']:,.0f} s\n")
    metrics = list(slo)
    clock = plan_clock(report)
    label = lambda r: clock(r["start_s"]) + "-" + clock(r["end_s"], end=True)
    width = max(13, *(len(label(r)) + 2 for r in report["windows"]))
    header = f"{'window':<{width}}{'load ' + unit.replace('conversations', 'conv'):>11}{'needs':>7}{'asks':>6}" + "".join(f"{m.replace('_', ' '):>11}" for m in metrics) \
        + f"{'tpot p50':>10}{'$':>9}  note"
    w("each window: the fewest replicas whose probe at its load meets the slo, " +
      ("that probe's figures, and what the whole-period simulation found\n" if report.get("verified") else
       "and that probe's figures\n"))
    w(header + "\n")
    for r in report["windows"]:
        needs = f"{r['needs']}" if r["needs"] <= r["asked"] or r["needs"] <= max(1, r["asked"]) else f">{r['asked']}"
        figures = "".join(f"{number((r['figures'] or {}).get(m)):>11}" for m in metrics)
        notes = []
        if r["raised"]:
            notes.append(f"+{r['raised']} after simulating the period")
        if r["short_s"] and r["serves_after_s"] is None:
            notes.append("not all the replicas it needs ever serve: one is let go before its start-up ends "
                         "(--scale-down-after is shorter than the start-up)")
        elif r["short_s"]:
            notes.append(f"the added replicas serve after {r['serves_after_s']:,.0f} s"
                         + (", after the window" if r["serves_after_s"] >= r["end_s"] - r["start_s"] else ""))
        notes += [f"asks {step['replicas']} from {clock(step['time_s'])}" for step in report["schedule"]
                  if r["start_s"] < step["time_s"] < r["end_s"]]   # a scale-down that waited, a scale-up --ahead
        simulated = r.get("simulated")
        if simulated and simulated["misses"]:
            notes.append("simulated: " + simulated["misses"][0])
        usd = "-" if r["usd"] is None else f"{r['usd']:,.2f}"
        w(f"{label(r):<{width}}{r['load']:>11.3g}{needs:>7}{r['asked']:>6}"
          f"{figures}{number(r['median_tpot_ms']):>10}{usd:>9}  {'; '.join(notes)}".rstrip() + "\n")
    month = totals.get("hours_per_month", HOURS_PER_MONTH)
    money = lambda usd, monthly=None: "" if usd is None else f", ${usd:,.2f}" + (
        f" (${monthly:,.0f} a month of {month:g} hours like it)" if monthly is not None and hours < month else "")
    hours = report["windows"][-1]["end_s"] / 3600
    digits = 1 if totals["peak_fleet_gpu_hours"] >= 1 else 3         # an hour's tenth, or a short period's
    w(f"schedule    {replica_range(totals['least'], totals['most'])} (mean {totals['mean_replicas']:.2f}) over "
      f"{f'{hours:,.0f}' if hours >= 100 else f'{hours:.3g}'} h: {totals['gpu_hours']:,.{digits}f} GPU-hours"
      f"{money(totals['usd'], totals.get('usd_per_month'))}\n")
    w(f"peak fleet  {totals['peak_fleet']} replica{'s' * (totals['peak_fleet'] != 1)} all the time: {totals['peak_fleet_gpu_hours']:,.{digits}f} GPU-hours"
      f"{money(totals['peak_fleet_usd'], totals.get('peak_fleet_usd_per_month'))}")
    saved = totals["peak_fleet_usd"] - totals["usd"] if totals["usd"] is not None and totals["peak_fleet_usd"] else 0
    if report.get("interrupted"):
        w("; no saving is claimed: the plan was interrupted")
    elif plan_misses(report):       # a saving against a fleet that misses too would be no saving
        w("; no saving is claimed: the schedule misses the slo")
    elif round(saved, 2) > 0:     # (a schedule that never scales saves nothing, not $-0.00)
        starting = len((report.get("verified") or {}).get("of_them_scaling_up") or [])
        w(f"; the schedule saves ${saved:,.2f} ({saved / totals['peak_fleet_usd']:.0%})"
          + (f", but misses the slo in {starting} window{'s' * (starting != 1)} while added replicas start "
             f"(--ahead asks for them in time)" if starting else ""))
    w("\n")
    if report["never_met"]:
        verified = report.get("verified")
        met = [t for t in report["never_met"] if verified and t not in verified["windows_missing_the_slo"]]
        w(f"never met   {len(report['never_met'])} window{'s' * (len(report['never_met']) != 1)} "
          f"need{'s' * (len(report['never_met']) == 1)} more than --max-replicas, from "
          f"{clock(report['never_met'][0])}"
          + (f"; the whole-period simulation met the slo in {len(met)} of them: it plays their load once, where "
             f"a window's probe asks for it sustained" if met else "") + "\n")
    verified = report.get("verified")
    if verified:
        missed = verified["windows_missing_the_slo"]
        scaling = len(verified["of_them_scaling_up"])
        count = len(report['windows'])
        w(f"simulated   the whole period with this schedule: {verified['requests']:,} request"
          f"{'s' * (verified['requests'] != 1)}, {verified['failed']:,} failed; {len(missed)} of {count} "
          f"window{'s miss' if count != 1 else ' misses'} the slo"
          + (f" ({', '.join(clock(t) for t in missed[:6])}{', ...' if len(missed) > 6 else ''})" if missed else "")
          + (f", {scaling} of them while added replicas start" if missed else "")
          + "\n")
    if report.get("vllm_would_refuse"):      # as search's answer says it: a plan a team cannot deploy as given
        w(f"beware: {report['vllm_would_refuse']}\n")
    if report.get("interrupted"):
        w(f"interrupted after {report['interrupted']}\n")


SWEEP_COLUMNS = (
    ("out tok/s", lambda r: number(r["output_throughput"])),
    ("ttft p50", lambda r: number(r["median_ttft_ms"])),
    ("tpot p50", lambda r: number(r["median_tpot_ms"])),
    ("tpot p95", lambda r: number(r["p95_tpot_ms"])),
    ("queue p95", lambda r: number(r["p95_queue_ms"])),
    ("batch", lambda r: number(r["engine"]["mean_batch"])),
    ("kv peak", lambda r: f"{r['engine']['kv_peak']:.1%}"),
    ("preempt", lambda r: f"{r['engine']['preemptions']:,.0f}"),
    ("failed", lambda r: f"{r['failed']:,.0f}"),
)


class SweepTable:
    """A sweep's table, printed a row at a time as points finish, so an interrupted sweep keeps
    the rows it printed. Widths come from the header and the axis labels, known up front."""

    def __init__(self, title: str, axes: list[str], points: list[dict], columns=SWEEP_COLUMNS, out=None):
        self.title, self.columns, self.out = title, columns, out or sys.stdout
        self.headers = [flag_of(axis)[2:] for axis in axes]
        self.labels = [[value_label(axis, point[axis]) for axis in axes] for point in points]
        self.width = ([max(len(h), 6, *(len(row[i]) for row in self.labels)) for i, h in enumerate(self.headers)]
                      + [max(len(name), 7) for name, _ in columns])
        self.printed = 0

    def line(self, cells: list[str]) -> None:
        self.out.write("  ".join(c.rjust(w) for c, w in zip(cells, self.width)) + "\n")
        self.out.flush()

    def header(self) -> None:
        self.out.write(f"{printable(self.title)}\n")
        self.line(self.headers + [name for name, _ in self.columns])

    def row(self, result: dict, index: Optional[int] = None) -> None:
        """The next point's row, or point `index`'s (one that finished out of turn)."""
        labels = self.labels[self.printed if index is None else index]
        self.printed += 1
        if result.get("does_not_fit"):
            self.out.write("  ".join(c.rjust(w) for c, w in zip(labels, self.width))
                           + f"  does not fit: {result['does_not_fit']}\n")
            self.out.flush()
        else:
            self.line(labels + [cell(result) for _, cell in self.columns])


def flatten(result: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in result.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        elif not isinstance(value, list):
            flat[f"{prefix}{key}"] = value
        elif value and all(isinstance(item, str) for item in value):    # reasons, names: one cell
            flat[f"{prefix}{key}"] = "; ".join(value)
    return flat


def print_csv(results: list[dict], out=None) -> None:
    rows = [flatten(r) for r in results]
    columns = list(dict.fromkeys(k for row in rows for k in row))
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    write_text(text.getvalue(), out)


def timeline_csv(rows: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=TIMELINE_COLUMNS, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


SWEEP_TABLES = {
    "compare": (("out tok/s", lambda r: number(r["output_throughput"])),
                ("ttft p50", lambda r: number(r["median_ttft_ms"])),
                ("ttft p95", lambda r: number(r["p95_ttft_ms"])),
                ("tpot p50", lambda r: number(r["median_tpot_ms"])),
                ("row util", lambda r: "-" if r["engine"]["row_utilisation"] is None else f"{r['engine']['row_utilisation']:.1%}"),
                ("wasted rows", lambda r: f"{r['engine']['wasted_decode_rows']:,.0f}"),
                ("kv reserved", lambda r: f"{r['engine']['kv_reserved_peak_tokens']:,.0f}"),
                ("kv used", lambda r: f"{r['engine']['kv_used_of_reserved']:.1%}"),
                ("failed", lambda r: f"{r['failed']:,.0f}")),
    "kv_link_gbs": (("out tok/s", lambda r: number(r["output_throughput"])),
                    ("ttft p50", lambda r: number(r["median_ttft_ms"])),
                    ("ttft p95", lambda r: number(r["p95_ttft_ms"])),
                    ("tpot p50", lambda r: number(r["median_tpot_ms"])),
                    ("itl p99", lambda r: number(r["p99_itl_ms"])),
                    ("link wait", lambda r: number((r.get("link") or {}).get("mean_wait_ms"))),
                    ("failed", lambda r: f"{r['failed']:,.0f}")),
}


def colocation_verdict(results: list[dict]) -> str:
    """The link bandwidth below which the colocated engine wins on TTFT p95."""
    colocated = results[0]["p95_ttft_ms"]
    points = sorted((r["config"]["kv_link_gbs"], r["p95_ttft_ms"]) for r in results[1:])
    wins = [gbs for gbs, p95 in points if p95 < colocated]
    losses = [gbs for gbs, p95 in points if p95 >= colocated]
    if not wins:
        return f"the colocated engine wins on ttft p95 at every link bandwidth tried (up to {points[-1][0]:g} GB/s)"
    if not losses:
        return f"disaggregation wins on ttft p95 at every link bandwidth tried (down to {points[0][0]:g} GB/s)"
    below = [gbs for gbs in losses if gbs < min(wins)]
    return (f"the colocated engine wins on ttft p95 below {min(wins):g} GB/s (colocated {number(colocated)} ms"
            + (f"; disaggregated loses at {max(below):g} GB/s" if below else "") + ")")


def settings_line(spec: RunSpec, axes: list[str]) -> str:
    """Every setting the flags changed from its default, as the flags, except the swept axes and
    what the title already says (hardware, model, workload)."""
    shown = {"hardware", "model", "trace", "requests", "prompt_tokens", "output_tokens", "prefix_tokens",
             "num_prefixes", "simulator", "disaggregate", "prefill_hardware", "decode_hardware", *axes,
             "turns", "think_time", "burstiness", "ramp_up", "rate_profile",     # the arrivals in the title say these
             "rate", "concurrency", *(("batching", "kv_layout") if "compare" in axes else ())}
    default, words = RunSpec(), []
    for f in SETTINGS.values():
        value = getattr(spec, f.name)
        if f.name not in shown and value != getattr(default, f.name):
            words.append(" ".join(flag_words(f, value)))
    if spec.disaggregate and "kv_link_gbs" not in axes:
        words.append(f"--disaggregate ({spec.kv_link_gbs:g} GB/s)")
    return "  ".join(words)


def sweep_columns(spec: RunSpec, axes: list[str]) -> tuple:
    if "compare" in axes:
        return SWEEP_TABLES["compare"]
    if "kv_link_gbs" in axes:
        return SWEEP_TABLES["kv_link_gbs"]
    columns = SWEEP_COLUMNS
    gpu_counts = {"tensor_parallel_size", "data_parallel_size", "pipeline_parallel_size"}    # the axes that change the GPUs
    if gpu_counts & set(axes):      # so rows compare per GPU
        columns = (("gpus", lambda r: f"{r['config']['gpus']}"), columns[0],
                   ("per gpu", lambda r: number(r["output_throughput"] / r["config"]["gpus"]))) + columns[1:]
    if {"hardware", "quantization", *gpu_counts} & set(axes):
        columns = columns[:-1] + (("$/M tok", lambda r: number((r["cost"] or {}).get("usd_per_million_output_tokens"), 3)),
                                  columns[-1])
    if spec.goodput:
        columns = columns[:-1] + (("goodput", lambda r: f"{r['request_goodput']:.2f}/s"), columns[-1])
    if "burstiness" in axes:       # bursts show in the tail of TTFT
        columns = columns[:2] + (("ttft p99", lambda r: number(r["p99_ttft_ms"])),) + columns[2:]
    if spec.prefix_caching or "prefix_caching" in axes:
        # (disaggregated, the prompts are looked up where they are computed: on the prefill engine)
        columns = columns[:-1] + (("prefix hit", lambda r: f"{(r.get('prefill_engine') or r['engine'])['prefix_hit_rate']:.1%}"),
                                  columns[-1])
    if spec.rate or spec.trace or spec.ramp_up or "rate" in axes:      # open loop: did the server keep up?
        columns += (("load", load_verdict),)
    return columns


def load_text(load: float) -> str:
    return f"{load:,.0f}" if load >= 1000 else f"{load:.4g}"


def probe_columns(probing: Probing, trace: bool) -> list[tuple[str, Callable[[dict], str]]]:
    load = ("rate" if probing.by == "rate" else "clients", lambda r: load_text(r["load"]))
    columns = [load] + ([("time scale", lambda r: f"{r['config'].get('time_scale', 1.0):.4g}")]
                        if trace and probing.by == "rate" else [])
    columns += [(name.replace("_", " "), lambda r, name=name, key=key, bound=bound:
                 number(probing.figures(r)[key]) if not r.get("stopped") else
                 f">{bound:,g}" if r["stopped"]["slo"] == name else "-")
                for name, key, bound in probing.slo.bounds]
    if probing.sustained:         # a probe lengthened, or rechecked, sent more than the usual
        columns.append(("requests", lambda r: f"{r.get('probe_requests', 0):,}"))
        columns.append(("served", lambda r: "-" if (r.get("steady_state") or {}).get("sustained") is None else
                        f"{r['steady_state']['served_rate'] / r['steady_state']['offered_rate']:.0%}"))
    if probing.seeds > 1:
        columns.append(("seeds ok", lambda r: f"{r['seeds_passed']}/{r['seeds_run']}"))
    columns += [("out tok/s", lambda r: number(r["output_throughput"])),
                ("$/hour", lambda r: number((r["cost"] or {}).get("usd_per_hour"), 2)),
                ("$/month", lambda r: number((r["cost"] or {}).get("usd_per_month"), 0)),
                ("$/M tok", lambda r: number((r["cost"] or {}).get("usd_per_million_output_tokens"), 3)),
                ("verdict", lambda r: "meets" if not r["misses"] else "misses: " + "; ".join(r["misses"]))]
    return columns


def search_table(axes: list[str], found: list[dict], columns, probes: bool, key: Optional[str] = None,
                 highest: bool = False) -> list[str]:
    """One row per deployment (its best probe, else its last), or per probe (of the search under
    `key`: the burst one for a trace). The last column (a verdict) is left-aligned after the
    others, so a long reason does not widen the table. `highest`: a table of highest loads, where
    a deployment with none says so rather than show its last miss as one."""
    cells = [[flag_of(a)[2:] for a in axes] + [name for name, _ in columns]]
    for item in found:
        labels = [value_label(a, item["settings"][a]) for a in axes]
        if item.get("does_not_fit"):
            cells.append(labels + ["-"] * (len(columns) - 1) + ["does not fit: " + item["does_not_fit"]])
            continue
        searched = item[key] if key else item
        if not probes and not searched["probes"]:      # interrupted before a probe ended
            cells.append(labels + ["-"] * (len(columns) - 1) + ["interrupted before a probe ended"])
            continue
        if highest and not searched["best"]:
            cells.append(labels + ["-"] * (len(columns) - 1) + [
                "interrupted before an answer" if searched.get("interrupted") else
                f"misses the slo at every load tried, down to {min(p['load'] for p in searched['probes']):.4g}"])
            continue
        for result in (searched["probes"] if probes else [searched["best"] or searched["probes"][-1]]):
            cells.append(labels + [cell(result) for _, cell in columns])
    aligned = table([[""] + row[:-1] for row in cells])      # an empty first column: every cell right-aligned
    return [f"{line[2:]}  {row[-1]}" for line, row in zip(aligned, cells)]


def probing_text(spec: RunSpec, probing: Probing) -> str:
    """How each probe was run and judged, said once under the search's title."""
    seeds = (f"; {probing.seeds} seeds ({spec.seed}-{spec.seed + probing.seeds - 1}) each, of which "
             + ("all" if probing.needed == probing.seeds else f"{probing.needed}")
             + " must pass (seeds stop once the verdict is certain)") if probing.seeds > 1 else ""
    if not probing.sustained:
        return f"each probe: the workload once, passing if all its requests meet the slo{seeds}"
    longer, recheck = probing.rechecking(), ""
    if longer and probing.target is not None:
        probing = longer
    elif longer:
        step = 1 - 1 / recheck_step(probing.tolerance)
        recheck = (f"; the highest rate that passes is rechecked with probes {probing.recheck}x as long "
                   f"({longer.requests(spec):,} requests or more), {100 * step:.2g}% lower at a time, twice, then "
                   f"more, until one holds" + stops_early_text(spec, longer))
    return (f"each probe: {probing.requests(spec):,} requests or more (--requests is not used), at least "
            f"{probing.steady_requests:,} of them in a steady window after the first {spec.steady_skip:.0%}"
            + (", the trace repeated end to end as often as that takes" if spec.trace else "")
            + f"; passing if the window's requests meet the slo and the server keeps up (served >= "
            f"{spec.min_served:.0%} of offered less its edges' uncertainty, never below "
            f"{max(0.0, 2 * spec.min_served - 1):.0%}, wait growing <= "
            f"{spec.max_queue_growth:g} s per s and over the window by less than a request's time in service){seeds}{recheck}")


def stops_early_text(spec: RunSpec, longer: Probing) -> str:
    """Whether the recheck's probes stop once they miss for certain, said after its walk: not where
    what is sent next waits on what ends (conversations), and, with means alone to judge, only
    at a failed request."""
    sessions = spec.turns > 1 or (spec.trace and any(p >= 0 for p in spec.trace.parents))
    if not longer.stop_on() or sessions:
        return ""
    percentiles = any(not name.endswith("_mean") and not name.startswith("itl_") for name, _, _ in longer.slo.bounds)
    return ", each stopping once its miss is certain" if percentiles else ", each stopping once a request fails"


def answer_text(item: dict, unit: str, by: str, probing: Probing, what: str) -> list[str]:
    """A deployment's highest passing load, in words, with the command that reruns it."""
    low, high = item["highest_load"], item["lowest_missing_load"]
    if item.get("interrupted"):
        probes = len(item["probes"])
        return [f"{what}: interrupted before an answer" + (
            f"; its {probes} probes that ended are in the table" if probes > 1 else
            "; its one probe that ended is in the table" if probes else ", before a probe ended")]
    if low is None:
        return [f"{what}: the slo is missed even at {high:.4g} {unit if high != 1 else unit.rstrip('s')}"
                + (", where every request ran alone: no load meets it; it needs a faster deployment or shorter "
                   "requests" if item.get("alone") else f"; {item['floor']}" if item.get("floor") else "")]
    if high is None:
        limit = f" (more clients would make a probe over {MAX_PROBE_GROWTH} times its usual length)" \
            if by == "concurrency" else ""
        return [f"{what}: the slo holds up to the highest {by} tried, {low:,.6g} {unit}{limit}"]
    best = item["best"]
    need = probing.needed
    window = (best.get("seeds") or {}).get("steady_spread" if probing.sustained else "spread") or {}
    ranges = [f"{name.replace('_', ' ')} {number(window[key]['min'])}-{number(window[key]['max'])}"
              for name, key, _ in probing.slo.bounds if key in window]
    seeds = (f"; {best['seeds_passed']} of {best['seeds_run']} seeds run meet {probing.slo.text()}"
             + (f" ({', '.join(ranges)}{' in their steady windows' if probing.sustained else ''})" if ranges else "")
             + (" and keep up" if probing.sustained else "")
             + (f" ({need} of {probing.seeds} needed)" if best["seeds_run"] < probing.seeds else "")
             if probing.seeds > 1 else "")
    missed = next((p for p in item["probes"] if p["load"] == high and p.get("rerun_missed_seed")), None)
    return [f"{what}: {low:.4g} {unit} (missed at {high:.4g}){seeds}", f"  rerun it: {item['best']['rerun']}",
            *([f"  the miss at {high:.4g}, seed {missed['missed_seed']} alone: {missed['rerun_missed_seed']}"]
              if missed else [])]


def lengths_words(spec: RunSpec) -> str:
    """A synthetic workload's lengths, as a sweep's or search's title names them."""
    return f"prompt {spec.prompt_tokens}  output {spec.output_tokens}" + (
        f"  prefix {spec.prefix_tokens} x {spec.num_prefixes}" if spec.prefix_tokens else "")


def search_text(spec: RunSpec, trace: Optional[str], axes: list[str], found: list[dict], probing: Probing,
                tried: Optional[str] = None) -> list[str]:
    slo, by, target = probing.slo, probing.by, probing.target
    workload = f"trace {trace}" if trace else lengths_words(spec)
    unit = spec.rate_unit() if by == "rate" else "clients"
    load = (f"at {target:g} {unit}" if target is not None else
            f"highest {by} within {100 * probing.tolerance:.3g}%" if by == "rate" else "highest concurrency")
    where = "" if "hardware" in axes else f" on {spec.hardware.name}"
    settings = settings_line(spec, axes)
    lines = [f"search {spec.model.name}{where}  {workload}  {load}  slo {slo.text()}" + (f"  {settings}" if settings else ""),
             probing_text(spec, probing)]
    columns = probe_columns(probing, bool(spec.trace))
    if target is not None:
        columns = [("gpus", lambda r: f"{r['config']['gpus']}")] + columns[1:]
        lines += search_table(axes, found, columns, probes=False)
        best = [item for item in found if item["best"]]
        if best:
            cost = best[0]["best"]["cost"] or {}
            named = deployment_words(best[0], axes)
            price = (f": ${cost['usd_per_hour']:,.2f} an hour (${cost['usd_per_month']:,.0f} a month), "
                     f"${number(cost.get('usd_per_million_output_tokens'), 3)} per million output tokens"
                     if cost else " (no price: give --price-per-hour)")
            among = f" among the {tried} deployments tried before the stop" if tried else \
                f" of the {len(found)} deployments tried" if len(found) > 1 else ""
            gpus = (best[0]["best"].get("config") or {}).get("gpus")
            counted = f" ({gpus} GPUs)" if isinstance(gpus, int) and gpus > 1 else ""
            unpriced = [item for item in best[1:] if not (item["best"]["cost"] or {}).get("usd_per_hour")]
            if cost and unpriced:       # (cheapest_first puts those with no price last: none is known cheaper)
                first = deployment_words(unpriced[0], axes)
                among += (f" with a price ({len(unpriced)} more meet{'s' * (len(unpriced) == 1)} it with none, "
                          f"{first}{' and more' if len(unpriced) > 1 else ''}: give its price_per_hour)")
            lines.append(f"cheapest that meets the slo at {target:g} {unit}{among}: " + (named or "the one tried") + counted
                         + price)
            hour = cost.get("usd_per_hour")
            tied = [item for item in best[1:] if hour and (item["best"]["cost"] or {}).get("usd_per_hour") == hour]
            lines.append(f"rerun it: {best[0]['best']['rerun']}")
            rooms = [item["slo_room"] for item in [best[0], *tied[:1]]]      # (search_report's, as it ranked them)
            pct = lambda share: f"{share:.0%}" if share >= 0.005 else "under 1%"     # (a queue of 10 ms of 20 s)
            others = "; ".join(deployment_words(item, axes) for item in tied[:3]) + (" and more" if len(tied) > 3 else "")
            if tied and round(rooms[0], 2) == round(rooms[1], 2):
                lines.append(f"as cheap, with as much room under the slo (its tightest bound at {pct(rooms[0])} of it): "
                             f"{others}")
            elif tied:       # (ranked by room under the slo: cheapest_first)
                lines.append(f"as cheap: {others}; this one has the most room under the slo (its tightest bound at "
                             f"{pct(rooms[0])} of it, the next {pct(rooms[1])})")
            lines += refusal_lines(best[:1], axes)
        else:
            lines.append(f"no deployment tried meets the slo at {target:g} {unit}")
        return lines
    sustained = "sustained " if probing.sustained else ""
    if len(found) > 1:
        summary = [(f"highest {sustained}{by}", lambda r: load_text(r["load"]))] + \
            columns[1 + bool(spec.trace and by == "rate"):-1]
        lines += search_table(axes, found, summary, probes=False, highest=True)
        lines.append("")
    lines += search_table(axes, found, columns, probes=True)
    bursts = [item for item in found if item.get("burst")]
    if bursts:
        burst = replace(probing, sustained=False)
        sent = len(spec.trace.rows) * spec.trace_repeats
        first = bool(spec.requests) and sent > spec.requests
        once = f"the first {spec.requests:,} requests (--requests)" if first else \
            f"the trace x {spec.trace_repeats} (--trace-repeats)" if spec.trace_repeats > 1 else "the trace"
        lines += ["", f"{once} played once, as recorded (a burst):"]
        lines += search_table(axes, bursts, probe_columns(burst, True), probes=True, key="burst")
    for item in found:
        if item.get("does_not_fit"):
            continue
        named = deployment_words(item, axes)
        prefix = f"{named}: " if named else ""
        lines += answer_text(item, unit, by, probing, f"{prefix}highest {sustained}{by} meeting the slo")
        if item.get("burst"):
            lines += answer_text(item["burst"], unit, by, replace(probing, sustained=False),
                                 f"{prefix}highest {by} at which {once}, played once, meet{'s' * (not first)} the "
                                 f"slo (it absorbs this burst)")
    return lines + refusal_lines([item for item in found if item.get("best")], axes)


def deployment_words(item: dict, axes: list[str]) -> str:
    """A searched deployment by its settings on the search's axes, as its flags name them."""
    return "  ".join(f"{flag_of(a)[2:]} {value_label(a, item['settings'][a])}" for a in axes)


def refusal_lines(found: list[dict], axes: list[str]) -> list[str]:
    """What vLLM would refuse to start of the answers (a cache shorter than the model's length,
    say), as simulate says it on stderr: an answer a team cannot deploy as given."""
    lines = []
    for item in found:
        refused = ((item.get("best") or {}).get("config") or {}).get("vllm_would_refuse")
        if refused:
            named = deployment_words(item, axes)
            lines.append(f"beware{f' ({named})' if named else ''}: {refused}")
    return lines


def table(cells: list[list[str]]) -> list[str]:
    """Rows of cells as aligned lines: the first column to the left, the others to the right."""
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    return ["  ".join([row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]).rstrip()
            for row in cells]


def print_capacity(plan: CapacityPlan, cost: Roofline, out=None, label: Optional[str] = None,
                   rules: str = "vllm", refused: str = "", budget: int = 8192) -> None:
    """label: the engine the flags named, if any (engine_label); rules: the engine whose rules apply;
    refused: why vLLM would not start it (vllm_refusal), if it would not; budget: the tokens a step
    (vLLM's worst case for a sliding-window layer holds them)."""
    out = out or sys.stdout
    h, m, tp, pp = plan.hardware, plan.model, plan.tensor_parallel_size, plan.pipeline_parallel_size
    w = lambda field, value, note="": out.write(f"{field:<17}{value:<19} {note}".rstrip() + "\n")
    weights = m.weight_bytes
    group = f" x {tp} (tensor parallel: each line is one GPU's)" if tp > 1 else ""
    if pp > 1:
        group = (f" x {tp * pp} ({pp} pipeline stages of {m.layers} layers" + (f", tensor parallel {tp}" if tp > 1 else "")
                 + ": each line is one GPU's)")
    # Each engine's own name for its memory share; llama.cpp takes none (its cache is --ctx-size).
    share = "kv_cache_free_gpu_mem_fraction" if plan.of_free else "mem-fraction-static" if plan.static_share \
        else "gpu-memory-utilization"
    share = "" if rules == "llamacpp" else f"  {share} {plan.gpu_memory_utilization:.2f}"
    named = f", engine {label}" if label else ""
    out.write(f"{'capacity':<17}{m.name} on {h.name}{group}{named}{share}\n")
    params = (plan.group_model or m).params
    count = f"{params / 1e9:.2f} B params" if params >= 1e9 else f"{params / 1e6:.1f} M params"
    if pp > 1:        # (pipeline_shard: the stage that also holds a vocabulary-sized matrix)
        count += f", the fullest stage's {m.params * tp / 1e9:.3g} B" + (f" / {tp} GPUs" if tp > 1 else "")
    elif tp > 1:
        count += f" / {tp} GPUs"
    if m.experts:
        # (over data-parallel ranks, each GPU holds its share of the experts and all of the rest)
        spread = f" x {m.expert_share:.3g} (its share of them over {plan.replicas} ranks)" if m.expert_share < 1 else ""
        count += (f" ({m.compute_params * tp / 1e9:.2f} B active: {m.experts_per_token} of {m.experts} experts); "
                  f"experts x {m.expert_dtype_bytes or m.weight_dtype_bytes:.3g} bytes{spread}, the rest x "
                  f"{m.weight_dtype_bytes:g}")
    else:
        count += f" x {m.weight_dtype_bytes:g} bytes"
    w("weights", f"{weights / 1e9:.2f} GB" if weights >= 1e9 else f"{weights / 1e6:.1f} MB", count)
    layers = f"{m.layers - m.sliding_layers} full-attention layers" if m.sliding_layers else f"{m.layers} layers"
    w("kv per token", f"{m.kv_bytes_per_token / KIB:.1f} KiB",
      f"2 x {layers} x {m.kv_heads} kv heads x {m.head_dim} head dim x {m.kv_dtype_bytes} bytes")
    if rules == "llamacpp":
        w("memory", f"{h.memory_gib:g} GiB", "the device's: llama.cpp takes no share of it, and sizes its cache by "
                                             "--ctx-size")
    else:
        w("memory budget", f"{plan.budget_bytes / GIB:.2f} GiB",
          f"{h.memory_gib:g} GiB less {1 - plan.gpu_memory_utilization:.2f} of what the weights and activations leave"
          if plan.of_free else f"{h.memory_gib:g} GiB x {plan.gpu_memory_utilization:.2f}")
    d = plan.draft
    if d:
        w("draft model", f"{d.weight_bytes / 1e9:.2f} GB", f"{d.name}'s weights, and {d.kv_bytes_per_token / KIB:.1f} KiB of "
          f"its KV a token in every block beside the model's" + (" (each GPU's share)" if tp > 1 else ""))
    note = {"budget": f"budget - weights{' - the draft' if d else ''}" + (
                " (the share holds the weights and the cache alone, as SGLang's mem_fraction_static: its reserve "
                "is outside)" if plan.static_share else f" - {h.reserve_gib:g} GiB reserve"),
            "--kv-tokens": "fixed by --kv-tokens (TensorRT-LLM's max_tokens)" if plan.of_free
            else "fixed by --kv-tokens (llama.cpp --ctx-size)",
            "--num-gpu-blocks": "fixed by --num-gpu-blocks" if plan.of_free
            else "fixed by --num-gpu-blocks (as a vLLM log reports it)",
            "context": "llama.cpp's default --ctx-size 0: the model's training context"}[plan.source]
    w("kv cache", f"{plan.kv_cache_bytes / GIB:.2f} GiB", note)
    w("blocks", f"{plan.num_blocks:,} x {plan.block_size} tokens", f"= {plan.kv_tokens:,} tokens"
      + (" (a block spans the group)" if tp > 1 else ""))
    w("max concurrency", f"{plan.max_concurrency:,.2f}x", f"at {plan.max_model_len:,} tokens per request")
    step = cost.step_seconds(1, 0, 1, 1) * 1000
    out.write(f"{'decode step':<17}{step:.2f} ms at batch 1; compute catches up with the weight read "
              f"at ~{knee_text(cost.critical_batch())} tokens per step\n")
    if isinstance(cost, Pipeline):
        hops = cost.handoff_seconds(1) * 1e6
        out.write(f"{'pipeline':<17}each GPU holds its stage's {m.layers} layers' weights and KV; a token's step passes "
                  f"{pp} stages and {pp - 1} hand-off{'s' * (pp > 2)} ({hops:,.1f} us for one token), full once "
                  f"{pp} micro-batches are in flight\n")
        cost = cost.stage
    parallel = cost.inner if isinstance(cost, ExpertParallel) else cost
    if isinstance(parallel, Parallel):
        share = parallel.communication_seconds(1) * 1000 * pp       # every stage's group all-reduces its layers
        hop_us = parallel.network[1] * 1e6 if parallel.network else h.interconnect_latency_us
        how = {"one-shot": f"the engine's own one-shot kernel, {ONE_SHOT_US:g} us",
               "two-shot": f"the engine's own two-shot kernel, {TWO_SHOT_US:g} us",
               "ring": f"NCCL's ring, {ALLREDUCE_BASE_US:g} us + {2 * (tp - 1)} steps x {hop_us:g} us "
                       f"each"}[parallel.kernel(parallel.activation_bytes)]
        link = f"the network between nodes, {parallel.network[0] / 1e9:g} GB/s a GPU (the group is larger than " \
               f"a node)" if parallel.network else \
               f"{h.interconnect_gbs:g} GB/s ({h.link_efficiency:.0%} achieved)"
        out.write(f"{'all-reduce':<17}{share:.2f} ms of it ({share / step:.0%}): 2 per layer x {m.layers * pp} layers over "
                  f"{link}, {how}\n")
    if isinstance(cost, ExpertParallel):
        share = cost.communication_seconds(1) * 1000
        held = round(m.expert_share * m.experts)
        out.write((f"{'expert parallel':<17}{held} of {m.experts} experts on each GPU" if plan.expert_parallel else
                   f"{'expert layers':<17}each of the {m.experts} experts split over the {plan.replicas * tp} GPUs of "
                   f"the {plan.replicas} ranks "
                   f"(vLLM shards them so across data-parallel ranks without --enable-expert-parallel)")
                  + f"; gathering every rank's tokens and scattering back costs {share:.2f} ms of the step "
                    f"({share / step:.0%}) at batch 1 on each\n")
    if plan.replicas > 1:
        out.write(f"{'replicas':<17}{plan.replicas} engines of {tp} GPU{'s' * (tp > 1)} each, each with its own "
                  f"{plan.kv_tokens:,}-token cache: {plan.replicas * plan.kv_tokens:,} KV tokens and "
                  f"{plan.replicas * plan.max_concurrency:.2f}x concurrency in all\n")
    if rules == "llamacpp" and plan.source in ("budget", "context"):
        out.write(f"{'llama.cpp':<17}sizes its cache by --ctx-size, not by a memory share" +
                  (" (0, its default, is the model's training context, planned above)" if plan.source == "context"
                   else "") + ": pass the server's --ctx-size as --kv-tokens to plan what it holds\n")
    if refused:                        # every reason vLLM's startup checks give (vllm_refusal)
        out.write(f"{'vllm would stop':<17}{refused}\n")
    elif plan.max_concurrency < 1:     # (another engine's requests that long fail, one by one)
        out.write(f"{'too long':<17}one request of {plan.max_model_len:,} tokens does not fit the "
                  f"{plan.kv_tokens:,}-token KV cache, so requests that long fail: pass --max-model-len "
                  f"{plan.kv_tokens} or less\n")
    elif rules == "vllm":              # vLLM's startup line
        tokens, concurrency = vllm_startup_figures(plan, budget)
        out.write(f"{'vllm would log':<17}GPU KV cache size: {tokens:,} tokens, Maximum concurrency for "
                  f"{plan.max_model_len:,} tokens per request: {concurrency:.2f}x\n")
    if m.sliding_layers:
        out.write(f"{'sliding window':<17}{m.sliding_layers} layers attend to the last {m.sliding_window} tokens; in "
                  f"vLLM their blocks come from the same pool, a few a request, which servesim's blocks above and "
                  f"its simulation leave out: their concurrency is an upper bound\n")


def vllm_startup_figures(plan: CapacityPlan, budget: int) -> tuple[int, float]:
    """The two figures of vLLM's startup line. With sliding-window layers (gpt-oss), vLLM puts the
    full-attention and the sliding layers in groups of as many layers each, whose blocks come from
    one pool (vllm/v1/core/kv_cache_utils.py): the line's tokens are the pool's blocks divided among
    the groups, and a request's worst case holds a full group's blocks for its whole length and a
    sliding group's for its window and one step's tokens."""
    m, size = plan.model, plan.block_size
    full, sliding = m.layers - m.sliding_layers, m.sliding_layers
    if not sliding:
        return plan.kv_tokens, plan.max_concurrency
    per_group = min(full, sliding)
    full_groups, sliding_groups = math.ceil(full / per_group), math.ceil(sliding / per_group)
    blocks = plan.num_blocks * full // per_group        # (plan's blocks each hold all `full` layers)
    needs = full_groups * math.ceil(plan.max_model_len / size) + sliding_groups * (
        math.ceil(min(m.sliding_window - 1 + budget, plan.max_model_len) / size) + 1)
    return blocks // (full_groups + sliding_groups) * size, blocks / needs


def capacity_json(plan: CapacityPlan, cost: Roofline, engine: Optional[str] = None) -> dict:
    h, m = plan.hardware, plan.model
    return {     # the model as given; every byte and block below is one GPU's
        "hardware": preset_fields(h), "model": preset_fields(plan.group_model or m),
        "gpu_memory_utilization": plan.gpu_memory_utilization,
        "gpu_memory_utilization_of": "what the weights and activations leave" if plan.of_free else "device",
        "engine": engine,
        "weight_bytes": m.weight_bytes, "kv_bytes_per_token": m.kv_bytes_per_token,
        "budget_bytes": plan.budget_bytes, "kv_cache_bytes": plan.kv_cache_bytes,
        "num_blocks": plan.num_blocks, "block_size": plan.block_size, "kv_tokens": plan.kv_tokens,
        "kv_source": plan.source, "max_model_len": plan.max_model_len,
        "max_concurrency": plan.max_concurrency,
        "decode_step_ms": cost.step_seconds(1, 0, 1, 1) * 1000,
        "critical_batch_tokens": cost.critical_batch(),
        "tensor_parallel_size": plan.tensor_parallel_size,     # every figure above is one GPU's
        "pipeline_parallel_size": plan.pipeline_parallel_size,
        "data_parallel_size": plan.replicas, "enable_expert_parallel": plan.expert_parallel,
        "all_reduce_ms": (cost.inner if isinstance(cost, ExpertParallel) else cost).communication_seconds(1) * 1000
        if isinstance(cost.inner if isinstance(cost, ExpertParallel) else cost, Parallel) else 0.0,
        "expert_parallel_ms": cost.communication_seconds(1) * 1000 if isinstance(cost, ExpertParallel) else 0.0,
        "draft_model": {"name": plan.draft.name, "weight_bytes": plan.draft.weight_bytes,
                        "kv_bytes_per_token": plan.draft.kv_bytes_per_token} if plan.draft else None,
    }


# ---------------------------------------------------------------------------------------------
# Pictures: SVG written with the standard library, one file per figure. Every plotted point
# carries its numbers (data-x, data-y) and every series its name, so a script (or a test) reads
# the figure back as data.
# ---------------------------------------------------------------------------------------------

# Okabe and Ito's eight, told apart by most colour-blind readers, then eight more for sweeps of
# many values (past sixteen, colours repeat).
PALETTE = ("#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#000000", "#999999",
           "#8c564b", "#9467bd", "#bcbd22", "#17becf", "#7f0000", "#1f3b73", "#ff69b4", "#556b2f")


@dataclass
class Panel:
    """One chart: lines or points in data coordinates, with a log axis where values span decades."""
    title: str
    x_label: str
    y_label: str
    series: list = field(default_factory=list)     # (name, [(x, y[, label])], style, color): style is "line",
                                                   # "dashed", "dotted", "points" or "hollow" (open points)
    marks: list = field(default_factory=list)      # (x, y, label): a ringed point with its label
    levels: list = field(default_factory=list)     # (y, label): a horizontal line across the chart
    whiskers: list = field(default_factory=list)   # (x, low, high, color): a spread across seeds
    log_y: Optional[bool] = None                   # None: log when the values span more than 30x

    def add(self, name: str, points: list, style: str = "line", color: Optional[int] = None) -> None:
        """A series; `color` (an index into PALETTE) pairs series of one group, e.g. p50 and p95."""
        points = [point for point in points if point[0] is not None and point[1] is not None]
        if points:
            self.series.append((name, points, style, len(self.series) if color is None else color))


# What XML 1.0 cannot hold at all, escaped or not: control characters, lone surrogates, U+FFFE/F.
NOT_XML = re.compile(r"[^\x09\x0a\x0d\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def escape(text) -> str:
    return xml_escape(NOT_XML.sub("?", str(text)), {'"': "&quot;"})


def nice_ticks(low: float, high: float, log: bool) -> list[float]:
    if log:
        return [10.0 ** e for e in range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)]
    span = high - low or abs(high) or 1.0
    raw = span / 5
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    first = math.floor(low / step) * step
    return [first + i * step for i in range(int(math.ceil((high - first) / step)) + 1)]


def tick_text(value: float) -> str:
    if value and (abs(value) >= 1e7 or abs(value) < 1e-2):
        return f"{value:.0e}".replace("e+0", "e").replace("e-0", "e-")
    return f"{value:,.0f}" if value == int(value) else f"{value:,.6g}"     # (1,000,000, never 1e+06)


def wrapped(text: str, width: int) -> list[str]:
    """A title in lines of at most `width` characters where its words allow, broken at the last
    wide gap (a title's parts are two spaces apart) of a line that overflows, else at a space."""
    lines, line = [], []
    for word in re.findall(r"\s*\S+", text):         # each word with the gap before it
        if line and len("".join(line)) + len(word) > width:
            cut = max((i for i, w in enumerate(line) if i and w.startswith("  ")), default=len(line))
            lines.append("".join(line[:cut]).strip())
            line = line[cut:]
        line.append(word)
    return lines + ["".join(line).strip()] if line else lines or [text]


def svg_figure(title: str, panels: list[Panel], columns: int = 2, width: int = 520, height: int = 340) -> str:
    """The panels in a grid, `columns` across, under one title."""
    columns = max(1, min(columns, len(panels)))
    rows = math.ceil(len(panels) / columns)
    total_w = width * columns
    lines = wrapped(title, int((total_w - 20) / (0.55 * 15)))     # (a sans-serif letter: about 0.55 em wide)
    head = 34 + 18 * (len(lines) - 1)
    total_h = height * rows + head
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{total_w}" height="{total_h}" '
           f'viewBox="0 0 {total_w} {total_h}" font-family="sans-serif" font-size="12">',
           f'<rect width="{total_w}" height="{total_h}" fill="white"/>',
           # (kept as written: a title's parts are two spaces apart, which SVG would fold into one)
           *(f'<text x="{total_w / 2:.1f}" y="{22 + 18 * i}" text-anchor="middle" font-size="15" xml:space="preserve">'
             f'{escape(line)}</text>' for i, line in enumerate(lines))]
    # One legend width for a column of panels, so their plots (and a shared time axis) line up.
    legend = max(legend_width(panel, width, height) for panel in panels)
    for i, panel in enumerate(panels):
        out += svg_panel(panel, (i % columns) * width, head + (i // columns) * height, width, height, legend)
    out.append("</svg>")
    return "\n".join(out) + "\n"


LEGEND_ROW = 15       # px a legend entry takes


def legend_rows(height: float) -> int:
    """The legend entries one column holds beside a plot of a panel this tall."""
    return max(1, int((height - 48 - 28 - 10) // LEGEND_ROW) + 1)


LEGEND_SHARE = 0.45      # of a panel's width, at most: past it names are cut to fit (each series keeps its whole name)


def legend_columns(panel: Panel, height: float) -> int:
    """The legend, right of the plot: as many columns as its entries need."""
    return math.ceil(len(panel.series) / legend_rows(height)) or 1


def legend_column(panel: Panel, width: float, height: float) -> float:
    """One column of the legend: as wide as its longest name, or as the legend's share allows."""
    return min(max((len(name) for name, *_ in panel.series), default=0) * 7 + 36,
               LEGEND_SHARE * width / legend_columns(panel, height))


def legend_width(panel: Panel, width: float, height: float) -> float:
    return legend_columns(panel, height) * legend_column(panel, width, height)


def svg_panel(panel: Panel, left: float, top: float, width: float, height: float,
              legend: Optional[float] = None) -> list[str]:
    legend = legend_width(panel, width, height) if legend is None else legend
    column, rows = legend_column(panel, width, height), legend_rows(height)
    fits = max(1, int((column - 30) // 7))        # characters of a name its column shows
    x0, y0, x1, y1 = left + 72, top + 28, left + width - 12 - legend, top + height - 48     # the plot area
    xs = [p[0] for _, points, _, _ in panel.series for p in points] + [x for x, _, _ in panel.marks]
    ys = ([p[1] for _, points, _, _ in panel.series for p in points] + [y for _, y, _ in panel.marks]
          + [y for y, _ in panel.levels] + [y for _, low, high, _ in panel.whiskers for y in (low, high)])
    out = [f'<g class="panel" data-title="{escape(panel.title)}">',
           f'<text x="{(x0 + x1) / 2:.1f}" y="{top + 18:.1f}" text-anchor="middle" font-size="13">{escape(panel.title)}</text>']
    if not xs or not ys:
        out += [f'<text x="{(x0 + x1) / 2:.1f}" y="{(y0 + y1) / 2:.1f}" text-anchor="middle">no data</text>', "</g>"]
        return out
    positive = [y for y in ys if y > 0]
    log = panel.log_y if panel.log_y is not None else bool(positive) and min(positive) > 0 and \
        max(positive) / min(positive) > 30 and len(positive) == len(ys)
    x_lo, x_hi = min(0.0, min(xs)), max(xs) or 1.0
    if log:
        y_lo, y_hi = 10 ** math.floor(math.log10(min(positive))), 10 ** math.ceil(math.log10(max(positive)))
    else:
        y_lo, y_hi = min(0.0, min(ys)), max(ys) or 1.0
    x_ticks, y_ticks = nice_ticks(x_lo, x_hi, False), nice_ticks(y_lo, y_hi, log)
    x_lo, x_hi = min(x_lo, x_ticks[0]), max(x_hi, x_ticks[-1])
    y_lo, y_hi = min(y_lo, y_ticks[0]), max(y_hi, y_ticks[-1])
    fy = (lambda v: math.log10(v)) if log else (lambda v: v)
    px = lambda v: x0 + (v - x_lo) / ((x_hi - x_lo) or 1) * (x1 - x0)
    py = lambda v: y1 - (fy(v) - fy(y_lo)) / ((fy(y_hi) - fy(y_lo)) or 1) * (y1 - y0)
    out.append(f'<rect x="{x0}" y="{y0}" width="{x1 - x0}" height="{y1 - y0}" fill="none" stroke="#444"/>')
    for t in x_ticks:
        out.append(f'<line x1="{px(t):.1f}" y1="{y1}" x2="{px(t):.1f}" y2="{y1 + 4}" stroke="#444"/>'
                   f'<text x="{px(t):.1f}" y="{y1 + 17}" text-anchor="middle">{tick_text(t)}</text>')
    for t in y_ticks:
        out.append(f'<line x1="{x0}" y1="{py(t):.1f}" x2="{x1}" y2="{py(t):.1f}" stroke="#ddd"/>'
                   f'<text x="{x0 - 6}" y="{py(t) + 4:.1f}" text-anchor="end">{tick_text(t)}</text>')
    out.append(f'<text x="{(x0 + x1) / 2:.1f}" y="{y1 + 36}" text-anchor="middle">{escape(panel.x_label)}</text>')
    out.append(f'<text transform="translate({left + 16},{(y0 + y1) / 2:.1f}) rotate(-90)" text-anchor="middle">'
               f'{escape(panel.y_label + (" (log scale)" if log else ""))}</text>')
    for y, label in panel.levels:
        out.append(f'<g class="level" data-y="{y:.6g}" data-name="{escape(label)}"><line x1="{x0}" y1="{py(y):.1f}" '
                   f'x2="{x1}" y2="{py(y):.1f}" stroke="#c00" stroke-dasharray="6 4"/>'
                   f'<text x="{x1 - 4}" y="{py(y) - 5:.1f}" text-anchor="end" fill="#c00">{escape(label)}</text></g>')
    for i, (name, points, style, color) in enumerate(panel.series):
        color = PALETTE[color % len(PALETTE)]
        dash = {"dashed": ' stroke-dasharray="5 4"', "dotted": ' stroke-dasharray="1 4" stroke-linecap="round"'}.get(
            style, "")
        out.append(f'<g class="series" data-name="{escape(name)}" stroke="{color}" fill="{color}">')
        marks = style in ("points", "hollow")        # points alone; hollow: a probe stopped, its figure over this
        hollow = ' fill="white" stroke-width="1.5"' if style == "hollow" else ""
        if not marks and len(points) > 1:
            path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y, *_ in points)
            out.append(f'<polyline points="{path}" fill="none" stroke-width="{3 if style == "dotted" else 2}"{dash}/>')
        for x, y, *label in points:
            tip = f"<title>{escape(label[0])}</title>" if label else ""
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="{4 if marks else 2.5}"{hollow} '
                       f'data-x="{x:.6g}" data-y="{y:.6g}">{tip}</circle>')
        out.append("</g>")
        ly, lx = y0 + 10 + LEGEND_ROW * (i % rows), x1 + 10 + column * (i // rows)
        sample = (f'<circle cx="{lx + 9}" cy="{ly - 4}" r="4" fill="{"white" if hollow else color}" stroke="{color}"/>'
                  if marks else
                  f'<line x1="{lx}" y1="{ly - 4}" x2="{lx + 18}" y2="{ly - 4}" stroke="{color}" stroke-width="2"{dash}/>')
        head = (fits - 1) * 2 // 5           # (a cut name keeps both ends: its group's first word, its value)
        shown = name if len(name) <= fits else name[:head] + "\u2026" + name[len(name) - (fits - 1 - head):]
        out.append(f'{sample}<text x="{lx + 24}" y="{ly}">{escape(shown)}</text>')
    for x, low, high, color in panel.whiskers:
        out.append(f'<line class="whisker" x1="{px(x):.1f}" y1="{py(low):.1f}" x2="{px(x):.1f}" y2="{py(high):.1f}" '
                   f'stroke="{PALETTE[color % len(PALETTE)]}" stroke-width="1.5" data-x="{x:.6g}" '
                   f'data-low="{low:.6g}" data-high="{high:.6g}"/>')
    placed: list = []          # labels' boxes so far: a label that would overprint one moves down a line
    for x, y, label in panel.marks:
        wide = 7 * len(label)          # keep the label inside the chart: right of its point, else left, else
        start = px(x) + 10 if px(x) + 10 + wide <= x1 else px(x) - 10 - wide if px(x) - 10 - wide >= x0 \
            else max(x0 + 4, x1 - wide)               # where the chart holds it
        # Under the point, each label a line below those it would overprint; where that leaves the
        # chart, above the point and upward.
        ty, step = (py(y) + 20, 14) if py(y) + 20 <= y1 - 2 else (py(y) - 12, -14)
        while any(start < b_end and b_start < start + wide and abs(ty - b_y) < 14
                  for b_start, b_end, b_y in placed):
            ty += step
            if ty > y1 - 2 and step > 0:
                ty, step = py(y) - 12, -14
        placed.append((start, start + wide, ty))
        out.append(f'<g class="mark" data-name="{escape(label)}" data-x="{x:.6g}" data-y="{y:.6g}">'
                   f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="8" fill="none" stroke="#000" stroke-width="1.5"/>'
                   f'<text x="{start:.1f}" y="{ty:.1f}">{escape(label)}</text></g>')
    out.append("</g>")
    return out


def knee(results: list[dict]) -> Optional[int]:
    """The last point before which more load still bought at least 10% more output throughput:
    past it, load mostly buys latency."""
    for i in range(len(results) - 1):
        if results[i + 1]["output_throughput"] < 1.1 * results[i]["output_throughput"]:
            return i
    return None


def sweep_svg(title: str, axes: list[str], results: list[dict]) -> str:
    """Output throughput against TTFT and TPOT (p50 dashed, p95 solid), one curve per value of
    the axis that is not the load, with each curve's knee ringed; with several seeds, each p95's
    min-max across them as a whisker."""
    load = next((a for a in axes if a in ("concurrency", "rate")), None)
    other = [a for a in axes if a != load]
    groups: dict = {}
    for r in results:
        if not r.get("does_not_fit"):
            key = "  ".join(f"{short_label(a)} {value_label(a, r['config']['sweep_point'][a])}" for a in other)
            groups.setdefault(key, []).append(r)
    if any((r.get("seeds") or {}).get("spread") for r in results):
        title += " (whiskers: each p95's lowest to highest over the seeds)"
    panels = [Panel("TTFT against throughput", "output tokens/s", "TTFT (ms)"),
              Panel("TPOT against throughput", "output tokens/s", "TPOT (ms)")]
    for color, (key, rows) in enumerate(groups.items()):
        name = key or short_label(load)
        for panel, metric in zip(panels, ("ttft", "tpot")):
            # (TPOT is undefined where every output is one token: add() leaves such points out, and
            # no knee or whisker is drawn for them.)
            # (Without a load axis each group is one point: p95 filled, p50 open.) Each point says its load.
            for stat, label, style, alone in (("p95", "p95", "line", "points"), ("median", "p50", "dashed", "hollow")):
                panel.add(f"{name} {label}", [(r["output_throughput"], r[f"{stat}_{metric}_ms"],
                                               f"{short_label(load)} {value_label(load, r['config']['sweep_point'][load])}"
                                               if load else key or name) for r in rows],
                          style if load else alone, color)
            spreads = [(r["output_throughput"], ((r.get("seeds") or {}).get("spread") or {}).get(f"p95_{metric}_ms"))
                       for r in rows]
            panel.whiskers += [(x, spread["min"], spread["max"], color) for x, spread in spreads
                               if spread and spread.get("min") is not None and spread.get("max") is not None]
            at = knee(rows) if load else None
            if at is not None and rows[at][f"p95_{metric}_ms"] is not None:
                label = f"knee: {short_label(load)} {value_label(load, rows[at]['config']['sweep_point'][load])}"
                panel.marks.append((rows[at]["output_throughput"], rows[at][f"p95_{metric}_ms"], label))
    return svg_figure(title, panels, width=640)


def timeline_svg(title: str, rows: list[dict]) -> str:
    """Running and waiting requests, KV use and token throughput, second by second."""
    requests = Panel("requests", "time (s)", "requests", log_y=False)
    requests.add("running", [(r["t"], r["running"]) for r in rows])
    requests.add("waiting", [(r["t"], r["waiting"]) for r in rows if r.get("waiting") is not None])
    kv = Panel("KV cache", "time (s)", "KV cache used (%)", log_y=False)
    kv.add("kv cache %", [(r["t"], r["kv_cache_pct"]) for r in rows if r.get("kv_cache_pct") is not None])
    # Apart: a second's prompt tokens can be a hundred times its generated ones. Prompt tokens count
    # in the second their prefill ends, as vLLM's counter does, so a long prompt is one spike.
    generated = Panel("generated tokens", "time (s)", "tokens/s", log_y=False)
    generated.add("generated tok/s", [(r["t"], r["gen_throughput"]) for r in rows])
    prompt = Panel("prompt tokens, counted when each prefill ends (as vLLM counts them)", "time (s)", "tokens/s",
                   log_y=False)
    prompt.add("prompt tok/s", [(r["t"], r["prompt_throughput"]) for r in rows], color=1)
    return svg_figure(title, [requests, kv, generated, prompt], columns=1, width=760, height=260)


def plan_svg(report: dict, title: str) -> str:
    """The load over the period, and the replicas it needs, those asked for and those serving
    (the added ones after the delay); windows whose whole-period simulation missed the SLO are
    marked on the load."""
    hours = lambda t: t / 3600
    rows = report["windows"]
    load = Panel("load", "hours", "requests/s", log_y=False)
    load.add("offered", [(hours(t), r["load"]) for r in rows for t in (r["start_s"], r["end_s"])])
    missed = set((report.get("verified") or {}).get("windows_missing_the_slo") or [])
    for r in rows:
        if r["start_s"] in missed:
            load.marks.append((hours((r["start_s"] + r["end_s"]) / 2), r["load"], "slo missed"))
    replicas = Panel("replicas", "hours", "replicas", log_y=False)
    replicas.add("needed", [(hours(t), min(r["needs"], r["asked"] + 1)) for r in rows for t in (r["start_s"], r["end_s"])],
                 "dotted")
    end = rows[-1]["end_s"]
    steps = ReplicaSchedule("plan", tuple((s["time_s"], s["replicas"]) for s in report["schedule"]))

    def stairs(level: Callable[[float], int], times: Iterable[float]) -> list[tuple[float, float]]:
        edges = sorted({t for t in times if t < end})
        return [(hours(t), level(a)) for a, b in zip(edges, edges[1:] + [end]) for t in (a, b)]
    replicas.add("asked for", stairs(functools.partial(asked_at, steps.steps), (at for at, _ in steps.steps)))
    replicas.add("serving", stairs(*steps.serving(report["scale_up_delay_s"])), "dashed")
    return svg_figure(title, [load, replicas], columns=1, width=760, height=300)


def search_svg(report: dict, axes: list[str], probing: Probing, unit: str) -> str:
    """Max load: each deployment's probes, load against the SLO's first metric (in the steady
    window, when sustained), its answer ringed; for a trace, the burst probes dashed beside them.
    A probe stopped once it missed that bound for certain is drawn on the bound: its figure is
    over it, by how much it did not run to tell (one stopped on another bound, or at a failed
    request, is left out: this figure was not run to the end). Target load: cost against that
    metric for every deployment, with the Pareto front (no cheaper deployment is faster) and the
    SLO drawn."""
    slo = probing.slo
    name, key, bound = slo.bounds[0]
    label = name.replace("_", " ") + " (ms)"
    stopped = f" (interrupted: {report['tried']} deployments finished)" if report.get("tried") else ""
    named = lambda item: "  ".join(f"{short_label(a)} {value_label(a, item['settings'][a])}" for a in axes)
    if report["target"] is None:
        panel = Panel(f"{name.replace('_', ' ')} against load", unit, label)
        burst = replace(probing, sustained=False)
        for color, item in enumerate(report["deployments"]):
            for how, searched, style, suffix in ((probing, item, "line", " sustained" if item.get("burst") else ""),
                                                 (burst, item.get("burst"), "dashed", " played once")):
                if not searched:
                    continue
                for rechecked in (False, True):     # the recheck's longer probes as a line of their own
                    probes = sorted((p for p in searched["probes"] if bool(p.get("recheck")) == rechecked),
                                    key=lambda p: p["load"])
                    ran = [(p["load"], how.figures(p)[key]) for p in probes if not p.get("stopped")]
                    over = [(p["load"], bound) for p in probes if (p.get("stopped") or {}).get("slo") == name]
                    for points, words in ((ran, ""), (over, ", stopped: over the slo")):
                        if points:
                            panel.add((named(item) or "probes") + suffix + (" rechecked" if rechecked else "") +
                                      words, points, "hollow" if words else "points" if rechecked else style, color)
                best = searched.get("best")
                whose = f"{named(item)}: " if len(report["deployments"]) > 1 and named(item) else ""
                if best:
                    panel.marks.append((best["load"], how.figures(best)[key],
                                        f"{whose}highest{suffix}: {best['load']:.4g} {unit}"))
        panel.levels.append((bound, f"slo {bound:g} ms"))
        return svg_figure(f"search: highest {report['by']} within {slo.text().replace('_', ' ')}{stopped}", [panel], columns=1,
                          width=760, height=420)
    panel = Panel(f"{name.replace('_', ' ')} against cost", "USD an hour", label)
    priced = [(item, (item["best"] or item["probes"][-1])) for item in report["deployments"] if item["probes"]]
    priced = [(item, p) for item, p in priced if p.get("cost")]
    for verdict, keep in (("meets the slo", True), ("misses it", False)):
        panel.add(verdict, [(p["cost"]["usd_per_hour"], p[key], named(item)) for item, p in priced
                            if bool(item["best"]) == keep], "points")
    front, fastest = [], math.inf
    for item, p in sorted(priced, key=lambda ip: (ip[1]["cost"]["usd_per_hour"], ip[1][key] or math.inf)):
        if p[key] is not None and p[key] < fastest:
            front.append((p["cost"]["usd_per_hour"], p[key]))
            fastest = p[key]
    panel.add("pareto front", front, "dashed")
    cheapest = next(((item, p) for item, p in priced if item["best"]), None)
    if cheapest:
        panel.marks.append((cheapest[1]["cost"]["usd_per_hour"], cheapest[1][key], "cheapest: " + (named(cheapest[0]) or "it")))
    panel.levels.append((bound, f"slo {bound:g} ms"))
    return svg_figure(f"search: deployments at {report['target']:g} {unit}, {slo.text().replace('_', ' ')}{stopped}", [panel], columns=1,
                      width=760, height=420)


# ---------------------------------------------------------------------------------------------
# Command line. Errors are one line: exit 2 for bad input, 1 for "does not fit" or a failure.
# ---------------------------------------------------------------------------------------------

# A flag named like a credential, spelled right or not (--apikey, --hf-token): its value is never
# shown. By whole words of its name: --prompt-tokens is no credential.
SECRET_WORDS = {"key", "apikey", "token", "secret", "password", "passwd", "pw", "auth", "authorization", "bearer",
                "credential", "credentials"}
SECRET_FLAG = re.compile(r"^--?([A-Za-z0-9_-]+)(=|$)")


def hide_argv_secrets(message: str, argv: Optional[list[str]]) -> str:
    """An error about the command line without what it must not show: the value of any flag named
    like a credential (argparse quotes a mistyped one's among the arguments it does not know) and
    the user and password of any URL in it."""
    words = [str(w) for w in (sys.argv[1:] if argv is None else argv)]
    secrets = []
    for i, word in enumerate(words):
        named = SECRET_FLAG.match(word)
        if named and (SECRET_WORDS & set(re.split(r"[-_]", named.group(1).lower()))
                      or difflib.get_close_matches(named.group(1).lower(), ["api-key"], 1, 0.75)):   # (--api-kye)
            secrets.append(word.split("=", 1)[1] if named.group(2) == "=" else words[i + 1] if i + 1 < len(words)
                           else "")
        flag, given, value = word.partition("=") if word.startswith("-") else ("", "", word)
        url = "://" in value or (flag if given else words[i - 1] if i else "").lower().endswith("url")
        if "@" in value and url:      # a user and password, with or without a scheme (see redact_url)
            secrets += re.sub(r"^[A-Za-z][A-Za-z0-9+.-]*://", "", value).rsplit("@", 1)[0].split(":", 1)
        if url and re.search(r"[?#]", value):      # a query or fragment (?api_key=...), as redact_url hides it
            secrets.append(re.split(r"[?#]", value, 1)[1])
    # (Two characters or one are no credential, and hidden wherever they stand would garble the line.)
    return hide_pieces(message, [s for s in secrets if len(s.strip()) > 2])


class OneLineParser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        # A flag spelled in full only: argparse would read `plan --rate 5` as --rate-profile 5, and
        # a prefix that names one flag today names two when a flag is added.
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        if message == "argument --server-flags: expected one argument":    # (argparse reads "--parallel=4" as a flag)
            message += "; a value that starts with - goes after an =: --server-flags=\"--parallel 4\""
        raise UserError(f"{self.prog}: {message} (see --help)")

    def parse_args(self, args=None, namespace=None):
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:        # named by the subcommand that refused them, with the flag most like each
            sub = next((a.choices.get(getattr(namespace, "command", None)) for a in self._actions
                        if isinstance(a, argparse._SubParsersAction)), None) or self
            flags = [f for f in sub._option_string_actions if f.startswith("--")]
            near = [m for word in extras if word.startswith("--")
                    for m in ([f for f in flags if f.startswith(word.split("=")[0])][:1]
                              or difflib.get_close_matches(word.split("=")[0], flags, 1, 0.75))]
            sub.error(f"unrecognized arguments: {' '.join(extras)}" + (f" (did you mean {near[0]}?)" if near else ""))
        return namespace

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if getattr(namespace, "trace_format", "auto") != "auto" and not getattr(namespace, "trace", None):
            raise UserError(f"--trace-format {namespace.trace_format} says how to read --trace: give the trace")
        metrics = [metric for metric, _ in getattr(namespace, "goodput", None) or ()]
        twice = [m for m in dict.fromkeys(metrics) if metrics.count(m) > 1]
        if twice:       # as --slo: which of two bounds was meant cannot be told
            raise UserError(f"--goodput gives {twice[0]} twice; give each bound once")
        return namespace, extras

    def _get_value(self, action, arg_string):
        # An empty path is an unset shell variable ("$TRACE"), not "no file": a run without the
        # file would answer another question without a word.
        if not arg_string.strip() and re.search(r"FILE|\.json|REPORT|RUN|FOLDER", str(action.metavar)):
            kind = {"FOLDER": "a folder", "RUN": "a run's file or folder"}.get(action.metavar, "a file")
            raise argparse.ArgumentError(action, f"an empty path; give {kind} (is a shell variable unset?)")
        if not arg_string.strip() and action.dest == "name" and not action.option_strings:
            raise argparse.ArgumentError(action, "an empty name; give a preset's name, or none to list them all "
                                                 "(is a shell variable unset?)")
        return super()._get_value(action, arg_string)

    def print_help(self, file=None) -> None:
        write_text(self.format_help(), file)     # argparse's own printer hides a failed write


def add_settings(p: argparse.ArgumentParser, names: Iterable[str], lists: bool = False, overrides: bool = False,
                 owner=None, title: Optional[str] = None) -> None:
    """The flags of these settings (rows of `owner`, RunSpec unless given), each in its group, made
    from the settings table. lists: sweep and search take comma-separated values of every setting
    with an axis. overrides: compare's flags, which replace what a measured run recorded. title:
    all of them in one group of that title."""
    rows = {f.name: f for f in fields(owner or RunSpec) if f.metadata}
    chosen = [rows[name] for name in rows if name in set(names)]
    groups = {"": (p.add_argument_group(title), chosen)} if title else {}
    for group in [] if title else dict.fromkeys([*GROUPS, *(f.metadata["group"] for f in chosen)]):
        members = [f for f in chosen if f.metadata["group"] == group]
        if members:
            heading = GROUPS.get(group, group)
            if overrides:
                heading = "the engine: each flag replaces what the run recorded (default: the recorded value, else " \
                          "servesim's simulate default)" if group != "slo" else heading
            groups[group] = (p.add_argument_group(heading) if group not in groups else groups[group], members)
    exclusive = {}
    for group, (g, members) in groups.items():
        for f in members:
            add_setting(g, f, lists and f.metadata["axis"] > 0, overrides, exclusive, lists)


def not_a_list(kind: Callable, flag: str, why: str = "sweep and search do not vary it") -> Callable:
    """`kind`, for a flag a sweep or search takes one value of: a value it refuses whose
    comma-separated parts it takes each is a list, refused as such (its values would otherwise be
    named as one bad value: 'vllm,sglang' is not one of vllm, sglang, ...). One it reads as a
    number with its thousands grouped (100,200) is said, as the user of a command that takes lists
    may have meant one."""
    @functools.wraps(kind)
    def read(text: str):
        try:
            value = kind(text)
            said_grouped(text, flag, f"a comma groups thousands here: this command does not vary {flag}; run once "
                                     f"for each value")
            return value
        except (argparse.ArgumentTypeError, ValueError):
            parts = text.split(",")
            if len(parts) > 1 and all(readable(kind, part.strip()) for part in parts):
                raise argparse.ArgumentTypeError(f"{text!r} is a list, and this flag takes one value ({why}): run "
                                                 f"once for each") from None
            raise
    return read


def readable(kind: Callable, text: str) -> bool:
    try:
        kind(text)
        return True
    except (argparse.ArgumentTypeError, ValueError, UserError):
        return False


def thousands_noted(kind: Callable, flag: str) -> Callable:
    """`kind`, for a flag a sweep would take a list of: 25,100 is one number here, its thousands
    grouped, and two values there, so stderr says which reading it took."""
    @functools.wraps(kind)
    def read(text: str):
        value = kind(text)
        said_grouped(text, flag, f"sweep would read {text.count(',') + 1} values")
        return value
    return read


def said_grouped(text: str, flag: str, why: str) -> None:
    """Say on stderr that `text`, a number with its thousands grouped, was read as one value."""
    if "," in text and THOUSANDS.fullmatch(text) and zero_item(text.split(",")) is None:
        sys.stderr.write(f"servesim: {flag} {text.strip()} is read as one value, {text.strip().replace(',', '')} "
                         f"({why})\n")


def add_setting(g, f, several: bool, overrides: bool, exclusive: dict, lists: bool = False) -> None:
    """One row's flag. Every flag defaults to None, "not given", so the table's default (or, for
    compare, the value the run recorded) stands; --help shows what that is. `lists`: the command
    takes lists of the settings that have an axis (a list of another is refused as one)."""
    m = f.metadata
    flags, kind = (m["flag"], *m["aliases"]), m["kind"]
    if kind is not None and lists and not several and not m["nargs"]:      # (--goodput takes several, spaced)
        kind = not_a_list(kind, m["flag"])
    elif kind is not None and not lists and m["axis"]:
        kind = thousands_noted(kind, m["flag"])
    if m["switch"]:
        text = "; the flag alone is on" + (", on,off sweeps both" if several else "")
        options = dict(nargs="?", const=[True] if several else True, type=list_of(m["kind"]) if several else kind,
                       metavar="on|off")
    elif kind is None:           # a plain flag, or a file read when the run is built
        text, options = "", (dict(metavar=m["metavar"]) if m["metavar"] else dict(action="store_true"))
    else:
        text = ", or several comma-separated to sweep" if several else ""
        options = dict(type=list_of(kind) if several else kind, metavar=m["metavar"], nargs=m["nargs"])
        if m["nargs"]:      # given twice, a flag of several words takes both's (the last alone would drop some)
            options["action"] = "extend"
    shown = m['default_text'] or value_label(f.name, f.default)
    if lists and f.name == "concurrency":       # (a sweep's load axis when none is given: sweep_grid)
        shown = f"{','.join(map(str, DEFAULT_SWEEP))} clients, without --rate"
    shown = f" (default: {'the value the run recorded, else ' if overrides else ''}{shown})"
    own = g       # the flags that go with this one (--trace-format) are not exclusive with it
    if m["exclusive"]:
        if m["exclusive"] not in exclusive:
            exclusive[m["exclusive"]] = g.add_mutually_exclusive_group()
        own = exclusive[m["exclusive"]]
    own.add_argument(*flags, dest=dest_of(f), help=(m["help"] + text + shown).replace("%", "%%"), **options)
    for spelling, on in VLLM_SPELLINGS.get(f.name, ()):      # (its help says them)
        said = on if dest_of(f) == f.name else not on       # a --no-X row keeps whether X is off
        own.add_argument(spelling, dest=dest_of(f), action="store_const", const=[said] if several else said,
                         help=argparse.SUPPRESS)
    if f.name == "trace":
        g.add_argument("--trace-format", choices=("auto",) + TRACE_FORMATS, default="auto",
                       help="how to read --trace: servesim JSONL; Mooncake JSONL (timestamp ms, input_length, "
                            "output_length, hash_ids per 512 tokens); Alibaba Bailian JSONL (timestamp s, hash_ids "
                            "per 16 tokens); Azure LLM inference CSV (TIMESTAMP, ContextTokens, GeneratedTokens); "
                            "BurstGPT CSV (Timestamp, Request tokens, Response tokens); a vllm bench serve "
                            "--save-detailed result (default: %(default)s, told from the first line)")
    if f.name == "ramp_up":
        g.add_argument("--ramp-up-start-rps", type=real(0.001, 1e6), metavar="R",
                       help="the ramp's first rate, requests/s (default: no ramp)")
        g.add_argument("--ramp-up-end-rps", type=real(0.001, 1e6), metavar="R",
                       help="the ramp's last rate, requests/s (default: no ramp)")


# vLLM's own spellings of a switch: (flag, whether it turns the setting on).
VLLM_SPELLINGS = {"prefix_caching": (("--enable-prefix-caching", True), ("--no-enable-prefix-caching", False)),
                  "chunked_prefill": (("--enable-chunked-prefill", True), ("--no-enable-chunked-prefill", False))}


def dest_of(f) -> str:
    """Where argparse keeps a row's flag: a --no-X flag (the setting on by default) keeps no_X."""
    return "no_" + f.name if f.metadata["flag"].startswith("--no-") else f.name


def one(value):
    """A flag that sweep takes as a list holds one value outside the swept axis."""
    return value[0] if isinstance(value, list) else value


def read_setting(args, f):
    """A setting's value from the flags (None: not given): the text read by its row's kind,
    presets and traces read from their files, sweep's lists cut to their first value."""
    if dest_of(f) != f.name:
        return False if getattr(args, dest_of(f)) else None
    value = getattr(args, f.name) if f.metadata["nargs"] else one(getattr(args, f.name))
    if f.metadata["kind"] is preset_name and value is not None:
        return load_preset("hardware", value, HARDWARE, Hardware, f.metadata["flag"]) if f.name.endswith("hardware") \
            else load_preset("model", value, MODELS, ModelSpec, f.metadata["flag"])
    if f.name == "trace" and value:
        # Read whole for search: its sustained probes repeat the whole trace (only the burst it
        # plays once stops at --requests), as the simulate it prints to rerun one reads it.
        cut = hasattr(args, "requests") and getattr(args, "command", None) != "search"    # (plan has no --requests)
        trace = read_trace(value, args.trace_format, args.requests if cut else None, cut_by_requests=cut)
        for note in trace.notes:
            sys.stderr.write(f"servesim: trace {trace.name} ({trace.format}): {note}\n")
        return trace
    if f.name == "rate_profile" and value:
        return read_rate_profile(value)
    if f.name == "replica_schedule" and value:
        return read_replica_schedule(value)
    if f.name == "ramp_up":
        given = [args.ramp_up, args.ramp_up_start_rps, args.ramp_up_end_rps]
        if any(v is not None for v in given) and any(v is None for v in given):
            raise UserError("a ramp needs all three: --ramp-up-strategy, --ramp-up-start-rps and --ramp-up-end-rps")
        return tuple(given) if args.ramp_up else None
    if f.metadata["nargs"] and value is not None:
        return tuple(value)
    return value


def settings_from_args(cls, args) -> dict:
    """The fields of `cls` (RunSpec, LoadConfig) whose flags were given."""
    values = {}
    for f in fields(cls):
        if f.metadata and hasattr(args, dest_of(f)):
            value = read_setting(args, f)
            if value is not None:
                values[f.name] = value
    return values


def with_engine_profile(values: dict) -> dict:
    """The settings with an --engine profile file read: its profile, priced by the kernel model
    (the model its costs were fitted on; the roofline prices no engine costs) unless one is given."""
    if values.get("engine") not in (None, *ENGINES):
        values["profile"] = read_engine_profile(values["engine"])
        if values.setdefault("cost_model", "kernels") != "kernels":
            sys.stderr.write(f"servesim: engine profile {values['profile'].name}: its scheduling rules apply, its "
                             f"fitted costs do not: --cost-model {values['cost_model']} prices no engine costs\n")
    elif values.get("async_scheduling") is not None and values.get("cost_model", DEFAULT_COST_MODEL) == "roofline":
        sys.stderr.write("servesim: --async-scheduling changes nothing under the roofline, which prices no engine CPU "
                         "work: add --cost-model kernels\n")
    elif values.get("async_scheduling") is not None and values.get("engine") in ENGINES and \
            not (ENGINES[values["engine"]].step_cpu_ms or ENGINES[values["engine"]].seq_cpu_ms):
        sys.stderr.write(f"servesim: --async-scheduling changes nothing under --engine {values['engine']}, whose "
                         f"profile has no CPU work to hide (calibrate --fit engine fits it)\n")
    return values


def spec_from_args(args, base: Optional[RunSpec] = None, varies: Iterable[str] = ()) -> RunSpec:
    """The run the flags describe, checked: each flag given replaces `base`'s value (the
    defaults; for compare, what the measured run recorded). `varies`: settings the command itself
    gives several values (plan, the replicas), checked as a sweep's lists are."""
    values = with_engine_profile(settings_from_args(RunSpec, args))
    if any(getattr(args, name, None) is not None for name in ("kv_link_gbs", "prefill_hardware", "decode_hardware")):
        values["disaggregate"] = True          # a flag of the link, or of either engine, turns it on
    if getattr(args, "detailed", False):
        values["detailed"] = True
    spec = engine_defaults(replace(base or RunSpec(), **values), values)
    swept = {f.name for f in fields(RunSpec) if f.metadata and not f.metadata["nargs"]
             and isinstance(getattr(args, f.name, None), list) and len(getattr(args, f.name)) > 1}
    check_spec(spec, values, swept | set(varies), capped=hasattr(args, "requests"))     # (plan has no --requests)
    return spec


def add_report_args(p: argparse.ArgumentParser, json_help: str) -> None:
    out = p.add_argument_group("output")
    out.add_argument("--json", action="store_true", help=json_help)
    out.add_argument("--detailed", action="store_true",
                     help="JSON with per-request arrays (input_lens, output_lens, ttfts, itls, latencies, "
                          "start_times, errors; seconds), as vllm bench serve --save-detailed; implies --json. "
                          "About 28 bytes per output token: 10,000 requests of 160 tokens make ~45 MB")


def add_probe_args(g, what: str = "the highest sustained rate found", search: bool = True) -> None:
    """How long a probe runs (search's, and plan's for its one-replica capacity)."""
    g.add_argument("--steady-requests", type=whole(MIN_WINDOW_REQUESTS, MAX_REQUESTS // 2),
                   default=Probing.steady_requests, metavar="N",
                   help="requests each probe sends inside its steady window: it sends N / (1 - --steady-skip) in "
                        "all, whatever --requests says, and more if its first requests end so late that the window "
                        "(which starts at the first end) holds fewer or lasts less than two request lifetimes, so the "
                        "answer does not move with --requests; it moves with N: a longer window sees more of a queue "
                        "that settles slowly near capacity (which --recheck's longer probes check), and its arrivals' luck is "
                        "about 1/sqrt(N) of the rate; at least 2 / (1 - --min-served), 40 at the default, times the mean size of the "
                        "bunch of requests a --trace sends at one moment (they cross a window's edge together), and at "
                        "most "
                        f"{MAX_REQUESTS // 2:,} / --recheck (default: %(default)s)")
    g.add_argument("--recheck", type=whole(1, 100), metavar="N",
                   help=f"recheck {what} with probes N times as long (N times --steady-requests in the window), "
                        "stepping down (by --tolerance twice, then by more while it keeps missing) until one holds: "
                        "near capacity a queue settles more slowly than one probe shows, and a rate a probe passes "
                        "can fall behind over a longer run; a long probe stops once a percentile bound is missed "
                        "for certain" + ("; a search's --rate target is probed at that length from the start" if search
                                         else "") + f"; 1 (no recheck) to 100 (default: {Probing.recheck})")


def add_seed_args(g, search: bool = False) -> None:
    g.add_argument("--seeds", type=whole(1, MAX_SEEDS), default=1, metavar="N",
                   help=("run each probe with up to N seeds (--seed, --seed + 1, ...; the rest are skipped once "
                         "--confidence settles its verdict): it passes by --confidence, and its figures are the mean "
                         "of the seeds run" if search else
                         "run each point with N seeds (--seed, --seed + 1, ...) and report every figure as their mean "
                         f"with its spread: min-max and, from {SPREAD_PERCENTILES_FROM} seeds, the 10th-90th percentile "
                         "interval")
                   + f" (default: %(default)s; at most {MAX_SEEDS:,})")
    if search:
        g.add_argument("--confidence", type=fraction, default=1.0, metavar="F",
                       help="a probe passes when at least this share of its seeds pass, rounded up and at least one "
                            "(default: %(default)s, every seed)")


def add_picture_args(p: argparse.ArgumentParser, what: str) -> None:
    g = p.add_argument_group("pictures")
    g.add_argument("--timeline", metavar="FILE.csv",
                   help=f"write {what}'s per-second stats as CSV in the shape vLLM logs them: t, prompt_throughput, "
                        f"gen_throughput (tokens/s), running, waiting, kv_cache_pct (default: off)")
    g.add_argument("--plot", metavar="FILE.svg",
                   help="draw the same seconds as SVG: running and waiting requests, KV use, token throughput "
                        "(default: off)")


class Progress:
    """A line on stderr now and then, once a run has taken more than a second of wall time."""
    def __init__(self, label: str):
        self.label = label
        self.started = self.last = time.monotonic()

    def __call__(self, text: str) -> None:
        now = time.monotonic()
        if now - self.started > 1 and now - self.last > 1:
            self.say(text)

    def say(self, text: str) -> None:
        self.last = time.monotonic()
        sys.stderr.write(f"{self.label}: {text}\n")
        sys.stderr.flush()

    @contextlib.contextmanager
    def during(self, text: str, after: float = 2.0):
        """Say `text` if what the block does takes longer than `after` seconds (a server that is
        slow to answer a probe or a last scrape): silence then would look like a hang."""
        timer = threading.Timer(after, self.say, (text,))
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()


def cmd_capacity(args) -> int:
    spec = spec_from_args(args)
    plan, cost = device_plan(spec, spec.hardware)
    if plan.note:
        sys.stderr.write(f"servesim: {plan.note}\n")
    host = host_tier(spec, plan) if spec.kv_offloading_size else None
    refused = vllm_refusal(spec, plan)       # as simulate says it: the same reasons
    # (vLLM's line: its own token budget for the device where no engine was named)
    budget = (spec if spec.engine else engine_defaults(replace(spec, engine="vllm"), spec.given)).max_num_batched_tokens
    if args.json:
        report = capacity_json(plan, cost, engine_label(spec))
        if refused:
            report["vllm_would_refuse"] = refused
        elif engine_profile(spec).rules == "vllm" and plan.max_concurrency >= 1:
            tokens, concurrency = vllm_startup_figures(plan, budget)
            report["vllm_would_log"] = {"kv_cache_tokens": tokens, "max_concurrency": concurrency}
        if plan.model.sliding_layers:
            report["sliding_window_note"] = ("a sliding-window layer's few blocks a request are left out of the "
                                             "blocks and the simulation: their concurrency is an upper bound")
        if host:
            report["host_tier"] = {"gib": spec.kv_offloading_size, "blocks": host.capacity,
                                   "tokens": host.capacity * plan.block_size, "link_gbs": spec.hardware.host_link_gbs,
                                   "block_load_ms": host.block_bytes / host.rate * 1000}
        write_json(report)
    else:
        out = io.StringIO()
        print_capacity(plan, cost, out, engine_label(spec), engine_profile(spec).rules, refused, budget)
        if host:
            tokens = host.capacity * plan.block_size
            out.write(f"{'host tier':<17}{f'{spec.kv_offloading_size:,g} GiB':<19} {host.capacity:,} blocks = "
                      f"{tokens:,} tokens ({tokens / plan.kv_tokens:,.1f}x the HBM cache); a block loads in "
                      f"{host.block_bytes / host.rate * 1e6:,.1f} us over {spec.hardware.host_link_gbs:g} GB/s x "
                      f"{HOST_LINK_EFFICIENCY:g}\n")
        write_text(out.getvalue())
    return 0


def failed_exit(results: list[dict]) -> int:
    """Exit 1, with one line on stderr, when any request failed; the report has each one."""
    failed = sum(r["failed"] for r in results)
    if not failed:
        return 0
    kinds = Counter()
    for r in results:
        kinds.update(r["errors_by_kind"])
    total = sum(r["completed"] + r["failed"] for r in results)
    # number(): with --seeds the counts are the seeds' means.
    shown = ", ".join(f"{count_text(n)} x {kind}" for kind, n in kinds.most_common(3))
    sys.stderr.write(f"servesim: {count_text(failed)} of {count_text(total)} requests failed ({shown}); the report has "
                     f"each one's reason\n")
    return 1


def write_timeline(args, title: str, rows: list[dict]) -> None:
    """--timeline FILE.csv and --plot FILE.svg: the same per-second rows, as data and as a picture.
    Each is tried whatever became of the other; the first that could not be written is raised."""
    failed = []
    for path, text in ((args.timeline, timeline_csv), (args.plot, lambda r: timeline_svg(title, r))):
        if path:
            try:
                write_file(path, text(rows))
            except CapacityError as e:
                failed.append(e)
    if failed:
        raise failed[0]


def seeds_alike(spec: RunSpec, seeds: int) -> None:
    """Say so where --seeds runs one run several times (a trace, whose requests and times are its
    own): a spread of 0 is then no confidence. (search refuses it: each probe would pass N times.)"""
    if seeds > 1 and not draws_from_seed(spec):
        sys.stderr.write(f"servesim: --seeds {seeds}: every seed of trace {spec.trace.name} replays the same requests at "
                         f"the same times, so the {seeds} runs are one run {seeds} times, and their spread is 0 by "
                         f"construction, not a sign of confidence\n")


def cmd_simulate(args) -> int:
    for path, flag in ((args.timeline, "--timeline"), (args.plot, "--plot")):
        if path:
            check_writable(path, flag, args)
    spec = spec_from_args(args)
    pictured = bool(args.timeline or args.plot)
    if args.seeds > 1 and (pictured or spec.detailed):
        raise UserError("--timeline, --plot and --detailed show one run: drop them or --seeds")
    seeds_alike(spec, args.seeds)
    result = run(spec, Progress("simulate"), timeline=pictured) if args.seeds == 1 else \
        run_seeds(spec, args.seeds, Progress("simulate"))
    timeline = result.pop("timeline", None)
    if result["config"].get("kv_plan_note"):
        sys.stderr.write(f"servesim: {result['config']['kv_plan_note']}\n")
    # (Where no request ran, the one line that says why is the run's: the cache it did not fit.)
    if result["config"].get("vllm_would_refuse") and result["completed"]:
        sys.stderr.write(f"servesim: {result['config']['vllm_would_refuse']}\n")
    if args.json or args.detailed:
        write_json(result)
    else:
        out = io.StringIO()
        print_run(result, out)
        write_text(out.getvalue())
    if pictured:        # after the report, so a failed write loses nothing
        write_timeline(args, result["config"]["title"], timeline)
    return failed_exit([result])


def listed(args, exclude: tuple = ()) -> dict:
    """The settings sweep and search were given several values of, presets read."""
    given = {}
    for name in AXES:
        values = getattr(args, name, None)
        if isinstance(values, list) and name not in exclude:
            given[name] = [load_preset("hardware", v, HARDWARE, Hardware) for v in values] \
                if name == "hardware" else values
    if args.price_per_hour and len(given.get("hardware") or []) > 1:
        raise UserError("--price-per-hour is one price for one device: with several --hardware, put each "
                        "price_per_hour in its hardware JSON")
    return given


def cmd_sweep(args) -> int:
    fixed = [name for name in ("batching", "kv_layout") if getattr(args, name, None) is not None]
    if args.compare and fixed:
        raise UserError(f"--compare sets each row's batching and KV layout itself (static, slots, paged), so "
                        f"{flag_of(fixed[0])} would change nothing: drop it")
    if args.gpus and args.disaggregate:
        raise UserError(f"--gpus {args.gpus} splits the GPUs into TP groups and replicas; --disaggregate runs one "
                        f"prefill and one decode engine (each sized by -tp and its --prefill-hardware or "
                        f"--decode-hardware): drop --gpus")
    axes, points = sweep_grid(listed(args), args.gpus, args.trace)
    if getattr(args, "ramp_up", None) and {"rate", "concurrency"} & set(axes):
        load = next(axis for axis in axes if axis in ("rate", "concurrency"))
        raise UserError(f"a ramp (--ramp-up-strategy) sets the arrival rate, so sweep cannot vary --{load}"
                        + (": sweep --gpus varies the load with each layout; drop the ramp or --gpus" if args.gpus else
                           (" (its axis when no other is given)" if load not in listed(args) else "")
                           + ": sweep an engine setting instead, --max-num-seqs 64,128 say"))
    spec = spec_from_args(args, varies={"data_parallel_size"} if args.gpus else ())     # --gpus sets the replicas
    points = distinct(spec, applicable(spec, points, "point"), "point")
    for point in points:       # a bad combination is refused before any point runs
        with refused_at(point, len(points) > 1):
            build_engines(sweep_point(spec, point))
    crowded = [(point, ran) for point, ran in ((p, sweep_point(spec, p)) for p in points)
               if ran.sends() < (ran.clients() or 0)]
    if crowded:       # (their rows would read as the load they were named for)
        (point, ran), what = crowded[0], "conversations" if spec.turns > 1 else "requests"
        sys.stderr.write(f"servesim: {len(crowded)} point{'s' * (len(crowded) != 1)} ({point_label(point)}"
                         f"{', ...' if len(crowded) > 1 else ''}) {'have' if len(crowded) > 1 else 'has'} more clients "
                         f"than the {ran.sends():,} {what} to send, and so at most that many at once; raise --requests "
                         f"for a closed loop of that many\n")
    if args.plot:
        check_writable(args.plot, "--plot", args)
    progress = Progress("sweep")
    table = None
    workload = (f"trace {args.trace}" if args.trace else
                (f"{spec.requests:,} requests  " if spec.requests else "" if spec.rate_profile else
                 f"{DEFAULT_REQUESTS:,} requests  ") + lengths_words(spec)
                + ("" if {"rate", "concurrency"} & set(axes) else
                   f"  {replace(spec, burstiness=1.0).arrivals() if 'burstiness' in axes else spec.arrivals()}"))
    hardware = (spec.decode_hardware or spec.hardware) if spec.disaggregate or "kv_link_gbs" in axes else spec.hardware
    where = "" if "hardware" in axes else f" on {hardware.name}"
    settings = settings_line(spec, axes)
    if not (args.json or args.csv):
        table = SweepTable(f"sweep {spec.model.name}{where}  {workload}" + (f"  {settings}" if settings else ""),
                           axes, points, sweep_columns(spec, axes))
        table.header()
    results, stopped = [], None

    def take(result: dict, index: Optional[int] = None) -> None:
        result["config"]["sweep_points"] = len(points)
        results.append(result)
        progress(f"{point_text(result['config']['sweep_point'])} done ({len(results)}/{len(points)})")
        if table:
            table.row(result, index)
    runner = None
    seeds_alike(spec, args.seeds)
    try:
        runner = iter_sweep(spec, points, args.jobs, progress, args.seeds)
        for result in runner:
            take(result)
            if len(results) == len(points):
                hold_signals()      # all measured: the workers' shutdown and the output go through whole
    except (KeyboardInterrupt, Terminated, WorkerDied) as e:
        hold_signals()
        for index, result in (runner.finished() if runner else []):   # points that finished behind an unfinished one
            take(result, index)
        stopped = Stopped(1, str(e)) if isinstance(e, WorkerDied) else \
            Stopped.by_signal(e, kept_of(len(results), len(points), "point"))
    hold_signals()           # the output is written whole, whatever arrives now
    if table:
        for line in sweep_seed_lines(results):
            write_text(line + "\n")
    if args.json:
        write_json(results)
    elif args.csv:       # with the table's verdict cell, which a script would otherwise rebuild
        print_csv([{**r, "load": load_verdict(r)} if r.get("steady_state") else r for r in results])
    elif axes == ["kv_link_gbs"] and not stopped and not any(r.get("does_not_fit") for r in results):
        write_text(colocation_verdict(results))
    if args.plot and results:        # after the report, so a failed write loses nothing
        write_file(args.plot, sweep_svg(f"sweep {spec.model.name}{where}: "
                                        + " x ".join(flag_of(a)[2:] for a in axes)
                                        + (f" (interrupted: {len(results)} of {len(points)} points)" if stopped else "")
                                        + f"  {workload}" + (f"  {settings}" if settings else "")
                                        + (f"  {args.seeds} seeds a point" if args.seeds > 1 else ""),
                                        axes, results))
    if stopped:
        raise stopped
    too_small = [r for r in results if r.get("does_not_fit")]
    if too_small:
        names = ", ".join(point_text(r["config"]["sweep_point"]) for r in too_small[:3])
        sys.stderr.write(f"servesim: {len(too_small)} of {len(results)} points do not fit ({names}"
                         f"{', ...' if len(too_small) > 3 else ''})\n")
        if len(too_small) == len(results):
            return 1
    return failed_exit([r for r in results if not r.get("does_not_fit")])


def cmd_plan(args) -> int:
    slo = parse_slo(",".join(args.slo))      # (given twice: both's bounds)
    delay, args.scale_up_delay = args.scale_up_delay, None     # the plan's own, not a schedule's
    spec = spec_from_args(args, varies={"data_parallel_size"})
    if spec.data_parallel_size != 1 or spec.replica_schedule:
        raise UserError("plan chooses the replicas itself: drop --data-parallel-size and --replica-schedule")
    if not (spec.rate_profile or spec.trace):
        raise UserError("plan follows load that changes: give --rate-profile FILE or --trace FILE")
    if spec.disaggregate:
        raise UserError("plan adds and removes replicas, and --disaggregate runs one prefill and one decode engine "
                        "(replicas of such a pair are not modelled): plan without it")
    if spec.rate_profile and not any(rate for _, rate in spec.rate_profile.windows):   # (with or without --no-verify)
        raise UserError(f"rate profile {spec.rate_profile.name} sends no requests: its rates are all 0")
    if spec.rate_profile and not args.no_verify:     # (said here: the reader's own offers a --requests plan has not)
        expected = spec.rate_profile.expected_requests()
        if expected > MAX_REQUESTS:
            raise UserError(f"rate profile {spec.rate_profile.name} sends about {expected:,.0f} requests, and plan "
                            f"simulates the whole period; servesim simulates up to {MAX_REQUESTS:,}: plan a part of "
                            f"it (fewer rows), or lower its rates")
    if args.min_replicas > args.max_replicas:
        raise UserError(f"--min-replicas {args.min_replicas} is above --max-replicas {args.max_replicas}")
    problem = undefined_slo(spec, slo)
    if problem:
        raise UserError(problem)
    if spec.trace:
        trace_rate(spec)      # a trace sent all at once has no rate to plan: said before what a probe needs
    if args.plot:
        check_writable(args.plot, "--plot", args)
    probing = Probing(slo, "rate", None, args.tolerance, True, args.steady_requests, args.seeds, args.confidence,
                      recheck=args.recheck or Probing.recheck)
    probing.check(spec)
    scaling = Scaling(args.window, args.min_replicas, args.max_replicas, args.scale_down_after, args.ahead, delay)
    stopped = None
    try:
        report = plan(spec, probing, scaling, not args.no_verify, Progress("plan"))
    except (KeyboardInterrupt, Terminated) as e:
        if getattr(e, "partial", None) is None:
            raise
        report, stopped = e.partial, Stopped.by_signal(e, e.partial["interrupted"] + "; the output holds the windows planned")
    hold_signals()           # the plan is written whole, whatever arrives now
    where = f"{spec.hardware.name}" + (f" x {spec.tensor_parallel_size} (tensor parallel)" if spec.tensor_parallel_size > 1 else "")
    load = f"rate profile {spec.rate_profile.name}" if spec.rate_profile else f"trace {spec.trace.name}"
    rows = report["windows"]
    # One window of a period shorter than --window is as long as the period.
    length = rows[0]["end_s"] - rows[0]["start_s"] if len(rows) == 1 else args.window
    count = report["period_windows"]       # (an interrupted plan's rows are fewer: the title is the period's)
    title = (f"plan {spec.model.name} on {where}  {load} in {count:,} window{'s' * (count != 1)} of "
             + (f"{length / 60:g} min" if length % 60 == 0 else f"{length:,.4g} s") + f"  slo {slo.text()}")
    if args.json:
        write_json(report)
    elif args.csv:
        # A row at each window's start, and one (with the time and replicas only) at each step
        # inside a window (a scale-down that waited, a scale-up --ahead): those two columns are the schedule
        # simulate --replica-schedule replays.
        steps = [(s["time_s"], s["replicas"]) for s in report["schedule"]]
        rows = []
        for r in report["windows"]:
            row = {"time_s": r["start_s"], "replicas": asked_at(steps, r["start_s"]), "end_s": r["end_s"],
                   # (needs more than --max-replicas: the text's >N, not a count of replicas that would do)
                   "load_rps": float(f"{r['load']:.6g}"), "needs": r["needs"] if r["needs"] <= scaling.max_replicas else
                   f">{scaling.max_replicas}", "short_s": r["short_s"], "usd": r["usd"],
                   **(r["figures"] or {name: None for name, _, _ in slo.bounds}), "median_tpot_ms": r["median_tpot_ms"]}
            rows += [row] + [{**dict.fromkeys(row), "time_s": at, "replicas": n} for at, n in steps
                             if r["start_s"] < at < r["end_s"]]
        print_csv(rows)
        if report.get("vllm_would_refuse"):        # (the CSV has no room for it; the text says it as "beware")
            sys.stderr.write(f"servesim: {report['vllm_would_refuse']}\n")
    else:
        out = io.StringIO()
        print_plan(report, title, out.write)
        write_text(out.getvalue())
    if args.plot:
        write_file(args.plot, plan_svg(report, title))
    if stopped:
        raise stopped
    missed = plan_misses(report)
    if missed:
        sys.stderr.write(f"servesim: the plan does not meet the slo: {missed}\n")
        return 1
    return 0


def cmd_search(args) -> int:
    slo = parse_slo(",".join(args.slo))      # (given twice: both's bounds)
    given = listed(args, exclude=("rate", "concurrency"))
    axes, points = search_grid(given)
    if args.target_rate and args.target_concurrency:
        raise UserError("search --rate R ranks deployments at R requests/s and --concurrency N at N clients: give one")
    asked = "rate" if args.target_rate else "concurrency" if args.target_concurrency else None
    if asked and args.load:
        raise UserError(f"--load {args.load} asks for the highest {args.load}, and --{asked} ranks every deployment at "
                        f"one {asked}: drop --load")
    if asked and args.tolerance is not None:
        raise UserError(f"--tolerance says when a search for the highest load stops narrowing, and --{asked} runs "
                        f"each deployment once at one {asked}: drop --tolerance")
    args.tolerance = Probing.tolerance if args.tolerance is None else args.tolerance
    by, target = ("rate", args.target_rate) if args.target_rate else \
        ("concurrency", args.target_concurrency) if args.target_concurrency else (args.load or "rate", None)
    if args.rate_profile:
        raise UserError("search finds one load a deployment sustains; a --rate-profile's changing load is for plan")
    if getattr(args, "ramp_up", None):       # (else the ramp's own check names the --rate each probe sets)
        raise UserError("search sets each probe's load itself, and a ramp (--ramp-up-strategy) sets the arrival rate "
                        "over a run: drop the ramp (simulate and sweep take one)")
    if args.replica_schedule:
        raise UserError("search finds the load one deployment sustains; a --replica-schedule's replicas change over "
                        "time (plan chooses them): give --data-parallel-size N for N replicas all the time")
    if args.trace and (by == "concurrency" or args.time_scale is not None):
        raise UserError("search scales a --trace's arrivals itself: give --rate R (or nothing, to find the highest "
                        "rate), not --concurrency, --load concurrency or --time-scale")
    # Checked as each probe runs, with the load the search puts on it; kept without one. The
    # warm-up is checked against what a probe sends (Probing.check), not against --requests.
    spec = spec_from_args(argparse.Namespace(**{**vars(args), "warmup": None}),
                          RunSpec(**at_load(RunSpec(), by, 1)) if not args.trace else None)
    spec = replace(spec, rate=None, concurrency=None, warmup=args.warmup or 0)
    if (args.recheck or 1) > 1 and by == "concurrency":
        raise UserError(f"--recheck {args.recheck}: a closed loop (--concurrency, --load concurrency) sends only when a "
                        f"request ends, so it is sustained by construction and there is no rate to recheck; drop "
                        f"--recheck")
    probing = Probing(slo, by, target, args.tolerance, True, args.steady_requests, args.seeds, args.confidence,
                      recheck=args.recheck or Probing.recheck)
    if spec.trace and by == "rate" and target is None:
        trace_rate(spec)          # a burst of --requests that arrive at once: said now, not after the search
    probing.check(spec)           # (after: a trace sent all at once has no rate, whatever window it gets)
    problem = undefined_slo(spec, slo)
    if problem:
        raise UserError(problem)
    points = distinct(spec, applicable(spec, points, "deployment"), "deployment")
    for point in points:       # a bad combination is refused before anything runs, with a load on it
        with refused_at(point, len(points) > 1):
            build_engines(probing.probe(sweep_point(spec, point), 1))
    if args.confirm:
        confirm_check(args.confirm, spec)
    else:
        idle = [flag for flag, value in (("--confirm-requests", args.confirm_requests), ("--timeout", args.timeout))
                if value is not None]
        if idle:
            raise UserError(f"{idle[0]} is for the --confirm run: add --confirm URL, or drop {idle[0]}")
    if args.plot:
        check_writable(args.plot, "--plot", args)
    fingerprint = search_fingerprint(spec, points, probing)
    elsewhere = [flag for flag, value in (("--csv", args.csv), ("--plot", args.plot), ("--confirm", args.confirm))
                 if value]
    if args.shard and elsewhere:      # (its report is JSON for --collect, whatever was asked)
        raise UserError(f"--shard writes the JSON that --collect reads; {elsewhere[0]} belongs on the --collect run")
    if args.shard and args.shard[0] > len(points):
        raise UserError(f"--shard {args.shard[0]}/{args.shard[1]}: this search has {len(points):,} deployment"
                        f"{'s' * (len(points) != 1)}, so shard {args.shard[0]} has none; use at most "
                        f"{len(points)} shards")
    progress = Progress("search")
    found, stopped = [], None
    mine = [points[i] for i in shard_indices(args.shard, len(points))] if args.shard else points
    ended: dict[int, dict] = {}      # index in `mine` -> its deployment
    runner = None
    try:
        if args.collect:
            found = collect_shards(args.collect, fingerprint, points)
        else:
            runner = search_points(spec, mine, probing, args.jobs, progress)
            for item in runner:
                ended[len(ended)] = item
                progress(f"{len(ended)}/{len(mine)} deployments done")
                if len(ended) == len(mine):
                    hold_signals()      # all measured: the workers' shutdown and the report go through whole
    except (KeyboardInterrupt, Terminated, WorkerDied) as e:
        # Deployments that finished behind an unfinished one, and those the stop cut short with
        # their ended probes, marked interrupted (not in a shard's report, which collect would take
        # as finished deployments).
        ended.update((i, item) for i, item in (runner.finished() if runner else [])
                     if not (args.shard and item.get("interrupted")))
        whole = sum(not item.get("interrupted") for item in ended.values())
        parts = [item for item in ended.values() if item.get("interrupted")]
        probes = sum(len(item["probes"]) + len((item.get("burst") or {}).get("probes", [])) for item in parts)
        stopped = Stopped(1, str(e)) if isinstance(e, WorkerDied) else \
            Stopped.by_signal(e, kept_of(whole, len(mine), "deployment", probes, len(parts)))
    hold_signals()           # the report is written whole, whatever arrives now (but see --confirm)
    searched = points if args.collect else [mine[i] for i in sorted(ended)]    # the settings of each found
    if not args.collect:
        found = [ended[i] for i in sorted(ended)]
    if args.shard:            # a shard's report is for collect: JSON, whatever the format asked
        indices = shard_indices(args.shard, len(points))
        write_json(shard_report(found, args.shard, fingerprint, len(points), [indices[i] for i in sorted(ended)],
                                complete=not stopped))
        if stopped:
            raise stopped
        return 0
    sources = {load_preset("hardware", h, HARDWARE, Hardware): h for h in (args.hardware or [])}
    sources[spec.model] = args.model or spec.model.name
    report = search_report(spec, searched, found, probing, sources, len(points) if stopped else None)
    ranked = report["deployments"]
    chosen = next((item for item in ranked if item["best"]), None)
    confirmed = None
    hold_signals(False)      # Ctrl-C stops a confirm run as it stops loadgen; one noted by now skips it
    confirming = bool(args.confirm and chosen and not stopped and not stops["noted"])
    if confirming:
        if not (args.json or args.csv):      # the search's answer first: the confirm run takes a while
            write_text("\n".join(search_text(spec, args.trace, axes, ranked, probing)))
        deployment = sweep_point(spec, searched[found.index(chosen)])
        try:
            report["confirm"], confirmed = confirm(args.confirm, deployment, chosen["best"]["load"], by,
                                                   args.confirm_requests or CONFIRM_REQUESTS,
                                                   CONFIRM_TIMEOUT_S if args.timeout is None else args.timeout,
                                                   Progress("confirm"))
        except CapacityError as e:        # unreachable, or not an LLM server: the search's answer stands
            report["confirm"] = {"url": redact_url(args.confirm), "problem": str(e)}
            confirmed = Stopped(1, f"--confirm: {e} (the search's answer stands)")
    if args.json:
        write_json(report)
    elif args.csv:
        print_csv([{"deployment": item["settings"], "probe": {k: v for k, v in p.items() if k != "misses"},
                    "verdict": "; ".join(p["misses"]) or "meets"} for item in ranked for p in item["probes"]]
                  + [{"deployment": item["settings"], "verdict": "does not fit: " + item["does_not_fit"]}
                     for item in ranked if item.get("does_not_fit")])
    elif report.get("confirm"):
        out = io.StringIO()
        done = report["confirm"]
        if done.get("rows"):          # none when the server could not be reached: the answer is out already
            print_compared(done["title"], done["rows"], out.write)
            write_text(out.getvalue())
    elif not confirming:
        write_text("\n".join(search_text(spec, args.trace, axes, ranked, probing, report["tried"])))
    # After the report, so a failed write loses nothing; an interrupted search's picture is titled so,
    # and none is drawn (over an earlier run's) when no deployment finished.
    if args.plot and ranked and not (stopped and not any(not item.get("interrupted") for item in ranked)):
        write_file(args.plot, search_svg(report, axes, probing,
                                         spec.rate_unit() if probing.by == "rate" else "clients"))
    if stopped:
        raise stopped
    unfit = [item for item in ranked if item.get("does_not_fit")]
    # One line for what the search could not answer: what does not fit, and whether anything met the slo.
    lines = [f"{len(unfit)} of {len(ranked)} deployments do not fit ({unfit[0]['does_not_fit']})"
             if len(ranked) > 1 else f"the deployment does not fit ({unfit[0]['does_not_fit']})"] if unfit else []
    if not chosen and len(unfit) < len(ranked):    # the question had no answer: no load, or not this one
        absorbed = [item["burst"]["best"]["load"] for item in ranked if (item.get("burst") or {}).get("best")]
        unit = spec.rate_unit() if by == "rate" else "client" if target == 1 else "clients"
        lines.append("no deployment meets the slo " + (f"at {target:g} {unit}"
                     if target is not None else "at a sustained load" if absorbed else "at any load tried")
                     + (f" (played once, the trace meets it up to {max(absorbed):.4g} req/s)" if absorbed else "")
                     + ("; --confirm has no load to send" if args.confirm else ""))
    if lines:
        sys.stderr.write(f"servesim: {'; '.join(lines)}\n")
    if confirmed:
        raise confirmed
    if report.get("confirm"):
        measured = report["confirm"]["measured"]
        if measured["failed"]:
            kinds = ", ".join(f"{n:,} x {kind}" for kind, n in Counter(measured["errors_by_kind"]).most_common(3))
            sys.stderr.write(f"servesim: {measured['failed']:,} of {measured['completed'] + measured['failed']:,} "
                             f"confirm requests failed ({kinds})\n")
            return 1
    return 0 if chosen else 1


def load_from_args(args) -> LoadConfig:
    """The load run the flags describe, with loadgen's rules across flags."""
    given = settings_from_args(LoadConfig, args)
    trace = given.get("trace")
    if given.get("prompts") and ("prompt_words" in given or "prefix_words" in given):
        raise UserError("--prompts FILE brings its own prompts; drop --prompt-tokens and --prefix-tokens")
    if trace and ({"prompts", "prompt_words", "prefix_words", "rate", "max_tokens"} & set(given)
                  or given.get("turns", 1) > 1):
        raise UserError("--trace brings its own send times, prompts and output lengths; drop --rate, --prompts, "
                        "--prompt-tokens, --prefix-tokens, --turns and --max-tokens (--time-scale speeds it up)")
    profile = given.get("rate_profile")
    if profile and ({"rate", "ramp_up"} & set(given) or trace):
        raise UserError("--rate-profile sets the arrivals: drop --rate, --trace and the ramp")
    if "time_scale" in given and not (trace or profile):
        raise UserError("--time-scale stretches a --trace's or a --rate-profile's times; without either use --rate")
    if given.get("think_time_s") and given.get("turns", 1) == 1:
        raise UserError("--think-time is the pause between a conversation's turns: add --turns N")
    if given.get("turns", 1) > 1 and given.get("prompts"):
        raise UserError("--turns builds the conversation from generated messages; drop --prompts")
    if given.get("ramp_up") and "requests" not in given:
        raise UserError("a ramp runs over a number of requests: add --requests N")
    if given.get("ramp_up") and (given.get("rate") or given.get("concurrency") or trace):
        raise UserError("a ramp sets the arrival rate itself: drop --rate, --concurrency and --trace")
    if given.get("ramp_up") and given["ramp_up"][1] > given["ramp_up"][2]:
        raise UserError("--ramp-up-start-rps must not exceed --ramp-up-end-rps")
    if given.get("burstiness", 1) != 1 and not (given.get("ramp_up") or given.get("rate") or profile):
        raise UserError("--burstiness shapes the gaps of open-loop arrivals: add --rate R (or a ramp)")
    open_loop = bool(given.get("rate") or given.get("ramp_up") or trace or profile)
    if given.get("shard") and not open_loop:
        raise UserError("--shard splits an open-loop schedule (--rate, a ramp, --rate-profile or --trace); a closed "
                        "loop has none to split: run each machine with its share of --concurrency instead")
    if given.get("shard") and "start_at" not in given:
        raise UserError("--shard needs --start-at UNIX_TIME, the same on every machine, so the shares start together")
    if "start_at" in given:
        check_start(given["start_at"])
        # Every shard builds the same prompts: a content run is the same text on every machine.
        given["run_id"] = hashlib.sha256(f"{given['start_at']!r}".encode()).hexdigest()[:6]
    if "requests" not in given:
        given["requests"] = None if "duration_s" in given or profile else len(trace.rows) if trace else 64
    if given.get("warmup") and given["requests"] is not None and \
            given["warmup"] >= min(given["requests"], len(trace.rows) if trace else given["requests"]):
        raise UserError(f"--warmup {given['warmup']:,} leaves no request to measure: send more --requests")
    # Generated prompts, the default 40 tokens included, are sized to the tokens asked.
    given["size_prompts"] = given.get("size_prompts", True) and not given.get("prompts")
    if given.get("prompts"):
        given["prompts"] = read_prompts(given["prompts"])
    if "slos" in given:
        given["slos"] = dict(given["slos"])
    if "concurrency" not in given and not open_loop:
        given["concurrency"] = 1
    given["api_key"] = given.get("api_key") or os.environ.get("OPENAI_API_KEY")
    given["timeline"] = bool(args.timeline or args.plot)
    return LoadConfig(**given)


def open_files(config: LoadConfig) -> None:
    """Room for a connection a client: the soft limit on open files raised toward the hard one if
    --concurrency needs it (the shell's default of 256 or 1,024 is below many runs'), else a
    one-line error before the run. Each failure past it would read as the server's ("connection:
    Too many open files"). An open loop without --concurrency has no bound to check."""
    try:
        import resource       # (Unix only: elsewhere the run finds out as it goes)
    except ImportError:
        return
    clients = config.concurrency or (0 if config.rate or config.trace or config.rate_profile or config.ramp_up else 1)
    if not clients:
        return
    need = min(clients, config.requests or clients) + OPEN_FILES_SPARE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if need <= soft or soft == resource.RLIM_INFINITY:
        return
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard) if hard != resource.RLIM_INFINITY else need, hard))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft != resource.RLIM_INFINITY and need > soft:
        raise UserError(f"--concurrency {clients:,} needs about {need:,} open files (a connection a client, "
                        f"and {OPEN_FILES_SPARE} more), and this process may open {soft:,} (ulimit -n, at most "
                        f"{hard:,} here): raise it, or lower --concurrency")


OPEN_FILES_SPARE = 16        # files a run opens besides its connections: scrapes, the interpreter's own


def cmd_loadgen(args) -> int:
    config = load_from_args(args)
    for path, flag in ((args.timeline, "--timeline"), (args.plot, "--plot")):
        if path:
            check_writable(path, flag, args)
    # Only these rows: loadgen's own flags (--model: the served model's name) share names with RunSpec's.
    simulated_as = {name: value for name, value in ((n, read_setting(args, SETTINGS[n])) for n in SIMULATED_AS)
                    if value is not None}
    if simulated_as and not args.simulate:
        flag = SETTINGS[next(iter(simulated_as))].metadata["flag"]
        raise UserError(f"{flag} sets up the simulation beside the run: add --simulate HARDWARE MODEL")
    if args.simulate:
        # Resolve the presets (and an engine profile file) before the run, so a typo costs nothing.
        hardware = load_preset("hardware", args.simulate[0], HARDWARE, Hardware, "--simulate")
        model = load_preset("model", args.simulate[1], MODELS, ModelSpec, "--simulate")
        simulated_as = with_engine_profile(simulated_as)
        if model.weight_bytes > hardware.memory_gib * GIB:    # whatever cache the server reports, no simulation
            raise CapacityError(f"--simulate: {model.name}'s weights ({model.weight_bytes / 1e9:,.1f} GB) do not fit in "
                                f"one {hardware.name} ({hardware.memory_gib:g} GiB), the device the run beside this one "
                                f"would simulate; nothing was sent")
    open_files(config)
    result, records, stopped = run_load(config, Progress("loadgen"))     # returns with signals held
    if args.simulate and not stopped:
        try:        # Ctrl-C or SIGTERM here costs the side by side, never the report
            hold_signals(False)
            result["side_by_side"] = beside_the_run(config, {**result, **detailed_arrays(records)}, hardware, model,
                                                    simulated_as)
        except (KeyboardInterrupt, Terminated) as e:
            stopped = Stopped.by_signal(e, "the run had ended, during --simulate; the report has no side by side")
        hold_signals()
    timeline = result.pop("timeline", None)
    # Each request's place in the schedule: merge checks that shards together sent it once.
    arrays = {**detailed_arrays(records), "indices": [r.index for r in records],
              "scheduled_times": [r.scheduled_s for r in records],
              **({"warmup_flags": [not r.measured for r in records]} if config.warmup else {})}
    if args.json or args.detailed:
        write_json({**result, **arrays} if args.detailed else result)
    else:
        out = io.StringIO()
        print_run(result, out)
        beside = result.get("side_by_side")
        if beside and beside.get("problem"):
            out.write(f"{'side by side':<14}{beside['problem']}\n")
        elif beside:
            print_compared(beside["title"], beside["rows"], out.write)
        write_text(out.getvalue())
    if timeline is not None:      # after the report, so a failed write loses nothing measured
        write_timeline(args, result["config"]["title"], timeline)
    if stopped:
        raise stopped
    return failed_exit([result])


def cmd_merge(args) -> int:
    reports = [(path, parse_json(read_text(path, "report"), f"report {path}", "pass loadgen --detailed reports"))
               for path in args.reports]
    result, requests, notes = merge_reports(reports, dict(args.goodput) if args.goodput else None)
    for note in notes:
        sys.stderr.write(f"servesim: {note}\n")
    if args.json or args.detailed:
        write_json({**result, **detailed_arrays(requests)} if args.detailed else result)
    else:
        out = io.StringIO()
        print_run(result, out)
        write_text(out.getvalue())
    return failed_exit([result])


def cmd_compare(args) -> int:
    if args.timeline:
        check_writable(args.timeline, "--timeline", args)
    measured = read_run(args.run)
    given = with_engine_profile(settings_from_args(RunSpec, args))
    spec = recorded_spec(measured, given)
    # A block count the run recorded (meta.json, a vLLM server's cache gauge) is the run's, not a flag's.
    blocks = spec.num_gpu_blocks if "num_gpu_blocks" not in given and "num_gpu_blocks" in measured.settings else None
    recorded = lambda text: text.replace(f"--num-gpu-blocks {blocks:,} leaves", f"the run's recorded {blocks:,} KV "
                                         f"blocks leave", 1) if blocks else text
    try:
        compared = compare_run(measured, spec, timeline=bool(args.timeline))
    except CapacityError as e:
        if blocks and "from --num-gpu-blocks" in str(e):    # a measured run ran: its files contradict the device
            raise UserError(f"run {measured.name}: its recorded {blocks:,} KV blocks cannot have run on "
                            f"{spec.hardware.name} ({e}); check the run's files, or pass --hardware the device it "
                            f"ran on") from None
        raise
    simulated = compared["servesim"]
    if simulated["config"].get("kv_plan_note") and not measured.simulated_cache:
        sys.stderr.write(f"servesim: {recorded(simulated['config']['kv_plan_note'])}\n")
    failures = measured_failures(measured)
    for note in measured.notes + ([failures] if failures else []):
        sys.stderr.write(f"servesim: {measured.name}: {note}\n")
    if simulated["failed"]:
        kinds = "; ".join(f"{n:,} x {kind}" for kind, n in simulated["errors_by_kind"].items())
        sys.stderr.write(f"servesim: {simulated['failed']:,} of {simulated['completed'] + simulated['failed']:,} "
                         f"simulated requests failed ({kinds}): servesim's figures are of the rest; check the "
                         f"settings against the server's\n")
    timeline = simulated.pop("timeline", None)
    if args.json:
        write_json(compared)
    else:
        out = io.StringIO()
        print_compared(compared["title"], compared["rows"], out.write)
        write_text(out.getvalue())
    if args.timeline:        # after the report, so a failed write loses nothing
        write_file(args.timeline, timeline_csv(timeline))
    return 0


def compare_mode(text: str) -> str:
    if text not in COMPARE_MODES:
        raise argparse.ArgumentTypeError(f"unknown mode {text!r}: use static, slots or paged")
    return text


def cmd_validate(args) -> int:
    report = validate(args.corpus, args.cost_model or DEFAULT_COST_MODEL, args.jobs, Progress("validate"))
    for result in report["runs"]:
        for note in result["notes"]:
            sys.stderr.write(f"servesim: {result['name']}: {note}\n")
    if args.json:
        write_json(report)
    else:
        out = io.StringIO()
        print_validation(report, out.write)
        write_text(out.getvalue())
    return 0


CALIBRATION_MISS = 0.25      # a fit that misses a measured step by more is not a calibration


def cmd_calibrate(args) -> int:
    if args.fit == "hardware" and (args.engine or args.async_scheduling is not None):
        raise UserError("--engine and --async-scheduling describe the engine --fit engine fits; the hardware fit "
                        "prices on the roofline, which has no engine costs: add --fit engine, or drop them")
    found, named, seqs = [], {"model": set(), "hardware": set(), "engine": set(), "async": set()}, set()
    seen: dict[str, str] = {}        # each report's content -> the file it came from
    for path in args.reports:
        loaded = parse_json(read_text(path, "report"), f"report {path}", "pass loadgen --json or simulate --json output")
        if loaded == []:
            raise UserError(f"report {path}: holds no reports (an empty list)")
        for report in loaded if isinstance(loaded, list) else [loaded]:
            if not isinstance(report, dict) or "median_tpot_ms" not in report:
                raise UserError(f"report {path}: not a loadgen --json or simulate --json report")
            mark = json.dumps(report, sort_keys=True)
            if mark in seen:      # its steps would weigh twice in the fit
                raise UserError(f"report {path} is the same run as {seen[mark]}: pass each run once")
            seen[mark] = path
            found += observations(check_report(report, f"report {path}"), os.path.basename(path))
            if report.get("failed"):        # as compare says it: the figures are of the requests that ended
                sys.stderr.write(f"servesim: report {path}: {report['failed']:,.0f} of "
                                 f"{report['failed'] + report.get('completed', 0):,.0f} requests failed; its figures, "
                                 f"and the fit, are of the rest\n")
            config = report.get("config") or {}
            config_names(config, ("model", "hardware", "engine", "engine_base"), f"report {path}")
            # vllm bench serve names the model by its Hugging Face id.
            hub = report.get("model_id")
            named["model"].add(config.get("model") or (KNOWN_MODELS.get(hub.lower(), hub) if isinstance(hub, str) else None))
            named["hardware"].add(config.get("hardware"))
            # An engine profile file's run names the profile and the engine whose rules it kept.
            engine = config.get("engine_base") or config.get("engine")
            if engine is not None and engine not in ENGINES and args.fit == "engine" and not args.engine:
                raise UserError(f"report {path} ran engine {printable(engine[:60])!r}, which has no profile here; "
                                f"pass --engine ({', '.join(ENGINES)} or a profile file)")
            named["engine"].add(engine)
            named["async"].add(config.get("async_scheduling") if isinstance(config.get("async_scheduling"), bool) else None)
            seqs.add(config.get("max_num_seqs"))

    def listed(kind: str) -> str:
        return ", ".join(sorted(printable(str(n)[:60]) for n in named[kind] - {None})
                         + ["one that names none"] * (None in named[kind]))

    def preset(kind: str, given: Optional[str], presets: dict, cls):
        if given:
            chosen = load_preset(kind, given, presets, cls)
            if named[kind] - {None, chosen.name}:
                sys.stderr.write(f"servesim: --{kind} {chosen.name}, but the reports ran {listed(kind)}: the fit is of "
                                 f"these runs priced as {chosen.name}\n")
            return chosen
        names = named[kind]
        if len(names) == 1 and next(iter(names)) in presets:
            return presets[next(iter(names))]
        raise UserError(f"the reports do not name one {kind} preset ({listed(kind)}); pass --{kind}")

    model = preset("model", args.model, MODELS, ModelSpec)
    shapes = len({(o.tokens, o.context, o.seqs) for o in found})
    if shapes < 3:
        raise UserError(f"only {shapes} different measured steps in these reports; calibrate needs three: pass a "
                        f"concurrency-1 run (its TPOT and TTFT) and a run near the knee (its TPOT)")
    if args.out:
        check_writable(args.out, "--out", args)
    if args.fit == "engine":
        hardware = preset("hardware", args.hardware, HARDWARE, Hardware)
        ran = named["engine"] - {None}
        if len(ran) > 1 and not args.engine:
            raise UserError(f"the reports ran different engines ({', '.join(sorted(ran))}): fit one engine's runs, "
                            f"or pass --engine")
        base = read_engine_profile(args.engine) if args.engine and args.engine not in ENGINES else \
            ENGINES[args.engine or next(iter(ran), "vllm")]
        overlap = args.async_scheduling
        if overlap is None and len(named["async"]) == 1 and None not in named["async"]:
            overlap = next(iter(named["async"]))       # as the runs recorded it
        if overlap is not None:
            base = replace(base, overlap=overlap)
        most = max((n for n in seqs if isinstance(n, int) and not isinstance(n, bool) and n > 0), default=256)
        fitted, errors, kept = calibrate_engine(found, model, hardware, base, most,
                                                args.name or f"{base.name}-{hardware.name}-calibrated")
    else:
        # The device the reports name, where they name one preset (simulate's do; a real server's do
        # not): an H100's runs fitted from a 4-core CPU's memory and links would keep those.
        ran = named["hardware"] - {None}
        if not args.hardware and ran and (len(ran) > 1 or not ran <= HARDWARE.keys()):
            raise UserError(f"the reports name {listed('hardware')}, not one preset: pass --hardware, the device "
                            f"they ran on (the preset whose memory, links and price the fit keeps)")
        base = preset("hardware", args.hardware, HARDWARE, Hardware) if args.hardware else \
            HARDWARE[next(iter(ran))] if ran else HARDWARE["cpu-4vcpu"]
        fitted, errors, kept = calibrate(found, model, base, args.name or f"{base.name}-calibrated")
    worst = max(range(len(found)), key=lambda i: abs(errors[i]))
    if abs(errors[worst]) > CALIBRATION_MISS:
        what = f"one engine's costs on {hardware.name}" if args.fit == "engine" else f"one roofline on {base.name}"
        raise CapacityError(f"the best fit still misses {found[worst].label} by {errors[worst]:+.0%}: these runs do not "
                            f"fit {what}; pass --hardware the device they ran on (and check --model), nothing written")
    fit = ", ".join(f"{o.label} {e:+.1%}" for o, e in zip(found, errors))
    figures = lambda texts: ", ".join(text + (f" ({base.name}'s, kept: {kept[key]})" if key in kept else "")
                                      for key, text in texts.items())
    if args.fit == "engine":
        problem = engine_field_problem(asdict(fitted))
        if problem:
            raise CapacityError(f"the fit is no profile: {problem}; check --hardware and --model are what the runs "
                                f"ran; nothing written")
        source = (f"calibrate --fit engine on {', '.join(os.path.basename(p) for p in args.reports)}: "
                  f"{hardware.name}, {model.name}, kernel cost model; fit: {fit}")
        written = engine_profile_json(fitted, printable(source[:2000]))
        shown = figures({"kernel_scale": f"kernel scale {fitted.kernel_scale:.3g}",
                         "step_cpu_ms": f"{fitted.step_cpu_ms:.3g} ms per step",
                         "seq_cpu_ms": f"{fitted.seq_cpu_ms:.3g} ms per sequence"})
        summary = (f"calibrated engine {printable(fitted.name)} ({written['base']}'s rules, async scheduling "
                   f"{'on' if fitted.overlap else 'off'}) on {hardware.name} for {model.name}: {shown}; fit: {fit}")
    else:
        written = asdict(fitted)
        # What --hardware would refuse is no device: reports whose token counts no run had, say.
        outside = next((f"{name} {value:,.4g} is outside {low:g} to {high:,g}" for name, value in written.items()
                        if name in PRESET_RANGES and isinstance(value, (int, float)) and not isinstance(value, bool)
                        for low, high, _ in [PRESET_RANGES[name]] if not low <= value <= high), None)
        if outside:
            raise CapacityError(f"the fit is no device a hardware file can hold: {outside}; check the reports' token "
                                f"counts and that --model is what they ran; nothing written")
        shown = figures({"bandwidth": f"{fitted.bandwidth_gbs:.2f} GB/s", "tflops": f"{fitted.tflops:.4g} TFLOPS"})
        knee = "" if kept else (f", so compute catches up with the weight read at "
                                f"~{knee_text(cost_model('roofline', fitted, model).critical_batch())} tokens per step")
        summary = (f"calibrated {printable(fitted.name)} for {model.name}: {shown}, {fitted.step_overhead_ms:.2f} ms per step "
                   f"+ {fitted.seq_overhead_ms:.2f} ms per sequence{knee}; fit: {fit}")
        beyond = [f"{what} {value:,.4g} is above {base.name}'s datasheet {peak:,.4g}"
                  for what, value, peak in (("bandwidth", fitted.bandwidth_gbs, base.bandwidth_gbs),
                                            ("TFLOPS", fitted.tflops, max(base.tflops, base.fp8_tflops or 0)))
                  if value > peak * 1.001]
        # A fit can land anywhere that prices the steps, but no GPU runs past its datasheet. (The CPU
        # preset's figures are a starting guess, not a datasheet: a fit is expected to move them.)
        if beyond and (base.kernel_floor_us > 0 or base.fp8_tflops):
            sys.stderr.write(f"servesim: the fit's {' and '.join(beyond)}: the runs' steps are priced faster than "
                             f"{base.name} can run them. A closed loop's TPOT counts the prefills decoding requests "
                             f"wait through, which the fit reads as decode steps; with prompts long against the "
                             f"outputs, fit runs with longer outputs, or pass --hardware the device they ran on\n")
    if args.out:
        write_file(args.out, json.dumps(written, indent=2) + "\n")
    else:
        write_json(written)
    (sys.stdout if args.out else sys.stderr).write(summary + (f"; wrote {args.out}" if args.out else "") + "\n")
    return 0


def cmd_explain(args) -> int:
    if args.table:
        extra = [*(["FILE"] if args.files else []), *(["--json"] if args.json else []),
                 *(["--server-flags"] if args.server_flags else []), *(["--hardware"] if args.hardware else []),
                 *(["--model"] if args.model else [])]
        if extra:
            raise UserError(f"--table prints the decision table alone, as markdown; drop {', '.join(extra)}")
        print(decision_table_markdown())
        return 0
    if not args.files:
        raise UserError("explain needs a FILE: a /metrics scrape, or a loadgen, simulate or sweep --json report")
    flags = server_flags(args.server_flags)
    if bool(args.hardware) != bool(args.model):
        raise UserError("--hardware and --model go together: the knee needs both")
    device = args.hardware and (load_preset("hardware", args.hardware, HARDWARE, Hardware),
                                load_preset("model", args.model, MODELS, ModelSpec))
    explanations = []
    for path in args.files:
        sig = read_signals(path)
        if device:
            device_figures(sig, cost_model("roofline", *device))
            if sig.ran_on and sig.ran_on != (device[0].name, device[1].name):
                sys.stderr.write(f"servesim: {sig.source}: --hardware {device[0].name} --model {device[1].name} "
                                 f"price the knee, where the report's run was {printable(' / '.join(sig.ran_on))}\n")
        elif sig.no_knee:
            sys.stderr.write(f"servesim: {sig.no_knee}\n")
        for key, value in flags.items():
            recorded = getattr(sig, key)
            slots = flags.get("max_seqs") or sig.max_seqs or 1
            rounded = key == "kv_tokens" and recorded == value // slots * slots     # llama.cpp's slots round it down
            if recorded is not None and recorded != value and not rounded and not sig.scrape:   # another server's?
                said = (lambda v: "on" if v else "off") if isinstance(value, bool) else (lambda v: f"{v:,}")
                sys.stderr.write(f"servesim: {sig.source}: --server-flags gives {SERVER_FLAG_WORDS[key]} {said(value)}, "
                                 f"where the report's run had {said(recorded)}: the flag's is used\n")
            setattr(sig, key, value)
        if sig.server == "llama.cpp" and "kv_tokens" in flags and sig.max_seqs:
            sig.kv_tokens = flags["kv_tokens"]       # --ctx-size is the whole cache, split over --parallel
        explanations.append(explain(sig))
    if args.json:
        write_json(explanations)
    else:
        for i, e in enumerate(explanations):
            if i:
                print()
            print_explanation(e, sys.stdout.write)
    return 0


def cmd_presets(args) -> int:
    if args.name:
        preset = HARDWARE.get(args.name) or MODELS.get(args.name)
        if preset is None:
            names = [*HARDWARE, *MODELS]
            near = difflib.get_close_matches(args.name.lower(), names, n=1, cutoff=0.5) or \
                [name for name in names if name.startswith(args.name.lower())][:1]
            raise UserError(f"unknown preset {args.name!r}" + (f" (did you mean {near[0]}?)" if near else "")
                            + f": use one of {', '.join(names)}")
        write_json(preset_fields(preset))      # the format --hardware FILE and --model FILE read
        return 0
    if args.json:
        write_json({"hardware": [preset_fields(h) for h in HARDWARE.values()],
                    "models": [preset_fields(m) for m in MODELS.values()]})
        return 0
    cells = [["hardware", "memory", "GB/s", "TFLOPS", "FP8", "mbu", "mfu", "step ms", "reserve", "link GB/s", "$/hour",
              "price from"]]
    for h in HARDWARE.values():
        cells.append([h.name, f"{h.memory_gib:.1f} GiB", f"{h.bandwidth_gbs:g}", f"{h.tflops:g}",
                      f"{h.fp8_tflops:g}" if h.fp8_tflops else "-", f"{h.mbu:g}", f"{h.mfu:g}", f"{h.step_overhead_ms:g}",
                      f"{h.reserve_gib:g} GiB", f"{h.interconnect_gbs:g}" if h.interconnect_gbs else "-",
                      f"{h.price_per_hour:.2f}" if h.price_per_hour else "-", PRICE_SOURCES.get(h.name, "-")])
    lines = table(cells) + [""]
    cells = [["model", "params", "active", "experts", "layers", "kv heads", "head dim", "bytes/param", "kv/token",
              "max len"]]
    for m in MODELS.values():
        cells.append([m.name, f"{m.params / 1e9:.3g} B", f"{m.active_params / 1e9:.3g} B" if m.experts else "all",
                      f"{m.experts_per_token} of {m.experts}" if m.experts else "-", f"{m.layers}", f"{m.kv_heads}",
                      f"{m.head_dim}", f"{m.weight_dtype_bytes:.4g}" + (f", experts {m.expert_dtype_bytes:.3g}"
                                                                       if m.expert_dtype_bytes else ""),
                      f"{m.kv_bytes_per_token / KIB:.1f} KiB", f"{m.max_position_embeddings:,}"])
    lines += table(cells)
    lines += ["", "Add your own: `main.py presets h100-sxm-80gb > my-gpu.json`, edit it, pass --hardware my-gpu.json "
                  "(or a model's name and --model)."]
    write_text("\n".join(lines))
    return 0


def result_name(text: str) -> str:
    """A name calibrate writes into a preset or profile file: as the file's reader will hold it."""
    if not text.strip() or len(text) > 200 or UNPRINTABLE.search(text) or text != text.strip():
        raise argparse.ArgumentTypeError(f"{printable(text)[:60]!r} is not a name a preset file takes: at most 200 "
                                         f"printable characters, none of them a line break, and no spaces around it")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="main.py", description=__doc__.split("\n\n")[0],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("capacity", help="the memory plan: weights, KV blocks, max concurrency, step cost",
                       description="Print the memory plan: weights, KV bytes per token, memory budget, KV blocks, "
                                   "max concurrency, the decode step at batch 1 and the batch where compute "
                                   "catches up with the weight read, plus vLLM's startup line for the same plan "
                                   "(with --engine vllm or none).")
    add_settings(p, [name for name, f in SETTINGS.items() if f.metadata["group"] == "plan"]
                 + ["data_parallel_size", "enable_expert_parallel", "engine", "speculative_tokens", "draft_model"])
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(func=cmd_capacity)

    p = sub.add_parser("simulate", help="simulate one run of a vLLM-style server",
                       description="Simulate a vLLM-style server on a virtual clock and report TTFT, TPOT, ITL, "
                                   "queue time, throughput, batch size, KV use, preemptions and prefix hits. "
                                   "Exit 1 if any request failed.")
    add_settings(p, SETTINGS)
    add_seed_args(p.add_argument_group("confidence"))
    add_report_args(p, "one JSON object with vllm bench serve's keys")
    add_picture_args(p, "the simulated server")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("sweep", help="simulate at several loads or settings, one table",
                       description="Run the same workload at every combination of up to two settings and print "
                                   "one row each. A flag whose help below says \"several comma-separated to sweep\" "
                                   "or \"on,off sweeps both\" takes a comma-separated list: most server flags (-tp "
                                   "1,2,4, --prefix-caching on,off, ...), --hardware (h100-sxm-80gb,a100-sxm-80gb), "
                                   "--router, --quantization, --kv-cache-dtype, --cost-model, --concurrency (closed "
                                   "loop, the default axis: 1,8,32,128,256) and --rate (Poisson); not --engine, "
                                   "whose defaults set the others. A list of one value is a fixed setting. "
                                   "--kv-link-gbs adds the "
                                   "colocated engine as the baseline and says below which bandwidth it wins on "
                                   "TTFT p95; --compare runs batching modes side by side. A point whose model "
                                   "does not fit is a row saying so. Exit 1 if any request failed or no point fits.")
    add_settings(p, SETTINGS, lists=True)
    add_seed_args(p.add_argument_group("confidence"))
    p.add_argument("--compare", type=list_of(compare_mode), metavar="MODE,...",
                   help="run the same workload through each of static, slots, paged (continuous batching "
                        "over a paged cache) and print one table with row utilisation and KV reserved "
                        "versus used (default: off)")
    p.add_argument("--gpus", type=whole(1, 4096), metavar="N",
                   help="every row on N GPUs: each -tp value runs as N/tp replicas (or each -dp value with "
                        "N/dp-way tensor parallelism), to compare the two at equal cost (default: off)")
    p.add_argument("--jobs", type=whole(1, 256), default=os.cpu_count() or 1, metavar="N",
                   help="run points, and each point's --seeds, in N processes; the output is the same as with 1 "
                        "(default: the number of cores, %(default)s here)")
    g = p.add_argument_group("output")
    g.add_argument("--plot", metavar="FILE.svg",
                   help="draw output tokens/s against TTFT and TPOT (p50 dashed, p95 solid) as SVG, one curve per "
                        "value of the axis that is not the load, each curve's knee ringed (default: off)")
    out = g.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="a JSON list, one simulate --json object per point")
    out.add_argument("--csv", action="store_true", help="CSV, one row per point, nested keys dotted")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("search", help="the highest load within an SLO, or the cheapest deployment that serves a load",
                       description="Without --rate or --concurrency: find the highest Poisson rate (or, with --load "
                                   "concurrency, the most clients; with a --trace, the rate its arrivals are scaled "
                                   "to) at which every --slo bound holds and the server keeps up, doubling then "
                                   "bisecting, then rechecking that rate with probes ten times as long (--recheck), "
                                   "each probe exactly the simulate run its rerun command shows. With --rate R (or --concurrency N): "
                                   "run every deployment of the grid the list flags describe (--hardware, -tp, -dp, "
                                   "--max-num-seqs, --quantization, ...) at that load and rank the ones that meet "
                                   "the SLO by cost; a deployment that does not fit is listed with the reason. Exit "
                                   "1 if no deployment fits, none meets the SLO, or a --confirm request failed.")
    add_settings(p, [name for name in SETTINGS if name not in ("rate", "concurrency")], lists=True)
    g = p.add_argument_group("search")
    g.add_argument("--rate", type=not_a_list(RATE, "--rate", "search ranks every deployment at one load; without "
                                             "it, it finds each one's highest"), metavar="R", dest="target_rate",
                   help="rank every deployment at R requests/s (with a --trace, its arrivals scaled to R) "
                        "(default: find each one's highest rate)")
    g.add_argument("--concurrency", type=not_a_list(CLIENTS, "--concurrency", "search ranks every deployment at "
                                                    "one load"), metavar="N", dest="target_concurrency",
                   help="rank every deployment at N closed-loop clients (default: find each one's highest rate)")
    g.add_argument("--slo", required=True, metavar="METRIC_STAT:MS,...", action="append",
                   help="the bounds every probe must meet, comma-separated: METRIC is ttft, tpot, itl, e2el, "
                        "queue or ttfa (time to the first answer token); STAT is mean, p50, p90, p95 or p99; "
                        "e.g. ttft_p95:500,tpot_p95:50; given twice, both's bounds (required)")
    g.add_argument("--load", choices=("rate", "concurrency"),
                   help="what the highest-load search varies (default: rate)")
    g.add_argument("--tolerance", type=real(1e-4, 1), metavar="F",
                   help="stop narrowing when the highest pass and lowest miss are within this share of each "
                        "other (clients: or 1 apart); the recheck's first steps down are this share too; not with "
                        f"--rate or --concurrency, which run once (default: {Probing.tolerance})")
    g.add_argument("--jobs", type=whole(1, 256), default=os.cpu_count() or 1, metavar="N",
                   help="search deployments (or, with fewer deployments, each probe's seeds) in N processes; the "
                        "output is the same as with 1 (default: the number of cores, %(default)s here)")
    add_probe_args(g)
    add_seed_args(g, search=True)
    g.add_argument("--confirm", metavar="URL",
                   help="then send one short loadgen run at the chosen load to this OpenAI-compatible server and "
                        "print measured against servesim on the same send times (default: off)")
    g.add_argument("--confirm-requests", type=whole(1, MAX_REQUESTS), metavar="N",
                   help=f"requests in the --confirm run (default: {CONFIRM_REQUESTS})")
    g.add_argument("--timeout", type=real(0, 86400), metavar="SECONDS",
                   help=f"in the --confirm run, the longest wait for a stream's next event before the request "
                        f"counts as failed (default: {CONFIRM_TIMEOUT_S:g})")
    out = p.add_argument_group("output")
    out.add_argument("--plot", metavar="FILE.svg",
                     help="draw the probes (load against the first SLO metric) or the deployments (cost against it, "
                          "with the Pareto front) as SVG (default: off)")
    fmt = out.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="one JSON object: the slo, and each deployment with every probe")
    fmt.add_argument("--csv", action="store_true", help="CSV, one row per probe, nested keys dotted")
    spread = p.add_argument_group("across machines")
    split = spread.add_mutually_exclusive_group()
    split.add_argument("--shard", type=shard_of, metavar="K/N",
                       help="search only the K-th of N slices of the deployment grid (every N-th deployment from the "
                            "K-th) and print that shard's JSON for --collect; seeds and probes as in the whole search "
                            "(default: the whole grid)")
    split.add_argument("--collect", nargs="+", metavar="SHARD.json",
                       help="put the N shard reports of this same search (the same flags) back together and print "
                            "what the whole search prints; runs nothing (default: off)")
    p.set_defaults(func=cmd_search)

    p = sub.add_parser("plan", help="replicas window by window over a day of traffic, as an autoscaler would run them",
                       description="For each window of a --rate-profile (or a --trace's arrivals, counted), find the "
                                   "fewest replicas whose sustained probe at that window's load meets every --slo "
                                   "bound; turn the needs into a schedule (a replica added serves after "
                                   "--scale-up-delay; fewer are asked for once the need has been lower for "
                                   "--scale-down-after); price it against a fleet sized for the peak; and simulate "
                                   "the whole period with it. --csv is a --replica-schedule simulate reads.")
    # (Not --requests: a plan is of the whole profile or trace, windows and the run that checks them.
    # Nor --enable-expert-parallel: it spreads one server's experts over a data-parallel group fixed
    # at launch, and a plan's replicas come and go. Nor --goodput: it judges by --slo.)
    add_settings(p, [name for name in SETTINGS if name not in ("rate", "concurrency", "data_parallel_size",
                                                               "replica_schedule", "requests",
                                                               "enable_expert_parallel", "goodput")])
    # Taken, so a user who tries one is told why it does not apply, but not offered in --help:
    # disaggregation (replicas of a prefill-decode pair are not modelled) and a ramp (the profile
    # or trace sets the arrivals).
    for action in p._actions:
        if {"--disaggregate", "--prefill-hardware", "--decode-hardware", "--kv-link-gbs", "--ramp-up-strategy",
                "--ramp-up-start-rps", "--ramp-up-end-rps"} & set(action.option_strings):
            action.help = argparse.SUPPRESS
    g = p.add_argument_group("plan")
    g.add_argument("--slo", required=True, metavar="METRIC_STAT:MS,...", action="append",
                   help="bounds each window's probe must meet, as search takes them, e.g. ttft_p95:2000,tpot_p50:50 "
                        "(required)")
    g.add_argument("--window", type=real(10, 86_400), default=900.0, metavar="S",
                   help="seconds a window lasts, each planned at its mean load; more than 10, at most 86,400 (a "
                        "day) (default: %(default)g, 15 minutes)")
    g.add_argument("--min-replicas", type=whole(1, 1024), default=1, metavar="N", help="never fewer (default: 1)")
    g.add_argument("--max-replicas", type=whole(1, 1024), default=16, metavar="N", help="never more (default: 16)")
    g.add_argument("--scale-down-after", type=real(0, 86_400, above_low=False), default=300.0, metavar="S",
                   help="ask for fewer replicas only once the need has been lower for S seconds, as Kubernetes' HPA "
                        "stabilises a scale-down (default: %(default)g)")
    g.add_argument("--ahead", action="store_true",
                   help="ask for each window's added replicas the scale-up delay before it starts, as a scheduled "
                        "scale-up does (default: off, at the window's start, as an autoscaler that follows load)")
    add_seed_args(g, search=True)
    g.add_argument("--no-verify", action="store_true",
                   help="skip simulating the whole period with the schedule (default: simulate it)")
    g.add_argument("--tolerance", type=real(1e-4, 1), default=0.05, metavar="F",
                   help="how close the one-replica capacity the first guesses start from is found (default: %(default)s)")
    add_probe_args(g, "the one-replica capacity", search=False)
    out = p.add_argument_group("output")
    out.add_argument("--plot", metavar="FILE.svg",
                     help="draw the load over the period and the replicas needed, asked for and serving (default: off)")
    fmt = out.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="one JSON object: every window, the schedule, the totals, "
                                                         "the whole-period simulation")
    fmt.add_argument("--csv", action="store_true", help="CSV, a row per window: time_s,replicas first, so simulate "
                                                        "--replica-schedule reads it")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("loadgen", help="measure the same metrics from a real OpenAI-compatible server",
                       description="Send streaming chat completions to an OpenAI-compatible server (llama.cpp, "
                                   "vLLM, SGLang), time every server-sent event as it arrives, and report TTFT, "
                                   "TPOT, ITL and throughput with the simulator's definitions, beside the "
                                   "server's own /metrics for the same window. Exit 1 if the server is "
                                   "unreachable or any request failed.")
    add_settings(p, [f.name for f in fields(LoadConfig) if f.metadata], owner=LoadConfig)
    p.add_argument("--simulate", nargs=2, metavar=("HARDWARE", "MODEL"),
                   help="after the run, simulate the same shape (clients, each request's measured lengths, "
                        "llama.cpp's slots and context from /props, vLLM's cache from /metrics) and print both "
                        "side by side (default: off)")
    add_settings(p, SIMULATED_AS, title="the simulation beside the run (with --simulate)")
    add_report_args(p, "one JSON object with vllm bench serve's keys, plus server, timings, client and config")
    add_picture_args(p, "the server (its /metrics gauges, sampled every --scrape-interval, and the client's own "
                        "token events)")
    p.set_defaults(func=cmd_loadgen)

    p = sub.add_parser("merge", help="combine loadgen --detailed reports from several client machines into one",
                       description="Put every request of several loadgen --detailed reports on one clock (each report "
                                   "says when it started on the wall clock; keep the machines' clocks synchronised), "
                                   "recompute the percentiles over all of them, and give throughput over the union "
                                   "of their windows: a load one machine cannot drive. Exit 1 if any request failed.")
    p.add_argument("reports", nargs="+", metavar="REPORT", help="loadgen --detailed reports (or vllm bench serve "
                                                                "--save-detailed results, put side by side at 0)")
    add_settings(p, ["goodput"])
    add_report_args(p, "one JSON object with vllm bench serve's keys")
    p.set_defaults(func=cmd_merge)

    p = sub.add_parser("compare", help="simulate a measured run's exact shape and print both side by side",
                       description="Read a measured run (a directory or requests.jsonl of vLLM's per-request stats with "
                                   "its meta.json and timeseries.csv; a loadgen --detailed report; or a vllm bench serve "
                                   "--save-result --save-detailed JSON), simulate the same requests sent at the same "
                                   "times on the engine the run recorded, and print measured against simulated: "
                                   "throughput, TTFT, TPOT, ITL and E2E percentiles, running, waiting and KV use, each "
                                   "with its error.")
    p.add_argument("run", metavar="RUN", help="the measured run: a directory, a .jsonl or a .json report")
    add_settings(p, [name for name, f in SETTINGS.items() if f.metadata["recorded"]], overrides=True)
    add_settings(p, ["cost_model", "engine", "async_scheduling", "goodput", "price_per_hour"])
    p.add_argument("--timeline", metavar="FILE",
                   help="write the simulated run's per-second stats as CSV in the shape vLLM logs them (t, "
                        "prompt_throughput, gen_throughput, running, waiting, kv_cache_pct), to lay over the real one "
                        "(default: off)")
    p.add_argument("--json", action="store_true", help="one JSON object: rows, measured and servesim reports")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("validate", help="replay every published run and score servesim on it, out of sample",
                       description="Replay each run of a corpus of published runs (a folder of sources, each a folder "
                                   "with a runs.json) on its engine, device and load, and print measured against "
                                   "predicted throughput, TPOT, TTFT and E2E with their errors, and whether it kept up, "
                                   "then the medians. The kernel model's one fitted constant (KERNEL_SCALE) is fitted "
                                   "leaving one source out: each source is scored with the fit from the others.")
    p.add_argument("corpus", nargs="?", default=CORPUS, metavar="FOLDER",
                   help="the corpus (default: the published runs committed with servesim, code/fixtures/published-runs)")
    add_settings(p, ["cost_model"])
    p.add_argument("--jobs", type=whole(1, 256), default=os.cpu_count() or 1, metavar="N",
                   help="replay runs in N processes; the output is the same as with 1 (default: the number of cores, "
                        "%(default)s here)")
    p.add_argument("--json", action="store_true", help="one JSON object: every run's figures, the fits and the medians")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("calibrate", help="fit the device's figures or the serving engine's costs to measured runs",
                       description="Fit effective bandwidth, TFLOPS, step overhead and per-sequence overhead (--fit "
                                   "hardware), or an engine's kernel scale and CPU work (--fit engine), to loadgen --json "
                                   "reports (or simulate --json, or vllm bench serve --save-result results of "
                                   "--max-concurrency runs): the TPOT of a concurrency-1 run (memory-bound), the "
                                   "TPOT of a run near the knee, and the TTFT of a concurrency-1 run (a prefill). "
                                   "Writes a hardware JSON that --hardware FILE reads, or an engine profile that "
                                   "--engine FILE reads.")
    p.add_argument("reports", nargs="+", metavar="REPORT", help="JSON reports, e.g. c1.json c4.json [c1-long-prompt.json]")
    p.add_argument("--fit", choices=("hardware", "engine"), default="hardware",
                   help="what to fit: hardware, the device's effective bandwidth, TFLOPS and overheads on the "
                        "roofline (writes a file for --hardware); or engine, the serving engine's kernel scale and "
                        "CPU work a step and per sequence on the kernel cost model, the device and model held at "
                        "their presets (writes a profile file for --engine) (default: %(default)s)")
    p.add_argument("--model", help="model preset name or JSON file the server ran (default: the one the reports name)")
    p.add_argument("--hardware",
                   help="--fit hardware: the preset whose memory, reserve, links and price the result keeps "
                        "(default: the one preset the reports name, else cpu-4vcpu when they name none); --fit "
                        "engine: the device the runs ran on (default: the one the reports name)")
    p.add_argument("--engine", type=engine_name, metavar="|".join(ENGINES) + "|FILE",
                   help="--fit engine: the engine whose rules, CUDA graphs and async scheduling the profile keeps and "
                        "whose costs a figure no measured step depends on keeps (default: the one the reports name, "
                        "else vllm)")
    p.add_argument("--async-scheduling", type=on_off, metavar="on|off", nargs="?", const=True,
                   help="--fit engine: whether the measured server overlapped its CPU work with the GPU's (vLLM's "
                        "flag, on from 0.14): a step then costs the slower of the two, else their sum (default: "
                        "the engine's)")
    p.add_argument("--name", type=result_name,
                   help="name of the result (default: the --hardware name + '-calibrated'; for an engine, "
                        "engine-hardware-calibrated)")
    p.add_argument("--out", metavar="FILE",
                   help="write the JSON here and the summary on stdout (default: JSON on stdout, summary on stderr)")
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("explain", help="diagnose a /metrics scrape or a loadgen, simulate or sweep report",
                       description="Apply the runbook's decision table (outputs/skill-llm-serving-tuning.md) to a "
                                   "Prometheus /metrics scrape, a loadgen --json report or a simulate/sweep --json "
                                   "report: which phase dominates latency, which budget binds, the capacity "
                                   "arithmetic, the single knob to change first with its expected effect, and "
                                   "what will not help.")
    p.add_argument("files", nargs="*", metavar="FILE", help="scrapes or JSON reports, each explained on its own "
                                                          "(required, but with --table)")
    p.add_argument("--server-flags", default="", metavar="FLAGS",
                   help="the server's own flags, e.g. \"--max-num-seqs 256 --max-num-batched-tokens 8192\" "
                        "or \"--parallel 4 --ctx-size 4096\" (default: none)")
    p.add_argument("--hardware", help="hardware preset or JSON (e.g. from calibrate) the server runs on, for the "
                                      "knee and the batch-1 step (default: from a simulate report, else unknown)")
    p.add_argument("--model", help="model preset or JSON the server runs; given with --hardware, as the knee needs "
                                   "both (default: from a simulate report, else unknown)")
    p.add_argument("--table", action="store_true", help="print the decision table as markdown, alone (default: off)")
    p.add_argument("--json", action="store_true", help="one JSON object per file, in a list (default: text)")
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("presets", help="list the hardware and model presets",
                       description="List the hardware and model presets with the figures the cost model uses, "
                                   "or print one as the JSON file --hardware FILE / --model FILE read.")
    p.add_argument("name", nargs="?", metavar="NAME",
                   help="print this preset as one JSON object, to save, edit and pass back (default: list them all)")
    p.add_argument("--json", action="store_true", help="print them all as JSON")
    p.set_defaults(func=cmd_presets)
    reword(sub.choices["search"], "--requests", "not used by a sustained probe, which sends what its steady window "
           "needs (--steady-requests), and repeats the whole of a --trace; with a --trace, the first N of it are "
           "what the burst search plays once (default: the whole trace)")
    reword(sub.choices["plan"], "--rate-profile", sub.choices["plan"]._option_string_actions["--rate-profile"].help
           .replace("; it sets the requests unless --requests caps them", ""))
    reword(sub.choices["capacity"], "--kv-offloading-size", sub.choices["capacity"]._option_string_actions[
           "--kv-offloading-size"].help.replace("; needs --prefix-caching", " (simulate needs --prefix-caching with it)"))
    plan = sub.choices["plan"]._option_string_actions     # plan sends what its windows' rates need, no --requests
    reword(sub.choices["plan"], "--steady-requests", plan["--steady-requests"].help
           .replace(", whatever --requests says,", ",").replace("so the answer does not move with --requests; ", ""))
    reword(sub.choices["plan"], "--turns", plan["--turns"].help.replace("; --requests counts requests", ""))
    reword(sub.choices["validate"], "--cost-model", sub.choices["validate"]._option_string_actions["--cost-model"].help
           .replace("; kernels with an --engine profile file, whose costs it prices", ""))   # (it takes no --engine)
    said_in_full(sub)
    return parser


def reword(p: argparse.ArgumentParser, flag: str, text: str) -> None:
    """A setting's help where one command uses it otherwise than the settings table says."""
    p._option_string_actions[flag].help = text


def said_in_full(sub) -> None:
    """Every flag's help ends with its default: a switch is off unless given, and a flag without a
    default is required."""
    for p in sub.choices.values():
        for action in p._actions:
            text = action.help
            if not action.option_strings or not text or text == argparse.SUPPRESS or "(default" in text \
                    or "(required" in text:
                continue
            if isinstance(action, argparse._StoreTrueAction):
                action.help = f"{text} (default: off)"
            elif action.required:
                action.help = f"{text} (required)"


def quiet_stdout() -> None:
    """After a failed write, point stdout at /dev/null so the exit flush cannot fail again."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def main(argv: Optional[list[str]] = None, program: bool = False) -> int:
    """The command line: one line on stderr for every error, the exit code returned. `program`:
    the process ends after this, so Ctrl-C and SIGTERM are ignored from then on (never a
    traceback or a death by the signal after the output is written)."""
    stops.update(held=False, noted=[])
    REPORTED["stdout"], args = False, None
    previous = {signum: signal.signal(signum, on_signal) for signum in SIGNAL_CODES} \
        if threading.current_thread() is threading.main_thread() else {}
    try:
        if sys.stdout is None:     # (`>&-`): found before a load is sent, not when its report is lost
            raise UserError("stdout is closed: give it somewhere to go (`>/dev/null`, or a file) before the run")
        args = build_parser().parse_args(argv)
        code = args.func(args)
        if stops["noted"]:          # arrived while the output was being written: it is whole
            first = stops["noted"][0]
            sys.stderr.write(f"servesim: {SIGNAL_WORDS[first]} after the output was written\n")
            return SIGNAL_CODES[first]
        return code
    except UserError as e:      # one line, whatever a file's name or a server's words held
        sys.stderr.write(f"servesim: {printable(hide_argv_secrets(str(e), argv))}\n")
        return 2
    except CapacityError as e:
        said = printable(hide_argv_secrets(str(e), argv))
        sys.stderr.write(f"servesim: {said}\n")
        if getattr(args, "json", False) and args.command in ANSWERS and not REPORTED["stdout"]:
            write_json({"error": said})
        return 1
    except Stopped as e:
        sys.stderr.write(f"servesim: {e.message}\n")
        return e.code
    except KeyboardInterrupt:
        sys.stderr.write("servesim: interrupted\n")
        return 130
    except Terminated:
        sys.stderr.write("servesim: terminated\n")
        return 143
    except BrokenPipeError:
        quiet_stdout()
        if getattr(args, "command", None) == "loadgen":    # what a real server was measured doing is lost
            sys.stderr.write("servesim: stdout was closed before the report was written whole (a pipe whose reader "
                             "ended): the run's report is lost; write it to a file (> report.json) instead\n")
            return 1
        return 0
    except OSError as e:   # the readers turn input errors into UserError: what is left is output
        quiet_stdout()
        sys.stderr.write(f"servesim: cannot write the output: {e.strerror or e}\n")
        return 1
    finally:
        for signum, handler in previous.items():
            # Ignored, not left to Python: the interpreter puts its own handlers back to the default
            # as it exits, so a signal arriving then would kill the process after the output.
            signal.signal(signum, signal.SIG_IGN if program else handler)


if __name__ == "__main__":
    PROGRAM = sys.argv[0] if sys.argv[0] and sys.argv[0] != "-c" else PROGRAM
    sys.exit(main(program=True))
