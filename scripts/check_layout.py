#!/usr/bin/env python3
"""The layout rules a compiler does not keep by itself (docs/design.md, "Layout"):

1. No source file of the server, the core or the Rust client passes MAX_LINES lines of code: its lines
   without its inline test modules (`#[cfg(test)] mod … { … }`), which grow with what they test.
2. No import cycle between files: a file's `crate::`, `super::` and `self::` paths are resolved to the
   files that define them, and the graph they make may have no cycle. A module's own `mod.rs` (or
   `lib.rs`) and the files below it are one family: a parent declares its children and a child uses
   what its parent re-exports, so edges between a file and its ancestors are not counted.
3. The top-level modules of each crate import each other in one direction only.

Run from the repository root (scripts/check-layout.sh also checks the core's dependency tree).
Exit status 1 with each problem on a line of its own.
"""
import pathlib
import re
import sys

CRATES = {
    "tollgate": pathlib.Path("src"),
    "tollgate-core": pathlib.Path("core/src"),
    "tollgate-client": pathlib.Path("clients/rust/src"),
}
MAX_LINES = 800
PATH = re.compile(r"\b((?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)+)")
TEST_MODULE = re.compile(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*mod\s+[A-Za-z_][A-Za-z0-9_]*\s*\{")
USE_GROUP = re.compile(r"\buse\s+((?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{([^;]*)\}\s*;", re.S)


def module_files(root):
    """Module path (tuple) → file, for every .rs file of a crate."""
    files = {}
    for path in sorted(root.rglob("*.rs")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts in {("lib",), ("main",)}:
            files[()] = path if parts == ("lib",) else files.get((), path)
            continue
        if parts[-1] == "mod":
            parts = parts[:-1]
        files[parts] = path
    return files


def blank(match):
    """The match as spaces, its line breaks kept, so that offsets and line numbers still hold."""
    return re.sub(r"[^\n]", " ", match.group(0))


def masked(text):
    """The text with comments and the insides of strings blanked out, every line where it was."""
    text = re.sub(r"(?m)^\s*//.*$", blank, text)  # whole-line comments, doc comments among them
    text = re.sub(r"'(?:[^'\\\n]|\\.[^']*)'", lambda m: "'" + blank(m)[1:-1] + "'", text)  # chars, '"' too
    text = re.sub(r'(?<![A-Za-z0-9_])r(#*)"(?:.|\n)*?"\1', blank, text)  # raw strings
    text = re.sub(r'(?s)"(?:[^"\\]|\\.)*"', lambda m: '"' + blank(m)[1:-1] + '"', text)
    return re.sub(r"//[^\n]*", blank, text)


def without_tests(path):
    """The file's text (comments and strings blanked) without its inline test modules."""
    text = masked(path.read_text())
    while match := TEST_MODULE.search(text):
        depth, end = 0, match.end() - 1
        for end in range(match.end() - 1, len(text)):
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            if depth == 0:
                break
        text = text[: match.start()] + text[end + 1 :]
    return text


def references(text):
    """Every path that starts with crate::, super:: or self::, use-groups expanded (one level)."""
    found = PATH.findall(text)
    for prefix, group in USE_GROUP.findall(text):
        for item in re.split(r"[,\s]+", re.sub(r"\{[^}]*\}", "", group)):
            if item and item not in {"self", "*"}:
                found.append(f"{prefix}::{item}")
    return found


def resolve(reference, here, files):
    """The module (tuple) that defines the item `reference` names, seen from module `here`."""
    parts = reference.split("::")
    if parts[0] == "crate":
        base, rest = (), parts[1:]
    else:
        base = here
        while parts and parts[0] in {"super", "self"}:
            if parts.pop(0) == "super":
                base = base[:-1]
        rest = parts
    best = base
    for i in range(1, len(rest) + 1):
        if base + tuple(rest[:i]) in files:
            best = base + tuple(rest[:i])
        else:
            break
    return best


def cycles(graph):
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            advanced = False
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def main():
    problems = []
    for crate, root in CRATES.items():
        files = module_files(root)
        file_graph, top_graph = {}, {}
        for module, path in files.items():
            code = without_tests(path)
            lines = len(code.splitlines())
            if lines > MAX_LINES:
                problems.append(
                    f"{path}: {lines} lines of code, tests left out (at most {MAX_LINES}: split it along its seams)"
                )
            edges = file_graph.setdefault(module, set())
            for reference in references(code):
                target = resolve(reference, module, files)
                if target == module or module[: len(target)] == target or target[: len(module)] == module:
                    continue  # itself, an ancestor, or a descendant: one family
                edges.add(target)
                if module and target and module[0] != target[0]:
                    top_graph.setdefault(module[0], set()).add(target[0])
        for component in cycles(file_graph):
            names = ", ".join(str(files[m]) for m in component)
            problems.append(f"{crate}: files import each other in a cycle: {names}")
        for component in cycles(top_graph):
            problems.append(f"{crate}: top-level modules import each other in a cycle: {', '.join(component)}")
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
