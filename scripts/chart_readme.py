#!/usr/bin/env python3
"""Writes, or with --check verifies, the values table in helm/tollgate/README.md.

The table is generated from helm/tollgate/values.yaml, so the chart's documentation cannot drift from its
defaults. Each value documented by a `# -- text` comment (continued on the following `#` lines at the
same indentation, as helm-docs reads them) gets a row with that text. A map with its own `# --` comment
and no documented values below it is one row (its default shown whole); other maps are walked, and every
value under them gets a row, documented or not, so nothing the chart accepts is missing from the table.

Only the part of the README between the two markers below is generated; the rest is written by hand.
Python 3 standard library only: the YAML subset values.yaml uses (block maps and lists, plain and quoted
scalars, one-line flow collections, comments) is read here, and anything else is refused with its line
number rather than misread.

    scripts/chart_readme.py            rewrite the table
    scripts/chart_readme.py --check    exit 1 if the README's table differs from values.yaml (CI)
"""

import argparse
import difflib
import pathlib
import re
import sys

BEGIN = "<!-- values table: generated from values.yaml by scripts/chart_readme.py; edit values.yaml, then run it -->"
END = "<!-- end of the values table -->"
# Longer defaults are summarised in the table; values.yaml has them in full.
MAX_DEFAULT = 80
KEY = re.compile(r"""^("[^"]*"|'[^']*'|[^\s#'"][^:#]*?)\s*:(?:\s+(.*))?$""")


class YamlError(Exception):
    pass


class Line:
    def __init__(self, number, indent, text, doc):
        self.number, self.indent, self.text, self.doc = number, indent, text, doc


class Node:
    """A value: `kind` is "scalar" (raw text kept as written), "map" or "list"."""

    def __init__(self, path, doc, kind, raw=None, children=None):
        self.path, self.doc, self.kind, self.raw = path, doc, kind, raw
        self.children = children or []


def strip_comment(text):
    """`text` without a trailing ` # comment` (a `#` inside quotes is kept)."""
    quote = None
    for i, c in enumerate(text):
        if quote:
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or text[i - 1] in " \t"):
            return text[:i].rstrip()
    return text.rstrip()


def read_lines(text):
    """The entry lines of a YAML text, each with the `# --` documentation written just above it."""
    lines, pending = [], None
    for number, raw in enumerate(text.splitlines(), 1):
        if "\t" in raw[: len(raw) - len(raw.lstrip())]:
            raise YamlError(f"line {number}: tab in indentation")
        stripped = raw.strip()
        indent = len(raw) - len(raw.lstrip(" "))
        if not stripped:
            pending = None
        elif stripped.startswith("#"):
            comment = stripped[1:].strip()
            if comment == "--" or comment.startswith("-- "):
                pending = (indent, [comment[2:].strip()])
            elif pending and pending[0] == indent:
                pending[1].append(comment)
            else:
                pending = None
        else:
            doc = " ".join(pending[1]).strip() if pending and pending[0] == indent else None
            lines.append(Line(number, indent, strip_comment(stripped), doc))
            pending = None
    return lines


