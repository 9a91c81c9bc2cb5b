"""Every fenced block of README.md and docs/*.md, run or checked as the page states it.

A block is one pytest case, named after its page and line. What each kind gets:

  sh       every command runs (a line ending in `\\` continues; `# ...` is a comment),
           from a scratch directory that holds the repository's examples/, bench/,
           scripts/, docs/, README.md and build/release/ (the build under test);
           the build's tools/ and bench/ are on PATH (`strata`, `strata-train`)
  python   runs under the interpreter that runs this file, the build's package first
  c        declarations (prototypes, structs) are checked against strata/strata.h by
           the compiler; a fragment compiles and runs inside main() after its `given:`
  cpp      compiles (syntax only) against the source tree after its `given:`
  json     parses, and equals the file its `file:` names
  (none)   text: a diagram or a sample of output. A line `$ command` in it runs the
           command, and each line quoted beneath it must be a line of its output.

`/mnt/nvme`, the pages' stand-in for an NVMe mount, becomes a scratch directory, with
the directories a block names in it (`/mnt/nvme/strata`; a name with a dot is a file).

A page says more about a block in an HTML comment just above it (invisible when
rendered), one `key: value` a line:

  <!-- doc-test
  shortened: strata-train --steps 2 ...   the block's Nth command, shortened (Nth line;
                                           `as written`, or `not run: REASON`)
  given: code                              run before the block (sh, python, c, cpp)
  sub: TEXT => REPLACEMENT                 in the block before it runs (an elision, ...)
  expect: TEXT                             the output holds TEXT (a figure the page quotes)
  exit: N                                  the block's commands end with status N (default 0)
  file: PATH                               json: the block is this file of the repository
  needs: gpu | root                        skipped, saying so, without it
  from: repository                         run from the repository root, not the scratch directory
  skip: REASON                             not run here (the test run itself runs it)
  -->

A shortened command keeps the program of the one it stands for. A block that cannot
be run and has no `skip:` fails.
"""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("STRATA_BUILD_DIR", ROOT / "build" / "release")).resolve()
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
MARK = re.compile(r"<!-- doc-test\s*\n(.*?)-->\s*", re.S)
KEYS = {"shortened", "given", "sub", "expect", "exit", "file", "needs", "from", "skip"}
TIMEOUT_S = 600


def parse_marks(before):
    """The `key: value` lines of the doc-test comment that ends just above a block."""
    m = MARK.fullmatch(before, before.rfind("<!-- doc-test")) if "<!-- doc-test" in before else None
    marks = {}
    if not m:
        return marks
    for line in m.group(1).splitlines():
        if not line.strip():
            continue
        key, sep, value = line.partition(":")
        key = key.strip()
        assert sep and key in KEYS, f"doc-test comment: '{line}' is not one of {sorted(KEYS)}: value"
        marks.setdefault(key, []).append(value.strip())
    return marks


def blocks():
    out = []
    for page in PAGES:
        text = page.read_text()
        for m in FENCE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            name = f"{page.relative_to(ROOT)}:{line}"
            out.append(pytest.param(m.group(1), m.group(2), parse_marks(text[: m.start()]), id=name))
    return out


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    if not (BUILD / "tools" / "strata").exists():
        pytest.fail(f"no build at {BUILD} (STRATA_BUILD_DIR): build the release preset first")
    w = tmp_path_factory.mktemp("docs")
    for name in ("examples", "bench", "scripts", "docs", "README.md", "tests"):
        (w / name).symlink_to(ROOT / name)
    (w / "build").mkdir()
    (w / "build" / "release").symlink_to(BUILD)
    (w / "mnt" / "nvme").mkdir(parents=True)
    return w


def environment(w):
    env = dict(os.environ)
    env["PATH"] = f"{BUILD / 'tools'}:{BUILD / 'bench'}:{env.get('PATH', '')}"
    env["PYTHONPATH"] = f"{BUILD / 'python'}:{env.get('PYTHONPATH', '')}"
    env["STRATA_DOC_TEST_DIR"] = str(w)
    return env


