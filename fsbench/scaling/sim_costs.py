"""What the simulator charges (fsbench.scaling.simulate): per-sample encoder cost, the
table step, co-run and time-sharing factors, each trainer's measured step overhead and the
collectives' alpha-beta times on one cluster (`Costs`); and the expected numbers of
distinct and of freshly updated embedding rows under the workload's Zipf popularity."""
from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np

from fsbench.config import WorkloadConfig
from fsbench.errors import ConfigError
from fsbench.scaling.sim_inputs import Cluster

# worker_ms: the rank's loader worker's CPU per step (its own process: in none of the
# others) beyond stage_ms, its planning and routing at 1 rank, which the simulator times at
# the simulated size instead. Fits from before worker_ms lack it and read 0; fits from
# before stage_ms hold the worker's whole CPU (`Costs.worker_excludes_stage`).
OVERHEAD_KEYS = ("wall_ms", "cpu_ms", "busy_ms", "input_ms", "worker_ms", "stage_ms")


def encoder_flops(workload: WorkloadConfig, lengths: np.ndarray) -> np.ndarray:
    """Forward + backward FLOPs of one sample of length L (backward = 2x forward): per layer
    and token the projections (HSTU 5 D^2, SASRec 12 D^2 multiply-adds), causal attention
    L^2 D / 2 per matmul twice, the sampled softmax (1 + negatives) R per token (R: the
    rows' width), and where R < D the rows' projections in and out, 2 R D per token."""
    m = workload.model
    proj = 5 if m.family == "hstu" else 12
    L = np.asarray(lengths, dtype=np.float64)
    rows = 2 * 2 * m.row_dim * m.dim * L if m.row_dim != m.dim else 0.0
    fwd = m.num_layers * (2 * proj * m.dim**2 * L + 2 * m.dim * L * L) \
        + 2 * (1 + workload.negatives_per_step) * m.row_dim * L + rows
    return 3 * fwd


