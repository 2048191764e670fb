"""The latest-results blocks of docs/benchmarks.md, each between two markers. Pure: the
document's text in, the new text out. The prose around the blocks is written by hand and
never touched.

Two blocks: the recovery table (`results`), of a full run whose rows a partial run may
replace (`--only X --publish`: the block says which, and when), and the growth table of
the scale scenario (`scale`), which a run of that scenario alone may refresh.
"""

from __future__ import annotations

from collections.abc import Sequence

HEADING = "# Recovery benchmarks"
BLOCKS = {
    "results": "written by `python -m bench --publish`",
    "scale": "written by `python -m bench --only scale --publish`, or a full run",
}
BEGIN = f"<!-- bench:results:begin ({BLOCKS['results']}) -->"
END = "<!-- bench:results:end -->"


class ReadmeError(ValueError):
    pass


def markers(name: str = "results") -> tuple[str, str]:
    return f"<!-- bench:{name}:begin ({BLOCKS[name]}) -->", f"<!-- bench:{name}:end -->"


def block(
    table: str,
    when: str,
    machine_line: str,
    command: str,
    name: str = "results",
    refreshed: Sequence[str] = (),
) -> str:
    """A block; `refreshed` says which rows a later partial run replaced, one line each."""
    begin, end = markers(name)
    lines = [f"Latest run: {when}, `{command}`, on {machine_line}."]
    lines += [f"Re-run since: {line}." for line in refreshed]
    return "\n".join([begin, *lines, "", table, end])


def with_results(readme: str, new_block: str, name: str = "results") -> str:
    """Replace the named block; a document without one gets it appended (the results
    block under the heading, a new document's)."""
    begin, end = markers(name)
    start, stop = readme.find(begin), readme.find(end)
    if start == -1 and stop == -1:
        if name == "results" and HEADING in readme:
            raise ReadmeError(
                f"the results document has {HEADING!r} but no results markers; add {begin!r}"
            )
        heading = f"\n\n{HEADING}" if name == "results" else ""
        return readme.rstrip("\n") + f"{heading}\n\n{new_block}\n"
    if start == -1 or stop < start:
        raise ReadmeError(f"the {name} markers are torn; restore both marker lines")
    return readme[:start] + new_block + readme[stop + len(end) :]