def localise(text, w, marks):
    for rule in marks.get("sub", []):
        old, sep, new = rule.partition("=>")
        assert sep, f"sub: '{rule}' needs TEXT => REPLACEMENT"
        old, new = old.strip(), new.strip()
        assert old in text, f"sub: '{old}' is not in the block"
        text = text.replace(old, new)
    for name in re.findall(r"/mnt/nvme/([\w-]+)(?![\w.-])", text):
        (w / "mnt" / "nvme" / name).mkdir(exist_ok=True)
    return text.replace("/mnt/nvme", str(w / "mnt" / "nvme"))


def commands(body):
    """The shell commands of a block, continuation lines joined, each as the page writes it (the
    shell drops its `# ...`); blank and comment-only lines are none."""
    out, pending = [], ""
    for raw in body.splitlines():
        line = pending + raw
        if line.rstrip().endswith("\\"):
            pending = line.rstrip()[:-1] + " "
            continue
        pending = ""
        if shlex.split(line, comments=True):
            out.append(line)
    return out


def run(cmd, w, expect_exit=0, shell=True):
    r = subprocess.run(cmd, shell=shell, cwd=w, env=environment(w), capture_output=True, text=True,
                       timeout=TIMEOUT_S)
    output = r.stdout + r.stderr
    assert r.returncode == expect_exit, (f"`{cmd if isinstance(cmd, str) else shlex.join(cmd)}` exited "
                                         f"{r.returncode}, not {expect_exit}:\n{output[-4000:]}")
    return output


def check_expect(output, marks):
    for want in marks.get("expect", []):
        assert want in output, f"the page quotes '{want}', which the output lacks:\n{output[-4000:]}"


def program(cmd):
    """The program a command runs: its first word that is not an environment assignment."""
    return next(word for word in shlex.split(cmd) if "=" not in word)


def run_sh(body, marks, w):
    cmds = commands(body)
    if marks.get("from") == ["repository"]:
        # The repository's own scripts build build/release: only when that is the build under test.
        if BUILD != (ROOT / "build" / "release").resolve():
            pytest.skip(f"runs the repository's scripts, which build build/release, not {BUILD}")
        w = ROOT
    for setup in marks.get("given", []):
        run(setup, w)
    short = marks.get("shortened", [])
    assert len(short) <= len(cmds), f"{len(short)} shortened commands for a block of {len(cmds)}"
    for i, s in enumerate(short):
        if s == "as written":
            continue
        if s.startswith("not run:"):  # printed: pytest -rA shows it
            print(f"`{cmds[i]}`: {s}")
            cmds[i] = None
            continue
        assert program(s) == program(cmds[i]), f"'{s}' does not shorten '{cmds[i]}'"
        cmds[i] = s
    expect_exit = int(marks.get("exit", ["0"])[0])
    output = "".join(run(localise(c, w, marks), w, expect_exit) for c in cmds if c is not None)
    check_expect(output, marks)


def run_python(body, marks, w):
    code = "\n".join(marks.get("given", [])) + "\n" + body
    output = run([sys.executable, "-c", localise(code, w, marks)], w, shell=False)
    check_expect(output, marks)


PROTOTYPE = re.compile(r"^[\w\s\*]+\b\w+\s*\(.*\)$", re.S)
STRUCT = re.compile(r"typedef\s+struct\s+(\w+)\s*\{(.*?)\}\s*(\w+)\s*;", re.S)


def c_statements(body):
    """A C block's text without its comments."""
    text = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    return text


def struct_checks(body):
    """For each `typedef struct NAME { fields } NAME;`: a copy under another name and static
    assertions that every field is where and what the header's is."""
    out = []
    for m in STRUCT.finditer(c_statements(body)):
        name, fields = m.group(1), m.group(2)
        copy = f"doc_{name}"
        out.append(f"struct {copy} {{{fields}}};")
        for f in re.finditer(r"([^;]*?)\b(\w+)\s*(\[[^\]]*\])?\s*;", fields):
            field = f.group(2)
            out.append(f"_Static_assert(offsetof(struct {copy}, {field}) == offsetof({name}, {field}), "
                       f"\"{name}.{field}: offset\");")
            out.append(f"_Static_assert(sizeof(((struct {copy}*)0)->{field}) == sizeof((({name}*)0)->{field}), "
                       f"\"{name}.{field}: size\");")
        out.append(f"_Static_assert(sizeof(struct {copy}) == sizeof({name}), \"{name}: size\");")
    return out


