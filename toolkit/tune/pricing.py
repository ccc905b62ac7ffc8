"""Serverless prices (documented constants with their date) and the cost of a million inferences.

Costs are estimated only for hardware that was measured: this machine's CPUs stand in for Lambda
vCPUs or a Cloud Run instance's vCPUs; a GPU figure is given only when the instances ran on a GPU.
The prices are list prices without free tiers, savings plans or committed-use discounts, for the
cheapest region tier. Check the providers' pages before relying on them; update them here (and the
date) when they change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

PRICES_AS_OF = "2025-06"

# AWS Lambda, x86_64, US East (N. Virginia); https://aws.amazon.com/lambda/pricing/
LAMBDA_GB_SECOND_USD = 0.0000166667
LAMBDA_REQUEST_USD = 0.20 / 1_000_000
LAMBDA_MB_PER_VCPU = 1769  # Lambda gives a function one full vCPU at 1,769 MB of memory
LAMBDA_MAX_MB = 10240  # 6 vCPUs
LAMBDA_BILLING_MS = 1  # duration is rounded up to the next millisecond

# Google Cloud Run services, request-based billing ("CPU only allocated during request
# processing"), Tier 1 regions; https://cloud.google.com/run/pricing
CLOUD_RUN_VCPU_SECOND_USD = 0.000024
CLOUD_RUN_GIB_SECOND_USD = 0.0000025
CLOUD_RUN_REQUEST_USD = 0.40 / 1_000_000
# Cloud Run GPU (NVIDIA L4, instance-based billing, without zonal redundancy, Tier 1); used only
# when the measured instances ran on a GPU, and only meaningful if that GPU is an L4.
CLOUD_RUN_L4_GPU_SECOND_USD = 0.0001867


@dataclass(frozen=True)
class Cost:
    usd_per_million: float
    basis: str  # how it was computed, for the report


def lambda_memory_mb(vcpus: int) -> int:
    """The memory setting that gives a Lambda function `vcpus` full vCPUs."""
    return min(LAMBDA_MAX_MB, LAMBDA_MB_PER_VCPU * max(1, vcpus))


def lambda_cost(latency_ms: float, batch: int, vcpus: int) -> Cost:
    """One Lambda execution environment serves one request at a time: each request is billed its
    duration (rounded up to the millisecond) at the memory that gives `vcpus` vCPUs."""
    memory_mb = lambda_memory_mb(vcpus)
    billed_ms = math.ceil(latency_ms / LAMBDA_BILLING_MS) * LAMBDA_BILLING_MS
    per_request = billed_ms / 1000 * memory_mb / 1024 * LAMBDA_GB_SECOND_USD + LAMBDA_REQUEST_USD
    per_million = per_request / batch * 1_000_000
    return Cost(per_million, f"Lambda x86 {memory_mb} MB ({vcpus} vCPU), {billed_ms} ms billed per request of "
                             f"batch {batch}, prices of {PRICES_AS_OF}")


def cloud_run_cost(throughput: float, batch: int, vcpus: int, memory_gib: float, gpu: bool = False) -> Cost:
    """A Cloud Run instance kept busy at `throughput` inferences/s: its vCPU (+ memory, + GPU)
    seconds per inference, plus the request fee per request of `batch` inferences."""
    per_second = vcpus * CLOUD_RUN_VCPU_SECOND_USD + memory_gib * CLOUD_RUN_GIB_SECOND_USD
    if gpu:
        per_second += CLOUD_RUN_L4_GPU_SECOND_USD
    per_million = 1_000_000 / throughput * per_second + 1_000_000 / batch * CLOUD_RUN_REQUEST_USD
    what = f"{vcpus} vCPU, {memory_gib:g} GiB" + (", 1 L4 GPU" if gpu else "")
    return Cost(per_million, f"Cloud Run ({what}) busy at {throughput:.1f} infer/s, prices of {PRICES_AS_OF}")
