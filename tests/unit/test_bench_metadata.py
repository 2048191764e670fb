"""Counting what an entrypoint costs the metadata server, from strace's own output."""

from bench import liveness, metadata

CONTROL = "/w/nvrx/7/control"
# strace -f -qq -e trace=%file,openat: one line per call; a call another thread
# interrupts shows twice, its path only on the first line.
TRACE = f"""\
101 openat(AT_FDCWD, "{CONTROL}/closed", O_RDONLY|O_NONBLOCK|O_CLOEXEC|O_NOFOLLOW) = -1 ENOENT (No such file or directory)
102 newfstatat(AT_FDCWD, "{CONTROL}/task0.lease",  <unfinished ...>
101 openat(AT_FDCWD, "/usr/lib/python3.11/json/__init__.py", O_RDONLY|O_CLOEXEC) = 3
102 <... newfstatat resumed>{{st_mode=S_IFREG|0600, st_size=93, ...}}, 0) = 0
101 openat(AT_FDCWD, "/w/nvrx/7/control2/closed", O_RDONLY) = -1 ENOENT (No such file or directory)
[pid   103] utimensat(AT_FDCWD, "{CONTROL}/task0.lease", NULL, 0) = 0
101 newfstatat(AT_FDCWD, "{CONTROL}", {{st_mode=S_IFDIR|0700, st_size=4096, ...}}, AT_SYMLINK_NOFOLLOW) = 0
"""


def test_every_call_naming_the_control_directory_counts_once_and_nothing_else_counts():
    counted = metadata.calls(TRACE, CONTROL + "/")
    assert dict(counted) == {"openat": 1, "newfstatat": 2, "utimensat": 1}
    rates = metadata.per_second(counted, 2.0)
    assert rates["total"] == 2.0 and rates["newfstatat"] == 1.0


def test_each_window_of_three_roles_projects_one_whole_generation_per_size():
    def sample(window, role, total, calls=None, looks=0):
        return {"window": window, "role": role, "per_s": {"total": total},
                "calls": calls or {}, "looks": looks}  # fmt: skip

    samples = [
        s
        for w in (0, 1)
        for s in (
            sample(w, "task 0", 1.0),
            sample(w, "watcher", 2.0),
            sample(w, "other", 0.2, {"openat": 3, "newfstatat": 3}, looks=3),
        )
    ]
    samples.append(sample(2, "task 0", 1.0))  # a window without every role
    projected = liveness.projections(samples)
    assert len(projected[10_000]) == 2
    assert all(load <= liveness.TARGET_CALLS_S for load in projected[10_000])
    # 1 + 3 watchers x 2 + the others' two calls per look, 9,996 x 2 / 200 s.
    assert round(projected[10_000][0], 2) == round(1.0 + 6.0 + 9_996 * 2 / 200, 2)


def test_a_call_naming_one_file_is_told_apart_from_its_siblings():
    assert metadata.naming(TRACE, f"{CONTROL}/closed") == 1
    assert metadata.naming(TRACE, f"{CONTROL}/task0.lease") == 2
