"""Hidden tests (the holdout)."""

import json

import pytest

import solution


@pytest.mark.parametrize(('args', 'expected'), json.loads('[[["XbayCaz"], "NrqoSqp"], [["Zb.YZb,Cz.BZ "], "Pr.OPr,Sp.RP "], [["c "], "s "], [["x"], "n"], [["z"], "p"], [["!xXbYzCcy,zCxy,x"], "!nNrOpSso,pSno,n"], [["!bYyXYXx"], "!rOoNONn"], [[""], ""]]'))
def test_caesar(args, expected):
    assert solution.caesar(*args) == expected


@pytest.mark.parametrize(('args', 'expected'), json.loads('[[["bacbbc"], "b:1,a:1,c:1,b:2,c:1"], [[""], ""], [["ccca"], "c:3,a:1"], [["baaaabac "], "b:1,a:4,b:1,a:1,c:1, :1"], [["b"], "b:1"], [["bcaa"], "b:1,c:1,a:2"], [["a b c bc c"], "a:1, :1,b:1, :1,c:1, :1,b:1,c:1, :1,c:1"], [["bacaa c"], "b:1,a:1,c:1,a:2, :1,c:1"]]'))
def test_run_length(args, expected):
    assert solution.run_length(*args) == expected


@pytest.mark.parametrize(('args', 'expected'), json.loads('[[["({"], false], [["{}))]]["], false], [[""], true], [["][[x[(}"], false], [["x{{"], false], [["{"], false], [[")[(xx]}{["], false], [["})"], false]]'))
def test_balanced(args, expected):
    assert solution.balanced(*args) == expected
