"""The configurations `toolkit tune` measures, and how one is applied to a ModelConfig.

In the spirit of Triton's Model Analyzer (its automatic brute search over max_batch_size and
instance count with dynamic batching on, then the batching knobs of the best), with what the
serverless targets change:

- Cloud Run (an instance serves many requests at once): stage 1 crosses `max_batch_size` with the
  instance count (dynamic batching on, no queue delay); stage 2 takes the best stage-1
  configuration within the latency budget and tries queue delays, with and without a preferred
  batch size equal to max_batch_size.
- AWS Lambda (an execution environment serves one request at a time, so the dynamic batcher never
  sees two requests together and extra instances never run): the knob that matters is the
  number of vCPUs, i.e. the memory setting. The sweep gives the runtime 1..N of this machine's
  CPUs (its CPU affinity: the CPUs stand in for vCPUs), one instance, no queue delay, at
  concurrency 1, for every backend.

Thread counts follow the runtime's CPU budget (handlers/cpu_budget.py), as they will where the
model is deployed: every candidate but the baseline drops the config's explicit
intra_op_thread_count, so each instance gets its share of the CPUs the runtime is given (Cloud
Run: CPUs / instances; Lambda: all the vCPUs), and the tuned config leaves it unset too. The
user's own configuration is always measured too (the baseline, explicit counts and all).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from google.protobuf.message import Message

from ..repository.model_config import ModelConfig, ModelInstanceGroup

INTRA_OP = "intra_op_thread_count"
CLOUD_RUN = "cloudrun"
LAMBDA = "lambda"


@dataclass(frozen=True)
class Candidate:
    max_batch_size: int
    dynamic_batching: bool
    instance_count: int
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int = 0
    intra_op_threads: int | None = None  # None: as configured, or the CPU budget's with `budget`
    baseline: bool = False  # the user's configuration as it is
    cpus: int | None = None  # CPUs the runtime is given (Lambda: vCPUs); None: all of this machine's
    budget: bool = False  # threads from the runtime's CPU budget (explicit intra-op counts dropped)

    @property
    def budget_threads(self) -> int | None:
        """Threads per instance the runtime's CPU budget gives this candidate (one model)."""
        if not self.budget or self.cpus is None:
            return None
        return max(1, self.cpus // max(1, self.instance_count))

    def label(self) -> str:
        if not self.dynamic_batching:
            batching = "no dynamic batching"
        else:
            batching = f"delay {self.max_queue_delay_us} us"
            if self.preferred_batch_sizes:
                batching += f", preferred {list(self.preferred_batch_sizes)}"
        parts = [f"max_batch_size {self.max_batch_size}", batching, f"{self.instance_count} instance(s)"]
        if self.intra_op_threads is not None:
            parts.append(f"{self.intra_op_threads} intra-op thread(s)")
        elif self.budget_threads is not None:
            parts.append(f"{self.cpus} CPU(s): {self.budget_threads} thread(s) per instance (CPU budget)")
        return ("baseline: " if self.baseline else "") + ", ".join(parts)


def _kind(config: Message) -> str:
    kinds = {ModelInstanceGroup.Kind.Name(group.kind) for group in config.instance_group}
    return "KIND_GPU" if "KIND_GPU" in kinds else "KIND_CPU"


def baseline(config: Message) -> Candidate:
    """The compiled (auto-completed, normalised) configuration as a candidate."""
    threads = config.parameters[INTRA_OP].string_value if INTRA_OP in config.parameters else None
    return Candidate(
        max_batch_size=config.max_batch_size,
        dynamic_batching=config.HasField("dynamic_batching"),
        instance_count=sum(group.count for group in config.instance_group) or 1,
        preferred_batch_sizes=tuple(config.dynamic_batching.preferred_batch_size),
        max_queue_delay_us=config.dynamic_batching.max_queue_delay_microseconds,
        intra_op_threads=int(threads) if threads and threads.isdigit() else None,
        baseline=True,
    )


def apply(candidate: Candidate, config: Message, *, batching: bool | None = None,
          device_kind: str | None = None) -> Message:
    """A copy of `config` with the candidate's fields; everything else is kept (other
    dynamic_batching fields such as priorities, other parameters, ...). `batching`: whether the
    model batches (default: config.max_batch_size > 0; give it for a config.pbtxt that leaves
    max_batch_size to auto-complete)."""
    tuned = ModelConfig()
    tuned.CopyFrom(config)
    if candidate.baseline:
        return tuned
    if batching is None:
        batching = config.max_batch_size > 0
    if batching:
        tuned.max_batch_size = candidate.max_batch_size
    if candidate.dynamic_batching and batching:
        batching = tuned.dynamic_batching
        del batching.preferred_batch_size[:]
        batching.preferred_batch_size.extend(candidate.preferred_batch_sizes)
        batching.max_queue_delay_microseconds = candidate.max_queue_delay_us
        if not candidate.preferred_batch_sizes and not batching.ListFields():
            tuned.dynamic_batching.SetInParent()  # `dynamic_batching { }`
    else:
        tuned.ClearField("dynamic_batching")
    kind = device_kind or _kind(config)
    del tuned.instance_group[:]
    group = tuned.instance_group.add()
    group.count = candidate.instance_count
    group.kind = ModelInstanceGroup.Kind.Value(kind)
    if candidate.intra_op_threads is not None:
        tuned.parameters[INTRA_OP].string_value = str(candidate.intra_op_threads)
    elif candidate.budget and INTRA_OP in tuned.parameters:
        del tuned.parameters[INTRA_OP]  # the runtime's CPU budget decides
    return tuned


def _powers_of_two(limit: int) -> list[int]:
    values, value = [], 1
    while value <= limit:
        values.append(value)
        value *= 2
    return values


def default_max_batch_sizes(config: Message) -> list[int]:
    """Powers of two from 4 to 32, plus the configured size (a non-batching model: 0 only)."""
    if config.max_batch_size <= 0:
        return [0]
    return sorted({4, 8, 16, 32, config.max_batch_size})


def default_instance_counts(cores: int) -> list[int]:
    return list(range(1, max(1, min(4, cores)) + 1))


def stage_one(config: Message, max_batch_sizes: list[int], instance_counts: list[int],
              cpus: int | None = None) -> list[Candidate]:
    batching = config.max_batch_size > 0
    return [
        Candidate(max_batch_size=size, dynamic_batching=batching, instance_count=count, cpus=cpus, budget=True)
        for size in (max_batch_sizes if batching else [0])
        for count in instance_counts
    ]


def stage_two(best: Candidate, queue_delays_us: list[int]) -> list[Candidate]:
    """Queue delays for the best stage-1 configuration, each without and with a preferred batch
    size of max_batch_size (preferred sizes only matter when the batcher may wait)."""
    if not best.dynamic_batching:
        return []
    found = []
    for delay in sorted(d for d in queue_delays_us if d > 0):
        found.append(replace(best, max_queue_delay_us=delay, preferred_batch_sizes=(), baseline=False))
        found.append(replace(best, max_queue_delay_us=delay, preferred_batch_sizes=(best.max_batch_size,),
                             baseline=False))
    return found


def lambda_candidates(config: Message, cores: int) -> list[Candidate]:
    """One instance, no queue delay, on 1..cores CPUs (vCPUs); threads from the CPU budget."""
    return [
        Candidate(max_batch_size=config.max_batch_size, dynamic_batching=config.HasField("dynamic_batching"),
                  instance_count=1, preferred_batch_sizes=tuple(config.dynamic_batching.preferred_batch_size),
                  max_queue_delay_us=0, cpus=count, budget=True)
        for count in range(1, max(1, cores) + 1)
    ]