def compile_c(source, w, link):
    """Compiles a C11 source against strata/strata.h; linked to the build's libstrata and run
    when `link`, its output returned."""
    src, exe = w / "block.c", w / "block"
    src.write_text(source)
    cmd = ["cc", "-std=c11", "-Wall", "-Werror", "-I", str(ROOT / "bindings" / "include"), str(src)]
    if not link:
        run(cmd + ["-c", "-o", str(w / "block.o")], w, shell=False)
        return ""
    run(cmd + ["-o", str(exe), "-L", str(BUILD / "bindings"), f"-Wl,-rpath,{BUILD / 'bindings'}", "-lstrata"], w,
        shell=False)
    return run([str(exe)], w, shell=False)


def run_c(body, marks, w):
    text = c_statements(body)
    # A #define like the header's is a redefinition the compiler accepts; any other, an error.
    rest = "\n".join(line for line in STRUCT.sub("", text).splitlines() if not line.lstrip().startswith("#"))
    if all(PROTOTYPE.match(piece.strip()) for piece in rest.split(";") if piece.strip()):
        # Declarations: a prototype unlike the header's is a conflicting redeclaration, and
        # each struct's fields are checked one by one (struct_checks).
        source = ("#include <stddef.h>\n#include <strata/strata.h>\n" + STRUCT.sub("", text) + "\n" +
                  "\n".join(struct_checks(body)))
        compile_c(source, w, link=False)
        return
    given = "\n".join(marks.get("given", []))
    assert given, "a C fragment needs a `given:` (the declarations it uses) to compile and run"
    source = (f"#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n#include <strata/strata.h>\n{given}\n"
              f"int main(void) {{\n{localise(body, w, marks)}\nreturn 0;\n}}\n")
    check_expect(compile_c(source, w, link=True), marks)


def run_cpp(body, marks, w):
    given = "\n".join(marks.get("given", []))
    assert given, "a C++ fragment needs a `given:` (includes and declarations) to compile"
    src = w / "block.cpp"
    src.write_text(f"{given}\nvoid doc_fragment() {{\n{localise(body, w, marks)}\n}}\n")
    run(["c++", "-std=c++20", "-fsyntax-only", "-I", str(ROOT), str(src)], w, shell=False)


def run_json(body, marks, w):
    value = json.loads(body)
    for path in marks.get("file", []):
        assert json.loads((ROOT / path).read_text()) == value, f"the block is not {path}"


def run_text(body, marks, w):
    """A sample of output: each `$ command` runs; the lines quoted under it are lines of its output."""
    lines = body.splitlines()
    i = 0
    while i < len(lines):
        if not lines[i].startswith("$ "):
            i += 1
            continue
        cmd = lines[i][2:]
        quoted = []
        i += 1
        while i < len(lines) and not lines[i].startswith("$ "):
            quoted.append(lines[i])
            i += 1
        output = run(localise(cmd, w, marks), w, int(marks.get("exit", ["0"])[0]))
        got = {" ".join(line.split()) for line in output.splitlines()}
        for q in quoted:
            if q.strip() and q.strip() != "...":
                assert " ".join(q.split()) in got, f"`{cmd}` printed no line\n  {q}\nIt printed:\n{output[-4000:]}"
        check_expect(output, marks)


RUNNERS = {"sh": run_sh, "python": run_python, "c": run_c, "cpp": run_cpp, "json": run_json, "": run_text}


@pytest.mark.parametrize("lang,body,marks", blocks())
def test_block(lang, body, marks, work):
    if "skip" in marks:
        pytest.skip(marks["skip"][0])
    for need in marks.get("needs", []):
        if need == "gpu" and subprocess.run("nvidia-smi -L", shell=True, capture_output=True).returncode != 0:
            pytest.skip("needs a GPU (nvidia-smi finds none)")
        if need == "root" and os.geteuid() != 0:
            pytest.skip("needs root")
    assert lang in RUNNERS, f"no way to check a ```{lang} block: add one to {Path(__file__).name}"
    RUNNERS[lang](body, marks, work)


def test_every_page_is_read():
    # The pages exist and hold blocks; a broken pattern would pass everything vacuously.
    assert len(PAGES) > 10
    assert len(blocks()) > 50
    assert shutil.which("cc"), "a C compiler checks the C blocks"
