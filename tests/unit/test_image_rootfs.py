"""The rootfs front end: what it borrows from the host and the commands it plans."""

from __future__ import annotations

from pathlib import Path

from nvrx_appliance.image import rootfs
from nvrx_appliance.image.pins import load

DEB822 = """\
Types: deb
# a snapshot mirror, commented out
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
"""


def test_the_debian_mirror_comes_from_deb822_sources():
    assert rootfs.debian_mirror([DEB822], "bookworm") == "http://mirror.example/debian"


def test_the_debian_mirror_comes_from_one_line_sources_with_options():
    text = (
        "# comment\ndeb [arch=amd64 signed-by=/k.gpg] http://other.example/debian bookworm main\n"
    )
    assert rootfs.debian_mirror([text], "bookworm") == "http://other.example/debian"


def test_no_matching_suite_leaves_the_mirror_to_debootstrap():
    assert rootfs.debian_mirror([DEB822], "trixie") is None


PIP_LISTING = """\
global.cert='/etc/ssl/certs/ca-certificates.crt'
global.constraint='/etc/pip/constraints.txt'
global.extra-index-url='file:///srv/pypi/simple https://index.example/simple'
global.find-links='/srv/wheels'
:env:.find-links='/srv/wheels'
:env:.default-timeout='180'
user.ignored='x'
"""


def test_pip_settings_are_read_from_pip_config_list_with_later_scopes_winning():
    settings = rootfs.parse_pip_config(PIP_LISTING)
    assert settings["find-links"] == "/srv/wheels"
    assert settings["default-timeout"] == "180"
    assert "ignored" not in settings


def test_local_pip_paths_are_bound_read_only_and_the_settings_rewritten_to_them():
    existing = {
        "/etc/ssl/certs/ca-certificates.crt",
        "/etc/pip/constraints.txt",
        "/srv/pypi/simple",
        "/srv/wheels",
    }
    borrowed = rootfs.borrow_pip(rootfs.parse_pip_config(PIP_LISTING), existing.__contains__)
    binds = dict(borrowed.binds)
    # The index is bound with its parent, so its relative links to ../../files resolve.
    assert binds["/srv/pypi"].startswith(rootfs.BUILD_ROOT + "/host/")
    assert borrowed.env["PIP_EXTRA_INDEX_URL"] == (
        f"file://{binds['/srv/pypi']}/simple https://index.example/simple"
    )
    assert borrowed.env["PIP_FIND_LINKS"] == binds["/srv/wheels"]
    assert borrowed.env["PIP_CONSTRAINT"] == binds["/etc/pip/constraints.txt"]
    assert borrowed.env["PIP_DEFAULT_TIMEOUT"] == "180"
    # Nothing is bound at a path inside the image, so no mount point is left in it.
    assert all(inside.startswith(rootfs.BUILD_ROOT + "/") for inside in binds.values())


def test_a_pip_path_that_does_not_exist_on_the_host_is_passed_on_unchanged():
    borrowed = rootfs.borrow_pip({"find-links": "/nowhere"}, lambda _p: False)
    assert borrowed.env == {"PIP_FIND_LINKS": "/nowhere"} and borrowed.binds == ()


def test_debootstrap_downloads_the_package_tarball_once_then_unpacks_from_it():
    pins = load()
    root, tarball = Path("/w/rootfs"), Path("/cache/deb.tar.gz")
    first = rootfs.debootstrap_steps(
        pins, root=root, tarball=tarball, tarball_cached=False, mirror="http://m/debian"
    )
    assert [s.argv[:3] for s in first] == [
        ("debootstrap", "--variant=minbase", "--make-tarball=/cache/deb.tar.gz.partial"),
        ("mv", "/cache/deb.tar.gz.partial", "/cache/deb.tar.gz"),
        ("debootstrap", "--variant=minbase", "--unpack-tarball=/cache/deb.tar.gz"),
    ]
    assert first[-1].argv[3:] == (pins.cpu_suite, "/w/rootfs", "http://m/debian")
    again = rootfs.debootstrap_steps(
        pins, root=root, tarball=tarball, tarball_cached=True, mirror=None
    )
    assert [s.argv for s in again] == [
        (
            "debootstrap",
            "--variant=minbase",
            "--unpack-tarball=/cache/deb.tar.gz",
            pins.cpu_suite,
            "/w/rootfs",
        )
    ]


def test_the_install_step_runs_the_script_in_the_new_root_with_pip_settings_in_env_not_argv():
    borrowed = rootfs.Borrowed({"PIP_INDEX_URL": "https://user:secret@index.example/simple"}, ())
    item = rootfs.install_step(
        root=Path("/w/rootfs"),
        context=Path("/w/context"),
        pip_cache=Path("/cache/pip"),
        apt_archives=Path("/cache/apt"),
        borrowed=borrowed,
        host_env={"https_proxy": "http://proxy:3128", "SECRET": "no"},
    )
    argv = item.argv
    assert argv[:4] == ("bwrap", "--bind", "/w/rootfs", "/")
    assert argv[-2:] == ("/bin/bash", f"{rootfs.CONTEXT}/install.sh")
    assert "secret" not in " ".join(argv)
    assert item.env["PIP_INDEX_URL"].endswith("@index.example/simple")
    assert item.env["https_proxy"] == "http://proxy:3128"
    assert "SECRET" not in item.env
    assert item.env["PIP_CACHE_DIR"] == rootfs.PIP_CACHE


def test_the_image_is_packed_with_enroots_squash_options():
    item = rootfs.squash_step(Path("/w/rootfs"), Path("/images/.x.partial"), 2)
    assert item.argv[:3] == ("mksquashfs", "/w/rootfs", "/images/.x.partial")
    assert item.argv[3:6] == ("-comp", "lzo", "-noD")
