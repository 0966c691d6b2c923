"""Symbolic tensor dimensions: parse `"T"`, `"2*I"`, `"B+1"`, `"L+R"`, `"cdiv(H,128)"`.

A contract writes each dimension as a small expression over named sizes. Binding walks
the call's tensors, learns each size from the first dimension that determines it, and
then checks every other dimension against what it learned.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Callable


def cdiv(a: int, b: int) -> int:
    """Ceiling division, as block-scale shapes use it."""
    return -(-a // b)


@dataclass(frozen=True)
class DimExpr:
    """One parsed dimension: `scale * symbol + offset`, a sum of two symbols, or cdiv."""

    text: str
    tree: ast.expr

    @cached_property
    def symbols(self) -> frozenset[str]:
        return frozenset(
            node.id for node in ast.walk(self.tree) if isinstance(node, ast.Name) and node.id != "cdiv"
        )

    @cached_property
    def evaluate(self) -> Callable[[dict[str, int]], int]:
        """The dimension's size once all its symbols are bound: `dim.evaluate(env)`.
        Compiled to a lambda once, because output allocation runs it on every call."""
        body = _SymbolsToLookups().visit(ast.parse(self.text, mode="eval").body)
        tree = ast.Expression(
            ast.Lambda(
                ast.arguments(posonlyargs=[], args=[ast.arg("env")], kwonlyargs=[], kw_defaults=[], defaults=[]),
                body,
            )
        )
        return eval(compile(ast.fix_missing_locations(tree), f"<dim {self.text}>", "eval"), {"cdiv": cdiv})

    def solve(self, value: int, env: dict[str, int]) -> tuple[str, int] | None:
        """If exactly one symbol is unbound and the form is invertible, return its size."""
        unknown = [s for s in self.symbols if s not in env]
        if len(unknown) != 1:
            return None
        name = unknown[0]
        node = self.tree
        if isinstance(node, ast.Name):
            return name, value
        # k*S or S*k
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            k = node.left if isinstance(node.left, ast.Constant) else node.right
            if isinstance(k, ast.Constant) and value % k.value == 0:
                return name, value // k.value
            return None
        # S + k, S + R (R bound), S - k
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
            other = node.right if isinstance(node.left, ast.Name) and node.left.id == name else node.left
            rest = _eval(other, env)
            if isinstance(node.op, ast.Add):
                return name, value - rest
            return (name, value + rest) if isinstance(node.left, ast.Name) and node.left.id == name else None
        return None


class _SymbolsToLookups(ast.NodeTransformer):
    """Rewrites symbol `T` to `env["T"]` (leaving the `cdiv` helper alone)."""

    def visit_Name(self, node: ast.Name) -> ast.expr:
        if node.id == "cdiv":
            return node
        return ast.Subscript(ast.Name("env", ast.Load()), ast.Constant(node.id), ast.Load())


def _eval(node: ast.expr, env: dict[str, int]) -> int:
    if isinstance(node, ast.Constant):
        return int(node.value)
    if isinstance(node, ast.Name):
        return env[node.id]
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left, env), _eval(node.right, env)
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Sub):
            return left - right
        if isinstance(node.op, ast.Mult):
            return left * right
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "cdiv":
        return cdiv(_eval(node.args[0], env), _eval(node.args[1], env))
    raise ValueError(f"unsupported dimension expression: {ast.unparse(node)}")


@lru_cache(maxsize=None)
def parse_dim(text: str) -> DimExpr:
    """Parse one dimension expression (cached: contracts are parsed once)."""
    tree = ast.parse(text, mode="eval").body
    _eval_check(tree)
    return DimExpr(text, tree)


def _eval_check(node: ast.expr) -> None:
    allowed = (ast.Constant, ast.Name, ast.BinOp, ast.Call, ast.Add, ast.Sub, ast.Mult, ast.Load)
    for sub in ast.walk(node):
        if not isinstance(sub, allowed):
            raise ValueError(f"unsupported dimension expression: {ast.unparse(node)}")
