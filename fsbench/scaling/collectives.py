"""What a collective costs on a GPU cluster: one model, used by the simulator's presets and
cluster files (fsbench.scaling.sim_costs.Costs), fitted from nccl-tests logs
(`fit_figures`), and held against them by `fsbench cluster --compare`.

The model follows how NCCL moves bytes on NVLink-switched nodes joined by one NIC per GPU,
in nccl-tests' own terms: a collective of S bytes (nccl-tests' size column: a rank's
buffer) on N ranks takes its latency plus S times the collective's bus factor (2(N-1)/N
for all-reduce, (N-1)/N for the others) over a bus bandwidth that depends on where the
bytes go:

- inside one node, every collective runs over NVLink at `intra_gbs`; an all-reduce with
  NVLink SHARP (NVLS: the switch reduces) at `nvls_gbs` where that is set;
- across nodes, a ring or tree collective (all-reduce, all-gather, reduce-scatter) spreads
  its channels over every NIC of a node, so its bus bandwidth is `gpus_per_node x
  inter_gbs x nic_share` (no more than NVLink's): 8 GPUs with a 400 Gb/s NIC each reach
  300-360 GB/s, 1 GPU a node one NIC's;
- an all-to-all sends each peer its own slice, so the slices to other nodes, (N - G)/N of
  S with G GPUs a node, leave through the rank's one NIC at `inter_gbs`, the rest over
  NVLink;
- the latency of a ring or tree collective grows with log2 N (`alpha_s` a step); across
  nodes a ring's pipeline adds `ring_peer_s` per rank (2(N-1) steps, each a hop's
  latency), measured on messages of 32 MiB and more: 500-700 us at 80 ranks in published
  logs. Below 32 MiB it is taken to shrink with the message (NCCL sends small messages
  with its LL protocols and trees, which such logs do not show): an assumption;
- an all-to-all's latency grows with its peers (`a2a_peer_s` each, beside `alpha_s`),
  measured and scaled below 32 MiB as a ring's: 170-340 us at 64-80 ranks in published
  logs.
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Protocol

import numpy as np

RING_FAMILY = ("all_reduce", "all_gather", "reduce_scatter")
# Messages from which a log's curve is a straight line, time = fixed + bytes / bandwidth (the
# protocol is NCCL's Simple from a few MiB on): the bandwidth fits use those; the latency
# fits use messages of 64 KiB or less, whose bytes take a few percent of their time.
BANDWIDTH_BYTES = 32 << 20
LATENCY_BYTES = 64 << 10
MODELLED = (*RING_FAMILY, "all_to_all")


class LinkFigures(Protocol):
    """The figures of a cluster (fsbench.scaling.sim_inputs.Cluster) that price collectives."""
    gpus_per_node: int
    intra_gbs: float
    nvls_gbs: float
    inter_gbs: float
    nic_share: float
    alpha_s: float
    ring_peer_s: float
    a2a_peer_s: float


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests' busbw / algbw: how many times its buffer a rank moves."""
    if n <= 1:
        return 0.0
    return (2.0 if collective == "all_reduce" else 1.0) * (n - 1) / n


def ring_bus_gbs(fig: LinkFigures, collective: str, n: int, gpus_per_node: int) -> float:
    """The bus bandwidth (GB/s) of a ring or tree collective on n ranks, G a node."""
    if n <= gpus_per_node:
        if collective == "all_reduce" and fig.nvls_gbs > 0 and n > 2:
            return fig.nvls_gbs  # NVLS needs the switch: more than a pair of GPUs
        return fig.intra_gbs
    return min(fig.intra_gbs, gpus_per_node * fig.inter_gbs * fig.nic_share)