class Costs:
    """Per-sample encoder cost in ms, and the communication model, of one cluster."""

    def __init__(self, cluster: Cluster, workload: WorkloadConfig, store: str | Path,
                 timeshare_efficiency: float | None = None) -> None:
        self.cluster, self.workload = cluster, workload
        self._timeshare = timeshare_efficiency  # None: the fit's
        self.fit = None
        if cluster.encoder_fit:  # a GPU cluster's measured encoder (and optimizer)
            from fsbench.costmodel.fit import model_key
            from fsbench.scaling.sim_inputs import read_encoder_fit

            self.fit = read_encoder_fit(cluster.encoder_fit)
            if self.fit.model != model_key(workload):
                raise ConfigError(f"--cluster-fit {cluster.encoder_fit}: a fit of {self.fit.model}, "
                                  f"not of this workload's model {model_key(workload)}: calibrate "
                                  f"it (fsbench calibrate --device cuda --workload {workload.name})")
            if self.fit.table_ns_per_element is not None and self.fit.table_optimizer != workload.table_optimizer:
                raise ConfigError(f"--cluster-fit {cluster.encoder_fit}: its table cost is "
                                  f"{self.fit.table_optimizer}'s, the workload steps {workload.table_optimizer}")
        if cluster.compute == "fit":
            from fsbench.costmodel.fit import fit_path, load_fit
            from fsbench.scaling.commcal import comm_fit_path, load_comm_fits

            self.fit = load_fit(store, workload, "cpu")
            self.comm = load_comm_fits(store)
            if self.fit is None:
                raise ConfigError(f"--cluster local needs the encoder's cost fit "
                                  f"({fit_path(store, workload, 'cpu')}): run fsbench calibrate "
                                  f"--workload {workload.name} --store {store}")
            # Collective fits are needed from 2 ranks on (collective_ms): a 1-rank run,
            # such as the one that measures a trainer's overhead, goes without.
            self.comm_path = comm_fit_path(store)
            if self.fit.table_ns_per_element is None or self.fit.table_optimizer != workload.table_optimizer:
                raise ConfigError(f"--cluster local needs the {workload.table_optimizer} step's cost per table "
                                  f"element in the fit ({fit_path(store, workload, 'cpu')}): run fsbench "
                                  f"calibrate --workload {workload.name} --store {store}")

    def sample_ms(self, lengths: np.ndarray) -> np.ndarray:
        if self.fit is not None:  # `local`, or a GPU cluster's encoder fit
            return self.fit.cost_ms(lengths)
        c = self.cluster
        return encoder_flops(self.workload, lengths) / (c.peak_tflops * 1e12 * c.mfu) * 1e3

    def corun_factor(self, world_size: int) -> float:
        """`local`: ranks of one host compute at once, each slower by the fit's measured
        co-run slowdown (shared cores' caches, memory bandwidth, hyperthread siblings).
        GPU presets: a GPU per rank, nothing shared."""
        if self.cluster.compute != "fit" or world_size < 2:
            return 1.0
        return self.fit.corun_slowdown or 1.0

    def time_sharing(self, world_size: int, trainer: str | None = None) -> float:
        """`local`: ranks beyond this host's cores (the fit's co-run count) take turns on
        them: with every rank's CPU work waiting for all the others', it would take ranks /
        cores as long; the measured efficiency says how much of that their steps meet
        (their CPU work does not all fall at once). GPU presets: 1."""
        if self.cluster.compute != "fit":
            return 1.0
        cores = self.fit.corun_processes or 1
        return 1.0 + self.timeshare_efficiency(trainer, world_size) * max(0.0, world_size / cores - 1.0)

    def timeshare_efficiency(self, trainer: str | None = None, world_size: int | None = None) -> float:
        """`local`: the fit's measured time-sharing efficiency (fsbench.scaling.timeshare):
        the trainer's own where measured (their CPU work falls differently), else the
        trainers' mean; at `world_size` ranks, between its two measurements (at 4 and 8
        times the cores) the line through them, below or beyond them the nearer (a fit
        with one measurement: that one); 1 where the fit predates it. GPU presets: 1
        (unused)."""
        if self._timeshare is not None:
            return self._timeshare
        if self.cluster.compute != "fit" or not self.fit.timeshare:
            return 1.0

        def own(measured: dict) -> float:
            return float(measured["per_trainer"].get(trainer, measured["efficiency"]))

        first, wider = self.fit.timeshare, self.fit.timeshare.get("wider")
        if wider is None or world_size is None or world_size <= first["ranks"]:
            return own(first)
        if world_size >= wider["ranks"]:
            return own(wider)
        at = (world_size - first["ranks"]) / (wider["ranks"] - first["ranks"])
        return own(first) + at * (own(wider) - own(first))

    def cores(self) -> int | None:
        """`local`: this host's cores as the fit counted them (its co-run count); GPU
        presets: None (a host's cores are not what their ranks compute on)."""
        return (self.fit.corun_processes or 1) if self.cluster.compute == "fit" else None

    def batch_extra_ms(self, lengths: np.ndarray) -> float:
        """A rank's batch beyond its samples' cost (the fit's batch terms, `local` or a GPU
        cluster's encoder fit; else none: launch_ms stands for it)."""
        return self.fit.batch_extra_ms(lengths) if self.fit is not None else 0.0

    def launch_ms(self) -> float:
        """A GPU cluster's launches for one pass of the encoder, forward and backward
        (`layer_overhead_ms` per layer), where no encoder fit measured them (its batch
        terms hold them); `local`: 0 (in its fit)."""
        if self.fit is not None:
            return 0.0
        return self.cluster.layer_overhead_ms * self.workload.model.num_layers

    def encoder_passes(self, sample_ms: np.ndarray, lengths: np.ndarray, passes: int,
                       growth: float = 1.0) -> tuple[float, float]:
        """(kernel ms, device ms) of a rank's encoder over its samples (`sample_ms` each,
        `lengths` their tokens) in `passes` sub-batches cut as the trainer cuts them
        (fsbench.training.sub_batch_cut, each `growth` times the one before; an empty one
        beyond the first runs nothing). Each
        pass pays its batch terms (a fit's: busy, as measured) and its launches: the host
        launches ahead of the device, so a pass takes the longer of its kernels and its
        launches, and the difference is a launch gap, idle (ARCHITECTURE: busy is compute
        kernels). Sub-batches multiply passes: four of them launch every layer four times."""
        from fsbench.training.sub_batch_cut import sub_batch_bounds

        bounds = sub_batch_bounds(lengths, passes, growth) if passes > 1 else np.array([0, len(lengths)])
        launch, kernels, device = self.launch_ms(), 0.0, 0.0
        for c, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
            if c and b == a:
                continue
            k = float(sample_ms[a:b].sum()) + self.batch_extra_ms(lengths[a:b])
            kernels, device = kernels + k, device + max(k, launch)
        return kernels, device

    def table_corun_factor(self, world_size: int) -> float:
        """`local`: the table work's own co-run slowdown (memory-bound; the encoder's
        where an older fit lacks it). GPU presets: 1."""
        if self.cluster.compute != "fit" or world_size < 2:
            return 1.0
        return self.fit.table_corun_slowdown or self.corun_factor(world_size)

    def step_overhead(self, trainer: str, compute: str, tokens: float | None = None) -> dict[str, float]:
        """`local`: the trainer's measured per-step work beyond this model, in this compute
        mode (wall_ms, cpu_ms, busy_ms, input_ms, worker_ms:
        fsbench.costmodel.fit.CostFit.step_overhead), for a global batch of `tokens`
        expected tokens: on the line through its two measurements (at the calibrated batch
        and a quarter of it; input, routing and row work grow with the global batch, on
        every rank, FreeScale's plan included), >= 0, and no more than at the calibrated
        batch (beyond what was measured the line is not known to hold: extrapolated up,
        it put comm-heavy's FreeScale 28-46% over at 6x its tokens). GPU presets: none
        (their per-layer launch overhead stands for it)."""
        if self.cluster.compute != "fit":
            return dict.fromkeys(OVERHEAD_KEYS, 0.0)
        held = self.fit.step_overhead or {}
        found = held.get(f"{trainer}/{compute}", {})
        other = [v for k, v in held.items() if k.startswith(f"{trainer}/{compute}@") and "tokens" in v]
        if tokens is None or not other or "tokens" not in found or found["tokens"] == other[0]["tokens"]:
            return {k: float(found.get(k, 0.0)) for k in OVERHEAD_KEYS}
        at = (min(tokens, found["tokens"]) - found["tokens"]) / (found["tokens"] - other[0]["tokens"])
        v = {k: max(0.0, found.get(k, 0.0) + at * (found.get(k, 0.0) - other[0].get(k, 0.0)))
             for k in OVERHEAD_KEYS}
        # the parts stay parts of the whole: busy <= cpu <= wall, cpu + input <= wall
        v["cpu_ms"] = min(v["cpu_ms"], v["wall_ms"])
        v["busy_ms"] = min(v["busy_ms"], v["cpu_ms"])
        v["input_ms"] = min(v["input_ms"], v["wall_ms"] - v["cpu_ms"])
        return v

    def worker_excludes_stage(self, trainer: str, compute: str) -> bool:
        """Whether the fit's loader-worker CPU for this trainer and compute mode leaves
        out the input stage's planning and routing (measured net of them, or not
        measured at all), so that the simulator adds theirs at the simulated size; a fit
        from before holds the worker's whole CPU at 1 rank."""
        held = (self.fit.step_overhead or {}) if self.cluster.compute == "fit" else {}
        found = held.get(f"{trainer}/{compute}")
        return found is None or "stage_ms" in found

    def table_ms(self, elements: float, replicated: bool = False) -> float:
        if self.cluster.compute != "fit":
            measured = self.fit.table_ns_per_element if self.fit is not None else None
            ns = self.cluster.table_ns_per_element if measured is None else measured
        elif replicated and self.fit.replicated_ns_per_element is not None:
            ns = self.fit.replicated_ns_per_element
        else:
            ns = self.fit.table_ns_per_element
        return elements * ns / 1e6

    def comm_ms(self, comm, n: int, per_node: int, nbytes: float) -> float:
        """One collective of a step program (its op and scope) moving `nbytes` a rank, on
        n ranks, per_node a node."""
        ranks, gpus_per_node = scope_ranks(comm.scope, n, per_node)
        return self.collective_ms(comm.op, ranks, nbytes, gpus_per_node)

    def collective_ms(self, collective: str, n: int, nbytes: float, gpus_per_node: int | None = None) -> float:
        if n <= 1 or nbytes <= 0:
            return 0.0
        if self.cluster.compute == "fit":
            if self.comm is None:
                raise ConfigError(f"--cluster local needs collective fits ({self.comm_path}): "
                                  f"run fsbench calibrate --comm --store {self.comm_path.parent.parent}")
            if collective not in self.comm:
                raise ConfigError(f"--cluster local: the collective fits in {self.comm_path} have no "
                                  f"{collective} (they hold {', '.join(sorted(self.comm))}): add its "
                                  f"nccl-tests log, or run fsbench calibrate --comm")
            return self.comm[collective].seconds(n, nbytes) * 1e3
        from fsbench.scaling.collectives import collective_s

        return collective_s(self.cluster, collective, n, nbytes, gpus_per_node) * 1e3

    def collective_cpu_ms(self, collective: str, n: int, nbytes: float) -> float:
        """`local`: the CPU a collective takes on a rank's other threads (gloo's), from the
        comm fit (0 in a fit from before it was measured). GPU presets: 0 (NCCL's work is
        on the GPU; its host threads are not modelled)."""
        if n <= 1 or nbytes <= 0 or self.cluster.compute != "fit" or collective not in (self.comm or {}):
            return 0.0
        return self.comm[collective].cpu_seconds(n, nbytes) * 1e3