class Parser:
    def __init__(self, lines):
        self.lines, self.at = lines, 0

    def peek(self):
        return self.lines[self.at] if self.at < len(self.lines) else None

    def block(self, path):
        line = self.peek()
        if line.text == "-" or line.text.startswith("- "):
            return self.sequence(line.indent, path)
        return self.mapping(line.indent, path)

    def mapping(self, indent, path):
        children = []
        while (line := self.peek()) and line.indent == indent and not line.text.startswith("-"):
            match = KEY.match(line.text)
            if not match:
                raise YamlError(f"line {line.number}: expected `key: value`, got {line.text!r}")
            key, rest = match.group(1).strip("'\""), (match.group(2) or "").strip()
            self.at += 1
            children.append(self.value(path + [key], line, rest))
        if (line := self.peek()) and line.indent > indent:
            raise YamlError(f"line {line.number}: unexpected indentation")
        return Node(path, None, "map", children=children)

    def value(self, path, line, rest):
        if rest:
            if rest[0] in "|>":
                raise YamlError(f"line {line.number}: block scalars are not supported here")
            if rest[0] in "[{" and rest.count(rest[0]) != rest.count("]}"["[{".index(rest[0])]):
                raise YamlError(f"line {line.number}: a flow collection must fit on one line")
            return Node(path, line.doc, "scalar", raw=rest)
        following = self.peek()
        nested = following and (
            following.indent > line.indent
            or (following.indent == line.indent and following.text.startswith("- "))
        )
        if not nested:
            return Node(path, line.doc, "scalar", raw="null")
        node = self.block(path)
        node.doc = line.doc
        return node

    def sequence(self, indent, path):
        items = []
        while (line := self.peek()) and line.indent == indent and (line.text == "-" or line.text.startswith("- ")):
            rest = line.text[1:].lstrip()
            if not rest:
                self.at += 1
                items.append(self.block(path))
            elif KEY.match(rest) and not rest[0] in "[{\"'":
                # `- key: value` opens a map whose keys sit where `key` starts.
                self.lines[self.at] = Line(line.number, indent + len(line.text) - len(rest), rest, None)
                items.append(self.mapping(self.lines[self.at].indent, path))
            else:
                self.at += 1
                items.append(Node(path, None, "scalar", raw=rest))
        return Node(path, None, "list", children=items)


def parse(text):
    parser = Parser(read_lines(text))
    if not parser.peek():
        raise YamlError("no values")
    root = parser.mapping(parser.peek().indent, [])
    if parser.peek():
        raise YamlError(f"line {parser.peek().number}: unexpected content")
    return root


def flow(node):
    """A value as one line of YAML flow style."""
    if node.kind == "scalar":
        return node.raw
    if node.kind == "list":
        return "[" + ", ".join(flow(c) for c in node.children) + "]"
    return "{" + ", ".join(f"{c.path[-1]}: {flow(c)}" for c in node.children) + "}"


def default(node):
    text = flow(node)
    if len(text) <= MAX_DEFAULT:
        return f"`{text}`"
    if node.kind == "list":
        count = len(node.children)
        return f"{count} item{'s' if count != 1 else ''} (see values.yaml)"
    return "(see values.yaml)"


def documented_below(node):
    return node.kind == "map" and any(c.doc or documented_below(c) for c in node.children)


def rows(node):
    """(path, default, description) for every value to list, in file order."""
    for child in node.children:
        walk = child.kind == "map" and child.children and (not child.doc or documented_below(child))
        if child.doc and walk:
            yield ".".join(child.path), "", child.doc
        if walk:
            yield from rows(child)
        else:
            yield ".".join(child.path), default(child), child.doc or ""


def cell(text):
    return text.replace("|", "\\|")


def table(values_text):
    out = ["| Value | Default | Description |", "|---|---|---|"]
    for path, value, doc in rows(parse(values_text)):
        out.append(f"| `{path}` | {cell(value)} | {cell(doc)} |")
    return "\n".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if the README's table is stale")
    parser.add_argument("--chart", default=str(pathlib.Path(__file__).resolve().parent.parent / "helm" / "tollgate"))
    args = parser.parse_args()
    chart = pathlib.Path(args.chart)
    readme_path = chart / "README.md"
    try:
        generated = table((chart / "values.yaml").read_text())
    except YamlError as error:
        print(f"{chart / 'values.yaml'}: {error}", file=sys.stderr)
        return 2
    readme = readme_path.read_text()
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start:
        print(f"{readme_path}: the markers {BEGIN!r} and {END!r} are missing", file=sys.stderr)
        return 2
    current = readme[start + len(BEGIN):end].strip("\n")
    if current == generated:
        print(f"{readme_path}: values table up to date")
        return 0
    if args.check:
        diff = difflib.unified_diff(current.splitlines(), generated.splitlines(), "README.md", "values.yaml", lineterm="")
        print("\n".join(diff))
        print(f"{readme_path}: the values table is stale; run scripts/chart_readme.py", file=sys.stderr)
        return 1
    readme_path.write_text(readme[: start + len(BEGIN)] + "\n" + generated + "\n" + readme[end:])
    print(f"{readme_path}: values table written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
