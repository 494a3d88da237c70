"""Visible tests: run them with `python3 -m pytest tests`."""

import json

import pytest

import solution


@pytest.mark.parametrize(('args', 'expected'), json.loads('[[["Az.acBBY!"], "Qp.qsRRO!"], [["c!xC zXaCYY!X"], "s!nS pNqSOO!N"], [[" .X aZ!!.aA!AaXc"], " .N qP!!.qQ!QqNs"]]'))
def test_caesar(args, expected):
    assert solution.caesar(*args) == expected


@pytest.mark.parametrize(('args', 'expected'), json.loads('[[["ca c"], "c:1,a:1, :1,c:1"], [[" ac a"], " :1,a:1,c:1, :1,a:1"], [["b  bacaa "], "b:1, :2,b:1,a:1,c:1,a:2, :1"]]'))
def test_run_length(args, expected):
    assert solution.run_length(*args) == expected


@pytest.mark.parametrize(('args', 'expected'), json.loads('[[["{{[{x"], false], [["[)]["], false], [["{]x)x{}}]"], false]]'))
def test_balanced(args, expected):
    assert solution.balanced(*args) == expected
