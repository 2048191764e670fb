"""The goodput account as a picture: one SVG file a browser opens, written without any
plotting library (the host tool installs click and rich, nothing more). Pure.

Top to bottom: the chain's timeline (a row per node of each generation, coloured by
what that node-second was spent on, with cycle starts, faults, checkpoints and
hand-offs marked), the iteration the run trained and the iteration its checkpoints
kept, over the same time axis, and the allocation as one bar split by category.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from xml.sax.saxutils import escape

from nvrx_appliance.goodput import summary
from nvrx_appliance.goodput.account import CATEGORIES, Account, GenerationAccount, NodeTime

COLOURS = {
    "productive": "#2e7d32",
    "checkpoint_saves": "#9ccc65",
    "not_yet_saved": "#c5e1a5",
    "training_lost": "#c62828",
    "hangs_until_detected": "#ef9a9a",
    "start_up": "#1565c0",
    "in_job_restarts": "#64b5f6",
    "hand_offs": "#6a1b9a",
    "chain_end": "#ce93d8",
    "idle_spares": "#bdbdbd",
    "unknown": "#fdd835",
}
WIDTH, LEFT, RIGHT = 1000, 170, 20
ROW, ROW_GAP, GENERATION_GAP = 12, 3, 28  # the gap holds ticks, a hand-off, cycle labels
MAX_ROWS = 48  # beyond this, nodes that spent their time alike share one row
FONT = 'font-family="DejaVu Sans, Arial, sans-serif"'
HALO = ' stroke="#ffffff" stroke-width="3" paint-order="stroke"'  # legible over lines


class _Axis:
    def __init__(self, start: float, end: float) -> None:
        self.start, self.end = start, max(end, start + 1.0)

    def x(self, moment: float) -> float:
        span = WIDTH - LEFT - RIGHT
        return LEFT + span * (min(max(moment, self.start), self.end) - self.start) / (
            self.end - self.start
        )


def _clock(moment: float) -> str:
    return datetime.datetime.fromtimestamp(moment, tz=datetime.timezone.utc).strftime("%H:%M:%S")


def _text(
    x: float, y: float, words: str, size: int = 11, anchor: str = "start", extra: str = ""
) -> str:
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" {FONT}'
        f"{extra}>{escape(words)}</text>"
    )


def _rows(
    generation: GenerationAccount, nodes: Sequence[NodeTime], crowded: bool
) -> list[tuple[str, NodeTime]]:
    """(label, the node drawn) per row; alike nodes share a row when the chain is big."""
    mine = [n for n in nodes if n.generation == generation.array_job_id]
    if not crowded:
        return [(f"task {n.task} {n.node}", n) for n in mine]
    groups: dict[tuple, list[NodeTime]] = {}
    for node in mine:
        key = tuple((p.category, round(p.start), round(p.end)) for p in node.pieces)
        groups.setdefault(key, []).append(node)
    return [
        (f"{len(group)} node(s), task {group[0].task}" if len(group) > 1 else
         f"task {group[0].task} {group[0].node}", group[0])
        for group in groups.values()
    ]  # fmt: skip


def _timeline(account: Account, axis: _Axis, top: float) -> tuple[list[str], float]:
    out: list[str] = []
    crowded = len(account.nodes) > MAX_ROWS
    y = top
    spans: dict[str, tuple[float, float]] = {}
    for generation in account.generations:
        rows = _rows(generation, account.nodes, crowded)
        out.append(_text(8, y + ROW - 2, f"generation {generation.array_job_id}", 11,
                         extra=' font-weight="bold"'))  # fmt: skip
        first = y
        for label, node in rows:
            out.append(_text(LEFT - 6, y + ROW - 2, label, 10, "end"))
            for piece in node.pieces:
                x0, x1 = axis.x(piece.start), axis.x(piece.end)
                what = CATEGORIES[piece.category] + (f" ({piece.part})" if piece.part else "")
                out.append(
                    f'<rect x="{x0:.2f}" y="{y:.1f}" width="{max(x1 - x0, 0.3):.2f}" '
                    f'height="{ROW}" fill="{COLOURS[piece.category]}"><title>'
                    f"{escape(what)}: {piece.end - piece.start:.1f} s</title></rect>"
                )
            y += ROW + ROW_GAP
        spans[generation.array_job_id] = (first, y - ROW_GAP)
        out += _marks(account, generation, axis, first, y - ROW_GAP)
        y += GENERATION_GAP
    out += _hand_offs(account, axis, spans)
    return out, y


def _marks(
    account: Account, generation: GenerationAccount, axis: _Axis, top: float, bottom: float
) -> list[str]:
    """Cycle starts (a line with the cycle number), checkpoints (ticks), faults (red)."""
    out = []
    for cycle in generation.cycles:
        x = axis.x(cycle.start)
        out.append(f'<line x1="{x:.1f}" y1="{top - 2:.1f}" x2="{x:.1f}" y2="{bottom + 2:.1f}" '
                   'stroke="#212121" stroke-width="1" stroke-dasharray="2,2"/>')  # fmt: skip
        out.append(_text(x + 2, top - 3, f"cycle {cycle.number}", 9, extra=HALO))
    for work in account.work:
        if work.generation != generation.array_job_id:
            continue
        for save in work.saves:
            if save.committed is not None:
                x = axis.x(save.committed)
                out.append(f'<line x1="{x:.1f}" y1="{bottom + 1:.1f}" x2="{x:.1f}" '
                           f'y2="{bottom + 5:.1f}" stroke="#1b5e20" stroke-width="1">'
                           f"<title>checkpoint at iteration {save.iteration}</title></line>")  # fmt: skip
        for moment, what in work.faults:
            x = axis.x(moment)
            out.append(f'<path d="M{x - 5:.1f},{top - 9:.1f} L{x + 5:.1f},{top - 9:.1f} '
                       f'L{x:.1f},{top - 1:.1f} Z" fill="#d50000"><title>{escape(what)}</title></path>')  # fmt: skip
    return out


def _hand_offs(account: Account, axis: _Axis, spans: dict[str, tuple[float, float]]) -> list[str]:
    out = []
    for before, after in zip(account.generations, account.generations[1:], strict=False):
        if before.training_stopped is None or after.training_started is None:
            continue
        x0, x1 = axis.x(before.training_stopped), axis.x(after.training_started)
        y0, y1 = spans[before.array_job_id][1], spans[after.array_job_id][0]
        out.append(f'<path d="M{x0:.1f},{y0:.1f} L{x1:.1f},{y1:.1f}" stroke="#6a1b9a" '
                   'stroke-width="1.5" fill="none" stroke-dasharray="5,3" marker-end="url(#arrow)"/>')  # fmt: skip
        seconds = after.training_started - before.training_stopped
        # Beside where training stopped, under the old generation's checkpoint ticks: the
        # new generation's own labels sit at its end of the arrow.
        out.append(_text(x0 + 6, y0 + 16, f"hand-off {summary.duration(seconds)}", 10,
                         extra=HALO + ' fill="#6a1b9a"'))  # fmt: skip
    return out


def _iterations(account: Account, axis: _Axis, top: float, height: float) -> list[str]:
    """What the run trained (a line per cycle) and what its checkpoints kept (a step line)."""
    out = [_text(8, top + 12, "iteration", 11, extra=' font-weight="bold"')]
    steps = [(t, i) for w in account.work for t, i in w.steps]
    kept = sorted((s.committed, s.iteration) for w in account.work for s in w.saves
                  if s.committed is not None)  # fmt: skip
    highest = max([i for _, i in steps] + [i for _, i in kept], default=0) or 1

    def y(iteration: float) -> float:
        return top + height - height * iteration / highest

    out.append(f'<line x1="{LEFT}" y1="{top + height}" x2="{WIDTH - RIGHT}" y2="{top + height}" '
               'stroke="#757575"/>')  # fmt: skip
    out.append(_text(LEFT - 6, y(highest) + 4, f"{highest:,}", 10, "end"))
    out.append(_text(LEFT - 6, top + height, "0", 10, "end"))
    for work in account.work:
        points = ([(work.started, work.start_iteration or 0)] if work.started else []) + work.steps
        if len(points) > 1:
            path = " ".join(f"{axis.x(t):.1f},{y(i):.1f}" for t, i in points)
            out.append(
                f'<polyline points="{path}" fill="none" stroke="#1565c0" stroke-width="1.5"/>'
            )
        for moment, what in work.faults:
            x = axis.x(moment)
            out.append(f'<line x1="{x:.1f}" y1="{top:.1f}" x2="{x:.1f}" y2="{top + height:.1f}" '
                       f'stroke="#d50000" stroke-width="1"><title>{escape(what)}</title></line>')  # fmt: skip
    if kept:
        level, corners = 0, []
        for moment, iteration in kept:
            corners += [
                f"{axis.x(moment):.1f},{y(level):.1f}",
                f"{axis.x(moment):.1f},{y(iteration):.1f}",
            ]
            level = iteration
        corners.append(f"{axis.x(axis.end):.1f},{y(level):.1f}")
        out.append(f'<polyline points="{" ".join(corners)}" fill="none" stroke="#2e7d32" '
                   'stroke-width="2" stroke-opacity="0.8"/>')  # fmt: skip
    legend_y = top + 12
    out.append(f'<line x1="{LEFT + 10}" y1="{legend_y - 4}" x2="{LEFT + 30}" y2="{legend_y - 4}" '
               'stroke="#1565c0" stroke-width="2"/>')  # fmt: skip
    out.append(_text(LEFT + 34, legend_y, "trained (logged steps)", 10))
    out.append(f'<line x1="{LEFT + 170}" y1="{legend_y - 4}" x2="{LEFT + 190}" y2="{legend_y - 4}" '
               'stroke="#2e7d32" stroke-width="2"/>')  # fmt: skip
    out.append(_text(LEFT + 194, legend_y, "kept (the checkpoint tracker)", 10))
    return out


def _axis_ticks(axis: _Axis, y: float) -> list[str]:
    out = []
    count = 6
    for k in range(count + 1):
        moment = axis.start + (axis.end - axis.start) * k / count
        x = axis.x(moment)
        out.append(
            f'<line x1="{x:.1f}" y1="{y:.1f}" x2="{x:.1f}" y2="{y + 4:.1f}" stroke="#757575"/>'
        )
        anchor = "start" if k == 0 else "end" if k == count else "middle"
        out.append(_text(x, y + 15, _clock(moment), 10, anchor))
    out.append(_text(WIDTH - RIGHT, y + 28, "UTC", 9, "end"))
    return out


def _bar(account: Account, top: float) -> tuple[list[str], float]:
    total = account.allocation_node_s or 0.0
    out = [_text(8, top + 16, "allocation", 11, extra=' font-weight="bold"')]
    x, span = float(LEFT), WIDTH - LEFT - RIGHT
    for key, label in CATEGORIES.items():
        share = account.categories[key] / total if total else 0.0
        if share <= 0:
            continue
        width = span * share
        out.append(f'<rect x="{x:.2f}" y="{top:.1f}" width="{width:.2f}" height="24" '
                   f'fill="{COLOURS[key]}"><title>{escape(label)}: {share:.1%}</title></rect>')  # fmt: skip
        if width > 38:
            out.append(
                _text(x + width / 2, top + 16, f"{share:.0%}", 10, "middle", ' fill="#ffffff"')
            )
        x += width
    unit = summary.unit_for(total)
    y = top + 44
    shown = [(k, v) for k, v in CATEGORIES.items() if account.categories[k] > 0]
    for index, (key, label) in enumerate(shown):
        column, row = index % 3, index // 3
        lx, ly = LEFT + column * 270, y + row * 18
        value = account.categories[key]
        out.append(f'<rect x="{lx}" y="{ly - 10}" width="12" height="12" fill="{COLOURS[key]}"/>')
        out.append(_text(lx + 18, ly, f"{label}: {summary.amount(value, unit)} {unit} "
                                      f"({value / total:.1%})", 10))  # fmt: skip
    return out, y + 18 * ((len(shown) + 2) // 3)


def svg(account: Account) -> str:
    """The whole picture as SVG text."""
    starts = [g.start for g in account.generations]
    ends = [g.end if g.end is not None else account.observed for g in account.generations]
    axis = _Axis(min(starts, default=account.observed), max(ends, default=account.observed))
    body = [
        _text(8, 22, summary.headline(account), 14, extra=' font-weight="bold"'),
        _text(8, 40, f"work dir {account.work_dir}; as of {_clock(account.observed)} UTC; "
                     f"{len(account.generations)} generation(s)", 10, extra=' fill="#424242"'),
    ]  # fmt: skip
    timeline, y = _timeline(account, axis, 70)
    body += timeline
    body += _iterations(account, axis, y + 6, 120)
    y += 6 + 120
    body += _axis_ticks(axis, y)
    bar, y = _bar(account, y + 44)
    body += bar
    height = int(y + 10)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}">\n'
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto"><path d="M0,0 L10,5 L0,10 Z" fill="#6a1b9a"/></marker>'
        "</defs>\n"
        f'<rect width="{WIDTH}" height="{height}" fill="#ffffff"/>\n'
        + "\n".join(body)
        + "\n</svg>\n"
    )
