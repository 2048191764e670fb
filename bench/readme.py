"""The latest-results block of docs/benchmarks.md, between two markers. Pure: the
document's text in, the new text out. The prose around the block is written by hand and
never touched."""

from __future__ import annotations

BEGIN = "<!-- bench:results:begin (written by `python -m bench --publish`) -->"
END = "<!-- bench:results:end -->"
HEADING = "# Recovery benchmarks"


class ReadmeError(ValueError):
    pass


def block(table: str, when: str, machine_line: str, command: str) -> str:
    return "\n".join(
        [BEGIN, f"Latest run: {when}, `{command}`, on {machine_line}.", "", table, END]
    )


def with_results(readme: str, new_block: str) -> str:
    """Replace the marked block; a document without one gets the section appended."""
    start, stop = readme.find(BEGIN), readme.find(END)
    if start == -1 and stop == -1:
        if HEADING in readme:
            raise ReadmeError(
                f"the results document has {HEADING!r} but no results markers; add {BEGIN!r}"
            )
        return readme.rstrip("\n") + f"\n\n{HEADING}\n\n{new_block}\n"
    if start == -1 or stop < start:
        raise ReadmeError("the benchmark markers are torn; restore both marker lines")
    return readme[:start] + new_block + readme[stop + len(END) :]
