#!/usr/bin/env python3
"""Holds the code to sizes one can keep in one's head.

- No file in engine/ over 800 lines.
- No function in the library sources (common, io, cpu_optim, gpu, engine,
  models, bindings, tools) over 80 lines, unless the comment right above it
  says why with the words "long by design".

Functions are found from braces (comments, strings and preprocessor lines
set aside): a brace opening after a parameter list at namespace or class
scope begins one. Prints each offender as file:line and exits 1 if any;
`--list N` prints every function over N lines instead.
"""
import argparse
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCE_DIRS = ["common", "io", "cpu_optim", "gpu", "engine", "models", "bindings", "tools"]
EXTENSIONS = {".h", ".c", ".cpp", ".cu", ".cuh"}
MAX_ENGINE_FILE_LINES = 800
MAX_FUNCTION_LINES = 80
MARK = "long by design"


def blank(match):
    """Keeps a removed span's line breaks, so line numbers hold."""
    return re.sub(r"[^\n]", " ", match.group(0))


def code_only(text):
    text = re.sub(r"//[^\n]*|/\*.*?\*/", blank, text, flags=re.S)
    text = re.sub(r'R"(\w*)\(.*?\)\1"', blank, text, flags=re.S)
    text = re.sub(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', blank, text)
    return re.sub(r"^[ \t]*#[^\n]*(?:\\\n[^\n]*)*", blank, text, flags=re.M)


SCOPE = re.compile(r"\b(namespace|struct|class|union|enum)\b[^;{}()]*$|extern\s*$")
FUNCTION = re.compile(r"\)\s*(?:const|noexcept|override|final|mutable|&|&&|->[^{;]*|\s)*$")


def functions(text):
    """(first line, last line) of every function body, 1-based."""
    code = code_only(text)
    found, stack, head, line = [], [], "", 1
    for ch in code:
        if ch == "\n":
            line += 1
        if ch == "{":
            h = head.strip()
            in_function = any(kind == "function" for kind, _ in stack)
            if SCOPE.search(h):
                kind = "scope"
            elif not in_function and FUNCTION.search(h):
                kind = "function"
            else:
                kind = "block"
            stack.append((kind, line))
            head = ""
        elif ch == "}":
            if stack:
                kind, start = stack.pop()
                if kind == "function":
                    found.append((start, line))
            head = ""
        elif ch == ";":
            head = ""
        else:
            head += ch
    return found


def has_mark(lines, body_line):
    """Whether the comment above the function (before its signature) says why it is long."""
    i = body_line - 2  # 0-based index of the line before the body's first line
    # Walk up past the signature to the comment block above it.
    while i >= 0 and not lines[i].strip().startswith("//") and lines[i].strip():
        i -= 1
    comment = []
    while i >= 0 and lines[i].strip().startswith("//"):
        comment.insert(0, lines[i].strip()[2:].strip())
        i -= 1
    return MARK in " ".join(comment).lower()


def sources():
    for d in SOURCE_DIRS:
        base = ROOT / d
        if base.is_dir():
            for p in sorted(base.rglob("*")):
                if p.suffix in EXTENSIONS and p.is_file():
                    yield p


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--list", type=int, metavar="N", help="print every function over N lines and exit 0")
    args = ap.parse_args()
    bad = []
    for p in sources():
        rel = p.relative_to(ROOT)
        text = p.read_text(encoding="utf-8", errors="replace")
        lines = text.split("\n")
        if rel.parts[0] == "engine" and len(lines) - 1 > MAX_ENGINE_FILE_LINES:
            bad.append(f"{rel}: {len(lines) - 1} lines (engine/ files stay under {MAX_ENGINE_FILE_LINES})")
        for start, end in functions(text):
            n = end - start + 1
            if args.list is not None:
                if n > args.list:
                    print(f"{rel}:{start}: {n} lines")
            elif n > MAX_FUNCTION_LINES and not has_mark(lines, start):
                bad.append(f"{rel}:{start}: a function of {n} lines (over {MAX_FUNCTION_LINES}: split it, or "
                           f"say why in the comment above it with \"{MARK}\")")
    if args.list is not None:
        return 0
    for b in bad:
        print(b)
    print(f"check_sizes: {len(bad)} problem(s)" if bad else "check_sizes: OK")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
