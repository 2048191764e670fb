"""Where the root file system sits inside a SIF file (Apptainer's image format). Pure.

A SIF file is a global header, a table of descriptors, then data objects; the
container's root file system is a squashfs data object at some offset. Knowing that
offset lets unsquashfs read the image manifest out of a .sif without Apptainer.
Layout per the SIF specification (sylabs/sif): little-endian, packed.
"""

from __future__ import annotations

import struct

MAGIC = b"SIF_MAGIC"
_MAGIC_AT = 32  # after the 32-byte launch line
# launch[32] magic[10] version[3] arch[3] uuid[16] ctime mtime dfree dtotal descroff
# descrlen dataoff datalen (int64 each)
_HEADER = struct.Struct("<32s10s3s3s16sqqqqqqqq")
# datatype int32, used bool, id, groupid, link uint32, fileoff, filelen, storelen,
# ctime, mtime, uid, gid int64, name[128], extra[384]
_DESCRIPTOR = struct.Struct("<iBIIIqqqqqqq128s384s")
_PARTITION = struct.Struct("<ii")  # the start of a partition's extra: fstype, parttype
DATA_PARTITION = 0x4004
FS_SQUASHFS = 1
PART_PRIMARY_SYSTEM = 2
HEADER_SIZE = _HEADER.size
DESCRIPTOR_SIZE = _DESCRIPTOR.size
# Apptainer writes 48 descriptors; far more is a damaged or hostile header, whose
# table would otherwise be read into memory whole.
MAX_DESCRIPTORS = 4096


class SIFError(Exception):
    pass


def is_sif(head: bytes) -> bool:
    return head[_MAGIC_AT : _MAGIC_AT + len(MAGIC)] == MAGIC


def descriptor_table(header: bytes, file_size: int) -> tuple[int, int]:
    """(offset, count) of the descriptor table, from the global header's bytes; the
    table lies inside the file."""
    if len(header) < HEADER_SIZE or not is_sif(header):
        raise SIFError("not a SIF file (no SIF_MAGIC in its header)")
    fields = _HEADER.unpack_from(header)
    total, descroff = fields[8], fields[9]
    if total <= 0 or descroff < HEADER_SIZE:
        raise SIFError("SIF header has no descriptor table")
    if total > MAX_DESCRIPTORS or descroff + total * DESCRIPTOR_SIZE > file_size:
        raise SIFError(
            f"SIF header is damaged: {total} descriptors at offset {descroff} do not fit in "
            f"the file's {file_size} bytes"
        )
    return descroff, total


def rootfs_offset(table: bytes, file_size: int) -> int:
    """The file offset of the squashfs root file system, from the descriptor table.

    The primary system partition when one is marked, else the first squashfs one; only
    one that starts inside the file.
    """
    candidates: list[tuple[int, int]] = []
    for start in range(0, len(table) - DESCRIPTOR_SIZE + 1, DESCRIPTOR_SIZE):
        fields = _DESCRIPTOR.unpack_from(table, start)
        datatype, used, fileoff, extra = fields[0], fields[1], fields[5], fields[13]
        if not used or datatype != DATA_PARTITION:
            continue
        fstype, parttype = _PARTITION.unpack_from(extra)
        if fstype == FS_SQUASHFS and 0 <= fileoff < file_size:
            candidates.append((0 if parttype == PART_PRIMARY_SYSTEM else 1, fileoff))
    if not candidates:
        raise SIFError("SIF file holds no squashfs root file system")
    return min(candidates)[1]


def pack_header(descroff: int, total: int, dataoff: int, datalen: int) -> bytes:
    """A global header (for tests, and for anyone writing a minimal SIF)."""
    return _HEADER.pack(
        b"#!/usr/bin/env run-singularity\n".ljust(32, b"\0"),
        MAGIC.ljust(10, b"\0"),
        b"01\0",
        b"02\0",
        bytes(16),
        0,
        0,
        0,
        total,
        descroff,
        total * DESCRIPTOR_SIZE,
        dataoff,
        datalen,
    )


def pack_partition(
    ident: int, fileoff: int, filelen: int, parttype: int = PART_PRIMARY_SYSTEM
) -> bytes:
    extra = _PARTITION.pack(FS_SQUASHFS, parttype).ljust(384, b"\0")
    return _DESCRIPTOR.pack(
        DATA_PARTITION, 1, ident, 0, 0, fileoff, filelen, filelen, 0, 0, 0, 0, bytes(128), extra
    )