@functools.lru_cache(maxsize=8)
def _zipf_bins(vocab: int, s: float) -> tuple[np.ndarray, np.ndarray]:
    """Item probabilities of zipf:s over `vocab` ranks, grouped in log-spaced bins
    (count, mean probability): enough for expected distinct counts, without 10M terms."""
    edges = np.unique(np.geomspace(1, vocab, 2000).astype(np.int64))
    edges = np.append(edges, vocab + 1)
    counts = np.diff(edges).astype(np.float64)
    mids = (edges[:-1] + edges[1:] - 1) / 2.0
    weights = mids**-s * counts
    return counts, weights / weights.sum() / counts


def expected_distinct(n_draws: np.ndarray, vocab: int, s: float) -> np.ndarray:
    """Expected number of distinct items among n draws from zipf:s (per value of n)."""
    counts, p = _zipf_bins(vocab, s)
    n = np.asarray(n_draws, dtype=np.float64)[:, None]
    return (counts * -np.expm1(-n * p)).sum(axis=1)


def expected_fresh(n_draws: np.ndarray, vocab: int, s: float, prev_draws: float) -> np.ndarray:
    """Expected number of distinct items among n draws (per value of n) that were also
    among `prev_draws` draws of the step before, i.e. rows that step updated."""
    counts, p = _zipf_bins(vocab, s)
    n = np.asarray(n_draws, dtype=np.float64)[:, None]
    return (counts * -np.expm1(-n * p) * -np.expm1(-prev_draws * p)).sum(axis=1)


