"""The file's shape: main.py reads top to bottom. Its parts are the banner comments; no part
uses a name defined in a later one, and the module docstring lists the parts in file order."""
import ast
import os
import re
import unittest

from helpers import CODE

SOURCE = open(os.path.join(CODE, "main.py")).read()
LINES = SOURCE.splitlines()
RULE = "# " + "-" * 20


def parts():
    """(first line, title) of each part: a comment block between two dashed rules."""
    found, i = [], 0
    while i < len(LINES):
        if LINES[i].startswith(RULE):
            j = i + 1
            while j < len(LINES) and LINES[j].startswith("# ") and not LINES[j].startswith(RULE):
                j += 1
            if j < len(LINES) and LINES[j].startswith(RULE) and j > i + 1:
                found.append((i + 1, LINES[i + 1][2:].split(":")[0]))
                i = j
        i += 1
    return found


def local_names(function) -> set:
    """What a function binds itself: its arguments and whatever it assigns."""
    names = {a.arg for a in ast.walk(function.args) if isinstance(a, ast.arg)}
    for node in ast.walk(function):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node is not function:
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return names


class Uses(ast.NodeVisitor):
    """Module-level names a statement reads (annotations left out: they are strings here)."""

    def __init__(self):
        self.names, self.scopes = [], []

    def visit_arg(self, node):
        pass

    def visit_AnnAssign(self, node):
        if node.value:
            self.visit(node.value)

    def visit_FunctionDef(self, node):
        for expression in node.decorator_list + node.args.defaults + [d for d in node.args.kw_defaults if d]:
            self.visit(expression)
        self.scopes.append(local_names(node))
        for statement in node.body:
            self.visit(statement)
        self.scopes.pop()

    def visit_Lambda(self, node):
        self.scopes.append({a.arg for a in node.args.args})
        self.visit(node.body)
        self.scopes.pop()

    def visit_Name(self, node):
        if isinstance(node.ctx, ast.Load) and not any(node.id in scope for scope in self.scopes):
            self.names.append((node.id, node.lineno))


class Layout(unittest.TestCase):
    def test_no_part_uses_a_name_defined_in_a_later_one(self):
        starts = [line for line, _ in parts()]
        part = lambda line: sum(1 for start in starts if start <= line)
        tree = ast.parse(SOURCE)
        defined = {}
        for node in tree.body:
            targets = [node] if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else \
                [n for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)] \
                if isinstance(node, ast.Assign) else []
            for target in targets:
                defined.setdefault(getattr(target, "name", None) or target.id, node.lineno)
        late = []
        for node in tree.body:
            uses = Uses()
            uses.visit(node)
            late += [f"line {line}: {name}" for name, line in uses.names
                     if name in defined and part(defined[name]) > part(node.lineno)]
        self.assertEqual(late, [])

    def test_the_docstring_lists_the_parts_in_file_order(self):
        doc = ast.get_docstring(ast.parse(SOURCE)).lower()
        doc = doc[doc.index("the file reads top to bottom"):]
        titles = [re.split(r"\W+", title.lower())[0] for _, title in parts()]
        self.assertGreater(len(titles), 15)
        at = 0
        for title in titles:        # each part's first word, after the one before it
            at = doc.find(title, at)
            self.assertGreaterEqual(at, 0, f"the docstring does not list {title!r} where the file has it")


if __name__ == "__main__":
    unittest.main()
