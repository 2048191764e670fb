"""Find a chain's cycle-info directory and checkpoint tracker in its batch script, statically.

For a chain not submitted by nvrx-appliance there is no run.json; its sbatch says
where ft_launcher writes (--ft-cycle-info-dir) and what it reads for progress
(--ft-checkpoint-iteration-file). Production scripts build those from their own
variables and from libraries they `source`, located relative to the script itself.
This module evaluates exactly that much shell: assignments, ${VAR:-default} and
friends, `source`/`.`, `cd`, the path idioms $(dirname ..), $(basename ..),
$(cd .. && pwd), $(realpath ..), and a script asking `scontrol show job` for its own
Command= or WorkDir= (answered from what the watcher's Slurm calls said). It never
runs anything; reading an included file goes through the `read` function the caller
passes in, so the module itself does no I/O.

Values Slurm only knows at run time (SLURM_ARRAY_JOB_ID, ...) become '*', which turns a
per-generation directory into a glob over every generation. Anything else unknown
leaves the path unresolved, and the caller asks for --work-dir / --cycle-info-glob.

Pure: no I/O.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass, field

WILDCARD = "*"
RUNTIME_IDS = frozenset(
    {
        "SLURM_ARRAY_JOB_ID",
        "SLURM_JOB_ID",
        "SLURM_JOBID",
        "SLURM_ARRAY_TASK_ID",
        "SLURM_RESTART_COUNT",
        "SLURM_NODEID",
        "SLURM_PROCID",
        "SLURM_LOCALID",
        "SLURMD_NODENAME",
        "SLURM_TASK_PID",
        "HOSTNAME",
    }
)
CYCLE_FLAGS = ("--ft-cycle-info-dir", "--ft_cycle_info_dir")
TRACKER_FLAGS = ("--ft-checkpoint-iteration-file", "--ft_checkpoint_iteration_file")
MAX_INCLUDE_DEPTH = 8  # deeper than any real library stack; stops include cycles
# What a script may ask `scontrol show job` about itself, and the text filters that cut
# the answer out of scontrol's output (the answer itself is known, not computed).
JOB_FIELDS = ("Command", "WorkDir")
_JOB_FIELD = re.compile(r"\b(" + "|".join(JOB_FIELDS) + r")\b")
_TEXT_FILTERS = frozenset(
    {"awk", "gawk", "mawk", "grep", "egrep", "sed", "cut", "head", "tail", "tr"}
)
_UNKNOWN = "\x00"  # brackets the name of an unknown value inside an expanded word
_BLANK = "\x01"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_OPERATORS = ("&&", "||", ";", "|", "\n", "(", ")", "&")
_KEYWORDS = frozenset(
    {"export", "local", "declare", "readonly", "typeset", "then", "do", "else", "{", "}", "!"}
)


@dataclass(frozen=True)
class ScriptPaths:
    cycle_info_dir: str | None  # may hold '*' where a run-time id stood
    tracker: str | None  # the checkpoint-iteration file
    unresolved: tuple[str, ...]  # flags found whose values could not be known, shown
    files_read: tuple[str, ...]


@dataclass
class _Shell:
    read: Callable[[str], str | None]
    vars: dict[str, str]
    cwd: str
    main_script: str
    job: dict[str, str]  # what `scontrol show job` says of this job (JOB_FIELDS)
    found: dict[str, str] = field(default_factory=dict)
    unresolved: dict[str, str] = field(default_factory=dict)  # flag -> value as shown
    files_read: list[str] = field(default_factory=list)


def resolve(
    script_path: str,
    text: str,
    read: Callable[[str], str | None],
    known: dict[str, str],
    cwd: str,
    job: dict[str, str] | None = None,
) -> ScriptPaths:
    """Evaluate the batch script at `script_path` (content `text`) as far as it can be
    evaluated without running it. `known`: what Slurm would set (SLURM_SUBMIT_DIR,
    SLURM_JOB_NAME, USER, HOME); `cwd`: the job's working directory; `job`: the job's
    scontrol fields (Command, WorkDir), for scripts that ask scontrol where they are."""
    shell = _Shell(
        read=read, vars=dict(known), cwd=cwd, main_script=script_path, job=dict(job or {})
    )
    shell.files_read.append(script_path)
    _run_text(shell, text, script_path, depth=0)
    return ScriptPaths(
        cycle_info_dir=shell.found.get("cycle"),
        tracker=shell.found.get("tracker"),
        unresolved=tuple(f"{flag} {value}" for flag, value in shell.unresolved.items()),
        files_read=tuple(shell.files_read),
    )


# --- tokenizing --------------------------------------------------------------------------


def tokenize(text: str) -> list[str]:
    """Words (quotes kept, for expansion later) and operators; comments dropped."""
    tokens: list[str] = []
    i, word = 0, ""
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            if text[i + 1] != "\n":  # a line continuation joins lines
                word += text[i : i + 2]
            i += 2
        elif ch in "'\"" or (ch == "$" and text[i + 1 : i + 2] in ("(", "{")):
            end = _span_end(text, i)
            word += text[i:end]
            i = end
        elif ch == "#" and not word:
            i = text.find("\n", i) if "\n" in text[i:] else len(text)
        elif ch in " \t":
            word = _flush(tokens, word)
            i += 1
        else:
            op = next((o for o in _OPERATORS if text.startswith(o, i)), None)
            if op:  # NAME=( ... ) is an array: the word before '(' keeps its '='
                word = _flush(tokens, word)
                tokens.append(op)
                i += len(op)
            else:
                word += ch
                i += 1
    _flush(tokens, word)
    return tokens


def _flush(tokens: list[str], word: str) -> str:
    if word:
        tokens.append(word)
    return ""


def _span_end(text: str, i: int) -> int:
    """Index just past the quoted string, $(..) or ${..} starting at i."""
    if text[i] == "'":
        end = text.find("'", i + 1)
        return len(text) if end < 0 else end + 1
    if text[i] == '"':
        j = i + 1
        while j < len(text) and text[j] != '"':
            if text[j] == "\\":
                j += 2
            elif text[j] == "$" and text[j + 1 : j + 2] in ("(", "{"):
                j = _span_end(text, j)
            else:
                j += 1
        return min(j + 1, len(text))
    close = ")" if text[i + 1] == "(" else "}"
    depth, j = 0, i + 1
    while j < len(text):
        if text[j] in "'\"":
            j = _span_end(text, j)
            continue
        if text[j] == "\\":
            j += 2
            continue
        if text[j] == text[i + 1]:
            depth += 1
        elif text[j] == close:
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return len(text)


# --- expanding ---------------------------------------------------------------------------


def expand(shell: _Shell, word: str, script: str) -> str:
    """One word with its quotes removed and its expansions done (no field splitting)."""
    out, i = "", 0
    if word.startswith("~") and (len(word) == 1 or word[1] == "/"):
        out, i = _lookup(shell, "HOME", script), 1
    while i < len(word):
        ch = word[i]
        if ch == "'":
            end = _span_end(word, i)
            out += word[i + 1 : end - 1]
            i = end
        elif ch == '"':
            end = _span_end(word, i)
            out += expand(shell, _unquote_double(word[i + 1 : end - 1]), script)
            i = end
        elif ch == "\\" and i + 1 < len(word):
            out += word[i + 1]
            i += 2
        elif ch == "$":
            value, i = _dollar(shell, word, i, script)
            out += value
        else:
            out += ch
            i += 1
    return out


def _unquote_double(inner: str) -> str:
    # Inside double quotes only $ expands; protect single quotes so they stay literal.
    return inner.replace("'", "\\'")


def _dollar(shell: _Shell, word: str, i: int, script: str) -> tuple[str, int]:
    nxt = word[i + 1 : i + 2]
    if nxt == "(":
        end = _span_end(word, i)
        return _substitute(shell, word[i + 2 : end - 1], script), end
    if nxt == "{":
        end = _span_end(word, i)
        return _braced(shell, word[i + 2 : end - 1], script), end
    if nxt == "0":
        return shell.main_script, i + 2
    match = re.match(r"[A-Za-z_][A-Za-z0-9_]*", word[i + 1 :])
    if not match:
        return "$", i + 1
    return _lookup(shell, match.group(0), script), i + 1 + match.end()


def _braced(shell: _Shell, body: str, script: str) -> str:
    if body in ("BASH_SOURCE", "BASH_SOURCE[0]"):
        return script
    body = re.sub(r"^([A-Za-z_][A-Za-z0-9_]*)\[[@*]\]$", r"\1", body)  # a whole array
    match = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-=+])(.*))?$", body, re.S)
    if not match:
        return _unknown("${" + body + "}")
    name, op, arg = match.groups()
    value = shell.vars.get(name)
    empty_counts = op is not None and op.startswith(":")
    is_set = value is not None and not (empty_counts and value == "")
    if op and op.endswith("+"):
        return expand(shell, arg, script) if is_set else ""
    if op and not is_set:
        default = expand(shell, arg, script)
        if op.endswith("="):
            shell.vars[name] = default
        return default
    return _lookup(shell, name, script)


def _lookup(shell: _Shell, name: str, script: str) -> str:
    if name in shell.vars:
        return shell.vars[name]
    if name == "PWD":
        return shell.cwd
    if name in RUNTIME_IDS:
        return WILDCARD
    return _unknown("$" + name)


def _unknown(what: str) -> str:
    return f"{_UNKNOWN}{what}{_UNKNOWN}"


def shown(value: str) -> str:
    """An expanded value with its unknown parts named, for a message."""
    return re.sub(f"{_UNKNOWN}(.*?){_UNKNOWN}", r"<\1: unknown>", value)


def _substitute(shell: _Shell, command: str, script: str) -> str:
    """$(...) for the path idioms production scripts use; anything else is unknown."""
    asked = _ask_scontrol(shell, command, script)
    if asked is not None:
        return asked
    cwd = shell.cwd
    for part in _split(tokenize(command), ("&&", ";", "\n")):
        words = [expand(shell, w, script) for w in part]
        if not words:
            continue
        if any(_UNKNOWN in w for w in words):
            break  # a path idiom over an unknown value is unknown as a whole
        verb, args = words[0], [a for a in words[1:] if not a.startswith("-")]
        if verb == "cd" and args:
            cwd = _absolute(cwd, args[0])
        elif verb == "pwd":
            return cwd
        elif verb == "dirname" and args:
            return posixpath.dirname(args[0].rstrip("/")) or "."
        elif verb == "basename" and args:
            return posixpath.basename(args[0].rstrip("/"))
        elif verb in ("realpath", "readlink") and args:
            return _absolute(cwd, args[0])
        else:
            break
    return _unknown("$(" + command + ")")


def _ask_scontrol(shell: _Shell, command: str, script: str) -> str | None:
    """`scontrol show job $SLURM_JOB_ID | awk -F= '/Command=/{print $2}'` and its kin.

    Inside a batch job $0 is slurmd's spooled copy, so scripts ask Slurm for their own
    Command= (or WorkDir=) to find the files next to them. The watcher has the answer
    from its own scontrol / sacct call. None: the command is not such a question.
    """
    stages = _split(tokenize(command), ("|",))
    asks = [expand(shell, w, script) for w in stages[0]]
    if len(stages) < 2 or asks[:1] != ["scontrol"] or "job" not in asks:
        return None
    job_id = asks[asks.index("job") + 1 : asks.index("job") + 2]
    fields = set(_JOB_FIELD.findall(command))
    if job_id != [WILDCARD] or len(fields) != 1:
        return None  # another job's, or not one field: not a question about itself
    value = shell.job.get(fields.pop(), "")
    for stage in stages[1:]:
        words = stage[1:] if stage[:1] == ["xargs"] else stage
        verb = words[0] if words else ""
        if verb == "dirname":
            value = posixpath.dirname(value)
        elif verb == "basename":
            value = posixpath.basename(value)
        elif verb in ("realpath", "readlink"):
            value = _absolute(shell.cwd, value) if value else ""
        elif verb and verb not in _TEXT_FILTERS:
            value = ""
    return value or _unknown("$(" + command + ")")


def _split(tokens: list[str], separators: tuple[str, ...]) -> list[list[str]]:
    """Tokens -> the words of each part between separators (other operators dropped)."""
    parts: list[list[str]] = [[]]
    for token in tokens:
        if token in separators:
            parts.append([])
        elif token not in _OPERATORS:
            parts[-1].append(token)
    return parts


def _absolute(cwd: str, path: str) -> str:
    return posixpath.normpath(posixpath.join(cwd, path))


# --- evaluating --------------------------------------------------------------------------


def _run_text(shell: _Shell, text: str, script: str, depth: int) -> None:
    command: list[str] = []
    tokens = tokenize(text)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token == "(" and command and command[-1].endswith("="):
            close = tokens.index(")", i) if ")" in tokens[i:] else len(tokens)
            _assign_array(shell, command.pop()[:-1], tokens[i + 1 : close], script)
            i = close + 1
            continue
        if token in _OPERATORS:
            _run_command(shell, command, script, depth)
            command = []
        else:
            command.append(token)
        i += 1
    _run_command(shell, command, script, depth)


def _assign_array(shell: _Shell, name: str, words: list[str], script: str) -> None:
    values = [expand(shell, w, script) for w in words if w not in _OPERATORS]
    _scan_flags(shell, values)
    if _NAME.match(name):
        shell.vars[name] = " ".join(values)


def _run_command(shell: _Shell, words: list[str], script: str, depth: int) -> None:
    while words and words[0] in _KEYWORDS:
        words = words[1:]
    while words and _assignment(words[0]):
        name, _, raw = words[0].partition("=")
        value = expand(shell, raw, script)
        shell.vars[name.rstrip("+")] = (
            shell.vars.get(name[:-1], "") + value if name.endswith("+") else value
        )
        words = words[1:]
    if not words:
        return
    expanded = [expand(shell, w, script) for w in words]
    _scan_flags(shell, expanded)
    verb = expanded[0]
    if verb in ("source", ".") and len(expanded) > 1:
        _include(shell, expanded[1], script, depth)
    elif verb == "cd" and len(expanded) > 1 and _UNKNOWN not in expanded[1]:
        shell.cwd = _absolute(shell.cwd, expanded[1])


def _assignment(word: str) -> bool:
    name, sep, _ = word.partition("=")
    return bool(sep) and _NAME.match(name.rstrip("+")) is not None


def _include(shell: _Shell, target: str, script: str, depth: int) -> None:
    if _UNKNOWN in target or WILDCARD in target:
        return
    if depth >= MAX_INCLUDE_DEPTH:
        return  # an include cycle, or nesting no real library stack reaches
    for candidate in dict.fromkeys(
        [_absolute(shell.cwd, target), _absolute(posixpath.dirname(script), target)]
    ):
        text = shell.read(candidate)
        if text is not None:
            shell.files_read.append(candidate)
            _run_text(shell, text, candidate, depth + 1)
            return


def _scan_flags(shell: _Shell, words: list[str]) -> None:
    # Split on blanks (a flag and its value may sit in one string) but never inside the
    # name of an unknown value, which may itself hold blanks.
    def protect(word: str) -> str:
        return re.sub(
            f"{_UNKNOWN}[^{_UNKNOWN}]*{_UNKNOWN}", lambda m: re.sub(r"\s", _BLANK, m[0]), word
        )

    pieces = [piece.replace(_BLANK, " ") for w in words for piece in protect(w).split()]
    for i, piece in enumerate(pieces):
        for key, flags in (("cycle", CYCLE_FLAGS), ("tracker", TRACKER_FLAGS)):
            for flag in flags:
                value = None
                if piece == flag and i + 1 < len(pieces):
                    value = pieces[i + 1]
                elif piece.startswith(flag + "="):
                    value = piece[len(flag) + 1 :]
                if value and _UNKNOWN in value:
                    shell.unresolved[flags[0]] = shown(value)
                elif value:
                    shell.found[key] = value
                    shell.unresolved.pop(flags[0], None)