def latency_s(fig: LinkFigures, collective: str, n: int, nbytes: float = float("inf"),
              gpus_per_node: int | None = None) -> float:
    """A collective's fixed cost on n ranks (G a node): log2 N steps; an all-to-all's per
    peer; a ring's per rank across nodes, in full from 32 MiB (the module's docstring)."""
    if n <= 1:
        return 0.0
    full = min(1.0, nbytes / BANDWIDTH_BYTES)
    if collective == "all_to_all":
        return fig.alpha_s + fig.a2a_peer_s * (n - 1) * full
    steps = fig.alpha_s * math.ceil(math.log2(n))
    if n <= (gpus_per_node or fig.gpus_per_node):
        return steps
    return steps + fig.ring_peer_s * (n - 1) * full


def transfer_s(fig: LinkFigures, collective: str, n: int, nbytes: float, gpus_per_node: int) -> float:
    """The bandwidth part of a collective's time (seconds)."""
    if collective == "all_to_all":
        local = min(n, gpus_per_node)
        return nbytes * ((local - 1) / n / (fig.intra_gbs * 1e9) + (n - local) / n / (fig.inter_gbs * 1e9))
    return bus_factor(collective, n) * nbytes / (ring_bus_gbs(fig, collective, n, gpus_per_node) * 1e9)


