"""`cru mcp` over pipes reads and writes stdin/stdout with trio's non-blocking streams (no worker
thread per message): what is written to fd 1 while serving (a stray print, a child process)
goes to stderr, never into the protocol, and the descriptors are back as they were after."""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent('''
    import os, trio
    from mcp_bridge.server import _native_stdio

    async def main():
        async with _native_stdio() as native:
            assert native is not None, "pipes should be served natively"
            reader, writer = native
            print("stray print", flush=True)
            os.system("echo stray child")
            async for line in reader:
                await writer.write("got " + line)
                await writer.flush()
        print("after", os.get_blocking(0), os.get_blocking(1), flush=True)

    trio.run(main)
''')


def test_turn_native_stdio_keeps_stray_output_off_the_wire_and_restores_the_fds() -> None:
    res = subprocess.run([sys.executable, "-c", CHILD], input="one\n{\"two\": 2}\nlast line without newline",
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout == 'got one\ngot {"two": 2}\ngot last line without newline' + "after True True\n"
    assert "stray print" in res.stderr
    assert "stray child" in res.stderr


def test_turn_native_stdio_is_not_used_on_a_terminal_or_file() -> None:
    child = "import trio\nfrom mcp_bridge.server import _native_stdio\n" \
            "async def main():\n    async with _native_stdio() as native:\n        print(native is None)\n" \
            "trio.run(main)\n"
    with open("/dev/null") as devnull:  # stdin is a character device, not a pipe
        res = subprocess.run([sys.executable, "-c", child], stdin=devnull, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "True"
