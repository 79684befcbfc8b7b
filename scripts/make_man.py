#!/usr/bin/env python3
"""Writes metro.1, the manual page, from the binary's own help: `metro --help` for the
command list and `metro <command> --help` for each command's options, so the page always
says what the binary it was built with does.

    scripts/make_man.py build/bin/metro build/metro.1
"""
import re
import subprocess
import sys


def roff(text):
    """Text as roff lines: backslashes escaped, no line starting with a control character."""
    out = []
    for line in text.rstrip("\n").split("\n"):
        line = line.replace("\\", "\\e")
        if line.startswith((".", "'")):
            line = "\\&" + line
        out.append(line)
    return "\n".join(out)


def main():
    metro, dest = sys.argv[1], sys.argv[2]
    run = lambda *a: subprocess.run([metro, *a], capture_output=True, text=True, timeout=60).stdout
    top = run("--help")
    version = run("--version").split("\n")[0].strip() or "metro"
    commands = re.findall(r"^  ([a-z][a-z-]*)\s{2,}(.+)$", top, re.M)
    assert commands, "no command list in `metro --help`"
    page = [
        f'.TH METRO 1 "" "{version}" "User Commands"',
        ".SH NAME",
        "metro \\- an LLM inference server with an OpenAI-compatible API",
        ".SH SYNOPSIS",
        ".B metro",
        ".I command",
        "[\\fIoptions\\fR]",
        ".SH DESCRIPTION",
        "metro loads GGUF language models and serves them over HTTP (OpenAI's completions, chat,",
        "responses and embeddings APIs), runs them from the command line, and measures them.",
        ".SH COMMANDS",
    ]
    for name, summary in commands:
        page += [".TP", f"\\fB{name}\\fR", roff(summary)]
    for name, _ in commands:
        if name == "version":
            continue
        page += [f'.SH "METRO {name.upper()}"', ".nf", roff(run(name, "--help")), ".fi"]
    page += [
        ".SH FILES",
        ".TP",
        "\\fI~/.metro_chat_history\\fR",
        "the line history of \\fBmetro chat\\fR",
        ".SH SEE ALSO",
        "The documentation installed with metro (docs/server.md for the HTTP API, docs/deploy.md for",
        "deployment).",
    ]
    with open(dest, "w") as f:
        f.write("\n".join(page) + "\n")


if __name__ == "__main__":
    main()
