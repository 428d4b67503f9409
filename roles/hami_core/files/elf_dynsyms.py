#!/usr/bin/env python
"""Print the defined dynamic symbols of an ELF shared object as JSON (stdlib only).

Why not ``nm -D``: binutils is absent on minimal nodes and container images, while Python is always there
(Ansible needs it). Reads the section headers for SHT_DYNSYM and its string table; handles ELF32/ELF64
in either byte order. Always exits 0 and reports problems in the JSON, so the calling role can fail with
a message that names the file and the fix.

Output: {"path": ..., "elf": bool, "machine": int|None, "defined": [names], "error": str|None}
"""

import json
import struct
import sys

SHT_DYNSYM = 11
SHN_UNDEF = 0


def read_symbols(path):
    with open(path, "rb") as fh:
        data = fh.read()
    if data[:4] != b"\x7fELF":
        raise ValueError("not an ELF file (no \\x7fELF magic)")
    is64 = data[4] == 2
    endian = "<" if data[5] == 1 else ">"
    if is64:
        e_type, e_machine = struct.unpack_from(endian + "HH", data, 16)
        e_shoff, = struct.unpack_from(endian + "Q", data, 40)
        e_shentsize, e_shnum = struct.unpack_from(endian + "HH", data, 58)
        sh_fmt, sym_fmt, sym_size = endian + "IIQQQQIIQQ", endian + "IBBHQQ", 24
    else:
        e_type, e_machine = struct.unpack_from(endian + "HH", data, 16)
        e_shoff, = struct.unpack_from(endian + "I", data, 32)
        e_shentsize, e_shnum = struct.unpack_from(endian + "HH", data, 46)
        sh_fmt, sym_fmt, sym_size = endian + "IIIIIIIIII", endian + "IIIBBH", 16
    if e_type != 3:  # ET_DYN
        raise ValueError("ELF type %d is not a shared object (ET_DYN)" % e_type)
    sections = [struct.unpack_from(sh_fmt, data, e_shoff + i * e_shentsize) for i in range(e_shnum)]
    names = []
    for sh in sections:
        if sh[1] != SHT_DYNSYM:
            continue
        offset, size, link = sh[4], sh[5], sh[6]
        str_off = sections[link][4]
        for pos in range(offset + sym_size, offset + size, sym_size):  # entry 0 is the null symbol
            if is64:
                st_name, _info, _other, st_shndx, _value, _size = struct.unpack_from(sym_fmt, data, pos)
            else:
                st_name, _value, _size, _info, _other, st_shndx = struct.unpack_from(sym_fmt, data, pos)
            if st_shndx == SHN_UNDEF:
                continue
            end = data.index(b"\0", str_off + st_name)
            names.append(data[str_off + st_name:end].decode("ascii", "replace"))
    return e_machine, sorted(set(names))


def main(argv):
    if len(argv) != 2:
        sys.stderr.write("usage: elf_dynsyms.py FILE\n")
        return 2
    out = {"path": argv[1], "elf": False, "machine": None, "defined": [], "error": None}
    try:
        out["machine"], out["defined"] = read_symbols(argv[1])
        out["elf"] = True
    except (OSError, ValueError, struct.error, IndexError) as exc:
        out["error"] = str(exc)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