def expected_tokens(workload: WorkloadConfig) -> float:
    """A global batch's expected tokens: its size times its lengths' mean (20,000 draws
    from a fixed generator, clipped at max_seq_len as batches are)."""
    from fsbench.workloads.distributions import parse_length_spec

    draws = parse_length_spec(workload.lengths).sample(np.random.default_rng(0), 20_000, workload.max_seq_len)
    return float(workload.global_batch_size * np.mean(draws))


def unique_rows(w: WorkloadConfig, draws: np.ndarray, samples: np.ndarray, zipf_s: float) -> np.ndarray:
    """Expected unique rows of sharded tables a rank reads in a step, per rank: of its
    item `draws` (items and targets, and the shared negatives: one table, zipf:s), and one
    user row and one row per context table for each of its `samples`."""
    return expected_distinct(draws, w.item_vocab, zipf_s) + samples * (1 + len(w.context_vocabs))


def expected_exchange_bytes(w: WorkloadConfig, n: int) -> float:
    """A rank's row exchange a step in bytes (step_payloads' `rows`) at the workload's
    expected lengths, with its share of the global batch: deterministic, so that every
    rank and the simulator compute the same (fsbench.scaling.chunking)."""
    from fsbench.specs import parse_popularity

    samples = w.global_batch_size / n
    draws = np.array([expected_tokens(w) / n + samples + w.negatives_per_step])
    rows = unique_rows(w, draws, np.array([samples]), float(parse_popularity(w.popularity).s))
    return float(rows[0]) * 4.0 * w.model.row_dim


def expected_payloads(w: WorkloadConfig, n: int, chunks: int) -> dict[str, float]:
    """step_payloads for a rank with its share of the global batch at the workload's
    expected lengths, in a steady step (the step before drew as many): deterministic, so
    that the trainer's chunk rule and the simulator's compute the same
    (fsbench.scaling.chunk_replay)."""
    from fsbench.specs import parse_popularity

    s = float(parse_popularity(w.popularity).s)
    samples, tokens = w.global_batch_size / n, expected_tokens(w) / n
    draws = np.array([tokens + samples + w.negatives_per_step])
    rows = unique_rows(w, draws, np.array([samples]), s)
    prev_draws = expected_tokens(w) + w.global_batch_size + w.negatives_per_step
    fresh = (expected_fresh(draws, w.item_vocab, s, prev_draws)
             + samples * sum(-math.expm1(-w.global_batch_size / v) for v in (w.user_vocab, *w.context_vocabs)))
    return step_payloads(w, n, chunks, rows, fresh, np.array([samples]), np.array([tokens]))