def collective_s(fig: LinkFigures, collective: str, n: int, nbytes: float,
                 gpus_per_node: int | None = None) -> float:
    """Seconds one collective of `nbytes` (a rank's buffer) takes on n ranks, G a node
    (default: the cluster's). A collective the model does not name (sendrecv) is
    priced as an all-gather's bandwidth: a point-to-point send over the same links."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    g = gpus_per_node or fig.gpus_per_node
    kind = collective if collective in MODELLED else "all_gather"
    return latency_s(fig, kind, n, nbytes, g) + transfer_s(fig, kind, n, nbytes, g)


DEFAULTS = {"nvls_gbs": 0.0, "nic_share": 1.0, "alpha_s": 0.0, "ring_peer_s": 0.0, "a2a_peer_s": 0.0}


def group_lines(points: list) -> dict[tuple[str, int, int], tuple[float, float, int]]:
    """(collective, N, G) -> (fixed seconds, bus bandwidth GB/s, points used): a line
    through each layout's points of BANDWIDTH_BYTES or more, every log of that layout
    pooled (least squares on relative error; a single size: its busbw, no fixed cost)."""
    out = {}
    for key in sorted({(p.collective, p.world_size, p.gpus_per_node) for p in points}):
        pts = [p for p in points if (p.collective, p.world_size, p.gpus_per_node) == key
               and p.bytes >= BANDWIDTH_BYTES]
        if not pts:
            continue
        c, n, _ = key
        if len({p.bytes for p in pts}) < 2:
            out[key] = (0.0, float(np.median([p.busbw_gbs for p in pts])), len(pts))
            continue
        x = np.array([bus_factor(c, n) * p.bytes for p in pts], dtype=float)
        t = np.array([p.time_us * 1e-6 for p in pts])
        design = np.stack([np.ones_like(x), x], axis=1) / t[:, None]
        fixed, per_byte = np.linalg.lstsq(design, np.ones_like(t), rcond=None)[0]
        if per_byte <= 0:
            continue
        if fixed < 0:  # through the origin: bandwidth alone
            fixed, per_byte = 0.0, float((x @ t) / (x @ x))
        out[key] = (float(fixed), 1.0 / per_byte / 1e9, len(pts))
    return out


def fit_figures(points: list, given: dict[str, float] | None = None) -> tuple[dict[str, float], dict[str, str]]:
    """The model's figures from nccl-tests points (fsbench.scaling.nccl_tests.NcclTestsPoint),
    and for each how it was found. `given`: figures known otherwise (a spec sheet, another
    source), used where the points cannot show one and never overridden by a fit.

    Each figure from the log curves that show it alone (group_lines), medians across
    curves so that one odd log moves nothing: NVLink's bus bandwidth from one-node
    all-gathers and reduce-scatters (all-to-alls, else all-reduces of 2 GPUs); NVLS from
    one-node all-reduces of 3+ GPUs beyond it; one NIC's from multi-node all-to-alls (their
    NVLink part taken off); the NIC share from multi-node ring collectives; alpha_s from
    ring collectives of 64 KiB or less; the costs per peer from the slope of the curves'
    fixed parts against N - 1 (an all-to-all's from messages up to 8 MiB, their bytes'
    time taken off, where no curve of its has two sizes)."""
    given = dict(given or {})
    figures: dict[str, float] = {}
    how: dict[str, str] = {k: "given" for k in given}
    multi = [p for p in points if p.world_size > p.gpus_per_node]
    single = [p for p in points if p.world_size == p.gpus_per_node and p.world_size > 1]
    gpn = most_common([p.gpus_per_node for p in (multi or single)])
    if "gpus_per_node" not in given:
        if gpn is None:
            raise ValueError("no point with 2 or more ranks, and no gpus_per_node given")
        figures["gpus_per_node"] = gpn
        how["gpus_per_node"] = "the logs' hosts (most common ranks per host)"
    lines = group_lines(points)

    def curves(kinds, where):
        return [(k, v) for k, v in lines.items() if k[0] in kinds and where(k[1], k[2])]

    one_node = lambda n, g: n == g  # noqa: E731
    across = lambda n, g: n > g  # noqa: E731
    for kinds in (("all_gather", "reduce_scatter"), ("all_to_all",)):
        found = curves(kinds, one_node)
        if found:
            figures["intra_gbs"] = float(np.median([v[1] for _, v in found]))
            how["intra_gbs"] = f"{len(found)} one-node {'/'.join(kinds)} layouts >= 32 MiB"
            break
    intra = given.get("intra_gbs", figures.get("intra_gbs"))
    nvls = curves(("all_reduce",), lambda n, g: n == g and n > 2)
    if nvls:
        bw = float(np.median([v[1] for _, v in nvls]))
        faster = intra is None or bw > 1.05 * intra
        figures["nvls_gbs"] = bw if faster else 0.0
        how["nvls_gbs"] = (f"{len(nvls)} one-node all_reduce layouts >= 32 MiB"
                           + ("" if faster else ": no faster than the ring, so none"))
    if intra is None and nvls and not figures.get("nvls_gbs"):
        figures["intra_gbs"] = float(np.median([v[1] for _, v in nvls]))
        how["intra_gbs"] = "one-node all_reduce curves (no NVLS seen)"
        intra = figures["intra_gbs"]
    a2a = curves(("all_to_all",), across)
    if a2a and intra:
        per_nic = []
        for (c, n, g), (_, bus, _) in a2a:
            # bus = (n-1)/n S / t and t = S ((g-1)/n / intra + (n-g)/n / nic)
            nic_share_of_t = (n - 1) / n / bus - (g - 1) / n / intra
            if nic_share_of_t > 0:
                per_nic.append((n - g) / n / nic_share_of_t)
        if per_nic:
            figures["inter_gbs"] = float(np.median(per_nic))
            how["inter_gbs"] = f"{len(per_nic)} multi-node all_to_all layouts >= 32 MiB"
    inter = given.get("inter_gbs", figures.get("inter_gbs"))
    rings = curves(RING_FAMILY, across)
    if rings and inter:
        shares = [v[1] / (g * inter) for (_, _, g), v in rings if v[1] < 0.95 * (intra or math.inf)]
        if shares:  # a curve at NVLink's bandwidth shows nothing of the NICs
            figures["nic_share"] = float(np.median(shares))
            how["nic_share"] = f"{len(shares)} multi-node ring-collective layouts >= 32 MiB"
    known = {**DEFAULTS, **figures, **given}
    if intra and inter:
        fig = Figures(known)
        small_rings = [p for p in points if p.collective in RING_FAMILY and p.bytes <= LATENCY_BYTES
                       and p.world_size > 1]
        if small_rings and "alpha_s" not in given:
            steps = [(p.time_us * 1e-6 - transfer_s(fig, p.collective, p.world_size, p.bytes, p.gpus_per_node))
                     / math.ceil(math.log2(p.world_size)) for p in small_rings]
            figures["alpha_s"] = known["alpha_s"] = max(0.0, float(np.median(steps)))
            how["alpha_s"] = f"{len(small_rings)} ring-collective points <= 64 KiB"
            fig = Figures(known)
        ring_fixed = [(n - 1, v[0] - fig.alpha_s * math.ceil(math.log2(n)))
                      for (_, n, _), v in curves(RING_FAMILY, across) if v[2] >= 2]
        if ring_fixed and "ring_peer_s" not in given:
            figures["ring_peer_s"] = known["ring_peer_s"] = _slope(ring_fixed)
            how["ring_peer_s"] = f"{len(ring_fixed)} multi-node ring-collective layouts' fixed parts against N - 1"
        fixed = [(n - 1, v[0] - fig.alpha_s) for (_, n, _), v in curves(("all_to_all",), lambda n, g: n > 2)
                 if v[2] >= 2]
        source = f"{len(fixed)} all_to_all layouts' fixed parts against N - 1"
        if not fixed:
            small = [p for p in points if p.collective == "all_to_all" and p.bytes <= 8 << 20 and p.world_size > 2]
            fixed = [(p.world_size - 1, (p.time_us * 1e-6 - fig.alpha_s - transfer_s(
                        fig, "all_to_all", p.world_size, p.bytes, p.gpus_per_node)) / min(1.0, p.bytes / BANDWIDTH_BYTES))
                     for p in small]
            source = f"{len(fixed)} all_to_all points <= 8 MiB on 3+ ranks (their bytes' time taken off)"
        if fixed and "a2a_peer_s" not in given:
            figures["a2a_peer_s"] = _slope(fixed)
            how["a2a_peer_s"] = source
    return {**figures, **given}, how


def _slope(points: list[tuple[float, float]]) -> float:
    """The least-squares slope through the origin of (x, y) points, >= 0: a cost per peer
    from curves' fixed parts (weighted towards the many-rank curves, where it matters)."""
    x, y = np.array(points, dtype=float).T
    return max(0.0, float(x @ y / (x @ x)))