def scope_ranks(scope: str, n: int, per_node: int) -> tuple[int, int | None]:
    """(ranks, GPUs a node) that a collective of `scope` (fsbench.training.step_program.Comm)
    runs on, of n ranks per_node a node: the node's ranks (`node`, `in_node`); one a node
    (`rail`: every peer on another node, G = 1); every rank (`all`, `nodes`)."""
    if scope in ("node", "in_node"):
        return min(n, per_node), None
    if scope == "rail":
        return max(1, n // per_node), 1
    return n, None


def comm_bytes(comm, payloads: dict[str, float], dense_bytes: float, per_node: int, n: int) -> float:
    """A rank's bytes of one collective of a step program (fsbench.training.step_program.Comm):
    its share of its payload (`dense_grads`: the dense part's `dense_bytes`); an exchange
    split by node (sm_free beyond one node) moves the node's peers' part of it over the copy
    engines (`node`) and the other nodes' over NCCL (`nodes`); one in two hops moves all of
    it in each (`in_node`, `rail`: as many rows enter and leave a rank's hop in
    expectation)."""
    part = {"all": 1.0, "node": min(1.0, per_node / n), "nodes": max(0.0, 1 - per_node / n),
            "in_node": 1.0, "rail": 1.0}
    whole = dense_bytes if comm.payload == "dense_grads" else payloads[comm.payload]
    return whole * comm.share * part[comm.scope]


# Payloads by what they are: a sharded table's rows and gradients; a step's input routing
# (the requests' messages, TorchRec's input dist); data=sharded's sample exchange.
ROW_PAYLOADS = frozenset({"rows", "row_grads", "fresh_rows", "final_rows"})
INPUT_PAYLOADS = frozenset({"control", "control_priority", "input_lengths", "input_ids"})
SAMPLE_PAYLOADS = frozenset({"samples.lengths", "sample_meta", "sample_tokens"})


def step_payloads(w: WorkloadConfig, n: int, chunks: int, rows: np.ndarray | None,
                  fresh: np.ndarray | None, samples: np.ndarray, tokens: np.ndarray) -> dict[str, float]:
    """Bytes of each payload a step program names (fsbench.training.step_program), from the
    rank that moves the most: `rows` each rank's unique rows of sharded tables (None: none
    sharded) and `fresh` those the previous update changed (None: all of them).
      rows, row_grads, fresh_rows, final_rows  fp32 rows of `dim`
      control  a step's counts (N x chunks int64) and a rank's unique rows (int64 ids);
              control_priority  and a fresh mask entry a row (int64)
      input_lengths, input_ids  TorchRec's input dist: a length per sample and feature (the
              item sequence, user, contexts), and the ids (tokens, targets, a user and
              contexts per sample), int64
      samples.lengths, sample_meta, sample_tokens  data=sharded: every rank's lengths (an
              all-gather of S bytes a rank moves what an all-to-all of S to each peer does),
              then per sample length, user and contexts, per token input item and target, int64
      barrier  the copy-engine transport's barrier, priced as an all-to-all of N int64"""
    dim_bytes, contexts = 4.0 * w.model.row_dim, len(w.context_vocabs)
    i = int(np.argmax(tokens))
    out = {"input_lengths": float(samples[i]) * (2 + contexts) * 8.0,
           "input_ids": (2 * float(tokens[i]) + float(samples[i]) * (1 + contexts)) * 8.0,
           "samples.lengths": float(samples.sum()) * 8.0,
           "sample_meta": float(samples[i]) * (2 + contexts) * 8.0, "sample_tokens": float(tokens[i]) * 2 * 8.0,
           "barrier": 8.0 * n}
    if rows is not None:
        fresh = rows if fresh is None else fresh
        most = float(rows.max())
        counts = 8.0 * n * chunks
        out.update(rows=most * dim_bytes, row_grads=most * dim_bytes, control=counts + most * 8.0,
                   control_priority=counts + most * 16.0,
                   fresh_rows=float(fresh.max()) * dim_bytes, final_rows=float((rows - fresh).max()) * dim_bytes)
    return out


def worker_preemption_ms(n: int, cores: int | None, worker_ms: float, step_ms: float,
                         efficiency: float = 1.0) -> float:
    """How much n ranks' loader workers (worker_ms of CPU each per step) lengthen a step of
    step_ms on a host of `cores` cores: the spare cores (cores - n) take what they can in
    the step, the rest shares the cores with the ranks; beyond the cores, as much of it as
    the measured time-sharing `efficiency` says. None: ranks compute elsewhere."""
    if not cores or worker_ms <= 0:
        return 0.0
    share = efficiency if n > cores else 1.0
    return share * max(0.0, n * worker_ms - max(0, cores - n) * step_ms) / cores