class Figures:
    """A plain holder of figures (a LinkFigures), those not given at their defaults: a fit
    in the making, or a stored one (fsbench.scaling.nccl_fit)."""

    def __init__(self, values: dict) -> None:
        self.__dict__.update({**DEFAULTS, **values})


def most_common(values: list[int]) -> int | None:
    """The most common value (the largest among equals), None for none."""
    counts = Counter(values)
    return max(counts, key=lambda v: (counts[v], v)) if counts else None


def published_figures(name: str = "h100_nccl_tests.json") -> tuple[dict[str, float], dict[str, str], list[str]]:
    """(figures, how each was found, the sources' addresses) fitted on a committed file of
    published nccl-tests results (fsbench/scaling/data/): the sources marked "fitted"."""
    import json
    from importlib.resources import files

    from fsbench.scaling.nccl_tests import NcclTestsPoint

    data = json.loads(files("fsbench.scaling").joinpath("data", name).read_text())
    used = [s for s in data["sources"] if s["use"] == "fitted"]
    figures, how = fit_figures(published_points("fitted", name))
    return figures, how, [s["address"] for s in used]


def published_points(use: str, name: str = "h100_nccl_tests.json") -> list:
    """The points (NcclTestsPoint, each with its source's address) of the committed file's
    sources whose `use` starts with `use`: "fitted" (what the preset is fitted on),
    "checked" (published runs the model is only compared with: `fsbench cluster --compare
    published`)."""
    import json
    from importlib.resources import files

    from fsbench.scaling.nccl_tests import NcclTestsPoint

    data = json.loads(files("fsbench.scaling").joinpath("data", name).read_text())
    return [NcclTestsPoint(c, n, g, b, t, bus, s["address"]) for s in data["sources"]
            if s["use"].startswith(use) for c, n, g, b, t, bus in s["points"]]
